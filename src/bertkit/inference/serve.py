"""``bertkit serve``: a pipeline behind HTTP, with dynamic batching and admission control.

Why FastAPI + uvicorn: both are widely used and well kept, asyncio-native (thousands of waiting requests
cost no threads), and what most people who serve transformers models already run; the request handling
is ours and small (we parse and check the JSON ourselves, so every error message names its limit).
LitServe would bring its own batching loop and worker processes; one process owning one model, with the
batching below, is simpler to reason about and is what makes bertkit's unpadded batches pay off.

Endpoints (docs/inference.md has each task's answer and parameters). Bodies and answers are those of Hugging
Face's Inference API, so ``huggingface_hub.InferenceClient(model="http://HOST:PORT/predict")`` works
unchanged, and of Hugging Face's text-embeddings-inference (TEI) server where it has the route:

- ``POST /predict``: ``{"inputs": ..., "parameters": {...}}``, one input or a list (a pair is
  ``{"text", "text_pair"}``, or ``[text, text_pair]`` inside a list, where ``[text]`` is a text as in TEI's
  batches). A text-classification body with one of TEI's fields (``raw_scores``, ``truncate``, ...) is
  answered in TEI's shape; for the embedding tasks, ``{"source_sentence", "sentences"}`` gives the cosine
  similarities (the Inference API's sentence-similarity). ``POST /embed``, ``POST /similarity``: TEI's.
- ``GET /health``: liveness, from the event loop alone. ``GET /ready``: 503 with ``Retry-After`` while the
  admission bound is reached or the server drains. ``GET /metadata``: limits, admission state, counters.

Batching: requests arriving within ``max_wait_ms`` of the first waiting one are joined, whole, while their
inputs fit in ``max_batch_size``, into one pipeline call on the one model thread (a request with more inputs
runs alone). The wait happens only while other requests are being read: a lone request (concurrency 1) runs
at once instead of waiting for companions that are not coming. Admission: at most ``max_concurrent_requests`` inputs (TEI's name; it too counts inputs) are
admitted and not yet answered; a request that would go over gets 429 with ``Retry-After`` at once. Work of
a client that disconnected, or whose ``X-Request-Timeout`` passed (504), is dropped before the model. On
SIGTERM admitted requests finish (at most ``graceful_shutdown_s``). Limits, each a 4xx naming it:
``max_body_bytes`` (413), ``max_items``, ``max_text_chars`` (422). Errors are ``{"error", "error_type"}``.
"""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import math
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bertkit.errors import BertkitError, NonFiniteError

logger = logging.getLogger("bertkit")

# Inputs admitted and not yet answered. MiniLM (6 layers, H=384) on this project's 2-core machine with one
# model thread runs 7-9 inputs/s of 300-word texts (~320 tokens): 64 inputs is 7-9 s of work there, the
# longest an admitted request then waits; short texts (SST-2, ~25 tokens, ~110 inputs/s) drain 64 in under a
# second (docs/inference.md has the measurement).
DEFAULT_MAX_CONCURRENT_REQUESTS = 64

EMBEDDING_TASKS = ("feature-extraction", "sentence-embedding")
_EMBED_FIELDS = ("normalize", "truncate", "truncation_direction", "prompt_name", "dimensions", "encoding_format")
# Fields a body may hold besides inputs and parameters: TEI's, which InferenceClient also sends at the top
# level for feature-extraction. On a text-classification body they select TEI's answer.
_TEI_FIELDS = {"text-classification": ("raw_scores", "truncate", "truncation_direction"),
               **{t: _EMBED_FIELDS for t in EMBEDDING_TASKS}}
# Inference API parameters that shape the answer, not the model call: requests differing in them share a batch.
_ANSWER_PARAMS = {"text-classification": ("top_k", "function_to_apply"),
                  "token-classification": ("aggregation_strategy", "ignore_labels"),
                  "question-answering": ("align_to_words", "max_seq_len"),
                  **{t: _EMBED_FIELDS for t in EMBEDDING_TASKS}}
