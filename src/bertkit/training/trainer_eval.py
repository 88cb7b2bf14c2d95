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

import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

from torch import nn

from bertkit.errors import BertkitError
from bertkit.inference.runner import in_order
from bertkit.training import predictions, trainer_data
from bertkit.training.callbacks import EvalPrediction, PredictionOutput, best_metric_value, metric_key
from bertkit.training.distributed import current


class TrainerEvaluation:
    """evaluate(), predict() and the loop's evaluation of ``bertkit.Trainer``; see the module docstring."""

    _ignore_keys_for_eval: list[str] | None = None  # train(ignore_keys_for_eval=): the loop's evaluations'

    def evaluate(self, eval_dataset: Any = None, ignore_keys: list[str] | None = None,
                 metric_key_prefix: str = "eval") -> dict[str, float]:
        """eval_loss (when the data has labels) and compute_metrics' metrics, prefixed ``eval_``."""
        dataset = eval_dataset if eval_dataset is not None else self.eval_dataset
        if isinstance(dataset, Mapping):
            return {k: v for prefix, _, part in self._eval_sets(dataset, metric_key_prefix)
                    for k, v in self.evaluate(part, ignore_keys, prefix).items()}
        self._check_outputs(ignore_keys, "evaluate(ignore_keys=...)")
        metrics = self._prediction_output(dataset, "eval_dataset", metric_key_prefix).metrics
        self.log(metrics)
        self._event("on_evaluate", metrics=metrics)
        return metrics

    def predict(self, test_dataset: Any, ignore_keys: list[str] | None = None,
                metric_key_prefix: str = "test") -> PredictionOutput:
        """Logits (numpy, rows in the dataset's order), the labels when the data has them, and the metrics."""
        self._check_outputs(ignore_keys, "predict(ignore_keys=...)")
        output = self._prediction_output(test_dataset, "test_dataset", metric_key_prefix)
        self._event("on_predict", metrics=output.metrics)
        return output

    def _prediction_output(self, dataset: Any, what: str, prefix: str, module: nn.Module | None = None,
                           check: bool = True) -> PredictionOutput:
        """The one evaluation of evaluate(), predict() and the loop's evaluations: predictions, labels, and metrics
        prefixed ``prefix``: the mean loss (when the data has labels), compute_metrics' and the timings."""
        examples = self._examples(dataset, what)
        if check:
            self._check_batch(examples, what, need_labels=False)
        trainer_data.loader_draw()
        t0 = time.perf_counter()
        preds, labels, loss = self._predictions(examples, module, batches=self._eval_batches(dataset))
        seconds, n = time.perf_counter() - t0, len(examples)
        metrics: dict[str, float] = {} if loss is None else {"loss": loss}
        if self.compute_metrics is not None and labels is not None:
            metrics.update({k: _plain(v) for k, v in self._computed_metrics(preds, labels).items()})
        batches = math.ceil(n / self.args.per_device_eval_batch_size)
        metrics.update(runtime=seconds, samples_per_second=n / max(seconds, 1e-9),
                       steps_per_second=batches / max(seconds, 1e-9))
        return PredictionOutput(preds, labels, {metric_key(k, prefix): v for k, v in metrics.items()})

    def _computed_metrics(self, preds: Any, labels: Any) -> Mapping:
        returned = self.compute_metrics(EvalPrediction(preds, labels))
        if not isinstance(returned, Mapping):
            raise BertkitError(f"compute_metrics returned {type(returned).__name__} {returned!r:.80}; it must return "
                               "a dict of metric name -> number, e.g. {'accuracy': 0.91}")
        return returned

    def _eval_batches(self, dataset: Sequence) -> list[list[int]]:
        """This process's evaluation batches of ``dataset``: under torchrun every world_size-th row, in order."""
        info, size = current(), self.args.per_device_eval_batch_size
        rows = trainer_data.evaluated_rows(len(dataset), size, info.world_size, self.args.dataloader_drop_last)
        return in_order(range(info.rank, rows, info.world_size), size)

    def _predictions(self, examples: Sequence, module: nn.Module | None = None, events: bool = True,
                     batches: list[list[int]] | None = None) -> tuple[Any, Any, float | None]:
        """(logits, labels, mean loss) of every example in transformers' layout (``predictions.gather``), computed in
        ``batches`` (``_eval_batches``'), on_prediction_step after each when ``events``."""
        module = module if module is not None else self._module
        batches = batches if batches is not None else self._eval_batches(examples)
        return predictions.gather(module, examples, batches, label_names=self.label_names, collate=self._collate,
                                  forward=lambda batch: self._evaluated(module, batch, self.label_names),
                                  device=self.device, bf16=self.args.bf16,
                                  on_step=(lambda: self._event("on_prediction_step")) if events else None,
                                  weights=self._loss_weights(batches, len(examples)))

    def _loss_weights(self, batches: list[list[int]], rows: int) -> list[int] | None:
        """Each evaluation batch's weight in the mean loss; None: its rows."""
        return None

    def _evaluate_in_loop(self, module: nn.Module) -> dict[str, float]:
        self._check_outputs(self._ignore_keys_for_eval, "train(ignore_keys_for_eval=...)")  # a callback's evaluation
        return {k: v for prefix, what, dataset in self._eval_sets(self.eval_dataset, "eval")
                for k, v in self._prediction_output(dataset, what, prefix, module, check=False).metrics.items()}

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
            preds, labels, _ = self._predictions(sample, events=False)
            if labels is None and metric_key(name).startswith(f"{prefix}_"):
                why = "load_best_model_at_end compares" if self.args.load_best_model_at_end else "it is"
                raise BertkitError(
                    f"metric_for_best_model {name!r} needs labels in {what} ({why} a metric of the evaluation), but "
                    f"its batches hold {sorted(self._collate(sample[:1]))} and {type(self._module).__name__} takes "
                    f"labels as {self.label_names}: add a 'label' (or 'labels') column to {what}, or set neither "
                    "load_best_model_at_end nor metric_for_best_model")
            returned = self._computed_metrics(preds, labels) if self.compute_metrics else {}
            keys += [f"{prefix}_loss"] + [metric_key(k, prefix) for k in returned]
            best_metric_value(name, {metric_key(k, prefix): v for k, v in returned.items()}, 0)  # a number?
        if metric_key(name) not in keys:
            raise BertkitError(f"metric_for_best_model {name!r} is not a metric this run computes: evaluation "
                               f"returns {keys}; name one of them (without or with the eval_ prefix)")

    @staticmethod
    def _eval_sets(dataset: Any, prefix: str) -> list[tuple[str, str, Any]]:
        """(metric prefix, name in messages, dataset) for each evaluation set (a dict's prefixed ``eval_{name}_``)."""
        if not isinstance(dataset, Mapping):
            return [(prefix, "eval_dataset", dataset)]
        if not dataset:
            raise BertkitError("eval_dataset is an empty dict; give at least one {name: dataset}")
        return [(f"{prefix}_{name}", f"eval_dataset[{name!r}]", part) for name, part in dataset.items()]


def _plain(value: Any) -> Any:
    return value.item() if hasattr(value, "item") and getattr(value, "ndim", 1) == 0 else value
