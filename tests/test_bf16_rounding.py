"""Under bf16 on the CPU the unpadded layout rounds its token count N up to a multiple of
``padding.BF16_TOKEN_MULTIPLE`` (so oneDNN builds few GEMM kernels); the added rows change no real token's
output and never leave the model."""

from __future__ import annotations

import csv
import math

import pytest
import torch

from bertkit import BertConfig, BertForPreTraining, BertModel, BertTokenizer, padding
from bertkit.errors import BertkitError

M = padding.BF16_TOKEN_MULTIPLE
CFG = BertConfig(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
                 max_position_embeddings=32, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


@pytest.fixture
def rounding_forced(monkeypatch):
    """Round in fp32 too, to compare the rounded computation with the plain one exactly."""
    monkeypatch.setattr(padding, "token_multiple", lambda device: M)


def _rows_seen(model: BertModel) -> tuple[list[int], torch.utils.hooks.RemovableHandle]:
    """The number of rows each forward hands the first encoder layer (N, or N rounded up)."""
    seen: list[int] = []
    handle = model.encoder.layer[0].register_forward_pre_hook(lambda _, args: seen.append(args[0].shape[0]))
    return seen, handle


def test_round_up_tokens_values_and_empty_input_refused(rounding_forced):
    assert M == 64
    rounded = [padding.round_up_tokens(n, M) for n in (1, M - 1, M, M + 1, 2 * M, 5 * M + 3)]
    assert rounded == [M, M, M, 2 * M, 2 * M, 6 * M]
    assert [padding.round_up_tokens(n, 1) for n in (1, 63, 65)] == [1, 63, 65]  # multiple 1: no rounding
    with pytest.raises(ValueError, match="n=0"):
        padding.round_up_tokens(0, M)
    with pytest.raises(BertkitError, match="the sequences are empty"):  # the model refuses them, as without rounding
        BertModel(CFG)(torch.zeros(2, 0, dtype=torch.long))


def test_rounding_only_under_bf16_autocast_on_cpu():
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    assert padding.token_multiple(torch.device("cpu")) == 1
    assert padding.TokenLayout.unpadded(mask).extra_rows == 0
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert padding.token_multiple(torch.device("cpu")) == M
        assert padding.TokenLayout.unpadded(mask).extra_rows == M - 5
        assert padding.token_multiple(torch.device("meta")) == 1  # not a CPU
    with torch.autocast("cpu", dtype=torch.float16):
        assert padding.token_multiple(torch.device("cpu")) == 1


@pytest.mark.parametrize("grouped", [False, True])
def test_rounding_rows_change_no_output_or_gradient(grouped, monkeypatch):
    """Tiny model, one attention rectangle or one group per sequence: outputs, hidden states and loss equal
    the unrounded computation's bit for bit (per-token layers compute each row alone; the added rows are in no
    attention group), so do the gradients up to summation order, and no output has the added rows."""
    if grouped:
        monkeypatch.setattr(padding, "_GROUP_OVERHEAD", 0)
    torch.manual_seed(0)
    model = BertForPreTraining(CFG)
    gen = torch.Generator().manual_seed(0)
    lengths = [9, 4, 13, 6]
    ids = torch.zeros(4, 13, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, n in enumerate(lengths):
        ids[i, :n] = torch.randint(5, 120, (n,), generator=gen)
        mask[i, :n] = 1
    labels = torch.where(mask.bool(), ids, -100)
    results = {}
    for multiple in (1, M):
        monkeypatch.setattr(padding, "token_multiple", lambda device, m=multiple: m)
        seen, handle = _rows_seen(model.bert)
        model.zero_grad()
        out = model(ids, mask, labels=labels, next_sentence_label=torch.tensor([0, 1, 1, 0]),
                    output_hidden_states=True)
        out.loss.backward()
        handle.remove()
        assert seen == [sum(lengths) if multiple == 1 else M]
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        results[multiple] = (out, grads)
    (a, ga), (b, gb) = results[1], results[M]
    assert len(padding.TokenLayout.unpadded(mask, M).groups) == (4 if grouped else 1)
    torch.testing.assert_close(b.loss, a.loss, atol=0, rtol=0)
    torch.testing.assert_close(b.prediction_logits, a.prediction_logits, atol=0, rtol=0)
    torch.testing.assert_close(b.seq_relationship_logits, a.seq_relationship_logits, atol=0, rtol=0)
    for x, y in zip(b.hidden_states, a.hidden_states, strict=True):
        torch.testing.assert_close(x, y, atol=0, rtol=0)
    assert ga.keys() == gb.keys()
    # A weight gradient sums over every row, the added ones included (each adds an exact zero): only a GEMM
    # that blocks the longer sum differently could reorder it. Bit-identical on this project's CPU.
    for name in ga:
        torch.testing.assert_close(gb[name], ga[name], atol=1e-7, rtol=1e-6, msg=name)


@pytest.fixture(scope="module")
def minilm_batches(minilm_dir, data_dir):
    """MiniLM and 200 SST-2 dev sentences in batches of 8, in file order."""
    with open(data_dir / "glue/SST-2/dev.tsv", encoding="utf-8") as f:
        texts = [r["sentence"] for r in csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)][:200]
    tok = BertTokenizer.from_pretrained(minilm_dir)
    batches = [tok(texts[i:i + 8], padding=True, return_tensors="pt") for i in range(0, len(texts), 8)]
    return BertModel.from_pretrained(minilm_dir).eval(), batches


def _encode_all(model, batches, bf16: bool = False):
    seen, handle = _rows_seen(model)
    outs = []
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        for enc in batches:
            o = model(enc["input_ids"], enc["attention_mask"], enc["token_type_ids"])
            outs.append((o.last_hidden_state.float(), o.pooler_output.float()))
    handle.remove()
    return outs, seen


def test_minilm_fp32_rounded_equals_unrounded_and_bounds_the_shapes(minilm_batches, monkeypatch):
    model, batches = minilm_batches
    plain, plain_rows = _encode_all(model, batches)
    monkeypatch.setattr(padding, "token_multiple", lambda device: M)
    rounded, rounded_rows = _encode_all(model, batches)
    real_tokens = [int(enc["attention_mask"].sum()) for enc in batches]
    assert plain_rows == real_tokens  # fp32 does not round unless forced
    assert rounded_rows == [padding.round_up_tokens(n, M) for n in real_tokens]
    worst = 0.0
    for (h, p), (h0, p0) in zip(rounded, plain, strict=True):
        assert h.shape == h0.shape  # the added rows never leave the model
        torch.testing.assert_close(h, h0, atol=1e-5, rtol=0)
        torch.testing.assert_close(p, p0, atol=1e-5, rtol=0)
        worst = max(worst, (h - h0).abs().max().item(), (p - p0).abs().max().item())
    # 25 batches: nearly one GEMM shape per batch without rounding, a few multiples of M with it
    bound = math.ceil(max(real_tokens) / M)
    assert len(set(rounded_rows)) <= bound < len(set(plain_rows)) / 2
    print(f"distinct N: {len(set(plain_rows))} unrounded, {len(set(rounded_rows))} rounded; max diff {worst:.1e}")


def test_minilm_bf16_rounded_equals_unrounded(minilm_batches, monkeypatch):
    model, batches = minilm_batches
    batches = batches[:8]  # 64 sentences
    rounded, rounded_rows = _encode_all(model, batches, bf16=True)  # rounding is on by itself here
    assert all(n % M == 0 for n in rounded_rows)
    monkeypatch.setattr(padding, "token_multiple", lambda device: 1)
    plain, plain_rows = _encode_all(model, batches, bf16=True)
    assert plain_rows == [int(enc["attention_mask"].sum()) for enc in batches]
    for (h, p), (h0, p0) in zip(rounded, plain, strict=True):
        assert h.shape == h0.shape
        # bf16 tolerance: a few bf16 ulps (2**-8 relative) at the states' magnitude (up to ~10)
        torch.testing.assert_close(h, h0, atol=5e-2, rtol=1.6e-2)
        torch.testing.assert_close(p, p0, atol=1e-2, rtol=1.6e-2)


def test_bf16_inference_casts_the_weights_once_with_bit_identical_outputs(minilm_batches, monkeypatch):
    """In CPU bf16 inference every plain Linear reads bf16 copies of its weights made on its first call
    (``cpu_linear._bf16_copies``, or reordered for oneDNN's Linear, ``_onednn_linear``) instead of autocast's cast
    on every call: the same bits as autocast's own cast, the same copies on the next batch, a new cast after an
    in-place change of the weights, never in the state dict."""
    from bertkit import cpu_linear
    from bertkit._hardware import onednn_bf16_linear

    model, batches = minilm_batches
    batches = batches[:4]
    cached, _ = _encode_all(model, batches, bf16=True)
    layer = model.encoder.layer[2]
    owners = (layer.attention.self, layer.attention.output.dense, layer.intermediate.dense, layer.output.dense)
    # oneDNN's Linear over a bf16 weight reordered once where it runs (cpu_linear._onednn_linear), else bf16 copies
    cache = "_onednn_bfloat16" if onednn_bf16_linear() else "_bf16_copies"
    copies = [owner.__dict__[cache][2][0] for owner in owners]
    assert [c.dtype for c in copies] == [torch.bfloat16] * 4
    assert copies[0].shape == (3 * 384, 384)  # q, k and v: one copy of the fused projection
    again, _ = _encode_all(model, batches, bf16=True)
    assert all(owner.__dict__[cache][2][0] is c for owner, c in zip(owners, copies))  # not cast again
    monkeypatch.setattr(cpu_linear, "_cpu_bf16_inference", lambda x: False)  # autocast casting on every call
    autocast, _ = _encode_all(model, batches, bf16=True)
    for (h, p), (h1, p1), (h0, p0) in zip(cached, again, autocast, strict=True):
        assert torch.equal(h, h0) and torch.equal(p, p0) and torch.equal(h1, h0) and torch.equal(p1, p0)
    monkeypatch.undo()
    assert not any("bf16" in k for k in model.state_dict())

    saved = {k: v.clone() for k, v in model.state_dict().items()}
    try:
        with torch.no_grad():  # in place, as load_state_dict and optimisers change weights
            layer.intermediate.dense.weight.mul_(0.5)
            layer.attention.self.value.bias.add_(0.25)
        changed, _ = _encode_all(model, batches, bf16=True)
        monkeypatch.setattr(cpu_linear, "_cpu_bf16_inference", lambda x: False)
        expected, _ = _encode_all(model, batches, bf16=True)
        monkeypatch.undo()
        for (h, _), (h0, _), (h_old, _) in zip(changed, expected, cached, strict=True):
            assert torch.equal(h, h0) and not torch.equal(h, h_old)
    finally:
        model.load_state_dict(saved)
    restored, _ = _encode_all(model, batches, bf16=True)
    assert all(torch.equal(h, h0) for (h, _), (h0, _) in zip(restored, cached, strict=True))
