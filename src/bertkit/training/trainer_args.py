"""``TrainingArguments``: transformers' Trainer settings that bertkit's Trainer implements, checked on creation.

Field names, meanings and defaults are transformers' (v5), so ``TrainingArguments(output_dir=..., ...)`` written
for transformers runs as it is. Any other transformers field is refused with its name and what to use
instead (``REFUSED``), unless it is given at transformers' own default (then it changes nothing); a name
neither library knows is refused with the nearest known names. Nothing is silently ignored.

bertkit adds two choices transformers lacks: ``warmup_ratio`` (transformers 4's name; v5 reads
``warmup_steps`` < 1 as a ratio, which works here too) and ``train_sampling_strategy="group_by_length"``,
bertkit's length-grouped order (batches of similar length, shuffled; less padding, so faster), not
transformers' ``LengthGroupedSampler``.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import math
import numbers
import os
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bertkit.errors import BertkitError

STRATEGIES = ("no", "steps", "epoch")
SAMPLING = ("random", "sequential", "group_by_length")
OPTIMIZERS = ("adamw_torch", "adamw_torch_fused")  # both are torch.optim.AdamW (fused where it runs)

_DIST = "bertkit runs data-parallel under torchrun on its own (docs/distributed.md); drop this argument"
_HUB = "save with trainer.save_model(DIR) and upload DIR with huggingface_hub"
_LOG = "bertkit logs to OUTPUT_DIR/metrics.jsonl and trainer.state.log_history; drop this argument"
_EVAL = "predictions are gathered on the CPU batch by batch; drop this argument"
_NO = "not implemented in bertkit's Trainer; drop this argument"

# Every transformers TrainingArguments field bertkit does not implement: (transformers' default, what to do
# instead). tests/test_trainer.py checks this table against the installed transformers' dataclass.
_FACTORY = object()  # a default transformers builds per instance (a list or dict): any value given is refused
REFUSED: dict[str, tuple[Any, str]] = {
    "lr_scheduler_kwargs": (None, "bertkit's schedules take no extra arguments; use lr_scheduler_type"),
    "optim_args": (None, "bertkit's AdamW takes adam_beta1, adam_beta2, adam_epsilon and weight_decay"),
    "optim_target_modules": (None, _NO),
    "average_tokens_across_devices": (True, "bertkit always divides token losses by the step's global target count"),
    "label_smoothing_factor": (0.0, "subclass the model's loss instead; " + _NO),
    "bf16_full_eval": (False, "evaluation runs under the same bf16 autocast as training when bf16=True"),
    "fp16_full_eval": (False, "evaluation runs in fp32 (under bf16 autocast when bf16=True); drop this argument"),
    "tf32": (None, "set torch.backends.cuda.matmul.allow_tf32 yourself"),
    "activation_checkpointing": (None, "use gradient_checkpointing=True"),
    "activation_checkpointing_kwargs": (None, "use gradient_checkpointing=True"),
    "gradient_checkpointing_kwargs": (None, "use gradient_checkpointing=True (per encoder layer, no options)"),
    "torch_compile_backend": (None, "torch_compile=True compiles each encoder layer with the default backend"),
    "torch_compile_mode": (None, "torch_compile=True compiles each encoder layer with the default mode"),
    "use_liger_kernel": (False, _NO),
    "liger_kernel_config": (None, _NO),
    "use_cache": (False, "BERT has no generation cache; drop this argument"),
    "neftune_noise_alpha": (None, _NO),
    "torch_empty_cache_steps": (None, _NO),
    "auto_find_batch_size": (False, "choose per_device_train_batch_size yourself; " + _NO),
    "logging_first_step": (False, "use logging_steps=1 to log every step"),
    "log_on_each_node": (True, "only rank 0 logs in bertkit; drop this argument"),
    "logging_nan_inf_filter": (True, "bertkit stops on a non-finite loss, naming the step (skip_nonfinite in "
                                     "bertkit's own settings); drop this argument"),
    "include_num_input_tokens_seen": ("no", "bertkit logs tokens_per_s in metrics.jsonl; drop this argument"),
    "log_level": ("passive", "set logging.getLogger('bertkit') yourself"),
    "log_level_replica": ("warning", _DIST),
    "project": ("huggingface", _LOG),
    "trackio_space_id": (None, _LOG),
    "trackio_bucket_id": (None, _LOG),
    "trackio_static_space_id": (None, _LOG),
    "eval_delay": (0, "choose eval_steps so the first evaluation comes when you want it"),
    "prediction_loss_only": (False, "use evaluate() and read eval_loss"),
    "eval_on_start": (False, "call trainer.evaluate() before trainer.train()"),
    "eval_do_concat_batches": (True, _EVAL),
    "eval_use_gather_object": (False, _EVAL),
    "eval_accumulation_steps": (None, _EVAL),
    "include_for_metrics": (_FACTORY, "EvalPrediction carries predictions and label_ids; " + _NO),
    "batch_eval_metrics": (False, "compute_metrics is called once on the whole evaluation set; " + _NO),
    "save_only_model": (False, "checkpoints hold the model files and bertkit's state.pt (optimizer, RNG, position) "
                               "together; use trainer.save_model() for the model alone"),
    "save_on_each_node": (False, _DIST),
    "enable_jit_checkpoint": (False, _NO),
    "push_to_hub": (False, _HUB),
    "hub_token": (None, _HUB),
    "hub_private_repo": (None, _HUB),
    "hub_model_id": (None, _HUB),
    "hub_strategy": ("every_save", _HUB),
    "hub_always_push": (False, _HUB),
    "hub_revision": (None, _HUB),
    "ignore_data_skip": (False, "bertkit resumes at the exact batch, without replaying the data; drop this argument"),
    "restore_callback_states_from_checkpoint": (False, _NO),
    "full_determinism": (False, "bertkit's data order and RNG states are seeded and checkpointed already; "
                                "drop this argument"),
    "accelerator_config": (None, "bertkit does not use accelerate; drop this argument"),
    "parallelism_config": (None, _DIST),
    "dataloader_drop_last": (False, _NO),
    "dataloader_pin_memory": (True, "bertkit pins memory whenever it trains on CUDA; drop this argument"),
    "dataloader_persistent_workers": (False, _NO),
    "dataloader_prefetch_factor": (None, "bertkit prefetches 4 batches per worker; drop this argument"),
    "dataloader_multiprocessing_context": (None, _NO),
    "dataloader_in_order": (True, "bertkit's batches always arrive in order; drop this argument"),
    "length_column_name": ("length", "train_sampling_strategy='group_by_length' reads the lengths of input_ids"),
    "ddp_find_unused_parameters": (None, _DIST),
    "ddp_bucket_cap_mb": (None, _DIST),
    "ddp_broadcast_buffers": (None, _DIST),
    "ddp_static_graph": (None, _DIST),
    "ddp_backend": (None, _DIST),
    "fsdp": (None, "bertkit's own commands shard with --fsdp under torchrun; the Trainer replicates (DDP)"),
    "fsdp_config": (None, "bertkit's own commands shard with --fsdp under torchrun; the Trainer replicates (DDP)"),
    "deepspeed": (None, "bertkit does not use DeepSpeed; " + _DIST),
    "debug": ("", _NO),
    "skip_memory_metrics": (True, _NO),
    "resume_from_checkpoint": (None, "pass it to trainer.train(resume_from_checkpoint=...), as transformers "
                                     "does (the argument is only read by example scripts)"),
    "local_rank": (-1, "torchrun sets LOCAL_RANK; drop this argument"),
}


@dataclass(kw_only=True)
class TrainingArguments:
    """What to train with: transformers' ``TrainingArguments`` fields that bertkit implements, with its defaults.

    >>> args = TrainingArguments(output_dir="out", learning_rate=2e-5, num_train_epochs=2, eval_strategy="epoch")
    """

    output_dir: str | Path | None = None
    """Checkpoints (checkpoint-N), metrics.jsonl and save_model()'s default. Default: trainer_output."""
    per_device_train_batch_size: int = 8
    per_device_eval_batch_size: int = 8
    num_train_epochs: float = 3.0
    max_steps: int = -1
    """Optimiser steps in all; overrides num_train_epochs when > 0."""
    gradient_accumulation_steps: int = 1
    learning_rate: float = 5e-5
    weight_decay: float = 0.0
    """AdamW's decoupled decay, not on biases and LayerNorm weights (as transformers' Trainer)."""
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_epsilon: float = 1e-8
    optim: str = "adamw_torch_fused"
    warmup_steps: float = 0
    """Warm-up steps; a value below 1 is a share of all steps (transformers 5)."""
    warmup_ratio: float | None = None
    """Share of all steps spent warming up (transformers 4's name); not with warmup_steps."""
    lr_scheduler_type: str = "linear"
    max_grad_norm: float = 1.0
    eval_strategy: str = "no"
    eval_steps: float | None = None
    save_strategy: str = "steps"
    save_steps: float = 500
    save_total_limit: int | None = None
    logging_strategy: str = "steps"
    logging_steps: float = 500
    load_best_model_at_end: bool = False
    metric_for_best_model: str | None = None
    greater_is_better: bool | None = None
    seed: int = 42
    data_seed: int | None = None
    bf16: bool = False
    fp16: bool = False
    report_to: str | list[str] | None = "none"
    run_name: str | None = None
    dataloader_num_workers: int = 0
    remove_unused_columns: bool = True
    label_names: list[str] | None = None
    use_cpu: bool = False
    disable_tqdm: bool | None = None
    gradient_checkpointing: bool | None = None
    torch_compile: bool = False
    train_sampling_strategy: str = "random"
    """random: transformers' order (a RandomSampler seeded from data_seed or seed); sequential: the dataset's
    order; group_by_length: bertkit's length-grouped order (less padding, faster; a different order)."""
    ddp_timeout: int = 1800
    do_train: bool = False
    """Read by example scripts, not by the Trainer (as in transformers)."""
    do_eval: bool = False
    do_predict: bool = False

    def __post_init__(self) -> None:
        # Types first, then each field's range, then named choices, then the fields that must agree with each
        # other: the first value refused is the one named.
        _check_types(self)
        if self.output_dir is None:
            self.output_dir = "trainer_output"  # transformers 5's default
        self.output_dir = Path(self.output_dir)
        self._check_numbers()
        self._check_choices()
        self._check_best_model()

    def _check_numbers(self) -> None:
        """Seeds, batch sizes, the schedule's lengths and the optimiser's numbers are each in their range."""
        for name in ("seed", "data_seed"):  # numpy's and transformers' set_seed range
            value = getattr(self, name)
            if value is not None and not 0 <= value < 2**32:
                raise BertkitError(f"{name} must be in [0, 2**32), got {value!r}")
        for name in ("per_device_train_batch_size", "per_device_eval_batch_size", "gradient_accumulation_steps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise BertkitError(f"{name} must be a whole number >= 1, got {value!r}")
        if not (math.isfinite(self.learning_rate) and self.learning_rate > 0):
            raise BertkitError(f"learning_rate must be a finite positive number, got {self.learning_rate!r}")
        if self.max_steps <= 0 and not (self.num_train_epochs > 0):
            raise BertkitError(f"num_train_epochs must be > 0 (or max_steps > 0), got {self.num_train_epochs!r}")
        if isinstance(self.max_steps, bool) or not isinstance(self.max_steps, int) or self.max_steps == 0:
            raise BertkitError(f"max_steps must be a whole number > 0, or -1 for num_train_epochs, got {self.max_steps!r}")
        for name in ("weight_decay", "max_grad_norm", "warmup_steps", "dataloader_num_workers"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise BertkitError(f"{name} must be a finite number >= 0, got {value!r}")
        if self.warmup_ratio is not None:
            if not 0 <= self.warmup_ratio < 1:
                raise BertkitError(f"warmup_ratio must be in [0, 1), got {self.warmup_ratio!r}")
            if self.warmup_steps:
                raise BertkitError(f"warmup_ratio {self.warmup_ratio} and warmup_steps {self.warmup_steps} are both "
                                   "set; give one")
        for name in ("adam_beta1", "adam_beta2"):
            if not 0 <= getattr(self, name) < 1:
                raise BertkitError(f"{name} must be in [0, 1), got {getattr(self, name)!r}")
        if not self.adam_epsilon > 0:
            raise BertkitError(f"adam_epsilon must be > 0, got {self.adam_epsilon!r}")

    def _check_choices(self) -> None:
        """Schedules, optimisers, strategies, step intervals, reporting and precision are ones bertkit implements;
        an enum strategy and a one-item report_to are stored as the plain value."""
        from bertkit.settings import LR_SCHEDULES

        if self.lr_scheduler_type not in LR_SCHEDULES:
            raise BertkitError(f"lr_scheduler_type {self.lr_scheduler_type!r} is not one bertkit implements; "
                               f"choose one of {LR_SCHEDULES}")
        if self.optim not in OPTIMIZERS:
            raise BertkitError(f"optim {self.optim!r} is not one bertkit's Trainer implements; choose one of "
                               f"{OPTIMIZERS} (both are torch.optim.AdamW)")
        for name in ("eval_strategy", "save_strategy", "logging_strategy"):
            value = getattr(self, name)
            value = getattr(value, "value", value)  # transformers' IntervalStrategy enum
            setattr(self, name, value)
            if value not in STRATEGIES:
                extra = " (save_strategy='best' is not implemented: use load_best_model_at_end=True)" \
                    if value == "best" else ""
                raise BertkitError(f"{name} {value!r} is not one of {STRATEGIES}{extra}")
        if self.train_sampling_strategy not in SAMPLING:
            raise BertkitError(f"train_sampling_strategy {self.train_sampling_strategy!r} is not one of {SAMPLING}")
        for name in ("eval_steps", "save_steps", "logging_steps"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, (int, float)) and value > 0):
                raise BertkitError(f"{name} must be > 0 (a step count, or below 1 a share of all steps), got {value!r}")
        if self.save_total_limit is not None and self.save_total_limit < 1:
            raise BertkitError(f"save_total_limit must be >= 1 (or None to keep every checkpoint), "
                               f"got {self.save_total_limit!r}")
        reports = [self.report_to] if isinstance(self.report_to, str) or self.report_to is None else list(self.report_to)
        reports = ["none" if r is None else r for r in reports] or ["none"]  # [] is transformers' "nowhere"
        bad = [r for r in reports if r not in ("none", "tensorboard")]
        if bad or len(reports) > 1:
            raise BertkitError(f"report_to {self.report_to!r}: bertkit reports to 'none' or 'tensorboard' "
                               "(one of them); metrics.jsonl is always written")
        self.report_to = reports[0]
        if self.bf16 and self.fp16:
            raise BertkitError("bf16 and fp16 are both set; choose one")

    def _check_best_model(self) -> None:
        """load_best_model_at_end needs an evaluation at each checkpoint; the metric and its direction default as
        in transformers (the loss, lower is better)."""
        if self.load_best_model_at_end:
            if self.eval_strategy == "no":
                raise BertkitError("load_best_model_at_end needs evaluations: set eval_strategy to 'steps' or "
                                   "'epoch' (and give the Trainer an eval_dataset)")
            if self.save_strategy != self.eval_strategy:
                raise BertkitError(f"load_best_model_at_end needs a checkpoint at every evaluation: save_strategy "
                                   f"{self.save_strategy!r} must equal eval_strategy {self.eval_strategy!r}")
            if self.eval_strategy == "steps" and self.save_steps % (self.eval_steps or self.logging_steps):
                raise BertkitError(f"load_best_model_at_end needs save_steps ({self.save_steps}) to be a multiple "
                                   f"of eval_steps ({self.eval_steps or self.logging_steps})")
            if self.metric_for_best_model is None:
                self.metric_for_best_model = "loss"  # transformers' default
        if self.metric_for_best_model is not None and self.greater_is_better is None:
            self.greater_is_better = not self.metric_for_best_model.removeprefix("eval_").endswith("loss")

    # -- what the Trainer derives from the fields -------------------------------------------------------------
    @property
    def device(self) -> str:
        """cpu with use_cpu, otherwise CUDA when present (the one place the Trainer decides)."""
        return "cpu" if self.use_cpu else "auto"

    def steps_of(self, value: float | None, total: int) -> int | None:
        """eval/save/logging steps: a count, or below 1 a share of the run's ``total`` steps (transformers)."""
        if value is None:
            return None
        return max(1, math.ceil(value * total)) if value < 1 else int(value)

    def warmup_for(self, total: int) -> int:
        if self.warmup_ratio is not None:
            return math.ceil(self.warmup_ratio * total)
        return int(self.warmup_steps) if self.warmup_steps >= 1 else math.ceil(total * self.warmup_steps)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: (str(v) if isinstance(v := getattr(self, f.name), Path) else v)
                for f in dataclasses.fields(self)}


