"""What a checkpoint directory holds on disk: the file names (float weights, their shards' index, an int8 model,
config.json), which of them a directory's weights are read from, and reading them safely (safetensors first, else
transformers' torch pickle with ``weights_only=True``; shards by their index). A directory holding both kinds of
weights is refused: each loader would read its own. What the weights' names mean is ``checkpoint_keys``'s.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from bertkit.errors import BertkitError, MissingFileError, read_json_object
from bertkit.hub import cache_hint

WEIGHTS_NAME = "model.safetensors"
PICKLE_WEIGHTS_NAME = "pytorch_model.bin"  # transformers' format before safetensors
# An int8 model (``bertkit quantize``): int8 projections with their scales, the rest as published. Another name
# than WEIGHTS_NAME, so no loader of float checkpoints (transformers' included) reads it as one.
INT8_WEIGHTS_NAME = "model.int8.safetensors"
# config.json's ``quantization_config.quant_method`` of a saved int8 model (``bertkit.quantization.saved``).
QUANT_METHOD = "bertkit-int8"
# The files a directory's float weights are read from (one file, or the index of its shards).
FLOAT_WEIGHT_NAMES = (WEIGHTS_NAME, PICKLE_WEIGHTS_NAME, WEIGHTS_NAME + ".index.json", PICKLE_WEIGHTS_NAME + ".index.json")
CONFIG_NAME = "config.json"


def read_config_json(directory: str | Path) -> dict[str, Any]:
    """A checkpoint directory's config.json as a dict, or an error naming the file and the fix."""
    config_file = Path(directory) / CONFIG_NAME
    if not config_file.is_file():
        raise MissingFileError(f"{config_file} not found: pass a checkpoint directory written by save_pretrained "
                               "(config.json, model.safetensors, vocab.txt)")
    return read_json_object(config_file, "re-save the checkpoint")


def _float_weights(directory: Path) -> list[str]:
    return [name for name in FLOAT_WEIGHT_NAMES if (directory / name).is_file()]


def refuse_save_beside_other_kind(directory: Path, *, int8: bool) -> None:
    """Refuse to save an int8 model (``int8``) where float weights are, or a float model where an int8 one is: a save
    keeps a directory's other files, and each loader reads its own kind (``refuse_mixed_weights``), so the model just
    saved would not be the one loaded."""
    found = _float_weights(directory) if int8 else [INT8_WEIGHTS_NAME] * (directory / INT8_WEIGHTS_NAME).is_file()
    if found:
        kind, readers = (("float weights", "from_pretrained, transformers and sentence-transformers would load") if
                         int8 else ("an int8 model", "pipelines, predict and serve would run"))
        raise BertkitError(f"{directory} holds {kind} ({', '.join(found)}), which {readers} in place of the "
                           f"{'int8' if int8 else 'float'} model: write it to another directory")


def refuse_mixed_weights(directory: Path) -> None:
    """Refuse a directory holding an int8 model (``INT8_WEIGHTS_NAME``) beside float weights. A save keeps a directory's
    other files (another library's save into an int8 directory, or one that bertkit has since refused), so one of the
    two is stale, and each loader would read its own: pipelines the int8 model, from_pretrained and transformers the
    float weights, under one config.json. Which one config.json describes is named, with the file to remove."""
    floats = _float_weights(directory)
    if not floats or not (directory / INT8_WEIGHTS_NAME).is_file():
        return
    method = read_config_json(directory).get("quantization_config")
    int8 = isinstance(method, dict) and method.get("quant_method") == QUANT_METHOD
    kept, stale = (INT8_WEIGHTS_NAME, ", ".join(floats)) if int8 else (", ".join(floats), INT8_WEIGHTS_NAME)
    raise BertkitError(f"{directory / CONFIG_NAME} describes {'an int8' if int8 else 'a float'} model, whose weights "
                       f"({kept}) are beside {stale}, left by a save of the other kind: remove {stale} to run the "
                       f"{'int8' if int8 else 'float'} model (or keep the two in directories of their own)")


def weight_files(directory: Path) -> list[Path]:
    """The files a checkpoint's float weights are in: ``model.safetensors``, or the shards its
    ``model.safetensors.index.json`` lists (transformers' ``save_pretrained(max_shard_size=...)``), else the torch
    pickle ``pytorch_model.bin`` or its shards."""
    return _stored_weights(directory)[0]


