"""How bertkit writes a file: to a temporary file beside it (``.NAME.<random>.<pid>.bertkit-tmp``), fsynced and
renamed over it, so the name holds the earlier file or the new one, whole; a symlink at the name is replaced, never
followed, and a dead writer's temporary file is removed by the next command writing that name. A full disk or a
refused directory is one ``WriteError`` line. Also the names of bertkit's own files (its bookkeeping).

Directories are staged and swapped in by ``bertkit.staging``; what proves a file bertkit's (its manifests) is
``bertkit.manifests``; which directory a command may write, ``bertkit.runs``. No state is kept in the process but
the locks it holds: ownership is a property of the directory.
"""
from __future__ import annotations

import contextlib
import errno
import glob
import hashlib
import json
import logging
import math
import os
import re
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from bertkit import dir_lock
from bertkit.dir_lock import LOCK
from bertkit.errors import BertkitError, WriteError

logger = logging.getLogger("bertkit")
MARKER = ".bertkit-run.json"  # a finished run's manifest (a checkpoint's: its files only)
PARTIAL = ".bertkit-partial"  # in a staging directory: a write under way or cut short (for a run: which one)
TMP_SUFFIX = ".bertkit-tmp"
BOOKKEEPING = (LOCK, MARKER, PARTIAL)  # bertkit's own files at any depth, never counted as a user's
_UMASK = os.umask(0)
os.umask(_UMASK)  # read once: files bertkit creates get the permissions a plain open() would have given
# Output files a command was not told to replace (no --overwrite; ``expect_new``): each is made visible by a link
# that fails where a file appeared meanwhile, not by a rename over it. Per process, as the directory locks are.
_NEW_ONLY: set[str] = set()
_NO_HARD_LINKS = (errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EXDEV, errno.EMLINK)


def expect_new(path: Path, new: bool) -> None:
    """``path`` (absolute) is to be created by this process's next write of it (``new``), or may be replaced."""
    (_NEW_ONLY.add if new else _NEW_ONLY.discard)(str(path))


def _publish(tmp: Path, path: Path) -> None:
    """``tmp`` renamed to ``path``; one ``expect_new`` named is linked there instead, which fails if another process
    made ``path`` meanwhile (two runs into one output file without --overwrite: the first one's file is kept)."""
    if str(path.absolute()) not in _NEW_ONLY:
        os.replace(tmp, path)  # replaces a symlink at `path` itself, never writes through it
        return
    try:
        os.link(tmp, path)
    except FileExistsError:
        raise BertkitError(f"{path} was written by another process while this command ran; it was not replaced "
                           "(this command's output is discarded): pass --overwrite to replace it, or choose another "
                           "output file") from None
    except OSError as e:
        if e.errno not in _NO_HARD_LINKS:
            raise
        os.replace(tmp, path)  # a file system without hard links: renamed, as with --overwrite
    else:
        os.unlink(tmp)  # this write's own temporary name (mkstemp's, just made): the file lives on at `path`
    _NEW_ONLY.discard(str(path.absolute()))


# -- Errors a file system gives a write ---------------------------------------------------------------------------

_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
_REFUSED = (errno.EROFS, errno.EACCES, errno.EPERM)


def is_mount_point(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a mount point, which a rename can neither replace nor move (EBUSY): ``os.path.ismount``,
    or a mount listed in /proc/self/mountinfo. ``ismount`` compares devices and inodes with the parent's, so a bind
    mount from the same file system (a file's too) looked like a plain directory or file to it."""
    if not os.path.lexists(path):
        return False
    if os.path.ismount(path):
        return True
    return os.path.realpath(path) in _mount_points()


def mount_point_in(directory: str | os.PathLike) -> Path | None:
    """A mount point inside ``directory`` (at any depth), if any: a swap of the directory would carry the mount away
    with the directory it replaced, out of the user's tree (a container's volume at ``out/data``)."""
    if not os.path.isdir(directory) or os.path.islink(directory):
        return None
    real = Path(os.path.realpath(directory))
    return next((Path(p) for p in sorted(_mount_points()) if real in Path(p).parents), None)


def _mount_points() -> set[str]:
    """Every mount point in /proc/self/mountinfo (none where there is no /proc: not Linux)."""
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as f:
            # field 5 is the mount point, its space, tab, newline and backslash written as octal escapes (\040)
            return {re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), line.split()[4]) for line in f}
    except (OSError, IndexError):
        return set()


