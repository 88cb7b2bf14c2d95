"""bertkit deletes or replaces only what it can prove it wrote: a path inside its directory, recorded in the manifest
written last with its size and sha256, never through a symlink; never a command's own inputs; a lock holds against
every command.

Each test is a way an earlier version lost a user's file (the comment says how)."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import signal
import subprocess
import sys
import time

import pytest

from bertkit.cli import main
from bertkit.errors import BertkitError
from bertkit.manifests import owns, remove_owned_tree
from bertkit.outputs import LOCK, MARKER, atomic_write_text
from bertkit.runs import claim_output_dir, output_dir, refuse_existing_file
from bertkit.write_paths import staging_dir_of
from killing import killed_run


def _entry(data: bytes) -> dict:
    return {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


# 1. A killed run, and a resumed one, never take a user's file for their own ---------------------------------------


def test_overwrite_of_a_killed_run_keeps_a_file_the_user_saved_after_it_started(tmp_path):
    """Was: every file newer than the killed run's start was taken for its own, the user's notebook too."""
    killed_run(tmp_path, "pretrain", {"checkpoints/step-1/state.pt": "weights"})
    (tmp_path / "analysis.ipynb").write_text("the user's notebook, saved while the run went on")
    with pytest.raises(BertkitError, match=r"1 file\(s\) bertkit did not write there \(e.g. analysis.ipynb\)"):
        claim_output_dir(tmp_path, "pretrain", overwrite=True)
    assert (tmp_path / "analysis.ipynb").read_text().startswith("the user's notebook")
    assert (staging_dir_of(tmp_path) / "checkpoints" / "step-1" / "state.pt").read_text() == "weights"  # refused
    (tmp_path / "analysis.ipynb").unlink()
    with output_dir(tmp_path, "pretrain", overwrite=True) as claim:
        assert not (claim.path / "checkpoints").exists()  # the killed run's files: all bertkit's, in its staging


def test_a_file_present_at_resume_is_not_recorded_and_survives_a_later_overwrite(tmp_path):
    """Was: --resume listed the whole directory into the marker, the user's file with it."""
    with output_dir(tmp_path, "pretrain", {"seed": 1}) as claim:
        atomic_write_text(claim.path / "metrics.jsonl", "{}\n")
    (tmp_path / "notes.txt").write_text("mine")
    with output_dir(tmp_path, "pretrain", {"seed": 1}, resume=True) as claim:
        atomic_write_text(claim.path / "summary.json", "{}")
    assert sorted(json.loads((tmp_path / MARKER).read_text())["files"]) == ["metrics.jsonl", "summary.json"]
    assert (tmp_path / "notes.txt").read_text() == "mine"  # carried into the continued run's directory
    with pytest.raises(BertkitError, match=r"remain \(e.g. notes.txt\)"):
        claim_output_dir(tmp_path, "pretrain", {"seed": 2}, overwrite=True)
    assert (tmp_path / "notes.txt").read_text() == "mine"
    assert (tmp_path / "metrics.jsonl").exists() and (tmp_path / "summary.json").exists()  # refused: all kept
    (tmp_path / "notes.txt").unlink()
    with output_dir(tmp_path, "pretrain", {"seed": 2}, overwrite=True):
        pass
    assert not (tmp_path / "metrics.jsonl").exists() and not (tmp_path / "summary.json").exists()


def test_a_file_changed_since_the_run_wrote_it_is_the_users_and_is_named(tmp_path):
    with output_dir(tmp_path, "finetune glue") as claim:
        atomic_write_text(claim.path / "report.json", '{"acc": 0.9}')
        atomic_write_text(claim.path / "metrics.jsonl", "{}\n")
    (tmp_path / "report.json").write_text('{"acc": 0.9, "my notes": "keep"}')
    with pytest.raises(BertkitError, match=r"1 of them written by that run but changed since, so yours now "
                                           r"\(e.g. report.json\)"):
        claim_output_dir(tmp_path, "finetune glue", overwrite=True)
    assert "my notes" in (tmp_path / "report.json").read_text()
    assert (tmp_path / "metrics.jsonl").read_text() == "{}\n"  # refused: nothing removed


def test_a_file_the_user_saves_where_the_run_will_write_is_not_replaced(tmp_path, caplog):
    """Was: the run's atomic write replaced whatever a user had saved under that name meanwhile. Now the run is
    written beside the directory; a file the user saves there meanwhile is carried into the finished run's
    directory, or, where the run made a file of the same name, kept beside it and named."""
    with caplog.at_level(logging.WARNING, logger="bertkit"), output_dir(tmp_path / "out", "finetune glue") as claim:
        atomic_write_text(claim.path / "report.json", "{}")
        (tmp_path / "out").mkdir()
        (tmp_path / "out" / "report.json").write_text("the user's report")
        (tmp_path / "out" / "notes.txt").write_text("the user's notes")
    assert (tmp_path / "out" / "report.json").read_text() == "{}"
    assert (tmp_path / "out" / "notes.txt").read_text() == "the user's notes"
    kept = [p for p in tmp_path.rglob("report.json") if p.parent != tmp_path / "out"]
    assert [p.read_text() for p in kept] == ["the user's report"] and str(kept[0].parent.parent) in caplog.text


