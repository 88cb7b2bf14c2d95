"""Fine-tuning recipes on top of the one training loop: GLUE sentence and pair tasks.

The paper's protocol (section 4.1, appendix A.3): batch 32, 3 epochs, Adam with warm-up over the first
10% of steps then linear decay, dropout 0.1, max_seq_length 128; pick the learning rate on dev from
{2e-5, 3e-5, 4e-5, 5e-5}, with several restarts (seeds). ``finetune_glue`` runs one configuration by
default and any grid of rates and seeds on request, reporting the mean and standard deviation over seeds
of each rate and the best one.

The paper's rates suit BERT-BASE/LARGE. Small models under-train with them (MiniLM at 2e-5 for 3 epochs
stays near the majority class on RTE and CoLA), and Google tuned its BERT miniatures (Turc et al. 2019)
over {3e-5, 5e-5, 1e-4, 3e-4}: the default rate is 1e-4 below 768 wide (``settings.default_lr``).
"""

from __future__ import annotations

import json
import logging
import math
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from bertkit.config import BertConfig
from bertkit.errors import BertkitError, MissingFileError, NonFiniteError
from bertkit.heads import BertForSequenceClassification
from bertkit.inference.prepare import Precision, prepare_model
from bertkit.outputs import atomic_write_json, remove_owned_tree
from bertkit.quantization import load_for_inference
from bertkit.settings import (
    ClassifySettings,
    GlueSettings,
    PredictBenchmarkSettings,
    PredictGlueSettings,
    SequenceClassificationSettings,
    TrainingSettings,
    first,
)
from bertkit.tasks import glue
from bertkit.tokenization import BertTokenizer
from bertkit.training.distributed import current, process_device
from bertkit.training.loop import BatchPlan, Phase, TrainResult, micro_batch_size, steps_for_epochs, train
from bertkit.training.plot import plot_metrics

logger = logging.getLogger("bertkit")

# Sequences per prediction batch in a direct call (the commands pass their settings').
EVAL_BATCH_SIZE = 64

@torch.no_grad()
def predict(model: nn.Module, features: Sequence[dict], collate: Callable[[list], dict], *,
            batch_size: int = EVAL_BATCH_SIZE,
            bf16: bool = False, device: str = "cpu", output: Callable[[Any], torch.Tensor] = lambda o: o.logits
            ) -> list[np.ndarray]:
    """Run ``model`` over ``features`` in batches of similar length (little padding); outputs in input order.

    Returns one array per feature: its row of ``output(model_output)``. Per-token outputs keep the padded
    length of the batch the feature ran in (callers read the positions they need). A NaN or +inf anywhere
    raises ``NonFiniteError`` naming the first bad feature: a diverged model gets no score. (-inf is allowed:
    a head may mask positions with it; the QA head uses the dtype's lowest finite value.)
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
        bad = np.isnan(out) | np.isposinf(out)
        if bad.any():
            first_bad = min(i for row_bad, i in zip(bad.reshape(len(idx), -1).any(1), idx) if row_bad)
            model.train(was_training)
            raise NonFiniteError(f"the model's output for example {first_bad} (0-based, input order) is not finite "
                                 "(NaN or inf): the model has diverged; no predictions or scores were written")
        for row, i in zip(out, idx):
            results[i] = row
    model.train(was_training)
    return results  # type: ignore[return-value]


def for_prediction(model: nn.Module, tokenizer: BertTokenizer, s: PredictBenchmarkSettings
                   ) -> tuple[nn.Module, Precision]:
    """A loaded fine-tuned ``model`` made ready by ``prepare_model`` as pipelines make theirs: on ``s.device`` in
    eval mode and, with --int8, quantized on the built-in sentences or --calibration-file's, cut to
    --max-seq-length; a model that is int8 already (a `bertkit quantize` directory) runs as it is, on the CPU."""
    return prepare_model(model, s.model_name_or_path, device=s.device, bf16=s.bf16,
                         quantize="int8" if s.int8 else None, calibration_file=s.calibration_file,
                         tokenizer=tokenizer, max_length=s.max_seq_length)


def _primary(task: glue.GlueTask, scores: dict[str, float]) -> float:
    """The number the grid is selected on: the task's first GLUE metric (MCC, accuracy, F1, Pearson)."""
    return next(iter(scores.values()))


