"""Randomized differential test of the task metrics and SQuAD post-processing against their references, seeded.

- GLUE metrics against scikit-learn and scipy: labels as ints or names, one class, constant or perfect predictions,
  ties; scores constant, tied, near the float range's ends, with a NaN or an infinity.
- ``ner.conlleval`` against seqeval's default mode (conlleval's rules) on random IOB1/IOB2 tags, ill-formed ones
  included (I- after O, I-X after B-Y), per type too; and against its strict mode on IOB1 read through
  ``iob1_to_iob2``. IOBES tags, which conlleval miscounts, are refused.
- ``squad_eval`` against the official evaluate-v1.1.py / evaluate-v2.0.py semantics, re-derived below (unicode and
  punctuation answers, articles, empty and duplicated gold answers, na_probs with ties and infinities, thresholds).
- ``squad.postprocess_predictions`` against transformers' run_qa post-processing (utils_qa.py's
  ``postprocess_qa_predictions``, re-derived below) on real dev contexts cut into several windows and drawn logits,
  and the v2.0 scores of predictions answered at a null threshold against those of the predictions alone.

Slow: about 20 s (the post-processing part needs the example checkpoint's tokenizer and the shared SQuAD dev file).
"""

from __future__ import annotations

import collections
import math
import random
import re
import string
import warnings

import numpy as np
import pytest

from bertkit.errors import BertkitError
from bertkit.tasks import metrics, ner, squad, squad_eval
from bertkit.tasks.metrics import to_fractions
from bertkit.tokenization import BertTokenizer
from bertkit.training import token_tasks as tt

pytestmark = pytest.mark.slow


