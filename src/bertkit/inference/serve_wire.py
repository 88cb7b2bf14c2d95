"""The wire format of ``bertkit serve``: what a route is (``Route``), what one request may be and cost
(``Limits``), and the Inference API's /predict and TEI's /similarity, which share a body. What differs by task (its
cost and answer) is its ``tasks.Task``'s, read from the server (``server.task``), its parameters its pipeline's options
(``options.Option``, under their wire names)."""

from __future__ import annotations

import dataclasses
import inspect
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bertkit.errors import BertkitError, NotStandardJson, standard_json
from bertkit.inference.options import BOOL, Rule, int_in, refusal
from bertkit.settings.inference import RequestLimits

# What a server of another task answers on a route of embedding models (``Route.needs``).
NEEDS_EMBEDDING = "needs an embedding pipeline; this server runs {task}: start it with --task {tasks}, or use /predict"
EMBED_FIELDS = ("normalize", "truncate", "truncation_direction", "prompt_name", "dimensions", "encoding_format")


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
            raise RequestError(422, f"{n} {name} exceed max_items {self.max_items} per request: send them in requests "
                                    f"of at most {self.max_items}, or start the server with a larger --max-items")

    def check_chars(self, n: int, what: str) -> None:
        if n > self.max_text_chars:
            raise RequestError(422, f"{what} has {n} characters, over max_text_chars {self.max_text_chars}: send "
                               "less (the model reads a text's first max_length tokens), or start the server with a "
                               "larger --max-text-chars")


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
    the tokenizer alone); a GET answers from the server. ``parse`` and ``render`` read the server's ``pipe``,
    ``limits`` and ``task``. A route that only some tasks declare (``Task.routes``) says in ``needs`` what another
    server answers (424): formatted with ``task``, the server's, and ``tasks``, those that declare it. A refusal's body
    is TEI's ``{"error", "error_type"}`` unless the route's clients read another (``error``: message, error type ->
    body)."""

    path: str
    help: str
    parse: Callable[[Any, Any], Call] | None = None
    render: Callable[[Any, Call, list[Any]], Any] | None = None
    get: Callable[[Any], Any] | None = None
    model: bool = True
    needs: str = ""
    error: Callable[[str, str], dict[str, Any]] | None = None

    @property
    def method(self) -> str:
        return "GET" if self.get else "POST"


def _depth(value: Any) -> int:
    """How deeply the lists and objects of a parsed JSON value nest."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, (list, dict)):
            deepest = max(deepest, depth + 1)
            stack.extend((x, depth + 1) for x in (v.values() if isinstance(v, dict) else v))
    return deepest


def _integer(text: str) -> int:
    # Python refuses an integer of over 4,300 digits from inside json (a 500), and one without that limit takes
    # quadratic time on it: refused here, before int() sees it.
    if len(text) > 4300:
        raise RequestError(400, f"the body is not valid: a number of {len(text.lstrip('-'))} digits "
                                f"({text[:20]}...); no field takes an integer that large")
    return int(text)


