"""From token ids to model inputs: special tokens, truncation, padding, tensors.

The rules are those of Hugging Face's BertTokenizerFast (its Rust ``TemplateProcessing``,
``truncate_encodings`` and padding), so that features built here match features built there:

- single text: ``[CLS] A [SEP]``, pair: ``[CLS] A [SEP] B [SEP]``; token_type_ids 0 up to and including
  the first ``[SEP]``, 1 after (BERT paper, section 3, "segment embeddings");
- truncation removes tokens from the right; ``longest_first`` shares the budget as described in
  ``truncation_lengths``; ``only_first``/``only_second`` must leave at least one token of the sequence
  they cut, else ValueError (Hugging Face raises "Sequence to truncate too short");
- padding on the right with ``[PAD]``, token type 0, attention 0, special-token mask 1, offsets (0, 0).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from bertkit.errors import BertkitError

__all__ = ["BatchEncoding", "CharSpan", "RowInfo", "TokenSpan", "resolve_padding", "resolve_truncation",
           "truncation_lengths"]

TRUNCATION_STRATEGIES = ("longest_first", "only_first", "only_second")


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
    """The tokenizer's output: a plain ``dict`` (``input_ids``, ``token_type_ids``, ``attention_mask``, and
    ``special_tokens_mask`` / ``offset_mapping`` / ``length`` when asked for). Keys can also be read as
    attributes.

    As transformers' BatchEncoding from a fast tokenizer, the tokenizer's own output also answers, per row:
    ``tokens``, ``word_ids``, ``sequence_ids``, ``char_to_token``, ``token_to_chars`` and
    ``word_to_tokens``. Those taking ``batch_or_*_index`` read one argument as the index into row 0 and two
    as (row, index). Character positions are those of ``offset_mapping``, which these compute when it was
    not asked for.
    """

    # Set by the tokenizer (not keys, so they never reach the model): one RowInfo per row, the "##" piece
    # ids, whether the input was batched, and how to get token strings and offsets back.
    _row_info: list[RowInfo] | None = None
    _continuation_ids: frozenset[int] = frozenset()
    _batched: bool = True
    _token_strings: Callable[[list[int]], list[str]] | None = None
    _offsets_of: Callable[[Any], list[tuple[int, int]]] | None = None

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

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

    def _ids(self, batch_index: int) -> list[int]:
        ids = self["input_ids"]
        row = ids[batch_index] if self._batched else ids
        return row.tolist() if hasattr(row, "tolist") else list(row)

    def _segments(self, batch_index: int) -> tuple[list[Any], list[Any]]:
        """(sequence id, word id) of every token of row ``batch_index``: None for special tokens and padding."""
        info = self._info(batch_index, "word_ids/sequence_ids")
        row = self._ids(batch_index)
        seq: list[Any] = [None] if info.special else []
        words: list[Any] = [None] if info.special else []
        start = len(seq)
        for s, n, given in ((0, info.len_a, info.words_a), (1, info.len_b, info.words_b)):
            if n is None:
                continue
            seq += [s] * n
            if given is None:
                given = word_index(row[start:start + n], self._continuation_ids)
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
        assert self._token_strings is not None
        return self._token_strings(self._ids(batch_index))

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
        return range(len(self._ids(batch_index)))

    def _offsets(self, batch_index: int) -> list[tuple[int, int]]:
        """The offset_mapping row, computed from the input texts when it was not asked for."""
        if "offset_mapping" in self:
            offsets = self["offset_mapping"]
            row = offsets[batch_index] if self._batched else offsets
            return [tuple(o) for o in (row.tolist() if hasattr(row, "tolist") else row)]
        cache = self.__dict__.setdefault("_offset_rows", {})
        if batch_index not in cache:
            info = self._info(batch_index, "char_to_token/token_to_chars")
            assert self._offsets_of is not None
            edge = [(0, 0)] if info.special else []
            out = list(edge)
            for text, start, n in ((info.text_a, info.start_a, info.len_a),
                                   (info.text_b, info.start_b, info.len_b)):
                if n is not None:
                    out += self._offsets_of(text)[start:start + n] + edge
            cache[batch_index] = out + [(0, 0)] * (len(self._ids(batch_index)) - len(out))
        return cache[batch_index]

    def char_to_token(self, batch_or_char_index: int, char_index: int | None = None,
                      sequence_index: int = 0) -> int | None:
        """The token of text ``sequence_index`` (0 or 1) that covers character ``char_index`` of that text, or
        None (a space, a dropped character, out of range). ``char_to_token(c)`` reads row 0."""
        batch_index, char_index = (0, batch_or_char_index) if char_index is None else (batch_or_char_index,
                                                                                       char_index)
        char_index = _check_index(char_index, "char_index")
        offsets = self._offsets(batch_index)
        for t in self._sequence_range(batch_index, sequence_index):
            start, end = offsets[t]
            if start <= char_index < end:
                return t
        return None

    def token_to_chars(self, batch_or_token_index: int, token_index: int | None = None) -> CharSpan | None:
        """The characters of its text that token ``token_index`` covers, or None for [CLS]/[SEP]/[PAD] and an
        index past the row. ``token_to_chars(t)`` reads row 0."""
        batch_index, token_index = (0, batch_or_token_index) if token_index is None else (batch_or_token_index,
                                                                                          token_index)
        token_index = _check_index(token_index, "token_index")
        sequence_ids = self.sequence_ids(batch_index)
        if token_index >= len(sequence_ids) or sequence_ids[token_index] is None:
            return None
        return CharSpan(*self._offsets(batch_index)[token_index])

    def word_to_tokens(self, batch_or_word_index: int, word_index: int | None = None,
                       sequence_index: int = 0) -> TokenSpan | None:
        """The tokens of word ``word_index`` of text ``sequence_index`` (0 or 1), or None when the text has no
        such word. ``word_to_tokens(w)`` reads row 0."""
        batch_index, word_index = (0, batch_or_word_index) if word_index is None else (batch_or_word_index,
                                                                                       word_index)
        word_index = _check_index(word_index, "word_index")
        words = self.word_ids(batch_index)
        found = []
        for t in self._sequence_range(batch_index, sequence_index):
            if words[t] is not None and words[t] > word_index:  # words only grow: stop, as tokenizers does
                break
            if words[t] == word_index:
                found.append(t)
        return TokenSpan(found[0], found[-1] + 1) if found else None


def _check_index(index: Any, name: str) -> int:
    """``index`` as an int (numpy and 0-d tensor ints too); a negative one is an error, as in tokenizers."""
    value = None if isinstance(index, bool) or not hasattr(index, "__index__") else operator.index(index)
    if value is None or value < 0:
        raise BertkitError(f"{name} must be an int >= 0, got {index!r}")
    return value


def resolve_truncation(
    truncation: bool | str | None, max_length: int | None, padding: bool | str
) -> str | None:
    """The truncation strategy to apply, or None.

    ``None`` (the default) is Hugging Face's default: truncate with ``longest_first`` when ``max_length``
    is given and padding is off, else do not truncate. ``True`` means ``longest_first``.
    """
    if truncation is None:
        return "longest_first" if max_length is not None and padding is False else None
    if truncation is True:
        return "longest_first"
    if truncation is False or truncation == "do_not_truncate":
        return None
    if truncation in TRUNCATION_STRATEGIES:
        return truncation
    raise BertkitError(
        f"truncation={truncation!r} is not one of True, False, None, {', '.join(map(repr, TRUNCATION_STRATEGIES))}"
    )


def resolve_padding(padding: bool | str | None) -> str | None:
    """``"longest"``, ``"max_length"`` or None (no padding)."""
    if padding is True or padding == "longest":
        return "longest"
    if padding is False or padding is None or padding == "do_not_pad":
        return None
    if padding == "max_length":
        return "max_length"
    raise BertkitError(f"padding={padding!r} is not one of True, False, 'longest', 'max_length'")


def truncation_lengths(
    len_a: int, len_b: int | None, max_length: int, strategy: str, num_special: int
) -> tuple[int, int | None]:
    """How many tokens of A (and B) to keep so that the encoded input has at most ``max_length`` tokens.

    ``num_special`` is the number of special tokens that will be added (2 for a single text, 3 for a pair,
    0 without special tokens). Mirrors ``tokenizers``' ``truncate_encodings``; in ``longest_first``, with
    ``n1 <= n2`` the shorter and longer lengths and ``t`` the budget: the shorter keeps everything and the
    longer gets the rest (but never less than the shorter's length), and when even that does not fit both
    get ``t // 2``, the longer one ``t // 2 + t % 2`` (the second text when both are equally long).
    """
    if max_length < num_special:
        # Hugging Face silently skips truncation here; an input that cannot fit is a caller error.
        raise BertkitError(
            f"max_length {max_length} is smaller than the {num_special} special tokens this input gets; "
            f"use max_length >= {num_special}"
        )
    target = max_length - num_special
    if target == 0:  # as tokenizers: everything goes, whatever the strategy
        return 0, (None if len_b is None else 0)
    total = len_a + (len_b or 0)
    if total <= target:
        return len_a, len_b
    to_remove = total - target
    if strategy == "longest_first":
        if len_b is None:
            return target, None
        n1, n2 = len_a, len_b
        swap = n1 > n2
        if swap:
            n1, n2 = n2, n1
        n2 = n1 if n1 > target else max(n1, target - n1)
        if n1 + n2 > target:
            n1 = target // 2
            n2 = n1 + target % 2
        if swap:
            n1, n2 = n2, n1
        return min(n1, len_a), min(n2, len_b)
    if strategy == "only_first":
        if len_a > to_remove:
            return len_a - to_remove, len_b
        raise BertkitError(
            f"truncation='only_first' cannot fit max_length {max_length}: the first text has {len_a} tokens, "
            f"the second {len_b or 0} and {num_special} special tokens are added, so {to_remove} would have to "
            f"go from the first; use a larger max_length or truncation='longest_first'"
        )
    if strategy == "only_second":
        if len_b is None:
            raise BertkitError(
                f"truncation='only_second' needs a text_pair, but this input ({len_a} tokens, more than "
                f"max_length {max_length} allows) is a single text; use truncation='only_first' or 'longest_first'"
            )
        if len_b > to_remove:
            return len_a, len_b - to_remove
        raise BertkitError(
            f"truncation='only_second' cannot fit max_length {max_length}: the second text has {len_b} tokens, "
            f"the first {len_a} and {num_special} special tokens are added, so {to_remove} would have to go "
            f"from the second; use a larger max_length or truncation='longest_first'"
        )
    raise BertkitError(f"unknown truncation strategy {strategy!r}; use one of {TRUNCATION_STRATEGIES}")


# What each column of an encoded row pads with (``input_ids`` with the tokenizer's pad id).
PAD_VALUES = {"input_ids": 0, "token_type_ids": 0, "attention_mask": 0, "special_tokens_mask": 1, "offset_mapping": (0, 0)}


def pad_rows(rows: list[dict[str, list]], length: int, pad_id: int) -> None:
    """Right-pad every row (a dict of per-token lists) to ``length`` in place; longer rows are left alone."""
    if not rows:
        return
    from bertkit.padding import pad_batch  # here, so that tokenizing without padding does not pay for torch

    fills = {key: pad_id if key == "input_ids" else PAD_VALUES[key] for key in rows[0]}
    padded = pad_batch(rows, fills, width=length, return_tensors=None)
    for b, row in enumerate(rows):
        for key in fills:
            row[key][:] = padded[key][b]


def to_batch_encoding(
    rows: list[dict[str, list]], batched: bool, return_tensors: str | None
) -> BatchEncoding:
    """Rows -> BatchEncoding of lists (one row unwrapped unless ``batched``) or of (B, T) tensors/arrays."""
    keys = list(rows[0]) if rows else ["input_ids", "token_type_ids", "attention_mask"]
    if return_tensors is None:
        if batched:
            return BatchEncoding({k: [row[k] for row in rows] for k in keys})
        return BatchEncoding(rows[0])
    if return_tensors not in ("pt", "np"):
        raise BertkitError(f"return_tensors={return_tensors!r} is not supported; use 'pt', 'np' or None")
    lengths = sorted({len(row["input_ids"]) for row in rows})
    if len(lengths) > 1:
        raise BertkitError(
            f"cannot stack sequences of different lengths {lengths[0]}..{lengths[-1]} into one tensor: "
            f"pass padding=True (or 'max_length'), or return_tensors=None for lists"
        )
    out = BatchEncoding()
    for k in keys:
        data: Sequence = [row[k] for row in rows]
        if return_tensors == "pt":
            import torch  # imported here so that tokenizing without tensors does not pay for torch

            tensor = torch.tensor(data, dtype=torch.long)
            if not rows or not lengths[0]:
                tensor = (
                    tensor.reshape(len(rows), 0, 2) if k == "offset_mapping" else tensor.reshape(len(rows), 0)
                )
            out[k] = tensor
        else:
            import numpy as np

            array = np.asarray(data, dtype=np.int64)
            if not rows or not lengths[0]:
                array = array.reshape((len(rows), 0, 2) if k == "offset_mapping" else (len(rows), 0))
            out[k] = array
    return out


def word_index(ids: list[int], continuation_ids: frozenset[int]) -> list[int]:
    """Word number of each token: a new word starts at every token that is not a "##" continuation piece
    (BERT's pre-tokenizer words, i.e. whitespace- and punctuation-separated, each an added token too)."""
    words, w = [], -1
    for i in ids:
        if i not in continuation_ids:
            w += 1
        words.append(w)
    return words
