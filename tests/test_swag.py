"""SWAG reader and four-choice featurization, on small CSV files in the swagaf layout."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

from bertkit.data.collate import collate
from bertkit.tasks import swag
from bertkit.tokenization import BertTokenizer

HEADER = ["", "video-id", "fold-ind", "startphrase", "sent1", "sent2", "gold-source",
          "ending0", "ending1", "ending2", "ending3", "label"]  # fmt: skip
ROWS = [
    ["0", "anetv_jkn6uvmqwh4", "3416",
     "Members of the procession walk down the street holding small horn brass instruments. A drum line",
     "Members of the procession walk down the street holding small horn brass instruments.", "A drum line", "gold",
     "passes by walking down the street playing their instruments.", "has heard approaching them.",
     "arrives and they're outside dancing and asleep.", "turns the lead singer watches the performance.", "0"],
    ["1", "lsmdc3057_ROBIN_HOOD-27684", "16021", "He pulls, \"quietly\", a sword. Someone",
     'He pulls, "quietly", a sword.', "Someone", "gen",
     "lunges.", "smiles, then waves.", "drops it, and then, after a long pause, picks it up again.", "runs.", "3"],
]  # fmt: skip


@pytest.fixture(scope="module")
def tok(minilm_dir):
    """bertkit's own tokenizer on the example checkpoint's vocabulary (uncased)."""
    return BertTokenizer.from_pretrained(minilm_dir)


def _write_csv(path: Path, header: list[str], rows: list[list[str]]) -> Path:
    with open(path, "w", encoding="utf-8", newline="") as f:
        csv.writer(f).writerows([header, *rows])
    return path


def test_read_labeled_csv_with_quotes_and_commas(tmp_path):
    path = _write_csv(tmp_path / "val.csv", HEADER, ROWS)
    first, second = swag.read_swag(path)
    assert (first.video_id, first.label, first.line) == ("anetv_jkn6uvmqwh4", 0, 2)
    assert (
        first.sent2 == "A drum line"
        and first.endings[0] == "passes by walking down the street playing their instruments."
    )
    assert second.sent1 == 'He pulls, "quietly", a sword.'
    assert (
        second.endings[2] == "drops it, and then, after a long pause, picks it up again."
        and second.label == 3
    )


def test_a_multiple_choice_csv_without_swagafs_video_id_is_read_as_run_swag_reads_it(tmp_path):
    """run_swag.py reads sent1, sent2, ending0-3 and label; was: a file of one's own in that layout refused for
    lacking swagaf's video-id column, which bertkit reads only to echo it in predictions.jsonl."""
    keep = [HEADER.index(c) for c in ("sent1", "sent2", "ending0", "ending1", "ending2", "ending3", "label")]
    path = _write_csv(tmp_path / "mine.csv", [HEADER[i] for i in keep], [[r[i] for i in keep] for r in ROWS])
    first, second = swag.read_swag(path)
    assert (first.video_id, first.sent2, first.label, second.sent1, second.label) == (
        None, "A drum line", 0, 'He pulls, "quietly", a sword.', 3)


def test_read_test_csv_without_label_column(tmp_path):
    path = _write_csv(tmp_path / "test.csv", HEADER[:-1], [r[:-1] for r in ROWS])
    examples = swag.read_swag(path)
    assert [e.label for e in examples] == [None, None] and examples[1].endings[3] == "runs."


def test_malformed_rows_name_file_and_line(tmp_path):
    bad_label = [*ROWS[0][:-1], "4"]
    path = _write_csv(tmp_path / "a.csv", HEADER, [ROWS[1], bad_label])
    with pytest.raises(ValueError, match=rf"malformed row in {path} line 3: label '4' is not 0, 1, 2 or 3"):
        swag.read_swag(path)
    path = _write_csv(tmp_path / "b.csv", HEADER, [ROWS[0], ROWS[1][:-2]])
    with pytest.raises(ValueError, match=r"b\.csv:3: 10 fields but the header names 12"):
        swag.read_swag(path)
    path = _write_csv(tmp_path / "c.csv", ["sentence", "label"], [["x", "0"]])
    with pytest.raises(ValueError, match=r"c\.csv line 1: header lacks the SWAG columns \['sent1', 'sent2', "):
        swag.read_swag(path)
    with pytest.raises(FileNotFoundError, match="nothere.csv"):
        swag.read_swag(tmp_path / "nothere.csv")