def load_json(body: bytes, limits: Limits) -> Any:
    """The body's JSON: strict (``standard_json``: no key twice, no NaN, no lone surrogate), and nested at most
    max_json_depth deep."""
    try:
        data = standard_json(body, parse_int=_integer)
    except (NotStandardJson, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RequestError(400, f"the body is not valid JSON: {e}") from None
    except RecursionError:  # Python's parser recurses once per level and gives up near 1,000
        depth = "about 1,000 or more"
    else:
        depth = _depth(data)
        if depth <= limits.max_json_depth:
            return data
    raise RequestError(413, f"the body nests lists and objects {depth} deep, over max_json_depth "
                            f"{limits.max_json_depth}: no route's body nests more than a few levels, so check how it is "
                            "built (or start the server with a larger --max-json-depth)")


def _default(method: Callable[..., Any], name: str) -> Any:  # written once, in the pipeline's signature
    return inspect.signature(method).parameters[name].default


def _parameter_checks(server: Any) -> dict[str, Rule]:
    """Every parameter a route takes, with its rule: the pipeline's options' (``Option``, under their wire names), and
    the routes' own fields and answer parameters."""
    pipe, limits = server.pipe, server.limits
    n = pipe.max_length
    return {
        "top_k": int_in(1, limits.max_top_k, " (max_top_k)"),  # text-classification's (an answer's labels)
        "top_n": int_in(1, why=" (the best texts answered; more than were sent answers them all)"),  # /rerank's
        # any case, as transformers' pipeline reads it (its ClassificationFunction[value.upper()])
        "function_to_apply": (lambda v: isinstance(v, str) and v.lower() in ("softmax", "sigmoid", "none"),
                              '"softmax", "sigmoid" or "none" (in any case)'),
        **dict.fromkeys(("raw_scores", "truncate", "normalize", "add_special_tokens", "skip_special_tokens"), BOOL),
        "model": (lambda v: isinstance(v, str), "a string (any: this server serves one model)"),
        "user": (lambda v: isinstance(v, str), "a string"),
        "truncation_direction": (lambda v: v in ("right", "Right", "left", "Left"),
                                 '"right" (keep a text\'s beginning, the default) or "left" (keep its end)'),
        "prompt_name": (lambda v: False, "null (this server's model has no prompts)"),
        "encoding_format": (lambda v: v == "float", '"float"'),
        "dimensions": int_in(1, getattr(pipe, "dimension", 0), " (the width of this server's vectors)"),
        "align_to_words": (lambda v: isinstance(v, bool), "true (answers widened to whole words, the default) or false "
                                                           "(token spans)"),
        "max_seq_len": (lambda v: v == n, f"{n}, this server's max_length (set with --max-length at start)"),
        **{o.wire or o.name: rule for o in pipe.call_options if (rule := o.check(pipe, served=True)) is not None},
    }


def check_values(values: dict[str, Any], server: Any) -> None:
    """422 for the first value that fails its rule (``_parameter_checks``; a top_k within max_top_k too), naming it."""
    checks = _parameter_checks(server)
    cap = int_in(1, server.limits.max_top_k, " (max_top_k)")  # a server's limit, after a pipeline's own top_k rule
    for name, value in values.items():
        # every name a route accepts has its rule (tests/test_serve_limits.py)
        why = refusal(name, value, checks[name]) or (refusal(name, value, cap) if name == "top_k" else None)
        if why:
            raise RequestError(422, why)


def parse_request(data: Any, server: Any, similarity: bool = False) -> Call:
    """/predict's body (``similarity``: /similarity's, always a sentence similarity) as a checked and costed call;
    a JSON ``null`` is the default."""
    pipe, limits, task = server.pipe, server.limits, server.task
    top = () if similarity else task.body_fields
    f = fields(data, "/similarity" if similarity else "/predict", ("inputs",), (*top, "parameters"), server)
    params = f.pop("parameters", {})
    if not isinstance(params, dict):
        raise RequestError(422, f"parameters must be an object, got {type(params).__name__} {str(params)[:40]}")
    renamed = {o.wire: o.name for o in pipe.call_options if o.wire}  # the Inference API's names -> the pipeline's
    names = {o.name for o in pipe.call_options}
    allowed = {*names, *task.answer_params, *renamed} - set(renamed.values())
    bad = sorted(set(params) - allowed)
    if bad:
        raise RequestError(422, f"{task.name} takes no parameter(s) {', '.join(bad)}; it takes "
                                f"{', '.join(sorted(allowed)) or 'none'}")
    params = {k: v for k, v in params.items() if v is not None}  # null: the default, as the Inference API's clients
    twice = sorted(set(f) & set(params))
    if twice:
        raise RequestError(422, f"{twice[0]} is given both at the top level and in parameters; send it once")
    check_values(params, server)
    raw = f.pop("inputs")  # a list is several inputs (but TEI's Sequence, below): a pair is {"text", "text_pair"}
    answer = {renamed.get(k, k): v for k, v in {**params, **f}.items()}  # render reads what it needs
    task.check_answer(answer)
    options = {k: v for k, v in answer.items() if k in names or k == "truncation_direction"}  # encode's, at parsing
    names = None  # what an error calls each input: its index, or its field in a sentence-similarity body
    if similarity or SIMILARITY in task.routes and isinstance(raw, dict) and "source_sentence" in raw:
        raw, answer["similarity"] = _similarity_inputs(raw, pipe), True
        names = ["source_sentence", *(f"sentences[{j}]" for j in range(len(raw) - 1))]
    if task.tei_sequence and isinstance(raw, list) and len(raw) in (1, 2) and all(isinstance(x, str) for x in raw):
        # TEI's PredictInput: ["a"] is the text a, ["a", "b"] the pair (a, b), each answered as one input (a batch is
        # [["a"], ["b"]] or three or more texts); read as two texts, a TEI client's pair was scored as two singles
        raw = raw[0] if len(raw) == 1 else (raw[0], raw[1])
    single = not isinstance(raw, list)
    items = [raw] if single else raw
    if not items:
        raise RequestError(422, "inputs is an empty list")
    limits.check_items(len(items))
    checked, counted, chars, cost = _check_inputs(items, server, options, answer.get("truncate", True), names)
    if task.encoded:
        options = {"rows": True}
    tei = any(k in data for k in top)
    return Call(checked, options, answer, single, tei, cost, counted, chars)


def one_vector(pipe: Any, path: str) -> None:
    """422 if ``path`` gives one vector per input and the server's pipeline gives every token's state."""
    if pipe.pooling == "none":
        raise RequestError(422, f"{path} gives one vector per input; this server's pipeline has "
                                'pooling="none"; /embed_all gives every token\'s state, or serve a pipeline with a '
                                'pooling (pooling="mean")')


def fields(data: Any, path: str, required: tuple[str, ...], optional: tuple[str, ...], server: Any) -> dict[str, Any]:
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
    check_values({k: v for k, v in out.items() if k not in required and k != "parameters"}, server)
    return out


def _similarity_inputs(raw: Any, pipe: Any) -> list[str]:
    """The texts of a sentence-similarity input, source sentence first; 422 on any other shape."""
    others = raw.get("sentences") if isinstance(raw, dict) else None
    if others == [] and isinstance(raw.get("source_sentence"), str) and set(raw) == {"source_sentence", "sentences"}:
        raise RequestError(422, "inputs.sentences is empty: send at least one sentence to compare source_sentence with")
    if not (isinstance(raw, dict) and set(raw) == {"source_sentence", "sentences"}
            and isinstance(raw.get("source_sentence"), str) and isinstance(others, list)
            and others and all(isinstance(x, str) for x in others)):
        raise RequestError(422, 'sentence similarity takes inputs {"source_sentence": str, "sentences": '
                                f'[str, ...]}} and no other field, got {str(raw)[:80]!r}')
    one_vector(pipe, "sentence similarity")
    return [raw["source_sentence"], *others]


def _check_inputs(items: list[Any], server: Any, options: dict[str, Any], truncate: bool,
                  names: list[str] | None = None) -> tuple[list[Any], list[int], int, int]:
    """(checked inputs, encoded for a task that is ``encoded``; token count of each one-sequence input; characters in
    all; model sequences): each input is refused here, naming its index (or its name in ``names``), not inside a
    batch shared with other requests, and so is a request over a limit of cost (``Task.cost``), counted before any
    window is built."""
    pipe, limits, task = server.pipe, server.limits, server.task
    checked: list[Any] = []
    counted: list[int] = []
    chars = cost = candidates = 0
    for i, item in enumerate(items):
        where = names[i] if names else i
        if task.tei_sequence and isinstance(item, list) and len(item) not in (1, 2):  # not "a tuple": JSON has none
            raise RequestError(422, f"input {where} is a list of {len(item)} values; a list in inputs is one input, "
                                    '[text] or [text, text_pair] (TEI\'s), or {"text": ..., "text_pair": ...}')
        if isinstance(item, list):  # JSON has no tuples: [text, text_pair]; TEI's batches write a text as [text]
            item = item[0] if len(item) == 1 else tuple(item)
        n = _chars(item)
        limits.check_chars(n, f"input {where}")
        read = read_input(pipe, item, where)
        if task.encoded:
            item = encode(pipe, read, where, truncate, **options)
            counted.append(len(item["input_ids"]))
        elif task.counted:  # counted for max_batch_tokens, x-compute-tokens and /metrics
            counted.append(fitted(len(pipe.tokenizer(read)["input_ids"]), f"input {where}", pipe, truncate))
        chars += n
        checked.append(item)
        sequences, more, what = task.cost(pipe, item, options, i)
        cost += sequences
        candidates += more
        if cost > limits.max_windows_per_request:
            raise RequestError(422, f"this request would cost {cost}+ model sequences, over max_windows_per_request "
                                    f"{limits.max_windows_per_request}: {what}; send it in smaller requests")
        if candidates > limits.max_candidates:
            raise RequestError(422, f"this request's answer would hold {candidates}+ candidates (top_k x "
                                    f"{task.candidates_per}), over max_candidates "
                                    f"{limits.max_candidates}; lower top_k or send fewer inputs")
    return checked, counted, chars, cost


def read_input(pipe: Any, item: Any, index: int | str) -> Any:
    """The input as the pipeline reads it (``Pipeline.check_input``), or a 422 naming what is wrong with it (a field
    it does not read, a wrong type, an empty text): refused here, not in a batch shared with other requests."""
    try:
        return pipe.check_input(item, index)
    except BertkitError as e:
        raise RequestError(422, str(e)) from None


def encode(pipe: Any, read: tuple[str, str | None], index: int | str, truncate: bool,
           **options: Any) -> dict[str, Any]:
    """The model's row for a (text, text_pair) ``read_input`` gave, cut at max_length (422 instead when ``truncate``
    is off): measured on the row the pipeline builds, an embedding model's prompt included."""
    row = pipe.encode(read, truncate=truncate, **options)[0]
    fitted(len(row["input_ids"]), f"input {index}", pipe, truncate)
    return row


def fitted(tokens: int, what: str, pipe: Any, truncate: bool) -> int:
    """The tokens of a sequence of ``tokens`` once cut at max_length; 422 when it must be and ``truncate`` is off."""
    if not truncate and tokens > pipe.max_length:
        raise RequestError(422, f"{what} has {tokens} tokens, over max_length {pipe.max_length}; send truncate: true "
                                "to cut it, or shorten it")
    return min(tokens, pipe.max_length)


def embedding(vector: list[Any], answer: dict[str, Any], default_normalize: bool) -> list[Any]:
    """A vector as answered: cut to ``dimensions``, then normalised (``normalize``, else ``default_normalize``)."""
    import numpy as np

    v = np.asarray(vector, dtype=np.float32)
    if answer.get("dimensions"):
        v = v[..., :answer["dimensions"]]  # Matryoshka truncation, then normalisation (TEI's order)
    normalize = answer.get("normalize")
    if default_normalize if normalize is None else normalize:
        # finite values past about 1.8e19 have an infinite float32 norm: divided by it the vector came out all zeros,
        # and /similarity scored it 0.0 against a text it equals. Scaled by its largest magnitude first, it is the unit
        # vector it is (bertkit.sentence.finite.unit_length's rule); a NaN or inf stays, for the answer's check
        with np.errstate(over="ignore", invalid="ignore"):
            norm = np.linalg.norm(v, axis=-1, keepdims=True)
            largest = np.abs(v).max(axis=-1, keepdims=True) if v.size else norm
            over = np.isinf(norm) & np.isfinite(largest)
            if over.any():
                v = np.where(over, v / np.where(over, largest, 1), v)
                norm = np.where(over, np.linalg.norm(v, axis=-1, keepdims=True), norm)
            v = v / np.maximum(norm, 1e-12)
    return v.tolist()


PREDICT = Route("/predict", "the Inference API's (huggingface_hub.InferenceClient): {inputs, parameters}, every task; "
                "TEI's fields give TEI's answer", parse_request, lambda server, call, results: server.task.render(
                    server, call, results))
SIMILARITY = Route("/similarity", "TEI's: the cosines of a source sentence with sentences",
                   lambda data, server: parse_request(data, server, similarity=True), PREDICT.render,
                   needs=NEEDS_EMBEDDING)
