"""Where a NaN stops before it becomes a score: a model output that is not finite (``refuse_nonfinite``), refused
by the evaluators, ``CrossEncoder.rank`` and ``mine_hard_negatives`` naming the input, and a NaN or an infinity
among similarities about to be ranked, thresholded or correlated (``refuse_nan_scores``), refused by ``util``'s
searches and the evaluators naming the pair. ``torch.topk``, ``torch.sort`` and numpy's ``argsort`` take a NaN for the
largest value and Python's ``sorted`` leaves it wherever it falls, so an embedding holding a NaN came out every
query's best hit, or a cross-encoder's NaN score the first document, in sentence-transformers, whose order bertkit's
otherwise keeps. And a row whose norm overflows is normalised to the unit vector it is (``unit_length``), not to
zeros that score 0.0 against everything."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from bertkit.errors import NonFiniteError, nonfinite_cause


def refuse_nonfinite(outputs: Any, inputs: Sequence[Any], who: str, what: str,
                     result: str = "no metric was computed", model: Any = None) -> None:
    """Refuse model outputs (one row an input: embeddings, dense or sparse, or a cross-encoder's scores) holding a NaN
    or an infinity, naming the first such input: ranked, thresholded or correlated, a NaN comes out a metric like any
    other (argsort ranks it first, a comparison drops it, argmax picks it)."""
    t = outputs if isinstance(outputs, torch.Tensor) else torch.as_tensor(outputs)
    if t.is_sparse:
        t = t.coalesce()
        rows = t.indices()[0][~torch.isfinite(t.values())]
    else:
        rows = torch.nonzero(~torch.isfinite(t.reshape(len(t), -1)).all(dim=1)).flatten() if t.numel() else t[:0]
    if len(rows):
        i = int(rows.min())
        raise NonFiniteError(f"{who}: the model's {what} of input {i} ({str(inputs[i])[:60]!r}) is not finite (NaN "
                             f"or inf), so {result}: {nonfinite_cause(model)}")


def unit_length(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """``F.normalize(x, p=2, dim=dim)``, the same numbers, but for a row whose norm overflows (float32 values past
    about 1.8e19, float16 ones whose norm passes 65504): divided by an infinite norm it came out all zeros, whose
    similarity to anything is 0.0, a score like any other (sentence-transformers' too: a text scored 0.0 against one it
    equals). Such a row is scaled by its largest magnitude first, so it comes out the unit vector it is; a row holding
    NaN or inf stays not finite, for the checks downstream to refuse."""
    norm = x.norm(2, dim, keepdim=True)
    # asking whether a norm overflowed is a host sync on a GPU (inside a training step: Normalize's forward) and a
    # graph break under torch.compile; there the rescale runs on every row (three passes where the question costs
    # one, 2-3x F.normalize's time on the CPU, where the question is asked)
    if x.device.type != "cpu" or torch.compiler.is_compiling() or bool(torch.isinf(norm).any()):
        largest = x.abs().amax(dim, keepdim=True)
        rescaled = torch.isinf(norm) & torch.isfinite(largest)
        x = torch.where(rescaled, x / torch.where(rescaled, largest, 1), x)
        norm = torch.where(rescaled, x.norm(2, dim, keepdim=True), norm)
    return x / norm.clamp_min(1e-12)  # F.normalize's eps


def refuse_nan_scores(scores: torch.Tensor, who: str, rows: str, columns: str = "", row0: int = 0,
                      column0: int = 0) -> None:
    """Refuse a NaN among (rows, columns) similarities about to be ranked, naming the first pair (``row0`` and
    ``column0`` offset a chunk's indices), or among (rows,) similarities of pairs (``columns`` unused). A NaN comes
    from an embedding holding a NaN or an infinity (cosine similarity of an infinity is NaN), an infinity from an
    embedding holding one, or from finite embeddings whose dot product or distance passes float32's 3.4e38 (an
    evaluator refuses the embeddings first, so there it is the latter): every pair at that value ties, and the order
    among the tied pairs is the positions', not a rank."""
    dense = scores.to_dense() if scores.is_sparse else scores
    bad = ~torch.isfinite(dense)
    if bad.any():
        at = [int(v) for v in bad.nonzero()[0]]
        value = float(dense[tuple(at)])
        shown = "NaN" if value != value else value
        pair = f"{rows} {row0 + at[0]}" + (f" and {columns} {column0 + at[1]}" if len(at) > 1 else "")
        raise NonFiniteError(f"{who}: the similarity of {pair} is {shown}, and a NaN or an infinity has no rank: an "
                             "embedding holding a NaN or inf (a model with broken weights, or outputs past float16's "
                             "range?), or finite ones so large that their similarity overflows float32; find them "
                             "with torch.isfinite(embeddings).all(dim=1) and embeddings.abs().amax(dim=1), and embed "
                             "with a model whose outputs are finite and of ordinary size")


def nonfinite_rows(x: torch.Tensor) -> torch.Tensor:
    """(N,) True where row i of a batch, dense or sparse, holds a NaN or an infinity (a 0-d flag for one vector): a
    sparse tensor's stored values are read, never made dense."""
    if not x.is_sparse:
        return ~torch.isfinite(x).all(-1)
    x = x.coalesce()
    bad = ~torch.isfinite(x.values())
    if x.dim() == 1:
        return bad.any()
    return torch.zeros(x.size(0), dtype=torch.bool, device=x.device).index_fill_(0, x.indices()[0][bad], True)