def test_a_run_in_place_records_the_files_it_appends_to_once(tmp_path):
    """A run that writes into its directory as it goes (the Trainer's) records a file it appends to once, when it
    starts: what follows the recorded bytes is the run's too, so a killed run's log is still provably its own; a
    file replaced by the user's is not."""
    killed_run(tmp_path, "Trainer", {"metrics.jsonl": '{"step": 1}\n'}, in_place=True)
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 2}\n')  # appended after it was recorded (by the run, before its kill)
    assert json.loads((tmp_path / MARKER).read_text())["files"] == {
        "metrics.jsonl": {**_entry(b'{"step": 1}\n'), "appends": True}}
    with output_dir(tmp_path, "Trainer", in_place=True):  # the killed run's log is provably bertkit's
        assert owns(tmp_path / "metrics.jsonl")
    (tmp_path / "metrics.jsonl").write_text("the user's log, not bertkit's\n")
    assert not owns(tmp_path / "metrics.jsonl")
    (tmp_path / "metrics.jsonl").write_text("the user's log, not bertkit's\n")
    assert not owns(tmp_path / "metrics.jsonl")


def test_a_report_of_a_run_in_place_does_not_replace_a_file_the_user_saved_there(tmp_path, tiny_model):
    """Was: once train() had claimed output_dir (held until the process exits), ``save_state()`` replaced a
    trainer_state.json the user had saved there since, and ``save_metrics`` the user's eval_results.json, unasked;
    the user's all_results.json that was not JSON ended the merge in a bare JSONDecodeError."""
    import bertkit

    args = bertkit.TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none")
    trainer = bertkit.Trainer(model=tiny_model("BertForSequenceClassification", labels=2), args=args)
    with output_dir(tmp_path, "Trainer", in_place=True):  # as train() leaves it: claimed, the lock held
        trainer.save_metrics("train", {"train_loss": 0.5})  # bertkit's own: written, then merged into
        trainer.save_metrics("eval", {"eval_loss": 0.25})
        for name in ("trainer_state.json", "eval_results.json", "all_results.json"):
            (tmp_path / name).write_text("the user's")
        with pytest.raises(BertkitError, match="trainer_state.json exists and bertkit did not write it"):
            trainer.save_state()
        with pytest.raises(BertkitError, match="eval_results.json exists and bertkit did not write it"):
            trainer.save_metrics("eval", {"eval_loss": 0.125})
        (tmp_path / "eval_results.json").unlink()
        with pytest.raises(BertkitError, match=r"all_results.json is not valid JSON \(.*\); move it away"):
            trainer.save_metrics("eval", {"eval_loss": 0.125})
    assert [(tmp_path / n).read_text() for n in ("trainer_state.json", "all_results.json")] == ["the user's"] * 2


def test_a_report_a_kill_cut_short_between_its_record_and_its_write_is_still_bertkits(tmp_path):
    """A report is recorded with its new content before it is written; a kill in between left bertkit's earlier
    report under the new hash, and every later write of it was refused as the user's file. The entry keeps what it
    replaces, so the earlier content still proves the file; a user's edit still proves nothing."""
    from bertkit.runs import record

    report = tmp_path / "trainer_state.json"
    with output_dir(tmp_path, "Trainer", in_place=True):
        record(report, data=b"step 1")
        atomic_write_text(report, "step 1")
        record(report, data=b"step 2")  # ... and killed before the write
        assert owns(report)
        record(report, data=b"step 3")  # the resumed run's write goes on
        atomic_write_text(report, "step 3")
        assert owns(report)
        report.write_text("the user's")
        assert not owns(report)
        with pytest.raises(BertkitError, match="trainer_state.json exists and bertkit did not write it"):
            record(report, data=b"step 4")
    assert report.read_text() == "the user's"


def test_a_marker_listing_names_without_hashes_is_refused_and_nothing_is_removed(tmp_path):
    """A marker listing bare names (a user's file among them) proves nothing: not one bertkit writes."""
    (tmp_path / "metrics.jsonl").write_text("{}\n")
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / MARKER).write_text(json.dumps({"command": "pretrain", "fingerprint": {}, "finished": True,
                                               "cwd": str(tmp_path), "files": ["metrics.jsonl", "notes.txt"]}))
    with pytest.raises(BertkitError, match="not a run marker this bertkit wrote.*removes none"):
        claim_output_dir(tmp_path, "pretrain", overwrite=True)
    assert (tmp_path / "notes.txt").read_text() == "mine" and (tmp_path / "metrics.jsonl").exists()


# 2. A marker received from someone else names nothing outside its directory -----------------------------------------


def test_a_marker_naming_paths_outside_its_directory_removes_nothing(tmp_path):
    """Was: `--overwrite` deleted `../victim.txt` and absolute paths a received marker listed."""
    victim, absolute = tmp_path / "victim.txt", tmp_path / "elsewhere" / "abs.txt"
    absolute.parent.mkdir()
    victim.write_text("the user's")
    absolute.write_text("the user's too")
    run = tmp_path / "received"
    run.mkdir()
    (run / "report.json").write_text("{}")
    listed = ["../victim.txt", str(absolute), "report.json"]
    files = {p: _entry(b"the user's") for p in listed}
    (run / MARKER).write_text(json.dumps({"command": "pretrain", "finished": True, "cwd": str(run), "files": files}))
    with pytest.raises(BertkitError, match=r"names 2 path\(s\) outside"):
        claim_output_dir(run, "pretrain", overwrite=True)
    assert victim.read_text() == "the user's" and absolute.read_text() == "the user's too"
    assert (run / "report.json").exists()


