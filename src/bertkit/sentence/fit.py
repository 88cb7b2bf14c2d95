"""``SentenceTransformer.fit`` and ``CrossEncoder.fit``: sentence-transformers' legacy training calls, thin wrappers on
``SentenceTransformerTrainer`` (``CrossEncoderTrainer``) as they are in sentence-transformers (6.x), so an old script
trains to the same numbers.

    loader = DataLoader([InputExample(texts=["a query", "its passage"]), ...], shuffle=True, batch_size=16)
    model.fit(train_objectives=[(loader, losses.MultipleNegativesRankingLoss(model))], epochs=1, warmup_steps=100,
              output_path="out")

Each (DataLoader of InputExample, loss) becomes a dataset named ``_dataset_{i}`` (its rows in the order one pass of
the DataLoader gives them, columns ``sentence_0``, ``sentence_1``, … and ``label`` unless every label is 0) trained
on its loss; the datasets' batches take turns (ROUND_ROBIN, as many from each as the shortest gives) at the last
DataLoader's batch size, grouped by label (GROUP_BY_LABEL) when a DataLoader reads a ``SentenceLabelDataset``. AdamW and the schedule are fit's: ``optimizer_params`` lr (torch's 1e-3 when absent), the
``weight_decay`` on all but biases and LayerNorm weights, the schedule ``scheduler`` over fit's count of steps
(whole batches of the shortest dataset, times the objectives and the epochs). ``CrossEncoder.fit`` takes one
DataLoader, as its dataset with the same columns (``cross_encoder_fit``). What bertkit cannot do is refused by name
before anything is written.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from bertkit.errors import BertkitError, NotImplementedInBertkit
from bertkit.training.callbacks import TrainerCallback, metric_key
from bertkit.training.checkpoint import HF_LAYOUT

logger = logging.getLogger("bertkit")

# fit's scheduler names (case-insensitive) as the loop's lr_scheduler_type and whether warmup_steps applies
_SCHEDULERS = {"constantlr": ("constant_with_warmup", False), "warmupconstant": ("constant_with_warmup", True),
               "warmuplinear": ("linear", True), "warmupcosine": ("cosine", True)}
_OPTIMIZER_PARAMS = ("lr", "eps", "betas")
_TRAINER_FIX = "train with SentenceTransformerTrainer (docs/sentence.md), which fit() wraps"


def fit(model: Any, train_objectives: Iterable[tuple[Any, nn.Module]], evaluator: Any = None, epochs: int = 1,
        steps_per_epoch: int | None = None, scheduler: str = "WarmupLinear", warmup_steps: int = 10000,
        optimizer_class: type = torch.optim.AdamW, optimizer_params: dict[str, object] | None = None,
        weight_decay: float = 0.01, evaluation_steps: int = 0, output_path: str | None = None,
        save_best_model: bool = True, max_grad_norm: float = 1, use_amp: bool = False,
        callback: Callable[[float, int, int], None] | None = None, show_progress_bar: bool = True,
        checkpoint_path: str | None = None, checkpoint_save_steps: int = 500, checkpoint_save_total_limit: int = 0,
        resume_from_checkpoint: bool = False) -> None:
    """Train ``model`` on ``train_objectives`` as sentence-transformers' ``fit`` does (module docstring)."""
    from bertkit.sentence.datasets import SentenceLabelDataset
    from bertkit.sentence.trainer import SentenceTransformerTrainer
    from bertkit.sentence.training_args import (
        BatchSamplers,
        MultiDatasetBatchSamplers,
        SentenceTransformerTrainingArguments,
    )

    optimizer = _optimizer_args(optimizer_class, optimizer_params, weight_decay, scheduler, warmup_steps,
                                evaluation_steps)
    objectives = list(train_objectives)
    if not objectives:
        raise BertkitError("fit(train_objectives=[]) has nothing to train: give [(DataLoader, loss), ...]")

    datasets, loss, batch_size, batch_sampler = {}, {}, 8, BatchSamplers.BATCH_SAMPLER
    for i, (loader, one_loss) in enumerate(objectives, start=1):
        if isinstance(getattr(loader, "dataset", None), SentenceLabelDataset):
            batch_sampler = BatchSamplers.GROUP_BY_LABEL  # every dataset's batches, as sentence-transformers' fit sets it
        loader_batch_size = _batch_size(loader, i)
        if loader_batch_size != batch_size and i > 1:
            logger.warning("fit: the DataLoaders' batch sizes differ (%d, then %d); every objective trains at the last "
                           "one's, as in sentence-transformers", batch_size, loader_batch_size)
        batch_size = loader_batch_size
        datasets[f"_dataset_{i}"], loss[f"_dataset_{i}"] = _rows(loader, i), one_loss

    max_steps = -1
    if steps_per_epoch is not None and steps_per_epoch > 0:
        if epochs == 1:
            max_steps = steps_per_epoch
        else:
            logger.warning("fit: steps_per_epoch with epochs > 1 trains the whole datasets each epoch, as in "
                           "sentence-transformers")
            steps_per_epoch = None
    if not steps_per_epoch:
        steps_per_epoch = min(len(rows) // batch_size for rows in datasets.values())
    schedule_steps = max_steps if max_steps > 0 else int(steps_per_epoch * epochs) * len(objectives)
    if schedule_steps <= 0:
        short = {name: len(rows) for name, rows in datasets.items() if len(rows) < batch_size}
        raise BertkitError(f"fit: the datasets {short} hold fewer rows than one batch of {batch_size}, so fit's "
                           "learning-rate schedule would be 0 steps long: give each DataLoader a full batch at least, "
                           "or a smaller batch_size")

    args = SentenceTransformerTrainingArguments(
        output_dir=checkpoint_path or _default_checkpoint_dir(), batch_sampler=batch_sampler,
        multi_dataset_batch_sampler=MultiDatasetBatchSamplers.ROUND_ROBIN,
        per_device_train_batch_size=batch_size, per_device_eval_batch_size=batch_size, num_train_epochs=epochs,
        max_steps=max_steps, max_grad_norm=max_grad_norm, fp16=use_amp, disable_tqdm=not show_progress_bar,
        save_strategy="steps" if checkpoint_path is not None else "no", save_steps=checkpoint_save_steps,
        save_total_limit=checkpoint_save_total_limit or None,  # 0: keep every checkpoint, as transformers reads it
        **optimizer)
    trainer = _trainer(SentenceTransformerTrainer, model, args, datasets, loss, schedule_steps, evaluator, callback,
                       output_path, save_best_model, save_at_end=True)
    trainer.train(resume_from_checkpoint=_latest_checkpoint(checkpoint_path) if resume_from_checkpoint else None)


def cross_encoder_fit(model: Any, train_dataloader: Any, evaluator: Any = None, epochs: int = 1, loss_fct: Any = None,
                      activation_fct: nn.Module | None = None, scheduler: str = "WarmupLinear",
                      warmup_steps: int = 10000, optimizer_class: type = torch.optim.AdamW,
                      optimizer_params: dict[str, object] | None = None, weight_decay: float = 0.01,
                      evaluation_steps: int = 0, output_path: str | None = None, save_best_model: bool = True,
                      max_grad_norm: float = 1, use_amp: bool = False,
                      callback: Callable[[float, int, int], None] | None = None,
                      show_progress_bar: bool = True) -> None:
    """Train a ``CrossEncoder`` on one DataLoader of InputExample pairs as sentence-transformers' ``CrossEncoder.fit``
    does: its dataset trained on BinaryCrossEntropyLoss (one label) or CrossEntropyLoss (several), each with
    ``activation_fct``, or on ``loss_fct(activation_fct(logits), labels)`` (a torch loss on the logits, flattened for
    one label with float labels, class ids otherwise); the schedule over the dataset's whole batches times the
    epochs."""
    from bertkit.sentence.cross_encoder.losses import BinaryCrossEntropyLoss, CrossEntropyLoss
    from bertkit.sentence.cross_encoder.trainer import CrossEncoderTrainer
    from bertkit.sentence.cross_encoder.training_args import CrossEncoderTrainingArguments

    optimizer = _optimizer_args(optimizer_class, optimizer_params, weight_decay, scheduler, warmup_steps,
                                evaluation_steps)
    batch_size = _batch_size(train_dataloader, 1)
    rows = _rows(train_dataloader, 1)
    schedule_steps = int(len(rows) // batch_size * epochs)
    if schedule_steps <= 0:
        raise BertkitError(f"fit: the DataLoader's {len(rows)} rows make no batch of {batch_size}, so fit's "
                           "learning-rate schedule would be 0 steps long: give it a full batch at least, or a smaller "
                           "batch_size")
    activation_fct = nn.Identity() if activation_fct is None else activation_fct
    if loss_fct is None:
        loss = (BinaryCrossEntropyLoss(model, activation_fn=activation_fct) if model.num_labels == 1
                else CrossEntropyLoss(model, activation_fn=activation_fct))
    else:
        loss = _fit_loss(model, loss_fct, activation_fct)
    args = CrossEncoderTrainingArguments(
        output_dir=_default_checkpoint_dir(), per_device_train_batch_size=batch_size,
        per_device_eval_batch_size=batch_size, num_train_epochs=epochs, max_grad_norm=max_grad_norm, fp16=use_amp,
        disable_tqdm=not show_progress_bar, save_strategy="no", **optimizer)
    # sentence-transformers 6.2's CrossEncoder.fit never hands its epoch-end evaluation the trainer, so there only
    # the evaluations of evaluation_steps reach callback and save_best_model (without them nothing is written to
    # output_path but the evaluator's CSV); here every evaluation does, as its docstring and its old_fit say.
    # Without an evaluator nothing is saved, as in both.
    _trainer(CrossEncoderTrainer, model, args, rows, loss, schedule_steps, evaluator, callback, output_path,
             save_best_model, save_at_end=False).train()


def _optimizer_args(optimizer_class: type, optimizer_params: dict[str, object] | None, weight_decay: float,
                    scheduler: str, warmup_steps: int, evaluation_steps: int | None) -> dict[str, Any]:
    """fit's optimiser, schedule and evaluation_steps as the trainer's arguments, once they are what bertkit's loop
    runs: torch's AdamW (its defaults where optimizer_params is silent: lr 1e-3, eps 1e-8, betas (0.9, 0.999))."""
    optimizer_params = {"lr": 2e-5} if optimizer_params is None else dict(optimizer_params)
    if optimizer_class is not torch.optim.AdamW:
        raise NotImplementedInBertkit(f"fit(optimizer_class={getattr(optimizer_class, '__name__', optimizer_class)}) "
                                      "is not implemented in bertkit: its loop trains with torch.optim.AdamW; drop "
                                      "optimizer_class")
    unknown = sorted(set(optimizer_params) - set(_OPTIMIZER_PARAMS))
    if unknown:
        raise NotImplementedInBertkit(f"fit(optimizer_params=...) sets {unknown}, which bertkit's AdamW does not take "
                                      f"(it takes {list(_OPTIMIZER_PARAMS)}); drop them")
    if not isinstance(scheduler, str) or scheduler.lower() not in _SCHEDULERS:
        raise NotImplementedInBertkit(f"fit(scheduler={scheduler!r}) is not implemented in bertkit: choose one of "
                                      "ConstantLR, WarmupConstant, WarmupLinear, WarmupCosine")
    schedule, warms_up = _SCHEDULERS[scheduler.lower()]
    beta1, beta2 = optimizer_params.get("betas", (0.9, 0.999))
    return {"learning_rate": optimizer_params.get("lr", 1e-3), "adam_epsilon": optimizer_params.get("eps", 1e-8),
            "adam_beta1": beta1, "adam_beta2": beta2, "weight_decay": weight_decay, "lr_scheduler_type": schedule,
            "warmup_steps": warmup_steps if warms_up else 0,
            "eval_strategy": "steps" if evaluation_steps is not None and evaluation_steps > 0 else "no",
            "eval_steps": evaluation_steps or None}


def _trainer(trainer_class: type, model: Any, args: Any, train_dataset: Any, loss: Any, schedule_steps: int,
             evaluator: Any, callback: Callable[[float, int, int], None] | None, output_path: str | None,
             save_best_model: bool, save_at_end: bool) -> Any:
    """The trainer fit runs, with fit's schedule length and callbacks: the evaluator at each epoch's end, fit's
    ``callback`` after each evaluation, the model saved to output_path (``save_at_end``: when training ends, without
    an evaluator)."""
    callbacks: list[TrainerCallback] = []
    epoch_evaluation = None
    if evaluator is not None:
        epoch_evaluation = _EvaluateEachEpoch(evaluator, output_path)
        callbacks.append(epoch_evaluation)
        if callback is not None:
            callbacks.append(_ScoreCallback(callback, evaluator))
    if output_path is not None:
        callbacks.append(_SaveModel(output_path, evaluator, save_best_model, save_at_end))
    trainer = trainer_class(model=model, args=args, train_dataset=train_dataset, loss=loss, evaluator=evaluator,
                            callbacks=callbacks)
    trainer._schedule_steps = schedule_steps
    if epoch_evaluation is not None:
        epoch_evaluation.trainer = trainer
    return trainer


def _fit_loss(model: Any, loss_fct: nn.Module, activation_fct: nn.Module) -> Any:
    """sentence-transformers' ``FitMixinLoss``: a torch loss on a cross-encoder's (activated) logits."""
    from bertkit.sentence.cross_encoder.losses import CrossEncoderLoss

    class FitMixinLoss(CrossEncoderLoss):
        needs_label = True
        one_label = False  # any number of labels: one gives (N,) logits and float labels, several class ids

        def __init__(self):
            super().__init__(model)
            self.loss_fct, self.activation_fn = loss_fct, activation_fct

        def forward(self, inputs, labels):
            self.pair_columns(inputs)
            logits = self.scores(inputs[0], inputs[1])
            if self.model.num_labels == 1:
                logits, labels = logits.view(-1), labels.float()
            else:
                labels = labels.long()
            return self.loss_fct(self.activation_fn(logits), labels.to(logits.device))

    return FitMixinLoss()


def _batch_size(loader: Any, i: int) -> int:
    if not isinstance(loader, torch.utils.data.DataLoader):
        raise BertkitError(f"fit: train objective {i} holds a {type(loader).__name__} where a torch DataLoader of "
                           "InputExample goes: give (DataLoader(examples, shuffle=True, batch_size=16), loss)")
    if loader.batch_size is None:
        raise NotImplementedInBertkit(f"fit: the DataLoader of train objective {i} has a custom batch_sampler "
                                      f"({type(loader.batch_sampler).__name__}), whose batches fit does not keep (it "
                                      "draws its own): give it batch_size= instead, or "
                                      f"{_TRAINER_FIX} with batch_sampler=BatchSamplers.NO_DUPLICATES")
    return loader.batch_size


def _rows(loader: torch.utils.data.DataLoader, i: int) -> list[dict[str, Any]]:
    """The DataLoader's examples as rows, in the order one pass of it gives them (its shuffle drawn from torch's
    global generator as sentence-transformers' pass draws it), with sentence-transformers' columns."""
    collate_fn = loader.collate_fn
    loader.collate_fn = list  # the examples themselves, as sentence-transformers reads them
    try:
        examples = [example for batch in loader for example in batch]
    finally:
        loader.collate_fn = collate_fn
    bad = next((e for e in examples if not isinstance(getattr(e, "texts", None), (list, tuple))), None)
    if bad is not None:
        raise BertkitError(f"fit: the DataLoader of train objective {i} gives {bad!r} where an InputExample with its "
                           "texts goes: build it over [InputExample(texts=[...], label=...), ...]")
    widths = sorted({len(e.texts) for e in examples})
    if len(widths) > 1:  # zip(*texts) kept the fewest texts of a row, dropping the others' last ones without a word
        first = {w: next(r for r, e in enumerate(examples) if len(e.texts) == w) for w in widths}
        raise BertkitError(f"fit: the InputExamples of train objective {i} have {widths[0]} to {widths[-1]} texts "
                           f"(e.g. example {first[widths[0]]}: {widths[0]}, example {first[widths[-1]]}: "
                           f"{widths[-1]}); all of one objective need the same number, as in sentence-transformers "
                           "6.3: give each kind its own DataLoader")
    width = widths[0] if examples else 0
    labels = [e.label for e in examples]
    try:
        unlabelled = set(labels) == {0}  # InputExample's default label: the dataset has no label column
    except TypeError:  # unhashable labels (arrays): a label column
        unlabelled = False
    return [{**{f"sentence_{c}": e.texts[c] for c in range(width)}, **({} if unlabelled else {"label": e.label})}
            for e in examples]


def _default_checkpoint_dir() -> str:
    """sentence-transformers' output_dir without checkpoint_path: checkpoints/model, or the first model_{i} that is
    absent or empty."""
    name, i = "checkpoints/model", 1
    while Path(name).exists() and any(Path(name).iterdir()):
        name, i = f"checkpoints/model_{i}", i + 1
    return name


def _latest_checkpoint(checkpoint_path: str | None) -> str | None:
    """The newest checkpoint-N in checkpoint_path, or None (with a warning) when there is none, as
    sentence-transformers resumes."""
    if checkpoint_path is None or not os.path.isdir(checkpoint_path):
        logger.warning("fit: checkpoint directory %s does not exist or is not a directory", checkpoint_path)
        return None
    found = HF_LAYOUT.dirs(Path(checkpoint_path))  # checkpoint-N directories, N in ASCII digits
    if not found:
        logger.warning("fit: no checkpoints found in %s", checkpoint_path)
        return None
    return os.path.join(checkpoint_path, found[-1].name)


class _EvaluateEachEpoch(TrainerCallback):
    """The evaluator at each epoch's end, its metrics prefixed ``eval_`` and passed to on_evaluate (fit always
    evaluated per epoch); its CSV in output_path/eval."""

    def __init__(self, evaluator: Any, output_path: str | None):
        self.evaluator, self.trainer = evaluator, None
        self.output_path = None if output_path is None else os.path.join(output_path, "eval")
        if self.output_path is not None:
            os.makedirs(self.output_path, exist_ok=True)

    def on_epoch_end(self, args, state, control, model=None, **kwargs):
        metrics = self.evaluator(model, output_path=self.output_path, epoch=state.epoch, steps=state.global_step)
        if not isinstance(metrics, dict):
            metrics = {"evaluator": metrics}
        metrics = {metric_key(k): v for k, v in metrics.items()}
        if self.trainer is not None:
            self.trainer._event("on_evaluate", metrics=metrics)


class _ScoreCallback(TrainerCallback):
    """fit's ``callback(score, epoch, steps)`` after each evaluation, with the evaluator's primary metric."""

    def __init__(self, callback: Callable[[float, int, int], None], evaluator: Any):
        self.callback, self.evaluator = callback, evaluator

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        key = getattr(self.evaluator, "primary_metric", None) or "evaluator"  # None too, as in 6.3
        for name, value in (metrics or {}).items():
            if name.endswith(key):
                return self.callback(value, state.epoch, state.global_step)


class _SaveModel(TrainerCallback):
    """The model to output_path: with an evaluator and save_best_model, at each evaluation that beats the best so
    far (by the evaluator's greater_is_better); without an evaluator, when training ends if ``save_at_end`` (as
    sentence-transformers: with an evaluator and save_best_model False, nothing is saved)."""

    def __init__(self, output_path: str, evaluator: Any, save_best_model: bool, save_at_end: bool):
        self.output_path, self.evaluator, self.save_best_model = output_path, evaluator, save_best_model
        self.save_at_end, self.best = save_at_end, None

    def on_evaluate(self, args, state, control, metrics=None, model=None, **kwargs):
        if self.evaluator is None or not self.save_best_model:
            return
        key = getattr(self.evaluator, "primary_metric", None) or "evaluator"  # None too, as in 6.3
        greater = getattr(self.evaluator, "greater_is_better", True)
        for name, value in (metrics or {}).items():
            if not name.endswith(key):
                continue
            if not math.isfinite(value):  # a NaN compares as neither better nor worse: never the model to keep
                logger.warning("fit: %s is %s at step %d: this evaluation cannot be the best; %s keeps %s", name,
                               value, state.global_step, self.output_path,
                               "nothing yet" if self.best is None else f"the model of score {self.best}")
            elif self.best is None or (value > self.best if greater else value < self.best):
                self.best = value
                model.save(self.output_path)

    def on_train_end(self, args, state, control, model=None, **kwargs):
        if self.evaluator is None and self.save_at_end:
            model.save(self.output_path)
