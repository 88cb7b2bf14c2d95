"""Never lose a user's files: atomic writes, runs staged beside their directory and swapped into place with a
manifest written last, --overwrite that removes only bertkit's files and only once the new run is complete, a lock."""

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
from bertkit.outputs import MARKER, atomic_write_text
from bertkit.runs import claim_output_dir, output_dir
from bertkit.write_paths import staging_dir_of
from killing import killed_run

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


@pytest.mark.parametrize("link", [False, True], ids=["pipe", "symlink-to-pipe"])
def test_a_pipe_or_device_at_the_output_name_is_refused_not_replaced(tmp_path, link):
    """Was: the new file was renamed over it: `--out /dev/null --overwrite` as root replaced /dev/null itself, and
    `--out /dev/stdout` the link every process writes through (a named pipe stands for both here)."""
    import stat

    from bertkit.runs import refuse_existing_file

    os.mkfifo(tmp_path / "pipe")
    out = tmp_path / "out.jsonl"
    out.symlink_to(tmp_path / "pipe") if link else os.replace(tmp_path / "pipe", out)
    said = f"{out} {'leads to' if link else 'is'} a named pipe, not a file"
    with pytest.raises(BertkitError, match=said):
        refuse_existing_file(out, overwrite=True)
    with pytest.raises(BertkitError, match=said):
        atomic_write_text(out, "{}")
    assert stat.S_ISFIFO(os.stat(out).st_mode) and out.is_symlink() == link
    assert sorted(p.name for p in tmp_path.iterdir()) == (["out.jsonl", "pipe"] if link else ["out.jsonl"])


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
    """The second command into the first's output is refused; --overwrite removes exactly the first's files, once
    the second run is complete (while it runs the first one is still there, whole)."""
    with output_dir(tmp_path, first, {"a": 1}) as claim:
        (claim.path / "sub").mkdir()
        atomic_write_text(claim.path / "sub" / "made.txt", "bertkit's")
    with pytest.raises(BertkitError, match=f"output of a `bertkit {first}` run") as info:
        claim_output_dir(tmp_path, second, {"a": 2})
    assert "--overwrite" in str(info.value)
    assert (tmp_path / "sub" / "made.txt").read_text() == "bertkit's"  # refused: nothing touched
    with output_dir(tmp_path, second, {"a": 2}, overwrite=True) as claim:
        assert (tmp_path / "sub" / "made.txt").read_text() == "bertkit's" and claim.path != tmp_path
        atomic_write_text(claim.path / "new.txt", "the second run's")
    assert not (tmp_path / "sub").exists() and (tmp_path / "new.txt").read_text() == "the second run's"
    assert json.loads((tmp_path / MARKER).read_text())["command"] == second
    assert not staging_dir_of(tmp_path).exists()


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


def test_a_killed_run_leaves_the_earlier_one_whole_and_its_own_files_are_recognised(tmp_path):
    """A run killed mid-write (here: --overwrite over an earlier run) leaves the earlier run as it was and its own
    files in its staging directory; a plain run refuses them naming --resume and --overwrite, --overwrite removes
    them, a command that cannot be resumed removes them unasked."""
    with output_dir(tmp_path, "pretrain") as claim:
        atomic_write_text(claim.path / "metrics.jsonl", "{}\n")
    before = (tmp_path / "metrics.jsonl").read_bytes()
    killed_run(tmp_path, "pretrain", {"checkpoints/step-1/state.pt": "x"}, overwrite=True)
    staging = staging_dir_of(tmp_path)
    assert (tmp_path / "metrics.jsonl").read_bytes() == before and not (tmp_path / "checkpoints").exists()
    assert (staging / "checkpoints" / "step-1" / "state.pt").read_text() == "x"
    with pytest.raises(BertkitError, match=r"was cut short; its files are in .*pass --resume to continue it, or "
                                           r"--overwrite to start again"):
        claim_output_dir(tmp_path, "pretrain")
    assert (staging / "checkpoints" / "step-1" / "state.pt").read_text() == "x"
    with output_dir(tmp_path, "pretrain", overwrite=True) as claim:
        assert not (claim.path / "checkpoints").exists()  # the killed run's files are gone, the earlier run kept
        assert (tmp_path / "metrics.jsonl").read_bytes() == before
    assert not (tmp_path / "metrics.jsonl").exists() and not staging.exists()
    killed_run(tmp_path, "quantize", {"model.int8.safetensors": "half"}, resumable=False)
    with output_dir(tmp_path, "quantize", overwrite=True):  # bertkit's own temporary files never refuse a run
        pass
    assert not staging.exists()


