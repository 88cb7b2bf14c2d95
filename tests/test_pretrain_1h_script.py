"""examples/pretrain-1h/run.sh decides, from what an earlier run left, whether `bertkit pretrain` starts, continues
(--resume) or starts again (--overwrite). Run here with a stand-in for the `bertkit` command that records its
arguments, so each case costs no pre-training."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "examples" / "pretrain-1h" / "run.sh"


def pretrain_args(tmp_path: Path, left: list[str]) -> list[str] | None:
    """The arguments run.sh gives `bertkit pretrain` when the run directory holds the directories ``left``
    (None: it does not call it)."""
    corpus, run = tmp_path / "corpus", tmp_path / "run"
    corpus.mkdir()
    (corpus / "a.txt").write_text("One document.\n")
    for rel in ["vocab", "data", *left]:
        (run / rel).mkdir(parents=True, exist_ok=True)
    (run / "vocab" / "vocab.txt").write_text("[PAD]\n")
    (run / "data" / "manifest.json").write_text("{}")
    calls = tmp_path / "calls"
    fake = tmp_path / "bertkit"
    fake.write_text(f'#!/bin/sh\necho "$@" >> {calls}\n')
    fake.chmod(0o755)
    subprocess.run(["bash", str(SCRIPT), str(corpus), str(run)], cwd=REPO, check=True,
                   env={"PATH": "/usr/bin:/bin", "BK": str(fake), "PY": "true"})
    lines = [line.split() for line in calls.read_text().splitlines()] if calls.exists() else []
    pretrain = [line for line in lines if line[0] == "pretrain"]
    assert len(pretrain) <= 1
    return pretrain[0] if pretrain else None


@pytest.mark.parametrize("left, want", [
    ([], None),  # a new run
    ([".model.bertkit-staging/checkpoints"], "--resume"),  # cut short after a checkpoint (bertkit's staging dir)
    ([".model.bertkit-staging"], "--overwrite"),  # cut short before its first checkpoint
    (["model/checkpoints"], "--resume"),
])
def test_run_sh_continues_a_run_cut_short(tmp_path, left, want):
    args = pretrain_args(tmp_path, left)
    assert args is not None and args[0] == "pretrain"
    flags = {"--resume", "--overwrite"} & set(args)
    assert flags == ({want} if want else set())


def test_run_sh_skips_a_finished_pre_training(tmp_path):
    run = tmp_path / "run"
    (run / "model" / "final").mkdir(parents=True)
    (run / "model" / "final" / "config.json").write_text("{}")
    assert pretrain_args(tmp_path, ["model/checkpoints"]) is None
