"""Checkpoint directories as well-known BERT-family checkpoints are written on the Hugging Face Hub: their
config.json, tokenizer and sentence-transformers files with the published keys and values (sizes shrunk, weights
drawn at random by transformers), for tests that load them with bertkit and the references side by side."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch

# bert-base-uncased's config.json as transformers 4.6 wrote it (the shape keys are shrunk by ``checkpoint``)
BERT_BASE = {"architectures": ["BertForMaskedLM"], "attention_probs_dropout_prob": 0.1, "gradient_checkpointing": False,
             "hidden_act": "gelu", "hidden_dropout_prob": 0.1, "hidden_size": 768, "initializer_range": 0.02,
             "intermediate_size": 3072, "layer_norm_eps": 1e-12, "max_position_embeddings": 512, "model_type": "bert",
             "num_attention_heads": 12, "num_hidden_layers": 12, "pad_token_id": 0,
             "position_embedding_type": "absolute", "transformers_version": "4.6.0.dev0", "type_vocab_size": 2,
             "use_cache": True, "vocab_size": 30522}
# bert-base-chinese's and bert-base-multilingual-*'s leftovers of google-research/bert's configs
POOLER_KEYS = {"directionality": "bidi", "pooler_fc_size": 768, "pooler_num_attention_heads": 12,
               "pooler_num_fc_layers": 3, "pooler_size_per_head": 128, "pooler_type": "first_token_transform"}
# what transformers 2.x wrote into every config.json (generation settings, num_labels, output switches)
TRANSFORMERS_2X = {"bos_token_id": None, "do_sample": False, "eos_token_ids": None, "finetuning_task": None,
                   "is_decoder": False, "length_penalty": 1.0, "max_length": 20, "num_beams": 1, "num_labels": 2,
                   "num_return_sequences": 1, "output_attentions": False, "output_hidden_states": False,
                   "output_past": True, "pruned_heads": {}, "repetition_penalty": 1.0, "temperature": 1.0,
                   "top_k": 50, "top_p": 1.0, "torchscript": False, "use_bfloat16": False}
SPECIAL_TOKENS_MAP = {"unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]", "cls_token": "[CLS]",
                      "mask_token": "[MASK]"}
NER_LABELS = {"0": "O", "1": "B-MISC", "2": "I-MISC", "3": "B-PER", "4": "I-PER", "5": "B-ORG", "6": "I-ORG",
              "7": "B-LOC", "8": "I-LOC"}
SHAPE_KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")


def cased_vocab(uncased: list[str]) -> list[str]:
    """A cased vocabulary in the original's spirit: MiniLM's, plus capitalised words and accented pieces."""
    words = [w for w in uncased[1000:4000] if w.isalpha()]
    extra = [w.capitalize() for w in words] + ["é", "É", "ü", "Ü", "café", "Café", "Zürich", "##é", "##ü", "ç"]
    seen = set(uncased)
    return uncased + [w for w in dict.fromkeys(extra) if w not in seen]


def chinese_vocab() -> list[str]:
    """bert-base-chinese's layout: specials and [unused] first, ASCII, then one entry per CJK character (and ##)."""
    vocab = ["[PAD]"] + [f"[unused{i}]" for i in range(99)] + ["[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    vocab += list("!\"#$%&'()*+,-./0123456789:;<=>?@[\\]^_`abcdefghijklmnopqrstuvwxyz{|}~")
    vocab += [chr(c) for c in range(0x4E00, 0x4E00 + 800)] + list("，。！？、；：“”（）《》")
    return vocab + ["##" + chr(c) for c in range(0x4E00, 0x4E00 + 100)] + ["the", "bert", "##s", "hello", "world"]


def write_json(path: Path, obj: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2), encoding="utf-8")


