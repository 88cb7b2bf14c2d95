"""Evaluators of sparse encoders with sentence-transformers' names (``sentence_transformers.sparse_encoder.evaluation``):
each is the dense evaluator of its name (``SparseEvaluator`` placed before it) with the embeddings' sparsity as
sentence-transformers reports it: the dense evaluator's ``embed`` hook replaced by sparse encoding, each embedding
kept until the evaluator has read its sparsity (``sparsity_of``). sentence-transformers' other sparse evaluators are
refused by name with what to use (``_REFUSED``)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any

import torch

from bertkit.errors import WholeSetting, refusing_getattr
from bertkit.sentence.evaluation.base import ResultsCsv, prefixed
from bertkit.sentence.evaluation.information_retrieval import InformationRetrievalEvaluator
from bertkit.sentence.evaluation.reranking import RerankingEvaluator
from bertkit.sentence.evaluation.similarity import EmbeddingSimilarityEvaluator
from bertkit.sentence.evaluation.triplet import TripletEvaluator

__all__ = ["SparseInformationRetrievalEvaluator", "SparseEmbeddingSimilarityEvaluator", "SparseTripletEvaluator",
           "SparseRerankingEvaluator"]


class SparseEvaluator(ABC):
    """Placed before a dense evaluator (``class SparseTripletEvaluator(SparseEvaluator, TripletEvaluator)``): the
    dense evaluator's metrics on sparse (N, V) embeddings on the CPU (each row's ``max_active_dims`` largest
    weights; None: the model's), then ``sparsity_of``'s statistics of the embeddings, under the same name
    prefix. ``sparsity_stats`` keeps the last call's statistics. The results CSV is the dense evaluator's with the
    statistics' columns after its own (and every line ended ``\\r\\n``), as sentence-transformers writes it."""

    name: str
    csv_lineterminator = "\r\n"  # sentence-transformers rewrites the file with Python's csv writer to add the columns

    # the vocabulary size, which bounds it too, is the model's, checked by encode before the evaluator encodes
    max_active_dims = WholeSetting(none="the model's", bound=" (at most the model's vocabulary size)")

    def __call__(self, model: Any, output_path: str | None = None, epoch: int = -1, steps: int = -1) -> dict[str, float]:
        self._embedded: list[torch.Tensor] = []
        self._results: tuple[Any, list[str], list[Any]] | None = None
        try:
            metrics = super().__call__(model, output_path, epoch, steps)  # type: ignore[misc]
            self.sparsity_stats = self.sparsity_of(model, self._embedded)
        finally:
            self._embedded = []
        if self._results is not None:
            output_path, headers, row = self._results
            ResultsCsv.write_results(self, output_path, [*headers, *self.sparsity_stats],  # type: ignore[arg-type]
                                     [*row, *self.sparsity_stats.values()])
        return {**metrics, **prefixed(self.sparsity_stats, self.name)}

    def write_results(self, output_path: Any, headers: list[str], row: list[Any]) -> None:
        """The dense evaluator's row, kept to be written with the sparsity's columns once they are known."""
        self._results = (output_path, headers, row)

    def embed(self, model: Any, texts: list[str], kind: str | None = None, **prompt: Any) -> torch.Tensor:
        embeddings = super().embed(model, texts, kind, **prompt).coalesce()  # type: ignore[misc]
        self._embedded.append(embeddings)
        return embeddings

    def encode_options(self) -> dict[str, Any]:
        return {"convert_to_sparse_tensor": True, "save_to_cpu": True, "max_active_dims": self.max_active_dims}

    @abstractmethod
    def sparsity_of(self, model: Any, embedded: list[torch.Tensor]) -> dict[str, float]:
        """The statistics of ``embedded``, the embeddings of each ``embed`` call in the order the dense evaluator
        made them: each sparse evaluator says which is which."""


def sparsity(model: Any, embeddings: torch.Tensor, prefix: str) -> dict[str, float]:
    """``model.sparsity`` (mean active dimensions, sparsity ratio), its keys prefixed ``{prefix}_``."""
    return prefixed(model.sparsity(embeddings), prefix)


def mean_sparsity(model: Any, embeddings: torch.Tensor, sizes: list[int], prefix: str,
                  weighted: bool) -> dict[str, float]:
    """The mean over consecutive groups of rows (``sizes[i]`` rows each) of each group's ``model.sparsity``,
    weighted by the group's rows or not: what sentence-transformers reports for embeddings it encoded in parts."""
    stats, start = [], 0
    for n in sizes:
        stats.append(model.sparsity(embeddings.index_select(0, torch.arange(start, start + n))))
        start += n
    weights = sizes if weighted else [1] * len(sizes)
    return {f"{prefix}_{key}": sum(s[key] * w for s, w in zip(stats, weights)) / sum(weights) for key in stats[0]}


def _active_share(embeddings: torch.Tensor) -> torch.Tensor:
    """(V,): the share of the rows that have each dimension active."""
    return torch.bincount(embeddings.indices()[1], minlength=embeddings.shape[1]).float() / embeddings.shape[0]


