"""Texts -> model batches, the part of ``BertTokenizer`` that ``tokenizer(...)`` and ``tokenizer.pad(...)`` run:
single texts, pairs or pre-split words; special tokens and segment ids; truncation (one side, the longest first,
or overflowing windows with a stride); padding; lists, numpy arrays or tensors.

A mixin of ``BertTokenizer`` (``tokenizer.py`` keeps the vocabulary, text -> ids with offsets, decoding and the
files): it reaches the text encoder through ``self._encode_text`` / ``self._encode_plain`` and the special
tokens through ``self``.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

from bertkit.errors import BertkitError
from bertkit.tokenization.encoding import (
    BatchEncoding,
    RowInfo,
    pad_rows,
    resolve_padding,
    resolve_truncation,
    to_batch_encoding,
    truncation_lengths,
    word_index,
)


class BatchCallMixin:
    """``__call__`` and ``pad`` with transformers' arguments, for ``BertTokenizer``."""

    def __call__(
        self,
        text: str | Sequence[str] | Sequence[Sequence[str]],
        text_pair: str | Sequence[str] | Sequence[Sequence[str]] | None = None,
        *,
        add_special_tokens: bool = True,
        max_length: int | None = None,
        truncation: bool | str | None = None,
        padding: bool | str = False,
        pad_to_multiple_of: int | None = None,
        return_tensors: str | None = None,
        return_token_type_ids: bool | None = None,
        return_attention_mask: bool | None = None,
        return_offsets_mapping: bool = False,
        return_special_tokens_mask: bool = False,
        return_length: bool = False,
        is_split_into_words: bool = False,
        return_overflowing_tokens: bool = False,
        stride: int = 0,
    ) -> BatchEncoding:
        """Encode one text / pair, or a batch of them.

        Returns a BatchEncoding (a dict) with ``input_ids``, ``token_type_ids``, ``attention_mask`` and, when
        asked, ``special_tokens_mask``, ``offset_mapping`` ((start, end) into the original text; (0, 0)
        for [CLS]/[SEP]/[PAD]) and ``length`` (tokens per row, padding included). A str gives lists of ints,
        a list of str gives lists of lists; with ``return_tensors="pt"`` / ``"np"`` every value is a (B, T)
        tensor / int64 array ((B, T, 2) for offsets, (B,) for length), B = 1 for a single text.
        ``return_token_type_ids=False`` / ``return_attention_mask=False`` leave those keys out (None or True:
        included). The BatchEncoding also maps tokens to words and characters: ``word_ids(i)``,
        ``sequence_ids(i)``, ``tokens(i)``, ``char_to_token``, ``token_to_chars``, ``word_to_tokens``.

        truncation: None (default) = Hugging Face's default, i.e. ``longest_first`` only when ``max_length``
        is given and ``padding`` is False; True = ``longest_first``; or ``"only_first"``/``"only_second"``.
        ``max_length`` defaults to ``model_max_length`` when truncating or padding to ``"max_length"``.
        padding: False, True/``"longest"`` (to the longest in the batch) or ``"max_length"``; with
        ``pad_to_multiple_of`` the padded length is rounded up to a multiple of it.
        is_split_into_words: each text is a list of words (NER); word ids index them, offsets are
        relative to each word, as in Hugging Face.
        return_overflowing_tokens: the truncated text (the single text, or the one ``only_first`` /
        ``only_second`` names) is cut into windows that overlap by ``stride`` tokens, each its own row;
        ``overflow_to_sample_mapping`` gives each row's input index. The output is then always batched.
        A sequence longer than ``model_max_length`` is not an error here: the model checks its positions.
        """
        texts, pairs, batched = _inputs(text, text_pair, is_split_into_words)
        strategy = resolve_truncation(truncation, max_length, padding)
        pad = resolve_padding(padding)
        if max_length is None and (strategy is not None or pad == "max_length"):
            max_length = self.model_max_length
        _check_lengths(max_length, pad_to_multiple_of, stride, return_overflowing_tokens)

        rows, infos, sample_mapping = self._encode_rows(
            texts, pairs, add_special_tokens, strategy, max_length, return_overflowing_tokens, stride,
            return_offsets_mapping, return_special_tokens_mask, is_split_into_words)
        self._pad_and_select(rows, pad, max_length, pad_to_multiple_of, return_token_type_ids, return_attention_mask)
        batched = batched or return_overflowing_tokens
        out = _batch_encoding(rows, sample_mapping, batched, return_tensors, return_length, return_overflowing_tokens)
        self._attach_rows(out, infos, batched or return_tensors is not None, is_split_into_words)
        return out

    def _pad_and_select(self, rows: list[dict[str, list]], pad: str | None, max_length: int | None,
                        multiple: int | None, token_type_ids: bool | None, attention_mask: bool | None) -> None:
        """In place: pad ``rows`` to ``max_length`` or the longest row, rounded up to ``multiple`` (``pad`` None:
        not at all), then drop the keys the caller turned off (False; None or True keeps them)."""
        if pad is not None and rows:
            length = max_length if pad == "max_length" else max(len(r["input_ids"]) for r in rows)
            pad_rows(rows, _round_up(length, multiple), self.pad_token_id)
        for key, wanted in (("token_type_ids", token_type_ids), ("attention_mask", attention_mask)):
            if wanted is False:
                for row in rows:
                    del row[key]

    def _encode_rows(self, texts: list, pairs: list, add_special: bool, strategy: str | None,
                     max_length: int | None, overflow: bool, stride: int, with_offsets: bool,
                     special_mask: bool, split: bool) -> tuple[list[dict[str, list]], list[RowInfo], list[int]]:
        """(the unpadded output rows, what each row's word and character maps need, each row's input index):
        each text or pair segmented once, then cut into one row or, with ``overflow``, several windows."""
        rows: list[dict[str, list]] = []
        infos: list[RowInfo] = []
        sample_mapping: list[int] = []
        for index, (a, b) in enumerate(zip(texts, pairs)):
            seg_a = self._segment(a, with_offsets, split)
            seg_b = None if b is None else self._segment(b, with_offsets, split)
            for (win_a, start_a), (win_b, start_b) in self._windows(
                seg_a, seg_b, add_special, strategy, max_length, overflow, stride
            ):
                rows.append(self._assemble(win_a, win_b, add_special, special_mask))
                infos.append(RowInfo(len(win_a[0]), None if win_b is None else len(win_b[0]), add_special,
                                     win_a[2], None if win_b is None else win_b[2], a, b, start_a, start_b))
                sample_mapping.append(index)
        return rows, infos, sample_mapping

    def _attach_rows(self, out: BatchEncoding, infos: list[RowInfo], nested: bool, split: bool) -> None:
        """What ``word_ids``, ``tokens``, ``char_to_token``... of the output need (attributes, not keys)."""
        out._row_info = infos
        out._continuation_ids = self._continuation_ids
        out._batched = nested  # values are per-row (lists of lists, or (B, T) tensors)
        out._token_strings = self.convert_ids_to_tokens
        out._offsets_of = functools.partial(self._text_offsets, split=split)  # picklable, unlike a lambda

    def _text_offsets(self, text: Any, split: bool) -> list[tuple[int, int]]:
        """Offsets of every token of one input text (no special tokens), as ``return_offsets_mapping`` gives."""
        return self._segment(text, True, split)[1]

    def _segment(self, text: Any, with_offsets: bool, split: bool) -> tuple[list, list | None, list | None]:
        """(ids, offsets or None, word index per token or None: worked out later from the ids)."""
        offsets: list[tuple[int, int]] | None = [] if with_offsets else None
        if not split:
            return self._encode_text(text, offsets), offsets, None
        if isinstance(text, str) or not all(isinstance(w, str) for w in text):
            raise TypeError("with is_split_into_words=True each text is a list of words (str), got "
                            f"{type(text).__name__}: {str(text)[:60]!r}")
        ids: list[int] = []
        words: list[int] = []
        for w, word in enumerate(text):
            n = len(ids)
            ids += self._encode_text(word, offsets)  # offsets relative to the word, as Hugging Face gives them
            words += [w] * (len(ids) - n)
        return ids, offsets, words

    def _windows(self, seg_a, seg_b, add_special: bool, strategy: str | None, max_length: int | None,
                 overflow: bool, stride: int):
        """The (A, B) segment slices of each output row, each with the index of its first token in its text:
        one row, or overlapping windows with ``overflow``."""
        len_a, len_b = len(seg_a[0]), None if seg_b is None else len(seg_b[0])
        if strategy is None:
            return [((seg_a, 0), (seg_b, 0))]
        num_special = (2 if seg_b is None else 3) if add_special else 0
        n_a, n_b = truncation_lengths(len_a, len_b, max_length, strategy, num_special)
        cut = lambda seg, lo, hi: (seg[0][lo:hi], None if seg[1] is None else seg[1][lo:hi],  # noqa: E731
                                   None if seg[2] is None else seg[2][lo:hi])
        if not overflow or (n_a == len_a and n_b == len_b):
            return [((cut(seg_a, 0, n_a), 0), (None if seg_b is None else cut(seg_b, 0, n_b), 0))]
        if seg_b is not None and strategy == "longest_first":
            raise BertkitError("return_overflowing_tokens on text pairs needs truncation='only_first' or "
                               "'only_second' (which text to cut into windows), not 'longest_first'")
        which, full, keep = (0, seg_a, n_a) if n_a != len_a else (1, seg_b, n_b)
        if stride >= keep:
            raise BertkitError(f"stride {stride} must be smaller than the {keep} tokens of the text that fit in "
                               f"each window (max_length {max_length}); use a smaller stride or a larger max_length")
        if full[2] is None:  # word ids count from the start of the text, also in later windows
            full = (*full[:2], word_index(full[0], self._continuation_ids))
        rows, start = [], 0
        while True:
            stop = min(start + keep, len(full[0]))
            window = (cut(full, start, stop), start)
            rows.append((window, (seg_b, 0)) if which == 0 else ((seg_a, 0), window))
            if stop == len(full[0]):
                return rows
            start += keep - stride

    def _assemble(self, seg_a, seg_b, add_special_tokens: bool, with_special_mask: bool) -> dict[str, list]:
        ids_a, offs_a = seg_a[0], seg_a[1]
        ids_b, offs_b = (None, None) if seg_b is None else seg_b[:2]
        len_a, len_b = len(ids_a), (None if ids_b is None else len(ids_b))
        if add_special_tokens:
            cls_, sep = self.cls_token_id, self.sep_token_id
            input_ids = [cls_, *ids_a, sep]
            type_ids = [0] * (len_a + 2)
            special = [1, *[0] * len_a, 1]
            if ids_b is not None:
                input_ids += [*ids_b, sep]
                type_ids += [1] * (len_b + 1)
                special += [*[0] * len_b, 1]
        else:
            input_ids = ids_a + (ids_b or [])
            type_ids = [0] * len_a + [1] * (len_b or 0)
            special = [0] * len(input_ids)
        row = {"input_ids": input_ids, "token_type_ids": type_ids, "attention_mask": [1] * len(input_ids)}
        if with_special_mask:
            row["special_tokens_mask"] = special
        if offs_a is not None:
            if add_special_tokens:
                offsets = [(0, 0), *offs_a, (0, 0)]
                if offs_b is not None:
                    offsets += [*offs_b, (0, 0)]
            else:
                offsets = offs_a + (offs_b or [])
            row["offset_mapping"] = offsets
        return row

    def pad(
        self,
        encoded_inputs: Mapping[str, Any] | Sequence[Mapping[str, Any]],
        padding: bool | str = True,
        max_length: int | None = None,
        pad_to_multiple_of: int | None = None,
        return_tensors: str | None = None,
    ) -> BatchEncoding:
        """Pad already-encoded inputs, as Hugging Face's ``tokenizer.pad`` (what DataCollatorWithPadding calls):
        a BatchEncoding / dict of lists, or a list of per-example dicts. ``input_ids``, ``token_type_ids``,
        ``attention_mask`` (made when absent), ``special_tokens_mask`` and ``offset_mapping`` are padded on
        the right; other keys (labels, ...) are passed through unchanged."""
        if isinstance(encoded_inputs, Mapping):
            ids = encoded_inputs["input_ids"]
            batched = len(ids) > 0 and not isinstance(_as_py(ids)[0], int)
            columns = {k: _as_py(v) if batched else [_as_py(v)] for k, v in encoded_inputs.items()}
            n = len(columns["input_ids"])
            examples = [{k: v[i] for k, v in columns.items()} for i in range(n)]
        else:
            batched, examples = True, [{k: _as_py(v) for k, v in e.items()} for e in encoded_inputs]
        if any("input_ids" not in e for e in examples):
            raise BertkitError("pad needs input_ids in every example (the tokenizer's output)")
        padded_keys = ("input_ids", "token_type_ids", "attention_mask", "special_tokens_mask", "offset_mapping")
        rows = [{k: list(e[k]) for k in padded_keys if k in e} for e in examples]
        for i, row in enumerate(rows):
            row.setdefault("attention_mask", [1] * len(row["input_ids"]))
            n = len(row["input_ids"])
            uneven = {k: len(v) for k, v in row.items() if len(v) != n}
            if uneven:  # padded as they are, the tokens and their mask or segments would no longer line up
                raise BertkitError(f"pad: example {i} has {n} input_ids but "
                                   + ", ".join(f"{k} of length {m}" for k, m in uneven.items())
                                   + "; every column of an example is one entry per token: encode it again")
        pad = resolve_padding(padding)
        if pad == "max_length" and max_length is None:
            max_length = self.model_max_length
        if pad is not None and rows:
            length = max_length if pad == "max_length" else max(len(r["input_ids"]) for r in rows)
            pad_rows(rows, _round_up(length, pad_to_multiple_of), self.pad_token_id)
        out = to_batch_encoding(rows, batched, return_tensors)
        for key in examples[0] if examples else ():
            if key not in padded_keys:
                values = [e[key] for e in examples]
                out[key] = _as_tensor(values if batched else values[0], return_tensors)
        return out


