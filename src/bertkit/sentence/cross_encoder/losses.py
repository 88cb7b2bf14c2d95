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

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from bertkit.errors import BertkitError, is_whole
from bertkit.sentence.cross_encoder.model import CrossEncoder, fullname
from bertkit.sentence.losses.cached import check_mini_batch, grad_cached

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
    one_label: ClassVar[bool] = True  # scores one relevance logit a pair (all but CrossEntropyLoss)

    def __init__(self, model: CrossEncoder, mini_batch_size: int | None = None):
        super().__init__()
        if not isinstance(model, CrossEncoder):
            raise BertkitError(f"{type(self).__name__} needs a bertkit.sentence.cross_encoder.CrossEncoder, got "
                               f"{type(model).__name__}")
        if self.one_label and model.num_labels != 1:
            raise BertkitError(f"{type(self).__name__} needs a model with 1 output label; this one has "
                               f"{model.num_labels}: load it with CrossEncoder(path, num_labels=1)")
        if mini_batch_size is not None and (isinstance(mini_batch_size, bool) or not isinstance(mini_batch_size, int)):
            raise BertkitError(f"mini_batch_size must be a whole number or None, got {mini_batch_size!r}")
        self.model, self.mini_batch_size = model, mini_batch_size

    def scores(self, firsts: Sequence[Text], seconds: Sequence[Text], chunk: int | None = None) -> Tensor:
        """(N, num_labels) logits of the pairs, through the model in slices of ``chunk`` pairs (all at once
        without)."""
        if not chunk or chunk <= 0 or chunk >= len(firsts):  # one pass (no copy through torch.cat)
            return self.model.scores(self.model.pair_batch(firsts, seconds))
        return torch.cat([self.model.scores(self.model.pair_batch(firsts[s:s + chunk], seconds[s:s + chunk]))
                          for s in range(0, len(firsts), chunk)])

    def logits(self, firsts: Sequence[Text], seconds: Sequence[Text], chunk: int | None = None) -> Tensor:
        """(N,) logits of the pairs of a one-label model (``scores``)."""
        return self.scores(firsts, seconds, chunk).view(-1)

    def pair_columns(self, inputs: Sequence[Sequence[Text]]) -> None:
        if len(inputs) != 2:
            raise BertkitError(f"{type(self).__name__} takes two text columns, got {len(inputs)}")

    def labels_per_pair(self, labels: Tensor | None, pairs: int) -> Tensor:
        if labels is None or labels.numel() != pairs:
            raise BertkitError(f"{type(self).__name__} needs one label per pair: {pairs} pairs, "
                               f"{0 if labels is None else labels.numel()} labels")
        return labels.view(-1)

    def check_labels(self, labels: Sequence[Any], what: str) -> None:
        """Refuse, before training, dataset labels this loss cannot learn from (``CrossEncoderExamples`` gives every
        row's; a missing or non-numeric one is the Trainer's to name)."""

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
    identity by default), ``pos_weight`` weighting the positives. Keyword arguments go to torch's
    ``nn.BCEWithLogitsLoss`` (``reduction``, ``weight``), as sentence-transformers passes them."""

    needs_label = True

    def __init__(self, model: CrossEncoder, activation_fn: nn.Module = _IDENTITY, pos_weight: Tensor | None = None,
                 **kwargs: Any):
        super().__init__(model)
        self.activation_fn, self.pos_weight = activation_fn, pos_weight
        self.bce_with_logits_loss = nn.BCEWithLogitsLoss(pos_weight=pos_weight, **kwargs)

    def check_labels(self, labels: Sequence[Any], what: str) -> None:
        # A target outside [0, 1] is no probability: BCE trains on it without a word (a label 3 pulls the logit up
        # for ever), and the score learned reads as relevance no more.
        for row, value in enumerate(labels):
            v = value.item() if hasattr(value, "item") else value
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and not 0 <= v <= 1:
                raise BertkitError(f"{what}: row {row} has label {v!r}, and BinaryCrossEntropyLoss takes a label in "
                                   "[0, 1] (1 relevant, 0 not, or a probability between); rescale the labels into "
                                   "[0, 1] (a 0-5 score divided by 5), or regress them with MSELoss")

    def forward(self, inputs: Sequence[Sequence[Text]], labels: Tensor) -> Tensor:
        self.pair_columns(inputs)
        logits = self.activation_fn(self.logits(inputs[0], inputs[1]))
        return self.bce_with_logits_loss(logits, self.labels_per_pair(labels, len(logits)).float().to(logits.device))

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
        if num_negatives is not None and not is_whole(num_negatives):
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
        firsts, seconds = self.pairs(inputs)
        return self.loss_from_logits(self.logits(firsts, seconds), len(inputs[0]))

    def pairs(self, inputs: Sequence[Sequence[Text]]) -> tuple[list[Text], list[Text]]:
        """The pairs to score, column by column: each anchor with its positive, with each in-batch negative slot's
        candidate, with each hard negative."""
        # a batch of 1 row without hard negatives (a dataset's last, short batch) has its positive alone: loss 0, as
        # in sentence-transformers, whose trainer steps on through it (bertkit refused it, ending the training there)
        anchors = inputs[0]
        columns = [list(inputs[1]), *self.negative_columns(inputs[1:]), *map(list, inputs[2:])]
        return list(anchors) * len(columns), [c for column in columns for c in column]

    def loss_from_logits(self, logits: Tensor, batch: int) -> Tensor:
        """The loss of the (B * columns,) logits of ``pairs``."""
        logits = logits.reshape(-1, batch).T  # (B, 1 + negatives + hard negatives)
        if self.activation_fn:
            logits = self.activation_fn(logits)
        if self.scale:
            logits = logits * self.scale
        return self.cross_entropy_loss(logits, torch.zeros(batch, dtype=torch.long, device=logits.device))

    def get_config_dict(self) -> dict[str, Any]:
        return {"scale": self.scale, "num_negatives": self.num_negatives, "activation_fn": fullname(self.activation_fn)}


class CachedMultipleNegativesRankingLoss(MultipleNegativesRankingLoss):
    """MultipleNegativesRankingLoss computed with GradCache (bertkit.sentence.losses.cached): the pairs scored in
    mini-batches of ``mini_batch_size``, so a batch of any size with many negatives trains in a mini-batch's memory,
    with the uncached loss's value and gradients."""

    def __init__(self, model: CrossEncoder, num_negatives: int | None = 4, scale: float = 10.0,
                 activation_fn: nn.Module | None = _SIGMOID, mini_batch_size: int = 32,
                 show_progress_bar: bool = False):
        super().__init__(model, num_negatives, scale, activation_fn)
        self.mini_batch_size = check_mini_batch(type(self).__name__, mini_batch_size)

    def forward(self, inputs: Sequence[Sequence[Text]], labels: Tensor | None = None) -> Tensor:
        firsts, seconds = self.pairs(inputs)
        m = self.mini_batch_size
        pieces = [lambda s=s: self.logits(firsts[s:s + m], seconds[s:s + m]) for s in range(0, len(firsts), m)]
        return grad_cached(pieces, lambda parts: self.loss_from_logits(torch.cat(parts), len(inputs[0])),
                           self.model, self.model.device)

    def get_config_dict(self) -> dict[str, Any]:
        return {**super().get_config_dict(), "mini_batch_size": self.mini_batch_size}


