"""SparseEmbeddingSimilarityEvaluator: ``EmbeddingSimilarityEvaluator``'s Pearson and Spearman correlations on a
sparse encoder's embeddings, and their sparsity as sentence-transformers reports it: the mean, over the two lists
of sentences, of their mean active dimensions and sparsity ratio."""

from __future__ import annotations

from typing import Any

import torch

from bertkit.sentence.evaluation.similarity import EmbeddingSimilarityEvaluator
from bertkit.sentence.sparse_encoder.evaluation.base import SparseEvaluator


class SparseEmbeddingSimilarityEvaluator(SparseEvaluator, EmbeddingSimilarityEvaluator):
    """sentence-transformers' arguments: ``EmbeddingSimilarityEvaluator``'s without ``precision`` and
    ``truncate_dim``, and ``max_active_dims`` (None: the model's). The sentences are encoded with ``encode``.
    Metric keys: the dense evaluator's (``{name}_pearson_dot``, ``{name}_spearman_dot`` for a SPLADE model), then
    ``{name}_active_dims`` and ``{name}_sparsity_ratio``."""

    def __init__(self, sentences1: list[str], sentences2: list[str], scores: list[float], batch_size: int = 16,
                 main_similarity: str | None = None, similarity_fn_names: list[str] | None = None, name: str = "",
                 show_progress_bar: bool = False, write_csv: bool = True, max_active_dims: int | None = None):
        super().__init__(sentences1, sentences2, scores, batch_size=batch_size, main_similarity=main_similarity,
                         similarity_fn_names=similarity_fn_names, name=name, show_progress_bar=show_progress_bar,
                         write_csv=write_csv)
        self.max_active_dims = max_active_dims
        self.sparsity_stats: dict[str, float] = {}

    def sparsity_of(self, model: Any, embedded: list[torch.Tensor]) -> dict[str, float]:
        stats = [model.sparsity(embeddings) for embeddings in embedded]
        return {key: sum(s[key] for s in stats) / len(stats) for key in stats[0]}