def read_only_mount(path: str | os.PathLike) -> bool:
    """Whether ``path``, or its nearest existing parent, lies on a file system mounted read-only (where root is
    refused too, and no chmod helps)."""
    path = os.path.abspath(path)
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def _errno_of(e: BaseException) -> int | None:
    if isinstance(e, OSError):
        return e.errno
    text = str(e)
    if match := re.search(r"\(os error (\d+)\)", text):  # safetensors' writer: "I/O error: ... (os error 28)"
        return int(match.group(1))
    if isinstance(e, RuntimeError) and ("unexpected pos" in text or "PytorchStreamWriter failed" in text):
        # torch's zip writer reports a short write in these words only, without the system's code: a file-size
        # limit when the process has one (the disk may well have room), else a full disk
        return errno.EFBIG if file_size_limit() is not None else errno.ENOSPC
    return None


def file_size_limit() -> int | None:
    """The most bytes this process may write to one file (``ulimit -f``, RLIMIT_FSIZE), or None: no limit."""
    try:
        import resource
    except ImportError:  # not a POSIX system
        return None
    soft = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    return None if soft == resource.RLIM_INFINITY else soft


def why_full(code: int) -> tuple[str, str]:
    """(what refused a write, what to do) for a code of ``disk_full``, in words that name the actual limit: a file
    refused by ``ulimit -f`` on a disk with room said "no space left on the device ... free some space"."""
    if code == errno.EFBIG:
        limit = file_size_limit()
        if limit is not None:
            return (f"this process's file-size limit, {limit} bytes (ulimit -f), was reached",
                    "raise the limit (ulimit -f unlimited) and run again")
        return "the file system's largest file size was reached", "write to another file system"
    if code == errno.EDQUOT:
        return "the disk quota was exceeded", "free some of the quota (or have it raised) and run again"
    return "no space left on the device", "free some space and run again"


def disk_full(e: BaseException) -> bool:
    return _errno_of(e) in _FULL


def write_error(e: BaseException, path: Path) -> WriteError | None:
    """The one-line error for a write to ``path`` that the file system refused (full, read-only, not permitted),
    raised where bertkit writes (``writing``); None for any other error, which keeps its own. A path in a staging
    directory is named by the directory it is written as."""
    code = _errno_of(e)
    path = _visible(path)
    if isinstance(e, WriteError) or code is None:
        return None
    if code in _FULL:
        cause, fix = why_full(code)
        return WriteError(code, f"{cause} while writing {path}: {os.strerror(code)}; {fix} (nothing was replaced: "
                                "what was there before is intact)")
    if code in _REFUSED:
        return WriteError(code, f"cannot write {path}: {os.strerror(code)}; choose a directory you can write to "
                                "(nothing was replaced: what was there before is intact)")
    return None


def _visible(path: Path) -> Path:
    """``path``, or the directory it is written as where it lies in a staging directory (``.NAME.bertkit-staging``
    is written as ``NAME``), or the file it is written as (``.NAME.bertkit-partial``, its record and states)."""
    parts = Path(path).parts
    if parts and parts[-1].startswith(".") and parts[-1].find(PARTIAL, 1) > 1:  # a file written row by row
        return _visible(Path(*parts[:-1], parts[-1][1:parts[-1].find(PARTIAL, 1)]))  # (bertkit.partial_output)
    for i, part in enumerate(parts):
        if dir_lock.is_staging(Path(part)):
            return Path(*parts[:i], part[1:-len(dir_lock.STAGING)])
    return Path(path)


@contextlib.contextmanager
def writing(path: Path) -> Iterator[None]:
    """Errors of a write of ``path`` the file system refused become ``write_error``'s one line; others pass."""
    try:
        yield
    except BaseException as e:
        if (error := write_error(e, path)) is not None:
            raise error from e
        raise


# -- Files --------------------------------------------------------------------------------------------------------


def fsync(path: str | os.PathLike) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(directory: Path) -> None:
    with contextlib.suppress(OSError):  # some filesystems do not open or sync directories; a rename stays atomic
        fsync(directory)


_KINDS = {stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device", stat.S_IFIFO: "a named pipe",
          stat.S_IFSOCK: "a socket"}


