"""The Trainer's evaluation and prediction, as transformers' Trainer does them: ``evaluate`` (one set or a dict of
them, each prefixed ``eval_{name}_``), ``predict``, and the loop's periodic evaluation, all through one pass over the
data (``_prediction_output``: predictions, labels, the mean loss, compute_metrics' metrics and the timings), and the
checks that an evaluation will return what the run asks of it (its outputs, metric_for_best_model) before training
writes anything.

``TrainerEvaluation`` is a mixin of ``bertkit.Trainer``, as ``TrainerLoss`` is: it reads the Trainer's ``args``,
``eval_dataset``, ``compute_metrics``, ``label_names``, ``device`` and trained ``_module``, and calls its data
(``_examples``, ``_check_batch``, ``_collate``), its loss (``_evaluated``) and its callbacks (``_event``, ``log``).
"""

from __future__ import annotations

import inspect
import logging
import math
import numbers
import time
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import nn

from bertkit.construction import copy_model
from bertkit.errors import BertkitError
from bertkit.inference.runner import finite_enough, in_order
from bertkit.training import predictions, trainer_data
from bertkit.training.callbacks import EvalPrediction, PredictionOutput, best_metric_value, metric_key
from bertkit.training.distributed import current
from bertkit.training.length_grouped import grouped_indices, row_lengths

logger = logging.getLogger("bertkit")


class EvalOptions(NamedTuple):
    """The TrainingArguments that shape an evaluation's results (their defaults: transformers')."""

    prediction_loss_only: bool = False
    eval_do_concat_batches: bool = True
    include_for_metrics: tuple[str, ...] = ()
    batch_eval_metrics: bool = False


