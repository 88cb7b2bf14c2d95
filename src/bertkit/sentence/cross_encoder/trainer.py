"""``CrossEncoderTrainer``: sentence-transformers' cross-encoder trainer on bertkit's ``Trainer`` and its loop.

    model = CrossEncoder("models/minilm", num_labels=1)
    loss = losses.BinaryCrossEntropyLoss(model)
    args = CrossEncoderTrainingArguments(output_dir="out", per_device_train_batch_size=32)
    CrossEncoderTrainer(model=model, args=args, train_dataset=pairs, loss=loss, evaluator=reranking).train()

As ``SentenceTransformerTrainer`` (whose data order, no-duplicates sampler, multi-dataset training, evaluation and
saving it shares), the
loss is what the loop trains: a module taking one collated batch of the dataset's texts and returning the
loss, so optimisation, schedules, accumulation, bf16, checkpoints (each a CrossEncoder directory) and exact
resume are the loop's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from torch import Tensor, nn

from bertkit.errors import BertkitError
from bertkit.sentence.cross_encoder.data import CrossEncoderExamples, collate, columns_of
from bertkit.sentence.cross_encoder.losses import BinaryCrossEntropyLoss, CrossEncoderLoss, CrossEntropyLoss
from bertkit.sentence.cross_encoder.model import CrossEncoder
from bertkit.sentence.cross_encoder.training_args import CrossEncoderTrainingArguments
from bertkit.sentence.data import MultiDatasetExamples
from bertkit.sentence.trainer import (
    LossOutput,
    SentenceTransformerTrainer,
    as_evaluator,
    check_batch_holds_negatives,
    check_loss_names,
    check_same_parameters,
    checked_arguments,
)
from bertkit.training.trainer import Trainer


class CrossEncoderLossModel(nn.Module):
    """The loss as the training loop drives it: a collated batch in (``data.collate``), the loss out (with a loss
    per dataset, the loss of the batch's ``dataset_name``). Saving it writes the cross-encoder's directory."""

    def __init__(self, loss: CrossEncoderLoss | dict[str, CrossEncoderLoss]):
        super().__init__()
        self.loss = nn.ModuleDict(loss) if isinstance(loss, dict) else loss  # as the dense trainer's LossModel

    def forward(self, input_ids: list[list[list[int]]], label: Tensor, dataset_name: str | None = None) -> LossOutput:
        loss = self.loss[dataset_name] if isinstance(self.loss, nn.ModuleDict) else self.loss
        inputs, labels = columns_of(input_ids, label, loss.listwise)
        return LossOutput(loss(inputs, labels if loss.needs_label else None))

    def save_pretrained(self, path: str | Path) -> Path:
        loss = next(iter(self.loss.values())) if isinstance(self.loss, nn.ModuleDict) else self.loss
        return loss.model.save(path)


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
        check_loss_names(loss, train_dataset, eval_dataset)
        loss = ({name: self._loss(model, one) for name, one in loss.items()} if isinstance(loss, dict)
                else self._loss(model, loss))
        check_batch_holds_negatives(loss, args)
        check_same_parameters(loss)
        self.model, self.loss, self.evaluator = model, loss, as_evaluator(evaluator)
        train, dev = (self._examples_of(data, args, name) if data is not None else None
                      for data, name in ((train_dataset, "train_dataset"), (eval_dataset, "eval_dataset")))
        if isinstance(train, dict):  # the datasets end to end, batched by multi_dataset_batch_sampler
            train = MultiDatasetExamples(train)
        # the base Trainer's construction (SentenceTransformerTrainer's own builds bi-encoder examples and batches)
        Trainer.__init__(self, model=model, args=args, data_collator=collate, train_dataset=train,
                         eval_dataset=dev, callbacks=callbacks,
                         compute_metrics=self._evaluator_metrics if evaluator is not None else None)

    def _trained_module(self, model: CrossEncoder) -> CrossEncoderLossModel:
        return CrossEncoderLossModel(self.loss)

    def _dataset_examples(self, dataset: Any, args: CrossEncoderTrainingArguments, what: str,
                          name: str | None) -> CrossEncoderExamples:
        return CrossEncoderExamples(dataset, self.model, self._loss_of(name, what), what, name)

    def _parameter_groups(self) -> None:
        """The base Trainer's (the loop's: the model's, at one rate): learning_rate_mapping is refused here."""
        return Trainer._parameter_groups(self)

    @staticmethod
    def _loss(model: CrossEncoder, loss: Any) -> CrossEncoderLoss:
        if loss is None:  # sentence-transformers' defaults
            loss = BinaryCrossEntropyLoss(model) if model.num_labels == 1 else CrossEntropyLoss(model)
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
        if eval_dataset is not None and not isinstance(eval_dataset, CrossEncoderExamples):  # (a dict's, made already)
            eval_dataset = self._examples_of(eval_dataset, self.args, "eval_dataset")
        return Trainer.evaluate(self, eval_dataset, ignore_keys, metric_key_prefix)
