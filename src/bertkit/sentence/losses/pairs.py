"""Losses on scored pairs (CoSENTLoss, AnglELoss, CosineSimilarityLoss), on labelled pairs (ContrastiveLoss,
OnlineContrastiveLoss) and on triplets (TripletLoss)."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from enum import Enum

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from bertkit.sentence.losses.base import SentenceLoss, check_labels, check_positive
from bertkit.sentence.util import (
    pairwise_angle_sim,
    pairwise_cos_sim,
    pairwise_euclidean_sim,
    pairwise_manhattan_sim,
)


class CoSENTLoss(SentenceLoss):
    """Columns (text1, text2) and a score: every pair scored higher must get the higher similarity,
    log(1 + sum over (i, j) with label_i > label_j of exp(scale * (sim_j - sim_i))) (Su, 2022)."""

    needs_label = True

    def __init__(self, model: nn.Module, scale: float = 20.0,
                 similarity_fct: Callable[[Tensor, Tensor], Tensor] = pairwise_cos_sim):
        super().__init__(model)
        check_positive(type(self).__name__, "scale", scale)
        self.scale, self.similarity_fct = scale, similarity_fct

    def compute_loss_from_embeddings(self, embeddings: list[Tensor], labels: Tensor | None) -> Tensor:
        labels = check_labels(type(self).__name__, labels, embeddings[0].shape[0])
        scores = self.similarity_fct(embeddings[0], embeddings[1]).float() * self.scale  # (B,)
        labels, order = labels.int().sort() if labels.dtype == torch.bool else labels.sort()
        scores = scores[order]
        # for each pair, the log-sum-exp of minus the scores of the pairs with a higher label (a suffix after sorting)
        higher = torch.searchsorted(labels, labels, right=True)
        suffix = torch.logcumsumexp(-scores.flip(0), dim=0).flip(0)
        suffix = torch.cat((suffix, scores.new_full((1,), -torch.inf)))
        return torch.logsumexp(torch.cat((scores.new_zeros(1), scores + suffix[higher])), dim=0)


class AnglELoss(CoSENTLoss):
    """CoSENTLoss on the AnglE similarity (``pairwise_angle_sim``; Li and Li, 2023). On (anchor, positive,
    negatives...) rows the anchor is paired with each candidate: the positive with the row's label, each negative
    with 1 - label, as sentence-transformers pairs them."""

    columns = (2, None)

    def __init__(self, model: nn.Module, scale: float = 20.0):
        super().__init__(model, scale, similarity_fct=pairwise_angle_sim)

    def compute_loss_from_embeddings(self, embeddings: list[Tensor], labels: Tensor | None) -> Tensor:
        candidates = len(embeddings) - 1
        if candidates > 1:
            anchor = embeddings[0]
            labels = check_labels(type(self).__name__, labels, anchor.shape[0])
            labels = torch.cat([labels, (1 - labels).repeat(candidates - 1)])
            embeddings = [anchor.repeat(candidates, 1), torch.cat(embeddings[1:])]
        return super().compute_loss_from_embeddings(embeddings, labels)


class CosineSimilarityLoss(SentenceLoss):
    """Columns (text1, text2) and a score: ``loss_fct`` (MSE) between the pair's cosine similarity and its score."""

    needs_label = True

    def __init__(self, model: nn.Module, loss_fct: nn.Module | None = None, cos_score_transformation: nn.Module | None = None):
        super().__init__(model)
        self.loss_fct = loss_fct if loss_fct is not None else nn.MSELoss()
        self.cos_score_transformation = cos_score_transformation if cos_score_transformation is not None else nn.Identity()

    def compute_loss_from_embeddings(self, embeddings: list[Tensor], labels: Tensor | None) -> Tensor:
        labels = check_labels(type(self).__name__, labels, embeddings[0].shape[0])
        scores = self.cos_score_transformation(torch.cosine_similarity(embeddings[0], embeddings[1]))
        return self.loss_fct(scores, labels.float())


class TripletDistanceMetric(Enum):
    """Distances for TripletLoss (sentence-transformers' names)."""

    COSINE = "cosine"
    EUCLIDEAN = "euclidean"
    MANHATTAN = "manhattan"

    def __call__(self, x: Tensor, y: Tensor) -> Tensor:
        if self is TripletDistanceMetric.COSINE:
            return 1 - pairwise_cos_sim(x, y)
        return -(pairwise_euclidean_sim if self is TripletDistanceMetric.EUCLIDEAN else pairwise_manhattan_sim)(x, y)