def finetune_glue(s: GlueSettings) -> dict[str, Any]:
    """Fine-tune ``s.model_name_or_path`` on one GLUE task for every (rate, seed); returns the report (report.json).

    Every run evaluates on dev after each epoch; a run's score is its final-epoch dev score. The report
    gives each rate's mean and standard deviation over seeds and the rate with the best mean; the single
    run with the best dev score (over all rates and seeds) is saved to ``output_dir/best`` in the Hugging
    Face layout with its label names and tokenizer.
    """
    task = glue.get_task(s.task)
    train_examples = first(glue.read_glue(task, s.data_dir, "train"), s.max_train_samples)
    dev_examples = first(glue.read_glue(task, s.data_dir, "dev"), s.max_eval_samples)
    return fit_sequence_classifier(task, train_examples, dev_examples, s)


def fit_sequence_classifier(task: glue.GlueTask, train_examples: Sequence[glue.GlueExample],
                            dev_examples: Sequence[glue.GlueExample], s: SequenceClassificationSettings,
                            ) -> dict[str, Any]:
    """The grid of (rate, seed) runs on labelled examples of ``task`` (a GLUE task or one read from users'
    files), each scored on dev after every epoch; the best single run saved to ``output_dir/best``."""
    tokenizer = BertTokenizer.from_pretrained(s.model_name_or_path)
    train_features = glue.featurize(train_examples, tokenizer, s.max_seq_length, task)
    dev_features = glue.featurize(dev_examples, tokenizer, s.max_seq_length, task)
    dev_refs = np.asarray([f["labels"] for f in dev_features])
    labels = list(task.labels) if task.labels is not None else ["score"]

    def collate(batch: list) -> dict:
        return glue.collate(batch, tokenizer.pad_token_id)

    def scores_of(model: nn.Module) -> dict[str, float]:
        logits = np.stack(predict(model, dev_features, collate, batch_size=s.eval_batch_size, bf16=s.bf16,
                                  device=process_device(s.device)))
        preds = logits[:, 0] if task.is_regression else logits.argmax(-1)
        return task.metric(preds, dev_refs)

    hidden_size = BertConfig.from_json_file(Path(s.model_name_or_path) / "config.json").hidden_size
    lrs = s.grid(hidden_size)
    s.output_dir.mkdir(parents=True, exist_ok=True)
    runs, best_run_score = [], -float("inf")
    for lr in lrs:
        for seed in s.seed:
            torch.manual_seed(seed)  # the fresh head's initialisation depends on the seed, as in the paper's restarts
            # A checkpoint fine-tuned for another label count (or for regression) gets a fresh head of this task's
            # shape, as the pre-trained encoder's missing head does (both logged by from_pretrained).
            model = BertForSequenceClassification.from_pretrained(
                s.model_name_or_path, id2label=dict(enumerate(labels)), ignore_mismatched_sizes=True,
                problem_type="regression" if task.is_regression else "single_label_classification")
            run = s.training(output_dir=s.output_dir / "runs" / f"lr{lr:g}-seed{seed}", learning_rate=lr, seed=seed)
            try:
                result, _ = run_finetuning(model, train_features, collate, run, scores_of,
                                           {"model": str(s.model_name_or_path), "task": task.name}, s.resume)
            except NonFiniteError as e:  # one diverged run does not end the grid; it is skipped and reported
                runs.append({"lr": lr, "seed": seed, "dev": None, "failed": str(e)})
                logger.warning("%s lr=%g seed=%d failed: %s", task.name, lr, seed, e)
                continue
            if not current().is_main:  # under torchrun, rank 0 scores, saves and reports
                continue
            per_epoch = [{k: v for k, v in r.items() if k not in ("split",)} for r in result.history
                         if r["split"] == "eval"]
            score = result.last_eval or {}
            runs.append({"lr": lr, "seed": seed, "dev": score, "per_epoch": per_epoch, "steps": result.step})
            primary = _primary(task, score) if score else float("nan")
            if not math.isfinite(primary):
                runs[-1]["failed"] = f"dev {next(iter(score), 'score')} is {primary} (not finite): no score"
                logger.warning("%s lr=%g seed=%d: %s", task.name, lr, seed, runs[-1]["failed"])
                continue
            logger.info("%s lr=%g seed=%d dev=%s", task.name, lr, seed, score)
            if primary > best_run_score:
                best_run_score = primary
                best_dir = s.output_dir / "best"
                # Which inputs the model was trained on, for `bertkit predict` to refuse a file of pairs it is
                # not told about (config.json keeps the key; transformers ignores it).
                model.config.extra["text_pair"] = len(task.text_columns) == 2
                model.save_pretrained(best_dir)
                tokenizer.save_pretrained(best_dir)
                atomic_write_json(best_dir / "training_run.json", runs[-1])
    if not current().is_main:
        return {}
    report = summarize_grid(task, runs)
    report.update(task=task.name, model=str(s.model_name_or_path), settings={**s.as_dict(), "learning_rate": lrs})
    atomic_write_json(s.output_dir / "report.json", report)
    return report


