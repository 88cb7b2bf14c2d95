"""RerankingEvaluator: for each query, rank its own candidates (positives and negatives) by similarity, and score
the ranking: MAP, MRR@k and nDCG@k, as sentence-transformers computes them (scikit-learn's average precision and
tie-averaged nDCG, re-implemented here in numpy; same keys, same numbers)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from bertkit.errors import BertkitError, is_whole
from bertkit.sentence.evaluation.base import EmbeddingEvaluator, ResultsCsv, prefixed, results_csv_name
from bertkit.sentence.finite import refuse_nan_scores
from bertkit.sentence.util import take_rows


def average_precision(relevant: np.ndarray, scores: np.ndarray) -> float:
    """scikit-learn's ``average_precision_score``: precision at each distinct score threshold, weighted by the
    recall it adds (tied candidates enter together)."""
    order = np.argsort(-scores, kind="mergesort")
    relevant, scores = relevant[order], scores[order]
    last = np.r_[np.flatnonzero(np.diff(scores)), len(scores) - 1]  # the last candidate of each tied group
    hits = np.cumsum(relevant)[last]
    precision, recall = hits / (last + 1), hits / relevant.sum()
    return float(np.sum(np.diff(np.r_[0.0, recall]) * precision))


def ndcg_at_k(relevant: np.ndarray, scores: np.ndarray, k: int, n_relevant: int | None = None) -> float:
    """scikit-learn's ``ndcg_score(..., k=k)`` for one query: tied candidates share their discounts equally. With
    ``n_relevant`` (at least the relevant candidates ranked), the ideal ranking holds that many relevant documents,
    those the ranking missed included, as sentence-transformers 6.3's reranking evaluators normalise it."""
    discount = 1 / np.log2(np.arange(len(scores)) + 2)
    discount[k:] = 0
    cumulative = np.cumsum(discount)
    _, group, counts = np.unique(-scores, return_inverse=True, return_counts=True)  # groups of equal score, best first
    gains = np.bincount(group, weights=relevant) / counts
    ends = np.cumsum(counts) - 1
    dcg = float(np.sum(gains * np.diff(np.r_[0.0, cumulative[ends]])))
    ideal = float(np.sum(1 / np.log2(np.arange(min(max(n_relevant or 0, int(relevant.sum())), k)) + 2)))
    return dcg / ideal


class RerankingEvaluator(ResultsCsv, EmbeddingEvaluator):
    """``samples``: a list (or dict) of ``{"query": str, "positive": [str, ...], "negative": [str, ...]}``
    (one string is one candidate); samples without positives or negatives are left out. Metric keys:
    ``{name}_map``, ``{name}_mrr@{at_k}``, ``{name}_ndcg@{at_k}`` (``at_k=None``: the whole ranking, keys ``mrr@None``
    and ``ndcg@None`` as sentence-transformers names them). Candidates are scored with ``similarity_fct``, by default
    (None) the model's own ``similarity`` (its ``similarity_fn_name``), as sentence-transformers 6.3 scores them. Queries are encoded as queries, candidates as
    documents (the model's prompts for each). The candidates of all samples are encoded in one call whatever
    ``use_batched_encoding`` says (sentence-transformers' per-sample encoding gives the same numbers). With an
    ``output_path``: ``RerankingEvaluator[_{name}]_results_@{at_k}.csv``."""

    def __init__(self, samples: list[dict[str, Any]] | dict[Any, dict[str, Any]], at_k: int = 10, name: str = "",
                 write_csv: bool = True, similarity_fct: Callable[[Any, Any], torch.Tensor] | None = None,
                 batch_size: int = 64, show_progress_bar: bool = False, use_batched_encoding: bool = True,
                 truncate_dim: int | None = None, mrr_at_k: int | None = None):
        at_k = mrr_at_k if mrr_at_k is not None else at_k
        if at_k is not None and not is_whole(at_k):
            raise BertkitError(f"RerankingEvaluator: at_k must be a whole number >= 1 (or None: the whole ranking), "
                               f"got {at_k!r}")
        self.samples = []
        for i, sample in enumerate(samples.values() if isinstance(samples, dict) else samples):
            missing = {"query", "positive", "negative"} - set(sample)
            if missing:
                raise BertkitError(f"RerankingEvaluator: sample {i} lacks {sorted(missing)}; each sample is "
                                   "{'query': str, 'positive': [str, ...], 'negative': [str, ...]}")
            positive, negative = ([s] if isinstance(s, str) else list(s) for s in (sample["positive"], sample["negative"]))
            if positive and negative:
                self.samples.append({**sample, "positive": positive, "negative": negative})
        if not self.samples:
            raise BertkitError("RerankingEvaluator: no sample has both a positive and a negative")
        self.at_k, self.name, self.similarity_fct = at_k, name, similarity_fct
        self.batch_size, self.show_progress_bar, self.truncate_dim = batch_size, show_progress_bar, truncate_dim
        self.use_batched_encoding, self.write_csv = use_batched_encoding, write_csv
        self.csv_file = results_csv_name("RerankingEvaluator", name, tail=f"_@{at_k}")
        self.primary_metric = f"{name}_ndcg@{at_k}" if name else f"ndcg@{at_k}"

    def __call__(self, model: Any, output_path: str | None = None, epoch: int = -1, steps: int = -1) -> dict[str, float]:
        queries = self.embed(model, [s["query"] for s in self.samples], "query")
        docs = self.embed(model, [d for s in self.samples for d in (*s["positive"], *s["negative"])], "document")
        similarity = self.similarity_fct if self.similarity_fct is not None else model.similarity
        ap, mrr, ndcg, start = [], [], [], 0
        for query, sample in zip(queries, self.samples):
            n_pos, n = len(sample["positive"]), len(sample["positive"]) + len(sample["negative"])
            scores = similarity(query, take_rows(docs, start, n)).reshape(-1)
            refuse_nan_scores(scores, "RerankingEvaluator", f"sample {len(mrr)}'s candidate")
            start += n
            relevant = np.r_[np.ones(n_pos), np.zeros(n - n_pos)]
            ranked = torch.argsort(-scores, stable=True)[:self.at_k].tolist()
            first = next((r for r, j in enumerate(ranked) if j < n_pos), None)
            mrr.append(0.0 if first is None else 1 / (first + 1))
            scores = scores.double().cpu().numpy()
            ndcg.append(ndcg_at_k(relevant, scores, self.at_k or n))
            ap.append(average_precision(relevant, scores))
        metrics = {"map": float(np.mean(ap)), f"mrr@{self.at_k}": float(np.mean(mrr)),
                   f"ndcg@{self.at_k}": float(np.mean(ndcg))}
        self.write_results(output_path, ["epoch", "steps", "MAP", f"MRR@{self.at_k}", f"NDCG@{self.at_k}"],
                           [epoch, steps, *metrics.values()])
        return prefixed(metrics, self.name)
