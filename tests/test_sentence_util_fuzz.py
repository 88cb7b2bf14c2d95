"""Randomized differential test of bertkit.sentence.util against sentence-transformers 6's util on the same
embeddings: each seed draws a function and its arguments, with embeddings drawn either as Gaussian vectors or as small
integer vectors with a repeated row, so that scores tie exactly (which ids a search, a paraphrase mining or a
community detection returns among equal scores is where two implementations part first). Drawn: ``cos_sim``,
``dot_score``, ``euclidean_sim``, ``manhattan_sim`` (tensors, arrays, lists, a 1-D query), the ``pairwise_*`` forms,
``semantic_search`` (query and corpus chunk sizes, ``top_k``, ``score_function``, one query as a 1-D tensor),
``paraphrase_mining_embeddings`` (chunk sizes, ``max_pairs``, ``top_k``), ``community_detection`` (threshold,
``min_community_size``, ``batch_size``), ``quantize_embeddings`` (every precision, with ``ranges`` or
``calibration_embeddings`` of several rows) and ``normalize_embeddings``. Results have the same structure, types, ids
and dtypes and values within 1e-5, or both libraries raise. A single calibration embedding, which bertkit refuses
(docs/sentence.md) and sentence-transformers turns into codes of -128, is not drawn.

Slow: ``BERTKIT_FUZZ_UTIL`` seeds, 600 by default (a few seconds)."""

from __future__ import annotations

import os
import random

import numpy as np
import pytest
import torch

import bertkit.sentence.util as ours

st_util = pytest.importorskip("sentence_transformers.util", reason="the reference: pip install -e '.[test-references]'")
pytestmark = pytest.mark.slow

SEEDS = int(os.environ.get("BERTKIT_FUZZ_UTIL", "600"))


def _embeddings(rng: np.random.Generator, n: int, d: int, ties: bool) -> torch.Tensor:
    if not ties:
        return torch.tensor(rng.standard_normal((n, d)), dtype=torch.float32)
    x = torch.tensor(rng.integers(-2, 3, size=(n, d)), dtype=torch.float32)
    if n > 1:
        x[int(rng.integers(1, n))] = x[0]
    return x


def _draw(seed: int):
    """(what was drawn, the call as a function of the util module)."""
    rng, r = np.random.default_rng(seed), random.Random(seed)
    d, ties = r.choice([1, 2, 3, 8]), r.random() < 0.6
    q, c = _embeddings(rng, r.randint(1, 12), d, ties), _embeddings(rng, r.randint(1, 30), d, ties)
    kind = r.choice(["search", "mine", "community", "quantize", "similarity", "pairwise", "normalize"])
    if kind == "search":
        kw = dict(query_chunk_size=r.choice([1, 2, 5, 100]), corpus_chunk_size=r.choice([1, 3, 7, 500000]),
                  top_k=r.choice([1, 2, 5, 10, 50]))
        score = r.choice([None, "dot_score", "cos_sim"])
        query = q[0] if r.random() < 0.2 else q
        return (kind, kw, score), lambda u: u.semantic_search(
            query, c, **kw, **({"score_function": getattr(u, score)} if score else {}))
    if kind == "mine":
        kw = dict(query_chunk_size=r.choice([1, 2, 5, 5000]), corpus_chunk_size=r.choice([1, 3, 7, 100000]),
                  max_pairs=r.choice([1, 3, 10, 500000]), top_k=r.choice([1, 2, 5, 100]))
        return (kind, kw), lambda u: u.paraphrase_mining_embeddings(c, **kw)
    if kind == "community":
        kw = dict(threshold=r.choice([0.0, 0.3, 0.5, 0.75, 0.9, 1.0]), min_community_size=r.choice([1, 2, 3, 5]),
                  batch_size=r.choice([1, 2, 4, 1024]))
        return (kind, kw), lambda u: u.community_detection(c, **kw)
    if kind == "quantize":
        kw: dict = {"precision": r.choice(["float32", "int8", "uint8", "binary", "ubinary"])}
        if kw["precision"] in ("int8", "uint8"):
            how = r.random()
            if how < 0.3:
                kw["calibration_embeddings"] = _embeddings(rng, r.randint(2, 20), d, ties).numpy()
            elif how < 0.5:
                kw["ranges"] = np.stack([c.numpy().min(0) - 0.5, c.numpy().max(0) + 0.5])
        x = c if r.random() < 0.5 else c.numpy()
        return (kind, kw), lambda u: u.quantize_embeddings(x, **kw)
    if kind == "similarity":
        name, form = r.choice(["cos_sim", "dot_score", "euclidean_sim", "manhattan_sim"]), r.choice(["t", "np", "list", "1d"])
        a, b = {"t": (q, c), "np": (q.numpy(), c.numpy()), "list": (q.tolist(), c.tolist()), "1d": (q[0], c)}[form]
        return (kind, name, form), lambda u: getattr(u, name)(a, b)
    if kind == "pairwise":
        name = r.choice(["pairwise_cos_sim", "pairwise_dot_score", "pairwise_euclidean_sim", "pairwise_manhattan_sim",
                         "pairwise_angle_sim"])
        n = min(len(q), len(c))
        a, b = (q[:n], c[:n]) if r.random() < 0.7 else (q[:n].numpy(), c[:n].numpy())
        return (kind, name), lambda u: getattr(u, name)(a, b)
    return (kind,), lambda u: u.normalize_embeddings(c)


def _same(got, want, where: str = "result") -> None:
    if isinstance(want, dict):
        assert isinstance(got, dict) and set(got) == set(want), where
        for k in want:
            _same(got[k], want[k], f"{where}[{k!r}]")
    elif isinstance(want, (list, tuple)):
        assert type(got) is type(want) and len(got) == len(want), (where, got, want)
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            _same(g, w, f"{where}[{i}]")
    elif isinstance(want, (torch.Tensor, np.ndarray)):
        assert type(got) is type(want) and got.shape == want.shape and got.dtype == want.dtype, (where, got, want)
        got, want = torch.as_tensor(got), torch.as_tensor(want)
        if want.dtype.is_floating_point:
            torch.testing.assert_close(got, want, atol=1e-5, rtol=0, equal_nan=True, msg=where)
        else:
            assert torch.equal(got, want), where
    elif isinstance(want, float):
        assert isinstance(got, float) and abs(got - want) <= 1e-5, (where, got, want)
    else:
        assert type(got) is type(want) and got == want, (where, got, want)


@pytest.mark.parametrize("block", range(6))
def test_util_functions_equal_sentence_transformers_on_drawn_calls(block):
    for seed in range(block * SEEDS // 6, (block + 1) * SEEDS // 6):
        drawn, call = _draw(seed)
        try:
            want = call(st_util)
        except Exception:  # noqa: BLE001 (the reference refuses: bertkit must refuse too)
            with pytest.raises(Exception):  # noqa: B017
                call(ours)
            continue
        _same(call(ours), want, f"seed {seed} {drawn}")
