"""Users' files as `bertkit predict TASK` and `bertkit finetune classify` read them (no model needed): the format
from --input-format or the suffix, header and blank-line rules with FILE:LINE errors, blank texts, a second text
no flag names, binary files and huge lines, fill-mask rows that lack the mask token, and the scores finetune
classify reports for more than two classes."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import numpy as np
import pytest

from bertkit.errors import BertkitError
from bertkit.inference import files
from bertkit.inference.files import Columns
from bertkit.settings import ClassifySettings
from bertkit.tasks.files import file_format, read_records
from bertkit.tasks.glue import GlueExample
from bertkit.tokenization import BertTokenizer
from bertkit.training.classify import classify_task, read_labelled

# A model's tokenizer (its vocabulary only: the reader needs no weights).
TOK = BertTokenizer(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "<mask>", "good", "bad", "film"])


def read_inputs(path, task, *args, tokenizer=TOK, **kwargs):
    """``files.read_inputs`` with this module's tokenizer unless another is given."""
    return files.read_inputs(path, task, *args, tokenizer=tokenizer, **kwargs)


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


@pytest.mark.parametrize("task, content, columns, message", [
    ("text-classification", '{"text": "good film"}\n', Columns(text_pair="text"),
     "--text-column and --text-pair-column both name the column 'text'"),  # read as ("good film", "good film")
    ("question-answering", '{"q": "good", "c": "film"}\n', Columns(question="q", context="q"),
     "--question-column and --context-column both name the column 'q'"),
])
def test_two_parts_of_an_input_read_from_one_column_are_refused(tmp_path, task, content, columns, message):
    path = tmp_path / "d.jsonl"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(BertkitError, match=re.escape(message)):
        read_inputs(path, task, columns)


@pytest.mark.parametrize("flags, message", [
    ({"label_column": "text"}, "--text-column and --label-column both name the column 'text'"),
    ({"text_column": "label"}, "--text-column and --label-column both name the column 'label'"),
    ({"text_pair_column": "label"}, "--text-pair-column and --label-column both name the column 'label'"),
])
def test_finetune_classify_refuses_a_label_read_from_a_text_column(tmp_path, flags, message):
    """Was: --label-column text made each text its own class (a warning at most), and --text-column label trained a
    model to read its label off its input, scored perfect on dev."""
    (tmp_path / "t.csv").write_text("text,label\ngood film,pos\nbad film,neg\n", encoding="utf-8")
    with pytest.raises(BertkitError, match=re.escape(message)):
        read_labelled(tmp_path / "t.csv", _classify(tmp_path, **flags), TOK)


_HALF = ("half of a UTF-16 surrogate pair without its other half (no character); escape both halves of the pair, or "
         "write the character itself in UTF-8")


@pytest.mark.parametrize("content, message", [
    # json.loads keeps the last of two values silently: the line's first text would never be read
    ('{"text": "good"}\n{"text": "good", "text": "bad"}\n', "an object holds the key 'text' twice"),
    # and reads NaN as a float: an id of NaN would be written back as `"id": NaN`, a line no JSON reader takes
    ('{"text": "good", "id": NaN}\n', "NaN is not a JSON number"),
    ('{"text": "good", "id": -Infinity}\n', "-Infinity is not a JSON number"),
    # and reads half of an escaped surrogate pair into the text: no character, so a prediction echoing it (a word, an
    # answer) could not be written as UTF-8 (a UnicodeEncodeError traceback once the model had run)
    ('{"text": "good"}\n{"text": "Hel\\ud83dlo"}\n', "a string holds \\ud83d, half of a UTF-16 surrogate pair "
     "without its other half (no character); escape both halves of the pair, or write the character itself in UTF-8"),
    ('{"te\\udc00xt": "good"}\n', f"a string holds \\udc00, {_HALF}"),  # in a key
    ('{"choices": ["a", ["\\udbff"]]}\n', f"a string holds \\udbff, {_HALF}"),  # nested
])
def test_a_json_line_that_is_not_standard_json_is_refused_naming_file_and_line(tmp_path, content, message):
    path = tmp_path / "d.jsonl"
    path.write_text(content, encoding="utf-8")
    line = content.count("\n")
    with pytest.raises(BertkitError, match=rf"d\.jsonl:{line}: not valid JSON \({re.escape(message)}\)"):
        list(read_records(path, "jsonl"))


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
                                                   (4, {"text": "two\nlines", "label": "0"})]  # its first line
    text_path.write_text("good\nbad\n\n\r\n\n", encoding="utf-8")
    assert list(read_records(text_path, "text")) == [(1, "good"), (2, "bad")]


