"""int8 inference (``bertkit.quantization``) on the real MiniLM checkpoint and real text.

What is checked: the default configuration keeps every sentence's mean-pooled embedding within cosine
0.99 of fp32 on 1,000 STS-B sentences (the set the default was chosen on) and on SST-2 dev sentences
(another corpus); a classifier head's argmax agrees with fp32's; every head model runs quantized with
its head left fp32; the padded and unpadded layouts agree; and misuse is refused with the fix.
"""

from __future__ import annotations

import csv
import os
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from bertkit import BertModel, BertTokenizer
from bertkit.errors import BertkitError
from bertkit.heads import MODEL_CLASSES, BertForMultipleChoice, BertForSequenceClassification
from bertkit.quantization import (
    DEFAULT_KEEP_FP32,
    FAST_KEEP_FP32,
    FAST_PER_TOKEN,
    INT8_LAYERS,
    PROJECTIONS,
    PerTokenInt8Linear,
    SmoothedInt8Linear,
    _packing,
    calibration_batches,
    int8_activation_bits,
    int8_projections,
    per_token_projections,
    per_token_supported,
    quantize_int8,
    resolve_keep_fp32,
)
from bertkit.quantization.device import onednn_supported

pytestmark = pytest.mark.skipif(
    not any(e in torch.backends.quantized.supported_engines for e in ("x86", "fbgemm")),
    reason=f"this PyTorch has no x86/fbgemm quantized engine ({torch.backends.quantized.supported_engines})")


def _tsv(path: Path) -> list[dict[str, str]]:
    with open(path, encoding="utf-8") as f:
        return list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))


@pytest.fixture(scope="module")
def tok(minilm_dir) -> BertTokenizer:
    return BertTokenizer.from_pretrained(minilm_dir)


@pytest.fixture(scope="module")
def fp32(minilm_dir) -> BertModel:
    return BertModel.from_pretrained(minilm_dir).eval()


@pytest.fixture(scope="module")
def calibration(tok, data_dir):
    """256 SST-2 training sentences, as bench/int8_sensitivity.py calibrates."""
    return calibration_batches(tok, [r["sentence"] for r in _tsv(data_dir / "glue/SST-2/train.tsv")[:256]])


@pytest.fixture(scope="module")
def int8(fp32, calibration) -> BertModel:
    return quantize_int8(fp32, calibration=calibration)


@pytest.fixture(scope="module")
def stsb_sentences(data_dir) -> list[str]:
    return [s for r in _tsv(data_dir / "glue/STS-B/dev.tsv")[:500] for s in (r["sentence1"], r["sentence2"])]


@pytest.fixture(scope="module")
def sst2_sentences(data_dir) -> list[str]:
    return [r["sentence"] for r in _tsv(data_dir / "glue/SST-2/dev.tsv")]


@torch.inference_mode()
def embed(model: BertModel, tok: BertTokenizer, texts: list[str], layout: str | None = None) -> torch.Tensor:
    """Mean-pooled last-layer states over real tokens, in length-sorted batches of 32 (as pipelines batch)."""
    order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
    out = torch.empty(len(texts), model.config.hidden_size)
    for a in range(0, len(order), 32):
        idx = order[a:a + 32]
        enc = tok([texts[i] for i in idx], truncation=True, max_length=128, padding=True, return_tensors="pt")
        res = model(enc["input_ids"], enc["attention_mask"], enc["token_type_ids"], layout=layout)
        mask = enc["attention_mask"].unsqueeze(-1).float()
        out[idx] = (res.last_hidden_state * mask).sum(1) / mask.sum(1)
    return out


def test_default_quantizes_all_but_the_kept_projections(fp32, int8):
    bits = int8_activation_bits()
    kept = resolve_keep_fp32(DEFAULT_KEEP_FP32, len(fp32.encoder.layer))
    assert len(int8_projections(int8)) == len(fp32.encoder.layer) * len(PROJECTIONS) - len(kept)
    assert int8_projections(fp32) == []  # the fp32 model is untouched (a copy was quantized)
    layer = int8.encoder.layer[0]
    assert type(layer.output.dense) is nn.Linear and isinstance(layer.attention.self.qkv, SmoothedInt8Linear)
    assert layer.attention.self.query is None  # q, k and v: one int8 module (one GEMM)
    assert {m.activation_bits for m in int8.modules() if isinstance(m, SmoothedInt8Linear)} == {bits}
    assert type(int8.pooler.dense) is nn.Linear and not int8.training and per_token_projections(int8) == []


def test_per_token_projections_are_refused_without_vnni(fp32, monkeypatch):
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: {"avx2": True})
    assert not per_token_supported()
    with pytest.raises(BertkitError, match="per-token int8 projections need AVX512-VNNI"):
        quantize_int8(fp32, calibration=None, keep_fp32=FAST_KEEP_FP32, per_token=FAST_PER_TOKEN)


