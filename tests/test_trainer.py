"""bertkit.Trainer against transformers' Trainer: the text-classification guide run by both on one checkpoint.

A tiny BertForSequenceClassification (2 layers, width 32, dropout off) is saved once with a seed; the guide's
script (tokenize with truncation, DataCollatorWithPadding, accuracy in compute_metrics) runs once with
transformers' classes and once with bertkit's, and must log the same loss and learning rate at every step and
end with the same evaluation and predictions. Then what bertkit adds: exact resume, load_best_model_at_end,
checkpoints transformers loads, and the errors a user can meet.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import bertkit
from bertkit.errors import BertkitError
from cases import slow_after
from trainer_helpers import TEST, TRAIN, KillAt, Killed, _losses, accuracy, tiny_classifier

transformers = pytest.importorskip("transformers")
datasets = pytest.importorskip("datasets")
pytest.importorskip("accelerate")  # transformers' Trainer needs it


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, minilm_2_layers) -> Path:
    """A tiny classifier in the Hugging Face layout (seeded, dropout off) with MiniLM's WordPiece vocabulary."""
    return tiny_classifier(tmp_path_factory.mktemp("trainer") / "tiny-classifier", minilm_2_layers)


def _guide(lib, checkpoint: Path, out: Path, **overrides):
    """The text-classification guide's script, with ``lib`` (transformers or bertkit) as the only difference."""
    tokenizer = lib.AutoTokenizer.from_pretrained(checkpoint)
    model = lib.AutoModelForSequenceClassification.from_pretrained(checkpoint)

    def preprocess(batch):
        return tokenizer(batch["text"], truncation=True)

    train = datasets.Dataset.from_list(TRAIN).map(preprocess, batched=True)
    test = datasets.Dataset.from_list(TEST).map(preprocess, batched=True)
    settings = dict(output_dir=str(out), learning_rate=1e-3, per_device_train_batch_size=4,
                    per_device_eval_batch_size=8, num_train_epochs=2, weight_decay=0.01, warmup_steps=0.1,
                    logging_steps=1, eval_strategy="epoch", save_strategy="no", report_to="none", use_cpu=True,
                    seed=7, disable_tqdm=True)
    args = lib.TrainingArguments(**{**settings, **overrides})
    trainer = lib.Trainer(model=model, args=args, train_dataset=train, eval_dataset=test, processing_class=tokenizer,
                          data_collator=lib.DataCollatorWithPadding(tokenizer), compute_metrics=accuracy)
    result = trainer.train()
    return trainer, result, trainer.evaluate(), trainer.predict(test)


def test_the_guide_gives_transformers_numbers_step_by_step(checkpoint, tmp_path):
    hf, hf_result, hf_eval, hf_pred = _guide(transformers, checkpoint, tmp_path / "hf")
    bk, bk_result, bk_eval, bk_pred = _guide(bertkit, checkpoint, tmp_path / "bk")

    # same data order (seeded RandomSampler), optimiser, schedule and clipping: the same loss at all 20 steps
    ours, theirs = _losses(bk.state.log_history), _losses(hf.state.log_history)
    assert [s for s, _, _ in ours] == list(range(1, 21)) == [s for s, _, _ in theirs]
    np.testing.assert_allclose([x[1] for x in ours], [x[1] for x in theirs], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose([x[2] for x in ours], [x[2] for x in theirs], rtol=1e-9)
    assert len({round(x[1], 4) for x in ours}) > 10  # the losses move: a real comparison, not a constant
    # the gradient norm before clipping, logged with each loss as transformers logs it
    np.testing.assert_allclose([h["grad_norm"] for h in bk.state.log_history if "loss" in h],
                               [h["grad_norm"] for h in hf.state.log_history if "loss" in h], rtol=1e-4)
    assert bk_result.global_step == hf_result.global_step == 20
    assert bk_result.training_loss == pytest.approx(hf_result.training_loss, rel=1e-5)

    # the evaluation after each epoch and at the end, and the predictions
    ours_eval = [h for h in bk.state.log_history if "eval_loss" in h]
    theirs_eval = [h for h in hf.state.log_history if "eval_loss" in h]
    assert [(h["step"], h["epoch"]) for h in ours_eval] == [(h["step"], h["epoch"]) for h in theirs_eval]
    for a, b in zip(ours_eval, theirs_eval):
        assert a["eval_loss"] == pytest.approx(b["eval_loss"], rel=1e-5)
        assert a["eval_accuracy"] == b["eval_accuracy"]
    assert bk_eval["eval_loss"] == pytest.approx(hf_eval["eval_loss"], rel=1e-5)
    assert bk_eval["eval_accuracy"] == hf_eval["eval_accuracy"]
    assert bk_eval["epoch"] == hf_eval["epoch"] == 2.0
    np.testing.assert_allclose(bk_pred.predictions, hf_pred.predictions, atol=1e-5)
    np.testing.assert_array_equal(bk_pred.label_ids, hf_pred.label_ids)
    assert bk_pred.predictions.shape == (13, 2)
    assert bk_pred.metrics["test_accuracy"] == hf_pred.metrics["test_accuracy"]


def test_logging_first_step_logs_transformers_records(checkpoint, tmp_path):
    """The first step's loss, then windows from step 2 (transformers averages each window over the steps since the
    last record): bertkit refused logging_first_step before."""
    run = dict(logging_steps=3, logging_first_step=True, max_steps=7, eval_strategy="no")
    hf = _guide(transformers, checkpoint, tmp_path / "hf", **run)[0]
    bk = _guide(bertkit, checkpoint, tmp_path / "bk", **run)[0]
    theirs = [(h["step"], h["loss"]) for h in hf.state.log_history if "loss" in h]
    ours = [(h["step"], h["loss"]) for h in bk.state.log_history if "loss" in h]
    assert [s for s, _ in theirs] == [1, 3, 6]
    assert [s for s, _ in ours] == [1, 3, 6, 7]  # bertkit logs the last step too (docs)
    np.testing.assert_allclose([x for _, x in ours[:-1]], [x for _, x in theirs], rtol=1e-5)


def test_dataloader_drop_last_gives_transformers_steps_and_evaluation(checkpoint, tmp_path):
    """dataloader_drop_last=True: 37 rows in batches of 4 are 9 steps an epoch (the short last batch left out, 18
    steps in all, the schedule over 18), and the evaluation and predict() take the 8 rows of the 13 that make whole
    batches of 8, as transformers' data loaders do. bertkit refused the argument."""
    hf, hf_result, hf_eval, hf_pred = _guide(transformers, checkpoint, tmp_path / "hf", dataloader_drop_last=True)
    bk, bk_result, bk_eval, bk_pred = _guide(bertkit, checkpoint, tmp_path / "bk", dataloader_drop_last=True)
    ours, theirs = _losses(bk.state.log_history), _losses(hf.state.log_history)
    assert [s for s, _, _ in ours] == list(range(1, 19)) == [s for s, _, _ in theirs]
    np.testing.assert_allclose([x[1] for x in ours], [x[1] for x in theirs], rtol=1e-5, atol=1e-6)
    assert [x[2] for x in ours] == [x[2] for x in theirs]
    assert bk_result.global_step == hf_result.global_step == 18 and bk.state.max_steps == hf.state.max_steps
    assert [h["epoch"] for h in bk.state.log_history if "loss" in h][8] == pytest.approx(1.0)
    assert bk_eval["eval_loss"] == pytest.approx(hf_eval["eval_loss"], rel=1e-5)
    assert bk_pred.predictions.shape == hf_pred.predictions.shape == (8, 2)
    np.testing.assert_allclose(bk_pred.predictions, hf_pred.predictions, atol=1e-5)
    with pytest.raises(BertkitError, match="leaves none of train_dataset's 37 rows: they make no whole batch of 40"):
        _guide(bertkit, checkpoint, tmp_path / "none", dataloader_drop_last=True, per_device_train_batch_size=40)
    assert not (tmp_path / "none").exists()


def _dropout_losses(lib, checkpoint: Path, tmp_path: Path, between=None, **overrides) -> list[float]:
    """The losses of the guide's classifier trained by ``lib`` with dropout on (0.1) in the padded layout (bertkit
    otherwise draws over real tokens only, by design), evaluated each epoch; ``between(trainer)`` runs between making
    the Trainer and train()."""
    dropped = tmp_path / "dropout"
    if not dropped.exists():
        shutil.copytree(checkpoint, dropped)
        config = json.loads((dropped / "config.json").read_text())
        (dropped / "config.json").write_text(json.dumps({**config, "hidden_dropout_prob": 0.1,
                                                         "attention_probs_dropout_prob": 0.1}))
    tokenizer = lib.AutoTokenizer.from_pretrained(dropped)
    model = lib.AutoModelForSequenceClassification.from_pretrained(dropped)
    if lib is bertkit:
        model.bert.layout = "padded"
    rows = [dict(tokenizer(r["text"]), label=r["label"]) for r in TRAIN]
    settings = dict(output_dir=str(tmp_path / lib.__name__), learning_rate=1e-3, per_device_train_batch_size=8,
                    num_train_epochs=2, logging_steps=1, eval_strategy="epoch", save_strategy="no", report_to="none",
                    use_cpu=True, seed=7, disable_tqdm=True)
    trainer = lib.Trainer(model=model, args=lib.TrainingArguments(**{**settings, **overrides}), train_dataset=rows,
                          eval_dataset=rows[:8], data_collator=lib.DataCollatorWithPadding(tokenizer))
    if between is not None:
        between(trainer)
    trainer.train()
    return [x[1] for x in _losses(trainer.state.log_history)]


def test_dropout_draws_transformers_masks_for_the_same_seed(checkpoint, tmp_path):
    """Dropout on: the same masks as transformers' run at every step, across an epoch's start and an evaluation.
    transformers' data loader draws one number from torch's global generator each time it starts; bertkit drew none,
    so every mask differed (the first loss 0.6935 against 0.6961)."""
    theirs, ours = (_dropout_losses(lib, checkpoint, tmp_path) for lib in (transformers, bertkit))
    assert len(ours) == len(theirs) == 10
    np.testing.assert_allclose(ours, theirs, rtol=1e-5)


def test_draws_between_making_the_trainer_and_train_move_the_masks_as_transformers(checkpoint, tmp_path):
    """transformers' Trainer seeds when it is made and train() goes on from there: an evaluate() first (its loader
    draws), a script's torch.rand, or another Trainer made (which seeds again) move the run's dropout masks. bertkit's
    train() seeded again, so its losses were those of a run without them (1% apart at the first step)."""

    def evaluate_and_draw(trainer):
        trainer.evaluate()
        torch.rand(3)

    def another_trainer(trainer):
        torch.rand(5)
        type(trainer)(model=trainer.model, args=trainer.args, eval_dataset=trainer.eval_dataset)  # seeds again
        torch.rand(3)

    for between in (evaluate_and_draw, another_trainer):
        theirs, ours = (_dropout_losses(lib, checkpoint, tmp_path, between, num_train_epochs=1)
                        for lib in (transformers, bertkit))
        assert len(ours) == len(theirs) == 5
        np.testing.assert_allclose(ours, theirs, rtol=1e-5)


def test_token_classification_gives_transformers_numbers(checkpoint, tmp_path):
    """Tagging (labels on each word's first piece, -100 elsewhere) with DataCollatorForTokenClassification."""
    tagger = tmp_path / "tagger"
    torch.manual_seed(0)
    config = transformers.AutoConfig.from_pretrained(checkpoint, num_labels=3)
    transformers.BertForTokenClassification(config).save_pretrained(tagger)
    transformers.AutoTokenizer.from_pretrained(checkpoint).save_pretrained(tagger)

    def tagged(rows, tokenizer):
        out = []
        for r in rows:
            words = r["text"].split()
            enc = tokenizer(words, is_split_into_words=True, truncation=True)
            ids, labels = enc.word_ids(), []
            for i, w in enumerate(ids):
                labels.append(-100 if w is None or (i and ids[i - 1] == w) else len(words[w]) % 3)
            out.append({**{k: list(v) for k, v in enc.items()}, "labels": labels})
        return out

    runs = []
    for lib in (transformers, bertkit):
        tokenizer = lib.AutoTokenizer.from_pretrained(tagger)
        model = lib.AutoModelForTokenClassification.from_pretrained(tagger)
        train = datasets.Dataset.from_list(tagged(TRAIN, tokenizer))
        test = datasets.Dataset.from_list(tagged(TEST, tokenizer))
        args = lib.TrainingArguments(output_dir=str(tmp_path / lib.__name__), learning_rate=1e-3,
                                     per_device_train_batch_size=4, per_device_eval_batch_size=8, max_steps=10,
                                     logging_steps=1, save_strategy="no", report_to="none", use_cpu=True, seed=7,
                                     disable_tqdm=True)
        trainer = lib.Trainer(model=model, args=args, train_dataset=train, processing_class=tokenizer,
                              data_collator=lib.DataCollatorForTokenClassification(tokenizer))
        trainer.train()
        runs.append((_losses(trainer.state.log_history), trainer.predict(test)))
    (theirs, hf_pred), (ours, bk_pred) = runs
    np.testing.assert_allclose([x[1] for x in ours], [x[1] for x in theirs], rtol=1e-5)
    assert bk_pred.metrics["test_loss"] == pytest.approx(hf_pred.metrics["test_loss"], rel=1e-5)
    assert bk_pred.predictions.shape == hf_pred.predictions.shape == (13, 19, 3)  # batches padded with -100
    np.testing.assert_array_equal(bk_pred.label_ids, hf_pred.label_ids)
    scored = hf_pred.label_ids != -100  # bertkit's logits at padding are zeros by design (docs)
    np.testing.assert_allclose(bk_pred.predictions[scored], hf_pred.predictions[scored], atol=1e-5)


def test_masked_lm_with_either_librarys_collator_gives_transformers_numbers(checkpoint, tmp_path):
    """DataCollatorForLanguageModeling with a seed: the masks are drawn alike, the token loss is averaged alike."""
    mlm = tmp_path / "mlm"
    torch.manual_seed(0)
    transformers.BertForMaskedLM(transformers.AutoConfig.from_pretrained(checkpoint)).save_pretrained(mlm)
    transformers.AutoTokenizer.from_pretrained(checkpoint).save_pretrained(mlm)

    def losses(lib, collator):
        tokenizer = lib.AutoTokenizer.from_pretrained(mlm)
        train = datasets.Dataset.from_list(TRAIN).map(lambda b: tokenizer(b["text"], truncation=True), batched=True,
                                                      remove_columns=["text", "label"])
        args = lib.TrainingArguments(output_dir=str(tmp_path / f"{lib.__name__}-{collator.__module__}"),
                                     learning_rate=1e-3, per_device_train_batch_size=4, max_steps=6, logging_steps=1,
                                     save_strategy="no", report_to="none", use_cpu=True, seed=7, disable_tqdm=True)
        trainer = lib.Trainer(model=lib.AutoModelForMaskedLM.from_pretrained(mlm), args=args, train_dataset=train,
                              processing_class=tokenizer,
                              data_collator=collator(tokenizer, seed=3, mlm_probability=0.3))
        trainer.train()
        return [x[1] for x in _losses(trainer.state.log_history)]

    theirs = losses(transformers, transformers.DataCollatorForLanguageModeling)
    assert len(theirs) == 6 and all(8 < x < 10 for x in theirs)  # ln(8960) = 9.1 at the start
    np.testing.assert_allclose(losses(bertkit, bertkit.DataCollatorForLanguageModeling), theirs, rtol=1e-5)
    np.testing.assert_allclose(losses(bertkit, transformers.DataCollatorForLanguageModeling), theirs, rtol=1e-5)


def test_masked_lm_with_accumulation_counts_the_tokens_it_trains_on(checkpoint, tmp_path):
    """With accumulation the step's loss is divided by the labelled tokens of the step's micro-batches, read ahead as
    transformers' Trainer reads them: the masking collator draws each micro-batch's masks once. bertkit collated the
    later micro-batches a second time to count them, so it trained on other masks than transformers' and divided by
    the count of masks it never trained on (grad_norm 2.76 against 2.67 at the first step). The reference is
    transformers with a loss that honours num_items_in_batch (BERT's own ignores it: docs)."""
    mlm = tmp_path / "mlm"
    torch.manual_seed(0)
    transformers.BertForMaskedLM(transformers.AutoConfig.from_pretrained(checkpoint)).save_pretrained(mlm)
    transformers.AutoTokenizer.from_pretrained(checkpoint).save_pretrained(mlm)

    def per_token(outputs, labels, num_items_in_batch):
        logits = outputs["logits"]
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="sum") / \
            num_items_in_batch

    runs = []
    for lib in (transformers, bertkit):
        tokenizer = lib.AutoTokenizer.from_pretrained(mlm)
        train = datasets.Dataset.from_list(TRAIN[:13]).map(lambda b, t=tokenizer: t(b["text"], truncation=True),
                                                           batched=True, remove_columns=["text", "label"])
        args = lib.TrainingArguments(output_dir=str(tmp_path / lib.__name__), learning_rate=1e-3,
                                     per_device_train_batch_size=4, gradient_accumulation_steps=2, num_train_epochs=2,
                                     logging_steps=1, save_strategy="no", report_to="none", use_cpu=True, seed=7,
                                     disable_tqdm=True)
        trainer = lib.Trainer(model=lib.AutoModelForMaskedLM.from_pretrained(mlm), args=args, train_dataset=train,
                              processing_class=tokenizer, data_collator=lib.DataCollatorForLanguageModeling(
                                  tokenizer, seed=3, mlm_probability=0.3),
                              **({"compute_loss_func": per_token} if lib is transformers else {}))
        trainer.train()
        runs.append(trainer)
    theirs, ours = ([(h["loss"], h["grad_norm"]) for h in t.state.log_history if "loss" in h] for t in runs)
    assert len(theirs) == 4  # 4 micro-batches an epoch, the last of one row
    np.testing.assert_allclose(ours, theirs, rtol=1e-5)  # the logged loss: the step's token mean
    # atol 1e-5, not 1e-6: AdamW moves each weight by about lr (1e-3) a step whatever its gradient's size, so a
    # gradient near zero that differs in its last float bits (kernels differ between CPUs) moves a few 1e-6 apart
    for (name, a), (_, b) in zip(runs[1].model.state_dict().items(), runs[0].model.state_dict().items()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=name)


