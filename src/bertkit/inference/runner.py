"""The one evaluation loop: prediction, evaluation (``Trainer``, pre-training, the feature study), pipelines and
feature extraction all run their rows here (``evaluate``), batched by length when asked (``run_length_sorted``).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from bertkit.errors import NonFiniteError
from bertkit.padding import moved
from bertkit.training.distributed import all_gather, current

# What a caller gives: rows -> the model's input tensors; (batch, rows) -> what the caller keeps of one batch (one
# array per row, or the batch's sums).
Pad = Callable[[Sequence[Any]], Mapping[str, Tensor]]
Call = Callable[[dict[str, Tensor], Sequence[Any]], Any]


def readable(x: Tensor) -> Tensor:
    """A model output as scores are computed from it: float32 for bf16/fp16 (no score carries their rounding), and a
    float32 or float64 model's in its own dtype, as transformers' pipelines read a float64 model's (casting it to
    float32 moved its scores about 1e-8 from theirs)."""
    return x if x.dtype == torch.float64 else x.float()


def plan_batches(lengths: Mapping[int, int] | Sequence[int], batch_size: int, *, indices: Sequence[int] | None = None,
                 longest_first: bool = False, groups: Sequence[Any] | None = None) -> list[list[int]]:
    """``indices`` (default: all) sorted by length, stably, and cut every ``batch_size`` rows.

    ``longest_first``: the first batch is the largest, so running out of memory shows at once. ``groups``: rows of
    different groups (multiple-choice rows with different numbers of choices; embedding rows whose pooling leaves
    out prompts of different lengths) are sorted apart and never share a batch. The plan depends only on the lengths, so every process of a distributed run computes the same one.
    """
    indices = range(len(lengths)) if indices is None else indices
    sign = -1 if longest_first else 1
    order = sorted(indices, key=lambda i: (groups[i] if groups is not None else 0, sign * lengths[i]))
    batches: list[list[int]] = []
    for i in order:
        if not batches or len(batches[-1]) >= batch_size or (groups is not None and groups[i] != groups[batches[-1][0]]):
            batches.append([])
        batches[-1].append(i)
    return batches


def in_order(indices: Sequence[int], batch_size: int) -> list[list[int]]:
    """``indices`` cut every ``batch_size`` rows, in their order."""
    return [list(indices[i:i + batch_size]) for i in range(0, len(indices), batch_size)]


def longest_first(items: Sequence[Any], batch_size: int, prepare: Callable[[list[Any]], Mapping[str, Any]],
                  device: str | torch.device, progress: bool = False, length: Callable[[Any], int] = len
                  ) -> Iterator[dict[str, Any]]:
    """``prepare`` of ``items`` in batches of ``batch_size``, longest first (similar lengths together, and the
    largest batch first, so running out of memory shows at once); each batch with ``rows`` (B,), its items'
    positions in ``items`` on ``device``, the rest on the host. A progress bar over the batches with ``progress``.

    Each batch is prepared (tokenized) when the caller asks for it, after it queued the previous one's work: a
    model takes a batch on the host and queues its kernels without waiting for the GPU (``token_layout``), so on a
    GPU the next batch is tokenized while the device computes this one. fp32 on an H100 (encode / predict, the
    ratio to sentence-transformers): 1.40x / 1.20x this way; 1.29x / 1.17x with a thread tokenizing ahead (it held
    the interpreter, and the thread driving the GPU waited for it between its calls); 1.27x / 1.06x with 4 loader
    processes and 1.24x / 1.10x with 2 (forking them costs more than they save at 2,000 texts)."""
    from bertkit.progress import progress_bar

    # numpy's default sort, as sentence-transformers batches: not stable past 16 items, and stably sorted, items of
    # one length met other batches, so that copies of a text scored a float32 step apart and ranked in another order
    order = np.argsort([-length(x) for x in items])
    batches = [order[start:start + batch_size] for start in range(0, len(items), batch_size)]
    device = torch.device(device)
    for rows in progress_bar(batches, desc="Batches", enabled=progress):
        yield {**prepare([items[i] for i in rows]), "rows": moved(torch.as_tensor(rows), device)}


class _EvalCalls:
    """The inference calls under way on one model, and the mode the first of them found. Kept in the model's own
    ``__dict__`` (no registry of models); a copy of the model (pickle, ``copy.deepcopy``) gets a fresh one, with no
    call under way, as a lock cannot be copied."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.running = 0
        self.found_training = False

    def __reduce__(self) -> tuple[type, tuple]:
        return _EvalCalls, ()


@contextlib.contextmanager
def eval_mode(model: nn.Module) -> Iterator[None]:
    """``model`` in eval mode (no dropout) inside the block, and back in the mode it had once the last block entered
    on it from any thread ends.

    Each call switching to eval mode and putting back the mode it found was wrong under threads (a server's workers,
    a ThreadPoolExecutor sharing one model): on a model in training mode, the first call to end turned dropout back
    on under the calls still running (their vectors up to 0.4 from the model's, with no error), and a call that
    found the eval mode another had set put it back, so the model stayed in eval mode for good."""
    calls = model.__dict__.get("_eval_calls") or model.__dict__.setdefault("_eval_calls", _EvalCalls())
    with calls.lock:
        if calls.running == 0:
            calls.found_training = model.training
        calls.running += 1
        model.eval()  # under the lock: a call entering never runs while the last one out puts training mode back
    try:
        yield
    finally:
        with calls.lock:
            calls.running -= 1
            if calls.running == 0:
                model.train(calls.found_training)


