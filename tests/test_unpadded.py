"""The unpadded layout computes what the padded rectangle computes: outputs, losses, gradients."""

from __future__ import annotations

import shutil

import pytest
import torch

from bertkit import BertConfig, BertForPreTraining, BertForSequenceClassification, padding

CFG = BertConfig(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
                 max_position_embeddings=32, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
LENGTHS = [9, 4, 13, 6]


def _padded_batch(gen):
    T = max(LENGTHS)
    ids = torch.zeros(len(LENGTHS), T, dtype=torch.long)
    tt = torch.zeros_like(ids)
    mask = torch.zeros_like(ids)
    labels = torch.full_like(ids, -100)
    for i, n in enumerate(LENGTHS):
        ids[i, :n] = torch.randint(5, 120, (n,), generator=gen)
        tt[i, n // 2:n] = 1
        mask[i, :n] = 1
        labels[i, 1:n:3] = ids[i, 1:n:3]
    return ids, tt, mask, labels


@pytest.fixture(params=["one-rectangle", "grouped"])
def grouping(request, monkeypatch):
    """Run a test with attention as one rectangle (these tiny batches' default) and with sequences split
    into length groups (what long ragged batches get), by making extra groups free."""
    if request.param == "grouped":
        monkeypatch.setattr(padding, "_GROUP_OVERHEAD", 0)
    return request.param


def _grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_unpadded_equals_padded_outputs_losses_and_gradients(grouping):
    torch.manual_seed(0)
    model = BertForPreTraining(CFG)
    ids, tt, mask, labels = _padded_batch(torch.Generator().manual_seed(0))
    nsp = torch.tensor([0, 1, 1, 0])
    assert len(padding.TokenLayout.unpadded(mask).attention.groups) == (1 if grouping == "one-rectangle" else 4)
    results = {}
    for layout in ("padded", "unpadded"):
        model.zero_grad()
        model.bert.layout = layout
        out = model(ids, mask, tt, labels=labels, next_sentence_label=nsp, output_hidden_states=True)
        out.loss.backward()
        assert (out.hidden_states[-1][mask.bool()].abs() > 0).all()
        results[layout] = (out, _grads(model))
    (a, ga), (b, gb) = results["padded"], results["unpadded"]
    real = mask.bool()
    for x, y in zip(a.hidden_states, b.hidden_states):
        torch.testing.assert_close(x[real], y[real], atol=1e-5, rtol=0)
    torch.testing.assert_close(a.loss, b.loss, atol=1e-6, rtol=0)
    torch.testing.assert_close(a.prediction_logits, b.prediction_logits, atol=1e-5, rtol=0)
    assert ga.keys() == gb.keys()
    for name in ga:
        torch.testing.assert_close(ga[name], gb[name], atol=1e-5, rtol=1e-4, msg=name)


def _eager_and_compiled() -> tuple[torch.nn.Module, torch.nn.Module]:
    """Two classifiers with the same weights, the second with compile_layers() (compiled lazily, on first call);
    the state_dict names must not change."""
    torch.manual_seed(0)
    eager = BertForSequenceClassification(CFG.with_labels(3))
    compiled = BertForSequenceClassification(CFG.with_labels(3))
    compiled.load_state_dict(eager.state_dict())
    compiled.bert.compile_layers()
    assert list(compiled.state_dict()) == list(eager.state_dict())
    return eager, compiled


def test_compile_layers_keeps_the_state_dict_names():
    """What the slow test below needs before it compiles anything: checkpoints of a compiled model load
    anywhere (compilation itself is lazy, at the first call)."""
    eager, compiled = _eager_and_compiled()
    assert all(torch.equal(a, b) for a, b in zip(compiled.state_dict().values(), eager.state_dict().values()))


@pytest.mark.slow
def test_compiled_layers_match_eager_across_changing_token_counts():
    """compile_layers(): same outputs and gradients as eager, for batches whose real-token count differs
    (the unpadded layout's shapes are dynamic), with the state_dict names unchanged. Slow: Inductor
    compiles forward and backward with the C++ compiler (5 s with a warm cache, minutes with a cold one)."""
    if shutil.which("g++") is None and shutil.which("c++") is None:
        pytest.skip("torch.compile on CPU needs a C++ compiler (g++/c++ not found)")
    eager, compiled = _eager_and_compiled()
    gen = torch.Generator().manual_seed(5)
    for drop in (0, 3):  # a second batch with fewer real tokens: another N, no recompilation needed
        ids, tt, mask, _ = _padded_batch(gen)
        mask[:, max(LENGTHS) - drop:] = 0
        labels = torch.tensor([0, 2, 1, 1])
        outs = []
        for model in (eager, compiled):
            model.zero_grad()
            out = model(ids, token_type_ids=tt, attention_mask=mask, labels=labels)
            out.loss.backward()
            outs.append((out.logits.detach(), _grads(model)))
        torch.testing.assert_close(outs[1][0], outs[0][0], atol=1e-5, rtol=1e-4)
        for name, g in outs[0][1].items():
            torch.testing.assert_close(outs[1][1][name], g, atol=1e-5, rtol=1e-4, msg=name)


def test_question_answering_masks_padding_in_every_layout_and_in_bf16(grouping):
    """Padding never takes span probability: right-padded (unpadded layout), left-padded (falls back to the
    padded layout) and under bf16 autocast; layout="padded" masks the same way and gives the same loss."""
    from bertkit import BertForQuestionAnswering

    torch.manual_seed(0)
    model = BertForQuestionAnswering(CFG).eval()
    ids, tt, mask, _ = _padded_batch(torch.Generator().manual_seed(7))
    starts, ends = torch.tensor([1, 2, 3, 0]), torch.tensor([2, 3, 5, 1])
    left = torch.stack([m.roll(int((m == 0).sum())) for m in mask])  # padding first
    shift = (mask == 0).sum(1)
    for attention_mask, dtype in ((mask, torch.float32), (left, torch.float32), (mask, torch.bfloat16)):
        moved = shift if attention_mask is left else 0  # left padding moves the answers right
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype is torch.bfloat16):
            out = model(ids, token_type_ids=tt, attention_mask=attention_mask, start_positions=starts + moved,
                        end_positions=ends + moved)
        lowest = torch.finfo(out.start_logits.dtype).min
        pad = attention_mask == 0
        assert out.start_logits.dtype == dtype
        assert (out.start_logits[pad] == lowest).all() and (out.end_logits[pad] == lowest).all()
        assert (out.start_logits[~pad] > lowest).all() and torch.isfinite(out.loss)
    # the error names the first position at padding and its example (it named neither)
    row = int(torch.nonzero(left[torch.arange(4), starts] == 0)[0])
    with pytest.raises(ValueError, match=rf"point at padding: start_positions\[{row}\] is {int(starts[row])}, where "
                                         rf"attention_mask\[{row}\] is 0"):
        model(ids, token_type_ids=tt, attention_mask=left, start_positions=starts, end_positions=ends)
    auto = model(ids, token_type_ids=tt, attention_mask=mask, start_positions=starts, end_positions=ends)
    model.bert.layout = "padded"  # a speed setting: the same masked logits and the same loss
    out = model(ids, token_type_ids=tt, attention_mask=mask, start_positions=starts, end_positions=ends)
    assert (out.start_logits[mask == 0] == torch.finfo(out.start_logits.dtype).min).all()
    torch.testing.assert_close(out.loss, auto.loss, atol=1e-5, rtol=1e-5)


def test_length_groups_split_ragged_batches_and_keep_uniform_ones_whole():
    # SQuAD-like lengths: four groups, attention work (sum S_b * T_b^2) well under one 384-wide rectangle.
    lengths = [384, 120, 250, 384, 97, 180, 300, 140, 384, 210, 160, 330, 110, 384, 260, 190]
    groups = padding._split_by_length(lengths)
    assert len(groups) == 4 and sorted(i for g in groups for i in g) == list(range(len(lengths)))
    work = sum(len(g) * max(lengths[i] for i in g) ** 2 for g in groups)
    assert work < 0.75 * len(lengths) * 384**2
    assert padding._split_by_length([30, 31, 29, 30]) == [[0, 1, 2, 3]]  # not worth a second call
    # Groups hold sequences of similar length: every member of an earlier group is no longer than the next's.
    ordered = sorted(groups, key=lambda g: max(lengths[i] for i in g))
    for a, b in zip(ordered, ordered[1:]):
        assert max(lengths[i] for i in a) <= min(lengths[i] for i in b)


def test_attention_rectangles_are_gathered_from_each_sequences_own_tokens():
    """A rectangle's rows past a sequence's end (its padding and the keys rounded up) repeat its last token: finite
    keys that its mask hides, so no buffer is zeroed first; each row of the output buffer goes back to its token."""
    lengths = torch.tensor([3, 1, 5])
    plan = padding._attention_plan(lengths, torch.cumsum(lengths, 0) - lengths, kv_multiple=4)
    (group,) = plan.groups
    assert group.shape == (3, 5) and group.kv_length == 8 and plan.rect_rows == 24 and plan.out_rows == 15
    assert plan.rect_index.tolist() == [0, 1, 2, 2, 2, 2, 2, 2] + [3] * 8 + [4, 5, 6, 7, 8, 8, 8, 8]
    assert group.key_mask.reshape(3, 8).sum(1).tolist() == [3, 1, 5]
    assert plan.gather.tolist() == [0, 1, 2, 5, 10, 11, 12, 13, 14]


@pytest.mark.parametrize("layout", ["unpadded", "padded"])
@pytest.mark.parametrize("multiple", [8, 16])
def test_keys_rounded_up_for_the_cpu_kernel_change_no_output(grouping, layout, multiple):
    """CPU inference (``prepare_model``) pads each attention rectangle's keys with masked keys up to a multiple of
    the CPU kernel's vector (``BertModel.key_multiple``): the same states as without, for ragged batches (length
    groups, one rectangle) and for one unpadded sequence (the padded layout without a mask), queries never padded."""
    torch.manual_seed(0)
    model = BertForSequenceClassification(CFG).eval()
    ids, tt, mask, _ = _padded_batch(torch.Generator().manual_seed(3))
    one = {"input_ids": ids[2:3, :13], "token_type_ids": tt[2:3, :13], "attention_mask": mask[2:3, :13]}
    assert model.bert.key_multiple == 1  # the model as built and trained: its shapes, its dropout masks
    with torch.no_grad():
        exact = model.bert(ids, mask, tt, layout=layout).last_hidden_state
        exact_one = model.bert(**one, layout=layout).last_hidden_state
    model.bert.key_multiple = multiple
    with torch.no_grad():
        if layout == "unpadded":
            groups = padding.TokenLayout.unpadded(mask, key_multiple=multiple).attention.groups
            assert all(g.kv_length % multiple == 0 and g.kv_length >= g.shape[1] for g in groups)
            assert {g.shape[1] for g in groups} <= set(LENGTHS)  # the queries are the real lengths
        rounded = model.bert(ids, mask, tt, layout=layout).last_hidden_state
        rounded_one = model.bert(**one, layout=layout).last_hidden_state
    real = mask.bool()
    torch.testing.assert_close(rounded[real], exact[real], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(rounded_one, exact_one, atol=1e-5, rtol=1e-5)


def test_cpu_inference_rounds_keys_to_the_kernels_vector():
    """``prepare_model``'s copy rounds keys to the vector width of this CPU's attention kernel; the model stays."""
    from bertkit.inference.prepare import cpu_key_multiple, prepare_model

    capability = torch.backends.cpu.get_cpu_capability()
    assert cpu_key_multiple() == (16 if capability.startswith("AVX512") else 8 if capability.startswith("AVX2") else 1)
    model = BertForSequenceClassification(CFG)
    assert prepare_model(model)[0].bert.key_multiple == cpu_key_multiple() and model.bert.key_multiple == 1


def test_auto_layout_rule_on_a_gpu_device():
    """Where ``layout="auto"`` keeps the rectangle on a CUDA device (decided without touching one: the device,
    the weights' dtype, TF32 and the batch's length); never on the CPU. tests/test_cuda.py runs it on a GPU."""
    from bertkit.padding import GPU_UNPAD_MIN_LENGTH, gpu_keeps_rectangle

    cuda, cpu, long, short = torch.device("cuda"), torch.device("cpu"), GPU_UNPAD_MIN_LENGTH, GPU_UNPAD_MIN_LENGTH - 1
    assert not gpu_keeps_rectangle(cpu, torch.float32, short) and not gpu_keeps_rectangle(cpu, torch.bfloat16, 8)
    assert not gpu_keeps_rectangle(cuda, torch.float32, long)
    assert gpu_keeps_rectangle(cuda, torch.float32, short)
    assert gpu_keeps_rectangle(cuda, torch.bfloat16, long) and gpu_keeps_rectangle(cuda, torch.float16, long)
    saved = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = True
        assert gpu_keeps_rectangle(cuda, torch.float32, long)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved


@pytest.mark.parametrize("layout", ["auto", "padded"])
def test_a_layout_worked_out_on_the_host_moves_every_tensor_it_holds(layout):
    """A mask still on the host gives the layout there (no read-back from the device) and ``TokenLayout.to`` then
    moves each tensor it holds, the attention plan's and its groups' masks too; "meta" stands in for a GPU here
    (tests/test_cuda.py runs it on one and counts the waits)."""
    import dataclasses

    mask = (torch.arange(200)[None, :] < torch.tensor([200, 9, 150, 20])[:, None]).long()
    lay = padding.token_layout(layout, mask, 4, 200, torch.float32, torch.device("meta"))

    def tensors(obj):
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            if isinstance(value, torch.Tensor):
                yield f.name, value
            elif dataclasses.is_dataclass(value):
                yield from tensors(value)
            elif isinstance(value, tuple):
                for item in value:
                    if dataclasses.is_dataclass(item):
                        yield from tensors(item)

    held = dict(tensors(lay))
    assert held and all(t.device.type == "meta" for t in held.values()), {k: t.device for k, t in held.items()}
    if layout == "auto":
        assert not lay.is_padded and any(g.key_mask is not None for g in lay.attention.groups)


def test_a_rectangle_with_zero_padding_reads_as_the_unpadded_layout(tiny_model):
    """The rectangle ``layout="auto"`` computes on a GPU (``zero_padding``) returns zeros at padding, as the
    unpadded layout does, and the same states at real tokens; the plain padded layout keeps its numbers there."""
    from bertkit.padding import TokenLayout

    model = tiny_model().eval()
    ids = torch.randint(1, 99, (3, 10))
    mask = torch.ones_like(ids)
    mask[0, 6:] = 0
    mask[2, 3:] = 0
    with torch.no_grad():
        unpadded = model(input_ids=ids, attention_mask=mask, layout="unpadded").last_hidden_state
        rect = model(input_ids=ids, attention_mask=mask, layout="padded")
    zeroed = TokenLayout.padded(mask, (3, 10), zero_padding=True).to_batch(rect.tokens)
    assert (rect.last_hidden_state[~mask.bool()] != 0).all(dim=-1).any()
    torch.testing.assert_close(zeroed, unpadded, atol=1e-5, rtol=0)
    assert (zeroed[~mask.bool()] == 0).all()


def test_the_additive_bias_masks_as_the_boolean_mask_does():
    """``padding.additive_bias`` (what the GPU's training rectangle hands SDPA, made once per pass) gives SDPA's
    result with the boolean mask it replaces, at every real query, and its rows are 16-element aligned (else
    SDPA's GPU kernels copy it to alignment in every layer)."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(3, len(LENGTHS), 4, max(LENGTHS), 8, generator=gen)
    key_mask = (torch.arange(max(LENGTHS))[None, :] < torch.tensor(LENGTHS)[:, None])[:, None, None, :]
    bias = padding.additive_bias(key_mask, torch.float32)
    assert bias.dtype == torch.float32 and bias.stride(0) % 16 == 0 and bias.shape == key_mask.shape
    assert bias[~key_mask].eq(torch.finfo(torch.float32).min).all() and bias[key_mask].eq(0).all()
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=key_mask)
    got = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=0)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # the dtype attention computes in under autocast: none on CPU
        assert padding.additive_bias(key_mask, torch.float32).dtype == torch.float32


def test_the_stacked_qkv_product_equals_the_three_projections_and_wrapped_ones_run_as_modules():
    """``BertSelfAttention.project``: one product over the stacked weights gives the three projections' outputs and
    their gradients; a projection with a hook (as peft's LoRA wraps one) runs as its module, hook included."""
    from bertkit import BertModel

    torch.manual_seed(0)
    attn = BertModel(CFG).encoder.layer[0].attention.self
    x = torch.randn(5, CFG.hidden_size, requires_grad=True)
    fused = attn.project(x)
    (fused * torch.arange(fused.numel()).view_as(fused).sin()).sum().backward()
    grads = [m.weight.grad.clone() for m in (attn.query, attn.key, attn.value)] + [x.grad.clone()]
    for m in (attn.query, attn.key, attn.value):
        m.weight.grad = m.bias.grad = None
    x.grad = None
    three = torch.cat((attn.query(x), attn.key(x), attn.value(x)), -1)
    (three * torch.arange(three.numel()).view_as(three).sin()).sum().backward()
    torch.testing.assert_close(fused, three, atol=1e-6, rtol=0)
    for got, want in zip(grads, [m.weight.grad for m in (attn.query, attn.key, attn.value)] + [x.grad]):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    calls = []
    attn.value.register_forward_hook(lambda module, args, out: calls.append(out.shape) or out * 0)
    hooked = attn.project(x)
    assert calls == [(5, CFG.hidden_size)] and hooked[:, 2 * CFG.hidden_size:].eq(0).all()

