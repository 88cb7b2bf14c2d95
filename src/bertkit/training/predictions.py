"""A model's outputs over a dataset in transformers' prediction layout: what ``Trainer.predict``, ``evaluate`` and
``compute_metrics`` see (rows in the dataset's order, token tasks padded with -100 to one length, a masked-LM's
logits at every position), with the labels and the mean loss.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from bertkit.compat import TupleAccess
from bertkit.errors import BertkitError
from bertkit.inference.runner import evaluate, finite_enough

# the output fields predictions are made of, in transformers' order (a masked-LM's prediction_logits is its logits)
FIELDS = ("logits", "start_logits", "end_logits", "prediction_logits", "seq_relationship_logits")


@dataclass
class Part:
    """One evaluation batch's results, on the CPU: its dataset rows, its prediction arrays (the output fields, or
    what ``preprocess`` made of them), its label arrays (one per label name), its main input (``input_ids``, when
    asked for), its loss, and the collated batch itself (when asked for)."""

    rows: list[int]
    outputs: list[np.ndarray]
    labels: list[np.ndarray]
    inputs: np.ndarray | None
    loss: float | None
    batch: dict | None = None
    step: int = 0  # its place among its process's batches: under torchrun, the k-th batches are one step
    # False where the loss is not finite and neither are the outputs (NaN logits): the model's, not a batch's lack of
    # labels, so the mean loss keeps it
    loss_unscored: bool = True


def run(module: nn.Module, examples: Sequence, batches: list[list[int]], *, label_names: Sequence[str],
        collate: Callable[[list], dict], device: str, bf16: bool, forward: Callable[[dict], tuple[Any, Any]],
        on_step: Callable[[], None] | None = None, preprocess: Callable | None = None,
        inputs_name: str | None = None, keep_batch: bool = False, ignore_keys: Sequence[str] = ()) -> list[Part]:
    """A ``Part`` for each of ``batches`` (this process's), computed by ``forward`` (a batch's loss and ``module``'s
    outputs); under torchrun every rank gets every rank's parts back, rank by rank. ``preprocess(logits, labels)``:
    transformers' ``preprocess_logits_for_metrics``, on the batch's tensors (a tuple for several outputs or labels)
    before they leave the device. ``on_step`` after each batch. The predictions are bertkit's heads' ``FIELDS``;
    for a custom model's ModelOutput (a dict), every output but the loss and ``ignore_keys``, as transformers'
    prediction_step takes them."""

    made_parts: list[Part] = []  # this process's, so far

    def step(batch: dict, rows: list) -> Part:
        kept = {k: v.cpu() for k, v in batch.items() if isinstance(v, torch.Tensor)} if keep_batch else None
        label_tensors = [batch[k] for k in label_names if k in batch]  # before a loss that pops them
        inputs = batch[inputs_name].cpu().numpy() if inputs_name is not None and inputs_name in batch else None
        mlm_labels = batch.get("labels")
        loss, out = forward(batch)
        fields = _fields(out, ignore_keys)
        if not fields and not hasattr(out, "loss"):  # a tuple or dict: read by name, it would give no predictions
            raise unreadable(module, out)
        if (mlm := getattr(out, "prediction_logits", None)) is not None and mlm_labels is not None:
            fields = [_at_every_token(f, mlm_labels) if f is mlm else f for f in fields]
        if preprocess is not None and fields:
            made = preprocess(_one_or_tuple(fields), _one_or_tuple(label_tensors) if label_tensors else None)
            arrays = [_numpy(t) for t in (made if isinstance(made, (tuple, list)) else (made,))]
        else:
            arrays = [f.float().cpu().numpy() for f in fields]
        value = None if loss is None else float(loss)
        # a loss that is not finite is looked into (the outputs as they left the model, before ``preprocess``): finite
        # outputs there are a batch with no label to score (0 / 0), others (or none to look at: a sentence loss's
        # embeddings stay inside it) the model's own NaN
        unscored = value is None or math.isfinite(value) or (
            bool(fields) and all(finite_enough(f.float().cpu().numpy()) for f in fields))
        part = Part([], arrays, [t.cpu().numpy() for t in label_tensors], inputs, value, kept, step=len(made_parts),
                    loss_unscored=unscored)
        made_parts.append(part)
        if on_step is not None:
            on_step()
        return part

    done = evaluate(step, examples, batches, pad=collate, device=device, bf16=bf16, model=module, gather=True)
    for idx, part in done:  # (``step`` is given the examples, not their indices)
        part.rows = list(idx)
    return [part for _, part in done]


def joined(parts: Sequence[Part], what: str) -> Any:
    """The ``what`` arrays ("outputs", "labels" or "inputs") of ``parts`` concatenated in the dataset's order (token
    tasks' batches padded with -100 to one length); one array, a tuple of them, or None when the parts have none."""
    order = np.argsort(np.asarray([i for p in parts for i in p.rows], dtype=np.int64), kind="stable")
    columns = [getattr(p, what) for p in parts]
    columns = [[c] if isinstance(c, np.ndarray) else c for c in columns if c is not None and len(c)]
    if not columns or len(columns) != len(parts):
        return None
    arrays = [_concat([c[j] for c in columns])[order] for j in range(len(columns[0]))]
    return arrays[0] if len(arrays) == 1 else tuple(arrays)


