"""Validation helpers and the field groups several commands share, each declared once.

``flag`` is the one field helper: extra flag spellings, a positional argument, a parser of its own.
``coerce_paths`` makes every field typed ``Path`` a Path, read from the type hints. The mixins
(``OverwriteSettings``, ``ProgressSettings``, ``Int8Settings``) carry one field group each, so its help is
written once.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import json
import math
import numbers
import os
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bertkit.errors import BertkitError


def coerce_paths(settings: Any) -> None:
    """Every field typed ``Path``, ``Path | None`` or ``list[Path]`` made a Path, whatever the caller passed (a str
    from Python or from --config JSON): one place, read from the type hints, instead of a line per field."""
    for name, kind in _path_fields(type(settings)).items():
        value = getattr(settings, name)
        if value is None:
            continue
        value = [Path(v) for v in value] if kind == "list" else Path(value)
        object.__setattr__(settings, name, value)  # frozen settings too


@functools.cache
def _path_fields(cls: type) -> dict[str, str]:
    hints = typing.get_type_hints(cls)
    out = {}
    for f in dataclasses.fields(cls):
        hint = hints.get(f.name)
        args = typing.get_args(hint)
        if hint is Path or (args and Path in args and type(None) in args and len(args) == 2):
            out[f.name] = "one"
        elif typing.get_origin(hint) is list and args == (Path,):
            out[f.name] = "list"
    return out


OPTIMIZERS = ("adamw", "lamb")
LR_SCHEDULES = ("linear", "cosine", "constant_with_warmup")  # transformers' lr_scheduler_type names
PAPER_GRID = (2e-5, 3e-5, 4e-5, 5e-5)  # the paper's fine-tuning grid (appendix A.3), for BERT-BASE and up
MINIATURE_GRID = (3e-5, 5e-5, 1e-4, 3e-4)  # the grid Google tuned its BERT miniatures over (Turc et al. 2019)
SMALL_MODEL_LR = 1e-4  # the rate the miniatures most often selected


def resume_fingerprint(settings: Any, fields: tuple[str, ...] | None = None) -> dict[str, Any]:
    """What a resumed run must share with the run it continues, as JSON values (paths as typed): ``fields`` of
    ``settings``, by default every field but those declared ``how_to_run`` (they change how a run is carried out,
    not its results: a --resume may change them, e.g. more processes, another --ddp-timeout, FSDP instead of DDP).
    The one fingerprint of both resume checks: the output directory's marker (``bertkit.outputs``) and the training
    checkpoint (the fields declared ``checkpoint``, ``checkpoint_fields``)."""
    if fields is None:
        fields = tuple(f.name for f in dataclasses.fields(settings) if not f.metadata.get("how_to_run"))
    values = {name: str(v) if isinstance(v := getattr(settings, name), Path) else v for name in fields}
    return json.loads(json.dumps(values, default=str))


def checkpoint_fields(settings: Any) -> tuple[str, ...]:
    """The training fields a checkpoint's optimiser state and schedule depend on (declared ``checkpoint``): what the
    loop checks on resume, beside what its caller adds (the model, data and step counts). Fewer than the output
    directory's marker compares: the loop also runs each (rate, seed) of a GLUE grid in a directory of its own, and
    the Trainer, whose output_dir, cadence and epochs differ from run to run or are checked by the caller."""
    return tuple(f.name for f in dataclasses.fields(settings) if f.metadata.get("checkpoint"))


def flag(default: Any = dataclasses.MISSING, *, aliases: tuple[str, ...] = (), positional: bool = False,
         parse: Any = None, cli: bool | tuple[str, ...] = True, check: Callable[[str, Any], None] | None = None,
         hf: Any = dataclasses.MISSING, trainer: bool = True, checkpoint: bool = False,
         how_to_run: bool = False) -> Any:
    """A settings field with its details, declared once: extra flag spellings, a positional argument, a parser;
    ``cli``: on the command line (or only for the commands whose settings' ``kind`` is listed); ``check(name,
    value)``: its validation, run when the settings are built; for the training knobs, ``hf``: transformers'
    default where it differs (``bertkit.TrainingArguments`` takes it), ``trainer`` False: not a TrainingArguments
    argument, ``checkpoint``: a resumed checkpoint must share it, ``how_to_run``: a resumed run may change it."""
    meta = {"aliases": aliases, "positional": positional, "parse": parse, "cli": cli, "check": check,
            "trainer": trainer, "checkpoint": checkpoint, "how_to_run": how_to_run}
    if hf is not dataclasses.MISSING:
        meta["hf"] = hf
    if isinstance(default, (list, dict, set)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


def on_command_line(cls: type, f: dataclasses.Field) -> bool:
    """Whether the field ``f`` of the settings class ``cls`` is a flag of its command."""
    cli = f.metadata.get("cli", True)
    return cli if isinstance(cli, bool) else getattr(cls, "kind", None) in cli


def redefault(cls: type | None = None, /, *, hidden: tuple[str, ...] = (), **values: Any) -> Any:
    """A settings dataclass whose inherited fields ``values`` get other defaults (a task's, transformers') and whose
    inherited fields ``hidden`` are no constructor arguments (they keep their defaults): each field stays declared
    once, with its type, help and checks, in the class that introduced it."""

    def wrap(cls: type) -> type:
        bases = [b for b in cls.__mro__[1:] if dataclasses.is_dataclass(b)]
        inherited = {f.name: f for f in dataclasses.fields(bases[0])}
        hints = typing.get_type_hints(bases[0])
        own = cls.__dict__.get("__annotations__", {})
        annotations = dict(own)
        for name in (*values, *hidden):
            f = inherited[name]
            annotations[name] = _annotation(hints[name], values[name]) if name in values else hints[name]
            default = values[name] if name in values else (
                f.default if f.default is not dataclasses.MISSING else f.default_factory())
            setattr(cls, name, field(default=default, init=name not in hidden, metadata=f.metadata))
        cls.__annotations__ = {**{k: v for k, v in annotations.items() if k not in own}, **own}
        return dataclass(kw_only=True)(cls)

    return wrap if cls is None else wrap(cls)


def _annotation(hint: Any, default: Any) -> Any:
    """``hint`` with None allowed exactly when the new ``default`` is None (transformers' None defaults)."""
    if default is None:
        return hint | None if type(None) not in typing.get_args(hint) else hint
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in typing.get_args(hint):
        rest = [a for a in typing.get_args(hint) if a is not type(None)]
        return functools.reduce(lambda a, b: a | b, rest[1:], rest[0])
    return hint


def check_fields(settings: Any) -> None:
    """Each field holds a value of its declared type (``learning_rate="1e-4"`` or ``seed=2.5`` named here, not met
    later deep in the optimiser), then passes its own ``check``: the first value refused is the one named."""
    hints = typing.get_type_hints(type(settings))
    for f in dataclasses.fields(settings):
        value = getattr(settings, f.name)
        if isinstance(value, enum.Enum):  # transformers' IntervalStrategy, SchedulerType, ...
            value = value.value
            object.__setattr__(settings, f.name, value)
        if not _accepts(hints[f.name], value):
            choices = typing.get_args(_not_none(hints[f.name]))
            if typing.get_origin(_not_none(hints[f.name])) is typing.Literal and isinstance(value, str):
                raise BertkitError(f"{f.name} {value!r} is not one of {choices}")
            raise BertkitError(f"{f.name} must be {_describe(hints[f.name])}, got {value!r} ({type(value).__name__})")
    for f in dataclasses.fields(settings):
        value = getattr(settings, f.name)
        for item in value if isinstance(value, tuple) else (value,):  # a grid: each of its values
            if f.metadata.get("check") is not None:
                f.metadata["check"](f.name, item)


def _not_none(hint: Any) -> Any:
    """``X | None`` -> ``X``."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return next(a for a in typing.get_args(hint) if a is not type(None))
    return hint


def _accepts(kind: Any, value: Any) -> bool:
    """Whether ``value`` fits the annotation ``kind``."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if kind is Any:
        return True
    if kind is type(None):
        return value is None
    if kind is bool:
        return isinstance(value, bool)
    if kind is int:
        return isinstance(value, numbers.Integral) and not isinstance(value, bool)
    if kind is float:  # an int is a float here, as in Python's own typing; a bool is not a number
        return isinstance(value, numbers.Real) and not isinstance(value, bool)
    if kind is str:
        return isinstance(value, str)
    if kind is Path:
        return isinstance(value, (str, os.PathLike))
    if origin is typing.Literal:
        return value in args and not isinstance(value, bool)
    if origin in (typing.Union, types.UnionType):
        return any(_accepts(k, value) for k in args)
    if origin in (list, tuple):
        return isinstance(value, (list, tuple)) and all(_accepts(args[0], v) for v in value)
    if origin is dict:
        return isinstance(value, dict)
    raise AssertionError(f"no check for the annotation {kind!r}")


def _describe(kind: Any) -> str:
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        return " or ".join(_describe(k) for k in typing.get_args(kind))
    if typing.get_origin(kind) is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(kind))
    return {type(None): "None", bool: "a bool", int: "an int", float: "a number", str: "a str",
            Path: "a path"}.get(kind, str(kind).replace("pathlib.", ""))


