"""GLUE fine-tuning, bertkit vs transformers, side by side in one process: dev scores and wall time.

Both start from the same weights (bertkit initialises the task head with the seed and saves the whole
model; transformers loads that directory), see the same batches in the same order (bertkit's BatchPlan,
padded per batch: transformers with dynamic padding), and use the same optimiser (AdamW, eps 1e-6, weight
decay 0.01 off for biases and LayerNorm), schedule (10% warm-up, linear decay), clipping (1.0) and
dropout. Dropout masks differ (each implementation draws its own), which is seed-to-seed noise.

    python bench/bench_glue.py --task rte --model models/minilm --lr 1e-4 --seeds 1,2,3 --runs runs/glue/rte.jsonl

Prints one JSON line. With ``--runs FILE`` every finished seed is appended to FILE as it completes (a seed
takes up to half an hour on two CPU cores), seeds already in FILE with the same settings are not run again,
and the summary covers the requested seeds (from FILE or just run): a killed run resumes where it stopped.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import transformers

from bertkit import BertForSequenceClassification, BertTokenizer
from bertkit.data.collate import collate as pad_batch
from bertkit.inference.predict import predict
from bertkit.settings import TrainingSettings
from bertkit.tasks import glue
from bertkit.training.batch_plan import BatchPlan, steps_for_epochs
from bertkit.training.loop import Phase, train
from reference_loop import train_reference

REPO = Path(__file__).resolve().parents[1]


def scores(task, model, features, pad_id, refs):
    logits = np.stack(predict(model, features, pad_id, batch_size=128))
    preds = logits[:, 0] if task.is_regression else logits.argmax(-1)
    return task.metric(preds, refs)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--task", required=True)
    p.add_argument("--model", type=Path, default=REPO / "models" / "minilm")
    p.add_argument("--data-dir", type=Path, default=REPO.parent / "shared" / "data" / "glue")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--epochs", type=float, default=3.0)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--max-seq-length", type=int, default=128)
    p.add_argument("--max-train-examples", type=int, default=None)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--compile", action="store_true", help="bertkit with compiled layers (TrainingSettings.torch_compile)")
    p.add_argument("--runs", type=Path, default=None, help="JSON-lines file of finished seeds (appended, resumed)")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    task = glue.get_task(args.task)
    tok = BertTokenizer.from_pretrained(args.model)
    train_ex = glue.read_glue(task, args.data_dir, "train")[: args.max_train_examples]
    dev_ex = glue.read_glue(task, args.data_dir, "dev")
    train_f = glue.featurize(train_ex, tok, args.max_seq_length, task)
    dev_f = glue.featurize(dev_ex, tok, args.max_seq_length, task)
    refs = np.asarray([f["labels"] for f in dev_f])
    labels = list(task.labels) if task.labels else ["score"]
    problem = "regression" if task.is_regression else "single_label_classification"

    def collate(b):
        return pad_batch(b, tok.pad_token_id)

    settings = {"task": task.name, "model": str(args.model.resolve()), "lr": args.lr, "epochs": args.epochs,
                "batch_size": args.batch_size, "max_seq_length": args.max_seq_length,
                "train_examples": len(train_f), **({"compile": True} if args.compile else {})}
    requested = list(dict.fromkeys(int(s) for s in args.seeds.split(",")))
    found: dict[int, dict] = {}
    if args.runs is not None and args.runs.exists():
        lines = args.runs.read_text().splitlines()
        for line_no, line in enumerate(lines, 1):
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                if line_no == len(lines):  # a kill while appending leaves a torn last line: that seed re-runs
                    print(f"{args.runs}:{line_no}: incomplete last line dropped", file=sys.stderr)
                    args.runs.write_text("".join(x + "\n" for x in lines[:-1]))
                    continue
                raise SystemExit(f"{args.runs}:{line_no}: not a JSON line ({e}); remove or fix that line") from e
            if row.get("settings") == settings and row["seed"] in requested:
                found.setdefault(row["seed"], row)  # one row per seed, the first written
    rows = list(found.values())
    done = set(found)
    for seed in requested:
        if seed in done:
            print(f"{task.name} seed {seed}: already in {args.runs}, skipped", file=sys.stderr, flush=True)
            continue
        torch.manual_seed(seed)
        ours = BertForSequenceClassification.from_pretrained(args.model, id2label=dict(enumerate(labels)),
                                                             problem_type=problem)
        with tempfile.TemporaryDirectory() as init_dir:
            ours.save_pretrained(init_dir)
            theirs = transformers.BertForSequenceClassification.from_pretrained(init_dir)
        plan = BatchPlan(train_f, args.batch_size, collate, shuffle=True, seed=seed)
        steps = steps_for_epochs(plan, args.epochs, 1)
        with tempfile.TemporaryDirectory() as run_dir:
            t0 = time.perf_counter()
            targs = TrainingSettings(output_dir=Path(run_dir), learning_rate=args.lr, seed=seed, torch_compile=args.compile,
                                     progress=False, logging_steps=10**9)
            result = train(ours, [Phase(plan, steps)], targs,
                           evaluate=lambda m: scores(task, m, dev_f, tok.pad_token_id, refs))
            t_ours = time.perf_counter() - t0
        ours_per_epoch = [{k: v for k, v in r.items() if k not in ("split", "step", "epoch")}
                          for r in result.history if r["split"] == "eval"]
        t0 = time.perf_counter()
        ref_per_epoch = train_reference(theirs, plan, steps, args.lr, seed,
                                        on_epoch_end=lambda m: scores(task, m, dev_f, tok.pad_token_id, refs))
        t_ref = time.perf_counter() - t0
        done.add(seed)
        row = {"seed": seed, "settings": settings, "threads": torch.get_num_threads(), "bertkit": ours_per_epoch[-1], "transformers": ref_per_epoch[-1],
               "bertkit_s": t_ours, "transformers_s": t_ref,
               "bertkit_per_epoch": ours_per_epoch, "transformers_per_epoch": ref_per_epoch}
        rows.append(row)
        print(f"{task.name} seed {seed}: bertkit {row['bertkit']} in {t_ours:.0f} s, transformers "
              f"{row['transformers']} in {t_ref:.0f} s", file=sys.stderr, flush=True)
        if args.runs is not None:
            args.runs.parent.mkdir(parents=True, exist_ok=True)
            with args.runs.open("a") as f:
                f.write(json.dumps(row) + "\n")

    metric = next(iter(rows[0]["bertkit"]))

    def agg(key):
        vals = [r[key][metric] for r in rows]
        return {"mean": statistics.fmean(vals), "std": statistics.stdev(vals) if len(vals) > 1 else 0.0,
                "values": vals}

    ours_s, ref_s = sum(r["bertkit_s"] for r in rows), sum(r["transformers_s"] for r in rows)
    print(json.dumps({
        "bench": "glue_finetune", **settings, "metric": metric,
        "bertkit": agg("bertkit"), "transformers": agg("transformers"),
        "bertkit_wall_s": round(ours_s, 1), "transformers_wall_s": round(ref_s, 1),
        "speedup": round(ref_s / ours_s, 3),
        # The acceptance: bertkit's mean within one seed standard deviation of the reference's.
        "mean_diff": agg("bertkit")["mean"] - agg("transformers")["mean"],
        "within_one_ref_std": abs(agg("bertkit")["mean"] - agg("transformers")["mean"]) <= agg("transformers")["std"], "threads": torch.get_num_threads(), "runs": rows,
    }))


if __name__ == "__main__":
    main()
