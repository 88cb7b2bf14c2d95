"""How bertkit writes: a file or a directory is staged, then swapped, so what is there is the earlier one or the new
one, whole, and never a user's file lost.

- **A file** (``atomic_target`` and the writers on it) is written to a temporary file beside it
  (``.NAME.<random>.<pid>.bertkit-tmp``), fsynced and renamed over it; a symlink at the name is replaced, never
  followed. A dead writer's temporary file is removed by the next command writing that name.
- **A directory** (``staged``: ``save_pretrained``, ``SentenceTransformer.save``, checkpoints, a command's run) is
  written whole into its staging directory beside it (``.NAME.bertkit-staging``: locked while written, marked by
  ``.bertkit-partial``), then made visible in one step: renamed into place, or exchanged with the directory there
  (``renameat2(RENAME_EXCHANGE)``), whose other files were linked into the new one first (a save adds to a
  directory, as transformers' does; the files it writes replace theirs). The next write of the name removes what a
  kill left in the staging directory: its name and its ``.bertkit-partial`` say it is bertkit's.
- **A manifest** (``.bertkit-run.json``, written last into a run's or a checkpoint's directory: each file's size
  and sha256) is what proves a file bertkit's, the one proof asked before anything is removed or replaced
  (``bertkit.runs`` decides which directory a command may write and what it replaces).
- **The lock** (``bertkit.dir_lock``) on the staging directory moves with it into place, so a second writer of the
  name, or of a directory inside or around it, is refused from the first one's start to its process's exit.

No state is kept in the process but the locks it holds: ownership is a property of the directory.
"""
from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import json
import logging
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from bertkit import dir_lock
from bertkit.dir_lock import LOCK, staging_path
from bertkit.errors import BertkitError, WriteError

logger = logging.getLogger("bertkit")
MARKER = ".bertkit-run.json"  # a finished run's manifest (a checkpoint's: its files only)
PARTIAL = ".bertkit-partial"  # in a staging directory: a write under way or cut short (for a run: which one)
TMP_SUFFIX = ".bertkit-tmp"
BOOKKEEPING = (LOCK, MARKER, PARTIAL)  # bertkit's own files at any depth, never counted as a user's
_UMASK = os.umask(0)
os.umask(_UMASK)  # read once: files bertkit creates get the permissions a plain open() would have given


# -- Errors a file system gives a write ---------------------------------------------------------------------------

_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
_REFUSED = (errno.EROFS, errno.EACCES, errno.EPERM)


def _errno_of(e: BaseException) -> int | None:
    if isinstance(e, OSError):
        return e.errno
    text = str(e)
    if match := re.search(r"\(os error (\d+)\)", text):  # safetensors' writer: "I/O error: ... (os error 28)"
        return int(match.group(1))
    if isinstance(e, RuntimeError) and ("unexpected pos" in text or "PytorchStreamWriter failed" in text):
        return errno.ENOSPC  # torch's zip writer reports a short write (a full disk) in these words only
    return None


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
        return WriteError(code, f"no space left on the device while writing {path}: {os.strerror(code)}; free "
                                "some space and run again (nothing was replaced: what was there before is intact)")
    if code in _REFUSED:
        return WriteError(code, f"cannot write {path}: {os.strerror(code)}; choose a directory you can write to "
                                "(nothing was replaced: what was there before is intact)")
    return None


def _visible(path: Path) -> Path:
    """``path``, or the directory it is written as where it lies in a staging directory (``.NAME.bertkit-staging``
    is written as ``NAME``)."""
    parts = Path(path).parts
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


