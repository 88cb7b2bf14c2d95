"""sentence-transformers' ``models`` (``from sentence_transformers import models``): ``Transformer``, ``Pooling`` and
``Normalize``, with ``Dense`` layers between the last two, the modules a ``SentenceTransformer`` is assembled from, as
a training script builds a new embedder:

    word = models.Transformer("path/to/bert", max_seq_length=256)
    pool = models.Pooling(word.get_word_embedding_dimension(), pooling_mode="cls")
    dense = models.Dense(pool.get_sentence_embedding_dimension(), 128, activation_function=torch.nn.Tanh())
    model = SentenceTransformer(modules=[word, pool, dense, models.Normalize()])

They are the model's modules (the Transformer holds the encoder and its tokenizer, a Dense its weights, which the
model trains): ``SentenceTransformer`` is the one model, whether assembled from them or loaded from a directory,
which it reads into these same modules, and holds them as sentence-transformers' does (``model[0]``, ``model[1]``,
...; ``Indexed``). Every other module of sentence-transformers is refused by name, on first use.
"""

from __future__ import annotations

import json
import logging
import operator
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from bertkit.errors import (
    BertkitError,
    MissingFileError,
    NotImplementedInBertkit,
    given_path,
    is_whole,
    refusing_getattr,
)
from bertkit.hub import SBERT_CONFIG, cache_hint
from bertkit.modeling import BertModel
from bertkit.outputs import atomic_target, atomic_write_json
from bertkit.sentence.calls import check_features
from bertkit.sentence.directory import tokenizer_limit, transformer_max_seq_length
from bertkit.sentence.finite import unit_length
from bertkit.sentence.pooling import Pooling as PoolingSettings
from bertkit.tokenization import AutoTokenizer
from bertkit.weight_files import read_weights

# transformers' from_pretrained keywords that sentence-transformers' model_kwargs carries and bertkit's takes
_MODEL_KWARGS = ("dtype", "torch_dtype", "attn_implementation")
logger = logging.getLogger("bertkit")


def warn_saved_half(path: Path, options: dict[str, Any], config: Any, fix: str) -> None:
    """Warn where ``path``'s weights were saved in float16 or bfloat16 (config.json's ``dtype``) and no dtype was asked
    for (``options``, the model_kwargs): bertkit computes them in float32, sentence-transformers 6 in the saved type
    (transformers 5 loads with dtype="auto"). A model given model_kwargs={"dtype": torch.bfloat16} and saved came back
    in float32 without a word, its vectors 8e-3 from those before the save and from sentence-transformers' on the
    same directory. ``fix``: how the caller computes in the saved type, as there."""
    saved = config.extra.get("dtype") or config.extra.get("torch_dtype")
    if saved in ("float16", "bfloat16") and options.get("dtype", options.get("torch_dtype")) is None:
        logger.warning("%s was saved in %s and is computed in float32, where sentence-transformers 6 computes it in "
                       "%s: the vectors and scores differ by %s rounding; %s to compute in %s as there", path, saved,
                       saved, saved, fix, saved)


def model_kwargs_options(what: str, model_kwargs: dict[str, Any] | None) -> dict[str, Any]:
    """sentence-transformers' ``model_kwargs`` as keywords of bertkit's ``from_pretrained``: ``dtype`` (its older
    name ``torch_dtype``, ``"auto"``) and ``attn_implementation``; any other key is refused by name. Refused whole,
    ``{"torch_dtype": torch.bfloat16}`` had the script drop it and embed in float32, where sentence-transformers
    embeds in bf16."""
    if model_kwargs is None:
        return {}
    if not isinstance(model_kwargs, Mapping):
        raise BertkitError(f"{what}(model_kwargs=...) takes a dict, got {type(model_kwargs).__name__}")
    other = sorted(str(k) for k in model_kwargs if k not in _MODEL_KWARGS)
    if other:
        raise BertkitError(f"{what}(model_kwargs=...) sets {other}, which bertkit does not implement: it takes "
                           f"{', '.join(_MODEL_KWARGS)} there; drop the others")
    return dict(model_kwargs)


# sentence-transformers 6's Transformer arguments beyond the named ones: read as its sentence_bert_config.json keys
_SETTINGS = {"transformer_task", "model_kwargs", "processor_kwargs", "config_kwargs", "processing_kwargs",
             "modality_config", "module_output_name", "unpad_inputs", "query_length", "document_length",
             "query_expansion"}
