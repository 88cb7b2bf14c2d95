"""CoNLL-2003 NER fine-tuning, bertkit vs transformers, side by side in one process: dev/test F1 and wall time.

Both start from the same weights (bertkit initialises the token classifier with the seed and saves the
whole model; transformers' BertForTokenClassification loads that directory), see the same batches in
the same order (bertkit's BatchPlan over the same features, first-WordPiece labels, -100 elsewhere),
and use the same optimiser, schedule (10% warm-up, linear decay), clipping and dropout rate
(``reference_loop.py``: the plain loop every side-by-side bench runs transformers with). Both are
scored by the same code (first-piece predictions -> conlleval). Dropout masks differ (each implementation draws its own), which
is seed-to-seed noise; acceptance is bertkit's dev and test F1 within 0.5 of the reference's.

    python bench/bench_ner.py --model models/minilm --lr 1e-4 --epochs 3
    python bench/bench_ner.py --epochs 1 --max-train-sentences 4000   # a reduced run

Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch
import transformers

from bertkit import BertForTokenClassification, BertTokenizer
from bertkit.data.collate import collate
from bertkit.settings import TrainingSettings, first
from bertkit.tasks import ner
from bertkit.training import token_tasks as tt
from bertkit.training.batch_plan import BatchPlan, steps_for_epochs
from bertkit.training.loop import Phase, train
from reference_loop import train_reference

REPO = Path(__file__).resolve().parents[1]


def scores(model, data, feats, labels, pad_id, split):
    tags = tt.predict_ner(model, data[split], feats[split], labels, pad_id=pad_id, batch_size=64)
    s = tt.ner_scores(data[split], tags)
    return {k: round(s[k], 2) for k in ("f1", "precision", "recall")}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, default=REPO / "models" / "minilm")
    p.add_argument("--data-dir", type=Path, default=REPO.parent / "shared" / "data" / "conll2003")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--epochs", type=float, default=3.0)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--max-seq-length", type=int, default=128)
    p.add_argument("--max-train-sentences", type=int, default=None, help="the first N sentences (reduced runs)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    tok = BertTokenizer.from_pretrained(args.model)
    data = {split: ner.read_conll(args.data_dir / name) for split, name in tt.NER_SPLITS.items()}
    labels = ner.label_list(data["train"])
    train_sentences = first(data["train"], args.max_train_sentences)  # the recipe's subset rule
    feats = {"train": ner.featurize_ner(train_sentences, tok, labels, args.max_seq_length),
             **{split: ner.featurize_ner(data[split], tok, labels, args.max_seq_length) for split in ("dev", "test")}}
    pad = tok.pad_token_id
    plan = BatchPlan(feats["train"], args.batch_size, lambda b: collate(b, pad), shuffle=True, seed=args.seed)
    steps = steps_for_epochs(plan, args.epochs, 1)

    torch.manual_seed(args.seed)  # as finetune_ner: the fresh classifier depends on the seed
    ours = BertForTokenClassification.from_pretrained(args.model, id2label=dict(enumerate(labels)))
    with tempfile.TemporaryDirectory() as init_dir:
        ours.save_pretrained(init_dir)
        theirs = transformers.BertForTokenClassification.from_pretrained(init_dir)
    assert torch.equal(theirs.classifier.weight, ours.classifier.weight)

    result = {"bench": "ner_finetune", "model": str(args.model), "lr": args.lr, "epochs": args.epochs,
              "batch_size": args.batch_size, "max_seq_length": args.max_seq_length, "seed": args.seed,
              "train_sentences": len(train_sentences), "train_features": len(feats["train"]), "steps": steps,
              "threads": torch.get_num_threads(), "transformers_version": transformers.__version__}
    with tempfile.TemporaryDirectory() as run_dir:
        t0 = time.perf_counter()
        train(ours, [Phase(plan, steps)], TrainingSettings(output_dir=Path(run_dir), learning_rate=args.lr,
                                                           seed=args.seed, progress=False, logging_steps=10**9))
        train_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    result["bertkit"] = {"dev": scores(ours, data, feats, labels, pad, "dev"),
                         "test": scores(ours, data, feats, labels, pad, "test"),
                         "train_s": round(train_s, 1), "eval_s": round(time.perf_counter() - t0, 1)}
    del ours

    t0 = time.perf_counter()
    train_reference(theirs, plan, steps, args.lr, args.seed)
    theirs.eval()
    train_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    result["transformers"] = {"dev": scores(theirs, data, feats, labels, pad, "dev"),
                              "test": scores(theirs, data, feats, labels, pad, "test"),
                              "train_s": round(train_s, 1), "eval_s": round(time.perf_counter() - t0, 1)}
    for split in ("dev", "test"):
        result[f"{split}_f1_diff"] = round(result["bertkit"][split]["f1"] - result["transformers"][split]["f1"], 2)
    result["within_0.5"] = all(abs(result[f"{split}_f1_diff"]) <= 0.5 for split in ("dev", "test"))
    result["train_speedup"] = round(result["transformers"]["train_s"] / result["bertkit"]["train_s"], 3)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
