"""``SparseEncoderTrainingArguments``: ``SentenceTransformerTrainingArguments`` (bertkit's ``TrainingArguments`` with
``batch_sampler`` and ``prompts``), as sentence-transformers' sparse arguments are its base ones. Its fields for
inference-free models (``router_mapping``, ``learning_rate_mapping``) and for several datasets are refused by name
with what to do instead."""

from __future__ import annotations

from typing import Any, ClassVar

from bertkit.sentence.training_args import _REFUSED, SentenceTransformerTrainingArguments


class SparseEncoderTrainingArguments(SentenceTransformerTrainingArguments):
    """bertkit's ``TrainingArguments`` with ``batch_sampler`` and ``prompts``, as sentence-transformers names them."""

    refused_fields: ClassVar[dict[str, tuple[Any, str]]] = {
        **_REFUSED,
        "router_mapping": ({}, "training an inference-free SparseEncoder (a Router with a query route) is not "
                               "implemented in bertkit; train a SPLADE model (Transformer + SpladePooling), or the "
                               "Router model with sentence-transformers"),
        "learning_rate_mapping": ({}, "one learning rate for the whole model: use learning_rate (a learning rate "
                                      "per parameter group is not implemented in bertkit's loop)"),
    }
