"""Feature extraction (google's extract_features.py on bertkit) and the feature-based NER study's pieces.

Extracted values are compared with ``model(..., output_hidden_states=True)`` at the same tokens and
layers, the model as CPU inference prepares it (``for_cpu_inference``, what extraction runs): bit for bit when
each text is encoded alone (batch 1: the very same computation), within float rounding when texts of different
lengths share a batch (the encoder then drops padding).
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from bertkit import BertModel, BertTokenizer
from bertkit import features as fx
from bertkit.errors import BertkitError, NonFiniteError
from bertkit.inference.prepare import for_cpu_inference
from bertkit.tasks import ner
from bertkit.training import feature_study as fs

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = ("the quick brown fox jumps over lazy dog hello world eu rejects german call to boycott british lamb . , "
         "peter blackburn brussels said on thursday it ##s un ##aff ##able").split()
TEXTS = [("Hello world.", None), ("The quick brown fox", "jumps over the lazy dog."), ("", None),
         ("unaffable dogs, the fox said on Thursday", None), ("EU rejects German call", "to boycott British lamb.")]
CONLL = """EU NNP B-NP B-ORG
rejects VBZ B-VP O
German JJ B-NP B-MISC
call NN I-NP O
to TO B-VP O
boycott VB I-VP O
British JJ B-NP B-MISC
lamb NN I-NP O
. . O O

Peter NNP B-NP B-PER
Blackburn NNP I-NP I-PER

