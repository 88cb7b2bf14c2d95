"""A training run's log (metrics.jsonl and TensorBoard events) is recorded as bertkit's once, when it starts: what
the run appends afterwards is its own too, so a killed run's log is removed by --overwrite, and nothing is
recorded again per record."""

from __future__ import annotations

import json

import pytest

from bertkit.outputs import _ACTIVE, JOURNAL, claim_output_dir, output_dir
from bertkit.training.run_log import RunLog


def test_a_killed_runs_metrics_and_tensorboard_events_are_recorded_once_and_removed_by_overwrite(tmp_path):
    pytest.importorskip("tensorboard")
    claim = claim_output_dir(tmp_path, "pretrain")
    log = RunLog(tmp_path, writes=True)
    log.start()
    log.open_tensorboard()
    for step in (1, 2, 3):
        log.write({"split": "train", "step": step, "epoch": 0, "loss": 1.0 / step})
    events = list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    assert len(events) == 1 and events[0].stat().st_size > 0
    recorded = [json.loads(line)["path"] for line in (tmp_path / JOURNAL).read_text().splitlines()]
    assert sorted(recorded) == ["metrics.jsonl", f"tensorboard/{events[0].name}"]  # once each, not per record
    log.close()  # its writer thread stopped; the claim is never released: as if SIGKILLed after the last record
    _ACTIVE.remove(claim)
    claim.lock.close()
    with output_dir(tmp_path, "pretrain", overwrite=True):
        assert not (tmp_path / "metrics.jsonl").exists() and not (tmp_path / "tensorboard").exists()


def test_resume_keeps_the_records_up_to_the_checkpoint_and_drops_a_torn_last_line(tmp_path):
    with output_dir(tmp_path, "pretrain"):
        log = RunLog(tmp_path, writes=True)
        log.start()
        for step in (1, 2, 3):
            log.write({"split": "train", "step": step, "loss": 0.5})
        with open(tmp_path / "metrics.jsonl", "a") as f:
            f.write('{"split": "train", "st')  # a kill mid-append
    with output_dir(tmp_path, "pretrain", resume=True):
        log = RunLog(tmp_path, writes=True)
        log.resume(2)
        assert [r["step"] for r in log.history] == [1, 2]
        assert [json.loads(x)["step"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [1, 2]
