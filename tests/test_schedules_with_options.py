"""transformers' cosine_with_min_lr and warmup_stable_decay: the rate of its get_scheduler at every step, to the last
bit, for drawn lr_scheduler_kwargs; the options they need, and values they cannot use, refused by name."""

from __future__ import annotations

import random
import warnings

import pytest
import torch

import bertkit
from bertkit.errors import BertkitError
from bertkit.training.optim import linear_warmup_decay
from trainer_helpers import TRAIN, tiny_classifier

transformers = pytest.importorskip("transformers")
_SHAPES = ["linear", "cosine", "1-sqrt"]


def _draw(rng: random.Random, shape: str, total: int, lr: float) -> dict:
    if shape == "cosine_with_min_lr":
        kw = ({"min_lr": rng.choice([0.0, 1e-7, lr * rng.random(), lr])} if rng.random() < 0.5
              else {"min_lr_rate": rng.choice([0.0, 0.1, rng.random(), 1.0])})
        if rng.random() < 0.5:
            kw["num_cycles"] = rng.choice([0.25, 0.5, 1, 1.5, 3.7])
        return kw
    kw = {"num_decay_steps": rng.randint(0, total + 3)}
    for name, values in (("num_stable_steps", [0, 3, rng.randint(0, total)]), ("warmup_type", _SHAPES),
                         ("decay_type", _SHAPES), ("min_lr_ratio", [0.0, 0.1, rng.random(), 1.0]),
                         ("num_cycles", [0.3, 0.5, 1, 2.5])):
        if rng.random() < 0.5:
            kw[name] = rng.choice(values)
    return kw


def _rates(make, lr: float, steps: int) -> list[float]:
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    sched, rates = make(opt), []
    for _ in range(steps):
        rates.append(sched.get_last_lr()[0])
        opt.step()
        sched.step()
    return rates


@pytest.mark.parametrize("shape", ["cosine_with_min_lr", "warmup_stable_decay"])
def test_drawn_options_give_transformers_rate_at_every_step(shape):
    """Both were refused ("not implemented"); 150 drawn runs (warm-up, length, peak and options) now give
    transformers' get_scheduler's rate at every step and 3 past the end, bit for bit."""
    rng = random.Random(f"{shape}-7")
    warnings.simplefilter("ignore")  # transformers warns when num_stable_steps and num_training_steps are both given
    for _ in range(150):
        total = rng.randint(1, 30)
        warmup, lr = rng.choice([0, rng.randint(0, total + 4)]), rng.choice([5e-5, 3e-4, 0.1, 1.0])
        kw = _draw(rng, shape, total, lr)
        ours = _rates(lambda o, w=warmup, t=total, k=kw: linear_warmup_decay(o, w, t, shape, dict(k)), lr, total + 4)
        theirs = _rates(lambda o, w=warmup, t=total, k=kw: transformers.get_scheduler(
            shape, o, num_warmup_steps=w, num_training_steps=t, scheduler_specific_kwargs=dict(k)), lr, total + 4)
        assert ours == theirs, (total, warmup, lr, kw)


def test_warmup_stable_decay_phases():
    rates = _rates(lambda o: linear_warmup_decay(o, 2, 10, "warmup_stable_decay",
                                                 {"num_decay_steps": 4, "decay_type": "linear",
                                                  "min_lr_ratio": 0.1}), 1.0, 11)
    assert rates == pytest.approx([0.1, 0.55, 1, 1, 1, 1, 1, 0.775, 0.55, 0.325, 0.1])


@pytest.mark.parametrize(("schedule", "options", "message"), [
    ("cosine_with_min_lr", {}, r"'cosine_with_min_lr' needs exactly one of min_lr or min_lr_rate in "
                               r"lr_scheduler_kwargs \(got none\)"),
    ("cosine_with_min_lr", {"min_lr": 1e-6, "min_lr_rate": 0.1}, r"\(got min_lr=1e-06, min_lr_rate=0.1\)"),
    ("cosine_with_min_lr", {"min_lr_rate": 1.5}, r"min_lr_rate=1.5: must be a finite number from 0 to 1"),
    ("cosine_with_min_lr", {"min_lr": 1e-2}, r"min_lr=0.01 with learning_rate 5e-05: min_lr must be at most"),
    ("cosine_with_min_lr", {"min_lr": "1e-6"}, r"min_lr='1e-6': must be a finite number 0 or above"),
    ("warmup_stable_decay", {}, r"'warmup_stable_decay' needs num_decay_steps in lr_scheduler_kwargs \(got none\)"),
    ("warmup_stable_decay", {"num_decay_steps": 5, "decay_type": "exp"},
     r"decay_type='exp': must be one of linear, cosine, 1-sqrt"),
    ("warmup_stable_decay", {"num_decay_steps": 2.5}, r"num_decay_steps=2.5: must be a whole number of steps"),
    ("warmup_stable_decay", {"num_decay_steps": 3, "num_stable_steps": -1}, r"num_stable_steps=-1: must be a whole"),
    ("warmup_stable_decay", {"num_decay_steps": 3, "power": 2}, r"power=2: lr_scheduler_type 'warmup_stable_decay' "
                                                                r"takes decay_type, min_lr_ratio, num_cycles"),
])
def test_options_these_schedules_cannot_use_are_refused_naming_them(schedule, options, message):
    with pytest.raises(BertkitError, match=message):
        bertkit.TrainingArguments("out", lr_scheduler_type=schedule, lr_scheduler_kwargs=options)


def test_the_command_line_offers_only_schedules_that_need_no_options(capsys):
    from bertkit.cli import main

    with pytest.raises(SystemExit):
        main(["pretrain", "--lr-scheduler-type", "warmup_stable_decay"])
    assert "invalid choice: 'warmup_stable_decay'" in capsys.readouterr().err


@pytest.mark.parametrize(("schedule", "options"), [("warmup_stable_decay", {"num_decay_steps": 5, "min_lr_ratio": 0.2}),
                                                   ("cosine_with_min_lr", {"min_lr": 1e-3})])
def test_a_trainer_logs_transformers_rates_for_these_schedules(schedule, options, minilm_2_layers, tmp_path):
    datasets = pytest.importorskip("datasets")
    path = tiny_classifier(tmp_path / "m", minilm_2_layers)
    runs = {}
    for lib in (bertkit, transformers):
        tokenizer = lib.AutoTokenizer.from_pretrained(path)
        rows = datasets.Dataset.from_list([{**tokenizer(r["text"]), "label": r["label"]} for r in TRAIN[:16]])
        args = lib.TrainingArguments(output_dir=str(tmp_path / lib.__name__), report_to="none", use_cpu=True,
                                     disable_tqdm=True, learning_rate=3e-3, per_device_train_batch_size=4,
                                     num_train_epochs=2, logging_steps=1, save_strategy="no", seed=3,
                                     lr_scheduler_type=schedule, warmup_steps=2, lr_scheduler_kwargs=options)
        trainer = lib.Trainer(model=lib.AutoModelForSequenceClassification.from_pretrained(path), args=args,
                              train_dataset=rows, processing_class=tokenizer)
        trainer.train()
        runs[lib] = [(h["step"], h["learning_rate"], h["loss"]) for h in trainer.state.log_history if "loss" in h]
    assert [(s, lr) for s, lr, _ in runs[bertkit]] == [(s, lr) for s, lr, _ in runs[transformers]]
    assert [x for *_, x in runs[bertkit]] == pytest.approx([x for *_, x in runs[transformers]], rel=1e-5)
