"""Pre-training killed mid-way (SIGKILL) and resumed gives the uninterrupted run's losses and weights, bit for bit."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "bertkit.cli", *args]


@pytest.fixture(scope="module")
def tiny_setup(tmp_path_factory):
    """A 1,500-entry vocabulary and 32-token instances from Python's own docs (present on every machine)."""
    from bertkit.data.pretraining import create_pretraining_data
    from bertkit.demo import build_corpus
    from bertkit.tokenization import BertTokenizer
    from bertkit.tokenization.trainer import save_vocab, train_wordpiece_vocab

    root = tmp_path_factory.mktemp("resume")
    build_corpus(root / "corpus")
    vocab = train_wordpiece_vocab([root / "corpus" / "heldout.txt", root / "corpus" / "train.txt"], vocab_size=1500,
                                  num_workers=1, progress=False)
    vocab_dir = save_vocab(vocab, root / "vocab")
    tok = BertTokenizer.from_pretrained(vocab_dir)
    create_pretraining_data([root / "corpus" / "train.txt"], tok, root / "data", max_seq_length=32,
                            max_predictions_per_seq=5, dupe_factor=1, input_format="sentences", seed=3,
                            num_workers=1, progress=False)
    return root


def _pretrain_args(root: Path, out: Path, *extra: str) -> list[str]:
    return _cli("pretrain", "--data", str(root / "data"), "--vocab", str(root / "vocab"), "--config-name", "tiny",
                "--out", str(out), "--max-steps", "60", "--save-steps", "10", "--logging-steps", "1",
                "--batch-size", "8", "--lr", "1e-3", "--no-progress", *extra)


def _losses(out: Path) -> list[tuple[int, float, float]]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["loss"], r["lr"]) for r in rows if r["split"] == "train"]


def test_killed_run_resumes_bit_for_bit(tiny_setup, tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    full, killed = tmp_path / "full", tmp_path / "killed"
    subprocess.run(_pretrain_args(tiny_setup, full), check=True, env=env, capture_output=True)

    proc = subprocess.Popen(_pretrain_args(tiny_setup, killed), env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while not (killed / "checkpoints" / "step-00000020").exists():
        assert proc.poll() is None, "the run finished before it could be killed"
        assert time.time() < deadline
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)  # a real kill: no handler, no cleanup
    proc.wait()
    done_before = max(s for s, _, _ in _losses(killed))
    assert done_before < 60

    subprocess.run(_pretrain_args(tiny_setup, killed, "--resume"), check=True, env=env, capture_output=True)
    assert _losses(killed) == _losses(full)  # every step's loss and lr, exactly
    a = (full / "final" / "model.safetensors").read_bytes()
    b = (killed / "final" / "model.safetensors").read_bytes()
    assert a == b


def test_resume_with_other_settings_is_refused(tiny_setup, tmp_path):
    out = tmp_path / "run"
    subprocess.run(_pretrain_args(tiny_setup, out), check=True, capture_output=True)
    again = subprocess.run(_pretrain_args(tiny_setup, out, "--resume", "--weight-decay", "0.1"),
                           capture_output=True, text=True)
    assert again.returncode == 2
    assert "cannot resume from" in again.stderr and "weight_decay" in again.stderr
    fresh = subprocess.run(_pretrain_args(tiny_setup, out), capture_output=True, text=True)
    assert fresh.returncode == 2 and "pass --resume to continue it" in fresh.stderr


def test_diverging_pretraining_stops_non_zero_and_saves_no_model(tiny_setup, tmp_path, capsys):
    """`pretrain --learning-rate 1e3` used to reach NaN, exit 0 and save NaN weights."""
    from bertkit.cli import main

    out = tmp_path / "diverged"
    code = main(["pretrain", "--data", str(tiny_setup / "data"), "--vocab", str(tiny_setup / "vocab"),
                 "--config-name", "tiny", "--output-dir", str(out), "--max-steps", "40", "--batch-size", "8",
                 "--learning-rate", "1e3", "--warmup-ratio", "0", "--save-steps", "1", "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2
    assert "training stopped at step" in err and ("is nan" in err or "is inf" in err)
    assert "Last good checkpoint:" in err and "--skip-nonfinite" in err
    assert not (out / "final").exists()  # no NaN model written
