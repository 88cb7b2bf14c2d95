"""Distillation from a teacher's scores (a cross-encoder's, usually): MarginMSELoss (Hofstätter et al., 2021,
arXiv:2010.02666) and DistillKLDivLoss (Lin et al., 2020, arXiv:2010.11386), as sentence-transformers 6 computes
them. The sparse losses of the same names are these on a SparseEncoder's embeddings. From a teacher's embeddings
(Reimers and Gurevych, 2020, arXiv:2004.09813: a multilingual student of an English teacher): EmbedDistillLoss
and MSELoss."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from bertkit.errors import BertkitError
from bertkit.sentence.losses.base import SentenceLoss, check_positive
from bertkit.sentence.util import pairwise_dot_score

logger = logging.getLogger("bertkit")


def _labels(name: str, labels: Tensor | None, what: str) -> Tensor:
    if labels is None:
        raise BertkitError(f"{name} needs the teacher's scores as the label column ('label' or 'score'): {what}")
    return labels


def _pairwise(loss: Any, a: Tensor, b: Tensor) -> Tensor:
    """``loss.similarity_fct`` of each row of ``a`` with its row of ``b``: (B,). A matrix similarity (cos_sim: every
    row with every row, (B, B)) would broadcast against the labels into another loss, or fail inside torch."""
    scores = loss.similarity_fct(a, b)
    if scores.shape != a.shape[:1]:
        raise BertkitError(f"{type(loss).__name__}: similarity_fct gave scores of the shape {tuple(scores.shape)} for "
                           f"{len(a)} pairs; it must score each row with its own pair, as util.pairwise_dot_score "
                           "and util.pairwise_cos_sim do, not every row with every row (cos_sim, dot_score)")
    return scores


class MarginMSELoss(SentenceLoss):
    """Columns (query, positive, negative_1, ..., negative_n) and the teacher's margins: the mean squared error
    between the student's margins sim(q, pos) - sim(q, neg_i) and the teacher's. The label is the n margins, one
    margin for n = 1, or the teacher's n + 1 scores (positive first), from which the margins are taken."""

    columns = (3, None)
    needs_label = True

    def __init__(self, model: nn.Module, similarity_fct: Callable[[Tensor, Tensor], Tensor] = pairwise_dot_score):
        super().__init__(model)
        self.similarity_fct = similarity_fct
        self.loss_fct = nn.MSELoss()

    def compute_loss_from_embeddings(self, embeddings: list[Tensor], labels: Tensor | None) -> Tensor:
        query, positive, negatives = embeddings[0], embeddings[1], embeddings[2:]
        B, n = query.shape[0], len(negatives)
        labels = _labels(type(self).__name__, labels, "the margins")
        if labels.shape == (B, n + 1):  # the teacher's scores, positive first
            labels = labels[:, :1] - labels[:, 1:]
        if labels.shape == (B,):
            labels = labels.unsqueeze(1)
        if labels.shape != (B, n):
            raise BertkitError(f"{type(self).__name__}: labels of the shape {tuple(labels.shape)} for {B} rows and "
                               f"{n} negative column(s); give per row the {n} margin(s) sim(q, pos) - sim(q, neg_i), "
                               f"or the teacher's {n + 1} scores (positive first)")
        scores = _pairwise(self, query, positive)  # (B,)
        margins = torch.stack([scores - _pairwise(self, query, neg) for neg in negatives], dim=1)  # (B, n)
        return self.loss_fct(margins, labels.detach().to(margins.dtype))


class DistillKLDivLoss(SentenceLoss):
    """Columns (query, candidate_1, ..., candidate_n), n >= 2, and the teacher's n scores per row: the KL divergence
    from the teacher's softmax over the candidates (scores / teacher_temperature) to the student's (similarities
    / student_temperature), times student_temperature squared, averaged over the rows."""

    columns = (3, None)
    needs_label = True

    def __init__(self, model: nn.Module, similarity_fct: Callable[[Tensor, Tensor], Tensor] = pairwise_dot_score,
                 temperature: float = 1.0, student_temperature: float | None = None,
                 teacher_temperature: float | None = None):
        super().__init__(model)
        self.similarity_fct, self.temperature = similarity_fct, temperature
        self.student_temperature = student_temperature if student_temperature is not None else temperature
        self.teacher_temperature = teacher_temperature if teacher_temperature is not None else temperature
        for name in ("temperature", "student_temperature", "teacher_temperature"):
            check_positive(type(self).__name__, name, getattr(self, name))
        self.loss_fct = nn.KLDivLoss(reduction="batchmean")
        self._checked_teacher = False

    def compute_loss_from_embeddings(self, embeddings: list[Tensor], labels: Tensor | None) -> Tensor:
        name = type(self).__name__
        query, candidates = embeddings[0], embeddings[1:]
        B, n = query.shape[0], len(candidates)
        labels = _labels(name, labels, f"{n} scores per row")
        if labels.shape != (B, n):
            raise BertkitError(f"{name}: teacher scores of the shape {tuple(labels.shape)}; give {n} per row (one per "
                               f"candidate column), ({B}, {n}) for this batch")
        student = torch.stack([_pairwise(self, query, c) for c in candidates], dim=1) / self.student_temperature
        teacher = torch.softmax(labels.detach().to(student.dtype) / self.teacher_temperature, dim=1)  # (B, n)
        if not self._checked_teacher:  # once: reading the scores back stalls an accelerator
            self._checked_teacher = True
            self._check_teacher(teacher, labels)
        return self.loss_fct(torch.log_softmax(student, dim=1), teacher) * self.student_temperature ** 2

    def _check_teacher(self, teacher: Tensor, scores: Tensor) -> None:
        """NaN scores would make every gradient NaN: refused. Scores so spread that the softmax gives some
        candidates exactly 0 leave them without gradient: warned, with the temperature that avoids it."""
        scores = scores.detach().float()
        if scores.isnan().any():
            raise BertkitError(f"{type(self).__name__}: the teacher scores hold NaN, which would make the loss and every "
                               "gradient NaN; check the label column holding them")
        collapsed = int((teacher == 0).sum())
        if collapsed and not scores.isinf().any():  # an infinite score excludes a candidate on purpose
            spread = (scores.max(dim=-1).values - scores.min(dim=-1).values).max().item()
            logger.warning("%s: teacher_temperature=%s gives %d of %d teacher probabilities exactly 0 (no gradient "
                           "for those candidates); the widest row spans %.1f: raise teacher_temperature above %.3g",
                           type(self).__name__, self.teacher_temperature, collapsed, teacher.numel(), spread,
                           spread / 100)