@pytest.mark.parametrize("name, content, line", [
    ("w.csv", "text,label\ngood,1\n   ,0\n", 3),  # the last row: whitespace in the text column
    ("w.csv", "id,text\n1,good\n2,\n", 3),  # an empty text field
    ("w.csv", "text\ngood\n   \n", 3),  # one column: a line of whitespace, even at the end
    ("w.tsv", "text\tlabel\ngood\t1\n \t0\n", 3),
    ("w.jsonl", '{"text": "good"}\n{"text": " \\t "}\n', 2),
    ("w.jsonl", '"good"\n"   "\n', 2),  # a bare JSON string
    ("w.jsonl", '{"text": "good"}\n{"text": ""}\n', 2),
    ("w.txt", "good\nbad\n \t \n\n", 3),  # a whitespace line at the end is a row, not a line ending
    ("w.txt", "good\n\u200b\u200d\n", 2),  # zero-width characters alone: the tokenizer keeps none (the pipeline's rule)
    ("w.jsonl", '{"text": "good"}\n{"text": "\\u0007\\u00ad"}\n', 2),  # a control character and a soft hyphen
])
def test_a_blank_or_whitespace_text_is_refused_naming_file_and_line_in_every_format(tmp_path, name, content, line):
    path = tmp_path / name
    path.write_text(content, encoding="utf-8")
    with pytest.raises(BertkitError, match=rf"/{path.name.replace('.', '[.]')}:{line}: .*(empty|whitespace)"):
        read_inputs(path, "text-classification", Columns(id="id" if "id," in content else None))


def test_a_text_of_characters_the_vocabulary_lacks_is_read_not_refused_as_empty(tmp_path):
    """Emoji are [UNK] to this vocabulary: a token the model reads, so the text is not empty (the pipeline's rule)."""
    path = tmp_path / "e.txt"
    path.write_text("good\n\U0001F600 \U0001F389\n", encoding="utf-8")
    assert read_inputs(path, "text-classification") == (["good", "\U0001F600 \U0001F389"], [0, 1])


@pytest.mark.parametrize("content, line", [
    ('{"question": "who?", "context": "  "}\n', 1),
    ('{"question": "", "context": "Ada wrote it."}\n', 1),
])
def test_a_blank_question_or_context_is_refused(tmp_path, content, line):
    path = tmp_path / "qa.jsonl"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(BertkitError, match=rf"qa\.jsonl:{line}: '(question|context)' is empty: "):
        read_inputs(path, "question-answering")


def _classify(tmp_path: Path, **kwargs) -> ClassifySettings:
    return ClassifySettings(model_name_or_path=tmp_path, output_dir=tmp_path / "out", train_file=tmp_path / "t.csv",
                            validation_file=tmp_path / "t.csv", **kwargs)


@pytest.mark.parametrize("content, line", [("text,label\ngood,1\n  ,0\n", 3),
                                           ("text,text_b,label\ngood,fine,1\nbad,,0\n", 3)])
def test_finetune_classify_refuses_a_blank_text_naming_file_and_line(tmp_path, content, line):
    (tmp_path / "t.csv").write_text(content, encoding="utf-8")
    s = _classify(tmp_path, text_pair_column="text_b" if "text_b" in content else None)
    with pytest.raises(BertkitError, match=rf"t\.csv:{line}: 'text(_b)?' is empty: "):
        read_labelled(tmp_path / "t.csv", s, TOK)


# -- a second text no flag names ----------------------------------------------------------------------


@pytest.mark.parametrize("name, content, columns, field", [
    ("p.jsonl", '{"text": "a", "text_b": "b"}\n{"text": "c", "text_b": "d"}\n', Columns(), "text_b"),
    ("p.csv", "sentence1,sentence2\na,b\n", Columns(text="sentence1"), "sentence2"),
    ("p.tsv", "question\tsentence\tlabel\na?\tb\t1\n", Columns(text="sentence"), "question"),
    ("p.jsonl", '{"premise": "a", "hypothesis": "b"}\n', Columns(text="premise"), "hypothesis"),
])
def test_a_second_text_no_flag_names_is_warned_about_or_refused_for_a_pair_model(tmp_path, caplog, name, content,
                                                                                  columns, field):
    path = tmp_path / name
    path.write_text(content, encoding="utf-8")
    with caplog.at_level(logging.WARNING, logger="bertkit"):
        inputs, _ = read_inputs(path, "text-classification", columns)
    assert all("text_pair" not in x for x in inputs)  # read as told: the first texts alone ...
    assert f"{name}:2: the inputs hold a second text" in caplog.text or f"{name}:1:" in caplog.text
    assert f"'{field}'" in caplog.text and f"--text-pair-column {field}" in caplog.text  # ... and said so, once
    assert caplog.text.count("second text") == 1
    with pytest.raises(BertkitError, match=rf"{name.replace('.', '[.]')}:[12]: the model was fine-tuned on text pairs"
                                           rf".*'{field}'.*--text-pair-column {field}"):
        read_inputs(path, "text-classification", columns, pair_model=True)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="bertkit"):  # told: read as pairs, no warning
        inputs, _ = read_inputs(path, "text-classification", Columns(text=columns.text, text_pair=field))
    assert inputs[0]["text_pair"] and caplog.text == ""