def test_a_fifth_ending_column_is_refused_naming_it(tmp_path):
    # A five-choice file in the swagaf layout: ending4 was never read, so its rows trained and were scored as 4-way
    # questions without a word (and a row whose answer is ending4 was called a malformed label).
    header = [*HEADER[:-1], "ending4", "label"]
    path = _write_csv(tmp_path / "five.csv", header, [[*ROWS[0][:-1], "goes home.", "0"]])
    with pytest.raises(
        ValueError,
        match=r"five\.csv line 1: header has the columns \['ending4'\] beyond SWAG's 4 "
        r"endings .*DataCollatorForMultipleChoice",
    ):
        swag.read_swag(path)


@pytest.mark.parametrize("header", [HEADER, None])
def test_a_file_without_rows_is_refused_naming_it(tmp_path, header):
    # A header alone (or nothing) read as no examples: `predict swag` then failed in np.stack, and `finetune swag`
    # trained and failed at its first evaluation, leaving a staging directory behind.
    path = _write_csv(tmp_path / "val.csv", header, []) if header else tmp_path / "val.csv"
    if not header:
        path.write_bytes(b"")
    with pytest.raises(ValueError, match=rf"{path} holds no examples \(an empty SWAG file\)"):
        swag.read_swag(path)


def test_featurize_four_choices(tmp_path, tok):
    examples = swag.read_swag(_write_csv(tmp_path / "val.csv", HEADER, ROWS))
    feats = swag.featurize_swag(examples, tok, max_seq_length=64)
    for ex, f in zip(examples, feats, strict=True):
        assert f["input_ids"].shape == f["attention_mask"].shape == f["token_type_ids"].shape
        assert f["input_ids"].shape[0] == 4 and f["labels"] == ex.label
        for i, ending in enumerate(ex.endings):
            a, b = tok.tokenize(ex.sent1), tok.tokenize(f"{ex.sent2} {ending}")
            want = [tok.cls_token_id, *tok.convert_tokens_to_ids(a), tok.sep_token_id,
                    *tok.convert_tokens_to_ids(b), tok.sep_token_id]  # fmt: skip
            n = len(want)
            assert f["input_ids"][i, :n].tolist() == want
            assert (f["input_ids"][i, n:] == tok.pad_token_id).all() and f["attention_mask"][i].sum() == n
            assert f["token_type_ids"][i, :n].tolist() == [0] * (len(a) + 2) + [1] * (len(b) + 1)
        assert f["input_ids"].shape[1] == max(int(m.sum()) for m in f["attention_mask"])  # padded to own max
    batch = collate(feats, tok.pad_token_id)
    width = max(f["input_ids"].shape[1] for f in feats)
    assert batch["input_ids"].shape == (2, 4, width) and batch["labels"].tolist() == [0, 3]
    assert batch["attention_mask"].sum().item() == sum(int(f["attention_mask"].sum()) for f in feats)


def test_featurize_truncates_and_handles_unlabeled(tok):
    ex = swag.SwagExample("v", " ".join(["long"] * 50), "He", ("a", "b", "c", "d"), None, 2)
    (f,) = swag.featurize_swag([ex], tok, max_seq_length=16)
    assert f["input_ids"].shape == (4, 16) and "labels" not in f
    # longest_first cut the long first segment; the short candidate survives whole.
    assert np.all(f["token_type_ids"].sum(axis=1) == 3)
    with pytest.raises(ValueError, match="max_seq_length 3"):
        swag.featurize_swag([ex], tok, max_seq_length=3)


def test_predictions_of_an_ending_switched_off_are_strict_json_and_pick_as_a_softmax(tmp_path):
    """A -inf ending score among finite ones (a masked ending: probability 0 under transformers' softmax, and never
    its argmax) passes prediction as it does there; predictions.jsonl wrote it -Infinity, which no strict JSON reader
    (jq, JavaScript, json.loads with parse_constant) takes. Now null, the pick and the accuracy as torch's argmax."""
    import json

    import torch

    from bertkit.training.token_tasks import swag_accuracy, write_swag_predictions

    examples = swag.read_swag(_write_csv(tmp_path / "val.csv", HEADER, ROWS))
    scores = np.array([[0.5, -np.inf, 2.0, 1.0], [-np.inf, 0.1, -np.inf, 0.2]])
    lines = write_swag_predictions(tmp_path / "predictions.jsonl", examples, scores).read_text().splitlines()
    read = [json.loads(line, parse_constant=lambda c: pytest.fail(f"{c} written")) for line in lines]
    assert [r["scores"] for r in read] == [[0.5, None, 2.0, 1.0], [None, 0.1, None, 0.2]]
    picks = torch.softmax(torch.tensor(scores), -1).argmax(-1).tolist()
    assert [r["prediction"] for r in read] == picks == [2, 3]
    assert swag_accuracy(examples, scores) == 0.5  # gold 0 and 3
