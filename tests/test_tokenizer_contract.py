"""Code written against transformers' BertTokenizerFast, run unchanged on bertkit's tokenizer.

Each test runs the same user code with both tokenizers (loaded from the same checkpoint directory) on real
SST-2 and SQuAD text and compares the results exactly: strings, ids, offsets, spans.
"""

from __future__ import annotations

import json
import shutil

import pytest

import bertkit
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


def test_a_directory_saved_by_bertkit_then_by_transformers_keeps_the_tokens_transformers_added(minilm_dir, tmp_path):
    """bertkit saves, transformers 5 loads the directory, adds tokens and saves over it (tokenizer.json and
    tokenizer_config.json only: bertkit's added_tokens.json stays, with the older tokens). transformers reads the added
    tokens of tokenizer.json and of the config's added_tokens_decoder and leaves added_tokens.json aside; bertkit took
    the stale added_tokens.json as the list of added tokens, so "btwo" (30523) was made of pieces, [18411, 12155]."""
    ours = BertTokenizer.from_pretrained(minilm_dir)
    ours.add_tokens(["aone"])
    ours.save_pretrained(tmp_path)
    ref = transformers.BertTokenizerFast.from_pretrained(tmp_path)
    ref.add_tokens(["btwo"])
    ref.add_special_tokens({"additional_special_tokens": ["<s2>"]})
    ref.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "added_tokens.json").read_text()) == {"aone": 30522}
    ref = transformers.BertTokenizerFast.from_pretrained(tmp_path)
    ours = BertTokenizer.from_pretrained(tmp_path)
    text = "aone btwo <s2> x"
    assert ours(text)["input_ids"] == ref(text)["input_ids"] == [101, 30522, 30523, 30524, 1060, 102]
    assert ours.get_added_vocab() == ref.get_added_vocab()