# Inference API parameter names that bertkit's pipelines spell differently.
_RENAMED = {"question-answering": {"max_answer_len": "max_answer_length", "max_question_len": "max_question_length",
                                   "handle_impossible_answer": "allow_no_answer"}}
_ERROR_TYPES = {429: "overloaded", 503: "unhealthy", 504: "timeout", 500: "backend", 424: "backend"}


def require_serving() -> None:
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as e:
        raise BertkitError(f"bertkit serve needs FastAPI and uvicorn ({e.name} is missing): "
                           "pip install \"bertkit[serve]\"") from None


class RequestError(Exception):
    """A request the server refuses: an HTTP status, a message for the client, and headers (Retry-After)."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}


@dataclass
class Limits:
    max_body_bytes: int = 1_000_000
    max_items: int = 64
    max_text_chars: int = 20_000
    max_concurrent_requests: int = DEFAULT_MAX_CONCURRENT_REQUESTS

    def __post_init__(self) -> None:
        if self.max_items > self.max_concurrent_requests:
            raise BertkitError(f"max_items {self.max_items} exceeds max_concurrent_requests "
                               f"{self.max_concurrent_requests}: a request that large could never be admitted; "
                               "raise --max-concurrent-requests or lower --max-items")


@dataclass
class Stats:
    requests: int = 0  # requests to /predict and /embed
    items: int = 0  # inputs the model computed
    batches: int = 0  # pipeline calls
    largest_batch: int = 0
    refused: int = 0  # requests answered 429/503: the admission bound reached, or draining
    abandoned: int = 0  # inputs dropped before the model: their client disconnected
    expired: int = 0  # inputs dropped before the model: their X-Request-Timeout passed
    errors: int = 0  # other 4xx/5xx answers
    started: float = field(default_factory=time.time)


def _chars(item: Any) -> int:
    if isinstance(item, str):
        return len(item)
    if isinstance(item, dict):
        return sum(_chars(v) for v in item.values())
    if isinstance(item, (list, tuple)):
        return sum(_chars(v) for v in item)
    return 0


# ---------------------------------------------------------------------------------------------------
# batching and admission
# ---------------------------------------------------------------------------------------------------


@dataclass(eq=False)
class Job:
    """One admitted request: its inputs, the pipeline options it runs with, and where its results go."""

    items: list[Any]
    options: dict[str, Any]
    future: asyncio.Future
    deadline: float | None = None  # the event loop's clock
    timeout: float | None = None
    state: str = "queued"  # queued -> running -> done, or queued -> dropped
    wanted: bool = True  # False once its client has gone or its deadline passed


class Batcher:
    """Admits requests up to ``max_inputs`` inputs, gathers them into calls of ``run`` (at most
    ``max_batch_size`` inputs unless one request alone has more), and runs them on one model thread."""

    def __init__(self, run: Callable[[list[Any], dict[str, Any]], list[Any]], max_batch_size: int,
                 max_wait_ms: float, max_inputs: int, stats: Stats):
        self.run = run
        self.max_batch_size = max_batch_size
        self.max_wait = max_wait_ms / 1000.0
        self.max_inputs = max_inputs
        self.stats = stats
        self.jobs: deque[Job] = deque()
        self.inputs = 0  # admitted and not answered: queued or in the model
        self.arriving = 0  # requests past the admission check whose bodies are still being read and parsed
        self.rate: float | None = None  # the model's inputs/s, a moving average over calls
        self.wake = asyncio.Event()
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bertkit-model")
        self.task: asyncio.Task | None = None

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self._loop())

        def stopped(task: asyncio.Task) -> None:
            if not task.cancelled():
                logger.error("the batching loop stopped; /health now answers 503", exc_info=task.exception())

        self.task.add_done_callback(stopped)

    def alive(self) -> bool:
        return self.task is not None and not self.task.done()

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            try:
                await self.task
            except asyncio.CancelledError:
                pass
        for job in self.jobs:
            if not job.future.done():
                job.future.set_exception(RequestError(503, "the server stopped before this request ran"))
        self.executor.shutdown(wait=True, cancel_futures=True)

    def retry_after(self) -> int:
        """Seconds until the admitted inputs are answered at the measured rate (1 before any call)."""
        return 1 if not self.rate else max(1, min(60, math.ceil(self.inputs / self.rate)))

    def check_room(self, n: int | None = None) -> None:
        """429 if ``n`` more inputs (None: a request not read yet, so at least one) would exceed the bound."""
        if self.inputs + (n or 1) > self.max_inputs:
            wait = self.retry_after()
            has = "" if n is None else f", this request has {n}"
            raise RequestError(429, f"the server is at max_concurrent_requests {self.max_inputs} ({self.inputs} "
                                    f"inputs admitted and not answered{has}); retry after {wait} s",
                               {"Retry-After": str(wait)})

    def admit(self, items: list[Any], options: dict[str, Any], timeout: float | None) -> Job:
        n = len(items)
        self.check_room(n)
        loop = asyncio.get_running_loop()
        job = Job(items, options, loop.create_future(), None if timeout is None else loop.time() + timeout, timeout)
        self.inputs += n
        self.jobs.append(job)
        self.wake.set()
        return job

    def drop(self, job: Job, reason: str) -> None:
        """The job's client has gone or its deadline passed: never compute it (one already running finishes)."""
        job.wanted = False
        if job.state == "queued":
            job.state = "dropped"
            self.inputs -= len(job.items)
            setattr(self.stats, reason, getattr(self.stats, reason) + len(job.items))

    def _live(self, job: Job, now: float) -> bool:
        if job.state == "queued" and job.deadline is not None and now >= job.deadline:
            self.drop(job, "expired")
            if not job.future.done():
                job.future.set_exception(_expired(job.timeout, computed=False))
        return job.state == "queued"

    def _head(self) -> tuple[list[Job], bool]:
        """The live jobs at the head of the queue that fit in one call, and whether that call is full."""
        now = asyncio.get_running_loop().time()
        batch: list[Job] = []
        size = 0
        for job in self.jobs:
            if not self._live(job, now):
                continue
            if batch and size + len(job.items) > self.max_batch_size:
                return batch, True
            batch.append(job)
            size += len(job.items)
            if size >= self.max_batch_size:
                return batch, True
        return batch, False

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            while not self._head()[0]:
                self.jobs.clear()  # only dropped jobs were left
                self.wake.clear()
                await self.wake.wait()
            end = loop.time() + self.max_wait
            # Wait for companions only while some are on their way (being read); the queue alone is the batch
            # otherwise, and waiting would only add max_wait_ms to every request of a lone client.
            while self.arriving and not self._head()[1] and end > loop.time():
                self.wake.clear()
                try:
                    await asyncio.wait_for(self.wake.wait(), end - loop.time())
                except asyncio.TimeoutError:
                    break
            batch, _ = self._head()
            taken = set(batch)
            self.jobs = deque(j for j in self.jobs if j.state == "queued" and j not in taken)
            # Requests with other call options (top_k of fill-mask, ...) cannot share a call: one per option set.
            groups: dict[str, list[Job]] = {}
            for job in batch:
                groups.setdefault(json.dumps(job.options, sort_keys=True), []).append(job)
            for jobs in groups.values():
                await self._run([j for j in jobs if self._live(j, loop.time())])  # re-checked: time has passed

    async def _run(self, jobs: list[Job]) -> None:
        """One pipeline call for ``jobs``; each job's future gets its own slice of the results.

        If the shared call fails and several requests were in it, the input that made it fail may be any one
        of them (a fill-mask text whose [MASK] falls past max_length, ...): each is then run alone, so only the
        request that caused the error gets it and the others their results.
        """
        if not jobs:
            return
        loop = asyncio.get_running_loop()
        for job in jobs:
            job.state = "running"
        items = [x for j in jobs for x in j.items]
        t0 = time.perf_counter()
        try:
            results = await loop.run_in_executor(self.executor, self.run, items, jobs[0].options)
        except Exception as e:  # noqa: BLE001 (handed to the waiting request, which answers it as an HTTP error)
            if len(jobs) > 1:
                for job in jobs:
                    job.state = "queued"
                for job in jobs:
                    if not job.wanted:  # its request ended while the shared call ran
                        self.drop(job, "abandoned")
                    elif self._live(job, loop.time()):
                        await self._run([job])
                return
            self._finish(jobs[0], exception=e)
            return
        elapsed = time.perf_counter() - t0
        rate = len(items) / max(elapsed, 1e-6)
        self.rate = rate if self.rate is None else 0.7 * self.rate + 0.3 * rate
        self.stats.items += len(items)
        self.stats.batches += 1
        self.stats.largest_batch = max(self.stats.largest_batch, len(items))
        at = 0
        for job in jobs:
            self._finish(job, results[at:at + len(job.items)])
            at += len(job.items)

    def _finish(self, job: Job, results: list[Any] | None = None, exception: BaseException | None = None) -> None:
        job.state = "done"
        self.inputs -= len(job.items)
        if job.wanted and not job.future.done():
            if exception is not None:
                job.future.set_exception(exception)
            else:
                job.future.set_result(results)


