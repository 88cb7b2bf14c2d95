"""A run that diverged: which weights an update left NaN or infinite, and the error that stops the run, naming where,
why, the last good checkpoint and what to do (the same advice for a non-finite loss or gradient and for weights a
finite step broke)."""

from __future__ import annotations

import torch
from torch import nn

from bertkit.errors import NonFiniteError

# the loop runs under the command line and the Python Trainers alike: both spellings
_LOWER_THE_RATE = ("lower the learning rate (learning_rate, --learning-rate) or raise the warmup (warmup_ratio, "
                   "--warmup-ratio) and start again")
_RESUME = "resume from that checkpoint (resume_from_checkpoint, --resume)"
_SKIP = "skip up to N such steps (skip_nonfinite=N, --skip-nonfinite N)"


def nonfinite_weights(model: nn.Module) -> list[str]:
    """The names of ``model``'s floating-point weights holding a NaN or an infinity (one read when there are none)."""
    params = [p for p in model.parameters() if p.is_floating_point()]
    if not params or bool(torch.stack([torch.isfinite(p).all() for p in params]).all()):
        return []
    return [name for name, p in model.named_parameters() if p.is_floating_point() and not torch.isfinite(p).all()]


def stopped(where: str, why: str, last_good: str, *, rate_advice: bool = True, skippable: bool) -> NonFiniteError:
    """The error that stops a diverged run: at ``where`` because ``why``; the fixes offered are a lower rate (unless
    ``rate_advice`` is False: a cause no rate explains) or a resume from ``last_good``, and skipping such steps where
    the run can skip them (``skippable``: a step, not weights it already changed)."""
    fixes = [_LOWER_THE_RATE, _RESUME] if rate_advice else []
    fixes += [_SKIP] if skippable else []
    advice = fixes[0] if len(fixes) == 1 else ", ".join(fixes[:-1]) + ", or " + fixes[-1]
    return NonFiniteError(f"training stopped at {where}: {why}. Last good checkpoint: {last_good}. "
                          f"{advice[0].upper()}{advice[1:]}; no final model was saved")
