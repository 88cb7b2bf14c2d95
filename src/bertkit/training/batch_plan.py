"""Which examples make up each micro-batch: a pure function of (seed, epoch), so a checkpoint only remembers where
it was (phase, epoch, batch); the order is cut into global micro-batches, so that position does not depend on the
number of processes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from bertkit._hardware import host_workers
from bertkit.errors import BertkitError

Batch = dict[str, Tensor]


class BatchPlan:
    """Which examples make up each micro-batch of each epoch. ``collate`` turns a list of examples into a batch of
    tensors; a dataset that draws something per epoch (dynamic masking) gets ``set_epoch(epoch)`` before use. Each
    *global* micro-batch holds ``batch_size x world_size`` examples, of which process ``rank`` reads its contiguous
    slice; ``len(plan)`` counts them. ``draw(epoch)``, when given, gives the epoch's global micro-batches
    (bertkit.Trainer: transformers' seeded RandomSampler's permutation cut into batches, or sentence-transformers'
    no-duplicates sampler, whose batches may be short), of which the first ``len(plan)`` are trained on;
    ``per_epoch``: how many that is (default: ceil(rows / global batch); sentence-transformers' multi-dataset
    samplers count otherwise)."""

    def __init__(self, dataset: Sequence, batch_size: int, collate: Callable[[list], Batch], *,
                 seed: int, shuffle: bool = True, rank: int = 0, world_size: int = 1,
                 draw: Callable[[int], list[list[int]]] | None = None, per_epoch: int | None = None):
        if batch_size < 1:
            raise BertkitError(f"batch_size must be >= 1, got {batch_size}")
        if len(dataset) == 0:
            raise BertkitError("the training data is empty: there is nothing to train on")
        if not 0 <= rank < world_size:
            raise BertkitError(f"rank {rank} is not in [0, world_size {world_size})")
        self.dataset, self.batch_size, self.collate = dataset, batch_size, collate
        self.shuffle, self.seed = shuffle, seed
        self.rank, self.world_size = rank, world_size
        self.draw = draw
        self.per_epoch = per_epoch if per_epoch is not None else math.ceil(len(dataset) / (batch_size * world_size))
        self._epoch: tuple[int, list[list[int]]] | None = None  # the last epoch's batches, drawn once

    def __len__(self) -> int:
        return self.per_epoch

    def global_batches(self, epoch: int) -> list[list[int]]:
        """Every rank's examples of each micro-step of ``epoch`` (one list per global micro-batch; not to be
        modified: the loop asks for them at every step, and they are drawn once an epoch)."""
        if self._epoch is None or self._epoch[0] != epoch:
            self._epoch = (epoch, self._draw(epoch))
        return self._epoch[1]

    def _draw(self, epoch: int) -> list[list[int]]:
        n, per_step = len(self.dataset), self.batch_size * self.world_size
        if self.draw is not None:
            drawn = [[int(i) for i in batch] for batch in self.draw(epoch)[:len(self)]]
            assert len(drawn) == len(self) and all(drawn), "draw gives an epoch's batches, none empty"
            return drawn
        if self.shuffle:
            order = torch.randperm(n, generator=torch.Generator().manual_seed(self.seed * 100_003 + epoch)).tolist()
        else:
            order = list(range(n))
        return [order[i:i + per_step] for i in range(0, len(self) * per_step, per_step)]

    def shard(self, chunk: list[int]) -> list[int]:
        """This rank's contiguous slice of one global micro-batch."""
        base, extra = divmod(len(chunk), self.world_size)
        start = self.rank * base + min(self.rank, extra)
        return chunk[start:start + base + (self.rank < extra)]

    def batches(self, epoch: int) -> list[list[int]]:
        """This rank's micro-batches of ``epoch`` (all of them in one process)."""
        return [self.shard(chunk) for chunk in self.global_batches(epoch)]

    def load(self, epoch: int, indices: list[int]) -> Batch:
        if hasattr(self.dataset, "set_epoch"):
            self.dataset.set_epoch(epoch)
        return self.collate([self.dataset[i] for i in indices])


class EpochBatches(torch.utils.data.Dataset):
    """Micro-batch ``i`` of one epoch for this rank, as ``(weight, batch)``: ``weight`` = this rank's share of the
    global micro-batch x world_size, so DDP's average of the ranks' losses is the global batch's mean. A rank whose
    share is empty gets one example at weight 0: its backward pass must still take part in the all-reduce.
    """

    def __init__(self, plan: BatchPlan, epoch: int):
        self.plan, self.epoch, self.chunks = plan, epoch, plan.global_batches(epoch)

    def __len__(self) -> int:
        return len(self.chunks)

    def __getitem__(self, i: int) -> tuple[float, Batch]:
        chunk = self.chunks[i]
        mine = self.plan.shard(chunk)
        return len(mine) * self.plan.world_size / len(chunk), self.plan.load(self.epoch, mine or chunk[:1])


def _unbatched(item: Any) -> Any:
    return item  # EpochBatches items are whole batches already (a module-level function: workers pickle it)


def epoch_loader(plan: BatchPlan, epoch: int, start: int, num_workers: int | None, cuda: bool
                 ) -> torch.utils.data.DataLoader:
    """Micro-batches ``start``.. of ``epoch`` through a DataLoader (with workers, collated ahead of the step).
    ``num_workers`` None: ``host_workers`` (sized to the machine on CUDA, 0 on the CPU)."""
    num_workers = host_workers("cuda" if cuda else "cpu") if num_workers is None else num_workers
    return torch.utils.data.DataLoader(
        EpochBatches(plan, epoch), batch_size=None, sampler=range(start, len(plan)), collate_fn=_unbatched,
        num_workers=num_workers, pin_memory=cuda, prefetch_factor=4 if num_workers else None,
        # its own generator: a DataLoader iterator otherwise draws its worker seed from the global RNG, which
        # would shift dropout's random stream wherever an epoch starts (and differently after a resume)
        generator=torch.Generator().manual_seed(plan.seed * 100_003 + epoch))


def steps_per_epoch(plan: BatchPlan, grad_accum: int) -> int:
    """Optimiser steps an epoch makes: its last takes the micro-batches left (the loop's ``micro_step``)."""
    return max(1, math.ceil(len(plan) / grad_accum))


def steps_for_epochs(plan: BatchPlan, epochs: float, grad_accum: int) -> int:
    """transformers' count: whole epochs' steps, a fraction of an epoch rounded up."""
    return max(1, math.ceil(epochs * steps_per_epoch(plan, grad_accum)))
