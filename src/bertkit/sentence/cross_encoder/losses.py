"""Cross-encoder training losses with sentence-transformers' names, arguments and numbers
(``sentence_transformers.cross_encoder.losses``).

A loss is called as sentence-transformers calls it, ``loss(inputs, labels)``: ``inputs`` holds one list per
dataset column, each entry a text or its word pieces (``CrossEncoder.token_ids``; the trainer passes those, so a
text is tokenized once, not once per pair it is in). Pairwise losses take (anchor, candidate, ...) columns; the
listwise ones (LambdaLoss, ListNetLoss) a query column and a column of document lists, with a list of labels
per row. Every pair a step scores goes through the model in one forward pass (bertkit's encoder drops the
padding, so this gives the per-column calls' numbers); ``mini_batch_size`` splits it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, ClassVar, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from bertkit.errors import BertkitError
from bertkit.sentence.cross_encoder.model import CrossEncoder, fullname

Text = str | list[int]
# sentence-transformers' default activations: stateless modules, one shared instance each
_IDENTITY, _SIGMOID = nn.Identity(), nn.Sigmoid()


class CrossEncoderLoss(nn.Module):
    """Base of the cross-encoder losses: the dataset columns it takes (``columns``: fewest, most or None), whether
    it needs labels, whether its second column holds document lists (``listwise``), whether it takes negatives from
    the batch's other rows."""

    columns: ClassVar[tuple[int, int | None]] = (2, 2)
    needs_label: ClassVar[bool] = False
    listwise: ClassVar[bool] = False
    in_batch_negatives: ClassVar[bool] = False

    def __init__(self, model: CrossEncoder, mini_batch_size: int | None = None):
        super().__init__()
        if not isinstance(model, CrossEncoder):
            raise BertkitError(f"{type(self).__name__} needs a bertkit.sentence.cross_encoder.CrossEncoder, got "
                               f"{type(model).__name__}")
        if model.num_labels != 1:
            raise BertkitError(f"{type(self).__name__} needs a model with 1 output label; this one has "
                               f"{model.num_labels}: load it with CrossEncoder(path, num_labels=1)")
        if mini_batch_size is not None and (isinstance(mini_batch_size, bool) or not isinstance(mini_batch_size, int)):
            raise BertkitError(f"mini_batch_size must be a whole number or None, got {mini_batch_size!r}")
        self.model, self.mini_batch_size = model, mini_batch_size

    def logits(self, firsts: Sequence[Text], seconds: Sequence[Text], chunk: int | None = None) -> Tensor:
        """(N,) logits of the pairs, through the model in slices of ``chunk`` pairs (all at once without)."""
        chunk = chunk if chunk and chunk > 0 else len(firsts)
        return torch.cat([self.model.scores(self.model.pair_batch(firsts[s:s + chunk], seconds[s:s + chunk])).view(-1)
                          for s in range(0, len(firsts), chunk)])

    def describe_columns(self) -> str:
        lo, hi = self.columns
        n = f"{lo}" if lo == hi else f"{lo} or more" if hi is None else f"{lo} to {hi}"
        if self.listwise:
            return (f"{type(self).__name__} takes a query column, a column of document lists and a label column "
                    "holding one list of labels per row")
        return f"{type(self).__name__} takes {n} text column(s)" + (" and a label column ('label' or 'score')"
                                                                     if self.needs_label else "")

    def get_config_dict(self) -> dict[str, Any]:
        return {}


class BinaryCrossEntropyLoss(CrossEncoderLoss):
    """(text, text) pairs with a label in [0, 1]: binary cross-entropy on the logit (after ``activation_fn``,
    identity by default), ``pos_weight`` weighting the positives."""

    needs_label = True

    def __init__(self, model: CrossEncoder, activation_fn: nn.Module = _IDENTITY, pos_weight: Tensor | None = None,
                 **kwargs: Any):
        super().__init__(model)
        for name in kwargs:
            raise BertkitError(f"BinaryCrossEntropyLoss({name}=...) is not implemented in bertkit: it takes "
                               "activation_fn and pos_weight")
        self.activation_fn, self.pos_weight = activation_fn, pos_weight
        self.bce_with_logits_loss = nn.BCEWithLogitsLoss(pos_weight=pos_weight)

    def forward(self, inputs: Sequence[Sequence[Text]], labels: Tensor) -> Tensor:
        if len(inputs) != 2:
            raise BertkitError(f"BinaryCrossEntropyLoss takes two text columns, got {len(inputs)}")
        logits = self.activation_fn(self.logits(inputs[0], inputs[1]))
        if labels is None or labels.numel() != logits.shape[0]:
            raise BertkitError(f"BinaryCrossEntropyLoss needs one label per pair: {logits.shape[0]} pairs, "
                               f"{0 if labels is None else labels.numel()} labels")
        return self.bce_with_logits_loss(logits, labels.view(-1).float().to(logits.device))

    def get_config_dict(self) -> dict[str, Any]:
        return {"activation_fn": fullname(self.activation_fn),
                "pos_weight": None if self.pos_weight is None else self.pos_weight.item()}