class EmbedDistillLoss(SentenceLoss):
    """Any number of text columns and the teacher's embedding of each row as the label, (B, D), or one per column,
    (B, C, D): each column's mean distance to its teacher embedding ("mse", "l2" or "cosine"), averaged over the
    columns. The student's width must be the teacher's: a learnt projection (``projection_dim``) is not
    implemented."""

    columns = (1, None)
    needs_label = True
    DISTANCES = ("mse", "l2", "cosine")

    def __init__(self, model: nn.Module, distance_metric: str = "cosine", projection_dim: int | None = None):
        super().__init__(model)
        if distance_metric not in self.DISTANCES:
            raise BertkitError(f"{type(self).__name__} distance_metric must be one of {list(self.DISTANCES)}, got "
                               f"{distance_metric!r}")
        if projection_dim is not None:
            raise BertkitError(f"{type(self).__name__}(projection_dim={projection_dim!r}) is not implemented in "
                               "bertkit: distil from a teacher of the student's width, or truncate the teacher's "
                               "embeddings to it")
        self.distance_metric, self.projection_dim = distance_metric, projection_dim

    def compute_loss_from_embeddings(self, embeddings: list[Tensor],
                                     labels: Tensor | Sequence[Tensor] | None) -> Tensor:
        """``labels``: the batch's label column, (B, D) or (B, C, D); or, as sentence-transformers 6.2's
        ``compute_loss_from_embeddings(embeddings, teacher_embeddings)`` takes them, one (B, D) tensor per column."""
        name = type(self).__name__
        if isinstance(labels, Sequence):  # a list of tensors failed with "'list' object has no attribute 'detach'"
            if len(labels) != len(embeddings):  # sentence-transformers' zip would leave the extra columns out
                raise BertkitError(f"{name}: {len(labels)} teacher embedding tensor(s) for {len(embeddings)} text "
                                   "column(s); give one (B, D) tensor per column")
            labels = torch.stack([torch.as_tensor(t) for t in labels], dim=1)  # (B, C, D)
        labels = _labels(name, labels, "a list of floats per row, the teacher's embedding of the row's text").detach()
        if labels.dim() == 2:
            teachers = [labels] * len(embeddings)
        elif labels.dim() == 3 and labels.shape[1] == len(embeddings):
            teachers = list(labels.unbind(1))
        else:
            raise BertkitError(f"{name}: labels of shape {tuple(labels.shape)}; give each row the teacher's embedding "
                               f"(B, D) or one per text column (B, {len(embeddings)}, D)")
        losses = []
        for student, teacher in zip(embeddings, teachers):
            if teacher.shape != student.shape:
                raise BertkitError(f"{name}: the teacher's embeddings are {tuple(teacher.shape)} and the student's "
                                   f"{tuple(student.shape)}; the widths must match")
            teacher = teacher.to(device=student.device, dtype=student.dtype)
            if self.distance_metric == "mse":
                losses.append(nn.functional.mse_loss(student, teacher))
            elif self.distance_metric == "l2":
                losses.append(torch.norm(student - teacher, dim=-1).mean())
            else:
                losses.append((1 - nn.functional.cosine_similarity(student, teacher, dim=-1)).mean())
        return torch.stack(losses).mean()


class MSELoss(EmbedDistillLoss):
    """EmbedDistillLoss with the mean squared error (sentence-transformers' multilingual distillation)."""

    def __init__(self, model: nn.Module, projection_dim: int | None = None):
        super().__init__(model, "mse", projection_dim)
