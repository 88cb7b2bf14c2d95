"""Token-level losses over a whole optimiser step: one global count of labelled tokens, not a mean of means.

A masked-LM or tagging loss averaged per micro-batch weighs the tokens of a sparse micro-batch more than
those of a dense one, so gradient accumulation and several processes would not train as one big batch does.
Here the loss of a step is divided by the labelled tokens of all its micro-batches on all ranks (the model
takes that count as transformers' ``num_items_in_batch``), and the micro-batches' losses are summed.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from bertkit.training.batch_plan import Batch, BatchPlan
from bertkit.training.distributed import sum_over_ranks


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
    The later micro-batches are collated once more here for their labels (transformers' Trainer reads ahead for
    ``num_items_in_batch`` too); the ranks' counts are summed in one all-reduce."""
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


def accepts_num_items(model: nn.Module) -> bool:
    import inspect

    module = getattr(model, "module", model)  # DDP wraps the model; FSDP2 shards it in place
    return "num_items_in_batch" in inspect.signature(module.forward).parameters


def objective(out: Any, weight: float, accum: int, token_level: bool) -> Any:
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


def logged_loss(out: Any, num_items: float | None, local: int | None) -> float:
    """The micro-batch's mean loss for the logs, whatever normalisation the objective used."""
    if num_items is None:
        return out.loss.item()
    if getattr(out, "mlm_loss", None) is not None:
        nsp = getattr(out, "nsp_loss", None)
        return (out.mlm_loss if nsp is None else out.mlm_loss + nsp).item()  # in the loss's dtype, as its own sum
    return out.loss.item() * num_items / local if local else 0.0

