"""``TrainingArguments``: ``TrainingSettings`` (each knob declared once, for the command line too) at transformers'
(v5) defaults, plus the fields only the Trainer reads. Any other transformers field is refused by name
(``REFUSED``) unless given at transformers' default (then it changes nothing); a name neither library knows is
refused with the nearest known names. Nothing is silently ignored.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
from pathlib import Path
from typing import Any, Literal

import torch

from bertkit._hardware import resolve_device
from bertkit._parallel import info_from_env
from bertkit.errors import BertkitError
from bertkit.settings import TrainingSettings
from bertkit.settings.fields import at_least_one, between, flag, in_seed_range, redefault
from bertkit.training.optim import SCHEDULE_OPTIONS, schedule_options

# Every transformers TrainingArguments field bertkit does not implement, under transformers' default (checked against
# the installed transformers by tests/test_trainer.py); any other value is refused, with ADVICE where there is one.
_NOT_IMPLEMENTED: tuple[tuple[Any, tuple[str, ...]], ...] = (
    (None, ("optim_args", "optim_target_modules", "tf32", "activation_checkpointing",
            "activation_checkpointing_kwargs", "gradient_checkpointing_kwargs", "torch_compile_backend",
            "torch_compile_mode", "liger_kernel_config", "neftune_noise_alpha", "torch_empty_cache_steps",
            "trackio_space_id", "trackio_bucket_id", "trackio_static_space_id", "hub_token",
            "hub_private_repo", "hub_model_id", "hub_revision", "accelerator_config", "parallelism_config",
            "dataloader_prefetch_factor", "dataloader_multiprocessing_context", "ddp_find_unused_parameters",
            "ddp_bucket_cap_mb", "ddp_broadcast_buffers", "ddp_static_graph", "ddp_backend", "fsdp", "fsdp_config",
            "deepspeed", "resume_from_checkpoint")),
    (True, ("average_tokens_across_devices", "log_on_each_node", "logging_nan_inf_filter", "dataloader_pin_memory",
            "dataloader_in_order", "skip_memory_metrics")),
    (False, ("use_liger_kernel", "use_cache", "auto_find_batch_size",
             "eval_use_gather_object", "save_on_each_node", "enable_jit_checkpoint", "push_to_hub",
             "hub_always_push", "ignore_data_skip", "full_determinism",
             "dataloader_persistent_workers")),
    (-1, ("local_rank",)),
    ("", ("debug",)),
    ("passive", ("log_level",)),
    ("warning", ("log_level_replica",)),
    ("huggingface", ("project",)),
    ("every_save", ("hub_strategy",)),
)
REFUSED: dict[str, Any] = {name: default for default, names in _NOT_IMPLEMENTED for name in names}
# transformers' schedules bertkit does not have, and why
_OTHER_SCHEDULES = {
    "reduce_lr_on_plateau": "it lowers the rate on the evaluations' metric, not by step",
    "cosine_warmup_with_min_lr": "its warm-up follows a cosine; 'cosine_with_min_lr' warms up linearly",
    "greedy": "it adapts the rate to the training loss",
}
_HUB = "save with trainer.save_model(DIR) and upload DIR with huggingface_hub"
_DIST = "bertkit runs data-parallel under torchrun on its own (docs/distributed.md)"
ADVICE = {  # by the start of the name
    "gradient_checkpointing_kwargs": "use gradient_checkpointing=True (per encoder layer, no options)",
    "activation_checkpointing_kwargs": "use gradient_checkpointing=True (per encoder layer, no options)",
    "activation_checkpointing": "use gradient_checkpointing=True",
    "torch_compile": "torch_compile=True compiles each encoder layer with the default backend and mode",
    "tf32": "set torch.backends.cuda.matmul.allow_tf32 yourself",
    "logging_nan_inf_filter": "bertkit stops on a non-finite loss, naming the step; skip_nonfinite=N skips up to N",
    "log_level": "set logging.getLogger('bertkit') yourself",
    "push_to_hub": _HUB,
    "hub_": _HUB,
    "fsdp": _DIST,
    "ddp_": _DIST,
    "local_rank": _DIST,
    "deepspeed": _DIST,
    "parallelism_config": _DIST,
    "resume_from_checkpoint": "pass it to trainer.train(resume_from_checkpoint=...), as transformers does",
}


_KNOBS = dataclasses.fields(TrainingSettings)


@redefault(hidden=tuple(f.name for f in _KNOBS if not f.metadata.get("trainer", True)),
           **{f.name: f.metadata["hf"] for f in _KNOBS if f.metadata.get("trainer", True) and "hf" in f.metadata})
class TrainingArguments(TrainingSettings):
    """The loop's knobs at transformers' defaults, and the fields only the Trainer reads.

    >>> args = TrainingArguments(output_dir="out", learning_rate=2e-5, num_train_epochs=2, eval_strategy="epoch")
    """

    per_device_train_batch_size: int = flag(8, check=at_least_one)
    per_device_eval_batch_size: int = flag(8, check=at_least_one)
    load_best_model_at_end: bool = False
    metric_for_best_model: str | None = None
    greater_is_better: bool | None = None
    data_seed: int | None = flag(None, check=in_seed_range)
    run_name: str | None = None
    remove_unused_columns: bool = True
    label_names: list[str] | None = None
    label_smoothing_factor: float = flag(0.0, check=between(0.0, 1.0))
    """transformers' LabelSmoother on a classifier's or tagger's logits (the range torch's label_smoothing takes)."""
    use_cpu: bool = False
    dataloader_drop_last: bool = False
    """Leave out the short last batch of each epoch (the global batch's, under torchrun) and of each evaluation and
    predict(), as transformers' data loaders do: an epoch makes rows // batch batches."""
    disable_tqdm: bool | None = None
    train_sampling_strategy: Literal["random", "sequential", "group_by_length"] = "random"
    """random: transformers' order (a RandomSampler seeded from data_seed or seed); sequential: the dataset's
    order; group_by_length: transformers' LengthGroupedSampler's order (less padding; docs/coming-from-transformers.md)."""
    length_column_name: str = "length"
    """group_by_length reads each row's length from this column of a datasets.Dataset where the rows (after
    remove_unused_columns) still have it, else from the tokenizer's first model input, as transformers does."""
    prediction_loss_only: bool = False
    """evaluate() and predict() return the loss alone: no predictions, no labels, no compute_metrics."""
    eval_do_concat_batches: bool = True
    """False: predictions, labels (and include_for_metrics' inputs and losses) are lists of per-batch arrays."""
    batch_eval_metrics: bool = False
    """compute_metrics is called for each evaluation batch, with torch tensors and ``compute_result`` True at the
    last batch, whose return is the evaluation's metrics (transformers' protocol)."""
    include_for_metrics: list[str] = dataclasses.field(default_factory=list)
    """What EvalPrediction carries beside predictions and label_ids: "inputs" (the batches' input_ids, padded with
    -100 to one length) and "loss" (each row's batch loss)."""
    bf16_full_eval: bool = False
    """evaluate() and predict() outside train() run a bf16 copy of the model (transformers casts the model itself,
    and it stays bf16 for what follows; here it stays as it is); the evaluations during training are bf16's
    autocast when bf16=True, as in transformers."""
    fp16_full_eval: bool = False
    """bf16_full_eval in float16."""
    eval_on_start: bool = False
    """train() evaluates once before its first step (a sanity check of the evaluation), as transformers does."""
    logging_first_step: bool = False
    """Log the first step's loss too (transformers' first record, from which the next window starts)."""
    eval_accumulation_steps: int | None = flag(None, check=at_least_one)
    """Accepted for transformers' scripts; changes nothing: bertkit moves each evaluation batch's outputs to the CPU
    as it goes (transformers' eval_accumulation_steps=1), so evaluation holds no more than one batch on a GPU."""
    restore_callback_states_from_checkpoint: bool = False
    """Accepted for transformers' scripts; changes nothing: a resumed run always restores its callbacks' states (an
    EarlyStoppingCallback's patience), so that it stops where the uninterrupted run stops."""
    do_train: bool = False
    """Read by example scripts, not by the Trainer (as in transformers); do_eval is set True by an eval_strategy
    other than "no", as transformers sets it."""
    do_eval: bool = False
    do_predict: bool = False
    include_num_input_tokens_seen: Literal["all", "non_padding", "no"] = "no"
    """Count the training batches' input tokens into ``state.num_input_tokens_seen``, which every log record then
    carries (a training loss's record also ``train_tokens_per_second``), as transformers counts them: "all" the padded
    input_ids' entries, "non_padding" the attention mask's ones; True is "all" and False "no", as transformers reads
    them. A resumed run goes on from its checkpoint's count."""
    save_only_model: bool = False
    """Checkpoints hold the model, the tokenizer and trainer_state.json, without the optimiser, schedule and random
    states (transformers' files; a third the size): load_best_model_at_end and save_total_limit work as before, and
    resuming from one is refused, naming why (transformers' Trainer goes on with a fresh optimiser there)."""
    lr_scheduler_kwargs: dict | str | None = None
    """The schedule's options, as transformers takes them (a dict, or its JSON text): cosine's and
    cosine_with_restarts' ``num_cycles``, polynomial's ``lr_end`` and ``power``, inverse_sqrt's ``timescale``,
    cosine_with_min_lr's ``min_lr`` or ``min_lr_rate`` (one of them) and ``num_cycles``, warmup_stable_decay's
    ``num_decay_steps`` (needed), ``num_stable_steps``, ``warmup_type``, ``decay_type``, ``min_lr_ratio`` and
    ``num_cycles``; one the schedule does not take is refused by name."""

    def __post_init__(self) -> None:
        if self.output_dir is None:
            self.output_dir = "trainer_output"  # transformers 5's default
        reports = [self.report_to] if isinstance(self.report_to, str) or self.report_to is None else self.report_to
        reports = ["none" if r is None else getattr(r, "value", r) for r in reports] or ["none"]  # []: "nowhere"
        if len(reports) > 1 or reports[0] not in ("none", "tensorboard"):
            raise BertkitError(f"report_to {self.report_to!r}: bertkit reports to 'none' or 'tensorboard' "
                               "(one of them); metrics.jsonl is always written")
        self.report_to = reports[0]
        if getattr(self.save_strategy, "value", self.save_strategy) == "best":
            raise BertkitError("save_strategy 'best' (a checkpoint at each new best metric_for_best_model) is not "
                               "implemented: set save_strategy to eval_strategy's value with load_best_model_at_end="
                               "True (and save_total_limit=1: the best checkpoint and the newest are kept)")
        self.device = "cpu" if self.use_cpu else "auto"  # CUDA when present (the one place the Trainer decides)
        self.progress = not self.disable_tqdm
        schedule = getattr(self.lr_scheduler_type, "value", self.lr_scheduler_type)  # transformers' SchedulerType
        if schedule in _OTHER_SCHEDULES:
            raise BertkitError(f"lr_scheduler_type {schedule!r} is not implemented in bertkit ({_OTHER_SCHEDULES[schedule]}); "
                               f"choose one of {', '.join(SCHEDULE_OPTIONS)}")
        self.lr_scheduler_type = schedule
        if getattr(self.train_sampling_strategy, "value", self.train_sampling_strategy) == "batch_rebalance":
            raise BertkitError("train_sampling_strategy 'batch_rebalance' (transformers' sampler that spreads padded "
                               "tokens evenly over processes and accumulation steps) is not implemented in bertkit; "
                               "choose 'group_by_length' (batches of similar lengths: less padding), 'random' or "
                               "'sequential'")
        optim = getattr(self.optim, "value", self.optim)  # transformers' OptimizerNames
        if isinstance(optim, str) and optim not in ("adamw", "adamw_torch", "adamw_torch_fused"):
            raise BertkitError(f"optim {optim!r} is not implemented in bertkit: its loop trains with torch.optim.AdamW "
                               "(optim 'adamw_torch' or 'adamw_torch_fused', the same update; set adam_beta1, "
                               "adam_beta2, adam_epsilon and weight_decay), or train with transformers' Trainer for "
                               "another optimiser")
        self.optim = optim
        if isinstance(self.include_num_input_tokens_seen, bool):  # as transformers' __post_init__ reads it
            self.include_num_input_tokens_seen = "all" if self.include_num_input_tokens_seen else "no"
        if isinstance(self.lr_scheduler_kwargs, str):  # a command line's JSON text, as transformers reads it
            try:
                self.lr_scheduler_kwargs = json.loads(self.lr_scheduler_kwargs)
            except json.JSONDecodeError:
                raise BertkitError(f"lr_scheduler_kwargs {self.lr_scheduler_kwargs!r} is neither a dict nor its JSON "
                                   "text; give e.g. {\"num_cycles\": 2}") from None
        super().__post_init__()  # each field's type, then its check
        if self.eval_strategy != "no":
            self.do_eval = True  # as transformers derives it: example scripts evaluate at the end `if args.do_eval`
        if self.eval_strategy == "steps" and not self.eval_steps:
            self.eval_steps = self.logging_steps  # as transformers derives it (callbacks and scripts read it)
        self.lr_scheduler_kwargs = dict(self.lr_scheduler_kwargs or {})
        schedule_options(self.lr_scheduler_type, self.lr_scheduler_kwargs,  # a name or value it cannot take: now
                         self.learning_rate if isinstance(self.learning_rate, (int, float)) else None)
        self._check_best_model()
        if self.bf16_full_eval and self.fp16_full_eval:
            raise BertkitError("bf16_full_eval and fp16_full_eval are both set; choose one")
        unknown = [x for x in self.include_for_metrics if x not in ("inputs", "loss")]
        if unknown or not isinstance(self.include_for_metrics, list):
            raise BertkitError(f"include_for_metrics {self.include_for_metrics!r}: name what EvalPrediction should "
                               "carry beside the predictions, a list of 'inputs' and 'loss' (e.g. ['inputs', 'loss'])")
        # transformers' ``args.device`` is the torch.device the run trains on (scripts do ``x.to(args.device)``,
        # ``args.device.type``): the loop's own choice (resolve_device), this process's GPU under torchrun
        self.device = torch.device(resolve_device(self.device, info_from_env().local_rank))

    def _check_best_model(self) -> None:
        """load_best_model_at_end needs an evaluation at each checkpoint; the metric defaults as in transformers."""
        if self.load_best_model_at_end:
            if self.eval_strategy == "no":
                raise BertkitError("load_best_model_at_end needs evaluations: set eval_strategy to 'steps' or "
                                   "'epoch' (and give the Trainer an eval_dataset)")
            if self.save_strategy != self.eval_strategy:
                raise BertkitError(f"load_best_model_at_end needs a checkpoint at every evaluation: save_strategy "
                                   f"{self.save_strategy!r} must equal eval_strategy {self.eval_strategy!r}")
            every = self.eval_steps or self.logging_steps
            if self.eval_strategy == "steps" and not _multiple(self.save_steps, every):
                raise BertkitError(f"load_best_model_at_end needs save_steps ({self.save_steps}) to be a multiple "
                                   f"of eval_steps ({every}), both step counts or both shares of the run (below 1)")
            if self.metric_for_best_model is None:
                self.metric_for_best_model = "loss"  # transformers' default
        if self.metric_for_best_model is not None and self.greater_is_better is None:
            self.greater_is_better = not self.metric_for_best_model.removeprefix("eval_").endswith("loss")

    def to_dict(self) -> dict[str, Any]:
        return {f.name: (str(v) if isinstance(v := getattr(self, f.name), Path) else v)
                for f in dataclasses.fields(self) if f.init}

    def __setattr__(self, name: str, value: Any) -> None:
        """An assignment after construction (``args.optim = "sgd"``, ``args.disable_tqdm = True``, as transformers'
        scripts make them) is built as the constructor builds it: refused by the same rules (a field bertkit does not
        implement, a name neither library knows, a value out of range), and what the constructor derives from it (the
        device from ``use_cpu``, the progress bar from ``disable_tqdm``, ``lr_scheduler_kwargs``' JSON text) follows.
        A plain attribute would be kept and never read: the run would not be the one asked for."""
        if name.startswith("_") or not self.__dict__.get("_built", False):
            object.__setattr__(self, name, value)  # the constructor's own assignments, and private attributes
            return
        derived = {f.name: f for f in dataclasses.fields(self) if not f.init}
        if name in derived:
            source = {"device": "use_cpu", "progress": "disable_tqdm"}.get(name)
            raise BertkitError(f"TrainingArguments.{name} is decided from the other fields"
                               + (f": set {source} instead" if source else f" and cannot be set ({name}={value!r})"))
        rebuilt = type(self)(**{**self.to_dict(), name: value})
        self.__dict__.update(rebuilt.__dict__)


_dataclass_init = TrainingArguments.__init__
# transformers 4's arguments that 5 renamed (and refuses by the old name)
_OLD_SPELLINGS = {"group_by_length": "train_sampling_strategy='group_by_length'"}


def _checked_init(self: TrainingArguments, output_dir: str | Path | None = None, **kwargs: Any) -> None:
    """The dataclass's __init__, after refusing the fields it does not know (``REFUSED``, or with the nearest)."""
    known = {f.name for f in dataclasses.fields(TrainingArguments) if f.init}
    for name in list(kwargs):
        if name in known:
            continue
        if name in REFUSED:
            if _same(kwargs[name], REFUSED[name]):
                del kwargs[name]  # transformers' own default: the behaviour bertkit has anyway
                continue
            advice = next((a for start, a in ADVICE.items() if name.startswith(start)), "drop this argument")
            raise BertkitError(f"TrainingArguments: {name}={kwargs[name]!r} is a transformers argument bertkit "
                               f"does not implement: {advice}")
        if name in _OLD_SPELLINGS:
            raise BertkitError(f"TrainingArguments got {name}={kwargs[name]!r}, transformers 4's spelling (transformers "
                               f"5 refuses it too): use {_OLD_SPELLINGS[name]}")
        near = difflib.get_close_matches(name, sorted(known | set(REFUSED)), n=3)
        raise BertkitError(f"TrainingArguments got an unknown argument {name!r}"
                           + (f"; did you mean {', '.join(near)}?" if near else "")
                           + " (see docs/coming-from-transformers.md for the fields bertkit implements)")
    _dataclass_init(self, output_dir=output_dir, **kwargs)
    object.__setattr__(self, "_built", True)  # later assignments are checked (TrainingArguments.__setattr__)


def _multiple(save: float, every: float) -> bool:
    """save_steps a multiple of eval_steps, as transformers checks it: counts exactly, shares (below 1) up to float
    rounding (0.3 of the run is 3 times 0.1, though 0.3 % 0.1 is 0.0999...); a count and a share never."""
    if (save < 1) != (every < 1):
        return False
    times = save / every
    return round(times) >= 1 and math.isclose(times, round(times), rel_tol=1e-9)


def _same(value: Any, default: Any) -> bool:
    value = getattr(value, "value", value)  # transformers' enums
    return value == default and isinstance(value, bool) == isinstance(default, bool)


TrainingArguments.__init__ = _checked_init  # type: ignore[method-assign]