class TripletLoss(SentenceLoss):
    """Columns (anchor, positive, negative): max(0, d(anchor, positive) - d(anchor, negative) + margin), averaged."""

    columns = (3, 3)

    def __init__(self, model: nn.Module, distance_metric: Callable[[Tensor, Tensor], Tensor] = TripletDistanceMetric.EUCLIDEAN,
                 triplet_margin: float = 5):
        super().__init__(model)
        self.distance_metric, self.triplet_margin = distance_metric, triplet_margin

    def compute_loss_from_embeddings(self, embeddings: list[Tensor], labels: Tensor | None = None) -> Tensor:
        anchor, positive, negative = embeddings
        d_pos, d_neg = self.distance_metric(anchor, positive), self.distance_metric(anchor, negative)
        return F.relu(d_pos - d_neg + self.triplet_margin).mean()


class SiameseDistanceMetric(Enum):
    """Distances for ContrastiveLoss and OnlineContrastiveLoss (sentence-transformers' names)."""

    EUCLIDEAN = "euclidean"
    MANHATTAN = "manhattan"
    COSINE_DISTANCE = "cosine_distance"

    def __call__(self, x: Tensor, y: Tensor) -> Tensor:
        if self is SiameseDistanceMetric.COSINE_DISTANCE:
            return 1 - F.cosine_similarity(x, y)
        return F.pairwise_distance(x, y, p=2 if self is SiameseDistanceMetric.EUCLIDEAN else 1)


def _binary_labels(loss: str, labels: Tensor | None, rows: int, effect: str) -> Tensor:
    labels = check_labels(loss, labels, rows)
    if labels.ne(0).logical_and(labels.ne(1)).any():
        warnings.warn(f"{loss} expects binary labels (0 or 1): {effect}", UserWarning, stacklevel=4)
    return labels


class ContrastiveLoss(SentenceLoss):
    """Columns (text1, text2) and a 0/1 label (Hadsell et al., 2006): a similar pair's squared distance, a
    dissimilar pair's squared shortfall from ``margin``, halved; mean (``size_average``) or sum."""

    needs_label = True

    def __init__(self, model: nn.Module, distance_metric: Callable[[Tensor, Tensor], Tensor] =
                 SiameseDistanceMetric.COSINE_DISTANCE, margin: float = 0.5, size_average: bool = True):
        super().__init__(model)
        self.distance_metric, self.margin, self.size_average = distance_metric, margin, size_average

    def compute_loss_from_embeddings(self, embeddings: list[Tensor], labels: Tensor | None) -> Tensor:
        labels = _binary_labels(type(self).__name__, labels, embeddings[0].shape[0],
                                "others weight the similar term by the label and the dissimilar one by 1 - label")
        distances = self.distance_metric(embeddings[0], embeddings[1])
        # float before 1 - label: True/False labels are 1/0, as the other pair losses read them (torch has no
        # subtraction from a bool tensor: sentence-transformers' ContrastiveLoss fails on them)
        labels = labels.float()
        losses = 0.5 * (labels * distances.pow(2) + (1 - labels) * F.relu(self.margin - distances).pow(2))
        return losses.mean() if self.size_average else losses.sum()


class OnlineContrastiveLoss(SentenceLoss):
    """ContrastiveLoss on the batch's hard pairs only: the similar pairs farther apart than the closest dissimilar
    one, and the dissimilar pairs closer than the farthest similar one; summed."""

    needs_label = True

    def __init__(self, model: nn.Module, distance_metric: Callable[[Tensor, Tensor], Tensor] =
                 SiameseDistanceMetric.COSINE_DISTANCE, margin: float = 0.5):
        super().__init__(model)
        self.distance_metric, self.margin = distance_metric, margin

    def compute_loss_from_embeddings(self, embeddings: list[Tensor], labels: Tensor | None) -> Tensor:
        labels = _binary_labels(type(self).__name__, labels, embeddings[0].shape[0],
                                "pairs with another label are left out of the loss")
        distances = self.distance_metric(embeddings[0], embeddings[1])
        if bool(torch.isnan(distances).any()):
            # a NaN distance (an embedding holding NaN or inf) is neither harder nor easier than any other: the
            # comparisons below dropped it, and the loss of the rest came out finite (sentence-transformers' too), an
            # eval_loss and a training step blind to it; NaN, with its NaN gradient, as every other loss gives
            return distances.sum()
        negatives, positives = distances[labels == 0], distances[labels == 1]
        hard_negatives = negatives[negatives < (positives.max() if len(positives) else negatives.mean())]
        hard_positives = positives[positives > (negatives.min() if len(negatives) else positives.mean())]
        return hard_positives.pow(2).sum() + F.relu(self.margin - hard_negatives).pow(2).sum()
