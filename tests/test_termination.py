"""SIGTERM (``kill``, ``timeout``, ``docker stop``, a scheduler's end of job) ends a command as Ctrl-C does: what it
was writing is removed, one line says so, and the exit status is the shell's for the signal (143)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from bertkit.cli import main
from conftest import FILM_WORDS

# The child sends itself SIGTERM from inside the command, at the call named (module:attribute), then goes on: the
# signal lands at a known moment of the write, where a timed kill from outside would land anywhere.
_CHILD = r"""
import functools, importlib, os, signal, sys
from bertkit.cli import main

module, _, path = sys.argv[1].partition(":")
owner = importlib.import_module(module)
*classes, name = path.split(".")
for c in classes:
    owner = getattr(owner, c)
real = getattr(owner, name)

@functools.wraps(real)
def terminated_here(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGTERM)
    return real(*args, **kwargs)

setattr(owner, name, terminated_here)
sys.exit(main(sys.argv[2:]))
"""

@pytest.fixture(scope="module")
def classifier(film_classifier) -> Path:
    return film_classifier


def _commands(work: Path, model: Path) -> dict[str, tuple[str, list[str]]]:
    """Per command: where SIGTERM lands, and its arguments (inputs in ``work``, outputs in ``work/out``)."""
    texts = ["a good film", "a dull film", "fine films", "a bad film"] * 8
    (work / "in.txt").write_text("\n".join(texts) + "\n", encoding="utf-8")
    rows = "".join(f"{t},{i % 2}\n" for i, t in enumerate(texts))
    (work / "train.csv").write_text("text,label\n" + rows, encoding="utf-8")
    (work / "dev.csv").write_text("text,label\n" + rows[: len(rows) // 2], encoding="utf-8")
    return {
        # the predictions' temporary file is open beside out/preds.jsonl
        "predict text-classification": ("bertkit.inference.base:Pipeline.__call__", [
            "predict", "text-classification", "--model", str(model), "--input", str(work / "in.txt"),
            "--output-file", str(work / "out" / "preds.jsonl"), "--no-progress"]),
        # its staging directory .out.bertkit-staging is locked and marked
        "quantize": ("bertkit.quantization:quantize_checkpoint", [
            "quantize", "--model", str(model), "--output-dir", str(work / "out")]),
        # at the first step's clipping: the run has a staging directory and a metrics file, no checkpoint yet
        "finetune classify": ("bertkit.training.loop:_clip_grad_norm", [
            "finetune", "classify", "--model", str(model), "--train-file", str(work / "train.csv"),
            "--validation-file", str(work / "dev.csv"), "--output-dir", str(work / "out"), "--max-steps", "2",
            "--batch-size", "8", "--save-steps", "1", "--max-seq-length", "16", "--no-progress"]),
    }


@pytest.mark.parametrize("command", ["predict text-classification",  # the others' subprocesses in make test-slow
                                     *(pytest.param(c, marks=pytest.mark.slow) for c in ("quantize",
                                                                                         "finetune classify"))])
def test_sigterm_removes_what_the_command_was_writing_as_ctrl_c_does(command, classifier, tmp_path):
    """Python's default for SIGTERM ends the process on the spot: a predict killed so left its half-written
    `.preds.jsonl.*.bertkit-tmp` in the output's directory, a quantize its `.out.bertkit-staging`, and a fine-tuning
    run killed before its first checkpoint a staging directory that refused the next plain run ("cut short: pass
    --resume ... or --overwrite"), where Ctrl-C at the same moment leaves nothing. Now SIGTERM unwinds the command as
    Ctrl-C does, and the status is 143, not death by the signal (-15)."""
    where, argv = _commands(tmp_path, classifier)[command]
    if command.startswith("predict"):
        (tmp_path / "out").mkdir()
    inputs = sorted(p.name for p in tmp_path.iterdir())
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", _CHILD, where, *argv], capture_output=True, text=True, env=env,
                          timeout=300)
    assert done.returncode == 143, done.stderr[-2000:]
    assert done.stderr.strip().splitlines()[-1] == f"bertkit {command}: terminated (SIGTERM)"
    assert sorted(p.name for p in tmp_path.iterdir()) == inputs  # nothing beside them: no staging, no temporary
    if command.startswith("predict"):
        assert list((tmp_path / "out").iterdir()) == []
    assert main(argv) == 0  # and the next run is not refused for what a killed one left


def test_a_command_puts_back_the_sigterm_handler_it_found(tmp_path, capsys):
    """The handler is the command's while it runs, not the process's: a script or test calling ``main`` keeps its own
    (here one that records the signal) once the command returns, as when it fails."""
    got = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: got.append(signum))
    try:
        assert main(["predict", "text-classification", "--model", str(tmp_path / "none"), "--input",
                     str(tmp_path / "none.txt"), "--output-file", str(tmp_path / "out.jsonl")]) == 2
        os.kill(os.getpid(), signal.SIGTERM)
        assert got == [signal.SIGTERM]
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert "none" in capsys.readouterr().err


@pytest.mark.slow
def test_sigint_or_sigterm_at_random_moments_leaves_the_whole_output_or_nothing(classifier, tmp_path):
    """The campaign that found SIGTERM's leftovers: predict, extract-features and quantize stopped by SIGINT or
    SIGTERM at seeded random moments (loading, running, writing, after), each followed by a run that must succeed.
    After every stop the directory holds the inputs and either the whole output or nothing of it: no temporary
    file, no staging directory."""
    import random
    import shutil
    import time

    rng = random.Random(20261130)
    texts = [" ".join(rng.choice(FILM_WORDS[5:11]) for _ in range(rng.randint(1, 40))) for _ in range(600)]
    (tmp_path / "in.txt").write_text("\n".join(texts) + "\n", encoding="utf-8")
    work = tmp_path / "work"
    commands = {
        "predict": ["predict", "text-classification", "--model", str(classifier), "--input", str(tmp_path / "in.txt"),
                    "--output-file", str(work / "preds.jsonl"), "--batch-size", "8", "--no-progress"],
        "extract-features": ["extract-features", "--model", str(classifier), "--input", str(tmp_path / "in.txt"),
                             "--output-file", str(work / "feats.jsonl"), "--layers", "-1", "--no-progress"],
        "quantize": ["quantize", "--model", str(classifier), "--output-dir", str(work / "q")],
    }
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for trial in range(6):
        name = ["predict", "extract-features", "quantize"][trial // 2 % 3]
        argv = commands[name]
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir()
        sig = rng.choice([signal.SIGINT, signal.SIGTERM])
        # odd trials: a moment of the write (once its first entry shows in the directory, up to 0.3 s later); even
        # ones: any moment from the start, loading included
        writing, at = trial % 2 == 1, rng.uniform(0.0, 0.3) if trial % 2 else rng.uniform(1.0, 5.0)
        proc = subprocess.Popen([sys.executable, "-m", "bertkit", *argv], stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True, env=env)
        while writing and proc.poll() is None and not any(work.iterdir()):
            time.sleep(0.005)
        try:
            _, err = proc.communicate(timeout=at)
        except subprocess.TimeoutExpired:
            proc.send_signal(sig)
            _, err = proc.communicate(timeout=120)
        # a signal before main() took over ends Python on the spot (-2 / -15): nothing is written by then
        assert proc.returncode in (0, 130, 143, -signal.SIGINT, -signal.SIGTERM), (name, sig, at, err[-1500:])
        left = sorted(str(p.relative_to(work)) for p in work.rglob("*"))
        assert not [p for p in left if p.startswith(".") and not p.startswith(".bertkit")], (name, sig, at, left)
        assert not [p for p in left if "bertkit-tmp" in p or "bertkit-staging" in p or "bertkit-partial" in p], (
            name, sig, at, left)
        if name == "quantize" and left:  # the whole int8 directory, its manifest written last
            assert "q/.bertkit-run.json" in left and "q/model.int8.safetensors" in left, (sig, at, left)
        elif left:  # the whole file: one line per input
            assert len(next(work.iterdir()).read_text(encoding="utf-8").splitlines()) == len(texts), (name, sig, at)
        assert main([*argv, "--overwrite"]) == 0, (name, sig, at)
