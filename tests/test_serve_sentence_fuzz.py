"""Randomized differential test of what `bertkit serve` answers for the sentence tasks against sentence-transformers
6 run directly on the same directory. Each seed draws a directory sentence-transformers saves from MiniLM's first two
layers (a SentenceTransformer: max_seq_length 8-40 so that truncation bites, pooling modes and their concatenations,
include_prompt, Normalize, prompts and a default prompt, truncate_dim; a CrossEncoder with one logit or two labels and
its activation; a SparseEncoder: SpladePooling max or sum, relu or log1p-relu, max_active_dims, prompts, and the
inference-free Router layout), serves it, and sends a dozen requests drawn over TEI's and OpenAI's routes (/embed,
/embed_all, /similarity, /v1/embeddings with texts, token ids, dimensions and base64, /predict, /tokenize, /rerank,
/embed_sparse) with their parameters (normalize, truncate, dimensions, prompt_name, raw_scores, return_text, ...),
inputs past max_seq_length, unicode, duplicates and empty texts, all at once, so that the dynamic batcher joins
requests of different parameters. Every answer is ``encode`` / ``encode_query`` / ``encode_document`` / ``predict``'s
within 1e-5 (sparse: the same indices), in order, or a 4xx where the request is one the server documents refusing
(an empty text, an unknown prompt, a dimension past the width, ``truncate: false`` on a text past max_seq_length).

Slow: ``BERTKIT_FUZZ_SERVE`` seeds, 9 by default (about 100 requests; 2-5 s a seed on a busy 2-core machine)."""

from __future__ import annotations

import base64
import json
import os
import random
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch

st = pytest.importorskip("sentence_transformers", reason="the reference: pip install -e '.[test-references]'")
pytest.importorskip("uvicorn", reason='bertkit serve needs uvicorn: pip install "bertkit[serve]"')
httpx = pytest.importorskip("httpx", reason="the HTTP client of these tests: pip install httpx")
pytestmark = pytest.mark.slow

SEEDS = int(os.environ.get("BERTKIT_FUZZ_SERVE", "9"))
TEXTS = ["A man is eating food.", "A man is riding a horse on a sunny beach while the tide comes in slowly.", "hi",
         "Ünïcödé and 漢字 text", "it 's a charming and often affecting journey . ", "😀😀 emoji", "HELLO world",
         "word " * 60, "[MASK] token", "naïve café"]
EMPTY = ["", " ", "\u200b"]
QUERIES = ["what is a horse", "Who wrote Hamlet?", "a very long query " * 8]
PROMPTS = [None, {"query": "query: ", "document": "passage: "}, {"query": "Represent this sentence for searching: "}]


def _unit(v: np.ndarray) -> np.ndarray:
    return v / np.linalg.norm(v, axis=-1, keepdims=True)


def _texts(r: random.Random) -> list[str]:
    texts = [r.choice(TEXTS) for _ in range(r.choice([1, 2, 4]))]
    texts = texts[:1] * 2 + texts if r.random() < 0.2 else texts
    return texts + [r.choice(EMPTY)] if r.random() < 0.08 else texts


def _options(r: random.Random, choices: dict) -> dict:
    return {k: r.choice(v) for k, v in choices.items() if r.random() < 0.35}


def _dense(r: random.Random, model_dir, out):
    from sentence_transformers import models

    modes = r.sample(["mean", "cls", "max", "lasttoken", "weightedmean", "mean_sqrt_len_tokens"], r.choice([1, 1, 2]))
    prompts = r.choice(PROMPTS)
    mods = [models.Transformer(str(model_dir), max_seq_length=r.randint(8, 40)),
            models.Pooling(384, pooling_mode=modes[0] if len(modes) == 1 else tuple(modes),
                           include_prompt=r.random() < 0.6)]
    mods += [models.Normalize()] if r.random() < 0.5 else []
    kwargs = {k: v for k, v in (("prompts", prompts), ("default_prompt_name", r.choice([None, *(prompts or {})])),
                                ("truncate_dim", r.choice([None, None, 16]))) if v is not None}
    st.SentenceTransformer(modules=mods, device="cpu", **kwargs).save(str(out))
    return st.SentenceTransformer(str(out), device="cpu"), r.choice(["sentence-embedding", "feature-extraction"])


def _dense_request(r: random.Random, ref) -> tuple[str, dict]:
    texts, names = _texts(r), [*ref.prompts, "nope"]
    route = r.choice(["/embed", "/embed", "/v1/embeddings", "/v1/embeddings", "/embed_all", "/similarity",
                      "/predict", "/tokenize"])
    if route == "/embed":
        return route, {"inputs": texts, **_options(r, {"normalize": [True, False], "truncate": [True, False],
                                                       "prompt_name": names, "dimensions": [1, 8, 384, 0]})}
    if route == "/v1/embeddings":
        prompt = ref.prompts.get(ref.default_prompt_name, "") if ref.default_prompt_name else ""
        fits = [t for t in texts if t.strip() and t != "\u200b"
                and len(ref.tokenizer(prompt + t)["input_ids"]) <= ref.max_seq_length]
        inputs = [ref.tokenizer(t)["input_ids"] if t in fits and r.random() < 0.5 else t for t in texts]
        return route, {"input": inputs, "_texts": texts, **_options(r, {"dimensions": [1, 8, 16],
                                                                      "encoding_format": ["float", "base64"]})}
    if route == "/embed_all":
        return route, {"inputs": texts, **_options(r, {"truncate": [True, False], "prompt_name": names})}
    if route == "/similarity":
        return route, {"inputs": {"source_sentence": texts[0], "sentences": texts[1:] or texts}}
    if route == "/predict":
        return route, {"inputs": texts, "parameters": _options(r, {"normalize": [True, False], "prompt_name": names})}
    return route, {"inputs": texts, **_options(r, {"add_special_tokens": [True, False], "prompt_name": names[:-1]})}


