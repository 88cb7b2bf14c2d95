"""The batching and admission of ``bertkit serve``: requests admitted up to a bound of inputs (429 beyond it),
gathered into model calls bounded in inputs, model sequences and padded tokens, and run on one model thread;
work whose client left is dropped before the model."""

from __future__ import annotations

import asyncio
import ctypes
import logging
import math
import os
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from bertkit.errors import BertkitError
from bertkit.inference.serve_wire import RequestError

logger = logging.getLogger("bertkit")


@dataclass
class Stats:
    """The server's counters: /metrics exposes them, ``serve`` returns them."""

    # requests to the routes that parse a body (/predict, /embed, /v1/embeddings, /rerank, ...), however answered
    # (the API key's 401 included); a refused one counts once more, in refused or in errors
    requests: int = 0
    items: int = 0  # inputs the model computed
    tokens: int = 0  # their tokens, where counted
    batches: int = 0  # pipeline calls
    model_seconds: float = 0.0  # time inside them
    largest_batch: int = 0
    refused: int = 0  # requests answered 429/503: the admission bound reached, or draining
    abandoned: int = 0  # inputs dropped before the model: their client disconnected
    errors: int = 0  # other 4xx/5xx answers (401, 408, 413, 415, 422, 424, 500)


# glibc keeps freed blocks in per-thread arenas and raises its mmap threshold as large blocks come and go, so under
# mixed traffic resident memory climbs to the worst mix of calls; the two fixes below hold it flat (docs/inference.md,
# the soak). musl and macOS return memory themselves and lack them.
try:
    _LIBC = ctypes.CDLL(None)  # the process's own symbols, the C library's among them
except (OSError, TypeError):  # Windows has no such handle
    _LIBC = None
TRIM_EVERY_S = 10.0  # how often, at most, freed heap memory is handed back after a model call
MALLOC_TRIM = (lambda: _LIBC.malloc_trim(0)) if hasattr(_LIBC, "malloc_trim") else None
M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number (malloc.h)


def fix_mmap_threshold() -> bool:
    """Hold glibc's mmap threshold at its starting value, 128 KiB, so that every activation block above it is
    its own mapping, returned the moment it is freed; True when set. Left alone when the user chose a threshold
    (GLIBC_TUNABLES, MALLOC_MMAP_THRESHOLD_), and off glibc."""
    if "mmap_threshold" in os.environ.get("GLIBC_TUNABLES", "") or "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    return hasattr(_LIBC, "mallopt") and _LIBC.mallopt(M_MMAP_THRESHOLD, 128 * 1024) == 1


# oneDNN's Linear (fp32's inference.prepare.PreparedLinear, int8's quantized one) builds kernels for every new row
# count a model call meets (its tokens), about four a count, and oneDNN and PyTorch's ideep each keep the 1,024 most
# recent: calls of 1-32 texts kept 429 MiB once full (fp32; int8 279). At 512 entries each they keep 230 (int8 157),
# and traffic whose counts repeat builds about what the defaults build (one text a call, 39 counts: the same kernels;
# 1-8 texts, 109 counts: 19% more in fp32, at 2% more CPU). Smaller caches cost such calls CPU: at 16, one-text calls
# built 7 times the kernels and took 40-70% more CPU; at 256, 1-8 text calls built twice the defaults' (BENCHMARKS.md,
# "oneDNN's kernel caches").
ONEDNN_CACHE_CAPACITY = 512
# each read once, when the first kernel is built; DNNL_ is oneDNN's older spelling of its variable
ONEDNN_CACHES = {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": ("ONEDNN_PRIMITIVE_CACHE_CAPACITY",
                                                     "DNNL_PRIMITIVE_CACHE_CAPACITY"),
                 "LRU_CACHE_CAPACITY": ("LRU_CACHE_CAPACITY",)}


def bound_onednn_caches() -> list[str]:
    """Keep oneDNN's and ideep's kernel caches to ``ONEDNN_CACHE_CAPACITY`` entries each, by their environment
    variables; the names set. A capacity the user chose is left as it is. Effective only before the process builds its
    first oneDNN kernel (the model's loading does): the server calls it before loading."""
    chosen = [name for name, spellings in ONEDNN_CACHES.items() if not any(k in os.environ for k in spellings)]
    for name in chosen:
        os.environ[name] = str(ONEDNN_CACHE_CAPACITY)
    return chosen


@dataclass(eq=False)
class Job:
    """One admitted request: its inputs, the pipeline options it runs with, and its future (cancelled once its client
    has gone)."""

    items: list[Any]
    options: dict[str, Any]
    future: asyncio.Future
    cost: int = 1  # model sequences (windows, [MASK]s): a call carries at most max_windows_per_request
    longest: int = 0  # tokens of its longest sequence (max_length where not counted): bounds a call's padded tokens
    tokens: int = 0  # its sequences' tokens, where counted
    queued_at: float = field(default_factory=time.perf_counter)
    started_at: float | None = None  # its model call's start and end (perf_counter)
    finished_at: float | None = None


