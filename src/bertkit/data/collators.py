"""transformers' data collators, for ``bertkit.Trainer`` and any DataLoader: lists of examples -> batches.

Each takes what transformers' takes (a tokenizer with ``pad``, ``pad_token_id``, ...; bertkit's or
transformers') and returns the same tensors.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from bertkit.errors import BertkitError
from bertkit.heads import IGNORE_INDEX

_LABEL_KEYS = ("label", "label_ids")  # renamed to "labels", the models' argument, as transformers does


def _needs_pad_token(tokenizer: Any, who: str) -> None:
    if tokenizer is None:
        raise BertkitError(f"{who} needs a tokenizer (to pad with); pass tokenizer=")
    if getattr(tokenizer, "pad_token", None) is None or getattr(tokenizer, "pad_token_id", None) is None:
        raise BertkitError(f"{who}: the tokenizer {type(tokenizer).__name__} has no pad token, so batches of "
                           "different lengths cannot be padded; set one (tokenizer.pad_token = '[PAD]') or pad "
                           "every example to one length and use DefaultDataCollator")


def _no_text(example: Mapping[str, Any], who: str) -> None:
    """A padding collator pads token ids: a text column left in (remove_unused_columns=False) is named here, not
    met as "too many dimensions 'str'" inside tokenizer.pad."""
    text = [k for k, v in example.items() if isinstance(v, str) or (isinstance(v, list) and v and isinstance(v[0], str))]
    if text:
        raise BertkitError(f"{who}: column(s) {text} hold text, which cannot be padded into a tensor; remove them "
                           f"(dataset.remove_columns({text})) or keep remove_unused_columns=True in TrainingArguments")


def _pt_only(return_tensors: str | None, who: str) -> None:
    """Every collator's check of ``return_tensors`` (its field, or the call's argument as transformers' collators
    take it): one that returned arrays would fail at the model's first call, one ignoring the request misleads."""
    if return_tensors is not None and return_tensors != "pt":
        raise BertkitError(f"{who}(return_tensors={return_tensors!r}): bertkit's collators return PyTorch tensors "
                           "only; use return_tensors='pt' (the default)")


def _rename_labels(batch: dict) -> dict:
    for key in _LABEL_KEYS:
        if key in batch:
            batch["labels"] = batch.pop(key)
    return batch


def _as_tensor(values: Any) -> torch.Tensor:
    if isinstance(values, torch.Tensor):
        return values
    if isinstance(values, (list, tuple)) and values and isinstance(values[0], torch.Tensor):
        return torch.stack(values)
    arr = np.asarray(values)
    if arr.dtype.kind not in "biuf":
        raise BertkitError(f"cannot make a tensor of {arr.dtype} values (e.g. {values[:1]!r}); remove the column "
                           "from the dataset (or keep remove_unused_columns=True)")
    kind = arr.dtype.kind
    return torch.as_tensor(arr, dtype=torch.float32 if kind == "f" else torch.bool if kind == "b" else torch.long)


def _label_tensor(values: list) -> torch.Tensor:
    """transformers' ``label`` rule: one integer per example (a bool too) is a class id, int64; anything else is a
    float32 target: a score (whatever float dtype holds it: a float64 tensor from a dataset's torch format) or a
    multi-hot row (a list, array or tensor of 0/1, as BCE takes it). A later non-whole label keeps float32 where
    transformers' first-row rule would truncate it (docs/coming-from-transformers.md)."""
    first = values[0]
    if isinstance(first, (torch.Tensor, np.ndarray)) and first.ndim == 0:
        first = first.item()
    stacked = _as_tensor(values)
    if isinstance(first, (int, np.integer, np.bool_)) and not stacked.is_floating_point():
        return stacked.long()
    return stacked.float()


