"""What a tokenizer directory holds -> BertTokenizer's constructor arguments.

Two layouts are read:

- ``vocab.txt`` + ``tokenizer_config.json`` (+ ``special_tokens_map.json``, ``added_tokens.json``): every
  published BERT checkpoint, and what ``BertTokenizer.save_pretrained`` writes;
- ``tokenizer.json`` + ``tokenizer_config.json`` without ``vocab.txt``: what transformers 5 saves. The
  vocabulary, ``[UNK]``, the ``##`` prefix and the word-length limit come from its WordPiece ``model``, the
  casing from its ``BertNormalizer``, tokens added after training from its ``added_tokens``. A model that
  is not WordPiece (BPE: RoBERTa, GPT-2; Unigram: ALBERT, T5) is refused with its name.

Where tokenizer_config.json and tokenizer.json both give a setting and disagree, loading stops and names
both values (transformers 5 would take tokenizer_config.json's without a word); a keyword argument to
``from_pretrained`` settles it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bertkit.errors import BertkitError, read_json_object

__all__ = ["read_json", "read_settings", "read_tokenizer_json", "merge_tokenizer_json", "check_fits_model"]

CONFIG_FILE = "tokenizer_config.json"
SPECIAL_TOKENS_MAP_FILE = "special_tokens_map.json"
ADDED_TOKENS_FILE = "added_tokens.json"
TOKENIZER_FILE = "tokenizer.json"
SPECIAL_TOKEN_KEYS = ("unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
_DEFAULT_SPECIAL = {"unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]", "cls_token": "[CLS]",
                    "mask_token": "[MASK]"}
# What the other tokenizer.json model types usually belong to, for the error message.
_MODEL_FAMILIES = {"BPE": "RoBERTa, GPT-2, BART, ...", "Unigram": "ALBERT, T5, XLNet, ...",
                   "WordLevel": "a whole-word vocabulary"}


def read_json(file: Path) -> dict[str, Any]:
    """The JSON object in a tokenizer file, or {} when there is no such file."""
    return read_json_object(file, "re-save the tokenizer (save_pretrained) or fix the file") if file.is_file() else {}


def read_settings(path: Path) -> dict[str, Any]:
    """Constructor arguments from tokenizer_config.json and special_tokens_map.json (either may be absent)."""
    settings: dict[str, Any] = {}
    config_file = path / CONFIG_FILE
    config = read_json(config_file)
    if config.get("do_basic_tokenize", True) is False:
        raise BertkitError(
            f"{config_file} sets do_basic_tokenize=false, which bertkit does not support "
            f"(WordPiece straight on whitespace-split text); remove the key to use BERT's basic tokenizer"
        )
    for key in ("padding_side", "truncation_side"):
        if config.get(key, "right") != "right":
            raise BertkitError(f"{config_file} sets {key}={config[key]!r}; bertkit pads and truncates on the "
                               f"right only (BERT's layout): remove the key or set it to \"right\"")
    kinds = {"do_lower_case": (bool,), "tokenize_chinese_chars": (bool,), "strip_accents": (bool, type(None)),
             "model_max_length": (int, float), "max_input_chars_per_word": (int,),
             "clean_up_tokenization_spaces": (bool,)}
    for key, types in kinds.items():
        if key in config:
            settings[key] = _typed(config[key], types, f"{config_file}: {key}")
    for key in (*SPECIAL_TOKEN_KEYS, "additional_special_tokens"):
        if config.get(key) is not None:
            settings[key] = config[key]
    extra = config.get("extra_special_tokens")  # transformers 5's name for additional_special_tokens
    if extra and "additional_special_tokens" not in settings:
        settings["additional_special_tokens"] = list(extra.values() if isinstance(extra, dict) else extra)
    # Hugging Face lets special_tokens_map.json override the config's special tokens
    settings.update({k: v for k, v in read_json(path / SPECIAL_TOKENS_MAP_FILE).items()
                     if k in (*SPECIAL_TOKEN_KEYS, "additional_special_tokens")})
    for key in SPECIAL_TOKEN_KEYS:
        if key in settings:
            settings[key] = token_content(settings[key], key)
    if "additional_special_tokens" in settings:
        settings["additional_special_tokens"] = [
            token_content(t, "additional_special_tokens") for t in settings["additional_special_tokens"]
        ]
    if isinstance(settings.get("model_max_length"), float):  # HF writes 1e30 for "no limit"
        settings["model_max_length"] = int(settings["model_max_length"])
    added = read_json(path / ADDED_TOKENS_FILE)  # bertkit writes them into vocab.txt as well, at the same ids
    if added:
        settings["added_tokens"] = [t for t, _ in sorted(added.items(), key=lambda kv: kv[1])]
    return settings


def _typed(value: Any, types: tuple[type, ...], where: str) -> Any:
    if not isinstance(value, types) or (bool not in types and isinstance(value, bool)):
        want = " or ".join("null" if t is type(None) else t.__name__ for t in types)
        hint = " (a string: write true/false without quotes)" if isinstance(value, str) else ""
        raise BertkitError(f"{where} must be {want}, got {value!r}{hint}")
    return value


def token_content(value: Any, key: str) -> str:
    """A special token from a config: a plain str, or Hugging Face's serialised AddedToken dict."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    raise BertkitError(f"{key} in the tokenizer config must be a string or {{'content': ...}}, got {value!r}")