def run_finetuning(model: nn.Module, features: Sequence[dict], collate: Callable[[list], dict],
                   s: TrainingSettings, evaluate: Callable[[nn.Module], dict[str, float]] | None,
                   fingerprint: dict, resume: bool = False) -> tuple[TrainResult, float]:
    """One fine-tuning run (one phase of the one loop) on featurised examples; returns its result and wall seconds.

    ``s.batch_size`` is the global batch; each micro-step sees batch_size / gradient_accumulation_steps.
    The run's checkpoints are removed at the end (the caller keeps the model); metrics.jsonl stays in
    ``s.output_dir``. ``resume`` continues from the newest checkpoint a killed run of the same settings left.
    """
    if s.batch_size is None or s.num_train_epochs is None or s.learning_rate is None:
        raise BertkitError("run_finetuning needs batch_size, num_train_epochs and learning_rate resolved, got "
                           f"{s.batch_size}, {s.num_train_epochs}, {s.learning_rate}")
    info = current()
    micro = micro_batch_size(s.batch_size, info.world_size, s.gradient_accumulation_steps)
    plan = BatchPlan(features, micro, collate, shuffle=True, seed=s.seed, rank=info.rank, world_size=info.world_size)
    steps = steps_for_epochs(plan, s.num_train_epochs, s.gradient_accumulation_steps)
    ours = resume or not (s.output_dir / "checkpoints").exists()  # train() refuses anyone else's
    t0 = time.perf_counter()
    result = train(model, [Phase(plan, steps)], s, evaluate=evaluate, fingerprint=fingerprint, resume=resume)
    seconds = time.perf_counter() - t0
    if ours and info.is_main:  # only checkpoints this run (or the killed run it continued) made
        left = remove_owned_tree(s.output_dir / "checkpoints")  # only files recorded as this run's
        if left:
            logger.warning("kept %s: %d file(s) there were not written by this run (e.g. %s)",
                           s.output_dir / "checkpoints", len(left), ", ".join(left[:3]))
    if info.is_main:  # the learning curves, as pre-training draws them
        plot_metrics(s.output_dir / "metrics.jsonl", s.output_dir / "metrics.png")
    return result, seconds