class Batcher:
    """Admits requests up to ``max_inputs`` inputs, gathers those with the same options into calls of ``run`` (at
    most ``max_batch_size`` inputs unless one request alone has more, ``max_cost`` model sequences and
    ``max_tokens`` padded tokens), and runs them on one model thread."""

    def __init__(self, run: Callable[[list[Any], dict[str, Any]], list[Any]], max_batch_size: int,
                 max_wait_ms: float, max_inputs: int, stats: Stats, max_cost: int | None = None,
                 max_tokens: int | None = None):
        self.run = run
        self.max_batch_size = max_batch_size
        self.max_cost = max_cost
        self.max_tokens = max_tokens
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
        self.trimmed = time.perf_counter()  # when freed memory was last handed back (MALLOC_TRIM)

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

    def admit(self, items: list[Any], options: dict[str, Any], cost: int | None = None, longest: int = 0,
              tokens: int = 0) -> Job:
        n = len(items)
        self.check_room(n)
        job = Job(items, options, asyncio.get_running_loop().create_future(), n if cost is None else cost, longest,
                  tokens)
        self.inputs += n
        self.jobs.append(job)
        self.wake.set()
        return job

    def drop(self, job: Job) -> None:
        """The job's client has gone: never compute it. One already in a model call finishes there, but its inputs
        stop counting against the admission bound now, so that they do not turn the next request away."""
        if job.future.cancel():
            self.inputs -= len(job.items)
            if job.started_at is None:
                self.stats.abandoned += len(job.items)

    def _head(self) -> tuple[list[Job], bool]:
        """The live jobs nearest the head of the queue with the first one's options that fit in one call, and whether
        that call is full."""
        batch: list[Job] = []
        size = cost = longest = 0
        limit, tokens = self.max_cost or math.inf, self.max_tokens or math.inf
        for job in self.jobs:
            if job.future.cancelled() or batch and job.options != batch[0].options:
                continue  # requests with other call options (top_k of fill-mask, ...) wait for a call of their own
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
            batch = self._head()[0]
            self.jobs = deque(j for j in self.jobs if not j.future.cancelled() and j not in batch)
            await self._run(batch)

    async def _run(self, jobs: list[Job]) -> None:
        """One pipeline call for ``jobs``, each job's future getting its slice of the results. If a shared call
        fails, each job runs alone, so that only the request whose input caused the error gets it."""
        t0 = time.perf_counter()
        for job in jobs:
            job.started_at = t0
        items = [x for j in jobs for x in j.items]
        try:
            results = await asyncio.get_running_loop().run_in_executor(self.executor, self.run, items,
                                                                       jobs[0].options)
        except Exception as e:  # noqa: BLE001 (handed to the waiting request, which answers it as an HTTP error)
            if len(jobs) == 1:
                return self._finish(jobs[0], exception=answerable(e))
            for job in jobs:
                if not job.future.cancelled():  # its client may have gone while the shared call ran
                    await self._run([job])
            return
        t1 = time.perf_counter()
        rate = len(items) / max(t1 - t0, 1e-6)
        self.rate = rate if self.rate is None else 0.7 * self.rate + 0.3 * rate
        self.stats.items += len(items)
        self.stats.tokens += sum(j.tokens for j in jobs)
        self.stats.batches += 1
        self.stats.model_seconds += t1 - t0
        self.stats.largest_batch = max(self.stats.largest_batch, len(items))
        at = 0
        for job in jobs:
            job.finished_at = t1
            self._finish(job, results[at:at + len(job.items)])
            at += len(job.items)
        if MALLOC_TRIM is not None and t1 - self.trimmed > TRIM_EVERY_S:
            self.trimmed = t1
            self.executor.submit(MALLOC_TRIM)  # on the model thread, after the call: a few ms every TRIM_EVERY_S

    def _finish(self, job: Job, results: list[Any] | None = None, exception: BaseException | None = None) -> None:
        if job.future.done():  # its client has gone: drop released its inputs
            return
        self.inputs -= len(job.items)
        if exception is not None:
            job.future.set_exception(exception)
        else:
            job.future.set_result(results)


def answerable(e: Exception, what: str = "the model call") -> Exception:
    """The exception of a failed model call (or of ``what`` else failed) as its request can answer it: a refusal or
    a pipeline's error as it is; any other (torch's out of memory, a bug) logged with its traceback and answered 500,
    TEI's ``Backend`` type, naming it, so that the client reads why and /metrics counts it."""
    if isinstance(e, (RequestError, BertkitError)):
        return e
    logger.error("%s failed", what, exc_info=e)
    return RequestError(500, f"{what} failed: {type(e).__name__}: {e}")


def model_call(pipe: Any) -> Callable[[list[Any], dict[str, Any]], list[Any]]:
    """What the model thread runs for a batch: rows encoded while parsing (option ``rows``) give the model's
    outputs (logits, vectors) for the route to render; any other input runs through the pipeline with the
    request's options."""
    def call(items: list[Any], options: dict[str, Any]) -> list[Any]:
        return pipe.run_rows(items) if "rows" in options else pipe.run(items, **options)

    return call