# sentence-transformers 6's older argument names, which it renames (the new name wins where both are given)
_RENAMED = {"model_args": "model_kwargs", "tokenizer_args": "processor_kwargs", "config_args": "config_kwargs"}


def adapter_base(config_file: Path) -> str:
    """The base checkpoint a peft adapter's config names (for the refusal to load it)."""
    try:
        return str(json.loads(config_file.read_text()).get("base_model_name_or_path") or "an unnamed base")
    except (OSError, ValueError, AttributeError):
        return "a base it does not name"


def refuse_adapter(path: Path, loader: str, wrapped: str) -> None:
    """Refuse ``path`` when it holds a peft adapter (adapter_config.json, no config.json) over a base checkpoint, as
    sentence-transformers (and bertkit's save of a model whose encoder peft wraps) writes it: the one refusal of
    every encoder class, which said "config.json does not exist" before. ``loader`` is what loads the base
    (``SentenceTransformer(base)``), ``wrapped`` the module of it that peft wraps (``model.bert``)."""
    if (path / "adapter_config.json").is_file() and not (path / "config.json").is_file():
        base = adapter_base(path / "adapter_config.json")
        raise BertkitError(f"{path} holds a peft adapter (adapter_config.json) over {base}, not a whole encoder; "
                           f"bertkit loads no adapters: load the base ({loader}), wrap its encoder with peft's "
                           f"PeftModel.from_pretrained({wrapped}, this directory), merge_and_unload() it, and save")


# What PyTorch's own module transforms set on every module they walk (torch.ao.quantization's quantize_dynamic and
# prepare), read back by them, so never a forgotten setting.
_TORCH_MODULE_ATTRIBUTES = frozenset({"qconfig"})


