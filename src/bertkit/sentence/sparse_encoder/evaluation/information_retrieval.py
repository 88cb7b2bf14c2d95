"""SparseInformationRetrievalEvaluator: ``InformationRetrievalEvaluator``'s ranking metrics on a sparse encoder's
embeddings, and their sparsity as sentence-transformers reports it: the mean active dimensions and sparsity ratio
of the queries and of the corpus, and the average FLOPS of a query-document product (the dot product of the mean
query's and the mean document's per-dimension counts of non-zeros: what an inverted index multiplies per pair)."""

from __future__ import annotations

from typing import Any

import torch

from bertkit.sentence.evaluation.information_retrieval import InformationRetrievalEvaluator
from bertkit.sentence.sparse_encoder.evaluation.base import SparseEvaluator, mean_sparsity, sparsity


def _active_share(embeddings: torch.Tensor) -> torch.Tensor:
    """(V,): the share of the rows that have each dimension active."""
    return torch.bincount(embeddings.indices()[1], minlength=embeddings.shape[1]).float() / embeddings.shape[0]


class SparseInformationRetrievalEvaluator(SparseEvaluator, InformationRetrievalEvaluator):
    """``InformationRetrievalEvaluator``'s arguments, ``max_active_dims`` (None: the model's) in place of
    ``truncate_dim``. Metric keys: the dense evaluator's, then ``{name}_query_active_dims``, ``_query_sparsity_ratio``,
    ``_corpus_active_dims``, ``_corpus_sparsity_ratio`` and ``_avg_flops``."""

    def __init__(self, queries: dict[str, str], corpus: dict[str, str], relevant_docs: dict[str, set[str]],
                 corpus_chunk_size: int = 50000, mrr_at_k: list[int] = [10], ndcg_at_k: list[int] = [10],  # noqa: B006
                 accuracy_at_k: list[int] = [1, 3, 5, 10], precision_recall_at_k: list[int] = [1, 3, 5, 10],  # noqa: B006
                 map_at_k: list[int] = [100], show_progress_bar: bool = False, batch_size: int = 32,  # noqa: B006
                 name: str = "", write_csv: bool = True, max_active_dims: int | None = None,
                 score_functions: dict[str, Any] | None = None, main_score_function: str | None = None,
                 query_prompt: str | None = None, query_prompt_name: str | None = None,
                 corpus_prompt: str | None = None, corpus_prompt_name: str | None = None,
                 write_predictions: bool = False):
        # sentence-transformers' order: max_active_dims where the dense evaluator has truncate_dim, so a script that
        # passes the arguments by position gives each its meaning
        super().__init__(queries, corpus, relevant_docs, corpus_chunk_size, mrr_at_k, ndcg_at_k, accuracy_at_k,
                         precision_recall_at_k, map_at_k, show_progress_bar, batch_size, name, write_csv,
                         score_functions=score_functions, main_score_function=main_score_function,
                         query_prompt=query_prompt, query_prompt_name=query_prompt_name, corpus_prompt=corpus_prompt,
                         corpus_prompt_name=corpus_prompt_name, write_predictions=write_predictions)
        self.max_active_dims = max_active_dims
        self.sparsity_stats: dict[str, float] = {}

    def sparsity_of(self, model: Any, embedded: list[torch.Tensor]) -> dict[str, float]:
        queries, corpus = embedded
        # sentence-transformers encodes the corpus corpus_chunk_size texts at a time and reports the mean of each
        # chunk's statistics (float32 means) weighted by its size: the whole corpus's, rounded as there
        n, size = corpus.shape[0], self.corpus_chunk_size
        return {**sparsity(model, queries, "query"),
                **mean_sparsity(model, corpus, [min(size, n - a) for a in range(0, n, size)], "corpus", weighted=True),
                "avg_flops": float(torch.dot(_active_share(queries), _active_share(corpus)))}
