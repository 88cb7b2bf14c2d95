"""What lets a ``predict`` or ``extract-features`` run cut short be continued: its rows, written as they are made.

A command whose output is one file (or a file's shards) writes it beside its name, ``.NAME.bertkit-partial``,
flushed after each chunk of inputs, and records after each one ``.NAME.bertkit-partial.json``: the plan (the
settings, the input file's size and modification time, the model's files) and how far the rows go (their count,
bytes and sha256). Only when the last row is written is the file renamed to its name, so a reader never sees a
partial file there. A killed run leaves both; ``--resume`` refuses a plan other than its own, cuts the file back to
the rows its record proves (a row torn by the kill is dropped) and goes on from the next chunk: the chunks, and so
the batches, are those of an uninterrupted run, and the bytes too. A plain run is refused naming ``--resume`` and
``--overwrite``; ``--overwrite`` removes what the record names (bertkit's partial names only) and starts again.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import itertools
import json
import logging
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from bertkit import dir_lock
from bertkit.errors import BertkitError
from bertkit.manifests import sha256_digest
from bertkit.outputs import PARTIAL, _alive, _publish, atomic_write_text, fsync_dir, regular_stat, writing

logger = logging.getLogger("bertkit")
FORMAT = 1


def partial_path(path: Path, kind: str = "") -> Path:
    """Where ``path`` is written until it is whole (``kind``: another file of the same write, e.g. ".json")."""
    return path.with_name(f".{path.name}{PARTIAL}{kind}")


def file_identity(path: str | os.PathLike) -> dict[str, Any]:
    """A file as the other resumable commands record their inputs: its name, where it leads, size and mtime."""
    st = os.stat(path)
    return {"path": str(path), "absolute": str(Path(path).resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def file_version(identity: dict[str, Any]) -> str:
    """A ``file_identity``'s size and time, as a refusal names what changed: "1,024 bytes, modified ... UTC"."""
    when = datetime.datetime.fromtimestamp(identity.get("mtime_ns", 0) / 1e9, datetime.UTC)
    return f"{identity.get('size', 0):,} bytes, modified {when:%Y-%m-%d %H:%M:%S.%f} UTC"


def model_identity(model: str | os.PathLike | None) -> Any:
    """A local model directory's files (relative path, size, mtime), those of its folders too: a sentence-transformers
    directory's modules (1_Pooling/config.json, 2_Dense/model.safetensors, a Router's route folders) are the model as
    much as its weights; a Hub id (or no path) as given. Not hidden names (bertkit's bookkeeping, .git), nor a
    training run's checkpoint-N folders (other models), nor anything deeper: the record holds this and is rewritten
    after every chunk."""
    if model is None or not Path(model).is_dir():
        return None if model is None else str(model)
    files = {}
    for folder in [Path(model), *sorted(p for p in Path(model).iterdir() if p.is_dir() and not p.is_symlink()
                                        and not p.name.startswith(".") and not _CHECKPOINT.fullmatch(p.name))]:
        for path in sorted(folder.iterdir()):
            if path.is_file() and not path.name.startswith("."):
                files[path.relative_to(model).as_posix()] = [path.stat().st_size, path.stat().st_mtime_ns]
    return {"directory": str(Path(model).resolve()), **files}


_CHECKPOINT = re.compile(r"checkpoint-[0-9]+")


def resumed_overwrite(out: Path) -> bool:
    """Whether the run cut short that ``--resume`` continues into ``out`` was told it may replace a file there."""
    try:
        return json.loads(partial_path(out, ".json").read_text(encoding="utf-8")).get("overwrite") is True
    except (OSError, ValueError, AttributeError):
        return False


