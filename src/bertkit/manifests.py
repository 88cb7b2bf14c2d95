"""What proves a file bertkit's: the manifest (``.bertkit-run.json``, written last into a run's or a checkpoint's
directory: each file's size and sha256), the one proof asked before anything is removed or replaced. A directory's
files are proven by the manifests in it and above it; what no manifest proves is a user's, and stays.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bertkit import dir_lock
from bertkit.dir_lock import LOCK
from bertkit.errors import BertkitError
from bertkit.outputs import BOOKKEEPING, MARKER, regular_stat, staging_of

logger = logging.getLogger("bertkit")

# -- Proofs: the manifests a directory holds ------------------------------------------------------------------------


def sha256_of(path: str | os.PathLike, size: int | None = None) -> str:
    """The sha256 of the file at ``path`` (of its first ``size`` bytes, if given)."""
    return sha256_digest(path, size).hexdigest()


def sha256_digest(path: str | os.PathLike, size: int | None = None) -> Any:
    """``sha256_of`` as a ``hashlib`` object, for a writer to go on with the bytes it appends."""
    digest, left = hashlib.sha256(), size
    with open(path, "rb") as f:
        while block := f.read(1 << 20 if left is None else min(1 << 20, left)):
            digest.update(block)
            left = None if left is None else left - len(block)
    return digest


def identity(st: os.stat_result) -> tuple[int, ...]:
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def _safe_relative(rel: Any) -> bool:
    """A recorded path names a file inside its directory: relative, no '..', '.', empty part or NUL."""
    return (isinstance(rel, str) and bool(rel) and "\x00" not in rel and not rel.startswith("/")
            and all(p not in ("", ".", "..") for p in rel.split("/")))


def files_under(directory: Path) -> Iterator[tuple[str, Path]]:
    """(relative path, path) of every file and symlink under ``directory``, never entering a symlinked directory."""
    for root, dirs, files in os.walk(directory):
        dirs.sort()
        for name in sorted(files) + sorted(d for d in dirs if Path(root, d).is_symlink()):
            path = Path(root, name)
            yield path.relative_to(directory).as_posix(), path


def listing(directory: Path) -> list[str]:
    """Every file and symlink under ``directory`` but bertkit's bookkeeping (relative, sorted)."""
    return [rel for rel, path in files_under(directory) if not is_bookkeeping(path)]


def is_bookkeeping(path: Path) -> bool:
    """Whether ``path`` is a file of bertkit's own bookkeeping: its name, a plain file, and a lock's content."""
    if path.name not in BOOKKEEPING or (st := regular_stat(path)) is None or st.st_nlink != 1:
        return False
    return path.name != LOCK or dir_lock.is_lock_line(path.read_text(encoding="utf-8", errors="replace").strip())


# The manifest's layout, recorded in it as "format" from 2 on (1: unmarked, 2026-11-26 to -30; before, a registry of
# names without contents, told apart by its shape): a manifest of a newer format is refused by name, not misread.
MANIFEST_FORMAT = 2


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
    if isinstance(marker, dict) and isinstance(marker.get("files"), list) and "started" in marker:
        # bertkit until 2026-11-26 registered the names it wrote as it went, without their contents
        raise BertkitError(f"{path} is the record of a `bertkit {marker.get('command')}` run by a bertkit before "
                           "2026-11-26, which listed its files without their sha256: this version cannot prove "
                           "them unchanged since, so it neither continues (--resume) nor replaces (--overwrite) that "
                           "run and removes none of its files; finish the run with the version that started it, or "
                           f"remove {directory} yourself (or choose another output directory)")
    written = marker.get("format", 1) if isinstance(marker, dict) else 1
    if isinstance(written, int) and written > MANIFEST_FORMAT:
        raise BertkitError(f"{path} is a manifest of format {written}, written by a newer bertkit (this one reads "
                           f"formats up to {MANIFEST_FORMAT}), so it removes and replaces nothing there: use that "
                           "version for this directory, or upgrade bertkit")
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
    for rel, path in files_under(directory):
        if path.name == MARKER and (marker := read_marker(path.parent)) is not None:
            prefix = "" if rel == MARKER else rel[:-len(MARKER)]
            entries.update({prefix + k: v for k, v in marker["files"].items() if isinstance(v, dict)})
    return entries


def proves(entry: dict | None, path: Path, st: os.stat_result) -> bool:
    """Whether a manifest's ``entry`` proves the regular file ``path`` bertkit's: its size and sha256 (of its
    start, for a file bertkit appends to) as recorded."""
    if not isinstance(entry, dict) or not isinstance(size := entry.get("size"), int) or not entry.get("sha256"):
        return False
    grown = entry.get("appends") is True and st.st_size > size
    if (st.st_size == size or grown) and sha256_of(path, size) == entry["sha256"]:
        return True
    # the content it replaces (``runs.record``: recorded before the write, so a kill between the two leaves the file
    # as it was, bertkit's all the same)
    replaced = entry.get("replaces")
    return isinstance(replaced, dict) and "replaces" not in replaced and proves(replaced, path, st)