def _outcome(fn, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    except (ValueError, TypeError) as e:
        return e


def _same(ours, ref, tol=1e-9) -> bool:
    if isinstance(ref, Exception):
        return isinstance(ours, Exception)
    if isinstance(ours, Exception):
        return False
    return (math.isnan(ref) and math.isnan(ours)) or ours == ref or abs(ours - ref) <= tol


# ---------------------------------------------------------------- GLUE metrics


def _labels(rng: np.random.Generator):
    n, k = int(rng.choice([1, 2, 3, 20, 200])), int(rng.choice([1, 2, 3, 5]))
    t = rng.integers(0, k, n)
    p = [np.full(n, rng.integers(0, k)), t.copy(), 1 - t if k == 2 else t[::-1].copy(), rng.integers(0, k + 1, n),
         rng.integers(0, k, n)][int(rng.integers(0, 5))]
    return (t.astype(str), p.astype(str)) if rng.random() < 0.2 else (t, p)


def _scores(rng: np.random.Generator):
    n = int(rng.choice([2, 3, 30, 300]))
    x = rng.uniform(0, 5, n)
    y = [np.full(n, 2.5), np.round(rng.uniform(0, 5, n) * 2) / 2, x * 1e200, x * 1e-200, np.round(x),
         (x + rng.normal(0, 1, n)).astype(np.float32), x + rng.normal(0, 1, n)][int(rng.integers(0, 7))]
    if rng.random() < 0.15:
        y = y.astype(np.float64)
        y[rng.integers(n)] = rng.choice([np.nan, np.inf])
    return (y, x) if rng.random() < 0.5 else (x, y)


def test_glue_metrics_match_sklearn_and_scipy():
    skm = pytest.importorskip("sklearn.metrics")
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(0)
    warnings.simplefilter("ignore")  # sklearn's and scipy's warnings on degenerate inputs
    for _ in range(400):
        t, p = _labels(rng)
        pos = "1" if t.dtype.kind == "U" else 1
        pairs = [(metrics.accuracy, skm.accuracy_score, {}), (metrics.matthews_corrcoef, skm.matthews_corrcoef, {}),
                 (metrics.f1_macro, skm.f1_score, {"average": "macro", "zero_division": 0})]
        for ours, ref, kw in pairs:
            assert _same(_outcome(ours, t, p), _outcome(ref, t, p, **kw)), (ours.__name__, t, p)
        ours = _outcome(metrics.f1_binary, t, p, positive=pos)
        assert _same(ours, _outcome(skm.f1_score, t, p, pos_label=pos, zero_division=0)), (t, p)
    for _ in range(400):
        x, y = _scores(rng)
        assert _same(metrics.pearson(x, y), float(stats.pearsonr(x, y)[0])), (x, y)
        # Spearman: NaN where a side is not finite (scipy ranks an infinity as a number), as documented
        ref = float(stats.spearmanr(x, y)[0]) if np.isfinite(x).all() and np.isfinite(y).all() else math.nan
        assert _same(metrics.spearman(x, y), ref), (x, y)


# ---------------------------------------------------------------- conlleval

TYPES = ["PER", "LOC", "ORG-X", "MISC"]


def _seqeval(gold, pred, **kw):
    sm = pytest.importorskip("seqeval.metrics")
    report = sm.classification_report(gold, pred, output_dict=True, zero_division=0, **kw)
    per_type = {k: v for k, v in report.items() if k not in ("micro avg", "macro avg", "weighted avg")}
    return ([100 * f(gold, pred, zero_division=0, **kw) for f in (sm.precision_score, sm.recall_score, sm.f1_score)]
            + [100 * sm.accuracy_score(gold, pred)], per_type)


def _iob1(tags: list[str]) -> list[str]:
    """IOB2 -> IOB1: B- only after an entity of the same type."""
    return [f"I-{t[2:]}" if t.startswith("B-") and (i == 0 or tags[i - 1][2:] != t[2:]) else t
            for i, t in enumerate(tags)]


def _entities(rng: random.Random, n: int) -> list[str]:
    out: list[str] = []
    while len(out) < n:
        kind = rng.choice(TYPES)
        out += ["O"] if rng.random() < 0.5 else [f"{'I' if j else 'B'}-{kind}" for j in range(rng.randint(1, 3))]
    return out[:n]


def test_conlleval_matches_seqeval():
    pytest.importorskip("seqeval")
    from seqeval.scheme import IOB1

    rng = random.Random(1)
    warnings.simplefilter("ignore")
    any_tag = ["O"] * 3 + [f"{p}-{t}" for p in "BI" for t in TYPES]
    for _ in range(1200):
        gold = [[rng.choice(any_tag) for _ in range(rng.randint(1, 12))] for _ in range(rng.randint(1, 8))]
        pred = [[rng.choice(any_tag) if rng.random() < rng.random() else t for t in s] for s in gold]
        if rng.random() < 0.1:
            pred = [["O"] * len(s) for s in gold]
        ours = ner.conlleval(gold, pred)
        overall, per_type = _seqeval(gold, pred)
        assert [ours[k] for k in ("precision", "recall", "f1", "accuracy")] == pytest.approx(overall, abs=1e-9)
        assert sorted(per_type) == sorted(ours["per_type"])
        for kind, ref in per_type.items():
            got = ours["per_type"][kind]
            assert [got["precision"], got["recall"], got["f1"], got["found_gold"]] == pytest.approx(
                [100 * ref["precision"], 100 * ref["recall"], 100 * ref["f1-score"], ref["support"]], abs=1e-9)
    for _ in range(300):  # well-formed IOB1, read as read_conll(tag_scheme="iob1") reads it: seqeval's strict IOB1
        gold = [_entities(rng, rng.randint(1, 12)) for _ in range(rng.randint(1, 6))]
        pred = [_entities(rng, len(s)) if rng.random() < 0.5 else s for s in gold]
        g1, p1 = [_iob1(s) for s in gold], [_iob1(s) for s in pred]
        assert [ner.iob1_to_iob2(s) for s in g1] == gold
        strict = _seqeval(g1, p1, mode="strict", scheme=IOB1)[0][2]
        assert ner.conlleval([ner.iob1_to_iob2(s) for s in g1], [ner.iob1_to_iob2(s) for s in p1])["f1"] == (
            pytest.approx(strict, abs=1e-9))
        assert ner.conlleval(g1, p1)["f1"] == pytest.approx(strict, abs=1e-9)
    for tag in ("S-PER", "E-LOC", "B-", "X"):  # IOBES (conlleval miscounts it) and no tag at all: refused
        with pytest.raises(BertkitError, match=f"tag '{tag}' is not O, B-TYPE or I-TYPE"):
            ner.conlleval([["O", tag]], [["O", "O"]])


# ---------------------------------------------------------------- SQuAD scoring, re-derived


def _norm(s: str) -> str:
    s = "".join(ch for ch in s.lower() if ch not in set(string.punctuation))
    return " ".join(re.sub(r"\b(a|an|the)\b", " ", s).split())


def _f1(gold: str, pred: str, *, v1: bool = False) -> float:
    g, p = _norm(gold).split(), _norm(pred).split()
    if not v1 and (not g or not p):
        return float(g == p)
    same = sum((collections.Counter(g) & collections.Counter(p)).values())
    return 0.0 if same == 0 else 2 * same / (len(p) + len(g))


def _official_v1(data, preds):
    em = f1 = total = 0
    for qa in (qa for a in data for p in a["paragraphs"] for qa in p["qas"]):
        total += 1
        if qa["id"] in preds:
            golds = [a["text"] for a in qa["answers"]]
            em += max(_norm(preds[qa["id"]]) == _norm(g) for g in golds)
            f1 += max(_f1(g, preds[qa["id"]], v1=True) for g in golds)
    return {"exact_match": 100.0 * em / total, "f1": 100.0 * f1 / total}


def _official_v2(data, preds, na_probs=None, thresh=1.0):
    qas = [qa for a in data for p in a["paragraphs"] for qa in p["qas"]]
    has = {qa["id"]: bool(qa["answers"]) for qa in qas}
    probs = na_probs if na_probs is not None else dict.fromkeys(preds, 0.0)
    raw = {"exact": {}, "f1": {}}
    for qa in qas:
        golds = [a["text"] for a in qa["answers"] if _norm(a["text"])] or [""]
        raw["exact"][qa["id"]] = max(float(_norm(g) == _norm(preds[qa["id"]])) for g in golds)
        raw["f1"][qa["id"]] = max(_f1(g, preds[qa["id"]]) for g in golds)
    scored = {k: {q: float(not has[q]) if probs[q] > thresh else s for q, s in v.items()} for k, v in raw.items()}

    def over(ids):
        return {"exact": 100.0 * sum(scored["exact"][q] for q in ids) / len(ids),
                "f1": 100.0 * sum(scored["f1"][q] for q in ids) / len(ids), "total": len(ids)}

    out = over(list(has))
    for prefix, want in (("HasAns", True), ("NoAns", False)):
        ids = [q for q in has if has[q] == want]
        if ids:
            out.update({f"{prefix}_{k}": v for k, v in over(ids).items()})
    if na_probs is not None:
        for name, scores in raw.items():
            cur = best = sum(not h for h in has.values())
            best_thresh = 0.0
            for q in sorted(probs, key=lambda k: probs[k]):
                cur += scores[q] if has[q] else (-1 if preds[q] else 0)
                if cur > best:
                    best, best_thresh = cur, probs[q]
            out[f"best_{name}"], out[f"best_{name}_thresh"] = 100.0 * best / len(scores), best_thresh
    return out


WORDS = ["the", "The", "a", "An", "Paris", "paris,", "1,000", "café", "CAFÉ", "naïve", "(b)", "—", "'s", "U.S.",
         "“quoted”", "", " ", "theatre", "anthe", "日本", "ß", "İstanbul", "¿qué?", "...", "a-b", "a_b", "\u00a0"]


def _phrase(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(0, 5))) + rng.choice(["", ".", " "])


