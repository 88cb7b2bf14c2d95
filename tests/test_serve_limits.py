"""`bertkit serve` cannot be held, exhausted or answered silently wrong: every field and parameter is known and
in range (or the request is refused naming it), a deeply nested body is refused before it is parsed, a slow
body gets 408, a client that leaves frees its admission at once, and what one request may cost (model
sequences, answer candidates) is bounded before any of it is computed. Tiny random models with MiniLM's
vocabulary, over real HTTP on loopback."""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import json
import os
import platform
import socket
import subprocess
import sys
import threading
import time

import pytest
import torch

pytest.importorskip("fastapi", reason='bertkit serve needs FastAPI: pip install "bertkit[serve]"')
pytest.importorskip("uvicorn", reason='bertkit serve needs uvicorn: pip install "bertkit[serve]"')
httpx = pytest.importorskip("httpx", reason="the HTTP client of these tests: pip install httpx")

from serve_helpers import MODEL, Gate, Server, metrics, until  # noqa: E402 (after the skips: Server runs uvicorn)

pytestmark = pytest.mark.skipif(not (MODEL / "config.json").is_file(), reason=f"no checkpoint at {MODEL}")

HEADS = {"clf": ("BertForSequenceClassification", {"id2label": {0: "negative", 1: "positive"}}),
         "qa": ("BertForQuestionAnswering", {}),
         "mlm": ("BertForMaskedLM", {}),
         "ner": ("BertForTokenClassification", {"id2label": {0: "O", 1: "B-PER", 2: "I-PER"}}),
         "enc": ("BertModel", {})}
TASKS = {"clf": "text-classification", "qa": "question-answering", "mlm": "fill-mask", "ner": "token-classification",
         "enc": "feature-extraction"}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny random checkpoint per head, with MiniLM's vocabulary."""
    from bertkit import heads, modeling
    from bertkit.config import BertConfig
    from bertkit.tokenization import BertTokenizer

    tok = BertTokenizer.from_pretrained(MODEL)
    out = {}
    for name, (cls, extra) in HEADS.items():
        torch.manual_seed(0)
        config = BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                            intermediate_size=37, **extra)
        d = tmp_path_factory.mktemp(name)
        (getattr(heads, cls, None) or getattr(modeling, cls))(config).save_pretrained(d)
        tok.save_pretrained(d)
        out[name] = d
    return out


@pytest.fixture(scope="module")
def servers(tiny):
    """A server per head (started on first use), all with the default limits."""
    from bertkit import pipeline
    from bertkit.inference.serve import create_app

    running: dict[str, Server] = {}

    def get(name: str) -> str:
        if name not in running:
            pipe = pipeline(TASKS[name], tiny[name], progress=False)
            running[name] = Server(create_app(pipe, str(tiny[name]), max_wait_ms=1))
        return running[name].url

    yield get
    for server in running.values():
        server.stop()


CONTEXT = "The Norman dynasty had a major political, cultural and military impact on medieval Europe. " * 3
QA = {"question": "Who had an impact?", "context": CONTEXT}


