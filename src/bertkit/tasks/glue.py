"""GLUE (Wang et al., 2018): read the nine tasks' TSV files, featurize, score, write submission files.

The column layouts are those of the files `download_glue_data.py` produces, as read by
google-research/bert `run_classifier.py` and Hugging Face's `glue_processors`:

    task    labeled files (train/dev)                         test files (no labels)
    CoLA    no header; source, label, marker, sentence         header; index, sentence
    SST-2   header; sentence, label                            header; index, sentence
    MRPC    header; label, #1 ID, #2 ID, #1 String, #2 String  header; index, #1 ID, #2 ID, #1 String, #2 String
    STS-B   header; index, genre, ..., sentence1, sentence2, score (10 columns)     same less score (9)
    QQP     header; id, qid1, qid2, question1, question2, is_duplicate            header; id, question1, question2
    MNLI    header; index, ..., sentence1 (8), sentence2 (9), ..., gold_label (last; 12 cols train, 16 dev)
            test: header; 10 columns (no labels). dev/test come as *_matched and *_mismatched.
    QNLI    header; index, question, sentence, label           header; index, question, sentence
    RTE     header; index, sentence1, sentence2, label         header; index, sentence1, sentence2
    WNLI    header; index, sentence1, sentence2, label         header; index, sentence1, sentence2
    AX      (diagnostic, test only) header; index, sentence1, sentence2; scored with an MNLI model

Files are UTF-8 with no quoting (a literal ``"`` is text): rows are split on tab only, and a ``\r`` inside a row
stays in its text (google's reader drops it, gluing two words; transformers' starts a new row there). A row with
another number of columns (or an empty line) is refused naming its file and line, where Hugging Face's QQP
processor skips a row too short for its questions or label without a word (GLUE's first QQP release had such
rows). Matched and mismatched MNLI are two entries ("mnli", "mnli-mm") sharing the training file, as in Hugging
Face's processors.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bertkit.errors import BertkitError, MissingFileError
from bertkit.outputs import atomic_write
from bertkit.tasks import metrics
from bertkit.tasks.files import read_lines
from bertkit.tokenization.encoding import segment_ids

logger = logging.getLogger("bertkit")


@dataclass(frozen=True)
class GlueExample:
    """One row. ``id`` is the file's index/id column (what a submission echoes), else the 0-based row number;
    ``line`` the 1-based line in the file."""

    id: str
    text_a: str
    text_b: str | None
    label: str | None  # the label as written in the file ("entailment", "1", "3.800"); None on test sets
    line: int


@dataclass(frozen=True)
class _Layout:
    """Where things are in one kind of file. ``n_columns`` lists every accepted column count."""

    n_columns: tuple[int, ...]
    header: bool
    text_a: int
    text_b: int | None
    label: int | None
    id: int | None


@dataclass(frozen=True)
class GlueTask:
    """One registry entry: how to read the task's files, its labels (None for regression), its metric (the
    leaderboard's numbers as fractions) and its submission name."""

    name: str
    data_dir: str
    files: Mapping[str, str]  # split ("train", "dev", "test") -> file name inside data_dir
    labels: tuple[str, ...] | None
    metric_kind: str
    submission_file: str
    text_columns: tuple[str, ...]
    labeled_layout: _Layout | None
    test_layout: _Layout

    @property
    def is_regression(self) -> bool:
        return self.labels is None

    @property
    def num_labels(self) -> int:
        """Output width of the classifier head: 1 for regression."""
        return 1 if self.labels is None else len(self.labels)

    def metric(self, predictions: np.ndarray, references: np.ndarray) -> dict[str, float]:
        return {name: score(references, predictions) for name, score in METRICS[self.metric_kind].items()}

    def label_order(self, id2label: Mapping[int, str]) -> list[int] | None:
        """For each of this task's labels in order, the output a checkpoint's ``id2label`` names it by, in whatever
        order and case it keeps them (roberta-large-mnli's CONTRADICTION, NEUTRAL, ENTAILMENT), as run_glue.py
        matches them; None when the names are not the task's labels."""
        if self.labels is None:
            return None
        names = [id2label[i] for i in range(len(id2label))]
        for fold in (str, str.lower):  # the exact names first: a user's classes may differ only in case
            folded, labels = [fold(n) for n in names], [fold(label) for label in self.labels]
            if sorted(folded) == sorted(labels) and len(set(labels)) == len(labels):
                return [folded.index(label) for label in labels]
        return None

    def output_order(self, id2label: Mapping[int, str], model: str | os.PathLike) -> list[int]:
        """For each of this task's labels in order, the model output that scores it, as run_glue.py reads a
        checkpoint: by its label names when they are the task's (``label_order``); else in output order
        (transformers' LABEL_0, LABEL_1, ...; other names, such as a sentiment model's negative, positive on SST-2,
        with a warning naming both)."""
        order = self.label_order(id2label)
        if order is not None:
            return order
        names = [id2label[i] for i in range(len(id2label))]
        if self.labels is not None and names != [f"LABEL_{i}" for i in range(len(names))]:
            logger.warning("%s names its outputs %s, not %s's labels %s: output i is read as label i (%s)", model, names,
                           self.name, list(self.labels), ", ".join(f"{n} = {t}" for n, t in zip(names, self.labels)))
        return list(range(len(names)))

    def read(self, path: str | os.PathLike, *, labeled: bool) -> list[GlueExample]:
        """Read one file of this task; ``labeled=False`` for the test files (which have no label column)."""
        layout = self.labeled_layout if labeled else self.test_layout
        if layout is None:
            raise BertkitError(f"GLUE task {self.name!r} has no labeled files (test only); pass labeled=False")
        return _read_tsv(self, Path(path), layout)


