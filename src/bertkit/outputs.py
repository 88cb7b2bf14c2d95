"""Output directories and files that never cost a user their earlier work.

bertkit deletes or replaces only a file it can prove it wrote (``_proves``): a regular file reached without a
symlink and recorded when written (size and sha256), or one inside a directory it made for one write; never a
command's own inputs.

- **Atomic writes** (``atomic_target``): a temporary file beside the target, fsynced, renamed over it; a symlink
  at the name is replaced, never followed.
- **The record** (``register``, which the atomic writers call): the process keeps its own, and each claimed
  directory a journal (``.bertkit-files.jsonl``, one line appended per file) so a SIGKILLed run's files are
  recorded too. A file bertkit appends to is recorded once (``appends``); a directory made for one write a kill
  may cut short (a checkpoint's) once, as scratch.
- **The run marker** (``.bertkit-run.json``): command, settings, starting directory and the journal folded in.
  ``--overwrite`` is all or nothing: the recorded files still as written are removed only if nothing else is there.
- **The lock** (``bertkit.dir_lock``), taken before anything is checked or removed: against claims of the
  directory, of one inside or around it, and files written into it.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import stat
import tempfile
from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from bertkit import dir_lock
from bertkit.dir_lock import LOCK
from bertkit.errors import BertkitError

logger = logging.getLogger("bertkit")
MARKER, JOURNAL = ".bertkit-run.json", ".bertkit-files.jsonl"
_RESERVED = {LOCK, JOURNAL}  # bertkit's bookkeeping at any depth (a nested claim's), never a user's file
_UMASK = os.umask(0)
os.umask(_UMASK)  # read once: files bertkit creates get the permissions a plain open() would have given

_ROOT = Path("/")
_WRITTEN: dict[str, dict] = {}  # real path below / -> its entry (with "id": dev, inode, size, mtime), or scratch
_HASHES: dict[tuple[int, ...], str] = {}  # identity -> sha256: a rename keeps it, so a file is hashed once
_ACTIVE: list[OutputDir] = []  # the directories this process has claimed and not released
_JOINED: list[tuple[Path, Path]] = []  # (directory, journal) of a parent process's claims, in its workers
_EARLY: dict[str, bool] = {}  # real directory -> whether lock_output_dir made it, until a claim takes the lock over


# -- Atomic files ---------------------------------------------------------------------------------------------------


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
def atomic_target(path: str | os.PathLike, verify: Any = None, *, appends: bool = False) -> Iterator[Path]:
    """A temporary path beside ``path`` to write (by ``atomic_write`` or a library's own writer); on success it is
    fsynced, checked by ``verify(tmp)`` if given (raise to refuse it), renamed over ``path`` and ``register``-ed
    (``appends``: to be appended to). On any error ``path`` is untouched. Inside a claimed directory a file there
    is replaced only if bertkit ``owns`` it: one a user saved meanwhile, or changed since, is refused by name.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    mine = path.name in (MARKER, *_RESERVED) or not os.path.lexists(path) or owns(path)
    if not mine and any(_within(_real(path), c.real) for c in _ACTIVE):  # outside a claim the caller decides
        raise BertkitError(f"{path} is not a file this run wrote (saved there meanwhile, or changed since it was "
                           "written); bertkit does not replace it: move it away and run again")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        # mkstemp's 0600 would make every model file private; set after writing, since a library may have
        # replaced the file (safetensors' save_file creates it anew, 0600 again).
        os.chmod(tmp, 0o666 & ~_UMASK)
        fsync(tmp)
        if verify is not None:
            verify(Path(tmp))
        os.replace(tmp, path)  # replaces a symlink at `path` itself, never writes through it
    except BaseException as e:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if isinstance(e, OSError) and e.errno == errno.ENOSPC:
            raise BertkitError(f"no space left on the device while writing {path}; free some space and run again "
                               "(nothing was replaced: the previous file, if any, is intact)") from e
        raise
    fsync_dir(path.parent)
    register(path, appends=appends)


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "w", encoding: str | None = "utf-8", *,
                 appends: bool = False) -> Iterator[IO]:
    """``open(path, mode)`` made atomic (see ``atomic_target``)."""
    binary = "b" in mode
    with atomic_target(path, appends=appends) as tmp, open(tmp, mode, encoding=None if binary else encoding,
                                                           newline=None if binary else "") as f:
        yield f


