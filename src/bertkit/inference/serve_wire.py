"""The wire format of ``bertkit serve``: what a route is (``Route``), what one request may be and cost
(``Limits``), and the Inference API's /predict and TEI's /similarity, which share a body."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bertkit.errors import BertkitError
from bertkit.settings.inference import RequestLimits

EMBEDDING_TASKS = ("feature-extraction", "sentence-embedding")
_EMBED_FIELDS = ("normalize", "truncate", "truncation_direction", "prompt_name", "dimensions", "encoding_format")
# Fields a body may hold besides inputs and parameters: TEI's, which InferenceClient also sends at the top
# level for feature-extraction. On a text-classification body they select TEI's answer.
_TEI_FIELDS = {"text-classification": ("raw_scores", "truncate", "truncation_direction"),
               **{t: _EMBED_FIELDS for t in EMBEDDING_TASKS}}
# Inference API parameters besides the pipeline's call options: they shape the answer, so requests share a batch.
_ANSWER_PARAMS = {"text-classification": ("top_k", "function_to_apply"),
                  "token-classification": ("aggregation_strategy", "ignore_labels"),
                  "question-answering": ("align_to_words", "max_seq_len"),
                  **{t: _EMBED_FIELDS for t in EMBEDDING_TASKS}}
# Inference API parameter names that bertkit's pipelines spell differently: the wire takes the Inference API's.
_RENAMED = {"question-answering": {"max_answer_len": "max_answer_length", "max_question_len": "max_question_length",
                                   "handle_impossible_answer": "allow_no_answer"}}


class RequestError(Exception):
    """A request the server refuses: an HTTP status, a message for the client, and headers (Retry-After)."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}


class Limits(RequestLimits):
    """``RequestLimits`` (``bertkit serve``'s flags) with the refusals the routes share."""

    @classmethod
    def from_settings(cls, settings: Any) -> Limits:
        return cls(**{f.name: getattr(settings, f.name) for f in dataclasses.fields(RequestLimits)})

    def check_items(self, n: int, name: str = "inputs") -> None:
        if n > self.max_items:
            raise RequestError(422, f"{n} {name} exceed max_items {self.max_items} per request")

    def check_chars(self, n: int, what: str) -> None:
        if n > self.max_text_chars:
            raise RequestError(422, f"{what} has {n} characters, over max_text_chars {self.max_text_chars}")


def _chars(item: Any) -> int:
    if isinstance(item, str):
        return len(item)
    if isinstance(item, dict):
        return sum(_chars(v) for v in item.values())
    if isinstance(item, (list, tuple)):
        return sum(_chars(v) for v in item)
    return 0


@dataclass
class Call:
    """A parsed request: the inputs (rows already encoded where option ``rows`` is set), the call's options (they
    split batches), the options that shape the answer, and what it costs."""

    items: list[Any]
    options: dict[str, Any]
    answer: dict[str, Any]
    single: bool = False
    tei: bool = False
    cost: int = 0  # model sequences: QA windows, [MASK]s, one per other input
    tokens: list[int] = field(default_factory=list)  # each model sequence's tokens, where counted
    chars: int = 0


@dataclass(frozen=True)
class Route:
    """One route (``serve.ROUTES`` lists them): its path, its help line (CLI help, OpenAPI page), and for a POST how a
    body becomes a ``Call`` (on the parser thread) and the model's outputs its answer (``model`` False: answered from
    the tokenizer alone); a GET answers from the server."""

    path: str
    help: str
    parse: Callable[[Any, Any, Limits], Call] | None = None
    render: Callable[[Any, Call, list[Any]], Any] | None = None
    get: Callable[[Any], Any] | None = None
    model: bool = True

    @property
    def method(self) -> str:
        return "GET" if self.get else "POST"


# ``_ROWS``' inputs are encoded while parsing and the model's outputs rendered by the route; the others run through
# the pipeline. ``_ONE_SEQUENCE``'s tokens are counted while parsing (other sequences count as max_length).
_ROWS = ("text-classification", *EMBEDDING_TASKS)
_ONE_SEQUENCE = (*_ROWS, "token-classification", "fill-mask")


