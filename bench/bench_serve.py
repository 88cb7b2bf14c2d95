"""Serving load test: bertkit serve (dynamic batching) vs the same FastAPI + uvicorn stack serving a
transformers pipeline request by request. The goal: >= 3x throughput at concurrency 32, p99 no worse.

Both servers load the same checkpoint (MiniLM with a seeded two-label head, written here), run as their
own processes one after the other (never at the same time), and get the same requests: one real SST-2
dev sentence each, sent by ``--concurrency`` clients at once; every response of the two servers is
compared (same label, scores within 1e-4). The reference holds a lock around its pipeline call, as one
model instance must (two concurrent forward passes on the same cores only slow each other down).

    .venv/bin/python bench/bench_serve.py --requests 512 --concurrency 1,8,32 [--int8]

With ``--int8`` bertkit serves ``--int8`` (its default calibration) against the same fp32 reference; the
outputs then differ a little, so the line reports how often the top labels agree and the largest score
difference instead of equality.

Prints one JSON line per concurrency: throughput (requests/s) and p50/p99 latency (ms) of each server, and
bertkit's pipeline alone on the same texts at the server's mean batch (no HTTP): the ceiling of the ratio.

With ``--routes openai,rerank`` it measures bertkit serve's other routes instead (no reference server):

- ``openai``: ``POST /v1/embeddings`` (OpenAI's body, floats) on ``bertkit serve --task sentence-embedding``
  over the MiniLM checkpoint itself, one SST-2 dev sentence per request;
- ``rerank``: ``POST /rerank`` (TEI's body) on ``bertkit serve --task rerank`` over MiniLM with a seeded one-logit
  head (a cross-encoder whose scores are arbitrary: its speed is a trained one's), one SQuAD dev question per
  request with ``--passages`` (20) dev contexts to score, its own context among them. Admission is raised to
  ``--passages`` x the highest concurrency, so that every request is admitted and the figures are the model's.

Every answer is checked (200; one 384-float unit vector; ``--passages`` scores). One JSON line: per route and
concurrency, requests/s (and passages/s for rerank), p50/p99 latency (ms), the mean model batch; the load average.

    .venv/bin/python bench/bench_serve.py --routes openai,rerank --concurrency 8,32 --requests 256
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SST2 = ROOT.parent / "shared" / "data" / "glue" / "SST-2" / "dev.tsv"
SQUAD = ROOT.parent / "shared" / "data" / "squad" / "dev-v1.1.json"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_classifier(model: Path, out: Path) -> Path:
    import torch

    from bertkit.heads import BertForSequenceClassification
    from bertkit.tokenization import BertTokenizer

    torch.manual_seed(0)
    BertForSequenceClassification.from_pretrained(model, id2label={0: "negative", 1: "positive"}).save_pretrained(out)
    BertTokenizer.from_pretrained(model).save_pretrained(out)
    return out


def make_cross_encoder(model: Path, out: Path) -> Path:
    """MiniLM with a seeded one-logit head: a cross-encoder for /rerank whose weights only need to cost the same."""
    import torch

    from bertkit.heads import BertForSequenceClassification
    from bertkit.tokenization import BertTokenizer

    torch.manual_seed(0)
    BertForSequenceClassification.from_pretrained(model, num_labels=1).save_pretrained(out)
    BertTokenizer.from_pretrained(model).save_pretrained(out)
    return out


def rerank_bodies(count: int, passages: int) -> list[dict]:
    """``count`` /rerank bodies: a SQuAD dev question and ``passages`` dev contexts, its own first among them."""
    data = json.loads(SQUAD.read_text(encoding="utf-8"))["data"]
    paragraphs = [p for article in data for p in article["paragraphs"]]
    bodies = []
    for i in range(count):
        k = (i * 7) % len(paragraphs)  # spread over the articles
        texts = [paragraphs[(k + j * 101) % len(paragraphs)]["context"] for j in range(passages)]
        bodies.append({"query": paragraphs[k]["qas"][0]["question"], "texts": texts})
    return bodies


async def load_route(url: str, path: str, bodies: list[dict], concurrency: int, check) -> tuple[float, list[float]]:
    """``bodies`` POSTed to ``path`` by ``concurrency`` clients; every answer must be 200 and pass ``check``."""
    import httpx

    latencies: list[float] = []
    queue: asyncio.Queue = asyncio.Queue()
    for i in range(len(bodies)):
        queue.put_nowait(i)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=300, limits=limits) as client:
        async def worker() -> None:
            while not queue.empty():
                i = queue.get_nowait()
                t0 = time.perf_counter()
                r = await client.post(f"{url}{path}", json=bodies[i])
                latencies.append(time.perf_counter() - t0)
                r.raise_for_status()
                check(bodies[i], r.json())

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - t0
    return wall, latencies


def measure_routes(args: argparse.Namespace, routes: list[str], levels: list[int], texts: list[str]) -> dict:
    """bertkit serve's /v1/embeddings and /rerank under ``levels`` concurrent clients (see the module's doc)."""

    def check_embedding(body: dict, answer: dict) -> None:
        vector = answer["data"][0]["embedding"]
        assert len(answer["data"]) == 1 and len(vector) == 384, answer
        assert abs(sum(v * v for v in vector) - 1) < 1e-4, "not a unit vector"

    def check_rerank(body: dict, answer: list) -> None:
        assert sorted(r["index"] for r in answer) == list(range(len(body["texts"]))), answer

    out: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        for route in routes:
            port = free_port()
            cmd = [sys.executable, "-m", "bertkit", "serve", "--port", str(port), "--max-batch-size",
                   str(args.max_batch_size), "--max-wait-ms", str(args.max_wait_ms), "--log-level", "warning"]
            if route == "openai":
                cmd += ["--model", str(args.model), "--task", "sentence-embedding"]
                bodies = [{"input": [t], "model": "minilm"} for t in texts]
                path, check, per = "/v1/embeddings", check_embedding, 1
            elif route == "rerank":
                model_dir = make_cross_encoder(args.model, Path(tmp) / "cross-encoder")
                cmd += ["--model", str(model_dir), "--task", "rerank", "--max-concurrent-requests",
                        str(args.passages * max(8, *levels)), "--max-items", str(args.passages)]
                bodies = rerank_bodies(args.rerank_requests, args.passages)
                path, check, per = "/rerank", check_rerank, args.passages
            else:
                raise SystemExit(f"--routes: unknown route {route!r}; choose openai, rerank")
            proc = start(cmd, port, args.server_threads)
            try:
                url = f"http://127.0.0.1:{port}"
                asyncio.run(load_route(url, path, bodies[:16], 8, check))  # warm-up
                out[route] = {}
                for c in levels:
                    before, cpu0 = model_runs(url), time.process_time()
                    wall, lat = asyncio.run(load_route(url, path, bodies, c, check))
                    after, client_cpu = model_runs(url), time.process_time() - cpu0
                    row = {"requests": len(bodies), "requests_per_s": round(len(bodies) / wall, 2),
                           "p50_ms": round(1000 * percentile(lat, 0.5), 1),
                           "p99_ms": round(1000 * percentile(lat, 0.99), 1),
                           "mean_batch": round((after[0] - before[0]) / max(1, after[1] - before[1]), 1),
                           "client_cpu_share": round(client_cpu / wall, 2)}
                    if per > 1:
                        row["passages_per_request"] = per
                        row["passages_per_s"] = round(per * len(bodies) / wall, 1)
                    out[route][c] = row
            finally:
                proc.terminate()
                proc.wait(30)
    return out


def reference_server(model_dir: str, port: int) -> None:
    """FastAPI + uvicorn + transformers.pipeline, one request at a time (the --_reference child)."""
    import threading

    import uvicorn
    from fastapi import FastAPI, Request
    from transformers import pipeline

    pipe = pipeline("text-classification", model=model_dir, tokenizer=model_dir, top_k=None, device="cpu")
    lock = threading.Lock()
    app = FastAPI()

    def predict(body: dict) -> list:
        with lock:
            out = pipe(body["inputs"])  # top_k=None: every label, best first
        out = out[0] if out and isinstance(out[0], list) else out  # some versions nest one text's list
        return [out]  # the Inference API's answer for one text, as bertkit serve gives it

    async def endpoint(request: Request):
        body = await request.json()
        return await asyncio.get_running_loop().run_in_executor(None, predict, body)

    endpoint.__annotations__["request"] = Request
    app.post("/predict")(endpoint)
    app.get("/health")(lambda: {"status": "ok"})
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


def start(cmd: list[str], port: int, threads: int | None) -> subprocess.Popen:
    import httpx

    env = dict(os.environ, **({"OMP_NUM_THREADS": str(threads)} if threads else {}))
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.time() + 180
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{' '.join(cmd)} exited: {proc.stderr.read()[-2000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"{' '.join(cmd)} did not answer /health within 180 s")


async def load(url: str, texts: list[str], concurrency: int) -> tuple[float, list[float], list[dict]]:
    """Each text POSTed to /predict (the Inference API's body) by ``concurrency`` clients: (wall s, latencies,
    the answers in text order)."""
    bodies = [{"inputs": text} for text in texts]
    index = {id(body): i for i, body in enumerate(bodies)}
    results: list[dict | None] = [None] * len(texts)

    def keep(body: dict, answer: dict) -> None:
        results[index[id(body)]] = answer

    wall, latencies = await load_route(url, "/predict", bodies, concurrency, keep)
    return wall, latencies, results  # type: ignore[return-value]


def server_stats(url: str) -> dict[str, float] | None:
    """bertkit serve's /metrics by name (``bertkit_items_total`` as ``items``); None for a server without it."""
    import httpx

    r = httpx.get(f"{url}/metrics", timeout=10)
    if r.status_code != 200 or "bertkit_items_total" not in r.text:
        return None
    lines = (line.split() for line in r.text.splitlines() if not line.startswith("#"))
    return {name.removeprefix("bertkit_").removesuffix("_total"): float(value) for name, value in lines}