@pytest.mark.parametrize("head", ["MaskedLM", "PreTraining"])
def test_masked_lm_predictions_are_transformers_per_token_logits(checkpoint, tmp_path, head):
    """predict() on a masked-LM model: (B, T, V) logits beside the (B, T) labels (and the next-sentence logits), as
    transformers gives them. Was: the head's labelled-position logits (N, V), twice (as logits and prediction_logits),
    cut to the first B rows; and no next-sentence logits, so predictions[0] was the first row of the MLM logits."""
    model_dir = tmp_path / head
    torch.manual_seed(0)
    getattr(transformers, f"BertFor{head}")(transformers.AutoConfig.from_pretrained(checkpoint)).save_pretrained(model_dir)
    transformers.AutoTokenizer.from_pretrained(checkpoint).save_pretrained(model_dir)

    def masked_accuracy(p):
        logits, labels = (p.predictions[0], p.label_ids[0]) if head == "PreTraining" else p
        scored = labels != -100
        return {"accuracy": float((logits.argmax(-1)[scored] == labels[scored]).mean()), "masked": int(scored.sum())}

    outputs = []
    for lib in (transformers, bertkit):
        tokenizer = lib.AutoTokenizer.from_pretrained(model_dir)
        rows = [dict(tokenizer(r["text"])) for r in TEST] if head == "MaskedLM" else [
            {**tokenizer(r["text"], r["text"][::-1]), "next_sentence_label": r["label"]} for r in TEST]
        args = lib.TrainingArguments(output_dir=str(tmp_path / lib.__name__), per_device_eval_batch_size=4,
                                     report_to="none", use_cpu=True, disable_tqdm=True)
        trainer = lib.Trainer(model=getattr(lib, f"AutoModelFor{head}").from_pretrained(model_dir), args=args,
                              processing_class=tokenizer, compute_metrics=masked_accuracy,
                              data_collator=lib.DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.3, seed=0))
        outputs.append(trainer.predict(rows))
    theirs, ours = outputs
    if head == "PreTraining":  # (MLM logits, next-sentence logits) and (MLM labels, next-sentence labels)
        assert [p.shape for p in ours.predictions] == [p.shape for p in theirs.predictions] == [
            (len(TEST), 54, 8960), (len(TEST), 2)]
        np.testing.assert_allclose(ours.predictions[1], theirs.predictions[1], atol=1e-5)
        np.testing.assert_array_equal(ours.label_ids[1], theirs.label_ids[1])
    else:
        assert ours.predictions.shape == theirs.predictions.shape == (len(TEST), 19, 8960)
    ours, theirs = ((*((o.predictions[0], o.label_ids[0]) if head == "PreTraining" else (o.predictions, o.label_ids)),
                     o.metrics) for o in (ours, theirs))
    np.testing.assert_array_equal(ours[1], theirs[1])
    scored = theirs[1] != -100
    np.testing.assert_allclose(ours[0][scored], theirs[0][scored], atol=1e-5)
    assert ours[2]["test_masked"] == theirs[2]["test_masked"] == {"MaskedLM": 33, "PreTraining": 127}[head]
    assert ours[2]["test_accuracy"] == theirs[2]["test_accuracy"]
    assert ours[2]["test_loss"] == pytest.approx(theirs[2]["test_loss"], rel=1e-5)


def _bertkit_trainer(checkpoint: Path, out: Path, callbacks=(), train=TRAIN, dropout: float = 0.0, **overrides):
    tokenizer = bertkit.AutoTokenizer.from_pretrained(checkpoint)
    model = bertkit.AutoModelForSequenceClassification.from_pretrained(
        checkpoint, hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout) if dropout else \
        bertkit.AutoModelForSequenceClassification.from_pretrained(checkpoint)
    rows = [{**tokenizer(r["text"], truncation=True), "label": r["label"]} for r in train]
    test = [{**tokenizer(r["text"], truncation=True), "label": r["label"]} for r in TEST]
    settings = dict(output_dir=str(out), learning_rate=1e-3, per_device_train_batch_size=4, max_steps=8,
                    logging_steps=1, save_steps=3, report_to="none", use_cpu=True, seed=3, disable_tqdm=True)
    args = bertkit.TrainingArguments(**{**settings, **overrides})
    return bertkit.Trainer(model=model, args=args, train_dataset=rows, eval_dataset=test, processing_class=tokenizer,
                           compute_metrics=accuracy, callbacks=list(callbacks))