@pytest.mark.parametrize("model, body, message", [
    # a pair's second text under a misspelled key was answered as a single-text request
    ("clf", {"inputs": {"text": "a", "text_pairr": "b"}}, "input 0 has unknown field(s) text_pairr"),
    ("clf", {"inputs": [{"text": "a", "text_pair": "b", "label": 1}]}, "input 0 has unknown field(s) label"),
    ("clf", {"inputs": "a", "parameters": {"top_k": True}}, "top_k must be an int in [1, 100]"),
    ("clf", {"inputs": "a", "parameters": {"top_k": 2.0}}, "top_k must be an int in [1, 100]"),
    ("clf", {"inputs": "a", "parameters": {"top_k": 10**30}}, "top_k must be an int in [1, 100]"),
    ("clf", {"inputs": "a", "parameters": []}, "parameters must be an object, got list"),
    ("clf", {"inputs": "a", "parameters": 0}, "parameters must be an object, got int"),
    ("clf", {"inputs": "a", "truncate": 1}, "truncate must be true or false, got 1"),
    ("clf", {"inputs": "a", "raw_scores": "yes"}, "raw_scores must be true or false"),
    # a negative max_answer_len answered an empty answer with score 0
    ("qa", {"inputs": QA, "parameters": {"max_answer_len": -1}}, "max_answer_len must be an int in [1, 512]"),
    ("qa", {"inputs": QA, "parameters": {"max_answer_len": 0}}, "max_answer_len must be an int in [1, 512]"),
    ("qa", {"inputs": QA, "parameters": {"doc_stride": 0}}, "doc_stride must be an int in [1, 512]"),
    ("qa", {"inputs": QA, "parameters": {"doc_stride": 10**9}}, "doc_stride must be an int in [1, 512]"),
    ("qa", {"inputs": QA, "parameters": {"doc_stride": "128"}}, "doc_stride must be an int in [1, 512]"),
    ("qa", {"inputs": QA, "parameters": {"max_question_len": 600}}, "max_question_len must be an int in [1, 508]"),
    ("qa", {"inputs": QA, "parameters": {"handle_impossible_answer": 1}}, "handle_impossible_answer must be true"),
    ("qa", {"inputs": QA, "parameters": {"null_threshold": True}}, "null_threshold must be a finite number"),
    ("qa", b'{"inputs": {"question": "q", "context": "c"}, "parameters": {"null_threshold": 1e400}}',
     "null_threshold must be a finite number, got inf"),
    ("qa", {"inputs": QA, "parameters": {"top_k": -3}}, "top_k must be an int in [1, 20] (the SQuAD recipe's n-best"),
    ("qa", {"inputs": QA, "parameters": {"top_k": 21}}, "top_k must be an int in [1, 20] (the SQuAD recipe's n-best"),
    ("qa", {"inputs": QA, "parameters": {"max_seq_len": 128}}, "max_seq_len must be 512"),
    ("qa", {"inputs": QA, "parameters": {"max_answer_length": 6}},  # bertkit's name: the wire takes the API's
     "question-answering takes no parameter(s) max_answer_length; it takes align_to_words, doc_stride"),
    ("qa", {"inputs": {**QA, "contxt": "another"}}, "input 0 has unknown field(s) contxt"),
    ("mlm", {"inputs": "a [MASK] b", "parameters": {"top_k": 0}}, "top_k must be an int of at least 1"),
    ("mlm", {"inputs": "a [MASK] b", "parameters": {"top_k": 101}}, "top_k must be an int in [1, 100] (max_top_k)"),
    ("ner", {"inputs": "Ada Lovelace wrote it", "parameters": {"ignore_labels": ["PERSON"]}},
     "ignore_labels must be a list of this model's label names (B-PER, I-PER, O, PER)"),
    ("enc", {"inputs": "a", "normalize": True, "parameters": {"normalize": False}},
     "normalize is given both at the top level and in parameters"),
    ("enc", {"inputs": "a", "dimensions": 0}, "dimensions must be an int in [1, 32]"),
    ("enc", {"inputs": {"source_sentence": "a", "sentences": ["b"], "sentence": ["c"]}},
     "sentence similarity takes inputs"),
    ("enc", {"inputs": {"source_sentence": "a", "sentences": []}},  # was "takes inputs {...} and no other field"
     "inputs.sentences is empty: send at least one sentence to compare source_sentence with"),
])
def test_a_field_or_parameter_the_route_does_not_know_or_out_of_range_is_refused_naming_it(servers, model, body,
                                                                                       message):
    if isinstance(body, bytes):  # a number JSON allows and Python reads as inf (httpx would not write it)
        r = httpx.post(f"{servers(model)}/predict", content=body, headers={"content-type": "application/json"})
    else:
        r = httpx.post(f"{servers(model)}/predict", json=body, timeout=30)
    assert r.status_code == 422, r.text
    assert message in r.json()["error"], r.json()["error"]


def test_a_query_parameter_is_refused_not_ignored(servers):
    r = httpx.post(f"{servers('clf')}/predict?top_k=1", json={"inputs": "a"}, timeout=30)
    assert r.status_code == 422 and "/predict takes no query parameters, got 'top_k=1'" in r.json()["error"]


