"""The Trainer's loss against transformers' Trainer: a ``compute_loss`` override and ``label_smoothing_factor`` in the
same script run with each library's classes (dropout off): the same loss at every step, the same evaluation losses
and the same weights, also with gradient accumulation, where an epoch's last step is short (37 rows in micro-batches
of 4: the 5th step's two hold 4 rows and 1)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import bertkit
from bertkit.errors import BertkitError
from trainer_helpers import TEST, TRAIN, tiny_classifier

transformers = pytest.importorskip("transformers")
datasets = pytest.importorskip("datasets")
pytest.importorskip("accelerate")  # transformers' Trainer needs it


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, minilm_2_layers) -> dict[str, Path]:
    """A tiny sequence classifier and a tiny 3-label tagger (seeded, dropout off) in the Hugging Face layout."""
    root = tmp_path_factory.mktemp("trainer-loss")
    seq = tiny_classifier(root / "seq", minilm_2_layers)
    torch.manual_seed(1)
    transformers.BertForTokenClassification(transformers.AutoConfig.from_pretrained(seq, num_labels=3)
                                            ).save_pretrained(root / "tok")
    transformers.AutoTokenizer.from_pretrained(seq).save_pretrained(root / "tok")
    return {"seq": seq, "tok": root / "tok"}


def _rows(kind: str, rows: list[dict], tokenizer) -> list[dict]:
    if kind == "seq":
        return [{**tokenizer(r["text"], truncation=True), "label": r["label"]} for r in rows]
    out = []
    for r in rows:  # a tag on each word's first piece (its length mod 3), -100 on the others
        words = r["text"].split()
        enc = tokenizer(words, is_split_into_words=True, truncation=True)
        ids = enc.word_ids()
        labels = [-100 if w is None or (i and ids[i - 1] == w) else len(words[w]) % 3 for i, w in enumerate(ids)]
        out.append({**{k: list(v) for k, v in enc.items()}, "labels": labels})
    return out


def _run(lib, loss: str, kind: str, checkpoint: Path, out: Path, scaled: bool | None = None, **settings):
    """Train with ``lib``'s Trainer (or a subclass computing ``loss``) and evaluate: ([(step, loss, grad_norm)],
    [eval_loss at each evaluation and after], state dict)."""
    tokenizer = lib.AutoTokenizer.from_pretrained(checkpoint)
    auto = lib.AutoModelForSequenceClassification if kind == "seq" else lib.AutoModelForTokenClassification
    model = auto.from_pretrained(checkpoint)
    collator = (lib.DataCollatorWithPadding if kind == "seq" else lib.DataCollatorForTokenClassification)(tokenizer)

    class ClassWeighted(lib.Trainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            labels = inputs.pop("labels")
            outputs = model(**inputs)
            loss = torch.nn.functional.cross_entropy(outputs.logits.flatten(0, -2), labels.flatten(),
                                                     weight=torch.tensor([0.3, 0.7, 1.0][:outputs.logits.shape[-1]]))
            return (loss, outputs) if return_outputs else loss

    class PerItem(lib.Trainer):  # normalised over the whole step's labels
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            labels = inputs.pop("labels")
            outputs = model(**inputs)
            total = torch.nn.functional.cross_entropy(outputs.logits.flatten(0, -2), labels.flatten(), reduction="sum")
            loss = total / num_items_in_batch
            return (loss, outputs) if return_outputs else loss

    trainer_class = {"model": lib.Trainer, "class_weighted": ClassWeighted, "per_item": PerItem}[loss]
    if scaled is not None:
        trainer_class = type("Scaled", (trainer_class,), {"loss_is_scaled_for_ga": scaled})
    args = lib.TrainingArguments(**{**dict(
        output_dir=str(out / lib.__name__), learning_rate=1e-3, per_device_train_batch_size=4,
        per_device_eval_batch_size=8, num_train_epochs=1, logging_steps=1, eval_strategy="steps", eval_steps=2,
        save_strategy="no", report_to="none", use_cpu=True, seed=7, disable_tqdm=True), **settings})
    trainer = trainer_class(model=model, args=args, data_collator=collator, processing_class=tokenizer,
                            train_dataset=datasets.Dataset.from_list(_rows(kind, TRAIN, tokenizer)),
                            eval_dataset=datasets.Dataset.from_list(_rows(kind, TEST, tokenizer)))
    trainer.train()
    final = trainer.evaluate()["eval_loss"]
    history = trainer.state.log_history
    return ([(h["step"], h["loss"], h["grad_norm"]) for h in history if "loss" in h],
            [h["eval_loss"] for h in history if "eval_loss" in h] + [final], trainer.model.state_dict())


def _same_numbers(kind: str, loss: str, checkpoint: Path, out: Path, **settings) -> list:
    (theirs, their_evals, their_weights), (ours, our_evals, our_weights) = (
        _run(lib, loss, kind, checkpoint, out, **settings) for lib in (transformers, bertkit))
    assert [s for s, _, _ in ours] == [s for s, _, _ in theirs] and len(theirs) >= 5
    np.testing.assert_allclose([x[1:] for x in ours], [x[1:] for x in theirs], rtol=1e-5)
    np.testing.assert_allclose(our_evals, their_evals, rtol=1e-5)
    for name, theirs_w in their_weights.items():
        torch.testing.assert_close(our_weights[name], theirs_w, rtol=1e-4, atol=1e-6, msg=name)
    return theirs


@pytest.mark.parametrize("loss, scaled", [("class_weighted", None),
                                          pytest.param("class_weighted", False, marks=pytest.mark.slow),
                                          ("per_item", None)])
def test_a_compute_loss_override_trains_and_evaluates_at_transformers_numbers(checkpoints, tmp_path, loss, scaled):
    """The override is called for every micro-batch and every evaluation batch, given num_items_in_batch (the step's
    labels), and its loss divided by the accumulation steps as transformers divides it: not, as transformers has it
    for a BERT head, unless the subclass sets loss_is_scaled_for_ga = False (a class-weighted mean at accumulation 2:
    the step's two means summed; per_item: the step's loss over its 5 rows in the short step). bertkit refused the
    override (its loop never called compute_loss)."""
    theirs = _same_numbers("seq", loss, checkpoints["seq"], tmp_path, scaled=scaled, gradient_accumulation_steps=2)
    if loss == "class_weighted":  # the sum of the step's two means, or their mean
        assert 1.1 < theirs[0][1] < 1.6 if scaled is None else 0.55 < theirs[0][1] < 0.8, theirs[0]


@pytest.mark.parametrize("kind", ["seq", "tok"])
def test_label_smoothing_gives_transformers_numbers(checkpoints, tmp_path, kind):
    """label_smoothing_factor 0.1 on a classifier and on a tagger (-100 left out), at accumulation 2: transformers'
    LabelSmoother over the step's labels, in training and in eval_loss. bertkit refused the argument."""
    _same_numbers(kind, "model", checkpoints[kind], tmp_path, label_smoothing_factor=0.1, gradient_accumulation_steps=2)


