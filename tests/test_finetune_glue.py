"""`bertkit finetune glue` and `bertkit predict glue` end to end on a tiny model and small GLUE-format files."""

from __future__ import annotations

import json

import pytest
import torch

from bertkit import BertForSequenceClassification
from bertkit.cli import main
from bertkit.settings import default_lr, parse_lr_grid
from bertkit.tasks import glue
from bertkit.training.sequence_grid import summarize_grid

WORDS = ["good", "great", "fine", "bad", "awful", "poor", "the", "movie", "was", "plot"]


def _write_sst2(root, n_train=64, n_dev=32):
    d = root / "SST-2"
    d.mkdir(parents=True)
    g = torch.Generator().manual_seed(0)

    def rows(n):
        out = []
        for _ in range(n):
            label = int(torch.randint(0, 2, (1,), generator=g))
            word = WORDS[int(torch.randint(0, 3, (1,), generator=g)) + (0 if label else 3)]
            out.append((f"the movie was {word}", label))
        return out

    for split, n in (("train", n_train), ("dev", n_dev)):
        (d / f"{split}.tsv").write_text("sentence\tlabel\n" + "".join(f"{s}\t{y}\n" for s, y in rows(n)))
    (d / "test.tsv").write_text("index\tsentence\n" + "".join(f"{i}\tthe movie was {w}\n" for i, w in enumerate(WORDS)))


@pytest.fixture()
def glue_model(tmp_path, tiny_checkpoint):
    return tiny_checkpoint(tmp_path / "model", tokenizer=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS],
                           hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
                           max_position_embeddings=32)


def test_finetune_and_predict_glue_cli(tmp_path, glue_model, capsys):
    _write_sst2(tmp_path / "glue")
    out = tmp_path / "run"
    code = main(["finetune", "glue", "--task", "sst2", "--data-dir", str(tmp_path / "glue"), "--model", str(glue_model),
                 "--out", str(out), "--lr", "1e-2,1e-3", "--seeds", "1,2", "--epochs", "10", "--batch-size", "8",
                 "--max-seq-length", "32", "--no-progress"])
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    assert report["metric"] == "accuracy" and len(report["runs"]) == 4
    assert {c["lr"] for c in report["configs"]} == {1e-2, 1e-3}
    assert report["best"]["accuracy"]["mean"] >= 0.9  # the label is in one word: easy when fine-tuning works
    best = BertForSequenceClassification.from_pretrained(out / "best")
    assert best.config.id2label == {0: "0", 1: "1"}

    code = main(["predict", "glue", "--task", "sst2", "--data-dir", str(tmp_path / "glue"), "--model", str(out / "best"),
                 "--out", str(tmp_path / "sub"), "--max-seq-length", "32"])
    assert code == 0
    lines = (tmp_path / "sub" / "SST-2.tsv").read_text().splitlines()
    assert lines[0] == "index\tprediction" and len(lines) == 1 + len(WORDS)
    assert [line.split("\t")[1] for line in lines[1:4]] == ["1", "1", "1"]  # good, great, fine
    assert [line.split("\t")[1] for line in lines[4:7]] == ["0", "0", "0"]  # bad, awful, poor


def test_malformed_row_names_file_and_line(tmp_path, glue_model, capsys):
    _write_sst2(tmp_path / "glue")
    path = tmp_path / "glue" / "SST-2" / "train.tsv"
    lines = path.read_text().splitlines()
    lines[5] = "no label column here"
    path.write_text("\n".join(lines) + "\n")
    code = main(["finetune", "glue", "--task", "sst2", "--data-dir", str(tmp_path / "glue"), "--model", str(glue_model),
                 "--out", str(tmp_path / "run"), "--max-seq-length", "32", "--no-progress"])
    assert code == 2
    assert f"{path} line 6" in capsys.readouterr().err


def test_grid_summary_and_defaults():
    runs = [{"lr": 1e-4, "seed": s, "dev": {"mcc": v}} for s, v in ((1, 0.30), (2, 0.40))]
    runs += [{"lr": 3e-4, "seed": s, "dev": {"mcc": v}} for s, v in ((1, 0.45), (2, 0.35))]
    report = summarize_grid(glue.get_task("cola"), runs)
    assert report["best"]["lr"] == 3e-4
    assert report["best"]["mcc"]["mean"] == pytest.approx(0.40)
    assert report["configs"][0]["mcc"]["std"] == pytest.approx(0.0707107, abs=1e-6)
    assert parse_lr_grid("paper") == (2e-5, 3e-5, 4e-5, 5e-5)
    assert parse_lr_grid("3e-5") == (3e-5,) and parse_lr_grid("1e-4,2e-4") == (1e-4, 2e-4)
    assert default_lr(768, 2e-5) == 2e-5 and default_lr(384, 2e-5) == 1e-4
