"""The one field helper, the one validation every settings class runs, and the field groups several commands share.

``flag`` declares a field's details (flag spellings, a parser, its ``check``); ``Settings`` checks every field when
an object is built (each Path made a Path, each value of its declared type, then each field's ``check``). The
mixins (``OverwriteSettings``, ``ProgressSettings``, ``Int8Settings``) carry one field group each.
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
from typing import Any, Literal

from bertkit.errors import BertkitError, is_whole


def coerce_paths(settings: Any) -> None:
    """Every field typed ``Path``, ``Path | None`` or ``list[Path]`` made a Path (a str from Python or JSON)."""
    for name, kind in path_fields(type(settings)).items():
        value = getattr(settings, name)
        paths = value if kind == "list" and isinstance(value, (list, tuple)) else [value]
        if value is None or not all(isinstance(v, (str, os.PathLike)) for v in paths):
            continue  # not made a Path: ``check_fields`` names it (a 5 or a list from a --config file)
        value = [Path(v) for v in value] if kind == "list" else Path(value)
        object.__setattr__(settings, name, value)  # frozen settings too


@functools.cache
def type_hints(cls: type) -> dict[str, Any]:
    """A settings class's resolved annotations, once per class: ``typing.get_type_hints`` compiles each string
    annotation again on every call (5 ms for a training settings object, made by every command and Trainer)."""
    return typing.get_type_hints(cls)


@functools.cache
def path_fields(cls: type) -> dict[str, str]:
    hints = type_hints(cls)
    out = {}
    for f in dataclasses.fields(cls):
        hint = hints.get(f.name)
        args = typing.get_args(hint)
        if hint is Path or (args and Path in args and type(None) in args and len(args) == 2):
            out[f.name] = "one"
        elif typing.get_origin(hint) is list and args == (Path,):
            out[f.name] = "list"
    return out


# transformers' lr_scheduler_type names, those that need no lr_scheduler_kwargs (reduce_lr_on_plateau: evaluations):
# the command line's choices (it takes no lr_scheduler_kwargs). TrainingArguments also takes those that need some
# (training.optim.SCHEDULE_OPTIONS declares every schedule and its options).
LR_SCHEDULES = ("linear", "cosine", "cosine_with_restarts", "polynomial", "constant", "constant_with_warmup",
                "inverse_sqrt")
PAPER_GRID = (2e-5, 3e-5, 4e-5, 5e-5)  # the paper's fine-tuning grid (appendix A.3), for BERT-BASE and up
SMALL_MODEL_LR = 1e-4  # the rate Google's BERT miniatures most often selected (Turc et al. 2019)


def resume_fingerprint(settings: Any, fields: tuple[str, ...] | None = None) -> dict[str, Any]:
    """What a resumed run must share with the run it continues, as JSON values: ``fields``, by default every field
    but those declared ``how_to_run`` (a --resume may change how a run is carried out, not its results). The one
    fingerprint of the output directory's marker and of the training checkpoint (``checkpoint_fields``)."""
    if fields is None:  # the marker's, with the entries that date its settings' meaning (TrainingSettings.as_meant)
        return _as_json({**{f.name: getattr(settings, f.name) for f in _fingerprinted(settings)},
                         **getattr(settings, "recorded_marks", {})})
    return _as_json({name: getattr(settings, name) for name in fields})


def fingerprint_defaults(settings: Any) -> dict[str, Any]:
    """Each fingerprinted field's default, as ``resume_fingerprint`` writes values. A run started by an earlier
    bertkit has no entry for a field added since; it ran as that field's default runs (a new flag's default keeps
    the behaviour from before it), so --resume reads the missing entry as the default instead of as another
    setting."""
    return _as_json({f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()
                     for f in _fingerprinted(settings)
                     if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING})


def _fingerprinted(settings: Any) -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(settings) if not f.metadata.get("how_to_run")]


def _as_json(values: dict[str, Any]) -> dict[str, Any]:
    """``values`` as JSON gives them back (paths as text, anything else JSON has no type for as its str)."""
    return json.loads(json.dumps({k: str(v) if isinstance(v, Path) else v for k, v in values.items()}, default=str))


def checkpoint_fields(settings: Any) -> tuple[str, ...]:
    """The training fields a checkpoint's optimiser state and schedule depend on (declared ``checkpoint``): fewer
    than the marker compares, as a GLUE grid's runs and the Trainer's differ in output_dir, cadence and epochs."""
    return tuple(f.name for f in dataclasses.fields(settings) if f.metadata.get("checkpoint"))


