"""The Trainer's evaluation and prediction options against transformers' Trainer on one tiny checkpoint: what
``compute_metrics`` is handed (``EvalPrediction``'s fields, per batch with ``batch_eval_metrics``), what ``evaluate``
and ``predict`` return, ``eval_on_start``, and the example scripts' reports (``log_metrics``, ``save_metrics``,
``save_state``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

import bertkit
from bertkit.errors import BertkitError
from cases import slow_after
from trainer_helpers import TEST, TRAIN, tiny_classifier

transformers = pytest.importorskip("transformers")
datasets = pytest.importorskip("datasets")
pytest.importorskip("accelerate")  # transformers' Trainer needs it


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, minilm_2_layers) -> Path:
    return tiny_classifier(tmp_path_factory.mktemp("evalopts") / "tiny-classifier", minilm_2_layers)


def _summary(x):
    """An EvalPrediction field, as comparable data: kind, dtype, shape and sum of each array or tensor."""
    if x is None:
        return None
    if isinstance(x, (list, tuple)):
        return [type(x).__name__, *(_summary(v) for v in x)]
    if isinstance(x, dict):
        return {k: _summary(v) for k, v in sorted(x.items())}
    if isinstance(x, torch.Tensor):
        return ["tensor", str(x.dtype), list(x.shape), round(float(x.double().sum()), 4)]
    return ["array", str(x.dtype), list(x.shape), round(float(np.asarray(x, dtype=np.float64).sum()), 4)]


def _evaluate_and_predict(lib, checkpoint: Path, out: Path, preprocess=None, **overrides):
    """evaluate() and predict() (with and without labels) of 13 rows in batches of 5, recording compute_metrics'
    every call."""
    tokenizer = lib.AutoTokenizer.from_pretrained(checkpoint)
    model = lib.AutoModelForSequenceClassification.from_pretrained(checkpoint)
    test = datasets.Dataset.from_list(TEST).map(lambda b: tokenizer(b["text"], truncation=True), batched=True)
    calls = []

    def metrics(p, compute_result=None):
        calls.append((_summary(p.predictions), _summary(p.label_ids), _summary(p.inputs), _summary(p.losses),
                      compute_result, len(tuple(p))))
        first = p.predictions[0] if isinstance(p.predictions, (list, tuple)) else p.predictions
        return {"first": float(first.sum()), "calls": len(calls)}

    args = lib.TrainingArguments(output_dir=str(out), per_device_eval_batch_size=5, report_to="none", use_cpu=True,
                                 disable_tqdm=True, **overrides)
    trainer = lib.Trainer(model=model, args=args, eval_dataset=test, processing_class=tokenizer,
                          compute_metrics=metrics, preprocess_logits_for_metrics=preprocess)
    timing = ("runtime", "per_second", "preparation_time")
    evaluated = {k: v for k, v in trainer.evaluate().items() if not any(t in k for t in timing)}
    predicted = trainer.predict(test)
    unlabelled = trainer.predict(test.remove_columns("label"))
    return (evaluated, _summary(predicted.predictions), _summary(predicted.label_ids),
            sorted(k for k in predicted.metrics if "preparation_time" not in k),
            _summary(unlabelled.predictions), unlabelled.label_ids, calls)


@pytest.mark.parametrize("overrides", [
    dict(prediction_loss_only=True),
    dict(eval_do_concat_batches=False),
    dict(include_for_metrics=["inputs", "loss"]),
    dict(include_for_metrics=["loss", "inputs"], eval_do_concat_batches=False),
    dict(batch_eval_metrics=True),
    dict(batch_eval_metrics=True, include_for_metrics=["loss"]),
    dict(eval_accumulation_steps=2),
], ids=["loss_only", "no_concat", "inputs_and_loss", "inputs_and_loss_no_concat", "batch_metrics",
        "batch_metrics_with_loss", "accumulation"])
def test_evaluation_options_hand_compute_metrics_what_transformers_hands_it(checkpoint, tmp_path, overrides):
    """Each option was refused by name; now compute_metrics gets transformers' fields, kinds, dtypes, shapes and
    numbers (per batch, as tensors, with compute_result at the last batch for batch_eval_metrics), and evaluate()
    and predict() return what transformers' return."""
    theirs = _evaluate_and_predict(transformers, checkpoint, tmp_path / "hf", **overrides)
    ours = _evaluate_and_predict(bertkit, checkpoint, tmp_path / "bk", **overrides)
    assert ours[0].keys() == theirs[0].keys()
    for key, value in theirs[0].items():
        assert ours[0][key] == pytest.approx(value, rel=1e-5, abs=1e-4), key
    assert ours[1:] == theirs[1:]


