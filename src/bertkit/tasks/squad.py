"""SQuAD v1.1 / v2.0: read, featurize into sliding windows, post-process logits, evaluate.

Featurization and post-processing follow google-research/bert `run_squad.py` (Devlin et al. 2018,
section 4.2-4.3), except that answers are aligned through the tokenizer's character offsets instead of
run_squad's `_improve_answer_span` / `get_final_text`: the text returned is a slice of the context.

    window   = [CLS] question (<= max_query_length tokens) [SEP] context tokens [SEP]   (<= max_seq_length)
    windows  slide over the context by doc_stride tokens; a token that sits in several windows is
             "max context" only in the window where it has the most context on both sides
             (min(left, right) + 0.01 * window length, first window wins ties): start positions are
             only predicted where that flag is set.
    labels   start/end token of the first gold answer; (0, 0), i.e. [CLS], when the answer is not
             wholly inside the window or the question is unanswerable (v2.0).
"""

from __future__ import annotations

import bisect
import collections
import hashlib
import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bertkit.errors import BertkitError, MissingFileError, NonFiniteError, not_utf8
from bertkit.outputs import atomic_write
from bertkit.tasks.squad_eval import _articles

# ---------------------------------------------------------------- reading


@dataclass(frozen=True)
class SquadAnswer:
    text: str
    start: int  # character offset into the context


@dataclass(frozen=True)
class SquadExample:
    qas_id: str
    title: str
    question: str
    context: str
    answers: tuple[SquadAnswer, ...]  # empty for v2.0 unanswerable questions; several on dev sets
    is_impossible: bool = False


def load_squad(path: str | os.PathLike) -> dict[str, Any]:
    """Load a SQuAD JSON file (``{"version", "data": [articles]}``) as a dict, with readable errors."""
    path = Path(path)
    if not path.is_file():
        raise MissingFileError(f"SQuAD file not found: {path}")
    with open(path, encoding="utf-8-sig") as f:  # a byte-order mark is not JSON, and no part of the data
        try:
            dataset = json.load(f)
        except json.JSONDecodeError as e:
            lines = "; a SQuAD file is one JSON object, not JSON lines" if e.msg == "Extra data" else ""
            raise BertkitError(f"{path} line {e.lineno} column {e.colno}: not valid JSON ({e.msg}){lines}") from None
        except UnicodeDecodeError:
            raise not_utf8(path) from None
    if not isinstance(dataset, dict) or not isinstance(dataset.get("data"), list):
        raise BertkitError(f"{path}: expected a SQuAD JSON object with a 'data' list of articles")
    return dataset


_JSON_KIND = {str: "a string", int: "a whole number", float: "a number", list: "a list", bool: "true or false",
              dict: "an object"}  # what the file's JSON must hold, in JSON's words


