"""The paper's two-phase pre-training (``--phase2-data``, appendix A.2): a run stopped in phase 1, exactly at
the switch, or in phase 2 and then resumed ends with the uninterrupted run's losses and weights, bit for bit;
and phase 2 really trains on the longer instances.

The runs are tiny: 10 steps of 8 sequences, steps 1-6 on 32-token instances and 7-10 on 64-token ones
(``phase1_fraction`` 0.6), a checkpoint every 2 steps.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from cases import slow_after

MAX_STEPS, SWITCH, SAVE_STEPS = 10, 6, 2  # SWITCH: the last step of phase 1 (0.6 x 10)
PHASES = ["phase1-32"] * SWITCH + ["phase2-64"] * (MAX_STEPS - SWITCH)


@pytest.fixture(scope="module")
def two_lengths(tiny_pretraining_data, tmp_path_factory) -> Path:
    """A 1,500-entry vocabulary and the same text made into 32-token (conftest.py's) and 64-token instances."""
    import shutil

    from bertkit.data.pretraining import create_pretraining_data
    from bertkit.tokenization import BertTokenizer

    shared, root = tiny_pretraining_data, tmp_path_factory.mktemp("phases")
    shutil.copytree(shared / "vocab", root / "vocab")
    shutil.copytree(shared / "data", root / "data32")
    tok = BertTokenizer.from_pretrained(root / "vocab")
    create_pretraining_data([shared / "corpus" / "train.txt"], tok, root / "data64", max_seq_length=64,
                            max_predictions_per_seq=5, dupe_factor=1, input_format="sentences", seed=3,
                            num_workers=1, progress=False)
    # a phase-1 data set a few batches long, from the first three documents: for an epoch ending at the switch
    documents = (shared / "corpus" / "train.txt").read_text().split("\n\n")
    (root / "short.txt").write_text("\n\n".join(documents[:3]) + "\n")
    create_pretraining_data([root / "short.txt"], tok, root / "short32", max_seq_length=32, max_predictions_per_seq=5,
                            dupe_factor=1, input_format="sentences", seed=3, num_workers=1, progress=False)
    # the same, its masks drawn at load time (--masking dynamic): the data a --dynamic-masking-seed seeds
    create_pretraining_data([root / "short.txt"], tok, root / "dynamic32", max_seq_length=32,
                            max_predictions_per_seq=5, dupe_factor=1, input_format="sentences", seed=3, num_workers=1,
                            progress=False, masking="dynamic")
    return root


def _settings(root: Path, out: Path, **kw):
    from bertkit.settings import PretrainSettings

    base = dict(data=root / "data32", phase2_data=root / "data64", phase1_fraction=SWITCH / MAX_STEPS,
                vocab=root / "vocab", config_name="tiny", output_dir=out, max_steps=MAX_STEPS, save_steps=SAVE_STEPS,
                logging_steps=1, batch_size=8, learning_rate=1e-3, progress=False)
    return PretrainSettings(**{**base, **kw})


class Stopped(Exception):
    """Raised right after a chosen checkpoint is on disk: the run stops there, as if killed."""


def _stop_after_checkpoint(monkeypatch, step: int) -> None:
    from bertkit.training import loop

    real = loop.save_checkpoint

    def save_then_stop(out_dir, state, at, *args, **kwargs):
        path = real(out_dir, state, at, *args, **kwargs)
        if at == step:
            raise Stopped(path)
        return path

    monkeypatch.setattr(loop, "save_checkpoint", save_then_stop)


def _stop_in_step(monkeypatch, step: int) -> None:
    """Stop inside optimiser step ``step``, before its update (between checkpoints)."""
    from bertkit.training import loop

    real, calls = loop._clip_grad_norm, []

    def clip_then_stop(*args, **kwargs):
        calls.append(None)  # once per optimiser step
        if len(calls) == step:
            raise Stopped(f"in step {step}")
        return real(*args, **kwargs)

    monkeypatch.setattr(loop, "_clip_grad_norm", clip_then_stop)


def _record_batches(monkeypatch) -> list[tuple[int, int]]:
    """Every forward pass's (sequence length, real tokens) during training, in order."""
    from bertkit.heads import BertForPreTraining

    seen, real = [], BertForPreTraining.forward

    def forward(self, input_ids, *args, attention_mask=None, **kwargs):
        if self.training:
            seen.append((input_ids.shape[1], int(attention_mask.sum())))
        return real(self, input_ids, *args, attention_mask=attention_mask, **kwargs)

    monkeypatch.setattr(BertForPreTraining, "forward", forward)
    return seen


def _rows(out: Path) -> list[dict]:
    """metrics.jsonl's records without the timings (which differ from run to run)."""
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.endswith("_per_s")} for r in rows]


