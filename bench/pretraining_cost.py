"""What BERT's own pre-training would cost: FLOPs of the paper's schedule, and time at a stated throughput.

On paper, from two measured facts and stated assumptions (docs/pretraining-cost.md explains them):
- FLOPs: training = 3x forward (backward is about twice the forward); per layer and token the forward
  does 2 * (4 H^2 + 2 H I) for the projections and feed-forward, plus 4 H T for QK^T and AV; the MLM
  output (transform + 30,522-way decoder) runs only at the masked positions (max_predictions_per_seq),
  as google-research/bert and bertkit do. The same count as ``useful_flops`` in bench/bench_pretrain.py,
  for full-length sequences (the paper's instances fill max_seq_length).
- This CPU: the useful FLOP/s that ``bench/bench_pretrain.py --shape base`` measured (BENCHMARKS.md),
  applied to both phases (optimistic at 512 tokens, where attention's share is larger).
- GPUs: a model-FLOPs utilisation (MFU) against the GPU's dense bf16 peak, and a scaling efficiency
  across GPUs; both stated in the output.

    python bench/pretraining_cost.py                      # BERT-base, the paper's 1M steps x 256 sequences
    python bench/pretraining_cost.py --shape large --mfu 0.35

Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json

from bertkit.config import BertConfig

GPU_BF16_PEAK = {"A100": 312e12, "H100-SXM": 989e12}  # dense bf16 tensor-core peaks, FLOP/s (vendor datasheets)


def train_flops_per_sequence(cfg: BertConfig, seq_len: int, predictions: int) -> float:
    """Training FLOPs of one full-length pre-training sequence (3x the forward pass)."""
    H, I, L, V = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers, cfg.vocab_size
    linear = 2 * (4 * H * H + 2 * H * I) * L * seq_len
    attention = 4 * H * L * seq_len * seq_len
    heads = 2 * (H * H + H * V) * predictions + 2 * H * H  # MLM at masked positions; pooler + NSP once
    return 3 * (linear + attention + heads)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="base", choices=("base", "large"))
    p.add_argument("--steps", type=int, default=1_000_000)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--phase1-fraction", type=float, default=0.9, help="share of steps at 128 tokens (rest at 512)")
    p.add_argument("--cpu-useful-gflops", type=float, default=176.6,
                   help="useful GFLOP/s this CPU reached on BERT-base pre-training (BENCHMARKS.md)")
    p.add_argument("--mfu", type=float, default=0.40, help="GPU model-FLOPs utilisation (share of bf16 peak)")
    p.add_argument("--scaling", type=float, default=0.90, help="multi-GPU scaling efficiency (8 and 64 GPUs)")
    args = p.parse_args()

    cfg = BertConfig.preset(args.shape)
    phases = [(128, 20, round(args.steps * args.phase1_fraction)), (512, 80, 0)]
    phases[1] = (512, 80, args.steps - phases[0][2])
    flops = sum(train_flops_per_sequence(cfg, t, m) * args.batch_size * n for t, m, n in phases)
    days = lambda seconds: round(seconds / 86400, 2)  # noqa: E731
    report = {
        "shape": args.shape, "steps": args.steps, "batch_size": args.batch_size,
        "gflop_per_sequence": {str(t): round(train_flops_per_sequence(cfg, t, m) / 1e9, 1) for t, m, _ in phases},
        "total_flop": f"{flops:.3e}",
        "cpu_days_this_machine": days(flops / (args.cpu_useful_gflops * 1e9)),
        "mfu": args.mfu, "scaling": args.scaling,
        "gpu_hours": {
            f"{gpu}x{n}": round(flops / (peak * args.mfu * n * (1.0 if n == 1 else args.scaling)) / 3600, 2)
            for gpu, peak in GPU_BF16_PEAK.items() for n in (1, 8, 64)
        },
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
