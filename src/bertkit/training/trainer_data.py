"""The data as it enters ``bertkit.Trainer``, checked once before anything trains: a dataset made in the ordinary
way (labels as strings or pandas floats, a NaN, per-token labels of the wrong length, an IterableDataset) is named
with its row and the fix instead of failing in PyTorch, numpy or the loss.
"""

from __future__ import annotations

import hashlib
import logging
import math
import numbers
import os
import pickle
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bertkit.errors import BertkitError
from bertkit.heads import IGNORE_INDEX

logger = logging.getLogger("bertkit")

LABEL_COLUMNS = ("label", "labels", "label_ids")  # what the collators hand the model as ``labels``


def examples(dataset: Any, what: str, *, keep: set[str] | None, model: Any, training: bool) -> Sequence:
    """``dataset`` as a sequence of example dicts, only the ``keep`` columns (None: all), labels read as
    transformers' models take them (strings through ``label2id``, whole-number floats as class ids); ``training``
    refuses labels that give nothing to learn from."""
    if dataset is None:
        raise BertkitError(f"{what} needs a dataset; pass Trainer({what}=...)")
    if isinstance(dataset, Mapping):  # load_dataset(...) without split=: a DatasetDict, whose [0] is no row
        names = list(dataset)
        raise BertkitError(f"{what} is a {type(dataset).__name__} of the datasets {names}, where one dataset is "
                           f"expected: pass one of them ({what}=dataset[{names[0] if names else 'train'!r}])")
    if not hasattr(dataset, "__len__") or not hasattr(dataset, "__getitem__"):
        raise BertkitError(
            f"{what}: {type(dataset).__name__} has no length or index (an iterable or streaming dataset); "
            "bertkit's Trainer reads its data by index, in a seeded order it can resume at the exact "
            "batch. Give a datasets.Dataset (load_dataset without streaming=True, or Dataset.from_generator over "
            "the stream), a torch map-style Dataset or a list of dicts (list(dataset) for a finite stream)")
    if is_hf_dataset(dataset) and keep is not None and not has_transform(dataset):
        unused = [c for c in dataset.column_names if c not in keep]
        if unused:
            dataset = dataset.remove_columns(unused)
        keep = None
    if len(dataset) == 0:
        raise BertkitError(f"{what} is empty (0 rows): give it rows (a filter or select may have left none)")
    first = dataset[0]
    if not isinstance(first, Mapping):
        raise BertkitError(f"{what}: examples must be dicts of columns, got {type(first).__name__}")
    readers = {key: _label_reader(dataset, key, what, model, training) for key in LABEL_COLUMNS if key in first}
    readers = {key: read for key, read in readers.items() if read is not None}
    return _Examples(dataset, keep, readers) if keep is not None or readers else dataset


def is_hf_dataset(dataset: Any) -> bool:
    """A datasets.Dataset, recognised without importing ``datasets`` (an optional package)."""
    return type(dataset).__module__.startswith("datasets") and hasattr(dataset, "remove_columns")


def has_transform(dataset: Any) -> bool:
    """A datasets.Dataset given a transform (``with_transform``, ``set_transform``): its rows are what the transform
    returns, not its Arrow columns. remove_unused_columns keeps the transform's keys the model takes, where removing
    the Arrow columns it reads ("sentence") stopped the transform with a KeyError, as in transformers."""
    return is_hf_dataset(dataset) and dataset.format.get("type") == "custom"


class _Examples(Sequence):
    """A map-style dataset whose examples lose the keys not kept and whose labels are read by ``readers``."""

    def __init__(self, dataset: Any, keep: set[str] | None, readers: dict[str, Callable[[Any], Any]]):
        self.dataset, self.keep, self.readers = dataset, keep, readers

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i: int) -> Any:
        item = self.dataset[i]
        if not isinstance(item, Mapping):
            return item
        item = {k: v for k, v in item.items() if self.keep is None or k in self.keep}
        for key, read in self.readers.items():
            if key in item:
                item[key] = read(item[key])
        return item


