"""The tokenizer's output, ``BatchEncoding``: a dict of model inputs that also maps tokens back to the words and
characters of the texts they came from (``word_ids``, ``char_to_token``, ...), as transformers' does."""

from __future__ import annotations

import copy
import operator
from collections.abc import Collection, Mapping
from typing import Any, NamedTuple

from bertkit.errors import BertkitError

__all__ = ["BatchEncoding", "CharSpan", "RowInfo", "TokenSpan", "segment_ids"]


def segment_ids(encoded: Mapping[str, Any]) -> Any:
    """The ``token_type_ids`` of a tokenizer's output, or zeros shaped as its ``input_ids`` where the tokenizer
    leaves them out (a ``model_input_names`` without them): what transformers' model then reads, every token in
    segment 0. Lists (nested as the ids are), numpy arrays and tensors alike."""
    types = encoded.get("token_type_ids")
    if types is not None:
        return types
    ids = encoded["input_ids"]
    if hasattr(ids, "shape"):  # a tensor or an array, of the ids' kind
        return ids * 0

    def zeros(x: Any) -> Any:
        return [zeros(v) for v in x] if isinstance(x, (list, tuple)) else 0

    return zeros(ids)


class CharSpan(NamedTuple):
    """Characters ``start:end`` of the original text (transformers' ``CharSpan``)."""

    start: int
    end: int


class TokenSpan(NamedTuple):
    """Tokens ``start:end`` of an encoded row (transformers' ``TokenSpan``)."""

    start: int
    end: int


class RowInfo(NamedTuple):
    """Where the tokens of one output row came from (kept beside the BatchEncoding, never a key).

    ``len_a``/``len_b``: tokens of each text in the row (``len_b`` None without a pair); ``special``:
    [CLS]/[SEP] added; ``words_a``/``words_b``: word index per token when known (pre-split words, windows),
    else None (worked out from the ids); ``text_a``/``text_b`` and ``start_a``/``start_b``: the input texts
    and the index of the row's first token among all tokens of that text (> 0 in later overflow windows).
    """

    len_a: int
    len_b: int | None
    special: bool
    words_a: list[int] | None
    words_b: list[int] | None
    text_a: Any = None
    text_b: Any = None
    start_a: int = 0
    start_b: int = 0