@pytest.mark.skipif(not per_token_supported(), reason="per-token int8 (torch._int_mm) needs AVX512-VNNI here")
def test_the_fast_set_is_int8_everywhere_with_ffn_out_per_token_and_holds_the_embedding_bar(
        fp32, calibration, tok, stsb_sentences, sst2_sentences):
    """Measured (built-in calibration, all 1,000 / 872 sentences): min cosine STS-B 0.9982, SST-2 0.9957,
    against 0.9966 / 0.9884 with every projection per call (keep_fp32=() alone)."""
    fast = quantize_int8(fp32, calibration=calibration, keep_fp32=FAST_KEEP_FP32, per_token=FAST_PER_TOKEN)
    assert len(int8_projections(fast)) == len(fp32.encoder.layer) * len(PROJECTIONS)
    assert per_token_projections(fast) == [f"layers.{i}.ffn_out" for i in range(len(fp32.encoder.layer))]
    for texts in (stsb_sentences[:400], sst2_sentences[:400]):
        cos = F.cosine_similarity(embed(fast, tok, texts), embed(fp32, tok, texts))
        assert float(cos.min()) >= 0.99 and float(cos.mean()) >= 0.998, (float(cos.min()), float(cos.mean()))


@pytest.mark.skipif(not per_token_supported(), reason="per-token int8 (torch._int_mm) needs AVX512-VNNI here")
def test_per_token_linear_is_its_formula_and_gives_each_row_its_own_range():
    """The layer equals its definition computed in float64 from the same integers (so the int8 GEMM and the
    zero-point correction are exact), and rows whose ranges differ 1,000-fold each keep their relative
    error near int8's (one scale per call would leave the small rows a few levels)."""
    torch.manual_seed(0)
    linear = nn.Linear(64, 24)
    layer = PerTokenInt8Linear.from_float(linear)
    x = torch.randn(2, 5, 64) * torch.tensor([0.01, 1.0, 10.0, 3.0, 0.1])[None, :, None] + 0.3
    x[1, 2] = 0.7  # a constant row: exactly its value times the weights' row sums
    with torch.inference_mode():
        y = layer(x)
    assert y.shape == (2, 5, 24)
    rows = x.reshape(-1, 64).double()
    hi, lo = rows.amax(1, keepdim=True), rows.amin(1, keepdim=True)
    zero, step = (hi + lo) / 2, ((hi - lo) / 254).clamp(min=torch.finfo(torch.float32).tiny)
    q = torch.round((rows - zero) / step).clamp(-127, 127)
    w = layer.weight_t.double()  # (in, out)
    scale = layer.weight_scale.double()
    expected = step * (q @ w) * scale + zero * (w.sum(0) * scale) + linear.bias.double()
    torch.testing.assert_close(y.reshape(-1, 24).double(), expected, rtol=1e-5, atol=1e-6)
    with torch.no_grad():
        reference = nn.functional.linear(x, layer.dequantized().weight, linear.bias).reshape(-1, 24)
    error = (y.reshape(-1, 24) - reference).norm(dim=1) / reference.norm(dim=1)
    assert float(error.max()) < 0.02, error  # every row, 0.01 or 10 wide
    with torch.inference_mode():
        assert layer(torch.zeros(0, 64)).shape == (0, 24)


@pytest.mark.skipif(not per_token_supported(), reason="torch._int_mm is exact at 8 bits only with AVX512-VNNI")
def test_the_int_mm_kernel_is_its_formula_matches_fbgemm_and_saves_the_same_integers():
    """``SmoothedInt8Linear`` on ``torch._int_mm`` (the kernel once PyTorch drops torch.ao's dynamic Linear,
    where it is exact: 8-bit activations, VNNI) equals its definition computed in float64 from the same
    integers; it keeps the same integers and scales as the deprecated torch.ao (fbgemm) kernel, so either reads
    the other's saved tensors, and both are as close to the float layer (one activation scale per call)."""
    from bertkit.quantization import kernels

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(kernels, "onednn_supported", lambda bits=8: False)  # a PyTorch without oneDNN's quantized Linear
        assert kernels.default_backend(8) == "fbgemm" == kernels.default_backend(7)  # while PyTorch has it
        patch.setattr(kernels, "fbgemm_available", lambda: False)
        assert kernels.default_backend(8) == "int_mm"
        with pytest.raises(BertkitError, match="7-bit activations needs oneDNN's quantized Linear"):
            kernels.default_backend(7)
        assert SmoothedInt8Linear(nn.Linear(8, 4), torch.ones(8), 8).backend == "int_mm"
    torch.manual_seed(0)
    linear = nn.Linear(64, 24)
    smooth = torch.rand(64) + 0.5
    x = torch.randn(3, 7, 64) * 2 + 0.4
    layers = {be: SmoothedInt8Linear(linear, smooth, 8, backend=be) for be in ("int_mm", "fbgemm")}
    saved = {be: layer.saved_tensors() for be, layer in layers.items()}
    for key in ("weight", "weight_scale", "inv_scale"):
        assert torch.equal(saved["int_mm"][key], saved["fbgemm"][key]), key
    with torch.inference_mode():
        y = layers["int_mm"](x)
        reference = linear(x)
        assert layers["int_mm"](torch.zeros(0, 64)).shape == (0, 24)
    rows = (x.reshape(-1, 64) * layers["int_mm"].inv_scale).double()
    hi, lo = rows.max(), rows.min()
    zero, step = (hi + lo) / 2, (hi - lo) / 254
    q = torch.round((rows - zero) / step).clamp(-127, 127)
    w = saved["int_mm"]["weight"].double().t()  # (in, out)
    scale = saved["int_mm"]["weight_scale"].double()
    expected = step * (q @ w) * scale + zero * (w.sum(0) * scale) + linear.bias.double()
    torch.testing.assert_close(y.reshape(-1, 24).double(), expected, rtol=1e-5, atol=1e-5)
    errors = {}
    for be, layer in layers.items():
        with torch.inference_mode():
            errors[be] = float((layer(x) - reference).norm() / reference.norm())
    assert errors["int_mm"] < 0.02 and abs(errors["int_mm"] - errors["fbgemm"]) < 0.005, errors
    again = SmoothedInt8Linear.from_saved(saved["fbgemm"]["weight"], saved["fbgemm"]["weight_scale"],
                                          saved["fbgemm"]["inv_scale"], layers["fbgemm"].float_bias(), 8,
                                          backend="int_mm")
    with torch.inference_mode():
        assert torch.equal(again(x), y)
    torch.testing.assert_close(layers["int_mm"].dequantized().weight, layers["fbgemm"].dequantized().weight)


