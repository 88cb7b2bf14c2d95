"""Worker functions for tests/test_token_loss_equivalence.py: real, variable-length data trained in one process
or in processes started by launch_helpers.spawn_gloo_workers (torch.multiprocessing needs them importable, so they
live in a module of their own)."""

from __future__ import annotations

import os
from pathlib import Path

import torch

STEPS = 10


def tiny_config(vocab_size: int, num_labels: int = 2):
    from bertkit.config import BertConfig

    # dropout off: the runs compared must differ only in how the global batch is split
    return BertConfig(vocab_size=vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                      intermediate_size=64, max_position_embeddings=128, hidden_dropout_prob=0.0,
                      attention_probs_dropout_prob=0.0, num_labels=num_labels)


def run_training(task: str, data_file: str, out_dir: str, global_batch: int, accum: int, vocab_size: int,
                 num_labels: int = 2) -> dict:
    """``STEPS`` optimiser steps of the tiny model on the examples in ``data_file`` (this process's rank and world
    from the process group, if any); returns the final weights and the logged records."""
    from bertkit.data.dataset import collate_pretraining
    from bertkit.heads import BertForPreTraining, BertForTokenClassification
    from bertkit.settings import TrainingSettings
    from bertkit.settings.training import micro_batch_size
    from bertkit.training.batch_plan import BatchPlan
    from bertkit.training.distributed import current
    from bertkit.training.loop import Phase, train

    info = current()
    examples = torch.load(data_file, weights_only=False)
    torch.manual_seed(0)
    if task == "pretrain":
        model, collate_fn = BertForPreTraining(tiny_config(vocab_size)), collate_pretraining
    else:
        model = BertForTokenClassification(tiny_config(vocab_size, num_labels))
        collate_fn = _NerCollate()
    plan = BatchPlan(examples, micro_batch_size(global_batch, info.world_size, accum), collate_fn, seed=3,
                     rank=info.rank, world_size=info.world_size)
    args = TrainingSettings(output_dir=Path(out_dir), learning_rate=3e-3, batch_size=global_batch,
                            gradient_accumulation_steps=accum, warmup_ratio=0.0, logging_steps=1, progress=False,
                            device="cpu", seed=7)
    result = train(model, [Phase(plan, STEPS)], args)
    return {"weights": {k: v.detach().clone() for k, v in model.state_dict().items()}, "history": result.history}


class _NerCollate:
    """The NER features' model inputs, padded (a class: spawned DataLoader workers pickle it)."""

    def __call__(self, features: list[dict]) -> dict:
        from bertkit.data.collate import collate

        keys = ("input_ids", "token_type_ids", "attention_mask", "labels")
        return collate([{k: f[k] for k in keys} for f in features], 0)


def _worker(rank: int, world: int, port: int, jobs: list[dict], result_file: str) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        out = [run_training(**job) for job in jobs]
        if rank == 0:
            torch.save(out, result_file)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def run_spawned(world: int, result_file: str, jobs: list[dict]) -> list[dict]:
    from distributed_helpers import free_port
    from launch_helpers import spawn_gloo_workers

    spawn_gloo_workers(_worker, lambda: (world, free_port(), jobs, result_file), world)
    return torch.load(result_file, weights_only=False)
