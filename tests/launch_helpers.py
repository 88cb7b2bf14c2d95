"""Run a command under torchrun, or workers in a gloo group, for a test (test helper, not a test module).

gloo, PyTorch's CPU backend, very rarely aborts a worker with ``terminate called without an active exception``
(SIGABRT, torchrun's "exitcode: -6") in a run that otherwise goes through: seen once in CI on this project's
2-core machines, never in 88 launches of the same command on 2 cores loaded three-fold (PyTorch 2.13). It is
a C++ abort inside PyTorch's gloo transport, with no Python frame of bertkit's; a run that can end in it is
launched again once, with a warning that carries the first try's output, and a second abort, or any other
failure, fails the test. Faulthandler and C++ stack traces are on, so the warning says where it happened.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

LAUNCHER = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
GLOO_ABORT = "terminate called without an active exception"


def gloo_aborted(stderr: str) -> bool:
    """Whether a worker died of gloo's C++ abort (and of nothing bertkit reported)."""
    return GLOO_ABORT in stderr and "exitcode  : -6" in stderr and "BertkitError" not in stderr


def run_torchrun(args: list[str], env: dict, timeout: float, fresh: Path | None = None) -> subprocess.CompletedProcess:
    """``torchrun --standalone --nproc_per_node 2 ARGS``, captured; once more after a gloo abort. ``fresh``: the
    output directory the run creates, removed before the second try (a run that resumes keeps its directory:
    resuming after a crash is what it is for)."""
    env = {**env, "PYTHONFAULTHANDLER": "1", "TORCH_SHOW_CPP_STACKTRACES": "1"}
    done = subprocess.run([*LAUNCHER, *args], env=env, capture_output=True, text=True, timeout=timeout)
    if done.returncode == 0 or not gloo_aborted(done.stderr):
        return done
    warnings.warn(f"a torchrun worker died of gloo's abort; launched again once. Its output:\n{done.stderr[-6000:]}",
                  stacklevel=2)
    if fresh is not None and fresh.exists():
        shutil.rmtree(fresh)
    return subprocess.run([*LAUNCHER, *args], env=env, capture_output=True, text=True, timeout=timeout)


def spawn_gloo_workers(worker, make_args, nprocs: int) -> None:
    """``torch.multiprocessing.start_processes(worker, make_args(), nprocs, forkserver)`` for workers in a gloo
    group; once more, with a warning, when a worker died of SIGABRT (gloo's abort: its message goes to the test's
    stderr). ``make_args`` is called for each try, so the second gets a fresh port. A worker's Python error, or a
    second abort, fails as it is.

    The workers are forked from a server that imported torch once for every group this pytest process starts
    (multiprocessing's forkserver: a fresh process, never the test process with its threads), not spawned: a spawned
    worker's Python start-up and torch import took 2 s of CPU. They see the environment the server started with
    (the first group's), and set what they need themselves (threads, MASTER_ADDR and MASTER_PORT)."""
    import torch.multiprocessing as mp

    context = mp.get_context("forkserver")
    context.set_forkserver_preload(["torch", "torch.distributed"])  # read when the server starts (the first group)
    try:
        mp.start_processes(worker, args=make_args(), nprocs=nprocs, join=True, start_method="forkserver")
    except mp.ProcessExitedException as e:
        if e.signal_name != "SIGABRT":
            raise
        warnings.warn(f"a gloo worker died of SIGABRT ({e}); started again once", stacklevel=2)
        mp.start_processes(worker, args=make_args(), nprocs=nprocs, join=True, start_method="forkserver")


def _abort_once_worker(rank: int, marker: str, failing: str) -> None:
    """For the test of ``spawn_gloo_workers``: rank 1 aborts the first time (as gloo does), or raises."""
    if rank == 1 and failing == "raise":
        raise ValueError("a worker's own error")
    if rank == 1 and not Path(marker).exists():
        Path(marker).write_text("aborted once")
        os.abort()
    Path(f"{marker}.rank{rank}").write_text("done")
