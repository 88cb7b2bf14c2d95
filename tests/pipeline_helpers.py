"""A tiny-config model of a transformers head class with random weights, saved with MiniLM's tokenizer files, so that
bertkit and transformers load the same weights (tests/test_pipelines.py, tests/test_tagging.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
import transformers

TOKENIZER_FILES = ("vocab.txt", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.json")
TINY = dict(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
            max_position_embeddings=512, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def tiny_dir(tmp_path_factory, minilm_dir: Path, hf_class: str, seed: int = 0, **config) -> tuple[Path, object]:
    """A tiny transformers model with random weights, saved with MiniLM's tokenizer files; (dir, model)."""
    torch.manual_seed(seed)
    cfg = transformers.BertConfig(**TINY, **config)
    model = getattr(transformers, hf_class)(cfg).eval()
    d = tmp_path_factory.mktemp(hf_class)
    model.save_pretrained(d)
    for name in TOKENIZER_FILES:
        if (minilm_dir / name).is_file():
            shutil.copy(minilm_dir / name, d / name)
    return d, model
