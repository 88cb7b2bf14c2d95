"""``train_sampling_strategy="group_by_length"``: transformers' LengthGroupedSampler's order, row for row.

transformers' Trainer hands its DataLoader a LengthGroupedSampler with no generator of its own, so each epoch's
order is drawn from torch's global generator when the epoch's loader starts (after the one number the loader itself
draws, ``trainer_data.loader_draw``): it depends on every draw before it (set_seed, dropout's masks in the epochs
before), and data_seed plays no part. bertkit draws it at the same point of the same global stream, so its dropout
and its order stay transformers'. A resumed run cannot draw it again (the global generator has moved on by the
checkpoint), so the generator's state at the epoch's start is written into each checkpoint and the resumed epoch
is drawn from it: the uninterrupted run's order (transformers' own resumed run draws another).

Under torchrun with N processes, transformers' processes, seeded alike by set_seed and drawing alike, all draw the
same permutation from their global generators (accelerate leaves this sampler's generator unset), and accelerate
deals its batches of per_device_train_batch_size out in turns: process r takes batches r, r + N, r + 2N, ..., rank
r's contiguous share of each global micro-batch of bertkit's plan. bertkit's ranks are seeded apart for dropout
(seed + rank), so every rank draws the order from rank 0's generator state, the one each transformers process holds
there (until, with dropout on a CPU, their draws drift apart with their batches' lengths: from the second epoch
transformers' processes draw other orders, some rows trained twice in an epoch and some not at all; bertkit keeps
rank 0's).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from bertkit.errors import BertkitError
from bertkit.training.distributed import all_gather

STATE_FILE = "length_grouped_rng.pt"  # a checkpoint's record of the epoch's generator state


def grouped_indices(lengths: Sequence[int], batch_size: int, generator: torch.Generator | None) -> list[int]:
    """transformers' get_length_grouped_indices: a permutation cut into megabatches of ``mult`` batches (50, or
    fewer so that the data makes 4 megabatches, at least 1), each sorted longest first (a stable sort: equal lengths
    keep the permutation's order), then the longest row of all swapped to the very front, so that a batch too long
    for the memory fails at the first step."""
    n = len(lengths)
    mult = max(1, min(n // (batch_size * 4), 50))
    size = mult * batch_size
    indices = torch.randperm(n, generator=generator)
    megabatches = [sorted(indices[i:i + size].tolist(), key=lambda j: lengths[j], reverse=True)
                   for i in range(0, n, size)]
    # torch.argmax names the first of equal maxima, as transformers' does
    longest = int(torch.argmax(torch.tensor([lengths[m[0]] for m in megabatches])).item())
    megabatches[0][0], megabatches[longest][0] = megabatches[longest][0], megabatches[0][0]
    return [i for megabatch in megabatches for i in megabatch]


def row_lengths(examples: Sequence, column: str | None, input_name: str) -> list[int]:
    """Each row's length as transformers' Trainer reads it: the ``column`` (length_column_name, "length" by default)
    where the data (after remove_unused_columns) still has one, else the length of the tokenizer's first model
    input."""
    first = examples[0]
    if column is not None and column in first:
        return [int(examples[i][column]) for i in range(len(examples))]
    if input_name not in first:
        raise BertkitError(
            f"train_sampling_strategy='group_by_length' reads each row's length from its {input_name!r}, and the "
            f"training rows hold {sorted(first)}; tokenize the data first, or give a {column or 'length'!r} column "
            "(length_column_name) with remove_unused_columns=False")
    return [len(examples[i][input_name]) for i in range(len(examples))]


class LengthGroupedOrder:
    """Each epoch's order of the rows, drawn as transformers' LengthGroupedSampler draws it. ``begin_epoch`` is
    called where transformers' loader starts the epoch; ``order(epoch)`` is that epoch's permutation."""

    def __init__(self, lengths: list[int], batch_size: int):
        self.lengths, self.batch_size = lengths, batch_size
        self.states: dict[int, torch.Tensor] = {}  # epoch -> the global generator's state at its start

    def begin_epoch(self, epoch: int) -> None:
        """Take the epoch's order from torch's global generator (rank 0's under torchrun), moving it on as
        transformers' sampler does."""
        self.states = {epoch: all_gather(torch.get_rng_state())[0]}
        torch.randperm(len(self.lengths))

    def order(self, epoch: int) -> list[int]:
        if epoch not in self.states:
            raise BertkitError(f"the length-grouped order of epoch {epoch} was not drawn: its checkpoint holds no "
                               f"{STATE_FILE}")
        generator = torch.Generator()
        generator.set_state(self.states[epoch])
        return grouped_indices(self.lengths, self.batch_size, generator)

    def save(self, directory: Path) -> None:
        torch.save(self.states, directory / STATE_FILE)

    def load(self, checkpoint: Path) -> None:
        """The epoch's generator state a checkpoint was written in."""
        path = checkpoint / STATE_FILE
        if not path.is_file():
            raise BertkitError(
                f"{checkpoint} holds no {STATE_FILE}: it was not written by a train_sampling_strategy="
                "'group_by_length' run of this bertkit, so its epoch's order cannot be drawn again; resume it with the "
                "strategy it was trained with, or train again from the start")
        self.states = torch.load(path, weights_only=True)
