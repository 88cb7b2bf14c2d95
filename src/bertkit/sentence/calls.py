"""How sentence-transformers' three model classes are called, for bertkit's three (``SentenceTransformer``,
``CrossEncoder``, ``SparseEncoder``): the constructor arguments and methods bertkit does not implement, refused by
name with what to use (``refuse_arguments``, ``ReferenceCalls``); what a call's inputs are read as (``texts_of``,
``one_text``, ``check_features``, ``refuse_data_frame``); and the form its results are returned in
(``as_requested``)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable, Mapping
from collections.abc import Set as AbstractSet
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor

from bertkit._hardware import resolve_device
from bertkit._parallel import info_from_env
from bertkit.errors import BertkitError, NotImplementedInBertkit, given_path
from bertkit.modeling import BertModel

# sentence-transformers' constructor arguments bertkit does not implement, with what to do instead
REFUSED_INIT = {
    "cache_folder": "bertkit loads local directories; download the model first",
    "trust_remote_code": "bertkit runs BERT only; drop this argument",
    "revision": "bertkit loads local directories; check out the revision first",
    "token": "bertkit loads local directories; download the model first",
    "use_auth_token": "bertkit loads local directories; download the model first",
    "backend": "bertkit runs its own PyTorch encoder; for int8 use bertkit.pipeline(..., quantize='int8')",
    # (SparseEncoder's: SentenceTransformer and CrossEncoder take model_kwargs' dtype, model_kwargs_options)
    "model_kwargs": "bertkit builds its BertModel from config.json; for another dtype call .bfloat16() or .half() "
                    "on the loaded model",
    # dropped without a word, a model_max_length there would leave texts cut at the files' length
    "tokenizer_kwargs": "for its model_max_length set model.max_seq_length after loading; bertkit reads the "
                        "tokenizer's other settings from its files",
    "processor_kwargs": "for its model_max_length set model.max_seq_length after loading; bertkit reads the "
                        "tokenizer's other settings from its files",
    "config_kwargs": "edit config.json, or set dropout on model.bert after loading",
    # sentence-transformers 6.3's Hub kernels (transformers' use_kernels) for the backbone
    "use_kernels": "bertkit runs its own PyTorch encoder, which transformers' Hub kernels do not replace; drop "
                   "this argument",
    "kernel_config": "bertkit runs its own PyTorch encoder, which transformers' Hub kernels do not replace; drop "
                     "this argument",
}


def check_local_files_only(what: str, value: Any) -> None:
    """sentence-transformers' ``local_files_only`` (default False): whether a Hub id may be downloaded. bertkit never
    downloads, so either value loads a local directory, as both do there; False, that default, was refused, so a
    script passing its own default through (``local_files_only=args.offline``) could not load a local path."""
    if not isinstance(value, bool):
        raise BertkitError(f"{what}(local_files_only={value!r}) takes True or False, got {type(value).__name__}")


def model_path(value: Any, what: str) -> Path:
    """``value`` as the local directory ``what`` loads from; anything but a str or path (None: sentence-transformers'
    empty model, to build from modules) is refused naming it."""
    if not isinstance(value, (str, os.PathLike)):
        raise BertkitError(f"{what} takes the path of a local directory (a str or Path), got {type(value).__name__} "
                           f"{str(value)[:60]}")
    return given_path(value, f"{what}'s directory")


def move_to_device(model: torch.nn.Module, device: str | int | torch.device) -> None:
    """sentence-transformers' ``device=`` (a constructor's, or a call's, which moves the model for good): the model
    moved to the device ``resolve_device`` answers for it, the one decision every bertkit model goes through. A
    device this machine lacks, a misspelt one ("CPU") or one no model runs on ("meta", where the weights would be
    lost) is refused naming it, with the model left where it was (torch's RuntimeError, or an AssertionError from
    ``.to`` before; a "meta" model lost its weights)."""
    model.to(resolve_device(device, info_from_env().local_rank))


def check_save_arguments(what: str, model_name: Any, create_model_card: Any, train_datasets: Any,
                         safe_serialization: Any) -> None:
    """sentence-transformers' ``save(path, model_name, create_model_card, train_datasets, safe_serialization)``, as
    ``what`` takes them: the first three fill only the README model card, which bertkit does not write, so they are
    taken and write nothing; ``safe_serialization=False`` (its ``pytorch_model.bin``) is refused by name, as bertkit
    writes ``model.safetensors`` alone. A value of the wrong type is refused, naming it."""
    for name, value, kinds in (("model_name", model_name, (str, type(None))),
                               ("create_model_card", create_model_card, (bool,)),
                               ("train_datasets", train_datasets, (list, tuple, type(None))),
                               ("safe_serialization", safe_serialization, (bool,))):
        if not isinstance(value, kinds):
            raise BertkitError(f"{what}({name}={value!r}): {name} takes "
                               f"{' or '.join(k.__name__ for k in kinds)}, got {type(value).__name__}")
    if not safe_serialization:
        raise BertkitError(f"{what}(safe_serialization=False) is not implemented in bertkit: it writes "
                           "model.safetensors, which sentence-transformers and transformers read; drop the argument")


# sentence-transformers' defaults of the refused arguments whose default is not None: given explicitly, nothing is
# asked for that bertkit does not do (trust_remote_code=False, backend="torch" were refused as if they asked)
REFERENCE_DEFAULTS: dict[str, Any] = {"trust_remote_code": False, "backend": "torch", "use_kernels": False}


def refuse_arguments(what: str, unknown: dict[str, Any], table: dict[str, str]) -> None:
    """Refuse by name the arguments ``what`` was given that bertkit does not implement (``table``: what to do
    instead) or does not know. One given as None, or as sentence-transformers' own default (``REFERENCE_DEFAULTS``),
    asks for nothing: a script that passes its own defaults through (``cache_folder=args.cache_folder``,
    ``backend="torch"``) loads the model."""
    for name, value in unknown.items():
        if name in table:
            default = REFERENCE_DEFAULTS.get(name)
            if value is None or (type(value) is type(default) and value == default):
                continue
            raise BertkitError(f"{what}({name}=...) is not implemented in bertkit: {table[name]}")
        raise BertkitError(f"{what} got an unknown argument {name!r}")


_TRAINER = ("train with SentenceTransformerTrainer (CrossEncoderTrainer, SparseEncoderTrainer), which fit() "
            "wraps in sentence-transformers: docs/sentence.md")
ONE_PROCESS = "call encode() in one process, which uses every core through torch's threads"
# the pool methods of all three model classes (a CrossEncoder's "call encode()" sent its users to a method it lacks)
_NO_POOL = ("call encode() (a CrossEncoder's predict() or rank()) in one process, which uses every core through "
            "torch's threads")
# sentence-transformers 6's per-call tokenizer settings (encode / predict(processing_kwargs={"text": {"max_length":
# 16}})), which bertkit called an unknown argument
PROCESSING_KWARGS = ("texts are cut at the model's max_seq_length (a CrossEncoder's max_length) in every call: set "
                     "it on the model for another length")
_HUB = "bertkit works offline: save(path), then upload the directory with huggingface_hub (`hf upload REPO path`)"
_ADAPTERS = ("wrap the encoder (model.bert; a CrossEncoder's model.model) with peft's get_peft_model, and "
             "merge_and_unload() it before saving")
# sentence-transformers' model methods bertkit does not implement, with what to use instead
_REFUSED_METHODS = {
    "fit": _TRAINER,  # (a SparseEncoder's: SentenceTransformer and CrossEncoder have their own)
    "old_fit": "old_fit is sentence-transformers' v2 training loop; call fit(), which trains on the trainer as "
               "sentence-transformers' fit() does, or " + _TRAINER,
    "smart_batching_collate": _TRAINER,
    "start_multi_process_pool": _NO_POOL, "stop_multi_process_pool": _NO_POOL, "encode_multi_process": _NO_POOL,
    "push_to_hub": _HUB, "save_to_hub": _HUB,
    **dict.fromkeys(("add_adapter", "load_adapter", "set_adapter", "enable_adapters", "disable_adapters",
                     "active_adapter", "active_adapters", "delete_adapter", "get_adapter_state_dict",
                     "has_peft_compatible_model", "check_peft_compatible_model"), _ADAPTERS),
    "merge": "bertkit does not merge models (sentence-transformers merges with mergekit): merge the saved "
             "directories with mergekit and load the merged one as a bertkit model",
    "is_singular_input": "a str is one text (a CrossEncoder's (str, str) one pair), a list or tuple of them a batch",
    "get_sentence_features": "tokenize the texts with model.tokenize(texts), which gives the features forward takes",
    "model_card_data_class": "bertkit writes no model card: the model_card_data given is kept as given",
    "set_keep_in_fp32_modules": "bertkit runs every layer in the model's dtype: keep the model in float32 "
                                "(model.float()) for float32 layers",
    "smart_batching_collate_text_only": _TRAINER,
    "get_default_activation_fn": "read model.activation_fn, the activation the model scores with (sigmoid for one "
                                 "label, identity for more, or the one saved or given)",
}
# nn.Sequential's module-list methods, which sentence-transformers' models have (a SparseEncoder is a Sequential)
_MODULE_LIST_METHODS = ("append", "extend", "insert", "pop")


def refusal(owner: str, name: str) -> NotImplementedInBertkit:
    """The error refusing ``owner.name``, one of ``_REFUSED_METHODS``, naming what to use."""
    return NotImplementedInBertkit(f"{owner}.{name} is not implemented in bertkit: {_REFUSED_METHODS[name]}")


class ReferenceCalls:
    """The model methods of sentence-transformers' three model classes beyond encoding, for bertkit's three
    (SentenceTransformer, CrossEncoder, SparseEncoder): ``evaluate``, ``activation_checkpointing_enable`` (and its
    older name ``gradient_checkpointing_enable``) and ``get_device_name``; the
    methods bertkit does not implement (``_REFUSED_METHODS``) raise ``NotImplementedInBertkit`` naming what to use."""

    # what the class's fixed modules are and how to get others, said by nn.Sequential's append / extend / insert /
    # pop, which sentence-transformers' models have (a SparseEncoder is a Sequential: it has them too)
    _fixed_modules: ClassVar[str | None] = None
    # sentence-transformers' class constants of the same name: "SentenceTransformer", "sentence-transformers", ...
    model_type: ClassVar[str]
    default_huggingface_organization: ClassVar[str]
    # the keyword arguments encode (predict) passes on to the modules: sentence-transformers' get_model_kwargs
    _model_kwargs: ClassVar[tuple[str, ...]] = ()

    def get_backend(self) -> str:
        """"torch": bertkit runs its models on torch (sentence-transformers' onnx and openvino are refused when
        loading, by the backend argument)."""
        return "torch"

    @property
    def modalities(self) -> list[str]:
        """``["text"]``: what the model embeds (scores), as sentence-transformers' text models say."""
        return ["text"]

    def supports(self, modality: Any) -> bool:
        """Whether the model takes that modality: "text" only (a tuple of modalities needs "message" there)."""
        return modality in self.modalities

    def get_model_kwargs(self) -> list[str]:
        """The keyword arguments encode (predict) passes on to the modules, as sentence-transformers lists them."""
        return list(self._model_kwargs)

    @property
    def processor(self) -> Any:
        """The tokenizer: a text model's processor in sentence-transformers."""
        return self.tokenizer  # type: ignore[attr-defined]

    def clear_placement_cache(self) -> None:
        """Nothing to clear: bertkit places a model with ``model.to(device)`` and attaches no accelerate hooks,
        whose placement sentence-transformers caches."""

    @classmethod
    def merge(cls, *args: Any, **kwargs: Any) -> Any:
        """Refused by name (a class method there, called on the class: ``SentenceTransformer.merge([...])``)."""
        raise refusal(cls.__name__, "merge")

    @property
    def dtype(self) -> torch.dtype | None:
        """The type of the model's weights (its first parameter's, None without any), as sentence-transformers'
        ``model.dtype``: torch.float16 after ``model.half()``."""
        first = next(self.parameters(), None)  # type: ignore[attr-defined]
        return None if first is None else first.dtype

    def evaluate(self, evaluator: Callable[..., Any], output_path: str | None = None) -> Any:
        """``evaluator(model, output_path)``, as sentence-transformers' ``model.evaluate``: the directory is made and
        the evaluator writes its results CSV there."""
        if output_path is not None:
            os.makedirs(output_path, exist_ok=True)
        return evaluator(self, output_path)

    def activation_checkpointing_enable(self, activation_checkpointing_kwargs: dict[str, Any] | None = None) -> None:
        """Recompute each encoder layer in the backward pass (the encoder's own switch): sentence-transformers 6.3's
        name, ``activation_checkpointing_kwargs`` going to ``torch.utils.checkpoint.checkpoint``."""
        encoders = [m for m in self.modules() if isinstance(m, BertModel)]  # type: ignore[attr-defined]
        for encoder in encoders:
            encoder.gradient_checkpointing_enable(activation_checkpointing_kwargs)

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs: dict[str, Any] | None = None) -> None:
        """``activation_checkpointing_enable`` under its older name (transformers')."""
        self.activation_checkpointing_enable(gradient_checkpointing_kwargs)

    def get_device_name(self) -> str:
        """The device a model is placed on when its ``device`` is None: ``resolve_device("auto")``, "cuda:LOCAL_RANK"
        on a GPU machine (one GPU per torchrun process), else "cpu" (sentence-transformers 6.3's method, which also
        names mps, npu, xpu, hpu and neuron devices; bertkit runs on CUDA and the CPU)."""
        return resolve_device("auto", info_from_env().local_rank)

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)  # type: ignore[misc]  # nn.Module's: parameters, buffers, submodules
        except AttributeError:
            what = type(self).__name__
            if name in _MODULE_LIST_METHODS and self._fixed_modules is not None:
                raise NotImplementedInBertkit(f"{what}.{name} is not implemented in bertkit: bertkit's {what} holds "
                                              f"{self._fixed_modules}") from None
            if name in _REFUSED_METHODS:
                raise refusal(what, name) from None
            raise


