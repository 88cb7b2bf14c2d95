"""The text-classification guide's data and helpers, shared by tests/test_trainer.py and tests/test_cuda.py (no
datasets: the GPU machine's environment has none), and the trainer generators' CoNLL-2003 sentences."""

from __future__ import annotations

from pathlib import Path

import numpy as np

import bertkit


def conll_sentences(data_dir: Path) -> tuple[list[list[tuple[str, str]]], list[str]]:
    """CoNLL-2003's validation sentences as (word, tag) lists, and the tags sorted: the trainer generators' tagging
    data."""
    sentences, words = [], []
    for line in (data_dir / "conll2003/valid.txt").read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("-DOCSTART-"):
            words.append((line.split()[0], line.split()[-1]))
        elif words:
            sentences, words = sentences + [words], []
    return sentences, sorted({t for s in sentences for _, t in s})


WORDS = "the movie was great terrible boring fun a plot actors loved hated it really not very good bad".split()


def _sentences(n: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        w = rng.choice(WORDS, size=rng.integers(3, 14)).tolist()
        out.append({"text": " ".join(w), "label": int(("great" in w or "fun" in w) and "not" not in w)})
    return out


TRAIN, TEST = _sentences(37, 0), _sentences(13, 1)


def accuracy(eval_pred):
    predictions, labels = eval_pred
    return {"accuracy": float((predictions.argmax(-1) == labels).mean())}


def _losses(history: list[dict]) -> list[tuple[int, float, float]]:
    return [(h["step"], h["loss"], h["learning_rate"]) for h in history if "loss" in h]


def tiny_classifier(path: Path, tokenizer_dir: Path, head: str = "BertForSequenceClassification", **config) -> Path:
    """A tiny ``head`` model (transformers' class name) in the Hugging Face layout (seeded; by default 2 layers of 32,
    dropout off, 2 labels; ``config`` overrides any BertConfig field) with the tokenizer of ``tokenizer_dir``
    (MiniLM's WordPiece vocabulary, or ``minilm_2_layers``' 8,960 entries of it, which make the embeddings, Adam's
    moments and every checkpoint 3.4x smaller), saved by transformers at ``path``."""
    import torch
    import transformers

    tokenizer = transformers.BertTokenizerFast.from_pretrained(tokenizer_dir)
    torch.manual_seed(0)
    config = transformers.BertConfig(**{
        "vocab_size": len(tokenizer), "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
        "intermediate_size": 64, "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0, "num_labels": 2,
        **config})
    getattr(transformers, head)(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def sst2_dev(data_dir: Path) -> list[dict]:
    """SST-2's dev rows as ``{"text", "label"}`` dicts."""
    import csv

    with open(data_dir / "glue/SST-2/dev.tsv", encoding="utf-8-sig") as f:
        return [{"text": r[0], "label": int(r[1])} for r in list(csv.reader(f, delimiter="\t", quotechar=None))[1:]]


class Killed(BaseException):
    """A process killed mid-run: a BaseException, so no ``except Exception`` on the way handles it."""


class KillAt(bertkit.TrainerCallback):
    """Kill the run at the end of optimiser step ``step``."""

    def __init__(self, step: int):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            raise Killed
