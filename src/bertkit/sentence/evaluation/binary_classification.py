"""BinaryClassificationEvaluator: how well a similarity threshold separates duplicate pairs (label 1) from the others
(label 0), per similarity function, as sentence-transformers computes it: the accuracy- and F1-maximising
thresholds, precision and recall at the F1 threshold, average precision and the Matthews correlation at the F1
threshold (same keys, same numbers, same thresholds).

The thresholds are searched between groups of equal scores, best first: a threshold is the midpoint of a group's
score and the next group's (in the scores' own precision, float32 for a model's), and the first threshold reaching
the best value wins. Distances (euclidean, manhattan) are searched smallest first.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from bertkit.errors import BertkitError
from bertkit.sentence.evaluation.base import (
    EmbeddingEvaluator,
    ResultsCsv,
    prefixed,
    refuse_one_text,
    results_csv_name,
)
from bertkit.sentence.evaluation.reranking import average_precision
from bertkit.sentence.finite import refuse_nan_scores
from bertkit.sentence.util import SIMILARITY_FUNCTIONS, similarity_function
from bertkit.tasks.metrics import matthews_corrcoef

# The similarity functions whose score is a distance: a pair is a duplicate below the threshold, not above it
DISTANCES = ("euclidean", "manhattan")
# A similarity function's columns in the results CSV, in sentence-transformers' order
CSV_METRICS = ("accuracy", "accuracy_threshold", "f1", "precision", "recall", "f1_threshold", "ap", "mcc")


def _groups(scores: np.ndarray, labels: np.ndarray, high_score_more_similar: bool) -> tuple[np.ndarray, ...]:
    """Scores sorted most similar first, and the last index of each run of equal scores in that order."""
    scores = np.asarray(scores)
    order = np.argsort(-scores if high_score_more_similar else scores, kind="mergesort")
    ordered = scores[order]
    ends = np.r_[np.flatnonzero(ordered[1:] != ordered[:-1]), len(ordered) - 1]
    return ordered, np.asarray(labels)[order], ends


def _threshold(ordered: np.ndarray, ends: np.ndarray, at: int) -> Any:
    """The threshold after the group ending at ``ends[at]``: the midpoint with the next group's score, or the
    group's own score for the last group and where the midpoint rounds onto the next score."""
    i = ends[at]
    if i == len(ordered) - 1:
        return ordered[i]
    middle = (ordered[i] + ordered[i + 1]) / 2
    return ordered[i] if middle == ordered[i + 1] else middle


def binary_labels(labels: Sequence[Any], who: str) -> np.ndarray:
    bad = [(i, v) for i, v in enumerate(labels) if not (v == 0 or v == 1)]
    if bad:
        raise BertkitError(f"{who}: labels must be 0 or 1; label {bad[0][0]} is {bad[0][1]!r} ({len(bad)} such)")
    return np.asarray([int(v) for v in labels], dtype=np.int64)


