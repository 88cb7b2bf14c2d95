"""Encoder inference on real variable-length text, bertkit vs transformers, same process, same batches.

Workloads (the real MiniLM checkpoint):
- SST-2 dev sentences in file order, batch 32, max_length 128, padded to the batch's longest;
- SQuAD v1.1 dev questions + contexts, batch 16, max_length 384 (truncating the context).
Each implementation runs every batch; the median of ``--repeats`` full passes is reported. bertkit runs
in fp32 (padding dropped: its default) and in bf16 autocast, each as ``prepare_model`` makes it for the CPU (what
pipelines and commands run, and ``optimize_for_inference`` returns), and in fp32 as the plain model
``BertModel.from_pretrained`` returns (what a transformers user's direct call runs); transformers in its default fp32
(SDPA).
``padding_fraction`` is the share of padded positions in the batches; 1 / (1 - padding_fraction) bounds
what skipping padding alone can give.

    python bench/bench_inference.py --model models/minilm [--compile]

``--compile`` adds bertkit with ``compile_layers()`` in fp32 (compiled once per workload before timing).

Prints one JSON line.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import time
from pathlib import Path

import torch
import transformers

from bertkit import BertModel, BertTokenizer
from bertkit.data.collate import collate
from bertkit.inference.prepare import prepare_model
from bertkit.tasks import glue
from profiling import top_ops

REPO = Path(__file__).resolve().parents[1]


def sst2_texts(data: Path, n: int | None):
    with open(data / "glue/SST-2/dev.tsv", encoding="utf-8") as f:
        rows = [r["sentence"] for r in csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)]
    return rows[:n]


def sst2_train_batches(tok, data: Path, n_batches: int, batch_size: int = 32) -> list[dict]:
    """The first ``n_batches`` SST-2 training batches with their labels, through bertkit's GLUE reader,
    featurizer and collate (padded per batch), for the training-step benches."""
    task = glue.get_task("sst2")
    features = glue.featurize(glue.read_glue(task, data / "glue", "train")[: batch_size * n_batches], tok, 128, task)
    return [collate(features[i:i + batch_size], tok.pad_token_id) for i in range(0, len(features), batch_size)]


def squad_pairs(data: Path, n: int):
    squad = json.loads((data / "squad/dev-v1.1.json").read_text(encoding="utf-8"))
    pairs = [(qa["question"], para["context"]) for art in squad["data"] for para in art["paragraphs"]
             for qa in para["qas"][:1]]
    return pairs[:n]


def batches_for(tok, items, batch_size, max_length, pairs):
    out = []
    for i in range(0, len(items), batch_size):
        chunk = items[i:i + batch_size]
        if pairs:
            enc = tok([q for q, _ in chunk], text_pair=[c for _, c in chunk], max_length=max_length,
                      truncation="only_second", padding=True, return_tensors="pt")
        else:
            enc = tok(chunk, max_length=max_length, truncation=True, padding=True, return_tensors="pt")
        out.append({k: enc[k] for k in ("input_ids", "token_type_ids", "attention_mask")})
    return out


def time_pass(fn, batches, repeats):
    with torch.inference_mode():
        fn(batches[0])  # warm-up
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            for b in batches:
                fn(b)
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def run(name, ours, plain, theirs, batches, repeats, compiled=None):
    seqs = sum(b["input_ids"].shape[0] for b in batches)
    real = sum(int(b["attention_mask"].sum()) for b in batches)
    total = sum(b["attention_mask"].numel() for b in batches)
    pad = 1 - real / total

    def bk(b):
        return ours[False](**b).tokens

    def bk_bf16(b):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return ours[True](**b).tokens

    def hf(b):
        return theirs(**b).last_hidden_state

    t_hf = time_pass(hf, batches, repeats)
    t_bk = time_pass(bk, batches, repeats)
    t_plain = time_pass(lambda b: plain(**b).last_hidden_state, batches, repeats)
    t_bf16 = time_pass(bk_bf16, batches, repeats)
    extra = {}
    if compiled is not None:
        time_pass(lambda b: compiled(**b).tokens, batches, 1)  # compile for this workload's shapes first
        t_c = time_pass(lambda b: compiled(**b).tokens, batches, repeats)
        extra = {"bertkit_compiled_fp32_seq_per_s": round(seqs / t_c, 1), "speedup_compiled_fp32": round(t_hf / t_c, 3)}
    return {
        "workload": name, "sequences": seqs, "padding_fraction": round(pad, 4),
        "padding_bound": round(1 / (1 - pad), 3),
        "transformers_fp32_seq_per_s": round(seqs / t_hf, 1), "bertkit_fp32_seq_per_s": round(seqs / t_bk, 1),
        "bertkit_bf16_seq_per_s": round(seqs / t_bf16, 1), "bertkit_plain_fp32_seq_per_s": round(seqs / t_plain, 1),
        "speedup_fp32": round(t_hf / t_bk, 3), "inference_copy_vs_plain_fp32": round(t_plain / t_bk, 3), "speedup_bf16_vs_hf_fp32": round(t_hf / t_bf16, 3), **extra,
    }


def profile_pass(fn, batches, bf16, top: int = 10) -> dict[str, float]:
    """Self CPU milliseconds of the top operators over one pass (after a warm-up batch)."""
    from torch.profiler import ProfilerActivity, profile

    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        fn(batches[0])
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for b in batches:
                fn(b)
    return top_ops(prof, top)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, default=REPO / "models" / "minilm")
    p.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--sst2", type=int, default=None, help="number of SST-2 dev sentences (default all 872)")
    p.add_argument("--squad", type=int, default=256, help="number of SQuAD question/context pairs")
    p.add_argument("--compile", action="store_true", help="also time bertkit with compile_layers() (fp32)")
    p.add_argument("--profile", action="store_true",
                   help="also profile one pass over the first 8 batches of each workload (top operators, ms)")
    args = p.parse_args()

    tok = BertTokenizer.from_pretrained(args.model)
    plain = BertModel.from_pretrained(args.model).eval()
    ours = {bf16: prepare_model(plain, bf16=bf16)[0] for bf16 in (False, True)}  # fp32 and bf16 CPU inference
    theirs = transformers.BertModel.from_pretrained(args.model).eval()
    compiled = BertModel.from_pretrained(args.model).eval().compile_layers() if args.compile else None
    results = [
        run("sst2_dev_b32_l128", ours, plain, theirs, batches_for(tok, sst2_texts(args.data, args.sst2), 32, 128, False),
            args.repeats, compiled),
        run("squad_dev_b16_l384", ours, plain, theirs, batches_for(tok, squad_pairs(args.data, args.squad), 16, 384, True),
            args.repeats, compiled),
    ]
    if args.profile:
        for r, batches in zip(results, (
                batches_for(tok, sst2_texts(args.data, args.sst2), 32, 128, False)[:8],
                batches_for(tok, squad_pairs(args.data, args.squad), 16, 384, True)[:8])):
            r["profile_top_ops_ms"] = {
                "transformers_fp32": profile_pass(lambda b: theirs(**b), batches, False),
                "bertkit_fp32": profile_pass(lambda b: ours[False](**b), batches, False),
                "bertkit_bf16": profile_pass(lambda b: ours[True](**b), batches, True)}
    print(json.dumps({"bench": "inference", "model": str(args.model), "threads": torch.get_num_threads(),
                      "torch": torch.__version__, "transformers": transformers.__version__,
                      "repeats": args.repeats, "results": results}))


if __name__ == "__main__":
    main()
