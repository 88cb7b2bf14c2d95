"""What this process wrote, and what the runs of a claimed output directory recorded: the proof
``bertkit.outputs`` asks for before it removes or replaces a file.

Every file bertkit writes is ``register``-ed: in this process, by its identity (device, inode, size, mtime), and
for each claimed output directory holding it, as one line of that directory's journal (``.bertkit-files.jsonl``:
path, size, sha256), appended the moment it is written, so a SIGKILLed run's files are recorded too. Worker
processes ``join_claims`` their parent's directories and record their files the same way. ``owns`` is the one
test: a regular file, never a symlink, that this process wrote and nobody changed since, or that an active
claim recorded with the same size and sha256, or that lies in a scratch directory a run made for one write.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from bertkit.errors import BertkitError

MARKER = ".bertkit-run.json"
LOCK = ".bertkit-lock"
JOURNAL = ".bertkit-files.jsonl"
_OWN = {MARKER, LOCK, JOURNAL}
_RESERVED = {LOCK, JOURNAL}  # bertkit's bookkeeping at any depth (a nested claim's); never a user's file
_UMASK = os.umask(0)
os.umask(_UMASK)  # read once: files bertkit creates get the permissions a plain open() would have given


# -------------------------------------------------------------------------------------------------
# What this process wrote
# -------------------------------------------------------------------------------------------------

_WRITTEN: dict[str, tuple[int, int, int, int]] = {}  # real path -> (dev, inode, size, mtime_ns) as written
_HASHES: dict[tuple[int, int, int, int], str] = {}  # (dev, inode, size, mtime_ns) -> sha256: a rename keeps it
_RUNNING: dict[str, tuple[tuple[int, int, int, int], Any]] = {}  # appended files: identity and running sha256
_SCRATCH: set[str] = set()  # real paths of directories this process made for one write (a checkpoint's)
_ACTIVE: list[Any] = []  # the OutputDirs this process has claimed and not released (bertkit.outputs)
_JOINED: list[tuple[Path, Path]] = []  # (directory, journal) of a parent process's claims, in its workers


def _sha256_stream(f: Any) -> str:
    digest = hashlib.sha256()
    for block in iter(lambda: f.read(1 << 20), b""):
        digest.update(block)
    return digest.hexdigest()


def sha256_of(path: str | os.PathLike) -> str:
    with open(path, "rb") as f:
        return _sha256_stream(f)


def _real(path: str | os.PathLike) -> Path:
    """``path`` with its directory's symlinks resolved and its last component kept as it is."""
    path = Path(os.path.abspath(path))
    return Path(os.path.realpath(path.parent)) / path.name


def _identity(st: os.stat_result) -> tuple[int, int, int, int]:
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def _within(path: Path, directory: Path) -> str | None:
    """``path`` relative to ``directory`` (both real), or None when it is not inside it."""
    try:
        rel = path.relative_to(directory)
    except ValueError:
        return None
    return rel.as_posix() if rel.parts else None


def _claims() -> list[tuple[Path, Path]]:
    return [(c._real, c._real / JOURNAL) for c in _ACTIVE] + list(_JOINED)


def register(path: str | os.PathLike, sha256: str | None = None) -> None:
    """Record that this process wrote the regular file ``path`` (its size and, for a claimed directory holding
    it, its sha256): bertkit may later remove or replace it. Call it after any write that does not go through
    ``atomic_target`` (``torch.save``, a library's own writer, an append); ``sha256`` if already known."""
    real = _real(path)
    try:
        st = os.lstat(real)
    except FileNotFoundError:
        return
    if not stat.S_ISREG(st.st_mode):
        return
    ident = _identity(st)
    _WRITTEN[str(real)] = ident
    for directory, journal in _claims():
        rel = _within(real, directory)
        if rel is None or rel in _OWN or Path(rel).name in _RESERVED:
            continue
        sha256 = sha256 or _HASHES.get(ident) or sha256_of(real)
        _HASHES[ident] = sha256
        _append_line(journal, {"path": rel, "size": st.st_size, "sha256": sha256})