def test_a_file_with_one_text_and_other_columns_gives_no_warning(tmp_path, caplog):
    path = tmp_path / "r.csv"
    path.write_text("id,text,label,source\n1,good,pos,web\n", encoding="utf-8")
    with caplog.at_level(logging.WARNING, logger="bertkit"):
        read_inputs(path, "text-classification", Columns(id="id"))
        read_inputs(path, "token-classification")  # a task that reads one text only: no pair to miss
    assert caplog.text == ""


def test_finetune_classify_warns_of_a_second_text_no_flag_names(tmp_path, caplog):
    (tmp_path / "t.csv").write_text("text,text_b,label\na,b,1\nc,d,0\n", encoding="utf-8")
    with caplog.at_level(logging.WARNING, logger="bertkit"):
        read_labelled(tmp_path / "t.csv", _classify(tmp_path), TOK)
    assert "t.csv:2: the inputs hold a second text (column 'text_b')" in caplog.text
    assert "--text-pair-column text_b" in caplog.text


@pytest.mark.parametrize("name, content", [
    ("p.jsonl", '{"text": "a", "text_pair": "b"}\n{"text": "c", "text_pair": "d"}\n'),
    ("p.csv", "text,text_pair,label\na,b,1\nc,d,0\n"),
    ("p.tsv", "id\ttext_pair\ttext\n7\tb\ta\n8\td\tc\n"),
])
def test_a_text_pair_field_is_read_as_the_pair_as_transformers_reads_a_dict(tmp_path, caplog, name, content):
    """Was: {"text": "a", "text_pair": "b"} classified as the text "a" alone (a warning logged), where transformers'
    text-classification pipeline reads that dict as the pair (a, b): every score of the file a single text's."""
    path = tmp_path / name
    path.write_text(content, encoding="utf-8")
    with caplog.at_level(logging.WARNING, logger="bertkit"):
        inputs, _ = read_inputs(path, "text-classification")
    assert inputs == [{"text": "a", "text_pair": "b"}, {"text": "c", "text_pair": "d"}] and caplog.text == ""
    # a pair model's file with text_pair is what it was trained on: read, not refused
    assert read_inputs(path, "text-classification", pair_model=True)[0] == inputs
    assert read_inputs(path, "token-classification")[0] == ["a", "c"]  # a task of one text reads the text
    with caplog.at_level(logging.WARNING, logger="bertkit"):  # an embedding: each text's own, so warned about
        assert read_inputs(path, "sentence-embedding")[0] == [{"text": "a"}, {"text": "c"}]
    assert "--text-pair-column text_pair" in caplog.text


@pytest.mark.parametrize("content, message", [
    ('{"text": "a", "text_pair": "b"}\n{"text": "c"}\n',
     r"p\.jsonl:2: no 'text_pair' field, where line 1 holds one, which makes the file one of \(text, text_pair\) "
     r"pairs: a line without it would be read as a single text"),
    ('{"text": "a"}\n{"text": "c", "text_pair": "d"}\n',
     r"p\.jsonl:2: a 'text_pair' field, where the first line holds none: .* this pair's second text would be left "
     "out"),
    ('"a"\n{"text": "c", "text_pair": "d"}\n', r"p\.jsonl:2: a 'text_pair' field, where the first line holds none"),
    ('{"text": "a", "text_pair": "b", "hypothesis": "h"}\n',
     r"p\.jsonl:1: the inputs hold 'text_pair' and another field named like a pair's second text \('hypothesis'\); "
     r".*--text-pair-column text_pair \(or --text-pair-column hypothesis\)"),
])
def test_a_file_of_pairs_and_single_texts_is_refused_by_line(tmp_path, content, message):
    """Pairs beside single texts, or two candidate second texts: which reading is meant is the user's to say."""
    path = tmp_path / "p.jsonl"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(BertkitError, match=message):
        read_inputs(path, "text-classification")


