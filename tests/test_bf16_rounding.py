"""A model prepared for bf16 inference on the CPU (``prepare_model``) rounds the unpadded layout's token count N up
to a multiple of ``prepare.BF16_TOKEN_MULTIPLE`` (``BertModel.token_multiple``, so oneDNN builds few GEMM kernels);
the added rows change no real token's output and never leave the model."""

from __future__ import annotations

import csv
import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from bertkit import BertConfig, BertForPreTraining, BertModel, BertTokenizer, padding
from bertkit.errors import BertkitError
from bertkit.inference.prepare import BF16_TOKEN_MULTIPLE, prepare_model

M = BF16_TOKEN_MULTIPLE
CFG = BertConfig(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
                 max_position_embeddings=32, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def _rows_seen(model: BertModel) -> tuple[list[int], SimpleNamespace]:
    """The number of rows each forward hands the first encoder layer (N, or N rounded up). Counted by wrapping the
    layer's forward, not by a hook: a hook on a layer makes the model keep the padded rectangle, as transformers'
    hooks see it (``BertModel._hooked``)."""
    seen: list[int] = []
    layer = model.encoder.layer[0]
    forward = layer.forward

    def counting(x: torch.Tensor, *args, **kwargs):
        seen.append(x.shape[0])
        return forward(x, *args, **kwargs)

    layer.forward = counting
    return seen, SimpleNamespace(remove=lambda: delattr(layer, "forward"))


def _gemm_rows_alone(n: int, rows: int) -> bool:
    """Whether this machine's fp32 GEMM (``F.linear``: MKL's sgemm on x86) gives the first ``n`` rows the same bits
    within ``rows`` rows as alone, at every shape of the model below. MKL's AVX-512 kernels do; its AVX2 kernels (an
    AVX2-only CPU, or MKL_ENABLE_INSTRUCTIONS=AVX2) block the rows by their count, and then the added rows change
    other rows' last bits: the outputs agree within fp32 rounding only."""
    g = torch.Generator().manual_seed(0)
    H, inter, V = CFG.hidden_size, CFG.intermediate_size, CFG.vocab_size
    for out_features, in_features in ((H, H), (inter, H), (H, inter), (V, H)):
        x, w = torch.randn(rows, in_features, generator=g), torch.randn(out_features, in_features, generator=g)
        if not torch.equal(F.linear(x[:n], w), F.linear(x, w)[:n]):
            return False
    return True


def test_round_up_tokens_values_and_empty_input_refused():
    assert M == 64
    rounded = [padding.round_up_tokens(n, M) for n in (1, M - 1, M, M + 1, 2 * M, 5 * M + 3)]
    assert rounded == [M, M, M, 2 * M, 2 * M, 6 * M]
    assert [padding.round_up_tokens(n, 1) for n in (1, 63, 65)] == [1, 63, 65]  # multiple 1: no rounding
    with pytest.raises(ValueError, match="n=0"):
        padding.round_up_tokens(0, M)
    with pytest.raises(BertkitError, match="the sequences are empty"):  # the model refuses them, as without rounding
        BertModel(CFG)(torch.zeros(2, 0, dtype=torch.long))


def test_rounding_only_for_bf16_inference_on_cpu():
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    assert padding.TokenLayout.unpadded(mask).extra_rows == 0
    assert padding.TokenLayout.unpadded(mask, M).extra_rows == M - 5
    model = BertModel(CFG)
    assert model.token_multiple == 1  # the model as built and trained: no rounding
    assert prepare_model(model, bf16=True)[0].token_multiple == M
    assert prepare_model(model, bf16=False)[0].token_multiple == 1
    assert model.token_multiple == 1  # prepare_model rounds in its copy


@pytest.mark.parametrize("grouped", [False, True])
def test_rounding_rows_change_no_output_or_gradient(grouped, monkeypatch):
    """Tiny model, one attention rectangle or one group per sequence: outputs, hidden states and loss equal
    the unrounded computation's bit for bit where the GEMM computes each row alone (``_gemm_rows_alone``; the added
    rows are in no attention group), else within fp32 rounding; so do the gradients up to summation order, and no
    output has the added rows."""
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
        model.bert.token_multiple = multiple
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
    assert len(padding.TokenLayout.unpadded(mask, M).attention.groups) == (4 if grouped else 1)
    exact = {"atol": 0, "rtol": 0} if _gemm_rows_alone(sum(lengths), M) else {"atol": 1e-6, "rtol": 1e-5}
    torch.testing.assert_close(b.loss, a.loss, **exact)
    torch.testing.assert_close(b.prediction_logits, a.prediction_logits, **exact)
    torch.testing.assert_close(b.seq_relationship_logits, a.seq_relationship_logits, **exact)
    for x, y in zip(b.hidden_states, a.hidden_states, strict=True):
        torch.testing.assert_close(x, y, **exact)
    assert ga.keys() == gb.keys()
    # A weight gradient sums over every row, the added ones included (each adds an exact zero): only a GEMM
    # that blocks the longer sum differently could reorder it. Bit-identical on this project's CPU.
    for name in ga:
        torch.testing.assert_close(gb[name], ga[name], atol=1e-7, rtol=1e-6, msg=name)


@pytest.fixture(scope="module")
def minilm_batches(minilm_2_layers, data_dir):
    """MiniLM (its first 2 layers: rounding does not depend on depth) and 200 SST-2 dev sentences in batches of 8,
    in file order."""
    with open(data_dir / "glue/SST-2/dev.tsv", encoding="utf-8") as f:
        texts = [r["sentence"] for r in csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)][:200]
    tok = BertTokenizer.from_pretrained(minilm_2_layers)
    batches = [tok(texts[i:i + 8], padding=True, return_tensors="pt") for i in range(0, len(texts), 8)]
    return BertModel.from_pretrained(minilm_2_layers).eval(), batches


