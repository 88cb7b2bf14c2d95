"""`bertkit predict TASK` on users' files and `bertkit finetune classify` on users' CSV: real text, real model.

Predictions from a file equal the Python pipeline's on the same inputs, in order, whatever the format;
bad rows name file and line; classify learns SST-2 sentiment from 400 rows of CSV. The paths compared run MiniLM's
first 2 layers (conftest's ``minilm_2_layers``: real weights, a third of the time); learning takes all 6.
"""

from __future__ import annotations

import csv
import json
import os
import re
from pathlib import Path

import pytest
import torch

from bertkit.cli import main
from bertkit.errors import BertkitError

MODEL = Path(os.environ.get("BERTKIT_TEST_MODEL", "models/minilm"))
GLUE = Path(__file__).resolve().parents[2] / "shared" / "data" / "glue"
SQUAD = Path(__file__).resolve().parents[2] / "shared" / "data" / "squad" / "dev-v1.1.json"

pytestmark = [
    pytest.mark.skipif(not (MODEL / "config.json").is_file(), reason=f"no checkpoint at {MODEL} (make model)"),
    pytest.mark.skipif(not (GLUE / "SST-2" / "dev.tsv").is_file(), reason=f"GLUE data not found under {GLUE}"),
]


def _tsv(name: str, split: str) -> list[dict[str, str]]:
    with open(GLUE / name / f"{split}.tsv", encoding="utf-8", newline="") as f:
        return list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))


def _read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_predict_text_classification_from_csv_jsonl_and_text_equals_the_pipeline(seeded_classifier, tmp_path):
    from bertkit import pipeline

    rows = _tsv("SST-2", "dev")[:64]  # four batches of 16, bucketed by length: the order must come back
    texts = [r["sentence"] for r in rows]
    texts[7] = 'a review with "quotes", commas, and a\nnewline'  # CSV quoting round trip
    with open(tmp_path / "in.csv", "w", encoding="utf-8", newline="") as f:
        w = csv.writer(f)
        w.writerow(["review", "ref"])
        w.writerows([t, f"r{i}"] for i, t in enumerate(texts))
    (tmp_path / "in.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8")
    (tmp_path / "in.txt").write_text("".join(t.replace("\n", " ") + "\n" for t in texts), encoding="utf-8")
    expected = pipeline("text-classification", seeded_classifier, batch_size=16)(texts)
    base = ["predict", "text-classification", "--model", str(seeded_classifier), "--batch-size", "16", "--no-progress"]
    assert main([*base, "--input", str(tmp_path / "in.csv"), "--text-column", "review", "--id-column", "ref",
                 "--output-file", str(tmp_path / "csv.jsonl")]) == 0
    assert main([*base, "--input", str(tmp_path / "in.jsonl"), "--output-file", str(tmp_path / "jsonl.jsonl")]) == 0
    assert main([*base, "--input", str(tmp_path / "in.txt"), "--output-file", str(tmp_path / "txt.jsonl")]) == 0
    got_csv, got_jsonl, got_txt = (_read(tmp_path / f"{n}.jsonl") for n in ("csv", "jsonl", "txt"))
    assert [r.pop("id") for r in got_csv] == [f"r{i}" for i in range(64)]
    assert [r.pop("id") for r in got_jsonl] == list(range(64))
    assert got_csv == expected and got_jsonl == expected  # exact: same rows, same batches, same order
    del expected[7], got_txt[7]  # the text file cannot hold the newline
    assert [{k: v for k, v in r.items() if k != "id"} for r in got_txt] == expected


def test_predict_pairs_and_question_answering_from_jsonl(seeded_classifier, tmp_path, minilm_2_layers):
    from bertkit import pipeline
    from bertkit.heads import BertForQuestionAnswering
    from bertkit.tokenization import BertTokenizer

    rows = _tsv("MRPC", "dev")[:40]
    with open(tmp_path / "pairs.tsv", "w", encoding="utf-8") as f:
        f.write("s1\ts2\n" + "".join(f"{r['#1 String']}\t{r['#2 String']}\n" for r in rows))
    assert main(["predict", "text-classification", "--model", str(seeded_classifier), "--input", str(tmp_path / "pairs.tsv"),
                 "--text-column", "s1", "--text-pair-column", "s2", "--output-file", str(tmp_path / "p.jsonl"),
                 "--no-progress"]) == 0
    expected = pipeline("text-classification", seeded_classifier)([(r["#1 String"], r["#2 String"]) for r in rows])
    assert [{k: v for k, v in r.items() if k != "id"} for r in _read(tmp_path / "p.jsonl")] == expected

    if not SQUAD.is_file():
        pytest.skip(f"SQuAD dev not found at {SQUAD}")
    qa_dir = tmp_path / "qa"
    torch.manual_seed(0)
    BertForQuestionAnswering.from_pretrained(minilm_2_layers).save_pretrained(qa_dir)
    BertTokenizer.from_pretrained(minilm_2_layers).save_pretrained(qa_dir)
    article = json.loads(SQUAD.read_text(encoding="utf-8"))["data"][0]["paragraphs"][0]
    items = [{"question": q["question"], "context": article["context"]} for q in article["qas"][:6]]
    (tmp_path / "qa.jsonl").write_text("".join(json.dumps(x) + "\n" for x in items), encoding="utf-8")
    assert main(["predict", "question-answering", "--model", str(qa_dir), "--input", str(tmp_path / "qa.jsonl"),
                 "--output-file", str(tmp_path / "qa-out.jsonl"), "--top-k", "2", "--no-progress"]) == 0
    expected = pipeline("question-answering", qa_dir)(items, top_k=2)
    got = _read(tmp_path / "qa-out.jsonl")
    assert [{k: v for k, v in r.items() if k != "id"} for r in got] == json.loads(json.dumps(expected))
    assert all(article["context"][r["start"]:r["end"]] == r["answer"] for r in got)


