"""fp32 inference on oneDNN's Linear (``cpu_linear._onednn_linear``, where ``_hardware.onednn_linear``): the same
states as ATen's ``addmm`` within fp32 rounding for every activation, weights reordered once and again after any
change to the parameters, models that still deep-copy and pickle, training untouched, and the off switch."""

from __future__ import annotations

import copy
import io
import os
import subprocess
import sys
from contextlib import contextmanager, nullcontext
from unittest.mock import patch

import pytest
import torch

from bertkit import BertModel
from bertkit._hardware import onednn_linear

pytestmark = pytest.mark.skipif(not onednn_linear(), reason="oneDNN's fp32 Linear is not used on this machine "
                                "(not x86, a build without oneDNN, or BERTKIT_ONEDNN_LINEAR=0)")


def _inputs():
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(1, 99, (3, 17), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 9:] = 0
    mask[2, 4:] = 0
    return ids, mask


def _aten(model, **kw):
    with patch("bertkit.cpu_linear.onednn_linear", lambda: False):
        return model(**kw).last_hidden_state


@pytest.mark.parametrize("act", ["gelu", "gelu_new", "relu"])
@pytest.mark.parametrize("layout", ["auto", "padded"])
def test_onednn_matches_aten_and_reorders_once(tiny_model, act, layout):
    model = tiny_model(hidden_act=act).eval()
    ids, mask = _inputs()
    real = mask.bool()
    with torch.no_grad():
        ours = model(input_ids=ids, attention_mask=mask, layout=layout).last_hidden_state
        ref = _aten(model, input_ids=ids, attention_mask=mask, layout=layout)
        dense = model.encoder.layer[0].intermediate.dense
        packed = dense.__dict__["_onednn_float32"][2][0]
        assert packed.layout == torch._mkldnn  # the path ran, on a reordered weight
        model(input_ids=ids, attention_mask=mask, layout=layout)
        assert dense.__dict__["_onednn_float32"][2][0] is packed  # not reordered again
    torch.testing.assert_close(ours[real], ref[real], atol=1e-5, rtol=0)


def test_a_changed_parameter_is_reordered_again(tiny_model):
    """load_state_dict and in-place edits (the q/k/v views included) reach the next call, as with autograd off
    the reordered weight is only a cache."""
    model = tiny_model().eval()
    other = tiny_model(seed=5).eval()
    ids, mask = _inputs()
    with torch.no_grad():
        model(input_ids=ids, attention_mask=mask)
        model.load_state_dict(other.state_dict())
        torch.testing.assert_close(model(input_ids=ids, attention_mask=mask).last_hidden_state,
                                   _aten(other, input_ids=ids, attention_mask=mask), atol=1e-5, rtol=0)
        model.encoder.layer[1].attention.self.value.weight.mul_(2)
        model.encoder.layer[0].output.dense.bias.add_(0.5)
        changed = model(input_ids=ids, attention_mask=mask).last_hidden_state
    torch.testing.assert_close(changed, _aten(model, input_ids=ids, attention_mask=mask), atol=1e-5, rtol=0)


def test_models_deep_copy_and_pickle_after_inference(minilm_dir):
    """A reordered weight is an opaque tensor that neither deepcopy nor pickle can copy: both leave it out, and the
    copy computes the same states (quantize_int8 deep-copies a model that calibration ran)."""
    model = BertModel.from_pretrained(minilm_dir).eval()
    ids, mask = _inputs()
    with torch.no_grad():
        want = model(input_ids=ids + 1000, attention_mask=mask).last_hidden_state
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    for copied in (copy.deepcopy(model), torch.load(buffer, weights_only=False)):
        with torch.no_grad():
            assert torch.equal(copied(input_ids=ids + 1000, attention_mask=mask).last_hidden_state, want)


def test_training_and_autocast_do_not_take_the_fp32_path(tiny_model):
    model = tiny_model()
    ids, mask = _inputs()
    model(input_ids=ids, attention_mask=mask).last_hidden_state.sum().backward()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        model(input_ids=ids, attention_mask=mask)
    assert all("_onednn_float32" not in m.__dict__ for m in model.modules())