def _train_rows(out: Path) -> list[dict]:
    return [r for r in _rows(out) if r["split"] == "train"]


def _weights(out: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(out / "final" / "model.safetensors")


@pytest.fixture(scope="module")
def uninterrupted(two_lengths, tmp_path_factory) -> tuple[Path, list[tuple[int, int]]]:
    """The reference run, and the (length, tokens) of each batch it trained on."""
    from bertkit.training.pretrain import pretrain

    out = tmp_path_factory.mktemp("uninterrupted") / "run"
    with pytest.MonkeyPatch.context() as mp:
        seen = _record_batches(mp)
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            pretrain(_settings(two_lengths, out))
        finally:
            torch.set_num_threads(threads)
    return out, seen


# at the switch in make test-slow: make test keeps test_the_command_line_two_phase_run_stopped_at_the_switch_resumes_exactly
@pytest.mark.parametrize("stop", [4, pytest.param(SWITCH, marks=pytest.mark.slow), pytest.param(8, marks=pytest.mark.slow)],
                         ids=["in-phase-1", "at-the-switch", "in-phase-2"])
def test_a_two_phase_run_stopped_and_resumed_matches_the_uninterrupted_one(two_lengths, uninterrupted, tmp_path,
                                                                         monkeypatch, caplog, one_thread, stop):
    from bertkit.training.pretrain import pretrain

    reference, _ = uninterrupted
    out = tmp_path / "run"
    with monkeypatch.context() as mp:
        _stop_after_checkpoint(mp, stop)
        with pytest.raises(Stopped):
            pretrain(_settings(two_lengths, out))
    assert [r["step"] for r in _train_rows(out)] == list(range(1, stop + 1))

    seen = _record_batches(monkeypatch)
    with caplog.at_level("INFO", logger="bertkit"):
        result = pretrain(_settings(two_lengths, out, resume=True))
    assert f"step-{stop:08d} (step {stop} of {MAX_STEPS})" in caplog.text  # resumed from the stop, not earlier
    assert result.step == MAX_STEPS
    assert len(seen) == MAX_STEPS - stop  # one batch per remaining step: none repeated, none skipped

    rows = _train_rows(out)
    assert rows == _train_rows(reference)  # every step's loss, accuracies, lr, epoch and phase, exactly
    assert [r["phase"] for r in rows] == PHASES
    ref, resumed = _weights(reference), _weights(out)
    assert ref.keys() == resumed.keys()
    assert all(torch.equal(resumed[k], ref[k]) for k in ref)  # bit for bit


@pytest.mark.parametrize("changed", [{"phase1_fraction": 0.3}, {"dynamic_masking_seed": 5}])
def test_resuming_with_another_phase_split_or_masking_seed_is_refused(two_lengths, tmp_path, monkeypatch, one_thread,
                                                                     changed):
    """Was: ``pretrain(resume=True)`` continued a checkpoint of another phase1_fraction under the new split (stopped
    at step 4 of 6 + 4, resumed with 3 + 7: steps 5-10 in phase 2, a run neither setting gives), or of another
    dynamic-masking seed (other masks, on data made with --masking dynamic); the command line's run marker refused
    both, the checkpoint did not."""
    from bertkit.errors import BertkitError
    from bertkit.training.pretrain import pretrain

    out = tmp_path / "run"
    (name, value), = changed.items()
    data = {"data": two_lengths / "dynamic32"} if name == "dynamic_masking_seed" else {}  # a seed seeds dynamic masks
    with monkeypatch.context() as mp:
        _stop_after_checkpoint(mp, 4)
        with pytest.raises(Stopped):
            pretrain(_settings(two_lengths, out, **data))
    before = getattr(_settings(two_lengths, out), name)
    with pytest.raises(BertkitError, match=rf"other settings or data .*'{name}': \({before}, {value}\)"):
        pretrain(_settings(two_lengths, out, resume=True, **data, **changed))
    assert [r["step"] for r in _train_rows(out)] == [1, 2, 3, 4]  # refused before a step


def test_phase_2_trains_on_the_longer_instances(two_lengths, uninterrupted):
    """The batches each phase trained on, recomputed from its own data: 32-token instances for steps 1-6,
    64-token ones for steps 7-10, in the data order of each phase's first epoch."""
    from bertkit.data.dataset import PretrainingDataset
    from bertkit.training.batch_plan import BatchPlan

    _, seen = uninterrupted
    expected = []
    for length, steps in ((32, SWITCH), (64, MAX_STEPS - SWITCH)):
        data = PretrainingDataset(two_lengths / f"data{length}")
        plan = BatchPlan(data, 8, list, seed=_settings(two_lengths, Path("unused")).seed)
        for indices in plan.batches(0)[:steps]:
            lengths = [len(data[i]["input_ids"]) for i in indices]
            expected.append((max(lengths), sum(lengths)))
    assert seen == expected
    assert max(t for t, _ in seen[:SWITCH]) == 32
    assert min(t for t, _ in seen[SWITCH:]) > 32 and max(t for t, _ in seen[SWITCH:]) == 64
    assert sum(n for _, n in seen[SWITCH:]) / (8 * (MAX_STEPS - SWITCH)) > 32  # mean real tokens per sequence


def test_the_command_line_two_phase_run_stopped_at_the_switch_resumes_exactly(two_lengths, uninterrupted, tmp_path,
                                                                              monkeypatch, one_thread):
    """The same through `bertkit pretrain --phase2-data --phase1-fraction` (its output directory claimed and
    marked): stopped right after the checkpoint at the last step of phase 1, then --resume: the reference run's
    losses and weights."""
    from bertkit.cli import main

    reference, _ = uninterrupted
    out = tmp_path / "run"
    args = ["pretrain", "--data", str(two_lengths / "data32"), "--phase2-data", str(two_lengths / "data64"),
            "--phase1-fraction", str(SWITCH / MAX_STEPS), "--vocab", str(two_lengths / "vocab"), "--config-name",
            "tiny", "--out", str(out), "--max-steps", str(MAX_STEPS), "--save-steps", str(SAVE_STEPS),
            "--logging-steps", "1", "--batch-size", "8", "--lr", "1e-3", "--no-progress"]
    with monkeypatch.context() as mp:
        _stop_after_checkpoint(mp, SWITCH)
        with pytest.raises(Stopped):
            main(args)
    from killing import in_progress

    assert not out.exists()  # the stopped run is beside its output directory, until --resume finishes it
    assert [r["step"] for r in _train_rows(in_progress(out))] == list(range(1, SWITCH + 1))
    assert main([*args, "--resume"]) == 0
    assert _train_rows(out) == _train_rows(reference)
    ref, resumed = _weights(reference), _weights(out)
    assert all(torch.equal(resumed[k], ref[k]) for k in ref)


@pytest.mark.parametrize(("switch", "stop"), slow_after([(0, "checkpoint"), (0, "step+2"), (3, "step+2")]),
                         ids=["stopped-at-the-switch", "stopped-in-phase-2", "epoch-end-in-phase-1"])
def test_an_epoch_end_checkpoint_is_evaluated_once_after_a_resume(two_lengths, tmp_path, monkeypatch, one_thread,
                                                                  switch, stop):
    """Phase 1's data ends its first epoch at step E, where the loop evaluates (no --eval-steps); a checkpoint is
    written there, just before that evaluation. Phase 1 ends at step E (the switch) or 3 steps later.

    Stopped right after that checkpoint (the evaluation not done yet), or two steps after it (the evaluation is in
    metrics.jsonl), then resumed from it: the uninterrupted run's records, train and eval, each once. (Before the
    fix, resuming at the switch lost the evaluation, and resuming at an epoch's end within a phase repeated it.)"""
    from bertkit.data.dataset import PretrainingDataset
    from bertkit.training.batch_plan import BatchPlan
    from bertkit.training.pretrain import pretrain

    epoch = len(BatchPlan(PretrainingDataset(two_lengths / "short32"), 8, list, seed=1))  # E: batches of 8
    assert epoch >= 3
    phase1, total = epoch + switch, epoch + switch + 3
    kw = dict(data=two_lengths / "short32", max_steps=total, phase1_fraction=phase1 / total, save_steps=epoch,
              eval_data=two_lengths / "data64", eval_instances=16)
    pretrain(_settings(two_lengths, tmp_path / "reference", **kw))
    reference = _rows(tmp_path / "reference")
    assert [r["step"] for r in reference if r["split"] == "eval"] == [epoch, total]
    assert [r["phase"] for r in reference if r["split"] == "train"] == ["phase1-32"] * phase1 + ["phase2-64"] * 3

    out = tmp_path / "run"
    with monkeypatch.context() as mp:
        if stop == "checkpoint":
            _stop_after_checkpoint(mp, epoch)
        else:
            _stop_in_step(mp, epoch + 2)
        with pytest.raises(Stopped):
            pretrain(_settings(two_lengths, out, **kw))
    evaluated = [r["step"] for r in _rows(out) if r["split"] == "eval"]
    assert evaluated == ([] if stop == "checkpoint" else [epoch])
    pretrain(_settings(two_lengths, out, resume=True, **kw))  # from the checkpoint at step E
    assert _rows(out) == reference


def test_a_dynamic_masking_seed_on_data_with_its_masks_is_refused(tiny_pretraining_data, tmp_path, capsys):
    """Was: `pretrain --dynamic-masking-seed 5` on data made with --masking static (its masks stored) trained on the
    stored masks, the seed dropped without a word; refused now, before a step, naming the data."""
    from bertkit.cli import main

    data = tiny_pretraining_data / "data"
    out = tmp_path / "run"
    assert main(["pretrain", "--data", str(data), "--vocab", str(tiny_pretraining_data / "vocab"), "--config-name",
                 "tiny", "--max-steps", "1", "--batch-size", "4", "--output-dir", str(out), "--no-progress",
                 "--dynamic-masking-seed", "5"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"bertkit pretrain: error: --dynamic-masking-seed 5 seeds masks drawn at load time, but the instances in "
        f"{data} carry the masks create-pretraining-data drew (--masking static): drop --dynamic-masking-seed, or "
        "make the data with --masking dynamic")
    assert not list(tmp_path.iterdir())


def test_eval_data_longer_than_the_positions_is_refused_before_a_step(two_lengths, tmp_path, capsys):
    """Was: --eval-data of 64-token instances for a model of 32 positions trained every step, then failed at the first
    evaluation, telling to "truncate the input (tokenizer(..., truncation=True))", with no final model saved; refused
    now before a step, naming the data and the fix, as --data and --phase2-data are."""
    from bertkit.cli import main
    from bertkit.config import BertConfig

    BertConfig.preset("tiny", vocab_size=1500, max_position_embeddings=32).save_pretrained(tmp_path / "shape")
    out = tmp_path / "run"
    assert main(["pretrain", "--data", str(two_lengths / "data32"), "--vocab", str(two_lengths / "vocab"),
                 "--config-name", str(tmp_path / "shape"), "--max-steps", "1", "--batch-size", "4", "--output-dir",
                 str(out), "--no-progress", "--eval-data", str(two_lengths / "data64")]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"bertkit pretrain: error: --eval-data {two_lengths / 'data64'} holds instances of 64 tokens but "
        "max_position_embeddings is 32; recreate the data with --max-seq-length 32 or less, or enlarge the config")
    assert not out.exists()
