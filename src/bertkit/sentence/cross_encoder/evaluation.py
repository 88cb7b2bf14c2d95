"""sentence-transformers' cross-encoder evaluators, with their arguments and metric keys:
``CrossEncoderRerankingEvaluator`` (``map``, ``mrr@k``, ``ndcg@k``, and ``base_*`` for the order given when samples
carry ``documents``), ``CrossEncoderClassificationEvaluator`` (a one-label model's scores thresholded as
``BinaryClassificationEvaluator`` thresholds similarities; a several-label model's argmax scored by F1) and
``CrossEncoderCorrelationEvaluator`` (Pearson and Spearman against gold scores). Each writes sentence-transformers'
results CSV when given an ``output_path`` (``{class name}[_{name}]_results.csv``; the reranking one's ends
``_results_@{at_k}.csv``), as ``bertkit.sentence.evaluation.base.ResultsCsv`` says.

A reranking sample is ``{"query", "positive": [...], "negative": [...]}`` or ``{"query", "positive", "documents": [...]}``
(a first-stage ranking to rerank, possibly empty). AP and nDCG average over tied scores as scikit-learn's
``average_precision_score`` and ``dcg_score`` do, and are normalised by all of a query's positives, those missing from
its ``documents`` included (sentence-transformers 6.3's definitions: AP times the share of positives ranked, nDCG
against an ideal ranking of every positive); MRR@k takes numpy's argsort order, as sentence-transformers does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from bertkit.errors import BertkitError, WholeSetting, is_whole, refusing_getattr
from bertkit.sentence.evaluation.base import ResultsCsv, prefixed, results_csv_name
from bertkit.sentence.evaluation.binary_classification import BinaryClassificationEvaluator, binary_labels
from bertkit.sentence.evaluation.reranking import average_precision, ndcg_at_k
from bertkit.sentence.evaluation.similarity import correlations, gold_scores
from bertkit.sentence.finite import refuse_nonfinite


class _PredictingEvaluator(ResultsCsv):
    """What the cross-encoder evaluators share: ``model.predict`` in batches of ``batch_size``, checked when the
    evaluator is made (a trainer first runs it after steps of training), and the results CSV."""

    batch_size = WholeSetting()


class CrossEncoderRerankingEvaluator(_PredictingEvaluator):
    """Rerank each sample's documents with ``model.predict`` and report MAP, MRR@at_k and nDCG@at_k (and the
    first-stage order's as ``base_*`` for ``documents`` samples), keys prefixed with ``name_`` when named."""

    # the positions are sentence-transformers 6's (prompt_name after name): (samples, 10, True, "dev", None, 16)
    # failed here on batch_size None, and (samples, 10, True, "dev", 16) ran in batches of 16 what fails there
    def __init__(self, samples: Sequence[dict[str, Any]] | dict[str, dict[str, Any]], at_k: int = 10,
                 always_rerank_positives: bool = True, name: str = "", prompt_name: str | None = None,
                 batch_size: int = 64, show_progress_bar: bool = False, write_csv: bool = True,
                 mrr_at_k: int | None = None):
        _no_prompt(prompt_name, "CrossEncoderRerankingEvaluator")
        self.samples = list(samples.values()) if isinstance(samples, dict) else list(samples)
        if not self.samples:  # sentence-transformers fails in numpy after scoring nothing
            raise BertkitError("CrossEncoderRerankingEvaluator: samples is empty; give a list of {'query', "
                               "'positive', 'negative' or 'documents'} dicts")
        for i, s in enumerate(self.samples):
            if "query" not in s or "positive" not in s or ("negative" in s) == ("documents" in s):
                raise BertkitError(f"CrossEncoderRerankingEvaluator: sample {i} has the keys {sorted(s)}; each needs "
                                   "'query', 'positive' and exactly one of 'negative' and 'documents'")
            for key in ("positive", "negative", "documents"):
                value = s.get(key, [])
                if key == "positive" and isinstance(value, str):
                    continue  # one positive, as sentence-transformers reads it
                if not isinstance(value, (list, tuple)) or not all(isinstance(t, str) for t in value):
                    # a str would be reranked character by character (a negative "a dog runs" as 10 documents), a
                    # set in no order
                    raise BertkitError(f"CrossEncoderRerankingEvaluator: sample {i}'s {key!r} is "
                                       f"{type(value).__name__} {str(value)[:60]!r}; give a list of texts "
                                       f"([{str(value)[:20]!r}] for one)")
            if not s["positive"]:  # sentence-transformers averages it in as 0: a query with nothing to find is no miss
                raise BertkitError(f"CrossEncoderRerankingEvaluator: sample {i}'s 'positive' is empty, so its MAP, MRR "
                                   "and nDCG are undefined; give its relevant documents, or leave the sample out")
        self.at_k = mrr_at_k if mrr_at_k is not None else at_k
        if self.at_k is not None and not is_whole(self.at_k):
            raise BertkitError(f"CrossEncoderRerankingEvaluator: {'mrr_at_k' if mrr_at_k is not None else 'at_k'} "
                               f"must be a whole number >= 1 (or None: the whole ranking), got {self.at_k!r}")
        self.always_rerank_positives, self.name = always_rerank_positives, name
        self.batch_size, self.show_progress_bar, self.write_csv = batch_size, show_progress_bar, write_csv
        self.primary_metric = f"{name}_ndcg@{self.at_k}" if name else f"ndcg@{self.at_k}"
        self.csv_file = results_csv_name("CrossEncoderRerankingEvaluator", name, tail=f"_@{self.at_k}")

    def _metrics(self, relevant: list[int], scores: np.ndarray, n_positive: int) -> tuple[float, float, float]:
        """MRR@k, nDCG@k and AP of one sample's ranking, normalised by its ``n_positive`` positives (0 for all three
        when the ranking holds none of them)."""
        found = sum(relevant)
        if not found:
            return 0.0, 0.0, 0.0
        n_positive = max(n_positive, found)
        ranking = np.argsort(scores)[::-1]
        mrr = next((1 / (rank + 1) for rank, i in enumerate(ranking[:self.at_k]) if relevant[i]), 0.0)
        relevant_array = np.asarray(relevant)
        # at_k None (the whole ranking) is bertkit's reading: sentence-transformers 6.3 fails on it (min(n, None))
        return (mrr, ndcg_at_k(relevant_array, scores, self.at_k or len(scores), n_positive),
                average_precision(relevant_array, scores) * found / n_positive)

    def __call__(self, model: Any, output_path: str | None = None, epoch: int = -1, steps: int = -1) -> dict[str, float]:
        base, per_sample, pairs = [], [], []
        for s in self.samples:
            docs, relevant, first_stage = _rankings(s, self.always_rerank_positives)
            n_positive = 1 if isinstance(s["positive"], str) else len(s["positive"])
            if first_stage is not None:
                base.append(self._metrics(first_stage, np.arange(len(first_stage), 0, -1), n_positive))
            per_sample.append((relevant, len(docs), n_positive) if sum(relevant) else None)
            if sum(relevant):
                pairs += [(s["query"], d) for d in docs]
        scores = model.predict(pairs, batch_size=self.batch_size, convert_to_numpy=True,
                               show_progress_bar=self.show_progress_bar) if pairs else np.array([])
        refuse_nonfinite(scores, pairs, "CrossEncoderRerankingEvaluator", "score", model=model)
        results, at = [], 0
        for item in per_sample:
            if item is None:
                results.append((0.0, 0.0, 0.0))
                continue
            relevant, n, n_positive = item
            results.append(self._metrics(relevant, scores[at:at + n], n_positive))
            at += n
        mrr, nd, ap = np.mean(results, axis=0)
        metrics = {"map": float(ap), f"mrr@{self.at_k}": float(mrr), f"ndcg@{self.at_k}": float(nd)}
        self.write_results(output_path, ["epoch", "steps", "MAP", f"MRR@{self.at_k}", f"NDCG@{self.at_k}"],
                           [epoch, steps, *metrics.values()])
        if base:
            b_mrr, b_nd, b_ap = np.mean(base, axis=0)
            metrics |= {"base_map": float(b_ap), f"base_mrr@{self.at_k}": float(b_mrr),
                        f"base_ndcg@{self.at_k}": float(b_nd)}
        return prefixed(metrics, self.name)