def test_the_off_switch():
    code = "from bertkit._hardware import onednn_linear; print(onednn_linear())"
    for value, want in (("0", "False"), ("1", "True")):
        out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "BERTKIT_ONEDNN_LINEAR": value},
                             capture_output=True, text=True, check=True).stdout.strip()
        assert out == want


def _probe_answers() -> list[bool]:
    """Every probe's answer computed afresh (``__wrapped__``: past the process-wide cache, through the context pin)."""
    from bertkit._hardware import onednn_int8_exact

    calls = ((onednn_linear, ()), (onednn_int8_exact, (127,)), (onednn_int8_exact, (63,)))
    return [probe.__wrapped__(*args) for probe, args in calls]


@contextmanager
def _default_dtype(dtype: torch.dtype):
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
        assert torch.get_default_dtype() == dtype  # the caller's setting is left as it was
    finally:
        torch.set_default_dtype(before)


@contextmanager
def _default_device(device: str):
    torch.set_default_device(device)
    try:
        yield
    finally:
        torch.set_default_device(None)


@pytest.mark.parametrize("context", ["bf16 autocast", "float64 default", "meta default device"])
def test_the_probes_answer_the_same_in_the_callers_context(context):
    """The probes run once, from whichever call comes first, in its context: a first forward pass under bf16
    autocast made ``onednn_linear``'s fp32 reference a bf16 product and failed with a dtype error; a caller's
    ``torch.set_default_dtype(torch.float64)`` made the probes' tensors float64, so oneDNN's Linear looked unusable
    and int8 was refused as not exact on a CPU where it is; a default device other than the CPU (meta here, as
    ``set_default_device("cuda")`` would) likewise."""
    from bertkit._hardware import onednn_int8_exact

    want = _probe_answers()
    assert want[0] is True
    enter = {"bf16 autocast": lambda: torch.autocast("cpu", dtype=torch.bfloat16),
             "float64 default": lambda: _default_dtype(torch.float64),
             "meta default device": lambda: _default_device("meta")}[context]
    with enter():
        assert _probe_answers() == want
    assert onednn_int8_exact.__wrapped__(levels=127) == want[1]  # keywords pass through


def test_a_fresh_process_whose_first_pass_is_bf16(tiny_checkpoint, tmp_path):
    """The end-to-end form of the probe bug above: ``bertkit predict --bf16`` (any first pass under bf16 autocast in
    a new process) failed with a dtype error. Here a new interpreter's first pass is a bf16 pipeline's."""
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "short", "sentence", "and", "another", "one", "here"]
    directory = tiny_checkpoint(tmp_path / "tiny", "BertForSequenceClassification", tokenizer=vocab, labels=["a", "b"])
    code = ("import sys; from bertkit import pipeline; "
            "p = pipeline('text-classification', sys.argv[1], bf16=True, progress=False); "
            "print(p(['a short sentence', 'and another one here'])[0]['label'])")
    out = subprocess.run([sys.executable, "-c", code, str(directory)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() in ("a", "b")


@pytest.mark.parametrize("bf16", [False, True])
def test_an_optimizer_step_between_evaluations_is_seen(tiny_model, bf16):
    """Evaluation, training steps with the fused AdamW (bertkit's and transformers' Trainer's default: it updates
    parameters in place without bumping their versions), evaluation again: the second evaluation reads the
    trained weights, in fp32 (reordered for oneDNN) and in bf16 (cast or reordered), as ATen / autocast would."""
    model = tiny_model(labels=2, head="BertForSequenceClassification")
    ids, mask = _inputs()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05, fused=True)

    def evaluate(reference: bool = False) -> torch.Tensor:
        model.eval()
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16), \
                patch("bertkit.cpu_linear._cpu_bf16_inference", lambda x: False) if reference else nullcontext(), \
                patch("bertkit.cpu_linear.onednn_linear", lambda: False) if reference else nullcontext():
            out = model(input_ids=ids, attention_mask=mask).logits
        model.train()
        return out

    before = evaluate()
    for _ in range(3):
        model(input_ids=ids, attention_mask=mask, labels=torch.tensor([0, 1, 1])).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    after = evaluate()
    assert not torch.allclose(after, before, atol=1e-3)
    torch.testing.assert_close(after, evaluate(reference=True), atol=1e-5 if not bf16 else 0, rtol=0)
