"""How a directory written whole beside its name (``bertkit.staging``) takes the place of the directory there: in one
step (``renameat2(RENAME_EXCHANGE)``; three renames through ``.NAME.bertkit-replaced`` where the system lacks it, put
back by the next write after a kill), the replaced directory's other files hard-linked into the new one first, so that
a user's file is in place at every moment. What becomes of the replaced directory's files afterwards is decided here
too: removed where its manifests prove them bertkit's (or the new directory holds a newer version of them), carried
into the new directory where their name is free, else kept beside it, named in a warning.
"""
from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import logging
import os
import stat
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from bertkit.dir_lock import LOCK
from bertkit.errors import BertkitError
from bertkit.manifests import files_under, identity, is_bookkeeping, proven_files, remove_emptied
from bertkit.outputs import BOOKKEEPING, PARTIAL, regular_stat
from bertkit.write_paths import replaced_path

logger = logging.getLogger("bertkit")

_EXCHANGE_UNSUPPORTED = (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EXDEV)


def _exchange(a: Path, b: Path) -> None:
    """Swap the directories at ``a`` and ``b`` in one step (Linux's renameat2 RENAME_EXCHANGE). Where the system
    has no such call, in three renames through ``.NAME.bertkit-replaced``, which a kill leaves to be put back by
    the next write (``recover_swap``)."""
    libc = ctypes.CDLL(None, use_errno=True)
    call = getattr(libc, "renameat2", None)
    if call is not None:
        at_cwd, rename_exchange = -100, 2
        if call(at_cwd, os.fsencode(a), at_cwd, os.fsencode(b), rename_exchange) == 0:
            return
        code = ctypes.get_errno()
        if code not in _EXCHANGE_UNSUPPORTED:
            raise OSError(code, os.strerror(code), str(b))
    aside = replaced_path(b)
    os.rename(b, aside)
    os.rename(a, b)
    os.rename(aside, a)


def recover_swap(target: Path, stage: Path) -> None:
    """Put back what a kill left of an exchange without renameat2: ``target`` missing, its old content aside."""
    aside = replaced_path(target)
    if os.path.isdir(aside) and not os.path.islink(aside):
        if not os.path.lexists(target):
            os.rename(aside, target)
        elif not os.path.lexists(stage):
            os.rename(aside, stage)


def swap_in(stage: Path, target: Path, replaced: Mapping[str, Any]) -> dict[str, tuple[int, int]] | None:
    """Make the directory ``stage`` ``target`` in one step: renamed to a new name (or over an empty directory), or
    exchanged with the directory there once its other files are linked into ``stage`` (``_link_others``; not the
    ``replaced`` files of an earlier run). Returns None after a rename; after an exchange, the files linked, and
    the directory replaced is at ``stage``, for ``dispose_replaced``."""
    try:
        os.rename(stage, target)  # a new name, or over an empty directory: one step
        return None
    except OSError as e:
        if e.errno not in (errno.ENOTEMPTY, errno.EEXIST) or not target.is_dir() or target.is_symlink():
            raise
        linked = _link_others(target, stage, replaced)
        _exchange(stage, target)
        return linked


def superseded_shards(old: Path, new: Path) -> set[str]:
    """The files of ``old`` (relative paths) that the write ``new`` replaces under other names: a sharded weights file,
    ``X.index.json`` and the shards beside it that its ``weight_map`` lists (transformers'
    ``save_pretrained(max_shard_size=...)``), where ``new`` writes ``X`` whole (``model.safetensors``) and neither the
    index nor the shard. They are the previous version of the file written: carried over, they would be a stale second
    copy of the weights beside the new one (a whole model's size), and a loader that reads the index first (vLLM's)
    would load them instead. transformers' own unsharded save removes the shards (and leaves the index). An index that
    cannot be read, or that lists files outside its folder, proves nothing: kept with its files."""
    out: set[str] = set()
    if not old.is_dir() or old.is_symlink():
        return out
    for rel, path in files_under(old):
        whole = rel.removesuffix(".index.json")
        if whole == rel or path.is_symlink() or not (new / whole).is_file() or os.path.lexists(new / rel):
            continue
        try:
            weight_map = json.loads(path.read_text(encoding="utf-8")).get("weight_map")
        except (OSError, ValueError, AttributeError):
            continue
        shards = {s for s in weight_map.values() if isinstance(s, str)} if isinstance(weight_map, dict) else set()
        folder = Path(rel).parent
        if not shards or any(Path(s).name != s or s in (".", "..", Path(whole).name) for s in shards):
            continue
        out.add(rel)
        out.update((folder / s).as_posix() for s in shards if not os.path.lexists(new / folder / s))
    return out