def column(dataset: Any, key: str) -> list:
    """Every example's ``key``: a datasets.Dataset's in one Arrow read; the labels of examples made per row
    (bertkit.sentence's, tokenized as they are read) through their ``label_column``, which tokenizes no row."""
    if has_transform(dataset):  # through the transform, 1,000 rows a call
        return [v for start in range(0, len(dataset), 1000) for v in dataset[start:start + 1000][key]]
    if is_hf_dataset(dataset):
        return dataset.select_columns([key]).with_format(None)[:][key]  # one Arrow column, read at once
    if key == "label" and hasattr(dataset, "label_column"):
        return dataset.label_column()
    return [dataset[i][key] for i in range(len(dataset))]


def _label_reader(dataset: Any, key: str, what: str, model: Any, training: bool) -> Callable[[Any], Any] | None:
    """Check the ``key`` column; return how to read each of its values (None: as they are)."""
    values = column(dataset, key)
    config = getattr(model, "config", None)
    if any(isinstance(v, (list, tuple, np.ndarray, torch.Tensor)) and np.ndim(v) == 1 for v in values[:1]):
        if getattr(config, "problem_type", None) != "multi_label_classification" and \
                not any(isinstance(x, float) for x in _flat(values[0])):  # multi-label targets are floats
            if type(model).__name__.endswith("ForSequenceClassification"):  # one label per example, not per token
                raise BertkitError(
                    f"{what}: {key} at row 0 is the list {_flat(values[0])[:8]!r}, but {type(model).__name__} takes "
                    f"one class id per example: give the class id (for one-hot rows, the index of the 1), or for "
                    "multi-label targets give floats (0.0/1.0) or load the model with "
                    "problem_type='multi_label_classification'")
            _check_token_labels(dataset, key, values, what, training)
        for row, v in enumerate(values):  # a distillation target's (MSELoss) or a multi-label row's NaN: the loss is
            # NaN at its first batch, and training stops blaming the learning rate
            entries = np.asarray(v.float().cpu() if isinstance(v, torch.Tensor) else v)
            if entries.dtype.kind == "f" and not np.isfinite(entries).all():  # strings, ragged rows: checked elsewhere
                entries = entries.ravel()
                at = int(np.argwhere(~np.isfinite(entries))[0][0])
                raise BertkitError(f"{what}: row {row} has {key} holding {entries[at]} (at position {at}); every "
                                   "value of a label must be a number: fix that row, or drop it (dataset.filter / "
                                   "dataset.select)")
        return None
    values = [v.item() if hasattr(v, "item") and np.ndim(v) == 0 else v for v in values]  # numpy, torch scalars
    for row, v in enumerate(values):
        if v is None or (isinstance(v, numbers.Real) and not math.isfinite(v)):
            raise BertkitError(f"{what}: row {row} has {key} {v!r}; every example needs a label: give it one, or drop "
                               "the row (dataset.filter / dataset.select, or dropna on the DataFrame)")
    # To a head (a model with a config) a bool tensor is neither class ids nor multi-label targets. A model with no
    # config (a sentence or cross-encoder loss, a custom module) takes the labels as they are batched, a bool tensor
    # too, as with transformers' Trainer: a loss reads True/False as 1/0, as sentence-transformers' do, and refuses
    # in its check_labels what it cannot learn from.
    if config is not None and any(isinstance(v, bool) for v in values):
        raise BertkitError(f"{what}: {key} holds booleans (True/False); give class ids 0/1 instead (in pandas "
                           f"df[{key!r}].astype(int), in datasets dataset.cast_column({key!r}, Value('int64')))")
    if all(isinstance(v, str) for v in values):
        return _string_labels(values, key, what, config)
    if any(isinstance(v, str) for v in values):
        row = next(i for i, v in enumerate(values) if isinstance(v, str) != isinstance(values[0], str))
        raise BertkitError(f"{what}: {key} mixes strings and numbers ({values[0]!r} at row 0, {values[row]!r} at "
                           f"row {row}); make them one kind")
    class_ids = any(isinstance(v, float) for v in values) and _classifies(config)
    if class_ids:
        row = next((i for i, v in enumerate(values) if float(v) != int(v)), None)
        if row is not None:
            raise BertkitError(
                f"{what}: {key} {values[row]!r} at row {row} is not a class id, and {type(model).__name__} "
                f"classifies into {config.num_labels} labels; give class ids 0..{config.num_labels - 1}, or for a "
                "score load the model with num_labels=1 (regression)")
        say = logger.warning if training else logger.debug  # said once a run, not at every evaluation
        say("%s: %s holds floats (%s); read as the class ids %s, for %s's %d-label classification", what, key,
            ", ".join(map(repr, sorted({float(v) for v in values})[:5])),
            ", ".join(map(str, sorted({int(v) for v in values})[:5])), type(model).__name__, config.num_labels)
    if _classifies(config) and type(model).__name__.endswith("ForSequenceClassification"):  # (a choice index is no
        # class) the head refuses another id only at the step whose batch holds it, hours into the run perhaps
        n = config.num_labels
        row = next((i for i, v in enumerate(values) if int(v) != IGNORE_INDEX and not 0 <= int(v) < n), None)
        if row is not None:
            raise BertkitError(f"{what}: {key} {values[row]!r} at row {row} is not a class of {type(model).__name__}, "
                               f"whose {n} labels are 0 to {n - 1} (or {IGNORE_INDEX} for no loss): map the labels to "
                               f"ids below {n}, or load the model with num_labels (and id2label) for every class")
    if training:
        _some_label(values, key, what)
    return int if class_ids else None


