"""CPU inference's transform (``bertkit.inference.prepare``): ``prepare_model`` runs a copy of the model whose encoder
projections are ``PreparedLinear`` modules (oneDNN's Linear over weights reordered once where
``_hardware.onednn_linear``, bf16 weights made once), q/k/v one GEMM, attention's keys rounded up. It computes the
plain model's states within fp32 rounding (bf16: within bf16 rounding), leaves the model passed in plain, and the
probes answer alike whatever context calls them first."""

from __future__ import annotations

import copy
import io
import subprocess
import sys
from contextlib import contextmanager
from unittest.mock import patch

import pytest
import torch
from torch import nn

from bertkit import BertModel
from bertkit._hardware import cpu_has_bf16, onednn_linear
from bertkit.errors import BertkitError
from bertkit.inference import prepare
from bertkit.inference.prepare import PreparedLinear, cpu_key_multiple, prepare_model


def _inputs():
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(1, 99, (3, 17), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 9:] = 0
    mask[2, 4:] = 0
    return ids, mask


@pytest.mark.parametrize("act", ["gelu", "gelu_new", "relu"])
@pytest.mark.parametrize("layout", ["auto", "padded"])
def test_prepared_model_matches_the_plain_one(tiny_model, act, layout):
    model = tiny_model(hidden_act=act).eval()
    ids, mask = _inputs()
    real = mask.bool()
    prepared, precision = prepare_model(model)
    assert precision.dtype == "float32"
    layer = prepared.encoder.layer[0]
    assert layer.attention.self.query is None and isinstance(layer.attention.self.qkv, PreparedLinear)
    assert all(type(m) is PreparedLinear for m in (layer.attention.output.dense, layer.intermediate.dense,
                                                   layer.output.dense))
    assert prepared.key_multiple == cpu_key_multiple() and prepared.token_multiple == 1
    if onednn_linear():
        assert layer.intermediate.dense.weight.layout == torch._mkldnn  # reordered once, for oneDNN
        assert type(layer.intermediate.intermediate_act_fn) is nn.Identity  # fused into the product
    # the model passed in stays what training, peft and hooks see
    assert type(model.encoder.layer[0].attention.self.query) is nn.Linear and model.key_multiple == 1
    assert not any(isinstance(m, PreparedLinear) for m in model.modules())
    with torch.no_grad():
        ours = prepared(input_ids=ids, attention_mask=mask, layout=layout).last_hidden_state
        ref = model(input_ids=ids, attention_mask=mask, layout=layout).last_hidden_state
    torch.testing.assert_close(ours[real], ref[real], atol=1e-5, rtol=0)


def test_optimize_for_inference_is_the_copy_pipelines_run(tiny_model, tmp_path):
    """``bertkit.optimize_for_inference``, the one public call for the inference copy: what a pipeline runs (the
    same module types and the same outputs, bit for bit), the plain model's outputs within fp32 rounding, the model
    passed in left plain; an int8 model stays int8; anything but a model is refused."""
    import bertkit
    from bertkit.heads import BertForSequenceClassification
    from bertkit.quantization import Int8Linear, quantize_int8

    model = tiny_model().eval()
    ids, mask = _inputs()
    real = mask.bool()
    fast = bertkit.optimize_for_inference(model)
    assert isinstance(fast, BertModel) and fast is not model and not fast.training
    from_pipeline, _ = prepare_model(model)  # what every pipeline, predict and serve run
    assert [type(m) for m in fast.modules()] == [type(m) for m in from_pipeline.modules()]
    assert isinstance(fast.encoder.layer[0].attention.self.qkv, PreparedLinear)
    assert not any(isinstance(m, PreparedLinear) for m in model.modules())
    with torch.no_grad():
        ours = fast(input_ids=ids, attention_mask=mask).last_hidden_state
        assert torch.equal(ours, from_pipeline(input_ids=ids, attention_mask=mask).last_hidden_state)
        torch.testing.assert_close(ours[real], model(input_ids=ids, attention_mask=mask).last_hidden_state[real],
                                   atol=1e-5, rtol=0)
    head = BertForSequenceClassification(model.config).eval()
    with torch.no_grad():
        torch.testing.assert_close(bertkit.optimize_for_inference(head)(ids, mask).logits, head(ids, mask).logits,
                                   atol=1e-5, rtol=0)
    int8 = quantize_int8(model, calibration=[{"input_ids": ids, "attention_mask": mask}])
    fast8 = bertkit.optimize_for_inference(int8)
    assert sum(isinstance(m, Int8Linear) for m in fast8.modules()) == 4 * model.config.num_hidden_layers
    with pytest.raises(bertkit.errors.BertkitError, match="takes a loaded model .*got str"):
        bertkit.optimize_for_inference("models/minilm")