def refuse_special(path: Path) -> None:
    """A file is written by renaming a new one over its name: refused where the name is a device, a pipe or a
    socket, or a symlink to one, which the rename would replace (``--out /dev/null`` run as root replaced /dev/null
    itself, and ``--out /dev/stdout`` the link every process writes its output through)."""
    try:
        kind = _KINDS.get(stat.S_IFMT(os.stat(path).st_mode))  # through a symlink: /dev/stdout is one
    except OSError:
        return
    if kind is not None:
        raise BertkitError(f"{path} {'leads to' if os.path.islink(path) else 'is'} {kind}, not a file: bertkit writes its output to a new file and renames it "
                           "into place, which would replace it; give the name of a file, new or to be replaced")


@contextlib.contextmanager
def atomic_target(path: str | os.PathLike, verify: Any = None) -> Iterator[Path]:
    """A temporary path beside ``path`` to write (by ``atomic_write`` or a library's own writer); on success it is
    fsynced, checked by ``verify(tmp)`` if given (raise to refuse it) and renamed over ``path``. On any error
    ``path`` is untouched, and a full or read-only file system is one ``BertkitError``; a device, pipe or socket at
    ``path`` is refused before anything is written (``refuse_special``)."""
    path = Path(path)
    refuse_special(path)
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix=_tmp_prefix(path), suffix=f".{os.getpid()}{TMP_SUFFIX}", dir=path.parent)
        os.close(fd)
        tmp = Path(name)
        yield tmp
        # mkstemp's 0600 would make every model file private; set after writing, since a library may have
        # replaced the file (safetensors' save_file creates it anew, 0600 again).
        os.chmod(tmp, 0o666 & ~_UMASK)
        fsync(tmp)
        if verify is not None:
            verify(tmp)
        _publish(tmp, path)
    except BaseException as e:
        if tmp is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        if (error := write_error(e, path)) is not None:
            raise error from e
        raise
    fsync_dir(path.parent)


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "w", encoding: str | None = "utf-8") -> Iterator[IO]:
    """``open(path, mode)`` made atomic (see ``atomic_target``)."""
    binary = "b" in mode
    with atomic_target(path) as tmp, open(tmp, mode, encoding=None if binary else encoding,
                                          newline=None if binary else "") as f:
        yield f


def append_whole(fd: int, data: bytes, path: Path) -> None:
    """``data`` appended to the file open at ``fd`` (``O_APPEND``; ``path`` names it in errors), all of it or none:
    a full disk takes part of a write (the room left on its last page), and the torn line left at the end was
    read back glued to the next one appended once there was room (an evaluator's CSV row of 22 fields, split in
    two). On any error the file is cut back to its length before, and a full disk is ``write_error``'s one line."""
    end = os.lseek(fd, 0, os.SEEK_END)
    with writing(path):
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        except BaseException:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, end)
            raise


def atomic_write_text(path: str | os.PathLike, text: str, encoding: str = "utf-8") -> Path:
    with atomic_write(path, "w", encoding=encoding) as f:
        f.write(text)
    return Path(path)


def atomic_write_json(path: str | os.PathLike, data: Any, indent: int = 2) -> Path:
    """``data`` as JSON; written into a directory being staged, the paths in it that lead through a staging
    directory name the directory it becomes (a report names its files where they will be). A NaN or an infinity
    (an evaluation whose predictions were constant: Pearson NaN) is written null: Python's NaN token is no JSON
    (jq, JavaScript and bertkit's own JSON readers refuse the file), and null keeps it no number."""
    text = json_text(data, indent=indent, ensure_ascii=False, default=str)
    return atomic_write_text(path, (as_placed(text) if staging_of(Path(path)) is not None else text) + "\n")


def json_text(data: Any, **kwargs: Any) -> str:
    """``json.dumps(data, **kwargs)`` with a NaN or an infinity written null (``atomic_write_json``'s, and each line
    of metrics.jsonl's): the NaN token is no JSON, null keeps the value no number."""
    try:  # the walk that nulls non-finite floats runs only for data holding one (it cost a tokenizer.json 8 ms)
        return json.dumps(data, allow_nan=False, **kwargs)
    except ValueError:
        return json.dumps(_finite_or_null(data), allow_nan=False, **kwargs)


