"""The same embeddings through each route of ``bertkit serve``: TEI's /embed, OpenAI's /v1/embeddings as floats
and as base64, with an API key. What does each wire format cost over the model call?

One ``bertkit serve`` process (MiniLM, sentence-embedding, ``BERTKIT_API_KEY`` set) gets, per route, the same
``--requests`` SST-2 dev sentences (one per request) from ``--concurrency`` clients at once; every answer is
compared with bertkit's pipeline on the same sentence (cosine > 0.99999). Prints one JSON line per route and
concurrency: requests/s, p50 and p99 latency (ms), and the mean of the x-inference-time header.

    .venv/bin/python bench/bench_serve_routes.py --requests 256 --concurrency 1,16
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import csv
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SST2 = ROOT.parent / "shared" / "data" / "glue" / "SST-2" / "dev.tsv"
KEY = "bench-key"


def sentences(n: int) -> list[str]:
    if not SST2.is_file():
        return [f"sentence {i} about {'good ' * (i % 5)}films" for i in range(n)]
    with open(SST2, encoding="utf-8", newline="") as f:
        rows = [r["sentence"] for r in csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)]
    return [rows[i % len(rows)] for i in range(n)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(model: Path, port: int, task: str = "sentence-embedding") -> subprocess.Popen:
    import httpx

    cmd = [sys.executable, "-m", "bertkit", "serve", "--model", str(model), "--task", task,
           "--port", str(port), "--log-level", "warning", "--served-model-name", "minilm"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, BERTKIT_API_KEY=KEY))
    deadline = time.time() + 180
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"bertkit serve exited: {proc.stderr.read()[-2000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError("bertkit serve did not answer /health within 180 s")


def vector(route: str, answer) -> np.ndarray:
    if route == "embed":
        return np.asarray(answer[0])
    v = answer["data"][0]["embedding"]
    return np.frombuffer(base64.b64decode(v), dtype="<f4") if isinstance(v, str) else np.asarray(v)


async def load(url: str, route: str, texts: list[str], concurrency: int) -> tuple[float, list[float], list, list]:
    import httpx

    path, fmt = (f"/{route}", None) if route in ("embed", "embed_sparse") else ("/v1/embeddings", route.split("-")[1])
    latencies: list[float] = []
    answers: list = [None] * len(texts)
    inference: list[float] = []
    queue = list(range(len(texts)))
    headers = {"Authorization": f"Bearer {KEY}"}
    async with httpx.AsyncClient(timeout=300, limits=httpx.Limits(max_connections=concurrency)) as client:
        async def worker() -> None:
            while queue:
                i = queue.pop()
                body = {"inputs": texts[i]} if fmt is None else {"input": texts[i], "encoding_format": fmt}
                t0 = time.perf_counter()
                r = await client.post(url + path, json=body, headers=headers)
                latencies.append(time.perf_counter() - t0)
                r.raise_for_status()
                answers[i] = r.json()
                inference.append(float(r.headers["x-inference-time"]))

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.perf_counter() - t0, latencies, answers, inference


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=str(ROOT / "models" / "minilm"))
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--concurrency", default="1,16")
    args = parser.parse_args()

    from bertkit import pipeline

    texts = sentences(args.requests)
    expected = np.asarray(pipeline("sentence-embedding", args.model, progress=False)(texts))
    port = free_port()
    proc = start(Path(args.model), port)
    try:
        for concurrency in (int(c) for c in args.concurrency.split(",")):
            for route in ("embed", "openai-float", "openai-base64"):
                seconds, latencies, answers, inference = asyncio.run(
                    load(f"http://127.0.0.1:{port}", route, texts, concurrency))
                got = np.stack([vector(route, a) for a in answers])
                cosine = float((got * expected).sum(1).min())
                assert cosine > 0.99999, (route, cosine)
                q = statistics.quantiles(latencies, n=100)
                print(json.dumps({"route": route, "concurrency": concurrency, "requests": len(texts),
                                  "req_per_s": round(len(texts) / seconds, 1), "p50_ms": round(q[49] * 1000, 1),
                                  "p99_ms": round(q[98] * 1000, 1),
                                  "mean_x_inference_time_ms": round(statistics.mean(inference), 1),
                                  "min_cosine_to_pipeline": round(cosine, 7)}), flush=True)
    finally:
        proc.terminate()
        proc.wait(60)


if __name__ == "__main__":
    main()