class Transformer(nn.Module):
    """A BERT encoder (``model``, also ``auto_model``: bertkit's ``BertModel``) and its tokenizer; ``max_seq_length``
    (where texts are cut: the tokenizer's model_max_length, as there) and ``do_lower_case``. A model's ``model[0]``,
    module "0", so its parameters have sentence-transformers 6's names (``0.model.embeddings.…``), and what is set on
    it (``model[0].max_seq_length = 256``, ``model[0].auto_model = peft_model``) is what the model runs. Arguments as
    sentence-transformers 6's: ``model_kwargs`` (``model_args``) takes dtype and attn_implementation,
    ``config_kwargs`` (``config_args``) the config's fields (``{"hidden_dropout_prob": 0.0}``), ``processor_kwargs``
    (``tokenizer_args``) model_max_length, which wins over max_seq_length; what would change a vector and bertkit
    does not apply is refused by name, as the same keys in a directory's sentence_bert_config.json are
    (``transformer_max_seq_length``)."""

    # what sentence_bert_config.json holds beside max_seq_length and do_lower_case (a dense model's file, none)
    task_keys: ClassVar[dict[str, Any]] = {}

    def __init__(self, model_name_or_path: str | Path, *, max_seq_length: int | None = None,
                 do_lower_case: bool = False, cache_dir: str | None = None, backend: str = "torch",
                 tokenizer_name_or_path: str | None = None, **settings: Any):
        super().__init__()
        for old, new in _RENAMED.items():
            if old in settings:
                settings.setdefault(new, settings[old])
                del settings[old]
        unknown = sorted(set(settings) - _SETTINGS)
        if unknown:
            raise BertkitError(f"models.Transformer got unknown arguments {unknown}")
        if not isinstance(model_name_or_path, (str, os.PathLike)):
            raise BertkitError(f"models.Transformer takes the path of a local directory (a str or Path), got "
                               f"{type(model_name_or_path).__name__} {str(model_name_or_path)[:60]}")
        path = given_path(model_name_or_path, "models.Transformer's directory")
        if cache_dir is not None or backend != "torch" or tokenizer_name_or_path not in (None, model_name_or_path):
            raise BertkitError("models.Transformer(cache_dir=, backend=, tokenizer_name_or_path=) is not implemented "
                               "in bertkit: it loads the encoder and its own tokenizer from one local directory, in "
                               "PyTorch; drop these arguments")
        task = settings.get("transformer_task", "feature-extraction")
        if task != "feature-extraction":
            raise BertkitError(f"models.Transformer(transformer_task={task!r}): this is a SentenceTransformer's "
                               "(feature-extraction); a SparseEncoder's fill-mask Transformer is "
                               "bertkit.sentence.sparse_encoder.models.Transformer, a CrossEncoder loads with "
                               "CrossEncoder(path)")
        options = model_kwargs_options("models.Transformer", settings.pop("model_kwargs", None))
        config = settings.pop("config_kwargs", None) or {}
        given = f"models.Transformer({str(model_name_or_path)!r}, ...)"
        # the arguments read by the rule for sentence_bert_config.json's keys, which holds the same settings
        length = transformer_max_seq_length({**settings, "max_seq_length": max_seq_length}, given)
        refuse_adapter(path, "SentenceTransformer(base)", "model.bert")
        self.model = BertModel.from_pretrained(path, **options, **config)
        warn_saved_half(path, options, self.model.config, 'load it with model_kwargs={"dtype": "auto"}')
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.max_seq_length = length if length is not None else min(self.tokenizer.model_max_length,
                                                                     self.model.config.max_position_embeddings)
        self.do_lower_case = bool(do_lower_case)

    max_seq_length = tokenizer_limit("max_seq_length", lambda module: module.model.config.max_position_embeddings)

    @property
    def auto_model(self) -> nn.Module:  # sentence-transformers' name: model[0].auto_model = peft_model
        return self.model

    def __setattr__(self, name: str, value: Any) -> None:
        if name in ("model", "auto_model"):
            if not isinstance(value, nn.Module):
                raise BertkitError(f"model[0].{name} takes the encoder, an nn.Module, got {type(value).__name__}")
            name = "model"  # registered under sentence-transformers 6's name, whichever name set it
        elif name == "do_lower_case":
            value = bool(value)
            tokenizer = self.__dict__.get("tokenizer")
            if ("do_lower_case" in self.__dict__ and value != self.do_lower_case
                    and not getattr(tokenizer, "do_lower_case", False)):
                # sentence-transformers 6 lowercases by adding Lowercase to its tokenizer as its Transformer is made:
                # set later, the flag changes nothing there until a save and a load, and then what it saved decides
                logger.warning("model[0].do_lower_case = %s: bertkit's encode %s from now on; sentence-transformers 6 "
                               "applies do_lower_case only as its Transformer is made, so the same assignment there "
                               "leaves its vectors as they were until the model is saved and loaded again. For the "
                               "same vectors in both, pass models.Transformer(path, do_lower_case=%s)", value,
                               "lowercases the texts" if value else "stops lowercasing the texts", value)
        elif name not in ("tokenizer", *_TORCH_MODULE_ATTRIBUTES) and not hasattr(type(self), name) \
                and name not in self.__dict__:
            # kept on this module, it would be a setting the model never reads (sentence-transformers' would not
            # either, but it keeps the value): refused rather than accepted and forgotten
            raise BertkitError(f"model[0].{name} is not a setting of bertkit's Transformer; it takes auto_model, "
                               "tokenizer, max_seq_length and do_lower_case")
        super().__setattr__(name, value)

    def save(self, directory: Path) -> None:
        """The encoder, its tokenizer and sentence_bert_config.json (``task_keys``, then the two settings), as
        sentence-transformers writes its Transformer's directory."""
        self.model.save_pretrained(directory)
        self.tokenizer.save_pretrained(directory)
        atomic_write_json(directory / SBERT_CONFIG, {**self.task_keys, "max_seq_length": self.max_seq_length,
                                                     "do_lower_case": self.do_lower_case})

    def tokenize(self, texts: list[str], prompt: str | None = None) -> dict[str, Tensor]:
        """The (B, T) batch of ``prompt`` + each text, lowercased where ``do_lower_case`` (per character, as
        sentence-transformers' Lowercase), cut at ``max_seq_length``."""
        texts = [(prompt or "") + t for t in texts]
        if self.do_lower_case:
            texts = [self.tokenizer.lowercase(t) for t in texts]
        return dict(self.tokenizer(texts, padding=True, truncation=True, max_length=self.max_seq_length,
                                   return_tensors="pt"))

    def forward(self, features: dict[str, Tensor], model: nn.Module | None = None) -> dict[str, Tensor]:
        """sentence-transformers' Transformer.forward (``model[0](features)``, the first step of ``model(features)``):
        ``features`` with ``token_embeddings`` (B, T, H), the encoder's last layer, added in place as there, and
        returned (and ``all_layer_embeddings`` where the encoder's config sets ``output_hidden_states``). ``model``:
        the encoder to run in place of this module's (``encode``'s copy made for CPU inference); the batch may still
        be on the host."""
        check_features(features, ("input_ids", "attention_mask"))
        out = (self.model if model is None else model)(features["input_ids"], features["attention_mask"],
                                                       features.get("token_type_ids"))
        features.update({"token_embeddings": out.last_hidden_state, **all_layer_embeddings(out)})
        return features

    def get_embedding_dimension(self) -> int:
        """The width of the token states: the encoder's hidden_size."""
        return self.model.config.hidden_size

    get_word_embedding_dimension = get_embedding_dimension  # sentence-transformers' name before 6

    def __repr__(self) -> str:  # sentence-transformers 5's (6 shows no max_seq_length, which bertkit's save writes)
        settings = {"max_seq_length": self.max_seq_length, "do_lower_case": self.do_lower_case,
                    "architecture": type(self.model).__name__}
        return f"Transformer({settings})"