def texts_of(inputs: Any) -> tuple[list[str], bool]:
    """``encode``'s inputs as texts, and whether they were one input, read as sentence-transformers 6 reads a text
    model's: a list, tuple or string array (or a ``datasets`` column) is a batch; a str or a dict ``{"text": str}``
    (its text modality, as a row of a dataset whose one column is "text") is one input. What it cannot embed as a
    text is refused naming the input: a dict with other keys (a dataset row with more columns), a (text, text) pair
    or a 2-D string array's row of two (which it encodes as one sequence; bertkit.sentence does not), a chat message,
    a non-string."""
    if isinstance(inputs, AbstractSet):  # sentence-transformers refuses one too
        raise BertkitError(f"encode() got a {type(inputs).__name__} of {len(inputs)} texts: a set has no order, so its "
                           "vectors could not be matched back to its texts; pass a list (encode(sorted(texts)))")
    refuse_data_frame(inputs, "encode()", "encode(df[{}])")
    single = isinstance(inputs, (str, bytes, Mapping)) or not isinstance(inputs, Iterable) or \
        (isinstance(inputs, np.ndarray) and (inputs.ndim == 0 or inputs.dtype.kind not in "UO"))
    items = [inputs] if single else list(inputs)
    return [one_text(x, "input" if single else f"input {i}") for i, x in enumerate(items)], single