def _rankings(sample: dict[str, Any], always_rerank_positives: bool) -> tuple[list[str], list[int], list[int] | None]:
    """A sample as sentence-transformers reranks it: the documents scored and their relevance, and the relevance in
    the first stage's order (None without ``documents``)."""
    positive, documents = sample["positive"], sample.get("documents")
    positive = [positive] if isinstance(positive, str) else list(positive)
    if documents is None:
        return positive + list(sample["negative"]), [1] * len(positive) + [0] * len(sample["negative"]), None
    first_stage = [int(d in positive) for d in documents]
    if always_rerank_positives:
        docs = positive + [d for d in documents if d not in positive]
        relevant = [1] * len(positive) + [0] * (len(docs) - len(positive))
    else:
        docs, relevant = list(documents), list(first_stage)
    return docs, relevant, first_stage


def f1_averages(labels: np.ndarray, predicted: np.ndarray) -> tuple[float, float, float]:
    """scikit-learn's macro, micro and weighted ``f1_score`` over the classes in ``labels`` or ``predicted`` (a
    class never true nor predicted correctly has F1 0)."""
    classes = np.union1d(labels, predicted)
    true_sums = np.array([np.sum(labels == c) for c in classes], dtype=np.float64)
    predicted_sums = np.array([np.sum(predicted == c) for c in classes], dtype=np.float64)
    hits = np.array([np.sum((labels == c) & (predicted == c)) for c in classes], dtype=np.float64)
    denominators = true_sums + predicted_sums
    f1 = np.divide(2 * hits, denominators, out=np.zeros_like(hits), where=denominators > 0)
    micro = 2 * hits.sum() / denominators.sum()
    return float(f1.mean()), float(micro), float(np.average(f1, weights=true_sums))


