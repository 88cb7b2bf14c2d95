"""What the `bertkit serve` tests share (test_serve.py, test_serve_clients.py, test_serve_limits.py,
test_serve_wire.py): the checkpoint they serve, a uvicorn server on a free loopback port, a ``Gate`` that holds
the model thread inside a model call, and a poll for a condition the server reaches on its own."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

MODEL = Path(os.environ.get("BERTKIT_TEST_MODEL", "models/minilm"))


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


class Gate:
    """Holds the model thread at the start of its next model call until released: a busy model on demand."""

    def __init__(self):
        self.opened = threading.Event()
        self.entered = threading.Event()
        self.opened.set()

    def hold(self) -> None:
        self.entered.clear()
        self.opened.clear()

    def release(self) -> None:
        self.opened.set()

    def __call__(self) -> None:
        self.entered.set()
        assert self.opened.wait(60), "the test never released the model thread"


def until(condition: Callable[[], object], seconds: float = 20) -> None:
    """Polls ``condition`` until it holds; fails the test after ``seconds``."""
    deadline = time.time() + seconds
    while not condition():
        assert time.time() < deadline, "the server did not get there"
        time.sleep(0.02)


def metrics(url: str, **kwargs) -> dict[str, float]:
    """The server's ``/metrics`` by name: ``bertkit_items_total`` as ``items``, the gauge ``bertkit_admitted_inputs``
    as ``admitted_inputs``."""
    import httpx

    lines = httpx.get(f"{url}/metrics", **kwargs).text.splitlines()
    return {name.removeprefix("bertkit_").removesuffix("_total"): float(value)
            for name, value in (line.split() for line in lines if not line.startswith("#"))}


def refusal(response) -> str:
    """A refusal's message: in OpenAI's error body on /v1/embeddings (``{"error": {"message", "type", ...}}``), in
    TEI's (``{"error", "error_type"}``) on every other route."""
    body = response.json()
    return body["error"]["message"] if response.url.path == "/v1/embeddings" else body["error"]