def test_resume_from_checkpoint_reproduces_the_uninterrupted_run(checkpoint, tmp_path):
    whole = _bertkit_trainer(checkpoint, tmp_path / "whole", dropout=0.1)  # dropout on: RNG states must resume too
    whole_result = whole.train()

    killed = _bertkit_trainer(checkpoint, tmp_path / "killed", callbacks=[KillAt(4)], dropout=0.1)
    with pytest.raises(Killed):
        killed.train()
    assert sorted(p.name for p in (tmp_path / "killed").glob("checkpoint-*")) == ["checkpoint-3"]
    again = _bertkit_trainer(checkpoint, tmp_path / "killed", dropout=0.1)
    result = again.train(resume_from_checkpoint=True)

    assert result.global_step == 8
    assert _losses(again.state.log_history) == _losses(whole.state.log_history)  # every step, exactly
    # as transformers: the mean loss of the steps this call trained (4-8, logged one a step), not the whole run's
    resumed_steps = [loss for step, loss, _ in _losses(whole.state.log_history) if step > 3]
    assert result.training_loss == pytest.approx(sum(resumed_steps) / len(resumed_steps), rel=1e-9)
    assert result.training_loss != pytest.approx(whole_result.training_loss, rel=1e-6)
    # checkpoint-3 between two logs (logging_steps 2: step 3's loss waits in the window): still the mean of steps 4-8,
    # not one that weighs the step-4 log (the mean of steps 3 and 4) as step 4's loss
    with pytest.raises(Killed):
        _bertkit_trainer(checkpoint, tmp_path / "between", callbacks=[KillAt(4)], dropout=0.1, logging_steps=2).train()
    between = _bertkit_trainer(checkpoint, tmp_path / "between", dropout=0.1, logging_steps=2)
    assert between.train(resume_from_checkpoint=True).training_loss == pytest.approx(result.training_loss, rel=1e-9)
    finished = _bertkit_trainer(checkpoint, tmp_path / "whole", dropout=0.1).train(resume_from_checkpoint=True)
    assert finished.global_step == 8  # a finished run trains no further step (transformers 5.24 trains one past it)
    for (name, a), (_, b) in zip(again.model.state_dict().items(), whole.model.state_dict().items()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)
    # a named checkpoint, not the newest: the finished run replayed from step 3 ends where it ended
    replay = _bertkit_trainer(checkpoint, tmp_path / "whole", dropout=0.1)
    replay.train(resume_from_checkpoint=str(tmp_path / "whole" / "checkpoint-3"))
    assert _losses(replay.state.log_history) == _losses(whole.state.log_history)
    # checkpoint-N directories in the Hugging Face layout, with the tokenizer: transformers loads them
    last = tmp_path / "whole" / "checkpoint-8"
    assert {"config.json", "model.safetensors", "vocab.txt", "trainer_state.json"} <= {p.name for p in last.iterdir()}
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(last).eval()
    hf_tok = transformers.AutoTokenizer.from_pretrained(last)
    enc = hf_tok([r["text"] for r in TEST[:4]], padding=True, return_tensors="pt")
    whole.model.eval()
    with torch.no_grad():
        torch.testing.assert_close(hf(**enc).logits, whole.model(**enc).logits, rtol=1e-4, atol=1e-5)


def test_a_checkpoint_holding_its_weights_in_state_pt_resumes_from_them(checkpoint, tmp_path):
    # the weights are stored once, in model.safetensors, which state.pt names; a checkpoint written before held
    # them in state.pt too, and resumes from those
    whole = _bertkit_trainer(checkpoint, tmp_path / "whole")
    whole.train()
    killed = _bertkit_trainer(checkpoint, tmp_path / "old", callbacks=[KillAt(4)])
    with pytest.raises(Killed):
        killed.train()
    path = tmp_path / "old" / "checkpoint-3"
    state = torch.load(path / "state.pt", weights_only=True)
    assert state["model"] == "model.safetensors"
    from safetensors.torch import load_file

    state["model"] = load_file(path / "model.safetensors")
    assert state["model"].keys() == whole.model.state_dict().keys()
    torch.save(state, path / "state.pt")
    (path / "model.safetensors").unlink()  # what resumes is state.pt's copy
    again = _bertkit_trainer(checkpoint, tmp_path / "old")
    assert again.train(resume_from_checkpoint=True).global_step == 8
    assert _losses(again.state.log_history) == _losses(whole.state.log_history)


# A Trainer script, run in a child process when it is to be killed, else in this one (argv: spec.json, then "resume"
# or nothing): the rows, the checkpoint and the settings come from the spec; its log history is written to spec's
# "history" path when train() returns.
_TRAINER_SCRIPT = r"""
import json, sys
import bertkit
from pathlib import Path
spec = json.loads(Path(sys.argv[4]).read_text())
tokenizer = bertkit.AutoTokenizer.from_pretrained(spec["checkpoint"])
model = bertkit.AutoModelForSequenceClassification.from_pretrained(
    spec["checkpoint"], hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
rows = [{**tokenizer(r["text"], truncation=True), "label": r["label"]} for r in spec["train"]]
args = bertkit.TrainingArguments(**spec["args"])
trainer = bertkit.Trainer(model=model, args=args, train_dataset=rows, processing_class=tokenizer)
trainer.train(resume_from_checkpoint=True if sys.argv[5:] == ["resume"] else None)
Path(spec["history"]).write_text(json.dumps(trainer.state.log_history))
"""


def _trainer_spec(checkpoint: Path, directory: Path, name: str) -> Path:
    """The spec _TRAINER_SCRIPT reads: 8 steps, a checkpoint every 3, dropout on; the run and its log in ``directory``."""
    path = directory / f"{name}.json"
    path.write_text(json.dumps({
        "checkpoint": str(checkpoint), "train": TRAIN, "history": str(directory / f"{name}-history.json"),
        "args": dict(output_dir=str(directory / name), learning_rate=1e-3, per_device_train_batch_size=4,
                     max_steps=8, logging_steps=1, save_steps=3, report_to="none", use_cpu=True, seed=3,
                     disable_tqdm=True)}))
    return path


def _run_trainer_script(*argv: str) -> None:
    """_TRAINER_SCRIPT in this process on one thread, as a child of killing.child_env() runs it (OMP_NUM_THREADS=1),
    so that its losses and weights compare bit for bit with the killed child's (as killing.run_here runs a command):
    only the run that is killed needs a process of its own."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(sys, "argv", ["-c", "-", "0", "-", *argv])  # the script reads its spec from sys.argv[4]
            exec(compile(_TRAINER_SCRIPT, "<trainer script>", "exec"), {"__name__": "__main__"})
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def uninterrupted_trainer_run(checkpoint, tmp_path_factory) -> Path:
    """The directory of the run nobody killed (``whole``), which each kill below is compared with."""
    directory = tmp_path_factory.mktemp("trainer-whole")
    _run_trainer_script(str(_trainer_spec(checkpoint, directory, "whole")))
    return directory


@pytest.mark.parametrize("where", slow_after(["state", "renamed"]))
def test_a_trainer_killed_with_sigkill_resumes_to_the_uninterrupted_run(checkpoint, uninterrupted_trainer_run, tmp_path,
                                                                        where):
    """A ``bertkit.Trainer`` script SIGKILLed in the middle of its second checkpoint (a half-written state file, or
    just after the rename) resumes with ``train(resume_from_checkpoint=True)`` to the same loss at every step and the
    same weights as the run nobody killed (dropout on: the RNG states resume too). The killed run is a process of
    its own; the run nobody killed and the resume run in this process, on one thread as the killed one does."""
    import safetensors.torch

    from killing import child_env, launch_paused

    killed = _trainer_spec(checkpoint, tmp_path, "killed")
    assert launch_paused([str(killed)], where, 2, tmp_path / "sentinel", child_env(), script=_TRAINER_SCRIPT)
    assert not (tmp_path / "killed-history.json").exists()
    _run_trainer_script(str(killed), "resume")

    def losses(directory: Path, name: str) -> list[tuple[int, float]]:
        history = json.loads((directory / f"{name}-history.json").read_text())
        return [(h["step"], h["loss"]) for h in history if "loss" in h]

    whole = losses(uninterrupted_trainer_run, "whole")
    assert len(whole) == 8 and losses(tmp_path, "killed")[-5:] == whole[-5:]  # steps 4-8 (or 7-8) again
    final = [safetensors.torch.load_file(directory / name / "checkpoint-8" / "model.safetensors")
             for directory, name in ((uninterrupted_trainer_run, "whole"), (tmp_path, "killed"))]
    assert final[0].keys() == final[1].keys()
    for key in final[0]:
        torch.testing.assert_close(final[0][key], final[1][key], rtol=0, atol=0, msg=key)


def test_resuming_with_other_settings_is_refused_and_writes_nothing(checkpoint, tmp_path):
    with pytest.raises(Killed):
        _bertkit_trainer(checkpoint, tmp_path / "run", callbacks=[KillAt(4)]).train()
    before = {p: p.stat().st_mtime_ns for p in (tmp_path / "run").rglob("*")}
    with pytest.raises(BertkitError, match="other settings") as e:
        _bertkit_trainer(checkpoint, tmp_path / "run", learning_rate=5e-4).train(resume_from_checkpoint=True)
    assert "learning_rate" in str(e.value)
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "run").rglob("*")} == before
    with pytest.raises(BertkitError, match="already holds checkpoints"):  # and not resuming at all
        _bertkit_trainer(checkpoint, tmp_path / "run").train()


def test_float_labels_reach_a_regression_head_as_floats(checkpoint, tmp_path):
    """DataCollatorWithPadding (tokenizer.pad) made every column int64, so regression scores 0.7 and 2.4 trained
    and evaluated as 0 and 2 without a word (eval_loss 0.00028 where transformers gives 0.074); soft multi-label
    targets were cut the same way. Float columns stay float32, as transformers' pad makes them."""
    tok = bertkit.AutoTokenizer.from_pretrained(checkpoint)
    soft = [{"input_ids": [101, 7592, 102], "labels": [0.3, 1.0]}, {"input_ids": [101, 102], "labels": [0.5, 0.0]}]
    ours = bertkit.DataCollatorWithPadding(tok)(soft)["labels"]
    theirs = transformers.DataCollatorWithPadding(transformers.AutoTokenizer.from_pretrained(checkpoint))(soft)["labels"]
    assert ours.dtype == theirs.dtype == torch.float32
    torch.testing.assert_close(ours, theirs, rtol=0, atol=0)
    assert tok.pad([{"input_ids": [101, 102], "label": True}], return_tensors="pt")["label"].dtype == torch.bool

    scorer = tmp_path / "scorer"
    torch.manual_seed(0)
    config = transformers.AutoConfig.from_pretrained(checkpoint, num_labels=1)
    transformers.BertForSequenceClassification(config).save_pretrained(scorer)
    transformers.AutoTokenizer.from_pretrained(checkpoint).save_pretrained(scorer)
    runs = []
    for lib in (transformers, bertkit):
        tokenizer = lib.AutoTokenizer.from_pretrained(scorer)
        model = lib.AutoModelForSequenceClassification.from_pretrained(scorer)
        rows = [{**tokenizer(r["text"], truncation=True), "label": 0.7 * r["label"] + 0.1 * len(r["text"]) % 3}
                for r in TRAIN + TEST]
        args = lib.TrainingArguments(output_dir=str(tmp_path / lib.__name__), learning_rate=1e-3, max_steps=6,
                                     per_device_train_batch_size=4, logging_steps=1, save_strategy="no",
                                     report_to="none", use_cpu=True, seed=7, disable_tqdm=True)
        trainer = lib.Trainer(model=model, args=args, train_dataset=datasets.Dataset.from_list(rows[:37]),
                              processing_class=tokenizer, data_collator=lib.DataCollatorWithPadding(tokenizer))
        trainer.train()
        runs.append((_losses(trainer.state.log_history), trainer.predict(datasets.Dataset.from_list(rows[37:]))))
    (theirs, hf_pred), (ours, bk_pred) = runs
    np.testing.assert_allclose([x[1] for x in ours], [x[1] for x in theirs], rtol=1e-5)
    assert bk_pred.label_ids.dtype == hf_pred.label_ids.dtype == np.float32
    np.testing.assert_array_equal(bk_pred.label_ids, hf_pred.label_ids)
    assert len(set(np.round(bk_pred.label_ids % 1, 3))) > 2  # scores with fractions: a truncation would show
    assert bk_pred.metrics["test_loss"] == pytest.approx(hf_pred.metrics["test_loss"], rel=1e-5)