@pytest.mark.parametrize("name, content, message", [
    ("bad.csv", "text,x\nfine,1\n\"unclosed,2\nok,3,4\n", "bad.csv:"),
    ("bad.csv", "text,x\nfine,1\nthree,fields,here\n", "bad.csv:3: 3 fields but the header names 2"),
    ("bad.jsonl", '{"text": "fine"}\n{"text": broken}\n', "bad.jsonl:2: not valid JSON"),
    ("bad.jsonl", '{"text": "fine"}\n{"body": "x"}\n', "bad.jsonl:2: no 'text' field (it has body)"),
    ("bad.jsonl", '{"text": "fine"}\n{"text": 3}\n', "bad.jsonl:2: 'text' must be a string, got 3"),
    ("empty.jsonl", "\n\n", "holds no inputs"),
    ("dup.csv", "text,id,text\na,1,b\n", "dup.csv:1: the header names column 'text' more than once"),
    ("gap.tsv", "text\tx\nfine\t1\n\nalso fine\t2\n", "gap.tsv:3: blank line"),
    # quoting a tab, as the CSV advice said, does not help in a TSV: its quotes are text
    ("tab.tsv", 'text\tx\n"a\tb"\t1\n',
     "tab.tsv:2: 3 fields but the header names 2 (text, x); a TSV field holds no tab"),
    ("notes.dat", "fine\n", "notes.dat: cannot tell the format from the suffix '.dat'; pass --input-format"),
])
def test_a_malformed_input_names_file_and_line_and_writes_nothing(seeded_classifier, tmp_path, capsys, name, content,
                                                                   message):
    (tmp_path / name).write_text(content, encoding="utf-8")
    out = tmp_path / "out.jsonl"
    assert main(["predict", "text-classification", "--model", str(seeded_classifier), "--input", str(tmp_path / name),
                 "--output-file", str(out), "--no-progress"]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_input_format_reads_a_file_whose_suffix_does_not_say_it(seeded_classifier, tmp_path, capsys):
    from bertkit import pipeline

    texts = [r["sentence"] for r in _tsv("SST-2", "dev")[:40]]
    with open(tmp_path / "reviews.export", "w", encoding="utf-8", newline="") as f:
        csv.writer(f).writerows([["review"], *([t] for t in texts)])
    args = ["predict", "text-classification", "--model", str(seeded_classifier), "--input", str(tmp_path / "reviews.export"),
            "--text-column", "review", "--output-file", str(tmp_path / "out.jsonl"), "--no-progress"]
    assert main(args) == 2
    assert "reviews.export: cannot tell the format" in capsys.readouterr().err
    assert main([*args, "--input-format", "csv"]) == 0
    expected = pipeline("text-classification", seeded_classifier)(texts)
    assert [{k: v for k, v in r.items() if k != "id"} for r in _read(tmp_path / "out.jsonl")] == expected


def test_fill_mask_rows_without_the_mask_token_name_file_and_line_before_the_model_loads(tmp_path, capsys):
    # MiniLM has no fill-mask head: loading it for fill-mask is an error, so the row error proves the check came first
    rows = [r["sentence"] for r in _tsv("SST-2", "dev")[:5]]
    good = [" ".join(["[MASK]", *r.split()[1:]]) for r in rows]
    (tmp_path / "masked.txt").write_text("\n".join([*good[:3], rows[3], good[4]]) + "\n", encoding="utf-8")
    args = ["predict", "fill-mask", "--model", str(MODEL), "--output-file", str(tmp_path / "out.jsonl"),
            "--no-progress"]
    assert main([*args, "--input", str(tmp_path / "masked.txt")]) == 2
    err = capsys.readouterr().err
    assert f"masked.txt:4: no [MASK] in {rows[3][:60]!r}" in err and "fill-mask head" not in err
    (tmp_path / "masked.txt").write_text("\n".join(good) + "\n", encoding="utf-8")
    assert main([*args, "--input", str(tmp_path / "masked.txt")]) == 2
    assert "has no fill-mask head" in capsys.readouterr().err  # every row passed; the model was the next thing
    assert not (tmp_path / "out.jsonl").exists()


def test_fill_mask_without_top_k_writes_the_pipelines_five_candidates(tmp_path, minilm_2_layers, tiny_checkpoint):
    # --top-k unset is the pipeline's default (5 per [MASK], as transformers'), not question-answering's 1
    from bertkit import pipeline

    model = tiny_checkpoint(tmp_path / "mlm", "BertForMaskedLM", tokenizer=minilm_2_layers)
    texts = ["the [MASK] sat on the mat.", "[MASK] and [MASK]!"]
    (tmp_path / "masked.txt").write_text("\n".join(texts) + "\n", encoding="utf-8")
    assert main(["predict", "fill-mask", "--model", str(model), "--input", str(tmp_path / "masked.txt"),
                 "--output-file", str(tmp_path / "out.jsonl"), "--no-progress"]) == 0
    got = [r["predictions"] for r in _read(tmp_path / "out.jsonl")]
    assert [len(got[0]), [len(m) for m in got[1]]] == [5, [5, 5]]
    assert got == json.loads(json.dumps(pipeline("fill-mask", model)(texts)))
    # --targets is the pipeline's targets (transformers'): those tokens alone, top_k capped at their number
    assert main(["predict", "fill-mask", "--model", str(model), "--input", str(tmp_path / "masked.txt"),
                 "--output-file", str(tmp_path / "out.jsonl"), "--no-progress", "--overwrite",
                 "--targets", "cat,dog,The"]) == 0
    got = [r["predictions"] for r in _read(tmp_path / "out.jsonl")]
    assert got == json.loads(json.dumps(pipeline("fill-mask", model)(texts, targets=["cat", "dog", "the"])))
    assert sorted(c["token_str"] for c in got[0]) == ["cat", "dog", "the"]


def test_a_mask_past_max_length_names_the_file_and_record_and_keeps_the_old_output(tmp_path, capsys, minilm_2_layers,
                                                                                    tiny_checkpoint):
    # only the loaded pipeline knows where --max-length cuts: its refusal named the text, not which of the file's
    # records (nor its id) to fix
    model = tiny_checkpoint(tmp_path / "mlm", "BertForMaskedLM", tokenizer=minilm_2_layers)
    long = "word " * 20 + "[MASK]"
    (tmp_path / "in.csv").write_text(f"ref,text\na,the [MASK] sat.\nb,[MASK] too\nc,{long}\n", encoding="utf-8")
    out = tmp_path / "out.jsonl"
    out.write_text("earlier\n", encoding="utf-8")
    assert main(["predict", "fill-mask", "--model", str(model), "--input", str(tmp_path / "in.csv"), "--id-column",
                 "ref", "--max-length", "16", "--output-file", str(out), "--overwrite", "--no-progress"]) == 2
    assert f"in.csv: input 3 (id 'c'): fill-mask input {long[:60]!r} has its only [MASK] token past its first 16 " \
           "tokens" in capsys.readouterr().err
    assert out.read_text(encoding="utf-8") == "earlier\n"


def test_a_json_list_of_choices_in_a_csv_cell_is_read_as_standard_json(tmp_path):
    # the cell was read with json.loads: half of a surrogate pair (and a repeated key, NaN) went through unread
    from bertkit.inference.files import read_inputs
    from bertkit.tokenization import BertTokenizer

    tok = BertTokenizer(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "good", "bad", "film"])  # no weights needed
    path = tmp_path / "c.csv"
    path.write_text('context,choices\ngood film,"[""good"", ""bad""]"\nbad film,"[""good"", ""b\\ud83dad""]"\n',
                    encoding="utf-8")
    with pytest.raises(BertkitError, match=re.escape(
            "c.csv:3: the 'choices' column's JSON list is not valid JSON (a string holds \\ud83d, half of a UTF-16 "
            "surrogate pair without its other half (no character); escape both halves of the pair, or write the "
            "character itself in UTF-8); write it as standard JSON")):
        read_inputs(path, "multiple-choice", tokenizer=tok)
    path.write_text('context,choices\ngood film,"[""good"", ""b\\ud83d\\ude00d""]"\n', encoding="utf-8")
    assert read_inputs(path, "multiple-choice", tokenizer=tok)[0] == [{"context": "good film", "choices": ["good", "b\U0001f600d"]}]


