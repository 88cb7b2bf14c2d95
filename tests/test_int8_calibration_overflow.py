"""int8 calibration on activations that overflow float32: refused naming the calibration text, nothing written.

A finite checkpoint whose activations reach inf or NaN on a text (an embedding row near float32's largest value, a
LayerNorm scaled past its range) gave SmoothQuant's statistics an infinity, clamped to the largest smoothing factor,
and NaN scales after it; ``bertkit quantize`` wrote those to model.int8.safetensors and reported success, and loading
that file then said it was damaged and to write it again, which wrote the same NaN."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from bertkit import BertModel, BertTokenizer
from bertkit._hardware import int8_kernel
from bertkit.errors import NonFiniteError
from bertkit.quantization import quantize_int8_on_texts
from bertkit.quantization.saved import quantize_checkpoint

pytestmark = pytest.mark.skipif(int8_kernel() is None, reason="this PyTorch has no int8 kernel for this CPU")
TEXTS = ["a short note", "the weather is mild today", "the cat sat on the mat", "one more line of text"]


def _overflowing(model: BertModel, tok: BertTokenizer) -> BertModel:
    """'cat''s embedding row at 3e38 (finite): the embedding LayerNorm's sum over 384 channels overflows on every
    token 'cat' is, so the first layer's input there is NaN, and nowhere else."""
    with torch.no_grad():
        model.embeddings.word_embeddings.weight[tok.convert_tokens_to_ids("cat")] = 3e38
    return model


def test_calibration_text_whose_activations_overflow_is_refused_by_its_index(minilm_2_layers):
    tok = BertTokenizer.from_pretrained(minilm_2_layers)
    model = _overflowing(BertModel.from_pretrained(minilm_2_layers).eval(), tok)
    assert torch.isfinite(torch.cat([p.flatten() for p in model.parameters()])).all()
    with pytest.raises(NonFiniteError, match=r"calibration input 2: layer 0's qkv input holds NaN .* nothing was "
                                             r"quantized.*\(calibration text 2: 'the cat sat on the mat'\)") as e:
        quantize_int8_on_texts(model, tok, TEXTS, batch_size=3)  # the second row of the first of two batches
    assert e.value.index == 2
    q = quantize_int8_on_texts(model, tok, TEXTS[:2] + TEXTS[3:], batch_size=3)  # the others calibrate as before
    assert q is not model


def test_quantize_writes_nothing_and_keeps_an_earlier_output(minilm_2_layers, tmp_path):
    source = tmp_path / "model"
    shutil.copytree(minilm_2_layers, source)
    weights = load_file(source / "model.safetensors")
    config = json.loads((source / "config.json").read_text())
    key = next(k for k in weights if k.endswith("layer.0.output.LayerNorm.weight"))
    weights[key] = weights[key] / weights[key].abs().max() * 3e38  # layer 0's output past float32: inf into layer 1
    save_file(weights, source / "model.safetensors")
    calibration = tmp_path / "calibration.txt"
    calibration.write_text("\n".join(TEXTS) + "\n")
    out = tmp_path / "int8"
    with pytest.raises(NonFiniteError, match=r"calibration input 0: layer 1's qkv input holds inf"):
        quantize_checkpoint(source, out, calibration_file=calibration)
    assert not out.exists()
    assert config["num_hidden_layers"] == 2
    # an int8 directory written before from the finite checkpoint stays as it was
    quantize_checkpoint(minilm_2_layers, out)
    before = {p.name: p.read_bytes() for p in Path(out).iterdir()}
    with pytest.raises(NonFiniteError, match="calibration input 0"):
        quantize_checkpoint(source, out, calibration_file=calibration)
    assert {p.name: p.read_bytes() for p in Path(out).iterdir()} == before