# The names earlier versions gave the model's tensors, relative to the model (a SentenceTransformer's or a
# CrossEncoder's state dict; no name of one is a name of the other's), each with the name it has now
_FORMER_NAMES: tuple[tuple[re.Pattern[str], Callable[[re.Match[str]], str]], ...] = (
    (re.compile(r"0\.auto_model\."), lambda m: "0.model."),  # sentence-transformers 5's (6 reads none of them)
    (re.compile(r"bert\."), lambda m: "0.model."),  # bertkit's SentenceTransformer's encoder before its names were 6's
    (re.compile(r"dense\.(\d+)\."), lambda m: f"{int(m[1]) + 2}."),  # its Dense layers: dense.0 is module "2"
    (re.compile(r"model\."), lambda m: "0.model."),  # bertkit's CrossEncoder's classifier model, likewise
)


def renamed_former_names(state_dict: dict[str, Any], prefix: str) -> None:
    """The keys of ``state_dict`` under ``prefix`` that have a former name (``_FORMER_NAMES``) renamed, in place, to
    the present one: a state dict saved with ``torch.save(model.state_dict())``, and a trainer checkpoint's state.pt
    (``loss.model.bert.…``), written under those names load strictly, and a run resumes from it. A key whose present
    name the dict holds too is left as it is, for strict loading to name as unexpected."""
    for key in [k for k in state_dict if k.startswith(prefix)]:
        rest = key[len(prefix):]
        for pattern, present in _FORMER_NAMES:
            found = pattern.match(rest)
            if found:
                new = prefix + present(found) + rest[found.end():]
                if new not in state_dict:
                    state_dict[new] = state_dict.pop(key)
                break


def all_layer_embeddings(out: Any) -> dict[str, Any]:
    """sentence-transformers' Transformer output ``all_layer_embeddings``, the encoder's L + 1 layers (B, T, H), the
    embeddings' output first, where its config sets ``output_hidden_states`` (``out``: the encoder's or a head's
    output); nothing otherwise."""
    return {} if out.hidden_states is None else {"all_layer_embeddings": out.hidden_states}


def of_first_module(name: str) -> property:
    """The model's attribute that is ``model[0]``'s ``name``, read and set there, as sentence-transformers' models
    give their first module's ``tokenizer`` and ``max_seq_length``."""
    return property(lambda model: getattr(model[0], name), lambda model, value: setattr(model[0], name, value))