def _stored_weights(directory: Path, use_safetensors: bool | None = None) -> tuple[list[Path], set[str] | None]:
    """``weight_files`` and, for a sharded checkpoint, the tensor names its index lists (None for one file). Every
    listed shard must be there: a partial download is refused, not loaded as a model missing layers.
    ``use_safetensors`` is transformers' keyword: True reads safetensors only, False the torch pickle only."""
    refuse_mixed_weights(directory)
    fix = "copy or download the checkpoint again"
    names = {None: (WEIGHTS_NAME, PICKLE_WEIGHTS_NAME), True: (WEIGHTS_NAME,), False: (PICKLE_WEIGHTS_NAME,)}
    if use_safetensors not in names:
        raise BertkitError(f"use_safetensors={use_safetensors!r}: pass True (safetensors only), False (the torch "
                           "pickle only) or None (safetensors first, as transformers reads)")
    for name in names[use_safetensors]:
        if (directory / name).is_file():
            return [directory / name], None
        index = directory / (name + ".index.json")
        if index.is_file():
            weight_map = read_json_object(index, fix).get("weight_map")
            if not isinstance(weight_map, dict) or not weight_map:
                raise BertkitError(f"{index} has no \"weight_map\" of tensor names to shard files, as the index "
                                   f"save_pretrained writes has; {fix}")
            shards = sorted(set(map(str, weight_map.values())))
            outside = [s for s in shards if Path(s).name != s or s in (".", "..")]
            if outside:
                raise BertkitError(f"{index} lists shard files outside its directory ({outside[:3]}); bertkit reads "
                                   "only shards beside the index")
            missing = [s for s in shards if not (directory / s).is_file()]
            if missing:
                raise MissingFileError(f"{index} lists {len(shards)} shard files and {len(missing)} are not in "
                                       f"{directory} ({', '.join(missing[:3])}): the checkpoint is incomplete; "
                                       "download or copy the missing shards")
            return [directory / s for s in shards], set(weight_map)
    if use_safetensors is not None:  # as transformers, which refuses the other kind under this keyword
        wanted = names[use_safetensors][0]
        raise MissingFileError(f"use_safetensors={use_safetensors} and {directory} holds no {wanted} (nor its shards "
                               f"with {wanted}.index.json); drop use_safetensors to read the weights it holds")
    raise MissingFileError(
        f"no float weights in {directory}{cache_hint(directory)}: expected {WEIGHTS_NAME} (or {PICKLE_WEIGHTS_NAME}, "
        "or either's shards with its .index.json); point at a directory written by save_pretrained, or fetch the "
        "example with `bertkit download-example-model DIR`. An int8 model written by `bertkit quantize` "
        f"({INT8_WEIGHTS_NAME}) runs with "
        "pipeline(task, directory), bertkit predict/serve/extract-features or "
        "bertkit.quantization.load_int8(directory); to fine-tune or convert it, use the fp32 directory it was "
        "quantized from")


def _read_weight_file(path: Path) -> dict[str, Tensor]:
    if path.name.endswith(".safetensors"):
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        try:
            tensors = load_file(str(path))
        except SafetensorError as e:
            raise BertkitError(f"{path} could not be read as safetensors ({e}); the file is truncated or corrupt "
                               f"(size {path.stat().st_size} bytes): copy or download it again") from e
        # in name order, as transformers reads a file's tensors (safe_open's keys): from_pretrained(dtype="auto") without
        # a dtype in config.json takes the first floating-point tensor's type, and load_file's order (by type, then
        # name) put a float32 LayerNorm of a bf16 checkpoint with float32 norms first: a float32 model where
        # transformers loads bf16
        return {key: tensors[key] for key in sorted(tensors)}
    # weights_only=True refuses arbitrary pickled objects: a checkpoint must not be able to run code.
    import pickle

    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        raise BertkitError(f"{path} holds Python code, not only tensors, so bertkit will not load it; "
                           f"convert it to {WEIGHTS_NAME} with a tool you trust ({str(e).splitlines()[0]})") from None


def read_weights(directory: Path, use_safetensors: bool | None = None) -> dict[str, Tensor]:
    """The state dict stored in ``directory`` (``weight_files``: safetensors first, else transformers' torch pickle,
    read safely; a sharded checkpoint shard by shard; ``use_safetensors`` as in ``_stored_weights``)."""
    files, listed = _stored_weights(directory, use_safetensors)
    weights: dict[str, Tensor] = {}
    for path in files:
        weights.update(_read_weight_file(path))
    lacking = sorted(listed - set(weights)) if listed is not None else []
    if lacking:  # the index names every tensor: one it lists that no shard holds is a damaged checkpoint
        raise BertkitError(f"the index in {directory} lists {len(lacking)} tensors that none of its shards holds "
                           f"({', '.join(lacking[:3])}): a shard was replaced or truncated; copy or download the "
                           "checkpoint again")
    return weights
