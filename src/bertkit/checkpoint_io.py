"""Checkpoints in the Hugging Face layout: the published names, strict loading, safe saving.

A checkpoint directory holds ``config.json`` and ``model.safetensors`` (or transformers' older
``pytorch_model.bin``, read only with ``torch.load(weights_only=True)``; either may be shards with an
``.index.json``, as ``save_pretrained(max_shard_size=...)`` writes them). bertkit's modules carry the published
names, so a state dict is a checkpoint's as it is; the only renames are the published formats' own: the
``bert.`` prefix, TF-era ``LayerNorm.gamma``/``beta`` and the tied decoder's copies.

Loading is strict: a missing key, a key belonging to none of the model's modules, a shape that does not fit
the config, a weight that is not floating-point or holds NaN/inf is an error listing every such key. Logged,
not errors: a task head (or pooler) absent from a pre-trained checkpoint is initialised fresh, and weights of
BERT heads the model does not have (``bert-base-uncased``'s pre-training heads under a classifier) are dropped.
"""

from __future__ import annotations

import inspect
import json
import logging
from collections.abc import Container, Iterable
from pathlib import Path
from typing import Any, ClassVar, NamedTuple

import torch
from torch import Tensor, nn
from torch.nn.utils import parametrize

from bertkit._parallel import job_of
from bertkit.compat import TransformersModelCalls, check_attn_implementation
from bertkit.config import BertConfig
from bertkit.construction import building_to_load
from bertkit.errors import BertkitError, NonFiniteError, given_path, refuse_options
from bertkit.hub import not_a_directory, refuse_hub_options, resolve_directory
from bertkit.outputs import atomic_target, atomic_write_text
from bertkit.staging import staged
from bertkit.weight_files import CONFIG_NAME, WEIGHTS_NAME, read_weights, refuse_save_beside_other_kind

logger = logging.getLogger("bertkit")


# The encoder's published names, relative to the encoder (head models prefix "bert."); "{i}" is the layer index.
_ENCODER = ["embeddings.word_embeddings.weight", "embeddings.position_embeddings.weight",
            "embeddings.token_type_embeddings.weight", "embeddings.LayerNorm.weight", "embeddings.LayerNorm.bias"]
_LAYER = [f"encoder.layer.{{i}}.{module}.{p}"
          for module in ("attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense",
                         "attention.output.LayerNorm", "intermediate.dense", "output.dense", "output.LayerNorm")
          for p in ("weight", "bias")]
_POOLER = ["pooler.dense.weight", "pooler.dense.bias"]

# The MLM decoder is tied to the word embeddings and its bias to cls.predictions.bias (paper's code:
# output_weights = embedding table): state dicts list them, as transformers' do, but checkpoints need not.
TIED_KEYS = ("cls.predictions.decoder.weight", "cls.predictions.decoder.bias")
# Accepted on load, never written: the tied decoder, and the position-id buffer old checkpoints store.
IGNORED_KEYS = (*TIED_KEYS, "embeddings.position_ids")
# The top-level modules of BERT heads: a key under one that the model lacks is another head's, dropped.
FAMILY_HEADS = ("cls.", "classifier.", "qa_outputs.")

def _expand(names: list[str], num_layers: int) -> list[str]:
    return [n.format(i=i) for n in names for i in (range(num_layers) if "{i}" in n else (0,))]


# The modules of each kind of projection int8 directories name (``bertkit.quantization``).
_PROJECTION_MODULES = {"qkv": ("attention.self.query", "attention.self.key", "attention.self.value"),
                       "attn_out": ("attention.output.dense",), "ffn_in": ("intermediate.dense",),
                       "ffn_out": ("output.dense",)}


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


