"""The batching and admission of ``bertkit serve``: requests admitted up to a bound of inputs (429 beyond it),
gathered into model calls bounded in inputs, model sequences and padded tokens, and run on one model thread;
work whose client left or whose deadline passed is dropped before the model. ``serve`` is the HTTP side.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import json
import logging
import math
import os
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from bertkit.inference.serve_tei import Encoded
from bertkit.inference.serve_wire import EMBEDDING_TASKS, RequestError

logger = logging.getLogger("bertkit")


@dataclass
class Stats:
    requests: int = 0  # requests to the routes that parse a body (/predict, /embed, /v1/embeddings, /rerank, ...)
    items: int = 0  # inputs the model computed
    batches: int = 0  # pipeline calls
    largest_batch: int = 0
    refused: int = 0  # requests answered 429/503: the admission bound reached, or draining
    abandoned: int = 0  # inputs dropped before the model: their client disconnected
    expired: int = 0  # inputs dropped before the model: their X-Request-Timeout passed
    errors: int = 0  # other 4xx/5xx answers
    started: float = field(default_factory=time.time)


# ---------------------------------------------------------------------------------------------------
# memory
# ---------------------------------------------------------------------------------------------------

TRIM_EVERY_S = 10.0  # how often, at most, freed memory is handed back to the system after a model call


def _libc_function(name: str) -> Callable[..., int] | None:
    """The C library's function ``name``, or None where it has none (glibc's malloc tuning: musl and macOS
    allocators return memory themselves)."""
    library = ctypes.util.find_library("c")
    try:
        return getattr(ctypes.CDLL(library), name, None) if library else None
    except OSError:
        return None


def _malloc_trim() -> Callable[[], object] | None:
    """glibc's ``malloc_trim(0)``, or None elsewhere."""
    trim = _libc_function("malloc_trim")
    return None if trim is None else (lambda: trim(0))


# A model call's activations are freed after it, but glibc keeps freed blocks in its arenas (one per thread that
# allocated: the model thread, the parser threads) and raises its mmap threshold as large blocks come and go, so
# under mixed traffic a server's resident memory climbs to its worst mix of calls and stays there (measured: 790
# -> 921 MiB over a 20-minute soak at twice capacity, flat after minute 10). Trimming hands the free pages back.
MALLOC_TRIM = _malloc_trim()

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number (malloc.h)
MMAP_THRESHOLD_BYTES = 128 * 1024  # glibc's own starting value, held fixed


def fix_mmap_threshold(nbytes: int = MMAP_THRESHOLD_BYTES) -> bool:
    """Hold glibc's mmap threshold at ``nbytes`` for this process; True when it was set.

    glibc starts at 128 KiB but raises the threshold (up to 32 MiB) each time an mmapped block is freed, so after a
    few model calls their activations come from the heap, whose freed space fragments as calls of other shapes come
    and go; resident memory then follows the worst mix of calls (trimming only helps between calls, so it swings
    with the work in flight: 530-817 MiB in a soak). Setting the threshold explicitly turns that adjustment off:
    every block above it is its own mapping, returned to the system the moment it is freed. Left alone when the
    user chose a threshold through GLIBC_TUNABLES or MALLOC_MMAP_THRESHOLD_, and off glibc (False)."""
    if "mmap_threshold" in os.environ.get("GLIBC_TUNABLES", "") or "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    mallopt = _libc_function("mallopt")
    return mallopt is not None and mallopt(M_MMAP_THRESHOLD, int(nbytes)) == 1


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
        if MALLOC_TRIM is not None and t1 - self.trimmed > TRIM_EVERY_S:
            self.trimmed = t1
            self.executor.submit(MALLOC_TRIM)  # on the model thread, after the call: a few ms every TRIM_EVERY_S

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