def test_load_best_model_at_end_ends_on_the_best_checkpoints_weights(checkpoint, tmp_path):
    # greater_is_better on the loss makes the best checkpoint an early one, so "best" differs from "last"
    trainer = _bertkit_trainer(checkpoint, tmp_path / "best", max_steps=8, eval_strategy="steps", eval_steps=2,
                               save_steps=2, save_total_limit=1, load_best_model_at_end=True,
                               metric_for_best_model="eval_loss", greater_is_better=True, learning_rate=3e-3)
    trainer.train()
    evals = [h for h in trainer.state.log_history if "eval_loss" in h]
    assert [h["step"] for h in evals] == [2, 4, 6, 8]
    best = max(evals, key=lambda h: h["eval_loss"])
    assert best["step"] != 8
    assert trainer.state.best_model_checkpoint == str(tmp_path / "best" / f"checkpoint-{best['step']}")
    assert trainer.state.best_metric == best["eval_loss"]
    # save_total_limit=1 keeps the newest checkpoint and the best one
    assert sorted(p.name for p in (tmp_path / "best").glob("checkpoint-*")) == sorted(
        {f"checkpoint-{best['step']}", "checkpoint-8"})
    saved = bertkit.AutoModelForSequenceClassification.from_pretrained(trainer.state.best_model_checkpoint)
    for (name, a), (_, b) in zip(trainer.model.state_dict().items(), saved.state_dict().items()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)
    assert trainer.evaluate()["eval_loss"] == pytest.approx(best["eval_loss"], rel=1e-5)
    state = json.loads((Path(trainer.state.best_model_checkpoint) / "trainer_state.json").read_text())
    assert state["global_step"] == best["step"]


def test_early_stopping_stops_when_the_metric_stops_improving(checkpoint, tmp_path):
    trainer = _bertkit_trainer(checkpoint, tmp_path / "early", max_steps=40, eval_strategy="steps", eval_steps=1,
                               save_steps=1, metric_for_best_model="accuracy", learning_rate=1e-5, save_total_limit=1,
                               callbacks=[bertkit.EarlyStoppingCallback(early_stopping_patience=2)])
    result = trainer.train()
    evals = [h["eval_accuracy"] for h in trainer.state.log_history if "eval_accuracy" in h]
    assert result.global_step < 40
    assert len(evals) == result.global_step  # one evaluation per step, none after the stop
    assert max(evals[-2:]) <= max(evals[:-2])  # the last two did not improve on the best before them


