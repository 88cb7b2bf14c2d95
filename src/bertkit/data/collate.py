"""The padding collate every fine-tuning task shares: one sequence per row, padded to the batch's longest.

No sequence packing (Krell et al. 2021): the encoder drops padding before its layers (``TokenLayout`` in
padding.py), so a padded batch costs what a packed one does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from bertkit.errors import BertkitError
from bertkit.heads import IGNORE_INDEX
from bertkit.padding import pad_batch

# Keys `collate` turns into tensors; anything else in a feature dict (offsets, word ids, example
# indices used by post-processing) is metadata and stays out of the batch.
MODEL_INPUT_KEYS = (
    "input_ids",
    "token_type_ids",
    "attention_mask",
    "labels",
    "start_positions",
    "end_positions",
    "next_sentence_label",
)


def collate(features: Sequence[Mapping[str, Any]], pad_token_id: int) -> dict[str, torch.Tensor]:
    """Pad a list of features to the longest in the batch and stack them into tensors.

    Sequence-valued keys are padded along their LAST axis (SWAG's (4, T) choices pad to (B, 4, T_max)) with
    ``pad_token_id`` for ``input_ids``, ``IGNORE_INDEX`` for token-level ``labels`` and 0 otherwise. Scalar keys
    (sequence labels, span positions) are stacked; float labels give a float tensor (regression), ints a long one.
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
    pads = {}
    for key in keys:
        values = [f[key] for f in features]
        if np.isscalar(values[0]):
            arr = np.asarray(values)
            dtype = torch.float32 if arr.dtype.kind == "f" else torch.long
            batch[key] = torch.as_tensor(arr, dtype=dtype)
        else:
            pads[key] = pad_token_id if key == "input_ids" else (IGNORE_INDEX if key == "labels" else 0)
    padded = pad_batch(features, pads) if pads else {}
    return {key: batch[key] if key in batch else padded[key] for key in keys}