class BinaryClassificationEvaluator(ResultsCsv, EmbeddingEvaluator):
    """``{fn}_accuracy``, ``{fn}_accuracy_threshold``, ``{fn}_f1``, ``{fn}_f1_threshold``, ``{fn}_precision``,
    ``{fn}_recall``, ``{fn}_ap`` and ``{fn}_mcc`` for each of ``similarity_fn_names`` (by default the model's), and
    ``max_{metric}`` of each over several. Every distinct sentence is embedded once, with ``model.encode``. With an
    ``output_path``: ``binary_classification_evaluation[_{name}]_results.csv``."""

    def __init__(self, sentences1: Sequence[str], sentences2: Sequence[str], labels: Sequence[int], name: str = "",
                 batch_size: int = 32, show_progress_bar: bool = False, write_csv: bool = True,
                 truncate_dim: int | None = None, similarity_fn_names: list[str] | None = None):
        refuse_one_text("BinaryClassificationEvaluator", sentences1=sentences1, sentences2=sentences2)
        if not len(sentences1) == len(sentences2) == len(labels):
            raise BertkitError(f"BinaryClassificationEvaluator: {len(sentences1)} sentences1, {len(sentences2)} "
                               f"sentences2 and {len(labels)} labels; give one label per pair")
        if not len(labels):  # a numpy array of labels has no truth value
            raise BertkitError("BinaryClassificationEvaluator: no pairs to evaluate")
        self.labels = binary_labels(labels, "BinaryClassificationEvaluator")
        if not self.labels.any():
            raise BertkitError("BinaryClassificationEvaluator: every label is 0; average precision needs at least "
                               "one duplicate pair (label 1)")
        self.sentences1, self.sentences2 = list(sentences1), list(sentences2)
        self.name, self.batch_size, self.show_progress_bar = name, batch_size, show_progress_bar
        self.truncate_dim, self.write_csv = truncate_dim, write_csv
        self.similarity_fn_names = [similarity_function(n) for n in similarity_fn_names or []]
        self.primary_metric: str | None = None
        self.csv_file = results_csv_name("binary_classification_evaluation", name)

    @staticmethod
    def find_best_acc_and_threshold(scores: Any, labels: Any, high_score_more_similar: bool) -> tuple[float, Any]:
        """The best accuracy of "duplicate where the score passes the threshold", and that threshold (just past
        the most similar score where calling every pair a non-duplicate is best)."""
        ordered, labels, ends = _groups(scores, labels, high_score_more_similar)
        n = len(labels)
        negatives = int(np.sum(labels == 0))
        accuracy = (np.cumsum(labels == 1)[ends] + negatives - np.cumsum(labels != 1)[ends]) / n
        best = int(np.argmax(accuracy))
        if accuracy[best] > negatives / n:
            return float(accuracy[best]), _threshold(ordered, ends, best)
        dtype = np.result_type(ordered.dtype, np.float16)
        return negatives / n, np.nextafter(ordered[0], np.inf if high_score_more_similar else -np.inf, dtype=dtype)

    @staticmethod
    def find_best_f1_and_threshold(scores: Any, labels: Any,
                                   high_score_more_similar: bool) -> tuple[float, float, float, Any]:
        """The best F1 of "duplicate where the score passes the threshold", its precision, its recall and the
        threshold (all 0 where no threshold finds a duplicate)."""
        ordered, labels, ends = _groups(scores, labels, high_score_more_similar)
        found = np.cumsum(labels == 1)[ends].astype(np.float64)
        precision, recall = found / (ends + 1), found / max(int(np.sum(labels == 1)), 1)
        with np.errstate(invalid="ignore"):  # no duplicate found yet: 0/0, never chosen
            f1 = np.where(found > 0, 2 * precision * recall / (precision + recall), 0.0)
        best = int(np.argmax(f1))
        if f1[best] <= 0:
            return 0, 0, 0, 0
        return float(f1[best]), float(precision[best]), float(recall[best]), _threshold(ordered, ends, best)

    def __call__(self, model: Any, output_path: str | None = None, epoch: int = -1, steps: int = -1) -> dict[str, float]:
        texts = list(dict.fromkeys([*self.sentences1, *self.sentences2]))
        index = {t: i for i, t in enumerate(texts)}
        embeddings = self.embed(model, texts)
        e1 = embeddings[[index[t] for t in self.sentences1]]
        e2 = embeddings[[index[t] for t in self.sentences2]]
        names = self.similarity_fn_names or [similarity_function(model.similarity_fn_name)]
        per_fn: dict[str, dict[str, float]] = {}
        for fn in names:
            scores = SIMILARITY_FUNCTIONS[fn][1](e1, e2)
            refuse_nan_scores(scores, f"BinaryClassificationEvaluator ({fn})", "pair")
            scores = scores.cpu().numpy()
            similar = fn not in DISTANCES
            if not similar:  # a distance, searched smallest first
                scores = -scores
            accuracy, accuracy_threshold = self.find_best_acc_and_threshold(scores, self.labels, similar)
            f1, precision, recall, f1_threshold = self.find_best_f1_and_threshold(scores, self.labels, similar)
            predicted = scores >= f1_threshold if similar else scores <= f1_threshold
            per_fn[fn] = {"accuracy": accuracy, "accuracy_threshold": accuracy_threshold, "f1": f1,
                          "f1_threshold": f1_threshold, "precision": precision, "recall": recall,
                          "ap": average_precision(self.labels, scores if similar else -scores),
                          "mcc": matthews_corrcoef(self.labels, predicted)}
        self.write_results(output_path, ["epoch", "steps", *(f"{fn}_{m}" for fn in names for m in CSV_METRICS)],
                           [epoch, steps, *(per_fn[fn][m] for fn in names for m in CSV_METRICS)])
        metrics = {f"{fn}_{k}": v for fn, values in per_fn.items() for k, v in values.items()}
        if len(names) > 1:
            metrics |= {f"max_{k}": max(values[k] for values in per_fn.values()) for k in per_fn[names[0]]}
        main = "max_ap" if len(names) > 1 else f"{names[0]}_ap"
        self.primary_metric = f"{self.name}_{main}" if self.name else main
        return prefixed(metrics, self.name)