def _encode_all(model, batches, bf16: bool = False):
    seen, handle = _rows_seen(model)
    outs = []
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        for enc in batches:
            o = model(enc["input_ids"], enc["attention_mask"], enc["token_type_ids"])
            outs.append((o.last_hidden_state.float(), o.pooler_output.float()))
    handle.remove()
    return outs, seen


def test_minilm_fp32_rounded_equals_unrounded_and_bounds_the_shapes(minilm_batches):
    model, batches = minilm_batches
    plain, plain_rows = _encode_all(model, batches)
    model.token_multiple = M  # round in fp32 too, to compare the rounded computation with the plain one closely
    try:
        rounded, rounded_rows = _encode_all(model, batches)
    finally:
        model.token_multiple = 1
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


def test_minilm_bf16_prepared_equals_plain_autocast(minilm_batches):
    """The model prepared for bf16 (rows rounded up, weights made bf16 once, reordered for oneDNN where it runs)
    gives the plain model's states under bf16 autocast within bf16 rounding; its copy leaves the model plain."""
    model, batches = minilm_batches
    batches = batches[:4]  # 32 sentences: four shapes, each rounded up
    prepared, precision = prepare_model(model, bf16=True)
    assert precision.bf16
    rounded, rounded_rows = _encode_all(prepared, batches, bf16=True)
    assert all(n % M == 0 for n in rounded_rows)
    plain, plain_rows = _encode_all(model, batches, bf16=True)
    assert plain_rows == [int(enc["attention_mask"].sum()) for enc in batches]
    for (h, p), (h0, p0) in zip(rounded, plain, strict=True):
        assert h.shape == h0.shape
        # bf16 tolerance: a few bf16 ulps (2**-8 relative) at the states' magnitude (up to ~10)
        torch.testing.assert_close(h, h0, atol=5e-2, rtol=1.6e-2)
        torch.testing.assert_close(p, p0, atol=1e-2, rtol=1.6e-2)
    assert type(model.encoder.layer[0].attention.self.query) is torch.nn.Linear and model.token_multiple == 1
