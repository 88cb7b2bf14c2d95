"""Why a checkpoint's weights are refused before they are loaded, and why a model is refused before it is saved:
a config whose sizes or layer count are not the weights' (checked before the model is built), tensors beyond the
config's layers, tensors of no BERT module (with how to load without them), NaN or infinite values, a weight a
PyTorch transform computes (pruning, parametrizations), an encoder running another number of layers than its config
says. Each error names the keys or fields, both values and the fix.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from torch.nn.utils import parametrize

from bertkit.checkpoint_keys import (
    LAYER_KEYS,
    canonical_tensors,
    normalise_published_key,
    strip_encoder_prefix,
)
from bertkit.config import BertConfig
from bertkit.errors import BertkitError

# Which config.json sizes each published encoder tensor's dimensions are: (tensor, ((field, dimension), ...)).
_SIZES = (
    ("embeddings.word_embeddings.weight", (("vocab_size", 0), ("hidden_size", 1))),
    ("embeddings.position_embeddings.weight", (("max_position_embeddings", 0), ("hidden_size", 1))),
    ("embeddings.token_type_embeddings.weight", (("type_vocab_size", 0), ("hidden_size", 1))),
    ("encoder.layer.0.intermediate.dense.weight", (("intermediate_size", 0), ("hidden_size", 1))),
)


def check_config_fits_weights(config: BertConfig, weights: dict[str, Tensor], source: str) -> None:
    """Refuse a config whose sizes are not the weights', naming each field and both values: before the model is
    built, so a damaged config.json (vocab_size 2**40) is an error, not an allocation of its size."""
    canonical = {k: tuple(v.shape) for k, v in canonical_tensors(weights, source=source).items() if isinstance(v, Tensor)}
    found: dict[str, tuple[int, int, str]] = {}  # field -> (config's value, weights' value, the tensor read)
    for key, dims in _SIZES:
        shape = canonical.get(key)
        if shape is None or len(shape) != 2:
            continue  # absent or malformed: the strict loading names it
        for field, dim in dims:
            if field not in found and shape[dim] != getattr(config, field):
                found[field] = (getattr(config, field), shape[dim], f"{key} {shape}")
    layers = _layer_tensors(weights)
    complete = [i for i in sorted(layers) if len(layers[i]) == len(LAYER_KEYS)]
    n = len(complete)
    if complete == list(range(n)) and len(layers) == n:  # layers 0 to n-1, each whole: n is the weights' count
        if n and n != config.num_hidden_layers:
            found["num_hidden_layers"] = (config.num_hidden_layers, n, f"encoder.layer.0 to {n - 1}"
                                          + (f"; no encoder.layer.{n}" if n < config.num_hidden_layers else ""))
    else:
        _refuse_stray_layers(config.num_hidden_layers, layers, source)
    if found:
        raise BertkitError(f"{source}: the config does not match the weights: "
                           + "; ".join(f"{field} is {ours} but the weights have {theirs} ({key})"
                                       for field, (ours, theirs, key) in found.items())
                           + "; fix config.json (or the overrides passed) to the weights' sizes, or pair the weights "
                             "with the config.json they were saved with")


def _layer_tensors(weights: dict[str, Tensor]) -> dict[int, dict[str, str]]:
    """The encoder layers the weights hold tensors of: {layer index: {its canonical name: the name in the file}},
    counting only the tensors a layer has (``LAYER_KEYS``; anything else is the strict loading's to name)."""
    names = {n.format(i="{i}") for n in LAYER_KEYS}
    out: dict[int, dict[str, str]] = {}
    for key, value in weights.items():
        bare = strip_encoder_prefix(normalise_published_key(key))
        parts = bare.split(".", 3)
        if isinstance(value, Tensor) and len(parts) == 4 and parts[:2] == ["encoder", "layer"] and parts[2].isdigit() \
                and f"encoder.layer.{{i}}.{parts[3]}" in names:
            out.setdefault(int(parts[2]), {})[bare] = key
    return out


def _refuse_stray_layers(num_layers: int, layers: dict[int, dict[str, str]], source: str) -> None:
    """Refuse weights whose layers 0 to ``num_layers`` - 1 are whole but which hold tensors of a layer beyond them,
    naming those tensors and why no num_hidden_layers fits (a count from the highest index would ask for layers the
    file lacks). Other gaps (a layer of the config missing a tensor) are the strict loading's to name, key by key."""
    beyond = sorted(i for i in layers if i >= num_layers)
    if not beyond or any(len(layers.get(i, {})) != len(LAYER_KEYS) for i in range(num_layers)):
        return
    stray = [key for i in beyond for key in sorted(layers[i].values())]
    shown = ", ".join(stray[:5]) + (f" and {len(stray) - 5} more" if len(stray) > 5 else "")
    whole = len(LAYER_KEYS)
    held = "; ".join(f"layer {i}: " + ("whole" if len(layers[i]) == whole else f"{len(layers[i])} of its {whole} "
                                                                                  "tensors") for i in beyond)
    lacking = " and ".join(f"layer {i} " + ("missing" if i not in layers else "incomplete")
                           for i in range(num_layers, beyond[-1] + 1) if len(layers.get(i, {})) != whole)
    raise BertkitError(
        f"{source}: the weights hold layers 0 to {num_layers - 1} whole, as config.json's num_hidden_layers "
        f"{num_layers} says, and stray tensors beyond them ({held}): {shown}. Raising num_hidden_layers does not "
        f"load them: {beyond[-1] + 1} would leave {lacking}. Remove the stray tensors from the weights file (a "
        f"{num_layers}-layer model never writes them), or pair the weights with the config.json they were saved "
        "with")


def outside_bert_hint(unknown: list[str]) -> str:
    """How to load a checkpoint whose only unexpected tensors belong to no BERT module (TinyBERT's distillation
    projections ``fit_denses.*``, a training script's extra layer): transformers drops them with a warning, and the
    model is whole without them. Tensors inside the encoder (a variant's gated MLP) get no such advice: dropping
    them would load another network's encoder half-way."""
    if not unknown or any(strip_encoder_prefix(k).startswith(("embeddings.", "encoder.", "pooler.")) for k in unknown):
        return ""
    prefixes = tuple(sorted({k.split(".")[0] + "." for k in unknown}))
    return (f" (tensors of no BERT module, which transformers drops with a warning; to load the model without them "
            f"pass the rest as state_dict: from_pretrained(path, state_dict={{k: v for k, v in "
            f"bertkit.weight_files.read_weights(pathlib.Path(path)).items() if not k.startswith({prefixes!r})}}))")


def refuse_layers_unlike_config(model: Any, encoder: Any) -> None:
    """Refuse to save ``model`` when its ``encoder`` runs another number of layers than its config says (a student
    cut to some of its teacher's layers): the config is what a checkpoint is read back with, so the keys written
    follow it, and layers past it were dropped without a word (a student that ran 6 layers saved 3), missing ones
    refused as if the model were int8, and an int8 directory written that no load reads."""
    layers, configured = len(encoder.encoder.layer), model.config.num_hidden_layers
    if layers != configured:
        raise BertkitError(f"{type(model).__name__} runs {layers} encoder layers but its config says "
                           f"num_hidden_layers={configured}, the number a checkpoint is read back with: set "
                           f"config.num_hidden_layers = {layers} (the layers kept in encoder.layer), or keep "
                           f"{configured} layers there")


def weight_transform(model: nn.Module, key: str) -> str | None:
    """Why ``model``'s state dict has no ``key`` (``...query.weight``) when a PyTorch transform computes that
    weight from other tensors (``torch.nn.utils.prune``, ``parametrize``, ``weight_norm``), with the call that
    makes it a plain parameter again; None otherwise."""
    path, _, name = key.rpartition(".")
    try:
        module = model.get_submodule(path)
    except AttributeError:
        return None
    if parametrize.is_parametrized(module, name):
        return (f"{key} is parametrized ({type(module.parametrizations[name][0]).__name__}): call torch.nn.utils."
                f"parametrize.remove_parametrizations(model.get_submodule({path!r}), {name!r})")
    if hasattr(module, f"{name}_orig") and hasattr(module, f"{name}_mask"):
        return (f"{key} is pruned (torch.nn.utils.prune: {name}_orig and {name}_mask): call torch.nn.utils.prune."
                f"remove(model.get_submodule({path!r}), {name!r})")
    if hasattr(module, f"{name}_g") and hasattr(module, f"{name}_v"):
        return (f"{key} is weight-normed (torch.nn.utils.weight_norm: {name}_g and {name}_v): call torch.nn.utils."
                f"remove_weight_norm(model.get_submodule({path!r}), {name!r})")
    return None


def nonfinite_count(key: str, value: Tensor) -> str | None:
    """"KEY (n of N)" where the floating-point tensor ``value`` holds NaN or infinite values, else None; loading
    refuses such weights and saving will not write them. The range is checked first (NaN propagates to both ends),
    so a finite tensor costs no full-size mask."""
    if not value.is_floating_point() or not value.numel() or bool(torch.isfinite(torch.stack(torch.aminmax(value))).all()):
        return None
    return f"{key} ({int((~torch.isfinite(value)).sum())} of {value.numel()})"
