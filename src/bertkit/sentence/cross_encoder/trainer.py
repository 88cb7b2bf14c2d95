"""``CrossEncoderTrainer``: sentence-transformers' cross-encoder trainer on bertkit's ``Trainer`` and its loop.

    model = CrossEncoder("models/minilm", num_labels=1)
    loss = losses.BinaryCrossEntropyLoss(model)
    args = CrossEncoderTrainingArguments(output_dir="out", per_device_train_batch_size=32)
    CrossEncoderTrainer(model=model, args=args, train_dataset=pairs, loss=loss, evaluator=reranking).train()

As ``SentenceTransformerTrainer`` (whose data order, no-duplicates sampler, evaluation and saving it shares), the
loss is what the loop trains: a module taking one collated batch of the dataset's texts and returning the
loss, so optimisation, schedules, accumulation, bf16, checkpoints (each a CrossEncoder directory) and exact
resume are the loop's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from torch import Tensor, nn

from bertkit.errors import BertkitError
from bertkit.sentence.cross_encoder.data import CrossEncoderExamples, collate, columns_of
from bertkit.sentence.cross_encoder.losses import BinaryCrossEntropyLoss, CrossEncoderLoss, CrossEntropyLoss
from bertkit.sentence.cross_encoder.model import CrossEncoder
from bertkit.sentence.cross_encoder.training_args import CrossEncoderTrainingArguments
from bertkit.sentence.trainer import (
    LossOutput,
    SentenceTransformerTrainer,
    as_evaluator,
    check_batch_holds_negatives,
    checked_arguments,
    without_epoch,
)
from bertkit.training.trainer import Trainer


class CrossEncoderLossModel(nn.Module):
    """The loss as the training loop drives it: a collated batch in (``data.collate``), the loss out. Saving it
    writes the cross-encoder's directory."""

    def __init__(self, loss: CrossEncoderLoss):
        super().__init__()
        self.loss = loss

    def forward(self, input_ids: list[list[list[int]]], label: Tensor) -> LossOutput:
        inputs, labels = columns_of(input_ids, label, self.loss.listwise)
        return LossOutput(self.loss(inputs, labels if self.loss.needs_label else None))

    def save_pretrained(self, path: str | Path) -> Path:
        return self.loss.model.save(path)


class CrossEncoderTrainer(SentenceTransformerTrainer):
    """Train a ``CrossEncoder`` with a cross-encoder loss on a dataset whose columns are the loss's inputs in
    order; see the module docstring. Without ``loss``, sentence-transformers' default: BinaryCrossEntropyLoss for one
    label, CrossEntropyLoss for several."""

    def __init__(self, model: CrossEncoder | None = None, args: CrossEncoderTrainingArguments | None = None,
                 train_dataset: Any = None, eval_dataset: Any = None,
                 loss: CrossEncoderLoss | Callable[[CrossEncoder], CrossEncoderLoss] | None = None,
                 evaluator: Any = None, callbacks: Sequence[Any] | None = None, **unknown: Any):
        args = checked_arguments(type(self).__name__, model, "bertkit.sentence.cross_encoder.CrossEncoder",
                                 CrossEncoder, args, CrossEncoderTrainingArguments, unknown)
        for what, data in (("train_dataset", train_dataset), ("eval_dataset", eval_dataset)):
            if isinstance(data, Mapping):
                raise BertkitError(f"CrossEncoderTrainer: {what} is a dict of datasets, and multi-dataset training "
                                   "is implemented for SentenceTransformerTrainer and SparseEncoderTrainer only: train "
                                   "the cross-encoder on one dataset (datasets.concatenate_datasets)")
        loss = self._loss(model, loss)
        check_batch_holds_negatives(loss, args)
        self.model, self.loss, self.evaluator = model, loss, as_evaluator(evaluator)
        train = CrossEncoderExamples(train_dataset, model, loss, "train_dataset") if train_dataset is not None else None
        dev = CrossEncoderExamples(eval_dataset, model, loss, "eval_dataset") if eval_dataset is not None else None
        # the base Trainer's construction (SentenceTransformerTrainer's own builds bi-encoder examples and batches)
        Trainer.__init__(self, model=model, args=args, data_collator=collate, train_dataset=train,
                         eval_dataset=dev, callbacks=callbacks,
                         compute_metrics=self._evaluator_metrics if evaluator is not None else None)

    def _trained_module(self, model: CrossEncoder) -> CrossEncoderLossModel:
        return CrossEncoderLossModel(self.loss)

    def _parameter_groups(self) -> None:
        """The base Trainer's (the loop's: the model's, at one rate): learning_rate_mapping is refused here."""
        return Trainer._parameter_groups(self)

    @staticmethod
    def _loss(model: CrossEncoder, loss: Any) -> CrossEncoderLoss:
        if loss is None:  # sentence-transformers' defaults
            loss = BinaryCrossEntropyLoss(model) if model.num_labels == 1 else CrossEntropyLoss(model)
        elif isinstance(loss, dict):
            raise BertkitError("CrossEncoderTrainer: a loss per dataset is not implemented (multi-dataset training is "
                               "SentenceTransformerTrainer's and SparseEncoderTrainer's): give one loss")
        elif not isinstance(loss, nn.Module) and callable(loss):
            loss = loss(model)
        if not isinstance(loss, CrossEncoderLoss):
            raise BertkitError(f"loss must be a bertkit.sentence.cross_encoder.losses loss, got {type(loss).__module__}."
                               f"{type(loss).__name__}; change the import to `from bertkit.sentence.cross_encoder "
                               "import losses`")
        if loss.model is not model:
            raise BertkitError("the loss was built with another model than the trainer's; build it with "
                               "losses.X(model) of the model passed to the trainer")
        return loss

    def evaluate(self, eval_dataset: Any = None, ignore_keys: list[str] | None = None,
                 metric_key_prefix: str = "eval") -> dict[str, float]:
        """eval_loss on the eval dataset and the evaluator's metrics, prefixed ``eval_``; with no eval dataset, the
        evaluator's metrics alone."""
        if eval_dataset is None and self.eval_dataset is None:
            return super().evaluate(None, ignore_keys, metric_key_prefix)  # the evaluator's metrics alone
        if isinstance(eval_dataset, Mapping):
            raise BertkitError("CrossEncoderTrainer.evaluate: a dict of datasets is not implemented; evaluate each")
        if eval_dataset is not None:
            eval_dataset = CrossEncoderExamples(eval_dataset, self.model, self.loss, "eval_dataset")
        return without_epoch(Trainer.evaluate(self, eval_dataset, ignore_keys, metric_key_prefix))
