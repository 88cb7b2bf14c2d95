"""PyTorch's CPU attention kernel at key lengths that are and are not a multiple of its vector width.

``scaled_dot_product_attention`` on the CPU (its flash kernel) loops over keys in vectors of
``Vectorized<float>::size()`` (16 with AVX-512, 8 with AVX2); the keys past the last full vector are slow. bertkit
pads each attention rectangle's keys with masked zeros up to the multiple in CPU inference (``prepare.cpu_key_multiple``)
and leaves the queries as they are. This times, for each key length T, the rectangle as it is (T queries over T
keys, the padded rows masked as in a ragged batch) against the same queries over the keys rounded up, in fp32 and
bf16, and checks that both give the same output.

One JSON line per (dtype, T): ``{"dtype", "T", "T_kv", "ms_as_is", "ms_rounded", "speedup", "max_abs_diff"}``, then
a summary line. With ``--end-to-end``, instead MiniLM on ``bench_engines.py``'s three workloads in fp32 and the
default int8, the rounding switched off and on in turn in one process (interleaved rounds, medians): one line per
(workload, precision). Usage: ``python bench/bench_attention_keys.py [--threads 1] [--batch 32] [--heads 12]
[--head-size 32] [--lengths 25,55,100,127,200,383] [--end-to-end]``.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from bertkit.inference.prepare import cpu_key_multiple, for_cpu_inference
from bertkit.padding import round_up_tokens

REPO = Path(__file__).resolve().parents[1]


def _time(fn, reps: int) -> float:
    fn()
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - start) / reps * 1e3


def measure(T: int, multiple: int, dtype: torch.dtype, batch: int, heads: int, head_size: int, rounds: int) -> dict:
    g = torch.Generator().manual_seed(T)
    T_kv = round_up_tokens(T, multiple)
    q, k, v = (torch.randn(batch, heads, T_kv, head_size, generator=g).to(dtype) for _ in range(3))
    lengths = torch.randint(max(1, T // 2), T + 1, (batch,), generator=g)
    lengths[0] = T
    keys = torch.arange(T_kv)[None, :] < lengths[:, None]  # (batch, T_kv): real keys
    k[~keys[:, None, :, None].expand_as(k)] = 0  # what bertkit's rectangles hold past a sequence: zeros
    v[~keys[:, None, :, None].expand_as(v)] = 0
    mask_as_is, mask_rounded = keys[:, None, None, :T], keys[:, None, None, :]
    qs = q[:, :, :T]

    def as_is():
        return F.scaled_dot_product_attention(qs, k[:, :, :T], v[:, :, :T], attn_mask=mask_as_is)

    def rounded():
        return F.scaled_dot_product_attention(qs, k, v, attn_mask=mask_rounded)

    diff = (as_is().float() - rounded().float()).abs().max().item()
    reps = max(3, int(2000 / max(T, 1)))
    a, r = [], []
    for _ in range(rounds):  # interleaved
        a.append(_time(as_is, reps))
        r.append(_time(rounded, reps))
    ms_a, ms_r = statistics.median(a), statistics.median(r)
    return {"dtype": str(dtype).removeprefix("torch."), "T": T, "T_kv": T_kv, "ms_as_is": round(ms_a, 4),
            "ms_rounded": round(ms_r, 4), "speedup": round(ms_a / ms_r, 3), "max_abs_diff": diff}


def end_to_end(model_dir: Path, data: Path, rounds: int, threads: int) -> None:
    """MiniLM fp32 and default int8 on the three workloads, key rounding off and on in turn."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_engines import encode, workloads
    from bench_int8 import sst2
    from bertkit import BertModel, BertTokenizer
    from bertkit.quantization import quantize_int8

    tok = BertTokenizer.from_pretrained(model_dir)
    loads = workloads(tok, data, 320, 64)
    fp32 = BertModel.from_pretrained(model_dir).eval()
    models = {"fp32": fp32, "int8": quantize_int8(fp32, calibration=encode(tok, sst2(data, "train")[:256], 32, 128))}
    models = {k: for_cpu_inference(m, bf16=False) for k, m in models.items()}  # as prepare_model runs them
    times: dict[tuple[str, str, bool], list[float]] = {}
    with torch.inference_mode():
        for r in range(rounds):
            for name, batches in loads.items():
                for precision, model in models.items():
                    for rounded in (False, True):
                        model.key_multiple = cpu_key_multiple() if rounded else 1
                        if r == 0:
                            model(**batches[0])
                        start = time.perf_counter()
                        for b in batches:
                            model(**b)
                        times.setdefault((name, precision, rounded), []).append(time.perf_counter() - start)
    for name, batches in loads.items():
        n = sum(len(b["input_ids"]) for b in batches)
        for precision in models:
            off, on = (statistics.median(times[(name, precision, x)]) for x in (False, True))
            print(json.dumps({"workload": name, "precision": precision, "threads": threads, "sequences": n,
                              "seq_per_s_as_is": round(n / off, 1), "seq_per_s_rounded": round(n / on, 1),
                              "speedup": round(off / on, 3), "rounds": rounds}))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--head-size", type=int, default=32)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--lengths", default="13,25,40,55,100,127,200,300,383")
    p.add_argument("--end-to-end", action="store_true", help="MiniLM on three workloads instead of the kernel alone")
    p.add_argument("--model", type=Path, default=REPO / "models/minilm")
    p.add_argument("--data", type=Path, default=REPO.parent / "shared/data")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    if args.end_to_end:
        end_to_end(args.model, args.data, args.rounds, args.threads)
        return
    with torch.inference_mode():
        multiple = cpu_key_multiple()
        if multiple == 1:
            print(json.dumps({"note": f"no key rounding on this CPU ({torch.backends.cpu.get_cpu_capability()}): "
                                      "nothing to compare"}))
            return
        rows = [measure(int(T), multiple, dtype, args.batch, args.heads, args.head_size, args.rounds)
                for dtype in (torch.float32, torch.bfloat16) for T in args.lengths.split(",")]
    for row in rows:
        print(json.dumps(row))
    print(json.dumps({"summary": "attention keys rounded up", "capability": torch.backends.cpu.get_cpu_capability(),
                      "multiple": multiple, "threads": args.threads, "batch": args.batch, "heads": args.heads,
                      "head_size": args.head_size, "torch": torch.__version__, "machine": platform.machine(),
                      "speedup_range": [min(r["speedup"] for r in rows), max(r["speedup"] for r in rows)],
                      "max_abs_diff": max(r["max_abs_diff"] for r in rows)}))


if __name__ == "__main__":
    main()
