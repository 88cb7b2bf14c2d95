"""Several processes, one training run: every training command runs unchanged under ``torchrun``, which bertkit
joins (gloo on CPU, NCCL on CUDA, each process pinned to its device) and leaves on exit and on error.
docs/distributed.md says what N processes change.

One node, 4 processes (copy-paste; add your data and settings)::

    torchrun --standalone --nproc_per_node 4 -m bertkit pretrain --data runs/data128 --vocab runs/vocab \\
        --output-dir runs/pretrain --max-steps 10000 --batch-size 256

Several nodes: docs/distributed.md.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import sys
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from bertkit._hardware import resolve_device
from bertkit._parallel import DistInfo, info_from_env
from bertkit.errors import BertkitError

logger = logging.getLogger("bertkit")


def current() -> DistInfo:
    """This process's place in the initialised process group (rank 0 of 1 when there is none)."""
    if not (dist.is_available() and dist.is_initialized()):
        return DistInfo()
    rank, launched = dist.get_rank(), info_from_env()
    return DistInfo(rank, dist.get_world_size(), launched.local_rank if launched.enabled else rank)


def process_device(spec: str) -> str:
    """``resolve_device`` for this process: under torchrun a bare ``cuda`` (or ``auto``) is its own GPU."""
    return resolve_device(spec, current().local_rank)


def _join(device: str, timeout_s: float, flag: str) -> tuple[DistInfo, str, bool]:
    """Join the group torchrun describes, unless there is none or this process is in one already: (this
    process's place, its device, whether it joined now). ``flag`` names the timeout setting in the error."""
    info = info_from_env()
    if not info.enabled or dist.is_initialized():
        info = current() if dist.is_initialized() else info
        return info, resolve_device(device, info.local_rank), False
    if timeout_s <= 0:
        raise BertkitError(f"{flag} must be a positive number of seconds, got {timeout_s}")
    dev = resolve_device(device, info.local_rank)
    cuda = dev.startswith("cuda")
    if cuda:
        torch.cuda.set_device(dev)
    dist.init_process_group("nccl" if cuda else "gloo", timeout=timedelta(seconds=timeout_s),
                            device_id=torch.device(dev) if cuda else None)
    logger.info("rank %d of %d (local rank %d) on %s, backend %s", info.rank, info.world_size, info.local_rank,
                dev, dist.get_backend())
    return info, dev, True


@contextlib.contextmanager
def process_group(device: str = "auto", timeout_s: float = 1800.0) -> Iterator[tuple[DistInfo, str]]:
    """Join torchrun's process group for the duration of a command; yields (this process's place, its device).
    The group is destroyed on the way out, on errors too; ``timeout_s`` bounds a collective's wait for a peer."""
    info, dev, joined = _join(device, timeout_s, "--ddp-timeout")
    if not joined:
        yield info, dev
        return
    try:
        yield info, dev
        # Every rank reaches the end before any tears its connections down: gloo aborts a process (SIGABRT)
        # whose peer closed the pair under it. Not on an error: a dead rank would never arrive.
        dist.barrier()
    finally:
        dist.destroy_process_group()


def join_for_process(device: str = "auto", timeout_s: float = 1800.0) -> tuple[DistInfo, str]:
    """Join torchrun's process group for the rest of this process's life (``bertkit.Trainer``, which no command
    wraps). At exit a process waits for its peers, then leaves; after an uncaught error it leaves at once."""
    info, dev, joined = _join(device, timeout_s, "ddp_timeout")
    if not joined:
        return info, dev
    failed: list[bool] = []
    previous_hook = sys.excepthook

    def note_failure(*exc_info: Any) -> None:  # an uncaught error: its peers will not reach the barrier
        failed.append(True)
        previous_hook(*exc_info)

    def leave() -> None:
        if not dist.is_initialized():
            return
        if not failed:
            with contextlib.suppress(Exception):
                dist.barrier()
        dist.destroy_process_group()

    sys.excepthook = note_failure
    atexit.register(leave)
    return info, dev


def process_rank() -> int:
    """This process's rank: in the initialised process group, else the one torchrun's environment gives it (which
    ``join_for_process`` joins as), else 0."""
    return current().rank if dist.is_available() and dist.is_initialized() else info_from_env().rank


def agree(ok: bool, what: str) -> bool:
    """Whether every rank got through a step: a failure on one rank becomes an error on all instead of a hang.
    Returns False on a rank that failed itself (it raises its own error); raises on the others."""
    flags = all_gather(bool(ok))
    if ok and not all(flags):
        bad = [r for r, f in enumerate(flags) if not f]
        raise BertkitError(f"{what} failed on rank(s) {bad} (their message is above); all ranks stop")
    return ok


def all_gather(obj: Any) -> list[Any]:
    """Every rank's ``obj`` (a small picklable value), in rank order; ``[obj]`` in one process."""
    info = current()
    if not info.enabled:
        return [obj]
    out = [None] * info.world_size
    dist.all_gather_object(out, obj)
    return out


def _all_reduce(value: float, op: Any, device: str) -> float:
    if not current().enabled:
        return value
    t = torch.tensor([float(value)], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=op)
    return t.item()


def sum_over_ranks(value: int, device: str) -> int:
    """``value`` summed over every rank (itself in one process)."""
    return int(_all_reduce(value, dist.ReduceOp.SUM, device))


def any_rank(flag: bool, device: str) -> bool:
    """True when ``flag`` is true on some rank: one decision every rank takes the same way."""
    return bool(_all_reduce(flag, dist.ReduceOp.MAX, device))


# -- The model across processes: DDP ---------------------------------------------------------------------------


def replicate(model: nn.Module, device: str) -> nn.Module:
    """``model`` on ``device`` as the loop runs it: itself in one process; under torchrun wrapped in DDP."""
    model.to(device)
    if not current().enabled:
        return model
    cuda = torch.device(device).type == "cuda"
    return DistributedDataParallel(model, device_ids=[torch.device(device)] if cuda else None)


def accumulating(module: nn.Module, sync: bool) -> contextlib.AbstractContextManager:
    """Backward passes inside add to the local gradient; only the final micro-step (``sync``) communicates."""
    if sync or not isinstance(module, DistributedDataParallel):
        return contextlib.nullcontext()
    return module.no_sync()
