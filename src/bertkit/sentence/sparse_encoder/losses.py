"""sentence-transformers 6's sparse losses (``sentence_transformers.sparse_encoder.losses``), same names, arguments
and numbers, on a ``SparseEncoder``:

    loss = losses.SpladeLoss(model, loss=losses.SparseMultipleNegativesRankingLoss(model),
                             document_regularizer_weight=3e-5, query_regularizer_weight=5e-5)

``SpladeLoss`` is what trains: it embeds the columns once, computes the wrapped loss on those (B, V) embeddings
and adds the FLOPS regularisers (Paria et al., 2020, arXiv:2004.05665: the squared L2 norm of the batch's mean
embedding, which pushes rarely-useful word pieces to 0) on the documents and the queries, each times its weight
(SPLADE v2, arXiv:2109.10086, section 2). It returns the three terms by name, as sentence-transformers' does; the
trainer sums them and logs each. The wrapped losses are bertkit.sentence's dense ones with the sparse defaults
(dot product, scale 1; cosine for the scored pairs): one implementation. As in sentence-transformers, they and
``FlopsLoss`` train only inside ``SpladeLoss`` and are refused alone; ``SparseMSELoss`` (a teacher's embeddings)
trains alone too. ``CachedSpladeLoss`` is SpladeLoss through GradCache (bertkit.sentence.losses.cached, the one
implementation): the batch's columns are embedded ``mini_batch_size`` rows at a time, the same terms and gradients.
The CSR losses are refused by name with what to use (``_REFUSED``).
"""

from __future__ import annotations

import logging
import math
import numbers
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from bertkit.errors import BertkitError, refusing_getattr
from bertkit.sentence.losses.base import SentenceLoss, embed_columns
from bertkit.sentence.losses.cached import (
    CachedMultipleNegativesRankingLoss,
    check_mini_batch,
    embedded_in_mini_batches,
)
from bertkit.sentence.losses.distill import DistillKLDivLoss, MarginMSELoss, MSELoss
from bertkit.sentence.losses.gist import GISTEmbedLoss
from bertkit.sentence.losses.matryoshka import MatryoshkaLoss
from bertkit.sentence.losses.multiple_negatives import MultipleNegativesRankingLoss
from bertkit.sentence.losses.pairs import CoSENTLoss, CosineSimilarityLoss, TripletDistanceMetric, TripletLoss
from bertkit.sentence.util import dot_score, pairwise_angle_sim, pairwise_cos_sim, pairwise_dot_score

logger = logging.getLogger("bertkit")

__all__ = ["SpladeLoss", "CachedSpladeLoss", "FlopsLoss", "SparseMultipleNegativesRankingLoss", "SparseMarginMSELoss",
           "SparseDistillKLDivLoss", "SparseCoSENTLoss", "SparseAnglELoss", "SparseCosineSimilarityLoss",
           "SparseTripletLoss", "SparseMSELoss"]

_CSR = ("CSR models (a dense encoder + SparseAutoEncoder) are not implemented in bertkit's SparseEncoder; train a "
        "SPLADE model (a masked-LM checkpoint) with SpladeLoss or CachedSpladeLoss")
_REFUSED = {"CSRLoss": _CSR, "CSRReconstructionLoss": _CSR}


__getattr__ = refusing_getattr(__name__, _REFUSED)


def _inside_splade(name: str) -> BertkitError:
    return BertkitError(f"{name} trains inside SpladeLoss, as in sentence-transformers: losses.SpladeLoss(model, "
                        f"loss=losses.{name}(model), document_regularizer_weight=3e-5, query_regularizer_weight=5e-5)")


def _flops_alone() -> BertkitError:
    return BertkitError(
        "FlopsLoss is a regulariser, not a loss of its own (as in sentence-transformers): SpladeLoss applies it to the "
        "documents and queries (document_regularizer_weight, query_regularizer_weight)")


def _check_weight(name: str, value: Any, optional: bool) -> float | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 <= value < math.inf:
        raise BertkitError(f"SpladeLoss: {name} must be a finite number >= 0{' or None' if optional else ''}, got "
                           f"{value!r} (SPLADE's are small: 3e-5 for documents, 5e-5 for queries)")
    return float(value)


class _InsideSplade:
    """A loss that trains only inside SpladeLoss (sentence-transformers raises at its first step alone)."""

    def forward(self, sentence_features: Sequence[dict[str, Any]], labels: Tensor | None) -> Tensor:
        raise _inside_splade(type(self).__name__)


