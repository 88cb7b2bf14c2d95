"""One fine-tuning run: one phase of the one training loop on featurised examples, its checkpoints removed once
what its caller keeps of it is written."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from typing import NamedTuple, TypeVar

from torch import nn

from bertkit.errors import BertkitError
from bertkit.manifests import remove_owned_tree
from bertkit.settings import FinetuneSettings, TrainingSettings
from bertkit.settings.training import micro_batch_size
from bertkit.tokenization import BertTokenizer
from bertkit.training.batch_plan import BatchPlan, steps_for_epochs, steps_per_epoch
from bertkit.training.checkpoint import STEP_LAYOUT, remove_checkpoint
from bertkit.training.distributed import current
from bertkit.training.loop import Phase, TrainResult, train
from bertkit.training.plot import plot_metrics
from bertkit.training.trainer_data import data_fingerprint

logger = logging.getLogger("bertkit")
S = TypeVar("S", bound=FinetuneSettings)


def checkpoint_tokenizer(s: S) -> tuple[BertTokenizer, S]:
    """The checkpoint's tokenizer, and ``s`` with max_seq_length lowered to its model_max_length, with a warning, as
    transformers' run_glue.py, run_qa.py and run_swag.py lower it. Trained and scored at the default 128 where the
    tokenizer says 64, a model met inputs its pipelines, ``predict`` and ``serve`` never give it (they cut at 64),
    and its report scored those. The report and the resume fingerprint hold the length used. (A length past the
    model's positions is refused, as every command refuses it.)"""
    tokenizer = BertTokenizer.from_pretrained(s.model_name_or_path)
    if s.max_seq_length <= tokenizer.model_max_length:
        return tokenizer, s
    logger.warning("--max-seq-length %d is more than the %d tokens %s's tokenizer takes (its model_max_length); "
                   "using --max-seq-length %d", s.max_seq_length, tokenizer.model_max_length, s.model_name_or_path,
                   tokenizer.model_max_length)
    return tokenizer, dataclasses.replace(s, max_seq_length=tokenizer.model_max_length)


class Fit(NamedTuple):
    result: TrainResult
    seconds: float  # wall time of the run
    epochs: float  # the epochs its steps made (transformers' epoch): a --max-steps run's, not num_train_epochs

    @property
    def per_epoch(self) -> list[dict]:
        """The evaluation records of the run, as metrics.jsonl holds them (without the split)."""
        return [{k: v for k, v in r.items() if k != "split"} for r in self.result.history if r["split"] == "eval"]


def run_finetuning(model: nn.Module, features: Sequence[dict], collate: Callable[[list], dict],
                   s: TrainingSettings, evaluate: Callable[[nn.Module], dict[str, float]] | None,
                   fingerprint: dict, resume: bool = False) -> Fit:
    """One fine-tuning run on featurised examples (``s.batch_size`` is the global batch). Its checkpoints stay until
    the caller has written what it keeps (the model, the report) and calls ``remove_checkpoints``; ``resume``
    continues a killed run of the same settings and data."""
    if s.batch_size is None or s.num_train_epochs is None or s.learning_rate is None:
        raise BertkitError("run_finetuning needs batch_size, num_train_epochs and learning_rate resolved, got "
                           f"{s.batch_size}, {s.num_train_epochs}, {s.learning_rate}")
    info = current()
    micro = micro_batch_size(s.batch_size, info.world_size, s.gradient_accumulation_steps)
    plan = BatchPlan(features, micro, collate, shuffle=True, seed=s.seed, rank=info.rank, world_size=info.world_size)
    steps = s.max_steps if s.max_steps > 0 else steps_for_epochs(plan, s.num_train_epochs, s.gradient_accumulation_steps)
    # The training file read again on --resume may have changed since the kill: a class renamed or added moves the
    # ids (the checkpoint's head would carry on under other label names), rows added or removed change the epochs.
    # The features (their label ids) and the label names are the run's, as the Trainer's fingerprint holds its data.
    id2label = getattr(getattr(model, "config", None), "id2label", None) or {}
    fingerprint = {**fingerprint, "train_data": data_fingerprint(features),
                   **({"labels": [id2label[i] for i in sorted(id2label)]} if id2label else {})}
    t0 = time.perf_counter()
    result = train(model, [Phase(plan, steps)], s, evaluate=evaluate, fingerprint=fingerprint, resume=resume)
    seconds = time.perf_counter() - t0
    if info.is_main:
        plot_metrics(s.output_dir / "metrics.jsonl", s.output_dir / "metrics.png")
    return Fit(result, seconds, result.step / steps_per_epoch(plan, s.gradient_accumulation_steps))


def remove_checkpoints(s: TrainingSettings) -> None:
    """A finished run's checkpoints (only files recorded as bertkit's; others are named), the curves kept. Called once
    what the caller keeps of the run is written: a kill before then (scoring dev, saving the model) leaves the final
    checkpoint, from which --resume finishes the run without training it again."""
    if current().is_main:
        for path in STEP_LAYOUT.dirs(s.output_dir):  # each state.pt first: a kill leaves removals it can tell apart
            remove_checkpoint(path)
        remove_owned_tree(s.output_dir / "checkpoints")
