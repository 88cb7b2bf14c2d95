"""Losses on scored pairs (CoSENTLoss, CosineSimilarityLoss) and on triplets (TripletLoss)."""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from bertkit.sentence.losses.base import SentenceLoss, check_labels
from bertkit.sentence.util import pairwise_cos_sim, pairwise_euclidean_sim, pairwise_manhattan_sim


class CoSENTLoss(SentenceLoss):
    """Columns (text1, text2) and a score: every pair scored higher must get the higher similarity,
    log(1 + sum over (i, j) with label_i > label_j of exp(scale * (sim_j - sim_i))) (Su, 2022)."""

    needs_label = True

    def __init__(self, model: nn.Module, scale: float = 20.0,
                 similarity_fct: Callable[[Tensor, Tensor], Tensor] = pairwise_cos_sim):
        super().__init__(model)
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
