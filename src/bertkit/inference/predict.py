"""Prediction over featurised examples: what the fine-tuning recipes score dev with and the predict commands run."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from bertkit.inference.runner import run_length_sorted

# Sequences per prediction batch in a direct call (the commands pass their settings').
EVAL_BATCH_SIZE = 64


def predict(model: nn.Module, features: Sequence[dict], collate: Callable[[list], dict], *,
            batch_size: int = EVAL_BATCH_SIZE,
            bf16: bool = False, device: str = "cpu", output: Callable[[Any], torch.Tensor] = lambda o: o.logits
            ) -> list[np.ndarray]:
    """Run ``model`` over ``features`` in batches of similar length (little padding); outputs in input order.

    Returns one array per feature: its row of ``output(model_output)``. Per-token outputs keep the padded
    length of the batch the feature ran in (callers read the positions they need). A NaN or +inf anywhere
    raises ``NonFiniteError`` naming the first bad feature: a diverged model gets no score. (-inf is allowed:
    a head may mask positions with it; the QA head uses the dtype's lowest finite value.)
    """
    def call(batch: dict[str, torch.Tensor], rows: Sequence[dict]) -> list[np.ndarray]:
        return list(output(model(**batch)).float().cpu().numpy())

    def pad(rows: Sequence[dict]) -> dict[str, torch.Tensor]:
        return {k: v for k, v in collate(list(rows)).items() if k in ("input_ids", "token_type_ids", "attention_mask")}

    return run_length_sorted(call, features, batch_size=batch_size, pad=pad, device=device, bf16=bf16, model=model,
                             nonfinite=lambda i: f"the model's output for example {i} (0-based, input order) is not "
                             "finite (NaN or inf): the model has diverged; no predictions or scores were written")
