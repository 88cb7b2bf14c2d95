"""Putting models to use: task pipelines (``pipeline``), export (``export``).

    import bertkit
    fill = bertkit.pipeline("fill-mask", "models/bert-base-uncased")
    fill("Paris is the [MASK] of France.")[0]["token_str"]   # 'capital'

Every pipeline takes a list of inputs of any size, batches them by length (little padding, which the
encoder then drops) and returns JSON-able results in input order.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from bertkit.errors import BertkitError
from bertkit.inference.base import Pipeline
from bertkit.inference.pipelines import (
    FeatureExtractionPipeline,
    FillMaskPipeline,
    MultipleChoicePipeline,
    QuestionAnsweringPipeline,
    SentenceEmbeddingPipeline,
    TextClassificationPipeline,
    TokenClassificationPipeline,
)

TASKS: dict[str, type[Pipeline]] = {
    "fill-mask": FillMaskPipeline,
    "text-classification": TextClassificationPipeline,
    "sentiment-analysis": TextClassificationPipeline,  # transformers' alias
    "token-classification": TokenClassificationPipeline,
    "ner": TokenClassificationPipeline,  # transformers' alias
    "question-answering": QuestionAnsweringPipeline,
    "multiple-choice": MultipleChoicePipeline,
    "feature-extraction": FeatureExtractionPipeline,
    "sentence-embedding": SentenceEmbeddingPipeline,
}


def pipeline(task: str, model_dir: str | Path, *, device: str | torch.device = "cpu", bf16: bool = False,
             batch_size: int = 32, max_length: int | None = None, progress: bool | None = None,
             **options: Any) -> Pipeline:
    """The ``task`` pipeline over the checkpoint in ``model_dir`` (config.json, model.safetensors, vocab.txt).

    ``bf16`` runs the model under bfloat16 autocast (CPUs with AVX-512 BF16 / AMX, recent GPUs; scores are
    still computed in float32/64). ``batch_size`` sequences run at once, grouped by length; ``max_length``
    (default: the model's positions) caps each sequence: texts are truncated, QA contexts windowed.
    ``progress`` draws a bar (None: only for long inputs). ``options`` go to the task's pipeline (e.g.
    ``pooling="cls"``, ``normalize=True`` for embeddings).
    """
    if task not in TASKS:
        raise BertkitError(f"unknown pipeline task {task!r}; choose one of {', '.join(TASKS)}")
    return TASKS[task].from_pretrained(model_dir, device=device, bf16=bf16, batch_size=batch_size,
                                       max_length=max_length, progress=progress, **options)


__all__ = ["TASKS", "FeatureExtractionPipeline", "FillMaskPipeline", "MultipleChoicePipeline", "Pipeline",
           "QuestionAnsweringPipeline", "SentenceEmbeddingPipeline", "TextClassificationPipeline",
           "TokenClassificationPipeline", "pipeline"]