def checkpoint(directory: Path, config: dict[str, Any], vocab: list[str], *, tokenizer_config: dict | None,
               shape: dict[str, int], special_tokens_map: dict | None = None, tokenizer_json: bool = False,
               pickle: bool = False, seed: int = 0) -> Path:
    """``directory`` holding ``config`` (its shape keys replaced by ``shape``, vocab_size by the vocabulary's), the
    weights transformers draws for its first architecture, vocab.txt and the tokenizer files given."""
    import transformers

    directory.mkdir(parents=True, exist_ok=True)
    config = {**config, **shape, "vocab_size": len(vocab)}
    if "pooler_fc_size" in config:
        config["pooler_fc_size"] = shape["hidden_size"]
    write_json(directory / "config.json", config)
    torch.manual_seed(seed)
    loadable = {k: v for k, v in config.items() if k not in ("architectures", "pruned_heads")}
    model = getattr(transformers, (config.get("architectures") or ["BertModel"])[0])(
        transformers.BertConfig.from_dict({**loadable, "model_type": "bert"}))
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.2)
    staged = directory / "_weights"
    model.save_pretrained(staged, safe_serialization=not pickle)
    for f in staged.iterdir():
        if f.name != "config.json":
            shutil.move(str(f), directory / f.name)
    shutil.rmtree(staged)  # its config.json: transformers's rewrite, not the published one
    (directory / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    if tokenizer_config is not None:
        write_json(directory / "tokenizer_config.json", tokenizer_config)
    if special_tokens_map is not None:
        write_json(directory / "special_tokens_map.json", special_tokens_map)
    if tokenizer_json:
        from tokenizers import BertWordPieceTokenizer

        settings = tokenizer_config or {}
        BertWordPieceTokenizer(str(directory / "vocab.txt"), lowercase=settings.get("do_lower_case", True),
                               strip_accents=settings.get("strip_accents"),
                               handle_chinese_chars=settings.get("tokenize_chinese_chars", True),
                               ).save(str(directory / "tokenizer.json"))
    return directory


def modules(*kinds: str) -> list[dict[str, Any]]:
    """modules.json as sentence-transformers writes it, for "Transformer", "Pooling", "Dense", "Normalize",
    "MLMTransformer" and "SpladePooling" in that order."""
    where = {"Transformer": ("", "models"), "Pooling": ("1_Pooling", "models"), "Dense": ("2_Dense", "models"),
             "Normalize": (None, "models"), "MLMTransformer": ("", "sparse_encoder.models"),
             "SpladePooling": ("1_SpladePooling", "sparse_encoder.models")}
    out = []
    for i, kind in enumerate(kinds):
        path, package = where[kind]
        out.append({"idx": i, "name": str(i), "path": f"{i}_Normalize" if path is None else path,
                    "type": f"sentence_transformers.{package}.{kind}"})
    return out


def pooling_config(mode: str, width: int, newer: bool) -> dict[str, Any]:
    """1_Pooling/config.json: sentence-transformers 2.0's four keys, or 2.3's six and include_prompt."""
    config = {"word_embedding_dimension": width, "pooling_mode_cls_token": mode == "cls",
              "pooling_mode_mean_tokens": mode == "mean", "pooling_mode_max_tokens": mode == "max",
              "pooling_mode_mean_sqrt_len_tokens": mode == "mean_sqrt_len"}
    if newer:
        config.update(pooling_mode_weightedmean_tokens=mode == "weightedmean", pooling_mode_lasttoken=mode == "lasttoken",
                      include_prompt=True)
    return config


def non_bert(directory: Path, kind: str, head: str) -> Path:
    """A tiny checkpoint of another architecture, as transformers saves it, with that model's tokenizer files: a
    DistilBERT (vocab.txt, as BERT's), a RoBERTa (vocab.json and merges.txt) or an XLM-R (no vocabulary file
    bertkit reads)."""
    import transformers

    shape = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=37)
    config = {"distilbert": transformers.DistilBertConfig(dim=32, n_layers=2, n_heads=2, hidden_dim=37),
              "roberta": transformers.RobertaConfig(vocab_size=100, **shape),
              "xlm-roberta": transformers.XLMRobertaConfig(vocab_size=100, **shape)}[kind]
    prefix = {"distilbert": "DistilBert", "roberta": "Roberta", "xlm-roberta": "XLMRoberta"}[kind]
    torch.manual_seed(0)
    getattr(transformers, prefix + head)(config).save_pretrained(directory)
    if kind == "distilbert":
        (directory / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a"]) + "\n")
    elif kind == "roberta":
        write_json(directory / "vocab.json", {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3, "a": 4})
        (directory / "merges.txt").write_text("#version: 0.2\n")
    write_json(directory / "tokenizer_config.json", {"tokenizer_class": prefix + "Tokenizer", "model_max_length": 512,
                                                     "do_lower_case": True})
    return directory
