"""SQuAD v1.1 / v2.0 scoring: the official ``evaluate-v1.1.py`` and ``evaluate-v2.0.py`` line for line (their
function names kept), so scores here are the leaderboard's.
"""

from __future__ import annotations

import collections
import math
import re
import string
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from bertkit.errors import BertkitError


def _articles(dataset: Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> Sequence[Mapping[str, Any]]:
    """Accept either the whole JSON object or its ``data`` list, as the official scripts use the latter."""
    return dataset["data"] if isinstance(dataset, Mapping) else dataset


def normalize_answer(s: str) -> str:
    """Lower text and remove punctuation, articles and extra whitespace (the official scripts' rule)."""
    s = s.lower()
    exclude = set(string.punctuation)
    s = "".join(ch for ch in s if ch not in exclude)
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


def f1_score_v1(prediction: str, ground_truth: str) -> float:
    """evaluate-v1.1.py ``f1_score``: v2.0's token-bag F1, except that two empty answers score 0 (v2.0: 1)."""
    return compute_f1(ground_truth, prediction) if _get_tokens(prediction) else 0


def exact_match_v1(prediction: str, ground_truth: str) -> bool:
    return bool(compute_exact(ground_truth, prediction))


def evaluate_v1(
    dataset: Mapping[str, Any] | Sequence[Mapping[str, Any]], predictions: Mapping[str, str]
) -> dict[str, float]:
    """evaluate-v1.1.py: {"exact_match", "f1"} in percent over all questions; a missing one scores 0 (warned)."""
    f1 = exact_match = total = 0.0
    missing = []
    for article in _articles(dataset):
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                total += 1
                if qa["id"] not in predictions:
                    missing.append(qa["id"])
                    continue
                golds = [a["text"] for a in qa.get("answers", [])]
                if not golds:  # max() over no gold answers: the official script's bare ValueError
                    raise BertkitError(f"question {qa['id']!r} has no gold answers, which SQuAD v1.1 questions all "
                                       "have; score a v2.0 file (unanswerable questions) with evaluate_v2")
                pred = predictions[qa["id"]]
                exact_match += max(exact_match_v1(pred, g) for g in golds)
                f1 += max(f1_score_v1(pred, g) for g in golds)
    if missing:
        warnings.warn(
            f"{len(missing)} unanswered questions receive score 0, e.g. {missing[:3]}", stacklevel=2
        )
    if total == 0:
        raise BertkitError("the dataset has no questions")
    return {"exact_match": 100.0 * exact_match / total, "f1": 100.0 * f1 / total}


def _get_tokens(s: str) -> list[str]:
    return normalize_answer(s).split() if s else []


def compute_exact(a_gold: str, a_pred: str) -> int:
    """evaluate-v2.0.py ``compute_exact``."""
    return int(normalize_answer(a_gold) == normalize_answer(a_pred))


def compute_f1(a_gold: str, a_pred: str) -> float:
    """evaluate-v2.0.py ``compute_f1``: if either side is no-answer, 1 when both are, else 0."""
    gold_toks, pred_toks = _get_tokens(a_gold), _get_tokens(a_pred)
    if len(gold_toks) == 0 or len(pred_toks) == 0:
        return int(gold_toks == pred_toks)
    num_same = sum((collections.Counter(gold_toks) & collections.Counter(pred_toks)).values())
    if num_same == 0:
        return 0
    precision, recall = num_same / len(pred_toks), num_same / len(gold_toks)
    return 2 * precision * recall / (precision + recall)


def find_best_thresh(
    preds: Mapping[str, str],
    scores: Mapping[str, float],
    na_probs: Mapping[str, float],
    qid_to_has_ans: Mapping[str, bool],
) -> tuple[float, float]:
    """evaluate-v2.0.py: (the best score in percent, the no-answer threshold giving it), switching questions
    from "no answer" to their prediction in order of increasing na_prob."""
    cur_score = best_score = sum(1 for k in qid_to_has_ans if not qid_to_has_ans[k])
    best_thresh = 0.0
    for qid in sorted(na_probs, key=lambda k: na_probs[k]):
        if qid not in scores:
            continue
        if qid_to_has_ans[qid]:
            diff = scores[qid]
        else:
            diff = -1 if preds[qid] else 0
        cur_score += diff
        if cur_score > best_score:
            best_score, best_thresh = cur_score, na_probs[qid]
    return 100.0 * best_score / len(scores), best_thresh


def evaluate_v2(
    dataset: Mapping[str, Any] | Sequence[Mapping[str, Any]],
    predictions: Mapping[str, str],
    na_probs: Mapping[str, float] | None = None,
    na_prob_thresh: float = 1.0,
) -> dict[str, float]:
    """evaluate-v2.0.py: exact/f1/total with HasAns_* / NoAns_* (percent) and, given ``na_probs``, best_exact /
    best_f1 with their thresholds. A missing prediction is an error (the official script's KeyError)."""
    articles = _articles(dataset)
    # An unanswerable question may come without an "answers" list (``"is_impossible": true`` alone), as
    # ``squad_examples`` reads it: no gold answer, where the official script stops with a KeyError.
    qid_to_has_ans = {
        qa["id"]: bool(qa.get("answers")) for a in articles for p in a["paragraphs"] for qa in p["qas"]
    }
    if not qid_to_has_ans:
        raise BertkitError("the dataset has no questions")
    missing = [q for q in qid_to_has_ans if q not in predictions]
    if missing:
        raise BertkitError(
            f"{len(missing)} questions have no prediction, e.g. {missing[:3]}; predict every question"
        )
    exact_raw, f1_raw = _raw_scores(articles, predictions)
    probs = dict(na_probs) if na_probs is not None else {k: 0.0 for k in predictions}
    missing = [q for q in qid_to_has_ans if q not in probs]
    if missing:
        raise BertkitError(
            f"{len(missing)} questions have no na_prob, e.g. {missing[:3]}; give one per question"
        )
    nan = [q for q in qid_to_has_ans if math.isnan(probs[q])]  # NaN sorts anywhere, and is never above a threshold
    if nan:
        raise BertkitError(f"{len(nan)} questions have a NaN na_prob, e.g. {nan[:3]}; give each a number")
    exact = _apply_no_ans_threshold(exact_raw, probs, qid_to_has_ans, na_prob_thresh)
    f1 = _apply_no_ans_threshold(f1_raw, probs, qid_to_has_ans, na_prob_thresh)
    out = _make_eval_dict(exact, f1, list(exact))
    for prefix, want in (("HasAns", True), ("NoAns", False)):
        qids = [q for q, has in qid_to_has_ans.items() if has == want]
        if qids:
            out.update({f"{prefix}_{k}": v for k, v in _make_eval_dict(exact, f1, qids).items()})
    if na_probs is not None:
        out["best_exact"], out["best_exact_thresh"] = find_best_thresh(
            predictions, exact_raw, probs, qid_to_has_ans
        )
        out["best_f1"], out["best_f1_thresh"] = find_best_thresh(predictions, f1_raw, probs, qid_to_has_ans)
    return out


def _raw_scores(
    articles: Sequence[Mapping[str, Any]], predictions: Mapping[str, str]
) -> tuple[dict[str, int], dict[str, float]]:
    """evaluate-v2.0.py ``get_raw_scores``: each question's exact and F1, the best over its gold answers (an
    unanswerable question's only gold answer is "")."""
    exact_raw, f1_raw = {}, {}
    for article in articles:
        for p in article["paragraphs"]:
            for qa in p["qas"]:
                golds = [a["text"] for a in qa.get("answers", []) if normalize_answer(a["text"])] or [""]
                pred = predictions[qa["id"]]
                exact_raw[qa["id"]] = max(compute_exact(g, pred) for g in golds)
                f1_raw[qa["id"]] = max(compute_f1(g, pred) for g in golds)
    return exact_raw, f1_raw


def _apply_no_ans_threshold(
    scores: Mapping[str, float], na_probs: Mapping[str, float], qid_to_has_ans: Mapping[str, bool], thresh: float
) -> dict[str, float]:
    """evaluate-v2.0.py ``apply_no_ans_threshold``: a question whose na_prob exceeds ``thresh`` is answered
    "no answer", right exactly when it has none."""
    return {q: float(not qid_to_has_ans[q]) if na_probs[q] > thresh else s for q, s in scores.items()}


def _make_eval_dict(exact: Mapping[str, float], f1: Mapping[str, float], qids: Sequence[str]) -> dict[str, float]:
    """evaluate-v2.0.py ``make_eval_dict``: exact and f1 in percent over ``qids``, and their count."""
    return {
        "exact": 100.0 * sum(exact[q] for q in qids) / len(qids),
        "f1": 100.0 * sum(f1[q] for q in qids) / len(qids),
        "total": len(qids),
    }
