"""Output directories and files that never cost a user their earlier work.

The rule: bertkit deletes or replaces only what it can prove it wrote, never a command's own inputs, and never
through a symlink. Four mechanisms keep it:

- **Atomic writes** (``atomic_write``, ``atomic_target``): every file is written under a temporary name in the
  same directory, flushed and fsynced, renamed over the final name, and the directory fsynced. A kill
  mid-write leaves the old file or the new one, never half of one; a symlink already at the final name
  is replaced, not followed (its target is left alone). A file that has to be checked before it replaces
  an older one (an ONNX export) is verified under its temporary name and renamed only once it passes.
  Inside a claimed directory an existing file is replaced only if the run (or the run it resumes) wrote it,
  as recorded (a torn append after the recorded bytes allowed); a file a user saved there meanwhile is
  refused by name.
- **A record of what was written** (``register``, in ``bertkit.output_record``): every file written through the atomic writers, and every
  file a library writes itself (``torch.save``, tensorboard, matplotlib, ``np.save`` in worker processes),
  is registered with its size and sha256. Within a process the registry proves "this process wrote it";
  with a claimed output directory, each registration is also appended at once to the directory's journal
  (``.bertkit-files.jsonl``), so a SIGKILLed run's files are recorded too, and at the end the journal is
  folded into the marker. A file bertkit removes while the run goes on (old checkpoints, a failed run's
  shards) is removed only when its size and hash still match (``remove_owned``, ``remove_owned_tree``).
- **Run markers** (``claim_output_dir``): each command writes ``.bertkit-run.json`` into its output
  directory: the command, a fingerprint of its settings, the directory it started in, and ``files``, a map
  from each file it wrote (relative to the directory) to ``{"size": ..., "sha256": ...}``. A non-empty
  directory without a marker, or with another run's marker, is refused with the fix. ``--overwrite``
  removes a recorded file only if it is a regular file inside the directory (no ``..``, no absolute path,
  no symlink anywhere on the way) whose size and sha256 are those recorded; a file changed since is the
  user's, is left alone, and the overwrite is refused naming it. A file a user put there, before or during
  a run or after a ``--resume``, is never recorded, so never removed. A marker naming a path outside its
  directory (one received from someone else) is refused before anything is touched. Markers of older
  bertkit versions list file names without sizes or hashes: bertkit cannot tell those files from a
  user's, so ``--overwrite`` refuses them and asks for the directory to be cleared by hand; ``--resume``
  continues such a run but records only the files it writes itself, and refuses (naming it) to replace a
  file the older run wrote. ``--resume`` continues the run the
  marker describes; its path settings compare as the absolute paths they meant, so it may be given
  relative to another working directory.
- **A lock** (``fcntl.flock`` on ``.bertkit-lock``): two processes writing the same directory would
  interleave their metrics and crash; the second is refused, naming the first's pid and command, with or
  without ``--overwrite``, and so is a command into a directory inside or around one another process
  holds, and a single-file command (``export onnx``, ``extract-features``) writing into a held directory or
  replacing another run's recorded file. The kernel drops the lock when its process dies, so a crash leaves
  no stale lock to clear by hand. A lock file that is a symlink, a hard link or holds anything but
  bertkit's one line is refused, never followed or truncated.

A command's inputs (``inputs``: the model, the data directory, the data files) are never its output: an
output directory equal to an input, holding one, or inside an input directory a bertkit run made is refused
before anything is made, and so is an output file that is one of the inputs.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import re
import stat
import tempfile
import time
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from bertkit.errors import BertkitError
from bertkit.output_record import (  # noqa: F401 (register and the others are re-exported: callers import them here)
    _ACTIVE,
    _OWN,
    _RESERVED,
    _UMASK,
    JOURNAL,
    LOCK,
    MARKER,
    _read_journal,
    _read_journal_into,
    _real,
    _refuse_replacing,
    _remove_scratch,
    _remove_verified,
    _safe_relative,
    _within,
    claims_for_workers,
    join_claims,
    owns,
    register,
    register_append,
    register_scratch,
    register_tree,
    remove_owned,
    remove_owned_tree,
    sha256_of,
)

_LOCK_LINE = re.compile(r"pid \d+ \(bertkit [^\n]*\)")
logger = logging.getLogger("bertkit")


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
def atomic_target(path: str | os.PathLike, verify: Any = None) -> Iterator[Path]:
    """A temporary path beside ``path`` to write (by ``atomic_write`` or a library such as safetensors'
    ``save_file``); on success it is fsynced, checked by ``verify(tmp)`` if given (raise to refuse it), renamed
    over ``path``, the directory fsynced, and the file ``register``-ed as this process's.

    On any error (a refused check included) the temporary file is removed and ``path`` is untouched. A full
    disk becomes a ``BertkitError`` naming the file.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _refuse_replacing(path)
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
        if verify is not None:
            verify(Path(tmp))
        os.replace(tmp, path)  # replaces a symlink at `path` itself, never writes through it
    except BaseException as e:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if isinstance(e, OSError) and e.errno == errno.ENOSPC:
            raise BertkitError(f"no space left on the device while writing {path}; free some space and run again "
                               "(nothing was replaced: the previous file, if any, is intact)") from e
        raise
    fsync_dir(path.parent)
    register(path)


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


