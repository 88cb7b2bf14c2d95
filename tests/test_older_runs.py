"""What an earlier bertkit wrote, read by this one: a run directory whose manifest predates a setting added since
--resumes as the run it is (the setting at its default), and refuses a changed one by name."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest
import torch

from bertkit.cli import main

WORDS = ["the", "a", "said", "peter", "maria", "paris", "rome"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory, tiny_checkpoint) -> Path:
    """A tiny encoder and 8 CoNLL sentences: 2 steps of batch 4."""
    root = tmp_path_factory.mktemp("older-runs")
    tiny_checkpoint(root / "model", tokenizer=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS],
                    max_position_embeddings=64)
    lines = []
    for i in range(8):
        lines += [f"{WORDS[(i + j) % 7]} X X {'B-PER' if WORDS[(i + j) % 7] in ('peter', 'maria') else 'O'}"
                  for j in range(4)] + [""]
    (root / "conll").mkdir()
    for split in ("train", "valid", "test"):
        (root / "conll" / f"{split}.txt").write_text("\n".join(lines) + "\n")
    return root


def _run(root: Path, out: Path, *extra: str) -> tuple[int, str]:
    err, threads = io.StringIO(), torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = main(["finetune", "ner", "--data-dir", str(root / "conll"), "--model", str(root / "model"),
                         "--output-dir", str(out), "--max-steps", "2", "--batch-size", "4", "--max-seq-length", "32",
                         "--learning-rate", "1e-3", "--no-progress", "--device", "cpu", *extra])
    except SystemExit as e:
        code = e.code
    finally:
        torch.set_num_threads(threads)
    return code, err.getvalue()


def test_resume_of_a_run_from_before_a_setting_existed(setup, tmp_path):
    """--eval-delay came after the run (bertkit of 2026-11-28 wrote no eval_delay): the resume was refused with
    '--eval-delay None then, 0 now' though nothing had changed; now the missing entry reads as the default 0."""
    out = tmp_path / "run"
    assert _run(setup, out)[0] == 0
    marker = out / ".bertkit-run.json"
    record = json.loads(marker.read_text())
    assert record["fingerprint"]["eval_delay"] == 0
    del record["fingerprint"]["eval_delay"]
    marker.write_text(json.dumps(record))
    report = json.loads((out / "report.json").read_text())

    code, err = _run(setup, out, "--eval-delay", "1", "--resume")
    assert code != 0 and "--eval-delay 0 then, 1.0 now" in err, err
    code, err = _run(setup, out, "--resume")
    assert code == 0, err
    assert "other settings" not in err
    again = json.loads((out / "report.json").read_text())
    assert (again["dev"], again["test"], again["steps"]) == (report["dev"], report["test"], report["steps"])
