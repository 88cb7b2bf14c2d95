"""TripletEvaluator: how often the model puts an anchor closer to its positive than to its negative (by more than a
margin), per similarity function, as sentence-transformers computes it (same keys, same numbers)."""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Any

from bertkit.errors import BertkitError
from bertkit.sentence.evaluation.base import (
    EmbeddingEvaluator,
    ResultsCsv,
    prefixed,
    refuse_one_text,
    results_csv_name,
)
from bertkit.sentence.finite import refuse_nan_scores
from bertkit.sentence.util import SIMILARITY_FUNCTIONS, similarity_function


class TripletEvaluator(ResultsCsv, EmbeddingEvaluator):
    """``{name}_{fn}_accuracy``: the fraction of triplets with sim(anchor, positive) > sim(anchor, negative) +
    margin[fn], for each of ``similarity_fn_names`` (by default the model's), and ``max_accuracy`` over several.
    Anchors are encoded as queries, positives and negatives as documents (the model's prompts for each). With an
    ``output_path``: ``triplet_evaluation[_{name}]_results.csv``."""

    def __init__(self, anchors: Sequence[str], positives: Sequence[str], negatives: Sequence[str],
                 main_similarity_function: str | None = None, margin: float | dict[str, float] | None = None,
                 name: str = "", batch_size: int = 16, show_progress_bar: bool = False, write_csv: bool = True,
                 truncate_dim: int | None = None, similarity_fn_names: list[str] | None = None,
                 main_distance_function: str | None = None):
        main_similarity_function = main_similarity_function or main_distance_function  # its older name
        refuse_one_text("TripletEvaluator", anchors=anchors, positives=positives, negatives=negatives)
        if not len(anchors) == len(positives) == len(negatives):
            raise BertkitError(f"TripletEvaluator: {len(anchors)} anchors, {len(positives)} positives and "
                               f"{len(negatives)} negatives; give one positive and one negative per anchor")
        if not len(anchors):  # a numpy array of texts has no truth value
            raise BertkitError("TripletEvaluator: no triplets to evaluate")
        self.anchors, self.positives, self.negatives = list(anchors), list(positives), list(negatives)
        self.main_similarity_function = similarity_function(main_similarity_function) \
            if main_similarity_function else None
        self.similarity_fn_names = [similarity_function(n) for n in similarity_fn_names or []] or (
            [self.main_similarity_function] if self.main_similarity_function else [])
        if margin is None or isinstance(margin, dict):
            unknown = sorted(set(margin or {}) - set(SIMILARITY_FUNCTIONS))
            if unknown:
                raise BertkitError(f"TripletEvaluator: margin has the keys {unknown}, not among {sorted(SIMILARITY_FUNCTIONS)}")
            self.margin = {k: 0.0 for k in SIMILARITY_FUNCTIONS} | dict(margin or {})
        elif isinstance(margin, (int, float)) and not isinstance(margin, bool):
            self.margin = {k: float(margin) for k in SIMILARITY_FUNCTIONS}
        else:
            raise BertkitError(f"TripletEvaluator: margin must be a number or {{similarity: number}}, got {margin!r}")
        bad = {k: v for k, v in self.margin.items() if isinstance(v, bool) or not isinstance(v, numbers.Real)
               or not math.isfinite(v)}
        if bad:  # a NaN margin counted every triplet as wrong (accuracy 0), as in sentence-transformers
            raise BertkitError(f"TripletEvaluator: margin {bad} is not a finite number; give a number (0 for none)")
        self.name, self.batch_size, self.show_progress_bar = name, batch_size, show_progress_bar
        self.truncate_dim, self.write_csv = truncate_dim, write_csv
        self.primary_metric: str | None = None
        self.csv_file = results_csv_name("triplet_evaluation", name)

    def __call__(self, model: Any, output_path: str | None = None, epoch: int = -1, steps: int = -1) -> dict[str, float]:
        anchors = self.embed(model, self.anchors, "query")
        positives = self.embed(model, self.positives, "document")
        negatives = self.embed(model, self.negatives, "document")
        names = self.similarity_fn_names or [model.similarity_fn_name]
        metrics: dict[str, float] = {}
        for fn in names:
            pairwise = SIMILARITY_FUNCTIONS[fn][1]
            positive, negative = pairwise(anchors, positives), pairwise(anchors, negatives)
            refuse_nan_scores(positive, f"TripletEvaluator ({fn})", "anchor and positive of triplet")
            refuse_nan_scores(negative, f"TripletEvaluator ({fn})", "anchor and negative of triplet")
            hits = positive > negative + self.margin[fn]
            metrics[f"{fn}_accuracy"] = hits.float().mean().item()
        self.write_results(output_path, ["epoch", "steps", *(f"accuracy_{fn}" for fn in names)],
                           [epoch, steps, *metrics.values()])
        if len(names) > 1:
            metrics["max_accuracy"] = max(metrics.values())
        main = f"{self.main_similarity_function}_accuracy" if self.main_similarity_function else (
            "max_accuracy" if len(names) > 1 else f"{names[0]}_accuracy")
        self.primary_metric = f"{self.name}_{main}" if self.name else main
        return prefixed(metrics, self.name)