def _accepts(kind: Any, value: Any) -> bool:
    """Whether ``value`` fits the annotation ``kind`` (int, float, bool, str, Path, list[str], None and unions)."""
    if kind is type(None):
        return value is None
    if kind is bool:
        return isinstance(value, bool)
    if kind is int:
        return isinstance(value, numbers.Integral) and not isinstance(value, bool)
    if kind is float:  # an int is a float here, as in Python's own typing; a bool is not a number of steps
        return isinstance(value, numbers.Real) and not isinstance(value, bool)
    if kind is str:
        return isinstance(value, str)
    if kind is Path:
        return isinstance(value, (str, os.PathLike))
    origin = typing.get_origin(kind)
    if origin in (typing.Union, types.UnionType):
        return any(_accepts(k, value) for k in typing.get_args(kind))
    if origin is list:
        (item,) = typing.get_args(kind)
        return isinstance(value, (list, tuple)) and all(_accepts(item, v) for v in value)
    raise AssertionError(f"TrainingArguments: no check for the annotation {kind!r}")


def _check_types(args: TrainingArguments) -> None:
    """Each field holds a value of its annotated type: learning_rate="1e-4" or seed=2.5 is named here, not met
    later as a TypeError deep in the optimiser or the random generator."""
    hints = typing.get_type_hints(TrainingArguments)
    for f in dataclasses.fields(args):
        value = getattr(args, f.name)
        if isinstance(value, enum.Enum):  # transformers' IntervalStrategy, SchedulerType, ...
            value = value.value
            setattr(args, f.name, value)
        if not _accepts(hints[f.name], value):
            raise BertkitError(f"TrainingArguments.{f.name} must be {_describe(hints[f.name])}, got {value!r} "
                               f"({type(value).__name__})")