def _expired(timeout: float | None, computed: bool) -> RequestError:
    what = ("its computation was under way and its result is discarded" if computed
            else "it was not computed")
    return RequestError(504, f"the request's deadline (X-Request-Timeout {timeout:g} s) passed before its "
                             f"result was ready; {what}")


# ---------------------------------------------------------------------------------------------------
# requests
# ---------------------------------------------------------------------------------------------------


@dataclass
class Call:
    """A parsed request: the inputs, the pipeline's call options (they split batches), the options that
    shape the answer, whether one input was sent, and whether the answer takes TEI's shape."""

    items: list[Any]
    options: dict[str, Any]
    answer: dict[str, Any]
    single: bool
    tei: bool = False


def parse_request(body: bytes, pipe: Any, limits: Limits, route: str = "predict") -> Call:
    """The request's inputs (checked by the pipeline) and options; ``route``: predict, embed or similarity."""
    if len(body) > limits.max_body_bytes:
        raise RequestError(413, f"request body of {len(body)} bytes exceeds max_body_bytes {limits.max_body_bytes}")
    try:
        data = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RequestError(400, f"the body is not valid JSON: {e}") from None
    task = pipe.task
    top = set(_TEI_FIELDS.get(task, ()))
    if route != "predict" and task not in EMBEDDING_TASKS:
        raise RequestError(424, f"/{route} needs an embedding pipeline; this server runs {task}: start it with "
                                "--task feature-extraction or sentence-embedding, or use /predict")
    if route == "embed":
        top.discard("encoding_format")
    else:
        top = {"parameters"} if route == "similarity" else top | {"parameters"}
    if not isinstance(data, dict) or "inputs" not in data:
        raise RequestError(422, 'the body must be a JSON object {"inputs": ..., "parameters": {...}}')
    unknown = sorted(set(data) - top - {"inputs"})
    if unknown:
        raise RequestError(422, f"unknown field(s) {', '.join(unknown)}; the body holds inputs"
                                f"{''.join(', ' + f for f in sorted(top))}")
    params = data.get("parameters") or {}
    if not isinstance(params, dict):
        raise RequestError(422, f"parameters must be an object, got {type(params).__name__}")
    renamed = _RENAMED.get(task, {})
    allowed = set(pipe.call_options) | set(_ANSWER_PARAMS.get(task, ())) | set(renamed)
    bad = sorted(set(params) - allowed)
    if bad:
        raise RequestError(422, f"{task} takes no parameter(s) {', '.join(bad)}; it takes "
                                f"{', '.join(sorted(allowed)) or 'none'}")
    answer = {k: v for k, v in {**params, **data}.items() if k in top and k != "parameters" or
              k in _ANSWER_PARAMS.get(task, ()) and k not in pipe.call_options}
    options = {renamed.get(k, k): v for k, v in params.items() if renamed.get(k, k) in pipe.call_options}
    if task == "question-answering" and "top_k" in options:
        answer["top_k"] = options["top_k"]
    if route == "embed":
        answer.setdefault("normalize", True)  # TEI's default
    _check_answer_options(answer, pipe)

    raw = data["inputs"]  # a list is always several inputs: a pair is {"text", "text_pair"} or [[a, b]]
    if route == "similarity" or task in EMBEDDING_TASKS and isinstance(raw, dict) and "source_sentence" in raw:
        others = raw.get("sentences") if isinstance(raw, dict) else None
        if not (isinstance(raw, dict) and isinstance(raw.get("source_sentence"), str) and isinstance(others, list)
                and others and all(isinstance(x, str) for x in others)):
            raise RequestError(422, 'sentence similarity takes inputs {"source_sentence": str, "sentences": '
                                    f'[str, ...]}}, got {str(raw)[:80]!r}')
        if getattr(pipe, "pooling", None) == "none":
            raise RequestError(422, "sentence similarity needs one vector per text; this server's pipeline has "
                                    'pooling="none"')
        raw, answer["similarity"] = [raw["source_sentence"], *others], True
    single = not isinstance(raw, list)
    items = [raw] if single else raw
    if not items:
        raise RequestError(422, "inputs is an empty list")
    if len(items) > limits.max_items:
        raise RequestError(422, f"{len(items)} inputs exceed max_items {limits.max_items} per request")
    checked = []
    for i, item in enumerate(items):
        if isinstance(item, list):  # JSON has no tuples: [text, text_pair]; TEI's batches write a text as [text]
            item = item[0] if len(item) == 1 else tuple(item)
        if route == "embed" and not isinstance(item, str):
            raise RequestError(422, f"/embed input {i} is a {type(item).__name__}; /embed takes a text or a list "
                                    "of texts")
        n = _chars(item)
        if n > limits.max_text_chars:
            raise RequestError(422, f"input {i} has {n} characters, over max_text_chars {limits.max_text_chars}")
        try:
            read = pipe.check_input(item, i)  # refused here, as a 422, rather than inside a shared batch
        except BertkitError as e:
            raise RequestError(422, str(e)) from None
        if answer.get("truncate") is False:  # (text, text_pair): the tasks that take truncate
            tokens = len(pipe.tokenizer(*read)["input_ids"])
            if tokens > pipe.max_length:
                raise RequestError(422, f"input {i} has {tokens} tokens, over max_length {pipe.max_length}; "
                                        "send truncate: true to cut it, or shorten it")
        checked.append(item)
    tei = route == "embed" or task == "text-classification" and any(f in data for f in _TEI_FIELDS[task])
    return Call(checked, options, answer, single, tei)


