"""Several processes give the single-process result: data split, DDP equivalence, checkpoints, kills.

All on the CPU with gloo on 127.0.0.1 (a free port per run), tiny models, dropout off, fp32.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bertkit.errors import BertkitError
from bertkit.settings.training import micro_batch_size
from bertkit.training.batch_plan import BatchPlan, EpochBatches
from bertkit.training.checkpoint import read_state
from distributed_helpers import run_spawned, run_training  # tests/ is on sys.path under pytest

TOL = 1e-5  # fp32, max abs difference of any weight


# -------------------------------------------------------------------------------------------------
# The data split: disjoint, complete, deterministic
# -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("n", [1, 3, 31, 32, 33, 50, 97])
def test_ranks_read_the_epoch_exactly_once(world, n):
    micro = 4
    plans = [BatchPlan(list(range(n)), micro, list, seed=11, rank=r, world_size=world)
             for r in range(world)]
    for epoch in (0, 1):
        chunks = plans[0].global_batches(epoch)
        assert all(p.global_batches(epoch) == chunks for p in plans)  # every rank agrees on the epoch's order
        per_rank = [p.batches(epoch) for p in plans]
        assert all(len(b) == len(plans[0]) == len(chunks) for b in per_rank)  # same number of micro-steps
        for step, chunk in enumerate(chunks):
            # rank order concatenated is the global micro-batch: nothing duplicated, nothing dropped
            assert [i for r in range(world) for i in per_rank[r][step]] == chunk
            sizes = [len(per_rank[r][step]) for r in range(world)]
            assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)
        seen = sorted(i for b in per_rank for batch in b for i in batch)
        assert seen == list(range(n))
        # the order is a pure function of (seed, epoch), and differs between epochs when there is a choice
        assert BatchPlan(list(range(n)), micro, list, seed=11, rank=0, world_size=world).global_batches(epoch) == chunks
    if n > 8:
        assert plans[0].global_batches(0) != plans[0].global_batches(1)


def test_global_micro_batches_do_not_depend_on_the_world_size():
    """1 x 32 and 2 x 16 and 4 x 8 cut the epoch into the same global micro-batches (resume across world sizes)."""
    cuts = [BatchPlan(list(range(70)), 32 // w, list, seed=2, world_size=w).global_batches(3) for w in (1, 2, 4)]
    assert cuts[0] == cuts[1] == cuts[2]


def test_short_last_batch_weights_average_to_the_global_mean():
    world, micro, n = 4, 4, 18  # last global batch: 2 examples over 4 ranks
    plans = [BatchPlan(list(range(n)), micro, list, shuffle=False, seed=0, rank=r, world_size=world) for r in range(world)]
    items = [EpochBatches(p, 0)[1] for p in plans]  # (weight, batch) of each rank's last micro-step
    assert [w for w, _ in items] == [2.0, 2.0, 0.0, 0.0]  # sum(w) / world == 1: DDP's mean is the global mean
    assert [b for _, b in items] == [[16], [17], [16], [16]]  # an empty share runs one example at weight 0


def test_batch_size_that_does_not_divide_names_the_three_numbers():
    assert micro_batch_size(32, 2, 2) == 8
    with pytest.raises(BertkitError, match=r"--batch-size 30 .* 4 process\(es\) x 2 gradient-accumulation"):
        micro_batch_size(30, 4, 2)


def test_a_plan_for_another_world_size_is_refused(tmp_path):
    from bertkit.heads import BertForSequenceClassification
    from bertkit.settings import TrainingSettings
    from bertkit.training.loop import Phase, train
    from distributed_helpers import classification_examples, pad_collate, tiny_config

    plan = BatchPlan(classification_examples(8), 4, pad_collate, seed=0, rank=1, world_size=2)
    with pytest.raises(BertkitError, match="rank 1 of 2 but this process is rank 0 of 1"):
        train(BertForSequenceClassification(tiny_config()), [Phase(plan, 1)],
              TrainingSettings(output_dir=tmp_path, learning_rate=1e-3, device="cpu", progress=False))


def _resumed_window(windows: list[dict], rank: int, world: int):
    """The logging window rank ``rank`` of ``world`` continues from a checkpoint holding ``windows`` (one per rank
    that wrote it), as the loop restores it."""
    from bertkit._parallel import DistInfo
    from bertkit.training.checkpoint import restore_rank_state
    from bertkit.training.step_reads import LogWindow

    state = {"rank_rng": [{}] * len(windows), "windows": windows}
    return LogWindow.resumed(restore_rank_state(state, DistInfo(rank, world, rank), 0, 16, "cpu"), len(windows), world)


def test_a_logging_window_resumed_at_another_world_size_logs_each_step_once():
    """Each rank adds a step's share and its part of the step's loss x the world size: a window saved by 2 ranks
    after step 16 and continued by 1 process for steps 17 and 18 logs the mean of the three steps (it gave step 16
    twice the weight, and the other way round, from 1 process to 2, half of it)."""
    m16, m17, m18 = 7.0, 8.0, 12.0
    two_ranks = [{"loss": 2 * part, "mlm_loss": 3.0, "mlm_loss/count": 2.0, "_n": 1.0} for part in (0.25 * m16,
                                                                                                    0.75 * m16)]
    one = _resumed_window(two_ranks, 0, 1)
    for m in (m17, m18):
        one.add(m, 1.0, {"mlm_loss": (4.0, 2.0)})
    record = one.take()
    assert record["loss"] == pytest.approx((m16 + m17 + m18) / 3)
    assert record["mlm_loss"] == pytest.approx(14.0 / 8.0)  # sums and counts: unchanged by the world size

    one_process = [{"loss": m16, "mlm_loss": 3.0, "mlm_loss/count": 2.0, "_n": 1.0}]
    rank0, rank1 = _resumed_window(one_process, 0, 2), _resumed_window(one_process, 1, 2)
    assert (rank0.sums["loss"], rank0.n, rank0.sums["mlm_loss"]) == (2 * m16, 2.0, 3.0)  # as 2 ranks had added it
    assert (rank1.sums, rank1.n) == ({}, 0.0)


# -------------------------------------------------------------------------------------------------
# Equivalence: 2 ranks x 16 == 1 x 32 == 1 x 16 x accumulation 2
# -------------------------------------------------------------------------------------------------


def _max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


@pytest.fixture(scope="module")
def single_runs(tmp_path_factory):
    """The single-process references, per task: (1 x 32, 1 x 16 x accumulation 2)."""
    root = tmp_path_factory.mktemp("single")
    torch.set_num_threads(1)
    runs = {task: (run_training(task, str(root / f"{task}-32"), 32, 1, 4),
                   run_training(task, str(root / f"{task}-16x2"), 32, 2, 4))
            for task in ("pretrain", "glue")}
    runs["init"] = {task: run_training(task, str(root / f"{task}-0"), 32, 1, 1, extra={"learning_rate": 1e-12})["weights"]
                    for task in ("pretrain", "glue")}
    return runs


@pytest.mark.parametrize("task", ["pretrain", "glue"])
def test_accumulation_equals_the_full_batch(single_runs, task):
    full, accumulated = single_runs[task]
    assert _max_diff(full["weights"], accumulated["weights"]) <= TOL
    assert full["weights"].keys() == accumulated["weights"].keys()


TASKS = ("pretrain", "glue")


@pytest.fixture(scope="module")
def two_rank_runs(tmp_path_factory):
    """Every two-process run of this file, in one group of two processes."""
    root = tmp_path_factory.mktemp("ranks")
    jobs = [dict(task=task, out_dir=str(root / task), global_batch=32, accum=1, steps=4) for task in TASKS]
    jobs.append(dict(task="glue", out_dir=str(root / "tail"), global_batch=44, accum=2, steps=3, n=89))
    jobs += [dict(task=task, out_dir=str(root / f"{task}-short"), global_batch=8, accum=1, steps=3, n=n)
             for task, n in SHORT_LAST]
    jobs.append(dict(task="token_evaluation", out_dir=str(root / "token-evaluation")))
    results = run_spawned(2, str(root / "results.pt"), jobs)
    return root, dict(zip([*TASKS, "tail", *(f"{task}-short" for task, _ in SHORT_LAST), "token_evaluation"], results))


# an epoch of 2 global batches of 8 and a short third, split over 2 ranks 2 + 1 (glue), or 1 + 0 (pretrain: a
# token-level loss; rank 1 runs its stand-in example at weight 0)
SHORT_LAST = (("glue", 19), ("pretrain", 17))


@pytest.mark.parametrize("task", TASKS)
def test_two_ranks_equal_one_process(single_runs, two_rank_runs, task):
    full, accumulated = single_runs[task]
    root, runs = two_rank_runs
    ranks = runs[task]
    written = read_state(root / task / "checkpoints" / "step-00000004")  # the weights: its model.safetensors
    assert _max_diff(ranks["weights"], full["weights"]) <= TOL
    assert _max_diff(ranks["weights"], accumulated["weights"]) <= TOL
    stored = {k: v for k, v in full["weights"].items() if k in written["model"]}  # not the tied decoder's twice
    assert _max_diff(written["model"], stored) <= TOL  # rank 0's checkpoint
    assert written["world_size"] == 2 and len(written["rank_rng"]) == 2
    # the logged loss is the mean over both ranks' halves: the full batch's loss
    losses = [(r["step"], r["loss"]) for r in ranks["history"] if r["split"] == "train"]
    ref = [(r["step"], r["loss"]) for r in full["history"] if r["split"] == "train"]
    assert [s for s, _ in losses] == [s for s, _ in ref] == [1, 2, 3, 4]
    assert max(abs(a - b) for (_, a), (_, b) in zip(losses, ref)) <= 1e-5
    # the weights really moved: the comparison is not between two untouched initialisations
    assert _max_diff(ranks["weights"], single_runs["init"][task]) > 1e-3


def test_two_ranks_with_accumulation_and_a_short_last_batch(two_rank_runs, tmp_path):
    """89 examples, global batch 44 = 2 ranks x 11 x accumulation 2: the epoch's last global micro-batch holds
    one example, so rank 0 trains on it at weight 2 and rank 1 on nothing (weight 0); step 3 mixes it with the
    next epoch's first micro-batch. The weights still equal one process's."""
    one = run_training("glue", str(tmp_path / "one"), 44, 2, 3, n=89)
    assert _max_diff(one["weights"], two_rank_runs[1]["tail"]["weights"]) <= TOL


@pytest.mark.parametrize("task, n", SHORT_LAST)
def test_two_ranks_log_one_process_s_losses_with_a_short_last_batch(two_rank_runs, tmp_path, task, n):
    """Was: each rank's mean of a short last batch split 2 + 1 counted once (logged 0.7259 for one process's 0.7156
    on SST-2 rows), and a step whose rank 1 ran only a stand-in counted once where the others counted twice, so
    train_loss (and a window of several steps) leaned to the full steps (0.6990 for 0.6922), and a token-level loss of
    such a step was logged doubled. Now the logged losses and train_loss are one process's."""
    one = run_training(task, str(tmp_path / "one"), 8, 1, 3, n=n)
    two = two_rank_runs[1][f"{task}-short"]
    assert _max_diff(one["weights"], two["weights"]) <= TOL
    logged = [[(r["step"], r["loss"]) for r in run["history"] if r["split"] == "train"] for run in (one, two)]
    assert [s for s, _ in logged[0]] == [s for s, _ in logged[1]] == [1, 2, 3]
    assert [v for _, v in logged[1]] == pytest.approx([v for _, v in logged[0]], abs=1e-5)
    assert two["train_loss"] == pytest.approx(one["train_loss"], abs=1e-5)
    # pre-training's masked-LM and next-sentence figures: sums over every rank's targets and instances
    metrics = [[{k: r[k] for k in r if k[:4] in ("mlm_", "nsp_")} for r in run["history"] if r["split"] == "train"]
               for run in (one, two)]
    for mine, theirs in zip(*metrics):
        assert mine.keys() == theirs.keys() and (task != "pretrain" or len(mine) == 4)
        assert theirs == pytest.approx(mine, abs=1e-5)


def test_a_trainer_evaluation_under_torchrun_runs_one_process_s_batches(two_rank_runs, tmp_path):
    """Was: the ranks evaluated every other row (rows 0, 2, 4, 6 in rank 0's first batch), so a token classifier's
    batches, and with them its eval_loss (a mean of per-batch token means) and its predictions past a row's end (the
    logits of its batch's padding, then -100), were not one process's: eval_loss 1.1212 for 1.1220 on SST-2 rows,
    predictions 100 apart. Now each rank runs whole batches of one process, dealt out in turn, as accelerate does."""
    from distributed_helpers import token_evaluation

    one, two = token_evaluation(str(tmp_path / "one")), two_rank_runs[1]["token_evaluation"]
    assert two["eval_loss"] == pytest.approx(one["eval_loss"], abs=1e-6)
    assert two["predictions"].shape == one["predictions"].shape == (11, 30, 3)
    np.testing.assert_allclose(two["predictions"], one["predictions"], atol=1e-5)
