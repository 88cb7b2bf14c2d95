"""How bertkit writes a directory (``staged``: ``save_pretrained``, ``SentenceTransformer.save``, checkpoints, a
command's run): whole, into its staging directory beside it (``.NAME.bertkit-staging``: locked while written, marked
by ``.bertkit-partial``), then made visible in one step: renamed into place, or exchanged with the directory there
(``bertkit.dir_swap``: the swap, and what becomes of the replaced directory's files; a save adds to a directory, as
transformers' does, and the files it writes replace theirs). The next write of the name removes what a kill left in
the staging directory: its name and its ``.bertkit-partial`` say it is bertkit's. The lock (``bertkit.dir_lock``)
on the staging directory moves with it into place, so a second writer of the name, or of a directory inside or
around it, is refused from the first one's start to its process's exit, unless it is another process of the same
torchrun job saving the same content (``bertkit.job_writes``): that one waits, and leaves the write as made.
"""
from __future__ import annotations

import contextlib
import errno
import glob
import itertools
import json
import logging
import os
import shutil
import stat
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from bertkit import dir_lock
from bertkit._parallel import info_from_env
from bertkit.dir_lock import LOCK, staging_path
from bertkit.dir_swap import dispose_replaced, recover_swap, swap_in, take_mode
from bertkit.errors import BertkitError, WriteError
from bertkit.job_writes import sibling_around, wait_while_held, written_by_sibling
from bertkit.manifests import MANIFEST_FORMAT, manifest_files
from bertkit.outputs import (
    MARKER,
    PARTIAL,
    atomic_write_json,
    fsync_dir,
    is_mount_point,
    mount_point_in,
    read_only_mount,
    regular_stat,
    remove_dead_temporaries_under,
    staging_of,
    write_error,
    writing,
)
from bertkit.write_paths import make_route, refuse_long_name, refuse_non_directory, target_of

logger = logging.getLogger("bertkit")

# -- Staged directories ---------------------------------------------------------------------------------------------


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
    if regular_stat(path) is None:
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, OSError):
        return {}
    return record if isinstance(record, dict) else {}


def _read_only_dir(target: Path) -> Path | None:
    """The first directory at or under ``target`` (never through a symlink) this process may not change, if any: a
    write of ``target`` would replace it, or leave the old one's entries it cannot remove (root may change any)."""
    if target.is_symlink() or not target.is_dir():
        return None
    for root, dirs, _ in os.walk(target):
        for path in (Path(root), *(Path(root, d) for d in dirs)):
            if not path.is_symlink() and not os.access(path, os.W_OK | os.X_OK):
                return path
    return None


def _working_directory() -> Path | None:
    """This process's working directory, or None where it is gone already. A directory swapped into place at or
    around it leaves the process in the one replaced, which is then removed: ``commit`` moves it into the new one
    (``save_pretrained(".")`` twice, or a save of the directory a script runs in, then a relative path)."""
    try:
        return Path(os.getcwd())
    except OSError:
        return None


