"""Seeding a training run's generators: transformers' ``set_seed``, and bertkit's one seed per rank under torchrun
(``seed + rank``), set when a trainer is made (``seed_generators``) or as the loop's commands begin a fresh run
(``seed_process``)."""

from __future__ import annotations

import random

import numpy as np
import torch

from bertkit.training.distributed import process_rank


def set_seed(seed: int, deterministic: bool = False) -> None:
    """Seed Python, numpy and torch (transformers' ``set_seed``, which its Trainer calls on creation);
    ``deterministic=True`` also turns on ``torch.use_deterministic_algorithms``, as there."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    if deterministic:
        torch.use_deterministic_algorithms(True)


def seed_generators(seed: int) -> None:
    """Seed as transformers' Trainer seeds when it is made (``set_seed``), torch's and Python's generators then
    offset by this process's rank under torchrun (``seed_process``: each rank its own dropout masks; rank 0's are
    transformers'). A fresh run's loop trains on from them (``LoopHooks.seeded``), so what is drawn between making the
    trainer and train() moves the run as it moves transformers'."""
    set_seed(seed)
    rank = process_rank()
    if rank:
        seed_process(seed, rank)


def seed_process(seed: int, rank: int) -> None:
    """Seed torch's and Python's generators for a fresh run, one seed per rank (``seed + rank``): the weights are
    equal on every rank anyway (the caller seeded them and DDP broadcasts rank 0's), but dropout must draw differently
    on each. Rank 0's seed is ``seed`` itself, so one process draws what transformers' ``set_seed(seed)`` draws."""
    torch.manual_seed(seed + rank)
    random.seed(seed + rank)
