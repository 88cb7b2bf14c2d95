"""Training checkpoints crossing libraries. transformers' Trainer's and sentence-transformers' trainers'
checkpoint-N (optimizer.pt, scheduler.pt, rng_state.pth, training_args.bin, no state.pt) cannot be continued exactly
by bertkit, so a resume from one, or in an output_dir where one is newer than bertkit's own, is refused before
anything is trained or written, naming the directory, its writer and the new run to start. The other way, a
bertkit.Trainer checkpoint holds transformers' own resume files, so transformers' Trainer continues it exactly."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path

import pytest
import torch

import bertkit
from bertkit.errors import BertkitError
from trainer_helpers import TRAIN, KillAt, Killed, tiny_classifier

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")  # transformers' Trainer needs it


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, minilm_2_layers) -> Path:
    return tiny_classifier(tmp_path_factory.mktemp("foreign") / "tiny-classifier", minilm_2_layers)


def _train(lib, checkpoint: Path, out: Path, resume=None, callbacks=None, **overrides):
    tokenizer = lib.AutoTokenizer.from_pretrained(checkpoint)
    model = lib.AutoModelForSequenceClassification.from_pretrained(checkpoint)
    rows = [{**tokenizer(r["text"], truncation=True), "label": r["label"]} for r in TRAIN[:16]]
    args = lib.TrainingArguments(**{**dict(output_dir=str(out), learning_rate=1e-3, per_device_train_batch_size=4,
                                           max_steps=4, logging_steps=1, save_steps=2, report_to="none",
                                           use_cpu=True, seed=3, disable_tqdm=True), **overrides})
    trainer = lib.Trainer(model=model, args=args, train_dataset=rows, processing_class=tokenizer, callbacks=callbacks)
    return trainer.train(resume_from_checkpoint=resume)


def _files(directory: Path) -> dict[str, str]:
    return {str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("resume", ["path", pytest.param(True, marks=pytest.mark.slow)])
def test_a_resume_from_transformers_checkpoints_is_refused_naming_the_writer_and_the_new_run(checkpoint, tmp_path,
                                                                                             resume):
    """Was (True): "holds no checkpoint-N directory with state.pt and trainer_state.json to resume from (2 without
    them); train without it into another output_dir", which named neither transformers nor the weights to start
    from. Now both spellings name the checkpoint, what it lacks and who wrote it, and leave the directory as it was."""
    out = tmp_path / "hf"
    _train(transformers, checkpoint, out)
    before = _files(out)
    given = str(out / "checkpoint-4") if resume == "path" else True
    with pytest.raises(BertkitError) as e:
        _train(bertkit, checkpoint, out, resume=given)
    message = str(e.value)
    assert f"{out / 'checkpoint-4'} has no state.pt: it was written by transformers' Trainer (optimizer.pt, " in message
    assert f"start a new run from its weights, the model from_pretrained('{out / 'checkpoint-4'}')" in message
    assert _files(out) == before


@pytest.mark.parametrize("resume", [pytest.param("checkpoint-2", marks=pytest.mark.slow), True])
def test_a_newer_transformers_checkpoint_beside_bertkits_is_neither_passed_over_nor_written_over(checkpoint, tmp_path,
                                                                                                  resume):
    """bertkit's checkpoint-2 and, newer, transformers' checkpoint-4 (a run continued with transformers) in one
    output_dir. Was: resume_from_checkpoint=True went back to checkpoint-2 with a warning that checkpoint-4 had "no
    state.pt or trainer_state.json" (it has the latter), dropping its two steps, and both spellings then wrote
    bertkit's checkpoint-4 over transformers': its config, weights and tokenizer files moved to
    checkpoint-4.replaced-*, its optimizer.pt, scheduler.pt, rng_state.pth and training_args.bin left beside
    bertkit's new weights (a checkpoint transformers resumes with another run's optimiser). Now refused, nothing
    written."""
    out, other = tmp_path / "run", tmp_path / "hf"
    _train(bertkit, checkpoint, out, max_steps=2)
    _train(transformers, checkpoint, other)
    (other / "checkpoint-4").rename(out / "checkpoint-4")
    before = _files(out)
    given = str(out / resume) if resume is not True else True
    with pytest.raises(BertkitError, match=re.escape(
            f"cannot resume in {out}: {out / 'checkpoint-4'}, newer than checkpoint-2, has no state.pt: it was "
            "written by transformers' Trainer") + r".*; to go back to checkpoint-2 anyway \(dropping the steps after "
            r"it: the resumed run would write over checkpoint-4\), move checkpoint-4 out of "):
        _train(bertkit, checkpoint, out, resume=given)
    assert _files(out) == before


@pytest.mark.parametrize(("model_type", "writer", "load"), [
    ("SentenceTransformer", "sentence-transformers' SentenceTransformerTrainer", "SentenceTransformer"),
    ("CrossEncoder", "sentence-transformers' CrossEncoderTrainer", "CrossEncoder"),
    ("SparseEncoder", "sentence-transformers' SparseEncoderTrainer", "SparseEncoder"),
])
def test_sentence_transformers_checkpoints_are_named_with_the_class_that_loads_them(tmp_path, model_type, writer, load):
    """Was: "is transformers' Trainer's checkpoint ... (from_pretrained on it)" for sentence-transformers' checkpoints
    too, whose weights a run starts from with SentenceTransformer(path) or CrossEncoder(path)."""
    from bertkit.training.resume_point import foreign_checkpoint

    path = tmp_path / "checkpoint-2"
    path.mkdir()
    for name in ("trainer_state.json", "optimizer.pt", "scheduler.pt", "modules.json"):
        (path / name).write_text("{}")
    (path / "config_sentence_transformers.json").write_text(json.dumps({"model_type": model_type}))
    assert foreign_checkpoint(path) == (
        f"has no state.pt: it was written by {writer} (optimizer.pt, scheduler.pt), whose optimiser, schedule and "
        f"data position bertkit cannot continue exactly; start a new run from its weights, the model "
        f"{load}('{path}'), in another output_dir")
    (path / "optimizer.pt").unlink()
    (path / "scheduler.pt").unlink()
    assert foreign_checkpoint(path) is None  # no trainer's state: a user's directory, passed over as before


def _losses(history: list[dict]) -> list[tuple[int, float, float]]:
    return [(h["step"], round(h["loss"], 5), h["learning_rate"]) for h in history if "loss" in h]


def test_transformers_trainer_resumes_a_bertkit_checkpoint_as_its_own_uninterrupted_run(checkpoint, tmp_path):
    """bertkit's checkpoint-3 of a 6-step run (weight decay on: two parameter groups; a warm-up), resumed by
    transformers' Trainer. Was: transformers found no optimizer.pt or scheduler.pt and went on, without a word,
    with a fresh AdamW and the schedule from its first step (in a 6-step run without warm-up: step 4 at the rate
    0.001 where the run was at 0.0005, loss 0.6746 against 0.6938), then stopped at its first save with KeyError: 'TrainerControl'
    (trainer_state.json's stateful_callbacks). Now the checkpoint holds transformers' optimizer.pt, scheduler.pt and
    rng_state.pth (the moments stored once: state.pt names optimizer.pt), and the resumed run logs transformers'
    uninterrupted losses and rates and ends at its weights."""
    settings = dict(max_steps=6, save_steps=3, weight_decay=0.01, warmup_steps=1, seed=5)
    _train(bertkit, checkpoint, tmp_path / "bertkit", **settings)
    cut = tmp_path / "bertkit" / "checkpoint-3"

    def run(out, resume=None):
        tokenizer = transformers.AutoTokenizer.from_pretrained(checkpoint)
        model = transformers.AutoModelForSequenceClassification.from_pretrained(checkpoint)
        rows = [{**tokenizer(r["text"], truncation=True), "label": r["label"]} for r in TRAIN[:16]]
        args = transformers.TrainingArguments(output_dir=str(out), learning_rate=1e-3, per_device_train_batch_size=4,
                                              logging_steps=1, report_to="none", use_cpu=True, disable_tqdm=True,
                                              **settings)
        trainer = transformers.Trainer(model=model, args=args, train_dataset=rows, processing_class=tokenizer)
        trainer.train(resume_from_checkpoint=resume)
        return trainer

    whole = run(tmp_path / "whole")
    shutil.copytree(cut, tmp_path / "resumed" / "checkpoint-3")
    resumed = run(tmp_path / "resumed", str(tmp_path / "resumed" / "checkpoint-3"))
    assert _losses(resumed.state.log_history) == _losses(whole.state.log_history)  # steps 1-3 bertkit's records
    for name, value in resumed.model.state_dict().items():
        torch.testing.assert_close(value, whole.model.state_dict()[name], rtol=0, atol=1e-5, msg=name)
    assert torch.load(cut / "state.pt", weights_only=True)["optimizer"] == "optimizer.pt"  # stored once


def test_a_checkpoint_holding_the_moments_in_state_pt_resumes_as_it_did(checkpoint, tmp_path):
    """Checkpoints written before optimizer.pt held AdamW's moments in state.pt: they resume as they did, to the
    uninterrupted run's losses, rates and weights."""
    import safetensors.torch

    settings = dict(max_steps=4, save_steps=2, weight_decay=0.01)
    _train(bertkit, checkpoint, tmp_path / "whole", **settings)
    with pytest.raises(Killed):
        _train(bertkit, checkpoint, tmp_path / "cut", callbacks=[KillAt(3)], **settings)
    cut = tmp_path / "cut" / "checkpoint-2"
    state = torch.load(cut / "state.pt", weights_only=True)
    torch.save({**state, "optimizer": torch.load(cut / "optimizer.pt", weights_only=True)}, cut / "state.pt")
    for name in ("optimizer.pt", "scheduler.pt", "rng_state.pth"):
        (cut / name).unlink()
    _train(bertkit, checkpoint, tmp_path / "cut", resume=str(cut), **settings)
    history = [json.loads((tmp_path / run / "checkpoint-4" / "trainer_state.json").read_text())["log_history"]
               for run in ("whole", "cut")]
    assert _losses(history[1]) == _losses(history[0])
    weights = [safetensors.torch.load_file(tmp_path / run / "checkpoint-4" / "model.safetensors")
               for run in ("whole", "cut")]
    for name, value in weights[0].items():
        torch.testing.assert_close(weights[1][name], value, rtol=0, atol=0, msg=name)


def test_a_checkpoint_whose_optimizer_pt_was_deleted_is_refused_naming_it(checkpoint, tmp_path, caplog):
    """optimizer.pt deleted from the newest checkpoint (as transformers' users shrink theirs): was a FileNotFoundError
    line from torch, after a warning that the resume was "falling back to the one before it", which it did not
    (the Trainer resumes the checkpoint it names, or none). Now the refusal names the file, why it matters and the
    fix; nothing is removed."""
    import logging

    with pytest.raises(Killed):
        _train(bertkit, checkpoint, tmp_path / "run", callbacks=[KillAt(3)], max_steps=4, save_steps=1)
    (tmp_path / "run" / "checkpoint-2" / "optimizer.pt").unlink()
    before = _files(tmp_path / "run")
    with caplog.at_level(logging.WARNING, logger="bertkit"), pytest.raises(BertkitError, match=re.escape(
            f"{tmp_path / 'run' / 'checkpoint-2' / 'optimizer.pt'} is missing: it holds AdamW's moments, which "
            "state.pt leaves to it; put it back, or resume from an earlier checkpoint by its path")):
        _train(bertkit, checkpoint, tmp_path / "run", resume=True, max_steps=4, save_steps=1)
    assert "falling back" not in caplog.text
    assert _files(tmp_path / "run") == before
