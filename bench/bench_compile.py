"""Does ``torch.compile`` help bertkit on this machine? Eager against compiled, same process, same batches.

Variants, MiniLM encoder on SST-2 dev sentences (batch 32, max 128, file order), fp32 and bf16 autocast:
- ``eager``: bertkit's default (padding dropped, eager PyTorch);
- ``compiled_layers``: ``BertModel.compile_layers()``, each encoder layer compiled with ``dynamic=True``,
  padding still dropped (the token count N changes every batch, so shapes must be symbolic);
- ``compiled_padded``: the whole model compiled (``dynamic=True``) on the padded layout, the only layout
  without data-dependent shapes;
- ``transformers``: the reference, eager fp32, for scale.
Compile time (the first pass) is reported apart from the steady-state median of ``--repeats`` passes.
Outputs of every compiled variant are checked against eager (max abs difference at real tokens).
``finetune_step``: fine-tuning steps (forward, backward, AdamW) of the MiniLM classifier on SST-2 train
batches, eager against compiled layers (fp32).

    python bench/bench_compile.py --model models/minilm

Prints one JSON line.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
from pathlib import Path

import torch
import transformers

from bench_inference import batches_for, sst2_texts, sst2_train_batches
from bertkit import BertForSequenceClassification, BertModel, BertTokenizer
from bertkit.training.optim import build_optimizer

REPO = Path(__file__).resolve().parents[1]


def passes(fn, batches, repeats, bf16=False):
    """(first pass seconds, median steady pass seconds, outputs of the last pass)."""
    times, outs = [], []
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        for _ in range(repeats + 1):
            outs = []
            t0 = time.perf_counter()
            for b in batches:
                outs.append(fn(b))
            times.append(time.perf_counter() - t0)
    return times[0], statistics.median(times[1:]), outs


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, default=REPO / "models" / "minilm")
    p.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--parts", default="inference,finetune", help="which measurements to run")
    args = p.parse_args()
    parts = set(args.parts.split(","))
    if args.threads:
        torch.set_num_threads(args.threads)

    tok = BertTokenizer.from_pretrained(args.model)
    batches = batches_for(tok, sst2_texts(args.data, None), 32, 128, pairs=False)
    seqs = sum(b["input_ids"].shape[0] for b in batches)
    eager = BertModel.from_pretrained(args.model).eval()
    layers = copy.deepcopy(eager).compile_layers()
    padded = copy.deepcopy(eager)
    padded.layout = "padded"
    padded = torch.compile(padded, dynamic=True)
    theirs = transformers.BertModel.from_pretrained(args.model).eval()

    def hidden(model):
        return lambda b: model(**b).last_hidden_state

    result = {"bench": "torch_compile", "model": str(args.model), "threads": torch.get_num_threads(),
              "torch": torch.__version__, "sequences": seqs}
    for bf16 in (False, True) if "inference" in parts else ():
        _, t_ref, ref_outs = passes(hidden(eager), batches, args.repeats, bf16)
        row = {"eager": {"seq_per_s": round(seqs / t_ref, 1)}}
        for name, model in (("compiled_layers", layers), ("compiled_padded", padded)):
            first, steady, outs = passes(hidden(model), batches, args.repeats, bf16)
            diff = max(float((o - r).float()[b["attention_mask"].bool()].abs().max())
                       for o, r, b in zip(outs, ref_outs, batches))
            row[name] = {"seq_per_s": round(seqs / steady, 1), "first_pass_s": round(first, 1),
                         "speedup_vs_eager": round(t_ref / steady, 3), "max_abs_diff_vs_eager": diff}
        if not bf16:
            _, t_hf, _ = passes(lambda b: theirs(**b).last_hidden_state, batches, args.repeats)
            row["transformers"] = {"seq_per_s": round(seqs / t_hf, 1)}
        result["bf16" if bf16 else "fp32"] = row
    if "finetune" in parts:
        result["finetune_step"] = finetune_steps(args, tok)
    print(json.dumps(result))


def finetune_steps(args, tok, n_batches: int = 20) -> dict:
    """Median seconds per fine-tuning step, eager against compiled layers, same batches and weights."""
    batches = sst2_train_batches(tok, args.data, n_batches)
    out = {}
    for name in ("eager", "compiled_layers"):
        torch.manual_seed(0)
        model = BertForSequenceClassification.from_pretrained(args.model, num_labels=2)
        if name == "compiled_layers":
            model.bert.compile_layers()
        model.train()
        opt = build_optimizer(model, "adamw", 1e-4, 0.01)
        times = []
        for b in batches:
            t0 = time.perf_counter()
            model(**b).loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            times.append(time.perf_counter() - t0)
        out[name] = {"first_step_s": round(times[0], 1), "median_step_s": round(statistics.median(times[2:]), 4)}
    out["speedup"] = round(out["eager"]["median_step_s"] / out["compiled_layers"]["median_step_s"], 3)
    return out


if __name__ == "__main__":
    main()
