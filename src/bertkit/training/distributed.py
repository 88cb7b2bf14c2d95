"""Several processes, one training run: PyTorch's own engine (torchrun launches, torch.distributed talks).

Every training command runs unchanged under ``torchrun``: bertkit reads the launcher's environment
(``info_from_env``), joins the process group (gloo on CPU, NCCL on CUDA) with each process pinned to its
device, and leaves it on exit and on error. Without torchrun nothing here runs. docs/distributed.md says what
N processes change (the global batch, each rank's slice of it, rank 0 alone writing, DDP or ``--fsdp``).

One node, 4 processes (copy-paste; add your data and settings)::

    torchrun --standalone --nproc_per_node 4 -m bertkit pretrain --data runs/data128 --vocab runs/vocab \\
        --output-dir runs/pretrain --max-steps 10000 --batch-size 256

Two nodes of 8 GPUs each (run the same line on both; HOST is node 0's address)::

    torchrun --nnodes 2 --nproc_per_node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29400 --rdzv-id bert1 \\
        -m bertkit pretrain --data /shared/data128 --vocab /shared/vocab --output-dir /shared/runs/p \\
        --max-steps 100000 --batch-size 4096 --bf16
"""

from __future__ import annotations

import atexit
import contextlib
import copy
import logging
import os
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from bertkit._hardware import resolve_device
from bertkit.errors import BertkitError

logger = logging.getLogger("bertkit")


@dataclass(frozen=True)
class DistInfo:
    """Where this process stands in the run: its rank among ``world_size`` and on its node."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        """Rank 0 logs, writes files and shows the progress bar."""
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def info_from_env(env: Mapping[str, str] | None = None) -> DistInfo:
    """The place torchrun's environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``) gives this process; rank 0 of 1
    without torchrun."""
    env = os.environ if env is None else env
    if not all(k in env for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK")):
        return DistInfo()
    try:
        info = DistInfo(int(env["RANK"]), int(env["WORLD_SIZE"]), int(env["LOCAL_RANK"]))
    except ValueError:
        raise BertkitError(f"RANK={env['RANK']!r} WORLD_SIZE={env['WORLD_SIZE']!r} LOCAL_RANK={env['LOCAL_RANK']!r}: "
                           "torchrun sets these to integers; unset them to run one process") from None
    if not 0 <= info.rank < info.world_size:
        raise BertkitError(f"RANK {info.rank} is not in [0, WORLD_SIZE {info.world_size})")
    return info


def current() -> DistInfo:
    """This process's place in the initialised process group (rank 0 of 1 when there is none); its local rank is
    torchrun's (``info_from_env``), or its rank in a group made without torchrun."""
    if not (dist.is_available() and dist.is_initialized()):
        return DistInfo()
    rank, launched = dist.get_rank(), info_from_env()
    return DistInfo(rank, dist.get_world_size(), launched.local_rank if launched.enabled else rank)


def process_device(spec: str) -> str:
    """``resolve_device`` for this process: under torchrun a bare ``cuda`` (or ``auto``) is its own GPU."""
    return resolve_device(spec, current().local_rank)


def _join(device: str, timeout_s: float, flag: str) -> tuple[DistInfo, str, bool]:
    """Join the group torchrun describes (gloo on CPU, NCCL on CUDA, each process pinned to its GPU), unless there
    is none or this process is in one already (a test made it): (this process's place, its device, whether it
    joined now). ``flag`` names the timeout setting in the error."""
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
    The group is destroyed on the way out, on errors too, so a failed rank never leaves its peers a half-open
    group; ``timeout_s`` bounds how long a collective waits for a peer that stopped answering."""
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
    """Join torchrun's process group for the rest of this process's life, for the Python API (``bertkit.Trainer``)
    where no command wraps the run: a script under torchrun joins on its first Trainer, as transformers'
    TrainingArguments does. At exit a process waits for its peers (the barrier above), then leaves; after an
    uncaught error it leaves at once (its peers fail in their next collective, as under a command)."""
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


def agree(ok: bool, what: str) -> bool:
    """Every rank learns whether every rank got through a step (such as claiming the output directory on
    rank 0): a failure on one rank becomes an error on all instead of a hang in the next collective.
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



# -- The model across processes: DDP or FSDP2 ----------------------------------------------------------------


