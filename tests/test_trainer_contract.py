"""bertkit.Trainer keeps transformers' callback contract, best-model and resume rules.

One recording callback runs under transformers' Trainer and under bertkit's on the same tiny checkpoint and data:
both must call the same events in the same order, each seeing the same global_step and epoch, and on_save must
find checkpoint-N whole. A steering callback sets each of TrainerControl's flags at its own step, under both
libraries, and each flag must do there what it does in transformers. Then the best model (an eval set without
labels, a NaN metric) and resume (other data of the same size, a killed checkpoint write, save_total_limit across
kills, a stray checkpoint directory).
"""

from __future__ import annotations

import json
import logging
import math
import re
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch

import bertkit
from bertkit import staging
from bertkit.errors import BertkitError
from trainer_helpers import TEST, TRAIN, KillAt, Killed, _losses, accuracy, tiny_classifier

transformers = pytest.importorskip("transformers")
datasets = pytest.importorskip("datasets")
pytest.importorskip("accelerate")  # transformers' Trainer needs it

EVENTS = ("on_init_end", "on_train_begin", "on_epoch_begin", "on_step_begin", "on_pre_optimizer_step",
          "on_optimizer_step", "on_substep_end", "on_step_end", "on_evaluate", "on_predict", "on_save", "on_log",
          "on_prediction_step", "on_epoch_end", "on_train_end")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, minilm_2_layers) -> Path:
    return tiny_classifier(tmp_path_factory.mktemp("contract") / "tiny-classifier", minilm_2_layers)


def _recorder(lib, steer=None):
    """A callback of ``lib`` recording (event, global_step, epoch, and at on_save whether checkpoint-N is whole);
    ``steer(event, state, control)`` may set control flags."""

    class Recorder(lib.TrainerCallback):
        def __init__(self):
            self.seen = []

    def make(name):
        def event(self, args, state, control, **kwargs):
            row = (name, state.global_step, None if state.epoch is None else round(state.epoch, 4))
            if name == "on_save":
                done = Path(args.output_dir) / f"checkpoint-{state.global_step}"
                row += (all((done / f).is_file() for f in ("trainer_state.json", "model.safetensors", "config.json")),)
            self.seen.append(row)
            if steer is not None:
                steer(name, state, control)
        return event

    for name in EVENTS:
        setattr(Recorder, name, make(name))
    return Recorder()


def _run(lib, checkpoint: Path, out: Path, steer=None, callbacks_extra=None, **overrides):
    tokenizer = lib.AutoTokenizer.from_pretrained(checkpoint)
    model = lib.AutoModelForSequenceClassification.from_pretrained(checkpoint)

    def tokenize(batch):
        return tokenizer(batch["text"], truncation=True)

    train = datasets.Dataset.from_list(TRAIN[:16]).map(tokenize, batched=True)
    test = datasets.Dataset.from_list(TEST[:5]).map(tokenize, batched=True)
    settings = dict(output_dir=str(out), learning_rate=1e-3, per_device_train_batch_size=2,
                    per_device_eval_batch_size=4, gradient_accumulation_steps=2, num_train_epochs=2, logging_steps=1,
                    eval_strategy="steps", eval_steps=3, save_strategy="steps", save_steps=3, report_to="none",
                    use_cpu=True, seed=7, disable_tqdm=True)
    recorder = _recorder(lib, steer)
    trainer = lib.Trainer(model=model, args=lib.TrainingArguments(**{**settings, **overrides}), train_dataset=train,
                          eval_dataset=test, processing_class=tokenizer, compute_metrics=accuracy,
                          callbacks=[recorder] + ([callbacks_extra] if callbacks_extra else []))
    trainer.train()
    trainer.evaluate()
    trainer.predict(test)
    return recorder.seen, trainer


@pytest.mark.parametrize("overrides", [
    {},  # accumulation (substeps), evaluation and checkpoints every 3 steps, the last step's
    # cut short; an epoch's log comes after on_epoch_end, the cut epoch's too
    pytest.param(dict(gradient_accumulation_steps=1, max_steps=11, logging_strategy="epoch", eval_strategy="epoch",
                      save_strategy="epoch"), marks=pytest.mark.slow),
], ids=["steps", "epochs"])
def test_callbacks_see_what_transformers_callbacks_see(checkpoint, tmp_path, overrides):
    theirs, _ = _run(transformers, checkpoint, tmp_path / "hf", **overrides)
    ours, _ = _run(bertkit, checkpoint, tmp_path / "bk", **overrides)
    assert ours == theirs
    assert {"on_epoch_begin", "on_step_begin", "on_save"} <= {e[0] for e in ours}
    assert [e for e in ours if e[0] == "on_save"] and all(e[3] for e in ours if e[0] == "on_save")


