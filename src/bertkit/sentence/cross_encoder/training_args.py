"""``CrossEncoderTrainingArguments``: ``SentenceTransformerTrainingArguments`` (bertkit's ``TrainingArguments`` with
``batch_sampler``), as sentence-transformers' cross-encoder arguments are its bi-encoder ones. ``learning_rate_mapping``
matches the loss's parameter names as there (``model.0.model.classifier.weight``); prompts and router mappings are
not implemented for cross-encoders and are refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bertkit.errors import BertkitError, keyword_only
from bertkit.sentence.training_args import TRAINING_ARGS_POSITIONS, SentenceTransformerTrainingArguments


class CrossEncoderTrainingArguments(SentenceTransformerTrainingArguments):
    """bertkit's ``TrainingArguments`` with ``batch_sampler`` (``BatchSamplers``), as sentence-transformers names it."""

    @keyword_only(TRAINING_ARGS_POSITIONS, "sentence-transformers")
    def __init__(self, output_dir: str | Path | None = None, **kwargs: Any):
        if kwargs.get("prompts") is not None:
            raise BertkitError(f"CrossEncoderTrainingArguments: prompts={kwargs['prompts']!r} is not implemented in "
                               "bertkit: put the text before each query in the dataset instead")
        if kwargs.get("router_mapping"):
            raise BertkitError(f"CrossEncoderTrainingArguments: router_mapping={kwargs['router_mapping']!r} is not "
                               "implemented in bertkit: a bertkit CrossEncoder has no Router; drop it")
        super().__init__(output_dir, **kwargs)
