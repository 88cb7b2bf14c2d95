"""`bertkit serve` behind the clients the embedding and retrieval stacks ship, over loopback: OpenAI's Python
client on /v1/embeddings, huggingface_hub's InferenceClient on TEI's ``POST /``, haystack's and llama-index's
OpenAI/TEI embedders and TEI reranker, and prometheus_client's parser on /metrics. Each answer is compared with
bertkit's own pipeline on the same inputs; the API key, TEI's routes (/rerank, /tokenize,
/info) and response headers, and the token bound of a model call are checked here too. The real MiniLM
checkpoint is the embedding model; the classifier and the cross-encoder are MiniLM with a seeded random head.
"""

from __future__ import annotations

import asyncio
import base64
import json
import socket
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("fastapi", reason='bertkit serve needs FastAPI: pip install "bertkit[serve]"')
pytest.importorskip("uvicorn", reason='bertkit serve needs uvicorn: pip install "bertkit[serve]"')
pytest.importorskip("prometheus_client", reason='bertkit serve needs prometheus_client: pip install "bertkit[serve]"')
httpx = pytest.importorskip("httpx", reason="the HTTP client of these tests: pip install httpx")

from serve_helpers import MODEL, Gate, Server, metrics, refusal, until  # noqa: E402  (uvicorn on a free loopback port, in a thread)

KEY = "bk-test-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {KEY}"}
TEXTS = ["A man is playing a guitar.", "The new movie is awesome!", "Paris is the capital of France.",
         "A cheetah runs across the savanna after its prey."]
QUERY = "Which city is the capital of France?"

pytestmark = pytest.mark.skipif(not (MODEL / "config.json").is_file(), reason=f"no checkpoint at {MODEL}")


@pytest.fixture(scope="module")
def embedder():
    """(server URL, the sentence-embedding pipeline): MiniLM, an API key, a served model name."""
    from bertkit import pipeline
    from bertkit.inference.serve import Limits, create_app

    pipe = pipeline("sentence-embedding", MODEL, batch_size=8, progress=False)
    server = Server(create_app(pipe, str(MODEL), max_batch_size=8, max_wait_ms=2, max_batch_tokens=4096,
                               api_key=KEY, served_model_name="bertkit-minilm", limits=Limits(max_items=16)))
    yield server.url, pipe
    server.stop()


def _cross_encoder(base: Path, directory: Path, labels: int) -> Path:
    """A cross-encoder with a seeded random head on ``base`` (MiniLM's first 2 layers: what the routes and clients
    are checked for does not depend on depth, and each answer is compared with the same pipeline's)."""
    from bertkit.heads import BertForSequenceClassification
    from bertkit.tokenization import BertTokenizer

    torch.manual_seed(0)
    id2label = {0: "relevance"} if labels == 1 else {0: "irrelevant", 1: "relevant"}
    BertForSequenceClassification.from_pretrained(base, id2label=id2label).save_pretrained(directory)
    BertTokenizer.from_pretrained(base).save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def reranker(tmp_path_factory, minilm_2_layers):
    """(server URL, the rerank pipeline) of a one-logit cross-encoder; no API key."""
    from bertkit import pipeline
    from bertkit.inference.serve import Limits, create_app

    d = _cross_encoder(minilm_2_layers, tmp_path_factory.mktemp("cross_encoder"), 1)
    pipe = pipeline("rerank", d, batch_size=8, progress=False)
    server = Server(create_app(pipe, str(d), max_batch_size=8, max_wait_ms=2, limits=Limits(max_items=8)))
    yield server.url, pipe
    server.stop()


@pytest.fixture(scope="module")
def classifier(tmp_path_factory, minilm_2_layers):
    """(server URL, the text-classification pipeline) of a two-label classifier; no API key."""
    from bertkit import pipeline
    from bertkit.inference.serve import create_app

    d = _cross_encoder(minilm_2_layers, tmp_path_factory.mktemp("two_labels"), 2)
    pipe = pipeline("text-classification", d, batch_size=8, progress=False)
    server = Server(create_app(pipe, str(d), max_batch_size=8, max_wait_ms=2))
    yield server.url, pipe
    server.stop()


def _unit(v) -> np.ndarray:
    v = np.asarray(v, dtype=np.float64)
    return v / np.linalg.norm(v, axis=-1, keepdims=True)


# ---------------------------------------------------------------------------------------------------
# OpenAI: /v1/embeddings, the API key
# ---------------------------------------------------------------------------------------------------


def test_the_openai_client_gets_the_pipelines_embeddings_as_floats_and_base64(embedder):
    openai = pytest.importorskip("openai")
    url, pipe = embedder
    expected = np.asarray(pipe(TEXTS))
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0)
    default = client.embeddings.create(model="anything", input=TEXTS)  # the client asks for base64 by default
    floats = client.embeddings.create(model="bertkit-minilm", input=TEXTS, encoding_format="float")
    for answer in (default, floats):
        assert answer.model == "bertkit-minilm" and [d.index for d in answer.data] == [0, 1, 2, 3]
        np.testing.assert_allclose(np.asarray([d.embedding for d in answer.data]), expected, atol=1e-5)
    tokens = sum(len(pipe.tokenizer(t)["input_ids"]) for t in TEXTS)
    assert (floats.usage.prompt_tokens, floats.usage.total_tokens) == (tokens, tokens)
    one = client.embeddings.create(model="m", input=TEXTS[0], encoding_format="float")
    np.testing.assert_allclose(one.data[0].embedding, expected[0], atol=1e-5)
    # dimensions: the first n values, then normalised again (OpenAI's text-embedding-3 and TEI's order)
    short = client.embeddings.create(model="m", input=TEXTS, dimensions=64, encoding_format="float")
    np.testing.assert_allclose(np.asarray([d.embedding for d in short.data]), _unit(expected[:, :64]), atol=1e-5)
    # raw base64 is little-endian float32, as OpenAI's
    raw = httpx.post(f"{url}/v1/embeddings", headers=AUTH, json={"input": TEXTS[:1], "encoding_format": "base64"}).json()
    np.testing.assert_allclose(np.frombuffer(base64.b64decode(raw["data"][0]["embedding"]), dtype="<f4"),
                               expected[0], atol=1e-5)


