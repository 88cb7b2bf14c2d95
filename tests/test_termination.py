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

_WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "good", "bad", "film", "dull", "fine", "##s"]


@pytest.fixture(scope="module")
def classifier(tmp_path_factory, tiny_checkpoint) -> Path:
    root = tmp_path_factory.mktemp("sigterm")
    return tiny_checkpoint(root / "clf", "BertForSequenceClassification", tokenizer=_WORDS, labels=["neg", "pos"],
                           num_attention_heads=2, max_position_embeddings=128)


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


@pytest.mark.parametrize("command", ["predict text-classification", "quantize", "finetune classify"])
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