def _get(obj: Any, key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if not isinstance(obj, Mapping) or key not in obj:
        raise BertkitError(f"{where}: missing {key!r} (every SQuAD question needs id, question, and a paragraph "
                           "context; see the official format)")
    value = obj[key]
    kinds = (kind,) if isinstance(kind, type) else kind
    # JSON's true/false are Python bools, which isinstance counts as ints: "answer_start": true was read as 1
    if not isinstance(value, kind) or (isinstance(value, bool) and bool not in kinds):
        names = " or ".join(_JSON_KIND.get(k, k.__name__) for k in kinds)
        raise BertkitError(f"{where}: {key!r} must be {names}, got {type(value).__name__} {value!r:.60}")
    return value


def _answers(qa: Mapping[str, Any], key: str, context: str, where: str) -> tuple[SquadAnswer, ...]:
    out = []
    for i, a in enumerate(_get(qa, key, list, where) if key in qa else []):
        text = _get(a, "text", str, f"{where} {key}[{i}]")
        start = _get(a, "answer_start", int, f"{where} {key}[{i}]")
        ans = SquadAnswer(text, start)
        if not text.strip():  # no token to label: it would train to [CLS], an unanswerable question's label
            raise BertkitError(f"{where}: {key}[{i}] has an empty text; an unanswerable question has no answers "
                               '("answers": [], with "is_impossible": true in SQuAD v2.0)')
        if ans.start < 0 or context[ans.start : ans.start + len(ans.text)] != ans.text:  # -9: a slice from the end
            raise BertkitError(
                f"{where}: {key} text {ans.text!r} is not at answer_start {ans.start} of its context; fix the "
                "offset in the JSON"
            )
        out.append(ans)
    return tuple(out)


def squad_examples(dataset: Mapping[str, Any] | Sequence[Mapping[str, Any]], source: str = "SQuAD data"
                   ) -> list[SquadExample]:
    """Flatten articles -> paragraphs -> questions into examples; a wrong ``answer_start`` or a repeated
    question id (a wrong span trained on, a prediction lost) is an error naming where in ``source``."""
    examples = []
    seen: dict[str, str] = {}
    for a_i, article in enumerate(_articles(dataset)):
        title = article.get("title", "") if isinstance(article, Mapping) else ""
        where_a = f"{source} article {a_i} ({title!r})"
        for p_i, paragraph in enumerate(_get(article, "paragraphs", list, where_a)):
            where_p = f"{where_a} paragraph {p_i}"
            context = _get(paragraph, "context", str, where_p)
            for q_i, qa in enumerate(_get(paragraph, "qas", list, where_p)):
                where_q = f"{where_p} question {q_i}"
                qid = _get(qa, "id", str, where_q)
                if qid in seen:
                    raise BertkitError(f"{where_q}: question id {qid!r} is used twice (first at {seen[qid]}); "
                                       "predictions are keyed by id, so one would be lost: make the ids unique")
                seen[qid] = where_q
                answers = _answers(qa, "answers", context, f"{where_p} question {qid}")
                impossible = _get(qa, "is_impossible", bool, where_q) if "is_impossible" in qa else False
                if impossible and answers:  # trained to [CLS] as unanswerable, scored against its answers
                    raise BertkitError(f"{where_p} question {qid}: is_impossible is true, yet it has {len(answers)} "
                                       "answers; an unanswerable question has none (SQuAD v2.0 keeps them as "
                                       "plausible_answers): fix one or the other")
                examples.append(SquadExample(qas_id=qid, title=title, question=_get(qa, "question", str, where_q),
                                             context=context, answers=answers, is_impossible=impossible))
    return examples


def read_squad(path: str | os.PathLike) -> list[SquadExample]:
    return squad_examples(load_squad(path), source=str(path))


def split_squad_articles(
    dataset: Mapping[str, Any] | Sequence[Mapping[str, Any]], heldout_fraction: float = 1 / 6, seed: int = 0
) -> tuple[list[Mapping[str, Any]], list[Mapping[str, Any]]]:
    """Split articles into (train, held-out) by title, for fine-tuning when only a dev file exists.

    By article, so no held-out passage was trained on; deterministic and independent of file order: articles
    ranked by sha256(f"{seed}:{title}"), the first round(n * heldout_fraction) held out. Both lists keep the
    file's order.
    """
    articles = list(_articles(dataset))
    if not 0 < heldout_fraction < 1:
        raise BertkitError(f"heldout_fraction {heldout_fraction} must be strictly between 0 and 1")
    titles = [a["title"] for a in articles]
    dupes = sorted({t for t in titles if titles.count(t) > 1})
    if dupes:
        raise BertkitError(f"article titles must be unique to split by title; repeated: {dupes[:5]}")
    n_heldout = round(len(articles) * heldout_fraction)
    if not 0 < n_heldout < len(articles):
        raise BertkitError(
            f"heldout_fraction {heldout_fraction} of {len(articles)} articles leaves an empty side; "
            "use more articles or another fraction"
        )
    rank = sorted(titles, key=lambda t: hashlib.sha256(f"{seed}:{t}".encode()).hexdigest())
    heldout = set(rank[:n_heldout])
    return [a for a in articles if a["title"] not in heldout], [a for a in articles if a["title"] in heldout]


# ---------------------------------------------------------------- featurization


def _encode_no_specials(tokenizer: Any, text: str) -> tuple[list[int], list[tuple[int, int]]]:
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    return list(enc["input_ids"]), [tuple(o) for o in enc["offset_mapping"]]


def char_span_to_token_span(
    offsets: Sequence[tuple[int, int]], start: int, end: int
) -> tuple[int, int] | None:
    """Token indices (inclusive) of the tokens covering characters [start, end) (a WordPiece cut by an answer
    is taken whole), or None if none do."""
    ends = [e for _, e in offsets]
    starts = [s for s, _ in offsets]
    first = bisect.bisect_right(ends, start)
    last = bisect.bisect_left(starts, end) - 1
    if first >= len(offsets) or last < first:
        return None
    return first, last


def _doc_spans(n_tokens: int, max_tokens: int, doc_stride: int) -> list[tuple[int, int]]:
    """(start, length) windows exactly as run_squad.py: the last window ends at the last token."""
    spans, start = [], 0
    while start < n_tokens:
        length = min(n_tokens - start, max_tokens)
        spans.append((start, length))
        if start + length == n_tokens:
            break
        start += min(length, doc_stride)
    return spans or [(0, 0)]


def _max_context_flags(spans: Sequence[tuple[int, int]]) -> list[list[bool]]:
    """flags[w][j]: is window w the best one for its j-th context token (run_squad's _check_is_max_context)."""
    best: dict[int, int] = {}
    best_score: dict[int, float] = {}
    for w, (start, length) in enumerate(spans):
        for pos in range(start, start + length):
            score = min(pos - start, start + length - 1 - pos) + 0.01 * length
            if pos not in best or score > best_score[pos]:  # strict: the first window wins ties
                best[pos], best_score[pos] = w, score
    return [[best[start + j] == w for j in range(length)] for w, (start, length) in enumerate(spans)]


def _check_windows(max_seq_length: int, doc_stride: int, max_query_length: int) -> None:
    if max_seq_length <= max_query_length + 3:
        raise BertkitError(f"max_seq_length {max_seq_length} must exceed max_query_length {max_query_length} + 3 "
                           "([CLS] and two [SEP]) to leave room for context: lower max_query_length (the "
                           "question-answering pipeline's max_question_length, /predict's max_question_len) or raise "
                           "max_seq_length (the pipeline's max_length, serve's --max-length)")
    if doc_stride < 1:
        raise BertkitError(f"doc_stride {doc_stride} must be at least 1")
    if max_query_length < 1:  # 0 would drop the question, -1 its last token
        raise BertkitError(f"max_query_length {max_query_length} must be at least 1")


def count_windows(question: str, context: str, tokenizer: Any, *, max_seq_length: int, doc_stride: int,
                  max_query_length: int) -> int:
    """How many windows ``featurize_squad`` cuts one question's context into, without building them."""
    _check_windows(max_seq_length, doc_stride, max_query_length)
    q_tokens = min(len(_encode_no_specials(tokenizer, question)[0]), max_query_length)
    return len(_doc_spans(len(_encode_no_specials(tokenizer, context)[0]), max_seq_length - q_tokens - 3,
                          doc_stride))


def stride_for_overlap(question: str, tokenizer: Any, *, max_seq_length: int, max_query_length: int,
                       overlap: int) -> int:
    """The ``doc_stride`` (run_squad.py's step between window starts) whose windows overlap by ``overlap`` context
    tokens, the windows a tokenizer's ``stride`` (and transformers' pipeline's ``doc_stride``) asks for."""
    _check_windows(max_seq_length, 1, max_query_length)
    q_tokens = min(len(_encode_no_specials(tokenizer, question)[0]), max_query_length)
    window = max_seq_length - q_tokens - 3
    if not 0 <= overlap < window:
        raise BertkitError(f"an overlap of {overlap} tokens between windows (doc_stride, as transformers' "
                           f"pipeline means it) must be at least 0 and below the {window} context tokens a window holds for "
                           f"this question (max_length {max_seq_length} - {q_tokens} question tokens - 3)")
    return window - overlap


def featurize_squad(
    examples: Sequence[SquadExample],
    tokenizer: Any,
    max_seq_length: int = 384,
    doc_stride: int = 128,
    max_query_length: int = 64,
) -> list[dict[str, Any]]:
    """Turn examples into unpadded windows: the model inputs and, for post-processing, ``example_index``,
    ``offset_mapping`` (each token's span in the context, None outside it) and ``token_is_max_context``."""
    _check_windows(max_seq_length, doc_stride, max_query_length)
    cls_id, sep_id = tokenizer.cls_token_id, tokenizer.sep_token_id
    # the context's segment: 0 too where the tokenizer's model_input_names leaves token_type_ids out (transformers')
    second = int(getattr(tokenizer, "segments_to_model", True))
    context_cache: dict[str, tuple[list[int], list[tuple[int, int]]]] = {}
    features: list[dict[str, Any]] = []
    for ex_index, ex in enumerate(examples):
        q_ids = _encode_no_specials(tokenizer, ex.question)[0][:max_query_length]
        if ex.context not in context_cache:
            # A paragraph's questions are consecutive (~5 on dev): tokenize each context once, keep one.
            context_cache = {ex.context: _encode_no_specials(tokenizer, ex.context)}
        c_ids, c_offsets = context_cache[ex.context]

        answer_span = None
        if not ex.is_impossible and ex.answers:
            a = ex.answers[0]
            answer_span = char_span_to_token_span(c_offsets, a.start, a.start + len(a.text))
            # Characters the tokenizer drops (no token holds them) were labelled [CLS] in every window: an answerable
            # question trained as unanswerable, as an empty answer would be (run_squad.py labels the word holding them)
            if answer_span is None:
                raise BertkitError(
                    f"question {ex.qas_id!r}: its answer {a.text!r} at character {a.start} covers no token of the "
                    "context (the tokenizer drops its characters: zero-width, control or lone combining ones), so it "
                    "would train as unanswerable; extend the answer to the word that holds it, or remove it")

        max_tokens = max_seq_length - len(q_ids) - 3
        spans = _doc_spans(len(c_ids), max_tokens, doc_stride)
        for (start, length), flags in zip(spans, _max_context_flags(spans), strict=True):
            n_prefix = len(q_ids) + 2  # [CLS] question [SEP]
            input_ids = [cls_id, *q_ids, sep_id, *c_ids[start : start + length], sep_id]
            start_pos = end_pos = 0
            if answer_span is not None and start <= answer_span[0] and answer_span[1] < start + length:
                start_pos, end_pos = answer_span[0] - start + n_prefix, answer_span[1] - start + n_prefix
            features.append(
                {
                    "input_ids": input_ids,
                    "token_type_ids": [0] * n_prefix + [second] * (length + 1),
                    "attention_mask": [1] * len(input_ids),
                    "start_positions": start_pos,
                    "end_positions": end_pos,
                    "example_index": ex_index,
                    "offset_mapping": [None] * n_prefix + list(c_offsets[start : start + length]) + [None],
                    "token_is_max_context": [False] * n_prefix + flags + [False],
                }
            )
    return features


# ---------------------------------------------------------------- post-processing


@dataclass
class SquadPredictions:
    """What run_squad.py writes: predictions.json, nbest_predictions.json, null_odds.json (v2.0)."""

    predictions: dict[str, str]
    nbest: dict[str, list[dict[str, Any]]]
    null_odds: dict[str, float] | None  # v2.0: null score minus best span score, per question
    # Each n-best entry's character span in the context (None for null/"empty"); not written (pipelines read it).
    spans: dict[str, list[tuple[int, int] | None]] = field(default_factory=dict)

    def write(self, output_dir: str | os.PathLike) -> dict[str, Path]:
        """Write the JSON files in the official formats; returns their paths by name."""
        out = Path(output_dir)
        out.mkdir(parents=True, exist_ok=True)
        files = {"predictions": self.predictions, "nbest_predictions": self.nbest}
        if self.null_odds is not None:
            files["null_odds"] = self.null_odds
        paths = {}
        for name, obj in files.items():
            paths[name] = out / f"{name}.json"
            with atomic_write(paths[name]) as f:  # never through a symlink already there
                json.dump(obj, f, indent=4)
                f.write("\n")
        return paths


def _softmax(scores: Sequence[float]) -> list[float]:
    m = max(scores)
    exp = [math.exp(s - m) for s in scores]
    total = sum(exp)
    return [e / total for e in exp]


def postprocess_predictions(
    examples: Sequence[SquadExample],
    features: Sequence[Mapping[str, Any]],
    start_logits: Sequence[Sequence[float]],
    end_logits: Sequence[Sequence[float]],
    n_best_size: int = 20,
    max_answer_length: int = 30,
    version_2_with_negative: bool = False,
    null_score_diff_threshold: float = 0.0,
) -> SquadPredictions:
    """Logits per feature -> answer text per question, as run_squad.py's ``write_predictions``. For v2.0 a
    question is unanswerable when the null score minus the best span's exceeds ``null_score_diff_threshold``.

    ``start_logits[i]`` / ``end_logits[i]`` belong to ``features[i]``; padding past its length is ignored
    (run_squad.py let it take n-best slots).
    """
    if n_best_size < 1 or max_answer_length < 1:  # no span could be kept: every answer would be "empty"
        raise BertkitError(f"n_best_size {n_best_size} and max_answer_length {max_answer_length} must be at least 1")
    by_example = _features_by_example(features, start_logits, end_logits)
    predictions: dict[str, str] = {}
    nbest_json: dict[str, list[dict[str, Any]]] = {}
    null_odds: dict[str, float] | None = {} if version_2_with_negative else None
    spans: dict[str, list[tuple[int, int] | None]] = {}
    for ex_index, ex in enumerate(examples):
        if ex_index not in by_example:
            raise BertkitError(
                f"example {ex_index} ({ex.qas_id}) has no features; pass all the features made from these examples"
            )
        prelim, score_null, null_logits = _candidates(
            [(fi, features[fi], start_logits[fi], end_logits[fi]) for fi in by_example[ex_index]],
            n_best_size, max_answer_length, version_2_with_negative, question=ex.qas_id)
        nbest = _nbest(prelim, ex.context, n_best_size, version_2_with_negative, null_logits)
        probs = _softmax([sl + el for _, sl, el, _ in nbest])
        nbest_json[ex.qas_id] = [
            {"text": t, "probability": p, "start_logit": sl, "end_logit": el}
            for (t, sl, el, _), p in zip(nbest, probs, strict=True)
        ]
        spans[ex.qas_id] = [span for *_, span in nbest]
        if not version_2_with_negative:
            predictions[ex.qas_id] = nbest[0][0]
            continue
        best_non_null = next(entry for entry in nbest if entry[0])
        score_diff = float(score_null - best_non_null[1] - best_non_null[2])
        null_odds[ex.qas_id] = score_diff
        predictions[ex.qas_id] = "" if score_diff > null_score_diff_threshold else best_non_null[0]
    return SquadPredictions(predictions, nbest_json, null_odds, spans)


def _features_by_example(features: Sequence[Mapping[str, Any]], start_logits: Sequence[Sequence[float]],
                         end_logits: Sequence[Sequence[float]]) -> dict[int, list[int]]:
    """The indices of each example's features, once the logits are checked to have one row per feature."""
    if not len(features) == len(start_logits) == len(end_logits):
        raise BertkitError(
            f"{len(features)} features but {len(start_logits)} start and {len(end_logits)} end logit rows; "
            "pass one row per feature, in feature order"
        )
    by_example: dict[int, list[int]] = collections.defaultdict(list)
    for i, f in enumerate(features):
        by_example[f["example_index"]].append(i)
    return by_example


def _candidates(windows: list[tuple[int, Mapping[str, Any], Sequence[float], Sequence[float]]], n_best_size: int,
                max_answer_length: int, with_null: bool, question: Any = None
                ) -> tuple[list[tuple], float, tuple[float, float]]:
    """(candidate spans best first, the null score, its start and end logits) over one question's windows.

    A candidate is (score, start logit, end logit, char start, char end); char start -1 is the null answer,
    whose score is the lowest [CLS] start + end logit over the windows (v2.0 only: ``with_null``)."""
    prelim = []
    score_null, null_logits = math.inf, (0.0, 0.0)
    for fi, f, start_row, end_row in windows:
        n = len(f["input_ids"])
        s_logits = np.asarray(start_row, dtype=np.float64)[:n]
        e_logits = np.asarray(end_row, dtype=np.float64)[:n]
        if s_logits.size < n or e_logits.size < n:
            raise BertkitError(
                f"logits for feature {fi} have {min(s_logits.size, e_logits.size)} values, need {n}"
            )
        if (np.isnan(s_logits) | np.isposinf(s_logits) | np.isnan(e_logits) | np.isposinf(e_logits)).any():
            # NaN at [CLS] left the null score at +inf and answered "" (null odds inf); elsewhere it scrambles the
            # sort. -inf is a masked position, as the QA head masks padding.
            raise NonFiniteError(f"logits for feature {fi} hold NaN or +inf; no answer or score can come of them")
        if with_null and s_logits[0] + e_logits[0] < score_null:
            score_null, null_logits = s_logits[0] + e_logits[0], (float(s_logits[0]), float(e_logits[0]))
        prelim += _window_spans(f, s_logits, e_logits, n_best_size, max_answer_length)
    if prelim and max(p[0] for p in prelim) == -math.inf:
        # -inf at every start (or end) the context offers: every span scores -inf, so the pick is the first position
        # and its probability NaN. A masked position is never a span's end: the model's outputs overflowed
        raise NonFiniteError(f"question {question!r}: its logits (features {[w[0] for w in windows]}) are -inf at "
                             "every start or end the context offers (the model's outputs overflowed), so no answer or score can come of "
                             "them: use a checkpoint whose outputs are finite")
    if with_null and math.isfinite(score_null):
        prelim.append((null_logits[0] + null_logits[1], null_logits[0], null_logits[1], -1, -1))
    prelim.sort(key=lambda p: p[0], reverse=True)
    return prelim, score_null, null_logits


def _window_spans(f: Mapping[str, Any], s_logits: np.ndarray, e_logits: np.ndarray, n_best_size: int,
                  max_answer_length: int) -> list[tuple]:
    """One window's spans among its n_best_size best starts and ends: both ends in the context, the start a
    max-context token, end >= start, at most max_answer_length tokens."""
    # Stable sort, like Python's sorted(..., reverse=True) in run_squad.py: ties keep position order.
    starts = np.argsort(-s_logits, kind="stable")[:n_best_size]
    ends = np.argsort(-e_logits, kind="stable")[:n_best_size]
    offsets, max_ctx = f["offset_mapping"], f["token_is_max_context"]
    spans = []
    for s in starts:
        if offsets[s] is None or not max_ctx[s]:
            continue
        for e in ends:
            if offsets[e] is None or e < s or e - s + 1 > max_answer_length:
                continue
            sl, el = float(s_logits[s]), float(e_logits[e])
            spans.append((sl + el, sl, el, offsets[s][0], offsets[e][1]))
    return spans


def _nbest(prelim: list[tuple], context: str, n_best_size: int, with_null: bool,
           null_logits: tuple[float, float]) -> list[tuple[str, float, float, tuple[int, int] | None]]:
    """(text, start logit, end logit, char span or None) of the n_best_size best distinct answer texts."""
    nbest, seen = [], set()
    for _, sl, el, cs, ce in prelim:
        if len(nbest) >= n_best_size:
            break
        text = "" if cs < 0 else context[cs:ce]
        if text in seen:
            continue
        seen.add(text)
        nbest.append((text, sl, el, None if cs < 0 else (cs, ce)))
    if with_null and "" not in seen:
        nbest.append(("", *null_logits, None))
    # The nonce entries: run_squad.py's keeps the n-best list from being empty; transformers' utils_qa.py's keeps a
    # non-null candidate for v2.0 to compare the null score with (run_squad.py fails there).
    if with_null and len(nbest) == 1:
        nbest.insert(0, ("empty", 0.0, 0.0, None))
    if not nbest:
        nbest.append(("empty", 0.0, 0.0, None))
    return nbest