def _link_others(target: Path, stage: Path, replaced: Mapping[str, Any]) -> dict[str, tuple[int, int]]:
    """What else ``target`` holds (a user's files, where this write made none of the same name; not the ``replaced``
    files of an earlier run), hard-linked into ``stage`` before the swap: it is in place at every moment. Returns
    the files linked (relative path -> device and inode), for ``dispose_replaced`` to tell a file changed since."""
    linked = {}
    for root, dirs, _ in os.walk(target):
        for name in dirs:  # an empty directory of the user's (the others are made for what they hold)
            with contextlib.suppress(OSError):
                if not Path(root, name).is_symlink() and not os.listdir(Path(root, name)):
                    (stage / Path(root, name).relative_to(target)).mkdir(parents=True, exist_ok=True)
    superseded = superseded_shards(target, stage)
    for rel, path in files_under(target):
        dst = stage / rel
        if rel in replaced or rel in superseded or os.path.lexists(dst) or (
                path.name in (LOCK, PARTIAL) and is_bookkeeping(path)):
            continue
        with contextlib.suppress(OSError):  # no hard links here: carried after the swap instead (dispose_replaced)
            dst.parent.mkdir(parents=True, exist_ok=True)
            if path.is_symlink():
                os.symlink(os.readlink(path), dst)
            else:
                os.link(path, dst)
                linked[rel] = (st := os.lstat(dst)).st_dev, st.st_ino
    for root, dirs, _ in os.walk(target):  # each directory of the user's keeps its permissions (a private one stays so)
        for name in dirs:
            mine, made = Path(root, name), stage / Path(root, name).relative_to(target)
            if not mine.is_symlink() and made.is_dir() and not made.is_symlink():
                with contextlib.suppress(OSError):
                    take_mode(mine, made)
    return linked


def take_mode(target: Path, stage: Path) -> int | None:
    """``stage`` made to replace the directory ``target`` takes its permission bits (with the owner's rights until
    the write is finished) and, where this process may set them, its owner and group: a private 0700 directory stays
    private, a team's setgid directory the team's. Returns ``target``'s mode (None: no directory there)."""
    try:
        st = os.lstat(target)
    except FileNotFoundError:
        return None
    if not stat.S_ISDIR(st.st_mode):
        return None
    try:
        os.chown(stage, st.st_uid, st.st_gid)
    except PermissionError:  # another user's directory: its group, where this user is in it
        with contextlib.suppress(PermissionError):
            os.chown(stage, -1, st.st_gid)
    mode = stat.S_IMODE(st.st_mode)
    os.chmod(stage, mode | stat.S_IRWXU)  # after chown, which clears the setgid bit
    return mode


def _real_dir(path: Path) -> bool:
    """Whether ``path`` is a directory, not a symlink to one: where a save made a directory (``1_Pooling``), a file of
    the user's at that name is no earlier version of a file it writes, and is kept (sentence-transformers' save
    stops there, "File exists")."""
    return path.is_dir() and not path.is_symlink()


def _is_file(path: Path, ident: tuple[int, int]) -> bool:
    """Whether ``path`` is the regular file of that device and inode."""
    return (st := regular_stat(path)) is not None and (st.st_dev, st.st_ino) == ident


def _same_file(a: Path, b: Path) -> bool:
    with contextlib.suppress(OSError):
        x, y = os.lstat(a), os.lstat(b)
        return (x.st_dev, x.st_ino) == (y.st_dev, y.st_ino) or (
            stat.S_ISLNK(x.st_mode) and stat.S_ISLNK(y.st_mode) and os.readlink(a) == os.readlink(b))
    return False


def dispose_replaced(old: Path, target: Path, merge: bool, proven: Mapping[str, tuple[int, ...]] | None = None,
             linked: Mapping[str, tuple[int, int]] | None = None) -> None:
    """The directory ``target`` replaced, now at ``old``: its files its manifests prove bertkit's removed (``proven``:
    those proven already, by identity), and with ``merge`` (a save that adds to a directory) those the new one
    replaces, the shards of a weights file it writes whole among them (``superseded_shards``); every other file is
    carried into ``target`` where its name is free. What is left (a file of a user's
    where the new run put one of the same name) is kept beside ``target``, named in a warning. A file ``linked`` into
    the new directory before the swap (``_link_others``) and replaced or removed at its old name since (an editor
    saves by renaming a new file over its name) is as the user left it: the newer file replaces the link, and a
    removed one is not brought back."""
    if proven is None:
        try:
            proven = proven_files(old)[0]
        except BertkitError:  # a manifest bertkit cannot read (damaged, another version's) proves nothing: all kept
            proven = {}
    else:
        proven = {rel: ident for rel, ident in proven.items()
                  if (st := regular_stat(old / rel)) is not None and identity(st) == ident}
    superseded = superseded_shards(old, target) if merge else set()
    for rel, ident in (linked or {}).items():
        if not os.path.lexists(old / rel) and _is_file(target / rel, ident):
            os.unlink(target / rel)  # removed by the user since it was linked
    left = []  # bookkeeping last: a manifest keeps proving what is left until it goes (a kill meanwhile)
    for rel, path in sorted(files_under(old), key=lambda entry: entry[1].name in BOOKKEEPING):
        dst = target / rel
        if linked and rel in linked and _is_file(dst, linked[rel]) and not _is_file(path, linked[rel]):
            os.replace(path, dst)  # the user's file, saved anew at its name since it was linked
            continue
        if rel in proven or rel in superseded or (path.name in (LOCK, PARTIAL) and is_bookkeeping(path)) or (
                os.path.lexists(dst) and ((merge and not _real_dir(dst)) or is_bookkeeping(path)
                                          or _same_file(path, dst))):
            path.unlink()
            continue
        if not os.path.lexists(dst):
            with contextlib.suppress(OSError):
                dst.parent.mkdir(parents=True, exist_ok=True)
                os.rename(path, dst)
                continue
        left.append(rel)
    remove_emptied(old)
    if os.path.lexists(old):
        kept = Path(tempfile.mkdtemp(prefix=f"{target.name}.replaced-", dir=target.parent))
        os.rename(old, kept / target.name)
        logger.warning("%s was replaced; %d file(s) of it bertkit cannot prove it wrote, whose names the new one "
                       "uses, were kept in %s (e.g. %s)", target, len(left), kept, ", ".join(left[:3]))


