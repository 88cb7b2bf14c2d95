"""``SentenceTransformerTrainingArguments``: bertkit's ``TrainingArguments`` (transformers' fields bertkit
implements) plus sentence-transformers' own: ``batch_sampler`` (``BatchSamplers``) and ``prompts``. Its other
fields (multi-dataset sampling, router and learning-rate mappings) are refused by name with what to do instead."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Any, ClassVar

from bertkit.errors import BertkitError
from bertkit.training.trainer_args import TrainingArguments


class BatchSamplers(str, Enum):
    """How examples are grouped into batches. ``BATCH_SAMPLER``: a seeded random order (the one
    sentence-transformers and transformers draw for the same seed); ``NO_DUPLICATES``: the same shuffle, each
    batch filled greedily with rows that share no text with it (sentence-transformers' NoDuplicatesBatchSampler,
    same batches), so no in-batch negative is a copy of a positive. ``NO_DUPLICATES_HASHED`` is NO_DUPLICATES
    (bertkit compares the texts themselves). ``GROUP_BY_LABEL`` is not implemented."""

    BATCH_SAMPLER = "batch_sampler"
    NO_DUPLICATES = "no_duplicates"
    NO_DUPLICATES_HASHED = "no_duplicates_hashed"
    GROUP_BY_LABEL = "group_by_label"


class MultiDatasetBatchSamplers(str, Enum):
    ROUND_ROBIN = "round_robin"
    PROPORTIONAL = "proportional"


_REFUSED = {
    "router_mapping": ({}, "bertkit.sentence models have no Router module; drop this argument"),
    "learning_rate_mapping": ({}, "one learning rate for the whole model: use learning_rate"),
    "multi_dataset_batch_sampler": ("proportional", "bertkit.sentence trains on one dataset: concatenate them "
                                                    "(datasets.concatenate_datasets) and drop this argument"),
}


class SentenceTransformerTrainingArguments(TrainingArguments):
    """bertkit's ``TrainingArguments`` with ``batch_sampler`` and ``prompts`` (a string for every column, or
    ``{column: prompt}``), as sentence-transformers names them."""

    refused_fields: ClassVar[dict[str, tuple[Any, str]]] = _REFUSED  # sentence-transformers' fields: (default, advice)

    def __init__(self, output_dir: str | Path | None = None, *,
                 batch_sampler: BatchSamplers | str = BatchSamplers.BATCH_SAMPLER,
                 prompts: str | dict[str, str] | None = None, **kwargs: Any):
        for name, (default, advice) in self.refused_fields.items():
            if name in kwargs:
                value = kwargs.pop(name)
                if getattr(value, "value", value) not in (default, None):
                    raise BertkitError(f"{type(self).__name__}: {name}={value!r} is not implemented in bertkit: "
                                       f"{advice}")
        sampler = getattr(batch_sampler, "value", batch_sampler)
        if not isinstance(sampler, str) or sampler not in {s.value for s in BatchSamplers}:
            raise BertkitError(f"batch_sampler {batch_sampler!r} is not implemented: give one of "
                               f"{[s.value for s in BatchSamplers if s is not BatchSamplers.GROUP_BY_LABEL]} "
                               "(a custom sampler class or function is not supported)")
        if sampler == BatchSamplers.GROUP_BY_LABEL.value:
            raise BertkitError("batch_sampler 'group_by_label' is not implemented (it serves the batch triplet "
                               "losses, which bertkit.sentence does not have); use 'batch_sampler' or 'no_duplicates'")
        if sampler == BatchSamplers.NO_DUPLICATES_HASHED.value:
            sampler = BatchSamplers.NO_DUPLICATES.value
        if prompts is not None and not (isinstance(prompts, str) or (
                isinstance(prompts, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in prompts.items()))):
            raise BertkitError(f"prompts must be a string or {{column: prompt}}, got {prompts!r} (prompts per dataset "
                               "are not implemented: bertkit.sentence trains on one dataset)")
        self.batch_sampler = BatchSamplers(sampler)
        self.prompts = prompts
        super().__init__(output_dir, **kwargs)

    def to_dict(self) -> dict[str, Any]:
        return {**super().to_dict(), "batch_sampler": self.batch_sampler.value, "prompts": self.prompts}
