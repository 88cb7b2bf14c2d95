"""bertkit.Trainer against transformers' Trainer under train_sampling_strategy="group_by_length" on randomly drawn
runs: seeds and data_seed, batch sizes that do not divide the data, gradient accumulation, dataloader_drop_last,
fractional and several epochs, SST-2 rows with and without a "length" column, a tiny model with dropout on (so each
epoch's order hangs on the dropout draws before it). The rows each step's batches hold and every logged loss must be
transformers'; a run resumed from a mid-epoch checkpoint must see the uninterrupted run's batches and losses.
bertkit drew its own length-grouped order before (no batch of the first step shared with transformers')."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import pytest
import torch

import bertkit
from trainer_helpers import conll_sentences, sst2_dev, tiny_classifier

transformers = pytest.importorskip("transformers")
datasets = pytest.importorskip("datasets")
pytest.importorskip("accelerate")
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def sst(data_dir):
    return sst2_dev(data_dir)


@pytest.fixture(scope="module")
def tiny(minilm_dir, tmp_path_factory) -> Path:
    # dropout on (transformers' default 0.1): the grouped order must hold with each library's masks drawn in it
    return tiny_classifier(tmp_path_factory.mktemp("grouped") / "tiny", minilm_dir, hidden_size=16,
                           num_hidden_layers=1, intermediate_size=32, hidden_dropout_prob=0.1,
                           attention_probs_dropout_prob=0.1)


def _draw(r: random.Random) -> tuple[dict, int, bool]:
    args = dict(train_sampling_strategy="group_by_length", learning_rate=1e-3, seed=r.randint(0, 999),
                per_device_train_batch_size=r.choice([1, 2, 3, 4, 5, 7, 8]), dataloader_drop_last=r.random() < 0.3,
                gradient_accumulation_steps=r.choice([1, 1, 2, 3]), num_train_epochs=r.choice([1, 2, 3, 1.5]))
    if r.random() < 0.4:
        args["data_seed"] = r.randint(0, 999)
    return args, r.choice([5, 9, 17, 33, 60, 130]), r.random() < 0.5


def _run(lib, path: Path, args: dict, rows: list, with_length: bool, out: Path, resume: bool = False):
    tokenizer = lib.AutoTokenizer.from_pretrained(path)
    features = []
    for row in rows:
        enc = tokenizer(row["text"], truncation=True, max_length=24)
        features.append({**{k: enc[k] for k in ("input_ids", "token_type_ids", "attention_mask")},
                         "label": row["label"], **({"length": len(enc["input_ids"])} if with_length else {})})
    row_of = {tuple(f["input_ids"]): i for i, f in enumerate(features)}
    model, seen = lib.AutoModelForSequenceClassification.from_pretrained(path), []
    if lib is bertkit:
        model.bert.layout = "padded"  # dropout's masks over the padded rectangle, as transformers draws them

    def record(module, positional, kwargs):
        if module.training:
            seen.append([row_of[tuple(ids[mask.bool()].tolist())]
                         for ids, mask in zip(kwargs["input_ids"], kwargs["attention_mask"])])

    model.register_forward_pre_hook(record, with_kwargs=True)
    trainer = lib.Trainer(model=model, args=lib.TrainingArguments(
        output_dir=str(out), report_to="none", use_cpu=True, disable_tqdm=True, logging_steps=1, save_steps=2,
        save_strategy="steps" if lib is bertkit else "no", **args),
        train_dataset=datasets.Dataset.from_list(features), data_collator=lib.DataCollatorWithPadding(tokenizer),
        processing_class=tokenizer)
    if lib is transformers and args["gradient_accumulation_steps"] > 1:
        trainer.model_accepts_loss_kwargs = False  # transformers' rule for a loss that takes no loss kwargs
    trainer.train(resume_from_checkpoint=resume or None)
    return seen, [h["loss"] for h in trainer.state.log_history if "loss" in h]


@pytest.mark.parametrize("draw", (2, 3, 5, 8, 9))
def test_drawn_runs_see_transformers_batches_and_resume_in_the_same_order(draw, sst, tiny, tmp_path):
    r = random.Random(draw)
    args, n, with_length = _draw(r)
    rows = r.sample(sst, n)
    where = f"draw {draw}: {n} rows, length column {with_length}, {args}"
    ours, theirs = (_run(lib, tiny, args, rows, with_length, tmp_path / lib.__name__)
                    for lib in (bertkit, transformers))
    assert ours[0] == theirs[0], where
    assert ours[1] == pytest.approx(theirs[1], rel=1e-5, abs=1e-6), where
    # resumed from a mid-run checkpoint (every 2nd step), without the checkpoints after it
    out = tmp_path / "bertkit"
    steps = sorted(int(p.name.split("-")[1]) for p in out.glob("checkpoint-*"))
    for later in steps[1:]:
        shutil.rmtree(out / f"checkpoint-{later}")
    again = _run(bertkit, tiny, args, rows, with_length, out, resume=True)
    assert again[0] == ours[0][len(ours[0]) - len(again[0]):] and again[1] == ours[1], (where, steps[0])


@pytest.fixture(scope="module")
def conll(data_dir) -> tuple[list, list]:
    return conll_sentences(data_dir)


@pytest.mark.parametrize("draw", (1,))
def test_a_taggers_evaluations_are_transformers_under_group_by_length(draw, conll, minilm_dir, tmp_path):
    """A tagger's eval_loss is a mean per batch, so it hangs on the evaluation's batches: bertkit evaluated in the
    dataset's order, 2.1712 against transformers' 2.1702 (draw 1), and with dataloader_drop_last other rows."""
    sentences, tags = conll
    r = random.Random(draw)
    train, test = r.sample(sentences, 30), r.sample(sentences, r.choice([7, 13, 25]))
    args = dict(train_sampling_strategy="group_by_length", per_device_train_batch_size=4, learning_rate=1e-3,
                per_device_eval_batch_size=r.choice([2, 3, 5]), seed=r.randint(0, 99), num_train_epochs=1,
                eval_strategy="steps", eval_steps=3, dataloader_drop_last=r.random() < 0.3, save_strategy="no")
    if r.random() < 0.5:
        args["data_seed"] = r.randint(0, 99)
    tokenizer = transformers.BertTokenizerFast.from_pretrained(minilm_dir)
    torch.manual_seed(0)
    transformers.BertForTokenClassification(transformers.BertConfig(
        vocab_size=len(tokenizer), hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
        num_labels=len(tags), hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)).save_pretrained(tmp_path / "m")
    tokenizer.save_pretrained(tmp_path / "m")

    def tagged(tok, rows):
        out = []
        for s in rows:
            enc = tok([w for w, _ in s], is_split_into_words=True, truncation=True, max_length=40)
            words = enc.word_ids()
            labels = [-100 if w is None or w == (words[j - 1] if j else None) else tags.index(s[w][1])
                      for j, w in enumerate(words)]
            out.append({"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"], "labels": labels})
        return out

    def accuracy(p):
        keep = p.label_ids != -100
        return {"accuracy": float((p.predictions.argmax(-1)[keep] == p.label_ids[keep]).mean())}

    logged = {}
    for lib in (bertkit, transformers):
        tok = lib.AutoTokenizer.from_pretrained(tmp_path / "m")
        trainer = lib.Trainer(
            model=lib.AutoModelForTokenClassification.from_pretrained(tmp_path / "m"),
            args=lib.TrainingArguments(output_dir=str(tmp_path / lib.__name__), report_to="none", use_cpu=True,
                                       disable_tqdm=True, logging_steps=1, **args),
            train_dataset=datasets.Dataset.from_list(tagged(tok, train)),
            eval_dataset=datasets.Dataset.from_list(tagged(tok, test)),
            data_collator=lib.DataCollatorForTokenClassification(tok), processing_class=tok, compute_metrics=accuracy)
        trainer.train()
        logged[lib] = [(h["eval_loss"], h["eval_accuracy"]) for h in trainer.state.log_history if "eval_loss" in h]
    assert len(logged[bertkit]) == len(logged[transformers]) == 3
    for ours, theirs in zip(logged[bertkit], logged[transformers]):
        assert ours == pytest.approx(theirs, rel=1e-5), (draw, args)
