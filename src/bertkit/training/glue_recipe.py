"""The GLUE recipe (paper section 4.1, appendix A.3): ``finetune glue``, one configuration by default and any grid of
rates and seeds on request (``sequence_grid``), and ``predict glue`` (submission files).
"""

from __future__ import annotations

import logging
import math
from typing import Any

import numpy as np

from bertkit.errors import BertkitError
from bertkit.heads import BertForSequenceClassification
from bertkit.inference.predict import predict
from bertkit.settings import GlueSettings, PredictGlueSettings, first
from bertkit.tasks import glue
from bertkit.training.finetune_run import checkpoint_tokenizer
from bertkit.training.sequence_grid import fit_sequence_classifier
from bertkit.training.token_tasks import load_finetuned, prediction_report

logger = logging.getLogger("bertkit")


def finetune_glue(s: GlueSettings) -> dict[str, Any]:
    """Fine-tune ``s.model_name_or_path`` on one GLUE task for every (rate, seed) (``fit_sequence_classifier``)."""
    task = glue.get_task(s.task)
    tokenizer, s = checkpoint_tokenizer(s)
    train_examples = first(glue.read_glue(task, s.data_dir, "train"), s.max_train_samples)
    dev_examples = first(glue.read_glue(task, s.data_dir, "dev"), s.max_eval_samples)
    _check_scorable(task, dev_examples, "--max-eval-samples", s.max_eval_samples)
    return fit_sequence_classifier(task, train_examples, dev_examples, s, tokenizer)


def _check_scorable(task: glue.GlueTask, dev: list[glue.GlueExample], flag: str, value: int | None) -> None:
    """Refuse, before any work, dev rows whose labels leave the task's first score one value whatever is predicted:
    STS-B's correlations need differing scores (each would be NaN or an error once the model has run); the Matthews
    correlation (CoLA, AX) is 0.0 for rows of one label, and the F1 of label 1 (MRPC, QQP) where no row has it, as
    sklearn gives them, for a perfect prediction too (every run of a grid scored 0.0, the first kept as best)."""
    labels = sorted({e.label for e in dev})
    rows, fix = ((f"{flag} {value} keeps {len(dev)} {task.name} dev rows", f"pass a larger {flag}") if value is not None
                 else (f"the {task.name} dev file holds {len(dev)} rows", "score a dev file whose labels differ"))
    if task.is_regression and len({float(e.label) for e in dev}) < 2:
        raise BertkitError(f"{rows}, all scored {dev[0].label}: the correlations {task.name} is scored by (Pearson, "
                           f"Spearman) need differing scores; {fix}")
    if task.metric_kind == "mcc" and len(labels) < 2:
        raise BertkitError(f"{rows}, all labelled {labels[0]}: the Matthews correlation {task.name} is scored by is 0.0 "
                           f"whatever is predicted (sklearn's value for a single class); {fix}")
    if task.metric_kind == "f1_acc" and task.labels is not None and task.labels[1] not in labels:
        raise BertkitError(f"{rows}, none labelled {task.labels[1]}: the F1 of label {task.labels[1]} {task.name} is "
                           f"scored by first is 0.0 whatever is predicted (sklearn's value where no row has the label); "
                           f"{fix}")


def predict_glue(s: PredictGlueSettings) -> dict[str, Any]:
    """Predict ``s.split`` with a fine-tuned checkpoint; write the GLUE-submission TSV (and dev scores if labelled)."""
    task = glue.get_task(s.task)
    model, tokenizer, precision = load_finetuned(BertForSequenceClassification, s, "glue")
    if model.config.num_labels != task.num_labels:
        raise BertkitError(f"{s.model_name_or_path} has {model.config.num_labels} outputs but {task.name} needs "
                           f"{task.num_labels}; is it a checkpoint fine-tuned on this task?")
    pairs, trained = len(task.text_columns) == 2, model.config.extra.get("text_pair")
    if isinstance(trained, bool) and trained != pairs:  # what finetune wrote: a single-text model reads no pair
        raise BertkitError(f"{s.model_name_or_path} was fine-tuned on {'text pairs' if trained else 'single texts'} "
                           f"(its config.json's text_pair), but {task.name} "
                           f"{'pairs two texts' if pairs else 'has one text'}: is it a checkpoint fine-tuned on this "
                           "task?")
    order = task.output_order(model.config.id2label, s.model_name_or_path)  # before any file is read or written
    examples = first(glue.read_glue(task, s.data_dir, s.split), s.max_predict_samples)
    if s.split != "test":
        _check_scorable(task, examples, "--max-predict-samples", s.max_predict_samples)
    features = glue.featurize(examples, tokenizer, s.max_seq_length, task)
    logits = np.stack(predict(model, features, tokenizer.pad_token_id,
                              batch_size=s.batch_size, bf16=precision.bf16, device=precision.device))
    # the model's own argmax, then the task label of that output: a tie goes to its first output, as np.argmax
    # then id2label gives it (run_glue.py, the pipelines), whatever order it keeps its labels in
    preds = logits[:, 0] if task.is_regression else np.argsort(order)[logits.argmax(-1)]
    s.output_dir.mkdir(parents=True, exist_ok=True)
    path = glue.write_submission(task, preds.tolist(), [e.id for e in examples], s.output_dir)
    report: dict[str, Any] = {"task": task.name, "split": s.split, "examples": len(examples), "file": str(path)}
    if s.split != "test":
        report.update(_scores_or_reason(task, preds, np.asarray([f["labels"] for f in features])))
    return prediction_report(s, precision, report)


def _scores_or_reason(task: glue.GlueTask, preds: np.ndarray, refs: np.ndarray) -> dict[str, Any]:
    """``{"scores": ...}``, a score with no value (STS-B's correlations of a model predicting one score for every
    row: NaN, as scipy gives) written as null beside the reason: report.json held a bare ``NaN``, which is no score
    and no JSON (a strict parser stops at it)."""
    scores = task.metric(preds, refs)
    undefined = [k for k, v in scores.items() if math.isnan(v)]
    if not undefined:
        return {"scores": scores}
    # predict() refuses non-finite outputs and _check_scorable differing labels, so a NaN here is constant predictions
    reason = (f"{' and '.join(undefined)} undefined: the model predicts {float(preds[0]):.6g} for all {len(preds)} rows, "
              "and a correlation with a constant has no value (scipy's is NaN)")
    logger.warning("%s", reason)
    return {"scores": {k: None if k in undefined else v for k, v in scores.items()}, "undefined_scores": reason}
