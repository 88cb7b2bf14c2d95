"""The saved int8 directory: ``save_int8`` writes it, ``load_int8`` reads it, ``bertkit quantize``
(``quantize_checkpoint``) makes one, ``load_for_inference`` is what every command and pipeline loads a model with.

A directory holds ``model.int8.safetensors`` (each int8 projection's integers and scales under
``int8.layers.<i>.<projection>.``, every other tensor under its published name, in float32) and ``config.json``
with a ``quantization_config`` (``QUANT_METHOD``, format ``INT8_FORMAT_VERSION``). Integers and scales, not one
engine's packing, so a directory written on one x86 CPU runs on another.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from torch import Tensor, nn

from bertkit._hardware import check_int8_kernel
from bertkit.checkpoint_checks import refuse_layers_unlike_config
from bertkit.checkpoint_keys import FAMILY_HEADS, TIED_KEYS, canonical_names, encoder_published_names
from bertkit.config import BertConfig
from bertkit.errors import BertkitError, MissingFileError
from bertkit.heads import MODEL_CLASSES
from bertkit.hub import (
    MODULES,
    SENTENCE_FILES,
    declared_max_seq_length,
    encoder_path,
    module_types,
    read_modules,
)
from bertkit.modeling import BertModel
from bertkit.outputs import atomic_target, atomic_write_text
from bertkit.quantization.calibration import read_calibration_file
from bertkit.quantization.kernels import Int8Linear
from bertkit.quantization.projections import (
    PER_TOKEN,
    PROJECTIONS,
    encoder_of,
    float_projection,
    get_projection,
    int8_projections,
    set_projection,
)
from bertkit.quantization.quantize import quantize_int8_on_texts
from bertkit.runs import refuse_inputs
from bertkit.staging import staged
from bertkit.tokenization import BertTokenizer
from bertkit.weight_files import (
    CONFIG_NAME,
    INT8_WEIGHTS_NAME,
    QUANT_METHOD,
    WEIGHTS_NAME,
    read_config_json,
    read_weights,
    refuse_mixed_weights,
    refuse_save_beside_other_kind,
    weight_files,
)
from bertkit.write_paths import target_of

# The layout's version (config.json's ``quantization_config.format_version``, beside its ``QUANT_METHOD``).
INT8_FORMAT_VERSION = 3
# How to write a directory again (for one this bertkit refuses): the command, with the directory's own path.
_REWRITE = "write it again: bertkit quantize --model FLOAT_CHECKPOINT --output-dir {} --overwrite"

# The modules of a sentence-transformers directory an int8 directory runs (through the embedding and classification
# pipelines, predict and serve, the only loaders of one): Dense layers and a SparseEncoder's modules are not among them.
_INT8_MODULES = ("Transformer", "Pooling", "Normalize")

# An int8 file's projections: (layer index, projection) -> {"weight": ..., "weight_scale": ..., "inv_scale": ...}
_SavedProjections = dict[tuple[int, str], dict[str, Tensor]]


def is_int8_checkpoint(model_dir: str | Path) -> bool:
    """Whether ``model_dir`` holds an int8 model written by ``save_int8`` / ``bertkit quantize`` (one beside float
    weights is refused: ``refuse_mixed_weights``)."""
    refuse_mixed_weights(Path(model_dir))
    return (Path(model_dir) / INT8_WEIGHTS_NAME).is_file()


def published_keys(model_dir: Path) -> set[str]:
    """Names of the tensors in a checkpoint directory as loading reads them (``canonical_names``: the encoder's
    without ``bert.``), read from the file header only (no weights loaded)."""
    st = model_dir / (INT8_WEIGHTS_NAME if is_int8_checkpoint(model_dir) else WEIGHTS_NAME)  # int8: the head as published
    if not st.is_file():
        return canonical_names(read_weights(model_dir))  # transformers' torch pickle
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(st), framework="pt") as f:
            return canonical_names(f.keys())
    except SafetensorError as e:  # the same words as loading the weights gives
        raise BertkitError(f"{st} could not be read as safetensors ({e}); the file is truncated or corrupt "
                           f"(size {st.stat().st_size} bytes): copy or download it again") from e


def save_int8(model: nn.Module, output_dir: str | Path, *, calibration: str = "built-in") -> Path:
    """Write an int8 model (``quantize_int8``'s result) to ``output_dir`` for ``load_int8``; returns the directory.

    The layout is the module docstring's; ``calibration`` (what it was calibrated on) is recorded as given in
    ``quantization_config``. The tokenizer is not written (``bertkit quantize`` copies it).
    """
    encoder = encoder_of(model)
    refuse_layers_unlike_config(model, encoder)
    int8 = {(i, kind): get_projection(layer, kind) for i, layer in enumerate(encoder.encoder.layer) for kind in PROJECTIONS
            if isinstance(get_projection(layer, kind), Int8Linear)}
    if not int8:
        raise BertkitError(f"save_int8 writes an int8 model, and this {type(model).__name__} has no int8 projection: "
                           "quantize it first (quantize_int8 / quantize_int8_on_texts), or save the float model "
                           "with save_pretrained")
    directory = Path(output_dir)
    refuse_save_beside_other_kind(directory, int8=True)
    tensors = _int8_tensors(model, encoder, int8)
    config = model.config.to_dict()
    config["architectures"] = [type(model).__name__]
    config["quantization_config"] = _quantization_config(int8, calibration)
    # the float tensors' type, as save_pretrained writes it: the config.json of a bf16 checkpoint quantized from its
    # float32 load kept "bfloat16" over float32 embeddings and norms
    config.pop("torch_dtype", None)
    config["dtype"] = str(encoder.embeddings.word_embeddings.weight.dtype).removeprefix("torch.")
    from safetensors.torch import save_file

    with staged(directory) as out, atomic_target(out / INT8_WEIGHTS_NAME) as tmp:
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp), metadata={"format": "pt",
                                                                                       "bertkit": QUANT_METHOD})
        atomic_write_text(out / CONFIG_NAME, json.dumps(config, indent=2, sort_keys=True) + "\n")
    return directory


def _int8_tensors(model: nn.Module, encoder: BertModel, int8: dict[tuple[int, str], nn.Module]) -> dict[str, Tensor]:
    """What ``save_int8`` writes to the safetensors file: each int8 projection's integers and scales, its bias under
    its published name(s), and every other tensor of ``model`` under its published name, which is its state-dict key
    (the modules carry transformers' names; the tied decoder's copies left out)."""
    prefix = "" if encoder is model else "bert."
    tensors: dict[str, Tensor] = {}
    for (i, kind), module in int8.items():
        tensors.update({f"int8.layers.{i}.{kind}.{k}": getattr(module, k) for k in ("weight", "weight_scale", "inv_scale")})
        names = encoder_published_names(f"layers.{i}.{kind}.bias")
        tensors.update({prefix + n: b for n, b in zip(names, module.bias.chunk(len(names)), strict=True)})
    int8_modules = {name for name, m in model.named_modules() if isinstance(m, Int8Linear)}
    tensors.update({k: v for k, v in model.state_dict().items()
                    if k not in TIED_KEYS and k.rpartition(".")[0] not in int8_modules})
    return tensors


def _quantization_config(int8: dict[tuple[int, str], nn.Module], calibration: str) -> dict:
    """config.json's ``quantization_config`` for a model whose int8 projections are ``int8``."""
    return {
        "quant_method": QUANT_METHOD, "format_version": INT8_FORMAT_VERSION,
        "weights": "int8, symmetric, one scale per output channel",
        "activations": "uint8, dynamic, 8 or 7 bits as the CPU runs them: one scale per call over the whole input, "
                       "one per token for " + ", ".join(PER_TOKEN),
        "smoothing": "SmoothQuant: inputs times inv_scale, weights already times its inverse",
        "int8_projections": [f"layers.{i}.{kind}" for i, kind in int8],
        "calibration": calibration,
    }


def model_class_of(directory: Path) -> type[nn.Module]:
    """The bertkit class config.json's ``architectures`` names (the bare encoder when it names none and the weights
    hold no head: a head's weights under no named class are refused, as the bare encoder would leave them out)."""
    archs = read_config_json(directory).get("architectures")
    if not archs:
        heads = sorted({key.split(".")[0] for key in published_keys(directory) if key.startswith(FAMILY_HEADS)})
        if heads:
            raise BertkitError(
                f"{directory / CONFIG_NAME} names no architecture and the weights hold a head ({', '.join(heads)}), "
                "which the bare encoder it would load as leaves out: set \"architectures\" in config.json to the "
                f"head's class (one of {', '.join(MODEL_CLASSES)}), or to [\"BertModel\"] for the encoder alone")
        return BertModel
    name = archs if isinstance(archs, str) else archs[0] if isinstance(archs, list) else None
    if name not in MODEL_CLASSES:
        raise BertkitError(f"{directory / CONFIG_NAME} names architecture {archs!r}; bertkit has "
                           f"{', '.join(MODEL_CLASSES)} (edit 'architectures' if the weights are one of these)")
    return MODEL_CLASSES[name]


def load_named_class(directory: Path) -> nn.Module:
    """The model of ``directory`` as the class its config.json names (``model_class_of``), in eval mode, for a command
    that writes it in another form (``bertkit quantize``, ``export onnx``). A head the weights lack is refused:
    from_pretrained starts it at random (for fine-tuning, as transformers does), and the int8 directory or graph
    written would hold that random head as the checkpoint's own, where the pipelines refuse the directory."""
    model_class = model_class_of(directory)
    stored = published_keys(directory)
    model = model_class.from_pretrained(directory).eval()
    absent = [key for key in model.state_dict() if key.startswith(FAMILY_HEADS) and key not in TIED_KEYS
              and key not in stored]
    if absent:
        raise BertkitError(f"{directory / CONFIG_NAME} names {model_class.__name__}, and its weights lack that head's "
                           f"({', '.join(absent)}): it would be written with the head initialised at random; set "
                           "\"architectures\" in config.json to the class its weights are (\"BertModel\" for the "
                           "encoder alone), or fine-tune the head first")
    return model


# The heads whose weights have the same names and shapes (classifier.weight: num_labels x hidden, or 1 x hidden for
# multiple choice and for a one-output regressor): only the class config.json names tells a checkpoint of one apart.
_CLASSIFIERS = ("BertForSequenceClassification", "BertForTokenClassification", "BertForMultipleChoice")


def require_head(directory: Path, model_class: type[nn.Module], required: tuple[str, ...], task: str, fix: str) -> None:
    """Refuse a checkpoint without the weights ``required`` for ``task``, or whose config.json names another
    classifier head than ``model_class``: its weights would load and give that other task's numbers (an STS-B
    regressor's one output read as SWAG's choice scores) without a word."""
    missing = [key for key in required if key not in published_keys(directory)]
    if missing:
        raise BertkitError(f"{directory} has no {task} head (its weights lack {', '.join(missing)}); {fix}")
    archs = read_config_json(directory).get("architectures")
    named = archs[0] if isinstance(archs, list) and archs else archs
    if named in _CLASSIFIERS and model_class.__name__ in _CLASSIFIERS and named != model_class.__name__:
        raise BertkitError(f"{directory / CONFIG_NAME} names {named}, not the {model_class.__name__} {task} runs: its "
                           "classifier was trained for another task, and would give numbers that mean nothing here; "
                           f"{fix}")


def load_int8(model_dir: str | Path, model_class: type[nn.Module] | None = None) -> nn.Module:
    """The int8 model ``save_int8`` / ``bertkit quantize`` wrote to ``model_dir``, in eval mode on the CPU, as
    ``model_class`` (default: config.json's ``architectures``; a head model's directory loads as ``BertModel`` too).
    Every tensor is checked before the model is built (a NaN or inf weight, a scale out of range is refused, naming
    it), and the integers are packed for this machine's kernel."""
    directory = Path(model_dir)
    # float weights beside the int8 file are refused here as by every other loader: from_pretrained, transformers and
    # sentence-transformers read them under this config.json, so the directory is not one model
    refuse_mixed_weights(directory)
    weights = directory / INT8_WEIGHTS_NAME
    if not weights.is_file():
        raise MissingFileError(f"{weights} not found: load_int8 reads a directory written by `bertkit quantize` "
                               "(or save_int8); a float checkpoint loads with from_pretrained, and "
                               "pipeline(..., quantize='int8') or --int8 quantize it at load")
    method = read_config_json(directory).get("quantization_config")
    method = method if isinstance(method, dict) else {}
    if method.get("quant_method") != QUANT_METHOD or method.get("format_version") != INT8_FORMAT_VERSION:
        raise BertkitError(f"{directory / CONFIG_NAME} does not describe a {QUANT_METHOD} model of format "
                           f"{INT8_FORMAT_VERSION} (quantization_config: {method or 'absent'}); "
                           + _REWRITE.format(directory))
    check_int8_kernel()
    model_class = model_class or model_class_of(directory)
    saved, published = _read_int8_tensors(directory, weights)
    config = BertConfig.from_json_file(directory / CONFIG_NAME)
    model = model_class.from_pretrained(None, config=config, state_dict=published)
    _install_int8(encoder_of(model), saved, weights)
    return model.eval()


def _read_int8_tensors(directory: Path, weights: Path) -> tuple[_SavedProjections, dict[str, Tensor]]:
    """``weights``' tensors, checked: each int8 projection's by (layer index, projection), and the others by their
    published names, with empty float stand-ins for the int8 projections' weights."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        tensors = load_file(str(weights))
    except SafetensorError as e:
        raise BertkitError(f"{weights} could not be read as safetensors ({e}); the file is truncated or corrupt "
                           f"(size {weights.stat().st_size} bytes): " + _REWRITE.format(directory)) from e
    saved: _SavedProjections = {}
    published: dict[str, Tensor] = {}
    for key, value in tensors.items():
        parts = key.split(".")
        if value.is_floating_point() and not bool(torch.isfinite(value).all()):
            raise BertkitError(f"{weights}: {key} holds {int((~torch.isfinite(value)).sum())} NaN or infinite values; "
                               "the file is damaged: " + _REWRITE.format(directory))
        if parts[0] != "int8":
            published[key] = value
        elif len(parts) == 5 and parts[1] == "layers" and parts[2].isdigit() and parts[3] in PROJECTIONS:
            saved.setdefault((int(parts[2]), parts[3]), {})[parts[4]] = value
        else:
            raise BertkitError(f"{weights} holds {key!r}, which is not an int8 projection's tensor "
                               f"(int8.layers.<i>.<{'|'.join(PROJECTIONS)}>.<weight|weight_scale|inv_scale>); "
                               + _REWRITE.format(directory))
    # The int8 projections' float weights are not stored: zero stand-ins of their shape (one zero, expanded: no
    # memory) let the key table load the rest (and check it against the config, finite values included: an
    # uninitialised stand-in could hold NaN); the int8 layers then replace them.
    for (i, kind), parts in saved.items():
        expected = {"weight", "weight_scale", "inv_scale"}
        if set(parts) != expected:
            raise BertkitError(f"{weights}: int8 projection layers.{i}.{kind} has {sorted(parts)}, expected "
                               f"{', '.join(sorted(expected))}; " + _REWRITE.format(directory))
        names = encoder_published_names(f"layers.{i}.{kind}.weight")
        out, inp = parts["weight"].shape
        for name in names:
            published[name] = torch.zeros(()).expand(out // len(names), inp)
    return saved, published


def _install_int8(encoder: BertModel, saved: _SavedProjections, weights: Path) -> None:
    """Put ``saved``'s projections into ``encoder``'s layers as ``Int8Linear``."""
    for (i, kind), parts in sorted(saved.items()):  # layers the config lacks were refused by from_pretrained
        stand_in = float_projection(encoder.encoder.layer[i], kind)
        if tuple(parts["weight"].shape) != tuple(stand_in.weight.shape):
            raise BertkitError(f"{weights}: int8 layers.{i}.{kind} is {tuple(parts['weight'].shape)}, the config "
                               f"makes it {tuple(stand_in.weight.shape)}; the file and config.json do not belong "
                               "together")
        bias = stand_in.bias.detach() if stand_in.bias is not None else None
        layer = Int8Linear.from_saved(f"{weights.name}: int8.layers.{i}.{kind}", parts["weight"],
                                      parts["weight_scale"], parts["inv_scale"], bias, per_token=kind in PER_TOKEN)
        set_projection(encoder.encoder.layer[i], kind, layer)


def quantize_checkpoint(model_dir: str | Path, output_dir: str | Path, *, calibration_file: str | Path | None = None,
                        max_length: int | None = None) -> dict:
    """``bertkit quantize``: the float checkpoint in ``model_dir`` quantized as pipelines quantize it (calibrated on
    ``calibration_file``'s lines, else the built-in sentences, each cut at ``max_length`` tokens: by default where a
    sentence-transformers directory's model cuts its texts, its declared max_seq_length, else 128) and written with
    its tokenizer to ``output_dir``, beside it first, then moved into place whole. Returns a report: what was
    quantized, the cut, the files' sizes."""
    source = Path(model_dir)
    refuse_inputs(target_of(output_dir), {"model": source}, is_dir=True, flag="output_dir")
    listed = read_modules(source) or []
    encoder = source / encoder_path(listed)  # 0_Transformer/ in sentence-transformers' older layout, written there too
    if is_int8_checkpoint(encoder):
        raise BertkitError(f"{source} is an int8 model already (written by `bertkit quantize`); quantize the float "
                           "checkpoint it came from")
    _refuse_modules_int8_cannot_run(source, listed)
    if max_length is None:  # calibrated on what the model sees: cut at 128, a directory cutting at 8 ran 0.01 apart
        max_length = declared_max_seq_length(encoder) or 128
    texts = read_calibration_file(calibration_file) if calibration_file is not None else None
    tokenizer = BertTokenizer.from_pretrained(encoder)
    model = load_named_class(encoder)
    model_class = type(model)
    quantized = quantize_int8_on_texts(model, tokenizer, texts, max_length=max_length)
    calibration = "built-in" if calibration_file is None else f"{Path(calibration_file).name} ({len(texts or [])} texts)"
    out = Path(output_dir)
    inside = encoder.relative_to(source)
    with staged(out) as staging:  # the model and its tokenizer appear together, or not at all
        save_int8(quantized, staging / inside, calibration=calibration)
        tokenizer.save_pretrained(staging / inside)
        _copy_sentence_modules(source, staging, inside, listed)
    kernel = check_int8_kernel()
    return {"model": str(source), "output_dir": str(out), "architecture": model_class.__name__,
            "int8_projections": len(int8_projections(quantized)), "projections": list(PROJECTIONS),
            "kernel": kernel.name, "activation_bits": kernel.activation_bits, "calibration": calibration,
            "max_seq_length": max_length,
            "bytes": {"float": sum(f.stat().st_size for f in weight_files(encoder)),
                      "int8": (out / inside / INT8_WEIGHTS_NAME).stat().st_size}}


def _in_own_folder(path: str) -> bool:
    """Whether a module's ``path`` is its directory ("") or a folder in it: nothing is read or written outside."""
    return path in ("", ".") or (path != ".." and Path(path).name == path)


def _refuse_modules_int8_cannot_run(source: Path, listed: list[dict]) -> None:
    """Refuse a sentence-transformers directory with a module no loader of an int8 directory runs (a Dense layer, a
    SparseEncoder's MLMTransformer and SpladePooling), or outside a folder of its own (nested, or out of the
    directory): the directory would be written, and then refused by every command that loads it, or embed without
    that module."""
    others = [f"{module['type']} at {module.get('path')!r}" for module, kind in zip(listed, module_types(listed))
              if kind not in _INT8_MODULES or not _in_own_folder(module.get("path", ""))]
    if others:
        raise BertkitError(f"{source / MODULES} lists {', '.join(others)}; an int8 directory runs only "
                           f"through the pipelines, predict and serve, which run {', '.join(_INT8_MODULES)} of a "
                           "sentence-transformers directory, each in a folder of it (and no SparseEncoder in int8): "
                           "run the float directory (bertkit.sentence.SentenceTransformer or SparseEncoder, or "
                           "pipeline(...) with bf16=True)")


def _copy_sentence_modules(source: Path, out: Path, encoder: Path, listed: list[dict]) -> None:
    """The sentence-transformers files of ``source`` (modules.json and the module directories ``listed`` beside the
    encoder's, whose own sentence_bert_config.json goes with the int8 encoder written at ``out / encoder``) copied
    to ``out``, so the int8 directory embeds as ``pipeline(..., quantize="int8")`` on ``source`` does."""
    for folder in {Path(), encoder}:
        for name in SENTENCE_FILES:  # its pooling, normalisation, cut and prompts make its vectors as the weights do
            if (source / folder / name).is_file():
                shutil.copyfile(source / folder / name, out / folder / name)
    for path in (module.get("path", "") for module in listed):
        if path not in ("", ".") and Path(path) != encoder and (source / path).is_dir():
            shutil.copytree(source / path, out / path)


def load_for_inference(model_class: type[nn.Module], model_dir: str | Path) -> nn.Module:
    """``model_class.from_pretrained(model_dir)``, or ``load_int8`` where the directory holds an int8 model:
    what every command and pipeline that applies a model loads it with."""
    if is_int8_checkpoint(model_dir):
        return load_int8(model_dir, model_class)
    return model_class.from_pretrained(model_dir)
