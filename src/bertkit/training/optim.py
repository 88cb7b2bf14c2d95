"""The paper's optimiser and learning-rate schedule (appendix A.2): Adam with L2 weight decay, decoupled as in
google-research/bert (AdamW) and not applied to biases and LayerNorm parameters; warm-up, then linear decay.
"""

from __future__ import annotations

import math
import re
from typing import Any

import torch
from torch import nn
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR

from bertkit.errors import BertkitError
from bertkit.model_checks import require_inductor_cache
from bertkit.settings import TrainingSettings

# google-research/bert's optimiser settings: the defaults of a direct call (commands pass their settings').
WEIGHT_DECAY = 0.01
ADAM_BETAS = (0.9, 0.999)
ADAM_EPSILON = 1e-6
POLYNOMIAL_LR_END = 1e-7  # transformers' get_polynomial_decay_schedule_with_warmup default
# transformers' lr_scheduler_kwargs each schedule takes, at their defaults (its get_scheduler hands them to the
# schedule's function, which takes these and no others; constant and constant_with_warmup are given none). None: no
# default; REQUIRED_OPTIONS says which of those a schedule must be given.
_WSD_SHAPES = ("linear", "cosine", "1-sqrt")  # warmup_stable_decay's warmup_type and decay_type
SCHEDULE_OPTIONS: dict[str, dict[str, Any]] = {
    "linear": {}, "cosine": {"num_cycles": 0.5}, "cosine_with_restarts": {"num_cycles": 1},
    "polynomial": {"lr_end": POLYNOMIAL_LR_END, "power": 1.0}, "constant": {}, "constant_with_warmup": {},
    "inverse_sqrt": {"timescale": None},
    "cosine_with_min_lr": {"num_cycles": 0.5, "min_lr": None, "min_lr_rate": None},
    "warmup_stable_decay": {"num_decay_steps": None, "num_stable_steps": None, "warmup_type": "linear",
                            "decay_type": "cosine", "min_lr_ratio": 0.0, "num_cycles": 0.5}}
# (the options of which exactly one must be given, how many of them at most): as transformers' functions raise
REQUIRED_OPTIONS = {"cosine_with_min_lr": (("min_lr", "min_lr_rate"), 1),
                    "warmup_stable_decay": (("num_decay_steps",), 1)}


def _number(ok: Any) -> Any:
    return lambda v: not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v) and ok(v)


def _count(v: Any) -> bool:
    return not isinstance(v, bool) and isinstance(v, int) and v >= 0


# what a value must be (transformers divides by a timescale of 0, raises 0 to a power of -1, ...)
_OPTION_RANGE = {"num_cycles": (_number(lambda v: v > 0), "a finite number above 0"),
                 "power": (_number(lambda v: v > 0), "a finite number above 0"),
                 "lr_end": (_number(lambda v: v >= 0), "a finite number 0 or above"),
                 "timescale": (_number(lambda v: v >= 1), "a finite number 1 or above"),
                 "min_lr": (_number(lambda v: v >= 0), "a finite number 0 or above (a learning rate)"),
                 "min_lr_rate": (_number(lambda v: 0 <= v <= 1), "a finite number from 0 to 1 (a share of the peak)"),
                 "min_lr_ratio": (_number(lambda v: 0 <= v <= 1), "a finite number from 0 to 1 (a share of the peak)"),
                 "num_decay_steps": (_count, "a whole number of steps, 0 or above"),
                 "num_stable_steps": (_count, "a whole number of steps, 0 or above"),
                 "warmup_type": (lambda v: v in _WSD_SHAPES, f"one of {', '.join(_WSD_SHAPES)}"),
                 "decay_type": (lambda v: v in _WSD_SHAPES, f"one of {', '.join(_WSD_SHAPES)}")}


# transformers' Trainer.get_decay_parameter_names: no weight decay for a LayerNorm's parameters or a name like these
_NO_DECAY = re.compile(r"bias|layernorm|rmsnorm|(?:^|\.)norm(?:$|\.)|_norm(?:$|\.)")


def parameter_groups(model: nn.Module, weight_decay: float,
                     learning_rates: dict[str, float] | None = None) -> list[dict]:
    """AdamW's parameter groups as transformers' Trainer builds them: the decayed parameters, then the undecayed
    (biases and norms, by transformers' rule: for BERT, exactly its one-dimensional parameters). Then, for each
    pattern of ``learning_rates`` in order (sentence-transformers' ``learning_rate_mapping``), the parameters whose
    name it matches (``re.search``) leave the groups before and form two of their own at its rate, decayed and
    undecayed, as sentence-transformers builds them: a later pattern wins. A pattern that matches no parameter is
    refused, as sentence-transformers refuses it."""
    params = dict(model.named_parameters())
    return [{"params": [params[n] for n in names], **options}
            for _, names, options in named_groups(model, weight_decay, learning_rates)]


