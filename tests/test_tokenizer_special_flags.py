"""Special flags of a directory's tokens against transformers 5: named special tokens that tokenizer_config.json's
``added_tokens_decoder`` flags ``"special": true`` or ``false`` (or leaves out: vocab.txt's own), extra special tokens
and plain added ones, cased and uncased, read from vocab.txt and from the tokenizer.json bertkit saves for them. What
``skip_special_tokens`` leaves out of ``decode`` and ``convert_ids_to_tokens``, the text ids read back as, and the ids
of text that spells a token in another case are compared on seeded random directories."""

from __future__ import annotations

import json
import logging
import random

import pytest

from bertkit.tokenization.auto import AutoTokenizer

transformers = pytest.importorskip("transformers")

_NAMED = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
_WORDS = ["hello", "world", ".", "##s", "the", "cat", "[V1]"]  # [V1]: a bracketed token of vocab.txt alone
_TEXT = "hello [MASK] [mask] x[sep]y [E0] [e1] the [V1] cat [PAD] [Pad] [cls]. [Unk]"


def _entry(token: str, special: bool) -> dict:
    # the flags bertkit matches as transformers does: a special token as written, another in the normalized text
    return {
        "content": token,
        "special": special,
        "normalized": not special,
        "lstrip": False,
        "rstrip": False,
        "single_word": False,
    }


def _directory(rng: random.Random, path) -> None:
    path.mkdir()
    (path / "vocab.txt").write_text("\n".join(_NAMED + _WORDS) + "\n", encoding="utf-8")
    config: dict = {"do_lower_case": rng.random() < 0.7, "tokenizer_class": "BertTokenizer"}
    decoder = {str(i): _entry(t, rng.random() < 0.5) for i, t in enumerate(_NAMED) if rng.random() < 0.7}
    extras = []
    for k in range(rng.randrange(3)):  # past vocab.txt; a special one is listed as an extra special token
        special = rng.random() < 0.5
        decoder[str(len(_NAMED) + len(_WORDS) + k)] = _entry(f"[E{k}]", special)
        extras += [f"[E{k}]"] if special else []
    config["added_tokens_decoder"] = decoder
    if extras:
        config["extra_special_tokens"] = extras
    (path / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")


def _answers(tok) -> dict:
    ids = list(range(len(tok)))[::-1]
    return {
        "decode": tok.decode(ids),
        "decode_skip": tok.decode(ids, skip_special_tokens=True),
        "tokens": tok.convert_ids_to_tokens(ids),
        "tokens_skip": tok.convert_ids_to_tokens(ids, True),
        "all_special_ids": sorted(tok.all_special_ids),
        "ids": tok(_TEXT)["input_ids"],
    }


def test_special_flags_decode_and_match_as_transformers(tmp_path):
    """A named token flagged ``"special": false`` ([MASK] of an uncased model): transformers 5 matches it in the
    normalized text and reads it back so ("[mask]"), and decode(skip_special_tokens=True) keeps it (tokenizers skips
    an id whose text is a special token's); bertkit read it back "[MASK]", dropped it from the decoded text, did not
    match "[mask]", and convert_ids_to_tokens(ids, skip_special_tokens=True) was a TypeError."""
    logging.getLogger("transformers").setLevel(logging.ERROR)
    rng = random.Random(1234)
    plain_named = 0
    for draw in range(24):
        path = tmp_path / f"d{draw}"
        _directory(rng, path)
        theirs = transformers.AutoTokenizer.from_pretrained(str(path))
        want = _answers(theirs)
        ours = AutoTokenizer.from_pretrained(path)
        assert _answers(ours) == want, f"draw {draw}: {(path / 'tokenizer_config.json').read_text()}"
        # bertkit's save (tokenizer.json first) keeps the flags: both libraries read it back to the same answers
        saved = ours.save_pretrained(tmp_path / f"s{draw}")[0].parent
        assert _answers(AutoTokenizer.from_pretrained(saved)) == want, f"draw {draw}, saved"
        assert _answers(transformers.AutoTokenizer.from_pretrained(str(saved))) == want, (
            f"draw {draw}, saved (HF)"
        )
        plain_named += any(
            not e["special"] and e["content"] in _NAMED
            for e in json.loads((path / "tokenizer_config.json").read_text())["added_tokens_decoder"].values()
        )
    assert plain_named >= 8  # the draws exercise the case


def test_named_mask_flagged_not_special_is_kept_by_decode(tmp_path):
    """The reduced case: uncased, [MASK] flagged not special. transformers: "hello [mask] worlds"."""
    path = tmp_path / "tok"
    path.mkdir()
    (path / "vocab.txt").write_text("\n".join(_NAMED + ["hello", "world", "##s"]) + "\n", encoding="utf-8")
    decoder = {str(i): _entry(t, t != "[MASK]") for i, t in enumerate(_NAMED)}
    (path / "tokenizer_config.json").write_text(
        json.dumps(
            {"do_lower_case": True, "tokenizer_class": "BertTokenizer", "added_tokens_decoder": decoder}
        )
    )
    tok = AutoTokenizer.from_pretrained(path)
    ids = tok("hello [MASK] worlds [mask]")["input_ids"]
    assert ids == [2, 5, 4, 6, 7, 4, 3]
    assert tok.decode(ids, skip_special_tokens=True) == "hello [mask] worlds [mask]"
    assert tok.convert_ids_to_tokens(ids) == ["[CLS]", "hello", "[mask]", "world", "##s", "[mask]", "[SEP]"]
    assert tok.convert_ids_to_tokens(ids, skip_special_tokens=True) == ["hello", "world", "##s"]
    assert tok.mask_token_id == 4 and tok.get_special_tokens_mask(ids, already_has_special_tokens=True) == [
        1,
        0,
        1,
        0,
        0,
        1,
        1,
    ]