def flag(default: Any = dataclasses.MISSING, *, aliases: tuple[str, ...] = (), positional: bool = False,
         parse: Any = None, cli: bool = True, check: Callable[[str, Any], None] | None = None,
         hf: Any = dataclasses.MISSING, trainer: bool = True, checkpoint: bool = False,
         how_to_run: bool = False) -> Any:
    """A settings field with its details, declared once: extra flag spellings, a positional argument, a parser;
    ``cli`` False: not on the command line (nor in --config); ``check(name,
    value)``: its validation, run when the settings are built; for the training knobs, ``hf``: transformers'
    default where it differs (``bertkit.TrainingArguments`` takes it), ``trainer`` False: not a TrainingArguments
    argument, ``checkpoint``: a resumed checkpoint must share it, ``how_to_run``: a resumed run may change it."""
    meta = {"aliases": aliases, "positional": positional, "parse": parse, "cli": cli, "check": check,
            "trainer": trainer, "checkpoint": checkpoint, "how_to_run": how_to_run}
    if hf is not dataclasses.MISSING:
        meta["hf"] = hf
    return field(default=default, metadata=meta)


def on_command_line(f: dataclasses.Field) -> bool:
    """Whether the settings field ``f`` is a flag of its command (a field ``redefault`` hid is not)."""
    return f.init and f.metadata.get("cli", True)


def redefault(cls: type | None = None, /, *, hidden: tuple[str, ...] = (), **values: Any) -> Any:
    """A settings dataclass whose inherited fields ``values`` get other defaults (a task's, transformers') and whose
    inherited fields ``hidden`` are no constructor arguments (they keep their defaults): each field stays declared
    once, with its type, help and checks, in the class that introduced it."""

    def wrap(cls: type) -> type:
        bases = [b for b in cls.__mro__[1:] if dataclasses.is_dataclass(b)]
        inherited = {f.name: f for f in dataclasses.fields(bases[0])}
        hints = type_hints(bases[0])
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
    """Each field holds a value of its declared type (``seed=2.5`` is named here, not met deep in the loop), then
    passes its own ``check``."""
    hints = type_hints(type(settings))
    for f in dataclasses.fields(settings):
        value = getattr(settings, f.name)
        if isinstance(value, enum.Enum):  # transformers' IntervalStrategy, SchedulerType, ...
            value = value.value
            object.__setattr__(settings, f.name, value)
        if isinstance(value, list) and typing.get_origin(_not_none(hints[f.name])) is tuple:
            value = tuple(value)  # a list from Python: a tuple, as the flags and --config give it, checked item by item
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
        return is_whole(value, -math.inf)
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
    if isinstance(kind, type):  # a class (pretrain's config_name takes a BertConfig)
        return isinstance(value, kind)
    raise AssertionError(f"no check for the annotation {kind!r}")


def _describe(kind: Any) -> str:
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        return " or ".join(_describe(k) for k in typing.get_args(kind))
    if typing.get_origin(kind) is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(kind))
    return {type(None): "None", bool: "a bool", int: "an int", float: "a number", str: "a str",
            Path: "a path"}.get(kind, kind.__name__ if isinstance(kind, type) else str(kind).replace("pathlib.", ""))


# -- the checks fields name (``flag(check=...)``): each refuses with the field's name, the value and the range ------


def in_range(ok: Callable[[Any], bool], what: str) -> Callable[[str, Any], None]:
    """A field's check: None passes (not given), any other value must satisfy ``ok``, or the field is ``what``."""

    def check(name: str, value: Any) -> None:
        if value is not None and not ok(value):
            raise BertkitError(f"{name} must be {what}, got {value!r}")

    return check


positive = in_range(lambda v: math.isfinite(v) and v > 0, "a finite positive number")
non_negative = in_range(lambda v: math.isfinite(v) and v >= 0, "a finite non-negative number")
at_least_one = in_range(lambda v: v >= 1, "at least 1")
share = in_range(lambda v: 0 <= v < 1, "in [0, 1)")
strict_share = in_range(lambda v: 0 < v < 1, "in (0, 1)")
# a cadence in steps: a whole count, or below 1 a share of the run (transformers refuses 2.5 too: read as 2 it would
# log, evaluate or save on another cadence than asked)
step_count = in_range(lambda v: math.isfinite(v) and v > 0 and (v < 1 or float(v).is_integer()),
                      "a whole number of steps, or below 1 a share of the run's steps")
in_seed_range = in_range(lambda v: 0 <= v < 2**32, "in [0, 2**32)")  # numpy's and transformers' set_seed range


def between(low: float, high: float) -> Callable[[str, Any], None]:
    return in_range(lambda v: low <= v <= high, f"in [{low}, {high}]")


def nonempty(name: str, value: Any) -> None:
    if not value:
        raise BertkitError(f"{name}: give at least one")


def tokenizer_path(name: str, value: Any) -> None:
    """A tokenizer's directory, or its vocab.txt (google-research/bert's --vocab_file): the commands read the directory
    of a file, so any other file would be the vocab.txt beside it, another vocabulary."""
    if value is not None and Path(value).is_file() and Path(value).name != "vocab.txt":
        raise BertkitError(f"--{name.replace('_', '-')} {value} is a file other than vocab.txt: pass the tokenizer's "
                           "directory (vocab.txt and tokenizer_config.json), or put this file in a directory of its "
                           "own as vocab.txt, beside a tokenizer_config.json")


def default_lr(hidden_size: int, paper_lr: float) -> float:
    """The paper's rate for BERT-BASE-sized models and up; 1e-4 for narrower ones (Turc et al. 2019)."""
    return paper_lr if hidden_size >= 768 else SMALL_MODEL_LR


