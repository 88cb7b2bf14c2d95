"""train_sampling_strategy="group_by_length" draws transformers' LengthGroupedSampler's order: the same rows in
each batch, from torch's global generator as each epoch begins, and a resumed run the uninterrupted run's order;
under torchrun each rank's batches are those accelerate deals that rank."""

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
    grouped = LengthGroupedOrder(lengths, 6)
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
    grouped = LengthGroupedOrder(lengths, 4)
    grouped.begin_epoch(1)
    first = grouped.order(1)
    grouped.save(tmp_path)
    torch.rand(100)  # the epoch's steps (dropout) move the global generator on
    resumed = LengthGroupedOrder(lengths, 4)
    resumed.load(tmp_path)
    assert resumed.order(1) == first
    with pytest.raises(BertkitError, match="was not drawn"):
        resumed.order(2)
    with pytest.raises(BertkitError, match=r"holds no length_grouped_rng\.pt.*resume it with the strategy"):
        resumed.load(tmp_path / "elsewhere")


def test_refusals_name_the_value_and_the_fix():
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


def _as_rank(monkeypatch, rank: int) -> None:
    """The Trainer's batches as rank ``rank`` of 2 processes cuts them (no process group: the order is drawn here)."""
    from bertkit._parallel import DistInfo
    from bertkit.training import trainer, trainer_eval

    for module in (trainer, trainer_eval):
        monkeypatch.setattr(module, "current", lambda: DistInfo(rank=rank, world_size=2, local_rank=rank))


def test_each_rank_trains_on_the_batches_accelerate_deals_it(tiny_model, tmp_path, monkeypatch):
    """transformers' processes under torchrun each draw the one LengthGroupedSampler order (from the global
    generator, seeded alike) and accelerate's BatchSamplerShard gives process r batches r, r + 2, ...: bertkit's rank
    r trains on those, at accumulation 1 to 3, with and without dataloader_drop_last, an epoch's short last round
    filled up with its first rows. bertkit refused it before."""
    pytest.importorskip("accelerate")
    from accelerate.data_loader import BatchSamplerShard
    from torch.utils.data import BatchSampler

    import bertkit
    from bertkit.training.batch_plan import BatchPlan

    r = random.Random(4)
    rows = [{"input_ids": [2] + [r.randint(5, 90) for _ in range(r.randint(1, 40))] + [3], "label": r.randint(0, 1)}
            for _ in range(120)]
    lengths = [len(row["input_ids"]) for row in rows]
    for n, per_device, accum, drop in ((120, 4, 1, False), (120, 3, 3, False), (115, 4, 2, True), (117, 4, 2, False),
                                       (3, 2, 1, False)):
        args = bertkit.TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none", seed=6,
                                         train_sampling_strategy="group_by_length", dataloader_drop_last=drop,
                                         per_device_train_batch_size=per_device, gradient_accumulation_steps=accum)
        trainer = bertkit.Trainer(model=tiny_model("BertForSequenceClassification", labels=2), args=args,
                                  train_dataset=rows[:n])
        examples = trainer._examples(trainer.train_dataset, "train_dataset")
        for rank in (0, 1):
            _as_rank(monkeypatch, rank)
            plan = BatchPlan(examples, per_device, trainer._collate, seed=6, draw=trainer._batches(examples),
                             rank=rank, world_size=2, per_epoch=trainer._batches_per_epoch(examples))
            torch.manual_seed(11)
            trainer._grouped.begin_epoch(0)
            torch.manual_seed(11)
            sampler = LengthGroupedSampler(per_device * accum, lengths=lengths[:n])
            theirs = list(BatchSamplerShard(BatchSampler(sampler, per_device, drop), num_processes=2,
                                            process_index=rank))
            assert plan.batches(0) == theirs, (n, per_device, accum, drop, rank)


def test_a_short_last_global_batch_is_filled_with_the_epochs_first_rows_as_accelerate_fills_it():
    """Any order (random's, group_by_length's) under torchrun: an epoch whose rows do not fill its last global batch
    ends, on every process, with a whole batch topped up with the epoch's first rows, as accelerate's
    BatchSamplerShard (even_batches) ends transformers' epoch. bertkit split the short batch over the processes
    instead (for 10 rows of 2 a process: rank 0 trained on [8], rank 1 on [9] at the last step, for accelerate's
    [8, 9] and [0, 1])."""
    pytest.importorskip("accelerate")
    from accelerate.data_loader import BatchSamplerShard
    from torch.utils.data import BatchSampler

    from bertkit.training.batch_plan import BatchPlan
    from bertkit.training.trainer_data import global_batches

    for n, per_device, world in ((10, 2, 2), (9, 2, 2), (3, 2, 2), (1, 3, 2), (23, 3, 3), (16, 4, 2), (7, 2, 1)):
        order = torch.randperm(n, generator=torch.Generator().manual_seed(n)).tolist()
        for rank in range(world):
            plan = BatchPlan(order, per_device, list, seed=0, rank=rank, world_size=world,
                             draw=lambda epoch, order=order, per_device=per_device, world=world:
                             global_batches(order, per_device, world, fill=True))
            batch_sampler = BatchSampler(order, per_device, False)
            theirs = list(BatchSamplerShard(batch_sampler, num_processes=world, process_index=rank)
                          if world > 1 else batch_sampler)
            assert plan.batches(0) == theirs, (n, per_device, world, rank)


