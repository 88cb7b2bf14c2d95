"""Training data for the sentence losses: a dataset's text columns, tokenized per row, padded into one
(B, C, T) batch (C columns); sentence-transformers' no-duplicates and label-grouped batches; several named datasets end to end, with
sentence-transformers' multi-dataset batch order (each batch from one dataset).

Columns are the loss's inputs in the dataset's order (anchor, positive, negatives...); a column named "label",
"labels", "score" or "scores" is the label; "dataset_name" and "return_loss" are refused, as sentence-transformers
refuses them (its trainer reserves them).
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import math
import pickle
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from bertkit.errors import BertkitError, is_whole
from bertkit.tokenization.encoding import segment_ids
from bertkit.training import trainer_data

LABEL_COLUMNS = ("label", "labels", "score", "scores")
RESERVED_COLUMNS = ("dataset_name", "return_loss")  # sentence-transformers' trainer refuses a dataset holding them


def column_names(dataset: Any, what: str = "the dataset") -> list[str]:
    if hasattr(dataset, "column_names"):  # datasets.Dataset
        # the keys its rows hold, as sentence-transformers reads them: set_format(columns=[...]) leaves some columns
        # out, a transform gives its own keys (with_transform renaming "sentence1" "anchor")
        return list(dataset[0] if len(dataset) else dataset.column_names)
    if not hasattr(dataset, "__len__") or not hasattr(dataset, "__getitem__"):
        raise BertkitError(f"{type(dataset).__name__} is not a dataset bertkit.sentence can index; give a "
                           "datasets.Dataset or a list of dicts")
    if len(dataset) == 0:
        raise BertkitError("the dataset is empty")
    if not isinstance(dataset[0], Mapping):
        # most often a dict of columns ({"anchor": [...], "positive": [...]}), read as a dict of datasets whose
        # rows are then its texts
        raise BertkitError(f"{what}: row 0 is {dataset[0]!r:.60} ({type(dataset[0]).__name__}), not a dict of "
                           "columns; give a datasets.Dataset (Dataset.from_dict({column: [values...]}) for columns "
                           "held as lists), a list of dicts, or a dict of such datasets named as the losses")
    return list(dataset[0].keys())


def loss_columns(dataset: Any, loss: Any, what: str) -> tuple[str | None, list[str]]:
    """(the label column or None, the text columns in order) of ``dataset``, once they fit ``loss``: refused
    otherwise, naming the columns and what the loss takes."""
    if type(dataset).__name__ in ("IterableDataset", "IterableDatasetDict"):
        raise BertkitError(f"{what} is an {type(dataset).__name__} (a stream: no length, no row by index), which "
                           "bertkit's sentence trainers do not read; give a datasets.Dataset (load_dataset without "
                           "streaming=True, or Dataset.from_generator over the stream), a list of dicts, or a dict of "
                           "them")
    names = column_names(dataset, what)
    reserved = [c for c in names if c in RESERVED_COLUMNS]
    if reserved:
        raise BertkitError(f"{what} has the column(s) {reserved}, whose names sentence-transformers reserves (it refuses "
                           f"them too): rename or remove them (dataset.remove_columns({reserved}))")
    label = next((c for c in LABEL_COLUMNS if c in names), None)
    texts = [c for c in names if c != label]
    lo, hi = loss.columns
    if len(texts) < lo or (hi is not None and len(texts) > hi) or (loss.needs_label and label is None):
        raise BertkitError(f"{what} has the text columns {texts}" + (f" and the label column {label!r}"
                           if label else " and no label column") + f"; {loss.describe_columns()}, in that "
                           "order: select or rename columns (dataset.select_columns([...]))")
    return label, texts


class SentenceExamples(Sequence):
    """``dataset`` as examples the loss wrapper takes: per row, each text column's token ids (with its prompt, as
    the model's ``tokenize`` gives them for the column's task), the label (0 when the dataset has none and the loss
    needs none) and the row's index (which tells a gathering loss the stand-in row of a process with no share of a
    short batch). ``router_mapping`` ({column: task}) gives a column its task, the Router route it goes through
    (None: the Router's default); a column it names that ``dataset`` does not have as a text column is refused.
    ``name``: the dataset's name in a dict of datasets, which each example carries (its batch's loss is that
    dataset's); None for a dataset of its own."""

    def __init__(self, dataset: Any, model: Any, loss: Any, prompts: str | dict[str, str] | None,
                 router_mapping: dict[str, str], what: str, name: str | None = None):
        self.label, self.texts = loss_columns(dataset, loss, what)
        if len(dataset) == 0:
            raise BertkitError(f"{what} is empty: give it rows, or leave it out")
        self.name = name
        unknown = [c for c in router_mapping if c not in self.texts]
        if unknown:
            example = f"{{{self.texts[0]!r}: 'query', {self.texts[-1]!r}: 'document'}}"
            raise BertkitError(f"router_mapping names the column(s) {unknown}, which are not text columns of {what} "
                               f"(its text columns: {self.texts}): map those, e.g. " + (example if name is None else
                               f"one mapping per dataset, {{{name!r}: {example}, ...}}"))
        self.dataset, self.model = dataset, model
        self._check_texts(what)
        if self.label is not None:
            loss.check_labels(self.label_column(), what)
        self.prompts = [prompts if isinstance(prompts, str) else (prompts or {}).get(c) for c in self.texts]
        self.prompt_lengths = [model.prompt_length(p) for p in self.prompts]
        self.tasks = [router_mapping.get(c) for c in self.texts]

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i: int) -> dict[str, Any]:
        row = self.dataset[i]
        ids, types = [], []
        for column, prompt, task in zip(self.texts, self.prompts, self.tasks):
            enc = self.model.tokenize([row[column]], prompt, **({"task": task} if task is not None else {}))
            ids.append(enc["input_ids"][0].tolist())
            types.append(segment_ids(enc)[0].tolist())
        label = row[self.label] if self.label is not None else 0
        return {"input_ids": ids, "token_type_ids": types, "prompt_length": self.prompt_lengths, "task": self.tasks,
                "label": label, "has_targets": self.label is not None, "index": i, "dataset_name": self.name}

    def _check_texts(self, what: str) -> None:
        """Every row's text columns hold strings, checked once before anything is written: a None or a number at row
        500,000 would otherwise stop the run at the step whose batch holds it."""
        for c in self.texts:
            values = (trainer_data.column(self.dataset, c) if trainer_data.is_hf_dataset(self.dataset)
                      else [self.dataset[i].get(c) for i in range(len(self.dataset))])  # a list's row may lack it
            row = next((i for i, v in enumerate(values) if not isinstance(v, str)), None)
            if row is not None:
                raise BertkitError(f"{what}: row {row}, column {c!r} holds {values[row]!r}, not a text; every text "
                                   f"column holds strings: fill in or drop such rows (dataset.filter(lambda r: "
                                   f"isinstance(r[{c!r}], str)))")

    def texts_by_row(self) -> list[set[str]]:
        """Each row's texts (what the no-duplicates sampler keeps apart within a batch), the columns read at once."""
        return [{str(t) for t in row} for row in zip(*(trainer_data.column(self.dataset, c) for c in self.texts))]

    def label_column(self) -> list:
        """Every row's ``label`` as ``self[i]`` gives it, without tokenizing any row (the Trainer checks the labels
        before training: tokenizing the whole dataset for it took as long as a pass of its loader)."""
        return trainer_data.column(self.dataset, self.label) if self.label is not None else [0] * len(self)

    def fingerprint(self) -> dict[str, Any]:
        """What the examples are made from, for a resumed run to find unchanged: the rows (``data_fingerprint``), the
        columns read, the prompts and routes, and the tokenization (tokenizer, lower-casing, max_seq_length). A
        fingerprint of the examples themselves would tokenize every row once more before training."""
        return {"rows": trainer_data.data_fingerprint(self.dataset), "texts": self.texts, "label": self.label,
                "prompts": self.prompts, "tasks": self.tasks, "tokenizer": tokenizer_fingerprint(self.model),
                "do_lower_case": getattr(self.model, "do_lower_case", None),
                "max_seq_length": getattr(self.model, "max_seq_length", None)}


