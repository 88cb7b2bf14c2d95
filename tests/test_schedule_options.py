"""transformers' ``lr_scheduler_kwargs``: the options of each learning-rate schedule (cosine's and
cosine_with_restarts' ``num_cycles``, polynomial's ``lr_end`` and ``power``, inverse_sqrt's ``timescale``) give
transformers' rate at every step; names a schedule does not take, and transformers' schedules bertkit does not
have, are refused by name with what to do. cosine_with_min_lr and warmup_stable_decay give the rate of its
get_scheduler at every step, to the last bit, for drawn options; the options they need, and values they cannot use,
are refused by name."""

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

OPTIONS = [("cosine", {"num_cycles": 2}), ("cosine", {"num_cycles": 0.25}), ("cosine", {"num_cycles": 1.5}),
           ("cosine_with_restarts", {"num_cycles": 3}), ("cosine_with_restarts", {"num_cycles": 2}),
           ("polynomial", {"power": 2.0}), ("polynomial", {"lr_end": 1e-6, "power": 0.5}),
           ("polynomial", {"lr_end": 0.0}), ("inverse_sqrt", {"timescale": 7}), ("inverse_sqrt", {"timescale": 1})]


@pytest.mark.parametrize(("shape", "options"), OPTIONS)
@pytest.mark.parametrize("warmup", [0, 3])
def test_schedule_options_give_transformers_rate_at_every_step(shape, options, warmup):
    """Each option changes the rate as transformers' schedule function does, to the last bit. They were refused
    ("drop this argument"), and dropping one trains another schedule than the script asked for (cosine_with_restarts'
    num_cycles 2 over 17 steps: 0.009 of the peak at step 8 and 0.991 at step 9, where the default gives 0.546 and
    0.454)."""
    rates = {}
    for impl in ("bertkit", "transformers"):
        p = torch.nn.Parameter(torch.zeros(1))
        opt = torch.optim.SGD([p], lr=5e-5)
        sched = (linear_warmup_decay(opt, warmup, 17, shape, options) if impl == "bertkit" else
                 transformers.get_scheduler(shape, opt, num_warmup_steps=warmup, num_training_steps=17,
                                            scheduler_specific_kwargs=options))
        rates[impl] = []
        for _ in range(18):
            rates[impl].append(sched.get_last_lr()[0])
            opt.step()
            sched.step()
    assert rates["bertkit"] == rates["transformers"]
    if (shape, options, warmup) == ("cosine_with_restarts", {"num_cycles": 2}, 0):  # the restart, between 8 and 9
        assert rates["bertkit"][8:10] == pytest.approx([5e-5 * 0.0085, 5e-5 * 0.9915], rel=0.01)


@pytest.mark.parametrize(("schedule", "options", "warmup", "n_rows"), [
    ("cosine_with_restarts", {"num_cycles": 2}, 1, 24),
    ("warmup_stable_decay", {"num_decay_steps": 5, "min_lr_ratio": 0.2}, 2, 16),
    ("cosine_with_min_lr", {"min_lr": 1e-3}, 2, 16)])
def test_a_trainer_with_lr_scheduler_kwargs_logs_transformers_rates_and_weights(schedule, options, warmup, n_rows,
                                                                               minilm_2_layers, tmp_path):
    """Trainer(args=TrainingArguments(lr_scheduler_type=..., lr_scheduler_kwargs=...)) against transformers'
    Trainer: every step's learning rate exactly and loss within 1e-5, the same weights."""
    datasets = pytest.importorskip("datasets")
    path = tiny_classifier(tmp_path / "m", minilm_2_layers)
    runs = {}
    for lib in (bertkit, transformers):
        tokenizer = lib.AutoTokenizer.from_pretrained(path)
        rows = datasets.Dataset.from_list([{**tokenizer(r["text"]), "label": r["label"]} for r in TRAIN[:n_rows]])
        args = lib.TrainingArguments(output_dir=str(tmp_path / lib.__name__), report_to="none", use_cpu=True,
                                     disable_tqdm=True, learning_rate=3e-3, per_device_train_batch_size=4,
                                     num_train_epochs=2, logging_steps=1, save_strategy="no", seed=3,
                                     lr_scheduler_type=schedule, warmup_steps=warmup, lr_scheduler_kwargs=options)
        trainer = lib.Trainer(model=lib.AutoModelForSequenceClassification.from_pretrained(path), args=args,
                              train_dataset=rows, processing_class=tokenizer)
        trainer.train()
        runs[lib] = ([(h["step"], h["learning_rate"], h["loss"]) for h in trainer.state.log_history if "loss" in h],
                     trainer.model.state_dict())
    (ours, our_weights), (theirs, their_weights) = runs[bertkit], runs[transformers]
    assert [(s, lr) for s, lr, _ in ours] == [(s, lr) for s, lr, _ in theirs]
    assert [loss for *_, loss in ours] == pytest.approx([loss for *_, loss in theirs], rel=1e-5)
    rates = [lr for _, lr, _ in ours]  # cosine_with_restarts' restart: near 0, then near the peak again
    assert schedule != "cosine_with_restarts" or any(a < 1e-4 and b > 2.5e-3 for a, b in zip(rates, rates[1:]))
    for key, value in their_weights.items():
        if "attention.self.key.bias" not in key:  # its gradient is rounding alone (docs: the Trainer)
            torch.testing.assert_close(our_weights[key], value, rtol=1e-4, atol=1e-5, msg=key)


