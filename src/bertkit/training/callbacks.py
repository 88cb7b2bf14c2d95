"""What ``bertkit.Trainer`` hands back and what its callbacks see, with transformers' names and fields:
``EvalPrediction``, ``TrainOutput``, ``PredictionOutput``, ``TrainerState``, ``TrainerControl``,
``TrainerCallback`` and ``EarlyStoppingCallback``."""

from __future__ import annotations

import dataclasses
import json
import math
import numbers
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from bertkit.errors import BertkitError
from bertkit.outputs import atomic_write_text


class EvalPrediction:
    """What ``compute_metrics`` receives: ``predictions`` (logits, numpy) and ``label_ids``; unpacks as a pair, with
    ``inputs`` and ``losses`` after them when given (transformers 5's fields, which the Trainer fills as
    ``include_for_metrics`` asks)."""

    def __init__(self, predictions: Any, label_ids: Any, inputs: Any = None, losses: Any = None):
        self.predictions, self.label_ids, self.inputs, self.losses = predictions, label_ids, inputs, losses

    def __iter__(self):
        return iter((self.predictions, self.label_ids, *(x for x in (self.inputs, self.losses) if x is not None)))

    def __getitem__(self, i: int) -> Any:
        return tuple(self)[i]


class TrainOutput(NamedTuple):
    global_step: int
    training_loss: float
    metrics: dict[str, float]


class PredictionOutput(NamedTuple):
    predictions: Any
    label_ids: Any
    metrics: dict[str, float] | None


@dataclass
class TrainerState:
    epoch: float = 0
    global_step: int = 0
    max_steps: int = 0
    num_train_epochs: float = 0
    logging_steps: int = 500  # the run's cadences in steps (a share of the run resolved), as transformers states them
    eval_steps: int = 500
    save_steps: int = 500
    train_batch_size: int | None = None
    num_input_tokens_seen: int = 0
    """The training batches' input tokens so far, counted with include_num_input_tokens_seen (0 without)."""
    log_history: list[dict[str, float]] = field(default_factory=list)
    best_metric: float | None = None
    best_global_step: int | None = None
    best_model_checkpoint: str | None = None
    is_local_process_zero: bool = True
    is_world_process_zero: bool = True
    stateful_callbacks: dict[str, Any] = field(default_factory=dict)
    """Each callback's ``state()`` by class name (a list for several of one class), as transformers records it: a
    resumed run restores them (``restore_callback_states``)."""

    def save_to_json(self, json_path: str | Path) -> None:
        """The state as transformers' ``TrainerState.save_to_json`` writes it (indented, keys sorted)."""
        atomic_write_text(Path(json_path), json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True) + "\n")


@dataclass
class TrainerControl:
    should_training_stop: bool = False
    should_epoch_stop: bool = False
    should_save: bool = False
    should_evaluate: bool = False
    should_log: bool = False


class TrainerCallback:
    """Subclass and override the events you need; each gets ``(args, state, control, **kwargs)`` (kwargs: model,
    processing_class; metrics for on_evaluate and on_predict, logs for on_log) where transformers' Trainer calls it,
    and may set ``control``'s flags (or return a ``TrainerControl``). Not called: on_push_begin."""

    def on_init_end(self, args, state, control, **kwargs): pass
    def on_train_begin(self, args, state, control, **kwargs): pass
    def on_train_end(self, args, state, control, **kwargs): pass
    def on_epoch_begin(self, args, state, control, **kwargs): pass
    def on_epoch_end(self, args, state, control, **kwargs): pass
    def on_step_begin(self, args, state, control, **kwargs): pass
    def on_pre_optimizer_step(self, args, state, control, **kwargs): pass
    def on_optimizer_step(self, args, state, control, **kwargs): pass
    def on_substep_end(self, args, state, control, **kwargs): pass
    def on_step_end(self, args, state, control, **kwargs): pass
    def on_evaluate(self, args, state, control, **kwargs): pass
    def on_predict(self, args, state, control, **kwargs): pass
    def on_prediction_step(self, args, state, control, **kwargs): pass
    def on_save(self, args, state, control, **kwargs): pass
    def on_log(self, args, state, control, **kwargs): pass


