"""MatryoshkaLoss (Kusupati et al., 2022): the wrapped loss on the embeddings' first d dimensions, renormalised,
for each d of ``matryoshka_dims``, weighted; what ``encode(truncate_dim=d)`` then returns is trained for."""

from __future__ import annotations

import math
import numbers
import random
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from bertkit.errors import BertkitError, is_whole
from bertkit.sentence.losses.base import SentenceLoss, embed_columns
from bertkit.sentence.losses.cached import CachedLoss
from bertkit.sentence.losses.gist import GISTEmbedLoss
from bertkit.training.distributed import all_gather


class MatryoshkaLoss(SentenceLoss):
    """``loss`` summed over truncations of the embeddings to each of ``matryoshka_dims`` (largest first), with
    ``matryoshka_weights`` (1 each by default); ``n_dims_per_step`` > 0 draws that many of them per step."""

    def __init__(self, model: nn.Module, loss: SentenceLoss, matryoshka_dims: Sequence[int],
                 matryoshka_weights: Sequence[float] | None = None, n_dims_per_step: int = -1):
        super().__init__(model)
        if not isinstance(loss, SentenceLoss):
            raise BertkitError(f"MatryoshkaLoss wraps a bertkit.sentence loss, got {type(loss).__name__}")
        if type(loss).compute_loss_from_embeddings is SentenceLoss.compute_loss_from_embeddings:
            # SoftmaxLoss: its classifier takes the full width (sentence-transformers fails inside the product)
            raise BertkitError(f"MatryoshkaLoss cannot wrap {type(loss).__name__}, which does not score cut "
                               "embeddings; train with it alone")
        full = _untruncated_width(model)
        dims = list(matryoshka_dims)
        if not dims or any(not is_whole(d, 1, full) for d in dims):
            raise BertkitError(f"MatryoshkaLoss: matryoshka_dims {dims} must be whole numbers in [1, {full}], this "
                               f"model's embedding dimension")
        weights = [1] * len(dims) if matryoshka_weights is None else list(matryoshka_weights)
        if len(weights) != len(dims):
            raise BertkitError(f"MatryoshkaLoss: {len(weights)} matryoshka_weights for {len(dims)} matryoshka_dims")
        if not all(isinstance(w, numbers.Real) and not isinstance(w, bool) and math.isfinite(w) for w in weights):
            # a NaN weight makes every step's loss NaN, in sentence-transformers too, without a word
            raise BertkitError(f"MatryoshkaLoss: matryoshka_weights {weights} must be finite numbers")
        if not is_whole(n_dims_per_step, -math.inf):  # a float or a string stopped the first step with a TypeError
            raise BertkitError(f"MatryoshkaLoss: n_dims_per_step {n_dims_per_step!r} must be a whole number (k > 0 draws k "
                               "of the dimensions a step; 0 or less takes them all)")
        pairs = sorted(zip(dims, weights), key=lambda p: p[0], reverse=True)
        self.loss = loss
        self.matryoshka_dims = tuple(d for d, _ in pairs)
        self.matryoshka_weights = tuple(w for _, w in pairs)
        self.n_dims_per_step = n_dims_per_step
        self.columns, self.needs_label, self.in_batch_negatives = loss.columns, loss.needs_label, loss.in_batch_negatives

    def check_labels(self, labels: Sequence[Any], what: str) -> None:
        self.loss.check_labels(labels, what)

    def _dims(self) -> list[int]:
        """The indices of this step's widths: all, or ``n_dims_per_step`` drawn from Python's ``random``. In training
        under torchrun, rank 0's draw on every rank: the loop seeds each rank's ``random`` apart (seed + rank), and
        ranks training other widths in one step would average gradients of other losses (and, gathered, score the
        global batch at other widths), where sentence-transformers' ranks, seeded alike, draw the same widths and
        2 processes x 8 train as one process x 16. Evaluation draws on each rank (ranks evaluate other batches)."""
        chosen = list(range(len(self.matryoshka_dims)))
        if 0 < self.n_dims_per_step < len(chosen):
            chosen = sorted(random.sample(chosen, self.n_dims_per_step))
            if self.training:
                chosen = all_gather(chosen)[0]
        return chosen

    def compute_loss_from_embeddings(self, embeddings: list[Tensor], labels: Tensor | None, *guide: list[Tensor]) -> Tensor:
        """``guide``: GISTEmbedLoss's guide embeddings, passed on whole (the guide is not truncated). Labels that are
        embeddings, (B, D) or (B, C, D) at the model's width (a teacher's, for MSELoss or EmbedDistillLoss), are cut
        to each d as the embeddings are, as sentence-transformers cuts them."""
        width = _untruncated_width(self.model)
        embedding_labels = isinstance(labels, Tensor) and labels.ndim in (2, 3) and labels.shape[-1] == width
        total: Any = 0.0
        for i in self._dims():
            d, w = self.matryoshka_dims[i], self.matryoshka_weights[i]
            total = total + w * self.loss.compute_loss_from_embeddings(
                [_normalized(e[..., :d]) for e in embeddings],
                labels[..., :d] if embedding_labels else labels, *guide)
        return total

    def forward(self, sentence_features: Sequence[dict[str, Any]], labels: Tensor | None) -> Tensor:
        if isinstance(self.loss, CachedLoss):
            return self.loss(sentence_features, labels, loss_fn=self.compute_loss_from_embeddings)
        guide = self.loss.embed_guide(sentence_features) if isinstance(self.loss, GISTEmbedLoss) else None
        return self.loss.loss_on_batch(embed_columns(self.model, sentence_features), sentence_features, labels,
                                       self.compute_loss_from_embeddings, guide)


def _untruncated_width(model: nn.Module) -> int:
    """The width the model's forward pass gives, whatever its ``truncate_dim`` (which cuts ``encode``'s output
    only): the widths a MatryoshkaLoss may train, as sentence-transformers 6.3 reads them (6.2 read the truncated
    width, refusing a model saved with truncate_dim=64 any larger dimension)."""
    width = getattr(model, "_width", None)
    return width if isinstance(width, int) else model.get_sentence_embedding_dimension()


def _normalized(embeddings: Tensor) -> Tensor:
    """Unit rows, in float32 for half-precision embeddings (whose squares lose small components), back in their
    type, as sentence-transformers 6.3 normalises them."""
    if embeddings.dtype in (torch.float16, torch.bfloat16):
        return F.normalize(embeddings.float(), p=2, dim=-1).to(embeddings.dtype)
    return F.normalize(embeddings, p=2, dim=-1)
