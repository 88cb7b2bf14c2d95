"""Similarity functions and exact semantic search, with sentence-transformers' names (``sentence_transformers.util``).

Every function takes lists, numpy arrays or tensors, one vector or a batch of them, and returns a float tensor
(integer embeddings, Python integers or int64, are computed in float32; Python floats in float32, as
``torch.tensor`` makes them and sentence-transformers computes them). int8 and uint8 embeddings, the codes of
``encode(precision=...)`` and ``quantize_embeddings``, are refused, naming how to compare them. Embeddings of different widths, or a pairwise
call on different numbers of embeddings, are refused with both shapes.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from enum import Enum
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from bertkit.errors import BertkitError, is_whole, refusing_getattr
from bertkit.progress import progress_bar
from bertkit.sentence.finite import nonfinite_rows, refuse_nan_scores, unit_length
from bertkit.sentence.hard_negatives import mine_hard_negatives  # noqa: F401  (sentence_transformers.util's name)
from bertkit.sentence.quantization import quantize_embeddings  # noqa: F401  (sentence_transformers.util's name)


def _tensor(x: Any, name: str) -> Tensor:
    """``x`` (a list, array or tensor of one vector (D,) or several (N, D)) as a tensor that similarities can be
    computed in: float32 for integer embeddings and for floats narrower than 32 bits (as sentence-transformers 6,
    whose bf16 products tie). int8 and uint8 codes are refused (``_refuse_codes``).
    Sparse COO tensors (a ``SparseEncoder``'s, or a list of its rows) stay sparse, coalesced, in float32; CSR, CSC
    and their blocked forms are read as COO."""
    if not isinstance(x, Tensor):
        if isinstance(x, list) and x and all(isinstance(v, Tensor) for v in x):
            x = torch.stack([v.coalesce() if v.is_sparse else v for v in x])
        else:
            leaf = x
            while isinstance(leaf, (list, tuple)) and leaf:
                leaf = leaf[0]
            x = torch.as_tensor(np.asarray(x))
            if x.dtype == torch.float64 and type(leaf) in (float, int):  # numpy made Python floats float64
                x = x.float()
    if x.layout in (torch.sparse_csr, torch.sparse_csc, torch.sparse_bsr, torch.sparse_bsc):
        x = x.to_sparse_coo()  # sentence-transformers computes only dot_score of these; PyTorch fails in the rest
    if x.dim() not in (1, 2):
        raise BertkitError(f"{name} has the shape {tuple(x.shape)}; give one embedding (D,) or a batch (N, D)")
    if x.dtype in (torch.int8, torch.uint8):
        _refuse_codes(name, x.dtype)
    if x.is_sparse:
        return x.coalesce().float()
    if not torch.is_floating_point(x) or torch.finfo(x.dtype).bits < 32:
        if x.dtype in (torch.bool, torch.complex64, torch.complex128):
            raise BertkitError(f"{name} is {x.dtype}; give float or integer embeddings")
        x = x.float()
    return x


def _refuse_codes(name: str, dtype: torch.dtype) -> None:
    """Quantized codes are not embeddings: an int8/uint8 code is each dimension's bucket (its own offset and step,
    so the codes' cosine is not the embeddings'), and a binary/ubinary byte packs 8 dimensions (its value is no
    coordinate at all: the "cosine" or "Manhattan distance" of two such rows measures nothing). sentence-transformers
    raises PyTorch's error for the cosine, Euclidean and Manhattan matrices and computes the rest in the codes' own
    type (int8 dot products wrap around, pairwise distances come out NaN); bertkit computed every one in float32,
    scores that looked like the embeddings' similarities."""
    kind = str(dtype).removeprefix("torch.")
    raise BertkitError(
        f"{name} holds {kind} values: quantized codes (encode(precision=...) or quantize_embeddings), whose "
        "similarities are not the embeddings' (sentence-transformers raises PyTorch's error or overflows in "
        f"{kind}); compare the float embeddings (encode without precision=), or the codes as numbers: "
        "codes.astype(np.float32) for int8/uint8 codes (as sentence-transformers' evaluators score them), and for "
        "binary/ubinary codes, whose bytes each pack 8 dimensions, the bits: np.unpackbits(codes.view(np.uint8), "
        "axis=-1) (binary codes XOR 0x80 first), or the number of differing bits (Hamming distance)")


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


