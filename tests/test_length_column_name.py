"""TrainingArguments(length_column_name=...): group_by_length reads each row's length from that column, as
transformers' LengthGroupedSampler does (it was refused unless "length"). Each training step's rows must be
transformers'."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

import bertkit
from trainer_helpers import sst2_dev, tiny_classifier

transformers = pytest.importorskip("transformers")
datasets = pytest.importorskip("datasets")
pytest.importorskip("accelerate")


@pytest.fixture(scope="module")
def sst(data_dir):
    return sst2_dev(data_dir)


@pytest.fixture(scope="module")
def tiny(minilm_dir, tmp_path_factory) -> Path:
    return tiny_classifier(tmp_path_factory.mktemp("length-column") / "tiny", minilm_dir, hidden_size=16,
                           num_hidden_layers=1, intermediate_size=32)


class _DropColumn:
    """A collator that leaves the length column out of the batch (so remove_unused_columns=False keeps it in the
    rows the sampler reads, and no model argument is added)."""

    def __init__(self, inner, column: str):
        self.inner, self.column = inner, column

    def __call__(self, features):
        return self.inner([{k: v for k, v in f.items() if k != self.column} for f in features])


def _batches(lib, path: Path, rows: list, column: str, remove: bool, batch: int, seed: int, out: Path) -> list:
    tokenizer = lib.AutoTokenizer.from_pretrained(path)
    draw = random.Random(seed)
    features = [{**{k: v for k, v in tokenizer(r["text"], truncation=True, max_length=24).items()
                    if k in ("input_ids", "attention_mask")}, "label": r["label"], column: draw.randint(1, 500)}
                for r in rows]  # the column's lengths are not the rows': the order shows which one was read
    row_of = {tuple(f["input_ids"]): i for i, f in enumerate(features)}
    model, seen = lib.AutoModelForSequenceClassification.from_pretrained(path), []

    def record(module, positional, kwargs):
        if module.training:
            seen.append([row_of[tuple(ids[mask.bool()].tolist())]
                         for ids, mask in zip(kwargs["input_ids"], kwargs["attention_mask"])])

    model.register_forward_pre_hook(record, with_kwargs=True)
    args = lib.TrainingArguments(output_dir=str(out / lib.__name__), report_to="none", use_cpu=True,
                                 disable_tqdm=True, save_strategy="no", train_sampling_strategy="group_by_length",
                                 length_column_name=column, remove_unused_columns=remove,
                                 per_device_train_batch_size=batch, seed=seed, num_train_epochs=1)
    lib.Trainer(model=model, args=args, train_dataset=datasets.Dataset.from_list(features),
                data_collator=_DropColumn(lib.DataCollatorWithPadding(tokenizer), column),
                processing_class=tokenizer).train()
    return seen


def test_group_by_length_reads_the_named_column(sst, tiny, tmp_path):
    rows = sst[:17]
    ours = _batches(bertkit, tiny, rows, "n_tokens", False, 3, 4, tmp_path)
    assert ours == _batches(transformers, tiny, rows, "n_tokens", False, 3, 4, tmp_path)
    # the column was read: the input_ids' lengths give another order
    assert ours != _batches(bertkit, tiny, rows, "n_tokens", True, 3, 4, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("draw", range(6))
def test_drawn_length_columns_give_transformers_batches(draw, sst, tiny, tmp_path):
    r = random.Random(draw)
    column, remove = r.choice(["n_tokens", "len", "length", "Length", "size_"]), r.random() < 0.5
    batch, seed, rows = r.choice([1, 2, 3, 5]), r.randint(0, 99), r.sample(sst, r.choice([9, 17, 30]))
    ours = _batches(bertkit, tiny, rows, column, remove, batch, seed, tmp_path)
    assert ours == _batches(transformers, tiny, rows, column, remove, batch, seed, tmp_path), (column, remove, batch)