def proven_files(directory: Path) -> tuple[dict[str, tuple[int, ...]], list[str]]:
    """The files under ``directory`` its manifests prove bertkit's (relative path -> identity now), and every other
    file and symlink (a link on the way proves nothing)."""
    recorded = recorded_files(directory)
    proven: dict[str, tuple[int, ...]] = {}
    others = []
    for rel in listing(directory):
        st = regular_stat(directory / rel)
        if st is not None and proves(recorded.get(rel), directory / rel, st):
            proven[rel] = identity(st)
        else:
            others.append(rel)
    return proven, others


def manifest_files(directory: Path) -> dict[str, dict]:
    """Each regular file under ``directory`` (this process's staging directory: all of it bertkit's) with its size and
    sha256; a file a nested manifest (a checkpoint's) records at its size is not read again."""
    known = recorded_files(directory)
    files = {}
    for rel in listing(directory):
        if (st := regular_stat(directory / rel)) is not None:
            entry = known.get(rel)
            files[rel] = ({"size": st.st_size, "sha256": entry["sha256"]} if entry and entry.get("size") == st.st_size
                          else {"size": st.st_size, "sha256": sha256_of(directory / rel)})
    return files


def owns(path: str | os.PathLike) -> bool:
    """Whether bertkit may replace ``path``: a regular file inside a directory this process is staging, or one a
    manifest around it records, still as written."""
    path = Path(path)
    if (st := regular_stat(path)) is None:
        return False
    if staging_of(path) is not None:
        return True
    for directory in path.parents:
        with contextlib.suppress(BertkitError):
            if (marker := read_marker(directory)) is not None and proves(
                    marker["files"].get(path.relative_to(directory).as_posix()), path, st):
                return True
    return False


def remove_owned_tree(directory: str | os.PathLike, first: tuple[str, ...] = ()) -> list[str]:
    """Remove the files under ``directory`` its manifests prove bertkit's (and its bookkeeping), then the directories
    left empty; symlinks are never followed. Returns what was left (relative paths), named in a warning. ``first``:
    the relative paths removed before the others (a checkpoint's state.pt: one without it, its manifest kept, is a
    removal a kill cut short)."""
    directory = Path(directory)
    if directory.is_symlink() or not directory.is_dir():
        return []
    proven, left = proven_files(directory)
    refused = [rel for rel in sorted(proven, key=lambda rel: rel not in first) if not _unlink(directory / rel)]
    if not refused:  # else the manifest stays, the proof a later removal asks for
        for _, path in list(files_under(directory)):
            if is_bookkeeping(path):  # a manifest proves nothing of what is left: no record of the user's files
                _unlink(path)
    remove_empty_dirs(directory)
    if refused:
        logger.warning("kept %s: the system refused the removal of %d file(s) bertkit wrote there (permission denied, "
                       "e.g. %s): a directory made read-only is left whole; make it writable (chmod -R u+w) for a "
                       "later run to remove it, or remove it yourself", directory, len(refused), ", ".join(refused[:3]))
    if left:
        logger.warning("kept %s: it holds %d file(s) bertkit cannot prove it wrote (e.g. %s)", directory, len(left),
                       ", ".join(left[:3]))
    return refused + left


def _unlink(path: Path) -> bool:
    """Remove ``path``; False where the system refuses it (a directory the user made read-only, an immutable file):
    theirs to keep, as transformers' rotation keeps it (``shutil.rmtree(..., ignore_errors=True)``), where a
    PermissionError would stop the run at a checkpoint after its training."""
    try:
        path.unlink()
    except PermissionError:
        return False
    return True


def remove_empty_dirs(directory: Path) -> None:
    for root, _, _ in os.walk(directory, topdown=False):
        with contextlib.suppress(OSError):
            os.rmdir(root)  # only if empty


def remove_emptied(directory: Path) -> None:
    """``remove_empty_dirs`` of a directory a write replaced and emptied (``dir_swap.dispose_replaced``). Another process's save
    of the same name, started as this one swapped, may have locked it at the staging name after it was listed (that
    save then finds the name held and steps back): a lock file alone is that save's bookkeeping, removed with the
    directory, never kept beside the output as a file of the user's."""
    for _ in range(100):
        remove_empty_dirs(directory)
        if not os.path.lexists(directory):
            return
        stray = [path for _, path in files_under(directory)]
        if not all(path.name == LOCK and is_bookkeeping(path) for path in stray):
            return
        for path in stray:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