def test_token_ids_are_embedded_as_sent_and_equal_the_texts_embeddings(embedder):
    openai = pytest.importorskip("openai")
    url, pipe = embedder
    ids = [pipe.tokenizer(t)["input_ids"] for t in TEXTS[:2]]
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0)
    answer = client.embeddings.create(model="m", input=ids, encoding_format="float")
    np.testing.assert_allclose(np.asarray([d.embedding for d in answer.data]), np.asarray(pipe(TEXTS[:2])), atol=1e-5)
    one = httpx.post(f"{url}/v1/embeddings", headers=AUTH, json={"input": ids[0]}).json()
    np.testing.assert_allclose(one["data"][0]["embedding"], pipe(TEXTS[0]), atol=1e-5)
    assert one["usage"]["prompt_tokens"] == len(ids[0])


def test_the_openai_client_shows_why_a_request_was_refused(embedder):
    """A refusal on /v1/embeddings is OpenAI's error body, whose message the client puts in the exception: with TEI's
    {"error": str} it said "Error code: 422" and no more."""
    openai = pytest.importorskip("openai")
    url, _ = embedder
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0)
    with pytest.raises(openai.UnprocessableEntityError) as refused:
        client.embeddings.create(model="m", input=["a text", "  "])
    assert str(refused.value).startswith("Error code: 422 - sentence-embedding input 1 is empty: '  ' holds no token")
    assert (refused.value.type, refused.value.code, refused.value.param) == ("Validation", None, None)
    with pytest.raises(openai.AuthenticationError) as unauthorized:
        openai.OpenAI(base_url=f"{url}/v1", api_key="wrong", max_retries=0).embeddings.create(model="m", input="x")
    assert str(unauthorized.value).startswith("Error code: 401 - this server needs an API key")
    assert unauthorized.value.type == "Unauthorized"
    # TEI's routes keep TEI's body, its error type spelt as TEI's server sends it (not its OpenAPI page's "validation")
    assert httpx.post(f"{url}/embed", headers=AUTH, json={"inputs": "  "}).json()["error_type"] == "Validation"


@pytest.mark.parametrize("body, message", [
    ({"input": "x", "encoding": "float"}, "unknown field(s) encoding"),
    ({"model": "m"}, "needs the field(s) input"),
    ({"input": []}, "input must be a string, a non-empty list"),
    ({"input": [[101, 7592, 102], "a", 3]}, "input 2 is int"),
    ({"input": [[101, 99999999]]}, "token id 99999999, outside this model's vocabulary"),
    # "hello world" as tiktoken's cl100k ids, what LangChain's OpenAIEmbeddings sends: in range, but not a sequence
    # of this model's, which would embed as some other text without an error
    ({"input": [[15339, 1917]]}, "does not start with [CLS] (101) and end with [SEP] (102): token ids are this "
                                 "model's"),
    ({"input": [101, 7592, 2088]}, "check_embedding_ctx_length=False"),
    # one sequence of ids with a float in it: the float is named, not the valid id before it ("input 0 is int 101")
    ({"input": [101, 7592.5, 102]}, "7592.5 in it is not a token id (an int)"),
    ({"input": [101, True, 102]}, "true in it is not a token id"),
    ({"input": [101, None]}, "null in it is not a token id"),
    ({"input": "x", "encoding_format": "int8"}, 'encoding_format must be "float" or "base64"'),
    ({"input": "x", "dimensions": 385}, "dimensions must be an int in [1, 384]"),
    ({"input": ["x"] * 17}, "17 inputs exceed max_items 16"),
])
def test_a_malformed_embeddings_body_gets_a_422_naming_the_field(embedder, body, message):
    url, _ = embedder
    r = httpx.post(f"{url}/v1/embeddings", headers=AUTH, json=body)
    assert r.status_code == 422 and message in refusal(r), r.text


def test_every_route_but_health_needs_the_key_and_refuses_before_reading_the_body(embedder, caplog):
    openai = pytest.importorskip("openai")
    caplog.set_level("DEBUG")  # the server runs in this process: whatever it logs about these requests is here
    from bertkit.inference.serve import create_app

    url, pipe = embedder
    assert httpx.get(f"{url}/health").status_code == 200
    # every route the app has (FastAPI's own pages included), read from the app, so a new route is checked too
    app = create_app(pipe, str(MODEL), api_key=KEY)
    routes = sorted({(method, r.path) for r in app.routes for method in getattr(r, "methods", ()) or ()
                     if method != "HEAD" and r.path != "/health"})
    assert {("POST", "/rerank"), ("POST", "/tokenize"), ("POST", "/predict"), ("POST", "/similarity"),
            ("GET", "/ready")} <= set(routes), routes
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}, {"Authorization": f"Bearer {KEY}x"}):
        for method, path in routes:
            r = httpx.request(method, f"{url}{path}", headers=headers, json={"input": "x"})
            assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer", (path, headers, r.text)
            assert KEY not in r.text
    # a body declared as 10 MB but never sent: the 401 comes from the headers alone, at once
    import socket

    with socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1])), timeout=10) as sock:
        sock.sendall(b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Length: 10000000\r\n\r\n")
        assert sock.recv(100).startswith(b"HTTP/1.1 401")
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{url}/v1", api_key="wrong", max_retries=0).embeddings.create(model="m", input="x")
    openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0).embeddings.create(model="m", input="x")
    assert caplog.records, "the server logged nothing here: the check below would prove nothing"
    assert KEY not in caplog.text


def test_the_app_its_openapi_page_and_the_cli_help_come_from_the_route_registry(embedder, capsys):
    """A route is one object: adding one to ``ROUTES`` serves it and documents it, with nothing else to keep in
    step (there were four tables keyed by the same string)."""
    from bertkit import cli
    from bertkit.inference.serve import ROUTES

    url, _ = embedder
    declared = {(r.method, r.path) for r in ROUTES}
    assert len(declared) == len(ROUTES)  # no path declared twice
    openapi = httpx.get(f"{url}/openapi.json", headers=AUTH).json()["paths"]
    assert {(m.upper(), path) for path, ops in openapi.items() for m in ops} == declared
    assert all(openapi[r.path][r.method.lower()]["summary"] == r.help for r in ROUTES)
    with pytest.raises(SystemExit):
        cli.main(["serve", "--help"])
    help_text = capsys.readouterr().out
    assert all(f"{r.method:4} {r.path}" in help_text and r.help in help_text for r in ROUTES), help_text