def test_gradient_accumulation_trains_as_the_larger_batch(checkpoint, tmp_path):
    """2 micro-batches of 2 make the step 1 batch of 4 makes: the same examples (the order is per example), the
    same mean loss and gradient (transformers 5 sums the two means for this model instead: docs)."""
    runs = []
    for name, size, accum in (("one", 4, 1), ("two", 2, 2)):
        trainer = _bertkit_trainer(checkpoint, tmp_path / name, per_device_train_batch_size=size,
                                   gradient_accumulation_steps=accum, max_steps=6, save_strategy="no")
        trainer.train()
        runs.append(trainer)
    one, two = (_losses(t.state.log_history) for t in runs)
    assert [s for s, _, _ in one] == [s for s, _, _ in two] == list(range(1, 7))
    np.testing.assert_allclose([x[1] for x in one], [x[1] for x in two], rtol=1e-5)
    for (name, a), (_, b) in zip(runs[0].model.state_dict().items(), runs[1].model.state_dict().items()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize("logging_steps", [1, 2])
def test_accumulation_that_does_not_divide_an_epoch_makes_a_short_step_as_transformers(checkpoint, tmp_path,
                                                                                       logging_steps):
    """37 rows in batches of 4 are 10 micro-batches an epoch; with accumulation 3 transformers makes 4 steps of each
    epoch, the last of one micro-batch (its loss that one's mean), and never carries micro-batches into the next
    epoch. transformers is told its model takes no loss kwargs, so that it averages the step's micro-batch means as
    bertkit does (for this model it otherwise sums them: see the test above). A log of two steps, one of them the
    short one, is the mean of the two steps' losses (bertkit's was the mean of the 4 micro-batches': 0.7% apart)."""
    runs, train_loss = {}, {}
    for lib in (transformers, bertkit):
        tokenizer = lib.AutoTokenizer.from_pretrained(checkpoint)
        model = lib.AutoModelForSequenceClassification.from_pretrained(checkpoint)
        train = datasets.Dataset.from_list(TRAIN).map(lambda b, tok=tokenizer: tok(b["text"], truncation=True), batched=True)
        args = lib.TrainingArguments(output_dir=str(tmp_path / lib.__name__), learning_rate=1e-3,
                                     per_device_train_batch_size=4, gradient_accumulation_steps=3, num_train_epochs=2,
                                     logging_steps=logging_steps, save_strategy="no", report_to="none", use_cpu=True,
                                     seed=7, disable_tqdm=True)
        trainer = lib.Trainer(model=model, args=args, train_dataset=train, processing_class=tokenizer,
                              data_collator=lib.DataCollatorWithPadding(tokenizer))
        trainer.model_accepts_loss_kwargs = False
        train_loss[lib.__name__] = trainer.train().training_loss
        runs[lib.__name__] = trainer.state.log_history
    ours, theirs = (_losses(runs[name]) for name in ("bertkit", "transformers"))
    assert [s for s, _, _ in ours] == [s for s, _, _ in theirs] == list(range(logging_steps, 9, logging_steps))
    np.testing.assert_allclose([x[1] for x in ours], [x[1] for x in theirs], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose([x[2] for x in ours], [x[2] for x in theirs], rtol=1e-9)
    assert train_loss["bertkit"] == pytest.approx(train_loss["transformers"], rel=1e-5)
    epochs = [[round(h["epoch"], 4) for h in runs[name] if "loss" in h] for name in ("bertkit", "transformers")]
    assert epochs[0] == epochs[1] and 1.0 in epochs[0]  # the 4th step ends the first epoch


def test_group_by_length_pads_less_and_keeps_every_example(checkpoint, tmp_path):
    trainer = _bertkit_trainer(checkpoint, tmp_path / "grouped", train_sampling_strategy="group_by_length")
    rows = trainer._examples(trainer.train_dataset, "train_dataset")
    lengths = [len(r["input_ids"]) for r in rows]

    def padding(order: list[int]) -> int:
        batches = [order[i:i + 4] for i in range(0, len(order), 4)]
        return sum(max(lengths[i] for i in b) * len(b) - sum(lengths[i] for i in b) for b in batches)

    order, grouped = trainer._order(rows), []
    for epoch in (0, 1):  # each epoch's order is drawn from torch's generator as the epoch begins
        trainer._grouped.begin_epoch(epoch)
        grouped.append(list(order(epoch)))
    assert all(sorted(o) == list(range(len(rows))) for o in grouped) and grouped[0] != grouped[1]
    shuffled = list(_bertkit_trainer(checkpoint, tmp_path / "random")._order(rows)(0))
    assert padding(grouped[0]) < padding(shuffled) * 0.7  # megabatches of 2 batches here (32 rows): 76 against 126
    result = trainer.train()
    assert result.global_step == 8 and np.isfinite(result.training_loss)


def test_save_model_writes_a_directory_both_libraries_load(checkpoint, tmp_path):
    trainer = _bertkit_trainer(checkpoint, tmp_path / "run", max_steps=2, save_strategy="no")
    trainer.train()
    for _ in range(2):  # a second save over the first replaces it
        trainer.save_model(tmp_path / "final")
    enc = transformers.AutoTokenizer.from_pretrained(tmp_path / "final")(["a fun movie"], return_tensors="pt")
    ours = bertkit.AutoModelForSequenceClassification.from_pretrained(tmp_path / "final")
    theirs = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path / "final").eval()
    trainer.model.eval()
    with torch.no_grad():
        torch.testing.assert_close(ours(**enc).logits, trainer.model(**enc).logits, rtol=0, atol=0)
        torch.testing.assert_close(theirs(**enc).logits, trainer.model(**enc).logits, rtol=1e-4, atol=1e-5)


def test_data_as_a_list_a_torch_dataset_and_unused_columns(checkpoint, tmp_path):
    class Rows(torch.utils.data.Dataset):
        def __init__(self, rows):
            self.rows = rows

        def __len__(self):
            return len(self.rows)

        def __getitem__(self, i):
            return self.rows[i]

    tok = bertkit.AutoTokenizer.from_pretrained(checkpoint)
    rows = [{**tok(r["text"], truncation=True), "label": r["label"], "text": r["text"], "idx": i}
            for i, r in enumerate(TRAIN)]
    class Logs(bertkit.TrainerCallback):
        def __init__(self):
            self.logs = []

        def on_log(self, args, state, control, logs=None, **kwargs):
            self.logs.append(logs)

    losses = []
    for data in (rows, Rows(rows)):  # the extra columns (text, idx) are dropped, as transformers does
        seen = Logs()
        trainer = _bertkit_trainer(checkpoint, tmp_path / f"data{len(losses)}", max_steps=3, save_strategy="no",
                                   callbacks=[seen])
        trainer.train_dataset = data
        trainer.train()
        losses.append(_losses(trainer.state.log_history))
        assert [log.get("loss") for log in seen.logs] == [h.get("loss") for h in trainer.state.log_history]
    assert losses[0] == losses[1] and len(losses[0]) == 3
    assert not list((tmp_path / "data0").glob("checkpoint-*"))  # save_strategy="no"


def test_mistakes_are_named_and_nothing_is_written(checkpoint, tmp_path):
    out = tmp_path / "never"
    tok = bertkit.AutoTokenizer.from_pretrained(checkpoint)
    unlabelled = [tok(r["text"]) for r in TRAIN]
    trainer = _bertkit_trainer(checkpoint, out)
    trainer.train_dataset = [dict(r) for r in unlabelled]
    with pytest.raises(BertkitError, match="has no labels"):
        trainer.train()
    extra = [{**tok(r["text"]), "label": r["label"], "weight": 1.0} for r in TRAIN]
    trainer = _bertkit_trainer(checkpoint, out, remove_unused_columns=False)
    trainer.train_dataset = extra
    with pytest.raises(BertkitError, match=r"\['weight'\] are not arguments of BertForSequenceClassification"):
        trainer.train()
    with pytest.raises(BertkitError, match="metric_for_best_model 'f1' is not a metric this run computes"):
        _bertkit_trainer(checkpoint, out, eval_strategy="steps", eval_steps=2, metric_for_best_model="f1").train()
    with pytest.raises(BertkitError, match="eval_strategy 'epoch' needs an eval_dataset"):
        bertkit.Trainer(model=trainer.model, args=bertkit.TrainingArguments(output_dir=str(out), eval_strategy="epoch"))
    with pytest.raises(BertkitError, match="holds no checkpoint-N"):
        _bertkit_trainer(checkpoint, out).train(resume_from_checkpoint=True)
    assert not out.exists()

    with pytest.raises(BertkitError, match="unknown argument 'lerning_rate'; did you mean learning_rate"):
        bertkit.TrainingArguments(output_dir="x", lerning_rate=1e-4)
    with pytest.raises(BertkitError, match="push_to_hub=True is a transformers argument bertkit does not implement"):
        bertkit.TrainingArguments(output_dir="x", push_to_hub=True)
    assert bertkit.TrainingArguments(output_dir="x", push_to_hub=False).output_dir == Path("x")  # its default
    with pytest.raises(BertkitError, match="learning_rate must be a finite positive number, got -1"):
        bertkit.TrainingArguments(output_dir="x", learning_rate=-1)
    with pytest.raises(BertkitError, match="save_strategy 'epoch' must equal eval_strategy 'steps'"):
        bertkit.TrainingArguments(output_dir="x", eval_strategy="steps", save_strategy="epoch",
                                  load_best_model_at_end=True)

    class NoPad:
        pad_token = pad_token_id = None
        mask_token = "[MASK]"

    for collator in (bertkit.DataCollatorWithPadding, bertkit.DataCollatorForTokenClassification,
                     bertkit.DataCollatorForLanguageModeling):
        with pytest.raises(BertkitError, match="has no pad token"):
            collator(NoPad())


def test_every_transformers_argument_is_implemented_or_refused_by_name():
    from bertkit.training.trainer_args import REFUSED

    theirs = {f.name for f in dataclasses.fields(transformers.TrainingArguments) if f.init}
    ours = {f.name for f in dataclasses.fields(bertkit.TrainingArguments) if f.init}
    assert theirs - ours - set(REFUSED) == set()
    assert not ours & set(REFUSED)
    defaults = {f.name: f.default for f in dataclasses.fields(transformers.TrainingArguments) if f.init}
    for name, default in REFUSED.items():  # a refused argument at transformers' default is accepted
        if name in defaults and defaults[name] is not dataclasses.MISSING:
            assert default == defaults[name], name
    for name in ("learning_rate", "per_device_train_batch_size", "num_train_epochs", "weight_decay", "seed",
                 "logging_steps", "save_steps", "eval_strategy", "save_strategy", "max_grad_norm", "adam_epsilon"):
        theirs_default = next(f.default for f in dataclasses.fields(transformers.TrainingArguments) if f.name == name)
        assert getattr(bertkit.TrainingArguments(output_dir="x"), name) == theirs_default, name


# -------------------------------------------------------------------------------------------------
# Collators: transformers' given bertkit's tokenizer, and bertkit's against transformers'
# -------------------------------------------------------------------------------------------------


SENTENCES = ["The quick brown fox jumps over the lazy dog.", "Tokenization isn't trivial, unbelievably so!",
             "Hello world", "A much longer sentence, with commas, numbers like 1234 and unusual words: zygote."]


def test_transformers_collators_accept_bertkit_tokenizer(minilm_dir):
    ours = bertkit.BertTokenizer.from_pretrained(minilm_dir)
    theirs = transformers.BertTokenizerFast.from_pretrained(minilm_dir)
    assert len(ours) == len(theirs)
    for text in SENTENCES:
        ids = theirs(text)["input_ids"]
        assert ours.get_special_tokens_mask(ids, already_has_special_tokens=True) == \
            theirs.get_special_tokens_mask(ids, already_has_special_tokens=True)
        plain = theirs(text, add_special_tokens=False)["input_ids"]
        # without special tokens: the mask of [CLS] A [SEP] (B [SEP]), transformers 4's answer (5 raises)
        pair = theirs(text, text, truncation=False)["input_ids"]
        assert ours.get_special_tokens_mask(plain) == theirs.get_special_tokens_mask(
            theirs(text)["input_ids"], already_has_special_tokens=True)
        assert ours.get_special_tokens_mask(plain, plain) == theirs.get_special_tokens_mask(
            pair, already_has_special_tokens=True)
    for name in ("DataCollatorForLanguageModeling", "DataCollatorForTokenClassification", "DataCollatorWithPadding"):
        outs = []
        for tok in (ours, theirs):
            features = [dict(tok(s)) for s in SENTENCES]
            if name == "DataCollatorForTokenClassification":
                features = [{**f, "labels": [i % 3 for i in range(len(f["input_ids"]))]} for f in features]
            kwargs = {"seed": 0} if name == "DataCollatorForLanguageModeling" else {}
            outs.append(getattr(transformers, name)(tok, **kwargs)(features))
        assert sorted(outs[0]) == sorted(outs[1]), name
        for key in outs[0]:
            torch.testing.assert_close(outs[0][key], outs[1][key], msg=f"{name} {key}")
        if name == "DataCollatorForLanguageModeling":
            assert int((outs[0]["labels"] != -100).sum()) > 0


def test_bertkit_collators_match_transformers(minilm_dir):
    tok = bertkit.BertTokenizer.from_pretrained(minilm_dir)
    features = [dict(tok(s)) for s in SENTENCES * 4]
    mlm_ours = bertkit.DataCollatorForLanguageModeling(tok, seed=5)(features)
    mlm_theirs = transformers.DataCollatorForLanguageModeling(tok, seed=5)(features)
    for key in ("input_ids", "labels", "attention_mask"):
        torch.testing.assert_close(mlm_ours[key], mlm_theirs[key], msg=key)
    # run_mlm.py's spelling, mlm=True, was a TypeError; mlm=False (next-token labels) is refused by name
    spelled = bertkit.DataCollatorForLanguageModeling(tokenizer=tok, mlm=True, mlm_probability=0.15, seed=5)(features)
    torch.testing.assert_close(spelled["labels"], mlm_theirs["labels"])
    with pytest.raises(BertkitError, match=r"mlm=False\): bertkit makes masked-LM batches only"):
        bertkit.DataCollatorForLanguageModeling(tok, mlm=False)
    targets = mlm_ours["labels"] != -100
    assert 0 < int(targets.sum()) and not bool((targets & (mlm_ours["attention_mask"] == 0)).any())
    labelled = [{**f, "label": i % 2} for i, f in enumerate(features)]
    pad_ours = bertkit.DataCollatorWithPadding(tok)(labelled)
    pad_theirs = transformers.DataCollatorWithPadding(tok)(labelled)
    assert sorted(pad_ours) == sorted(pad_theirs)
    for key in pad_ours:
        torch.testing.assert_close(pad_ours[key], pad_theirs[key], msg=key)
    tagged = [{**f, "labels": [1] * len(f["input_ids"])} for f in features]
    tc_ours = bertkit.DataCollatorForTokenClassification(tok)(tagged)
    tc_theirs = transformers.DataCollatorForTokenClassification(tok)(tagged)
    for key in tc_theirs:
        torch.testing.assert_close(tc_ours[key], tc_theirs[key], msg=key)
    fixed = [{"input_ids": [101, 7592, 102], "label": 1}, {"input_ids": [101, 2088, 102], "label": 0}]
    default = bertkit.DefaultDataCollator()(fixed)
    torch.testing.assert_close(default["labels"], torch.tensor([1, 0]))
    torch.testing.assert_close(default["input_ids"], transformers.DefaultDataCollator()(fixed)["input_ids"])


def test_default_collator_keeps_each_columns_dtype_as_transformers():
    """A bool column (a dataset's ``is_impossible``, a mask) stays bool, as transformers stacks it; bertkit made it
    int64. A bool ``label`` is a class id (int64) in both."""
    fixed = [{"input_ids": [101, 7592, 102], "label": True, "flag": False, "weight": 0.5, "n": 3},
             {"input_ids": [101, 2088, 102], "label": False, "flag": True, "weight": 1.5, "n": 4}]
    ours, theirs = bertkit.DefaultDataCollator()(fixed), transformers.DefaultDataCollator()(fixed)
    assert sorted(ours) == sorted(theirs) == ["flag", "input_ids", "labels", "n", "weight"]
    for key in theirs:
        torch.testing.assert_close(ours[key], theirs[key], msg=key)  # dtypes too: flag bool, labels int64


@pytest.mark.parametrize("columns", [("label", "labels"), ("label", "label_ids"), ("labels", "label_ids"),
                                     ("label_ids", "labels", "label")])
def test_default_collator_picks_among_label_columns_as_transformers(columns):
    """Rows with more than one label column: transformers' DefaultDataCollator takes ``labels``, else ``label``, else
    ``label_ids``; bertkit's took ``label_ids``, else ``label`` (DataCollatorWithPadding's order), and trained on
    other numbers without a word."""
    values = {"label": [0, 1], "labels": [10, 11], "label_ids": [[20], [21]]}
    fixed = [{"input_ids": [101, 7592, 102], **{c: values[c][i] for c in columns}} for i in range(2)]
    ours, theirs = bertkit.DefaultDataCollator()(fixed), transformers.DefaultDataCollator()(fixed)
    assert sorted(ours) == sorted(theirs) == ["input_ids", "labels"]
    wanted = next(values[c] for c in ("labels", "label", "label_ids") if c in columns)
    assert ours["labels"].tolist() == theirs["labels"].tolist() == wanted


def test_default_collator_reads_dataclass_features_as_transformers():
    """InputFeatures-like dataclasses (the older GLUE processors' output): transformers collates their fields; bertkit
    failed with "'F' object is not iterable"."""
    import dataclasses

    @dataclasses.dataclass
    class F:
        input_ids: list
        attention_mask: list
        label: int

    features = [F([101, 7592, 102], [1, 1, 1], 1), F([101, 2088, 102], [1, 1, 1], 0)]
    ours, theirs = bertkit.DefaultDataCollator()(features), transformers.DefaultDataCollator()(features)
    assert sorted(ours) == sorted(theirs) == ["attention_mask", "input_ids", "labels"]
    for key in theirs:
        assert ours[key].tolist() == theirs[key].tolist() and ours[key].dtype == theirs[key].dtype, key
    with pytest.raises(BertkitError, match="a feature is list"):
        bertkit.DefaultDataCollator()([[101, 102]])


def test_whole_word_masking_masks_every_piece_of_a_chosen_word(minilm_dir):
    tok = bertkit.BertTokenizer.from_pretrained(minilm_dir)
    features = [dict(tok(s, return_offsets_mapping=True)) for s in SENTENCES * 8]
    batch = bertkit.DataCollatorForLanguageModeling(tok, whole_word_mask=True, mlm_probability=0.3, seed=1)(features)
    masked = batch["labels"] != -100
    assert int(masked.sum()) > 10
    assert bool((batch["input_ids"][masked] == tok.mask_token_id).all())  # whole words: all [MASK]
    continuation = torch.tensor([[t.startswith("##") for t in tok.convert_ids_to_tokens(row)]
                                 for row in batch["labels"].masked_fill(~masked, 0).tolist()])
    # a masked "##" piece has its word's previous piece masked too
    assert bool(masked[:, :-1][continuation[:, 1:] & masked[:, 1:]].all())
    assert int((continuation & masked).sum()) > 0


def test_whole_word_masking_finds_words_as_transformers_5_does(minilm_dir):
    """transformers 5 reads words from the offsets: "don't", "stop-believing" and "東京" are one word each, so the
    same seed masks what it masks (bertkit took BERT's "##" pieces for words: three, three and two there, and a
    different mask at every seed on such text). Without offsets the collator says what to pass."""
    texts = ["don't stop-believing, it's 3.5% of the U.S. market", "東京は日本の首都です e-mail me", "the plot was fun"]
    theirs_tok = transformers.BertTokenizerFast.from_pretrained(minilm_dir)
    ours_tok = bertkit.BertTokenizer.from_pretrained(minilm_dir)
    enc = theirs_tok(texts * 4, padding="max_length", max_length=32, return_offsets_mapping=True)
    features = [{k: enc[k][i] for k in enc} for i in range(len(texts) * 4)]  # transformers pads no offsets itself
    for seed in range(8):
        ours = bertkit.DataCollatorForLanguageModeling(ours_tok, whole_word_mask=True, mlm_probability=0.3,
                                                       seed=seed)([dict(f) for f in features])
        theirs = transformers.DataCollatorForLanguageModeling(theirs_tok, whole_word_mask=True, mlm_probability=0.3,
                                                              seed=seed)([dict(f) for f in features])
        assert sorted(ours) == sorted(theirs)
        for key in theirs:
            torch.testing.assert_close(ours[key], theirs[key], msg=f"seed {seed} {key}")
    one = dict(theirs_tok("don't stop-believing 東京", return_offsets_mapping=True))
    batch = bertkit.DataCollatorForLanguageModeling(ours_tok, whole_word_mask=True, mlm_probability=0.5, seed=3)([one])
    assert batch["labels"].tolist() == [[-100, 2123, 1005, 1056, 2644, 1011, 8929, -100, -100, -100]]
    with pytest.raises(BertkitError, match="return_offsets_mapping=True"):
        bertkit.DataCollatorForLanguageModeling(ours_tok, whole_word_mask=True)([dict(ours_tok("don't stop"))])


@pytest.mark.parametrize("kwargs, said", [
    ({"learning_rate": "1e-4"}, r"learning_rate must be a number, got '1e-4' \(str\)"),
    ({"seed": 2.5}, r"seed must be an int, got 2.5"),
    ({"seed": -1}, r"seed must be in \[0, 2\*\*32\), got -1"),
    ({"data_seed": 2**32}, r"data_seed must be in \[0, 2\*\*32\)"),
    ({"bf16": 1}, r"bf16 must be a bool, got 1 \(int\)"),
    ({"num_train_epochs": True}, r"num_train_epochs must be a number, got True"),
    ({"label_names": "labels"}, r"label_names must be .*None, got 'labels'"),
    ({"logging_steps": 2.5}, r"logging_steps must be a whole number of steps, or below 1 a share .* got 2.5"),
    ({"save_steps": 7.5}, r"save_steps must be a whole number of steps"),
])
def test_training_arguments_of_the_wrong_type_or_range_are_named(tmp_path, kwargs, said):
    """learning_rate="1e-4" and seed=2.5 met TypeErrors deep in the optimiser and numpy; seed=-1 trained;
    logging_steps=2.5 logged every 2 steps (transformers refuses it)."""
    with pytest.raises(BertkitError, match=said):
        bertkit.TrainingArguments(output_dir=str(tmp_path), **kwargs)
    assert not any(tmp_path.iterdir())
    ok = bertkit.TrainingArguments(output_dir=str(tmp_path), learning_rate=3, seed=0, num_train_epochs=2)
    assert (ok.learning_rate, ok.seed) == (3, 0)


@pytest.mark.parametrize("save_steps, eval_steps", [(0.3, 0.1), (0.4, 0.2), (0.1, 0.3), (4, 0.2), (0.4, 2), (6, 3),
                                                   (6, 4)])
def test_load_best_model_at_end_takes_the_save_and_eval_steps_transformers_takes(tmp_path, save_steps, eval_steps):
    """save_steps 0.3 and eval_steps 0.1 (shares of the run) were refused as not a multiple: 0.3 % 0.1 is 0.0999...
    in floats. Each pair is taken or refused as transformers takes or refuses it."""
    settings = dict(output_dir=str(tmp_path), eval_strategy="steps", load_best_model_at_end=True,
                    save_steps=save_steps, eval_steps=eval_steps)
    try:
        transformers.TrainingArguments(**settings, use_cpu=True)
        theirs = True
    except ValueError:
        theirs = False
    try:
        bertkit.TrainingArguments(**settings)
        ours = True
    except BertkitError as e:
        assert f"save_steps ({save_steps}) to be a multiple of eval_steps ({eval_steps})" in str(e)
        ours = False
    assert ours == theirs
    assert theirs == ((save_steps, eval_steps) in {(0.3, 0.1), (0.4, 0.2), (6, 3)})


# -------------------------------------------------------------------------------------------------
# The question-answering and multiple-choice guides, transformers' Trainer as the reference
# -------------------------------------------------------------------------------------------------


def _squad(question: str, context: str, answer: str) -> dict:
    return {"question": question, "context": context,
            "answers": {"text": [answer], "answer_start": [context.index(answer)]}}


LONG = ("The river rises in the northern hills and flows south through farmland for many miles. Along its banks "
        "there are old mills, stone bridges and several small villages. Near the coast it widens into a broad "
        "estuary where fishing boats have been built for centuries, and the harbour town of Kelby stands at its "
        "mouth. Every summer the town holds a regatta that draws sailors from across the country.")
QA = [
    _squad("Who wrote the letter?", "The letter was written by Anna in the spring of 1901.", "Anna"),
    _squad("What colour is the car?", "Her car is red and it is parked outside the station.", "red"),
    _squad("Where does the river end?", LONG, "Kelby"),
    _squad("What draws sailors?", LONG, "a regatta"),
    _squad("What was built near the coast?", LONG, "fishing boats"),
    _squad("Where does the river rise?", LONG, "the northern hills"),
    _squad("How many cats live there?", "Three cats and one old dog live in the farmhouse by the lake.", "Three"),
    _squad("When did the shop open?", "The bakery on the corner opened in 1987 and still sells bread.", "1987"),
    _squad("What does the bakery sell?", "The bakery on the corner opened in 1987 and still sells bread.", "bread"),
    _squad("What is on the banks?", LONG, "old mills"),
    _squad("Who won the race?", "After a long and windy race, Tom won by a few seconds ahead of Lisa.", "Tom"),
    _squad("What lies by the lake?", "Three cats and one old dog live in the farmhouse by the lake.", "the farmhouse"),
]


def _prepare_train_features(tokenizer, examples, max_length=48, stride=16):
    """The guide's prepare_train_features: windows over long contexts, answers as token start/end positions
    (0, 0: the [CLS] token, when the answer is not inside the window)."""
    enc = tokenizer(examples["question"], examples["context"], max_length=max_length, truncation="only_second",
                    return_overflowing_tokens=True, stride=stride, return_offsets_mapping=True,
                    padding="max_length")
    sample_map = enc.pop("overflow_to_sample_mapping")
    offset_mapping = enc.pop("offset_mapping")
    enc["start_positions"], enc["end_positions"] = [], []
    for i, offsets in enumerate(offset_mapping):
        answers = examples["answers"][sample_map[i]]
        start_char = answers["answer_start"][0]
        end_char = start_char + len(answers["text"][0])
        sequence_ids = enc.sequence_ids(i)
        context_start = sequence_ids.index(1)
        context_end = len(sequence_ids) - 1 - sequence_ids[::-1].index(1)
        if offsets[context_start][0] > start_char or offsets[context_end][1] < end_char:
            enc["start_positions"].append(0)
            enc["end_positions"].append(0)
            continue
        idx = context_start
        while idx <= context_end and offsets[idx][0] <= start_char:
            idx += 1
        enc["start_positions"].append(idx - 1)
        idx = context_end
        while idx >= context_start and offsets[idx][1] >= end_char:
            idx -= 1
        enc["end_positions"].append(idx + 1)
    return enc


class _BertForQuestionAnsweringOverRealTokens(transformers.BertForQuestionAnswering):
    """transformers' QA model with bertkit's documented span loss (docs/coming-from-transformers.md): padding
    positions get the dtype's lowest logit, so the softmax covers real tokens only. The only change."""

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, start_positions=None,
                end_positions=None, **kwargs):
        out = super().forward(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
                              **kwargs)
        pad = attention_mask == 0
        out.start_logits = out.start_logits.masked_fill(pad, torch.finfo(out.start_logits.dtype).min)
        out.end_logits = out.end_logits.masked_fill(pad, torch.finfo(out.end_logits.dtype).min)
        if start_positions is not None and end_positions is not None:
            T = out.start_logits.size(1)
            s, e = start_positions.clamp(0, T), end_positions.clamp(0, T)
            out.loss = (torch.nn.functional.cross_entropy(out.start_logits, s, ignore_index=T)
                        + torch.nn.functional.cross_entropy(out.end_logits, e, ignore_index=T)) / 2
        return out