@pytest.mark.parametrize(("schedule", "options", "message"), [
    ("linear", {"num_cycles": 2}, r"num_cycles=2: lr_scheduler_type 'linear' takes no options"),
    ("constant_with_warmup", {"num_cycles": 2}, r"'constant_with_warmup' takes no options"),
    ("cosine", {"power": 2.0}, r"power=2.0: lr_scheduler_type 'cosine' takes num_cycles"),
    ("polynomial", {"lr_end": 1e-6, "num_cycles": 1}, r"'polynomial' takes lr_end, power"),
    ("inverse_sqrt", {"timescale": 0}, r"timescale=0: must be a finite number 1 or above"),
    ("polynomial", {"power": float("nan")}, r"power=nan: must be a finite number above 0"),
    ("cosine", {"num_cycles": True}, r"num_cycles=True: must be a finite number above 0"),
    ("cosine", "num_cycles=2", r"'num_cycles=2' is neither a dict nor its JSON text"),
    ("reduce_lr_on_plateau", None, r"'reduce_lr_on_plateau' is not implemented in bertkit \(it lowers the rate on "
                                   r"the evaluations' metric.*choose one of linear, cosine"),
    ("cosine_warmup_with_min_lr", {"min_lr": 1e-5}, r"'cosine_warmup_with_min_lr' is not implemented in bertkit "
                                                    r"\(its warm-up follows a cosine; 'cosine_with_min_lr'"),
])
def test_options_a_schedule_does_not_take_are_refused_naming_them(schedule, options, message):
    """transformers raises a TypeError for a name the schedule does not take, and ignores any given to
    constant_with_warmup; bertkit refuses both when the arguments are made, naming the option and what the schedule
    takes. transformers' schedules bertkit lacks were "not one of (...)": now why, and what to choose."""
    with pytest.raises(BertkitError, match=message):
        bertkit.TrainingArguments("out", lr_scheduler_type=schedule, lr_scheduler_kwargs=options)


def test_options_given_as_json_text_are_read_as_transformers_reads_them():
    args = bertkit.TrainingArguments("out", lr_scheduler_type="polynomial",
                                     lr_scheduler_kwargs='{"lr_end": 1e-6, "power": 2}')
    assert args.lr_scheduler_kwargs == {"lr_end": 1e-6, "power": 2}
    assert bertkit.TrainingArguments("out").lr_scheduler_kwargs == {}


def test_resuming_with_other_schedule_options_is_refused_naming_them(minilm_2_layers, tmp_path):
    """The options change every later rate: a checkpoint written under num_cycles 2 is not resumed under 3."""
    path = tiny_classifier(tmp_path / "m", minilm_2_layers)
    tokenizer = bertkit.AutoTokenizer.from_pretrained(path)
    rows = [{**tokenizer(r["text"]), "label": r["label"]} for r in TRAIN[:8]]

    def trainer(options):
        args = bertkit.TrainingArguments(output_dir=str(tmp_path / "out"), use_cpu=True, disable_tqdm=True,
                                         per_device_train_batch_size=4, max_steps=2, save_steps=1,
                                         lr_scheduler_type="cosine", lr_scheduler_kwargs=options)
        return bertkit.Trainer(model=bertkit.AutoModelForSequenceClassification.from_pretrained(path), args=args,
                               train_dataset=rows, processing_class=tokenizer)

    trainer({"num_cycles": 2}).train()
    with pytest.raises(BertkitError, match=r"cannot resume .*'trainer\.lr_scheduler_kwargs\.num_cycles': \(2, 3\)"):
        trainer({"num_cycles": 3}).train(resume_from_checkpoint=str(tmp_path / "out" / "checkpoint-1"))
    assert trainer({"num_cycles": 2}).train(resume_from_checkpoint=str(tmp_path / "out" / "checkpoint-1")).global_step == 2


@pytest.mark.parametrize("optim", ["adafactor", "sgd", "adamw_8bit", "rmsprop"])
def test_an_optimiser_bertkit_lacks_is_refused_naming_adamw_and_its_settings(optim):
    """It said "optim 'adafactor' is not one of (...)": now that the loop trains with AdamW and what sets it."""
    with pytest.raises(BertkitError, match=rf"optim '{optim}' is not implemented in bertkit: its loop trains with "
                                           r"torch.optim.AdamW \(optim 'adamw_torch' or 'adamw_torch_fused'.*adam_beta1"):
        bertkit.TrainingArguments("out", optim=getattr(transformers.training_args.OptimizerNames, optim.upper()))
    assert bertkit.TrainingArguments("out", optim=transformers.training_args.OptimizerNames.ADAMW_TORCH).optim == \
        "adamw_torch"


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
