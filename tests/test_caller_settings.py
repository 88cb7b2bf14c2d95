"""Global settings a user's process already has when it calls bertkit (torch's default dtype and device, grad and
inference modes, autocast, seeds, logging), beside transformers under the same settings: the same dtypes and
numbers, and the caller's settings as they were."""

from __future__ import annotations

import contextlib

import pytest
import torch
from safetensors.torch import load_file


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype):
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float64])
def test_from_pretrained_loads_float32_under_a_callers_default_dtype(dtype, tiny_checkpoint, tmp_path):
    from bertkit import AutoModelForSequenceClassification

    transformers = pytest.importorskip("transformers")
    path = tiny_checkpoint(tmp_path / "ckpt", "BertForSequenceClassification", labels=3)
    stored = load_file(path / "model.safetensors")
    ids = torch.tensor([[2, 5, 7, 9, 3]])
    with torch.no_grad():
        expected = AutoModelForSequenceClassification.from_pretrained(path)(input_ids=ids).logits
        with default_dtype(dtype):
            model = AutoModelForSequenceClassification.from_pretrained(path)
            reference = transformers.AutoModelForSequenceClassification.from_pretrained(path)
            logits = model(input_ids=ids).logits
    # bf16 rounded every weight on loading (logits 0.04 off on MiniLM); float64 gave a float64 model where
    # transformers gives float32
    assert model.dtype == reference.dtype == torch.float32
    assert torch.equal(model.classifier.weight, stored["classifier.weight"])
    assert torch.equal(model.bert.encoder.layer[0].output.dense.weight, stored["bert.encoder.layer.0.output.dense.weight"])
    assert logits.dtype == torch.float32
    torch.testing.assert_close(logits, expected, rtol=0, atol=1e-6)


def test_set_seed_takes_transformers_deterministic_flag():
    import random

    import numpy as np

    import bertkit

    transformers = pytest.importorskip("transformers")
    was = torch.are_deterministic_algorithms_enabled()
    draws = []
    try:
        for set_seed in (transformers.set_seed, bertkit.set_seed):
            torch.use_deterministic_algorithms(False)
            set_seed(5, deterministic=True)  # a TypeError from bertkit's before
            draws.append((torch.rand(3).tolist(), np.random.rand(3).tolist(), random.random(),
                          torch.are_deterministic_algorithms_enabled()))
    finally:
        torch.use_deterministic_algorithms(was)
    assert draws[1] == draws[0] and draws[1][3] is True


def test_from_pretrained_under_the_meta_default_device_is_refused_naming_it(tiny_checkpoint, tmp_path):
    from bertkit import AutoConfig, AutoModel, BertModel, pipeline

    path = tiny_checkpoint(tmp_path / "ckpt", tokenizer=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "b"])
    with torch.device("meta"):
        # torch's "Tensor on device cpu is not on the expected device meta!" (from_pretrained) and "Cannot copy
        # out of meta tensor; no data!" (a pipeline) before
        for load in (lambda: AutoModel.from_pretrained(path), lambda: pipeline("feature-extraction", model=path)):
            with pytest.raises(ValueError, match=r"torch's default device is 'meta' .*load outside it"):
                load()
        shapes_only = AutoModel.from_config(AutoConfig.from_pretrained(path))  # still builds there
    assert shapes_only.embeddings.word_embeddings.weight.is_meta
    assert isinstance(BertModel.from_pretrained(path), BertModel)  # and outside, loads
