"""``bertkit serve``: a pipeline behind HTTP (FastAPI + uvicorn), batched and admitted by ``serve_batching``.

The app, its OpenAPI page, the start-up line and the CLI's help are built from one list of ``Route`` objects
(``ROUTES``): the routes every server has, and those the tasks declare (``tasks.Task.routes``). This module is the HTTP side: the API key, the body's size and arrival time, a client's disconnect,
draining on SIGTERM, TEI's timing headers. docs/inference.md describes every route, limit and answer.
"""

from __future__ import annotations

import asyncio
import copy
import hmac
import json
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from bertkit.errors import BertkitError, NonFiniteError, is_whole
from bertkit.inference import serve_tei
from bertkit.inference.serve_batching import (
    Batcher,
    Job,
    Stats,
    answerable,
    bound_onednn_caches,
    fix_mmap_threshold,
    model_call,
)
from bertkit.inference.serve_wire import PREDICT, Call, Limits, RequestError, Route, load_json
from bertkit.inference.tasks import SERVED, TASK_ROUTES, Task, task_named
from bertkit.settings.inference import ServeSettings, check_api_key, check_served_name

logger = logging.getLogger("bertkit")

# TEI's error types as its server sends them: its ErrorType's variant names, as serde writes an enum ("Validation"), not
# the lower-case examples of its OpenAPI page; 401 is bertkit's own (TEI answers it without a body)
_ERROR_TYPES = {429: "Overloaded", 503: "Unhealthy", 500: "Backend", 424: "Backend", 401: "Unauthorized"}


def require_serving() -> None:
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as e:
        raise BertkitError(f"bertkit serve needs FastAPI and uvicorn ({e.name} is missing): "
                           "pip install \"bertkit[serve]\"") from None


def _health(server: _Server) -> Any:
    from fastapi.responses import JSONResponse

    if not server.batcher.alive():  # a bug stopped the loop that feeds the model: restart this replica
        return JSONResponse({"error": "the batching loop has stopped", "error_type": "Unhealthy"}, 503)
    return {"status": "ok"}


def _ready(server: _Server) -> Any:
    from fastapi.responses import JSONResponse

    batcher, most, draining = server.batcher, server.limits.max_concurrent_requests, server.app.state.draining
    body = {"admitted_inputs": batcher.inputs, "max_concurrent_requests": most}
    if draining or batcher.inputs >= most:
        return JSONResponse({"status": "draining" if draining else "full", **body}, status_code=503,
                            headers={"Retry-After": str(batcher.retry_after())})
    return {"status": "ready", **body}


def _prometheus(server: _Server) -> Any:
    """``stats`` as Prometheus counters (``bertkit_<name>_total``), the admission state as gauges."""
    from fastapi.responses import PlainTextResponse

    batcher = server.batcher
    counters = {k: v for k, v in vars(server.stats).items() if k != "largest_batch"}
    gauges = {"admitted_inputs": batcher.inputs, "queued_requests": len(batcher.jobs),
              "largest_batch": server.stats.largest_batch}
    # The TYPE line names the sample (Prometheus' text format 0.0.4): one naming bertkit_requests would leave
    # bertkit_requests_total untyped
    lines = [line for name, value in counters.items()
             for line in (f"# TYPE bertkit_{name}_total counter", f"bertkit_{name}_total {value}")]
    lines += [line for name, value in gauges.items()
              for line in (f"# TYPE bertkit_{name} gauge", f"bertkit_{name} {value}")]
    return PlainTextResponse("\n".join(lines) + "\n", media_type="text/plain; version=0.0.4")


ROUTES: tuple[Route, ...] = (
    PREDICT, serve_tei.ROOT, *TASK_ROUTES, serve_tei.TOKENIZE, serve_tei.DECODE, serve_tei.INFO,
    Route("/health", "liveness, from the event loop alone (the only route without the API key)", get=_health),
    Route("/ready", "readiness: 503 with Retry-After while the admission bound is reached or the server drains",
          get=_ready),
    Route("/metrics", "Prometheus' text format: the counters and the admission state", get=_prometheus),
)


def routes_help() -> str:
    """The route list, one line per route: ``bertkit serve --help`` shows it."""
    return "routes:\n" + "\n".join(f"  {r.method:4} {r.path:28} {r.help}" for r in ROUTES)


