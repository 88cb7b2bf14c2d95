"""A fine-tuning run killed near its end, then --resume: the same report, log and model as an uninterrupted run.

The kills land at a named write step (``killing.run_with_fault`` in a forked child): mid-way through a file's
temporary write, while the finished run removes its checkpoints, right after its last checkpoint is in place.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import random
import re
from pathlib import Path

import pytest
import torch

from bertkit.cli import main
from killing import run_with_fault, write_steps

WORDS = {"O": ["the", "a", "said", "on", "with", "and"], "PER": ["peter", "maria"], "LOC": ["paris", "rome"]}


@pytest.fixture(scope="module")
def setup(tmp_path_factory, tiny_checkpoint) -> Path:
    """A tiny encoder and 12 short CoNLL sentences to train on: 3 batches of 4 an epoch."""
    root = tmp_path_factory.mktemp("kill-resume-ends")
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *sorted({w for ws in WORDS.values() for w in ws})]
    tiny_checkpoint(root / "model", tokenizer=vocab, max_position_embeddings=64)
    rng = random.Random(0)
    for split, n in (("train", 12), ("valid", 6), ("test", 6)):
        lines = []
        for _ in range(n):
            for _ in range(rng.randint(3, 6)):
                kind = rng.choice(["O", "O", "PER", "LOC"])
                lines.append(f"{rng.choice(WORDS[kind])} X X {'O' if kind == 'O' else 'B-' + kind}")
            lines.append("")
        (root / "conll").mkdir(exist_ok=True)
        (root / "conll" / f"{split}.txt").write_text("\n".join(lines) + "\n")
    return root


def _args(root: Path, out: Path, *extra: str) -> list[str]:
    """4 steps, the last one inside the second epoch (evaluated at the run's end), a checkpoint at every step."""
    return ["finetune", "ner", "--data-dir", str(root / "conll"), "--model", str(root / "model"), "--output-dir",
            str(out), "--max-steps", "4", "--batch-size", "4", "--learning-rate", "1e-3", "--save-steps", "1",
            "--max-seq-length", "32", "--no-progress", "--device", "cpu", *extra]


def _cli(args: list[str]) -> None:
    """``bertkit args`` here on one thread, as the forked children run, so that their weights compare bit for bit."""
    err, threads = io.StringIO(), torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = main(args)
    finally:
        torch.set_num_threads(threads)
    assert code == 0, err.getvalue()[-2000:]


def _result(out: Path) -> tuple:
    """What a run leaves, timings aside: its report's scores and epochs, its log, its model and every file's name."""
    report = json.loads((out / "report.json").read_text())
    log = [{k: v for k, v in r.items() if not k.endswith("_per_s")}
           for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())]
    names = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.name != ".bertkit-lock")
    return (report["dev"], report["test"], report["dev_per_epoch"], log, names,
            (out / "model" / "model.safetensors").read_bytes())


def _kill_at(root: Path, out: Path, names: list[str], pattern: str, which: int = 0, after: bool = False) -> str:
    """Run ``_args(root, out)`` in a forked child killed before (``after``: right after) its write step whose name
    matches ``pattern`` (``which``: the first, -1: the last); returns that step's name. ``names``: the steps of a
    whole run into a directory of the same name as ``out`` (the ``counted`` fixture's)."""
    assert out.name == "out"
    args = _args(root, out)
    at = [i for i, name in enumerate(names) if re.search(pattern, name)][which]
    outcome = run_with_fault(lambda: _cli(args), "kill", at + 1 + after)
    assert outcome[0] == "killed", outcome
    return names[at]


@pytest.fixture(scope="module")
def reference(setup, tmp_path_factory) -> tuple:
    out = tmp_path_factory.mktemp("reference") / "out"
    _cli(_args(setup, out))
    return _result(out)


@pytest.fixture(scope="module")
def counted(setup, reference, tmp_path_factory) -> list[str]:
    """The names of the write steps of an uninterrupted run into a directory named "out", in a forked child as the
    killed runs, counted once for every test here. After ``reference``, as every kill is forked after it: a child
    forked before any run in this process takes other write steps (counted so, the random kills below landed past
    the end of the runs they were meant to cut)."""
    out = tmp_path_factory.mktemp("counted") / "out"
    write_steps(lambda: _cli(_args(setup, out)))
    return list(run_with_fault.names)


def test_a_run_resumed_after_a_kill_inside_a_file_write_keeps_none_of_its_temporary_files(setup, tmp_path, counted,
                                                                                           reference):
    """Was: the killed write's `.report.json.<random>.<pid>.bertkit-tmp` was carried into the finished run's
    directory (and its manifest) by --resume, as were a killed checkpoint's `.vocab.txt...bertkit-tmp`."""
    out = tmp_path / "out"
    _kill_at(setup, out, counted, r"^builtins\.open\(\.report\.json\..*\.bertkit-tmp\)")
    _cli(_args(setup, out, "--resume"))
    assert not [p.name for p in out.rglob("*.bertkit-tmp")]
    assert _result(out) == reference


@pytest.mark.parametrize("step", [r"^os\.unlink\(state\.pt\)", pytest.param(r"^os\.rmdir\(step-\d+\)", marks=pytest.mark.slow)])
def test_a_kill_while_the_finished_run_removes_its_checkpoints_resumes(setup, tmp_path, counted, reference, step):
    """Was: `no intact checkpoint to resume from in .../checkpoints: .../step-00000004/state.pt
    (FileNotFoundError ...)`, exit 2: the run's checkpoints went before its model and report were written, and the
    one a kill left half removed was taken for a damaged checkpoint; only --overwrite, training again, went on."""
    out = tmp_path / "out"
    _kill_at(setup, out, counted, step, which=-1)
    _cli(_args(setup, out, "--resume"))
    assert _result(out) == reference


def test_a_run_killed_after_its_last_checkpoint_logs_its_final_evaluation_at_its_epoch(setup, tmp_path, counted,
                                                                                        reference):
    """Was: resumed from the checkpoint of its last step (epoch 1, batch 1 of 3), the run owed its final evaluation
    and logged it as `"epoch": 0` in metrics.jsonl and the report's dev_per_epoch, where the uninterrupted run says 1."""
    out = tmp_path / "out"
    _kill_at(setup, out, counted, r"^os\.rename\(\.step-00000004\.bertkit-staging\)", after=True)
    _cli(_args(setup, out, "--resume"))
    assert [r["epoch"] for r in json.loads((out / "report.json").read_text())["dev_per_epoch"]] == [0, 1]
    assert _result(out) == reference


@pytest.mark.slow  # about 30 s: make test-slow
def test_kills_at_random_write_steps_then_resume_end_as_an_uninterrupted_run(setup, tmp_path, reference):
    """The seeded generator that found the three above: 16 kills at random write steps of a whole run."""
    steps = write_steps(lambda: _cli(_args(setup, tmp_path / "counted")))
    for at in sorted(random.Random(2026).sample(range(1, steps + 1), 16)):
        out = tmp_path / f"out-{at}"
        assert run_with_fault(functools.partial(_cli, _args(setup, out)), "kill", at)[0] == "killed"
        _cli(_args(setup, out, "--resume"))
        assert _result(out) == reference, f"killed before write step {at}"