def _check_answer_options(answer: dict[str, Any], pipe: Any) -> None:
    def fail(name: str, expected: str) -> None:
        raise RequestError(422, f"{name} must be {expected}, got {answer[name]!r}")

    def is_int(v: Any) -> bool:
        return isinstance(v, int) and not isinstance(v, bool)

    checks = {
        "top_k": (lambda v: v is None or is_int(v) and v >= 1, "a positive int"),
        "function_to_apply": (lambda v: v in (None, "softmax", "sigmoid", "none"), '"softmax", "sigmoid" or "none"'),
        "raw_scores": (lambda v: isinstance(v, bool), "true or false"),
        "truncate": (lambda v: v is None or isinstance(v, bool), "true or false"),
        "normalize": (lambda v: v is None or isinstance(v, bool), "true or false"),
        "truncation_direction": (lambda v: v in (None, "right", "Right"),
                                 '"right" (bertkit keeps a text\'s beginning)'),
        "prompt_name": (lambda v: v is None, "null (bertkit's pipelines have no prompts)"),
        "encoding_format": (lambda v: v in (None, "float"), '"float"'),
        "dimensions": (lambda v: v is None or is_int(v) and 1 <= v <= pipe.config.hidden_size,
                       f"an int in [1, {pipe.config.hidden_size}] (the model's hidden size)"),
        "aggregation_strategy": (lambda v: v in (None, "first"),
                                 '"first" (each word takes its first piece\'s tag, as bertkit\'s NER models are '
                                 'trained)'),
        "ignore_labels": (lambda v: v is None or isinstance(v, list) and all(isinstance(x, str) for x in v),
                          "a list of label names"),
        "align_to_words": (lambda v: v in (None, True), "true (answers are whole words of the context)"),
        "max_seq_len": (lambda v: v in (None, pipe.max_length),
                        f"{pipe.max_length}, this server's max_length (set with --max-length at start)"),
    }
    for name, value in answer.items():
        ok, expected = checks.get(name, (lambda v: True, ""))
        if not ok(value):
            fail(name, expected)


