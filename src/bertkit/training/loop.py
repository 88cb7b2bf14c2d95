"""One training loop for pre-training and fine-tuning: deterministic, resumable bit for bit, logged.

The loop owns the optimiser, the schedule, accumulation and clipping, autocast, ``metrics.jsonl``, periodic
evaluation and atomic checkpoints; callers own the model, the data and the evaluation. Data order is a pure
function of (seed, epoch) (``BatchPlan``), so with the model, optimiser, scheduler and RNG states a checkpoint's
position (phase, epoch, batch) lets ``resume=True`` continue to exactly an uninterrupted run's weights (on CPU).
A run is a list of ``Phase`` objects under one learning-rate schedule: fine-tuning is one, the paper's
pre-training two (128 tokens, then 512).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from bertkit._hardware import resolve_device
from bertkit._parallel import DistInfo
from bertkit.settings import TrainingSettings
from bertkit.training.batch_plan import Batch, BatchPlan, epoch_loader
from bertkit.training.callbacks import TrainerControl
from bertkit.training.checkpoint import (
    STEP_LAYOUT,
    CheckpointLayout,
    OptimizerLayout,
    load_model_state,
    load_optimizer_state,
    model_state,
    optimizer_parameters,
    restore_rank_state,
    rng_state,
    save_checkpoint,
)
from bertkit.training.distributed import accumulating, all_gather, any_rank, current, replicate
from bertkit.training.divergence import nonfinite_weights, stopped
from bertkit.training.optim import optimisation
from bertkit.training.resume_point import checkpoint_to_resume, finish_removals
from bertkit.training.run_log import RunLog
from bertkit.training.run_setup import (
    cadence,
    check_phases,
    compile_encoders,
    computed_on,
    prepare_model,
    run_fingerprint,
    warn_if_moved,
)
from bertkit.training.seeding import seed_process
from bertkit.training.step_reads import LogWindow, MicroLoss, read_step
from bertkit.training.token_loss import item_counter, loss_to_log, model_loss, objective, step_targets

logger = logging.getLogger("bertkit")


@dataclass
class Phase:
    """``steps`` optimiser steps drawn from ``plan`` (epochs repeat as needed)."""

    plan: BatchPlan
    steps: int
    name: str = "train"


@dataclass
class Position:
    step: int = 0  # optimiser steps done
    phase: int = 0
    epoch: int = 0
    batch: int = 0  # next micro-batch index within the epoch
    skipped: int = 0  # optimiser steps dropped for a non-finite loss or gradient (--skip-nonfinite)


@dataclass
class TrainResult:
    step: int
    history: list[dict] = field(default_factory=list)  # every metrics.jsonl record of this run
    skipped_nonfinite: int = 0
    # the mean loss of the steps this call trained (not a resumed run's earlier ones), logged or not (a callback's
    # should_training_stop ends a run between logs), as transformers' Trainer reports train_loss; 0.0 for no step
    train_loss: float = 0.0

    @property
    def last_eval(self) -> dict | None:
        """The newest evaluation's metrics (after a resume, perhaps one the interrupted run made)."""
        evals = [r for r in self.history if r["split"] == "eval"]
        return {k: v for k, v in evals[-1].items() if k not in ("split", "step", "epoch")} if evals else None