@dataclass
class Stage:
    """A staging directory this process made (or took over from a killed write) and holds the lock of."""

    target: Path
    path: Path
    record: dict | None = None  # the .bertkit-partial of the write a kill cut short, when this one continues it
    parents: tuple[Path, ...] = ()  # the directories above it this write made, deepest first: removed if it fails

    @classmethod
    def open(cls, target: Path, what: str, partial: dict,
             keep: Callable[[dict], bool] = lambda record: False) -> Stage:
        """Make and lock ``target``'s staging directory, marked with ``partial`` (what is being written). What a
        killed write left there is removed first, unless ``keep(its partial record)`` says this write continues
        it; what a kill left of a directory a swap replaced is carried back first."""
        path = staging_path(target)
        refuse_long_name(target)
        for held in (path, target):
            if dir_lock.writing_here(held):
                raise BertkitError(f"{target} is the output directory of this process's `bertkit "
                                   f"{dir_lock.holder_command(held)}` run already; choose another output directory")
        if is_mount_point(target):
            raise BertkitError(f"{target} is a mount point: bertkit writes a directory beside its name and renames it "
                               f"into place, which a mount point does not allow; write into a directory inside it "
                               f"(e.g. {target / 'out'})")
        if (blocked := _read_only_dir(target)) is not None:
            # a directory its owner made read-only is kept as such: a write into it in place would fail. On a file
            # system mounted read-only the cause is the mount, not a permission ("Permission denied" sent a user to
            # chmod a directory root could not write either)
            code = errno.EROFS if read_only_mount(blocked) else errno.EACCES
            inside = ("" if blocked == target
                      else f" ({blocked} in it is read-only, and a write replaces the whole directory)")
            raise WriteError(code, f"cannot write {target}{inside}: {os.strerror(code)}; choose a directory you can "
                                   "write to (nothing was replaced: what was there before is intact)")
        if (inner := mount_point_in(target)) is not None:  # swapped, the mount would leave with the replaced one
            raise BertkitError(f"{target} holds the mount point {inner}: bertkit writes a directory beside its name "
                               f"and swaps it into place, which would move {inner} out of {target}; choose an "
                               "output directory without a mount inside it")
        # Another process's swap under way: the directory it replaced lies at the staging name, unlocked, until it
        # is disposed of; taken for a kill's leftover it was disposed of by both ("No such file or directory")
        _refuse_held(target)
        parent = target.parent.absolute()
        parents = tuple(itertools.takewhile(lambda d: not os.path.lexists(d), (parent, *parent.parents)))
        with writing(target):
            target.parent.mkdir(parents=True, exist_ok=True)
            recover_swap(target, path)
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
        except FileNotFoundError:
            # gone before this one locked it: another process took it (made here) and finished, or it was the
            # directory another save replaced (found here) and that save has disposed of it
            if not os.path.lexists(path):
                return cls.open(target, what, partial, keep)
            raise
        except BaseException as e:
            if made and (isinstance(e, WriteError) or not isinstance(e, BertkitError)):  # not: held meanwhile
                shutil.rmtree(path, ignore_errors=True)
            raise
        stage = cls(target, path, parents=parents)
        try:
            _refuse_held(target)  # again, now that the staging name is this write's: a swap may have ended meanwhile
            # Empty but for the lock just taken: made by another process that has not locked it yet (it will find it
            # held and step back), or by a kill between the two steps; nothing to recover, this write takes it.
            # Disposed of as a kill's leftover, it was swapped away under the process that made it.
            if not made and set(os.listdir(path)) - {LOCK}:
                record = _read_partial(path)
                if record is None:  # no .bertkit-partial: the replaced directory a kill left mid-swap
                    done = _read_partial(target) or {}  # the mark of the write that replaced it: a save adds
                    dir_lock.unlock(path)
                    dispose_replaced(path, target, merge="write" in done)
                    with contextlib.suppress(FileNotFoundError):
                        (target / PARTIAL).unlink()
                    return cls.open(target, what, partial, keep)
                if keep(record):
                    stage.record = record
                    remove_dead_temporaries_under(path)  # the killed write's half-written files: not its output
                else:
                    logger.info("removing %s, a write of %s a kill cut short", path, target)
                    clear_staging(path)
            with contextlib.suppress(FileNotFoundError, NotADirectoryError):
                (target / PARTIAL).unlink()  # the mark a kill left on a finished write, once swapped
            if stage.record is None and regular_stat(path / PARTIAL) is not None:
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
        renamed into place, or exchanged with the directory there, which is then disposed of (``bertkit.dir_swap``)."""
        path, target = self.path, self.target
        run = manifest is not None and "command" in manifest
        cwd = _working_directory()
        with writing(target):
            if manifest is not None:
                atomic_write_json(path / MARKER, {**manifest, "format": MANIFEST_FORMAT, "files": manifest_files(path)})
            real = str(path.resolve())
            mode = take_mode(target, path)
            linked = swap_in(path, target, proven or {})  # None: renamed, nothing replaced
        dir_lock.moved(real, target)
        if cwd is not None and (cwd == target or target in cwd.parents):
            with contextlib.suppress(OSError):  # the process works in the new directory, as after a write in place
                os.chdir(cwd)
        fsync_dir(target.parent)
        if linked is not None:  # its mark tells a write after a kill here which kind this was (Stage.open)
            dispose_replaced(path, target, merge, proven, linked)
        (target / PARTIAL).unlink()
        if mode is not None and mode & stat.S_IRWXU != stat.S_IRWXU:
            os.chmod(target, mode)  # without the owner's rights it needed to finish
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
            # not once swapped (an interrupt before the lock's move): the replaced directory is there, unmarked, and
            # the next write of the name disposes of it (Stage.open)
            if not keep and dir_lock.lock_file_in(self.path):
                with contextlib.suppress(OSError):
                    clear_staging(self.path)
                    for name in (PARTIAL, LOCK):
                        with contextlib.suppress(FileNotFoundError):
                            os.unlink(self.path / name)
                    os.rmdir(self.path)
                    for parent in self.parents:  # empty unless another process wrote there meanwhile: then kept
                        os.rmdir(parent)
        finally:
            dir_lock.unlock(self.path)


def _refuse_held(target: Path) -> None:
    if (holder := dir_lock.held_by_another(target)) is not None:
        raise dir_lock.Held(f"{target} is in use by {holder}; wait for it to finish or choose another output", holder)


def _open_shared(target: Path, what: str, partial: dict, shared_by: str | None) -> Stage | None:
    """``Stage.open``; with ``shared_by``, the lock names the job, and None where another process of that job was
    writing ``target`` (waited for), so this one leaves it as that one wrote it. Its write of a directory above or
    inside ``target`` is waited for, then this one writes (looked for again once this one holds its lock: of two
    that start together, at least one sees the other)."""
    if shared_by is None:
        return Stage.open(target, what, partial)
    tag = f"[{shared_by}]"
    while not written_by_sibling(target, tag):
        if (near := sibling_around(target, tag)) is not None:
            logger.info("%s is being written by another process of this process's job: %s waits for it", near, target)
            wait_while_held(near)
            continue
        try:
            stage = Stage.open(target, f"{what} {tag}", partial)
        except dir_lock.Held as e:  # another process took it between the look and the lock: look again
            if not e.holder.endswith(f"{tag})"):
                raise
            continue
        if sibling_around(target, tag) is None:
            return stage
        stage.abort()  # both took their locks at once: this one steps back, after a pause of its own length
        time.sleep(0.05 * (1 + info_from_env().rank % 8))
    logger.info("%s was written by another process of this process's job; this save leaves it as written", target)
    return None


@contextlib.contextmanager
def staged(target: str | os.PathLike, what: str = "save", *, manifest: bool = False,
           shared_by: str | None = None) -> Iterator[Path]:
    """A directory to write ``target``'s whole content into, made ``target`` in one step when the block ends without
    an error (renamed into place, or exchanged with the directory there: its other files are kept, the files this
    write makes replace theirs). On an error nothing changes at ``target`` (a full or read-only file system is one
    ``BertkitError``); a kill leaves only the staging directory, removed by the next write of ``target``. Inside a
    directory this process is staging, ``target`` itself is written: the outer swap makes it visible; so is a mount
    point, which cannot be swapped, and a directory holding one, which a swap would carry away with the directory it
    replaced (each file is still replaced whole). With ``manifest`` (a checkpoint) it is always
    staged, a manifest of its files is written last, and it adds to no directory: a file of one already at its name
    (a user's ``checkpoint-3``, or where a symlink of that name leads) that it writes too is kept beside it, named
    in a warning, not replaced.

    ``shared_by`` names a job whose processes save the same content (``bertkit._parallel.job_of``: the ranks of one
    torchrun run, where a transformers or sentence-transformers script saves the model on every rank, as those
    libraries write it): where another process of that job is writing ``target``, this one waits for it and writes
    nothing to it (the block writes into a scratch directory, removed): that write stands, not swapped away under the
    process that made it. One of a directory above or inside ``target`` is waited for, then this one writes. Any
    other writer under way is refused, as without it."""
    make_route(target, "a save")
    target = target_of(target)
    refuse_non_directory(target, "a save")
    if not manifest and (staging_of(target) is not None or is_mount_point(target)
                         or mount_point_in(target) is not None):
        with writing(target):
            target.mkdir(parents=True, exist_ok=True)
        yield target
        return
    # the mark says which kind this is to a write after a kill mid-swap: a save ("write") adds to a directory
    stage = _open_shared(target, what, {"whole": what} if manifest else {"write": what}, shared_by)
    if stage is None:  # another rank of the job wrote it: this write goes to a scratch directory, then away
        with tempfile.TemporaryDirectory(prefix="bertkit-shared-save-") as scratch:
            yield Path(scratch)
        return
    with writing(target):
        try:
            yield stage.path
            stage.commit(manifest={} if manifest else None, merge=not manifest)
        except BaseException:
            if dir_lock.holds(stage.path):  # not yet swapped into place
                stage.abort()
            raise


def remove_killed_writes(directory: Path, prefix: str = "") -> None:
    """Remove the staging directories in ``directory`` (of targets named ``prefix``...) that writes a kill cut short
    left; one another process is writing is left alone."""
    for path in sorted(directory.glob(f".{glob.escape(prefix)}*{dir_lock.STAGING}")) if directory.is_dir() else []:
        if (path.is_symlink() or not path.is_dir() or _read_partial(path) is None
                or dir_lock.held_by_another(path) is not None):
            continue  # not one bertkit marked as its write, or one under way
        target = dir_lock.placed_path(path)
        with contextlib.suppress(BertkitError):  # held meanwhile, or not bertkit's: left alone
            Stage.open(target, "cleanup", {}).abort()
