"""Unit tests of bertkit.tokenization on a tiny hand-written vocabulary: exact tokens, ids and offsets.

Parity with Hugging Face on real data is in test_tokenizer_parity.py.
"""

from __future__ import annotations

import json
import pickle
import re
import threading
from pathlib import Path

import pytest

from bertkit.errors import BertkitError
from bertkit.tokenization import BasicTokenizer, BertTokenizer, WordPiece, load_vocab

TOKENS = [
    "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]",                     # 0-4
    "un", "##aff", "##able", "hello", "world", ",", "!", ".", "'",    # 5-13
    "a", "##a", "b", "##b", "cafe", "café", "Cafe", "中", "文", "s",   # 14-23
    "the", "cat", "sat", "on", "mat", "x", "y", "z", "[", "]", "mask",  # 24-34
    "οδοσ", "##s", "don", "t", "it", "?",                              # 35-40
]  # fmt: skip
VOCAB = {t: i for i, t in enumerate(TOKENS)}


@pytest.fixture
def tok() -> BertTokenizer:
    return BertTokenizer(VOCAB, do_lower_case=True)


def ids(*tokens: str) -> list[int]:
    return [VOCAB[t] for t in tokens]


# ----------------------------------------------------------------------------------------------------
# Basic tokenizer
# ----------------------------------------------------------------------------------------------------


def test_basic_lower_case_strips_accents_and_splits_punctuation() -> None:
    assert BasicTokenizer(do_lower_case=True).tokenize("Héllo, WÖRLD!") == ["hello", ",", "world", "!"]
    assert BasicTokenizer(do_lower_case=False).tokenize("Héllo, WÖRLD!") == ["Héllo", ",", "WÖRLD", "!"]


def test_basic_strip_accents_independent_of_case() -> None:
    assert BasicTokenizer(do_lower_case=False, strip_accents=True).tokenize("Café") == ["Cafe"]
    assert BasicTokenizer(do_lower_case=True, strip_accents=False).tokenize("Café") == ["café"]


def test_basic_clean_up() -> None:
    basic = BasicTokenizer()
    # NUL, U+FFFD and control/format characters vanish without splitting; whitespace of any kind splits.
    assert basic.tokenize("a\x00b\ufffdc\x07d\u200be\x1cf") == ["abcdef"]
    assert basic.tokenize("a\u3000b\tc\u00a0d\u2028e\nf") == ["a", "b", "c", "d", "e", "f"]
    assert basic.tokenize(" \t\n ") == []
    assert basic.tokenize("") == []


def test_basic_punctuation_includes_ascii_symbols() -> None:
    # BERT counts every non-alphanumeric ASCII printable as punctuation, plus Unicode P*.
    assert BasicTokenizer().tokenize("$5+3=8 a–b «c»") == [
        "$",
        "5",
        "+",
        "3",
        "=",
        "8",
        "a",
        "–",
        "b",
        "«",
        "c",
        "»",
    ]


def test_basic_cjk_characters_are_split() -> None:
    assert BasicTokenizer().tokenize("中文abc") == ["中", "文", "abc"]
    assert BasicTokenizer(tokenize_chinese_chars=False).tokenize("中文abc") == ["中文abc"]
    # Hangul and kana are not in the CJK ideograph blocks: kept as words.
    assert BasicTokenizer(do_lower_case=False).tokenize("한국어 テスト") == ["한국어", "テスト"]


def test_basic_lower_cases_character_by_character() -> None:
    # A final capital sigma becomes σ, not ς (as BertTokenizerFast; str.lower() would give ς).
    assert BasicTokenizer().tokenize("ΟΔΟΣ") == ["οδοσ"]
    # Accents go before lower-casing: İ -> I -> i (not "i̇").
    assert BasicTokenizer().tokenize("İstanbul") == ["istanbul"]


def test_basic_split_chunk_reports_sources() -> None:
    words, source = BasicTokenizer().split_chunk("Über,x")
    assert words == [("uber", 0), (",", 5), ("x", 7)]
    assert source == [0, 1, 2, 3, 4, 4, 4, 5]  # ' , ' padding points at the comma
    assert BasicTokenizer().split_chunk("Plain") == ([("plain", 0)], None)
    assert BasicTokenizer().split_chunk("U.S.A,") == (
        [("u", 0), (".", 1), ("s", 2), (".", 3), ("a", 4), (",", 5)],
        None,
    )


# ----------------------------------------------------------------------------------------------------
# WordPiece
# ----------------------------------------------------------------------------------------------------