def named_groups(model: nn.Module, weight_decay: float, learning_rates: dict[str, float] | None = None,
                 frozen: frozenset[str] | None = None) -> list[tuple[int, list[str], dict]]:
    """``parameter_groups`` by parameter name, each group with its place among all the groups built (groups of one
    place hold the same parameters in both layouts below, but for ``frozen`` ones). ``frozen``: the layout
    sentence-transformers' trainers build, where the names in ``frozen`` (parameters bertkit's trainer froze, the
    pooler) are trained too, and a pattern's groups hold every parameter it matches, trained or not, as theirs do."""
    names = [n for n, _ in model.named_parameters()]
    trained = [n for n, p in model.named_parameters() if p.requires_grad or n in (frozen or ())]
    undecayed = {f"{prefix}.{n}" if prefix else n for prefix, module in model.named_modules()
                 for n, _ in module.named_parameters(recurse=False) if isinstance(module, nn.LayerNorm)}
    undecayed |= {n for n in names if _NO_DECAY.search(n.lower())}
    groups = [([n for n in trained if n not in undecayed], {"weight_decay": weight_decay}),
              ([n for n in trained if n in undecayed], {"weight_decay": 0.0})]
    for pattern, lr in (learning_rates or {}).items():
        matched = {n for n in names if re.search(pattern, n)}
        if not matched:
            raise BertkitError(f"learning_rate_mapping: the pattern {pattern!r} matches no parameter name (re.search "
                               f"on names such as {names[0]!r})"
                               f"{_class_hint(model, pattern)}")
        groups = [([n for n in group if n not in matched], options) for group, options in groups]
        groups += [([n for n in (names if frozen is not None else trained) if n in matched and (n in undecayed) == skip],
                    {"lr": lr, "weight_decay": 0.0 if skip else weight_decay}) for skip in (False, True)]
    return [(place, group, options) for place, (group, options) in enumerate(groups)
            if group or "lr" not in options]  # sentence-transformers keeps the first two, even empty


def _class_hint(model: nn.Module, pattern: str) -> str:
    """Where ``pattern`` matches a module's class name (as sentence-transformers' docs write
    ``SparseStaticEmbedding\\.*``, which matches no parameter there either), the pattern of that module's path."""
    owner = next((p for p, m in model.named_modules() if p and re.search(pattern, type(m).__name__)), None)
    return "" if owner is None else (f"; a name is a module path, not a class: the "
                                     f"{type(model.get_submodule(owner)).__name__} at {owner!r} is matched "
                                     f"by {re.escape(owner + '.')!r}")


def _fused_ok(model: nn.Module) -> bool:
    """Fused AdamW runs on CPU and CUDA floating-point parameters (torch >= 2.4)."""
    devices = {p.device.type for p in model.parameters()}
    return devices <= {"cpu", "cuda"} and all(p.is_floating_point() for p in model.parameters())


def build_optimizer(model: nn.Module, lr: float, weight_decay: float = WEIGHT_DECAY,
                    betas: tuple[float, float] = ADAM_BETAS, eps: float = ADAM_EPSILON,
                    groups: list[dict] | None = None) -> Optimizer:
    """AdamW over ``groups`` (default ``parameter_groups(model, weight_decay)``), at ``lr`` where a group sets no
    rate of its own. eps 1e-6 is google-research/bert's value."""
    # The fused kernel updates every tensor in one pass (CPU and CUDA); on CPU the default per-tensor
    # loop spends more time in the update of BERT's 23M-entry embedding tables than in some layers.
    groups = groups if groups is not None else parameter_groups(model, weight_decay)
    require_inductor_cache()  # torch's optimizer makes it on first use: a clear error rather than torch's OSError
    return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, fused=_fused_ok(model))


