"""Peak memory at equal batch, bertkit vs transformers: inference, fine-tuning and pre-training steps.

CPU PyTorch has no allocator statistics, so each (workload, implementation) runs in its own child process
of this one command: the child builds its model and batches, records its resident set, resets the kernel's
high-water mark (``/proc/self/clear_refs``), runs the workload and reads ``VmHWM``. Two figures:
``peak_mb``, the process's peak resident set during the workload (weights, imports and batches included,
identical on both sides except the model), and ``workload_mb``, that peak minus the resident set before
the workload: activations, gradients, optimiser state and temporaries. (bertkit's resident set before the
workload is ~100 MB higher with MiniLM: its models are built with random initialisation and then loaded,
and glibc keeps the freed heap, which the workload then reuses; so compare ``peak_mb``.) Workloads, all on real data at the same batches in the same order:

- ``inference``: MiniLM encoder on SST-2 dev sentences, batch 32, padded to the batch's longest (fp32);
- ``finetune``: MiniLM sequence classifier, AdamW steps on SST-2 train sentences, batch 32;
- ``pretrain-mini`` / ``pretrain-base``: BertForPreTraining at BERT-mini / BERT-base shape, AdamW steps on
  real masked instances, batch 32 x 128 (``--data``: create-pretraining-data output).

    python bench/bench_memory.py --model models/minilm --data runs/pretrain-data-full

Prints one JSON line. Linux only (reads /proc).
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import transformers

import bertkit
from bench_inference import batches_for, sst2_texts, sst2_train_batches
from bertkit import BertConfig, BertTokenizer
from bertkit.data.dataset import PretrainingDataset, collate_pretraining
from bertkit.training.optim import build_optimizer

REPO = Path(__file__).resolve().parents[1]
WORKLOADS = ("inference", "finetune", "pretrain-mini", "pretrain-base")


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field} line")


def _build(workload: str, impl: str, args) -> tuple[torch.nn.Module, list[dict], bool]:
    """(model, batches, train?) for one child; the same weights and batches for both implementations."""
    tok = BertTokenizer.from_pretrained(args.model)
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        if workload == "inference":
            batches = batches_for(tok, sst2_texts(args.data_root, None), 32, 128, pairs=False)
            cls = (bertkit.BertModel, transformers.BertModel)
            src = args.model
        elif workload == "finetune":
            batches = sst2_train_batches(tok, args.data_root, args.steps)
            model = bertkit.BertForSequenceClassification.from_pretrained(args.model, num_labels=2)
            model.save_pretrained(tmp)
            cls = (bertkit.BertForSequenceClassification, transformers.BertForSequenceClassification)
            src = tmp
        else:
            ds = PretrainingDataset(args.data)
            batches = [collate_pretraining([ds[j] for j in range(i, i + 32)], tok.pad_token_id)
                       for i in range(0, 32 * args.steps, 32)]
            cfg = BertConfig.preset(workload.split("-")[1], vocab_size=len(tok.vocab))
            bertkit.BertForPreTraining(cfg).save_pretrained(tmp)
            cls = (bertkit.BertForPreTraining, transformers.BertForPreTraining)
            src = tmp
        model = (cls[0] if impl == "bertkit" else cls[1]).from_pretrained(src)
    return model, batches, workload != "inference"


def child(workload: str, impl: str, args) -> dict:
    torch.set_num_threads(args.threads)
    model, batches, training = _build(workload, impl, args)
    gc.collect()
    before = _status_kb("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current resident set
    if training:
        model.train()
        opt = build_optimizer(model, 1e-4, 0.01)
        for b in batches:
            model(**b).loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    else:
        model.eval()
        with torch.inference_mode():
            for b in batches:
                model(**b)
    peak = _status_kb("VmHWM")
    return {"peak_mb": round(peak / 1024, 1), "workload_mb": round((peak - before) / 1024, 1),
            "rss_before_mb": round(before / 1024, 1)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, default=REPO / "models" / "minilm")
    p.add_argument("--data-root", type=Path, default=REPO.parent / "shared" / "data")
    p.add_argument("--data", type=Path, default=REPO / "runs" / "pretrain-data-full",
                   help="pre-training instances (bertkit create-pretraining-data output)")
    p.add_argument("--workloads", default=",".join(WORKLOADS))
    p.add_argument("--steps", type=int, default=3, help="training steps per training workload")
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--child", nargs=2, metavar=("WORKLOAD", "IMPL"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(*args.child, args)))
        return
    result = {"bench": "peak_memory", "threads": args.threads, "steps": args.steps}
    for workload in args.workloads.split(","):
        if workload not in WORKLOADS:
            raise SystemExit(f"unknown workload {workload!r}; choose from {', '.join(WORKLOADS)}")
        row = {}
        for impl in ("bertkit", "transformers"):
            cmd = [sys.executable, __file__, "--child", workload, impl, "--model", str(args.model),
                   "--data-root", str(args.data_root), "--data", str(args.data), "--steps", str(args.steps),
                   "--threads", str(args.threads)]
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode:
                raise SystemExit(f"{workload}/{impl} failed:\n{done.stderr[-3000:]}")
            row[impl] = json.loads(done.stdout.strip().splitlines()[-1])
        for key in ("peak_mb", "workload_mb"):
            row[f"ratio_{key}"] = round(row["bertkit"][key] / max(row["transformers"][key], 1e-9), 3)
        result[workload] = row
        print(f"{workload}: {row}", file=sys.stderr, flush=True)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
