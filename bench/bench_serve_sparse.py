"""What a sparse vector costs to serve beside a dense one: ``bertkit serve`` on one masked-LM checkpoint directory,
once as ``--task sentence-embedding`` (TEI's /embed: mean-pooled unit vectors) and once as ``--task
sparse-embedding`` (TEI's /embed_sparse: SPLADE's active word pieces), each sent the same ``--requests`` SST-2 dev
sentences (one per request) from ``--concurrency`` clients, the two servers in turn, ``--rounds`` times.

Model (``--shape``): ``minilm``, MiniLM's encoder with a masked-LM head drawn by transformers (bench_sparse.py's
``splade_directory``: seed 0, bias -3.5, some hundreds of active word pieces per text); ``base``, BERT-BASE's shape
(12 layers, 768 wide, MiniLM's 30,522-piece vocabulary) with every weight drawn by transformers (seed 0) and the
head's bias set so the texts activate ``--active`` word pieces on average. The head's vocabulary product is a fixed
H x 30,522 a token while the encoder grows as L x 12 H^2, so the shape decides the ratio. Every sparse answer is checked against
``SparseEncoder.encode_document`` (indices identical, values within 1e-5). Prints one JSON line: requests/s of each
route (the median round), and ``sparse_cost_ratio``, the dense rate over the sparse one; each server process's CPU
seconds a request (Linux's /proc, the median round) and ``sparse_cpu_ratio``, sparse over dense, which a machine shared
with other jobs disturbs less than the rates; ``load``, the 1-minute load average at the end.

    .venv/bin/python bench/bench_serve_sparse.py --requests 256 --concurrency 16 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import tempfile
from pathlib import Path

import torch

from bench_serve_routes import free_port, load, sentences, start
from bench_sparse import TOKENIZER_FILES, splade_directory

ROOT = Path(__file__).resolve().parents[1]


def base_shape_directory(minilm: Path, out: Path, texts: list[str], active: int) -> None:
    """A BertForMaskedLM of BERT-BASE's shape with drawn weights, its head's bias set so ``texts`` activate
    ``active`` word pieces each on average (a drawn head's logits are centred on 0: half the vocabulary otherwise)."""
    import transformers

    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                                     intermediate_size=3072)
    mlm = transformers.BertForMaskedLM(config).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(minilm))
    with torch.no_grad():
        mlm.cls.predictions.bias.zero_()
        batch = tokenizer(texts[:64], padding=True, truncation=True, max_length=128, return_tensors="pt")
        logits = mlm(**batch).logits.masked_fill(~batch["attention_mask"].bool()[..., None], -torch.inf)
        pooled = logits.amax(1)  # (texts, V): each text's largest logit per word piece
        mlm.cls.predictions.bias.fill_(-pooled.topk(active, dim=1).values[:, -1].mean().item())
    mlm.save_pretrained(out)
    for name in TOKENIZER_FILES:
        shutil.copy(minilm / name, out / name)


def cpu_seconds(pid: int) -> float:
    """The process's user + system CPU seconds so far (Linux's /proc): its threads together."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=ROOT / "models" / "minilm")
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--shape", choices=("minilm", "base"), default="minilm")
    parser.add_argument("--active", type=int, default=300, help="--shape base: active word pieces a text")
    args = parser.parse_args()

    from bertkit.sentence import SparseEncoder

    texts = sentences(args.requests)
    with tempfile.TemporaryDirectory() as tmp:
        if args.shape == "minilm":
            splade_directory(args.model, Path(tmp))
        else:
            base_shape_directory(args.model, Path(tmp) / "checkpoint", texts, args.active)
        checkpoint = Path(tmp) / "checkpoint"  # the same directory behind both servers
        want = SparseEncoder(checkpoint).encode_document(texts).coalesce()
        rows, dims = want.indices()
        servers = {}
        try:
            for route, task in (("embed", "sentence-embedding"), ("embed_sparse", "sparse-embedding")):
                port = free_port()
                servers[route] = (port, start(checkpoint, port, task))
            rates: dict[str, list[float]] = {route: [] for route in servers}
            cpu: dict[str, list[float]] = {route: [] for route in servers}
            for _ in range(args.rounds):
                for route, (port, proc) in servers.items():
                    before = cpu_seconds(proc.pid)
                    seconds, _, answers, _ = asyncio.run(load(f"http://127.0.0.1:{port}", route, texts,
                                                              args.concurrency))
                    rates[route].append(len(texts) / seconds)
                    cpu[route].append((cpu_seconds(proc.pid) - before) / len(texts))
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
    dense_cpu, sparse_cpu = (statistics.median(cpu[r]) for r in ("embed", "embed_sparse"))
    print(json.dumps({"bench": "serve_sparse", "requests": len(texts), "concurrency": args.concurrency,
                      "rounds": args.rounds, "shape": args.shape, "threads": torch.get_num_threads(), "cpus": os.cpu_count(),
                      "embed_req_per_s": round(dense, 1), "embed_sparse_req_per_s": round(sparse, 1),
                      "sparse_cost_ratio": round(dense / sparse, 3),
                      "embed_cpu_ms_per_req": round(dense_cpu * 1e3, 1),
                      "embed_sparse_cpu_ms_per_req": round(sparse_cpu * 1e3, 1),
                      "sparse_cpu_ratio": round(sparse_cpu / dense_cpu, 3), "load": round(os.getloadavg()[0], 2),
                      "active_dims_per_text": round(len(dims) / len(texts), 1)}))


if __name__ == "__main__":
    main()