def model_runs(url: str) -> tuple[int, int] | None:
    """(inputs, model calls) so far, from bertkit serve's /metrics; None for a server without it."""
    stats = server_stats(url)
    return None if stats is None else (int(stats["items"]), int(stats["batches"]))


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def measure(name: str, cmd: list[str], port: int, texts: list[str], levels: list[int], threads: int | None) -> dict:
    proc = start(cmd, port, threads)
    try:
        url = f"http://127.0.0.1:{port}"
        asyncio.run(load(url, texts[:32], 8))  # warm-up: first calls allocate and JIT
        out = {}
        for c in levels:
            before, cpu0 = model_runs(url), time.process_time()
            wall, lat, results = asyncio.run(load(url, texts, c))
            after, client_cpu = model_runs(url), time.process_time() - cpu0
            out[c] = {"requests_per_s": round(len(texts) / wall, 1), "p50_ms": round(1000 * percentile(lat, 0.5), 1),
                      "p99_ms": round(1000 * percentile(lat, 0.99), 1), "mean_ms": round(1000 * statistics.fmean(lat), 1),
                      # inputs per model call (dynamic batching; None for the reference, 1 by construction)
                      "mean_batch": (round((after[0] - before[0]) / (after[1] - before[1]), 1)
                                     if before and after and after[1] > before[1] else None),
                      # the load generator's own CPU share of the wall time: near 1.0 it, not the server, limits
                      "client_cpu_share": round(client_cpu / wall, 2), "results": results}
        return out
    finally:
        proc.terminate()
        proc.wait(30)


