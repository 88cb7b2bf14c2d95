"""What ``extract_features`` and ``read_features`` take from Python: texts as any iterable, sizes, dtypes and
paths checked before any work, and states that are no numbers (NaN, or float16 overflow) never written."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from bertkit import BertModel, BertTokenizer
from bertkit import features as fx
from bertkit.errors import BertkitError, NonFiniteError

WORDS = "[PAD] [UNK] [CLS] [SEP] [MASK] hello world the quick fox".split()
TEXTS = [("hello world", None), ("the quick fox", "hello")]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, tiny_checkpoint) -> tuple[BertModel, BertTokenizer]:
    tok = BertTokenizer({t: i for i, t in enumerate(WORDS)})
    d = tiny_checkpoint(tmp_path_factory.mktemp("tiny_encoder"), tokenizer=tok, num_hidden_layers=2)
    return BertModel.from_pretrained(d), tok


def test_texts_from_a_generator_are_all_extracted(tiny, tmp_path):
    """Was: the check of the texts used the generator up, so the file held no line (and the report said 0 lines)
    where the same texts as a list gave two."""
    model, tok = tiny
    listed = fx.extract_features(model, tok, TEXTS, tmp_path / "list.jsonl", layers=[-1], progress=False)
    generated = fx.extract_features(model, tok, (t for t in TEXTS), tmp_path / "gen.jsonl", layers=[-1],
                                    progress=False)
    assert (listed["lines"], generated["lines"], generated["tokens"]) == (2, 2, listed["tokens"])
    assert (tmp_path / "gen.jsonl").read_bytes() == (tmp_path / "list.jsonl").read_bytes()


@pytest.mark.parametrize("texts, shown", [([(None, None)], r"\(None, None\)"), ([("a", b"b")], r"\('a', b'b'\)"),
                                          ([(b"a", None)], r"\(b'a', None\)")])
def test_a_text_that_is_no_str_is_refused_by_position(tiny, tmp_path, texts, shown):
    """Was: TypeError "can only concatenate str (not "NoneType") to str" from inside the encoding."""
    model, tok = tiny
    with pytest.raises(BertkitError, match=rf"texts\[0\] is {shown}, not a \(text_a, text_b or None\) pair of str"):
        fx.extract_features(model, tok, texts, tmp_path / "f.jsonl", progress=False)
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("option, value", [("batch_size", 0), ("batch_size", -3), ("chunk_size", 0),
                                           ("max_shard_bytes", -1), ("batch_size", 2.0)])
def test_sizes_below_one_are_refused(tiny, tmp_path, option, value):
    """Was: batch_size 0 or -3 ran one line per batch without a word, chunk_size 0 failed with range()'s "arg 3 must
    not be zero", max_shard_bytes -1 wrote one shard per line."""
    model, tok = tiny
    with pytest.raises(BertkitError, match=rf"{option} {value!r} must be a whole number of at least 1"):
        fx.extract_features(model, tok, TEXTS, tmp_path / "f.safetensors", progress=False, **{option: value})
    assert not list(tmp_path.iterdir())


def test_a_numpy_dtype_is_refused_naming_the_strings(tiny, tmp_path):
    """Was: np.dtype("float16") passed the check (it equals "float16") and failed in safetensors' metadata with
    "'Float16DType' object is not an instance of 'str'"."""
    model, tok = tiny
    with pytest.raises(BertkitError, match=r"dtype dtype\('float16'\) must be 'float32' or 'float16'"):
        fx.extract_features(model, tok, TEXTS, tmp_path / "f.safetensors", dtype=np.dtype("float16"), progress=False)


def _broken(model: BertModel, value: float) -> BertModel:
    broken = BertModel(model.config)
    broken.load_state_dict(model.state_dict())
    with torch.no_grad():
        broken.encoder.layer[-1].output.LayerNorm.weight[1] = value
    return broken.eval()


@pytest.mark.parametrize("suffix", [".jsonl", ".safetensors"])
def test_states_that_are_no_numbers_are_refused_and_the_earlier_output_kept(tiny, tmp_path, suffix):
    """Was: a NaN state was written as `nan` (a .jsonl then no JSON: read_features failed with "Expecting value"),
    and float16 states past 65504 as inf, with only numpy's overflow warning."""
    model, tok = tiny
    out = tmp_path / f"f{suffix}"
    fx.extract_features(model, tok, TEXTS, out, layers=[-1], progress=False)
    before = out.read_bytes()
    with pytest.raises(NonFiniteError, match=r"line 0 \(0-based, input order\): layer -1 holds NaN or infinite "
                                             r"values: the model's weights are broken; nothing was written"):
        fx.extract_features(_broken(model, float("nan")), tok, TEXTS, out, layers=[0, -1], progress=False,
                            overwrite=True)
    with pytest.raises(NonFiniteError, match=r"line 0 \(0-based, input order\): layer -1 holds values past "
                                             r"float16's range \(largest \d\.\de\+0\d\); write float32"):
        fx.extract_features(_broken(model, 1e6), tok, TEXTS, out, layers=[-1], dtype="float16", progress=False,
                            overwrite=True)
    assert out.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == [out.name]