def test_an_evaluation_at_the_last_step_before_the_epochs_log_is_not_run_again(checkpoint, tmp_path):
    """logging_strategy "epoch" with evaluations every 2 of 4 steps: the last step's evaluation comes before the
    epoch's log, and bertkit's end of the run, finding the log newest, evaluated step 4 again (a second record and
    on_evaluate at step 4, which transformers does not have)."""
    settings = dict(per_device_train_batch_size=4, gradient_accumulation_steps=1, num_train_epochs=1,
                    logging_strategy="epoch", eval_steps=2, save_strategy="no")
    theirs, reference = _run(transformers, checkpoint, tmp_path / "hf", **settings)
    ours, trainer = _run(bertkit, checkpoint, tmp_path / "bk", **settings)
    assert ours == theirs
    steps = [(h["step"], "eval_loss" in h) for h in trainer.state.log_history if "eval_loss" in h or "loss" in h]
    assert steps == [(2, True), (4, True), (4, False), (4, True)]  # the last: the evaluate() after train()
    assert steps == [(h["step"], "eval_loss" in h) for h in reference.state.log_history if "eval_loss" in h or "loss" in h]


def test_a_run_a_callback_stops_is_neither_evaluated_nor_saved_there_off_schedule(checkpoint, tmp_path):
    """A callback stopping the run at step 5 of 8 (evaluations and checkpoints every 3 steps, the best loaded at the
    end): transformers evaluates and saves at step 3 only; bertkit's end of the run evaluated step 5 and wrote
    checkpoint-5 as at a run's last step, and that evaluation could be the best whose weights it loaded."""

    def stop(name, state, control):
        if name == "on_step_end" and state.global_step == 5:
            control.should_training_stop = True

    settings = dict(steer=stop, load_best_model_at_end=True)
    theirs, reference = _run(transformers, checkpoint, tmp_path / "hf", **settings)
    ours, trainer = _run(bertkit, checkpoint, tmp_path / "bk", **settings)
    assert ours == theirs
    evaluated = [h["step"] for h in trainer.state.log_history if "eval_loss" in h]
    assert evaluated == [h["step"] for h in reference.state.log_history if "eval_loss" in h] == [3, 5]  # 5: the evaluate() after train()
    assert [p.name for p in (tmp_path / "bk").glob("checkpoint-*")] == ["checkpoint-3"]
    assert Path(trainer.state.best_model_checkpoint).name == Path(reference.state.best_model_checkpoint).name


@pytest.mark.parametrize("length", [dict(max_steps=6), dict(num_train_epochs=1.5)], ids=["max_steps", "epochs"])
def test_the_state_callbacks_see_counts_epochs_as_transformers_does(checkpoint, tmp_path, length):
    """state.num_train_epochs is the number of epochs the run begins (2 for 6 steps of 4 an epoch, or 1.5 epochs),
    as transformers sets it; bertkit gave the fraction, 1.5. The cadences in steps are there, a share of the run
    resolved (logging_steps 0.25 of 6 steps: 2), as transformers states them; bertkit's state had none."""
    seen = {"transformers": [], "bertkit": []}
    for lib in (transformers, bertkit):
        def steer(name, state, control, found=seen[lib.__name__]):
            if name == "on_train_begin":
                found.append((state.max_steps, state.num_train_epochs, state.logging_steps, state.eval_steps,
                              state.save_steps))

        _run(lib, checkpoint, tmp_path / lib.__name__, steer=steer, eval_strategy="steps", eval_steps=None,
             save_strategy="no", save_steps=0.5, logging_steps=0.25, **length)
    assert seen["bertkit"] == seen["transformers"] == [(6, 2, 2, 2, 3)]


def _steer(name, state, control):
    """Each flag at its own step (16 rows, batches of 4: 4 steps an epoch; nothing scheduled but the log at 8)."""
    if name == "on_step_end" and state.global_step == 1:
        control.should_save = True  # save_strategy "no": checkpoint-1 anyway
    if name == "on_step_begin" and state.global_step == 1:
        control.should_evaluate = True  # set before the step, acted on at its end: an evaluation at step 2
    if name == "on_evaluate" and state.global_step == 2:
        control.should_save = True  # the "save when evaluated" pattern: checkpoint-2
    if name == "on_step_end" and state.global_step == 3:
        control.should_log = True  # logging_steps 8: a log at step 3 anyway
    if name == "on_step_end" and state.global_step == 5:
        control.should_epoch_stop = True  # epoch 1 ends after its first step; epoch 2 starts at step 6
    if name == "on_step_end" and state.global_step == 7:
        control.should_training_stop = True  # of 12 steps, 7 run