# ---------------------------------------------------------------------------------------------------
# TEI: POST /, /rerank, /tokenize, /info, headers
# ---------------------------------------------------------------------------------------------------


def test_inference_client_on_the_root_route_gets_the_pipelines_embeddings(embedder):
    InferenceClient = pytest.importorskip("huggingface_hub").InferenceClient

    url, pipe = embedder
    got = InferenceClient(url, api_key=KEY).feature_extraction(TEXTS[0])
    np.testing.assert_allclose(got.reshape(-1), pipe(TEXTS[0]), atol=1e-5)


def test_inference_client_on_the_root_route_of_a_classifier(classifier):
    InferenceClient = pytest.importorskip("huggingface_hub").InferenceClient

    url, pipe = classifier
    got = InferenceClient(url).text_classification(TEXTS[1])
    expected = pipe(TEXTS[1])
    assert got[0].label == expected["label"]
    assert {e.label: e.score for e in got} == pytest.approx(expected["scores"], abs=1e-5)


def test_rerank_ranks_as_the_rerank_pipeline_and_scores_as_tei(reranker):
    url, pipe = reranker
    expected = pipe({"query": QUERY, "texts": TEXTS}, return_text=True)
    r = httpx.post(f"{url}/rerank", json={"query": QUERY, "texts": TEXTS, "return_text": True})
    assert r.status_code == 200, r.text
    got = r.json()
    assert [g["index"] for g in got] == [e["index"] for e in expected]
    assert [g["text"] for g in got] == [TEXTS[e["index"]] for e in expected]
    assert [g["score"] for g in got] == pytest.approx([e["score"] for e in expected], abs=1e-5)
    # the score is the sigmoid of the one logit; raw_scores gives the logit itself
    logits = pipe.run_rows(pipe.encode({"query": QUERY, "texts": TEXTS}))
    raw = httpx.post(f"{url}/rerank", json={"query": QUERY, "texts": TEXTS, "raw_scores": True}).json()
    assert {g["index"]: g["score"] for g in raw} == pytest.approx({i: float(x[0]) for i, x in enumerate(logits)},
                                                                  abs=1e-5)
    assert "text" not in raw[0] and [g["score"] for g in got] == sorted((g["score"] for g in got), reverse=True)
    root = httpx.post(f"{url}/", json={"query": QUERY, "texts": TEXTS}).json()  # TEI's POST / on a reranker
    assert [g["index"] for g in root] == [e["index"] for e in expected]


def test_rerank_top_n_answers_the_best_n_best_first_as_cohere(reranker):
    """Elasticsearch's hugging_face rerank service and LiteLLM's Hugging Face reranker post Cohere's top_n to TEI's
    /rerank (beside texts and return_text; LiteLLM's with truncate false, truncation_direction "Right"); it was
    refused as an unknown field. Now the best top_n texts, best first:
    the head of TEI's answer of every text (whose order and scores are CrossEncoder.rank's: the test below)."""
    url, pipe = reranker
    full = httpx.post(f"{url}/rerank", json={"query": QUERY, "texts": TEXTS}).json()
    for top_n, count in ((2, 2), (1, 1), (4, 4), (10, 4)):
        body = {"query": QUERY, "texts": TEXTS, "top_n": top_n, "return_text": True, "raw_scores": False,
                "truncate": False, "truncation_direction": "Right"}  # LiteLLM's body
        r = httpx.post(f"{url}/rerank", json=body)
        assert r.status_code == 200, r.text
        got = r.json()
        assert [(g["index"], g["score"]) for g in got] == [(g["index"], g["score"]) for g in full[:count]]
        assert [g["text"] for g in got] == [TEXTS[g["index"]] for g in got]
    assert httpx.post(f"{url}/rerank", json={"query": QUERY, "texts": TEXTS, "top_n": None}).json() == full
    es = {"texts": TEXTS, "query": QUERY, "return_text": False, "top_n": 3}  # Elasticsearch's body
    assert httpx.post(f"{url}/rerank", json=es).json() == full[:3]


@pytest.mark.slow  # sentence-transformers' import alone takes 10 s and more
def test_rerank_top_n_equals_cross_encoder_rank_top_k(reranker):
    st = pytest.importorskip("sentence_transformers")
    url, _ = reranker
    directory = httpx.get(f"{url}/info").json()["model_id"]
    want = st.CrossEncoder(directory, device="cpu").rank(QUERY, TEXTS, top_k=2)
    best = httpx.post(f"{url}/rerank", json={"query": QUERY, "texts": TEXTS, "top_n": 2}).json()
    assert [g["index"] for g in best] == [w["corpus_id"] for w in want]
    assert [g["score"] for g in best] == pytest.approx([float(w["score"]) for w in want], abs=1e-5)


def test_rerank_scores_equal_transformers_sigmoid_of_the_cross_encoders_logit(reranker):
    transformers = pytest.importorskip("transformers")
    url, _ = reranker
    got = httpx.post(f"{url}/rerank", json={"query": QUERY, "texts": TEXTS}).json()
    directory = httpx.get(f"{url}/info").json()["model_id"]  # the checkpoint the server loaded
    model = transformers.BertForSequenceClassification.from_pretrained(directory).eval()
    tokenizer = transformers.BertTokenizerFast.from_pretrained(directory)
    with torch.no_grad():
        logits = model(**tokenizer([QUERY] * len(TEXTS), TEXTS, padding=True, return_tensors="pt")).logits
    expected = torch.sigmoid(logits[:, 0]).tolist()
    assert {g["index"]: g["score"] for g in got} == pytest.approx(dict(enumerate(expected)), abs=1e-5)


