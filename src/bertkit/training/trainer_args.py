"""``TrainingArguments``: transformers' Trainer settings that bertkit's Trainer implements, checked on creation.

Field names, meanings and defaults are transformers' (v5), so ``TrainingArguments(output_dir=..., ...)`` written
for transformers runs as it is. Any other transformers field is refused with its name and what to use
instead (``REFUSED``), unless it is given at transformers' own default (then it changes nothing); a name
neither library knows is refused with the nearest known names. Nothing is silently ignored.

The fields the training loop reads are not declared here: ``TrainingArguments`` is ``TrainingSettings`` (each
knob declared once, for the command line too) at transformers' defaults, plus the fields only the Trainer reads.
bertkit adds choices transformers lacks: ``warmup_ratio`` (transformers 4's name; v5 reads ``warmup_steps`` < 1
as a ratio, which works here too), ``skip_nonfinite`` and
``train_sampling_strategy="group_by_length"``, bertkit's length-grouped order (batches of similar length,
shuffled; less padding, so faster), not transformers' ``LengthGroupedSampler``.
"""

from __future__ import annotations

import dataclasses
import difflib
from pathlib import Path
from typing import Any, Literal

from bertkit.errors import BertkitError
from bertkit.settings import TrainingSettings
from bertkit.settings.fields import at_least_one, flag, in_seed_range, redefault

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
    "logging_nan_inf_filter": (True, "bertkit stops on a non-finite loss, naming the step; skip_nonfinite=N "
                                     "skips up to N such steps instead"),
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
    "fsdp": (None, _DIST),
    "fsdp_config": (None, _DIST),
    "deepspeed": (None, "bertkit does not use DeepSpeed; " + _DIST),
    "debug": ("", _NO),
    "skip_memory_metrics": (True, _NO),
    "resume_from_checkpoint": (None, "pass it to trainer.train(resume_from_checkpoint=...), as transformers "
                                     "does (the argument is only read by example scripts)"),
    "local_rank": (-1, "torchrun sets LOCAL_RANK; drop this argument"),
}


_KNOBS = dataclasses.fields(TrainingSettings)


@redefault(hidden=tuple(f.name for f in _KNOBS if not f.metadata.get("trainer", True)),
           **{f.name: f.metadata["hf"] for f in _KNOBS if f.metadata.get("trainer", True) and "hf" in f.metadata})
class TrainingArguments(TrainingSettings):
    """What to train with: the loop's knobs (``TrainingSettings``) at transformers' defaults, and the fields only
    the Trainer reads.

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
    use_cpu: bool = False
    disable_tqdm: bool | None = None
    train_sampling_strategy: Literal["random", "sequential", "group_by_length"] = "random"
    """random: transformers' order (a RandomSampler seeded from data_seed or seed); sequential: the dataset's
    order; group_by_length: bertkit's length-grouped order (less padding, faster; a different order)."""
    do_train: bool = False
    """Read by example scripts, not by the Trainer (as in transformers)."""
    do_eval: bool = False
    do_predict: bool = False

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
            raise BertkitError("save_strategy 'best' is not implemented: use load_best_model_at_end=True")
        self.device = "cpu" if self.use_cpu else "auto"  # CUDA when present (the one place the Trainer decides)
        self.progress = not self.disable_tqdm
        super().__post_init__()  # each field's type, then its check
        self._check_best_model()

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

    def to_dict(self) -> dict[str, Any]:
        return {f.name: (str(v) if isinstance(v := getattr(self, f.name), Path) else v)
                for f in dataclasses.fields(self) if f.init}


_dataclass_init = TrainingArguments.__init__


def _checked_init(self: TrainingArguments, output_dir: str | Path | None = None, **kwargs: Any) -> None:
    """The dataclass's __init__, after refusing transformers fields bertkit does not implement (by name, with
    what to use instead) and names neither library has (with the nearest known ones)."""
    known = {f.name for f in dataclasses.fields(TrainingArguments) if f.init}
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