class Indexed:
    """sentence-transformers' models are Sequentials of modules that scripts index (``model[0].auto_model``,
    ``model[-1]``, ``len(model)``, ``for module in model``, ``_first_module()``); bertkit's hold theirs as the
    submodules "0", "1", ... (the Transformer, which owns the encoder and its tokenizer, then the Pooling, any Dense
    and Normalize), so ``model(features)`` runs them in turn and the state dict has sentence-transformers' names.
    Appending or replacing modules is not implemented (``ReferenceCalls``)."""

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, *args: Any) -> None:
        renamed_former_names(state_dict, prefix)  # before nn.Module's, which hands module "0" its keys after this
        super()._load_from_state_dict(state_dict, prefix, *args)  # type: ignore[misc]

    def __setattr__(self, name: str, value: Any) -> None:
        if isinstance(getattr(type(self), name, None), property):  # nn.Module would register a module as a child
            object.__setattr__(self, name, value)  # the property's setter: model.bert = peft_model sets model[0]'s
        else:
            super().__setattr__(name, value)

    def __getitem__(self, index: Any) -> Any:
        name = type(self).__name__
        if isinstance(index, slice):
            # sentence-transformers' Sequential builds a new model from the slice (and 6.2 fails doing so); here a
            # model without its Transformer or Pooling does not exist
            raise NotImplementedInBertkit(f"model[{index!r}]: slicing a {name} is not implemented in bertkit: its "
                                          "modules are fixed; build another from bertkit.sentence.models' modules")
        modules = list(self)
        try:
            i = operator.index(index)
        except TypeError:
            raise TypeError(f"model[{index!r}]: a {name}'s modules are indexed by position, a whole number in "
                            f"[-{len(modules)}, {len(modules) - 1}]") from None
        if not -len(modules) <= i < len(modules):
            kinds = ", ".join(type(m).__name__ for m in modules)
            raise IndexError(f"index {i} is out of range: this model has {len(modules)} modules ({kinds})")
        return modules[i]

    def forward(self, features: dict[str, Any]) -> dict[str, Any]:
        """sentence-transformers' ``model(features)``, its Sequential's: each module in turn (``model[0]``, the
        Pooling, the Dense layers, Normalize) adds its outputs to ``features``, in place, and the features are returned
        (``token_embeddings`` (B, T, H) and ``sentence_embedding`` (B, D) in the encoder's type; a cross-encoder's
        ``scores``). Padding positions of ``token_embeddings`` hold zeros where the encoder ran unpadded
        (sentence-transformers': the states computed there, which no pooling reads)."""
        for module in self:
            features = module(features)
        return features

    def __len__(self) -> int:  # at least 1, so that `if model:` stays true
        return len(self._modules)  # type: ignore[attr-defined]

    def __iter__(self) -> Iterator[Any]:
        return iter(self._modules.values())  # type: ignore[attr-defined]

    def _first_module(self) -> Transformer:
        return self[0]

    def _last_module(self) -> Any:
        return self[-1]


def Pooling(embedding_dimension: int | None = None, pooling_mode: str | tuple[str, ...] | list[str] | None = None,
            include_prompt: bool = True, *, word_embedding_dimension: int | None = None,
            **legacy_modes: bool) -> PoolingSettings:
    """The pooling settings (``bertkit.sentence.pooling.Pooling``) from sentence-transformers 6's arguments:
    ``pooling_mode`` a mode or a list of them (concatenated in that order; default "mean"), or the older booleans
    (``pooling_mode_cls_token=True``: the modes set True, in sentence-transformers' order, "mean" where none is),
    which ``pooling_mode`` wins over, as there. The modes bertkit does not implement are refused by name."""
    dim = embedding_dimension if embedding_dimension is not None else word_embedding_dimension
    if not is_whole(dim):
        raise BertkitError(f"models.Pooling's embedding_dimension must be a whole number >= 1 (the encoder's "
                           f"hidden_size: word.get_word_embedding_dimension()), got {dim!r}")
    unknown = sorted(k for k in legacy_modes if not k.startswith("pooling_mode_"))
    if unknown:
        raise BertkitError(f"models.Pooling got unknown arguments {unknown}")
    if isinstance(pooling_mode, tuple):  # a config file's list
        pooling_mode = list(pooling_mode)
    return PoolingSettings.from_config({"embedding_dimension": dim, "pooling_mode": pooling_mode,
                                        "include_prompt": include_prompt, **legacy_modes}, "models.Pooling(...)")


class Normalize(nn.Module):
    """Unit-length sentence embeddings: the last module of a ``SentenceTransformer``."""

    def __init__(self, module_input_name: str = "sentence_embedding", module_output_name: str | None = None):
        super().__init__()
        if module_input_name != "sentence_embedding" or module_output_name not in (None, module_input_name):
            raise BertkitError(f"models.Normalize(module_input_name={module_input_name!r}, module_output_name="
                               f"{module_output_name!r}) is not implemented in bertkit: it normalises the sentence "
                               "embedding (token embeddings are a multi-vector model's); drop these arguments")

    def __repr__(self) -> str:
        return f"Normalize({ {'module_input_name': 'sentence_embedding', 'module_output_name': 'sentence_embedding'} })"

    def forward(self, features: dict[str, Any]) -> dict[str, Any]:
        """sentence-transformers' Normalize.forward (``model[-1](features)``): the features' ``sentence_embedding``
        scaled to unit length, in place (features without one are returned as they are, as there)."""
        if features.get("sentence_embedding") is not None:
            features["sentence_embedding"] = unit_length(features["sentence_embedding"])
        return features