def test_label_smoothing_is_refused_where_it_would_change_nothing_or_fail(checkpoints, tmp_path):
    args = bertkit.TrainingArguments(output_dir=str(tmp_path / "never"), label_smoothing_factor=0.1, use_cpu=True)
    for model, said in ((bertkit.AutoModelForQuestionAnswering.from_pretrained(checkpoints["seq"]),
                         "BertForQuestionAnswering takes no 'labels' argument"),
                        (bertkit.AutoModelForSequenceClassification.from_pretrained(
                            checkpoints["seq"], problem_type="multi_label_classification"),
                         "BertForSequenceClassification is a multi-label classifier"),
                        (bertkit.AutoModelForSequenceClassification.from_pretrained(
                            checkpoints["seq"], num_labels=1, ignore_mismatched_sizes=True),
                         "BertForSequenceClassification has one output")):
        with pytest.raises(BertkitError, match=f"label_smoothing_factor 0.1: {said}"):
            bertkit.Trainer(model=model, args=args)
    for bad in (-0.1, 1.5, float("nan")):
        with pytest.raises(BertkitError, match=rf"label_smoothing_factor must be in \[0.0, 1.0\], got {bad}"):
            bertkit.TrainingArguments(output_dir="x", label_smoothing_factor=bad)
    assert not (tmp_path / "never").exists()


def test_a_micro_batch_with_no_label_trains_and_an_eval_batch_with_none_is_nan(checkpoints, tmp_path):
    """A tagger whose rows are labelled one in three (-100 elsewhere), at accumulation 2: a micro-batch with no label
    adds 0 to the step's token mean, as transformers' Trainer with a loss over num_items_in_batch has it (the same
    loss at every step); an evaluation batch with no label has a loss of 0 / 0, NaN, which eval_loss leaves out, as
    transformers' does. bertkit scored that batch 0 and weighed it by its 8 rows of 13: eval_loss 0.421 against
    transformers' 1.095, a mean over nothing read as a perfect score."""
    lib_rows = {}
    for lib in (transformers, bertkit):
        tokenizer = lib.AutoTokenizer.from_pretrained(checkpoints["tok"])
        train = [r if i % 3 == 0 else {**r, "labels": [-100] * len(r["labels"])}
                 for i, r in enumerate(_rows("tok", TRAIN, tokenizer))]
        test = [{**r, "labels": [-100] * len(r["labels"])} if i < 8 else r
                for i, r in enumerate(_rows("tok", TEST, tokenizer))]
        lib_rows[lib] = tokenizer, train, test
    runs = []
    for lib in (transformers, bertkit):
        tokenizer, train, test = lib_rows[lib]
        args = lib.TrainingArguments(output_dir=str(tmp_path / lib.__name__), learning_rate=1e-3,
                                     per_device_train_batch_size=4, per_device_eval_batch_size=8,
                                     gradient_accumulation_steps=2, num_train_epochs=1, logging_steps=1,
                                     save_strategy="no", report_to="none", use_cpu=True, seed=7, disable_tqdm=True)

        def per_token(outputs, labels, num_items_in_batch):
            return torch.nn.functional.cross_entropy(outputs["logits"].flatten(0, 1), labels.flatten(),
                                                     reduction="sum") / num_items_in_batch

        trainer = lib.Trainer(model=lib.AutoModelForTokenClassification.from_pretrained(checkpoints["tok"]),
                              args=args, data_collator=lib.DataCollatorForTokenClassification(tokenizer),
                              train_dataset=datasets.Dataset.from_list(train),
                              **({"compute_loss_func": per_token} if lib is transformers else {}))
        trainer.train()
        losses = [(h["loss"], h["grad_norm"]) for h in trainer.state.log_history if "loss" in h]
        trainer.compute_loss_func = None  # transformers evaluates BERT's own loss, a mean per batch
        runs.append((losses, trainer.evaluate(datasets.Dataset.from_list(test))["eval_loss"]))
    (theirs, their_eval), (ours, our_eval) = runs
    assert len(theirs) == 5 and all(np.isfinite(theirs).all(axis=1))
    np.testing.assert_allclose(ours, theirs, rtol=1e-5)
    assert our_eval == pytest.approx(their_eval, rel=1e-5) and 1.0 < their_eval < 1.2  # the 5 labelled rows
