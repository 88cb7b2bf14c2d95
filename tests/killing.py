"""Kill a bertkit training command at a chosen moment of a checkpoint write (test helper, not a test module).

Random timing rarely lands a SIGKILL inside the few milliseconds a tiny model's checkpoint takes to write, so
``launch_paused`` runs the command in a child process whose checkpoint writer stops at one of these moments
and waits to be killed:

- ``"state"``: the n-th ``state.pt`` is half written (torn bytes, fsynced) in its staging directory;
- ``"renamed"``: the n-th checkpoint was renamed into place, the older ones are not yet pruned.

bertkit's code is not changed for this: the child replaces ``torch.save`` / the checkpoint writer's ``_rotate``
before running the CLI, the way a debugger would. A command killed mid-run leaves its output in its staging
directory (``in_progress``), where --resume continues it.
"""

from __future__ import annotations

import contextlib
import json
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
    # state.pt's alone (a Trainer checkpoint also saves transformers' optimizer.pt, scheduler.pt, rng_state.pth)
    calls["state"] += Path(str(f)).name == "state.pt"
    if where == "state" and calls["state"] == nth and Path(str(f)).name == "state.pt":
        buf = io.BytesIO()
        real_save(obj, buf, *args, **kwargs)
        data = buf.getvalue()
        with open(f, "wb") as out:
            out.write(data[: len(data) // 2])
            out.flush()
            os.fsync(out.fileno())
        _stop()
    return real_save(obj, f, *args, **kwargs)

real_rotate = checkpoint._rotate

def rotate(*args, **kwargs):
    calls["renamed"] += 1
    if where == "renamed" and calls["renamed"] == nth:
        _stop()
    return real_rotate(*args, **kwargs)

torch.save = save
checkpoint._rotate = rotate  # called once a checkpoint is renamed into place, to prune the older ones
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


def in_progress(run_dir: Path) -> Path:
    """Where a command's run into ``run_dir`` is while unfinished: its staging directory (once finished, ``run_dir``)."""
    from bertkit.write_paths import staging_dir_of

    staging = staging_dir_of(run_dir)
    return staging if staging.is_dir() else run_dir


def torn_checkpoint_left(run_dir: Path) -> bool:
    """Whether the run into ``run_dir`` holds a checkpoint write cut short (its staging directory left behind)."""
    return any((in_progress(run_dir) / "checkpoints").glob(".step-*.bertkit-staging"))


def killed_run(directory: Path, command: str, files: dict[str, str], *, resumable: bool = True,
               resume: bool = False, overwrite: bool = False, in_place: bool = False) -> None:
    """A run of ``command`` claiming ``directory`` (``bertkit.runs``) that writes ``files`` (relative path -> text)
    where the claim says (a run in place records each first, as its log), then is SIGKILLed: no handler runs, its
    lock is dropped by the kernel."""
    code = ("import json, os, signal, sys\nfrom bertkit.outputs import atomic_write_text\nfrom bertkit.runs import claim_output_dir, record\n"
            "c = claim_output_dir(sys.argv[1], sys.argv[2], **json.loads(sys.argv[3]))\n"
            "for rel, text in json.loads(sys.argv[4]).items():\n"
            "    record(c.path / rel, appends=True, data=text.encode())\n    atomic_write_text(c.path / rel, text)\n"
            "os.kill(os.getpid(), signal.SIGKILL)")
    flags = {"resumable": resumable, "resume": resume, "overwrite": overwrite, "in_place": in_place}
    proc = subprocess.run([sys.executable, "-c", code, str(directory), command, json.dumps(flags), json.dumps(files)],
                          capture_output=True, text=True)
    assert proc.returncode == -signal.SIGKILL, proc.stderr


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


# -- A fault at every write step of a save ------------------------------------------------------------------------
#
# ``write_steps`` runs a write (a save, a command) in a forked child whose file-system calls are counted: each call
# that creates, changes, renames or removes something (os.open for writing, open() in a writing mode, mkdir,
# rename, replace, link, unlink, rmdir, chmod, renameat2, torch.save, safetensors' save_file) is one step. The
# child is run once through to count the steps, then once per step k with a fault just before step k: a SIGKILL
# ("kill": no handler runs), or the call failing as a full disk fails it ("full": ENOSPC, in the words torch's and
# safetensors' writers use). The caller checks the state each leaves. Forked, not spawned: one step costs a fork,
# not a Python start-up (the child runs on one thread: the parent's OpenMP pool does not survive a fork).

_STEPS = ("os.open", "builtins.open", "io.open", "os.mkdir", "os.rename", "os.replace", "os.link", "os.symlink",
          "os.unlink", "os.remove", "os.rmdir", "os.chmod", "dir_swap._exchange", "torch.save", "save_file")
NEVER_FULL = ("os.unlink", "os.remove", "os.rmdir", "os.chmod")  # a full disk fails no removal
_WRITING = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


def _full_disk(name: str) -> BaseException:
    if name == "save_file":
        from safetensors import SafetensorError

        return SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")
    if name == "torch.save":
        return RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 4096 vs 2048")
    return OSError(28, "No space left on device")


def _install(fault: str, at: int, counter: list) -> None:
    import builtins
    import io

    import safetensors.torch
    import torch

    from bertkit import dir_swap

    modules = {"os": os, "builtins": builtins, "io": io, "dir_swap": dir_swap, "torch": torch}

    def hooked(name, real):
        def call(*args, **kwargs):
            if name == "os.open" and not (args[1] if len(args) > 1 else kwargs.get("flags", 0)) & _WRITING:
                return real(*args, **kwargs)
            if name.endswith(".open") and name != "os.open":
                mode = args[1] if len(args) > 1 else kwargs.get("mode", "r")
                if not any(c in mode for c in "wax+"):
                    return real(*args, **kwargs)
            counter[0] += 1
            where = args[1] if name in ("save_file", "torch.save") else args[0] if args else ""
            counter.append(f"{name}({Path(str(where)).name})")
            if counter[0] == at and (fault == "kill" or name not in NEVER_FULL):
                if fault == "kill":
                    os.kill(os.getpid(), signal.SIGKILL)
                raise _full_disk(name)
            return real(*args, **kwargs)
        return call

    for name in _STEPS:
        if name == "save_file":
            safetensors.torch.save_file = hooked(name, safetensors.torch.save_file)
            continue
        module, attr = name.split(".")
        # a step that names no function (bertkit's moved elsewhere) would go uncounted, and its faults untested
        assert hasattr(modules[module], attr), f"{name}: no such function to count as a write step"
        setattr(modules[module], attr, hooked(name, getattr(modules[module], attr)))


def run_with_fault(write, fault: str = "none", at: int = 0) -> tuple[str, int, str]:
    """``write()`` in a forked child with ``fault`` ("kill", "full" or "none") before write step ``at``: (how it
    ended: "killed", "ok" or "raised", the steps it counted, the error it raised in one line)."""
    read, send = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        counter, outcome = [0], "ok"
        try:
            os.close(read)
            import torch

            torch.set_num_threads(1)
            _install(fault, at, counter)
            write()
        except BaseException as e:  # noqa: BLE001 (reported to the parent, whatever it is)
            outcome = f"raised {type(e).__name__}: {(str(e) or ' ').splitlines()[0]}"
        finally:
            with contextlib.suppress(BaseException):
                os.write(send, json.dumps([outcome, counter[0], counter[1:]]).encode())
            os._exit(0)
    os.close(send)
    with os.fdopen(read, "rb") as f:
        data = f.read()
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        assert os.WTERMSIG(status) == signal.SIGKILL, status
        return "killed", at, ""
    outcome, steps, names = json.loads(data)
    run_with_fault.names = names  # the steps it took, named (what a failing check prints)
    return ("ok", steps, "") if outcome == "ok" else ("raised", steps, outcome[len("raised "):])


def write_steps(write) -> int:
    """How many write steps ``write()`` takes (run once through, in a forked child, which must succeed)."""
    outcome, steps, error = run_with_fault(write)
    assert outcome == "ok", error
    return steps