class PartialOutput:
    """The partial write of ``out`` by ``command`` under ``plan`` (JSON values): ``progress`` is what the record of a
    run cut short says is finished ({} for a new run), ``overwrite`` whether the run may replace a file at ``out``."""

    def __init__(self, out: Path, command: str, plan: dict, *, resume: bool, overwrite: bool):
        self.out, self.command, self.plan = out, command, plan
        self.record_path = partial_path(out, ".json")
        self.progress: dict[str, Any] = {}
        self.overwrite = overwrite
        self.files: list[str] = []  # the partial files this write made (names beside ``out``), removed by --overwrite
        self._proven: dict[tuple, Any] = {}  # ``proven``'s answers: each partial file read once
        # held from before the record is read until the run ends: two runs into one file that both found no record
        # wrote one partial file (the first to finish published the rows of both; the second failed, "No such file")
        self.lock_path = partial_path(out, ".lock")
        parent = out.parent.absolute()  # the directories made for the lock: removed again by a run that writes nothing
        self._made = tuple(itertools.takewhile(lambda d: not os.path.lexists(d), (parent, *parent.parents)))
        try:
            with writing(self.lock_path):
                out.parent.mkdir(parents=True, exist_ok=True)
                dir_lock.lock_file(self.lock_path, command)
            self._claim(resume)
        except dir_lock.Held as e:
            self.release()
            raise BertkitError(f"{out} is being written by {e.holder}; wait for it to finish, or choose another "
                               "output file") from None
        except BaseException:
            self.release()
            raise

    def release(self) -> None:
        """Let go of the output's lock (its file removed), and of the directories made for it if they stayed empty."""
        dir_lock.unlock_file(self.lock_path)
        for directory in self._made:
            try:
                directory.rmdir()
            except OSError:
                break

    def _claim(self, resume: bool) -> None:
        out, command, plan, overwrite = self.out, self.command, self.plan, self.overwrite
        earlier = self._read()
        if earlier is not None and not any((out.parent / str(n)).exists() for n in earlier.get("files") or []):
            # a kill after the files were renamed into place and before the record went, or before the first
            # was made: nothing is left to continue
            self.record_path.unlink()
            earlier = None
        if earlier is None:
            return
        pid = earlier.get("pid")
        if isinstance(pid, int) and pid != os.getpid() and _alive(pid):
            raise BertkitError(f"{out} is being written by another bertkit command (process {pid}, "
                               f"`bertkit {earlier.get('command')}`); wait for it to finish, or choose another output "
                               "file")
        same = earlier.get("command") == command
        if overwrite or not resume or not same:
            if not overwrite:
                fix = ("pass --resume to continue it, or" if same else
                       f"continue it with `bertkit {earlier.get('command')} --resume`, or pass")
                raise BertkitError(f"the last `bertkit {earlier.get('command')}` run into {out} was cut short after "
                                   f"{_done(earlier.get('progress'))}; its rows are in {_named(out, earlier)}: {fix} "
                                   "--overwrite to start again (they are removed)")
            self.discard(earlier)
            return
        refuse_other_plan(f"into {out}", command, earlier.get("plan") or {}, plan, {part: (
            "was cut short with " + {"settings": "other settings", "input": "another input file",
                                     "model": "another model"}.get(part, f"another {part}"), part) for part in plan},
            "start again (only the rows bertkit wrote are removed), or choose another output file")
        self.progress = earlier.get("progress") or {}
        self.files = list(earlier.get("files") or [])
        self.overwrite = bool(earlier.get("overwrite"))  # the run continued was told it may replace ``out``
        logger.info("resuming the write of %s after %s", out, _done(self.progress))

    def _read(self) -> dict | None:
        if not self.record_path.is_file():
            return None
        try:
            record = json.loads(self.record_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            record = None
        if not isinstance(record, dict) or record.get("format") != FORMAT:
            raise BertkitError(f"{self.record_path} is not a record this bertkit reads (written by another version, "
                               "or changed by hand): remove it and the partial files beside it, or choose another "
                               "output file")
        return record

    def __enter__(self) -> PartialOutput:
        return self

    def __exit__(self, kind: Any, error: Any, tb: Any) -> None:
        # a run stopped before it committed a row leaves nothing to resume: nothing of its own either
        try:
            if kind is not None and not any(p.get("rows") or p.get("units") or p.get("shards")
                                            for p in self.progress.values() if isinstance(p, dict)):
                with contextlib.suppress(OSError):  # a read-only or full disk: its own error is the one to see
                    self.discard({"files": self.files})
        finally:
            self.release()

    def save(self, progress: dict[str, Any]) -> None:
        """Record ``progress`` once the files it names are flushed to disk."""
        self.progress = progress
        atomic_write_text(self.record_path, json.dumps(
            {"format": FORMAT, "command": self.command, "pid": os.getpid(), "plan": self.plan,
             "overwrite": self.overwrite, "files": self.files, "progress": progress}, sort_keys=True) + "\n")

    def own(self, path: Path) -> Path:
        """``path`` (beside ``out``) counted among this write's files."""
        if path.name not in self.files:
            self.files.append(path.name)
        return path

    def discard(self, record: dict) -> None:
        """Remove what a run cut short recorded (bertkit's partial names beside ``out`` only), then its record."""
        for name in record.get("files") or []:
            if isinstance(name, str) and self._partial_name(name):
                (self.out.parent / name).unlink(missing_ok=True)
        self.record_path.unlink(missing_ok=True)

    def _partial_name(self, name: str) -> bool:
        """Whether ``name`` is a partial name of this output's own (``.OUT.bertkit-partial``, ``.STEM-00001-of-00004
        .SUFFIX.bertkit-partial``, with any kind after it): a record edited by hand, or another output's, never
        leads a removal to a file of another name (any other file beside ``out`` is the user's)."""
        if not (name.startswith(".") and "/" not in name and PARTIAL in name):
            return False
        written = name[1:name.index(PARTIAL)]
        return written == self.out.name or (written.startswith(f"{self.out.stem}-")
                                            and written.endswith(self.out.suffix))

    def finish(self, placed: Sequence[tuple[Path, Path]], superseded: Sequence[Path] = ()) -> None:
        """Each finished partial file renamed to its name (as ``atomic_target`` places a file), then the record
        removed. The earlier output's files this one replaces under other names (``superseded``) go before the first
        file is placed: a kill until then leaves that partial file and the record, from which a resume finishes the
        placing; one after, a record naming no file, which the next run passes over."""
        for i, (tmp, path) in enumerate(reversed(placed)):  # the first file last: an output is not found before all
            if i == len(placed) - 1:  # of it is
                for old in superseded:
                    old.unlink(missing_ok=True)
            with writing(path):
                _publish(tmp, path)
        fsync_dir(self.out.parent)
        self.record_path.unlink(missing_ok=True)

    def appender(self, path: Path) -> Appender:
        return Appender(self, path)

    def proven(self, path: Path) -> Any:
        """The sha256 of the first ``bytes`` of ``path``'s partial file (the rows its ``Appender`` recorded), as a
        ``hashlib`` object to go on with the rows to come; None where the file is missing, shorter, or differs from
        the record. ``resume_point`` asks before any unit and the ``Appender`` after: the file is read once (a
        features file may be gigabytes), and the writer goes on from the proof the resume was decided by."""
        entry = self.progress.get(path.name) or {}
        key = (path.name, entry.get("bytes"), entry.get("sha256"))
        if key not in self._proven:
            tmp, size, proven = partial_path(path), int(entry.get("bytes", 0)), None
            if (st := regular_stat(tmp)) is not None and st.st_size >= size:  # a symlink there proves nothing
                digest = sha256_digest(tmp, size)
                proven = digest if digest.hexdigest() == entry.get("sha256") else None
            self._proven[key] = proven
        return None if self._proven[key] is None else self._proven[key].copy()  # the kept one never goes on


def open_partial(tmp: Path, mode: str) -> IO[bytes]:
    """The partial file ``tmp`` opened to be written afresh (``"wb"``) or gone on with (``"r+b"``, a file ``proven``
    found regular), never through a symlink: one at that name is removed and a file made in its place, as an atomic
    write replaces a symlink at its name (the file it leads to is the user's). The caller closes it."""
    if mode == "wb" and os.path.islink(tmp):
        tmp.unlink()
    flags = os.O_RDWR if mode == "r+b" else os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    return os.fdopen(os.open(tmp, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666), mode)


class Appender:
    """Rows appended to ``partial_path(path)``, committed by count: ``rows`` is where a resumed run goes on."""

    def __init__(self, run: PartialOutput, path: Path):
        self.run, self.path, self.tmp = run, path, run.own(partial_path(path))
        progress = run.progress.get(path.name) or {}
        self.rows, size = int(progress.get("rows", 0)), int(progress.get("bytes", 0))
        proven = run.proven(path) if self.rows else None
        if proven is not None:  # the recorded rows' sha256 goes on as the digest of the rows to come
            self.digest = proven
            with writing(self.tmp):
                self.file: IO[bytes] = open_partial(self.tmp, "r+b")
                self.file.truncate(size)  # a row torn by the kill, and any row past the record: made again
                self.file.seek(size)
            return
        if self.rows:
            logger.warning("%s is missing or differs from the rows recorded when it was written: every row is made "
                           "again", self.tmp)
            self.rows = 0
        self.digest = hashlib.sha256()
        run.save(run.progress)  # the file named before it is made: a kill leaves no file no record names
        with writing(self.tmp):
            self.file = open_partial(self.tmp, "wb")

    def write(self, text: str) -> None:
        data = text.encode("utf-8")
        self.digest.update(data)
        with writing(self.tmp):
            self.file.write(data)

    def commit(self, rows: int, **extra: Any) -> None:
        """The rows written so far (``rows`` of them) flushed to disk and recorded."""
        with writing(self.tmp):
            self.file.flush()
            os.fsync(self.file.fileno())
        self.rows = rows
        self.run.save({**self.run.progress, self.path.name: {"rows": rows, "bytes": self.file.tell(),
                                                             "sha256": self.digest.hexdigest(), **extra}})

    def close(self) -> None:
        self.file.close()


def _done(progress: Any) -> str:
    """How far a run cut short went: its rows, or a sharded extraction's shards and work units (it records no rows)."""
    parts = [p for p in (progress or {}).values() if isinstance(p, dict)]
    if any("shards" in p for p in parts):
        shards, units = sum(len(p.get("shards") or []) for p in parts), sum(int(p.get("units", 0)) for p in parts)
        return f"{shards} finished shard(s)" + (f" and {units} work unit(s) of the next" if units else "")
    return f"{sum(int(p.get('rows', 0)) for p in parts):,} row(s)"


def _named(out: Path, record: dict) -> str:
    """The partial files a record names (a sharded output's, one per shard), or ``out``'s own partial name."""
    names = [n for n in record.get("files") or [] if isinstance(n, str) and "/" not in n]
    if not names:
        return str(partial_path(out))
    more = f" (and {len(names) - 2} more)" if len(names) > 2 else ""
    return ", ".join(str(out.parent / n) for n in names[:2]) + more


def refuse_other_plan(where: str, command: str, earlier: dict, now: dict,
                      parts: dict[str, tuple[str, str | None]], overwrite: str,
                      described: dict[str, Any] | None = None) -> None:
    """--resume continues the run ``earlier`` (its plan) describes, not another one: the first of ``parts`` (a plan's
    key -> what that run did otherwise, e.g. "had other settings", and what to resume with, None for the bertkit
    version that started it) whose value in ``now`` differs is refused, naming the values then and now (a setting's
    as its flag, --max-length; a file's size and time). ``where``: "in DIR" or "into FILE"; ``overwrite``: what
    --overwrite does there, and the last way out; ``described``: a part's own (what the run did, what to resume with)
    from its values then and now, where the values alone would not say it."""
    for part, (did, original) in parts.items():
        then, value = earlier.get(part), now.get(part)
        if then == value:
            continue
        if described and part in described:
            did, original = described[part](then, value)
        elif isinstance(value, dict) and isinstance(then, dict) and "mtime_ns" not in value:
            keys = sorted(k for k in set(then) | set(value) if then.get(k) != value.get(k))
            name = (lambda k: f"--{k.replace('_', '-')}") if part in ("settings", "config") else str
            files = part == "model"  # a model directory's files: [size, mtime_ns] each
            did += " (" + "; ".join(f"{name(k)} {_shown(then.get(k), files)} then, {_shown(value.get(k), files)} now"
                                    for k in keys[:4]) + (f" (and {len(keys) - 4} more)" if len(keys) > 4 else "") + ")"
        else:
            named = "" if isinstance(value, dict) else f"{part} "  # a file's identity names itself
            did += f" ({named}{_shown(then)} then, {_shown(value)} now)"
        fix = (f"resume with the original {original}, " if original else
               "finish it with the bertkit version that started it, ")
        raise BertkitError(f"cannot --resume {where}: its `bertkit {command}` run {did}; {fix}pass --overwrite to "
                           f"{overwrite}")


def _shown(value: Any, model_file: bool = False) -> str:
    if isinstance(value, dict) and "mtime_ns" in value:
        return f"{value.get('path')!r} ({file_version(value)})"
    if model_file and isinstance(value, list) and len(value) == 2:  # not --layers -1,-2 read as a file's size and time
        return f"({file_version({'size': value[0], 'mtime_ns': value[1]})})"
    return repr(value)