def schedule_options(shape: str, given: dict[str, Any] | None, peak: float | None = None) -> dict[str, Any]:
    """``shape``'s options (``SCHEDULE_OPTIONS``) with ``given`` (transformers' ``lr_scheduler_kwargs``) over the
    defaults. A name the schedule does not take, or a value it cannot use, is refused: transformers raises a
    TypeError for the first (and ignores any for constant and constant_with_warmup, which bertkit refuses, as they
    would change nothing)."""
    options = dict(SCHEDULE_OPTIONS.get(shape, {}))
    for name, value in (given or {}).items():
        if name not in options:
            takes = f"takes {', '.join(sorted(options))}" if options else "takes no options"
            raise BertkitError(f"lr_scheduler_kwargs {name}={value!r}: lr_scheduler_type {shape!r} {takes} (as "
                               "transformers' schedule functions); drop it, or choose the schedule that takes it")
        ok, what = _OPTION_RANGE[name]
        if not ok(value):
            raise BertkitError(f"lr_scheduler_kwargs {name}={value!r}: must be {what}")
        options[name] = value
    names, most = REQUIRED_OPTIONS.get(shape, ((), 0))
    given_names = [n for n in names if options[n] is not None]
    if names and not 1 <= len(given_names) <= most:
        which = " or ".join(names) if most == 1 and len(names) > 1 else ", ".join(names)
        got = f"got {', '.join(f'{n}={options[n]!r}' for n in given_names)}" if given_names else "got none"
        raise BertkitError(f"lr_scheduler_type {shape!r} needs {'exactly one of ' if len(names) > 1 else ''}{which} "
                           f"in lr_scheduler_kwargs ({got}), as transformers' schedule function")
    min_lr = options.get("min_lr")
    if min_lr is not None and peak is not None and not (0 < peak and min_lr <= peak):
        # transformers' rate would rise to it at the end (and divides by a learning_rate of 0)
        raise BertkitError(f"lr_scheduler_kwargs min_lr={min_lr!r} with learning_rate {peak}: min_lr must be at most "
                           "learning_rate, which must be above 0; or give min_lr_rate (a share of learning_rate)")
    return options


def linear_warmup_decay(optimizer: Optimizer, warmup_steps: int, total_steps: int,
                        shape: str = "linear", options: dict[str, Any] | None = None) -> LambdaLR:
    """lr rises linearly from 0 over ``warmup_steps``, then follows ``shape`` to ``total_steps`` (transformers'
    names and defaults, each factor its expression, equal to the last bit): linear to 0 (the paper's), cosine (half a
    period to 0; cosine_with_restarts, at transformers' one cycle, is the same), polynomial (linear to transformers'
    lr_end 1e-7, an absolute rate), inverse_sqrt (1/sqrt of the steps since warm-up over the timescale: the
    warm-up, or 10,000 without one), constant_with_warmup (stays at the peak) or constant (the peak from the first
    step: no warm-up, as transformers' get_constant_schedule ignores it). Warm-up longer than the run rises for the
    whole run at the same slope and ends below the peak, as transformers' schedules do. ``options``: transformers'
    ``lr_scheduler_kwargs`` (``schedule_options``): cosine's and cosine_with_restarts' num_cycles, polynomial's
    lr_end and power, inverse_sqrt's timescale; cosine_with_min_lr and warmup_stable_decay, which need some
    (``REQUIRED_OPTIONS``), are transformers' too (``_cosine_to_min``, ``_warmup_stable_decay``)."""
    if total_steps <= 0 or warmup_steps < 0:
        raise BertkitError(f"need warmup_steps >= 0 ({warmup_steps}) and total_steps > 0 ({total_steps})")
    if shape not in SCHEDULE_OPTIONS:
        raise BertkitError(f"unknown learning-rate schedule {shape!r}; choose one of {', '.join(SCHEDULE_OPTIONS)}")
    peak = optimizer.defaults["lr"]  # polynomial's end is a rate, not a factor: transformers divides it by this
    opts = schedule_options(shape, options, peak)
    if shape == "cosine_with_min_lr":
        return LambdaLR(optimizer, _cosine_to_min(warmup_steps, total_steps, opts, peak))
    if shape == "warmup_stable_decay":
        return LambdaLR(optimizer, _warmup_stable_decay(warmup_steps, total_steps, opts))
    lr_end, power, cycles = opts.get("lr_end"), opts.get("power"), opts.get("num_cycles")
    if shape == "polynomial" and not peak > lr_end:
        raise BertkitError(f"lr_scheduler_type 'polynomial' decays to {lr_end} (its lr_end: transformers' 1e-7 "
                           f"unless lr_scheduler_kwargs gives one), which needs a learning_rate above it, got {peak}; "
                           "raise learning_rate, lower lr_end or choose 'linear' (decays to 0)")
    timescale = opts.get("timescale") or warmup_steps or 10_000  # inverse_sqrt's, transformers' default

    def factor(step: int) -> float:
        if shape == "constant":
            return 1.0
        if step < warmup_steps:
            return step / warmup_steps  # as google-research/bert and transformers: the first update has lr 0
        if shape == "constant_with_warmup":
            return 1.0
        if shape == "inverse_sqrt":
            return 1.0 / math.sqrt((step + timescale - warmup_steps) / timescale)
        progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
        if shape == "cosine":  # num_cycles waves over the run (0.5: half a period, to 0), transformers' expression
            return max(0.0, 0.5 * (1.0 + math.cos(math.pi * float(cycles) * 2.0 * progress)))
        if shape == "cosine_with_restarts":  # num_cycles half-periods, each from the peak back to 0
            return 0.0 if progress >= 1.0 else max(0.0, 0.5 * (1.0 + math.cos(math.pi * ((float(cycles) * progress)
                                                                                       % 1.0))))
        if shape == "polynomial":
            if step > total_steps or step == warmup_steps == total_steps:  # (transformers divides by 0 there)
                return lr_end / peak
            remaining = 1 - (step - warmup_steps) / (total_steps - warmup_steps)
            return ((peak - lr_end) * remaining ** power + lr_end) / peak
        # transformers' expression, equal to the last bit (1 - (step - warmup) / (total - warmup) is one bit off at a
        # third of the steps, in the rate the run logs)
        return max(0.0, (total_steps - step) / max(1, total_steps - warmup_steps))

    return LambdaLR(optimizer, factor)