def json_depth(value: Any) -> int:
    """How deeply the lists and objects of a parsed JSON value nest."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, (list, dict)):
            deepest = max(deepest, depth)
            stack.extend((x, depth + 1) for x in (v.values() if isinstance(v, dict) else v))
    return deepest


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:  # json.loads would keep the last one silently
            raise RequestError(400, f"the body is not valid: an object holds the key {key!r} twice")
        out[key] = value
    return out


def _constant(name: str) -> Any:
    raise RequestError(400, f"the body is not valid JSON: {name} is not a JSON number")


def _integer(text: str) -> int:
    # Python refuses an integer of over 4,300 digits from inside json (a 500), and one without that limit takes
    # quadratic time on it: refused here, before int() sees it.
    if len(text) > 4300:
        raise RequestError(400, f"the body is not valid: a number of {len(text.lstrip('-'))} digits "
                                f"({text[:20]}...); no field takes an integer that large")
    return int(text)


def load_json(body: bytes, limits: Limits) -> Any:
    """The body's JSON: strict (no key twice, no NaN), and nested at most max_json_depth deep."""
    try:
        data = json.loads(body, object_pairs_hook=_object, parse_constant=_constant, parse_int=_integer)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RequestError(400, f"the body is not valid JSON: {e}") from None
    except RecursionError:  # Python's parser recurses once per level and gives up near 1,000
        depth = "about 1,000 or more"
    else:
        depth = json_depth(data)
        if depth <= limits.max_json_depth:
            return data
    raise RequestError(413, f"the body nests lists and objects {depth} deep, over max_json_depth "
                            f"{limits.max_json_depth}")


def _default(method: Callable[..., Any], name: str) -> Any:  # written once, in the pipeline's signature
    return inspect.signature(method).parameters[name].default


def _parameter_checks(pipe: Any, limits: Limits) -> dict[str, tuple[Callable[[Any], bool], str]]:
    """Every parameter a route takes, with the test its value must pass and the words that say what it must be."""
    n = pipe.max_length

    def int_in(lo: int, hi: int, why: str = "") -> tuple[Callable[[Any], bool], str]:
        return (lambda v: type(v) is int and lo <= v <= hi), f"an int in [{lo}, {hi}]{why}"  # a bool is no int

    top_k = limits.max_top_k
    if pipe.task == "fill-mask" and len(pipe.tokenizer) < top_k:
        top_k_check = int_in(1, len(pipe.tokenizer), " (the vocabulary's size)")
    else:
        top_k_check = int_in(1, top_k, " (max_top_k)")
    labels = None
    if pipe.task == "token-classification" and getattr(pipe.config, "id2label", None):
        tags = list(pipe.config.id2label.values())
        labels = {"O", *tags, *(t.split("-", 1)[1] if len(t) > 2 and t[1] in "-_" else t for t in tags)}
    return {
        "top_k": top_k_check,
        "function_to_apply": (lambda v: v in ("softmax", "sigmoid", "none"), '"softmax", "sigmoid" or "none"'),
        **dict.fromkeys(("raw_scores", "return_text", "truncate", "normalize", "add_special_tokens",
                         "handle_impossible_answer"), (lambda v: isinstance(v, bool), "true or false")),
        "model": (lambda v: isinstance(v, str), "a string (any: this server serves one model)"),
        "user": (lambda v: isinstance(v, str), "a string"),
        "truncation_direction": (lambda v: v in ("right", "Right"), '"right" (bertkit keeps a text\'s beginning)'),
        "prompt_name": (lambda v: False, "null (a prompt per request is not implemented; the server puts the model's "
                                         "default prompt, /info's default_prompt, before every text)"),
        "encoding_format": (lambda v: v == "float", '"float"'),
        "dimensions": int_in(1, getattr(pipe, "dimension", 0), " (the width of this server's vectors)"),
        "aggregation_strategy": (lambda v: v == "first", '"first" (each word takes its first piece\'s tag, as '
                                                          "bertkit's NER models are trained)"),
        "ignore_labels": (lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v)
                          and (labels is None or set(v) <= labels),
                          "a list of this model's label names" + (f" ({', '.join(sorted(labels))})" if labels else "")),
        "align_to_words": (lambda v: v is True, "true (answers are whole words of the context)"),
        "max_seq_len": (lambda v: v == n, f"{n}, this server's max_length (set with --max-length at start)"),
        "doc_stride": int_in(1, n, " (at most max_length)"),
        "max_question_len": int_in(1, n - 4, " (max_length - 4 leaves the context room)"),
        "max_answer_len": int_in(1, n, " (at most max_length)"),
        "null_threshold": (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v),
                           "a finite number"),
    }


