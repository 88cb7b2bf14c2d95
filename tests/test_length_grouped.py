"""train_sampling_strategy="group_by_length" draws transformers' LengthGroupedSampler's order: the same rows in
each batch, from torch's global generator as each epoch begins, and a resumed run the uninterrupted run's order."""

from __future__ import annotations

import random

import pytest
import torch

from bertkit.errors import BertkitError
from bertkit.training.length_grouped import LengthGroupedOrder, grouped_indices, row_lengths

pytest.importorskip("transformers")
from transformers.trainer_pt_utils import LengthGroupedSampler, get_length_grouped_indices  # noqa: E402


def test_grouped_indices_are_transformers_for_drawn_lengths_and_batches():
    """Batch sizes that do not divide the data, one to more than 50 megabatches, ties in length (a stable sort and
    the first of equal maxima). bertkit drew its own order before: shuffled windows of 50 batches, the batches
    shuffled again (for 40 rows, batch 4, seed 0, its first batch shared no row with transformers')."""
    r = random.Random(0)
    for _ in range(200):
        n, batch = r.randint(1, 600), r.choice([1, 2, 3, 4, 5, 8, 12])
        lengths = [r.randint(3, r.choice([4, 10, 128])) for _ in range(n)]
        seed = r.randint(0, 2**31)
        ours = grouped_indices(lengths, batch, torch.Generator().manual_seed(seed))
        assert ours == get_length_grouped_indices(lengths, batch, generator=torch.Generator().manual_seed(seed)), \
            (n, batch, seed)


def test_each_epoch_draws_from_the_global_generator_as_transformers_sampler_does():
    lengths = [random.Random(1).randint(2, 40) for _ in range(37)]
    torch.manual_seed(5)
    grouped = LengthGroupedOrder(lengths, 6, world_size=1)
    ours = []
    for epoch in range(3):
        grouped.begin_epoch(epoch)
        ours.append(grouped.order(epoch))
    after = torch.rand(1)
    torch.manual_seed(5)
    theirs = [list(LengthGroupedSampler(6, lengths=lengths)) for _ in range(3)]
    assert ours == theirs and torch.equal(after, torch.rand(1))  # and the generator moved on as far


def test_a_resumed_run_draws_the_epoch_its_checkpoint_was_written_in(tmp_path):
    lengths = list(range(3, 40))
    torch.manual_seed(2)
    grouped = LengthGroupedOrder(lengths, 4, world_size=1)
    grouped.begin_epoch(1)
    first = grouped.order(1)
    grouped.save(tmp_path)
    torch.rand(100)  # the epoch's steps (dropout) move the global generator on
    resumed = LengthGroupedOrder(lengths, 4, world_size=1)
    resumed.load(tmp_path)
    assert resumed.order(1) == first
    with pytest.raises(BertkitError, match="was not drawn"):
        resumed.order(2)
    with pytest.raises(BertkitError, match=r"holds no length_grouped_rng\.pt.*resume it with the strategy"):
        resumed.load(tmp_path / "elsewhere")


def test_refusals_name_the_value_and_the_fix():
    with pytest.raises(BertkitError, match=r"under torchrun \(2 processes\).*train_sampling_strategy='random'"):
        LengthGroupedOrder([3, 4], 2, world_size=2)
    with pytest.raises(BertkitError, match=r"its 'input_ids'.*hold \['text'\].*tokenize the data first"):
        row_lengths([{"text": "a"}], None, "input_ids")
    # the length column where the data has one, else the first model input's length
    assert row_lengths([{"input_ids": [1, 2, 3], "length": 9}], "length", "input_ids") == [9]
    assert row_lengths([{"input_ids": [1, 2, 3], "length": 9}], None, "input_ids") == [3]


def test_evaluation_batches_are_transformers_eval_samplers(tiny_model, tmp_path):
    """transformers evaluates under group_by_length in a LengthGroupedSampler's batches seeded with data_seed (or
    seed); bertkit evaluated in the dataset's order: a tagger's eval_loss (a mean per batch) on 13 CoNLL rows was
    2.1712 against transformers' 2.1702, and dataloader_drop_last evaluated other rows (accuracy 0.1617 against
    0.1632). Predictions stay in the dataset's order (documented)."""
    import bertkit

    r = random.Random(3)
    rows = [{"input_ids": [2] + [r.randint(5, 90) for _ in range(r.randint(1, 30))] + [3], "label": r.randint(0, 1)}
            for _ in range(29)]
    lengths = [len(row["input_ids"]) for row in rows]
    for size, seeds, drop in ((3, {"seed": 4}, False), (4, {"seed": 4, "data_seed": 9}, True)):
        args = bertkit.TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none",
                                         train_sampling_strategy="group_by_length", per_device_eval_batch_size=size,
                                         dataloader_drop_last=drop, **seeds)
        trainer = bertkit.Trainer(model=tiny_model("BertForSequenceClassification", labels=2), args=args,
                                  eval_dataset=rows)
        order = list(LengthGroupedSampler(size, lengths=lengths, generator=torch.Generator().manual_seed(
            seeds.get("data_seed", seeds["seed"]))))
        kept = len(rows) // size * size if drop else len(rows)
        assert trainer._eval_batches(rows) == [order[s:s + size] for s in range(0, kept, size)], (size, seeds)


def test_transformers_4_spelling_is_refused_naming_the_new_one(tmp_path):
    """group_by_length=True (transformers 4) was refused as an unknown argument with no pointer to its new name."""
    import bertkit

    with pytest.raises(BertkitError, match=r"group_by_length=True, transformers 4's spelling.*use "
                                           r"train_sampling_strategy='group_by_length'"):
        bertkit.TrainingArguments(output_dir=str(tmp_path), group_by_length=True)


def test_sentence_trainers_train_in_sentence_transformers_order_whatever_the_strategy(tiny_checkpoint, minilm_dir,
                                                                                     tmp_path, caplog):
    """sentence-transformers' trainers never read train_sampling_strategy (their batch_sampler shuffles); bertkit's
    trained in the dataset's order under "sequential" and in a length-grouped one under "group_by_length", with
    other losses and no word. Now they train as under "random", with a warning naming the argument."""
    from bertkit.sentence import (
        SentenceTransformer,
        SentenceTransformerTrainer,
        SentenceTransformerTrainingArguments,
        losses,
        models,
    )

    path = tiny_checkpoint(tmp_path / "base", "BertModel", tokenizer=minilm_dir)
    pairs = [{"anchor": f"question number {i} " * (i % 4 + 1), "positive": f"passage {i}"} for i in range(10)]
    logged = {}
    for strategy in ("random", "sequential", "group_by_length"):
        word = models.Transformer(str(path), max_seq_length=16)
        model = SentenceTransformer(modules=[word, models.Pooling(word.get_word_embedding_dimension())])
        trainer = SentenceTransformerTrainer(
            model=model, loss=losses.MultipleNegativesRankingLoss(model), train_dataset=pairs,
            args=SentenceTransformerTrainingArguments(
                output_dir=str(tmp_path / strategy), report_to="none", use_cpu=True, disable_tqdm=True, seed=3,
                per_device_train_batch_size=4, max_steps=3, logging_steps=1, train_sampling_strategy=strategy))
        caplog.clear()
        trainer.train()
        logged[strategy] = [h["loss"] for h in trainer.state.log_history if "loss" in h]
        assert (f"does not read train_sampling_strategy={strategy!r}" in caplog.text) == (strategy != "random")
    assert logged["sequential"] == logged["group_by_length"] == logged["random"]