def _finite_or_null(value: Any) -> Any:
    if isinstance(value, float):  # numpy's float64 too; float32 and float16 reach default=str as text
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite_or_null(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite_or_null(v) for v in value]
    return value


_STAGED_NAME = re.compile(r"(?<=/)\.([^/\"\\]+)" + re.escape(dir_lock.STAGING) + r"(?=[/\"\\])")


def as_placed(text: str) -> str:
    """JSON ``text`` with each path through a staging directory naming the directory it becomes."""
    return _STAGED_NAME.sub(r"\1", text) if dir_lock.STAGING in text else text


NAME_MAX = 255  # bytes in one name: Linux's file systems, macOS's and NTFS (os.pathconf where the directory exists)


def name_max(directory: Path) -> int:
    with contextlib.suppress(OSError, ValueError):
        return os.pathconf(directory, "PC_NAME_MAX")
    return NAME_MAX


def _tmp_prefix(path: Path) -> str:
    """The start of the names of ``path``'s temporary files, ``.NAME.``: for a name too long to take the ~30 bytes
    more (``.NAME.RANDOM.PID.bertkit-tmp``: a 230-byte name, which the system allows, failed "File name too long"
    naming the temporary file), its first 40 characters and a hash of it, still one prefix per name."""
    prefix = f".{path.name}."
    if len(os.fsencode(prefix)) + 8 + len(f".{2**22}{TMP_SUFFIX}") <= name_max(path.parent):
        return prefix
    return f".{path.name[:40]}~{hashlib.sha256(os.fsencode(path.name)).hexdigest()[:16]}."


def remove_dead_temporaries(path: Path) -> None:
    """The temporary files a killed write of ``path`` left beside it (their name ends in the writer's pid)."""
    for tmp in path.parent.glob(f"{glob.escape(_tmp_prefix(path))}*{TMP_SUFFIX}"):
        _remove_if_dead(tmp, path)


def remove_dead_temporaries_under(directory: Path) -> None:
    """Every temporary file a killed write left under ``directory`` (never through a symlink): a run that continues
    a killed one's directory finishes with none of them, as an uninterrupted run does. ``directory`` must be a
    staging directory this process holds (the run it continues, under its lock): nothing else is walked, and in it
    only bertkit's own temporary names of a writer no longer alive are removed, never a user's file."""
    if staging_of(directory) is None:
        raise BertkitError(f"{directory} is no staging directory this process holds: its files are not this run's to "
                           "remove")
    for root, _, files in os.walk(directory):
        for name in files:
            if name.startswith(".") and name.endswith(TMP_SUFFIX):
                _remove_if_dead(Path(root, name), Path(root, name[1:-len(TMP_SUFFIX)].rsplit(".", 2)[0]))


def _remove_if_dead(tmp: Path, path: Path) -> None:
    """Remove ``tmp``, a bertkit temporary name (``.NAME.RANDOM.PID.bertkit-tmp``, atomic_target's), when the writer
    whose pid it ends in is gone and no other name links its file: a write a kill cut short, never published."""
    pid = tmp.name[:-len(TMP_SUFFIX)].rpartition(".")[2]
    if pid.isdigit() and not _alive(int(pid)) and (st := regular_stat(tmp)) is not None and st.st_nlink == 1:
        tmp.unlink()
        logger.info("removed %s, a write of %s a kill cut short", tmp, path)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def regular_stat(path: Path) -> os.stat_result | None:
    """``path``'s own status if it is a regular file (not a symlink), else None."""
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        st = os.lstat(path)
        return st if stat.S_ISREG(st.st_mode) else None
    return None


def staging_of(path: Path) -> Path | None:
    """The staging directory this process holds that ``path`` lies in, if any."""
    real = Path(os.path.realpath(path.parent)) / path.name
    return next((p for p in (real, *real.parents) if dir_lock.is_staging(p) and dir_lock.holds(p)), None)


def placed(path: Path) -> Path:
    """Where ``path`` will be once written: inside a staging directory this process holds (a save nested in another,
    as ``SentenceTransformer.save`` writes its tokenizer), the same place in the directory that one becomes; else
    ``path`` itself."""
    stage = staging_of(path)
    if stage is None:
        return path
    return dir_lock.placed_path(stage) / (Path(os.path.realpath(path.parent)) / path.name).relative_to(stage)
