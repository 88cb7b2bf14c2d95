"""The base of the cross-encoder losses (``CrossEncoderLoss``): the model it trains, the columns and labels it takes,
and the pairs' logits through the model, in slices of ``mini_batch_size``; sentence-transformers' default
activations, shared by the losses.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from bertkit.errors import BertkitError
from bertkit.sentence.cross_encoder.model import CrossEncoder

Text = str | list[int]
# sentence-transformers' default activations: stateless modules, one shared instance each
IDENTITY, SIGMOID = nn.Identity(), nn.Sigmoid()


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