def _classifies(config: Any) -> bool:
    """Whether a scalar label is a class id for this model: a head of several outputs, not multi-label."""
    return (config is not None and getattr(config, "num_labels", 1) > 1
            and getattr(config, "problem_type", None) in (None, "single_label_classification"))


def _string_labels(values: list, key: str, what: str, config: Any) -> Callable[[Any], int]:
    """String labels through the model's label2id (transformers' models take ids only), or an error naming them."""
    seen = sorted(set(values))
    label2id = dict(getattr(config, "label2id", None) or {})
    shown = f"{seen[:10]}{' ...' if len(seen) > 10 else ''}"
    if not _classifies(config):
        # a score: a one-output head (regression, a cross-encoder) or a sentence loss, which take numbers only
        numbers = all(_is_number(v) for v in seen)
        fix = (f"dataset.cast_column({key!r}, Value('float32')) (from datasets import Value), or float() each"
               if numbers else f"dataset.class_encode_column({key!r}) gives them the ids 0..{len(seen) - 1}, or map "
               "each to its number")
        raise BertkitError(f"{what}: {key} holds strings {shown}, and the model takes a number per example (its loss "
                           f"scores, it has no label names); make them numbers: {fix}")
    if not set(seen) <= set(label2id):
        names = sorted(label2id, key=label2id.get) if label2id else None
        suggested = {i: s for i, s in enumerate(seen)}
        raise BertkitError(
            f"{what}: {key} holds strings {shown}, but the model's config names its labels {names}; name them when "
            f"loading the model (from_pretrained(..., id2label={suggested}, label2id="
            f"{ {s: i for i, s in suggested.items()} })), or map {key} to ids (dataset.class_encode_column({key!r}))")
    return lambda v: label2id[v]


def _is_number(text: str) -> bool:
    try:
        return math.isfinite(float(text))
    except ValueError:
        return False


def _some_label(values: list, key: str, what: str) -> None:
    if all(int(v) == IGNORE_INDEX for v in values):
        raise BertkitError(f"{what}: no example has a label to learn from: every {key} is {IGNORE_INDEX} (ignored "
                           "by the loss); check how the labels were made")


def _check_token_labels(dataset: Any, key: str, values: list, what: str, training: bool) -> None:
    """Per-token labels: one per input token, and not all ignored."""
    lengths = [len(v) for v in column(dataset, "input_ids")] if "input_ids" in dataset[0] else None
    for row, labels in enumerate(values):
        if lengths is not None and len(labels) != lengths[row]:
            raise BertkitError(f"{what}: row {row} has {len(labels)} {key} for {lengths[row]} input_ids; give one "
                               "label per token (-100 for tokens without one: special tokens, a word's later "
                               "pieces), with the same truncation as the input")
    if training and all(int(x) == IGNORE_INDEX for labels in values for x in _flat(labels)):
        raise BertkitError(f"{what}: no example has a label to learn from: every token's {key} is {IGNORE_INDEX} "
                           "(ignored by the loss); check the alignment of the labels to the tokens (word_ids())")


