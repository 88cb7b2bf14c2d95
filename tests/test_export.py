"""Export: torch.export and torch.jit.trace on every head (tiny configs), ONNX on real text with onnxruntime."""

from __future__ import annotations

import csv
import json
import re

import pytest
import torch

import bertkit.heads as H
from bertkit import BertModel, BertTokenizer
from bertkit.cli import main
from bertkit.errors import BertkitError
from bertkit.inference.export import INPUT_NAMES, TupleOutputModel, export_onnx
from cases import slow_after

TINY = dict(vocab_size=211, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
            max_position_embeddings=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
_ON_MINILM_VOCAB = {k: v for k, v in TINY.items() if k != "vocab_size"}  # the tokenizer's size instead
CLASSES = [BertModel, H.BertForPreTraining, H.BertForMaskedLM, H.BertForNextSentencePrediction,
           H.BertForSequenceClassification, H.BertForTokenClassification, H.BertForQuestionAnswering,
           H.BertForMultipleChoice]


def _inputs(cls, B: int, T: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    shape = (B, 3, T) if cls is H.BertForMultipleChoice else (B, T)
    ids = torch.randint(1, TINY["vocab_size"], shape, generator=g)
    types = torch.randint(0, 2, shape, generator=g)
    mask = torch.ones(shape, dtype=torch.long)
    mask[-1, ..., T // 2:] = 0  # a padded row: eager drops it, the exported graph masks it
    return ids, types, mask


def _assert_outputs_equal(eager: tuple, exported: tuple, mask: torch.Tensor) -> None:
    """Equal within 1e-5 at real positions (padding positions of per-token outputs are not defined)."""
    assert len(eager) == len(exported)
    for a, b in zip(eager, exported):
        if a.dim() >= 2 and a.shape[: mask.dim()] == mask.shape:
            a, b = a[mask.bool()], b[mask.bool()]
        torch.testing.assert_close(b, a, atol=1e-5, rtol=0)


@pytest.mark.parametrize("cls", slow_after(CLASSES, keep=1), ids=lambda c: c.__name__)
def test_torch_export_on_every_head_with_dynamic_batch_and_sequence(cls, tiny_model):
    model = tiny_model(cls, **TINY).eval()
    batch, seq = torch.export.Dim("batch", max=256), torch.export.Dim("sequence", max=TINY["max_position_embeddings"])
    dims = {0: batch, 2: seq} if cls is H.BertForMultipleChoice else {0: batch, 1: seq}
    ids, types, mask = _inputs(cls, 3, 11, 0)
    program = torch.export.export(model, (ids, mask, types), dynamic_shapes=(dims, dims, dims))  # transformers' order
    exported = program.module()
    for B, T, seed in ((3, 11, 1), (5, 17, 2), (1, 7, 3)):  # shapes other than the traced one
        ids, types, mask = _inputs(cls, B, T, seed)
        with torch.no_grad():
            want = TupleOutputModel(model)(ids, types, mask)
            out = exported(ids, mask, types)
        assert type(out) is type(model(ids, mask, types))  # the dataclass itself comes back
        names = TupleOutputModel(model).output_names
        got = (out.last_hidden_state, out.pooler_output) if cls is BertModel else tuple(getattr(out, n) for n in names)
        _assert_outputs_equal(want, got, mask)


# the base model and the two-output pre-training head in make test (the heads' own traces are make test's in
# test_jit_trace_of_the_model_itself_returns_its_output_tuple); every head in make test-slow
@pytest.mark.parametrize("cls", slow_after(CLASSES, keep=2), ids=lambda c: c.__name__)
def test_jit_trace_on_every_head_through_tuple_outputs(cls, tiny_model):
    model = tiny_model(cls, **TINY).eval()
    wrapper = TupleOutputModel(model).eval()
    with torch.no_grad(), pytest.warns(torch.jit.TracerWarning):  # Python ints from shapes: expected
        traced = torch.jit.trace(wrapper, _inputs(cls, 3, 11, 0))
    for B, T, seed in ((3, 11, 1), (4, 19, 2)):
        ids, types, mask = _inputs(cls, B, T, seed)
        with torch.no_grad():
            _assert_outputs_equal(wrapper(ids, types, mask), traced(ids, types, mask), mask)


@pytest.mark.parametrize("cls", [BertModel, H.BertForSequenceClassification, H.BertForTokenClassification])
def test_jit_trace_of_the_model_itself_returns_its_output_tuple(cls, tiny_model):
    """torch.jit.trace(model, (input_ids, attention_mask, token_type_ids)) as transformers users write it: the trace
    records the output's tuple (what transformers 4's torchscript=True gave; the dataclass is refused by the tracer),
    equal to eager's on other shapes; the model outside a trace still returns its dataclass."""
    model = tiny_model(cls, **TINY).eval()
    ids, types, mask = _inputs(cls, 3, 11, 0)
    with torch.no_grad(), pytest.warns(torch.jit.TracerWarning):
        traced = torch.jit.trace(model, (ids, mask, types))
    for B, T, seed in ((3, 11, 1), (4, 19, 2)):
        ids, types, mask = _inputs(cls, B, T, seed)
        with torch.no_grad():
            eager = model(ids, mask, types)
            got = traced(ids, mask, types)
        assert type(got) is tuple and not isinstance(eager, tuple)
        _assert_outputs_equal(eager.to_tuple(), got, mask)


def test_torchscript_true_is_refused_naming_the_trace_that_needs_no_flag(tmp_path, tiny_checkpoint):
    directory = tiny_checkpoint(tmp_path / "tiny", **TINY)
    with pytest.raises(BertkitError, match=r"unknown keyword argument torchscript: .*torchscript=True is not needed: "
                                           r"torch.jit.trace\(model, \(input_ids, attention_mask, token_type_ids\)\)"):
        BertModel.from_pretrained(directory, torchscript=True)


def test_each_model_class_declares_the_outputs_an_exported_graph_returns():
    """transformers' names, in tuple order, declared by each class; every bertkit model class has them."""
    from bertkit.heads import MODEL_CLASSES

    assert {name: cls.output_names for name, cls in MODEL_CLASSES.items()} == {
        "BertModel": ("last_hidden_state", "pooler_output"),
        "BertForPreTraining": ("prediction_logits", "seq_relationship_logits"),
        "BertForMaskedLM": ("prediction_logits",),
        "BertForNextSentencePrediction": ("logits",),
        "BertForSequenceClassification": ("logits",),
        "BertForTokenClassification": ("logits",),
        "BertForQuestionAnswering": ("start_logits", "end_logits"),
        "BertForMultipleChoice": ("logits",),
    }


def test_tuple_output_refuses_foreign_modules():
    with pytest.raises(ValueError, match="not a bertkit model class"):
        TupleOutputModel(torch.nn.Linear(2, 2))


def _session(path):
    import onnxruntime

    return onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def _run(session, inputs):
    return session.run(None, {n: t.numpy() for n, t in zip(INPUT_NAMES, inputs)})


def test_onnx_export_equals_bertkit_on_real_text(tmp_path, minilm_2_layers, data_dir):
    """MiniLM's first 2 layers (real weights, encoder + pooler; the exported graph is each layer's, the same at any
    depth, and 6 layers tripled the export and the runs) through onnxruntime on SST-2 dev sentences, padded
    batches: within 1e-4 of bertkit's own (unpadded) outputs at every real position."""
    pytest.importorskip("onnx", reason="pip install 'bertkit[onnx]'")
    pytest.importorskip("onnxruntime", reason="pip install 'bertkit[onnx]'")
    out = tmp_path / "minilm.onnx"
    assert main(["export", "onnx", "--model", str(minilm_2_layers), "--out", str(out)]) == 0
    assert out.stat().st_size > 25e6  # the weights inside it (29 MB of them)
    with open(data_dir / "glue/SST-2/dev.tsv", encoding="utf-8") as f:
        texts = [r["sentence"] for r in csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)][:96]
    tok = BertTokenizer.from_pretrained(minilm_2_layers)
    model = BertModel.from_pretrained(minilm_2_layers).eval()
    session = _session(out)
    worst = 0.0
    for i in range(0, len(texts), 32):
        enc = tok(texts[i:i + 32], padding=True, return_tensors="pt")
        inputs = tuple(enc[k] for k in INPUT_NAMES)
        hidden, pooled = (torch.from_numpy(a) for a in _run(session, inputs))
        with torch.no_grad():
            ref = model(**dict(zip(INPUT_NAMES, inputs)))
        m = inputs[2].bool()
        worst = max(worst, float((hidden[m] - ref.last_hidden_state[m]).abs().max()),
                    float((pooled - ref.pooler_output).abs().max()))
    assert worst < 1e-4, worst
    assert main(["export", "onnx", "--model", str(minilm_2_layers), "--out", str(out)]) == 2  # never overwritten


@pytest.mark.parametrize("cls", slow_after([H.BertForSequenceClassification, H.BertForQuestionAnswering,
                                            H.BertForMultipleChoice, H.BertForPreTraining], keep=2),
                         ids=lambda c: c.__name__)
def test_onnx_export_of_heads(tmp_path, minilm_2_layers, cls, tiny_model):
    pytest.importorskip("onnxruntime", reason="pip install 'bertkit[onnx]'")
    tok = BertTokenizer.from_pretrained(minilm_2_layers)
    model = tiny_model(cls, **_ON_MINILM_VOCAB, vocab_size=len(tok)).eval()
    model.save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    result = export_onnx(tmp_path / "m", tmp_path / "m.onnx")
    assert result["model_class"] == cls.__name__ and result["verified_max_abs_diff"] < 1e-4
    session = _session(tmp_path / "m.onnx")
    enc = tok(["a longer sentence with several words in it", "short"], padding=True, return_tensors="pt")
    inputs = tuple(enc[k] for k in INPUT_NAMES)
    if cls is H.BertForMultipleChoice:
        inputs = tuple(t[None].expand(2, -1, -1).contiguous() for t in inputs)  # batch 2 of 2 choices
    with torch.no_grad():
        want = TupleOutputModel(model)(*inputs)
    got = tuple(torch.from_numpy(a) for a in _run(session, inputs))
    _assert_outputs_equal(want, got, inputs[2])


@pytest.mark.parametrize("head", ["BertForSequenceClassification", "BertForMaskedLM", "BertForQuestionAnswering"])
def test_a_head_config_json_names_and_the_weights_lack_is_refused(tmp_path, minilm_2_layers, tiny_checkpoint,
                                                                  head):
    """Was: a checkpoint whose config.json names a head its weights lack (an encoder's weights under a head's class)
    was exported with that head initialised at random, and verified against bertkit running the same random head;
    `bertkit quantize` wrote it so into the int8 directory, which then loaded as the checkpoint's head. The pipelines
    refuse such a directory. Now both commands refuse it, naming the missing weights, and write nothing."""
    from bertkit.quantization import quantize_checkpoint

    model_dir = tiny_checkpoint(tmp_path / "m", tokenizer=BertTokenizer.from_pretrained(minilm_2_layers),
                                **_ON_MINILM_VOCAB)
    config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    (model_dir / "config.json").write_text(json.dumps({**config, "architectures": [head]}), encoding="utf-8")
    refusal = (rf"{model_dir / 'config.json'} names {head}, and its weights lack that head's "
               r"\((cls|classifier|qa_outputs)\..*\): it would be written with the head initialised at random")
    with pytest.raises(BertkitError, match=refusal):
        export_onnx(model_dir, tmp_path / "m.onnx")
    with pytest.raises(BertkitError, match=refusal):
        quantize_checkpoint(model_dir, tmp_path / "int8")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]


def test_a_rejected_export_leaves_the_earlier_file_as_it_was(tmp_path, minilm_2_layers, monkeypatch,
                                                             tiny_checkpoint):
    """The new graph is verified under a temporary name beside the old one and renamed into place only once it
    passes: an export that fails its check (as `export onnx` with --overwrite once did) keeps the earlier file."""
    pytest.importorskip("onnxruntime", reason="pip install 'bertkit[onnx]'")
    import bertkit.inference.export as export

    model_dir = tiny_checkpoint(tmp_path / "m", tokenizer=BertTokenizer.from_pretrained(minilm_2_layers),
                                **_ON_MINILM_VOCAB)
    out = tmp_path / "model.onnx"
    out.write_bytes(b"the earlier export, in production")
    monkeypatch.setattr(export, "max_abs_difference", lambda *args: 1.0)
    with pytest.raises(BertkitError, match=r"differ from bertkit's by 1.00e\+00.*model.onnx was left as it was"):
        export_onnx(model_dir, out, overwrite=True)
    assert out.read_bytes() == b"the earlier export, in production"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m", "model.onnx"]  # no temporary file left
    monkeypatch.undo()
    assert export_onnx(model_dir, out, overwrite=True)["verified_max_abs_diff"] < 1e-4  # a good one replaces it
    assert out.read_bytes()[:20] != b"the earlier export, "


def test_a_sentence_transformers_directory_of_the_older_layout_exports_its_encoder(tmp_path, minilm_2_layers,
                                                                                  tiny_checkpoint):
    """Was: a sentence-transformers directory with its Transformer in 0_Transformer/ (the older layout, which
    sentence-transformers, bertkit's SentenceTransformer and the pipelines load) was refused: "st/config.json not
    found: pass a checkpoint directory written by save_pretrained". Now the encoder modules.json lists is exported,
    the same graph as from its folder."""
    pytest.importorskip("onnxruntime", reason="pip install 'bertkit[onnx]'")
    import json

    st_dir = tmp_path / "st"
    tiny_checkpoint(st_dir / "0_Transformer", tokenizer=BertTokenizer.from_pretrained(minilm_2_layers),
                    **_ON_MINILM_VOCAB)
    (st_dir / "1_Pooling").mkdir()
    (st_dir / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": 32}))
    (st_dir / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "0_Transformer", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]))
    report = export_onnx(st_dir, tmp_path / "st.onnx")
    assert report["model_class"] == "BertModel" and report["outputs"] == ["last_hidden_state", "pooler_output"]
    assert report["verified_max_abs_diff"] < 1e-4 and report["not_in_graph"] == ["1_Pooling (Pooling)"]
    assert "not_in_graph" not in export_onnx(st_dir / "0_Transformer", tmp_path / "encoder.onnx")
    ort = pytest.importorskip("onnxruntime")
    inputs = {k: v.numpy() for k, v in zip(INPUT_NAMES, _inputs(BertModel, 2, 7, seed=3))}
    got, want = (ort.InferenceSession(str(tmp_path / f), providers=["CPUExecutionProvider"]).run(None, inputs)
                 for f in ("st.onnx", "encoder.onnx"))
    assert all((a == b).all() for a, b in zip(got, want))


