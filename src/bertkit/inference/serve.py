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
SIGTERM admitted requests finish (at most ``graceful_shutdown_s``, a deadline for every connection and for
the model call under way). A client that leaves frees its admitted inputs at once, even while they compute.

Limits (``Limits``; docs/inference.md, "Limits"), each a 4xx naming it, all checked before any model work:
``max_body_bytes`` and ``max_json_depth`` (413, the depth measured on the bytes before parsing),
``body_timeout_s`` (408), ``max_items``, ``max_text_chars``, ``max_windows_per_request`` (what one request
costs the model: QA windows, choices, [MASK]s; counted from token counts), ``max_top_k`` and
``max_candidates`` (422). Every field and parameter must be one the route takes, in its range, or it is
refused by name (422); a repeated key or NaN is not JSON (400). Errors are ``{"error", "error_type"}``.
Requests are parsed, checked and costed, and answers rendered, in ``serve_wire`` (the wire format); this
module is the HTTP side, the batching and the admission.
"""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from bertkit.errors import BertkitError, NonFiniteError
from bertkit.inference.serve_wire import (  # the wire format; Limits and parse_request are also used from here
    DEFAULT_MAX_CONCURRENT_REQUESTS,
    EMBEDDING_TASKS,
    Call,
    Limits,
    RequestError,
    json_depth,
    parse_request,
    render,
)

__all__ = ["DEFAULT_MAX_CONCURRENT_REQUESTS", "EMBEDDING_TASKS", "Batcher", "Call", "Limits", "RequestError", "Stats",
           "create_app", "json_depth", "metadata", "model_call", "parse_request", "render", "require_serving", "serve"]

logger = logging.getLogger("bertkit")

_ERROR_TYPES = {429: "overloaded", 503: "unhealthy", 504: "timeout", 500: "backend", 424: "backend"}


def require_serving() -> None:
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as e:
        raise BertkitError(f"bertkit serve needs FastAPI and uvicorn ({e.name} is missing): "
                           "pip install \"bertkit[serve]\"") from None


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
    cost: int = 1  # model sequences (windows, choices, [MASK]s): a call carries at most max_windows_per_request
    longest: int = 0  # tokens of its longest sequence (max_length where not counted): bounds a call's padded tokens
    tokens: int = 0  # its sequences' tokens, where counted
    queued_at: float = field(default_factory=time.perf_counter)
    started_at: float | None = None  # its model call's start and end (perf_counter)
    finished_at: float | None = None
    state: str = "queued"  # queued -> running -> done, or queued -> dropped
    wanted: bool = True  # False once its client has gone or its deadline passed
    released: bool = False  # its inputs no longer count against the admission bound


class Batcher:
    """Admits requests up to ``max_inputs`` inputs, gathers them into calls of ``run`` (at most
    ``max_batch_size`` inputs unless one request alone has more, and at most ``max_cost`` model sequences), and
    runs them on one model thread."""

    def __init__(self, run: Callable[[list[Any], dict[str, Any]], list[Any]], max_batch_size: int,
                 max_wait_ms: float, max_inputs: int, stats: Stats, max_cost: int | None = None,
                 max_tokens: int | None = None, on_call: Callable[[int, int, int, float], None] | None = None):
        self.run = run
        self.max_batch_size = max_batch_size
        self.max_cost = max_cost
        self.max_tokens = max_tokens  # padded tokens (sequences x the longest) one call may carry
        self.on_call = on_call  # (inputs, tokens, padded tokens, seconds) of each model call: the metrics
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

    def admit(self, items: list[Any], options: dict[str, Any], timeout: float | None, cost: int | None = None,
              longest: int = 0, tokens: int = 0) -> Job:
        n = len(items)
        self.check_room(n)
        loop = asyncio.get_running_loop()
        job = Job(items, options, loop.create_future(), None if timeout is None else loop.time() + timeout, timeout,
                  n if cost is None else cost, longest, tokens)
        self.inputs += n
        self.jobs.append(job)
        self.wake.set()
        return job

    def drop(self, job: Job, reason: str) -> None:
        """The job's client has gone or its deadline passed: never compute it. One already in a model call
        finishes there (its result is discarded), but its inputs stop counting against the admission bound now:
        nobody waits for them, so they must not turn the next request away."""
        job.wanted = False
        if job.state == "queued":
            job.state = "dropped"
            setattr(self.stats, reason, getattr(self.stats, reason) + len(job.items))
        self._release(job)

    def _release(self, job: Job) -> None:
        if not job.released:
            job.released = True
            self.inputs -= len(job.items)

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
        size = cost = longest = 0
        limit, tokens = self.max_cost or math.inf, self.max_tokens or math.inf
        for job in self.jobs:
            if not self._live(job, now):
                continue
            if batch and (size + len(job.items) > self.max_batch_size or cost + job.cost > limit
                          or (cost + job.cost) * max(longest, job.longest) > tokens):
                return batch, True
            batch.append(job)
            size += len(job.items)
            cost += job.cost
            longest = max(longest, job.longest)
            if size >= self.max_batch_size or cost >= limit or cost * longest >= tokens:
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
        for job in jobs:
            job.started_at = t0
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
        t1 = time.perf_counter()
        elapsed = t1 - t0
        rate = len(items) / max(elapsed, 1e-6)
        self.rate = rate if self.rate is None else 0.7 * self.rate + 0.3 * rate
        self.stats.items += len(items)
        self.stats.batches += 1
        self.stats.largest_batch = max(self.stats.largest_batch, len(items))
        if self.on_call is not None:
            self.on_call(len(items), sum(j.tokens for j in jobs),
                         sum(j.cost for j in jobs) * max(j.longest for j in jobs), elapsed)
        at = 0
        for job in jobs:
            job.finished_at = t1
            self._finish(job, results[at:at + len(job.items)])
            at += len(job.items)

    def _finish(self, job: Job, results: list[Any] | None = None, exception: BaseException | None = None) -> None:
        job.state = "done"
        self._release(job)
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


def model_call(pipe: Any, per_token: Any = None) -> Callable[[list[Any], dict[str, Any]], list[Any]]:
    """What the model thread runs for a batch. Classifiers give their logits, so that every scoring an
    answer may ask for (softmax, sigmoid, raw scores) is computed from the same call; a reranker's (query, text)
    pairs (option ``pairs``) too. Embedding inputs may come encoded (``serve_tei.Encoded``: token ids, or texts
    tokenized while parsing); option ``pooling="none"`` runs them on ``per_token``, the pipeline's copy that
    gives every token's state (/embed_all)."""
    if pipe.task in EMBEDDING_TASKS:
        def embed(items: list[Any], options: dict[str, Any]) -> list[Any]:
            rows = [x.row() if isinstance(x, Encoded) else pipe.encode(pipe.check_input(x, i))[0]
                    for i, x in enumerate(items)]
            return (per_token if options.get("pooling") == "none" else pipe).run_rows(rows)

        return embed
    if pipe.task == "rerank":
        return lambda items, options: (pipe.run_rows([row for q, t in items for row in pipe.encode_pair((q, t))])
                                       if options.get("pairs") else pipe.run(items, **options))
    if pipe.task == "text-classification":
        return lambda items, options: pipe.run_rows(
            [row for i, x in enumerate(items) for row in pipe.encode(pipe.check_input(x, i))])
    if pipe.task == "multiple-choice":
        return lambda items, options: [r for chunk in _by_choices(items, pipe.batch_size) for r in pipe.run(chunk)]
    return lambda items, options: pipe.run(items, **options)


