"""Held-out masked-LM and NSP accuracy of pre-trained checkpoints on one or more instance sets (issue 14).

    python experiments/pretrain_eval.py --model runs/i14/pt-random/final runs/i14/pt-nearby/final \
        --data runs/i14/eval-random runs/i14/eval-nearby

Prints one JSON line per (model, data) pair: every instance of the set is scored.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from bertkit.data import PretrainingDataset
from bertkit.heads import BertForPreTraining
from bertkit.training.pretrain import evaluate_pretraining


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, nargs="+", required=True)
    p.add_argument("--data", type=Path, nargs="+", required=True)
    p.add_argument("--batch-size", type=int, default=64)
    args = p.parse_args()
    sets = {d: PretrainingDataset(d) for d in args.data}
    for m in args.model:
        model = BertForPreTraining.from_pretrained(m).eval()
        for d, ds in sets.items():
            with torch.no_grad():
                scores = evaluate_pretraining(model, ds, batch_size=args.batch_size, pad_id=0, limit=len(ds))
            print(json.dumps({"model": str(m), "data": str(d), **{k: round(v, 4) if isinstance(v, float) else v
                                                                  for k, v in scores.items()}}), flush=True)


if __name__ == "__main__":
    main()
