"""Pre-training steps, bertkit vs transformers' BertForPreTraining, same process, same real batches.

Real masked instances (masked LM + NSP) are made from a slice of the shared corpus with the uncased
30,522-token vocabulary (``--data`` reuses instances made by ``bertkit create-pretraining-data``). Both
models start from the same weights (bertkit's, saved and loaded by transformers), run the same batches
with AdamW (weight decay off for biases/LayerNorm) and report the median step time over ``--steps`` steps
after warm-up. Useful FLOPs count the encoder on real tokens plus the MLM output only where a token is
predicted (what the paper's implementation computes); the fp32 GEMM peak of this CPU is measured in the
same run, and the achieved useful FLOP/s is given as a share of it.

    python bench/bench_pretrain.py --shape base --batch-size 32 --steps 5
    python bench/bench_pretrain.py --shape mini --batch-size 64 --steps 20
    python bench/bench_pretrain.py --device cuda --shape base --batch-size 256 --bf16 --compile --steps 10

On a GPU (``--device cuda``) each step is what both training loops run: forward under autocast, backward, the
gradient norm clipped at 1.0 (both libraries' default), fused AdamW. ``--compile`` adds each library compiled
(bertkit: ``compile_layers``, what ``--compile`` runs, and ``torch.compile`` of the whole model as
``bertkit_compiled_model``; transformers: ``torch.compile`` of the whole model), and
``--rounds`` interleaves the variants. Beside the useful FLOPs it reports model FLOPs utilisation (MFU): 6 x
parameters x positions (every position of the batch, B x T) plus attention (12 x L x H x T^2 per sequence:
QK^T and AV, forward and backward), over the GPU's dense bf16 peak (``--peak-tflops``; H100 and H200 SXM:
989.4; on a CPU no MFU: bf16 there can pass the fp32 GEMM peak measured in the run). A check on a CPU that the
script still runs (``TORCH_COMPILE_DISABLE=1`` keeps ``--compile``'s variants without minutes of C++ compilation):

    TORCH_COMPILE_DISABLE=1 python bench/bench_pretrain.py --shape tiny --batch-size 8 --steps 1 --warmup 1 --bf16 --compile

Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch
import transformers

from bertkit import BertConfig, BertForPreTraining, BertTokenizer
from bertkit.data.dataset import PretrainingDataset, collate_pretraining
from bertkit.data.pretraining import create_pretraining_data
from bertkit.heads import IGNORE_INDEX
from bertkit.training.optim import build_optimizer
from profiling import top_ops

REPO = Path(__file__).resolve().parents[1]


def gemm_peak(dtype=torch.float32, n: int = 2048, repeats: int = 10) -> float:
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    torch.mm(a, b)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        torch.mm(a, b)
        times.append(time.perf_counter() - t0)
    return 2 * n**3 / min(times)


def useful_flops(cfg: BertConfig, batch: dict) -> float:
    """Training FLOPs (3x forward) on real tokens, with the MLM decoder only at predicted positions."""
    H, I, L, V = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers, cfg.vocab_size
    lengths = batch["attention_mask"].sum(1).double()
    tokens = float(lengths.sum())
    linear = 2 * (4 * H * H + 2 * H * I) * L * tokens
    attention = 4 * H * L * float((lengths**2).sum())  # QK^T and AV over each sequence's own tokens
    predicted = float((batch["labels"] != IGNORE_INDEX).sum())
    heads = 2 * (H * H + H * V) * predicted + 2 * H * H * lengths.numel()
    return 3 * (linear + attention + heads)


def model_flops(model: torch.nn.Module, cfg: BertConfig, batch: dict) -> float:
    """MFU's numerator for one step: 6 x parameters x positions plus attention over every position."""
    B, T = batch["input_ids"].shape
    params = sum(p.numel() for p in model.parameters())
    return 6 * params * B * T + 12 * cfg.num_hidden_layers * cfg.hidden_size * T * T * B


