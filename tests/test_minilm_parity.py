"""The real checkpoint (MiniLM-L6-H384, uncased) gives transformers' outputs on real text."""

from __future__ import annotations

import csv

import pytest
import torch

from bertkit import BertModel, BertTokenizer

transformers = pytest.importorskip("transformers")


def _real_texts(data_dir):
    """64 SST-2 dev sentences and 32 RTE dev pairs (long premises: real padding in every batch)."""
    with open(data_dir / "glue/SST-2/dev.tsv", encoding="utf-8") as f:
        singles = [row["sentence"] for row in csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)][:64]
    with open(data_dir / "glue/RTE/dev.tsv", encoding="utf-8") as f:
        pairs = [(r["sentence1"], r["sentence2"]) for r in csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)][:32]
    return singles, pairs


@pytest.fixture(scope="module")
def models(minilm_dir):
    ours = BertModel.from_pretrained(minilm_dir).eval()
    theirs = transformers.BertModel.from_pretrained(minilm_dir).eval()
    return ours, theirs, BertTokenizer.from_pretrained(minilm_dir)


def test_minilm_matches_transformers_on_real_text(models, data_dir):
    ours, theirs, tok = models
    singles, pairs = _real_texts(data_dir)
    batches = [(singles[i:i + 32], None) for i in range(0, len(singles), 32)]
    batches += [([a for a, _ in pairs[i:i + 16]], [b for _, b in pairs[i:i + 16]]) for i in range(0, len(pairs), 16)]
    worst = 0.0
    n = 0
    for texts, text_pair in batches:
        enc = tok(texts, text_pair=text_pair, max_length=256, truncation=True, padding=True, return_tensors="pt")
        assert bool((enc["attention_mask"] == 0).any()), "every batch should contain padding"
        with torch.no_grad():
            a = ours(input_ids=enc["input_ids"], token_type_ids=enc["token_type_ids"], attention_mask=enc["attention_mask"])
            b = theirs(input_ids=enc["input_ids"], token_type_ids=enc["token_type_ids"], attention_mask=enc["attention_mask"])
        real = enc["attention_mask"].bool()
        # Padding positions' states are meaningless in both implementations; compare real tokens.
        torch.testing.assert_close(a.last_hidden_state[real], b.last_hidden_state[real], atol=1e-5, rtol=0)
        torch.testing.assert_close(a.pooler_output, b.pooler_output, atol=1e-5, rtol=0)
        worst = max(worst, (a.last_hidden_state[real] - b.last_hidden_state[real]).abs().max().item())
        n += len(texts)
    assert n == 96
    print(f"max abs diff over {n} real sentences/pairs: {worst:.2e}")


def test_minilm_round_trips_through_save(models, tmp_path):
    ours, _, tok = models
    ours.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    again = BertModel.from_pretrained(tmp_path).eval()
    enc = tok(["a real sentence about the weather"], return_tensors="pt")
    with torch.no_grad():
        torch.testing.assert_close(again(**enc).last_hidden_state, ours(**enc).last_hidden_state, atol=0, rtol=0)
    theirs = transformers.BertModel.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        torch.testing.assert_close(theirs(**enc).last_hidden_state, ours(**enc).last_hidden_state, atol=1e-5, rtol=0)