def test_half_a_surrogate_pair_in_a_json_line_is_refused_by_line_and_keeps_the_old_output(tmp_path, capsys,
                                                                                        minilm_2_layers, tiny_checkpoint):
    # Python's json reads "\\ud83d" alone into the text; the tagger's word "Hel\\ud83dlo" then had no UTF-8 form and
    # predict ended in a UnicodeEncodeError traceback once the model had run (TEI and bertkit serve refuse it: 400)
    from bertkit import pipeline

    model = tiny_checkpoint(tmp_path / "ner", "BertForTokenClassification", tokenizer=minilm_2_layers,
                            labels=["O", "B-PER", "I-PER"])
    out = tmp_path / "out.jsonl"
    out.write_text("earlier\n", encoding="utf-8")
    (tmp_path / "in.jsonl").write_text('{"text": "Paris"}\n{"text": "Hel\\ud83dlo world"}\n', encoding="utf-8")
    args = ["predict", "token-classification", "--model", str(model), "--input", str(tmp_path / "in.jsonl"),
            "--output-file", str(out), "--overwrite", "--no-progress"]
    assert main(args) == 2
    assert ("in.jsonl:2: not valid JSON (a string holds \\ud83d, half of a UTF-16 surrogate pair without its other "
            "half (no character); escape both halves of the pair, or write the character itself in UTF-8); write it "
            "as standard JSON") in capsys.readouterr().err
    assert out.read_text(encoding="utf-8") == "earlier\n"
    # both halves escaped are the character: its word indexes the text in code points, as the pipeline's
    (tmp_path / "in.jsonl").write_text('{"text": "Paris"}\n{"text": "Hel\\ud83d\\ude00lo world"}\n', encoding="utf-8")
    assert main(args) == 0
    got = [{k: v for k, v in r.items() if k != "id"} for r in _read(out)]
    assert got == json.loads(json.dumps(pipeline("token-classification", model)(["Paris", "Hel\U0001f600lo world"])))
    assert [(w["word"], w["start"], w["end"]) for w in got[1]["words"]] == [("Hel\U0001f600lo", 0, 6), ("world", 7, 12)]

