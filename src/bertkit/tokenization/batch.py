"""Token ids -> model rows: special tokens, truncation (or overflowing windows), padding, lists or tensors.

The tokenizer's ``__call__`` and ``pad`` run these on the ids ``text.TextEncoder`` gives. The rules are those
of Hugging Face's BertTokenizerFast (its Rust ``TemplateProcessing``, ``truncate_encodings`` and padding), so
that features built here match features built there; docs/tokenizer.md ("Pairs", "Truncation", "Padding")
states them.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from bertkit.errors import BertkitError, is_whole
from bertkit.tokenization.encoding import BatchEncoding, RowInfo, segment_ids, word_index

TRUNCATION_STRATEGIES = ("longest_first", "only_first", "only_second")
# What each column of an encoded row pads with (``input_ids`` with the tokenizer's pad id): the columns ``pad``
# pads; any other key of its input (labels, ...) passes through unchanged.
PAD_VALUES = {"input_ids": 0, "token_type_ids": 0, "attention_mask": 0, "special_tokens_mask": 1, "offset_mapping": (0, 0)}
Row = dict[str, list]


class Segment(NamedTuple):
    """One text's tokens: ids, their offsets (None unless asked for), the word of each (None: from the ids)."""

    ids: list[int]
    offsets: list[tuple[int, int]] | None
    words: list[int] | None

    def cut(self, start: int, stop: int) -> Segment:
        return Segment(*(None if x is None else x[start:stop] for x in self))  # type: ignore[arg-type]


def split_inputs(text: Any, text_pair: Any, split: bool) -> tuple[list[Any], list[Any], bool]:
    """(texts, their pairs or Nones, whether the call was batched) from ``__call__``'s first two arguments."""
    accepted = ("the tokenizer takes a str, a list of str, a list of (text, text_pair), or with is_split_into_words=True "
                "a list of words (or a list of such lists, or of (words, pair_words))")
    if not isinstance(text, (str, list, tuple)):
        raise BertkitError(f"{accepted}; got {type(text).__name__} {text!r:.60}")
    if not split and not isinstance(text, str):
        pairs = [isinstance(t, (list, tuple)) and len(t) == 2 and all(isinstance(x, str) for x in t) for t in text]
        if text_pair is None and any(pairs) and all(p or isinstance(t, str) for p, t in zip(pairs, text)):
            # [(text, text_pair), ...] or [[text, text_pair], ...]: a batch of pairs, as Hugging Face reads it (texts
            # among them are rows without a pair)
            return [t[0] if p else t for p, t in zip(pairs, text)], [t[1] if p else None for p, t in zip(pairs, text)], True
        # by index: a None in the list is a bad item too (it passed, then failed per text without its place)
        at = next((i for i, t in enumerate(text) if not isinstance(t, str)), None)
        if at is not None:
            bad = text[at]
            hint = ": for pre-split words pass is_split_into_words=True" if isinstance(bad, (list, tuple)) else ""
            raise BertkitError(f"{accepted}; got a list holding {type(bad).__name__} {bad!r:.60} (item {at}){hint}")
    if split:
        if isinstance(text, str):
            raise TypeError(f"with is_split_into_words=True a text is a list of words, got the str {text!r:.60}; pass "
                            "its words (text.split()) or leave is_split_into_words off")
        if text_pair is None and text and all(isinstance(t, (list, tuple)) and len(t) == 2 and all(
                isinstance(x, (list, tuple)) for x in t) for t in text):
            # [(words, pair_words), ...]: a batch of pairs of word lists, as Hugging Face reads it
            return [t[0] for t in text], [t[1] for t in text], True
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
        missing = next((i for i, b in enumerate(pairs) if b is None), None)
        if missing is not None:  # transformers refuses it; read as no pair, the row lost its text without a word
            raise BertkitError(f"text_pair[{missing}] is None (a missing value, as datasets reads an empty CSV "
                               "field); every row of a batch of pairs needs its second text: give '' for an empty "
                               "second segment, or fill or drop that row")
        return texts, pairs, batched
    if not isinstance(text_pair, list if split else str):
        raise TypeError(f"text is a single text, so text_pair must be one too, got {type(text_pair).__name__}")
    # As Hugging Face (and Google's run_classifier): a single empty text_pair means "no pair". In a batch,
    # "" stays an empty second segment ([CLS] A [SEP] [SEP]), again as Hugging Face.
    return texts, [text_pair or None], batched


