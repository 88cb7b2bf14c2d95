"""bertkit against transformers on a CUDA GPU, same process, same weights, same batches: inference at two input
lengths and a fine-tuning step, in fp32, TF32 and bf16.

The model is BERT-BASE's shape (L=12, H=768, A=12) with seeded random weights, saved once by transformers and
loaded by both libraries (speed does not depend on the values; parity is checked on them); the text is real:
- short: SST-2 dev sentences in file order, batch 64, padded to the batch's longest (about 25 tokens);
- windows: SQuAD v1.1 dev question + context, batch 32, cut at 384 tokens (about 170 tokens, many padded);
- train: SST-2 training batches of 32 (max 128 tokens), BertForSequenceClassification, AdamW, loss + backward +
  step; dropout on as in fine-tuning; ``train_windows``: the same step on the SQuAD windows above, batches of
  32 (labels alternate: the step's cost does not depend on them).
Precisions: fp32 (TF32 off: exact fp32 matrix products), tf32 (``torch.backends.cuda.matmul.allow_tf32``), bf16
(autocast). transformers runs with its default attention (SDPA); bertkit in its default layout (``"auto"``) and
forced to each layout (``bertkit_padded``, ``bertkit_unpadded``). Each pass is timed with CUDA synchronised,
after a warm-up pass; the median of ``--repeats`` passes, rounds interleaved. ``max_diff`` is the largest
difference of bertkit's last hidden state from transformers' at real tokens, same precision.

    python bench/bench_gpu.py --vocab DIR [--data ../shared/data] [--repeats 5]
    python bench/bench_gpu.py --device cpu --shape tiny --sequences 64 --train-batches 2 --repeats 1   # smoke

Prints one JSON line per workload and precision. Measures a CUDA device; ``--device cpu`` with a small ``--shape``
and ``--sequences`` only checks, in seconds, that the script still runs (tests/test_gpu_check.py).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

import torch
import transformers

from bench_inference import batches_for, squad_pairs, sst2_texts, sst2_train_batches
from bertkit import BertConfig, BertModel, BertTokenizer
from bertkit.heads import BertForSequenceClassification

REPO = Path(__file__).resolve().parents[1]
PRECISIONS = ("fp32", "tf32", "bf16")
BERTKIT = {"bertkit": "auto", "bertkit_padded": "padded", "bertkit_unpadded": "unpadded"}  # name: layout


def precision(name: str, device: str):
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = name == "tf32"
    return torch.autocast(device, dtype=torch.bfloat16) if name == "bf16" else nullcontext()


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def timed(fn, batches, prec: str, device: str) -> float:
    with precision(prec, device):
        sync(device)
        t0 = time.perf_counter()
        for b in batches:
            fn(b)
        sync(device)
    return time.perf_counter() - t0


def spread(times: dict[str, list[float]]) -> float:
    return round(max((max(v) - min(v)) / statistics.median(v) for v in times.values()), 3)


def inference(checkpoint: str, workloads: dict[str, list[dict]], repeats: int, meta: dict,
              precisions: tuple[str, ...] = PRECISIONS, device: str = "cuda") -> None:
    theirs = transformers.BertModel.from_pretrained(checkpoint).to(device).eval()
    ours = BertModel.from_pretrained(checkpoint).to(device).eval()
    fns = {"transformers": lambda b: theirs(**b).last_hidden_state,
           **{name: (lambda b, lay=lay: ours(**b, layout=lay).tokens) for name, lay in BERTKIT.items()}}
    for name, batches in workloads.items():
        batches = [{k: v.to(device) for k, v in b.items()} for b in batches]
        seqs = sum(b["input_ids"].shape[0] for b in batches)
        real = sum(int(b["attention_mask"].sum()) for b in batches)
        for prec in precisions:
            times: dict[str, list[float]] = {k: [] for k in fns}
            with torch.inference_mode():
                for fn in fns.values():
                    timed(fn, batches, prec, device)  # warm-up
                for _ in range(repeats):
                    for k, fn in fns.items():
                        times[k].append(timed(fn, batches, prec, device))
                b = batches[len(batches) // 2]
                with precision(prec, device):
                    mask = b["attention_mask"].bool()
                    want = theirs(**b).last_hidden_state[mask].float()
                    diff = (ours(**b).last_hidden_state[mask].float() - want).abs().max().item()
                    scale = want.abs().max().item()
            med = {k: statistics.median(v) for k, v in times.items()}
            print(json.dumps({
                **meta, "workload": name, "precision": prec, "sequences": seqs,
                "real_tokens_per_seq": round(real / seqs, 1),
                "transformers_seq_per_s": round(seqs / med["transformers"], 1),
                **{f"{k}_seq_per_s": round(seqs / med[k], 1) for k in BERTKIT},
                "speedup": round(med["transformers"] / med["bertkit"], 3),
                **{f"speedup_{k.removeprefix('bertkit_')}": round(med["transformers"] / med[k], 3)
                   for k in BERTKIT if k != "bertkit"},
                "max_diff": float(f"{diff:.3g}"), "max_abs": float(f"{scale:.3g}"),
                "spread": spread(times)}), flush=True)


def training(checkpoint: str, name: str, batches: list[dict], repeats: int, meta: dict, device: str = "cuda") -> None:
    batches = [{k: v.to(device) for k, v in b.items()} for b in batches]
    n = sum(b["input_ids"].shape[0] for b in batches)
    for prec in PRECISIONS:
        models = {"transformers": transformers.BertForSequenceClassification.from_pretrained(checkpoint)}
        for variant, lay in BERTKIT.items():
            models[variant] = BertForSequenceClassification.from_pretrained(checkpoint)
            models[variant].bert.layout = lay
        steps = {}
        for k, model in models.items():
            model.to(device).train()
            optim = torch.optim.AdamW(model.parameters(), lr=2e-5)

            def step(b, model=model, optim=optim):
                model(**b).loss.backward()
                optim.step()
                optim.zero_grad(set_to_none=True)
            steps[k] = step
        times: dict[str, list[float]] = {k: [] for k in models}
        for fn in steps.values():
            timed(fn, batches, prec, device)  # warm-up: every batch's shapes once (cuBLAS picks kernels per shape)
        for _ in range(repeats):
            for k, fn in steps.items():
                times[k].append(timed(fn, batches, prec, device))
        med = {k: statistics.median(v) for k, v in times.items()}
        print(json.dumps({
            **meta, "workload": name, "precision": prec, "sequences": n,
            "transformers_seq_per_s": round(n / med["transformers"], 1),
            **{f"{k}_seq_per_s": round(n / med[k], 1) for k in BERTKIT},
            "speedup": round(med["transformers"] / med["bertkit"], 3),
            **{f"speedup_{k.removeprefix('bertkit_')}": round(med["transformers"] / med[k], 3)
               for k in BERTKIT if k != "bertkit"},
            "spread": spread(times)}), flush=True)
        del models, steps
        if device == "cuda":
            torch.cuda.empty_cache()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--vocab", type=Path, default=REPO / "models" / "minilm", help="a directory with vocab.txt")
    p.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--train-batches", type=int, default=20)
    p.add_argument("--precisions", default=",".join(PRECISIONS), help="of fp32, tf32, bf16 (inference)")
    p.add_argument("--inference-only", action="store_true")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                   help="cpu: only to check that the script runs (with a small --shape and --sequences)")
    p.add_argument("--shape", default="base", help="a BertConfig preset (base: the figures; tiny: a check on a CPU)")
    p.add_argument("--sequences", type=int, default=None,
                   help="at most this many sequences per inference workload (default: 872 short, 512 windows)")
    args = p.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("bench_gpu needs a CUDA device (torch.cuda.is_available() is False): --device cpu checks "
                         "the script alone")
    tok = BertTokenizer.from_pretrained(args.vocab)
    meta = {"bench": "gpu", "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
            "torch": torch.__version__, "transformers": transformers.__version__, "shape": args.shape}
    workloads = {"short": batches_for(tok, sst2_texts(args.data, args.sequences), 64, 128, pairs=False),
                 "windows": batches_for(tok, squad_pairs(args.data, args.sequences or 512), 32, 384, pairs=True)}
    shape = BertConfig.preset(args.shape)
    with tempfile.TemporaryDirectory() as tmp:
        torch.manual_seed(0)
        transformers.BertForSequenceClassification(transformers.BertConfig(
            vocab_size=len(tok), num_labels=2, hidden_size=shape.hidden_size, num_hidden_layers=shape.num_hidden_layers,
            num_attention_heads=shape.num_attention_heads, intermediate_size=shape.intermediate_size)
        ).save_pretrained(tmp)
        inference(tmp, workloads, args.repeats, meta, tuple(args.precisions.split(",")), args.device)
        if args.inference_only:
            return
        training(tmp, "train", sst2_train_batches(tok, args.data, args.train_batches), args.repeats, meta, args.device)
        windows = workloads["windows"][:args.train_batches // 2]
        training(tmp, "train_windows", [{**b, "labels": torch.arange(len(b["input_ids"])) % 2} for b in windows],
                 args.repeats, meta, args.device)


if __name__ == "__main__":
    main()