@dataclass
class DefaultDataCollator:
    """Stack examples of one length into tensors; ``label`` / ``label_ids`` become ``labels``."""

    return_tensors: str = "pt"

    def __call__(self, features: Sequence[Mapping[str, Any]], return_tensors: str | None = None) -> dict:
        _pt_only(return_tensors or self.return_tensors, type(self).__name__)
        if not features:
            raise BertkitError("the collator got an empty batch")
        if not isinstance(features[0], Mapping):  # InputFeatures-like dataclasses: their fields, as transformers
            bad = next((f for f in features if not hasattr(f, "__dict__")), None)
            if bad is not None:
                raise BertkitError(f"DefaultDataCollator: a feature is {type(bad).__name__} {str(bad)[:60]!r}; give "
                                   "dicts of columns (a dataset's rows) or objects with those attributes")
            features = [vars(f) for f in features]
        first = features[0]
        batch = {}
        for key in first:
            values = [f[key] for f in features]
            if isinstance(values[0], str) and key in _LABEL_KEYS:  # skipped below, the batch would have no labels
                raise BertkitError(f"DefaultDataCollator: {key!r} holds strings ({values[0]!r}); labels are class ids "
                                   "or scores: map names to ids with the model's config.label2id")
            if values[0] is None or isinstance(values[0], str):
                continue  # as transformers' default_data_collator: strings and None are not batched
            lengths = [len(v) if isinstance(v, (list, tuple)) or getattr(v, "ndim", 0) > 0 else None for v in values]
            row = next((i for i, n in enumerate(lengths) if n != lengths[0]), None)
            if row is not None:
                raise BertkitError(f"DefaultDataCollator stacks examples of one length, but {key!r} has "
                                   f"{lengths[0]} values in example 0 of the batch and {lengths[row]} in "
                                   f"example {row}; use DataCollatorWithPadding(tokenizer), which pads each batch "
                                   "to its longest (or pad every example to one length: padding='max_length')")
            batch[key] = _label_tensor(values) if key == "label" else _as_tensor(values)
            if key == "label_ids" and batch[key].dtype == torch.bool:
                batch[key] = batch[key].long()  # a bool label is a class id, as transformers reads it
        for key in _LABEL_KEYS:  # transformers' order here: labels, else label, else label_ids (not _rename_labels')
            if key in batch:
                batch.setdefault("labels", batch.pop(key))
        return batch


def default_data_collator(features: Sequence[Mapping[str, Any]], return_tensors: str = "pt") -> dict:
    """transformers' function of that name (run_glue's and run_qa's collator for rows padded to one length):
    ``DefaultDataCollator()``'s batches."""
    return DefaultDataCollator()(features, return_tensors=return_tensors)


@dataclass
class _PaddingCollator:
    """What the padding collators share: transformers' fields, the checks, and one ``tokenizer.pad`` call."""

    tokenizer: Any
    padding: bool | str = True
    max_length: int | None = None
    pad_to_multiple_of: int | None = None
    return_tensors: str = "pt"

    def __post_init__(self) -> None:
        _needs_pad_token(self.tokenizer, type(self).__name__)
        _pt_only(self.return_tensors, type(self).__name__)

    def _pad(self, features: Sequence[Mapping[str, Any]]) -> dict:
        if not features:
            raise BertkitError("the collator got an empty batch")
        _no_text(features[0], type(self).__name__)
        return dict(self.tokenizer.pad(list(features), padding=self.padding, max_length=self.max_length,
                                       pad_to_multiple_of=self.pad_to_multiple_of, return_tensors="pt"))


@dataclass
class DataCollatorWithPadding(_PaddingCollator):
    """Pad ``input_ids``, ``token_type_ids`` and ``attention_mask`` to the longest example of the batch (or
    ``max_length`` / a multiple of ``pad_to_multiple_of``) with ``tokenizer.pad``; other keys are stacked."""

    def __call__(self, features: Sequence[Mapping[str, Any]]) -> dict:
        return _rename_labels(self._pad(features))