def check_features(features: Any, needed: tuple[str, ...], tokenize: str = "model.tokenize(texts)",
                   call: str = "model(features)") -> None:
    """Refuse ``call`` (``model(features)``, ``model[1](features)``) without one of the ``needed`` tensors, naming it
    and the call that makes them (``tokenize``): a batch built by hand without ``attention_mask`` is pooled over its
    padding by sentence-transformers (transformers takes every position as a token), and was a bare KeyError here."""
    if not isinstance(features, Mapping):
        raise BertkitError(f"{call} takes the dict {tokenize} returns, got {type(features).__name__}")
    missing = [k for k in needed if k not in features]
    if missing:
        raise BertkitError(f"{call} needs {missing} (the features hold {sorted(features)}): build them with "
                           f"{tokenize}, which gives {list(needed)}; without a mask the padding would count as text")


def refuse_data_frame(inputs: Any, what: str, call: str) -> None:  # call: "encode(df[{}])", the column's place
    """A pandas DataFrame is refused naming its columns: iterated, it gives its column names, not its rows, so
    ``encode(df)`` embedded the word "text" once for a frame of many texts (sentence-transformers refuses it by type).
    pandas is looked up only where the script imported it."""
    pandas = sys.modules.get("pandas")
    if pandas is not None and isinstance(inputs, pandas.DataFrame):
        columns = [str(c) for c in inputs.columns]
        column = columns[0] if columns else "text"
        raise BertkitError(f"{what} got a pandas DataFrame of {len(inputs)} rows and the columns {columns[:5]}, which "
                           f"iterates over its column names, not its texts: pass a column, {call.format(repr(column))}")


