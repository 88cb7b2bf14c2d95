"""BERT's basic tokenizer: clean up, normalise and split text into words, remembering where each came from.

This is the text side of Hugging Face's BertTokenizerFast (its Rust ``BertNormalizer`` followed by
``BertPreTokenizer``), reproduced character for character; docs/tokenizer.md ("Behaviour, and why") lists
the steps and where they differ from Google's ``tokenization.py``.

Every step maps one input character to zero or more output characters, independently of its neighbours, so
normalisation is one ``str.translate`` table and every output character can point back to the input
character it came from: that is how offsets into the original text are kept.
"""

from __future__ import annotations

import bisect
import itertools
import re
import sys
import unicodedata
from collections.abc import Iterable

from bertkit.tokenization._unicode_tables import (
    CJK,
    CONTROL,
    LOWERCASE_EXTRA,
    NFD_EXCLUDED,
    NONSPACING_MARK,
    PUNCTUATION,
    WHITESPACE,
)
from bertkit.tokenization.wordpiece import Memo

__all__ = ["BasicTokenizer", "CHUNK_RE", "NON_SEPARATOR_SPACE_RE", "lowercase"]


def lowercase(text: str) -> str:
    """``text`` lower-cased as Hugging Face's tokenizers lower-case it (BertNormalizer, and the Lowercase normalizer
    sentence-transformers puts before it for do_lower_case): character by character, as Rust's
    ``char::to_lowercase``. ``str.lower()`` on a whole word turns a final Σ into ς, which they never do; it is taken
    where the text holds neither Σ nor a character whose mapping Python lacks (CPython lowers every other character
    alone): 12x faster on SQuAD's paragraphs than a character at a time."""
    if not _LOWERED_APART.search(text):
        return text.lower()
    return "".join(LOWERCASE_EXTRA.get(ord(c)) or c.lower() for c in text)


_LOWERED_APART = re.compile("[\u03a3" + "".join(  # as ranges: 6x faster to search than the 62 characters one by one
    f"{chr(run[0][1])}-{chr(run[-1][1])}" for run in (list(g) for _, g in itertools.groupby(
        enumerate(sorted(LOWERCASE_EXTRA)), key=lambda ic: ic[1] - ic[0]))) + "]")


class _RangeSet:
    """Membership in a sorted tuple of inclusive (first, last) code-point ranges."""

    def __init__(self, ranges: Iterable[tuple[int, int]]):
        ranges = sorted(ranges)
        self._starts = [a for a, _ in ranges]
        self._ends = [b for _, b in ranges]

    def __contains__(self, cp: int) -> bool:
        i = bisect.bisect_right(self._starts, cp) - 1
        return i >= 0 and cp <= self._ends[i]


_CONTROL = _RangeSet(CONTROL)
_WHITESPACE = _RangeSet(WHITESPACE)
_PUNCTUATION = _RangeSet(PUNCTUATION)
_NONSPACING_MARK = _RangeSet(NONSPACING_MARK)
_CJK = _RangeSet(CJK)


def _class_of(ranges: Iterable[tuple[int, int]]) -> str:
    return "".join(
        re.escape(chr(a)) if a == b else f"{re.escape(chr(a))}-{re.escape(chr(b))}" for a, b in ranges
    )


# A run of characters between the separators BertNormalizer leaves as spaces. A chunk never straddles
# two words, so chunks can be tokenized (and cached) independently of each other.
CHUNK_RE = re.compile(f"[^{_class_of(WHITESPACE)}]+")

# Printable ASCII is letters, digits and punctuation (BERT counts every other printable as punctuation).
_ASCII_WORD_RE = re.compile(r"[A-Za-z0-9]+|[^A-Za-z0-9]")

# Characters `str.split()` splits on but BERT deletes as control characters (so "a\x1cb" is one word).
# Removing them first makes `str.split()` split exactly where BERT does.
NON_SEPARATOR_SPACE_RE = re.compile("[\x0b\x0c\x1c-\x1f\x85]")


