"""``SentenceTransformerTrainingArguments``: bertkit's ``TrainingArguments`` (transformers' fields bertkit
implements) plus sentence-transformers' own: ``batch_sampler`` (``BatchSamplers``), ``prompts``, ``router_mapping``
(``{column: route}``: the Router route each text column goes through; either may be given per dataset of a dict of
datasets, ``for_dataset``), ``learning_rate_mapping`` (``{pattern: rate}``: a learning rate for the parameters whose
name the regular expression matches) and ``multi_dataset_batch_sampler`` (``MultiDatasetBatchSamplers``: which dataset each batch of a dict of training
datasets comes from)."""

from __future__ import annotations

import json
import math
import re
from enum import Enum
from pathlib import Path
from typing import Any

from bertkit.errors import BertkitError, keyword_only
from bertkit.training.trainer_args import TrainingArguments

# sentence-transformers' positional order of the calls whose later arguments bertkit takes by keyword only
# (``keyword_only``): the trainers', and the training arguments' (transformers' TrainingArguments' first fields)
TRAINER_POSITIONS = ("model", "args", "train_dataset", "eval_dataset", "loss", "evaluator", "data_collator",
                     "processing_class", "model_init", "compute_metrics", "callbacks", "optimizers",
                     "optimizer_cls_and_kwargs", "preprocess_logits_for_metrics")
TRAINING_ARGS_POSITIONS = ("output_dir", "per_device_train_batch_size", "num_train_epochs", "max_steps",
                           "learning_rate", "lr_scheduler_type", "lr_scheduler_kwargs", "warmup_steps", "optim",
                           "optim_args", "weight_decay", "adam_beta1", "adam_beta2")


class BatchSamplers(str, Enum):
    """How examples are grouped into batches. ``BATCH_SAMPLER``: a seeded random order (the one
    sentence-transformers and transformers draw for the same seed); ``NO_DUPLICATES``: the same shuffle, each
    batch filled greedily with rows that share no text with it (sentence-transformers' NoDuplicatesBatchSampler,
    same batches), so no in-batch negative is a copy of a positive. ``NO_DUPLICATES_HASHED`` is NO_DUPLICATES
    (bertkit compares the texts themselves). ``GROUP_BY_LABEL``: sentence-transformers' GroupByLabelBatchSampler,
    same batches: each label's rows shuffled, then two rows of each label in turn, so every batch holds several
    labels with two rows or more each (the batch triplet losses mine their triplets in it; the batch size is even
    and at least 4)."""

    BATCH_SAMPLER = "batch_sampler"
    NO_DUPLICATES = "no_duplicates"
    NO_DUPLICATES_HASHED = "no_duplicates_hashed"
    GROUP_BY_LABEL = "group_by_label"


class MultiDatasetBatchSamplers(str, Enum):
    """Which dataset each batch comes from when ``train_dataset`` is a dict of datasets (every batch holds the rows
    of one, batched by ``batch_sampler``, and trains on its loss). ``PROPORTIONAL``: every batch of every dataset
    once an epoch, in a seeded random order (a dataset twice as large gives twice the batches); ``ROUND_ROBIN``: a
    batch of each dataset in turn, until the one with the fewest batches has given them all (the others' later
    batches are left out). sentence-transformers' ProportionalBatchSampler and RoundRobinBatchSampler: the same
    batches, in the same order, for the same seed."""

    ROUND_ROBIN = "round_robin"
    PROPORTIONAL = "proportional"