def test_wordpiece_greedy_longest_match_first() -> None:
    wp = WordPiece(VOCAB)
    assert wp.tokenize("unaffable") == ["un", "##aff", "##able"]
    assert wp.segment("unaffable") == ((5, 0, 2), (6, 2, 5), (7, 5, 9))
    assert wp.tokenize("aaab") == ["a", "##a", "##a", "##b"]


def test_wordpiece_unknown_and_too_long_words() -> None:
    wp = WordPiece(VOCAB)
    assert wp.segment("unaffablex") == ((1, 0, 10),)  # no segmentation -> one [UNK] for the whole word
    assert wp.tokenize("a" * 100) == ["a"] + ["##a"] * 99
    assert wp.segment("a" * 101) == ((1, 0, 101),)  # over 100 characters -> [UNK]
    assert WordPiece(VOCAB, max_input_chars_per_word=3).segment("aaaa") == ((1, 0, 4),)


def test_wordpiece_cache_is_bounded_and_does_not_change_results() -> None:
    small, fresh = WordPiece(VOCAB), WordPiece(VOCAB)
    small._memo.maxsize = 3
    words = ["a" * n + "b" for n in range(1, 30)] * 2
    assert [small.segment(w) for w in words] == [fresh._segment(w) for w in words]
    assert len(small._memo) <= 3


# ----------------------------------------------------------------------------------------------------
# Encoding
# ----------------------------------------------------------------------------------------------------


def test_encode_single(tok: BertTokenizer) -> None:
    enc = tok("Hello, world!", return_offsets_mapping=True, return_special_tokens_mask=True)
    assert enc["input_ids"] == ids("[CLS]", "hello", ",", "world", "!", "[SEP]")
    assert enc["token_type_ids"] == [0] * 6
    assert enc["attention_mask"] == [1] * 6
    assert enc["special_tokens_mask"] == [1, 0, 0, 0, 0, 1]
    assert enc["offset_mapping"] == [(0, 0), (0, 5), (5, 6), (7, 12), (12, 13), (0, 0)]
    assert list(enc) == [
        "input_ids",
        "token_type_ids",
        "attention_mask",
        "special_tokens_mask",
        "offset_mapping",
    ]
    assert enc.input_ids is enc["input_ids"]
    assert tok.encode("Hello, world!") == enc["input_ids"]
    assert tok.tokenize("Hello, world!") == ["hello", ",", "world", "!"]


def test_encode_pair(tok: BertTokenizer) -> None:
    enc = tok("the cat", "sat on the mat.", return_offsets_mapping=True, return_special_tokens_mask=True)
    assert enc["input_ids"] == ids("[CLS]", "the", "cat", "[SEP]", "sat", "on", "the", "mat", ".", "[SEP]")
    assert enc["token_type_ids"] == [0, 0, 0, 0, 1, 1, 1, 1, 1, 1]
    assert enc["special_tokens_mask"] == [1, 0, 0, 1, 0, 0, 0, 0, 0, 1]
    # Offsets of the second text index into the second text.
    assert enc["offset_mapping"] == [
        (0, 0),
        (0, 3),
        (4, 7),
        (0, 0),
        (0, 3),
        (4, 6),
        (7, 10),
        (11, 14),
        (14, 15),
        (0, 0),
    ]


def test_empty_text_pair(tok: BertTokenizer) -> None:
    # A single "" pair is no pair (as Hugging Face); in a batch it is an empty second segment (ditto).
    assert tok("the cat", "") == tok("the cat")
    assert tok(["the cat"], [""])["input_ids"] == [ids("[CLS]", "the", "cat", "[SEP]", "[SEP]")]
    assert tok(["the cat"], [""])["token_type_ids"] == [[0, 0, 0, 0, 1]]


def test_encode_without_special_tokens(tok: BertTokenizer) -> None:
    enc = tok("the cat", "sat", add_special_tokens=False, return_special_tokens_mask=True)
    assert enc["input_ids"] == ids("the", "cat", "sat")
    assert enc["token_type_ids"] == [0, 0, 1]
    assert enc["special_tokens_mask"] == [0, 0, 0]