def test_the_last_step_stops_the_run_as_transformers_flow_callback_does(checkpoint, tmp_path):
    """transformers' DefaultFlowCallback sets should_training_stop at the run's last step, before the callbacks after
    it see on_step_end, and the last checkpoint's trainer_state.json records it so; bertkit's loop ended the run by
    counting steps, so a callback saw False there and the checkpoint said the run had not ended."""
    seen = {"transformers": [], "bertkit": []}
    for lib in (transformers, bertkit):
        def steer(name, state, control, found=seen[lib.__name__]):
            if name in ("on_step_end", "on_save", "on_train_end"):
                found.append((name, state.global_step, control.should_training_stop))

        _run(lib, checkpoint, tmp_path / lib.__name__, steer=steer, eval_strategy="no", max_steps=2, save_steps=2)
    assert seen["bertkit"] == seen["transformers"]
    assert ("on_step_end", 2, True) in seen["bertkit"]
    states = [json.loads((tmp_path / lib / "checkpoint-2" / "trainer_state.json").read_text())
              for lib in ("transformers", "bertkit")]
    flags = [s["stateful_callbacks"]["TrainerControl"]["args"] for s in states]
    assert flags[1] == flags[0] and flags[1]["should_training_stop"] is True


def test_every_control_flag_does_what_it_does_in_transformers(checkpoint, tmp_path):
    settings = dict(per_device_train_batch_size=4, gradient_accumulation_steps=1, num_train_epochs=3,
                    logging_steps=8, eval_strategy="no", save_strategy="no", steer=_steer)
    theirs, reference = _run(transformers, checkpoint, tmp_path / "hf", **settings)
    ours, trainer = _run(bertkit, checkpoint, tmp_path / "bk", **settings)
    assert ours == theirs
    history = trainer.state.log_history
    # train_loss is the mean of the 7 steps trained, the 4 after the last log (at 3) too, as transformers reports it
    train_loss = [[h["train_loss"] for h in t.state.log_history if "train_loss" in h] for t in (trainer, reference)]
    assert train_loss[0] == pytest.approx(train_loss[1], rel=1e-5)
    assert sorted(p.name for p in (tmp_path / "bk").glob("checkpoint-*")) == ["checkpoint-1", "checkpoint-2"]  # save
    assert [h["step"] for h in history if "eval_loss" in h][:1] == [2]  # should_evaluate
    assert [h["step"] for h in history if "loss" in h] == [3]  # should_log
    assert [e[1:] for e in ours if e[0] == "on_epoch_end"] == [(4, 1.0), (5, 1.25), (7, 2.5)]  # should_epoch_stop
    assert trainer.state.global_step == 7  # should_training_stop


def _trainer(checkpoint: Path, out: Path, train=TRAIN, eval_rows=TEST, collator=None, **overrides):
    tokenizer = bertkit.AutoTokenizer.from_pretrained(checkpoint)
    model = bertkit.AutoModelForSequenceClassification.from_pretrained(checkpoint)
    rows = [{**tokenizer(r["text"], truncation=True), "label": r["label"]} for r in train]
    test = [{**tokenizer(r["text"], truncation=True), **({"label": r["label"]} if "label" in r else {})}
            for r in eval_rows]
    settings = dict(output_dir=str(out), learning_rate=1e-3, per_device_train_batch_size=4, max_steps=8,
                    logging_steps=1, save_steps=2, report_to="none", use_cpu=True, seed=3, disable_tqdm=True)
    return bertkit.Trainer(model=model, args=bertkit.TrainingArguments(**{**settings, **overrides}),
                           train_dataset=rows, eval_dataset=test, processing_class=tokenizer, data_collator=collator,
                           compute_metrics=accuracy)


def test_load_best_model_at_end_without_eval_labels_is_refused_before_training(checkpoint, tmp_path):
    unlabelled = [{"text": r["text"]} for r in TEST]
    trainer = _trainer(checkpoint, tmp_path / "run", eval_rows=unlabelled, eval_strategy="steps", eval_steps=2,
                       load_best_model_at_end=True)
    with pytest.raises(BertkitError, match=r"metric_for_best_model 'loss' needs labels in eval_dataset \("
                                           r"load_best_model_at_end.*'label'"):
        trainer.train()
    assert not (tmp_path / "run").exists()


