"""`bertkit serve` over real HTTP on loopback: outputs equal the pipeline's, concurrent requests share
batches, every limit or malformed request gets its 4xx with a message naming it, and under overload the
server refuses at once (429 + Retry-After), drops work whose client left or whose deadline passed, keeps
answering /health, and drains admitted requests on SIGTERM.

The overload tests hold the model thread inside a real model call (a ``Gate``) so that a busy model is
deterministic; the wire formats are checked in tests/test_serve_wire.py."""

from __future__ import annotations

import concurrent.futures
import csv
import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

pytest.importorskip("fastapi", reason='bertkit serve needs FastAPI: pip install "bertkit[serve]"')
pytest.importorskip("uvicorn", reason='bertkit serve needs uvicorn: pip install "bertkit[serve]"')
httpx = pytest.importorskip("httpx", reason="the HTTP client of these tests: pip install httpx")

from serve_helpers import MODEL, Gate, Server, metrics, until  # noqa: E402 (after the skips: Server runs uvicorn)

SST2 = Path(__file__).resolve().parents[2] / "shared" / "data" / "glue" / "SST-2" / "dev.tsv"

pytestmark = pytest.mark.skipif(not (MODEL / "config.json").is_file(), reason=f"no checkpoint at {MODEL}")


def _sentences(n: int) -> list[str]:
    if not SST2.is_file():
        return [f"sentence {i} about {'good ' * (i % 5)}films" for i in range(n)]
    with open(SST2, encoding="utf-8", newline="") as f:
        return [r["sentence"] for r in csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)][:n]


class SlowRequest:
    """A POST /predict whose body arrives in two parts: while the rest is unsent the server is reading it, so
    its batcher waits for it; ``finish()`` sends the rest and returns the raw response head."""

    def __init__(self, port: int, text: str = "a slow client's sentence"):
        self.body = json.dumps({"inputs": text}).encode()
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.sendall(b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                          b"Content-Length: %d\r\n\r\n" % len(self.body) + self.body[:5])

    def send_rest(self) -> None:
        self.sock.sendall(self.body[5:])

    def response(self) -> bytes:
        raw = b""
        while b"\r\n\r\n" not in raw:
            raw += self.sock.recv(65536)
        self.sock.close()
        return raw


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from bertkit import pipeline
    from bertkit.heads import BertForSequenceClassification
    from bertkit.inference.serve import Limits, create_app
    from bertkit.tokenization import BertTokenizer

    model_dir = tmp_path_factory.mktemp("clf")
    torch.manual_seed(0)
    BertForSequenceClassification.from_pretrained(MODEL, id2label={0: "negative", 1: "positive"}).save_pretrained(
        model_dir)
    BertTokenizer.from_pretrained(MODEL).save_pretrained(model_dir)
    pipe = pipeline("text-classification", model_dir, batch_size=16)
    app = create_app(pipe, str(model_dir), max_batch_size=16, max_wait_ms=50,
                     limits=Limits(max_body_bytes=20_000, max_items=8, max_text_chars=2_000))
    server = Server(app)
    yield server, pipeline("text-classification", model_dir, batch_size=16)
    server.stop()


def _close(a: list[dict], b: dict) -> bool:
    """The server's answer for one text (every label, best first) against the pipeline's result."""
    return a[0]["label"] == b["label"] and {d["label"] for d in a} == set(b["scores"]) and all(
        abs(d["score"] - b["scores"][d["label"]]) < 1e-5 for d in a)


