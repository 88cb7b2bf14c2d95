"""What a sparse vector costs to serve beside a dense one: ``bertkit serve`` on one masked-LM checkpoint directory,
once as ``--task sentence-embedding`` (TEI's /embed: mean-pooled unit vectors) and once as ``--task
sparse-embedding`` (TEI's /embed_sparse: SPLADE's active word pieces), each sent the same ``--requests`` SST-2 dev
sentences (one per request) from ``--concurrency`` clients, the two servers in turn, ``--rounds`` times.

Model: MiniLM's encoder with a masked-LM head drawn by transformers (bench_sparse.py's ``splade_directory``: seed 0,
bias -3.5, some hundreds of active word pieces per text). Every sparse answer is checked against
``SparseEncoder.encode_document`` (indices identical, values within 1e-5). Prints one JSON line: requests/s of each
route (the median round), and ``sparse_cost_ratio``, the dense rate over the sparse one.

    .venv/bin/python bench/bench_serve_sparse.py --requests 256 --concurrency 16 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
from pathlib import Path

import torch

from bench_serve_routes import free_port, load, sentences, start
from bench_sparse import splade_directory

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=ROOT / "models" / "minilm")
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    from bertkit.sentence import SparseEncoder

    texts = sentences(args.requests)
    with tempfile.TemporaryDirectory() as tmp:
        splade_directory(args.model, Path(tmp))
        checkpoint = Path(tmp) / "checkpoint"  # the same directory behind both servers
        want = SparseEncoder(checkpoint).encode_document(texts).coalesce()
        rows, dims = want.indices()
        servers = {}
        try:
            for route, task in (("embed", "sentence-embedding"), ("embed_sparse", "sparse-embedding")):
                port = free_port()
                servers[route] = (port, start(checkpoint, port, task))
            rates: dict[str, list[float]] = {route: [] for route in servers}
            for _ in range(args.rounds):
                for route, (port, _) in servers.items():
                    seconds, _, answers, _ = asyncio.run(load(f"http://127.0.0.1:{port}", route, texts,
                                                              args.concurrency))
                    rates[route].append(len(texts) / seconds)
                    if route == "embed_sparse":
                        for i, answer in enumerate(answers):
                            assert [d["index"] for d in answer[0]] == dims[rows == i].tolist(), i
                            torch.testing.assert_close(torch.tensor([d["value"] for d in answer[0]]),
                                                       want.values()[rows == i], atol=1e-5, rtol=1e-5)
        finally:
            for _, proc in servers.values():
                proc.terminate()
                proc.wait(60)
    dense, sparse = (statistics.median(rates[r]) for r in ("embed", "embed_sparse"))
    print(json.dumps({"bench": "serve_sparse", "requests": len(texts), "concurrency": args.concurrency,
                      "rounds": args.rounds, "threads": torch.get_num_threads(), "cpus": os.cpu_count(),
                      "embed_req_per_s": round(dense, 1), "embed_sparse_req_per_s": round(sparse, 1),
                      "sparse_cost_ratio": round(dense / sparse, 3),
                      "active_dims_per_text": round(len(dims) / len(texts), 1)}))


if __name__ == "__main__":
    main()