def _rows(a: Any, b: Any, mixed_broadcast: bool = True) -> tuple[Tensor, Tensor]:
    """(a, b) for the pairwise similarities: as many rows each (one dense vector goes with every row of the other).
    PyTorch broadcasts no sparse operand, but a sparse one times a dense one (``mixed_broadcast``: the products, not
    the differences, which make both sparse first): another shape is refused here, as PyTorch's "expects sparse inputs
    with equal dimensionality" or "expected sizes ... to match" (sentence-transformers' error) said it."""
    a, b = _pair(a, b)
    if a.dim() == b.dim() == 2 and len(a) != len(b) and 1 not in (len(a), len(b)):
        raise BertkitError(f"pairwise similarity compares a[i] with b[i]: a has {len(a)} embeddings and b {len(b)} "
                           f"(shapes {tuple(a.shape)} and {tuple(b.shape)}); give as many of each, or use the "
                           "(N, M) matrix: cos_sim / dot_score / model.similarity")
    sparse = a.is_sparse + b.is_sparse
    if a.shape != b.shape and (sparse == 2 or (sparse == 1 and not mixed_broadcast)):
        raise BertkitError(f"pairwise similarity of sparse embeddings compares a[i] with b[i] of the same shape, got "
                           f"the shapes {tuple(a.shape)} and {tuple(b.shape)}: repeat the one vector as many times as "
                           "the other has rows (torch.stack([v] * n)), or use the (N, M) matrix: model.similarity")
    return a, b


def normalize_embeddings(embeddings: Tensor) -> Tensor:
    """Each row at unit length (rows of zeros stay zero); a sparse tensor stays sparse, a float16 or bfloat16 one
    normalised in float32 (its squares summed in its own precision gave a fifth of its values one unit off)."""
    if not embeddings.is_sparse:
        return unit_length(embeddings)
    embeddings = embeddings.coalesce()
    indices, values = embeddings.indices(), embeddings.values()
    if embeddings.dim() == 1:
        return torch.sparse_coo_tensor(indices, unit_length(values, dim=0), embeddings.size(),
                                       check_invariants=False)  # a coalesced tensor's indices: valid, no warning
    wide = values.float() if values.dtype in (torch.float16, torch.bfloat16) else values  # as sentence-transformers
    rows = embeddings.size(0)
    norms = wide.new_zeros(rows).index_add_(0, indices[0], wide ** 2).sqrt()[indices[0]]
    if bool(torch.isinf(norms).any()):  # squares past float32's range: scaled by the row's largest first (unit_length)
        largest = wide.new_zeros(rows).scatter_reduce_(0, indices[0], wide.abs(), "amax")[indices[0]]
        rescaled = torch.isinf(norms) & torch.isfinite(largest)
        wide = torch.where(rescaled, wide / torch.where(rescaled, largest, 1), wide)
        norms = torch.where(rescaled, wide.new_zeros(rows).index_add_(0, indices[0], wide ** 2).sqrt()[indices[0]],
                            norms)
    scaled = torch.where(norms > 0, wide / torch.where(norms > 0, norms, 1), wide).to(values.dtype)
    return torch.sparse_coo_tensor(indices, scaled, embeddings.size(), check_invariants=False).coalesce()


def _sparse_products(a: Tensor, b: Tensor) -> Tensor:
    """(N, M) dot products of two sparse batches, dense. ``b.T`` is coalesced first: PyTorch multiplies two coalesced
    COO tensors as they are (the same numbers), where an uncoalesced one goes through CSR, which warns on every call
    that CSR is in beta. Silencing that warning took ``warnings.catch_warnings``, which swaps the process's filter
    list and, restored from another thread, dropped that thread's filters (a server encodes on several)."""
    return _nan_beside_nonfinite(torch.mm(a, b.T.coalesce()).to_dense(), nonfinite_rows(a), nonfinite_rows(b))


