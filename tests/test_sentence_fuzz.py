"""Randomized differential test of bertkit.sentence.SentenceTransformer against sentence-transformers 6: each seed
draws a model (pooling modes and their concatenations, include_prompt, Dense layers, Normalize, prompts and a default
prompt, truncate_dim, similarity function, max_seq_length, do_lower_case), builds it with one library from
``models.*`` modules, saves it, loads the directory in both, saves it again with the other and loads that, and
compares ``encode`` / ``encode_query`` / ``encode_document`` calls drawn with every keyword on inputs of every shape a
user passes (a str, list, tuple, string array, ``{"text": ...}`` dicts, duplicates, empty and special-character
texts, texts past max_seq_length), the model's attributes and similarities, and the embedding pipelines (`bertkit predict`,
serve's /predict) on the saved directory: `feature-extraction` gives encode's vectors, `sentence-embedding` them
unit-length (encode's `normalize_embeddings=True`). Results have the same type, dtype
and shape and values within 1e-5 (quantized codes within one bucket: a value on a bucket's edge moves with float
rounding), or both libraries refuse the call. What docs/sentence.md documents bertkit refusing (other Dense
activations, a truncate_dim past the width, output_value other than sentence embeddings) is not drawn.

Slow: ``BERTKIT_FUZZ_SENTENCE`` seeds, 20 by default (about 13 s a seed on a busy 2-core machine)."""

from __future__ import annotations

import os
import random

import numpy as np
import pytest
import torch

from bertkit import pipeline
from bertkit.sentence import SentenceTransformer
from bertkit.sentence import models as bk_models

st = pytest.importorskip("sentence_transformers", reason="the reference: pip install -e '.[test-references]'")
pytestmark = pytest.mark.slow

SEEDS = int(os.environ.get("BERTKIT_FUZZ_SENTENCE", "20"))
MODES = ["cls", "lasttoken", "max", "mean", "mean_sqrt_len_tokens", "weightedmean"]
TEXTS = ["A man is eating food.", "A man is riding a horse on a sunny beach.", "hi", "Ünïcödé and 漢字",
         "it 's a charming and often affecting journey . ", "", " ", "\u200b", "!!!", "[CLS] [SEP] [PAD]", "[MASK]",
         "word " * 700, "😀😀", "HELLO world"]
PROMPTS = [None, {}, {"query": "query: ", "passage": "passage: "}, {"query": "Represent this: ", "document": "doc"},
           {"classification": "Classify: ", "query": ""}]


def _draw_model(r: random.Random) -> dict:
    modes = r.sample(MODES, r.choice([1, 1, 2, 3]))
    dense, width = [], 384 * len(modes)
    for _ in range(r.choice([0, 0, 1, 2])):
        out = r.choice([32, 64, 384])
        dense.append((width, out, r.random() < 0.7, r.choice(["Tanh", "Identity", None]), r.randrange(10**6)))
        width = out
    prompts = r.choice(PROMPTS)
    return {"max_seq_length": r.choice([None, 8, 16, 128, 512]), "do_lower_case": r.random() < 0.3,
            "pooling_mode": modes[0] if len(modes) == 1 and r.random() < 0.5 else tuple(modes),
            "include_prompt": r.random() < 0.6, "dense": dense, "normalize": r.random() < 0.4, "dim": width,
            "prompts": prompts, "default_prompt_name": r.choice([None, *(prompts or {})]),
            "truncate_dim": r.choice([None, None, min(width, 16), width]),
            "similarity_fn_name": r.choice([None, "cosine", "dot", "euclidean", "manhattan"]),
            "builder": r.choice(["bertkit", "st"])}


def _build(library: str, model_dir, c: dict):
    mods = st.models if library == "st" else bk_models
    length = {} if c["max_seq_length"] is None else {"max_seq_length": c["max_seq_length"]}
    modules = [mods.Transformer(str(model_dir), do_lower_case=c["do_lower_case"], **length),
               mods.Pooling(384, pooling_mode=c["pooling_mode"], include_prompt=c["include_prompt"])]
    for n_in, n_out, bias, activation, seed in c["dense"]:
        g = torch.Generator().manual_seed(seed)
        weight, bias_init = torch.randn(n_out, n_in, generator=g) / n_in**0.5, torch.randn(n_out, generator=g) * 0.1
        modules.append(mods.Dense(n_in, n_out, bias=bias, activation_function=activation and getattr(torch.nn, activation)(),
                                  init_weight=weight, init_bias=bias_init if bias else None))
    if c["normalize"]:
        modules.append(mods.Normalize())
    kwargs = {k: c[k] for k in ("prompts", "default_prompt_name", "truncate_dim", "similarity_fn_name") if c[k] is not None}
    if library == "st":
        return st.SentenceTransformer(modules=modules, device="cpu", **kwargs)
    return SentenceTransformer(modules=modules, **kwargs)


def _load(library: str, path):
    return st.SentenceTransformer(str(path), device="cpu") if library == "st" else SentenceTransformer(path)


