"""A training run's log (metrics.jsonl and TensorBoard events): in a staged run all of it is bertkit's; in a run written
in place (the Trainer's) each is recorded as bertkit's once, when it starts, so a killed run's log is still provably
its own, and nothing is recorded again per record."""

from __future__ import annotations

import json
import sys
import types

import pytest

from bertkit.manifests import owns
from bertkit.outputs import MARKER
from bertkit.runs import output_dir
from bertkit.training.run_log import RunLog


def test_a_run_in_places_metrics_and_tensorboard_events_are_recorded_once(tmp_path, monkeypatch):
    pytest.importorskip("tensorboard")
    # tensorboard writes its event files through TensorFlow where TensorFlow is installed (the slow reference tests
    # install it), and through its own stand-in where a module tensorboard.compat.notf exists: the same file, without
    # importing TensorFlow (3.8 s of this test's 4.9). Once chosen, the choice holds for the process.
    monkeypatch.setitem(sys.modules, "tensorboard.compat.notf", types.ModuleType("tensorboard.compat.notf"))
    with output_dir(tmp_path, "Trainer", in_place=True):
        log = RunLog(tmp_path, writes=True)
        log.start()
        log.open_tensorboard()
        recorded = json.loads((tmp_path / MARKER).read_text())["files"]
        for step in (1, 2, 3):
            log.write({"split": "train", "step": step, "epoch": 0, "loss": 1.0 / step})
        log.close()
    events = list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    assert len(events) == 1 and events[0].stat().st_size > 0
    assert sorted(recorded) == ["metrics.jsonl", f"tensorboard/{events[0].name}"]
    assert json.loads((tmp_path / MARKER).read_text())["files"] == recorded  # once each, not per record
    assert owns(tmp_path / "metrics.jsonl") and owns(events[0])  # grown since, from the recorded start


def test_resume_keeps_the_records_up_to_the_checkpoint_and_drops_a_torn_last_line(tmp_path):
    with output_dir(tmp_path, "pretrain") as claim:
        log = RunLog(claim.path, writes=True)
        log.start()
        for step in (1, 2, 3):
            log.write({"split": "train", "step": step, "loss": 0.5})
        with open(claim.path / "metrics.jsonl", "a") as f:
            f.write('{"split": "train", "st')  # a kill mid-append
    with output_dir(tmp_path, "pretrain", resume=True) as claim:
        log = RunLog(claim.path, writes=True)
        log.resume(2)
        assert [r["step"] for r in log.history] == [1, 2]
        assert [json.loads(x)["step"] for x in (claim.path / "metrics.jsonl").read_text().splitlines()] == [1, 2]
        assert (tmp_path / "metrics.jsonl").read_text().count("\n") == 3  # the finished run's, until this one is
    assert [json.loads(x)["step"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [1, 2]


def test_a_symlink_put_in_place_of_metrics_during_a_run_is_not_written_through(tmp_path):
    """A link swapped in for metrics.jsonl mid-run: the next record is refused naming the file, and the file the link
    points to (the user's) keeps its bytes; the run had appended to it."""
    from bertkit.errors import BertkitError

    out, theirs = tmp_path / "run", tmp_path / "notes.txt"
    out.mkdir()
    theirs.write_text("the user's notes\n")
    with output_dir(out, "Trainer", in_place=True):
        log = RunLog(out, writes=True)
        log.start()
        log.write({"split": "train", "step": 1, "epoch": 0, "loss": 1.0})
        (out / "metrics.jsonl").unlink()
        (out / "metrics.jsonl").symlink_to(theirs)
        with pytest.raises(BertkitError, match="metrics.jsonl is no longer the file this run writes"):
            log.write({"split": "train", "step": 2, "epoch": 0, "loss": 0.5})
    assert theirs.read_text() == "the user's notes\n"
    assert [r["step"] for r in log.history] == [1, 2]  # kept in memory for the summary