def _dense_expected(route: str, body: dict, ref, task: str):
    """sentence-transformers' answer to ``body``, or None where the server must refuse it."""
    params = body.get("parameters", body)
    texts = body.get("_texts", body.get("inputs"))
    texts = [texts["source_sentence"], *texts["sentences"]] if route == "/similarity" else texts
    name, dims = params.get("prompt_name"), params.get("dimensions")
    prompt = ref.prompts.get(name or ref.default_prompt_name or "", "")
    if route == "/tokenize":
        prompt = ref.prompts[name] if name else ""
        return [ref.tokenizer(prompt + t, add_special_tokens=body.get("add_special_tokens", True))["input_ids"]
                for t in texts]
    if (any(not t.strip() or t == "\u200b" for t in texts) or (name is not None and name not in ref.prompts)
            or (dims is not None and not 1 <= dims <= ref.get_embedding_dimension())
            or (params.get("truncate") is False
                and any(len(ref.tokenizer(prompt + t)["input_ids"]) > ref.max_seq_length for t in texts))):
        return None
    named = {"prompt_name": name} if name else {}
    if route == "/embed_all":
        return [x.numpy() for x in ref.encode(texts, output_value="token_embeddings", **named)]
    v = ref.encode(texts, **named)[:, :dims]
    if route == "/similarity":
        return _unit(v)[1:] @ _unit(v)[0]
    default = task == "sentence-embedding" if route == "/predict" else True
    return _unit(v) if route == "/v1/embeddings" or params.get("normalize", default) else v


def _dense_answer(route: str, answer):
    if route == "/tokenize":
        return [[t["id"] for t in tokens] for tokens in answer]
    if route == "/embed_all":
        return [np.asarray(x) for x in answer]
    if route == "/v1/embeddings":
        assert [d["index"] for d in answer["data"]] == list(range(len(answer["data"])))
        return np.asarray([np.frombuffer(base64.b64decode(d["embedding"]), "<f4") if isinstance(d["embedding"], str)
                           else d["embedding"] for d in answer["data"]])
    return np.asarray(answer)


def _cross_encoder(r: random.Random, model_dir, out):
    labels = r.choice([1, 1, 2])
    activation = {"activation_fn": r.choice([torch.nn.Sigmoid(), torch.nn.Identity()])} if labels == 1 else {}
    torch.manual_seed(r.randrange(1000))
    st.CrossEncoder(str(model_dir), num_labels=labels, max_length=r.randint(8, 40), device="cpu", **activation).save(
        str(out))
    return st.CrossEncoder(str(out), device="cpu"), "rerank"


def _rerank_request(r: random.Random, ref) -> tuple[str, dict]:
    return "/rerank", {"query": r.choice(QUERIES), "texts": _texts(r), **_options(r, {
        "raw_scores": [True, False], "return_text": [True, False], "truncate": [True, False]})}


def _rerank_expected(body: dict, ref):
    pairs = [(body["query"], t) for t in body["texts"]]
    if (any(not t.strip() or t == "\u200b" for t in body["texts"])
            or (body.get("truncate") is False and any(len(ref.tokenizer(*p)["input_ids"]) > ref.max_seq_length
                                                      for p in pairs))):
        return None
    logits = np.asarray(ref.predict(pairs, activation_fn=torch.nn.Identity()), dtype=np.float64)
    logits = logits[:, 1] - logits[:, 0] if logits.ndim == 2 else logits  # two labels: l_relevant - l_other
    return logits if body.get("raw_scores") else 1 / (1 + np.exp(-logits))


