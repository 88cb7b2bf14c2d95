"""Pre-training from scratch, bertkit vs transformers' BertForPreTraining: same instances, config, seed,
initial weights, optimiser and steps, in one process. Reports held-out MLM/NSP accuracy and steps/s.

bertkit runs its real command path (``bertkit.training.pretrain.pretrain``). transformers runs a plain
PyTorch loop over the same ``BatchPlan`` batches with the same AdamW (eps 1e-6, decay off for biases and
LayerNorm), warm-up/decay schedule and clipping, starting from bertkit's initial weights (same seed),
saved and loaded through the Hugging Face layout. Held-out accuracy is measured on the same instances
(WikiText-2 valid) with the same code.

    python bench/bench_pretrain_reference.py --data runs/pretrain-data-full --vocab runs/vocab-30522 \
        --eval-data runs/pretrain-data-wikitext --config mini --steps 300 --out runs/bench-pretrain-ref

Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

import torch
import transformers

from bertkit import BertConfig, BertForPreTraining, BertTokenizer
from bertkit.data.dataset import PretrainingDataset, collate_pretraining
from bertkit.heads import IGNORE_INDEX
from bertkit.settings import PretrainSettings
from bertkit.training.batch_plan import BatchPlan
from bertkit.training.pretrain import pretrain
from reference_loop import train_reference


@torch.no_grad()
def evaluate_hf(model, dataset, pad, limit, batch_size=64):
    model.eval()
    n = min(limit, len(dataset))
    mc = mt = nc = 0
    for s in range(0, n, batch_size):
        b = collate_pretraining([dataset[i] for i in range(s, min(n, s + batch_size))], pad)
        out = model(input_ids=b["input_ids"], token_type_ids=b["token_type_ids"], attention_mask=b["attention_mask"])
        sel = b["labels"] != IGNORE_INDEX
        mc += int((out.prediction_logits[sel].argmax(-1) == b["labels"][sel]).sum())
        mt += int(sel.sum())
        nc += int((out.seq_relationship_logits.argmax(-1) == b["next_sentence_label"]).sum())
    model.train()
    return {"mlm_acc": mc / mt, "nsp_acc": nc / n, "instances": n}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", type=Path, required=True)
    p.add_argument("--eval-data", type=Path, required=True)
    p.add_argument("--vocab", type=Path, required=True)
    p.add_argument("--config", default="mini")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--warmup", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--eval-instances", type=int, default=2000)
    p.add_argument("--out", type=Path, default=Path("runs/bench-pretrain-ref"))
    p.add_argument("--skip-reference", action="store_true")
    args = p.parse_args()

    tok = BertTokenizer.from_pretrained(args.vocab)
    cfg = BertConfig.preset(args.config, vocab_size=len(tok.vocab))
    shutil.rmtree(args.out, ignore_errors=True)
    settings = PretrainSettings(data=args.data, vocab=args.vocab, config_name=cfg, max_steps=args.steps,
                                batch_size=args.batch_size, eval_data=args.eval_data, eval_instances=args.eval_instances,
                                output_dir=args.out / "bertkit", learning_rate=args.lr, warmup_ratio=args.warmup,
                                seed=args.seed, progress=False, logging_steps=max(1, args.steps // 10))
    # The initial weights pretrain() will draw (same seed, same construction), for transformers.
    torch.manual_seed(args.seed)
    BertForPreTraining(cfg).save_pretrained(args.out / "init")

    t0 = time.perf_counter()
    result = pretrain(settings)
    t_ours = time.perf_counter() - t0
    record = {"bench": "pretrain_reference", "config": args.config, "steps": args.steps,
              "batch_size": args.batch_size, "lr": args.lr, "seed": args.seed, "data": str(args.data),
              "eval_data": str(args.eval_data), "threads": torch.get_num_threads(),
              "bertkit": {**{k: result.last_eval[k] for k in ("mlm_acc", "nsp_acc", "mlm_loss")},
                          "wall_s": round(t_ours, 1), "steps_per_s": round(args.steps / t_ours, 4)}}
    if not args.skip_reference:
        model = transformers.BertForPreTraining.from_pretrained(args.out / "init")
        dataset = PretrainingDataset(args.data)
        plan = BatchPlan(dataset, args.batch_size, lambda b: collate_pretraining(b, tok.pad_token_id), seed=args.seed)
        t0 = time.perf_counter()
        train_reference(model, plan, args.steps, args.lr, args.seed, warmup=args.warmup)
        ev = evaluate_hf(model, PretrainingDataset(args.eval_data), tok.pad_token_id, args.eval_instances)
        t_ref = time.perf_counter() - t0  # like bertkit's wall time, includes the held-out evaluation
        record["transformers"] = {**ev, "wall_s": round(t_ref, 1), "steps_per_s": round(args.steps / t_ref, 4)}
        record["speedup"] = round(t_ref / t_ours, 3)
        record["mlm_acc_gap_points"] = round(100 * (record["bertkit"]["mlm_acc"] - ev["mlm_acc"]), 2)
    print(json.dumps(record))


if __name__ == "__main__":
    main()
