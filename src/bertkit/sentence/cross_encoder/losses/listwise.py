"""The listwise cross-encoder losses (``sentence_transformers.cross_encoder.losses``): a query and a list of documents
per row, one label per document, scored as the (B, D) matrices of a batch (``ListNetLoss``, ``LambdaLoss`` with
its weighting schemes, ``RankNetLoss``, ``PListMLELoss``, ``ListMLELoss``, ``ADRMSELoss``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from bertkit.errors import BertkitError
from bertkit.sentence.cross_encoder.losses.base import IDENTITY, CrossEncoderLoss
from bertkit.sentence.cross_encoder.model import CrossEncoder, fullname


class _ListwiseLoss(CrossEncoderLoss):
    """A query and its documents per row, one label per document: the (B, D) logits and labels, padded where a
    row has fewer documents (logits -1e16, labels -inf, as sentence-transformers pads them)."""

    needs_label = True
    listwise = True

    def matrices(self, inputs: Sequence[Any], labels: Sequence[Tensor]) -> tuple[Tensor, Tensor, Tensor]:
        """(logits, labels, mask), each (B, D): mask is True where a row has a document."""
        name = type(self).__name__
        if isinstance(labels, Tensor):
            raise BertkitError(f"{name} needs a list of labels per row (one per document), got one value per row")
        if len(inputs) != 2:
            raise BertkitError(f"{name} takes two columns (query, documents), got {len(inputs)}")
        queries, docs = inputs
        counts = [len(d) for d in docs]
        if counts != [len(x) for x in labels]:
            raise BertkitError(f"{name}: the rows have {counts} documents but {[len(x) for x in labels]} labels; "
                               "give one label per document")
        if min(counts) == 0:
            raise BertkitError(f"{name}: row {counts.index(0)} has no documents")
        batch, width = len(queries), max(counts)
        firsts = [q for q, n in zip(queries, counts) for _ in range(n)]
        logits = self.logits(firsts, [d for row in docs for d in row], self.mini_batch_size or batch).float()
        logits = self.activation_fn(logits)
        device = logits.device
        rows = torch.repeat_interleave(torch.arange(batch), torch.tensor(counts))
        cols = torch.cat([torch.arange(n) for n in counts])
        logit_matrix = torch.full((batch, width), -1e16, device=device)
        logit_matrix[rows, cols] = logits
        label_matrix = torch.full((batch, width), float("-inf"), device=device)
        label_matrix[rows, cols] = torch.cat([torch.as_tensor(x, dtype=torch.float32) for x in labels]).to(device)
        mask = torch.zeros((batch, width), dtype=torch.bool, device=device)
        mask[rows, cols] = True
        return logit_matrix, label_matrix, mask


class ListNetLoss(_ListwiseLoss):
    """ListNet (Cao et al., 2007): cross-entropy between the softmax of the labels and of the logits per query."""

    def __init__(self, model: CrossEncoder, activation_fn: nn.Module | None = IDENTITY,
                 mini_batch_size: int | None = None):
        super().__init__(model, mini_batch_size)
        self.activation_fn = activation_fn or nn.Identity()

    def forward(self, inputs: Sequence[Any], labels: Sequence[Tensor]) -> Tensor:
        logits, target, _ = self.matrices(inputs, labels)
        return F.cross_entropy(logits, target.softmax(dim=1))

    def get_config_dict(self) -> dict[str, Any]:
        return {"activation_fn": fullname(self.activation_fn), "mini_batch_size": self.mini_batch_size}


# -- LambdaLoss's weighting schemes (Wang et al., 2018), sentence-transformers' classes and formulas ---------------
class BaseWeightingScheme(nn.Module):
    def forward(self, gain: Tensor, discount: Tensor, true_sorted: Tensor) -> Tensor:
        raise NotImplementedError


class NoWeightingScheme(BaseWeightingScheme):
    def forward(self, gain: Tensor, discount: Tensor, true_sorted: Tensor) -> Tensor:
        return torch.tensor(1.0, device=gain.device)


class NDCGLoss1Scheme(BaseWeightingScheme):
    def forward(self, gain: Tensor, discount: Tensor, true_sorted: Tensor) -> Tensor:
        return (gain / discount)[:, :, None]


class NDCGLoss2Scheme(BaseWeightingScheme):
    def forward(self, gain: Tensor, discount: Tensor, true_sorted: Tensor) -> Tensor:
        positions = torch.arange(1, gain.shape[1] + 1, device=gain.device)
        delta = torch.abs(positions[:, None] - positions[None, :])
        deltas = torch.abs(torch.abs(discount[0, delta - 1]) ** -1.0 - torch.abs(discount[0, delta]) ** -1.0)
        deltas.diagonal().zero_()
        return deltas[None, :, :] * torch.abs(gain[:, :, None] - gain[:, None, :])


class LambdaRankScheme(BaseWeightingScheme):
    def forward(self, gain: Tensor, discount: Tensor, true_sorted: Tensor) -> Tensor:
        return torch.abs(discount[:, :, None] ** -1.0 - discount[:, None, :] ** -1.0) * torch.abs(
            gain[:, :, None] - gain[:, None, :])


class NDCGLoss2PPScheme(BaseWeightingScheme):
    def __init__(self, mu: float = 10.0):
        super().__init__()
        self.mu = mu
        self.ndcg_loss2, self.lambda_rank = NDCGLoss2Scheme(), LambdaRankScheme()

    def forward(self, gain: Tensor, discount: Tensor, true_sorted: Tensor) -> Tensor:
        return (self.mu * self.ndcg_loss2(gain, discount, true_sorted)
                + self.lambda_rank(gain, discount, true_sorted))


_NDCG_LOSS2PP = NDCGLoss2PPScheme()  # stateless: one instance, the default of every LambdaLoss


class LambdaLoss(_ListwiseLoss):
    """LambdaLoss (Wang et al., 2018): pairwise logistic losses between each query's documents, weighted by
    ``weighting_scheme`` (NDCG-Loss2++ by default; None weighs every pair 1, as sentence-transformers reads it), over
    the pairs with a document in the top ``k``."""

    def __init__(self, model: CrossEncoder, weighting_scheme: BaseWeightingScheme | None = _NDCG_LOSS2PP,
                 k: int | None = None, sigma: float = 1.0, eps: float = 1e-10,
                 reduction_log: Literal["natural", "binary"] = "binary",
                 activation_fn: nn.Module | None = IDENTITY, mini_batch_size: int | None = None):
        super().__init__(model, mini_batch_size)
        if reduction_log not in ("natural", "binary"):
            raise BertkitError(f"reduction_log must be 'natural' or 'binary', got {reduction_log!r}")
        self.weighting_scheme = weighting_scheme or NoWeightingScheme()
        self.k, self.sigma, self.eps, self.reduction_log = k, sigma, eps, reduction_log
        self.activation_fn = activation_fn or nn.Identity()

    def forward(self, inputs: Sequence[Any], labels: Sequence[Tensor]) -> Tensor:
        logits, target, _ = self.matrices(inputs, labels)
        width, device = logits.shape[1], logits.device
        logits_sorted, by_prediction = logits.sort(descending=True, dim=-1)
        target_sorted, _ = target.sort(descending=True, dim=-1)
        true_by_prediction = torch.gather(target, 1, by_prediction)
        true_diffs = true_by_prediction[:, :, None] - true_by_prediction[:, None, :]  # (B, D, D)
        pairs = torch.isfinite(true_diffs)
        if not isinstance(self.weighting_scheme, NDCGLoss1Scheme):
            pairs = pairs & (true_diffs > 0)
        k = self.k or width
        top_k = torch.zeros(width, width, dtype=torch.bool, device=device)
        top_k[:k, :] = True
        top_k[:, :k] = True
        true_by_prediction = true_by_prediction.clamp(min=0.0)
        target_sorted = target_sorted.clamp(min=0.0)
        discount = torch.log2(1.0 + torch.arange(1, width + 1, device=device).float())[None, :]
        max_dcg = torch.sum(((2 ** target_sorted - 1) / discount)[:, :k], dim=-1).clamp(min=self.eps)
        gain = (2 ** true_by_prediction - 1) / max_dcg[:, None]
        weights = self.weighting_scheme(gain, discount, true_by_prediction)
        # sentence-transformers (after allRank, whose padding logits are -inf) sets a NaN difference to 0; padding here
        # is -1e16, so a NaN is the model's own (a NaN or overflowed logit): it stays, and the loss is NaN (the loop
        # stops naming the step, eval_loss is NaN), where its 0 gave a finite loss for outputs that were not
        diffs = (logits_sorted[:, :, None] - logits_sorted[:, None, :]).clamp(min=-1e8, max=1e8)
        losses = weights * F.logsigmoid(self.sigma * diffs)
        if self.reduction_log == "binary":
            losses = losses / math.log(2)
        kept = losses[pairs & top_k]
        return -kept.sum() / max(kept.numel(), 1)

    def get_config_dict(self) -> dict[str, Any]:
        return {"weighting_scheme": fullname(self.weighting_scheme), "k": self.k, "sigma": self.sigma, "eps": self.eps,
                "reduction_log": self.reduction_log, "activation_fn": fullname(self.activation_fn),
                "mini_batch_size": self.mini_batch_size}


class RankNetLoss(LambdaLoss):
    """RankNet (Burges et al., 2005): LambdaLoss's pairwise logistic losses without weights."""

    def __init__(self, model: CrossEncoder, k: int | None = None, sigma: float = 1.0, eps: float = 1e-10,
                 reduction_log: Literal["natural", "binary"] = "binary", activation_fn: nn.Module | None = IDENTITY,
                 mini_batch_size: int | None = None):
        super().__init__(model, NoWeightingScheme(), k, sigma, eps, reduction_log, activation_fn, mini_batch_size)

    def get_config_dict(self) -> dict[str, Any]:
        config = super().get_config_dict()
        del config["weighting_scheme"]
        return config


