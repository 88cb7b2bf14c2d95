"""SparseRerankingEvaluator: ``RerankingEvaluator``'s MAP, MRR@k and nDCG@k on a sparse encoder's embeddings, and
their sparsity as sentence-transformers reports it: the mean active dimensions and sparsity ratio of the queries
and of the candidates."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from bertkit.sentence.evaluation.reranking import RerankingEvaluator
from bertkit.sentence.sparse_encoder.evaluation.base import SparseEvaluator, mean_sparsity, sparsity
from bertkit.sentence.util import cos_sim


class SparseRerankingEvaluator(SparseEvaluator, RerankingEvaluator):
    """sentence-transformers' arguments: ``RerankingEvaluator``'s with ``max_active_dims`` (None: the model's) in
    ``truncate_dim``'s place. Metric keys: the dense evaluator's, then ``{name}_query_active_dims``,
    ``_query_sparsity_ratio``, ``_corpus_active_dims`` and ``_corpus_sparsity_ratio``. With
    ``use_batched_encoding=False`` the statistics are, as sentence-transformers reports them then, the mean over the
    samples of each sample's (the ranking metrics are the same either way)."""

    def __init__(self, samples: list[dict[str, Any]] | dict[Any, dict[str, Any]], at_k: int = 10, name: str = "",
                 write_csv: bool = True, similarity_fct: Callable[[Any, Any], torch.Tensor] = cos_sim,
                 batch_size: int = 64, show_progress_bar: bool = False, use_batched_encoding: bool = True,
                 max_active_dims: int | None = None, mrr_at_k: int | None = None):
        super().__init__(samples, at_k=at_k, name=name, write_csv=write_csv, similarity_fct=similarity_fct,
                         batch_size=batch_size, show_progress_bar=show_progress_bar,
                         use_batched_encoding=use_batched_encoding, mrr_at_k=mrr_at_k)
        self.max_active_dims = max_active_dims
        self.sparsity_stats: dict[str, float] = {}

    def sparsity_of(self, model: Any, embedded: list[torch.Tensor]) -> dict[str, float]:
        queries, candidates = embedded
        if self.use_batched_encoding:
            return {**sparsity(model, queries, "query"), **sparsity(model, candidates, "corpus")}
        sizes = [len(s["positive"]) + len(s["negative"]) for s in self.samples]
        return {**mean_sparsity(model, queries, [1] * len(sizes), "query", weighted=False),
                **mean_sparsity(model, candidates, sizes, "corpus", weighted=False)}