def test_preprocess_logits_for_metrics_reduces_each_batch_as_in_transformers(checkpoint, tmp_path):
    """Trainer(preprocess_logits_for_metrics=...) was refused; now each batch's logits (and labels) go through it
    and compute_metrics and predict() get what it returned, a tuple here, concatenated over the batches."""
    def reduce(logits, labels):
        return logits.argmax(-1), logits if labels is None else logits - labels[:, None]

    theirs = _evaluate_and_predict(transformers, checkpoint, tmp_path / "hf", preprocess=reduce)
    ours = _evaluate_and_predict(bertkit, checkpoint, tmp_path / "bk", preprocess=reduce)
    assert ours[1:] == theirs[1:]
    assert ours[1][1][1] == "int64" and ours[1][1][2] == [13]  # the argmax, as the function made it


def test_include_for_metrics_names_what_it_takes():
    bertkit.TrainingArguments(output_dir="x", include_for_metrics=["inputs", "loss"])
    with pytest.raises(BertkitError, match=re.escape("include_for_metrics ['input_ids']: name what EvalPrediction")):
        bertkit.TrainingArguments(output_dir="x", include_for_metrics=["input_ids"])
    with pytest.raises(BertkitError, match="eval_accumulation_steps must be at least 1, got 0"):
        bertkit.TrainingArguments(output_dir="x", eval_accumulation_steps=0)
    with pytest.raises(BertkitError, match="bf16_full_eval and fp16_full_eval are both set"):
        bertkit.TrainingArguments(output_dir="x", bf16_full_eval=True, fp16_full_eval=True)


def test_bf16_full_eval_gives_transformers_bf16_numbers_and_keeps_the_model(checkpoint, tmp_path):
    """bf16_full_eval was refused; now evaluate() and predict() outside training run a bf16 copy of the model: the
    numbers of transformers' bf16 evaluation (which casts the model itself and leaves it bf16), while the model
    stays float32 for what follows."""
    results = {}
    for lib in (transformers, bertkit):
        tokenizer = lib.AutoTokenizer.from_pretrained(checkpoint)
        model = lib.AutoModelForSequenceClassification.from_pretrained(checkpoint)
        test = datasets.Dataset.from_list(TEST).map(lambda b, t=tokenizer: t(b["text"], truncation=True), batched=True)
        args = lib.TrainingArguments(output_dir=str(tmp_path / lib.__name__), per_device_eval_batch_size=5,
                                     report_to="none", use_cpu=True, disable_tqdm=True, bf16_full_eval=True)
        trainer = lib.Trainer(model=model, args=args, processing_class=tokenizer)
        loss = trainer.evaluate(test)["eval_loss"]
        results[lib.__name__] = loss, trainer.predict(test).predictions, next(model.parameters()).dtype
        full = lib.Trainer(model=lib.AutoModelForSequenceClassification.from_pretrained(checkpoint),
                           args=lib.TrainingArguments(output_dir=str(tmp_path / "fp32"), use_cpu=True,
                                                      report_to="none"), processing_class=tokenizer)
        results[lib.__name__] += (full.predict(test).predictions,)
    (ours, our_preds, our_dtype, fp32), (theirs, their_preds, their_dtype, _) = results["bertkit"], results["transformers"]
    assert ours == pytest.approx(theirs, abs=1e-3)
    np.testing.assert_allclose(our_preds, their_preds, atol=4e-3)
    assert np.abs(our_preds - fp32).max() > 1e-4  # bf16's rounding: not the float32 numbers
    assert their_dtype == torch.bfloat16 and our_dtype == torch.float32