@contextlib.contextmanager
def atomic_target(path: str | os.PathLike, verify: Any = None) -> Iterator[Path]:
    """A temporary path beside ``path`` to write (by ``atomic_write`` or a library's own writer); on success it is
    fsynced, checked by ``verify(tmp)`` if given (raise to refuse it) and renamed over ``path``. On any error
    ``path`` is untouched, and a full or read-only file system is one ``BertkitError``."""
    path = Path(path)
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=f".{os.getpid()}{TMP_SUFFIX}", dir=path.parent)
        os.close(fd)
        tmp = Path(name)
        yield tmp
        # mkstemp's 0600 would make every model file private; set after writing, since a library may have
        # replaced the file (safetensors' save_file creates it anew, 0600 again).
        os.chmod(tmp, 0o666 & ~_UMASK)
        fsync(tmp)
        if verify is not None:
            verify(tmp)
        os.replace(tmp, path)  # replaces a symlink at `path` itself, never writes through it
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


def atomic_write_text(path: str | os.PathLike, text: str, encoding: str = "utf-8") -> Path:
    with atomic_write(path, "w", encoding=encoding) as f:
        f.write(text)
    return Path(path)


def atomic_write_json(path: str | os.PathLike, data: Any, indent: int = 2) -> Path:
    """``data`` as JSON; written into a directory being staged, the paths in it that lead through a staging
    directory name the directory it becomes (a report names its files where they will be)."""
    text = json.dumps(data, indent=indent, ensure_ascii=False, default=str)
    return atomic_write_text(path, (as_placed(text) if staging_of(Path(path)) is not None else text) + "\n")


_STAGED_NAME = re.compile(r"(?<=/)\.([^/\"\\]+)" + re.escape(dir_lock.STAGING) + r"(?=[/\"\\])")


def as_placed(text: str) -> str:
    """JSON ``text`` with each path through a staging directory naming the directory it becomes."""
    return _STAGED_NAME.sub(r"\1", text) if dir_lock.STAGING in text else text


def remove_dead_temporaries(path: Path) -> None:
    """The temporary files a killed write of ``path`` left beside it (their name ends in the writer's pid)."""
    for tmp in path.parent.glob(f".{glob_escape(path.name)}.*{TMP_SUFFIX}"):
        pid = tmp.name[:-len(TMP_SUFFIX)].rpartition(".")[2]
        if pid.isdigit() and not _alive(int(pid)) and (st := _regular(tmp)) is not None and st.st_nlink == 1:
            tmp.unlink()
            logger.info("removed %s, a write of %s a kill cut short", tmp, path)


def glob_escape(name: str) -> str:
    return re.sub(r"([*?\[])", r"[\1]", name)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# -- Proofs: the manifests a directory holds ------------------------------------------------------------------------


def sha256_of(path: str | os.PathLike, size: int | None = None) -> str:
    """The sha256 of the file at ``path`` (of its first ``size`` bytes, if given)."""
    digest, left = hashlib.sha256(), size
    with open(path, "rb") as f:
        while block := f.read(1 << 20 if left is None else min(1 << 20, left)):
            digest.update(block)
            left = None if left is None else left - len(block)
    return digest.hexdigest()


def _regular(path: Path) -> os.stat_result | None:
    """``path``'s own status if it is a regular file (not a symlink), else None."""
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        st = os.lstat(path)
        return st if stat.S_ISREG(st.st_mode) else None
    return None


def _identity(st: os.stat_result) -> tuple[int, ...]:
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def _safe_relative(rel: Any) -> bool:
    """A recorded path names a file inside its directory: relative, no '..', '.', empty part or NUL."""
    return (isinstance(rel, str) and bool(rel) and "\x00" not in rel and not rel.startswith("/")
            and all(p not in ("", ".", "..") for p in rel.split("/")))


def _entries(directory: Path) -> Iterator[tuple[str, Path]]:
    """(relative path, path) of every file and symlink under ``directory``, never entering a symlinked directory."""
    for root, dirs, files in os.walk(directory):
        dirs.sort()
        for name in sorted(files) + sorted(d for d in dirs if Path(root, d).is_symlink()):
            path = Path(root, name)
            yield path.relative_to(directory).as_posix(), path


