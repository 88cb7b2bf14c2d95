"""Seconds per training checkpoint: bertkit.Trainer against transformers' Trainer on one tiny model.

A 2-layer, 32-wide BertForSequenceClassification with ``--model``'s WordPiece vocabulary (MiniLM's 30,522 words:
the embedding matrix and the tokenizer files are most of what a checkpoint holds) is saved once with a seed; each
library's Trainer then trains 16 steps on the CPU, saving a checkpoint after every step (``save_total_limit=3``, so
rotation is timed too), with the tokenizer as ``processing_class``. The time of each checkpoint write
(``save_checkpoint`` in bertkit's loop, ``Trainer._save_checkpoint`` in transformers') is recorded. bertkit writes
more than transformers: every file fsynced, the directory staged and renamed into place with a manifest of its
files' sha256, rotation removing only the files a manifest proves bertkit's.

    python bench/bench_checkpoint_write.py --model models/minilm

Prints one JSON line: the median and minimum seconds per checkpoint of each library, and their ratio.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

TEXTS = ["a gripping, funny film", "dull and far too long", "the cast is wonderful", "i want my two hours back"]


def tiny_classifier(path: Path, vocab_dir: Path) -> Path:
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=64, num_labels=2)
    transformers.BertForSequenceClassification(config).save_pretrained(path)
    transformers.BertTokenizerFast.from_pretrained(vocab_dir).save_pretrained(path)
    return path


def seconds_per_checkpoint(lib_name: str, checkpoint: Path, out: Path, steps: int) -> list[float]:
    """Train ``steps`` steps with ``lib_name``'s Trainer, a checkpoint after each; the seconds of each write."""
    import importlib

    lib = importlib.import_module(lib_name)
    times: list[float] = []

    def timed(write):
        def wrapper(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return write(*args, **kwargs)
            finally:
                times.append(time.perf_counter() - t0)
        return wrapper

    if lib_name == "bertkit":
        from bertkit.training import loop
        loop.save_checkpoint = timed(loop.save_checkpoint)
    else:
        lib.Trainer._save_checkpoint = timed(lib.Trainer._save_checkpoint)
    tokenizer = lib.AutoTokenizer.from_pretrained(checkpoint)
    model = lib.AutoModelForSequenceClassification.from_pretrained(checkpoint)
    rows = [{**tokenizer(TEXTS[i % 4], truncation=True), "label": i % 2} for i in range(4 * steps)]
    args = lib.TrainingArguments(output_dir=str(out), per_device_train_batch_size=4, max_steps=steps, save_steps=1,
                                 save_total_limit=3, logging_steps=1, report_to="none", use_cpu=True, seed=3,
                                 disable_tqdm=True)
    lib.Trainer(model=model, args=args, train_dataset=rows, processing_class=tokenizer,
                data_collator=lib.DataCollatorWithPadding(tokenizer)).train()
    assert len(times) == steps, times
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True, help="a directory with a WordPiece vocabulary")
    parser.add_argument("--steps", type=int, default=16)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-checkpoint-") as tmp:
        checkpoint = tiny_classifier(Path(tmp) / "tiny", args.model)
        result = {}
        for lib in ("bertkit", "transformers"):
            # transformers' Trainer prints its log records to stdout: stdout keeps the one JSON line
            with contextlib.redirect_stdout(sys.stderr):
                times = seconds_per_checkpoint(lib, checkpoint, Path(tmp) / lib, args.steps)
            result[lib] = {"median_s": round(statistics.median(times), 4), "min_s": round(min(times), 4)}
        result["ratio_median"] = round(result["bertkit"]["median_s"] / result["transformers"]["median_s"], 2)
    print(json.dumps({"checkpoints": args.steps, **result}))


if __name__ == "__main__":
    main()