def _inputs(text: Any, text_pair: Any, split: bool) -> tuple[list[Any], list[Any], bool]:
    """(texts, their pairs or Nones, whether the call was batched) from ``__call__``'s first two arguments."""
    accepted = ("the tokenizer takes a str, a list of str, or with is_split_into_words=True a list of words (or "
                "a list of such lists)")
    if not isinstance(text, (str, list, tuple)):
        raise BertkitError(f"{accepted}; got {type(text).__name__} {text!r:.60}")
    if not split and not isinstance(text, str):
        bad = next((t for t in text if not isinstance(t, str)), None)
        if bad is not None:
            hint = ": for pre-split words pass is_split_into_words=True" if isinstance(bad, (list, tuple)) else ""
            raise BertkitError(f"{accepted}; got a list holding {type(bad).__name__} {bad!r:.60}{hint}")
    if split:
        batched = not (isinstance(text, (list, tuple)) and (not text or isinstance(text[0], str)))
    else:
        batched = not isinstance(text, str)
    texts = list(text) if batched else [text]
    if text_pair is None:
        return texts, [None] * len(texts), batched
    if batched:
        if isinstance(text_pair, str) or (split and text_pair and isinstance(text_pair[0], str)):
            raise TypeError(
                "text is a batch (a list) but text_pair is a single str (or word list); pass a list of the same length"
            )
        pairs = list(text_pair)
        if len(pairs) != len(texts):
            raise BertkitError(f"text has {len(texts)} entries but text_pair has {len(pairs)}")
        return texts, pairs, batched
    if not isinstance(text_pair, list if split else str):
        raise TypeError(f"text is a single text, so text_pair must be one too, got {type(text_pair).__name__}")
    # As Hugging Face (and Google's run_classifier): a single empty text_pair means "no pair". In a batch,
    # "" stays an empty second segment ([CLS] A [SEP] [SEP]), again as Hugging Face.
    return texts, [text_pair or None], batched