# -- the checks fields name (``flag(check=...)``): each refuses with the field's name, the value and the range ------


def positive(name: str, value: Any) -> None:
    if value is not None and not (math.isfinite(value) and value > 0):
        raise BertkitError(f"{name} must be a finite positive number, got {value!r}")


def non_negative(name: str, value: Any) -> None:
    if value is not None and not (math.isfinite(value) and value >= 0):
        raise BertkitError(f"{name} must be a finite non-negative number, got {value!r}")


def zero_or_more(name: str, value: Any) -> None:
    if value is not None and not value >= 0:
        raise BertkitError(f"{name} must be >= 0, got {value!r}")


def at_least_one(name: str, value: Any) -> None:
    if value is not None and value < 1:
        raise BertkitError(f"{name} must be at least 1, got {value}")


def share(name: str, value: Any) -> None:
    if value is not None and not 0 <= value < 1:
        raise BertkitError(f"{name} must be in [0, 1), got {value!r}")


def step_interval(name: str, value: Any) -> None:
    if value is not None and not (math.isfinite(value) and value > 0):
        raise BertkitError(f"{name} must be > 0 (a step count, or below 1 a share of all steps), got {value!r}")


def in_seed_range(name: str, value: Any) -> None:
    if value is not None and not 0 <= value < 2**32:  # numpy's and transformers' set_seed range
        raise BertkitError(f"{name} must be in [0, 2**32), got {value!r}")


