"""``quantize_embeddings``: float embeddings to int8 / uint8 (per-dimension buckets) or packed bits, as
sentence-transformers' ``quantize_embeddings`` computes them (same numbers, tests/test_sentence_model.py)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from bertkit.errors import BertkitError, refusing_getattr

PRECISIONS = ("float32", "int8", "uint8", "binary", "ubinary")


def quantize_embeddings(embeddings: Any, precision: str, ranges: np.ndarray | None = None,
                        calibration_embeddings: np.ndarray | None = None) -> np.ndarray:
    """``int8``/``uint8``: 256 buckets per dimension between ``ranges`` (a (2, D) array of minima and maxima),
    by default the minima and maxima of ``calibration_embeddings`` or of the embeddings themselves;
    ``binary``/``ubinary``: one bit per dimension (> 0), packed 8 to a byte (binary shifted by -128 to int8)."""
    if precision not in PRECISIONS:
        raise BertkitError(f"precision {precision!r} is not one of {PRECISIONS}")
    if isinstance(embeddings, list) and embeddings and np.ndim(embeddings[0]) == 2:
        # sentence-transformers quantizes each matrix with buckets from all their rows; stacked here, the buckets
        # would have come from each position's values across the matrices, without a word
        raise BertkitError(f"quantize_embeddings got a list of {len(embeddings)} matrices (multi-vector embeddings), "
                           "which bertkit does not implement; quantize their rows together, "
                           "quantize_embeddings(np.concatenate(matrices), ...), and split the result at the matrices' "
                           "lengths")
    if isinstance(embeddings, list) and not embeddings:
        return []  # as sentence-transformers: nothing to quantize, in the type it came in
    embeddings = _array(embeddings)
    if embeddings.dtype in (np.int8, np.uint8):
        raise BertkitError(f"embeddings to quantize must be float, got {embeddings.dtype}: they are quantized already")
    if precision == "float32":
        return embeddings.astype(np.float32)
    if not np.isfinite(embeddings).all():
        # a NaN cast to an integer is a number like any other, in sentence-transformers too, and an infinity is
        # clipped into the top or bottom bucket (or a sign bit): a code that looks like any other
        at = [int(i) for i in np.argwhere(~np.isfinite(embeddings))[0]]
        value = float(embeddings[tuple(at)])
        raise BertkitError(f"embeddings{at} is {'NaN' if math.isnan(value) else value}, which {precision} quantization would turn "
                           "into a number; drop or fix that embedding first (a model whose outputs overflow: a NaN "
                           "or an infinity is no code)")
    if precision in ("int8", "uint8"):
        if ranges is None and embeddings.ndim == 2 and len(embeddings) == 0:
            return np.zeros((0, embeddings.shape[1]), np.uint8 if precision == "uint8" else np.int8)
        origin = "ranges="
        if ranges is None:
            origin = "the embeddings" if calibration_embeddings is None else "calibration_embeddings="
            source = embeddings if calibration_embeddings is None else _array(calibration_embeddings)
            if source.ndim != 2 or source.shape[0] == 1:
                raise BertkitError(f"{precision} buckets cannot be computed from {origin} of shape {source.shape}: "
                                   "they need a batch (N, D) of several embeddings (a single embedding gives each "
                                   "dimension one value); pass ranges= or calibration_embeddings= from a "
                                   "representative set of embeddings")
            ranges = np.vstack((source.min(axis=0), source.max(axis=0)))
        ranges = _array(ranges).astype(np.float32, copy=False)
        # numpy broadcasts a (2, 1) range over every dimension (and a width-1 embedding over every range), and a
        # range that is not finite puts every embedding's value in one bucket: numbers, without a word
        width = embeddings.shape[-1]
        if ranges.shape != (2, width):
            raise BertkitError(f"the {precision} ranges from {origin} have the shape {ranges.shape}, and the embeddings "
                               f"{width} dimensions: give ranges of shape (2, {width}) (each dimension's minimum and "
                               f"maximum) or calibration_embeddings of {width} dimensions")
        if not np.isfinite(ranges).all():
            dim = int(np.argwhere(~np.isfinite(ranges))[0][1])
            raise BertkitError(f"the {precision} range of dimension {dim} from {origin}, {ranges[0, dim]} to "
                               f"{ranges[1, dim]}, is not finite; give finite ranges= or calibration_embeddings=")
        starts = ranges[0, :]
        steps = (ranges[1, :] - starts) / 255
        steps = np.where(steps == 0, 1, steps)  # a constant dimension: every value in bucket 0
        buckets = np.clip(np.floor((embeddings - starts) / steps), 0, 255)
        return buckets.astype(np.uint8) if precision == "uint8" else (buckets - 128).astype(np.int8)
    bits = np.packbits(embeddings > 0, axis=-1)
    return bits if precision == "ubinary" else (bits - 128).astype(np.int8)


def _array(values: Any) -> np.ndarray:
    """Embeddings, calibration embeddings or ranges as a numpy array: a tensor, or a list of row tensors, read by
    ``_numpy`` (a bfloat16 tensor, as encode(convert_to_tensor=True) gives for a bf16 model, stopped numpy's
    conversion with "Got unsupported ScalarType BFloat16" when passed as calibration_embeddings or ranges)."""
    if isinstance(values, torch.Tensor):
        return _numpy(values)
    if isinstance(values, list) and values and isinstance(values[0], torch.Tensor):
        return np.stack([_numpy(v) for v in values])
    return np.asarray(values)


def _numpy(embeddings: torch.Tensor) -> np.ndarray:
    """A tensor's values in its own precision (bfloat16, which numpy lacks, in float32), as sentence-transformers
    reads them: float64 embeddings rounded to float32 first would land some values in the next bucket."""
    embeddings = embeddings.detach().cpu()
    return (embeddings.float() if embeddings.dtype == torch.bfloat16 else embeddings).numpy()


# sentence_transformers.quantization's approximate searches (faiss, usearch: libraries bertkit does not depend on)
__getattr__ = refusing_getattr(__name__, dict.fromkeys(
    ["semantic_search_faiss", "semantic_search_usearch"],
    "search exactly with bertkit.sentence.util.semantic_search(query_embeddings, corpus_embeddings, top_k=...)"))