class EarlyStoppingCallback(TrainerCallback):
    """Stop when ``metric_for_best_model`` has not improved by more than ``early_stopping_threshold`` for
    ``early_stopping_patience`` evaluations (transformers' rule)."""

    def __init__(self, early_stopping_patience: int = 1, early_stopping_threshold: float = 0.0):
        self.early_stopping_patience = early_stopping_patience
        self.early_stopping_threshold = early_stopping_threshold
        self.early_stopping_patience_counter = 0

    def on_train_begin(self, args, state, control, **kwargs):
        if args.metric_for_best_model is None:
            raise BertkitError("EarlyStoppingCallback needs metric_for_best_model (or load_best_model_at_end=True, "
                               "which defaults it to the evaluation loss)")
        if args.eval_strategy == "no":
            raise BertkitError("EarlyStoppingCallback needs evaluations: set eval_strategy to 'steps' or 'epoch'")

    def state(self) -> dict[str, Any]:
        """What a checkpoint records of this callback (transformers' ``ExportableState``): the evaluations without an
        improvement so far count on after a resume, so the resumed run stops where the uninterrupted one stops."""
        return {"args": {"early_stopping_patience": self.early_stopping_patience,
                         "early_stopping_threshold": self.early_stopping_threshold},
                "attributes": {"early_stopping_patience_counter": self.early_stopping_patience_counter}}

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        value = best_metric_value(args.metric_for_best_model, metrics or {}, state.global_step)
        if value is None:
            return
        better = np.greater if args.greater_is_better else np.less
        improved = math.isfinite(value) and (  # a NaN or inf never improves (nor is the best: the Trainer skips it)
            state.best_metric is None
            or (better(value, state.best_metric) and abs(value - state.best_metric) > self.early_stopping_threshold))
        self.early_stopping_patience_counter = 0 if improved else self.early_stopping_patience_counter + 1
        if self.early_stopping_patience_counter >= self.early_stopping_patience:
            control.should_training_stop = True


def callback_states(callbacks: list[TrainerCallback], control: TrainerControl) -> dict[str, Any]:
    """The ``state()`` of each callback that has one, by class name (a list for several of one class), and
    ``control``'s flags as the ``TrainerControl`` entry, as transformers writes ``stateful_callbacks`` into a
    checkpoint's trainer_state.json (its Trainer, resuming a checkpoint without the entry, stopped at its first save
    with a KeyError): ``should_save`` set, as it is while transformers writes the checkpoint (bertkit's loop has
    cleared it by then)."""
    flags = {**dataclasses.asdict(control), "should_save": True}
    states: dict[str, list[dict]] = {"TrainerControl": [{"args": flags, "attributes": {}}]}
    for callback in callbacks:
        if callable(getattr(callback, "state", None)):
            states.setdefault(type(callback).__name__, []).append(callback.state())
    return {name: found[0] if len(found) == 1 else found for name, found in states.items()}


def restore_callback_states(callbacks: list[TrainerCallback], saved: dict[str, Any]) -> None:
    """Set each callback's recorded attributes (``callback_states``) back, matching by class name and, for several
    of one class, by order. Its arguments stay the ones this run gave it. transformers restores them only with
    ``restore_callback_states_from_checkpoint=True``; without them an EarlyStoppingCallback counted its patience
    from 0 again at each resume, and the resumed run trained past the step where the uninterrupted one stopped."""
    for name, states in saved.items():
        same = [c for c in callbacks if type(c).__name__ == name and callable(getattr(c, "state", None))]
        for callback, state in zip(same, states if isinstance(states, list) else [states]):
            for attribute, value in state.get("attributes", {}).items():
                setattr(callback, attribute, value)


def metric_key(name: str, prefix: str = "eval") -> str:
    """``accuracy`` and ``eval_accuracy`` both name the evaluation's ``eval_accuracy`` (as in transformers): a metric's
    name under ``prefix_``, unless it is there already."""
    return name if name.startswith(f"{prefix}_") else f"{prefix}_{name}"


def best_metric_value(name: str, metrics: dict[str, Any], step: int) -> float | None:
    """The value of ``metric_for_best_model`` (``name``) in an evaluation's ``metrics`` as a float, None when they do
    not hold it. A value that is not a number (a string, a list from ``compute_metrics``) is refused naming it: numpy
    failed on it with a TypeError in the middle of training, in transformers too."""
    key = metric_key(name)
    if key not in metrics:
        return None
    value = metrics[key]
    if isinstance(value, np.ndarray) and value.size == 1:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise BertkitError(f"metric_for_best_model {name!r} is {type(value).__name__} {str(value)[:40]!r} at step "
                           f"{step}, which is not a number to compare: return it from compute_metrics as a float, or "
                           "name another metric")
    return float(value)