def _cosine_to_min(warmup_steps: int, total_steps: int, opts: dict[str, Any], peak: float) -> Any:
    """cosine_with_min_lr: cosine's wave from the peak down to min_lr (a rate) or min_lr_rate (a share of the peak),
    not to 0; transformers' expression, to the last bit."""
    min_lr, cycles = opts["min_lr"], float(opts["num_cycles"])
    floor = opts["min_lr_rate"] if min_lr is None else min_lr / peak

    def factor(step: int) -> float:
        if step < warmup_steps:
            return float(step) / float(max(1, warmup_steps))
        progress = float(step - warmup_steps) / float(max(1, total_steps - warmup_steps))
        wave = 0.5 * (1.0 + math.cos(math.pi * cycles * 2.0 * progress))
        return max(0, wave * (1 - floor) + floor)

    return factor


def _warmup_stable_decay(warmup_steps: int, total_steps: int, opts: dict[str, Any]) -> Any:
    """warmup_stable_decay: warm-up (warmup_type) from min_lr_ratio of the peak, the peak for num_stable_steps (by
    default the steps that warm-up and num_decay_steps leave), a decay (decay_type) back to min_lr_ratio over
    num_decay_steps, then min_lr_ratio; transformers' expression, to the last bit."""
    decay, floor, cycles = opts["num_decay_steps"], opts["min_lr_ratio"], opts["num_cycles"]
    stable = opts["num_stable_steps"]
    stable = total_steps - warmup_steps - decay if stable is None else stable  # may be < 0, as in transformers

    def shaped(kind: str, progress: float, rising: bool) -> float:
        if kind == "linear":
            return progress if rising else 1.0 - progress
        if kind == "cosine":
            return (0.5 * (1.0 - math.cos(math.pi * progress)) if rising
                    else 0.5 * (1.0 + math.cos(math.pi * float(cycles) * 2.0 * progress)))
        return 1.0 - math.sqrt(1.0 - progress) if rising else 1.0 - math.sqrt(progress)  # "1-sqrt"

    def factor(step: int) -> float:
        if step < warmup_steps:
            progress = float(step) / float(max(1, warmup_steps))
            return max(0.0, shaped(opts["warmup_type"], progress, True) * (1.0 - floor) + floor)
        if step < warmup_steps + stable:
            return 1.0
        if step < warmup_steps + stable + decay:
            progress = float(step - warmup_steps - stable) / float(max(1, decay))
            return max(0.0, shaped(opts["decay_type"], progress, False) * (1.0 - floor) + floor)
        return floor

    return factor


def optimisation(model: nn.Module, args: TrainingSettings, total: int, device: str,
                  groups: list[dict] | None, schedule: dict[str, Any] | None = None) -> tuple[Any, Any, Any]:
    """The optimiser (over ``groups``, or the model's), its learning-rate schedule over the run's ``total`` steps
    (each group's rate times the same factor; ``schedule``: the schedule's options, ``schedule_options``), and the
    fp16 gradient scaler."""
    optimizer = build_optimizer(model, args.learning_rate, args.weight_decay,
                                (args.adam_beta1, args.adam_beta2), args.adam_epsilon, groups)
    scheduler = linear_warmup_decay(optimizer, args.warmup_for(total), total, args.lr_scheduler_type, schedule)
    scaler = torch.amp.GradScaler(torch.device(device).type, enabled=args.fp16)
    return optimizer, scheduler, scaler
