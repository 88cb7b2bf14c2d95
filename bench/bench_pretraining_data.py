"""Throughput and peak memory of create_pretraining_data on the whole shared corpus (gutenberg + wikipedia).

The creation runs in a child process; wall time and peak resident memory of it and its worker processes
(summed, sampled every 50 ms from /proc) are measured from outside. The instances stay in --output
(default runs/bench-pretraining-data; max_seq_length 128, dupe_factor 1, static masking by default).
The data set for pre-training was made with:

    .venv/bin/python bench/bench_pretraining_data.py --vocab runs/vocab-30522 --output runs/pretrain-data-full
    .venv/bin/python bench/bench_pretraining_data.py --max-files 100 --output /tmp/pd     # a quick look

Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from bench_train_tokenizer import ROOT, corpus_files, run_measured


def create(args: argparse.Namespace, files: list[str]) -> None:
    from bertkit.data import create_pretraining_data
    from bertkit.tokenization import BertTokenizer

    tok = BertTokenizer.from_pretrained(args.vocab or args.model)
    summary = create_pretraining_data(
        files, tok, args.output, max_seq_length=args.max_seq_length, dupe_factor=args.dupe_factor,
        masking=args.masking, whole_word_mask=args.whole_word_mask,
        seed=args.seed, num_workers=args.workers, progress=False, overwrite=True,
    )
    print(json.dumps({"counts": summary.get("counts"), "tokenizer": summary["tokenizer"],
                      "create_seconds": summary["seconds"]}))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", type=Path, default=Path("/work/shared/data/corpus"))
    p.add_argument("--model", default=str(ROOT / "models" / "minilm"), help="tokenizer directory (vocab.txt)")
    p.add_argument("--vocab", default=None, help="tokenizer directory to use instead of --model")
    p.add_argument("--output", type=Path, default=ROOT / "runs" / "bench-pretraining-data")
    p.add_argument("--max-seq-length", type=int, default=128)
    p.add_argument("--dupe-factor", type=int, default=1)
    p.add_argument("--masking", choices=["static", "dynamic"], default="static")
    p.add_argument("--whole-word-mask", action="store_true")
    p.add_argument("--seed", type=int, default=12345)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--max-files", type=int, default=None)
    p.add_argument("--compare-with", type=Path, default=None,
                   help="an earlier output of this bench: the manifests' shard hashes must be equal")
    p.add_argument("--_child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    files = corpus_files(args.corpus, args.max_files)
    if args._child:
        return create(args, files)

    child = [sys.executable, __file__, "--_child"] + [a for a in sys.argv[1:] if a != "--_child"]
    result = run_measured(child)
    counts = result["counts"]
    print(json.dumps({
        "bench": "pretraining_data",
        "files": len(files),
        "corpus_bytes": sum(os.path.getsize(f) for f in files),
        "tokenizer": args.vocab or args.model,
        "vocab_size": result["tokenizer"]["vocab_size"],
        "workers": args.workers,
        "max_seq_length": args.max_seq_length, "dupe_factor": args.dupe_factor, "masking": args.masking,
        "whole_word_mask": args.whole_word_mask, "seed": args.seed,
        "instances": counts["instances"], "tokens": counts["tokens"], "documents": counts["documents"],
        "positive_fraction": round(1 - counts["random_next"] / counts["instances"], 4),
        "masked_fraction": round(counts["masked_positions"] / (counts["tokens"] - 3 * counts["instances"]), 4),
        "create_seconds": round(result["create_seconds"], 2),  # inside create_pretraining_data
        "wall_seconds": result["seconds"],  # the whole child process: start-up, imports, tokenizer loading
        "cpu_seconds": result["cpu_seconds"],  # all processes; with 2 workers ideally ~2x create_seconds
        "instances_per_second": round(counts["instances"] / result["create_seconds"], 1),
        "mb_per_second": round(sum(os.path.getsize(f) for f in files) / 2**20 / result["create_seconds"], 2),
        "peak_rss_mb": result["peak_rss_mb"],
        "output": str(args.output),
        "output_mb": round(sum(f.stat().st_size for f in args.output.iterdir()) / 2**20, 1),
        **({"same_output_as": str(args.compare_with), "same_output": same_output(args.output, args.compare_with)}
           if args.compare_with else {}),
    }))


def same_output(a: Path, b: Path) -> bool:
    """Whether two outputs hold the same instance files, byte for byte."""
    files_a = sorted(p.name for p in a.iterdir() if p.suffix != ".json" and not p.name.startswith("."))
    files_b = sorted(p.name for p in b.iterdir() if p.suffix != ".json" and not p.name.startswith("."))
    return files_a == files_b and all((a / n).read_bytes() == (b / n).read_bytes() for n in files_a)


if __name__ == "__main__":
    main()
