"""Triplet losses mined inside the batch, on one text column and a class label per row: every row is an anchor,
its positives the batch's other rows of its label, its negatives the rows of other labels (Hermans et al., 2017,
"In Defense of the Triplet Loss for Person Re-Identification"; Schroff et al., 2015, FaceNet, for the semi-hard
negatives). Train them with ``batch_sampler=BatchSamplers.GROUP_BY_LABEL``, which puts two rows or more of each
of several labels in every batch (with the default sampler a row may have no positive in its batch, which then
adds nothing but its negatives' margin).

The numbers are sentence-transformers': the same distances (``BatchHardTripletLossDistanceFunction``), the same
masks and means, so a training step gives its loss within float rounding.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from bertkit.errors import BertkitError
from bertkit.sentence.data import label_groups
from bertkit.sentence.losses.base import SentenceLoss, check_labels
from bertkit.sentence.util import cos_sim


class BatchHardTripletLossDistanceFunction:
    """(B, B) distances between every two rows of a batch's embeddings, the ``distance_metric`` of the batch triplet
    losses (sentence-transformers' names)."""

    @staticmethod
    def cosine_distance(embeddings: Tensor) -> Tensor:
        """1 - cosine similarity, at least 0 and exactly 0 on the diagonal, as sentence-transformers 6.3 computes it
        (rounding had left an embedding a distance of +-1e-7 from itself)."""
        distances = (1 - cos_sim(embeddings, embeddings)).clamp(min=0.0)
        return distances.fill_diagonal_(0.0)

    @staticmethod
    def euclidean_distance(embeddings: Tensor, squared: bool = False) -> Tensor:
        """Euclidean distances from the Gram matrix (|a|^2 - 2 a.b + |b|^2, so the diagonal is exactly 0), in float32
        for half-precision embeddings (their squares lose the small distances)."""
        with torch.autocast(device_type=embeddings.device.type, enabled=False):
            if embeddings.dtype in (torch.float16, torch.bfloat16):
                embeddings = embeddings.float()
            gram = embeddings @ embeddings.T  # (B, B)
        norms = gram.diagonal()
        squares = (norms.unsqueeze(0) - 2.0 * gram + norms.unsqueeze(1)).clamp(min=0)  # rounding gives tiny negatives
        if squared:
            return squares
        # sqrt's gradient at 0 is infinite: a zero distance (the diagonal, a repeated text) stays 0 with none
        zero = squares.eq(0).float()
        return (1.0 - zero) * torch.sqrt(squares + zero * 1e-16)

    eucledian_distance = euclidean_distance  # sentence-transformers keeps the misspelt name too


def _check_distance(loss: str, distance_metric: Callable[[Tensor], Tensor]) -> Callable[[Tensor], Tensor]:
    if not callable(distance_metric):
        raise BertkitError(f"{loss}: distance_metric must be a function of the (B, D) embeddings giving (B, B) "
                           f"distances, e.g. BatchHardTripletLossDistanceFunction.cosine_distance, got "
                           f"{distance_metric!r}")
    return distance_metric


def _check_margin(loss: str, margin: float) -> float:
    if isinstance(margin, bool) or not isinstance(margin, numbers.Real) or not 0 <= margin < math.inf:
        raise BertkitError(f"{loss}: margin must be a finite number >= 0, got {margin!r}")
    return margin


class _BatchTripletLoss(SentenceLoss):
    """One text column and its class labels; the (B, B) distances and the label masks every batch loss starts from."""

    columns = (1, 1)
    needs_label = True
    in_batch_negatives = True  # a row's positives and negatives are the batch's other rows

    def __init__(self, model: nn.Module, distance_metric: Callable[[Tensor], Tensor]):
        super().__init__(model)
        self.distance_metric = _check_distance(type(self).__name__, distance_metric)

    def check_labels(self, labels: Sequence[Any], what: str) -> None:
        label_groups(labels, "label", what)  # labels compared for equality: class ids (ints)

    def distances(self, embeddings: list[Tensor], labels: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
        """(distances (B, B), labels (B,), same label (B, B) bool, the diagonal included)."""
        rows = embeddings[0].shape[0]
        labels = check_labels(type(self).__name__, labels, rows)
        if labels.is_floating_point():
            raise BertkitError(f"{type(self).__name__} compares labels as class ids, got {labels.dtype} labels "
                               f"{labels[:4].tolist()}...: give ints")
        distances = self.distance_metric(embeddings[0])
        if not isinstance(distances, Tensor) or distances.shape != (rows, rows):
            got = tuple(distances.shape) if isinstance(distances, Tensor) else type(distances).__name__
            raise BertkitError(f"{type(self).__name__}: distance_metric gave {got} for {rows} embeddings; it must give "
                               f"the ({rows}, {rows}) distances between every two rows")
        return distances, labels, labels.unsqueeze(0) == labels.unsqueeze(1)

    @staticmethod
    def hardest(distances: Tensor, same: Tensor) -> tuple[Tensor, Tensor]:
        """Each anchor's farthest positive (0 without one) and nearest negative (B, 1) each. A row of one label alone
        gets its largest distance plus itself as "nearest negative", as sentence-transformers computes it."""
        positive = same & ~torch.eye(len(same), dtype=torch.bool, device=same.device)
        farthest_positive = (positive.float() * distances).max(1, keepdim=True).values
        row_max = distances.max(1, keepdim=True).values
        nearest_negative = (distances + row_max * same.float()).min(1, keepdim=True).values
        return farthest_positive, nearest_negative


class BatchHardTripletLoss(_BatchTripletLoss):
    """Each anchor's hardest triplet in the batch, its farthest positive and nearest negative:
    mean over anchors of max(0, d(a, p) - d(a, n) + margin)."""

    def __init__(self, model: nn.Module, distance_metric: Callable[[Tensor], Tensor] =
                 BatchHardTripletLossDistanceFunction.euclidean_distance, margin: float = 5):
        super().__init__(model, distance_metric)
        self.triplet_margin = _check_margin(type(self).__name__, margin)

    def compute_loss_from_embeddings(self, embeddings: list[Tensor], labels: Tensor | None) -> Tensor:
        distances, _, same = self.distances(embeddings, labels)
        positive, negative = self.hardest(distances, same)
        # clamp, not relu: a triplet exactly at the margin keeps its gradient, as sentence-transformers' in-place zeroing
        return (positive - negative + self.triplet_margin).clamp(min=0).mean()


class BatchHardSoftMarginTripletLoss(_BatchTripletLoss):
    """BatchHardTripletLoss with a soft margin: mean over anchors of softplus(d(a, p) - d(a, n)), no margin to set."""

    def __init__(self, model: nn.Module, distance_metric: Callable[[Tensor], Tensor] =
                 BatchHardTripletLossDistanceFunction.euclidean_distance):
        super().__init__(model, distance_metric)

    def compute_loss_from_embeddings(self, embeddings: list[Tensor], labels: Tensor | None) -> Tensor:
        distances, _, same = self.distances(embeddings, labels)
        positive, negative = self.hardest(distances, same)
        return F.softplus(positive - negative).mean()


class BatchAllTripletLoss(_BatchTripletLoss):
    """Every valid triplet of the batch (an anchor, another row of its label, a row of another label):
    max(0, d(a, p) - d(a, n) + margin), averaged over the triplets whose loss is above zero."""

    def __init__(self, model: nn.Module, distance_metric: Callable[[Tensor], Tensor] =
                 BatchHardTripletLossDistanceFunction.euclidean_distance, margin: float = 5):
        super().__init__(model, distance_metric)
        self.triplet_margin = _check_margin(type(self).__name__, margin)

    def compute_loss_from_embeddings(self, embeddings: list[Tensor], labels: Tensor | None) -> Tensor:
        distances, labels, same = self.distances(embeddings, labels)
        # the (anchor, positive) pairs, each against every row: P x B, not a B x B x B cube
        anchor, positive = (same & ~torch.eye(len(same), dtype=torch.bool, device=same.device)).nonzero(as_tuple=True)
        losses = distances[anchor, positive].unsqueeze(1) - distances[anchor] + self.triplet_margin  # (P, B)
        negative = labels[anchor].unsqueeze(1) != labels.unsqueeze(0)
        losses = (negative.float() * losses).clamp(min=0)
        hard = (losses > 1e-16).sum()
        return losses.sum() / (hard + 1e-16)


class BatchSemiHardTripletLoss(_BatchTripletLoss):
    """Each (anchor, positive) pair against its semi-hard negative: the nearest negative farther than the positive,
    or, where none is, the farthest negative (FaceNet): max(0, d(a, p) - d(a, n) + margin), averaged over the
    (anchor, positive) pairs."""

    def __init__(self, model: nn.Module, distance_metric: Callable[[Tensor], Tensor] =
                 BatchHardTripletLossDistanceFunction.euclidean_distance, margin: float = 5):
        super().__init__(model, distance_metric)
        self.margin = _check_margin(type(self).__name__, margin)

    def compute_loss_from_embeddings(self, embeddings: list[Tensor], labels: Tensor | None) -> Tensor:
        distances, _, same = self.distances(embeddings, labels)
        B = len(same)
        # per anchor, its negatives' distances sorted (others at inf); for each of its rows' distance d(a, j), the
        # first negative beyond it, by binary search
        negatives = distances.masked_fill(same, torch.inf).sort(dim=1, stable=True).values  # (B, B)
        beyond = torch.searchsorted(negatives.detach().contiguous(), distances.detach().contiguous(), right=True)
        nearest_beyond = negatives.gather(1, beyond.clamp(max=B - 1))  # inf where no negative is farther
        row_min = distances.min(1, keepdim=True).values
        farthest = ((distances - row_min) * ~same).max(1, keepdim=True).values + row_min  # (B, 1)
        semi_hard = torch.where(torch.isfinite(nearest_beyond), nearest_beyond, farthest)
        pairs = same.float() - torch.eye(B, device=same.device)  # (anchor, positive), the diagonal left out
        losses = torch.maximum((distances - semi_hard + self.margin) * pairs, distances.new_zeros(1))
        return losses.sum() / pairs.sum().clamp(min=1e-16)
