"""The plain PyTorch loop the benches run transformers' models with: what a careful transformers user writes.

Same optimiser (AdamW, eps 1e-6, weight decay 0.01 off for biases and LayerNorm), schedule (linear
warm-up then decay), clipping (1.0) and batches (bertkit's ``BatchPlan``) as bertkit's loop, so a
comparison differs only in the model implementation (and each side's dropout draws).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from bertkit.training.batch_plan import BatchPlan
from bertkit.training.optim import build_optimizer, linear_warmup_decay


def train_reference(model: torch.nn.Module, plan: BatchPlan, steps: int, lr: float, seed: int, warmup: float = 0.1,
                    on_epoch_end: Callable[[torch.nn.Module], dict] | None = None) -> list[dict]:
    """Train for ``steps`` optimiser steps; returns ``on_epoch_end(model)`` after every (possibly partial) epoch."""
    torch.manual_seed(seed)
    opt = build_optimizer(model, lr, 0.01)
    # warm-up below 1: a share of the steps (bertkit's warmup_ratio), else a step count
    sched = linear_warmup_decay(opt, math.ceil(warmup * steps) if warmup < 1 else int(warmup), steps)
    model.train()
    step, epoch, per_epoch = 0, 0, []
    while step < steps:
        for idx in plan.batches(epoch):
            model(**plan.load(epoch, idx)).loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            step += 1
            if step == steps:
                break
        if on_epoch_end is not None:
            per_epoch.append(on_epoch_end(model))
            model.train()
        epoch += 1
    return per_epoch