def check_values(values: dict[str, Any], pipe: Any, limits: Limits) -> None:
    """422 for the first value that fails its check (``_parameter_checks``), naming it."""
    checks = _parameter_checks(pipe, limits)
    for name, value in values.items():
        ok, expected = checks[name]  # every name a route accepts has its check (tests/test_serve_limits.py)
        if not ok(value):
            raise RequestError(422, f"{name} must be {expected}, got {repr(value)[:80]}")


def parse_request(data: Any, pipe: Any, limits: Limits, similarity: bool = False) -> Call:
    """/predict's body (``similarity``: /similarity's, always a sentence similarity) as a checked and costed call;
    a JSON ``null`` is the default."""
    task = pipe.task
    if similarity:
        need_embedding(pipe, "/similarity")
    top = () if similarity else _TEI_FIELDS.get(task, ())
    f = fields(data, "/similarity" if similarity else "/predict", ("inputs",), (*top, "parameters"), pipe, limits)
    params = f.pop("parameters", {})
    if not isinstance(params, dict):
        raise RequestError(422, f"parameters must be an object, got {type(params).__name__} {str(params)[:40]}")
    renamed = _RENAMED.get(task, {})
    allowed = {*pipe.call_options, *_ANSWER_PARAMS.get(task, ()), *renamed} - set(renamed.values())
    bad = sorted(set(params) - allowed)
    if bad:
        raise RequestError(422, f"{task} takes no parameter(s) {', '.join(bad)}; it takes "
                                f"{', '.join(sorted(allowed)) or 'none'}")
    params = {k: v for k, v in params.items() if v is not None}  # null: the default, as the Inference API's clients
    twice = sorted(set(f) & set(params))
    if twice:
        raise RequestError(422, f"{twice[0]} is given both at the top level and in parameters; send it once")
    check_values(params, pipe, limits)
    raw = f.pop("inputs")  # a list is always several inputs: a pair is {"text", "text_pair"} or [[a, b]]
    answer = {renamed.get(k, k): v for k, v in {**params, **f}.items()}  # render reads what it needs
    options = {k: v for k, v in answer.items() if k in pipe.call_options}
    if similarity or task in EMBEDDING_TASKS and isinstance(raw, dict) and "source_sentence" in raw:
        raw, answer["similarity"] = _similarity_inputs(raw, pipe), True
    single = not isinstance(raw, list)
    items = [raw] if single else raw
    if not items:
        raise RequestError(422, "inputs is an empty list")
    limits.check_items(len(items))
    checked, counted, chars, cost = _check_inputs(items, pipe, limits, options, answer.get("truncate", True))
    if task in _ROWS:
        options = {"rows": True}
    tei = task == "text-classification" and any(k in data for k in top)
    return Call(checked, options, answer, single, tei, cost, counted, chars)


def need_embedding(pipe: Any, path: str, one_vector: bool = False) -> None:
    """424 unless ``pipe`` is an embedding pipeline; 422 if ``one_vector`` and it gives every token's state."""
    if pipe.task not in EMBEDDING_TASKS:
        raise RequestError(424, f"{path} needs an embedding pipeline; this server runs {pipe.task}: start it with "
                                "--task feature-extraction or sentence-embedding, or use /predict")
    if one_vector and pipe.pooling == "none":
        raise RequestError(422, f"{path} gives one vector per input; this server's pipeline has "
                                'pooling="none"')


def fields(data: Any, path: str, required: tuple[str, ...], optional: tuple[str, ...], pipe: Any,
           limits: Limits) -> dict[str, Any]:
    """The body's fields, every required one present, none unknown, each optional one's value checked
    (``check_values``; ``parameters`` is its route's to check); a JSON null is the field's default."""
    if not isinstance(data, dict):
        raise RequestError(422, f"the body of {path} must be a JSON object with {', '.join(required)}")
    unknown = sorted(set(data) - set(required) - set(optional))
    if unknown:
        raise RequestError(422, f"unknown field(s) {', '.join(unknown)}; {path} takes "
                                f"{', '.join((*required, *sorted(optional)))}")
    missing = [k for k in required if data.get(k) is None]
    if missing:
        raise RequestError(422, f"{path} needs the field(s) {', '.join(missing)}")
    out = {k: v for k, v in data.items() if v is not None}
    check_values({k: v for k, v in out.items() if k not in required and k != "parameters"}, pipe, limits)
    return out