def test_finetune_classify_trains_on_a_text_pair_column_and_scores_on_the_same(tmp_path):
    (tmp_path / "t.csv").write_text("text,text_pair,label\na,b,1\nc,d,0\n", encoding="utf-8")
    rows = read_labelled(tmp_path / "t.csv", _classify(tmp_path), TOK)
    assert [(e.text_a, e.text_b) for e in rows] == [("a", "b"), ("c", "d")]
    (tmp_path / "v.csv").write_text("text,label\na,1\n", encoding="utf-8")
    from bertkit.training.classify import finetune_classify

    s = ClassifySettings(model_name_or_path=Path("models/minilm"), output_dir=tmp_path / "out",
                         train_file=tmp_path / "t.csv", validation_file=tmp_path / "v.csv")
    with pytest.raises(BertkitError, match=r"t\.csv holds \(text, text_pair\) pairs and .*v\.csv single texts"):
        finetune_classify(s)


def test_a_checkpoint_says_whether_it_was_fine_tuned_on_pairs(tmp_path):
    from bertkit.inference.files import trained_on_pairs

    for config, pairs in [({"text_pair": True}, True), ({"text_pair": False, "finetuning_task": "mrpc"}, False),
                          ({"finetuning_task": "mrpc"}, True), ({"finetuning_task": "sst-2"}, False),
                          ({"finetuning_task": "my-task"}, False), ({}, False)]:
        (tmp_path / "config.json").write_text(json.dumps(config), encoding="utf-8")
        assert trained_on_pairs(tmp_path) is pairs, config
    assert trained_on_pairs(tmp_path / "missing") is False


# -- binary files and huge lines -----------------------------------------------------------------------


@pytest.mark.parametrize("name, content, line", [
    ("n.csv", b"text\ngood\nb\x00ad\n", 3),
    ("n.tsv", b"text\ngood\nb\x00ad\n", 3),
    ("n.jsonl", b'{"text": "good"}\n{"text": "b\x00ad"}\n', 2),
    ("n.txt", b"good\n\x00\x00\x00\n", 2),
    ("n.txt", "good\n".encode("utf-16"), 1),  # UTF-16: NUL in every other byte
])
def test_a_nul_byte_is_refused_as_a_binary_file_naming_file_and_line(tmp_path, name, content, line):
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(BertkitError, match=rf"n\.{name[2:]}:{line}: a NUL byte .* binary file"):
        list(read_records(path, file_format(path)))


@pytest.mark.parametrize("name", ["big.txt", "big.jsonl", "big.csv", "big.tsv"])
def test_a_line_over_the_limit_is_refused_without_reading_it_whole(tmp_path, name):
    import tracemalloc

    path = tmp_path / name
    with open(path, "wb") as f:  # 4 MB on one line, after a good one
        f.write(b"text\n" if name.endswith(("csv", "tsv")) else b"")
        f.write(b'"good"\n' if name.endswith("jsonl") else b"good\n")
        quote = b'"' if name.endswith("jsonl") else b""
        f.write(quote + b"x" * 4_000_000 + quote + b"\n")
    first = 3 if name.endswith(("csv", "tsv")) else 2
    tracemalloc.start()
    try:
        with pytest.raises(BertkitError, match=rf"{name.replace('.', '[.]')}:{first}: this line is longer than "
                                               r"1,000,000 bytes \(the line limit, --max-line-bytes\)"):
            list(read_records(path, file_format(path), max_line_bytes=1_000_000))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 3_000_000, peak  # one limit's worth of bytes (and its decoding), never the 4 MB line
    assert list(read_records(path, file_format(path), max_line_bytes=5_000_000))[-1][0] == first  # a flag away


def test_a_csv_record_spanning_lines_counts_against_the_limit(tmp_path):
    path = tmp_path / "open.csv"
    path.write_text('text\ngood\n"never closed\n' + "more text\n" * 200, encoding="utf-8")
    with pytest.raises(BertkitError, match=r"open\.csv:3: the record from line 3 to line \d+ is longer than 1,000 "
                                           r"bytes.*quote left open"):
        list(read_records(path, "csv", max_line_bytes=1000))


def _texts(path):
    return [x if isinstance(x, str) else x["text"] for x in read_inputs(path, "text-classification")[0]]


def _conll_words(path):
    from bertkit.tasks.ner import read_conll

    return [" ".join(s.words) for s in read_conll(path)]


def _sst2_texts(path):
    from bertkit.tasks.glue import get_task

    return [e.text_a for e in get_task("sst-2").read(path, labeled=True)]