def _nan_beside_nonfinite(scores: Tensor, rows: Tensor, columns: Tensor | None = None) -> Tensor:
    """``scores`` NaN at the ``rows`` (and the ``columns``) of embeddings holding a NaN or an infinity. A sparse
    product multiplies only the dimensions both rows store, so a NaN where the other row stores nothing never met a 0
    (dense, 0 x NaN is NaN): an embedding holding a NaN scored 1.0 against one it shares a finite dimension with, and
    one holding an infinity 0.0, as in sentence-transformers; a score like any other, ranked and thresholded."""
    if not (rows.any() or (columns is not None and columns.any())):
        return scores
    scores = scores.clone()
    scores[rows] = torch.nan
    if columns is not None:
        scores[..., columns] = torch.nan
    return scores


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
    """(N, M) negative Manhattan distances. Sparse embeddings are compared dense in float64 and the distances given
    in float32, as sentence-transformers' scipy computes them (float32 sums of hundreds of terms differ in the 6th
    digit, and a float64 dense operand beside a sparse one is not refused)."""
    a, b = _batches(a, b)
    if a.is_sparse or b.is_sparse:
        return -torch.cdist(a.to_dense().double(), b.to_dense().double(), p=1.0).float()
    return -torch.cdist(a, b, p=1.0)


def pairwise_cos_sim(a: Any, b: Any) -> Tensor:
    """(N,) cosine similarity of ``a[i]`` with ``b[i]`` (a scalar for two vectors). A sparse batch times a dense
    one stays a mixed product, which broadcasts one vector over the other's rows (two sparse tensors do not)."""
    a, b = _rows(a, b)
    scores = (normalize_embeddings(a) * normalize_embeddings(b)).sum(-1).to_dense()
    return _sparse_pairs_nan(scores, a, b)


def pairwise_dot_score(a: Any, b: Any) -> Tensor:
    a, b = _rows(a, b)  # not _same_layout: as pairwise_cos_sim
    return _sparse_pairs_nan((a * b).sum(-1).to_dense(), a, b)


def _sparse_pairs_nan(scores: Tensor, a: Tensor, b: Tensor) -> Tensor:
    """A pairwise product's ``scores`` NaN where ``a[i]`` or ``b[i]`` holds a NaN or an infinity, when either is
    sparse (its product skips the dimensions it does not store: ``_nan_beside_nonfinite``)."""
    if not (a.is_sparse or b.is_sparse):
        return scores  # dense products carry a NaN through
    return _nan_beside_nonfinite(scores, (nonfinite_rows(a) | nonfinite_rows(b)).expand(scores.shape))


def pairwise_euclidean_sim(a: Any, b: Any) -> Tensor:
    """(N,) negative Euclidean distances. Dense rows through ``torch.linalg.vector_norm``, as sentence-transformers:
    its gradient where ``a[i] == b[i]`` is 0, the square root's is infinite (0 x inf: a triplet whose anchor and
    positive are the same text made every parameter's gradient NaN)."""
    a, b = _same_layout(*_rows(a, b, mixed_broadcast=False))
    diff = a - b
    if diff.is_sparse:
        return -(diff ** 2).sum(-1).to_dense().sqrt()
    return -torch.linalg.vector_norm(diff, dim=-1)


def pairwise_manhattan_sim(a: Any, b: Any) -> Tensor:
    a, b = _same_layout(*_rows(a, b, mixed_broadcast=False))
    return -(a - b).abs().sum(-1).to_dense()