def test_a_recorded_path_through_a_symlinked_directory_is_not_followed(tmp_path):
    secret = tmp_path / "home" / "secret.txt"
    secret.parent.mkdir()
    secret.write_bytes(b"keys")
    run = tmp_path / "received"
    run.mkdir()
    (run / "link").symlink_to(secret.parent)
    (run / MARKER).write_text(json.dumps({"command": "pretrain", "finished": True, "cwd": str(run),
                                          "files": {"link/secret.txt": _entry(b"keys")}}))
    with pytest.raises(BertkitError, match=r"remain \(e.g. link\)"):
        claim_output_dir(run, "pretrain", overwrite=True)
    assert secret.read_bytes() == b"keys"


# 3. The lock file is never followed ---------------------------------------------------------------------------------


@pytest.mark.parametrize("in_place", [False, True], ids=["staged", "in-place"])
@pytest.mark.parametrize("kind", ["symlink", "hardlink"])
def test_a_lock_file_that_links_elsewhere_is_refused_and_its_target_untouched(tmp_path, kind, in_place):
    """Was: a `.bertkit-lock` symlink was opened, its target truncated and overwritten with a pid."""
    precious = tmp_path / "precious.txt"
    precious.write_text("the user's data")
    out = tmp_path / "out"
    out.mkdir()
    (out / LOCK).symlink_to(precious) if kind == "symlink" else os.link(precious, out / LOCK)
    said = ("symbolic link" if kind == "symlink" else "hard link") if in_place else "did not write there"
    with pytest.raises(BertkitError, match=said):
        claim_output_dir(out, "pretrain", in_place=in_place)
    assert precious.read_text() == "the user's data"


@pytest.mark.parametrize("in_place", [False, True], ids=["staged", "in-place"])
def test_a_lock_file_holding_something_else_is_not_truncated(tmp_path, in_place):
    (tmp_path / LOCK).write_text("not bertkit's")
    with pytest.raises(BertkitError, match="holds something bertkit did not write" if in_place else
                       r"1 file\(s\) bertkit did not write there \(e.g. .bertkit-lock\)"):
        claim_output_dir(tmp_path, "pretrain", in_place=in_place)
    assert (tmp_path / LOCK).read_text() == "not bertkit's"


@pytest.mark.parametrize("in_place", [False, True], ids=["staged", "in-place"])
def test_a_refused_command_removes_only_a_lock_file_it_made(tmp_path, in_place):
    """A refusal drops the lock file the command created in a user's directory, but not one that was there before
    (an earlier run's), which it did not create. Was (in place, the Trainer's output_dir): the lock file stayed."""
    made, earlier = tmp_path / "made", tmp_path / "earlier"
    for d in (made, earlier):
        d.mkdir()
        (d / "notes.txt").write_text("mine")
    (earlier / LOCK).write_text("pid 1 (bertkit pretrain)")
    for d in (made, earlier):
        with pytest.raises(BertkitError):
            claim_output_dir(d, "pretrain", in_place=in_place)
        assert (d / "notes.txt").read_text() == "mine"
    assert not (made / LOCK).exists() and (earlier / LOCK).exists()
    assert sorted(p.name for p in made.iterdir()) == ["notes.txt"]



