"""``finetune classify``: a sequence classifier (or regressor) fine-tuned on users' own labelled CSV, TSV or JSONL
files, through the same grid as GLUE (``sequence_grid``).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from decimal import Decimal
from pathlib import Path
from typing import Any

from bertkit.errors import BertkitError
from bertkit.settings import ClassifySettings, first
from bertkit.tasks import glue
from bertkit.training.finetune_run import checkpoint_tokenizer
from bertkit.training.sequence_grid import fit_sequence_classifier

logger = logging.getLogger("bertkit")


def read_labelled(path: Path, s: ClassifySettings, tokenizer: Any) -> list[glue.GlueExample]:
    """Rows of a CSV/TSV/JSONL file as examples (id = the row's position), read and checked as ``bertkit predict``
    reads its inputs (``inference.files.read_inputs``, with the model's ``tokenizer``): a bad row names its file and
    line."""
    from bertkit.inference.files import Columns, read_inputs

    columns = Columns(text=s.text_column, text_pair=s.text_pair_column, label=s.label_column)
    items, _ = read_inputs(path, "text-classification", columns, s.input_format, tokenizer=tokenizer,
                           max_line_bytes=s.max_line_bytes, rows=True)
    return [glue.GlueExample(id=str(i), text_a=x["text"], text_b=x.get("text_pair"), label=x.get("label"),
                             line=x["line"]) for i, x in enumerate(items)]


def _number(text: str) -> float | None:
    """The number a label spells (``"3.8"``, ``"nan"``, ``"-inf"``), or None for a class name: ``"1_2"`` too, which
    Python's float reads as 12 where pandas (and so run_glue.py) reads a name (sorted as text, not as 12)."""
    if "_" in text:
        return None
    try:
        return float(text)
    except ValueError:
        return None


def _is_number(text: str) -> bool:
    value = _number(text)
    return value is not None and math.isfinite(value)


# How spreadsheets and pandas (read_csv's na_values) write a missing value, lower-cased; "nan" parses as a number.
_MISSING = frozenset({"na", "n/a", "#n/a", "<na>", "null", "none"})

# pandas' read_csv na_values as written (case matters: "None" is missing to pandas, "none" a name): among class names
# such a label is most likely an exported missing value (R's write.csv writes NA), which run_glue.py's reader reads as
# missing, and cannot sort among the names.
_PANDAS_MISSING = frozenset({"#N/A", "#N/A N/A", "#NA", "-1.#IND", "-1.#QNAN", "-NaN", "-nan", "1.#IND", "1.#QNAN",
                             "<NA>", "N/A", "NA", "NULL", "NaN", "None", "n/a", "nan", "null"})

# A classification whose training rows average fewer than this many per class is almost surely a mistake:
# a numeric score read as class names, or the wrong column taken as the label.
_ROWS_PER_CLASS_WARNING = 2.0


# Spellings of a boolean that pandas (so run_glue.py) reads as one value: "True", "TRUE" and "true" are one class there.
_BOOLEANS = frozenset({"true", "false"})


def _refuse_two_spellings(train: Sequence[glue.GlueExample], numeric: bool, where: str | Path) -> None:
    """Two labels that are one number (``1`` and ``1.0``; ``0.5`` and ``.50``, in a column of numbers) or one boolean
    (``True`` and ``TRUE``) written two ways are refused: as text they would be two classes, where pandas reads
    one."""
    first_spelling: dict[Any, glue.GlueExample] = {}
    for e in train:
        value = _value(e.label, numeric)
        if value is None:
            continue
        other = first_spelling.setdefault(value, e)
        if other.label != e.label:
            raise BertkitError(f"{where}: labels {other.label!r} (line {other.line}) and {e.label!r} (line {e.line}) "
                               f"are the same {'number' if numeric else 'boolean'} written two ways, so they would be "
                               "two classes; write each class one way")


def _value(label: str, numeric: bool) -> Any:
    """What pandas reads ``label`` as, where two spellings can be one value: a number (``numeric``: ``1`` and
    ``1.0``) or a boolean (``True`` and ``TRUE``); None for any other label."""
    return Decimal(label) if numeric else label.lower() if label.lower() in _BOOLEANS else None


def _same_class(label: str, names: Sequence[str]) -> str | None:
    """The class among ``names`` that ``label`` spells another way: one number (``1.0`` for ``1``) or one boolean
    (``TRUE`` for ``True``); None when there is none."""
    value = _value(label, _is_number(label))
    return next((n for n in names if value is not None and _value(n, _is_number(n)) == value), None)


def classify_task(train: Sequence[glue.GlueExample], problem_type: str, name: str, pairs: bool,
                  source: str | Path | None = None) -> glue.GlueTask:
    """The task the labels describe: class names (sorted, numerically when they are all numbers) or regression.
    A numeric label column holding a NaN, an infinity or a missing value (``NA``, ``null``) is refused (it would
    become a class), as are two spellings of one class number (``1`` and ``1.0``) or boolean (``True`` and ``TRUE``);
    ``source`` names where."""
    where = f"{source}:" if source is not None else "line "
    labels = [e.label for e in train]
    values = [_number(x) for x in labels]
    numeric = all(v is not None for v in values)
    if numeric:  # a numeric column: every value must be a usable number
        bad = next((e for e, v in zip(train, values) if not math.isfinite(v)), None)
        if bad is not None:
            raise BertkitError(f"{where}{bad.line}: label {bad.label!r} is not a finite number; the label column "
                               "holds numbers, so a NaN or infinity is a missing or broken value, not a class: fix "
                               "or remove that row")
    # A column of numbers with a cell the way spreadsheets and pandas write a missing value: not a class.
    blank = next((e for e, v in zip(train, values) if v is None and e.label.lower() in _MISSING), None)
    if blank is not None and any(v is not None for v in values):
        raise BertkitError(f"{where}{blank.line}: label {blank.label!r} among numbers is a missing value, not a "
                           "class: fill in or remove that row")
    regression = problem_type == "regression" or (problem_type == "auto" and numeric and any(v != int(v) for v in values))
    if problem_type == "regression" and not numeric:
        bad = next(e for e, v in zip(train, values) if v is None)
        raise BertkitError(f"--problem-type regression needs numeric labels; {where}{bad.line} has {bad.label!r}")
    if regression:
        names = None
    else:
        distinct = set(labels)
        if len(distinct) < 2:
            raise BertkitError(f"the training labels hold only {sorted(distinct)}: classification needs at least "
                               "two classes (pass --problem-type regression for a numeric score)")
        # A column of numbers (whole, or with fractions under --problem-type classification: half-star ratings) holds
        # classes that are values, as pandas reads them: 1 and 1.0 one class, in numeric order (0.5, 2.5, 10.5), not
        # as text. Decimal, not float: integers past 2**53 (ids as classes) are distinct numbers, as pandas reads them
        _refuse_two_spellings(train, numeric, source or name)
        names = tuple(sorted(distinct, key=Decimal if numeric else None))
        missing = [e for e in train if e.label in _PANDAS_MISSING]
        if missing and not numeric:  # a class still (a "None" category may be meant), but said
            logger.warning("%s:%d: the class %r (%d training rows) is how spreadsheets and pandas write a missing "
                           "label (run_glue.py's reader reads it as one); if those rows have no label, remove them, "
                           "else ignore this", source or name, missing[0].line, missing[0].label, len(missing))
        if len(names) > 2 and len(labels) / len(names) < _ROWS_PER_CLASS_WARNING:
            fix = ("the labels are numbers: if they are a score, pass --problem-type regression" if numeric else
                   "check that --label-column names the label column (not a text column)")
            logger.warning("%s: %d classes in %d training rows: nearly every row is its own class, which a "
                           "classifier cannot learn; %s", source or name, len(names), len(labels), fix)
    # Two classes: accuracy (which class is "positive" is not known, so no binary F1); more: macro F1 as well,
    # which a majority-class model cannot inflate the way it does accuracy on skewed classes.
    kind = "corr" if names is None else "acc" if len(names) == 2 else "acc_macro_f1"
    return glue.GlueTask(name=name, data_dir="", files={}, labels=names, metric_kind=kind, submission_file="",
                         text_columns=("text", "text_pair") if pairs else ("text",), labeled_layout=None,
                         test_layout=None)  # type: ignore[arg-type]


def finetune_classify(s: ClassifySettings) -> dict[str, Any]:
    """``bertkit finetune classify``: fit_sequence_classifier on the user's files. Their best run's predictions for
    other files come from ``bertkit predict text-classification --model OUTPUT_DIR/best``."""
    tokenizer, s = checkpoint_tokenizer(s)  # the model's: its weights load later
    every_train_row = read_labelled(s.train_file, s, tokenizer)
    dev_examples = first(read_labelled(s.validation_file, s, tokenizer), s.max_eval_samples)
    # The classes (or a regression) are the whole training file's, as run_glue.py takes its label list before
    # --max-train-samples selects rows: the first N rows may lack a class, or hold only the whole numbers of a score.
    pairs = every_train_row[0].text_b is not None  # --text-pair-column, or a text_pair column no flag names
    if dev_examples and (dev_examples[0].text_b is not None) != pairs:  # a model trained on pairs, scored on texts
        kinds = ("(text, text_pair) pairs", "single texts")
        raise BertkitError(f"{s.train_file} holds {kinds[not pairs]} and {s.validation_file} {kinds[pairs]}: the "
                           "model is scored on what it was trained on; give both files the same columns")
    task = classify_task(every_train_row, s.problem_type, s.train_file.stem, pairs, source=s.train_file)
    train_examples = first(every_train_row, s.max_train_samples)
    if task.labels is not None:
        unknown = [e for e in dev_examples if e.label not in task.labels]
        if unknown:
            label = unknown[0].label
            same = _same_class(label, task.labels)
            fix = (f"it is the class {same!r} written another way (as pandas reads both): write it {same!r}"
                   if same is not None else f"add training rows of it to {s.train_file}, or remove the validation "
                   "rows of a class the model cannot predict")
            raise BertkitError(f"{s.validation_file}:{unknown[0].line}: label {label!r} never occurs in "
                               f"{s.train_file} (its labels: {', '.join(task.labels)}); {fix}")
    else:
        bad = next((e for e in dev_examples if not _is_number(e.label)), None)
        if bad is not None:
            raise BertkitError(f"{s.validation_file}:{bad.line}: label {bad.label!r} is not a finite number; "
                               "regression needs a number in every row: fix or remove that row")
        if len({float(e.label) for e in dev_examples}) < 2:  # checked before training, not found after it
            raise BertkitError(f"{s.validation_file}: every label is {dev_examples[0].label}, so the correlations "
                               "regression is scored by (Pearson, Spearman) are undefined; validate on rows with "
                               "differing scores")
    return fit_sequence_classifier(task, train_examples, dev_examples, s, tokenizer)
