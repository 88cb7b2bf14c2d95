"""Pipeline throughput on real text: bertkit's pipelines vs transformers', end to end (text in, results out).

Workloads (the real MiniLM checkpoint with a fresh, seeded task head, the same weights for every
implementation):
- ``sst2``: SST-2 dev sentences -> text-classification (label and score per sentence);
- ``squad``: SQuAD v1.1 dev questions with their contexts -> question-answering (max_length 384, stride 128).

Implementations, each timed over the whole input list (tokenization, model, post-processing):
- ``bertkit-fp32`` / ``bertkit-bf16`` / ``bertkit-int8``: ``bertkit.pipeline(...)`` with batch_size 32
  (length-bucketed, padding dropped), bf16 by autocast, int8 by ``quantize="int8"`` (the built-in calibration;
  quantized once when the pipeline is built, outside the timing; what stays float in bf16 on CPUs with bf16
  instructions, its default there);
- ``transformers-pipeline``: ``transformers.pipeline(...)`` with its default settings (batch_size 1). transformers
  5 removed its question-answering pipeline, so for ``squad`` this row is transformers' model run one window
  at a time in input order (what that pipeline did by default), ``transformers-batch1``;
- ``transformers-sorted``: transformers' model on length-sorted batches of 32 padded per batch, what a
  careful user writes by hand (QA: windows from the fast tokenizer's overflow, best span per question).

    python bench/bench_pipeline.py --model models/minilm [--limit 32] [--workloads sst2,squad] [--impls ...]

Prints one JSON line per (workload, implementation), with its speed against transformers-sorted and against
bertkit-fp32 (the latter always runs: it is the reference for agreement).

``--first-pass MULTIPLE`` times something else: bertkit's feature-extraction pipeline in bf16 over the SST-2
sentences, its first pass against repeats, with the unpadded layout's token count rounded up to a multiple of
MULTIPLE (``prepare.BF16_TOKEN_MULTIPLE``; 1: not rounded). Under bf16 oneDNN builds a GEMM kernel for every
new token count and keeps it for the life of the process, so each multiple runs in its own process:

    python bench/bench_pipeline.py --first-pass 64 --limit 1024
    python bench/bench_pipeline.py --first-pass 1 --limit 1024
"""

from __future__ import annotations

import argparse
import csv
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import transformers

import bertkit
from bertkit import BertTokenizer
from bertkit.heads import BertForQuestionAnswering, BertForSequenceClassification
from bertkit.inference import prepare

REPO = Path(__file__).resolve().parents[1]
BATCH = 32
# SQuAD windows on both sides: bertkit's pipeline would otherwise cut at the model's 512 positions (2,048 windows of
# the first 2,048 questions, against transformers' 2,071 of at most 384), unequal work
QA_MAX_LENGTH = 384


def sst2_sentences(data: Path, n: int | None) -> list[str]:
    with open(data / "glue/SST-2/dev.tsv", encoding="utf-8") as f:
        return [r["sentence"] for r in csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)][:n]


def squad_items(data: Path, n: int | None) -> list[dict[str, str]]:
    squad = json.loads((data / "squad/dev-v1.1.json").read_text(encoding="utf-8"))
    items = [{"question": qa["question"], "context": para["context"]} for art in squad["data"]
             for para in art["paragraphs"] for qa in para["qas"]]
    return items[:n]


def head_checkpoint(model_dir: Path, head: type, out: Path) -> Path:
    """MiniLM plus a fresh head (seed 0), saved where both libraries load it."""
    torch.manual_seed(0)
    model = head.from_pretrained(model_dir, **({"num_labels": 2} if head is BertForSequenceClassification else {}))
    model.save_pretrained(out)
    tok = BertTokenizer.from_pretrained(model_dir)
    tok.save_pretrained(out)
    return out


@torch.inference_mode()
def hf_sorted_classify(model, tok, texts: list[str]) -> list[int]:
    order = sorted(range(len(texts)), key=lambda i: len(tok(texts[i])["input_ids"]))
    labels = [0] * len(texts)
    for a in range(0, len(order), BATCH):
        idx = order[a:a + BATCH]
        enc = tok([texts[i] for i in idx], padding=True, truncation=True, max_length=512, return_tensors="pt")
        pred = model(**enc).logits.softmax(-1).argmax(-1).tolist()
        for i, p in zip(idx, pred):
            labels[i] = p
    return labels