@pytest.mark.skipif(not onednn_supported(), reason="oneDNN's quantized Linear is exact at 8 bits only with VNNI or AMX")
def test_the_onednn_kernel_computes_the_int_mm_integers_and_packs_only_a_cache(monkeypatch):
    """The oneDNN backend (``torch.ops.onednn.qlinear_pointwise``, the default with VNNI or AMX) computes what the
    ``torch._int_mm`` backend computes from the same integers, per call and per token, eagerly and compiled; it
    saves the same tensors; its packing is a cache that deep copies, pickles and a replaced weight rebuild; under
    bf16 autocast it returns bf16 from the kernel."""
    import copy
    import pickle

    from bertkit.quantization import kernels

    torch.manual_seed(0)
    linear = nn.Linear(64, 24)
    smooth = torch.rand(64) + 0.5
    layers = {be: SmoothedInt8Linear(linear, smooth, 8, backend=be) for be in ("int_mm", "onednn")}
    tokenwise = {be: PerTokenInt8Linear.from_float(linear) for be in ("int_mm", "onednn")}
    tokenwise["int_mm"].backend, tokenwise["onednn"].backend = "int_mm", "onednn"
    small, large = torch.randn(3, 7, 64) * 2 + 0.4, torch.randn(4500, 64) * 3 - 1  # large: the compiled path
    assert large.numel() >= kernels._COMPILE_FROM > small.numel()
    with torch.inference_mode():
        for x in (small, large):
            torch.testing.assert_close(layers["onednn"](x), layers["int_mm"](x), rtol=1e-6, atol=1e-5)
            torch.testing.assert_close(tokenwise["onednn"](x), tokenwise["int_mm"](x), rtol=1e-6, atol=1e-5)
        assert layers["onednn"](torch.zeros(0, 64)).shape == (0, 24)
        for key, value in layers["int_mm"].saved_tensors().items():
            assert torch.equal(layers["onednn"].saved_tensors()[key], value), key
        y = layers["onednn"](small)
        assert torch.equal(copy.deepcopy(layers["onednn"])(small), y)
        assert torch.equal(pickle.loads(pickle.dumps(layers["onednn"]))(small), y)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y16 = layers["onednn"](small)
        assert y16.dtype == torch.bfloat16
        torch.testing.assert_close(y16.float(), y, rtol=1e-2, atol=2e-2)
    with torch.no_grad():  # integers replaced in place are packed again, not served from the old packing
        for layer in layers.values():
            layer.weight_t.neg_()
        torch.testing.assert_close(layers["onednn"](small), layers["int_mm"](small), rtol=1e-6, atol=1e-5)
        assert not torch.allclose(layers["onednn"](small), y, atol=0.5)
    assert kernels.default_backend(8) == "onednn" and kernels.default_backend(7) == "fbgemm"
    # 7-bit codes (zero point 64) on oneDNN: the same integers as torch._int_mm at 63 levels
    narrow = {be: SmoothedInt8Linear(linear, smooth, 7, backend=be) for be in ("int_mm", "onednn")}
    with torch.inference_mode():
        for x in (small, large):
            torch.testing.assert_close(narrow["onednn"](x), narrow["int_mm"](x), rtol=1e-6, atol=1e-5)
    monkeypatch.setattr(kernels, "fbgemm_available", lambda: False)  # a PyTorch without torch.ao's kernel
    assert kernels.default_backend(7) == "onednn"
    monkeypatch.setattr(kernels, "onednn_supported", lambda bits=8: bits == 7)  # an AVX2 CPU
    with pytest.raises(BertkitError, match="'onednn' is not exact here at activation_bits=8"):
        SmoothedInt8Linear(linear, smooth, 8, backend="onednn")


