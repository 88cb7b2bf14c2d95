"""SPLADE distilled from a teacher's margins, beside examples/splade's ranking-loss recipe (docs/sentence.md,
"Settings tried"): no cross-encoder of the domain exists offline, so the teacher is the hybrid of the two
retrievers the data has, MiniLM's cosine + 0.05 x BM25 (the weight chosen on 2,000 training questions). Each
mined triplet gets the teacher's margin sim(q, pos) - sim(q, neg), times ``--scale`` (the trained SPLADE's margins
average 12.4 where the teacher's average 0.52), as its label.

    python experiments/splade_distill.py --mode both|margin --out runs/sp-distill-both \
        --triplets runs/splade/mined.jsonl --model runs/pretrain-1h/model/final

``both``: the ranking loss + ``--weight`` x SparseMarginMSELoss; ``margin``: SparseMarginMSELoss alone. Otherwise
the example's defaults (4 epochs, rate 5e-4, batch 64, max_seq_length 128, FLOPS 5e-5 / 3e-5, 256 active at start).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "examples" / "splade"))
import splade_squad as E  # noqa: E402

from bertkit.sentence.losses.base import SentenceLoss  # noqa: E402
from bertkit.sentence.sparse_encoder import losses as SL  # noqa: E402

HYBRID_BM25_WEIGHT = 0.05


class RankingPlusMargin(SentenceLoss):
    """SparseMultipleNegativesRankingLoss + weight x SparseMarginMSELoss on (query, positive, negative, margin)."""

    columns, needs_label, in_batch_negatives = (3, 3), True, True

    def __init__(self, model, weight: float):
        super().__init__(model)
        self.ranking, self.margin, self.weight = SL.SparseMultipleNegativesRankingLoss(model), SL.SparseMarginMSELoss(model), weight

    def compute_loss_from_embeddings(self, embeddings, labels):
        return (self.ranking.compute_loss_from_embeddings(embeddings)
                + self.weight * self.margin.compute_loss_from_embeddings(embeddings, labels))


def teacher_margins(triplets: list[dict], sentences: list[str], miner: Path) -> torch.Tensor:
    import bm25s

    from bertkit.sentence import SentenceTransformer

    retriever = bm25s.BM25(k1=1.5, b=0.75, method="lucene")
    retriever.index(bm25s.tokenize(sentences, lower=True, stopwords="en", show_progress=False), show_progress=False)
    where, vocab = {s: i for i, s in enumerate(sentences)}, retriever.vocab_dict
    queries = bm25s.tokenize([t["query"] for t in triplets], lower=True, stopwords="en", show_progress=False,
                             return_ids=False)
    bm25 = []
    for t, q in zip(triplets, queries):
        s = retriever.get_scores([w for w in q if w in vocab])
        bm25.append(float(s[where[t["positive"]]]) - float(s[where[t["negative"]]]))
    model = SentenceTransformer(str(miner))

    def embed(column: str) -> torch.Tensor:
        return model.encode([t[column] for t in triplets], batch_size=64, convert_to_tensor=True,
                            normalize_embeddings=True)

    q, p, n = embed("query"), embed("positive"), embed("negative")
    return (q * p).sum(1) - (q * n).sum(1) + HYBRID_BM25_WEIGHT * torch.tensor(bm25)


def main() -> None:
    a = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    a.add_argument("--mode", choices=("both", "margin"), required=True)
    a.add_argument("--weight", type=float, default=0.02, help="the margin loss's weight beside the ranking loss")
    a.add_argument("--scale", type=float, default=24.0)
    a.add_argument("--out", type=Path, required=True)
    a.add_argument("--triplets", type=Path, default=REPO / "runs" / "splade" / "mined.jsonl")
    a.add_argument("--model", type=Path, default=REPO / "runs" / "pretrain-1h" / "model" / "final")
    a.add_argument("--miner", type=Path, default=REPO / "models" / "minilm")
    a.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data")
    args = a.parse_args()
    import datasets

    import bertkit.sentence as S

    squad = args.data / "squad" / "dev-v1.1.json"
    _, sentences, queries, corpus, relevant = E.squad_split(squad, 8)
    triplets = [json.loads(line) for line in args.triplets.read_text(encoding="utf-8").splitlines()]
    margins = args.scale * teacher_margins(triplets, sentences, args.miner)
    rows = [{**t, "label": float(m)} for t, m in zip(triplets, margins)]
    torch.manual_seed(42)
    final = args.out / "splade"
    if not (final / "modules.json").is_file():
        model = S.SparseEncoder(str(args.model))
        model.max_seq_length = 128
        E.start_sparse(model, [t["positive"] for t in rows[:128]], 256)
        inner = RankingPlusMargin(model, args.weight) if args.mode == "both" else SL.SparseMarginMSELoss(model)
        loss = SL.SpladeLoss(model, loss=inner, query_regularizer_weight=5e-5, document_regularizer_weight=3e-5)
        settings = S.SparseEncoderTrainingArguments(
            output_dir=str(args.out / "run"), num_train_epochs=4, per_device_train_batch_size=64, learning_rate=5e-4,
            warmup_ratio=0.1, save_strategy="no", logging_steps=50, report_to="none", seed=42, use_cpu=True,
            batch_sampler="no_duplicates")
        S.SparseEncoderTrainer(model=model, args=settings, train_dataset=datasets.Dataset.from_list(rows),
                               loss=loss).train()
        model.save(str(final))
    results = E.evaluate({"SPLADE": final}, queries, corpus, relevant)
    results["settings"] = {k: str(v) for k, v in vars(args).items()}
    (args.out / "results.json").write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
