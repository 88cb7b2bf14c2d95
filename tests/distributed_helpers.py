"""Worker functions for tests/test_distributed.py: run in processes started by launch_helpers.spawn_gloo_workers,
so they live in an importable module of their own, not in the test file."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import torch


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tiny_config(num_labels: int = 2):
    from bertkit.config import BertConfig

    # dropout off: the runs compared must differ only in how the batch is split
    return BertConfig(vocab_size=97, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                      max_position_embeddings=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                      id2label={i: f"LABEL_{i}" for i in range(num_labels)})


def pretraining_examples(n: int = 96, length: int = 24, masked: int = 4, seed: int = 0) -> list[dict]:
    """Instances of one length with the same number of masked positions each, so the token-mean MLM loss of a
    batch equals the mean of its halves' (what makes 1 x 32 and 2 x 16 the same optimisation problem)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        ids = torch.randint(5, 97, (length,), generator=g)
        labels = torch.full((length,), -100)
        pos = torch.randperm(length - 2, generator=g)[:masked] + 1
        labels[pos] = ids[pos]
        ids[pos] = 4  # [MASK]
        out.append({"input_ids": ids, "token_type_ids": (torch.arange(length) >= length // 2).long(),
                    "attention_mask": torch.ones(length, dtype=torch.long), "labels": labels,
                    "next_sentence_label": torch.randint(0, 2, (), generator=g)})
    return out


def classification_examples(n: int = 96, seed: int = 1) -> list[dict]:
    """Sentences of 6..30 tokens (padding in every batch, so the unpadded path is the one compared)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        length = int(torch.randint(6, 31, (), generator=g))
        ids = torch.randint(5, 97, (length,), generator=g)
        out.append({"input_ids": ids.tolist(), "token_type_ids": [0] * length, "attention_mask": [1] * length,
                    "labels": int(ids[:3].sum()) % 2})
    return out


def stack(batch: list[dict]) -> dict:
    return {k: torch.stack([b[k] for b in batch]) for k in batch[0]}


def pad_collate(batch: list[dict]) -> dict:
    from bertkit.data.collate import collate

    return collate(batch, 0)


def run_training(task: str, out_dir: str, global_batch: int, accum: int, steps: int,
                 extra: dict | None = None, n: int = 96) -> dict:
    """Train the tiny model ``steps`` optimiser steps in this process (rank and world from the process group,
    if any); returns the final weights (rank 0) and the logged records."""
    from bertkit.heads import BertForPreTraining, BertForSequenceClassification
    from bertkit.settings import TrainingSettings
    from bertkit.settings.training import micro_batch_size
    from bertkit.training.batch_plan import BatchPlan
    from bertkit.training.distributed import current
    from bertkit.training.loop import Phase, train

    info = current()
    micro = micro_batch_size(global_batch, info.world_size, accum)
    torch.manual_seed(0)
    if task == "pretrain":
        model, data, collate = BertForPreTraining(tiny_config()), pretraining_examples(n), stack
    else:
        model, data, collate = BertForSequenceClassification(tiny_config()), classification_examples(n), pad_collate
    plan = BatchPlan(data, micro, collate, seed=5, rank=info.rank, world_size=info.world_size)
    settings = dict(output_dir=Path(out_dir), learning_rate=2e-3, batch_size=global_batch,
                    gradient_accumulation_steps=accum, warmup_ratio=0.0, logging_steps=1, progress=False,
                    device="cpu", seed=7)
    args = TrainingSettings(**{**settings, **(extra or {})})
    from bertkit.training.pretrain import mlm_nsp_batch_metrics

    result = train(model, [Phase(plan, steps)], args, batch_metrics=mlm_nsp_batch_metrics if task == "pretrain" else None)
    return {"weights": {k: v.detach().clone() for k, v in model.state_dict().items()}, "history": result.history,
            "train_loss": result.train_loss}


def token_evaluation(out_dir: str) -> dict:
    """bertkit.Trainer's evaluate() and predict() of a tiny token classifier on 11 rows of 6..30 tokens in batches
    of 4 (one process's batches 0-3, 4-7 and 8-10): eval_loss, a mean of per-batch token means, and the predictions,
    each row's padded to its batch's length by the model, then with -100 to the longest."""
    from bertkit import BertForTokenClassification, Trainer, TrainingArguments

    def pad(rows: list[dict]) -> dict:
        n = max(len(r["input_ids"]) for r in rows)
        return {k: torch.tensor([r[k] + [-100 if k == "labels" else 0] * (n - len(r[k])) for r in rows])
                for k in rows[0]}

    rows = [{**r, "labels": [i % 3 for i in r["input_ids"]]} for r in classification_examples(11, seed=2)]
    torch.manual_seed(0)
    model = BertForTokenClassification(tiny_config(3))
    args = TrainingArguments(output_dir=out_dir, per_device_eval_batch_size=4, use_cpu=True, report_to=[])
    trainer = Trainer(model=model, args=args, eval_dataset=rows, data_collator=pad)
    return {"eval_loss": trainer.evaluate()["eval_loss"], "predictions": trainer.predict(rows).predictions}


def _worker(rank: int, world: int, port: int, jobs: list[dict], result_file: str) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        out = [token_evaluation(job["out_dir"]) if job.get("task") == "token_evaluation" else run_training(**job)
               for job in jobs]
        if rank == 0:
            torch.save(out, result_file)
        dist.barrier()  # as bertkit's own launcher does: no rank tears the pairs down under another (SIGABRT)
    finally:
        dist.destroy_process_group()


def run_spawned(world: int, result_file: str, jobs: list[dict]) -> list[dict]:
    """``run_training(**job)`` for each job, in ``world`` processes on gloo (127.0.0.1, a free port): rank 0's
    results. One group of processes runs every job (starting processes is the slow part on a busy machine)."""
    from launch_helpers import spawn_gloo_workers

    spawn_gloo_workers(_worker, lambda: (world, free_port(), jobs, result_file), world)
    return torch.load(result_file, weights_only=False)
