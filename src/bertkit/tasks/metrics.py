"""Classification and regression metrics for the GLUE tasks, in plain numpy.

sklearn and scipy are test-only dependencies; `tests/test_glue_data.py` checks every function here against
them. Degenerate inputs follow them rather than raising (an early checkpoint predicting one class must not
crash a run): MCC and F1 are 0.0 where sklearn's are; Pearson/Spearman are NaN for a constant or non-finite
side, and accuracy, F1 and MCC are NaN where a label or prediction is NaN or infinite (sklearn refuses it; counted
as a wrong class it came out an ordinary score: a diverged regression head thresholded, or a NaN label). NaN means
"no score": nothing here turns it into a number.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from bertkit.errors import BertkitError


def _pair(y_true: ArrayLike, y_pred: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    t, p = np.asarray(y_true).ravel(), np.asarray(y_pred).ravel()
    if t.shape != p.shape:
        raise BertkitError(
            f"y_true has {t.size} values but y_pred has {p.size}; pass one prediction per example"
        )
    if t.size == 0:
        raise BertkitError("cannot compute a metric on 0 examples; the evaluation set is empty")
    if _is_text(t) != _is_text(p):  # "1" never equals 1: accuracy would be 0.0
        (name, words), other = (("y_true", t), "y_pred") if _is_text(t) else (("y_pred", p), "y_true")
        raise BertkitError(f"{name} holds strings ({np.unique(words)[:3].tolist()}, ...) and {other} numbers; pass "
                           "both as class indices or both as label names")
    return t, p


def _is_text(a: np.ndarray) -> bool:
    """Whether ``a`` holds strings: a numpy string array, or an object one (a pandas column of names)."""
    return a.dtype.kind in "US" or (a.dtype.kind == "O" and isinstance(a[0], str))


def _nonfinite(t: np.ndarray, p: np.ndarray) -> bool:
    """Whether a class label or prediction is a NaN or an infinity: no class, so no score of classes (NaN never equals
    itself, so it counted as wrong, and ``np.unique`` made it a class of its own)."""
    return any(a.dtype.kind == "f" and not np.isfinite(a).all() for a in (t, p))


def accuracy(y_true: ArrayLike, y_pred: ArrayLike) -> float:
    """Fraction of exact matches (sklearn ``accuracy_score``); NaN where a label or prediction is not finite."""
    t, p = _pair(y_true, y_pred)
    return float("nan") if _nonfinite(t, p) else float(np.mean(t == p))


def f1_binary(y_true: ArrayLike, y_pred: ArrayLike, positive: int = 1) -> float:
    """F1 of the ``positive`` class (sklearn ``f1_score``), as 2·TP / (2·TP + FP + FN): defined where P or R is 0/0.
    Refused, as sklearn refuses it, for more than two classes or two that do not include ``positive`` (the F1 of
    one class against the rest is then a number no reference reports). NaN where a label or prediction is not
    finite."""
    t, p = _pair(y_true, y_pred)
    if _nonfinite(t, p):
        return float("nan")
    classes = np.unique(np.concatenate([t, p])).tolist()
    if len(classes) > 2:
        raise BertkitError(f"f1_binary needs two classes, got {len(classes)} ({classes}); use f1_macro for several")
    if len(classes) == 2 and positive not in classes:
        raise BertkitError(f"positive class {positive!r} is not one of the labels {classes}; pass positive= one of them")
    return _f1_of(t, p, positive)


def _f1_of(t: np.ndarray, p: np.ndarray, positive: Any) -> float:
    tp = np.sum((p == positive) & (t == positive))
    fp = np.sum((p == positive) & (t != positive))
    fn = np.sum((p != positive) & (t == positive))
    denom = 2 * tp + fp + fn
    return float(2 * tp / denom) if denom > 0 else 0.0


def f1_macro(y_true: ArrayLike, y_pred: ArrayLike) -> float:
    """Unweighted mean of the F1 of each class in ``y_true`` or ``y_pred`` (sklearn ``average="macro"``); NaN where a
    label or prediction is not finite."""
    t, p = _pair(y_true, y_pred)
    if _nonfinite(t, p):
        return float("nan")
    return float(np.mean([_f1_of(t, p, k) for k in np.unique(np.concatenate([t, p]))]))


def matthews_corrcoef(y_true: ArrayLike, y_pred: ArrayLike) -> float:
    """Matthews correlation, multi-class form (Gorodkin 2004) as sklearn computes it: CoLA's metric; NaN where a label
    or prediction is not finite."""
    t, p = _pair(y_true, y_pred)
    if _nonfinite(t, p):
        return float("nan")
    classes, idx = np.unique(np.concatenate([t, p]), return_inverse=True)
    k = classes.size
    ti, pi = idx[: t.size], idx[t.size :]
    cm = np.zeros((k, k), dtype=np.float64)
    np.add.at(cm, (ti, pi), 1.0)
    t_sum, p_sum = cm.sum(axis=1), cm.sum(axis=0)
    n_correct, n = np.trace(cm), cm.sum()
    cov_tp = n_correct * n - t_sum @ p_sum
    cov_pp = n * n - p_sum @ p_sum
    cov_tt = n * n - t_sum @ t_sum
    if cov_pp * cov_tt == 0:
        return 0.0
    return float(cov_tp / np.sqrt(cov_tt * cov_pp))


def pearson(x: ArrayLike, y: ArrayLike) -> float:
    """Pearson's r (scipy ``pearsonr(x, y).statistic``); NaN if either input is constant."""
    a, b = _pair(x, y)
    a, b = a.astype(np.float64), b.astype(np.float64)
    if a.size < 2:
        raise BertkitError(f"Pearson correlation needs at least 2 values, got {a.size}")
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        return float("nan")
    am, bm = a - a.mean(), b - b.mean()
    ma, mb = np.abs(am).max(), np.abs(bm).max()
    if ma == 0 or mb == 0:
        return float("nan")
    # Scale by the largest deviation, then normalise, before the dot product (as scipy does): the norm squares
    # the values, which overflows above about 1e154 and underflows to 0 below about 1e-154 (r came out 0.0 or NaN
    # where it is 0.98). np.clip keeps a NaN a NaN (max/min would have turned it into 1.0: a diverged model
    # reported perfect).
    am, bm = am / ma, bm / mb
    return float(np.clip(np.dot(am / np.linalg.norm(am), bm / np.linalg.norm(bm)), -1.0, 1.0))