# the activations sentence-transformers writes in a Dense's config.json (its class's path), which bertkit builds
_ACTIVATIONS: dict[str, type[nn.Module]] = {"torch.nn.modules.activation.Tanh": nn.Tanh,
                                            "torch.nn.modules.linear.Identity": nn.Identity}


_TANH = nn.Tanh()  # sentence-transformers' default (a module holds no state: each Dense builds its own)


def _activation_name(activation: Any) -> str:
    kind = type(activation)
    return f"{kind.__module__}.{kind.__qualname__}"


class Dense(nn.Module):
    """sentence-transformers' Dense (N_Dense): ``activation_function(linear(x))`` on the sentence embedding, after
    pooling and before Normalize; one or more, each taking the width the one before gives. Its parameters are the
    model's (``model.dense``), so training updates them. Activations: ``nn.Tanh()`` (the default, as there) and
    ``nn.Identity()`` (also for None); any other, a residual and other inputs or outputs are refused by name."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 activation_function: nn.Module | None = _TANH, init_weight: Tensor | None = None,
                 init_bias: Tensor | None = None, module_input_name: str = "sentence_embedding",
                 module_output_name: str | None = None, use_residual: bool = False):
        super().__init__()
        for name, value in (("in_features", in_features), ("out_features", out_features)):
            if not is_whole(value):
                raise BertkitError(f"models.Dense's {name} must be a whole number >= 1, got {value!r}")
        activation = nn.Identity() if activation_function is None else activation_function
        if _activation_name(activation) not in _ACTIVATIONS:
            raise BertkitError(f"models.Dense(activation_function={_activation_name(activation)}) is not implemented "
                               "in bertkit: it takes torch.nn.Tanh() or torch.nn.Identity() (None); use "
                               "sentence-transformers for this model")
        if use_residual or module_input_name != "sentence_embedding" or module_output_name not in (None, module_input_name):
            raise BertkitError(f"models.Dense(use_residual={use_residual!r}, module_input_name={module_input_name!r}, "
                               f"module_output_name={module_output_name!r}) is not implemented in bertkit: it maps the "
                               "sentence embedding without a residual; drop these arguments")
        self.in_features, self.out_features, self.bias = int(in_features), int(out_features), bool(bias)
        self.linear = nn.Linear(self.in_features, self.out_features, bias=self.bias)
        self.activation_function = type(activation)()
        given = {"init_weight": (init_weight, self.linear.weight), "init_bias": (init_bias if self.bias else None,
                                                                                  self.linear.bias)}
        with torch.no_grad():  # sentence-transformers makes them the Parameters; copied here, checked by shape
            for name, (value, parameter) in given.items():
                if value is None:
                    continue
                if tuple(value.shape) != tuple(parameter.shape):  # sentence-transformers fails at the first forward
                    raise BertkitError(f"models.Dense({name}=...) has the shape {tuple(value.shape)}; a Dense of "
                                       f"{self.in_features} -> {self.out_features} takes {tuple(parameter.shape)}")
                parameter.copy_(value)

    def forward(self, features: dict[str, Any]) -> dict[str, Any]:
        """sentence-transformers' Dense.forward (``model[2](features)``): the features' ``sentence_embedding``
        (B, in_features) mapped to (B, out_features), in the layer's type, in place, and the features returned."""
        x = features["sentence_embedding"]
        features["sentence_embedding"] = self.activation_function(self.linear(x.to(self.linear.weight.dtype)))
        return features

    def get_embedding_dimension(self) -> int:
        return self.out_features

    get_sentence_embedding_dimension = get_embedding_dimension  # sentence-transformers' name before 6

    def get_config_dict(self) -> dict[str, Any]:
        """config.json as sentence-transformers 6.2 writes it."""
        return {"in_features": self.in_features, "out_features": self.out_features, "bias": self.bias,
                "activation_function": _activation_name(self.activation_function),
                "module_input_name": "sentence_embedding", "module_output_name": "sentence_embedding"}

    def save(self, output_path: str | Path) -> None:
        """config.json and model.safetensors (``linear.weight``, ``linear.bias``), as sentence-transformers writes them."""
        from safetensors.torch import save_file

        out = Path(output_path)
        out.mkdir(parents=True, exist_ok=True)
        with atomic_target(out / "model.safetensors") as tmp:  # called alone, it replaces the earlier file whole
            save_file({k: v.detach().contiguous().cpu() for k, v in self.state_dict().items()}, str(tmp),
                      metadata={"format": "pt"})
        atomic_write_json(out / "config.json", self.get_config_dict())

    @classmethod
    def load(cls, directory: str | Path) -> Dense:
        """A Dense directory as sentence-transformers 6.2 writes it: config.json (``activation_function`` the class's
        path; Tanh where it names none, as there) and model.safetensors or pytorch_model.bin. An activation other than
        Tanh and Identity (sentence-transformers falls back to Tanh for one outside torch), a key it would not give
        the same vectors with, and weights of another shape or names are refused naming the file."""
        directory = Path(directory)
        config_file = directory / "config.json"
        if not config_file.is_file():
            raise MissingFileError(f"{config_file} is missing; modules.json lists a Dense module there"
                                   f"{cache_hint(directory.parent)}")
        config = json.loads(config_file.read_text(encoding="utf-8"))
        name = config.pop("activation_function", "torch.nn.modules.activation.Tanh")
        if name not in _ACTIVATIONS:
            raise BertkitError(f"{config_file}: activation_function {name!r} is not implemented in bertkit (it builds "
                               f"{', '.join(_ACTIVATIONS)}); use sentence-transformers for this model")
        known = {"in_features", "out_features", "bias", "module_input_name", "module_output_name", "use_residual"}
        other = sorted(set(config) - known)
        if other or not {"in_features", "out_features"} <= set(config):
            raise BertkitError(f"{config_file} sets {other} or lacks in_features/out_features; bertkit reads "
                               f"{sorted(known | {'activation_function'})}: restore it from the model's source")
        try:
            dense = cls(**config, activation_function=_ACTIVATIONS[name]())
        except BertkitError as e:
            raise BertkitError(f"{config_file}: {e}") from None
        weights = read_weights(directory)
        expected = {k: tuple(v.shape) for k, v in dense.state_dict().items()}
        found = {k: tuple(v.shape) for k, v in weights.items()}
        if found != expected:
            raise BertkitError(f"the weights in {directory} are {found}, but its config.json makes a Dense of "
                               f"{expected}; restore the directory from the model's source")
        dense.load_state_dict(weights)
        return dense

    def __repr__(self) -> str:
        return f"Dense({self.get_config_dict()})"