def listing(directory: Path) -> list[str]:
    """Every file and symlink under ``directory`` but bertkit's bookkeeping (relative, sorted)."""
    return [rel for rel, path in _entries(directory) if not _bookkeeping(path)]


def _bookkeeping(path: Path) -> bool:
    """Whether ``path`` is a file of bertkit's own bookkeeping: its name, a plain file, and a lock's content."""
    if path.name not in BOOKKEEPING or (st := _regular(path)) is None or st.st_nlink != 1:
        return False
    return path.name != LOCK or dir_lock.is_lock_line(path.read_text(encoding="utf-8", errors="replace").strip())


def read_marker(directory: Path) -> dict | None:
    """The manifest of ``directory`` (a finished run's, or a checkpoint's), or None; one bertkit cannot read is
    refused (it proves nothing, so nothing is removed on its word)."""
    path = directory / MARKER
    if not os.path.lexists(path):
        return None
    try:
        marker = json.loads(path.read_text(encoding="utf-8")) if not path.is_symlink() else None
    except (json.JSONDecodeError, UnicodeDecodeError, OSError):
        marker = None
    if not (isinstance(marker, dict) and isinstance(marker.get("files"), dict)
            and isinstance(marker.get("command", ""), str) and isinstance(marker.get("cwd", ""), str)):
        raise BertkitError(f"{path} is not a run marker this bertkit wrote (damaged, or from another version); "
                           "bertkit cannot tell which files there are its own, so it removes none: clear the "
                           "directory yourself or choose another output directory")
    outside = sorted(str(rel) for rel in marker["files"] if not _safe_relative(rel))
    if outside:
        raise BertkitError(
            f"{path} names {len(outside)} path(s) outside {directory} (e.g. {', '.join(map(repr, outside[:3]))}); "
            "bertkit never writes such a marker, so it removes nothing on its word: clear the directory yourself "
            "or choose another output directory")
    return marker


def recorded_files(directory: Path) -> dict[str, dict]:
    """What the manifests under ``directory`` record: relative path -> entry (a nested one's paths prefixed)."""
    entries: dict[str, dict] = {}
    for rel, path in _entries(directory):
        if path.name == MARKER and (marker := read_marker(path.parent)) is not None:
            prefix = "" if rel == MARKER else rel[:-len(MARKER)]
            entries.update({prefix + k: v for k, v in marker["files"].items() if isinstance(v, dict)})
    return entries


def _proves(entry: dict | None, path: Path, st: os.stat_result) -> bool:
    """Whether a manifest's ``entry`` proves the regular file ``path`` bertkit's: its size and sha256 (of its
    start, for a file bertkit appends to) as recorded."""
    if not isinstance(entry, dict) or not isinstance(size := entry.get("size"), int) or not entry.get("sha256"):
        return False
    grown = entry.get("appends") is True and st.st_size > size
    return (st.st_size == size or grown) and sha256_of(path, size) == entry["sha256"]


def proven_files(directory: Path) -> tuple[dict[str, tuple[int, ...]], list[str]]:
    """The files under ``directory`` its manifests prove bertkit's (relative path -> identity now), and every other
    file and symlink (a link on the way proves nothing)."""
    recorded = recorded_files(directory)
    proven: dict[str, tuple[int, ...]] = {}
    others = []
    for rel in listing(directory):
        st = _regular(directory / rel)
        if st is not None and _proves(recorded.get(rel), directory / rel, st):
            proven[rel] = _identity(st)
        else:
            others.append(rel)
    return proven, others


def _manifest_files(directory: Path) -> dict[str, dict]:
    """Each regular file under ``directory`` (this process's staging directory: all of it bertkit's) with its size and
    sha256; a file a nested manifest (a checkpoint's) records at its size is not read again."""
    known = recorded_files(directory)
    files = {}
    for rel in listing(directory):
        if (st := _regular(directory / rel)) is not None:
            entry = known.get(rel)
            files[rel] = ({"size": st.st_size, "sha256": entry["sha256"]} if entry and entry.get("size") == st.st_size
                          else {"size": st.st_size, "sha256": sha256_of(directory / rel)})
    return files