@pytest.mark.parametrize("encoding", ["gzip", "GZIP", "br", "deflate, gzip"])
def test_a_compressed_body_is_refused_with_415_naming_its_encoding(servers, encoding):
    """Was: a gzip body (Content-Encoding: gzip, as a compressing proxy sends it) was answered 400 "not valid JSON".
    Now 415 names the encoding and Accept-Encoding says what is read (RFC 9110 15.5.16), before the body is read."""
    import gzip

    url = servers("clf")
    body = json.dumps({"inputs": "a"}).encode()
    r = httpx.post(f"{url}/predict", content=gzip.compress(body),
                   headers={"content-type": "application/json", "content-encoding": encoding}, timeout=30)
    assert r.status_code == 415 and r.headers["accept-encoding"] == "identity", r.text
    assert r.json() == {"error": f"the request body is encoded (Content-Encoding: {encoding}); this server reads "
                                 "JSON bodies as sent, uncompressed, as TEI does: send it without "
                                 "Content-Encoding (or turn off request compression in the client or proxy)",
                        "error_type": "Validation"}
    for same in ("identity", "Identity"):  # the body as sent: read
        r = httpx.post(f"{url}/predict", content=body, timeout=30,
                       headers={"content-type": "application/json", "content-encoding": same})
        assert r.status_code == 200, r.text


def test_null_is_the_default_and_the_inference_api_names_still_work(servers):
    qa = servers("qa")
    base = httpx.post(f"{qa}/predict", json={"inputs": QA}, timeout=30).json()
    assert httpx.post(f"{qa}/predict", json={"inputs": QA, "parameters": {"top_k": None, "doc_stride": None}},
                      timeout=30).json() == base
    three = httpx.post(f"{qa}/predict", json={"inputs": QA, "parameters": {"top_k": 3, "max_answer_len": 4,
                                                                        "handle_impossible_answer": False}},
                       timeout=30).json()
    assert len(three) == 3 and all(a["answer"] == CONTEXT[a["start"]:a["end"]] for a in three)
    pair = httpx.post(f"{servers('clf')}/predict", json={"inputs": {"text": "a", "text_pair": "b"}}, timeout=30)
    assert pair.status_code == 200


