"""int8 inference (``bertkit.quantization``) on the real MiniLM checkpoint and real text.

What is checked: the kernel chosen for each CPU class (``_hardware.int8_kernel``) and each kernel's arithmetic;
int8 keeps every sentence's mean-pooled embedding within cosine 0.99 of fp32 on 200 STS-B and 200 SST-2 dev
sentences, on this machine's kernel and on the AVX2 class's (fbgemm at 7 bits, run here); a classifier head's
argmax agrees with fp32's; every head model runs quantized with its head left fp32; the padded and
unpadded layouts agree; and misuse (blank calibration text, damaged scales, training) is refused with the fix.
"""

from __future__ import annotations

import copy
import csv
import os
import pickle
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from bertkit import BertModel, BertTokenizer
from bertkit._hardware import Int8Kernel, fbgemm_int8, int8_kernel
from bertkit.errors import BertkitError
from bertkit.heads import MODEL_CLASSES, BertForMultipleChoice, BertForSequenceClassification
from bertkit.quantization import (
    Int8Linear,
    calibration_batches,
    int8_projections,
    kernels,
    quantize_int8,
    quantize_int8_on_texts,
)
from cases import slow_after

KERNEL = int8_kernel()  # this machine's int8 path: every expectation below that depends on the CPU comes from it
pytestmark = pytest.mark.skipif(KERNEL is None, reason="this PyTorch has no int8 kernel for this CPU")
FBGEMM = Int8Kernel("fbgemm", 7)  # the AVX2 class's path, which this machine can run too where fbgemm is here


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
    """256 SST-2 training sentences, as bench/int8_sensitivity.py (commit 4403231) calibrates."""
    return calibration_batches(tok, [r["sentence"] for r in _tsv(data_dir / "glue/SST-2/train.tsv")[:256]])


@pytest.fixture(scope="module")
def int8(fp32, calibration) -> BertModel:
    return quantize_int8(fp32, calibration=calibration)


@pytest.fixture(scope="module")
def stsb_sentences(data_dir) -> list[str]:
    return [s for r in _tsv(data_dir / "glue/STS-B/dev.tsv")[:100] for s in (r["sentence1"], r["sentence2"])]


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


@pytest.fixture(scope="module")
def fp32_embeddings(fp32, tok, stsb_sentences, sst2_sentences) -> dict[str, torch.Tensor]:
    """fp32's embeddings of the texts int8's are held to, computed once for every kernel checked."""
    return {"stsb": embed(fp32, tok, stsb_sentences), "sst2": embed(fp32, tok, sst2_sentences[:200])}


@pytest.fixture
def on_fbgemm(monkeypatch):
    """Int8Linear layers built inside run on fbgemm at 7 bits, the AVX2 class's path."""
    monkeypatch.setattr(kernels, "check_int8_kernel", lambda: FBGEMM)


def test_every_projection_becomes_int8_on_this_machines_kernel(fp32, int8):
    assert int8_projections(int8) == [f"layers.{i}.{k}" for i in range(6)
                                      for k in ("qkv", "attn_out", "ffn_in", "ffn_out")]
    assert int8_projections(fp32) == []  # the fp32 model is untouched (a copy was quantized)
    layer = int8.encoder.layer[0]
    assert isinstance(layer.output.dense, Int8Linear) and isinstance(layer.attention.self.qkv, Int8Linear)
    # ffn_out's activations take one scale per token, the others one per call
    assert [m.per_token for m in int8.modules() if isinstance(m, Int8Linear)] == [False, False, False, True] * 6
    assert layer.attention.self.query is None  # q, k and v: one int8 module (one GEMM)
    # ffn_out's per-token product runs on oneDNN's kernel on every class (fbgemm's takes one scale per call)
    per_token = Int8Kernel("onednn", KERNEL.activation_bits)
    assert [m.kernel for m in int8.modules() if isinstance(m, Int8Linear)] == ([KERNEL] * 3 + [per_token]) * 6
    assert type(int8.pooler.dense) is nn.Linear and not int8.training


@pytest.mark.parametrize(("onednn_bits", "fbgemm", "expected"), [
    ((8, 7), True, Int8Kernel("onednn", 8)),  # AVX512-VNNI or AMX
    ((7,), True, Int8Kernel("fbgemm", 7)),  # AVX2 without VNNI
    ((7,), False, Int8Kernel("onednn", 7)),  # AVX2, a PyTorch without torch.ao's kernel
    ((), False, None),  # no exact kernel: int8 is refused, naming why
])
def test_one_kernel_per_cpu_class(onednn_bits, fbgemm, expected, monkeypatch, fp32):
    from bertkit import _hardware

    monkeypatch.setattr(_hardware, "onednn_int8_exact", lambda levels: {127: 8, 63: 7}[levels] in onednn_bits)
    monkeypatch.setattr(_hardware, "fbgemm_int8", lambda: fbgemm)
    assert _hardware.int8_kernel.__wrapped__() == expected
    if expected is None:
        monkeypatch.setattr(_hardware, "int8_kernel", lambda: None)
        with pytest.raises(BertkitError, match=r"oneDNN's quantized Linear .*fbgemm .*run the fp32 model"):
            quantize_int8(fp32, calibration=[])


