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

from collections.abc import Callable
from typing import Any

from torch import Tensor

from bertkit.errors import BertkitError
from bertkit.sentence.cross_encoder.data import CrossEncoderExamples, collate, columns_of
from bertkit.sentence.cross_encoder.losses import BinaryCrossEntropyLoss, CrossEncoderLoss, CrossEntropyLoss
from bertkit.sentence.cross_encoder.model import CrossEncoder
from bertkit.sentence.cross_encoder.training_args import CrossEncoderTrainingArguments
from bertkit.sentence.loss_model import DatasetLosses, LossOutput
from bertkit.sentence.trainer import SentenceTransformerTrainer


class CrossEncoderLossModel(DatasetLosses):
    """``DatasetLosses`` on a collated batch of pairs (``data.collate``)."""

    def forward(self, input_ids: list[list[list[int]]], label: Tensor, dataset_name: str | None = None,
                has_targets: bool = True) -> LossOutput:
        loss = self.loss_of(dataset_name)
        inputs, labels = columns_of(input_ids, label, loss.listwise)
        # the labels whenever the dataset has a label column, as sentence-transformers passes them (SentenceLossModel)
        return LossOutput(loss(inputs, labels if has_targets else None))


class CrossEncoderTrainer(SentenceTransformerTrainer):
    """Train a ``CrossEncoder`` with a cross-encoder loss on a dataset whose columns are the loss's inputs in
    order; see the module docstring. Without ``loss``, sentence-transformers' default: BinaryCrossEntropyLoss for one
    label, CrossEntropyLoss for several."""

    model_class = CrossEncoder
    training_args_class = CrossEncoderTrainingArguments
    examples_class = CrossEncoderExamples
    loss_class = CrossEncoderLoss

    def _collator(self, model: CrossEncoder) -> Callable[[list[dict[str, Any]]], dict[str, Any]]:
        return collate

    def _trained_module(self, model: CrossEncoder) -> CrossEncoderLossModel:
        return CrossEncoderLossModel(self.loss)

    def _dataset_examples(self, dataset: Any, args: CrossEncoderTrainingArguments, what: str,
                          name: str | None) -> CrossEncoderExamples:
        return CrossEncoderExamples(dataset, self.model, self._loss_of(name, what), what, name)

    def get_default_loss(self, model: CrossEncoder) -> CrossEncoderLoss:  # sentence-transformers' defaults
        return BinaryCrossEntropyLoss(model) if model.num_labels == 1 else CrossEntropyLoss(model)

    @staticmethod
    def _refuse_loss(loss: Any, kind: str) -> None:
        raise BertkitError(f"loss must be a bertkit.sentence.cross_encoder.losses loss, got {kind}; change the import "
                           "to `from bertkit.sentence.cross_encoder import losses`")
