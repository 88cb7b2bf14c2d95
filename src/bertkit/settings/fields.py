"""Validation helpers and the field groups several commands share, each declared once.

``flag`` is the one field helper: extra flag spellings, a positional argument, a parser of its own.
``coerce_paths`` makes every field typed ``Path`` a Path, read from the type hints. The mixins
(``OverwriteSettings``, ``ProgressSettings``, ``Int8Settings``) carry one field group each, so its help is
written once.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import typing
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


# Settings that change how a run is carried out, not its results: a --resume may change them (e.g. more
# processes, another --ddp-timeout, FSDP instead of DDP: the checkpoint format is the same).
HOW_TO_RUN = ("progress", "overwrite", "resume", "device", "ddp_timeout", "dataloader_num_workers", "fsdp",
              "gradient_checkpointing", "report_to")
# The shared training fields a checkpoint's optimiser state and schedule depend on. The loop checks these (plus what
# its caller adds: the model, data and step counts) and not every field but HOW_TO_RUN as the command line's output
# directory marker does: the loop also runs each (rate, seed) of a GLUE grid in a directory of its own and the
# Python API's Trainer, where output_dir, the logging, evaluation and saving cadence, and the epoch and batch
# settings its caller has already turned into steps differ from run to run or are checked by the caller.
CHECKPOINT_FIELDS = ("learning_rate", "warmup_ratio", "warmup_steps", "weight_decay", "optimizer", "adam_beta1",
                     "adam_beta2", "adam_epsilon", "gradient_accumulation_steps", "max_grad_norm", "bf16", "fp16",
                     "lr_scheduler_type", "seed")


def resume_fingerprint(settings: Any, fields: tuple[str, ...] | None = None) -> dict[str, Any]:
    """What a resumed run must share with the run it continues, as JSON values (paths as typed): ``fields`` of
    ``settings``, by default every field but ``HOW_TO_RUN``. The one fingerprint of both resume checks: the output
    directory's marker (``bertkit.outputs``) and the training checkpoint (``CHECKPOINT_FIELDS``)."""
    if fields is None:
        fields = tuple(f.name for f in dataclasses.fields(settings) if f.name not in HOW_TO_RUN)
    values = {name: str(v) if isinstance(v := getattr(settings, name), Path) else v for name in fields}
    return json.loads(json.dumps(values, default=str))


def flag(default: Any = dataclasses.MISSING, *, aliases: tuple[str, ...] = (), positional: bool = False,
         parse: Any = None, cli: bool = True) -> Any:
    """A settings field with command-line details: extra flag spellings, a positional argument, a parser."""
    meta = {"aliases": aliases, "positional": positional, "parse": parse, "cli": cli}
    if isinstance(default, (list, dict, set)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


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


def _positive(obj: Any, *names: str, allow_none: bool = True, strict: bool = True) -> None:
    for name in names:
        value = getattr(obj, name)
        if value is None and allow_none:
            continue
        if (not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value)
                or (value <= 0 if strict else value < 0)):
            kind = "positive" if strict else "non-negative"
            raise BertkitError(f"{name} must be a finite {kind} number, got {value!r}")


# -------------------------------------------------------------------------------------------------
# Field groups shared by several commands, each declared once (the help comes from these docstrings)
# -------------------------------------------------------------------------------------------------


@dataclass(kw_only=True)
class OverwriteSettings:
    """For commands that write an output directory: whether an earlier run's files there may be replaced."""

    overwrite: bool = False
    """Replace what an earlier bertkit run wrote to the output directory (only files bertkit recorded there)."""


@dataclass(kw_only=True)
class ProgressSettings:
    """For commands that show progress bars."""

    progress: bool = True
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
    Default: 256 built-in English sentences."""

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
