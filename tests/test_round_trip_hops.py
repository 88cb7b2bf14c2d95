"""A saved model carried between bertkit, transformers and sentence-transformers, each loading the directory the
previous one saved and saving it again: nothing the directory held is lost, left stale or changed.

The first tests are the cases the generator at the end found; the generator (slow) draws chains of such hops."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import bertkit
from bertkit.sentence import SentenceTransformer

transformers = pytest.importorskip("transformers")

TINY = dict(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
            max_position_embeddings=64)
TEXTS = ["A man is eating food.", "Ünïcödé accents and CJK 漢字 too", "hi"]


def _sharded(minilm_dir: Path, out: Path, head: str = "BertForSequenceClassification") -> Path:
    """A tiny checkpoint transformers saved in 1 MB shards (four of them), with MiniLM's tokenizer."""
    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    getattr(transformers, head)(transformers.BertConfig(**TINY)).save_pretrained(out, max_shard_size="1MB")
    transformers.AutoTokenizer.from_pretrained(str(minilm_dir)).save_pretrained(out)
    assert len(list(out.glob("model-0000*-of-0000*.safetensors"))) > 1
    return out


def test_a_save_over_a_sharded_checkpoint_replaces_its_shards(minilm_dir, tmp_path):
    """Loaded, changed and saved in place, a sharded checkpoint is one model.safetensors: the index and the shards it
    lists go (they were left beside it: a stale copy of the old weights, which a loader reading the index first would
    take), a user's file stays, and both libraries load the new weights."""
    d = _sharded(minilm_dir, tmp_path / "ckpt")
    (d / "notes.txt").write_text("mine")
    model = bertkit.BertForSequenceClassification.from_pretrained(d)
    with torch.no_grad():
        model.classifier.weight.add_(1.0)
    model.save_pretrained(d)
    assert sorted(p.name for p in d.iterdir()) == ["config.json", "model.safetensors", "notes.txt", "tokenizer.json",
                                                   "tokenizer_config.json"]
    ids = torch.tensor([[101, 7592, 2088, 102]])
    with torch.no_grad():
        want = model(ids).logits
        torch.testing.assert_close(bertkit.BertForSequenceClassification.from_pretrained(d)(ids).logits, want)
        theirs = transformers.BertForSequenceClassification.from_pretrained(d).eval()
        torch.testing.assert_close(theirs(ids).logits, want, atol=1e-5, rtol=1e-5)


def test_a_sentence_save_over_a_sharded_checkpoint_replaces_its_shards(minilm_dir, tmp_path):
    """The same through SentenceTransformer.save, whose encoder is written inside its staged directory: no shard of
    the old weights is left, and sentence-transformers reads the vectors bertkit gives."""
    st = pytest.importorskip("sentence_transformers")
    d = _sharded(minilm_dir, tmp_path / "ckpt", head="BertModel")
    index = json.loads((d / "model.safetensors.index.json").read_text())
    model = SentenceTransformer(d)
    with torch.no_grad():
        model.bert.embeddings.word_embeddings.weight.mul_(1.5)
    model.save(d)
    names = {p.name for p in d.iterdir()}
    assert "model.safetensors" in names
    assert not names & ({"model.safetensors.index.json"} | set(index["weight_map"].values()))
    np.testing.assert_allclose(st.SentenceTransformer(str(d), device="cpu").encode(TEXTS), model.encode(TEXTS),
                               atol=2e-5)


def test_an_index_that_lists_other_files_keeps_them(minilm_dir, tmp_path):
    """An index whose shards are not plain names beside it proves nothing: it and every file stay."""
    d = _sharded(minilm_dir, tmp_path / "ckpt")
    index = d / "model.safetensors.index.json"
    data = json.loads(index.read_text())
    data["weight_map"]["extra.weight"] = "../elsewhere.safetensors"
    index.write_text(json.dumps(data))
    before = sorted(p.name for p in d.iterdir())
    # bertkit's loader refuses such an index; the save writes a model read from elsewhere
    torch.manual_seed(0)
    bertkit.BertForSequenceClassification(bertkit.BertConfig(**TINY)).save_pretrained(d)
    assert sorted(p.name for p in d.iterdir()) == sorted(before + ["model.safetensors"])
