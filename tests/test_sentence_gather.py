"""In-batch negatives gathered across processes (``gather_across_devices=True``): 2 processes x 8 rows (or 9 + 7) give
the loss and the gradients of 1 process x 16, for every loss with in-batch negatives; each anchor keeps its own
positive and hard negatives after the gather; uneven shares and a rank with no share (a stand-in row) too.

Two processes on gloo (CPU, 127.0.0.1, a free port), started as tests/test_distributed.py starts them.
"""

from __future__ import annotations

import pytest
import torch

from distributed_helpers import free_port  # tests/ is on sys.path under pytest
from sentence_gather_helpers import CASES, worker


@pytest.fixture(scope="module")
def results(tmp_path_factory, minilm_2_layers, data_dir):
    from launch_helpers import spawn_gloo_workers

    out = tmp_path_factory.mktemp("gather") / "results.pt"
    spawn_gloo_workers(worker, lambda: (2, free_port(), str(minilm_2_layers), str(data_dir), str(out)), 2)
    return torch.load(out, weights_only=False)


def test_the_gather_keeps_each_row_with_its_own_columns(results):
    """Column c's row i holds (i, c) on whichever rank runs it; gathered, every column lists rows 0..N-1 in order
    on every rank, so anchor i meets its own positive and hard negatives at position i (a rank's offset is the
    rows of the ranks before it). A stand-in copy of row 0 on rank 1 is left out."""
    for split, n in (("3+5", 8), ("stand-in", 1)):
        for rank, got in enumerate(results["gathered"]):
            rows = got[split]["rows"]
            assert len(rows) == 3
            for c, column in enumerate(rows):
                assert column.tolist() == [[float(i), float(c)] for i in range(n)], (split, rank, c)
    # the gradient reaches each rank's own rows, once each (not a stand-in's); the factor N / n_r that the loss
    # applies to it (the loop weights rank r by n_r x W / N) comes back beside the rows
    three, five, standin = (results["gathered"][r][s] for r, s in ((0, "3+5"), (1, "3+5"), (1, "stand-in")))
    assert (three["factor"], five["factor"], standin["factor"]) == (8 / 3, 8 / 5, 0.0)
    assert all(torch.equal(g, torch.ones(k, 2)) for got, k in ((three, 3), (five, 5)) for g in got["grad"])
    assert all(torch.equal(g, torch.zeros(1, 2)) for g in standin["grad"])


@pytest.mark.parametrize("case", [f"{name}-{split}" for name, _, split in CASES])
def test_two_processes_give_the_loss_and_gradients_of_one(results, case):
    r = results["losses"][case]
    # every rank computes the global batch's loss (the mean over the ranks, which the loop logs, is the same)
    # (abs: GIST's near-zero loss at temperature 0.01 carries float32 noise of a few 1e-9)
    assert r["got"] == pytest.approx([r["want"]] * 2, rel=1e-5, abs=1e-7)
    # the averaged gradient is the 1-process gradient up to float32 summation noise (the ranks pad their
    # batches to other lengths than one process does); GIST's logits are similarities x 100 (temperature 0.01),
    # 5x MNRL's scale of 20, and its noise with them (measured: 2.1e-5 on an even split of 32 rows)
    assert r["grad_error"] <= (5e-5 if case.startswith(("gist", "matryoshka_gist")) else 1e-5)
    assert r["grad_norm"] > 0


def test_the_cached_loss_under_ddp_has_the_uncached_gradient(results):
    """Was: under DDP (the trainer under torchrun) CachedMultipleNegativesRankingLoss ran a backward pass per
    mini-batch inside the loop's; DDP averaged the first mini-batch's gradient over the processes and left the others'
    local (a training script's first-step gradient norm 6.04, where sentence-transformers and the uncached loss give
    3.49). Its gradients now reach autograd in one step."""
    r = results["losses"]["ddp-cached"]
    assert r["grad_error"] <= 1e-5 and r["grad_norm"] > 0


def test_an_evaluation_batch_is_evaluated_alone(results):
    """Was: evaluating (no grad) with gather_across_devices=True gathered each rank's batch with the other ranks':
    a loss one process never computes for that batch, and a crash under torchrun (gloo: "Received data size doesn't
    match") where the ranks were dealt different numbers of evaluation batches (3 batches over 2 ranks)."""
    (gathered_0, alone_0), (gathered_1, alone_1) = results["losses"]["evaluation"]
    assert gathered_0 == pytest.approx(alone_0, rel=1e-6) and gathered_1 == pytest.approx(alone_1, rel=1e-6)
    assert abs(alone_0 - alone_1) > 0.1  # the ranks' batches differ: a gathered loss would be one number on both


