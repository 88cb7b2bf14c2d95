"""A training step's values on their way from the device: each micro-batch's loss (which spoils the step when it is
not finite) and what the logs show of it, read with the step's gradient norm in one copy at the step's end; and the
rows and tokens the logs count, summed over the ranks with the logging window. A read waits for the device; one at
every micro-batch, and another for the norm, left it idle while the host queued the next work. The loop
(``loop._Run.settle``) decides what each value does: the logging window, or a spoiled step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from bertkit.training.batch_plan import Batch
from bertkit.training.distributed import all_gather


@dataclass
class MicroLoss:
    """One micro-batch's part of the step's read: its loss and the logs' loss (``token_loss.loss_to_log``), both
    still on the device, and its host-side facts."""

    loss: Tensor
    logged: tuple[Tensor, bool]
    counted: bool  # weight > 0: a rank's stand-in example of an empty share is not logged
    labels: Tensor | None
    metrics: dict[str, float]

    def spoiled(self, loss: float) -> str:
        """Why the step is dropped when this micro-batch's loss ``loss`` is not finite."""
        labels = self.labels
        if labels is not None and not labels.is_floating_point() and bool((labels == -100).all()):
            # A mean over no target is nan: the data, not the learning rate, is the cause.
            return (f"the loss is {loss} because every label of this batch is -100 (ignored by the loss), so it has "
                    "nothing to learn from; drop such rows or check how the labels were made")
        return f"the loss is {loss}"


def read_step(pending: list[MicroLoss], norm: Tensor | None, device: str | torch.device
              ) -> tuple[list[tuple[float, float]], float | None] | None:
    """``pending``'s (loss, logged loss) values and ``norm`` as floats, in one read; None when there is nothing."""
    tensors = [t for m in pending for t in (m.loss, m.logged[0])] + ([norm] if norm is not None else [])
    if not tensors:
        return None
    dtype = torch.float32 if torch.device(device).type == "mps" else torch.float64  # exact for both
    values = torch.stack([t.reshape(()).to(dtype) for t in tensors]).tolist()
    pairs = [(values[2 * i], values[2 * i + 1]) for i in range(len(pending))]
    return pairs, values[-1] if norm is not None else None


def rows(batch: Batch) -> int:
    """The batch's rows (a model without input_ids, e.g. the feature study's tagger on activations, marks its rows
    with attention_mask; a cross-encoder's input_ids are lists of word pieces)."""
    rows = batch["input_ids"] if "input_ids" in batch else batch["attention_mask"]
    return rows.shape[0] if isinstance(rows, Tensor) else len(rows)


def real_tokens(batch: Batch) -> int:
    if "attention_mask" in batch:
        return int(batch["attention_mask"].sum())
    ids = batch["input_ids"]
    if isinstance(ids, Tensor):
        return ids.numel()
    return sum(len(piece) for row in ids for piece in row)  # word-piece lists (a cross-encoder's texts)


def over_ranks(window: dict, n: float, seqs: int, tokens: int) -> tuple[dict, float, int, int]:
    """The logging window summed over the ranks."""
    parts = all_gather((window, n, seqs, tokens))
    if len(parts) == 1:
        return window, n, seqs, tokens
    sums: dict = {}
    for w, _, _, _ in parts:
        for k, v in w.items():
            sums[k] = sums.get(k, 0.0) + v
    return sums, sum(p[1] for p in parts), sum(p[2] for p in parts), sum(p[3] for p in parts)