def test_each_rank_evaluates_the_batches_accelerate_deals_it(tiny_model, tmp_path, monkeypatch):
    """Evaluation and predict() under torchrun: one process's length-grouped batches (seeded with seed), every
    second one to each rank, as accelerate's BatchSamplerShard deals transformers' evaluation loader. bertkit
    refused it before."""
    pytest.importorskip("accelerate")
    from accelerate.data_loader import BatchSamplerShard
    from torch.utils.data import BatchSampler

    import bertkit

    r = random.Random(5)
    rows = [{"input_ids": [2] + [r.randint(5, 90) for _ in range(r.randint(1, 30))] + [3], "label": r.randint(0, 1)}
            for _ in range(40)]
    lengths = [len(row["input_ids"]) for row in rows]
    args = bertkit.TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none", seed=8,
                                     train_sampling_strategy="group_by_length", per_device_eval_batch_size=5)
    trainer = bertkit.Trainer(model=tiny_model("BertForSequenceClassification", labels=2), args=args,
                              eval_dataset=rows)
    for rank in (0, 1):
        _as_rank(monkeypatch, rank)
        sampler = LengthGroupedSampler(5, lengths=lengths, generator=torch.Generator().manual_seed(8))
        theirs = list(BatchSamplerShard(BatchSampler(sampler, 5, False), num_processes=2, process_index=rank))
        assert trainer._eval_batches(rows) == theirs, rank


@pytest.mark.slow  # about 30 s on 2 cores: each library's Trainer on 2 gloo processes
def test_two_processes_train_on_transformers_rows_with_its_losses(tmp_path):
    """transformers' Trainer and bertkit's, each on 2 gloo processes with group_by_length (94 rows, 4 a process,
    2 epochs, each ending on a global batch of 6 rows topped up with 2): every rank trains on the same rows at every
    step, with the same logged losses (the mean over both processes) and the same eval_loss; bertkit's run resumed from checkpoint-3, in the middle of the first epoch,
    trains on the uninterrupted run's rows. bertkit refused group_by_length under torchrun before."""
    pytest.importorskip("accelerate")
    from distributed_helpers import free_port
    from launch_helpers import spawn_gloo_workers
    from length_ddp_helpers import tiny_model_dir, worker

    model_dir = tiny_model_dir(tmp_path / "model")
    got = {}
    for library in ("transformers", "bertkit"):
        result = tmp_path / f"{library}.pt"
        spawn_gloo_workers(worker, lambda library=library, result=result: (
            2, free_port(), library, str(model_dir), str(tmp_path / library), str(result)), 2)
        got[library] = torch.load(result, weights_only=False)
    theirs, ours = got["transformers"], got["bertkit"]
    for rank in (0, 1):
        assert ours["ranks"][rank]["trained"] == theirs["ranks"][rank]["trained"], rank
        assert len(ours["ranks"][rank]["trained"]) == 24  # 12 steps an epoch, 2 epochs
        assert ours["ranks"][rank]["evaluated"] == theirs["ranks"][rank]["evaluated"], rank
        assert ours["ranks"][rank]["resumed"] == ours["ranks"][rank]["trained"][3:], rank
    assert ours["ranks"][0]["trained"] != ours["ranks"][1]["trained"]
    torch.testing.assert_close(torch.tensor(ours["losses"], dtype=torch.float64),
                               torch.tensor(theirs["losses"], dtype=torch.float64), rtol=0, atol=1e-6)
    assert ours["eval_loss"] == pytest.approx(theirs["eval_loss"], abs=1e-6)


def test_transformers_4_spelling_is_refused_naming_the_new_one(tmp_path):
    """group_by_length=True (transformers 4) was refused as an unknown argument with no pointer to its new name."""
    import bertkit

    with pytest.raises(BertkitError, match=r"group_by_length=True, transformers 4's spelling.*use "
                                           r"train_sampling_strategy='group_by_length'"):
        bertkit.TrainingArguments(output_dir=str(tmp_path), group_by_length=True)


def test_batch_rebalance_is_refused_naming_what_to_choose(tmp_path):
    """transformers 5's fourth strategy was refused as "not one of ('random', 'sequential', 'group_by_length')",
    which neither said what it is nor which of those does its job."""
    import bertkit

    with pytest.raises(BertkitError, match=r"train_sampling_strategy 'batch_rebalance' \(transformers' sampler that "
                                           r"spreads padded tokens.*not implemented in bertkit; choose "
                                           r"'group_by_length' \(batches of similar lengths: less padding\)"):
        bertkit.TrainingArguments(output_dir=str(tmp_path), train_sampling_strategy="batch_rebalance")


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