def read_tokenizer_json(file: Path) -> tuple[dict[str, int], dict[str, Any], list[str]]:
    """(``{token: id}`` with added tokens, settings, added special tokens) from a BERT ``tokenizer.json``."""
    data = read_json(file)
    model = data.get("model")
    kind = model.get("type") if isinstance(model, dict) else None
    if kind != "WordPiece":
        family = f" ({_MODEL_FAMILIES[kind]})" if kind in _MODEL_FAMILIES else ""
        raise BertkitError(f"{file} holds a {kind} model{family}, not WordPiece: it is not a BERT tokenizer, and "
                           "bertkit reads only BERT's WordPiece; use the tokenizer library of that model")
    vocab = model.get("vocab")
    if not isinstance(vocab, dict) or not vocab:
        raise BertkitError(f"{file}: model.vocab must be a non-empty {{token: id}} object, got "
                           f"{type(vocab).__name__}")
    prefix = model.get("continuing_subword_prefix", "##")
    if prefix != "##":
        raise BertkitError(f"{file}: model.continuing_subword_prefix is {prefix!r}; BERT's WordPiece (and "
                           "bertkit) marks continuation pieces with '##'")
    settings: dict[str, Any] = {
        "unk_token": _typed(model.get("unk_token", "[UNK]"), (str,), f"{file}: model.unk_token"),
        "max_input_chars_per_word": _typed(model.get("max_input_chars_per_word", 100), (int,),
                                           f"{file}: model.max_input_chars_per_word"),
    }
    normalizer = data.get("normalizer")
    norm_kind = normalizer.get("type") if isinstance(normalizer, dict) else None
    if norm_kind != "BertNormalizer":
        raise BertkitError(f"{file}: the normalizer is {norm_kind}, not BertNormalizer, so this WordPiece "
                           "tokenizer does not normalise text as BERT does; bertkit supports BERT's only")
    if normalizer.get("clean_text", True) is not True:
        raise BertkitError(f"{file}: normalizer.clean_text is {normalizer['clean_text']!r}; bertkit always "
                           "cleans text as BERT does (control characters dropped, whitespace made spaces)")
    for key, name, default, types in (("do_lower_case", "lowercase", True, (bool,)),
                                      ("strip_accents", "strip_accents", None, (bool, type(None))),
                                      ("tokenize_chinese_chars", "handle_chinese_chars", True, (bool,))):
        settings[key] = _typed(normalizer.get(name, default), types, f"{file}: normalizer.{name}")
    tokens = dict(vocab)
    added, special = [], []
    for entry in data.get("added_tokens") or ():
        content, i = entry.get("content"), entry.get("id")
        if not isinstance(content, str) or not isinstance(i, int):
            raise BertkitError(f"{file}: an added_tokens entry needs a string content and an int id, got {entry!r}")
        if tokens.setdefault(content, i) != i:
            raise BertkitError(f"{file}: added token {content!r} has id {i} but the vocabulary gives it "
                               f"{tokens[content]}")
        (special if entry.get("special") else added).append((i, content))
    if added:
        settings["added_tokens"] = [t for _, t in sorted(added)]
    return tokens, settings, [t for _, t in sorted(special)]


def merge_tokenizer_json(from_json: dict[str, Any], special: list[str], settings: dict[str, Any],
                         overrides: dict[str, Any], json_file: Path, config_file: Path) -> dict[str, Any]:
    """tokenizer.json's settings under tokenizer_config.json's: a setting both give must agree, unless a
    keyword argument decides it. Added special tokens that are none of the named ones become
    ``additional_special_tokens`` when the config lists none."""
    merged = dict(from_json)
    for key, value in settings.items():
        if key in from_json and from_json[key] != value and key not in overrides:
            raise BertkitError(
                f"{config_file} sets {key}={value!r} but {json_file} says {from_json[key]!r} (its "
                f"{'model' if key in ('unk_token', 'max_input_chars_per_word') else 'normalizer'}); make the "
                f"files agree, or pass {key}= to from_pretrained to choose (transformers 5 would follow "
                f"{CONFIG_FILE})"
            )
        merged[key] = value
    if "additional_special_tokens" not in merged:
        named = {merged.get(k, _DEFAULT_SPECIAL[k]) for k in SPECIAL_TOKEN_KEYS}
        extra = [t for t in special if t not in named]
        if extra:
            merged["additional_special_tokens"] = extra
    return merged


def check_fits_model(vocab_size_needed: int, path: Path, source: Path) -> None:
    """Where a tokenizer sits beside a model (a checkpoint directory), every id must have an embedding row:
    a vocabulary longer than config.json's vocab_size fails later as torch's "index out of range"."""
    config_file = path / "config.json"
    if not config_file.is_file():
        return
    try:
        vocab_size = json.loads(config_file.read_text(encoding="utf-8")).get("vocab_size")
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
        return  # the model's own loader reports a damaged config.json with its details
    if isinstance(vocab_size, int) and vocab_size_needed > vocab_size:
        raise BertkitError(f"{source} has {vocab_size_needed} tokens but {config_file} has vocab_size "
                           f"{vocab_size}: ids from {vocab_size} up would have no embedding; use the vocabulary "
                           "the model was trained with")