def whole_or_none(value: Any, name: str, what: str, optional: bool = True) -> int | None:
    """``value`` as a Python int: numpy integers and 0-d integer tensors too (a length computed with numpy or torch,
    ``max_length=np.max(lengths)``, as transformers takes it); a bool, float or str is refused naming it, and None
    unless ``optional``."""
    if value is None and optional:
        return None
    wrong = BertkitError(f"{name} must be an int ({what}){' or None' if optional else ''}, got "
                         f"{type(value).__name__} {value!r}")
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise wrong
    try:
        return operator.index(value)
    except TypeError:  # a tensor of floats, or of more than one value
        raise wrong from None


def check_lengths(max_length: int | None, pad_to_multiple_of: int | None, stride: int, overflow: bool) -> None:
    if max_length is not None and max_length < 0:
        raise BertkitError(f"max_length must be >= 0, got {max_length}")
    if pad_to_multiple_of is not None and not is_whole(pad_to_multiple_of):
        raise BertkitError(f"pad_to_multiple_of must be a positive int, got {pad_to_multiple_of!r}")
    # two faults, one message each: told it "needs return_overflowing_tokens=True", a caller who passed it was lost
    if stride < 0:
        raise BertkitError(f"stride={stride} must be >= 0 (the number of tokens consecutive windows share); use 0 "
                           "for windows that share none")
    if stride and not overflow:
        raise BertkitError(f"stride={stride} needs return_overflowing_tokens=True (the windows it spaces); pass it, "
                           "or leave stride out")


def check_return_tensors(return_tensors: str | None) -> None:
    """Refused before any text is read (a batch tokenized for nothing, else)."""
    if return_tensors not in (None, "pt", "np"):
        raise BertkitError(f"return_tensors={return_tensors!r} is not supported; use 'pt', 'np' or None")


def resolve_truncation(
    truncation: bool | str | None, max_length: int | None, padding: bool | str
) -> str | None:
    """The truncation strategy to apply, or None. ``None`` is Hugging Face's default: ``longest_first`` when
    ``max_length`` is given and padding is off, else none. ``True`` means ``longest_first``."""
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


class CallPlan(NamedTuple):
    """What a tokenizer call does once its options are checked: the truncation strategy (None: none), the padding
    ("longest", "max_length" or None), the max_length both work to and the stride of overflowing windows, as ints."""

    strategy: str | None
    padding: str | None
    max_length: int | None
    stride: int


def plan_call(truncation: bool | str | None, max_length: int | None, padding: bool | str, pad_to_multiple_of: int | None,
              stride: int, overflow: bool, return_tensors: str | None, add_special_tokens: bool, model_max_length: int,
              length_to_pad_to: Callable[[], int], pairs: bool = False) -> CallPlan:
    """The ``__call__`` options as transformers resolves them, every combination it refuses refused here, before
    any text is read: the length is ``max_length``, else ``length_to_pad_to()`` for padding="max_length", else
    ``model_max_length`` when truncating. ``pairs``: the inputs are text pairs."""
    if add_special_tokens not in (True, False):  # None read as False would drop [CLS] and [SEP] without a word
        raise BertkitError(f"add_special_tokens={add_special_tokens!r}: pass True (add [CLS] and [SEP], the default) "
                           "or False")
    max_length = whole_or_none(max_length, "max_length", "a number of tokens")
    stride = whole_or_none(stride, "stride", "the number of tokens consecutive windows share, 0 by default", False)
    strategy = resolve_truncation(truncation, max_length, padding)
    pad = resolve_padding(padding)
    if max_length is None and pad == "max_length":
        max_length = length_to_pad_to()
    elif max_length is None and strategy is not None:
        max_length = model_max_length
    check_lengths(max_length, pad_to_multiple_of, stride, overflow)
    check_return_tensors(return_tensors)
    n_special = 2 if add_special_tokens else 0
    # a pair's windows hold three: told "> 2", a caller passing 3 was refused again, as leaving no room
    window_special = n_special + (1 if pairs and add_special_tokens else 0)
    if overflow and strategy is not None and max_length is not None and max_length < window_special:
        # stride is then no matter: not even the special tokens fit (transformers returns rows past max_length)
        raise BertkitError(f"max_length {max_length} is smaller than the {window_special} special tokens each window "
                           f"gets; use max_length > {window_special}")
    if overflow and strategy is not None and max_length is not None and stride > max_length - n_special:
        # as transformers refuses it; else only a text long enough to need a second window would find out
        raise BertkitError(f"stride {stride} is more than the {max_length - n_special} tokens a window of max_length "
                           f"{max_length} holds besides its {n_special} special tokens: use a smaller stride or a "
                           "larger max_length")
    if strategy is not None and pad is not None and pad_to_multiple_of and max_length and max_length % pad_to_multiple_of:
        # rows cut at max_length, then padded past it to the next multiple: transformers refuses this
        raise BertkitError(f"truncation at max_length={max_length} and padding to a multiple of pad_to_multiple_of="
                           f"{pad_to_multiple_of}: the length is not a multiple of it, so padded rows would be longer "
                           "than the cut; give a max_length that is a multiple (as transformers requires), or leave "
                           "one of them off")
    return CallPlan(strategy, pad, max_length, stride)