def atomic_write_text(path: str | os.PathLike, text: str, encoding: str = "utf-8", *, appends: bool = False) -> Path:
    with atomic_write(path, "w", encoding=encoding, appends=appends) as f:
        f.write(text)
    return Path(path)


def atomic_write_json(path: str | os.PathLike, data: Any, indent: int = 2) -> Path:
    return atomic_write_text(path, json.dumps(data, indent=indent, ensure_ascii=False, default=str) + "\n")


# -- The record of what bertkit wrote, and the one proof --------------------------------------------------------------


def sha256_of(path: str | os.PathLike, size: int | None = None) -> str:
    """The sha256 of the file at ``path`` (of its first ``size`` bytes, if given)."""
    digest, left = hashlib.sha256(), size
    with open(path, "rb") as f:
        while block := f.read(1 << 20 if left is None else min(1 << 20, left)):
            digest.update(block)
            left = None if left is None else left - len(block)
    return digest.hexdigest()


def _real(path: str | os.PathLike) -> Path:
    """``path`` with its directory's symlinks resolved and its last component kept as it is."""
    path = Path(os.path.abspath(path))
    return Path(os.path.realpath(path.parent)) / path.name


def _regular(path: Path) -> os.stat_result | None:
    """``path``'s own status if it is a regular file (not a symlink), else None."""
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        st = os.lstat(path)
        return st if stat.S_ISREG(st.st_mode) else None
    return None


def _identity(st: os.stat_result) -> tuple[int, ...]:
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns  # a tuple: no JSON record (a marker's) ever equals it


def _within(path: Path, directory: Path) -> str | None:
    """``path`` relative to ``directory`` (both real), or None when it is not inside it."""
    try:
        rel = path.relative_to(directory)
    except ValueError:
        return None
    return rel.as_posix() if rel.parts else None


def _records() -> Iterator[tuple[Path, Path]]:
    """(directory, journal) of each claim whose journal a write in this process goes to."""
    yield from ((c.real, c.real / JOURNAL) for c in _ACTIVE)
    yield from _JOINED


