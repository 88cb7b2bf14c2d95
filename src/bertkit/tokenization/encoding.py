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

from collections.abc import Sequence
from typing import Any

from bertkit.errors import BertkitError

__all__ = ["BatchEncoding", "resolve_padding", "resolve_truncation", "truncation_lengths"]

TRUNCATION_STRATEGIES = ("longest_first", "only_first", "only_second")


class BatchEncoding(dict):
    """The tokenizer's output: a plain ``dict`` (``input_ids``, ``token_type_ids``, ``attention_mask``, and
    ``special_tokens_mask`` / ``offset_mapping`` when asked for). Keys can also be read as attributes."""

    # Set by the tokenizer (not keys, so they never reach the model): per row (len A, len B or None,
    # special tokens added, word index per A token or None, per B token or None), and the "##" piece ids.
    _row_info: list[tuple] | None = None
    _continuation_ids: frozenset[int] = frozenset()
    _batched: bool = True

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

    def _segments(self, batch_index: int) -> tuple[list[Any], list[Any]]:
        """(sequence id, word id) of every token of row ``batch_index``: None for special tokens and padding."""
        if self._row_info is None:
            raise BertkitError("word_ids/sequence_ids need the tokenizer's own output (this BatchEncoding was "
                               "built elsewhere, e.g. by pad())")
        ids = self["input_ids"]
        row = ids[batch_index] if self._batched else ids
        row = row.tolist() if hasattr(row, "tolist") else list(row)
        len_a, len_b, special, words_a, words_b = self._row_info[batch_index]
        seq: list[Any] = [None] if special else []
        words: list[Any] = [None] if special else []
        start = len(seq)
        for s, n, given in ((0, len_a, words_a), (1, len_b, words_b)):
            if n is None:
                continue
            seq += [s] * n
            if given is None:
                given = word_index(row[start:start + n], self._continuation_ids)
            words += given
            start += n
            if special:
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


def pad_rows(rows: list[dict[str, list]], length: int, pad_id: int) -> None:
    """Right-pad every row (a dict of per-token lists) to ``length`` in place; longer rows are left alone."""
    pad_values = {
        "input_ids": pad_id,
        "token_type_ids": 0,
        "attention_mask": 0,
        "special_tokens_mask": 1,
        "offset_mapping": (0, 0),
    }
    for row in rows:
        missing = length - len(row["input_ids"])
        if missing > 0:
            for key, values in row.items():
                values.extend([pad_values[key]] * missing)


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
