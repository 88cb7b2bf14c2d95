"""Output directories and files that never cost a user their earlier work.

The rule: bertkit never deletes or overwrites a file it did not create. Three mechanisms keep it:

- **Atomic writes** (``atomic_write``): every file is written under a temporary name in the same
  directory, flushed and fsynced, renamed over the final name, and the directory fsynced. A kill
  mid-write leaves the old file or the new one, never half of one; a symlink already at the final name
  is replaced, not followed (its target is left alone).
- **Run markers** (``claim_output_dir``): each command writes ``.bertkit-run.json`` into its output
  directory (the command, a fingerprint of its settings, the directory it started in, and the files it
  made). A non-empty directory without a marker, or with another run's marker, is refused with the fix.
  ``--overwrite`` removes only the files a previous bertkit run recorded there (never anything else);
  ``--resume`` continues the run the marker describes; its path settings compare as the absolute paths
  they meant, so it may be given relative to another working directory.
- **A lock** (``fcntl.flock`` on ``.bertkit-lock``): two processes writing the same directory would
  interleave their metrics and crash; the second is refused, naming the first's pid and command. The
  kernel drops the lock when its process dies, so a crash leaves no stale lock to clear by hand.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import tempfile
import time
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from bertkit.errors import BertkitError

MARKER = ".bertkit-run.json"
LOCK = ".bertkit-lock"
_OWN = {MARKER, LOCK}
_UMASK = os.umask(0)
os.umask(_UMASK)  # read once: temporary files get the permissions a plain open() would have given


# -------------------------------------------------------------------------------------------------
# Atomic files
# -------------------------------------------------------------------------------------------------


def fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # some filesystems do not open directories; the rename is still atomic
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_target(path: str | os.PathLike) -> Iterator[Path]:
    """A temporary path beside ``path`` to write (by ``atomic_write`` or a library such as safetensors'
    ``save_file``); on success it is fsynced and renamed over ``path`` and the directory fsynced.

    On any error the temporary file is removed and ``path`` is untouched. A full disk becomes a
    ``BertkitError`` naming the file.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        # mkstemp's 0600 would make every model file private; set after writing, since a library may have
        # replaced the file (safetensors' save_file creates it anew, 0600 again).
        os.chmod(tmp, 0o666 & ~_UMASK)
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)  # replaces a symlink at `path` itself, never writes through it
    except BaseException as e:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if isinstance(e, OSError) and e.errno == errno.ENOSPC:
            raise BertkitError(f"no space left on the device while writing {path}; free some space and run again "
                               "(nothing was replaced: the previous file, if any, is intact)") from e
        raise
    fsync_dir(path.parent)


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "w", encoding: str | None = "utf-8") -> Iterator[IO]:
    """``open(path, mode)`` made atomic (see ``atomic_target``)."""
    binary = "b" in mode
    with atomic_target(path) as tmp, open(tmp, mode, encoding=None if binary else encoding,
                                          newline=None if binary else "") as f:
        yield f


def atomic_write_text(path: str | os.PathLike, text: str, encoding: str = "utf-8") -> Path:
    with atomic_write(path, "w", encoding=encoding) as f:
        f.write(text)
    return Path(path)


def atomic_write_json(path: str | os.PathLike, data: Any, indent: int = 2) -> Path:
    return atomic_write_text(path, json.dumps(data, indent=indent, ensure_ascii=False, default=str) + "\n")


def refuse_existing_file(path: Path, overwrite: bool, flag: str = "--overwrite") -> None:
    """For commands whose output is one file: an existing file is replaced only when the user says so."""
    if path.exists() and not overwrite:
        raise BertkitError(f"{path} already exists; pass {flag} to replace it, or choose another output file")
    if path.is_dir():
        raise BertkitError(f"{path} is a directory; give a file name (e.g. {path / 'features.jsonl'})")


# -------------------------------------------------------------------------------------------------
# Output directories
# -------------------------------------------------------------------------------------------------


def _listing(directory: Path) -> list[str]:
    """Every file under ``directory`` (relative, sorted), bertkit's own marker and lock excluded."""
    out = []
    for root, dirs, files in os.walk(directory):
        dirs.sort()
        for name in files:
            rel = Path(root, name).relative_to(directory).as_posix()
            if rel not in _OWN:
                out.append(rel)
    return sorted(out)


