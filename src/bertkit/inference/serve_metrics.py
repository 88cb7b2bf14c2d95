"""``GET /metrics`` of ``bertkit serve``: Prometheus' text format, through prometheus_client (the serve extra).

Each app owns a ``CollectorRegistry`` (never the process-wide one), so several apps in one process (tests, a
benchmark) count apart. What is counted: requests by route and status (an ASGI middleware sees every answer,
401 and 413 included), latency histograms (time queued before the model, inside the model call, the whole
request), model-call sizes in inputs and padded tokens, the inputs and tokens computed, refusals by status
(every 4xx/5xx answer), and the admission state (inputs admitted and not answered, requests queued).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

_LATENCY = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
_TOKENS = (64, 256, 1024, 2048, 4096, 8192, 16384, 32768, 65536)


class Metrics:
    """The counters, histograms and gauges of one app, in their own registry. Requests are counted by route for the
    app's ``routes`` (its paths); any other path is counted as "other", so that a scan of random paths cannot grow
    the label set without bound."""

    def __init__(self, admitted: Callable[[], float], queued: Callable[[], float], routes: Iterable[str]):
        import prometheus_client as p  # the serve extra, checked by serve.require_serving

        self.p, self.routes = p, frozenset(routes)
        self.registry = p.CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = p.Counter("bertkit_requests", "HTTP requests answered, by route and status",
                                  ("route", "status"), registry=r)
        self.refusals = p.Counter("bertkit_refusals", "requests refused (4xx/5xx answers), by status", ("status",),
                                  registry=r)
        self.total_time = p.Histogram("bertkit_request_duration_seconds", "time from a request's arrival to its "
                                      "answer, by route", ("route",), buckets=_LATENCY, registry=r)
        self.queue_time = p.Histogram("bertkit_queue_duration_seconds", "time an admitted request waited before "
                                      "its model call", buckets=_LATENCY, registry=r)
        self.inference_time = p.Histogram("bertkit_inference_duration_seconds", "duration of model calls",
                                          buckets=_LATENCY, registry=r)
        self.batch_size = p.Histogram("bertkit_batch_size", "inputs per model call", buckets=_SIZES, registry=r)
        self.batch_tokens = p.Histogram("bertkit_batch_tokens", "padded tokens per model call (inputs x the "
                                        "longest), where the requests' tokens were counted", buckets=_TOKENS,
                                        registry=r)
        self.inputs = p.Counter("bertkit_inputs", "inputs the model computed", registry=r)
        self.tokens = p.Counter("bertkit_tokens", "tokens of the inputs computed, where counted", registry=r)
        depth = p.Gauge("bertkit_admitted_inputs", "inputs admitted and not yet answered (queued or in the model)",
                        registry=r)
        depth.set_function(admitted)
        waiting = p.Gauge("bertkit_queued_requests", "admitted requests waiting for a model call", registry=r)
        waiting.set_function(queued)

    def model_call(self, inputs: int, tokens: int, padded: int, seconds: float) -> None:
        self.batch_size.observe(inputs)
        self.inputs.inc(inputs)
        self.inference_time.observe(seconds)
        if tokens:
            self.tokens.inc(tokens)
            self.batch_tokens.observe(padded)

    def answered(self, path: str, status: int, seconds: float) -> None:
        route = path if path in self.routes else "other"
        self.requests.labels(route, str(status)).inc()
        self.total_time.labels(route).observe(seconds)
        if status >= 400:
            self.refusals.labels(str(status)).inc()

    def exposition(self) -> tuple[bytes, str]:
        """The text format and its content type."""
        return self.p.generate_latest(self.registry), self.p.CONTENT_TYPE_LATEST


class CountRequests:
    """ASGI middleware: every HTTP answer counted by route and status, with its total time."""

    def __init__(self, app: Any, metrics: Metrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        status = [500]

        async def sending(message: dict) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            self.metrics.answered(scope["path"], status[0], time.perf_counter() - t0)