_AVX2_PROBE = """
import torch
from torch import nn
from bertkit.quantization import kernels
from bertkit.quantization.device import onednn_supported
from bertkit.quantization.kernels import SmoothedInt8Linear
torch.manual_seed(0)
linear, smooth, x = nn.Linear(64, 24), torch.rand(64) + 0.5, torch.randn(5, 64) * 2 + 0.4
layer = SmoothedInt8Linear(linear, smooth, 7, backend="onednn")
saved = layer.saved_tensors()
rows = (x * layer.inv_scale).double()
zero, step = (rows.max() + rows.min()) / 2, (rows.max() - rows.min()) / 126
q = torch.round((rows - zero) / step).clamp(-63, 63)
w, scale = saved["weight"].double().t(), saved["weight_scale"].double()
expected = step * (q @ w) * scale + zero * (w.sum(0) * scale) + linear.bias.double()
with torch.inference_mode():
    error = float((layer(x).double() - expected).abs().max())
print(onednn_supported(8), onednn_supported(7), error < 1e-4)
"""


@pytest.mark.skipif(not onednn_supported(), reason="needs an x86 CPU whose oneDNN runs at 8 bits, to narrow it")
def test_on_avx2_onednn_is_refused_at_8_bits_and_exact_at_7():
    """oneDNN held to AVX2 (``ONEDNN_MAX_CPU_ISA``: what a CPU without VNNI runs) sums pairs of u8 x s8 products
    in int16: the probe finds 8-bit codes inexact there and 7-bit ones (zero point 64, codes 1..127) exact, and a
    7-bit layer on it is its formula computed in float64 from the same integers."""
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-c", _AVX2_PROBE], env={**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX2"},
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split() == ["False", "True", "True"], run.stdout


def test_per_token_linear_keeps_rows_near_the_float32_limit_finite():
    """A row spanning -3e38..3e38 (its range, 6e38, is past float32's 3.4e38) is quantized like any other:
    the output is the float64 product within int8's error, not inf or NaN from an overflowing range."""
    torch.manual_seed(0)
    linear = nn.Linear(16, 4)
    with torch.no_grad():
        linear.weight.mul_(1e-30)
    layer = PerTokenInt8Linear.from_float(linear)
    x = torch.randn(3, 16)
    x[0, 3], x[0, 7] = 3e38, -3e38
    x[1] *= 1e37
    with torch.inference_mode():
        y = layer(x)
    assert bool(torch.isfinite(y).all()), y
    with torch.no_grad():
        expected = x.double() @ layer.dequantized().weight.double().t() + linear.bias.double()
    error = (y.double() - expected).norm(dim=1) / expected.norm(dim=1)
    assert float(error.max()) < 0.02, error


@pytest.mark.parametrize("bad", [0.0, -0.5, float("nan"), float("inf")])
def test_damaged_saved_scales_are_refused(bad):
    """A zero, negative or non-finite scale in a saved int8 file would silently zero, flip or NaN its
    projection's outputs; loading names the tensor, the entry and its value instead."""
    linear = nn.Linear(8, 4)
    saved = PerTokenInt8Linear.from_float(linear).saved_tensors()
    saved["weight_scale"][2] = bad
    with pytest.raises(BertkitError, match=rf"weight_scale must be finite and > 0; entry 2 of 4 is {bad!r}"):
        PerTokenInt8Linear.from_saved(saved["weight"], saved["weight_scale"], linear.bias)
    with _packing():
        saved = SmoothedInt8Linear(linear, torch.ones(8)).saved_tensors()
        saved["inv_scale"][5] = bad
        with pytest.raises(BertkitError, match=rf"inv_scale must be finite and > 0; entry 5 of 8 is {bad!r}"):
            SmoothedInt8Linear.from_saved(saved["weight"], saved["weight_scale"], saved["inv_scale"], linear.bias)


def test_the_vnni_probe_catches_a_kernel_that_saturates():
    """oneDNN can run its non-VNNI int8 kernel on a VNNI CPU (ONEDNN_MAX_CPU_ISA); its pairwise int16 sums
    saturate on runs of 127s, which the probe multiplies, so per-token layers are not built or loaded there
    (they would be silently wrong: measured 4% relative error instead of 0.8% on MiniLM's ffn_out)."""
    import subprocess
    import sys

    if not per_token_supported():
        pytest.skip("no exact torch._int_mm here in the first place")
    code = "from bertkit.quantization import per_token_supported; print(per_token_supported())"
    for isa in ("AVX2", "AVX512_CORE"):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                             env={**os.environ, "ONEDNN_MAX_CPU_ISA": isa, "OMP_NUM_THREADS": "1"})
        assert out.stdout.strip() == "False", (isa, out.stdout, out.stderr)


@pytest.mark.skipif(not per_token_supported(), reason="per-token int8 (torch._int_mm) needs AVX512-VNNI here")
def test_a_fast_model_saved_and_loaded_computes_the_same_bits(fp32, calibration, tok, sst2_sentences, tmp_path):
    from bertkit.quantization import load_int8, save_int8

    fast = quantize_int8(fp32, calibration=calibration, keep_fp32=FAST_KEEP_FP32, per_token=FAST_PER_TOKEN)
    save_int8(fast, tmp_path / "fast")
    loaded = load_int8(tmp_path / "fast")
    assert per_token_projections(loaded) == per_token_projections(fast)
    texts = sst2_sentences[:64]
    assert torch.equal(embed(loaded, tok, texts), embed(fast, tok, texts))