def test_reading_a_file_that_holds_no_features_names_it(tiny, tmp_path):
    """Was: a .txt read as safetensors ("header too large"), a model.safetensors gave KeyError 'offsets', another
    command's .jsonl KeyError 'features', a features file cut short SafetensorError."""
    model, _ = tiny
    (tmp_path / "notes.txt").write_text("hello\n")
    with pytest.raises(BertkitError, match=r"notes\.txt: read_features reads the \.jsonl or \.safetensors"):
        list(fx.read_features(tmp_path / "notes.txt"))
    model.save_pretrained(tmp_path / "ckpt")
    with pytest.raises(BertkitError, match=r"model\.safetensors holds no extracted features \(its metadata has no "
                                           "'bertkit-features'"):
        list(fx.read_features(tmp_path / "ckpt" / "model.safetensors"))
    fx.extract_features(model, BertTokenizer({t: i for i, t in enumerate(WORDS)}), TEXTS, tmp_path / "f.safetensors",
                        layers=[-1], progress=False)
    (tmp_path / "cut.safetensors").write_bytes((tmp_path / "f.safetensors").read_bytes()[:-10])  # a copy cut short
    with pytest.raises(BertkitError, match=r"cut\.safetensors cannot be read as a \.safetensors file \(.*\): a copy "
                                           "cut short"):
        list(fx.read_features(tmp_path / "cut.safetensors"))
    (tmp_path / "preds.jsonl").write_text(json.dumps({"id": 0, "label": "POSITIVE"}) + "\n")
    with pytest.raises(BertkitError, match=r"preds\.jsonl:1 is not a line of extracted features \(no 'linex_index' "
                                           "and 'features'"):
        list(fx.read_features(tmp_path / "preds.jsonl"))


def test_a_file_of_a_byte_order_mark_alone_is_an_empty_input(tmp_path):
    """Was: read as one blank line, so extracting an empty file an editor saved with a BOM wrote one record
    ([CLS] [SEP]) where the same file without it wrote none. A BOM before a line is still no part of it."""
    cases = {b"\xef\xbb\xbf": [], b"": [], b"\xef\xbb\xbf\n": [("", None)], b"\xef\xbb\xbfhi ||| there\r\n\n":
             [("hi", "there"), ("", None)]}
    for k, (raw, texts) in enumerate(cases.items()):
        (tmp_path / f"{k}.txt").write_bytes(raw)
        assert fx.read_texts(tmp_path / f"{k}.txt") == texts, raw


@pytest.mark.parametrize("value", ["false", "no"])
def test_overwrite_that_is_no_bool_is_refused_and_the_file_kept(tiny, tmp_path, value):
    """Was: overwrite="false" (a flag's text passed on) was read by its truthiness and replaced the user's file."""
    model, tok = tiny
    out = tmp_path / "f.jsonl"
    out.write_text("mine")
    with pytest.raises(BertkitError, match=rf"overwrite must be True or False, got {value!r}"):
        fx.extract_features(model, tok, TEXTS, out, layers=[-1], progress=False, overwrite=value)
    assert out.read_text() == "mine"


def test_layers_from_a_generator_are_the_layers_and_none_among_them_is_named(tiny, tmp_path):
    """Was: a generator of layers was used up by the check of its items ("give at least one layer index"), and
    [-1, None] failed with int()'s TypeError (None was the check's own sentinel for "nothing wrong")."""
    model, tok = tiny
    fx.extract_features(model, tok, TEXTS, tmp_path / "f.jsonl", layers=(i for i in (-1, 0)), progress=False)
    assert list(next(fx.read_features(tmp_path / "f.jsonl"))["layers"]) == [-1, 0]
    with pytest.raises(BertkitError, match=r"layer None in layers=\[-1, None\] is not an integer index"):
        fx.extract_features(model, tok, TEXTS, tmp_path / "g.jsonl", layers=[-1, None], progress=False)


@pytest.mark.parametrize("option, value, match", [
    ("max_seq_length", 8.0, r"max_seq_length 8\.0 must be a whole number of tokens"),
    ("max_seq_length", "8", r"max_seq_length '8' must be a whole number of tokens"),
    ("prompt", 1, r"prompt must be a str \(put before each text\), got 1"),
    ("prompt", b"query: ", r"prompt must be a str \(put before each text\), got b'query: '"),
    ("lowercase", "false", r"lowercase must be True or False, got 'false'"),
])
def test_a_length_prompt_or_lowercase_of_another_type_is_refused(tiny, tmp_path, option, value, match):
    """Was: 8.0 failed in a slice ("slice indices must be integers"), "8" in a comparison, a prompt of another type in
    a concatenation; lowercase="false" lowered every text (a cased model's states of other tokens)."""
    model, tok = tiny
    with pytest.raises(BertkitError, match=match):
        fx.extract_features(model, tok, TEXTS, tmp_path / "f.jsonl", layers=[-1], progress=False, **{option: value})
    assert not list(tmp_path.iterdir())


def test_lines_cut_at_max_seq_length_are_counted_and_warned(tiny, tmp_path, caplog):
    """Was silent (as google's script is): a line past max_seq_length lost its later tokens' states without a word.
    Kept as google cuts it (a text at its end; a pair one token at a time from its longer segment), now said."""
    model, tok = tiny
    texts = [("hello world", None), ("the quick fox " * 3, None), ("hello", "world " * 9), ("the fox", "hello")]
    with caplog.at_level("WARNING", logger="bertkit"):
        report = fx.extract_features(model, tok, texts, tmp_path / "f.jsonl", layers=[-1], max_seq_length=8,
                                     progress=False)
    assert report["lines_cut"] == 2
    assert [len(json.loads(line)["features"]) for line in (tmp_path / "f.jsonl").open()] == [4, 8, 8, 6]
    assert ("2 of the 4 lines are longer than max_seq_length 8 and were cut to it (a text at its end, a pair from its "
            "longer segment): their tokens past it have no states in the output; the longest is line 2 (0-based) with "
            "13 tokens.") in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="bertkit"):
        assert fx.extract_features(model, tok, texts, tmp_path / "g.jsonl", layers=[-1], max_seq_length=16,
                                   progress=False)["lines_cut"] == 0
    assert "were cut" not in caplog.text
