"""Tokenizer directories as users' checkpoints hold them, read by bertkit and by transformers 5: the same ids, or a
refusal naming the file, the value and the fix.

Each case is a file transformers 5 reads otherwise than its name suggests: special_tokens_map.json and
added_tokens.json beside a config with added_tokens_decoder (not read), tokenizer.json's padding and truncation
blocks (their direction is the tokenizer's side), its WordPiece model's unk_token (not read), vocab.txt's lines (read
by the tokenizers library: whitespace at a line's end dropped, lines split at "\\n" only), a null model_max_length.
"""

from __future__ import annotations

import json
import shutil

import pytest

from bertkit.errors import BertkitError
from bertkit.tokenization import AutoTokenizer, BertTokenizer, load_vocab

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

# The minilm checkpoint's added_tokens_decoder, as transformers 4.34 and later save it
DECODER = {str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
                    "special": True} for i, t in ((0, "[PAD]"), (100, "[UNK]"), (101, "[CLS]"), (102, "[SEP]"),
                                                  (103, "[MASK]"))}


def _directory(minilm_dir, out, files, config=None, tokenizer_json=None):
    """``out`` holding minilm's ``files`` (tokenizer_config.json too), ``config`` merged into its config and
    ``tokenizer_json`` into its tokenizer.json."""
    out.mkdir(exist_ok=True)
    for name in files:
        shutil.copy(minilm_dir / name, out / name)
    if tokenizer_json is not None:
        data = json.loads((minilm_dir / "tokenizer.json").read_text(encoding="utf-8"))
        (out / "tokenizer.json").write_text(json.dumps({**data, **tokenizer_json}), encoding="utf-8")
    base = json.loads((minilm_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    (out / "tokenizer_config.json").write_text(json.dumps({**base, **(config or {})}), encoding="utf-8")
    return out


def _both(path, texts, **call):
    """(bertkit's rows, transformers') for ``texts`` from the directory ``path``."""
    ours = dict(AutoTokenizer.from_pretrained(path)(texts, **call))
    theirs = dict(transformers.AutoTokenizer.from_pretrained(str(path))(texts, **call))
    return ours, theirs


@pytest.mark.parametrize("layout", ["vocab.txt", "tokenizer.json"])
def test_special_tokens_map_and_added_tokens_json_beside_a_config_with_added_tokens_decoder_are_not_read(
        minilm_dir, tmp_path, layout):
    """transformers 5 reads special_tokens_map.json and added_tokens.json, files older versions wrote, only for a
    config without added_tokens_decoder. bertkit read them always: a special_tokens_map.json naming unk_token
    "[unused6]" (the config: "[UNK]") gave every unknown word id 7 where transformers gives 100, and an
    added_tokens.json's "<new_tok>" was cut out of the text as id 30522 where transformers splits it into pieces."""
    path = _directory(minilm_dir, tmp_path / "tok", [layout], {"added_tokens_decoder": DECODER})
    (path / "special_tokens_map.json").write_text(json.dumps({"unk_token": "[unused6]", "mask_token": "[unused4]"}))
    (path / "added_tokens.json").write_text(json.dumps({"<new_tok>": 30522}))
    ours, theirs = _both(path, ["hello qqqxzzq 😀 [MASK] [unused4]", "x<new_tok>y"])
    assert ours == theirs
    assert ours["input_ids"] == [[101, 7592, 1053, 4160, 4160, 2595, 13213, 4160, 100, 103, 1031, 15171, 2549, 1033,
                                  102], [101, 1060, 1026, 2047, 1035, 2000, 2243, 1028, 1061, 102]]
    tok = BertTokenizer.from_pretrained(path)
    assert (tok.unk_token, tok.mask_token, len(tok)) == ("[UNK]", "[MASK]", 30522)


def test_special_tokens_map_beside_a_config_without_added_tokens_decoder_is_read(minilm_dir, tmp_path):
    """An older config (no added_tokens_decoder): special_tokens_map.json's tokens win in both libraries."""
    path = _directory(minilm_dir, tmp_path / "tok", ["vocab.txt"])
    (path / "special_tokens_map.json").write_text(json.dumps({"unk_token": "[unused6]"}))
    ours, theirs = _both(path, "hello qqqxzzq 😀")
    assert ours == theirs and ours["input_ids"] == [101, 7592, 1053, 4160, 4160, 2595, 13213, 4160, 7, 102]


@pytest.mark.parametrize("block", ["padding", "truncation"])
def test_tokenizer_json_padding_or_truncation_on_the_left_is_refused(minilm_dir, tmp_path, block):
    """transformers 5 takes a tokenizer.json padding (truncation) block's direction as padding_side (truncation_side)
    where tokenizer_config.json sets none: a file saying "Left" padded ["hi", "a longer text here"] to [0, 0, 0, 101,
    7632, 102] there, [101, 7632, 102, 0, 0, 0] in bertkit, which read no side from the file. Refused as the config's
    "left" is; with "right" in the config (or passed), both read the file alike."""
    side = f"{block}_side"
    blocks = {"padding": {"strategy": "BatchLongest", "direction": "Left", "pad_to_multiple_of": None, "pad_id": 0,
                          "pad_type_id": 0, "pad_token": "[PAD]"},
              "truncation": {"max_length": 128, "strategy": "LongestFirst", "stride": 0, "direction": "Left"}}
    path = _directory(minilm_dir, tmp_path / "tok", [], tokenizer_json={block: blocks[block]})
    with pytest.raises(BertkitError, match=rf"tokenizer.json: {block}.direction is 'Left' and tokenizer_config.json "
                                           rf"sets no {side}, .*set \"{side}\": \"right\" in tokenizer_config.json"):
        AutoTokenizer.from_pretrained(path)
    texts, call = ["hi", "a longer text here"], {"padding": True, "max_length": 4, "truncation": True}
    theirs = dict(transformers.AutoTokenizer.from_pretrained(str(path), **{side: "right"})(texts, **call))
    assert dict(AutoTokenizer.from_pretrained(path, **{side: "right"})(texts, **call)) == theirs
    _directory(minilm_dir, path, [], {side: "right"})
    ours, theirs = _both(path, texts, **call)
    assert ours == theirs and ours["input_ids"] == [[101, 7632, 102, 0], [101, 1037, 2936, 102]]


@pytest.mark.parametrize("line", ["hello ", "hello\t", "hello\r", "hello\u3000", "hello\u00a0 "])
def test_vocab_txt_lines_are_read_as_transformers_5_reads_them(minilm_dir, tmp_path, line):
    """transformers 5 reads vocab.txt with the tokenizers library, which drops the whitespace that ends a line
    (Rust's trim_end) and splits lines at "\\n" only. bertkit kept it (Python's rstrip("\\n"), transformers 4's
    load_vocab): a line "hello " (id 7592) gave "hello world" [101, 3109, 2080, 2088, 102] where transformers gives
    [101, 7592, 2088, 102]; a lone "\\r" inside a line made two lines of it, shifting every later id by one."""
    path = _directory(minilm_dir, tmp_path / "tok", [])
    words = (minilm_dir / "vocab.txt").read_text(encoding="utf-8").split("\n")[:-1]
    words[7592] = line
    words[7593] = "ab\rcd"  # one line ("ab\rcd"), as tokenizers reads it
    (path / "vocab.txt").write_bytes("\n".join(words).encode("utf-8"))  # no final newline
    ours, theirs = _both(path, "hello world [SEP] é")
    assert ours == theirs and ours["input_ids"] == [101, 7592, 2088, 102, 1041, 102]
    tokens = load_vocab(path / "vocab.txt")
    assert {t: i for i, t in enumerate(tokens)} == tokenizers.models.WordPiece.read_file(str(path / "vocab.txt"))
    assert tokens[7592:7594] == ["hello", "ab\rcd"] and len(tokens) == 30522


# the lines put into minilm's 30,522 (where, what): blank lines, a token listed twice, both; and the tokens counted
REPEATS = {"two blank lines at the end": ([(30522, ""), (30522, "")], 30523),
           "three blank lines at the end": ([(30522, ""), (30522, ""), (30522, "")], 30523),
           "two blank lines inside": ([(2000, ""), (2000, "")], 30523),
           "hello twice": ([(30522, "hello")], 30522),
           "world twice, then a blank line twice": ([(3000, "world"), (30522, ""), (30522, "hello"), (30522, "")],
                                                    30523),
           "[CLS] twice": ([(30522, "[CLS]")], 30522)}


@pytest.mark.parametrize("case", REPEATS)
def test_a_vocab_txt_listing_a_token_twice_counts_and_ids_it_as_transformers(minilm_dir, tmp_path, case, caplog):
    """A token on two lines of a vocab.txt (a blank line is the token "") has the id of its last line, and the
    vocabulary counts it once: transformers' BertTokenizer and BertTokenizerFast and the tokenizers library agree.
    Was: len(tokenizer) and vocab_size counted lines (30524 with two blank lines at the end of minilm's vocab.txt,
    where transformers says 30523), and a token but "" listed twice was refused."""
    words = (minilm_dir / "vocab.txt").read_text(encoding="utf-8").split("\n")[:-1]
    lines, count = REPEATS[case]
    for at, token in lines:
        words.insert(at, token)
    path = _directory(minilm_dir, tmp_path / "tok", [])
    (path / "vocab.txt").write_text("".join(w + "\n" for w in words), encoding="utf-8")
    ours = BertTokenizer.from_pretrained(path)
    text = "hello world [CLS] x"
    by_line = {t: i for i, t in enumerate(words)}
    assert by_line == tokenizers.models.WordPiece.read_file(str(path / "vocab.txt"))
    for theirs in (transformers.BertTokenizerFast.from_pretrained(str(path)),
                   transformers.BertTokenizer.from_pretrained(str(path))):
        assert (len(ours), ours.vocab_size) == (len(theirs), theirs.vocab_size) == (len(by_line), len(by_line))
        assert ours.get_vocab() == theirs.get_vocab() == by_line
        assert ours(text)["input_ids"] == theirs(text)["input_ids"]
        assert ours.convert_tokens_to_ids(["", "hello", "world", "[CLS]"]) == \
            theirs.convert_tokens_to_ids(["", "hello", "world", "[CLS]"])
    named = [t for _, t in lines if t]
    assert len(ours) == ours.vocab_size == count
    assert all(f"{t!r} on line" in caplog.text for t in named) and ("''" not in caplog.text)


def test_unk_token_only_tokenizer_json_gives_is_refused(minilm_dir, tmp_path):
    """transformers 5 builds the WordPiece model's unknown token from the config (or its default "[UNK]"), not from
    tokenizer.json's model.unk_token, which tokenizers reads. With the file alone naming "[unused9]", bertkit gave an
    unknown word id 10 where transformers gives 100. Refused, naming the config line to add; with it, both agree."""
    data = json.loads((minilm_dir / "tokenizer.json").read_text(encoding="utf-8"))
    path = _directory(minilm_dir, tmp_path / "tok", [], tokenizer_json={"model": {**data["model"],
                                                                                   "unk_token": "[unused9]"}})
    config = json.loads((path / "tokenizer_config.json").read_text(encoding="utf-8"))
    del config["unk_token"]
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(BertkitError, match=r"model.unk_token is \"\[unused9\]\" but tokenizer_config.json sets no "
                                           r"unk_token, .*add \"unk_token\": \"\[unused9\]\" to tokenizer_config.json"):
        BertTokenizer.from_pretrained(path)
    _directory(minilm_dir, path, [], {"unk_token": "[unused9]"})
    ours, theirs = _both(path, "hello 😀")
    assert ours == theirs and ours["input_ids"] == [101, 7592, 10, 102]


def test_a_null_model_max_length_is_no_limit(minilm_dir, tmp_path):
    """transformers reads "model_max_length": null as no limit (10^30), as it reads the key left out; bertkit refused
    the directory ("must be int or float, got None")."""
    path = _directory(minilm_dir, tmp_path / "tok", ["tokenizer.json"], {"model_max_length": None})
    ours = BertTokenizer.from_pretrained(path)
    assert ours.model_max_length == transformers.AutoTokenizer.from_pretrained(str(path)).model_max_length == int(1e30)


@pytest.mark.parametrize("layout", ["vocab.txt", "tokenizer.json"])
def test_a_vocabulary_token_added_tokens_decoder_lists_is_cut_out_of_the_text(minilm_dir, tmp_path, layout):
    """transformers 5 makes every added_tokens_decoder entry an added token, one the vocabulary holds too: "[unused1]"
    (id 2) listed special is cut out of "x[unused1]y" as 2 and skipped by decode(skip_special_tokens=True). bertkit
    skipped entries the vocabulary held and split it into [, unused, ##1, ] (1031, 15171, 2487, 1033)."""
    entry = {"content": "[unused1]", "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
             "special": True}
    path = _directory(minilm_dir, tmp_path / "tok", [layout], {"added_tokens_decoder": {**DECODER, "2": entry}})
    ours, theirs = _both(path, "x[unused1]y [unused1]")
    assert ours == theirs and ours["input_ids"] == [101, 1060, 2, 1061, 2, 102]
    tok = AutoTokenizer.from_pretrained(path)
    assert tok.decode(ours["input_ids"], skip_special_tokens=True) == "x y"


def test_an_added_tokens_decoder_entry_vocab_txt_gives_another_token_is_refused(minilm_dir, tmp_path):
    """added_tokens_decoder giving id 103 to "[MASK2]" where vocab.txt's line 104 is "[MASK]": bertkit ignored the
    entry ("[MASK2]" split into 4 pieces), transformers adds it past the vocabulary (30522). Refused, naming both."""
    entry = {"content": "[MASK2]", "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
             "special": True}
    path = _directory(minilm_dir, tmp_path / "tok", ["vocab.txt"], {"added_tokens_decoder": {**DECODER, "103": entry}})
    with pytest.raises(BertkitError, match=r"added token '\[MASK2\]' has id 103, but line 104 of vocab.txt is "
                                           r"'\[MASK\]': give it an id past vocab.txt's 30522 tokens"):
        BertTokenizer.from_pretrained(path)


@pytest.mark.parametrize("stale", [30522, 101])
def test_an_added_tokens_json_id_tokenizer_json_gives_an_added_token_is_not_read(minilm_dir, tmp_path, stale):
    """Without added_tokens_decoder, transformers 5 reads tokenizer.json's added tokens over added_tokens.json's, id by
    id: a stale added_tokens.json giving "<x>" id 30522 (or 101) beside a tokenizer.json whose added "Hello" (or
    "[CLS]") holds that id is dropped, "<x>" split into pieces. bertkit appended "<x>" at 30523 and cut it out of the
    text. An id a WordPiece token holds is refused (transformers renumbers tokenizer.json's added tokens then)."""
    data = json.loads((minilm_dir / "tokenizer.json").read_text(encoding="utf-8"))
    hello = {"id": 30522, "content": "Hello", **{k: False for k in ("single_word", "lstrip", "rstrip", "normalized")},
             "special": True}
    path = _directory(minilm_dir, tmp_path / "tok", [], tokenizer_json={"added_tokens": [*data["added_tokens"], hello]})
    (path / "added_tokens.json").write_text(json.dumps({"<x>": stale}))
    ours, theirs = _both(path, "a <x> Hello")
    assert ours == theirs and ours["input_ids"] == [101, 1037, 1026, 1060, 1028, 30522, 102]
    assert len(BertTokenizer.from_pretrained(path)) == 30523
    (path / "added_tokens.json").write_text(json.dumps({"<x>": 5}))
    with pytest.raises(BertkitError, match=r"added_tokens.json gives id 5 to '<x>', which tokenizer.json gives to "
                                           r"'\[unused4\]': .*remove added_tokens.json"):
        BertTokenizer.from_pretrained(path)
