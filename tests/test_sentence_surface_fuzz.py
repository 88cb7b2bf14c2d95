"""A seeded generator of calls drawn from sentence-transformers 6's signatures, run in both libraries on MiniLM's first
2 layers: SentenceTransformer built with a random similarity_fn_name, truncate_dim and prompts, then encode /
encode_query / encode_document with random prompt_name, prompt, batch_size, precision, conversions, normalisation
and truncate_dim; the util functions with their keyword names; CrossEncoder.predict and rank. Each call is given
by keyword or by position (sentence-transformers' order, the gaps filled with its defaults). Both give the same
vectors (within 1e-5), ids, orders and properties, or both refuse, or bertkit refuses with a BertkitError naming the
argument where docs/sentence.md says it does. It found encode_query's and encode_document's positions, beside what
tests/test_sentence_surface.py enumerates (predict's and rank's positions, pairwise_angle_sim's keyword names)."""

from __future__ import annotations

import inspect
import random
import warnings

import numpy as np
import pytest
import torch

from bertkit.errors import BertkitError

st = pytest.importorskip("sentence_transformers")

TEXTS = ["A man is eating food.", "a cat sat on the mat", "Paris is the capital of France!", "", "x",
         "Quantum chromodynamics describes the strong interaction.", "héllo wörld ñ", "the the the the the"]
# what bertkit refuses where sentence-transformers goes on (docs/sentence.md), by the argument the message names
DOCUMENTED = {"output_value": "is not implemented", "truncate_dim": "must be a whole number in [1, 384]"}


def _same(a, b, where):
    if isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _same(x, y, f"{where}[{i}]")
    elif isinstance(a, dict):
        assert set(a) == set(b), (where, sorted(a), sorted(b))
        for k in a:
            _same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (torch.Tensor, np.ndarray)):
        assert type(a) is type(b) and a.dtype == b.dtype and tuple(a.shape) == tuple(b.shape), (where, a, b)
        x, y = (np.asarray(v.detach().cpu().float() if isinstance(v, torch.Tensor) else v, dtype=np.float64)
                for v in (a, b))
        # quantized codes: a bucket edge may fall either side of a float32 rounding
        tol = 1 if a.dtype in (np.int8, np.uint8, torch.int8, torch.uint8) else 1e-5
        assert x.size == 0 or np.abs(x - y).max() <= tol, (where, np.abs(x - y).max())
    elif isinstance(a, float):
        assert abs(a - b) <= 1e-5, (where, a, b)
    else:
        assert a == b, (where, a, b)


def _as_called(ref_fn, given: dict, positional: bool, leading: int = 0):
    """(args, kwargs) for ``given``, after the ``leading`` inputs the caller passes: all by keyword, or by position in
    the reference's order up to the last one given, the gaps filled with the reference's defaults."""
    if not positional:
        return (), given
    names = [p for p in inspect.signature(ref_fn).parameters.values() if p.name != "self"
             and p.kind is p.POSITIONAL_OR_KEYWORD][leading:]
    last = max((i for i, p in enumerate(names) if p.name in given), default=-1)
    args = tuple(given[p.name] if p.name in given else p.default for p in names[:last + 1])
    return args, {k: v for k, v in given.items() if k not in {p.name for p in names[:last + 1]}}


def _outcome(call):
    try:
        return "ok", call()
    except Exception as e:  # noqa: BLE001 - the generator compares what each library raises
        return "err", e


def _compare(ours, ref, where):
    if ours[0] == ref[0] == "ok":
        _same(ours[1], ref[1], where)
    elif ours[0] == "err" and ref[0] == "ok":
        e = ours[1]
        assert isinstance(e, BertkitError) and any(name in str(e) and fix in str(e) for name, fix in DOCUMENTED.items()), \
            (where, repr(e))
    elif ours[0] == "ok":
        pytest.fail(f"{where}: sentence-transformers refused it ({ref[1]!r}), bertkit accepted it")
    else:
        assert isinstance(ours[1], BertkitError), (where, repr(ours[1]))


def _sentence_call(r: random.Random, path, i: int):
    from bertkit.sentence import SentenceTransformer

    ctor = {k: v for k, v in {
        "similarity_fn_name": r.choice([None, "cosine", "dot", "euclidean", "manhattan",
                                        st.SimilarityFunction.MANHATTAN, "cos"]),
        "truncate_dim": r.choice([None, None, 8, 64, 384, 0]),
        "prompts": r.choice([None, {"query": "query: ", "document": "passage: "}, {"q": "Q "}]),
        "default_prompt_name": r.choice([None, None, "query", "q"]),
    }.items() if r.random() < .5}
    given = {k: v for k, v in {
        "prompt_name": r.choice([None, "query", "document", "q", "missing"]), "prompt": r.choice([None, "hi: ", ""]),
        "batch_size": r.choice([1, 2, 32]), "show_progress_bar": False,
        "output_value": r.choice(["sentence_embedding", "sentence_embedding", "token_embeddings"]),
        "precision": r.choice(["float32", "int8", "uint8", "binary", "ubinary"]),
        "convert_to_numpy": r.choice([True, False]), "convert_to_tensor": r.choice([True, False]),
        "normalize_embeddings": r.choice([True, False]), "truncate_dim": r.choice([None, 4, 16, 1000]),
    }.items() if r.random() < .35}
    method = r.choice(["encode", "encode", "encode_query", "encode_document"])
    texts = r.sample(TEXTS, r.randint(2, 5)) if r.random() < .85 else r.choice(TEXTS)
    positional = r.random() < .5
    where = f"draw {i}: {ctor} {method}({texts!r}, {given}, positional={positional})"

    def run(cls):
        model = cls(str(path), device="cpu", **ctor)
        args, kwargs = _as_called(getattr(st.SentenceTransformer, method), given, positional, leading=1)
        out = getattr(model, method)(texts, *args, **kwargs)
        props = {"similarity_fn_name": str(model.similarity_fn_name), "prompts": dict(model.prompts),
                 "default_prompt_name": model.default_prompt_name, "truncate_dim": model.truncate_dim,
                 "dimension": model.get_sentence_embedding_dimension(), "max_seq_length": model.max_seq_length}
        floats = isinstance(out, (np.ndarray, torch.Tensor)) and out.ndim == 2 and out.dtype in (np.float32,
                                                                                                 torch.float32)
        return out, props, (model.similarity(out, out), model.similarity_pairwise(out, out)) if floats else None

    _compare(_outcome(lambda: run(SentenceTransformer)), _outcome(lambda: run(st.SentenceTransformer)), where)


