"""Users' mistakes on the user-facing surfaces give one clear error (exit 2 on the command line) or a
correct result: `finetune classify` label columns, `pipeline()` arguments and inputs, `predict` files,
corrupt checkpoints and conversion inputs: each a finding of the reliability campaign (RESULTS.md) that needed a
fix. The campaign's sweeps of users' files are test_user_input_sweep.py."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from pathlib import Path

import pytest

from bertkit.errors import BertkitError
from bertkit.inference.files import Columns, check_writable, read_inputs
from bertkit.tasks.files import read_records
from bertkit.tasks.glue import GlueExample
from bertkit.tokenization import BertTokenizer
from bertkit.training.classify import classify_task

MODEL = Path(os.environ.get("BERTKIT_TEST_MODEL", "models/minilm"))
TOK = BertTokenizer(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "good", "bad"])  # what the file reader needs
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


@pytest.mark.parametrize("problem_type", ["auto", "classification"])
@pytest.mark.parametrize("missing", ["NA", "null", "None", "N/A"])
def test_a_missing_value_among_numeric_labels_is_refused_not_made_a_class(problem_type, missing):
    """Was: classes ('0', '1', 'NA'); run_glue.py's loader reads the cell as missing (None)."""
    with pytest.raises(BertkitError, match=rf"^d\.csv:4: label '{missing}' among numbers is a missing value, not a "):
        classify_task(_examples(["0", "1", missing, "1"]), problem_type, "d", pairs=False, source=Path("d.csv"))
    names = classify_task(_examples(["yes", "no", missing]), "auto", "d", pairs=False).labels  # among names: a class
    assert names == tuple(sorted(["yes", "no", missing]))


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


# -- pipeline(): its arguments and its inputs ------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory, tiny_checkpoint) -> dict[str, Path]:
    """Tiny checkpoints (2 layers, 32 wide) with a 12-word vocabulary: a classifier and a bare encoder."""
    from bertkit import BertTokenizer

    root = tmp_path_factory.mktemp("tiny")
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "good", "bad", "film", "dull", "fine", "##s"]
    (root / "vocab.txt").write_text("\n".join(words) + "\n", encoding="utf-8")
    tok = BertTokenizer(root / "vocab.txt")
    config = dict(tokenizer=tok, num_attention_heads=2, max_position_embeddings=64)
    # The encoder's weights are drawn after the classifier's from the one seed (seed=None: no reseeding).
    return {"clf": tiny_checkpoint(root / "clf", "BertForSequenceClassification", labels=["neg", "pos"], **config),
            "enc": tiny_checkpoint(root / "enc", seed=None, **config)}


TASK_LIST = "fill-mask, text-classification"


@pytest.mark.parametrize("args, message", [
    ((None,), rf"^pipeline\(\) needs a model: pipeline\(task, model=.*with task one of {TASK_LIST}"),
    ((5,), rf"^unknown pipeline task 5; choose one of {TASK_LIST}"),
    ((["text-classification"],), r"^unknown pipeline task \['text-classification'\]; choose one of"),
    (("text-classification",), r"^pipeline\('text-classification'\) needs a model"),
])
def test_pipeline_without_a_usable_task_or_model_names_the_tasks(args, message):
    from bertkit import pipeline

    with pytest.raises(BertkitError, match=message):
        pipeline(*args)


