"""SPLADE from a BERT bertkit pre-trained itself: train a sparse retriever on SQuAD questions against the sentence
that answers them, with hard negatives mined by a dense embedder, and evaluate it on held-back articles against
BM25 and against dense embedders. Everything runs on a CPU (or on a GPU with ``--device cuda``).

    python examples/splade/splade_squad.py --model runs/pretrain-1h/model/final --out runs/splade   (make splade)

Steps (each skipped when its output is there, so a stopped run continues where it stopped):
1. Data (SQuAD v1.1 dev, ``--data``): each paragraph split into sentences; a question's positive is the sentence
   holding its answer's start. The last ``--heldout-articles`` articles are held back: their sentences are the
   retrieval corpus and their questions the queries; the other articles' (question, sentence) pairs train.
2. Hard negatives (``mined.jsonl``): ``mine_hard_negatives`` with the dense embedder ``--miner`` (MiniLM's
   all-MiniLM-L6-v2 by default) over the training articles' sentences: one negative a question, drawn at random
   from its 30 closest sentences, at most 95% of the positive's score (a margin against unlabelled positives).
3. SPLADE (``splade/``): ``SparseEncoder(--model)`` (a checkpoint with a masked-LM head starts a SPLADE model: the
   head's vocabulary logits, log(1 + relu), max-pooled over the tokens) trained with SpladeLoss over
   SparseMultipleNegativesRankingLoss on (question, positive, negative), FLOPS regularisers on both sides. It starts
   sparse: a head that saw little pre-training puts most word pieces above 0 for every text (a dense vector of
   ~30,000 weights, whose dot products make the ranking loss's logits thousands apart), so its decoder bias is first
   lowered by one constant until the training sentences activate ``--start-active`` word pieces on average (the
   ranking of a text's word pieces is the head's own).
4. With ``--dense-baseline``, a dense model from the same checkpoint (``dense/``): ``SentenceTransformer(--model)``
   (mean pooling) trained with MultipleNegativesRankingLoss on the same triplets, epochs and batches: what the
   same pre-training and data give without the sparse head.
5. Evaluation (``results.json``): for every query, each system scores every held-back sentence; nDCG@10, MRR@10 and
   Recall@10/100 of the answering sentence, one metric function for all systems (ties count against the system);
   BM25 (bm25s, Lucene's variant, k1 1.5, b 0.75, English stop words, the same lower-casing as the others);
   SPLADE's sparsity: active dimensions per query and per document, and the FLOPS statistic (the expected number
   of multiplications a query-document dot product does: sum over word pieces of P(active in a query) x
   P(active in a document)).
6. Serving (``--serve``): SPLADE and the dense miner behind ``bertkit serve`` (``--task sparse-embedding`` and
   ``--task sentence-embedding``), one query through ``POST /embed_sparse`` and ``POST /v1/embeddings``, the served
   vectors compared with the library's.

Prints the results table and writes ``results.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[\"'(\[A-Z0-9])")
# A full stop after these ends no sentence: initials ("J. R. R."), titles and common abbreviations.
ABBREVIATION = re.compile(r"(?:\b[A-Z]|\b(?:Dr|Mr|Mrs|Ms|St|Jr|Sr|Mt|Gen|Col|Lt|Sgt|Rev|Prof|Gov|Sen|Rep|Inc|Co|Ltd|"
                          r"No|vs|Vol|Fig|ca|c|approx|U\.S|U\.K|e\.g|i\.e))\.$")


# -- data ----------------------------------------------------------------------------------------------------------

def sentences_of(context: str) -> list[tuple[int, int]]:
    """(start, end) character spans of the context's sentences."""
    spans, start = [], 0
    for m in SENTENCE_END.finditer(context):
        if ABBREVIATION.search(context[start:m.start()]):
            continue  # "Dr. Smith", "J. R. R. Tolkien": the sentence goes on
        spans.append((start, m.start()))
        start = m.end()
    spans.append((start, len(context)))
    return [(a, b) for a, b in spans if context[a:b].strip()]