class PListMLELambdaWeight(nn.Module):
    """Position-aware ListMLE's weight of each rank, 2^(n - rank) - 1 for a list of n documents (exponents above
    127 shifted down so the float stays finite), or ``rank_discount_fn(mask)``."""

    def __init__(self, rank_discount_fn: Any = None):
        super().__init__()
        self.rank_discount_fn = rank_discount_fn

    def forward(self, mask: Tensor) -> Tensor:
        if self.rank_discount_fn is not None:
            return self.rank_discount_fn(mask)
        count = mask.sum(dim=1, keepdim=True)
        ranks = torch.arange(1, mask.size(1) + 1, device=mask.device).expand_as(mask)
        scale = (count - 127).clamp_min(0)
        return (torch.pow(2.0, count - ranks - scale) - torch.pow(2.0, -scale)) * mask


_RANK_WEIGHT = PListMLELambdaWeight()  # stateless: one instance, the default of every PListMLELoss


class PListMLELoss(_ListwiseLoss):
    """Position-aware ListMLE (Lan et al., 2014): the negative log-likelihood of the documents' order under the
    Plackett-Luce model of the logits, each rank weighted by ``lambda_weight`` (None: ListMLE). The order is the
    documents' order in the row (``respect_input_order``), else the labels' descending order."""

    def __init__(self, model: CrossEncoder, lambda_weight: PListMLELambdaWeight | None = _RANK_WEIGHT,
                 activation_fn: nn.Module | None = IDENTITY, mini_batch_size: int | None = None,
                 respect_input_order: bool = True):
        super().__init__(model, mini_batch_size)
        self.lambda_weight, self.respect_input_order = lambda_weight, respect_input_order
        self.activation_fn = activation_fn or nn.Identity()
        self.eps = 1e-10

    def forward(self, inputs: Sequence[Any], labels: Sequence[Tensor]) -> Tensor:
        logits, target, mask = self.matrices(inputs, labels)
        if not self.respect_input_order:
            order = target.sort(descending=True, dim=1)[1]
            logits, mask_sorted = torch.gather(logits, 1, order), torch.gather(mask, 1, order)
        else:
            mask_sorted = mask
        scores = logits.masked_fill(~mask_sorted, torch.finfo(logits.dtype).min)
        log_normalizers = torch.flip(torch.logcumsumexp(torch.flip(scores, [1]), dim=1), [1])
        log_probs = logits - log_normalizers
        if self.lambda_weight is not None:
            weight = self.lambda_weight(mask)
            log_probs = log_probs * (weight / (weight.sum(dim=1, keepdim=True) + self.eps))
        per_query = -log_probs.masked_fill(~mask_sorted, 0.0).sum(dim=1)
        return per_query.mean()

    def get_config_dict(self) -> dict[str, Any]:
        return {"lambda_weight": None if self.lambda_weight is None else fullname(self.lambda_weight),
                "activation_fn": fullname(self.activation_fn), "mini_batch_size": self.mini_batch_size,
                "respect_input_order": self.respect_input_order}