def pairwise_angle_sim(x: Any, y: Any) -> Tensor:
    """(N,) AnglE similarity (Li and Li, 2023, arXiv:2309.12871): |cos + sin| of the angle between ``x[i]`` and
    ``y[i]`` read as complex vectors (dimensions i and i + D/2 paired; an odd D padded with a zero), after L2
    normalisation. ``x`` and ``y`` are sentence-transformers' names (``pairwise_angle_sim(x=..., y=...)``)."""
    a, b = (v.to_dense() for v in _rows(x, y))
    if a.shape[1] % 2:
        a, b = F.pad(a, (0, 1)), F.pad(b, (0, 1))
    a, b = unit_length(a, dim=1), unit_length(b, dim=1)
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
    SimilarityFunction enum is accepted. "dot_product" is not, as in sentence-transformers 6 (its enum's
    DOT_PRODUCT is "dot")."""
    name = getattr(name, "value", name)
    if name not in SIMILARITY_FUNCTIONS:
        raise BertkitError(f"similarity_fn_name {name!r} is not one of {sorted(SIMILARITY_FUNCTIONS)}")
    return name


class SimilarityByName:
    """A model's ``similarity_fn_name`` and ``similarity`` / ``similarity_pairwise`` by it (SentenceTransformer's and
    SparseEncoder's). The name is checked where it is set and kept as a name, however given (sentence-transformers'
    SimilarityFunction enum too: an enum kept as such was written as "SimilarityFunction.EUCLIDEAN", which
    sentence-transformers then read as cosine); None is the class's ``default_similarity``, set on first use, as
    sentence-transformers sets it."""

    default_similarity: str
    _similarity_fn_name: str | None = None
    # the names similarity_fn_name takes, as sentence-transformers' class constant of that name
    SUPPORTED_SIMILARITY_FN_NAMES: ClassVar[tuple[str, ...]] = tuple(SIMILARITY_FUNCTIONS)

    @property
    def similarity_fn_name(self) -> str:
        """"cosine", "dot", "euclidean" or "manhattan": what ``similarity`` computes and ``save`` writes."""
        if self._similarity_fn_name is None:
            self._similarity_fn_name = self.default_similarity
        return self._similarity_fn_name

    @similarity_fn_name.setter
    def similarity_fn_name(self, value: Any) -> None:
        self._similarity_fn_name = None if value is None else similarity_function(value)

    def similarity(self, embeddings1: Any, embeddings2: Any) -> Tensor:
        """The (N, M) similarities by ``similarity_fn_name``, sparse or dense embeddings."""
        return SIMILARITY_FUNCTIONS[self.similarity_fn_name][0](embeddings1, embeddings2)

    def similarity_pairwise(self, embeddings1: Any, embeddings2: Any) -> Tensor:
        """The (N,) similarities of each row of ``embeddings1`` with its row of ``embeddings2``."""
        return SIMILARITY_FUNCTIONS[self.similarity_fn_name][1](embeddings1, embeddings2)


def _functions(name: Any) -> tuple[Callable[[Any, Any], Tensor], Callable[[Any, Any], Tensor]]:
    """(matrix function, pairwise function) of a name or SimilarityFunction member (whose static methods'
    argument, named as in sentence-transformers, hides ``similarity_function``)."""
    return SIMILARITY_FUNCTIONS[similarity_function(name)]


def _at_least_one(**counts: int) -> None:
    """Refuse a count (``top_k``, a chunk or batch size) below 1, by name. sentence-transformers searches nothing
    with a chunk size below 0 (``range`` with a negative step is empty: no hits, no pairs, no word) and returns
    nothing for a ``top_k`` or ``max_pairs`` of 0: a value no caller means. A count that is no whole number (2.5, NaN,
    True, "3") is refused too: a ``max_pairs`` of NaN or 2.5 mined nothing, a scored 0 without a word."""
    for name, value in counts.items():
        if not is_whole(value):
            raise BertkitError(f"{name} must be a whole number >= 1, got {value!r}")


def semantic_search(query_embeddings: Any, corpus_embeddings: Any, query_chunk_size: int = 100,
                    corpus_chunk_size: int = 500000, top_k: int = 10,
                    score_function: Callable[[Tensor, Tensor], Tensor] = cos_sim) -> list[list[dict[str, Any]]]:
    """For each query, the ``top_k`` corpus entries by ``score_function``: a list per query of
    ``{"corpus_id": int, "score": float}``, best first (exact search, chunked to bound memory). Equal scores (a
    corpus holding a text twice) come as in sentence-transformers, whose choice among them is its own: each corpus
    chunk's unsorted ``torch.topk``, kept in a min-heap of (score, corpus_id), so that the larger ids of equal scores
    stay, listed in the heap's order (by ``torch.topk``'s merged order, bertkit returned other ids of the same
    scores)."""
    _at_least_one(top_k=top_k, query_chunk_size=query_chunk_size, corpus_chunk_size=corpus_chunk_size)
    queries, corpus = _batches(query_embeddings, corpus_embeddings)
    heaps: list[list[tuple[float, int]]] = [[] for _ in range(len(queries))]
    for c0 in range(0, len(corpus), corpus_chunk_size):
        chunk = take_rows(corpus, c0, corpus_chunk_size)
        for q0 in range(0, len(queries), query_chunk_size):
            scores = score_function(take_rows(queries, q0, query_chunk_size), chunk)
            refuse_nan_scores(scores, "semantic_search", "query", "corpus entry", q0, c0)
            top = torch.topk(scores, min(top_k, scores.shape[1]), dim=1, largest=True, sorted=False)
            for heap, values, ids in zip(heaps[q0:q0 + query_chunk_size], top.values.tolist(),
                                         (top.indices + c0).tolist()):
                for candidate in zip(values, ids):
                    if len(heap) < top_k:
                        heapq.heappush(heap, candidate)
                    else:
                        heapq.heappushpop(heap, candidate)
    return [[{"corpus_id": int(i), "score": float(s)} for s, i in sorted(heap, key=lambda h: h[0], reverse=True)]
            for heap in heaps]


def take_rows(x: Tensor, start: int, size: int) -> Tensor:
    """Rows ``start`` to ``start + size`` of a dense or sparse batch: a dense one sliced, as sentence-transformers
    slices it (a copy, aligned otherwise in memory, can score an ulp apart in a matrix product, which decides ties
    between equal texts), a sparse COO one, which cannot be sliced, selected."""
    if not x.is_sparse:
        return x[start:start + size]
    return x.index_select(0, torch.arange(start, min(start + size, len(x)), device=x.device))


def _nearest(queries: Tensor, corpus: Tensor, corpus_chunk_size: int, k: int,
             score_function: Callable[[Tensor, Tensor], Tensor], query0: int) -> tuple[Tensor, Tensor]:
    """(scores, ids) (Q, k) of each query's ``k`` best corpus entries, best first: each chunk's sorted ``torch.topk``
    merged with the best so far, as sentence-transformers' paraphrase mining finds them (equal scores in that order).
    ``query0`` is the index of the first query among the embeddings, to name a pair whose similarity is NaN."""
    best_scores, best_ids = None, None
    for c0 in range(0, len(corpus), corpus_chunk_size):
        scores = score_function(queries, take_rows(corpus, c0, corpus_chunk_size))
        refuse_nan_scores(scores, "paraphrase_mining", "embedding", "embedding", query0, c0)
        top = torch.topk(scores, min(k, scores.shape[1]), dim=1, sorted=True)
        ids = top.indices + c0
        if best_scores is None:
            best_scores, best_ids = top.values, ids
        else:
            both_scores, both_ids = torch.cat([best_scores, top.values], 1), torch.cat([best_ids, ids], 1)
            keep = torch.topk(both_scores, min(k, both_scores.shape[1]), dim=1, sorted=True).indices
            best_scores, best_ids = both_scores.gather(1, keep), both_ids.gather(1, keep)
    return best_scores, best_ids


class SimilarityFunction(Enum):
    """sentence-transformers' SimilarityFunction enum: the similarity functions by name, and the functions themselves
    (its MAXSIM and MEAN_MAXSIM score multi-vector embeddings, which bertkit does not implement)."""

    COSINE = "cosine"
    DOT_PRODUCT = "dot"
    DOT = "dot"  # an alias of DOT_PRODUCT
    EUCLIDEAN = "euclidean"
    MANHATTAN = "manhattan"

    @staticmethod
    def to_similarity_fn(similarity_function: Any) -> Callable[[Any, Any], Tensor]:
        """The (N, M) function of a name or member: ``to_similarity_fn("cosine")`` is ``cos_sim``."""
        return _functions(similarity_function)[0]

    @staticmethod
    def to_similarity_pairwise_fn(similarity_function: Any) -> Callable[[Any, Any], Tensor]:
        """The (N,) pairwise function of a name or member: ``to_similarity_pairwise_fn("dot")`` is
        ``pairwise_dot_score``."""
        return _functions(similarity_function)[1]

    @staticmethod
    def possible_values() -> list[str]:
        return [m.value for m in SimilarityFunction]


def paraphrase_mining(model: Any, sentences: list[str], show_progress_bar: bool = False, batch_size: int = 32,
                      query_chunk_size: int = 5000, corpus_chunk_size: int = 100000, max_pairs: int = 500000,
                      top_k: int = 100, score_function: Callable[[Tensor, Tensor], Tensor] = cos_sim,
                      truncate_dim: int | None = None, prompt_name: str | None = None,
                      prompt: str | None = None) -> list[list[float | int]]:
    """The most similar pairs of ``sentences`` as ``[score, i, j]`` (i < j), best first: ``model.encode`` each
    sentence, then ``paraphrase_mining_embeddings``."""
    _at_least_one(max_pairs=max_pairs, top_k=top_k, query_chunk_size=query_chunk_size,
                  corpus_chunk_size=corpus_chunk_size)  # before the sentences are encoded
    embeddings = model.encode(sentences, show_progress_bar=show_progress_bar, batch_size=batch_size,
                              convert_to_tensor=True, truncate_dim=truncate_dim, prompt_name=prompt_name, prompt=prompt)
    return paraphrase_mining_embeddings(embeddings, query_chunk_size, corpus_chunk_size, max_pairs, top_k,
                                        score_function)


def paraphrase_mining_embeddings(embeddings: Any, query_chunk_size: int = 5000, corpus_chunk_size: int = 100000,
                                 max_pairs: int = 500000, top_k: int = 100,
                                 score_function: Callable[[Tensor, Tensor], Tensor] = cos_sim) -> list[list[float | int]]:
    """Up to ``max_pairs`` pairs ``[score, i, j]`` (i < j), best first, from each embedding's ``top_k`` nearest
    others (``_nearest``, so chunking never changes them). ``score_function`` is taken to be symmetric: a
    pair keeps the score of the first search that finds it. As in sentence-transformers, the kept pairs are a
    min-heap of (score, i, j); once full, a pair pushed out sets a floor that no later pair at or below it passes,
    and equal scores come out in the heap's order."""
    _at_least_one(max_pairs=max_pairs, top_k=top_k, query_chunk_size=query_chunk_size,
                  corpus_chunk_size=corpus_chunk_size)
    embeddings = _tensor(embeddings, "embeddings")
    embeddings = embeddings.unsqueeze(0) if embeddings.dim() == 1 else embeddings
    kept: list[tuple[float, int, int]] = []
    in_kept: set[tuple[int, int]] = set()
    floor = float("-inf")
    for start in range(0, len(embeddings), query_chunk_size):
        scores, ids = _nearest(take_rows(embeddings, start, query_chunk_size), embeddings, corpus_chunk_size, top_k + 1,
                               score_function, start)
        for i, (row_scores, row_ids) in enumerate(zip(scores.tolist(), ids.tolist()), start):
            for j, score in [(j, score) for j, score in zip(row_ids, row_scores) if j != i][:top_k]:
                pair = (i, j) if i < j else (j, i)
                if score <= floor or pair in in_kept:
                    continue
                in_kept.add(pair)
                if len(kept) < max_pairs:
                    heapq.heappush(kept, (score, *pair))
                else:
                    out = heapq.heappushpop(kept, (score, *pair))
                    in_kept.discard(out[1:])
                    floor = out[0]
    return [[score, i, j] for score, i, j in sorted(kept, key=lambda p: p[0], reverse=True)]