def _input_paths(inputs: Mapping[str, Any]) -> list[tuple[str, Path]]:
    out = []
    for name, value in inputs.items():
        for v in value if isinstance(value, (list, tuple)) else [value]:
            if v is not None and str(v) != "" and os.path.exists(v):  # a hub-style name is no path here
                out.append((name, Path(v).resolve()))
    return out


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def refuse_inputs(output: Path, inputs: Mapping[str, Any], *, is_dir: bool, flag: str = "--output-dir") -> None:
    """A command never writes into, or clears, its own inputs: ``output`` (a directory when ``is_dir``) equal to
    an input or holding one is refused, and so is a directory inside an input directory that a bertkit run
    made (its marker there: a model, pre-training data, another run). A plain directory of the user's may hold
    the output beside the files read from it (``--data-dir glue --output-dir glue/run``): nothing read is
    touched. ``inputs`` maps each setting to its path(s)."""
    out = output.resolve()
    for name, path in _input_paths(inputs):
        if out == path:
            how = "is"
        elif out in path.parents:
            how = "holds"
        elif is_dir and path in out.parents and (path / MARKER).is_file():
            how = "is inside"
        else:
            continue
        raise BertkitError(f"{flag} {output} {how} the command's own input {_flag(name)} {path}; bertkit never "
                           "writes into or clears a command's inputs: choose an output outside them")


def refuse_existing_file(path: Path, overwrite: bool, flag: str = "--overwrite",
                         inputs: Mapping[str, Any] | None = None) -> None:
    """For commands whose output is one file: an existing file is replaced only when the user says so, never
    when it is one of the command's ``inputs``, a file another bertkit run recorded, or inside a directory
    another process holds."""
    path = Path(path)
    refuse_inputs(path, inputs or {}, is_dir=False, flag="the output file")
    if path.exists() and not overwrite:
        raise BertkitError(f"{path} already exists; pass {flag} to replace it, or choose another output file")
    if path.is_dir():
        raise BertkitError(f"{path} is a directory; give a file name (e.g. {path / 'features.jsonl'})")
    real = _real(path)
    for parent in real.parents:
        if (holder := _held_by_another(parent)) is not None:
            raise BertkitError(f"{parent} is in use by {holder}; {path} is inside it: wait for that run to finish "
                               "or choose another output file")
        if path.exists() and (parent / MARKER).is_file():
            try:
                marker = read_marker(parent) or {}
                recorded, legacy = _recorded(parent, marker)
            except BertkitError:
                marker, recorded, legacy = {}, {}, []
            if _within(real, parent) in {*recorded, *legacy}:
                raise BertkitError(f"{path} is a file of the `bertkit {marker.get('command')}` run in {parent}; "
                                   "bertkit does not replace another run's files: choose another output file")


# -------------------------------------------------------------------------------------------------
# Output directories
# -------------------------------------------------------------------------------------------------


def _listing(directory: Path) -> list[str]:
    """Every file (and symlink) under ``directory`` (relative, sorted), bertkit's own marker, lock and journal
    excluded (a nested claim's lock and journal too)."""
    out = []
    for root, dirs, files in os.walk(directory):
        dirs.sort()
        links = [d for d in dirs if Path(root, d).is_symlink()]  # os.walk does not enter them: list them
        for name in files + links:
            rel = Path(root, name).relative_to(directory).as_posix()
            if rel not in _OWN and name not in _RESERVED:
                out.append(rel)
    return sorted(out)


