"""Which process may write into an output directory: an ``flock`` on ``.bertkit-lock`` inside it.

The lock is taken without waiting; the file holds one line naming its holder ("pid 12 (bertkit pretrain)") for
another command's refusal to name. A command holds it until its process exits, when the kernel drops it, so a
crash leaves no stale lock. The file is opened without following a symlink and is written to only if it is
bertkit's plain one-line file. ``bertkit.outputs`` takes it before it checks or removes anything.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
from pathlib import Path
from typing import IO

from bertkit.errors import BertkitError

LOCK = ".bertkit-lock"
_LINE = re.compile(r"pid \d+ \(bertkit [^\n]*\)")
_HELD: dict[str, IO] = {}  # real directory -> the lock this process holds on it
_MADE: set[str] = set()  # real directories whose lock file this process created (the only ones it may remove)


def lock(directory: Path, command: str) -> IO:
    """``directory``'s lock, taken without waiting (or the one this process holds); refused naming the holder."""
    real = str(directory.resolve())
    if (f := _HELD.get(real)) is None or f.closed:
        path = directory / LOCK
        st = os.lstat(path) if os.path.lexists(path) else None
        if st is not None and (not stat.S_ISREG(st.st_mode) or st.st_nlink > 1):  # bertkit would write through it
            raise BertkitError(f"{path} is a symbolic link, a hard link or not a regular file: not bertkit's lock, "
                               "so this is not a directory bertkit wrote; choose another output directory")
        flags = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
        try:  # O_EXCL: created by this very call, the one lock file this process may remove later
            fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o666)
            _MADE.add(real)
        except FileExistsError:  # an earlier run's, or another process's made meanwhile: used, never removed
            fd = os.open(path, flags)
        f = os.fdopen(fd, "r+", encoding="utf-8", errors="replace")
        if (holder := _holder(f.fileno(), exclusive=True)) is not None:
            f.close()
            raise BertkitError(f"{directory} is in use by {holder}; wait for it to finish or choose another "
                               "output directory") from None
        if (previous := f.read().strip()) and not _LINE.fullmatch(previous):
            f.close()
            raise BertkitError(f"{path} holds something bertkit did not write ({previous[:40]!r}); bertkit will "
                               "not truncate it: choose another output directory")
        _HELD[real] = f
    f.seek(0)
    f.truncate()
    f.write(f"pid {os.getpid()} (bertkit {command})")
    f.flush()
    return f


def unlock(real: Path | str) -> None:
    if (f := _HELD.pop(str(real), None)) is not None:
        f.close()  # closing the descriptor drops the flock (the pid it names is a past holder's)


def remove_made(directory: Path) -> None:
    """Remove ``directory``'s lock file if this process created it and the path is still that file (the one it
    holds open: same device and inode), so a file put in its place since is left alone."""
    real = str(directory.resolve())
    f = _HELD.get(real)
    if real in _MADE and f is not None and not f.closed:
        held = os.fstat(f.fileno())
        with contextlib.suppress(FileNotFoundError):
            now = os.lstat(directory / LOCK)
            if (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino):
                (directory / LOCK).unlink()
    _MADE.discard(real)


def _holder(fd: int, exclusive: bool) -> str | None:
    """None once this process has the lock open at ``fd``; else who holds it (the line the holder wrote)."""
    import fcntl  # POSIX only: imported where a lock is taken, not where bertkit is

    try:
        fcntl.flock(fd, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
    except BlockingIOError:
        return os.pread(fd, 200, 0).decode("utf-8", "replace").strip() or "another process"
    return None


def held_by_another(directory: Path) -> str | None:
    """Who holds ``directory``'s lock, if another process does; else None."""
    if (f := _HELD.get(str(directory))) is not None and not f.closed:
        return None  # this process's own: a command's nested run (the demo's pre-training)
    try:
        fd = os.open(directory / LOCK, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        return _holder(fd, exclusive=False) if stat.S_ISREG(os.fstat(fd).st_mode) else None
    finally:
        os.close(fd)  # drops the shared lock the probe took


def refuse_held_near(real: Path, path: Path, *, inside: bool = False) -> None:
    """A write into a directory another process holds would replace or remove its files: refuse ``path`` (real:
    ``real``) inside one, and with ``inside`` a directory ``path`` holding one."""
    for parent in real.parents:
        if (holder := held_by_another(parent)) is not None:
            raise BertkitError(f"{parent} is in use by {holder}, and {path} is inside it; wait for it to finish "
                               "or choose another output")
    for root, _, files in os.walk(real) if inside else ():
        if LOCK in files and Path(root) != real and (holder := held_by_another(Path(root))) is not None:
            raise BertkitError(f"{root}, inside {path}, is in use by {holder}; wait for it to finish or "
                               "choose another output directory")