def test_the_public_fallback_where_onednn_does_not_run(tiny_model):
    """Without oneDNN's Linear (a build without it, a non-x86 CPU: the probe says no) the prepared projections run
    ``F.linear``, nothing is fused, and the states are the plain model's."""
    model = tiny_model().eval()
    ids, mask = _inputs()
    with patch.object(prepare, "onednn_linear", lambda: False):
        prepared, _ = prepare_model(model)
    layer = prepared.encoder.layer[1]
    assert not layer.intermediate.dense.onednn and type(layer.intermediate.intermediate_act_fn) is nn.GELU
    with torch.no_grad():
        torch.testing.assert_close(prepared(input_ids=ids, attention_mask=mask).last_hidden_state,
                                   model(input_ids=ids, attention_mask=mask).last_hidden_state, atol=1e-5, rtol=0)


@pytest.mark.parametrize("onednn", [True, False])
def test_bf16_prepared_linear_is_autocasts_linear(onednn):
    """In bf16 a ``PreparedLinear`` computes autocast's bf16 product of the fp32 module: bit for bit over bf16
    copies (``F.linear``, as autocast runs it), within bf16 rounding on oneDNN's reordered weight (its kernel may
    block the sum differently from ``addmm``: at K=1,536 the bits differ on a Sapphire Rapids core)."""
    if onednn and not (onednn_linear() and cpu_has_bf16()):
        pytest.skip("oneDNN's bf16 Linear does not run here (no bf16 instructions, or no oneDNN)")
    torch.manual_seed(0)
    for k, n in ((384, 1152), (1536, 384)):
        linear = nn.Linear(k, n)
        with patch.object(prepare, "onednn_linear", lambda: onednn):
            prepared = PreparedLinear(linear.weight, linear.bias, torch.bfloat16)
        x = torch.randn(70, k)
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            ours, want = prepared(x), linear(x)
        assert ours.dtype == want.dtype == torch.bfloat16 and prepared.onednn is onednn
        if onednn:
            torch.testing.assert_close(ours.float(), want.float(), atol=2**-7, rtol=2**-7)  # one bf16 ulp
        else:
            assert torch.equal(ours, want)


def test_a_prepared_model_is_a_snapshot_and_the_model_still_copies(minilm_dir):
    """The prepared copy keeps the weights it was made from (prepare again after a change); the model passed in
    deep-copies and pickles as before, and its copies compute what it does."""
    model = BertModel.from_pretrained(minilm_dir).eval()
    ids, mask = _inputs()
    prepared, _ = prepare_model(model)
    with torch.no_grad():
        want = model(input_ids=ids + 1000, attention_mask=mask).last_hidden_state
        before = prepared(input_ids=ids + 1000, attention_mask=mask).last_hidden_state
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    for copied in (copy.deepcopy(model), torch.load(buffer, weights_only=False)):
        with torch.no_grad():
            assert torch.equal(copied(input_ids=ids + 1000, attention_mask=mask).last_hidden_state, want)
    with torch.no_grad():
        model.encoder.layer[0].output.dense.weight.mul_(2)
        assert torch.equal(prepared(input_ids=ids + 1000, attention_mask=mask).last_hidden_state, before)
        again, _ = prepare_model(model)
        torch.testing.assert_close(again(input_ids=ids + 1000, attention_mask=mask).last_hidden_state,
                                   model(input_ids=ids + 1000, attention_mask=mask).last_hidden_state, atol=1e-5,
                                   rtol=0)


