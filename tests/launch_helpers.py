"""Run a command under torchrun for a test (test helper, not a test module).

gloo, PyTorch's CPU backend, very rarely aborts a worker with ``terminate called without an active exception``
(SIGABRT, torchrun's "exitcode: -6") in a run that otherwise goes through: seen once in CI on this project's
2-core machines, never in 88 launches of the same command on 2 cores loaded three-fold (PyTorch 2.13). It is
a C++ abort inside PyTorch's gloo transport, with no Python frame of bertkit's; a run that can end in it is
launched again once, with a warning that carries the first try's output, and a second abort, or any other
failure, fails the test. Faulthandler and C++ stack traces are on, so the warning says where it happened.
"""

from __future__ import annotations

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

