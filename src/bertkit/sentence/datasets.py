"""``SentenceLabelDataset``: the label-grouped dataset of sentence-transformers' legacy ``model.fit`` (its
``sentence_transformers.datasets``), for the batch triplet losses:

    data = SentenceLabelDataset([InputExample(texts=[text], label=class_id), ...])
    model.fit(train_objectives=[(DataLoader(data, batch_size=16), losses.BatchHardTripletLoss(model))])

``fit`` reads one pass of it as the dataset's rows and batches them with ``BatchSamplers.GROUP_BY_LABEL``, as
sentence-transformers' ``fit`` does. The module's other datasets are refused by name, with what to use.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch

from bertkit.errors import BertkitError, refusing_getattr
from bertkit.sentence.readers import InputExample


class SentenceLabelDataset(torch.utils.data.IterableDataset):
    """``examples`` (InputExample) grouped by label, the labels of fewer than ``samples_per_label`` examples left out.
    A pass takes ``samples_per_label`` examples of one label at a time, the labels in a shuffled order (reshuffled
    after each round), until it has given as many examples as the kept labels hold; without ``with_replacement`` an
    example comes at most once a round, and a label with fewer unseen examples left sits the round out. The draws
    are numpy's global generator's, where sentence-transformers draws them, so a seeded script takes the same
    examples."""

    def __init__(self, examples: Sequence[InputExample], samples_per_label: int = 2, with_replacement: bool = False):
        super().__init__()
        if isinstance(samples_per_label, bool) or not isinstance(samples_per_label, int) or samples_per_label < 1:
            raise BertkitError(f"SentenceLabelDataset: samples_per_label must be a whole number >= 1, got "
                               f"{samples_per_label!r}")
        by_label: dict[Any, list[InputExample]] = {}
        for i, example in enumerate(examples):
            if not isinstance(example, InputExample):
                raise BertkitError(f"SentenceLabelDataset: example {i} is a {type(example).__name__}; give "
                                   "InputExample(texts=[text], label=class_id)")
            by_label.setdefault(example.label, []).append(example)
        self.samples_per_label, self.with_replacement = samples_per_label, with_replacement
        self.grouped_inputs: list[InputExample] = []
        self.groups_right_border: list[int] = []  # where each kept label's examples end in grouped_inputs
        for label_examples in by_label.values():
            if len(label_examples) >= samples_per_label:
                self.grouped_inputs.extend(label_examples)
                self.groups_right_border.append(len(self.grouped_inputs))
        if not self.grouped_inputs:
            raise BertkitError(f"SentenceLabelDataset: no label has {samples_per_label} examples or more (labels seen: "
                               f"{len(by_label)}); give each class at least {samples_per_label}")
        self.label_range = np.arange(len(self.groups_right_border))
        np.random.shuffle(self.label_range)

    def __iter__(self) -> Iterator[InputExample]:
        given, position, seen = 0, 0, {}
        while given < len(self.grouped_inputs):
            label = self.label_range[position]
            start = self.groups_right_border[label - 1] if label > 0 else 0
            candidates = np.arange(start, self.groups_right_border[label])
            taken = seen.setdefault(label, set())
            if not self.with_replacement:
                candidates = [i for i in candidates if i not in taken]
            if len(candidates) >= self.samples_per_label:
                for i in np.random.choice(candidates, self.samples_per_label, replace=False):
                    given += 1
                    taken.add(i)
                    yield self.grouped_inputs[i]
            position += 1
            if position == len(self.label_range):  # a round ends: every label's examples may come again
                position, seen = 0, {}
                np.random.shuffle(self.label_range)

    def __len__(self) -> int:
        return len(self.grouped_inputs)


_TRAINER = "train with SentenceTransformerTrainer (docs/sentence.md)"
__getattr__ = refusing_getattr(__name__, {
    "NoDuplicatesDataLoader": f"give fit a DataLoader(examples, shuffle=True, batch_size=...), or {_TRAINER} with "
                              "batch_sampler=BatchSamplers.NO_DUPLICATES",
    "SentencesDataset": "give fit the list of InputExample itself: DataLoader(examples, shuffle=True, batch_size=...)",
    "ParallelSentencesDataset": f"{_TRAINER} on (source, target) rows with a teacher's embeddings as the label "
                                "(losses.MSELoss)",
    "DenoisingAutoEncoderDataset": "adapt the encoder to a domain with masked-LM pre-training (bertkit pretrain "
                                   "--init-from), then train the embedder",
})
