"""A sentence trainer's evaluator under torchrun: every rank takes rank 0's metrics, as sentence-transformers' ranks
take the metrics its rank 0 alone computes (broadcast). Was: each rank kept its own evaluator's numbers, so an
evaluator whose result depends on the process (one that samples with torch's generator, which the loop seeds with
seed + rank) gave rank 1 other metrics than rank 0 logged, and rank 1 chose its best checkpoint (and, with
load_best_model_at_end, the weights it ends with) and its early stop from them."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist

from distributed_helpers import free_port  # tests/ is on sys.path under pytest


class RankEvaluator:
    """An evaluator whose metric is the rank that runs it (the most process-dependent evaluator there is)."""

    primary_metric = "rank"

    def __call__(self, model, output_path=None, epoch=-1, steps=-1) -> dict[str, float]:
        return {"rank": float(dist.get_rank())}


def worker(rank: int, world: int, port: int, model_dir: str, out_dir: str, result_file: str) -> None:
    from bertkit.sentence import (
        SentenceTransformer,
        SentenceTransformerTrainer,
        SentenceTransformerTrainingArguments,
    )

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        args = SentenceTransformerTrainingArguments(output_dir=out_dir, use_cpu=True, report_to=[], disable_tqdm=True)
        trainer = SentenceTransformerTrainer(model=SentenceTransformer(model_dir), args=args, evaluator=RankEvaluator())
        out = [None] * world
        dist.all_gather_object(out, trainer.evaluate())
        if rank == 0:
            torch.save(out, result_file)
    finally:
        dist.destroy_process_group()


@pytest.mark.slow  # two spawned processes, 15-20 s on two loaded cores: make test-slow
def test_every_rank_takes_rank_0s_evaluator_metrics(tmp_path, tiny_checkpoint, minilm_dir):
    from launch_helpers import spawn_gloo_workers

    model_dir = tiny_checkpoint(tmp_path / "model", tokenizer=minilm_dir)
    result = tmp_path / "metrics.pt"
    spawn_gloo_workers(worker, lambda: (2, free_port(), str(model_dir), str(tmp_path / "out"), str(result)), 2)
    assert [metrics["eval_rank"] for metrics in torch.load(result)] == [0.0, 0.0]  # was [0.0, 1.0]