class CrossEntropyLoss(CrossEncoderLoss):
    """(text, text) pairs with a class index per pair, for a model with several labels (NLI's entailment, neutral,
    contradiction): cross-entropy over its logits after ``activation_fn`` (identity by default). Keyword arguments
    go to torch's ``nn.CrossEntropyLoss`` (``weight``, ``label_smoothing``, ``ignore_index``, ...), as
    sentence-transformers passes them. The default loss of a model with more than one label."""

    needs_label = True
    one_label = False

    def __init__(self, model: CrossEncoder, activation_fn: nn.Module = _IDENTITY, **kwargs: Any):
        super().__init__(model)
        self.activation_fn = activation_fn
        self.ce_loss = nn.CrossEntropyLoss(**kwargs)

    def forward(self, inputs: Sequence[Sequence[Text]], labels: Tensor) -> Tensor:
        self.pair_columns(inputs)
        logits = self.activation_fn(self.scores(inputs[0], inputs[1]))  # (N, num_labels)
        labels = labels.to(logits.device)
        if not labels.is_floating_point():
            labels = self.labels_per_pair(labels, len(logits))
            self._refuse_other_classes(labels, "CrossEntropyLoss")
        return self.ce_loss(logits, labels)

    def check_labels(self, labels: Sequence[Any], what: str) -> None:
        # A class id read as a float (1.0: a float column) is no target torch's cross-entropy takes beside (N, C)
        # logits: sentence-transformers stops at the first step with "expected target dtype to be Long or Byte, but
        # got Float"; refused here with the row. A row's list of class probabilities (a tensor) is a soft target.
        ids = [v.item() if isinstance(v, Tensor) and v.ndim == 0 or isinstance(v, np.generic) else v for v in labels]
        bools = [i for i, v in enumerate(ids) if isinstance(v, bool)]
        if bools:  # torch's cross-entropy takes no bool target either: sentence-transformers stops at the first step
            raise BertkitError(f"{what}: row {bools[0]} has label {ids[bools[0]]!r}, a bool, and CrossEntropyLoss takes "
                               f"a class index, an int from 0 to {self.model.num_labels - 1}: cast the column to "
                               "integers: dataset.cast_column('label', Value('int64')) (from datasets import Value), "
                               "or int() each; for a relevant/not label, a one-label model with BinaryCrossEntropyLoss "
                               "takes True/False as they are")
        floats = [i for i, v in enumerate(ids) if isinstance(v, float)]
        if floats:
            fractional = [i for i in floats if not ids[i].is_integer()]
            row, classes = (fractional or floats)[0], self.model.num_labels
            fix = ("map the labels to class indices (for a score to regress, load the model with num_labels=1 and "
                   "train with BinaryCrossEntropyLoss or MSELoss)" if fractional else "cast the column to integers: "
                   "dataset.cast_column('label', Value('int64')) (from datasets import Value), or int() each")
            raise BertkitError(f"{what}: row {row} has label {ids[row]!r}, a float, and CrossEntropyLoss takes a class "
                               f"index, an int from 0 to {classes - 1} (or a list of {classes} class probabilities); "
                               f"{fix}")
        if ids and all(isinstance(v, int) and not isinstance(v, bool) for v in ids):  # class ids
            self._refuse_other_classes(torch.tensor(ids), f"{what}: CrossEntropyLoss")

    def _refuse_other_classes(self, labels: Tensor, who: str) -> None:
        classes = self.model.num_labels
        bad = labels[(labels != self.ce_loss.ignore_index) & ((labels < 0) | (labels >= classes))]
        if bad.numel():
            raise BertkitError(f"{who}: label {int(bad[0])} is not a class of this model, whose {classes} labels are "
                               f"0 to {classes - 1} (config.json's id2label: {self.model.config.id2label}); map the "
                               "dataset's labels to those indices")


