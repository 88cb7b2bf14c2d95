"""The transformers text-classification guide's Trainer script, run on bertkit and on transformers in one process.

The same script (tokenize with truncation, ``DataCollatorWithPadding``, ``compute_metrics`` accuracy,
``Trainer(...).train()`` then ``.evaluate()``) runs once with ``from transformers import ...`` and once with
``from bertkit import ...``, on the same checkpoint (MiniLM with a classification head initialised with the
seed and saved once, so both start from the same weights), the first ``--rows`` SST-2 train rows, one
epoch, batch 32. bertkit runs twice: with transformers' data order (``train_sampling_strategy="random"``,
the default, step-for-step the same batches) and with its length-grouped order (``"group_by_length"``).
``--shape base`` trains BERT-BASE's shape (L=12, H=768, A=12) with seeded weights on ``--model``'s vocabulary
instead of the checkpoint (any BertConfig preset: ``tiny`` with ``--rows 32 --dev-rows 64`` checks in seconds on a
CPU that the script still runs); ``--device cuda`` runs both Trainers on the GPU (``--bf16``: both with ``bf16=True``).

    python bench/bench_trainer.py --model models/minilm --threads 2
    python bench/bench_trainer.py --model VOCAB_DIR --shape base --device cuda --bf16 --data-dir DATA/glue/SST-2

Prints one JSON line: wall seconds of ``train()`` and of ``evaluate()`` per library, dev accuracy, and the
ratios transformers / bertkit.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import functools
import importlib
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]


def read_sst2(path: Path, limit: int | None) -> dict[str, list]:
    with open(path, encoding="utf-8", newline="") as f:
        rows = list(csv.reader(f, delimiter="\t", quotechar=None))[1:]
    rows = rows[:limit] if limit else rows
    return {"sentence": [r[0] for r in rows], "label": [int(r[1]) for r in rows]}


def guide(lib: str, start: Path, train: dict, dev: dict, out: Path, seed: int, strategy: str | None,
          device: str = "cpu", bf16: bool = False) -> dict:
    """The guide's script with ``lib``'s names: the only line that differs between the two runs is the import."""
    m = importlib.import_module(lib)
    tok = m.AutoTokenizer.from_pretrained(start)
    model = m.AutoModelForSequenceClassification.from_pretrained(start, num_labels=2)

    def encode(data: dict) -> list[dict]:
        enc = tok(data["sentence"], truncation=True, max_length=128)
        return [{"input_ids": enc["input_ids"][i], "attention_mask": enc["attention_mask"][i],
                 "token_type_ids": enc["token_type_ids"][i], "labels": data["label"][i]}
                for i in range(len(data["label"]))]

    def compute_metrics(p) -> dict:
        return {"accuracy": float((np.argmax(p.predictions, axis=-1) == p.label_ids).mean())}

    extra = {"train_sampling_strategy": strategy} if strategy else {}
    args = m.TrainingArguments(output_dir=str(out), learning_rate=1e-4, per_device_train_batch_size=32,
                               per_device_eval_batch_size=128, num_train_epochs=1, weight_decay=0.01,
                               warmup_steps=0.1, eval_strategy="no", save_strategy="no", logging_steps=50,
                               seed=seed, report_to="none", disable_tqdm=True, use_cpu=device == "cpu", bf16=bf16,
                               **extra)
    trainer = m.Trainer(model=model, args=args, train_dataset=encode(train), eval_dataset=encode(dev),
                        data_collator=m.DataCollatorWithPadding(tok), processing_class=tok,
                        compute_metrics=compute_metrics)
    if device != "cpu":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    result = trainer.train()
    t1 = time.perf_counter()
    metrics = trainer.evaluate()
    t2 = time.perf_counter()
    memory = {"peak_gb": round(torch.cuda.max_memory_allocated() / 1e9, 2)} if device != "cpu" else {}
    return {"train_s": round(t1 - t0, 2), "eval_s": round(t2 - t1, 2), "training_loss": round(result.training_loss, 5),
            "dev_accuracy": round(metrics["eval_accuracy"], 4), "steps": result.global_step, **memory}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, default=REPO / "models" / "minilm")
    p.add_argument("--data-dir", type=Path, default=REPO.parent / "shared" / "data" / "glue" / "SST-2")
    p.add_argument("--rows", type=int, default=10_000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--only", choices=["bertkit", "transformers"], default=None)
    p.add_argument("--shape", default="checkpoint",
                   help="checkpoint: --model's weights; a BertConfig preset (base: BERT-BASE's shape; tiny: a quick "
                   "check on a CPU): that shape with seeded weights on --model's vocabulary")
    p.add_argument("--dev-rows", type=int, default=None, help="evaluate on the first N dev rows (default: all 872)")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--bf16", action="store_true", help="TrainingArguments(bf16=True) in both runs")
    p.add_argument("--rounds", type=int, default=1, help="interleaved rounds; the figures are the last (warm) one's")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    train = read_sst2(args.data_dir / "train.tsv", args.rows)
    dev = read_sst2(args.data_dir / "dev.tsv", args.dev_rows)

    import bertkit

    with tempfile.TemporaryDirectory() as tmp:
        start = Path(tmp, "start")  # one set of starting weights for both libraries: the head drawn once
        torch.manual_seed(args.seed)
        tokenizer = bertkit.BertTokenizer.from_pretrained(args.model)
        if args.shape != "checkpoint":
            config = bertkit.BertConfig.preset(args.shape, vocab_size=len(tokenizer), num_labels=2)
            bertkit.BertForSequenceClassification(config).save_pretrained(start)
        else:
            bertkit.BertForSequenceClassification.from_pretrained(args.model, num_labels=2).save_pretrained(start)
        tokenizer.save_pretrained(start)
        runs, rounds = {}, {}
        run = functools.partial(guide, start=start, train=train, dev=dev, seed=args.seed, device=args.device,
                                bf16=args.bf16)
        plan = []
        if args.only != "transformers":
            plan += [("bertkit", "bertkit", None), ("bertkit_grouped", "bertkit", "group_by_length")]
        if args.only != "bertkit":
            plan += [("transformers", "transformers", None)]
        with contextlib.redirect_stdout(sys.stderr):  # transformers' Trainer prints its logs: stdout keeps one line
            for r in range(args.rounds):  # interleaved, so that a GPU's warm-up falls on no one library alone
                for name, lib, strategy in plan:
                    runs[name] = run(lib, out=Path(tmp, f"{name}-{r}"), strategy=strategy)
                    rounds.setdefault(name, []).append(runs[name]["train_s"])
    line = {"bench": "trainer_sst2", "model": args.model.name, "shape": args.shape, "rows": len(train["label"]),
            "threads": args.threads, "device": args.device, "bf16": args.bf16, "torch": torch.__version__, **runs}
    if args.rounds > 1:
        line["train_s_rounds"] = rounds
    if "bertkit" in runs and "transformers" in runs:
        ref = runs["transformers"]["train_s"]
        line["speedup_train"] = round(ref / runs["bertkit"]["train_s"], 2)
        line["speedup_train_grouped"] = round(ref / runs["bertkit_grouped"]["train_s"], 2)
        line["speedup_eval"] = round(runs["transformers"]["eval_s"] / runs["bertkit"]["eval_s"], 2)
    json.dump(line, sys.stdout)
    print()


if __name__ == "__main__":
    main()