def _flat(labels: Any) -> list:
    return labels.tolist() if hasattr(labels, "tolist") else list(labels)


def data_fingerprint(examples: Sequence) -> str:
    """BLAKE2b over every example as the model is fed it, in the dataset's order: its columns sorted by name with
    their values (tensors and arrays as dtype, shape and bytes). A datasets.Dataset is read 1,000 rows at a time
    (SST-2's 67,349 rows in a third of the time of one by one)."""
    digest = hashlib.blake2b(digest_size=16)
    if is_hf_dataset(examples):
        # python values, whatever format the user set; a transform's rows as it gives them
        plain = examples if has_transform(examples) else examples.with_format(None)
        for start in range(0, len(plain), 1000):
            batch = plain[start:start + 1000]
            names = sorted(batch)
            for values in zip(*(batch[k] for k in names)):
                digest.update(pickle.dumps([(k, _hashable(v)) for k, v in zip(names, values)], protocol=4))
        return digest.hexdigest()
    for i in range(len(examples)):
        row = examples[i]  # a dict of columns; or a value, such as the index of a row held elsewhere
        items = [(k, _hashable(row[k])) for k in sorted(row)] if isinstance(row, Mapping) else _hashable(row)
        digest.update(pickle.dumps(items, protocol=4))
    return digest.hexdigest()


def _hashable(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().numpy()
    if isinstance(value, np.ndarray):
        return str(value.dtype), value.shape, value.tobytes()
    return value.item() if isinstance(value, np.generic) else value


def whole_batches(rows: int, size: int, what: str, setting: str) -> int:
    """The whole batches of ``size`` in ``rows``: what an epoch (an evaluation) takes with dataloader_drop_last, as
    transformers' DataLoader drops the short last one. None at all is refused (transformers finds no batch to run)."""
    if rows < size:
        raise BertkitError(f"dataloader_drop_last=True leaves none of {what}'s {rows} rows: they make no whole batch "
                           f"of {size}; lower {setting} below {rows + 1} or set dataloader_drop_last=False")
    return rows // size


def evaluated_rows(rows: int, size: int, world_size: int, drop_last: bool) -> int:
    """The first rows an evaluation (or predict()) runs on: all, or with dataloader_drop_last those of the whole
    batches of ``size``, as transformers' evaluation loader keeps them."""
    if not drop_last:
        return rows
    if world_size > 1:  # accelerate deals the whole batches out to the processes in rounds, which bertkit does not
        raise BertkitError(f"dataloader_drop_last=True in an evaluation or predict() under torchrun ({world_size} "
                           "processes) is not implemented: set dataloader_drop_last=False (every row evaluated)")
    return whole_batches(rows, size, "the evaluation data", "per_device_eval_batch_size") * size


def sampling_strategy(strategy: str, trainer: str, reads: bool) -> str:
    """The training order's strategy: ``strategy``, or "random" for a trainer that does not read it (``reads``
    False: sentence-transformers' trainers shuffle with their default batch_sampler whatever it says)."""
    if reads or strategy == "random":
        return strategy
    logger.warning("%s trains in sentence-transformers' order, which does not read train_sampling_strategy=%r: "
                   "its batch_sampler draws the batches (shuffled); drop train_sampling_strategy", trainer, strategy)
    return "random"


def train_order(examples: Sequence, strategy: str, seed: int) -> Callable[[int], Sequence[int]]:
    """Each epoch's order of the rows (``train_sampling_strategy``): "sequential"; "random", transformers' Trainer's (a
    RandomSampler that accelerate's SeedableRandomSampler reseeds with seed + epoch before each epoch: data_seed, or
    torch's initial seed, which set_seed(seed) made seed). "group_by_length" is ``length_grouped``'s."""
    n = len(examples)
    if strategy == "sequential":
        return lambda epoch: range(n)
    return lambda epoch: torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch)).tolist()


