"""SparseInformationRetrievalEvaluator: ``InformationRetrievalEvaluator``'s ranking metrics on a sparse encoder's
embeddings, and their sparsity as sentence-transformers reports it: the mean active dimensions and sparsity ratio
of the queries and of the corpus, and the average FLOPS of a query-document product (the dot product of the mean
query's and the mean document's per-dimension counts of non-zeros: what an inverted index multiplies per pair)."""

from __future__ import annotations

from typing import Any

import torch

from bertkit.errors import BertkitError
from bertkit.sentence.evaluation.information_retrieval import InformationRetrievalEvaluator, _prefixed


class SparseInformationRetrievalEvaluator(InformationRetrievalEvaluator):
    """``InformationRetrievalEvaluator``'s arguments (without ``truncate_dim``) and ``max_active_dims`` (None: the
    model's). Metric keys: the dense evaluator's, then ``{name}_query_active_dims``, ``_query_sparsity_ratio``,
    ``_corpus_active_dims``, ``_corpus_sparsity_ratio`` and ``_avg_flops``."""

    def __init__(self, queries: dict[str, str], corpus: dict[str, str], relevant_docs: dict[str, set[str]],
                 *args: Any, max_active_dims: int | None = None, **kwargs: Any):
        if kwargs.get("truncate_dim") is not None:
            raise BertkitError("SparseInformationRetrievalEvaluator has no truncate_dim (a sparse vector's dimensions "
                               "are word pieces): keep the largest weights with max_active_dims")
        super().__init__(queries, corpus, relevant_docs, *args, **kwargs)
        self.max_active_dims = max_active_dims
        self.sparsity_stats: dict[str, float] = {}
        self._counts: dict[str, torch.Tensor] = {}

    def __call__(self, model: Any, output_path: str | None = None, epoch: int = -1, steps: int = -1) -> dict[str, float]:
        self.sparsity_stats, self._counts = {}, {}
        metrics = super().__call__(model, output_path, epoch, steps)
        query, corpus = self._counts["query"] / len(self.queries), self._counts["document"] / len(self.corpus)
        self.sparsity_stats["avg_flops"] = float(torch.dot(query, corpus))
        return {**metrics, **_prefixed(self.sparsity_stats, self.name)}

    def embed(self, model: Any, texts: list[str], kind: str) -> torch.Tensor:
        encode = model.encode_query if kind == "query" else model.encode_document
        prompt, prompt_name = (self.query_prompt, self.query_prompt_name) if kind == "query" else \
            (self.corpus_prompt, self.corpus_prompt_name)
        embeddings = encode(texts, prompt=prompt, prompt_name=prompt_name, batch_size=self.batch_size,
                            show_progress_bar=self.show_progress_bar, convert_to_sparse_tensor=True,
                            save_to_cpu=True, max_active_dims=self.max_active_dims).coalesce()
        prefix = "query" if kind == "query" else "corpus"
        for key, value in model.sparsity(embeddings).items():
            self.sparsity_stats[f"{prefix}_{key}"] = value
        # how many texts have each dimension active (V,)
        self._counts[kind] = torch.bincount(embeddings.indices()[1], minlength=embeddings.shape[1]).float()
        return embeddings
