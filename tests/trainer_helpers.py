"""The text-classification guide's data and helpers, shared by tests/test_trainer.py and tests/test_cuda.py (numpy
only: the GPU machine's environment has no datasets)."""

from __future__ import annotations

import numpy as np

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
