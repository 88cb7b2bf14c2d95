"""``bertkit.Trainer``: transformers' Trainer API, driving bertkit's one training loop (``training/loop.py``).

Code written for transformers' Trainer runs after changing the import::

    from bertkit import Trainer, TrainingArguments, DataCollatorWithPadding
    trainer = Trainer(model=model, args=TrainingArguments(output_dir="out", eval_strategy="epoch"),
                      train_dataset=train, eval_dataset=dev, processing_class=tokenizer,
                      data_collator=DataCollatorWithPadding(tokenizer), compute_metrics=accuracy)
    trainer.train(); trainer.evaluate(); trainer.predict(test)

The Trainer hands its ``TrainingArguments`` (the loop's ``TrainingSettings``) to the loop as they are and adds
``LoopHooks``: checkpoint-N directories with the tokenizer and ``trainer_state.json``, callbacks at transformers'
events, the best checkpoint kept. Where it differs on purpose: docs/coming-from-transformers.md, "Trainer".
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from bertkit._hardware import cpu_has_bf16
from bertkit.data.collators import DataCollatorWithPadding, DefaultDataCollator
from bertkit.errors import BertkitError, read_json_object
from bertkit.runs import output_dir
from bertkit.training import trainer_data
from bertkit.training.batch_plan import BatchPlan, steps_for_epochs, steps_per_epoch
from bertkit.training.callbacks import (
    EvalPrediction,
    TrainerCallback,
    TrainerControl,
    TrainerState,
    TrainOutput,
    best_metric_value,
    callback_states,
    metric_key,
    restore_callback_states,
)
from bertkit.training.checkpoint import (
    HF_LAYOUT,
    STATE_FILE,
    OptimizerLayout,
    checkpoint_weights,
    load_model_state,
    refuse_model_only,
    remove_torn_writes,
)
from bertkit.training.distributed import agree, current, join_for_process
from bertkit.training.length_grouped import LengthGroupedOrder, row_lengths
from bertkit.training.loop import LoopHooks, Phase, Position, train
from bertkit.training.resume_point import named_checkpoint, refuse_foreign_checkpoints, refuse_other_run
from bertkit.training.run_setup import run_fingerprint
from bertkit.training.seeding import seed_generators
from bertkit.training.token_loss import forward_parameters
from bertkit.training.tokens_seen import speed_metrics
from bertkit.training.trainer_args import TrainingArguments
from bertkit.training.trainer_eval import TrainerEvaluation
from bertkit.training.trainer_loss import TrainerLoss
from bertkit.training.trainer_reports import TRAINER_STATE, TrainerReports
from bertkit.write_paths import refuse_non_directory

logger = logging.getLogger("bertkit")
# transformers' Trainer methods its subclasses override to change training or prediction, which bertkit's Trainer
# never calls (its loop runs the steps itself; compute_loss is called, as transformers calls it): an override is
# refused, never silently skipped
NOT_CALLED = ("training_step", "prediction_step", "create_optimizer", "create_scheduler",
              "create_optimizer_and_scheduler", "get_train_dataloader", "get_eval_dataloader", "get_test_dataloader",
              "evaluation_loop", "get_decay_parameter_names")
# transformers' Trainer arguments bertkit's does not implement, with the fix; each is accepted at transformers' default
_OPTIMISER = ("bertkit's loop builds AdamW (optim 'adamw_torch') and the schedule from TrainingArguments: set "
              "learning_rate, weight_decay, adam_beta1, adam_beta2, adam_epsilon, lr_scheduler_type (with "
              "lr_scheduler_kwargs) and warmup_steps there, or train with transformers' Trainer for another optimiser")
NOT_IMPLEMENTED_ARGUMENTS = {
    "optimizers": ((None, None), _OPTIMISER),
    "optimizer_cls_and_kwargs": (None, _OPTIMISER),
    "compute_loss_func": (None, "override compute_loss(self, model, inputs, return_outputs=False, "
                                "num_items_in_batch=None) in a Trainer subclass (bertkit calls it as transformers does)"),
}


class Trainer(TrainerLoss, TrainerEvaluation, TrainerReports):
    """transformers' Trainer on bertkit's loop; see the module docstring."""

    _not_called: tuple[str, ...] = NOT_CALLED  # the overrides refused (the sentence trainers' add compute_loss)
    _evaluates_with = ("an eval_dataset", "eval_dataset=...")  # eval_strategy's error: what evaluates, and its argument

    def __init__(self, model: nn.Module | None = None, args: TrainingArguments | None = None,
                 data_collator: Callable | None = None, train_dataset: Any = None, eval_dataset: Any = None,
                 processing_class: Any = None, model_init: Callable | None = None,
                 compute_metrics: Callable[[EvalPrediction], dict] | None = None,
                 callbacks: Sequence[TrainerCallback | type] | None = None,
                 preprocess_logits_for_metrics: Callable[[Any, Any], Any] | None = None, **unknown: Any):
        for name, value in unknown.items():
            default, fix = NOT_IMPLEMENTED_ARGUMENTS.get(name, (None, None))
            if fix is None:
                raise BertkitError(f"Trainer got an argument bertkit does not implement: {name}; see "
                                   "docs/coming-from-transformers.md for the arguments it takes")
            if value != default and not (isinstance(value, (list, tuple)) and tuple(value) == default):
                raise BertkitError(f"Trainer({name}=...) is not implemented in bertkit: {fix}")
        overridden = [name for cls in type(self).__mro__ if not cls.__module__.startswith("bertkit.")
                      for name in self._not_called if name in vars(cls)]
        if overridden:
            raise BertkitError(
                f"{type(self).__name__} overrides {', '.join(overridden)}, which transformers' Trainer calls and "
                "bertkit's never does (its loop runs the steps itself), so the override would be skipped without a "
                f"word: {self._custom_loss}, or train with transformers' Trainer")
        if model_init is not None:
            raise BertkitError("model_init (hyper-parameter search) is not implemented; pass model=")
        if model is None:
            raise BertkitError("Trainer needs a model")
        dynamo = sys.modules.get("torch._dynamo.eval_frame")  # loaded once anything is compiled (importing it: 1.5 s)
        if dynamo is not None and isinstance(model, dynamo.OptimizedModule):
            raise BertkitError(
                f"Trainer got torch.compile(model) ({type(model._orig_mod).__name__} compiled): its forward names no "
                "argument, so no column of the data would reach the model (transformers' Trainer fails there too); "
                "pass the model itself with TrainingArguments(torch_compile=True), which compiles its layers")
        self.args = args if args is not None else TrainingArguments()
        if not isinstance(self.args, TrainingArguments):
            raise BertkitError(f"args must be bertkit.TrainingArguments, got {type(self.args).__module__}."
                               f"{type(self.args).__name__}; change the import to `from bertkit import "
                               "TrainingArguments`")
        self._seed()
        self.model = model
        # what the loop trains, evaluates and checkpoints: the model, or (sentence-transformers' trainers) the loss
        # around it, while ``model`` stays the model passed in, as transformers' and sentence-transformers' do
        self._module = self._trained_module(model)
        self.processing_class = processing_class
        if data_collator is None:
            padded = self.processing_class is not None and hasattr(self.processing_class, "pad")
            data_collator = DataCollatorWithPadding(self.processing_class) if padded else DefaultDataCollator()
        self.data_collator, self.train_dataset, self.eval_dataset = data_collator, train_dataset, eval_dataset
        self.compute_metrics, self.preprocess_logits_for_metrics = compute_metrics, preprocess_logits_for_metrics
        self.callbacks: list[TrainerCallback] = [c() if isinstance(c, type) else c for c in callbacks or ()]
        self.state, self.control = TrainerState(), TrainerControl()
        # under torchrun: join the process group (DDP over the ranks, evaluation split over them)
        _, self.device = join_for_process(self.args.device, self.args.ddp_timeout)
        self._module.to(self.device)
        self._forward_args = forward_parameters(self._module)
        self._set_up_loss(self._module, self._forward_args)
        self.label_names = self.args.label_names or [
            p for p in self._forward_args if "label" in p or p in ("start_positions", "end_positions")]
        not_taken = [n for n in self.label_names if n not in self._forward_args]
        if not_taken and not any(p.kind is p.VAR_KEYWORD for p in self._forward_args.values()):
            # the labels are read from the batch the model is called with: a name it does not take is never there
            raise BertkitError(
                f"label_names {not_taken} are not arguments of {type(self._module).__name__}.forward "
                f"({', '.join(self._forward_args)}), so no batch holds them and evaluations would have no labels; "
                "name the arguments the labels go to (['labels']: the collators rename a 'label' column to it)")
        if self.args.eval_on_start and not self._evaluates():
            raise BertkitError(f"eval_on_start=True needs {self._evaluates_with[0]}: pass "
                               f"{type(self).__name__}({self._evaluates_with[1]}), or set eval_on_start=False")
        if self.args.eval_strategy != "no" and not self._evaluates():
            raise BertkitError(f"eval_strategy {self.args.eval_strategy!r} needs {self._evaluates_with[0]}: pass "
                               f"{type(self).__name__}({self._evaluates_with[1]}), or set eval_strategy='no'")
        self._event("on_init_end")

    def _seed(self) -> None:
        """Seed the generators as transformers' Trainer does, when it is made (``seed_generators``)."""
        seed_generators(self.args.seed)

    def _evaluates(self) -> bool:
        """Whether the run has something to evaluate: an eval_dataset."""
        return self.eval_dataset is not None

    def _trained_module(self, model: nn.Module) -> nn.Module:
        """The module the loop trains: the model itself (the model's forward returns the loss)."""
        return model

    # -- callbacks -----------------------------------------------------------------------------------------
    def add_callback(self, callback: TrainerCallback | type) -> None:
        self.callbacks.append(callback() if isinstance(callback, type) else callback)

    def pop_callback(self, callback: TrainerCallback | type) -> TrainerCallback | None:
        for c in self.callbacks:
            if c is callback or (isinstance(callback, type) and isinstance(c, callback)):
                self.callbacks.remove(c)
                return c
        return None

    def remove_callback(self, callback: TrainerCallback | type) -> None:
        """Remove ``callback`` (an instance, or the first of a class); returns None, as transformers' does."""
        self.pop_callback(callback)

    def push_to_hub(self, *args: Any, **kwargs: Any) -> None:
        raise BertkitError("Trainer.push_to_hub is not implemented in bertkit (it reaches no hub): save with "
                           "trainer.save_model(DIR) and upload DIR with huggingface_hub's upload_folder")

    def _event(self, name: str, **kwargs: Any) -> None:
        for c in self.callbacks:
            returned = getattr(c, name)(self.args, self.state, self.control, model=self.model,
                                        processing_class=self.processing_class, **kwargs)
            if isinstance(returned, TrainerControl) and returned is not self.control:  # transformers takes it
                for f in dataclasses.fields(TrainerControl):  # the loop holds self.control: copied into it
                    setattr(self.control, f.name, getattr(returned, f.name))

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """Add a record to ``state.log_history`` (with the epoch and step, as transformers) and tell callbacks. The
        epoch goes into ``logs`` itself, as transformers puts it: evaluate()'s metrics, on_evaluate's and train()'s
        carry it because they are the dict logged. With include_num_input_tokens_seen, every record carries
        num_input_tokens_seen, and one given ``start_time`` (the training loss's) this train() call's
        train_runtime and train_tokens_per_second, as transformers logs them."""
        if self.state.epoch is not None:
            logs["epoch"] = self.state.epoch
        if self.args.include_num_input_tokens_seen != "no":
            logs["num_input_tokens_seen"] = self.state.num_input_tokens_seen
            if start_time is not None:
                logs.update(speed_metrics("train", start_time,
                                          self.state.num_input_tokens_seen - self._tokens_at_start))
        record = {**logs, "step": self.state.global_step}
        self.state.log_history.append(record)
        self._event("on_log", logs=logs)

    # -- data ----------------------------------------------------------------------------------------------
    def _examples(self, dataset: Any, what: str, training: bool = False) -> Sequence:
        keep = {*self._forward_args, "label", "label_ids", *self.label_names} if self.args.remove_unused_columns \
            else None
        return trainer_data.examples(dataset, what, keep=keep, model=self._module, training=training)

    def _check_batch(self, examples: Sequence, what: str, need_labels: bool) -> None:
        if getattr(getattr(self._module, "config", None), "return_dict", True) is False:
            # the loop and the predictions read the outputs by name: a tuple would give no predictions, no loss
            raise BertkitError(
                f"{what}: the model's config sets return_dict=False, so {type(self._module).__name__} returns tuples, "
                "and bertkit's Trainer reads its outputs by name (loss, logits); set model.config.return_dict = True "
                "(transformers' Trainer gives the same predictions and losses either way)")
        trainer_data.check_batch(self.data_collator, examples[0], what, self._forward_args,
                                 self.label_names if need_labels else None, type(self._module).__name__)

    def _collate(self, examples: list) -> dict:
        return {k: v for k, v in self.data_collator(examples).items() if isinstance(v, torch.Tensor)}

    # Under torchrun an epoch's short last global batch is filled up with its first rows, as accelerate deals out
    # transformers' last round of batches (trainer_data.global_batches)
    fills_short_last_batch = True

    def _batches(self, examples: Sequence) -> Callable[[int], list[list[int]]]:
        """The global micro-batches of each epoch: the epoch's order (``_order``) cut into batches."""
        order, per_device = self._order(examples), self.args.per_device_train_batch_size
        return lambda epoch: trainer_data.global_batches(list(order(epoch)), per_device, current().world_size,
                                                         self.fills_short_last_batch)

    def _batches_per_epoch(self, examples: Sequence) -> int | None:
        """How many of ``_batches``' batches an epoch trains on; None: ceil(rows / global batch)."""
        size = self.args.per_device_train_batch_size * current().world_size
        return trainer_data.whole_batches(len(examples), size, "train_dataset", "per_device_train_batch_size") \
            if self.args.dataloader_drop_last else None

    def _order(self, examples: Sequence) -> Callable[[int], Sequence[int]]:
        strategy = trainer_data.sampling_strategy(self.args.train_sampling_strategy, type(self).__name__,
                                                  self._reads_sampling_strategy)
        if strategy == "group_by_length":  # megabatches of the accumulated batch
            names = getattr(self.processing_class, "model_input_names", None) or ["input_ids"]
            column = self.args.length_column_name if trainer_data.is_hf_dataset(self.train_dataset) else None
            self._grouped = LengthGroupedOrder(row_lengths(examples, column, names[0]), self.args.
                                               per_device_train_batch_size * self.args.gradient_accumulation_steps)
            return self._grouped.order
        seed = self.args.data_seed if self.args.data_seed is not None else self.args.seed
        return trainer_data.train_order(examples, strategy, seed)

    # -- training ------------------------------------------------------------------------------------------
    def train(self, resume_from_checkpoint: str | Path | bool | None = None,
              ignore_keys_for_eval: list[str] | None = None, **unknown: Any) -> TrainOutput:
        """Train on ``train_dataset``, or continue (``resume_from_checkpoint``: True for the newest checkpoint-N in
        output_dir, or its path)."""
        unknown = {k: v for k, v in unknown.items() if not (k == "trial" and v is None)}  # transformers' default
        if unknown:
            raise BertkitError(f"train() got arguments bertkit does not implement: {sorted(unknown)}"
                               + (" (trial: hyper-parameter search; pass trial=None or leave it out)"
                                  if "trial" in unknown else ""))
        args, info = self.args, current()
        out = Path(args.output_dir)
        examples = self._examples(self.train_dataset, "train_dataset", training=True)
        self._check_batch(examples, "train_dataset", need_labels=True)
        self._ignore_keys_for_eval = ignore_keys_for_eval
        if args.eval_strategy != "no" or args.eval_on_start:
            self._check_outputs(ignore_keys_for_eval, "train(ignore_keys_for_eval=...)")
        if args.eval_strategy != "no":
            self._check_metric()
        plan = BatchPlan(examples, args.per_device_train_batch_size, self._collate, seed=args.seed,
                         draw=self._batches(examples), rank=info.rank, world_size=info.world_size,
                         per_epoch=self._batches_per_epoch(examples))
        accum = args.gradient_accumulation_steps
        per_epoch = steps_per_epoch(plan, accum)
        total = args.max_steps if args.max_steps > 0 else steps_for_epochs(plan, args.num_train_epochs, accum)
        resume = self._resume_point(out, resume_from_checkpoint)
        if self._trained and resume is None:
            raise BertkitError(
                "train() was called before on this Trainer: transformers' Trainer would go on with that call's "
                "optimiser (AdamW's moments and step count) and bertkit's loop builds a new one, so this run would "
                "train another model without a word; make a new Trainer(model=trainer.model, ...) for a fresh "
                "optimiser, or continue a checkpointed run with train(resume_from_checkpoint=True)")
        # the loop reads the arguments themselves: fp16 alone is decided for the device first (``_fp16``)
        settings = args if _fp16(args.fp16, self.device) == args.fp16 else dataclasses.replace(args, fp16=False)
        fingerprint = self._fingerprint(examples, total, info.world_size)
        if resume is not None:  # checked before anything is written (the loop checks it again, reading it all)
            refuse_other_run(resume, run_fingerprint(settings, fingerprint))
            if self._grouped is not None:
                self._grouped.load(resume)
            if info.world_size == 1:  # (under torchrun each rank's collator draws its own stream, not recorded)
                trainer_data.load_collator_rng(self.data_collator, resume)

        self.state = self._new_state(total, per_epoch, resume)
        self.control = TrainerControl()
        # transformers' start of the run's clock, and of this call's tokens (the tokens per second it logs)
        self._train_start, self._tokens_at_start = time.time(), self.state.num_input_tokens_seen
        self._micro_per_epoch = len(plan)
        start_step = self.state.global_step
        # rank 0 locks output_dir and writes into it as it goes, as transformers' Trainer does (bertkit.runs):
        # each checkpoint is staged and renamed into place with its manifest; metrics.jsonl is recorded there
        self._in_train = True  # (what transformers' is_in_train says: bf16_full_eval casts no model then)
        try:
            with output_dir(out, "Trainer", in_place=True) if info.is_main else contextlib.nullcontext():
                if info.is_main:
                    remove_torn_writes(out, HF_LAYOUT)
                t0 = time.perf_counter()
                self._trained = True
                result = train(self._module, [Phase(plan, total)], settings,
                               evaluate=self._loop_evaluation if self._evaluates() else None,
                               fingerprint=fingerprint, resume=resume or False,
                               hooks=LoopHooks(layout=HF_LAYOUT, write_extra=self._write_checkpoint_extras,
                                               protect=self._is_best, on_record=self._on_record, event=self._loop_event,
                                               control=self.control, param_groups=self._parameter_groups(),
                                               transformers_files=self._transformers_files(),
                                               schedule_steps=self._schedule_steps,
                                               schedule_options=args.lr_scheduler_kwargs,
                                               compute_loss=self._counted_loss,
                                               count_items=self._count_items, seeded=True,
                                               model_only=args.save_only_model))
        finally:
            self._in_train = False
        seconds = time.perf_counter() - t0
        self.state.global_step = result.step
        # every rank leaves train() once rank 0 has written the last checkpoint and let go of output_dir: a script's
        # next save there on every rank (model.save_pretrained(args.output_dir), unguarded, as transformers' scripts
        # save) would otherwise find it held and stop, and load_best_model_at_end reads that checkpoint
        agree(True, "training")
        if args.load_best_model_at_end and self.state.best_model_checkpoint is not None:
            load_model_state(self._module, checkpoint_weights(Path(self.state.best_model_checkpoint)))
        loss = result.train_loss
        done = result.step - start_step
        metrics = {"train_runtime": seconds, "train_samples_per_second": done * accum * plan.batch_size * info.world_size
                   / max(seconds, 1e-9), "train_steps_per_second": done / max(seconds, 1e-9), "train_loss": loss}
        self.log(metrics)
        self._event("on_train_end")
        return TrainOutput(result.step, loss, metrics)

    _train_start = _tokens_at_start = 0  # train()'s clock and state.num_input_tokens_seen when it began
    _schedule_steps: int | None = None  # the schedule's length, where it is not the run's (loop.LoopHooks)
    _trained = False  # a train() call has reached the loop (and built an optimiser transformers would keep)
    _grouped: LengthGroupedOrder | None = None  # group_by_length's order, drawn as each epoch begins
    _reads_sampling_strategy = True  # sentence-transformers' trainers never read train_sampling_strategy

    def _parameter_groups(self) -> list[dict] | None:
        """The optimiser's parameter groups; None: the loop's (the model's, at one rate, transformers' decay rule)."""
        return None

    def _transformers_files(self) -> bool | OptimizerLayout:
        """Checkpoints hold transformers' Trainer's resume files, in the loop's groups (transformers' own)."""
        return True

    def _fingerprint(self, examples: Sequence, total: int, world_size: int) -> dict[str, Any]:
        """What a resumed run must share with the run it continues, beside the loop's settings: the training data's
        content (``data_fingerprint``), the model's config and the collator's settings."""
        args = self.args
        config = getattr(self._module, "config", None)
        # its settings, not its tokenizer, nor private state (a seeded collator's _generator_pid differs on resume)
        collator = {k: v for k, v in sorted(getattr(self.data_collator, "__dict__", {}).items())
                    if isinstance(v, (bool, int, float, str, type(None))) and not k.startswith("_")}
        return {"trainer": {
            "examples": len(examples), "train_data": self._data_fingerprint(examples),
            "per_device_train_batch_size": args.per_device_train_batch_size,
            "world_size": world_size, "max_steps": total, "train_sampling_strategy": args.train_sampling_strategy,
            "data_seed": args.data_seed, "label_names": self.label_names,
            **({"drop_last": True} if args.dataloader_drop_last else {}),  # (absent: a checkpoint from before it)
            # it changes every loss and gradient (absent when off, as checkpoints from before it was recorded are)
            **({"label_smoothing_factor": args.label_smoothing_factor} if args.label_smoothing_factor else {}),
            **({"lr_scheduler_kwargs": args.lr_scheduler_kwargs} if args.lr_scheduler_kwargs else {}),  # (as above)
            "data_collator": {type(self.data_collator).__qualname__: collator},
            "model": config.to_dict() if hasattr(config, "to_dict") else None}}

    def _data_fingerprint(self, examples: Sequence) -> Any:
        """The training examples' content, as the model is fed them (``trainer_data.data_fingerprint``)."""
        return trainer_data.data_fingerprint(examples)

    def _new_state(self, total: int, per_epoch: int, resume: Path | None) -> TrainerState:
        """The run's TrainerState; resuming, as the checkpoint saved it."""
        info = current()
        state = TrainerState(max_steps=total, num_train_epochs=-(-total // per_epoch),  # the epochs begun, as transformers
                             train_batch_size=self.args.per_device_train_batch_size,
                             is_local_process_zero=info.local_rank == 0, is_world_process_zero=info.is_main)
        args = self.args  # eval_steps unset under eval_strategy "steps" is logging_steps, as transformers sets it
        cadences = {"logging_steps": args.logging_steps, "save_steps": args.save_steps,
                    "eval_steps": args.eval_steps or (args.logging_steps if args.eval_strategy == "steps" else None)}
        for name, value in cadences.items():
            if value is not None:
                setattr(state, name, args.steps_of(value, total))
        if resume is not None:
            saved = read_json_object(resume / TRAINER_STATE, "resume from an earlier checkpoint by its path")
            for key in ("log_history", "best_metric", "best_global_step", "best_model_checkpoint", "global_step",
                        "epoch"):
                setattr(state, key, saved.get(key))
            state.num_input_tokens_seen = saved.get("num_input_tokens_seen") or 0  # (absent: written before it was)
            restore_callback_states(self.callbacks, saved.get("stateful_callbacks") or {})
        return state

    def _resume_point(self, out: Path, resume: str | Path | bool | None) -> Path | None:
        """The checkpoint to continue from: the one named, or for True the newest whole one in output_dir (with
        state.pt and trainer_state.json: a stray or emptied directory is passed over, with a warning)."""
        if resume is None or resume is False:
            return None
        if resume is True:
            found = HF_LAYOUT.dirs(out)
            whole = [p for p in found if (p / STATE_FILE).is_file() and (p / TRAINER_STATE).is_file()]
            for path in (found[found.index(whole[-1]) + 1:] if whole else found)[::-1]:
                refuse_model_only(path)  # the newest written with save_only_model, unless a whole one is newer
            refuse_foreign_checkpoints(out, whole[-1] if whole else None)
            if not whole:
                raise BertkitError(f"resume_from_checkpoint=True, but {out} holds no checkpoint-N directory with "
                                   f"{STATE_FILE} and {TRAINER_STATE} to resume from ({len(found)} without them); "
                                   "train without it into another output_dir, or give a checkpoint directory")
            skipped = [p.name for p in found[found.index(whole[-1]) + 1:]]
            if skipped:
                logger.warning("resuming from %s, the newest whole checkpoint; skipped %s (it has no %s or %s: not a "
                               "checkpoint bertkit wrote whole)", whole[-1], ", ".join(skipped), STATE_FILE,
                               TRAINER_STATE)
            return whole[-1]
        if isinstance(resume, (str, Path)):
            refuse_model_only(Path(resume))
        path = named_checkpoint(resume)
        if path.resolve().parent != out.resolve():
            raise BertkitError(f"resume_from_checkpoint {path} is not in output_dir {out}; set output_dir to the "
                               "directory that holds it, so the run continues where it was written")
        refuse_foreign_checkpoints(out, path)
        return path

    # -- the loop's hooks ------------------------------------------------------------------------------------
    def _loop_event(self, name: str, pos: Position) -> None:
        """on_<name> at the loop's point where transformers calls it; the step and epoch move at a step's end."""
        if name == "step_end":
            self.state.global_step = pos.step
            # transformers' DefaultFlowCallback, the first callback, sets it at this point
            self.control.should_log |= self.args.logging_first_step and pos.step == 1
            self.state.epoch = pos.epoch + pos.batch / self._micro_per_epoch
        if name == "save":  # every rank (rank 0 named it already, writing the state): load_best_model_at_end on each
            self._name_best_checkpoint()
        if name == "epoch_begin" and pos.batch == 0:  # not where a resumed epoch goes on: it drew at its start
            trainer_data.loader_draw()
            if self._grouped is not None:
                self._grouped.begin_epoch(pos.epoch)
        self._event(f"on_{name}")
        # where transformers evaluates it: after on_train_begin, through evaluate(); a resumed run has it in the
        # log it continues
        if name == "train_begin" and self.args.eval_on_start and pos.step == 0:
            self.evaluate(ignore_keys=self._ignore_keys_for_eval)

    def _on_record(self, record: dict) -> None:
        step = record["step"]
        if record["split"] == "train":
            norm = {"grad_norm": record["grad_norm"]} if "grad_norm" in record else {}
            logs = {"loss": record["loss"], **norm, "learning_rate": record["lr"]}
            # the clock only where it is read: a log(self, logs) override written before it was passed still runs
            if self.args.include_num_input_tokens_seen != "no":
                self.log(logs, self._train_start)
            else:
                self.log(logs)
            return
        metrics = {k: v for k, v in record.items() if k.startswith("eval_")}
        logged = self._evaluate_overridden()  # then every evaluation in the loop was the override's, logged by it
        for part in [] if logged else self._by_eval_set(metrics):  # transformers logs each set's evaluation apart
            self.log(part)
            self._event("on_evaluate", metrics=part)
        name = self.args.metric_for_best_model
        value = best_metric_value(name, metrics, step) if name is not None else None
        if logged and name is not None and value is None:  # the check before training could not run the override
            raise BertkitError(f"metric_for_best_model {name!r} is not in the metrics {type(self).__name__}.evaluate "
                               f"returned at step {step} ({sorted(metrics)}); return it from evaluate(), or name one "
                               "of those")
        if value is not None:
            if not math.isfinite(value):  # a NaN compares as neither better nor worse: it is never the best
                logger.warning("%s is %s at step %d: this evaluation cannot be the best; the best stays %s",
                               metric_key(name), value, step, self.state.best_model_checkpoint)
                return
            better = (value > self.state.best_metric if self.args.greater_is_better else value < self.state.best_metric) \
                if self.state.best_metric is not None else True
            if better:
                self.state.best_metric = value
                if self.args.save_strategy != "no":  # as transformers: the step of a checkpoint that may be written
                    self.state.best_global_step = step

    def _is_best(self, path: Path) -> bool:
        return self.state.best_model_checkpoint is not None and Path(self.state.best_model_checkpoint).name == path.name

    def _name_best_checkpoint(self) -> None:
        best = self.state.best_global_step
        if best is not None and (best == self.state.global_step
                                 or HF_LAYOUT.path(Path(self.args.output_dir), best).is_dir()):
            self.state.best_model_checkpoint = str(HF_LAYOUT.path(Path(self.args.output_dir), best))

    def _write_checkpoint_extras(self, directory: Path) -> None:
        """The tokenizer and trainer_state.json, before the checkpoint is renamed into place. The best checkpoint is
        named as transformers names it when it saves: the best step's once it exists; an evaluation at a step without
        one (eval_steps 5, save_steps 10) names none: load_best_model_at_end and save_total_limit count on no other."""
        self._name_best_checkpoint()
        if self.processing_class is not None and hasattr(self.processing_class, "save_pretrained"):
            self.processing_class.save_pretrained(directory)
        self.state.stateful_callbacks = callback_states(self.callbacks, self.control)
        self.state.save_to_json(directory / TRAINER_STATE)  # as transformers writes a checkpoint's
        if self._grouped is not None:
            self._grouped.save(directory)
        if current().world_size == 1:
            trainer_data.save_collator_rng(self.data_collator, directory)

    def save_model(self, output_dir: str | Path | None = None, _internal_call: bool = False) -> None:
        """The model (config.json, model.safetensors) and the tokenizer, in the Hugging Face layout."""
        if not current().is_main:  # under torchrun rank 0 writes, as transformers' Trainer does
            return
        directory = Path(output_dir if output_dir is not None else self.args.output_dir)
        refuse_non_directory(directory, "save_model")
        directory.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(directory)
        if self.processing_class is not None and hasattr(self.processing_class, "save_pretrained"):
            self.processing_class.save_pretrained(directory)


def _fp16(requested: bool, device: str) -> bool:
    """fp16 autocast on a GPU only; on a CPU fp32, as transformers' Trainer (float16 CPU kernels ran a MiniLM step
    31x slower than fp32 on an AVX2 CPU, 1.4x even with AVX512-FP16)."""
    if not requested or torch.device(device).type != "cpu":
        return requested
    logger.warning("fp16=True on the CPU: training runs in fp32, as transformers' Trainer does there (float16 "
                   "autocast is slower than fp32 on CPUs); %s", "for reduced precision here use bf16=True, which "
                   "this CPU runs in hardware" if cpu_has_bf16() else "drop fp16")
    return False