def test_rerank_on_a_classifier_server_answers_424_naming_the_rerank_task(classifier):
    r = httpx.post(f"{classifier[0]}/rerank", json={"query": QUERY, "texts": TEXTS})
    assert r.status_code == 424 and "start it with --task rerank" in r.json()["error"], r.text
    assert r.json()["error_type"] == "Backend"  # TEI's type for "model is not a re-ranker model"


@pytest.mark.parametrize("body, status, message", [
    ({"query": QUERY}, 422, "needs the field(s) texts"),
    ({"query": QUERY, "texts": []}, 422, "texts must be a string or a non-empty list"),
    ({"query": QUERY, "texts": ["a"], "top_n": 0}, 422, "top_n must be an int of at least 1"),
    ({"query": QUERY, "documents": ["a"]}, 422, "unknown field(s) documents; /rerank takes query, texts"),
    ({"query": QUERY, "texts": ["a"] * 9}, 422, "9 texts exceed max_items 8"),
    ({"query": QUERY, "texts": ["a"], "raw_scores": "yes"}, 422, "raw_scores must be true or false"),
    ({"query": QUERY, "texts": ["word " * 600], "truncate": False}, 422, "over max_length 512"),
])
def test_a_malformed_rerank_body_gets_a_4xx_naming_the_field(reranker, body, status, message):
    url, _ = reranker
    r = httpx.post(f"{url}/rerank", json=body)
    assert r.status_code == status and message in r.json()["error"], r.text


def test_embedding_routes_on_a_reranker_and_rerank_on_an_embedder_answer_424(reranker, embedder):
    assert httpx.post(f"{reranker[0]}/v1/embeddings", json={"input": "x"}).status_code == 424
    assert httpx.post(f"{embedder[0]}/rerank", headers=AUTH, json={"query": "q", "texts": ["x"]}).status_code == 424


def test_tokenize_answers_as_tei(embedder):
    url, pipe = embedder
    text = "Héllo, world!"
    tokens = httpx.post(f"{url}/tokenize", headers=AUTH, json={"inputs": text}).json()
    ids = pipe.tokenizer(text)["input_ids"]
    assert [t["id"] for t in tokens[0]] == ids
    assert tokens[0][0] == {"id": 101, "text": "[CLS]", "special": True, "start": None, "stop": None}
    assert [t["text"] for t in tokens[0][1:-1]] == [text[t["start"]:t["stop"]] for t in tokens[0][1:-1]]
    assert tokens[0][1]["text"] == "Héllo"
    plain = httpx.post(f"{url}/tokenize", headers=AUTH, json={"inputs": [text, "a"], "add_special_tokens": False})
    assert [len(x) for x in plain.json()] == [len(ids) - 2, 1]
    # an escaped surrogate pair is its character; half of one is refused, as TEI's parser refuses it (was a 500:
    # the answer echoing it could not be encoded as UTF-8)
    pair = httpx.post(f"{url}/tokenize", headers={**AUTH, "content-type": "application/json"},
                      content=b'{"inputs": "\\ud83d\\ude00 ok"}').json()[0]
    assert [(t["id"], t["text"], t["start"], t["stop"]) for t in pair[1:-1]] == [(100, "\U0001f600", 0, 1),
                                                                                  (7929, "ok", 2, 4)]
    half = httpx.post(f"{url}/tokenize", headers={**AUTH, "content-type": "application/json"},
                      content=b'{"inputs": ["fine", "\\ud83d ok"]}')
    assert half.status_code == 400 and "a string holds \\ud83d, half of a UTF-16 surrogate pair" in half.json()["error"]


def test_decode_answers_as_tei(embedder):
    """TEI's /decode (was a 404): one text per sequence, as the tokenizer decodes it (tokenizers' WordPiece decoder,
    which TEI runs), special tokens left out by default."""
    url, pipe = embedder
    ids = pipe.tokenizer("Héllo, world! Don't stop.")["input_ids"]
    one = httpx.post(f"{url}/decode", headers=AUTH, json={"ids": ids})
    assert one.status_code == 200 and one.json() == ["hello, world! don ' t stop."], one.text
    both = httpx.post(f"{url}/decode", headers=AUTH, json={"ids": [ids, [101, 103, 102]], "skip_special_tokens": False})
    assert both.json() == ["[CLS] hello, world! don ' t stop. [SEP]", "[CLS] [MASK] [SEP]"]
    for body, message in (({"ids": [[101, 30522]]}, "sequence 0 holds token id 30522, outside this model's vocabulary "
                                                    "[0, 30522)"),
                          ({"ids": []}, "ids must be a non-empty list of token ids"),
                          ({"ids": [[1], []]}, "ids must be a non-empty list of token ids"),
                          ({"ids": [1], "skip_special_tokens": 0}, "skip_special_tokens must be true or false"),
                          ({"ids": [[1]] * 17}, "17 sequences of ids exceed max_items 16")):
        r = httpx.post(f"{url}/decode", headers=AUTH, json=body)
        assert r.status_code == 422 and message in r.json()["error"], (body, r.text)


def test_info_has_teis_fields_and_answers_carry_teis_headers(embedder, reranker):
    url, pipe = embedder
    info = httpx.get(f"{url}/info", headers=AUTH).json()
    assert info["model_id"] == info["served_model_name"] == "bertkit-minilm" and info["model_sha"] is None
    assert info["model_type"] == {"embedding": {"pooling": "mean"}} and info["model_dtype"] == "float32"
    assert (info["max_input_length"], info["max_batch_tokens"], info["max_batch_requests"],
            info["max_client_batch_size"], info["max_concurrent_requests"]) == (512, 4096, 8, 16, 64)
    rinfo = httpx.get(f"{reranker[0]}/info").json()
    assert rinfo["model_type"] == {"reranker": {"id2label": {"0": "relevance"}, "label2id": {"relevance": 0}}}
    r = httpx.post(f"{url}/embed", headers=AUTH, json={"inputs": TEXTS[:2]})
    tokens = sum(len(pipe.tokenizer(t)["input_ids"]) for t in TEXTS[:2])
    assert r.headers["x-compute-tokens"] == str(tokens)
    assert r.headers["x-compute-characters"] == str(len(TEXTS[0]) + len(TEXTS[1]))
    times = {h: int(r.headers[h]) for h in ("x-compute-time", "x-total-time", "x-queue-time", "x-inference-time")}
    assert all(v >= 0 for v in times.values()) and times["x-total-time"] >= times["x-inference-time"]