def test_a_prepared_model_prepares_again_for_the_other_precision(tiny_model):
    """A pipeline's model given to another pipeline: prepared for bf16, then for fp32 (and back), it computes what
    a model prepared once for that precision does, from the float32 weights it was made from; a model prepared for
    the asked precision is returned as it is, and a prepared model deep-copies."""
    model = tiny_model().eval()
    ids, mask = _inputs()
    fp32, _ = prepare_model(model)
    bf16, _ = prepare_model(model, bf16=True)
    again, _ = prepare_model(bf16, bf16=False)
    assert prepare_model(again)[0] is again and again.token_multiple == 1 and bf16.token_multiple > 1
    layer = again.encoder.layer[0]
    assert layer.attention.self.qkv.dtype == torch.float32 and layer.intermediate.dense.dtype == torch.float32
    assert type(bf16.encoder.layer[0].intermediate.intermediate_act_fn) is nn.GELU  # bf16 fuses none
    with torch.no_grad():
        want = fp32(input_ids=ids, attention_mask=mask).last_hidden_state
        assert torch.equal(again(input_ids=ids, attention_mask=mask).last_hidden_state, want)
        assert torch.equal(copy.deepcopy(again)(input_ids=ids, attention_mask=mask).last_hidden_state, want)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            back = prepare_model(again, bf16=True)[0](input_ids=ids, attention_mask=mask).last_hidden_state
            assert torch.equal(back, bf16(input_ids=ids, attention_mask=mask).last_hidden_state)


def test_the_inference_copy_and_a_pipeline_pickle(tmp_path, tiny_model, tiny_checkpoint):
    """Was: pickling the inference copy (``torch.save(model)`` of ``optimize_for_inference``'s model, a pipeline sent to
    a worker process) failed with PyTorch's NotImplementedError "Cannot access storage of OpaqueTensorImpl" (the
    oneDNN-reordered weights), where its deep copy and an int8 pipeline pickled. It now pickles as it deep-copies:
    from the float32 weights it was made from, prepared again where it is loaded, computing the same numbers."""
    import pickle

    import bertkit

    model = tiny_model().eval()
    ids, mask = _inputs()
    for bf16 in (False, True):
        prepared, _ = prepare_model(model, bf16=bf16)
        buffer = io.BytesIO()
        torch.save(prepared, buffer)
        buffer.seek(0)
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            want = prepared(input_ids=ids, attention_mask=mask).last_hidden_state
            for copied in (pickle.loads(pickle.dumps(prepared)), torch.load(buffer, weights_only=False)):
                assert torch.equal(copied(input_ids=ids, attention_mask=mask).last_hidden_state, want), bf16
                assert {m.dtype for m in copied.modules() if isinstance(m, PreparedLinear)} == {
                    torch.bfloat16 if bf16 else torch.float32}
    with pytest.raises(BertkitError, match="for inference only"):
        pickle.loads(pickle.dumps(prepared)).train()
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "good", "film", "bad"]
    clf = bertkit.pipeline("text-classification", tiny_checkpoint(tmp_path / "clf", "BertForSequenceClassification",
                                                                   tokenizer=words, labels=2, num_attention_heads=2))
    assert pickle.loads(pickle.dumps(clf))(["a good film", "bad"]) == clf(["a good film", "bad"])