def _error_response(e: RequestError, route: Route | None) -> Any:
    """The refusal's answer, in the body its route's clients read (``Route.error``; TEI's by default)."""
    from fastapi.responses import JSONResponse

    kind = _ERROR_TYPES.get(e.status, "Validation")
    body = route.error(e.message, kind) if route is not None and route.error else {"error": e.message,
                                                                                     "error_type": kind}
    return JSONResponse(body, status_code=e.status, headers=e.headers)


_SEND_LESS = "send fewer or shorter inputs per request, or start the server with a larger --max-body-bytes"


async def _read_body(request: Any, limits: Limits) -> bytes:
    """The body, refused (413) as soon as it is known to be too large: from its Content-Length, or while read."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limits.max_body_bytes:
        raise RequestError(413, f"request body of {declared} bytes exceeds max_body_bytes "
                                f"{limits.max_body_bytes}: {_SEND_LESS}")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limits.max_body_bytes:
            raise RequestError(413, f"request body exceeds max_body_bytes {limits.max_body_bytes}: {_SEND_LESS}")
        chunks.append(chunk)
    return b"".join(chunks)


async def _client_gone(request: Any) -> None:
    # The body is read, so the next ASGI message is http.disconnect: sent when the client closes.
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _job_result(batcher: Batcher, job: Job, request: Any) -> list[Any] | None:
    """The job's results; None if the client went away first (its job dropped unless computed or running)."""
    gone = asyncio.ensure_future(_client_gone(request))
    try:
        await asyncio.wait({job.future, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not job.future.done():  # the client went, or this task was cancelled
            batcher.drop(job)
    return None if job.future.cancelled() else job.future.result()


class _Server:
    """What the routes of one app share; the batcher is made when the app starts, on the loop it serves from."""

    def __init__(self, app: Any, pipe: Any, task: Task, limits: Limits, stats: Stats, default_normalize: bool,
                 model_name: str):
        self.app, self.pipe, self.task, self.limits, self.stats = app, pipe, task, limits, stats
        self.default_normalize = default_normalize
        self.model_name = model_name  # --served-model-name (else the directory): every answer that names the model
        self.batcher: Batcher | None = None
        self.parser = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bertkit-parse")

    async def answer(self, request: Any, route: Route) -> Any:
        """The answer to a POST on ``route``, errors included; a computed answer carries TEI's timing headers."""
        from fastapi.responses import JSONResponse, Response
        from starlette.requests import ClientDisconnect

        from bertkit.inference.base import nonfinite_in  # loaded with the model by now

        t0 = time.perf_counter()
        self.stats.requests += 1
        try:
            self._refuse_early(request, route)
            call, job, parsing = await self._parse_and_admit(request, route)
            if job is None:  # /tokenize: answered from the tokenizer alone
                return JSONResponse(route.render(self, call, []))
            results = await _job_result(self.batcher, job, request)
            if results is None:
                return Response(status_code=499)  # nginx's "client closed request": nobody reads it
            body = route.render(self, call, results)
            try:
                return JSONResponse(body, headers=self._timing(call, job, t0, parsing))
            except ValueError:  # starlette's encoder: "Out of range float values are not JSON compliant"
                # NaN and infinities are no JSON (an output -inf for every label is NaN once scored, a feature
                # -inf); the body is searched for where only then: a walk of every number costs 3x the encoding
                if (where := nonfinite_in(body)) is None:
                    raise
                raise NonFiniteError(f"the answer to {route.path} holds {where} (the path's first index is the "
                                     "input's, where the answer is a list of them): the model's outputs for that "
                                     "input overflowed, so no result was produced; the checkpoint's weights are "
                                     "broken (a diverged run?): serve one whose outputs are finite") from None
        except ClientDisconnect:
            return Response(status_code=499)
        except asyncio.CancelledError:  # uvicorn cancels what is still open once shutdown's grace period ends
            return self.refuse(RequestError(503, "the server shut down before this request was answered (its "
                                                 "graceful_shutdown_s passed, or a second Ctrl-C)",
                                            {"Connection": "close"}), route)
        except RequestError as e:
            return self.refuse(e, route)
        except BertkitError as e:  # an option's value the pipeline refuses (top_k=0, ...)
            return self.refuse(RequestError(500 if isinstance(e, NonFiniteError) else 422, str(e)), route)
        except Exception as e:  # noqa: BLE001 (a fault reading the body or writing the answer: TEI's body, as a model call's)
            return self.refuse(answerable(e, f"answering {route.path}"), route)

    def refuse(self, e: RequestError, route: Route) -> Any:
        """The answer to a refused request, counted by /metrics' one rule for refusals (docs/inference.md): once, in
        ``refused`` when the server could not take it (429, 503: send it again later), else in ``errors`` (every
        other 4xx/5xx, the API key's 401 included), beside the ``requests`` it counts in as every request to a POST
        route does."""
        if e.status in (429, 503):
            self.stats.refused += 1
        else:
            self.stats.errors += 1
        return _error_response(e, route)

    def _refuse_early(self, request: Any, route: Route) -> None:
        """The refusals that need no body: a draining server (503), a query string (422), a compressed body (415), no
        room (429)."""
        if self.app.state.draining:
            raise RequestError(503, "the server is shutting down; send the request to another replica",
                               {"Retry-After": "1"})
        if request.url.query:  # POST /predict?top_k=3 would otherwise be answered as if top_k were not sent
            raise RequestError(422, f"{route.path} takes no query parameters, got {request.url.query[:80]!r}; send "
                                    'them in the body: {"inputs": ..., "parameters": {...}}')
        encoding = request.headers.get("content-encoding", "").strip()
        if encoding.lower() not in ("", "identity"):
            # Read as JSON, a gzip body was "not valid JSON". Not decoded: TEI decodes none (its router has no
            # decompression layer), no client of these APIs compresses a request, and max_body_bytes must keep
            # bounding the bytes parsed (1 MB of gzip can expand a thousandfold).
            raise RequestError(415, f"the request body is encoded (Content-Encoding: {encoding[:40]}); this server "
                                    "reads JSON bodies as sent, uncompressed, as TEI does: send it without "
                                    "Content-Encoding (or turn off request compression in the client or proxy)",
                               {"Accept-Encoding": "identity"})
        if route.model:  # when full, refuse before reading and parsing the body
            self.batcher.check_room()

    async def _parse_and_admit(self, request: Any, route: Route) -> tuple[Call, Job | None, float]:
        """(the parsed call, its admitted job or None, seconds spent parsing). Counted as arriving meanwhile, so that
        the batcher does not close a batch this request could join."""
        self.batcher.arriving += 1
        try:
            try:  # a deadline for the whole body: a client that declares 1 MB and sends a byte is not waited on
                body = await asyncio.wait_for(_read_body(request, self.limits), self.limits.body_timeout_s)
            except asyncio.TimeoutError:
                raise RequestError(408, f"the request body did not arrive within body_timeout_s "
                                        f"{self.limits.body_timeout_s:g} s", {"Connection": "close"}) from None
            # Parsed and costed (tokenized, for QA windows and [MASK]s) off the event loop, which keeps
            # answering /health and reading other requests meanwhile.
            t_parse = time.perf_counter()
            call = await asyncio.get_running_loop().run_in_executor(
                self.parser, lambda: self._parse(route, load_json(body, self.limits)))
            t_parsed = time.perf_counter()
            job = self.batcher.admit(call.items, call.options, call.cost, max(
                call.tokens, default=self.pipe.max_length), sum(call.tokens)) if route.model else None
        finally:
            self.batcher.arriving -= 1
            self.batcher.wake.set()  # the batch being gathered may have been waiting for this request
        return call, job, t_parsed - t_parse

    def _parse(self, route: Route, data: Any) -> Call:
        """``route``'s call for the body ``data``; 424 on a route that another task declares."""
        if route.needs and route not in self.task.routes:
            tasks = " or ".join(t.name for t in SERVED if route in t.routes)
            raise RequestError(424, f"{route.path} {route.needs.format(task=self.task.name, tasks=tasks)}")
        return route.parse(data, self)

    def _timing(self, call: Call, job: Job, t0: float, parsing: float) -> dict[str, str]:
        """TEI's response headers: times in milliseconds, the characters and tokens the request computed."""
        queued = job.started_at - job.queued_at

        def ms(seconds: float) -> str:
            return str(round(seconds * 1000))

        total = ms(time.perf_counter() - t0)
        return {"x-compute-type": self.pipe.device.type, "x-compute-time": total, "x-total-time": total,
                "x-compute-characters": str(call.chars), "x-compute-tokens": str(sum(call.tokens)),
                "x-tokenization-time": ms(parsing), "x-queue-time": ms(queued),
                "x-inference-time": ms(job.finished_at - job.started_at)}


class _BearerKey:
    """ASGI middleware: every route but /health needs ``Authorization: Bearer KEY``, checked from the headers alone,
    before the body is read (401 otherwise), in constant time. The key is never logged or echoed. A refused request
    to a POST route is counted as the route would count any other refusal (``_Server.refuse``)."""

    def __init__(self, app: Any, key: str, server: _Server):
        self.app, self.key, self.server = app, key.encode(), server
        self.routes = {r.path: r for r in ROUTES}

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] != "/health":
            given = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
            scheme, _, token = given.partition(b" ")  # the scheme's case does not matter (RFC 9110 11.1)
            if not (hmac.compare_digest(token.strip(), self.key) and scheme.lower() == b"bearer"):
                refusal = RequestError(401, "this server needs an API key: send the header Authorization: Bearer "
                                            "<key> (--api-key or BERTKIT_API_KEY at its start)",
                                       {"WWW-Authenticate": "Bearer"})
                route = self.routes.get(scope["path"])
                if route is not None and scope["method"] == route.method == "POST":
                    self.server.stats.requests += 1
                    return await self.server.refuse(refusal, route)(scope, receive, send)
                return await _error_response(refusal, route)(scope, receive, send)
        await self.app(scope, receive, send)


def create_app(pipe: Any, model_dir: str, *, max_batch_size: int = 32, max_wait_ms: float = 5.0,
               limits: Limits | None = None, max_batch_tokens: int = ServeSettings.max_batch_tokens,
               api_key: str | None = None, served_model_name: str | None = None) -> Any:
    """The FastAPI application serving ``pipe`` on ``ROUTES`` (the arguments are ``bertkit serve``'s flags, with
    their defaults: ``max_batch_tokens`` TEI's 16384, which /info answers as the bound it is).
    ``app.state.draining = True`` refuses new requests with 503 while admitted ones finish (``serve`` sets it on
    SIGTERM); ``app.state.stopping.set()`` ends the model call under way at its next forward batch (the app's
    shutdown sets it); ``app.state.stats`` holds the counters."""
    require_serving()
    from contextlib import asynccontextmanager

    from fastapi import FastAPI, Request

    limits = limits or Limits()
    task = served_task(pipe.task)
    _check_server_args(pipe, max_batch_tokens, api_key, served_model_name)
    stats = Stats()
    default_normalize = bool(getattr(pipe, "normalize", False))
    stopping = threading.Event()
    pipe = _server_pipeline(pipe, stopping)

    @asynccontextmanager
    async def lifespan(app: Any):
        server.batcher = Batcher(model_call(pipe), max_batch_size, max_wait_ms,
                                 limits.max_concurrent_requests, stats, max_cost=limits.max_windows_per_request,
                                 max_tokens=max_batch_tokens)
        server.batcher.start()
        yield
        stopping.set()
        server.parser.shutdown(wait=False, cancel_futures=True)
        await server.batcher.stop()
        logger.info("bertkit serve stopped: %s", json.dumps(vars(stats)))

    app = FastAPI(title=f"bertkit {pipe.task}", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.draining = False
    app.state.stopping = stopping
    app.state.stats = stats
    name = model_dir if served_model_name is None else served_model_name
    server = _Server(app, pipe, task, limits, stats, default_normalize, name)

    def handler(route: Route) -> Any:
        async def handle(request: Request) -> Any:
            return route.get(server) if route.get else await server.answer(request, route)

        # FastAPI reads the handler's annotations to inject the request; under ``from __future__ import
        # annotations`` they are strings naming an import local to this function, so give it the class.
        handle.__annotations__["request"] = Request
        return handle

    for route in ROUTES:
        app.add_api_route(route.path, handler(route), methods=[route.method], summary=route.help)
        if route.get:  # HEAD too, as TEI's GET routes (axum's) answer it: monitors that check with HEAD
            app.add_api_route(route.path, handler(route), methods=["HEAD"], include_in_schema=False)
    if api_key is not None:
        app.add_middleware(_BearerKey, key=api_key, server=server)
    return app


def served_task(name: str) -> Task:
    """The task ``name`` names, refused unless the server serves it (``Task.not_served``: no client API has it)."""
    task = task_named(name, "bertkit serve")
    if task.not_served:
        raise BertkitError(task.not_served)
    return task


def _check_server_args(pipe: Any, max_batch_tokens: int, api_key: str | None, served_model_name: str | None) -> None:
    """Refuse a token bound that is no whole number or that no input of max_length fits in, an API key no header can
    carry, and an empty served name (the model's path would be shown in its place)."""
    if not is_whole(max_batch_tokens):  # None bounded nothing, and /info answered null where TEI's clients read a number
        raise BertkitError(f"max_batch_tokens must be a whole number >= 1, got {max_batch_tokens!r} (16384 is TEI's "
                           "default and bertkit serve's)")
    if max_batch_tokens < pipe.max_length:
        raise BertkitError(f"max_batch_tokens {max_batch_tokens} is below max_length {pipe.max_length}: one input "
                           "of max_length tokens could never be computed; raise --max-batch-tokens or lower --max-length")
    if api_key is not None:
        check_api_key(api_key, "api_key")
    if served_model_name is not None:
        check_served_name(served_model_name, "served_model_name")


def _check_address(host: str, port: int) -> None:
    """Refuse, before the model loads, an address the server could not listen on: a host that does not resolve, a
    port in use or not this user's to take. uvicorn would find out only after the model loaded and warmed up, and
    exit 3 with its own message. A socket is bound (with SO_REUSEADDR, as uvicorn binds) and closed again."""
    import errno
    import socket

    where = f"--host {host} --port {port}"
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                             flags=socket.AI_PASSIVE)[0]
    except socket.gaierror as e:
        raise BertkitError(f"{where}: the host does not resolve ({e.strerror}); give an address of this machine "
                           "(127.0.0.1: this machine only; 0.0.0.0: every interface) or a name that resolves "
                           "to one") from None
    try:
        with socket.socket(family, kind, proto) as probe:  # an IPv6 host where IPv6 is off fails here already
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(address)
    except OSError as e:
        fix = {errno.EADDRINUSE: "another process listens there: stop it, or choose another --port",
               errno.EACCES: "ports below 1024 need privileges: choose a port from 1024",
               errno.EADDRNOTAVAIL: "no interface of this machine has that address: give one of its own"}
        raise BertkitError(f"{where}: cannot listen there ({e.strerror}); "
                           f"{fix.get(e.errno, 'choose another --host or --port')}") from None


def _server_pipeline(pipe: Any, stopping: threading.Event) -> Any:
    """The server's own copy of ``pipe``: it stops at its next forward batch once ``stopping`` is set, and leaves
    normalising embeddings to each request (TEI's ``normalize``)."""
    pipe = copy.copy(pipe)
    if hasattr(pipe, "normalize"):
        pipe.normalize = False
    forward = pipe.forward

    def forward_until_stopped(batch: Any, rows: Any) -> Any:
        # Checked before each forward batch: once shutdown's grace period is over, a long model call ends at
        # its next batch instead of holding the process until it completes.
        if stopping.is_set():
            raise RequestError(503, "the server stopped before this request's model call finished")
        return forward(batch, rows)

    pipe.forward = forward_until_stopped
    return pipe


def warm_up(pipe: Any) -> None:
    """One forward pass of 16 x 128 tokens before the server accepts requests, so that what a process's first large
    call pays (int8's compiled activation quantization) is paid at start-up, not in a request."""
    import torch

    from bertkit.quantization.kernels import compiled_quantize_per_token

    compiled_quantize_per_token.compile_next()
    ids = torch.full((16, min(pipe.max_length, 128)), pipe.tokenizer.unk_token_id, device=pipe.device)
    t0 = time.perf_counter()
    with torch.inference_mode(), torch.autocast(pipe.device.type, dtype=torch.bfloat16, enabled=pipe.bf16):
        pipe.model(input_ids=ids, attention_mask=torch.ones_like(ids), token_type_ids=torch.zeros_like(ids))
    logger.info("warmed up before serving (%.1f s)", time.perf_counter() - t0)


def settings_served(task: Any) -> tuple[str, ...]:
    """The task-bound settings ``bertkit serve`` reads for ``task``: its pipeline's (``load_settings``), and the
    limits on an answer's size, which only a task taking top_k reads (--max-top-k), and --max-candidates only one
    whose answer holds top_k of something per input (fill-mask's [MASK]s, question-answering's questions): given
    to another task they limited nothing, without a word."""
    takes_top_k = "top_k" in (*task.predict_options, *task.answer_params)
    return (*task.load_settings, *(("max_top_k",) if takes_top_k else ()),
            *(("max_candidates",) if task.candidates_per else ()))


def serve(s: Any) -> dict[str, Any]:
    """``bertkit serve``: load the pipeline, serve until SIGTERM or Ctrl-C (then answer what was admitted, waiting at
    most ``graceful_shutdown_s``), and return the counters."""
    require_serving()
    import signal

    import uvicorn

    from bertkit.inference import pipeline
    from bertkit.inference.base import int8_options
    from bertkit.inference.files import refuse_unread

    task = served_task(s.task)  # refused before the model loads, as --pooling or --prompt-name it does not read
    refuse_unread(task, s, "bertkit serve", settings_served)
    task.check_settings(s)  # a --max-length no request could run with by default, before the model loads
    _check_address(s.host, s.port)
    fix_mmap_threshold()  # the server's process only: its memory stays flat under mixed traffic (serve_batching)
    bound_onednn_caches()  # likewise for oneDNN's kernels, before the model's loading builds the first one
    pipe = pipeline(s.task, s.model_name_or_path, device=s.device, bf16=s.bf16, batch_size=s.max_batch_size,
                    max_length=s.max_length, progress=False, **task.load_options(s), **int8_options(s))
    task.check_loaded(pipe, s)
    warm_up(pipe)
    app = create_app(pipe, str(s.model_name_or_path), max_batch_size=s.max_batch_size, max_wait_ms=s.max_wait_ms,
                     limits=Limits.from_settings(s), max_batch_tokens=s.max_batch_tokens, api_key=s.api_key,
                     served_model_name=s.served_model_name)

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            app.state.draining = True  # /ready says so and new requests get 503 while admitted ones finish
            super().handle_exit(sig, frame)

    server = Server(uvicorn.Config(app, host=s.host, port=s.port, log_level=s.log_level, access_log=False,
                                   timeout_graceful_shutdown=s.graceful_shutdown_s))
    paths = "; ".join(f"{m} {', '.join(r.path for r in ROUTES if r.method == m)}" for m in ("POST", "GET"))
    logger.info("serving %s from %s (%s%s on %s) on http://%s:%d (%s); %s", s.task, s.model_name_or_path,
                f"int8 ({k.name}, {k.activation_bits}-bit activations), the rest in "
                if pipe.quantize and (k := pipe.precision.kernel) else "", pipe.precision.dtype, pipe.device, s.host, s.port, paths,
                "every route but /health is protected by an API key" if s.api_key is not None else
                "the routes are NOT protected: anyone who reaches this address can use them (set BERTKIT_API_KEY "
                "or --api-key to require a key)")
    # uvicorn re-raises the signal that stopped it once it has drained; ignore that one so a drained server
    # returns its counters (exit 0) instead of being killed by the default action.
    main = threading.current_thread() is threading.main_thread()
    previous = {sig: signal.signal(sig, lambda *_: None) for sig in (signal.SIGTERM, signal.SIGINT)} if main else {}
    try:
        server.run()
    finally:
        # A second Ctrl-C (uvicorn's force quit) skips the app's shutdown, which stops the model call under way:
        # stopped here, it ends at its next forward batch instead of holding the process until all of it is computed.
        app.state.stopping.set()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return dict(vars(app.state.stats))