def encoder_layers(model: nn.Module) -> list[nn.Module]:
    """The Transformer layers of a bertkit model (the units FSDP shards and gradient checkpointing recomputes)."""
    encoder = getattr(getattr(model, "bert", model), "encoder", None)
    layers = getattr(encoder, "layer", None)
    if layers is None:
        raise BertkitError(f"{type(model).__name__} is not a bertkit model: it has no encoder layers to shard")
    return list(layers)


class Replicas:
    """The model as the training loop drives it: ``module`` takes the forward and backward passes.

    - one process: ``module`` is the model itself;
    - DDP: ``module`` wraps the model (same parameters) and averages gradients over the ranks;
    - FSDP2: ``module`` is a sharded copy of the model (each rank holds 1/N of every layer's parameters,
      gradients and optimiser state); ``finish()`` gathers the trained weights back into the caller's
      model, which stays a plain module (to save, predict, or train again).
    """

    def __init__(self, model: nn.Module, device: str, *, fsdp: bool = False):
        self.model, self.info, self.fsdp = model, current(), fsdp
        if fsdp and not self.info.enabled:
            logger.info("--fsdp in a single process: nothing to shard; training as usual")
            self.fsdp = False
        self.device = device
        if not self.fsdp:
            model.to(device)
        if not self.info.enabled:
            self.module: nn.Module = model
        elif self.fsdp:
            from torch.distributed.fsdp import fully_shard

            # The caller's model stays a plain module on the CPU (it receives the trained weights in
            # finish()); the copy on the device is sharded layer by layer.
            sharded = copy.deepcopy(model).to(device)
            for layer in encoder_layers(sharded):
                fully_shard(layer)
            fully_shard(sharded)
            self.module = sharded
        else:
            from torch.nn.parallel import DistributedDataParallel as DDP

            cuda = torch.device(device).type == "cuda"
            self.module = DDP(model, device_ids=[torch.device(device)] if cuda else None)

    @property
    def eval_module(self) -> nn.Module:
        """What evaluation runs on: the model (DDP, one process) or the sharded copy (FSDP, on every rank)."""
        return self.module if self.fsdp else self.model

    @contextlib.contextmanager
    def accumulating(self, sync: bool) -> Iterator[None]:
        """Backward passes inside add to the local gradient; only the final micro-step (``sync``) communicates."""
        if sync or not self.info.enabled:
            yield
        elif self.fsdp:
            self.module.set_requires_gradient_sync(False)  # type: ignore[operator]
            try:
                yield
            finally:
                self.module.set_requires_gradient_sync(True)  # type: ignore[operator]
        else:
            with self.module.no_sync():  # type: ignore[operator]
                yield

    def state_dicts(self, optimizer: torch.optim.Optimizer) -> tuple[dict, dict]:
        """Full (unsharded) model and optimiser state dicts on CPU, the same for every world size and strategy.
        FSDP gathers them (a collective: every rank calls this); rank 0 receives them, the others get ``{}``."""
        if not self.fsdp:
            # Views of the parameters (keep_vars): torch.save then writes the tied word embeddings once.
            state = {k: v.detach() for k, v in self.model.state_dict(keep_vars=True).items()}
            return state, optimizer.state_dict()
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

        return get_state_dict(self.module, optimizer,
                              options=StateDictOptions(full_state_dict=True, cpu_offload=True))

    def load_optimizer(self, optimizer: torch.optim.Optimizer, state: dict) -> None:
        """Load a full optimiser state dict (as ``state_dicts`` returns) on every rank."""
        if not self.fsdp:
            saved = [len(g["params"]) for g in state.get("param_groups", [])]
            now = [len(g["params"]) for g in optimizer.param_groups]
            if saved != now:  # torch's own message names no cause; a different parameter layout is the usual one
                raise BertkitError(
                    f"the checkpoint's optimiser state holds parameter groups of {saved} tensors, this model's "
                    f"optimiser {now}: it was written for another model, so the run cannot be resumed; start a new "
                    "run (its model files can still initialise one)")
            optimizer.load_state_dict(state)
            return
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        set_optimizer_state_dict(self.module, optimizer, state, options=StateDictOptions(full_state_dict=True))

    def finish(self) -> None:
        """FSDP: the trained weights, gathered from the shards, into the caller's plain model on every rank."""
        if not self.fsdp:
            return
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        full = get_model_state_dict(self.module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        full = [full if self.info.is_main else None]
        dist.broadcast_object_list(full, src=0)  # cpu_offload gathers on rank 0 only
        self.model.load_state_dict(full[0])
        self.model.to(self.device)