def test_a_subclass_overriding_a_method_bertkit_never_calls_is_refused(checkpoint, tmp_path):
    """transformers calls training_step for each micro-batch; bertkit's loop runs the step itself, so an override of
    it would be skipped without a word. (compute_loss is called by both: tests/test_trainer_loss.py.)"""
    losses = {}
    for lib in (transformers, bertkit):
        class Stepped(lib.Trainer):
            def training_step(self, model, inputs, num_items_in_batch=None):
                return super().training_step(model, inputs, num_items_in_batch) * 0

        class Logged(lib.Trainer):  # log is called by both: an override of it is honoured
            seen = losses.setdefault(lib.__name__, [])

            def log(self, logs, *args):
                self.seen.extend([logs["loss"]] if "loss" in logs else [])
                super().log(logs, *args)

        tokenizer = lib.AutoTokenizer.from_pretrained(checkpoint)
        rows = [{**tokenizer(r["text"]), "label": r["label"]} for r in TRAIN]
        args = lib.TrainingArguments(output_dir=str(tmp_path / lib.__name__), use_cpu=True, report_to="none",
                                     max_steps=2, logging_steps=1, save_strategy="no", disable_tqdm=True, seed=3)
        model = lib.AutoModelForSequenceClassification.from_pretrained(checkpoint)
        if lib is bertkit:
            with pytest.raises(BertkitError, match=r"^Stepped overrides training_step, which transformers' Trainer "
                                                   r"calls and bertkit's never does"):
                Stepped(model=model, args=args, train_dataset=rows, processing_class=tokenizer)
        Logged(model=model, args=args, train_dataset=rows, processing_class=tokenizer).train()
    np.testing.assert_allclose(losses["bertkit"], losses["transformers"], rtol=1e-5)
    assert len(losses["bertkit"]) == 2


def _hidden_states_trainer(lib, checkpoint: Path, out: Path):
    tokenizer = lib.AutoTokenizer.from_pretrained(checkpoint)
    model = lib.AutoModelForSequenceClassification.from_pretrained(checkpoint, output_hidden_states=True)
    rows = [{**tokenizer(r["text"]), "label": r["label"]} for r in TEST]
    args = lib.TrainingArguments(output_dir=str(out), use_cpu=True, report_to="none", max_steps=2,
                                 eval_strategy="epoch", save_strategy="no", disable_tqdm=True)
    return lib.Trainer(model=model, args=args, train_dataset=rows, eval_dataset=rows, processing_class=tokenizer), rows


def test_hidden_states_in_predictions_are_refused_unless_ignored(checkpoint, tmp_path):
    """With output_hidden_states, transformers' predictions are (logits, hidden_states): a compute_metrics reading
    predictions[0] gets the logits there. bertkit gave the logits alone, so predictions[0] was the first row."""
    trainer, rows = _hidden_states_trainer(transformers, checkpoint, tmp_path / "hf")
    theirs = trainer.predict(rows).predictions
    assert isinstance(theirs, tuple) and len(theirs) == 2 and theirs[0].shape == (len(TEST), 2)
    trainer, rows = _hidden_states_trainer(bertkit, checkpoint, tmp_path / "bk")
    for call, fix in ((partial(trainer.predict, rows), "predict(ignore_keys=['hidden_states'])"),
                      (trainer.evaluate, "evaluate(ignore_keys=['hidden_states'])"),
                      (trainer.train, "train(ignore_keys_for_eval=['hidden_states'])")):
        with pytest.raises(BertkitError, match=re.escape(
                "(logits, hidden_states) and bertkit returns the logits alone, so predictions[0] would be the "
                f"logits there and the first row here; pass {fix}")):
            call()
    assert not (tmp_path / "bk").exists()  # refused before anything was written
    ours = trainer.predict(rows, ignore_keys=["hidden_states"]).predictions
    np.testing.assert_allclose(ours, theirs[0], rtol=1e-5, atol=1e-6)
    assert trainer.train(ignore_keys_for_eval=["hidden_states"]).global_step == 2


def test_a_nan_metric_never_becomes_the_best(checkpoint, tmp_path, caplog):
    calls = []

    def nan_first(eval_pred):  # the check before training, then NaN at the first evaluation
        calls.append(1)
        return {"score": math.nan if len(calls) <= 2 else accuracy(eval_pred)["accuracy"]}

    trainer = _trainer(checkpoint, tmp_path / "run", eval_strategy="steps", eval_steps=2, load_best_model_at_end=True,
                       metric_for_best_model="score")
    trainer.compute_metrics = nan_first
    with caplog.at_level(logging.WARNING, logger="bertkit"):
        trainer.train()
    scores = [(h["step"], h["eval_score"]) for h in trainer.state.log_history if "eval_score" in h]
    assert scores[0][0] == 2 and math.isnan(scores[0][1]) and all(math.isfinite(s) for _, s in scores[1:])
    assert trainer.state.best_metric == max(s for _, s in scores[1:])
    assert trainer.state.best_global_step != 2 and not trainer.state.best_model_checkpoint.endswith("checkpoint-2")
    assert "eval_score is nan at step 2" in caplog.text



def test_a_metric_for_best_model_that_is_no_number_is_refused_before_training(checkpoint, tmp_path):
    """compute_metrics returning a string for metric_for_best_model failed with numpy's TypeError (ufunc 'isnan'
    not supported) at the first evaluation, after a step was trained and logged, as transformers fails."""
    trainer = _trainer(checkpoint, tmp_path / "run", eval_strategy="steps", eval_steps=2,
                       metric_for_best_model="score")
    trainer.compute_metrics = lambda eval_pred: {"score": "high"}
    with pytest.raises(BertkitError, match=r"^metric_for_best_model 'score' is str 'high' at step 0, which is not a "
                                           r"number to compare: return it from compute_metrics as a float"):
        trainer.train()
    assert not (tmp_path / "run").exists()