def mean_loss(parts: Sequence[Part], weights: Sequence[int] | None = None) -> float | None:
    """The batches' losses, each weighed by its rows or by ``weights`` (one a part); None when no batch had one. A
    batch whose loss is not finite while its outputs are (a token loss over a batch with no label: 0 / 0) is left out
    while another's is finite, as transformers' logging_nan_inf_filter (bertkit's only setting) leaves it out of
    eval_loss. One whose outputs are not finite either (NaN logits; or no outputs to look at, a sentence loss's) is
    kept, so the mean is NaN: left out, as transformers' filter leaves out any, a model whose outputs were NaN on part
    of the set got a finite eval_loss, and load_best_model_at_end's default metric could pick it."""
    weights = weights if weights is not None else [len(p.rows) for p in parts]
    losses = [(p.loss, w, p.loss_unscored) for p, w in zip(parts, weights) if p.loss is not None]
    if any(math.isfinite(v) for v, _, _ in losses):
        losses = [(v, w, u) for v, w, u in losses if math.isfinite(v) or not u]
    return sum(v * w for v, w, _ in losses) / sum(w for _, w, _ in losses) if losses else None


def _fields(out: Any, ignore_keys: Sequence[str]) -> list[torch.Tensor]:
    """The prediction tensors of a batch's outputs: a bertkit head's FIELDS, in transformers' order (each once: a
    masked LM's prediction_logits is its logits); a custom model's ModelOutput, each value but the loss and
    ``ignore_keys``, in its order (transformers hands over (logits, embedding) where bertkit took the logits alone,
    and a compute_metrics reading predictions[0] got the first row)."""
    if isinstance(out, Mapping) and not isinstance(out, TupleAccess) and hasattr(out, "loss"):
        fields = {k: v for k, v in out.items() if k != "loss" and k not in ignore_keys and v is not None}
        odd = [k for k, v in fields.items() if not isinstance(v, torch.Tensor)]
        if odd:
            raise BertkitError(f"the model's outputs {odd} are {[type(fields[k]).__name__ for k in odd]}, not "
                               "tensors, and the Trainer hands every output but the loss to predict() and "
                               f"compute_metrics, as transformers does: pass ignore_keys={odd} to evaluate() and "
                               "predict() (train(ignore_keys_for_eval=...) for the evaluations during training)")
        return list(fields.values())
    fields = [getattr(out, f) for f in FIELDS if getattr(out, f, None) is not None]
    return list({id(f): f for f in fields}.values())


def unreadable(module: nn.Module, out: Any) -> BertkitError:
    """The error for outputs the Trainer cannot read by name (a tuple or a dict)."""
    return BertkitError(
        f"{type(module).__name__}'s outputs are a {type(out).__name__} (what its forward returned, or a compute_loss "
        f"override as its outputs), and the Trainer reads a model's outputs by name (loss, and predictions from "
        f"{', '.join(FIELDS)}): return an object with them as attributes (a dataclass, or transformers' ModelOutput), "
        "as bertkit's and transformers' heads do")


def _at_every_token(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """A masked-LM head given labels returns the labelled positions' logits alone, (N, V) row-major (heads.py);
    transformers' predictions are (B, T, V), as the labels (B, T) they are scored against: each row goes back to its
    position, zeros at the unlabelled ones (which a metric leaves out with the -100 labels)."""
    if logits.ndim != 2 or labels.ndim != 2:
        return logits
    full = logits.new_zeros(*labels.shape, logits.shape[-1])  # (B, T, V)
    full[labels != -100] = logits
    return full


def _one_or_tuple(tensors: list[torch.Tensor]) -> Any:
    return tensors[0] if len(tensors) == 1 else tuple(tensors)


def _numpy(value: Any) -> np.ndarray:
    """What preprocess_logits_for_metrics returned, as numpy: a tensor in its own dtype (bf16 read as float32)."""
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu()
        return (value.float() if value.dtype == torch.bfloat16 else value).numpy()
    return np.asarray(value)


def _concat(parts: list[np.ndarray]) -> np.ndarray:
    if all(p.shape[1:] == parts[0].shape[1:] for p in parts):
        return np.concatenate(parts)
    width = max(p.shape[1] for p in parts)  # token tasks: batches padded to different lengths
    return np.concatenate([np.pad(p, [(0, 0), (0, width - p.shape[1])] + [(0, 0)] * (p.ndim - 2),
                                  constant_values=-100) for p in parts])
