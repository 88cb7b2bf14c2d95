"""The masked-LM checkpoint the sparse-encoder tests start from: MiniLM's encoder with a masked-LM head drawn by
transformers (seed 0), its bias set to -3.5 so that a text activates some hundreds of the 30,522 word pieces (as
a trained SPLADE model's few); ``dropout`` rewrites config.json's dropout probabilities (0.0 for training runs
that must agree step by step)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

TOKENIZER_FILES = ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def masked_lm_checkpoint(minilm: Path, out: Path, dropout: float | None = None) -> Path:
    import transformers

    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    mlm = transformers.BertForMaskedLM.from_pretrained(str(minilm))
    with torch.no_grad():
        mlm.cls.predictions.bias.fill_(-3.5)
    mlm.save_pretrained(out)
    for name in TOKENIZER_FILES:
        shutil.copy(minilm / name, out / name)
    if dropout is not None:
        config = json.loads((out / "config.json").read_text())
        config.update(hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)
        (out / "config.json").write_text(json.dumps(config))
    return out