def test_offsets_point_into_the_original_text(tok: BertTokenizer) -> None:
    text = "  CAFÉ unaffable\u200b xyzzy 中文"
    enc = tok(text, return_offsets_mapping=True)
    tokens = tok.convert_ids_to_tokens(enc["input_ids"])
    assert tokens == ["[CLS]", "cafe", "un", "##aff", "##able", "[UNK]", "中", "文", "[SEP]"]
    # "É" (stripped to "e") spans its own character; ## pieces span only their characters; [UNK] spans
    # the whole word; the dropped zero-width space is not part of any token.
    assert enc["offset_mapping"] == [
        (0, 0),
        (2, 6),
        (7, 9),
        (9, 12),
        (12, 16),
        (18, 23),
        (24, 25),
        (25, 26),
        (0, 0),
    ]
    assert [text[a:b] for a, b in enc["offset_mapping"][1:-1]] == [
        "CAFÉ",
        "un",
        "aff",
        "able",
        "xyzzy",
        "中",
        "文",
    ]


def test_special_tokens_in_text(tok: BertTokenizer) -> None:
    # Matched exactly and anywhere, even inside a word; other spellings are ordinary text.
    enc = tok("x[MASK]y [mask]", return_offsets_mapping=True, return_special_tokens_mask=True)
    assert enc["input_ids"] == ids("[CLS]", "x", "[MASK]", "y", "[", "mask", "]", "[SEP]")
    assert enc["offset_mapping"] == [(0, 0), (0, 1), (1, 7), (7, 8), (9, 10), (10, 14), (14, 15), (0, 0)]
    # Only the [CLS]/[SEP] the tokenizer adds count as special in the mask (as in Hugging Face).
    assert enc["special_tokens_mask"] == [1, 0, 0, 0, 0, 0, 0, 1]


def test_cased_mode(tok: BertTokenizer) -> None:
    cased = BertTokenizer(VOCAB, do_lower_case=False)
    assert cased.tokenize("Cafe café CAFE") == ["Cafe", "café", "[UNK]"]


def test_empty_and_whitespace_texts(tok: BertTokenizer) -> None:
    for text in ("", "   ", "\x00\t\u200b"):
        enc = tok(text, return_offsets_mapping=True)
        assert enc["input_ids"] == ids("[CLS]", "[SEP]")
        assert enc["offset_mapping"] == [(0, 0), (0, 0)]


def test_batch(tok: BertTokenizer) -> None:
    enc = tok(["the cat", "x"], ["sat", "y z"])
    assert enc["input_ids"] == [
        ids("[CLS]", "the", "cat", "[SEP]", "sat", "[SEP]"),
        ids("[CLS]", "x", "[SEP]", "y", "z", "[SEP]"),
    ]
    assert enc["token_type_ids"] == [[0, 0, 0, 0, 1, 1], [0, 0, 0, 1, 1, 1]]
    assert tok([])["input_ids"] == []


# ----------------------------------------------------------------------------------------------------
# Truncation
# ----------------------------------------------------------------------------------------------------

TEN = "a b a b a b a b a b"  # 10 tokens
FOUR = "x y z x"  # 4 tokens


def test_truncation_longest_first(tok: BertTokenizer) -> None:
    # Budget 10 - 3 = 7 for 10 + 4 tokens: both halves are cut, the longer text keeps 7 // 2 + 1 = 4.
    enc = tok(TEN, FOUR, max_length=10, truncation=True)
    assert enc["input_ids"] == ids("[CLS]", "a", "b", "a", "b", "[SEP]", "x", "y", "z", "[SEP]")
    # Budget 12 - 3 = 9: the shorter keeps all 4, the longer gets the remaining 5.
    enc = tok(TEN, FOUR, max_length=12, truncation="longest_first")
    assert enc["input_ids"] == ids("[CLS]", "a", "b", "a", "b", "a", "[SEP]", "x", "y", "z", "x", "[SEP]")
    # Same lengths, odd budget: the second text gets the extra token.
    enc = tok(FOUR, FOUR, max_length=8, truncation=True)
    assert enc["input_ids"] == ids("[CLS]", "x", "y", "[SEP]", "x", "y", "z", "[SEP]")
    # Single text: keep max_length - 2.
    assert tok(TEN, max_length=4, truncation=True)["input_ids"] == ids("[CLS]", "a", "b", "[SEP]")


def test_truncation_only_first_and_only_second(tok: BertTokenizer) -> None:
    enc = tok(TEN, FOUR, max_length=10, truncation="only_first", return_offsets_mapping=True)
    assert enc["input_ids"] == ids("[CLS]", "a", "b", "a", "[SEP]", "x", "y", "z", "x", "[SEP]")
    assert enc["offset_mapping"][1:4] == [(0, 1), (2, 3), (4, 5)]
    enc = tok(FOUR, TEN, max_length=10, truncation="only_second")
    assert enc["input_ids"] == ids("[CLS]", "x", "y", "z", "x", "[SEP]", "a", "b", "a", "[SEP]")