def test_health_info_and_outputs_equal_the_pipeline(served):
    server, pipe = served
    assert httpx.get(f"{server.url}/health").json() == {"status": "ok"}
    info = httpx.get(f"{server.url}/info").json()
    assert (info["task"], info["model_type"]["classifier"]["id2label"], info["max_input_length"]) == (
        "text-classification", {"0": "negative", "1": "positive"}, 512)
    texts = _sentences(8)
    expected = pipe(texts)
    got = httpx.post(f"{server.url}/predict", json={"inputs": texts}).json()
    assert len(got) == 8 and all(_close(g, e) for g, e in zip(got, expected))
    one = httpx.post(f"{server.url}/predict", json={"inputs": texts[0]}).json()  # [[...]]: the Inference API's
    assert len(one) == 1 and _close(one[0], expected[0])
    pair = httpx.post(f"{server.url}/predict", json={"inputs": {"text": texts[0], "text_pair": texts[1]}}).json()
    assert _close(pair[0], pipe((texts[0], texts[1])))
    two = httpx.post(f"{server.url}/predict", json={"inputs": [texts[0], texts[1]]}).json()  # TEI's pair
    assert len(two) == 1 and _close(two[0], pipe((texts[0], texts[1])))
    two = httpx.post(f"{server.url}/predict", json={"inputs": [[texts[0]], [texts[1]]]}).json()  # two texts
    assert len(two) == 2 and _close(two[1], expected[1])
    listed = httpx.post(f"{server.url}/predict", json={"inputs": [[texts[0], texts[1]]]}).json()
    assert _close(listed[0], pipe((texts[0], texts[1])))


def test_concurrent_requests_are_batched_together_and_each_gets_its_own_result(served):
    server, pipe = served
    texts = _sentences(48)
    expected = pipe(texts)
    before = metrics(server.url)

    def ask(text: str) -> dict:
        return httpx.post(f"{server.url}/predict", json={"inputs": text}, timeout=60).json()[0]

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        got = list(pool.map(ask, texts))
    assert all(_close(g, e) for g, e in zip(got, expected))
    after = metrics(server.url)
    requests, batches = after["requests"] - before["requests"], after["batches"] - before["batches"]
    assert requests == 48 and batches < requests / 2, (requests, batches)  # gathered, not one by one
    assert after["largest_batch"] > 1


def test_an_input_that_fails_inside_a_shared_batch_fails_its_own_request_only(served):
    """An input the model refuses only once it runs (a fill-mask text whose [MASK] falls past max_length, ...) must
    not take the requests it was batched with down: they get their results, it gets a 422 naming its own input."""
    from bertkit.errors import BertkitError
    from bertkit.inference.serve import Limits, create_app

    _, pipe = served
    poison = pipe.tokenizer.convert_tokens_to_ids("poison")

    class Refusing(type(pipe)):
        def run_rows(self, rows):
            if any(poison in row["input_ids"] for row in rows):
                raise BertkitError("input 'a POISON sentence' is refused by the pipeline")
            return super().run_rows(rows)

    refusing = Refusing(pipe.model, pipe.tokenizer, batch_size=16)
    server = Server(create_app(refusing, "refusing", max_batch_size=16, max_wait_ms=5000, limits=Limits()))
    try:
        texts = _sentences(11) + ["a POISON sentence"]
        expected = pipe(texts[:11])
        # A thirteenth request whose body is still arriving keeps the batch open (the batcher waits for
        # requests being read), so all twelve are admitted into the same first call.
        slow = SlowRequest(server.port)

        def ask(text: str) -> httpx.Response:
            return httpx.post(f"{server.url}/predict", json={"inputs": text}, timeout=60)

        with concurrent.futures.ThreadPoolExecutor(len(texts)) as pool:
            futures = [pool.submit(ask, t) for t in texts]
            until(lambda: metrics(server.url)["admitted_inputs"] == 12)
            slow.send_rest()
            got = [f.result() for f in futures]
        raw = slow.response()
        assert raw.startswith(b"HTTP/1.1 200"), raw[:200]
        assert [r.status_code for r in got] == [200] * 11 + [422]
        assert all(_close(r.json()[0], e) for r, e in zip(got, expected))
        assert got[-1].json()["error"] == "input 'a POISON sentence' is refused by the pipeline"
        stats = metrics(server.url)
        assert stats["largest_batch"] == 1 and stats["errors"] == 1  # the shared call failed; each ran alone
    finally:
        server.stop()


class _FailsInTheModelCall:
    def run_rows(self, rows):
        if any(len(row["input_ids"]) == 3 for row in rows):  # one word between [CLS] and [SEP]
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return super().run_rows(rows)


class _FailsReadingTheRequest:
    def check_input(self, item, index):
        if item == "boom":
            raise AttributeError("'Faulty' object has no attribute 'prompt_for'")
        return super().check_input(item, index)


