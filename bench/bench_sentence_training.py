"""Training a sentence embedder: sentence-transformers and bertkit.sentence, the same script, in one run.

MultipleNegativesRankingLoss on SQuAD v1.1 dev (question, paragraph) pairs from the first articles, batch 32
drawn by the no-duplicates sampler (a paragraph has several questions), one epoch, learning rate 5e-5 with
10% warmup, from the same checkpoint (a BERT directory: mean pooling in both libraries),
max_seq_length 256.
The only line that differs between the two runs is the import. Then, for each trained model:
InformationRetrievalEvaluator on the held-back articles (their questions against their paragraphs), and
``encode`` throughput on those paragraphs (batch 32).

    python bench/bench_sentence_training.py --model models/minilm --threads 2            # about 10 minutes
    python bench/bench_sentence_training.py --model models/minilm --threads 2 --limit 64  # a smoke run

Prints one JSON line: per library the training throughput (pairs/s, steps and seconds of ``train()``), the
encode throughput (paragraphs/s) and the retrieval metrics; the ratios bertkit / sentence-transformers.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("BERTKIT_DATA", REPO.parent / "shared" / "data"))
METRICS = ("cosine_ndcg@10", "cosine_mrr@10", "cosine_accuracy@1", "cosine_recall@10", "cosine_map@100")


def squad(path: Path, limit: int, held_out_articles: int, eval_queries: int) -> tuple[list[dict], tuple]:
    """Training pairs from the first articles (``limit`` questions); the evaluator's data from the last
    ``held_out_articles``: every paragraph is the corpus, the first ``eval_queries`` questions the queries."""
    articles = json.loads(path.read_text())["data"]
    if held_out_articles >= len(articles):
        raise ValueError(f"--held-out-articles {held_out_articles} leaves no training article of {len(articles)}")
    paragraphs = [p for a in articles[:-held_out_articles] for p in a["paragraphs"]]
    # every paragraph's first question, then every paragraph's second, ...: a limit spreads over the articles
    train = [{"question": p["qas"][j]["question"], "paragraph": p["context"]}
             for j in range(max(len(p["qas"]) for p in paragraphs)) for p in paragraphs if j < len(p["qas"])][:limit]
    held = [p for a in articles[-held_out_articles:] for p in a["paragraphs"]]
    corpus = {f"p{i}": p["context"] for i, p in enumerate(held)}
    queries = {f"q{i}-{j}": q["question"] for i, p in enumerate(held) for j, q in enumerate(p["qas"])}
    queries = dict(list(queries.items())[:eval_queries])
    relevant = {qid: {"p" + qid[1:].split("-")[0]} for qid in queries}
    return train, (queries, corpus, relevant)


def script(lib: str, model_dir: Path, out: Path, train: list[dict], ir_data: tuple, seed: int) -> dict:
    """The training script; ``lib`` picks the import, nothing else differs."""
    from datasets import Dataset

    if lib == "sentence_transformers":
        import sentence_transformers as S
        from sentence_transformers.sentence_transformer import evaluation, losses
        from sentence_transformers.sentence_transformer.training_args import BatchSamplers
    else:
        S = importlib.import_module("bertkit.sentence")
        from bertkit.sentence import evaluation, losses
        from bertkit.sentence.training_args import BatchSamplers
    model = S.SentenceTransformer(str(model_dir), device="cpu")
    model.max_seq_length = 256
    args = S.SentenceTransformerTrainingArguments(
        output_dir=str(out), per_device_train_batch_size=32, num_train_epochs=1, learning_rate=5e-5,
        warmup_steps=0.1, logging_steps=10, save_strategy="no", report_to="none", seed=seed, use_cpu=True,
        disable_tqdm=True, batch_sampler=BatchSamplers.NO_DUPLICATES)
    trainer = S.SentenceTransformerTrainer(model=model, args=args, train_dataset=Dataset.from_list(train),
                                           loss=losses.MultipleNegativesRankingLoss(model))
    start = time.perf_counter()
    result = trainer.train()
    train_s = time.perf_counter() - start
    queries, corpus, relevant = ir_data
    evaluator = evaluation.InformationRetrievalEvaluator(queries, corpus, relevant, name="squad", batch_size=32)
    metrics = evaluator(model)
    paragraphs = list(corpus.values())
    model.encode(paragraphs[:32], batch_size=32)  # warm-up
    start = time.perf_counter()
    model.encode(paragraphs, batch_size=32)
    encode_s = time.perf_counter() - start
    return {"train_s": round(train_s, 2), "steps": int(result.global_step),
            "train_pairs_per_s": round(len(train) / train_s, 2), "train_loss": round(float(result.training_loss), 4),
            "encode_s": round(encode_s, 2), "encode_paragraphs_per_s": round(len(paragraphs) / encode_s, 2),
            **{k: round(float(metrics[f"squad_{k}"]), 4) for k in METRICS}}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=REPO / "models" / "minilm")
    parser.add_argument("--data", type=Path, default=DATA / "squad" / "dev-v1.1.json")
    parser.add_argument("--limit", type=int, default=2048, help="training pairs (default: about 10 minutes on 2 threads)")
    parser.add_argument("--held-out-articles", type=int, default=8)
    parser.add_argument("--eval-queries", type=int, default=1000)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args(argv)
    if not (args.model / "config.json").is_file():
        raise SystemExit(f"{args.model} holds no config.json: give --model a BERT directory (make model)")
    if (args.data / "squad" / "dev-v1.1.json").is_file():  # the shared data folder, as the other benches take it
        args.data = args.data / "squad" / "dev-v1.1.json"
    if not args.data.is_file():
        raise SystemExit(f"--data {args.data} is not a file: give SQuAD v1.1's dev-v1.1.json (or the data folder "
                         "holding squad/dev-v1.1.json)")
    torch.set_num_threads(args.threads)
    train, ir_data = squad(args.data, args.limit, args.held_out_articles, args.eval_queries)
    runs = {}
    with tempfile.TemporaryDirectory() as tmp:
        for lib in ("sentence_transformers", "bertkit"):
            torch.manual_seed(args.seed)
            runs[lib] = script(lib, args.model, Path(tmp) / lib, train, ir_data, args.seed)
    st, bk = runs["sentence_transformers"], runs["bertkit"]
    import sentence_transformers

    record = {"bench": "sentence_training", "model": args.model.name, "pairs": len(train), "batch": 32,
              "threads": args.threads, "corpus": len(ir_data[1]), "queries": len(ir_data[0]),
              "cpu_capability": torch.backends.cpu.get_cpu_capability(), "torch": torch.__version__,
              "sentence_transformers": sentence_transformers.__version__,
              "train_speedup": round(bk["train_pairs_per_s"] / st["train_pairs_per_s"], 3),
              "encode_speedup": round(bk["encode_paragraphs_per_s"] / st["encode_paragraphs_per_s"], 3),
              "sentence_transformers_run": st, "bertkit_run": bk}
    print(json.dumps(record))
    return record


if __name__ == "__main__":
    main()