def class_labels(labels: np.ndarray, num_labels: int) -> np.ndarray:
    """A several-label model's labels as class ids, refusing one that is not a whole number in [0, num_labels):
    sentence-transformers scored a label of 3 or -1 as a class the model never predicts, and a NaN (in a float
    array) as none, an F1 like any other."""
    # whole floats (pandas' 1.0) and bools (a dataset's True/False) are class ids, as in sentence-transformers
    bad = [(i, v) for i, v in enumerate(labels.tolist()) if not isinstance(v, (int, float))
           or not float(v).is_integer() or not 0 <= v < num_labels]
    if bad:
        raise BertkitError(f"CrossEncoderClassificationEvaluator with a {num_labels}-label model: labels must be "
                           f"class ids 0 to {num_labels - 1}; label {bad[0][0]} is {bad[0][1]} ({len(bad)} such)")
    return np.asarray([int(v) for v in labels.tolist()], dtype=np.int64)


def _pairs(sentence_pairs: Sequence[Sequence[str]], n: int, what: str, who: str) -> list[list[str]]:
    if len(sentence_pairs) != n:
        raise BertkitError(f"{who}: {len(sentence_pairs)} sentence_pairs and {n} {what}; give one per pair")
    if not sentence_pairs:
        raise BertkitError(f"{who}: no pairs to evaluate")
    for i, pair in enumerate(sentence_pairs):
        # a str would be split into its characters, and predict would name the characters, not this pair
        if isinstance(pair, (str, bytes)) or len(pair) != 2 or not all(isinstance(t, str) for t in pair):
            raise BertkitError(f"{who}: sentence_pairs[{i}] is {pair!r:.80}; give (text, text) pairs")
    return [list(p) for p in sentence_pairs]


def _no_prompt(prompt_name: str | None, who: str) -> None:
    if prompt_name is not None and not isinstance(prompt_name, str):  # a batch size given where 5 took it
        raise BertkitError(f"{who}(prompt_name={prompt_name!r}): sentence-transformers 6 takes prompt_name after "
                           f"name, not batch_size: pass batch_size={prompt_name!r} and the others by name")
    if prompt_name is not None:
        raise BertkitError(f"{who}(prompt_name=...) is not implemented in bertkit: cross-encoder prompts are not "
                           "implemented")


class CrossEncoderClassificationEvaluator(_PredictingEvaluator):
    """For a model with one label: ``accuracy``, ``accuracy_threshold``, ``f1``, ``f1_threshold``,
    ``precision``, ``recall`` and ``average_precision`` of its scores against 0/1 ``labels`` (the thresholds
    searched as ``BinaryClassificationEvaluator`` searches them). For several labels: ``f1_macro``,
    ``f1_micro`` and ``f1_weighted`` of the highest-scoring label. Keys prefixed with ``name_`` when named."""

    def __init__(self, sentence_pairs: Sequence[Sequence[str]], labels: Sequence[int], *, name: str = "",
                 prompt_name: str | None = None, batch_size: int = 32, show_progress_bar: bool | None = None,
                 write_csv: bool = True):
        _no_prompt(prompt_name, "CrossEncoderClassificationEvaluator")
        self.sentence_pairs = _pairs(sentence_pairs, len(labels), "labels", "CrossEncoderClassificationEvaluator")
        self.labels = np.asarray(labels)
        self.name, self.batch_size, self.show_progress_bar = name, batch_size, show_progress_bar
        self.write_csv = write_csv
        self.primary_metric: str | None = None
        self.csv_file = results_csv_name("CrossEncoderClassificationEvaluator", name)

    def __call__(self, model: Any, output_path: str | None = None, epoch: int = -1, steps: int = -1) -> dict[str, float]:
        scores = model.predict(self.sentence_pairs, batch_size=self.batch_size, convert_to_numpy=True,
                               show_progress_bar=self.show_progress_bar)
        refuse_nonfinite(scores, self.sentence_pairs, "CrossEncoderClassificationEvaluator", "score",
                         model=model)
        if model.num_labels == 1:
            labels = binary_labels(self.labels, "CrossEncoderClassificationEvaluator with a one-label model")
            if not labels.any():  # sentence-transformers reports the undefined average precision as 0.0
                raise BertkitError("CrossEncoderClassificationEvaluator: every label is 0; average precision needs "
                                   "at least one positive pair (label 1)")
            accuracy, accuracy_threshold = BinaryClassificationEvaluator.find_best_acc_and_threshold(scores, labels, True)
            f1, precision, recall, f1_threshold = BinaryClassificationEvaluator.find_best_f1_and_threshold(
                scores, labels, True)
            metrics = {"accuracy": accuracy, "accuracy_threshold": accuracy_threshold, "f1": f1,
                       "f1_threshold": f1_threshold, "precision": precision, "recall": recall,
                       "average_precision": average_precision(labels, scores)}
            main, columns = "average_precision", ["Accuracy", "Accuracy_Threshold", "F1", "F1_Threshold", "Precision",
                                                  "Recall", "Average_Precision"]
        else:
            labels = class_labels(self.labels, model.num_labels)
            macro, micro, weighted = f1_averages(labels, np.argmax(scores, axis=1))
            metrics, main = {"f1_macro": macro, "f1_micro": micro, "f1_weighted": weighted}, "f1_macro"
            columns = ["Macro_F1", "Micro_F1", "Weighted_F1"]
        self.write_results(output_path, ["epoch", "steps", *columns], [epoch, steps, *metrics.values()])
        self.primary_metric = f"{self.name}_{main}" if self.name else main
        return prefixed(metrics, self.name)