# Tokenizer attributes added after checkpoints first recorded the tokenizer's digest, and the value every tokenizer
# had before: hashed only when set otherwise, so a checkpoint's digest stays the same tokenizer's (model_input_names,
# per tokenizer since 2026-11-30, had turned every earlier sentence-trainer checkpoint into "other data").
_ADDED_STATE = {"model_input_names": ["input_ids", "token_type_ids", "attention_mask"]}


def tokenizer_fingerprint(model: Any) -> str | None:
    """BLAKE2b of ``model.tokenizer``'s settings and vocabulary (what its pickle carries to loader workers), without
    the attributes of ``_ADDED_STATE`` at their defaults."""
    tokenizer = getattr(model, "tokenizer", None)
    if tokenizer is None:
        return None
    state = tokenizer.__getstate__() if hasattr(tokenizer, "__getstate__") else vars(tokenizer)
    state = {k: v for k, v in state.items() if k not in _ADDED_STATE or list(v) != _ADDED_STATE[k]}
    return hashlib.blake2b(pickle.dumps(sorted(state.items()), protocol=4), digest_size=16).hexdigest()


class SentenceCollator:
    """Examples -> ``input_ids``, ``token_type_ids``, ``attention_mask`` (B, C, T) padded with ``pad_id``,
    ``widths`` (each column's longest row, C ints: the loss runs each column on its own width, so a short query
    column is not computed at a long passage column's width), ``prompt_length`` and ``task`` (C each: each
    column's prompt and task, the same for every row), ``label`` (B,), ``has_targets`` (whether the dataset has a label
    column: without one ``label`` is zeros and the loss gets None, as sentence-transformers' loss gets no label)
    and ``index`` (B,). The ints stay on the
    host: reading them from the device would stall its queue of kernels at every step. ``dataset_name``: the
    dataset the rows come from (one a batch; None for a dataset of its own)."""

    def __init__(self, pad_id: int):
        self.pad_id = pad_id

    def __call__(self, examples: list[dict[str, Any]]) -> dict[str, Any]:
        B, C = len(examples), len(examples[0]["input_ids"])
        widths = [max(len(e["input_ids"][c]) for e in examples) for c in range(C)]
        T = max(widths)
        input_ids = torch.full((B, C, T), self.pad_id, dtype=torch.long)
        token_type_ids = torch.zeros(B, C, T, dtype=torch.long)
        attention_mask = torch.zeros(B, C, T, dtype=torch.long)
        for b, e in enumerate(examples):
            for c, (ids, types) in enumerate(zip(e["input_ids"], e["token_type_ids"])):
                input_ids[b, c, :len(ids)] = torch.as_tensor(ids)
                token_type_ids[b, c, :len(ids)] = torch.as_tensor(types)
                attention_mask[b, c, :len(ids)] = 1
        labels = [e["label"] for e in examples]
        assert len({e["dataset_name"] for e in examples}) == 1, "a batch holds the rows of one dataset"
        return {"input_ids": input_ids, "token_type_ids": token_type_ids, "attention_mask": attention_mask,
                "widths": widths, "prompt_length": list(examples[0]["prompt_length"]), "task": list(examples[0]["task"]),
                "label": torch.stack(labels) if isinstance(labels[0], Tensor) else torch.tensor(labels),
                "has_targets": examples[0].get("has_targets", True),
                "index": torch.tensor([e["index"] for e in examples], dtype=torch.long),
                "dataset_name": examples[0]["dataset_name"]}


