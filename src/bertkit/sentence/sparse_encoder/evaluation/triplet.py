"""SparseTripletEvaluator: ``TripletEvaluator``'s accuracies on a sparse encoder's embeddings, and their sparsity as
sentence-transformers reports it: the mean active dimensions and sparsity ratio of the anchors, the positives and
the negatives."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from bertkit.sentence.evaluation.triplet import TripletEvaluator
from bertkit.sentence.sparse_encoder.evaluation.base import SparseEvaluator, sparsity


class SparseTripletEvaluator(SparseEvaluator, TripletEvaluator):
    """sentence-transformers' arguments: ``TripletEvaluator``'s with ``max_active_dims`` (None: the model's) in
    ``truncate_dim``'s place. Anchors are encoded as queries, positives and negatives as documents. Metric keys:
    the dense evaluator's (``{name}_dot_accuracy`` for a SPLADE model), then ``{name}_anchor_active_dims``,
    ``_anchor_sparsity_ratio`` and the same for ``positive`` and ``negative``."""

    def __init__(self, anchors: Sequence[str], positives: Sequence[str], negatives: Sequence[str],
                 main_similarity_function: str | None = None, margin: float | dict[str, float] | None = None,
                 name: str = "", batch_size: int = 16, show_progress_bar: bool = False, write_csv: bool = True,
                 max_active_dims: int | None = None, similarity_fn_names: list[str] | None = None,
                 main_distance_function: str | None = None):
        super().__init__(anchors, positives, negatives, main_similarity_function=main_similarity_function,
                         margin=margin, name=name, batch_size=batch_size, show_progress_bar=show_progress_bar,
                         write_csv=write_csv, similarity_fn_names=similarity_fn_names,
                         main_distance_function=main_distance_function)
        self.max_active_dims = max_active_dims
        self.sparsity_stats: dict[str, float] = {}

    def sparsity_of(self, model: Any, embedded: list[torch.Tensor]) -> dict[str, float]:
        anchors, positives, negatives = embedded
        return {**sparsity(model, anchors, "anchor"), **sparsity(model, positives, "positive"),
                **sparsity(model, negatives, "negative")}