def in_order(modules: Any) -> list[nn.Module]:
    """``SentenceTransformer(modules=[...])``'s modules as a list: a Transformer, a Pooling, any Dense layers and an
    optional Normalize, in that order; anything else is refused naming it."""
    if isinstance(modules, Mapping):  # sentence-transformers takes an OrderedDict of them too
        modules = list(modules.values())
    if not isinstance(modules, Iterable):
        raise BertkitError(f"SentenceTransformer(modules=...) takes a list of modules, got {type(modules).__name__}")
    modules = list(modules)
    # another package's module by its whole name: sentence-transformers' own Pooling is not this one
    names = ["Pooling" if isinstance(m, PoolingSettings) else type(m).__name__ if type(m).__module__ == __name__
             else f"{type(m).__module__}.{type(m).__qualname__}" for m in modules]
    normalize = bool(modules) and isinstance(modules[-1], Normalize)
    middle = modules[2:len(modules) - normalize]
    if not (len(modules) >= 2 and isinstance(modules[0], Transformer) and isinstance(modules[1], PoolingSettings)
            and all(isinstance(m, Dense) for m in middle)):
        raise BertkitError(f"SentenceTransformer(modules={names}): bertkit's SentenceTransformer is "
                           "bertkit.sentence.models' Transformer, Pooling, any Dense and an optional Normalize, in "
                           "that order; use sentence-transformers for a model with other modules")
    return modules


_OTHER = "bertkit's SentenceTransformer is a BERT encoder, Pooling, any Dense and an optional Normalize; use " \
         "sentence-transformers for a model with this module"
_REFUSED = dict.fromkeys(("LayerNorm", "Dropout", "WeightedLayerPooling", "WordEmbeddings", "WordWeights",
                          "LSTM", "CNN", "BoW", "StaticEmbedding", "CLIPModel", "Router", "Asym", "Module",
                          "InputModule", "tokenizer"), _OTHER)

__getattr__ = refusing_getattr(__name__, _REFUSED)