def test_early_stopping_counts_an_infinite_metric_as_no_improvement():
    """The Trainer never takes an infinite metric for the best; EarlyStoppingCallback counted it as an improvement
    (inf > 0.5), so patience was reset by an evaluation the best checkpoint ignores."""
    from types import SimpleNamespace

    from bertkit.training.callbacks import EarlyStoppingCallback

    args = SimpleNamespace(metric_for_best_model="score", greater_is_better=True)
    for value, stops in ((math.inf, True), (math.nan, True), (np.float32(0.7), False)):
        callback, control = EarlyStoppingCallback(early_stopping_patience=1), SimpleNamespace(should_training_stop=False)
        callback.on_evaluate(args, SimpleNamespace(best_metric=0.5, global_step=4), control,
                             metrics={"eval_score": value})
        assert control.should_training_stop is stops, value

class _Evaluations:
    """Records each evaluation's metrics as on_evaluate gets them, and the best checkpoint each on_save sees."""

    @staticmethod
    def of(lib, seen):
        class Recorder(lib.TrainerCallback):
            def on_evaluate(self, args, state, control, metrics=None, **kwargs):
                seen.append(("evaluate", state.global_step, sorted(metrics), metrics.get("epoch")))

            def on_save(self, args, state, control, **kwargs):
                best = state.best_model_checkpoint
                seen.append(("save", state.global_step, best and Path(best).name, state.best_global_step))
        return Recorder()


@pytest.mark.parametrize(("overrides", "best_step"), [
    # the loss as a metric to maximise: the best is the first evaluation (step 2), which has no checkpoint
    (dict(eval_steps=2, save_steps=4, load_best_model_at_end=True, metric_for_best_model="loss",
          greater_is_better=True), 2),
    (dict(eval_steps=2, save_strategy="no", metric_for_best_model="accuracy"), None),  # no checkpoint at all
], ids=["best-step-unsaved", "no-checkpoints"])
def test_the_best_checkpoint_is_one_that_was_written_as_in_transformers(checkpoint, tmp_path, overrides, best_step):
    """The best checkpoint is named when a checkpoint is written, as transformers names it: bertkit named
    checkpoint-2 at the evaluation of step 2, which no save wrote, then load_best_model_at_end failed reading it
    after the whole run (FileNotFoundError), and with save_strategy "no" state named a checkpoint that never was.
    Each evaluation's on_evaluate metrics carry the epoch, as transformers' do (bertkit's lacked it in training)."""
    seen = {"transformers": [], "bertkit": []}
    trainers = {}
    for lib in (transformers, bertkit):
        _, trainers[lib.__name__] = _run(lib, checkpoint, tmp_path / lib.__name__, eval_strategy="steps",
                                         gradient_accumulation_steps=1, per_device_train_batch_size=4,
                                         callbacks_extra=_Evaluations.of(lib, seen[lib.__name__]), **overrides)
    assert seen["bertkit"] == seen["transformers"]
    assert [e[3] for e in seen["bertkit"] if e[0] == "evaluate"] == [0.5, 1.0, 1.5, 2.0, 2.0]
    ours, theirs = trainers["bertkit"].state, trainers["transformers"].state
    assert ours.best_global_step == theirs.best_global_step == best_step
    assert theirs.best_model_checkpoint is None
    assert ours.best_metric == pytest.approx(theirs.best_metric, rel=1e-5)
    assert (ours.best_model_checkpoint and Path(ours.best_model_checkpoint).name) == \
        (theirs.best_model_checkpoint and Path(theirs.best_model_checkpoint).name)
    if ours.best_model_checkpoint is not None:
        assert Path(ours.best_model_checkpoint).is_dir()


def test_resuming_on_other_data_of_the_same_size_is_refused_naming_it(checkpoint, tmp_path):
    with pytest.raises(Killed):
        trainer = _trainer(checkpoint, tmp_path / "run")
        trainer.add_callback(KillAt(3))
        trainer.train()
    before = {p: p.stat().st_mtime_ns for p in (tmp_path / "run").rglob("*")}
    other = [dict(r) for r in TRAIN]
    other[5] = {"text": "not a fun movie", "label": 0}  # same size, one example changed
    with pytest.raises(BertkitError, match=r"other settings or data .*'trainer\.train_data'"):
        _trainer(checkpoint, tmp_path / "run", train=other).train(resume_from_checkpoint=True)
    collator = bertkit.DataCollatorWithPadding(bertkit.AutoTokenizer.from_pretrained(checkpoint), pad_to_multiple_of=8)
    with pytest.raises(BertkitError, match=r"'trainer\.data_collator\.DataCollatorWithPadding\.pad_to_multiple_of'"):
        _trainer(checkpoint, tmp_path / "run", collator=collator).train(resume_from_checkpoint=True)
    # label smoothing changes every loss and gradient after the checkpoint: it was taken, and the run went on with
    # other losses and weights than the run it resumed, without a word
    with pytest.raises(BertkitError, match=r"'trainer\.label_smoothing_factor': \(None, 0\.3\)"):
        _trainer(checkpoint, tmp_path / "run", label_smoothing_factor=0.3).train(resume_from_checkpoint=True)
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "run").rglob("*")} == before  # refused before any write
    assert _trainer(checkpoint, tmp_path / "run").train(resume_from_checkpoint=True).global_step == 8


