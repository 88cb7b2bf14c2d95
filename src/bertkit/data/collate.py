"""Packing several sequences into each row of a batch (Krell et al. 2021, "Efficient Sequence Packing").

A padded batch of ragged sequences spends compute on padding. bertkit's encoder already drops padding
before its layers (``TokenLayout``), which on a CPU removes most of that waste; packing matters where
shapes must stay fixed (compiled graphs, accelerators) or to bound the row count. Rows are filled by
first-fit decreasing; each sequence keeps its own positions (restarting at 0), segment ids and attention
(the model never attends across sequences in a packed row), and per-sequence labels stay per sequence, in
the order the sequences appear in the packed rows (``order`` gives it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from bertkit.errors import BertkitError
from bertkit.heads import IGNORE_INDEX


def pack_rows(lengths: Sequence[int], row_tokens: int) -> list[list[int]]:
    """First-fit decreasing: indices of sequences per row, each row's total length <= ``row_tokens``."""
    if any(n > row_tokens for n in lengths):
        raise BertkitError(f"a sequence of {max(lengths)} tokens does not fit a packed row of {row_tokens}")
    rows: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        for r, free in enumerate(room):
            if lengths[i] <= free:
                rows[r].append(i)
                room[r] -= lengths[i]
                break
        else:
            rows.append([i])
            room.append(row_tokens - lengths[i])
    return rows


def collate_packed(features: Sequence[Mapping[str, Any]], pad_token_id: int, row_tokens: int) -> dict[str, torch.Tensor]:
    """Pack features (``input_ids``, ``token_type_ids``, optional ``labels``) into rows of ``row_tokens``.

    Returns ``input_ids``, ``token_type_ids``, ``sequence_ids`` (R, row_tokens) and, when present,
    ``labels``: per-token labels (lists) are packed like the tokens (-100 on padding); per-sequence
    labels (scalars) become an (S,) tensor in packed order. ``order`` (S,) maps packed sequence k to
    its index in ``features``. Pass everything but ``order`` to a head: ``model(**batch)``.
    """
    lengths = [len(f["input_ids"]) for f in features]
    rows = pack_rows(lengths, row_tokens)
    R = len(rows)
    ids = np.full((R, row_tokens), pad_token_id, dtype=np.int64)
    tt = np.zeros((R, row_tokens), dtype=np.int64)
    seq = np.zeros((R, row_tokens), dtype=np.int64)
    has_labels = "labels" in features[0]
    token_labels = has_labels and not np.isscalar(features[0]["labels"])
    lab = np.full((R, row_tokens), -100, dtype=np.int64) if token_labels else None
    order: list[int] = []
    for r, members in enumerate(rows):
        at = 0
        for k, i in enumerate(members):
            n = lengths[i]
            ids[r, at:at + n] = features[i]["input_ids"]
            tt[r, at:at + n] = features[i].get("token_type_ids", [0] * n)
            seq[r, at:at + n] = k + 1
            if lab is not None:
                lab[r, at:at + n] = features[i]["labels"]
            order.append(i)
            at += n
    batch = {"input_ids": torch.from_numpy(ids), "token_type_ids": torch.from_numpy(tt),
             "sequence_ids": torch.from_numpy(seq), "order": torch.tensor(order)}
    if has_labels:
        if lab is not None:
            batch["labels"] = torch.from_numpy(lab)
        else:
            values = np.asarray([features[i]["labels"] for i in order])
            batch["labels"] = torch.as_tensor(values, dtype=torch.float32 if values.dtype.kind == "f" else torch.long)
    return batch


# -------------------------------------------------------------------------------------------------
# Padding collate: one sequence per row
# -------------------------------------------------------------------------------------------------

# Keys `collate` turns into tensors; anything else in a feature dict (offsets, word ids, example
# indices used by post-processing) is metadata and stays out of the batch.
MODEL_INPUT_KEYS = (
    "input_ids",
    "token_type_ids",
    "attention_mask",
    "labels",
    "start_positions",
    "end_positions",
)


def collate(features: Sequence[Mapping[str, Any]], pad_token_id: int) -> dict[str, torch.Tensor]:
    """Pad a list of features to the longest in the batch and stack them into tensors.

    Shared by every task (glue, ner, squad, swag), so it is generic: sequence-valued keys are padded
    along their LAST axis (so SWAG's (4, T) choices pad to (B, 4, T_max)) with ``pad_token_id`` for
    ``input_ids``, ``IGNORE_INDEX`` (-100) for token-level ``labels`` (the index cross-entropy ignores) and 0 otherwise, which
    zeroes ``attention_mask`` on padding. Scalar keys (sequence labels, span positions) are stacked;
    float labels give a float tensor (regression), ints a long tensor.
    """
    if not features:
        raise BertkitError("collate got an empty batch")
    keys = [k for k in MODEL_INPUT_KEYS if k in features[0]]
    for i, f in enumerate(features):
        have = [k for k in MODEL_INPUT_KEYS if k in f]
        if have != keys:
            raise BertkitError(
                f"feature {i} has keys {have} but feature 0 has {keys}; do not mix labeled and unlabeled examples in a batch"
            )
    batch: dict[str, torch.Tensor] = {}
    for key in keys:
        values = [f[key] for f in features]
        if np.isscalar(values[0]):
            arr = np.asarray(values)
            dtype = torch.float32 if arr.dtype.kind == "f" else torch.long
            batch[key] = torch.as_tensor(arr, dtype=dtype)
            continue
        arrays = [np.asarray(v, dtype=np.int64) for v in values]
        width = max(a.shape[-1] for a in arrays)
        pad = pad_token_id if key == "input_ids" else (IGNORE_INDEX if key == "labels" else 0)
        padded = [
            np.pad(a, [(0, 0)] * (a.ndim - 1) + [(0, width - a.shape[-1])], constant_values=pad)
            for a in arrays
        ]
        batch[key] = torch.from_numpy(np.stack(padded))
    return batch
