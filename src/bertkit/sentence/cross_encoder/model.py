"""``CrossEncoder``: a BERT sequence classifier over (query, document) pairs, with sentence-transformers'
``predict`` / ``rank`` and its directory layout.

    model = CrossEncoder("models/my-reranker")
    model.predict([("How many people live in Berlin?", "Berlin has 3.5 million inhabitants.")])
    model.rank("How many people live in Berlin?", documents, top_k=3, return_documents=True)

A pair is ``[CLS] query [SEP] document [SEP]``, cut to ``max_length`` tokens longest-first, as transformers'
tokenizer cuts it; the score is the classifier's logits through ``activation_fn`` (sigmoid for one label,
identity for several, unless the directory or the caller names another). The directory is a Hugging Face
checkpoint (config.json with ``BertForSequenceClassification``, model.safetensors, the tokenizer) plus
sentence-transformers' ``modules.json`` (one Transformer module), ``sentence_bert_config.json`` and
``config_sentence_transformers.json`` (the activation): transformers, sentence-transformers' CrossEncoder and
``bertkit serve --task rerank`` all open it.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence, Set
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from bertkit._parallel import job_of
from bertkit.errors import BertkitError, MissingFileError, given_path, is_whole
from bertkit.heads import BertForSequenceClassification
from bertkit.hub import (
    MODULES,
    SBERT_CONFIG,
    download_hint,
    encoder_path,
    module_types,
    not_a_directory,
    read_json,
    read_modules,
)
from bertkit.outputs import atomic_write_json
from bertkit.sentence import models
from bertkit.sentence.calls import (
    PROCESSING_KWARGS,
    REFUSED_INIT,
    ReferenceCalls,
    as_requested,
    check_features,
    check_local_files_only,
    check_save_arguments,
    model_path,
    move_to_device,
    refuse_arguments,
    refuse_data_frame,
)
from bertkit.sentence.directory import (
    cross_encoder_max_seq_length,
    saved_activation,
    saved_cross_encoder,
    tokenizer_limit,
    write_st_config,
)
from bertkit.sentence.finite import refuse_nonfinite
from bertkit.sentence.models import (
    Indexed,
    all_layer_embeddings,
    model_kwargs_options,
    of_first_module,
    refuse_adapter,
    warn_saved_half,
)
from bertkit.staging import staged
from bertkit.tokenization import AutoTokenizer
from bertkit.tokenization.batch import truncation_lengths

logger = logging.getLogger("bertkit")

# sentence-transformers' constructor arguments bertkit does not implement, with what to do instead: the three
# models' (calls.REFUSED_INIT; model_kwargs is an argument here), and what differs for a cross-encoder
_REFUSED_INIT = {
    **REFUSED_INIT,
    "modules": "build the directory with sentence-transformers, or start from a BERT checkpoint directory",
    "prompts": "prompts are not implemented for cross-encoders: put the text before the query yourself",
    "default_prompt_name": "prompts are not implemented for cross-encoders: put the text before the query yourself",
    "trust_remote_code": "bertkit runs BERT only, and resolves torch activations only; drop this argument",
    "backend": "bertkit runs its own PyTorch encoder; for int8 serve it with bertkit serve --quantize int8",
    "automodel_args": "sentence-transformers' old name of model_kwargs: pass model_kwargs=",
    "processor_kwargs": "use max_length=; bertkit reads the tokenizer's other settings from its files",
    "tokenizer_kwargs": "use max_length=; bertkit reads the tokenizer's other settings from its files",
    "config_kwargs": "use num_labels=, or edit config.json",
    "keep_in_fp32_modules": "bertkit's classifier runs in the model's dtype; drop this argument",
    "default_activation_function": "sentence-transformers' old name of activation_fn: pass activation_fn=",
    "classifier_dropout": "set classifier_dropout in config.json (it acts in training only)",
}
# the older names sentence-transformers 6 still takes for them (with a warning)
_REFUSED_INIT.update({old: _REFUSED_INIT[new] for old, new in ((
    "tokenizer_args", "processor_kwargs"), ("config_args", "config_kwargs"), ("cache_dir", "cache_folder"))})
# predict()/rank() arguments bertkit does not implement
_REFUSED_CALL = {
    "prompt": "prompts are not implemented for cross-encoders: put the text before the query yourself",
    "prompt_name": "prompts are not implemented for cross-encoders: put the text before the query yourself",
    "pool": "multi-process inference is not implemented: call predict in one process",
    "chunk_size": "multi-process inference is not implemented: call predict in one process",
    "processing_kwargs": PROCESSING_KWARGS,
    "activation_fct": "sentence-transformers' old name of activation_fn: pass activation_fn=",
    "sentences": "sentence-transformers' old name of inputs: pass the pairs first, predict(pairs)",
    "num_workers": "it has no effect in sentence-transformers 6 either: drop it",
    # predict takes these; rank returns Python floats (sentence-transformers 6 ignores them there)
    "convert_to_numpy": "rank returns Python floats, whatever it is given: drop it",
    "convert_to_tensor": "rank returns Python floats, whatever it is given: drop it",
}


# sentence-transformers 5.3's positional order after model_name_or_path, which 6.3 still reads with a logged
# deprecation warning for each (bertkit's CrossEncoder takes them by keyword only: Python's TypeError before)
_LEGACY_POSITIONS = ("num_labels", "max_length", "activation_fn", "device", "cache_folder", "trust_remote_code",
                     "revision", "local_files_only", "token", "model_kwargs", "tokenizer_kwargs", "config_kwargs",
                     "model_card_data", "backend")


def _legacy_positions(init: Callable[..., None]) -> Callable[..., None]:
    """``CrossEncoder(path, 1, 256)`` read as sentence-transformers 6.3 reads it (num_labels=1, max_length=256),
    with its warning for each; then each is taken or refused as its keyword is. Where 6.3 keeps the keyword and
    drops the positional value of the same name, or drops the values past its 14 names, without a word, bertkit
    refuses, naming them."""

    @functools.wraps(init)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> None:
        if len(args) > 1 + len(_LEGACY_POSITIONS):
            extra = ", ".join(repr(value)[:40] for value in args[1 + len(_LEGACY_POSITIONS):])
            raise BertkitError(f"CrossEncoder() got {len(args)} arguments by position; sentence-transformers reads "
                               f"the model path and {len(_LEGACY_POSITIONS)} more ({', '.join(_LEGACY_POSITIONS)}) "
                               f"and drops the rest ({extra}): pass the arguments by keyword")
        for name, value in zip(_LEGACY_POSITIONS, args[1:]):
            logger.warning("Passing `%s` as a positional argument to CrossEncoder is deprecated. Please pass `%s` "
                           "as a keyword argument instead.", name, name)
            if name in kwargs:
                raise BertkitError(f"CrossEncoder() got {name} twice, by position ({value!r}) and by keyword "
                                   f"({kwargs[name]!r}); sentence-transformers keeps the keyword's and drops the "
                                   f"other: pass {name} once, by keyword")
            kwargs[name] = value
        init(self, *args[:1], **kwargs)

    return wrapper


def refuse_prompts(what: str, prompt_name: Any, prompt: Any) -> None:
    """sentence-transformers 6's prompt arguments of predict and rank, refused by name (None asks for nothing). A
    number there is most likely a batch size given by position, as sentence-transformers 5 took it: said so."""
    for name, value in (("prompt_name", prompt_name), ("prompt", prompt)):
        if value is not None and not isinstance(value, str):
            raise BertkitError(f"{what}({name}={value!r}): sentence-transformers 6 reads the argument after the "
                               f"{'pairs' if what == 'predict' else 'documents, top_k and return_documents'} as "
                               f"{name}, not batch_size: pass batch_size={value!r} and the others by name")
    refuse_arguments(what, {"prompt_name": prompt_name, "prompt": prompt}, _REFUSED_CALL)


# Under autocast on a GPU, attention runs in cuDNN, which builds a graph for every new (rows, length) shape (56-70 ms
# each on an H100): pair batches padded to a multiple of this meet at most 8 lengths up to 512 tokens. Reranker
# training on an H100: 0.96x sentence-transformers with it, 0.90x without cuDNN, 0.84x before (BENCHMARKS.md).
GPU_HALF_WIDTH_MULTIPLE = 64


def fullname(fn: Any) -> str:
    """The name sentence-transformers records for an activation (its ``util.fullname``): its class's, a function's
    too (``function``, ``builtin_function_or_method``: builtins bare). A function's own name
    (``torch.nn.functional.sigmoid``) made sentence-transformers call it with no argument when loading the directory
    (a TypeError); under its class's name it warns and takes the default activation, as for a directory it saved."""
    kind = fn if isinstance(fn, type) else type(fn)
    return kind.__name__ if kind.__module__ in (None, "builtins") else f"{kind.__module__}.{kind.__name__}"