@pytest.mark.parametrize("body, status, message", [
    (b'{"inputs": "a", "inputs": "b"}', 400, "an object holds the key 'inputs' twice"),
    (b'{"inputs": {"text": "a", "text": "b"}}', 400, "an object holds the key 'text' twice"),
    (b'{"inputs": "a", "parameters": {"top_k": NaN}}', 400, "NaN is not a JSON number"),
    (b'{"inputs": "a", "parameters": {"top_k": -Infinity}}', 400, "-Infinity is not a JSON number"),
    # nested 100,000 deep: a RecursionError inside json.loads answered 500
    (b"[" * 100_000 + b"]" * 100_000, 413, "nests lists and objects about 1,000 or more deep, over max_json_depth"),
    (b'{"inputs": ' + b"[" * 17 + b'"a"' + b"]" * 17 + b"}", 413, "18 deep, over max_json_depth 16: no route's body "
     "nests more than a few levels, so check how it is built (or start the server with a larger --max-json-depth)"),
])
def test_duplicate_keys_non_numbers_and_deep_nesting_are_refused_before_any_work(servers, body, status, message):
    url = servers("clf")
    r = httpx.post(f"{url}/predict", content=body, headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == status, r.text
    assert message in r.json()["error"]
    assert httpx.get(f"{url}/health").status_code == 200


def test_json_depth_counts_lists_and_objects_not_brackets_inside_strings():
    from bertkit.inference.serve_wire import Limits, RequestError, load_json

    assert load_json(b'{"inputs": ["[[[[", "\\"]]]{{{"]}', Limits(max_json_depth=2)) == {"inputs": ["[[[[", '"]]]{{{']}
    assert load_json(b'"just a string"', Limits(max_json_depth=1)) == "just a string"
    assert load_json(b"[[[]],[[[]]]]", Limits(max_json_depth=4)) == [[[]], [[[]]]]
    with pytest.raises(RequestError, match="nests lists and objects 4 deep, over max_json_depth 3"):
        load_json(b"[[[]],[[[]]]]", Limits(max_json_depth=3))


def test_a_slow_body_gets_408_and_its_connection_is_closed(tiny):
    from bertkit import pipeline
    from bertkit.inference.serve import Limits, create_app

    pipe = pipeline("text-classification", tiny["clf"], progress=False)
    server = Server(create_app(pipe, "clf", max_wait_ms=1, limits=Limits(body_timeout_s=1.0)))
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
            # declares 100 bytes and sends one: the server used to wait for the rest for ever
            sock.sendall(b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 100\r\n\r\n{")
            t0 = time.perf_counter()
            raw = b""
            while chunk := sock.recv(65536):  # until the server closes the connection
                raw += chunk
            waited = time.perf_counter() - t0
        assert raw.startswith(b"HTTP/1.1 408"), raw[:200]
        assert b"body_timeout_s 1 s" in raw and waited > 0.9, waited  # not before its timeout (the socket's 10 s: not for ever)
        assert httpx.get(f"{server.url}/ready").json()["admitted_inputs"] == 0
    finally:
        server.stop()


def test_shutdown_grace_is_a_deadline_for_a_long_model_call(tiny):
    """Past the grace period a model call ends at its next forward batch instead of holding the server until all
    its batches are computed (here 8 batches of 0.5 s: 4 s; the grace is 0.3 s)."""
    import uvicorn

    from bertkit.inference.pipelines import TextClassificationPipeline
    from bertkit.inference.serve import create_app

    batches = []

    class Slow(TextClassificationPipeline):
        def forward(self, batch, rows):
            batches.append(time.perf_counter())
            time.sleep(0.5)
            return super().forward(batch, rows)

    pipe = Slow.from_pretrained(tiny["clf"], batch_size=1, progress=False)
    app = create_app(pipe, "slow", max_batch_size=8, max_wait_ms=1)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="critical",
                                           timeout_graceful_shutdown=0.3))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    until(lambda: server.started)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        long = pool.submit(httpx.post, f"http://127.0.0.1:{port}/predict",
                           json={"inputs": [f"text {i}" for i in range(8)]}, timeout=30)
        until(lambda: batches)
        server.should_exit = True
        thread.join(10)
        with pytest.raises(httpx.HTTPError):  # cut off at the deadline
            long.result().raise_for_status()
    assert not thread.is_alive()
    assert len(batches) < 8  # ended at a forward batch past the deadline, not after all eight


@pytest.fixture
def held(tiny):
    """(url, gate) of a tiny classifier whose model thread the gate holds; at most 8 inputs admitted."""
    from bertkit.inference.pipelines import TextClassificationPipeline
    from bertkit.inference.serve import Limits, create_app

    gate = Gate()

    class Held(TextClassificationPipeline):
        def run_rows(self, rows):
            gate()
            return super().run_rows(rows)

    pipe = Held.from_pretrained(tiny["clf"], batch_size=4, progress=False)
    server = Server(create_app(pipe, "held", max_batch_size=8, max_wait_ms=1,
                               limits=Limits(max_items=8, max_concurrent_requests=8)))
    try:
        yield server.url, gate
    finally:
        gate.release()
        server.stop()


def test_a_client_that_leaves_during_its_model_call_frees_its_admission_at_once(held):
    """Six inputs in a model call whose client gave up used to count against max_concurrent_requests 8 until the
    call ended, so the next request of four got 429 though nobody waited for those six."""
    url, gate = held

    def admitted() -> int:
        return httpx.get(f"{url}/ready", timeout=5).json()["admitted_inputs"]

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        gate.hold()
        gone = pool.submit(httpx.post, f"{url}/predict", json={"inputs": [f"t {i}" for i in range(6)]}, timeout=1.5)
        assert gate.entered.wait(30)  # its model call is under way, held
        with pytest.raises(httpx.TimeoutException):
            gone.result()
        until(lambda: admitted() == 0)  # released while its call is still held
        later = pool.submit(httpx.post, f"{url}/predict", json={"inputs": ["a", "b", "c", "d"]}, timeout=30)
        until(lambda: admitted() == 4)
        gate.release()
        assert later.result().status_code == 200
    assert admitted() == 0


def test_a_long_context_at_a_step_of_1_is_refused_before_any_window_is_built(servers):
    """A 330 KB body at a step of 1 took 74 s and 3 GB: every window of every input was built first."""
    url = servers("qa")
    # ~1,200 tokens: about 700 windows at a step of 1, three at the default stride
    context = " ".join(f"word{i % 97}" for i in range(400))
    # doc_stride is the overlap between windows: 505 of the 506 context tokens a window holds (512 - 3 question
    # tokens - 3) moves each window by 1 token
    r = httpx.post(f"{url}/predict", json={"inputs": {"question": "which word?", "context": context},
                                           "parameters": {"doc_stride": 505}}, timeout=60)
    assert r.status_code == 422, r.text  # from the count of windows, before any is built (no timing asserted)
    assert "over max_windows_per_request 256" in r.json()["error"] and "doc_stride 505" in r.json()["error"]
    ok = httpx.post(f"{url}/predict", json={"inputs": {"question": "which word?", "context": context}}, timeout=60)
    assert ok.status_code == 200  # the same context at the default stride is a few windows


def test_candidates_are_bounded(servers):
    mlm = servers("mlm")
    r = httpx.post(f"{mlm}/predict", json={"inputs": " ".join(["[MASK]"] * 20), "parameters": {"top_k": 100_000}})
    assert r.status_code == 422 and "top_k must be an int in [1, 100]" in r.json()["error"]
    r = httpx.post(f"{mlm}/predict", json={"inputs": " ".join(["[MASK]"] * 20), "parameters": {"top_k": 100}})
    assert r.status_code == 422 and "2000+ candidates" in r.json()["error"] and "max_candidates 1000" in r.text
    # with targets the answer holds at most one candidate per target and mask: 20 x 3, not 20 x 100 (refused)
    r = httpx.post(f"{mlm}/predict", json={"inputs": " ".join(["[MASK]"] * 20),
                                           "parameters": {"top_k": 100, "targets": ["a", "the", "of"]}}, timeout=30)
    assert r.status_code == 200 and [len(m) for m in r.json()] == [3] * 20
    r = httpx.post(f"{mlm}/predict", json={"inputs": " ".join(["[MASK]"] * 300), "parameters": {"top_k": 1}})
    assert r.status_code == 422 and "[MASK] tokens (input 0 has 300)" in r.json()["error"]
    r = httpx.post(f"{mlm}/predict", json={"inputs": "no mask here"})
    assert r.status_code == 422 and "has no [MASK] token" in r.json()["error"]
    five = httpx.post(f"{mlm}/predict", json={"inputs": "a [MASK] and a [MASK] ."}, timeout=30).json()
    assert [len(m) for m in five] == [5, 5]


def test_multiple_choice_is_not_served():
    """No client API has the task; its inputs (every choice of one in one forward) fit no route's bounds."""
    from types import SimpleNamespace

    from bertkit.errors import BertkitError
    from bertkit.inference.serve import create_app

    with pytest.raises(BertkitError, match="bertkit serve does not serve multiple-choice"):
        create_app(SimpleNamespace(task="multiple-choice"), "mc")


def test_a_model_call_carries_at_most_max_windows_per_request_sequences():
    from bertkit.inference.serve import Batcher, Stats

    async def heads() -> list[int]:
        batcher = Batcher(lambda items, options: items, max_batch_size=32, max_wait_ms=0, max_inputs=64,
                          stats=Stats(), max_cost=10)
        for cost in (6, 3, 6, 1):
            batcher.admit(["q"], {}, cost)
        batch, full = batcher._head()
        batcher.executor.shutdown()
        return [j.cost for j in batch] + [full]

    assert asyncio.run(heads()) == [6, 3, True]  # the third (6) would make 15 sequences: the next call


def test_limits_are_checked_and_the_settings_defaults_are_the_servers():
    from bertkit.errors import BertkitError
    from bertkit.inference.serve import Limits
    from bertkit.settings import ServeSettings

    s = ServeSettings(model_name_or_path="m", task="text-classification")
    assert Limits.from_settings(s) == Limits()
    for f in dataclasses.fields(Limits):
        assert getattr(s, f.name) == f.default, f.name
    with pytest.raises(BertkitError, match="body_timeout_s must be a finite positive number, got inf"):
        Limits(body_timeout_s=float("inf"))
    with pytest.raises(BertkitError, match="max_windows_per_request 8 is below max_items 64"):
        Limits(max_windows_per_request=8)
    with pytest.raises(BertkitError, match="max_json_depth must be an int, got True"):
        Limits(max_json_depth=True)
    with pytest.raises(BertkitError, match="graceful_shutdown_s must be a finite non-negative number, got nan"):
        ServeSettings(model_name_or_path="m", task="text-classification", graceful_shutdown_s=float("nan"))


def test_a_flood_of_oversized_requests_leaves_nothing_admitted(servers):
    url = servers("qa")
    body = {"inputs": {"question": "q", "context": "w " * 4000}, "parameters": {"doc_stride": 507}}  # a step of 1

    def post(_: int) -> int:
        return httpx.post(f"{url}/predict", json=body, timeout=60).status_code

    before = metrics(url)["items"]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        codes = list(pool.map(post, range(24)))
    assert set(codes) <= {422, 429}, codes
    assert httpx.get(f"{url}/ready").json()["admitted_inputs"] == 0
    assert metrics(url)["items"] == before  # none of them reached the model


def test_every_parameter_a_route_takes_has_a_check():
    """A parameter accepted with no check of its value would pass a wrong one through silently."""
    from types import SimpleNamespace

    from bertkit.inference.serve_wire import Limits, _parameter_checks
    from bertkit.inference.tasks import TASK_LIST

    for task in TASK_LIST:
        options = task.pipeline_class().call_options
        fake = SimpleNamespace(task=task.name, max_length=128, tokenizer=[0] * 30522, prompts={"query": "query: "},
                               config=SimpleNamespace(hidden_size=32, id2label={0: "O"}, num_labels=1),
                               call_options=options)
        checks = _parameter_checks(SimpleNamespace(pipe=fake, limits=Limits(), task=task))
        accepted = {*(o.wire or o.name for o in options), *task.answer_params, *task.body_fields}
        assert accepted <= set(checks), (task.name, sorted(accepted - set(checks)))


def test_sentence_similarity_honours_dimensions(servers, tiny):
    """dimensions was accepted by /similarity and ignored: the cosines were those of the full vectors."""
    import numpy as np

    from bertkit import pipeline

    pipe = pipeline("feature-extraction", tiny["enc"], progress=False)
    texts = ["a good film", "a bad film", "rain in spain"]
    v = np.array(pipe(texts))[:, :8]
    v = v / np.linalg.norm(v, axis=1, keepdims=True)
    got = httpx.post(f"{servers('enc')}/similarity", timeout=30, json={
        "inputs": {"source_sentence": texts[0], "sentences": texts[1:]}, "parameters": {"dimensions": 8}}).json()
    assert np.allclose(got, v[1:] @ v[0], atol=1e-5)


@pytest.mark.parametrize("words, stride, question_tokens", [(5, 128, 64), (600, 128, 64), (600, 1, 64), (900, 37, 3)])
def test_count_windows_is_what_featurize_squad_builds(words, stride, question_tokens):
    from bertkit.tasks import squad
    from bertkit.tokenization import BertTokenizer

    tok = BertTokenizer.from_pretrained(MODEL)
    ex = squad.SquadExample(qas_id="q", title="", question="who led the vikings to normandy in the tenth century?",
                            context=" ".join(f"w{i % 13}" for i in range(words)), answers=())
    built = squad.featurize_squad([ex], tok, max_seq_length=128, doc_stride=stride, max_query_length=question_tokens)
    assert squad.count_windows(ex.question, ex.context, tok, max_seq_length=128, doc_stride=stride,
                               max_query_length=question_tokens) == len(built)


def test_freed_memory_is_handed_back_after_model_calls_at_most_every_trim_interval(monkeypatch):
    """glibc kept a soak's freed activations (RSS 790 -> 921 MiB at twice capacity); the batcher trims after a
    model call once TRIM_EVERY_S has passed since the last trim, never more often."""
    from bertkit.inference import serve_batching
    from bertkit.inference.serve import Batcher, Stats

    calls = []
    monkeypatch.setattr(serve_batching, "MALLOC_TRIM", lambda: calls.append(1))

    async def run(interval: float) -> int:
        monkeypatch.setattr(serve_batching, "TRIM_EVERY_S", interval)
        calls.clear()
        batcher = Batcher(lambda items, options: items, max_batch_size=32, max_wait_ms=0, max_inputs=64,
                          stats=Stats())
        batcher.trimmed = -1e9  # long ago
        for _ in range(5):
            job = batcher.admit(["x"], {})
            await batcher._run([job])
        batcher.executor.shutdown(wait=True)
        return len(calls)

    assert asyncio.run(run(3600.0)) == 1  # the first call trims; the next four are within the interval
    assert asyncio.run(run(0.0)) == 5
    if platform.libc_ver()[0] == "glibc":
        assert serve_batching.MALLOC_TRIM is not None  # the real trim is found


MMAP_PROBE = r'''
import ctypes, ctypes.util, sys
from bertkit.inference.serve_batching import fix_mmap_threshold
libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
def rss_kib():
    return int(next(l for l in open("/proc/self/status") if l.startswith("VmRSS")).split()[1])
fixed = fix_mmap_threshold() if sys.argv[1] == "fixed" else False
first = libc.malloc(1 << 20); ctypes.memset(first, 1, 1 << 20); libc.free(first)  # glibc raises its threshold here
blocks = [libc.malloc(1 << 20) for _ in range(32)]
for b in blocks:
    ctypes.memset(b, 1, 1 << 20)
before = rss_kib()
for b in blocks[:-1]:  # the last block stays in use, as the next call's activations do
    libc.free(b)
print(fixed, before - rss_kib())
'''


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt's mmap threshold is glibc's")
def test_the_server_holds_glibcs_mmap_threshold_so_freed_activations_leave_at_once():
    """Without the fix glibc serves 1 MiB blocks from its heap after the first is freed, and keeps 31 MiB of them
    resident behind a block still in use; with it each block is a mapping, returned the moment it is freed."""
    returned = {}
    for mode in ("default", "fixed"):
        env = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", "MALLOC_MMAP_THRESHOLD_")}
        out = subprocess.run([sys.executable, "-c", MMAP_PROBE, mode], capture_output=True, text=True, check=True,
                             env=env)
        fixed, freed_kib = out.stdout.split()
        assert fixed == ("True" if mode == "fixed" else "False")
        returned[mode] = int(freed_kib)
    assert returned["default"] < 4 * 1024, returned  # held by the heap
    assert returned["fixed"] > 28 * 1024, returned  # 31 MiB handed back


def test_an_address_the_server_cannot_listen_on_is_refused_before_the_model_loads(monkeypatch, capsys):
    """Was: a port in use or a host that does not resolve was found by uvicorn once the model had loaded and warmed
    up, which exited 3 with its own message; now one line naming --host and --port and the fix, exit 2, no model."""
    import bertkit.inference
    from bertkit.cli import main

    def no_model(*args, **kwargs):
        raise AssertionError("the model loaded")

    monkeypatch.setattr(bertkit.inference, "pipeline", no_model)
    args = ["serve", "--model", str(MODEL), "--task", "sentence-embedding"]
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert main([*args, "--port", str(port)]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"bertkit serve: error: --host 127.0.0.1 --port {port}: cannot listen there (Address already in use); "
        "another process listens there: stop it, or choose another --port")
    assert main([*args, "--host", "no-such-host.invalid", "--port", str(port)]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith(
        f"bertkit serve: error: --host no-such-host.invalid --port {port}: the host does not resolve (")


ONEDNN_PROBE = r'''
import sys
import torch
from bertkit._hardware import onednn_linear
from bertkit.inference import serve_batching
from bertkit.inference.serve_batching import MALLOC_TRIM, bound_onednn_caches
CAPACITY = serve_batching.ONEDNN_CACHE_CAPACITY = int(sys.argv[2])  # fewer kernels to build than the server's 512
chosen = bound_onednn_caches() if sys.argv[1] == "bounded" else []  # as the server: before the first kernel
def rss_kib():
    return int(next(l for l in open("/proc/self/status") if l.startswith("VmRSS")).split()[1])
g = torch.Generator().manual_seed(0)
x, b = torch.randn(CAPACITY + 100, 32, generator=g), torch.randn(64, generator=g)
if onednn_linear():  # PreparedLinear's kernel, without the model code's imports
    w = torch.ops.mkldnn._reorder_linear_weight(torch.randn(64, 32, generator=g), 1024)
    for rows in range(1, CAPACITY + 61):  # more counts than the bounded caches hold
        torch.ops.mkldnn._linear_pointwise(x[:rows], w, b, "none", [], "")
    MALLOC_TRIM()
    before = rss_kib()
    for rows in range(CAPACITY + 61, CAPACITY + 101):  # 40 new row counts, as 40 model calls of new token counts
        torch.ops.mkldnn._linear_pointwise(x[:rows], w, b, "none", [], "")
    MALLOC_TRIM()
    print(True, ",".join(chosen) or "-", before - rss_kib())
else:
    print(False, "-", 0)
'''


@pytest.mark.slow  # two probe processes (4 s); make test keeps test_a_cache_capacity_the_user_set_is_left_as_it_is and
# test_int8_switch.py::test_serve_int8_answers_with_the_int8_pipelines_embeddings (the server bounds the caches)
@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the probe trims with glibc's malloc_trim")
def test_the_server_bounds_onednns_kernel_caches_so_new_row_counts_keep_no_memory():
    """oneDNN's Linear builds kernels for each new row count and oneDNN and ideep kept the 1,024 most recent: a
    soak's server grew 2.3 MiB a new count to 460 MiB up. Bounded as the server bounds them, 40 new counts past the
    bound keep nothing; at the default capacities this probe's small Linear kept 0.58 MiB a count (23 MiB; bounded at
    16, 0.02). The probe bounds them at 16, not the server's 512, to build fewer kernels."""
    env = {k: v for k, v in os.environ.items() if k not in ("ONEDNN_PRIMITIVE_CACHE_CAPACITY",
                                                            "DNNL_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")}
    probes = {mode: subprocess.Popen([sys.executable, "-c", ONEDNN_PROBE, mode, "16"],
                                     stdout=subprocess.PIPE, text=True, env=env)
              for mode in ("default", "bounded")}  # side by side: 3 s of imports each
    kept = {}
    for mode, probe in probes.items():
        out, _ = probe.communicate(timeout=120)
        assert probe.returncode == 0, (mode, probe.returncode)
        onednn, chosen, freed_kib = out.split()
        if onednn != "True":
            pytest.skip("oneDNN's Linear does not run on this machine (_hardware.onednn_linear)")
        assert chosen == ("ONEDNN_PRIMITIVE_CACHE_CAPACITY,LRU_CACHE_CAPACITY" if mode == "bounded" else "-")
        kept[mode] = -int(freed_kib)
    assert kept["default"] > 12 * 1024, kept  # the default caches keep the new counts' kernels
    assert kept["bounded"] < 3 * 1024, kept


def test_a_cache_capacity_the_user_set_is_left_as_it_is(monkeypatch):
    from bertkit.inference import serve_batching

    for name in ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "DNNL_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("DNNL_PRIMITIVE_CACHE_CAPACITY", "300")  # oneDNN's older spelling counts as set
    assert serve_batching.bound_onednn_caches() == ["LRU_CACHE_CAPACITY"]
    assert (os.environ.get("ONEDNN_PRIMITIVE_CACHE_CAPACITY"), os.environ["LRU_CACHE_CAPACITY"]) == (
        None, str(serve_batching.ONEDNN_CACHE_CAPACITY))
    monkeypatch.setenv("LRU_CACHE_CAPACITY", "7")
    assert serve_batching.bound_onednn_caches() == []
    assert os.environ["LRU_CACHE_CAPACITY"] == "7"