def _same_weights_but(ours, theirs, *unseen: str) -> None:
    """The trained weights agree, all but the biases that move every score of a softmax alike, which the loss
    cannot see (their effect, one constant on the logits, is compared in the tests)."""
    a, b = ours.state_dict(), theirs.state_dict()
    assert sorted(a) == sorted(b)
    for name in b:
        if name not in unseen:
            torch.testing.assert_close(a[name], b[name], rtol=1e-4, atol=1e-4, msg=name)


def test_question_answering_guide_gives_transformers_numbers(checkpoint, tmp_path):
    """SQuAD-style windows (max_length 48, stride 16), DefaultDataCollator, 2 epochs: the same features from
    both tokenizers, the same loss at every step, eval loss and start/end logits."""
    qa = tmp_path / "qa"
    torch.manual_seed(0)
    transformers.BertForQuestionAnswering(transformers.AutoConfig.from_pretrained(checkpoint)).save_pretrained(qa)
    transformers.AutoTokenizer.from_pretrained(checkpoint).save_pretrained(qa)
    train_rows, test_rows = QA[:9], QA[9:] + QA[2:3]

    def guide(lib, model_class):
        tokenizer = lib.AutoTokenizer.from_pretrained(qa)
        model = model_class.from_pretrained(qa)
        prepare = lambda b: _prepare_train_features(tokenizer, b)  # noqa: E731
        train = datasets.Dataset.from_list(train_rows)
        train = train.map(prepare, batched=True, remove_columns=train.column_names)
        test = datasets.Dataset.from_list(test_rows)
        test = test.map(prepare, batched=True, remove_columns=test.column_names)
        args = lib.TrainingArguments(output_dir=str(tmp_path / lib.__name__), learning_rate=2e-3,
                                     per_device_train_batch_size=4, per_device_eval_batch_size=4,
                                     num_train_epochs=2, weight_decay=0.01, logging_steps=1, eval_strategy="epoch",
                                     save_strategy="no", report_to="none", use_cpu=True, seed=7, disable_tqdm=True)
        trainer = lib.Trainer(model=model, args=args, train_dataset=train, eval_dataset=test,
                              processing_class=tokenizer, data_collator=lib.DefaultDataCollator())
        trainer.train()
        raw = tokenizer([r["question"] for r in QA], [r["context"] for r in QA], max_length=48,
                        truncation="only_second", return_overflowing_tokens=True, stride=16,
                        return_offsets_mapping=True, padding="max_length")
        return trainer, train, test, raw, trainer.evaluate(), trainer.predict(test)

    hf, hf_train, hf_test, hf_raw, hf_eval, hf_pred = guide(transformers, _BertForQuestionAnsweringOverRealTokens)
    bk, bk_train, bk_test, bk_raw, bk_eval, bk_pred = guide(bertkit, bertkit.AutoModelForQuestionAnswering)

    # the tokenizers give the same windows, offsets, sequence ids, and so the same answer positions
    assert {k: [list(map(tuple, r)) if k == "offset_mapping" else r for r in v] for k, v in bk_raw.items()} == \
        {k: [list(map(tuple, r)) if k == "offset_mapping" else r for r in v] for k, v in hf_raw.items()}
    assert [bk_raw.sequence_ids(i) for i in range(len(bk_raw["input_ids"]))] == \
        [hf_raw.sequence_ids(i) for i in range(len(hf_raw["input_ids"]))]
    assert bk_train.to_dict() == hf_train.to_dict() and bk_test.to_dict() == hf_test.to_dict()
    assert len(bk_train) > len(train_rows) and len(bk_test) > len(test_rows)  # long contexts overflow
    assert 0 < sum(s == 0 for s in bk_train["start_positions"]) < len(bk_train)  # windows without the answer
    assert all(len(ids) == 48 for ids in bk_train["input_ids"]) and min(map(sum, bk_train["attention_mask"])) < 48

    ours, theirs = _losses(bk.state.log_history), _losses(hf.state.log_history)
    steps = 2 * -(-len(bk_train) // 4)
    assert [s for s, _, _ in ours] == [s for s, _, _ in theirs] == list(range(1, steps + 1))
    np.testing.assert_allclose([x[1] for x in ours], [x[1] for x in theirs], rtol=1e-5)
    np.testing.assert_allclose([x[2] for x in ours], [x[2] for x in theirs], rtol=1e-9)
    assert len({round(x[1], 4) for x in ours}) == len(ours)
    evals = [[h["eval_loss"] for h in t.state.log_history if "eval_loss" in h] for t in (bk, hf)]
    assert len(evals[0]) == 3  # after each epoch, and evaluate()
    np.testing.assert_allclose(evals[0], evals[1], rtol=1e-5)
    assert bk_eval["eval_loss"] == pytest.approx(hf_eval["eval_loss"], rel=1e-5)
    assert bk_pred.metrics["test_loss"] == pytest.approx(hf_pred.metrics["test_loss"], rel=1e-5)
    assert len(bk_pred.predictions) == len(hf_pred.predictions) == 2  # (start_logits, end_logits)
    # The span softmax does not see a constant added to a window's logits, so qa_outputs.bias gets float-noise
    # gradients that Adam scales up to lr-sized steps: the two runs' logits differ by one constant (~1e-3).
    # Compared: the logits less their mean over the window's real tokens (what the loss and decoding see).
    real = np.array(bk_test["attention_mask"]) == 1
    for a, b in zip(bk_pred.predictions, hf_pred.predictions):
        assert a.shape == b.shape == (len(bk_test), 48)
        np.testing.assert_array_equal(a[~real], b[~real])  # padding: the lowest float32 in both
        centred = [np.where(real, x - (x * real).sum(1, keepdims=True) / real.sum(1, keepdims=True), 0) for x in (a, b)]
        np.testing.assert_allclose(centred[0], centred[1], atol=1e-5)
        np.testing.assert_allclose((a - b)[real], (a - b)[real][0], atol=1e-5)  # one constant for every window
        np.testing.assert_array_equal(np.where(real, a, -np.inf).argmax(1), np.where(real, b, -np.inf).argmax(1))
    # the last LayerNorm's bias adds one vector to every token's state, so one constant to every start (end) logit
    _same_weights_but(bk.model, hf.model, "qa_outputs.bias", "bert.encoder.layer.1.output.LayerNorm.bias")
    # label_ids: one array per label name, (start_positions, end_positions), as transformers (was one (N, 2))
    assert isinstance(bk_pred.label_ids, tuple) and len(bk_pred.label_ids) == len(hf_pred.label_ids) == 2
    for a, b, name in zip(bk_pred.label_ids, hf_pred.label_ids, ("start_positions", "end_positions")):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(a, bk_test[name])


def _swag(sent1: str, sent2: str, endings: list[str], label: int) -> dict:
    return {"sent1": sent1, "sent2": sent2, **{f"ending{i}": e for i, e in enumerate(endings)}, "label": label}


SWAG = [
    _swag("A man is standing in a kitchen.", "He", ["picks up a knife and cuts an onion.", "swims across the lake.",
          "flies into the clouds.", "reads the moon aloud."], 0),
    _swag("The girl runs to the bus stop.", "She", ["eats the bus.", "waves at the driver and climbs on board.",
          "turns into a tree.", "paints the rain blue."], 1),
    _swag("A dog sees a ball in the garden.", "The dog", ["writes a long letter.", "sings in the opera.",
          "chases the ball across the grass.", "drives to work."], 2),
    _swag("It starts to rain heavily outside.", "People", ["light a campfire in the street.", "fall asleep on clouds.",
          "grow wings.", "open their umbrellas and hurry inside."], 3),
    _swag("The chef puts a pan on the stove.", "He", ["pours oil into the pan and heats it.",
          "throws the stove out of the window while singing loudly about the sea.", "plants the pan.",
          "marries the stove."], 0),
    _swag("A boy opens his school bag.", "He", ["feeds it to a whale.", "takes out a book and a pencil.",
          "climbs inside it forever.", "sells it to the sun."], 1),
    _swag("The team walks onto the football pitch.", "The players", ["bake a wedding cake.", "fly home.",
          "warm up and kick the ball around.", "vanish."], 2),
    _swag("A woman sits down at the piano.", "She", ["eats the keys one by one.", "sleeps under it.",
          "throws it at the audience.", "begins to play a quiet song."], 3),
    _swag("The man wakes up early in the morning.", "He", ["makes a cup of coffee.", "goes to sleep on the roof.",
          "turns into a cat.", "swallows the alarm clock."], 0),
    _swag("A child drops a glass on the floor.", "The glass", ["starts to sing.", "breaks into small pieces.",
          "flies back to the table.", "becomes a horse."], 1),
    _swag("The students enter the classroom.", "They", ["swim to their desks.", "burn the books.",
          "sit down and open their notebooks.", "leave for the moon."], 2),
    _swag("A cyclist reaches the top of the hill.", "She", ["digs a hole to the centre of the earth.",
          "eats her bicycle.", "starts to cry loudly at the clouds.", "rides quickly down the other side."], 3),
]


def _multiple_choice_guide(lib, path: Path, out: Path):
    """transformers' multiple-choice guide (SWAG): (context, header + ending) pairs flattened, tokenized with
    truncation, regrouped in fours, padded by DataCollatorForMultipleChoice."""
    tokenizer = lib.AutoTokenizer.from_pretrained(path)
    model = lib.AutoModelForMultipleChoice.from_pretrained(path)
    ending_names = ["ending0", "ending1", "ending2", "ending3"]

    def preprocess_function(examples):
        first_sentences = [[context] * 4 for context in examples["sent1"]]
        question_headers = examples["sent2"]
        second_sentences = [[f"{header} {examples[end][i]}" for end in ending_names]
                            for i, header in enumerate(question_headers)]
        first_sentences = sum(first_sentences, [])
        second_sentences = sum(second_sentences, [])
        tokenized_examples = tokenizer(first_sentences, second_sentences, truncation=True, max_length=24)
        return {k: [v[i: i + 4] for i in range(0, len(v), 4)] for k, v in tokenized_examples.items()}

    train = datasets.Dataset.from_list(SWAG[:8]).map(preprocess_function, batched=True)
    test = datasets.Dataset.from_list(SWAG[8:] + SWAG[:2]).map(preprocess_function, batched=True)
    args = lib.TrainingArguments(output_dir=str(out), learning_rate=3e-3, per_device_train_batch_size=3,
                                 per_device_eval_batch_size=4, num_train_epochs=2, weight_decay=0.01, logging_steps=1,
                                 eval_strategy="epoch", save_strategy="no", report_to="none", use_cpu=True, seed=7,
                                 disable_tqdm=True)
    trainer = lib.Trainer(model=model, args=args, train_dataset=train, eval_dataset=test, processing_class=tokenizer,
                          data_collator=lib.DataCollatorForMultipleChoice(tokenizer=tokenizer),
                          compute_metrics=accuracy)
    trainer.train()
    return trainer, train, test, trainer.evaluate(), trainer.predict(test)


def test_multiple_choice_guide_gives_transformers_numbers(checkpoint, tmp_path):
    mc = tmp_path / "mc"
    torch.manual_seed(0)
    transformers.BertForMultipleChoice(transformers.AutoConfig.from_pretrained(checkpoint)).save_pretrained(mc)
    transformers.AutoTokenizer.from_pretrained(checkpoint).save_pretrained(mc)
    hf, hf_train, hf_test, hf_eval, hf_pred = _multiple_choice_guide(transformers, mc, tmp_path / "hf")
    bk, bk_train, bk_test, bk_eval, bk_pred = _multiple_choice_guide(bertkit, mc, tmp_path / "bk")

    assert bk_train.to_dict() == hf_train.to_dict() and bk_test.to_dict() == hf_test.to_dict()
    assert all(len(ids) == 4 for ids in bk_train["input_ids"])
    assert max(len(c) for ids in bk_train["input_ids"] for c in ids) == 24  # one pair truncated
    ours, theirs = _losses(bk.state.log_history), _losses(hf.state.log_history)
    assert [s for s, _, _ in ours] == [s for s, _, _ in theirs] == list(range(1, 7))
    np.testing.assert_allclose([x[1] for x in ours], [x[1] for x in theirs], rtol=1e-5)
    np.testing.assert_allclose([x[2] for x in ours], [x[2] for x in theirs], rtol=1e-9)
    assert len({round(x[1], 4) for x in ours}) == len(ours)
    ours_eval = [h for h in bk.state.log_history if "eval_loss" in h]
    theirs_eval = [h for h in hf.state.log_history if "eval_loss" in h]
    assert [(h["step"], h["epoch"]) for h in ours_eval] == [(h["step"], h["epoch"]) for h in theirs_eval]
    assert len(ours_eval) == 3  # after each epoch, and evaluate()
    for a, b in zip(ours_eval, theirs_eval):
        assert a["eval_loss"] == pytest.approx(b["eval_loss"], rel=1e-5)
        assert a["eval_accuracy"] == b["eval_accuracy"]
    assert bk_eval["eval_accuracy"] == hf_eval["eval_accuracy"]
    assert bk_pred.predictions.shape == hf_pred.predictions.shape == (6, 4)
    # as in QA: the softmax over the choices does not see classifier.bias (one score added to every choice), so
    # its float-noise gradient, scaled up by Adam, leaves the two runs' scores one constant (~1e-3) apart
    centred = [p - p.mean(1, keepdims=True) for p in (bk_pred.predictions, hf_pred.predictions)]
    np.testing.assert_allclose(centred[0], centred[1], atol=1e-5)
    shift = bk_pred.predictions - hf_pred.predictions
    np.testing.assert_allclose(shift, shift.flat[0], atol=1e-5)
    np.testing.assert_array_equal(bk_pred.predictions.argmax(1), hf_pred.predictions.argmax(1))
    _same_weights_but(bk.model, hf.model, "classifier.bias")
    np.testing.assert_array_equal(bk_pred.label_ids, hf_pred.label_ids)
    assert bk_pred.metrics["test_accuracy"] == hf_pred.metrics["test_accuracy"]
    assert bk_pred.metrics["test_loss"] == pytest.approx(hf_pred.metrics["test_loss"], rel=1e-5)


def test_multiple_choice_collator_matches_transformers(minilm_dir):
    tok = bertkit.BertTokenizer.from_pretrained(minilm_dir)
    features = []
    for row in SWAG[:5]:
        enc = tok([row["sent1"]] * 4, [f"{row['sent2']} {row[f'ending{j}']}" for j in range(4)])
        features.append({**{k: list(v) for k, v in enc.items()}, "label": row["label"]})
    for kwargs in ({}, {"pad_to_multiple_of": 8}, {"padding": "max_length", "max_length": 40}):
        ours = bertkit.DataCollatorForMultipleChoice(tok, **kwargs)(features)
        theirs = transformers.DataCollatorForMultipleChoice(tok, **kwargs)(features)
        assert sorted(ours) == sorted(theirs) == ["attention_mask", "input_ids", "labels", "token_type_ids"]
        for key in theirs:
            assert ours[key].dtype == theirs[key].dtype, key
            torch.testing.assert_close(ours[key], theirs[key], rtol=0, atol=0, msg=f"{kwargs} {key}")
        assert ours["input_ids"].shape[:2] == (5, 4)
    with pytest.raises(BertkitError, match="same number of choices"):
        three = {**features[1], "input_ids": features[1]["input_ids"][:3]}
        bertkit.DataCollatorForMultipleChoice(tok)([features[0], three])


# ---------------------------------------------------------------------------------------------------
# torchrun
# ---------------------------------------------------------------------------------------------------


@pytest.mark.slow  # long; in make test-slow (make test stays under 5 minutes)
def test_every_rank_loads_the_best_checkpoint_once_rank_0_has_written_it(tmp_path):
    """Was: under torchrun, load_best_model_at_end had ranks other than 0 read the best checkpoint as soon as training
    ended, while rank 0 could still be writing it (the last one): FileNotFoundError for its state.pt."""
    from distributed_helpers import free_port
    from launch_helpers import spawn_gloo_workers
    from trainer_torchrun_script import slow_last_checkpoint_worker

    (tmp_path / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
                                                  + [f"w{i}" for i in range(92)]) + "\n")
    spawn_gloo_workers(slow_last_checkpoint_worker, lambda: (2, free_port(), str(tmp_path / "out"), "best"), 2)
    assert sorted(p.name for p in (tmp_path / "out").iterdir() if p.name.startswith("checkpoint-")) == ["checkpoint-2"]


