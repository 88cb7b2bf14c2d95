"""One training loop for pre-training and fine-tuning: deterministic, resumable bit for bit, logged.

The loop owns the optimiser, the schedule, gradient accumulation and clipping, bf16 autocast, logging to
``metrics.jsonl``, periodic evaluation and atomic checkpoints; callers own the model, the data and the
evaluation. Data order is a pure function of (seed, epoch) through ``BatchPlan``, so a checkpoint only
needs to remember *where* it was: (phase, epoch, batch). With the model, optimiser, scheduler and RNG
states that is enough for ``resume=True`` to continue with exactly the losses and weights an
uninterrupted run would have produced (on CPU; GPU kernels may not be bitwise deterministic).

A run is a list of ``Phase`` objects run back to back under one learning-rate schedule: fine-tuning is
one phase; the paper's pre-training is two (90% of steps at 128 tokens, then 512; appendix A.2).
"""

from __future__ import annotations

import dataclasses
import errno
import json
import logging
import math
import os
import random
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from bertkit._hardware import warn_if_bf16_is_emulated
from bertkit.errors import BertkitError, NonFiniteError
from bertkit.outputs import (
    atomic_write_text,
    fsync_dir,
    owns,
    register,
    register_append,
    register_scratch,
    register_tree,
    remove_owned_tree,
)
from bertkit.settings import TrainingSettings
from bertkit.training.distributed import (
    DistInfo,
    Replicas,
    all_gather,
    any_rank,
    current,
    resolve_device,
    sum_over_ranks,
)
from bertkit.training.optim import build_optimizer, linear_warmup_decay, warmup_steps_for

logger = logging.getLogger("bertkit")

Batch = dict[str, Tensor]
STATE_FILE = "state.pt"


def micro_batch_size(global_batch: int, world_size: int, grad_accum: int) -> int:
    """Sequences each process feeds per micro-step: the global batch split over processes and accumulation."""
    per, rest = divmod(global_batch, world_size * grad_accum)
    if rest or per < 1:
        raise BertkitError(
            f"--batch-size {global_batch} (global) does not split evenly over {world_size} process(es) x "
            f"{grad_accum} gradient-accumulation step(s); choose a batch size divisible by {world_size * grad_accum}"
        )
    return per


class BatchPlan:
    """Which examples make up each micro-batch of each epoch: a pure function of (seed, epoch).

    ``dataset`` is any sequence of examples; ``collate`` turns a list of them into a batch of tensors.
    Datasets that draw something per epoch (dynamic masking) get ``set_epoch(epoch)`` before use.

    With several processes (``world_size`` > 1) the epoch's order is cut into *global* micro-batches of
    ``batch_size x world_size`` examples, and process ``rank`` reads its contiguous slice of each: the
    union over the ranks is exactly the epoch, and 2 processes x 16 see the examples 1 process x 32 sees,
    micro-step for micro-step. A short last batch is split as evenly as it goes (sizes differ by at most
    one; a rank may get none when it is shorter than ``world_size``). ``len(plan)`` counts global micro-batches.
    """

    def __init__(self, dataset: Sequence, batch_size: int, collate: Callable[[list], Batch], *,
                 seed: int, shuffle: bool = True, drop_last: bool = False, rank: int = 0, world_size: int = 1,
                 order: Callable[[int], Sequence[int]] | None = None):
        if batch_size < 1:
            raise BertkitError(f"batch_size must be >= 1, got {batch_size}")
        if len(dataset) == 0:
            raise BertkitError("the training data is empty: there is nothing to train on")
        if not 0 <= rank < world_size:
            raise BertkitError(f"rank {rank} is not in [0, world_size {world_size})")
        self.dataset, self.batch_size, self.collate = dataset, batch_size, collate
        self.shuffle, self.seed, self.drop_last = shuffle, seed, drop_last
        self.rank, self.world_size = rank, world_size
        # ``order(epoch)``: the epoch's permutation of the examples, for a caller that must reproduce another
        # library's order (bertkit.Trainer: transformers' seeded RandomSampler); still a pure function of epoch
        self.order = order

    def __len__(self) -> int:
        n, per_step = len(self.dataset), self.batch_size * self.world_size
        return n // per_step if self.drop_last else math.ceil(n / per_step)

    def global_batches(self, epoch: int) -> list[list[int]]:
        """Every rank's examples of each micro-step of ``epoch`` (one list per global micro-batch)."""
        n, per_step = len(self.dataset), self.batch_size * self.world_size
        if self.order is not None:
            order = [int(i) for i in self.order(epoch)]
        elif self.shuffle:
            order = torch.randperm(n, generator=torch.Generator().manual_seed(self.seed * 100_003 + epoch)).tolist()
        else:
            order = list(range(n))
        return [order[i:i + per_step] for i in range(0, len(self) * per_step, per_step)]

    def shard(self, chunk: list[int], rank: int | None = None) -> list[int]:
        """``rank``'s contiguous slice of one global micro-batch (this plan's rank by default)."""
        rank = self.rank if rank is None else rank
        base, extra = divmod(len(chunk), self.world_size)
        start = rank * base + min(rank, extra)
        return chunk[start:start + base + (rank < extra)]

    def batches(self, epoch: int) -> list[list[int]]:
        """This rank's micro-batches of ``epoch`` (all of them in one process)."""
        return [self.shard(chunk) for chunk in self.global_batches(epoch)]

    def load(self, epoch: int, indices: list[int]) -> Batch:
        if hasattr(self.dataset, "set_epoch"):
            self.dataset.set_epoch(epoch)
        return self.collate([self.dataset[i] for i in indices])