def _squad_data(rng: random.Random):
    data, preds, na = [], {}, {}
    for a in range(rng.randint(1, 3)):
        paragraphs = []
        for _ in range(rng.randint(1, 3)):
            qas = []
            for _ in range(rng.randint(1, 4)):
                qid = f"q{len(preds)}"
                answers = [] if rng.random() < 0.3 else [{"text": _phrase(rng), "answer_start": 0}
                                                         for _ in range(rng.randint(1, 3))]
                answers += [dict(answers[0])] if answers and rng.random() < 0.2 else []
                qas.append({"id": qid, "question": "?", "answers": answers})
                r = rng.random()
                preds[qid] = "" if r < 0.3 else answers[0]["text"] if answers and r < 0.5 else _phrase(rng)
                na[qid] = rng.choice([0.0, 0.5, 1.0, -1.0, 2.0, rng.uniform(-3, 3), -math.inf, math.inf])
            paragraphs.append({"context": "c", "qas": qas})
        data.append({"title": str(a), "paragraphs": paragraphs})
    return data, preds, na


def _assert_scores(ours: dict, ref: dict) -> None:
    assert sorted(ours) == sorted(ref)
    for k, v in ref.items():
        assert ours[k] == v or abs(ours[k] - v) <= 1e-9, (k, ours[k], v)


def test_squad_scores_match_the_official_scripts():
    rng = random.Random(2)
    for _ in range(1200):
        data, preds, na = _squad_data(rng)
        thresh = rng.choice([1.0, 0.0, 0.5, -1.0])
        _assert_scores(squad_eval.evaluate_v2(data, preds, na_probs=na, na_prob_thresh=thresh),
                       _official_v2(data, preds, na, thresh))
        _assert_scores(squad_eval.evaluate_v2(data, preds), _official_v2(data, preds))
        v1 = [{**a, "paragraphs": [{**p, "qas": [q for q in p["qas"] if q["answers"]]} for p in a["paragraphs"]]}
              for a in data]
        if any(p["qas"] for a in v1 for p in a["paragraphs"]):
            some = {k: v for k, v in preds.items() if rng.random() < 0.9}
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the unanswered questions' warning
                _assert_scores(squad_eval.evaluate_v1(v1, some), _official_v1(v1, some))


# ---------------------------------------------------------------- SQuAD post-processing, re-derived