def parse_lr_grid(text: str) -> tuple[float, ...]:
    """``2e-5`` (one run), ``2e-5,3e-5`` (a grid), or ``paper`` (the paper's grid)."""
    if text.strip().lower() == "paper":
        return PAPER_GRID
    try:
        return tuple(float(x) for x in text.split(","))  # an empty item ("2e-5,,3e-5") is float's ValueError
    except ValueError:
        raise BertkitError(f"{text!r}: give a number, a comma list of numbers, or 'paper' {PAPER_GRID}") from None


def parse_one_lr(text: str) -> float:
    """One learning rate: commands other than ``finetune glue`` train once, so a list is refused here."""
    if "," in text or text.strip().lower() == "paper":
        raise BertkitError(f"{text!r}: this command trains once, so give one learning rate (e.g. 1e-4); "
                           "a grid of rates runs only in `bertkit finetune glue`")
    try:
        return float(text)
    except ValueError:
        raise BertkitError(f"{text!r} is not a number (e.g. 1e-4)") from None


@dataclass(kw_only=True)
class Settings:
    """A command's settings: plain data, checked once when built (every Path field made a Path, every value of its
    declared type, then each field's ``check``). A subclass with checks across fields adds them in its
    ``__post_init__`` after ``super().__post_init__()``."""

    def __post_init__(self) -> None:
        coerce_paths(self)
        check_fields(self)


# -------------------------------------------------------------------------------------------------
# Field groups shared by several commands, each declared once (the help comes from these docstrings)
# -------------------------------------------------------------------------------------------------


@dataclass(kw_only=True)
class OverwriteSettings(Settings):
    """For commands that write an output: whether an earlier run's output may be replaced."""

    overwrite: bool = flag(False, trainer=False, how_to_run=True)
    """Replace what an earlier run wrote: an output file, or in an output directory only the files bertkit recorded
    there."""


@dataclass(kw_only=True)
class ProgressSettings(Settings):
    """For commands that show progress bars."""

    progress: bool = flag(True, trainer=False, how_to_run=True)
    """Show progress bars."""


@dataclass(kw_only=True)
class Int8Settings(Settings):
    """For commands that apply a model: where, int8 inference on the CPU, and bf16."""

    device: str = "cpu"
    """cpu, cuda, cuda:N or auto (CUDA when present, else cpu; the CPU with --int8); under torchrun a bare cuda (or
    auto) is each process's own GPU."""
    int8: bool | None = None
    """Run the encoder's projections in int8 on the CPU (docs/inference.md, section int8): outputs close to fp32's,
    not equal. Default: int8 for a `bertkit quantize` directory (which runs in nothing else), fp32 otherwise."""
    bf16: bool | None = None
    """bfloat16 autocast (CPUs with AVX-512 BF16 or AMX, recent GPUs). Default: off, with int8 too (what int8 leaves
    float runs in fp32)."""
    calibration_file: Path | None = None
    """With --int8: a text file, one sentence per line (a few hundred, like the inputs), to calibrate int8 on.
    Default: 64 built-in English sentences."""

    def __post_init__(self) -> None:
        """Refuse --calibration-file without --int8 (whether int8 can run here is ``resolve_device``'s to say)."""
        super().__post_init__()
        if self.calibration_file is not None and not self.int8:
            raise BertkitError(f"--calibration-file {self.calibration_file} calibrates int8 inference: add --int8 (with a "
                               "float checkpoint; a `bertkit quantize` directory was calibrated when it was written)")


@dataclass(kw_only=True)
class SquadWindowSettings(Settings):
    """For the SQuAD commands (finetune and predict): the version, how contexts are cut into windows of
    ``max_seq_length`` tokens (384 here, the question included) and how answers are read off."""

    version: Literal["1.1", "2.0"] = "1.1"
    """2.0: questions may have no answer (the no-answer threshold: chosen on --predict-file by finetune,
    --null-threshold in predict)."""
    doc_stride: int = flag(128, check=at_least_one)
    """Tokens between the starts of consecutive context windows."""
    max_query_length: int = flag(64, check=at_least_one)
    """Questions are cut to this many tokens."""
    n_best_size: int = flag(20, check=at_least_one)
    """Candidate starts and ends considered per window."""
    max_answer_length: int = flag(30, check=at_least_one)
    """Longest answer, in tokens."""

    def __post_init__(self) -> None:
        """Refuse windows with no room for context before any model or data is read (every command that takes
        these settings has ``max_seq_length``)."""
        super().__post_init__()
        length = self.max_seq_length  # type: ignore[attr-defined]  # declared by each command beside this group
        if length is not None and length <= self.max_query_length + 3:  # None: predict's, checked once it is known
            raise BertkitError(f"--max-seq-length {length} must exceed --max-query-length {self.max_query_length} + 3 "
                               "([CLS] and two [SEP]) to leave room for context: lower --max-query-length or raise "
                               "--max-seq-length")
