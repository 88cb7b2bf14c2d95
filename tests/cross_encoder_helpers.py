"""What the cross-encoder tests share: a one-label MiniLM cross-encoder directory (the real encoder, a seeded
classifier, dropout off) and SQuAD reranking data: each question with the sentence of its paragraph that holds the
answer and the paragraph's other sentences."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch


def cross_encoder_directory(minilm: Path, out: Path, num_labels: int = 1, seed: int = 0) -> Path:
    """``out`` as a Hugging Face sequence-classification checkpoint of MiniLM with a seeded head, dropout 0."""
    from bertkit.heads import BertForSequenceClassification
    from bertkit.tokenization import BertTokenizer

    torch.manual_seed(seed)
    BertForSequenceClassification.from_pretrained(minilm, num_labels=num_labels, hidden_dropout_prob=0.0,
                                                  attention_probs_dropout_prob=0.0).save_pretrained(out)
    BertTokenizer.from_pretrained(minilm).save_pretrained(out)
    return out


def squad_rerank(data_dir: Path, article: int, questions: int) -> list[dict]:
    """Up to ``questions`` rows of ``{"query", "positive", "negatives"}`` from one SQuAD dev article: the sentence
    holding the first answer, and the paragraph's other sentences (at least two)."""
    path = data_dir / "squad" / "dev-v1.1.json"
    if not path.is_file():
        pytest.skip(f"{path} absent")
    rows = []
    for p in json.loads(path.read_text())["data"][article]["paragraphs"]:
        context = p["context"]
        spans = [(m.start(), m.end()) for m in re.finditer(r"[^.!?]+[.!?]+", context)]
        for q in p["qas"][:2]:
            at = q["answers"][0]["answer_start"]
            hit = next((s for s in spans if s[0] <= at < s[1]), None)
            others = [context[a:b].strip() for a, b in spans if (a, b) != hit]
            if hit is not None and len(others) >= 2:
                rows.append({"query": q["question"], "positive": context[hit[0]:hit[1]].strip(), "negatives": others})
            if len(rows) == questions:
                return rows
    return rows
