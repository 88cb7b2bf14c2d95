"""Token-level losses over a whole optimiser step: divided by the labelled tokens of all its micro-batches on all
ranks (transformers' ``num_items_in_batch``), not a mean of per-micro-batch means, which would weigh the tokens of
a sparse micro-batch more, so that accumulation and several processes train as one big batch does.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

from torch import Tensor, nn

from bertkit.heads import IGNORE_INDEX
from bertkit.training.batch_plan import Batch
from bertkit.training.distributed import sum_over_ranks


def labelled_items(batch: Batch) -> int | None:
    """transformers' ``num_items_in_batch`` share of one batch: its ``labels`` that are not -100, whatever their shape
    (a classifier's rows, a tagger's tokens); None without ``labels``."""
    labels = batch.get("labels")
    return int((labels != IGNORE_INDEX).sum()) if isinstance(labels, Tensor) else None


def target_count(batch: Batch) -> int | None:
    """Labelled tokens in ``batch`` when its loss is per token (masked LM, tagging: labels (B, T) like
    input_ids, -100 where no loss); None for a per-sequence loss (classification, regression, spans)."""
    labels, ids = batch.get("labels"), batch.get("input_ids")
    if not isinstance(labels, Tensor) or not isinstance(ids, Tensor) or labels.shape != ids.shape \
            or labels.is_floating_point():
        return None
    return labelled_items(batch)


def step_targets(step: list[tuple[float, Batch]], device: str,
                 count: Callable[[Batch], int | None] = target_count) -> int | None:
    """The labelled items (``count``'s: by default tokens) of the step's micro-batches (``(weight, batch)``, read
    ahead), every rank's; None where ``count`` gives None (by default, per-sequence losses)."""
    counts = [count(batch) for _, batch in step]
    if counts[0] is None:
        return None
    # an empty share runs one example of the batch at weight 0: not a target
    return sum_over_ranks(sum(c for (weight, _), c in zip(step, counts) if weight > 0), device)


def forward_parameters(model: nn.Module) -> Mapping[str, inspect.Parameter]:
    """The arguments ``model``'s forward takes, by name. peft's wrapper (``get_peft_model``) passes what it does not
    name (``token_type_ids``, ``num_items_in_batch``) on to the model it wraps through ``**kwargs``: its base model's
    are read, as transformers' Trainer reads them, or the Trainer would drop those columns."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return inspect.signature(base.forward).parameters


def item_counter(model: nn.Module) -> Callable[[Batch], int | None] | None:
    """What the loop counts for ``model``'s num_items_in_batch: the labelled tokens when its forward takes it."""
    return target_count if "num_items_in_batch" in forward_parameters(model) else None


def model_loss(model: nn.Module, batch: Batch, num_items: Any) -> tuple[Tensor, Any, bool]:
    """The loop's loss unless its caller gives another (``LoopHooks.compute_loss``): the model's own, its outputs, and
    whether it is divided by the step's labelled items (``num_items``, given to the forward when not None)."""
    out = model(**batch) if num_items is None else model(**batch, num_items_in_batch=num_items)
    return getattr(out, "loss", None), out, num_items is not None  # None: outputs not read by name (the caller says)


def objective(loss: Tensor, out: Any, weight: float, accum: int, normalised: bool) -> Tensor:
    """The loss this micro-batch back-propagates: one not ``normalised`` over the step's items (a per-sequence mean)
    weighted by the micro-batch's share of the global batch (``weight``) over the accumulation steps; a normalised one
    (a per-token loss divided by the step's target count) as it is, a next-sentence part in ``out`` weighted as
    per-sequence."""
    if not normalised:
        if weight == 1.0:  # x / 1 is x: no kernel (and no backward one) for the common case
            return loss if accum == 1 else loss / accum
        return loss * weight / accum
    if weight == 0:
        return loss * 0
    nsp = getattr(out, "nsp_loss", None)
    return loss if nsp is None else loss + nsp * (weight / accum - 1)


def loss_to_log(loss: Tensor, normalised: bool, part: Tensor) -> tuple[Tensor, bool]:
    """The micro-batch's loss for the logs, still on the device, and whether it is normalised over the whole step's
    items: then ``part`` (``objective``'s), its part of the step's loss, which the step's micro-batches (every rank's)
    add up to: the step's token mean (pre-training's plus its next-sentence mean, as google-research/bert logs the loss
    of the batch)."""
    if not normalised:
        return loss.detach(), False
    return part.detach(), True
