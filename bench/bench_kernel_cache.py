"""What oneDNN's kernel caches cost a server: model calls of random SST-2 texts in one process with the server's
settings (glibc's mmap threshold held, ``OMP_NUM_THREADS`` threads, the server's warm-up), at oneDNN's and ideep's
default capacities (1,024) or at ``--capacity`` entries each (what ``serve_batching.bound_onednn_caches`` sets).

    OMP_NUM_THREADS=2 .venv/bin/python bench/bench_kernel_cache.py --int8 --capacity 16 --calls 100
    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_kernel_cache.py --int8 --max-texts 1 --any-counts

Each call takes 1 to ``--max-texts`` texts at a token count no call met before (what the caches keep: memory), or
with ``--any-counts`` as drawn, repeats included (what a small cache rebuilds: CPU). Its JSON line: the resident
memory the calls kept after ``malloc_trim`` (MiB) and their CPU time (mean, ms). Run the capacities interleaved and
repeated: on a shared machine the load moves CPU figures more than a cache does; ``ONEDNN_VERBOSE=profile_create``
counts the kernels built and oneDNN's time building them, which the load moves less.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SST2 = ROOT.parent / "shared" / "data" / "glue" / "SST-2" / "train.tsv"
sys.path.insert(0, str(ROOT / "bench"))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", type=Path, default=ROOT / "models" / "minilm")
    p.add_argument("--int8", action="store_true", help="as `serve --int8`")
    p.add_argument("--capacity", type=int, default=None, help="both caches' capacity (default: oneDNN's, 1,024)")
    p.add_argument("--calls", type=int, default=300)
    p.add_argument("--max-texts", type=int, default=32, help="each call takes 1 to this many random SST-2 texts")
    p.add_argument("--any-counts", action="store_true",
                   help="token counts as the draw gives them, repeats included (default: each call at a new count)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    if args.capacity is not None:  # before the first oneDNN kernel, as the server sets them
        os.environ.update(ONEDNN_PRIMITIVE_CACHE_CAPACITY=str(args.capacity), LRU_CACHE_CAPACITY=str(args.capacity))
    import torch

    from bench_overload import rss_mb
    from bench_serve import make_classifier
    from bertkit.inference import pipeline
    from bertkit.inference.serve import warm_up
    from bertkit.inference.serve_batching import MALLOC_TRIM, fix_mmap_threshold

    fix_mmap_threshold()
    with open(SST2, encoding="utf-8", newline="") as f:
        sentences = [r["sentence"] for r in csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)]
    with tempfile.TemporaryDirectory() as tmp:
        pipe = pipeline("text-classification", make_classifier(args.model, Path(tmp) / "clf"), batch_size=32,
                        progress=False, **({"quantize": "int8"} if args.int8 else {}))
    warm_up(pipe)
    rng, seen = random.Random(args.seed), set()
    batches = []

    def tokens(texts: list[str]) -> int:
        return sum(len(pipe.tokenizer(t)["input_ids"]) for t in texts)

    for _ in range(100 * args.calls):  # each call at a token count no call met before, unless --any-counts
        texts = rng.sample(sentences, rng.randint(1, args.max_texts))
        count = tokens(texts)
        if args.any_counts or count not in seen:
            seen.add(count)
            batches.append(texts)
        if len(batches) == args.calls:
            break
    else:
        raise SystemExit(f"--calls {args.calls}: {args.max_texts} texts a call reach only {len(seen)} token counts; "
                         "ask for fewer calls, more --max-texts, or --any-counts")
    MALLOC_TRIM()
    before, cpu = rss_mb(os.getpid()), []
    for texts in batches:
        t0 = time.process_time()
        pipe(texts)
        cpu.append(time.process_time() - t0)
    MALLOC_TRIM()
    kept = rss_mb(os.getpid()) - before
    print(json.dumps({"int8": args.int8, "kernel": pipe.precision.kernel and pipe.precision.kernel.name,
                      "capacity": args.capacity or "default", "calls": args.calls,
                      "max_texts": args.max_texts, "token_counts": len(seen), "threads": torch.get_num_threads(),
                      "rss_start_mib": round(before), "rss_kept_mib": round(kept, 1),
                      "cpu_ms_per_call": round(1000 * sum(cpu) / len(cpu), 1), "load": os.getloadavg()[0]}))


if __name__ == "__main__":
    main()
