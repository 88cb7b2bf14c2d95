"""Which process may write a directory: an ``flock`` on ``.bertkit-lock`` inside the directory it writes.

bertkit writes a directory TARGET whole into its staging directory ``.TARGET.bertkit-staging`` beside it, locked
there, and renames it into place when complete (``bertkit.outputs``): the lock file moves with it, so the lock
holds the same before and after. A run that writes into TARGET as it goes (the Trainer's) locks TARGET itself.
Either way a second writer takes its own lock first and then looks at the other place, so one of two writers that
start together is always refused.

The lock is taken without waiting; the file holds one line naming its holder ("pid 12 (bertkit pretrain)") for
another command's refusal to name. A command holds it until its process exits, when the kernel drops it, so a
crash leaves no stale lock. The file is opened without following a symlink and is written to only if it is
bertkit's plain one-line file.
"""

from __future__ import annotations

import os
import re
import stat
import time
from pathlib import Path

from bertkit.errors import BertkitError

LOCK = ".bertkit-lock"
STAGING = ".bertkit-staging"
_LINE = re.compile(r"pid \d+ \(bertkit [^\n]*\)")
# real directory -> the lock this process holds on it: a raw descriptor (the flock), not a file object, since it is
# held until the process exits and a file object left open then is reported as a ResourceWarning
_HELD: dict[str, int] = {}
_KEPT: set[str] = set()  # of those, the finished runs' (a command's, held until the process exits)


class Held(BertkitError):
    """A directory's lock is another process's: ``holder`` is the line it wrote ("pid 12 (bertkit save)")."""

    def __init__(self, message: str, holder: str):
        super().__init__(message)
        self.holder = holder


def staging_path(target: Path) -> Path:
    """Where ``target`` is written before it is renamed into place: ``.NAME.bertkit-staging`` beside it."""
    return target.parent / f".{target.name}{STAGING}"


def is_staging(path: Path) -> bool:
    return path.name.startswith(".") and path.name.endswith(STAGING) and len(path.name) > len(STAGING) + 1


def placed_path(path: Path) -> Path:
    """The directory a staging directory becomes once it is renamed into place (``path`` itself if it is none)."""
    return path.parent / path.name[1:-len(STAGING)] if is_staging(path) else path


def lock(directory: Path, command: str) -> None:
    """Take ``directory``'s lock without waiting (or keep the one this process holds); refused naming the holder."""
    real = str(directory.resolve())
    if (fd := _HELD.get(real)) is None:
        path, fix = directory / LOCK, "choose another output directory"
        fd = _open_lock(path, f", so this is not a directory bertkit wrote; {fix}")
        if (holder := _holder(fd, exclusive=True)) is not None:
            os.close(fd)
            raise Held(f"{directory} is in use by {holder}; wait for it to finish or choose another output "
                       "directory", holder) from None
        _claim(fd, path, command, fix)
        _HELD[real] = fd
    else:
        _write_line(fd, command)
    _KEPT.discard(real)


def _open_lock(path: Path, fix: str) -> int:
    """``path`` opened as a lock file, refused (``fix``: what the user does) where bertkit would write through it."""
    st = os.lstat(path) if os.path.lexists(path) else None
    if st is not None and (not stat.S_ISREG(st.st_mode) or st.st_nlink > 1):
        raise BertkitError(f"{path} is a symbolic link, a hard link or not a regular file: not bertkit's lock{fix}")
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, 0o666)


def _claim(fd: int, path: Path, command: str, fix: str) -> None:
    """Write this process's line into the lock ``fd`` now holds, refused where its line is not bertkit's; ``fd`` is
    closed where it fails (a full disk: not held, or every later write of the directory in this process was refused
    as "the output directory of this process's run already")."""
    try:
        if (previous := _line(fd)) and not _LINE.fullmatch(previous):
            raise BertkitError(f"{path} holds something bertkit did not write ({previous[:40]!r}); bertkit will "
                               f"not truncate it: {fix}")
        _write_line(fd, command)
    except BaseException:
        os.close(fd)
        raise


def _write_line(fd: int, command: str) -> None:
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"pid {os.getpid()} (bertkit {command})".encode(), 0)


def lock_file(path: Path, command: str) -> None:
    """Take the lock file ``path`` (beside a one-file output: ``.NAME.bertkit-partial.lock``) without waiting, or keep
    the one this process holds; refused (``Held``) naming the holder. ``unlock_file`` removes it while still held, so
    a process that opened it just before finds, once it has the lock, a file no longer at ``path``, and tries again."""
    real = str(Path(os.path.realpath(path.parent)) / path.name)
    if (fd := _HELD.get(real)) is not None:
        _write_line(fd, command)
        return
    fix = "move it away or choose another output file"
    while True:
        fd = _open_lock(path, f"; {fix}")
        if (holder := _holder(fd, exclusive=True)) is not None:
            os.close(fd)
            raise Held(f"{path} is held by {holder}", holder)
        held = os.fstat(fd)
        try:
            here = os.lstat(path)
        except FileNotFoundError:
            here = None
        if here is None or (here.st_dev, here.st_ino) != (held.st_dev, held.st_ino):
            os.close(fd)  # removed by the holder that just let go: the lock is the file at ``path`` now
            continue
        _claim(fd, path, command, fix)
        _HELD[real] = fd
        return