def read_marker(directory: Path) -> dict | None:
    try:
        marker = json.loads((directory / MARKER).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BertkitError(f"{directory / MARKER} is damaged ({e}); bertkit cannot tell which files there are "
                           "its own: choose another output directory") from None
    if not isinstance(marker, dict) or not isinstance(marker.get("files", []), (list, dict)):
        raise BertkitError(f"{directory / MARKER} is not a bertkit run marker; bertkit cannot tell which files "
                           "there are its own: choose another output directory")
    return marker


def _recorded(directory: Path, marker: dict | None) -> tuple[dict[str, dict], list[str]]:
    """(the files the marker and journal record, with size and hash; the names an older marker lists bare)."""
    files = (marker or {}).get("files") or {}
    legacy = sorted(str(f) for f in files) if isinstance(files, list) else []
    recorded = dict(files) if isinstance(files, dict) else {}
    recorded.update(_read_journal(directory))
    return recorded, legacy


def _remove_recorded(directory: Path, recorded: Mapping[str, Any],
                     check_only: bool = False) -> tuple[list[str], list[str]]:
    """--overwrite: delete exactly the files an earlier bertkit run recorded that are still as it wrote them,
    then the directories they were in if that left them empty. Returns (removed, changed since);
    ``check_only``: nothing is removed, the lists say what would be."""
    removed, changed = [], []
    for rel in sorted(r for r in recorded if r not in _OWN):
        if isinstance(recorded[rel], dict) and recorded[rel].get("scratch") is True:
            removed += _remove_scratch(directory, rel, check_only)
            continue
        result = _remove_verified(directory, rel, recorded[rel], check_only)
        (removed if result == "removed" else changed if result == "changed" else []).append(rel)
    if check_only:
        return removed, changed
    parents = sorted({p for rel in removed for p in Path(rel).parents if p.parts}, key=lambda p: -len(p.parts))
    for rel_dir in parents:
        sub = directory / rel_dir
        if sub.is_symlink() or not sub.is_dir():
            continue
        _clear_reserved(sub)
        with contextlib.suppress(OSError):
            sub.rmdir()  # only if empty: a user's file keeps its directory
    return removed, changed


def _clear_reserved(sub: Path) -> None:
    """A nested claim's lock and journal, once nothing else is left beside them and no process holds the lock."""
    names = {e.name for e in sub.iterdir()}
    if not names or not names <= _RESERVED or _held_by_another(sub) is not None:
        return
    for name in names:
        path = sub / name
        if path.is_symlink() or not path.is_file():
            return
        text = path.read_text(encoding="utf-8", errors="replace").strip()
        if name == LOCK and text and not _LOCK_LINE.fullmatch(text):
            return
    for name in names:
        (sub / name).unlink()


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
    _inherited: dict = field(default_factory=dict)  # files earlier runs of this claim recorded (--resume)
    _real: Path = Path()
    _journal: dict = field(default_factory=dict)  # this run's journal as read so far
    _journal_at: int = 0  # ... up to this byte (it only grows: read on from there)

    def recorded(self) -> dict[str, dict]:
        """The files this run and the earlier runs it continues recorded (path -> size, sha256)."""
        self._journal_at = _read_journal_into(self.path, self._journal, self._journal_at)
        return {**self._inherited, **self._journal}

    def record(self, finished: bool) -> None:
        """Write the marker: the files this and earlier runs of the same claim made and still there."""
        files = {rel: entry for rel, entry in sorted(self.recorded().items())
                 if _safe_relative(rel) and rel not in _OWN and os.path.lexists(self.path / rel)}
        marker = {"command": self.command, "fingerprint": self.fingerprint, "cwd": self._cwd, "started": self._started,
                  "finished": finished, "pid": os.getpid(), "files": files}
        atomic_write_json(self.path / MARKER, marker)

    def release(self, finished: bool, keep_lock: bool = False) -> None:
        """Record the run's files and drop the lock, or with ``keep_lock`` hold it until this process exits (a
        command's: a second command is refused while the first's process, or its torchrun job, is still there).
        A run that failed before writing anything into a directory it created leaves no trace (no empty
        directory holding only bertkit's marker and lock)."""
        if self in _ACTIVE:
            _ACTIVE.remove(self)
        if not finished and self._created and self.path.is_dir() and not _listing(self.path):
            for name in (MARKER, LOCK, JOURNAL):
                with contextlib.suppress(FileNotFoundError):
                    (self.path / name).unlink()
            with contextlib.suppress(OSError):
                self.path.rmdir()
        try:
            if self.path.is_dir() and (self.path / LOCK).exists():
                self.record(finished)
                with contextlib.suppress(FileNotFoundError):
                    (self.path / JOURNAL).unlink()  # folded into the marker
        finally:
            if self._lock is not None and keep_lock and self.path.is_dir():
                _HELD[str(self._real)] = self._lock  # the kernel drops the flock when this process exits
            elif self._lock is not None:
                self._lock.seek(0)
                self._lock.truncate()
                self._lock.close()  # closing the descriptor drops the flock
            self._lock = None


def _open_lock(directory: Path) -> IO:
    """The lock file, opened without following a symlink; refused if it is not bertkit's plain one-line file."""
    path = directory / LOCK
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, 0o666 & ~_UMASK)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise BertkitError(f"{path} is a symbolic link; bertkit never follows it (it would write through it): "
                               "this is not a directory bertkit wrote, choose another output directory") from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink > 1:
        os.close(fd)
        what = "a hard link to another file" if stat.S_ISREG(st.st_mode) else "not a regular file"
        raise BertkitError(f"{path} is {what}; bertkit would write into it: this is not a directory bertkit "
                           "wrote, choose another output directory")
    return os.fdopen(fd, "r+", encoding="utf-8", errors="replace")