def _trained(lib, checkpoint: Path, out: Path, **overrides):
    tokenizer = lib.AutoTokenizer.from_pretrained(checkpoint)
    model = lib.AutoModelForSequenceClassification.from_pretrained(checkpoint)

    def tokenize(batch):
        return tokenizer(batch["text"], truncation=True)

    train = datasets.Dataset.from_list(TRAIN[:12]).map(tokenize, batched=True)
    test = datasets.Dataset.from_list(TEST[:5]).map(tokenize, batched=True)
    settings = dict(output_dir=str(out), learning_rate=1e-3, per_device_train_batch_size=4, num_train_epochs=1,
                    logging_steps=1, save_strategy="no", report_to="none", use_cpu=True, seed=7, disable_tqdm=True)
    args = lib.TrainingArguments(**{**settings, **overrides})
    trainer = lib.Trainer(model=model, args=args, train_dataset=train, eval_dataset=test, processing_class=tokenizer,
                          compute_metrics=lambda p: {"accuracy": float((p[0].argmax(-1) == p[1]).mean())})
    return trainer, trainer.train()


def test_eval_on_start_evaluates_before_the_first_step_as_transformers(checkpoint, tmp_path):
    """eval_on_start=True was refused; now train() evaluates after on_train_begin and before the first step: the
    same first record (step 0, the untrained model's loss and accuracy) and the same training after it."""
    theirs, _ = _trained(transformers, checkpoint, tmp_path / "hf", eval_on_start=True, eval_strategy="epoch")
    ours, _ = _trained(bertkit, checkpoint, tmp_path / "bk", eval_on_start=True, eval_strategy="epoch")
    drop = ("runtime", "per_second", "preparation_time")

    def records(trainer):
        return [{k: v for k, v in h.items() if not any(d in k for d in drop)} for h in trainer.state.log_history
                if "train_loss" not in h]

    a, b = records(ours), records(theirs)
    assert [sorted(r) for r in a] == [sorted(r) for r in b]
    assert a[0]["step"] == b[0]["step"] == 0 and "eval_loss" in a[0]
    for x, y in zip(a, b):
        for key, value in y.items():
            assert x[key] == pytest.approx(value, rel=1e-5, abs=1e-6), key
    with pytest.raises(BertkitError, match=re.escape("eval_on_start=True needs an eval_dataset")):
        bertkit.Trainer(model=ours.model, args=bertkit.TrainingArguments(output_dir=str(tmp_path / "x"),
                                                                         eval_on_start=True))


@pytest.mark.parametrize("overrides, evaluated", slow_after([
    (dict(eval_strategy="steps", eval_steps=1, eval_delay=2), [2, 3]),
    (dict(eval_strategy="epoch", num_train_epochs=2, eval_delay=1.5), [6]),
    (dict(eval_strategy="steps", eval_steps=2, eval_delay=5), []),  # the run's end too: never evaluated
]), ids=["steps", "epochs", "past_the_end"])
def test_eval_delay_holds_evaluations_back_as_transformers(checkpoint, tmp_path, overrides, evaluated):
    """eval_delay was refused; now no evaluation before that many steps (or epochs), as transformers'."""
    steps = {}
    for lib in (transformers, bertkit):
        trainer, _ = _trained(lib, checkpoint, tmp_path / lib.__name__, **overrides)
        steps[lib.__name__] = [h["step"] for h in trainer.state.log_history if "eval_loss" in h]
    assert steps["bertkit"] == steps["transformers"] == evaluated