def _sparse(r: random.Random, checkpoint, out):
    from sentence_transformers.models import Router
    from sentence_transformers.models import Transformer as STTransformer
    from sentence_transformers.sparse_encoder.models import (
        MLMTransformer,
        SparseStaticEmbedding,
        SpladePooling,
    )

    length, pooling = r.randint(8, 40), SpladePooling(r.choice(["max", "sum"]), r.choice(["relu", "log1p_relu"]))
    prompts = r.choice(PROMPTS)
    kwargs = {k: v for k, v in (("prompts", prompts), ("default_prompt_name", r.choice([None, *(prompts or {})])),
                                ("max_active_dims", r.choice([None, None, 5, 30]))) if v is not None}
    if r.random() < 0.6:
        modules = [MLMTransformer(str(checkpoint), max_seq_length=length), pooling]
    else:  # inference-free: static weights on the query side
        document = STTransformer(str(checkpoint), transformer_task="fill-mask", max_seq_length=length)
        vocab = len(document.tokenizer)
        g = torch.Generator().manual_seed(r.randrange(1000))
        query = SparseStaticEmbedding(tokenizer=document.tokenizer,
                                      weight=torch.rand(vocab, generator=g) * (torch.rand(vocab, generator=g) < 0.5))
        modules = [Router.for_query_document(query_modules=[query], document_modules=[document, pooling])]
        kwargs["similarity_fn_name"] = "dot"
    st.SparseEncoder(modules=modules, device="cpu", **kwargs).save(str(out))
    return st.SparseEncoder(str(out), device="cpu"), "sparse-embedding"


def _sparse_request(r: random.Random, ref) -> tuple[str, dict]:
    if r.random() < 0.2:
        return "/tokenize", {"inputs": _texts(r), "prompt_name": r.choice(["query", "document"])}
    return "/embed_sparse", {"inputs": _texts(r), **_options(r, {"prompt_name": ["query", "document", "nope"]})}


def _sparse_expected(route: str, body: dict, ref):
    name = body.get("prompt_name")
    if route == "/tokenize":  # the side's prompt and the text, framed by [CLS] ... [SEP] where its route reads them
        static = type(ref[0]).__name__ == "Router" and name == "query"
        return [ref.tokenizer(ref.prompts.get(name, "") + t, add_special_tokens=not static)["input_ids"]
                for t in body["inputs"]]
    if any(not t.strip() or t == "\u200b" for t in body["inputs"]) or name == "nope":
        return None
    method = {None: "encode", "query": "encode_query", "document": "encode_document"}[name]
    return getattr(ref, method)(body["inputs"], convert_to_sparse_tensor=False).numpy()


def _check(route: str, body: dict, response, ref, task: str, where: str) -> None:
    assert response.status_code < 500, (where, response.text)
    if route == "/rerank":
        want = _rerank_expected(body, ref)
    elif task == "sparse-embedding":
        want = _sparse_expected(route, body, ref)
    else:
        want = _dense_expected(route, body, ref, task)
    if want is None:
        assert 400 <= response.status_code < 500, (where, "accepted a request the server documents refusing")
        return
    assert response.status_code == 200, (where, response.text)
    answer = response.json()
    if route == "/rerank":
        order = [a["index"] for a in answer]
        scores = np.array([a["score"] for a in answer])
        assert sorted(order) == list(range(len(want))) and list(scores) == sorted(scores, reverse=True), where
        np.testing.assert_allclose(scores, want[order], atol=1e-5, err_msg=where)
        assert all(("text" in a) == bool(body.get("return_text")) for a in answer), where
    elif route == "/embed_sparse":
        for got, dense in zip(answer, want, strict=True):
            assert [g["index"] for g in got] == np.nonzero(dense)[0].tolist(), where
            np.testing.assert_allclose([g["value"] for g in got], dense[dense != 0], atol=5e-5, err_msg=where)
    elif route in ("/tokenize", "/embed_all"):
        got = _dense_answer(route, answer)
        assert len(got) == len(want), where
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, atol=1e-5, err_msg=where)
    else:
        np.testing.assert_allclose(_dense_answer(route, answer), want, atol=1e-5, err_msg=where)


@pytest.mark.parametrize("seed", range(SEEDS))
def test_served_sentence_tasks_answer_as_sentence_transformers(seed, minilm_2_layers, tmp_path):
    from bertkit import pipeline
    from bertkit.inference.serve import create_app
    from serve_helpers import Server
    from sparse_helpers import masked_lm_checkpoint

    r = random.Random(seed)
    kind = ["dense", "rerank", "sparse"][seed % 3]
    if kind == "dense":
        ref, task = _dense(r, minilm_2_layers, tmp_path / "model")
    elif kind == "rerank":
        ref, task = _cross_encoder(r, minilm_2_layers, tmp_path / "model")
    else:
        ref, task = _sparse(r, masked_lm_checkpoint(minilm_2_layers, tmp_path / "mlm"), tmp_path / "model")
    draw = {"dense": _dense_request, "rerank": _rerank_request, "sparse": _sparse_request}[kind]
    requests = [draw(r, ref) for _ in range(12)]
    pipe = pipeline(task, tmp_path / "model", batch_size=r.choice([1, 3, 32]), progress=False)
    server = Server(create_app(pipe, str(tmp_path / "model"), max_batch_size=r.choice([2, 8, 32]), max_wait_ms=20))
    try:
        with ThreadPoolExecutor(6) as pool:  # at once: the batcher joins requests of different parameters
            responses = list(pool.map(lambda rb: httpx.post(f"{server.url}{rb[0]}", timeout=120, json={
                k: v for k, v in rb[1].items() if k != "_texts"}), requests))
    finally:
        server.stop()
    for (route, body), response in zip(requests, responses):
        _check(route, body, response, ref, task, f"seed {seed} {task} {route} {json.dumps(body)[:300]}")