def summarize_grid(task: glue.GlueTask, runs: list[dict]) -> dict[str, Any]:
    """Mean and standard deviation over seeds per learning rate, and the best learning rate on dev.

    Runs marked ``failed`` (diverged, or a non-finite dev metric) are left out of every mean and listed
    under ``skipped``; if every run failed there is no best configuration, and that is an error.
    """
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
    if skipped:
        logger.warning("%d of %d runs skipped (not finite): %s", len(skipped), len(runs), skipped)
    return {"metric": first_metric, "best": best, "configs": configs, "runs": runs, "skipped": skipped}


def predict_glue(s: PredictGlueSettings) -> dict[str, Any]:
    """Predict ``s.split`` with a fine-tuned checkpoint; write the GLUE-submission TSV (and dev scores if labelled)."""
    task = glue.get_task(s.task)
    tokenizer = BertTokenizer.from_pretrained(s.model_name_or_path)
    model = load_for_inference(BertForSequenceClassification, s.model_name_or_path)
    expected = task.num_labels
    if model.config.num_labels != expected:
        raise BertkitError(f"{s.model_name_or_path} has {model.config.num_labels} outputs but {task.name} needs "
                           f"{expected}; is it a checkpoint fine-tuned on this task?")
    model, precision = for_prediction(model, tokenizer, s)
    examples = first(glue.read_glue(task, s.data_dir, s.split), s.max_predict_samples)
    features = glue.featurize(examples, tokenizer, s.max_seq_length, task)
    logits = np.stack(predict(model, features, lambda b: glue.collate(b, tokenizer.pad_token_id),
                              batch_size=s.batch_size, bf16=s.bf16, device=precision.device))
    preds = logits[:, 0] if task.is_regression else logits.argmax(-1)
    s.output_dir.mkdir(parents=True, exist_ok=True)
    path = glue.write_submission(task, preds.tolist(), [e.id for e in examples], s.output_dir)
    result: dict[str, Any] = {"task": task.name, "split": s.split, "examples": len(examples), "file": str(path),
                              **precision.record()}
    if s.split != "test":
        result["scores"] = task.metric(preds, np.asarray([f["labels"] for f in features]))
    atomic_write_json(s.output_dir / "report.json", result)
    return result


# -------------------------------------------------------------------------------------------------
# Users' own labelled files: bertkit finetune classify
# -------------------------------------------------------------------------------------------------


def read_labelled(path: Path, s: ClassifySettings, *, labelled: bool = True) -> list[glue.GlueExample]:
    """Rows of a CSV/TSV/JSONL file as examples (id = the row's position); a bad row names file and line.

    Every text read must hold a non-whitespace character (an empty cell is a missing value, not a text); a second
    text the settings do not name (a ``text_pair`` or ``sentence2`` column beside the text) is logged as a warning,
    since the model would then be trained and scored on the first text alone."""
    from bertkit.tasks.files import file_format, read_records, second_text_fields

    if not path.is_file():
        raise MissingFileError(f"data file not found: {path}")
    fmt = file_format(path, s.input_format)
    if fmt == "text":
        raise BertkitError(f"{path}: finetune classify reads CSV, TSV or JSONL files with named columns "
                           "(--text-column, --label-column), not plain text; name the format with --input-format")
    wanted = [c for c in (s.text_column, s.text_pair_column, s.label_column if labelled else None) if c]
    examples = []
    unnamed_pair: tuple[int, list[str]] | None = None
    for line, record in read_records(path, fmt, s.max_line_bytes):
        if not isinstance(record, dict):
            raise BertkitError(f"{path}:{line}: expected an object with {', '.join(wanted)}, "
                               f"got {type(record).__name__}")
        missing = [c for c in wanted if c not in record]
        if missing:
            raise BertkitError(f"{path}:{line}: no {', '.join(map(repr, missing))} column (it has "
                               f"{', '.join(map(str, record))}); name the columns with --text-column, "
                               "--text-pair-column and --label-column")
        if s.text_pair_column is None and unnamed_pair is None:
            found = second_text_fields(record, used=(s.text_column, s.label_column))
            unnamed_pair = (line, found) if found else None
        values = {c: record[c] for c in wanted}
        if fmt == "jsonl" and isinstance(values.get(s.label_column), (int, float)) \
                and not isinstance(values[s.label_column], bool):
            values[s.label_column] = repr(values[s.label_column])  # JSON numbers: read as written
        bad = [c for c, v in values.items() if not isinstance(v, str)]
        if bad:
            raise BertkitError(f"{path}:{line}: {bad[0]!r} must be a string or number, got "
                               f"{str(values[bad[0]])[:60]!r}")
        blank = next((c for c in (s.text_column, s.text_pair_column) if c and not values[c].strip()), None)
        if blank is not None:
            raise BertkitError(f"{path}:{line}: {blank!r} is {'empty' if not values[blank] else 'only whitespace'}; "
                               "every row needs its text: fill in or remove that row")
        label = values.get(s.label_column) if labelled else None
        if labelled and not label.strip():
            raise BertkitError(f"{path}:{line}: empty {s.label_column!r}")
        examples.append(glue.GlueExample(id=str(len(examples)), text_a=values[s.text_column],
                                         text_b=values.get(s.text_pair_column) if s.text_pair_column else None,
                                         label=label.strip() if label is not None else None, line=line))
    if not examples:
        raise BertkitError(f"{path} holds no rows")
    if unnamed_pair is not None:
        line, found = unnamed_pair
        kind = "field" if fmt == "jsonl" else "column"
        logger.warning("%s:%d: the rows hold a second text (%s %s) that no flag names, so the model reads the first "
                       "text alone; pass --text-pair-column %s to train on pairs", path, line, kind,
                       ", ".join(map(repr, found)), found[0])
    return examples


