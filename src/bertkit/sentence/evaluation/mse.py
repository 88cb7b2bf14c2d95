"""The distillation evaluators (Reimers and Gurevych, 2020, arXiv:2004.09813, a student trained on a teacher's
embeddings with ``losses.MSELoss``): MSEEvaluator and MSEEvaluatorFromDataFrame (100 x the mean squared difference of
the student's embeddings of the targets from the teacher's of the sources, returned negated: higher is better) and
TranslationEvaluator (how often a source's most similar target is its translation, and back), as
sentence-transformers computes them (same keys, same numbers, same CSV files)."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from bertkit.errors import BertkitError
from bertkit.sentence.evaluation.base import (
    EmbeddingEvaluator,
    ResultsCsv,
    prefixed,
    refuse_one_text,
    results_csv_name,
)
from bertkit.sentence.util import cos_sim


class _Distillation(ResultsCsv, EmbeddingEvaluator):
    """What the three share: texts embedded by ``encode`` at ``truncate_dim``, metric names prefixed by ``name``."""

    def _texts(self, **columns: Any) -> list[list[str]]:
        who = type(self).__name__
        refuse_one_text(who, **columns)
        lists = {what: list(texts) for what, texts in columns.items()}
        lengths = {len(texts) for texts in lists.values()}
        if len(lengths) > 1:
            raise BertkitError(f"{who}: " + " and ".join(f"{len(t)} {what}" for what, t in lists.items())
                               + "; give one target per source, in the same order")
        if lengths == {0}:
            raise BertkitError(f"{who}: no sentences to evaluate")
        for what, texts in lists.items():
            bad = next((i for i, t in enumerate(texts) if not isinstance(t, str)), None)
            if bad is not None:
                raise BertkitError(f"{who}: {what} {bad} is {type(texts[bad]).__name__} {str(texts[bad])[:60]!r}, not "
                                   "a text; give a string for each")
        return list(lists.values())

    def _vectors(self, model: Any, texts: list[str], whose: str) -> np.ndarray:
        """(N, D) float32 numpy, as ``encode(convert_to_numpy=True)`` gives them (a bf16 model's as float32)."""
        if model is None or not callable(getattr(model, "encode", None)):
            raise BertkitError(f"{type(self).__name__}: {whose} is {type(model).__name__}, not a model with encode(); "
                               "give the SentenceTransformer whose embeddings the student learns (teacher_model=)")
        return self.embed(model, texts).float().cpu().numpy()

    def _check_widths(self, teacher: np.ndarray, student: np.ndarray) -> None:
        if teacher.shape[1] != student.shape[1]:
            # numpy would broadcast (N, 1) against (N, D) into another number, or fail with its own message
            raise BertkitError(f"{type(self).__name__}: the teacher's embeddings have {teacher.shape[1]} dimensions "
                               f"and the model's {student.shape[1]}; the student must embed to the teacher's width "
                               "(or set truncate_dim to a width both have)")

    def _metrics(self, metrics: dict[str, float], primary: str) -> dict[str, float]:
        self.primary_metric = f"{self.name}_{primary}" if self.name else primary
        return prefixed(metrics, self.name)


class MSEEvaluator(_Distillation):
    """``{name}_negative_mse``: minus 100 x the mean over every dimension of (teacher(source) - model(target))^2.
    The teacher embeds the sources once, when the evaluator is made. With an ``output_path``:
    ``mse_evaluation_{name}_results.csv`` (two underscores when unnamed, as sentence-transformers names it), columns
    epoch, steps, MSE (the positive value x 100)."""

    def __init__(self, source_sentences: Sequence[str], target_sentences: Sequence[str], teacher_model: Any = None,
                 show_progress_bar: bool = False, batch_size: int = 32, name: str = "", write_csv: bool = True,
                 truncate_dim: int | None = None):
        sources, self.target_sentences = self._texts(source_sentences=source_sentences,
                                                     target_sentences=target_sentences)
        self.show_progress_bar, self.batch_size, self.name = show_progress_bar, batch_size, name
        self.truncate_dim, self.write_csv = truncate_dim, write_csv
        self.csv_file = f"mse_evaluation_{name}_results.csv"
        self.primary_metric = "negative_mse"
        self.source_embeddings = self._vectors(teacher_model, sources, "teacher_model")

    def __call__(self, model: Any, output_path: str | None = None, epoch: int = -1, steps: int = -1) -> dict[str, float]:
        target = self._vectors(model, self.target_sentences, "the model")
        self._check_widths(self.source_embeddings, target)
        mse = (((self.source_embeddings - target) ** 2).mean() * 100).item()  # float32, as numpy computes it there
        self.write_results(output_path, ["epoch", "steps", "MSE"], [epoch, steps, mse])
        return self._metrics({"negative_mse": -mse}, "negative_mse")


class MSEEvaluatorFromDataFrame(_Distillation):
    """MSEEvaluator over several (source column, target column) ``combinations`` of ``dataframe``, a list of dicts
    (one a row, a column's text by its name; sentence-transformers' name notwithstanding, not a pandas DataFrame:
    give ``df.to_dict("records")``). A row is used for a combination where both its texts are not blank. The metric
    is minus the mean of the combinations' MSEs; ``mse_evaluation[_{name}]_results.csv`` has a column
    ``{source}-{target}`` for each."""

    def __init__(self, dataframe: Sequence[Mapping[str, str]], teacher_model: Any,
                 combinations: Sequence[tuple[str, str]], batch_size: int = 8, name: str = "", write_csv: bool = True,
                 truncate_dim: int | None = None):
        self.show_progress_bar, self.batch_size, self.name = False, batch_size, name
        self.truncate_dim, self.write_csv = truncate_dim, write_csv
        self.csv_file = results_csv_name("mse_evaluation", name)
        self.primary_metric = "negative_mse"
        rows = _records(dataframe)
        combinations = [tuple(c) for c in combinations] if not isinstance(combinations, (str, Mapping)) else []
        if not combinations or any(len(c) != 2 for c in combinations):
            raise BertkitError(f"MSEEvaluatorFromDataFrame: combinations {combinations!r}; give a list of (source "
                               "column, target column) pairs, e.g. [('en', 'de')]")
        self.combinations = combinations
        self.data: dict[tuple[str, str], tuple[list[str], list[str]]] = {}
        for src, trg in combinations:
            pairs = []
            for i, row in enumerate(rows):
                for column in (src, trg):
                    if not isinstance(row.get(column), str):
                        has = f"{column!r} {repr(row[column])[:40]}, not a text" if column in row else f"no {column!r}"
                        raise BertkitError(f"MSEEvaluatorFromDataFrame: row {i} has {has}; every row holds each "
                                           "combination's columns as strings (an empty string skips the row)")
                if row[src].strip() and row[trg].strip():
                    pairs.append((row[src], row[trg]))
            if not pairs:
                raise BertkitError(f"MSEEvaluatorFromDataFrame: no row has both {src!r} and {trg!r}")
            self.data[(src, trg)] = ([s for s, _ in pairs], [t for _, t in pairs])
        sources = list(dict.fromkeys(s for src, _ in self.data.values() for s in src))
        self.teacher_embeddings = dict(zip(sources, self._vectors(teacher_model, sources, "teacher_model")))

    def __call__(self, model: Any, output_path: str | None = None, epoch: int = -1, steps: int = -1) -> dict[str, float]:
        scores = []
        for key in self.combinations:
            sources, targets = self.data[key]
            teacher = np.asarray([self.teacher_embeddings[s] for s in sources])
            student = self._vectors(model, targets, "the model")
            self._check_widths(teacher, student)
            scores.append(((teacher - student) ** 2).mean() * 100)  # float32 scalars, written as numpy prints them
        self.write_results(output_path, ["epoch", "steps", *(f"{s}-{t}" for s, t in self.combinations)],
                           [epoch, steps, *scores])
        return self._metrics({"negative_mse": -np.mean(scores).item()}, "negative_mse")


def _records(dataframe: Any) -> list[Mapping[str, Any]]:
    pandas = sys.modules.get("pandas")
    if pandas is not None and isinstance(dataframe, pandas.DataFrame):
        # iterated, a DataFrame gives its column names: sentence-transformers fails on the first with a TypeError
        raise BertkitError("MSEEvaluatorFromDataFrame takes a list of dicts, one a row; give the DataFrame's rows: "
                           "dataframe.to_dict('records')")
    rows = list(dataframe) if not isinstance(dataframe, (str, Mapping)) else [dataframe]
    bad = next((i for i, r in enumerate(rows) if not isinstance(r, Mapping)), None)
    if bad is not None or not rows or isinstance(dataframe, (str, Mapping)):
        what = "no rows" if not rows else f"row {bad or 0} is {type(rows[bad or 0]).__name__}"
        raise BertkitError(f"MSEEvaluatorFromDataFrame: {what}; give a list of dicts, one a row ({{'en': ..., "
                           "'de': ...}})")
    return rows


class TranslationEvaluator(_Distillation):
    """``{name}_src2trg_accuracy``: the fraction of sources whose most cosine-similar target has the text of their own
    target (a repeated target counts wherever it is), ``trg2src_accuracy`` the other way, and ``mean_accuracy``.
    With an ``output_path``: ``translation_evaluation[_{name}]_results.csv`` (epoch, steps, src2trg, trg2src).
    ``print_wrong_matches`` prints each source matched to another target, with the five best."""

    def __init__(self, source_sentences: Sequence[str], target_sentences: Sequence[str],
                 show_progress_bar: bool = False, batch_size: int = 16, name: str = "",
                 print_wrong_matches: bool = False, write_csv: bool = True, truncate_dim: int | None = None):
        self.source_sentences, self.target_sentences = self._texts(source_sentences=source_sentences,
                                                                   target_sentences=target_sentences)
        self.show_progress_bar, self.batch_size, self.name = show_progress_bar, batch_size, name
        self.print_wrong_matches, self.truncate_dim, self.write_csv = print_wrong_matches, truncate_dim, write_csv
        self.csv_file = results_csv_name("translation_evaluation", name)
        self.primary_metric = "mean_accuracy"

    def __call__(self, model: Any, output_path: str | None = None, epoch: int = -1, steps: int = -1) -> dict[str, float]:
        sources = self.embed(model, self.source_sentences)
        targets = self.embed(model, self.target_sentences)
        scores = cos_sim(sources, targets).float().cpu().numpy()  # (N, N)
        src2trg = self._correct(scores, self.source_sentences, self.target_sentences)
        trg2src = self._correct(scores.T, self.target_sentences, self.source_sentences, report=False)
        n = len(scores)
        metrics = {"src2trg_accuracy": src2trg / n, "trg2src_accuracy": trg2src / n}
        metrics["mean_accuracy"] = (metrics["src2trg_accuracy"] + metrics["trg2src_accuracy"]) / 2
        self.write_results(output_path, ["epoch", "steps", "src2trg", "trg2src"],
                           [epoch, steps, metrics["src2trg_accuracy"], metrics["trg2src_accuracy"]])
        return self._metrics(metrics, "mean_accuracy")

    def _correct(self, scores: np.ndarray, queries: list[str], candidates: list[str], report: bool = True) -> int:
        """How many rows' best candidate (the first of equal scores) has the text of the row's own."""
        best = scores.argmax(axis=1)
        correct = 0
        for i, j in enumerate(best):
            if candidates[i] == candidates[j]:
                correct += 1
            elif report and self.print_wrong_matches:
                print("\nIncorrect  : Source", i, "is most similar to target", j, "instead of target", i)
                print("Source     :", queries[i])
                print("Pred Target:", candidates[j], f"(Score: {scores[i][j]:.4f})")
                print("True Target:", candidates[i], f"(Score: {scores[i][i]:.4f})")
                for k in np.argsort(-scores[i], kind="stable")[:5]:
                    print("\t", k, f"(Score: {scores[i][k]:.4f})", candidates[k])
        return correct