_HELD: dict[str, IO] = {}  # real directory -> lock file a finished command of this process holds until it exits


def _lock(directory: Path, command: str) -> IO:
    import fcntl

    held = _HELD.pop(str(directory.resolve()), None)
    if held is not None and not held.closed:  # this process holds it already (an earlier command of it)
        held.seek(0)
        held.truncate()
        held.write(f"pid {os.getpid()} (bertkit {command})")
        held.flush()
        return held
    f = _open_lock(directory)
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
    if previous and not _LOCK_LINE.fullmatch(previous):
        f.close()
        raise BertkitError(f"{directory / LOCK} holds something bertkit did not write ({previous[:40]!r}); "
                           "bertkit will not truncate it: choose another output directory")
    if previous:  # a lock file whose process is gone: the kernel already dropped its lock
        logger.debug("%s: the previous holder (%s) has exited; taking over", directory, previous)
    f.seek(0)
    f.truncate()
    f.write(f"pid {os.getpid()} (bertkit {command})")
    f.flush()
    return f


def _held_by_another(directory: Path) -> str | None:
    """Who holds ``directory``'s lock, if another process (or another claim of this one) does; else None."""
    import fcntl

    if any(c._real == directory for c in _ACTIVE) or str(directory) in _HELD:
        return None  # this process's own claim: a command's nested run (the demo's pre-training), or held
    try:
        fd = os.open(directory / LOCK, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return os.pread(fd, 200, 0).decode("utf-8", "replace").strip() or "another process"
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def _refuse_held_nearby(directory: Path) -> None:
    """A claim inside, or around, a directory another process holds would write into its files or remove them."""
    real = directory.resolve()
    for parent in real.parents:
        if (holder := _held_by_another(parent)) is not None:
            raise BertkitError(f"{parent} is in use by {holder}, and {directory} is inside it; wait for it to "
                               "finish or choose another output directory")
    if real.is_dir():
        for root, _, files in os.walk(real):
            if LOCK in files and Path(root) != real and (holder := _held_by_another(Path(root))) is not None:
                raise BertkitError(f"{root}, inside {directory}, is in use by {holder}; wait for it to finish or "
                                   "choose another output directory")


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


def _overwrite(directory: Path, marker: dict, recorded: dict[str, dict], legacy: list[str]) -> None:
    """--overwrite: remove the earlier run's files that are still as it wrote them; refuse (naming them) when
    a recorded path leads outside the directory, when the marker is too old to prove anything, or when files
    bertkit did not write, or changed since, remain."""
    run = f"`bertkit {marker.get('command')}` run"
    outside = sorted(str(rel) for rel in [*recorded, *legacy] if not _safe_relative(rel))
    if outside:
        raise BertkitError(
            f"{directory / MARKER} names {len(outside)} path(s) outside {directory} (e.g. {', '.join(map(repr, outside[:3]))}); "
            "bertkit never writes such a marker, so it removes nothing on its word: clear the directory yourself "
            "or choose another output directory")
    if legacy:
        raise BertkitError(
            f"{directory} holds the output of a {run} made by an older bertkit, whose marker lists {len(legacy)} "
            "file name(s) without their sizes and hashes, so bertkit cannot prove which are its own (a file you "
            f"saved there may be listed): remove the files you no longer need yourself (e.g. {', '.join(legacy[:3])}) "
            "or choose another output directory")
    # All or nothing: what would be left once the run's own files are gone is known before any is removed.
    removable, changed = _remove_recorded(directory, recorded, check_only=True)
    left = [rel for rel in _listing(directory) if rel not in set(removable)]
    if left:
        why = (f"{len(changed)} of them written by that run but changed since, so yours now (e.g. "
               f"{', '.join(changed[:3])}); " if changed else "")
        raise BertkitError(
            f"{directory} holds the {len(removable)} file(s) of an earlier {run}, and {len(left)} other file(s) "
            f"remain (e.g. {', '.join(left[:3])}); {why}bertkit leaves files it did not create alone, so nothing "
            "was removed: move them or choose another output directory")
    _remove_recorded(directory, recorded)


def claim_output_dir(path: str | os.PathLike, command: str, fingerprint: dict | None = None, *,
                     overwrite: bool = False, resume: bool = False, resumable: bool = True,
                     paths: Collection[str] = (), inputs: Mapping[str, Any] | None = None) -> OutputDir:
    """Take ``path`` for one run of ``command``: lock it, check whose files are there, write the marker.

    - equal to one of the command's ``inputs`` (setting name -> path or paths), holding one or inside one:
      refused before anything is made;
    - inside or around a directory another process holds: refused;
    - empty or absent: claimed;
    - holding a marker of the same command and settings and ``resume``: claimed, the run continues there
      (other settings are refused, naming them; the ``fingerprint`` entries named in ``paths`` are paths,
      compared as absolute paths, so a run may be resumed from another working directory);
    - holding a bertkit marker otherwise: refused, unless ``overwrite`` (the recorded files still as they were
      written are removed; anything else left there is named and refused);
    - holding files without a marker (a user's, or another tool's): always refused.
    """
    directory = Path(path)
    refuse_inputs(directory, inputs or {}, is_dir=True)
    if directory.exists() and not directory.is_dir():
        raise BertkitError(f"{directory} is a file; the output must be a directory")
    _refuse_held_nearby(directory)
    created = not directory.exists()
    directory.mkdir(parents=True, exist_ok=True)
    lock = _lock(directory, command)
    try:
        marker = read_marker(directory)
        present = _listing(directory)
        recorded, legacy = _recorded(directory, marker)
        inherited: dict[str, dict] = {}
        if marker is None and present:
            raise BertkitError(
                f"{directory} already holds {len(present)} file(s) bertkit did not write there (e.g. "
                f"{', '.join(present[:3])}); bertkit never replaces files it did not create: choose an empty "
                "or new output directory")
        if marker is not None and (present or recorded or legacy):
            same = marker.get("command") == command
            if resume and same:
                _refuse_other_settings(directory, command, marker, fingerprint or {}, paths)
                inherited = {rel: e for rel, e in recorded.items() if _safe_relative(rel)}
            elif overwrite:
                _overwrite(directory, marker, recorded, legacy)
            else:
                what = f"`bertkit {marker.get('command')}` run"
                fixes = "pass --resume to continue it, " if same and resumable else ""
                raise BertkitError(
                    f"{directory} already holds the output of a {what} ({len(present)} file(s)); {fixes}pass "
                    "--overwrite to replace it (only the files bertkit wrote there are removed), or choose "
                    "another output directory")
        claim = OutputDir(directory, command, fingerprint or {}, lock, time.time(), created, os.getcwd(),
                          inherited, directory.resolve())
        if resume and marker is not None and marker.get("command") == command:
            claim._started = float(marker.get("started", claim._started))
        atomic_write_text(directory / JOURNAL, "")  # this run's journal; the earlier one is in `inherited`
        claim.record(finished=False)
        _ACTIVE.append(claim)
        return claim
    except BaseException:
        lock.close()
        raise


@contextlib.contextmanager
def output_dir(path: str | os.PathLike, command: str, fingerprint: dict | None = None, *, overwrite: bool = False,
               resume: bool = False, resumable: bool = True, paths: Collection[str] = (),
               inputs: Mapping[str, Any] | None = None, keep_lock: bool = False) -> Iterator[OutputDir]:
    """``claim_output_dir`` as a context: the marker records the run's files on the way out, even on errors;
    ``keep_lock``: the lock is held until the process exits (``OutputDir.release``)."""
    claim = claim_output_dir(path, command, fingerprint, overwrite=overwrite, resume=resume, resumable=resumable,
                             paths=paths, inputs=inputs)
    finished = False
    try:
        yield claim
        finished = True
    finally:
        claim.release(finished, keep_lock)