def _check_lengths(max_length: int | None, pad_to_multiple_of: int | None, stride: int, overflow: bool) -> None:
    if max_length is not None and max_length < 0:
        raise BertkitError(f"max_length must be >= 0, got {max_length}")
    if pad_to_multiple_of is not None and (isinstance(pad_to_multiple_of, bool) or pad_to_multiple_of < 1):
        raise BertkitError(f"pad_to_multiple_of must be a positive int, got {pad_to_multiple_of!r}")
    if stride < 0 or (stride and not overflow):
        raise BertkitError(f"stride={stride} needs return_overflowing_tokens=True and a value >= 0 (the number "
                           "of tokens consecutive windows share)")


def _round_up(length: int, multiple: int | None) -> int:
    return length if multiple is None else -(-length // multiple) * multiple


def _as_py(values: Any) -> Any:
    return values.tolist() if hasattr(values, "tolist") else values


def _as_tensor(values: list, return_tensors: str | None) -> Any:
    if return_tensors == "pt":
        import torch

        return torch.tensor(values)
    if return_tensors == "np":
        import numpy as np

        return np.asarray(values)
    return values


def _batch_encoding(rows: list[dict[str, list]], sample_mapping: list[int], batched: bool,
                    return_tensors: str | None, return_length: bool, overflow: bool) -> BatchEncoding:
    """The output of padded ``rows``, with ``length`` and ``overflow_to_sample_mapping`` when asked."""
    out = to_batch_encoding(rows, batched, return_tensors)
    if return_length:
        lengths = [len(r["input_ids"]) for r in rows]  # [n] for one text too, as transformers
        out["length"] = _as_tensor(lengths, return_tensors)
    if overflow:
        out["overflow_to_sample_mapping"] = _as_tensor(sample_mapping, return_tensors)
    return out
