"""The one length-sorted batch runner: prediction, pipelines and feature extraction all run their rows here.

Rows are sorted by length and cut into batches, so a batch holds sequences of nearly one length: the padding
the model sees is small, and the encoder drops what there is (its unpadded layout, ``padding.TokenLayout``).
Each caller says how rows become a batch (``pad``), what one batch's model call returns (one float32 array per
row) and what a non-finite output means to it; results come back keyed by row index, so input order is restored.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

# What a caller gives: rows -> the model's input tensors; (batch, rows) -> one array per row; (row indices of a
# batch, their outputs) -> None, or raise.
Pad = Callable[[Sequence[Any]], Mapping[str, Tensor]]
Call = Callable[[dict[str, Tensor], Sequence[Any]], Sequence[np.ndarray]]
Check = Callable[[Sequence[int], Sequence[np.ndarray]], None]


def plan_batches(lengths: Mapping[int, int] | Sequence[int], batch_size: int, *, indices: Sequence[int] | None = None,
                 longest_first: bool = False, groups: Sequence[int] | None = None) -> list[list[int]]:
    """``indices`` (default: all) sorted by length, stably, and cut every ``batch_size`` rows.

    ``longest_first``: the first batch is the largest, so running out of memory shows at once. ``groups``: rows of
    different groups (multiple-choice rows with different numbers of choices) are sorted apart and never share a
    batch. The plan depends only on the lengths, so every process of a distributed run computes the same one.
    """
    indices = range(len(lengths)) if indices is None else indices
    sign = -1 if longest_first else 1
    order = sorted(indices, key=lambda i: (groups[i] if groups is not None else 0, sign * lengths[i]))
    batches: list[list[int]] = []
    for i in order:
        if not batches or len(batches[-1]) >= batch_size or (groups is not None and groups[i] != groups[batches[-1][0]]):
            batches.append([])
        batches[-1].append(i)
    return batches


def run_batches(call: Call, rows: Sequence[Any], batches: Sequence[Sequence[int]], *, pad: Pad,
                device: str | torch.device = "cpu", bf16: bool = False, check: Check | None = None,
                bar: Any = None) -> dict[int, np.ndarray]:
    """Run ``call`` on each batch of ``rows`` (``batches`` holds row indices); the outputs keyed by row index.

    Each batch is padded by ``pad``, moved to ``device`` and run under bf16 autocast when ``bf16``; ``check`` sees
    each batch's row indices and outputs (and raises on an output it refuses); ``bar`` (tqdm) advances per row.
    The caller chooses the grad mode (``torch.no_grad`` or ``inference_mode``) and the model's train/eval mode.
    """
    device_type = torch.device(device).type
    out: dict[int, np.ndarray] = {}
    for idx in batches:
        batch_rows = [rows[i] for i in idx]
        batch = {k: v.to(device) for k, v in pad(batch_rows).items()}
        with torch.autocast(device_type, dtype=torch.bfloat16, enabled=bf16):
            outs = call(batch, batch_rows)
        if check is not None:
            check(idx, outs)
        out.update(zip(idx, outs))
        if bar is not None:
            bar.update(len(idx))
    return out


def run_length_sorted(call: Call, rows: Sequence[Any], *, batch_size: int, pad: Pad,
                      device: str | torch.device = "cpu", bf16: bool = False, check: Check | None = None,
                      lengths: Sequence[int] | None = None, longest_first: bool = False,
                      groups: Sequence[int] | None = None, bar: Any = None) -> list[np.ndarray]:
    """``run_batches`` over ``plan_batches`` of ``rows``; one output per row, in row order.

    ``lengths`` defaults to ``len(row["input_ids"])`` of each row."""
    if lengths is None:
        lengths = [len(r["input_ids"]) for r in rows]
    batches = plan_batches(lengths, batch_size, longest_first=longest_first, groups=groups)
    out = run_batches(call, rows, batches, pad=pad, device=device, bf16=bf16, check=check, bar=bar)
    return [out[i] for i in range(len(rows))]


def nonfinite_rows(idx: Sequence[int], outs: Sequence[np.ndarray]) -> list[int]:
    """The row indices (batch order) whose output holds a NaN or +inf. -inf is allowed: a head may mask positions
    with it (the fill-mask and QA heads do)."""
    return [i for i, o in zip(idx, outs) if (np.isnan(o) | np.isposinf(o)).any()]
