"""Training data for the cross-encoder losses: each row's texts as word pieces (tokenized once), padded into one
(B, C, T) batch with each text's length, and the labels.

Columns are the loss's inputs in the dataset's order: (anchor, candidate, more candidates...) for the pairwise
losses; (query, list of documents) with a list of labels per row for the listwise ones, whose C is 1 + the
batch's largest document count (length -1 where a row has fewer). A column named "label", "labels", "score" or
"scores" is the label, "dataset_name" is left out.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from bertkit.errors import BertkitError
from bertkit.sentence.data import loss_columns


class CrossEncoderExamples(Sequence):
    """``dataset`` as the examples the cross-encoder's loss wrapper takes: per row, ``input_ids`` (each text's word
    pieces, no special tokens) and ``label`` (0 when the loss needs none; a list of floats for listwise losses)."""

    def __init__(self, dataset: Any, model: Any, loss: Any, what: str):
        self.label, self.texts = loss_columns(dataset, loss, what)
        self.dataset, self.model, self.listwise = dataset, model, loss.listwise
        first = dataset[0]
        if self.listwise and not (isinstance(first[self.texts[1]], (list, tuple))
                                  and isinstance(first[self.label], (list, tuple))):
            raise BertkitError(f"{what}: {loss.describe_columns()}; row 0 has {self.texts[1]!r} "
                               f"{type(first[self.texts[1]]).__name__} and {self.label!r} "
                               f"{type(first[self.label]).__name__}")

    def __len__(self) -> int:
        return len(self.dataset)

    def texts_of(self, i: int) -> list[str]:
        row = self.dataset[i]
        texts = [row[self.texts[0]], *row[self.texts[1]]] if self.listwise else [row[c] for c in self.texts]
        bad = next((t for t in texts if not isinstance(t, str)), None)
        if bad is not None:
            raise BertkitError(f"row {i}: expected texts in {self.texts}, got {type(bad).__name__} {str(bad)[:60]!r}")
        return texts

    def __getitem__(self, i: int) -> dict[str, Any]:
        ids = [self.model.token_ids(t) for t in self.texts_of(i)]
        label = self.dataset[i][self.label] if self.label is not None else 0
        if self.listwise:
            label = [float(x) for x in label]
            if len(label) != len(ids) - 1:
                raise BertkitError(f"row {i} has {len(ids) - 1} documents and {len(label)} labels; give one label "
                                   "per document")
        return {"input_ids": ids, "label": label}

    def row_texts(self, i: int) -> set[str]:
        """The row's texts: what the no-duplicates sampler keeps apart within a batch."""
        return set(self.texts_of(i))


def collate(examples: list[dict[str, Any]], pad_id: int = 0) -> dict[str, Tensor]:
    """Examples -> ``input_ids`` (B, C, T) padded with ``pad_id``, ``lengths`` (B, C) (-1: no text there) and
    ``label``: (B,), or (B, C - 1) padded with NaN for lists."""
    B, C = len(examples), max(len(e["input_ids"]) for e in examples)
    T = max(1, max(len(ids) for e in examples for ids in e["input_ids"]))
    input_ids = torch.full((B, C, T), pad_id, dtype=torch.long)
    lengths = torch.full((B, C), -1, dtype=torch.long)
    for b, e in enumerate(examples):
        for c, ids in enumerate(e["input_ids"]):
            input_ids[b, c, :len(ids)] = torch.as_tensor(ids, dtype=torch.long)
            lengths[b, c] = len(ids)
    labels = [e["label"] for e in examples]
    if isinstance(labels[0], list):
        label = torch.full((B, C - 1), float("nan"))
        for b, row in enumerate(labels):
            label[b, :len(row)] = torch.as_tensor(row, dtype=torch.float32)
    else:
        label = torch.stack(labels) if isinstance(labels[0], Tensor) else torch.tensor(labels)
    return {"input_ids": input_ids, "lengths": lengths, "label": label}


def columns_of(input_ids: Tensor, lengths: Tensor, label: Tensor, listwise: bool) -> tuple[list, Any]:
    """A collated batch back into the loss's ``(inputs, labels)``: one list of word-piece lists per column, or
    (queries, document lists) and a label tensor per row for a listwise loss."""
    ids, lens = input_ids.tolist(), lengths.tolist()
    if not listwise:
        return [[ids[b][c][:lens[b][c]] for b in range(len(ids))] for c in range(len(ids[0]))], label
    queries = [row[0][:n[0]] for row, n in zip(ids, lens)]
    docs = [[row[c][:n[c]] for c in range(1, len(row)) if n[c] >= 0] for row, n in zip(ids, lens)]
    return [queries, docs], [label[b, :len(d)] for b, d in enumerate(docs)]