def global_batches(rows: list[int], per_device: int, world_size: int, fill: bool) -> list[list[int]]:
    """An epoch's order cut into global micro-batches of ``per_device`` x ``world_size`` rows, of which rank r
    trains on the r-th share. ``fill``: under torchrun a short last batch is filled up with the epoch's first rows
    (over again while the epoch is shorter than a global batch), as accelerate's BatchSamplerShard (even_batches)
    fills the last round of transformers' batches: every process trains on a whole batch at the last step, some rows
    twice. Otherwise it is split over the processes as it is."""
    size = per_device * world_size
    short = len(rows) % size
    if fill and world_size > 1 and short:
        rows = rows + (rows * -(-size // len(rows)))[:size - short]
    return [rows[s:s + size] for s in range(0, len(rows), size)]


def check_batch(collator: Any, first: Any, what: str, forward_args: Sequence[str], label_names: Sequence[str] | None,
                model_name: str) -> None:
    """Collate one example before anything is written: every key must be an argument of the model's forward
    (``forward_args``), and with ``label_names`` (training) one of them must be there. It must not use up random
    draws (torch's, a masking collator's generator; one made on first use, as transformers' collators make it, is
    dropped again)."""
    generator = getattr(collator, "generator", "absent")
    saved = (torch.get_rng_state(), generator.get_state() if isinstance(generator, torch.Generator) else None)
    try:
        batch = collator([first])
    finally:
        torch.set_rng_state(saved[0])
        if saved[1] is not None:
            generator.set_state(saved[1])
        elif generator is None:
            collator.generator = None
    unknown = [k for k in batch if k not in forward_args]
    added = [k for k in unknown if k not in first]
    if added:  # no column of the data: remove_unused_columns cannot drop them
        raise BertkitError(
            f"{what}: the data_collator returns {added}, which are not arguments of {model_name}.forward "
            f"({', '.join(forward_args)}); return only those from the collator (transformers' Trainer passes them to "
            "the model, whose **kwargs ignore them)")
    if unknown:
        raise BertkitError(
            f"{what}: column(s) {unknown} are not arguments of {model_name}.forward ({', '.join(forward_args)}); "
            f"remove them (dataset.remove_columns({unknown})) or keep remove_unused_columns=True")
    if label_names is not None and not any(k in batch for k in label_names):
        raise BertkitError(
            f"{what} has no labels: its batches hold {sorted(batch)}, and {model_name} trains on {label_names}; add "
            "a 'label' (or 'labels') column, or set label_names in TrainingArguments")


def loader_draw() -> None:
    """The one number transformers' data loader draws from torch's global generator each time it starts (an epoch, an
    evaluation, predict()): drawn here too, dropout's masks (and an unseeded masking collator's) are a transformers
    run's for the same seed. bertkit's loader draws from its own generator, so a resumed run draws what it drew."""
    torch.empty((), dtype=torch.int64).random_()


COLLATOR_RNG = "collator_rng.pt"  # a checkpoint's record of a seeded collator's generator


def save_collator_rng(collator: Any, directory: Path) -> None:
    """A seeded collator's generator state (a masking collator's ``seed=``: bertkit's or transformers'), written
    into a checkpoint: a resumed run's collator would otherwise draw its masks from the seed again, not from where
    the interrupted run was (transformers' resumed run does), and train on other masks without a word. None where
    it has drawn nothing yet."""
    if getattr(collator, "seed", None) is None or not hasattr(collator, "generator"):
        return
    generator = collator.generator
    torch.save({"generator": generator.get_state() if isinstance(generator, torch.Generator) else None},
               directory / COLLATOR_RNG)


def load_collator_rng(collator: Any, checkpoint: Path) -> None:
    """Give a seeded collator the generator state ``checkpoint`` recorded (``save_collator_rng``), in this process
    (with DataLoader workers, each draws from a generator of its own, seeded as it starts, as transformers' do). A
    checkpoint written before it was recorded holds none: its masks are drawn from the seed again, as then, and a
    warning says so."""
    if getattr(collator, "seed", None) is None or not hasattr(collator, "generator"):
        return
    path = checkpoint / COLLATOR_RNG
    if not path.is_file():
        logger.warning("%s holds no %s (written by an earlier bertkit): the seeded %s draws its masks from seed %s "
                       "again, so from here they differ from the interrupted run's", checkpoint, COLLATOR_RNG,
                       type(collator).__name__, collator.seed)
        return
    state = torch.load(path, weights_only=True)["generator"]
    if state is not None:
        collator.generator = torch.Generator()
        collator.generator.set_state(state)
        collator._generator_pid = os.getpid()  # made in this process: the collator's own check keeps it
