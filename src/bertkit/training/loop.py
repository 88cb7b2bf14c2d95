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
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from bertkit.errors import BertkitError, NonFiniteError
from bertkit.outputs import atomic_write_text, fsync_dir
from bertkit.training.optim import build_optimizer, linear_warmup_decay, warmup_steps_for
from bertkit.training.settings import TrainingSettings

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
    """

    def __init__(self, dataset: Sequence, batch_size: int, collate: Callable[[list], Batch], *,
                 shuffle: bool = True, seed: int = 0, drop_last: bool = False):
        if batch_size < 1:
            raise BertkitError(f"batch_size must be >= 1, got {batch_size}")
        if len(dataset) == 0:
            raise BertkitError("the training data is empty: there is nothing to train on")
        self.dataset, self.batch_size, self.collate = dataset, batch_size, collate
        self.shuffle, self.seed, self.drop_last = shuffle, seed, drop_last

    def __len__(self) -> int:
        n = len(self.dataset)
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    def batches(self, epoch: int) -> list[list[int]]:
        n = len(self.dataset)
        if self.shuffle:
            order = torch.randperm(n, generator=torch.Generator().manual_seed(self.seed * 100_003 + epoch)).tolist()
        else:
            order = list(range(n))
        return [order[i:i + self.batch_size] for i in range(0, len(self) * self.batch_size, self.batch_size)]

    def load(self, epoch: int, indices: list[int]) -> Batch:
        if hasattr(self.dataset, "set_epoch"):
            self.dataset.set_epoch(epoch)
        return self.collate([self.dataset[i] for i in indices])


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


def checkpoint_dirs(out_dir: Path) -> list[Path]:
    return sorted((out_dir / "checkpoints").glob("step-*"), key=lambda p: int(p.name.split("-")[1]))


def _disk_full(e: BaseException) -> bool:
    # torch's zip writer reports a full disk as "[enforce fail at inline_container.cc] unexpected pos" or
    # "PytorchStreamWriter failed writing file", not as ENOSPC.
    return (isinstance(e, OSError) and e.errno == errno.ENOSPC) or (
        isinstance(e, RuntimeError) and ("unexpected pos" in str(e) or "PytorchStreamWriter failed" in str(e)))


def _save_checkpoint(out_dir: Path, model: nn.Module, optimizer, scheduler, pos: Position,
                     fingerprint: dict, keep: int, window: dict | None = None) -> Path:
    """Write to a temporary directory, fsync, and rename it: a kill mid-write never leaves a partial
    checkpoint, and a failed write (a full disk) leaves the previous checkpoints as they were."""
    root = out_dir / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{pos.step:08d}"
    tmp = root / f".tmp-step-{pos.step:08d}"
    shutil.rmtree(tmp, ignore_errors=True)  # a temporary directory of this run's own, left by a kill
    tmp.mkdir()
    state = {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "torch_rng": torch.get_rng_state(),
        "python_rng": random.getstate(),
        "position": dataclasses.asdict(pos),
        "fingerprint": fingerprint,
        "window": dict(window or {}),  # partial logging-window sums, so resumed logs equal uninterrupted ones
    }
    try:
        torch.save(state, tmp / STATE_FILE)
        with open(tmp / STATE_FILE, "rb") as f:
            os.fsync(f.fileno())
    except (OSError, RuntimeError) as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if not _disk_full(e):
            raise
        previous = checkpoint_dirs(out_dir)
        needed = sum(t.numel() * t.element_size() for t in model.state_dict().values()) * 3  # weights + 2 Adam moments
        free = shutil.disk_usage(root).free
        raise BertkitError(
            f"the disk is full: could not write {tmp / STATE_FILE} (a checkpoint needs about {needed / 1e6:.0f} MB, "
            f"{free / 1e6:.0f} MB are free); the temporary files were removed and the previous checkpoint "
            f"{previous[-1] if previous else '(none)'} is intact: free some space and run again with --resume"
        ) from e
    shutil.rmtree(final, ignore_errors=True)  # only a checkpoint of this step, which this run is rewriting
    tmp.rename(final)
    fsync_dir(root)
    for old in checkpoint_dirs(out_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


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


def _load_checkpoint(out_dir: Path, model, optimizer, scheduler, fingerprint: dict) -> tuple[Path, Position, dict]:
    """Load the newest intact checkpoint; a damaged newest one (a torn write) falls back to the previous."""
    damaged = []
    for path in reversed(checkpoint_dirs(out_dir)):
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
        raise BertkitError(f"no intact checkpoint to resume from in {out_dir / 'checkpoints'}: {'; '.join(damaged)}")
    if state["fingerprint"] != fingerprint:
        diff = {k: (state["fingerprint"].get(k), fingerprint.get(k))
                for k in sorted(set(state["fingerprint"]) | set(fingerprint))
                if state["fingerprint"].get(k) != fingerprint.get(k)}
        raise BertkitError(
            f"cannot resume from {path}: it was written by a run with other settings or data "
            f"(field: (checkpoint, now)) {diff}; resume with the original settings and data, or start a new "
            "--output-dir"
        )
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    torch.set_rng_state(state["torch_rng"])
    random.setstate(state["python_rng"])
    return path, Position(**state["position"]), state.get("window", {})


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
    resume: bool = False,
) -> TrainResult:
    """Train ``model`` (whose forward returns an object with ``.loss``) through ``phases``.

    ``evaluate(model)`` returns held-out metrics; ``batch_metrics(batch, output)`` returns extra
    per-batch training scalars (accuracies) averaged over each logging window. ``fingerprint`` adds
    caller facts (model config, data) that ``resume`` must find unchanged. Returns the run's history.
    """
    out_dir = args.output_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    fingerprint = {"train": args.fingerprint(), **(fingerprint or {})}
    total = sum(p.steps for p in phases)
    if args.learning_rate is None:
        raise BertkitError("the training loop needs a learning rate (learning_rate is None)")
    optimizer = build_optimizer(model, args.optimizer, args.learning_rate, args.weight_decay,
                                (args.adam_beta1, args.adam_beta2), args.adam_epsilon)
    warmup = args.warmup_steps if args.warmup_steps is not None else warmup_steps_for(total, args.warmup_ratio)
    scheduler = linear_warmup_decay(optimizer, warmup, total)
    model.to(args.device)
    if args.compile:
        encoder = getattr(model, "bert", model)
        if not hasattr(encoder, "compile_layers"):
            raise BertkitError(f"compile needs a bertkit model; {type(model).__name__} has no encoder "
                             "with compile_layers()")
        encoder.compile_layers()

    metrics_path = out_dir / "metrics.jsonl"
    existing = checkpoint_dirs(out_dir)
    if resume and existing:
        path, pos, window = _load_checkpoint(out_dir, model, optimizer, scheduler, fingerprint)
        logger.info("resuming from %s (step %d of %d)", path, pos.step, total)
        history = [r for r in _read_jsonl(metrics_path) if r["step"] <= pos.step]  # drop records after the checkpoint
        _write_jsonl(metrics_path, history)
    elif existing:
        raise BertkitError(
            f"{out_dir} already holds checkpoints ({existing[-1].name}); pass --resume (resume=True) to continue "
            "that run, or choose another output directory"
        )
    else:
        torch.manual_seed(args.seed)
        random.seed(args.seed)
        pos, history, window = Position(), [], {}
        metrics_path.write_text("")

    def log(record: dict) -> None:
        history.append(record)
        with metrics_path.open("a") as f:
            f.write(json.dumps(record) + "\n")

    last_eval = None

    def run_eval() -> None:
        nonlocal last_eval
        if evaluate is None:
            return
        model.eval()
        with torch.no_grad(), _autocast(args):
            last_eval = evaluate(model)
        model.train()
        log({"split": "eval", "step": pos.step, "epoch": pos.epoch, **last_eval})

    bar = _progress(total, pos.step, args.progress)
    window_n = int(window.pop("_n", 0))
    seqs, tokens, t0 = 0, 0, time.perf_counter()
    micro, spoiled = 0, None  # spoiled: why the current optimiser step's gradient cannot be used
    model.train()
    while pos.phase < len(phases):
        phase = phases[pos.phase]
        phase_end = sum(p.steps for p in phases[: pos.phase + 1])
        while pos.step < phase_end:
            batches = phase.plan.batches(pos.epoch)
            while pos.batch < len(batches) and pos.step < phase_end:
                batch = _to(phase.plan.load(pos.epoch, batches[pos.batch]), args.device)
                pos.batch += 1
                micro += 1
                if spoiled is None:
                    with _autocast(args):
                        out = model(**batch)
                    loss = out.loss.item()
                    if math.isfinite(loss):
                        (out.loss / args.gradient_accumulation_steps).backward()
                        window["loss"] = window.get("loss", 0.0) + loss
                        for k, v in (batch_metrics(batch, out) if batch_metrics else {}).items():
                            window[k] = window.get(k, 0.0) + v
                        window_n += 1
                    else:
                        spoiled = f"the loss is {loss}"
                seqs += batch["input_ids"].shape[0]
                tokens += int(batch["attention_mask"].sum()) if "attention_mask" in batch else batch["input_ids"].numel()
                if micro % args.gradient_accumulation_steps:
                    continue
                if spoiled is None:  # clip (or, with clipping off, only measure) the global gradient norm
                    norm = float(torch.nn.utils.clip_grad_norm_(
                        model.parameters(), args.max_grad_norm if args.max_grad_norm > 0 else math.inf))
                    spoiled = None if math.isfinite(norm) else f"the gradient norm is {norm}"
                if spoiled is not None:
                    where = f"step {pos.step + 1} ({phase.name}, epoch {pos.epoch}, batch {pos.batch - 1})"
                    optimizer.zero_grad(set_to_none=True)
                    if pos.skipped >= args.skip_nonfinite:
                        last = checkpoint_dirs(out_dir)
                        raise NonFiniteError(
                            f"training stopped at {where}: {spoiled}. Last good checkpoint: "
                            f"{last[-1] if last else 'none (no checkpoint written yet)'}. Lower --learning-rate "
                            "(or raise --warmup-ratio) and start again, resume from that checkpoint with --resume, "
                            "or pass --skip-nonfinite N to skip up to N such steps; no final model was saved"
                        )
                    pos.skipped += 1
                    logger.warning("skipped %s: %s (%d of at most %d)", where, spoiled, pos.skipped,
                                   args.skip_nonfinite)
                    spoiled = None
                    continue
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad(set_to_none=True)
                pos.step += 1
                bar.update(1)
                if pos.step % args.logging_steps == 0 or pos.step == total:
                    dt = time.perf_counter() - t0
                    record = {"split": "train", "step": pos.step, "epoch": pos.epoch, "phase": phase.name,
                              "lr": scheduler.get_last_lr()[0], **{k: v / window_n for k, v in window.items()},
                              "seqs_per_s": seqs / dt, "tokens_per_s": tokens / dt}
                    if pos.skipped:
                        record["skipped_nonfinite"] = pos.skipped
                    log(record)
                    bar.set_postfix(loss=f"{record['loss']:.4f}")
                    window, window_n, seqs, tokens, t0 = {}, 0, 0, 0, time.perf_counter()
                if args.eval_steps and pos.step % args.eval_steps == 0:
                    run_eval()
                if args.save_steps and pos.step % args.save_steps == 0 and pos.step < total:
                    _save_checkpoint(out_dir, model, optimizer, scheduler, pos, fingerprint, args.save_total_limit,
                                     {**window, "_n": window_n})
            if pos.batch >= len(batches):
                if args.eval_steps is None:
                    run_eval()
                pos.epoch, pos.batch = pos.epoch + 1, 0
        pos.phase, pos.epoch, pos.batch = pos.phase + 1, 0, 0
    bar.close()
    if evaluate is not None and (not history or history[-1]["split"] != "eval" or history[-1]["step"] != pos.step):
        run_eval()
    _save_checkpoint(out_dir, model, optimizer, scheduler, pos, fingerprint, args.save_total_limit)
    return TrainResult(pos.step, history, last_eval, pos.skipped)


def _autocast(args: TrainingSettings):
    device_type = torch.device(args.device).type
    return torch.autocast(device_type, dtype=torch.bfloat16, enabled=args.bf16)


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