def test_truncation_errors(tok: BertTokenizer) -> None:
    with pytest.raises(ValueError, match=r"only_second.*cannot fit max_length 7.*second text has 4 tokens"):
        tok(TEN, FOUR, max_length=7, truncation="only_second")
    with pytest.raises(ValueError, match=r"only_first.*cannot fit max_length 6"):
        tok(FOUR, TEN, max_length=6, truncation="only_first")
    with pytest.raises(ValueError, match="needs a text_pair"):
        tok(TEN, max_length=5, truncation="only_second")
    with pytest.raises(ValueError, match="max_length 2 is smaller than the 3 special tokens"):
        tok(TEN, FOUR, max_length=2, truncation=True)
    with pytest.raises(ValueError, match="truncation='sideways'"):
        tok(TEN, max_length=5, truncation="sideways")
    # Nothing to cut: no error, whatever the strategy.
    assert len(tok(FOUR, max_length=6, truncation="only_second")["input_ids"]) == 6
    # A budget of zero empties both texts (as tokenizers does).
    assert tok(TEN, FOUR, max_length=3, truncation="only_first")["input_ids"] == ids(
        "[CLS]", "[SEP]", "[SEP]"
    )


def test_max_length_alone_truncates_like_hugging_face(tok: BertTokenizer) -> None:
    assert tok(TEN, max_length=4)["input_ids"] == ids("[CLS]", "a", "b", "[SEP]")
    assert len(tok(TEN, max_length=4, truncation=False)["input_ids"]) == 12
    # Longer than model_max_length is not an error: the model checks positions.
    small = BertTokenizer(VOCAB, model_max_length=5)
    assert len(small(TEN)["input_ids"]) == 12
    assert small(TEN, truncation=True)["input_ids"] == ids("[CLS]", "a", "b", "a", "[SEP]")


# ----------------------------------------------------------------------------------------------------
# Padding and tensors
# ----------------------------------------------------------------------------------------------------


