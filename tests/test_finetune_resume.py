"""Fine-tuning killed with SIGKILL and resumed with --resume ends exactly where an uninterrupted run does."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

WORDS = {"O": ["the", "a", "said", "on", "with", "and", "to", "in", "of", "was"],
         "PER": ["peter", "maria", "john", "anna"], "LOC": ["paris", "london", "berlin", "rome"],
         "ORG": ["acme", "globex", "initech", "umbrella"]}


def _make_setup(root: Path, train_sentences: int, tiny_checkpoint) -> Path:
    """A tiny encoder and generated CoNLL sentences (``train_sentences`` for training, 30 each to score)."""
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *sorted({w for ws in WORDS.values() for w in ws})]
    tiny_checkpoint(root / "model", tokenizer=vocab, max_position_embeddings=64)
    rng = random.Random(0)
    for split, n in (("train", train_sentences), ("valid", 30), ("test", 30)):
        lines = []
        for _ in range(n):
            for _ in range(rng.randint(4, 10)):
                kind = rng.choice(["O", "O", "O", "PER", "LOC", "ORG"])
                lines.append(f"{rng.choice(WORDS[kind])} X X {'O' if kind == 'O' else 'B-' + kind}")
            lines.append("")
        (root / "conll" / f"{split}.txt").parent.mkdir(exist_ok=True)
        (root / "conll" / f"{split}.txt").write_text("\n".join(lines) + "\n")
    return root


@pytest.fixture(scope="module")
def setup(tmp_path_factory, tiny_checkpoint) -> Path:
    """240 training sentences: enough steps to kill a run at random moments."""
    return _make_setup(tmp_path_factory.mktemp("ft-resume"), 240, tiny_checkpoint)


@pytest.fixture(scope="module")
def short_setup(tmp_path_factory, tiny_checkpoint) -> Path:
    """80 training sentences: 20 steps of batch 4, checkpoints every 3, room for kills at the 2nd and 3rd."""
    return _make_setup(tmp_path_factory.mktemp("ft-resume-short"), 80, tiny_checkpoint)


def _args(root: Path, out: Path, *extra: str, epochs: int = 3) -> list[str]:
    return [sys.executable, "-m", "bertkit", "finetune", "ner", "--data-dir", str(root / "conll"), "--model",
            str(root / "model"), "--output-dir", str(out), "--num-train-epochs", str(epochs), "--batch-size", "4",
            "--learning-rate", "1e-3", "--save-steps", "3", "--logging-steps", "1", "--max-seq-length", "64",
            "--no-progress", *extra]


def _same_result(full: Path, killed: Path) -> None:
    a = json.loads((full / "report.json").read_text())
    b = json.loads((killed / "report.json").read_text())
    assert (a["dev"], a["test"], a["steps"], a["dev_per_epoch"]) == (b["dev"], b["test"], b["steps"], b["dev_per_epoch"])
    assert (full / "model" / "model.safetensors").read_bytes() == (killed / "model" / "model.safetensors").read_bytes()
    losses = [[(r["step"], r["loss"]) for r in map(json.loads, (d / "metrics.jsonl").read_text().splitlines())
               if r["split"] == "train"] for d in (full, killed)]
    assert losses[0] == losses[1]


def _campaign(setup: Path, tmp_path: Path, kills: int, seed: int, epochs: int, in_writes: bool = False) -> int:
    """``kills`` SIGKILLs, each followed by --resume: at random moments, and with ``in_writes`` some inside a
    checkpoint write; returns how many landed before the run finished."""
    from killing import MOMENTS, launch_paused

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    full, killed = tmp_path / "full", tmp_path / "killed"
    subprocess.run(_args(setup, full, epochs=epochs), check=True, env=env, capture_output=True)
    rng, done = random.Random(seed), 0
    while done < kills:
        if in_writes and rng.random() < 0.4:  # inside a checkpoint write, at a chosen moment (tests/killing.py)
            if not launch_paused(_args(setup, killed, "--resume", epochs=epochs)[3:], rng.choice(MOMENTS),
                                 rng.randint(1, 3), tmp_path / "stop", env):
                break
            done += 1
            continue
        proc = subprocess.Popen(_args(setup, killed, "--resume", epochs=epochs), env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(1.0, 3.5))
        if proc.poll() is not None:
            break
        proc.send_signal(signal.SIGKILL)  # no handler runs: a real crash, sometimes mid-checkpoint
        proc.wait()
        done += 1
    subprocess.run(_args(setup, killed, "--resume", epochs=epochs), check=True, env=env, capture_output=True)
    _same_result(full, killed)
    return done


@pytest.mark.slow
def test_a_killed_fine_tuning_run_resumes_bit_for_bit(setup, tmp_path):
    """Two SIGKILLs at random moments; `make test` kills at chosen moments instead (the test below)."""
    assert _campaign(setup, tmp_path, kills=2, seed=1, epochs=3) >= 1


@pytest.mark.slow  # 20-40 s: make test-slow (make test stays near five minutes on two cores)
def test_killed_inside_checkpoint_writes_fine_tuning_resumes_bit_for_bit(short_setup, tmp_path):
    """SIGKILL with a half-written state.pt, then (resumed) right after a checkpoint's rename: --resume ends
    with the uninterrupted run's report, losses and weights, bit for bit."""
    from killing import child_env, launch_paused, run_here, torn_checkpoint_left

    env = child_env()
    full, killed = tmp_path / "full", tmp_path / "killed"
    assert run_here(_args(short_setup, full, epochs=1)[3:]) == 0  # the reference, in this process
    for where, nth in (("state", 2), ("renamed", 3)):
        assert launch_paused(_args(short_setup, killed, "--resume", epochs=1)[3:], where, nth, tmp_path / "stop", env)
        assert torn_checkpoint_left(killed) == (where == "state")
    assert run_here(_args(short_setup, killed, "--resume", epochs=1)[3:]) == 0
    _same_result(full, killed)


@pytest.mark.slow
def test_kill_campaign_twenty_sigkills_during_fine_tuning(setup, tmp_path):
    assert _campaign(setup, tmp_path, kills=20, seed=2026, epochs=40, in_writes=True) == 20  # 2,400 steps: room for 20 kills