# ---------------------------------------------------------------------------------------------------
# answers
# ---------------------------------------------------------------------------------------------------


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


def render(pipe: Any, call: Call, results: list[Any], default_normalize: bool = False) -> Any:
    """The JSON answer to ``call``: the Inference API's shape for the task (TEI's where ``call.tei``)."""
    task, a = pipe.task, call.answer
    if task == "text-classification":
        out = [_classification(pipe.config, r, a, call.tei) for r in results]
        return (out[0] if call.tei else out) if call.single else out
    if task in EMBEDDING_TASKS and a.get("similarity"):  # cosine of the source sentence with each other one
        v = np.asarray(results, dtype=np.float64)
        v = v / np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-12)
        return (v[1:] @ v[0]).tolist()
    if task in EMBEDDING_TASKS:
        return [_embedding(r, a, default_normalize) for r in results]  # one text too gives a list of one
    if task == "token-classification":
        ignore = set(a.get("ignore_labels") or ())
        out = [[e for e in r["entities"] if e["entity_group"] not in ignore] for r in results]
    elif task == "question-answering":
        out = [_answer(r, a.get("top_k")) for r in results]
    else:
        out = results
    return out[0] if call.single else out


def model_call(pipe: Any) -> Callable[[list[Any], dict[str, Any]], list[Any]]:
    """What the model thread runs for a batch. Classifiers give their logits, so that every scoring an
    answer may ask for (softmax, sigmoid, raw scores) is computed from the same call."""
    if pipe.task == "text-classification":
        return lambda items, options: pipe.run_rows(
            [row for i, x in enumerate(items) for row in pipe.encode(pipe.check_input(x, i))])
    return lambda items, options: pipe.run(items, **options)