@pytest.mark.parametrize(("bf16", "kernel", "capability", "expected"), [
    (True, Int8Kernel("onednn", 8), "AVX512", "avx512-bf16"),  # AVX512-BF16 or AMX
    (False, Int8Kernel("onednn", 8), "AVX512", "avx512-vnni"),
    (False, Int8Kernel("fbgemm", 7), "AVX512", "avx2"),  # oneDNN held to AVX2 (ONEDNN_MAX_CPU_ISA)
    (False, Int8Kernel("onednn", 7), "AVX2", "avx2"),
    (False, None, "AVX2", "avx2"),
    (False, None, "DEFAULT", "default"),
])
def test_the_cpu_class_is_what_the_probes_choose_by(bf16, kernel, capability, expected, monkeypatch):
    from bertkit import _hardware

    monkeypatch.setattr(_hardware, "cpu_has_bf16", lambda: bf16)
    monkeypatch.setattr(_hardware, "int8_kernel", lambda: kernel)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
    assert _hardware.cpu_class() == expected


_EMULATED = """
from bertkit import _hardware
from bertkit.inference.prepare import cpu_key_multiple
print(_hardware.cpu_class(), _hardware.cpu_has_bf16(), _hardware.int8_kernel().activation_bits, cpu_key_multiple())
"""

_AVX2_PROBE = """
import torch
from torch import nn
from bertkit import _hardware
from bertkit.quantization.kernels import Int8Linear
torch.manual_seed(0)
linear, smooth, x = nn.Linear(64, 24), torch.rand(64) + 0.5, torch.randn(5, 64) * 2 + 0.4
layer = Int8Linear.from_float(linear, smooth)
_hardware.int8_kernel.cache_clear()
_hardware.fbgemm_int8 = lambda: False  # a PyTorch without torch.ao: oneDNN at 7 bits
layer._pack()
rows = (x * layer.inv_scale).double()
lo, hi = min(float(rows.min()), 0.0), max(float(rows.max()), 0.0)  # the range widened to hold 0, 7 bits: 127 steps
step = (hi - lo) / 127
q = torch.round(rows / step + round(-lo / step)).clamp(0, 127) - round(-lo / step)
w, scale = layer.weight.double().t(), layer.weight_scale.double()
expected = step * (q @ w) * scale + linear.bias.double()
with torch.inference_mode():
    error = float((layer(x).double() - expected).abs().max())
print(_hardware.onednn_int8_exact(127), _hardware.onednn_int8_exact(63), layer.kernel.name, layer.kernel.levels,
      error < 1e-4)
"""


