"""Which checkpoint a run resumes from, and whether it may: a path given by name (one holding ``state.pt``), the
newest whole checkpoint of an output directory (one a kill cut short passed over, its removal finished), another
library's checkpoints refused by name, and a checkpoint of another run (its fingerprint: data, model, settings)
refused naming what differs. Writing and reading the checkpoints themselves is ``training/checkpoint.py``'s.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pickle
from pathlib import Path

import torch

from bertkit.errors import BertkitError
from bertkit.manifests import read_marker
from bertkit.outputs import regular_stat
from bertkit.training.checkpoint import (
    FIRST_RECORDED,
    HF_LAYOUT,
    STATE_FILE,
    CheckpointLayout,
    checkpoint_step,
    read_state,
    remove_checkpoint,
)

logger = logging.getLogger("bertkit")


def named_checkpoint(resume: object) -> Path:
    """The Trainer's ``resume_from_checkpoint`` given as a path: one holding ``state.pt``, or refused saying what is
    there instead (transformers: "Can't find a valid checkpoint at ...", for each of these alike)."""
    if not isinstance(resume, (str, os.PathLike)) or resume == "":  # Path("") is ".", the working directory
        raise BertkitError(f"resume_from_checkpoint {resume!r}: give True (the newest checkpoint in output_dir), the "
                           "path of a checkpoint-N directory, or None")
    path = Path(resume)
    if (path / STATE_FILE).is_file():
        return path
    if not os.path.lexists(path):
        what = "does not exist"
    elif not path.is_dir():
        what = "is a file, not a checkpoint directory"
    else:
        what = foreign_checkpoint(path) or "is not a checkpoint bertkit wrote (it has no state.pt)"
    raise BertkitError(f"resume_from_checkpoint {path} {what}; give a checkpoint-N directory of a bertkit Trainer run, "
                       "or True for the newest one in output_dir")


# what transformers' Trainer writes into each checkpoint-N beside the model (sentence-transformers' trainers too)
_FOREIGN_STATE = ("optimizer.pt", "scheduler.pt", "rng_state.pth", "training_args.bin")


def foreign_checkpoint(path: Path) -> str | None:
    """How ``path`` reads when another library's trainer wrote it (trainer_state.json beside its optimizer.pt,
    scheduler.pt, ..., and no state.pt): the writer, and the call that starts a new run from its weights; None for
    any other directory. Its optimizer.pt lists AdamW's moments by the writer's parameter order, and the data
    position and random states are the writer's: bertkit cannot continue that run exactly, so it does not try."""
    if (path / STATE_FILE).is_file() or not (path / "trainer_state.json").is_file():
        return None
    held = [name for name in _FOREIGN_STATE if (path / name).is_file()]
    if not held:
        return None
    kind = None
    with contextlib.suppress(OSError, ValueError, AttributeError):  # unreadable: named as sentence-transformers'
        kind = json.loads((path / "config_sentence_transformers.json").read_text(encoding="utf-8")).get("model_type")
    if kind in ("CrossEncoder", "SparseEncoder"):
        writer, load = f"sentence-transformers' {kind}Trainer", f"{kind}({str(path)!r})"
    elif (path / "modules.json").is_file():
        writer, load = "sentence-transformers' SentenceTransformerTrainer", f"SentenceTransformer({str(path)!r})"
    else:
        writer, load = "transformers' Trainer", f"from_pretrained({str(path)!r}) (a script's model_name_or_path)"
    return (f"has no {STATE_FILE}: it was written by {writer} ({', '.join(held)}), whose optimiser, schedule and data "
            f"position bertkit cannot continue exactly; start a new run from its weights, the model {load}, "
            "in another output_dir")