class TrainerEvaluation:
    """evaluate(), predict() and the loop's evaluation of ``bertkit.Trainer``; see the module docstring."""

    _in_train = False  # inside train() (``Trainer.train`` sets it)
    _ignore_keys_for_eval: list[str] | None = None  # train(ignore_keys_for_eval=): the loop's evaluations'
    preprocess_logits_for_metrics: Any = None  # Trainer(preprocess_logits_for_metrics=): each batch's logits reduced

    def evaluate(self, eval_dataset: Any = None, ignore_keys: list[str] | None = None,
                 metric_key_prefix: str = "eval") -> dict[str, float]:
        """eval_loss (when the data has labels) and compute_metrics' metrics, prefixed ``eval_``; ``eval_dataset`` a
        name: that dataset of a dict eval_dataset, as in transformers."""
        eval_dataset = self._named_eval_set(eval_dataset)
        dataset = eval_dataset if eval_dataset is not None else self.eval_dataset
        if isinstance(dataset, Mapping):
            return {k: v for prefix, _, part in self._eval_sets(dataset, metric_key_prefix)
                    for k, v in self.evaluate(part, ignore_keys, prefix).items()}
        self._check_outputs(ignore_keys, "evaluate(ignore_keys=...)")
        metrics = self._prediction_output(dataset, "eval_dataset", metric_key_prefix, ignore_keys=ignore_keys).metrics
        self.log(metrics)
        self._event("on_evaluate", metrics=metrics)
        return metrics

    def predict(self, test_dataset: Any, ignore_keys: list[str] | None = None,
                metric_key_prefix: str = "test") -> PredictionOutput:
        """Logits (numpy, rows in the dataset's order), the labels when the data has them, and the metrics."""
        self._check_outputs(ignore_keys, "predict(ignore_keys=...)")
        output = self._prediction_output(test_dataset, "test_dataset", metric_key_prefix, ignore_keys=ignore_keys)
        self._event("on_predict", metrics=output.metrics)
        return output

    def _prediction_output(self, dataset: Any, what: str, prefix: str, module: nn.Module | None = None,
                           check: bool = True, ignore_keys: list[str] | None = None) -> PredictionOutput:
        """The one evaluation of evaluate(), predict() and the loop's evaluations: predictions, labels, and metrics
        prefixed ``prefix``: the mean loss (when the data has labels), compute_metrics' and the timings."""
        examples = self._examples(dataset, what)
        if check:
            self._check_batch(examples, what, need_labels=False)
        trainer_data.loader_draw()
        t0 = time.perf_counter()
        batches = self._eval_batches(dataset)
        preds, labels, loss, metrics = self._evaluation(examples, module, batches, ignore_keys=ignore_keys)
        seconds, n = time.perf_counter() - t0, len(examples)
        metrics = {**({} if loss is None else {"loss": loss}), **metrics}
        batches = math.ceil(n / self.args.per_device_eval_batch_size)
        metrics.update(runtime=seconds, samples_per_second=n / max(seconds, 1e-9),
                       steps_per_second=batches / max(seconds, 1e-9))
        return PredictionOutput(preds, labels, {metric_key(k, prefix): v for k, v in metrics.items()})

    def _evaluation(self, examples: Sequence, module: nn.Module | None, batches: list[list[int]] | None = None,
                    events: bool = True, ignore_keys: list[str] | None = None
                    ) -> tuple[Any, Any, float | None, dict[str, Any]]:
        """(predictions, labels, mean loss, compute_metrics' metrics) of ``examples`` in ``batches``, shaped by the
        evaluation options as transformers' evaluation loop shapes them: prediction_loss_only (the loss alone),
        eval_do_concat_batches (False: per-batch lists), include_for_metrics (inputs, per-row losses in
        EvalPrediction) and batch_eval_metrics (compute_metrics per batch, on tensors, ``compute_result`` at the last;
        its last return is the metrics)."""
        options = self._eval_options()
        batches = batches if batches is not None else self._eval_batches(examples)
        include = set(options.include_for_metrics)
        per_batch = options.batch_eval_metrics and self.compute_metrics is not None
        if per_batch:
            _check_takes_compute_result(self.compute_metrics)  # before the model runs, as transformers checks it
        parts = self._prediction_parts(examples, module, events, batches, inputs="inputs" in include,
                                       keep_batch=per_batch and "inputs" in include, ignore_keys=ignore_keys)
        loss = predictions.mean_loss(parts, self._loss_weights(batches, len(examples)))
        if options.prediction_loss_only:
            return None, None, loss, {}
        steps = _steps(parts)
        if options.eval_do_concat_batches:
            preds, labels, inputs = (predictions.joined(parts, what) for what in ("outputs", "labels", "inputs"))
            losses = _row_losses(parts)
        else:  # a list of each step's, where the steps have any
            preds, labels, inputs = ([predictions.joined(s, what) for s in steps]
                                     if predictions.joined(parts, what) is not None else None
                                     for what in ("outputs", "labels", "inputs"))
            losses = [_row_losses(s) for s in steps] if _row_losses(parts) is not None else None
        if self.compute_metrics is None or labels is None:
            return preds, labels, loss, {}
        if per_batch:
            returned: Any = None
            for i, step in enumerate(steps):
                extra = {"losses": _tensor(_row_losses(step)) if "loss" in include else None,
                         "inputs": _batch_of(step) if "inputs" in include else None}
                returned = self.compute_metrics(
                    EvalPrediction(_tensor(predictions.joined(step, "outputs")),
                                   _tensor(predictions.joined(step, "labels")), **extra),
                    compute_result=i == len(steps) - 1)
            metrics = self._checked_metrics(returned)
        else:
            metrics = self._checked_metrics(self.compute_metrics(EvalPrediction(
                preds, labels, inputs if "inputs" in include else None, losses if "loss" in include else None)))
        return preds, labels, loss, _undefined_where_nonfinite({k: _plain(v) for k, v in metrics.items()}, preds)

    def _evaluated_module(self) -> nn.Module:
        """The model evaluate() and predict() run: with bf16_full_eval (fp16_full_eval) outside train(), a bf16
        (float16) copy of it, the numbers of transformers' evaluation, which casts the model itself (and leaves it so:
        the training and predictions after it would run on rounded weights; here the model stays as it is)."""
        args = self.args
        dtype = torch.float16 if args.fp16_full_eval else torch.bfloat16 if args.bf16_full_eval else None
        if dtype is None or self._in_train:
            return self._module
        return copy_model(self._module).to(dtype)

    def _eval_options(self) -> EvalOptions:
        """What shapes an evaluation's results: the arguments'."""
        a = self.args
        return EvalOptions(a.prediction_loss_only, a.eval_do_concat_batches, tuple(a.include_for_metrics),
                           a.batch_eval_metrics)

    @staticmethod
    def _checked_metrics(returned: Any) -> Mapping:
        if not isinstance(returned, Mapping):
            raise BertkitError(f"compute_metrics returned {type(returned).__name__} {returned!r:.80}; it must return "
                               "a dict of metric name -> number, e.g. {'accuracy': 0.91}")
        return returned

    def _eval_batches(self, dataset: Sequence) -> list[list[int]]:
        """This process's evaluation batches of ``dataset``: one process's batches, under torchrun every world_size-th
        of them, as accelerate deals them out to transformers' evaluation. Dealt row by row instead, a batch held other
        rows than one process's: a token task's eval_loss (a mean per batch) was another (1.1212 on 2 processes for
        one process's 1.1220), and its predictions past a row's end held -100 where one process's held the logits of
        the padding of its batch."""
        info, size = current(), self.args.per_device_eval_batch_size
        rows = trainer_data.evaluated_rows(len(dataset), size, info.world_size, self.args.dataloader_drop_last)
        if self.args.train_sampling_strategy == "group_by_length":
            return self._grouped_eval_batches(dataset, rows)[info.rank::info.world_size]
        return in_order(range(rows), size)[info.rank::info.world_size]

    def _grouped_eval_batches(self, dataset: Sequence, rows: int) -> list[list[int]]:
        """One process's evaluation batches under group_by_length: transformers evaluates (and predicts) in a
        LengthGroupedSampler's order too, from a generator seeded with data_seed or seed at each evaluation (its own
        generator: every process draws the same order), so a token task's eval_loss (a mean per batch) is that
        order's; predictions and label_ids come back in it there, in the dataset's order here."""
        examples = self._examples(dataset, "eval_dataset")
        names = getattr(self.processing_class, "model_input_names", None) or ["input_ids"]
        column = self.args.length_column_name if trainer_data.is_hf_dataset(dataset) else None
        lengths = row_lengths(examples, column, names[0])
        seed = self.args.data_seed if self.args.data_seed is not None else self.args.seed
        size = self.args.per_device_eval_batch_size
        order = grouped_indices(lengths, size, torch.Generator().manual_seed(seed))[:rows]
        return [order[s:s + size] for s in range(0, rows, size)]

    def _prediction_parts(self, examples: Sequence, module: nn.Module | None, events: bool,
                          batches: list[list[int]], inputs: bool = False, keep_batch: bool = False,
                          ignore_keys: list[str] | None = None) -> list[predictions.Part]:
        """Each evaluation batch's results (``predictions.run``), preprocess_logits_for_metrics applied; with
        ``inputs``, each batch's main input (input_ids); with ``keep_batch``, the collated batch. A custom model's
        ModelOutput gives every output but the loss and ``ignore_keys`` (by default its config's
        keys_to_ignore_at_inference), as transformers' prediction_step."""
        if ignore_keys is None:
            config = getattr(module if module is not None else self._module, "config", None)
            ignore_keys = getattr(config, "keys_to_ignore_at_inference", ["past_key_values"]) if config else []
        module = module if module is not None else self._evaluated_module()
        name = getattr(module, "main_input_name", "input_ids") if inputs else None
        return predictions.run(module, examples, batches, label_names=self.label_names, collate=self._collate,
                               forward=lambda batch: self._evaluated(module, batch, self.label_names),
                               device=self.device, bf16=self.args.bf16,
                               on_step=(lambda: self._event("on_prediction_step")) if events else None,
                               preprocess=self.preprocess_logits_for_metrics, inputs_name=name,
                               keep_batch=keep_batch, ignore_keys=ignore_keys)

    def _loss_weights(self, batches: list[list[int]], rows: int) -> list[int] | None:
        """Each evaluation batch's weight in the mean loss; None: its rows."""
        return None

    def _loop_evaluation(self, module: nn.Module) -> dict[str, float]:
        """An evaluation during training. A subclass's ``evaluate`` override is called, as transformers' Trainer calls
        ``self.evaluate(ignore_keys=ignore_keys_for_eval)`` there (an override adding a metric, or changing one, was
        skipped: its metric reached neither log_history nor metric_for_best_model); it logs and tells the callbacks
        itself, so the loop's record of its numbers is not logged again."""
        if not self._evaluate_overridden():
            return self._evaluate_in_loop(module)
        metrics = self.evaluate(ignore_keys=self._ignore_keys_for_eval)
        return {k: v for k, v in metrics.items() if isinstance(v, numbers.Real) and not isinstance(v, bool)}

    def _evaluate_overridden(self) -> bool:
        """Whether a class of the user's (not bertkit's own) overrides ``evaluate``."""
        return any(not cls.__module__.startswith("bertkit.") and "evaluate" in vars(cls) for cls in type(self).__mro__)

    def _evaluate_in_loop(self, module: nn.Module) -> dict[str, float]:
        self._check_outputs(self._ignore_keys_for_eval, "train(ignore_keys_for_eval=...)")  # a callback's evaluation
        return {k: v for prefix, what, dataset in self._eval_sets(self.eval_dataset, "eval")
                for k, v in self._prediction_output(dataset, what, prefix, module, check=False,
                                                    ignore_keys=self._ignore_keys_for_eval).metrics.items()}

    def _by_eval_set(self, metrics: dict[str, float]) -> list[dict[str, float]]:
        """An evaluation's metrics as one record per evaluation set (for a dict of them, the keys under its
        ``eval_{name}_`` prefix, the longest that fits; a key under none goes with the first set, as
        sentence-transformers logs its evaluator's metrics)."""
        if not isinstance(self.eval_dataset, Mapping):
            return [metrics]
        prefixes = [f"eval_{name}_" for name in self.eval_dataset]
        parts: dict[str, dict[str, float]] = {p: {} for p in prefixes}
        for key, value in metrics.items():
            fits = [p for p in prefixes if key.startswith(p)]
            parts[max(fits, key=len) if fits else prefixes[0]][key] = value
        return [part for part in parts.values() if part]

    def _check_outputs(self, ignore_keys: list[str] | None, fix: str) -> None:
        """transformers hands predict() and compute_metrics every output but the loss and ``ignore_keys``: with the
        config's output_hidden_states or output_attentions set, a tuple (logits, hidden_states, ...), whose [0] is
        the logits. bertkit gives the logits alone, whose [0] is the first row: refused unless ignore_keys names
        what transformers would add, so a compute_metrics written for either is never silently fed the other."""
        config = getattr(self._module, "config", None)
        extra = {flag: name for flag, name in (("output_hidden_states", "hidden_states"),
                                                ("output_attentions", "attentions"))
                 if getattr(config, flag, False) and name not in (ignore_keys or ())}
        if extra:
            raise BertkitError(
                f"the model's config sets {' and '.join(f'{f}=True' for f in extra)}: transformers' Trainer would "
                f"return predictions as a tuple (logits, {', '.join(extra.values())}) and bertkit returns the logits "
                "alone, so predictions[0] would be the logits there and the first row here; pass "
                f"{fix.replace('...', repr(list(extra.values())))} to take the logits alone, or set "
                f"{' and '.join(f'model.config.{f} = False' for f in extra)}")

    def _check_metric(self) -> None:
        """metric_for_best_model must be one evaluation returns (which needs the eval set's labels): checked on one
        evaluation batch before training writes anything (transformers finds out at the first evaluation)."""
        name = self.args.metric_for_best_model
        if name is None:
            return
        if self.eval_dataset is None:
            raise BertkitError(f"metric_for_best_model {name!r} needs an eval_dataset")
        keys = []
        for prefix, what, dataset in self._eval_sets(self.eval_dataset, "eval"):
            examples = self._examples(dataset, what)
            sample = [examples[i] for i in range(min(len(examples), self.args.per_device_eval_batch_size))]
            # the sample's batches in order, as this class deals them: a subclass's sampler (the sentence trainers'
            # no-duplicates or label-grouped one) draws from a whole dataset's texts or labels, not a list of rows
            batches = TrainerEvaluation._eval_batches(self, sample)
            _, labels, _, returned = self._evaluation(sample, None, batches, events=False)
            loss_only = self._eval_options().prediction_loss_only
            if labels is None and not loss_only and metric_key(name).startswith(f"{prefix}_"):
                why = "load_best_model_at_end compares" if self.args.load_best_model_at_end else "it is"
                raise BertkitError(
                    f"metric_for_best_model {name!r} needs labels in {what} ({why} a metric of the evaluation), but "
                    f"its batches hold {sorted(self._collate(sample[:1]))} and {type(self._module).__name__} takes "
                    f"labels as {self.label_names}: add a 'label' (or 'labels') column to {what}, or set neither "
                    "load_best_model_at_end nor metric_for_best_model")
            keys += [f"{prefix}_loss"] + [metric_key(k, prefix) for k in returned]
            best_metric_value(name, {metric_key(k, prefix): v for k, v in returned.items()}, 0)  # a number?
        # an evaluate() override may add it: then it is looked for in what the override returns (``_on_record``)
        if metric_key(name) not in keys and not self._evaluate_overridden():
            raise BertkitError(f"metric_for_best_model {name!r} is not a metric this run computes: evaluation "
                               f"returns {keys}; name one of them (without or with the eval_ prefix)")

    def _named_eval_set(self, dataset: Any) -> Any:
        """``dataset``, or where it is a string, the dataset of that name in a dict eval_dataset (transformers'
        ``evaluate("name")``, under the prefix given, ``eval_`` by default): a name was read as a dataset of one row."""
        if not isinstance(dataset, str):
            return dataset
        if not isinstance(self.eval_dataset, Mapping) or dataset not in self.eval_dataset:
            names = sorted(self.eval_dataset) if isinstance(self.eval_dataset, Mapping) else None
            raise BertkitError(f"evaluate({dataset!r}) names an evaluation dataset, and the trainer's eval_dataset "
                               + (f"is a dict of {names}" if names is not None else "is no dict of named datasets")
                               + ": name one of them, or pass the dataset itself")
        return self.eval_dataset[dataset]

    @staticmethod
    def _eval_sets(dataset: Any, prefix: str) -> list[tuple[str, str, Any]]:
        """(metric prefix, name in messages, dataset) for each evaluation set (a dict's prefixed ``eval_{name}_``)."""
        if not isinstance(dataset, Mapping):
            return [(prefix, "eval_dataset", dataset)]
        if not dataset:
            raise BertkitError("eval_dataset is an empty dict; give at least one {name: dataset}")
        return [(f"{prefix}_{name}", f"eval_dataset[{name!r}]", part) for name, part in dataset.items()]


