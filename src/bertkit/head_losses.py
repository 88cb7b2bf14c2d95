"""The heads' labels and losses: label checks that name the value, the token loss (transformers' values, with
num_items_in_batch) and the masked-LM rows scored with labels, eagerly and in a compiled graph."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from bertkit.errors import BertkitError
from bertkit.modeling import BertModelOutput
from bertkit.padding import is_tracing, under_vmap

IGNORE_INDEX = -100  # label value for positions that carry no loss (unmasked MLM tokens, sub-word pieces)


def integer_ids(ids: Tensor, name: str, what: str, hint: str = "") -> Tensor:
    """``ids`` (class ids, token positions) as int64, from any integer dtype; a float, complex or bool tensor is
    refused naming ``name`` (torch's losses and indexing take int64 alone, and would fail or round without a word)."""
    if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
        raise BertkitError(f"{name} must hold {what} (an integer tensor), got dtype {ids.dtype}{hint}")
    return ids.long()


def check_class_labels(labels: Tensor, num_classes: int, name: str = "labels", fix: str | None = None) -> Tensor:
    """``labels`` as int64, once each is a class id in [0, num_classes) or -100 (no loss): anything else is refused
    naming the value, instead of torch's "Target 5 is out of bounds" from inside the loss. Any integer dtype is
    taken (int32 ids from numpy or a tokenizer's ``return_tensors="np"``: torch's loss takes int64 alone)."""
    labels = integer_ids(labels, name, "class ids", "; a float label is a regression target (problem_type="
                         "'regression' with num_labels=1)")
    if not is_tracing() and labels.numel():
        bad = (labels != IGNORE_INDEX) & ((labels < 0) | (labels >= num_classes))
        if bool(bad.any()):
            value = int(labels[bad][0])
            raise BertkitError(f"{name} holds {value}, but this head has {num_classes} classes (ids 0 to "
                               f"{num_classes - 1}, or {IGNORE_INDEX} for no loss): " + (
                                   fix or f"map the labels to ids below {num_classes}, or give the model num_labels "
                                   "(and id2label) for every class"))
    return labels


def float_targets(labels: Tensor, logits: Tensor) -> Tensor:
    """Regression and soft targets as the loss reads them: a float tensor kept at its own precision, so torch
    computes the loss in the wider of the two dtypes, as transformers' losses do (STS-B's score 3.8 is not rounded
    to 3.796875 against a bf16 model's logits, nor the loss to bf16); integer targets take the logits' dtype."""
    return labels if labels.is_floating_point() else labels.to(logits.dtype)


def token_loss(logits: Tensor, target: Tensor, num_items_in_batch: Tensor | float | None,
               fix: str | None = None) -> tuple[Tensor, Tensor]:
    """(mean cross-entropy over the targets not -100, the loss to optimise).

    The second is the mean too, unless ``num_items_in_batch`` (transformers' name: the targets of the whole
    global batch) is given: then it is this batch's sum over that count, so every token of the global batch
    weighs the same however micro-batches and processes split it. ``fix`` says how to repair a target out of
    range (``check_class_labels``)."""
    target = check_class_labels(target, logits.shape[-1], fix=fix)
    if logits.dtype in (torch.float16, torch.bfloat16):
        # A sum rounded to bf16 is off by up to half its last place (4 at a sum of 1,400: a bf16 masked LM's loss
        # read 10.6875 where the exact one is 10.739): the per-token losses are summed in float32 and the results
        # rounded once, to the bf16 number nearest the exact loss (transformers' bf16 mean is within a place of it).
        losses = F.cross_entropy(logits, target, ignore_index=IGNORE_INDEX, reduction="none")  # (N,)
        dtype, total = losses.dtype, losses.float().sum()  # losses.dtype: float32 under autocast, as before
    else:
        dtype, total = logits.dtype, F.cross_entropy(logits, target, ignore_index=IGNORE_INDEX, reduction="sum")
    # The count stays on the device (no read back: it would stall a GPU's queue and break a compiled graph). With no
    # labelled token the mean is 0 / 0, NaN, as transformers' (a mean over nothing is no score: the training loop
    # names such a batch); the objective over a step's count is 0 there, as transformers' num_items_in_batch loss.
    mean = total / (target != IGNORE_INDEX).sum()
    objective = mean if num_items_in_batch is None else total / num_items_in_batch
    return mean.to(dtype), objective.to(dtype)


def check_token_labels(labels: Tensor, out: BertModelOutput) -> None:
    """Token labels hold one label per input token, in any shape (transformers flattens them): a label more or less
    would be read against other tokens than its own, and still give a loss."""
    B, T = out.token_layout.batch_shape
    if labels.numel() != B * T:
        raise BertkitError(f"labels of shape {tuple(labels.shape)} for inputs of shape ({B}, {T}): give one label per "
                           "input token (-100 where none applies)")


def masked_lm_loss(head: nn.Module, out: BertModelOutput, labels: Tensor | None,
                   num_items_in_batch: Tensor | float | None = None, max_predictions_per_seq: int | None = None):
    """(logits, mean loss, loss to optimise): full (B, T, V) logits without labels; only the labelled positions'
    (N, V) with them (``masked_lm_rows``)."""
    hidden, target = masked_lm_rows(out, labels, max_predictions_per_seq)
    return masked_lm_scores(head(hidden), target, num_items_in_batch)


def masked_lm_rows(out: BertModelOutput, labels: Tensor | None,
                   max_predictions_per_seq: int | None = None) -> tuple[Tensor, Tensor | None]:
    """(the token states the masked-LM head scores, their target ids): all (B, T, H) without labels, the labelled
    positions' (N, H) with them; traced (torch.compile, torch.export), a fixed B * ``max_predictions_per_seq``
    rows (``_fixed_rows``)."""
    if labels is None:
        return out.last_hidden_state, None
    check_token_labels(labels, out)
    # int64 before comparing with -100: in a uint8 tensor the scalar -100 is read as 156, so the id 156 was dropped
    labels = integer_ids(labels, "labels", "vocabulary ids")
    if is_tracing():
        return _fixed_rows(out, labels, max_predictions_per_seq)
    selected = labels != IGNORE_INDEX  # (B, T)
    hidden = out.token_layout.select(out.tokens, selected)  # (N, H)
    target = labels[selected]
    if hidden.shape[0] != target.numel():
        raise BertkitError("masked-LM labels at padding positions must be -100 (nothing is predicted there)")
    return hidden, target


def _fixed_rows(out: BertModelOutput, labels: Tensor, max_predictions_per_seq: int | None) -> tuple[Tensor, Tensor]:
    """``masked_lm_rows`` where shapes must not depend on values (a compiled graph): the labelled positions' count N
    is known only on the device, and reading it back (or ``nonzero``'s N-row result) stalls a GPU's queue and breaks
    ``fullgraph=True``. So K = B * min(T, max_predictions_per_seq) rows are scored (None: B * T, every position,
    transformers' cost: the V-wide GEMM on ~6.7x the rows at 15% masking; the paper's 20 at T=128: 1.04x). The
    labelled positions come first, in row-major order as eagerly; the rows after them carry target -100, so the
    loss is the eager one. More than K labels is refused on the device (``_assert_async``), never dropped."""
    B, T = out.token_layout.batch_shape
    flat = labels.reshape(-1)  # (B*T,)
    selected = flat != IGNORE_INDEX
    # Under vmap (per-example gradients) every position: a device-side check has no batching rule there. (Asked
    # outside a compiled graph alone: dynamo cannot trace functorch's interpreter stack.)
    compiling = torch.compiler.is_compiling() or torch.compiler.is_exporting()
    bounded = max_predictions_per_seq is not None and (compiling or not under_vmap())
    k = B * min(T, max_predictions_per_seq) if bounded else B * T
    if k < B * T:
        torch._assert_async(selected.sum() <= k, f"more masked-LM labels than max_predictions_per_seq "
                            f"{max_predictions_per_seq} per sequence allow ({k} rows for {B} sequences): raise "
                            "model.max_predictions_per_seq to the data's, or set it to None to score every position")
    order = torch.argsort((~selected).to(torch.uint8), stable=True)[:k]  # (K,) labelled positions first
    hidden = out.last_hidden_state.reshape(B * T, -1).index_select(0, order)  # (K, H)
    return hidden, flat.index_select(0, order)


def masked_lm_scores(logits: Tensor, target: Tensor | None, num_items_in_batch: Tensor | float | None = None):
    """(logits, mean loss, loss to optimise) of ``masked_lm_rows``' scores; no loss without a target."""
    if target is None:
        return logits, None, None
    fix = (f"masked-LM labels are ids of the model's vocabulary (vocab_size {logits.shape[-1]}): tokenize with the "
           "model's own tokenizer, whose vocabulary the config's vocab_size counts")
    return (logits, *token_loss(logits, target, num_items_in_batch, fix))
