"""Global settings a user's process already has when it calls bertkit (torch's default dtype and device, grad and
inference modes, autocast, seeds, logging), beside transformers under the same settings: the same dtypes and
numbers, and the caller's settings as they were."""

from __future__ import annotations

import contextlib

import pytest
import torch
from safetensors.torch import load_file

TEXTS = ["Hello world!", "A café in Zürich — naïve résumé.", "short", "日本語のテキスト and more words here to pad"]


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


def test_every_module_imports_under_a_callers_default_device():
    """A module first imported inside `with torch.device("meta")` (or "cuda") must not make its module-wide tensors
    there: the int8 kernels' import made a quantized tensor, which failed on meta ("no fake impl or Meta kernel")
    whenever bertkit.inference was first imported inside the block, and put its zero point on the caller's device."""
    import subprocess
    import sys

    script = (
        "import importlib, pkgutil, torch, bertkit\n"
        "with torch.device('meta'):\n"
        "    for m in pkgutil.walk_packages(bertkit.__path__, 'bertkit.'):\n"
        "        if not m.name.endswith('__main__'):\n"
        "            importlib.import_module(m.name)\n"
        "from bertkit.quantization import kernels\n"
        "assert kernels._ZERO.device.type == kernels._ONE.device.type == 'cpu'\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]



def test_a_pipeline_inside_the_callers_autocast_says_it_runs_in_its_weights_dtype(minilm_2_layers, caplog):
    from bertkit import pipeline

    extract = pipeline("feature-extraction", model=minilm_2_layers)
    plain = extract(TEXTS)
    with caplog.at_level("WARNING", logger="bertkit"), torch.autocast("cpu", dtype=torch.bfloat16):
        inside = extract(TEXTS)
        extract(TEXTS[:1])
    # transformers' pipeline computes in bf16 there (0.011 from float32 on MiniLM, 2 layers); bertkit's runs the
    # float32 copy it prepared, which before went unsaid
    said = [r.getMessage() for r in caplog.records if "torch.autocast" in r.getMessage()]
    assert len(said) == 1 and "runs in its weights' dtype (float32)" in said[0] and "bf16=True" in said[0]
    assert inside == plain



@pytest.mark.parametrize("variable", [None, pytest.param("1", marks=pytest.mark.slow)])
def test_progress_bars_follow_tqdm_disable(variable, tiny_checkpoint, tmp_path, capsys):
    import os
    import subprocess
    import sys

    import bertkit

    path = tiny_checkpoint(tmp_path / "ckpt", tokenizer=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "b"])
    env = {k: v for k, v in os.environ.items() if not k.startswith("TQDM_")}
    if variable is None and env == dict(os.environ):  # tqdm read this environment at its import here: no process
        capsys.readouterr()
        bertkit.pipeline("feature-extraction", model=path, progress=True)(["a b", "b a"])
        bar = capsys.readouterr().err
    else:
        if variable is not None:
            env["TQDM_DISABLE"] = variable  # tqdm reads it when it is imported: a process of its own
        script = (f"import bertkit; bertkit.pipeline('feature-extraction', model={str(path)!r}, progress=True)"
                  "(['a b', 'b a'])")
        bar = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                             check=True).stderr
    # TQDM_DISABLE=1 silences transformers' Trainer and datasets' bars; bertkit passed disable=False to tqdm,
    # which then ignores the variable, so its Trainer, pipelines and commands drew their bars regardless
    assert ("feature-extraction" in bar) == (variable is None), bar

# -- the generator: random combinations of a caller's torch settings around loading and inference -------------------

def _caller_state() -> dict:
    import random

    import numpy as np

    return {"dtype": torch.get_default_dtype(), "device": str(torch.get_default_device()),
            "grad": torch.is_grad_enabled(), "inference": torch.is_inference_mode_enabled(),
            "autocast": torch.is_autocast_enabled("cpu"), "deterministic": torch.are_deterministic_algorithms_enabled(),
            "threads": torch.get_num_threads(), "torch_rng": torch.get_rng_state(),
            "numpy_rng": np.random.get_state()[1].copy(), "python_rng": random.getstate()}