def make_step(model, device: str, bf16: bool):
    """One optimiser step as both training loops run it: autocast forward, backward, clip at 1.0, AdamW."""
    opt = build_optimizer(model, 1e-4, 0.01)
    model.train()

    def step(batch):
        with torch.autocast(device, dtype=torch.bfloat16, enabled=bf16):
            loss = model(**batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def time_steps(steps_by_name: dict, batches, steps: int, warmup: int, rounds: int, device: str) -> dict[str, float]:
    """Median seconds per step of each variant: ``warmup`` steps each, then ``rounds`` interleaved rounds of
    ``steps`` steps (timed as a whole: on a GPU the CPU queues kernels ahead, as in a real run)."""
    times: dict[str, list[float]] = {k: [] for k in steps_by_name}
    for step in steps_by_name.values():
        for i in range(warmup):
            step(batches[i % len(batches)])
    for _ in range(rounds):
        for name, step in steps_by_name.items():
            sync(device)
            t0 = time.perf_counter()
            for i in range(steps):
                step(batches[i % len(batches)])
            sync(device)
            times[name].append((time.perf_counter() - t0) / steps)
    return {k: statistics.median(v) for k, v in times.items()}


def profile_step(model, batch, bf16, top: int = 12) -> dict[str, float]:
    """Self CPU milliseconds of the top operators in one training step (forward, backward, optimiser)."""
    from torch.profiler import ProfilerActivity, profile

    opt = build_optimizer(model, 1e-4, 0.01)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = model(**batch).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return top_ops(prof, top)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="base", help="a BertConfig preset")
    p.add_argument("--model", type=Path, default=REPO / "models" / "minilm", help="for its vocabulary")
    p.add_argument("--corpus", type=Path, default=REPO.parent / "shared" / "data" / "corpus" / "wikipedia")
    p.add_argument("--data", type=Path, default=None, help="existing instances (create-pretraining-data output)")
    p.add_argument("--max-seq-length", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--bf16", action="store_true")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--compile", action="store_true", help="also time both libraries compiled")
    p.add_argument("--rounds", type=int, default=1, help="interleaved rounds of --steps steps per variant")
    p.add_argument("--peak-tflops", type=float, default=989.4,
                   help="the GPU's dense bf16 peak for MFU (H100/H200 SXM: 989.4)")
    p.add_argument("--profile", action="store_true",
                   help="also profile one step of each (torch.profiler) and print the top operators to stderr")
    args = p.parse_args()

    tok = BertTokenizer.from_pretrained(args.model)
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = args.data
        if data_dir is None:
            files = sorted(args.corpus.glob("*.md"))[:20]
            data_dir = Path(tmp) / "data"
            create_pretraining_data(files, tok, data_dir, max_seq_length=args.max_seq_length, dupe_factor=1,
                                    seed=7, num_workers=1, progress=False)
        ds = PretrainingDataset(data_dir)
        n = args.batch_size * (args.steps + args.warmup)
        batches = [collate_pretraining([ds[j] for j in range(i, min(len(ds), i + args.batch_size))], tok.pad_token_id)
                   for i in range(0, min(n, len(ds)), args.batch_size)]
        cfg = BertConfig.preset(args.shape, vocab_size=len(tok.vocab), hidden_dropout_prob=0.1)
        torch.manual_seed(0)
        ours = BertForPreTraining(cfg)
        ours.save_pretrained(Path(tmp) / "init")
        theirs = transformers.BertForPreTraining.from_pretrained(Path(tmp) / "init")

    device = args.device
    batches = [{k: v.to(device) for k, v in b.items()} for b in batches if len(b["input_ids"]) == args.batch_size]
    if not batches:
        raise SystemExit(f"{data_dir} holds {len(ds)} instances, not one batch of --batch-size {args.batch_size}: "
                         "make more (a longer corpus) or give a smaller --batch-size")
    flops = statistics.fmean(useful_flops(cfg, b) for b in batches)
    real = sum(int(b["attention_mask"].sum()) for b in batches) / sum(b["attention_mask"].numel() for b in batches)
    ours.to(device)
    theirs.to(device)
    variants = {"transformers": make_step(theirs, device, args.bf16), "bertkit": make_step(ours, device, args.bf16)}
    if args.compile:
        variants["transformers_compiled"] = make_step(torch.compile(theirs), device, args.bf16)
        compiled = BertForPreTraining(cfg).to(device)
        compiled.load_state_dict(ours.state_dict())
        compiled.bert.compile_layers()
        variants["bertkit_compiled"] = make_step(compiled, device, args.bf16)
        whole = BertForPreTraining(cfg).to(device)  # the whole model compiled, as transformers' variant
        whole.load_state_dict(ours.state_dict())
        variants["bertkit_compiled_model"] = make_step(torch.compile(whole), device, args.bf16)
    t = time_steps(variants, batches, args.steps, args.warmup, args.rounds, device)
    gpu = device == "cuda"
    peak = args.peak_tflops * 1e12 if gpu else gemm_peak()
    mflops = model_flops(ours, cfg, batches[0])
    profiles = {}
    if args.profile and not gpu:
        for name, model in (("bertkit", ours), ("transformers", theirs)):
            profiles[name] = profile_step(model, batches[0], args.bf16)
    print(json.dumps({
        "bench": "pretrain_step", "device": torch.cuda.get_device_name() if gpu else "cpu", "torch": torch.__version__,
        "transformers": transformers.__version__, "shape": args.shape, "batch_size": args.batch_size,
        "max_seq_length": args.max_seq_length, "bf16": args.bf16, "threads": torch.get_num_threads(),
        "padding_fraction": round(1 - real, 4),
        **{f"{k}_seq_per_s": round(args.batch_size / v, 2) for k, v in t.items()},
        "speedup": round(t["transformers"] / t["bertkit"], 3),
        **({"speedup_compiled": round(t["transformers_compiled"] / t["bertkit_compiled"], 3),
            "speedup_compiled_vs_transformers": round(t["transformers"] / t["bertkit_compiled"], 3)}
           if args.compile else {}),
        "useful_gflop_per_step": round(flops / 1e9, 1),
        **{f"{k}_useful_gflops": round(flops / v / 1e9, 1) for k, v in t.items()},
        ("peak_tflops" if gpu else "fp32_gemm_peak_gflops"): round(peak / (1e12 if gpu else 1e9), 1),
        **{f"{k}_share_of_peak": round(flops / v / peak, 3) for k, v in t.items()},
        "model_gflop_per_step": round(mflops / 1e9, 1),
        **({f"{k}_mfu": round(mflops / v / peak, 3) for k, v in t.items()} if gpu else {}),
        **({"profile_top_ops_ms": profiles} if profiles else {}),
    }))


if __name__ == "__main__":
    main()
