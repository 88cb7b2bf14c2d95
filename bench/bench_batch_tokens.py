"""What ``bertkit serve --max-batch-tokens`` does to mixed-length traffic.

One ``bertkit serve --task sentence-embedding`` on MiniLM per setting of ``--max-batch-tokens`` (``--settings``,
default 1000000 (no bound in practice), 16384 (the default, TEI's), 4096, 2048, 1024), each run as its own
process, one after the other, with the same traffic: ``--requests`` POST /v1/embeddings of one text each, from
``--concurrency`` closed-loop clients, where every ``--long-every``-th request is a SQuAD dev context (about 160
tokens, up to the model's 512) and the others SST-2 dev sentences (about 25 tokens). A call's padded tokens are
its sequences x its longest; the bound splits a call before the job that would pass it.

    .venv/bin/python bench/bench_batch_tokens.py --requests 600 --concurrency 32

One JSON line per setting: requests/s, p50/p99 latency (ms) of the short and of the long requests separately, the
mean inputs and the mean padded tokens per model call (from /metrics), every answer checked (a unit vector of
384 floats); then the load average.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
import time
from pathlib import Path

from bench_serve import SQUAD, SST2, free_port, percentile, start

ROOT = Path(__file__).resolve().parents[1]


def traffic(requests: int, long_every: int) -> list[tuple[str, str]]:
    """(kind, text) per request: SST-2 dev sentences, a SQuAD dev context every ``long_every``-th."""
    sentences = [line.split("\t")[0] for line in SST2.read_text(encoding="utf-8").splitlines()[1:]]
    data = json.loads(SQUAD.read_text(encoding="utf-8"))["data"]
    contexts = [p["context"] for article in data for p in article["paragraphs"]]
    return [("long", contexts[(i * 37) % len(contexts)]) if i % long_every == long_every - 1
            else ("short", sentences[i % len(sentences)]) for i in range(requests)]


def counters(url: str) -> dict[str, float]:
    """The model-call counters of /metrics: calls, inputs and padded tokens so far."""
    import httpx

    text = httpx.get(f"{url}/metrics", timeout=10).text
    out: dict[str, float] = {}
    for name in ("bertkit_batch_size_count", "bertkit_batch_size_sum", "bertkit_batch_tokens_sum"):
        match = re.search(rf"^{name}(?:{{[^}}]*}})? ([0-9.e+]+)$", text, re.M)
        out[name] = float(match.group(1)) if match else float("nan")
    return out


async def run(url: str, requests: list[tuple[str, str]], concurrency: int) -> tuple[float, dict[str, list[float]]]:
    import httpx

    latencies: dict[str, list[float]] = {"short": [], "long": []}
    queue: asyncio.Queue = asyncio.Queue()
    for item in requests:
        queue.put_nowait(item)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=300, limits=limits) as client:
        async def worker() -> None:
            while not queue.empty():
                kind, text = queue.get_nowait()
                t0 = time.perf_counter()
                r = await client.post(f"{url}/v1/embeddings", json={"input": [text], "model": "minilm"})
                latencies[kind].append(time.perf_counter() - t0)
                r.raise_for_status()
                vector = r.json()["data"][0]["embedding"]
                assert len(vector) == 384 and abs(sum(v * v for v in vector) - 1) < 1e-4, "not a unit vector"

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return time.perf_counter() - t0, latencies


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, default=ROOT / "models" / "minilm")
    p.add_argument("--requests", type=int, default=600)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--long-every", type=int, default=4)
    p.add_argument("--settings", default="1000000,16384,4096,2048,1024")
    p.add_argument("--server-threads", type=int, default=None)
    args = p.parse_args()
    requests = traffic(args.requests, args.long_every)
    for setting in [int(s) for s in args.settings.split(",")]:
        port = free_port()
        cmd = [sys.executable, "-m", "bertkit", "serve", "--model", str(args.model), "--task", "sentence-embedding",
               "--port", str(port), "--max-batch-tokens", str(setting), "--log-level", "warning"]
        proc = start(cmd, port, args.server_threads)
        try:
            url = f"http://127.0.0.1:{port}"
            asyncio.run(run(url, requests[:64], 8))  # warm-up
            before = counters(url)
            wall, latencies = asyncio.run(run(url, requests, args.concurrency))
            after = counters(url)
        finally:
            proc.terminate()
            proc.wait(30)
        calls = after["bertkit_batch_size_count"] - before["bertkit_batch_size_count"]
        line = {"bench": "serve_max_batch_tokens", "max_batch_tokens": setting, "requests": len(requests),
                "concurrency": args.concurrency, "long_share": round(1 / args.long_every, 3),
                "requests_per_s": round(len(requests) / wall, 2),
                **{f"{kind}_p{q}_ms": round(1000 * percentile(lat, q / 100), 1)
                   for kind, lat in latencies.items() for q in (50, 99)},
                "mean_inputs_per_call": round((after["bertkit_batch_size_sum"]
                                               - before["bertkit_batch_size_sum"]) / max(calls, 1), 1),
                "mean_padded_tokens_per_call": round((after["bertkit_batch_tokens_sum"]
                                                      - before["bertkit_batch_tokens_sum"]) / max(calls, 1)),
                "model_calls": int(calls)}
        print(json.dumps(line), flush=True)
    print(json.dumps({"bench": "serve_max_batch_tokens", "loadavg": os.getloadavg()}), flush=True)


if __name__ == "__main__":
    main()
