r"""``SparseEncoderTrainer``: sentence-transformers' sparse trainer on ``SentenceTransformerTrainer`` and bertkit's
one training loop.

    model = SparseEncoder("models/my-mlm")               # a checkpoint with a masked-LM head: a new SPLADE model
    loss = losses.SpladeLoss(model, loss=losses.SparseMultipleNegativesRankingLoss(model),
                             document_regularizer_weight=3e-5, query_regularizer_weight=5e-5)
    args = SparseEncoderTrainingArguments(output_dir="out", batch_sampler=BatchSamplers.NO_DUPLICATES)
    SparseEncoderTrainer(model=model, args=args, train_dataset=pairs, loss=loss, evaluator=ir).train()

What differs from the dense trainer, and only that: the model is a ``SparseEncoder`` (its (B, V) embeddings are what
the losses see), the default loss is SpladeLoss over SparseMultipleNegativesRankingLoss with sentence-transformers'
weights, SpladeLoss's terms are logged beside the loss, and a SpladeLoss gets the regulariser warm-up
(``callbacks.SpladeRegularizerWeightSchedulerCallback``) unless one is given, as sentence-transformers' trainer
adds it. Checkpoints are SparseEncoder directories. An inference-free model (a Router: static query weights, SPLADE
documents) needs ``router_mapping``, each text column's route, as in sentence-transformers:

    args = SparseEncoderTrainingArguments(output_dir="out", router_mapping={"query": "query", "positive": "document"},
                                          learning_rate_mapping={r"sub_modules\.query\.": 1e-3})
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from bertkit.errors import BertkitError, keyword_only
from bertkit.sentence.data import SentenceExamples
from bertkit.sentence.losses import SentenceLoss
from bertkit.sentence.sparse_encoder.callbacks import SpladeRegularizerWeightSchedulerCallback
from bertkit.sentence.sparse_encoder.losses import (
    SparseMultipleNegativesRankingLoss,
    SpladeLoss,
    check_trainable,
)
from bertkit.sentence.sparse_encoder.model import SparseEncoder
from bertkit.sentence.sparse_encoder.modules import Router
from bertkit.sentence.sparse_encoder.training_args import SparseEncoderTrainingArguments
from bertkit.sentence.trainer import SentenceTransformerTrainer
from bertkit.sentence.training_args import TRAINER_POSITIONS

logger = logging.getLogger("bertkit")


class SparseEncoderTrainer(SentenceTransformerTrainer):
    """Train a ``SparseEncoder`` with a SpladeLoss on a dataset whose columns are its inputs in order; see the
    module docstring."""

    model_class = SparseEncoder
    training_args_class = SparseEncoderTrainingArguments

    @keyword_only(TRAINER_POSITIONS, "sentence-transformers")
    def __init__(self, model: SparseEncoder | None = None, args: SparseEncoderTrainingArguments | None = None,
                 train_dataset: Any = None, eval_dataset: Any = None,
                 loss: SentenceLoss | Callable[[SparseEncoder], SentenceLoss] | None = None,
                 evaluator: Any = None, *, callbacks: Sequence[Any] | None = None, **unknown: Any):
        super().__init__(model=model, args=args, train_dataset=train_dataset, eval_dataset=eval_dataset, loss=loss,
                         evaluator=evaluator, callbacks=callbacks, **unknown)
        for loss in self.loss.values() if isinstance(self.loss, dict) else [self.loss]:  # each of a dict's too
            if isinstance(loss, SpladeLoss):
                self._add_warmup(loss)

    def _check_router_mapping(self, model: SparseEncoder, mapping: dict[str, str]) -> None:
        """A Router model needs ``router_mapping`` (sentence-transformers refuses it without); a model without one
        takes none."""
        if not isinstance(model[0], Router):
            return super()._check_router_mapping(model, mapping)
        if not mapping:
            raise BertkitError(f"this SparseEncoder has a Router (routes {list(model[0].sub_modules)}): give "
                               "router_mapping in the training arguments, each text column's route, e.g. "
                               "{'query': 'query', 'positive': 'document', 'negative': 'document'}")

    def _dataset_examples(self, dataset: Any, args: SparseEncoderTrainingArguments, what: str,
                          name: str | None) -> SentenceExamples:
        """The dense trainer's, once each text column has a route (a column router_mapping leaves out: the
        Router's default)."""
        examples = super()._dataset_examples(dataset, args, what, name)
        router = self.model[0]
        lost = {c: t for c, t in zip(examples.texts, examples.tasks)
                if isinstance(router, Router) and router.resolve(t) is None}
        if lost:
            raise BertkitError(f"router_mapping: the Router has no route for the {what} column(s) {lost} (None: not "
                               f"mapped, and the Router has no default route); its routes are "
                               f"{list(router.sub_modules)}")
        return examples

    def get_default_loss(self, model: SparseEncoder) -> SpladeLoss:
        logger.info("no loss given: SpladeLoss over SparseMultipleNegativesRankingLoss (query_regularizer_weight 5e-5, "
                    "document_regularizer_weight 3e-5; tune them for your data)")
        return SpladeLoss(model, loss=SparseMultipleNegativesRankingLoss(model), query_regularizer_weight=5e-5,
                          document_regularizer_weight=3e-5)

    def _loss(self, model: SparseEncoder, loss: Any) -> SentenceLoss:
        check_trainable(loss)
        loss = super()._loss(model, loss)
        check_trainable(loss)  # one a factory made
        return loss

    def _add_warmup(self, loss: SpladeLoss) -> None:
        """The warm-up callback for ``loss`` first among the callbacks (so the others see this step's weights): the
        one given, or a new one (sentence-transformers' trainer adds it so, with a warning)."""
        given = next((c for c in self.callbacks
                      if isinstance(c, SpladeRegularizerWeightSchedulerCallback) and c.loss is loss), None)
        if given is None:
            logger.warning("SpladeLoss without a SpladeRegularizerWeightSchedulerCallback: adding one, which raises "
                           "the regulariser weights from 0 to their set values over the first third of the steps")
            given = SpladeRegularizerWeightSchedulerCallback(loss)
        else:
            self.callbacks.remove(given)
        self.callbacks.insert(0, given)