def activation_from_name(name: str, where: str) -> nn.Module:
    """A torch activation from its recorded name (``torch.nn.modules.activation.Sigmoid``). Only torch's own,
    as sentence-transformers without trust_remote_code; any other is refused rather than replaced."""
    module, _, attr = name.rpartition(".")
    if not name.startswith("torch."):
        raise BertkitError(f"{where} names the activation {name!r}; bertkit resolves torch activations only "
                           "(torch.nn.modules.activation.Sigmoid, ...): pass activation_fn= when loading")
    try:
        return getattr(importlib.import_module(module), attr)()
    except (ImportError, AttributeError, TypeError) as e:
        raise BertkitError(f"{where} names the activation {name!r}, which torch does not have ({e}); pass "
                           "activation_fn= when loading") from None


def checked_activation(fn: Any) -> Any:
    """``fn`` if it can score logits, refused when given: a name ("sigmoid") would fail only after every pair is
    scored, and a save would record the activation as ``str``."""
    if fn is not None and not callable(fn):
        raise BertkitError(f"activation_fn must be a callable applied to the logits (torch.nn.Sigmoid(), "
                           f"torch.nn.Identity(), torch.sigmoid, ...), got {type(fn).__name__} {str(fn)[:40]!r}")
    return fn


class Transformer(models.Transformer):
    """A CrossEncoder's ``model[0]``, as sentence-transformers 6's Transformer of a cross-encoder: ``model`` (also
    ``auto_model``) the sequence classifier, its tokenizer, and ``max_seq_length`` (the CrossEncoder's
    ``max_length``: a pair keeps its 3 special tokens at least); ``model[0](features)`` adds the ``scores``."""

    def __init__(self, model: BertForSequenceClassification, tokenizer: Any):
        nn.Module.__init__(self)  # the model is loaded already: Transformer's __init__ loads an encoder's directory
        self.model, self.tokenizer = model, tokenizer

    max_seq_length = tokenizer_limit("max_length", lambda module: module.model.config.max_position_embeddings, least=3)

    @property
    def do_lower_case(self) -> bool:
        return False

    @do_lower_case.setter
    def do_lower_case(self, value: bool) -> None:
        if value:
            raise BertkitError("CrossEncoder[0].do_lower_case = True is not implemented in bertkit: its tokenizer's "
                               "files say whether it lowercases (do_lower_case in tokenizer_config.json)")

    def forward(self, features: dict[str, Tensor]) -> dict[str, Any]:
        """``features`` with ``scores`` (N, num_labels), the classifier's logits (and ``all_layer_embeddings`` where
        asked), added in place: ``model[0](features)``, and so ``model(features)``, as there."""
        check_features(features, ("input_ids", "attention_mask", "token_type_ids"), "model.preprocess(pairs)")
        out = self.model(features["input_ids"], features["attention_mask"], features["token_type_ids"])
        features.update({"scores": out.logits, **all_layer_embeddings(out)})
        return features