def metadata(pipe: Any, model_dir: str, limits: Limits, batcher: Batcher, stats: Stats) -> dict[str, Any]:
    config = pipe.config
    labels = None
    if getattr(config, "id2label", None) and pipe.task in ("text-classification", "token-classification"):
        labels = [config.id2label[i] for i in sorted(config.id2label, key=int)]
    return {"model": model_dir, "task": pipe.task, "labels": labels, "max_length": pipe.max_length,
            "device": str(pipe.device), "bf16": pipe.bf16, "quantize": pipe.quantize,
            "batching": {"max_batch_size": batcher.max_batch_size, "max_wait_ms": batcher.max_wait * 1000},
            "limits": vars(limits),
            "admission": {"admitted_inputs": batcher.inputs, "queued_requests": len(batcher.jobs),
                          "model_inputs_per_s": None if batcher.rate is None else round(batcher.rate, 1)},
            "stats": {k: v for k, v in vars(stats).items() if k != "started"},
            "uptime_s": round(time.time() - stats.started, 1)}


# ---------------------------------------------------------------------------------------------------
# HTTP
# ---------------------------------------------------------------------------------------------------


def _error_response(e: RequestError) -> Any:
    from fastapi.responses import JSONResponse

    return JSONResponse({"error": e.message, "error_type": _ERROR_TYPES.get(e.status, "validation")},
                        status_code=e.status, headers=e.headers)