class ListMLELoss(PListMLELoss):
    """ListMLE (Xia et al., 2008): PListMLELoss without rank weights."""

    def __init__(self, model: CrossEncoder, activation_fn: nn.Module | None = IDENTITY,
                 mini_batch_size: int | None = None, respect_input_order: bool = True):
        super().__init__(model, None, activation_fn, mini_batch_size, respect_input_order)

    def get_config_dict(self) -> dict[str, Any]:
        config = super().get_config_dict()
        del config["lambda_weight"]
        return config


class ADRMSELoss(_ListwiseLoss):
    """ADR-MSE (Schlatt et al., 2025, Rank-DistiLLM): the squared error between each document's rank by its label
    (ties averaged) and its differentiable rank by the logits (sigmoids of ``alpha`` x the score differences),
    discounted by 1 / log2(1 + rank), over every document of the batch."""

    def __init__(self, model: CrossEncoder, alpha: float = 1.0, activation_fn: nn.Module | None = IDENTITY,
                 mini_batch_size: int | None = None):
        super().__init__(model, mini_batch_size)
        self.alpha, self.activation_fn = alpha, activation_fn or nn.Identity()

    def forward(self, inputs: Sequence[Any], labels: Sequence[Tensor]) -> Tensor:
        logits, target, mask = self.matrices(inputs, labels)
        target = target.masked_fill(~mask, 0.0)
        later = mask.unsqueeze(1)  # (B, 1, D): document j exists
        greater = ((target.unsqueeze(1) > target.unsqueeze(2)) & later).sum(dim=-1).float()
        equal = ((target.unsqueeze(1) == target.unsqueeze(2)) & later).sum(dim=-1).float()
        true_ranks = greater + (equal + 1.0) / 2.0
        pairwise = torch.sigmoid(self.alpha * (logits.unsqueeze(1) - logits.unsqueeze(2))) * later.float()
        approx_ranks = 1.0 + pairwise.sum(dim=2) - 0.5 * mask.float()
        loss = (true_ranks - approx_ranks) ** 2 / torch.log2(true_ranks + 1.0) * mask.float()
        return loss.sum() / mask.sum()

    def get_config_dict(self) -> dict[str, Any]:
        return {"alpha": self.alpha, "activation_fn": fullname(self.activation_fn),
                "mini_batch_size": self.mini_batch_size}