class EpochBatches(torch.utils.data.Dataset):
    """Micro-batch ``i`` of one epoch for this rank, as ``(weight, batch)``: what the DataLoader's workers make.

    ``weight`` = this rank's share of the global micro-batch x world_size: 1.0 whenever the batch splits
    evenly, so DDP's average of the ranks' losses is the mean over the global batch. A rank whose share of a
    short last batch is empty gets one example of it at weight 0 (its backward pass must still take part in
    the gradient all-reduce; it adds nothing to the gradient).
    """

    def __init__(self, plan: BatchPlan, epoch: int):
        self.plan, self.epoch, self.chunks = plan, epoch, plan.global_batches(epoch)

    def __len__(self) -> int:
        return len(self.chunks)

    def __getitem__(self, i: int) -> tuple[float, Batch]:
        chunk = self.chunks[i]
        mine = self.plan.shard(chunk)
        return len(mine) * self.plan.world_size / len(chunk), self.plan.load(self.epoch, mine or chunk[:1])


def _unbatched(item: Any) -> Any:
    return item  # EpochBatches items are whole batches already (a module-level function: workers pickle it)


def epoch_loader(plan: BatchPlan, epoch: int, start: int, num_workers: int, pin_memory: bool
                 ) -> torch.utils.data.DataLoader:
    """Micro-batches ``start``.. of ``epoch`` through a DataLoader: with workers, batches are collated ahead
    of the step (prefetch) while the order stays the plan's, so resume positions are unchanged."""
    return torch.utils.data.DataLoader(
        EpochBatches(plan, epoch), batch_size=None, sampler=range(start, len(plan)), collate_fn=_unbatched,
        num_workers=num_workers, pin_memory=pin_memory, prefetch_factor=4 if num_workers else None,
        # its own generator: a DataLoader iterator otherwise draws its worker seed from the global RNG, which
        # would shift dropout's random stream wherever an epoch starts (and differently after a resume)
        generator=torch.Generator().manual_seed(plan.seed * 100_003 + epoch))


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
    last_eval: dict | None = None
    skipped_nonfinite: int = 0


def steps_for_epochs(plan: BatchPlan, epochs: float, grad_accum: int) -> int:
    return max(1, math.ceil(epochs * len(plan) / grad_accum))


def _to(batch: Batch, device: str) -> Batch:
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


# -------------------------------------------------------------------------------------------------
# Checkpoints
# -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CheckpointLayout:
    """Where checkpoints live: ``OUT/checkpoints/step-00000010`` (the commands'), or ``OUT/checkpoint-10``
    (``HF_LAYOUT``, transformers' Trainer's, which ``bertkit.Trainer`` writes)."""

    subdir: str = "checkpoints"
    prefix: str = "step-"
    digits: int = 8

    def root(self, out_dir: Path) -> Path:
        return out_dir / self.subdir if self.subdir else out_dir

    def path(self, out_dir: Path, step: int) -> Path:
        return self.root(out_dir) / f"{self.prefix}{str(step).zfill(self.digits)}"

    def dirs(self, out_dir: Path) -> list[Path]:
        found = [p for p in self.root(out_dir).glob(f"{self.prefix}*")
                 if p.is_dir() and p.name[len(self.prefix):].isdigit()]
        return sorted(found, key=lambda p: int(p.name[len(self.prefix):]))


STEP_LAYOUT = CheckpointLayout()
HF_LAYOUT = CheckpointLayout(subdir="", prefix="checkpoint-", digits=0)


@dataclass
class LoopHooks:
    """What a caller driving the loop from outside (``bertkit.Trainer``) adds to it; each is off by default.

    ``write_extra(dir)`` adds files (the tokenizer) to a checkpoint before it is renamed into place;
    ``protect(path)`` marks a checkpoint ``save_total_limit`` must keep (the best one); ``on_record(record)``
    sees every train and eval record as it is logged; ``after(kind, position)`` is called after each optimiser
    step's logging, evaluation and saving (kind "step") and at each epoch's end (kind "epoch"), and returns
    True to stop the run there (early stopping); ``save_each_epoch`` checkpoints at every epoch's end;
    ``final_checkpoint`` False writes no checkpoint at the end (transformers' ``save_strategy="no"``)."""

    layout: CheckpointLayout = STEP_LAYOUT
    write_extra: Callable[[Path], None] | None = None
    protect: Callable[[Path], bool] | None = None
    on_record: Callable[[dict], None] | None = None
    after: Callable[[str, Position], bool] | None = None
    save_each_epoch: bool = False
    final_checkpoint: bool = True


def checkpoint_dirs(out_dir: Path, layout: CheckpointLayout = STEP_LAYOUT) -> list[Path]:
    return layout.dirs(out_dir)