def test_argument_errors_name_the_argument_given():
    with pytest.raises(BertkitError, match=r"per_token must be a list of names.*per_token=\['ffn_out'\]"):
        resolve_keep_fp32("ffn_out", 6, "per_token")
    with pytest.raises(BertkitError, match="per_token entry 'ffn' is not a projection"):
        resolve_keep_fp32(["ffn"], 6, "per_token")
    layer = PerTokenInt8Linear.from_float(nn.Linear(12, 4))
    with pytest.raises(BertkitError, match=r"input of shape \(4, 6\).*takes 12 features"):
        layer(torch.randn(4, 6))


@pytest.mark.skipif(not per_token_supported(), reason="per-token int8 (torch._int_mm) needs AVX512-VNNI here")
def test_per_token_projections_refuse_training_and_overlap_with_keep_fp32(fp32):
    layer = PerTokenInt8Linear.from_float(nn.Linear(8, 4))
    with pytest.raises(BertkitError, match="inference only"):
        layer.train()
    y = layer(torch.randn(3, 8, requires_grad=True))
    with pytest.raises(BertkitError, match="inference only"):
        y.sum().backward()
    with pytest.raises(BertkitError, match="layers.0.ffn_out named in both keep_fp32 and per_token"):
        quantize_int8(fp32, calibration=None, keep_fp32=["layers.0"], per_token=["ffn_out"])


@pytest.fixture(scope="module")
def int8_7bit(fp32, calibration) -> BertModel:
    return quantize_int8(fp32, calibration=calibration, activation_bits=7)


@pytest.mark.parametrize("width", ["default", "7-bit"])
def test_embeddings_within_cosine_099_on_stsb_and_sst2(width, fp32, int8, int8_7bit, tok, stsb_sentences,
                                                       sst2_sentences):
    """Both widths with the default fp32 set, every ffn_out (measured on this AVX512-VNNI CPU, min cosine
    STS-B / SST-2: 8 bits 0.9992 / 0.9978, 7 bits 0.9973 / 0.9934)."""
    model = int8 if width == "default" else int8_7bit
    for texts, floor in ((stsb_sentences, 0.99), (sst2_sentences[:200], 0.99)):
        cos = F.cosine_similarity(embed(model, tok, texts), embed(fp32, tok, texts))
        assert float(cos.min()) >= floor, (float(cos.min()), texts[int(cos.argmin())])
        assert float(cos.mean()) >= 0.995


@pytest.mark.skipif(not per_token_supported(), reason="torch._int_mm is exact at 8 bits only with AVX512-VNNI")
def test_without_torch_ao_the_default_int8_runs_on_int_mm_at_the_same_accuracy(fp32, calibration, tok,
                                                                              stsb_sentences, tmp_path, monkeypatch):
    """A PyTorch without torch.ao's dynamic Linear (its removal is scheduled): ``quantize_int8`` builds every
    projection on ``torch._int_mm``, the embeddings stay within cosine 0.99 of fp32 on STS-B, and the directory it
    saves is the same integers a torch.ao model reads back, with outputs within int8's rounding of each other."""
    from bertkit.quantization import kernels, load_int8, save_int8

    monkeypatch.setattr(kernels, "fbgemm_available", lambda: False)
    monkeypatch.setattr(kernels, "onednn_supported", lambda bits=8: False)  # nor oneDNN's quantized Linear
    model = quantize_int8(fp32, calibration=calibration)
    layers = [m for m in model.modules() if isinstance(m, SmoothedInt8Linear)]
    assert len(layers) == 18 and {m.backend for m in layers} == {"int_mm"}
    cos = F.cosine_similarity(embed(model, tok, stsb_sentences), embed(fp32, tok, stsb_sentences))
    assert float(cos.min()) >= 0.99 and float(cos.mean()) >= 0.995, float(cos.min())
    save_int8(model, tmp_path / "int_mm")
    monkeypatch.setattr(kernels, "fbgemm_available", lambda: True)
    loaded = load_int8(tmp_path / "int_mm")
    assert {m.backend for m in loaded.modules() if isinstance(m, SmoothedInt8Linear)} == {"fbgemm"}
    for a, b in zip(layers, [m for m in loaded.modules() if isinstance(m, SmoothedInt8Linear)]):
        assert torch.equal(a.saved_tensors()["weight"], b.saved_tensors()["weight"])
    both = F.cosine_similarity(embed(loaded, tok, stsb_sentences[:100]), embed(model, tok, stsb_sentences[:100]))
    assert float(both.min()) >= 0.995


@pytest.mark.skipif(int8_activation_bits() != 8, reason="8-bit activations need AVX512-VNNI, which this CPU lacks")
def test_eight_bits_halve_the_error_of_seven(fp32, calibration, tok, stsb_sentences):
    """The same int8 projections (all but layers 0-1's ffn_out) with 8- and 7-bit activations: the extra
    bit is what lets the feed-forward outputs be int8 (measured: mean 1 - cosine 0.0011 at 8 bits, 0.0037 at 7)."""
    texts = stsb_sentences[:200]
    ref = embed(fp32, tok, texts)
    loss = {bits: float((1 - F.cosine_similarity(embed(quantize_int8(
        fp32, calibration=calibration, activation_bits=bits, keep_fp32=["layers.0.ffn_out", "layers.1.ffn_out"]),
        tok, texts), ref)).mean()) for bits in (7, 8)}
    assert loss[8] < 0.6 * loss[7], loss