def refuse_foreign_checkpoints(out_dir: Path, resumed: Path | None) -> None:
    """Refuse a resume from ``resumed`` (None: no checkpoint of bertkit's was found) while ``out_dir`` holds a newer
    checkpoint another library wrote (``foreign_checkpoint``): resume_from_checkpoint=True would otherwise go back to
    an older one of bertkit's without a word, dropping the steps after it, and either resume would write its own
    checkpoint-N over the other library's, leaving that one's optimizer.pt beside bertkit's weights."""
    after = -1 if resumed is None else checkpoint_step(resumed.name, HF_LAYOUT.prefix)
    after = -1 if after is None else after  # a resumed directory of another name: every foreign one counts
    for path in reversed(HF_LAYOUT.dirs(out_dir)):
        if checkpoint_step(path.name, HF_LAYOUT.prefix) > after and (why := foreign_checkpoint(path)):
            newer, back = ("", "") if resumed is None else (
                f", newer than {resumed.name},", f"; to go back to {resumed.name} anyway (dropping the steps after it: "
                f"the resumed run would write over {path.name}), move {path.name} out of {out_dir} first")
            raise BertkitError(f"cannot resume in {out_dir}: {path}{newer} {why}{back}")


def refuse_other_run(path: Path, fingerprint: dict, saved: dict | None = None, written: int = 1) -> None:
    """Refuse to resume from ``path`` when the run that wrote it had another fingerprint (``saved``, of a state.pt
    of format ``written``; or both read from its state.pt memory-mapped: a check before anything is written; damage
    is left to ``checkpoint_to_resume``). A checkpoint of an earlier format without an entry this one records
    (``FIRST_RECORDED``) is refused as such: what it was trained on cannot be compared, and the refusal says so
    instead of calling it another run. Any other entry is recorded only where set (absent: not set then)."""
    if saved is None:
        try:
            state = torch.load(path / STATE_FILE, map_location="cpu", weights_only=True, mmap=True)
            saved, written = state["fingerprint"], state.get("format", 1)
        except (RuntimeError, EOFError, KeyError, OSError, ValueError, pickle.UnpicklingError):
            return
    saved, now = _canonical(saved), _canonical(fingerprint)
    if saved == now:
        return
    differences = _differences(saved, now)
    added = {k for version, keys in FIRST_RECORDED.items() if version > written for k in keys}
    unrecorded = sorted(k for k, (a, _) in differences.items() if a is _ABSENT and k in added)
    if unrecorded and len(unrecorded) == len(differences):
        raise BertkitError(
            f"cannot resume from {path}: its {STATE_FILE} was written by an earlier bertkit, which did not record "
            f"{', '.join(unrecorded)}; this version checks them before continuing a run (a resume where they differ "
            "would go on unnoticed), so it cannot continue this checkpoint: finish the run with the bertkit "
            "version that started it, or start it again (--overwrite, or another --output-dir; the Trainer's "
            "output_dir)")
    shown = {k: (None if a is _ABSENT else a, b) for k, (a, b) in differences.items()}
    raise BertkitError(
        f"cannot resume from {path}: it was written by a run with other settings or data "
        f"(field: (checkpoint, now)) {shown}; resume with the original settings and "
        "data, or start a new output directory (--output-dir; the Trainer's output_dir)"
    )


_ABSENT = object()  # an entry the checkpoint's fingerprint does not have (written by an earlier bertkit)
# Where fingerprints hold a model's config (pre-training's; the Trainer's model), and the names in it of where it came
# from, not of the model: bertkit until 2026-11-28 recorded config.json's _name_or_path there, not its architectures.
_CONFIG_ENTRIES = (("model_config",), ("trainer", "model"))
_CONFIG_PROVENANCE = ("_name_or_path", "architectures", "transformers_version")


def _canonical(fingerprint: dict) -> dict:
    """``fingerprint`` with its model configs in the one form every bertkit version compares: as BertConfig reads
    them, without their provenance (the form config.to_dict() writes changed between versions)."""
    from bertkit.config import BertConfig

    out = dict(fingerprint)
    for *parents, name in _CONFIG_ENTRIES:
        holder = out
        for key in parents:
            if not isinstance(holder.get(key), dict):
                break
            holder[key] = holder = dict(holder[key])
        else:
            if isinstance(holder.get(name), dict):
                try:
                    config = BertConfig.from_dict(holder[name]).to_dict()
                except (BertkitError, TypeError, ValueError):  # not a config this version reads: as recorded
                    continue
                holder[name] = {k: v for k, v in config.items() if k not in _CONFIG_PROVENANCE}
    return out