def _steps(parts: list[predictions.Part]) -> list[list[predictions.Part]]:
    """The parts of each evaluation step, in order: one batch, or under torchrun every process's k-th batch."""
    steps: dict[int, list[predictions.Part]] = {}
    for part in parts:
        steps.setdefault(part.step, []).append(part)
    return [steps[k] for k in sorted(steps)]


def _row_losses(parts: list[predictions.Part]) -> np.ndarray | None:
    """Each row's loss, its batch's (transformers' ``include_for_metrics=["loss"]``), in the dataset's order."""
    if not parts or any(p.loss is None for p in parts):
        return None
    rows = np.asarray([i for p in parts for i in p.rows])
    losses = np.asarray([p.loss for p in parts for _ in p.rows], dtype=np.float32)
    return losses[np.argsort(rows, kind="stable")]


def _check_takes_compute_result(compute_metrics: Any) -> None:
    """batch_eval_metrics calls ``compute_metrics(p, compute_result=...)``: one without that argument would fail inside
    the user's function after the whole evaluation has run."""
    try:
        parameters = inspect.signature(compute_metrics).parameters
    except (TypeError, ValueError):  # a builtin or C callable without a signature: let the call decide
        return
    if "compute_result" not in parameters and not any(p.kind is p.VAR_KEYWORD for p in parameters.values()):
        name = getattr(compute_metrics, "__name__", type(compute_metrics).__name__)
        raise BertkitError(f"batch_eval_metrics=True calls compute_metrics once per evaluation batch with a "
                           f"compute_result argument (True at the last batch, whose return is the metrics), and "
                           f"{name}{inspect.signature(compute_metrics)} takes none: add `compute_result=False` to it, "
                           "or set batch_eval_metrics=False")


