"""SPLADE ``encode`` on the CPU: bertkit's ``SparseEncoder`` beside sentence-transformers' on the same weights and
texts, at each thread count.

Model: MiniLM's encoder (models/minilm) with a masked-LM head drawn by transformers (seed 0, the head's bias set to
-3.5 so a text activates some hundreds of the 30,522 word pieces), saved by sentence-transformers as a SPLADE
directory (fill-mask Transformer + SpladePooling max/relu) that both libraries load. Texts: SQuAD dev's first
``--paragraphs`` paragraphs and ``--questions`` questions (documents and queries of a retrieval index), encoded with
``encode_document`` in batches of 32 (both libraries sort by length). Rounds alternate the two libraries; the median
of ``--rounds`` is reported, with the worst vector disagreement (indices must be identical).

Training (``--train-steps``, 0 to skip): the same script with each library's import, SpladeLoss over
SparseMultipleNegativesRankingLoss on (question, paragraph) pairs of SQuAD dev, batches of ``--train-batch``,
``max_seq_length`` 128, dropout as the checkpoint has it (0.1), bf16 off; the seconds of each optimiser step after the
first (forward, backward, AdamW) are timed by a callback, and their median is reported per library, with the spread
(slowest minus fastest step) over the steps of all rounds.

    python bench/bench_sparse.py --threads 1,2 --rounds 3

Prints one JSON line.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
TOKENIZER_FILES = ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def splade_directory(minilm: Path, out: Path) -> Path:
    import transformers
    from sentence_transformers import SparseEncoder

    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    mlm = transformers.BertForMaskedLM.from_pretrained(str(minilm))
    with torch.no_grad():
        mlm.cls.predictions.bias.fill_(-3.5)
    mlm.save_pretrained(out / "checkpoint")
    for name in TOKENIZER_FILES:
        shutil.copy(minilm / name, out / "checkpoint" / name)
    SparseEncoder(str(out / "checkpoint"), device="cpu").save(str(out / "splade"))
    return out / "splade"


def train_step_seconds(lib: str, checkpoint: Path, pairs: list[dict], steps: int, batch: int) -> list[float]:
    """Each optimiser step's seconds after the first, training with ``lib``'s import."""
    import datasets

    if lib == "sentence-transformers":
        import sentence_transformers as S
        from sentence_transformers.sparse_encoder import losses
        from transformers import TrainerCallback
    else:
        import bertkit.sentence as S
        from bertkit.sentence.sparse_encoder import losses
        from bertkit.training.callbacks import TrainerCallback
    times: list[float] = []

    class Timer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            self.start = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            times.append(time.perf_counter() - self.start)

    model = S.SparseEncoder(str(checkpoint), device="cpu")
    model.max_seq_length = 128
    loss = losses.SpladeLoss(model, loss=losses.SparseMultipleNegativesRankingLoss(model),
                             document_regularizer_weight=3e-5, query_regularizer_weight=5e-5)
    with tempfile.TemporaryDirectory() as out:
        args = S.SparseEncoderTrainingArguments(
            output_dir=out, per_device_train_batch_size=batch, max_steps=steps + 1, learning_rate=2e-5,
            save_strategy="no", report_to="none", seed=42, use_cpu=True, disable_tqdm=True, logging_steps=steps + 1)
        trainer = S.SparseEncoderTrainer(model=model, args=args, train_dataset=datasets.Dataset.from_list(pairs),
                                         loss=loss, callbacks=[Timer()])
        with contextlib.redirect_stdout(sys.stderr):  # the Trainer prints its log records: stdout keeps one JSON line
            trainer.train()
    return times[1:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=REPO / "models" / "minilm")
    parser.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data")
    parser.add_argument("--paragraphs", type=int, default=64)
    parser.add_argument("--questions", type=int, default=256)
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--train-steps", type=int, default=4)
    parser.add_argument("--train-batch", type=int, default=16)
    parser.add_argument("--skip-encode", action="store_true")
    args = parser.parse_args()

    from sentence_transformers import SparseEncoder as Reference

    from bertkit.sentence import SparseEncoder

    articles = json.loads((args.data / "squad" / "dev-v1.1.json").read_text())["data"]
    paragraphs = [p["context"] for a in articles for p in a["paragraphs"]][:args.paragraphs]
    questions = [q["question"] for a in articles for p in a["paragraphs"] for q in p["qas"]][:args.questions]
    texts = paragraphs + questions
    with tempfile.TemporaryDirectory() as tmp:
        directory = splade_directory(args.model, Path(tmp))
        engines = {"sentence-transformers": Reference(str(directory), device="cpu"),
                   "bertkit": SparseEncoder(directory)}
        result = {"bench": "sparse_encode", "texts": len(texts), "paragraphs": len(paragraphs),
                  "questions": len(questions), "cpu_capability": torch.backends.cpu.get_cpu_capability()}
        pairs = [{"question": q["question"], "paragraph": p["context"]}
                 for a in articles for p in a["paragraphs"] for q in p["qas"][:1]][:args.train_batch * (args.train_steps + 1)]
        for threads in [int(t) for t in args.threads.split(",")]:
            torch.set_num_threads(threads)
            if args.train_steps:
                steps: dict[str, list[float]] = {name: [] for name in engines}
                for _ in range(args.rounds):
                    for name in engines:
                        steps[name] += train_step_seconds(name, directory, pairs, args.train_steps, args.train_batch)
                median = {name: statistics.median(s) for name, s in steps.items()}
                result[f"train_threads_{threads}"] = {
                    "batch": args.train_batch, "steps_timed": len(steps["bertkit"]),
                    **{f"{name}_step_s": round(median[name], 3) for name in engines},
                    **{f"{name}_spread_s": round(max(s) - min(s), 3) for name, s in steps.items()},
                    "speedup": round(median["sentence-transformers"] / median["bertkit"], 2)}
            if args.skip_encode:
                continue
            seconds: dict[str, list[float]] = {name: [] for name in engines}
            vectors = {}
            for _ in range(args.rounds):
                for name, model in engines.items():
                    start = time.perf_counter()
                    vectors[name] = model.encode_document(texts, batch_size=32).coalesce()
                    seconds[name].append(time.perf_counter() - start)
            want, got = vectors["sentence-transformers"], vectors["bertkit"]
            median = {name: statistics.median(s) for name, s in seconds.items()}
            result[f"threads_{threads}"] = {
                **{f"{name}_s": round(median[name], 3) for name in engines},
                **{f"{name}_spread_s": round(max(s) - min(s), 3) for name, s in seconds.items()},
                "speedup": round(median["sentence-transformers"] / median["bertkit"], 2),
                "same_indices": bool(torch.equal(want.indices(), got.indices())),
                "max_abs_diff": float((want.values() - got.values()).abs().max())
                if torch.equal(want.indices(), got.indices()) else None,
                "active_dims": round(SparseEncoder.sparsity(got)["active_dims"], 1)}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