def unlock_file(path: Path) -> None:
    """Let go of the lock file ``path`` this process holds (``lock_file``), removing it first."""
    if (fd := _HELD.pop(str(Path(os.path.realpath(path.parent)) / path.name), None)) is not None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        finally:
            os.close(fd)


def _line(fd: int) -> str:
    return os.pread(fd, 200, 0).decode("utf-8", "replace").strip()


def is_lock_line(text: str) -> bool:
    """Whether ``text`` is what bertkit writes into a lock file (nothing, or its holder's line)."""
    return not text or bool(_LINE.fullmatch(text))


def unlock(directory: Path | str) -> None:
    _KEPT.discard(str(Path(directory).resolve()))
    if (fd := _HELD.pop(str(Path(directory).resolve()), None)) is not None:
        os.close(fd)  # closing the descriptor drops the flock (the pid it names is a past holder's)


def holds(directory: Path) -> bool:
    """Whether this process holds ``directory``'s lock."""
    return str(directory.resolve()) in _HELD


def keep(directory: Path) -> None:
    """The run in ``directory`` has finished; its lock is held until this process exits (against other processes),
    and this process may claim the directory again."""
    _KEPT.add(str(directory.resolve()))


def lock_file_in(directory: Path) -> bool:
    """Whether the lock this process holds on ``directory`` is still the lock file in it: a swap moves a directory's
    content, its lock file with it, away from the name the lock is held by."""
    fd = _HELD.get(str(directory.resolve()))
    try:
        here, held = os.lstat(directory / LOCK), os.fstat(fd) if fd is not None else None
    except (OSError, ValueError):
        return False
    return held is not None and (here.st_dev, here.st_ino) == (held.st_dev, held.st_ino)


def writing_here(directory: Path) -> bool:
    """Whether a run of this process is writing ``directory`` (its lock held and the run not finished)."""
    return holds(directory) and str(directory.resolve()) not in _KEPT


def holder_command(directory: Path) -> str:
    """The command this process named when it took ``directory``'s lock ("" if it holds none)."""
    fd = _HELD.get(str(directory.resolve()))
    line = _line(fd) if fd is not None else ""
    match = re.fullmatch(r"pid \d+ \(bertkit (.*)\)", line)
    return match.group(1) if match else ""


def moved(old: str, new: Path) -> None:
    """The locked directory ``old`` (its resolved path, a staging directory: never kept) was renamed to ``new`` (its
    lock file with it: the flock is the same)."""
    if (fd := _HELD.pop(old, None)) is not None:
        unlock(new)  # the lock of a directory this one replaced (its file is gone with it)
        _HELD[str(new.resolve())] = fd


def _holder(fd: int, exclusive: bool) -> str | None:
    """None once this process has the lock open at ``fd``; else who holds it (the line the holder wrote).

    An exclusive lock is also refused while another process probes the lock (``held_by_another``'s shared lock, held
    for microseconds): where a shared lock can be had at that moment no one holds it, and the exclusive one is tried
    again. Refused for a probe, a rank of a torchrun job saving beside another that polls its write failed with
    "in use by another process"."""
    import fcntl  # POSIX only: imported where a lock is taken, not where bertkit is

    def probed_only() -> bool:  # a shared lock can be had: what refused the exclusive one was a probe's
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        fcntl.flock(fd, fcntl.LOCK_UN)
        return True

    for _ in range(1000):  # a second at most, if probes never stop
        try:
            fcntl.flock(fd, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
            return None
        except BlockingIOError:
            if not (exclusive and probed_only()):
                break
        time.sleep(0.001)
    for _ in range(200):  # the holder writes its line just after taking the lock: an empty file is that instant (a
        # torchrun rank saving beside another read it so, and its save failed with "in use by another process")
        if line := _line(fd):
            return line
        time.sleep(0.001)
    return "another process"


def _held_at(directory: Path) -> str | None:
    if holds(directory):
        return None  # this process's own: a command's nested run (the demo's pre-training)
    try:
        fd = os.open(directory / LOCK, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        return _holder(fd, exclusive=False) if stat.S_ISREG(os.fstat(fd).st_mode) else None
    finally:
        os.close(fd)  # drops the shared lock the probe took


def held_by_another(directory: Path) -> str | None:
    """Who holds ``directory``'s lock, or its staging directory's (a write of it under way), if another process
    does; else None."""
    return _held_at(directory) or (None if is_staging(directory) else _held_at(staging_path(directory)))


def refuse_held_near(real: Path, path: Path, *, inside: bool = False) -> None:
    """A write into a directory another process holds would replace or remove its files: refuse ``path`` (real:
    ``real``) inside one, and with ``inside`` a directory ``path`` holding one."""
    for parent in real.parents:
        if (holder := held_by_another(parent)) is not None:
            raise BertkitError(f"{parent} is in use by {holder}, and {path} is inside it; wait for it to finish "
                               "or choose another output")
    for root, _, files in os.walk(real) if inside else ():
        if LOCK in files and Path(root) != real and (holder := _held_at(Path(root))) is not None:
            raise BertkitError(f"{root}, inside {path}, is in use by {holder}; wait for it to finish or "
                               "choose another output directory")