def register_append(path: str | os.PathLike, data: bytes) -> None:
    """``register`` after appending ``data`` to ``path`` (metrics.jsonl): its hash is carried on from the last
    append instead of reading the whole file again, while the file is the one this process last saw."""
    real = _real(path)
    try:
        st = os.lstat(real)
    except FileNotFoundError:
        return
    before = _RUNNING.get(str(real))
    if before is not None and before[0][:2] == (st.st_dev, st.st_ino) and before[0][2] + len(data) == st.st_size:
        digest = before[1]
        digest.update(data)
    else:  # first append, or the file was replaced or grown by someone else: hash it whole
        digest = hashlib.sha256()
        with open(real, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    _RUNNING[str(real)] = (_identity(st), digest)
    register(real, digest.hexdigest())


def register_scratch(directory: str | os.PathLike) -> None:
    """Record ``directory``, just made (``mkdir`` refuses an existing one) for one write that a kill may cut
    short (a checkpoint written under a temporary name and renamed): whatever is inside it is this run's, so a
    torn write left there by a kill can be removed although its final size and hash were never recorded."""
    real = _real(directory)
    _SCRATCH.add(str(real))
    for root, journal in _claims():
        rel = _within(real, root)
        if rel is not None:
            _append_line(journal, {"path": rel, "scratch": True})


def register_tree(directory: str | os.PathLike) -> None:
    """``register`` every regular file under ``directory`` (which this process has just written, whole)."""
    for root, dirs, files in os.walk(directory):
        dirs.sort()
        for name in sorted(files):
            register(Path(root, name))


def claims_for_workers() -> list[tuple[str, str]]:
    """The claims of this process, for worker processes to ``join_claims``: their writes are then recorded in
    the directories' journals as they happen (a killed run's shards are its own, not a stranger's)."""
    return [(str(d), str(j)) for d, j in _claims()]


def join_claims(claims: Iterable[tuple[str, str]]) -> None:
    """In a worker process: record this process's writes into its parent's claimed directories."""
    _JOINED[:] = [(Path(d), Path(j)) for d, j in claims]


def _append_line(journal: Path, entry: dict) -> None:
    line = (json.dumps(entry, ensure_ascii=False) + "\n").encode("utf-8")
    fd = os.open(journal, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666 & ~_UMASK)
    try:
        os.write(fd, line)  # one write of one line with O_APPEND: workers' lines never interleave
    finally:
        os.close(fd)


def owns(path: str | os.PathLike) -> bool:
    """Whether bertkit may remove or replace ``path``: a regular file (not a symlink) this process wrote and
    nobody changed since, or one an active claim recorded (this or an earlier run of it) with the same size
    and sha256."""
    real = _real(path)
    try:
        st = os.lstat(real)
    except FileNotFoundError:
        return False
    if not stat.S_ISREG(st.st_mode):
        return False
    if _WRITTEN.get(str(real)) == _identity(st) or any(str(p) in _SCRATCH for p in real.parents):
        return True
    for claim in _ACTIVE:
        rel = _within(real, claim._real)
        if rel is None:
            continue
        recorded = claim.recorded()
        if any(recorded.get(p.as_posix(), {}).get("scratch") for p in Path(rel).parents if p.parts):
            return True
        if (entry := recorded.get(rel)) and _matches(real, entry, st):
            return True
    return False


def _matches(path: Path, entry: Any, st: os.stat_result) -> bool:
    return (isinstance(entry, dict) and entry.get("size") == st.st_size and isinstance(entry.get("sha256"), str)
            and sha256_of(path) == entry["sha256"])


def _refuse_replacing(path: Path) -> None:
    """Inside a claimed directory, a file is replaced only if this run (or the run it resumes) wrote it, as it
    wrote it or with a torn append after that (a kill mid-append to metrics.jsonl); a file a user saved there
    meanwhile, or changed since, is refused by name. Outside any claim (the Python API) the caller decides."""
    if path.name in _OWN or not os.path.lexists(path):
        return
    real = _real(path)
    claims = [c for c in _ACTIVE if _within(real, c._real) is not None]
    if not claims or owns(path):
        return
    st = os.lstat(real)
    for claim in claims:
        entry = claim.recorded().get(_within(real, claim._real) or "")
        if (stat.S_ISREG(st.st_mode) and isinstance(entry, dict) and isinstance(entry.get("size"), int)
                and entry["size"] <= st.st_size and _prefix_sha256(real, entry["size"]) == entry.get("sha256")):
            return
    raise BertkitError(f"{path} is not a file this run wrote (saved there meanwhile, or changed since it was "
                       "written); bertkit does not replace it: move it away and run again")


def _prefix_sha256(path: Path, size: int) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while size > 0 and (block := f.read(min(1 << 20, size))):
            digest.update(block)
            size -= len(block)
    return digest.hexdigest()


def remove_owned(path: str | os.PathLike) -> bool:
    """Remove ``path`` if bertkit ``owns`` it; returns whether it did (anything else is left in place)."""
    if not owns(path):
        return False
    os.unlink(_real(path))
    _WRITTEN.pop(str(_real(path)), None)
    return True


def remove_owned_tree(directory: str | os.PathLike) -> list[str]:
    """Remove the files under ``directory`` that bertkit ``owns``, then the directories left empty (the
    directory itself too); symlinks are never followed. Returns what was left (relative paths): a user's
    files, or files changed since bertkit wrote them."""
    directory = Path(directory)
    if directory.is_symlink() or not directory.is_dir():
        return []
    left = []
    for root, dirs, files in os.walk(directory, topdown=False):
        for name in files + [d for d in dirs if Path(root, d).is_symlink()]:
            path = Path(root, name)
            if not remove_owned(path):
                left.append(path.relative_to(directory).as_posix())
        with contextlib.suppress(OSError):
            os.rmdir(root)  # only if empty
    return sorted(left)


def _read_journal(directory: Path) -> dict[str, dict]:
    """The files a run registered as it wrote them (the last entry of each path wins; a torn last line, from a
    kill mid-append, is dropped)."""
    entries: dict[str, dict] = {}
    _read_journal_into(directory, entries, 0)
    return entries


def _read_journal_into(directory: Path, entries: dict[str, dict], start: int) -> int:
    """Add the journal's whole lines from byte ``start`` on to ``entries``; returns where the next read starts."""
    try:
        fd = os.open(directory / JOURNAL, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return start
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise BertkitError(f"{directory / JOURNAL} is a symbolic link; bertkit does not follow it: this is not "
                               "a directory bertkit wrote, choose another output directory") from None
        raise
    with os.fdopen(fd, "rb") as f:
        if os.fstat(f.fileno()).st_size < start:  # a new journal (a new claim): read it from the start
            start = 0
        f.seek(start)
        data = f.read()
    end = data.rfind(b"\n") + 1  # whole lines only: a worker may be writing the next one
    for line in data[:end].splitlines():
        try:
            entry = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError):
            continue
        if isinstance(entry, dict) and isinstance(entry.get("path"), str):
            entries[entry["path"]] = ({"scratch": True} if entry.get("scratch") is True else
                                      {"size": entry.get("size"), "sha256": entry.get("sha256")})
    return start + end


# -------------------------------------------------------------------------------------------------
# Removing what a marker records, only as it was written (--overwrite)
# -------------------------------------------------------------------------------------------------


def _safe_relative(rel: Any) -> bool:
    """A marker's path names a file inside its directory: relative, no '..', '.', empty part or NUL."""
    if not isinstance(rel, str) or not rel or "\x00" in rel or rel.startswith("/"):
        return False
    return all(p not in ("", ".", "..") for p in rel.split("/"))


def _open_parent(directory: Path, rel: str) -> tuple[int, str] | None:
    """A descriptor of ``rel``'s parent, reached from ``directory`` without following any symlink (None if a
    component is missing or is not a real directory), and ``rel``'s last name."""
    *parts, name = rel.split("/")
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    for part in parts:
        try:
            nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
        except OSError:
            os.close(fd)
            return None
        os.close(fd)
        fd = nxt
    return fd, name


def _remove_verified(directory: Path, rel: str, entry: Any, check_only: bool = False) -> str:
    """Remove ``directory/rel`` if it is still the file recorded: 'removed', 'changed' (left: the user's now)
    or 'missing'. ``check_only``: remove nothing, answer 'removed' for a file that would be."""
    opened = _open_parent(directory, rel)
    if opened is None:
        return "missing"
    fd, name = opened
    try:
        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            return "missing"
        if not stat.S_ISREG(st.st_mode) or not isinstance(entry, dict) or entry.get("size") != st.st_size:
            return "changed"
        try:
            file_fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
        except OSError:
            return "changed"
        with os.fdopen(file_fd, "rb") as f:
            digest = _sha256_stream(f)
        if digest != entry.get("sha256"):
            return "changed"
        if not check_only:
            os.unlink(name, dir_fd=fd)
        return "removed"
    finally:
        os.close(fd)


def _remove_scratch(directory: Path, rel: str, check_only: bool = False) -> list[str]:
    """A scratch directory a killed run left (``register_scratch``): its regular files and directories, reached
    without following a symlink (one inside it, and what it points to, is left). ``check_only``: list them."""
    opened = _open_parent(directory, rel)
    if opened is None:
        return []
    fd, name = opened
    try:
        if not stat.S_ISDIR(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode):
            return []
    except FileNotFoundError:
        return []
    finally:
        os.close(fd)
    removed = []
    for root, dirs, files in os.walk(directory / rel, topdown=False):
        for entry in files:
            path = Path(root, entry)
            if stat.S_ISREG(os.lstat(path).st_mode):
                if not check_only:
                    path.unlink()
                removed.append(path.relative_to(directory).as_posix())
        for entry in dirs if not check_only else []:
            with contextlib.suppress(OSError):
                os.rmdir(Path(root, entry))  # a symlink here is no directory: rmdir refuses it
    if not check_only:
        with contextlib.suppress(OSError):
            os.rmdir(directory / rel)
    return removed