def test_hooked_and_wrapped_projections_stay_modules(tiny_model):
    """A projection with a hook of its own (or any module that is not a plain ``nn.Linear``: peft's wrappers) is
    left as it is, and is called as a module; q/k/v stay three modules then."""
    model = tiny_model().eval()
    seen = []
    model.encoder.layer[1].attention.self.value.register_forward_hook(lambda m, i, o: seen.append(o.shape))
    prepared, _ = prepare_model(model)
    attn = prepared.encoder.layer[1].attention.self
    assert attn.qkv is None and type(attn.value) is nn.Linear
    assert isinstance(prepared.encoder.layer[0].attention.self.qkv, PreparedLinear)
    ids, mask = _inputs()
    with torch.no_grad():
        torch.testing.assert_close(prepared(input_ids=ids, attention_mask=mask).last_hidden_state,
                                   model(input_ids=ids, attention_mask=mask).last_hidden_state, atol=1e-5, rtol=0)
    assert len(seen) == 2


def test_the_copy_is_for_inference_only_and_leaves_the_models_mode(tiny_model):
    """The copy runs with gradients on as under ``torch.no_grad``, but a backward pass through it and its ``.train()``
    are refused, naming the model to train, as an int8 model's are: oneDNN's Linear has no backward, so a backward
    through the copy ran, its projections got no gradient and the embeddings' gradients were wrong (off by 7.9 on
    MiniLM's embedding LayerNorm). The model passed in keeps its mode: one being trained stays in train mode (it was
    switched to eval, so training went on without dropout)."""
    from bertkit.errors import BertkitError

    model = tiny_model().train()
    ids, mask = _inputs()
    real = mask.bool()
    fast = prepare_model(model)[0]
    assert model.training and not fast.training
    out = fast(input_ids=ids, attention_mask=mask).last_hidden_state
    with torch.no_grad():
        torch.testing.assert_close(out[real], model.eval()(input_ids=ids, attention_mask=mask).last_hidden_state[real],
                                   atol=1e-5, rtol=0)
    with pytest.raises(BertkitError, match="inference copy .*for inference only.*the model it was made from"):
        out.sum().backward()
    embeds = model.embeddings.word_embeddings(ids).detach().requires_grad_()  # a saliency map's input
    with pytest.raises(BertkitError, match="for inference only"):
        fast(inputs_embeds=embeds, attention_mask=mask).pooler_output.sum().backward()
    with pytest.raises(BertkitError, match="for inference only"):
        fast.train()


@pytest.mark.parametrize("kind", ["inference copy", "int8"])
@pytest.mark.parametrize("head", ["BertModel", "BertForSequenceClassification"])
def test_a_refused_train_leaves_every_module_in_eval_mode(tiny_model, kind, head):
    """``.train()`` on the inference copy or an int8 model is refused before any module is switched: nn.Module's
    ``train`` switches them one by one, and the refusal came at the first prepared projection, after the embeddings
    (and their dropout) were in training mode, so every later call of the copy ran dropout (MiniLM's states 1.28 off,
    a different answer on each call)."""
    from bertkit._hardware import int8_kernel
    from bertkit.quantization import quantize_int8

    model = tiny_model(head, hidden_dropout_prob=0.5, attention_probs_dropout_prob=0.5).eval()
    ids, mask = _inputs()
    if kind == "int8":
        if int8_kernel() is None:
            pytest.skip("no int8 kernel on this machine")
        ready = quantize_int8(model, calibration=[{"input_ids": ids, "attention_mask": mask}])
    else:
        ready = prepare_model(model)[0]
    with torch.no_grad():
        before = ready(input_ids=ids, attention_mask=mask)[0]
        with pytest.raises(BertkitError, match="for inference only"):
            ready.train()
        assert [name for name, m in ready.named_modules() if m.training] == []
        assert torch.equal(ready(input_ids=ids, attention_mask=mask)[0], before)
        ready.train(False)  # eval is allowed
        assert torch.equal(ready(input_ids=ids, attention_mask=mask)[0], before)