async def _read_body(request: Any, limits: Limits) -> bytes:
    """The body, refused (413) as soon as it is known to be too large: from its Content-Length, or while read."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limits.max_body_bytes:
        raise RequestError(413, f"request body of {declared} bytes exceeds max_body_bytes "
                                f"{limits.max_body_bytes}")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limits.max_body_bytes:
            raise RequestError(413, f"request body exceeds max_body_bytes {limits.max_body_bytes}")
        chunks.append(chunk)
    return b"".join(chunks)


def _request_timeout(request: Any) -> float | None:
    raw = request.headers.get("x-request-timeout")
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not 0 < value <= 86_400:
        raise RequestError(400, f"X-Request-Timeout must be a number of seconds in (0, 86400], got {raw!r}")
    return value


async def _client_gone(request: Any) -> None:
    # The body is read, so the next ASGI message is http.disconnect: sent when the client closes.
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _job_result(batcher: Batcher, job: Job, request: Any) -> list[Any] | None:
    """The job's results; None if the client went away first. Dropped unless computed or running."""
    gone = asyncio.ensure_future(_client_gone(request))
    done: set = set()
    ran_out = False
    try:
        left = None if job.deadline is None else max(0.0, job.deadline - asyncio.get_running_loop().time())
        done, _ = await asyncio.wait({job.future, gone}, timeout=left, return_when=asyncio.FIRST_COMPLETED)
        # Told by the wait, not by the clock: asyncio fires a timer up to its clock resolution early, so
        # loop.time() can still read just short of the deadline when the wait has run out.
        ran_out = not done
    finally:
        gone.cancel()
        if not job.future.done():  # the client went, the deadline passed, or this task was cancelled
            batcher.drop(job, "expired" if ran_out else "abandoned")
    if job.future.done():
        return job.future.result()
    if gone in done:
        return None
    raise _expired(job.timeout, computed=job.state != "dropped")


class _Endpoints:
    """The handlers of one app. They share its pipeline, limits and counters, and the batcher, which the app
    makes when it starts (on the event loop it serves from)."""

    def __init__(self, app: Any, pipe: Any, model_dir: str, limits: Limits, stats: Stats, default_normalize: bool):
        self.app, self.pipe, self.model_dir, self.limits, self.stats = app, pipe, model_dir, limits, stats
        self.default_normalize = default_normalize
        self.batcher: Batcher | None = None

    async def answer(self, request: Any, route: str) -> Any:
        """The answer to a POST on ``route`` (predict, embed or similarity), errors included."""
        from fastapi.responses import JSONResponse, Response
        from starlette.requests import ClientDisconnect

        self.stats.requests += 1
        try:
            if self.app.state.draining:
                raise RequestError(503, "the server is shutting down; send the request to another replica",
                                   {"Retry-After": "1"})
            self.batcher.check_room()  # when full, refuse before reading and parsing the body
            self.batcher.arriving += 1
            try:
                timeout = _request_timeout(request)
                call = parse_request(await _read_body(request, self.limits), self.pipe, self.limits, route)
                job = self.batcher.admit(call.items, call.options, timeout)
            finally:
                self.batcher.arriving -= 1
                self.batcher.wake.set()  # the batch being gathered may have been waiting for this request
            results = await _job_result(self.batcher, job, request)
            if results is None:
                return Response(status_code=499)  # nginx's "client closed request": nobody reads it
            return JSONResponse(render(self.pipe, call, results, self.default_normalize))
        except ClientDisconnect:
            return Response(status_code=499)
        except RequestError as e:
            if e.status in (429, 503):
                self.stats.refused += 1
            elif e.status != 504:
                self.stats.errors += 1
            return _error_response(e)
        except BertkitError as e:  # an option's value the pipeline refuses (top_k=0, ...)
            self.stats.errors += 1
            return _error_response(RequestError(500 if isinstance(e, NonFiniteError) else 422, str(e)))

    async def health(self) -> Any:
        from fastapi.responses import JSONResponse

        if not self.batcher.alive():  # a bug stopped the loop that feeds the model: restart this replica
            return JSONResponse({"error": "the batching loop has stopped", "error_type": "unhealthy"}, 503)
        return {"status": "ok"}

    async def ready(self) -> Any:
        from fastapi.responses import JSONResponse

        batcher, limits, draining = self.batcher, self.limits, self.app.state.draining
        room = limits.max_concurrent_requests - batcher.inputs
        body = {"admitted_inputs": batcher.inputs, "max_concurrent_requests": limits.max_concurrent_requests}
        if draining or room <= 0:
            return JSONResponse({"status": "draining" if draining else "full", **body}, status_code=503,
                                headers={"Retry-After": str(batcher.retry_after())})
        return {"status": "ready", **body}

    async def meta(self) -> Any:
        return metadata(self.pipe, self.model_dir, self.limits, self.batcher, self.stats)