class CrossEncoderCorrelationEvaluator(_PredictingEvaluator):
    """``pearson`` and ``spearman`` correlation of the model's scores with the gold ``scores`` (Spearman's ties
    given their average rank), keys prefixed with ``name_`` when named."""

    def __init__(self, sentence_pairs: Sequence[Sequence[str]], scores: Sequence[float], name: str = "",
                 prompt_name: str | None = None, batch_size: int = 32, show_progress_bar: bool | None = None,
                 write_csv: bool = True):
        _no_prompt(prompt_name, "CrossEncoderCorrelationEvaluator")
        self.sentence_pairs = _pairs(sentence_pairs, len(scores), "scores", "CrossEncoderCorrelationEvaluator")
        self.scores = gold_scores(scores, "CrossEncoderCorrelationEvaluator")
        self.name, self.batch_size, self.show_progress_bar = name, batch_size, show_progress_bar
        self.write_csv = write_csv
        self.primary_metric = f"{name}_spearman" if name else "spearman"
        self.csv_file = results_csv_name("CrossEncoderCorrelationEvaluator", name)

    def __call__(self, model: Any, output_path: str | None = None, epoch: int = -1, steps: int = -1) -> dict[str, float]:
        predicted = model.predict(self.sentence_pairs, batch_size=self.batch_size, convert_to_numpy=True,
                                  show_progress_bar=self.show_progress_bar)
        refuse_nonfinite(predicted, self.sentence_pairs, "CrossEncoderCorrelationEvaluator", "score",
                         model=model)
        if np.ndim(predicted) != 1:
            raise BertkitError(f"CrossEncoderCorrelationEvaluator needs one score per pair; this model gives "
                               f"{np.shape(predicted)[-1]} (num_labels): correlate a one-label model's scores")
        metrics = dict(zip(("pearson", "spearman"), correlations(self.scores, predicted)))
        self.write_results(output_path, ["epoch", "steps", "Pearson_Correlation", "Spearman_Correlation"],
                           [epoch, steps, *metrics.values()])
        return prefixed(metrics, self.name)


__all__ = ["CrossEncoderRerankingEvaluator", "CrossEncoderClassificationEvaluator", "CrossEncoderCorrelationEvaluator"]

_CLASSIFY = "sentence-transformers deprecated it: use CrossEncoderClassificationEvaluator(sentence_pairs, labels)"
_REFUSED = {
    "CrossEncoderNanoBEIREvaluator": "bertkit reads local files only: load the NanoBEIR datasets and run a "
                                     "CrossEncoderRerankingEvaluator on each (bertkit.sentence.evaluation."
                                     "SequentialEvaluator runs several)",
    "CEBinaryAccuracyEvaluator": _CLASSIFY, "CEBinaryClassificationEvaluator": _CLASSIFY, "CEF1Evaluator": _CLASSIFY,
    "CESoftmaxAccuracyEvaluator": _CLASSIFY,
    "CECorrelationEvaluator": "sentence-transformers deprecated it: use CrossEncoderCorrelationEvaluator(sentence_pairs, "
                              "scores)",
    "CERerankingEvaluator": "sentence-transformers deprecated it: use CrossEncoderRerankingEvaluator(samples)",
}

__getattr__ = refusing_getattr(__name__, _REFUSED)