# ---------------------------------------------------------------------------------------------------
# /metrics
# ---------------------------------------------------------------------------------------------------


def _samples(url: str, headers: dict | None = None) -> dict[tuple, float]:
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{url}/metrics", headers=headers).text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_metrics_parse_and_the_counters_move_by_the_requests_sent(reranker):
    url, pipe = reranker
    before = _samples(url)
    for _ in range(3):
        assert httpx.post(f"{url}/rerank", json={"query": QUERY, "texts": TEXTS[:2]}).status_code == 200
    assert httpx.post(f"{url}/rerank", json={"query": QUERY}).status_code == 422
    after = _samples(url)
    tokens = 3 * sum(len(pipe.tokenizer(QUERY, t)["input_ids"]) for t in TEXTS[:2])
    moved = {name: after[(name, ())] - before[(name, ())] for name in (
        "bertkit_requests_total", "bertkit_errors_total", "bertkit_items_total", "bertkit_tokens_total",
        "bertkit_batches_total", "bertkit_refused_total")}
    assert moved == {"bertkit_requests_total": 4, "bertkit_errors_total": 1, "bertkit_items_total": 6,
                     "bertkit_tokens_total": tokens, "bertkit_batches_total": 3, "bertkit_refused_total": 0}
    assert after[("bertkit_model_seconds_total", ())] > before[("bertkit_model_seconds_total", ())]
    assert after[("bertkit_admitted_inputs", ())] == after[("bertkit_queued_requests", ())] == 0
    assert after[("bertkit_largest_batch", ())] >= 2
    # Typed as each sample is named: a TYPE line naming bertkit_requests left bertkit_requests_total "unknown"
    from prometheus_client.parser import text_string_to_metric_families

    kinds = {s.name: family.type for family in text_string_to_metric_families(httpx.get(f"{url}/metrics").text)
             for s in family.samples}
    assert kinds == {**{f"bertkit_{name}_total": "counter" for name in (
        "requests", "items", "tokens", "batches", "model_seconds", "refused", "abandoned", "errors")},
        **dict.fromkeys(("bertkit_admitted_inputs", "bertkit_queued_requests", "bertkit_largest_batch"), "gauge")}


def test_a_request_refused_by_the_api_key_is_counted_as_any_other_refusal(embedder):
    """Was: a 422 moved bertkit_requests_total and bertkit_errors_total, a 401 from the API key moved neither. One
    rule now: a request to a route that parses a body counts in requests, and its refusal once more in errors (or
    refused, for 429/503); the GET routes count nothing, refused or not."""
    url, _ = embedder
    names = ("bertkit_requests_total", "bertkit_errors_total", "bertkit_refused_total")
    before = _samples(url, AUTH)
    sent = [httpx.post(f"{url}/v1/embeddings", json={"input": "a"}),  # no key
            httpx.post(f"{url}/embed", headers={"Authorization": "Bearer wrong"}, json={"inputs": "a"}),
            httpx.post(f"{url}/v1/embeddings", headers=AUTH, json={"input": "a", "dimensions": 0}),
            httpx.get(f"{url}/info")]  # a GET route: refused, not counted
    assert [r.status_code for r in sent] == [401, 401, 422, 401]
    kinds = [r.json()["error"]["type"] if r.url.path == "/v1/embeddings" else r.json()["error_type"] for r in sent]
    assert kinds == ["Unauthorized", "Unauthorized", "Validation", "Unauthorized"]
    after = _samples(url, AUTH)
    assert {n: after[(n, ())] - before[(n, ())] for n in names} == {
        "bertkit_requests_total": 3, "bertkit_errors_total": 3, "bertkit_refused_total": 0}


def test_two_apps_in_one_process_count_apart(embedder, reranker):
    before = _samples(embedder[0], AUTH)
    httpx.post(f"{reranker[0]}/rerank", json={"query": QUERY, "texts": TEXTS[:1]})
    after = _samples(embedder[0], AUTH)
    key = ("bertkit_items_total", ())
    assert after[key] == before[key]


# ---------------------------------------------------------------------------------------------------
# the token bound of a model call
# ---------------------------------------------------------------------------------------------------


def test_a_model_call_carries_at_most_max_batch_tokens_padded_tokens():
    from bertkit.inference.serve_batching import Batcher, Stats

    async def calls() -> list[list[int]]:
        seen: list[list[int]] = []
        batcher = Batcher(lambda items, options: (seen.append(list(items)), items)[1], max_batch_size=64,
                          max_wait_ms=0, max_inputs=64, stats=Stats(), max_tokens=1000)
        # 10 inputs of 100 tokens fit (1000); one of 300 tokens makes 4 x 300 > 1000 with three others
        jobs = [batcher.admit([i], {}, longest=100) for i in range(10)]
        jobs += [batcher.admit([10 + i], {}, longest=300 if i == 0 else 10) for i in range(4)]
        batcher.start()
        await asyncio.gather(*(j.future for j in jobs))
        await batcher.stop()
        return seen

    assert asyncio.run(calls()) == [list(range(10)), [10, 11, 12], [13]]


def test_max_batch_tokens_below_max_length_is_refused(embedder):
    from bertkit.errors import BertkitError
    from bertkit.inference.serve import create_app

    with pytest.raises(BertkitError, match="max_batch_tokens 100 is below max_length 512"):
        create_app(embedder[1], "m", max_batch_tokens=100)


# ---------------------------------------------------------------------------------------------------
# the retrieval stacks' own embedders and rerankers
# ---------------------------------------------------------------------------------------------------