def test_a_killed_run_of_another_command_is_not_offered_this_commands_resume(tmp_path):
    """Was: `finetune classify` into the directory of a killed `pretrain` run said "pass --resume to continue it",
    and with --resume it said the same again: only `bertkit pretrain --resume` continues that run."""
    killed_run(tmp_path / "out", "pretrain", {"checkpoints/step-1/state.pt": "x"})
    for resume in (False, True):
        with pytest.raises(BertkitError, match=r"was cut short; its files are in .*: continue it with `bertkit pretrain "
                                               r"--resume`, or pass --overwrite to start again") as refused:
            claim_output_dir(tmp_path / "out", "finetune classify", resume=resume)
        assert "pass --resume" not in str(refused.value)
    assert (staging_dir_of(tmp_path / "out") / "checkpoints" / "step-1" / "state.pt").read_text() == "x"


def test_resume_continues_a_killed_run_in_its_staging_directory(tmp_path):
    killed_run(tmp_path / "out", "pretrain", {"checkpoints/step-1/state.pt": "x"})
    assert not (tmp_path / "out").exists()  # nothing of a run that never finished looks complete
    with output_dir(tmp_path / "out", "pretrain", resume=True) as claim:
        assert (claim.path / "checkpoints" / "step-1" / "state.pt").read_text() == "x"
        atomic_write_text(claim.path / "final.txt", "done")
    assert sorted(json.loads((tmp_path / "out" / MARKER).read_text())["files"]) == [
        "checkpoints/step-1/state.pt", "final.txt"]


def test_a_second_process_is_refused_and_a_dead_ones_lock_is_taken_over(tmp_path):
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from bertkit.runs import claim_output_dir;"
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


def test_commands_into_a_model_or_another_runs_directory_are_refused(tmp_path, minilm_2_layers, capsys):
    """train-tokenizer into a model directory; fine-tuning into a pre-training run; pretrain into a fine-tuning run."""
    from bertkit import BertModel, BertTokenizer

    model_dir = tmp_path / "model"
    BertModel.from_pretrained(minilm_2_layers).save_pretrained(model_dir)
    BertTokenizer.from_pretrained(minilm_2_layers).save_pretrained(model_dir)
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


def test_a_run_that_fails_leaves_nothing_that_looks_complete(tmp_path):
    """A failed run makes no directory: nothing at all if it wrote nothing, or it cannot be resumed; a resumable
    run's files stay in its staging directory for --resume."""
    with pytest.raises(BertkitError, match="late"), output_dir(tmp_path / "new", "pretrain"):
        raise BertkitError("failed late")
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    (tmp_path / "mine").mkdir()  # a directory the user made stays
    with pytest.raises(BertkitError), output_dir(tmp_path / "mine", "pretrain"):
        raise BertkitError("failed")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine"]
    with pytest.raises(BertkitError), output_dir(tmp_path / "q", "quantize", resumable=False) as claim:
        atomic_write_text(claim.path / "model.int8.safetensors", "x")
        raise BertkitError("failed")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine"]
    with pytest.raises(BertkitError), output_dir(tmp_path / "wrote", "pretrain") as claim:
        atomic_write_text(claim.path / "log.txt", "x")
        raise BertkitError("failed")
    assert not (tmp_path / "wrote").exists() and (staging_dir_of(tmp_path / "wrote") / "log.txt").read_text() == "x"
    with output_dir(tmp_path / "wrote", "pretrain", resume=True):
        pass
    assert json.loads((tmp_path / "wrote" / MARKER).read_text())["files"] == {
        "log.txt": {"size": 1, "sha256": hashlib.sha256(b"x").hexdigest()}}
    assert main(["finetune", "glue", "--task", "mrpc", "--data-dir", str(tmp_path / "no-glue"), "--model",
                 str(tmp_path / "no-model"), "--output-dir", str(tmp_path / "run")]) == 2
    assert not (tmp_path / "run").exists()