def _differences(saved: dict, now: dict, prefix: str = "") -> dict[str, tuple]:
    """The fingerprint fields that differ, nested ones by their dotted name: {"trainer.train_data": (saved, now)};
    an entry only ``now`` has is (_ABSENT, now)."""
    out: dict[str, tuple] = {}
    for key in sorted(set(saved) | set(now)):
        a, b = saved.get(key, _ABSENT), now.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out.update(_differences(a, b, f"{prefix}{key}."))
        elif a != b:
            out[f"{prefix}{key}"] = (a, b)
    return out


def removal_cut_short(path: Path) -> bool:
    """Whether the checkpoint directory ``path`` is what a kill left of its removal (rotation, or a fine-tuning run's
    clean-up): a checkpoint is renamed into place whole and removed state.pt first (``checkpoint.remove_checkpoint``),
    so one whose manifest lists a state.pt that is gone, or holding neither manifest nor state, was being removed
    (a model-only one, without state.pt: one missing any file its manifest lists). Not a checkpoint to resume from,
    nor a damaged one. One that still holds its state.pt and lacks another file (an optimizer.pt the user deleted to
    free the disk) is not: a resume passes over it as damaged, and keeps it."""
    try:
        marker = read_marker(path)
    except BertkitError:  # a manifest bertkit cannot read: left to read_state, which names the damage
        return False
    if marker is None or STATE_FILE in marker["files"]:
        return regular_stat(path / STATE_FILE) is None
    return any(regular_stat(path / rel) is None for rel in marker["files"])


def finish_removals(out_dir: Path, layout: CheckpointLayout, resumed: Path) -> None:
    """Remove what a kill left of a checkpoint's removal (a manifest listing files that are gone): a resumed run
    that rotates no more (resumed from its last checkpoint) would otherwise finish with it among its checkpoints.
    A directory without a manifest is not proven bertkit's and stays. Rank 0 only: the other ranks skip such a
    directory when they look for the checkpoint to resume from."""
    for path in [p for p in layout.dirs(out_dir) if p != resumed]:  # (--resume naming one cut short: it is read)
        with contextlib.suppress(BertkitError):  # a manifest bertkit cannot read: read_state names the damage
            if read_marker(path) is not None and removal_cut_short(path):
                logger.info("removing %s, a checkpoint whose removal a kill cut short", path)
                remove_checkpoint(path)


def checkpoint_to_resume(out_dir: Path, fingerprint: dict, layout: CheckpointLayout,
                         resume: bool | Path) -> tuple[Path, dict] | None:
    """The checkpoint a run continues from (the one ``resume`` names, or the newest intact one: a damaged newest
    one falls back to the one before) and its state; None for a fresh run."""
    existing = layout.dirs(out_dir)
    if not resume and existing:
        raise BertkitError(
            f"{out_dir} already holds checkpoints ({existing[-1].name}) of an earlier run; continue it with --resume "
            "(Trainer: train(resume_from_checkpoint=True)), or choose another output directory")
    damaged = []
    for path in [resume] if isinstance(resume, Path) else reversed(existing):  # none when not resuming
        if not isinstance(resume, Path) and removal_cut_short(path):
            logger.warning("%s is a checkpoint whose removal a kill cut short; not resuming from it", path)
            continue
        try:
            state = read_state(path)
        except (RuntimeError, EOFError, KeyError, OSError, ValueError) as e:
            if isinstance(e, BertkitError):
                raise
            damaged.append(f"{path / STATE_FILE} ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})")
            if not isinstance(resume, Path):  # a checkpoint named by its path is that one, or none
                logger.warning("checkpoint %s is damaged (%s); falling back to the one before it", path, damaged[-1])
            continue
        refuse_other_run(path, fingerprint, state["fingerprint"], state.get("format", 1))
        return path, state
    if damaged and isinstance(resume, Path):  # the one named (the Trainer's True names the newest): any before it?
        step = checkpoint_step(resume.name, layout.prefix) or 0
        if earlier := [p for p in existing if checkpoint_step(p.name, layout.prefix) < step]:
            raise BertkitError(f"cannot resume from {resume}: it is damaged, {damaged[0]}; resume from the checkpoint "
                               f"before it by its path ({earlier[-1]}, dropping the steps "
                               "after it), or start a new output directory")
    if damaged:
        raise BertkitError(f"no intact checkpoint to resume from in {layout.root(out_dir)}: {'; '.join(damaged)}")
    return None
