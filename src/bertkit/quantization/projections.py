"""The projections of an encoder layer that can be int8: finding them, naming them, swapping them.

int8 directories name them ``layers.3.qkv``; the modules carry transformers' names (``checkpoint_keys`` maps one
to the other). "qkv" is the three modules query, key and value:
quantized, they become one int8 module, ``attention.self.qkv`` (one GEMM), and query/key/value are None.
``int8_projections`` and ``is_int8_model`` say what a model holds.
"""

from __future__ import annotations

import torch
from torch import nn

from bertkit.checkpoint_keys import encoder_published_names
from bertkit.construction import empty_linear
from bertkit.errors import BertkitError
from bertkit.modeling import BertModel
from bertkit.quantization.kernels import Int8Linear

# The encoder layer's projections made int8, in forward order: all four, as CTranslate2 and ONNX Runtime quantize
# them. ``ffn_out``'s input (after GELU) spans 0.01 to 30 between tokens, which one activation scale per call cannot
# hold (min cosine 0.986 on STS-B at 7 bits): its activations take one scale per token (``PER_TOKEN``), which keeps
# the embeddings within cosine 0.998 of fp32 (docs/inference.md, section int8).
PROJECTIONS = ("qkv", "attn_out", "ffn_in", "ffn_out")
PER_TOKEN = ("ffn_out",)


def _path(kind: str) -> str:
    """The module path inside a layer of a single-module projection (``ffn_in`` -> ``intermediate.dense``)."""
    (published,) = encoder_published_names(f"layers.0.{kind}.weight")  # encoder.layer.0.<path>.weight
    return published[len("encoder.layer.0."):-len(".weight")]


def get_projection(layer: nn.Module, kind: str) -> nn.Module | None:
    """The module computing projection ``kind`` of an encoder layer; for ``qkv`` the int8 module, or None
    while query, key and value are separate modules."""
    if kind == "qkv":
        return layer.attention.self.qkv
    return layer.get_submodule(_path(kind))


def float_projection(layer: nn.Module, kind: str) -> nn.Module:
    """Projection ``kind`` as one module; for float q/k/v a new ``nn.Linear(H, 3H)`` holding their weights
    concatenated (the layer's own modules when any is not a plain ``nn.Linear``: the caller refuses it)."""
    module = get_projection(layer, kind)
    if module is not None:
        return module
    attn = layer.attention.self
    linears = (attn.query, attn.key, attn.value)
    odd = next((m for m in linears if type(m) is not nn.Linear), None)
    if odd is not None:
        return odd
    fused = empty_linear(linears[0].in_features, 3 * linears[0].out_features, bias=linears[0].bias is not None)
    with torch.no_grad():
        fused.weight.copy_(torch.cat([m.weight for m in linears]))
        if fused.bias is not None:
            fused.bias.copy_(torch.cat([m.bias for m in linears]))
    return fused


def set_projection(layer: nn.Module, kind: str, module: Int8Linear) -> None:
    """Put the int8 ``module`` in place of projection ``kind`` (for ``qkv``, of query, key and value)."""
    if kind == "qkv":
        attn = layer.attention.self
        attn.qkv = module
        attn.query = attn.key = attn.value = None
        return
    parent, _, name = _path(kind).rpartition(".")
    setattr(layer.get_submodule(parent), name, module)


def encoder_of(model: nn.Module) -> BertModel:
    """The ``BertModel`` inside ``model``: the model itself, or a head model's ``.bert``."""
    if isinstance(model, BertModel):
        return model
    enc = getattr(model, "bert", None)
    if isinstance(enc, BertModel):
        return enc
    raise BertkitError(f"quantize_int8 takes a bertkit BertModel or head model (one with .bert), got "
                       f"{type(model).__name__}")


def int8_projections(model: nn.Module) -> list[str]:
    """Names of the encoder projections of ``model`` that are int8 (``layers.3.qkv``, ...), in order."""
    encoder = encoder_of(model)
    return [f"layers.{i}.{kind}" for i, layer in enumerate(encoder.encoder.layer) for kind in PROJECTIONS
            if isinstance(get_projection(layer, kind), Int8Linear)]


def is_int8_model(model: nn.Module) -> bool:
    """Whether any of ``model``'s modules is an int8 projection (``quantize_int8`` or ``load_int8`` made it)."""
    return any(isinstance(m, Int8Linear) for m in model.modules())
