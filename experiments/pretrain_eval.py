"""Held-out masked-LM and NSP accuracy of pre-trained checkpoints on one or more instance sets.

    python experiments/pretrain_eval.py \
        --model runs/pretraining-budget/pretrain-1h/model/final runs/pretraining-budget/phase512/final \
        --data runs/pretraining-budget/eval-8192-512 runs/pretraining-budget/pretrain-1h/heldout

Prints one JSON line per (model, data) pair: every instance of the set is scored. With ``--baseline
TRAIN_DATA`` it also prints, per set, the masked-LM accuracy of a predictor that reads no context: the input
token where it is not [MASK] (the 10% kept and 10% replaced targets), else the most frequent target of
TRAIN_DATA (counted on every 50th instance). A model below that has learned token frequencies only.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from bertkit.data import PretrainingDataset
from bertkit.heads import BertForMaskedLM, BertForPreTraining
from bertkit.training.pretrain import evaluate_pretraining


def context_free_baseline(train: PretrainingDataset, data: PretrainingDataset, mask_id: int) -> dict:
    targets = np.concatenate([train[i]["labels"] for i in range(0, len(train), 50)])
    counts = np.bincount(targets[targets >= 0])
    top = int(counts.argmax())
    hits = total = 0
    for i in range(len(data)):
        x = data[i]
        at = x["labels"] >= 0
        guess = np.where(x["input_ids"][at] == mask_id, top, x["input_ids"][at])
        hits += int((guess == x["labels"][at]).sum())
        total += int(at.sum())
    return {"mlm_acc": round(hits / total, 4), "most_frequent_target": top, "targets": total, "instances": len(data)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, nargs="*", default=[])
    p.add_argument("--data", type=Path, nargs="+", required=True)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--baseline", type=Path, default=None, metavar="TRAIN_DATA",
                   help="also score the context-free baseline, with targets counted on these instances")
    p.add_argument("--vocab", type=Path, default=None, help="the data's tokenizer (for --baseline's [MASK] id)")
    args = p.parse_args()
    sets = {d: PretrainingDataset(d) for d in args.data}
    if args.baseline is not None:
        if args.vocab is None:
            p.error("--baseline needs --vocab (the tokenizer the instances were made with)")
        from bertkit.tokenization import BertTokenizer

        mask_id = BertTokenizer.from_pretrained(args.vocab).mask_token_id
        train = PretrainingDataset(args.baseline)
        for d, ds in sets.items():
            print(json.dumps({"model": "context-free baseline", "data": str(d),
                              **context_free_baseline(train, ds, mask_id)}), flush=True)
    for m in args.model:
        # a model pre-trained with --no-nsp is a BertForMaskedLM (no pooler, no NSP head): it gets MLM scores only
        arch = (json.loads((m / "config.json").read_text()).get("architectures") or ["BertForPreTraining"])[0]
        model = (BertForMaskedLM if arch == "BertForMaskedLM" else BertForPreTraining).from_pretrained(m).eval()
        for d, ds in sets.items():
            with torch.no_grad():
                scores = evaluate_pretraining(model, ds, batch_size=args.batch_size, pad_id=0, limit=len(ds))
            print(json.dumps({"model": str(m), "data": str(d), **{k: round(v, 4) if isinstance(v, float) else v
                                                                  for k, v in scores.items()}}), flush=True)


if __name__ == "__main__":
    main()
