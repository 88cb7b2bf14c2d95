"""examples/splade/splade_squad.py's measuring parts on known inputs: the ranking metrics (ties counted against the
system), the FLOPS statistic, BM25 through bm25s, and the SQuAD split (each question's positive sentence holds its
answer, no held-back article leaks into training)."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[1] / "examples" / "splade" / "splade_squad.py"


@pytest.fixture(scope="module")
def example():
    spec = importlib.util.spec_from_file_location("splade_squad", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_ranking_metrics_on_known_ranks(example):
    # query 0: its document first; query 1: second; query 2: tied with two others at the top (rank 3, ties count
    # against the system); query 3: 12th of 12 (outside the top 10)
    scores = torch.tensor([[5.0, 1, 0] + [0] * 9,
                           [1.0, 2, 0] + [0] * 9,
                           [3.0, 3, 3] + [0] * 9,
                           [0.0] * 11 + [-1.0]])
    gold = torch.tensor([0, 0, 1, 11])
    m = example.ranking_metrics(scores, gold)
    ranks = [1, 2, 3, 12]
    assert m["ndcg@10"] == round(sum(1 / math.log2(r + 1) for r in ranks if r <= 10) / 4, 4)
    assert m["mrr@10"] == round((1 + 1 / 2 + 1 / 3) / 4, 4)
    assert m["recall@10"] == 0.75 and m["recall@100"] == 1.0


def test_flops_is_the_expected_number_of_shared_active_dimensions(example):
    q = torch.tensor([[1.0, 0, 2, 0], [0.0, 0, 1, 0]]).to_sparse()
    d = torch.tensor([[1.0, 1, 0, 0], [0.0, 0, 3, 1], [0.0, 0, 0, 1]]).to_sparse()
    s = example.sparsity(q, d)
    # P(active) per dimension: queries (1/2, 0, 1, 0), documents (1/3, 1/3, 1/3, 2/3)
    assert s["flops"] == round(0.5 / 3 + 1 / 3, 3)
    assert (s["query_active_dims"], s["document_active_dims"], s["vocabulary"]) == (1.5, round(5 / 3, 1), 4)


def test_bm25_ranks_the_matching_sentence_first(example):
    pytest.importorskip("bm25s")
    docs = ["The Denver Broncos won Super Bowl 50.", "Warsaw is the capital of Poland.", "Paris is in France."]
    scores = example.bm25_scores(["Which team won Super Bowl 50?", "What is the capital of Poland?"], docs)
    assert scores.shape == (2, 3)
    assert scores.argmax(1).tolist() == [0, 1]
    assert scores[0, 2] == 0 and scores[1, 2] == 0  # no shared word (stop words dropped)


def test_squad_split_keeps_articles_apart_and_positives_hold_answers(example, data_dir):
    path = data_dir / "squad" / "dev-v1.1.json"
    pairs, train_sentences, queries, corpus, relevant = example.squad_split(path, 8)
    articles = json.loads(path.read_text())["data"]
    held = articles[-8:]
    assert len(queries) == sum(len(p["qas"]) for a in held for p in a["paragraphs"])
    assert len(pairs) + len(queries) == sum(len(p["qas"]) for a in articles for p in a["paragraphs"])
    answers = {qa["id"]: qa["answers"][0]["text"] for a in held for p in a["paragraphs"] for qa in p["qas"]}
    holds = sum(answers[q] in corpus[next(iter(relevant[q]))] for q in queries) / len(queries)
    assert holds > 0.97  # an answer can cross a sentence boundary the splitter drew (its start decides)
    assert not set(train_sentences) & set(corpus.values()) - {""}
    assert all(len(relevant[q]) == 1 and next(iter(relevant[q])) in corpus for q in queries)
