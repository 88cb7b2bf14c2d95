"""transformers tokenizer methods ported code calls beside ``__call__``: ``tokenize`` with a pair and special tokens,
``BatchEncoding.token_to_sequence``, ``pad_token_type_id``, ``clean_up_tokenization``, against BertTokenizerFast."""

from __future__ import annotations

import json

import pytest

from bertkit import BertTokenizer
from bertkit.errors import BertkitError

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def toks(minilm_dir):
    ours, theirs = BertTokenizer.from_pretrained(minilm_dir), transformers.BertTokenizerFast.from_pretrained(minilm_dir)
    for tok in (ours, theirs):
        tok.add_tokens(["NewTok"])
    return ours, theirs


@pytest.fixture(scope="module")
def squad(data_dir):
    data = json.loads((data_dir / "squad" / "dev-v1.1.json").read_text(encoding="utf-8"))["data"]
    para = data[0]["paragraphs"][0]
    return para["qas"][0]["question"], para["context"][:200]


def test_tokenize_with_a_pair_and_special_tokens_gives_transformers_tokens(toks, squad):
    ours, theirs = toks
    question, context = squad
    assert ours.tokenize("Hello NewTok world", "x y", add_special_tokens=True) == [
        "[CLS]", "hello", "newtok", "world", "[SEP]", "x", "y", "[SEP]"]
    for args, kw in [((question, context), {}), ((question,), {"add_special_tokens": True}),
                     ((question,), {"pair": context, "add_special_tokens": True}),
                     ((question.split(), context.split()), {"is_split_into_words": True, "add_special_tokens": True}),
                     (("",), {"add_special_tokens": True})]:
        assert ours.tokenize(*args, **kw) == theirs.tokenize(*args, **kw), (args, kw)


def test_tokenize_refuses_the_truncation_transformers_ignores_there(toks, squad):
    ours, theirs = toks
    question, context = squad
    # transformers' tokenize passes truncation on to a method that takes none: the whole pair comes back
    assert len(theirs.tokenize(question, context, truncation=True, max_length=8)) > 8
    with pytest.raises(BertkitError, match=r"truncation=True.*tok\(text, pair, truncation=\.\.\."):
        ours.tokenize(question, context, truncation=True, max_length=8)
    with pytest.raises(TypeError, match="tokenize takes one str"):
        ours.tokenize([question, context], add_special_tokens=True)  # transformers gives the first row's alone


def test_token_to_sequence_matches_transformers(toks, squad):
    ours, theirs = toks
    question, context = squad
    for args, kw in [((question, context), {}), ((question,), {}), (([question, "x"], [context, "y"]), {}),
                     ((question, context), {"truncation": "only_second", "max_length": 20, "padding": "max_length",
                                            "return_overflowing_tokens": True, "stride": 4})]:
        mine, ref = ours(*args, **kw), theirs(*args, **kw)
        for row in range(len(ref.encodings)):
            got = [mine.token_to_sequence(row, t) for t in range(len(ref.encodings[row].ids))]
            assert got == [ref.token_to_sequence(row, t) for t in range(len(ref.encodings[row].ids))]
    enc = ours("Hello world", "x")
    assert [enc.token_to_sequence(t) for t in range(7)] == [None, 0, 0, None, 1, None, None]


def test_pad_token_type_id_and_clean_up_tokenization_as_transformers(toks):
    ours, theirs = toks
    assert ours.pad_token_type_id == theirs.pad_token_type_id == 0
    text = " hello , world . do n't i 'm he 's ok ?"
    assert ours.clean_up_tokenization(text) == theirs.clean_up_tokenization(text) == " hello, world. don't i'm he's ok?"


@pytest.mark.parametrize("special", [False, True])
def test_an_added_hash_hash_token_the_vocabulary_has_is_a_word_of_its_own(minilm_dir, special):
    """add_tokens(["##zz"]) (in the vocabulary: "fizz" is fi ##zz) cuts "##zz" out of the text as a word of its own in
    transformers; bertkit read its id as a continuation piece and put it in the word before it (word_ids [0, 0] for
    "hello##zz", so word_to_tokens, char_to_word and every label aligned by word_ids were off by one word after it)."""
    ours, theirs = BertTokenizer.from_pretrained(minilm_dir), transformers.BertTokenizerFast.from_pretrained(minilm_dir)
    for tok in (ours, theirs):
        tok.add_tokens(["##zz"], special_tokens=special)
    text = "hello##zz fizz x ##zz"
    mine, ref = ours(text, "a##zz", return_offsets_mapping=True), theirs(text, "a##zz", return_offsets_mapping=True)
    assert mine["input_ids"] == ref["input_ids"] == [101, 7592, 13213, 10882, 13213, 1060, 13213, 102, 1037, 13213, 102]
    assert mine.word_ids() == ref.word_ids() == [None, 0, 1, 2, 2, 3, 4, None, 0, 1, None]
    assert [mine.char_to_word(c) for c in range(len(text))] == [ref.char_to_word(c) for c in range(len(text))]
    windows = dict(truncation="only_first", max_length=7, return_overflowing_tokens=True, stride=1)
    mine, ref = ours(text, "a", **windows), theirs(text, "a", **windows)
    assert [mine.word_ids(i) for i in range(len(ref.encodings))] == [ref.word_ids(i) for i in range(len(ref.encodings))]