def one_text(item: Any, where: str, call: str = "encode") -> str:
    """``item`` as one text, or the refusal naming ``call``'s input ``where`` and what to give instead."""
    if isinstance(item, str):
        return str(item)  # a numpy string as the plain str the tokenizer takes
    if isinstance(item, Mapping):
        keys = list(item)
        if keys == ["text"]:
            if isinstance(item["text"], str):
                return item["text"]
            raise BertkitError(f"{call}() {where} holds 'text' {type(item['text']).__name__} "
                               f"{str(item['text'])[:60]!r}; give the text as a string (join pre-split words: "
                               "pre-tokenized input is not implemented)")
        if {"role", "content"} <= set(keys):
            raise BertkitError(f"{call}() {where} is a chat message ({keys}); this model embeds texts: pass the "
                               "message's content")
        column = next((k for k in keys if isinstance(item[k], str)), "text")
        raise BertkitError(f"{call}() {where} is a dict with the keys {keys}; a dict input is {{'text': ...}} and "
                           "nothing else (sentence-transformers 6 refuses other keys too), so a dataset row with other "
                           f"columns is not embedded whole: embed its column, encode(row[{column!r}]) or "
                           f"encode(dataset[{column!r}])")
    pair = isinstance(item, (tuple, list)) or isinstance(item, np.ndarray) and item.ndim == 1  # not a 0-d array's str
    if pair and len(item) == 2 and all(isinstance(x, str) for x in item):
        raise BertkitError(f"{call}() {where} is the text pair {str(item)[:80]}; embedding a pair as one sequence is "
                           "not implemented in bertkit.sentence: embed each text, or score the pair with a CrossEncoder")
    raise BertkitError(f"{call}() {where} is {type(item).__name__} {str(item)[:60]!r}; {call} takes strings (or "
                       "{'text': str}), " + ("one or a list of them" if call == "encode" else "a list of them"))


def as_requested(rows: Tensor, convert_to_tensor: bool, convert_to_numpy: bool, single: bool,
                 device: torch.device) -> Any:
    """``rows`` as sentence-transformers returns them: a tensor, an array, or a list of row tensors; one row for a
    single input. Tensors are on the model's ``device``, where sentence-transformers leaves what it does not turn
    into numpy (bertkit gathers the rows on the CPU: a GPU model's tensors came back there)."""
    if convert_to_tensor:
        result: Any = rows.to(device)
    elif convert_to_numpy:  # numpy has no bfloat16: float32, as there
        result = (rows.float() if rows.dtype == torch.bfloat16 else rows).numpy()
    else:
        result = list(rows.to(device))
    return result[0] if single else result