def test_the_copy_traces_to_the_plain_models_outputs(tiny_model):
    """``torch.jit.trace`` of the inference copy (through ``TupleOutputModel``, as ONNX export traces) gives a graph
    computing the plain model's outputs on other shapes: it failed with "Unsupported value kind: Tensor", the
    reordered weight being an opaque tensor a trace cannot hold; traced, a projection is ``F.linear``."""
    from bertkit.inference.export import TupleOutputModel

    model = tiny_model().eval()
    ids, mask = _inputs()
    types = torch.zeros_like(ids)
    with torch.no_grad():
        graph = torch.jit.trace(TupleOutputModel(prepare_model(model)[0]).eval(), (ids[:2, :9], types[:2, :9],
                                                                                     mask[:2, :9]), check_trace=False)
        got, want = graph(ids, types, mask), model(ids, mask, types)
    real = mask.bool()
    torch.testing.assert_close(got[0][real], want.last_hidden_state[real], atol=1e-5, rtol=0)
    torch.testing.assert_close(got[1], want.pooler_output, atol=1e-5, rtol=0)


@pytest.mark.slow
@pytest.mark.parametrize("how", ["compile_layers", "torch.compile"])
def test_the_copy_compiles_to_the_plain_models_outputs(tiny_model, how):
    """``compile_layers()`` on the inference copy, or ``torch.compile`` of it, computes what the plain model does:
    Inductor cannot lower oneDNN's reordered weight (an opaque tensor) and failed with a LoweringException, so under
    torch.compile a prepared projection is ``F.linear`` over the float32 weights it was made from."""
    from bertkit.model_checks import require_compiler

    try:
        require_compiler()
    except BertkitError:
        pytest.skip("torch.compile on the CPU needs a C++ compiler")
    model = tiny_model().eval()
    ids, mask = _inputs()
    real = mask.bool()
    fast = prepare_model(model)[0]
    fast = fast.compile_layers() if how == "compile_layers" else torch.compile(fast)
    with torch.no_grad():
        want = model(input_ids=ids, attention_mask=mask)
        got = fast(input_ids=ids, attention_mask=mask)
    torch.testing.assert_close(got.last_hidden_state[real], want.last_hidden_state[real], atol=1e-5, rtol=0)
    torch.testing.assert_close(got.pooler_output, want.pooler_output, atol=1e-5, rtol=0)


