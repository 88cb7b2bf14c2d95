"""Which directory a command may write, and what it may replace there: a command's output directory is a run,
claimed for it and written beside it (``bertkit.staging.staged``), with a manifest written last that proves its
files bertkit's.

- **A claim** (``output_dir``; ``lock_output_dir`` first on the command line, before torch's import) takes the
  directory's staging directory and its lock, then checks whose files the directory holds: none, the run is
  written beside it and moved in when finished; an earlier run of the same command and settings and ``--resume``,
  it continues (the earlier files linked into the staging directory); another bertkit run, refused unless
  ``--overwrite``, all or nothing: every file its manifest proves bertkit's, removed only once the new run is
  complete; files without a manifest (a user's), always refused. A run cut short stays in its staging directory:
  ``--resume`` continues it, ``--overwrite`` replaces it, and a command that cannot be resumed removes it unasked.
- **A run in place** (``in_place``: the Trainer's, as transformers' writes its checkpoints into output_dir as it
  goes) is locked in its directory and records there each file it will add to (``record``).
- **A command's inputs** are never its output (``refuse_inputs``); a one-file output replaces only a file the user
  names with --overwrite (``refuse_existing_file``).
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import itertools
import json
import logging
import os
import shutil
import stat
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bertkit import dir_lock
from bertkit.dir_lock import LOCK, staging_path
from bertkit.errors import BertkitError, InputError
from bertkit.manifests import (
    MANIFEST_FORMAT,
    listing,
    owns,
    proven_files,
    proves,
    read_marker,
    recorded_files,
    sha256_of,
)
from bertkit.outputs import (
    BOOKKEEPING,
    MARKER,
    PARTIAL,
    TMP_SUFFIX,
    as_placed,
    atomic_write_json,
    expect_new,
    is_mount_point,
    refuse_special,
    regular_stat,
    remove_dead_temporaries,
    staging_of,
    writing,
)
from bertkit.partial_output import refuse_other_plan
from bertkit.staging import Stage, clear_staging
from bertkit.write_paths import make_route, refuse_file_above, refuse_non_directory, target_of

logger = logging.getLogger("bertkit")


# -- A command's inputs and single output files -------------------------------------------------------------------


def refuse_inputs(output: Path, inputs: Mapping[str, Any], *, is_dir: bool, flag: str = "--output-dir") -> None:
    """A command never writes into, or clears, its own inputs (``inputs``: setting -> path or paths): ``output`` (a
    directory when ``is_dir``) equal to or holding an input is refused, and so is a directory inside an input
    directory a bertkit run made. An output file may be written beside the inputs as a new file, never over an
    existing one inside an input directory (the model's own weights or vocabulary), --overwrite or not. A model
    directory inside a run (``RUN/best``) is the run's: its manifest is RUN's, and RUN's --overwrite removes it."""
    out = output.resolve()
    for name, value in inputs.items():
        for given, pattern in _input_paths(value):
            path = Path(given).resolve()
            if out == path:  # also a name that is no file: a TensorFlow checkpoint's prefix, a hub id, which an
                how = "is"  # output there would hide (the checkpoint read from its prefix would be the directory)
            elif not os.path.exists(given):
                continue
            elif out in path.parents:
                how = "holds"
            elif is_dir and path in out.parents and any((p / MARKER).is_file() for p in (path, *path.parents)):
                how = "is inside"
            elif not is_dir and path in out.parents and os.path.lexists(output):
                how = "would replace a file of"  # a model directory's own weights or vocab.txt: the input lost
            else:
                continue
            matched = f" (matched by {pattern})" if pattern else ""
            raise BertkitError(f"{flag} {output} {how} the command's own input --{name.replace('_', '-')} {path}"
                               f"{matched}; bertkit never writes into or clears a command's inputs: choose an output "
                               "outside them")


def match_files(pattern: str) -> list[str]:
    """The files the glob ``pattern`` matches, sorted. ``**`` matches any number of directories, as in zsh, bash's
    globstar and Python's ``glob(recursive=True)``: taken as ``*``, ``corpus/**/*.txt`` would leave out the files at
    the top and two or more levels down without a word. Hidden files and directories (an output's staging directory)
    are not matched."""
    return sorted(p for p in glob.glob(pattern, recursive=True) if os.path.isfile(p))


def _input_paths(value: Any) -> list[tuple[str, str | None]]:
    """(path, the pattern that matched it or None) for each path a setting names, existing or not: a glob pattern
    (``corpus/*/*.txt``, which train-tokenizer and create-pretraining-data expand) stands for the files it matches,
    so that an output directory among them (a rerun's --overwrite of ``--out corpus/vocab``) is refused, not read
    as the new run's input."""
    paths = []
    for v in value if isinstance(value, (list, tuple)) else [value]:
        if v is None or str(v) == "":
            continue
        if glob.has_magic(str(v)) and not os.path.exists(v):
            paths += [(p, str(v)) for p in match_files(str(v))]
        else:
            paths.append((str(v), None))
    return paths


def refuse_existing_file(path: Path, overwrite: bool, flag: str = "--overwrite",
                         inputs: Mapping[str, Any] | None = None) -> None:
    """For commands whose output is one file: an existing file is replaced only when the user says so, never when
    it is one of the command's ``inputs``, a file a bertkit run's manifest records, or inside a held directory."""
    path = Path(path)
    if overwrite not in (True, False):  # a string such as "false" is truthy: the file would be replaced
        raise BertkitError(f"overwrite must be True or False, got {overwrite!r}")
    refuse_inputs(path, inputs or {}, is_dir=False, flag="the output file")
    refuse_special(path)
    if path.is_dir():
        raise BertkitError(f"{path} is a directory; give the path of the file to write (one inside it, or elsewhere)")
    refuse_file_above(path, "an output file is made in a directory")
    if is_mount_point(path):  # the rename into place fails (EBUSY), after all the work
        raise BertkitError(f"{path} is a mount point: bertkit writes the file beside it and renames it into place, "
                           "which a mount point does not allow; write to another path (then copy it there)")
    if os.path.lexists(path) and not overwrite:  # a symlink to nowhere is the user's too
        raise BertkitError(f"{path} already exists; pass {flag} to replace it, or choose another output file")
    real = Path(os.path.realpath(path.parent)) / path.name
    dir_lock.refuse_held_near(real, path)
    for parent in real.parents if path.exists() else ():
        try:
            marker = read_marker(parent)
        except BertkitError:  # a marker bertkit cannot read records nothing
            continue
        if marker is not None and real.relative_to(parent).as_posix() in marker["files"]:
            raise BertkitError(f"{path} is a file of the `bertkit {marker.get('command') or 'save'}` run in "
                               f"{parent}; bertkit does not replace another run's files: choose another output file")
    if real.parent.is_dir():
        remove_dead_temporaries(real)
    expect_new(path.absolute(), not overwrite)  # a file another process makes meanwhile is not replaced either


# -- Runs: a command's output directory -----------------------------------------------------------------------------


@dataclass
class OutputDir:
    """A claimed output directory: ``path`` is where the run writes (its staging directory, or ``target`` itself
    for a run in place or one nested in a staged run), made ``target`` by ``release(True)``."""

    path: Path
    target: Path
    command: str
    fingerprint: dict
    cwd: str  # where the run started: its relative paths are relative to this
    stage: Stage | None = None  # None: written in place
    proven: dict = field(default_factory=dict)  # the earlier run's files it replaces (proven at the claim)
    resumable: bool = True
    in_place: bool = False  # the run writes into ``target`` as it goes
    made: tuple[Path, ...] = ()  # in place: the directories the claim made, deepest first
    found: frozenset[str] = frozenset()  # in place: what the directory held when claimed

    def shown(self, value: Any) -> Any:
        """``value`` (a command's result) with the staging directory named as the output directory it became."""
        if self.path == self.target:
            return value
        text = json.dumps(value, default=str)  # the directory as the user named it, then any other staged path
        return json.loads(as_placed(text.replace(json.dumps(str(self.path))[1:-1], json.dumps(str(self.target))[1:-1])))

    def release(self, finished: bool, keep_lock: bool = False) -> None:
        """Finished: the manifest written last, the run swapped into place (the lock held until the process exits
        with ``keep_lock``). Failed: a resumable run that wrote something stays in its staging directory for
        --resume; anything else is removed."""
        if self.stage is None:
            if self.in_place:
                if not finished:
                    self._remove_if_unwritten()
                if not keep_lock:
                    dir_lock.unlock(self.path)
            return
        if finished:
            try:
                self.stage.commit(manifest={"command": self.command, "fingerprint": self.fingerprint,
                                            "cwd": self.cwd}, merge=False, keep_lock=keep_lock, proven=self.proven)
                return
            except BaseException:
                if not dir_lock.holds(self.path):
                    raise  # swapped into place already
                self._abort()
                raise
        self._abort()

    def _remove_if_unwritten(self) -> None:
        """A failed run in place that wrote nothing (refused as it started, or at its first step) leaves nothing it
        created: when what it added is bookkeeping (the lock, the manifest) and files the manifest records empty and
        still empty (metrics.jsonl), those go, then the directories the claim made. What was there before stays."""
        added = set(os.listdir(self.path)) - self.found
        try:
            files = read_marker(self.path)["files"] if MARKER in added else {}
        except BertkitError:  # a manifest bertkit cannot read proves nothing
            return

        def unwritten(name: str) -> bool:
            path = self.path / name
            return (name in files and files[name]["size"] == 0 and path.is_file() and not path.is_symlink()
                    and path.stat().st_size == 0)

        if not all(name in (LOCK, MARKER) or unwritten(name) for name in added):
            return
        with contextlib.suppress(OSError):
            for name in sorted(added, key=lambda n: n == LOCK):  # the lock last
                (self.path / name).unlink()
            remove_made(self.made)

    def _abort(self) -> None:
        assert self.stage is not None
        wrote = self.resumable and _holds_output(self.path)
        if wrote:
            logger.warning("the unfinished `bertkit %s` run is kept in %s: --resume continues it, --overwrite (or "
                           "another run) replaces it", self.command, self.path)
        self.stage.abort(keep=wrote)


def _holds_output(directory: Path) -> bool:
    """Whether a run's staging directory holds anything it wrote: a file with bytes in it, a link or a special file.
    Bertkit's bookkeeping, empty files (a metrics.jsonl opened at the start) and directories of those are not: a run
    that failed at its first step holds nothing --resume could continue, and keeping it would refuse the next run."""
    for root, dirs, files in os.walk(directory):
        for name in files + [d for d in dirs if os.path.islink(os.path.join(root, d))]:
            st = os.lstat(os.path.join(root, name))
            if name not in BOOKKEEPING and (not stat.S_ISREG(st.st_mode) or st.st_size > 0):
                return True
    return False


def _refuse_other_settings(directory: Path, command: str, marker: dict, now: dict, paths: Collection[str],
                           defaults: Mapping[str, Any] | None = None,
                           as_meant: Callable[[dict], dict] | None = None) -> None:
    """--resume continues the run the marker describes, not another one (`--task cola` into an SST-2 run would
    replace its report and best model). The settings named in ``paths`` compare as the absolute paths they meant
    where each run started; a setting the marker lacks (added to bertkit after that run started) compares as its
    value in ``defaults``, the way the earlier version ran; ``as_meant`` reads a value an earlier version recorded
    for what this one records otherwise (``TrainingSettings.as_meant``)."""
    def absolute(settings: dict, cwd: str) -> dict:
        return {k: (v if k not in paths or v is None else str(Path(cwd, v).resolve()) if isinstance(v, str)
                    else [str(Path(cwd, x).resolve()) for x in v]) for k, v in settings.items()}

    recorded = marker.get("fingerprint") or {}
    recorded = {**{k: v for k, v in (defaults or {}).items() if k not in recorded}, **recorded}
    recorded = as_meant(recorded) if as_meant is not None else recorded
    earlier, now = absolute(recorded, marker.get("cwd") or os.getcwd()), absolute(now, os.getcwd())
    refuse_other_plan(f"in {directory}", command, {"settings": earlier}, {"settings": now},
                      {"settings": ("had other settings", "settings")}, "replace that run (only the files bertkit "
                      "wrote there are removed), or choose another output directory")


def _all_or_nothing(directory: Path, marker: dict, resume: bool = False) -> dict[str, tuple[int, ...]]:
    """The earlier run's files, all proven by its manifests, to be replaced at the end; refused naming the others
    (a file of the user's, one changed since written) while there are any, unless the run is resumed (they are
    carried into the continued run's directory, as they were)."""
    proven, left = proven_files(directory)
    if left and not resume:
        recorded = recorded_files(directory)
        changed = [rel for rel in left if rel in recorded]
        why = (f"{len(changed)} of them written by that run but changed since, so yours now (e.g. "
               f"{', '.join(changed[:3])}); " if changed else "")
        raise BertkitError(
            f"{directory} holds the {len(proven)} file(s) of an earlier `bertkit {marker.get('command')}` run, and "
            f"{len(left)} other file(s) remain (e.g. {', '.join(left[:3])}); {why}bertkit leaves files it did not "
            "create alone, so nothing was removed: move them or choose another output directory")
    return proven


def _users_files(directory: str | os.PathLike, present: Sequence[str]) -> BertkitError:
    return BertkitError(f"{directory} already holds {len(present)} file(s) bertkit did not write there (e.g. "
                        f"{', '.join(present[:3])}); bertkit never replaces files it did not create: choose an empty "
                        "or new output directory")


def _link_run(source: Path, stage: Path, files: Collection[str]) -> None:
    """The finished run's proven ``files`` in the staging directory of its continuation: hard links (its writes
    replace files, never change them in place), or copies where the file system has none."""
    for rel in files:
        (stage / rel).parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(source / rel, stage / rel)
        except OSError:
            shutil.copy2(source / rel, stage / rel)


def lock_output_dir(path: str | os.PathLike, command: str, inputs: Mapping[str, Any] | None = None, *,
                    resume: bool = False, overwrite: bool = False) -> Stage:
    """Make and lock ``path``'s staging directory for a run of ``command``, once ``path`` is known to be no input,
    no file, and nowhere near a held directory. The command line calls it before the slow part of its start-up
    (torch's import), so a second command started meanwhile is refused at once. A run a kill cut short there is
    continued with ``resume`` (the same command), removed with ``overwrite`` or when it cannot be resumed, and
    refused otherwise."""
    make_route(path, command)
    target = target_of(path)
    refuse_inputs(target, inputs or {}, is_dir=True)
    if os.path.lexists(target) and not target.is_dir():
        raise BertkitError(f"{path} is {'a file' if target.exists() else 'a symlink to nowhere'}; the output must be a "
                           "directory")
    refuse_non_directory(path, f"a `{command}` run")  # a file above it (notes.txt/out): not "File exists"
    dir_lock.refuse_held_near(target, Path(path), inside=True)

    def keep(record: dict) -> bool:  # a run that can be continued is kept until the claim has checked the rest
        if not (record.get("command") and record.get("resumable")):
            return False
        if (record["command"] == command and resume) or overwrite:
            return True
        fix = ("pass --resume to continue it, or" if record["command"] == command else
               f"continue it with `bertkit {record['command']} --resume`, or pass")  # this command's --resume cannot
        raise BertkitError(
            f"the last `bertkit {record['command']}` run into {path} was cut short; its files are in "
            f"{staging_path(target)}: {fix} --overwrite to start again (they are removed)")

    return Stage.open(target, command, {}, keep)


def claim_output_dir(path: str | os.PathLike, command: str, fingerprint: dict | None = None, *,
                     overwrite: bool = False, resume: bool = False, resumable: bool = True,
                     paths: Collection[str] = (), inputs: Mapping[str, Any] | None = None,
                     stage: Stage | None = None, in_place: bool = False,
                     defaults: Mapping[str, Any] | None = None,
                     as_meant: Callable[[dict], dict] | None = None) -> OutputDir:
    """Take ``path`` for one run of ``command`` (refused if it is, holds or lies inside one of its ``inputs``): its
    staging directory made and locked (``lock_output_dir``, or ``stage`` already), then ``path`` checked: empty or
    new, the run is written beside it and moved in when finished; a finished run of the same command and settings
    and ``resume``, it continues (its files linked into the staging directory); a bertkit run otherwise, refused
    unless ``overwrite`` (all or nothing, and only once the new run is finished); files without a manifest (a
    user's), always refused. ``in_place``: the run writes into ``path`` itself as it goes (the Trainer's). ``defaults``:
    the settings' defaults, standing in for those an earlier bertkit's run did not record; ``as_meant``: an earlier
    run's recorded settings in this version's terms."""
    fingerprint = fingerprint or {}
    refuse_non_directory(path, f"a `{command}` run" if command != "Trainer" else "the Trainer")
    if staging_of(target_of(path)) is not None:  # a run inside this process's staged run: written in place
        Path(path).mkdir(parents=True, exist_ok=True)
        return OutputDir(Path(path), Path(path), command, fingerprint, os.getcwd(), resumable=resumable)
    if in_place:
        return _claim_in_place(Path(path), command, inputs)
    stage = stage or lock_output_dir(path, command, inputs, resume=resume, overwrite=overwrite)
    claim = OutputDir(stage.path, Path(path), command, fingerprint, os.getcwd(), stage, resumable=resumable)
    if stage.record is not None and not (resume and stage.record.get("command") == command):
        stage.record, discard = None, True  # a killed run --overwrite replaces: removed once the claim is checked
    else:
        discard = False
    try:
        target = stage.target
        if stage.record is not None:
            _refuse_other_settings(Path(path), command, stage.record, fingerprint, paths, defaults, as_meant)
        marker = read_marker(target) if target.is_dir() else None
        present = listing(target) if target.is_dir() else []
        if marker is None and present:
            raise _users_files(path, present)
        replaces = bool(stage.record.get("replaces")) if stage.record is not None else False
        if marker is not None and present:
            same = marker.get("command") == command
            if resume and same and stage.record is None:
                _refuse_other_settings(Path(path), command, marker, fingerprint, paths, defaults, as_meant)
                claim.proven = _all_or_nothing(target, marker, resume=True)
                _link_run(target, stage.path, claim.proven)
                replaces = True
            elif overwrite or replaces:
                claim.proven = _all_or_nothing(target, marker)
                replaces = True
            else:
                fixes = "pass --resume to continue it, " if same and resumable else ""
                # a file no manifest names would stop --overwrite (_all_or_nothing): named now, not advised past
                if yours := [rel for rel in present if rel not in recorded_files(target)]:
                    raise BertkitError(
                        f"{path} already holds the output of a `bertkit {marker.get('command')}` run and "
                        f"{len(yours)} file(s) bertkit did not write there (e.g. {', '.join(yours[:3])}), which "
                        f"bertkit never removes; {fixes}move them, or choose another output directory")
                raise BertkitError(
                    f"{path} already holds the output of a `bertkit {marker.get('command')}` run ({len(present)} "
                    f"file(s)); {fixes}pass --overwrite to replace it (only the files bertkit wrote there are "
                    "removed, once the new run is finished), or choose another output directory")
        if discard:
            logger.info("removing %s, a run a kill cut short", stage.path)
            clear_staging(stage.path)
        if stage.record is None:
            atomic_write_json(stage.path / PARTIAL, {"command": command, "fingerprint": fingerprint,
                                                     "cwd": os.getcwd(), "resumable": resumable,
                                                     "replaces": replaces})
    except BaseException:
        stage.abort(keep=stage.record is not None or discard)
        raise
    return claim


def _claim_in_place(directory: Path, command: str, inputs: Mapping[str, Any] | None) -> OutputDir:
    """A run that writes into ``directory`` as it goes: locked (and its staging name, against a staged write of the
    same directory), refused if it holds a user's files or another command's run."""
    refuse_inputs(directory, inputs or {}, is_dir=True)
    dir_lock.refuse_held_near(target_of(directory), directory, inside=True)
    for held in (staging_path(target_of(directory)), directory):
        if dir_lock.writing_here(held):
            raise BertkitError(f"{directory} is the output directory of this process's `bertkit "
                               f"{dir_lock.holder_command(held)}` run already; choose another output directory")
    absolute = directory.absolute()
    made = tuple(itertools.takewhile(lambda d: not os.path.lexists(d), (absolute, *absolute.parents)))
    with writing(directory):
        directory.mkdir(parents=True, exist_ok=True)
    found = frozenset(os.listdir(directory))
    lock_made = LOCK not in found
    try:
        with writing(directory):  # a full disk refuses its line: one line, and the lock file it made goes too
            dir_lock.lock(directory, command)
        if (holder := dir_lock.held_by_another(directory)) is not None:
            raise BertkitError(f"{directory} is in use by {holder}; wait for it to finish or choose another output")
        marker = read_marker(directory)
        present = [rel for rel in listing(directory) if not rel.endswith(TMP_SUFFIX)]
        if marker is None and present:
            raise _users_files(directory, present)
        if marker is not None and marker.get("command") != command:
            raise BertkitError(f"{directory} already holds the output of a `bertkit {marker.get('command')}` run; "
                               "choose another output directory")
    except BaseException:
        if lock_made:  # a refusal leaves nothing of bertkit's in a directory of the user's (removed while held)
            with contextlib.suppress(OSError):
                (directory / LOCK).unlink()
        dir_lock.unlock(directory)
        remove_made(made)
        raise
    return OutputDir(directory, directory, command, {}, os.getcwd(), in_place=True, made=made, found=found)


def remove_made(made: Sequence[Path]) -> None:
    """Remove the directories a claim made (deepest first), as long as each is empty: a refused or unwritten run
    leaves no ``out/`` (nor the ``runs/`` above it that the claim made too)."""
    for directory in made:
        try:
            directory.rmdir()
        except OSError:
            return


def record(path: str | os.PathLike, *, appends: bool = False, data: bytes | None = None) -> None:
    """Record the regular file ``path`` of a run that writes into its directory as it goes in that directory's
    manifest: its content now, or ``data`` it is about to be written with (recorded first, so a kill in between
    leaves no file of the run's unrecorded); with ``appends``, whatever follows is bertkit's too. Inside a staging
    directory there is nothing to record: all of it is bertkit's. A file at ``path`` that no manifest proves
    bertkit's (a user's, saved there since the run began) is refused before ``data`` is written over it."""
    path = Path(path)
    if staging_of(path) is not None or (data is None and not path.is_file()):
        return
    directory = next((d for d in path.parents if dir_lock.holds(d)), None)
    if directory is None:
        return
    marker = read_marker(directory) or {"command": dir_lock.holder_command(directory), "files": {},
                                        "format": MANIFEST_FORMAT}
    size, sha256 = (len(data), hashlib.sha256(data).hexdigest()) if data is not None else (
        path.stat().st_size, sha256_of(path))
    rel = path.relative_to(directory).as_posix()
    entry = {"size": size, "sha256": sha256, **({"appends": True} if appends else {})}
    if data is not None and os.path.lexists(path):
        earlier = marker["files"].get(rel)
        if (st := regular_stat(path)) is not None and proves(earlier, path, st):
            # written after this record: a kill in between leaves the earlier content, which this entry still proves
            entry["replaces"] = {k: v for k, v in earlier.items() if k != "replaces"}
        elif not owns(path):  # (a manifest nearer the file, a checkpoint's, may prove it)
            raise BertkitError(f"{path} exists and bertkit did not write it (or it was changed since); bertkit does "
                               f"not replace it: move it away, or write to another directory than {directory}")
    marker["files"][rel] = entry
    atomic_write_json(directory / MARKER, marker)


@contextlib.contextmanager
def output_dir(path: str | os.PathLike, command: str, fingerprint: dict | None = None, *, overwrite: bool = False,
               resume: bool = False, resumable: bool = True, paths: Collection[str] = (),
               inputs: Mapping[str, Any] | None = None, keep_lock: bool = False, in_place: bool = False,
               stage: Stage | None = None, defaults: Mapping[str, Any] | None = None,
               as_meant: Callable[[dict], dict] | None = None) -> Iterator[OutputDir]:
    """``claim_output_dir`` as a context: the run, written to ``claim.path``, becomes ``path`` when the block ends
    without an error (``OutputDir.release``)."""
    claim = claim_output_dir(path, command, fingerprint, overwrite=overwrite, resume=resume, resumable=resumable,
                             paths=paths, inputs=inputs, stage=stage, in_place=in_place, defaults=defaults,
                             as_meant=as_meant)
    try:
        yield claim
    except BaseException as error:
        if isinstance(error, InputError):  # nothing a resume could continue
            claim.resumable = False
        claim.release(False)
        raise
    claim.release(True, keep_lock)
