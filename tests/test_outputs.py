"""Never lose a user's files: atomic writes, run markers, --overwrite that removes only bertkit's files, a lock."""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from bertkit.cli import COMMANDS, main
from bertkit.errors import BertkitError
from bertkit.outputs import _ACTIVE, MARKER, atomic_write_text, claim_output_dir, output_dir

COMMAND_NAMES = list(COMMANDS)


def test_atomic_write_replaces_a_symlink_instead_of_writing_through_it(tmp_path):
    precious = tmp_path / "precious.txt"
    precious.write_text("the user's data")
    out = tmp_path / "out"
    out.mkdir()
    (out / "report.json").symlink_to(precious)
    atomic_write_text(out / "report.json", "{}")
    assert precious.read_text() == "the user's data"
    assert not (out / "report.json").is_symlink() and (out / "report.json").read_text() == "{}"
    assert sorted(p.name for p in out.iterdir()) == ["report.json"]  # no temporary file left behind


def test_tokenizer_save_pretrained_never_writes_through_a_symlink(tmp_path, minilm_dir):
    from bertkit.tokenization import BertTokenizer

    precious = tmp_path / "precious.json"
    precious.write_text('{"mine": true}')
    out = tmp_path / "tok"
    out.mkdir()
    (out / "tokenizer_config.json").symlink_to(precious)
    BertTokenizer.from_pretrained(minilm_dir).save_pretrained(out)
    assert precious.read_text() == '{"mine": true}'
    assert BertTokenizer.from_pretrained(out).do_lower_case is True


def test_atomic_write_keeps_the_old_file_when_the_disk_is_full(tmp_path, monkeypatch):
    target = tmp_path / "metrics.json"
    target.write_text("old")

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(BertkitError, match=f"no space left on the device while writing {target}"):
        atomic_write_text(target, "new")
    assert target.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["metrics.json"]


# To output_dir the command is only a name, so a few kinds of pair stand for every ordered pair of commands.
PAIRS = {"same-command": ("pretrain", "pretrain"), "other-command": ("train-tokenizer", "create-pretraining-data"),
         "same-family": ("finetune glue", "finetune ner"), "other-family": ("predict squad", "export onnx")}


@pytest.mark.parametrize("first,second", PAIRS.values(), ids=PAIRS.keys())
def test_a_second_command_into_one_directory(tmp_path, first, second):
    """The second command into the first's output is refused; --overwrite removes exactly the first's files."""
    with output_dir(tmp_path, first, {"a": 1}) as claim:
        (claim.path / "sub").mkdir()
        atomic_write_text(claim.path / "sub" / "made.txt", "bertkit's")
    with pytest.raises(BertkitError, match=f"output of a `bertkit {first}` run") as info:
        claim_output_dir(tmp_path, second, {"a": 2})
    assert "--overwrite" in str(info.value)
    assert (tmp_path / "sub" / "made.txt").read_text() == "bertkit's"  # refused: nothing touched
    with output_dir(tmp_path, second, {"a": 2}, overwrite=True):
        assert not (tmp_path / "sub").exists()
    assert json.loads((tmp_path / MARKER).read_text())["command"] == second


def test_every_command_marks_its_directory_and_guards_it(tmp_path):
    """Each command's run, followed by the next command of the list: refused, with --resume too, naming the run."""
    for first, second in zip(COMMAND_NAMES, COMMAND_NAMES[1:] + COMMAND_NAMES[:1]):
        out = tmp_path / first.replace(" ", "-")
        with output_dir(out, first, {"a": 1}) as claim:
            atomic_write_text(claim.path / "made.txt", "bertkit's")
        assert json.loads((out / MARKER).read_text())["command"] == first
        for resume in (False, True):
            with pytest.raises(BertkitError, match=f"`bertkit {first}` run"):
                claim_output_dir(out, second, {"a": 1}, resume=resume)
        assert (out / "made.txt").read_text() == "bertkit's"


def test_overwrite_never_removes_a_file_bertkit_did_not_write(tmp_path):
    with output_dir(tmp_path, "pretrain") as claim:
        atomic_write_text(claim.path / "metrics.jsonl", "{}\n")
    (tmp_path / "notes.txt").write_text("the user's notes, added later")
    with pytest.raises(BertkitError, match="other file.s. remain .e.g. notes.txt"):
        claim_output_dir(tmp_path, "finetune ner", overwrite=True)
    assert (tmp_path / "notes.txt").read_text() == "the user's notes, added later"
    assert (tmp_path / "metrics.jsonl").read_text() == "{}\n"  # all or nothing: refused, so nothing removed