def _record(real: Path, entry: dict) -> None:
    """``entry`` for the file or directory ``real``, in this process's record and each claim's journal."""
    _WRITTEN[_within(real, _ROOT)] = entry
    entry = {k: v for k, v in entry.items() if k != "id"}
    for directory, journal in _records():
        rel = _within(real, directory)
        if rel is not None and rel != MARKER and Path(rel).name not in _RESERVED:
            line = (json.dumps({"path": rel, **entry}, ensure_ascii=False) + "\n").encode("utf-8")
            fd = os.open(journal, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
            try:
                os.write(fd, line)  # one write of one line with O_APPEND: workers' lines never interleave
            finally:
                os.close(fd)


def register(path: str | os.PathLike, sha256: str | None = None, *, appends: bool = False) -> None:
    """Record that bertkit wrote the regular file ``path`` (``sha256`` if already known; ``appends``: whatever
    follows the bytes recorded now is bertkit's too), after a write that does not go through ``atomic_target``."""
    real = _real(path)
    if (st := _regular(real)) is None:
        return
    ident = _identity(st)
    if sha256 or appends or any(_within(real, d) for d, _ in _records()):  # outside a claim: hashed if need be
        _HASHES[ident] = sha256 or _HASHES.get(ident) or sha256_of(real)
    _record(real, {"size": st.st_size, "sha256": _HASHES.get(ident), **({"appends": True} if appends else {}),
                   "id": ident})


def register_scratch(directory: str | os.PathLike) -> None:
    """Record ``directory``, just made for one write a kill may cut short: whatever is inside it is this run's."""
    _record(_real(directory), {"scratch": True})


def register_tree(directory: str | os.PathLike) -> None:
    """``register`` every regular file under ``directory``, which this process has just written."""
    for root, dirs, files in os.walk(directory):
        dirs.sort()
        for name in sorted(files):
            register(Path(root, name))


def claims_for_workers() -> list[tuple[str, str]]:
    """This process's claims, for its worker processes to ``join_claims``: their writes go to the same journals."""
    return [(str(d), str(j)) for d, j in _records()]


def join_claims(claims: Iterable[tuple[str, str]]) -> None:
    _JOINED[:] = [(Path(d), Path(j)) for d, j in claims]


def _proves(records: Mapping[str, Any], rel: str, path: Path, st: os.stat_result) -> bool:
    """Whether ``records`` (relative path -> entry) prove the regular file ``path`` (at ``rel``) bertkit's: inside
    a scratch directory, this process's write unchanged since, or the recorded size and sha256 (of its start, for
    a file bertkit appends to)."""
    if any(isinstance(e := records.get(p.as_posix()), dict) and e.get("scratch") is True
           for p in Path(rel).parents if p.parts):
        return True
    entry = records.get(rel)
    if not isinstance(entry, dict) or not isinstance(size := entry.get("size"), int) or not entry.get("sha256"):
        return isinstance(entry, dict) and entry.get("id") == _identity(st)
    grown = entry.get("appends") is True and st.st_size > size
    return entry.get("id") == _identity(st) or (
        (st.st_size == size or grown) and sha256_of(path, size) == entry["sha256"])


def owns(path: str | os.PathLike) -> bool:
    """Whether bertkit may remove or replace ``path``: a regular file (not a symlink) this process or an active claim
    (this run or the run it resumes) recorded, still as written, or a file in a scratch directory."""
    real = _real(path)
    if (st := _regular(real)) is None:
        return False
    records = [(_ROOT, _WRITTEN), *((c.real, c.recorded()) for c in _ACTIVE)]
    return any((rel := _within(real, root)) is not None and _proves(rec, rel, real, st) for root, rec in records)


def remove_owned(path: str | os.PathLike) -> bool:
    """Remove ``path`` if bertkit ``owns`` it; returns whether it did (anything else is left in place)."""
    if not owns(path):
        return False
    os.unlink(_real(path))
    _WRITTEN.pop(_within(_real(path), _ROOT), None)
    return True


def remove_owned_tree(directory: str | os.PathLike) -> list[str]:
    """Remove the files under ``directory`` that bertkit ``owns``, then the directories left empty; symlinks are
    never followed. Returns what was left (relative paths), named in a warning."""
    directory = Path(directory)
    if directory.is_symlink() or not directory.is_dir():
        return []
    left = [rel for rel in _listing(directory, every=True) if not remove_owned(directory / rel)]
    for root, _, _ in os.walk(directory, topdown=False):
        with contextlib.suppress(OSError):
            os.rmdir(root)  # only if empty
    if left:
        logger.warning("kept %s: it holds %d file(s) bertkit cannot prove it wrote (e.g. %s)", directory, len(left),
                       ", ".join(left[:3]))
    return left


def _listing(directory: Path, every: bool = False) -> list[str]:
    """Every file and symlink under ``directory`` (relative, sorted; os.walk enters no symlinked directory), without
    bertkit's marker, lock and journal unless ``every``."""
    out = []
    for root, dirs, files in os.walk(directory):
        for name in files + [d for d in dirs if Path(root, d).is_symlink()]:
            rel = Path(root, name).relative_to(directory).as_posix()
            if every or (rel != MARKER and name not in _RESERVED):
                out.append(rel)
    return sorted(out)


# -- A command's inputs and single output files ---------------------------------------------------------------------


def refuse_inputs(output: Path, inputs: Mapping[str, Any], *, is_dir: bool, flag: str = "--output-dir") -> None:
    """A command never writes into, or clears, its own inputs (``inputs``: setting -> path or paths): ``output`` (a
    directory when ``is_dir``) equal to or holding an input is refused, and so is a directory inside an input
    directory a bertkit run made. An output file may be written beside the inputs as a new file, never over an
    existing one inside an input directory (the model's own weights or vocabulary), --overwrite or not."""
    out = output.resolve()
    for name, value in inputs.items():
        for path in [Path(v).resolve() for v in (value if isinstance(value, (list, tuple)) else [value])
                     if v is not None and str(v) != "" and os.path.exists(v)]:
            if out == path:
                how = "is"
            elif out in path.parents:
                how = "holds"
            elif is_dir and path in out.parents and (path / MARKER).is_file():
                how = "is inside"
            elif not is_dir and path in out.parents and os.path.lexists(output):
                how = "would replace a file of"  # a model directory's own weights or vocab.txt: the input lost
            else:
                continue
            raise BertkitError(f"{flag} {output} {how} the command's own input --{name.replace('_', '-')} {path}; "
                               "bertkit never writes into or clears a command's inputs: choose an output outside them")


def refuse_existing_file(path: Path, overwrite: bool, flag: str = "--overwrite",
                         inputs: Mapping[str, Any] | None = None) -> None:
    """For commands whose output is one file: an existing file is replaced only when the user says so, never when
    it is one of the command's ``inputs``, a file another bertkit run recorded, or inside a held directory."""
    path = Path(path)
    refuse_inputs(path, inputs or {}, is_dir=False, flag="the output file")
    if path.exists() and not overwrite:
        raise BertkitError(f"{path} already exists; pass {flag} to replace it, or choose another output file")
    if path.is_dir():
        raise BertkitError(f"{path} is a directory; give a file name (e.g. {path / 'features.jsonl'})")
    real = _real(path)
    dir_lock.refuse_held_near(real, path)
    for parent in real.parents if path.exists() else ():
        try:
            marker = read_marker(parent)
        except BertkitError:  # a marker bertkit cannot read records nothing
            continue
        if marker is not None and _within(real, parent) in _recorded(parent, marker):
            raise BertkitError(f"{path} is a file of the `bertkit {marker['command']}` run in {parent}; bertkit "
                               "does not replace another run's files: choose another output file")


# -- Output directories ------------------------------------------------------------------------------------------------


def read_marker(directory: Path) -> dict | None:
    path = directory / MARKER
    if not os.path.lexists(path):
        return None
    try:
        marker = json.loads(path.read_text(encoding="utf-8")) if not path.is_symlink() else None
    except (json.JSONDecodeError, UnicodeDecodeError, OSError):
        marker = None
    if not (isinstance(marker, dict) and isinstance(marker.get("command"), str)
            and isinstance(marker.get("files"), dict) and isinstance(marker.get("cwd"), str)):
        raise BertkitError(f"{path} is not a run marker this bertkit wrote (damaged, or from another version); "
                           "bertkit cannot tell which files there are its own, so it removes none: clear the "
                           "directory yourself or choose another output directory")
    return marker


def _recorded(directory: Path, marker: dict | None) -> dict[str, Any]:
    """The files the marker and the journal record: path -> entry. A path's last journal line wins; a torn last
    line (a kill, or a worker writing the next) is left out."""
    entries = dict((marker or {}).get("files", {}))
    with contextlib.suppress(FileNotFoundError):
        fd = os.open(directory / JOURNAL, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)  # a symlink: ELOOP
        with os.fdopen(fd, "rb") as f:
            data = f.read()
        for line in data[:data.rfind(b"\n") + 1].splitlines():
            with contextlib.suppress(json.JSONDecodeError, UnicodeDecodeError):
                if isinstance(entry := json.loads(line), dict) and isinstance(entry.get("path"), str):
                    entries[entry.pop("path")] = entry
    return entries


def _safe_relative(rel: Any) -> bool:
    """A recorded path names a file inside its directory: relative, no '..', '.', empty part or NUL."""
    return (isinstance(rel, str) and bool(rel) and "\x00" not in rel and not rel.startswith("/")
            and all(p not in ("", ".", "..") for p in rel.split("/")))


def _overwrite(directory: Path, marker: dict, recorded: dict[str, Any]) -> None:
    """--overwrite, all or nothing: the earlier run's files are removed only if nothing else would be left (no file
    of the user's, none changed since written); otherwise the refusal names them."""
    outside = sorted(str(rel) for rel in recorded if not _safe_relative(rel))
    if outside:
        raise BertkitError(
            f"{directory / MARKER} names {len(outside)} path(s) outside {directory} (e.g. {', '.join(map(repr, outside[:3]))}); "
            "bertkit never writes such a marker, so it removes nothing on its word: clear the directory yourself "
            "or choose another output directory")
    present = _listing(directory)  # reached without a symlink: a link on the way proves nothing
    removable = [rel for rel in present if (st := _regular(directory / rel)) and _proves(recorded, rel, directory / rel, st)]
    left = [rel for rel in present if rel not in removable]
    if left:
        changed = [rel for rel in left if rel in recorded]
        why = (f"{len(changed)} of them written by that run but changed since, so yours now (e.g. "
               f"{', '.join(changed[:3])}); " if changed else "")
        raise BertkitError(
            f"{directory} holds the {len(removable)} file(s) of an earlier `bertkit {marker['command']}` run, and "
            f"{len(left)} other file(s) remain (e.g. {', '.join(left[:3])}); {why}bertkit leaves files it did not "
            "create alone, so nothing was removed: move them or choose another output directory")
    for rel in removable:
        (directory / rel).unlink()
    for sub in sorted({p for rel in removable for p in Path(rel).parents if p.parts}, key=lambda p: -len(p.parts)):
        with contextlib.suppress(OSError):
            (directory / sub).rmdir()  # only if empty (a nested claim's lock keeps its directory)


@dataclass
class OutputDir:
    """A claimed output directory: locked for this process, its marker recording the files made."""

    path: Path
    command: str
    fingerprint: dict
    cwd: str  # where the run started: its relative paths are relative to this
    real: Path
    inherited: dict  # the files earlier runs of this claim recorded (--resume)
    created: bool  # the claim made the directory
    lock: IO | None = None

    def recorded(self) -> dict[str, Any]:
        """The files this run and the earlier runs it continues recorded (path -> size, sha256)."""
        return _recorded(self.path, {"files": self.inherited})

    def record(self) -> None:
        files = {rel: entry for rel, entry in sorted(self.recorded().items())
                 if _safe_relative(rel) and os.path.lexists(self.path / rel)}
        atomic_write_json(self.path / MARKER, {"command": self.command, "fingerprint": self.fingerprint,
                                               "cwd": self.cwd, "files": files})

    def release(self, finished: bool, keep_lock: bool = False) -> None:
        """Fold the journal into the marker and drop the lock, or with ``keep_lock`` hold it until this process
        exits (a command's). A run that failed before writing anything into a directory it created leaves none."""
        if self in _ACTIVE:
            _ACTIVE.remove(self)
        if not finished and self.created and self.path.is_dir() and not _listing(self.path):
            for name in (MARKER, LOCK, JOURNAL):
                with contextlib.suppress(FileNotFoundError):
                    (self.path / name).unlink()
            with contextlib.suppress(OSError):
                self.path.rmdir()
        try:
            if self.path.is_dir() and (self.path / LOCK).exists():
                self.record()
                with contextlib.suppress(FileNotFoundError):
                    (self.path / JOURNAL).unlink()
        finally:
            if not (keep_lock and self.path.is_dir()):  # else the kernel drops the flock when this process exits
                dir_lock.unlock(self.real)


def _refuse_other_settings(directory: Path, command: str, marker: dict, now: dict, paths: Collection[str]) -> None:
    """--resume continues the run the marker describes, not another one (`--task cola` into an SST-2 run would
    replace its report and best model). The settings named in ``paths`` compare as the absolute paths they meant
    where each run started."""
    def absolute(settings: dict, cwd: str) -> dict:
        return {k: (v if k not in paths or v is None else str(Path(cwd, v).resolve()) if isinstance(v, str)
                    else [str(Path(cwd, x).resolve()) for x in v]) for k, v in settings.items()}

    earlier, now = absolute(marker.get("fingerprint") or {}, marker["cwd"]), absolute(now, os.getcwd())
    changed = sorted(k for k in set(earlier) | set(now) if earlier.get(k) != now.get(k))
    if changed:
        shown = "; ".join(f"--{k.replace('_', '-')} {earlier.get(k)!r} then, {now.get(k)!r} now" for k in changed[:4])
        more = f" (and {len(changed) - 4} more)" if len(changed) > 4 else ""
        raise BertkitError(
            f"cannot --resume in {directory}: its `bertkit {command}` run had other settings ({shown}{more}); "
            "resume with the original settings, pass --overwrite to replace that run (only the files bertkit "
            "wrote there are removed), or choose another output directory")


def claim_output_dir(path: str | os.PathLike, command: str, fingerprint: dict | None = None, *,
                     overwrite: bool = False, resume: bool = False, resumable: bool = True,
                     paths: Collection[str] = (), inputs: Mapping[str, Any] | None = None) -> OutputDir:
    """Take ``path`` for one run of ``command`` (refused if it is, holds or lies inside one of its ``inputs``), lock
    it, then check whose files are there: none, claimed; a marker of the same command and settings and
    ``resume``, the run continues there; a bertkit marker otherwise, refused unless ``overwrite`` (all or
    nothing); files without a marker (a user's), always refused.
    """
    directory = Path(path)
    if active := [c for c in _ACTIVE if c.real == directory.resolve()]:  # its lock is this process's: say so here
        raise BertkitError(f"{directory} is the output directory of this process's `bertkit {active[0].command}` "
                           "run already; choose another output directory")
    if str(directory.resolve()) not in _EARLY:  # the command line locks it early, before torch's import
        lock_output_dir(directory, command, inputs)
    lock = dir_lock.lock(directory, command)  # the one lock_output_dir took (this process's)
    try:
        marker = read_marker(directory)
        present = _listing(directory)
        recorded = _recorded(directory, marker)
        inherited: dict[str, Any] = {}
        if marker is None and present:
            raise BertkitError(
                f"{directory} already holds {len(present)} file(s) bertkit did not write there (e.g. "
                f"{', '.join(present[:3])}); bertkit never replaces files it did not create: choose an empty "
                "or new output directory")
        if marker is not None and (present or recorded):
            same = marker["command"] == command
            if resume and same:
                _refuse_other_settings(directory, command, marker, fingerprint or {}, paths)
                inherited = {rel: e for rel, e in recorded.items() if _safe_relative(rel)}
            elif overwrite:
                _overwrite(directory, marker, recorded)
            else:
                fixes = "pass --resume to continue it, " if same and resumable else ""
                raise BertkitError(
                    f"{directory} already holds the output of a `bertkit {marker['command']}` run ({len(present)} "
                    f"file(s)); {fixes}pass --overwrite to replace it (only the files bertkit wrote there are "
                    "removed), or choose another output directory")
        claim = OutputDir(directory, command, fingerprint or {}, os.getcwd(), directory.resolve(), inherited,
                          _EARLY[str(directory.resolve())], lock)
        atomic_write_text(directory / JOURNAL, "")  # this run's journal; the earlier one is in `inherited`
        claim.record()
        del _EARLY[str(directory.resolve())]  # the claim holds the lock now
        _ACTIVE.append(claim)
        return claim
    except BaseException:
        release_unclaimed(directory)
        raise


def _drop_stray_lock(directory: Path) -> None:
    """On a refusal, the lock file this command made in a directory that holds no bertkit run (a user's) is removed
    while still held; one that was there before (an earlier run's) stays."""
    with contextlib.suppress(BertkitError, OSError):
        if read_marker(directory) is None:
            dir_lock.remove_made(directory)


def lock_output_dir(path: str | os.PathLike, command: str, inputs: Mapping[str, Any] | None = None) -> None:
    """Make and lock ``path`` for a claim, once it is known to be no input, no file, and nowhere near a held
    directory. The command line calls it before the slow part of its start-up (torch's import), so a second command
    started meanwhile is refused at once; ``release_unclaimed`` undoes it if the command fails before its claim."""
    directory = Path(path)
    refuse_inputs(directory, inputs or {}, is_dir=True)
    if directory.exists() and not directory.is_dir():
        raise BertkitError(f"{directory} is a file; the output must be a directory")
    dir_lock.refuse_held_near(directory.resolve(), directory, inside=True)
    created = not directory.exists()
    directory.mkdir(parents=True, exist_ok=True)
    try:
        dir_lock.lock(directory, command)
    except BaseException:
        if created:
            directory.rmdir()
        raise
    _EARLY[str(directory.resolve())] = created


def release_unclaimed(path: str | os.PathLike) -> None:
    """After a command failed between ``lock_output_dir`` and its claim: the lock dropped, the directory it made removed."""
    real = str(Path(path).resolve())
    if (made := _EARLY.pop(real, None)) is not None:  # no claim took the lock over
        _drop_stray_lock(Path(path))  # still locked: nobody else has opened it
        if made:
            with contextlib.suppress(OSError):
                Path(path).rmdir()
        dir_lock.unlock(real)


@contextlib.contextmanager
def output_dir(path: str | os.PathLike, command: str, fingerprint: dict | None = None, *, overwrite: bool = False,
               resume: bool = False, resumable: bool = True, paths: Collection[str] = (),
               inputs: Mapping[str, Any] | None = None, keep_lock: bool = False) -> Iterator[OutputDir]:
    """``claim_output_dir`` as a context: the marker records the run's files on the way out, even on errors."""
    claim = claim_output_dir(path, command, fingerprint, overwrite=overwrite, resume=resume, resumable=resumable,
                             paths=paths, inputs=inputs)
    finished = False
    try:
        yield claim
        finished = True
    finally:
        claim.release(finished, keep_lock)