def squad_split(path: Path, heldout_articles: int) -> tuple[list[dict], list[str], dict, dict, dict]:
    """Training pairs, the training articles' sentences, and the held-back queries, corpus and relevance."""
    articles = json.loads(path.read_text(encoding="utf-8"))["data"]
    if not 0 < heldout_articles < len(articles):
        raise SystemExit(f"--heldout-articles {heldout_articles}: SQuAD dev has {len(articles)} articles")
    train_pairs, train_sentences = [], []
    queries, corpus, relevant = {}, {}, {}
    for a, article in enumerate(articles):
        heldout = a >= len(articles) - heldout_articles
        for p, paragraph in enumerate(article["paragraphs"]):
            context = paragraph["context"]
            spans = sentences_of(context)
            ids = [f"a{a}p{p}s{s}" for s in range(len(spans))]
            texts = [context[x:y].strip() for x, y in spans]
            if heldout:
                corpus.update(zip(ids, texts))
            else:
                train_sentences += texts
            for qa in paragraph["qas"]:
                start = qa["answers"][0]["answer_start"]
                s = next(i for i, (x, y) in enumerate(spans) if start < y) if start < spans[-1][1] else len(spans) - 1
                if heldout:
                    queries[qa["id"]] = qa["question"]
                    relevant[qa["id"]] = {ids[s]}
                else:
                    train_pairs.append({"query": qa["question"], "positive": texts[s]})
    return train_pairs, train_sentences, queries, corpus, relevant


# -- metrics -------------------------------------------------------------------------------------------------------

def ranking_metrics(scores: torch.Tensor, relevant_index: torch.Tensor) -> dict[str, float]:
    """scores (Q, D), relevant_index (Q,): one relevant document a query. Its rank counts every other document
    scoring at least as high (ties against the system: a sparse model's many zero scores gain nothing)."""
    scores = scores.float().cpu()
    own = scores.gather(1, relevant_index[:, None])
    rank = (scores >= own).sum(1).double()  # 1 = first
    ndcg = torch.where(rank <= 10, 1.0 / torch.log2(rank + 1.0), torch.zeros_like(rank))
    mrr = torch.where(rank <= 10, 1.0 / rank, torch.zeros_like(rank))
    return {"ndcg@10": round(float(ndcg.mean()), 4), "mrr@10": round(float(mrr.mean()), 4),
            "recall@10": round(float((rank <= 10).double().mean()), 4),
            "recall@100": round(float((rank <= 100).double().mean()), 4)}


def sparsity(queries: torch.Tensor, documents: torch.Tensor) -> dict[str, float]:
    """Active dimensions per query and per document, and FLOPS = sum_j P(j active in a query) P(j in a document)."""
    q = queries.coalesce().to_dense() > 0
    d = documents.coalesce().to_dense() > 0
    return {"query_active_dims": round(float(q.sum(1).double().mean()), 1),
            "document_active_dims": round(float(d.sum(1).double().mean()), 1),
            "flops": round(float((q.double().mean(0) * d.double().mean(0)).sum()), 3),
            "vocabulary": queries.shape[1]}


def bm25_scores(queries: list[str], documents: list[str]) -> torch.Tensor:
    try:
        import bm25s
    except ImportError as e:
        raise SystemExit('BM25 needs bm25s: pip install "bm25s>=0.2"') from e
    retriever = bm25s.BM25(k1=1.5, b=0.75, method="lucene")
    retriever.index(bm25s.tokenize(documents, lower=True, stopwords="en", show_progress=False), show_progress=False)
    tokens = bm25s.tokenize(queries, lower=True, stopwords="en", show_progress=False, return_ids=False)
    vocab = retriever.vocab_dict
    return torch.stack([torch.as_tensor(retriever.get_scores([t for t in q if t in vocab]), dtype=torch.float32)
                        for q in tokens])


# -- the steps -----------------------------------------------------------------------------------------------------

def mine(pairs: list[dict], sentences: list[str], miner: Path, out: Path, seed: int) -> list[dict]:
    path = out / "mined.jsonl"
    if path.is_file():
        return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    from bertkit.sentence import SentenceTransformer
    from bertkit.sentence.hard_negatives import mine_hard_negatives

    model = SentenceTransformer(str(miner))
    triplets = mine_hard_negatives(pairs, model, corpus=sentences, range_max=30, relative_margin=0.05,
                                   num_negatives=1, sampling_strategy="random", batch_size=64,
                                   rng=random.Random(seed))
    partial = path.with_suffix(".partial")
    partial.write_text("".join(json.dumps(t) + "\n" for t in triplets), encoding="utf-8")
    partial.replace(path)
    return triplets