def _run_qa_postprocess(examples, features, starts, ends, *, v2, n_best, max_len, threshold):
    """utils_qa.py's postprocess_qa_predictions: (predictions, null odds, best n-best entry per question)."""
    by_example = collections.defaultdict(list)
    for i, f in enumerate(features):
        by_example[f["example_index"]].append(i)
    preds, odds, best = {}, {}, {}
    for ei, ex in enumerate(examples):
        null, prelim = None, []
        for fi in by_example[ei]:
            s, e, offsets = starts[fi], ends[fi], features[fi]["offset_mapping"]
            max_ctx = features[fi]["token_is_max_context"]
            if null is None or null["score"] > s[0] + e[0]:
                null = {"offsets": (0, 0), "score": s[0] + e[0], "start_logit": s[0], "end_logit": e[0]}
            for a in np.argsort(s)[-1 : -n_best - 1 : -1].tolist():
                for b in np.argsort(e)[-1 : -n_best - 1 : -1].tolist():
                    if a >= len(offsets) or b >= len(offsets) or offsets[a] is None or offsets[b] is None:
                        continue
                    if b < a or b - a + 1 > max_len or not max_ctx[a]:
                        continue
                    prelim.append({"offsets": (offsets[a][0], offsets[b][1]), "score": s[a] + e[b],
                                   "start_logit": s[a], "end_logit": e[b]})
        if v2:
            prelim.append(null)
        top = sorted(prelim, key=lambda x: x["score"], reverse=True)[:n_best]
        if v2 and not any(x["offsets"] == (0, 0) for x in top):
            top.append(null)
        for x in top:
            x["text"] = ex.context[x["offsets"][0] : x["offsets"][1]]
        if not top or (len(top) == 1 and top[0]["text"] == ""):
            top.insert(0, {"text": "empty", "start_logit": 0.0, "end_logit": 0.0})
        best[ex.qas_id] = top[0]
        if not v2:
            preds[ex.qas_id] = top[0]["text"]
            continue
        answer = next(x for x in top if x["text"])
        odds[ex.qas_id] = float(null["score"] - answer["start_logit"] - answer["end_logit"])
        preds[ex.qas_id] = "" if odds[ex.qas_id] > threshold else answer["text"]
    return preds, odds, best


def _logits(rng: np.random.Generator, n: int, pad: int) -> np.ndarray:
    scale = float(rng.choice([1e-3, 1.0, 3.0, 30.0]))
    row = rng.normal(0, scale, (2, n + pad))
    row[:, 0] += float(rng.choice([0.0, 3 * scale]))  # a confident [CLS] now and then
    row[:, n:] = -1e4  # padding, which post-processing ignores
    return row


def test_squad_postprocessing_matches_run_qa_and_scores_its_predictions(minilm_dir, data_dir):
    tok = BertTokenizer.from_pretrained(minilm_dir)
    examples = squad.read_squad(data_dir / "squad" / "dev-v1.1.json")
    rng = np.random.default_rng(3)
    for _ in range(600):
        k = int(rng.integers(1, 4))
        start = int(rng.integers(0, len(examples) - k))
        batch = examples[start : start + k]
        features = squad.featurize_squad(batch, tok, max_seq_length=int(rng.choice([72, 128, 384])),
                                         doc_stride=int(rng.choice([8, 32, 128])),
                                         max_query_length=int(rng.choice([8, 16, 64])))
        pad = int(rng.choice([0, 5]))
        rows = [_logits(rng, len(f["input_ids"]), pad) for f in features]
        v2 = bool(rng.random() < 0.5)
        kw = {"n_best": int(rng.choice([1, 2, 5, 20])), "max_len": int(rng.choice([1, 3, 30])),
              "threshold": float(rng.choice([-1.0, 0.0, 1.5, 3.0]))}
        ours = squad.postprocess_predictions(batch, features, [r[0] for r in rows], [r[1] for r in rows],
                                             n_best_size=kw["n_best"], max_answer_length=kw["max_len"],
                                             version_2_with_negative=v2, null_score_diff_threshold=kw["threshold"])
        preds, odds, best = _run_qa_postprocess(batch, features, [r[0] for r in rows], [r[1] for r in rows], v2=v2,
                                                **kw)
        assert ours.predictions == preds
        assert ours.null_odds == (pytest.approx(odds, abs=1e-9) if v2 else None)
        for qid, entry in best.items():
            top = ours.nbest[qid][0]
            assert (top["text"], top["start_logit"], top["end_logit"]) == (
                entry["text"], entry["start_logit"], entry["end_logit"])
        if v2:  # the report's scores are those of predictions.json, at whatever threshold it was answered
            articles = [{"title": "t", "paragraphs": [{"context": e.context, "qas": [
                {"id": e.qas_id, "answers": [] if rng.random() < 0.3 else [{"text": a.text} for a in e.answers]}]}
                for e in batch]}]  # fmt: skip
            scores = tt.official_scores("2.0", articles, ours, kw["threshold"])
            alone = to_fractions(_official_v2(articles, ours.predictions))
            assert {k: scores[k] for k in alone} == pytest.approx(alone, abs=1e-12)
