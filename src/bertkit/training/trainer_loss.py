"""What the Trainer's ``compute_loss`` needs beside the model: transformers' count of a batch's labelled items
(``num_items_in_batch``) and its ``LabelSmoother`` (``label_smoothing_factor``), with the same numbers; and, as each
training micro-batch goes to the loss, its input tokens (``include_num_input_tokens_seen``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from bertkit.errors import BertkitError
from bertkit.heads import IGNORE_INDEX
from bertkit.training.batch_plan import Batch
from bertkit.training.predictions import unreadable
from bertkit.training.token_loss import labelled_items, model_loss
from bertkit.training.tokens_seen import input_tokens


class LabelSmoother:
    """transformers' ``LabelSmoother`` (trainer_pt_utils): (1 - epsilon) x the negative log-likelihood of the label +
    epsilon x the mean over the classes, summed over the labelled positions (-100 left out) and divided by
    ``num_items_in_batch``, or without it by this batch's labelled positions."""

    def __init__(self, epsilon: float):
        self.epsilon = epsilon

    def __call__(self, outputs: Any, labels: Tensor, num_items_in_batch: Tensor | float | None = None) -> Tensor:
        logits = outputs.get("logits") if isinstance(outputs, Mapping) else getattr(outputs, "logits", None)
        if logits is None:
            raise BertkitError(
                f"label_smoothing_factor smooths the model's logits, and its {type(outputs).__name__} has none (a "
                "pre-training head's are prediction_logits; transformers' Trainer fails there too): drop "
                "label_smoothing_factor, or compute the loss in a compute_loss override")
        log_probs = -nn.functional.log_softmax(logits, dim=-1)
        if labels.dim() == log_probs.dim() - 1:
            labels = labels.unsqueeze(-1)
        padding = labels.eq(IGNORE_INDEX)
        labels = torch.clamp(labels, min=0)  # -100 cannot be gathered; its terms are zeroed below
        nll = log_probs.gather(dim=-1, index=labels)
        smoothed = log_probs.sum(dim=-1, keepdim=True, dtype=torch.float32)
        nll.masked_fill_(padding, 0.0)
        smoothed.masked_fill_(padding, 0.0)
        if num_items_in_batch is None:
            denominator = padding.numel() - padding.long().sum()
        elif torch.is_tensor(num_items_in_batch):
            denominator = num_items_in_batch.to(nll.device)
        else:
            denominator = num_items_in_batch
        nll = nll.sum() / denominator
        smoothed = smoothed.sum() / (denominator * log_probs.shape[-1])
        return (1 - self.epsilon) * nll + self.epsilon * smoothed


def label_smoother(factor: float, model: nn.Module, forward_args: Mapping[str, Any]) -> LabelSmoother | None:
    """The smoother for ``label_smoothing_factor`` (None at 0), refusing the models whose labels it cannot smooth:
    transformers' Trainer drops it for a multi-label classifier (with a warning), never applies it to a model that
    takes no ``labels`` (question answering: ``start_positions``), and fails on a regression's float labels."""
    if factor == 0:
        return None
    name, config = type(model).__name__, getattr(model, "config", None)
    problem = getattr(config, "problem_type", None)
    why = ("takes no 'labels' argument (the smoother smooths the 'labels' column's classes), so it would change "
           "nothing" if "labels" not in forward_args
           else "is a multi-label classifier (transformers' Trainer drops the smoothing for it, with a warning)"
           if problem == "multi_label_classification"
           else "has one output (a regression, or one class): there is no class to smooth over"
           if problem == "regression" or getattr(config, "num_labels", 2) == 1 else None)
    if why is not None:
        raise BertkitError(f"label_smoothing_factor {factor}: {name} {why}; drop label_smoothing_factor")
    return LabelSmoother(factor)


