"""A training step's values on their way from the device to the logs. Each micro-batch's loss (which spoils the step
when it is not finite) and what the logs show of it are read with the step's gradient norm in one copy at the step's
end (``read_step``): a read waits for the device, and one at every micro-batch, and another for the norm, left it
idle while the host queued the next work. The loop (``loop._Run.settle``) decides what each value does: a spoiled
step, or a part of the ``LogWindow``, the steps since the last train record, whose means, rows and tokens each
record reports, summed over the ranks.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

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
    weight: float  # this rank's share of the global micro-batch x world_size (0: a stand-in for an empty share)
    labels: Tensor | None
    metrics: dict[str, tuple[float, float]]  # batch_metrics: (sum, count) by name
    unscored: bool = False  # its step holds no labelled item (every rank's): the step's loss is 0 / 0, no number

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


_COUNT = "/count"  # a batch metric's count in the window's sums, beside its sum


@dataclass
class LogWindow:
    """The logging window: the loss (and batch metrics) summed over its steps, each step the mean of its micro-batches
    as it trains on them, the steps ``n``, and the rows and tokens trained on since ``t0`` (less the time ``paused``);
    and over every step this
    ``train`` call trained, the loss that train_loss reports. A checkpoint keeps each rank's partial sums
    (``saved``), so that a resumed run logs what an uninterrupted one does."""

    sums: dict = field(default_factory=dict)
    n: float = 0.0
    seqs: int = 0
    tokens: int = 0
    t0: float = 0.0
    trained_loss: float = 0.0
    trained_n: float = 0.0

    @classmethod
    def resumed(cls, saved: dict, written_by: int = 1, world_size: int = 1) -> LogWindow:
        """The window of a checkpoint's ``saved()`` (its sums and, under ``_n``, its steps), written by
        ``written_by`` ranks and continued by ``world_size``. Every rank adds each step's share and its loss x the
        world size (the step's mean is their sum over the ranks over ``n``'s), so a window carried to another world
        size is rescaled to it: a step before a resume from 1 process to 2 otherwise weighed half of one after it
        in the record (batch metrics are plain sums and counts, exact at any world size)."""
        sums = dict(saved)
        scale = world_size / written_by
        if "loss" in sums:
            sums["loss"] *= scale
        return cls(sums, float(sums.pop("_n", 0)) * scale)

    def saved(self) -> dict:
        return {**self.sums, "_n": self.n}

    def count(self, batch: Batch) -> None:
        """Throughput: ``batch``'s rows and tokens, counted on the host before it moves to the device."""
        self.seqs, self.tokens = self.seqs + rows(batch), self.tokens + real_tokens(batch)

    def add(self, loss: float, share: float, metrics: dict[str, tuple[float, float]]) -> None:
        """A micro-batch's part of its step: ``loss`` (already its share of the step's mean; ``share`` is the
        micro-batch's fraction of the step) and ``metrics``, (sum, count) by name, each logged as its sum over its
        count in the window (an MLM loss per target: a micro-batch's own mean weighed by its rows missed the step's
        token mean)."""
        self.sums["loss"] = self.sums.get("loss", 0.0) + loss
        self.trained_loss += loss
        self.trained_n += share
        for k, (total, count) in metrics.items():
            self.sums[k] = self.sums.get(k, 0.0) + total
            self.sums[k + _COUNT] = self.sums.get(k + _COUNT, 0.0) + count
        self.n += share

    def add_unscored(self, share: float, steps_before: int) -> None:
        """A micro-batch of a step with no labelled item, whose loss is 0 / 0: transformers' Trainer (its
        logging_nan_inf_filter, on by default) adds for each such micro-batch the window's loss so far over 1 + the
        steps logged in it before this one (``steps_before``), so the record is not pulled to 0 (nor made NaN);
        train_loss counts it too, as transformers' total loss does."""
        added = self.sums.get("loss", 0.0) / (1 + steps_before)
        self.add(added, share, {})

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Time spent inside (an evaluation, a checkpoint) is not the window's: its rows and tokens per second are
        training's (the window after an evaluation read 0.5 sequences/s where the steps ran at 2 to 10)."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.t0 += time.perf_counter() - start

    def take(self) -> dict[str, float]:
        """The window's means and throughput over every rank, for a train record; the next window starts now."""
        dt = time.perf_counter() - self.t0
        sums, n, seqs, tokens = _over_ranks(self.sums, self.n, self.seqs, self.tokens)
        self.sums, self.n, self.seqs, self.tokens, self.t0 = {}, 0.0, 0, 0, time.perf_counter()
        means = {k: v / (max(sums[k + _COUNT], 1) if k + _COUNT in sums else n) for k, v in sums.items()
                 if not k.endswith(_COUNT)}
        return {**means, "seqs_per_s": seqs / dt, "tokens_per_s": tokens / dt}

    def train_loss(self) -> float:
        """The mean loss of the steps this call trained, over every rank (0.0 for none)."""
        sums, n, _, _ = _over_ranks({"loss": self.trained_loss}, self.trained_n, 0, 0)
        return sums["loss"] / (n or 1)


def _over_ranks(window: dict, n: float, seqs: int, tokens: int) -> tuple[dict, float, int, int]:
    """The logging window summed over the ranks."""
    parts = all_gather((window, n, seqs, tokens))
    if len(parts) == 1:
        return window, n, seqs, tokens
    sums: dict = {}
    for w, _, _, _ in parts:
        for k, v in w.items():
            sums[k] = sums.get(k, 0.0) + v
    return sums, sum(p[1] for p in parts), sum(p[2] for p in parts), sum(p[3] for p in parts)
