"""The paper's optimiser and learning-rate schedule (appendix A.2): Adam with L2 weight decay, decoupled as in
google-research/bert (AdamW) and not applied to biases and LayerNorm parameters; warm-up, then linear decay.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR

from bertkit.errors import BertkitError
from bertkit.settings import LR_SCHEDULES

# google-research/bert's optimiser settings: the defaults of a direct call (commands pass their settings').
WEIGHT_DECAY = 0.01
ADAM_BETAS = (0.9, 0.999)
ADAM_EPSILON = 1e-6


def parameter_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Decayed matrices and embeddings, and undecayed biases and LayerNorm parameters (Google's rule by name;
    here exactly the one-dimensional parameters)."""
    params = [p for p in model.parameters() if p.requires_grad]
    return [{"params": [p for p in params if p.ndim >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]


def _fused_ok(model: nn.Module) -> bool:
    """Fused AdamW runs on CPU and CUDA floating-point parameters (torch >= 2.4)."""
    devices = {p.device.type for p in model.parameters()}
    return devices <= {"cpu", "cuda"} and all(p.is_floating_point() for p in model.parameters())


def build_optimizer(model: nn.Module, lr: float, weight_decay: float = WEIGHT_DECAY,
                    betas: tuple[float, float] = ADAM_BETAS, eps: float = ADAM_EPSILON) -> Optimizer:
    """AdamW over ``parameter_groups``. eps 1e-6 is google-research/bert's value."""
    # The fused kernel updates every tensor in one pass (CPU and CUDA); on CPU the default per-tensor
    # loop spends more time in the update of BERT's 23M-entry embedding tables than in some layers.
    return torch.optim.AdamW(parameter_groups(model, weight_decay), lr=lr, betas=betas, eps=eps,
                             fused=_fused_ok(model))


def linear_warmup_decay(optimizer: Optimizer, warmup_steps: int, total_steps: int,
                        shape: str = "linear") -> LambdaLR:
    """lr rises linearly from 0 over ``warmup_steps``, then follows ``shape`` to ``total_steps`` (transformers'
    names): linear to 0 (the paper's), cosine (half a period to 0) or constant_with_warmup. Warm-up longer than the
    run rises for the whole run at the same slope and ends below the peak, as transformers' schedules do."""
    if total_steps <= 0 or warmup_steps < 0:
        raise BertkitError(f"need warmup_steps >= 0 ({warmup_steps}) and total_steps > 0 ({total_steps})")
    if shape not in LR_SCHEDULES:
        raise BertkitError(f"unknown learning-rate schedule {shape!r}; choose one of {', '.join(LR_SCHEDULES)}")

    def factor(step: int) -> float:
        if step < warmup_steps:
            return step / warmup_steps  # as google-research/bert and transformers: the first update has lr 0
        done = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        if shape == "cosine":
            return 0.5 * (1.0 + math.cos(math.pi * done))
        if shape == "constant_with_warmup":
            return 1.0
        return 1.0 - done

    return LambdaLR(optimizer, factor)