def _describe(kind: Any) -> str:
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        return " or ".join(_describe(k) for k in typing.get_args(kind))
    return {type(None): "None", bool: "a bool", int: "an int", float: "a number", str: "a str",
            Path: "a path"}.get(kind, str(kind))


_dataclass_init = TrainingArguments.__init__


def _checked_init(self: TrainingArguments, output_dir: str | Path | None = None, **kwargs: Any) -> None:
    """The dataclass's __init__, after refusing transformers fields bertkit does not implement (by name, with
    what to use instead) and names neither library has (with the nearest known ones)."""
    known = {f.name for f in dataclasses.fields(TrainingArguments)}
    for name in list(kwargs):
        if name in known:
            continue
        if name in REFUSED:
            default, advice = REFUSED[name]
            if default is not _FACTORY and _same(kwargs[name], default):
                del kwargs[name]  # transformers' own default: the behaviour bertkit has anyway
                continue
            raise BertkitError(f"TrainingArguments: {name}={kwargs[name]!r} is a transformers argument bertkit "
                               f"does not implement: {advice}")
        near = difflib.get_close_matches(name, sorted(known | set(REFUSED)), n=3)
        raise BertkitError(f"TrainingArguments got an unknown argument {name!r}"
                           + (f"; did you mean {', '.join(near)}?" if near else "")
                           + " (see docs/coming-from-transformers.md for the fields bertkit implements)")
    _dataclass_init(self, output_dir=output_dir, **kwargs)


def _same(value: Any, default: Any) -> bool:
    value = getattr(value, "value", value)  # transformers' enums
    return value == default and isinstance(value, bool) == isinstance(default, bool)


TrainingArguments.__init__ = _checked_init  # type: ignore[method-assign]
