"""The Linear kernels CPU inference can run, at MiniLM's shapes: ATen's ``addmm`` (MKL in fp32, oneDNN in bf16)
against oneDNN's ``_linear_pointwise`` on the weight as stored and reordered once (``_reorder_linear_weight``), and
the feed-forward's first product with its GELU, separate or fused (what ``prepare.PreparedLinear`` runs).

Shapes: q/k/v (384 -> 1152), attention output (384 -> 384), feed-forward (384 -> 1536, 1536 -> 384) at 800, 1,750
and 3,700 rows (batches of 32 SST-2 sentences, question/sentence pairs, SQuAD windows). GFLOP/s, the median of 7
timings of 5 calls each, after two warm-up calls; ``max_diff`` is oneDNN's largest difference from ``addmm``.

    python bench/bench_linear_kernels.py --threads 1 [--dtype fp32|bf16]

Prints one JSON line per shape.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F

SHAPES = ((384, 1152), (384, 384), (384, 1536), (1536, 384))
ROWS = (800, 1750, 3700)


def gflops(fn, flop: int) -> float:
    fn()
    fn()
    times = []
    for _ in range(7):
        t0 = time.perf_counter()
        for _ in range(5):
            fn()
        times.append((time.perf_counter() - t0) / 5)
    return round(flop / statistics.median(times) / 1e9, 1)


def shape_row(m: int, k: int, n: int, dtype: torch.dtype, g: torch.Generator) -> dict:
    linear = torch.ops.mkldnn._linear_pointwise
    x = torch.randn(m, k, generator=g).to(dtype)
    w = (torch.randn(n, k, generator=g) * 0.05).to(dtype)
    b = torch.randn(n, generator=g).to(dtype)
    packed = torch.ops.mkldnn._reorder_linear_weight(w, 1024)
    flop = 2 * m * k * n
    row = {"rows": m, "in": k, "out": n, "addmm": gflops(lambda: F.linear(x, w, b), flop),
           "onednn": gflops(lambda: linear(x, w, b, "none", [], ""), flop),
           "onednn_reordered": gflops(lambda: linear(x, packed, b, "none", [], ""), flop),
           "max_diff": float(f"{(linear(x, packed, b, 'none', [], '') - F.linear(x, w, b)).abs().max():.2g}")}
    if n == 1536:  # the feed-forward's first product, with its GELU
        row["addmm_then_gelu"] = gflops(lambda: F.gelu(F.linear(x, w, b)), flop)
        row["onednn_gelu_fused"] = gflops(lambda: linear(x, packed, b, "gelu", [], "none"), flop)
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    dtype = torch.float32 if args.dtype == "fp32" else torch.bfloat16
    g = torch.Generator().manual_seed(0)
    for m in ROWS:
        for k, n in SHAPES:
            print(json.dumps({"bench": "linear_kernels", "dtype": args.dtype, "threads": args.threads,
                              **shape_row(m, k, n, dtype, g)}), flush=True)


if __name__ == "__main__":
    main()