def test_eight_bits_are_refused_without_vnni(fp32, monkeypatch):
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: {"avx2": True})
    assert int8_activation_bits() == 7
    with pytest.raises(BertkitError, match="8-bit activations need AVX512-VNNI"):
        quantize_int8(fp32, calibration=None, activation_bits=8)
    with pytest.raises(BertkitError, match="activation_bits must be 7 or 8"):
        quantize_int8(fp32, calibration=None, activation_bits=4)
    auto = quantize_int8(fp32, calibration=None)
    assert int8_projections(auto) == [f"layers.{i}.{k}" for i in range(6) for k in ("qkv", "attn_out", "ffn_in")]


def test_smoothing_is_what_reaches_the_bar(fp32, tok, stsb_sentences):
    """Without calibration (plain dynamic quantization) the same projections fall below 0.99: the
    smoothing is needed, not decoration."""
    plain = quantize_int8(fp32, calibration=None, activation_bits=7, keep_fp32=DEFAULT_KEEP_FP32)
    texts = stsb_sentences[:200]
    cos = F.cosine_similarity(embed(plain, tok, texts), embed(fp32, tok, texts))
    assert float(cos.min()) < 0.99


def test_classifier_argmax_agrees(minilm_dir, calibration, tok, sst2_sentences):
    torch.manual_seed(0)
    model = BertForSequenceClassification.from_pretrained(minilm_dir, num_labels=3).eval()
    q = quantize_int8(model, calibration=calibration)
    assert type(q.classifier) is nn.Linear  # the head stays fp32
    texts = sst2_sentences[:200]
    agree, margins, pooled_cos = [], [], []
    with torch.inference_mode():
        for a in range(0, len(texts), 32):
            enc = tok(texts[a:a + 32], truncation=True, max_length=128, padding=True, return_tensors="pt")
            args = (enc["input_ids"], enc["attention_mask"], enc["token_type_ids"])
            ref = model(*args).logits
            agree.append(ref.argmax(-1) == q(*args).logits.argmax(-1))
            top2 = ref.topk(2, dim=-1).values
            margins.append(top2[:, 0] - top2[:, 1])
            pooled_cos.append(F.cosine_similarity(model.bert(*args).pooler_output, q.bert(*args).pooler_output))
    assert float(torch.cat(pooled_cos).min()) >= 0.99  # measured 0.9977
    # A random head's logits barely differ between sentences (std 0.01), so many of its decisions are near
    # ties. Measured: 195 / 200 agree (189 with --fast's per-token ffn_out), and every disagreement is a
    # sentence whose fp32 top-2 margin is at most a quarter of the median margin. So: overall agreement,
    # and no disagreement where fp32's decision is not a near-tie. A fitted head's agreement is in
    # bench/int8_sensitivity.py and the fine-tuned tasks' in RESULTS.md.
    agree, margins = torch.cat(agree), torch.cat(margins)
    assert float(agree.float().mean()) >= 0.9
    clear = margins > 0.5 * margins.median()
    assert bool(agree[clear].all()), margins[clear & ~agree]


@pytest.mark.parametrize("name", sorted(set(MODEL_CLASSES) - {"BertModel"}))
def test_every_head_runs_quantized(name, minilm_dir, calibration, tok, sst2_sentences):
    cls = MODEL_CLASSES[name]
    torch.manual_seed(0)
    model = cls.from_pretrained(minilm_dir).eval()
    q = quantize_int8(model, calibration=calibration[:2])
    assert int8_projections(q) and all(not isinstance(m, INT8_LAYERS) for n, m in q.named_modules()
                                       if not n.startswith("bert.encoder.layer."))
    texts = sst2_sentences[:8]
    enc = tok(texts, truncation=True, max_length=64, padding=True, return_tensors="pt")
    args = [enc["input_ids"], enc["attention_mask"], enc["token_type_ids"]]
    if cls is BertForMultipleChoice:
        args = [t.unsqueeze(1).expand(-1, 2, -1) for t in args]  # (B, C=2, T)
    with torch.inference_mode():
        ref, out = model(*args).to_tuple()[0], q(*args).to_tuple()[0]
    real = ref > torch.finfo(ref.dtype).min / 2  # QA masks non-context positions with the dtype's minimum
    assert out.shape == ref.shape and torch.equal(real, out > torch.finfo(out.dtype).min / 2)
    assert torch.isfinite(out[real]).all()
    assert float(F.cosine_similarity(out[real], ref[real], dim=0)) >= 0.99