def test_a_killed_checkpoint_write_leaves_nothing_a_later_run_keeps(checkpoint, tmp_path, monkeypatch):
    import bertkit.training.checkpoint as ckpt
    from bertkit import dir_lock

    out = tmp_path / "run"
    real_save = torch.save

    def killed_at_4(obj, path, *args, **kwargs):
        real_save(obj, path, *args, **kwargs)
        if Path(path).parent.name == ".checkpoint-4.bertkit-staging":
            raise Killed  # the process dies after state.pt, before the rename

    monkeypatch.setattr(ckpt.torch, "save", killed_at_4)
    monkeypatch.setattr(staging.Stage, "abort", lambda self, keep=False: dir_lock.unlock(self.path))  # no clean-up
    with pytest.raises(Killed):
        _trainer(checkpoint, out).train()
    monkeypatch.undo()
    assert (out / ".checkpoint-4.bertkit-staging" / "state.pt").is_file()
    user = out / ".checkpoint-9.bertkit-staging"
    user.mkdir()
    (user / "notes.txt").write_text("mine")  # a user's directory of that name (no .bertkit-partial): kept
    _trainer(checkpoint, out, save_steps=3).train(resume_from_checkpoint=True)  # checkpoint-4 is never written again
    assert sorted(p.name for p in out.glob(".checkpoint-*")) == [user.name]
    assert (user / "notes.txt").read_text() == "mine"


def test_save_total_limit_holds_across_killed_runs(checkpoint, tmp_path):
    out = tmp_path / "run"
    for kill in (3, 5, 7):  # each run killed, the next resumes as a new process
        trainer = _trainer(checkpoint, out, save_total_limit=2)
        trainer.add_callback(KillAt(kill))
        with pytest.raises(Killed):
            trainer.train(resume_from_checkpoint=True if kill > 3 else None)
        assert len(list(out.glob("checkpoint-*"))) <= 2
    _trainer(checkpoint, out, save_total_limit=2).train(resume_from_checkpoint=True)
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-6", "checkpoint-8"]


def test_an_epochs_log_after_a_checkpoint_at_its_last_step_survives_a_kill_between_the_two(checkpoint, tmp_path):
    """logging_strategy "epoch" logs after on_epoch_end, so after the checkpoint of the epoch's last step (4 steps
    an epoch, save_steps 4): a run killed between the two, or later in the next epoch (its metrics.jsonl holding the
    log, its checkpoint's trainer_state.json not), logs that epoch when resumed there, once, as the whole run did."""

    class KillAtSave(bertkit.TrainerCallback):
        def on_save(self, args, state, control, **kwargs):
            if state.global_step == 4:
                raise Killed

    settings = dict(train=TRAIN[:16], logging_strategy="epoch", save_steps=4)
    whole = _trainer(checkpoint, tmp_path / "whole", **settings)
    whole.train()
    assert [step for step, _, _ in _losses(whole.state.log_history)] == [4, 8]
    for kill in (KillAtSave(), KillAt(6)):
        out = tmp_path / type(kill).__name__
        killed = _trainer(checkpoint, out, **settings)
        killed.add_callback(kill)
        with pytest.raises(Killed):
            killed.train()
        again = _trainer(checkpoint, out, **settings)
        again.train(resume_from_checkpoint=True)
        logs = [[h for h in t.state.log_history if "loss" in h] for t in (again, whole)]
        assert logs[0] == logs[1] and {"grad_norm", "learning_rate"} <= set(logs[0][0])
        assert [r["step"] for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())
                if r["split"] == "train"] == [4, 8]


@pytest.mark.parametrize("limit", [pytest.param(1, marks=pytest.mark.slow), 2, pytest.param(3, marks=pytest.mark.slow),
                                   0])
