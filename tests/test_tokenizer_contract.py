"""Code written against transformers' BertTokenizerFast, run unchanged on bertkit's tokenizer.

Each test runs the same user code with both tokenizers (loaded from the same checkpoint directory) on real
SST-2 and SQuAD text and compares the results exactly: strings, ids, offsets, spans.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import bertkit
from bertkit.errors import BertkitError
from bertkit.tokenization import BertTokenizer

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def hf(minilm_dir):
    return transformers.BertTokenizerFast.from_pretrained(minilm_dir)


@pytest.fixture(scope="module")
def ours(minilm_dir):
    return BertTokenizer.from_pretrained(minilm_dir)


@pytest.fixture(scope="module")
def sentences(data_dir):
    lines = (data_dir / "glue" / "SST-2" / "dev.tsv").read_text(encoding="utf-8").splitlines()[1:201]
    return [line.split("\t")[0] for line in lines]


@pytest.fixture(scope="module")
def squad(data_dir):
    data = json.loads((data_dir / "squad" / "dev-v1.1.json").read_text(encoding="utf-8"))["data"]
    paragraphs = [p for article in data[:4] for p in article["paragraphs"]][:16]
    return [p["qas"][0]["question"] for p in paragraphs], [p["context"] for p in paragraphs]


# ---------------------------------------------------------------------------------------------------
# decode: the default keeps special tokens
# ---------------------------------------------------------------------------------------------------


def test_decode_keeps_special_tokens_by_default(ours, hf, sentences, squad):
    ids = hf(sentences[:50], padding=True)["input_ids"]  # [CLS] ... [SEP] [PAD] ...
    for row in ids:
        assert ours.decode(row) == hf.decode(row)
        assert "[CLS]" in ours.decode(row)
    assert ours.batch_decode(ids) == hf.batch_decode(ids)
    questions, contexts = squad
    pairs = hf(questions, contexts, truncation="only_second", max_length=96)["input_ids"]
    assert ours.batch_decode(pairs) == hf.batch_decode(pairs)
    masked = hf.encode(f"{sentences[0]} [MASK] and [UNK] .")
    assert ours.decode(masked) == hf.decode(masked)


@pytest.mark.parametrize("skip", [False, True])
@pytest.mark.parametrize("clean_up", [None, False, True])
def test_decode_clean_up_tokenization_spaces(ours, hf, sentences, squad, skip, clean_up):
    texts = [*sentences[:80], *squad[0], "Don't it's we're I'm they've do not , . ! ?", "isn't 'quoted' it ' s"]
    kw = dict(skip_special_tokens=skip, clean_up_tokenization_spaces=clean_up)
    for row in hf(texts)["input_ids"]:
        assert ours.decode(row, **kw) == hf.decode(row, **kw)
    assert ours.batch_decode(hf(texts)["input_ids"], **kw) == hf.batch_decode(hf(texts)["input_ids"], **kw)


def test_decode_clean_up_default_from_tokenizer_config(minilm_dir, tmp_path, hf):
    """``clean_up_tokenization_spaces`` in tokenizer_config.json sets the default, as in transformers."""
    for name in ("vocab.txt", "special_tokens_map.json"):
        (tmp_path / name).write_bytes((minilm_dir / name).read_bytes())
    config = json.loads((minilm_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({**config, "clean_up_tokenization_spaces": True}))
    ref = transformers.BertTokenizerFast.from_pretrained(tmp_path)
    tok = BertTokenizer.from_pretrained(tmp_path)
    ids = hf.encode("They don't know it's here , isn't it ?")
    assert tok.decode(ids) == ref.decode(ids) == "[CLS] they don't know it's here, isn't it? [SEP]"
    again = tmp_path / "saved"
    tok.save_pretrained(again)
    assert BertTokenizer.from_pretrained(again).decode(ids) == ref.decode(ids)


def test_never_split_in_tokenizer_config_is_ignored_as_by_the_fast_tokenizer(minilm_dir, tmp_path):
    """``never_split`` is an option of transformers' slow tokenizer only: BertTokenizerFast lower-cases and splits
    such a word like any other, and so does bertkit (which reproduces the fast tokenizer)."""
    for name in ("vocab.txt", "special_tokens_map.json"):
        (tmp_path / name).write_bytes((minilm_dir / name).read_bytes())
    config = json.loads((minilm_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({**config, "never_split": ["Cafe", "[FOO]"]}))
    ref = transformers.BertTokenizerFast.from_pretrained(tmp_path)
    text = "Cafe [FOO] x[FOO]"
    assert BertTokenizer.from_pretrained(tmp_path)(text, return_offsets_mapping=True) == dict(
        ref(text, return_offsets_mapping=True))
    assert BertTokenizer.from_pretrained(tmp_path).tokenize("Cafe [FOO]") == ["cafe", "[", "foo", "]"]


def test_fill_mask_token_str_is_the_token(minilm_dir, hf):
    """The fill-mask pipeline's ``token_str`` is ``decode([id])``; its ``sequence`` drops [CLS]/[SEP]."""
    ours = BertTokenizer.from_pretrained(minilm_dir)
    assert ours.decode([ours.sep_token_id]) == hf.decode([ours.sep_token_id]) == "[SEP]"
    assert ours.decode([ours.cls_token_id, 7592, ours.sep_token_id], skip_special_tokens=True) == "hello"