@torch.inference_mode()
def hf_qa(model, tok, items: list[dict[str, str]], batch: int = BATCH, by_length: bool = True,
          max_answer_length: int = 30) -> list[str]:
    enc = tok([x["question"] for x in items], [x["context"] for x in items], truncation="only_second",
              max_length=QA_MAX_LENGTH, stride=128, return_overflowing_tokens=True, return_offsets_mapping=True)
    n = len(enc["input_ids"])
    order = sorted(range(n), key=lambda i: len(enc["input_ids"][i])) if by_length else list(range(n))
    best: dict[int, tuple[float, str]] = {}
    for a in range(0, n, batch):
        idx = order[a:a + batch]
        padded = tok.pad({k: [enc[k][i] for i in idx] for k in ("input_ids", "token_type_ids", "attention_mask")},
                         return_tensors="pt")
        out = model(**padded)
        for row, i in enumerate(idx):
            ex = enc["overflow_to_sample_mapping"][i]
            seq_ids = enc.sequence_ids(i)
            offsets = enc["offset_mapping"][i]
            s_log, e_log = out.start_logits[row].numpy(), out.end_logits[row].numpy()
            ctx = [j for j, s in enumerate(seq_ids) if s == 1]
            starts = sorted(ctx, key=lambda j: -s_log[j])[:20]
            ends = sorted(ctx, key=lambda j: -e_log[j])[:20]
            for s in starts:
                for e in ends:
                    if s <= e < s + max_answer_length:
                        score = float(s_log[s] + e_log[e])
                        if ex not in best or score > best[ex][0]:
                            best[ex] = (score, items[ex]["context"][offsets[s][0]:offsets[e][1]])
    return [best.get(i, (0.0, ""))[1] for i in range(len(items))]


def timed(fn, *args):
    t0 = time.perf_counter()
    result = fn(*args)
    return result, time.perf_counter() - t0


