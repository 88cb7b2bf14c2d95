"""bertkit.Trainer against transformers' Trainer given the same ``datasets`` objects, drawn at random: SST-2 rows
after select, filter or shuffle (an indices mapping over the Arrow table), tokenized by a batched map with or
without padding, with_format None, "torch" or "numpy" (sometimes on a subset of the columns), labels int64, int32
or ClassLabel in a column named "label" or "labels", an unused text column and extra number columns; train() with
max_steps or epochs, evaluate() on a dataset or a dict of them, predict(), batch sizes that do not divide the rows,
with and without dataloader_drop_last. Each draw compares the loss logged at every step (1e-5 relative, dropout off),
the metric names and values, the predictions and label_ids row for row, and the rows compute_metrics saw.

Slow: ``BERTKIT_FUZZ_DATASETS`` draws, 10 by default (about 1-2 s a draw on a 2-core machine)."""

from __future__ import annotations

import csv
import math
import os
import random
import re

import numpy as np
import pytest
import torch

import bertkit
from bertkit.errors import BertkitError
from trainer_helpers import tiny_classifier

transformers = pytest.importorskip("transformers")
datasets = pytest.importorskip("datasets")
pytest.importorskip("accelerate")
pytestmark = pytest.mark.slow

DRAWS = int(os.environ.get("BERTKIT_FUZZ_DATASETS", "10"))
TIMING = re.compile(r"runtime|per_second|preparation_time|total_flos")  # model_preparation_time is transformers' own


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, minilm_2_layers):
    return tiny_classifier(tmp_path_factory.mktemp("datasets-fuzz") / "tiny", minilm_2_layers)


@pytest.fixture(scope="module")
def sst2(data_dir):
    path = data_dir / "glue" / "SST-2" / "dev.tsv"
    if not path.is_file():
        pytest.skip(f"{path} absent")
    with path.open(encoding="utf-8") as f:
        rows = list(csv.reader(f, delimiter="\t", quotechar=None))[1:81]
    return [{"sentence": s, "label": int(y), "idx": i, "weight": i / 3} for i, (s, y) in enumerate(rows)]


def _metrics(pred):
    predictions, labels = pred
    # the labels themselves, in order: a row dropped, repeated or moved shows here
    return {"accuracy": float((predictions.argmax(-1) == labels).mean()), "rows": float(len(labels)),
            "label_hash": float(sum((i + 1) * int(y) for i, y in enumerate(labels)))}


def _draw_dataset(r: random.Random, rows: list[dict], tok):
    start, n = r.randint(0, 60), r.randint(1, 20)
    ds = datasets.Dataset.from_list(rows[start:start + n])
    label = r.choice(["int64", "int32", "classlabel", "labels"])
    if label == "int32":
        ds = ds.cast_column("label", datasets.Value("int32"))
    elif label == "classlabel":
        ds = ds.cast_column("label", datasets.ClassLabel(names=["negative", "positive"]))
    elif label == "labels":
        ds = ds.rename_column("label", "labels")
    padding = r.choice([False, "longest", "max_length"])
    ds = ds.map(lambda b: tok(b["sentence"], truncation=True, max_length=24, padding=padding), batched=True,
                batch_size=r.choice([1, 3, 1000]))
    ops = r.sample(["select", "filter", "shuffle", "none"], 2)
    for op in ops:
        if op == "select" and len(ds) > 1:
            ds = ds.select(r.sample(range(len(ds)), len(ds) - r.randint(1, min(3, len(ds) - 1))))
        elif op == "filter":
            kept = ds.filter(lambda row: row["idx"] % 5 != 2)
            ds = kept if len(kept) else ds
        elif op == "shuffle":
            ds = ds.shuffle(seed=r.randint(0, 9))
    fmt = r.choice([None, "torch", "numpy"])
    if fmt is not None:
        columns = [c for c in ds.column_names if c != "sentence"] if r.random() < 0.3 else None
        ds = ds.with_format(fmt, columns=columns)
    if r.random() < 0.3:
        ds = ds.remove_columns(["sentence"])
    return ds, f"{label} padding={padding} {ops} format={fmt} rows={len(ds)}"


