"""Seeded draws of what transformers' scripts do to ``TrainingArguments`` after parsing: fields assigned on the object
(``args.learning_rate = ...``, ``trainer.args.num_train_epochs = ...``), some given to the constructor first, then
the text-classification guide trained by bertkit's Trainer and by transformers' on the same tiny seeded model. Each
draw compares every logged record (losses within 1e-5, learning rates exactly), the checkpoints left and the
metrics; a field bertkit refuses is refused by name (``args.optim = "sgd"`` trained AdamW before, a transformers field
bertkit does not implement was kept as an attribute nothing read)."""

from __future__ import annotations

import random

import pytest

import bertkit
from bertkit.errors import BertkitError
from bertkit.training.trainer_args import REFUSED
from trainer_helpers import TEST, TRAIN, accuracy, tiny_classifier

transformers = pytest.importorskip("transformers")
datasets = pytest.importorskip("datasets")
pytestmark = pytest.mark.slow

DRAWS = range(6)
# read by transformers' Trainer when it is made (the sampler's seed, the accelerator's batch size), so an assignment on
# trainer.args afterwards changes nothing there, where bertkit reads every field when train() starts (documented)
READ_AT_INIT = ("seed", "data_seed", "per_device_train_batch_size")
TIMING = ("runtime", "per_second", "total_flos", "preparation_time")
# honoured fields and values a script assigns: each drawn one changes the run
VALUES = {
    "learning_rate": [3e-3, 5e-4], "num_train_epochs": [1, 2, 1.5], "max_steps": [3, 5],
    "per_device_train_batch_size": [3, 5], "per_device_eval_batch_size": [2, 5], "weight_decay": [0.0, 0.3],
    "max_grad_norm": [0.0, 0.3], "seed": [1, 42], "data_seed": [5], "warmup_steps": [0, 2, 0.3],
    "lr_scheduler_type": ["cosine", "constant_with_warmup", "polynomial"], "adam_beta1": [0.5], "adam_epsilon": [1e-3],
    "logging_steps": [2, 0.25], "eval_strategy": ["steps", "epoch", "no"], "eval_steps": [2, 3],
    "save_strategy": ["steps", "epoch", "no"], "save_steps": [2, 3], "save_total_limit": [1, 2],
    "label_smoothing_factor": [0.2], "dataloader_drop_last": [True], "prediction_loss_only": [True],
    "optim": ["adamw_torch_fused"], "train_sampling_strategy": ["sequential"],
}


def _draw(r: random.Random) -> tuple[dict, dict]:
    names = r.sample(sorted(VALUES), r.randint(2, 6))
    given = {n: r.choice(VALUES[n]) for n in names[: r.randint(0, 2)]}
    later = {n: r.choice(VALUES[n]) for n in names[len(given):]}
    if "lr_scheduler_type" in later and later["lr_scheduler_type"] == "cosine" and r.random() < 0.5:
        later["lr_scheduler_kwargs"] = {"num_cycles": 2}  # assigned after its schedule, as it must be
    return given, later


def _run(lib, checkpoint, out, given: dict, later: dict, on_trainer: bool) -> dict:
    tokenizer = lib.AutoTokenizer.from_pretrained(checkpoint)
    rows = {name: datasets.Dataset.from_list(data).map(lambda b: tokenizer(b["text"], truncation=True), batched=True)
            for name, data in (("train", TRAIN[:18]), ("test", TEST[:10]))}
    args = lib.TrainingArguments(**{**dict(output_dir=str(out), report_to="none", use_cpu=True, disable_tqdm=True,
                                           learning_rate=1e-3, per_device_train_batch_size=4, logging_steps=1,
                                           eval_strategy="epoch", save_strategy="no", seed=7), **given})
    for name, value in later.items() if not on_trainer else ():  # on the arguments, before the Trainer is made
        setattr(args, name, value)
    trainer = lib.Trainer(model=lib.AutoModelForSequenceClassification.from_pretrained(checkpoint), args=args,
                          train_dataset=rows["train"], eval_dataset=rows["test"], processing_class=tokenizer,
                          data_collator=lib.DataCollatorWithPadding(tokenizer), compute_metrics=accuracy)
    for name, value in later.items() if on_trainer else ():  # or on the Trainer's (read by train() in both)
        setattr(trainer.args, name, value)
    trainer.train()
    return {"log": [{k: v for k, v in h.items() if not any(t in k for t in TIMING)} for h in trainer.state.log_history],
            "checkpoints": sorted(p.name for p in out.glob("checkpoint-*")),
            "best": trainer.state.best_model_checkpoint}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, minilm_2_layers):
    return tiny_classifier(tmp_path_factory.mktemp("fields") / "tiny", minilm_2_layers)


@pytest.mark.parametrize("draw", DRAWS)
def test_assigned_fields_train_as_transformers_trains(draw, checkpoint, tmp_path):
    r = random.Random(draw)
    given, later = _draw(r)
    on_trainer = r.random() < 0.5 and not set(later) & set(READ_AT_INIT)
    where = f"draw {draw}: given {given}, assigned {later} on {'trainer.args' if on_trainer else 'args'}"
    try:
        theirs = _run(transformers, checkpoint, tmp_path / "hf", given, later, on_trainer)
    except ValueError as e:  # a combination transformers refuses (save_steps not a multiple of eval_steps, ...)
        with pytest.raises(BertkitError):
            _run(bertkit, checkpoint, tmp_path / "bk", given, later, on_trainer)
        pytest.skip(f"{where}: transformers refuses it ({e}); bertkit too")
    ours = _run(bertkit, checkpoint, tmp_path / "bk", given, later, on_trainer)
    last = max(h["step"] for h in theirs["log"])
    logged = {h["step"] for h in theirs["log"] if "loss" in h}  # bertkit always logs the last step (documented)
    records = [h for h in ours["log"] if not ("loss" in h and h["step"] == last and last not in logged)]
    assert [sorted(h) for h in records] == [sorted(h) for h in theirs["log"]], where
    for mine, reference in zip(records, theirs["log"]):
        for key, value in reference.items():
            if key in ("step", "learning_rate", "epoch"):
                assert mine[key] == pytest.approx(value, rel=1e-12), (where, key, mine, reference)
            else:
                assert mine[key] == pytest.approx(value, rel=1e-4 if key == "grad_norm" else 1e-5, abs=1e-7), \
                    (where, key, mine, reference)
    assert ours["checkpoints"] == theirs["checkpoints"], where


@pytest.mark.parametrize("draw", range(4))
def test_drawn_unimplemented_fields_are_refused_when_assigned(draw, tmp_path):
    """Any field of transformers' live list that bertkit refuses, at a value other than its default, assigned."""
    r = random.Random(draw)
    args = bertkit.TrainingArguments(output_dir=str(tmp_path / "out"))
    for name in r.sample(sorted(REFUSED), 8):
        default = REFUSED[name]
        value = (not default) if isinstance(default, bool) else (7 if default in (None, -1) else f"not-{default}")
        with pytest.raises(BertkitError, match=rf"{name}={value!r} is a transformers argument bertkit does not"):
            setattr(args, name, value)
        assert not hasattr(args, name)