def _by_choices(items: list[dict[str, Any]], most: int) -> list[list[dict[str, Any]]]:
    """Multiple-choice inputs in runs of at most ``most`` choices together. The pipeline batches inputs, each
    carrying all its choices, so a batch of 32 inputs of 8 choices is one forward over 256 sequences (2 GB of
    attention for MiniLM at 400 tokens); cut this way a forward holds no more sequences than other tasks'."""
    chunks: list[list[dict[str, Any]]] = []
    size = most
    for item in items:
        if size + len(item["choices"]) > most:
            chunks.append([])
            size = 0
        chunks[-1].append(item)
        size += len(item["choices"])
    return chunks


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
        self.parser = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bertkit-parse")

    async def answer(self, request: Any, route: str) -> Any:
        """The answer to a POST on ``route`` (predict, embed or similarity), errors included."""
        from fastapi.responses import JSONResponse, Response
        from starlette.requests import ClientDisconnect

        self.stats.requests += 1
        try:
            if self.app.state.draining:
                raise RequestError(503, "the server is shutting down; send the request to another replica",
                                   {"Retry-After": "1"})
            if request.url.query:  # POST /predict?top_k=3 would otherwise be answered as if top_k were not sent
                raise RequestError(422, f"/{route} takes no query parameters, got {request.url.query[:80]!r}; send "
                                        'them in the body: {"inputs": ..., "parameters": {...}}')
            self.batcher.check_room()  # when full, refuse before reading and parsing the body
            self.batcher.arriving += 1
            try:
                timeout = _request_timeout(request)
                try:  # a deadline for the whole body: a client that declares 1 MB and sends a byte is not waited on
                    body = await asyncio.wait_for(_read_body(request, self.limits), self.limits.body_timeout_s)
                except asyncio.TimeoutError:
                    raise RequestError(408, f"the request body did not arrive within body_timeout_s "
                                            f"{self.limits.body_timeout_s:g} s", {"Connection": "close"}) from None
                # Parsed and costed (tokenized, for QA windows and [MASK]s) off the event loop, which keeps
                # answering /health and reading other requests meanwhile.
                call = await asyncio.get_running_loop().run_in_executor(
                    self.parser, parse_request, body, self.pipe, self.limits, route)
                job = self.batcher.admit(call.items, call.options, timeout, call.cost)
            finally:
                self.batcher.arriving -= 1
                self.batcher.wake.set()  # the batch being gathered may have been waiting for this request
            results = await _job_result(self.batcher, job, request)
            if results is None:
                return Response(status_code=499)  # nginx's "client closed request": nobody reads it
            return JSONResponse(render(self.pipe, call, results, self.default_normalize))
        except ClientDisconnect:
            return Response(status_code=499)
        except asyncio.CancelledError:  # uvicorn cancels what is still open when shutdown's grace period ends
            self.stats.refused += 1
            return _error_response(RequestError(503, "the server shut down (its graceful_shutdown_s passed) before "
                                                     "this request was answered", {"Connection": "close"}))
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
    pipe = copy.copy(pipe)  # the server's own: its forward stops at shutdown, embeddings are normalised per request
    if pipe.task in EMBEDDING_TASKS:  # normalised per request (TEI's normalize): the model returns raw vectors
        pipe.normalize = False
    stopping = threading.Event()
    forward = pipe.forward

    def forward_until_stopped(batch: Any, rows: Any) -> Any:
        # Checked before each forward batch: once shutdown's grace period is over, a long model call ends at its
        # next batch instead of holding the process until it completes.
        if stopping.is_set():
            raise RequestError(503, "the server stopped before this request's model call finished")
        return forward(batch, rows)

    pipe.forward = forward_until_stopped

    @asynccontextmanager
    async def lifespan(app: Any):
        endpoints.batcher = Batcher(model_call(pipe), max_batch_size, max_wait_ms, limits.max_concurrent_requests,
                                    stats, max_cost=limits.max_windows_per_request)
        endpoints.batcher.start()
        yield
        stopping.set()
        endpoints.parser.shutdown(wait=False, cancel_futures=True)
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

    import uvicorn

    from bertkit.inference import pipeline
    from bertkit.inference.base import int8_options

    pipe = pipeline(s.task, s.model_name_or_path, device=s.device, bf16=s.bf16, batch_size=s.max_batch_size,
                    max_length=s.max_length, progress=False, **int8_options(s))
    app = create_app(pipe, str(s.model_name_or_path), max_batch_size=s.max_batch_size, max_wait_ms=s.max_wait_ms,
                     limits=s.limits())

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