def _similarity_inputs(raw: Any, pipe: Any) -> list[str]:
    """The texts of a sentence-similarity input, source sentence first; 422 on any other shape."""
    others = raw.get("sentences") if isinstance(raw, dict) else None
    if not (isinstance(raw, dict) and set(raw) == {"source_sentence", "sentences"}
            and isinstance(raw.get("source_sentence"), str) and isinstance(others, list)
            and others and all(isinstance(x, str) for x in others)):
        raise RequestError(422, 'sentence similarity takes inputs {"source_sentence": str, "sentences": '
                                f'[str, ...]}} and no other field, got {str(raw)[:80]!r}')
    need_embedding(pipe, "sentence similarity", one_vector=True)
    return [raw["source_sentence"], *others]


def _check_inputs(items: list[Any], pipe: Any, limits: Limits, options: dict[str, Any],
                  truncate: bool) -> tuple[list[Any], list[int], int, int]:
    """(checked inputs, encoded for ``_ROWS`` tasks; token count of each one-sequence input; characters in all; model
    sequences): each input is refused here, naming its index, not inside a batch shared with other requests, and so
    is a request over a limit of cost, counted before any window is built (``squad.count_windows``)."""
    from bertkit.tasks import squad

    task = pipe.task
    checked: list[Any] = []
    counted: list[int] = []
    chars = cost = candidates = 0
    for i, item in enumerate(items):
        if isinstance(item, list):  # JSON has no tuples: [text, text_pair]; TEI's batches write a text as [text]
            item = item[0] if len(item) == 1 else tuple(item)
        n = _chars(item)
        limits.check_chars(n, f"input {i}")
        read = read_input(pipe, item, i)
        if task in _ROWS:
            item = encode(pipe, read, i, truncate)
            counted.append(len(item["input_ids"]))
        elif task in _ONE_SEQUENCE:  # counted for max_batch_tokens, x-compute-tokens and /metrics
            counted.append(fitted(len(pipe.tokenizer(read)["input_ids"]), f"input {i}", pipe, truncate))
        chars += n
        checked.append(item)
        sequences, what = 1, "inputs"
        if task == "question-answering":
            stride = options.get("doc_stride", _default(pipe.encode, "doc_stride"))
            question = options.get("max_question_length", _default(pipe.encode, "max_question_length"))
            sequences = squad.count_windows(item["question"], item["context"], pipe.tokenizer,
                                            max_seq_length=pipe.max_length, doc_stride=stride,
                                            max_query_length=question)
            candidates += options.get("top_k", _default(pipe.decode, "top_k"))
            what = f"windows (input {i} alone makes {sequences} at doc_stride {stride}; a larger doc_stride makes fewer)"
        elif task == "fill-mask":
            try:
                sequences = len(pipe.encode(item)[0]["masks"])  # the [MASK]s within max_length, as the model sees them
            except BertkitError as e:
                raise RequestError(422, f"input {i}: {e}") from None
            candidates += sequences * options.get("top_k", _default(pipe.decode, "top_k"))
            what = f"[MASK] tokens (input {i} has {sequences})"
        elif task == "rerank":
            sequences = len(item["texts"])
            what = f"(query, text) pairs (input {i} has {sequences})"
        cost += sequences
        if cost > limits.max_windows_per_request:
            raise RequestError(422, f"this request would cost {cost}+ model sequences, over max_windows_per_request "
                                    f"{limits.max_windows_per_request}: {what}; send it in smaller requests")
        if candidates > limits.max_candidates:
            raise RequestError(422, f"this request's answer would hold {candidates}+ candidates (top_k x "
                                    f"{'[MASK]s' if task == 'fill-mask' else 'questions'}), over max_candidates "
                                    f"{limits.max_candidates}; lower top_k or send fewer inputs")
    return checked, counted, chars, cost


def read_input(pipe: Any, item: Any, index: int) -> Any:
    """The input as the pipeline reads it (``Pipeline.check_input``), or a 422 naming what is wrong with it (a field
    it does not read, a wrong type, an empty text): refused here, not in a batch shared with other requests."""
    try:
        return pipe.check_input(item, index)
    except BertkitError as e:
        raise RequestError(422, str(e)) from None


def encode(pipe: Any, read: tuple[str, str | None], index: int, truncate: bool) -> dict[str, Any]:
    """The model's row for a (text, text_pair) ``read_input`` gave, cut at max_length (422 instead when ``truncate``
    is off)."""
    row = pipe.encode(read)[0]
    if not truncate:
        fitted(len(pipe.tokenizer(*read)["input_ids"]), f"input {index}", pipe, truncate)
    return row