def test_padding(tok: BertTokenizer) -> None:
    enc = tok(
        ["the cat sat", "x"], padding=True, return_offsets_mapping=True, return_special_tokens_mask=True
    )
    assert enc["input_ids"] == [
        ids("[CLS]", "the", "cat", "sat", "[SEP]"),
        ids("[CLS]", "x", "[SEP]", "[PAD]", "[PAD]"),
    ]
    assert enc["attention_mask"] == [[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]
    assert enc["token_type_ids"] == [[0] * 5, [0] * 5]
    assert enc["special_tokens_mask"][1] == [1, 0, 1, 1, 1]
    assert enc["offset_mapping"][1] == [(0, 0), (0, 1), (0, 0), (0, 0), (0, 0)]
    enc = tok(["the cat sat", "x"], padding="max_length", max_length=7)
    assert [len(row) for row in enc["input_ids"]] == [7, 7]
    # Padding to max_length does not truncate (as Hugging Face): longer rows stay longer.
    assert [len(r) for r in tok([TEN, "x"], padding="max_length", max_length=5)["input_ids"]] == [12, 5]
    with pytest.raises(ValueError, match="padding='left'"):
        tok("x", padding="left")


def test_tensors(tok: BertTokenizer) -> None:
    torch = pytest.importorskip("torch")
    enc = tok(
        ["the cat sat", "x"], ["y", "z z"], padding=True, return_tensors="pt", return_offsets_mapping=True
    )
    assert enc["input_ids"].shape == (2, 7) and enc["input_ids"].dtype == torch.long
    assert enc["offset_mapping"].shape == (2, 7, 2)
    assert enc["attention_mask"].tolist() == [[1] * 7, [1, 1, 1, 1, 1, 1, 0]]
    single = tok("the cat", return_tensors="np")
    assert single["input_ids"].shape == (1, 4) and str(single["input_ids"].dtype) == "int64"
    assert tok("", add_special_tokens=False, return_tensors="pt", return_offsets_mapping=True)[
        "offset_mapping"
    ].shape == (1, 0, 2)
    with pytest.raises(ValueError, match="different lengths 3..5.*padding=True"):
        tok(["the cat sat", "x"], return_tensors="pt")
    with pytest.raises(ValueError, match="return_tensors='tf'"):
        tok("x", return_tensors="tf")


# ----------------------------------------------------------------------------------------------------
# Decoding and vocabulary
# ----------------------------------------------------------------------------------------------------


def test_decode(tok: BertTokenizer) -> None:
    seq = ids("[CLS]", "hello", ",", "un", "##aff", "##able", "world", "!", "[SEP]", "[PAD]")
    assert tok.decode(seq) == "[CLS] hello, unaffable world! [SEP] [PAD]"  # special tokens kept, as transformers
    assert tok.decode(seq, skip_special_tokens=True) == "hello, unaffable world!"
    # The WordPiece decoder's per-token clean-up always applies; clean_up_tokenization_spaces adds
    # transformers' whole-string one ("don ' t" -> "don't").
    assert tok.decode(seq, skip_special_tokens=True, clean_up_tokenization_spaces=False) == "hello, unaffable world!"
    assert (
        tok.decode(ids("##a", "b", "[UNK]", "[MASK]"), skip_special_tokens=True) == "##a b"
    )  # a leading ## stays; [UNK]/[MASK] skipped
    assert tok.decode(ids("don", "'", "t", "it", "'", "s", "?")) == "don ' t it ' s?"  # per token, as HF
    assert tok.decode(ids("don", "'", "t", "it", "'", "s", "?"), clean_up_tokenization_spaces=True) == "don't it's?"
    torch = pytest.importorskip("torch")
    assert tok.decode(torch.tensor(ids("hello", "world"))) == "hello world"
    assert tok.batch_decode([ids("hello"), ids("world")]) == ["hello", "world"]
    with pytest.raises(ValueError, match="token id 999 is outside the vocabulary"):
        tok.decode([999])


def test_vocabulary_accessors(tok: BertTokenizer) -> None:
    assert len(tok) == tok.vocab_size == len(TOKENS)
    assert tok.vocab["hello"] == 8 and tok.ids_to_tokens[8] == "hello"
    assert (tok.pad_token_id, tok.unk_token_id, tok.cls_token_id, tok.sep_token_id, tok.mask_token_id) == (
        0,
        1,
        2,
        3,
        4,
    )
    assert sorted(tok.all_special_ids) == [0, 1, 2, 3, 4]
    assert tok.convert_tokens_to_ids(["hello", "nope"]) == [8, 1]
    assert tok.convert_tokens_to_ids("world") == 9
    assert tok.convert_ids_to_tokens([8, 9]) == ["hello", "world"]
    assert tok.convert_ids_to_tokens(5) == "un"
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tok.convert_ids_to_tokens(-1)


# ----------------------------------------------------------------------------------------------------
# Loading, saving, errors
# ----------------------------------------------------------------------------------------------------


def test_save_and_load_round_trip(tmp_path: Path) -> None:
    cased = BertTokenizer(VOCAB, do_lower_case=False, model_max_length=128)
    written = cased.save_pretrained(tmp_path / "tok")
    # transformers 4's special_tokens_map.json and added_tokens.json only where the directory holds them already
    assert sorted(p.name for p in written) == sorted(p.name for p in (tmp_path / "tok").iterdir()) == [
        "tokenizer.json",
        "tokenizer_config.json",
        "vocab.txt",
    ]
    assert load_vocab(tmp_path / "tok" / "vocab.txt") == TOKENS
    config = json.loads((tmp_path / "tok" / "tokenizer_config.json").read_text())
    assert config["do_lower_case"] is False and config["model_max_length"] == 128
    assert config["mask_token"] == "[MASK]"
    loaded = BertTokenizer.from_pretrained(tmp_path / "tok")
    text = "Cafe café CAFE, hello!"
    assert loaded(text, return_offsets_mapping=True) == cased(text, return_offsets_mapping=True)
    assert (loaded.do_lower_case, loaded.model_max_length) == (False, 128)
    # Keyword arguments override the files.
    assert BertTokenizer.from_pretrained(tmp_path / "tok", do_lower_case=True).tokenize("CAFE") == ["cafe"]


def test_load_reads_hugging_face_style_config(tmp_path: Path) -> None:
    (tmp_path / "vocab.txt").write_text("".join(t + "\n" for t in TOKENS), encoding="utf-8")
    config = {"do_lower_case": False, "model_max_length": 1e30, "mask_token": {"content": "[MASK]", "lstrip": False},
              "tokenizer_class": "BertTokenizer", "name_or_path": "somewhere/else-uncased"}  # fmt: skip
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    tok = BertTokenizer.from_pretrained(tmp_path)
    assert tok.do_lower_case is False  # from the config, not guessed from a name
    assert tok.mask_token == "[MASK]" and tok.model_max_length == int(1e30)
    # files that set no model_max_length: transformers' "no limit" (its VERY_LARGE_INTEGER), not 512
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": False}))
    assert BertTokenizer.from_pretrained(tmp_path).model_max_length == 1000000000000000019884624838656
    assert BertTokenizer.from_pretrained(tmp_path, model_max_length=128).model_max_length == 128


def test_missing_files_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        BertTokenizer.from_pretrained(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match=r"vocab\.txt not found.*needs vocab\.txt"):
        BertTokenizer.from_pretrained(tmp_path)
    (tmp_path / "vocab.txt").write_text("".join(t + "\n" for t in TOKENS), encoding="utf-8")
    with pytest.raises(FileNotFoundError, match="pass do_lower_case=True for an uncased checkpoint"):
        BertTokenizer.from_pretrained(tmp_path)
    assert BertTokenizer.from_pretrained(tmp_path, do_lower_case=True).tokenize("Hello") == ["hello"]
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "vocab2.txt")):
        BertTokenizer(tmp_path / "vocab2.txt")


