"""Where a write of a directory goes, decided before anything is written: the directory a path names as the system
opens it (``target_of``), its staging directory beside it, and the paths refused up front (a file where a directory
is to be, a name too long for its staging name). ``staging`` does the write itself.
"""

from __future__ import annotations

import os
from pathlib import Path

from bertkit.dir_lock import staging_path
from bertkit.errors import BertkitError
from bertkit.outputs import NAME_MAX, name_max


def staging_dir_of(path: str | os.PathLike) -> Path:
    """Where a run of the output directory ``path`` is written before it is moved into place."""
    return staging_path(target_of(path))


def replaced_path(target: Path) -> Path:
    return target.parent / f".{target.name}.bertkit-replaced"


def target_of(path: str | os.PathLike) -> Path:
    """The directory a write of ``path`` makes or replaces: its parents' symlinks resolved, and the path itself if it
    is a symlink to a directory (the data goes where the link leads, as a plain write would put it).

    The path is resolved as the system opens it, never shortened as text first: in ``link/../out`` the ``..`` is
    the parent of where ``link`` leads (os.path.abspath would drop ``link/..`` and write ``./out``, another
    directory, which the same path then does not load from)."""
    path = Path(os.getcwd(), path)  # Path drops "." parts and a trailing "/" only; ".." parts stay
    if (path.is_symlink() and path.is_dir()) or path.name in ("", ".."):  # "/" or "x/..": a directory named so
        return Path(os.path.realpath(path))
    return Path(os.path.realpath(path.parent)) / path.name


def make_route(path: str | os.PathLike, what: str) -> None:
    """Make the directories ``path`` goes through before a ``..`` (``missing`` in ``missing/../out``), as transformers'
    save (os.makedirs, ``mkdir -p``) makes them: the system resolves ``..`` only in a directory that exists, so
    without them the same path does not load back what was written there (``target_of`` alone resolves a missing
    ``missing/..`` as text). A file where such a directory is to be is refused, naming it (NotADirectoryError in
    transformers); ``what`` writes a directory."""
    full = Path(os.getcwd(), path)  # ".." parts stay
    for i, part in enumerate(full.parts):
        if part != "..":
            continue
        route = Path(*full.parts[:i])
        if os.path.lexists(route) and not os.path.isdir(route):
            kind = "a file" if os.path.exists(route) else "a symlink to nowhere"
            raise BertkitError(f"{path} cannot be made: it goes through {route}, which is {kind}, not a directory; "
                               f"{what} writes a directory of files: pass a path through directories")
        if not os.path.lexists(route):
            os.makedirs(route, exist_ok=True)


def refuse_long_name(target: Path) -> None:
    """A directory is written beside its name as ``.NAME.bertkit-staging`` (and swapped through
    ``.NAME.bertkit-replaced``): a name within the file system's limit but too long for those (about 238 bytes of
    255) is refused, naming the limit, before anything is written: the write failed "File name too long" naming
    the staging directory, where transformers' save writes it."""
    longest = max(len(os.fsencode(p.name)) for p in (staging_path(target), replaced_path(target)))
    limit = name_max(target.parent) if target.parent.is_dir() else NAME_MAX
    if longest > limit:
        most = limit - (longest - len(os.fsencode(target.name)))
        raise BertkitError(f"{target}: its name is {len(os.fsencode(target.name))} bytes, and bertkit writes the "
                           f"directory beside it first under a name {longest - len(os.fsencode(target.name))} bytes "
                           f"longer (.NAME.bertkit-staging), past the file system's {limit} bytes a name: choose a "
                           f"name of at most {most} bytes")


def refuse_non_directory(path: str | os.PathLike, what: str) -> None:
    """``path``, where ``what`` writes a directory of files, refused when a file (or a symlink to nowhere) is there:
    every writer of a directory asks this before it makes one (mkdir's bare FileExistsError otherwise)."""
    if os.path.lexists(path) and not os.path.isdir(path):
        raise BertkitError(f"{path} is {'a file' if os.path.exists(path) else 'a symlink to nowhere'}, not a "
                           f"directory: {what} writes a directory of files; pass the path of a directory, new or to "
                           "add to")
    refuse_file_above(path, f"{what} writes a directory of files")


def refuse_file_above(path: str | os.PathLike, what: str) -> None:
    """``path`` refused when the nearest existing path above it is no directory: a file there (``notes.txt/out``)
    was mkdir's bare "File exists: notes.txt", for a one-file output after all the work."""
    above = next((p for p in Path(os.getcwd(), path).parents if os.path.lexists(p)), None)
    if above is not None and not os.path.isdir(above):
        kind = "a file" if os.path.exists(above) else "a symlink to nowhere"
        raise BertkitError(f"{path} cannot be made: {above} is {kind}, not a directory; {what}: pass a path "
                           "inside a directory")