def test_pipeline_takes_the_model_as_a_keyword_as_transformers_does(tiny_dirs):
    from bertkit import BertForSequenceClassification, BertTokenizer, pipeline
    from bertkit.inference import TextClassificationPipeline

    texts = ["a good film", "dull films", "film"]
    expected = pipeline("text-classification", tiny_dirs["clf"])(texts)
    for pipe in (pipeline("text-classification", model=tiny_dirs["clf"]),
                 pipeline(task="text-classification", model=str(tiny_dirs["clf"])),
                 pipeline("sentiment-analysis", model=tiny_dirs["clf"]),
                 pipeline("text-classification", model=BertForSequenceClassification.from_pretrained(tiny_dirs["clf"]),
                          tokenizer=BertTokenizer.from_pretrained(tiny_dirs["clf"]))):
        assert isinstance(pipe, TextClassificationPipeline)
        assert pipe(texts) == expected
    assert [r["label"] for r in expected] == [max(r["scores"], key=r["scores"].get) for r in expected]
    with pytest.raises(BertkitError, match=r"^pipeline\(model=\.\.\.\) needs a task: .*; pass one of fill-mask, "):
        pipeline(model=tiny_dirs["enc"])  # an encoder extracts features or embeds sentences: which is not guessed
    with pytest.raises(BertkitError, match=r"the arguments are \(task, model\)"):
        pipeline(str(tiny_dirs["clf"]), "text-classification")
    with pytest.raises(BertkitError, match="pipeline model must be a checkpoint directory .* got int"):
        pipeline("text-classification", model=5)


@pytest.mark.parametrize("inputs, message", [
    (None, r"takes a str or dict or tuple or a list of them, got NoneType"),
    (5, r"takes a str or dict or tuple or a list of them, got int '5'"),
    (b"good", r"got bytes"),
    ({"good", "bad"}, r"inputs are a set, which has no order"),
    ([["a", "b"]], r"^text-classification input 0 is list"),
    ([None], r"^text-classification input 0 is NoneType"),
])
def test_a_pipeline_given_none_a_number_or_nested_lists_names_what_it_takes(tiny_dirs, inputs, message):
    from bertkit import pipeline

    with pytest.raises(BertkitError, match=message):
        pipeline("text-classification", tiny_dirs["clf"])(inputs)


def test_an_empty_text_is_refused_in_every_field_of_every_task_and_a_text_of_unknown_characters_is_not(
        tiny_dirs, tiny_checkpoint, tmp_path):
    """One rule for an empty text (bertkit.inference.base.refuse_empty_text), which `predict` and every serve route
    apply through the pipeline: no token of its own. Was: the pipeline answered "" with [CLS] [SEP]'s output while
    the server refused a text of emoji ([CLS] [UNK] [SEP]) as empty."""
    from bertkit import pipeline

    clf = pipeline("text-classification", tiny_dirs["clf"])
    qa = pipeline("question-answering", tiny_checkpoint(tmp_path / "qa", "BertForQuestionAnswering",
                                                        tokenizer=tiny_dirs["clf"]))
    mc = pipeline("multiple-choice", tiny_checkpoint(tmp_path / "mc", "BertForMultipleChoice",
                                                     tokenizer=tiny_dirs["clf"]))
    for pipe, inputs, where, text in (
            (clf, ["good", ""], "text-classification input 1", ""),
            (clf, ["good", "\u200b \u200d"], "text-classification input 1", "\u200b \u200d"),
            (clf, [("good film", " ")], "text-classification input 0's text_pair", " "),
            (clf, [{"text": "\t", "text_pair": "good"}], "text-classification input 0's text", "\t"),
            (qa, [{"question": "\x07", "context": "a good film"}], "question-answering input 0's question", "\x07"),
            (mc, [{"context": "a film", "choices": ["good", "  "]}], "multiple-choice input 0's choices[1]", "  ")):
        with pytest.raises(BertkitError) as e:
            pipe(inputs)
        assert str(e.value) == (f"{where} is empty: {text!r} holds no token (it is blank, or only control or "
                                "zero-width characters), so the model would read [CLS] and [SEP] alone in its "
                                "place, the same for every empty text; send text, or leave it out")
    emoji = "\U0001F600 \U0001F389"  # [UNK] [UNK]: tokens the model reads
    assert clf(emoji) == clf("[UNK] [UNK]")
    assert clf(["good", emoji])[1]["scores"] == pytest.approx(clf(emoji)["scores"], abs=1e-6)


