"""MatryoshkaLoss(n_dims_per_step=k) under torchrun: every rank trains the widths rank 0 draws. Was: each rank drew
from its own Python ``random`` (the loop seeds rank r with seed + r), so in one step the ranks trained other widths
and DDP averaged gradients of other losses: MiniLM (2 layers) on 48 SQuAD pairs with
MatryoshkaLoss(MultipleNegativesRankingLoss(gather_across_devices=True), [384, 128, 64, 32], n_dims_per_step=1),
2 processes x 8 gave step 2's loss 1.7576 and gradient norm 14.43 where one process x 16 gives 1.7046 and 10.17
(sentence-transformers seeds its ranks alike, so they draw the same widths)."""

from __future__ import annotations

import os
import random

import torch
import torch.distributed as dist

from distributed_helpers import free_port  # tests/ is on sys.path under pytest

SEED, STEPS = 3, 12


def _draws(loss) -> list[list[int]]:
    return [loss._dims() for _ in range(STEPS)]


def worker(rank: int, world: int, port: int, model_dir: str, result_file: str) -> None:
    from bertkit.sentence import SentenceTransformer, losses

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        model = SentenceTransformer(model_dir)
        loss = losses.MatryoshkaLoss(model, losses.MultipleNegativesRankingLoss(model, gather_across_devices=True),
                                     [32, 16, 8, 4], n_dims_per_step=1)
        random.seed(SEED + rank)  # as the training loop seeds each rank
        loss.train()
        trained = _draws(loss)
        loss.eval()  # evaluation: no collective (the ranks evaluate other batches), each rank's own draws
        evaluated = _draws(loss)
        out = [None] * world
        dist.all_gather_object(out, {"train": trained, "eval": evaluated})
        if rank == 0:
            torch.save(out, result_file)
    finally:
        dist.destroy_process_group()


def test_every_rank_trains_the_widths_rank_0_draws(tmp_path, tiny_checkpoint, minilm_dir):
    from bertkit.sentence import SentenceTransformer, losses
    from launch_helpers import spawn_gloo_workers

    model_dir = tiny_checkpoint(tmp_path / "model", tokenizer=minilm_dir)
    out = tmp_path / "draws.pt"
    spawn_gloo_workers(worker, lambda: (2, free_port(), str(model_dir), str(out)), 2)
    ranks = torch.load(out)
    model = SentenceTransformer(model_dir)
    one = losses.MatryoshkaLoss(model, losses.MultipleNegativesRankingLoss(model), [32, 16, 8, 4], n_dims_per_step=1)
    random.seed(SEED)
    one.train()
    alone = _draws(one)
    assert ranks[0]["train"] == ranks[1]["train"] == alone  # one process's draws, on every rank
    assert len({tuple(d) for d in alone}) > 1  # the draws vary from step to step
    assert ranks[0]["eval"] != ranks[1]["eval"]  # evaluation: each rank's own
