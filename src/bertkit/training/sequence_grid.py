"""The (learning rate, seed) grid of sequence-classifier runs, each a fresh head from the same checkpoint; the rate
is picked on dev, with restarts (paper section 4.1 and appendix A.3)."""

from __future__ import annotations

import functools
import logging
import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from bertkit.config import BertConfig
from bertkit.data.collate import collate as pad_batch
from bertkit.errors import NonFiniteError
from bertkit.heads import BertForSequenceClassification
from bertkit.inference.predict import predict
from bertkit.outputs import atomic_write_json
from bertkit.settings import SequenceClassificationSettings
from bertkit.tasks import glue
from bertkit.tokenization import BertTokenizer
from bertkit.training.distributed import current, process_device
from bertkit.training.finetune_run import remove_checkpoints, run_finetuning

logger = logging.getLogger("bertkit")


def fit_sequence_classifier(task: glue.GlueTask, train_examples: Sequence[glue.GlueExample],
                            dev_examples: Sequence[glue.GlueExample], s: SequenceClassificationSettings,
                            tokenizer: BertTokenizer) -> dict[str, Any]:
    """The grid of (rate, seed) runs on ``task``'s examples, each scored on dev after every epoch and selected on
    its final-epoch score (the task's first metric); the best run saved to ``output_dir/best``. A run that
    diverges or whose dev score is not finite is marked ``failed``; one failure does not end the grid. ``s`` and
    ``tokenizer``: ``checkpoint_tokenizer``'s."""
    train_features = glue.featurize(train_examples, tokenizer, s.max_seq_length, task)
    dev_features = glue.featurize(dev_examples, tokenizer, s.max_seq_length, task)
    dev_refs = np.asarray([f["labels"] for f in dev_features])

    collate = functools.partial(pad_batch, pad_token_id=tokenizer.pad_token_id)

    def scores_of(model: nn.Module) -> dict[str, float]:
        logits = np.stack(predict(model, dev_features, tokenizer.pad_token_id, batch_size=s.eval_batch_size, bf16=s.bf16,
                                  device=process_device(s.device)))
        return task.metric(logits[:, 0] if task.is_regression else logits.argmax(-1), dev_refs)

    labels = list(task.labels) if task.labels is not None else ["LABEL_0"]  # transformers' name (run_glue's STS-B)
    start = BertConfig.from_json_file(Path(s.model_name_or_path) / "config.json")
    lrs = s.grid(start.hidden_size)
    # A checkpoint fine-tuned on this task that keeps its labels in another order (a published MNLI model's
    # CONTRADICTION, NEUTRAL, ENTAILMENT): its head's rows move to the task's order, so each keeps its meaning, as
    # run_glue.py keeps the model's order (relabelled in place, every prediction would start on the wrong label).
    reorder = task.label_order(start.id2label or {})
    s.output_dir.mkdir(parents=True, exist_ok=True)
    runs, best_score = [], -float("inf")
    for lr, seed in ((lr, seed) for lr in lrs for seed in s.seed):
        torch.manual_seed(seed)  # the fresh head's initialisation depends on the seed, as in the paper's restarts
        # A checkpoint fine-tuned for another label count (or for regression) gets a fresh head of this task's
        # shape, as the pre-trained encoder's missing head does (both logged by from_pretrained).
        model = BertForSequenceClassification.from_pretrained(
            s.model_name_or_path, id2label=dict(enumerate(labels)), ignore_mismatched_sizes=True,
            problem_type="regression" if task.is_regression else "single_label_classification")
        if reorder is not None:
            with torch.no_grad():
                model.classifier.weight.copy_(model.classifier.weight[reorder])
                model.classifier.bias.copy_(model.classifier.bias[reorder])
        record: dict[str, Any] = {"lr": lr, "seed": seed}
        settings = s.training(output_dir=s.output_dir / "runs" / s.run_name(lr, seed), learning_rate=lr, seed=seed)
        try:
            run = run_finetuning(model, train_features, collate, settings, scores_of,
                                 {"model": str(s.model_name_or_path), "task": task.name}, s.resume)
        except NonFiniteError as e:
            record.update(dev=None, failed=str(e))
        else:
            if not current().is_main:  # under torchrun, rank 0 scores, saves and reports
                continue
            # the final step's evaluation where the loop made one there, else (--eval-strategy no, or an
            # --eval-delay that held back every evaluation) one now: the grid picks its run on dev
            final = bool(run.per_epoch) and run.per_epoch[-1]["step"] == run.result.step
            score = run.result.last_eval if final else scores_of(model)
            record.update(dev=score, per_epoch=run.per_epoch, steps=run.result.step)
            primary = next(iter(score.values()), float("nan"))
            if not math.isfinite(primary):
                record["failed"] = f"dev {next(iter(score), 'score')} is {primary} (not finite): no score"
                remove_checkpoints(settings)  # trained to the end: nothing to resume (a diverged run keeps its own)
        runs.append(record)
        if record.get("failed"):
            logger.warning("%s lr=%g seed=%d failed: %s", task.name, lr, seed, record["failed"])
            continue
        logger.info("%s lr=%g seed=%d dev=%s", task.name, lr, seed, score)
        if primary > best_score:
            best_score = primary
            # Which inputs the model was trained on, for `bertkit predict` to refuse a file of pairs it is not
            # told about and to cut texts where training did (config.json keeps the keys; transformers ignores them).
            model.config.extra["text_pair"] = len(task.text_columns) == 2
            model.config.extra["max_seq_length"] = s.max_seq_length
            model.save_pretrained(s.output_dir / "best")
            tokenizer.save_pretrained(s.output_dir / "best")
            atomic_write_json(s.output_dir / "best" / "training_run.json", record)
        remove_checkpoints(settings)  # what the grid keeps of the run is written: its record, best/ if it is best
    if not current().is_main:
        return {}
    report = summarize_grid(task, runs)
    report.update(task=task.name, model=str(s.model_name_or_path), settings={**s.as_dict(), "learning_rate": lrs})
    atomic_write_json(s.output_dir / "report.json", report)
    return report