def encoder_published_names(name: str) -> tuple[str, ...]:
    """The published name(s) of an encoder projection's parameter as int8 directories name it
    (``layers.3.qkv.weight`` -> ``encoder.layer.3.attention.self.query.weight``, ``...key.weight``,
    ``...value.weight``)."""
    parts = name.split(".")
    if len(parts) != 4 or parts[0] != "layers" or not parts[1].isdigit() or parts[2] not in _PROJECTION_MODULES:
        raise KeyError(f"{name} is not layers.<i>.<{'|'.join(_PROJECTION_MODULES)}>.<parameter>")
    _, i, kind, param = parts
    return tuple(f"encoder.layer.{i}.{module}.{param}" for module in _PROJECTION_MODULES[kind])


def _normalise_published_key(key: str) -> str:
    """Keys of TF-converted checkpoints use LayerNorm.gamma/beta; transformers renamed them weight/bias."""
    if key.endswith(".gamma"):
        return key[: -len("gamma")] + "weight"
    if key.endswith(".beta"):
        return key[: -len("beta")] + "bias"
    return key


def _strip_encoder_prefix(key: str) -> str:
    return key[len("bert."):] if key.startswith("bert.") else key


def _canonical(published: dict[str, Tensor], prefix: str = "") -> dict[str, Tensor]:
    """Published names made canonical: LayerNorm.gamma -> weight, and the encoder's keys under ``prefix`` ("bert."
    in a head model) whichever prefix the file used."""
    out: dict[str, Tensor] = {}
    for key, value in published.items():
        key = _normalise_published_key(key)
        bare = _strip_encoder_prefix(key)
        out[prefix + bare if bare.startswith(("embeddings.", "encoder.", "pooler.")) else key] = value
    if "cls.predictions.bias" not in out and TIED_KEYS[1] in out:  # the MLM bias stored as its tied copy only, which
        out["cls.predictions.bias"] = out.pop(TIED_KEYS[1])  # transformers' tied-weight map loads as the bias
    return out


def canonical_names(names: Iterable[str]) -> set[str]:
    """A checkpoint's tensor names as loading reads them (``_canonical``), the encoder's without ``bert.``."""
    return set(_canonical(dict.fromkeys(names)))  # type: ignore[arg-type]  # the names alone


