"""Added and special tokens, code written against transformers' BertTokenizerFast run unchanged on bertkit's: the
``AddedToken`` objects scripts add, the maps that list them, the ids ``add_special_tokens`` gives, their words, and
the directories transformers and bertkit write for them, each compared with transformers on the MiniLM checkpoint."""

from __future__ import annotations

import json
import shutil

import pytest

import bertkit
from bertkit.tokenization import BertTokenizer

transformers = pytest.importorskip("transformers")


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


def test_a_directory_saved_by_bertkit_then_by_transformers_keeps_the_tokens_transformers_added(minilm_dir, tmp_path):
    """bertkit saves, transformers 5 loads the directory, adds tokens and saves over it (tokenizer.json and
    tokenizer_config.json only). bertkit's save wrote an added_tokens.json, which stayed with the older tokens, and
    bertkit took it as the list of added tokens, so "btwo" (30523) was made of pieces, [18411, 12155]; it writes none
    now (transformers 5 writes none), and a stale one is read as transformers reads it (test_tokenizer_files.py)."""
    ours = BertTokenizer.from_pretrained(minilm_dir)
    ours.add_tokens(["aone"])
    ours.save_pretrained(tmp_path)
    ref = transformers.BertTokenizerFast.from_pretrained(tmp_path)
    ref.add_tokens(["btwo"])
    ref.add_special_tokens({"additional_special_tokens": ["<s2>"]})
    ref.save_pretrained(tmp_path)
    assert not (tmp_path / "added_tokens.json").exists()
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


def test_extra_special_tokens_as_a_dict_are_its_tokens_and_one_str_is_refused(minilm_dir):
    """transformers 5's named extra special tokens, ``from_pretrained(extra_special_tokens={"foo_token": "[F]"})``:
    bertkit made the name "foo_token" special and left "[F]" three WordPieces ([, f, ]), where transformers adds "[F]"
    at id 30522. One str, ``additional_special_tokens="[A]"``, made "[", "A" and "]" each a special token (every
    bracket in a text then cut out as one), where transformers refuses it."""
    text = "[A] x [F] y"
    hf = transformers.AutoTokenizer.from_pretrained(minilm_dir, extra_special_tokens={"foo_token": "[F]"})
    for key in ("extra_special_tokens", "additional_special_tokens"):
        ours = bertkit.AutoTokenizer.from_pretrained(minilm_dir, **{key: {"foo_token": "[F]"}})
        assert ours(text)["input_ids"] == hf(text)["input_ids"] == [101, 1031, 1037, 1033, 1060, 30522, 1061, 102]
        assert sorted(ours.all_special_tokens) == sorted(hf.all_special_tokens)
        added = bertkit.AutoTokenizer.from_pretrained(minilm_dir)
        assert added.add_special_tokens({key: {"foo_token": "[F]"}}) == 1
        assert added(text)["input_ids"] == hf(text)["input_ids"]
        with pytest.raises(bertkit.errors.BertkitError, match=rf"{key}=...\): '\[A\]' is not a list .* \['\[A\]'\]"):
            bertkit.AutoTokenizer.from_pretrained(minilm_dir, **{key: "[A]"})
        with pytest.raises(bertkit.errors.BertkitError, match=r"'\[A\]' is not a list of tokens; pass a list"):
            bertkit.AutoTokenizer.from_pretrained(minilm_dir).add_special_tokens({key: "[A]"})
    with pytest.raises(TypeError):  # the reference refuses one str too
        transformers.AutoTokenizer.from_pretrained(minilm_dir, additional_special_tokens="[A]")
    with pytest.raises(bertkit.errors.BertkitError, match=r"additional_special_tokens: '\[A\]' is not a list"):
        BertTokenizer(str(minilm_dir / "vocab.txt"), additional_special_tokens="[A]")