def no_duplicates_batches(examples: SentenceExamples, batch_size: int, seed: int) -> list[list[int]]:
    """sentence-transformers' NoDuplicatesBatchSampler batches of one epoch: one shuffle (``seed``), then each batch
    takes, in shuffled order, the next rows that share no text with the rows already in it; rows that do wait for a
    later batch. Where the rows left cannot fill a batch without a repeat, the batch is smaller: every row comes
    once, and there may be more batches than ``ceil(len / batch_size)`` (an epoch trains on that many, the first,
    as transformers' Trainer runs sentence-transformers' sampler)."""
    rest = torch.randperm(len(examples), generator=torch.Generator().manual_seed(seed), dtype=torch.int32).tolist()
    texts = examples.texts_by_row()
    batches: list[list[int]] = []
    while rest:
        batch, seen, waiting = [], set(), []
        for k, i in enumerate(rest):
            if len(batch) == batch_size:
                waiting.extend(rest[k:])
                break
            if texts[i] & seen:
                waiting.append(i)
                continue
            batch.append(i)
            seen |= texts[i]
        batches.append(batch)
        rest = waiting
    return batches


def label_groups(labels: Sequence, column: str | None, what: str) -> dict[int, list[int]]:
    """The rows of each label, the labels in the order they first appear; refused unless every label is an int (a
    class id) or a bool (True/False: two classes, compared as sentence-transformers compares them, 1 and 0). A float
    would make each distinct score a class, and a string is no tensor (sentence-transformers fails on it at the first
    batch)."""
    if column is None:
        raise BertkitError(f"{what} has no label column: rows are grouped and compared by their label, so add a "
                           "'label' column of class ids (ints)")
    groups: dict[int, list[int]] = {}
    for row, label in enumerate(labels):
        if not (isinstance(label, bool) or is_whole(label, -math.inf)):
            raise BertkitError(f"{what}: row {row} has {column} {label!r} ({type(label).__name__}); the rows are "
                               "grouped by label, which must be class ids (ints): map each class to an int, e.g. "
                               f"dataset.class_encode_column({column!r}) for texts, or cast integral floats to int")
        groups.setdefault(int(label), []).append(row)
    return groups