@pytest.mark.parametrize("name, content, read", [
    ("cr.txt", b"good film\rbad film\r", _texts),  # was one input, "good film\rbad film"
    ("cr.csv", b"text\rgood film\rbad film\r", _texts),
    ("cr.jsonl", b'"good film"\r{"text": "bad film"}\r', _texts),
    ("cr.conll", b"good O\rfilm O\r\rbad O\rfilm O\r", _conll_words),  # was "holds no sentences"
    ("cr.tsv", b"sentence\tlabel\rgood film\t1\rbad film\t0\r", _sst2_texts),  # was "holds no examples"
])
def test_lines_ending_in_a_carriage_return_alone_are_refused_not_read_as_one_line(tmp_path, name, content, read):
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(BertkitError, match=rf"cr\.{name[3:]}:1: a carriage return .* \(classic Mac OS\) would be "
                                           r"read as one line; end its lines with \\n"):
        read(path)
    path.write_bytes(content.replace(b"\r", b"\r\n"))  # CRLF line ends are line ends
    assert read(path) == ["good film", "bad film"]


@pytest.mark.parametrize("content, message", [
    ('[\n  {"text": "good"},\n  {"text": "bad"}\n]\n',
     r"j\.json:1: not valid JSON \(Expecting value at column 2\); the file must be JSON lines, one value per line"),
    ('[{"text": "good"}, {"text": "bad"}]\n', r"j\.json:1: expected an object with fields text, got list \(a JSON "
     r"array: write JSON lines, one object per line\)"),
])
def test_a_json_array_names_json_lines_as_the_fix(tmp_path, content, message):
    """datasets' json loader (run_glue.py's) reads a JSON array as rows; bertkit reads JSON lines and says so."""
    path = tmp_path / "j.json"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(BertkitError, match=message):
        read_inputs(path, "text-classification")


@pytest.mark.parametrize("name, fix", [
    ("cr.tsv", r"a TSV field holds no line break \(quotes are text in TSV\): remove it, or write the file as CSV"),
    ("cr.csv", r"a field holding the delimiter, a quote or a newline must be quoted as a whole"),
])
def test_a_carriage_return_inside_a_field_is_refused_with_the_formats_fix(tmp_path, name, fix):
    """Was: the CSV advice (quote the field) for a TSV file too, where quotes are text."""
    path = tmp_path / name
    sep = b"\t" if name.endswith("tsv") else b","
    path.write_bytes(b"text" + sep + b"label\ngood film" + sep + b"pos\nbad\rfilm" + sep + b"neg\n")
    with pytest.raises(BertkitError, match=rf"cr\.{name[3:]}:3: not valid {name[3:].upper()} from this line on "
                                           rf"\(new-line character seen in unquoted field.*\); {fix}"):
        list(read_records(path, file_format(path)))


@pytest.mark.parametrize("name, content, line, fix", [
    ("ids.txt", "good film\nbad film\n", 1, "a .txt file has no columns: write JSONL, CSV or TSV"),
    ("ids.jsonl", '{"text": "good film", "qid": "a"}\n"bad film"\n', 2, "write an object"),
])
def test_an_id_column_is_refused_for_a_bare_text_not_replaced_by_its_position(tmp_path, name, content, line, fix):
    """Was: ids [0, 1] for the .txt file, [\"a\", 1] for the JSON lines: the position where the column was asked."""
    path = tmp_path / name
    path.write_text(content, encoding="utf-8")
    with pytest.raises(BertkitError, match=rf"ids\.{name[4:]}:{line}: a bare text has no 'qid' field for --id-column; "
                                           rf"{fix} holding the id, or leave --id-column out"):
        read_inputs(path, "text-classification", Columns(id="qid"))
    assert read_inputs(path, "text-classification")[1] == [0, 1]


def test_a_json_line_without_the_named_text_pair_field_is_refused_not_read_as_a_text_alone(tmp_path):
    """Was: line 2 read as {"text": "a dog runs"} beside line 1's pair, as a CSV row's empty cell is not."""
    path = tmp_path / "pairs.jsonl"
    path.write_text('{"text": "a man plays", "hyp": "someone plays"}\n{"text": "a dog runs"}\n', encoding="utf-8")
    with pytest.raises(BertkitError, match=r"pairs\.jsonl:2: no 'hyp' field \(it has text\); name it with "
                                           "--text-pair-column"):
        read_inputs(path, "text-classification", Columns(text_pair="hyp"))
    assert read_inputs(path, "text-classification")[0] == [{"text": "a man plays"}, {"text": "a dog runs"}]


