"""Kill a bertkit training command at a chosen moment of a checkpoint write (test helper, not a test module).

Random timing rarely lands a SIGKILL inside the few milliseconds a tiny model's checkpoint takes to write, so
``launch_paused`` runs the command in a child process whose checkpoint writer stops at one of these moments
and waits to be killed:

- ``"state"``: the n-th ``state.pt`` is half written (torn bytes, fsynced) in its temporary directory;
- ``"renamed"``: the n-th checkpoint was renamed into place, the older ones are not yet pruned.

bertkit's code is not changed for this: the child replaces ``torch.save`` / the loop's ``fsync_dir`` before
running the CLI, the way a debugger would.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

_CHILD = r"""
import io, os, sys, time
from pathlib import Path
import torch
from bertkit.training import checkpoint

where, nth, sentinel = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
calls = {"state": 0, "renamed": 0}

def _stop():
    sentinel.touch()
    time.sleep(3600)  # the parent kills us here

real_save = torch.save

def save(obj, f, *args, **kwargs):
    calls["state"] += 1
    if where == "state" and calls["state"] == nth:
        buf = io.BytesIO()
        real_save(obj, buf, *args, **kwargs)
        data = buf.getvalue()
        with open(f, "wb") as out:
            out.write(data[: len(data) // 2])
            out.flush()
            os.fsync(out.fileno())
        _stop()
    return real_save(obj, f, *args, **kwargs)

real_fsync_dir = checkpoint.fsync_dir

def fsync_dir(directory):
    real_fsync_dir(directory)
    calls["renamed"] += 1
    if where == "renamed" and calls["renamed"] == nth:
        _stop()

torch.save = save
checkpoint.fsync_dir = fsync_dir  # where checkpoints are renamed into place
"""
_CLI = _CHILD + """
from bertkit.cli import main
sys.exit(main(sys.argv[4:]))
"""

MOMENTS = ("state", "renamed")


def launch_paused(cli_args: list[str], where: str, nth: int, sentinel: Path, env: dict[str, str],
                  timeout: float = 300.0, script: str | None = None) -> bool:
    """Run ``bertkit <cli_args>`` (or the Python ``script`` with ``cli_args`` as ``sys.argv[4:]``) until its ``nth``
    checkpoint write reaches ``where``, then SIGKILL it.

    Returns True if it was killed there, False if the run finished first (fewer checkpoints than ``nth``).
    """
    assert where in MOMENTS, where
    sentinel.unlink(missing_ok=True)
    log = sentinel.with_suffix(".log")
    with open(log, "wb") as err:  # a file, not a pipe: a chatty run never blocks on a full pipe
        code = _CLI if script is None else _CHILD + script
        proc = subprocess.Popen([sys.executable, "-c", code, where, str(nth), str(sentinel), *cli_args], env=env,
                                stdout=subprocess.DEVNULL, stderr=err)
        deadline = time.time() + timeout
        while not sentinel.exists():
            if proc.poll() is not None:
                tail = log.read_text(errors="replace")[-2000:]
                assert proc.returncode == 0, f"the run failed before the kill point: {tail}"
                return False
            if time.time() > deadline:
                proc.kill()
                proc.wait()
                raise AssertionError(f"no {where} checkpoint write #{nth} within {timeout:.0f} s")
            time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)  # no handler runs: a real crash in the middle of the write
        proc.wait()
    return True


def torn_checkpoint_left(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds a checkpoint write cut short (a temporary checkpoint directory left behind)."""
    return any((run_dir / "checkpoints").glob(".tmp-step-*"))


def child_env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1"}


def run_here(cli_args: list[str]) -> int:
    """``bertkit <cli_args>`` in this process on one thread, as the children of ``child_env()`` run
    (OMP_NUM_THREADS=1), so that its results compare bit for bit with theirs; returns the exit status.

    For the runs around a kill (the uninterrupted reference, the last --resume): only the killed run needs a
    process of its own."""
    import torch

    from bertkit.cli import main

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return main(cli_args)
    finally:
        torch.set_num_threads(threads)