def evaluate(call: Call, rows: Sequence[Any], batches: Sequence[Sequence[int]], *, pad: Pad,
             device: str | torch.device = "cpu", bf16: bool | None = False, model: nn.Module | None = None,
             nonfinite: Callable[[int], str] | None = None, bar: Any = None, gather: bool = False
             ) -> list[tuple[list[int], Any]]:
    """``(row indices, call's result)`` for each of ``batches``, in batch order.

    Runs under ``torch.no_grad`` (a caller that wants ``inference_mode`` enters it around the call) with ``model``
    in eval mode, its mode restored after. Each batch is padded by ``pad`` and moved to ``device``; ``bf16`` True
    runs ``call`` under bf16 autocast, False without autocast, None under whatever autocast the caller has entered
    (the training loop's, for an evaluation during training). ``nonfinite``: ``call`` gives one array per row, and
    one holding a NaN or +inf, or -inf across its whole last axis (every label of a row or token: its softmax is NaN,
    its argmax the first label), raises ``NonFiniteError(nonfinite(row))`` for the batch's first such row (a -inf
    among finite values is let through: a label switched off, or a position masked). ``bar`` (tqdm) advances per row.
    ``gather``: under torchrun every process gets every process's results (each ran its own ``batches``), process
    by process.
    """
    device = torch.device(device)
    precision = contextlib.nullcontext() if bf16 is None else torch.autocast(device.type, torch.bfloat16, enabled=bf16)
    results: list[tuple[list[int], Any]] = []
    with eval_mode(model) if model is not None else contextlib.nullcontext(), torch.no_grad():
        for idx in batches:
            batch_rows = [rows[i] for i in idx]
            # tensors to a GPU without waiting (``moved``), other values as they are
            batch = {k: moved(v, device) if isinstance(v, Tensor) else v for k, v in pad(batch_rows).items()}
            with precision:
                result = call(batch, batch_rows)
            bad = [i for i, o in zip(idx, result) if not finite_enough(o)] if nonfinite else []
            if bad:
                raise NonFiniteError(nonfinite(min(bad)), index=min(bad))
            results.append((list(idx), result))
            if bar is not None:
                bar.update(len(idx))
    return [r for part in all_gather(results) for r in part] if gather and current().enabled else results


def finite_enough(output: np.ndarray) -> bool:
    """No NaN or +inf in ``output``, and no slice along its last axis that is -inf throughout: the scores over
    such a slice are NaN and its argmax (a GLUE label, an NER tag) is the first, a number like any other."""
    output = np.asarray(output)
    if output.dtype.kind != "f":
        return True
    if (np.isnan(output) | np.isposinf(output)).any():
        return False
    return output.ndim == 0 or output.shape[-1] == 0 or not np.isneginf(output).all(axis=-1).any()


def run_batches(call: Call, rows: Sequence[Any], batches: Sequence[Sequence[int]], *, pad: Pad,
                **options: Any) -> dict[int, np.ndarray]:
    """``evaluate`` with ``call`` giving one output per row: the outputs keyed by row index."""
    return {i: o for idx, outs in evaluate(call, rows, batches, pad=pad, **options) for i, o in zip(idx, outs)}


def distinct(keys: Sequence[Any]) -> tuple[list[int], list[int]]:
    """(the index of the first item of each distinct key, each item's place among those): items with equal keys are
    computed once and share that result, bit for bit. A row's numbers depend on the batch it meets (its length's
    kernels, the rows beside it), so two copies of a text in one call came out a float32 step apart and their tie,
    which TEI and sentence-transformers order by index, fell either way. A key None is never equal to another."""
    seen: dict[Any, int] = {}
    firsts: list[int] = []
    places = []
    for i, key in enumerate(keys):
        place = len(firsts) if key is None else seen.setdefault(key, len(firsts))
        if place == len(firsts):
            firsts.append(i)
        places.append(place)
    return firsts, places


def run_length_sorted(call: Call, rows: Sequence[Any], *, batch_size: int, pad: Pad,
                      lengths: Sequence[int] | None = None, longest_first: bool = False,
                      groups: Sequence[Any] | None = None, **options: Any) -> list[np.ndarray]:
    """``run_batches`` over ``plan_batches`` of ``rows``; one output per row, in row order.

    ``lengths`` defaults to ``len(row["input_ids"])`` of each row."""
    if lengths is None:
        lengths = [len(r["input_ids"]) for r in rows]
    batches = plan_batches(lengths, batch_size, longest_first=longest_first, groups=groups)
    out = run_batches(call, rows, batches, pad=pad, **options)
    return [out[i] for i in range(len(rows))]

