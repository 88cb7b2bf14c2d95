"""InformationRetrievalEvaluator: embed queries and a corpus, rank the corpus for each query by the model's
similarity (exact search, ``corpus_chunk_size`` documents scored at a time, ties broken by corpus id), and score
the ranking against the relevant documents: accuracy@k, precision@k, recall@k, MRR@k, nDCG@k (binary relevance)
and MAP@k, as sentence-transformers computes them (same keys, same numbers)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import torch

from bertkit.errors import BertkitError, is_whole
from bertkit.sentence.evaluation.base import EmbeddingEvaluator, ResultsCsv, prefixed, results_csv_name
from bertkit.sentence.finite import refuse_nan_scores
from bertkit.sentence.util import SIMILARITY_FUNCTIONS, similarity_function


class InformationRetrievalEvaluator(ResultsCsv, EmbeddingEvaluator):
    """``queries`` {qid: text}, ``corpus`` {cid: text}, ``relevant_docs`` {qid: {cid, ...}}; queries without
    relevant documents are left out (as sentence-transformers does), a relevant id missing from the corpus is an
    error. Metric keys: ``{name}_{similarity}_{metric}@{k}``. With an ``output_path``:
    ``Information-Retrieval_evaluation[_{name}]_results.csv``."""

    csv_lineterminator = "\n"  # sentence-transformers joins this file's lines itself

    def __init__(self, queries: dict[str, str], corpus: dict[str, str], relevant_docs: dict[str, set[str]],
                 corpus_chunk_size: int = 50000, mrr_at_k: list[int] = [10], ndcg_at_k: list[int] = [10],  # noqa: B006
                 accuracy_at_k: list[int] = [1, 3, 5, 10], precision_recall_at_k: list[int] = [1, 3, 5, 10],  # noqa: B006
                 map_at_k: list[int] = [100], show_progress_bar: bool = False, batch_size: int = 32,  # noqa: B006
                 name: str = "", write_csv: bool = True, truncate_dim: int | None = None,
                 score_functions: dict[str, Any] | None = None, main_score_function: str | None = None,
                 query_prompt: str | None = None, query_prompt_name: str | None = None,
                 corpus_prompt: str | None = None, corpus_prompt_name: str | None = None,
                 write_predictions: bool = False):
        if write_predictions:
            raise BertkitError("InformationRetrievalEvaluator(write_predictions=True) is not implemented in bertkit; "
                               "rank with bertkit.sentence.util.semantic_search and write what you need")
        for what, value in (("queries", queries), ("corpus", corpus), ("relevant_docs", relevant_docs)):
            if not isinstance(value, Mapping):
                raise BertkitError(f"InformationRetrievalEvaluator: {what} is {type(value).__name__}; give a dict "
                                   f"({'{query id: set of relevant corpus ids}' if what == 'relevant_docs' else '{id: text}'})")
        for q, docs in relevant_docs.items():
            if isinstance(docs, (str, bytes, Mapping)) or not isinstance(docs, Iterable):
                # a str id would be matched as a substring: "12" holds "1" and "2"
                raise BertkitError(f"InformationRetrievalEvaluator: relevant_docs[{q!r}] is {type(docs).__name__} "
                                   f"{str(docs)[:40]!r}; give the relevant corpus ids as a set ({{{str(docs)[:20]!r}}} "
                                   "for one)")
            listed = list(docs)
            if q in queries and len(set(listed)) < len(listed):  # counted per mention in recall@k and ideal nDCG
                twice = sorted({c for i, c in enumerate(listed) if c in listed[:i]}, key=str)
                raise BertkitError(f"InformationRetrievalEvaluator: relevant_docs[{q!r}] names {twice[:5]} more than "
                                   "once; give the relevant corpus ids as a set (set(ids))")
        missing = sorted({c for q, docs in relevant_docs.items() if q in queries for c in docs if c not in corpus})
        if missing:
            raise BertkitError(f"InformationRetrievalEvaluator{f' {name!r}' if name else ''}: {len(missing)} relevant "
                               f"document id(s) are not in the corpus, e.g. {missing[:5]}; add them to corpus, or "
                               "remove them from relevant_docs")
        cutoffs = {"mrr_at_k": mrr_at_k, "ndcg_at_k": ndcg_at_k, "accuracy_at_k": accuracy_at_k,
                   "precision_recall_at_k": precision_recall_at_k, "map_at_k": map_at_k}
        for what, ks in cutoffs.items():
            # a k given twice is counted twice in sentence-transformers' accuracy@k and MRR@k (an accuracy of 2); a
            # lone k (ndcg_at_k=10) failed in iterating it, a numpy array in its truth value
            listed = list(ks) if isinstance(ks, Iterable) and not isinstance(ks, (str, bytes, Mapping)) else None
            if not listed or len(set(listed)) < len(listed) or not all(map(is_whole, listed)):
                one = f" ([{ks!r}] for one)" if is_whole(ks) else ""
                raise BertkitError(f"InformationRetrievalEvaluator: {what} is {ks!r}; give a list of different whole "
                                   f"numbers >= 1{one}")
            cutoffs[what] = listed
        if not is_whole(corpus_chunk_size):
            raise BertkitError(f"corpus_chunk_size must be a whole number >= 1, got {corpus_chunk_size!r}")
        if score_functions is not None and not score_functions:
            raise BertkitError("InformationRetrievalEvaluator: score_functions is empty; give {name: function}, or "
                               "None for the model's similarity function")
        self.query_ids = [q for q in queries if relevant_docs.get(q)]
        if not self.query_ids:
            raise BertkitError("InformationRetrievalEvaluator: no query has a relevant document in relevant_docs")
        self.queries = [queries[q] for q in self.query_ids]
        self.corpus_ids = list(corpus)
        try:  # documents of equal score are ranked by id (sentence-transformers' order), so the ids must compare
            sorted(self.corpus_ids)
        except TypeError:  # sentence-transformers fails so at the first tie: '<' not supported between 'str' and 'int'
            kinds = sorted({type(c).__name__ for c in self.corpus_ids})
            raise BertkitError(f"InformationRetrievalEvaluator: the corpus ids mix types ({', '.join(kinds)}), and "
                               "documents of equal score are ranked by id; give ids of one type (all str, say)") from None
        self.corpus = [corpus[c] for c in self.corpus_ids]
        self.relevant_docs = relevant_docs
        self.mrr_at_k, self.ndcg_at_k, self.accuracy_at_k, self.precision_recall_at_k, self.map_at_k = cutoffs.values()
        self.max_k = max(k for ks in cutoffs.values() for k in ks)
        self.corpus_chunk_size = corpus_chunk_size
        self.batch_size, self.show_progress_bar, self.name = batch_size, show_progress_bar, name
        self.truncate_dim, self.score_functions = truncate_dim, score_functions
        self.main_score_function = main_score_function
        self.query_prompt, self.query_prompt_name = query_prompt, query_prompt_name
        self.corpus_prompt, self.corpus_prompt_name = corpus_prompt, corpus_prompt_name
        self.primary_metric: str | None = None
        self.main: str | None = None  # the score function whose nDCG is the primary metric
        self.write_csv = write_csv
        self.csv_file = results_csv_name("Information-Retrieval_evaluation", name)

    def __call__(self, model: Any, output_path: str | None = None, epoch: int = -1, steps: int = -1) -> dict[str, float]:
        functions = self.score_functions or {model.similarity_fn_name: SIMILARITY_FUNCTIONS[model.similarity_fn_name][0]}
        q = self.embed(model, self.queries, "query", prompt=self.query_prompt, prompt_name=self.query_prompt_name)
        c = self.embed(model, self.corpus, "document", prompt=self.corpus_prompt, prompt_name=self.corpus_prompt_name)
        metrics: dict[str, float] = {}
        n, size = len(self.corpus), self.corpus_chunk_size
        chunks = [torch.arange(a, min(a + size, n), device=c.device) for a in range(0, n, size)]
        for fn_name, fn in functions.items():
            # scored corpus_chunk_size documents at a time, as sentence-transformers scores them: equal documents in
            # two chunks may score an ulp apart, and that, not the corpus id, then orders them
            scores = torch.cat([fn(q, c.index_select(0, rows)) for rows in chunks], dim=1)
            refuse_nan_scores(scores, f"InformationRetrievalEvaluator ({fn_name})", "query", "corpus entry")
            ranked = self.rank(scores)
            for key, value in self.compute_metrics(ranked).items():
                metrics[f"{fn_name}_{key}"] = value
        columns = [(fn, key) for fn in sorted(functions) for key in self.csv_metrics()]
        self.write_results(output_path, ["epoch", "steps", *(f"{fn}-{key}" for fn, key in columns)],
                           [epoch, steps, *(metrics[f"{fn}_{key.lower()}"] for fn, key in columns)])
        at = max(self.ndcg_at_k)
        if self.main_score_function:
            self.main = similarity_function(self.main_score_function)
        elif self.main not in functions:  # the first call's best nDCG (by name on a tie), then kept through training
            self.main = max(sorted(functions), key=lambda f: metrics[f"{f}_ndcg@{at}"])  # as sentence-transformers
        self.primary_metric = f"{self.name}_{self.main}_ndcg@{at}" if self.name else f"{self.main}_ndcg@{at}"
        return prefixed(metrics, self.name)

    def csv_metrics(self) -> list[str]:
        """A score function's columns in the results CSV, in sentence-transformers' order and spelling."""
        return [*(f"Accuracy@{k}" for k in self.accuracy_at_k),
                *(f"{m}@{k}" for k in self.precision_recall_at_k for m in ("Precision", "Recall")),
                *(f"MRR@{k}" for k in self.mrr_at_k), *(f"NDCG@{k}" for k in self.ndcg_at_k),
                *(f"MAP@{k}" for k in self.map_at_k)]

    def rank(self, scores: torch.Tensor) -> list[list[str]]:
        """Each query's top max_k corpus ids: by score, ties by corpus id (sentence-transformers' order)."""
        k = min(self.max_k, scores.shape[1])
        threshold = torch.topk(scores, k, dim=1).values[:, -1:]  # (Q, 1): the k-th best score
        ranked = []
        for row, t in zip(scores.tolist(), threshold[:, 0].tolist()):
            candidates = [(s, self.corpus_ids[j]) for j, s in enumerate(row) if s >= t]
            ranked.append([cid for _, cid in sorted(candidates, key=lambda x: (-x[0], x[1]))[:k]])
        return ranked

    def compute_metrics(self, ranked: list[list[str]]) -> dict[str, float]:
        out: dict[str, list[float]] = {}
        for qid, hits in zip(self.query_ids, ranked):
            relevant = self.relevant_docs[qid]
            is_rel = [h in relevant for h in hits]
            for k in self.accuracy_at_k:
                out.setdefault(f"accuracy@{k}", []).append(float(any(is_rel[:k])))
            for k in self.precision_recall_at_k:
                out.setdefault(f"precision@{k}", []).append(sum(is_rel[:k]) / k)
                out.setdefault(f"recall@{k}", []).append(sum(is_rel[:k]) / len(relevant))
            for k in self.mrr_at_k:
                first = next((r for r, hit in enumerate(is_rel[:k]) if hit), None)
                out.setdefault(f"mrr@{k}", []).append(0.0 if first is None else 1.0 / (first + 1))
            for k in self.ndcg_at_k:
                dcg = sum(1 / math.log2(r + 2) for r, hit in enumerate(is_rel[:k]) if hit)
                ideal = sum(1 / math.log2(r + 2) for r in range(min(len(relevant), k)))
                out.setdefault(f"ndcg@{k}", []).append(dcg / ideal)
            for k in self.map_at_k:
                found, total = 0, 0.0
                for r, hit in enumerate(is_rel[:k]):
                    if hit:
                        found += 1
                        total += found / (r + 1)
                out.setdefault(f"map@{k}", []).append(total / min(k, len(relevant)))
        order = ["accuracy", "precision", "recall", "ndcg", "mrr", "map"]  # each metric's ks in the order given
        return {key: float(np.mean(out[key])) for key in sorted(out, key=lambda key: order.index(key.split("@")[0]))}