def default_lr(hidden_size: int, paper_lr: float) -> float:
    """The paper's rate for BERT-BASE-sized models and up; 1e-4 for narrower ones (Turc et al. 2019)."""
    return paper_lr if hidden_size >= 768 else SMALL_MODEL_LR


def parse_lr_grid(text: str) -> tuple[float, ...]:
    """``2e-5`` (one run), ``2e-5,3e-5`` (a grid), or ``paper`` / ``miniature`` (the published grids)."""
    named = {"paper": PAPER_GRID, "miniature": MINIATURE_GRID}
    if text.strip().lower() in named:
        return named[text.strip().lower()]
    try:
        return tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise BertkitError(f"{text!r}: give a number, a comma list of numbers, 'paper' "
                           f"{PAPER_GRID} or 'miniature' {MINIATURE_GRID}") from None


def parse_one_lr(text: str) -> float:
    """One learning rate: commands other than ``finetune glue`` train once, so a list is refused here."""
    if "," in text or text.strip().lower() in ("paper", "miniature"):
        raise BertkitError(f"{text!r}: this command trains once, so give one learning rate (e.g. 1e-4); "
                           "a grid of rates runs only in `bertkit finetune glue`")
    try:
        return float(text)
    except ValueError:
        raise BertkitError(f"{text!r} is not a number (e.g. 1e-4)") from None


def _at_least_one(obj: Any, *names: str) -> None:
    for name in names:
        value = getattr(obj, name)
        if value is not None and value < 1:
            raise BertkitError(f"{name} must be at least 1, got {value}")


# -------------------------------------------------------------------------------------------------
# Field groups shared by several commands, each declared once (the help comes from these docstrings)
# -------------------------------------------------------------------------------------------------


@dataclass(kw_only=True)
class OverwriteSettings:
    """For commands that write an output directory: whether an earlier run's files there may be replaced."""

    overwrite: bool = flag(False, trainer=False, how_to_run=True)
    """Replace what an earlier bertkit run wrote to the output directory (only files bertkit recorded there)."""


@dataclass(kw_only=True)
class ProgressSettings:
    """For commands that show progress bars."""

    progress: bool = flag(True, trainer=False, how_to_run=True)
    """Show progress bars."""


@dataclass(kw_only=True)
class Int8Settings:
    """For commands that apply a model: int8 inference on the CPU (docs/inference.md, section int8), and bf16, whose
    default depends on it."""

    int8: bool | None = None
    """Run the encoder's projections in int8 on the CPU (SmoothQuant-smoothed dynamic int8, docs/inference.md
    section int8): outputs close to fp32's, not equal; not on a GPU. On CPUs with AVX512-BF16 or AMX what stays float
    runs in bf16, as OpenVINO's int8 does (faster, as close to fp32); --no-bf16 runs it in fp32. Default: int8 for a
    `bertkit quantize` directory (which runs in nothing else: --no-int8 is refused there), fp32 otherwise."""
    bf16: bool | None = None
    """bfloat16 autocast (CPUs with AVX-512 BF16 or AMX, recent GPUs); --no-bf16 keeps fp32. Default: on for int8
    (--int8, or an int8 directory) on CPUs with bf16 instructions (what int8 leaves float runs in bf16, as OpenVINO's
    int8 does), off otherwise."""
    calibration_file: Path | None = None
    """With --int8: a text file, one sentence per line (a few hundred, like the inputs), to calibrate int8 on.
    Default: 64 built-in English sentences."""

    def check_int8(self) -> None:
        """Refuse --calibration-file without --int8. Whether int8 can run on the device (the CPU, an x86 quantized
        engine, bf16 instructions with an explicit --bf16) is ``bertkit._hardware.resolve_device``'s to say, when the command
        runs."""
        if self.calibration_file is not None and not self.int8:
            raise BertkitError(f"--calibration-file {self.calibration_file} calibrates int8 inference: add --int8 (with a "
                               "float checkpoint; a `bertkit quantize` directory was calibrated when it was written)")


@dataclass(kw_only=True)
class SquadWindowSettings:
    """For the SQuAD commands (finetune and predict): how contexts are cut into windows and answers read off.
    (Each command sets its own ``max_seq_length``, the window length, over its base class's default.)"""

    doc_stride: int = 128
    """Tokens between the starts of consecutive context windows."""
    max_query_length: int = 64
    """Questions are cut to this many tokens."""
    n_best_size: int = 20
    """Candidate starts and ends considered per window."""
    max_answer_length: int = 30
    """Longest answer, in tokens."""

    def check_windows(self) -> None:
        _at_least_one(self, "doc_stride", "max_query_length", "n_best_size", "max_answer_length")