class TrainerLoss:
    """The Trainer's loss as transformers' Trainer computes it: ``compute_loss`` (which a subclass overrides for a
    custom loss), called by training for each micro-batch and by evaluation for each batch with labels, with
    transformers' ``num_items_in_batch`` and its rule for dividing by the accumulation steps."""

    # transformers' switch: whether compute_loss's loss is normalised over the step's num_items_in_batch (True: used as
    # it is) or a per-batch mean (False: divided by the step's micro-batches); None: True when num_items_in_batch was
    # counted, i.e. when ``model_accepts_loss_kwargs``
    loss_is_scaled_for_ga: bool | None = None
    label_smoother: LabelSmoother | None = None
    # transformers' name: whether the loss honours num_items_in_batch, which is then counted (the step's labels that are
    # not -100, every micro-batch's) and passed. Set in Trainer.__init__: for bertkit's own loss, whether the model's
    # forward takes it (the token heads) or the labels are smoothed; for an overriding compute_loss True, as
    # transformers' Trainer has it for every BERT head (their forward takes **kwargs)
    model_accepts_loss_kwargs: bool = False
    _takes_num_items = False  # the model's forward takes num_items_in_batch
    _custom_loss = "a custom loss goes in a compute_loss override (bertkit calls it as transformers does)"

    def _set_up_loss(self, model: nn.Module, forward_args: Mapping[str, Any]) -> None:
        self.label_smoother = label_smoother(self.args.label_smoothing_factor, model, forward_args)
        self._takes_num_items = "num_items_in_batch" in forward_args
        self.model_accepts_loss_kwargs = (self._takes_num_items or self.label_smoother is not None
                                          or type(self).compute_loss is not TrainerLoss.compute_loss)

    def compute_loss(self, model: nn.Module, inputs: dict[str, Any], return_outputs: bool = False,
                     num_items_in_batch: Tensor | None = None) -> Tensor | tuple[Tensor, Any]:
        """transformers' ``Trainer.compute_loss``: the model's own loss (its forward given ``num_items_in_batch``
        when it takes it), or with ``label_smoothing_factor`` the label-smoothed loss of its logits; with
        ``return_outputs`` also the model's outputs, which evaluation takes its predictions from."""
        labels = None
        if self.label_smoother is not None and "labels" in inputs:
            inputs = dict(inputs)
            labels = inputs.pop("labels")
        _, outputs, _ = model_loss(model, inputs, num_items_in_batch if self._takes_num_items else None)
        if not hasattr(outputs, "loss"):
            raise unreadable(model, outputs)
        loss = outputs.loss if labels is None else self.label_smoother(outputs, labels, num_items_in_batch)
        return (loss, outputs) if return_outputs else loss

    def _count_items(self, batch: Batch) -> int | None:
        """A micro-batch's share of num_items_in_batch, counted as transformers counts it when the loss takes it."""
        return labelled_items(batch) if self.model_accepts_loss_kwargs else None

    def _training_loss(self, module: nn.Module, batch: Batch, num_items: float | None) -> tuple[Tensor, Any, bool]:
        """The loop's loss (``LoopHooks.compute_loss``): compute_loss, called as transformers' training_step calls it
        (bertkit's own with the outputs too, for a pre-training head's next-sentence part), and whether it is
        normalised over the step, transformers' rule: not when loss_is_scaled_for_ga says so, or nothing was counted
        (then the loop divides it by the step's micro-batches)."""
        own = type(self).compute_loss is TrainerLoss.compute_loss
        # transformers passes the count as a 0-dim float tensor
        count = None if num_items is None else torch.tensor(num_items, dtype=torch.float32)
        got = self.compute_loss(module, batch, return_outputs=own, num_items_in_batch=count)
        loss, out = got if own else (got, None)
        scaled = self.loss_is_scaled_for_ga
        return loss, out, num_items is not None if scaled is None else scaled

    def _counted_loss(self, module: nn.Module, batch: Batch, num_items: float | None) -> tuple[Tensor, Any, bool]:
        """The loop's loss (``_training_loss``), each micro-batch's input tokens counted into
        ``state.num_input_tokens_seen`` first with include_num_input_tokens_seen, as transformers counts them."""
        how = self.args.include_num_input_tokens_seen
        if how != "no":
            count = input_tokens(batch, how, getattr(self.model, "main_input_name", "input_ids"),
                                 getattr(self.processing_class, "pad_token_id", None), self.device)
            self.state.num_input_tokens_seen += count or 0
        return self._training_loss(module, batch, num_items)

    def _evaluated(self, module: nn.Module, batch: Batch, label_names: list[str]) -> tuple[Tensor | None, Any]:
        """An evaluation batch's (loss, outputs): compute_loss's, given the batch's own num_items_in_batch, when the
        batch holds every label, as transformers' prediction_step; else the model's outputs alone."""
        if not label_names or any(batch.get(k) is None for k in label_names):
            out = module(**batch)
            return getattr(out, "loss", None), out
        # a batch with no labelled token has a loss of 0 / 0, NaN, as transformers' (eval_loss leaves it out)
        count = self._count_items(batch)
        return self.compute_loss(module, batch, return_outputs=True, num_items_in_batch=None if count is None
                                 else torch.tensor(float(count)))