def test_vocabulary_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"lacks the special tokens \['\[MASK\]'\]"):
        BertTokenizer({t: i for i, t in enumerate(t for t in TOKENS if t != "[MASK]")})
    with pytest.raises(ValueError, match=r"ids must be the integers 0..1"):
        BertTokenizer({"[UNK]": 0, "[SEP]": 5})
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"do_basic_tokenize": False}))
    (tmp_path / "vocab.txt").write_text("".join(t + "\n" for t in TOKENS), encoding="utf-8")
    with pytest.raises(ValueError, match="do_basic_tokenize=false"):
        BertTokenizer.from_pretrained(tmp_path)


@pytest.mark.parametrize(("settings", "message"), [
    ({"do_lower_case": "false"}, r"do_lower_case must be bool, got 'false' \(a string: write true/false without"),
    ({"do_lower_case": None}, "do_lower_case must be bool, got None"),
    ({"strip_accents": 0}, "strip_accents must be bool or null, got 0"),
    ({"tokenize_chinese_chars": None}, "tokenize_chinese_chars must be bool, got None"),
    ({"model_max_length": "512"}, r"model_max_length must be int or float, got '512' \(a string: write the number"),
])
def test_a_setting_of_the_wrong_type_is_refused_not_read_as_a_truth_value(minilm_dir: Path, settings, message) -> None:
    """transformers' BertTokenizerFast refuses these (TypeError "'str' object is not an instance of 'bool'"); bertkit
    read them as truth values: do_lower_case="false" lower-cased ("HELLO" [101, 7592, 102], where the cased reading
    gives [101, 100, 102]), tokenize_chinese_chars=None left 文 whole (30387, not 1861). Refused naming the value,
    passed to the constructor or to from_pretrained."""
    with pytest.raises(ValueError, match=message):
        BertTokenizer(minilm_dir / "vocab.txt", **settings)
    with pytest.raises(ValueError, match=message):
        BertTokenizer.from_pretrained(minilm_dir, **settings)
    assert BertTokenizer(minilm_dir / "vocab.txt", do_lower_case=False)("HELLO")["input_ids"] == [101, 100, 102]


@pytest.mark.parametrize("settings", [{"word_tokenizer_type": "mecab"}, {"subword_tokenizer_type": "character"}])
def test_a_japanese_tokenizer_directory_is_refused_naming_its_settings(tmp_path: Path, settings) -> None:
    """cl-tohoku's BERT checkpoints (model_type "bert") split words with MeCab, or into characters, by these
    settings of transformers' BertJapaneseTokenizer: read as BERT's basic tokenizer and WordPiece, their ids would be
    other ids, unannounced."""
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"do_lower_case": False, "tokenizer_class": "BertJapaneseTokenizer", **settings}))
    (tmp_path / "vocab.txt").write_text("".join(t + "\n" for t in TOKENS), encoding="utf-8")
    key, value = next(iter(settings.items()))
    with pytest.raises(ValueError, match=f"sets {key}={value!r}.*BertJapaneseTokenizer"):
        BertTokenizer.from_pretrained(tmp_path)


def test_input_errors(tok: BertTokenizer) -> None:
    with pytest.raises(ValueError, match="text has 2 entries but text_pair has 1"):
        tok(["a", "b"], ["c"])
    with pytest.raises(TypeError, match="text_pair is a single str"):
        tok(["a", "b"], "c")
    with pytest.raises(ValueError, match="takes a str, a list of str"):  # a BertkitError: one line on the CLI
        tok([1, 2])