def test_bytes_that_are_not_utf8_name_the_line_without_reading_the_file_whole(tmp_path):
    path = tmp_path / "latin.csv"
    path.write_bytes("text\ngood\ncaf\xe9\n".encode("latin-1"))
    with pytest.raises(BertkitError, match=r"latin\.csv is not UTF-8 text: line 3, byte 13 \(b'\\xe9'\)"):
        list(read_records(path, "csv"))


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
        read_inputs(path, "fill-mask", tokenizer=BertTokenizer(TOK.vocab, mask_token="<mask>"))  # the tokenizer's


def _examples(labels: list[str]) -> list[GlueExample]:
    return [GlueExample(id=str(i), text_a="t", text_b=None, label=x, line=i + 2) for i, x in enumerate(labels)]


def test_labels_with_underscores_are_names_sorted_as_text_as_run_glue_reads_them():
    # float("10_1") is 101, but pandas (run_glue.py's CSV reader) reads a name: id2label in text order, as its sorted()
    assert classify_task(_examples(["9_9", "10_1", "9_9"]), "auto", "x", pairs=False).labels == ("10_1", "9_9")
    assert classify_task(_examples(["1_0", "10", "10"]), "auto", "x", pairs=False).labels == ("10", "1_0")  # 2 classes


def test_json_boolean_labels_are_two_classes_and_one_boolean_written_two_ways_is_refused(tmp_path):
    """datasets' JSON reader (run_glue.py's) reads true/false labels as the classes False, True (ids 0, 1), and pandas
    reads True, TRUE and true in a CSV as one value. Was: a JSON boolean refused as "must be a string or number", and
    CSV's True, TRUE as two classes of three, each id mapped to one spelling."""
    path = tmp_path / "t.jsonl"
    path.write_text('{"text": "good", "label": true}\n{"text": "bad", "label": false}\n'
                    '{"text": "fine", "label": "true"}\n', encoding="utf-8")
    rows = read_labelled(path, _classify(tmp_path), TOK)
    assert [e.label for e in rows] == ["true", "false", "true"]
    task = classify_task(rows, "auto", "t", pairs=False)
    assert task.labels == ("false", "true")
    assert [task.labels.index(e.label) for e in rows] == [1, 0, 1]
    assert classify_task(_examples(["True", "False", "True"]), "auto", "x", pairs=False).labels == ("False", "True")
    with pytest.raises(BertkitError, match=r"^d\.csv: labels 'True' \(line 2\) and 'TRUE' \(line 4\) are the same "
                                           r"boolean written two ways, so they would be two classes; write each class "
                                           r"one way$"):
        classify_task(_examples(["True", "false", "TRUE"]), "auto", "x", pairs=False, source="d.csv")
    path.write_text('{"text": "good", "label": null}\n', encoding="utf-8")
    with pytest.raises(BertkitError, match=r"t\.jsonl:1: 'label' must be a string, number or boolean, got null"):
        read_labelled(path, _classify(tmp_path), TOK)


def test_integer_labels_past_two_to_the_53_are_distinct_classes_in_numeric_order():
    """Was: 9007199254740993 and 9007199254740992 refused as "the same number written two ways" (one float), which
    pandas reads as two integers."""
    big = ["9007199254740993", "9007199254740992", "10", "9007199254740993"]
    assert classify_task(_examples(big), "auto", "x", pairs=False).labels == ("10", "9007199254740992",
                                                                               "9007199254740993")
    with pytest.raises(BertkitError, match=r"labels '1' \(line 2\) and '1\.0' \(line 3\) are the same number"):
        classify_task(_examples(["1", "1.0", "0"]), "auto", "x", pairs=False)


def test_fractional_classes_are_values_in_numeric_order_and_one_written_two_ways_is_refused():
    """--problem-type classification on half-star ratings: pandas (run_glue.py's reader) reads 1 and 1.0 as one
    value and sorts 10.5 after 2. Was: '1' and '1.0' two classes of five, and the ids in text order (10.5 before 2)."""
    stars = ["0.5", "1", "1.5", "10.5", "2", "0.5", "1", "2"]
    assert classify_task(_examples(stars), "classification", "x", pairs=False).labels == ("0.5", "1", "1.5", "2",
                                                                                         "10.5")
    with pytest.raises(BertkitError, match=r"labels '1' \(line 3\) and '1\.0' \(line 5\) are the same number"):
        classify_task(_examples(["0.5", "1", "1.5", "1.0"]), "classification", "x", pairs=False)
    with pytest.raises(BertkitError, match=r"labels '0\.5' \(line 2\) and '\.50' \(line 4\) are the same number"):
        classify_task(_examples(["0.5", "2", ".50"]), "classification", "x", pairs=False)