@pytest.mark.parametrize("source", ["added_tokens_decoder", "added_tokens.json"])
def test_added_tokens_the_files_beside_tokenizer_json_name_are_added_as_transformers_adds_them(minilm_dir, tmp_path,
                                                                                              source):
    """A tokenizer.json without the added tokens that tokenizer_config.json's added_tokens_decoder lists (a config
    edited by hand, or a tokenizer.json replaced), or, where the config has none, that added_tokens.json lists:
    transformers 5 appends them in the order of their ids; bertkit left the config's out without a word ("foo123" made
    of pieces, "<x>" split) and refused the added_tokens.json ones as special tokens missing from the vocabulary."""
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(minilm_dir / name, tmp_path / name)
    if source == "added_tokens.json":
        (tmp_path / "added_tokens.json").write_text(json.dumps({"foo123": 30523, "<x>": 30522}))
    else:
        config = json.loads((tmp_path / "tokenizer_config.json").read_text())
        flags = {"lstrip": False, "rstrip": False, "single_word": False}
        config["added_tokens_decoder"] = {**config.get("added_tokens_decoder", {}),
                                          "30522": {"content": "<x>", "normalized": False, "special": True, **flags},
                                          "30523": {"content": "foo123", "normalized": True, "special": False, **flags}}
        (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    ref = transformers.BertTokenizerFast.from_pretrained(tmp_path)
    ours = BertTokenizer.from_pretrained(tmp_path)
    text = "a FOO123 <x> b"
    assert ours(text)["input_ids"] == ref(text)["input_ids"] == [101, 1037, 30523, 30522, 1038, 102]
    assert ours.get_added_vocab() == ref.get_added_vocab()
    skip = dict(skip_special_tokens=True)
    assert ours.decode(ours(text)["input_ids"], **skip) == ref.decode(ref(text)["input_ids"], **skip)


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


def test_added_tokens_decoder_encoder_and_added_token_objects_as_transformers(minilm_dir):
    """Scripts that add ``AddedToken``s (transformers' top-level class, imported from bertkit after the port) and read
    ``added_tokens_encoder`` / ``added_tokens_decoder``: both were an AttributeError, and every AddedToken, even one at
    the options bertkit matches as transformers does, was refused."""
    ours, hf = BertTokenizer.from_pretrained(minilm_dir), transformers.BertTokenizerFast.from_pretrained(minilm_dir)
    for tok, added in ((ours, bertkit.AddedToken), (hf, transformers.AddedToken)):
        tok.add_tokens([added("[X1]"), added("Covid19"), "mrna"])  # "mrna": a WordPiece token
        tok.add_tokens(added("[S1]", special=True))  # special by its own flag
        tok.add_tokens([added("[S2]")], special_tokens=True)  # normalized left out: False once special
        tok.add_special_tokens({"additional_special_tokens": [added("<e>"), "</e>"], "pad_token": added("[P2]")})
    assert len(ours) == len(hf) == 30529 and ours.pad_token_id == hf.pad_token_id == 30526
    assert ours.added_tokens_encoder == hf.added_tokens_encoder
    assert list(ours.added_tokens_encoder)[5:] == ["mrna", "[X1]", "Covid19", "[S1]", "[S2]", "[P2]", "<e>", "</e>"]
    theirs = {i: (str(t), t.special, t.normalized, t.lstrip, t.rstrip, t.single_word)
              for i, t in hf.added_tokens_decoder.items()}
    assert {i: (str(t), t.special, t.normalized, t.lstrip, t.rstrip, t.single_word)
            for i, t in ours.added_tokens_decoder.items()} == theirs
    assert repr(ours.added_tokens_decoder[30524]) == repr(hf.added_tokens_decoder[30524]) == (
        'AddedToken("[S1]", rstrip=False, lstrip=False, single_word=False, normalized=False, special=True)')
    text = "a[X1]b COVID19 <e>x</e>[S1] [S2] [P2] mrna"
    a, b = ours(text, return_offsets_mapping=True), hf(text, return_offsets_mapping=True)
    assert a["input_ids"] == b["input_ids"] and a["offset_mapping"] == b["offset_mapping"]
    assert ours.decode(a["input_ids"], skip_special_tokens=True) == hf.decode(b["input_ids"], skip_special_tokens=True)
    # options bertkit does not match as transformers does are refused before anything is added, naming the option
    for token, flag in ((bertkit.AddedToken("[E]", lstrip=True), "lstrip=true"),
                        (transformers.AddedToken("[E]", single_word=True), "single_word=true"),
                        (bertkit.AddedToken("[E]", normalized=False), "normalized=false"),
                        (bertkit.AddedToken("[E]", special=True, normalized=True), "normalized=true")):
        with pytest.raises(bertkit.errors.BertkitError, match=rf"token '\[E\]' has {flag}, which bertkit does not"):
            ours.add_tokens(["[F]", token])
    # tokenizers' AddedToken reads normalized=True given or left out, which transformers matches otherwise once the
    # call makes it special ("[s]" is the token given normalized=True, pieces left out): refused, naming the fix
    with pytest.raises(bertkit.errors.BertkitError, match="does not say whether its normalized=True was given"):
        ours.add_tokens([transformers.AddedToken("[E]")], special_tokens=True)
    assert len(ours) == 30529


@pytest.mark.parametrize("extra_first", [True, False])
def test_add_special_tokens_gives_named_tokens_their_ids_before_the_additional_ones_as_transformers(minilm_dir,
                                                                                                    extra_first):
    """transformers 5 renames ``additional_special_tokens`` to ``extra_special_tokens`` by popping it, so its tokens
    take ids after the named ones' whatever the dict's order; bertkit followed the dict's order, so with the list first
    "<e>" took 30522 and the new cls_token 30524 (transformers: 30523, 30522), and a model's rows learned or loaded
    under one library were another token's under the other. Under transformers 5's name the list keeps its place."""
    named = {"cls_token": "[C2]", "pad_token": "[PAD]", "mask_token": "[M2]"}
    for key in ("additional_special_tokens", "extra_special_tokens"):
        extra = {key: ["<e>", "</e>"]}
        given = {**extra, **named} if extra_first else {**named, **extra}
        ours, hf = BertTokenizer.from_pretrained(minilm_dir), transformers.BertTokenizerFast.from_pretrained(minilm_dir)
        assert ours.add_special_tokens(given) == hf.add_special_tokens(given) == 4
        assert ours.get_added_vocab() == hf.get_added_vocab()
        text = "[C2] <e> Paris </e> [M2]"
        # without [CLS]/[SEP]: transformers 5 adds the old [CLS] until saved and loaded (docs/tokenizer.md)
        assert ours(text, add_special_tokens=False)["input_ids"] == hf(text, add_special_tokens=False)["input_ids"]
        expect = {"[C2]": 30522, "[M2]": 30523, "<e>": 30524, "</e>": 30525}
        if key == "extra_special_tokens" and extra_first:
            expect = {"<e>": 30522, "</e>": 30523, "[C2]": 30524, "[M2]": 30525}
        assert {t: i for t, i in ours.get_added_vocab().items() if i >= 30522} == expect


def test_an_added_token_written_with_hashes_is_a_word_of_its_own_as_transformers(minilm_dir):
    """An added token past the vocabulary that starts with "##" is cut out of the text as a word of its own; bertkit's
    word_ids read its "##" as a WordPiece continuation and joined it to the word before ("ab##xyz cd": words 0, 0, 1
    where transformers gives 0, 1, 2), so a token-classification label aligned by word_ids went to the wrong word."""
    ours, hf = BertTokenizer.from_pretrained(minilm_dir), transformers.BertTokenizerFast.from_pretrained(minilm_dir)
    texts = ["ab##xyz cd", "running##xyz", "jumpings ##xyz", "##xyz"]
    for tok in (ours, hf):
        tok.add_tokens(["##xyz"])
    a, b = ours(texts), hf(texts)
    assert a["input_ids"] == b["input_ids"]
    assert [a.word_ids(i) for i in range(len(texts))] == [b.word_ids(i) for i in range(len(texts))]
    assert a.word_ids(0) == [None, 0, 1, 2, None] and a.word_ids(2) == [None, 0, 0, 1, None]  # "##s" still joins


def test_an_added_token_passed_to_from_pretrained_or_assigned_is_its_text_as_transformers(minilm_dir):
    """``from_pretrained(dir, mask_token=AddedToken(...))`` and ``tok.pad_token = AddedToken(...)``: refused with a
    message listing the AddedToken among "missing" tokens, or saying a token the list holds is not in it."""
    for kwargs in (dict(additional_special_tokens=["<e>", "</e>"]), dict(mask_token="[M2]")):
        ours = BertTokenizer.from_pretrained(minilm_dir, **{k: [bertkit.AddedToken(t) for t in v] if isinstance(
            v, list) else bertkit.AddedToken(v, special=True) for k, v in kwargs.items()})
        hf = transformers.BertTokenizerFast.from_pretrained(minilm_dir, **{k: [transformers.AddedToken(t) for t in v]
                                                            if isinstance(v, list) else transformers.AddedToken(
                                                                v, special=True) for k, v in kwargs.items()})
        assert len(ours) == len(hf) and ours.get_added_vocab() == hf.get_added_vocab()
        text = "<e> [M2] x"
        assert ours(text)["input_ids"] == hf(text)["input_ids"]
    for tok, added in ((ours, bertkit.AddedToken), (hf, transformers.AddedToken)):
        tok.add_special_tokens({"additional_special_tokens": ["<p>"]})
        tok.pad_token = added("<p>", special=True)
    assert ours.pad_token == hf.pad_token == "<p>" and ours.pad_token_id == hf.pad_token_id == 30523