class FlopsLoss(nn.Module):
    """The FLOPS regulariser: sum over the vocabulary of the squared mean weight over the batch's rows. With
    ``threshold``, rows with at most that many active dimensions count as zeros (arXiv:2504.14839's l0 mask).
    A regulariser inside SpladeLoss, refused as a loss of its own (as in sentence-transformers)."""

    def __init__(self, model: nn.Module, threshold: float | None = None):
        super().__init__()
        if threshold is not None and (isinstance(threshold, bool) or not isinstance(threshold, numbers.Real)
                                      or not 0 <= threshold < math.inf):
            raise BertkitError(f"FlopsLoss: threshold must be a finite number of active dimensions >= 0 or None, got "
                               f"{threshold!r}")
        self.model, self.threshold = model, threshold

    def forward(self, sentence_features: Sequence[dict[str, Any]], labels: Tensor | None) -> Tensor:
        raise _flops_alone()

    def compute_loss_from_embeddings(self, embeddings: Tensor) -> Tensor:
        if self.threshold is not None:
            kept = ((embeddings != 0).sum(dim=1) > self.threshold).to(embeddings.dtype)  # (N,)
            embeddings = embeddings * kept.unsqueeze(1)
        return torch.sum(torch.mean(embeddings, dim=0) ** 2)


class SparseMultipleNegativesRankingLoss(_InsideSplade, MultipleNegativesRankingLoss):
    """MultipleNegativesRankingLoss with the sparse defaults: dot product, scale 1. Inside SpladeLoss."""

    def __init__(self, model: nn.Module, scale: float = 1.0, similarity_fct: Callable[[Tensor, Tensor], Tensor] = dot_score,
                 gather_across_devices: bool = False, directions: tuple[str, ...] = ("query_to_doc",),
                 partition_mode: str = "joint", hardness_mode: str | None = None, hardness_strength: float = 0.0):
        super().__init__(model, scale, similarity_fct, gather_across_devices, directions, partition_mode,
                         hardness_mode, hardness_strength)


class SparseMarginMSELoss(_InsideSplade, MarginMSELoss):
    """MarginMSELoss (a teacher's margins) with the dot product. Inside SpladeLoss."""

    def __init__(self, model: nn.Module, similarity_fct: Callable[[Tensor, Tensor], Tensor] = pairwise_dot_score):
        super().__init__(model, similarity_fct)


class SparseDistillKLDivLoss(_InsideSplade, DistillKLDivLoss):
    """DistillKLDivLoss (a teacher's scores over the candidates) with the dot product and temperature 2. Inside
    SpladeLoss."""

    def __init__(self, model: nn.Module, similarity_fct: Callable[[Tensor, Tensor], Tensor] = pairwise_dot_score,
                 temperature: float = 2.0, student_temperature: float | None = None,
                 teacher_temperature: float | None = None):
        super().__init__(model, similarity_fct, temperature, student_temperature, teacher_temperature)


class SparseCoSENTLoss(_InsideSplade, CoSENTLoss):
    """CoSENTLoss on scored pairs, cosine similarity; sets the model's similarity_fn_name to "cosine" (as
    sentence-transformers does). Inside SpladeLoss."""

    def __init__(self, model: nn.Module, scale: float = 20.0,
                 similarity_fct: Callable[[Tensor, Tensor], Tensor] = pairwise_cos_sim):
        super().__init__(model, scale, similarity_fct)  # checked before the model is changed
        model.similarity_fn_name = "cosine"


class SparseAnglELoss(SparseCoSENTLoss):
    """CoSENTLoss on the AnglE similarity (``pairwise_angle_sim``), on scored pairs; sets the model's
    similarity_fn_name to "cosine" (as sentence-transformers does). Inside SpladeLoss."""

    def __init__(self, model: nn.Module, scale: float = 20.0):
        super().__init__(model, scale, similarity_fct=pairwise_angle_sim)


class SparseCosineSimilarityLoss(_InsideSplade, CosineSimilarityLoss):
    """CosineSimilarityLoss: ``loss_fct`` (MSE) between each pair's cosine similarity (after
    ``cos_score_transformation``) and its score; sets the model's similarity_fn_name to "cosine" (as
    sentence-transformers does). Inside SpladeLoss."""

    def __init__(self, model: nn.Module, loss_fct: nn.Module | None = None,
                 cos_score_transformation: nn.Module | None = None):
        super().__init__(model, loss_fct, cos_score_transformation)
        model.similarity_fn_name = "cosine"