def rankdata(x: ArrayLike) -> np.ndarray:
    """1-based ranks with ties given their average rank (scipy ``rankdata(method="average")``)."""
    a = np.asarray(x).ravel()
    order = np.argsort(a, kind="mergesort")
    sorted_a = a[order]
    # Start index of each run of equal values in the sorted array.
    new_run = np.concatenate([[True], sorted_a[1:] != sorted_a[:-1]])
    run_id = np.cumsum(new_run) - 1
    starts = np.flatnonzero(new_run)
    ends = np.concatenate([starts[1:], [a.size]])
    avg = (starts + ends + 1) / 2.0  # mean of the 1-based ranks starts+1 .. ends
    ranks = np.empty(a.size, dtype=np.float64)
    ranks[order] = avg[run_id]
    return ranks


def spearman(x: ArrayLike, y: ArrayLike) -> float:
    """Spearman's rho: Pearson on average ranks (scipy ``spearmanr``); NaN if either input is constant or
    not finite (ranks would hide a NaN: it sorts last and gets an ordinary rank)."""
    a, b = _pair(x, y)
    if not (np.isfinite(a.astype(np.float64)).all() and np.isfinite(b.astype(np.float64)).all()):
        return float("nan")
    return pearson(rankdata(a), rankdata(b))


# The official scorers (conlleval, SQuAD's evaluate-v1.1/v2.0) speak in percent; bertkit's reports and logs
# use one unit for every score, the fraction in [0, 1] that GLUE's metrics give.
PERCENT_KEYS = frozenset({"precision", "recall", "f1", "accuracy", "exact_match", "exact", "HasAns_exact",
                          "HasAns_f1", "NoAns_exact", "NoAns_f1", "best_exact", "best_f1"})


def to_fractions(scores: Any) -> Any:
    """A copy of an official scorer's output with every percentage (``PERCENT_KEYS``, nested too) / 100."""
    if isinstance(scores, dict):
        return {k: (v / 100.0 if k in PERCENT_KEYS and isinstance(v, (int, float)) else to_fractions(v))
                for k, v in scores.items()}
    return scores