def test_each_record_is_one_line_to_splitlines_whatever_line_breaks_its_text_holds(tmp_path, minilm_2_layers,
                                                                                   tiny_checkpoint):
    # a word "x\x85y" (NEL, which the tokenizer drops) and an entity across "and\u2028London" were written raw: valid
    # JSON, but str.splitlines() (this module's _read, and many a user's reader) cut the record into 3 lines, none JSON
    from bertkit import pipeline

    model = tiny_checkpoint(tmp_path / "ner", "BertForTokenClassification", tokenizer=minilm_2_layers,
                            labels=["O", "B-LOC", "I-LOC"])
    texts = ["Paris x\x85y and\u2028London", "Rome\u2029Milan"]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8")
    out = tmp_path / "out.jsonl"
    assert main(["predict", "token-classification", "--model", str(model), "--input", str(tmp_path / "in.jsonl"),
                 "--output-file", str(out), "--no-progress"]) == 0
    got = [{k: v for k, v in r.items() if k != "id"} for r in _read(out)]
    assert got == json.loads(json.dumps(pipeline("token-classification", model)(texts, ignore_labels=["O"])))
    assert "x\x85y" in [w["word"] for w in got[0]["words"]]
    assert '"x\\u0085y"' in out.read_text(encoding="utf-8")  # escaped; every other character as written

def test_predict_token_classification_takes_the_pipelines_aggregation_strategy(tmp_path, minilm_2_layers,
                                                                               tiny_checkpoint):
    # transformers' aggregation_strategy, which the pipeline and serve take: predict tagged by "first" alone
    from bertkit import pipeline

    model = tiny_checkpoint(tmp_path / "ner", "BertForTokenClassification", tokenizer=minilm_2_layers,
                            labels=["O", "B-PER", "I-PER", "B-LOC", "I-LOC"])
    texts = ["Werner Zwingmann said sheepmeat from Wenceslas farms", "Blackburn visited Kraljevo"]  # many-piece words
    (tmp_path / "in.txt").write_text("\n".join(texts) + "\n", encoding="utf-8")
    got = {}
    for strategy in ("first", "average", "max"):
        assert main(["predict", "token-classification", "--model", str(model), "--input", str(tmp_path / "in.txt"),
                     "--output-file", str(tmp_path / f"{strategy}.jsonl"), "--no-progress",
                     "--aggregation-strategy", strategy]) == 0
        got[strategy] = [{k: v for k, v in r.items() if k != "id"} for r in _read(tmp_path / f"{strategy}.jsonl")]
        assert got[strategy] == json.loads(json.dumps(pipeline("token-classification", model)(
            texts, aggregation_strategy=strategy)))
    assert got["average"] != got["first"] and got["max"] != got["first"]