def test_save_total_limit_counts_the_best_checkpoint_as_transformers_does(checkpoint, tmp_path, limit):
    """save_total_limit is the number of checkpoints in all, the best and the newest among them (transformers'
    rotate_checkpoints); bertkit kept save_total_limit others beside the best: one more than asked. 0 keeps every
    checkpoint, as transformers reads it (it was refused: 'must be at least 1')."""
    kept = {}
    for lib in (transformers, bertkit):
        out, kept[lib.__name__] = tmp_path / lib.__name__, []

        def steer(name, state, control, out=out, seen=kept[lib.__name__]):
            if name == "on_save":  # after transformers' rotation, and bertkit's
                seen.append((state.global_step, sorted(p.name for p in out.glob("checkpoint-*"))))

        # the loss read as greater-is-better: the best checkpoint is an early one, so it differs from the newest
        _run(lib, checkpoint, out, steer=steer, max_steps=6, eval_steps=1, save_steps=1, learning_rate=3e-3,
             load_best_model_at_end=True, metric_for_best_model="eval_loss", greater_is_better=True,
             save_total_limit=limit)
    assert kept["bertkit"] == kept["transformers"]
    assert [len(names) for _, names in kept["bertkit"]] == [min(step, max(limit, 2)) if limit > 0 else step
                                                            for step in range(1, 7)]


def test_a_stray_checkpoint_directory_never_makes_rotation_remove_the_newest(checkpoint, tmp_path):
    out = tmp_path / "run"
    with pytest.raises(Killed):
        trainer = _trainer(checkpoint, out, save_total_limit=1)
        trainer.add_callback(KillAt(5))
        trainer.train()
    (out / "checkpoint-999").mkdir()  # empty: resuming passes over it, with a warning
    trainer = _trainer(checkpoint, out, save_total_limit=1)
    trainer.train(resume_from_checkpoint=True)
    # checkpoint-999 sorted newest, so rotation took checkpoint-8, just written, for an old one and removed it
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-8", "checkpoint-999"]
    saved = bertkit.AutoModelForSequenceClassification.from_pretrained(out / "checkpoint-8")
    for (name, a), (_, b) in zip(trainer.model.state_dict().items(), saved.state_dict().items()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)


def test_early_stopping_resumed_stops_where_the_uninterrupted_run_stops(checkpoint, tmp_path):
    """EarlyStoppingCallback(patience 2) on accuracy evaluated every 2 steps: the run improves at step 2 only and
    stops at step 6. Killed at step 5, it resumed from checkpoint-4 with its patience counted from 0 again (the
    counter was not in the checkpoint; transformers restores it only with restore_callback_states_from_checkpoint)
    and trained on to step 8. The counter is now recorded in trainer_state.json's stateful_callbacks, as
    transformers records it, and the resumed run stops at step 6, with the same log."""
    settings = dict(max_steps=40, eval_strategy="steps", eval_steps=2, save_steps=2, metric_for_best_model="accuracy")

    def run(out, *callbacks, **overrides):
        trainer = _trainer(checkpoint, out, **settings, **overrides)
        for callback in (bertkit.EarlyStoppingCallback(early_stopping_patience=2), *callbacks):
            trainer.add_callback(callback)
        return trainer

    whole = run(tmp_path / "whole")
    assert whole.train().global_step == 6
    with pytest.raises(Killed):
        run(tmp_path / "cut", KillAt(5)).train()
    state = json.loads((tmp_path / "cut" / "checkpoint-4" / "trainer_state.json").read_text())
    assert state["stateful_callbacks"] == {"EarlyStoppingCallback": {
        "args": {"early_stopping_patience": 2, "early_stopping_threshold": 0.0},
        "attributes": {"early_stopping_patience_counter": 1}}, "TrainerControl": {
        "args": {"should_epoch_stop": False, "should_evaluate": False, "should_log": False, "should_save": True,
                 "should_training_stop": False}, "attributes": {}}}  # the entry transformers' resume needs, as it
    # writes it: should_save still set while the checkpoint is written (bertkit wrote False)
    resumed = run(tmp_path / "cut")
    assert resumed.train(resume_from_checkpoint=True).global_step == 6
    assert _losses(resumed.state.log_history) == _losses(whole.state.log_history)
    assert [h["step"] for h in resumed.state.log_history if "eval_loss" in h] == [2, 4, 6]
    # transformers' switch for it is taken (True was refused); a run restores them whatever it says
    again = run(tmp_path / "cut", restore_callback_states_from_checkpoint=True)
    assert again.train(resume_from_checkpoint=str(tmp_path / "cut" / "checkpoint-4")).global_step == 6