# ---------------------------------------------------------------------------------------------------
# Names: BertTokenizerFast, AutoTokenizer
# ---------------------------------------------------------------------------------------------------


def test_bert_tokenizer_fast_is_the_tokenizer(minilm_dir, hf, sentences):
    from bertkit.tokenization import BertTokenizerFast

    assert bertkit.BertTokenizerFast is BertTokenizerFast is BertTokenizer
    tok = bertkit.BertTokenizerFast.from_pretrained(minilm_dir)
    assert tok(sentences, padding=True)["input_ids"] == hf(sentences, padding=True)["input_ids"]


def test_auto_tokenizer_loads_a_bert_directory(minilm_dir, sentences, squad):
    from bertkit.tokenization import AutoTokenizer

    assert bertkit.AutoTokenizer is AutoTokenizer
    ours, ref = AutoTokenizer.from_pretrained(minilm_dir), transformers.AutoTokenizer.from_pretrained(minilm_dir)
    assert isinstance(ours, BertTokenizer)
    questions, contexts = squad
    kw = dict(truncation="only_second", max_length=128, padding=True, return_offsets_mapping=True)
    a, b = ours(questions, contexts, **kw), ref(questions, contexts, **kw)
    assert a["input_ids"] == b["input_ids"] and a["offset_mapping"] == [[tuple(o) for o in r] for r in b["offset_mapping"]]
    assert ours(sentences)["input_ids"] == ref(sentences)["input_ids"]
    assert AutoTokenizer.from_pretrained(minilm_dir, use_fast=True).vocab_size == 30522