BRUSSELS NNP B-NP B-LOC
said VBD B-VP O
on IN B-PP O
Thursday NNP B-NP O
"""


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, tiny_checkpoint) -> tuple[Path, BertModel, BertTokenizer]:
    tok = BertTokenizer({t: i for i, t in enumerate(SPECIALS + WORDS)})
    d = tiny_checkpoint(tmp_path_factory.mktemp("tiny_encoder"), tokenizer=tok, num_hidden_layers=3)
    return d, BertModel.from_pretrained(d), tok


def _reference(model, tok, text, pair, max_len=128):
    model = for_cpu_inference(model.eval(), bf16=False)  # the computation extraction runs on the CPU
    enc = tok(text, text_pair=pair, max_length=max_len, truncation="longest_first")
    ids, types = torch.tensor([enc["input_ids"]]), torch.tensor([enc["token_type_ids"]])
    with torch.no_grad():
        states = model(ids, token_type_ids=types, output_hidden_states=True).hidden_states
    return tok.convert_ids_to_tokens(enc["input_ids"]), [s[0].numpy() for s in states]


# ---------------------------------------------------------------- extraction


def test_read_texts_splits_pairs_and_keeps_blank_lines(tmp_path):
    path = tmp_path / "in.txt"
    path.write_text("Hello world.\nWho was Jim Henson ? ||| Jim Henson was a puppeteer\n\na ||| b ||| c\n")
    assert fx.read_texts(path) == [("Hello world.", None), ("Who was Jim Henson ?", "Jim Henson was a puppeteer"),
                                   ("", None), ("a ||| b", "c")]


def test_jsonl_values_equal_the_model_exactly(tiny, tmp_path):
    _, model, tok = tiny
    out = tmp_path / "f.jsonl"
    result = fx.extract_features(model, tok, TEXTS, out, layers=[-1, 0, -3, 2], batch_size=1, progress=False)
    assert result["files"] == [str(out)] and result["lines"] == len(TEXTS)
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [obj["linex_index"] for obj in lines] == list(range(len(TEXTS)))
    for (text, pair), obj in zip(TEXTS, lines):
        tokens, states = _reference(model, tok, text, pair)
        assert [f["token"] for f in obj["features"]] == tokens
        for t, feat in enumerate(obj["features"]):
            assert [layer["index"] for layer in feat["layers"]] == [-1, 0, -3, 2]
            for layer in feat["layers"]:
                got = np.asarray(layer["values"], dtype=np.float32)
                np.testing.assert_array_equal(got, states[layer["index"]][t])  # bit for bit
    # Layer 0 is the embedding output; 3 = -1 is the last of the 3 Transformer layers.
    assert lines[1]["features"][0]["token"] == "[CLS]" and lines[2]["features"][1]["token"] == "[SEP]"


def test_batched_extraction_matches_within_rounding(tiny, tmp_path):
    _, model, tok = tiny
    out = tmp_path / "f.jsonl"
    fx.extract_features(model, tok, TEXTS, out, layers=[-1, -2], batch_size=8, progress=False)
    for (text, pair), rec in zip(TEXTS, fx.read_features(out)):
        tokens, states = _reference(model, tok, text, pair)
        assert rec["tokens"] == tokens
        for name in (-1, -2):
            torch.testing.assert_close(torch.from_numpy(rec["layers"][name]), torch.from_numpy(states[name]),
                                       rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("max_len, text, tokens", [
    # 2 + 1 (one token at a time off the longer, off b on a tie); tokenizers' longest_first keeps 1 + 2
    (6, ("the quick", "jumps over lazy"), ["[CLS]", "the", "quick", "[SEP]", "jumps", "[SEP]"]),
    (4, ("hello world", "the fox"), ["[CLS]", "hello", "[SEP]"]),  # b cut to no tokens: no second [SEP]
    (128, ("hello", "\u200b"), ["[CLS]", "hello", "[SEP]"]),  # b of no tokens: the text alone
    (4, ("the quick brown fox", None), ["[CLS]", "the", "quick", "[SEP]"]),
])
def test_long_inputs_are_cut_as_googles_extract_features(tiny, tmp_path, max_len, text, tokens):
    _, model, tok = tiny
    [enc] = fx.encode_texts(tok, [text], max_len)
    first = tokens.index("[SEP]") + 1
    assert (tok.convert_ids_to_tokens(enc["input_ids"]), enc["token_type_ids"]) == (
        tokens, [0] * first + [1] * (len(tokens) - first))
    fx.extract_features(model, tok, [text], tmp_path / "f.jsonl", layers=[-1], max_seq_length=max_len, progress=False)
    assert next(fx.read_features(tmp_path / "f.jsonl"))["tokens"] == tokens


def test_safetensors_shards_hold_the_jsonl_numbers(tiny, tmp_path):
    _, model, tok = tiny
    fx.extract_features(model, tok, TEXTS, tmp_path / "f.jsonl", layers=[-1, 1], batch_size=1, progress=False)
    # ~2 lines per shard: 5 lines -> several shards, named like Hugging Face's sharded checkpoints.
    result = fx.extract_features(model, tok, TEXTS, tmp_path / "f.safetensors", layers=[-1, 1], batch_size=1,
                                 max_shard_bytes=2 * 12 * 2 * 32 * 4, progress=False)
    n = len(result["files"])
    assert n > 1 and result["files"][0].endswith(f"f-00001-of-{n:05d}.safetensors")
    from_json = list(fx.read_features(tmp_path / "f.jsonl"))
    from_st = list(fx.read_features(tmp_path / "f.safetensors"))
    assert [r["line_index"] for r in from_st] == list(range(len(TEXTS)))
    for a, b in zip(from_json, from_st):
        assert tok.convert_ids_to_tokens(b["input_ids"].tolist()) == a["tokens"]
        for name in (-1, 1):
            np.testing.assert_array_equal(a["layers"][name], b["layers"][name])


def test_both_formats_read_back_in_the_order_of_layers(tiny, tmp_path):
    # safetensors came back sorted by tensor name ([-4, -3, -2, -1] as -1, -2, -3, -4): a concatenation of
    # rec["layers"].values() was another vector than the .jsonl's
    _, model, tok = tiny
    for name in ("o.jsonl", "o.safetensors"):
        fx.extract_features(model, tok, TEXTS, tmp_path / name, layers=[-3, -2, -1, 0], progress=False)
        assert [list(rec["layers"]) for rec in fx.read_features(tmp_path / name)] == [[-3, -2, -1, 0]] * len(TEXTS)


def test_one_shard_is_the_named_file_and_fp16_is_allowed(tiny, tmp_path):
    _, model, tok = tiny
    result = fx.extract_features(model, tok, TEXTS[:2], tmp_path / "x.safetensors", layers=[-1], dtype="float16",
                                 progress=False)
    assert result["files"] == [str(tmp_path / "x.safetensors")]
    rec = next(fx.read_features(tmp_path / "x.safetensors"))
    assert rec["layers"][-1].dtype == np.float16


def test_fp16_jsonl_holds_the_fp16_safetensors_values(tiny, tmp_path):
    # --dtype float16 was ignored for .jsonl: float32 values in 9 digits, not the fp16 ones it asked for
    _, model, tok = tiny
    for name in ("h.jsonl", "h.safetensors"):
        fx.extract_features(model, tok, TEXTS, tmp_path / name, layers=[-1, 0], dtype="float16", progress=False)
    for a, b in zip(fx.read_features(tmp_path / "h.jsonl"), fx.read_features(tmp_path / "h.safetensors"), strict=True):
        for name in (-1, 0):
            np.testing.assert_array_equal(a["layers"][name], b["layers"][name].astype(np.float32))


@pytest.mark.parametrize("name", ["mine.jsonl", "mine.safetensors"])
def test_an_existing_output_file_is_replaced_only_with_overwrite(tiny, tmp_path, name):
    _, model, tok = tiny
    out = tmp_path / name
    out.write_bytes(b"my own results\n")
    with pytest.raises(BertkitError, match=f"{name} already exists; pass --overwrite \\(overwrite=True from Python\\)"):
        fx.extract_features(model, tok, TEXTS[:1], out, layers=[-1], progress=False)
    assert out.read_bytes() == b"my own results\n"
    fx.extract_features(model, tok, TEXTS[:1], out, layers=[-1], progress=False, overwrite=True)
    assert next(fx.read_features(out))["layers"][-1].shape[1] == model.config.hidden_size


def test_extraction_errors_name_the_fix(tiny, tmp_path):
    _, model, tok = tiny
    with pytest.raises(ValueError, match="layer -5 does not exist: this model has 4 hidden states"):
        fx.extract_features(model, tok, TEXTS, tmp_path / "f.jsonl", layers=[-5], progress=False)
    with pytest.raises(ValueError, match=r"must end in \.jsonl .* or \.safetensors"):
        fx.extract_features(model, tok, TEXTS, tmp_path / "f.txt", progress=False)
    with pytest.raises(ValueError, match="max_seq_length 200 exceeds max_position_embeddings 128"):
        fx.extract_features(model, tok, TEXTS, tmp_path / "f.jsonl", max_seq_length=200, progress=False)
    with pytest.raises(ValueError, match=r"texts\[0\] is 'hi', not a \(text_a, text_b or None\) pair"):
        fx.extract_features(model, tok, ["hi"], tmp_path / "f.jsonl", progress=False)  # not "h" ||| "i"
    with pytest.raises(ValueError, match=r"max_seq_length 2 leaves no room for the 3 special tokens of a pair"):
        fx.extract_features(model, tok, TEXTS, tmp_path / "f.jsonl", max_seq_length=2, progress=False)
    assert not list(tmp_path.iterdir())


def test_extraction_prepares_the_model_as_pipelines_do(tiny, tmp_path):
    """Extraction from Python runs the model through ``prepare_model``, as the command and the pipelines do: bf16 is
    checked before any work (a str was read by its truthiness, then failed in torch.autocast; float16 weights failed
    inside PyTorch with "Unexpected floating ScalarType"; float64 ones ran in float64 under bf16), and a model being
    trained keeps its train mode (extraction switched it to eval), its states those of the eval model."""
    _, model, tok = tiny
    out = tmp_path / "f.jsonl"
    for wrong, match in ((model, "bf16 must be True, False or None.*got 'false'"),
                         (BertModel(model.config).half(), "holds float16 weights.*model.float()"),
                         (BertModel(model.config).double(), "holds float64 weights.*model.float()")):
        with pytest.raises(BertkitError, match=match):
            fx.extract_features(wrong, tok, TEXTS, out, progress=False, bf16="false" if wrong is model else True)
    assert not list(tmp_path.iterdir())
    model.train()
    try:
        fx.extract_features(model, tok, TEXTS[:2], out, layers=[-1], batch_size=1, progress=False)
        assert model.training
    finally:
        model.eval()
    for (text, pair), rec in zip(TEXTS[:2], fx.read_features(out)):
        np.testing.assert_array_equal(rec["layers"][-1], _reference(model, tok, text, pair)[1][-1])


def test_layers_named_twice_or_none_are_refused(tiny, tmp_path):
    """A repeated index would be one tensor in the file while the metadata and the report list it twice."""
    _, model, tok = tiny
    with pytest.raises(ValueError, match=r"layer -1 is given twice in \[-1, 0, -1\]"):
        fx.extract_features(model, tok, TEXTS, tmp_path / "f.safetensors", layers=[-1, 0, -1], progress=False)
    with pytest.raises(ValueError, match="give at least one layer index"):
        fx.extract_features(model, tok, TEXTS, tmp_path / "f.jsonl", layers=[], progress=False)
    # two names of one state (3 layers: -1 is 3, -4 is 0) were written twice, as if two layers
    with pytest.raises(ValueError, match=r"layers -1 and 3 in \[-1, -2, 3\] are the same hidden state of this model "
                                         r"\(3 layers: -1 = 3\)"):
        fx.extract_features(model, tok, TEXTS, tmp_path / "f.jsonl", layers=[-1, -2, 3], progress=False)
    with pytest.raises(ValueError, match=r"layers 0 and -4 in \[0, -4\] are the same hidden state"):
        fx.extract_features(model, tok, TEXTS, tmp_path / "f.safetensors", layers=[0, -4], progress=False)
    # google's flag string was read character by character ("layer - is given twice"), True written as
    # '"index":True' (not JSON), a float or a bare int failed with a TypeError
    with pytest.raises(ValueError, match=r"layers='-1,-2': give a list of layer indices, e.g. layers=\[-1, -2\]"):
        fx.extract_features(model, tok, TEXTS, tmp_path / "f.jsonl", layers="-1,-2", progress=False)
    with pytest.raises(ValueError, match=r"layers=-1: give a list of layer indices"):
        fx.extract_features(model, tok, TEXTS, tmp_path / "f.jsonl", layers=-1, progress=False)
    for bad, shown in ((True, "True"), (1.0, "1.0"), ("-1", "'-1'")):
        with pytest.raises(ValueError, match=rf"layer {shown} in layers=\[-2, {shown}\] is not an integer index"):
            fx.extract_features(model, tok, TEXTS, tmp_path / "f.jsonl", layers=[-2, bad], progress=False)
    assert not list(tmp_path.iterdir())
    fx.extract_features(model, tok, TEXTS, tmp_path / "f.safetensors", layers=np.array([-1, 0]), progress=False)
    assert list(next(fx.read_features(tmp_path / "f.safetensors"))["layers"]) == [-1, 0]


@pytest.mark.parametrize("suffix", [".jsonl", ".safetensors"])
def test_no_texts_write_an_empty_output(tiny, tmp_path, suffix):
    """An empty input file is an extraction of zero lines in either format (as blank lines are lines)."""
    _, model, tok = tiny
    out = tmp_path / f"f{suffix}"
    result = fx.extract_features(model, tok, [], out, layers=[-1, 0], progress=False)
    assert (result["lines"], result["tokens"], result["files"]) == (0, 0, [str(out)])
    assert list(fx.read_features(out)) == []


def test_cli_extract_features(tiny, tmp_path, capsys):
    from bertkit.cli import main

    d, _, _ = tiny
    inp = tmp_path / "in.txt"
    inp.write_text("hello world\nthe fox ||| the dog\n")
    assert main(["extract-features", "--model", str(d), "--input", str(inp), "--out", str(tmp_path / "o.jsonl"),
                 "--layers", "-1,-2", "--no-progress"]) == 0  # not read as a flag "-1,-2"
    assert json.loads(capsys.readouterr().out)["lines"] == 2
    first = json.loads((tmp_path / "o.jsonl").read_text().splitlines()[0])
    assert [f["token"] for f in first["features"]] == ["[CLS]", "hello", "world", "[SEP]"]
    assert [layer["index"] for layer in first["features"][0]["layers"]] == [-1, -2]



def test_cli_refuses_an_output_name_of_another_format_before_it_checks_that_it_exists(tiny, tmp_path, capsys):
    """Was: `--out notes.txt` (a file of the user's) said "already exists; pass --overwrite", and with --overwrite
    "must end in .jsonl or .safetensors", after loading the model: advice that could not work."""
    from bertkit.cli import main

    d, _, _ = tiny
    (tmp_path / "in.txt").write_text("hello world\n")
    (tmp_path / "notes.txt").write_text("mine")
    for extra in ([], ["--overwrite"]):
        assert main(["extract-features", "--model", str(d), "--input", str(tmp_path / "in.txt"), "--out",
                     str(tmp_path / "notes.txt"), "--no-progress", *extra]) == 2
        err = capsys.readouterr().err
        assert "notes.txt must end in .jsonl (google's JSON lines) or .safetensors (tensors)" in err, err
    assert (tmp_path / "notes.txt").read_text() == "mine"

# ---------------------------------------------------------------- the study's pieces


def _layered(k: int, h: int = 3) -> torch.Tensor:
    """(1, 2, k, h): layer j holds the value j + 1 everywhere."""
    return (torch.arange(k, dtype=torch.float32) + 1)[None, None, :, None].expand(1, 2, k, h).clone()


def test_combination_layers_for_a_six_layer_model():
    positions = {name: fs.combination_layers(name, 7) for name in fs.COMBINATIONS}
    assert positions == {"embeddings": [0], "second_to_last_hidden": [5], "last_hidden": [6],
                         "weighted_sum_last_four": [3, 4, 5, 6], "concat_last_four": [3, 4, 5, 6],
                         "weighted_sum_all_layers": [1, 2, 3, 4, 5, 6]}
    with pytest.raises(ValueError, match="unknown layer combination 'sum'"):
        fs.combination_layers("sum", 7)
    with pytest.raises(ValueError, match="needs 4 Transformer layers; this model has 3"):
        fs.combination_layers("concat_last_four", 4)


def test_one_layer_and_concat_on_known_tensors():
    x = _layered(4)
    assert torch.equal(fs.LayerCombination("concat", 1, 3)(x[..., 2:3, :]), torch.full((1, 2, 3), 3.0))
    cat = fs.LayerCombination("concat", 4, 3)
    assert cat.output_size == 12
    assert cat(x)[0, 0].tolist() == [1.0] * 3 + [2.0] * 3 + [3.0] * 3 + [4.0] * 3  # layers in the order given


def test_scalar_mix_is_elmo_weighted_sum():
    mix = fs.LayerCombination("scalar_mix", 4, 3)
    x = _layered(4)
    assert torch.allclose(mix(x), torch.full((1, 2, 3), 2.5))  # zero logits: the mean of 1..4, gamma 1
    with torch.no_grad():
        mix.weights.copy_(torch.log(torch.tensor([1.0, 0.0001, 0.0001, 3.0])))
        mix.gamma.fill_(2.0)
    w = torch.tensor([1.0, 0.0001, 0.0001, 3.0])
    w = w / w.sum()
    expected = 2.0 * float((w * torch.tensor([1.0, 2.0, 3.0, 4.0])).sum())
    assert torch.allclose(mix(x), torch.full((1, 2, 3), expected))
    mix(x).sum().backward()
    assert mix.weights.grad is not None and mix.gamma.grad is not None  # both are learned


def test_word_activations_are_first_piece_states(tiny, tmp_path):
    _, model, tok = tiny
    path = tmp_path / "c.txt"
    path.write_text(CONLL)
    sentences = ner.read_conll(path)
    # max_seq_length 6: the 9-word sentence is split into windows, each encoded on its own.
    acts = fs.extract_word_activations(model, tok, sentences, tmp_path / "a.npy", max_seq_length=6, batch_size=2,
                                       progress=False)
    assert acts.values.shape == (15, 4, 32) and acts.values.dtype == np.float16
    assert acts.offsets.tolist() == [0, 9, 11, 15]
    labels = ["O", *sorted({t for s in sentences for t in s.tags} - {"O"})]
    for f in ner.featurize_ner(sentences, tok, labels, 6):
        with torch.no_grad():
            states = model(torch.tensor([f["input_ids"]]), output_hidden_states=True).hidden_states
        for pos, word in enumerate(f["word_ids"]):
            if word is not None:
                row = acts.offsets[f["sentence_index"]] + word
                expected = torch.stack([s[0, pos] for s in states]).half().numpy()  # (L + 1, H)
                np.testing.assert_allclose(acts.values[row].astype(np.float32), expected.astype(np.float32),
                                           rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("bias, message", [
    (1e5, r"^sentence 0 \(0-based, file order\): layer 2 of its word activations holds values past float16's range "
          r"\(largest 1\.0e\+05\), in which the study keeps activations"),
    (float("nan"), r"^sentence 0 \(0-based, file order\): layer 2 of its word activations holds NaN or infinite "
                   r"values: the model's weights are broken; nothing was written")])
def test_word_activations_that_are_not_finite_in_float16_are_refused(tiny, tmp_path, bias, message):
    """Activations past 65504 were stored as inf, and NaN ones as NaN, for a tagger to be trained and scored on
    (an argmax of NaN logits is a tag, and conlleval an F1 of it)."""
    directory, _, tok = tiny
    model = BertModel.from_pretrained(directory)
    path = tmp_path / "c.txt"
    path.write_text(CONLL)
    with torch.no_grad():
        model.encoder.layer[1].output.LayerNorm.weight.zero_()
        model.encoder.layer[1].output.LayerNorm.bias[3] = bias  # hidden state 2 of every token
    with pytest.raises(NonFiniteError, match=message):
        fs.extract_word_activations(model, tok, ner.read_conll(path), tmp_path / "a.npy", max_seq_length=6,
                                    batch_size=2, progress=False)
    assert not (tmp_path / "a.npy").exists()


def test_bilstm_tagger_shapes_and_padding():
    tagger = fs.BiLSTMTagger(fs.LayerCombination("scalar_mix", 2, 8), lstm_hidden=5, num_labels=3, dropout=0.0)
    x = torch.randn(2, 4, 2, 8)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    logits = tagger(x, mask).logits
    assert logits.shape == (2, 4, 3)
    # The second sentence's outputs do not depend on what sits in its padding.
    x2 = x.clone()
    x2[1, 2:] = 100.0
    torch.testing.assert_close(tagger(x2, mask).logits[1, :2], logits[1, :2])
    # The loss is the mean cross-entropy over real words only (padding labels are IGNORE_INDEX).
    labels = torch.tensor([[0, 2, 1, 1], [2, 0, -100, -100]])
    expected = torch.nn.functional.cross_entropy(logits[mask.bool()], labels[mask.bool()])
    torch.testing.assert_close(tagger(x2, mask, labels).loss, expected)


def test_a_combination_given_twice_is_refused(tmp_path):
    """It would train the same tagger twice into one runs/NAME, for one row of the table."""
    with pytest.raises(ValueError, match=r"combination last_hidden is given twice in \['last_hidden', 'embeddings', "
                                         r"'last_hidden'\]; give each once"):
        fs.StudySettings(data_dir=tmp_path, model_name_or_path=tmp_path, output_dir=tmp_path / "study",
                         combinations=("last_hidden", "embeddings", "last_hidden"))
    assert not (tmp_path / "study").exists()
    # none (`--combinations ""`) trained nothing and wrote an empty table, exit 0
    with pytest.raises(ValueError, match=r"^combinations: give at least one of \['embeddings', "):
        fs.StudySettings(data_dir=tmp_path, model_name_or_path=tmp_path, output_dir=tmp_path / "study", combinations=())


def test_combinations_given_as_a_list_from_python_are_the_tuple_the_flags_give(tmp_path):
    # a list was checked whole: "unknown layer combination ['last_hidden', 'concat_last_four']"
    s = fs.StudySettings(data_dir=tmp_path, model_name_or_path=tmp_path, output_dir=tmp_path / "study",
                         combinations=["last_hidden", "concat_last_four"])
    assert s.combinations == ("last_hidden", "concat_last_four")
    with pytest.raises(ValueError, match=r"unknown layer combination 'sum'; choose from \['embeddings'"):
        fs.StudySettings(data_dir=tmp_path, model_name_or_path=tmp_path, output_dir=tmp_path / "study",
                         combinations=["last_hidden", "sum"])


def test_feature_study_end_to_end(tiny, tmp_path):
    d, _, _ = tiny
    data = tmp_path / "conll"
    data.mkdir()
    for split in ("train", "valid"):
        (data / f"{split}.txt").write_text(CONLL)
    settings = fs.StudySettings(data_dir=data, model_name_or_path=d, output_dir=tmp_path / "study", num_train_epochs=2, batch_size=2,
                                combinations=("last_hidden", "weighted_sum_all_layers"), progress=False)
    report = fs.feature_study(settings)
    assert list(report["table"]) == ["last_hidden", "weighted_sum_all_layers"]
    assert all(0.0 <= f1 <= 1.0 for f1 in report["table"].values())
    run = report["runs"][1]
    assert run["layers"] == [1, 2, 3] and len(run["per_epoch"]) == 2
    assert sum(run["per_epoch"][-1]["layer_weights"]) == pytest.approx(1.0, abs=1e-3)
    assert report["settings"]["lstm_hidden"] == 16  # hidden_size // 2
    # The taggers train in the one training loop: its metrics.jsonl holds each epoch's train loss and dev scores.
    records = [json.loads(line) for line in (tmp_path / "study" / "runs" / "weighted_sum_all_layers" / "metrics.jsonl")
               .read_text().splitlines()]
    assert [r["f1"] for r in records if r["split"] == "eval"] == [e["dev_f1"] for e in run["per_epoch"]]
    assert [r["loss"] for r in records if r["split"] == "train"] == [e["train_loss"] for e in run["per_epoch"]]
    again = fs.feature_study(dataclasses.replace(settings, output_dir=tmp_path / "again"))
    assert again["table"] == report["table"]  # seeded: the same taggers again
    assert "| last_hidden |" in fs.format_table(report)



@pytest.mark.slow  # four runs of the study: 5 to 8 s on 2 busy cores
def test_feature_study_cut_short_resumes_without_extracting_or_training_its_finished_parts_again(tiny, tmp_path,
                                                                                              monkeypatch, capsys):
    """A long job: the activations of every word, then a tagger per combination. A kill meanwhile lost it all (the
    command had no --resume, and its next run removed what the kill left). Now --resume continues it: the
    activations and each finished combination are kept, a tagger cut short goes on from its checkpoint, and the
    table is the uninterrupted run's."""
    from bertkit.cli import main

    d, _, _ = tiny
    data = tmp_path / "conll"
    data.mkdir()
    for split in ("train", "valid"):
        (data / f"{split}.txt").write_text(CONLL)
    args = ["feature-study", "--data-dir", str(data), "--model", str(d), "--num-train-epochs", "1", "--batch-size",
            "2", "--combinations", "last_hidden,weighted_sum_all_layers", "--no-progress"]
    assert main([*args, "--out", str(tmp_path / "whole")]) == 0
    whole = json.loads((tmp_path / "whole" / "report.json").read_text())
    train, trained = fs.train_tagger, []

    def cut(name, *rest, **kwargs):  # Ctrl-C as the second combination starts
        if trained:
            raise KeyboardInterrupt
        trained.append(name)
        return train(name, *rest, **kwargs)

    monkeypatch.setattr(fs, "train_tagger", cut)
    out = tmp_path / "study"
    assert main([*args, "--out", str(out)]) == 130
    monkeypatch.setattr(fs, "extract_word_activations", lambda *a, **k: pytest.fail("activations made again"))
    again = []
    monkeypatch.setattr(fs, "train_tagger", lambda name, *rest, **kwargs: again.append(name) or train(name, *rest,
                                                                                                        **kwargs))
    capsys.readouterr()
    assert main([*args, "--out", str(out)]) == 2
    assert (f"the last `bertkit feature-study` run into {out} was cut short; its files are in "
            f"{tmp_path / '.study.bertkit-staging'}: pass --resume to continue it") in capsys.readouterr().err
    train_file = data / "train.txt"
    st = train_file.stat()
    os.utime(train_file, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert main([*args, "--out", str(out), "--resume"]) == 2
    assert (f"cannot --resume in {out}: its `bertkit feature-study` run was cut short with other data files "
            f"(train.txt '{train_file}' ({st.st_size:,} bytes, modified ") in capsys.readouterr().err
    os.utime(train_file, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert main([*args, "--out", str(out), "--resume"]) == 0
    assert again == ["weighted_sum_all_layers"]
    report = json.loads((out / "report.json").read_text())
    assert report["table"] == whole["table"] and len(report["table"]) == 2
    assert [r["per_epoch"] for r in report["runs"]] == [r["per_epoch"] for r in whole["runs"]]


def test_feature_study_resumed_from_python_with_other_settings_is_refused_naming_them(tiny, tmp_path):
    """The command line's marker refuses a --resume with other settings; feature_study(StudySettings(resume=True))
    called from Python has no marker, and took the activations and finished rows of a study run with another
    dropout or tagger as its own. The study's own record (inputs.json) holds its settings now."""
    d, _, _ = tiny
    data = tmp_path / "conll"
    data.mkdir()
    for split in ("train", "valid"):
        (data / f"{split}.txt").write_text(CONLL)
    s = fs.StudySettings(data_dir=data, model_name_or_path=d, output_dir=tmp_path / "study", progress=False)
    s.output_dir.mkdir()
    fs._check_inputs(s)  # what the run cut short recorded
    fs._check_inputs(dataclasses.replace(s, resume=True, progress=True))  # how it runs may change
    with pytest.raises(BertkitError, match=r"cannot --resume in .*study: its `bertkit feature-study` run had other "
                                           r"settings \(--dropout 0.25 then, 0.5 now; --lstm-layers 2 then, 1 now\); "
                                           r"resume with the original settings"):
        fs._check_inputs(dataclasses.replace(s, resume=True, dropout=0.5, lstm_layers=1))


SHARD_BYTES = 2 * 12 * 32 * 4  # layer -1 of the tiny encoder in float32: about two lines per shard


@pytest.mark.parametrize("first, second", [(TEXTS, TEXTS[:2]), (TEXTS[:2], TEXTS), (TEXTS, TEXTS[:3] + TEXTS[:3])],
                         ids=["shards, then one file", "one file, then shards", "3 shards, then 2"])
def test_features_in_another_number_of_shards_are_the_earlier_output(tiny, tmp_path, first, second):
    """A .safetensors output is the named file or its shards: an earlier output in another number of shards is
    refused without overwrite, and replaced whole with it; read_features never mixes two outputs' lines (it read
    the earlier one-file output, or 3 + 2 shards' 11 lines, with line indices 0, 1, 2, 0, 1, 2, 3, 4, 5, 3, 4)."""
    _, model, tok = tiny
    out = tmp_path / "f.safetensors"
    earlier = fx.extract_features(model, tok, first, out, layers=[-1], batch_size=1, max_shard_bytes=SHARD_BYTES,
                                  progress=False)["files"]
    kept = {p: Path(p).read_bytes() for p in earlier}
    with pytest.raises(BertkitError, match=f"{Path(earlier[0]).name} already exists; pass --overwrite \\(overwrite=True from Python\\)"):
        fx.extract_features(model, tok, second, out, layers=[-1], batch_size=1, max_shard_bytes=SHARD_BYTES,
                            progress=False)
    assert sorted(str(p) for p in tmp_path.iterdir()) == sorted(kept) and all(
        Path(p).read_bytes() == b for p, b in kept.items())
    files = fx.extract_features(model, tok, second, out, layers=[-1], batch_size=1, max_shard_bytes=SHARD_BYTES,
                                progress=False, overwrite=True)["files"]
    assert sorted(str(p) for p in tmp_path.iterdir()) == sorted(files)
    assert [r["line_index"] for r in fx.read_features(out)] == list(range(len(second)))


def test_reading_two_outputs_shards_at_once_is_refused(tiny, tmp_path):
    """What a kill between placing the new shards and removing the earlier ones leaves: refused, naming the files."""
    _, model, tok = tiny
    fx.extract_features(model, tok, TEXTS, tmp_path / "f.safetensors", layers=[-1], batch_size=1,
                        max_shard_bytes=SHARD_BYTES, progress=False)
    fx.extract_features(model, tok, TEXTS[:2], tmp_path / "g.safetensors", layers=[-1], progress=False)
    (tmp_path / "g.safetensors").rename(tmp_path / "f.safetensors")
    with pytest.raises(BertkitError, match=r"f\.safetensors and its shards f-00001-of-00003\.safetensors, "):
        list(fx.read_features(tmp_path / "f.safetensors"))
    (tmp_path / "f.safetensors").unlink()
    (tmp_path / "f-00002-of-00003.safetensors").unlink()
    with pytest.raises(BertkitError, match=r"f-00002-of-00003\.safetensors is missing"):
        list(fx.read_features(tmp_path / "f.safetensors"))


def test_shards_of_two_extractions_in_the_same_number_are_refused_not_read_as_one(tiny, tmp_path, monkeypatch):
    """The new shards are renamed into place one by one: a kill (or Ctrl-C) between two renames of an --overwrite in
    the same number of shards left shards of both extractions under one output's names. Was: read as one output, 5
    lines with the earlier texts' states in the last shard; now refused, naming the fix."""
    _, model, tok = tiny
    out = tmp_path / "f.safetensors"
    fx.extract_features(model, tok, TEXTS, out, layers=[-1], batch_size=1, max_shard_bytes=SHARD_BYTES,
                        progress=False)
    replace, renamed = os.replace, []

    def interrupted(src, dst):  # the last shard is placed first: Ctrl-C after the first rename
        if Path(dst).name.startswith("."):  # the record of the rows written, beside the output
            return replace(src, dst)
        if renamed:
            raise KeyboardInterrupt
        renamed.append(dst)
        replace(src, dst)

    monkeypatch.setattr("bertkit.outputs.os.replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        fx.extract_features(model, tok, list(reversed(TEXTS)), out, layers=[-1], batch_size=1,
                            max_shard_bytes=SHARD_BYTES, progress=False, overwrite=True)
    monkeypatch.undo()
    assert [Path(p).name for p in renamed] == ["f-00003-of-00003.safetensors"]
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".")) == [
        f"f-0000{k}-of-00003.safetensors" for k in (1, 2, 3)]
    with pytest.raises(BertkitError, match=r"the shards of .*f\.safetensors are of 2 extractions \(f-00001-of-00003"
                                           r"\.safetensors, f-00002-of-00003\.safetensors of one, "
                                           r"f-00003-of-00003\.safetensors of another\): an overwrite of them was "
                                           r"cut short; run the extraction cut short again with --resume \(resume=True\) "
                                           r"to finish it .*, or extract again with overwrite"):
        list(fx.read_features(out))
    fx.extract_features(model, tok, list(reversed(TEXTS)), out, layers=[-1], batch_size=1,
                        max_shard_bytes=SHARD_BYTES, progress=False, overwrite=True)
    assert [r["line_index"] for r in fx.read_features(out)] == [0, 1, 2, 3, 4]


def test_an_extraction_cut_short_leaves_the_earlier_shards_whole(tiny, tmp_path, monkeypatch):
    """A failure (or a kill) while the third shard's states are computed: no shard of the earlier output has been
    replaced by this run's (the first two were, before the shards were placed together at the end)."""
    _, model, tok = tiny
    out = tmp_path / "f.safetensors"
    files = fx.extract_features(model, tok, TEXTS, out, layers=[-1], batch_size=1, max_shard_bytes=SHARD_BYTES,
                                progress=False)["files"]
    kept = {p: Path(p).read_bytes() for p in files}
    calls, run = [], fx.run_batches

    def failing(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise OSError("the process dies here")
        return run(*args, **kwargs)

    monkeypatch.setattr(fx, "run_batches", failing)
    with pytest.raises(OSError, match="dies here"):
        fx.extract_features(model, tok, list(reversed(TEXTS)), out, layers=[-1], batch_size=1,
                            max_shard_bytes=SHARD_BYTES, progress=False, overwrite=True)
    # the two shards it finished are kept beside them, for --resume (test_output_resume.py)
    assert sorted(str(p) for p in tmp_path.iterdir() if not p.name.startswith(".")) == sorted(kept)
    assert all(Path(p).read_bytes() == b for p, b in kept.items())


def test_a_users_file_named_like_a_shard_is_refused_not_removed(tiny, tmp_path):
    """overwrite=True replaces an earlier extraction's shards; a file at a shard's name that no extraction wrote is
    the user's: refused before any work, and kept."""
    _, model, tok = tiny
    out = tmp_path / "f.safetensors"
    theirs = tmp_path / "f-00009-of-00009.safetensors"
    theirs.write_bytes(b"the user's own bytes")
    with pytest.raises(BertkitError, match="f-00009-of-00009.safetensors is named as a shard of f.safetensors but is "
                                           "not one bertkit wrote"):
        fx.extract_features(model, tok, TEXTS, out, layers=[-1], batch_size=1, max_shard_bytes=SHARD_BYTES,
                            progress=False, overwrite=True)
    assert theirs.read_bytes() == b"the user's own bytes" and sorted(tmp_path.iterdir()) == [theirs]
    # at a name this run writes again (5 lines in 3 shards) it was replaced by a shard
    theirs = theirs.rename(tmp_path / "f-00002-of-00003.safetensors")
    with pytest.raises(BertkitError, match="f-00002-of-00003.safetensors is named as a shard of f.safetensors but is "
                                           "not one bertkit wrote"):
        fx.extract_features(model, tok, TEXTS, out, layers=[-1], batch_size=1, max_shard_bytes=SHARD_BYTES,
                            progress=False, overwrite=True)
    assert theirs.read_bytes() == b"the user's own bytes" and sorted(tmp_path.iterdir()) == [theirs]
    theirs.unlink()
    fx.extract_features(model, tok, TEXTS, out, layers=[-1], batch_size=1, max_shard_bytes=SHARD_BYTES,
                        progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"f-0000{k}-of-00003.safetensors" for k in (1, 2, 3)]


@pytest.mark.parametrize("int8", [False, True])
def test_safetensors_metadata_names_what_the_states_were_computed_in(tiny, tmp_path, int8):
    # an --int8 (--bf16) extraction's file said only "dtype": "float32", its storage type: read back, its states
    # passed for fp32 ones
    from safetensors import safe_open

    import bertkit._hardware
    from bertkit.quantization.quantize import quantize_int8_on_texts

    _, model, tok = tiny
    if int8:
        if bertkit._hardware.int8_kernel() is None:
            pytest.skip("this PyTorch has no int8 kernel for this CPU")
        model = quantize_int8_on_texts(model, tok, [t for t, _ in TEXTS if t], max_length=32)
    fx.extract_features(model, tok, TEXTS, tmp_path / "f.safetensors", layers=[-1], progress=False)
    with safe_open(str(tmp_path / "f.safetensors"), framework="np") as f:
        meta = f.metadata()
    assert (meta["dtype"], meta["float_dtype"], meta["quantize"]) == ("float32", "float32",
                                                                      "int8" if int8 else "null")
    if int8:
        assert meta["kernel"] == bertkit._hardware.int8_kernel().name and meta["calibration"]