@dataclass
class LoopHooks:
    """What ``bertkit.Trainer`` adds to the loop. ``write_extra(dir)`` adds files to a checkpoint before it is
    renamed into place; ``protect(path)`` marks one ``save_total_limit`` must keep (the best); ``on_record`` sees
    every logged record; ``event(name, position)`` is called where transformers calls ``on_<name>``;
    ``param_groups``: the optimiser's (``optim.parameter_groups``; by default the model's, at one rate).
    ``schedule_steps``: the learning-rate schedule's length where it is not the run's (sentence-transformers' ``fit``
    counts it from whole batches); ``schedule_options``: its transformers ``lr_scheduler_kwargs``
    (``optim.schedule_options``). ``compute_loss(module, batch, num_items)``: each micro-batch's loss, outputs and
    whether the loss is normalised over the step's ``num_items`` (``token_loss.model_loss``'s contract), given the
    step's items as ``count_items`` counts them in each micro-batch (None: the labelled tokens, ``target_count``, for
    a model whose forward takes ``num_items_in_batch``).

    ``control`` follows transformers' rules: at a step's (or epoch's) end the loop sets the flags its strategies
    call for, calls ``event``, then logs, evaluates and saves as the flags then say, clearing each as it acts."""

    layout: CheckpointLayout = STEP_LAYOUT
    write_extra: Callable[[Path], None] | None = None
    protect: Callable[[Path], bool] | None = None
    on_record: Callable[[dict], None] | None = None
    event: Callable[[str, Position], None] | None = None
    control: TrainerControl = field(default_factory=TrainerControl)
    param_groups: list[dict] | None = None
    schedule_steps: int | None = None
    schedule_options: dict[str, Any] | None = None
    compute_loss: Callable[[nn.Module, Batch, Any], tuple[Tensor, Any, bool]] = model_loss
    count_items: Callable[[Batch], int | None] | None = None
    # checkpoints the reference's trainer resumes too: True, transformers' (checkpoint.save_checkpoint); a layout,
    # sentence-transformers' (checkpoint.OptimizerLayout)
    transformers_files: bool | OptimizerLayout = False
    model_only: bool = False  # checkpoints of the model alone (transformers' save_only_model): no run resumes them
    # the caller seeded this process when it was made (``seeding.seed_generators``), as transformers' Trainer seeds:
    # a fresh run trains on from the generators as they are, so what was drawn since (an evaluate(), the user's
    # draws) moves its dropout as it moves transformers'
    seeded: bool = False


def train(
    model: nn.Module,
    phases: list[Phase],
    args: TrainingSettings,
    *,
    evaluate: Callable[[nn.Module], dict[str, float]] | None = None,
    batch_metrics: Callable[[Batch, Any], dict[str, tuple[float, float]]] | None = None,
    fingerprint: dict[str, Any] | None = None,
    resume: bool | Path = False,
    hooks: LoopHooks | None = None,
) -> TrainResult:
    """Train ``model`` (whose forward returns an object with ``.loss``) through ``phases``.

    ``evaluate(model)`` returns held-out metrics; ``batch_metrics(batch, output)`` extra training scalars as
    (sum, count) by name, each logged as its sum over its count in the logging window. ``fingerprint`` adds caller
    facts (model config, data) that ``resume`` (True: the newest checkpoint, or one directory) must find unchanged.

    Under torchrun every rank calls this with plans built for its rank (``BatchPlan(rank=, world_size=)``); the
    model is replicated (DDP), rank 0 alone writes, and ``evaluate`` runs on every rank.
    """
    hooks = hooks or LoopHooks()
    run = _Run.start(model, phases, args, evaluate, batch_metrics, fingerprint, resume, hooks)
    pos, control = run.pos, hooks.control
    while pos.phase < len(phases) and not control.should_training_stop:
        phase = phases[pos.phase]
        phase_end = sum(p.steps for p in phases[: pos.phase + 1])
        # `or pos.batch >= len(plan)`: a run resumed from a checkpoint written at an epoch's last batch still
        # owes that epoch's end (its evaluation), also when that batch was the phase's last step: an
        # uninterrupted run evaluates there before it switches phase
        while (pos.step < phase_end or pos.batch >= len(phase.plan)) and not control.should_training_stop:
            run.run_epoch(phase, phase_end)
        if not control.should_training_stop:
            pos.phase += 1
            if pos.phase < len(phases):  # the next phase starts its own epochs; past the last, the run's end stays
                pos.epoch, pos.batch = 0, 0  # where it was: the epoch of the final evaluation a resumed run owes
    return run.finish()


