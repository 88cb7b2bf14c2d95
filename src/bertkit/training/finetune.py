"""Fine-tuning recipes on top of the one training loop: GLUE sentence and pair tasks.

The paper's protocol (section 4.1, appendix A.3): batch 32, 3 epochs, Adam with warm-up over the first
10% of steps then linear decay, dropout 0.1, max_seq_length 128; pick the learning rate on dev from
{2e-5, 3e-5, 4e-5, 5e-5}, with several restarts (seeds). ``finetune_glue`` runs that grid and reports the
mean and standard deviation over seeds of each configuration and the best one.

The paper's grid suits BERT-BASE/LARGE. Small models under-train with it (MiniLM at 2e-5 for 3 epochs
stays near the majority class on RTE and CoLA), and Google tuned its BERT miniatures (Turc et al. 2019)
over {3e-5, 5e-5, 1e-4, 3e-4}: ``default_lr_grid`` picks by hidden size, and any grid can be given.
"""

from __future__ import annotations

import json
import logging
import shutil
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from bertkit.config import BertConfig
from bertkit.errors import BertkitError
from bertkit.heads import BertForSequenceClassification
from bertkit.tasks import glue
from bertkit.tokenization import BertTokenizer
from bertkit.training.loop import BatchPlan, Phase, TrainArgs, steps_for_epochs, train

logger = logging.getLogger("bertkit")

PAPER_GRID = (2e-5, 3e-5, 4e-5, 5e-5)
MINIATURE_GRID = (3e-5, 5e-5, 1e-4, 3e-4)


def default_lr_grid(hidden_size: int) -> tuple[float, ...]:
    """The paper's grid for BERT-BASE-sized models and up; Google's miniature grid below 768 wide."""
    return PAPER_GRID if hidden_size >= 768 else MINIATURE_GRID


@torch.no_grad()
def predict(model: nn.Module, features: Sequence[dict], collate: Callable[[list], dict], *, batch_size: int = 64,
            bf16: bool = False, device: str = "cpu", output: Callable[[Any], torch.Tensor] = lambda o: o.logits
            ) -> list[np.ndarray]:
    """Run ``model`` over ``features`` in batches of similar length (little padding); outputs in input order.

    Returns one array per feature (its row of ``output(model_output)``, padding removed for per-token outputs).
    """
    was_training = model.training
    model.eval()
    order = sorted(range(len(features)), key=lambda i: len(features[i]["input_ids"]))
    results: list[np.ndarray | None] = [None] * len(features)
    for start in range(0, len(order), batch_size):
        idx = order[start:start + batch_size]
        batch = {k: v.to(device) for k, v in collate([features[i] for i in idx]).items()
                 if k in ("input_ids", "token_type_ids", "attention_mask")}
        with torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=bf16):
            out = output(model(**batch)).float().cpu().numpy()
        for row, i in zip(out, idx):
            results[i] = row
    model.train(was_training)
    return results  # type: ignore[return-value]


@dataclass
class GlueSettings:
    """One GLUE fine-tuning configuration; ``lrs`` and ``seeds`` make the grid."""

    task: str
    data_dir: Path
    model_dir: Path
    out_dir: Path
    lrs: tuple[float, ...] | None = None  # None: default_lr_grid(hidden_size)
    seeds: tuple[int, ...] = (1,)
    epochs: float = 3.0
    batch_size: int = 32
    max_seq_length: int = 128
    warmup: float = 0.1
    weight_decay: float = 0.01
    bf16: bool = False
    compile: bool = False  # torch.compile the encoder layers (TrainArgs.compile)
    optimizer: str = "adamw"
    grad_accum: int = 1  # batch_size is the micro-batch; an optimiser step sees grad_accum of them
    max_grad_norm: float | None = 1.0
    log_every: int = 50
    device: str = "cpu"
    progress: bool = True
    max_train_examples: int | None = None  # a prefix of train, for quick runs; None = all
    eval_batch_size: int = 128