class SparseInformationRetrievalEvaluator(SparseEvaluator, InformationRetrievalEvaluator):
    """``InformationRetrievalEvaluator``'s arguments, ``max_active_dims`` (None: the model's) in place of
    ``truncate_dim``. Metric keys: the dense evaluator's, then ``{name}_query_active_dims``, ``_query_sparsity_ratio``,
    ``_corpus_active_dims``, ``_corpus_sparsity_ratio`` and ``_avg_flops``, the average FLOPS of a query-document
    product (the dot product of the mean query's and the mean document's per-dimension counts of non-zeros: what an
    inverted index multiplies per pair)."""

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


class SparseRerankingEvaluator(SparseEvaluator, RerankingEvaluator):
    """sentence-transformers' arguments: ``RerankingEvaluator``'s with ``max_active_dims`` (None: the model's) in
    ``truncate_dim``'s place. Metric keys: the dense evaluator's, then ``{name}_query_active_dims``,
    ``_query_sparsity_ratio``, ``_corpus_active_dims`` and ``_corpus_sparsity_ratio``. With
    ``use_batched_encoding=False`` the statistics are, as sentence-transformers reports them then, the mean over the
    samples of each sample's (the ranking metrics are the same either way)."""

    def __init__(self, samples: list[dict[str, Any]] | dict[Any, dict[str, Any]], at_k: int = 10, name: str = "",
                 write_csv: bool = True, similarity_fct: Callable[[Any, Any], torch.Tensor] | None = None,
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


class SparseTripletEvaluator(SparseEvaluator, TripletEvaluator):
    """sentence-transformers' arguments: ``TripletEvaluator``'s with ``max_active_dims`` (None: the model's) in
    ``truncate_dim``'s place. Anchors are encoded as queries, positives and negatives as documents. Metric keys:
    the dense evaluator's (``{name}_dot_accuracy`` for a SPLADE model), then ``{name}_anchor_active_dims``,
    ``_anchor_sparsity_ratio`` and the same for ``positive`` and ``negative``."""

    def __init__(self, anchors: Sequence[str], positives: Sequence[str], negatives: Sequence[str],
                 main_similarity_function: str | None = None, margin: float | dict[str, float] | None = None,
                 name: str = "", batch_size: int = 16, show_progress_bar: bool = False, write_csv: bool = True,
                 max_active_dims: int | None = None, similarity_fn_names: list[str] | None = None,
                 main_distance_function: str | None = None):
        super().__init__(anchors, positives, negatives, main_similarity_function=main_similarity_function,
                         margin=margin, name=name, batch_size=batch_size, show_progress_bar=show_progress_bar,
                         write_csv=write_csv, similarity_fn_names=similarity_fn_names,
                         main_distance_function=main_distance_function)
        self.max_active_dims = max_active_dims
        self.sparsity_stats: dict[str, float] = {}

    def sparsity_of(self, model: Any, embedded: list[torch.Tensor]) -> dict[str, float]:
        anchors, positives, negatives = embedded
        return {**sparsity(model, anchors, "anchor"), **sparsity(model, positives, "positive"),
                **sparsity(model, negatives, "negative")}


_REFUSED = {
    "SparseBinaryClassificationEvaluator": "score the pairs with model.similarity_pairwise(model.encode(sentences1), "
                                           "model.encode(sentences2)) and choose the threshold on them with "
                                           "bertkit.sentence.evaluation.BinaryClassificationEvaluator's "
                                           "find_best_acc_and_threshold and find_best_f1_and_threshold; "
                                           "SparseEmbeddingSimilarityEvaluator gives the correlation with the labels",
    "SparseMSEEvaluator": "it compares a student's embeddings with a teacher model's of the same width: compute "
                          "torch.nn.functional.mse_loss(model.encode(target_sentences, convert_to_sparse_tensor="
                          "False), teacher.encode(source_sentences, convert_to_sparse_tensor=False))",
    "SparseTranslationEvaluator": "use SparseInformationRetrievalEvaluator with the source sentences as queries, the "
                                  "target sentences as the corpus, each source's translation as its relevant "
                                  "document and score_functions={'cosine': bertkit.sentence.util.cos_sim}: "
                                  "accuracy@1 is the source-to-target accuracy (swap them for target-to-source)",
    "SparseNanoBEIREvaluator": "bertkit reads local files only: load the NanoBEIR datasets and run a "
                               "SparseInformationRetrievalEvaluator on each (bertkit.sentence.evaluation."
                               "SequentialEvaluator runs several)",
    "ReciprocalRankFusionEvaluator": "it scores two rankings given to it: fuse them (each document scores the sum "
                                     "of 1 / (rrf_k + its rank from 1) in each) and score the fused order with "
                                     "bertkit.sentence.evaluation.reranking's average_precision and ndcg_at_k",
}


__getattr__ = refusing_getattr(__name__, _REFUSED)