class SparseTripletLoss(_InsideSplade, TripletLoss):
    """TripletLoss on (anchor, positive, negative): max(0, d(a, p) - d(a, n) + margin), Euclidean, margin 5.
    Inside SpladeLoss."""

    def __init__(self, model: nn.Module, distance_metric: Callable[[Tensor, Tensor], Tensor] =
                 TripletDistanceMetric.EUCLIDEAN, triplet_margin: float = 5):
        super().__init__(model, distance_metric, triplet_margin)


class SparseMSELoss(MSELoss):
    """MSELoss: the mean squared error between each column's sparse embedding and the teacher's (the label, (B, V)
    or (B, C, V)). Trains alone, as in sentence-transformers, or inside SpladeLoss."""

    def __init__(self, model: nn.Module):
        super().__init__(model)


def check_trainable(loss: Any) -> None:
    """Refuses, as sentence-transformers does at the first step, a sparse loss or FlopsLoss given without SpladeLoss."""
    if isinstance(loss, FlopsLoss):
        raise _flops_alone()
    if isinstance(loss, _InsideSplade):
        raise _inside_splade(type(loss).__name__)


class SpladeLoss(SentenceLoss):
    """``loss`` on the columns' sparse embeddings, plus ``document_regularizer_weight`` x FLOPS of the documents
    (every column after the first) and ``query_regularizer_weight`` x FLOPS of the queries (the first column; none
    when None). ``use_document_regularizer_only``: every column is a document (symmetric data), the query weight
    is dropped. ``*_regularizer_threshold``: the default FlopsLoss's threshold; ``*_regularizer``: another
    regulariser (a module with ``compute_loss_from_embeddings(embeddings)``). A weight that is negative, NaN or
    infinite is refused before any work. The trainer raises both weights from 0 over the first third of the
    steps (``callbacks.SpladeRegularizerWeightSchedulerCallback``), as sentence-transformers' does."""

    def __init__(self, model: nn.Module, loss: SentenceLoss, document_regularizer_weight: float,
                 query_regularizer_weight: float | None = None, document_regularizer: nn.Module | None = None,
                 query_regularizer: nn.Module | None = None, document_regularizer_threshold: int | None = None,
                 query_regularizer_threshold: int | None = None, use_document_regularizer_only: bool = False):
        super().__init__(model)
        document_regularizer_weight = _check_weight("document_regularizer_weight", document_regularizer_weight, False)
        query_regularizer_weight = _check_weight("query_regularizer_weight", query_regularizer_weight, True)
        self._check_loss(loss)
        for name, regularizer in (("document_regularizer", document_regularizer),
                                  ("query_regularizer", query_regularizer)):
            if regularizer is not None and not callable(getattr(regularizer, "compute_loss_from_embeddings", None)):
                raise BertkitError(f"SpladeLoss: {name} must have compute_loss_from_embeddings(embeddings), as "
                                   f"FlopsLoss has; got {type(regularizer).__name__}")
        self.loss = loss
        self.columns, self.needs_label, self.in_batch_negatives = loss.columns, loss.needs_label, loss.in_batch_negatives
        self.use_document_regularizer_only = bool(use_document_regularizer_only)
        self.document_regularizer = document_regularizer if document_regularizer is not None \
            else FlopsLoss(model, threshold=document_regularizer_threshold)
        self.query_regularizer = query_regularizer if query_regularizer is not None \
            else None if self.use_document_regularizer_only else FlopsLoss(model, threshold=query_regularizer_threshold)
        if query_regularizer_weight is None and not self.use_document_regularizer_only:
            logger.warning("SpladeLoss: query_regularizer_weight is None, so the queries are not regularised (right "
                           "for an inference-free model; otherwise give a weight > 0)")
        if self.use_document_regularizer_only and query_regularizer_weight is not None:
            logger.warning("SpladeLoss: use_document_regularizer_only=True treats every column as a document; "
                           "query_regularizer_weight=%s is ignored", query_regularizer_weight)
            query_regularizer_weight = None
        self.document_regularizer_weight = document_regularizer_weight
        self.query_regularizer_weight = query_regularizer_weight

    @staticmethod
    def _check_loss(loss: Any) -> None:
        if isinstance(loss, (SpladeLoss, FlopsLoss)):
            raise BertkitError(f"SpladeLoss(loss={type(loss).__name__}): give the main loss (e.g. "
                               "SparseMultipleNegativesRankingLoss); SpladeLoss adds the FLOPS regularisers itself")
        if isinstance(loss, (GISTEmbedLoss, CachedMultipleNegativesRankingLoss, MatryoshkaLoss)):
            raise BertkitError(f"SpladeLoss(loss={type(loss).__name__}) is not implemented in bertkit: wrap one "
                               "of the sparse losses (SparseMultipleNegativesRankingLoss, SparseMarginMSELoss, ...); "
                               "for a large batch in little memory, CachedSpladeLoss")
        if not isinstance(loss, SentenceLoss):
            raise BertkitError(f"SpladeLoss wraps a bertkit loss, got {type(loss).__module__}.{type(loss).__name__}; "
                               "change the import to `from bertkit.sentence.sparse_encoder import losses`")

    def forward(self, sentence_features: Sequence[dict[str, Any]], labels: Tensor | None) -> dict[str, Tensor]:
        """{"base_loss", "document_regularizer_loss" and, with a query weight, "query_regularizer_loss"}: the terms
        the trainer sums (sentence-transformers' names)."""
        return self.terms(embed_columns(self.model, sentence_features), sentence_features, labels)

    def terms(self, embeddings: list[Tensor], sentence_features: Sequence[dict[str, Any]],
              labels: Tensor | None) -> dict[str, Tensor]:
        """The terms of ``forward`` from the columns' C x (B, V) embeddings."""
        losses = {"base_loss": self.loss.loss_on_batch(embeddings, sentence_features, labels)}
        documents = embeddings if self.use_document_regularizer_only else embeddings[1:]
        if not documents:  # sentence-transformers fails inside torch.cat
            raise BertkitError("SpladeLoss: a batch of one text column has no documents to regularise (the first "
                               "column is the query); give use_document_regularizer_only=True to regularise it as "
                               "documents")
        losses["document_regularizer_loss"] = \
            self.document_regularizer.compute_loss_from_embeddings(torch.cat(documents)) * self.document_regularizer_weight
        if self.query_regularizer_weight is not None:
            losses["query_regularizer_loss"] = \
                self.query_regularizer.compute_loss_from_embeddings(embeddings[0]) * self.query_regularizer_weight
        return losses


