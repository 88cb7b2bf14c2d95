"""SequentialEvaluator: several evaluators run one after another, their metrics merged, as sentence-transformers
runs them."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from bertkit.errors import BertkitError


class SequentialEvaluator:
    """Every evaluator's metrics in one dict, plus ``sequential_score``: ``main_score_function`` (by default the
    last) of the evaluators' primary metrics (an evaluator without one gives its first metric); 0.0 for no
    evaluators."""

    def __init__(self, evaluators: Iterable[Any], main_score_function: Callable[[list[float]], float] = lambda s: s[-1]):
        self.evaluators = list(evaluators)
        self.main_score_function = main_score_function
        self.primary_metric = "sequential_score"

    def __call__(self, model: Any, output_path: str | None = None, epoch: int = -1, steps: int = -1) -> dict[str, float]:
        results: dict[str, float] = {}
        scores = []
        for i, evaluator in enumerate(self.evaluators):
            metrics = evaluator(model, output_path, epoch, steps)
            if not isinstance(metrics, dict):  # an old-style evaluator returning one score
                metrics = {f"evaluator_{i}": metrics}
                scores.append(metrics[f"evaluator_{i}"])
            else:
                key = getattr(evaluator, "primary_metric", None) or next(iter(metrics))
                if key not in metrics:
                    raise BertkitError(f"SequentialEvaluator: evaluator {i} ({type(evaluator).__name__}) names the "
                                       f"primary metric {key!r}, which its results {sorted(metrics)} lack")
                scores.append(metrics[key])
            results.update(metrics)
        results["sequential_score"] = self.main_score_function(scores) if scores else 0.0
        return results
