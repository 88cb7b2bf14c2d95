"""Training data for the cross-encoder losses: each row's texts as word pieces (tokenized once, in the loader's
workers), batched as lists, and the labels.

Columns are the loss's inputs in the dataset's order: (anchor, candidate, more candidates...) for the pairwise
losses; (query, list of documents) with a list of labels per row for the listwise ones (their labels padded
to the batch's largest document count with NaN). A column named "label", "labels", "score" or
"scores" is the label; "dataset_name" and "return_loss" are refused (``loss_columns``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from bertkit.errors import BertkitError
from bertkit.sentence.data import loss_columns, tokenizer_fingerprint
from bertkit.training.trainer_data import column, data_fingerprint


class CrossEncoderExamples(Sequence):
    """``dataset`` as the examples the cross-encoder's loss wrapper takes: per row, ``input_ids`` (each text's word
    pieces, no special tokens), ``label`` (0 when the loss needs none; a list of floats for listwise losses) and
    ``dataset_name`` (``name``: the dataset's in a dict of datasets; None for a dataset of its own)."""

    def __init__(self, dataset: Any, model: Any, loss: Any, what: str, name: str | None = None):
        self.label, self.texts = loss_columns(dataset, loss, what)
        self.dataset, self.model, self.listwise, self.name = dataset, model, loss.listwise, name
        first = dataset[0]
        if self.listwise and not (isinstance(first[self.texts[1]], (list, tuple)) and _is_list(first[self.label])):
            raise BertkitError(f"{what}: {loss.describe_columns()}; row 0 has {self.texts[1]!r} "
                               f"{type(first[self.texts[1]]).__name__} and {self.label!r} "
                               f"{type(first[self.label]).__name__}")
        loss.check_labels(self.label_column(), what)

    def __len__(self) -> int:
        return len(self.dataset)

    def texts_of(self, i: int) -> list[str]:
        row = self.dataset[i]
        texts = [row[self.texts[0]], *row[self.texts[1]]] if self.listwise else [row[c] for c in self.texts]
        at = next((k for k, t in enumerate(texts) if not isinstance(t, str)), None)  # a None text is found too
        if at is not None:
            bad = texts[at]
            raise BertkitError(f"row {i}: expected texts in {self.texts}, got {type(bad).__name__} {str(bad)[:60]!r}")
        return texts

    def __getitem__(self, i: int) -> dict[str, Any]:
        texts = self.texts_of(i)
        label = self.dataset[i][self.label] if self.label is not None else 0
        return {"input_ids": [self.model.token_ids(t) for t in texts], "label": self._label(i, label, len(texts) - 1),
                "has_targets": self.label is not None, "dataset_name": self.name}

    def _label(self, i: int, label: Any, documents: int) -> Any:
        if self.listwise:
            label = [float(x) for x in label]
            if len(label) != documents:
                raise BertkitError(f"row {i} has {documents} documents and {len(label)} labels; give one label "
                                   "per document")
        elif isinstance(label, (list, tuple)):  # several numbers a row (MarginMSELoss's margins): one tensor
            label = torch.tensor(label, dtype=torch.float32)
        elif isinstance(label, (np.ndarray, np.generic)):  # a dataset with format "numpy": a tensor of its dtype (a
            label = torch.as_tensor(label)  # list of 0-d bool arrays failed in torch.tensor: "len() of unsized object")
        return label

    def label_column(self) -> list:
        """Every row's ``label`` as ``self[i]`` gives it, without tokenizing any row (the Trainer checks the labels
        before training: tokenizing the whole dataset for it took as long as a pass of its loader)."""
        if self.label is None:
            return [0] * len(self)
        documents = [len(d) for d in column(self.dataset, self.texts[1])] if self.listwise else [0] * len(self)
        return [self._label(i, v, documents[i]) for i, v in enumerate(column(self.dataset, self.label))]

    def fingerprint(self) -> dict[str, Any]:
        """What the examples are made from, for a resumed run to find unchanged: the rows (``data_fingerprint``), the
        columns read and the tokenizer. A fingerprint of the examples themselves would tokenize every row once more
        before training."""
        return {"rows": data_fingerprint(self.dataset), "texts": self.texts, "label": self.label,
                "listwise": self.listwise, "tokenizer": tokenizer_fingerprint(self.model)}

    def texts_by_row(self) -> list[set[str]]:
        """Each row's values (what the no-duplicates sampler keeps apart within a batch), the columns read at once: a
        listwise row's query and its list of documents as one value, as sentence-transformers' sampler compares them
        (a listwise loss scores each query's documents alone, so another row's documents are no negatives; kept apart
        one by one, 8 SQuAD rows sharing documents made 4 batches of 5 where there are 2, and an epoch left 4 rows out)."""
        return [{str(t) for t in row} for row in zip(*(column(self.dataset, c) for c in self.texts))]


def _is_list(label: Any) -> bool:
    """A listwise row's labels: a list, or one tensor or array of them (a dataset with format "torch" or "numpy", which
    sentence-transformers' listwise losses take as they take a list; refused as no list before)."""
    return isinstance(label, (list, tuple)) or (isinstance(label, (Tensor, np.ndarray)) and label.ndim == 1)


def collate(examples: list[dict[str, Any]], pad_id: int = 0) -> dict[str, Any]:
    """Examples -> ``input_ids`` (per row, each text's word pieces: lists, which stay on the host, where the loss
    assembles its pair rows; sending them to a GPU and reading them back would stall it at every step) and
    ``label``: (B,), or (B, C - 1) padded with NaN for lists, and the rows' ``dataset_name`` (one a batch).
    ``pad_id`` is kept for callers that pass it."""
    labels = [e["label"] for e in examples]
    if isinstance(labels[0], list):
        label = torch.full((len(examples), max(len(e["input_ids"]) for e in examples) - 1), float("nan"))
        for b, row in enumerate(labels):
            label[b, :len(row)] = torch.as_tensor(row, dtype=torch.float32)
    else:
        label = torch.stack(labels) if isinstance(labels[0], Tensor) else torch.tensor(labels)
    assert len({e.get("dataset_name") for e in examples}) == 1, "a batch holds the rows of one dataset"
    return {"input_ids": [e["input_ids"] for e in examples], "label": label,
            "has_targets": examples[0].get("has_targets", True), "dataset_name": examples[0].get("dataset_name")}


def columns_of(input_ids: list[list[list[int]]], label: Tensor, listwise: bool) -> tuple[list, Any]:
    """A collated batch as the loss's ``(inputs, labels)``: one list of word-piece lists per column, or
    (queries, document lists) and a label tensor per row for a listwise loss."""
    if not listwise:
        return [[row[c] for row in input_ids] for c in range(len(input_ids[0]))], label
    queries = [row[0] for row in input_ids]
    docs = [row[1:] for row in input_ids]
    return [queries, docs], [label[b, :len(d)] for b, d in enumerate(docs)]
