"""Seeded random checkpoints crossing transformers' Trainer and bertkit's (tests/test_foreign_checkpoints.py has the
cases one by one): optimiser, weight decay, schedule, warm-up, accumulation, epochs or max_steps, the checkpoint a
run stops at (mid-epoch too), seed and data_seed drawn. A checkpoint transformers wrote is refused by bertkit's
resume (a path, True, or beside an older checkpoint of bertkit's) before anything is written; one bertkit wrote is
resumed by transformers to transformers' uninterrupted run: the same learning rate at every step and, without
accumulation (with it, transformers 5 trains on the micro-batches' summed loss), the same losses and weights."""

from __future__ import annotations

import csv
import hashlib
import random
import shutil
from pathlib import Path

import pytest
import torch

import bertkit
from bertkit.errors import BertkitError
from trainer_helpers import tiny_classifier

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")  # transformers' Trainer needs it
pytestmark = pytest.mark.slow

CASES = 8


def _sst2(data_dir: Path, n: int, offset: int) -> list[dict]:
    with open(data_dir / "glue/SST-2/train.tsv", encoding="utf-8") as f:
        rows = list(csv.reader(f, delimiter="\t", quotechar=None))[1 + offset:1 + offset + n]
    return [{"text": r[0], "label": int(r[1])} for r in rows]


def _files(directory: Path) -> dict[str, str]:
    return {str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.rglob("*")) if p.is_file()}


def _run(lib, model_dir: Path, out: Path, rows: list[dict], settings: dict, resume=None):
    tokenizer = lib.AutoTokenizer.from_pretrained(model_dir)
    model = lib.AutoModelForSequenceClassification.from_pretrained(model_dir)
    data = [{**tokenizer(r["text"], truncation=True, max_length=32), "label": r["label"]} for r in rows]
    args = lib.TrainingArguments(output_dir=str(out), logging_steps=1, report_to="none", use_cpu=True,
                                 disable_tqdm=True, learning_rate=1e-3, **settings)
    trainer = lib.Trainer(model=model, args=args, train_dataset=data, processing_class=tokenizer)
    trainer.train(resume_from_checkpoint=resume)
    return trainer


def _draw(rng: random.Random, writer: str) -> dict:
    optims = ["adamw_torch", "adamw_torch_fused"] + (["sgd", "adafactor"] if writer == "transformers" else [])
    return {"optim": rng.choice(optims), "weight_decay": rng.choice([0.0, 0.01]),
            "lr_scheduler_type": rng.choice(["linear", "cosine", "constant_with_warmup"]),
            "warmup_steps": rng.choice([0, 1, 2]), "gradient_accumulation_steps": rng.choice([1, 1, 2]),
            "per_device_train_batch_size": rng.choice([4, 8]), "seed": rng.choice([0, 1, 42]),
            "data_seed": rng.choice([None, 7]), "save_steps": rng.choice([2, 3]),
            **({"max_steps": rng.choice([5, 7])} if rng.random() < 0.5 else {"num_train_epochs": rng.choice([1, 2])})}


def _steps(history: list[dict]) -> list[tuple]:
    return [(h["step"], h["loss"], h["learning_rate"]) for h in history if "loss" in h]


@pytest.mark.parametrize("case", range(CASES))
def test_checkpoints_crossing_libraries(minilm_2_layers, data_dir, tmp_path_factory, case):
    rng = random.Random(1000 + case)
    tmp = tmp_path_factory.mktemp(f"cross{case}")
    model_dir = tiny_classifier(tmp / "model", minilm_2_layers)
    rows = _sst2(data_dir, rng.choice([16, 24, 40]), rng.randrange(5000))
    writer = "transformers" if case % 2 == 0 else "bertkit"
    settings = _draw(rng, writer)
    if writer == "transformers":
        out = tmp / "run"
        how = rng.choice(["path", "True", "beside bertkit's"])
        if how == "beside bertkit's":  # bertkit's first checkpoint, then transformers' newer ones
            _run(bertkit, model_dir, out, rows, {**settings, "optim": "adamw_torch", "max_steps": 1,
                                                   "save_steps": 1, "num_train_epochs": 1})
            _run(transformers, model_dir, tmp / "hf", rows, settings)
            for path in (tmp / "hf").glob("checkpoint-*"):
                path.rename(out / path.name)
        else:
            _run(transformers, model_dir, out, rows, settings)
        newest = max(out.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
        before = _files(out)
        bertkit_settings = {**settings, "optim": "adamw_torch"} if settings["optim"] in ("sgd", "adafactor") else settings
        resume = str(newest) if how == "path" else True
        with pytest.raises(BertkitError) as e:
            _run(bertkit, model_dir, out, rows, bertkit_settings, resume=resume)
        message = str(e.value)
        assert f"{newest} " in message or f"{newest}," in message, message
        assert "has no state.pt: it was written by transformers' Trainer" in message, message
        assert f"start a new run from its weights, the model from_pretrained('{newest}')" in message, message
        assert _files(out) == before
        return
    _run(bertkit, model_dir, tmp / "bertkit", rows, settings)
    written = sorted((tmp / "bertkit").glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    cut = rng.choice(written[:-1] or written)
    whole = _run(transformers, model_dir, tmp / "whole", rows, settings)
    shutil.copytree(cut, tmp / "resumed" / cut.name)
    resumed = _run(transformers, model_dir, tmp / "resumed", rows, settings, resume=str(tmp / "resumed" / cut.name))
    ours, theirs = _steps(resumed.state.log_history), _steps(whole.state.log_history)
    assert [(s, lr) for s, _, lr in ours] == [(s, lr) for s, _, lr in theirs], (settings, cut.name)
    if settings["gradient_accumulation_steps"] == 1:
        for (step, loss, _), (_, reference, _) in zip(ours, theirs, strict=True):
            assert loss == pytest.approx(reference, abs=1e-5), (settings, cut.name, step)
        for name, value in resumed.model.state_dict().items():
            torch.testing.assert_close(value, whole.model.state_dict()[name], rtol=0, atol=1e-5, msg=name)
