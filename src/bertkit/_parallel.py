"""Processes, without importing torch: where torchrun placed this one (read before the CLI's slow start-up, so the
output directory is locked at once), and one process-pool helper for the CPU-parallel data jobs (vocabulary
learning, pre-training instances)."""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from bertkit.errors import BertkitError


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
    MASTER_ADDR:MASTER_PORT"); None without torchrun. Its ranks save the same sentence model where a script
    written for sentence-transformers saves it on every rank (``bertkit.staging.staged``'s ``shared_by``)."""
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