def _tokenizer_dir(root, minilm_dir, tokenizer_config=None, config=None):
    root.mkdir()
    (root / "vocab.txt").write_bytes((minilm_dir / "vocab.txt").read_bytes())
    if tokenizer_config is not None:
        (root / "tokenizer_config.json").write_text(json.dumps(tokenizer_config), encoding="utf-8")
    if config is not None:
        (root / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return root


def test_auto_tokenizer_refuses_other_tokenizers_naming_them(minilm_dir, tmp_path):
    from bertkit import AutoTokenizer

    cases = [
        ({"tokenizer_class": "RobertaTokenizer", "do_lower_case": False}, None, "tokenizer_class 'RobertaTokenizer'"),
        ({"tokenizer_class": "RobertaTokenizerFast"}, {"model_type": "bert"}, "'RobertaTokenizerFast'"),
        ({"do_lower_case": True}, {"model_type": "roberta"}, "model_type 'roberta'"),
        ({"do_lower_case": True}, {"model_type": "bert", "tokenizer_class": "XLMRobertaTokenizer"},
         "config.json names tokenizer_class 'XLMRobertaTokenizer'"),
        ({"do_lower_case": True}, None, "does not say which tokenizer it holds"),
    ]
    for n, (tokenizer_config, config, message) in enumerate(cases):
        d = _tokenizer_dir(tmp_path / str(n), minilm_dir, tokenizer_config, config)
        with pytest.raises(ValueError, match=message):
            AutoTokenizer.from_pretrained(d)
    # tokenizer_config.json's tokenizer_class decides first, as in transformers.
    d = _tokenizer_dir(tmp_path / "bert", minilm_dir, {"tokenizer_class": "BertTokenizerFast", "do_lower_case": True},
                       {"model_type": "roberta"})
    assert AutoTokenizer.from_pretrained(d)("Hello")["input_ids"] == [101, 7592, 102]
    with pytest.raises(ValueError, match="use_fast=False"):
        AutoTokenizer.from_pretrained(minilm_dir, use_fast=False)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        AutoTokenizer.from_pretrained(tmp_path / "absent")


# ---------------------------------------------------------------------------------------------------
# The encoding: tokens, char_to_token, token_to_chars, word_to_tokens
# ---------------------------------------------------------------------------------------------------


def _assert_same_maps(a, b, texts_a, texts_b=None):
    """Every row's tokens, and every char / token / word index of both texts through the six maps (token_to_word,
    char_to_word and word_to_chars raised AttributeError before)."""
    rows = len(a["input_ids"])
    mapping = b["overflow_to_sample_mapping"] if "overflow_to_sample_mapping" in b else range(rows)
    assert a.data.keys() == b.data.keys()
    for i in range(rows):
        assert a.tokens(i) == b.tokens(i)
        n = len(b.tokens(i))
        for t in range(n + 2):
            assert a.token_to_chars(i, t) == b.token_to_chars(i, t), (i, t)
        for t in range(n):
            assert a.token_to_word(i, t) == b.token_to_word(i, t), (i, t)
        for s, texts in ((0, texts_a), (1, texts_b)):
            length = len(texts[mapping[i]]) if texts is not None else 40
            for c in range(length + 2):
                assert a.char_to_token(i, c, sequence_index=s) == b.char_to_token(i, c, sequence_index=s), (i, s, c)
                assert a.char_to_word(i, c, sequence_index=s) == b.char_to_word(i, c, sequence_index=s), (i, s, c)
            words = max((w for w in b.word_ids(i) if w is not None), default=0)
            for w in range(words + 2):
                assert a.word_to_tokens(i, w, s) == b.word_to_tokens(i, w, s), (i, s, w)
                try:
                    want = b.word_to_chars(i, w, s)
                except TypeError:  # transformers 5 fails on a word the text lacks (CharSpan(*None)); None here
                    want = None
                assert a.word_to_chars(i, w, s) == want, (i, s, w)


@pytest.mark.parametrize("offsets", [False, True])
def test_encoding_maps_on_sst2(ours, hf, sentences, offsets):
    batch = sentences[:40]
    a = ours(batch, padding=True, return_offsets_mapping=offsets)
    b = hf(batch, padding=True, return_offsets_mapping=offsets)
    _assert_same_maps(a, b, batch)
    # One text: the one-argument forms read row 0; tensors too.
    for kw in ({}, {"return_tensors": "pt"}, {"add_special_tokens": False}):
        a, b = ours(sentences[7], **kw), hf(sentences[7], **kw)
        assert a.tokens() == b.tokens()
        assert [a.char_to_token(c) for c in range(len(sentences[7]) + 1)] == [
            b.char_to_token(c) for c in range(len(sentences[7]) + 1)]
        assert [a.token_to_chars(t) for t in range(len(b.tokens()))] == [
            b.token_to_chars(t) for t in range(len(b.tokens()))]
        assert [a.word_to_tokens(w) for w in range(12)] == [b.word_to_tokens(w) for w in range(12)]


@pytest.mark.parametrize("offsets", [False, True])
def test_encoding_maps_on_squad_windows(ours, hf, squad, offsets):
    """Question + context windows, as SQuAD featurization uses them: char_to_token(i, c, sequence_index=1)."""
    questions, contexts = squad
    questions, contexts = questions[:6], contexts[:6]
    kw = dict(truncation="only_second", max_length=160, stride=32, return_overflowing_tokens=True,
              padding="max_length", return_offsets_mapping=offsets)
    a, b = ours(questions, contexts, **kw), hf(questions, contexts, **kw)
    assert len(a["input_ids"]) > len(questions)
    _assert_same_maps(a, b, questions, contexts)


def test_encoding_maps_on_split_words(ours, hf, sentences):
    words = [s.split() for s in sentences[:10]]
    a = ours(words, is_split_into_words=True, padding=True)
    b = hf(words, is_split_into_words=True, padding=True)
    _assert_same_maps(a, b, None)


def test_encoding_maps_survive_pickling(ours, hf, sentences):
    """A BatchEncoding sent to a DataLoader worker (pickled) still maps tokens to characters."""
    import pickle

    a, b = pickle.loads(pickle.dumps(ours(sentences[:3]))), hf(sentences[:3])
    assert [a.char_to_token(2, c) for c in range(30)] == [b.char_to_token(2, c) for c in range(30)]
    assert a.tokens(1) == b.tokens(1) and a.word_ids(1) == b.word_ids(1)


def test_encoding_map_index_errors(ours, sentences):
    enc = ours(sentences[:2])
    with pytest.raises(ValueError, match="char_index must be an int >= 0, got -1"):
        enc.char_to_token(0, -1)
    with pytest.raises(ValueError, match="word_index must be an int >= 0"):
        enc.word_to_tokens(-2)
    with pytest.raises(ValueError, match="needs the tokenizer's own output"):
        ours.pad(enc).char_to_token(0, 1)


# ---------------------------------------------------------------------------------------------------
# Vocabulary and call arguments
# ---------------------------------------------------------------------------------------------------


def test_get_vocab_and_convert_tokens_to_string(ours, hf, sentences, squad):
    assert ours.get_vocab() == hf.get_vocab()
    ours.get_vocab()["[new]"] = 1  # a copy
    assert "[new]" not in ours.vocab
    for text in [*sentences[:60], *squad[1][:4]]:
        tokens = hf.tokenize(text)
        assert ours.convert_tokens_to_string(tokens) == hf.convert_tokens_to_string(tokens)
    for tokens in (["##ing", "the", "##s", "[CLS]", "do", "not", "'", "s", "?"], []):
        assert ours.convert_tokens_to_string(tokens) == hf.convert_tokens_to_string(tokens)


def _plain(enc):
    return {k: v.tolist() if hasattr(v, "tolist") else v for k, v in enc.items()}


@pytest.mark.parametrize("return_tensors", [None, "pt", "np"])
def test_return_flags(ours, hf, sentences, squad, return_tensors):
    questions, contexts = squad
    calls = [((sentences[3],), {}), ((sentences[:9],), {"padding": True}),
             ((questions[:4], contexts[:4]), {"truncation": "only_second", "max_length": 64, "padding": "max_length"}),
             ((questions[:2], contexts[:2]), {"truncation": "only_second", "max_length": 64, "stride": 8,
                                               "return_overflowing_tokens": True, "padding": True})]
    for args, kw in calls:
        for mask in (None, True, False):
            for types in (None, True, False):
                for length in (False, True):
                    flags = dict(return_attention_mask=mask, return_token_type_ids=types, return_length=length,
                                 return_tensors=return_tensors, **kw)
                    a, b = ours(*args, **flags), hf(*args, **flags)
                    assert _plain(a) == _plain(b), flags


def test_a_list_of_pairs_is_a_batch_of_pairs(ours, hf, squad):
    """tokenizer([[query, passage], ...]) as rerankers' model cards call it (BGE's): each inner pair is (text,
    text_pair). bertkit refused it, hinting is_split_into_words=True, which reads each pair as one text's words."""
    assert ours([["what is panda?", "hi"]])["input_ids"] == [[101, 2054, 2003, 25462, 1029, 102, 7632, 102]]
    assert ours([("what is panda?", "hi")])["token_type_ids"] == [[0, 0, 0, 0, 0, 0, 1, 1]]
    questions, contexts = squad
    pairs = [[q, c] for q, c in zip(questions, contexts)] + [("a", ""), ("", "b")]
    for kw in ({"padding": True, "truncation": True, "max_length": 64, "return_tensors": "pt"},
               {"truncation": "only_second", "max_length": 48, "stride": 8, "return_overflowing_tokens": True,
                "return_offsets_mapping": True}):
        a, b = ours(pairs, **kw), hf(pairs, **kw)
        assert _plain(a) == _plain(b)
        assert [a.sequence_ids(i) for i in range(len(b["input_ids"]))] == [
            b.sequence_ids(i) for i in range(len(b["input_ids"]))]


def test_a_batch_may_mix_texts_and_pairs_as_in_transformers(ours, hf, squad):
    """[text, (text, text_pair), [text, text_pair]]: each entry is one row, a pair where it is one. bertkit refused the
    batch, naming the tuple as if a list of pairs were not accepted."""
    assert ours(["who won?", ("who won?", "the panthers")])["token_type_ids"] == [[0, 0, 0, 0, 0],
                                                                                 [0, 0, 0, 0, 0, 1, 1, 1]]
    questions, contexts = squad
    mixed = [questions[0], (questions[1], contexts[1]), [questions[2], ""], contexts[3]]
    for kw in ({}, {"padding": True, "truncation": True, "max_length": 64, "return_tensors": "pt",
                    "return_offsets_mapping": True}):
        a, b = ours(mixed, **kw), hf(mixed, **kw)
        assert _plain(a) == _plain(b)
        assert [a.sequence_ids(i) for i in range(4)] == [b.sequence_ids(i) for i in range(4)]


# ---------------------------------------------------------------------------------------------------
# A directory saved by transformers 5: tokenizer.json + tokenizer_config.json, no vocab.txt
# ---------------------------------------------------------------------------------------------------


def _json_only_dir(root, minilm_dir, tokenizer_json=None, **config_changes):
    root.mkdir()
    data = json.loads((minilm_dir / "tokenizer.json").read_text(encoding="utf-8"))
    (root / "tokenizer.json").write_text(json.dumps(tokenizer_json(data) if tokenizer_json else data),
                                         encoding="utf-8")
    config = json.loads((minilm_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    (root / "tokenizer_config.json").write_text(json.dumps({**config, **config_changes}), encoding="utf-8")
    return root


def test_loads_tokenizer_json_without_vocab_txt(minilm_dir, tmp_path, sentences, squad):
    d = _json_only_dir(tmp_path / "tok", minilm_dir)
    ours, ref = BertTokenizer.from_pretrained(d), transformers.BertTokenizerFast.from_pretrained(d)
    assert len(ours) == len(ref) == 30522 and ours.get_vocab() == ref.get_vocab()
    kw = dict(return_offsets_mapping=True, padding=True)
    a, b = ours(sentences, **kw), ref(sentences, **kw)
    assert a["input_ids"] == b["input_ids"]
    assert a["offset_mapping"] == [[tuple(o) for o in r] for r in b["offset_mapping"]]
    questions, contexts = squad
    kw = dict(truncation="only_second", max_length=192, return_offsets_mapping=True)
    a, b = ours(questions, contexts, **kw), ref(questions, contexts, **kw)
    assert a["input_ids"] == b["input_ids"] and a["token_type_ids"] == b["token_type_ids"]
    assert a["offset_mapping"] == [[tuple(o) for o in r] for r in b["offset_mapping"]]
    assert ours.batch_decode(a["input_ids"]) == ref.batch_decode(b["input_ids"])
    # What bertkit saves from it loads again (vocab.txt this time), and AutoTokenizer takes the directory.
    ours.save_pretrained(tmp_path / "saved")
    assert BertTokenizer.from_pretrained(tmp_path / "saved")(sentences)["input_ids"] == ref(sentences)["input_ids"]
    assert bertkit.AutoTokenizer.from_pretrained(d)(sentences)["input_ids"] == ref(sentences)["input_ids"]


def test_loads_what_transformers_5_saves_with_added_tokens(minilm_dir, tmp_path, sentences):
    ref = transformers.BertTokenizerFast.from_pretrained(minilm_dir)
    ref.add_tokens(["covid19", "mrna-1273"])
    ref.add_special_tokens({"additional_special_tokens": ["[ENT]"]})
    ref.save_pretrained(tmp_path)
    assert not (tmp_path / "vocab.txt").exists()
    ref = transformers.BertTokenizerFast.from_pretrained(tmp_path)
    ours = BertTokenizer.from_pretrained(tmp_path)
    assert len(ours) == len(ref) == 30525 and ours.all_special_tokens == ref.all_special_tokens
    texts = [f"COVID19 and mrna-1273: [ENT] {s}[ENT]covid19x" for s in sentences[:30]]
    a, b = ours(texts, return_offsets_mapping=True), ref(texts, return_offsets_mapping=True)
    assert a["input_ids"] == b["input_ids"]
    assert a["offset_mapping"] == [[tuple(o) for o in r] for r in b["offset_mapping"]]
    assert ours.batch_decode(a["input_ids"], skip_special_tokens=True) == ref.batch_decode(
        b["input_ids"], skip_special_tokens=True)


def test_an_added_token_of_tokenizer_json_is_not_made_from_a_words_pieces(minilm_dir, tmp_path):
    """tokenizer.json keeps added tokens out of its WordPiece model: the special token "newtok" is matched exactly,
    so an uncased "NEWTOK" stays newt ##ok (bertkit's WordPiece, given every token, made the special token of it)."""
    ref = transformers.BertTokenizerFast.from_pretrained(minilm_dir)
    ref.add_special_tokens({"additional_special_tokens": ["newtok"]})
    ref.save_pretrained(tmp_path)
    ref = transformers.BertTokenizerFast.from_pretrained(tmp_path)
    ours = BertTokenizer.from_pretrained(tmp_path)
    text = "NEWTOK Newtok newtok"
    assert ours(text)["input_ids"] == ref(text)["input_ids"] == [101, 25597, 6559, 25597, 6559, 30522, 102]


def test_every_special_token_of_tokenizer_json_is_cut_out_as_transformers_does(minilm_dir, tmp_path):
    """A transformers 5 tokenizer saved after cls_token was replaced (with extra special tokens listed) keeps the old
    [CLS] as a special token of tokenizer.json: transformers cuts it out of the text (id 101) and decode skips it;
    bertkit took only the config's list as the extra special tokens and split it into [ cls ]."""
    ref = transformers.BertTokenizerFast.from_pretrained(minilm_dir)
    ref.add_special_tokens({"cls_token": "[unused2]", "additional_special_tokens": ["[ENT]"]})
    ref.save_pretrained(tmp_path)
    ref = transformers.BertTokenizerFast.from_pretrained(tmp_path)
    ours = BertTokenizer.from_pretrained(tmp_path)
    text = "a [CLS] b [ENT] [PAD] c"
    ids = ours(text)["input_ids"]
    assert ids == ref(text)["input_ids"] == [3, 1037, 101, 1038, 30522, 0, 1039, 102]
    assert ours.decode(ids, skip_special_tokens=True) == ref.decode(ids, skip_special_tokens=True) == "a b c"


@pytest.mark.parametrize("layout", ["added_tokens.json", "added_tokens_decoder"])
def test_added_tokens_past_vocab_txt_load_as_in_transformers(minilm_dir, tmp_path, layout):
    """transformers 4 keeps a tokenizer's added tokens out of vocab.txt: in added_tokens.json ({token: id}, with
    special_tokens_map.json naming the special ones) or, from 4.34, in tokenizer_config.json's added_tokens_decoder.
    bertkit refused the first ("the vocabulary lacks the special tokens") and ignored the second, splitting "[E1]"
    into [ e ##1 ] where transformers gives it id 30522."""
    (tmp_path / "vocab.txt").write_bytes((minilm_dir / "vocab.txt").read_bytes())
    config = json.loads((minilm_dir / "tokenizer_config.json").read_text())
    if layout == "added_tokens.json":
        (tmp_path / "added_tokens.json").write_text(json.dumps({"[E1]": 30522, "[ENT]": 30523}))
        (tmp_path / "special_tokens_map.json").write_text(json.dumps({"additional_special_tokens": ["[ENT]"]}))
    else:
        entry = {"lstrip": False, "rstrip": False, "single_word": False}
        config["added_tokens_decoder"] = {
            "0": {**entry, "content": "[PAD]", "normalized": False, "special": True},
            "30522": {**entry, "content": "[E1]", "normalized": True, "special": False},
            "30523": {**entry, "content": "[ENT]", "normalized": False, "special": True}}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    ref = transformers.BertTokenizerFast.from_pretrained(tmp_path)
    ours = BertTokenizer.from_pretrained(tmp_path)
    text = "x [E1] y [ENT] z unaffable"
    assert len(ours) == len(ref) == 30524
    ids = ours(text)["input_ids"]
    assert ids == ref(text)["input_ids"] == [101, 1060, 30522, 1061, 30523, 1062, 14477, 20961, 3468, 102]
    if layout == "added_tokens_decoder":  # (transformers 5 reads special_tokens_map.json's list as plain tokens)
        assert ours.decode(ids, skip_special_tokens=True) == ref.decode(ids, skip_special_tokens=True) == \
            "x [e1] y z unaffable"


def test_tokenizer_json_refusals_name_the_value(minilm_dir, tmp_path):
    def bpe(data):
        return {**data, "model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}}

    def prefix(data):
        return {**data, "model": {**data["model"], "continuing_subword_prefix": "@@"}}

    def normalizer(data):
        return {**data, "normalizer": {"type": "NFKC"}}

    for n, (edit, message) in enumerate([(bpe, "model.type is 'BPE', not 'WordPiece'"),
                                         (prefix, "model.continuing_subword_prefix is '@@', not '##'"),
                                         (normalizer, "normalizer.type is 'NFKC', not 'BertNormalizer'")]):
        with pytest.raises(ValueError, match=message):
            BertTokenizer.from_pretrained(_json_only_dir(tmp_path / str(n), minilm_dir, edit))
    # The config and tokenizer.json disagree on casing: the config wins, as in transformers 5.
    d = _json_only_dir(tmp_path / "cased", minilm_dir, do_lower_case=False)
    ref = transformers.BertTokenizerFast.from_pretrained(d)
    ours = BertTokenizer.from_pretrained(d)
    assert not ours.do_lower_case
    assert ours("Hello World, hello world")["input_ids"] == ref("Hello World, hello world")["input_ids"]
    with pytest.raises(FileNotFoundError, match="nor tokenizer.json"):
        BertTokenizer.from_pretrained(_empty(tmp_path / "none"))


def _empty(root):
    root.mkdir()
    (root / "tokenizer_config.json").write_text('{"do_lower_case": true}', encoding="utf-8")
    return root


def test_special_token_counts_maps_and_the_added_vocabulary_as_transformers(minilm_dir):
    """run_mlm's and run_qa's arithmetic (num_special_tokens_to_add, max_len_single_sentence) and the maps of
    special and added tokens, before and after adding tokens: AttributeError before."""
    ours, hf = BertTokenizer.from_pretrained(minilm_dir), transformers.BertTokenizerFast.from_pretrained(minilm_dir)
    for _ in range(2):
        assert ours.special_tokens_map == hf.special_tokens_map
        assert ours.get_added_vocab() == hf.get_added_vocab()
        assert list(ours.get_added_vocab()) == list(hf.get_added_vocab())
        for pair in (False, True):
            assert ours.num_special_tokens_to_add(pair=pair) == hf.num_special_tokens_to_add(pair=pair)
        assert (ours.max_len_single_sentence, ours.max_len_sentences_pair) == \
            (hf.max_len_single_sentence, hf.max_len_sentences_pair) == (510, 509)
        for tok in (ours, hf):
            tok.add_tokens(["[E1]", "hello"])
            tok.add_special_tokens({"additional_special_tokens": ["<x>"]})
    assert list(ours.get_added_vocab().values())[-3:] == [7592, 30522, 30523]


def test_vocab_size_leaves_out_added_tokens_as_transformers(minilm_dir, tmp_path):
    """``vocab_size`` is the WordPiece vocabulary's size and ``len(tok)`` counts the added tokens too: code that
    finds the new rows as ``range(tok.vocab_size, len(tok))`` (to initialise their embeddings) got an empty range,
    as bertkit's vocab_size followed add_tokens."""
    ours, hf = BertTokenizer.from_pretrained(minilm_dir), transformers.BertTokenizerFast.from_pretrained(minilm_dir)
    for tok in (ours, hf):
        tok.add_tokens(["covid19", "hello"])  # "hello" is in the vocabulary already: no new id
        tok.add_special_tokens({"additional_special_tokens": ["[E1]"]})
    assert (ours.vocab_size, len(ours)) == (hf.vocab_size, len(hf)) == (30522, 30524)
    # what either library saves reads back as transformers reads it (bertkit writes the added tokens into
    # vocab.txt, so there they are the vocabulary's)
    for name, tok in (("ours", ours), ("hf", hf)):
        tok.save_pretrained(tmp_path / name)
        again, ref = BertTokenizer.from_pretrained(tmp_path / name), transformers.BertTokenizerFast.from_pretrained(
            tmp_path / name)
        assert (again.vocab_size, len(again)) == (ref.vocab_size, len(ref))
    assert BertTokenizer.from_pretrained(tmp_path / "hf").vocab_size == 30522


# ---------------------------------------------------------------------------------------------------
# call keywords: values transformers takes (numpy lengths, 0 for False), refusals that name the value
# ---------------------------------------------------------------------------------------------------


def test_windows_whose_max_length_is_below_the_special_tokens_are_refused_naming_them(ours, hf, sentences):
    # max_length 1 with windows: the refusal said "stride 0 is more than the -1 tokens a window ... holds"
    kw = dict(truncation="only_first", max_length=1, return_overflowing_tokens=True)
    assert [len(row) for row in hf(sentences[0], **kw)["input_ids"]] == [12]  # past max_length, not cut
    with pytest.raises(BertkitError, match="max_length 1 is smaller than the 2 special tokens each window gets; "
                                           "use max_length > 2"):
        ours(sentences[0], **kw)


def test_lengths_computed_with_numpy_or_torch_are_taken_as_transformers_takes_them(ours, hf, sentences):
    # max_length=np.max(lengths) (numpy's int64) or a 0-d tensor: refused as "not an int" where transformers cuts there
    for value in (np.int64(8), torch.tensor(8)):
        kw = dict(truncation=True, max_length=value)
        assert ours(sentences[:4], **kw)["input_ids"] == hf(sentences[:4], **kw)["input_ids"]
        windows = dict(stride=np.int64(2), return_overflowing_tokens=True, **kw)
        assert ours(sentences[:4], **windows)["input_ids"] == hf(sentences[:4], **windows)["input_ids"]
        padded = ours.pad(ours(sentences[:2]), padding="max_length", max_length=value + 32)
        assert padded["input_ids"] == hf.pad(hf(sentences[:2]), padding="max_length", max_length=value + 32)["input_ids"]
    assert ours(sentences[0], truncation=True, max_length=np.int64(8))["input_ids"] == [
        101, 2009, 1005, 1055, 1037, 11951, 1998, 2411, 102][:7] + [102]
    for bad in (8.0, "8", torch.tensor(8.0)):  # refused naming it, as before
        with pytest.raises(BertkitError, match="max_length must be an int"):
            ours(sentences[0], truncation=True, max_length=bad)
    with pytest.raises(BertkitError, match="stride must be an int .* got str '2'"):  # was a TypeError from '<'
        ours(sentences[0], stride="2")


def test_return_token_type_ids_0_leaves_the_key_out_as_false_does(ours, hf, sentences):
    # transformers reads 0 as False; bertkit tested `is False` and returned token_type_ids anyway
    for key in ("return_token_type_ids", "return_attention_mask"):
        a, b = ours(sentences[:2], sentences[2:4], **{key: 0}), hf(sentences[:2], sentences[2:4], **{key: 0})
        assert sorted(a) == sorted(b) == sorted({"input_ids", "token_type_ids", "attention_mask"} - {key[7:]})
        assert a["input_ids"] == b["input_ids"]


def test_pad_of_a_dict_of_per_example_tensors_reads_them_as_the_list_of_examples(ours, hf):
    # {"input_ids": [tensor, tensor], "labels": [tensor, tensor]} (a datasets batch with format "torch"): uneven
    # labels failed with numpy's "inhomogeneous shape", where the same examples as a list named the column
    rows = [([101, 1037, 1038, 102], [-100, 3, 4, -100]), ([101, 102], [-100, -100])]
    columns = {"input_ids": [torch.tensor(i) for i, _ in rows], "labels": [torch.tensor(y) for _, y in rows]}
    with pytest.raises(BertkitError, match=r"'labels' has rows of 2\.\.4 values.*-100"):
        ours.pad(columns, return_tensors="pt")
    with pytest.raises(ValueError, match="labels"):
        hf.pad(dict(columns), return_tensors="pt")
    columns["labels"] = [torch.tensor(1), torch.tensor(0)]
    a, b = ours.pad(columns, return_tensors="pt"), hf.pad(dict(columns), return_tensors="pt")
    assert a["input_ids"].tolist() == b["input_ids"].tolist() == [[101, 1037, 1038, 102], [101, 102, 0, 0]]
    assert a["attention_mask"].tolist() == b["attention_mask"].tolist() == [[1, 1, 1, 1], [1, 1, 0, 0]]
    assert a["labels"].tolist() == b["labels"].tolist() == [1, 0] and a["labels"].dtype == b["labels"].dtype


def test_verbose_and_pads_return_attention_mask_are_taken_as_transformers_takes_them(ours, hf, sentences):
    # tokenizer(texts, verbose=False) and pad(..., return_attention_mask=False), common in ported scripts, were
    # TypeErrors; pad then makes no mask for examples that have none, as transformers' pad
    for kwargs in ({}, {"padding": True, "return_tensors": "pt"}):
        a, b = ours(sentences[:3], verbose=False, **kwargs), hf(sentences[:3], verbose=False, **kwargs)
        assert sorted(a) == sorted(b) and all(torch.as_tensor(a[k]).tolist() == torch.as_tensor(b[k]).tolist()
                                              if kwargs else a[k] == b[k] for k in a)
    assert ours.encode(sentences[0], verbose=False) == hf.encode(sentences[0], verbose=False)
    examples = [{"input_ids": [101, 1037, 1038, 102]}, {"input_ids": [101, 102]}]
    for wanted in (None, True, False):
        a = ours.pad(examples, return_attention_mask=wanted, verbose=False)
        b = hf.pad(examples, return_attention_mask=wanted, verbose=False)
        assert dict(a) == dict(b)
        assert ("attention_mask" in a) is (wanted is not False)


def test_batch_encoding_is_fast_and_n_sequences_as_transformers(hf, ours, sentences):
    """``enc.is_fast`` and ``enc.n_sequences`` were AttributeErrors."""
    calls = [((sentences[0],), {}), ((sentences[:3],), {}), ((sentences[0], sentences[1]), {}),
             ((sentences[:2], sentences[2:4]), {"padding": True, "return_tensors": "pt"}),
             ((sentences[:2],), {"truncation": True, "max_length": 8, "return_overflowing_tokens": True})]
    for args, kwargs in calls:
        theirs, mine = hf(*args, **kwargs), ours(*args, **kwargs)
        assert (mine.is_fast, mine.n_sequences) == (theirs.is_fast, theirs.n_sequences), (args, kwargs)
    padded = [hf.pad([hf(sentences[0])]), ours.pad([ours(sentences[0])])]
    assert [(p.is_fast, p.n_sequences) for p in padded] == [(False, None), (False, None)]
