"""One process-pool helper for the CPU-parallel data jobs (vocabulary learning, pre-training instances)."""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def spawn_pool(num_workers: int, num_units: int, initializer: Callable[..., None] | None = None,
               initargs: tuple[Any, ...] = ()) -> Iterator[Any]:
    """A ``spawn`` pool of ``min(num_workers, num_units)`` workers, or ``None`` to run in this process.

    ``spawn``, not ``fork``: the caller may hold torch threads or a tqdm monitor thread, which a forked
    child would inherit in a broken state. The pool is terminated on exit, also on errors and Ctrl-C.
    """
    workers = min(num_workers, num_units)
    if workers <= 1:
        yield None
        return
    pool = multiprocessing.get_context("spawn").Pool(workers, initializer=initializer, initargs=initargs)
    try:
        yield pool
    finally:
        pool.terminate()
        pool.join()