def truncation_lengths(
    len_a: int, len_b: int | None, max_length: int, strategy: str, num_special: int
) -> tuple[int, int | None]:
    """How many tokens of A (and B) to keep so that the encoded input has at most ``max_length`` tokens.

    ``num_special`` is the number of special tokens that will be added (2 for a single text, 3 for a pair,
    0 without special tokens). Mirrors ``tokenizers``' ``truncate_encodings`` (docs/tokenizer.md, "Truncation").
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


def left_truncated(tokenizer: Any, text: str, text_pair: str | None, max_length: int,
                   add_special_tokens: bool = True) -> dict[str, list[int]]:
    """``input_ids`` and ``token_type_ids`` of ``text`` (and ``text_pair``) cut to ``max_length`` from the left, as
    transformers' tokenizer with ``truncation_side="left"`` (and TEI's ``truncation_direction: "Left"``): each text
    keeps its last tokens, as many as ``truncation_lengths`` keeps (longest_first), and the special tokens stay."""
    full = tokenizer(text, text_pair, add_special_tokens=add_special_tokens)
    ids = full["input_ids"]
    types = segment_ids(full)
    s = 1 if add_special_tokens else 0  # [CLS] before A, a [SEP] after each text
    len_a = len(tokenizer(text, add_special_tokens=False)["input_ids"])
    len_b = None if text_pair is None else len(ids) - len_a - 3 * s
    n_a, n_b = truncation_lengths(len_a, len_b, max_length, "longest_first", (2 if len_b is None else 3) * s)
    keep = [*range(s), *range(s + len_a - n_a, s + len_a + s)]
    if len_b is not None and n_b is not None:
        start_b = s + len_a + s
        keep += range(start_b + len_b - n_b, start_b + len_b + s)
    return {"input_ids": [ids[i] for i in keep], "token_type_ids": [types[i] for i in keep]}


def encode_rows(segments: Sequence[tuple[Segment, Segment | None]], texts: Sequence[tuple[Any, Any]],
                specials: tuple[int, int] | None, strategy: str | None, max_length: int | None, overflow: bool,
                stride: int, special_mask: bool, continuation_ids: frozenset[int]
                ) -> tuple[list[Row], list[RowInfo], list[int]]:
    """(the unpadded output rows, what each row's word and character maps need, each row's input index): each
    text's (or pair's) segments cut into one row or, with ``overflow``, several windows. ``specials``: the
    [CLS] and [SEP] ids, None to add no special tokens."""
    rows: list[Row] = []
    infos: list[RowInfo] = []
    sample_mapping: list[int] = []
    for index, ((seg_a, seg_b), (a, b)) in enumerate(zip(segments, texts)):
        for (win_a, start_a), (win_b, start_b) in _windows(seg_a, seg_b, specials is not None, strategy, max_length,
                                                           overflow, stride, continuation_ids):
            rows.append(_assemble(win_a, win_b, specials, special_mask))
            infos.append(RowInfo(len(win_a.ids), None if win_b is None else len(win_b.ids), specials is not None,
                                 win_a.words, None if win_b is None else win_b.words, a, b, start_a, start_b))
            sample_mapping.append(index)
    return rows, infos, sample_mapping


def _windows(seg_a: Segment, seg_b: Segment | None, add_special: bool, strategy: str | None, max_length: int | None,
             overflow: bool, stride: int, continuation_ids: frozenset[int]):
    """The (A, B) segment slices of each output row, each with the index of its first token in its text:
    one row, or overlapping windows with ``overflow``."""
    len_a, len_b = len(seg_a.ids), None if seg_b is None else len(seg_b.ids)
    if strategy is None:
        return [((seg_a, 0), (seg_b, 0))]
    num_special = (2 if seg_b is None else 3) if add_special else 0
    n_a, n_b = truncation_lengths(len_a, len_b, max_length, strategy, num_special)
    if not overflow or (n_a == len_a and n_b == len_b):
        return [((seg_a.cut(0, n_a), 0), (None if seg_b is None else seg_b.cut(0, n_b), 0))]
    if seg_b is not None and strategy == "longest_first":
        raise BertkitError("return_overflowing_tokens on text pairs needs truncation='only_first' or "
                           "'only_second' (which text to cut into windows), not 'longest_first'")
    which, full, keep = (0, seg_a, n_a) if n_a != len_a else (1, seg_b, n_b)
    if keep == 0:  # a budget of 0: transformers returns rows longer than max_length
        raise BertkitError(f"max_length {max_length} holds only the {num_special} special tokens, so no window has room "
                           f"for a token of the text; use max_length > {num_special}")
    if stride >= keep:
        raise BertkitError(f"stride {stride} must be smaller than the {keep} tokens of the text that fit in "
                           f"each window (max_length {max_length}); use a smaller stride or a larger max_length")
    if full.words is None:  # word ids count from the start of the text, also in later windows
        full = full._replace(words=word_index(full.ids, continuation_ids))
    rows, start = [], 0
    while True:
        stop = min(start + keep, len(full.ids))
        window = (full.cut(start, stop), start)
        rows.append((window, (seg_b, 0)) if which == 0 else ((seg_a, 0), window))
        if stop == len(full.ids):
            return rows
        start += keep - stride


def _assemble(seg_a: Segment, seg_b: Segment | None, specials: tuple[int, int] | None, special_mask: bool) -> Row:
    """One row: ``[CLS] A [SEP] (B [SEP])`` (or A B without ``specials``), its segment ids and attention mask."""
    parts = [seg_a] if seg_b is None else [seg_a, seg_b]
    ids: list[int] = []
    type_ids: list[int] = []
    special: list[int] = []
    offsets: list[tuple[int, int]] = []
    if specials is not None:
        ids, type_ids, special, offsets = [specials[0]], [0], [1], [(0, 0)]
    for segment_id, seg in enumerate(parts):
        ids += seg.ids
        type_ids += [segment_id] * len(seg.ids)
        special += [0] * len(seg.ids)
        offsets += seg.offsets or []
        if specials is not None:
            ids.append(specials[1])
            type_ids.append(segment_id)
            special.append(1)
            offsets.append((0, 0))
    row = {"input_ids": ids, "token_type_ids": type_ids, "attention_mask": [1] * len(ids)}
    if special_mask:
        row["special_tokens_mask"] = special
    if seg_a.offsets is not None:
        row["offset_mapping"] = offsets
    return row


def pad_rows(rows: list[Row], padding: str | None, max_length: int | None, multiple: int | None, pad_id: int) -> None:
    """Right-pad every row (a dict of per-token lists) in place to ``max_length`` (``padding="max_length"``) or
    the longest row (``"longest"``), rounded up to ``multiple``; None: no padding. Longer rows are left alone."""
    if padding is None or not rows:
        return
    length = max_length if padding == "max_length" else max(len(r["input_ids"]) for r in rows)
    if multiple is not None:
        length = -(-length // multiple) * multiple
    for row in rows:
        for key, values in row.items():
            values += [pad_id if key == "input_ids" else PAD_VALUES[key]] * (length - len(values))


def as_tensor(values: Any, return_tensors: str | None, empty_shape: tuple[int, ...] | None = None) -> Any:
    """Ids (or offsets, masks, lengths) as an int64 torch tensor (``"pt"``), a numpy array (``"np"``) or as they
    are (None). ``empty_shape``: the int64 zeros' shape to return instead, for rows without tokens (their nested
    lists carry no width)."""
    if return_tensors == "pt":
        import numpy as np
        import torch  # imported here so that tokenizing without tensors does not pay for torch

        # through numpy: torch.tensor reads nested lists item by item (15 us for one row of 100, numpy's 3.5)
        return torch.from_numpy(np.asarray(values, dtype=np.int64)) if empty_shape is None \
            else torch.zeros(empty_shape, dtype=torch.long)
    if return_tensors == "np":
        import numpy as np

        return np.asarray(values) if empty_shape is None else np.zeros(empty_shape, dtype=np.int64)
    return values


def to_batch_encoding(rows: list[Row], batched: bool, return_tensors: str | None) -> BatchEncoding:
    """Rows -> BatchEncoding of lists (one row unwrapped unless ``batched``) or of (B, T) tensors/arrays."""
    keys = list(rows[0]) if rows else ["input_ids", "token_type_ids", "attention_mask"]
    if return_tensors is None:
        return BatchEncoding({k: [row[k] for row in rows] for k in keys} if batched else rows[0])
    lengths = sorted({len(row["input_ids"]) for row in rows})
    if len(lengths) > 1:
        raise BertkitError(
            f"cannot stack sequences of different lengths {lengths[0]}..{lengths[-1]} into one tensor: "
            f"pass padding=True (or 'max_length'), or return_tensors=None for lists"
        )
    empty = None if lengths and lengths[0] else (len(rows), 0)
    return BatchEncoding({k: as_tensor([row[k] for row in rows], return_tensors,
                                       None if empty is None else empty + ((2,) if k == "offset_mapping" else ()))
                          for k in keys})