@pytest.mark.slow  # long; in make test-slow (make test stays under 5 minutes)
def test_every_rank_saves_into_output_dir_after_train_once_rank_0_has_let_go_of_it(tmp_path):
    """Was: under torchrun, ranks other than 0 left train() while rank 0 was still writing the last checkpoint, so a
    script's next line on every rank, ``model.save_pretrained(args.output_dir)`` (transformers' scripts save so,
    unguarded), stopped rank 1 with "OUT is in use by pid N (bertkit Trainer)" and the job failed after training (in
    1 of 2 runs of 6 steps of a 2-layer model on SST-2 rows with no delay; transformers' ends with exit 0). Now
    every rank leaves train() once rank 0 has let go of output_dir."""
    from distributed_helpers import free_port
    from launch_helpers import spawn_gloo_workers
    from trainer_torchrun_script import slow_last_checkpoint_worker

    (tmp_path / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
                                                  + [f"w{i}" for i in range(92)]) + "\n")
    out = tmp_path / "out"
    spawn_gloo_workers(slow_last_checkpoint_worker, lambda: (2, free_port(), str(out), "save"), 2)
    saved = bertkit.BertForSequenceClassification.from_pretrained(out).state_dict()
    last = bertkit.BertForSequenceClassification.from_pretrained(out / "checkpoint-2").state_dict()
    assert saved.keys() == last.keys() and all(torch.equal(saved[k], last[k]) for k in saved)
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == [
        "checkpoint-2", "config.json", "metrics.jsonl", "model.safetensors"]