def test_predict_token_classification_stride_tags_a_text_past_max_length_whole(tmp_path, minilm_2_layers,
                                                                                tiny_checkpoint, capsys):
    # predict had no --stride: a 70-token text at --max-length 16 was tagged to its 14th token and no further, the
    # rest of it missing from the output without a word; the pipeline (and transformers) read it in windows
    from bertkit import pipeline

    model = tiny_checkpoint(tmp_path / "ner", "BertForTokenClassification", tokenizer=minilm_2_layers,
                            labels=["O", "B-PER", "I-PER", "B-LOC", "I-LOC"])
    text = " ".join(["Werner Zwingmann said sheepmeat from Wenceslas farms reached Blackburn"] * 6)
    (tmp_path / "in.txt").write_text(text + "\n", encoding="utf-8")
    args = ["predict", "token-classification", "--model", str(model), "--input", str(tmp_path / "in.txt"),
            "--max-length", "16", "--no-progress"]
    assert main([*args, "--output-file", str(tmp_path / "whole.jsonl"), "--stride", "4"]) == 0
    (got,) = [{k: v for k, v in r.items() if k != "id"} for r in _read(tmp_path / "whole.jsonl")]
    assert got == json.loads(json.dumps(pipeline("token-classification", model, max_length=16)(text, stride=4)))
    assert got["words"][-1]["end"] == len(text)  # tagged to its end
    assert main([*args, "--output-file", str(tmp_path / "cut.jsonl")]) == 0
    assert _read(tmp_path / "cut.jsonl")[0]["words"][-1]["end"] < 100  # without it: the first 14 tokens alone
    capsys.readouterr()
    assert main([*args, "--output-file", str(tmp_path / "bad.jsonl"), "--stride", "14"]) == 2
    assert "stride must be an int in [0, 13] (the tokens consecutive windows share, below max_length - 2), got 14" \
        in capsys.readouterr().err
    # a setting of token-classification alone: refused for another task, not ignored
    assert main(["predict", "text-classification", "--model", str(model), "--input", str(tmp_path / "in.txt"),
                 "--output-file", str(tmp_path / "clf.jsonl"), "--no-progress", "--stride", "4"]) == 2
    assert "does not read --stride (it is for token-classification)" in capsys.readouterr().err


def test_question_answering_top_k_and_max_length_are_refused_before_the_model_loads(tmp_path, capsys):
    # MiniLM has no question-answering head: the top_k error, not the head's, proves the check came before the load;
    # the earlier predictions the user asked to replace are still there
    (tmp_path / "qa.jsonl").write_text(json.dumps({"question": "Who went home?", "context": "Bob went home."}) + "\n",
                                       encoding="utf-8")
    out = tmp_path / "answers.jsonl"
    out.write_text('{"id": 0, "answer": "Bob"}\n', encoding="utf-8")
    args = ["predict", "question-answering", "--model", str(MODEL), "--input", str(tmp_path / "qa.jsonl"),
            "--output-file", str(out), "--no-progress", "--overwrite"]
    assert main([*args, "--top-k", "21"]) == 2
    err = capsys.readouterr().err
    assert "top_k must be an int in [1, 20] (the SQuAD recipe's n-best size), got 21" in err
    assert "question-answering head" not in err
    assert main([*args, "--top-k", "20", "--max-length", "4"]) == 2  # (--max-length 4 too was refused after the load)
    err = capsys.readouterr().err
    assert "max_length must be at least 8 (a pipeline's shortest sequence), got 4" in err and " head" not in err
    assert main([*args, "--top-k", "20"]) == 2
    assert "has no question-answering head" in capsys.readouterr().err  # top_k 20 passed; the model was next
    # a --max-length with no room for a context beside the 64-token question: predict's flag named (the pipeline's
    # message named max_query_length, no flag of predict, after every input was read), before the model loads
    for length in ("40", "67"):
        assert main([*args, "--max-length", length]) == 2
        err = capsys.readouterr().err
        assert (f"--max-length {length} leaves no room for a context: question-answering cuts each question to 64 "
                "tokens, and [CLS] and two [SEP] make 67; raise --max-length above 67") in err
        assert "max_query_length" not in err and " head" not in err and "input 1" not in err
    assert out.read_text(encoding="utf-8") == '{"id": 0, "answer": "Bob"}\n'


def test_predict_never_replaces_a_file_without_overwrite(seeded_classifier, tmp_path, capsys):
    (tmp_path / "in.txt").write_text("a fine film\n", encoding="utf-8")
    out = tmp_path / "mine.jsonl"
    out.write_text("my notes\n", encoding="utf-8")
    args = ["predict", "text-classification", "--model", str(seeded_classifier), "--input", str(tmp_path / "in.txt"),
            "--output-file", str(out), "--no-progress"]
    assert main(args) == 2 and "already exists; pass --overwrite" in capsys.readouterr().err
    assert out.read_text(encoding="utf-8") == "my notes\n"
    assert main([*args, "--overwrite"]) == 0 and _read(out)[0]["label"] in ("negative", "positive")