def _mapping(name: str, value: Any) -> dict:
    """A mapping field: a dict, or its JSON text (as sentence-transformers reads one from a command line)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            pass
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise BertkitError(f"{name} must be a dict (or its JSON text) keyed by strings, got {value!r}")
    return dict(value)


def _router_mapping(value: Any) -> dict[str, str] | dict[str, dict[str, str]]:
    mapping = _mapping("router_mapping", value)
    flat = all(isinstance(v, str) for v in mapping.values())
    nested = all(isinstance(v, dict) and all(isinstance(k, str) and isinstance(r, str) for k, r in v.items())
                 for v in mapping.values())
    if not (flat or nested):
        raise BertkitError(f"router_mapping must map each text column to a route name, e.g. {{'query': 'query', "
                           f"'positive': 'document'}}, or each dataset's name to such a dict, got {mapping!r}")
    return mapping


def for_dataset(setting: Any, field: str, name: str | None, what: str) -> Any:
    """``prompts`` or ``router_mapping`` for the dataset ``name`` (None: a dataset of its own) as
    sentence-transformers' collator resolves them: a dict holding the name gives its value; a dict of dicts (by
    dataset) without it, nothing; anything else applies to every dataset as it is (a prompt, {column: ...}). A dict
    of dicts for a dataset of its own is refused (sentence-transformers refuses it at the first batch)."""
    if not isinstance(setting, dict) or not setting:
        return setting
    if name is not None and name in setting and (field == "prompts" or isinstance(setting[name], dict)):
        return setting[name]
    if isinstance(next(iter(setting.values())), dict):
        if name is None:
            raise BertkitError(f"{field} maps dataset names ({sorted(setting)}) to {{column: ...}}, and {what} is one "
                               f"dataset: give a dict of datasets by those names, or {field} by column")
        return {}
    return setting


def _learning_rate_mapping(value: Any) -> dict[str, float]:
    mapping = _mapping("learning_rate_mapping", value)
    for pattern, rate in mapping.items():
        try:
            re.compile(pattern)
        except re.error as e:
            raise BertkitError(f"learning_rate_mapping: {pattern!r} is not a regular expression ({e})") from None
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 <= rate < math.inf:
            raise BertkitError(f"learning_rate_mapping: the learning rate of {pattern!r} must be a finite number >= 0, "
                               f"got {rate!r}")
    return {pattern: float(rate) for pattern, rate in mapping.items()}


class SentenceTransformerTrainingArguments(TrainingArguments):
    """bertkit's ``TrainingArguments`` with ``batch_sampler``, ``multi_dataset_batch_sampler``, ``prompts`` (a string for every column, or
    ``{column: prompt}``), ``router_mapping`` and ``learning_rate_mapping`` (checked here: a regular expression and
    a finite rate >= 0 each; matched against the loss's parameter names when the trainer is made), as
    sentence-transformers names them."""

    @keyword_only(TRAINING_ARGS_POSITIONS, "sentence-transformers")
    def __init__(self, output_dir: str | Path | None = None, *,
                 batch_sampler: BatchSamplers | str = BatchSamplers.BATCH_SAMPLER,
                 prompts: str | dict[str, str] | None = None, router_mapping: dict[str, str] | str | None = None,
                 learning_rate_mapping: dict[str, float] | str | None = None,
                 multi_dataset_batch_sampler: MultiDatasetBatchSamplers | str = MultiDatasetBatchSamplers.PROPORTIONAL,
                 **kwargs: Any):
        activation_checkpointing = kwargs.pop("activation_checkpointing", None)
        if activation_checkpointing is not None:  # sentence-transformers 6.3's name, which wins over the older one
            kwargs["gradient_checkpointing"] = activation_checkpointing
        if kwargs.get("label_smoothing_factor", 0.0) != 0.0:
            raise BertkitError(f"label_smoothing_factor {kwargs['label_smoothing_factor']!r}: sentence-transformers' "
                               "trainers never apply it (their compute_loss calls the loss), so it would change "
                               "nothing: drop it (a cross-encoder's CrossEntropyLoss(model, label_smoothing=...) "
                               "smooths its labels)")
        multi = getattr(multi_dataset_batch_sampler, "value", multi_dataset_batch_sampler)
        if not isinstance(multi, str) or multi not in {s.value for s in MultiDatasetBatchSamplers}:
            raise BertkitError(f"multi_dataset_batch_sampler {multi_dataset_batch_sampler!r} is not implemented: give "
                               f"one of {[s.value for s in MultiDatasetBatchSamplers]} (a custom sampler class or "
                               "function is not supported)")
        sampler = getattr(batch_sampler, "value", batch_sampler)
        if not isinstance(sampler, str) or sampler not in {s.value for s in BatchSamplers}:
            raise BertkitError(f"batch_sampler {batch_sampler!r} is not implemented: give one of "
                               f"{[s.value for s in BatchSamplers]} (a custom sampler class or function is not "
                               "supported)")
        if kwargs.get("dataloader_drop_last") and sampler in (BatchSamplers.NO_DUPLICATES.value,
                                                              BatchSamplers.NO_DUPLICATES_HASHED.value):
            raise BertkitError(f"dataloader_drop_last=True with batch_sampler {sampler!r} is not implemented "
                               "(sentence-transformers' no-duplicates sampler resamples rows to fill its count of "
                               "batches): set dataloader_drop_last=False, or another batch_sampler")
        if sampler == BatchSamplers.NO_DUPLICATES_HASHED.value:
            sampler = BatchSamplers.NO_DUPLICATES.value
        if isinstance(prompts, str):  # a dict's JSON text (a command line's) is the dict, as sentence-transformers reads it
            try:
                prompts = json.loads(prompts)
            except json.JSONDecodeError:
                pass  # a prompt
        if prompts is not None and not (isinstance(prompts, str) or (isinstance(prompts, dict) and all(
                isinstance(k, str) and (isinstance(v, str) or (isinstance(v, dict) and all(
                    isinstance(c, str) and isinstance(p, str) for c, p in v.items()))) for k, v in prompts.items()))):
            raise BertkitError(f"prompts must be a string, {{column: prompt}}, {{dataset: prompt}} or {{dataset: "
                               f"{{column: prompt}}}}, got {prompts!r}")
        self.batch_sampler = BatchSamplers(sampler)
        self.multi_dataset_batch_sampler = MultiDatasetBatchSamplers(multi)
        self.prompts = prompts
        self.router_mapping = _router_mapping(router_mapping)
        self.learning_rate_mapping = _learning_rate_mapping(learning_rate_mapping)
        super().__init__(output_dir, **kwargs)

    @property
    def activation_checkpointing(self) -> bool:
        """Whether each encoder layer is recomputed in the backward pass: ``gradient_checkpointing`` under
        sentence-transformers 6.3's (and transformers') newer name, which the constructor takes too."""
        return bool(self.gradient_checkpointing)

    def to_dict(self) -> dict[str, Any]:
        return {**super().to_dict(), "batch_sampler": self.batch_sampler.value, "prompts": self.prompts,
                "router_mapping": self.router_mapping, "learning_rate_mapping": self.learning_rate_mapping,
                "multi_dataset_batch_sampler": self.multi_dataset_batch_sampler.value}
