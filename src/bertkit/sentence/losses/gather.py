"""In-batch negatives from every process (``gather_across_devices=True``): under torchrun the loss is computed
on the global batch, every rank's rows in rank order (the batch one process of N x b rows would hold), so
N processes x b rows give the loss and the gradients of 1 process x N*b rows (tests/test_sentence_gather.py).

How. Each column's embeddings are all-gathered without a graph and this rank's own rows are put back in their
slot with theirs, so every rank computes the same global loss L and its gradient reaches this rank's rows. The
gradients are then averaged over the W ranks (DDP), each rank's loss weighted by its share of the global batch,
w_r = n_r * W / N (bertkit's loop; 1 when the batch splits evenly). So this rank's gradient is scaled by N / n_r:
its rows then get w_r * N / n_r * dL/de_r = W * dL/de_r, and the average over the ranks is dL/dθ. Nothing flows back through the collective: the backward
pass has no collective of its own besides DDP's all-reduce. The cost is that each rank computes the global
similarity matrix, (N, k*N) for k document columns, where each would compute (n_r, k*N) with a backward gather.

A rank whose share of a short last batch is empty runs one stand-in row at weight 0 (a copy of rank 0's first
row, so that its backward pass joins the all-reduce). The batch's ``index`` (each row's position in the
dataset) shows it: a row already held by a lower rank is left out of the global batch.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor


def gathering() -> bool:
    """Whether there are other processes to gather from."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _all_gather(t: Tensor) -> list[Tensor]:
    parts = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, t.contiguous())
    return parts


def gather_rows(columns: list[Tensor], index: Tensor | None = None) -> tuple[list[Tensor], float]:
    """Every rank's rows of the (n, D) ``columns`` (all of n rows), concatenated in rank order, this rank's own
    rows with their graph; and the factor N / n_r for this rank's gradient (0 when it contributes no row).
    ``index`` (n,): each row's dataset position; rows a lower rank holds too are left out."""
    rank, device = dist.get_rank(), columns[0].device
    n = columns[0].shape[0]
    counts = [int(c) for c in _all_gather(torch.tensor([n], device=device))]
    width = max(counts)
    keep = [torch.ones(c, dtype=torch.bool, device=device) for c in counts]
    if index is not None:
        indices = [p[:c] for p, c in zip(_all_gather(F.pad(index.to(device), (0, width - n), value=-1)), counts)]
        keep = [~torch.isin(ix, torch.cat(indices[:r])) if r else keep[0] for r, ix in enumerate(indices)]
    local = torch.stack(columns)[:, keep[rank]]  # (C, n_r, D)
    parts = _all_gather(F.pad(torch.stack(columns).detach(), (0, 0, 0, width - n)))  # W x (C, width, D)
    parts = [p[:, :c][:, k] for p, c, k in zip(parts, counts, keep)]
    parts[rank] = local
    total, mine = sum(int(k.sum()) for k in keep), local.shape[1]
    return list(torch.cat(parts, dim=1).unbind(0)), (total / mine if mine else 0.0)  # C x (N, D)


def scale_gradient(loss: Tensor, factor: float) -> Tensor:
    """``loss`` with its value unchanged and its gradient multiplied by ``factor``."""
    if factor == 1.0 or not loss.requires_grad:
        return loss
    return loss.detach() + factor * (loss - loss.detach())