def test_the_copy_is_refused_by_save_pretrained_naming_the_model_to_save(tiny_model, tmp_path):
    """The copy's projections are prepared weights outside its state dict: ``save_pretrained`` refuses it, before
    writing anything, naming what to save (it named int8 as the cause, and save_int8 as the fix)."""
    from bertkit.errors import BertkitError
    from bertkit.heads import BertForSequenceClassification

    model = BertForSequenceClassification(tiny_model().config)
    with pytest.raises(BertkitError, match="inference copy .*save the model it was made from"):
        prepare_model(model)[0].save_pretrained(tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_the_copy_refuses_another_dtype_naming_the_fix(tiny_model):
    """The prepared weights are no parameters ``.to()`` could convert: ``.double()`` ran the copy's projections in
    fp32 under float64 LayerNorms (1.8e-6 from the float64 model on MiniLM, not 1e-15) and ``.half()`` failed in the
    first LayerNorm with "mixed dtype". Both are refused by name, before anything is converted (the embeddings were
    float16 after the error and the outputs 7e-4 off); a conversion that changes nothing runs."""
    from bertkit.errors import BertkitError

    model = tiny_model().eval()
    ids, mask = _inputs()
    fast = prepare_model(model)[0]
    with torch.no_grad():
        want = fast(input_ids=ids, attention_mask=mask).last_hidden_state
        assert torch.equal(fast.float().to("cpu")(input_ids=ids, attention_mask=mask).last_hidden_state, want)
    for convert, dtype in ((lambda m: m.double(), "torch.float64"), (lambda m: m.half(), "torch.float16"),
                           (lambda m: m.to(torch.bfloat16), "torch.bfloat16")):
        with pytest.raises(BertkitError, match=f"prepared from torch.float32 weights .*not {dtype}.*prepare that"):
            convert(fast)
        assert {p.dtype for p in fast.parameters()} == {torch.float32}
        with torch.no_grad():
            assert torch.equal(fast(input_ids=ids, attention_mask=mask).last_hidden_state, want)


def test_a_model_of_another_dtype_runs_as_it_is_and_says_so(tiny_model):
    """A float64, float16 or bfloat16 model has no fp32 encoder to prepare: it runs as it is (the plain model's
    outputs bit for bit), and its precision record names its dtype (it said float32). bf16 autocast casts only
    float32 weights: a float64 model asked for bf16 ran in float64 under a record saying bfloat16, so it is refused
    as float16 is (which fails inside the first layer); bfloat16 weights run in bf16, as asked."""
    from bertkit.errors import BertkitError

    ids, mask = _inputs()
    for dtype in (torch.float64, torch.float16, torch.bfloat16):
        model = tiny_model().to(dtype).eval()
        prepared, precision = prepare_model(model)
        assert prepared is model and precision.dtype == str(dtype).removeprefix("torch.")
        with torch.no_grad():
            assert torch.equal(prepared(ids, mask).last_hidden_state, model(ids, mask).last_hidden_state)
        if dtype == torch.bfloat16:
            assert prepare_model(model, bf16=True)[1].dtype == "bfloat16"
        else:
            with pytest.raises(BertkitError, match=f"holds {precision.dtype} weights.*model.float()"):
                prepare_model(model, bf16=True)


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
    assert want[0] is onednn_linear()
    enter = {"bf16 autocast": lambda: torch.autocast("cpu", dtype=torch.bfloat16),
             "float64 default": lambda: _default_dtype(torch.float64),
             "meta default device": lambda: _default_device("meta")}[context]
    with enter():
        assert _probe_answers() == want
    assert onednn_int8_exact.__wrapped__(levels=127) == want[1]  # keywords pass through


@pytest.mark.slow  # a process of its own (2.4 s); make test keeps test_the_probes_answer_the_same_in_the_callers_context
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


def test_a_pipeline_made_from_a_directory_prepares_the_model_it_loaded_without_a_copy(tiny_checkpoint, monkeypatch,
                                                                                       tmp_path):
    """A pipeline made from a directory holds the only reference to the model it loads, so it prepares that one in
    place: copying it cost MiniLM's pipeline 60 ms and 60 MB at its peak. A model passed in is copied and left as it
    is, unless the caller asks for ``prepare_in_place``; the outputs are the same either way."""
    import bertkit

    copies = []
    real = prepare.copy_model
    monkeypatch.setattr(prepare, "copy_model", lambda m: copies.append(m) or real(m))
    path = tiny_checkpoint(tmp_path / "tiny", tokenizer=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "short", "text"])
    from_dir = bertkit.pipeline("feature-extraction", path)
    assert copies == [] and isinstance(from_dir.model.encoder.layer[0].attention.self.qkv, PreparedLinear)
    model = BertModel.from_pretrained(path)
    passed = bertkit.pipeline("feature-extraction", model=model, tokenizer=from_dir.tokenizer)
    assert copies == [model] and not any(isinstance(m, PreparedLinear) for m in model.modules())
    in_place = bertkit.pipeline("feature-extraction", model=model, tokenizer=from_dir.tokenizer, prepare_in_place=True)
    assert len(copies) == 1 and in_place.model is model
    texts = ["a short text", "a text, a short text and a text"]
    assert from_dir(texts) == passed(texts) == in_place(texts)
    with pytest.raises(BertkitError, match="prepare_in_place must be True, False or None .*got 'yes'"):
        bertkit.pipeline("feature-extraction", path, prepare_in_place="yes")
