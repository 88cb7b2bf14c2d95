"""Users' mistakes on the user-facing surfaces give one clear error (exit 2 on the command line) or a
correct result: `finetune classify` label columns, `pipeline()` arguments and inputs, `predict` files,
corrupt checkpoints and conversion inputs. The full campaign (with its table) is
`python experiments/reliability_campaign.py`; these are its findings that needed a fix, kept fast."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from bertkit.errors import BertkitError
from bertkit.tasks.glue import GlueExample
from bertkit.training.finetune import classify_task

MODEL = Path(os.environ.get("BERTKIT_TEST_MODEL", "models/minilm"))
needs_model = pytest.mark.skipif(not (MODEL / "config.json").is_file(), reason=f"no checkpoint at {MODEL} (make model)")


def _examples(labels: list[str]) -> list[GlueExample]:
    return [GlueExample(id=str(i), text_a="t", text_b=None, label=x, line=i + 2) for i, x in enumerate(labels)]


# -- finetune classify: the label column ----------------------------------------------------------------


@pytest.mark.parametrize("problem_type", ["auto", "regression", "classification"])
@pytest.mark.parametrize("bad", ["nan", "inf", "-Infinity", "NaN"])
def test_a_numeric_label_column_with_a_non_finite_value_is_refused_naming_file_and_row(problem_type, bad):
    labels = ["1.5", "2.0", "3.1", bad, "0.5"]
    with pytest.raises(BertkitError, match=rf"^scores\.csv:5: label '{bad}' is not a finite number"):
        classify_task(_examples(labels), problem_type, "scores", pairs=False, source=Path("scores.csv"))


def test_the_same_class_number_written_two_ways_is_refused():
    with pytest.raises(BertkitError, match=r"d\.csv: labels '1' \(line 2\) and '1\.0' \(line 4\) are the same number"):
        classify_task(_examples(["1", "2", "1.0", "2"]), "auto", "d", pairs=False, source=Path("d.csv"))


def test_nearly_one_class_per_row_warns_and_names_the_fix(caplog):
    with caplog.at_level(logging.WARNING, logger="bertkit"):
        task = classify_task(_examples(["1", "2", "3", "4", "5", "7"]), "auto", "d", pairs=False, source=Path("d.csv"))
    assert task.labels == ("1", "2", "3", "4", "5", "7")
    assert "6 classes in 6 training rows" in caplog.text and "--problem-type regression" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="bertkit"):
        classify_task(_examples(["a fine film", "dull", "great", "so-so"]), "auto", "d", pairs=False)
    assert "4 classes in 4 training rows" in caplog.text and "--label-column" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="bertkit"):  # an ordinary two-class file: no warning
        classify_task(_examples(["neg", "pos", "pos", "neg"]), "auto", "d", pairs=False)
    assert caplog.text == ""


@needs_model
def test_finetune_classify_on_a_score_column_with_nan_exits_2_naming_the_row_and_trains_nothing(tmp_path, capsys):
    from bertkit.cli import main

    rows = [("good", "1.5"), ("fine", "2.0"), ("ok", "3.1"), ("bad", "inf"), ("awful", "nan")]
    (tmp_path / "train.csv").write_text("text,score\n" + "".join(f"{t},{s}\n" for t, s in rows), encoding="utf-8")
    out = tmp_path / "run"
    code = main(["finetune", "classify", "--model", str(MODEL), "--train-file", str(tmp_path / "train.csv"),
                 "--validation-file", str(tmp_path / "train.csv"), "--label-column", "score", "--output-dir", str(out),
                 "--num-train-epochs", "1", "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "train.csv:5: label 'inf' is not a finite number" in err and len(err.strip().splitlines()) == 1
    assert not (out / "report.json").exists() and not (out / "best").exists()
