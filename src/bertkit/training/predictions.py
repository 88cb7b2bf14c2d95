"""A model's outputs over a dataset in transformers' prediction layout: what ``Trainer.predict``, ``evaluate`` and
``compute_metrics`` see (rows in the dataset's order, token tasks padded with -100 to one length, a masked-LM's
logits at every position), with the labels and the mean loss.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from bertkit.errors import BertkitError
from bertkit.inference.runner import evaluate

# the output fields predictions are made of, in transformers' order (a masked-LM's prediction_logits is its logits)
FIELDS = ("logits", "start_logits", "end_logits", "prediction_logits", "seq_relationship_logits")


def gather(module: nn.Module, examples: Sequence, batches: list[list[int]], *, label_names: Sequence[str],
           collate: Callable[[list], dict], device: str, bf16: bool,
           forward: Callable[[dict], tuple[Any, Any]], on_step: Callable[[], None] | None = None,
           weights: Sequence[int] | None = None) -> tuple[Any, Any, float | None]:
    """(predictions, labels, mean loss) of every example, computed in ``batches`` (this process's) by ``forward``
    (a batch's loss and ``module``'s outputs); under torchrun every rank gets all the rows back, so metrics see the
    whole dataset once. ``on_step`` after each batch. The mean loss weighs each batch's by its rows, or by
    ``weights`` (one a batch)."""

    def step(batch: dict, rows: list) -> tuple[list[np.ndarray], list[np.ndarray], float | None]:
        """One batch's output arrays, label arrays (one per label name) and loss."""
        labels = [batch[k].cpu().numpy() for k in label_names if k in batch]  # before a loss that pops them
        mlm_labels = batch.get("labels")
        loss, out = forward(batch)
        fields = [getattr(out, f) for f in FIELDS if getattr(out, f, None) is not None]
        fields = list({id(f): f for f in fields}.values())
        if not fields and not hasattr(out, "loss"):  # a tuple or dict: read by name, it would give no predictions
            raise unreadable(module, out)
        if (mlm := getattr(out, "prediction_logits", None)) is not None and mlm_labels is not None:
            fields = [_at_every_token(f, mlm_labels) if f is mlm else f for f in fields]
        result = ([f.float().cpu().numpy() for f in fields], labels, None if loss is None else float(loss))
        if on_step is not None:
            on_step()
        return result

    parts = evaluate(step, examples, batches, pad=collate, device=device, bf16=bf16, model=module, gather=True)
    order = np.argsort(np.asarray([i for idx, _ in parts for i in idx], dtype=np.int64), kind="stable")

    def columns(batches: list[list[np.ndarray]]) -> Any:
        joined = [_concat([b[j] for b in batches])[order] for j in range(len(batches[0]))] if batches else []
        return None if not joined else joined[0] if len(joined) == 1 else tuple(joined)

    weights = weights if weights is not None else [len(idx) for idx, _ in parts]
    losses = [(p[2], w) for (_, p), w in zip(parts, weights) if p[2] is not None]
    return (columns([p[0] for _, p in parts]), columns([p[1] for _, p in parts if p[1]]),
            sum(v * w for v, w in losses) / sum(w for _, w in losses) if losses else None)


def unreadable(module: nn.Module, out: Any) -> BertkitError:
    """The error for outputs the Trainer cannot read by name (a tuple or a dict)."""
    return BertkitError(
        f"{type(module).__name__}'s outputs are a {type(out).__name__} (what its forward returned, or a compute_loss "
        f"override as its outputs), and the Trainer reads a model's outputs by name (loss, and predictions from "
        f"{', '.join(FIELDS)}): return an object with them as attributes (a dataclass, or transformers' ModelOutput), "
        "as bertkit's and transformers' heads do")


def _at_every_token(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """A masked-LM head given labels returns the labelled positions' logits alone, (N, V) row-major (heads.py);
    transformers' predictions are (B, T, V), as the labels (B, T) they are scored against: each row goes back to its
    position, zeros at the unlabelled ones (which a metric leaves out with the -100 labels)."""
    if logits.ndim != 2 or labels.ndim != 2:
        return logits
    full = logits.new_zeros(*labels.shape, logits.shape[-1])  # (B, T, V)
    full[labels != -100] = logits
    return full


def _concat(parts: list[np.ndarray]) -> np.ndarray:
    if all(p.shape[1:] == parts[0].shape[1:] for p in parts):
        return np.concatenate(parts)
    width = max(p.shape[1] for p in parts)  # token tasks: batches padded to different lengths
    return np.concatenate([np.pad(p, [(0, 0), (0, width - p.shape[1])] + [(0, 0)] * (p.ndim - 2),
                                  constant_values=-100) for p in parts])
