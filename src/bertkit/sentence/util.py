"""Similarity functions and exact semantic search, with sentence-transformers' names (``sentence_transformers.util``).

Every function takes lists, numpy arrays or tensors, one vector or a batch of them, and returns a float tensor
(integer embeddings, int8 or uint8, are computed in float32). Embeddings of different widths, or a pairwise call on
different numbers of embeddings, are refused with both shapes.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from bertkit.errors import BertkitError
from bertkit.sentence.hard_negatives import mine_hard_negatives  # noqa: F401  (sentence_transformers.util's name)


def _tensor(x: Any, name: str) -> Tensor:
    """``x`` (a list, array or tensor of one vector (D,) or several (N, D)) as a tensor that similarities can be
    computed in: float32 for integer embeddings (``quantize_embeddings``' int8/uint8, whose products overflow in
    their own type) and for floats narrower than 32 bits (as sentence-transformers 6, whose bf16 products tie).
    Sparse COO tensors (a ``SparseEncoder``'s, or a list of its rows) stay sparse, coalesced, in float32."""
    if not isinstance(x, Tensor):
        if isinstance(x, list) and x and all(isinstance(v, Tensor) for v in x):
            x = torch.stack([v.coalesce() if v.is_sparse else v for v in x])
        else:
            x = torch.as_tensor(np.asarray(x))
    if x.dim() not in (1, 2):
        raise BertkitError(f"{name} has the shape {tuple(x.shape)}; give one embedding (D,) or a batch (N, D)")
    if x.is_sparse:
        return x.coalesce().float()
    if not torch.is_floating_point(x) or torch.finfo(x.dtype).bits < 32:
        if x.dtype in (torch.bool, torch.complex64, torch.complex128):
            raise BertkitError(f"{name} is {x.dtype}; give float or integer embeddings")
        x = x.float()
    return x


def _same_layout(a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    """Both sparse when either is (sentence-transformers' ``_match_layouts``: the dense one is mostly zeros)."""
    if a.is_sparse != b.is_sparse:
        return (a, b.to_sparse().coalesce()) if a.is_sparse else (a.to_sparse().coalesce(), b)
    return a, b


def _pair(a: Any, b: Any) -> tuple[Tensor, Tensor]:
    """(a, b) as tensors of the same width; a mismatch is named with both shapes."""
    a, b = _tensor(a, "a"), _tensor(b, "b")
    if a.shape[-1] != b.shape[-1]:
        raise BertkitError(f"the embeddings have {a.shape[-1]} and {b.shape[-1]} dimensions (shapes {tuple(a.shape)} "
                           f"and {tuple(b.shape)}); compare embeddings of one model, with the same truncate_dim")
    return a, b


def _batches(a: Any, b: Any) -> tuple[Tensor, Tensor]:
    """(a, b) as (N, D) and (M, D): for the (N, M) similarity matrices."""
    a, b = _pair(a, b)
    return (a.unsqueeze(0) if a.dim() == 1 else a), (b.unsqueeze(0) if b.dim() == 1 else b)


def _rows(a: Any, b: Any) -> tuple[Tensor, Tensor]:
    """(a, b) for the pairwise similarities: as many rows each (one vector goes with every row of the other)."""
    a, b = _pair(a, b)
    if a.dim() == b.dim() == 2 and len(a) != len(b) and 1 not in (len(a), len(b)):
        raise BertkitError(f"pairwise similarity compares a[i] with b[i]: a has {len(a)} embeddings and b {len(b)} "
                           f"(shapes {tuple(a.shape)} and {tuple(b.shape)}); give as many of each, or use the "
                           "(N, M) matrix: cos_sim / dot_score / model.similarity")
    return a, b


def normalize_embeddings(embeddings: Tensor) -> Tensor:
    """Each row at unit length (rows of zeros stay zero); a sparse tensor stays sparse."""
    if not embeddings.is_sparse:
        return F.normalize(embeddings, p=2, dim=-1)
    embeddings = embeddings.coalesce()
    indices, values = embeddings.indices(), embeddings.values()
    if embeddings.dim() == 1:
        return torch.sparse_coo_tensor(indices, F.normalize(values, p=2, dim=0), embeddings.size())
    norms = values.new_zeros(embeddings.size(0)).index_add_(0, indices[0], values ** 2).sqrt()[indices[0]]
    scaled = torch.where(norms > 0, values / torch.where(norms > 0, norms, 1), values)
    return torch.sparse_coo_tensor(indices, scaled, embeddings.size()).coalesce()


def _sparse_products(a: Tensor, b: Tensor) -> Tensor:
    """(N, M) dot products of two sparse batches, dense. PyTorch computes a sparse product through CSR and warns,
    on every call, that CSR is in beta: a warning about its internals that the caller can do nothing about."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
        return torch.mm(a, b.T).to_dense()


def cos_sim(a: Any, b: Any) -> Tensor:
    """(N, M) cosine similarities of every row of ``a`` with every row of ``b``."""
    a, b = _same_layout(*_batches(a, b))
    if a.is_sparse:
        return _sparse_products(normalize_embeddings(a), normalize_embeddings(b))
    return normalize_embeddings(a) @ normalize_embeddings(b).T


def dot_score(a: Any, b: Any) -> Tensor:
    """(N, M) dot products."""
    a, b = _same_layout(*_batches(a, b))
    return _sparse_products(a, b) if a.is_sparse else a @ b.T


def euclidean_sim(a: Any, b: Any) -> Tensor:
    """(N, M) negative Euclidean distances (higher is more similar, as sentence-transformers)."""
    a, b = _same_layout(*_batches(a, b))
    if a.is_sparse:  # |a|^2 - 2 a.b + |b|^2 over the stored entries, as sentence-transformers computes it
        a_sq = torch.sparse.sum(a * a, dim=1).to_dense().unsqueeze(1)  # (N, 1)
        b_sq = torch.sparse.sum(b * b, dim=1).to_dense().unsqueeze(0)  # (1, M)
        return -(a_sq - 2 * _sparse_products(a, b) + b_sq).clamp(min=0).sqrt()
    return -torch.cdist(a, b, p=2.0)


def manhattan_sim(a: Any, b: Any) -> Tensor:
    """(N, M) negative Manhattan distances (sparse embeddings are compared dense)."""
    a, b = _batches(a, b)
    return -torch.cdist(a.to_dense(), b.to_dense(), p=1.0)


def pairwise_cos_sim(a: Any, b: Any) -> Tensor:
    """(N,) cosine similarity of ``a[i]`` with ``b[i]`` (a scalar for two vectors)."""
    a, b = _same_layout(*_rows(a, b))
    return (normalize_embeddings(a) * normalize_embeddings(b)).sum(-1).to_dense()


def pairwise_dot_score(a: Any, b: Any) -> Tensor:
    a, b = _same_layout(*_rows(a, b))
    return (a * b).sum(-1).to_dense()


def pairwise_euclidean_sim(a: Any, b: Any) -> Tensor:
    a, b = _same_layout(*_rows(a, b))
    return -((a - b) ** 2).sum(-1).to_dense().sqrt()


def pairwise_manhattan_sim(a: Any, b: Any) -> Tensor:
    a, b = _same_layout(*_rows(a, b))
    return -(a - b).abs().sum(-1).to_dense()


def pairwise_angle_sim(a: Any, b: Any) -> Tensor:
    """(N,) AnglE similarity (Li and Li, 2023, arXiv:2309.12871): |cos + sin| of the angle between ``a[i]`` and
    ``b[i]`` read as complex vectors (dimensions i and i + D/2 paired; an odd D padded with a zero), after L2
    normalisation."""
    a, b = (x.to_dense().float() for x in _rows(a, b))
    if a.shape[1] % 2:
        a, b = F.pad(a, (0, 1)), F.pad(b, (0, 1))
    a, b = F.normalize(a, p=2, dim=1), F.normalize(b, p=2, dim=1)
    (a_re, a_im), (b_re, b_im) = a.chunk(2, dim=1), b.chunk(2, dim=1)
    return ((a * b).sum(1) + (a_im * b_re - a_re * b_im).sum(1)).abs()


# sentence-transformers' SimilarityFunction values -> (matrix function, pairwise function)
SIMILARITY_FUNCTIONS: dict[str, tuple[Callable[[Any, Any], Tensor], Callable[[Any, Any], Tensor]]] = {
    "cosine": (cos_sim, pairwise_cos_sim),
    "dot": (dot_score, pairwise_dot_score),
    "euclidean": (euclidean_sim, pairwise_euclidean_sim),
    "manhattan": (manhattan_sim, pairwise_manhattan_sim),
}


def similarity_function(name: Any) -> str:
    """A similarity function's name ("cosine", "dot", "euclidean", "manhattan"); sentence-transformers'
    SimilarityFunction enum and "dot_product" are accepted."""
    name = getattr(name, "value", name)
    name = {"dot_product": "dot"}.get(name, name)
    if name not in SIMILARITY_FUNCTIONS:
        raise BertkitError(f"similarity_fn_name {name!r} is not one of {sorted(SIMILARITY_FUNCTIONS)}")
    return name


def semantic_search(query_embeddings: Any, corpus_embeddings: Any, query_chunk_size: int = 100,
                    corpus_chunk_size: int = 500000, top_k: int = 10,
                    score_function: Callable[[Tensor, Tensor], Tensor] = cos_sim) -> list[list[dict[str, Any]]]:
    """For each query, the ``top_k`` corpus entries by ``score_function``: a list per query of
    ``{"corpus_id": int, "score": float}``, best first (exact search, chunked to bound memory). Equal scores
    come in ``torch.topk``'s order (sentence-transformers' order of them is its heap's: neither is by id)."""
    queries, corpus = _batches(query_embeddings, corpus_embeddings)
    if top_k < 1:
        raise BertkitError(f"top_k must be >= 1, got {top_k}")
    k = min(top_k, len(corpus))
    results: list[list[dict[str, Any]]] = []
    for q0 in range(0, len(queries), query_chunk_size):
        best_scores, best_ids = None, None
        for c0 in range(0, len(corpus), corpus_chunk_size):
            scores = score_function(queries[q0:q0 + query_chunk_size], corpus[c0:c0 + corpus_chunk_size])
            top = torch.topk(scores, min(k, scores.shape[1]), dim=1, sorted=True)
            ids = top.indices + c0
            if best_scores is None:
                best_scores, best_ids = top.values, ids
            else:
                both_scores, both_ids = torch.cat([best_scores, top.values], 1), torch.cat([best_ids, ids], 1)
                keep = torch.topk(both_scores, min(k, both_scores.shape[1]), dim=1, sorted=True).indices
                best_scores, best_ids = both_scores.gather(1, keep), both_ids.gather(1, keep)
        for scores_row, ids_row in zip(best_scores.tolist(), best_ids.tolist()):
            results.append([{"corpus_id": int(i), "score": float(s)} for s, i in zip(scores_row, ids_row)])
    return results


class SimilarityFunction:
    """sentence-transformers' SimilarityFunction names."""

    COSINE = "cosine"
    DOT_PRODUCT = "dot"
    DOT = "dot"
    EUCLIDEAN = "euclidean"
    MANHATTAN = "manhattan"