def test_a_directory_of_user_files_is_refused_even_with_overwrite(tmp_path):
    (tmp_path / "vocab.txt").write_text("[PAD]\n")
    for overwrite in (False, True):
        with pytest.raises(BertkitError, match="1 file.s. bertkit did not write there .e.g. vocab.txt."):
            claim_output_dir(tmp_path, "train-tokenizer", overwrite=overwrite)
    assert (tmp_path / "vocab.txt").read_text() == "[PAD]\n"


def test_resume_continues_the_same_command_only(tmp_path):
    with output_dir(tmp_path, "pretrain") as claim:
        atomic_write_text(claim.path / "metrics.jsonl", "{}\n")
    with pytest.raises(BertkitError, match="pass --resume to continue it"):
        claim_output_dir(tmp_path, "pretrain")
    with output_dir(tmp_path, "pretrain", resume=True):
        pass
    with pytest.raises(BertkitError, match="`bertkit pretrain` run"):
        claim_output_dir(tmp_path, "finetune glue", resume=True)


def test_resume_with_other_settings_is_refused_before_anything_is_touched(tmp_path):
    """`finetune glue --task cola --resume` into an SST-2 run (whose checkpoints are gone once it finished)
    would start afresh there and replace its report and best/: refused, naming the changed flag."""
    with output_dir(tmp_path, "finetune glue", {"task": "sst2", "seed": 1}) as claim:
        atomic_write_text(claim.path / "report.json", '{"task": "sst2"}')
    with pytest.raises(BertkitError, match=r"other settings \(--task 'sst2' then, 'cola' now\).*--overwrite"):
        claim_output_dir(tmp_path, "finetune glue", {"task": "cola", "seed": 1}, resume=True)
    assert (tmp_path / "report.json").read_text() == '{"task": "sst2"}'
    with output_dir(tmp_path, "finetune glue", {"task": "sst2", "seed": 1}, resume=True):
        pass  # the same settings continue


def test_overwrite_after_a_killed_run_removes_what_it_made(tmp_path):
    claim = claim_output_dir(tmp_path, "pretrain")  # never released: as if SIGKILLed
    (tmp_path / "checkpoints").mkdir()
    atomic_write_text(tmp_path / "checkpoints" / "state.pt", "x")
    _ACTIVE.remove(claim)  # as if SIGKILLed: the process, and its claim, are gone
    claim.lock.close()
    with output_dir(tmp_path, "pretrain", overwrite=True):
        assert not (tmp_path / "checkpoints").exists()


def test_a_second_process_is_refused_and_a_dead_ones_lock_is_taken_over(tmp_path):
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from bertkit.outputs import claim_output_dir;"
         f"c = claim_output_dir({str(tmp_path)!r}, 'pretrain'); print('ready', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        with pytest.raises(BertkitError, match=rf"is in use by pid {holder.pid} \(bertkit pretrain\)"):
            claim_output_dir(tmp_path, "pretrain", resume=True)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    time.sleep(0.1)
    with output_dir(tmp_path, "pretrain", resume=True):  # the kernel dropped the dead process's lock
        pass


def test_commands_into_a_model_or_another_runs_directory_are_refused(tmp_path, minilm_dir, capsys):
    """train-tokenizer into a model directory; fine-tuning into a pre-training run; pretrain into a fine-tuning run."""
    from bertkit import BertModel, BertTokenizer

    model_dir = tmp_path / "model"
    BertModel.from_pretrained(minilm_dir).save_pretrained(model_dir)
    BertTokenizer.from_pretrained(minilm_dir).save_pretrained(model_dir)
    before = (model_dir / "vocab.txt").read_bytes()
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("a small corpus of words\n" * 50)
    assert main(["train-tokenizer", str(corpus), "--output-dir", str(model_dir), "--vocab-size", "100",
                 "--no-progress"]) == 2
    assert "bertkit did not write there" in capsys.readouterr().err
    assert (model_dir / "vocab.txt").read_bytes() == before

    run = tmp_path / "pretrain-run"
    with output_dir(run, "pretrain") as claim:
        (claim.path / "checkpoints" / "step-00000010").mkdir(parents=True)
        atomic_write_text(claim.path / "checkpoints" / "step-00000010" / "state.pt", "state")
        atomic_write_text(claim.path / "metrics.jsonl", '{"step": 10}\n')
    data = tmp_path / "data"  # not around the run's directory: an output inside an input is refused for that
    for argv in (["finetune", "ner", "--data-dir", str(data), "--model", str(model_dir)],
                 ["finetune", "glue", "--task", "cola", "--data-dir", str(data), "--model", str(model_dir)]):
        assert main([*argv, "--output-dir", str(run), "--no-progress"]) == 2
        assert "already holds the output of a `bertkit pretrain` run" in capsys.readouterr().err
    assert (run / "metrics.jsonl").read_text() == '{"step": 10}\n'
    assert (run / "checkpoints" / "step-00000010" / "state.pt").read_text() == "state"