def _number(text: str) -> float | None:
    """The number a label spells (``"3.8"``, ``"nan"``, ``"-inf"``), or None for a class name."""
    try:
        return float(text)
    except ValueError:
        return None


def _is_number(text: str) -> bool:
    value = _number(text)
    return value is not None and math.isfinite(value)


# A classification whose training rows average fewer than this many per class is almost surely a mistake:
# a numeric score read as class names, or the wrong column taken as the label.
_ROWS_PER_CLASS_WARNING = 2.0


def classify_task(train: Sequence[glue.GlueExample], problem_type: str, name: str, pairs: bool,
                  source: str | Path | None = None) -> glue.GlueTask:
    """The task the labels describe: class names (sorted, numerically when they are all integers) or regression.

    ``source`` (the training file) names where a bad label is. A label column of numbers holding a NaN or an
    infinity is refused (a missing value written as ``nan`` would otherwise become a class of its own), as are
    two spellings of one class number (``1`` and ``1.0``); a classification with nearly one class per row
    is logged as a warning with the likely fix.
    """
    where = f"{source}:" if source is not None else "line "
    labels = [e.label for e in train]
    values = [_number(x) for x in labels]
    if all(v is not None for v in values):  # a numeric column: every value must be a usable number
        bad = next((e for e, v in zip(train, values) if not math.isfinite(v)), None)
        if bad is not None:
            raise BertkitError(f"{where}{bad.line}: label {bad.label!r} is not a finite number; the label column "
                               "holds numbers, so a NaN or infinity is a missing or broken value, not a class: fix "
                               "or remove that row")
    numeric = all(_is_number(x) for x in labels)
    regression = problem_type == "regression" or (
        problem_type == "auto" and numeric and any(float(x) != int(float(x)) for x in labels))
    if problem_type == "regression" and not numeric:
        bad = next(e for e in train if not _is_number(e.label))
        raise BertkitError(f"--problem-type regression needs numeric labels; {where}{bad.line} has {bad.label!r}")
    if regression:
        names = None
    else:
        distinct = set(labels)
        if len(distinct) < 2:
            raise BertkitError(f"the training labels hold only {sorted(distinct)}: classification needs at least "
                               "two classes (pass --problem-type regression for a numeric score)")
        integral = all(_is_number(x) and float(x) == int(float(x)) for x in distinct)
        if integral:
            first_spelling: dict[float, glue.GlueExample] = {}
            for e in train:
                other = first_spelling.setdefault(float(e.label), e)
                if other.label != e.label:
                    raise BertkitError(f"{source or name}: labels {other.label!r} (line {other.line}) and {e.label!r} "
                                       f"(line {e.line}) are the same number written two ways, so they would be two "
                                       "classes; write each class one way")
        names = tuple(sorted(distinct, key=(lambda x: float(x)) if integral else None))
        if len(names) > 2 and len(labels) / len(names) < _ROWS_PER_CLASS_WARNING:
            fix = ("the labels are numbers: if they are a score, pass --problem-type regression" if numeric else
                   "check that --label-column names the label column (not a text column)")
            logger.warning("%s: %d classes in %d training rows: nearly every row is its own class, which a "
                           "classifier cannot learn; %s", source or name, len(names), len(labels), fix)
    # Two classes: accuracy (which class is "positive" is not known, so no binary F1); more: macro F1 as well,
    # which a majority-class model cannot inflate the way it does accuracy on skewed classes.
    kind = "corr" if names is None else "acc" if len(names) == 2 else "acc_macro_f1"
    return glue.GlueTask(name=name, data_dir="", files={}, labels=names, metric_kind=kind, submission_file="",
                         text_columns=("text", "text_pair") if pairs else ("text",), labeled_layout=None,
                         test_layout=None)  # type: ignore[arg-type]