def train(kind: str, checkpoint: Path, triplets: list[dict], out: Path, args: argparse.Namespace) -> Path:
    """Train the SPLADE or the dense model on the triplets; returns its saved directory."""
    final = out / kind
    if (final / "config.json").is_file() or (final / "modules.json").is_file():
        return final
    import datasets

    import bertkit.sentence as S
    from bertkit.sentence import losses
    from bertkit.sentence.sparse_encoder import losses as sparse_losses

    dataset = datasets.Dataset.from_list(triplets)
    common = dict(output_dir=str(out / f"{kind}-run"), num_train_epochs=args.epochs,
                  per_device_train_batch_size=args.batch_size, learning_rate=args.learning_rate, warmup_ratio=0.1,
                  save_strategy="epoch", save_total_limit=1, logging_steps=50, report_to="none", seed=args.seed,
                  use_cpu=args.device == "cpu", batch_sampler="no_duplicates")
    if kind == "splade":
        model = S.SparseEncoder(str(checkpoint), device=args.device)
        model.max_seq_length = args.max_seq_length
        if args.start_active:
            start_sparse(model, [t["positive"] for t in triplets[:128]], args.start_active)
        loss = sparse_losses.SpladeLoss(model, loss=sparse_losses.SparseMultipleNegativesRankingLoss(model),
                                        query_regularizer_weight=args.query_regularizer,
                                        document_regularizer_weight=args.document_regularizer)
        trainer = S.SparseEncoderTrainer(model=model, args=S.SparseEncoderTrainingArguments(**common),
                                         train_dataset=dataset, loss=loss)
    else:
        model = S.SentenceTransformer(str(checkpoint), device=args.device)
        model.max_seq_length = args.max_seq_length
        trainer = S.SentenceTransformerTrainer(model=model, args=S.SentenceTransformerTrainingArguments(**common),
                                               train_dataset=dataset,
                                               loss=losses.MultipleNegativesRankingLoss(model))
    resume = any((out / f"{kind}-run").glob("checkpoint-*"))
    trainer.train(resume_from_checkpoint=resume or None)
    model.save(str(final))
    return final


def start_sparse(model, texts: list[str], active: int) -> None:
    """Lower the masked-LM decoder's bias by one constant so that ``texts`` activate ``active`` word pieces on
    average (bisection on the shift; the order of each text's logits is untouched)."""
    decoder = next(m for name, m in model.named_modules() if name.endswith("predictions.decoder"))

    def mean_active(shift: float) -> float:
        with torch.no_grad():
            decoder.bias.sub_(shift)
            got = model.sparsity(model.encode_document(texts, batch_size=64))["active_dims"]
            decoder.bias.add_(shift)
        return got

    low, high = 0.0, 1.0
    while mean_active(high) > active:
        low, high = high, high * 2
    for _ in range(12):
        mid = (low + high) / 2
        low, high = (mid, high) if mean_active(mid) > active else (low, mid)
    with torch.no_grad():
        decoder.bias.sub_(high)
    print(f"SPLADE starts sparse: decoder bias lowered by {high:.3f}, {mean_active(0.0):.0f} active word pieces "
          f"a training sentence", flush=True)