def test_haystacks_openai_document_embedder(embedder, monkeypatch):
    monkeypatch.setenv("HAYSTACK_TELEMETRY_ENABLED", "False")  # haystack would report usage to posthog
    pytest.importorskip("haystack", reason="haystack-ai is not installed")
    from haystack import Document
    from haystack.components.embedders import OpenAIDocumentEmbedder
    from haystack.utils import Secret

    url, pipe = embedder
    embedder_ = OpenAIDocumentEmbedder(api_key=Secret.from_token(KEY), model="bertkit-minilm", api_base_url=f"{url}/v1",
                                       progress_bar=False)
    out = embedder_.run(documents=[Document(content=t) for t in TEXTS])
    np.testing.assert_allclose(np.asarray([d.embedding for d in out["documents"]]), np.asarray(pipe(TEXTS)), atol=1e-5)
    assert out["meta"]["model"] == "bertkit-minilm"


# langchain's import (about 2 s); the InferenceClient it wraps, on the same route, is make test's in
# test_inference_client_on_the_root_route_gets_the_pipelines_embeddings
@pytest.mark.slow
def test_langchain_huggingface_endpoint_embeddings_given_the_base_url(embedder):
    """langchain-huggingface's HuggingFaceEndpointEmbeddings(model=base URL): huggingface_hub's InferenceClient
    on TEI's POST /, as LangChain's docs configure it for a TEI server."""
    lc = pytest.importorskip("langchain_huggingface", reason="langchain-huggingface is not installed")
    url, pipe = embedder
    model = lc.HuggingFaceEndpointEmbeddings(model=url, huggingfacehub_api_token=KEY)
    np.testing.assert_allclose(np.asarray(model.embed_documents(TEXTS)), np.asarray(pipe(TEXTS)), atol=1e-5)
    np.testing.assert_allclose(model.embed_query(QUERY), pipe(QUERY), atol=1e-5)


# llama-index's import; llama-index's TEI rerank client stays in make test (test_llama_index_tei_rerank_postprocessor)
# and the /embed route this client posts to is make test's in test_serve_wire.py
@pytest.mark.slow
def test_llama_index_tei_embeddings(embedder):
    tei = pytest.importorskip("llama_index.embeddings.text_embeddings_inference",
                              reason="llama-index-embeddings-text-embeddings-inference is not installed")
    url, pipe = embedder
    model = tei.TextEmbeddingsInference(model_name="bertkit-minilm", base_url=url, auth_token=KEY, embed_batch_size=2)
    got = model.get_text_embedding_batch(TEXTS)
    np.testing.assert_allclose(np.asarray(got), np.asarray(pipe(TEXTS)), atol=1e-5)
    np.testing.assert_allclose(model.get_query_embedding(QUERY), pipe(QUERY), atol=1e-5)


def test_llama_index_tei_rerank_postprocessor(reranker):
    rerank = pytest.importorskip("llama_index.postprocessor.tei_rerank",
                                 reason="llama-index-postprocessor-tei-rerank is not installed")
    from llama_index.core.schema import NodeWithScore, TextNode

    url, pipe = reranker
    nodes = [NodeWithScore(node=TextNode(text=t), score=0.0) for t in TEXTS]
    kept = rerank.TextEmbeddingInference(base_url=url, top_n=2).postprocess_nodes(nodes, query_str=QUERY)
    expected = pipe({"query": QUERY, "texts": TEXTS})[:2]
    assert [n.node.get_content() for n in kept] == [TEXTS[e["index"]] for e in expected]
    assert [n.score for n in kept] == pytest.approx([e["score"] for e in expected], abs=1e-5)


# ---------------------------------------------------------------------------------------------------
# admission, the rerank task offline and on /predict, the key from the environment
# ---------------------------------------------------------------------------------------------------


