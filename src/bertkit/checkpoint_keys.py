"""The published names of BERT's weights, in one declarative table: the encoder's (``embeddings.*``,
``encoder.layer.{i}.*``, ``pooler.*``; head models prefix ``bert.``), the tied masked-LM decoder's, the keys accepted
and never written, and the top-level modules of BERT's heads. A checkpoint's names are made canonical here (its
``bert.`` prefix, TF-era ``LayerNorm.gamma``/``beta``, the MLM bias stored as its tied copy), and int8 directories'
projection names (``layers.3.qkv.weight``) mapped to the published ones. What is loaded, refused or written is
``bertkit.checkpoint_io``'s.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor

from bertkit.errors import BertkitError

# The encoder's published names, relative to the encoder (head models prefix "bert."); "{i}" is the layer index.
ENCODER_KEYS = ["embeddings.word_embeddings.weight", "embeddings.position_embeddings.weight",
                "embeddings.token_type_embeddings.weight", "embeddings.LayerNorm.weight", "embeddings.LayerNorm.bias"]
LAYER_KEYS = [f"encoder.layer.{{i}}.{module}.{p}"
              for module in ("attention.self.query", "attention.self.key", "attention.self.value",
                             "attention.output.dense", "attention.output.LayerNorm", "intermediate.dense",
                             "output.dense", "output.LayerNorm")
              for p in ("weight", "bias")]
POOLER_KEYS = ["pooler.dense.weight", "pooler.dense.bias"]

# The MLM decoder is tied to the word embeddings and its bias to cls.predictions.bias (paper's code:
# output_weights = embedding table): state dicts list them, as transformers' do, but checkpoints need not.
TIED_KEYS = ("cls.predictions.decoder.weight", "cls.predictions.decoder.bias")
# Accepted on load, never written: the tied decoder, and the position-id buffer old checkpoints store.
IGNORED_KEYS = (*TIED_KEYS, "embeddings.position_ids")
# The top-level modules of BERT heads: a key under one that the model lacks is another head's, dropped.
FAMILY_HEADS = ("cls.", "classifier.", "qa_outputs.")


def expand_keys(names: list[str], num_layers: int) -> list[str]:
    """``names`` with ``{i}`` filled in for each of ``num_layers`` layers."""
    return [n.format(i=i) for n in names for i in (range(num_layers) if "{i}" in n else (0,))]


# The modules of each kind of projection int8 directories name (``bertkit.quantization``).
_PROJECTION_MODULES = {"qkv": ("attention.self.query", "attention.self.key", "attention.self.value"),
                       "attn_out": ("attention.output.dense",), "ffn_in": ("intermediate.dense",),
                       "ffn_out": ("output.dense",)}


def encoder_published_names(name: str) -> tuple[str, ...]:
    """The published name(s) of an encoder projection's parameter as int8 directories name it
    (``layers.3.qkv.weight`` -> ``encoder.layer.3.attention.self.query.weight``, ``...key.weight``,
    ``...value.weight``)."""
    parts = name.split(".")
    if len(parts) != 4 or parts[0] != "layers" or not parts[1].isdigit() or parts[2] not in _PROJECTION_MODULES:
        raise KeyError(f"{name} is not layers.<i>.<{'|'.join(_PROJECTION_MODULES)}>.<parameter>")
    _, i, kind, param = parts
    return tuple(f"encoder.layer.{i}.{module}.{param}" for module in _PROJECTION_MODULES[kind])


def normalise_published_key(key: str) -> str:
    """Keys of TF-converted checkpoints use LayerNorm.gamma/beta; transformers renamed them weight/bias."""
    if key.endswith(".gamma"):
        return key[: -len("gamma")] + "weight"
    if key.endswith(".beta"):
        return key[: -len("beta")] + "bias"
    return key


def strip_encoder_prefix(key: str) -> str:
    return key[len("bert."):] if key.startswith("bert.") else key


def canonical_tensors(published: dict[str, Tensor], prefix: str = "", source: str = "the checkpoint") -> dict[str, Tensor]:
    """Published names made canonical: LayerNorm.gamma -> weight, and the encoder's keys under ``prefix`` ("bert."
    in a head model) whichever prefix the file used. Two names of one weight holding different values are refused,
    naming both (``source``: the file, for the message)."""
    out: dict[str, Tensor] = {}
    named: dict[str, str] = {}
    for key, value in published.items():
        canonical = canonical_key(key, prefix)
        if canonical in out and isinstance(value, Tensor) and not _same(out[canonical], value):
            # one weight under two of its names (with and without "bert.", LayerNorm.gamma and .weight): which one a
            # loader keeps is its own choice (transformers' differs by case), so the numbers would be too
            raise BertkitError(f"{source}: {named[canonical]} and {key} hold different values for one weight, {canonical}; "
                               "the file was merged from two models or edited: keep one of the two (from_pretrained("
                               "path, state_dict=...) with the other left out) or save the checkpoint again")
        out[canonical], named[canonical] = value, key
    if "cls.predictions.bias" not in out and TIED_KEYS[1] in out:  # the MLM bias stored as its tied copy only, which
        out["cls.predictions.bias"] = out.pop(TIED_KEYS[1])  # transformers' tied-weight map loads as the bias
    return out


def _same(a: Tensor, b: Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b)


def canonical_key(key: str, prefix: str = "") -> str:
    """One published name made canonical (``canonical_tensors``)."""
    key = normalise_published_key(key)
    bare = strip_encoder_prefix(key)
    return prefix + bare if bare.startswith(("embeddings.", "encoder.", "pooler.")) else key


def canonical_names(names: Iterable[str]) -> set[str]:
    """A checkpoint's tensor names as loading reads them (``canonical_tensors``), the encoder's without ``bert.``."""
    return set(canonical_tensors(dict.fromkeys(names)))  # type: ignore[arg-type]  # the names alone