class MSELoss(CrossEncoderLoss):
    """(text, text) pairs with a target score per pair (a teacher's logit, to distil it): the mean squared error of
    the logit after ``activation_fn`` (identity by default). Keyword arguments go to torch's ``nn.MSELoss``."""

    needs_label = True

    def __init__(self, model: CrossEncoder, activation_fn: nn.Module = _IDENTITY, **kwargs: Any):
        super().__init__(model)
        self.activation_fn = activation_fn
        self.loss_fct = nn.MSELoss(**kwargs)

    def forward(self, inputs: Sequence[Sequence[Text]], labels: Tensor) -> Tensor:
        self.pair_columns(inputs)
        logits = self.activation_fn(self.logits(inputs[0], inputs[1]))
        return self.loss_fct(logits, self.labels_per_pair(labels, len(logits)).detach().float().to(logits.device))

    def get_config_dict(self) -> dict[str, Any]:
        return {"activation_fn": fullname(self.activation_fn)}


class MarginMSELoss(CrossEncoderLoss):
    """(query, positive, negative...) rows (Hofstaetter et al., 2021): the mean squared error between the model's
    margins, logit(query, positive) - logit(query, negative_i), and a teacher's. A row's label is its margins (one
    number per negative column) or the teacher's scores (positive first, then each negative's)."""

    columns = (3, None)
    needs_label = True

    def __init__(self, model: CrossEncoder, activation_fn: nn.Module = _IDENTITY, **kwargs: Any):
        super().__init__(model)
        self.activation_fn = activation_fn
        self.loss_fct = nn.MSELoss(**kwargs)

    def forward(self, inputs: Sequence[Sequence[Text]], labels: Tensor | Sequence[Tensor]) -> Tensor:
        anchors, negatives = inputs[0], len(inputs) - 2
        batch = len(anchors)
        labels = torch.stack(list(labels)) if isinstance(labels, (list, tuple)) else labels
        if labels.shape == (batch, negatives + 1):  # teacher scores: positive first
            labels = labels[:, :1] - labels[:, 1:]
        if labels.shape == (batch,):
            labels = labels.unsqueeze(1)
        if labels.shape != (batch, negatives):
            raise BertkitError(f"MarginMSELoss: labels of shape {tuple(labels.shape)} for {batch} rows with "
                               f"{negatives} negative column(s); give each row its {negatives} margin(s) "
                               f"(teacher's positive score - its negative's) or its {negatives + 1} scores, positive "
                               "first")
        # every pair of the step in one pass: the candidates column by column, as the reference's calls
        logits = self.activation_fn(self.logits(list(anchors) * (negatives + 1),
                                                [c for column in inputs[1:] for c in column]))
        logits = logits.reshape(negatives + 1, batch).T  # (B, 1 + negatives)
        margins = logits[:, :1] - logits[:, 1:]
        return self.loss_fct(margins, labels.detach().float().to(margins.device))

    def get_config_dict(self) -> dict[str, Any]:
        return {"activation_fn": fullname(self.activation_fn)}


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

    def __init__(self, model: CrossEncoder, activation_fn: nn.Module | None = _IDENTITY,
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
                 activation_fn: nn.Module | None = _IDENTITY, mini_batch_size: int | None = None):
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
                 reduction_log: Literal["natural", "binary"] = "binary", activation_fn: nn.Module | None = _IDENTITY,
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
                 activation_fn: nn.Module | None = _IDENTITY, mini_batch_size: int | None = None,
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

    def __init__(self, model: CrossEncoder, activation_fn: nn.Module | None = _IDENTITY,
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

    def __init__(self, model: CrossEncoder, alpha: float = 1.0, activation_fn: nn.Module | None = _IDENTITY,
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


__all__ = ["CrossEncoderLoss", "BinaryCrossEntropyLoss", "CrossEntropyLoss", "MSELoss", "MarginMSELoss",
           "MultipleNegativesRankingLoss", "CachedMultipleNegativesRankingLoss", "LambdaLoss", "RankNetLoss",
           "ListNetLoss", "PListMLELoss", "PListMLELambdaWeight", "ListMLELoss", "ADRMSELoss", "BaseWeightingScheme", "NoWeightingScheme",
           "NDCGLoss1Scheme", "NDCGLoss2Scheme", "LambdaRankScheme", "NDCGLoss2PPScheme"]