@pytest.mark.parametrize("fault, error", [
    (_FailsInTheModelCall, "the model call failed: RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB"),
    (_FailsReadingTheRequest, "answering /predict failed: AttributeError: 'Faulty' object has no attribute "
                              "'prompt_for'"),
], ids=["model-call", "reading-the-request"])
def test_a_fault_is_answered_500_in_teis_body_and_counted(served, fault, error):
    """An exception of the model's own (torch's out of memory, ...) or of the server's while it read a body (the
    parser thread: /tokenize with prompt_name on a sparse server did so) reached the client as a bare text/plain
    "Internal Server Error" (on /v1/embeddings too, where OpenAI's client then shows no reason), uncounted by
    /metrics; its request now gets a 500 naming it in TEI's body, and the server answers the next request."""
    from bertkit.inference.serve import create_app

    _, pipe = served
    faulty = type("Faulty", (fault, type(pipe)), {})
    server = Server(create_app(faulty(pipe.model, pipe.tokenizer, batch_size=16), "faulty", max_wait_ms=1))
    try:
        before = metrics(server.url)
        r = httpx.post(f"{server.url}/predict", json={"inputs": "boom"}, timeout=60)
        assert r.status_code == 500
        assert r.json() == {"error": error, "error_type": "Backend"}
        after = metrics(server.url)
        assert (after["requests"] - before["requests"], after["errors"] - before["errors"]) == (1, 1)
        assert httpx.get(f"{server.url}/health").status_code == 200
        fine = httpx.post(f"{server.url}/predict", json={"inputs": "a fine film"}, timeout=60)
        assert fine.status_code == 200 and _close(fine.json()[0], pipe("a fine film"))
    finally:
        server.stop()


@pytest.mark.parametrize("body, status, message", [
    (b'{"inputs": "unclosed', 400, "not valid JSON"),
    (b'["a list"]', 422, "the body of /predict must be a JSON object with inputs"),
    (b'{"inputs": "x", "extra": 1}', 422, "unknown field(s) extra"),
    (b'{"inputs": 42}', 422, "input 0 is int"),
    (b'{"inputs": []}', 422, "empty list"),
    # half of a surrogate pair: Python's parser took it and the model read a text that is no Unicode
    (b'{"inputs": "a\\ud800b"}', 400, "a string holds \\ud800, half of a UTF-16 surrogate pair"),
    (b'{"inputs": "x", "parameters": {"\\udfff": 1}}', 400, "a string holds \\udfff"),
    (json.dumps({"inputs": ["t"] * 9}).encode(), 422, "9 inputs exceed max_items 8 per request: send them in "
     "requests of at most 8, or start the server with a larger --max-items"),
    (json.dumps({"inputs": "y" * 2001}).encode(), 422, "2001 characters, over max_text_chars 2000: send less (the model "
     "reads a text's first max_length tokens), or start the server with a larger --max-text-chars"),
    (json.dumps({"inputs": "x", "parameters": {"stride": 2}}).encode(), 422, "takes no parameter(s) stride"),
    (json.dumps({"inputs": "x", "parameters": {"top_k": 0}}).encode(), 422, "top_k must be an int in [1, 100]"),
    (json.dumps({"inputs": ["z" * 1500] * 14}).encode(), 413, "exceeds max_body_bytes 20000: send fewer or shorter "
     "inputs per request, or start the server with a larger --max-body-bytes"),
])
def test_bad_requests_get_a_4xx_naming_the_problem(served, body, status, message):
    server, _ = served
    r = httpx.post(f"{server.url}/predict", content=body, headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    assert message in r.json()["error"]
    assert httpx.get(f"{server.url}/health").status_code == 200  # the server is still up


def test_serve_without_the_extra_says_how_to_install(monkeypatch):
    import builtins

    from bertkit.errors import BertkitError
    from bertkit.inference.serve import require_serving

    real = builtins.__import__

    def no_fastapi(name, *args, **kwargs):
        if name == "fastapi":
            raise ImportError("No module named 'fastapi'", name="fastapi")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_fastapi)
    with pytest.raises(BertkitError, match=r'pip install "bertkit\[serve\]"'):
        require_serving()


