"""Checks on a model's inputs and environment, kept out of the forward pass (``modeling.py``) they guard.

Shapes, dtypes and id ranges are checked where inputs enter, so a mistake is a clear error naming the value
and the fix, not torch's "index out of range in self" or wrong outputs from a broadcast mask.
"""

from __future__ import annotations

import torch
from torch import Tensor

from bertkit.config import BertConfig
from bertkit.errors import BertkitError
from bertkit.padding import is_tracing


def check_inputs(config: BertConfig, input_ids: Tensor | None, token_type_ids: Tensor | None,
                 attention_mask: Tensor | None, position_ids: Tensor | None,
                 inputs_embeds: Tensor | None = None) -> tuple[int, int]:
    """Shapes and id ranges checked where inputs enter, so a mistake is a clear error, not wrong outputs
    (a (1, T) mask broadcast over a (B, T) batch) or torch's "index out of range in self". One min/max
    pass per tensor; skipped while tracing or compiling (export), where values are symbolic. Returns (B, T)."""
    if (input_ids is None) == (inputs_embeds is None):
        raise BertkitError("pass exactly one of input_ids (B, T) and inputs_embeds (B, T, H)")
    if inputs_embeds is not None:
        if inputs_embeds.dim() != 3 or inputs_embeds.shape[-1] != config.hidden_size:
            raise BertkitError(f"inputs_embeds must be (batch, seq_len, hidden_size={config.hidden_size}), "
                               f"got shape {tuple(inputs_embeds.shape)}")
        shape = tuple(inputs_embeds.shape[:2])
    elif input_ids.dim() != 2:
        raise BertkitError(f"input_ids must be (batch, seq_len), got shape {tuple(input_ids.shape)}")
    else:
        shape = tuple(input_ids.shape)
    for name, t in (("input_ids", input_ids), ("token_type_ids", token_type_ids), ("position_ids", position_ids)):
        if t is not None and (t.is_floating_point() or t.is_complex() or t.dtype == torch.bool):
            raise BertkitError(f"{name} must hold integer ids (torch.long), got dtype {t.dtype}; convert with "
                               f".long() (the tokenizer's return_tensors='pt' gives long ids)")
    if not is_tracing() and shape[1] == 0:
        raise BertkitError(f"the sequences are empty (shape {shape}): every input needs at least one token "
                           "(the tokenizer adds [CLS] and [SEP])")
    for name, t in (("attention_mask", attention_mask), ("token_type_ids", token_type_ids)):
        if t is not None and tuple(t.shape) != shape:
            raise BertkitError(f"{name} has shape {tuple(t.shape)} but input_ids has {shape}; pass one value per "
                               "token (the tokenizer's output with padding=True gives matching shapes)")
    if position_ids is not None and (position_ids.dim() != 2 or position_ids.shape[1] != shape[1]
                                     or position_ids.shape[0] not in (1, shape[0])):
        raise BertkitError(f"position_ids has shape {tuple(position_ids.shape)}; expected {shape} or (1, {shape[1]})")
    if is_tracing() or shape[0] == 0:
        return shape
    for name, t, limit, what in (("input_ids", input_ids, config.vocab_size, "vocab_size"),
                                 ("token_type_ids", token_type_ids, config.type_vocab_size, "type_vocab_size"),
                                 ("position_ids", position_ids, config.max_position_embeddings,
                                  "max_position_embeddings")):
        if t is None:
            continue
        lo, hi = (int(v) for v in torch.aminmax(t))
        if lo < 0 or hi >= limit:
            bad = lo if lo < 0 else hi
            raise BertkitError(f"{name} holds {bad}, outside [0, {limit - 1}] ({what} {limit} of this model); "
                               "was the input made with this model's tokenizer?")
    return shape


def require_compiler(device_type: str = "cpu") -> None:
    """Fail before any work when ``torch.compile`` cannot build CPU kernels (they are C++, compiled at run time)."""
    import shutil

    if device_type == "cpu" and not any(shutil.which(c) for c in ("g++", "c++", "clang++")):
        raise BertkitError("torch.compile on CPU needs a C++ compiler and none of g++, c++, clang++ is on PATH; "
                           "install one (e.g. apt install g++) or run without --compile / compile_layers()")


def _expected_param_count(config: BertConfig) -> int:
    """Closed-form parameter count of BertModel (with pooler); used by tests against the paper's 110M/340M."""
    H, I, L = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    emb = (config.vocab_size + config.max_position_embeddings + config.type_vocab_size) * H + 2 * H
    layer = 3 * H * H + 3 * H + H * H + H + 2 * H + H * I + I + I * H + H + 2 * H
    return emb + L * layer + H * H + H