def first_pass(model_dir: Path, texts: list[str], multiple: int) -> dict:
    """The bf16 feature-extraction pipeline's first pass over ``texts`` against two repeats, with the token
    count rounded up to a multiple of ``multiple`` (1: not rounded), and the distinct counts the encoder met."""
    prepare.BF16_TOKEN_MULTIPLE = multiple  # read when prepare_model makes the bf16 pipeline's model
    # Warm-up in fp32 (loading, tokenizer, thread pool) builds no bf16 kernel the timed passes could reuse.
    bertkit.pipeline("feature-extraction", model_dir, batch_size=BATCH, progress=False)(texts[:4])
    pipe = bertkit.pipeline("feature-extraction", model_dir, bf16=True, batch_size=BATCH, progress=False)
    rows: list[int] = []
    hook = pipe.model.encoder.layer[0].register_forward_pre_hook(lambda _, a: rows.append(a[0].shape[0]))
    secs = [timed(pipe, texts)[1] for _ in range(3)]
    hook.remove()
    first, repeat = secs[0], min(secs[1:])
    return {"workload": "sst2", "task": "feature-extraction", "impl": "bertkit-bf16", "token_multiple": multiple,
            "inputs": len(texts), "batches": len(rows) // 3, "distinct_token_counts": len(set(rows)),
            "first_pass_s": round(first, 3), "repeat_s": round(repeat, 3),
            "first_over_repeat": round(first / repeat, 3), "threads": torch.get_num_threads(),
            "cpu_capability": torch.backends.cpu.get_cpu_capability()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, default=REPO / "models" / "minilm")
    p.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data")
    p.add_argument("--limit", type=int, default=None, help="inputs per workload (default: all SST-2 dev, 2048 SQuAD)")
    p.add_argument("--workloads", default="sst2,squad")
    p.add_argument("--impls", default="bertkit-fp32,bertkit-bf16,bertkit-int8,transformers-pipeline,"
                                      "transformers-batch1,transformers-sorted",
                   help="implementations to time (bertkit-fp32 always runs)")
    p.add_argument("--first-pass", type=int, default=None, metavar="MULTIPLE",
                   help="instead: time the bf16 feature-extraction pipeline's first pass over the SST-2 sentences "
                        "against repeats, the token count rounded up to a multiple of MULTIPLE (1: not rounded)")
    args = p.parse_args()
    known = ("bertkit-fp32", "bertkit-bf16", "bertkit-int8", "transformers-pipeline", "transformers-batch1",
             "transformers-sorted")
    unknown = sorted(set(args.impls.split(",")) - set(known))
    if unknown:  # a misspelt name would otherwise drop its rows without a word
        raise SystemExit(f"--impls: unknown {unknown}; give some of {', '.join(known)}")
    if args.first_pass is not None:
        if args.first_pass < 1:
            raise SystemExit(f"--first-pass {args.first_pass}: the multiple must be >= 1 (1: no rounding)")
        print(json.dumps(first_pass(args.model, sst2_sentences(args.data, args.limit), args.first_pass)), flush=True)
        return
    threads = torch.get_num_threads()
    with tempfile.TemporaryDirectory() as tmp:
        for workload in args.workloads.split(","):
            if workload == "sst2":
                inputs = sst2_sentences(args.data, args.limit)
                ckpt = head_checkpoint(args.model, BertForSequenceClassification, Path(tmp) / "clf")
                task, hf_model_cls = "text-classification", transformers.BertForSequenceClassification
            elif workload == "squad":
                inputs = squad_items(args.data, args.limit or 2048)
                ckpt = head_checkpoint(args.model, BertForQuestionAnswering, Path(tmp) / "qa")
                task, hf_model_cls = "question-answering", transformers.BertForQuestionAnswering
            else:
                raise SystemExit(f"unknown workload {workload!r} (sst2, squad)")
            hf_tok = transformers.BertTokenizerFast.from_pretrained(ckpt)
            hf_model = hf_model_cls.from_pretrained(ckpt).eval()
            impls = {"bertkit-fp32", *args.impls.split(",")}
            results = {}
            for name in ("bertkit-fp32", "bertkit-bf16", "bertkit-int8"):
                if name not in impls:
                    continue
                pipe = bertkit.pipeline(task, ckpt, bf16=True if name == "bertkit-bf16" else None, batch_size=BATCH,
                                        progress=False, quantize="int8" if name.endswith("int8") else None,
                                        max_length=QA_MAX_LENGTH if workload == "squad" else None)
                pipe(inputs[:4])  # warm-up
                out, secs = timed(pipe, inputs)
                results[name] = ([o["label"] for o in out] if workload == "sst2" else [o["answer"] for o in out], secs)
            if workload == "sst2":
                if "transformers-pipeline" in impls:
                    hf_pipe = transformers.pipeline(task, model=hf_model, tokenizer=hf_tok, device="cpu")
                    hf_pipe(inputs[:4])
                    out, secs = timed(hf_pipe, inputs)
                    results["transformers-pipeline"] = ([o["label"] for o in out], secs)
                if "transformers-sorted" in impls:
                    labels = [hf_model.config.id2label[i] for i in range(2)]
                    out, secs = timed(hf_sorted_classify, hf_model, hf_tok, inputs)
                    results["transformers-sorted"] = ([labels[i] for i in out], secs)
            else:
                if "transformers-batch1" in impls:
                    results["transformers-batch1"] = timed(hf_qa, hf_model, hf_tok, inputs, 1, False)
                if "transformers-sorted" in impls:
                    results["transformers-sorted"] = timed(hf_qa, hf_model, hf_tok, inputs)
            reference = results["bertkit-fp32"][0]
            fp32_rate = len(inputs) / results["bertkit-fp32"][1]
            sorted_rate = len(inputs) / results["transformers-sorted"][1] if "transformers-sorted" in results else None
            for name, (preds, secs) in results.items():
                agree = float(np.mean([a == b for a, b in zip(preds, reference)]))
                rate = len(inputs) / secs
                print(json.dumps({"workload": workload, "task": task, "impl": name, "inputs": len(inputs),
                                  "seconds": round(secs, 2), "inputs_per_s": round(rate, 1),
                                  "vs_transformers_sorted": round(rate / sorted_rate, 3) if sorted_rate else None,
                                  "vs_bertkit_fp32": round(rate / fp32_rate, 3),
                                  "agreement_with_bertkit_fp32": round(agree, 4), "threads": threads}), flush=True)


if __name__ == "__main__":
    main()