# ---------------------------------------------------------------------------------------------------
# Reading weight files
# ---------------------------------------------------------------------------------------------------


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
    canonical = {k: tuple(v.shape) for k, v in _canonical(weights).items() if isinstance(v, Tensor)}
    found: dict[str, tuple[int, int, str]] = {}  # field -> (config's value, weights' value, the tensor read)
    for key, dims in _SIZES:
        shape = canonical.get(key)
        if shape is None or len(shape) != 2:
            continue  # absent or malformed: the strict loading names it
        for field, dim in dims:
            if field not in found and shape[dim] != getattr(config, field):
                found[field] = (getattr(config, field), shape[dim], f"{key} {shape}")
    layers = _layer_tensors(weights)
    complete = [i for i in sorted(layers) if len(layers[i]) == len(_LAYER)]
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
    counting only the tensors a layer has (``_LAYER``; anything else is the strict loading's to name)."""
    names = {n.format(i="{i}") for n in _LAYER}
    out: dict[int, dict[str, str]] = {}
    for key, value in weights.items():
        bare = _strip_encoder_prefix(_normalise_published_key(key))
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
    if not beyond or any(len(layers.get(i, {})) != len(_LAYER) for i in range(num_layers)):
        return
    stray = [key for i in beyond for key in sorted(layers[i].values())]
    shown = ", ".join(stray[:5]) + (f" and {len(stray) - 5} more" if len(stray) > 5 else "")
    whole = len(_LAYER)
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


def _outside_bert_hint(unknown: list[str]) -> str:
    """How to load a checkpoint whose only unexpected tensors belong to no BERT module (TinyBERT's distillation
    projections ``fit_denses.*``, a training script's extra layer): transformers drops them with a warning, and the
    model is whole without them. Tensors inside the encoder (a variant's gated MLP) get no such advice: dropping
    them would load another network's encoder half-way."""
    if not unknown or any(_strip_encoder_prefix(k).startswith(("embeddings.", "encoder.", "pooler.")) for k in unknown):
        return ""
    prefixes = tuple(sorted({k.split(".")[0] + "." for k in unknown}))
    return (f" (tensors of no BERT module, which transformers drops with a warning; to load the model without them "
            f"pass the rest as state_dict: from_pretrained(path, state_dict={{k: v for k, v in "
            f"bertkit.weight_files.read_weights(pathlib.Path(path)).items() if not k.startswith({prefixes!r})}}))")


def _checkpoint_directory(path: str | Path | None, config: BertConfig | None,
                          state_dict: dict[str, Tensor] | None, local_files_only: bool) -> Path | None:
    """The local directory ``from_pretrained`` reads (a Hub id resolved to its cache); None when the caller
    passes both ``config`` and ``state_dict`` instead."""
    if path is None:
        if config is None or state_dict is None:
            raise BertkitError("from_pretrained(None, ...) needs both config= and state_dict=")
        return None
    directory = resolve_directory(path, local_files_only=local_files_only)
    if not directory.is_dir():
        raise not_a_directory(directory, "checkpoint directory", "pass the directory save_pretrained wrote")
    return directory


def dtype_argument(dtype: torch.dtype | str | None, kwargs: dict[str, Any]) -> torch.dtype | str | None:
    """``dtype=``, or ``torch_dtype=`` (transformers' name before 4.56; ported code still passes it) taken out of
    ``kwargs``; both given is refused."""
    if "torch_dtype" not in kwargs:
        return dtype
    if dtype is not None:
        raise BertkitError("pass dtype= or torch_dtype= (its older transformers name), not both")
    return kwargs.pop("torch_dtype")


def resolve_dtype(dtype: torch.dtype | str | None, weights: dict[str, Tensor], config: BertConfig
                   ) -> torch.dtype | None:
    """``from_pretrained``'s dtype as a torch dtype: ``"auto"`` is transformers', the one config.json names
    (``dtype``, or ``torch_dtype`` before transformers 4.56), else the stored weights' floating-point dtype (the first
    floating-point tensor's, in the order ``read_weights`` gives: a file's names in order, as transformers); a name
    must be a torch floating-point dtype's; None keeps the float32 the weights were loaded in."""
    if dtype == "auto":
        dtype = config.extra.get("dtype") or config.extra.get("torch_dtype")
        if dtype is None:
            return next((t.dtype for t in weights.values() if t.is_floating_point()), torch.float32)
    if isinstance(dtype, str):
        resolved = getattr(torch, dtype, None)
        if not isinstance(resolved, torch.dtype) or not resolved.is_floating_point:
            raise BertkitError(f"dtype {dtype!r} is not a torch floating-point dtype; use e.g. 'float32', "
                               "'bfloat16', 'float16' or 'auto'")
        return resolved
    return dtype


class LoadReport(NamedTuple):
    """What ``load_published_state_dict`` did with a checkpoint's tensors, under the model's names."""

    loaded: set[str]
    fresh: set[str]  # not in the checkpoint: initialised afresh (a new head, an absent pooler)
    ignored: set[str]  # in the checkpoint, not this model's: another head's weights
    mismatched: set[tuple[str, torch.Size, torch.Size]]  # (name, file shape, model shape), re-initialised

    def info(self) -> dict[str, Any]:
        """transformers' ``output_loading_info`` dict."""
        return {"missing_keys": set(self.fresh), "unexpected_keys": set(self.ignored),
                "mismatched_keys": set(self.mismatched), "error_msgs": []}


# ---------------------------------------------------------------------------------------------------
# The mixin every bertkit model inherits
# ---------------------------------------------------------------------------------------------------


class PretrainedMixin(TransformersModelCalls):
    """``from_pretrained`` / ``save_pretrained`` for ``BertModel`` and every head model (encoder in ``self.bert``).

    A head's checkpoint keys are the names of the modules it builds; ``output_names`` are the output fields an
    exported graph returns."""

    config: BertConfig
    # The output tensors of an exported graph, in tuple order, under transformers' names (inference/export.py).
    output_names: ClassVar[tuple[str, ...]]
    saved_num_labels: ClassVar[int | None] = None  # a head's fixed width transformers sizes by num_labels (span QA)

    # -- the keys this model owns ---------------------------------------------------------------------
    def _encoder(self):
        return getattr(self, "bert", self)

    def _published_keys(self) -> tuple[list[str], list[str]]:
        """(encoder keys, head keys): this model's published weight names (tied copies left out)."""
        enc = self._encoder()
        if enc is self:
            base = _ENCODER + _LAYER + (_POOLER if self.pooler is not None else [])  # type: ignore[attr-defined]
            return _expand(base, self.config.num_hidden_layers), []
        encoder_keys = ["bert." + k for k in enc._published_keys()[0]]
        own = self.state_dict(keep_vars=True)  # type: ignore[attr-defined]  # views: no tied-decoder copy
        return encoder_keys, [k for k in own if not k.startswith("bert.") and k not in TIED_KEYS]

    # -- loading --------------------------------------------------------------------------------------
    @classmethod
    def from_pretrained(cls, path: str | Path | None, *, config: BertConfig | None = None,
                        state_dict: dict[str, Tensor] | None = None, dtype: torch.dtype | str | None = None,
                        device: torch.device | str | None = None, attn_implementation: str | None = None,
                        add_pooling_layer: bool | None = None, ignore_mismatched_sizes: bool = False,
                        output_loading_info: bool = False, **config_overrides: Any):
        """Build the model from a Hugging Face-layout directory (or Hub id, ``bertkit.hub``), in eval mode, as
        transformers does.

        Keywords that are ``BertConfig`` fields override the stored config (or a copy of ``config=``); any other
        is an error. ``state_dict`` replaces the directory's weights, with the same checks (``path`` may then be
        None). ``dtype`` (a dtype, its name or ``"auto"``) and ``device`` place the model; ``attn_implementation``
        is ``"sdpa"`` (default) or ``"eager"``; ``ignore_mismatched_sizes=True`` re-initialises head weights of
        another shape (another label count), logging which. ``output_loading_info=True`` returns ``(model, info)``
        as transformers does: ``info`` holds the sets ``missing_keys`` (initialised fresh: not in the checkpoint),
        ``unexpected_keys`` (in the checkpoint, left out: another head's), ``mismatched_keys`` ((name, file shape,
        model shape), re-initialised under ``ignore_mismatched_sizes``) and an empty ``error_msgs`` list (bertkit
        raises instead).
        """
        if torch.get_default_device().type == "meta":  # else torch's "Tensor on device cpu is not on the expected
            # device meta!" from deep inside loading, or "Cannot copy out of meta tensor" from a pipeline
            raise BertkitError("from_pretrained loads weights, and torch's default device is 'meta' (set by "
                               "torch.set_default_device('meta') or `with torch.device('meta'):`), whose tensors hold "
                               "no values: load outside it, or build an empty model for its shapes there with "
                               "AutoModel.from_config(config)")
        local_files_only = refuse_hub_options(path, config_overrides)
        dtype = dtype_argument(dtype, config_overrides)
        if attn_implementation is not None:
            check_attn_implementation(attn_implementation)
        BertConfig.check_overrides(config_overrides)
        directory = _checkpoint_directory(path, config, state_dict, local_files_only)
        if config is None:
            config = BertConfig.from_json_file(directory / CONFIG_NAME, **config_overrides)
        elif config_overrides:
            config = BertConfig.from_dict(config.to_dict(), **config_overrides)
        source = "state_dict" if state_dict is not None else str(directory)
        weights = state_dict if state_dict is not None else read_weights(directory)
        check_config_fits_weights(config, weights, source)
        if add_pooling_layer is not None and "add_pooling_layer" not in inspect.signature(cls).parameters:
            raise BertkitError(f"add_pooling_layer is a BertModel argument; {cls.__name__} decides its pooler")
        with building_to_load():
            model = cls(config) if add_pooling_layer is None else cls(config, add_pooling_layer=add_pooling_layer)
        # The constructor makes its parameters in torch's default dtype, which a caller's
        # torch.set_default_dtype(torch.bfloat16 / float64) changes: loading into those would round the weights to
        # bf16 (or hand back a float64 model), where the default is float32 (as transformers 5 loads a float32
        # checkpoint under any default dtype). The empty parameters are cast before loading, not the loaded ones.
        model.to(dtype=torch.float32)  # type: ignore[attr-defined]
        report = model.load_published_state_dict(weights, source=source, ignore_mismatched_sizes=ignore_mismatched_sizes)
        model._initialise_unloaded(report.loaded)
        if path is not None:  # (None: weights from state_dict=)
            # transformers' attribute (peft writes it to adapter_config.json), and its config's
            model.name_or_path = config.name_or_path = str(path)
        if attn_implementation is not None:
            model.set_attn_implementation(attn_implementation)
        dtype = resolve_dtype(dtype, weights, config)
        if dtype is not None or device is not None:
            model.to(device=device, dtype=dtype)  # type: ignore[attr-defined]
        model.eval()  # type: ignore[attr-defined]
        return (model, report.info()) if output_loading_info else model

    def load_published_state_dict(self, published: dict[str, Tensor], source: str = "state dict", *,
                                  ignore_mismatched_sizes: bool = False) -> LoadReport:
        """Load weights under the published names (with or without ``bert.``); returns what was loaded and what
        was not. ``ignore_mismatched_sizes``: a head weight of another shape stays fresh, with a warning."""
        tensors = _canonical(published, "bert." if self._encoder() is not self else "")
        encoder_keys, head_keys = self._published_keys()
        heads = set(head_keys)
        own = self.state_dict(keep_vars=True)  # type: ignore[attr-defined]  # views: no tied-decoder copy
        new_state: dict[str, Tensor] = {}
        fresh: list[str] = []
        mismatched: list[tuple[str, torch.Size, torch.Size]] = []
        missing, shapes, not_float, nonfinite = [], [], [], []
        for key in encoder_keys + head_keys:
            value, model = tensors.get(key), own[key]
            if value is None:  # a head, or the pooler (MLM-only checkpoints lack it), starts fresh; the encoder may not
                (fresh if key in heads or key.startswith(("pooler.", "bert.pooler.")) else missing).append(key)
            elif value.shape != model.shape and ignore_mismatched_sizes and key in heads:
                mismatched.append((key, value.shape, model.shape))
            elif value.shape != model.shape:
                shapes.append(f"{key}: file {tuple(value.shape)}, model {tuple(model.shape)}")
            elif model.is_floating_point() and not value.is_floating_point():
                not_float.append(f"{key}: {str(value.dtype).removeprefix('torch.')}")
            elif (bad := nonfinite_count(key, value)) is not None:
                nonfinite.append(bad)
            else:
                new_state[key] = value
        untied = self._untied_decoder(tensors)
        used = set(encoder_keys) | heads
        leftovers = sorted(k for k in tensors if k not in used and _strip_encoder_prefix(k) not in IGNORED_KEYS)
        unknown = [k for k in leftovers if self._is_unexpected(k)]
        other_heads = [k for k in leftovers if k not in unknown]

        def some(found: list[str]) -> str:
            return f"{found[:5]}" + (f" and {len(found) - 5} more" if len(found) > 5 else "")

        problems = [f"{what}: {found if full else some(found)}{why}" for what, found, full, why in (
            ("missing keys", missing, True, ""),
            ("unexpected keys", unknown, True, _outside_bert_hint(unknown)),
            ("shape mismatches", shapes, True,
             f" (the config says hidden_size={self.config.hidden_size}, num_hidden_layers="
             f"{self.config.num_hidden_layers}, vocab_size={self.config.vocab_size}, num_labels="
             f"{self.config.num_labels}; fix config.json or pass matching overrides, or ignore_mismatched_sizes=True "
             "to start mismatched head weights afresh)"),
            ("weights that are not floating-point", not_float, False,
             " (a model's weights are float32, float16 or bfloat16; the file was not written from a model's state "
             "dict, or was cast: save it again from the model)"),
            ("weights holding NaN or infinite values", nonfinite, False,
             " (the file is damaged or was saved from a diverged run: load an earlier checkpoint)"),
            ("a masked-LM decoder other than the tied one", untied, True,
             " (saved with tie_word_embeddings false: bertkit's masked-LM head is tied to the word embeddings, as "
             "BERT's is, so its logits would not be this checkpoint's; load the encoder or a task head from it, "
             "which leaves the decoder out)")) if found]
        if problems:
            raise BertkitError(f"{source} does not match {type(self).__name__}: " + "; ".join(problems))
        if fresh or mismatched:
            logger.warning("%s: initialised fresh (not in %s): %s", type(self).__name__, source, ", ".join(
                [*fresh, *(f"{key} (file {tuple(file)}, model {tuple(model)})" for key, file, model in mismatched)]))
        if other_heads:
            logger.info("%s: ignored weights of heads this model does not have: %s", type(self).__name__,
                        ", ".join(other_heads))
        result = torch.nn.Module.load_state_dict(self, new_state, strict=False)  # type: ignore[arg-type]
        assert not result.unexpected_keys, result.unexpected_keys
        # the tied decoder's names (in the state dict, as in transformers') are as fresh as what they are tied to
        fresh += [key for key, source in self._tied_to().items() if key in own and source in fresh]
        return LoadReport(set(new_state), set(fresh), set(other_heads), set(mismatched))

    def _untied_decoder(self, tensors: dict[str, Tensor]) -> list[str]:
        """The decoder tensors a checkpoint stores that differ from what the tied masked-LM head computes with (the
        word embeddings, cls.predictions.bias); only for a model with that head."""
        own = dict(self.named_parameters())  # type: ignore[attr-defined]
        if "cls.predictions.bias" not in own:
            return []
        return [f"{key} differs from {source}" for key, source in self._tied_to().items()
                if key in tensors and source in tensors and not torch.equal(tensors[key], tensors[source])]

    def _tied_to(self) -> dict[str, str]:
        """The masked-LM decoder's names and the names of what each is tied to."""
        prefix = "bert." if self._encoder() is not self else ""
        return dict(zip(TIED_KEYS, (prefix + "embeddings.word_embeddings.weight", "cls.predictions.bias")))

    def _is_unexpected(self, key: str) -> bool:
        """Whether a key this model does not load is an error (not a published encoder name, a weight its own
        module lacks, or under no BERT head) rather than another head's or an absent pooler's, dropped."""
        bare = _strip_encoder_prefix(key)
        if bare.startswith(("embeddings.", "encoder.", "pooler.")):
            return bare not in _expand(_ENCODER + _LAYER + _POOLER, self.config.num_hidden_layers)
        parent = key.rpartition(".")[0]
        return parent in dict(self.named_modules()) or not key.startswith(FAMILY_HEADS)  # type: ignore[attr-defined]

    def _init_weights(self, module: torch.nn.Module, keep: Container[str] = ()) -> None:
        """Draw one module's initial weights (its own parameters, not its children's), those named in ``keep``
        left as they are."""
        raise NotImplementedError

    def _initialise_unloaded(self, loaded: set[str], *, built: bool = False) -> None:
        """Initialise, as transformers does, every parameter not in ``loaded`` (one the checkpoint left unset, or a
        new head's), module by module in module order: the same seed gives transformers' weights and leaves torch's
        generator where it does. ``built``: the model was just constructed (transformers' from-config path), whose
        masked-LM decoder draws a weight of its own there before it is tied to the word embeddings."""
        for prefix, module in self.named_modules():  # type: ignore[attr-defined]
            own = {name: f"{prefix}.{name}" if prefix else name for name, _ in module.named_parameters(recurse=False)}
            if prefix == "cls.predictions.decoder":  # its weight is the word embeddings', its bias the head's
                if built:  # transformers' normal draw for the decoder's own weight, thrown away at tie_weights
                    torch.empty_like(module.weight).normal_(0.0, self.config.initializer_range)
                continue
            keep = {name for name, full in own.items() if full in loaded}
            if len(keep) < len(own):
                self._init_weights(module, keep)

    def load_state_dict(self, state_dict: Any, strict: bool = True, assign: bool = False):
        """``nn.Module.load_state_dict`` (transformers' names, as ``state_dict()`` gives them; a checkpoint's go
        through ``from_pretrained(state_dict=...)``), tying the MLM decoder again after ``assign=True``."""
        result = super().load_state_dict(state_dict, strict=strict, assign=assign)  # type: ignore[misc]
        if assign and (mlm := self._mlm_head()) is not None:  # the parameters are the state dict's tensors now
            mlm.tie(self.get_input_embeddings())
        return result

    def train(self, mode: bool = True):
        # nn.Module.train switches the modules one by one: a module that refuses training (the projections of an
        # int8 model or of the inference copy) refuses before any is switched; refused after the embeddings, it left
        # their dropout on for every later call of the copy
        if mode:
            for module in self.modules():  # type: ignore[attr-defined]
                refuse = getattr(module, "refuse_training", None)
                if refuse is not None:
                    refuse()
        return super().train(mode)  # type: ignore[misc]

    # -- saving ---------------------------------------------------------------------------------------
    def _apply(self, fn: Any, recurse: bool = True):
        # .to(), .half(), .double(), .cuda() convert the children one by one: a module that cannot follow (the
        # inference copy's prepared projections) refuses before any parameter is converted, not after the embeddings
        for module in self.modules():  # type: ignore[attr-defined]
            refuse = getattr(module, "refuse_conversion", None)
            if refuse is not None:
                refuse(fn)
        return super()._apply(fn, recurse)  # type: ignore[misc]

    def published_state_dict(self) -> dict[str, Tensor]:
        """The weights as a checkpoint holds them: without the tied decoder's copies, contiguous, on the CPU."""
        refuse_layers_unlike_config(self, self._encoder())
        own = self.state_dict(keep_vars=True)  # type: ignore[attr-defined]  # views: no tied-decoder copy
        encoder_keys, head_keys = self._published_keys()
        absent = [key for key in encoder_keys + head_keys if key not in own]
        transformed = [why for key in absent if (why := weight_transform(self, key)) is not None]
        if transformed:  # transformers writes weight_orig/weight_mask there, which loading drops: the pruned weight lost
            raise BertkitError(f"{type(self).__name__} cannot be saved as a checkpoint while {transformed[0]}"
                               f"{f' (and {len(transformed) - 1} more)' if len(transformed) > 1 else ''}: a "
                               "checkpoint holds each weight as one tensor. Make the transform permanent first "
                               "(that call writes the weight it computes into the module), then save")
        if absent:
            raise BertkitError(f"{type(self).__name__} has no float {', '.join(absent[:3])}"
                               f"{f' (and {len(absent) - 3} more)' if len(absent) > 3 else ''}: its projections are "
                               "not float weights. An int8 model: save it with bertkit.quantization.save_int8 (or "
                               "`bertkit quantize` from the float checkpoint). The inference copy that "
                               "optimize_for_inference, prepare_model and pipelines make: save the model it was made "
                               "from. save_pretrained writes float checkpoints")
        return {key: own[key].detach().contiguous().cpu() for key in encoder_keys + head_keys}

    def save_pretrained(self, path: str | Path, **transformers_options: Any) -> Path:
        """Write config.json and model.safetensors; returns the directory. The directory is written beside
        ``path`` and moved into place whole (``bertkit.staging.staged``): a kill or a full disk leaves what was
        there before. transformers' keywords are taken at its defaults (``SAVE_OPTIONS``), where they ask for what
        this save does; another value is refused, naming what to do instead."""
        refuse_options("save_pretrained", transformers_options, SAVE_OPTIONS)
        directory = given_path(path, "the directory to save into")
        refuse_save_beside_other_kind(directory, int8=False)
        config = self.config.to_dict()
        config["architectures"] = [type(self).__name__]
        if self.saved_num_labels not in (None, self.config.num_labels):  # a span head loaded from an MNLI checkpoint
            names = [f"LABEL_{i}" for i in range(self.saved_num_labels)]  # (keeps 3 labels in memory)
            config.update(id2label={str(i): n for i, n in enumerate(names)}, label2id={n: i for i, n in enumerate(names)})
        # transformers 5 loads a checkpoint in config.json's dtype (its default dtype="auto"): the weights' own, not
        # the one a loaded config.json named (a bf16 checkpoint loaded as float32 would be read back as bf16).
        config.pop("torch_dtype", None)  # transformers 4's name for it
        config["dtype"] = str(self.dtype).removeprefix("torch.")  # type: ignore[attr-defined]
        # The masked-LM decoder is the word embeddings, never written (TIED_KEYS): a tie_word_embeddings false kept
        # from the config of an untied checkpoint's encoder would have transformers draw the decoder afresh.
        config.pop("tie_word_embeddings", None)
        from safetensors.torch import save_file

        state = self.published_state_dict()
        nonfinite = [bad for k, v in state.items() if (bad := nonfinite_count(k, v)) is not None]
        if nonfinite:  # from_pretrained refuses them: the save would replace what is at `directory` with a dead end
            raise NonFiniteError(f"{type(self).__name__} holds NaN or infinite weights, {nonfinite[:3]}"
                                 f"{f' and {len(nonfinite) - 3} more' if len(nonfinite) > 3 else ''}, which loading "
                                 "refuses; nothing was written (a diverged run?): save a model whose weights are "
                                 "finite, or keep the last checkpoint that was")
        # job_of: under torchrun a script's unguarded save runs on every rank, as transformers' scripts call it
        with staged(directory, shared_by=job_of()) as out, atomic_target(out / WEIGHTS_NAME) as tmp:
            save_file(state, str(tmp), metadata={"format": "pt"})
            atomic_write_text(out / CONFIG_NAME, json.dumps(config, indent=2, sort_keys=True) + "\n")
        return directory


_RANKS = ("under torchrun every rank may call it, as transformers' scripts do: the first writes the directory and the "
          "others wait and leave it as written (docs/distributed.md); or call it on rank 0 alone")
# transformers' save_pretrained keywords: (its default, which asks for what bertkit's save does; what to do instead)
SAVE_OPTIONS: dict[str, tuple[Any, str]] = {
    "is_main_process": (True, _RANKS),
    "state_dict": (None, "load it into the model first (model.load_state_dict(state_dict)), then save the model"),
    "push_to_hub": (False, "save, then upload the directory with huggingface_hub's upload_folder"),
    "max_shard_size": ("50GB", "bertkit writes one model.safetensors (from_pretrained reads transformers' shards)"),
    "variant": (None, "bertkit writes model.safetensors under its plain name"),
    "token": (None, "save, then upload the directory with huggingface_hub's upload_folder"),
    "save_peft_format": (True, "save a peft model with peft's own save_pretrained"),
    "save_original_format": (True, "bertkit writes BERT's published key names, the original format"),
    "distributed_checkpoint": (False, _RANKS),
    "safe_serialization": (True, "bertkit writes safetensors only (transformers 5 too)"),
}


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