# ---------------------------------------------------------------------------------------------------
# overload and faults, on a tiny random classifier whose model thread a Gate can hold
# ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    """A tiny random two-label classifier with MiniLM's vocabulary, saved as a checkpoint directory."""
    from bertkit.config import BertConfig
    from bertkit.heads import BertForSequenceClassification
    from bertkit.tokenization import BertTokenizer

    torch.manual_seed(0)
    config = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=37, id2label={0: "negative", 1: "positive"})
    d = tmp_path_factory.mktemp("tiny_clf")
    BertForSequenceClassification(config).save_pretrained(d)
    BertTokenizer.from_pretrained(MODEL).save_pretrained(d)
    return d


@pytest.fixture
def held(tiny_dir):
    """(server, gate, /metrics getter) for a tiny classifier: at most 8 inputs admitted, 4 per call."""
    from bertkit.inference.pipelines import TextClassificationPipeline
    from bertkit.inference.serve import Limits, create_app

    gate = Gate()

    class Held(TextClassificationPipeline):
        def run_rows(self, rows):
            gate()
            return super().run_rows(rows)

    pipe = Held.from_pretrained(tiny_dir, batch_size=4, progress=False)
    server = Server(create_app(pipe, str(tiny_dir), max_batch_size=4, max_wait_ms=1,
                               limits=Limits(max_items=8, max_concurrent_requests=8)))

    def stats() -> dict:
        return metrics(server.url, timeout=10)

    try:
        yield server, gate, stats
    finally:
        gate.release()
        server.stop()


def _post(url: str, inputs, timeout: float = 60, headers: dict | None = None) -> httpx.Response:
    return httpx.post(f"{url}/predict", json={"inputs": inputs}, timeout=timeout, headers=headers)


def _blocker(server, gate, pool) -> concurrent.futures.Future:
    """A request the model thread is held on (inside its model call) until gate.release()."""
    gate.hold()
    blocker = pool.submit(_post, server.url, "the blocker")
    assert gate.entered.wait(30)
    return blocker


def test_a_flood_gets_results_or_fast_refusals_and_a_request_after_it_is_answered_at_once(held):
    server, gate, stats = held
    texts = _sentences(32)  # 4x the admission bound, one input each, all at once, while the model is busy
    with concurrent.futures.ThreadPoolExecutor(32) as pool:
        gate.hold()
        futures = [pool.submit(_post, server.url, t) for t in texts]
        until(lambda: sum(f.done() for f in futures) >= 24)
        refused = [f.result() for f in futures if f.done()]
        assert all(r.status_code == 429 for r in refused)  # answered while the model thread is still held
        assert all(int(r.headers["Retry-After"]) >= 1 for r in refused)
        assert "at max_concurrent_requests 8 (8 inputs admitted and not answered" in refused[0].json()["error"]
        assert refused[0].json()["error_type"] == "Overloaded"
        ready = httpx.get(f"{server.url}/ready", timeout=5)
        assert ready.status_code == 503 and ready.json()["status"] == "full" and "Retry-After" in ready.headers
        # answered while the model thread is still held: liveness does not wait for it
        assert httpx.get(f"{server.url}/health", timeout=30).json() == {"status": "ok"}
        gate.release()
        answers = [f.result() for f in futures]
    statuses = sorted(r.status_code for r in answers)
    assert statuses == [200] * 8 + [429] * 24, statuses  # only results and refusals: no client timed out
    assert all(len(r.json()[0]) == 2 for r in answers if r.status_code == 200)
    after = _post(server.url, texts[0], timeout=30)
    assert after.status_code == 200
    s = stats()
    assert (s["refused"], s["items"]) == (24, 9)
    assert httpx.get(f"{server.url}/ready").json() == {"status": "ready", "admitted_inputs": 0,
                                                      "max_concurrent_requests": 8}


