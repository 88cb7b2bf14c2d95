"""Prediction over featurised examples: what the fine-tuning recipes score dev with and the predict commands run.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from bertkit.data.collate import collate
from bertkit.inference.prepare import Precision, prepare_model
from bertkit.inference.runner import readable, run_length_sorted
from bertkit.settings import PredictBenchmarkSettings
from bertkit.tokenization import BertTokenizer

# Sequences per prediction batch in a direct call (the commands pass their settings').
EVAL_BATCH_SIZE = 64


def predict(model: nn.Module, features: Sequence[dict], pad_id: int, *,
            batch_size: int = EVAL_BATCH_SIZE,
            bf16: bool = False, device: str = "cpu", output: Callable[[Any], torch.Tensor] = lambda o: o.logits
            ) -> list[np.ndarray]:
    """Run ``model`` over ``features`` in batches of similar length (little padding); outputs in input order.

    Batches are padded by ``data.collate`` (``input_ids`` with ``pad_id``). Returns one array per feature: its row of ``output(model_output)``. Per-token outputs keep the padded
    length of the batch the feature ran in (callers read the positions they need). A NaN or +inf anywhere, or -inf
    at every label of a feature or token (an overflow: its argmax would be the first label), raises
    ``NonFiniteError`` naming the first bad feature: a diverged model gets no score. (A -inf among finite values is
    allowed: a label switched off; the QA head masks padding with the dtype's lowest finite value.)
    """
    def call(batch: dict[str, torch.Tensor], rows: Sequence[dict]) -> list[np.ndarray]:
        return list(readable(output(model(**batch))).cpu().numpy())

    def pad(rows: Sequence[dict]) -> dict[str, torch.Tensor]:
        return {k: v for k, v in collate(list(rows), pad_id).items() if k in ("input_ids", "token_type_ids", "attention_mask")}

    return run_length_sorted(call, features, batch_size=batch_size, pad=pad, device=device, bf16=bf16, model=model,
                             nonfinite=lambda i: f"the model's output for example {i} (0-based, input order) is not "
                             "finite (NaN or inf): the model has diverged; no predictions or scores were written")


def for_prediction(model: nn.Module, tokenizer: BertTokenizer, s: PredictBenchmarkSettings
                   ) -> tuple[nn.Module, Precision]:
    """A fine-tuned ``model`` just loaded (nothing else holds it: prepared in place) made ready by ``prepare_model``
    as pipelines make theirs: on ``s.device`` in eval mode and, with --int8, quantized on the built-in sentences or
    --calibration-file's, cut to
    --max-seq-length; a model that is int8 already (a `bertkit quantize` directory) runs as it is, on the CPU.
    Callers run it under ``precision.bf16``: --bf16 / --no-bf16 as given, else off (int8 too)."""
    return prepare_model(model, s.model_name_or_path, device=s.device, bf16=s.bf16,
                         quantize="int8" if s.int8 else None, calibration_file=s.calibration_file,
                         tokenizer=tokenizer, max_length=s.max_seq_length, in_place=True)