def test_padded_and_unpadded_layouts_agree(int8, fp32, tok, sst2_sentences):
    """Both layouts stay within int8's error of fp32. They differ from each other by more than float
    rounding: the padded layout's per-call activation scale also covers the padding positions."""
    texts = sst2_sentences[:96]
    unpadded, padded = embed(int8, tok, texts), embed(int8, tok, texts, layout="padded")
    reference = embed(fp32, tok, texts)
    assert float(F.cosine_similarity(padded, reference).min()) >= 0.99  # measured 0.9907 (unpadded 0.9967)
    assert float(F.cosine_similarity(unpadded, reference).min()) >= 0.99
    assert float(F.cosine_similarity(unpadded, padded).min()) >= 0.98


def test_no_deprecation_warning_reaches_the_caller(fp32, calibration):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quantize_int8(fp32, calibration=calibration[:1])
    assert not [w for w in caught if "deprecated" in str(w.message)], [str(w.message)[:80] for w in caught]


def test_refuses_without_an_x86_engine_or_onednn(fp32, monkeypatch):
    monkeypatch.setattr(type(torch.backends.quantized), "supported_engines", ["qnnpack", "none"])
    monkeypatch.setattr("bertkit._hardware.onednn_int8_exact", lambda levels: False)
    with pytest.raises(BertkitError, match=r"oneDNN's quantized Linear .*fbgemm or x86 .*\['qnnpack', 'none'\]"):
        quantize_int8(fp32, calibration=None)


@pytest.mark.skipif(not onednn_supported(), reason="oneDNN's quantized Linear is exact at 8 bits only with VNNI or AMX")
def test_without_an_x86_engine_int8_runs_on_onednn(fp32, calibration, tok, stsb_sentences, tmp_path, monkeypatch):
    """A PyTorch whose torch.ao engines are gone: quantizing, saving and loading run on oneDNN's operator, and the
    embeddings hold the bar."""
    from bertkit.quantization import load_int8, save_int8

    monkeypatch.setattr(type(torch.backends.quantized), "supported_engines", ["qnnpack", "none"])
    model = quantize_int8(fp32, calibration=calibration)
    assert {m.backend for m in model.modules() if isinstance(m, SmoothedInt8Linear)} == {"onednn"}
    save_int8(model, tmp_path / "q")
    loaded = load_int8(tmp_path / "q")
    texts = stsb_sentences[:200]
    cos = F.cosine_similarity(embed(loaded, tok, texts), embed(fp32, tok, texts))
    assert float(cos.min()) >= 0.99, float(cos.min())


def test_refuses_models_and_arguments_it_cannot_quantize(fp32, calibration, int8):
    with pytest.raises(BertkitError, match="bfloat16.*model.float"):
        quantize_int8(BertModel(fp32.config).to(torch.bfloat16), calibration=None)
    with pytest.raises(BertkitError, match="BertModel or head model"):
        quantize_int8(nn.Linear(4, 4), calibration=None)
    with pytest.raises(BertkitError, match="quantized already"):
        quantize_int8(int8, calibration=None, keep_fp32=())
    with pytest.raises(BertkitError, match="list of names.*\\['ffn_out'\\]"):
        quantize_int8(fp32, calibration=None, keep_fp32="ffn_out")
    with pytest.raises(BertkitError, match="'layers.6'.*6 layers"):
        quantize_int8(fp32, calibration=None, keep_fp32=["layers.6"])
    with pytest.raises(BertkitError, match="'ffn' is not a projection"):
        quantize_int8(fp32, calibration=None, keep_fp32=["ffn"])
    with pytest.raises(BertkitError, match="alpha must be"):
        quantize_int8(fp32, calibration=calibration, alpha=1.5)
    with pytest.raises(BertkitError, match="no batches"):
        quantize_int8(fp32, calibration=[])
    assert resolve_keep_fp32(["layers.-1", "layers.0.qkv"], 6) == {(5, k) for k in PROJECTIONS} | {(0, "qkv")}


