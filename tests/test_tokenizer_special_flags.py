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
    for k in range(rng.randrange(3)):  # past vocab.txt; a special one listed as an extra special token, or not
        special = rng.random() < 0.5
        decoder[str(len(_NAMED) + len(_WORDS) + k)] = _entry(f"[E{k}]", special)
        extras += [f"[E{k}]"] if special and rng.random() < 0.6 else []
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
        "special_mask": tok.get_special_tokens_mask(ids, already_has_special_tokens=True),
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


_EDIT_TEXT = "hello <a> world <b>x<c> the <d> cat <e>. <A> [PAD] foo"


def _edit_answers(tok, live_transformers: bool = False) -> dict:
    ids = tok(_EDIT_TEXT, add_special_tokens=False)["input_ids"]
    if live_transformers:  # it skips in decode a token re-added plain after special until saved and loaded again
        return {k: v for k, v in _edit_answers(tok).items() if k != "decode_skip"}
    return {
        "ids": ids,
        "all_special": sorted(zip(tok.all_special_tokens, tok.all_special_ids)),
        "mask": tok.get_special_tokens_mask(ids, already_has_special_tokens=True),
        "tokens_skip": tok.convert_ids_to_tokens(ids, skip_special_tokens=True),
        "decode_skip": tok.decode(ids, skip_special_tokens=True),
        "decoder": {i: (t.content, t.special) for i, t in tok.added_tokens_decoder.items()},
    }


def _edit(rng: random.Random, tok) -> str:
    new = [f"<{c}>" for c in "abcde"]
    pick = rng.sample(new, rng.randint(1, 3))
    kind = rng.randrange(4)
    if kind == 0:
        tok.add_tokens(pick, special_tokens=rng.random() < 0.6)
        return f"add_tokens({pick})"
    if kind == 1:
        replace = rng.random() < 0.5
        tok.add_special_tokens({"additional_special_tokens": pick}, replace_extra_special_tokens=replace)
        return f"additional {pick} replace={replace}"
    # a named token other than [CLS], [SEP] and [UNK]: transformers 5 keeps emitting their old ids until reloaded
    key = rng.choice(["pad_token", "mask_token"])
    tok.add_special_tokens({key: pick[0]})
    return f"{key}={pick[0]}"


DRAWS = 6  # seeded: every one of them leaves a special token unlisted (asserted below)


def test_edited_special_tokens_are_listed_as_transformers_lists_them(tmp_path, minilm_2_layers):
    """Tokens added with ``special_tokens=True``, a named token replaced and an additional special token a new list
    replaced stay special in transformers 5 (cut out as written, skipped by decode) without being listed in
    ``all_special_tokens``; bertkit listed them, so get_special_tokens_mask(ids, already_has_special_tokens=True) marked
    them 1 where transformers gives 0 (a masked-LM collator without a special_tokens_mask column never masked them)
    and convert_ids_to_tokens(skip_special_tokens=True) dropped them. Seeded random edit sequences, compared live and
    after a save by either library read back by either. On MiniLM's cut vocabulary (``minilm_2_layers``): the edits
    and their flags do not depend on its size, and each draw loads and saves it six times."""
    logging.getLogger("transformers").setLevel(logging.ERROR)
    rng = random.Random(7)
    unlisted_seen = 0
    for draw in range(DRAWS):
        theirs = transformers.AutoTokenizer.from_pretrained(str(minilm_2_layers))
        ours = AutoTokenizer.from_pretrained(minilm_2_layers)
        steps = []
        for _ in range(rng.randint(1, 4)):
            state = rng.getstate()
            steps.append(_edit(rng, theirs))
            rng.setstate(state)
            _edit(rng, ours)
            got = _edit_answers(ours)
            assert {k: v for k, v in got.items() if k != "decode_skip"} == _edit_answers(theirs, True), (
                f"draw {draw}: {steps}"
            )
        unlisted_seen += bool(ours.unlisted_special_tokens)
        want = _edit_answers(ours)
        for name, saver in (("bertkit", ours), ("transformers", theirs)):
            saved = tmp_path / f"{name}{draw}"
            saver.save_pretrained(str(saved))
            assert _edit_answers(AutoTokenizer.from_pretrained(saved)) == want, f"draw {draw}, {name}'s save: {steps}"
            assert _edit_answers(transformers.AutoTokenizer.from_pretrained(str(saved))) == want, (
                f"draw {draw}, {name}'s save read by transformers: {steps}"
            )
    assert unlisted_seen == DRAWS  # the draws exercise the case
