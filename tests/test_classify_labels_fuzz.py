"""Seeded random label columns written as CSV: ``finetune classify``'s classes, read as pandas (run_glue.py's reader)
reads each cell, are pandas' sorted distinct values one for one (ids in the same order), or the column is refused
with an error. A regression by pandas' dtype is one for bertkit too unless every label is a whole number (classes, as
docs/inference.md says); under --problem-type classification its classes are pandas' values one for one as well."""

from __future__ import annotations

import csv
import random
from pathlib import Path

import pytest

from bertkit.errors import BertkitError
from bertkit.settings import ClassifySettings
from bertkit.training.classify import classify_task, read_labelled

POOLS = [
    ["pos", "neg"],
    ["1", "0"],
    ["Ünïcode", "ascii", "日本"],
    ["Pos", "pos", "NEG"],
    ["1", "2", "5"],
    ["3", "10", "2"],
    ["-1", "0", "1"],
    ["0.5", "1", "2.25", "10.5"],
    ["1", "1.0", "2", "0.5"],
    ["True", "False"],
    ["x", "y", "z", "w"],
    ["B-PER", "O", "I-PER"],
    ["1.0", "2.0", "3.5"],
    ["1e3", "2", "0.5"],
    ["2", "3", "4"],
    ["0.5", ".50", "1.5"],
    ["NEG", "neg"],
]


def _case(rng: random.Random, root: Path) -> tuple[Path, list[str]]:
    pool = rng.choice(POOLS)
    labels = [rng.choice(pool) for _ in range(rng.randint(3, 14))]
    path = root / "train.csv"
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["text", "label"])
        writer.writerows([f"text {i}", label] for i, label in enumerate(labels))
    return path, labels


def _one_for_one(names: tuple[str, ...], rows: list, pandas_values: list) -> None:
    """Each of bertkit's classes is one pandas value and the reverse, in pandas' sorted order."""
    value_of, name_of = {}, {}
    for name, value in zip(rows, pandas_values):
        assert value_of.setdefault(name, value) == value, (name, value_of[name], value)
        assert name_of.setdefault(value, name) == name, (value, name_of[value], name)
    assert [value_of[n] for n in names] == sorted(set(pandas_values))


@pytest.mark.slow  # about 2 s: 300 label columns through pandas and bertkit (make test-slow)
def test_random_label_columns_give_pandas_classes_one_for_one_or_an_error(tmp_path, minilm_dir):
    pd = pytest.importorskip("pandas")
    from bertkit.tokenization import BertTokenizer

    tokenizer = BertTokenizer.from_pretrained(minilm_dir)
    rng = random.Random(2024)
    for _ in range(300):
        path, _ = _case(rng, tmp_path)
        column = pd.read_csv(path)["label"]
        settings = ClassifySettings(
            model_name_or_path=minilm_dir, output_dir=tmp_path / "out", train_file=path, validation_file=path
        )
        rows = read_labelled(path, settings, tokenizer)
        values = column.tolist()
        regression = column.dtype.kind == "f"
        for problem_type in ("auto", "classification") if regression else ("auto",):
            try:
                task = classify_task(rows, problem_type, "train", pairs=False)
            except BertkitError:
                continue  # a refusal names the value and the fix (tests/test_user_files.py)
            if task.labels is None:
                assert regression, values
                continue
            whole = all(float(e.label).is_integer() for e in rows) if regression else True
            assert problem_type == "classification" or whole, (values, task.labels)
            _one_for_one(task.labels, [e.label for e in rows], values)


@pytest.mark.parametrize(
    "train, dev, message",
    [
        (
            ["1", "2", "5", "1"],
            ["2", "5.0"],
            r"label '5\.0' never occurs in .*train\.csv \(its labels: 1, 2, 5\); it is "
            r"the class '5' written another way \(as pandas reads both\): write it '5'",
        ),
        (["True", "False"], ["TRUE"], r"label 'TRUE' never .*: write it 'True'"),
        (
            ["pos", "neg"],
            ["pos", "maybe"],
            r"dev\.csv:3: label 'maybe' never occurs .*; add training rows of it to ",
        ),
    ],
)
def test_a_validation_label_outside_the_training_classes_names_the_fix(
    tmp_path, minilm_dir, train, dev, message
):
    """run_glue.py maps a validation 5.0 to the training class 5 (pandas reads both as one number) and fails with a
    KeyError on a class it never saw. Was: both refused as 'never occurs in train.csv', with no fix."""
    from bertkit.training import classify

    for name, rows in (("train.csv", train), ("dev.csv", dev)):
        (tmp_path / name).write_text(
            "text,label\n" + "".join(f"good film,{x}\n" for x in rows), encoding="utf-8"
        )
    with pytest.raises(BertkitError, match=message):
        classify.finetune_classify(
            ClassifySettings(
                model_name_or_path=minilm_dir,
                output_dir=tmp_path / "out",
                train_file=tmp_path / "train.csv",
                validation_file=tmp_path / "dev.csv",
            )
        )
    assert not (tmp_path / "out").exists()