class BatchEncoding(dict):
    """The tokenizer's output: a plain ``dict`` whose keys can also be read as attributes.

    As transformers' BatchEncoding from a fast tokenizer, the tokenizer's own output also answers the
    token/word/character maps per row (docs/tokenizer.md, "Token, word and character maps"); those taking
    ``batch_or_*_index`` read one argument as the index into row 0 and two as (row, index).
    """

    # Set by the tokenizer (not keys, so they never reach the model): one RowInfo per row, whether the input
    # was batched, and the tokenizer with its is_split_into_words (for token strings, "##" pieces and offsets).
    _row_info: list[RowInfo] | None = None
    _batched: bool = True
    _vocabulary: Any = None  # the tokenizer's Vocabulary these ids came from
    _split: bool = False

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    @property
    def data(self) -> dict[str, Any]:
        """The columns as a dict (transformers' ``BatchEncoding.data``): this object, which is one."""
        return self

    @property
    def is_fast(self) -> bool:
        """Whether the tokenizer made this encoding, so it answers the token/word/character maps (transformers':
        whether a fast tokenizer did); False for ``pad()``'s output, as there."""
        return self._row_info is not None

    @property
    def n_sequences(self) -> int | None:
        """The texts in row 0: 1, or 2 for a pair (transformers' ``BatchEncoding.n_sequences``); None without rows
        or maps."""
        return None if not self._row_info else 1 if self._row_info[0].len_b is None else 2

    def copy(self) -> BatchEncoding:
        """A shallow copy that is still a BatchEncoding with its maps (``dict.copy`` would give a plain dict)."""
        return copy.copy(self)

    def __or__(self, other: Any) -> BatchEncoding:
        out = self.copy()
        out.update(other)
        return out

    def to(self, device: Any) -> BatchEncoding:
        """Move every tensor to ``device`` (in place, as Hugging Face); returns self for chaining."""
        for key, value in self.items():
            if hasattr(value, "to") and hasattr(value, "device"):
                self[key] = value.to(device)
        return self

    def _info(self, batch_index: int, method: str) -> RowInfo:
        if self._row_info is None:
            raise BertkitError(f"{method} needs the tokenizer's own output (this BatchEncoding was built "
                               "elsewhere, e.g. by pad())")
        return self._row_info[batch_index]

    def _row(self, key: str, batch_index: int) -> list[Any]:
        """Row ``batch_index`` of column ``key`` as a list (the column itself when one text was encoded)."""
        row = self[key][batch_index] if self._batched else self[key]
        return row.tolist() if hasattr(row, "tolist") else list(row)

    def _segments(self, batch_index: int) -> tuple[list[Any], list[Any]]:
        """(sequence id, word id) of every token of row ``batch_index``: None for special tokens and padding."""
        info = self._info(batch_index, "word_ids/sequence_ids")
        row = self._row("input_ids", batch_index)
        seq: list[Any] = [None] if info.special else []
        words: list[Any] = [None] if info.special else []
        start = len(seq)
        for s, n, given in ((0, info.len_a, info.words_a), (1, info.len_b, info.words_b)):
            if n is None:
                continue
            seq += [s] * n
            if given is None:
                given = word_index(row[start:start + n], self._vocabulary._continuation_ids)
            words += given
            start += n
            if info.special:
                seq.append(None)
                words.append(None)
                start += 1
        pad = [None] * (len(row) - len(seq))
        return seq + pad, words + pad

    def word_ids(self, batch_index: int = 0) -> list[int | None]:
        """The word each token of row ``batch_index`` belongs to (None for [CLS]/[SEP]/[PAD]), as Hugging Face's
        ``BatchEncoding.word_ids``: words of each text numbered from 0; with ``is_split_into_words`` the
        index of the input word."""
        return self._segments(batch_index)[1]

    def sequence_ids(self, batch_index: int = 0) -> list[int | None]:
        """0 for tokens of the first text, 1 of the second, None for special tokens and padding."""
        return self._segments(batch_index)[0]

    def tokens(self, batch_index: int = 0) -> list[str]:
        """The token strings of row ``batch_index``, special tokens and padding included."""
        self._info(batch_index, "tokens()")
        return [self._vocabulary.ids_to_tokens[i] for i in self._row("input_ids", batch_index)]

    def _sequence_range(self, batch_index: int, sequence_index: int) -> range:
        """Token positions of text ``sequence_index`` in the row; the whole row when it has no such text
        (as tokenizers' ``Encoding.sequence_range``)."""
        info = self._info(batch_index, "char_to_token/word_to_tokens")
        first = 1 if info.special else 0
        if sequence_index == 0:
            return range(first, first + info.len_a)
        if sequence_index == 1 and info.len_b is not None:
            start = first + info.len_a + first
            return range(start, start + info.len_b)
        return range(len(self._row("input_ids", batch_index)))

    def _offsets(self, batch_index: int) -> list[tuple[int, int]]:
        """The offset_mapping row, computed from the input texts when it was not asked for."""
        if "offset_mapping" in self:
            return [tuple(o) for o in self._row("offset_mapping", batch_index)]
        cache = self.__dict__.setdefault("_offset_rows", {})
        if batch_index not in cache:
            info = self._info(batch_index, "char_to_token/token_to_chars")
            edge = [(0, 0)] if info.special else []
            out = list(edge)
            for text, start, n in ((info.text_a, info.start_a, info.len_a),
                                   (info.text_b, info.start_b, info.len_b)):
                if n is not None:
                    out += self._vocabulary.segment(text, True, self._split).offsets[start:start + n] + edge
            cache[batch_index] = out + [(0, 0)] * (len(self._row("input_ids", batch_index)) - len(out))
        return cache[batch_index]

    def char_to_token(self, batch_or_char_index: int, char_index: int | None = None,
                      sequence_index: int = 0) -> int | None:
        """The token of text ``sequence_index`` (0 or 1) that covers character ``char_index`` of that text, or
        None (a space, a dropped character, out of range). ``char_to_token(c)`` reads row 0."""
        batch_index, char_index = _row_and_index(batch_or_char_index, char_index, "char_index")
        offsets = self._offsets(batch_index)
        for t in self._sequence_range(batch_index, sequence_index):
            start, end = offsets[t]
            if start <= char_index < end:
                return t
        return None

    def token_to_chars(self, batch_or_token_index: int, token_index: int | None = None) -> CharSpan | None:
        """The characters of its text that token ``token_index`` covers, or None for [CLS]/[SEP]/[PAD] and an
        index past the row. ``token_to_chars(t)`` reads row 0."""
        batch_index, token_index = _row_and_index(batch_or_token_index, token_index, "token_index")
        sequence_ids = self.sequence_ids(batch_index)
        if token_index >= len(sequence_ids) or sequence_ids[token_index] is None:
            return None
        return CharSpan(*self._offsets(batch_index)[token_index])

    def word_to_tokens(self, batch_or_word_index: int, word_index: int | None = None,
                       sequence_index: int = 0) -> TokenSpan | None:
        """The tokens of word ``word_index`` of text ``sequence_index`` (0 or 1), or None when the text has no
        such word. ``word_to_tokens(w)`` reads row 0."""
        batch_index, word_index = _row_and_index(batch_or_word_index, word_index, "word_index")
        words = self.word_ids(batch_index)
        found = []
        for t in self._sequence_range(batch_index, sequence_index):
            if words[t] is not None and words[t] > word_index:  # words only grow: stop, as tokenizers does
                break
            if words[t] == word_index:
                found.append(t)
        return TokenSpan(found[0], found[-1] + 1) if found else None

    def token_to_word(self, batch_or_token_index: int, token_index: int | None = None) -> int | None:
        """The word token ``token_index`` belongs to (``word_ids``' entry), None for [CLS]/[SEP]/[PAD] and an index
        past the row. ``token_to_word(t)`` reads row 0."""
        batch_index, token_index = _row_and_index(batch_or_token_index, token_index, "token_index")
        words = self.word_ids(batch_index)
        return words[token_index] if token_index < len(words) else None

    def token_to_sequence(self, batch_or_token_index: int, token_index: int | None = None) -> int | None:
        """The text token ``token_index`` comes from (``sequence_ids``' entry: 0 or 1), None for [CLS]/[SEP]/[PAD]
        and an index past the row. ``token_to_sequence(t)`` reads row 0."""
        batch_index, token_index = _row_and_index(batch_or_token_index, token_index, "token_index")
        sequences = self.sequence_ids(batch_index)
        return sequences[token_index] if token_index < len(sequences) else None

    def char_to_word(self, batch_or_char_index: int, char_index: int | None = None,
                     sequence_index: int = 0) -> int | None:
        """The word of text ``sequence_index`` that covers character ``char_index`` of that text, or None (as
        ``char_to_token``). ``char_to_word(c)`` reads row 0."""
        batch_index, char_index = _row_and_index(batch_or_char_index, char_index, "char_index")
        token = self.char_to_token(batch_index, char_index, sequence_index)
        return None if token is None else self.word_ids(batch_index)[token]

    def word_to_chars(self, batch_or_word_index: int, word_index: int | None = None,
                      sequence_index: int = 0) -> CharSpan | None:
        """The characters word ``word_index`` of text ``sequence_index`` covers (its first token's start to its
        last token's end), or None when the text has no such word. ``word_to_chars(w)`` reads row 0."""
        batch_index, word_index = _row_and_index(batch_or_word_index, word_index, "word_index")
        span = self.word_to_tokens(batch_index, word_index, sequence_index)
        if span is None:
            return None
        offsets = self._offsets(batch_index)
        return CharSpan(offsets[span.start][0], offsets[span.end - 1][1])


def _row_and_index(batch_or_index: int, index: int | None, name: str) -> tuple[int, int]:
    """(row, index) from transformers' ``(batch_or_index, index=None)`` arguments: one argument is an index into
    row 0. The index is an int (numpy and 0-d tensor ints too); a negative one is an error, as in tokenizers."""
    batch_index, index = (0, batch_or_index) if index is None else (batch_or_index, index)
    value = None if isinstance(index, bool) or not hasattr(index, "__index__") else operator.index(index)
    if value is None or value < 0:
        raise BertkitError(f"{name} must be an int >= 0, got {index!r}")
    return batch_index, value


def word_index(ids: list[int], continuation_ids: frozenset[int], starts: Collection[int] = ()) -> list[int]:
    """Word number of each token: a new word starts at every token that is not a "##" continuation piece
    (BERT's pre-tokenizer words, i.e. whitespace- and punctuation-separated, each an added token too) and at the
    positions ``starts`` (added tokens cut out of the text whose id is also a continuation piece's, "##zz")."""
    words, w = [], -1
    for pos, i in enumerate(ids):
        if i not in continuation_ids or pos in starts:
            w += 1
        words.append(w)
    return words
