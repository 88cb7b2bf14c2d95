"""MultipleNegativesRankingLoss (InfoNCE with in-batch negatives) and its symmetric variant, as
sentence-transformers 6 computes them (same directions, partition modes and numbers)."""

from __future__ import annotations

import logging
import math
import numbers
from collections.abc import Callable

import torch
from torch import Tensor, nn

from bertkit.errors import BertkitError
from bertkit.sentence.losses.base import SentenceLoss, check_positive
from bertkit.sentence.util import cos_sim

DIRECTIONS = ("query_to_doc", "query_to_query", "doc_to_query", "doc_to_doc")
HARDNESS_MODES = (None, "in_batch_negatives", "hard_negatives", "all_negatives")
logger = logging.getLogger("bertkit")


class MultipleNegativesRankingLoss(SentenceLoss):
    """Columns (anchor, positive, negative_1, ..., negative_n): each anchor must score its own positive above
    every other document of the batch (the other rows' positives and all hard negatives), a cross-entropy over
    ``scale`` x similarity (scale = 1 / temperature). ``directions`` adds the symmetric terms; ``partition_mode``
    "joint" takes one softmax over all of them, "per_direction" one per direction, averaged. ``hardness_mode`` with
    ``hardness_strength`` alpha adds alpha x the similarity (without gradient) to the logits of the negatives it names, so the
    harder ones weigh more.
    ``gather_across_devices``: under torchrun, the negatives are every process's rows (losses/gather.py)."""

    columns = (2, None)
    in_batch_negatives = True

    def __init__(self, model: nn.Module, scale: float = 20.0, similarity_fct: Callable[[Tensor, Tensor], Tensor] = cos_sim,
                 gather_across_devices: bool = False, directions: tuple[str, ...] = ("query_to_doc",),
                 partition_mode: str = "joint", hardness_mode: str | None = None, hardness_strength: float = 0.0):
        super().__init__(model)
        name = type(self).__name__
        check_positive(name, "scale", scale)
        if hardness_mode not in HARDNESS_MODES:
            raise BertkitError(f"{name}: hardness_mode {hardness_mode!r} is not one of {HARDNESS_MODES}")
        if (isinstance(hardness_strength, bool) or not isinstance(hardness_strength, numbers.Real)
                or not 0 <= hardness_strength < math.inf):
            raise BertkitError(f"{name}: hardness_strength must be a finite number >= 0, got {hardness_strength!r}")
        if hardness_mode is not None and hardness_strength == 0:
            logger.warning("%s: hardness_mode=%r is set but hardness_strength=0.0, so hardness weighting has no "
                           "effect; give hardness_strength a positive value", name, hardness_mode)
        bad = [d for d in directions if d not in DIRECTIONS]
        if bad or "query_to_doc" not in directions:
            raise BertkitError(f"{name}: directions {tuple(directions)} must include 'query_to_doc' and be among {DIRECTIONS}")
        if partition_mode not in ("joint", "per_direction"):
            raise BertkitError(f"{name}: partition_mode {partition_mode!r} is not 'joint' or 'per_direction'")
        if partition_mode == "per_direction" and {"query_to_query", "doc_to_doc"} & set(directions):
            raise BertkitError(f"{name}: partition_mode 'per_direction' cannot take 'query_to_query' or 'doc_to_doc' "
                               "(their candidates never hold the positive); use partition_mode='joint'")
        self.scale, self.similarity_fct = scale, similarity_fct
        self.gather_across_devices = bool(gather_across_devices)
        self.directions, self.partition_mode = tuple(directions), partition_mode
        self.hardness_mode, self.hardness_strength = hardness_mode, float(hardness_strength)

    def compute_loss_from_embeddings(self, embeddings: list[Tensor], labels: Tensor | None = None) -> Tensor:
        queries, docs = embeddings[0], embeddings[1:]  # (B, D), n x (B, D)
        B = queries.size(0)
        docs_all = torch.cat(docs)  # (n*B, D): positives first, then each negative column
        rows = torch.arange(B, device=queries.device)
        sims = {"query_to_doc": self.similarity_fct(queries, docs_all)}  # (B, n*B)
        if "query_to_query" in self.directions:
            sims["query_to_query"] = self.similarity_fct(queries, queries).clone()
            sims["query_to_query"][rows, rows] = -torch.inf  # not itself
        if "doc_to_query" in self.directions:
            sims["doc_to_query"] = self.similarity_fct(queries, docs[0]).T  # (B, B): each positive vs every query
        if "doc_to_doc" in self.directions:
            same = torch.eye(B, device=queries.device, dtype=torch.bool).repeat(1, len(docs))  # its own documents
            sims["doc_to_doc"] = self.similarity_fct(docs_all, docs[0]).T.masked_fill(same, -torch.inf)
        penalty = self._hardness_penalty(sims["query_to_doc"], len(docs))
        sims = {k: v * self.scale for k, v in sims.items()}
        if penalty is not None:  # added after the scale: alpha x cos, not scaled by the temperature
            sims["query_to_doc"] = sims["query_to_doc"] + penalty
        positive = sims["query_to_doc"][rows, rows]
        if self.partition_mode == "joint":
            log_z = torch.logsumexp(torch.cat(list(sims.values()), dim=1), dim=1)
        else:
            log_z = sum(torch.logsumexp(s, dim=1) for s in sims.values()) / len(sims)
        return -(positive - log_z).mean()


    def _hardness_penalty(self, query_to_doc: Tensor, columns: int) -> Tensor | None:
        """``hardness_strength`` x the (B, n*B) similarities, without gradient, on the negatives ``hardness_mode``
        weighs (Lan et al. 2025, eq. 5): a harder negative weighs more in the softmax. "in_batch_negatives": the other
        rows' documents; "hard_negatives": the row's own hard negatives; "all_negatives": every document but its
        positive. None without one."""
        if self.hardness_mode is None or self.hardness_strength == 0:
            return None
        B = query_to_doc.size(0)
        own = torch.eye(B, device=query_to_doc.device, dtype=torch.bool).repeat(1, columns)  # (B, n*B): its documents
        if self.hardness_mode == "in_batch_negatives":
            left_out = own
        elif self.hardness_mode == "hard_negatives":
            left_out = ~own
            left_out[:, :B] = True  # the positives' column
        else:
            left_out = own
            left_out[:, B:] = False  # its own hard negatives weigh too
        return (self.hardness_strength * query_to_doc.detach()).masked_fill(left_out, 0.0)


class MultipleNegativesSymmetricRankingLoss(MultipleNegativesRankingLoss):
    """MultipleNegativesRankingLoss in both directions (anchor -> positives, positive -> anchors), one softmax each,
    averaged (sentence-transformers 6 defines it so)."""

    def __init__(self, model: nn.Module, scale: float = 20.0, similarity_fct: Callable[[Tensor, Tensor], Tensor] = cos_sim,
                 gather_across_devices: bool = False):
        super().__init__(model, scale, similarity_fct, gather_across_devices,
                         directions=("query_to_doc", "doc_to_query"), partition_mode="per_direction")