@pytest.fixture(scope="module")
def emulated_avx2() -> list[str]:
    """The output lines of _EMULATED, then of _AVX2_PROBE, run in one interpreter held to AVX2 (ATen's kernels and
    oneDNN: how BENCHMARKS.md emulates an AVX2-only CPU; a second interpreter cost 2 s of CPU)."""
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
    run = subprocess.run([sys.executable, "-c", _EMULATED + _AVX2_PROBE], env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    return run.stdout.splitlines()


@pytest.mark.skipif(KERNEL.activation_bits != 8, reason="needs a CPU above AVX2, to emulate an AVX2 one on")
def test_the_probes_see_an_emulated_avx2_cpu(emulated_avx2):
    """Held to AVX2, every probe answers as on such a CPU: no bf16, int8 at 7 bits, attention keys rounded to AVX2's
    8-float vector, class avx2."""
    assert emulated_avx2[0].split() == ["avx2", "False", "7", "8"], emulated_avx2


@pytest.mark.skipif(KERNEL != Int8Kernel("onednn", 8), reason="needs a CPU whose oneDNN runs at 8 bits, to narrow it")
def test_on_avx2_onednn_is_not_exact_at_8_bits_and_is_its_formula_at_7(emulated_avx2):
    """oneDNN held to AVX2 (``ONEDNN_MAX_CPU_ISA``: what a CPU without VNNI runs) sums pairs of u8 x s8 products
    in int16: the probe finds 8-bit codes inexact there and 7-bit ones (zero point 64) exact, and a 7-bit layer on
    it is its formula computed in float64 from the same integers."""
    assert emulated_avx2[1].split() == ["False", "True", "onednn", "63", "True"], emulated_avx2


# one kernel in make test (fbgemm's 7 bits on an AVX2 machine, where KERNEL is FBGEMM); the other in make test-slow
@pytest.mark.parametrize("kernel", [KERNEL, pytest.param(FBGEMM, marks=pytest.mark.slow)])
def test_a_per_token_layer_is_its_formula_with_each_tokens_own_scale(kernel, monkeypatch):
    """A per-token Int8Linear (``ffn_out``) computes y = (lo_t + step_t * codes_t) @ Q(W / inv_scale)^T + b with each
    token's own range: every token within half a step of its own range of the float product, whatever the other
    tokens (a token 1,000x smaller than the rest keeps its precision, and its output does not move when they
    change); on the AVX2 class (fbgemm, one scale per call) it runs oneDNN's kernel at that class's 7 bits."""
    if kernel.name == "fbgemm" and not fbgemm_int8():
        pytest.skip("this PyTorch has no fbgemm kernel")
    monkeypatch.setattr(kernels, "check_int8_kernel", lambda: kernel)
    # the eager definition, whatever an earlier test in this process ran (a server's warm-up compiles the
    # quantization: seconds of Inductor here); the compiled one is held to it by its own tests
    monkeypatch.setattr(kernels.compiled_quantize_per_token, "eager_activations", 0)
    torch.manual_seed(0)
    linear, smooth = nn.Linear(96, 24), torch.rand(96) + 0.5
    layer = Int8Linear.from_float(linear, smooth, per_token=True)
    assert layer.per_token and layer.kernel == Int8Kernel("onednn", kernel.activation_bits)
    scales = torch.logspace(-3, 1, 4500)[:, None]  # rows spanning four orders of magnitude
    small, large = torch.randn(5, 96) * scales[::900], torch.randn(4500, 96) * scales - 0.1 * scales
    assert large.numel() >= kernels.COMPILE_FROM > small.numel()
    w = layer.weight.double() * layer.weight_scale.double()[:, None]
    with torch.inference_mode():
        for x in (small, large):
            rows = (x * layer.inv_scale).double()
            step = (rows.amax(1) - rows.amin(1)) / (2 * kernel.levels + 1)  # (T,) each token's own
            error = (layer(x).double() - rows @ w.t() - linear.bias.double()).abs().amax(1)
            assert bool((error <= step * w.abs().sum(1).max() / 2 * 1.001 + 1e-5).all()), (kernel, error.max())
        alone, with_others = layer(small[:1]), layer(torch.cat([small[:1], small[1:] * 1000]))[:1]
        assert torch.equal(alone, with_others)
        assert torch.equal(pickle.loads(pickle.dumps(layer))(small), layer(small))
        assert torch.isnan(layer(torch.cat([small[:1], torch.full((1, 96), float("nan"))]))[1]).all()


@pytest.mark.parametrize("kernel", [KERNEL, FBGEMM])
def test_a_layer_is_its_formula_and_its_packing_follows_its_integers(kernel, monkeypatch):
    """An Int8Linear computes y = Q(x * inv_scale) @ Q(W / inv_scale)^T + b within its kernel's rounding, on a few
    tokens and on a call large enough to compile; deep copies, pickles and a state-dict load pack again (the
    packing is never saved); under bf16 autocast oneDNN writes bf16; an empty input gives an empty output."""
    if kernel.name == "fbgemm" and not fbgemm_int8():
        pytest.skip("this PyTorch has no fbgemm kernel")
    monkeypatch.setattr(kernels, "check_int8_kernel", lambda: kernel)
    torch.manual_seed(0)
    linear, smooth = nn.Linear(64, 24), torch.rand(64) + 0.5
    layer = Int8Linear.from_float(linear, smooth)
    assert set(layer.state_dict()) == {"weight", "weight_scale", "inv_scale", "bias"}
    small, large = torch.randn(3, 7, 64) * 2 + 0.4, torch.randn(4500, 64) * 3 - 1
    with torch.inference_mode():
        for x in (small, large):
            rows = (x.reshape(-1, 64) * layer.inv_scale).double()
            step = (rows.max() - rows.min()) / (2 * kernel.levels)
            w = layer.weight.double() * layer.weight_scale.double()[:, None]
            y = layer(x)
            assert y.shape == (*x.shape[:-1], 24)
            error = (y.reshape(-1, 24).double() - rows @ w.t() - linear.bias.double()).abs().max()
            assert float(error) <= float(step * w.abs().sum(1).max()), (kernel, float(error))  # half a step each
        y = layer(small)
        assert torch.equal(copy.deepcopy(layer)(small), y) and torch.equal(pickle.loads(pickle.dumps(layer))(small), y)
        assert layer(torch.zeros(0, 64)).shape == (0, 24)
        if kernel.name == "onednn":
            with torch.autocast("cpu", dtype=torch.bfloat16):
                y16 = layer(small)
            assert y16.dtype == torch.bfloat16
            torch.testing.assert_close(y16.float(), y, rtol=1e-2, atol=2e-2)
    other = Int8Linear.from_float(nn.Linear(64, 24), smooth)
    other.load_state_dict(layer.state_dict())  # packed again from the loaded integers
    with torch.inference_mode():
        assert torch.equal(other(small), y)


@pytest.mark.parametrize(("name", "bad"), [("weight_scale", 0.0), ("weight_scale", -0.5), ("weight_scale", float("nan")),
                                           ("inv_scale", float("inf")), ("inv_scale", 1e30), ("inv_scale", 1e-9)])
def test_damaged_saved_scales_are_refused(name, bad):
    """A zero, negative, non-finite or absurd scale in a saved int8 file would silently zero, flip or NaN its
    projection's outputs, or fail inside the kernel; loading names the tensor, the entry and its value instead."""
    linear = nn.Linear(8, 4)
    saved = dict(Int8Linear.from_float(linear, torch.ones(8)).state_dict())
    saved[name] = saved[name].clone()
    saved[name][2] = bad
    with pytest.raises(BertkitError, match=rf"int8.layers.0.qkv.{name} must be finite and within .*; entry 2 of "
                                           rf"{saved[name].numel()} is {re.escape(repr(float(torch.tensor(bad))))}.*bertkit quantize --model"):
        Int8Linear.from_saved("int8.layers.0.qkv", saved["weight"], saved["weight_scale"], saved["inv_scale"],
                              linear.bias)


@pytest.mark.parametrize("bits", [8, 7])
def test_a_call_is_quantized_once_in_place_by_pytorchs_dynamic_quantization(bits):
    """The per-call codes (oneDNN's projections) are PyTorch's dynamic quantization's own bytes, not a copy: its
    range widened to hold 0, 2**bits - 1 steps, an integer zero point; every activation within half a step; a call
    holding NaN or inf answers NaN for every output (its one scale has no range), not an error."""
    from bertkit.quantization.kernels import quantize_per_call

    torch.manual_seed(0)
    x, inv = torch.randn(50, 64) * 3 + 5, torch.rand(64) + 0.5  # all positive after the offset: the range takes 0
    codes, step, zero_point = quantize_per_call(x, inv, bits)
    rows = (x * inv).double()
    assert codes.dtype == torch.uint8 and codes.shape == x.shape
    assert step == pytest.approx(float(rows.max().clamp(min=0) - rows.min().clamp(max=0)) / (2**bits - 1), rel=1e-6)
    assert 0 <= zero_point < 2**bits and int(codes.max()) == 2**bits - 1
    assert float((step * (codes.double() - zero_point) - rows).abs().max()) <= step / 2 * 1.0001
    layer = Int8Linear.from_float(nn.Linear(64, 24), inv)
    if layer.kernel.name == "onednn" and not layer.per_token:
        with torch.inference_mode():
            for bad in (float("nan"), float("inf")):
                assert torch.isnan(layer(torch.cat([x[:3], torch.full((1, 64), bad)]))).all()


@pytest.mark.parametrize("kernel", [KERNEL, FBGEMM])
@pytest.mark.parametrize("per_token", [False, True])
def test_a_nan_or_inf_activation_never_gives_a_finite_output(kernel, per_token, monkeypatch):
    """A NaN reaching an int8 projection (a NaN ``inputs_embeds``, a broken embedding row, an overflow) answers NaN,
    as the float model does: fbgemm's dynamic Linear took the call's range over the finite values and gave finite
    outputs for a NaN activation (one token's NaN embedding made an int8 model's embeddings finite numbers). A call's
    one scale has no range then: every output of the call is NaN; a per-token projection NaNs that token's row."""
    if kernel.name == "fbgemm" and not fbgemm_int8():
        pytest.skip("this PyTorch has no fbgemm kernel")
    monkeypatch.setattr(kernels, "check_int8_kernel", lambda: kernel)
    torch.manual_seed(0)
    layer = Int8Linear.from_float(nn.Linear(64, 24), torch.rand(64) + 0.5, per_token=per_token)
    x = torch.randn(5, 64)
    with torch.inference_mode():
        for bad in (float("nan"), float("inf"), -float("inf")):
            poisoned = x.clone()
            poisoned[2, 7] = bad
            y = layer(poisoned)
            assert not torch.isfinite(y[2]).any(), (bad, y[2])
            if per_token:
                torch.testing.assert_close(y[[0, 1, 3, 4]], layer(x)[[0, 1, 3, 4]], rtol=0, atol=0)
            else:
                assert torch.isnan(y).all() if bad != bad else not torch.isfinite(y).all(), (bad, y)


@pytest.mark.slow
def test_an_int8_model_compiles_with_its_kernels_left_eager(tiny_model):
    """``compile_layers()`` on an int8 model, or ``torch.compile`` of it, ended in an InductorError (Inductor cannot
    lower the kernels' packed weights): the int8 projections now run eagerly between the compiled parts, and the
    outputs are the eager int8 model's within a small part of int8's own rounding (Inductor's float rounding moves a
    few activation codes by one step)."""
    from bertkit.model_checks import require_compiler
    from bertkit.quantization import quantize_int8

    try:
        require_compiler()
    except BertkitError:
        pytest.skip("torch.compile on the CPU needs a C++ compiler")
    torch.manual_seed(0)
    ids = torch.randint(5, 99, (3, 11))
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0
    model = tiny_model().eval()
    int8 = quantize_int8(model, calibration=[{"input_ids": ids, "attention_mask": mask}])
    real = mask.bool()
    with torch.no_grad():
        fp32 = model(ids, mask).last_hidden_state[real]
        # a whole model traced computes the padded rectangle (padding.is_tracing), whose padding rows share the
        # per-call activation ranges: its eager counterpart is the padded layout
        for compiled, layout in ((copy.deepcopy(int8).compile_layers(), "auto"),
                                 (torch.compile(copy.deepcopy(int8)), "padded")):
            want = int8(ids, mask, layout=layout).last_hidden_state[real]
            rounding = float((want - fp32).abs().max())
            got = compiled(ids, mask).last_hidden_state[real]
            assert float((got - want).abs().max()) <= 0.1 * rounding, (float((got - want).abs().max()), rounding)


def test_tracing_an_int8_model_is_refused_naming_the_float_model(tiny_model):
    """torch.jit.trace cannot hold the int8 kernels' packed weights ("Unsupported value kind: Tensor"): refused,
    naming what to trace instead."""
    from bertkit.inference.export import TupleOutputModel
    from bertkit.quantization import quantize_int8

    ids = torch.randint(5, 99, (2, 9))
    mask = torch.ones_like(ids)
    int8 = quantize_int8(tiny_model().eval(), calibration=[{"input_ids": ids, "attention_mask": mask}])
    with torch.no_grad(), pytest.raises(BertkitError, match="int8 model cannot be traced.*the float model"):
        torch.jit.trace(TupleOutputModel(int8), (ids, torch.zeros_like(ids), mask), check_trace=False)


def test_an_int8_layer_refuses_training():
    layer = Int8Linear.from_float(nn.Linear(8, 4), torch.ones(8))
    with pytest.raises(BertkitError, match="inference only"):
        layer.train()
    y = layer(torch.randn(3, 8, requires_grad=True))
    with pytest.raises(BertkitError, match="inference only"):
        y.sum().backward()


def test_an_int8_model_refuses_another_dtype_and_stays_whole(int8, tok):
    """``.half()`` (``.bfloat16()``, ``.double()``) of an int8 model converted its scales and float parts, then its
    next call failed with "Quantize only works on Float Tensor", and ``.float()`` after it gave other outputs (scales
    rounded to float16). Refused by name before anything is converted; the model computes as before."""
    batch = tok(["an int8 model", "keeps its dtype"], padding=True, return_tensors="pt")
    with torch.inference_mode():
        want = int8(**batch).last_hidden_state
    for convert in (torch.nn.Module.half, torch.nn.Module.bfloat16, torch.nn.Module.double):
        with pytest.raises(BertkitError, match=r"int8 model keeps its scales in torch.float32 .*bf16=True"):
            convert(int8)
        assert {t.dtype for t in int8.state_dict().values() if t.is_floating_point()} == {torch.float32}
    with torch.inference_mode():
        assert torch.equal(int8.float()(**batch).last_hidden_state, want)


# this machine's kernel on the same texts is make test's in test_int8_switch.py (the pipeline's int8, the same
# bounds; fbgemm's on an AVX2 machine) and fbgemm's arithmetic is make test's in
# test_a_layer_is_its_formula_and_its_packing_follows_its_integers, so both cases here run in make test-slow
@pytest.mark.slow
@pytest.mark.parametrize("kernel", ["this machine's", "fbgemm (the AVX2 class)"])
def test_embeddings_within_cosine_099_on_stsb_and_sst2(kernel, fp32, int8, calibration, tok, stsb_sentences,
                                                       sst2_sentences, fp32_embeddings, request):
    """Measured on an AVX512-VNNI EPYC, min cosine STS-B / SST-2: oneDNN at 8 bits 0.9981 / 0.9977; fbgemm at 7 bits
    0.9960 / 0.9944 (0.9992 / 0.9978 and 0.9973 / 0.9934 on an AMX Xeon while every ffn_out was float)."""
    model = int8  # quantize_int8(fp32, calibration=calibration) on this machine's kernel
    if kernel.startswith("fbgemm"):
        if not fbgemm_int8():
            pytest.skip("this PyTorch has no fbgemm kernel")
        request.getfixturevalue("on_fbgemm")
        model = quantize_int8(fp32, calibration=calibration)
    for texts, reference in ((stsb_sentences, fp32_embeddings["stsb"]), (sst2_sentences[:200], fp32_embeddings["sst2"])):
        cos = F.cosine_similarity(embed(model, tok, texts), reference)
        assert float(cos.min()) >= 0.99, (float(cos.min()), texts[int(cos.argmin())])
        assert float(cos.mean()) >= 0.995


def test_blank_calibration_texts_are_refused(fp32, tok):
    """Calibrating on blank texts measures [CLS] and [SEP] only, and gave embeddings at cosine 0.70 to fp32's."""
    for texts, index in ((["", "   "], 0), (["a real sentence.", "\u200b \t"], 1), ([("", "")], 0)):
        with pytest.raises(BertkitError, match=rf"calibration text {index} .* holds no word once tokenized"):
            quantize_int8_on_texts(fp32, tok, texts)


@pytest.mark.parametrize("name, content", [("in.jsonl", '{"text": "a cat sat on the mat"}\n'),
                                           ("in.csv", "text,label\na cat sat on the mat,1\n"),
                                           ("dev.tsv", "sentence\tlabel\na cat sat on the mat\t1\n")])
def test_a_calibration_file_of_records_is_refused(tmp_path, name, content):
    """Was: --calibration-file (and calibration_file=) read a JSON lines, CSV or TSV file, as `bertkit predict` takes
    for its input, line by line as sentences: the model was calibrated on '{"text": "a cat sat on the mat"}' and on
    the header 'text,label', braces, quotes and columns measured as text, without a word. Now such a file is refused,
    naming what a calibration file holds."""
    from bertkit.quantization import read_calibration_file

    (tmp_path / name).write_text(content, encoding="utf-8")
    with pytest.raises(BertkitError, match=rf"calibration file {tmp_path / name} is a {name.rsplit('.')[1]} file"
                                           ", whose lines are records .* one sentence per line: write the texts to a "
                                           r"\.txt file"):
        read_calibration_file(tmp_path / name)
    (tmp_path / "in.txt").write_text("a cat sat on the mat\n", encoding="utf-8")
    assert read_calibration_file(tmp_path / "in.txt") == ["a cat sat on the mat"]


def test_a_calibration_file_is_one_sentence_per_line_not_split_at_page_breaks(tmp_path):
    """Was: str.splitlines cut a sentence at a form feed (text from a PDF), U+2028 or U+0085 (NEL), calibrating on
    its pieces (5 texts here); a UTF-8 byte-order mark stayed on the first text."""
    from bertkit.quantization import read_calibration_file

    path = tmp_path / "calib.txt"
    path.write_bytes("\ufeffend of a page\x0cstart of the next\r\nline\u2028separator\n\nnext\x85line\n".encode())
    assert read_calibration_file(path) == ["end of a page\x0cstart of the next", "line\u2028separator",
                                           "next\x85line"]


@pytest.mark.slow  # 200 sentences through MiniLM twice; make test checks int8 labels through predict glue --int8
def test_classifier_argmax_agrees(minilm_dir, calibration, tok, sst2_sentences):
    torch.manual_seed(0)
    model = BertForSequenceClassification.from_pretrained(minilm_dir, num_labels=3).eval()
    q = quantize_int8(model, calibration=calibration)
    assert type(q.classifier) is nn.Linear  # the head stays fp32
    texts = sst2_sentences[:200]
    agree, margins, pooled_cos = [], [], []
    pooled = {}  # each forward's pooler output, as the head received it
    for m in (model, q):
        m.bert.register_forward_hook(lambda module, args, out, m=m: pooled.__setitem__(m, out.pooler_output))
    with torch.inference_mode():
        for a in range(0, len(texts), 32):
            enc = tok(texts[a:a + 32], truncation=True, max_length=128, padding=True, return_tensors="pt")
            args = (enc["input_ids"], enc["attention_mask"], enc["token_type_ids"])
            ref = model(*args).logits
            agree.append(ref.argmax(-1) == q(*args).logits.argmax(-1))
            top2 = ref.topk(2, dim=-1).values
            margins.append(top2[:, 0] - top2[:, 1])
            pooled_cos.append(F.cosine_similarity(pooled[model], pooled[q]))
    assert float(torch.cat(pooled_cos).min()) >= 0.99  # measured 0.9977
    # A random head's logits barely differ between sentences (std 0.01), so many of its decisions are near
    # ties. Measured: 195 / 200 agree, and every disagreement is a
    # sentence whose fp32 top-2 margin is at most a quarter of the median margin. So: overall agreement,
    # and no disagreement where fp32's decision is not a near-tie. A fitted head's agreement is in
    # bench/int8_sensitivity.py (commit 4403231) and the fine-tuned tasks' in RESULTS.md.
    agree, margins = torch.cat(agree), torch.cat(margins)
    assert float(agree.float().mean()) >= 0.9
    clear = margins > 0.5 * margins.median()
    assert bool(agree[clear].all()), margins[clear & ~agree]


@pytest.mark.parametrize("name", slow_after(sorted(set(MODEL_CLASSES) - {"BertModel"}), keep=2))
def test_every_head_runs_quantized(name, minilm_2_layers, data_dir, sst2_sentences):
    # MiniLM's first 2 layers: what is checked is each head's wiring, the same at any depth (MiniLM's 6 layers and
    # its 30,522-piece vocabulary, which the masked-LM head scores, were most of the time)
    cls = MODEL_CLASSES[name]
    torch.manual_seed(0)
    model = cls.from_pretrained(minilm_2_layers).eval()
    tok = BertTokenizer.from_pretrained(minilm_2_layers)
    calibration = calibration_batches(tok, [r["sentence"] for r in _tsv(data_dir / "glue/SST-2/train.tsv")[:64]])
    q = quantize_int8(model, calibration=calibration)
    assert int8_projections(q) and all(not isinstance(m, Int8Linear) for n, m in q.named_modules()
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
    """Both layouts stay within int8's error of fp32 (as test_int8_switch.py bounds it: every text's cosine at least
    0.98, their mean at least 0.995). They differ from each other by more than float rounding: the padded layout's
    per-call activation scale also covers the padding positions."""
    texts = sst2_sentences[:96]
    unpadded, padded = embed(int8, tok, texts), embed(int8, tok, texts, layout="padded")
    reference = embed(fp32, tok, texts)  # these 96 alone: fp32_embeddings' 400 texts are the slow test's
    # measured: padded 0.9970 at least (unpadded 0.9977) on VNNI; fbgemm's 7 bits, AVX2 held on a Xeon: 0.9895
    for layout, got in (("padded", padded), ("unpadded", unpadded)):
        cos = F.cosine_similarity(got, reference)
        assert float(cos.min()) >= 0.98 and float(cos.mean()) >= 0.995, (layout, float(cos.min()), float(cos.mean()))
    assert float(F.cosine_similarity(unpadded, padded).min()) >= 0.98


@pytest.mark.parametrize("kernel", ["this machine's", "fbgemm"])
def test_no_deprecation_warning_reaches_the_caller(kernel, fp32, calibration, request):
    if kernel == "fbgemm":
        if not fbgemm_int8():
            pytest.skip("this PyTorch has no fbgemm kernel")
        request.getfixturevalue("on_fbgemm")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quantize_int8(fp32, calibration=calibration[:1])
    assert not [w for w in caught if "deprecated" in str(w.message)], [str(w.message)[:80] for w in caught]


def test_refuses_models_and_arguments_it_cannot_quantize(fp32, calibration, int8, tiny_model):
    half = tiny_model(vocab_size=fp32.config.vocab_size).to(torch.bfloat16)  # refused by dtype, before any pass
    with pytest.raises(BertkitError, match="bfloat16.*model.float"):
        quantize_int8(half, calibration=calibration)
    with pytest.raises(BertkitError, match="BertModel or head model"):
        quantize_int8(nn.Linear(4, 4), calibration=calibration)
    with pytest.raises(BertkitError, match="quantized already"):
        quantize_int8(int8, calibration=calibration)
    with pytest.raises(BertkitError, match="needs calibration batches"):
        quantize_int8(fp32, calibration=None)
    with pytest.raises(BertkitError, match="no batches"):
        quantize_int8(fp32, calibration=[])


@pytest.mark.parametrize("batch_size", [0, -1, 2.5, True])
def test_calibration_refuses_a_batch_size_that_is_not_a_count(minilm_2_layers, batch_size):
    """Was: range()'s "arg 3 must not be zero" for 0, an IndexError for -1, a TypeError for 2.5, and True ran as 1."""
    tok = BertTokenizer.from_pretrained(minilm_2_layers)
    with pytest.raises(BertkitError, match=rf"batch_size must be a positive int, got {batch_size!r}"):
        calibration_batches(tok, ["a real sentence"], batch_size=batch_size)


@pytest.mark.parametrize(("texts", "max_length"), [(["a real sentence"], 2), ([("a question", "an answer")], 3)])
def test_calibration_refuses_a_max_length_that_leaves_no_word(minilm_2_layers, texts, max_length):
    """Was: "calibration text 0 holds no word once tokenized ... remove blank texts", of a text that is not blank:
    max_length left room for the special tokens only. Three tokens cut a single text to one word, four a pair."""
    tok = BertTokenizer.from_pretrained(minilm_2_layers)
    with pytest.raises(BertkitError, match=rf"max_length {max_length} leaves no room for a word beside the "
                                           rf"{max_length} special tokens; pass max_length {max_length + 1} or more"):
        calibration_batches(tok, texts, max_length=max_length)
    batch = calibration_batches(tok, texts, max_length=max_length + 1)[0]
    assert int(batch["attention_mask"].sum()) == max_length + 1  # one word kept


def test_a_model_prepared_for_inference_is_refused_as_such_not_as_quantized(minilm_2_layers):
    """A pipeline's model (or optimize_for_inference's) holds PreparedLinear projections, its GELU fused into ffn_in:
    quantizing it was refused as "quantized already", which it is not; the fix is the model as loaded."""
    from bertkit import optimize_for_inference, pipeline

    tok = BertTokenizer.from_pretrained(minilm_2_layers)
    fp32 = pipeline("feature-extraction", minilm_2_layers)
    for prepared in (fp32.model, optimize_for_inference(BertModel.from_pretrained(minilm_2_layers))):
        with pytest.raises(BertkitError, match=r"layer 0's qkv is PreparedLinear, a copy prepared for inference "
                                               r"\(a pipeline's \.model, optimize_for_inference\).*from_pretrained"):
            pipeline("feature-extraction", prepared, tokenizer=tok, quantize="int8")


def test_compiling_waits_until_the_eager_passes_have_cost_what_it_costs(monkeypatch):
    """A few tokens never pay for compiling, and neither does a short run: a process compiles once its eager calls
    have quantized COMPILE_AFTER activations, at its next call on COMPILE_FROM of them; ``compile_next`` (a server's
    warm-up) compiles at the next large call whatever ran before. The codes are the eager ones either way."""
    small = kernels._Compiled(kernels.quantize_per_token)
    small(torch.randn(3, 96), torch.rand(96) + 0.5, 255)
    assert small.compiled is None
    calls = []
    monkeypatch.setattr(torch, "compile", lambda fn, dynamic, **_: lambda *args: calls.append(1) or fn(*args))
    monkeypatch.setattr(kernels, "COMPILE_AFTER", 3 * kernels.COMPILE_FROM)
    x, inv = torch.randn(kernels.COMPILE_FROM // 64, 64), torch.rand(64) + 0.5
    run = kernels._Compiled(kernels.quantize_per_token)
    for _ in range(3):
        assert all(torch.equal(a, b) for a, b in zip(run(x, inv, 255), kernels.quantize_per_token(x, inv, 255)))
    assert run.compiled is None and not calls and run.eager_activations == 3 * kernels.COMPILE_FROM
    run(x[:10], inv, 255)  # past the bound, but too few to gain from the compiled pass
    assert run.compiled is None and not calls
    run(x, inv, 255)
    assert run.compiled is not None and calls == [1]
    warm = kernels._Compiled(kernels.quantize_per_token)
    warm.compile_next()
    warm(x, inv, 255)
    assert warm.compiled is not None and calls == [1, 1]


def test_a_servers_warm_up_leaves_the_compile_due_in_its_process():
    """What serve's warm-up leaves behind in this process; the next test checks that it does not find it."""
    kernels.compiled_quantize_per_token.compile_next()
    assert kernels.compiled_quantize_per_token.eager_activations >= kernels.COMPILE_AFTER


def test_the_next_test_finds_the_compile_as_a_new_process_has_it():
    """conftest.py's int8s_compile_is_each_tests_own: the warm-up of the test before (in the same process under
    --dist loadfile) left the compile due; a test that then ran an int8 model on COMPILE_FROM activations paid
    Inductor's compile (13.5 s of test_every_head_runs_quantized[BertForMaskedLM] in one make test)."""
    fused = kernels.compiled_quantize_per_token
    assert (fused.eager_activations, fused.compiled, fused.failed, fused.checked) == (0, None, False, False)


def test_a_failed_compile_quantizes_eagerly_and_says_so_once(monkeypatch, caplog):
    """Where compiling fails (no C++ compiler) the codes are computed eagerly, the same, with one warning."""

    def no_compiler(fn, **kwargs):
        def run(*args):
            raise RuntimeError("InvalidCxxCompiler: no working C++ compiler found")
        return run

    monkeypatch.setattr(torch, "compile", no_compiler)
    x, inv = torch.randn(kernels.COMPILE_FROM // 64 + 1, 64), torch.rand(64) + 0.5
    broken = kernels._Compiled(kernels.quantize_per_token)
    broken.compile_next()
    with caplog.at_level("WARNING", logger="bertkit.quantization.kernels"):
        first, second = broken(x, inv, 255), broken(x, inv, 255)
    want = kernels.quantize_per_token(x, inv, 255)
    assert broken.failed and caplog.text.count("no working C++ compiler") == 1
    assert all(torch.equal(a, b) and torch.equal(b, c) for a, b, c in zip(first, second, want))


def test_a_compiled_quantization_that_disagrees_with_its_eager_definition_is_dropped(monkeypatch, caplog):
    """Inductor's cache has served a kernel built under another ATEN_CPU_CAPABILITY that computed a wrong range:
    the first compiled call is checked against the eager function, and a disagreeing kernel is never used again
    (the eager result is returned, with a warning); one that agrees is kept without further checks."""
    from bertkit.quantization import kernels

    x, inv = torch.randn(kernels.COMPILE_FROM // 64 + 1, 64) * 3 - 1, torch.rand(64) + 0.5

    def stale(fn, dynamic, **_):
        return lambda *args: (lambda q, lo, step: (q // 2, lo * 2, step))(*fn(*args))

    monkeypatch.setattr(torch, "compile", stale)
    fused = kernels._Compiled(kernels.quantize_per_token)
    fused.compile_next()
    with caplog.at_level("WARNING", logger="bertkit.quantization.kernels"):
        got = fused(x, inv, 255)
    expected = kernels.quantize_per_token(x, inv, 255)
    assert all(torch.equal(a, b) for a, b in zip(got, expected)) and fused.failed
    assert "disagreed with its eager definition" in caplog.text
    assert torch.equal(fused(x, inv, 127)[0], kernels.quantize_per_token(x, inv, 127)[0])  # eager from now on

    calls = []
    monkeypatch.setattr(torch, "compile", lambda fn, dynamic, **_: lambda *args: calls.append(1) or fn(*args))
    fused = kernels._Compiled(kernels.quantize_per_token)
    fused.compile_next()
    fused(x, inv, 255), fused(x, inv, 255)
    assert fused.checked and not fused.failed and len(calls) == 2


@pytest.mark.slow  # Inductor's real compile: about 3 s with a warm cache, 10-15 s with a cold one
def test_inductors_compiled_quantization_agrees_with_its_eager_definition_on_this_cpu():
    """The kernel Inductor builds for this CPU (what serve's warm-up and a long run compile) gives the eager codes
    (a rounding tie apart) and ranges, so the check on the first compiled call keeps it."""
    x, inv = torch.randn(kernels.COMPILE_FROM // 64 + 1, 64) * 3 - 1, torch.rand(64) + 0.5
    real = kernels._Compiled(kernels.quantize_per_token)
    real.compile_next()
    got, want = real(x, inv, 255), kernels.quantize_per_token(x, inv, 255)
    assert real.compiled is not None and real.checked and not real.failed
    assert int((got[0].int() - want[0].int()).abs().max()) <= 1
    assert all(torch.allclose(g, w, rtol=1e-5) for g, w in zip(got[1:], want[1:]))


@pytest.mark.parametrize("bf16", [False, True])
def test_the_prepared_int8_model_fuses_gelu_where_onednn_runs_it(int8, tok, sst2_sentences, bf16, monkeypatch):
    """CPU inference's copy of an int8 model (``for_cpu_inference``) has the feed-forward's GELU fused into its int8
    first product where that runs on oneDNN (this machine's kernel says) with fp32 float parts, and apart on fbgemm
    (no post-operation there) and under bf16 (a copy made for fp32 split again); its pooled states are those of the
    same copy without the fusion, and the model passed in is unchanged."""
    from bertkit._hardware import cpu_has_bf16
    from bertkit.inference import prepare

    if bf16 and not cpu_has_bf16():
        pytest.skip("int8 with bf16 needs bf16 instructions")
    prepared = prepare.for_cpu_inference(prepare.for_cpu_inference(int8, False) if bf16 else int8, bf16)
    fused = KERNEL.name == "onednn" and not bf16
    for layer in prepared.encoder.layer:
        assert (layer.intermediate.dense.post_op == ("gelu", "none")) is fused
        assert (type(layer.intermediate.intermediate_act_fn) is nn.Identity) is fused
    assert all(layer.intermediate.dense.activation is None and type(layer.intermediate.intermediate_act_fn) is nn.GELU
               for layer in int8.encoder.layer)
    monkeypatch.setattr(prepare, "_ONEDNN_ACTIVATIONS", {})  # nothing fused
    apart = prepare.for_cpu_inference(int8, bf16)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        ours, ref = embed(prepared, tok, sst2_sentences[:96]), embed(apart, tok, sst2_sentences[:96])
    assert float(F.cosine_similarity(ours, ref).min()) > 0.99999


def test_gelu_fuses_on_onednn_only_and_a_fused_layer_runs_it_anywhere(monkeypatch):
    """``fused_with`` refuses fbgemm's kernel (it has no post-operation); a layer fused on oneDNN and packed for fbgemm
    (a copy unpickled on an AVX2 machine) applies its activation after the product: the same function either way."""
    torch.manual_seed(0)
    linear, smooth, x = nn.Linear(64, 48), torch.rand(64) + 0.5, torch.randn(7, 64)
    monkeypatch.setattr(kernels, "check_int8_kernel", lambda: FBGEMM)
    layer = Int8Linear.from_float(linear, smooth)
    with pytest.raises(ValueError, match="oneDNN's kernel only, this one runs fbgemm"):
        layer.fused_with(nn.GELU(), ("gelu", "none"))
    layer.activation, layer.post_op = nn.GELU(), ("gelu", "none")  # as a oneDNN layer's fused_with leaves it
    with torch.inference_mode():
        torch.testing.assert_close(layer(x), F.gelu(torch.ops.quantized.linear_dynamic(
            x * layer.inv_scale, layer._packed, True)))
    if KERNEL.name == "onednn":
        monkeypatch.setattr(kernels, "check_int8_kernel", lambda: KERNEL)
        plain = Int8Linear.from_float(linear, smooth)
        fused = plain.fused_with(nn.GELU(), ("gelu", "none"))
        assert plain.activation is None and plain.post_op == ("none", "")
        with torch.inference_mode():
            torch.testing.assert_close(fused(x), F.gelu(plain(x)), atol=1e-5, rtol=1e-5)
        assert pickle.loads(pickle.dumps(fused)).post_op == ("gelu", "none")