def paired_groups(groups: dict[int, list[int]], batch_size: int, what: str) -> dict[int, list[int]]:
    """The labels of two rows or more (the others cannot be a positive pair), once they can fill batches of
    ``batch_size``: refused unless that is even and at least 4 (two labels, two rows each) and two labels have two
    rows or more, as sentence-transformers' GroupByLabelBatchSampler refuses them."""
    if isinstance(batch_size, bool) or batch_size < 4 or batch_size % 2:
        raise BertkitError(f"{what}: batch_sampler=GROUP_BY_LABEL fills each batch with pairs of rows of one label, "
                           f"at least two labels a batch, so the batch size must be an even number >= 4, got "
                           f"{batch_size}: set it to 4, 6, 8, ...")
    paired = {label: rows for label, rows in groups.items() if len(rows) >= 2}
    if len(paired) < 2:
        counts = {label: len(rows) for label, rows in groups.items()}
        raise BertkitError(f"{what}: batch_sampler=GROUP_BY_LABEL needs two labels with two rows or more each (a "
                           f"positive pair beside a negative), and the rows per label are {counts}: give more rows, "
                           "or use another batch_sampler")
    return paired


def group_by_label_count(groups: dict[int, list[int]], batch_size: int, drop_last: bool = False) -> int:
    """How many batches ``group_by_label_batches`` gives: labels give a pair each in turn until one label is left
    (so every label gives at most as many pairs as the second largest has), cut into batches; a last short batch
    counts when it holds 4 rows or more, unless ``drop_last``."""
    pairs = sorted((len(rows) // 2 for rows in groups.values()), reverse=True)
    stream = 2 * sum(min(p, pairs[1]) for p in pairs)
    return stream // batch_size + (not drop_last and stream % batch_size >= 4)


def group_by_label_batches(groups: dict[int, list[int]], batch_size: int, generator: torch.Generator,
                           seed: int, drop_last: bool = False) -> Iterator[list[int]]:
    """sentence-transformers' GroupByLabelBatchSampler batches of one epoch (``groups``: ``paired_groups``), drawn
    lazily from ``generator`` reseeded with ``seed`` at the first batch, as its sampler draws them (several datasets
    share one generator, so where the draws fall matters): each label's rows shuffled and cut to an even count, then
    rounds in which every label left gives its next two rows, the labels in a new random order each round (the
    first swapped with the second where it would repeat the label that ended the last round); the stream is cut
    into batches of ``batch_size`` and stops when one label is left. A last short batch is given when it holds 4 rows
    or more (two labels' pairs), unless ``drop_last`` (``dataloader_drop_last``); rows beyond are left out of the
    epoch."""
    generator.manual_seed(seed)
    queues = {}
    for label, rows in groups.items():
        order = torch.randperm(len(rows), generator=generator)[:len(rows) // 2 * 2].tolist()
        queues[label] = deque(rows[i] for i in order)
    labels, batch, last = list(queues), [], None
    while len(labels) >= 2:
        labels = [labels[i] for i in torch.randperm(len(labels), generator=generator).tolist()]
        if batch and labels[0] == last:
            labels[0], labels[1] = labels[1], labels[0]
        for label in labels:
            batch += (queues[label].popleft(), queues[label].popleft())
            if len(batch) >= batch_size:
                yield batch[:batch_size]
                batch = batch[batch_size:]
        last = labels[-1]
        labels = [label for label in labels if queues[label]]
    if not drop_last and len(batch) >= 4:
        yield batch


class MultiDatasetExamples(Sequence):
    """Named datasets' examples (``SentenceExamples``, or the cross-encoder's) end to end (sentence-transformers'
    ConcatDataset of a DatasetDict): row ``i`` of the k-th dataset is ``offsets[k] + i``; each example carries its
    dataset's name."""

    def __init__(self, parts: dict[str, Any]):
        self.parts = parts
        self.offsets = [0, *itertools.accumulate(len(p) for p in parts.values())]
        self._parts = list(parts.values())

    def __len__(self) -> int:
        return self.offsets[-1]

    def __getitem__(self, i: int) -> dict[str, Any]:
        k = bisect.bisect_right(self.offsets, i) - 1
        return self._parts[k][i - self.offsets[k]]

    def label_column(self) -> list:
        return [label for part in self._parts for label in part.label_column()]

    def fingerprint(self) -> dict[str, Any]:
        """Each dataset's (``SentenceExamples.fingerprint``), by name and in order (the order draws the batches)."""
        return {"datasets": [[name, part.fingerprint()] for name, part in self.parts.items()]}


def multi_dataset_batches(parts: Sequence[Any], batch_size: int, seed: int, round_robin: bool,
                          sampler: str, drop_last: bool = False) -> list[list[int]]:
    """One epoch's batches of several datasets end to end (``MultiDatasetExamples``' indices), each batch from one
    dataset, as sentence-transformers draws them (``seed``: its seed + epoch; ``sampler``: ``BatchSamplers``' value).
    One generator serves every sampler: reseeded with ``seed``, it draws the proportional order of the datasets'
    batches first (round robin draws none); each dataset's own shuffle is drawn from it when that dataset gives its
    first batch (torch's RandomSampler in a BatchSampler, whose next shuffle is drawn when the rows run out: torch's
    own classes, so the draws fall where they fall there), or, for the no-duplicates sampler, from the generator
    reseeded with ``seed`` (so each dataset's batches are ``no_duplicates_batches``'); the label-grouped sampler
    reseeds the shared generator at its first batch and draws each round's order from it as its batches are taken
    (``group_by_label_batches``). PROPORTIONAL gives every dataset's batches (ceil(rows / batch), or
    ``group_by_label_count``); ROUND_ROBIN one batch of each in turn, as many rounds as the dataset with the fewest
    batches has. ``drop_last`` (``dataloader_drop_last``): each dataset's sampler leaves out its own short batch, as
    each of sentence-transformers' does (floor(rows / batch) batches, or the label-grouped count without a short
    one); the no-duplicates sampler does not take it."""
    generator = torch.Generator().manual_seed(seed)
    offsets = [0, *itertools.accumulate(len(p) for p in parts)]
    if sampler == "group_by_label":
        groups = [paired_groups(label_groups(p.label_column(), p.label, "train_dataset"), batch_size, "train_dataset")
                  for p in parts]
        counts = [group_by_label_count(g, batch_size, drop_last) for g in groups]
    else:
        counts = [len(p) // batch_size if drop_last else math.ceil(len(p) / batch_size) for p in parts]

    def batches(k: int) -> Iterator[list[int]]:
        if sampler == "no_duplicates":
            return iter(no_duplicates_batches(parts[k], batch_size, seed))
        if sampler == "group_by_label":
            return group_by_label_batches(groups[k], batch_size, generator, seed, drop_last)
        rows = torch.utils.data.RandomSampler(range(len(parts[k])), generator=generator)
        return iter(torch.utils.data.BatchSampler(rows, batch_size, drop_last=drop_last))

    if round_robin:
        order = [k for _ in range(min(counts)) for k in range(len(parts))]
    else:
        indices = [k for k, n in enumerate(counts) for _ in range(n)]
        order = [indices[i] for i in torch.randperm(len(indices), generator=generator).tolist()]
    drawn = [batches(k) for k in range(len(parts))]  # lazy: nothing is drawn before a dataset's first batch
    return [[offsets[k] + i for i in next(drawn[k])] for k in order]