# ----------------------------------------------------------------------------------------------------
# Workers, threads, caches
# ----------------------------------------------------------------------------------------------------


def test_pickle_round_trip(tok: BertTokenizer) -> None:
    tok("warm the caches, please")
    clone = pickle.loads(pickle.dumps(tok))
    text = "Héllo, unaffable world! [MASK]"
    assert clone(text, return_offsets_mapping=True) == tok(text, return_offsets_mapping=True)
    assert len(pickle.dumps(tok)) < 4000  # caches are rebuilt, not shipped to DataLoader workers


@pytest.mark.parametrize("edit", [lambda t: t.add_tokens(["newtok"]), lambda t: t.add_special_tokens({"pad_token": "[P2]"}),
                                  lambda t: setattr(t, "pad_token", "[MASK]")])
def test_a_shallow_copy_shares_the_vocabulary_and_a_deep_copy_does_not(tok: BertTokenizer, edit) -> None:
    """t2 = copy.copy(tok); t2.add_tokens(["newtok"]) left tok half-updated: len(tok) 42 and "newtok" in tok.vocab,
    but tok("a newtok") still WordPiece's pieces. A copy of transformers' BertTokenizerFast shares its backend, so
    both then read "newtok" as the added id (and both pad with a new pad_token); a deep copy or a pickled one is
    independent of the tokenizer it was copied from."""
    import copy

    text, pairs = "hello newtok [P2] [MASK]", ["hello", "hello world"]
    before = tok(text)["input_ids"], tok(pairs, padding=True)["input_ids"]
    deep, pickled, shallow = copy.deepcopy(tok), pickle.loads(pickle.dumps(tok)), copy.copy(tok)
    shallow.model_max_length = 7  # a setting of the copy's own, as in transformers
    edit(shallow)
    after = shallow(text)["input_ids"], shallow(pairs, padding=True)["input_ids"]
    assert after != before
    assert (tok(text)["input_ids"], tok(pairs, padding=True)["input_ids"]) == after
    assert (len(tok), tok.pad_token_id, tok.model_max_length) == (len(shallow), shallow.pad_token_id, 512)
    for other in (deep, pickled):
        assert (other(text)["input_ids"], other(pairs, padding=True)["input_ids"]) == before
        assert (len(other), other.pad_token, other.pad_token_id) == (len(VOCAB), "[PAD]", 0)
    edit(deep)
    assert (deep(text)["input_ids"], deep(pairs, padding=True)["input_ids"]) == after


def test_an_encoding_keeps_the_vocabulary_its_ids_came_from_and_a_failed_edit_changes_nothing(tok) -> None:
    """enc = tok(text); tok.add_tokens(["unaffable"]): enc.char_to_token and token_to_chars re-encoded the text with the
    edited tokenizer, so they answered for "unaffable" as one token while enc's ids held three (char 10 gave token 2,
    "un", not 3, "##aff"); transformers keeps them from encode time. add_special_tokens({"pad_token": "[P2]",
    "cls_token": 5}) refused cls_token after it had added "[P2]" and made it pad_token, pad_token_id still 0."""
    text = "hello unaffable world"
    enc = tok(text)
    assert tok.add_tokens(["unaffable"]) == 1 and tok(text)["input_ids"] == [2, 8, 41, 9, 3]
    assert enc["input_ids"] == [2, 8, 5, 6, 7, 9, 3]
    assert enc.tokens() == ["[CLS]", "hello", "un", "##aff", "##able", "world", "[SEP]"]
    assert (enc.char_to_token(10), tuple(enc.token_to_chars(3)), enc.word_ids()) == (
        3, (8, 11), [None, 0, 1, 1, 1, 2, None])
    with pytest.raises(BertkitError, match="cls_token must be a str, got 5"):
        tok.add_special_tokens({"pad_token": "[P2]", "cls_token": 5})
    assert (len(tok), tok.pad_token, tok.all_special_tokens) == (42, "[PAD]", ["[UNK]", "[SEP]", "[PAD]", "[CLS]", "[MASK]"])


@pytest.mark.parametrize("change", [lambda t: t.additional_special_tokens.append("[E3]"),
                                    lambda t: t.all_special_tokens.append("[E3]"), lambda t: t.vocab.update(newtok=5),
                                    lambda t: t.ids_to_tokens.update({5: "zz"}), lambda t: t.added_tokens.append("x")])