def test_a_class_spelled_as_pandas_missing_value_is_kept_with_a_warning_naming_its_line(caplog):
    """R's write.csv writes a missing label NA, which run_glue.py's reader reads as missing (and then cannot sort
    among the names); bertkit keeps the class (a None category may be meant) but says so. Was: silent."""
    with caplog.at_level("WARNING", logger="bertkit"):
        task = classify_task(_examples(["pos", "NA", "neg", "NA"]), "auto", "x", pairs=False, source="r.csv")
    assert task.labels == ("NA", "neg", "pos")
    assert "r.csv:3: the class 'NA' (2 training rows) is how spreadsheets and pandas write a missing label" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="bertkit"):
        classify_task(_examples(["pos", "none", "neg"]), "auto", "x", pairs=False)  # lower case: a name to pandas
    assert "missing" not in caplog.text


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


def test_extract_features_inputs_are_read_with_the_same_line_checks(tmp_path):
    from bertkit.features import read_texts

    path = tmp_path / "in.txt"
    path.write_bytes(b"Hello world.\n\na ||| b\n")  # blank lines kept, as google's reader keeps them
    assert read_texts(path) == [("Hello world.", None), ("", None), ("a", "b")]
    path.write_bytes(b"Hello\n\x00\x00\n")
    with pytest.raises(BertkitError, match=r"in\.txt:2: a NUL byte"):
        read_texts(path)
    path.write_bytes("caf\xe9\n".encode("latin-1"))
    with pytest.raises(BertkitError, match=r"in\.txt is not UTF-8 text: line 1, byte 3"):
        read_texts(path)
    # Was: a JSON lines file's lines were texts, '{"text": "Hello"}' extracted token by token, braces and all.
    (tmp_path / "in.jsonl").write_text('{"text": "Hello"}\n', encoding="utf-8")
    with pytest.raises(BertkitError, match=r"input file .*in\.jsonl is a jsonl file, whose lines are records .* and "
                                           r"input files are read as plain text, one text \(or text_a \|\|\| text_b\) "
                                           r"per line: write the texts to a \.txt file"):
        read_texts(tmp_path / "in.jsonl")



def test_the_line_limit_of_a_text_file_is_per_line_not_per_file(tmp_path):
    """A text file longer than the limit in all (a CoNLL or GLUE file is tens of MB) is read line by line."""
    from bertkit.tasks.files import read_lines

    path = tmp_path / "long.txt"
    path.write_bytes(b"a short line\n" * 200)  # 2,600 bytes
    assert [n for n, _ in read_lines(path, max_line_bytes=1000)] == list(range(1, 201))