def _tensor(value: Any) -> Any:
    """A step's arrays as torch tensors, as batch_eval_metrics' compute_metrics gets them."""
    if value is None:
        return None
    return tuple(torch.from_numpy(v) for v in value) if isinstance(value, tuple) else torch.from_numpy(value)


def _batch_of(step: list[predictions.Part]) -> dict:
    """The collated batch of a step (batch_eval_metrics' ``inputs``): one process's alone."""
    if len(step) != 1:
        raise BertkitError("batch_eval_metrics with include_for_metrics=['inputs'] under torchrun is not implemented "
                           "(each process's batch is padded to its own length); drop 'inputs' or batch_eval_metrics")
    return step[0].batch


def _plain(value: Any) -> Any:
    return value.item() if hasattr(value, "item") and getattr(value, "ndim", 1) == 0 else value


def _nonfinite_row(outputs: Any) -> int | None:
    """The first row of ``outputs`` (an array, or a tuple or list of them, a step's each) that the inference runner
    refuses (``runner.finite_enough``: a NaN or +inf, or -inf at every label of it or of one of its tokens); None
    when there is none."""
    if isinstance(outputs, (tuple, list)):
        rows = [_nonfinite_row(o) for o in outputs]
        return next((r for r in rows if r is not None), None)
    if not isinstance(outputs, np.ndarray) or outputs.dtype.kind != "f" or outputs.ndim == 0:
        return None
    return next((i for i, row in enumerate(outputs) if not finite_enough(row)), None)


def _undefined_where_nonfinite(metrics: dict[str, Any], outputs: Any) -> dict[str, Any]:
    """compute_metrics' float metrics as NaN where the predictions it was given are not finite: an argmax of NaN
    logits is label 0 and a metric of them a number like any other (transformers reports eval_accuracy 0.5 for a
    model whose every logit is NaN); a NaN metric is never the best, and a warning names the row."""
    row = _nonfinite_row(outputs)
    if row is None:
        return metrics
    floats = [k for k, v in metrics.items() if isinstance(v, float)]
    if floats:
        logger.warning("the predictions of evaluation row %d (0-based, in evaluation order) are not finite (NaN or "
                       "inf, or -inf at every label): compute_metrics' %s are reported as NaN, as no metric comes of "
                       "such predictions; the model's weights or outputs have overflowed (a diverged run?)",
                       row, ", ".join(floats))
    return {k: math.nan if k in floats else v for k, v in metrics.items()}
