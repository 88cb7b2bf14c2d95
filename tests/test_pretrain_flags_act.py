"""Every `bertkit pretrain` setting acts: a tiny run, then the same run with one setting changed to a value that must
matter on that input, and its outputs (final weights, metrics.jsonl, summary.json) compared. A setting whose run is
the base run's, byte for byte, was dropped without a word (`--eval-strategy steps` without `--eval-data` was); each
one here either changes what it must, leaves alone what it must not touch, or is refused naming itself and the
fix."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from bertkit.cli import main

pytestmark = pytest.mark.slow  # about 30 s for the sweep: a tiny model's 4 steps, twice for each setting

STEADY = ("seqs_per_s", "tokens_per_s")  # timings: the only numbers two equal runs may differ in

CHANGE, SAME = "change", "same"
# (the setting's flags, what it must do: change the weights or the records, or leave the weights as they are)
SWEEP = [
    (["--lr", "1e-2"], CHANGE), (["--seed", "7"], CHANGE), (["--warmup-steps", "2"], CHANGE),
    (["--lr-scheduler-type", "constant"], CHANGE), (["--weight-decay", "0.5"], CHANGE),
    (["--adam-beta1", "0.5"], CHANGE), (["--max-grad-norm", "0.01"], CHANGE),
    (["--gradient-accumulation-steps", "2"], CHANGE), (["--no-nsp"], CHANGE),
    (["--mlm-bias-init", "unigram"], CHANGE), (["--position-init", "sinusoidal"], CHANGE),
    (["--logging-steps", "1"], CHANGE), (["--eval-data", "{data}"], CHANGE),
    (["--dataloader-num-workers", "1"], SAME), (["--gradient-checkpointing"], SAME), (["--skip-nonfinite", "2"], SAME),
]
REFUSED = [  # settings of evaluations that, without --eval-data, never happen
    (["--eval-strategy", "steps"], "--eval-strategy steps sets when or how the held-out instances of --eval-data are "
     "scored: add --eval-data, or drop --eval-strategy"),
    (["--eval-steps", "2"], "--eval-steps 2.0 sets when or how"),
    (["--eval-instances", "8"], "--eval-instances 8 sets when or how"),
]


def _outputs(out: Path) -> dict[str, str]:
    weights = hashlib.sha256((out / "final" / "model.safetensors").read_bytes()).hexdigest()
    records = [{k: v for k, v in json.loads(line).items() if k not in STEADY}
               for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {"weights": weights, "records": json.dumps(records, sort_keys=True),
            "summary": (out / "summary.json").read_text()}


def _run(data: Path, vocab: Path, out: Path, extra: list[str]) -> int:
    shutil.rmtree(out, ignore_errors=True)
    extra = [a.replace("{data}", str(data)) for a in extra]
    return main(["pretrain", "--data", str(data), "--vocab", str(vocab), "--out", str(out), "--max-steps", "4",
                 "--batch-size", "4", "--config-name", "tiny", "--no-progress", *extra])


@pytest.fixture(scope="module")
def base_run(tiny_pretraining_data, tmp_path_factory):
    data, vocab = tiny_pretraining_data / "data", tiny_pretraining_data / "vocab"
    out = tmp_path_factory.mktemp("flags") / "base"
    assert _run(data, vocab, out, []) == 0
    return data, vocab, _outputs(out)


@pytest.mark.parametrize("extra,expect", SWEEP, ids=[" ".join(s[0]) for s in SWEEP])
def test_a_pretrain_setting_changes_what_it_must_and_only_that(extra, expect, base_run, tmp_path):
    data, vocab, base = base_run
    assert _run(data, vocab, tmp_path / "run", extra) == 0
    got = _outputs(tmp_path / "run")
    if expect == CHANGE:
        assert got != base, f"{' '.join(extra)} changed nothing: the run is the base run's"
    else:  # how the run is carried out, not what it learns
        assert got["weights"] == base["weights"], f"{' '.join(extra)} changed the weights"


@pytest.mark.parametrize("extra,message", REFUSED, ids=[r[0][0] for r in REFUSED])
def test_a_pretrain_evaluation_setting_without_eval_data_is_refused(extra, message, base_run, tmp_path, capsys):
    data, vocab, _ = base_run
    assert _run(data, vocab, tmp_path / "run", extra) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