def test_a_loss_s_terms_are_logged_over_every_process(results):
    """Was: each rank logged its own batches' mean of a loss's named terms (SpladeLoss's regularisers), so the log
    (rank 0's) held rank 0's alone, beside a loss averaged over the ranks; sentence-transformers logs their mean over
    every process's batches. Batches of 3 and 3 rows on rank 0 and of 6 on rank 1: 4 on both."""
    assert results["terms"] == [{"rows": 4.0}, {"rows": 4.0}]


def test_an_evaluation_under_torchrun_weighs_the_batches_as_one_process(results, minilm_2_layers, data_dir, tmp_path):
    """Was: under torchrun eval_loss weighed each evaluation batch by its rows, one process (as sentence-transformers)
    each batch but the last as per_device_eval_batch_size rows, so where the no-duplicates sampler left a batch short
    two processes reported another loss than one (0.0327 for 0.0218 on STS-B pairs). Now the same weights."""
    from sentence_gather_helpers import no_duplicates_eval_loss

    one = no_duplicates_eval_loss(str(minilm_2_layers), str(data_dir), str(tmp_path / "one"))
    assert results["eval_loss"] == pytest.approx(one, rel=1e-6)


def test_a_global_batch_of_two_single_rows_is_not_refused_before_the_trainer_joins_torchrun_s_group(monkeypatch):
    """Was: torchrun --nproc_per_node 2 with per_device_train_batch_size=1 and gather_across_devices=True was refused
    as "a batch of 1 holds none" (the check ran before the trainer joined the group, as one process); the global
    batch is 2 rows. One process of 1 row is still refused."""
    from types import SimpleNamespace

    from bertkit.errors import BertkitError
    from bertkit.sentence.loss_model import check_batch_holds_negatives

    loss, args = SimpleNamespace(in_batch_negatives=True), SimpleNamespace(per_device_train_batch_size=1)
    with pytest.raises(BertkitError, match="a batch of 1 holds none"):
        check_batch_holds_negatives(loss, args)
    for name, value in (("RANK", "0"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "0")):  # torchrun's, before the join
        monkeypatch.setenv(name, value)
    check_batch_holds_negatives(loss, args)


def test_misaligned_positives_would_be_caught(results):
    """The control: the same batch with rank 1's positives paired with rank 0's anchors (misplaced offsets, the
    kind of sentence-transformers' 2025 gather bug) has another loss, so the comparisons above would fail on it.
    Misplaced hard negatives barely move these losses (each anchor's candidates are every document of the batch,
    in any order; only doc_to_doc leaves an anchor's own out): the row order of every column, hard negatives
    included, is what test_the_gather_keeps_each_row_with_its_own_columns checks."""
    control = results["losses"]["control"]
    assert abs(control["misaligned"] - control["want"]) > 1.0


@pytest.mark.slow  # two launches of a MiniLM training script, 30-90 s on two loaded cores: make test-slow
def test_a_training_script_under_torchrun_equals_one_process(tmp_path, minilm_dir, data_dir):
    """SentenceTransformerTrainer with gather_across_devices=True: two processes x 16 log the losses and gradient
    norms of one process x 32 at every step, the last step's single row (rank 1 runs a stand-in) included."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from launch_helpers import run_torchrun
    from sentence_helpers import st_directory

    model = st_directory(minilm_dir, tmp_path / "model", dropout=0.0, normalize=False)
    script = Path(__file__).with_name("sentence_torchrun_script.py")
    squad = str(data_dir / "squad" / "dev-v1.1.json")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).parents[1] / "src")}
    subprocess.run([sys.executable, str(script), str(model), squad, str(tmp_path / "one"), str(tmp_path / "one.pt"),
                    "32"], check=True, env=env, capture_output=True)
    two = run_torchrun([str(script), str(model), squad, str(tmp_path / "two"), str(tmp_path / "two.pt"), "16"], env,
                       600, fresh=tmp_path / "two")
    assert two.returncode == 0, two.stderr[-3000:]
    one, two = (torch.load(tmp_path / f"{name}.pt", weights_only=False)["log_history"] for name in ("one", "two"))

    def records(history, key):
        return {r["step"]: r[key] for r in history if key in r and "train_runtime" not in r}

    assert list(records(two, "loss")) == [1, 2, 3]
    # float32 sums over 32 rows in two orders: relative 1e-5, or 2e-6 absolute for the last step's small loss (one
    # row, 0.0649: measured 9.5e-7 = 2**-20 apart, 1.5e-5 relative)
    assert records(two, "loss") == pytest.approx(records(one, "loss"), rel=1e-5, abs=2e-6)
    assert records(two, "grad_norm") == pytest.approx(records(one, "grad_norm"), rel=1e-4)