def finetune_classify(s: ClassifySettings) -> dict[str, Any]:
    """``bertkit finetune classify``: fit_sequence_classifier on the user's files; predictions for --test-file."""
    train_examples = first(read_labelled(s.train_file, s), s.max_train_samples)
    dev_examples = first(read_labelled(s.validation_file, s), s.max_eval_samples)
    task = classify_task(train_examples, s.problem_type, s.train_file.stem, s.text_pair_column is not None,
                         source=s.train_file)
    if task.labels is not None:
        unknown = [e for e in dev_examples if e.label not in task.labels]
        if unknown:
            raise BertkitError(f"{s.validation_file}:{unknown[0].line}: label {unknown[0].label!r} never occurs in "
                               f"{s.train_file} (its labels: {', '.join(task.labels)})")
    else:
        bad = next((e for e in dev_examples if not _is_number(e.label)), None)
        if bad is not None:
            raise BertkitError(f"{s.validation_file}:{bad.line}: label {bad.label!r} is not a finite number; "
                               "regression needs a number in every row: fix or remove that row")
        if len({float(e.label) for e in dev_examples}) < 2:  # checked before training, not found after it
            raise BertkitError(f"{s.validation_file}: every label is {dev_examples[0].label}, so the correlations "
                               "regression is scored by (Pearson, Spearman) are undefined; validate on rows with "
                               "differing scores")
    test_examples = read_labelled(s.test_file, s, labelled=False) if s.test_file is not None else None
    report = fit_sequence_classifier(task, train_examples, dev_examples, s)
    if not current().is_main:
        return report
    if test_examples is not None:
        from bertkit.inference import pipeline
        from bertkit.outputs import atomic_write

        pipe = pipeline("text-classification", s.output_dir / "best", device=process_device(s.device), bf16=s.bf16,
                        batch_size=s.eval_batch_size, max_length=s.max_seq_length, progress=s.progress)
        results = pipe([(e.text_a, e.text_b) if e.text_b is not None else e.text_a for e in test_examples])
        out = s.output_dir / "test_predictions.jsonl"
        with atomic_write(out) as f:
            for e, r in zip(test_examples, results):
                f.write(json.dumps({"id": int(e.id), "line": e.line, **r}, ensure_ascii=False) + "\n")
        report["test_predictions"] = str(out)
        atomic_write_json(s.output_dir / "report.json", report)
    return report
