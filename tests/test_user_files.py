"""Users' files as `bertkit predict TASK` and `bertkit finetune classify` read them (no model needed): the format
from --input-format or the suffix, header and blank-line rules with FILE:LINE errors, fill-mask rows that lack
the mask token, and the scores finetune classify reports for more than two classes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bertkit.errors import BertkitError
from bertkit.inference.files import Columns, read_inputs
from bertkit.tasks.files import file_format, read_records
from bertkit.tasks.glue import GlueExample
from bertkit.training.finetune import classify_task


def test_the_format_is_the_flags_or_the_suffixs_and_an_unknown_suffix_is_an_error(tmp_path):
    names = ("a.jsonl", "a.JSON", "a.ndjson", "a.csv", "a.tsv", "a.txt")
    assert [file_format(Path(n)) for n in names] == ["jsonl", "jsonl", "jsonl", "csv", "tsv", "text"]
    assert file_format(Path("a.csv"), "tsv") == "tsv"
    with pytest.raises(BertkitError, match=r"export\.dat: cannot tell the format from the suffix '\.dat'; "
                                           r"pass --input-format \(jsonl, csv, tsv, text\)"):
        file_format(Path("export.dat"))
    with pytest.raises(BertkitError, match=r"reviews: cannot tell the format from the suffix '\(none\)'"):
        file_format(Path("reviews"))

    path = tmp_path / "reviews.export"
    path.write_text('id,review\na,good film\nb,"long, and dull"\n', encoding="utf-8")
    with pytest.raises(BertkitError, match="reviews.export: cannot tell the format.*--input-format"):
        read_inputs(path, "text-classification")
    assert read_inputs(path, "text-classification", Columns(text="review", id="id"), "csv") == \
        ([{"text": "good film"}, {"text": "long, and dull"}], ["a", "b"])
    assert read_inputs(path, "text-classification", input_format="text") == \
        (["id,review", "a,good film", 'b,"long, and dull"'], [0, 1, 2])


@pytest.mark.parametrize("name, header", [("d.csv", "text,label, text"), ("d.tsv", "text\tlabel\ttext")])
def test_a_repeated_header_column_names_file_line_1_and_the_column(tmp_path, name, header):
    path = tmp_path / name
    sep = "\t" if name.endswith(".tsv") else ","
    path.write_text(f"{header}\n" + sep.join(["a", "1", "b"]) + "\n", encoding="utf-8")
    with pytest.raises(BertkitError, match=rf"d\.{name[-3:]}:1: the header names column 'text' more than once"):
        list(read_records(path, name[-3:]))


@pytest.mark.parametrize("name, content, line", [
    ("b.csv", "text,label\ngood,1\n\nbad,0\n", 3),
    ("b.csv", "\ntext,label\ngood,1\n", 1),  # before the header too
    ("b.tsv", "text\tlabel\ngood\t1\n  \nbad\t0\n", 3),  # whitespace only
    ("b.jsonl", '{"text": "good"}\n\n{"text": "bad"}\n', 2),
    ("b.txt", "good\n\n\nbad\n", 2),
])
def test_a_blank_line_is_refused_with_file_and_line_in_every_format(tmp_path, name, content, line):
    path = tmp_path / name
    path.write_text(content, encoding="utf-8")
    with pytest.raises(BertkitError, match=rf"b\.{path.suffix[1:]}:{line}: blank line"):
        list(read_records(path, file_format(path)))


def test_blank_lines_at_the_end_are_a_files_trailing_newlines_and_a_row_of_empty_fields_is_a_row(tmp_path):
    csv_path, text_path = tmp_path / "t.csv", tmp_path / "t.txt"
    csv_path.write_text('text,label\ngood,1\n,\n"two\nlines",0\n\n\n', encoding="utf-8")
    assert list(read_records(csv_path, "csv")) == [(2, {"text": "good", "label": "1"}),
                                                   (3, {"text": "", "label": ""}),
                                                   (5, {"text": "two\nlines", "label": "0"})]
    text_path.write_text("good\nbad\n\n  \n", encoding="utf-8")
    assert list(read_records(text_path, "text")) == [(1, "good"), (2, "bad")]


@pytest.mark.parametrize("name, content, line", [
    ("m.txt", "the [MASK] sat .\na [MASK] and a [MASK]\nno mask here\n", 3),
    ("m.csv", 'text\n"the [MASK] sat"\n"[mask] in lower case"\n', 3),
    ("m.jsonl", '"the [MASK] sat"\n{"text": "no mask"}\n', 2),
])
def test_fill_mask_rows_must_hold_the_mask_token(tmp_path, name, content, line):
    path = tmp_path / name
    path.write_text(content, encoding="utf-8")
    with pytest.raises(BertkitError, match=rf"m\.{path.suffix[1:]}:{line}: no \[MASK\] in "):
        read_inputs(path, "fill-mask")
    first = 2 if name.endswith(".csv") else 1  # the first input's line
    with pytest.raises(BertkitError, match=rf"m\.{path.suffix[1:]}:{first}: no <mask> in"):
        read_inputs(path, "fill-mask", mask_token="<mask>")  # the tokenizer's token, not a fixed string


def _examples(labels: list[str]) -> list[GlueExample]:
    return [GlueExample(id=str(i), text_a="t", text_b=None, label=x, line=i + 2) for i, x in enumerate(labels)]


def test_finetune_classify_scores_macro_f1_beside_accuracy_for_more_than_two_classes():
    three = classify_task(_examples(["neg", "neutral", "pos", "neutral"]), "auto", "reviews", pairs=False)
    assert three.labels == ("neg", "neutral", "pos")
    refs, preds = np.array([0, 0, 1, 2, 2, 2]), np.array([0, 1, 1, 2, 2, 0])
    # per class F1: neg 2*1/(2+1+1) = 1/2, neutral 2/(2+1) = 2/3, pos 4/(4+1) = 4/5
    expected = {"accuracy": pytest.approx(4 / 6), "macro_f1": pytest.approx((1 / 2 + 2 / 3 + 4 / 5) / 3)}
    assert three.metric(preds, refs) == expected
    assert list(three.metric(preds, refs)) == ["accuracy", "macro_f1"]  # accuracy stays the grid's selector
    sk = pytest.importorskip("sklearn.metrics")
    assert three.metric(preds, refs)["macro_f1"] == pytest.approx(sk.f1_score(refs, preds, average="macro"))

    two = classify_task(_examples(["neg", "pos", "pos"]), "auto", "reviews", pairs=False)
    assert two.metric(np.array([0, 1, 1]), np.array([0, 1, 0])) == {"accuracy": pytest.approx(2 / 3)}
