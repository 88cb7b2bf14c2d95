"""Sweeps of users' files through the command line, `bertkit predict` and `bertkit finetune classify`: each
format's edge cases that the readers' own tests (test_user_files.py, test_reliability.py, test_predict_files.py)
leave out (line ends inside fields, empty files in every format, missing and extra columns, JSON values that are
not texts, label columns of every kind) end in a correct result or in one line naming the file, the line and the
fix (exit 2), with nothing written. A success is checked against the Python pipeline record by record."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from bertkit.cli import main


@pytest.fixture(scope="module")
def classifier(film_classifier) -> Path:
    return film_classifier


def _run(argv: list[object], capsys) -> tuple[int, str]:
    code = main([str(a) for a in argv])
    return code, capsys.readouterr().err


# (file name, content, the texts a success must have predicted on in order, or the substrings of the error)
PREDICT = [
    ("crlf.csv", 'text\r\ngood\r\n"a\r\nb"\r\n', ["good", "a\r\nb"]),
    ("crlf.jsonl", '{"text": "good"}\r\n"bad"\r\n', ["good", "bad"]),
    ("quote.tsv", 'text\n"quoted" word\nit"s\n', ['"quoted" word', 'it"s']),
    ("trail.txt", "good\nbad\n\n\r\n", ["good", "bad"]),
    ("extra.jsonl", '{"text": "good", "source": "web"}\n', ["good"]),
    ("nocol.csv", "review\ngood\n", ("no 'text' column",)),
    ("nocol.tsv", "review\ngood\n", ("no 'text' column",)),
    ("ragged.tsv", "text\ngood\nbad\t1\n", ("ragged.tsv:3",)),
    ("short.csv", "text,n\ngood,1\nbad\n", ("short.csv:3",)),
    ("empty.csv", "", ("holds no inputs",)),
    ("empty.tsv", "", ("holds no inputs",)),
    ("empty.txt", "", ("holds no inputs",)),
    ("header.csv", "text\n", ("holds no inputs",)),
    ("blank.txt", "\n\n\n", ("holds no inputs",)),
    ("nan.jsonl", '{"text": NaN}\n', ("nan.jsonl:1",)),
    ("list.jsonl", '["a", "b"]\n', ("list.jsonl:1",)),
]


@pytest.mark.parametrize("name, content, expected", PREDICT, ids=[p[0] for p in PREDICT])
def test_predict_on_a_users_file_is_right_or_names_file_and_line(classifier, tmp_path, capsys, name, content,
                                                                   expected):
    from bertkit import pipeline

    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
    out = tmp_path / "pred.jsonl"
    code, err = _run(["predict", "text-classification", "--model", classifier, "--input", path,
                      "--output-file", out, "--no-progress"], capsys)
    if isinstance(expected, tuple):
        assert code == 2, err
        assert len(err.strip().splitlines()) == 1 and all(e in err for e in expected), err
        assert not out.exists()
        return
    assert code == 0, err
    got = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    want = pipeline("text-classification", classifier, progress=False)(expected)
    assert [g["id"] for g in got] == list(range(len(expected)))
    assert [g["label"] for g in got] == [w["label"] for w in want]
    assert all(math.isclose(g["score"], w["score"], abs_tol=1e-5) for g, w in zip(got, want))


ROWS = ["a good film", "dull", "a fine film", "bad", "good", "a dull film"]


def _rows(labels: list[str], header: str = "text,label") -> str:
    return header + "\n" + "".join(f"{t},{y}\n" for t, y in zip(ROWS, labels))


def _jsonl(labels: list[object]) -> str:
    return "".join(json.dumps({"text": t, "label": y}) + "\n" for t, y in zip(ROWS, labels))


# (training file, validation file or None for the training file, extra flags, the error's substrings, or the
# labels (None: a regression) and metric a success must report)
FINETUNE = [
    ("validation-inf", _rows(["0.5", "1.5", "2.2", "2.5", "0.1", "3.0"]), _rows(["0.5", "inf"]), [],
     ("dev.csv:3", "not a finite number")),
    # NaN is no JSON value: the line is refused as it is read, as predict's and the server's JSON are
    ("jsonl-nan", _jsonl([0.5, 1.5, float("nan"), 2.0, 1.0, 3.5]), None, [], ("train.jsonl:3", "NaN is not a JSON number")),
    # JSON booleans are classes, as datasets' JSON reader (run_glue.py's) reads them: False, True (ids 0, 1)
    ("jsonl-booleans", _jsonl([True, False] * 3), None, [], (["false", "true"], "accuracy")),
    ("whitespace-text", _rows(["pos", "neg"] * 3) + "   ,pos\n", None, [],
     ("train.csv:8", "'text' is empty: '   ' holds no token")),
    ("nul-in-validation", _rows(["pos", "neg"] * 3), "text,label\ngo\x00od,pos\n", [], ("dev.csv:2", "NUL byte")),
    ("one-class", _rows(["pos"] * 6), None, [], ("at least two classes",)),
    ("empty-texts", 'text,label\n,pos\n,neg\ngood,pos\n"",neg\n', None, [], ("train.csv:2", "'text' is empty")),
    ("no-label-column", _rows(["pos", "neg"] * 3), None, ["--label-column", "sentiment"], ("train.csv:2", "'sentiment'")),
    ("empty-label", _rows(["pos", "neg", "", "neg", "pos", "neg"]), None, [], ("train.csv:4", "empty")),
    ("empty-validation", _rows(["pos", "neg"] * 3), "", [], ("dev.csv holds no inputs",)),
    ("constant-regression", _rows(["0.5", "1.5", "2.2", "2.5", "0.1", "3.0"]), _rows(["1.5"] * 3), [], ("dev.csv",)),
    ("no-pair-column", _rows(["pos", "neg"] * 3), None, ["--text-pair-column", "hypothesis"],
     ("train.csv:2", "'hypothesis'")),
    ("mixed-label-types", _rows(["1", "pos"] * 3), None, [], (["1", "pos"], "accuracy")),
    ("jsonl-integer-labels", _jsonl([0, 1, 0, 1, 1, 0]), None, [], (["0", "1"], "accuracy")),
    ("padded-labels", _rows([" pos", "neg ", "pos", "neg", " pos ", "neg"]), None, [], (["neg", "pos"], "accuracy")),
    ("batch-over-the-data", _rows(["pos", "neg"] * 3), None, ["--batch-size", "64"], (["neg", "pos"], "accuracy")),
    ("regression", _rows(["0.5", "1.5", "2.2", "2.5", "0.1", "3.0"]), _rows(["0.5", "2.5", "1.0"]), [],
     (None, "pearson")),
]


# A success trains (5-9 s each on two busy cores): those run in `make test-slow`.
FINETUNE = [pytest.param(*f, id=f[0], marks=[pytest.mark.slow] if not isinstance(f[-1][0], str) else [])
            for f in FINETUNE]


@pytest.mark.parametrize("name, train, dev, flags, expected", FINETUNE)
def test_finetune_classify_on_a_users_label_column_trains_right_or_refuses_before_training(
        classifier, tmp_path, capsys, name, train, dev, flags, expected):
    suffix = "jsonl" if name.startswith("jsonl") else "csv"
    (tmp_path / f"train.{suffix}").write_text(train, encoding="utf-8")
    validation = tmp_path / f"train.{suffix}"
    if dev is not None:
        validation = tmp_path / f"dev.{suffix}"
        validation.write_text(dev, encoding="utf-8")
    out = tmp_path / "run"
    batch = [] if "--batch-size" in flags else ["--batch-size", "4"]  # a case's own replaces it (twice is refused)
    code, err = _run(["finetune", "classify", "--model", classifier, "--train-file", tmp_path / f"train.{suffix}",
                      "--validation-file", validation, "--output-dir", out, "--num-train-epochs", "1",
                      *batch, "--max-seq-length", "32", "--no-progress", *flags], capsys)
    if all(isinstance(e, str) for e in expected):
        assert code == 2, err
        assert all(e in err for e in expected), err
        assert not (out / "best").exists()
        return
    labels, metric = expected
    assert code == 0, err
    report = json.loads((out / "report.json").read_text())
    assert report["metric"] == metric and math.isfinite(report["runs"][0]["dev"][metric])
    if labels is not None:
        id2label = json.loads((out / "best" / "config.json").read_text())["id2label"]
        assert [id2label[str(i)] for i in range(len(id2label))] == labels


@pytest.mark.parametrize("flag", ["--train-file", "--validation-file", "--input", "extract-features --input"])
def test_a_directory_given_for_a_file_of_inputs_is_refused_naming_it_not_another_flag(classifier, tmp_path, capsys,
                                                                                     flag):
    """Was: `finetune classify --train-file DIR` was refused as "--input DIR is a directory", a flag it has not, and
    `extract-features --input DIR` as "input file not found"."""
    (tmp_path / "rows.csv").write_text(_rows(["pos", "neg"] * 3), encoding="utf-8")
    folder = tmp_path / "folder"
    folder.mkdir()
    if flag == "extract-features --input":
        argv = ["extract-features", "--model", classifier, "--input", folder, "--output-file", tmp_path / "f.jsonl",
                "--layers", "-1", "--max-seq-length", "32"]
    elif flag == "--input":
        argv = ["predict", "text-classification", "--model", classifier, "--input", folder,
                "--output-file", tmp_path / "pred.jsonl"]
    else:
        files = {"--train-file": tmp_path / "rows.csv", "--validation-file": tmp_path / "rows.csv", flag: folder}
        argv = ["finetune", "classify", "--model", classifier, *[x for kv in files.items() for x in kv],
                "--output-dir", tmp_path / "run", "--max-seq-length", "32"]
    code, err = _run(argv, capsys)
    assert code == 2
    name = argv[0] if argv[0] == "extract-features" else " ".join(argv[:2])
    assert err.strip().splitlines() == [f"bertkit {name}: error: {folder} is a directory; pass the "
                                        "file of inputs"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["folder", "rows.csv"]