@dataclass
class _Run:
    """What one ``train`` call holds between micro-steps: the model and its optimiser, where the run is (``pos``),
    the logging window (``LogWindow``) and the run's history."""

    args: TrainingSettings
    info: DistInfo
    device: str
    phases: list[Phase]
    total: int
    fingerprint: dict
    model: nn.Module
    module: nn.Module  # what takes the forward and backward passes: the model, or DDP wrapping it
    optimizer: Any
    scheduler: Any
    scaler: Any
    evaluate: Callable | None
    batch_metrics: Callable | None
    pos: Position
    log_file: RunLog
    window: LogWindow = field(default_factory=LogWindow)
    bar: Any = None
    step_micro: int = 0  # micro-batches of the current optimiser step done
    step_size: int = 1  # its micro-batches: gradient_accumulation_steps, or the fewer an epoch has left
    step_shares: list[float] = field(default_factory=list)  # each micro-batch's weight in the step's mean
    spoiled: str | None = None  # why the current optimiser step's gradient cannot be used
    grad_norm: float | None = None  # the last optimiser step's gradient norm, before clipping
    step_lr: float = 0.0  # the learning rate the last optimiser step used (what transformers logs)
    # Token-level losses (masked LM, tagging; the Trainer's loss when it takes transformers' num_items_in_batch) are
    # divided by the labelled items of the whole optimiser step (all micro-batches, all ranks: ``step_targets``), which
    # ``count`` counts in a micro-batch (``LoopHooks.count_items``); None where nothing is counted.
    count: Callable[[Batch], int | None] | None = None
    num_items: float | None = None
    unscored: bool = False  # the current step holds no labelled item (every rank's count is 0)
    hooks: LoopHooks = field(default_factory=LoopHooks)
    pending: list[MicroLoss] = field(default_factory=list)  # this optimiser step's micro-batches, not read yet (settle)
    log_every: int = 1  # the cadence in optimiser steps, from the strategies and step counts (``cadence``)
    eval_every: int | None = None
    save_every: int | None = None
    logged_at: int = 0  # the step of the last train record (a log needs a step after it)
    saved_at: int = -1  # the step of the last checkpoint this run wrote
    delayed: bool = False  # the last evaluation that fell due was held back by eval_delay (so is the run's end's)

    @property
    def control(self) -> TrainerControl:
        return self.hooks.control

    def event(self, name: str) -> None:
        if self.hooks.event is not None:
            self.hooks.event(name, self.pos)

    # -- start: check, build the optimiser, restore a checkpoint or seed a fresh run --------------------------
    @classmethod
    def start(cls, model: nn.Module, phases: list[Phase], args: TrainingSettings, evaluate, batch_metrics,
              fingerprint: dict | None, resume: bool | Path, hooks: LoopHooks) -> _Run:
        info = current()
        out_dir = args.output_dir
        out_dir.mkdir(parents=True, exist_ok=True)
        fingerprint = run_fingerprint(args, fingerprint)
        total = sum(p.steps for p in phases)
        check_phases(args, phases, info)
        device = resolve_device(args.device, info.local_rank)
        prepare_model(model, args, device)
        found = checkpoint_to_resume(out_dir, fingerprint, hooks.layout, resume)
        if found is not None and info.is_main:
            finish_removals(out_dir, hooks.layout, found[0])
        if found is not None:
            load_model_state(model, found[1]["model"])
        module = replicate(model, device)
        optimizer, scheduler, scaler = optimisation(model, args, hooks.schedule_steps or total, device,
                                                      hooks.param_groups, hooks.schedule_options)
        if args.torch_compile:
            compile_encoders(model)
        run = cls(args, info, device, phases, total, fingerprint, model, module, optimizer, scheduler, scaler,
                  evaluate, batch_metrics, Position(), RunLog(out_dir, info.is_main), hooks=hooks,
                  **cadence(args, total))
        if found is not None:
            run.restore(*found)
        else:
            run.begin()
        if args.report_to == "tensorboard":
            run.log_file.open_tensorboard()
        run.bar = _progress(total, run.pos.step, args.progress and info.is_main)
        # the step of the newest train record: an epoch's log comes after a checkpoint written at its last step, so
        # the run resumed there owes it
        run.logged_at = max((r["step"] for r in run.log_file.history if r["split"] == "train"), default=0)
        run.count = hooks.count_items or item_counter(model)
        # on_train_begin where transformers calls it: after the checkpoint's weights are in, before the first window
        run.event("train_begin")
        run.window.t0 = time.perf_counter()
        module.train()
        return run

    def restore(self, path: Path, state: dict) -> None:
        """Continue from the checkpoint at ``path``, metrics.jsonl cut back to the records it found."""
        info = self.info
        load_optimizer_state(self.optimizer, state["optimizer"], optimizer_parameters(self.model, self.optimizer),
                             state.get("optimizer_parameters"))
        self.scheduler.load_state_dict(state["scheduler"])
        self.scaler.load_state_dict(state["scaler"])
        pos = self.pos = Position(**state["position"])
        self.saved_at = pos.step  # a finished run's last checkpoint is this one: not written again at its end
        last = state.get("last_step", {})  # (a checkpoint written before it was kept: its next log has its own)
        self.step_lr, self.grad_norm = last.get("lr", 0.0), last.get("grad_norm")
        written_by = state["world_size"]
        self.window = LogWindow.resumed(restore_rank_state(state, info, self.args.seed, pos.step, self.device),
                                        written_by, info.world_size)
        if info.is_main:
            logger.info("resuming from %s (step %d of %d)", path, pos.step, self.total)
            if written_by != info.world_size:
                logger.warning(
                    "resuming with %d process(es) a run checkpointed with %d: training continues at the same "
                    "sample position (step %d; phase %d, epoch %d, global micro-batch %d), but the ranks' random "
                    "states were re-seeded, so dropout differs from an uninterrupted run", info.world_size,
                    written_by, pos.step, pos.phase, pos.epoch, pos.batch)
            warn_if_moved(state.get("computed_on"), self.device, self.args.bf16)
        self.log_file.resume(pos.step, state.get("records"))

    def begin(self) -> None:
        """Seed a fresh run (unless its caller has: ``LoopHooks.seeded``) and start its metrics.jsonl."""
        if not self.hooks.seeded:
            seed_process(self.args.seed, self.info.rank)
        self.log_file.start()

    # -- one epoch: its remaining micro-batches, then its end ---------------------------------------------------
    def run_epoch(self, phase: Phase, phase_end: int) -> None:
        """The micro-batches of the current epoch from ``pos.batch`` on, until the phase's last step; then the
        epoch's end (also of one ``control`` or the run's last step cuts short, as in transformers)."""
        pos, control = self.pos, self.control
        if pos.batch < len(phase.plan):
            control.should_epoch_stop = False
            self.event("epoch_begin")
        loader = iter(epoch_loader(phase.plan, pos.epoch, pos.batch, self.args.dataloader_num_workers,
                                   torch.device(self.device).type == "cuda"))
        ahead: list[tuple[float, Batch]] = []  # the step's micro-batches not run yet
        step_count = None
        while pos.step < phase_end:
            if not ahead:
                ahead = list(itertools.islice(loader, 1))
                if not ahead:
                    break
                if self.step_micro == 0 and self.count is not None:
                    # a loss may be divided by the step's labelled items: its micro-batches are read now, as
                    # transformers' Trainer reads them, and counted on the host (on a GPU, counting there would wait
                    # for the device); collating one twice would draw a masking collator's masks again
                    ahead += itertools.islice(loader, min(self.args.gradient_accumulation_steps,
                                                          len(phase.plan) - pos.batch) - 1)
                    step_count = step_targets(ahead, self.device, self.count)
            weight, batch = ahead.pop(0)
            if weight > 0:
                self.window.count(batch)
            batch = {k: v.to(self.device, non_blocking=True) if isinstance(v, Tensor) else v for k, v in batch.items()}
            if self.micro_step(phase, weight, batch, step_count):  # the last micro-batch of a step
                self.optimizer_step(phase)
            else:
                self.event("substep_end")
            if control.should_epoch_stop or control.should_training_stop:
                break
        ended = pos.batch >= len(phase.plan)
        if not (ended or control.should_epoch_stop or control.should_training_stop or pos.step >= self.total):
            return  # a phase's last step within an epoch: the next phase starts its own epochs
        # not evaluated before a kill at this step, nor at this step's end
        control.should_log |= self.args.logging_strategy == "epoch"
        control.should_evaluate |= (self.args.eval_strategy == "epoch" and not self.log_file.evaluated_at(pos.step)
                                    and self.past_delay(pos.epoch + pos.batch / len(phase.plan)))
        control.should_save |= (self.args.save_strategy == "epoch" and pos.step < self.total
                                and not control.should_training_stop)
        self.event("epoch_end")
        self.log_and_evaluate(phase)
        if ended or control.should_epoch_stop:
            pos.epoch, pos.batch = pos.epoch + 1, 0  # before the checkpoint: a resumed run starts the next epoch
        self.save_if_due()

    # -- one micro-batch: forward and backward ------------------------------------------------------------
    def micro_step(self, phase: Phase, weight: float, batch: Batch, step_count: int | None) -> bool:
        """Forward and backward one micro-batch (``step_count``: the step's labelled tokens, every rank's,
        ``step_targets``); True when it completes an optimiser step's gradient."""
        args, pos = self.args, self.pos
        if self.step_micro == 0:  # the first micro-batch of an optimiser step
            # an epoch's last step takes the micro-batches the epoch has left, as transformers' does: none carries
            # into the next epoch
            self.step_size = min(args.gradient_accumulation_steps, len(phase.plan) - pos.batch)
            # A per-sequence loss counts by its micro-batch's share of the step's examples where the plan cuts the
            # global batch (--batch-size) itself: an epoch's short last batch is split unevenly (6 + 4 -> 3 + 3 + 3 + 1),
            # and the step must still be its mean. transformers' Trainer (a drawn plan: its per-device batches)
            # averages the step's micro-batch means.
            sizes = [len(c) for c in phase.plan.global_batches(pos.epoch)[pos.batch:pos.batch + self.step_size]]
            self.step_shares = [n * len(sizes) / sum(sizes) if phase.plan.draw is None else 1.0 for n in sizes]
            self.control.should_log = self.control.should_evaluate = self.control.should_save = False
            self.event("step_begin")
            if self.count is not None:
                # a step with no labelled item trains on a loss of 0 (0 / 1: a zero gradient, as transformers'); its
                # log is MicroLoss.unscored's
                self.num_items = None if step_count is None else max(step_count, 1) / self.info.world_size
                self.unscored = step_count == 0
        accum = self.step_size
        rank_weight, weight = weight, weight * self.step_shares[self.step_micro]
        pos.batch += 1
        self.step_micro += 1
        sync = self.step_micro == accum
        if sync:
            self.step_micro = 0
        # Under DDP every rank runs every backward pass, a spoiled one too: skipping one would leave the
        # others waiting in the gradient all-reduce. The step is then dropped on all ranks.
        if self.spoiled is None or self.info.enabled:
            labels = batch.get("labels")  # before the loss, which may pop them (as transformers' examples do)
            with accumulating(self.module, sync):
                with _autocast(args, self.device):
                    loss, out, normalised = self.hooks.compute_loss(self.module, batch, self.num_items)
                part = objective(loss, out, weight, accum, normalised)
                self.scaler.scale(part).backward()
            # The loss stays on the device until the step's end reads it with the gradient norm, in one read: a read
            # waits for the device, and one at every micro-batch left it idle while the host queued the next.
            self.pending.append(MicroLoss(loss.detach(), loss_to_log(loss, normalised, part), rank_weight, labels,
                                       self.batch_metrics(batch, out) if self.batch_metrics and weight > 0 else {},
                                       normalised and self.unscored))
        return sync

    # -- one optimiser step, then what falls due: log, evaluate, save -------------------------------------------
    def optimizer_step(self, phase: Phase) -> None:
        args, pos = self.args, self.pos
        if self.scaler.is_enabled():  # fp16: a step its loss spoils must not be unscaled (update() would not follow)
            self.settle()
        norm = None
        if self.spoiled is None:  # clip (or, with clipping off, only measure) the global gradient norm
            self.scaler.unscale_(self.optimizer)
            norm = _clip_grad_norm(self.model, args.max_grad_norm)
        norm = self.settle(norm)
        if norm is not None and self.spoiled is None:  # (a loss read with it may have spoiled the step)
            self.grad_norm = norm  # the last step's, logged as transformers' Trainer logs it
            # fp16: an overflow is the gradient scaler's to handle (it skips the step, lowers the scale)
            if not (math.isfinite(norm) or args.fp16):
                self.spoiled = f"the gradient norm is {norm}"
        if self.info.enabled and any_rank(self.spoiled is not None, self.device) and self.spoiled is None:
            self.spoiled = "the loss or gradient is not finite on another rank"
        if self.spoiled is not None:
            self._skip(phase)
            return
        self.event("pre_optimizer_step")
        self.scaler.step(self.optimizer)
        self.event("optimizer_step")
        self.scaler.update()
        self.step_lr = self.scheduler.get_last_lr()[0]
        if math.isfinite(norm):  # fp16: a step the scaler skipped (an overflow) leaves the schedule too, as transformers'
            self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        pos.step += 1
        self.bar.update(1)
        control, last = self.control, pos.step == self.total
        # logging_strategy "epoch" logs at the epoch's end (run_epoch), after on_epoch_end as transformers does; so
        # does the run's last step there
        control.should_log |= pos.step % self.log_every == 0 or (last and self.args.logging_strategy != "epoch")
        control.should_evaluate |= (bool(self.eval_every) and (pos.step % self.eval_every == 0 or last)
                                    and self.past_delay(pos.step))
        control.should_save |= bool(self.save_every) and (last or pos.step % self.save_every == 0)
        # the run's last step stops it as transformers' DefaultFlowCallback does, before the callbacks see the step's
        # end: they, and the last checkpoint's TrainerControl entry, read should_training_stop set there
        control.should_training_stop |= last
        self.event("step_end")
        self.log_and_evaluate(phase)
        self.save_if_due()

    def settle(self, norm: Tensor | None = None) -> float | None:
        """Read the pending micro-batches' losses (and ``norm``, the step's gradient norm) in one read
        (``read_step``), then do what each asks: its loss into the logging window, or, the first that is not
        finite, spoil the step (on one process the later ones of a spoiled step count for nothing, as if they had
        not run). Returns the norm as a float."""
        pending, self.pending = self.pending, []
        read = read_step(pending, norm, self.device)
        if read is None:
            return None
        # the window counts steps, each the mean of its micro-batches as it trains on them (``step_shares``), as
        # transformers' Trainer logs (a full step and an epoch's short last one: the mean of the two steps); a
        # per-token loss divided by the step's targets is a part of the step's token mean already. A rank's
        # micro-batch weighs by its share of the global one (``m.weight``), as its gradient does: a short last batch
        # split 2 + 1, or 1 + 0 (a stand-in weighing nothing), logs one process's mean; batch metrics are sums and
        # counts, exact over the ranks as they are. ``pending`` is the current step's micro-batches, from its first.
        for i, (m, (value, loss)) in enumerate(zip(pending, read[0])):
            share = self.step_shares[i] / self.step_size
            if self.spoiled is not None and not self.info.enabled:
                break
            if m.unscored:  # no labelled item in the step on any rank: logged as transformers' Trainer does
                self.window.add_unscored(share, self.pos.step - self.logged_at)
            elif math.isfinite(value):
                self.window.add(loss if m.logged[1] else loss * share * m.weight, share, m.metrics)
            elif not math.isfinite(value) and self.spoiled is None:
                self.spoiled = m.spoiled(loss)
        return read[1]

    def log_and_evaluate(self, phase: Phase) -> None:
        """Log the window and evaluate as ``control`` says (a log needs a step since the last one)."""
        control = self.control
        if control.should_log:
            control.should_log = False
            if self.pos.step > self.logged_at:
                self._log_window(phase)
        if control.should_evaluate:
            control.should_evaluate = False
            self.run_eval()

    def save_if_due(self) -> None:
        if self.control.should_save:
            self.control.should_save = False
            self.checkpoint()

    def _skip(self, phase: Phase) -> None:
        """Drop a step whose loss or gradient is not finite, or stop when --skip-nonfinite is used up."""
        pos = self.pos
        where = f"step {pos.step + 1} ({phase.name}, epoch {pos.epoch}, batch {pos.batch - 1})"
        self.optimizer.zero_grad(set_to_none=True)
        if pos.skipped >= self.args.skip_nonfinite:
            raise stopped(where, self.spoiled, self._last_good(), rate_advice="-100" not in self.spoiled, skippable=True)
        pos.skipped += 1
        logger.warning("skipped %s: %s (%d of at most %d)", where, self.spoiled, pos.skipped, self.args.skip_nonfinite)
        self.spoiled = None

    def _log_window(self, phase: Phase) -> None:
        pos = self.pos
        self.settle()  # a callback's should_epoch_stop may end an epoch inside an optimiser step: its micro-batches
        record = {"split": "train", "step": pos.step, "epoch": pos.epoch, "phase": phase.name, "lr": self.step_lr,
                  **self.window.take()}
        if self.grad_norm is not None:
            record["grad_norm"] = self.grad_norm
        if pos.skipped:
            record["skipped_nonfinite"] = pos.skipped
        self.log(record)
        self.bar.set_postfix(loss=f"{record['loss']:.4f}")
        self.logged_at = pos.step

    def log(self, record: dict) -> None:
        self.log_file.write(record)
        if self.hooks.on_record is not None:
            self.hooks.on_record(record)

    def past_delay(self, progress: float) -> bool:
        """Whether an evaluation due at ``progress`` (steps, or epochs for eval_strategy epoch) is past eval_delay."""
        self.delayed = progress < self.args.eval_delay
        return not self.delayed

    def run_eval(self) -> None:
        if self.evaluate is None:
            return
        self.model.eval()
        with torch.no_grad(), _autocast(self.args, self.device), self.window.paused():
            metrics = self.evaluate(self.model)
        self.model.train()
        self.log({"split": "eval", "step": self.pos.step, "epoch": self.pos.epoch, **metrics})
        if self.info.is_main:
            logger.info("eval at step %d: %s", self.pos.step, ", ".join(
                f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}" for k, v in metrics.items()))

    def _last_good(self) -> str:
        last = self.hooks.layout.dirs(self.args.output_dir)
        return str(last[-1]) if last else "none (no checkpoint written yet)"

    def _refuse_nonfinite_weights(self) -> None:
        """A finite loss and gradient whose update leaves a weight NaN or infinite (a rate far too high) is a step
        spoiled as a NaN loss is: stopped naming the step and the last good checkpoint. The save would otherwise
        refuse the weights with save_pretrained's words ("save a model whose weights are finite"), naming neither.
        Every rank checks its own copy (they are equal), so all stop together."""
        bad = nonfinite_weights(self.model)
        if bad:
            raise stopped(f"step {self.pos.step}", f"its update left {len(bad)} weight tensor(s) NaN or infinite "
                          f"({', '.join(bad[:3])}{', ...' if len(bad) > 3 else ''}), though its loss and gradient "
                          "were finite", self._last_good(), skippable=False)

    def checkpoint(self) -> None:
        """Write the checkpoint of this step (rank 0), then ``event("save")``."""
        self.settle()
        self._refuse_nonfinite_weights()
        rng = all_gather(rng_state(self.device))
        windows = all_gather(self.window.saved())
        with self.window.paused():  # not training time: the next window's rows per second are the steps'
            if self.info.is_main:
                limit = self.args.save_total_limit  # None, 0 or below: keep every checkpoint, as transformers reads it
                save_checkpoint(self.args.output_dir, {
                    "model": model_state(self.model), "optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
                    "optimizer_parameters": optimizer_parameters(self.model, self.optimizer),
                    "scaler": self.scaler.state_dict(), "rank_rng": rng, "world_size": self.info.world_size,
                    "computed_on": computed_on(self.device),  # the CPU class and threads: a resume elsewhere warns
                    "position": dataclasses.asdict(self.pos), "fingerprint": self.fingerprint,
                    "windows": windows,  # partial logging-window sums: resumed logs equal uninterrupted ones
                    # what the step's log reports, for a log after the checkpoint (an epoch's, at its end)
                    "last_step": {"lr": self.step_lr, "grad_norm": self.grad_norm},
                    "records": len(self.log_file.history),  # metrics.jsonl's, which a resume cuts back to
                }, self.pos.step, limit if limit is not None and limit > 0 else 2**62, self.model, layout=self.hooks.layout,
                    write_extra=self.hooks.write_extra, protect=self.hooks.protect,
                    transformers_files=self.hooks.transformers_files, model_only=self.hooks.model_only)
        self.saved_at = self.pos.step
        self.event("save")

    def finish(self) -> TrainResult:
        self.bar.close()
        step = self.pos.step
        # a run a callback ended early (should_training_stop, or epochs cut by should_epoch_stop) stops where it is,
        # as transformers' does: evaluated and saved there only when its schedule says so (an "epoch" save at the cut
        # epoch's end is made here), not as at the run's last step, whose evaluation could become the best
        ended = step >= self.total
        if (ended and self.args.eval_strategy != "no" and self.evaluate is not None
                and not self.log_file.evaluated_at(step) and not self.delayed):
            self.run_eval()
        if self.args.save_strategy != "no" and self.saved_at != step and (ended or self.args.save_strategy == "epoch"):
            self.checkpoint()
        self.log_file.close()
        return TrainResult(self.pos.step, self.log_file.history, self.pos.skipped, self.window.train_loss())


def _clip_grad_norm(module: nn.Module, max_norm: float) -> Tensor:
    """Clip the global gradient norm of ``module.clipped_parameters()`` where it names them (a sentence loss: the
    model's), else of all; returns the norm before clipping, on the device (read with the losses)."""
    params = getattr(module, "clipped_parameters", module.parameters)()
    return torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm > 0 else math.inf)


def _autocast(args: TrainingSettings, device: str):
    """bf16 or fp16 autocast (fp16 pairs with the GradScaler in ``train``); weights stay fp32."""
    return torch.autocast(torch.device(device).type, dtype=torch.float16 if args.fp16 else torch.bfloat16,
                          enabled=args.bf16 or args.fp16)


def _progress(total: int, initial: int, enabled: bool):
    from bertkit.progress import progress_bar

    return progress_bar(total=total, initial=initial, enabled=enabled, unit="step", dynamic_ncols=True)

