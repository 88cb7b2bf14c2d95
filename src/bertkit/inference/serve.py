"""``bertkit serve``: a pipeline behind HTTP, with dynamic batching.

Why FastAPI + uvicorn: both are widely used and well kept, asyncio-native (thousands of waiting requests
cost no threads), and what most people who serve transformers models already run; the request handling
is ours and small (we parse and check the JSON ourselves, so every error message names its limit).
LitServe would bring its own batching loop and worker processes; one process owning one model, with the
batching below, is simpler to reason about and is what makes bertkit's unpadded batches pay off.

Endpoints (the request body follows Hugging Face's Inference API: ``{"inputs": ..., "parameters": {...}}``):

- ``POST /predict``: ``inputs`` is one input or a list of inputs of the task's pipeline (a text, a
  ``[text, text_pair]`` pair or ``{"text", "text_pair"}``; ``{"question", "context"}``; ...). One input
  gives one result, a list gives the list, in order (a pair inside a list may be ``[text, text_pair]``). ``parameters`` are the pipeline's call options
  (``top_k``, ...).
- ``GET /health``: ``{"status": "ok"}`` once the model is loaded.
- ``GET /metadata``: model, task, labels, max length, the limits, and counters (requests, batches, items).

Dynamic batching: requests arriving within ``max_wait_ms`` of each other (up to ``max_batch_size`` inputs)
are run as one pipeline call, whose inputs are grouped by length so padding stays near zero; one worker
thread owns the model. Limits, each a 4xx naming it: ``max_body_bytes`` (413), ``max_items`` per request
(422), ``max_text_chars`` per input (422); malformed JSON is a 400, a wrong shape or type a 422.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from bertkit.errors import BertkitError, NonFiniteError

logger = logging.getLogger("bertkit")


def require_serving() -> None:
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as e:
        raise BertkitError(f"bertkit serve needs FastAPI and uvicorn ({e.name} is missing): "
                           "pip install \"bertkit[serve]\"") from None


class RequestError(Exception):
    """A request the server refuses: an HTTP status and a message for the client."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass
class Limits:
    max_body_bytes: int = 1_000_000
    max_items: int = 64
    max_text_chars: int = 20_000


@dataclass
class Stats:
    requests: int = 0
    items: int = 0
    batches: int = 0
    largest_batch: int = 0
    errors: int = 0
    started: float = field(default_factory=time.time)


def _chars(item: Any) -> int:
    if isinstance(item, str):
        return len(item)
    if isinstance(item, dict):
        return sum(_chars(v) for v in item.values())
    if isinstance(item, (list, tuple)):
        return sum(_chars(v) for v in item)
    return 0


class Batcher:
    """Gathers the inputs of concurrent requests into pipeline calls of at most ``max_batch_size`` inputs,
    waiting at most ``max_wait_ms`` after the first for others to join; one thread runs the model."""

    def __init__(self, pipe: Any, max_batch_size: int, max_wait_ms: float, stats: Stats):
        self.pipe = pipe
        self.max_batch_size = max_batch_size
        self.max_wait = max_wait_ms / 1000.0
        self.stats = stats
        self.queue: asyncio.Queue = asyncio.Queue()
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bertkit-model")
        self.task: asyncio.Task | None = None

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            try:
                await self.task
            except asyncio.CancelledError:
                pass
        self.executor.shutdown(wait=True)

    async def submit(self, items: list[Any], options: dict[str, Any]) -> list[Any]:
        future = asyncio.get_running_loop().create_future()
        await self.queue.put((items, options, future))
        return await future

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            first = await self.queue.get()
            pending = [first]
            size = len(first[0])
            deadline = loop.time() + self.max_wait
            while size < self.max_batch_size:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                try:
                    nxt = await asyncio.wait_for(self.queue.get(), remaining)
                except asyncio.TimeoutError:
                    break
                pending.append(nxt)
                size += len(nxt[0])
            # Requests with other call options (top_k, ...) cannot share a call: one call per option set.
            groups: dict[str, list] = {}
            for req in pending:
                groups.setdefault(json.dumps(req[1], sort_keys=True), []).append(req)
            for reqs in groups.values():
                await self._run(reqs, reqs[0][1])

    async def _run(self, reqs: list, options: dict[str, Any]) -> None:
        """One pipeline call for ``reqs``; each request's future gets its own slice of the results.

        If the shared call fails and several requests were in it, the input that made it fail may be any one
        of them (a fill-mask text whose [MASK] falls past max_length, ...): each is then run alone, so only the
        request that caused the error gets it and the others their results.
        """
        loop = asyncio.get_running_loop()
        items = [x for r in reqs for x in r[0]]
        try:
            results = await loop.run_in_executor(self.executor, lambda: self.pipe.run(items, **options))
        except Exception as e:  # noqa: BLE001 (handed to the waiting request, which answers it as an HTTP error)
            if len(reqs) > 1:
                for r in reqs:
                    await self._run([r], options)
                return
            if not reqs[0][2].done():
                reqs[0][2].set_exception(e)
            return
        self.stats.batches += 1
        self.stats.largest_batch = max(self.stats.largest_batch, len(items))
        at = 0
        for r in reqs:
            if not r[2].done():
                r[2].set_result(results[at:at + len(r[0])])
            at += len(r[0])