def test_requests_whose_client_left_are_never_computed(held):
    server, gate, stats = held
    before = stats()
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        blocker = _blocker(server, gate, pool)
        gone = [pool.submit(_post, server.url, t, 0.3) for t in _sentences(5)]  # clients that give up at 0.3 s
        for f in gone:
            with pytest.raises(httpx.TimeoutException):
                f.result()
        until(lambda: stats()["abandoned"] - before["abandoned"] == 5)  # noticed while the model is still held
        gate.release()
        assert blocker.result().status_code == 200
    assert _post(server.url, "one more", timeout=30).status_code == 200
    after = stats()
    assert after["items"] - before["items"] == 2  # the blocker and the last request: none of the five
    assert httpx.get(f"{server.url}/ready").json()["admitted_inputs"] == 0


def test_a_call_carries_at_most_max_batch_size_inputs(held):
    server, gate, stats = held
    before = stats()
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        blocker = _blocker(server, gate, pool)
        threes = [pool.submit(_post, server.url, _sentences(3)) for _ in range(2)]  # 3 + 3 > max_batch_size 4
        until(lambda: httpx.get(f"{server.url}/ready").json()["admitted_inputs"] == 7)
        gate.release()
        assert blocker.result().status_code == 200 and [f.result().status_code for f in threes] == [200, 200]
    after = stats()
    assert (after["batches"] - before["batches"], after["items"] - before["items"]) == (3, 7)
    assert after["largest_batch"] == 3  # not 6: a request that does not fit waits for the next call
    assert len(_post(server.url, _sentences(6)).json()) == 6  # more than max_batch_size in one request: alone
    assert stats()["largest_batch"] == 6


def test_health_answers_while_the_model_computes_a_long_batch(tiny_dir):
    """/health is answered while the model thread computes: the pipeline is held inside its forward until /health
    has answered (a /health waiting on the model would never answer; no timing is asserted)."""
    import threading

    from bertkit.inference.pipelines import TextClassificationPipeline
    from bertkit.inference.serve import Limits, create_app

    entered, release = threading.Event(), threading.Event()

    class Held(TextClassificationPipeline):
        def forward(self, batch, rows):
            entered.set()
            assert release.wait(60), "the test never released the model thread"
            return super().forward(batch, rows)

    server = Server(create_app(Held.from_pretrained(tiny_dir, progress=False), str(tiny_dir), max_batch_size=8,
                               max_wait_ms=10, limits=Limits()))
    try:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            busy = pool.submit(_post, server.url, _sentences(8), 60)
            assert entered.wait(60)
            try:
                health = httpx.get(f"{server.url}/health", timeout=30)
            finally:
                release.set()
            assert health.status_code == 200 and not busy.done()  # answered while the model was held
            assert busy.result().status_code == 200
    finally:
        server.stop()


@pytest.mark.parametrize("path", ["/health", "/ready", "/info", "/metrics"])
def test_the_get_routes_answer_head_as_teis_do(served, path):
    """Monitors that check with HEAD (uptime checkers, curl -I) got 405 and took the server for down; TEI's GET
    routes answer HEAD (axum's), with the GET's status and headers and no body."""
    server, _ = served
    head, get = httpx.head(f"{server.url}{path}"), httpx.get(f"{server.url}{path}")
    assert (head.status_code, head.headers["content-type"], head.content) == (200, get.headers["content-type"], b"")


def test_a_lone_request_does_not_wait_for_companions_and_a_batch_waits_for_one_being_read(tiny_dir):
    """max_wait_ms (here 10 s, the largest allowed) is spent only while another request's body is still being
    read: a lone request is answered long before it (a client timeout of 5 s would fail otherwise), and two
    requests, one of them slow to send its body, are computed in one call."""
    from bertkit import pipeline
    from bertkit.inference.serve import Limits, create_app

    pipe = pipeline("text-classification", tiny_dir, progress=False)
    server = Server(create_app(pipe, str(tiny_dir), max_batch_size=8, max_wait_ms=10_000, limits=Limits()))
    try:
        for text in _sentences(3):
            assert _post(server.url, text, timeout=5).status_code == 200
        stats = metrics(server.url, timeout=10)
        assert (stats["items"], stats["batches"]) == (3, 3)
        slow = SlowRequest(server.port)
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            fast = pool.submit(_post, server.url, "a quick one", 30)
            until(lambda: metrics(server.url)["admitted_inputs"] == 1)
            slow.send_rest()
            assert fast.result().status_code == 200
        raw = slow.response()
        assert raw.startswith(b"HTTP/1.1 200"), raw[:200]
        stats = metrics(server.url, timeout=10)
        assert (stats["items"], stats["batches"]) == (5, 4)  # the two shared one call
    finally:
        server.stop()


