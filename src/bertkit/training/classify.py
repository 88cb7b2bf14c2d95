"""``finetune classify``: a sequence classifier (or regressor) fine-tuned on users' own labelled CSV, TSV or JSONL
files, through the same grid as GLUE (``sequence_grid``); predictions for a test file come from the
text-classification pipeline.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bertkit.errors import BertkitError, MissingFileError
from bertkit.outputs import atomic_write_json
from bertkit.settings import ClassifySettings, first
from bertkit.tasks import glue
from bertkit.training.distributed import current, process_device
from bertkit.training.sequence_grid import fit_sequence_classifier

logger = logging.getLogger("bertkit")


def read_labelled(path: Path, s: ClassifySettings, *, labelled: bool = True) -> list[glue.GlueExample]:
    """Rows of a CSV/TSV/JSONL file as examples (id = the row's position); a bad row names file and line.

    Every text read must hold a non-whitespace character (an empty cell is a missing value, not a text); a second
    text the settings do not name (a ``text_pair`` or ``sentence2`` column beside the text) is logged as a warning,
    since the model would then be trained and scored on the first text alone."""
    from bertkit.tasks.files import file_format, read_records, second_text_fields

    if not path.is_file():
        raise MissingFileError(f"data file not found: {path}")
    fmt = file_format(path, s.input_format)
    if fmt == "text":
        raise BertkitError(f"{path}: finetune classify reads CSV, TSV or JSONL files with named columns "
                           "(--text-column, --label-column), not plain text; name the format with --input-format")
    wanted = [c for c in (s.text_column, s.text_pair_column, s.label_column if labelled else None) if c]
    examples = []
    unnamed_pair: tuple[int, list[str]] | None = None
    for line, record in read_records(path, fmt, s.max_line_bytes):
        if not isinstance(record, dict):
            raise BertkitError(f"{path}:{line}: expected an object with {', '.join(wanted)}, "
                               f"got {type(record).__name__}")
        missing = [c for c in wanted if c not in record]
        if missing:
            raise BertkitError(f"{path}:{line}: no {', '.join(map(repr, missing))} column (it has "
                               f"{', '.join(map(str, record))}); name the columns with --text-column, "
                               "--text-pair-column and --label-column")
        if s.text_pair_column is None and unnamed_pair is None:
            found = second_text_fields(record, used=(s.text_column, s.label_column))
            unnamed_pair = (line, found) if found else None
        values = {c: record[c] for c in wanted}
        if fmt == "jsonl" and isinstance(values.get(s.label_column), (int, float)) \
                and not isinstance(values[s.label_column], bool):
            values[s.label_column] = repr(values[s.label_column])  # JSON numbers: read as written
        bad = [c for c, v in values.items() if not isinstance(v, str)]
        if bad:
            raise BertkitError(f"{path}:{line}: {bad[0]!r} must be a string or number, got "
                               f"{str(values[bad[0]])[:60]!r}")
        blank = next((c for c in (s.text_column, s.text_pair_column) if c and not values[c].strip()), None)
        if blank is not None:
            raise BertkitError(f"{path}:{line}: {blank!r} is {'empty' if not values[blank] else 'only whitespace'}; "
                               "every row needs its text: fill in or remove that row")
        label = values.get(s.label_column) if labelled else None
        if labelled and not label.strip():
            raise BertkitError(f"{path}:{line}: empty {s.label_column!r}")
        examples.append(glue.GlueExample(id=str(len(examples)), text_a=values[s.text_column],
                                         text_b=values.get(s.text_pair_column) if s.text_pair_column else None,
                                         label=label.strip() if label is not None else None, line=line))
    if not examples:
        raise BertkitError(f"{path} holds no rows")
    if unnamed_pair is not None:
        line, found = unnamed_pair
        kind = "field" if fmt == "jsonl" else "column"
        logger.warning("%s:%d: the rows hold a second text (%s %s) that no flag names, so the model reads the first "
                       "text alone; pass --text-pair-column %s to train on pairs", path, line, kind,
                       ", ".join(map(repr, found)), found[0])
    return examples


def _number(text: str) -> float | None:
    """The number a label spells (``"3.8"``, ``"nan"``, ``"-inf"``), or None for a class name."""
    try:
        return float(text)
    except ValueError:
        return None


def _is_number(text: str) -> bool:
    value = _number(text)
    return value is not None and math.isfinite(value)


# A classification whose training rows average fewer than this many per class is almost surely a mistake:
# a numeric score read as class names, or the wrong column taken as the label.
_ROWS_PER_CLASS_WARNING = 2.0


def classify_task(train: Sequence[glue.GlueExample], problem_type: str, name: str, pairs: bool,
                  source: str | Path | None = None) -> glue.GlueTask:
    """The task the labels describe: class names (sorted, numerically when they are all integers) or regression.

    ``source`` (the training file) names where a bad label is. A label column of numbers holding a NaN or an
    infinity is refused (a missing value written as ``nan`` would otherwise become a class of its own), as are
    two spellings of one class number (``1`` and ``1.0``); a classification with nearly one class per row
    is logged as a warning with the likely fix.
    """
    where = f"{source}:" if source is not None else "line "
    labels = [e.label for e in train]
    values = [_number(x) for x in labels]
    if all(v is not None for v in values):  # a numeric column: every value must be a usable number
        bad = next((e for e, v in zip(train, values) if not math.isfinite(v)), None)
        if bad is not None:
            raise BertkitError(f"{where}{bad.line}: label {bad.label!r} is not a finite number; the label column "
                               "holds numbers, so a NaN or infinity is a missing or broken value, not a class: fix "
                               "or remove that row")
    numeric = all(_is_number(x) for x in labels)
    regression = problem_type == "regression" or (
        problem_type == "auto" and numeric and any(float(x) != int(float(x)) for x in labels))
    if problem_type == "regression" and not numeric:
        bad = next(e for e in train if not _is_number(e.label))
        raise BertkitError(f"--problem-type regression needs numeric labels; {where}{bad.line} has {bad.label!r}")
    if regression:
        names = None
    else:
        distinct = set(labels)
        if len(distinct) < 2:
            raise BertkitError(f"the training labels hold only {sorted(distinct)}: classification needs at least "
                               "two classes (pass --problem-type regression for a numeric score)")
        integral = all(_is_number(x) and float(x) == int(float(x)) for x in distinct)
        if integral:
            first_spelling: dict[float, glue.GlueExample] = {}
            for e in train:
                other = first_spelling.setdefault(float(e.label), e)
                if other.label != e.label:
                    raise BertkitError(f"{source or name}: labels {other.label!r} (line {other.line}) and {e.label!r} "
                                       f"(line {e.line}) are the same number written two ways, so they would be two "
                                       "classes; write each class one way")
        names = tuple(sorted(distinct, key=(lambda x: float(x)) if integral else None))
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
    """``bertkit finetune classify``: fit_sequence_classifier on the user's files; predictions for --test-file."""
    train_examples = first(read_labelled(s.train_file, s), s.max_train_samples)
    dev_examples = first(read_labelled(s.validation_file, s), s.max_eval_samples)
    task = classify_task(train_examples, s.problem_type, s.train_file.stem, s.text_pair_column is not None,
                         source=s.train_file)
    if task.labels is not None:
        unknown = [e for e in dev_examples if e.label not in task.labels]
        if unknown:
            raise BertkitError(f"{s.validation_file}:{unknown[0].line}: label {unknown[0].label!r} never occurs in "
                               f"{s.train_file} (its labels: {', '.join(task.labels)})")
    else:
        bad = next((e for e in dev_examples if not _is_number(e.label)), None)
        if bad is not None:
            raise BertkitError(f"{s.validation_file}:{bad.line}: label {bad.label!r} is not a finite number; "
                               "regression needs a number in every row: fix or remove that row")
        if len({float(e.label) for e in dev_examples}) < 2:  # checked before training, not found after it
            raise BertkitError(f"{s.validation_file}: every label is {dev_examples[0].label}, so the correlations "
                               "regression is scored by (Pearson, Spearman) are undefined; validate on rows with "
                               "differing scores")
    test_examples = read_labelled(s.test_file, s, labelled=False) if s.test_file is not None else None
    report = fit_sequence_classifier(task, train_examples, dev_examples, s)
    if not current().is_main:
        return report
    if test_examples is not None:
        from bertkit.inference import pipeline
        from bertkit.outputs import atomic_write

        pipe = pipeline("text-classification", s.output_dir / "best", device=process_device(s.device), bf16=s.bf16,
                        batch_size=s.eval_batch_size, max_length=s.max_seq_length, progress=s.progress)
        results = pipe([(e.text_a, e.text_b) if e.text_b is not None else e.text_a for e in test_examples])
        out = s.output_dir / "test_predictions.jsonl"
        with atomic_write(out) as f:
            for e, r in zip(test_examples, results):
                f.write(json.dumps({"id": int(e.id), "line": e.line, **r}, ensure_ascii=False) + "\n")
        report["test_predictions"] = str(out)
        atomic_write_json(s.output_dir / "report.json", report)
    return report