def owns(path: str | os.PathLike) -> bool:
    """Whether bertkit may replace ``path``: a regular file inside a directory this process is staging, or one a
    manifest around it records, still as written."""
    path = Path(path)
    if (st := _regular(path)) is None:
        return False
    if staging_of(path) is not None:
        return True
    for directory in path.parents:
        with contextlib.suppress(BertkitError):
            if (marker := read_marker(directory)) is not None and _proves(
                    marker["files"].get(path.relative_to(directory).as_posix()), path, st):
                return True
    return False


def remove_owned_tree(directory: str | os.PathLike) -> list[str]:
    """Remove the files under ``directory`` its manifests prove bertkit's (and its bookkeeping), then the directories
    left empty; symlinks are never followed. Returns what was left (relative paths), named in a warning."""
    directory = Path(directory)
    if directory.is_symlink() or not directory.is_dir():
        return []
    proven, left = proven_files(directory)
    for rel in proven:
        (directory / rel).unlink()
    for _, path in list(_entries(directory)):
        if _bookkeeping(path):  # a manifest proves nothing of what is left: no record of the user's files
            path.unlink()
    _remove_empty_dirs(directory)
    if left:
        logger.warning("kept %s: it holds %d file(s) bertkit cannot prove it wrote (e.g. %s)", directory, len(left),
                       ", ".join(left[:3]))
    return left


def _remove_empty_dirs(directory: Path) -> None:
    for root, _, _ in os.walk(directory, topdown=False):
        with contextlib.suppress(OSError):
            os.rmdir(root)  # only if empty


# -- Staged directories ---------------------------------------------------------------------------------------------


def staging_of(path: Path) -> Path | None:
    """The staging directory this process holds that ``path`` lies in, if any."""
    real = Path(os.path.realpath(path.parent)) / path.name
    return next((p for p in (real, *real.parents) if dir_lock.is_staging(p) and dir_lock.holds(p)), None)


def staging_dir_of(path: str | os.PathLike) -> Path:
    """Where a run of the output directory ``path`` is written before it is moved into place."""
    return staging_path(target_of(path))


def _replaced_path(target: Path) -> Path:
    return target.parent / f".{target.name}.bertkit-replaced"


def target_of(path: str | os.PathLike) -> Path:
    """The directory a write of ``path`` makes or replaces: its parents' symlinks resolved, and the path itself if it
    is a symlink to a directory (the data goes where the link leads, as a plain write would put it)."""
    path = Path(os.path.abspath(path))
    if path.is_symlink() and path.is_dir():
        return Path(os.path.realpath(path))
    return Path(os.path.realpath(path.parent)) / path.name


def clear_staging(directory: Path) -> None:
    """Remove everything in ``directory`` (a staging directory: bertkit's) but its lock and its mark (which stays
    until the directory goes, so that a kill at any moment leaves it recognisable)."""
    for entry in os.scandir(directory):
        if entry.name in (LOCK, PARTIAL):
            continue
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path)  # never follows a symlink inside
        else:
            os.unlink(entry.path)


def _read_partial(directory: Path) -> dict | None:
    path = directory / PARTIAL
    if _regular(path) is None:
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, OSError):
        return {}
    return record if isinstance(record, dict) else {}


_EXCHANGE_UNSUPPORTED = (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EXDEV)