def test_rerank_is_admitted_by_pairs_refused_with_429_when_full_and_dropped_when_its_client_leaves(tmp_path,
                                                                                                   minilm_2_layers):
    import concurrent.futures

    from bertkit.inference.pipelines import RerankPipeline
    from bertkit.inference.serve import Limits, create_app

    gate = Gate()

    class Held(RerankPipeline):
        def run_rows(self, rows):
            gate()
            return super().run_rows(rows)

    pipe = Held.from_pretrained(_cross_encoder(minilm_2_layers, tmp_path / "ce", 1), batch_size=4, progress=False)
    server = Server(create_app(pipe, "ce", max_batch_size=4, max_wait_ms=1,
                               limits=Limits(max_items=3, max_concurrent_requests=6)))

    def rerank(texts: list[str], timeout: float = 60) -> httpx.Response:
        return httpx.post(f"{server.url}/rerank", json={"query": QUERY, "texts": texts}, timeout=timeout)

    try:
        gate.hold()
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            first = pool.submit(rerank, TEXTS[:3])
            assert gate.entered.wait(30)  # three pairs in the model
            # three more queued, by a client that leaves when the test says (a timeout would race a loaded machine)
            gone = socket.create_connection(("127.0.0.1", server.port))
            body = json.dumps({"query": QUERY, "texts": TEXTS[1:4]}).encode()
            gone.sendall(b"POST /rerank HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            until(lambda: metrics(server.url)["admitted_inputs"] == 6)
            r = rerank(TEXTS[:1])  # the bound of 6 pairs is reached
            assert r.status_code == 429 and "max_concurrent_requests 6" in r.json()["error"]
            assert int(r.headers["retry-after"]) >= 1
            late = httpx.post(f"{server.url}/v1/embeddings", json={"input": "x"})
            assert late.status_code == 429  # refused before its body is read, whatever the route
            assert httpx.post(f"{server.url}/tokenize", json={"inputs": "x"}).status_code == 200  # no model needed
            gone.close()
            until(lambda: metrics(server.url)["abandoned"] == 3)  # dropped while the model is still held
            assert metrics(server.url)["admitted_inputs"] == 3
            gate.release()
            assert first.result().status_code == 200
        until(lambda: metrics(server.url)["admitted_inputs"] == 0)
        assert metrics(server.url)["items"] == 3  # the first request's pairs only: the departed client's never ran
        r = httpx.post(f"{server.url}/rerank", json={"query": QUERY, "texts": TEXTS[:2]})
        assert r.status_code == 200 and len(r.json()) == 2
    finally:
        gate.release()
        server.stop()


def test_the_rerank_pipeline_offline_equals_predict_on_a_rerank_server(reranker):
    from bertkit.errors import BertkitError

    url, pipe = reranker
    expected = pipe({"query": QUERY, "texts": TEXTS}, return_text=True)
    got = httpx.post(f"{url}/predict", json={"inputs": {"query": QUERY, "texts": TEXTS},
                                              "parameters": {"return_text": True}}).json()
    assert [g["index"] for g in got] == [e["index"] for e in expected]
    assert [g["score"] for g in got] == pytest.approx([e["score"] for e in expected], abs=1e-6)
    assert [g["text"] for g in got] == [TEXTS[e["index"]] for e in expected]
    assert sorted(e["index"] for e in expected) == [0, 1, 2, 3]
    over = httpx.post(f"{url}/predict", json={"inputs": {"query": QUERY, "texts": TEXTS * 70}})
    assert over.status_code == 422 and "(query, text) pairs" in over.json()["error"]
    with pytest.raises(BertkitError, match=r"expected \{'query': str, 'texts': \[str, \.\.\.\]\} \(lists non-empty\)"):
        pipe({"query": QUERY, "texts": []})


def test_a_model_with_three_labels_is_not_a_reranker(tmp_path, minilm_2_layers):
    from bertkit import pipeline
    from bertkit.errors import BertkitError
    from bertkit.heads import BertForSequenceClassification
    from bertkit.tokenization import BertTokenizer

    BertForSequenceClassification.from_pretrained(minilm_2_layers, id2label={0: "a", 1: "b", 2: "c"}
                                                  ).save_pretrained(tmp_path)
    BertTokenizer.from_pretrained(minilm_2_layers).save_pretrained(tmp_path)
    with pytest.raises(BertkitError, match="rerank needs a cross-encoder with one logit or two labels; this model "
                                           "has 3 labels"):
        pipeline("rerank", tmp_path)


def test_the_api_key_comes_from_the_environment_and_stays_out_of_the_settings_repr(monkeypatch):
    import bertkit.inference.serve as serve_module
    from bertkit import cli

    seen = {}
    monkeypatch.setattr(serve_module, "serve", lambda s: seen.setdefault("s", s) and {})
    monkeypatch.setenv("BERTKIT_API_KEY", KEY)
    assert cli.main(["serve", "--model", str(MODEL), "--task", "sentence-embedding"]) == 0
    assert seen["s"].api_key == KEY and KEY not in repr(seen["s"])
    seen.clear()
    assert cli.main(["serve", "--model", str(MODEL), "--task", "rerank", "--api-key", "other",
                     "--served-model-name", "x", "--max-batch-tokens", "1024"]) == 0
    assert (seen["s"].api_key, seen["s"].served_model_name, seen["s"].max_batch_tokens) == ("other", "x", 1024)


@pytest.mark.parametrize("env, flags, source", [
    ("", [], "the environment variable BERTKIT_API_KEY is empty"),  # a secret templated but unset
    ("   ", [], "the environment variable BERTKIT_API_KEY is empty"),
    ("", ["--api-key", KEY], "the environment variable BERTKIT_API_KEY is empty"),  # meant to be set: refused too
    (None, ["--api-key", " "], "--api-key is empty"),
    (KEY, ["--api-key", ""], "--api-key is empty"),
])
def test_an_empty_api_key_from_any_source_is_refused_at_start_up_naming_it(monkeypatch, capsys, env, flags, source):
    """BERTKIT_API_KEY='' served every route without authentication while --api-key '' was refused."""
    import bertkit.inference.serve as serve_module
    from bertkit import cli

    served = []
    monkeypatch.setattr(serve_module, "serve", lambda s: served.append(s) or {})
    monkeypatch.delenv("BERTKIT_API_KEY", raising=False)
    if env is not None:
        monkeypatch.setenv("BERTKIT_API_KEY", env)
    assert cli.main(["serve", "--model", str(MODEL), "--task", "sentence-embedding", *flags]) == 2
    assert not served
    err = capsys.readouterr().err
    assert f"the API key from {source}" in err and "remove" in err, err


@pytest.mark.parametrize("key, line", [
    (KEY, "every route but /health is protected by an API key"),
    (None, "the routes are NOT protected: anyone who reaches this address can use them"),
])
def test_the_start_up_line_says_whether_the_routes_are_protected(monkeypatch, caplog, key, line, minilm_2_layers):
    import uvicorn

    import bertkit.inference.serve as serve_module
    from bertkit.inference.serve import serve
    from bertkit.settings import ServeSettings

    monkeypatch.setattr(uvicorn.Server, "run", lambda self, sockets=None: None)
    monkeypatch.setattr(serve_module, "bound_onednn_caches", lambda: [])  # the server process's environment, not pytest's
    caplog.set_level("INFO", logger="bertkit")
    serve(ServeSettings(model_name_or_path=minilm_2_layers, task="sentence-embedding", api_key=key))
    started = [r.getMessage() for r in caplog.records if r.getMessage().startswith("serving ")]
    assert len(started) == 1 and line in started[0], started
    assert KEY not in caplog.text


@pytest.mark.parametrize("path, body, texts", [
    ("/v1/embeddings", {"input": ["a text", ""]}, ["a text", ""]),
    ("/v1/embeddings", {"input": "  "}, ["  "]),
    ("/embed", {"inputs": ["", "a text"]}, ["", "a text"]),
    ("/", {"inputs": "\t"}, ["\t"]),
    ("/predict", {"inputs": ["a text", "b", "\u200b"]}, ["a text", "b", "\u200b"]),  # a zero-width space alone
])
def test_an_empty_text_is_refused_on_every_route_in_the_pipelines_words(embedder, path, body, texts):
    """An empty string got the vector of [CLS] [SEP] as if it were the text's (OpenAI and TEI refuse it). The server
    refuses it by the pipeline's one rule, in its words: the same input index, the same message."""
    from bertkit.errors import BertkitError

    url, pipe = embedder
    r = httpx.post(f"{url}{path}", headers=AUTH, json=body)
    assert r.status_code == 422, r.text
    with pytest.raises(BertkitError) as refused:
        pipe(texts)
    assert refusal(r) == str(refused.value)
    assert " is empty: " in refusal(r)


def test_similarity_names_a_refused_sentence_by_its_field(embedder):
    """/similarity named a sentence it refused by its place among the texts it embeds, the source sentence first: the
    second of ``sentences`` was "input 2", which a client reads as sentences[2] (another text, or none)."""
    url, _ = embedder

    def refused(inputs: dict, **parameters) -> str:
        r = httpx.post(f"{url}/similarity", headers=AUTH, json={"inputs": inputs, "parameters": parameters})
        assert r.status_code == 422, r.text
        return refusal(r)

    assert refused({"source_sentence": "a text", "sentences": ["b", ""]}).startswith(
        "sentence-embedding input sentences[1] is empty: '' holds no token")
    assert refused({"source_sentence": "x " * 600, "sentences": ["b"]}, truncate=False).startswith(
        "input source_sentence has 602 tokens, over max_length 512; send truncate: true")
    assert refused({"source_sentence": "a", "sentences": ["b", "y " * 600]}, truncate=False).startswith(
        "input sentences[1] has 602 tokens")


def test_a_text_of_emoji_is_embedded_as_the_pipeline_embeds_it_not_refused_as_empty(embedder, reranker):
    """Was: refused on /v1/embeddings as "empty" ([UNK] is a special token) although it is [CLS] [UNK] [UNK] [SEP]
    and the pipeline embedded it; likewise a query of unknown characters on /rerank. One rule now: a text is empty
    when the tokenizer keeps no token of it, and [UNK] is a token the model reads."""
    url, pipe = embedder
    text = "\U0001F600 \U0001F389"
    tok = pipe.tokenizer
    assert tok(text)["input_ids"] == [tok.cls_token_id, tok.unk_token_id, tok.unk_token_id, tok.sep_token_id]
    expected = pipe(text)
    r = httpx.post(f"{url}/v1/embeddings", headers=AUTH, json={"input": text})
    assert r.status_code == 200, r.text
    np.testing.assert_allclose(r.json()["data"][0]["embedding"], expected, atol=1e-5)
    np.testing.assert_allclose(httpx.post(f"{url}/embed", headers=AUTH, json={"inputs": text}).json()[0], expected,
                               atol=1e-5)
    ids = tok(text)["input_ids"]
    np.testing.assert_allclose(httpx.post(f"{url}/v1/embeddings", headers=AUTH, json={"input": ids}).json()["data"][0][
        "embedding"], expected, atol=1e-5)
    rr_url, rr_pipe = reranker
    got = httpx.post(f"{rr_url}/rerank", json={"query": text, "texts": TEXTS[:2]})
    assert got.status_code == 200, got.text
    assert [a["index"] for a in got.json()] == [a["index"] for a in rr_pipe({"query": text, "texts": TEXTS[:2]})]


def test_no_route_shows_the_models_path_once_a_served_name_is_given(embedder):
    url, pipe = embedder
    app_routes = ("/health", "/ready", "/info", "/metrics", "/openapi.json")
    for path in app_routes:
        r = httpx.get(f"{url}{path}", headers=AUTH)
        assert r.status_code == 200 and str(MODEL) not in r.text, (path, r.text[:300])
    assert httpx.get(f"{url}/info", headers=AUTH).json()["model_id"] == "bertkit-minilm"


def _glue_cross_encoder(directory: Path, task: str | None, id2label: dict | None = None) -> Path:
    """A tiny seeded sequence classifier with the label names bertkit's GLUE recipe for ``task`` gives it."""
    from bertkit.config import BertConfig
    from bertkit.heads import BertForSequenceClassification
    from bertkit.tasks.glue import GLUE_TASKS
    from bertkit.tokenization import BertTokenizer

    torch.manual_seed(3)  # a draw whose texts score apart (seed 0's all score 1.0 at the classifier x 500)
    id2label = id2label or dict(enumerate(GLUE_TASKS[task].labels))
    config = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=37, id2label=id2label)
    model = BertForSequenceClassification(config)
    with torch.no_grad():
        model.classifier.weight.mul_(500)  # logits far enough apart that the ranking is not a tie
    model.save_pretrained(directory)
    BertTokenizer.from_pretrained(MODEL).save_pretrained(directory)
    return directory