class CrossEncoder(Indexed, ReferenceCalls, nn.Module):
    """A cross-encoder on bertkit's ``BertForSequenceClassification`` (``self.model``); see the module docstring.
    ``num_labels`` overrides the checkpoint's label count (a new classifier for a BERT checkpoint); ``max_length``
    the tokens a pair keeps (default: the tokenizer's model_max_length, capped at the position embeddings).
    ``model[0]`` is its one module, as sentence-transformers 6's: ``model[0].auto_model`` is ``model.model``."""

    # model[0]'s: model.model is model[0].auto_model, its parameters named 0.model.… as there
    model, tokenizer, max_length = (of_first_module(name) for name in ("model", "tokenizer", "max_seq_length"))
    max_seq_length = max_length  # sentence-transformers 6's name for max_length (which it keeps as an alias)
    model_type, default_huggingface_organization = "CrossEncoder", "cross-encoder"
    _fixed_modules = ("one Transformer (model[0]: the encoder with its classifier, which scores a pair); load another "
                      "with CrossEncoder(path), and embed texts with a SentenceTransformer(modules=[...]) from "
                      "bertkit.sentence.models")

    # model_name_or_path defaults to None as sentence-transformers 6's (which builds from modules=[...] without it),
    # so that CrossEncoder(modules=[...]) reaches the refusal naming modules, not Python's "missing 1 required
    # positional argument"
    @_legacy_positions
    def __init__(self, model_name_or_path: str | Path | None = None, *, num_labels: int | None = None,
                 max_length: int | None = None, activation_fn: Callable | None = None, device: str | None = None,
                 local_files_only: bool = False, model_kwargs: dict[str, Any] | None = None,
                 model_card_data: Any = None, **unknown: Any):
        super().__init__()
        refuse_arguments("CrossEncoder", unknown, _REFUSED_INIT)
        self.model_card_data = model_card_data  # kept for the script that reads it back; bertkit writes no card
        options = model_kwargs_options("CrossEncoder", model_kwargs)
        check_local_files_only("CrossEncoder", local_files_only)
        path = model_path(model_name_or_path, "CrossEncoder")
        if not path.is_dir():  # a Hub id among them: "has no config.json" below sent the user looking for the file
            raise not_a_directory(path, "cross-encoder directory", "bertkit loads local directories: pass the path of "
                                  f"one{download_hint(model_name_or_path) or ' (a Hub model: download it first)'}")
        modules = read_modules(path)
        types = module_types(modules) if modules is not None else ["Transformer"]
        # sentence-transformers reads sentence_bert_config.json and config_sentence_transformers.json only in a
        # directory it saved as a CrossEncoder; any other it loads as a plain checkpoint (a max_seq_length 16 there cut
        # pairs at 16 in bertkit, at the tokenizer's 512 in sentence-transformers)
        encoder_dir, declared = path, None
        untyped = modules is not None and types == ["Transformer"] and not saved_cross_encoder(path)
        if types[:2] == ["Transformer", "Pooling"] or untyped:  # an embedder's transformer, with a new classifier
            # sentence-transformers' words; it reads neither max_seq_length nor the prompts there
            logger.warning("Converting SentenceTransformer model %s to CrossEncoder.", path)
            encoder_dir = path / encoder_path(modules)
        elif types != ["Transformer"] or encoder_path(modules) not in ("", "."):
            raise BertkitError(f"{path / MODULES} lists the modules {types}; bertkit's CrossEncoder implements one "
                               "Transformer module at the top of the directory (a sequence classifier), or loads a "
                               "SentenceTransformer's (Transformer, Pooling...) with a new classifier; use "
                               "sentence-transformers for this model")
        elif modules is not None:
            declared = cross_encoder_max_seq_length(path)
        refuse_adapter(encoder_dir, "CrossEncoder(base)", "model.model")
        if not (encoder_dir / "config.json").is_file():
            raise MissingFileError(f"cross-encoder directory {encoder_dir} has no config.json; pass a directory saved "
                                   "by CrossEncoder.save, sentence-transformers or transformers (or a BERT checkpoint)")
        # as sentence-transformers: a checkpoint that is no sequence classifier gets a new one-label head
        config = read_json(encoder_dir / "config.json") or {}
        classifier = any(str(a).endswith("ForSequenceClassification") for a in config.get("architectures") or [])
        if num_labels is None and not classifier:
            num_labels = 1
        labels = len(config.get("id2label") or {})
        if num_labels is not None and classifier and labels and num_labels != labels:
            # the loader's advice (ignore_mismatched_sizes=True) is no argument of CrossEncoder; sentence-transformers
            # stops here too, unless given model_kwargs={"ignore_mismatched_sizes": True}
            raise BertkitError(f"{encoder_dir} holds a classifier of {labels} label(s), and num_labels={num_labels} "
                               "asks for another: leave num_labels out to load it, or load the checkpoint it was "
                               f"fine-tuned from with num_labels={num_labels} for a new classifier")
        overrides = {} if num_labels is None else {"num_labels": num_labels}
        # a new classifier (and a pooler the checkpoint lacks) is drawn as transformers draws it, so as there
        classifier_model = BertForSequenceClassification.from_pretrained(encoder_dir, **overrides, **options)
        self.add_module("0", Transformer(classifier_model, AutoTokenizer.from_pretrained(encoder_dir)))
        warn_saved_half(encoder_dir, options, self.model.config, 'load it with model_kwargs={"dtype": "auto"}')
        # 0 is checked, not taken for "not given": sentence-transformers cuts no pair at 0
        self.max_length = max_length if max_length is not None else declared or min(
            self.tokenizer.model_max_length, self.model.config.max_position_embeddings)
        saved = saved_activation(path, self.model.config.extra)
        if activation_fn is not None:
            self.activation_fn = activation_fn
        elif saved:
            self.activation_fn = activation_from_name(saved, str(path))
        else:
            self.activation_fn = nn.Sigmoid() if self.num_labels == 1 else nn.Identity()
        self.eval()  # as loaded models are: predict, which puts back the mode it found, must not turn dropout on
        if device is not None:
            move_to_device(self, device)

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "activation_fn":  # a plain attribute (as sentence-transformers keeps it), not a sub-module
            object.__setattr__(self, name, checked_activation(value))
            return
        super().__setattr__(name, value)

    # -- what sentence-transformers' model exposes --------------------------------------------------------------
    @property
    def num_labels(self) -> int:
        return self.model.config.num_labels

    @property
    def config(self):
        return self.model.config

    @property
    def transformers_model(self) -> nn.Module:
        """The classifier (bertkit's ``BertForSequenceClassification``), as sentence-transformers' model[0].auto_model."""
        return self.model

    @property
    def device(self) -> torch.device:
        return self.model.bert.embeddings.word_embeddings.weight.device

    # -- pairs -> rows --------------------------------------------------------------------------------------------
    def token_ids(self, text: str) -> list[int]:
        """One text's word pieces, without special tokens: what a pair row is assembled from."""
        if not isinstance(text, str):
            raise BertkitError(f"a cross-encoder scores pairs of texts; got {type(text).__name__} {str(text)[:60]!r}")
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def pair_batch(self, firsts: Sequence[str | list[int]], seconds: Sequence[str | list[int]]) -> dict[str, Tensor]:
        """``input_ids``, ``token_type_ids``, ``attention_mask`` (N, T) of the pairs ``[CLS] a [SEP] b [SEP]``, each
        cut longest-first to ``max_length`` (transformers' rule), padded to the longest (on a GPU under autocast, up to
        a multiple of ``GPU_HALF_WIDTH_MULTIPLE``). Each side is a text or its ``token_ids``."""
        cls, sep = self.tokenizer.cls_token_id, self.tokenizer.sep_token_id
        rows = []
        for a, b in zip(firsts, seconds, strict=True):
            a = self.token_ids(a) if isinstance(a, str) else a
            b = self.token_ids(b) if isinstance(b, str) else b
            n_a, n_b = truncation_lengths(len(a), len(b), self.max_length, "longest_first", 3)
            rows.append(([cls, *a[:n_a], sep, *b[:n_b], sep], n_a + 2))
        T = max(len(ids) for ids, _ in rows)
        if self.device.type == "cuda" and torch.is_autocast_enabled("cuda"):
            T = min(-(-T // GPU_HALF_WIDTH_MULTIPLE) * GPU_HALF_WIDTH_MULTIPLE, self.config.max_position_embeddings)
        # a handful of whole-batch operations, not three a row: this runs on the host at every training step
        position = torch.arange(T)
        real = position < torch.tensor([len(ids) for ids, _ in rows])[:, None]  # (N, T)
        second = position >= torch.tensor([first for _, first in rows])[:, None]  # (N, T): the second text and its [SEP]
        input_ids = torch.full((len(rows), T), self.tokenizer.pad_token_id, dtype=torch.long)
        input_ids[real] = torch.tensor([t for ids, _ in rows for t in ids])  # row-major, as the rows are joined
        # all segment 0 where the tokenizer's model_input_names leaves token_type_ids out, as transformers feeds them
        types = (real & second).long() if self.tokenizer.segments_to_model else torch.zeros_like(input_ids)
        return {"input_ids": input_ids, "token_type_ids": types, "attention_mask": real.long()}

    def preprocess(self, inputs: Sequence[Sequence[str]]) -> dict[str, Tensor]:
        """sentence-transformers' ``model.preprocess(pairs)``: the tokenized batch of (a, b) pairs."""
        return self.pair_batch([p[0] for p in inputs], [p[1] for p in inputs])

    def tokenize(self, texts: Sequence[Sequence[str]]) -> dict[str, Tensor]:
        """``preprocess``'s name before 6, which 6.2 still takes (a training loop's ``model.tokenize(pairs)``), under
        that name's argument, ``texts``."""
        return self.preprocess(texts)

    def scores(self, batch: dict[str, Tensor]) -> Tensor:
        """(N, num_labels) logits of a ``pair_batch``, on the host or the model's device (the model moves it)."""
        return self.model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"]).logits

    # -- predict and rank -------------------------------------------------------------------------------------------
    # inputs defaults to None so that sentence-transformers' old keyword, predict(sentences=pairs), reaches the
    # refusal naming its new place rather than Python's "missing 1 required positional argument: 'inputs'"
    # the positions are sentence-transformers 6's (prompt_name and prompt after the inputs): predict(pairs, None,
    # None, 16) failed here on batch_size None, and predict(pairs, 16), refused there, scored in batches of 16
    def get_max_seq_length(self) -> int:
        """``max_length`` (sentence-transformers' deprecated getter)."""
        return self.max_length

    @property
    def default_activation_function(self) -> Callable:
        """``activation_fn``, by sentence-transformers' deprecated name."""
        return self.activation_fn

    def predict(self, inputs: Sequence[Sequence[str]] | Sequence[str] | None = None, prompt_name: str | None = None,
                prompt: str | None = None, batch_size: int = 32, show_progress_bar: bool | None = None,
                activation_fn: Callable | None = None, apply_softmax: bool | None = False,
                convert_to_numpy: bool = True, convert_to_tensor: bool = False, device: str | None = None,
                **unknown: Any) -> Any:
        """Score (a, b) pairs: a float32 numpy array by default ((N,) for one label, (N, labels) otherwise), a tensor with
        ``convert_to_tensor``, a list of tensors with both conversions off; one pair gives one score. Pairs run
        longest first in batches of ``batch_size`` and come back in their order. ``activation_fn`` (default: the
        model's) is applied to the logits; ``apply_softmax`` then normalises several labels' scores. No pairs give
        sentence-transformers' empty result: ``np.array([])`` (shape (0,), float64), ``torch.tensor([])`` or ``[]``."""
        refuse_prompts("predict", prompt_name, prompt)
        refuse_arguments("predict", unknown, _REFUSED_CALL)
        if isinstance(device, (list, tuple)):  # sentence-transformers' multi-process inference, a process per device
            # (torch's "to() received an invalid combination of arguments" before)
            raise BertkitError(f"predict(device={device!r}): {_REFUSED_CALL['pool']}, on one device (device='cpu')")
        if not is_whole(batch_size):
            raise BertkitError(f"batch_size must be a whole number >= 1, got {batch_size!r}")
        if isinstance(inputs, np.ndarray):  # an (N, 2) or (2,) array of strings, as sentence-transformers takes
            inputs = inputs.tolist()
        if not isinstance(inputs, Sequence):  # a set has no order; a generator, no length (both refused there too)
            raise BertkitError(f"predict() takes a list of (text, text) pairs or one pair, got a {type(inputs).__name__}"
                               ": pass a list (its scores come back in its order)")
        single = len(inputs) > 0 and not isinstance(inputs[0], (list, tuple))
        pairs = [inputs] if single else list(inputs)
        for i, pair in enumerate(pairs):
            where = "the input" if single else f"input {i}"
            if isinstance(pair, str) or not isinstance(pair, Sequence) or len(pair) != 2:
                raise BertkitError(f"predict() takes (text, text) pairs; {where} is {str(pair)[:80]!r}")
            side = next((k for k, text in enumerate(pair) if not isinstance(text, str)), None)
            if side is not None:
                raise BertkitError(f"predict() {where} {str(pair)[:80]} has {type(pair[side]).__name__} "
                                   f"{str(pair[side])[:40]!r} as its {('first', 'second')[side]} text; a pair holds two "
                                   "strings: fill in or drop the row (a number: str(...) it)")
        if device is not None:
            move_to_device(self, device)
        if not pairs:  # sentence-transformers' empty result, whatever the labels: (0,) float64, (0,) float32 or []
            return torch.tensor([], device=self.device) if convert_to_tensor else np.array([]) if convert_to_numpy else []
        if show_progress_bar is None:
            show_progress_bar = logger.getEffectiveLevel() <= logging.INFO and len(pairs) > 10 * batch_size
        activation_fn = checked_activation(activation_fn) if activation_fn is not None else self.activation_fn
        scores = self._scores(pairs, batch_size, bool(show_progress_bar))
        # logits -inf at every label (an overflow) came out of the sigmoid as 0.0 (a softmax over several: NaN), a
        # logit +inf (an overflow the other way) as 1.0, and rank() and the evaluators ranked those scores in position
        # order, as sentence-transformers does; such a pair's scores are NaN, which they refuse naming the pair
        undefined = torch.isneginf(scores).all(dim=-1) | torch.isposinf(scores).any(dim=-1)
        if activation_fn is not None:
            scores = activation_fn(scores)
        if undefined.any():
            scores = scores.masked_fill(undefined.view(-1, *[1] * (scores.ndim - 1)), torch.nan)
        if self.num_labels == 1 and scores.ndim > 1:
            scores = scores.squeeze(-1)
        if apply_softmax and scores.ndim > 1:
            scores = torch.softmax(scores, dim=1)
        if convert_to_numpy and not convert_to_tensor:  # float32 whatever the activation gives, as there
            scores = scores.float()
        return as_requested(scores, convert_to_tensor, convert_to_numpy, single, self.device)

    @torch.inference_mode()
    def _scores(self, pairs: list[Sequence[str]], batch_size: int, progress: bool) -> Tensor:
        """(N, num_labels) logits on the CPU, in the pairs' order; batches of similar length. float32 for a float32 or
        half-precision model (sentence-transformers upcasts types under 32 bits), float64 for a float64 one (float32
        here put its scores 1e-8 from sentence-transformers', and returned them as float32 tensors)."""
        dtype = torch.promote_types(self.model.dtype, torch.float32)
        out = torch.empty(len(pairs), self.num_labels, dtype=dtype, device=self.device)  # read back once, at the end
        from bertkit.inference.runner import eval_mode, longest_first

        with eval_mode(self):  # calls from other threads at once included
            for batch in longest_first(pairs, batch_size, self.preprocess, self.device, progress,
                                       length=lambda pair: len(pair[0]) + len(pair[1])):
                out[batch["rows"]] = self.scores(batch).to(dtype)
        return out.cpu()

    def rank(self, query: str, documents: Sequence[str], top_k: int | None = None, return_documents: bool = False,
             prompt_name: str | None = None, prompt: str | None = None, batch_size: int = 32,
             show_progress_bar: bool | None = None, activation_fn: Callable | None = None, device: str | None = None,
             *, apply_softmax: bool | None = None, **unknown: Any) -> list[dict[str, Any]]:
        """The documents by score for ``query``, best first: ``[{"corpus_id", "score"(, "text")}, ...]``, the
        first ``top_k``. Needs a one-label model. ``apply_softmax`` is accepted and ignored, as sentence-transformers
        6 does (a softmax over one label is 1)."""
        refuse_prompts("rank", prompt_name, prompt)
        refuse_arguments("rank", unknown, _REFUSED_CALL)
        if apply_softmax is not None:
            logger.warning("CrossEncoder.rank's apply_softmax has no effect (rank needs a one-label model, whose "
                           "softmax is 1), as in sentence-transformers 6: leave it out")
        if top_k is not None and not is_whole(top_k, 0):
            # sentence-transformers slices by it: 1.5 failed after every document was scored, -1 dropped the last
            raise BertkitError(f"rank()'s top_k must be a whole number >= 0 or None, got {top_k!r}: the documents "
                               "to return, best first (None: all of them)")
        if self.num_labels != 1:
            raise BertkitError(f"rank() needs a one-label cross-encoder; this one has {self.num_labels} labels: use "
                               "predict() on (query, document) pairs")
        if isinstance(documents, (str, Mapping, Set)) or not isinstance(documents, Iterable):
            # a str would be ranked character by character, a dict by its keys (sentence-transformers does both);
            # a set has no order for corpus_id to point into
            raise BertkitError(f"rank() takes the documents as a list of strings, got a {type(documents).__name__} "
                               f"{str(documents)[:60]!r}: pass a list (corpus_id is each one's index in it)")
        refuse_data_frame(documents, "rank()", "rank(query, df[{}])")  # ranked by its column names before
        documents = list(documents)  # a generator is read once: checked and scored from the same list
        bad = next(((f"document {i}", d) for i, d in enumerate(documents) if not isinstance(d, str)),
                   ("the query", query) if not isinstance(query, str) else None)
        if bad is not None:
            raise BertkitError(f"rank() {bad[0]} is {type(bad[1]).__name__} {str(bad[1])[:60]!r}; the query and "
                               "each document are strings: fill in or drop it")
        scores = self.predict([(query, d) for d in documents], batch_size=batch_size,
                              show_progress_bar=show_progress_bar, activation_fn=activation_fn,
                              convert_to_tensor=True, device=device)
        refuse_nonfinite(scores, documents, "rank()", "score", "nothing was ranked", model=self)
        results = [{"corpus_id": i, "score": s, **({"text": documents[i]} if return_documents else {})}
                   for i, s in enumerate(scores.tolist())]
        return sorted(results, key=lambda r: r["score"], reverse=True)[:top_k]

    # -- fit --------------------------------------------------------------------------------------------------------
    def fit(self, train_dataloader: Any, **kwargs: Any) -> None:
        """sentence-transformers' legacy ``CrossEncoder.fit`` (a DataLoader of InputExample pairs), on the trainer as
        sentence-transformers runs it: ``bertkit.sentence.fit.cross_encoder_fit``, found when called (the trainer it
        runs imports this module)."""
        importlib.import_module("bertkit.sentence.fit").cross_encoder_fit(self, train_dataloader, **kwargs)

    # -- save -------------------------------------------------------------------------------------------------------
    def save(self, path: str | Path, model_name: str | None = None, create_model_card: bool = True,
             train_datasets: list[str] | None = None, safe_serialization: bool = True) -> Path:
        """Write the model as sentence-transformers writes a CrossEncoder: the Hugging Face checkpoint and tokenizer
        (its model_max_length is ``max_length``, which ``bertkit serve`` reads too) at the top, modules.json, and the
        activation in config_sentence_transformers.json. Written beside ``path`` and moved into place whole
        (``bertkit.staging.staged``)."""
        check_save_arguments("CrossEncoder.save", model_name, create_model_card, train_datasets, safe_serialization)
        directory = given_path(path, "the directory to save into")
        if inspect.isroutine(self.activation_fn) or isinstance(self.activation_fn, functools.partial):
            # sentence-transformers 6.3's warning: only a module's class can be recorded and rebuilt
            logger.warning("saving activation function %r, a plain function, which the directory cannot record: "
                           "bertkit refuses the directory without activation_fn=, and sentence-transformers loads "
                           "it with its default activation. Use a torch.nn.Module instead (torch.nn.Sigmoid() for "
                           "torch.sigmoid, torch.nn.Identity() for lambda x: x)", self.activation_fn)
        with staged(directory, shared_by=job_of()) as out:
            self.model.save_pretrained(out)
            self.tokenizer.save_pretrained(out)
            atomic_write_json(out / SBERT_CONFIG, {
                "transformer_task": "sequence-classification",
                "modality_config": {"text": {"method": "forward", "method_output_name": "logits"}},
                "module_output_name": "scores"})
            write_st_config(out, self.model_type, activation_fn=fullname(self.activation_fn), prompts={},
                            default_prompt_name=None)
            atomic_write_json(out / MODULES, [{"idx": 0, "name": "0", "path": "", "type":
                                               "sentence_transformers.base.modules.transformer.Transformer"}])
        return directory

    save_pretrained = save