@pytest.mark.parametrize("name, fmt", [("preds.csv", "csv"), ("preds.TSV", "tsv"), ("preds.txt", "text")])
def test_an_output_named_as_another_format_is_refused_before_the_model_loads(tmp_path, capsys, name, fmt):
    # predict writes JSON lines: preds.csv held them without a word (and read back as CSV, each line one bad row);
    # MiniLM has no classification head, so the suffix's error, not the head's, proves the check came first
    (tmp_path / "in.txt").write_text("a fine film\n", encoding="utf-8")
    (tmp_path / name).write_text("id,label\n0,mine\n", encoding="utf-8")
    args = ["predict", "text-classification", "--model", str(MODEL), "--input", str(tmp_path / "in.txt"),
            "--output-file", str(tmp_path / name), "--no-progress", "--overwrite"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert (f"output_file {tmp_path / name}: predict writes JSON lines (one object per input), not {fmt}; name the "
            f"file {Path(name).stem}.jsonl") in err and " head" not in err
    assert (tmp_path / name).read_text(encoding="utf-8") == "id,label\n0,mine\n"


@pytest.mark.parametrize("task, flags, read_by", [
    ("text-classification", ["--top-k", "3"], "fill-mask, question-answering"),  # every label's score is written
    ("sentence-embedding", ["--query-column", "q"], "rerank"),
    ("sentence-embedding", ["--return-tokens"], "sparse-embedding"),
    ("rerank", ["--pooling", "cls"], "feature-extraction, sentence-embedding"),
    ("fill-mask", ["--text-pair-column", "b"], "text-classification, feature-extraction, sentence-embedding"),
    ("text-classification", ["--targets", "good,bad"], "fill-mask"),
])
def test_a_setting_the_task_does_not_read_is_refused(seeded_classifier, tmp_path, capsys, task, flags, read_by):
    """Another task's setting was accepted and ignored: the output was not what was asked for, without a word."""
    (tmp_path / "in.txt").write_text("a fine film\n", encoding="utf-8")
    args = ["predict", task, "--model", str(seeded_classifier), "--input", str(tmp_path / "in.txt"),
            "--output-file", str(tmp_path / "out.jsonl"), "--no-progress", *flags]
    assert main(args) == 2
    assert f"bertkit predict {task} does not read {flags[0]} (it is for {read_by}); leave it out" in \
        capsys.readouterr().err
    assert not (tmp_path / "out.jsonl").exists()


def test_prompt_name_embeds_with_that_prompt_as_sentence_transformers(minilm_2_layers, tmp_path, capsys):
    """--prompt-name on a sentence-transformers directory: encode(prompt_name=...)'s vectors (it was sparse-embedding's
    alone, and ignored here)."""
    st = pytest.importorskip("sentence_transformers")
    from sentence_helpers import st_directory  # tests/ is on sys.path under pytest

    model = st_directory(minilm_2_layers, tmp_path / "st", st_config={"prompts": {"query": "query: ", "doc": ""}})
    texts = [r["sentence"] for r in _tsv("SST-2", "dev")[:4]]
    (tmp_path / "in.txt").write_text("\n".join(texts) + "\n", encoding="utf-8")
    args = ["predict", "sentence-embedding", "--model", str(model), "--input", str(tmp_path / "in.txt"),
            "--output-file", str(tmp_path / "out.jsonl"), "--no-progress", "--prompt-name", "query"]
    assert main(args) == 0
    got = torch.tensor([r["embedding"] for r in _read(tmp_path / "out.jsonl")])
    want = st.SentenceTransformer(str(model), device="cpu").encode(texts, prompt_name="query", convert_to_tensor=True,
                                                                   normalize_embeddings=True)
    torch.testing.assert_close(got, want, atol=2e-6, rtol=0)
    assert (got - st.SentenceTransformer(str(model), device="cpu").encode(
        texts, convert_to_tensor=True, normalize_embeddings=True)).abs().max() > 0.01  # the prompt moved them
    # a name the directory lacks is refused from its files before the model loads (its weights made unreadable)
    (model / "model.safetensors").unlink()  # a symbolic link to MiniLM's
    (model / "model.safetensors").write_bytes(b"not weights")
    args[args.index("query")] = "passage"
    assert main([*args, "--overwrite"]) == 2
    assert "prompt_name 'passage' is not one of this model's prompts: 'query', 'document', 'doc'" in capsys.readouterr().err


@pytest.mark.slow  # 20-40 s: make test-slow (make test stays near five minutes on two cores)
def test_finetune_classify_learns_sentiment_from_a_csv_and_serves_its_label_names(tmp_path):
    from bertkit import pipeline

    names = {"0": "negative", "1": "positive"}
    for split, n in (("train", 400), ("dev", 200)):  # batches of 8: 50 steps
        with open(tmp_path / f"{split}.csv", "w", encoding="utf-8", newline="") as f:
            w = csv.writer(f)
            w.writerow(["review", "sentiment"])
            w.writerows([r["sentence"], names[r["label"]]] for r in _tsv("SST-2", split)[:n])
    out = tmp_path / "run"
    assert main(["finetune", "classify", "--model", str(MODEL), "--train-file", str(tmp_path / "train.csv"),
                 "--validation-file", str(tmp_path / "dev.csv"),
                 "--text-column", "review", "--label-column", "sentiment", "--output-dir", str(out),
                 "--num-train-epochs", "1", "--max-seq-length", "64", "--batch-size", "8", "--no-progress"]) == 0
    report = json.loads((out / "report.json").read_text())
    accuracy = report["runs"][0]["dev"]["accuracy"]
    assert 0.6 < accuracy <= 1.0  # chance is ~0.5; 0.75 measured on this machine (1 and 2 threads)
    pipe = pipeline("text-classification", out / "best", max_length=64)
    assert set(pipe.config.id2label.values()) == {"negative", "positive"}
    test = pipe([r["sentence"] for r in _tsv("SST-2", "dev")[:200]])  # the best run, as `bertkit predict` runs it
    refs = [names[r["label"]] for r in _tsv("SST-2", "dev")[:200]]
    assert sum(p["label"] == y for p, y in zip(test, refs)) / 200 == pytest.approx(accuracy)


def test_finetune_classify_regression_on_sts_b_and_unknown_labels(tmp_path, capsys, minilm_2_layers):
    if not (GLUE / "STS-B" / "train.tsv").is_file():
        pytest.skip("STS-B not found")
    out = tmp_path / "stsb"
    args = ["finetune", "classify", "--model", str(minilm_2_layers), "--text-column", "sentence1", "--text-pair-column",
            "sentence2", "--label-column", "score", "--max-train-samples", "64", "--max-eval-samples", "32",
            "--num-train-epochs", "1", "--max-seq-length", "64", "--no-progress"]
    assert main([*args, "--train-file", str(GLUE / "STS-B" / "train.tsv"), "--validation-file",
                 str(GLUE / "STS-B" / "dev.tsv"), "--output-dir", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["metric"] == "pearson" and -1 <= report["runs"][0]["dev"]["pearson"] <= 1
    assert json.loads((out / "best" / "config.json").read_text())["problem_type"] == "regression"

    (tmp_path / "train.csv").write_text("text,label\ngood,yes\nbad,no\n", encoding="utf-8")
    (tmp_path / "dev.csv").write_text("text,label\nfine,yes\nawful,maybe\n", encoding="utf-8")
    assert main(["finetune", "classify", "--model", str(minilm_2_layers), "--train-file", str(tmp_path / "train.csv"),
                 "--validation-file", str(tmp_path / "dev.csv"), "--output-dir", str(tmp_path / "x"),
                 "--no-progress"]) == 2
    assert "dev.csv:3: label 'maybe' never occurs in" in capsys.readouterr().err


def test_finetune_classify_on_three_classes_reports_macro_f1_and_reads_input_format(tmp_path, capsys, minilm_2_layers):
    from bertkit import pipeline

    sk = pytest.importorskip("sklearn.metrics")
    if not (GLUE / "STS-B" / "train.tsv").is_file():
        pytest.skip("STS-B not found")

    def level(score: str) -> str:  # STS-B's 0..5 similarity in three classes
        return "low" if float(score) < 2 else "mid" if float(score) < 3.5 else "high"

    for split, n in (("train", 120), ("dev", 60)):  # TSV under a suffix that does not say so; every class in both
        with open(tmp_path / f"{split}.data", "w", encoding="utf-8") as f:
            f.write("a\tb\tlevel\n" + "".join(f"{r['sentence1']}\t{r['sentence2']}\t{level(r['score'])}\n"
                                             for r in _tsv("STS-B", split)[:n]))
    out = tmp_path / "run"
    args = ["finetune", "classify", "--model", str(minilm_2_layers), "--train-file", str(tmp_path / "train.data"),
            "--validation-file", str(tmp_path / "dev.data"),
            "--text-column", "a", "--text-pair-column", "b", "--label-column", "level", "--output-dir", str(out),
            "--num-train-epochs", "1", "--max-seq-length", "64", "--no-progress"]
    assert main(args) == 2
    assert "train.data: cannot tell the format from the suffix '.data'; pass --input-format" in capsys.readouterr().err
    assert main([*args, "--input-format", "tsv"]) == 0
    report = json.loads((out / "report.json").read_text())
    dev = report["runs"][0]["dev"]
    assert report["metric"] == "accuracy" and list(dev) == ["accuracy", "macro_f1"]
    gold = [level(r["score"]) for r in _tsv("STS-B", "dev")[:60]]
    rows = _tsv("STS-B", "dev")[:60]
    pipe = pipeline("text-classification", out / "best", max_length=64)  # the best run, as `bertkit predict` runs it
    pred = [r["label"] for r in pipe([(r["sentence1"], r["sentence2"]) for r in rows])]
    assert dev["macro_f1"] == pytest.approx(sk.f1_score(gold, pred, average="macro"))
    assert dev["accuracy"] == pytest.approx(sk.accuracy_score(gold, pred))


@pytest.fixture(scope="module")
def cross_encoder(tmp_path_factory, tiny_checkpoint) -> Path:
    """A tiny seeded one-logit cross-encoder with MiniLM's vocabulary (scores arbitrary but fixed)."""
    from bertkit.tokenization import BertTokenizer

    return tiny_checkpoint(tmp_path_factory.mktemp("rerank"), "BertForSequenceClassification",
                           tokenizer=BertTokenizer.from_pretrained(MODEL), vocab_size=30522, intermediate_size=37,
                           max_position_embeddings=512, num_labels=1)


def _squad_pairs(n_questions: int, passages: int) -> list[tuple[str, str]]:
    """(question, context) rows: each question of SQuAD dev beside ``passages`` contexts, its own among them."""
    if not SQUAD.is_file():
        pytest.skip(f"SQuAD dev not found at {SQUAD}")
    paragraphs = [p for a in json.loads(SQUAD.read_text(encoding="utf-8"))["data"][:3] for p in a["paragraphs"]]
    return [(paragraphs[i]["qas"][0]["question"], paragraphs[(i + j) % len(paragraphs)]["context"])
            for i in range(n_questions) for j in range(passages)]


def test_predict_rerank_scores_each_query_passage_row_as_the_pipeline(cross_encoder, tmp_path):
    import numpy as np

    from bertkit import pipeline

    pairs = _squad_pairs(6, 5)  # 30 rows, contexts of very different lengths: batches are bucketed by length
    with open(tmp_path / "in.csv", "w", encoding="utf-8", newline="") as f:
        w = csv.writer(f)
        w.writerow(["qid", "query", "passage"])
        w.writerows([f"q{i // 5}", q, p] for i, (q, p) in enumerate(pairs))
    (tmp_path / "in.jsonl").write_text("".join(json.dumps({"query": q, "text": p}) + "\n" for q, p in pairs),
                                       encoding="utf-8")
    base = ["predict", "rerank", "--model", str(cross_encoder), "--batch-size", "8", "--no-progress"]
    assert main([*base, "--input", str(tmp_path / "in.csv"), "--text-column", "passage", "--id-column", "qid",
                 "--output-file", str(tmp_path / "csv.jsonl")]) == 0
    assert main([*base, "--input", str(tmp_path / "in.jsonl"), "--output-file", str(tmp_path / "jsonl.jsonl")]) == 0
    assert main([*base, "--input", str(tmp_path / "in.jsonl"), "--raw-scores",
                 "--output-file", str(tmp_path / "raw.jsonl")]) == 0
    got_csv, got_jsonl, got_raw = (_read(tmp_path / f"{n}.jsonl") for n in ("csv", "jsonl", "raw"))
    assert [r["id"] for r in got_csv] == [f"q{i // 5}" for i in range(30)]
    assert [r["id"] for r in got_jsonl] == list(range(30)) and all(set(r) == {"id", "score"} for r in got_jsonl)

    pipe = pipeline("rerank", cross_encoder, batch_size=8)
    expected = [r[0]["score"] for r in pipe([{"query": q, "texts": [p]} for q, p in pairs])]
    assert [r["score"] for r in got_csv] == expected and [r["score"] for r in got_jsonl] == expected  # exact
    # The same numbers as ranking each query's five passages in one call (other batches: float tolerance) ...
    for k in range(6):
        ranked = pipe({"query": pairs[5 * k][0], "texts": [p for _, p in pairs[5 * k:5 * k + 5]]})
        by_index = [s for _, s in sorted((r["index"], r["score"]) for r in ranked)]
        np.testing.assert_allclose([r["score"] for r in got_jsonl[5 * k:5 * k + 5]], by_index, rtol=0, atol=1e-6)
    # ... and the sigmoid of the one logit, which --raw-scores writes (in float32, as TEI takes it).
    raw = np.array([r["score"] for r in got_raw], dtype=np.float32)
    np.testing.assert_array_equal(1 / (1 + np.exp(-raw)), np.array(expected, dtype=np.float32))
    assert len(set(np.round(raw, 6))) > 1  # a seeded head that scores rows differently, not a constant


@pytest.mark.parametrize("name, content, flags, message", [
    ("bad.jsonl", '{"query": "q", "text": "p"}\n{"query": "q", "body": "p"}\n', [],
     "bad.jsonl:2: no 'text' field (it has query, body); name it with --text-column"),
    ("bad.csv", "question,text\nq,p\n", [], "bad.csv:2: no 'query' column (it has question, text); name it with "
                                            "--query-column"),
    ("bad.csv", "q,p\nwhat,a passage\nwhy,\n", ["--query-column", "q", "--text-column", "p"],
     "bad.csv:3: 'p' is empty"),
    ("bad.jsonl", '{"query": "q", "text": "p"}\n"only a string"\n', [], "bad.jsonl:2: expected an object"),
    ("bad.jsonl", '{"query": "q", "text": ["p1", "p2"]}\n', [], "bad.jsonl:1: 'text' must be a string"),
    ("bad.txt", "a query\n", [], "bad.txt: a plain-text file holds one text per line; rerank needs"),
    ("ok.jsonl", '{"query": "q", "text": "p"}\n', ["--text-pair-column", "p"],
     "bertkit predict rerank does not read --text-pair-column (it is for text-classification, feature-extraction"),
])
def test_predict_rerank_bad_rows_name_file_and_line(cross_encoder, tmp_path, capsys, name, content, flags, message):
    (tmp_path / name).write_text(content, encoding="utf-8")
    out = tmp_path / "out.jsonl"
    assert main(["predict", "rerank", "--model", str(cross_encoder), "--input", str(tmp_path / name),
                 "--output-file", str(out), "--no-progress", *flags]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()