def _exchange(a: Path, b: Path) -> None:
    """Swap the directories at ``a`` and ``b`` in one step (Linux's renameat2 RENAME_EXCHANGE). Where the system
    has no such call, in three renames through ``.NAME.bertkit-replaced``, which a kill leaves to be put back by
    the next write (``_recover``)."""
    libc = ctypes.CDLL(None, use_errno=True)
    call = getattr(libc, "renameat2", None)
    if call is not None:
        at_cwd, rename_exchange = -100, 2
        if call(at_cwd, os.fsencode(a), at_cwd, os.fsencode(b), rename_exchange) == 0:
            return
        code = ctypes.get_errno()
        if code not in _EXCHANGE_UNSUPPORTED:
            raise OSError(code, os.strerror(code), str(b))
    aside = _replaced_path(b)
    os.rename(b, aside)
    os.rename(a, b)
    os.rename(aside, a)


def _recover(target: Path, stage: Path) -> None:
    """Put back what a kill left of an exchange without renameat2: ``target`` missing, its old content aside."""
    aside = _replaced_path(target)
    if os.path.isdir(aside) and not os.path.islink(aside):
        if not os.path.lexists(target):
            os.rename(aside, target)
        elif not os.path.lexists(stage):
            os.rename(aside, stage)


def _link_others(target: Path, stage: Path, replaced: Mapping[str, Any]) -> None:
    """What else ``target`` holds (a user's files, where this write made none of the same name; not the ``replaced``
    files of an earlier run), hard-linked into ``stage`` before the swap: it is in place at every moment."""
    for root, dirs, _ in os.walk(target):
        for name in dirs:  # an empty directory of the user's (the others are made for what they hold)
            with contextlib.suppress(OSError):
                if not Path(root, name).is_symlink() and not os.listdir(Path(root, name)):
                    (stage / Path(root, name).relative_to(target)).mkdir(parents=True, exist_ok=True)
    for rel, path in _entries(target):
        dst = stage / rel
        if rel in replaced or os.path.lexists(dst) or (path.name in (LOCK, PARTIAL) and _bookkeeping(path)):
            continue
        with contextlib.suppress(OSError):  # no hard links here: carried after the swap instead (_dispose)
            dst.parent.mkdir(parents=True, exist_ok=True)
            os.symlink(os.readlink(path), dst) if path.is_symlink() else os.link(path, dst)


def _same_file(a: Path, b: Path) -> bool:
    with contextlib.suppress(OSError):
        x, y = os.lstat(a), os.lstat(b)
        return (x.st_dev, x.st_ino) == (y.st_dev, y.st_ino) or (
            stat.S_ISLNK(x.st_mode) and stat.S_ISLNK(y.st_mode) and os.readlink(a) == os.readlink(b))
    return False


def _dispose(old: Path, target: Path, merge: bool, proven: Mapping[str, tuple[int, ...]] | None = None) -> None:
    """The directory ``target`` replaced, now at ``old``: its files its manifests prove bertkit's removed (``proven``:
    those proven already, by identity), and with ``merge`` (a save that adds to a directory) those the new one
    replaces; every other file is carried into ``target`` where its name is free. What is left (a file of a user's
    where the new run put one of the same name) is kept beside ``target``, named in a warning."""
    if proven is None:
        proven = proven_files(old)[0]
    else:
        proven = {rel: ident for rel, ident in proven.items()
                  if (st := _regular(old / rel)) is not None and _identity(st) == ident}
    left = []  # bookkeeping last: a manifest keeps proving what is left until it goes (a kill meanwhile)
    for rel, path in sorted(_entries(old), key=lambda entry: entry[1].name in BOOKKEEPING):
        dst = target / rel
        if rel in proven or (path.name in (LOCK, PARTIAL) and _bookkeeping(path)) or (
                os.path.lexists(dst) and (merge or _bookkeeping(path) or _same_file(path, dst))):
            path.unlink()
            continue
        if not os.path.lexists(dst):
            with contextlib.suppress(OSError):
                dst.parent.mkdir(parents=True, exist_ok=True)
                os.rename(path, dst)
                continue
        left.append(rel)
    _remove_empty_dirs(old)
    if os.path.lexists(old):
        kept = Path(tempfile.mkdtemp(prefix=f"{target.name}.replaced-", dir=target.parent))
        os.rename(old, kept / target.name)
        logger.warning("%s was replaced; %d file(s) of it bertkit cannot prove it wrote, whose names the new one "
                       "uses, were kept in %s (e.g. %s)", target, len(left), kept, ", ".join(left[:3]))