@pytest.mark.parametrize("task", ["qnli", pytest.param("rte", marks=pytest.mark.slow)])  # the same labels
def test_a_model_of_the_qnli_recipe_reranks_by_the_probability_of_entailment(tmp_path, task):
    """Its labels are (entailment, not_entailment): scored P(label 1), the least relevant texts ranked first."""
    from bertkit import pipeline
    from bertkit.inference.serve import create_app

    d = _glue_cross_encoder(tmp_path, task)
    classify = pipeline("text-classification", d, progress=False)
    expected = [c["scores"]["entailment"] for c in classify([(QUERY, t) for t in TEXTS])]
    assert min(np.diff(sorted(expected))) > 1e-4, expected  # a ranking to get right, far above float error
    got = pipeline("rerank", d, progress=False)({"query": QUERY, "texts": TEXTS})
    assert [g["index"] for g in got] == list(np.argsort(expected)[::-1])
    assert {g["index"]: g["score"] for g in got} == pytest.approx(dict(enumerate(expected)), abs=1e-6)
    server = Server(create_app(pipeline("rerank", d, progress=False), str(d), max_wait_ms=1))
    try:
        served = httpx.post(f"{server.url}/rerank", json={"query": QUERY, "texts": TEXTS}).json()
    finally:
        server.stop()
    assert {g["index"]: g["score"] for g in served} == pytest.approx(dict(enumerate(expected)), abs=1e-5)


def test_a_two_label_head_whose_names_do_not_say_which_is_relevant_is_refused_not_guessed(tmp_path):
    from bertkit import pipeline
    from bertkit.errors import BertkitError

    d = _glue_cross_encoder(tmp_path, None, {0: "negative", 1: "positive"})
    with pytest.raises(BertkitError, match=r"rerank cannot tell which of this model's two labels \['negative', "
                                           r"'positive'\] is the relevant one: name them"):
        pipeline("rerank", d)