@pytest.mark.slow  # two processes (6 s); in make test-slow (make test stays under 5 minutes)
def test_under_torchrun_each_rank_is_seeded_apart_when_the_trainer_is_made(tmp_path):
    """Under torchrun rank r's torch and Python generators are seeded with seed + r (dropout draws differently on
    each rank; rank 0's seed is transformers' set_seed(seed)) when the Trainer is made, and train() goes on from
    there, as transformers' Trainer does: a script's draws in between move every rank's masks. train() seeded each
    rank again, so what was drawn in between changed nothing, where it changes transformers' run."""
    import random

    from distributed_helpers import free_port
    from launch_helpers import spawn_gloo_workers
    from trainer_torchrun_script import seeding_worker

    (tmp_path / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
                                                  + [f"w{i}" for i in range(92)]) + "\n")
    result = tmp_path / "seen"
    spawn_gloo_workers(seeding_worker, lambda: (2, free_port(), str(tmp_path / "out"), str(result)), 2)
    for rank in (0, 1):
        seen = torch.load(f"{result}-{rank}")
        torch_generator, python_generator = torch.Generator().manual_seed(1 + rank), random.Random(1 + rank)
        assert seen["made"] == (torch.rand(4, generator=torch_generator).tolist(), python_generator.random())
        torch_generator, python_generator = torch.Generator().manual_seed(1 + rank), random.Random(1 + rank)
        torch.rand(2, generator=torch_generator)  # the script's draws after the Trainer was made
        python_generator.random()
        assert seen["train_begin"] == (torch.rand(4, generator=torch_generator).tolist(), python_generator.random())


@pytest.mark.slow  # long; in make test-slow (make test stays under 5 minutes)
def test_a_trainer_script_under_torchrun_equals_one_process(tmp_path):
    """The same script, as one process with batch 16 and under torchrun as two with 8 each: the Trainer joins
    the process group, the ranks train on halves of each batch (the same losses and weights), evaluation and
    predict() are split over the ranks and gathered back in order (the same metrics and predictions), the best
    checkpoint is the same, and rank 0 alone writes."""
    from launch_helpers import run_torchrun
    from trainer_torchrun_script import main as run_script

    script = Path(__file__).with_name("trainer_torchrun_script.py")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).parents[1] / "src")}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each torchrun worker (OMP_NUM_THREADS=1)
    try:
        run_script(str(tmp_path / "one"), str(tmp_path / "one.pt"), 16)  # one process: this one
    finally:
        torch.set_num_threads(threads)

    two = run_torchrun([str(script), str(tmp_path / "two"), str(tmp_path / "two.pt"), "8"], env, 300,
                       fresh=tmp_path / "two")
    assert two.returncode == 0, two.stderr[-3000:]
    one, two = (torch.load(tmp_path / f"{name}.pt", weights_only=False) for name in ("one", "two"))

    def records(run, key):
        return {r["step"]: r[key] for r in run["log_history"] if key in r}

    assert list(records(two, "loss")) == list(range(1, 10))
    assert records(two, "loss") == pytest.approx(records(one, "loss"), abs=1e-5)
    assert records(two, "eval_accuracy") == records(one, "eval_accuracy")
    assert records(two, "eval_loss") == pytest.approx(records(one, "eval_loss"), abs=1e-5)
    assert Path(two["best"]).name == Path(one["best"]).name
    assert two["eval"]["eval_accuracy"] == one["eval"]["eval_accuracy"]
    assert two["predictions"].shape == (23, 2)
    np.testing.assert_allclose(two["predictions"], one["predictions"], atol=1e-5)
    np.testing.assert_array_equal(two["label_ids"], one["label_ids"])
    for key, value in one["weights"].items():
        torch.testing.assert_close(two["weights"][key], value, atol=1e-5, rtol=1e-4)
    assert sorted(p.name for p in (tmp_path / "two").iterdir() if p.name.startswith("checkpoint-")) == [
        "checkpoint-3", "checkpoint-6", "checkpoint-9"]
    assert (tmp_path / "two" / "final" / "model.safetensors").is_file()


def test_the_end_of_transformers_run_glue_logs_and_saves_metrics_and_state_as_transformers_on_rank_0(
        tmp_path, tiny_model, capsys, monkeypatch):
    """run_glue.py, run_ner.py and run_qa.py end with ``trainer.log_metrics``, ``save_metrics``, ``save_state`` and
    ``is_world_process_zero()``: was AttributeError ('Trainer' object has no attribute 'log_metrics'), after
    training. The same printout and the same files, byte for byte, as transformers' helpers; on a rank other than 0
    nothing is printed or written."""
    from types import SimpleNamespace

    from transformers import trainer_pt_utils

    from bertkit.training import trainer_reports as trainer_module

    train = {"train_loss": 0.6938127080599467, "train_runtime": 3.611420631001238, "epoch": 1.0,
             "train_samples_per_second": 26.582336927444743, "total_flos": 284197248.0, "train_steps": 6}
    evaluation = {"eval_loss": 0.6936980485916138, "eval_accuracy": 0.475, "eval_runtime": 0.02909, "epoch": 1.0}
    theirs = SimpleNamespace(args=SimpleNamespace(output_dir=str(tmp_path / "hf")), is_world_process_zero=lambda: True)
    (tmp_path / "hf").mkdir()
    for split, metrics in (("train", train), ("eval", evaluation)):
        trainer_pt_utils.log_metrics(theirs, split, metrics)
        trainer_pt_utils.save_metrics(theirs, split, metrics)
    printed = capsys.readouterr().out
    trainer = bertkit.Trainer(model=tiny_model("BertForSequenceClassification", labels=2),
                              args=bertkit.TrainingArguments(output_dir=str(tmp_path / "bk"), use_cpu=True))
    (tmp_path / "bk").mkdir()
    assert trainer.is_world_process_zero() and trainer.is_local_process_zero()
    for split, metrics in (("train", train), ("eval", evaluation)):
        trainer.log_metrics(split, metrics)
        trainer.save_metrics(split, metrics)
    trainer.save_state()
    assert capsys.readouterr().out == printed
    assert "  train_runtime            = 0:00:03.61" in printed
    for name in ("train_results.json", "eval_results.json", "all_results.json"):
        assert (tmp_path / "bk" / name).read_bytes() == (tmp_path / "hf" / name).read_bytes(), name
    state = (tmp_path / "bk" / "trainer_state.json").read_text()
    assert json.loads(state)["global_step"] == 0 and state == json.dumps(json.loads(state), indent=2,
                                                                          sort_keys=True) + "\n"
    for path in (tmp_path / "bk").iterdir():
        path.unlink()
    monkeypatch.setattr(trainer_module, "current", lambda: bertkit._parallel.DistInfo(1, 2, 1))
    assert not trainer.is_world_process_zero() and not trainer.is_local_process_zero()
    trainer.log_metrics("train", train)
    trainer.save_metrics("train", train)
    trainer.save_state()
    assert capsys.readouterr().out == "" and list((tmp_path / "bk").iterdir()) == []