@pytest.mark.parametrize("quoting, line, field", [("minimal", 2, '"he said ""hi"""'), ("all", 1, '"text"')])
def test_a_tsv_written_with_csv_quoting_is_refused_not_read_with_its_quotes_in_the_text(tmp_path, quoting, line,
                                                                                        field):
    """Was: pandas' to_csv(sep="\\t") of the text `he said "hi"` read as the field written, its quotes doubled and
    wrapped (pandas reads it back as `he said "hi"`), and a TSV quoted throughout as having no 'text' column. GLUE's
    unquoted quotations are still text."""
    import csv

    path = tmp_path / "q.tsv"
    with open(path, "w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f, delimiter="\t", quoting=csv.QUOTE_MINIMAL if quoting == "minimal" else csv.QUOTE_ALL)
        writer.writerows([["text", "label"], ['he said "hi"', "pos"], ["bad film", "neg"]])
    with pytest.raises(BertkitError, match=rf"q\.tsv:{line}: the field {re.escape(repr(field))} is quoted as a CSV "
                                           r"writer quotes it; a \.tsv is read unquoted.*quoting=csv\.QUOTE_NONE\)\) "
                                           r"or save the file as \.csv"):
        read_inputs(path, "text-classification")
    path.write_text('text\tlabel\n"Hello," he said.\tpos\n"A whole quote."\tneg\n""\tneg\n', encoding="utf-8")
    texts = ['"Hello," he said.', '"A whole quote."', '""']
    assert read_inputs(path, "text-classification")[0] == [{"text": t} for t in texts]


@pytest.mark.parametrize("name, content, message", [
    ("e.csv", "text;label\ngood film;pos\n", r"e\.csv:2: no 'text' column \(it has text;label\); read as CSV \(separated "
     r"by ','\) the header is one column, so the file is separated by ';': re-save it separated by commas \(pandas: "
     r"pd\.read_csv\(FILE, sep=';'\)\.to_csv\('NEW\.csv', index=False\)\); or, if that is the column, name it with "
     r"--text-column$"),
    ("e.csv", "text;label\ngood, film;pos\n", r"e\.csv:2: 2 fields but the header names 1 \(text;label\); read as CSV "
     r"\(separated by ','\) the header is one column, so the file is separated by ';': re-save it"),
    ("e.tsv", "text,label\ngood film,pos\n", r"e\.tsv:2: no 'text' column \(it has text,label\); read as TSV "
     r"\(separated by '\\t'\) the header is one column, so the file is separated by ',': name it \.csv or pass "
     r"--input-format csv; or, if that is the column"),
])
def test_a_file_separated_by_another_character_is_named_so_not_sent_to_the_column_flag(tmp_path, name, content,
                                                                                       message):
    """Was: "no 'text' column (it has text;label); name it with --text-column" for the CSV Excel writes where the
    decimal mark is a comma, a fix that cannot work; and for a comma in a text, the CSV quoting advice."""
    path = tmp_path / name
    path.write_text(content, encoding="utf-8")
    with pytest.raises(BertkitError, match=message):
        read_inputs(path, "text-classification")


def test_a_csv_record_spanning_lines_is_named_by_the_line_it_starts_on(tmp_path):
    """Was: by its last line (file:4 for a record on lines 2 to 4), where a record that could not be parsed was named
    by its first: an error sent the reader into the middle of a text, and swag's predictions.jsonl gave the line."""
    path = tmp_path / "t.csv"
    path.write_text('text,label\n"a review\nover\nthree lines",\n"next",pos\n', encoding="utf-8")
    with pytest.raises(BertkitError, match=r"t\.csv:2: empty 'label'"):
        read_labelled(path, _classify(tmp_path), TOK)
    path.write_text('text,label\n"a review\nover two lines",pos,extra\n', encoding="utf-8")
    with pytest.raises(BertkitError, match=r"t\.csv:2: 3 fields but the header names 2"):
        list(read_records(path, "csv"))


@pytest.mark.parametrize("train, dev, labels", [
    (["pos", "pos", "neg", "pos"], ["neg", "pos"], ("neg", "pos")),  # neg first at line 4
    (["5.000", "4.000", "3.800", "2.600"], ["3.800", "1.200"], None),  # a score: regression
])
def test_max_train_samples_keeps_the_whole_training_files_classes(tmp_path, monkeypatch, train, dev, labels):
    """run_glue.py takes its label list (and regression, from the column's type) from the whole training file before
    --max-train-samples selects rows. Was: from the first N rows alone, so a class first seen later made the dev file
    refused ("label 'neg' never occurs in train.csv", which it does), and a score whose first rows were whole numbers
    (STS-B's 5.000, 4.000) became classes."""
    from bertkit.training import classify

    TOK.save_pretrained(tmp_path / "model")
    for name, rows in (("train.csv", train), ("dev.csv", dev)):
        (tmp_path / name).write_text("text,label\n" + "".join(f"good film,{x}\n" for x in rows), encoding="utf-8")
    seen = {}
    monkeypatch.setattr(classify, "fit_sequence_classifier",
                        lambda task, tr, dv, s, tokenizer: seen.update(labels=task.labels, rows=[e.label for e in tr]))
    classify.finetune_classify(ClassifySettings(model_name_or_path=tmp_path / "model", output_dir=tmp_path / "out",
                                                train_file=tmp_path / "train.csv", validation_file=tmp_path / "dev.csv",
                                                max_train_samples=2))
    assert seen == {"labels": labels, "rows": train[:2]}


@pytest.mark.parametrize("name, second", [("j.csv", b"\xef\xbb\xbftext,label\n"), ("j.tsv", b"text\tlabel\r\n")])
def test_a_header_repeated_by_files_joined_with_cat_is_refused_not_read_as_a_row(tmp_path, name, second):
    """`cat a.csv b.csv`: b's header (with its byte-order mark, or its CRLF) was read as one more row, the text 'text'
    with the class 'label' trained on (and predicted), as pandas and so run_glue.py read it."""
    sep = b"\t" if name.endswith("tsv") else b","
    path = tmp_path / name
    path.write_bytes(b"text" + sep + b"label\ngood" + sep + b"pos\n" + second + b"bad" + sep + b"neg\n")
    with pytest.raises(BertkitError, match=rf"j\.{name[2:]}:3: this row repeats the header \(text, label\), so it "
                                           r"would be read as one more input.*remove this line"):
        read_labelled(path, _classify(tmp_path), TOK)
    path.write_text("text\ngood\ntext\n", encoding="utf-8")  # one column: a text may be the column's name
    assert read_inputs(path, "text-classification", input_format="csv")[0] == [{"text": "good"}, {"text": "text"}]