def evaluate(systems: dict[str, Path], queries: dict, corpus: dict, relevant: dict) -> dict:
    from bertkit.sentence import SentenceTransformer, SparseEncoder

    query_ids, doc_ids = list(queries), list(corpus)
    q_texts, d_texts = [queries[i] for i in query_ids], [corpus[i] for i in doc_ids]
    where = {d: i for i, d in enumerate(doc_ids)}
    gold = torch.tensor([where[next(iter(relevant[q]))] for q in query_ids])
    results = {"queries": len(query_ids), "documents": len(doc_ids)}
    start = time.perf_counter()
    results["BM25 (bm25s)"] = ranking_metrics(bm25_scores(q_texts, d_texts), gold)
    results["BM25 (bm25s)"]["seconds"] = round(time.perf_counter() - start, 1)
    for name, directory in systems.items():
        start = time.perf_counter()
        if name.startswith("SPLADE"):
            model = SparseEncoder(str(directory))
            q = model.encode_query(q_texts, batch_size=64)
            d = model.encode_document(d_texts, batch_size=64)
            scores = model.similarity(q, d)
            results[name] = {**ranking_metrics(scores, gold), **sparsity(q, d)}
        else:
            model = SentenceTransformer(str(directory))
            q = model.encode_query(q_texts, batch_size=64, convert_to_tensor=True, normalize_embeddings=True)
            d = model.encode_document(d_texts, batch_size=64, convert_to_tensor=True, normalize_embeddings=True)
            results[name] = ranking_metrics(q @ d.T, gold)
        results[name]["seconds"] = round(time.perf_counter() - start, 1)
    return results


def evaluator_check(splade: Path, queries: dict, corpus: dict, relevant: dict) -> dict:
    """sentence-transformers' way of measuring the same: SparseInformationRetrievalEvaluator on the model."""
    from bertkit.sentence import SparseEncoder
    from bertkit.sentence.sparse_encoder.evaluation import SparseInformationRetrievalEvaluator

    evaluator = SparseInformationRetrievalEvaluator(queries, corpus, relevant, name="heldout", batch_size=64,
                                                    show_progress_bar=False)
    metrics = evaluator(SparseEncoder(str(splade)))
    return {k.split("heldout_", 1)[-1]: round(v, 4) for k, v in metrics.items()
            if k.endswith(("ndcg@10", "mrr@10", "recall@10", "query_active_dims", "corpus_active_dims"))}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(port: int, route: str, body: dict) -> object:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{route}", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())


def serve_both(splade: Path, dense: Path, query: str) -> dict:
    """SPLADE and a dense embedder behind `bertkit serve`; the served vectors against the library's for one
    query."""
    from bertkit.sentence import SentenceTransformer, SparseEncoder

    bertkit = shutil.which("bertkit", path=str(Path(sys.executable).parent)) or "bertkit"
    servers, report = [], {}
    try:
        for task, directory in (("sparse-embedding", splade), ("sentence-embedding", dense)):
            port = free_port()
            servers.append((port, subprocess.Popen([bertkit, "serve", "--model", str(directory), "--task", task,
                                                    "--port", str(port), "--log-level", "warning"])))
        for port, server in servers:
            for _ in range(600):
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1):
                        break
                except OSError:
                    if server.poll() is not None:
                        raise SystemExit(f"bertkit serve on port {port} exited with {server.returncode}") from None
                    time.sleep(0.2)
            else:
                raise SystemExit(f"bertkit serve on port {port} did not answer /health within 120 s")
        (sparse_port, _), (dense_port, _) = servers
        served = post(sparse_port, "/embed_sparse", {"inputs": [query]})[0]
        want = SparseEncoder(str(splade)).encode_query([query]).coalesce()
        got = {d["index"]: d["value"] for d in served}
        report["/embed_sparse"] = {"active_dims": len(got),
                                   "same_indices": sorted(got) == want.indices()[1].tolist(),
                                   "max_abs_diff": max(abs(got[int(i)] - float(v)) for i, v in
                                                       zip(want.indices()[1], want.values()))}
        vector = post(dense_port, "/v1/embeddings", {"input": [query], "model": "dense"})["data"][0]["embedding"]
        local = SentenceTransformer(str(dense)).encode([query], normalize_embeddings=True)[0]
        report["/v1/embeddings"] = {"dimensions": len(vector),
                                    "max_abs_diff": float(max(abs(a - b) for a, b in zip(vector, local)))}
    finally:
        for _, server in servers:
            server.terminate()
            server.wait(timeout=30)
    return report


