"""Checkpoints in the Hugging Face layout: the published names, strict loading, safe saving.

A checkpoint directory holds ``config.json`` and ``model.safetensors`` (or transformers' older
``pytorch_model.bin``, read only with ``torch.load(weights_only=True)``; either may be shards with an
``.index.json``, as ``save_pretrained(max_shard_size=...)`` writes them). bertkit's modules carry the published
names, so a state dict is a checkpoint's as it is; the only renames are the published formats' own: the
``bert.`` prefix, TF-era ``LayerNorm.gamma``/``beta`` and the tied decoder's copies (``bertkit.checkpoint_keys``, the
key table).

Loading is strict: a missing key, a key belonging to none of the model's modules, a shape that does not fit
the config, a weight that is not floating-point or holds NaN/inf, one weight stored under two of its names with
different values is an error listing every such key. Logged,
not errors: a task head (or pooler) absent from a pre-trained checkpoint is initialised fresh, and weights of
BERT heads the model does not have (``bert-base-uncased``'s pre-training heads under a classifier) are dropped.
What is refused before loading (a config unlike the weights) or saving (a pruned weight, NaN) is
``bertkit.checkpoint_checks``'s; saving writes the directory whole (``bertkit.staging.staged``).
"""

from __future__ import annotations

import inspect
import json
import logging
from collections.abc import Container
from pathlib import Path
from typing import Any, ClassVar, NamedTuple

import torch
from torch import Tensor

from bertkit._parallel import job_of
from bertkit.checkpoint_checks import (
    check_config_fits_weights,
    nonfinite_count,
    outside_bert_hint,
    refuse_layers_unlike_config,
    weight_transform,
)
from bertkit.checkpoint_keys import (
    ENCODER_KEYS,
    FAMILY_HEADS,
    IGNORED_KEYS,
    LAYER_KEYS,
    POOLER_KEYS,
    TIED_KEYS,
    canonical_key,
    canonical_tensors,
    expand_keys,
    normalise_published_key,
    strip_encoder_prefix,
)
from bertkit.compat import TransformersModelCalls, check_attn_implementation
from bertkit.config import BertConfig
from bertkit.construction import building_to_load
from bertkit.errors import BertkitError, NonFiniteError, given_path, refuse_options
from bertkit.hub import not_a_directory, refuse_hub_options, resolve_directory
from bertkit.outputs import atomic_target, atomic_write_text
from bertkit.staging import staged
from bertkit.weight_files import CONFIG_NAME, WEIGHTS_NAME, read_weights, refuse_save_beside_other_kind

logger = logging.getLogger("bertkit")


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
            base = ENCODER_KEYS + LAYER_KEYS + (POOLER_KEYS if self.pooler is not None else [])  # type: ignore[attr-defined]
            return expand_keys(base, self.config.num_hidden_layers), []
        encoder_keys = ["bert." + k for k in enc._published_keys()[0]]
        own = self.state_dict(keep_vars=True)  # type: ignore[attr-defined]  # views: no tied-decoder copy
        return encoder_keys, [k for k in own if not k.startswith("bert.") and k not in TIED_KEYS]

    # -- loading --------------------------------------------------------------------------------------
    @classmethod
    def from_pretrained(cls, path: str | Path | None, *, config: BertConfig | None = None,
                        state_dict: dict[str, Tensor] | None = None, dtype: torch.dtype | str | None = None,
                        device: torch.device | str | None = None, attn_implementation: str | None = None,
                        add_pooling_layer: bool | None = None, ignore_mismatched_sizes: bool = False,
                        output_loading_info: bool = False, use_safetensors: bool | None = None,
                        **config_overrides: Any):
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
        raises instead). ``use_safetensors`` is transformers': True reads ``model.safetensors`` (or its shards)
        only, False ``pytorch_model.bin`` only, None (default) safetensors first.
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
        weights = state_dict if state_dict is not None else read_weights(directory, use_safetensors)
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
        prefix = "bert." if self._encoder() is not self else ""
        tensors = canonical_tensors(published, prefix, source)
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
        leftovers = sorted(k for k in tensors if k not in used and strip_encoder_prefix(k) not in IGNORED_KEYS)
        unknown = [k for k in leftovers if self._is_unexpected(k)]
        # reported under the file's encoder prefix, as transformers reports them: a bare encoder's pooler left out of
        # a head model is pooler.dense.weight, not bert.pooler.dense.weight
        in_file = {canonical_key(k, prefix): normalise_published_key(k) for k in published}
        other_heads = [in_file.get(k, k) for k in leftovers if k not in unknown]

        def some(found: list[str]) -> str:
            return f"{found[:5]}" + (f" and {len(found) - 5} more" if len(found) > 5 else "")

        problems = [f"{what}: {found if full else some(found)}{why}" for what, found, full, why in (
            ("missing keys", missing, True, ""),
            ("unexpected keys", unknown, True, outside_bert_hint(unknown)),
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
        bare = strip_encoder_prefix(key)
        if bare.startswith(("embeddings.", "encoder.", "pooler.")):
            return bare not in expand_keys(ENCODER_KEYS + LAYER_KEYS + POOLER_KEYS, self.config.num_hidden_layers)
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