def test_sigterm_drains_the_admitted_requests_then_the_server_exits(tiny_dir):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    # max-wait-ms 4000: while a fourth request's body is still arriving, the three admitted ones wait up to 4 s
    # for it, so they are still in flight at SIGTERM
    proc = subprocess.Popen([sys.executable, "-m", "bertkit", "serve", "--model", str(tiny_dir), "--task",
                             "text-classification", "--port", str(port), "--max-wait-ms", "4000",
                             "--graceful-shutdown-s", "20", "--log-level", "warning"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        def up() -> bool:
            assert proc.poll() is None, proc.stderr.read()
            try:
                return httpx.get(f"{url}/health", timeout=1).status_code == 200
            except httpx.TransportError:
                return False

        until(up, 120)
        slow = SlowRequest(port)
        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            inflight = [pool.submit(_post, url, t, 30) for t in _sentences(3)]
            until(lambda: metrics(url)["admitted_inputs"] == 3)
            proc.send_signal(signal.SIGTERM)
            time.sleep(0.3)
            slow.send_rest()  # read after SIGTERM: admitted (it passed the drain check), then all four run
            answers = [f.result() for f in inflight]
        raw = slow.response()
        assert raw.startswith(b"HTTP/1.1 200"), raw[:200]
        assert [r.status_code for r in answers] == [200, 200, 200] and all(len(r.json()[0]) == 2 for r in answers)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        final = json.loads(out)
        assert (final["items"], final["refused"], final["abandoned"]) == (4, 0, 0)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_second_ctrl_c_stops_the_model_call_under_way_at_its_next_batch(tiny_dir, monkeypatch):
    """uvicorn's second Ctrl-C ("CTRL+C to force quit", its log says) skips the app's shutdown, which is what stops
    a model call under way at its next forward batch: serve() returned, but the process could not exit until the
    model thread had computed every batch of the call (minutes for a request of max_windows_per_request windows).
    ``serve`` runs in this process, its pipeline held inside the first of eight forward batches."""
    import os
    import threading

    import bertkit.inference
    import bertkit.inference.serve as serve_module
    from bertkit.inference.pipelines import TextClassificationPipeline
    from bertkit.settings import ServeSettings

    entered, release, done, batches = threading.Event(), threading.Event(), threading.Event(), []

    class Held(TextClassificationPipeline):
        def forward(self, batch, rows):
            batches.append(len(rows))
            entered.set()
            assert release.wait(60), "the test never released the model thread"
            return super().forward(batch, rows)

        def run_rows(self, rows):
            try:
                return super().run_rows(rows)
            finally:
                done.set()

    monkeypatch.setattr(bertkit.inference, "pipeline",
                        lambda task, path, **_: Held.from_pretrained(path, batch_size=1, progress=False))
    monkeypatch.setattr(serve_module, "fix_mmap_threshold", lambda: False)  # the server process's, not pytest's
    monkeypatch.setattr(serve_module, "bound_onednn_caches", lambda: [])  # likewise: pytest's environment stays
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    def listening() -> bool:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return True
        except OSError:
            return False

    def client() -> int | str:
        until(listening, 60)
        try:
            return _post(f"http://127.0.0.1:{port}", [f"text {i}" for i in range(8)], timeout=60).status_code
        except httpx.TransportError as e:
            return type(e).__name__

    def ctrl_c_twice() -> None:
        assert entered.wait(60)
        os.kill(os.getpid(), signal.SIGINT)  # drains: the listening socket closes, the held call is waited on
        until(lambda: not listening())
        os.kill(os.getpid(), signal.SIGINT)  # force quit

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        answer = pool.submit(client)
        pool.submit(ctrl_c_twice)
        try:
            serve_module.serve(ServeSettings(model_name_or_path=tiny_dir, task="text-classification", port=port,
                                             max_batch_size=8, log_level="critical"))
        finally:
            release.set()
        assert answer.result() == 503
    assert done.wait(60)
    assert batches == [1]  # the held batch finished; the next seven never ran