def test_eval_on_start_is_not_repeated_by_a_resumed_run(checkpoint, tmp_path):
    """eval_on_start: the run's step-0 evaluation is in the log it resumes. A run killed at step 5 and resumed
    from checkpoint-4 evaluated again before loading the checkpoint, and logged the untrained model's loss
    (0.6902, step 0's) as step 4's evaluation beside the true one (transformers evaluates again too, the loaded
    model); it now logs the uninterrupted run's evaluations, once each."""
    settings = dict(eval_on_start=True, eval_strategy="steps", eval_steps=4)
    whole = _trainer(checkpoint, tmp_path / "whole", **settings)
    whole.train()
    with pytest.raises(Killed):
        killed = _trainer(checkpoint, tmp_path / "cut", **settings)
        killed.add_callback(KillAt(5))
        killed.train()
    resumed = _trainer(checkpoint, tmp_path / "cut", **settings)
    resumed.train(resume_from_checkpoint=True)

    def evaluations(trainer):
        return [(h["step"], h["eval_loss"], h["eval_accuracy"]) for h in trainer.state.log_history if "eval_loss" in h]

    assert [step for step, _, _ in evaluations(whole)] == [0, 4, 8]
    assert evaluations(resumed) == evaluations(whole)


def test_a_resumed_runs_on_train_begin_sees_the_checkpoints_weights_as_transformers(checkpoint, tmp_path):
    """transformers loads the checkpoint's weights before on_train_begin, so a callback there (an EMA's copy, a
    weight-norm log) sees the model the run continues; bertkit's loop loaded them after it, and the callback saw
    the weights the script loaded, the untrained checkpoint's."""
    seen = {}
    for lib in (transformers, bertkit):
        class Snapshot(lib.TrainerCallback):
            def on_train_begin(self, args, state, control, model=None, name=lib.__name__, **kwargs):
                seen[name] = {k: v.detach().clone() for k, v in model.state_dict().items()}

        out = tmp_path / lib.__name__
        _run(lib, checkpoint, out, max_steps=4, save_steps=3, eval_strategy="no")
        tokenizer = lib.AutoTokenizer.from_pretrained(checkpoint)
        model = lib.AutoModelForSequenceClassification.from_pretrained(checkpoint)
        rows = datasets.Dataset.from_list(TRAIN[:16]).map(lambda b, t=tokenizer: t(b["text"], truncation=True),
                                                         batched=True)
        args = lib.TrainingArguments(output_dir=str(out), learning_rate=1e-3, per_device_train_batch_size=2,
                                     gradient_accumulation_steps=2, max_steps=4, save_steps=3, report_to="none",
                                     use_cpu=True, seed=7, disable_tqdm=True)
        lib.Trainer(model=model, args=args, train_dataset=rows, processing_class=tokenizer,
                    callbacks=[Snapshot()]).train(resume_from_checkpoint=str(out / "checkpoint-3"))
    start = bertkit.AutoModelForSequenceClassification.from_pretrained(checkpoint).state_dict()
    saved = bertkit.AutoModelForSequenceClassification.from_pretrained(tmp_path / "bertkit" / "checkpoint-3")
    name = "classifier.weight"
    assert not torch.equal(seen["bertkit"][name], start[name])  # not the weights the script loaded
    torch.testing.assert_close(seen["bertkit"][name], saved.state_dict()[name], rtol=0, atol=0)
    torch.testing.assert_close(seen["bertkit"][name], seen["transformers"][name], rtol=1e-4, atol=1e-5)


def test_resume_passes_over_a_stray_checkpoint_directory(checkpoint, tmp_path, caplog):
    out = tmp_path / "run"
    with pytest.raises(Killed):
        trainer = _trainer(checkpoint, out)
        trainer.add_callback(KillAt(5))
        trainer.train()
    (out / "checkpoint-999").mkdir()
    (out / "checkpoint-999" / "README.md").write_text("a user's")
    with caplog.at_level(logging.WARNING, logger="bertkit"):
        result = _trainer(checkpoint, out).train(resume_from_checkpoint=True)
    assert result.global_step == 8
    assert f"resuming from {out / 'checkpoint-4'}" in caplog.text
    assert "skipped checkpoint-999 (it has no state.pt or trainer_state.json" in caplog.text
    assert (out / "checkpoint-999" / "README.md").read_text() == "a user's"


def test_a_second_train_call_is_refused_as_transformers_would_go_on_with_the_first_ones_optimiser(checkpoint, tmp_path):
    """transformers' Trainer keeps its optimiser across train() calls: a second call goes on with AdamW's moments and
    step count (same first loss, then 0.69354 against a fresh optimiser's 0.69411 at step 2 on SST-2 rows). bertkit's
    loop builds a new one, so a second call is refused before it trains or writes anything."""
    out = tmp_path / "run"
    trainer = _trainer(checkpoint, out, max_steps=2, save_strategy="no")
    first = trainer.train()
    weights = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    files = sorted((p.name, p.stat().st_size) for p in out.iterdir())
    with pytest.raises(BertkitError, match=r"train\(\) was called before on this Trainer.*new Trainer"):
        trainer.train()
    assert sorted((p.name, p.stat().st_size) for p in out.iterdir()) == files
    for name, value in trainer.model.state_dict().items():
        torch.testing.assert_close(value, weights[name], rtol=0, atol=0, msg=name)
    assert trainer.state.global_step == first.global_step == 2
