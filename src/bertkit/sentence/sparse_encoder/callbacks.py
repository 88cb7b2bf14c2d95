"""The regulariser warm-up sentence-transformers' sparse trainer applies by itself: SpladeLoss's FLOPS weights
start at 0 and rise to their set values over the first ``warmup_ratio`` of the steps, quadratically by default
(SPLADE v2, arXiv:2109.10086, section 3: the regulariser held back while the model learns to rank). The weight of
step s (the optimiser steps done before it) is w * (s / W) ** 2 (or s / W, "linear") for s < W =
max(1, int(max_steps * warmup_ratio)), w afterwards; ``SparseEncoderTrainer`` adds this callback for a SpladeLoss
unless one for the same loss is given."""

from __future__ import annotations

import math
from enum import Enum
from typing import Any

from bertkit.errors import BertkitError
from bertkit.sentence.sparse_encoder.losses import SpladeLoss
from bertkit.training.callbacks import TrainerCallback


class SchedulerType(Enum):
    """How the regulariser weights rise during the warm-up."""

    LINEAR = "linear"
    QUADRATIC = "quadratic"


class SpladeRegularizerWeightSchedulerCallback(TrainerCallback):
    """Sets ``loss``'s document and query regulariser weights at each step's beginning; see the module docstring.
    The weights reached are the loss's when the callback is made. Logged as ``document_regularizer_weight`` and
    ``query_regularizer_weight``."""

    def __init__(self, loss: SpladeLoss, scheduler_type: str | SchedulerType = SchedulerType.QUADRATIC,
                 warmup_ratio: float = 1 / 3):
        super().__init__()
        if not isinstance(loss, SpladeLoss):
            raise BertkitError(f"SpladeRegularizerWeightSchedulerCallback schedules a SpladeLoss's weights, got "
                               f"{type(loss).__name__}")
        try:
            scheduler_type = SchedulerType(getattr(scheduler_type, "value", scheduler_type).lower())
        except (AttributeError, ValueError):
            raise BertkitError(f"SpladeRegularizerWeightSchedulerCallback: scheduler_type {scheduler_type!r} is not "
                               f"one of {[t.value for t in SchedulerType]}") from None
        if isinstance(warmup_ratio, bool) or not isinstance(warmup_ratio, (int, float)) or \
                not (0 < warmup_ratio <= 1 and math.isfinite(warmup_ratio)):
            raise BertkitError(f"SpladeRegularizerWeightSchedulerCallback: warmup_ratio must be in (0, 1], got "
                               f"{warmup_ratio!r}")
        self.loss, self.scheduler_type, self.warmup_ratio = loss, scheduler_type, float(warmup_ratio)
        self.max_document_regularizer_weight = loss.document_regularizer_weight
        self.max_query_regularizer_weight = loss.query_regularizer_weight
        self._current_document_regularizer_weight = 0.0
        self._current_query_regularizer_weight = 0.0 if self.max_query_regularizer_weight is not None else None
        self.total_steps: int | None = None
        self.warmup_steps: int | None = None

    def weight(self, step: int, max_value: float | None) -> float | None:
        """The weight at ``step`` (optimiser steps done) for a set weight ``max_value``."""
        if self.warmup_steps is None or max_value is None or step >= self.warmup_steps:
            return max_value
        ratio = step / self.warmup_steps
        return max_value * (ratio if self.scheduler_type is SchedulerType.LINEAR else ratio ** 2)

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.total_steps = state.max_steps
        self.warmup_steps = max(1, int(self.total_steps * self.warmup_ratio))
        self.loss.document_regularizer_weight = self._current_document_regularizer_weight
        self.loss.query_regularizer_weight = self._current_query_regularizer_weight

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.warmup_steps is None:
            return
        self._current_document_regularizer_weight = self.weight(state.global_step, self.max_document_regularizer_weight)
        self._current_query_regularizer_weight = self.weight(state.global_step, self.max_query_regularizer_weight)
        self.loss.document_regularizer_weight = self._current_document_regularizer_weight
        self.loss.query_regularizer_weight = self._current_query_regularizer_weight

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, float] | None = None, **kwargs: Any) -> None:
        if logs is None:
            return
        logs["document_regularizer_weight"] = self._current_document_regularizer_weight
        if self._current_query_regularizer_weight is not None:
            logs["query_regularizer_weight"] = self._current_query_regularizer_weight