def community_detection(embeddings: Any, threshold: float = 0.75, min_community_size: int = 10,
                        batch_size: int = 1024, show_progress_bar: bool = False) -> list[list[int]]:
    """Groups of at least ``min_community_size`` embeddings whose cosine similarity to a centre is >= ``threshold``,
    largest first, each the centre's index then its members' by decreasing similarity; no embedding is in two.

    Every embedding with enough neighbours is a candidate centre; candidates are taken largest first, each keeping
    the members no earlier community took, if enough are left. As in sentence-transformers 6.3, the neighbours of a
    batch's centres are the ``torch.topk`` of a window of at least 50 that doubles (for this and later batches) while
    any centre's passes whole, so equal similarities come in its order, and the threshold is compared in the
    similarities' type."""
    _at_least_one(min_community_size=min_community_size, batch_size=batch_size)
    if not isinstance(embeddings, Tensor) and len(embeddings) == 0:
        return []
    x = _tensor(embeddings, "embeddings").to_dense()
    x = x.unsqueeze(0) if x.dim() == 1 else x
    n = len(x)
    if n == 0 or n < min_community_size:
        return []
    x = normalize_embeddings(x)
    # sentence-transformers' torch.tensor(threshold): a 0-d tensor, which never widens the similarities' type
    threshold_t = torch.as_tensor(threshold, device=x.device)
    window = min(max(2 * min_community_size, 50), n)
    candidates: list[tuple[int, np.ndarray]] = []
    for start in progress_bar(range(0, n, batch_size), desc="Finding clusters", enabled=show_progress_bar):
        scores = x[start:start + batch_size] @ x.T  # (b, N)
        refuse_nan_scores(scores, "community_detection", "embedding", "embedding", start)
        enough = scores.topk(min_community_size, dim=1).values[:, -1] >= threshold_t
        if not enough.any():
            continue
        scores = scores[enough]  # (c, N), the batch's centres
        values, ids = scores.topk(window, dim=1)
        while window < n and (values[:, -1] >= threshold_t).any():
            window = min(2 * window, n)
            values, ids = scores.topk(window, dim=1)
        counts = (values >= threshold_t).sum(1).tolist()
        for centre, count, row in zip((enough.nonzero().flatten() + start).tolist(), counts, ids.cpu().numpy()):
            candidates.append((centre, row[:count]))
    candidates.sort(key=lambda c: len(c[1]), reverse=True)
    taken = np.zeros(n, dtype=bool)
    communities = []
    for centre, members in candidates:
        if taken[centre]:
            continue
        free = members[~taken[members]]
        if len(free) >= min_community_size:
            community = [centre, *free[free != centre].tolist()]
            communities.append(community)
            taken[community] = True
    return sorted(communities, key=len, reverse=True)