@dataclass
class Stage:
    """A staging directory this process made (or took over from a killed write) and holds the lock of."""

    target: Path
    path: Path
    record: dict | None = None  # the .bertkit-partial of the write a kill cut short, when this one continues it

    @classmethod
    def open(cls, target: Path, what: str, partial: dict,
             keep: Callable[[dict], bool] = lambda record: False) -> Stage:
        """Make and lock ``target``'s staging directory, marked with ``partial`` (what is being written). What a
        killed write left there is removed first, unless ``keep(its partial record)`` says this write continues
        it; what a kill left of a directory a swap replaced is carried back first."""
        path = staging_path(target)
        for held in (path, target):
            if dir_lock.writing_here(held):
                raise BertkitError(f"{target} is the output directory of this process's `bertkit "
                                   f"{dir_lock.holder_command(held)}` run already; choose another output directory")
        if os.path.ismount(target):
            raise BertkitError(f"{target} is a mount point: bertkit writes a directory beside its name and renames it "
                               f"into place, which a mount point does not allow; write into a directory inside it "
                               f"(e.g. {target / 'out'})")
        with writing(target):
            target.parent.mkdir(parents=True, exist_ok=True)
            _recover(target, path)
            try:
                path.mkdir()
                made = True
            except PermissionError as e:
                if not os.access(target, os.W_OK):
                    raise
                raise WriteError(e.errno, f"cannot write {path} (Permission denied): bertkit writes {target} beside "
                                          f"its name first, then renames it into place, so it needs to write in "
                                          f"{target.parent}; choose a directory there you can write to") from e
            except FileExistsError:
                made = False
                if path.is_symlink() or not path.is_dir():
                    raise BertkitError(f"{path} is in the way: bertkit writes {target} there first, then renames "
                                       "it into place; move it away") from None
        try:
            with writing(target):
                dir_lock.lock(path, what)
        except BaseException as e:
            if made and (isinstance(e, WriteError) or not isinstance(e, BertkitError)):  # not: held meanwhile
                shutil.rmtree(path, ignore_errors=True)
            raise
        stage = cls(target, path)
        try:
            if not made:
                record = _read_partial(path)
                if record is None:  # no .bertkit-partial: the replaced directory a kill left mid-swap
                    done = _read_partial(target) or {}  # the mark of the write that replaced it: a save adds
                    dir_lock.unlock(path)
                    _dispose(path, target, merge="write" in done)
                    with contextlib.suppress(FileNotFoundError):
                        (target / PARTIAL).unlink()
                    return cls.open(target, what, partial, keep)
                if keep(record):
                    stage.record = record
                else:
                    logger.info("removing %s, a write of %s a kill cut short", path, target)
                    clear_staging(path)
            if (holder := dir_lock.held_by_another(target)) is not None:
                raise BertkitError(f"{target} is in use by {holder}; wait for it to finish or choose another output")
            with contextlib.suppress(FileNotFoundError, NotADirectoryError):
                (target / PARTIAL).unlink()  # the mark a kill left on a finished write, once swapped
            if stage.record is None and _regular(path / PARTIAL) is not None:
                atomic_write_json(path / PARTIAL, partial)
            elif stage.record is None:  # made in place: a kill mid-write leaves it unreadable, still the mark
                with open(path / PARTIAL, "x", encoding="utf-8") as f:
                    f.write(json.dumps(partial, default=str))
        except BaseException as e:
            stage.abort(keep=not made)
            if (error := write_error(e, target)) is not None:
                raise error from e
            raise
        return stage

    def commit(self, *, manifest: dict | None, merge: bool, keep_lock: bool = False,
               proven: Mapping[str, tuple[int, ...]] | None = None) -> None:
        """Make the staging directory ``target``: its manifest (``manifest`` and the files) written last, then
        renamed into place, or exchanged with the directory there, which is then disposed of (``_dispose``)."""
        path, target = self.path, self.target
        run = manifest is not None and "command" in manifest
        with writing(target):
            if manifest is not None:
                atomic_write_json(path / MARKER, {**manifest, "files": _manifest_files(path)})
            real = str(path.resolve())
            try:
                os.rename(path, target)  # a new name, or over an empty directory: one step
                replaced = False
            except OSError as e:
                if e.errno not in (errno.ENOTEMPTY, errno.EEXIST) or not target.is_dir() or target.is_symlink():
                    raise
                _link_others(target, path, proven or {})
                _exchange(path, target)
                replaced = True
        dir_lock.moved(real, target)
        fsync_dir(target.parent)
        if replaced:  # its mark tells a write after a kill here which kind this was (Stage.open)
            _dispose(path, target, merge, proven)
        (target / PARTIAL).unlink()
        if keep_lock:
            dir_lock.keep(target)
        else:
            if not run:
                with contextlib.suppress(FileNotFoundError):
                    (target / LOCK).unlink()  # a save leaves no lock file behind; a run keeps its own
            dir_lock.unlock(target)

    def abort(self, keep: bool = False) -> None:
        """The write failed: the staging directory removed (or with ``keep``, kept to be continued), unlocked.
        Nothing once it is no longer held (swapped into place, or aborted already)."""
        if not dir_lock.holds(self.path):
            return
        try:
            if not keep:
                with contextlib.suppress(OSError):
                    clear_staging(self.path)
                    for name in (PARTIAL, LOCK):
                        with contextlib.suppress(FileNotFoundError):
                            os.unlink(self.path / name)
                    os.rmdir(self.path)
        finally:
            dir_lock.unlock(self.path)


