"""EmbeddingSimilarityEvaluator: Pearson and Spearman correlation between gold scores of sentence pairs and
the similarity of their embeddings (STS benchmarks), as sentence-transformers computes them."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from bertkit.errors import BertkitError
from bertkit.sentence.evaluation.base import (
    EmbeddingEvaluator,
    ResultsCsv,
    prefixed,
    refuse_one_text,
    results_csv_name,
)
from bertkit.sentence.finite import refuse_nan_scores
from bertkit.sentence.quantization import PRECISIONS
from bertkit.sentence.util import SIMILARITY_FUNCTIONS, similarity_function
from bertkit.tasks.metrics import pearson, spearman


def correlations(scores: list[float], predicted: np.ndarray) -> tuple[float, float]:
    """Pearson and Spearman of gold ``scores`` and a model's similarities or scores, refusing predictions that are
    all equal (sentence-transformers reports that undefined correlation as NaN; ``gold_scores`` refused it already
    for the gold side)."""
    if np.ptp(predicted) == 0:
        raise BertkitError(f"a correlation is undefined: the model's similarities or scores are all equal "
                           f"({predicted[0]}); evaluate a model that tells the pairs apart")
    return pearson(scores, predicted), spearman(scores, predicted)


def gold_scores(scores: Any, who: str) -> list[float]:
    """The gold scores of a correlation evaluator as floats, refusing what has no correlation: a string (scipy ranks
    strings as text, "10" before "9", so sentence-transformers' Spearman is of the text), a NaN or an infinity
    (sentence-transformers reports a NaN for both correlations, or, for an infinity, Pearson NaN and a Spearman
    that ranks it highest: 0.7 on five STS pairs), and scores that are all equal (NaN there)."""
    scores = list(scores)
    for i, value in enumerate(scores):
        if isinstance(value, (str, bytes)):
            raise BertkitError(f"{who}: score {i} is the string {value!r}; give the gold scores as numbers "
                               f"(float({value!r}))")
        try:
            finite = np.isfinite(float(value))
        except (TypeError, ValueError):  # None, a list: float() says only that it cannot
            finite = False
        if not finite:
            raise BertkitError(f"{who}: gold score {i} is {value}; a correlation needs a finite number for each "
                               "pair: fill in or drop that pair")
    if len(set(map(float, scores))) < 2:
        raise BertkitError(f"{who}: {len(scores)} gold score(s), all equal ({scores[:3]}); a correlation needs at "
                           "least two different scores")
    return [float(v) for v in scores]


def _scored_as_floats(quantized: torch.Tensor, precision: str) -> torch.Tensor:
    """Quantized embeddings as sentence-transformers scores them: float32 codes, bits unpacked (binary's codes
    shifted back by 128 first; the padding bits of a width that is no multiple of 8 included)."""
    codes = quantized.cpu().numpy()
    if precision in ("binary", "ubinary"):
        codes = np.unpackbits((codes.astype(np.int16) + 128 if precision == "binary" else codes).astype(np.uint8), axis=1)
    return torch.from_numpy(codes.astype(np.float32))


class EmbeddingSimilarityEvaluator(ResultsCsv, EmbeddingEvaluator):
    """``pearson_{fn}`` and ``spearman_{fn}`` for each similarity function (by default the model's). With an
    ``output_path``: ``similarity_evaluation[_{name}]_results.csv``."""

    def __init__(self, sentences1: list[str], sentences2: list[str], scores: list[float], batch_size: int = 16,
                 main_similarity: str | None = None, similarity_fn_names: list[str] | None = None, name: str = "",
                 show_progress_bar: bool = False, write_csv: bool = True, precision: str | None = None,
                 truncate_dim: int | None = None):
        refuse_one_text("EmbeddingSimilarityEvaluator", sentences1=sentences1, sentences2=sentences2)
        if not len(sentences1) == len(sentences2) == len(scores):
            raise BertkitError(f"EmbeddingSimilarityEvaluator: {len(sentences1)} sentences1, {len(sentences2)} "
                               f"sentences2 and {len(scores)} scores; give one score per pair")
        scores = gold_scores(scores, "EmbeddingSimilarityEvaluator")
        if precision is not None and precision not in PRECISIONS:
            raise BertkitError(f"EmbeddingSimilarityEvaluator: precision {precision!r} is not one of {PRECISIONS}")
        self.sentences1, self.sentences2, self.scores = list(sentences1), list(sentences2), list(scores)
        self.precision = precision
        self.batch_size, self.show_progress_bar, self.name, self.truncate_dim = batch_size, show_progress_bar, name, truncate_dim
        self.main_similarity = similarity_function(main_similarity) if main_similarity else None
        self.similarity_fn_names = [similarity_function(n) for n in similarity_fn_names or []] or (
            [self.main_similarity] if self.main_similarity else [])
        self.primary_metric: str | None = None
        self.write_csv = write_csv
        self.csv_file = results_csv_name("similarity_evaluation", name, precision)

    def encode_options(self) -> dict[str, Any]:
        # sentence-transformers encodes at a given precision normalized, float32 included: dot, euclidean and
        # manhattan then score unit vectors
        quantized = {"precision": self.precision} if self.precision not in (None, "float32") else {}
        return super().encode_options() | {"normalize_embeddings": self.precision is not None, **quantized}

    def __call__(self, model: Any, output_path: str | None = None, epoch: int = -1, steps: int = -1) -> dict[str, float]:
        if self.precision in ("int8", "uint8"):  # buckets from both sides at once: a sentence gets one code, as there
            both = self.embed(model, [*self.sentences1, *self.sentences2])
            e1, e2 = both[:len(self.sentences1)], both[len(self.sentences1):]
        else:
            e1, e2 = self.embed(model, self.sentences1), self.embed(model, self.sentences2)
        if self.precision not in (None, "float32"):
            e1, e2 = _scored_as_floats(e1, self.precision), _scored_as_floats(e2, self.precision)
        names = self.similarity_fn_names or [model.similarity_fn_name]
        metrics: dict[str, float] = {}
        for fn in names:
            sims = SIMILARITY_FUNCTIONS[fn][1](e1, e2)
            refuse_nan_scores(sims, f"EmbeddingSimilarityEvaluator ({fn})", "pair")
            sims = sims.cpu().numpy()
            metrics[f"pearson_{fn}"], metrics[f"spearman_{fn}"] = correlations(self.scores, sims)
        self.write_results(output_path, ["epoch", "steps", *(f"{fn}_{m}" for fn in names for m in ("pearson", "spearman"))],
                           [epoch, steps, *(metrics[f"{m}_{fn}"] for fn in names for m in ("pearson", "spearman"))])
        if len(names) > 1:
            metrics["pearson_max"] = max(metrics[f"pearson_{fn}"] for fn in names)
            metrics["spearman_max"] = max(metrics[f"spearman_{fn}"] for fn in names)
        main = f"spearman_{self.main_similarity}" if self.main_similarity else (
            "spearman_max" if len(names) > 1 else f"spearman_{names[0]}")
        self.primary_metric = f"{self.name}_{main}" if self.name else main
        return prefixed(metrics, self.name)
