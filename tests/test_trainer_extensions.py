"""bertkit.Trainer's extension points as users' scripts reach them, against transformers' Trainer: the arguments a
script passes at transformers' defaults (accepted), those bertkit does not implement (refused naming the fix),
callbacks removed by class or instance, and push_to_hub."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import bertkit
from bertkit.errors import BertkitError
from trainer_helpers import TEST, TRAIN, tiny_classifier

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, minilm_2_layers) -> Path:
    return tiny_classifier(tmp_path_factory.mktemp("extensions") / "tiny-classifier", minilm_2_layers)


def _trainer(lib, checkpoint: Path, out: Path, args=None, cls=None, **kwargs):
    tokenizer = lib.AutoTokenizer.from_pretrained(checkpoint)
    model = kwargs.pop("model", None) or lib.AutoModelForSequenceClassification.from_pretrained(checkpoint)
    rows = [{**tokenizer(r["text"]), "label": r["label"]} for r in TRAIN[:8]]
    if kwargs.get("eval_dataset") == "test":
        kwargs["eval_dataset"] = [{**tokenizer(r["text"]), "label": r["label"]} for r in TEST[:6]]
    settings = {
        **dict(
            output_dir=str(out),
            use_cpu=True,
            report_to="none",
            max_steps=2,
            logging_steps=1,
            save_strategy="no",
            disable_tqdm=True,
            seed=3,
        ),
        **(args or {}),
    }
    return (cls or lib.Trainer)(
        model=model,
        args=lib.TrainingArguments(**settings),
        train_dataset=rows,
        processing_class=tokenizer,
        **kwargs,
    )


def _losses(trainer) -> list[float]:
    trainer.train()
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]


def test_arguments_at_transformers_defaults_train_as_without_them(checkpoint, tmp_path):
    """include_num_input_tokens_seen=False is transformers' "no" (its __post_init__ turns the bool into it) and
    optimizers=(None, None) its default: both were refused ("include_num_input_tokens_seen=False is a transformers
    argument bertkit does not implement", "Trainer got arguments bertkit does not implement: ['optimizers']")."""
    plain = _losses(_trainer(bertkit, checkpoint, tmp_path / "plain"))
    given = _trainer(
        bertkit,
        checkpoint,
        tmp_path / "given",
        args={"include_num_input_tokens_seen": False},
        optimizers=(None, None),
        optimizer_cls_and_kwargs=None,
        compute_loss_func=None,
    )
    theirs = _trainer(
        transformers,
        checkpoint,
        tmp_path / "hf",
        args={"include_num_input_tokens_seen": False},
        optimizers=(None, None),
    )
    assert _losses(given) == plain
    assert plain == pytest.approx(_losses(theirs), rel=1e-5)


@pytest.mark.parametrize(
    ("argument", "fix"),
    [
        (
            "optimizers",
            r"Trainer\(optimizers=\.\.\.\) is not implemented in bertkit: bertkit's loop builds AdamW .* set "
            r"learning_rate, weight_decay, adam_beta1",
        ),
        (
            "optimizer_cls_and_kwargs",
            r"Trainer\(optimizer_cls_and_kwargs=\.\.\.\) is not implemented .* lr_scheduler_type",
        ),
        (
            "compute_loss_func",
            r"Trainer\(compute_loss_func=\.\.\.\) .* override compute_loss\(self, model, inputs",
        ),
    ],
)
def test_an_optimiser_or_loss_function_argument_is_refused_naming_the_fix(
    checkpoint, tmp_path, argument, fix
):
    """The refusal said only "see docs/coming-from-transformers.md"; it now says what to set instead."""
    model = bertkit.AutoModelForSequenceClassification.from_pretrained(checkpoint)
    value = {
        "optimizers": (torch.optim.SGD(model.parameters(), lr=0.1), None),
        "optimizer_cls_and_kwargs": (torch.optim.SGD, {"lr": 0.1}),
        "compute_loss_func": lambda outputs, labels, num_items_in_batch=None: outputs.logits.sum(),
    }[argument]
    with pytest.raises(BertkitError, match=fix):
        _trainer(bertkit, checkpoint, tmp_path / "run", model=model, **{argument: value})
    with pytest.raises(
        BertkitError, match=r"^Trainer got an argument bertkit does not implement: optimiser; see"
    ):
        _trainer(bertkit, checkpoint, tmp_path / "run", optimiser=None)


def test_callbacks_removed_by_class_or_instance_as_in_transformers(checkpoint, tmp_path):
    """remove_callback returns None and pop_callback the callback removed, in both libraries (bertkit's
    remove_callback returned the callback); a class given removes its first instance."""
    for lib in (transformers, bertkit):

        class Counting(lib.TrainerCallback):
            def __init__(self):
                self.steps = 0

            def on_step_end(self, args, state, control, **kwargs):
                self.steps += 1

        kept, removed = Counting(), Counting()
        trainer = _trainer(lib, checkpoint, tmp_path / lib.__name__, callbacks=[removed, Counting])
        assert trainer.remove_callback(removed) is None, lib.__name__
        popped = trainer.pop_callback(Counting)
        assert isinstance(popped, Counting) and popped is not removed, lib.__name__
        assert trainer.pop_callback(Counting) is None, lib.__name__
        trainer.add_callback(kept)
        trainer.train()
        assert (kept.steps, removed.steps, popped.steps) == (2, 0, 0), lib.__name__


def test_push_to_hub_is_refused_naming_save_model(checkpoint, tmp_path):
    """trainer.push_to_hub() stopped in an AttributeError; it is refused with the way to upload."""
    trainer = _trainer(bertkit, checkpoint, tmp_path / "run")
    with pytest.raises(
        BertkitError, match=r"push_to_hub is not implemented in bertkit .* trainer\.save_model\(DIR\)"
    ):
        trainer.push_to_hub(commit_message="end of training")
    assert not (tmp_path / "run").exists()


def test_an_evaluate_override_runs_for_the_evaluations_during_training(checkpoint, tmp_path):
    """transformers' Trainer evaluates during training through self.evaluate(); bertkit's ran its own evaluation
    there, so an override adding a metric was skipped (its metric never logged) and a metric_for_best_model naming
    it was refused before training as "not a metric this run computes". Now the override runs at each evaluation:
    the same records, evaluate() calls, best metric and best checkpoint as transformers'."""
    seen = {}
    for lib in (transformers, bertkit):
        calls = seen.setdefault(lib.__name__, [])

        class Scored(lib.Trainer):
            seen = calls

            def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix="eval"):
                metrics = super().evaluate(eval_dataset, ignore_keys, metric_key_prefix)
                metrics[f"{metric_key_prefix}_neg_loss"] = -metrics[f"{metric_key_prefix}_loss"]
                self.seen.append((self.state.global_step, ignore_keys))
                return metrics

        trainer = _trainer(
            lib,
            checkpoint,
            tmp_path / lib.__name__,
            eval_dataset="test",
            args=dict(
                max_steps=4,
                eval_strategy="steps",
                eval_steps=2,
                save_strategy="steps",
                save_steps=2,
                metric_for_best_model="neg_loss",
                load_best_model_at_end=True,
                learning_rate=5e-3,
            ),
            cls=Scored,
        )
        trainer.train(ignore_keys_for_eval=["hidden_states"])
        evals = [
            {k: v for k, v in h.items() if "runtime" not in k and "per_second" not in k}
            for h in trainer.state.log_history
            if "eval_loss" in h
        ]
        seen[lib.__name__ + "-evals"] = evals
        seen[lib.__name__ + "-best"] = (
            trainer.state.best_metric,
            Path(trainer.state.best_model_checkpoint).name,
        )
    assert seen["bertkit"] == seen["transformers"] == [(2, ["hidden_states"]), (4, ["hidden_states"])]
    ours, theirs = seen["bertkit-evals"], seen["transformers-evals"]
    assert [sorted(r) for r in ours] == [sorted(r) for r in theirs] and len(ours) == 2
    for a, b in zip(ours, theirs):
        assert a == pytest.approx(b, rel=1e-5)
    assert seen["bertkit-best"][1] == seen["transformers-best"][1]
    assert seen["bertkit-best"][0] == pytest.approx(seen["transformers-best"][0], rel=1e-5)


def test_an_evaluate_override_without_the_best_metric_is_refused_at_that_evaluation(checkpoint, tmp_path):
    """As transformers stops there (a KeyError): the metric is named, and what the override returned."""

    class Renamed(bertkit.Trainer):
        def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix="eval"):
            return {"eval_other": 1.0}

    trainer = _trainer(
        bertkit,
        checkpoint,
        tmp_path / "run",
        eval_dataset="test",
        args=dict(max_steps=2, eval_strategy="steps", eval_steps=2, metric_for_best_model="score"),
        cls=Renamed,
    )
    with pytest.raises(
        BertkitError,
        match=r"metric_for_best_model 'score' is not in the metrics Renamed\.evaluate "
        r"returned at step 2 \(\['eval_other'\]\)",
    ):
        trainer.train()