def _disk_full(e: BaseException) -> bool:
    # torch's zip writer reports a full disk as "[enforce fail at inline_container.cc] unexpected pos" or
    # "PytorchStreamWriter failed writing file", not as ENOSPC.
    return (isinstance(e, OSError) and e.errno == errno.ENOSPC) or (
        isinstance(e, RuntimeError) and ("unexpected pos" in str(e) or "PytorchStreamWriter failed" in str(e)))


def _save_checkpoint(out_dir: Path, state: dict, step: int, keep: int, model: nn.Module | None = None,
                     hooks: LoopHooks | None = None) -> Path:
    """Write ``state`` (and ``model`` in the Hugging Face layout, for ``from_pretrained``) to a temporary
    directory, fsync, and rename it: a kill mid-write never leaves a partial checkpoint, and a failed write
    (a full disk) leaves the previous checkpoints as they were."""
    hooks = hooks or LoopHooks()
    layout = hooks.layout
    root = layout.root(out_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = layout.path(out_dir, step)
    tmp = root / f".tmp-{final.name}"
    # A temporary directory a kill left: only the files this run (or the run it resumes) recorded are removed;
    # if anything else is there, this checkpoint is written under a fresh name beside it.
    if remove_owned_tree(tmp) or os.path.lexists(tmp):
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{final.name}-", dir=root))
    else:
        tmp.mkdir()
    register_scratch(tmp)  # a kill mid-write leaves it: the run that resumes (or --overwrite) may remove it
    try:
        torch.save(state, tmp / STATE_FILE)
        with open(tmp / STATE_FILE, "rb") as f:
            os.fsync(f.fileno())
        register(tmp / STATE_FILE)  # torch writes it itself: recorded, so a killed run's --overwrite removes it
        if model is not None and hasattr(model, "save_pretrained"):
            model.save_pretrained(tmp)
        if hooks.write_extra is not None:
            hooks.write_extra(tmp)
    except (OSError, RuntimeError, BertkitError) as e:
        shutil.rmtree(tmp, ignore_errors=True)  # made by this call just now (mkdir refuses an existing one)
        if not (_disk_full(e) or (isinstance(e, BertkitError) and isinstance(e.__cause__, OSError)
                                  and _disk_full(e.__cause__))):
            raise
        previous = checkpoint_dirs(out_dir, layout)
        needed = sum(t.numel() * t.element_size() for t in state["model"].values()) * 3  # weights + 2 Adam moments
        free = shutil.disk_usage(root).free
        raise BertkitError(
            f"the disk is full: could not write {tmp / STATE_FILE} (a checkpoint needs about {needed / 1e6:.0f} MB, "
            f"{free / 1e6:.0f} MB are free); the temporary files were removed and the previous checkpoint "
            f"{previous[-1] if previous else '(none)'} is intact: free some space and run again with --resume"
        ) from e
    left = remove_owned_tree(final)  # a checkpoint of this step this run (or the run it resumes) wrote, rewritten
    if os.path.lexists(final):  # files changed since (a damaged checkpoint) or a user's: kept, moved aside
        aside = Path(tempfile.mkdtemp(prefix=f".replaced-{final.name}-", dir=root))
        final.rename(aside / final.name)
        logger.warning("%s held %d file(s) this run cannot prove are its own as written (e.g. %s): moved to %s",
                       final, len(left), ", ".join(left[:3]), aside)
    register_tree(tmp)  # whatever else wrote into it (the extra files of a hook)
    tmp.rename(final)
    fsync_dir(root)
    register_tree(final)  # the same files under their final names
    kept = [p for p in checkpoint_dirs(out_dir, layout) if not (hooks.protect and hooks.protect(p))]
    for old in kept[:-keep]:
        left = remove_owned_tree(old)  # only the files recorded as written by this run or the one it resumes
        if left:
            logger.warning("kept %s: it holds %d file(s) this run did not write (e.g. %s)", old, len(left),
                           ", ".join(left[:3]))
    return final


def _rng_state(device: str) -> dict:
    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.device(device).type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(torch.device(device))
    return state


def _set_rng_state(state: dict, device: str) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.device(device).type == "cuda":
        torch.cuda.set_rng_state(state["cuda"], torch.device(device))


def _read_state(path: Path) -> dict:
    import pickle

    try:
        state = torch.load(path / STATE_FILE, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        raise BertkitError(f"{path / STATE_FILE} holds Python code, not only tensors, so bertkit will not load it "
                           f"(it did not write it): {str(e).splitlines()[0]}") from None
    for key in ("model", "optimizer", "scheduler", "position", "fingerprint"):
        if key not in state:
            raise KeyError(key)
    return state


def _read_checkpoint(out_dir: Path, fingerprint: dict, layout: CheckpointLayout = STEP_LAYOUT,
                     only: Path | None = None) -> tuple[Path, dict]:
    """The newest intact checkpoint (or ``only``); a damaged newest one (a torn write) falls back to the previous."""
    damaged = []
    for path in [only] if only is not None else reversed(checkpoint_dirs(out_dir, layout)):
        try:
            state = _read_state(path)
        except (RuntimeError, EOFError, KeyError, OSError, ValueError) as e:
            if isinstance(e, BertkitError):
                raise
            damaged.append(f"{path / STATE_FILE} ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})")
            logger.warning("checkpoint %s is damaged (%s); falling back to the one before it", path, damaged[-1])
            continue
        break
    else:
        raise BertkitError(f"no intact checkpoint to resume from in {layout.root(out_dir)}: {'; '.join(damaged)}")
    if state["fingerprint"] != fingerprint:
        diff = {k: (state["fingerprint"].get(k), fingerprint.get(k))
                for k in sorted(set(state["fingerprint"]) | set(fingerprint))
                if state["fingerprint"].get(k) != fingerprint.get(k)}
        raise BertkitError(
            f"cannot resume from {path}: it was written by a run with other settings or data "
            f"(field: (checkpoint, now)) {diff}; resume with the original settings and data, or start a new "
            "--output-dir"
        )
    return path, state


def _restore_rank_state(state: dict, info: DistInfo, seed: int, step: int, device: str) -> dict:
    """This rank's RNG state and logging window from a checkpoint; returns the window.

    Same world size: each rank continues with its own RNG state (bit-exact). Another world size: the
    sample position is world-size independent (global micro-batches), but there is no RNG state for the new
    ranks, so each is re-seeded from (seed, rank, step): dropout draws differ from an uninterrupted run.
    """
    ranks = state.get("rank_rng") or [{"torch": state["torch_rng"], "python": state["python_rng"]}]
    windows = state.get("windows") or [state.get("window", {})]
    if len(ranks) == info.world_size:
        _set_rng_state(ranks[info.rank], device)
        return dict(windows[info.rank])
    torch.manual_seed(seed + info.rank + 7919 * step)
    random.seed(seed + info.rank + 7919 * step)
    combined: dict = {}  # every rank's partial logging window, summed on rank 0
    for w in windows if info.is_main else []:
        for k, v in w.items():
            combined[k] = combined.get(k, 0.0) + v
    return combined


# -------------------------------------------------------------------------------------------------
# Token-level losses across micro-batches
# -------------------------------------------------------------------------------------------------


def target_count(batch: Batch) -> int | None:
    """Labelled tokens in ``batch`` when its loss is per token (masked LM, tagging: labels (B, T) like
    input_ids, -100 where no loss); None for a per-sequence loss (classification, regression, spans)."""
    labels, ids = batch.get("labels"), batch.get("input_ids")
    if labels is None or ids is None or labels.shape != ids.shape or labels.is_floating_point():
        return None
    return int((labels != -100).sum())


def step_targets(plan: BatchPlan, epoch: int, batch: int, accum: int, first: Batch, device: str) -> int | None:
    """The labelled tokens of a whole optimiser step: the ``accum`` micro-batches from (epoch, batch) on, every
    rank's, of which ``first`` (this rank's micro-batch at (epoch, batch)) is in hand; None for per-sequence losses.

    A token-averaged loss must be divided by this global count, not averaged per micro-batch: when the
    micro-batches of a step (accumulation, or processes) hold different numbers of targets, a mean of means
    gives the tokens of a sparse micro-batch more weight, and 2 x 16 would not train as 1 x 32. The later
    micro-batches are collated once more here, for their labels (what transformers' Trainer reads ahead for
    ``num_items_in_batch`` too); the count of the step's ranks is one all-reduce."""
    count = target_count(first)
    if count is None:
        return None
    n = len(plan)
    for i in range(1, accum):
        e, b = epoch + (batch + i) // n, (batch + i) % n
        mine = plan.shard(plan.global_batches(e)[b])
        count += target_count(plan.load(e, mine)) if mine else 0
    if first["input_ids"].shape[0] and not plan.shard(plan.global_batches(epoch)[batch]):
        count -= target_count(first)  # an empty share runs one example of the batch at weight 0: not a target
    return sum_over_ranks(count, device)


def _accepts_num_items(model: nn.Module) -> bool:
    import inspect

    module = getattr(model, "module", model)  # DDP wraps the model; FSDP2 shards it in place
    return "num_items_in_batch" in inspect.signature(module.forward).parameters


def _objective(out: Any, weight: float, accum: int, token_level: bool) -> Any:
    """The loss this micro-batch back-propagates. Per-sequence losses: its mean, weighted by the micro-batch's
    share of the global batch (``weight``), over the accumulation steps. Per-token losses were already divided
    by the step's global target count (``num_items_in_batch``), so they are summed as they are; a next-sentence
    part (pre-training) is per sequence and weighted as above."""
    if not token_level:
        return out.loss / accum if weight == 1.0 else out.loss * weight / accum
    if weight == 0:
        return out.loss * 0
    nsp = getattr(out, "nsp_loss", None)
    return out.loss if nsp is None else out.loss + nsp * (weight / accum - 1)


def _logged_loss(out: Any, num_items: float | None, local: int | None) -> float:
    """The micro-batch's mean loss for the logs, whatever normalisation the objective used."""
    if num_items is None:
        return out.loss.item()
    if getattr(out, "mlm_loss", None) is not None:
        nsp = getattr(out, "nsp_loss", None)
        return (out.mlm_loss if nsp is None else out.mlm_loss + nsp).item()  # in the loss's dtype, as its own sum
    return out.loss.item() * num_items / local if local else 0.0


# -------------------------------------------------------------------------------------------------
# The loop
# -------------------------------------------------------------------------------------------------


def train(
    model: nn.Module,
    phases: list[Phase],
    args: TrainingSettings,
    *,
    evaluate: Callable[[nn.Module], dict[str, float]] | None = None,
    batch_metrics: Callable[[Batch, Any], dict[str, float]] | None = None,
    fingerprint: dict[str, Any] | None = None,
    resume: bool | Path = False,
    hooks: LoopHooks | None = None,
) -> TrainResult:
    """Train ``model`` (whose forward returns an object with ``.loss``) through ``phases``.

    ``evaluate(model)`` returns held-out metrics; ``batch_metrics(batch, output)`` returns extra
    per-batch training scalars (accuracies) averaged over each logging window. ``fingerprint`` adds
    caller facts (model config, data) that ``resume`` must find unchanged. Returns the run's history.

    Under torchrun (an initialised process group) every rank calls this with the same arguments and plans
    built for its rank (``BatchPlan(rank=, world_size=)``); the model is replicated (DDP) or sharded
    (``args.fsdp``), rank 0 alone writes metrics.jsonl and checkpoints, and ``evaluate`` runs on every rank.

    ``resume`` may name one checkpoint directory instead of the newest; ``hooks`` (``LoopHooks``) are what
    ``bertkit.Trainer`` adds: its checkpoint layout, callbacks, early stopping and epoch-end saves.
    """
    hooks = hooks or LoopHooks()
    run = _Run.start(model, phases, args, evaluate, batch_metrics, fingerprint, resume, hooks)
    pos = run.pos
    while pos.phase < len(phases) and not run.stopped:
        phase = phases[pos.phase]
        phase_end = sum(p.steps for p in phases[: pos.phase + 1])
        n_batches = len(phase.plan)
        # `or pos.batch >= n_batches`: a run resumed from a checkpoint written at an epoch's last batch still
        # owes that epoch's end (its evaluation), also when that batch was the phase's last step: an
        # uninterrupted run evaluates there before it switches phase
        while (pos.step < phase_end or pos.batch >= n_batches) and not run.stopped:
            for weight, batch in epoch_loader(phase.plan, pos.epoch, pos.batch, run.workers, run.cuda):
                if pos.step >= phase_end or run.stopped:
                    break
                if run.micro_step(phase, weight, _to(batch, run.device)):  # the last micro-batch of a step
                    run.optimizer_step(phase)
            if pos.batch >= n_batches:
                if args.eval_steps is None and not run.evaluated_at(pos.step):  # not done before a kill
                    run.run_eval()
                pos.epoch, pos.batch = pos.epoch + 1, 0
                if hooks.save_each_epoch and pos.step < run.total and not run.stopped:
                    run.checkpoint({**run.window, "_n": run.window_n})
                run.ask_stop("epoch")
        if not run.stopped:
            pos.phase, pos.epoch, pos.batch = pos.phase + 1, 0, 0
    return run.finish()


@dataclass
class _Run:
    """What one ``train`` call holds between micro-steps: the model and its optimiser, where the run is
    (``pos``), the logging window, and the run's history. Its methods are the loop's pieces: restore or
    start (``start``), a micro-step, an optimiser step (with logging, evaluation and saving), the end."""

    args: TrainingSettings
    info: DistInfo
    device: str
    phases: list[Phase]
    total: int
    fingerprint: dict
    model: nn.Module
    replicas: Replicas
    optimizer: Any
    scheduler: Any
    scaler: Any
    evaluate: Callable | None
    batch_metrics: Callable | None
    pos: Position
    history: list[dict]
    window: dict
    board: Any = None
    bar: Any = None
    last_eval: dict | None = None
    window_n: int = 0
    seqs: int = 0
    tokens: int = 0
    t0: float = 0.0
    micro: int = 0
    spoiled: str | None = None  # why the current optimiser step's gradient cannot be used
    # Token-level losses (masked LM, tagging) are divided by the labelled tokens of the whole optimiser step
    # (all micro-batches, all ranks: ``step_targets``) when the model takes transformers' num_items_in_batch.
    token_losses: bool = False
    num_items: float | None = None
    hooks: LoopHooks = field(default_factory=LoopHooks)
    stopped: bool = False  # a hook asked to stop (early stopping)

    @property
    def out_dir(self) -> Path:
        return self.args.output_dir

    @property
    def metrics_path(self) -> Path:
        return self.args.output_dir / "metrics.jsonl"

    @property
    def cuda(self) -> bool:
        return torch.device(self.device).type == "cuda"

    @property
    def workers(self) -> int:
        n = self.args.dataloader_num_workers
        return n if n is not None else (2 if self.cuda else 0)

    # -- start: check, build the optimiser, restore a checkpoint or seed a fresh run --------------------------
    @classmethod
    def start(cls, model: nn.Module, phases: list[Phase], args: TrainingSettings, evaluate, batch_metrics,
              fingerprint: dict | None, resume: bool | Path, hooks: LoopHooks) -> _Run:
        info = current()
        out_dir = args.output_dir
        out_dir.mkdir(parents=True, exist_ok=True)
        fingerprint = {"train": args.fingerprint(), **(fingerprint or {})}
        total = sum(p.steps for p in phases)
        if args.learning_rate is None:
            raise BertkitError("the training loop needs a learning rate (learning_rate is None)")
        for phase in phases:
            if (phase.plan.rank, phase.plan.world_size) != (info.rank, info.world_size):
                raise BertkitError(f"phase {phase.name!r}: its BatchPlan is for rank {phase.plan.rank} of "
                                   f"{phase.plan.world_size} but this process is rank {info.rank} of "
                                   f"{info.world_size}; build plans with rank=/world_size= from "
                                   "bertkit.training.distributed.current()")
        device = resolve_device(args.device, info.local_rank)
        if args.bf16:
            warn_if_bf16_is_emulated(torch.device(device).type)
        if args.gradient_checkpointing:
            encoder = getattr(model, "bert", model)
            if not hasattr(encoder, "gradient_checkpointing"):
                raise BertkitError(f"gradient checkpointing needs a bertkit model; {type(model).__name__} has no "
                                   "encoder with a gradient_checkpointing switch")
            encoder.gradient_checkpointing = True

        existing = checkpoint_dirs(out_dir, hooks.layout)
        state = None
        if isinstance(resume, Path):
            path, state = _read_checkpoint(out_dir, fingerprint, hooks.layout, only=resume)
            model.load_state_dict(state["model"])
        elif resume and existing:
            path, state = _read_checkpoint(out_dir, fingerprint, hooks.layout)
            model.load_state_dict(state["model"])  # before FSDP copies the weights into its shards
        elif existing:
            raise BertkitError(
                f"{out_dir} already holds checkpoints ({existing[-1].name}); pass --resume (resume=True) to "
                "continue that run, or choose another output directory")
        replicas = Replicas(model, device, fsdp=args.fsdp)
        optimizer = build_optimizer(replicas.module, args.optimizer, args.learning_rate, args.weight_decay,
                                    (args.adam_beta1, args.adam_beta2), args.adam_epsilon)
        warmup = args.warmup_steps if args.warmup_steps is not None else warmup_steps_for(total, args.warmup_ratio)
        scheduler = linear_warmup_decay(optimizer, warmup, total, args.lr_scheduler_type)
        scaler = torch.amp.GradScaler(torch.device(device).type, enabled=args.fp16)
        if args.compile:
            encoder = getattr(replicas.eval_module, "bert", replicas.eval_module)
            if not hasattr(encoder, "compile_layers"):
                raise BertkitError(f"compile needs a bertkit model; {type(model).__name__} has no encoder "
                                   "with compile_layers()")
            encoder.compile_layers()

        metrics_path = out_dir / "metrics.jsonl"
        if state is not None:
            replicas.load_optimizer(optimizer, state["optimizer"])
            scheduler.load_state_dict(state["scheduler"])
            if "scaler" in state:
                scaler.load_state_dict(state["scaler"])
            pos = Position(**state["position"])
            window = _restore_rank_state(state, info, args.seed, pos.step, device)
            written_by = state.get("world_size", 1)
            if info.is_main:
                logger.info("resuming from %s (step %d of %d)", path, pos.step, total)
                if written_by != info.world_size:
                    logger.warning(
                        "resuming with %d process(es) a run checkpointed with %d: training continues at the same "
                        "sample position (step %d; phase %d, epoch %d, global micro-batch %d), but the ranks' random "
                        "states were re-seeded, so dropout differs from an uninterrupted run", info.world_size,
                        written_by, pos.step, pos.phase, pos.epoch, pos.batch)
            history = [r for r in _read_jsonl(metrics_path) if r["step"] <= pos.step]  # drop records after it
            if info.is_main:
                _write_jsonl(metrics_path, history)
        else:
            # One seed per rank (seed + rank): the weights are equal on every rank anyway (the caller seeded them
            # and DDP broadcasts rank 0's), but dropout must draw differently on each.
            torch.manual_seed(args.seed + info.rank)
            random.seed(args.seed + info.rank)
            pos, history, window = Position(), [], {}
            if info.is_main:
                if os.path.lexists(metrics_path) and not owns(metrics_path):
                    raise BertkitError(f"{metrics_path} exists and this run did not write it; bertkit does not "
                                       "replace it: pass --resume to continue that run, or choose a new output directory")
                atomic_write_text(metrics_path, "")
        run = cls(args, info, device, phases, total, fingerprint, model, replicas, optimizer, scheduler, scaler,
                  evaluate, batch_metrics, pos, history, window, hooks=hooks)
        run.board = _tensorboard(out_dir) if args.report_to == "tensorboard" and info.is_main else None
        run.bar = _progress(total, pos.step, args.progress and info.is_main)
        run.window_n = int(window.pop("_n", 0))
        run.t0 = time.perf_counter()
        run.token_losses = _accepts_num_items(replicas.module)
        replicas.module.train()
        return run

    # -- one micro-batch: forward and backward ------------------------------------------------------------
    def micro_step(self, phase: Phase, weight: float, batch: Batch) -> bool:
        """Forward and backward one micro-batch; True when it completes an optimiser step's gradient."""
        args, pos, accum = self.args, self.pos, self.args.gradient_accumulation_steps
        pos.batch += 1
        self.micro += 1
        sync = self.micro % accum == 0
        if (self.micro - 1) % accum == 0 and self.token_losses:  # the first micro-batch of an optimiser step
            targets = step_targets(phase.plan, pos.epoch, pos.batch - 1, accum, batch, self.device)
            self.num_items = None if targets is None else max(targets, 1) / self.info.world_size
        # Under DDP/FSDP every rank runs every backward pass, a spoiled one too: skipping one would leave the
        # others waiting in the gradient all-reduce. The step is then dropped on all ranks.
        if self.spoiled is None or self.info.enabled:
            with self.replicas.accumulating(sync):
                with _autocast(args, self.device):
                    out = (self.replicas.module(**batch) if self.num_items is None
                           else self.replicas.module(**batch, num_items_in_batch=self.num_items))
                loss = _logged_loss(out, self.num_items, target_count(batch))
                finite = math.isfinite(out.loss.item())
                if finite or self.info.enabled:
                    self.scaler.scale(_objective(out, weight, accum, self.num_items is not None)).backward()
                if finite and weight > 0:
                    self.window["loss"] = self.window.get("loss", 0.0) + loss
                    for k, v in (self.batch_metrics(batch, out) if self.batch_metrics else {}).items():
                        self.window[k] = self.window.get(k, 0.0) + v
                    self.window_n += 1
                elif not finite and self.spoiled is None:
                    self.spoiled = f"the loss is {loss}"
        if weight > 0:  # throughput: rows and real tokens (a model without input_ids, e.g. the feature
            # study's tagger on activations, marks its rows with attention_mask)
            rows = batch["input_ids"] if "input_ids" in batch else batch["attention_mask"]
            self.seqs += rows.shape[0]
            self.tokens += int(batch["attention_mask"].sum()) if "attention_mask" in batch else rows.numel()
        return sync

    # -- one optimiser step, then what falls due: log, evaluate, save -------------------------------------------
    def optimizer_step(self, phase: Phase) -> None:
        args, pos = self.args, self.pos
        if self.spoiled is None:  # clip (or, with clipping off, only measure) the global gradient norm
            self.scaler.unscale_(self.optimizer)
            norm = _clip_grad_norm(self.replicas.module, args.max_grad_norm)
            # fp16: an overflow is the gradient scaler's to handle (it skips the step, lowers the scale)
            if not (math.isfinite(norm) or args.fp16):
                self.spoiled = f"the gradient norm is {norm}"
        if self.info.enabled and any_rank(self.spoiled is not None, self.device) and self.spoiled is None:
            self.spoiled = "the loss or gradient is not finite on another rank"
        if self.spoiled is not None:
            self._skip(phase)
            return
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        pos.step += 1
        self.bar.update(1)
        if pos.step % args.logging_steps == 0 or pos.step == self.total:
            self._log_window(phase)
        if args.eval_steps and pos.step % args.eval_steps == 0:
            self.run_eval()
        if args.save_steps and pos.step % args.save_steps == 0 and pos.step < self.total:
            self.checkpoint({**self.window, "_n": self.window_n})
        self.ask_stop("step")

    def ask_stop(self, kind: str) -> None:
        if self.hooks.after is not None and self.hooks.after(kind, self.pos):
            self.stopped = True

    def _skip(self, phase: Phase) -> None:
        """Drop a step whose loss or gradient is not finite, or stop when --skip-nonfinite is used up."""
        pos = self.pos
        where = f"step {pos.step + 1} ({phase.name}, epoch {pos.epoch}, batch {pos.batch - 1})"
        self.optimizer.zero_grad(set_to_none=True)
        if pos.skipped >= self.args.skip_nonfinite:
            last = checkpoint_dirs(self.out_dir, self.hooks.layout)
            raise NonFiniteError(
                f"training stopped at {where}: {self.spoiled}. Last good checkpoint: "
                f"{last[-1] if last else 'none (no checkpoint written yet)'}. Lower --learning-rate "
                "(or raise --warmup-ratio) and start again, resume from that checkpoint with --resume, "
                "or pass --skip-nonfinite N to skip up to N such steps; no final model was saved")
        pos.skipped += 1
        logger.warning("skipped %s: %s (%d of at most %d)", where, self.spoiled, pos.skipped, self.args.skip_nonfinite)
        self.spoiled = None

    def _log_window(self, phase: Phase) -> None:
        pos = self.pos
        dt = time.perf_counter() - self.t0
        sums, n, seqs, tokens = _over_ranks(self.window, self.window_n, self.seqs, self.tokens)
        record = {"split": "train", "step": pos.step, "epoch": pos.epoch, "phase": phase.name,
                  "lr": self.scheduler.get_last_lr()[0], **{k: v / n for k, v in sums.items()},
                  "seqs_per_s": seqs / dt, "tokens_per_s": tokens / dt}
        if pos.skipped:
            record["skipped_nonfinite"] = pos.skipped
        self.log(record)
        self.bar.set_postfix(loss=f"{record['loss']:.4f}")
        self.window, self.window_n, self.seqs, self.tokens, self.t0 = {}, 0, 0, 0, time.perf_counter()

    def log(self, record: dict) -> None:
        self.history.append(record)
        if self.hooks.on_record is not None:
            self.hooks.on_record(record)
        if self.info.is_main:
            line = json.dumps(record) + "\n"
            with self.metrics_path.open("a") as f:  # appended, by design: a torn last line is dropped on resume
                f.write(line)
            register_append(self.metrics_path, line.encode())  # its new size and hash: still this run's file
            if self.board is not None:
                for k, v in record.items():
                    if isinstance(v, (int, float)) and k not in ("step", "epoch"):
                        self.board.add_scalar(f"{record['split']}/{k}", v, record["step"])
                self.board.flush()
                _register_board(self.board)

    def evaluated_at(self, step: int) -> bool:
        """Whether the newest record is an evaluation at ``step`` (after a resume: one the interrupted run made)."""
        return bool(self.history) and self.history[-1]["split"] == "eval" and self.history[-1]["step"] == step

    def run_eval(self) -> None:
        if self.evaluate is None:
            return
        module = self.replicas.eval_module
        module.eval()
        with torch.no_grad(), _autocast(self.args, self.device):
            self.last_eval = self.evaluate(module)
        module.train()
        self.log({"split": "eval", "step": self.pos.step, "epoch": self.pos.epoch, **self.last_eval})
        if self.info.is_main:
            logger.info("eval at step %d: %s", self.pos.step, ", ".join(
                f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}" for k, v in self.last_eval.items()))

    def checkpoint(self, window: dict | None = None) -> None:
        model_state, optim_state = self.replicas.state_dicts(self.optimizer)  # every rank: FSDP gathers shards
        rng = all_gather(_rng_state(self.device))
        windows = all_gather(dict(window or {}))
        if not self.info.is_main:
            return
        if self.replicas.fsdp:
            self.model.load_state_dict(model_state)  # the plain copy on rank 0, for the from_pretrained files
        _save_checkpoint(self.out_dir, {
            "model": model_state, "optimizer": optim_state, "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(), "rank_rng": rng, "world_size": self.info.world_size,
            "position": dataclasses.asdict(self.pos), "fingerprint": self.fingerprint,
            "windows": windows,  # partial logging-window sums: resumed logs equal uninterrupted ones
        }, self.pos.step, self.args.save_total_limit, self.model, self.hooks)

    def finish(self) -> TrainResult:
        self.bar.close()
        if self.evaluate is not None and not self.evaluated_at(self.pos.step):
            self.run_eval()
        if self.hooks.final_checkpoint:
            self.checkpoint()
        self.replicas.finish()
        if self.board is not None:
            self.board.close()
            _register_board(self.board)
        return TrainResult(self.pos.step, self.history, self.last_eval, self.pos.skipped)


def _clip_grad_norm(module: nn.Module, max_norm: float) -> float:
    """Clip the global gradient norm (over every rank's shard under FSDP); returns the norm before clipping."""
    norm = torch.nn.utils.clip_grad_norm_(module.parameters(), max_norm if max_norm > 0 else math.inf)
    if hasattr(norm, "full_tensor"):  # a DTensor (FSDP): the norm over all shards
        norm = norm.full_tensor()
    return float(norm)


def _over_ranks(window: dict, n: int, seqs: int, tokens: int) -> tuple[dict, int, int, int]:
    """The logging window summed over the ranks: losses and accuracies become means over every rank's
    micro-batches, throughput the whole run's."""
    parts = all_gather((window, n, seqs, tokens))
    if len(parts) == 1:
        return window, n, seqs, tokens
    sums: dict = {}
    for w, _, _, _ in parts:
        for k, v in w.items():
            sums[k] = sums.get(k, 0.0) + v
    return sums, sum(p[1] for p in parts), sum(p[2] for p in parts), sum(p[3] for p in parts)


def _register_board(board) -> None:
    """tensorboard writes its event file itself: record it as this run's (its name carries this process's pid)."""
    for path in Path(board.get_logdir()).glob(f"events.out.tfevents.*.{os.getpid()}.*"):
        register(path)


def _tensorboard(out_dir: Path):
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ModuleNotFoundError:
        raise BertkitError("--report-to tensorboard needs the tensorboard package: pip install 'bertkit[tensorboard]' "
                           "(or pip install tensorboard), or leave --report-to at none") from None
    return SummaryWriter(str(out_dir / "tensorboard"))


def _autocast(args: TrainingSettings, device: str):
    """bf16 or fp16 autocast (fp16 pairs with the GradScaler in ``train``); weights stay fp32."""
    return torch.autocast(torch.device(device).type, dtype=torch.float16 if args.fp16 else torch.bfloat16,
                          enabled=args.bf16 or args.fp16)


def _progress(total: int, initial: int, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, disable=not enabled, unit="step", dynamic_ncols=True)


def _read_jsonl(path: Path) -> list[dict]:
    """metrics.jsonl; a torn last line (a kill mid-append) is dropped with a warning, a bad line elsewhere is an error."""
    if not path.is_file():
        return []
    lines = [(i, line) for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if line.strip()]
    records = []
    for n, (lineno, line) in enumerate(lines):
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            if n == len(lines) - 1:
                logger.warning("%s line %d is torn (a write interrupted by a kill); dropping it", path, lineno)
                break
            raise BertkitError(f"{path} line {lineno} is not JSON ({line[:60]!r}); the metrics of this run are "
                               "damaged: move the file away to resume without its history") from None
    return records


def _write_jsonl(path: Path, records: list[dict]) -> None:
    atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in records))
