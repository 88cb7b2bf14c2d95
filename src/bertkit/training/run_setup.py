"""What a run decides from its settings before its first step: the fingerprint its checkpoints record, every how
many steps it logs, evaluates and saves, the checks of its phases, and the switches it sets on the model
(gradient checkpointing, compiled layers). ``loop`` runs the steps.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn

from bertkit._hardware import cpu_class, cpu_has_bf16, warn_if_bf16_is_emulated
from bertkit._parallel import DistInfo
from bertkit.errors import BertkitError
from bertkit.settings import TrainingSettings, checkpoint_fields, resume_fingerprint

logger = logging.getLogger("bertkit")


def run_fingerprint(args: TrainingSettings, fingerprint: dict[str, Any] | None) -> dict[str, Any]:
    """What a run's checkpoints record and ``resume`` must find unchanged: the settings that change the result
    (declared ``checkpoint``) and the caller's facts (model config, data)."""
    return {"train": resume_fingerprint(args, checkpoint_fields(args)), **(fingerprint or {})}


def cadence(args: TrainingSettings, total: int) -> dict[str, int | None]:
    """Every how many optimiser steps the run logs, evaluates and saves ("epoch" logging, evaluation and saving
    happen in ``run_epoch``; the last step is always logged), for a run of ``total`` steps."""
    return {"log_every": args.steps_of(args.logging_steps, total) if args.logging_strategy == "steps" else total + 1,
            "eval_every": (args.steps_of(args.eval_steps or args.logging_steps, total)
                           if args.eval_strategy == "steps" else None),
            "save_every": args.steps_of(args.save_steps, total) if args.save_strategy == "steps" else None}


def check_phases(args: TrainingSettings, phases: list, info: DistInfo) -> None:
    """A learning rate, and every ``loop.Phase`` of the run planned for this process's rank."""
    if args.learning_rate is None:
        raise BertkitError("the training loop needs a learning rate (learning_rate is None)")
    for phase in phases:
        if (phase.plan.rank, phase.plan.world_size) != (info.rank, info.world_size):
            raise BertkitError(f"phase {phase.name!r}: its BatchPlan is for rank {phase.plan.rank} of "
                               f"{phase.plan.world_size} but this process is rank {info.rank} of "
                               f"{info.world_size}; build plans with rank=/world_size= from "
                               "bertkit.training.distributed.current()")


def prepare_model(model: nn.Module, args: TrainingSettings, device: str) -> None:
    if args.bf16:
        warn_if_bf16_is_emulated(torch.device(device).type)
    if args.gradient_checkpointing:
        for encoder in _encoders(model, "gradient checkpointing"):
            encoder.gradient_checkpointing = True


def compile_encoders(model: nn.Module) -> None:
    """Compile the layers of every bertkit encoder in ``model``."""
    for encoder in _encoders(model, "compile"):
        encoder.compile_layers()


def _encoders(model: nn.Module, what: str) -> list[nn.Module]:
    """Every bertkit encoder in ``model`` (a sentence-transformers loss wraps its model, a cross-encoder or a sparse
    encoder keeps its encoder deeper than ``.bert``); ``what`` needs one."""
    encoders = [m for m in model.modules() if hasattr(m, "compile_layers")]
    if not encoders:
        raise BertkitError(f"{what} needs a bertkit model; {type(model).__name__} holds no encoder "
                           "with compile_layers()")
    return encoders


def computed_on(device: str) -> dict[str, Any] | None:
    """What a checkpoint records of the machine its steps ran on, on the CPU: the CPU class whose kernels ran
    (``cpu_class``) and the thread count. Both change how sums are rounded (another vector width, another split of
    each reduction), so a resume on another is exact no longer; None on a GPU."""
    if torch.device(device).type != "cpu":
        return None
    return {"cpu_class": cpu_class(), "threads": torch.get_num_threads()}


def warn_if_moved(written_on: dict[str, Any] | None, device: str, bf16: bool) -> bool:
    """Warn when a run resumes on another CPU class or thread count than its checkpoint was written with (users
    train on one machine and resume on another): it continues from the same state, but its numbers are no longer
    an uninterrupted run's bit for bit, and a bf16 run moved to a CPU without bf16 instructions stays in bf16,
    emulated. Returns whether it warned (checkpoints written before this was recorded say nothing)."""
    here = computed_on(device)
    if not written_on or here is None or here == written_on:
        return False

    def what(on: dict) -> str:
        return f"CPU class {on.get('cpu_class')} on {on.get('threads')} thread(s)"

    bf16_note = ""
    if bf16 and not cpu_has_bf16():
        bf16_note = (" The run computes in bf16, as it did, and this CPU has no bf16 instructions: it runs emulated, "
                     "several times slower (training on in fp32 would be a new run: its weights from the checkpoint, "
                     "--no-bf16, another output directory).")
    logger.warning("resuming on %s a run checkpointed on %s: training continues from the same state, but the "
                   "kernels round sums differently here, so the result equals an uninterrupted run's within float "
                   "rounding, not bit for bit.%s", what(here), what(written_on), bf16_note)
    return True
