"""The pointwise and pairwise cross-encoder losses (``sentence_transformers.cross_encoder.losses``): a label per pair
(``BinaryCrossEntropyLoss``, ``CrossEntropyLoss``, ``MSELoss``), a margin between two candidates (``MarginMSELoss``),
or an anchor's positive against its negatives and the batch's other rows (``MultipleNegativesRankingLoss`` and its
cached form). Each row is a tuple of text columns.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from bertkit.errors import BertkitError, is_whole
from bertkit.sentence.cross_encoder.losses.base import IDENTITY, SIGMOID, CrossEncoderLoss, Text
from bertkit.sentence.cross_encoder.model import CrossEncoder, fullname
from bertkit.sentence.losses.cached import check_mini_batch, grad_cached


class BinaryCrossEntropyLoss(CrossEncoderLoss):
    """(text, text) pairs with a label in [0, 1]: binary cross-entropy on the logit (after ``activation_fn``,
    identity by default), ``pos_weight`` weighting the positives. Keyword arguments go to torch's
    ``nn.BCEWithLogitsLoss`` (``reduction``, ``weight``), as sentence-transformers passes them."""

    needs_label = True

    def __init__(self, model: CrossEncoder, activation_fn: nn.Module = IDENTITY, pos_weight: Tensor | None = None,
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
                 activation_fn: nn.Module | None = SIGMOID):
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
                 activation_fn: nn.Module | None = SIGMOID, mini_batch_size: int = 32,
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

    def __init__(self, model: CrossEncoder, activation_fn: nn.Module = IDENTITY, **kwargs: Any):
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

    def __init__(self, model: CrossEncoder, activation_fn: nn.Module = IDENTITY, **kwargs: Any):
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

    def __init__(self, model: CrossEncoder, activation_fn: nn.Module = IDENTITY, **kwargs: Any):
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