def table(results: dict) -> str:
    rows = ["| system | nDCG@10 | MRR@10 | R@10 | R@100 | active dims (query / document) | FLOPS |",
            "|---|---:|---:|---:|---:|---:|---:|"]
    for name, r in results.items():
        if not isinstance(r, dict) or "ndcg@10" not in r:
            continue
        dims = f"{r['query_active_dims']} / {r['document_active_dims']}" if "flops" in r else ""
        rows.append(f"| {name} | {r['ndcg@10']:.4f} | {r['mrr@10']:.4f} | {r['recall@10']:.4f} | "
                    f"{r['recall@100']:.4f} | {dims} | {r.get('flops', '')} |")
    return "\n".join(rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", type=Path, required=True, help="a checkpoint with a masked-LM head (bertkit pretrain's "
                   "final/, or any BertForMaskedLM / BertForPreTraining directory)")
    p.add_argument("--out", type=Path, default=REPO / "runs" / "splade")
    p.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data", help="holds squad/dev-v1.1.json")
    p.add_argument("--miner", type=Path, default=REPO / "models" / "minilm", help="the dense embedder that mines")
    p.add_argument("--heldout-articles", type=int, default=8)
    # The defaults suit make pretrain-1h's small model (its best of the settings docs/sentence.md lists); a larger,
    # better pre-trained model takes a smaller rate (sentence-transformers' SPLADE examples use 2e-5).
    p.add_argument("--epochs", type=float, default=4)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--learning-rate", type=float, default=5e-4)
    p.add_argument("--max-seq-length", type=int, default=128, help="word pieces a text keeps (64 cut 12% of the sentences with an 8,192-entry vocabulary, 128 cuts 0.9%)")
    p.add_argument("--query-regularizer", type=float, default=5e-5, help="FLOPS weight on queries")
    p.add_argument("--document-regularizer", type=float, default=3e-5, help="FLOPS weight on documents")
    p.add_argument("--start-active", type=int, default=256,
                   help="word pieces a training sentence activates when SPLADE training starts (0: the head as is)")
    p.add_argument("--dense-baseline", action="store_true",
                   help="also train a dense model from --model on the same triplets")
    p.add_argument("--serve", action="store_true", help="also serve both models and query them over HTTP")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                   help="where the models train and encode (default: the GPU when there is one)")
    args = p.parse_args()
    if not (args.model / "config.json").is_file():
        raise SystemExit(f"--model {args.model} holds no config.json: pre-train one first (make pretrain-1h)")
    squad = args.data / "squad" / "dev-v1.1.json"
    if not squad.is_file():
        raise SystemExit(f"{squad} is absent: give --data the folder that holds squad/dev-v1.1.json")
    if args.serve and not (args.miner / "config.json").is_file():
        raise SystemExit(f"--serve serves the miner as the dense model: --miner {args.miner} holds no config.json")
    args.out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(args.seed)
    pairs, train_sentences, queries, corpus, relevant = squad_split(squad, args.heldout_articles)
    print(f"{len(pairs)} training questions over {len(train_sentences)} sentences; held back: {len(queries)} "
          f"questions over {len(corpus)} sentences", flush=True)
    triplets = mine(pairs, train_sentences, args.miner, args.out, args.seed)
    print(f"{len(triplets)} triplets with a mined negative", flush=True)
    systems = {"SPLADE (this recipe)": train("splade", args.model, triplets, args.out, args)}
    if (args.miner / "config.json").is_file():
        systems[f"dense {args.miner.name} (the miner)"] = args.miner
    else:
        print(f"--miner {args.miner} holds no model: the mined negatives were read from {args.out / 'mined.jsonl'}, "
              "and the miner is not evaluated", flush=True)
    if args.dense_baseline:
        systems["dense, same checkpoint and data"] = train("dense", args.model, triplets, args.out, args)
    results = evaluate(systems, queries, corpus, relevant)
    splade = systems["SPLADE (this recipe)"]
    results["SparseInformationRetrievalEvaluator"] = evaluator_check(splade, queries, corpus, relevant)
    if args.serve:
        results["served"] = serve_both(splade, args.miner, next(iter(queries.values())))
    results["settings"] = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    results["threads"] = torch.get_num_threads()
    (args.out / "results.json").write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    print(table(results))
    print(json.dumps({k: v for k, v in results.items() if k in ("SparseInformationRetrievalEvaluator", "served")}))


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
