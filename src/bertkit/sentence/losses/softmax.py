"""SoftmaxLoss: the SBERT paper's NLI objective (Reimers and Gurevych, 2019, arXiv:1908.10084, section 3): a linear
classifier over (u, v, |u - v|) of a pair's embeddings, trained with cross-entropy on the pair's class, as
sentence-transformers 6 computes it.

The classifier is the loss's, not the model's: the trainer optimises it with the model, but ``model.save`` writes the
model alone, as sentence-transformers does (its directory holds no classifier; keep ``loss.classifier.state_dict()``
to reuse it)."""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from bertkit.errors import BertkitError, is_whole
from bertkit.sentence.losses.base import SentenceLoss, embed_columns


class SoftmaxLoss(SentenceLoss):
    """Columns (text1, text2) and a class per pair, an int from 0 to ``num_labels`` - 1 (or a row of
    ``num_labels`` class probabilities): ``loss_fct`` (cross-entropy) of ``classifier`` on the concatenation of u and
    v (``concatenation_sent_rep``), |u - v| (``concatenation_sent_difference``) and u * v
    (``concatenation_sent_multiplication``). Called without labels it returns the embeddings and the logits,
    ``([u, v], (B, num_labels))``, which ``LabelAccuracyEvaluator`` reads."""

    needs_label = True

    def __init__(self, model: nn.Module, embedding_dimension: int | None = None, num_labels: int | None = None,
                 concatenation_sent_rep: bool = True, concatenation_sent_difference: bool = True,
                 concatenation_sent_multiplication: bool = False, loss_fct: Callable[..., Tensor] | None = None,
                 sentence_embedding_dimension: int | None = None):
        super().__init__(model)
        name = type(self).__name__
        if sentence_embedding_dimension is not None:  # sentence-transformers' name before 6
            if embedding_dimension is not None:
                raise BertkitError(f"{name}: give embedding_dimension or its older name sentence_embedding_dimension, "
                                   "not both")
            embedding_dimension = sentence_embedding_dimension
        # the width the loss sees: encode's truncate_dim does not cut the embeddings trained on
        width = getattr(model, "_width", None) or model.get_sentence_embedding_dimension()
        if not is_whole(embedding_dimension) or embedding_dimension != width:
            # sentence-transformers builds the classifier for any width and fails at the first step inside the product
            raise BertkitError(f"{name}: embedding_dimension {embedding_dimension!r} is not the width of the model's "
                               f"embeddings, {width}; pass {width} (model.get_sentence_embedding_dimension() without a "
                               "truncate_dim)")
        if not is_whole(num_labels, 2):
            # one label: a softmax over one logit is 1, and the cross-entropy 0 at every step, training nothing
            raise BertkitError(f"{name}: num_labels must be a whole number >= 2 (the classes of the pairs), got "
                               f"{num_labels!r}; to regress a score per pair use CoSENTLoss or CosineSimilarityLoss")
        flags = {"concatenation_sent_rep": concatenation_sent_rep,
                 "concatenation_sent_difference": concatenation_sent_difference,
                 "concatenation_sent_multiplication": concatenation_sent_multiplication}
        # a flag read from the command line as the string "False" would be True to sentence-transformers
        odd = {k: v for k, v in flags.items() if not (isinstance(v, (bool, np.bool_)) or is_whole(v, 0, 1))}
        if odd:
            raise BertkitError(f"{name}: {', '.join(f'{k}={v!r}' for k, v in odd.items())}; each concatenation "
                               "flag is True or False")
        vectors = 2 * bool(concatenation_sent_rep) + bool(concatenation_sent_difference) + \
            bool(concatenation_sent_multiplication)
        if vectors == 0:
            raise BertkitError(f"{name}: concatenation_sent_rep, concatenation_sent_difference and "
                               "concatenation_sent_multiplication are all False, leaving the classifier no input; set "
                               "at least one True")
        self.num_labels = int(num_labels)
        self.concatenation_sent_rep = bool(concatenation_sent_rep)
        self.concatenation_sent_difference = bool(concatenation_sent_difference)
        self.concatenation_sent_multiplication = bool(concatenation_sent_multiplication)
        # drawn from torch's generator as sentence-transformers draws it (nn.Linear's own initialisation, on the
        # model's device): the same seed gives the same classifier in both
        self.classifier = nn.Linear(vectors * width, self.num_labels, device=model.device)
        self.loss_fct = nn.CrossEntropyLoss() if loss_fct is None else loss_fct

    def forward(self, sentence_features: Sequence[dict[str, Any]],
                labels: Tensor | None) -> Tensor | tuple[list[Tensor], Tensor]:
        if len(sentence_features) != 2:
            raise BertkitError(f"{self.describe_columns()}, got a batch of {len(sentence_features)} text column(s)")
        reps = embed_columns(self.model, sentence_features)
        u, v = reps
        parts = ([u, v] if self.concatenation_sent_rep else []) + \
            ([torch.abs(u - v)] if self.concatenation_sent_difference else []) + \
            ([u * v] if self.concatenation_sent_multiplication else [])
        logits = self.classifier(torch.cat(parts, 1).to(self.classifier.weight.dtype))  # (B, num_labels)
        if labels is None:
            return reps, logits
        labels = labels.to(logits.device)
        if labels.shape != logits.shape:  # class indices, one per pair
            labels = labels.reshape(-1)
            if labels.numel() != len(logits):
                raise BertkitError(f"{type(self).__name__}: {labels.numel()} labels for {len(logits)} pairs; give "
                                   f"each pair a class (or a row of {self.num_labels} class probabilities)")
            if isinstance(self.loss_fct, nn.CrossEntropyLoss):
                self._refuse_other_classes(labels)
        return self.loss_fct(logits, labels)

    def check_labels(self, labels: Sequence[Any], what: str) -> None:
        """A dataset's label column, checked before training: class indices in [0, num_labels), or rows of
        num_labels probabilities. A class read as a float (1.0, from a float column) or a label string
        ("entailment") stops sentence-transformers at its first step inside torch; an index past the classes stops it
        there with an index error (on a GPU, a device-side assert)."""
        if not isinstance(self.loss_fct, nn.CrossEntropyLoss):
            return  # another loss_fct takes what it takes
        values = [v.tolist() if hasattr(v, "tolist") else v for v in labels]
        for row, value in enumerate(values):
            if isinstance(value, (list, tuple)):
                if len(value) != self.num_labels or not all(isinstance(p, numbers.Real) for p in value):
                    raise BertkitError(f"{what}: row {row} has the label {str(value)[:60]}; a list label is the "
                                       f"{self.num_labels} class probabilities of the pair")
                continue
            if not is_whole(value, 0, self.num_labels - 1):
                fix = ("cast the column to integers: dataset.cast_column('label', Value('int64')) (from datasets "
                       "import Value)" if isinstance(value, float) and math.isfinite(value) and value.is_integer()
                       else "map the dataset's labels to those indices (label2id = {'entailment': 0, ...})")
                raise BertkitError(f"{what}: row {row} has the label {value!r}; SoftmaxLoss(num_labels="
                                   f"{self.num_labels}) takes a class index, an int from 0 to {self.num_labels - 1}: "
                                   f"{fix}")

    def _refuse_other_classes(self, labels: Tensor) -> None:
        if labels.is_floating_point():
            raise BertkitError(f"{type(self).__name__}: float labels {labels[:4].tolist()} where class indices go; "
                               "give ints from 0 to num_labels - 1 (or each pair a row of class probabilities)")
        ignore = self.loss_fct.ignore_index
        bad = labels[(labels != ignore) & ((labels < 0) | (labels >= self.num_labels))]
        if bad.numel():
            raise BertkitError(f"{type(self).__name__}: label {int(bad[0])} is not a class of num_labels="
                               f"{self.num_labels} (0 to {self.num_labels - 1}); map the labels to those indices")

    def get_config_dict(self) -> dict[str, Any]:
        return {"num_labels": self.num_labels, "concatenation_sent_rep": self.concatenation_sent_rep,
                "concatenation_sent_difference": self.concatenation_sent_difference,
                "concatenation_sent_multiplication": self.concatenation_sent_multiplication}