# Each metric kind's scores: name -> score(references, predictions). "acc_macro_f1" is for users' classes
# (finetune classify) when there are more than two.
METRICS: dict[str, dict[str, Any]] = {
    "mcc": {"mcc": metrics.matthews_corrcoef},
    "acc": {"accuracy": metrics.accuracy},
    "acc_macro_f1": {"accuracy": metrics.accuracy, "macro_f1": metrics.f1_macro},
    "f1_acc": {"f1": metrics.f1_binary, "accuracy": metrics.accuracy},
    "corr": {"pearson": metrics.pearson, "spearman": metrics.spearman},
}
_BIN = ("0", "1")
_NLI2 = ("entailment", "not_entailment")
_MNLI = ("contradiction", "entailment", "neutral")
_TRIPLE = (3,)  # index, s1, s2


def _pair_task(
    name: str, data_dir: str, labels: tuple[str, ...], sub: str, cols: tuple[str, str]
) -> GlueTask:
    """QNLI, RTE, WNLI share one layout: index, text_a, text_b, label."""
    return GlueTask(
        name, data_dir, {"train": "train.tsv", "dev": "dev.tsv", "test": "test.tsv"}, labels, "acc", sub, cols,
        _Layout((4,), True, 1, 2, 3, 0), _Layout(_TRIPLE, True, 1, 2, None, 0),
    )  # fmt: skip


def _mnli(name: str, which: str, sub: str) -> GlueTask:
    return GlueTask(
        name, "MNLI", {"train": "train.tsv", "dev": f"dev_{which}.tsv", "test": f"test_{which}.tsv"}, _MNLI,
        "acc", sub, ("sentence1", "sentence2"),
        _Layout((12, 16), True, 8, 9, -1, 0), _Layout((10,), True, 8, 9, None, 0),
    )  # fmt: skip


_STD = {"train": "train.tsv", "dev": "dev.tsv", "test": "test.tsv"}

GLUE_TASKS: dict[str, GlueTask] = {
    t.name: t
    for t in (
        GlueTask("cola", "CoLA", _STD, _BIN, "mcc", "CoLA.tsv", ("sentence",),
                 _Layout((4,), False, 3, None, 1, None), _Layout((2,), True, 1, None, None, 0)),
        GlueTask("sst-2", "SST-2", _STD, _BIN, "acc", "SST-2.tsv", ("sentence",),
                 _Layout((2,), True, 0, None, 1, None), _Layout((2,), True, 1, None, None, 0)),
        GlueTask("mrpc", "MRPC", _STD, _BIN, "f1_acc", "MRPC.tsv", ("#1 String", "#2 String"),
                 _Layout((5,), True, 3, 4, 0, None), _Layout((5,), True, 3, 4, None, 0)),
        GlueTask("sts-b", "STS-B", _STD, None, "corr", "STS-B.tsv", ("sentence1", "sentence2"),
                 _Layout((10,), True, 7, 8, 9, 0), _Layout((9,), True, 7, 8, None, 0)),
        GlueTask("qqp", "QQP", _STD, _BIN, "f1_acc", "QQP.tsv", ("question1", "question2"),
                 _Layout((6,), True, 3, 4, 5, 0), _Layout((3,), True, 1, 2, None, 0)),
        _mnli("mnli", "matched", "MNLI-m.tsv"),
        _mnli("mnli-mm", "mismatched", "MNLI-mm.tsv"),
        _pair_task("qnli", "QNLI", _NLI2, "QNLI.tsv", ("question", "sentence")),
        _pair_task("rte", "RTE", _NLI2, "RTE.tsv", ("sentence1", "sentence2")),
        _pair_task("wnli", "WNLI", _BIN, "WNLI.tsv", ("sentence1", "sentence2")),
        GlueTask("ax", "diagnostic", {"test": "diagnostic.tsv"}, _MNLI, "mcc", "AX.tsv", ("sentence1", "sentence2"),
                 None, _Layout(_TRIPLE, True, 1, 2, None, 0)),
    )
}  # fmt: skip