class BasicTokenizer:
    """Clean, normalise and split text into words (no vocabulary involved).

    ``tokenize(text)`` gives the words; ``split_chunk(chunk)`` gives the words of one whitespace-free chunk
    together with the position in the chunk of every normalised character, which is what offsets need.
    """

    def __init__(
        self,
        do_lower_case: bool = True,
        strip_accents: bool | None = None,
        tokenize_chinese_chars: bool = True,
    ):
        self.do_lower_case = bool(do_lower_case)
        self.strip_accents = strip_accents
        self.tokenize_chinese_chars = bool(tokenize_chinese_chars)
        # strip_accents=None follows do_lower_case, as in BERT and in Hugging Face.
        self._strip = self.do_lower_case if strip_accents is None else bool(strip_accents)
        self._build_tables()

    def _build_tables(self) -> None:
        # code point -> text tables for `str.translate`, filled on first use (one entry per distinct character,
        # so unbounded). `_split` maps a character to its normalised form with every punctuation/CJK character
        # padded by spaces, so that `text.translate(_split).split()` is the whole basic tokenizer. `_clean` only
        # drops control characters (to tell when NFD reorders marks).
        self._split = Memo(self._split_form, sys.maxsize)
        self._clean = Memo(lambda cp: "" if cp in _CONTROL else chr(cp), sys.maxsize)
        # `normal` maps a character to BertNormalizer's output alone (CJK padded, punctuation not): what added tokens
        # are matched in.
        self.normal = Memo(self._normal_form, sys.maxsize)
        self._nfd = Memo(lambda cp: chr(cp) if cp in NFD_EXCLUDED else unicodedata.normalize("NFD", chr(cp)),
                         sys.maxsize)

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        del state["_split"], state["_clean"], state["_nfd"], state["normal"]
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._build_tables()

    def __repr__(self) -> str:
        return (
            f"BasicTokenizer(do_lower_case={self.do_lower_case}, strip_accents={self.strip_accents}, "
            f"tokenize_chinese_chars={self.tokenize_chinese_chars})"
        )

    # ------------------------------------------------------------------------------------------------
    # One character
    # ------------------------------------------------------------------------------------------------

    def normalize_char(self, ch: str) -> str:
        """The normalised form of one character, before splitting: '' (dropped), ' ', or 1+ characters."""
        cp = ord(ch)
        if cp in _CONTROL:
            return ""
        if cp in _WHITESPACE:
            return " "
        out = ch
        if self._strip:
            decomposed = out if cp in NFD_EXCLUDED else unicodedata.normalize("NFD", out)
            out = "".join(c for c in decomposed if ord(c) not in _NONSPACING_MARK)
        if self.do_lower_case:
            out = lowercase(out)
        return out

    def _normal_form(self, cp: int) -> str:
        out = self.normalize_char(chr(cp))
        return f" {out} " if self.tokenize_chinese_chars and cp in _CJK else out

    def normalize(self, text: str) -> tuple[str, list[int]]:
        """``text`` as BertNormalizer leaves it (clean-up, CJK characters between spaces, accents stripped and lower
        case as set; not split), and ``source[j]``: the index in ``text`` of normalised character ``j``."""
        table = self.normal
        out: list[str] = []
        source: list[int] = []
        for i, ch in enumerate(text):
            piece = table[ord(ch)]
            out.append(piece)
            source += [i] * len(piece)
        return "".join(out), source

    def _split_form(self, cp: int) -> str:
        out = self.normalize_char(chr(cp))
        if self.tokenize_chinese_chars and cp in _CJK:
            return f" {out} "
        if any(ord(c) in _PUNCTUATION for c in out):
            return "".join(f" {c} " if ord(c) in _PUNCTUATION else c for c in out)
        return out

    # ------------------------------------------------------------------------------------------------
    # Text
    # ------------------------------------------------------------------------------------------------

    def tokenize(self, text: str) -> list[str]:
        """The words of ``text``: ``"Héllo, World!"`` -> ``["hello", ",", "world", "!"]`` (uncased)."""
        if text.isascii() or not self._needs_reordering(text):
            return text.translate(self._split).split()
        text = NON_SEPARATOR_SPACE_RE.sub("", text)
        return [word for chunk in text.split() for word, _ in self.split_chunk(chunk)[0]]

    def split_chunk(self, chunk: str) -> tuple[list[tuple[str, int]], list[int] | None]:
        """Words of one whitespace-free ``chunk`` and where their characters came from.

        Returns ``(words, source)``: each word with the position of its first character, and ``source[j]``
        = the index in ``chunk`` of character ``j`` of the normalised chunk, or None where the two are the same.
        """
        if chunk.isascii():
            if chunk.isalnum():  # letters and digits map one to one
                return [(chunk.lower() if self.do_lower_case else chunk, 0)], None
            if chunk.isprintable():  # no control characters: one to one, punctuation splits
                if self.do_lower_case:
                    chunk = chunk.lower()
                return [(m.group(), m.start()) for m in _ASCII_WORD_RE.finditer(chunk)], None
        elif self._needs_reordering(chunk):
            norm, source = self._normalize_reordering(chunk)
            return _words(norm), source
        table = self._split
        pieces = [table[ord(ch)] for ch in chunk]
        source = None
        if any(len(p) != 1 for p in pieces):
            source = []
            for i, p in enumerate(pieces):
                if len(p) == 1:
                    source.append(i)
                else:
                    source.extend([i] * len(p))
        return _words("".join(pieces)), source

    # ------------------------------------------------------------------------------------------------
    # Canonical reordering (rare): marks that NFD puts in a different order
    # ------------------------------------------------------------------------------------------------

    def _needs_reordering(self, text: str) -> bool:
        """Whether NFD of ``text`` (after clean-up) differs from NFD character by character.

        Hugging Face applies NFD to the whole text, which sorts runs of combining marks by combining
        class (e.g. U+0308 U+1D165 -> U+1D165 U+0308); the per-character table cannot. Two C-speed
        passes tell when that happens (a Hangul syllable or U+11938 also land here; harmless).
        """
        if not self._strip:
            return False
        cleaned = text.translate(self._clean)
        return unicodedata.normalize("NFD", cleaned) != cleaned.translate(self._nfd)

    def _normalize_reordering(self, text: str) -> tuple[str, list[int]]:
        """The split form of ``text`` and its source indices, with Hugging Face's whole-text NFD, step by step as
        BertNormalizer. Alignment follows tokenizers (docs/tokenizer.md, "NFD reorders combining marks"): the first
        character of each decomposition takes the next source character, the others repeat the last one taken.
        """
        pre: list[str] = []  # after clean-up and CJK padding
        pre_source: list[int] = []
        for i, ch in enumerate(text):
            cp = ord(ch)
            if cp in _CONTROL:
                continue
            if cp in _WHITESPACE:
                ch = " "
            elif self.tokenize_chinese_chars and cp in _CJK:
                pre += [" ", ch, " "]
                pre_source += [i, i, i]
                continue
            pre.append(ch)
            pre_source.append(i)
        items: list[tuple[str, bool]] = []  # (character, whether it starts its decomposition)
        for ch in pre:
            decomposed = ch if ord(ch) in NFD_EXCLUDED else unicodedata.normalize("NFD", ch)
            items.append((decomposed[0], True))
            items.extend((c, False) for c in decomposed[1:])
        ordered: list[tuple[str, bool]] = []  # canonical ordering: a stable sort of each run of combining marks
        for _, run in itertools.groupby(items, key=lambda item: unicodedata.combining(item[0]) != 0):
            ordered += sorted(run, key=lambda item: unicodedata.combining(item[0]))  # a run of starters stays as is
        out: list[str] = []
        source: list[int] = []
        taken = 0
        for ch, starts in ordered:
            if starts:
                taken += 1
            i = pre_source[taken - 1]
            if ord(ch) in _NONSPACING_MARK:
                continue
            if self.do_lower_case:
                ch = lowercase(ch)
            for c in ch:
                piece = f" {c} " if ord(c) in _PUNCTUATION else c
                out.append(piece)
                source.extend([i] * len(piece))
        return "".join(out), source


def _words(norm: str) -> list[tuple[str, int]]:
    """Space-separated words of a normalised chunk, each with its start index."""
    words: list[tuple[str, int]] = []
    pos = 0
    for word in norm.split(" "):
        if word:
            words.append((word, pos))
        pos += len(word) + 1
    return words