@dataclass
class DataCollatorForTokenClassification(_PaddingCollator):
    """As ``DataCollatorWithPadding``, and the per-token ``labels`` padded to the same length with
    ``label_pad_token_id`` (-100: no loss at padding)."""

    label_pad_token_id: int = IGNORE_INDEX

    def __call__(self, features: Sequence[Mapping[str, Any]], return_tensors: str | None = None) -> dict:
        _pt_only(return_tensors, type(self).__name__)
        if not features:
            raise BertkitError("the collator got an empty batch")
        name = "label" if "label" in features[0] else "labels"
        labels = [list(_as_list(f[name])) for f in features] if name in features[0] else None
        batch = self._pad([{k: v for k, v in f.items() if k != name} for f in features])
        if labels is None:
            return batch
        for i, lab in enumerate(labels):
            bad = [v for v in lab if not _is_class_id(v)]
            if bad:
                raise BertkitError(f"DataCollatorForTokenClassification: example {i} of the batch has {name} "
                                   f"{lab[:8]!r}{'...' if len(lab) > 8 else ''} holding {bad[0]!r}; token labels are "
                                   "class ids (ints, -100 for no loss): map tag names to ids with the model's "
                                   "config.label2id")
        width = batch["input_ids"].shape[1]
        row = next((i for i, lab in enumerate(labels) if len(lab) > width), None)
        if row is not None:
            raise BertkitError(f"DataCollatorForTokenClassification: example {row} of the batch has "
                               f"{len(labels[row])} {name} for {len(features[row]['input_ids'])} input_ids; give one "
                               "label per token, with the same truncation as the input")
        left = getattr(self.tokenizer, "padding_side", "right") == "left"
        rows = [[self.label_pad_token_id] * (width - len(lab)) + lab if left
                else lab + [self.label_pad_token_id] * (width - len(lab)) for lab in labels]
        batch[name] = torch.tensor(rows, dtype=torch.int64)
        return _rename_labels(batch)


@dataclass
class DataCollatorForMultipleChoice(_PaddingCollator):
    """Examples whose ``input_ids`` (and the other token keys) are lists of ``num_choices`` sequences: every
    choice of every example is padded with ``tokenizer.pad`` to one length, and the batch reshaped to
    (batch, num_choices, length); ``label`` / ``labels`` become an int64 ``labels`` tensor."""

    def __call__(self, features: Sequence[Mapping[str, Any]], return_tensors: str | None = None) -> dict:
        _pt_only(return_tensors, type(self).__name__)
        if not features:
            raise BertkitError("the collator got an empty batch")
        name = "label" if "label" in features[0] else "labels"
        labels = [f[name] for f in features] if name in features[0] else None
        choices = len(features[0]["input_ids"])
        if any(len(f["input_ids"]) != choices for f in features):
            raise BertkitError("DataCollatorForMultipleChoice: every example must have the same number of "
                               f"choices, got {sorted({len(f['input_ids']) for f in features})}")
        flat = [{k: v[i] for k, v in f.items() if k != name} for f in features for i in range(choices)]
        batch = {k: v.view(len(features), choices, -1) for k, v in self._pad(flat).items()}
        if labels is not None:
            batch["labels"] = _choice_labels([_as_list(v) if hasattr(v, "tolist") else v for v in labels], choices, name)
        return batch


def _choice_labels(labels: list, choices: int, name: str) -> torch.Tensor:
    """The index of each example's right choice as int64, as transformers makes it; rows of ``choices`` floats are
    soft targets, float32 (B, C), which the multiple-choice head takes as probabilities over the choices. transformers
    casts both to int64: a label 1.7 became 1 and [0.7, 0.3] became [0, 0] without a word."""
    if all(_is_class_id(v) for v in labels):
        return torch.tensor([int(v) for v in labels], dtype=torch.int64)
    if all(isinstance(v, (list, tuple)) and len(v) == choices for v in labels):
        return torch.tensor(labels, dtype=torch.float32)
    i, bad = next((i, v) for i, v in enumerate(labels) if not _is_class_id(v))
    raise BertkitError(f"DataCollatorForMultipleChoice: example {i} of the batch has {name} {bad!r}; a label is the "
                       f"index of the right one of the {choices} choices (an int), or {choices} probabilities over "
                       "them (soft targets), in every example of the batch")