def create_app(pipe: Any, model_dir: str, *, max_batch_size: int = 32, max_wait_ms: float = 5.0,
               limits: Limits | None = None) -> Any:
    """The FastAPI application serving ``pipe`` (see the module docstring for the endpoints).

    ``app.state.draining = True`` makes it refuse new requests with 503 while admitted ones finish (set by
    ``serve`` on SIGTERM); ``app.state.stats`` holds the counters."""
    require_serving()
    from contextlib import asynccontextmanager

    from fastapi import FastAPI, Request

    limits = limits or Limits()
    stats = Stats()
    default_normalize = bool(getattr(pipe, "normalize", False))
    if pipe.task in EMBEDDING_TASKS:  # normalised per request (TEI's normalize): the model returns raw vectors
        pipe = copy.copy(pipe)
        pipe.normalize = False

    @asynccontextmanager
    async def lifespan(app: Any):
        endpoints.batcher = Batcher(model_call(pipe), max_batch_size, max_wait_ms, limits.max_concurrent_requests,
                                    stats)
        endpoints.batcher.start()
        yield
        await endpoints.batcher.stop()
        logger.info("bertkit serve stopped: %s", json.dumps({k: v for k, v in vars(stats).items() if k != "started"}))

    app = FastAPI(title=f"bertkit {pipe.task}", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.draining = False
    app.state.stats = stats
    endpoints = _Endpoints(app, pipe, model_dir, limits, stats, default_normalize)

    async def predict(request: Request) -> Any:
        return await endpoints.answer(request, "predict")

    async def embed(request: Request) -> Any:
        return await endpoints.answer(request, "embed")

    async def similarity(request: Request) -> Any:
        return await endpoints.answer(request, "similarity")

    # FastAPI reads the handler's annotations to inject the request; under ``from __future__ import
    # annotations`` they are strings naming an import local to this function, so give it the class.
    for handler, path in ((predict, "/predict"), (embed, "/embed"), (similarity, "/similarity")):
        handler.__annotations__["request"] = Request
        app.post(path)(handler)
    app.get("/health")(endpoints.health)
    app.get("/ready")(endpoints.ready)
    app.get("/metadata")(endpoints.meta)
    return app


def serve(s: Any) -> dict[str, Any]:
    """``bertkit serve``: load the pipeline, then serve until SIGTERM or Ctrl-C; returns the counters.

    On SIGTERM (or the first Ctrl-C) the server stops accepting connections, answers what it admitted
    (waiting at most ``graceful_shutdown_s``), and returns."""
    require_serving()
    import signal
    import threading

    import uvicorn

    from bertkit.inference import pipeline
    from bertkit.inference.base import int8_options

    pipe = pipeline(s.task, s.model_name_or_path, device=s.device, bf16=s.bf16, batch_size=s.max_batch_size,
                    max_length=s.max_length, progress=False, **int8_options(s))
    app = create_app(pipe, str(s.model_name_or_path), max_batch_size=s.max_batch_size, max_wait_ms=s.max_wait_ms,
                     limits=Limits(s.max_body_bytes, s.max_items, s.max_text_chars, s.max_concurrent_requests))

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            app.state.draining = True  # /ready says so and new requests get 503 while admitted ones finish
            super().handle_exit(sig, frame)

    server = Server(uvicorn.Config(app, host=s.host, port=s.port, log_level=s.log_level, access_log=False,
                                   timeout_graceful_shutdown=s.graceful_shutdown_s))
    logger.info("serving %s from %s on http://%s:%d (POST /predict, /embed, /similarity; GET /health, /ready, /metadata)",
                s.task, s.model_name_or_path, s.host, s.port)
    # uvicorn re-raises the signal that stopped it once it has drained; ignore that one so a drained server
    # returns its counters (exit 0) instead of being killed by the default action.
    main = threading.current_thread() is threading.main_thread()
    previous = {sig: signal.signal(sig, lambda *_: None) for sig in (signal.SIGTERM, signal.SIGINT)} if main else {}
    try:
        server.run()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return {k: v for k, v in vars(app.state.stats).items() if k != "started"}