class CachedSpladeLoss(SpladeLoss):
    """SpladeLoss through GradCache (Gao et al., 2021): each column embedded ``mini_batch_size`` rows at a time,
    the terms computed on the whole batch's embeddings, the gradients of the parameters those of SpladeLoss on the
    same batch, in the memory of a mini-batch (bertkit.sentence.losses.cached). Same terms by name; the first one
    carries the gradient of their sum."""

    def __init__(self, model: nn.Module, loss: SentenceLoss, document_regularizer_weight: float,
                 query_regularizer_weight: float | None = None, document_regularizer: nn.Module | None = None,
                 query_regularizer: nn.Module | None = None, document_regularizer_threshold: int | None = None,
                 query_regularizer_threshold: int | None = None, use_document_regularizer_only: bool = False,
                 mini_batch_size: int = 32, mini_batch_num_tokens: int | None = None, show_progress_bar: bool = False):
        mini_batch_size = check_mini_batch(type(self).__name__, mini_batch_size, mini_batch_num_tokens)
        super().__init__(model, loss, document_regularizer_weight, query_regularizer_weight, document_regularizer,
                         query_regularizer, document_regularizer_threshold, query_regularizer_threshold,
                         use_document_regularizer_only)
        self.mini_batch_size, self.mini_batch_num_tokens = mini_batch_size, mini_batch_num_tokens
        self.show_progress_bar = show_progress_bar

    def forward(self, sentence_features: Sequence[dict[str, Any]], labels: Tensor | None) -> dict[str, Tensor]:
        terms: dict[str, Tensor] = {}

        def total(embeddings: list[Tensor]) -> Tensor:
            terms.update(self.terms(embeddings, sentence_features, labels))
            return sum(terms.values())

        loss = embedded_in_mini_batches(self.model, sentence_features, self.mini_batch_size, total)
        if not torch.is_grad_enabled():
            return terms
        # GradCache's node is what carries the gradient: the first term takes it, at its own value (loss - loss is
        # 0 with gradient 1), so the trainer's sum has the gradient of the total and each logged term its value
        values = {name: value.detach() for name, value in terms.items()}
        first = next(iter(values))
        values[first] = values[first] + (loss - loss.detach())
        return values