@pytest.mark.parametrize("opset", [9, 13, 99])
def test_an_opset_the_exporter_cannot_write_is_refused_naming_the_range(tmp_path, minilm_2_layers, capsys,
                                                                        opset, tiny_checkpoint):
    """Below 14 the exporter has no attention operator; above torch.onnx's newest it stops: either was a traceback."""
    pytest.importorskip("onnx", reason="pip install 'bertkit[onnx]'")
    from bertkit.inference.export import supported_opsets

    model_dir = tiny_checkpoint(tmp_path / "m", tokenizer=BertTokenizer.from_pretrained(minilm_2_layers),
                                **_ON_MINILM_VOCAB)
    assert supported_opsets().start == 14 and 17 in supported_opsets()
    with pytest.raises(BertkitError, match=rf"--opset {opset} is not one bertkit can export: the supported opsets "
                                           rf"are 14 to {supported_opsets().stop - 1}"):
        export_onnx(model_dir, tmp_path / "m.onnx", opset=opset)
    assert main(["export", "onnx", "--model", str(model_dir), "--out", str(tmp_path / "m.onnx"), "--opset",
                 str(opset)]) == 2
    assert "supported opsets are 14 to" in capsys.readouterr().err and not (tmp_path / "m.onnx").exists()


@pytest.mark.parametrize("opset", [17.0, "17", True])
def test_an_opset_that_is_not_an_int_is_refused_naming_it(tmp_path, minilm_2_layers, opset, tiny_checkpoint):
    """Was: 17.0 passed the range check (17.0 in range(14, 21)) and stopped inside torch.onnx's exporter with a
    TypeError and a dump of the graph; "17" was refused as "--opset 17 is not one bertkit can export", of the range
    it then named."""
    pytest.importorskip("onnx", reason="pip install 'bertkit[onnx]'")
    model_dir = tiny_checkpoint(tmp_path / "m", tokenizer=BertTokenizer.from_pretrained(minilm_2_layers),
                                **_ON_MINILM_VOCAB)
    with pytest.raises(BertkitError, match=rf"--opset {re.escape(repr(opset))} is not one bertkit can export"):
        export_onnx(model_dir, tmp_path / "m.onnx", opset=opset)
    assert not (tmp_path / "m.onnx").exists()