def test_a_run_that_fails_at_its_first_step_leaves_nothing_to_resume(tmp_path):
    """Was: `finetune glue --task mrpc` on a checkpoint with type_vocab_size 1 failed at its first step (the pairs'
    token_type_ids 1) and left its staging directory, holding only the empty runs/lr0.0001-seed1/metrics.jsonl
    opened at the start; the same command on a fixed checkpoint was then refused, "was cut short ... pass --resume
    to continue it, or --overwrite to start again", though there was nothing to continue. Now empty files (and the
    directories holding only those) are not a run's output: it leaves nothing, and the next run is taken."""
    with pytest.raises(BertkitError, match="first step"), output_dir(tmp_path / "run", "finetune glue") as claim:
        (claim.path / "runs" / "lr0.0001-seed1").mkdir(parents=True)
        (claim.path / "runs" / "lr0.0001-seed1" / "metrics.jsonl").touch()
        raise BertkitError("failed at the first step")
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    with output_dir(tmp_path / "run", "finetune glue") as claim:  # not refused as cut short
        atomic_write_text(claim.path / "report.json", "{}")
    assert sorted(json.loads((tmp_path / "run" / MARKER).read_text())["files"]) == ["report.json"]
    with pytest.raises(BertkitError), output_dir(tmp_path / "run2", "pretrain") as claim:
        (claim.path / "metrics.jsonl").touch()
        (claim.path / "checkpoints" / "step-1").mkdir(parents=True)
        atomic_write_text(claim.path / "checkpoints" / "step-1" / "state.pt", "x")
        raise BertkitError("failed later")
    assert (staging_dir_of(tmp_path / "run2") / "checkpoints" / "step-1" / "state.pt").read_text() == "x"


def test_a_claim_that_fails_while_claiming_leaves_no_directory_and_no_lock(tmp_path, monkeypatch):
    """A full disk while the claim writes its record: the staging directory it made is gone and its lock dropped,
    so the next claim of the same path is taken (the failed one held nothing)."""
    from bertkit import runs

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(runs, "atomic_write_json", disk_full)
    with pytest.raises(OSError, match="No space"):
        claim_output_dir(tmp_path / "run", "pretrain")
    assert sorted(tmp_path.iterdir()) == []
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
        atomic_write_text(c.path / "log.txt", "x")
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


_UNDER_ULIMIT = r"""
import resource, signal, sys
import torch
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the system's way: the write fails with EFBIG, the process lives on
from bertkit import BertConfig, BertModel
from bertkit.runs import output_dir
from bertkit.training.checkpoint import save_checkpoint

torch.manual_seed(0)
model = BertModel(BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                             intermediate_size=37))
model.save_pretrained(sys.argv[1])
resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, resource.RLIM_INFINITY))  # `ulimit -f` of 20 kB
try:
    model.save_pretrained(sys.argv[1])  # safetensors' writer: the system's code
except ValueError as e:
    print(e)
try:
    with output_dir(sys.argv[2], "pretrain") as claim:
        save_checkpoint(claim.path, {"model": model.state_dict()}, 10, keep=2)  # torch's writer: no code
except ValueError as e:
    print(e)
"""


def test_a_write_refused_by_a_file_size_limit_says_so_not_that_the_disk_is_full(tmp_path):
    """Was: a save refused by ``ulimit -f`` on a disk with tens of GB free said "no space left on the device ...:
    File too large; free some space and run again", and a checkpoint (torch's writer, which gives no code) "No space
    left on device: ... (it needs about 0 MB, 43296 MB are free) ... free some space": the fix named was not the
    one. Now the limit and its size are named, and the earlier save stays whole."""
    saved = tmp_path / "model"
    done = subprocess.run([sys.executable, "-c", _UNDER_ULIMIT, str(saved), str(tmp_path / "run")],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr
    save, checkpoint = done.stdout.strip().splitlines()
    assert save == (f"this process's file-size limit, 20000 bytes (ulimit -f), was reached while writing {saved}: File "
                    "too large; raise the limit (ulimit -f unlimited) and run again (nothing was replaced: what was "
                    "there before is intact)")
    assert checkpoint.startswith(f"File too large: could not write the checkpoint {tmp_path / 'run'}/checkpoints/"
                                 "step-00000010 (it needs about 0 MB, "), checkpoint
    assert checkpoint.endswith("): this process's file-size limit, 20000 bytes (ulimit -f), was reached; the temporary "
                               "files were removed and nothing else was changed: raise the limit (ulimit -f unlimited) "
                               "and run again with --resume"), checkpoint
    assert sorted(p.name for p in saved.iterdir()) == ["config.json", "model.safetensors"]