def summarize_grid(task: glue.GlueTask, runs: list[dict]) -> dict[str, Any]:
    """Mean and standard deviation over seeds per learning rate, the best learning rate on dev (``best``, by its mean)
    and the best single run (``best_run``, the one saved to ``best/``). Runs marked
    ``failed`` are left out of every mean and listed under ``skipped``; if every run failed, that is an error."""
    ok = [r for r in runs if not r.get("failed")]
    skipped = [{"lr": r["lr"], "seed": r["seed"], "reason": r["failed"]} for r in runs if r.get("failed")]
    if not ok:
        raise NonFiniteError(f"every {task.name} run failed, so there is no score to report: "
                             + "; ".join(f"lr {r['lr']:g} seed {r['seed']}: {r['reason']}" for r in skipped))
    configs = []
    for lr in sorted({r["lr"] for r in ok}):
        group = [r for r in ok if r["lr"] == lr]
        summary: dict[str, Any] = {"lr": lr, "seeds": [r["seed"] for r in group]}
        for metric in group[0]["dev"]:
            values = [r["dev"][metric] for r in group]
            summary[metric] = {"mean": statistics.fmean(values),
                               "std": statistics.stdev(values) if len(values) > 1 else 0.0, "values": values}
        configs.append(summary)
    first_metric = next(iter(ok[0]["dev"]))
    best = max(configs, key=lambda c: c[first_metric]["mean"])
    # The run whose weights `best/` holds: the best single run (the paper keeps the best restart), the first of equals
    # in grid order as fit_sequence_classifier saves it; not always a run of `best`, the rate with the best mean.
    top = max(ok, key=lambda r: r["dev"][first_metric])
    if skipped:
        logger.warning("%d of %d runs skipped (not finite): %s", len(skipped), len(runs), skipped)
    return {"metric": first_metric, "best": best, "best_run": {k: top[k] for k in ("lr", "seed", "dev")},
            "configs": configs, "runs": runs, "skipped": skipped}