class MultipleNegativesRankingLoss(CrossEncoderLoss):
    """(anchor, positive, hard negatives...) rows: each anchor's positive against ``num_negatives`` candidates of
    the batch's other rows (drawn without replacement by ``torch.multinomial``, as sentence-transformers draws
    them; all of them when there are no more than that) and its own hard negatives, cross-entropy over
    ``scale * activation_fn(logits)``."""

    columns = (2, None)
    in_batch_negatives = True

    def __init__(self, model: CrossEncoder, num_negatives: int | None = 4, scale: float = 10.0,
                 activation_fn: nn.Module | None = _SIGMOID):
        super().__init__(model)
        if num_negatives is not None and (isinstance(num_negatives, bool) or not isinstance(num_negatives, int)
                                          or num_negatives < 1):
            raise BertkitError(f"num_negatives must be a whole number >= 1 or None (all), got {num_negatives!r}")
        self.num_negatives, self.scale, self.activation_fn = num_negatives, scale, activation_fn
        self.cross_entropy_loss = nn.CrossEntropyLoss()

    def negative_columns(self, candidates: Sequence[Sequence[Text]]) -> list[list[Text]]:
        """For each in-batch negative slot, one candidate per anchor from the other rows' candidates."""
        batch, columns = len(candidates[0]), len(candidates)
        flat = [c for column in candidates for c in column]
        mask = ~torch.eye(batch, dtype=torch.bool).repeat(1, columns)  # (B, C*B): not the anchor's own candidates
        if self.num_negatives is not None and self.num_negatives < len(flat) - columns:
            indices = torch.multinomial(mask.float(), self.num_negatives)  # (B, num_negatives)
        else:
            indices = torch.arange(batch * columns).repeat(batch, 1)[mask].reshape(batch, -1)
        return [[flat[i] for i in row] for row in indices.T.tolist()]

    def forward(self, inputs: Sequence[Sequence[Text]], labels: Tensor | None = None) -> Tensor:
        anchors, batch = inputs[0], len(inputs[0])
        if batch < 2 and not inputs[2:]:
            raise BertkitError("MultipleNegativesRankingLoss needs negatives: a batch of 1 row without hard-negative "
                               "columns has none; use a batch of 2 or more")
        columns = [list(inputs[1]), *self.negative_columns(inputs[1:]), *map(list, inputs[2:])]
        logits = self.logits(list(anchors) * len(columns), [c for column in columns for c in column])
        logits = logits.reshape(len(columns), batch).T  # (B, 1 + negatives + hard negatives)
        if self.activation_fn:
            logits = self.activation_fn(logits)
        if self.scale:
            logits = logits * self.scale
        return self.cross_entropy_loss(logits, torch.zeros(batch, dtype=torch.long, device=logits.device))

    def get_config_dict(self) -> dict[str, Any]:
        return {"scale": self.scale, "num_negatives": self.num_negatives, "activation_fn": fullname(self.activation_fn)}


class _ListwiseLoss(CrossEncoderLoss):
    """A query and its documents per row, one label per document: the (B, D) logits and labels, padded where a
    row has fewer documents (logits -1e16, labels -inf, as sentence-transformers pads them)."""

    needs_label = True
    listwise = True

    def matrices(self, inputs: Sequence[Any], labels: Sequence[Tensor]) -> tuple[Tensor, Tensor]:
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
        return logit_matrix, label_matrix


class ListNetLoss(_ListwiseLoss):
    """ListNet (Cao et al., 2007): cross-entropy between the softmax of the labels and of the logits per query."""

    def __init__(self, model: CrossEncoder, activation_fn: nn.Module | None = _IDENTITY,
                 mini_batch_size: int | None = None):
        super().__init__(model, mini_batch_size)
        self.activation_fn = activation_fn or nn.Identity()

    def forward(self, inputs: Sequence[Any], labels: Sequence[Tensor]) -> Tensor:
        logits, target = self.matrices(inputs, labels)
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


class LambdaLoss(_ListwiseLoss):
    """LambdaLoss (Wang et al., 2018): pairwise logistic losses between each query's documents, weighted by
    ``weighting_scheme`` (NDCG-Loss2++ by default), over the pairs with a document in the top ``k``."""

    def __init__(self, model: CrossEncoder, weighting_scheme: BaseWeightingScheme | None = None, k: int | None = None,
                 sigma: float = 1.0, eps: float = 1e-10, reduction_log: Literal["natural", "binary"] = "binary",
                 activation_fn: nn.Module | None = _IDENTITY, mini_batch_size: int | None = None):
        super().__init__(model, mini_batch_size)
        if reduction_log not in ("natural", "binary"):
            raise BertkitError(f"reduction_log must be 'natural' or 'binary', got {reduction_log!r}")
        self.weighting_scheme = weighting_scheme if weighting_scheme is not None else NDCGLoss2PPScheme()
        self.k, self.sigma, self.eps, self.reduction_log = k, sigma, eps, reduction_log
        self.activation_fn = activation_fn or nn.Identity()

    def forward(self, inputs: Sequence[Any], labels: Sequence[Tensor]) -> Tensor:
        logits, target = self.matrices(inputs, labels)
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
        diffs = (logits_sorted[:, :, None] - logits_sorted[:, None, :]).clamp(min=-1e8, max=1e8)
        diffs = diffs.masked_fill(torch.isnan(diffs), 0.0)
        losses = weights * F.logsigmoid(self.sigma * diffs)
        if self.reduction_log == "binary":
            losses = losses / math.log(2)
        kept = losses[pairs & top_k]
        return -kept.sum() / max(kept.numel(), 1)

    def get_config_dict(self) -> dict[str, Any]:
        return {"weighting_scheme": fullname(self.weighting_scheme), "k": self.k, "sigma": self.sigma, "eps": self.eps,
                "reduction_log": self.reduction_log, "activation_fn": fullname(self.activation_fn),
                "mini_batch_size": self.mini_batch_size}


__all__ = ["CrossEncoderLoss", "BinaryCrossEntropyLoss", "MultipleNegativesRankingLoss", "LambdaLoss", "ListNetLoss",
           "BaseWeightingScheme", "NoWeightingScheme", "NDCGLoss1Scheme", "NDCGLoss2Scheme", "LambdaRankScheme",
           "NDCGLoss2PPScheme"]