def read_marker(directory: Path) -> dict | None:
    try:
        return json.loads((directory / MARKER).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BertkitError(f"{directory / MARKER} is damaged ({e}); bertkit cannot tell which files there are "
                           "its own: choose another output directory") from None


@dataclass
class OutputDir:
    """A claimed output directory: locked for this process, its marker updated with the files made."""

    path: Path
    command: str
    fingerprint: dict
    _lock: Any = None
    _started: float = 0.0
    _created: bool = False  # the claim made the directory (it did not exist before)
    _cwd: str = ""  # where the run started: its relative paths are relative to this

    def record(self, finished: bool) -> None:
        """Write the marker: the files this and earlier runs of the same claim made."""
        marker = {"command": self.command, "fingerprint": self.fingerprint, "cwd": self._cwd, "started": self._started,
                  "finished": finished, "pid": os.getpid(), "files": _listing(self.path)}
        atomic_write_json(self.path / MARKER, marker)

    def release(self, finished: bool) -> None:
        """Record the run's files and drop the lock. A run that failed before writing anything into a
        directory it created leaves no trace (no empty directory holding only bertkit's marker and lock)."""
        if not finished and self._created and self.path.is_dir() and not _listing(self.path):
            for name in (MARKER, LOCK):
                with contextlib.suppress(FileNotFoundError):
                    (self.path / name).unlink()
            with contextlib.suppress(OSError):
                self.path.rmdir()
        try:
            if self.path.is_dir() and (self.path / LOCK).exists():
                self.record(finished)
        finally:
            if self._lock is not None:
                self._lock.seek(0)
                self._lock.truncate()  # a pid left in the lock file means its run was killed
                self._lock.close()  # closing the descriptor drops the flock
                self._lock = None


def _lock(directory: Path, command: str) -> IO:
    import fcntl

    f = open(directory / LOCK, "a+", encoding="utf-8")  # noqa: SIM115 (held until release)
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        holder = f.read().strip() or "another process"
        f.close()
        raise BertkitError(f"{directory} is in use by {holder}; wait for it to finish or choose another "
                           "output directory") from None
    f.seek(0)
    previous = f.read().strip()
    if previous:  # a lock file whose process is gone: the kernel already dropped its lock
        pid = previous.split()[1] if previous.startswith("pid ") else "?"
        if pid.isdigit() and not _alive(int(pid)):
            import logging

            logging.getLogger("bertkit").info("%s: the previous run (%s) ended without finishing; taking over",
                                              directory, previous)
    f.seek(0)
    f.truncate()
    f.write(f"pid {os.getpid()} (bertkit {command})")
    f.flush()
    return f


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_recorded(directory: Path, marker: dict) -> list[str]:
    """--overwrite: delete exactly the files an earlier bertkit run recorded (and, if it was killed before
    recording them, the files it made after it started); then the directories left empty."""
    recorded = set(marker.get("files", []))
    if not marker.get("finished", True):
        started = float(marker.get("started", 0))
        recorded |= {rel for rel in _listing(directory) if (directory / rel).stat().st_mtime >= started}
    removed = []
    for rel in sorted(recorded):
        target = directory / rel
        if target.is_symlink() or target.is_file():
            target.unlink()
            removed.append(rel)
    for root, dirs, _ in sorted(os.walk(directory, topdown=False), key=lambda t: -len(t[0])):
        for name in dirs:
            with contextlib.suppress(OSError):
                (Path(root) / name).rmdir()  # only if empty: a user's file keeps its directory
    return removed


def _absolute(value: Any, cwd: str) -> Any:
    """A path-valued setting (a path or a list of them, as strings) made absolute from ``cwd``, symlinks resolved."""
    if isinstance(value, str):
        return str(Path(cwd, value).resolve())
    if isinstance(value, list):
        return [_absolute(v, cwd) for v in value]
    return value  # None: not given


def _refuse_other_settings(directory: Path, command: str, marker: dict, now: dict, paths: Collection[str]) -> None:
    """--resume continues the run the marker describes, not another one: `finetune glue --task cola --resume`
    into an SST-2 run would otherwise start afresh there and replace its report and best model.

    The settings named in ``paths`` compare as the absolute paths they meant where each run started: `--data
    data` started in runs/a is `--data runs/a/data` from the directory above. A marker from before bertkit
    recorded that directory (no "cwd") compares them as written."""
    earlier = marker.get("fingerprint") or {}
    if marker.get("cwd"):
        earlier = {k: _absolute(v, marker["cwd"]) if k in paths else v for k, v in earlier.items()}
        now = {k: _absolute(v, os.getcwd()) if k in paths else v for k, v in now.items()}
    changed = sorted(k for k in set(earlier) | set(now) if earlier.get(k) != now.get(k))
    if changed:
        shown = "; ".join(f"--{k.replace('_', '-')} {earlier.get(k)!r} then, {now.get(k)!r} now" for k in changed[:4])
        more = f" (and {len(changed) - 4} more)" if len(changed) > 4 else ""
        raise BertkitError(
            f"cannot --resume in {directory}: its `bertkit {command}` run had other settings ({shown}{more}); "
            "resume with the original settings, pass --overwrite to replace that run (only the files bertkit "
            "wrote there are removed), or choose another output directory")


def claim_output_dir(path: str | os.PathLike, command: str, fingerprint: dict | None = None, *,
                     overwrite: bool = False, resume: bool = False, resumable: bool = True,
                     paths: Collection[str] = ()) -> OutputDir:
    """Take ``path`` for one run of ``command``: lock it, check whose files are there, write the marker.

    - empty or absent: claimed;
    - holding a marker of the same command and settings and ``resume``: claimed, the run continues there
      (other settings are refused, naming them; the ``fingerprint`` entries named in ``paths`` are paths,
      compared as absolute paths, so a run may be resumed from another working directory);
    - holding a bertkit marker otherwise: refused, unless ``overwrite`` (the recorded files are removed);
    - holding files without a marker (a user's, or another tool's): always refused.
    """
    directory = Path(path)
    if directory.exists() and not directory.is_dir():
        raise BertkitError(f"{directory} is a file; the output must be a directory")
    created = not directory.exists()
    directory.mkdir(parents=True, exist_ok=True)
    lock = _lock(directory, command)
    try:
        marker = read_marker(directory)
        present = _listing(directory)
        if marker is None and present:
            raise BertkitError(
                f"{directory} already holds {len(present)} file(s) bertkit did not write there (e.g. "
                f"{', '.join(present[:3])}); bertkit never replaces files it did not create: choose an empty "
                "or new output directory")
        if marker is not None and (present or marker.get("files")):
            same = marker.get("command") == command
            if resume and same:
                _refuse_other_settings(directory, command, marker, fingerprint or {}, paths)
            elif overwrite:
                removed = _remove_recorded(directory, marker)
                left = _listing(directory)
                if left:
                    raise BertkitError(
                        f"{directory}: removed the {len(removed)} file(s) the earlier `bertkit {marker.get('command')}` "
                        f"run wrote, but {len(left)} other file(s) remain (e.g. {', '.join(left[:3])}); bertkit "
                        "leaves files it did not create alone: move them or choose another output directory")
            else:
                what = f"`bertkit {marker.get('command')}` run"
                fixes = "pass --resume to continue it, " if same and resumable else ""
                raise BertkitError(
                    f"{directory} already holds the output of a {what} ({len(present)} file(s)); {fixes}pass "
                    "--overwrite to replace it (only the files bertkit wrote there are removed), or choose "
                    "another output directory")
        claim = OutputDir(directory, command, fingerprint or {}, lock, time.time(), created, os.getcwd())
        if resume and marker is not None and marker.get("command") == command:
            claim._started = float(marker.get("started", claim._started))
        claim.record(finished=False)
        return claim
    except BaseException:
        lock.close()
        raise


@contextlib.contextmanager
def output_dir(path: str | os.PathLike, command: str, fingerprint: dict | None = None, *, overwrite: bool = False,
               resume: bool = False, resumable: bool = True, paths: Collection[str] = ()) -> Iterator[OutputDir]:
    """``claim_output_dir`` as a context: the marker records the run's files on the way out, even on errors."""
    claim = claim_output_dir(path, command, fingerprint, overwrite=overwrite, resume=resume, resumable=resumable,
                             paths=paths)
    finished = False
    try:
        yield claim
        finished = True
    finally:
        claim.release(finished)

