"""Scaling on one machine: 1 process x T threads vs N processes x T/N threads (DDP over gloo), same global batch.

Runs ``bertkit pretrain`` (BERT-mini by default) three ways on the same instances, each for ``--steps``
optimiser steps after ``--warmup`` steps, and reads the throughput each run logged to metrics.jsonl:

- ``single``: one process with ``--threads`` threads (OMP_NUM_THREADS), no DataLoader workers;
- ``single_workers``: the same with one DataLoader worker (does collating ahead of the step help?);
- ``ddp``: ``torchrun --nproc_per_node N`` with ``--threads / N`` threads each.

Scaling efficiency = ddp throughput / (N x single throughput at threads / N); the goal is >= 85%.
The all-reduce cost is measured apart: N gloo processes all-reducing a buffer of the model's gradient size.
Instances come from ``--data`` (made by create-pretraining-data) or are made from Python's own docs.

    python bench/bench_distributed.py --steps 60                 # BERT-mini, 2 x 1 thread vs 1 x 2 threads
    python bench/bench_distributed.py --shape small --procs 4 --threads 8 --batch-size 128 --data runs/data128

Prints one JSON line. It occupies every core it is given for minutes: run it on an idle machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]


def make_data(root: Path, seq: int) -> tuple[Path, Path]:
    from bertkit.data.pretraining import create_pretraining_data
    from bertkit.demo import build_corpus
    from bertkit.tokenization import BertTokenizer
    from bertkit.tokenization.trainer import train_wordpiece_vocab

    build_corpus(root / "corpus")
    files = sorted((root / "corpus").glob("*.txt"))
    tok = BertTokenizer(train_wordpiece_vocab(files, vocab_size=8000, num_workers=1, progress=False))
    vocab = root / "vocab"
    tok.save_pretrained(vocab)
    create_pretraining_data(files, tok, root / "data", max_seq_length=seq,
                            dupe_factor=2, num_workers=1, progress=False)
    return root / "data", vocab


def pretrain(args, data: Path, vocab: Path, out: Path, procs: int, threads: int, workers: int) -> dict:
    launcher = ([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(procs)]
                if procs > 1 else [sys.executable])
    steps = args.warmup + args.steps
    cmd = [*launcher, "-m", "bertkit", "pretrain", "--data", str(data), "--vocab", str(vocab), "--config-name",
           args.shape, "--output-dir", str(out), "--max-steps", str(steps), "--batch-size", str(args.batch_size),
           "--logging-steps", "1", "--no-progress", "--device", "cpu", "--dataloader-num-workers", str(workers),
           "--save-total-limit", "1"]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(REPO / "src")}
    t0 = time.perf_counter()
    subprocess.run(cmd, env=env, check=True, capture_output=True)
    wall = time.perf_counter() - t0
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
    rates = [r["seqs_per_s"] for r in records if r["split"] == "train" and r["step"] > args.warmup]
    return {"procs": procs, "threads_per_proc": threads, "dataloader_workers": workers,
            "seqs_per_s": statistics.median(rates), "step_ms": 1000 * args.batch_size / statistics.median(rates),
            "wall_s": round(wall, 1)}


def _allreduce_worker(rank: int, world: int, port: int, numel: int, repeats: int, result: str) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    buf = torch.randn(numel)
    dist.all_reduce(buf)  # warm-up: connections
    times = []
    for _ in range(repeats):
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_reduce(buf)
        times.append(time.perf_counter() - t0)
    if rank == 0:
        Path(result).write_text(json.dumps(statistics.median(times)))
    dist.destroy_process_group()


def allreduce_ms(numel: int, procs: int, repeats: int = 10) -> float:
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        result = str(Path(tmp) / "t.json")
        mp.start_processes(_allreduce_worker, args=(procs, port, numel, repeats, result), nprocs=procs,
                           start_method="spawn")
        return 1000 * json.loads(Path(result).read_text())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="mini")
    p.add_argument("--procs", type=int, default=2)
    p.add_argument("--threads", type=int, default=2, help="threads in all (the single process gets them all)")
    p.add_argument("--batch-size", type=int, default=32, help="global batch")
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--steps", type=int, default=60, help="measured steps")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--data", type=Path, help="instances from create-pretraining-data (default: made here)")
    p.add_argument("--vocab", type=Path)
    args = p.parse_args()
    if args.threads % args.procs:
        p.error("--threads must be a multiple of --procs")

    from bertkit.config import BertConfig
    from bertkit.heads import BertForPreTraining

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        data, vocab = (args.data, args.vocab) if args.data else make_data(root, args.seq)
        each = args.threads // args.procs
        runs = {
            "single": pretrain(args, data, vocab, root / "single", 1, args.threads, 0),
            "single_per_proc_threads": pretrain(args, data, vocab, root / "one", 1, each, 0),
            "single_workers": pretrain(args, data, vocab, root / "workers", 1, args.threads, 1),
            "ddp": pretrain(args, data, vocab, root / "ddp", args.procs, each, 0),
        }
        vocab_size = len((Path(vocab) / "vocab.txt" if Path(vocab).is_dir() else Path(vocab)).read_text().split("\n")) - 1
        numel = sum(t.numel() for t in BertForPreTraining(BertConfig.preset(args.shape, vocab_size=vocab_size))
                    .parameters())
    ddp, single, one = runs["ddp"]["seqs_per_s"], runs["single"]["seqs_per_s"], runs["single_per_proc_threads"]["seqs_per_s"]
    print(json.dumps({
        "bench": "distributed", "shape": args.shape, "global_batch": args.batch_size, "seq": args.seq,
        "procs": args.procs, "threads": args.threads, "runs": runs,
        "ddp_over_single": round(ddp / single, 3),
        "scaling_efficiency": round(ddp / (args.procs * one), 3),
        "dataloader_worker_speedup": round(runs["single_workers"]["seqs_per_s"] / single, 3),
        "allreduce_ms_per_step": round(allreduce_ms(numel, args.procs), 1), "gradient_numel": numel,
        "torch": torch.__version__, "cpus": os.cpu_count(),
    }))


if __name__ == "__main__":
    main()
