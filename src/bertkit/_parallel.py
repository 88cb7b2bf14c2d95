"""Processes, without importing torch: where torchrun placed this one (read before the CLI's slow start-up, so the
output directory is locked at once), and one process-pool helper for the CPU-parallel data jobs (vocabulary
learning, pre-training instances)."""

from __future__ import annotations

import multiprocessing
import os
import pickle
import signal
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from bertkit.errors import BertkitError


@contextmanager
def spawn_pool(num_workers: int, num_units: int, initializer: Callable[..., None] | None = None,
               initargs: tuple[Any, ...] = ()) -> Iterator[_Pool | None]:
    """A ``spawn`` pool of ``min(num_workers, num_units)`` workers, or ``None`` to run in this process.

    ``spawn``, not ``fork``: the caller may hold torch threads or a tqdm monitor thread, which a forked child would
    inherit in a broken state. A ``concurrent.futures`` pool, not ``multiprocessing.Pool``, which replaces a worker
    that dies without a word: a worker that cannot start (a script without ``if __name__ == "__main__":``, which each
    spawned worker runs again) left the caller waiting forever, and so did Ctrl-C (a worker it ended took its task, or
    the lock terminate() needs, with it). Workers ignore SIGINT; on Ctrl-C or an error the work not started is
    cancelled and the call returns when the units under way are done (a worker killed mid-answer would leave the
    result pipe half-written, which the pool then waits on for ever).
    """
    workers = min(num_workers, num_units)
    if workers <= 1:
        yield None
        return
    refuse_in_a_starting_worker()  # before the executor makes its queues' 5 semaphores
    # The initializer and its arguments reach the workers in a file, not in the pipe that starts each one: a worker
    # running the script again (no main guard) dies before it reads past the script's name, and the parent, which
    # holds that pipe's other end open until its write is done, waited for ever once the write passed the pipe's
    # 64 KiB (a tokenizer's vocabulary does) instead of seeing the pool broken.
    fd, setup = tempfile.mkstemp(prefix="bertkit-worker-", suffix=".pickle")
    try:
        with os.fdopen(fd, "wb") as f:
            pickle.dump((initializer, initargs), f, protocol=pickle.HIGHEST_PROTOCOL)
        executor = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"),
                                       initializer=_start_worker, initargs=(setup,))
        try:
            yield _Pool(executor, workers)
        finally:
            executor.shutdown(wait=True, cancel_futures=True)
    finally:
        os.unlink(setup)


def refuse_in_a_starting_worker() -> None:
    """Refuse in a spawned worker still running the calling script (no main guard; the stdlib's own test for it),
    naming the fix: a call that would start a pool of its own, before it makes anything (a pool's 5 semaphores, which
    the worker left behind when the parent, seeing the pool broken, killed it mid-way: "There appear to be 5 leaked
    semaphore objects"), or claims anything (the output directory its parent holds, whose lock it would name)."""
    if getattr(multiprocessing.current_process(), "_inheriting", False):
        raise BertkitError("this worker process is running the calling script again, as each spawned worker does, and "
                           "reached a call that starts a pool of its own: in the script, make the call under "
                           "`if __name__ == \"__main__\":` (or pass num_workers=1)")


def _start_worker(setup: str) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the terminal's whole group: the caller handles it
    with open(setup, "rb") as f:
        initializer, initargs = pickle.load(f)  # spawn_pool's own file, written for this pool (mkstemp: mode 0600)
    if initializer is not None:
        initializer(*initargs)


class _Pool:
    """What the data jobs use of a process pool: ``imap``, results in input order."""

    def __init__(self, executor: ProcessPoolExecutor, workers: int):
        self._executor, self._workers = executor, workers

    def imap(self, function: Callable[[Any], Any], items: Iterable[Any]) -> Iterator[Any]:
        try:
            yield from self._executor.map(function, items)
        except BrokenProcessPool:
            raise BertkitError(
                f"a worker process ended before its work was done (num_workers={self._workers}). Workers start by "
                "running the calling script again: in a script, call this under `if __name__ == \"__main__\":` (or "
                "pass num_workers=1). Otherwise the machine may have killed it for memory: pass fewer workers"
            ) from None


@dataclass(frozen=True)
class DistInfo:
    """Where this process stands in the run: its rank among ``world_size`` and on its node."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        """Rank 0 logs, writes files and shows the progress bar."""
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def job_of(env: Mapping[str, str] | None = None) -> str | None:
    """The torchrun job this process is a rank of, as one name every rank of it gives ("torchrun job RUN_ID at
    MASTER_ADDR:MASTER_PORT"); None without torchrun. Its ranks save the same model where a script written for
    transformers or sentence-transformers saves it on every rank (``bertkit.staging.staged``'s ``shared_by``)."""
    env = os.environ if env is None else env
    if not info_from_env(env).enabled or "TORCHELASTIC_RUN_ID" not in env:
        return None
    return f"torchrun job {env['TORCHELASTIC_RUN_ID']} at {env.get('MASTER_ADDR', '')}:{env.get('MASTER_PORT', '')}"


def info_from_env(env: Mapping[str, str] | None = None) -> DistInfo:
    """The place torchrun's environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``) gives this process; rank 0 of 1
    without torchrun."""
    env = os.environ if env is None else env
    if not all(k in env for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK")):
        return DistInfo()
    try:
        info = DistInfo(int(env["RANK"]), int(env["WORLD_SIZE"]), int(env["LOCAL_RANK"]))
    except ValueError:
        raise BertkitError(f"RANK={env['RANK']!r} WORLD_SIZE={env['WORLD_SIZE']!r} LOCAL_RANK={env['LOCAL_RANK']!r}: "
                           "torchrun sets these to integers; unset them to run one process") from None
    if not 0 <= info.rank < info.world_size:
        raise BertkitError(f"RANK {info.rank} is not in [0, WORLD_SIZE {info.world_size})")
    return info