def parse_request(body: bytes, pipe: Any, limits: Limits) -> tuple[list[Any], dict[str, Any], bool]:
    """The request's inputs (checked by the pipeline), call options and whether one input was sent."""
    if len(body) > limits.max_body_bytes:
        raise RequestError(413, f"request body of {len(body)} bytes exceeds max_body_bytes {limits.max_body_bytes}")
    try:
        data = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RequestError(400, f"the body is not valid JSON: {e}") from None
    if not isinstance(data, dict) or "inputs" not in data:
        raise RequestError(422, 'the body must be a JSON object {"inputs": ..., "parameters": {...}}')
    unknown = sorted(set(data) - {"inputs", "parameters"})
    if unknown:
        raise RequestError(422, f"unknown field(s) {', '.join(unknown)}; the body holds inputs and parameters")
    options = data.get("parameters") or {}
    if not isinstance(options, dict):
        raise RequestError(422, f"parameters must be an object, got {type(options).__name__}")
    bad = sorted(set(options) - set(pipe.call_options))
    if bad:
        raise RequestError(422, f"{pipe.task} takes no parameter(s) {', '.join(bad)}; it takes "
                                f"{', '.join(pipe.call_options) or 'none'}")
    raw = data["inputs"]  # a list is always several inputs: a pair is {"text", "text_pair"} or [[a, b]]
    single = not isinstance(raw, list)
    items = [raw] if single else raw
    if not items:
        raise RequestError(422, "inputs is an empty list")
    if len(items) > limits.max_items:
        raise RequestError(422, f"{len(items)} inputs exceed max_items {limits.max_items} per request")
    checked = []
    for i, item in enumerate(items):
        if isinstance(item, list):
            item = tuple(item)  # JSON has no tuples: [text, text_pair]
        n = _chars(item)
        if n > limits.max_text_chars:
            raise RequestError(422, f"input {i} has {n} characters, over max_text_chars {limits.max_text_chars}")
        try:
            pipe.check_input(item, i)  # refused here, as a 422, rather than inside a shared batch
            checked.append(item)
        except BertkitError as e:
            raise RequestError(422, str(e)) from None
    return checked, options, single


def metadata(pipe: Any, model_dir: str, limits: Limits, batcher: Batcher, stats: Stats) -> dict[str, Any]:
    config = pipe.config
    labels = None
    if getattr(config, "id2label", None) and pipe.task in ("text-classification", "token-classification"):
        labels = [config.id2label[i] for i in sorted(config.id2label, key=int)]
    return {"model": model_dir, "task": pipe.task, "labels": labels, "max_length": pipe.max_length,
            "device": str(pipe.device), "bf16": pipe.bf16,
            "batching": {"max_batch_size": batcher.max_batch_size, "max_wait_ms": batcher.max_wait * 1000},
            "limits": vars(limits), "stats": {k: v for k, v in vars(stats).items() if k != "started"},
            "uptime_s": round(time.time() - stats.started, 1)}


def create_app(pipe: Any, model_dir: str, *, max_batch_size: int = 32, max_wait_ms: float = 5.0,
               limits: Limits | None = None) -> Any:
    """The FastAPI application serving ``pipe`` (see the module docstring for the endpoints)."""
    require_serving()
    from contextlib import asynccontextmanager

    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse

    limits = limits or Limits()
    stats = Stats()
    state: dict[str, Batcher] = {}

    @asynccontextmanager
    async def lifespan(app: Any):
        state["batcher"] = Batcher(pipe, max_batch_size, max_wait_ms, stats)
        state["batcher"].start()
        yield
        await state["batcher"].stop()

    app = FastAPI(title=f"bertkit {pipe.task}", lifespan=lifespan, docs_url=None, redoc_url=None)

    async def read_body(request: Request) -> bytes:
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

    async def predict(request: Request) -> Any:
        stats.requests += 1
        try:
            items, options, single = parse_request(await read_body(request), pipe, limits)
            stats.items += len(items)
            results = await state["batcher"].submit(items, options)
        except RequestError as e:
            stats.errors += 1
            return JSONResponse({"error": e.message}, status_code=e.status)
        except BertkitError as e:  # an option's value the pipeline refuses (top_k=0, ...)
            stats.errors += 1
            return JSONResponse({"error": str(e)}, status_code=500 if isinstance(e, NonFiniteError) else 422)
        return JSONResponse(results[0] if single else results)

    # FastAPI reads the handler's annotations to inject the request; under ``from __future__ import
    # annotations`` they are strings naming an import local to this function, so give it the class.
    predict.__annotations__["request"] = Request
    app.post("/predict")(predict)

    @app.get("/health")
    async def health() -> Any:
        return {"status": "ok"}

    @app.get("/metadata")
    async def meta() -> Any:
        return metadata(pipe, model_dir, limits, state["batcher"], stats)

    return app


def serve(s: Any) -> dict[str, Any]:
    """``bertkit serve``: load the pipeline, then run uvicorn until interrupted (Ctrl-C)."""
    require_serving()
    import uvicorn

    from bertkit.inference import pipeline

    pipe = pipeline(s.task, s.model_name_or_path, device=s.device, bf16=s.bf16, batch_size=s.max_batch_size,
                    max_length=s.max_length, progress=False)
    app = create_app(pipe, str(s.model_name_or_path), max_batch_size=s.max_batch_size, max_wait_ms=s.max_wait_ms,
                     limits=Limits(s.max_body_bytes, s.max_items, s.max_text_chars))
    logger.info("serving %s from %s on http://%s:%d (POST /predict, GET /health, GET /metadata)", s.task,
                s.model_name_or_path, s.host, s.port)
    uvicorn.run(app, host=s.host, port=s.port, log_level=s.log_level, access_log=False)
    return None  # type: ignore[return-value]