def test_the_newest_supported_opset_is_one_the_exporter_writes(tmp_path, minilm_2_layers, tiny_checkpoint):
    """The TorchScript exporter bertkit runs writes up to its own newest opset (torch.onnx's newest is the dynamo
    exporter's): the top of the range exports without torch's "is not supported" warning, and runs as bertkit."""
    pytest.importorskip("onnxruntime", reason="pip install 'bertkit[onnx]'")
    import warnings

    from bertkit.inference.export import supported_opsets

    model_dir = tiny_checkpoint(tmp_path / "m", tokenizer=BertTokenizer.from_pretrained(minilm_2_layers),
                                **_ON_MINILM_VOCAB)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = export_onnx(model_dir, tmp_path / "m.onnx", opset=supported_opsets()[-1])
    assert not [str(w.message) for w in caught if "not supported" in str(w.message)]
    assert result["opset"] == supported_opsets()[-1] and result["verified_max_abs_diff"] < 1e-5


def test_a_checkpoint_whose_config_asks_for_tuples_and_extra_outputs_exports_its_head(
        tmp_path, minilm_2_layers, tiny_checkpoint):
    """config.json's runtime switches (return_dict false, output_hidden_states / output_attentions true, as a
    model saved after setting them has) are a caller's defaults: the graph still returns the head's outputs."""
    pytest.importorskip("onnxruntime", reason="pip install 'bertkit[onnx]'")
    model_dir = tiny_checkpoint(tmp_path / "m", H.BertForSequenceClassification,
                                tokenizer=BertTokenizer.from_pretrained(minilm_2_layers), return_dict=False,
                                output_hidden_states=True, output_attentions=True, **_ON_MINILM_VOCAB)
    result = export_onnx(model_dir, tmp_path / "m.onnx")
    assert result["outputs"] == ["logits"] and result["verified_max_abs_diff"] < 1e-5