@pytest.mark.skipif(not per_token_supported(), reason="torch._int_mm is exact at 8 bits only with AVX512-VNNI")
def test_the_compiled_projections_equal_the_eager_ones_and_a_failed_compile_falls_back(monkeypatch, caplog):
    """The int8 projections Inductor compiles (quantization in one pass, ``torch._int_mm``, the float epilogue)
    equal their eager definitions to float rounding, on ragged ranges, a constant row, one row and an odd width,
    with and without a bias; a few tokens run eagerly; where compiling fails the layer says so once and runs the
    eager function."""
    import shutil

    from bertkit.quantization import kernels

    small = kernels._Fused(kernels.linear_per_token)
    with torch.inference_mode():
        small(torch.randn(3, 96), torch.randint(-127, 128, (96, 8), dtype=torch.int8), torch.rand(8), torch.randn(8),
              None)
    assert small.compiled is None  # a few tokens never pay for compiling
    monkeypatch.setattr(kernels, "_COMPILE_FROM", 0)  # the small cases below compile
    torch.manual_seed(0)
    x = torch.randn(37, 96) * (torch.rand(37, 1) * 20) + 0.3
    x[5] = 0.7  # constant row: step clamps to the smallest float, codes 0
    w = torch.randint(-127, 128, (96, 40), dtype=torch.int8)
    ws, rowsum, inv, bias = torch.rand(40) / 100, torch.randn(40), torch.rand(96) + 0.5, torch.randn(40)
    cases = []
    for b in (bias, None):
        cases += [(kernels._linear_per_token, kernels.linear_per_token, (x, w, ws, rowsum, b)),
                  (kernels._linear_per_token, kernels.linear_per_token, (x[:1, :33].contiguous(), w[:33], ws, rowsum, b)),
                  (kernels._linear_per_call, kernels.linear_per_call, (x, inv, 127, w, ws, rowsum, b)),
                  (kernels._linear_per_call, kernels.linear_per_call, (x, inv, 63, w, ws, rowsum, b))]
    with torch.inference_mode():
        for fused, eager, args in cases:
            torch.testing.assert_close(fused(*args), eager(*args), rtol=1e-5, atol=1e-5)
        q, zero, step = kernels.quantize_per_token(x)
    assert q.dtype == torch.int8 and int(q[5].abs().max()) == 0 and int(q.abs().max()) == 127
    # a grad-mode call (the layer then refuses backward) and a bad input run eagerly and leave compiling on
    kernels._linear_per_token(x.clone().requires_grad_(), w, ws, rowsum, bias)
    with pytest.raises(RuntimeError), torch.inference_mode():
        kernels._linear_per_token(x[:, :50], w, ws, rowsum, bias)
    if shutil.which("c++") or shutil.which("g++"):
        assert kernels._linear_per_token.compiled is not None and not kernels._linear_per_token.failed

    def no_compiler(fn, **kwargs):
        def run(*args):
            raise RuntimeError("InvalidCxxCompiler: no working C++ compiler found")
        return run

    monkeypatch.setattr(torch, "compile", no_compiler)
    broken = kernels._Fused(kernels.linear_per_token)
    with caplog.at_level("WARNING", logger="bertkit.quantization.kernels"), torch.inference_mode():
        first = broken(x, w, ws, rowsum, bias)
        second = broken(x, w, ws, rowsum, bias)
        want = kernels.linear_per_token(x, w, ws, rowsum, bias)
    assert broken.failed and caplog.text.count("no working C++ compiler") == 1
    assert torch.equal(first, want) and torch.equal(second, want)


def test_a_compiled_quantization_that_disagrees_with_its_eager_definition_is_dropped(monkeypatch, caplog):
    """Inductor's cache has served a kernel built under another ATEN_CPU_CAPABILITY that computed a wrong range:
    the first compiled call is checked against the eager function, and a disagreeing kernel is never used again
    (the eager result is returned, with a warning); one that agrees is kept without further checks."""
    from bertkit.quantization import kernels

    x, inv = torch.randn(kernels._COMPILE_FROM // 64 + 1, 64) * 3 - 1, torch.rand(64) + 0.5

    def stale(fn, dynamic):
        return lambda *args: (lambda q, zero, step: (q // 2, zero * 2, step))(*fn(*args))

    monkeypatch.setattr(torch, "compile", stale)
    fused = kernels._Fused(kernels.quantize_per_call_u8)
    with caplog.at_level("WARNING", logger="bertkit.quantization.kernels"):
        got = fused(x, inv, 127)
    expected = kernels.quantize_per_call_u8(x, inv, 127)
    assert all(torch.equal(a, b) for a, b in zip(got, expected)) and fused.failed
    assert "disagreed with its eager definition" in caplog.text
    assert torch.equal(fused(x, inv, 63)[0], kernels.quantize_per_call_u8(x, inv, 63)[0])  # eager from now on

    calls = []
    monkeypatch.setattr(torch, "compile", lambda fn, dynamic: lambda *args: calls.append(1) or fn(*args))
    fused = kernels._Fused(kernels.quantize_per_call_u8)
    fused(x, inv, 127), fused(x, inv, 127)
    assert fused.checked and not fused.failed and len(calls) == 2


def test_per_token_codes_of_bf16_activations_are_computed_in_float32(monkeypatch, caplog):
    """Under ``--bf16`` the layer before a per-token projection hands over bf16 activations. Their codes, zero points
    and steps are those of the same values in float32: computed in bf16 (8 significant bits) codes landed up to a
    few levels off, and the compiled kernel (which computes in float32) then disagreed with the eager one, so
    ``--fast --bf16`` warned and dropped the compiled quantization for the rest of the process."""
    import shutil

    from bertkit.quantization import kernels

    torch.manual_seed(0)
    x = (torch.randn(64, 1536) * (torch.rand(64, 1) * 6) + 0.2).to(torch.bfloat16)
    want = kernels.quantize_per_token_u8(x.float())
    got = kernels.quantize_per_token_u8(x)
    assert all(a.dtype == b.dtype and torch.equal(a, b) for a, b in zip(got, want))
    assert got[1].dtype == got[2].dtype == torch.float32
    if not (shutil.which("c++") or shutil.which("g++")):
        return
    monkeypatch.setattr(kernels, "_COMPILE_FROM", 0)
    fused = kernels._Fused(kernels.quantize_per_token_u8)
    with caplog.at_level("WARNING", logger="bertkit.quantization.kernels"), torch.inference_mode(), \
            torch.autocast("cpu", dtype=torch.bfloat16):
        fused(x)
    assert fused.checked and not fused.failed and "disagreed" not in caplog.text