@contextlib.contextmanager
def staged(target: str | os.PathLike, what: str = "save", *, manifest: bool = False) -> Iterator[Path]:
    """A directory to write ``target``'s whole content into, made ``target`` in one step when the block ends without
    an error (renamed into place, or exchanged with the directory there: its other files are kept, the files this
    write makes replace theirs). On an error nothing changes at ``target`` (a full or read-only file system is one
    ``BertkitError``); a kill leaves only the staging directory, removed by the next write of ``target``. Inside a
    directory this process is staging, ``target`` itself is written: the outer swap makes it visible; so is a mount
    point, which cannot be swapped (each file is still replaced whole). With ``manifest`` (a checkpoint) it is always
    staged, and a manifest of its files is written last."""
    target = target_of(target)
    if not manifest and (staging_of(target) is not None or os.path.ismount(target)):
        with writing(target):
            target.mkdir(parents=True, exist_ok=True)
        yield target
        return
    stage = Stage.open(target, what, {"write": what})
    with writing(target):
        try:
            yield stage.path
            stage.commit(manifest={} if manifest else None, merge=True)
        except BaseException:
            if dir_lock.holds(stage.path):  # not yet swapped into place
                stage.abort()
            raise


def remove_killed_writes(directory: Path, prefix: str = "") -> None:
    """Remove the staging directories in ``directory`` (of targets named ``prefix``...) that writes a kill cut short
    left; one another process is writing is left alone."""
    for path in sorted(directory.glob(f".{glob_escape(prefix)}*{dir_lock.STAGING}")) if directory.is_dir() else []:
        if (path.is_symlink() or not path.is_dir() or _read_partial(path) is None
                or dir_lock.held_by_another(path) is not None):
            continue  # not one bertkit marked as its write, or one under way
        target = directory / path.name[1:-len(dir_lock.STAGING)]
        with contextlib.suppress(BertkitError):  # held meanwhile, or not bertkit's: left alone
            Stage.open(target, "cleanup", {}).abort()
