"""Losses that push a batch's embeddings apart: MegaBatchMarginLoss (Wieting & Gimpel, 2018, ParaNMT-50M), a
margin on each anchor's positive and on its hardest in-batch negative, and GlobalOrthogonalRegularizationLoss
(Zhang et al., 2017, arXiv:1708.06320), a penalty on unrelated embeddings' similarities, as sentence-transformers 6
computes them."""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from bertkit.errors import BertkitError
from bertkit.sentence.losses.base import SentenceLoss, embed_columns
from bertkit.sentence.losses.cached import CachedLoss, check_mini_batch
from bertkit.sentence.util import cos_sim


class MegaBatchMarginLoss(CachedLoss, SentenceLoss):
    """Columns (anchor, positive): each anchor's hardest negative is the batch's other positive it is most similar
    to; the loss is relu(``positive_margin`` - cos(anchor, positive)) + relu(cos(anchor, hardest negative) -
    ``negative_margin``), averaged over the rows. The hardest negative needs a large batch ("mega-batch"):
    ``use_mini_batched_version`` embeds it in mini-batches of ``mini_batch_size`` rows with GradCache (same numbers,
    the memory of a mini-batch)."""

    columns = (2, 2)
    in_batch_negatives = True

    def __init__(self, model: nn.Module, positive_margin: float = 0.8, negative_margin: float = 0.3,
                 use_mini_batched_version: bool = True, mini_batch_size: int = 50,
                 mini_batch_num_tokens: int | None = None, show_progress_bar: bool = False):
        super().__init__(model)
        for name, value in (("positive_margin", positive_margin), ("negative_margin", negative_margin)):
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
                raise BertkitError(f"MegaBatchMarginLoss: {name} must be a finite number (a cosine similarity), "
                                   f"got {value!r}")
        self.positive_margin, self.negative_margin = float(positive_margin), float(negative_margin)
        self.use_mini_batched_version = bool(use_mini_batched_version)
        self.mini_batch_size = check_mini_batch("MegaBatchMarginLoss", mini_batch_size, mini_batch_num_tokens)

    def forward(self, sentence_features: Sequence[dict[str, Any]], labels: Tensor | None,
                loss_fn: Callable[..., Tensor] | None = None) -> Tensor:
        if self.use_mini_batched_version:
            return super().forward(sentence_features, labels, loss_fn)
        return self.loss_on_batch(embed_columns(self.model, sentence_features), sentence_features, labels, loss_fn)

    def compute_loss_from_embeddings(self, embeddings: list[Tensor], labels: Tensor | None = None) -> Tensor:
        anchors, positives = embeddings  # (B, D) each
        scores = cos_sim(anchors, positives)  # (B, B)
        own = torch.eye(len(scores), dtype=torch.bool, device=scores.device)
        hardest = scores.masked_fill(own, -torch.inf).max(dim=1).values  # -inf for a batch of 1: no negative
        return (F.relu(self.positive_margin - scores.diagonal()) + F.relu(hardest - self.negative_margin)).mean()

    def get_config_dict(self) -> dict[str, Any]:
        return {"positive_margin": self.positive_margin, "negative_margin": self.negative_margin,
                "mini_batch_size": self.mini_batch_size, "mini_batch_num_tokens": None}


class GlobalOrthogonalRegularizationLoss(SentenceLoss):
    """Any columns, no label. For each column's (B, D) embeddings, the similarities of its distinct rows: the
    square of their mean ("gor_mean") and the excess of their second moment over 1 / D, the value of random
    directions ("gor_second_moment"), each over the columns by ``aggregation`` ("mean" or "sum"), weighted.
    Returns the two terms by name (a weight of 0 or None drops one); the trainer trains on their sum and logs each.
    Meant beside a main loss: a custom loss adding these terms to MultipleNegativesRankingLoss's, or a dict of
    losses over the same dataset twice."""

    columns = (1, None)

    def __init__(self, model: nn.Module, similarity_fct: Callable[[Tensor, Tensor], Tensor] = cos_sim,
                 mean_weight: float | None = 1.0, second_moment_weight: float | None = 1.0,
                 aggregation: str = "mean"):
        super().__init__(model)
        for name, value in (("mean_weight", mean_weight), ("second_moment_weight", second_moment_weight)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Real)
                                      or not math.isfinite(value)):
                raise BertkitError(f"GlobalOrthogonalRegularizationLoss: {name} must be a finite number or None "
                                   f"(None or 0 drops the term), got {value!r}")
        if not mean_weight and not second_moment_weight:
            raise BertkitError("GlobalOrthogonalRegularizationLoss: mean_weight and second_moment_weight are both "
                               f"{mean_weight!r}/{second_moment_weight!r}, leaving no term; give one a weight")
        if aggregation not in ("mean", "sum"):
            raise BertkitError(f"GlobalOrthogonalRegularizationLoss: aggregation must be 'mean' or 'sum', got "
                               f"{aggregation!r}")
        self.similarity_fct = similarity_fct
        self.mean_weight, self.second_moment_weight, self.aggregation = mean_weight, second_moment_weight, aggregation

    def compute_loss_from_embeddings(self, embeddings: list[Tensor], labels: Tensor | None = None) -> dict[str, Tensor]:
        means, moments = zip(*(self.compute_gor(e) for e in embeddings))
        terms = {}
        for name, weight, values in (("gor_mean", self.mean_weight, means),
                                     ("gor_second_moment", self.second_moment_weight, moments)):
            if weight:
                stacked = torch.stack(values)
                terms[name] = weight * (stacked.sum() if self.aggregation == "sum" else stacked.mean())
        return terms

    def compute_gor(self, embeddings: Tensor) -> tuple[Tensor, Tensor]:
        """One column's (mean term, second-moment term)."""
        rows, dim = embeddings.shape
        sims = self.similarity_fct(embeddings, embeddings)  # (B, B)
        sims = sims.masked_fill(torch.eye(rows, dtype=torch.bool, device=sims.device), 0.0)  # not itself
        pairs = max(rows * (rows - 1), 1)
        return (sims.sum() / pairs).pow(2), torch.relu(sims.pow(2).sum() / pairs - 1.0 / dim)

    def get_config_dict(self) -> dict[str, Any]:
        return {"similarity_fct": getattr(self.similarity_fct, "__name__", repr(self.similarity_fct)),
                "mean_weight": self.mean_weight, "second_moment_weight": self.second_moment_weight,
                "aggregation": self.aggregation}
