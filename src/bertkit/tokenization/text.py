"""One text -> WordPiece ids, with character offsets when asked: the part of the tokenizer that reads text.

1. special and added tokens written in the text (``[MASK]``, ``[SEP]``, ...) are cut out first, as Hugging
   Face does for its "added tokens";
2. the rest is split on whitespace into chunks; each chunk goes through the basic tokenizer (``basic``)
   and WordPiece (``wordpiece``), memoised per chunk (docs/tokenizer.md, "Speed design").

Offsets are character offsets into the original string, as BertTokenizerFast reports them (docs/tokenizer.md,
"Offsets").
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping, Sequence

from bertkit.errors import BertkitError
from bertkit.tokenization.basic import CHUNK_RE, NON_SEPARATOR_SPACE_RE, BasicTokenizer, lowercase
from bertkit.tokenization.wordpiece import CACHE_SIZE, Memo, WordPiece

Offsets = list[tuple[int, int]]


class TextEncoder:
    """``encode(text, offsets, cut)``: the ids of ``text`` (no [CLS]/[SEP]), appending their offsets to ``offsets``
    and the positions of the special and added tokens cut out of the text to ``cut`` (each a word of its own)."""

    def __init__(self, vocab: Mapping[str, int], basic: BasicTokenizer, wordpiece: WordPiece,
                 special_tokens: Sequence[str], added_tokens: Sequence[str]):
        self.vocab, self.basic, self.wordpiece = vocab, basic, wordpiece
        self.chunks = Memo(self._encode_chunk, CACHE_SIZE)
        # Special tokens are cut out of the raw text, exactly as written; added tokens then out of what lies between,
        # where its normalised form holds theirs (an uncased "NAIVE" or "Naïve" is the added "naïve", "new\tyork"
        # the added "new york"), as Hugging Face matches its normalised added tokens.
        self.match_ids = {t: vocab[t] for t in special_tokens}
        self.first_chars = "".join(sorted({t[0] for t in special_tokens}))
        self.special_re = _longest_first(special_tokens)
        self.added_ids: dict[str, int] = {}
        for t in added_tokens:
            normal = basic.normalize(t)[0]
            if t not in self.match_ids and normal:
                self.added_ids.setdefault(normal, vocab[t])
        self.added_re = _longest_first(self.added_ids) if self.added_ids else None

    def encode(self, text: str, offsets: Offsets | None = None, cut: list[int] | None = None) -> list[int]:
        if not isinstance(text, str):
            raise TypeError(f"the tokenizer takes str (or a list of str), got {type(text).__name__}")
        ids: list[int] = []
        if any(c in text for c in self.first_chars) and self.special_re.search(text):
            pos = 0
            for m in self.special_re.finditer(text):
                self._encode_added(text[pos : m.start()], pos, ids, offsets, cut)
                if cut is not None:
                    cut.append(len(ids))
                ids.append(self.match_ids[m.group()])
                if offsets is not None:
                    offsets.append(m.span())
                pos = m.end()
            self._encode_added(text[pos:], pos, ids, offsets, cut)
        else:
            self._encode_added(text, 0, ids, offsets, cut)
        return ids

    def lowercase(self, text: str) -> str:
        """``text`` lower-cased around its special tokens: tokenizers splits them off before any normalizer runs, so
        sentence-transformers' Lowercase leaves "[SEP]" in a text the [SEP] token (lowered, it was the pieces of
        "[sep]")."""
        if not (any(c in text for c in self.first_chars) and self.special_re.search(text)):
            return lowercase(text)
        parts = self.special_re.split(text)
        return "".join(p + m for p, m in zip(map(lowercase, parts), [*self.special_re.findall(text), ""]))

    def _encode_added(self, text: str, base: int, ids: list[int], offsets: Offsets | None,
                      cut: list[int] | None = None) -> None:
        """Text without special tokens: the added tokens its normalised form holds, and the plain text around them."""
        added = self.added_re
        if added is None or not added.search(text.translate(self.basic.normal)):
            self._encode_plain(text, base, ids, offsets)
            return
        normal, source = self.basic.normalize(text)
        pos = 0
        for m in added.finditer(normal):
            start, end = source[m.start()], source[m.end() - 1] + 1
            self._encode_plain(text[pos:start], base + pos, ids, offsets)
            if cut is not None:
                cut.append(len(ids))
            ids.append(self.added_ids[m.group()])
            if offsets is not None:
                offsets.append((base + start, base + end))
            pos = end
        self._encode_plain(text[pos:], base + pos, ids, offsets)

    def _encode_plain(self, text: str, base: int, ids: list[int], offsets: Offsets | None) -> None:
        chunks = self.chunks
        odd_spaces = NON_SEPARATOR_SPACE_RE.search(text) is not None
        if offsets is None:
            if odd_spaces:  # dropped by BERT anyway; removing them makes str.split() split where BERT does
                text = NON_SEPARATOR_SPACE_RE.sub("", text)
            for chunk in text.split():
                ids += chunks[chunk][0]
            return
        spans = ((m.start(), m.group()) for m in CHUNK_RE.finditer(text)) if odd_spaces else _spans(text)
        append = offsets.append
        for start, chunk in spans:
            chunk_ids, chunk_offsets = chunks[chunk]
            ids += chunk_ids
            start += base
            if len(chunk_offsets) == 1:  # most chunks are one token
                a, b = chunk_offsets[0]
                append((start + a, start + b))
            else:
                offsets += [(start + a, start + b) for a, b in chunk_offsets]

    def _encode_chunk(self, chunk: str) -> tuple[tuple[int, ...], tuple[tuple[int, int], ...]]:
        """One whitespace-free chunk -> (ids, offsets relative to the chunk). Memoised in ``chunks``."""
        words, source = self.basic.split_chunk(chunk)
        ids: list[int] = []
        offsets: Offsets = []
        segment = self.wordpiece.segment
        for word, w in words:
            for i, a, b in segment(word):
                ids.append(i)
                if source is None:
                    offsets.append((w + a, w + b))
                else:
                    offsets.append((source[w + a], source[w + b - 1] + 1))
        return tuple(ids), tuple(offsets)


def check_added_tokens(basic: BasicTokenizer, tokens: Iterable[str], special_tokens: Sequence[str]) -> None:
    """Refuse added tokens (not special) that the normalised text cannot tell apart: two of one normalised form
    ("Foo" and "FOO" uncased), or one of none ("\u0301" with accents stripped). transformers matches either of two by
    no fixed rule (one live, the other once saved and loaded) and fails on every text with the other ("AddedVocabulary
    bad split"); matched as written (special tokens), each is its own."""
    known: dict[str, str] = {}
    for token in dict.fromkeys(tokens):
        if token in special_tokens:
            continue
        normal = basic.normalize(token)[0]
        other = known.setdefault(normal, token)
        if normal and other == token:
            continue
        clash = (f"to {normal!r}, as the added {other!r} does, so no text can tell them apart: keep one of them"
                 if normal else "to nothing, so no text can match it: leave it out")
        raise BertkitError(f"token {token!r} normalises ({basic!r}) {clash}, or add it with special_tokens=True to "
                           "match it as written")


def _spans(text: str) -> Iterator[tuple[int, str]]:
    """(start, chunk) for the chunks of ``str.split()``, located with ``str.find`` (faster than a regex).

    The first occurrence of a chunk at or after the end of the previous one is the chunk itself: only
    whitespace lies in between, and a chunk starts with a non-whitespace character.
    """
    pos = 0
    find = text.find
    for chunk in text.split():
        start = find(chunk, pos)
        pos = start + len(chunk)
        yield start, chunk


def _longest_first(tokens: Iterable[str]) -> re.Pattern[str]:
    """A pattern matching any of ``tokens``, the longest where several start at one position (leftmost-longest)."""
    return re.compile("|".join(re.escape(t) for t in sorted(tokens, key=len, reverse=True)))