def _same_state(a: dict, b: dict) -> list[str]:
    import numpy as np

    return [k for k in a if not (torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor)
                                 else np.array_equal(a[k], b[k]) if isinstance(a[k], np.ndarray) else a[k] == b[k])]


@contextlib.contextmanager
def _settings(draw: dict):
    """The caller's process-wide settings of ``draw`` (restored after), then its modes around the calls."""
    saved = (torch.get_default_dtype(), torch.are_deterministic_algorithms_enabled(), torch.get_num_threads())
    torch.set_default_dtype(draw["default_dtype"])
    torch.use_deterministic_algorithms(draw["deterministic"])
    torch.set_num_threads(draw["threads"])
    try:
        with contextlib.ExitStack() as modes:
            if draw["no_grad"]:
                modes.enter_context(torch.no_grad())
            if draw["inference_mode"]:
                modes.enter_context(torch.inference_mode())
            if draw["autocast"]:
                modes.enter_context(torch.autocast("cpu", dtype=torch.bfloat16))
            yield
    finally:
        torch.set_default_dtype(saved[0])
        torch.use_deterministic_algorithms(saved[1])
        torch.set_num_threads(saved[2])


def _encoder_outputs(library, path):
    """(parameter dtype, last_hidden_state at real tokens, pooler output) of ``library``'s AutoModel."""
    tokenizer = library.AutoTokenizer.from_pretrained(path)
    model = library.AutoModel.from_pretrained(path)
    batch = tokenizer(TEXTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        out = model(**batch)
    real = batch["attention_mask"].bool()
    return next(model.parameters()).dtype, out.last_hidden_state[real].float(), out.pooler_output.float()


@pytest.mark.slow
def test_random_caller_settings_give_the_references_dtypes_and_numbers(minilm_2_layers):
    import random

    import bertkit
    import bertkit.sentence

    transformers = pytest.importorskip("transformers")
    sentence_transformers = pytest.importorskip("sentence_transformers")
    rng = random.Random(20261130)
    expected = {}
    with _settings(dict(default_dtype=torch.float32, deterministic=False, threads=1, no_grad=False,
                        inference_mode=False, autocast=False)):
        expected["bertkit"] = _encoder_outputs(bertkit, minilm_2_layers)
        expected["st"] = sentence_transformers.SentenceTransformer(str(minilm_2_layers), device="cpu").encode(TEXTS)
    for _ in range(10):
        draw = dict(default_dtype=rng.choice([torch.float32, torch.float64, torch.bfloat16]),
                    deterministic=rng.random() < 0.4, threads=rng.choice([1, 2]), no_grad=rng.random() < 0.3,
                    inference_mode=rng.random() < 0.3, autocast=rng.random() < 0.3)
        with _settings(draw):
            before = _caller_state()
            dtype, states, pooled = _encoder_outputs(bertkit, minilm_2_layers)
            vectors = bertkit.sentence.SentenceTransformer(minilm_2_layers).encode(TEXTS)
            after = _caller_state()
            ref_dtype = _encoder_outputs(transformers, minilm_2_layers)[0]
            ref_vectors = sentence_transformers.SentenceTransformer(str(minilm_2_layers), device="cpu").encode(TEXTS)
        assert not _same_state(before, after), (draw, _same_state(before, after))  # the caller's settings and RNGs
        assert dtype == ref_dtype == torch.float32, draw  # bf16 / float64 before, as the default dtype
        if draw["autocast"]:  # the caller's bf16: both libraries compute in it (rounding apart)
            torch.testing.assert_close(vectors, ref_vectors, rtol=0, atol=2e-3, msg=str(draw))
        else:
            torch.testing.assert_close(states, expected["bertkit"][1], rtol=0, atol=1e-5, msg=str(draw))
            torch.testing.assert_close(pooled, expected["bertkit"][2], rtol=0, atol=1e-5, msg=str(draw))
            torch.testing.assert_close(vectors, expected["st"], rtol=0, atol=1e-5, msg=str(draw))
            torch.testing.assert_close(ref_vectors, expected["st"], rtol=0, atol=1e-5, msg=str(draw))
