"""Randomized differential test of the tokenizer at and past its length boundaries, against BertTokenizerFast.

Texts and pairs are drawn whose token counts sit at the edges: 0, 1, 2 tokens, max_length - 3 .. max_length + 3
for max_length in {1..4, 8, 16, 128, 510..513} or unset (the model's 512), words past max_input_chars_per_word
(100 characters), CJK runs, combining marks and zero-width characters, and a long run of one character. Each call
draws a truncation strategy (longest_first, only_first, only_second, True, False, None), overflowing windows with a
stride at its edges, padding and add_special_tokens. Every key must be equal, or both refuse, or bertkit refuses
with one of the messages docs/tokenizer.md lists as deliberate; a refusal names the value it refuses.
"""

from __future__ import annotations

import csv
import random
import re
import warnings

import pytest

from bertkit.tokenization import BertTokenizer

transformers = pytest.importorskip("transformers")

# bertkit's deliberate refusals (docs/tokenizer.md, "Deliberate differences"), by their messages
DOCUMENTED = (
    "return_overflowing_tokens on text pairs needs",
    "special tokens this input",
    "special tokens each window",
    "holds only the",
)
LENGTHS = (1, 2, 3, 4, 8, 16, 128, 510, 511, 512, 513, None)


def _length(rng: random.Random, edge: int) -> int:
    """A token count at ``edge`` give or take 3, or one of the shortest."""
    return max(0, edge + rng.randint(-3, 3)) if rng.random() < 0.6 else rng.choice([0, 1, 2, 5])


def _text(rng: random.Random, n: int, words: list[str], hf) -> str:
    """A text of about ``n`` tokens, of one of the kinds that sit at the tokenizer's edges."""
    r = rng.random()
    if n == 0:
        return rng.choice(["", " ", "\t\n", "\u200b", "\u0301\u0301", "\x00\x01", "  \u3000 "])
    if r < 0.1:
        return "a" * rng.choice([n, 99, 100, 101, 150])  # one word, at and past max_input_chars_per_word
    if r < 0.2:
        return "".join(chr(rng.randint(0x4E00, 0x4F00)) for _ in range(n))  # CJK: a token a character
    if r < 0.25:
        return "\u00e9" * rng.randint(95, 105) + " x"
    if r < 0.3:
        return "x\u0301" * n  # combining marks, stripped with the accents
    text = " ".join(rng.sample(words, min(len(words), n)))
    offsets = hf(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    return text[: offsets[min(n, len(offsets)) - 1][1]] if offsets else text


@pytest.fixture(scope="module")
def sst2(data_dir) -> list[str]:
    with open(data_dir / "glue/SST-2/dev.tsv", encoding="utf-8") as f:
        return [r["sentence"] for r in csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)]


def _plain(value):
    return [_plain(x) for x in value] if isinstance(value, (list, tuple)) else value


@pytest.mark.slow
def test_tokenizer_calls_at_length_boundaries_equal_transformers(minilm_dir, sst2):
    ours = BertTokenizer.from_pretrained(minilm_dir)
    hf = transformers.BertTokenizerFast.from_pretrained(minilm_dir)
    words = sorted({w for s in sst2[:400] for w in s.split()})
    rng = random.Random(20261130)
    compared = refused = 0
    for _ in range(160):
        max_length = rng.choice(LENGTHS)
        edge = max_length or 512
        a = _text(rng, _length(rng, edge), words, hf)
        b = _text(rng, _length(rng, edge), words, hf) if rng.random() < 0.5 else None
        kw = {"truncation": rng.choice(["longest_first", "only_first", "only_second", True, False, None])}
        if max_length is not None:
            kw["max_length"] = max_length
        if rng.random() < 0.5:
            kw.update(
                return_overflowing_tokens=True,
                return_offsets_mapping=True,
                stride=rng.choice([0, 1, 2, edge // 2, edge - 3]),
            )
        if rng.random() < 0.2:
            kw["add_special_tokens"] = False
        if rng.random() < 0.3:
            kw["padding"] = rng.choice(["max_length", "longest", True])
        args = (a,) if b is None else (a, b)
        if rng.random() < 0.3:
            args = tuple([x] for x in args)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                theirs = dict(hf(*args, **kw))
        except BaseException as e:  # tokenizers panics (PanicException) on some strides  # noqa: BLE001
            theirs = e
        try:
            got = dict(ours(*args, **kw))
        except ValueError as e:
            message = str(e)
            assert re.search(r"\d|'", message), message  # names the value it refuses
            # and never names as the fix an option the call passed (a negative stride was told to pass
            # return_overflowing_tokens=True)
            assert not (
                "needs return_overflowing_tokens=True" in message and kw.get("return_overflowing_tokens")
            ), (kw, message)
            # transformers refuses too, or the refusal is one docs/tokenizer.md lists
            assert isinstance(theirs, BaseException) or any(d in message for d in DOCUMENTED), (kw, message)
            refused += 1
            continue
        if isinstance(theirs, BaseException):
            # transformers counts the special tokens it does not add against the stride (docs/tokenizer.md)
            assert kw.get("add_special_tokens") is False and "stride" in str(theirs), (kw, theirs)
            continue
        assert set(got) == set(theirs), kw
        for key in theirs:
            assert _plain(got[key]) == _plain(theirs[key]), (key, kw, a[:40], None if b is None else b[:40])
        compared += 1
    assert compared > 80 and refused > 5