# 4. A command's inputs are never its output -------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["equal", "inside", "holding"])
def test_an_output_directory_equal_to_inside_or_holding_an_input_is_refused(tmp_path, capsys, where):
    """Was: `pretrain --data D --output-dir D --overwrite` removed the pre-training data before reading it."""
    data = tmp_path / "runs" / "data"
    with output_dir(data, "create-pretraining-data") as claim:
        atomic_write_text(claim.path / "manifest.json", "{}")
        atomic_write_text(claim.path / "vocab.txt", "[PAD]\n")
    out = {"equal": data, "inside": data / "run", "holding": tmp_path / "runs"}[where]
    assert main(["pretrain", "--data", str(data), "--vocab", str(data), "--output-dir", str(out), "--overwrite",
                 "--max-steps", "1", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "never writes into or clears a command's inputs" in err and "--data" in err
    assert (data / "manifest.json").read_text() == "{}" and not (data / "run").exists()


def test_an_output_file_that_is_the_input_is_refused(tmp_path, capsys, minilm_dir):
    """Was: `extract-features --input texts.jsonl --out texts.jsonl --overwrite` replaced the texts by features."""
    texts = tmp_path / "texts.jsonl"  # refused as an output before it is read (as input, a .jsonl is refused too)
    texts.write_text("a sentence\n")
    assert main(["extract-features", "--model", str(minilm_dir), "--input", str(texts), "--out", str(texts),
                 "--overwrite", "--no-progress"]) == 2
    assert "the command's own input --input" in capsys.readouterr().err
    assert texts.read_text() == "a sentence\n"


# 5. A lock holds against every command ------------------------------------------------------------------------------


def _holder(directory, finished: bool):
    """A process holding ``directory``: its run under way (in its staging directory), or finished and moved into
    place, the lock kept until the process exits (a command's)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from bertkit.outputs import atomic_write_text; from bertkit.runs import claim_output_dir;"
         f"c = claim_output_dir({str(directory)!r}, 'finetune glue');"
         "atomic_write_text(c.path / 'report.json', 'theirs');"
         f"c.release(True, keep_lock=True) if {finished} else None;"
         "print('ready', flush=True); time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc


@pytest.mark.parametrize("finished", [False, True], ids=["running", "finished"])
def test_a_held_directory_is_refused_to_commands_inside_around_and_into_it(tmp_path, finished):
    """Was: a single-file command with --overwrite wrote into a running command's directory, and a claim of the
    directory around it removed its files; both exited 0 and the running command lost its report."""
    held = tmp_path / "outer" / "run"
    with output_dir(tmp_path / "outer", "pretrain") as claim:  # an earlier run around it, finished
        atomic_write_text(claim.path / "run" / "old.json", "old")
    (held / "old.json").unlink()
    proc = _holder(held, finished)
    try:
        for attempt in (lambda: claim_output_dir(tmp_path / "outer", "pretrain", overwrite=True),
                        lambda: claim_output_dir(held / "inner", "pretrain"),
                        lambda: claim_output_dir(held, "finetune glue", overwrite=True),
                        lambda: claim_output_dir(held, "Trainer", in_place=True),
                        lambda: refuse_existing_file(held / "report.json", overwrite=True),
                        lambda: refuse_existing_file(held / "model.onnx", overwrite=True)):
            with pytest.raises(BertkitError, match=rf"in use by pid {proc.pid} \(bertkit finetune glue\)"):
                attempt()
        assert (held / "report.json").read_text() == "theirs" if finished else not (held / "report.json").exists()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    time.sleep(0.1)
    if finished:
        with pytest.raises(BertkitError, match="is a file of the `bertkit finetune glue` run"):  # its file, not ours
            refuse_existing_file(held / "report.json", overwrite=True)


def test_checkpoint_rotation_and_cleanup_leave_a_users_file_in_place(tmp_path):
    """Was: `shutil.rmtree` of old checkpoints (and of finetune's checkpoints/) took a user's file with them."""
    from bertkit.training.checkpoint import save_checkpoint

    first = save_checkpoint(tmp_path, {"model": {}}, 1, keep=1)
    (first / "my-notes.txt").write_text("mine")
    second = save_checkpoint(tmp_path, {"model": {}}, 2, keep=1)
    assert (first / "my-notes.txt").read_text() == "mine" and not (first / "state.pt").exists()
    assert sorted(p.name for p in first.iterdir()) == ["my-notes.txt"]
    (second / "also-mine.txt").write_text("mine")
    assert remove_owned_tree(tmp_path / "checkpoints") == ["step-00000001/my-notes.txt",
                                                           "step-00000002/also-mine.txt"]


@pytest.mark.parametrize("where", ["a directory", "a symlink to a directory"])
def test_a_checkpoint_written_where_a_user_has_a_directory_of_its_name_keeps_their_files(tmp_path, tiny_model,
                                                                                         caplog, where):
    """Was: a resumed Trainer run wrote checkpoint-3 into the user's directory of that name (or through their symlink
    of that name) as a save adds to one, and the user's config.json there was replaced by the checkpoint's."""
    from bertkit.training.checkpoint import HF_LAYOUT, model_state, save_checkpoint

    mine = tmp_path / ("checkpoint-3" if where == "a directory" else "elsewhere")
    mine.mkdir()
    (mine / "config.json").write_text("the user's config")
    (mine / "notes.txt").write_text("the user's notes")
    if where != "a directory":
        (tmp_path / "checkpoint-3").symlink_to(mine)
    model = tiny_model()
    with caplog.at_level(logging.WARNING, logger="bertkit"):
        final = save_checkpoint(tmp_path, {"model": model_state(model)}, 3, keep=5, model=model, layout=HF_LAYOUT)
    assert json.loads((final / "config.json").read_text())["hidden_size"] == model.config.hidden_size
    assert (final / "notes.txt").read_text() == "the user's notes"
    kept = [p for p in tmp_path.glob(f"{mine.name}.replaced-*/{mine.name}/config.json")]
    assert [p.read_text() for p in kept] == ["the user's config"]
    assert f"kept in {kept[0].parent.parent}" in caplog.text and "config.json" in caplog.text


def test_create_pretraining_data_overwrite_removes_only_shards_it_can_prove(tmp_path, minilm_dir):
    """Was: overwrite=True deleted every shard-*.npy in the directory, whoever wrote it."""
    from bertkit.data.pretraining import create_pretraining_data
    from bertkit.tokenization import BertTokenizer

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(f"Sentence {i} of the first document.\nAnd another one {i}.\n\n" for i in range(20)))
    tok = BertTokenizer.from_pretrained(minilm_dir)
    out = tmp_path / "data"
    out.mkdir()
    (out / "shard-99999.input_ids.npy").write_bytes(b"the user's array")
    with pytest.raises(BertkitError, match=r"1 file\(s\) bertkit did not write there \(e.g. shard-99999.input_ids.npy"):
        create_pretraining_data([corpus], tok, out, max_seq_length=32, dupe_factor=1, num_workers=0,
                                progress=False, overwrite=True)
    assert (out / "shard-99999.input_ids.npy").read_bytes() == b"the user's array"
    (out / "shard-99999.input_ids.npy").unlink()
    create_pretraining_data([corpus], tok, out, max_seq_length=32, dupe_factor=1, num_workers=0, progress=False)
    create_pretraining_data([corpus], tok, out, max_seq_length=32, dupe_factor=1, num_workers=0, progress=False,
                            overwrite=True, seed=7)  # shards its manifest proves bertkit's: replaced


# 6. --overwrite is all or nothing; a command's lock lasts as long as its process ----------------------------------


def _classify_args(tmp_path, tiny_checkpoint) -> list[str]:
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "good", "bad", "film", "dull", "fine", "##s"]
    model = tiny_checkpoint(tmp_path / "clf", "BertForSequenceClassification", tokenizer=words, labels=["neg", "pos"],
                            num_attention_heads=2, max_position_embeddings=64)
    train = tmp_path / "train.csv"
    train.write_text("text,label\n" + "a good film,pos\ndull,neg\nfine film,pos\nbad,neg\n" * 2, encoding="utf-8")
    return ["finetune", "classify", "--model", str(model), "--train-file", str(train), "--validation-file",
            str(train), "--num-train-epochs", "1", "--batch-size", "4", "--max-seq-length", "64", "--no-progress",
            "--device", "cpu"]


def _snapshot(directory) -> dict[str, bytes]:
    return {p.relative_to(directory).as_posix(): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def test_overwrite_refused_for_a_users_note_removes_nothing(tmp_path, tiny_checkpoint, capsys):
    """Was: `finetune classify --overwrite` removed the earlier run's best/ model and report, then refused because
    of a note the user had added: neither the old model nor a new one was left."""
    out = tmp_path / "out"
    args = [*_classify_args(tmp_path, tiny_checkpoint), "--output-dir", str(out)]
    assert main(args) == 0
    (out / "notes.txt").write_text("the user's note")
    before = _snapshot(out)
    assert "best/model.safetensors" in before and "report.json" in before
    assert main(args) == 2  # was: "pass --overwrite to replace it", advice refused for the note
    err = capsys.readouterr().err
    assert "bertkit did not write there (e.g. notes.txt)" in err and "pass --overwrite" not in err
    assert main([*args, "--overwrite"]) == 2
    err = capsys.readouterr().err
    assert "remain (e.g. notes.txt)" in err and "nothing was removed" in err
    assert _snapshot(out) == before  # the earlier model, its report and the note, byte for byte
    (out / "notes.txt").unlink()
    assert main([*args, "--overwrite"]) == 0  # only bertkit's files there: replaced by the new run's
    assert json.loads((out / "report.json").read_text())["best"] is not None


def _wait_for(path, proc, what: str, timeout: float = 300.0) -> None:
    deadline = time.time() + timeout
    while not path.exists():
        assert proc.poll() is None, f"{what} ended early: {proc.stderr.read()[-3000:] if proc.stderr else ''}"
        assert time.time() < deadline, f"no {what} within {timeout:.0f} s"
        time.sleep(0.05)


def _refused_while_held(out, cli_args, proc, capsys, owner: int) -> None:
    assert main(cli_args) == 2
    assert f"in use by pid {owner} (bertkit " in capsys.readouterr().err
    assert proc.poll() is None  # still there: the refusal is not a race the holder lost by exiting


def test_a_commands_lock_holds_until_its_process_exits(tmp_path, tiny_checkpoint, tiny_pretraining_data, capsys):
    """Was: the lock was dropped when the run's work ended, while its process (printing its result, tearing down
    torch) was still there: a second `finetune classify --overwrite` or `pretrain --overwrite` was accepted, and
    the first run ended without its report.json."""
    out, ready = tmp_path / "out", tmp_path / "ready"
    args = [*_classify_args(tmp_path, tiny_checkpoint), "--output-dir", str(out)]
    holder = subprocess.Popen(
        [sys.executable, "-c", "import pathlib, sys, time; from bertkit.cli import main; code = main(sys.argv[2:]);"
         "pathlib.Path(sys.argv[1]).write_text(str(code)); time.sleep(120)", str(ready), *args],
        env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(ready, holder, "the first finetune classify")
        assert ready.read_text() == "0"
        before = _snapshot(out)
        data = tiny_pretraining_data
        for second in ([*args, "--overwrite"],
                       ["pretrain", "--data", str(data / "data"), "--vocab", str(data / "vocab"), "--config-name",
                        "tiny", "--output-dir", str(out), "--overwrite", "--max-steps", "1", "--no-progress"]):
            _refused_while_held(out, second, holder, capsys, holder.pid)
        assert _snapshot(out) == before and "report.json" in before
    finally:
        holder.kill()
        holder.wait()
    assert main([*args, "--overwrite"]) == 0  # the kernel dropped the lock with its process



def test_a_lock_held_until_exit_leaves_no_unclosed_file_behind(tmp_path):
    """Was: the held lock was a file object, reported at exit as "ResourceWarning: unclosed file" under ``-X dev``
    (and by pytest's unraisable-exception check): a raw descriptor holds it now, closed by the kernel."""
    code = ("import pathlib, sys; from bertkit import dir_lock; d = pathlib.Path(sys.argv[1]); "
            "dir_lock.lock(d, 'save'); dir_lock.keep(d); assert dir_lock.holder_command(d) == 'save'")
    done = subprocess.run([sys.executable, "-X", "dev", "-c", code, str(tmp_path)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert "ResourceWarning" not in done.stderr
    assert (tmp_path / LOCK).read_text().startswith("pid ") and "(bertkit save)" in (tmp_path / LOCK).read_text()

_TORCHRUN_HOLDER = """
import pathlib, sys, time
from bertkit.cli import main
from bertkit._parallel import info_from_env
code = main(sys.argv[2:])
if info_from_env().rank == 0:  # the job is still there: rank 0 tearing down, torchrun waiting for it
    pathlib.Path(sys.argv[1]).write_text(str(code))
    time.sleep(120)
"""


@pytest.mark.slow  # long; in make test-slow (make test stays under 5 minutes)
def test_a_torchrun_jobs_lock_holds_until_rank_0_exits(tmp_path, tiny_pretraining_data, capsys):
    """Was: a second `torchrun ... pretrain --overwrite` (or one process) into a running torchrun pretrain's
    directory was accepted once rank 0 had left the claim, while the job was still running."""
    from launch_helpers import LAUNCHER

    data, out, ready = tiny_pretraining_data, tmp_path / "out", tmp_path / "ready"
    script = tmp_path / "holder.py"
    script.write_text(_TORCHRUN_HOLDER)
    args = ["pretrain", "--data", str(data / "data"), "--vocab", str(data / "vocab"), "--config-name", "tiny",
            "--output-dir", str(out), "--max-steps", "2", "--batch-size", "8", "--no-progress", "--device", "cpu"]
    job = subprocess.Popen([*LAUNCHER, str(script), str(ready), *args], stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, text=True, start_new_session=True,
                           env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        _wait_for(ready, job, "the torchrun pretrain")
        assert ready.read_text() == "0"
        held = (out / LOCK).read_text()
        assert held.startswith("pid ") and held.endswith(" (bertkit pretrain)"), held  # rank 0 still holds it
        owner = int(held.split()[1])
        before = _snapshot(out)
        _refused_while_held(out, [*args, "--overwrite"], job, capsys, owner)
        assert _snapshot(out) == before and "final/model.safetensors" in before
    finally:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait()


_SLOW_START = """
import pathlib, sys, time
import bertkit.cli as cli

waiting, go = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
resolve = cli._resolve_device

def slow(*args):  # as a busy machine: seconds between the command's start and its claim
    waiting.touch()
    while not go.exists():
        time.sleep(0.02)
    return resolve(*args)

cli._resolve_device = slow
sys.exit(cli.main(sys.argv[3:]))
"""


@pytest.mark.slow  # long; in make test-slow (make test stays under 5 minutes)
def test_a_command_started_while_another_runs_is_refused_however_late_it_would_claim(tmp_path, tiny_checkpoint):
    """Was: the lock was taken only after start-up (torch's import, the device: 15 s on a busy machine), so a
    second `finetune classify --overwrite` started while the first ran reached its claim after the first had
    finished, and removed its model and report."""
    out, ready, leave, waiting, go = (tmp_path / n for n in ("out", "ready", "leave", "waiting", "go"))
    args = [*_classify_args(tmp_path, tiny_checkpoint), "--output-dir", str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    first = subprocess.Popen(
        [sys.executable, "-c", "import pathlib, sys, time; from bertkit.cli import main; code = main(sys.argv[3:]);"
         "pathlib.Path(sys.argv[1]).write_text(str(code));\nwhile not pathlib.Path(sys.argv[2]).exists(): "
         "time.sleep(0.02)", str(ready), str(leave), *args], env=env, stderr=subprocess.PIPE, text=True)
    second = None
    try:
        _wait_for(ready, first, "the first finetune classify")
        before = _snapshot(out)
        second = subprocess.Popen([sys.executable, "-c", _SLOW_START, str(waiting), str(go), *args, "--overwrite"],
                                  env=env, stderr=subprocess.PIPE, text=True)
        deadline = time.time() + 300
        while second.poll() is None and not waiting.exists():  # refused at once, or on its way to the claim
            assert time.time() < deadline
            time.sleep(0.02)
        leave.touch()  # the first ends while the second is still starting
        first.wait(timeout=60)
        go.touch()
        _, err = second.communicate(timeout=300)
        assert second.returncode == 2, err[-2000:]
        assert f"in use by pid {first.pid} (bertkit finetune classify)" in err
        assert _snapshot(out) == before
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()


# 7. One claim of a directory per process; a record proves a file by its bytes only -----------------------------------


@pytest.mark.parametrize("first_in_place", [False, True], ids=["staged", "in-place"])
def test_a_directory_this_process_has_claimed_is_not_claimed_again(tmp_path, first_in_place):
    """Two claims of one directory in one process would write one run over the other; the lock is this process's,
    so the refusal is the claim's. Once the first has finished, the directory may be claimed again."""
    command = "Trainer" if first_in_place else "pretrain"
    with output_dir(tmp_path, command, in_place=first_in_place) as claim:
        atomic_write_text(claim.path / "metrics.jsonl", "{}\n")
        for in_place in (False, True):
            with pytest.raises(BertkitError, match=f"output directory of this process's `bertkit {command}` run "
                                                   "already"):
                claim_output_dir(tmp_path, "Trainer" if in_place else "pretrain", resume=True, in_place=in_place)
        lock = tmp_path / LOCK if first_in_place else staging_dir_of(tmp_path) / LOCK
        assert lock.read_text().endswith(f"(bertkit {command})")  # the first claim's lock is kept
    if not first_in_place:
        assert sorted(json.loads((tmp_path / MARKER).read_text())["files"]) == ["metrics.jsonl"]
        with output_dir(tmp_path, command, resume=True, keep_lock=True):
            pass
        with output_dir(tmp_path, command, resume=True):  # a finished run's kept lock: this process may go on
            pass


def test_a_received_marker_naming_a_files_inode_and_size_proves_nothing(tmp_path):
    """Only a sha256 of the bytes proves a recorded file: a marker copying a user's file's identity (device, inode,
    size, mtime) with another sha256 is not taken for this process's record of its own writes."""
    (tmp_path / "notes.txt").write_text("mine")
    st = os.lstat(tmp_path / "notes.txt")
    forged = {"size": st.st_size, "sha256": "0" * 64, "id": [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns]}
    (tmp_path / MARKER).write_text(json.dumps({"command": "pretrain", "finished": True, "cwd": str(tmp_path),
                                               "files": {"notes.txt": forged}}))
    with pytest.raises(BertkitError, match=r"1 of them written by that run but changed since"):
        claim_output_dir(tmp_path, "pretrain", overwrite=True)
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_a_save_into_a_directory_with_a_manifest_it_cannot_read_keeps_everything_and_finishes(tmp_path, tiny_model):
    """Was: `save_pretrained` into a run directory holding another version's manifest swapped the new model in, then
    failed reading that manifest ("... removes none"): an error for a save that had happened, the staging directory
    and the lock file left, and every later save of the directory in the process refused as "this process's run"."""
    import torch

    from bertkit import BertModel

    out = tmp_path / "run"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    (out / "report.json").write_text("an earlier run's report")
    foreign = json.dumps({"format": 99, "files": ["report.json"]})  # another version's: bertkit cannot read it
    (out / MARKER).write_text(foreign)
    model = tiny_model()
    for _ in range(2):  # the second: the directory is not held, nor left half-written, by the first
        model.save_pretrained(out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]
    assert sorted(p.name for p in out.iterdir()) == [MARKER, "config.json", "model.safetensors", "notes.txt",
                                                     "report.json"]
    assert (out / "notes.txt").read_text() == "mine" and (out / MARKER).read_text() == foreign
    assert (out / "report.json").read_text() == "an earlier run's report"
    loaded = BertModel.from_pretrained(out).state_dict()
    assert all(torch.equal(loaded[k], v) for k, v in model.state_dict().items())


@pytest.mark.parametrize("where", ["a file", "a symlink to nowhere", "an empty string"])
@pytest.mark.parametrize("save", ["BertModel.save_pretrained", "BertTokenizer.save_pretrained",
                                  "SentenceTransformer.save", "CrossEncoder.save"])
def test_a_save_to_a_path_that_is_no_directory_is_refused_naming_it(tmp_path, tiny_checkpoint, save, where,
                                                                    monkeypatch):
    """Was: every save but the model's failed renaming its staging directory over the path ("[Errno 20] Not a
    directory: '.out.bertkit-staging' -> 'out'"), and the model's named a dangling symlink that too; an empty string
    (Path("") is ".") saved into the working directory, where transformers' save_pretrained fails."""
    from bertkit import BertModel, BertTokenizer
    from bertkit.sentence import CrossEncoder, SentenceTransformer

    model_dir = tiny_checkpoint(tmp_path / "model", "BertForSequenceClassification", labels=["no", "yes"],
                                tokenizer=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "film"])
    writer = {"BertModel.save_pretrained": lambda: BertModel.from_pretrained(model_dir).save_pretrained,
              "BertTokenizer.save_pretrained": lambda: BertTokenizer.from_pretrained(model_dir).save_pretrained,
              "SentenceTransformer.save": lambda: SentenceTransformer(str(model_dir)).save,
              "CrossEncoder.save": lambda: CrossEncoder(str(model_dir)).save}[save]()
    out = tmp_path / "out"
    if where == "an empty string":
        monkeypatch.chdir(tmp_path)
        with pytest.raises(BertkitError, match="the directory to save into is an empty string"):
            writer("")
        assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]
        return
    if where == "a file":
        out.write_text("the user's results")
    else:
        out.symlink_to(tmp_path / "nowhere")
    with pytest.raises(BertkitError, match=f"{out} is {where}, not a directory: .*pass the path of a directory"):
        writer(out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model", "out"]
    assert out.read_text() == "the user's results" if where == "a file" else not out.exists() and out.is_symlink()


@pytest.mark.parametrize("overwrite", [False, True])
def test_an_output_file_that_is_a_directory_is_named_as_one_with_or_without_overwrite(tmp_path, overwrite):
    """Was: without --overwrite, "out already exists; pass --overwrite to replace it", advice that then failed."""
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "notes.txt").write_text("the user's")
    with pytest.raises(BertkitError, match=f"^{tmp_path / 'out'} is a directory; give the path of the file to write"):
        refuse_existing_file(tmp_path / "out", overwrite)
    assert (tmp_path / "out" / "notes.txt").read_text() == "the user's"


def test_an_output_file_below_a_file_is_refused_naming_it(tmp_path, capsys, minilm_dir):
    """Was: `extract-features --out notes.txt/features.jsonl` (and export onnx, predict) failed "error: File exists:
    .../notes.txt", mkdir's words for a file where a directory is to be. Now refused up front, naming both."""
    texts = tmp_path / "texts.txt"
    texts.write_text("a sentence\n")
    assert main(["extract-features", "--model", str(minilm_dir), "--input", str(texts), "--out",
                 str(texts / "features.jsonl"), "--no-progress"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith(
        f"{texts / 'features.jsonl'} cannot be made: {texts} is a file, not a directory; an output file is made in a "
        "directory: pass a path inside a directory")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["texts.txt"] and texts.read_text() == "a sentence\n"


def test_a_symlink_to_nowhere_at_an_output_name_is_not_replaced_without_overwrite(tmp_path, capsys):
    """Was: a dangling symlink does not exist() to Python, so `predict --output-file link` replaced the user's link
    unasked; and `--output-dir link` called it a file."""
    (tmp_path / "link").symlink_to(tmp_path / "results-to-come.jsonl")
    with pytest.raises(BertkitError, match="link already exists; pass --overwrite to replace it"):
        refuse_existing_file(tmp_path / "link", overwrite=False)
    refuse_existing_file(tmp_path / "link", overwrite=True)  # replaced, as a link is: never written through
    (tmp_path / "corpus.txt").write_text("a film\n")
    assert main(["train-tokenizer", str(tmp_path / "corpus.txt"), "--output-dir", str(tmp_path / "link")]) == 2
    assert "link is a symlink to nowhere; the output must be a directory" in capsys.readouterr().err
    assert os.readlink(tmp_path / "link") == str(tmp_path / "results-to-come.jsonl")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus.txt", "link"]


def test_the_demo_names_the_directory_it_leaves_not_its_staging_name(tmp_path, monkeypatch, capsys):
    """`bertkit demo` writes into its output directory's staging directory and moves it into place when it
    finishes; its last line named the staging directory ("Everything is in .../.demo.bertkit-staging"), which is
    gone by then. The stages are replaced by stand-ins here (the whole demo takes minutes)."""
    import bertkit
    import bertkit.demo as demo

    monkeypatch.setattr(demo, "build_corpus", lambda out: {"documents": 0})
    monkeypatch.setattr(demo, "_vocabulary_stage", lambda out, *a: (None, out / "vocab", 0))
    monkeypatch.setattr(demo, "_instances_stage", lambda *a: None)
    monkeypatch.setattr(demo, "_pretraining_stage", lambda out, *a: (None, out / "pretrain", []))
    monkeypatch.setattr(demo, "_finetuning_stage", lambda *a: {})
    monkeypatch.setattr(bertkit, "pipeline", lambda *a, **k: lambda text, top_k: [])
    out = tmp_path / "demo"
    assert main(["demo", "--output-dir", str(out), "--no-progress"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.endswith(f"Everything is in {out} (demo.json, pretrain/metrics.png).")
    assert json.loads((out / "demo.json").read_text())["fill_mask"]


def test_a_file_the_user_saves_anew_or_removes_while_a_save_swaps_stays_as_they_left_it(tmp_path, tiny_model,
                                                                                        monkeypatch):
    """A save into a directory links the user's other files into the new one, then swaps the two. Was: a file the
    user saved meanwhile the way editors save (a new file renamed over its name) was removed with the replaced
    directory and the link to its earlier content kept, and a file the user removed meanwhile came back. Now the
    new directory holds each as the user left it."""
    from bertkit import dir_swap

    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("v1")
    (out / "sub").mkdir()
    (out / "sub" / "draft.txt").write_text("remove me")
    (out / "kept.txt").write_text("as it was")
    exchange = dir_swap._exchange

    def user_edits_then_exchange(a, b):
        (b / ".notes.txt.swp").write_text("v2")
        os.replace(b / ".notes.txt.swp", b / "notes.txt")
        (b / "sub" / "draft.txt").unlink()
        (b / "late.txt").write_text("new")
        exchange(a, b)

    monkeypatch.setattr(dir_swap, "_exchange", user_edits_then_exchange)
    tiny_model(seed=1, vocab_size=16).save_pretrained(out)
    files = {p.relative_to(out).as_posix(): p for p in out.rglob("*") if p.is_file()}
    assert sorted(files) == ["config.json", "kept.txt", "late.txt", "model.safetensors", "notes.txt"]
    assert [files[n].read_text() for n in ("notes.txt", "kept.txt", "late.txt")] == ["v2", "as it was", "new"]
    assert sorted(os.listdir(tmp_path)) == ["out"]


def test_a_users_file_where_a_save_makes_a_directory_is_kept_beside_it(tmp_path, caplog):
    """Was: a file of the user's named as a directory the save makes (``1_Pooling``, which SentenceTransformer.save
    writes) was removed with the replaced directory, without a word: a save replaces the user's files it writes
    anew (as transformers' does), and this was none of them. sentence-transformers' save stops there ("File
    exists"); bertkit's finishes and keeps the file beside the directory, named in the warning, as it keeps a
    directory of the user's at the name of a file it writes."""
    from bertkit.staging import staged

    out = tmp_path / "out"
    out.mkdir()
    (out / "1_Pooling").write_text("the user's file")
    (out / "modules.json").write_text("the user's modules")
    with caplog.at_level(logging.WARNING, logger="bertkit"), staged(out) as stage:
        (stage / "1_Pooling").mkdir()
        (stage / "1_Pooling" / "config.json").write_text("{}")
        (stage / "modules.json").write_text("[]")
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*")) == ["1_Pooling", "1_Pooling/config.json",
                                                                             "modules.json"]
    assert (out / "modules.json").read_text() == "[]"  # a file it writes anew replaces the user's, as transformers'
    [kept] = [p for p in tmp_path.iterdir() if p.name.startswith("out.replaced-")]
    assert (kept / "out" / "1_Pooling").read_text() == "the user's file"
    assert f"were kept in {kept} (e.g. 1_Pooling)" in caplog.text
