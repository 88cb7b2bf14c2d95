"""The host's side of feeding a GPU, measured without one: bertkit's real tokenizer, collators and loaders with the
model replaced by a no-op, with 0 (in the process), 1, 2 and all of this machine's cores as loader workers,
against what an H100 consumes.

Rows (the data of ``bench_gpu_sentence.py``: SQuAD v1.1 dev, ``--model``'s tokenizer):
- ``embed_train``: (question, paragraph) pairs, batch 64, max_seq_length 256, NO_DUPLICATES, through
  ``SentenceTransformerTrainer``'s own plan (its ``SentenceExamples``, ``SentenceCollator`` and order, built as
  ``Trainer.train`` builds them) and ``epoch_loader``; the consumer does the loop's host work per batch (rows and
  real tokens counted); pairs/s.
- ``rerank_train``: ``CrossEncoderTrainer``'s plan (``CrossEncoderExamples`` + ``collate``), batch 32; the consumer
  also assembles the pair rows (``columns_of`` + ``pair_batch``), which the loss does in the training process
  itself, on the thread that launches the GPU's kernels; rows/s.
- ``encode``: ``SentenceTransformer.encode``'s producer (``tokenize`` over length-sorted batches of 128
  paragraphs, through ``longest_first``), one thread; texts/s.
- ``ce_predict``: ``CrossEncoder.predict``'s producer (``preprocess`` over length-sorted batches of 64 pairs), one
  thread; pairs/s. Both with ``reference``: sentence-transformers' ``preprocess`` of the same batches.
- ``pretrain`` / ``pretrain_dynamic``: ``PretrainingDataset`` over instances ``create_pretraining_data`` makes from
  the first ``--articles`` corpus articles (128 tokens, static masks, then masks drawn on every access), batch 256,
  ``collate_instances`` (what ``bertkit pretrain`` plans); sequences/s.

For each worker count: ``rate`` (sequences per wall second from the batch after the first ``max(1, workers)`` to
the last: the steady state, the workers' start not counted; ``start_s`` is the wait for the first batch),
``per_cpu_s`` (sequences per CPU second of the process making the batches: the workers together, or the process
itself at 0 workers; unlike ``rate``, it hardly depends on what else runs on the machine), ``main_ms`` (CPU
milliseconds per batch of the training process's main thread after the first batch: receiving the batch and the
consumer's work, which a launch-bound GPU step adds to its time) and ``consume_ms`` (the consumer's part of it).
Best of ``--repeats``, each starting with the tokenizer's memos empty (as in a fresh process; they fill over the
run, as in training). A one-thread producer (``encode``, ``ce_predict``) has its thread's ``rate`` and
``per_cpu_s``.

``gpu``: what one H100 80GB consumes, from BENCHMARKS.md (section "Sentence embedders and rerankers on a GPU", and
"Pre-training on a GPU"): embedder training 48 ms of CUDA kernels per step of 64 pairs (1,333 pairs/s if the GPU
were never idle), reranker 40 ms per step of 32 rows (800 rows/s), ``encode`` 1,073.7 texts/s and ``predict``
940.0 pairs/s measured end to end (fp32), pre-training compiled 4,045 seq/s (bf16). ``feed_over_gpu``: the feed
with the worker count bertkit picks on that machine (``host_workers("cuda")`` with 16 cores: 4) over that rate,
extrapolated as 4 x the one-worker rate only where 1 -> 2 workers scaled near-linearly here (1.8-2.2x), else
null with the reason; beside it ``feed_over_gpu_1_worker`` (the one-worker rate: a lower bound where each worker
has a core) and ``feed_over_gpu_per_cpu`` (4 workers x ``per_cpu_s``, capped by the main thread's ``main_ms``).
Loader workers on a GPU also pin memory (a thread of the main process), which a CPU-only machine cannot: not
measured.

    python bench/bench_datapath.py --data ../shared/data --model models/minilm

Prints one JSON line, with the load average before and after (the figures are only as quiet as the machine).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import pickle
import resource
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from unittest import mock

import numpy as np
import torch
from datasets import Dataset

from bench_gpu_sentence import workloads
from bertkit._hardware import host_workers
from bertkit.data.dataset import PretrainingDataset
from bertkit.data.pretraining import create_pretraining_data
from bertkit.inference.runner import longest_first
from bertkit.sentence import (
    CrossEncoder,
    SentenceTransformer,
    SentenceTransformerTrainer,
    SentenceTransformerTrainingArguments,
    losses,
)
from bertkit.sentence.cross_encoder import CrossEncoderTrainer, CrossEncoderTrainingArguments
from bertkit.sentence.cross_encoder import losses as ce_losses
from bertkit.sentence.cross_encoder.data import columns_of
from bertkit.sentence.training_args import BatchSamplers
from bertkit.tokenization import BertTokenizer
from bertkit.training import step_reads
from bertkit.training.batch_plan import BatchPlan, epoch_loader
from bertkit.training.pretrain import collate_instances

REPO = Path(__file__).resolve().parents[1]
ROWS = ("embed_train", "rerank_train", "encode", "ce_predict", "pretrain", "pretrain_dynamic")
H100_CORES = 16
GPU = {  # (rate, unit, source): BENCHMARKS.md, one H100 80GB, BERT-BASE's shape
    "embed_train": (64 / 0.048, "pairs/s", "48 ms of CUDA kernels per step of 64 pairs (torch.profiler)"),
    "rerank_train": (32 / 0.040, "rows/s", "40 ms of CUDA kernels per step of 32 rows (torch.profiler)"),
    "encode": (1073.7, "texts/s", "encode of 2,000 paragraphs, batch 128, fp32, measured"),
    "ce_predict": (940.0, "pairs/s", "CrossEncoder.predict of 2,000 pairs, batch 64, fp32, measured"),
    "pretrain": (4045.0, "seq/s", "pre-training, 128 tokens, batch 256, bf16, compile_layers, measured"),
}
GPU["pretrain_dynamic"] = GPU["pretrain"]


def h100_workers() -> int:
    """The loader workers bertkit picks on a 16-core GPU machine (``host_workers``, asked with that affinity)."""
    with mock.patch("os.sched_getaffinity", return_value=set(range(H100_CORES)), create=True):
        return host_workers("cuda")


def cold(model) -> None:
    """Give ``model`` its tokenizer without the memos it has filled (the copy a spawned loader worker gets): each
    run starts as a fresh process does; the memos fill over the run, as they do in training."""
    model.tokenizer = pickle.loads(pickle.dumps(model.tokenizer))


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def through_loader(plan: BatchPlan, workers: int, consume: Callable[[dict], int]) -> dict:
    """One epoch of ``plan`` through ``epoch_loader`` with ``workers``, each batch handed to ``consume`` (which
    returns its rows). The workers are joined when the epoch ends, so their CPU time is counted; the main thread's
    is counted from the first batch on (the workers' start, a fork each, left out)."""
    own0, kids0 = time.process_time(), children_cpu()
    t0 = time.perf_counter()
    arrivals, main, rows, consuming = [], [], [], 0.0
    for _, batch in epoch_loader(plan, 0, 0, workers, cuda=False):
        c0 = time.thread_time()
        rows.append(consume(batch))
        consuming += time.thread_time() - c0 if arrivals else 0.0
        arrivals.append(time.perf_counter())
        main.append(time.thread_time())
    made = (time.process_time() - own0) if workers == 0 else (children_cpu() - kids0)
    skip, n = max(1, workers), len(rows)
    if n <= skip + 2:
        raise SystemExit(f"{n} batches are too few to time {workers} worker(s): give more data")
    return {"rate": sum(rows[skip:]) / (arrivals[-1] - arrivals[skip - 1]), "per_cpu_s": sum(rows) / made,
            "main_ms": 1e3 * (main[-1] - main[0]) / (n - 1), "consume_ms": 1e3 * consuming / (n - 1),
            "start_s": arrivals[0] - t0, "batches": n, "rows_per_batch": sum(rows) / n}


def in_thread(batches: Iterable, rows_of: Callable[[dict], int]) -> dict:
    """A producer run in this thread (``longest_first``): texts per wall and per CPU second."""
    t0, c0, rows = time.perf_counter(), time.thread_time(), 0
    for batch in batches:
        rows += rows_of(batch)
    wall, cpu = time.perf_counter() - t0, time.thread_time() - c0
    return {"rate": rows / wall, "per_cpu_s": rows / cpu}


def best(runs: list[dict]) -> dict:
    top = max(runs, key=lambda r: r["rate"])
    return {**{k: round(v, 2) if isinstance(v, float) else v for k, v in top.items()},
            "rates": [round(r["rate"], 1) for r in runs]}


def reference(cls: str, batches: list[list], args: argparse.Namespace) -> dict:
    """sentence-transformers' own tokenization of the same batches (``preprocess``, what its ``encode`` and
    ``predict`` run before the model: transformers' fast tokenizer, which may use every core): rows per wall
    second and per CPU second of the process, best of ``--repeats``."""
    import sentence_transformers

    model = getattr(sentence_transformers, cls)(str(args.model), device="cpu", **(
        {"num_labels": 1} if cls == "CrossEncoder" else {}))
    if cls == "SentenceTransformer":
        model.max_seq_length = 256
    runs = []
    for _ in range(args.repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        for batch in batches:
            model.preprocess(batch)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        n = sum(len(b) for b in batches)
        runs.append({"rate": n / wall, "per_cpu_s": n / cpu})
    return {"library": f"sentence-transformers {sentence_transformers.__version__}", **best(runs)}


def loop_consumer(batch: dict) -> int:
    """What the training loop does on the host with a batch before the model (counted for its throughput)."""
    step_reads.real_tokens(batch)
    return step_reads.rows(batch)


def pair_consumer(model: CrossEncoder) -> Callable[[dict], int]:
    def consume(batch: dict) -> int:
        loop_consumer(batch)
        inputs, _ = columns_of(batch["input_ids"], batch["label"], listwise=False)
        model.pair_batch(inputs[0], inputs[1])  # what BinaryCrossEntropyLoss.logits builds in the training process
        return len(inputs[0])
    return consume


def trainer_plan(trainer) -> BatchPlan:
    """The plan ``Trainer.train`` builds (one process)."""
    args = trainer.args
    examples = trainer._examples(trainer.train_dataset, "train_dataset", training=True)
    return BatchPlan(examples, args.per_device_train_batch_size, trainer._collate, seed=args.seed,
                     order=trainer._order(examples))


def summary(name: str, by_workers: dict[str, dict], default: int) -> dict:
    rate, unit, source = GPU[name]
    row = {"unit": unit, "by_workers": by_workers, "gpu": {"rate": round(rate, 1), "source": source}}
    if "1" not in by_workers:  # a one-thread producer
        row["feed_over_gpu"] = round(by_workers["thread"]["rate"] / rate, 2)
        row["feed_over_gpu_per_cpu"] = round(by_workers["thread"]["per_cpu_s"] / rate, 2)
        return row
    one, two = by_workers["1"], by_workers.get("2")
    scaling = two["rate"] / one["rate"] if two else None
    linear = scaling is not None and 1.8 <= scaling <= 2.2  # more than 2x on 2 cores: the load changed mid-run
    # the main thread's own work (receiving each batch, the consumer's) bounds the feed whatever the workers do
    main_cap = one["rows_per_batch"] / (one["main_ms"] / 1e3)
    per_cpu = default * one["per_cpu_s"]
    row.update({
        "scaling_1_to_2": round(scaling, 2) if scaling else None,
        "feed_over_gpu": round(min(default * one["rate"], main_cap) / rate, 2) if linear else None,
        "feed_over_gpu_note": f"{default} workers x the one-worker rate" if linear else (
            "not extrapolated: 2 workers not measured" if scaling is None else
            f"not extrapolated: 1 -> 2 workers scaled {scaling:.2f}x here, not 1.8-2.2x "
            f"({len(os.sched_getaffinity(0))} cores, shared: see load_average)"),
        "feed_over_gpu_1_worker": round(one["rate"] / rate, 2),
        "feed_over_gpu_per_cpu": round(min(per_cpu, main_cap) / rate, 2),
        "main_thread_cap": round(main_cap, 1),
    })
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data")
    p.add_argument("--model", type=Path, default=REPO / "models" / "minilm", help="a BERT directory: its tokenizer")
    p.add_argument("--pairs", type=int, default=8192, help="embedder training pairs")
    p.add_argument("--rerank-rows", type=int, default=16384)
    p.add_argument("--texts", type=int, default=2000, help="paragraphs for encode, pairs for predict")
    p.add_argument("--articles", type=int, default=100, help="corpus articles for the pre-training instances")
    p.add_argument("--dupe-factor", type=int, default=5)
    p.add_argument("--workers", default=None, help="comma-separated worker counts (default: 0,1,2,all cores)")
    p.add_argument("--rows", default=",".join(ROWS), help="comma-separated, of " + ", ".join(ROWS))
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    unknown = sorted(set(args.rows.split(",")) - set(ROWS))
    if unknown:  # a misspelt row was skipped without a word, and the line said "rows": {}
        raise SystemExit(f"--rows: unknown {unknown}; give some of {', '.join(ROWS)}")

    cores = len(os.sched_getaffinity(0))
    counts = ([int(w) for w in args.workers.split(",")] if args.workers
              else list(dict.fromkeys([0, 1, 2, cores])))
    default = h100_workers()
    load_before = os.getloadavg()
    data = workloads(args.data / "squad" / "dev-v1.1.json", args.pairs, args.rerank_rows, args.texts, args.texts)
    wanted = args.rows.split(",")
    out: dict = {"bench": "datapath", "cores": cores, "workers_on_h100": default, "torch": torch.__version__}
    rows: dict = {}

    def per_workers(plan: BatchPlan, consume: Callable[[dict], int], model=None) -> dict:
        by: dict[str, dict] = {}
        for w in counts:
            runs = []
            for _ in range(args.repeats):
                if model is not None:
                    cold(model)
                runs.append(through_loader(plan, w, consume))
            by[str(w)] = best(runs)
        return by

    def one_thread(feed: Callable[[], Iterable], model) -> dict:
        runs = []
        for _ in range(args.repeats):
            cold(model)
            runs.append(in_thread(feed(), lambda b: len(b["rows"])))
        return {"thread": best(runs)}

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        if "embed_train" in wanted:
            model = SentenceTransformer(str(args.model), device="cpu")
            model.max_seq_length = 256
            targs = SentenceTransformerTrainingArguments(tmp / "embed", per_device_train_batch_size=64, seed=42,
                                                         batch_sampler=BatchSamplers.NO_DUPLICATES, use_cpu=True)
            trainer = SentenceTransformerTrainer(model=model, args=targs,
                                                 train_dataset=Dataset.from_list(data["embed_train"]),
                                                 loss=losses.MultipleNegativesRankingLoss(model))
            rows["embed_train"] = summary("embed_train", per_workers(trainer_plan(trainer), loop_consumer, model),
                                          default)
        if "rerank_train" in wanted:
            ce = CrossEncoder(str(args.model), num_labels=1, device="cpu")
            targs = CrossEncoderTrainingArguments(tmp / "rerank", per_device_train_batch_size=32, seed=42,
                                                  use_cpu=True)
            trainer = CrossEncoderTrainer(model=ce, args=targs, train_dataset=Dataset.from_list(data["rerank_train"]),
                                          loss=ce_losses.BinaryCrossEntropyLoss(ce))
            rows["rerank_train"] = summary("rerank_train", per_workers(trainer_plan(trainer),
                                                                        pair_consumer(ce), ce), default)
        if "encode" in wanted:
            model = SentenceTransformer(str(args.model), device="cpu")
            model.max_seq_length = 256
            texts = data["encode"]
            order = np.argsort([-len(t) for t in texts], kind="stable")  # as encode orders them
            batches = [order[s:s + 128] for s in range(0, len(texts), 128)]

            def encode_feed():
                return longest_first(texts, 128, model.tokenize, "cpu")
            rows["encode"] = summary("encode", one_thread(encode_feed, model), default)
            rows["encode"]["reference"] = reference("SentenceTransformer", [[texts[i] for i in b] for b in batches],
                                                    args)
        if "ce_predict" in wanted:
            ce = CrossEncoder(str(args.model), num_labels=1, device="cpu")
            pairs = data["ce_predict"]
            order = np.argsort([-(len(a) + len(b)) for a, b in pairs], kind="stable")  # as predict orders them
            batches = [order[s:s + 64] for s in range(0, len(pairs), 64)]

            def predict_feed():
                return longest_first(pairs, 64, ce.preprocess, "cpu", length=lambda p: len(p[0]) + len(p[1]))
            rows["ce_predict"] = summary("ce_predict", one_thread(predict_feed, ce), default)
            rows["ce_predict"]["reference"] = reference("CrossEncoder", [[pairs[i] for i in b] for b in batches],
                                                        args)
        for name, masking in (("pretrain", "static"), ("pretrain_dynamic", "dynamic")):
            if name not in wanted:
                continue
            tok = BertTokenizer.from_pretrained(args.model)
            files = sorted((args.data / "corpus" / "wikipedia").glob("*.md"))[:args.articles]
            create_pretraining_data(files, tok, tmp / name, max_seq_length=128, dupe_factor=args.dupe_factor,
                                    masking=masking, seed=7, num_workers=1, progress=False)
            dataset = PretrainingDataset(tmp / name)
            collate = functools.partial(collate_instances, pad_id=tok.pad_token_id, nsp=True)  # as pretrain() plans
            rows[name] = summary(name, per_workers(BatchPlan(dataset, 256, collate, seed=42), loop_consumer),
                                 default)
            rows[name]["instances"] = len(dataset)
    out["rows"] = rows
    out["load_average"] = {"before": [round(x, 2) for x in load_before],
                           "after": [round(x, 2) for x in os.getloadavg()]}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