def test_a_run_that_fails_before_writing_leaves_no_directory_behind(tmp_path):
    """The claim made the directory and nothing was written: no empty directory with a marker and lock."""
    with pytest.raises(BertkitError, match="late"), output_dir(tmp_path / "new", "pretrain"):
        raise BertkitError("failed late")
    assert not (tmp_path / "new").exists()
    # a directory the user made stays, and so does a run that wrote something
    (tmp_path / "mine").mkdir()
    with pytest.raises(BertkitError), output_dir(tmp_path / "mine", "pretrain"):
        raise BertkitError("failed")
    assert (tmp_path / "mine").is_dir()
    with pytest.raises(BertkitError), output_dir(tmp_path / "wrote", "pretrain") as claim:
        atomic_write_text(claim.path / "log.txt", "x")
        raise BertkitError("failed")
    assert json.loads((tmp_path / "wrote" / MARKER).read_text())["files"] == {
        "log.txt": {"size": 1, "sha256": hashlib.sha256(b"x").hexdigest()}}
    assert main(["finetune", "glue", "--task", "mrpc", "--data-dir", str(tmp_path / "no-glue"), "--model",
                 str(tmp_path / "no-model"), "--output-dir", str(tmp_path / "run")]) == 2
    assert not (tmp_path / "run").exists()


def test_a_claim_that_fails_while_claiming_leaves_no_directory_and_no_lock(tmp_path, monkeypatch):
    """A full disk while the claim writes its journal: the directory it made is gone and its lock dropped, so the
    next claim of the same path is taken (the failed one held nothing)."""
    from bertkit import outputs

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(outputs, "atomic_write_text", disk_full)
    with pytest.raises(OSError, match="No space"):
        claim_output_dir(tmp_path / "run", "pretrain")
    assert not (tmp_path / "run").exists()
    monkeypatch.undo()
    claim_output_dir(tmp_path / "run", "pretrain").release(True)
    assert json.loads((tmp_path / "run" / MARKER).read_text())["command"] == "pretrain"


def test_path_settings_compare_as_absolute_paths(tmp_path, monkeypatch):
    """The marker records the directory a run started in; --resume from elsewhere compares the settings named in
    ``paths`` as the absolute paths they meant."""
    a, out = tmp_path / "runs" / "a", tmp_path / "runs" / "a" / "out"
    a.mkdir(parents=True)
    monkeypatch.chdir(a)
    with output_dir("out", "pretrain", {"data": "data", "files": ["x.txt"], "seed": 1}, paths=("data", "files")) as c:
        (c.path / "log.txt").write_text("x")
    assert json.loads((out / MARKER).read_text())["cwd"] == str(a.resolve())

    monkeypatch.chdir(tmp_path)
    same = {"data": "runs/a/data", "files": [str(a / "x.txt")], "seed": 1}
    with output_dir("runs/a/out", "pretrain", same, resume=True, paths=("data", "files")):
        pass  # the same files, named from another directory
    assert json.loads((out / MARKER).read_text())["cwd"] == str(tmp_path.resolve())
    then, now = (tmp_path / "runs/a/data").resolve(), (tmp_path / "data").resolve()
    with pytest.raises(BertkitError, match=re.escape(f"--data '{then}' then, '{now}' now")):
        claim_output_dir("runs/a/out", "pretrain", {**same, "data": "data"}, resume=True, paths=("data", "files"))
    with pytest.raises(BertkitError, match="--data 'runs/a/data' then, 'data' now"):  # not declared a path
        claim_output_dir("runs/a/out", "pretrain", {**same, "data": "data"}, resume=True)