_INTERNAL = "it is part of sentence-transformers' own machinery, which bertkit does not reproduce"
_MULTI_VECTOR = ("it scores multi-vector (late-interaction) embeddings, which bertkit does not implement; token "
                 "states come from bertkit.pipeline('feature-extraction', pooling='none')")
_REFUSED = {
    "information_retrieval": "sentence-transformers' deprecated name for semantic_search: use semantic_search",
    "pytorch_cos_sim": "sentence-transformers' deprecated name for cos_sim: use cos_sim",
    "truncate_embeddings": "slice the embeddings, embeddings[..., :dim], or encode with truncate_dim=dim",
    "batch_to_device": "move each tensor of the batch with .to(device)",
    "select_max_active_dims": "encode with SparseEncoder.encode(..., max_active_dims=k)",
    "to_scipy_coo": "read a sparse embedding's .coalesce().indices() and .values()",
    "compute_count_vector": "count a sparse embedding's active dimensions with (embeddings.to_dense() != 0).sum(0)",
    **dict.fromkeys(["maxsim", "maxsim_pairwise", "mean_maxsim", "mean_maxsim_pairwise", "cat_padded_token_embeddings",
                     "stack_padded_token_embeddings", "repad_flattened_features"], _MULTI_VECTOR),
    **dict.fromkeys(["all_gather", "all_gather_padded", "all_gather_with_grad", "get_rank", "get_world_size",
                     "is_dist_initialized"], "use torch.distributed's (bertkit's losses gather across processes "
                                             "themselves)"),
    **dict.fromkeys(["http_get", "load_dir_path", "load_file_path", "is_sentence_transformer_model",
                     "ORIGINAL_TRANSFORMER_MODELS"], "bertkit reads local directories only: give "
                                                     "SentenceTransformer the directory's path"),
    **dict.fromkeys(["LoggingHandler", "install_logger", "disable_logging", "disabled_tqdm"],
                    "use Python's logging module (bertkit logs under the 'bertkit' logger)"),
    **dict.fromkeys(["append_to_last_row", "check_package_availability", "check_version_requirements",
                     "check_teacher_targets", "disable_datasets_caching", "fullname", "import_from_string",
                     "import_module_class", "similarity_fct_name", "get_device_name", "is_accelerate_available",
                     "is_datasets_available", "is_training_available", "save_to_hub_args_decorator",
                     "resolve_ids"], _INTERNAL),
}

__getattr__ = refusing_getattr(__name__, _REFUSED)