def _draw_call(r: random.Random, c: dict) -> tuple[str, object, dict]:
    texts = [r.choice(TEXTS) for _ in range(r.choice([1, 2, 5]))]
    inputs = r.choice([texts[0], texts, tuple(texts), np.array(texts), texts[:1] * 3 + texts, [],
                       {"text": texts[0]}, [{"text": t} for t in texts]])
    options = {"batch_size": r.choice([1, 3, 32]), "convert_to_numpy": r.random() < 0.5,
               "convert_to_tensor": r.random() < 0.5, "normalize_embeddings": r.random() < 0.5,
               "precision": r.choice(["float32", "int8", "uint8", "binary", "ubinary"]),
               "prompt": r.choice(["", "Hi: ", "a " * 20]),
               "prompt_name": r.choice([*(c["prompts"] or {}), "query", "document", "nope"]),
               "truncate_dim": r.choice([None, 8, c["dim"]]), "show_progress_bar": False}
    kwargs = {k: v for k, v in options.items() if r.random() < 0.3}
    return r.choice(["encode", "encode", "encode_query", "encode_document"]), inputs, kwargs


def _outcome(model, method: str, inputs, kwargs: dict):
    try:
        return "ok", getattr(model, method)(inputs, **kwargs)
    except (ValueError, KeyError) as e:  # BertkitError is a ValueError, as sentence-transformers' refusals
        return "refused", e


def _same(got, want, where: str) -> None:
    assert type(got) is type(want), (where, type(got), type(want))
    if isinstance(want, (list, tuple)):
        assert len(got) == len(want), where
        for g, w in zip(got, want):
            _same(g, w, where)
        return
    if not isinstance(want, (torch.Tensor, np.ndarray)):
        assert got == want, (where, got, want)
        return
    assert got.dtype == want.dtype and tuple(got.shape) == tuple(want.shape), (where, got.dtype, want.dtype,
                                                                                 got.shape, want.shape)
    g, w = (np.asarray(x.float() if isinstance(x, torch.Tensor) else x, dtype=np.float64) for x in (got, want))
    if g.size:
        atol = 1 if want.dtype in (np.int8, np.uint8, torch.int8, torch.uint8) else 1e-5
        assert np.abs(g - w).max() <= atol, (where, np.abs(g - w).max())


@pytest.mark.parametrize("seed", range(SEEDS))
def test_random_models_and_calls_are_sentence_transformers(seed, minilm_2_layers, tmp_path):
    r = random.Random(seed)
    c = _draw_model(r)
    other = "st" if c["builder"] == "bertkit" else "bertkit"
    _build(c["builder"], minilm_2_layers, c).save(str(tmp_path / "a"))
    pairs = {"a": (_load("bertkit", tmp_path / "a"), _load("st", tmp_path / "a"))}
    pairs["a"][0 if other == "bertkit" else 1].save(str(tmp_path / "b"))  # the other library saves it again
    pairs["b"] = (_load("bertkit", tmp_path / "b"), _load("st", tmp_path / "b"))
    for name, (ours, ref) in pairs.items():
        for attribute in ("max_seq_length", "truncate_dim", "similarity_fn_name", "default_prompt_name"):
            assert getattr(ours, attribute) == getattr(ref, attribute), (c, name, attribute)
        assert dict(ours.prompts) == dict(ref.prompts), (c, name)
        assert ours.get_embedding_dimension() == ref.get_embedding_dimension(), (c, name)
    for _ in range(6):
        method, inputs, kwargs = _draw_call(r, c)
        ours, ref = pairs[r.choice(["a", "b"])]
        got, want = _outcome(ours, method, inputs, kwargs), _outcome(ref, method, inputs, kwargs)
        where = (c, method, str(inputs)[:60], kwargs)
        assert got[0] == want[0], (*where, got[1] if got[0] == "refused" else "ok",
                                   want[1] if want[0] == "refused" else "ok")
        if want[0] == "ok":
            _same(got[1], want[1], str(where))
    ours, ref = pairs["b"]
    if not c["dense"]:  # the embedding pipelines (predict, serve's /predict) give encode's vectors; Dense is refused
        texts, prompt_name = TEXTS[:5], r.choice([None, *(c["prompts"] or {})])
        named = {"prompt_name": prompt_name} if prompt_name is not None else {}
        task = r.choice(["sentence-embedding", "feature-extraction"])  # unit-length, or encode's as they are
        pipe = pipeline(task, str(tmp_path / "b"), progress=False)
        want = ref.encode(texts, normalize_embeddings=task == "sentence-embedding", **named)
        _same(np.asarray(pipe(texts, **named), dtype=np.float32), want, f"{c} {task} {named}")
    emb = ref.encode(TEXTS[:3], convert_to_tensor=True)
    _same(ours.similarity(emb, emb), ref.similarity(emb, emb), str(c))
    _same(ours.similarity_pairwise(emb, emb), ref.similarity_pairwise(emb, emb), str(c))