def test_the_example_scripts_reports_are_transformers_files(checkpoint, tmp_path, capsys):
    """log_metrics, save_metrics and save_state (run_glue's last lines) were missing (AttributeError); now they print
    transformers' table and write its files, and output_dir stays the run's: a later train() there goes on."""
    fixed = {"train_runtime": 12.3456, "train_samples_per_second": 0.4, "train_loss": 0.123456789, "epoch": 1.0,
             "train_samples": 12}
    texts = {}
    for lib in (transformers, bertkit):
        out = tmp_path / lib.__name__
        trainer, _ = _trained(lib, checkpoint, out)
        capsys.readouterr()
        trainer.log_metrics("train", fixed)
        trainer.save_metrics("train", fixed)
        trainer.save_metrics("eval", {"eval_loss": 0.5, "epoch": 1.0})
        trainer.save_metrics("test", {"test_loss": 0.25}, combined=False)
        trainer.save_state()
        assert trainer.is_world_process_zero() and trainer.is_local_process_zero()
        texts[lib.__name__] = (capsys.readouterr().out,
                               *((out / f).read_text() for f in ("train_results.json", "eval_results.json",
                                                                 "test_results.json", "all_results.json")))
        state = json.loads((out / "trainer_state.json").read_text())
        assert state["global_step"] == 3 and state["log_history"][-1]["train_loss"] > 0
    assert texts["bertkit"] == texts["transformers"]
    assert "  train_runtime            = 0:00:12.34" in texts["bertkit"][0]
    # output_dir holds the reports as the run's files: train() into it again is not refused as a user's directory
    _trained(bertkit, checkpoint, tmp_path / "bertkit", max_steps=1)


def _custom_model_predictions(lib, out: Path, ignore_keys=None):
    """A custom model returning transformers' ModelOutput (loss, logits, embedding), labels under label_names."""
    from dataclasses import dataclass

    from torch import nn
    from transformers.utils import ModelOutput

    @dataclass
    class Output(ModelOutput):
        loss: torch.Tensor | None = None
        logits: torch.Tensor | None = None
        embedding: torch.Tensor | None = None

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.embed, self.out = nn.Embedding(100, 8), nn.Linear(8, 2)

        def forward(self, input_ids, targets=None):
            embedding = self.embed(input_ids).mean(1)
            logits = self.out(embedding)
            loss = None if targets is None else nn.functional.cross_entropy(logits, targets)
            return Output(loss=loss, logits=logits, embedding=embedding)

    rows = [{"input_ids": [i % 100, (i * 7) % 100, 3], "targets": i % 2} for i in range(10)]
    seen = []

    def metrics(p):
        predictions, labels = p
        seen.append(_summary(predictions))
        return {"accuracy": float((predictions[0].argmax(-1) == labels).mean())}  # written for the tuple

    args = lib.TrainingArguments(output_dir=str(out), per_device_eval_batch_size=4, label_names=["targets"],
                                 remove_unused_columns=False, report_to="none", use_cpu=True, disable_tqdm=True)
    trainer = lib.Trainer(model=Model(), args=args, eval_dataset=rows, compute_metrics=metrics,
                          data_collator=lib.DefaultDataCollator())
    evaluated = trainer.evaluate(ignore_keys=ignore_keys)
    return evaluated["eval_accuracy"], evaluated["eval_loss"], _summary(trainer.predict(rows).predictions), seen


def test_a_custom_models_outputs_are_predictions_as_in_transformers(tmp_path):
    """A custom model's ModelOutput (loss, logits, embedding): transformers hands compute_metrics and predict() the
    tuple (logits, embedding); bertkit handed the logits alone, so a compute_metrics written for the tuple read
    predictions[0] as the first row (accuracy 0.5 against 0.4 here) without a word. Now the same tuple, and
    ignore_keys leaves an output out as there."""
    theirs = _custom_model_predictions(transformers, tmp_path / "hf")
    ours = _custom_model_predictions(bertkit, tmp_path / "bk")
    assert ours[0] == theirs[0] == 0.4
    assert ours[1] == pytest.approx(theirs[1], rel=1e-6)
    assert ours[2:] == theirs[2:]
    assert ours[2][0] == "tuple" and [x[2] for x in ours[2][1:]] == [[10, 2], [10, 8]]
    assert (_custom_model_predictions(bertkit, tmp_path / "bk2", ["embedding"])[3][0]
            == _custom_model_predictions(transformers, tmp_path / "hf2", ["embedding"])[3][0])