def _util_call(r: random.Random, g: torch.Generator, i: int):
    from sentence_transformers import util as ref

    from bertkit.sentence import util

    name = r.choice(["cos_sim", "dot_score", "euclidean_sim", "manhattan_sim", "pairwise_cos_sim",
                     "pairwise_dot_score", "pairwise_euclidean_sim", "pairwise_manhattan_sim", "pairwise_angle_sim",
                     "semantic_search", "paraphrase_mining_embeddings", "community_detection"])
    first, second = (p.name for p in list(inspect.signature(getattr(ref, name)).parameters.values())[:2])
    n = r.randint(2, 6)
    a, b = torch.randn(n, 16, generator=g), torch.randn(n if name.startswith("pairwise") else r.randint(1, 8), 16,
                                                         generator=g)
    if r.random() < .2:
        a, b = a.round(), b.round()  # ties, which each library must order alike
    given = {first: a} if name in ("paraphrase_mining_embeddings", "community_detection") else {first: a, second: b}
    if name == "semantic_search":
        given |= {k: v for k, v in {"top_k": r.choice([1, 3, 100]), "query_chunk_size": r.choice([1, 100]),
                                    "corpus_chunk_size": r.choice([1, 3, 5000])}.items() if r.random() < .5}
    elif name == "paraphrase_mining_embeddings":
        given |= {k: v for k, v in {"top_k": r.choice([1, 2, 100]), "max_pairs": r.choice([1, 3, 500000])}.items()
                  if r.random() < .5}
    elif name == "community_detection":
        given |= {k: v for k, v in {"threshold": r.choice([0.0, 0.3, 0.75]), "min_community_size": r.choice([1, 2, 3]),
                                    "batch_size": r.choice([1, 1024])}.items() if r.random() < .5}
    positional = r.random() < .5
    where = f"draw {i}: {name}({sorted(given)}, positional={positional})"

    def run(module):
        args, kwargs = _as_called(getattr(ref, name), given, positional)
        return getattr(module, name)(*args, **kwargs)

    _compare(_outcome(lambda: run(util)), _outcome(lambda: run(ref)), where)


def _cross_encoder_call(r: random.Random, models, i: int):
    ours, ref = models
    pairs = [(r.choice(TEXTS), r.choice(TEXTS)) for _ in range(r.randint(1, 4))]
    if r.random() < .5:
        method = "predict"
        given = {k: v for k, v in {"batch_size": r.choice([1, 2, 32]), "show_progress_bar": False,
                                   "activation_fn": r.choice([None, torch.nn.Identity(), torch.nn.Tanh()]),
                                   "apply_softmax": r.choice([False, True]),
                                   "convert_to_numpy": r.choice([True, False]),
                                   "convert_to_tensor": r.choice([True, False])}.items() if r.random() < .4}
        inputs = (pairs,)
    else:
        method = "rank"
        given = {k: v for k, v in {"top_k": r.choice([None, 1, 2, 10]), "return_documents": r.choice([True, False]),
                                   "batch_size": r.choice([1, 2, 32]), "show_progress_bar": False}.items()
                 if r.random() < .5}
        inputs = (pairs[0][0], [b for _, b in pairs])
    positional = r.random() < .5
    where = f"draw {i}: {method}({len(pairs)} pairs, {given}, positional={positional})"

    def run(model):
        args, kwargs = _as_called(getattr(type(ref), method), given, positional, leading=len(inputs))
        return getattr(model, method)(*inputs, *args, **kwargs)

    _compare(_outcome(lambda: run(ours)), _outcome(lambda: run(ref)), where)


@pytest.mark.slow
def test_calls_drawn_from_sentence_transformers_signatures_give_its_results(minilm_2_layers, tmp_path):
    from sentence_transformers.cross_encoder import CrossEncoder as Reference

    from bertkit.sentence.cross_encoder import CrossEncoder
    from cross_encoder_helpers import cross_encoder_directory
    from sentence_helpers import st_directory

    torch.set_num_threads(1)
    path = st_directory(minilm_2_layers, tmp_path / "st", normalize=False)
    ce = cross_encoder_directory(minilm_2_layers, tmp_path / "ce")
    cross_encoders = CrossEncoder(str(ce), device="cpu"), Reference(str(ce), device="cpu")
    r, g = random.Random(0), torch.Generator().manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for i in range(40):
            _sentence_call(r, path, i)
        for i in range(150):
            _util_call(r, g, i)
        for i in range(50):
            _cross_encoder_call(r, cross_encoders, i)