def test_a_pipeline_over_10000_inputs_keeps_their_order_and_an_empty_batch_gives_nothing(tiny_dirs):
    from bertkit import pipeline

    pipe = pipeline("text-classification", tiny_dirs["clf"], batch_size=256, progress=False)
    words = ["good", "bad", "film", "dull"]
    texts = [" ".join(words[(i * 7 + j) % 4] for j in range(1 + i % 9)) for i in range(10_000)]  # none empty
    results = pipe(texts)
    assert len(results) == 10_000 and pipe([]) == []
    for i in (0, 1, 8, 5_000, 9_999):
        assert results[i]["scores"] == pytest.approx(pipe(texts[i])["scores"], abs=1e-6)


def test_a_truncated_safetensors_file_names_it_before_any_weight_loads(tiny_dirs, tmp_path):
    from bertkit import pipeline

    broken = tmp_path / "broken"
    broken.mkdir()
    for f in tiny_dirs["clf"].iterdir():
        data = f.read_bytes()
        (broken / f.name).write_bytes(data[: len(data) // 2] if f.name == "model.safetensors" else data)
    with pytest.raises(BertkitError, match=r"broken/model\.safetensors could not be read as safetensors .*truncated"):
        pipeline("text-classification", broken)


# -- predict: users' files -------------------------------------------------------------------------------


@pytest.mark.parametrize("name, content", [
    ("b.jsonl", '\ufeff{"text": "good"}\n"bad"\n'),
    ("b.txt", "\ufeffgood\r\nbad\r\n"),
    ("b.csv", "\ufefftext\r\ngood\r\nbad\r\n"),
    ("b.tsv", "\ufeffid\ttext\r\n1\tgood\r\n2\tbad\r\n"),
])
def test_a_byte_order_mark_and_crlf_line_ends_are_not_part_of_any_text(tmp_path, name, content):
    path = tmp_path / name
    path.write_bytes(content.encode("utf-8"))
    inputs, _ = read_inputs(path, "text-classification", tokenizer=TOK)
    assert [x if isinstance(x, str) else x["text"] for x in inputs] == ["good", "bad"]


def test_an_unclosed_csv_quote_is_refused_naming_its_line_not_read_as_one_field_to_the_end(tmp_path):
    path = tmp_path / "u.csv"
    path.write_text('text,n\ngood,1\n"never closed,2\nthird,3\nfourth,4\n', encoding="utf-8")
    with pytest.raises(BertkitError, match=r"u\.csv:3: not valid CSV from this line on \(unexpected end of data\)"):
        read_inputs(path, "text-classification", tokenizer=TOK)
    path.write_text('text\n"a"b\n', encoding="utf-8")  # text after a closing quote
    with pytest.raises(BertkitError, match=r"u\.csv:2: not valid CSV"):
        list(read_records(path, "csv"))
    path.write_text('text,n\n"two\nlines",1\n"say ""hi""",2\n', encoding="utf-8")  # what RFC 4180 allows still reads
    assert read_inputs(path, "text-classification", Columns(), tokenizer=TOK)[0] == [{"text": "two\nlines"},
                                                                                       {"text": 'say "hi"'}]


def test_an_input_directory_and_an_unwritable_output_are_refused_naming_them(tmp_path):
    (tmp_path / "inputs.csv").mkdir()
    with pytest.raises(BertkitError, match=r"inputs\.csv is a directory; pass the file"):
        read_inputs(tmp_path / "inputs.csv", "text-classification", tokenizer=TOK)
    (tmp_path / "afile").write_text("x")
    with pytest.raises(BertkitError, match=r"out\.jsonl: .*afile is not a directory"):
        check_writable(tmp_path / "afile" / "out.jsonl")
    check_writable(tmp_path / "new" / "deeper" / "out.jsonl")  # directories still to be made are fine
    assert not (tmp_path / "new").exists()
    if os.geteuid() == 0:  # root writes anywhere but where the kernel forbids it
        if not Path("/sys").is_dir():
            return
        target = Path("/sys/out.jsonl")
    else:
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o500)
        target = ro / "out.jsonl"
    with pytest.raises(BertkitError, match=r"out\.jsonl cannot be written: .*; choose a writable directory"):
        check_writable(target)


def _predict(model: Path, path: Path, *extra: str) -> int:
    from bertkit.cli import main

    return main(["predict", "text-classification", "--model", str(model), "--input", str(path), "--output-file",
                 str(path.with_suffix(".out.jsonl")), "--no-progress", *extra])


def test_predict_on_pairs_it_was_not_told_about_warns_and_a_pair_trained_model_refuses(tiny_dirs, tmp_path, capsys,
                                                                                       caplog):
    import shutil

    path = tmp_path / "pairs.jsonl"
    path.write_text('{"text": "a good film", "text_b": "dull"}\n{"text": "bad", "text_b": "fine"}\n',
                    encoding="utf-8")
    with caplog.at_level(logging.WARNING, logger="bertkit"):
        assert _predict(tiny_dirs["clf"], path) == 0  # a single-text model: the first texts, and a warning
    assert "pairs.jsonl:1: the inputs hold a second text (field 'text_b')" in caplog.text
    assert len(path.with_suffix(".out.jsonl").read_text().splitlines()) == 2

    pair_model = tmp_path / "pair-model"
    shutil.copytree(tiny_dirs["clf"], pair_model)
    config = json.loads((pair_model / "config.json").read_text())
    (pair_model / "config.json").write_text(json.dumps({**config, "text_pair": True}))
    path.with_suffix(".out.jsonl").unlink()
    capsys.readouterr()
    assert _predict(pair_model, path) == 2
    err = capsys.readouterr().err
    assert "pairs.jsonl:1: the model was fine-tuned on text pairs" in err and "--text-pair-column text_b" in err
    assert not path.with_suffix(".out.jsonl").exists()
    assert _predict(pair_model, path, "--text-pair-column", "text_b") == 0


def test_predict_reads_text_pair_fields_as_pairs_as_transformers_reads_the_dict(tiny_dirs, tmp_path, caplog):
    """Was: {"text", "text_pair"} lines classified on their first text alone unless --text-pair-column named the
    field (a warning logged): transformers' pipeline reads that dict as the pair."""
    from bertkit import pipeline

    rows = [{"text": "a good film", "text_pair": "dull"}, {"text": "bad", "text_pair": "fine"}]
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    with caplog.at_level(logging.WARNING, logger="bertkit"):
        assert _predict(tiny_dirs["clf"], path) == 0
    assert caplog.text == ""
    out = [json.loads(line) for line in path.with_suffix(".out.jsonl").read_text().splitlines()]
    expected = pipeline("text-classification", tiny_dirs["clf"], progress=False)(rows)
    assert [o["scores"] for o in out] == [e["scores"] for e in expected]
    single = pipeline("text-classification", tiny_dirs["clf"], progress=False)([r["text"] for r in rows])
    assert [o["scores"] for o in out] != [e["scores"] for e in single]  # the pairs' scores, not the first texts'


def test_predict_refuses_a_whitespace_row_a_nul_byte_and_a_line_over_the_limit_with_exit_2(tiny_dirs, tmp_path,
                                                                                           capsys):
    cases = {"ws.csv": (b"text,n\ngood,1\n   ,2\n", "ws.csv:3: 'text' is empty: '   ' holds no token"),
             "nul.txt": (b"good\n" + b"\x00" * 3_000_000 + b"\n", "nul.txt:2: a NUL byte"),
             "long.txt": (b"good\n" + b"w " * 1_500_000 + b"\n", "long.txt:2: this line is longer than 1,000,000 bytes")}
    for name, (content, message) in cases.items():
        (tmp_path / name).write_bytes(content)
        assert _predict(tiny_dirs["clf"], tmp_path / name, "--max-line-bytes", "1000000") == 2, name
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, err
        assert not (tmp_path / name).with_suffix(".out.jsonl").exists()


def test_finetune_classify_marks_a_pair_model_in_its_config(tiny_dirs, tmp_path):
    from bertkit.cli import main

    rows = "good,fine,pos\nbad,dull,neg\ngood film,fine,pos\ndull,bad,neg\n"
    (tmp_path / "b.csv").write_text("text,text_b,label\n" + rows, encoding="utf-8")
    (tmp_path / "p.csv").write_text("text,text_pair,label\n" + rows, encoding="utf-8")  # transformers' key: a pair
    # a text_pair column is read as the pair with no flag (--text-pair-column text_b reads b.csv's the same way);
    # text_b, which no flag names, is warned about and left out
    for train, out in (("p.csv", "pair"), ("b.csv", "single")):
        assert main(["finetune", "classify", "--model", str(tiny_dirs["clf"]), "--train-file", str(tmp_path / train),
                     "--validation-file", str(tmp_path / train), "--output-dir", str(tmp_path / out),
                     "--num-train-epochs", "1", "--batch-size", "2", "--max-seq-length", "64", "--no-progress"]) == 0
    for out, pair in (("pair", True), ("single", False)):
        assert json.loads((tmp_path / out / "best" / "config.json").read_text())["text_pair"] is pair


# -- finetune classify: the checkpoint and the validation file ------------------------------------------


def _csv(path: Path, labels: list[str]) -> Path:
    texts = ["a good film", "dull", "fine", "bad", "good films", "a dull film"]
    path.write_text("text,label\n" + "".join(f"{t},{y}\n" for t, y in zip(texts, labels)), encoding="utf-8")
    return path


def test_finetune_classify_gives_a_fresh_head_to_a_checkpoint_fine_tuned_for_other_labels(tiny_dirs, tmp_path):
    from bertkit.cli import main

    train = _csv(tmp_path / "train.csv", ["0.5", "1.5", "2.2", "2.5", "0.1", "3.0"])  # regression from a 2-class head
    assert main(["finetune", "classify", "--model", str(tiny_dirs["clf"]), "--train-file", str(train),
                 "--validation-file", str(train), "--output-dir", str(tmp_path / "reg"), "--num-train-epochs", "1",
                 "--batch-size", "3", "--max-seq-length", "64", "--no-progress"]) == 0
    config = json.loads((tmp_path / "reg" / "best" / "config.json").read_text())
    assert config["problem_type"] == "regression" and len(config["id2label"]) == 1

    train = _csv(tmp_path / "three.csv", ["a", "b", "c", "a", "b", "c"])  # three classes from a 2-class head
    assert main(["finetune", "classify", "--model", str(tiny_dirs["clf"]), "--train-file", str(train),
                 "--validation-file", str(train), "--output-dir", str(tmp_path / "three"), "--num-train-epochs", "1",
                 "--batch-size", "3", "--max-seq-length", "64", "--no-progress"]) == 0
    config = json.loads((tmp_path / "three" / "best" / "config.json").read_text())
    assert config["id2label"] == {"0": "a", "1": "b", "2": "c"}


def test_one_class_written_two_ways_is_one_class_or_refused(tiny_dirs, tmp_path, capsys):
    """"text, pos" (a CSV's ", ") gives the label " pos": read stripped, it is the class "pos", not a third class beside
    "pos" and "neg"; "1" and "1.0" are one number written two ways, refused (two classes, or one, by a guess)."""
    from bertkit.cli import main

    def run(labels: list[str], out: str) -> int:
        train = _csv(tmp_path / f"{out}.csv", labels)
        return main(["finetune", "classify", "--model", str(tiny_dirs["clf"]), "--train-file", str(train),
                     "--validation-file", str(train), "--output-dir", str(tmp_path / out), "--max-seq-length", "64",
                     "--num-train-epochs", "1", "--batch-size", "3", "--no-progress"])

    assert run(["pos", "neg", " pos", "neg", "pos ", "neg"], "spaced") == 0
    config = json.loads((tmp_path / "spaced" / "best" / "config.json").read_text())
    assert config["id2label"] == {"0": "neg", "1": "pos"}
    capsys.readouterr()
    assert run(["1", "0", "1.0", "0", "1", "0"], "numbers") == 2
    assert re.search(r"labels '1' \(line 2\) and '1.0' \(line 4\) are the same number written two ways, so they "
                     "would be two classes", capsys.readouterr().err)
    assert not (tmp_path / "numbers").exists()


def test_finetune_classify_with_eval_strategy_no_scores_dev_once_at_the_end(tiny_dirs, tmp_path):
    """The grid picks its run on dev: with --eval-strategy no (no evaluation during training) dev is scored once on
    the final weights, as an evaluation at the last step scores it. Was: the run was marked failed ("dev score is
    nan") after training, and the command failed with every run."""
    from bertkit.cli import main

    train = _csv(tmp_path / "train.csv", ["pos", "neg", "pos", "neg", "pos", "neg"])
    reports = {}
    for strategy in ("no", "epoch"):
        out = tmp_path / strategy
        assert main(["finetune", "classify", "--model", str(tiny_dirs["clf"]), "--train-file", str(train),
                     "--validation-file", str(train), "--output-dir", str(out), "--max-steps", "3", "--batch-size",
                     "2", "--max-seq-length", "64", "--no-progress", "--eval-strategy", strategy]) == 0
        reports[strategy] = json.loads((out / "report.json").read_text())["runs"][0]
    assert reports["no"]["per_epoch"] == [] and "failed" not in reports["no"]
    assert reports["no"]["dev"] == reports["epoch"]["dev"] == {"accuracy": reports["epoch"]["per_epoch"][-1]["accuracy"]}


def test_a_constant_regression_validation_column_is_refused_before_training(tiny_dirs, tmp_path, capsys):
    from bertkit.cli import main

    train = _csv(tmp_path / "train.csv", ["0.5", "1.5", "2.2", "2.5", "0.1", "3.0"])
    dev = _csv(tmp_path / "dev.csv", ["1.5", "1.5", "1.5"])
    out = tmp_path / "run"
    assert main(["finetune", "classify", "--model", str(tiny_dirs["enc"]), "--train-file", str(train),
                 "--validation-file", str(dev), "--output-dir", str(out), "--max-seq-length", "64",
                 "--no-progress"]) == 2
    assert "dev.csv: every label is 1.5, so the correlations regression is scored by" in capsys.readouterr().err
    assert not (out / "runs").exists()


# -- export onnx, convert-tf-checkpoint: corrupt or mismatched inputs -----------


def test_export_reads_a_config_that_is_not_json_or_names_one_architecture_as_a_string(tiny_dirs, tmp_path):
    from bertkit.inference.export import load_for_export

    m = tmp_path / "m"
    m.mkdir()
    for f in tiny_dirs["clf"].iterdir():
        (m / f.name).write_bytes(f.read_bytes())
    config = json.loads((m / "config.json").read_text())
    (m / "config.json").write_text(json.dumps({**config, "architectures": "BertForSequenceClassification"}))
    assert type(load_for_export(m)).__name__ == "BertForSequenceClassification"
    (m / "config.json").write_text('{"hidden_size": 32,')
    with pytest.raises(BertkitError, match=r"m/config\.json is not valid JSON"):
        load_for_export(m)


def test_a_head_under_no_named_architecture_is_refused_not_exported_or_quantized_without_it(tiny_dirs, tmp_path):
    """A classifier's config.json without "architectures" loaded as the bare encoder: `bertkit quantize` and ONNX
    export wrote the encoder alone, the classifier dropped without a word. The head's weights are named instead."""
    from bertkit.inference.export import load_for_export
    from bertkit.quantization import quantize_checkpoint

    m = tmp_path / "m"
    shutil.copytree(tiny_dirs["clf"], m)
    config = json.loads((m / "config.json").read_text())
    (m / "config.json").write_text(json.dumps({k: v for k, v in config.items() if k != "architectures"}))
    message = r"m/config\.json names no architecture and the weights hold a head \(classifier\).*BertForSequenceClass"
    with pytest.raises(BertkitError, match=message):
        load_for_export(m)
    with pytest.raises(BertkitError, match=message):
        quantize_checkpoint(m, tmp_path / "q")
    assert not (tmp_path / "q").exists()
    (m / "config.json").write_text(json.dumps({**config, "architectures": ["BertModel"]}))  # the encoder alone, asked
    assert type(load_for_export(m)).__name__ == "BertModel"
    encoder = tmp_path / "enc"
    shutil.copytree(tiny_dirs["enc"], encoder)
    config = json.loads((encoder / "config.json").read_text())
    (encoder / "config.json").write_text(json.dumps({k: v for k, v in config.items() if k != "architectures"}))
    assert type(load_for_export(encoder)).__name__ == "BertModel"  # no head: the encoder, as before


def test_a_corrupt_tensorflow_index_or_config_is_named_not_a_parser_traceback(tiny_dirs, tmp_path):
    import struct

    import numpy as np

    from bertkit.inference.tf_checkpoint import convert_tf_checkpoint, read_sstable, read_tf_checkpoint
    from tf_bundle_helpers import (  # tests/ is on sys.path under pytest
        bundle_entries,
        write_bundle,
        write_table,
    )

    index = tmp_path / "zeros.ckpt.index"  # the magic number, and offsets pointing at nothing
    index.write_bytes(b"\x00" * 140 + struct.pack("<Q", 0xDB4775248B80FB57))
    with pytest.raises(BertkitError, match=r"zeros\.ckpt\.index is corrupt: a block of 0 bytes at offset 0 fails its "):
        read_sstable(index)
    index.write_bytes(b"\x00" * 8 + struct.pack("<Q", 0xDB4775248B80FB57))  # shorter than a table's footer
    with pytest.raises(BertkitError, match=r"zeros\.ckpt\.index is not a TensorFlow checkpoint index"):
        read_sstable(index)
    write_bundle(tmp_path / "bert_model.ckpt", {"bert/pooler/dense/bias": np.zeros(4, np.float32)})
    # entries a writer other than TensorFlow got wrong, in blocks whose checksums hold: named, not a TypeError
    header, (name, entry) = bundle_entries({"bert/pooler/dense/bias": np.zeros(4, np.float32)})[0]
    for bad, why in ((b"\x0e" + entry[1:], "unsupported protobuf wire type 6"),  # the dtype's tag
                     (b"\x0a\x01\x00" + entry[2:], "a field holds bytes where the bundle's format has int"),
                     (entry + b"\x10\x04", "a field holds int where the bundle's format has bytes")):
        write_table(tmp_path / "bert_model.ckpt.index", [header, (name, bad)])
        with pytest.raises(BertkitError, match=rf"bert_model\.ckpt\.index is corrupt \(ValueError: {why}"):
            read_tf_checkpoint(tmp_path / "bert_model.ckpt")
    (tmp_path / "bert_config.json").write_text("hidden_size = 32\n")
    with pytest.raises(BertkitError, match=r"bert_config\.json is not valid JSON"):
        convert_tf_checkpoint(tmp_path / "bert_model.ckpt", tmp_path / "bert_config.json",
                              tiny_dirs["clf"] / "vocab.txt", tmp_path / "out")


def test_a_device_this_machine_lacks_or_a_misspelt_one_is_named(tiny_dirs):
    import torch

    from bertkit import pipeline
    from bertkit.inference.prepare import check_request as pipeline_device

    with pytest.raises(BertkitError, match=r"device 'gpu' is not a device: use auto, cpu, cuda or cuda:N"):
        pipeline("text-classification", tiny_dirs["clf"], device="gpu")
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    with pytest.raises(BertkitError, match=r"device 'cuda:99': (PyTorch sees no CUDA GPU|this machine has)"):
        pipeline_device("cuda:99")
    assert pipeline_device("auto").type == ("cuda" if count else "cpu")
    assert pipeline_device(torch.device("cpu")) == torch.device("cpu")
