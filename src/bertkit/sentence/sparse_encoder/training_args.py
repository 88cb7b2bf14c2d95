"""``SparseEncoderTrainingArguments``: ``SentenceTransformerTrainingArguments`` (bertkit's ``TrainingArguments`` with
``batch_sampler``, ``prompts``, ``router_mapping`` and ``learning_rate_mapping``), as sentence-transformers' sparse
arguments are its base ones. An inference-free model (a Router) trains with ``router_mapping``, e.g.
``{"query": "query", "positive": "document"}``, and often a higher rate for its static query weights,
``learning_rate_mapping={r"sub_modules\\.query\\.": 1e-3}``."""

from __future__ import annotations

from bertkit.sentence.training_args import SentenceTransformerTrainingArguments


class SparseEncoderTrainingArguments(SentenceTransformerTrainingArguments):
    """bertkit's ``TrainingArguments`` with sentence-transformers' fields, as sentence-transformers names them."""