def _primary(task: glue.GlueTask, scores: dict[str, float]) -> float:
    """The number the grid is selected on: the task's first GLUE metric (MCC, accuracy, F1, Pearson)."""
    return next(iter(scores.values()))


def finetune_glue(s: GlueSettings) -> dict[str, Any]:
    """Fine-tune ``s.model_dir`` on one GLUE task for every (lr, seed); returns the report (also report.json).

    Every run evaluates on dev after each epoch; a run's score is its final-epoch dev score. The best
    configuration is the one with the best mean over seeds, and the best single run of it is saved to
    ``out_dir/best`` in the Hugging Face layout with its label names and tokenizer.
    """
    task = glue.get_task(s.task)
    tokenizer = BertTokenizer.from_pretrained(s.model_dir)
    train_examples = glue.read_glue(task, s.data_dir, "train")
    if s.max_train_examples is not None:
        train_examples = train_examples[: s.max_train_examples]
    dev_examples = glue.read_glue(task, s.data_dir, "dev")
    train_features = glue.featurize(train_examples, tokenizer, s.max_seq_length, task)
    dev_features = glue.featurize(dev_examples, tokenizer, s.max_seq_length, task)
    dev_refs = np.asarray([f["labels"] for f in dev_features])
    labels = list(task.labels) if task.labels is not None else ["score"]

    def collate(batch: list) -> dict:
        return glue.collate(batch, tokenizer.pad_token_id)

    def scores_of(model: nn.Module) -> dict[str, float]:
        logits = np.stack(predict(model, dev_features, collate, batch_size=s.eval_batch_size, bf16=s.bf16,
                                  device=s.device))
        preds = logits[:, 0] if task.is_regression else logits.argmax(-1)
        return task.metric(preds, dev_refs)

    hidden_size = BertConfig.from_json_file(Path(s.model_dir) / "config.json").hidden_size
    lrs = tuple(s.lrs) if s.lrs else default_lr_grid(hidden_size)
    s.out_dir.mkdir(parents=True, exist_ok=True)
    runs, best_run_score = [], -float("inf")
    for lr in lrs:
        for seed in s.seeds:
            torch.manual_seed(seed)  # the fresh head's initialisation depends on the seed, as in the paper's restarts
            model = BertForSequenceClassification.from_pretrained(
                s.model_dir, id2label=dict(enumerate(labels)),
                problem_type="regression" if task.is_regression else "single_label_classification")
            result = fit_classifier(
                model, train_features, collate, scores_of, out_dir=s.out_dir / "runs" / f"lr{lr:g}-seed{seed}",
                lr=lr, seed=seed, epochs=s.epochs, batch_size=s.batch_size, warmup=s.warmup,
                weight_decay=s.weight_decay, bf16=s.bf16, device=s.device, progress=s.progress,
                fingerprint={"model": str(s.model_dir), "task": task.name}, compile=s.compile,
                optimizer=s.optimizer, grad_accum=s.grad_accum, max_grad_norm=s.max_grad_norm, log_every=s.log_every)
            per_epoch = [{k: v for k, v in r.items() if k not in ("split",)} for r in result.history
                         if r["split"] == "eval"]
            score = result.last_eval or {}
            runs.append({"lr": lr, "seed": seed, "dev": score, "per_epoch": per_epoch, "steps": result.step})
            logger.info("%s lr=%g seed=%d dev=%s", task.name, lr, seed, score)
            if _primary(task, score) > best_run_score:
                best_run_score = _primary(task, score)
                best_dir = s.out_dir / "best"
                model.save_pretrained(best_dir)
                tokenizer.save_pretrained(best_dir)
                (best_dir / "training_run.json").write_text(json.dumps(runs[-1], indent=2))
    report = summarize_grid(task, runs)
    report.update(task=task.name, model=str(s.model_dir), settings={
        k: (str(v) if isinstance(v, Path) else v) for k, v in vars(replace(s, lrs=lrs)).items()})
    (s.out_dir / "report.json").write_text(json.dumps(report, indent=2))
    return report