def fitted(tokens: int, what: str, pipe: Any, truncate: bool) -> int:
    """The tokens of a sequence of ``tokens`` once cut at max_length; 422 when it must be and ``truncate`` is off."""
    if not truncate and tokens > pipe.max_length:
        raise RequestError(422, f"{what} has {tokens} tokens, over max_length {pipe.max_length}; send truncate: true "
                                "to cut it, or shorten it")
    return min(tokens, pipe.max_length)


def _classification(config: Any, logits: np.ndarray, answer: dict[str, Any], tei: bool) -> list[dict[str, Any]]:
    """``[{label, score}]`` best first, scored as transformers' pipeline does (TEI: softmax, or sigmoid for
    one label; ``raw_scores``: the logits)."""
    x = logits.astype(np.float64)
    n = len(x)
    fn = answer.get("function_to_apply")
    if answer.get("raw_scores"):
        fn = "none"
    elif fn is None and tei:
        fn = "softmax" if n > 1 else "sigmoid"
    elif fn is None:  # transformers' TextClassificationPipeline.postprocess
        if config.problem_type == "regression":
            fn = "none"
        elif config.problem_type == "multi_label_classification" or n == 1:
            fn = "sigmoid"
        else:
            fn = "softmax"
    if fn == "softmax":
        e = np.exp(x - x.max())
        scores = e / e.sum()
    elif fn == "sigmoid":
        scores = 1.0 / (1.0 + np.exp(-x))
    else:
        scores = x
    names = [config.id2label[i] if config.id2label else f"LABEL_{i}" for i in range(n)]
    out = sorted(({"label": names[i], "score": float(scores[i])} for i in range(n)), key=lambda d: -d["score"])
    key = ("score", "label") if tei else ("label", "score")
    out = [{k: d[k] for k in key} for d in out]
    return out[:answer["top_k"]] if answer.get("top_k") else out


def _embedding(vector: list[Any], answer: dict[str, Any], default_normalize: bool) -> list[Any]:
    v = np.asarray(vector, dtype=np.float32)
    if answer.get("dimensions"):
        v = v[..., :answer["dimensions"]]  # Matryoshka truncation, then normalisation (TEI's order)
    normalize = answer.get("normalize")
    if default_normalize if normalize is None else normalize:
        v = v / np.maximum(np.linalg.norm(v, axis=-1, keepdims=True), 1e-12)
    return v.tolist()


def _answer(result: dict[str, Any], top_k: int | None) -> dict[str, Any] | list[dict[str, Any]]:
    def one(r: dict[str, Any]) -> dict[str, Any]:  # transformers' keys; no answer is "" at 0..0
        return {"score": r["score"], "start": r["start"] or 0, "end": r["end"] or 0, "answer": r["answer"]}

    return one(result) if (top_k or 1) == 1 else [one(r) for r in result["nbest"]]


def render(server: Any, call: Call, results: list[Any]) -> Any:
    """The JSON answer to ``call``: the Inference API's shape for the task (TEI's where ``call.tei``)."""
    pipe, a = server.pipe, call.answer
    task = pipe.task
    if task == "text-classification":
        out = [_classification(pipe.config, r, a, call.tei) for r in results]
        return (out[0] if call.tei else out) if call.single else out
    if task in EMBEDDING_TASKS and a.get("similarity"):  # cosines of the source sentence's unit vector with the others'
        v = np.asarray(_embedding(results, {**a, "normalize": True}, True), dtype=np.float64)
        return (v[1:] @ v[0]).tolist()
    if task in EMBEDDING_TASKS:
        return [_embedding(r, a, server.default_normalize) for r in results]  # one text too gives a list of one
    if task == "token-classification":
        ignore = set(a.get("ignore_labels") or ())
        out = [[e for e in r["entities"] if e["entity_group"] not in ignore] for r in results]
    elif task == "question-answering":
        out = [_answer(r, a.get("top_k")) for r in results]
    else:
        out = results
    return out[0] if call.single else out


PREDICT = Route("/predict", "the Inference API's (huggingface_hub.InferenceClient): {inputs, parameters}, every task; "
                "TEI's fields give TEI's answer", parse_request, render)
ROUTES = (PREDICT, Route("/similarity", "TEI's: the cosines of a source sentence with sentences",
                         functools.partial(parse_request, similarity=True), render))