def _run(lib, checkpoint, tok, tmp_path, kind, train, evaluation, args):
    torch.manual_seed(0)
    trainer = lib.Trainer(
        model=lib.AutoModelForSequenceClassification.from_pretrained(checkpoint),
        args=lib.TrainingArguments(output_dir=str(tmp_path / lib.__name__), report_to="none", use_cpu=True,
                                   disable_tqdm=True, save_strategy="no", logging_steps=1, seed=3, learning_rate=1e-3,
                                   **args),
        train_dataset=train if "train" in kind else None, eval_dataset=evaluation if kind != "predict" else None,
        processing_class=tok, compute_metrics=_metrics, data_collator=lib.DataCollatorWithPadding(tok))
    out = {}
    if "train" in kind:
        trainer.train()
        out["log"] = [{k: v for k, v in h.items() if not TIMING.search(k) and k != "grad_norm"}
                      for h in trainer.state.log_history if "train_loss" not in h]
    if kind in ("evaluate", "eval-dict"):
        out["metrics"] = {k: v for k, v in trainer.evaluate().items() if not TIMING.search(k)}
    if kind == "predict":
        p = trainer.predict(evaluation)
        out["predictions"], out["label_ids"] = p.predictions, p.label_ids
        out["metrics"] = {k: v for k, v in p.metrics.items() if not TIMING.search(k)}
    return out


def _same(a, b, where: str) -> None:
    if isinstance(a, dict):
        assert sorted(a) == sorted(b), where
        for k in a:
            _same(a[k], b[k], f"{where} {k}")
    elif isinstance(a, list):
        assert len(a) == len(b), where
        for x, y in zip(a, b):
            _same(x, y, where)
    elif isinstance(a, np.ndarray):
        assert a.shape == b.shape, where
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6, err_msg=where)
    elif isinstance(a, float):
        assert math.isclose(b, a, rel_tol=1e-5, abs_tol=1e-7), (where, a, b)
    else:
        assert a == b, where


@pytest.mark.parametrize("seed", range(DRAWS))
def test_a_drawn_dataset_trains_evaluates_and_predicts_as_transformers(seed, checkpoint, sst2, tmp_path):
    r = random.Random(seed)
    tok = bertkit.AutoTokenizer.from_pretrained(checkpoint)
    train, train_desc = _draw_dataset(r, sst2, tok)
    evaluation, eval_desc = _draw_dataset(r, sst2, tok)
    kind = r.choice(["train", "train-evaluate", "evaluate", "eval-dict", "predict"])
    args = {"per_device_train_batch_size": r.choice([1, 2, 4, 5]), "per_device_eval_batch_size": r.choice([1, 3, 8]),
            "dataloader_drop_last": r.random() < 0.3}
    if args["dataloader_drop_last"]:  # every set keeps a whole batch (none at all is refused, as documented)
        args["per_device_eval_batch_size"] = min(args["per_device_eval_batch_size"], len(evaluation), len(train))
        args["per_device_train_batch_size"] = min(args["per_device_train_batch_size"], len(train))
    if "train" in kind:
        args.update({"max_steps": r.randint(1, 5)} if r.random() < 0.5 else {"num_train_epochs": r.choice([1, 2])})
    if kind == "train-evaluate":
        args.update(eval_strategy="steps", eval_steps=2)
    if kind == "eval-dict":
        evaluation = {"first": evaluation, "second": train}
    where = f"seed {seed}: {kind} train [{train_desc}] eval [{eval_desc}] {args}"
    want = _run(transformers, checkpoint, transformers.AutoTokenizer.from_pretrained(checkpoint), tmp_path, kind,
                train, evaluation, args)
    got = _run(bertkit, checkpoint, tok, tmp_path, kind, train, evaluation, args)
    _same(want, got, where)


def test_a_dataset_dict_given_as_the_training_data_is_named_not_a_traceback(checkpoint, sst2, tmp_path):
    """The draws' one finding: load_dataset(...)'s DatasetDict as train_dataset stopped with an AttributeError from
    inside bertkit (transformers: "KeyError: Invalid key: 0")."""
    tok = bertkit.AutoTokenizer.from_pretrained(checkpoint)
    ds = datasets.Dataset.from_list(sst2[:6]).map(lambda b: tok(b["sentence"]), batched=True)
    args = bertkit.TrainingArguments(output_dir=str(tmp_path), use_cpu=True, max_steps=1, disable_tqdm=True)
    trainer = bertkit.Trainer(model=bertkit.AutoModelForSequenceClassification.from_pretrained(checkpoint), args=args,
                              train_dataset=datasets.DatasetDict({"train": ds}), processing_class=tok)
    with pytest.raises(BertkitError, match=re.escape("train_dataset is a DatasetDict of the datasets ['train']")):
        trainer.train()