@pytest.mark.parametrize("overwrite", [False, True])
def test_a_file_another_process_writes_meanwhile_is_replaced_only_with_overwrite(tmp_path, minilm_2_layers,
                                                                                tiny_checkpoint, monkeypatch, capsys,
                                                                                overwrite):
    """Was: two `bertkit export onnx --out m.onnx` (or `predict ... --output-file`) started before either had
    written: both exited 0, the later rename replacing the earlier run's file without --overwrite. A file that
    appears while the command runs is now kept, and the command says so (exit 2), unless --overwrite was given."""
    import bertkit.inference.export as export

    model_dir = tiny_checkpoint(tmp_path / "m", tokenizer=BertTokenizer.from_pretrained(minilm_2_layers),
                                **_ON_MINILM_VOCAB)
    out = tmp_path / "m.onnx"
    write_graph = export._write_graph

    def racing(tmp, *args):  # the other run finishes first, while this one traces its graph
        out.write_bytes(b"the other run's graph")
        write_graph(tmp, *args)

    monkeypatch.setattr(export, "_write_graph", racing)
    code = main(["export", "onnx", "--model", str(model_dir), "--out", str(out), "--no-verify",
                 *(["--overwrite"] if overwrite else [])])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m", "m.onnx"]  # no temporary file left
    if overwrite:
        assert code == 0 and out.read_bytes() != b"the other run's graph"
        return
    assert code == 2 and out.read_bytes() == b"the other run's graph"
    assert (f"{out} was written by another process while this command ran; it was not replaced (this command's "
            "output is discarded): pass --overwrite to replace it") in capsys.readouterr().err
