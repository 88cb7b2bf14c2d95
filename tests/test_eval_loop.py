"""The one evaluation loop (``inference.runner.evaluate``): what it guarantees every caller (predict, the Trainer,
pre-training evaluation, the feature study, the pipelines)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from bertkit.errors import NonFiniteError
from bertkit.inference.runner import evaluate, in_order, run_length_sorted


def _pad(rows):
    return {"x": torch.tensor([[float(r)] for r in rows])}


def test_batches_run_without_gradients_in_eval_mode_and_the_mode_is_restored():
    model = nn.Sequential(nn.Linear(1, 1), nn.Dropout(0.5)).train()
    seen = []

    def call(batch, rows):
        seen.append((model.training, torch.is_grad_enabled(), len(rows)))
        return model(batch["x"]).sum().item()

    out = evaluate(call, list(range(7)), in_order(range(7), 3), pad=_pad, model=model)
    assert [idx for idx, _ in out] == [[0, 1, 2], [3, 4, 5], [6]]
    assert seen == [(False, False, 3), (False, False, 3), (False, False, 1)]
    assert model.training  # put back as it was


def test_bf16_true_false_and_none():
    def dtype(bf16, outer):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=outer):
            out = evaluate(lambda batch, rows: (batch["x"] @ batch["x"].T).dtype, [1, 2], [[0, 1]], pad=_pad,
                           bf16=bf16)
        return out[0][1]

    assert dtype(True, False) == torch.bfloat16
    assert dtype(False, True) == torch.float32  # False: no autocast, even inside the caller's
    assert dtype(None, True) == torch.bfloat16  # None: the caller's autocast (the training loop's)
    assert dtype(None, False) == torch.float32


def test_rows_come_back_in_input_order_and_a_nan_or_inf_stops_the_run_naming_its_row():
    rows = [3, 1, 2, 5, 4]
    out = run_length_sorted(lambda batch, r: list(batch["x"].numpy()), rows, batch_size=2, pad=_pad,
                            lengths=rows)
    assert [float(o[0]) for o in out] == [3.0, 1.0, 2.0, 5.0, 4.0]
    masked = run_length_sorted(lambda batch, r: [np.array([-np.inf, 0.0])] * len(r), rows, batch_size=2, pad=_pad,
                               lengths=rows, nonfinite=lambda i: f"row {i}")
    assert len(masked) == 5  # -inf beside a finite score is a masked position, not a divergence
    # -inf at every label is an overflow: its softmax is NaN and its argmax the first label
    with pytest.raises(NonFiniteError, match="^row 1$"):
        run_length_sorted(lambda batch, r: [np.array([-np.inf, -np.inf])] * len(r), rows, batch_size=2, pad=_pad,
                          lengths=rows, nonfinite=lambda i: f"row {i}")
    # by length the batches are rows [1, 2], [0, 4], [3]: row 4 (length 4) is the first bad row that runs
    with pytest.raises(NonFiniteError, match="^row 4$"):
        run_length_sorted(lambda batch, r: [np.array([np.nan if x >= 4 else 0.0]) for x in r], rows, batch_size=2,
                          pad=_pad, lengths=rows, nonfinite=lambda i: f"row {i}")



def test_longest_first_prepares_each_batch_when_it_is_asked_for():
    """``longest_first`` tokenizes a batch only when the caller asks for the next one, after it queued the previous
    one's kernels: on a GPU that is what overlaps the host's tokenizing with the device's computing. The batches
    come longest first, each with its rows' positions."""
    from bertkit.inference.runner import longest_first

    texts = [f"text {i} " * (1 + i % 5) for i in range(10)]
    prepared = []

    def prepare(batch):
        prepared.append(batch)
        return {"lengths": torch.tensor([len(t) for t in batch])}

    batches = longest_first(texts, 4, prepare, "cpu")
    first = next(batches)
    assert len(prepared) == 1 and first["lengths"].tolist() == sorted(map(len, texts), reverse=True)[:4]
    rest = list(batches)
    assert len(prepared) == 3 and [len(b["rows"]) for b in [first, *rest]] == [4, 4, 2]
    assert sorted(torch.cat([first["rows"], *[b["rows"] for b in rest]]).tolist()) == list(range(10))
