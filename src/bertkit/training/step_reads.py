"""A training step's values on their way from the device: each micro-batch's loss (which spoils the step when it is
not finite) and what the logs show of it, read with the step's gradient norm in one copy at the step's end. A read
waits for the device; one at every micro-batch, and another for the norm, left it idle while the host queued the
next work. The loop (``loop._Run.settle``) decides what each value does: the logging window, or a spoiled step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


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