def _aliases(t: GlueTask) -> set[str]:
    names = {t.name, t.name.replace("-", ""), t.submission_file.removesuffix(".tsv").lower()}
    if t.name != "mnli-mm":  # "MNLI" the directory means matched, as in the GLUE paper's tables
        names.add(t.data_dir.lower())
    return names


_BY_ALIAS = {alias: t for t in GLUE_TASKS.values() for alias in _aliases(t)}


def get_task(task: str | GlueTask) -> GlueTask:
    """Look a task up by name, forgiving case and the hyphen ("SST-2", "sst2", "STS-B", "MNLI-mm")."""
    if isinstance(task, GlueTask):
        return task
    found = _BY_ALIAS.get(task.strip().lower())
    if found is None:
        raise BertkitError(f"unknown GLUE task {task!r}; known tasks: {', '.join(GLUE_TASKS)}")
    return found


def _read_tsv(task: GlueTask, path: Path, layout: _Layout) -> list[GlueExample]:
    if not path.is_file():
        raise MissingFileError(f"GLUE {task.name} file not found: {path}")
    examples: list[GlueExample] = []
    # Rows end at \n only: a stray \r inside a sentence must not split it and misreport the columns.
    for lineno, line in read_lines(path):
        cols = line.split("\t")
        if lineno == 1 and layout.header:
            # a file that lost its header would silently lose its first example (read as the header); one of the
            # other layout with as many columns (SST-2's dev file, sentence and label, as its test file's index and
            # sentence) would have its labels predicted and its sentences echoed as the index
            kind = " test" if layout.label is None else ""
            at = (layout.text_a,) if layout.text_b is None else (layout.text_a, layout.text_b)
            for i, name in zip(at, task.text_columns):
                if i >= len(cols) or cols[i] != name:
                    found = f"column {i + 1} is {cols[i]!r}" if i < len(cols) else f"it has {len(cols)} columns"
                    raise BertkitError(f"{path} line 1 is not the header {task.name}{kind} files start with ({found}, "
                                       f"not {name!r}); pass {task.name}'s{kind or ' train/dev'} file as the GLUE "
                                       "download has it, its header line included")
            continue
        if not line.strip():
            raise BertkitError(f"malformed row in {path} line {lineno}: empty line; GLUE files have none, remove it")
        if len(cols) not in layout.n_columns:
            labeled = task.labeled_layout
            hint = (" (as many as a train/dev file has: is this one read as the test split?)"
                    if layout.label is None and labeled is not None and len(cols) in labeled.n_columns else "")
            raise BertkitError(f"malformed row in {path} line {lineno}: expected "
                               f"{' or '.join(map(str, layout.n_columns))} tab-separated columns for {task.name}, "
                               f"got {len(cols)}{hint}")
        label = None
        if layout.label is not None:
            label = cols[layout.label]
            _check_label(task, label, path, lineno)
        examples.append(
            GlueExample(
                id=cols[layout.id] if layout.id is not None else str(len(examples)),
                text_a=cols[layout.text_a],
                text_b=cols[layout.text_b] if layout.text_b is not None else None,
                label=label,
                line=lineno,
            )
        )
    if not examples:
        raise BertkitError(f"{path} holds no examples (an empty {task.name} file); every split must have rows")
    return examples