def _is_class_id(value: Any) -> bool:
    """An int, or a float holding a whole number (datasets may store tags as floats); never NaN or a tag name."""
    return isinstance(value, (int, np.integer)) or (isinstance(value, (float, np.floating)) and math.isfinite(value)
                                                    and float(value).is_integer())


def _as_list(values: Any) -> list:
    return values.tolist() if hasattr(values, "tolist") else list(values)


@dataclass
class DataCollatorForLanguageModeling:
    """Masked-LM batches: pad, choose ``mlm_probability`` of the non-special tokens as targets, and replace
    80% of them with [MASK], 10% with a random token, and keep 10% (paper, section 3.1: the model must keep
    a representation of every token, since it cannot tell which are targets). Draws follow transformers'
    collator call for call, so the same ``seed`` gives the same batches.

    ``whole_word_mask=True`` chooses whole words, found as transformers 5 finds them: from the examples'
    ``offset_mapping`` (tokenize with ``return_offsets_mapping=True``), a word is a run of tokens with no character
    between them ("don't", "stop-believing" and "東京" are one word each; BERT's own "##" pieces would make three,
    three and two). Their pieces are all replaced by [MASK] unless ``mask_replace_prob`` / ``random_replace_prob``
    are given, which then apply to each piece (as Google's whole-word masking does; transformers overrides them
    with 1 and 0 and warns).
    ``seed`` None draws from torch's global generator (what a seeded Trainer run fixes); a seed makes one generator
    per process on first use, seeded ``seed + worker id`` in a DataLoader worker, as transformers does. transformers'
    ``mlm=False`` (causal-LM labels) is refused: no BERT head predicts the next token.
    """

    tokenizer: Any
    mlm: bool = True
    whole_word_mask: bool = False
    mlm_probability: float = 0.15
    mask_replace_prob: float | None = None
    """Share of the targets replaced by [MASK]. Default 0.8; with whole_word_mask and neither share given, 1.0."""
    random_replace_prob: float | None = None
    """Share of the targets replaced by a random token. Default 0.1; with whole_word_mask and neither given, 0.0."""
    pad_to_multiple_of: int | None = None
    return_tensors: str = "pt"
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.mlm is not True:
            raise BertkitError(f"DataCollatorForLanguageModeling(mlm={self.mlm!r}): bertkit makes masked-LM batches "
                               "only (no BERT head predicts the next token); leave mlm=True")
        _needs_pad_token(self.tokenizer, "DataCollatorForLanguageModeling")
        _pt_only(self.return_tensors, "DataCollatorForLanguageModeling")
        if getattr(self.tokenizer, "mask_token", None) is None:
            raise BertkitError("DataCollatorForLanguageModeling: the tokenizer has no mask token; use a tokenizer "
                               "with [MASK]")
        if self.whole_word_mask and self.mask_replace_prob is None and self.random_replace_prob is None:
            self.mask_replace_prob, self.random_replace_prob = 1.0, 0.0  # transformers' whole-word masking
        self.mask_replace_prob = 0.8 if self.mask_replace_prob is None else self.mask_replace_prob
        self.random_replace_prob = 0.1 if self.random_replace_prob is None else self.random_replace_prob
        for name in ("mlm_probability", "mask_replace_prob", "random_replace_prob"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
                raise BertkitError(f"{name} must be a probability in [0, 1], got {value!r}")
            setattr(self, name, float(value))  # 0 as an int is 0.0: torch.bernoulli takes floats only
        if self.mask_replace_prob + self.random_replace_prob > 1:
            raise BertkitError(f"mask_replace_prob {self.mask_replace_prob} + random_replace_prob "
                               f"{self.random_replace_prob} exceed 1")
        self.generator: torch.Generator | None = None
        self._generator_pid: int | None = None

    def _seeded(self) -> None:
        """A generator made in one process and forked into DataLoader workers (the Trainer's, on a GPU) would draw the
        same masks in every worker; each process makes its own, as transformers' collator does."""
        if self.seed is None or (self.generator is not None and self._generator_pid == os.getpid()):
            return
        worker = torch.utils.data.get_worker_info()
        self.generator = torch.Generator().manual_seed(self.seed + (worker.id if worker is not None else 0))
        self._generator_pid = os.getpid()

    def __call__(self, examples: Sequence[Any], return_tensors: str | None = None) -> dict:
        _pt_only(return_tensors, "DataCollatorForLanguageModeling")
        if not examples:
            raise BertkitError("the collator got an empty batch")
        if isinstance(examples[0], Mapping):
            _no_text(examples[0], "DataCollatorForLanguageModeling")
            batch = dict(self.tokenizer.pad(list(examples), return_tensors="pt",
                                            pad_to_multiple_of=self.pad_to_multiple_of))
        else:
            rows = [list(_as_list(e)) for e in examples]
            batch = dict(self.tokenizer.pad([{"input_ids": r} for r in rows], return_tensors="pt",
                                            pad_to_multiple_of=self.pad_to_multiple_of))
            batch = {"input_ids": batch["input_ids"]}
        special = batch.pop("special_tokens_mask", None)
        offsets = batch.pop("offset_mapping", None)
        batch["input_ids"], batch["labels"] = self.mask_tokens(batch["input_ids"], special, offsets)
        return batch

    def mask_tokens(self, inputs: torch.Tensor, special_tokens_mask: Any = None,
                    offset_mapping: Any = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs with targets replaced, labels with -100 everywhere but the targets). ``offset_mapping`` (B, T, 2)
        is where whole-word masking finds the words."""
        self._seeded()
        labels = inputs.clone()
        probability = torch.full(labels.shape, self.mlm_probability)
        if special_tokens_mask is None:
            special_tokens_mask = [self.tokenizer.get_special_tokens_mask(row, already_has_special_tokens=True)
                                   for row in labels.tolist()]
        special = torch.as_tensor(special_tokens_mask, dtype=torch.bool)
        if self.whole_word_mask:
            if offset_mapping is None:
                raise BertkitError("DataCollatorForLanguageModeling(whole_word_mask=True) finds words from the "
                                   "tokens' character offsets, as transformers 5 does, and these examples have no "
                                   "offset_mapping: tokenize with return_offsets_mapping=True (and, with the "
                                   "Trainer, keep the column: remove_unused_columns=False)")
            words, first = _words(torch.as_tensor(offset_mapping), special)  # (B, T) each
            probability.masked_fill_(~first, 0.0)  # one draw per word, at its first piece
            chosen = torch.bernoulli(probability, generator=self.generator).bool()
            same = (words[:, :, None] == words[:, None, :]) & (words[:, :, None] >= 0)
            masked = (same & chosen[:, None, :]).any(-1)  # every piece of a chosen word
        else:
            probability.masked_fill_(special, 0.0)
            masked = torch.bernoulli(probability, generator=self.generator).bool()
        labels[~masked] = IGNORE_INDEX
        replaced = torch.bernoulli(torch.full(labels.shape, self.mask_replace_prob), generator=self.generator).bool()
        replaced &= masked
        inputs[replaced] = self.tokenizer.mask_token_id
        if self.mask_replace_prob == 1 or self.random_replace_prob == 0:
            return inputs, labels
        scaled = self.random_replace_prob / (1 - self.mask_replace_prob)  # of the targets not replaced by [MASK]
        randomized = torch.bernoulli(torch.full(labels.shape, scaled), generator=self.generator).bool()
        randomized &= masked & ~replaced
        words = torch.randint(len(self.tokenizer), labels.shape, dtype=torch.long, generator=self.generator)
        inputs[randomized] = words[randomized]
        return inputs, labels


def _words(offsets: torch.Tensor, special: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(word index of each token, -1 on special tokens; whether it starts a word) from (B, T, 2) character offsets:
    a token starts a word unless it begins where the token before it ends (transformers 5's rule)."""
    starts, ends = offsets[..., 0], offsets[..., 1]
    follows = (starts == torch.roll(ends, 1, dims=1)) & ~torch.roll(special, 1, dims=1)
    follows[:, 0] = False
    first = ~special & ~follows
    return torch.cumsum(first.long(), dim=1).masked_fill(special, -1), first
