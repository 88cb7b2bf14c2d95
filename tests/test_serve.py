"""`bertkit serve` over real HTTP on loopback: outputs equal the pipeline's, concurrent requests share
batches, and every limit or malformed request gets its 4xx with a message naming it."""

from __future__ import annotations

import concurrent.futures
import csv
import json
import os
import socket
import threading
import time
from pathlib import Path

import pytest
import torch

pytest.importorskip("fastapi", reason='bertkit serve needs FastAPI: pip install "bertkit[serve]"')
pytest.importorskip("uvicorn", reason='bertkit serve needs uvicorn: pip install "bertkit[serve]"')
httpx = pytest.importorskip("httpx", reason="the HTTP client of these tests: pip install httpx")

MODEL = Path(os.environ.get("BERTKIT_TEST_MODEL", "models/minilm"))
SST2 = Path(__file__).resolve().parents[2] / "shared" / "data" / "glue" / "SST-2" / "dev.tsv"

pytestmark = pytest.mark.skipif(not (MODEL / "config.json").is_file(), reason=f"no checkpoint at {MODEL}")


def _sentences(n: int) -> list[str]:
    if not SST2.is_file():
        return [f"sentence {i} about {'good ' * (i % 5)}films" for i in range(n)]
    with open(SST2, encoding="utf-8", newline="") as f:
        return [r["sentence"] for r in csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)][:n]


class Server:
    """uvicorn serving an app on a free loopback port, in a thread, for the duration of a test module."""

    def __init__(self, app):
        import uvicorn

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.time() + 60
        while not self.server.started:
            if time.time() > deadline:
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.05)
        self.url = f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)


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


def _close(a: dict, b: dict) -> bool:
    return a["label"] == b["label"] and all(abs(a["scores"][k] - b["scores"][k]) < 1e-5 for k in b["scores"])


def test_health_metadata_and_outputs_equal_the_pipeline(served):
    server, pipe = served
    assert httpx.get(f"{server.url}/health").json() == {"status": "ok"}
    meta = httpx.get(f"{server.url}/metadata").json()
    assert (meta["task"], meta["labels"], meta["max_length"]) == ("text-classification", ["negative", "positive"], 512)
    texts = _sentences(8)
    expected = pipe(texts)
    got = httpx.post(f"{server.url}/predict", json={"inputs": texts}).json()
    assert len(got) == 8 and all(_close(g, e) for g, e in zip(got, expected))
    one = httpx.post(f"{server.url}/predict", json={"inputs": texts[0]}).json()
    assert _close(one, expected[0])
    pair = httpx.post(f"{server.url}/predict", json={"inputs": {"text": texts[0], "text_pair": texts[1]}}).json()
    assert _close(pair, pipe((texts[0], texts[1])))
    two = httpx.post(f"{server.url}/predict", json={"inputs": [texts[0], texts[1]]}).json()  # two texts, not a pair
    assert len(two) == 2 and _close(two[1], expected[1])
    listed = httpx.post(f"{server.url}/predict", json={"inputs": [[texts[0], texts[1]]]}).json()
    assert _close(listed[0], pipe((texts[0], texts[1])))


def test_concurrent_requests_are_batched_together_and_each_gets_its_own_result(served):
    server, pipe = served
    texts = _sentences(48)
    expected = pipe(texts)
    before = httpx.get(f"{server.url}/metadata").json()["stats"]

    def ask(text: str) -> dict:
        return httpx.post(f"{server.url}/predict", json={"inputs": text}, timeout=60).json()

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        got = list(pool.map(ask, texts))
    assert all(_close(g, e) for g, e in zip(got, expected))
    after = httpx.get(f"{server.url}/metadata").json()["stats"]
    requests, batches = after["requests"] - before["requests"], after["batches"] - before["batches"]
    assert requests == 48 and batches < requests / 2, (requests, batches)  # gathered, not one by one
    assert after["largest_batch"] > 1


def test_an_input_that_fails_inside_a_shared_batch_fails_its_own_request_only(served):
    """An input the pipeline refuses only once it runs (a fill-mask text without [MASK], ...) must not take the
    requests it was batched with down: they get their results, it gets a 422 naming its own input."""
    from bertkit.errors import BertkitError
    from bertkit.inference.serve import Limits, create_app

    _, pipe = served

    class Refusing(type(pipe)):
        def encode(self, item, **options):  # item: (text, text_pair)
            if "POISON" in item[0]:
                raise BertkitError(f"input {item[0]!r} is refused by the pipeline")
            return super().encode(item, **options)

    refusing = Refusing(pipe.model, pipe.tokenizer, batch_size=16)
    server = Server(create_app(refusing, "refusing", max_batch_size=16, max_wait_ms=200, limits=Limits()))
    try:
        texts = _sentences(11) + ["a POISON sentence"]
        expected = pipe(texts[:11])
        barrier = threading.Barrier(len(texts))

        def ask(text: str) -> httpx.Response:
            barrier.wait()  # all sent together, so they share the first batch
            return httpx.post(f"{server.url}/predict", json={"inputs": text}, timeout=60)

        with concurrent.futures.ThreadPoolExecutor(len(texts)) as pool:
            got = list(pool.map(ask, texts))
        assert [r.status_code for r in got] == [200] * 11 + [422]
        assert all(_close(r.json(), e) for r, e in zip(got, expected))
        assert got[-1].json()["error"] == "input 'a POISON sentence' is refused by the pipeline"
        stats = httpx.get(f"{server.url}/metadata").json()["stats"]
        assert stats["largest_batch"] == 1 and stats["errors"] == 1  # the shared call failed; each ran alone
    finally:
        server.stop()


@pytest.mark.parametrize("body, status, message", [
    (b'{"inputs": "unclosed', 400, "not valid JSON"),
    (b'["a list"]', 422, '{"inputs": ..., "parameters": {...}}'),
    (b'{"inputs": "x", "extra": 1}', 422, "unknown field(s) extra"),
    (b'{"inputs": 42}', 422, "input 0 is int"),
    (b'{"inputs": []}', 422, "empty list"),
    (json.dumps({"inputs": ["t"] * 9}).encode(), 422, "9 inputs exceed max_items 8"),
    (json.dumps({"inputs": "y" * 2001}).encode(), 422, "2001 characters, over max_text_chars 2000"),
    (json.dumps({"inputs": "x", "parameters": {"top_k": 2}}).encode(), 422, "takes no parameter(s) top_k"),
    (json.dumps({"inputs": ["z" * 1500] * 14}).encode(), 413, "exceeds max_body_bytes 20000"),
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