def test_the_tables_a_user_reads_are_copies_as_in_transformers(tok: BertTokenizer, change) -> None:
    """tok.additional_special_tokens.append("[E3]") changed the tokenizer's own list without rebuilding it: ids
    unchanged, yet pickle.dumps(tok) (a DataLoader worker) failed with KeyError: '[E3]'; tok.vocab["newtok"] = 5 made
    convert_tokens_to_ids("newtok") 5 while the text still read [UNK]. transformers builds these anew on each read."""
    text = "hello [E3] newtok x"
    want = tok(text)["input_ids"], tok.convert_tokens_to_ids(["newtok", "x"]), tok.convert_ids_to_tokens([5, 29])
    change(tok)
    for t in (tok, pickle.loads(pickle.dumps(tok))):
        assert (t(text)["input_ids"], t.convert_tokens_to_ids(["newtok", "x"]), t.convert_ids_to_tokens([5, 29])) == want
        assert (t.additional_special_tokens, t.added_tokens, len(t.all_special_tokens), len(t.vocab)) == ([], [], 5, 41)


@pytest.mark.parametrize("name, value, fix", [
    ("do_lower_case", False, "AutoTokenizer.from_pretrained(path, do_lower_case=False)"),
    ("strip_accents", False, "AutoTokenizer.from_pretrained(path, strip_accents=False)"),
    ("max_input_chars_per_word", 3, "AutoTokenizer.from_pretrained(path, max_input_chars_per_word=3)"),
    ("additional_special_tokens", ["[MASK]"], "tok.add_special_tokens({'additional_special_tokens': ['[MASK]']})"),
])
def test_a_setting_assigned_after_building_is_refused(tok: BertTokenizer, name: str, value: object, fix: str) -> None:
    """tok.do_lower_case = False left the live tokenizer lower-casing (as transformers' does) while a pickled copy, a
    DataLoader or datasets.map worker's, was rebuilt from the new value: "Hello" was [hello] in the main process and
    [UNK] in the workers. Refused, naming how to get that setting; the value it has may be assigned again."""
    text = "Hello, HELLO unaffable [MASK]"
    want = tok(text)["input_ids"]
    with pytest.raises(BertkitError, match=rf"tok.{name} = .*built from it once.*{re.escape(fix)}"):
        setattr(tok, name, value)
    setattr(tok, name, getattr(tok, name))
    assert tok(text)["input_ids"] == pickle.loads(pickle.dumps(tok))(text)["input_ids"] == want


def test_model_input_names_assigned_is_read() -> None:
    """tok.model_input_names = ["input_ids", "attention_mask"] was refused (earlier kept and never read): pairs now
    leave token_type_ids out, as transformers' do (one segment, all 0, to the model)."""
    tok = BertTokenizer(VOCAB, do_lower_case=True)  # not the shared fixture: the assignment stays
    tok.model_input_names = ["input_ids", "attention_mask"]
    assert "token_type_ids" not in tok("hello", "world")
    assert tok("hello", "world", return_token_type_ids=True)["token_type_ids"] == [0, 0, 0, 1, 1]
    tok.model_input_names = ["input_ids", "token_type_ids", "attention_mask"]
    assert tok("hello", "world")["token_type_ids"] == [0, 0, 0, 1, 1]
    assert "token_type_ids" not in tok("hello", "world", return_token_type_ids=False)


def test_threads_get_the_same_results(tok: BertTokenizer) -> None:
    texts = [f"the cat sat on the mat {'a' * (i % 7)}b, hello{i % 5} world!" for i in range(400)]
    want = [BertTokenizer(VOCAB)(t, return_offsets_mapping=True) for t in texts]
    small = BertTokenizer(VOCAB)
    small._text.chunks.maxsize = small._text.wordpiece._memo.maxsize = 8  # constant clearing while threads read
    results: dict[int, list] = {}

    def work(k: int) -> None:
        results[k] = [small(t, return_offsets_mapping=True) for t in texts]

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(results[k] == want for k in range(4))
    assert len(small._text.chunks) <= 8


def test_real_vocabulary_ids(minilm_dir: Path) -> None:
    if not (minilm_dir / "vocab.txt").is_file():
        pytest.skip(f"{minilm_dir / 'vocab.txt'} absent")
    tok = BertTokenizer.from_pretrained(minilm_dir)
    assert tok("Hello, world!")["input_ids"] == [101, 7592, 1010, 2088, 999, 102]
    assert tok.tokenize("unaffable") == ["una", "##ffa", "##ble"]
    assert tok.decode(tok.encode("The Quick brown fox, isn't it?")) == "[CLS] the quick brown fox, isn ' t it? [SEP]"