def _check_label(task: GlueTask, label: str, path: Path, lineno: int) -> None:
    if task.labels is None:
        try:
            score = float(label)
        except ValueError:
            raise BertkitError(
                f"malformed row in {path} line {lineno}: {task.name} score {label!r} is not a number"
            ) from None
        if not (math.isfinite(score) and 0.0 <= score <= 5.0):
            raise BertkitError(
                f"malformed row in {path} line {lineno}: {task.name} score {label!r} is outside [0, 5] "
                "(similarity scores are finite numbers from 0 to 5)")
    elif label not in task.labels:
        raise BertkitError(
            f"malformed row in {path} line {lineno}: label {label!r} is not one of {list(task.labels)} "
            f"for {task.name}; is this the right task's file?"
        )


def read_glue(task: str | GlueTask, data_dir: str | os.PathLike, split: str) -> list[GlueExample]:
    """Read ``split`` ("train", "dev" or "test") of ``task`` from ``data_dir``, the GLUE download's root."""
    t = get_task(task)
    if split not in t.files:
        fix = ("; AX is predicted with a model fine-tuned on MNLI: bertkit finetune glue --task mnli, then bertkit "
               "predict glue --task ax --model RUN/best" if t.name == "ax" else "")
        raise BertkitError(f"GLUE {t.name} has no split {split!r}; it has {sorted(t.files)}{fix}")
    return t.read(Path(data_dir) / t.data_dir / t.files[split], labeled=split != "test")


def featurize(
    examples: Sequence[GlueExample], tokenizer: Any, max_seq_length: int, task: str | GlueTask
) -> list[dict[str, Any]]:
    """Tokenize into ``[CLS] a [SEP] (b [SEP])`` without padding, long pairs cut as transformers' run_glue cuts them
    (``truncation="longest_first"``: from the longer segment, then from both once they are equal; on a tie
    google-research/bert's ``_truncate_seq_pair`` cuts text_b, so for some pairs it keeps one token more of a and one
    less of b); ``labels`` (class index, or float for regression) when the example has one."""
    t = get_task(task)
    n_special = len(t.text_columns) + 1  # [CLS] and one [SEP] per segment
    if max_seq_length < n_special + 1:
        raise BertkitError(
            f"max_seq_length {max_seq_length} leaves no room for text; use at least {n_special + 1}"
        )
    features: list[dict[str, Any]] = []
    chunk = 512  # tokenize in batches: fast tokenizers parallelise a list, slow ones just loop
    for start in range(0, len(examples), chunk):
        batch = examples[start : start + chunk]
        a = [e.text_a for e in batch]
        b = [e.text_b for e in batch] if batch[0].text_b is not None else None
        enc = tokenizer(a, text_pair=b, max_length=max_seq_length, truncation="longest_first")
        for i, ex in enumerate(batch):
            types = segment_ids(enc)  # zeros where the tokenizer's model_input_names leaves them out
            feat: dict[str, Any] = {"input_ids": list(enc["input_ids"][i]), "token_type_ids": list(types[i]),
                                    "attention_mask": list(enc["attention_mask"][i])}
            if ex.label is not None:
                feat["labels"] = float(ex.label) if t.labels is None else t.labels.index(ex.label)
            features.append(feat)
    return features


def write_submission(
    task: str | GlueTask, predictions: Sequence[Any], ids: Sequence[str], path: str | os.PathLike
) -> Path:
    """Write a GLUE-server submission file (``index\\tprediction`` rows: label names, or STS-B scores to three
    decimals, not clipped to [0, 5], as run_glue.py writes them; GLUE's baseline clips its scores); a directory
    ``path`` gets the task's standard file name. Returns the path written."""
    t = get_task(task)
    if len(predictions) != len(ids):
        raise BertkitError(f"{len(predictions)} predictions but {len(ids)} ids; pass one id per prediction")
    out = Path(path)
    if out.is_dir():
        out = out / t.submission_file
    rows = []
    for i, (pid, pred) in enumerate(zip(ids, predictions, strict=True)):
        if t.labels is None:
            value = f"{float(pred):.3f}"
        else:
            k = int(pred)
            if k != pred or not 0 <= k < len(t.labels):
                raise BertkitError(
                    f"prediction {i} is {pred!r}; {t.name} expects a class index in 0..{len(t.labels) - 1}"
                )
            value = t.labels[k]
        rows.append(f"{pid}\t{value}\n")
    with atomic_write(out) as f:  # never through a symlink already there
        f.write("index\tprediction\n")
        f.writelines(rows)
    return out
