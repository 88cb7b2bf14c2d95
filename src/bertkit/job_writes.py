"""Writes shared by the processes of one torchrun job (``bertkit._parallel.job_of``), where a transformers or
sentence-transformers script saves the same model on every rank: which directory at, above or inside a path another
process of the job is writing (its lock, or its staging directory's, names the job and holds), waiting for it, and
writing one file into a directory those processes may be swapping meanwhile (``write_text_beside_job``). How a save
that finds another rank's under way leaves it as written is ``bertkit.staging.staged``'s ``shared_by``.
"""
from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

from bertkit import dir_lock
from bertkit._parallel import job_of
from bertkit.dir_lock import LOCK, staging_path
from bertkit.outputs import atomic_target, atomic_write_text, regular_stat
from bertkit.write_paths import target_of

logger = logging.getLogger("bertkit")


def wait_while_held(place: Path) -> None:
    """Wait until no other process holds ``place``'s lock (dropped when its directory is in place, or when it dies)."""
    while dir_lock.held_by_another(place) is not None:
        time.sleep(0.05)


def written_by_sibling(target: Path, tag: str) -> bool:
    """Whether another process of the job ``tag`` names is writing ``target`` (its staging directory's lock, or the
    target's, names that job and another pid): then waited for (its lock is dropped when its directory is in place,
    or when it dies), and True once ``target`` is there. A finished save leaves no lock file, so a save after it
    writes the directory again, as a second save of a name does."""
    for place in (staging_path(target), target):
        line = _sibling_lock(place, tag)
        if line is None:
            continue
        logger.info("%s is being written by %s, of this process's job: waiting for it", target, line)
        wait_while_held(place)
        return target.is_dir()
    return False


def sibling_around(target: Path, tag: str) -> Path | None:
    """A directory above or inside ``target`` that another process of the job ``tag`` names is writing (its lock, or
    its staging directory's, held), if any. A save of ``target`` exchanges the whole directory: one of a directory
    above or inside it under way meanwhile would be swapped away, half written, from under its writer."""
    places = [place for above in target.parents for place in (above, staging_path(above))]
    if target.is_dir() and not target.is_symlink():
        places += [Path(root) for root, _, files in os.walk(target) if LOCK in files and Path(root) != target]
    return next((place for place in places if _sibling_lock(place, tag) is not None), None)


def _sibling_writing(directory: Path, tag: str) -> Path | None:
    """A directory at, above or inside ``directory`` that another process of the job ``tag`` names is writing."""
    here = next((place for place in (directory, staging_path(directory)) if _sibling_lock(place, tag) is not None),
                None)
    return here if here is not None else sibling_around(directory, tag)


def _sibling_lock(place: Path, tag: str) -> str | None:
    """``place``'s lock line where another live process of the job ``tag`` names holds it, else None."""
    try:
        line = (place / LOCK).read_text(encoding="utf-8", errors="replace").strip() if regular_stat(
            place / LOCK) else ""
    except OSError:
        return None
    # held, not only named: a lock file a killed write left names its job too, and is no write under way
    held = (line.endswith(f"{tag})") and not line.startswith(f"pid {os.getpid()} ")
            and dir_lock.held_by_another(place) is not None)
    return line if held else None


def _wait_for_siblings(directory: Path, tag: str) -> None:
    while _sibling_writing(directory, tag) is not None:
        time.sleep(0.05)


def write_text_beside_job(path: Path, text: Callable[[], str]) -> None:
    """``atomic_write_text(path, text())`` into a directory the other processes of this process's torchrun job may be
    saving meanwhile (``model.save_pretrained(output_dir)`` on every rank): a save exchanges its whole directory, so a
    file renamed into it mid-exchange is lost with the old one. Their writes at, above or inside it are waited for,
    then ``text()`` (read after the wait: it may read the directory) is written, again until the file holds it with
    none of theirs under way; this process's temporaries an exchange carried along are removed."""
    job = job_of()
    if job is None:
        atomic_write_text(path, text())
        return
    tag, directory = f"[{job}]", target_of(path.parent)
    # this call's own temporaries, by name and file (device, inode): the only files it may remove
    written: list[tuple[str, int, int]] = []
    while True:
        _wait_for_siblings(directory, tag)
        content = text()
        with atomic_target(path) as tmp:
            tmp.write_text(content, encoding="utf-8", newline="")
            st = os.lstat(tmp)
            written.append((tmp.name, st.st_dev, st.st_ino))
        _wait_for_siblings(directory, tag)
        with contextlib.suppress(OSError):
            if path.read_text(encoding="utf-8") == content:
                break
    for name, dev, ino in written:  # one an exchange carried into the directory under its name, still this file
        if (st := regular_stat(path.parent / name)) is not None and (st.st_dev, st.st_ino) == (dev, ino):
            with contextlib.suppress(FileNotFoundError):
                (path.parent / name).unlink()
