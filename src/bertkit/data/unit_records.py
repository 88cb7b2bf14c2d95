"""What lets a ``create-pretraining-data`` run cut short be continued: its plan and a record per finished unit.

The run writes, in its staging directory (``bertkit.runs``), ``units/plan.json`` before any unit (the settings,
each input file's name, size and modification time, the tokenizer, a digest of the work units) and
``units/shard-NNNNN.json`` after each unit's shard files (the shard's entry in the manifest and its counts: the
files' sha256 among them). A resumed run refuses a plan other than its own, and reuses a unit only when its record
is there and every file it names still has the recorded sha256: a shard torn by the kill, or changed since, is made
again. The records go once the manifest, which holds all of them, is written: a finished directory is the very one
an uninterrupted run leaves.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from collections.abc import Sequence
from pathlib import Path

from bertkit.data.shards import shard_name
from bertkit.data.text import WorkUnit
from bertkit.manifests import sha256_of
from bertkit.outputs import atomic_write_text, writing
from bertkit.partial_output import file_identity, file_version, refuse_other_plan

logger = logging.getLogger(__name__)
UNITS = "units"  # in the staging directory only: removed before the run is finished
PLAN = "plan.json"
FORMAT = 1
_RECORD = re.compile(r"shard-\d{5,}\.json")


def run_plan(config: dict, input_files: Sequence[str | os.PathLike], tokenizer: dict,
             units: Sequence[WorkUnit]) -> dict:
    """Everything a run's shards depend on, as JSON values."""
    files = [file_identity(f) for f in input_files]
    layout = [[[p.path, p.input_format, p.start, p.end] for p in u.parts] for u in units]
    digest = hashlib.sha256(json.dumps(layout).encode("utf-8")).hexdigest()
    return {"format": FORMAT, "config": config, "input_files": files, "tokenizer": tokenizer,
            "units": {"count": len(units), "sha256": digest}}


def start(out: Path, plan: dict, units: Sequence[WorkUnit], output_dir: str | os.PathLike, command: str,
          resume: bool) -> dict[int, dict]:
    """Record ``plan`` in the run's directory ``out``; with ``resume``, first refuse an earlier plan other than
    this one, and return the finished units' results (by unit index) whose shard files are proven intact."""
    directory = out / UNITS
    done: dict[int, dict] = {}
    if resume and (directory / PLAN).is_file():
        try:
            earlier = json.loads((directory / PLAN).read_text(encoding="utf-8"))
        except (OSError, ValueError):  # written atomically: unreadable means changed by hand; the units are redone
            earlier = None
            logger.warning("%s cannot be read: every work unit is made again", directory / PLAN)
        if earlier is not None:
            refuse_other_plan(f"in {output_dir}", command, earlier, plan, {  # another run: refused, naming it
                "format": ("was started by another bertkit version", None), "config": ("had other settings", "settings"),
                "input_files": ("", ""), "tokenizer": ("used another tokenizer", "tokenizer (--vocab)"),
                "units": ("", None)}, "start again (only the files bertkit wrote there are removed), or choose another "
                "output directory", {"input_files": _other_files, "units": lambda then, now: (
                    f"cut the corpus into other work units ({(then or {}).get('count')} units then, {now['count']} "
                    "now: another bertkit version)", None)})
            for unit in units:
                if (result := _proven(out, unit)) is not None:
                    done[unit.index] = result
            logger.info("resuming: %d of the %d work units are finished, %d to make", len(done), len(units),
                        len(units) - len(done))
    with writing(directory):  # a full disk: the one line naming it, as for every other write
        directory.mkdir(exist_ok=True)
    atomic_write_text(directory / PLAN, json.dumps(plan, indent=1, sort_keys=True) + "\n")
    return done


def record(output_dir: str | os.PathLike, index: int, result: dict) -> None:
    """Record a finished unit's ``result`` once its shard files are in place (each written atomically)."""
    atomic_write_text(Path(output_dir) / UNITS / f"{shard_name(index)}.json", json.dumps(result, sort_keys=True))


def finish(out: Path) -> None:
    """Remove the plan and the records (bertkit's names only) once the manifest holds them."""
    directory = out / UNITS
    for name in os.listdir(directory):
        if name == PLAN or _RECORD.fullmatch(name):
            (directory / name).unlink()
    directory.rmdir()


def _proven(out: Path, unit: WorkUnit) -> dict | None:
    """The recorded result of ``unit`` if its record is readable, is this unit's, and every shard file it names has
    the recorded sha256; None (the unit is made again) otherwise."""
    path = out / UNITS / f"{shard_name(unit.index)}.json"
    if not path.is_file():
        return None
    why = None
    try:
        result = json.loads(path.read_text(encoding="utf-8"))
        shard = result["shard"]
        if shard["name"] != shard_name(unit.index) or shard["source"] != [[p.path, p.start, p.end] for p in unit.parts]:
            why = "its record names another unit"
        for info in shard["files"].values():
            file = out / info["file"]
            if why is None and (file.is_symlink() or not file.is_file() or sha256_of(file) != info["sha256"]):
                why = f"{info['file']} is missing, or differs from the sha256 recorded when it was written"
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        why = "its record cannot be read"
    if why is not None:
        logger.warning("work unit %d is made again: %s", unit.index, why)
        return None
    return result


def _other_files(then: list[dict] | None, now: list[dict]) -> tuple[str, str]:
    """What a run that read ``then`` (each file's identity) read otherwise than this one's ``now``."""
    if (names := [f.get("path") for f in then or ()]) != [f["path"] for f in now]:
        return f"read other input files ({_few(names)} then, {_few([f['path'] for f in now])} now)", "input files"
    a, b = next((a, b) for a, b in zip(then or (), now) if a != b)
    if a.get("absolute") != b["absolute"]:
        return (f"read input file {b['path']} as {a.get('absolute')} (started in another directory); now it is "
                f"{b['absolute']}", "working directory (relative paths are recorded as given)")
    return (f"read input file {b['path']} as it was then ({file_version(a)}); it changed since ({file_version(b)}), "
            "so the finished shards hold the earlier text", "file")


def _few(names: Sequence[str]) -> str:
    return f"{len(names)} file(s): {', '.join(names[:3])}{', ...' if len(names) > 3 else ''}"