def fit_classifier(model: nn.Module, train_features: Sequence[dict], collate: Callable[[list], dict],
                   evaluate: Callable[[nn.Module], dict[str, float]] | None, *, out_dir: Path, lr: float, seed: int,
                   epochs: float, batch_size: int = 32, warmup: float = 0.1, weight_decay: float = 0.01,
                   bf16: bool = False, device: str = "cpu", progress: bool = True,
                   fingerprint: dict | None = None, compile: bool = False, optimizer: str = "adamw",
                   grad_accum: int = 1, max_grad_norm: float | None = 1.0, log_every: int = 50):
    """One fine-tuning run with the paper's recipe on already featurised examples; returns the TrainResult.

    Checkpoints are dropped at the end (fine-tuning runs are short); metrics.jsonl stays in ``out_dir``.
    """
    plan = BatchPlan(train_features, batch_size, collate, shuffle=True, seed=seed)
    shutil.rmtree(out_dir, ignore_errors=True)
    args = TrainArgs(out_dir=out_dir, lr=lr, warmup=warmup, weight_decay=weight_decay, bf16=bf16, seed=seed,
                     compile=compile, device=device, progress=progress, log_every=log_every, keep_checkpoints=1,
                     optimizer=optimizer, grad_accum=grad_accum, max_grad_norm=max_grad_norm)
    result = train(model, [Phase(plan, steps_for_epochs(plan, epochs, grad_accum))], args, evaluate=evaluate,
                   fingerprint=fingerprint)
    shutil.rmtree(out_dir / "checkpoints", ignore_errors=True)
    return result


def summarize_grid(task: glue.GlueTask, runs: list[dict]) -> dict[str, Any]:
    """Mean and standard deviation over seeds per learning rate, and the best learning rate on dev."""
    configs = []
    for lr in sorted({r["lr"] for r in runs}):
        group = [r for r in runs if r["lr"] == lr]
        summary: dict[str, Any] = {"lr": lr, "seeds": [r["seed"] for r in group]}
        for metric in group[0]["dev"]:
            values = [r["dev"][metric] for r in group]
            summary[metric] = {"mean": statistics.fmean(values),
                               "std": statistics.stdev(values) if len(values) > 1 else 0.0, "values": values}
        configs.append(summary)
    first_metric = next(iter(runs[0]["dev"]))
    best = max(configs, key=lambda c: c[first_metric]["mean"])
    return {"metric": first_metric, "best": best, "configs": configs, "runs": runs}


def predict_glue(task_name: str, data_dir: Path, model_dir: Path, out_dir: Path, *, split: str = "test",
                 max_seq_length: int = 128, batch_size: int = 128, bf16: bool = False, device: str = "cpu"
                 ) -> dict[str, Any]:
    """Predict ``split`` with a fine-tuned checkpoint; write the GLUE-submission TSV (and dev scores if labelled)."""
    task = glue.get_task(task_name)
    tokenizer = BertTokenizer.from_pretrained(model_dir)
    model = BertForSequenceClassification.from_pretrained(model_dir).to(device)
    expected = task.num_labels
    if model.config.num_labels != expected:
        raise BertkitError(f"{model_dir} has {model.config.num_labels} outputs but {task.name} needs {expected}; "
                         "is it a checkpoint fine-tuned on this task?")
    examples = glue.read_glue(task, data_dir, split)
    features = glue.featurize(examples, tokenizer, max_seq_length, task)
    logits = np.stack(predict(model, features, lambda b: glue.collate(b, tokenizer.pad_token_id),
                              batch_size=batch_size, bf16=bf16, device=device))
    preds = logits[:, 0] if task.is_regression else logits.argmax(-1)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = glue.write_submission(task, preds.tolist(), [e.id for e in examples], out_dir)
    result: dict[str, Any] = {"task": task.name, "split": split, "examples": len(examples), "file": str(path)}
    if split != "test":
        result["scores"] = task.metric(preds, np.asarray([f["labels"] for f in features]))
    return result