def model_only(model_dir: Path, texts: list[str], batch: int, threads: int | None, int8: bool = False) -> float:
    """Inputs/s of bertkit's pipeline alone, in this process, on the requests' texts in arrival order, in calls
    of ``batch`` inputs (the server's mean batch) with the servers' thread count: what the server could reach
    with HTTP, JSON and the load generator costing nothing. Its ratio to the reference server's requests/s
    bounds the throughput ratio any server around this model can show on this machine."""
    import torch

    from bertkit import pipeline

    if threads:
        torch.set_num_threads(threads)
    batch = max(1, batch)
    pipe = pipeline("text-classification", model_dir, batch_size=batch, progress=False,
                    quantize="int8" if int8 else None)
    if int8:  # as serve's own warm-up: int8's per-token quantization compiled before the first request
        from bertkit.quantization.kernels import compiled_quantize_per_token

        compiled_quantize_per_token.compile_next()
    pipe(texts[:32])  # warm-up, as the servers get
    t0 = time.perf_counter()
    for i in range(0, len(texts), batch):
        pipe(texts[i:i + batch])
    return len(texts) / (time.perf_counter() - t0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, default=ROOT / "models" / "minilm")
    p.add_argument("--requests", type=int, default=512)
    p.add_argument("--concurrency", default="1,8,32")
    p.add_argument("--max-batch-size", type=int, default=32)
    p.add_argument("--max-wait-ms", type=float, default=5.0)
    p.add_argument("--server-threads", type=int, default=None,
                   help="OMP_NUM_THREADS for both servers (default: torch's, all cores). On a machine where the "
                        "load generator shares the cores, fewer model threads than cores avoids stalls")
    p.add_argument("--int8", action="store_true",
                   help="bertkit serve --int8 (and its pipeline alone in int8; what stays float in bf16 on CPUs with "
                        "bf16 instructions, its default there); outputs are then compared as labels agreeing and "
                        "the largest score difference, not as equal")
    p.add_argument("--routes", default="",
                   help="openai,rerank: measure bertkit serve's /v1/embeddings and /rerank instead (module doc)")
    p.add_argument("--passages", type=int, default=20, help="--routes rerank: passages per query")
    p.add_argument("--rerank-requests", type=int, default=64, help="--routes rerank: queries per concurrency")
    p.add_argument("--_reference", nargs=2, metavar=("MODEL_DIR", "PORT"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args._reference:
        return reference_server(args._reference[0], int(args._reference[1]))
    levels = [int(c) for c in args.concurrency.split(",")]
    with open(SST2, encoding="utf-8", newline="") as f:
        sentences = [r["sentence"] for r in csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)]
    texts = (sentences * (1 + args.requests // len(sentences)))[:args.requests]
    if args.routes:
        import torch

        load_before = os.getloadavg()
        routes = measure_routes(args, args.routes.split(","), levels, texts)
        print(json.dumps({"bench": "serve_routes_load", "model": str(args.model), "routes": routes,
                          "max_batch_size": args.max_batch_size, "max_wait_ms": args.max_wait_ms,
                          "server_threads": args.server_threads or torch.get_num_threads(), "cpus": os.cpu_count(),
                          "load_average_before": [round(x, 2) for x in load_before],
                          "load_average_after": [round(x, 2) for x in os.getloadavg()],
                          "torch": torch.__version__}), flush=True)
        return
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = make_classifier(args.model, Path(tmp) / "clf")
        port = free_port()
        ours = measure("bertkit", [sys.executable, "-m", "bertkit", "serve", "--model", str(model_dir), "--task",
                                   "text-classification", "--port", str(port), "--max-batch-size",
                                   str(args.max_batch_size), "--max-wait-ms", str(args.max_wait_ms),
                                   "--log-level", "warning", *(["--int8"] if args.int8 else [])], port, texts,
                      levels, args.server_threads)
        port = free_port()
        ref = measure("transformers", [sys.executable, __file__, "--_reference", str(model_dir), str(port)], port,
                      texts, levels, args.server_threads)
        ceiling = {c: round(model_only(model_dir, texts, round(ours[c]["mean_batch"] or 1), args.server_threads,
                                       args.int8), 1) for c in levels}
    import torch
    import transformers

    for c in levels:
        a, b = ours[c].pop("results"), ref[c].pop("results")
        same = all([d["label"] for d in x[0]] == [d["label"] for d in y[0]]
                   and all(abs(dx["score"] - dy["score"]) < 1e-4 for dx, dy in zip(x[0], y[0])) for x, y in zip(a, b))
        labels_agree = sum(x[0][0]["label"] == y[0][0]["label"] for x, y in zip(a, b)) / len(a)
        score_diff = max(abs(dx["score"] - dy["score"]) for x, y in zip(a, b) for dx, dy in zip(x[0], y[0]))
        print(json.dumps({"bench": "serve", "concurrency": c, "requests": len(texts), "bertkit": ours[c],
                          "transformers": ref[c],
                          "throughput_ratio": round(ours[c]["requests_per_s"] / ref[c]["requests_per_s"], 2),
                          "p99_ratio": round(ours[c]["p99_ms"] / ref[c]["p99_ms"], 2), "outputs_equal": same,
                          "int8": args.int8, "top_label_agreement": round(labels_agree, 4),
                          "max_score_diff": round(score_diff, 4),
                          # the pipeline alone at the server's mean batch: the most a server could serve
                          "bertkit_model_only_inputs_per_s": ceiling[c],
                          "ceiling_ratio": round(ceiling[c] / ref[c]["requests_per_s"], 2),
                          "max_batch_size": args.max_batch_size, "max_wait_ms": args.max_wait_ms,
                          "torch": torch.__version__, "transformers_version": transformers.__version__,
                          "server_threads": args.server_threads or torch.get_num_threads(), "cpus": os.cpu_count()}), flush=True)


if __name__ == "__main__":
    main()
