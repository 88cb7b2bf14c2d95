"""Padding already-encoded examples into a batch, as transformers' ``tokenizer.pad`` (what DataCollatorWithPadding
calls): a dict of columns or a list of per-example dicts in, the tokenizer's columns right-padded and the other
columns (labels, ...) passed through as transformers converts them."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from bertkit.errors import BertkitError
from bertkit.tokenization.batch import (
    PAD_VALUES,
    as_tensor,
    check_lengths,
    check_return_tensors,
    pad_rows,
    resolve_padding,
    to_batch_encoding,
    whole_or_none,
)
from bertkit.tokenization.encoding import BatchEncoding


def pad_examples(encoded_inputs: Mapping[str, Any] | Sequence[Mapping[str, Any]], pad_token_id: int,
                 default_max_length: Callable[[], int], padding: bool | str = True, max_length: int | None = None,
                 pad_to_multiple_of: int | None = None, return_tensors: str | None = None,
                 make_attention_mask: bool = True) -> BatchEncoding:
    """``BertTokenizer.pad``'s work; ``default_max_length()`` is what ``padding="max_length"`` pads to without a
    ``max_length``; ``make_attention_mask`` adds the mask to examples that have none, and without it a mask the
    examples hold is passed through as it is, as transformers' ``pad(return_attention_mask=False)`` leaves it
    (unpadded: one that needs padding makes no tensor, refused naming return_attention_mask)."""
    examples, batched, given_kind = _examples_of(encoded_inputs)
    if return_tensors is None:  # tensors in, the same kind of tensors out, as transformers' pad
        return_tensors = given_kind
    if any("input_ids" not in e for e in examples):
        raise BertkitError("pad needs input_ids in every example (the tokenizer's output)")
    for key in dict.fromkeys(k for e in examples for k in e):
        lacking = [i for i, e in enumerate(examples) if key not in e]
        if lacking:  # else dropped, made up, or a KeyError, by which example comes first
            raise BertkitError(f"pad: example {lacking[0]} of the batch has no {key!r} but example "
                               f"{next(i for i, e in enumerate(examples) if key in e)} has one; give every "
                               f"example a {key!r}, or drop the column from all of them")
    padded = PAD_VALUES if make_attention_mask else tuple(k for k in PAD_VALUES if k != "attention_mask")
    rows = [{k: list(e[k]) for k in padded if k in e} for e in examples]
    for i, row in enumerate(rows):
        if row["input_ids"] and isinstance(row["input_ids"][0], (list, tuple)):
            raise BertkitError(f"pad: example {i}'s input_ids hold {len(row['input_ids'])} row(s) of tokens, not token "
                               "ids (an example tokenized with return_tensors= is a batch of one): tokenize each "
                               "example without return_tensors, or give each row as an example of its own")
        if make_attention_mask:
            row.setdefault("attention_mask", [1] * len(row["input_ids"]))
        n = len(row["input_ids"])
        uneven = {k: len(v) for k, v in row.items() if len(v) != n}
        if uneven:  # padded as they are, the tokens and their mask or segments would no longer line up
            raise BertkitError(f"pad: example {i} has {n} input_ids but "
                               + ", ".join(f"{k} of length {m}" for k, m in uneven.items())
                               + "; every column of an example is one entry per token: encode it again")
    pad = resolve_padding(padding)
    max_length = whole_or_none(max_length, "max_length", "a number of tokens")
    if pad == "max_length" and max_length is None:
        max_length = default_max_length()
    check_lengths(max_length, pad_to_multiple_of, 0, False)
    check_return_tensors(return_tensors)
    pad_rows(rows, pad, max_length, pad_to_multiple_of, pad_token_id)
    out = to_batch_encoding(rows, batched or return_tensors is not None, return_tensors)
    if not batched and return_tensors is not None:  # one example: (T,) columns, no batch axis (as transformers)
        out = BatchEncoding({k: v[0] for k, v in out.items()})
    for key in (k for e in examples[:1] for k in e if k not in padded):
        values = [e[key] for e in examples]
        lengths = sorted({len(v) for v in values if isinstance(v, (list, tuple))})
        if return_tensors is not None and batched and len(lengths) > 1 and key == "attention_mask":
            raise BertkitError(f"pad(return_attention_mask=False) leaves the examples' attention_mask unpadded, as "
                               f"transformers does, and its rows of {lengths[0]}..{lengths[-1]} values make no tensor: "
                               "leave return_attention_mask at None to pad the mask, or drop attention_mask from "
                               "the examples to pad without one")
        if return_tensors is not None and batched and len(lengths) > 1:
            raise BertkitError(f"pad: {key!r} has rows of {lengths[0]}..{lengths[-1]} values, which make no tensor; "
                               f"pad() pads only the tokenizer's columns ({', '.join(PAD_VALUES)}): give {key!r} "
                               "one length per batch (token labels padded with -100, as "
                               "DataCollatorForTokenClassification does), or drop it")
        nones = [i for i, v in enumerate(values) if v is None]
        if return_tensors is not None and nones:
            raise BertkitError(f"pad: example {nones[0]} of the batch has {key!r} None; give every example a "
                               f"{key!r} value, or drop the column (to predict, leave labels out)")
        out[key] = _column_as_tensor(values if batched else values[0], return_tensors)
    return out


def _examples_of(encoded_inputs: Mapping[str, Any] | Sequence[Mapping[str, Any]]
                ) -> tuple[list[dict[str, Any]], bool, str | None]:
    """(one dict per example, whether the input was a batch, ``"pt"``/``"np"`` when its input_ids are torch tensors
    or numpy arrays, else None) from what ``pad`` takes: a dict of (lists of) values or a list of per-example dicts;
    tensors become lists."""
    if isinstance(encoded_inputs, Mapping):
        ids = encoded_inputs["input_ids"]
        batched = len(ids) > 0 and not isinstance(_as_py(ids)[0], int)
        # each value too: a column may be a list of per-example tensors (labels of different lengths), else numpy
        # meets tensors, not lists, and fails in its own words
        columns = {k: [_as_py(x) for x in _as_py(v)] if batched else [_as_py(v)] for k, v in encoded_inputs.items()}
        examples = [{k: v[i] for k, v in columns.items()} for i in range(len(columns["input_ids"]))]
        return examples, batched, _tensor_kind(ids)
    kind = _tensor_kind(encoded_inputs[0]["input_ids"]) if encoded_inputs and "input_ids" in encoded_inputs[0] else None
    return [{k: _as_py(v) for k, v in e.items()} for e in encoded_inputs], True, kind


def _tensor_kind(value: Any) -> str | None:
    """``"pt"`` for torch tensors, ``"np"`` for numpy arrays (the first value inside lists), else None."""
    while isinstance(value, (list, tuple)) and value:
        value = value[0]
    module = type(value).__module__
    return "pt" if module.startswith("torch") else "np" if module == "numpy" else None


def _as_py(values: Any) -> Any:
    return values.tolist() if hasattr(values, "tolist") else values


def _column_as_tensor(values: Any, return_tensors: str | None) -> Any:
    """A column ``pad`` passes through (labels, ...) as transformers converts it: integers int64, floats float32
    (regression scores, soft multi-label targets: never cut to integers), bools bool; an empty column int64."""
    if return_tensors != "pt":
        return as_tensor(values, return_tensors)
    import numpy as np
    import torch

    arr = np.asarray(values)
    kind = arr.dtype.kind if arr.size else "i"
    return torch.from_numpy(arr.astype(np.float32 if kind == "f" else bool if kind == "b" else np.int64, copy=False))
