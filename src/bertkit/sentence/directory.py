"""What a sentence-transformers directory declares, read in one place.

``modules.json`` lists the modules (Transformer at "" or "0_Transformer", Pooling at 1_Pooling, any Dense layers at
2_Dense, 3_Dense, ..., Normalize last); ``sentence_bert_config.json``, in the Transformer's directory, holds max_seq_length (where texts are
cut, unless its tokenizer_args give a model_max_length) and do_lower_case; what else it sets that would change a
vector is refused (``transformer_max_seq_length``);
``config_sentence_transformers.json`` the prompts, default_prompt_name, similarity_fn_name and truncate_dim (the
embedding's width), as sentence-transformers 6 writes them. ``SentenceTransformer``, the embedding pipelines (and
so ``bertkit predict`` and ``bertkit serve``) and ``CrossEncoder`` read a directory through ``read_directory``, so
that each gives the vectors the directory's model was trained and indexed with.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bertkit.errors import BertkitError, MissingFileError, is_whole
from bertkit.hub import (
    MODULES,
    SBERT_CONFIG,
    ST_CONFIG,
    cache_hint,
    declared_length,
    encoder_path,
    module_types,
    read_json,
    read_modules,
)
from bertkit.sentence.pooling import Pooling

_TYPES = {"Transformer", "Pooling", "Dense", "Normalize"}
# sentence_bert_config.json: sentence-transformers 6 gives every key to its Transformer's constructor (a key it does
# not know fails there). bertkit reads max_seq_length and do_lower_case, and a tokenizer's model_max_length (which
# wins over max_seq_length there); the keys below either hold their only value bertkit computes or do not change a
# vector; any other key or value would give other vectors than sentence-transformers' and is refused by name.
_TRANSFORMER_DEFAULTS = {"transformer_task": "feature-extraction", "module_output_name": "token_embeddings",
                         "modality_config": {"text": {"method": "forward", "method_output_name": "last_hidden_state"}},
                         "processing_kwargs": {}, "query_length": None, "document_length": None,
                         "query_expansion": None}
_TOKENIZER_ARGS, _MODEL_ARGS = ("tokenizer_args", "processor_kwargs"), ("model_args", "model_kwargs", "config_args",
                                                                       "config_kwargs")
_NO_EFFECT = {"unpad_inputs", "trust_remote_code", "attn_implementation"}  # speed or loading only; the same numbers
# a cross-encoder's Transformer, as sentence-transformers 6 writes it: the classifier's logits are its scores
_CROSS_ENCODER_KEYS = {"transformer_task": "sequence-classification", "module_output_name": "scores",
                       "modality_config": {"text": {"method": "forward", "method_output_name": "logits"}}}


def token_limit(name: str, value: Any, positions: int, least: int = 2) -> int:
    """``value`` checked as a model's ``max_seq_length`` (``max_length``: a cross-encoder's, ``least`` 3 for a pair's
    special tokens) where it is set, on loading and afterwards: past the encoder's positions a long text reached the
    encoder at encode, whose error advised the tokenizer's truncation."""
    if not is_whole(value, least, positions):
        raise BertkitError(f"{name} {value!r} must be a whole number in [{least}, {positions}] (the encoder's "
                           "positions, its special tokens included)")
    return value


def tokenizer_limit(name: str, positions: Callable[[Any], int], least: int = 2) -> property:
    """A model's ``max_seq_length`` (a cross-encoder's ``max_length``) kept where sentence-transformers keeps it: the
    tokenizer's ``model_max_length``, so that ``model.tokenizer.model_max_length = 32`` cuts texts at 32 there and here
    (kept apart, bertkit cut at the directory's 256: cosine 0.86 on a 455-token text with all-MiniLM-L6-v2, scores
    8e-3 apart on a long pair) and a save writes the one value to both files. ``positions(model)`` is the encoder's
    ``max_position_embeddings``; ``token_limit`` checks the value where it is set and where it is read (set on the
    tokenizer, it bypasses the setter)."""

    def get(model: Any) -> int:
        return token_limit(f"{name} (the tokenizer's model_max_length)", model.tokenizer.model_max_length,
                           positions(model), least)

    def put(model: Any, value: int) -> None:
        model.tokenizer.model_max_length = token_limit(name, value, positions(model), least)

    return property(get, put, doc=f"The tokens a text (or pair) is cut at, its special tokens included: the "
                                  f"tokenizer's model_max_length, at least {least} and at most the encoder's positions.")


def write_st_config(directory: Path, model_type: str, **fields: Any) -> None:
    """``config_sentence_transformers.json``: the versions that wrote it, ``model_type`` (SentenceTransformer,
    SparseEncoder, CrossEncoder) and the model's own ``fields`` (prompts, similarity, ...), as given."""
    import torch

    from bertkit import __version__
    from bertkit.outputs import atomic_write_json

    atomic_write_json(directory / ST_CONFIG, {"__version__": {"bertkit": __version__, "pytorch": torch.__version__},
                                              "model_type": model_type,
                                              **fields})


def saved_cross_encoder(directory: Path) -> bool:
    """Whether sentence-transformers' CrossEncoder reads ``directory`` as one it saved: a modules.json, and a
    config_sentence_transformers.json whose ``model_type`` is "CrossEncoder". Any other it converts ("Converting
    SentenceTransformer model ... to CrossEncoder.": no file or no key is "SentenceTransformer" there), loading the
    checkpoint with none of the settings those files and sentence_bert_config.json hold."""
    return (directory / MODULES).is_file() and (read_json(directory / ST_CONFIG) or {}).get("model_type") == "CrossEncoder"


def saved_activation(directory: Path, config_extra: dict[str, Any]) -> str | None:
    """The activation a cross-encoder directory names (``torch.nn.modules.activation.Sigmoid``, ...), None where it
    names none, read as sentence-transformers reads it: config_sentence_transformers.json (v5 and later), only in a
    directory it saved (``saved_cross_encoder``; any other it loads as a plain checkpoint); else config.json's
    "sentence_transformers" (v4; ``config_extra`` holds config.json's keys bertkit's config does not), which ends the
    search when it has the key, even set to null; else its "sbert_ce_default_activation_function" (before v4)."""
    directory = Path(directory)
    named = (read_json(directory / ST_CONFIG) or {}).get("activation_fn") if saved_cross_encoder(directory) else None
    if named:
        return named
    v4 = config_extra.get("sentence_transformers")
    if isinstance(v4, dict) and "activation_fn" in v4:
        return v4["activation_fn"]
    return config_extra.get("sbert_ce_default_activation_function")


@dataclass(frozen=True)
class SentenceDirectory:
    """A directory's sentence-embedding settings; for a plain checkpoint (no modules.json) ``pooling`` is None and
    the rest their defaults."""

    path: Path
    encoder_dir: Path  # where config.json, the weights and the tokenizer are
    pooling: Pooling | None = None
    normalize: bool = False
    max_seq_length: int | None = None  # None: not declared (the tokenizer's and the positions' limit applies)
    do_lower_case: bool = False
    prompts: dict[str, str] = field(default_factory=dict)
    default_prompt_name: str | None = None
    similarity_fn_name: str | None = None
    truncate_dim: int | None = None
    dense: tuple[Path, ...] = ()  # the Dense modules' directories, applied in this order after pooling

    @property
    def default_prompt(self) -> str | None:
        return self.prompts.get(self.default_prompt_name) if self.default_prompt_name is not None else None

    def truncate_dim_within(self, width: int) -> int | None:
        """The saved truncate_dim, refused naming the file where it exceeds the model's ``width``: sentence-transformers
        slices with it and keeps every dimension, and the caller, who never gave the value, must learn where it is."""
        if self.truncate_dim is not None and self.truncate_dim > width:
            raise BertkitError(f"{self.path / ST_CONFIG}: truncate_dim {self.truncate_dim} exceeds this model's {width} "
                               f"dimensions (sentence-transformers then keeps all {width}); write a truncate_dim in "
                               f"[1, {width}] there or remove it (in Python, truncate_dim= chooses another)")
        return self.truncate_dim


class OtherModelKind(BertkitError):
    """A directory of another sentence-transformers class (``kind``: its model_type, e.g. CrossEncoder) loaded as a
    SentenceTransformer's: the pipelines add the task that runs it (``inference.embedding``, where tasks are known)."""

    def __init__(self, message: str, kind: str):
        super().__init__(message)
        self.kind = kind


def read_directory(path: str | Path) -> SentenceDirectory:
    """``path``'s sentence-transformers settings (``SentenceDirectory``). A module bertkit does not implement (a
    LayerNorm, a custom module) and a value that cannot be one are refused, naming the file."""
    path = Path(path)
    modules = read_modules(path)
    if modules is None:
        return SentenceDirectory(path, path)
    types = module_types(modules)
    unknown = [t for t in types if t not in _TYPES]
    normalize = types[-1:] == ["Normalize"]
    dense = types[2:len(types) - normalize]
    if unknown or types[:2] != ["Transformer", "Pooling"] or set(dense) - {"Dense"}:
        kind = (read_json(path / ST_CONFIG) or {}).get("model_type")
        if kind in ("CrossEncoder", "SparseEncoder"):  # a reranker or SPLADE directory run as an embedder by mistake
            raise OtherModelKind(f"{path} is a {kind} directory ({ST_CONFIG} says model_type {kind!r}), not a "
                                 f"SentenceTransformer's: load it with bertkit.sentence.{kind}", kind)
        raise BertkitError(f"{path / MODULES} lists the modules {types}; bertkit implements Transformer, Pooling, "
                           f"any Dense and an optional Normalize, in that order (not {unknown or types}); use "
                           "sentence-transformers for this model")
    encoder_dir = path / encoder_path(modules)
    pooling_file = path / modules[1]["path"] / "config.json"
    pooling = read_json(pooling_file)
    if pooling is None:
        raise MissingFileError(f"{pooling_file} is missing; {path / MODULES} lists a Pooling module there"
                               f"{cache_hint(path)}")
    sbert_file = encoder_dir / SBERT_CONFIG  # the Transformer module's own, as sentence-transformers reads it
    sbert = read_json(sbert_file) or {}
    st = read_json(path / ST_CONFIG) or {}
    max_seq_length = transformer_max_seq_length(sbert, sbert_file)
    truncate_dim = _whole(st.get("truncate_dim"), "truncate_dim", path / ST_CONFIG)
    prompts = st.get("prompts") or {}
    if not (isinstance(prompts, dict) and all(isinstance(v, str) or v is None for v in prompts.values())):
        raise BertkitError(f"{path / ST_CONFIG}: prompts must be an object of strings, got {str(prompts)[:80]}")
    return SentenceDirectory(path, encoder_dir, Pooling.from_config(pooling, str(pooling_file)), normalize,
                             max_seq_length, bool(sbert.get("do_lower_case", False)), dict(prompts),
                             st.get("default_prompt_name"), st.get("similarity_fn_name"), truncate_dim,
                             tuple(path / m.get("path", "") for m in modules[2:2 + len(dense)]))


def transformer_max_seq_length(sbert: dict[str, Any], sbert_file: Path | str,
                               task_keys: dict[str, Any] | None = None) -> int | None:
    """Where an embedder's Transformer module cuts its texts, from its sentence_bert_config.json ``sbert``: a
    model_max_length in tokenizer_args (processor_kwargs) wins over max_seq_length, as in sentence-transformers 6. A
    key bertkit does not apply (model or config arguments, another task or output, per-task lengths) is refused with
    what to change, as a key sentence-transformers does not know fails there. ``task_keys``: the task and output
    keys at the values the reader computes, where they are not a dense Transformer's (a sparse encoder's fill-mask).
    ``sbert_file`` names where the settings come from: the file, or the call (``models.Transformer``) giving them."""
    defaults = {**_TRANSFORMER_DEFAULTS, **(task_keys or {})}
    args = {k: sbert[k] if isinstance(sbert[k], dict) else {"": sbert[k]} for k in (*_TOKENIZER_ARGS, *_MODEL_ARGS)
            if sbert.get(k)}
    refused = {f"{k}.{a}" if a else k: v for k, given in args.items() for a, v in given.items()
               if a not in _NO_EFFECT and (k not in _TOKENIZER_ARGS or a != "model_max_length")}
    refused.update({k: v for k, v in sbert.items() if k in defaults and v not in (defaults[k], None)})
    known = {"max_seq_length", "do_lower_case", *defaults, *_TOKENIZER_ARGS, *_MODEL_ARGS, *_NO_EFFECT}
    refused.update({k: v for k, v in sbert.items() if k not in known})
    if refused:
        raise BertkitError(f"{sbert_file} sets {refused}, which bertkit does not apply, so its vectors would not be "
                           "sentence-transformers': bertkit embeds with the encoder's last layer in float32, each "
                           "text cut at max_seq_length; move a tokenizer setting (do_lower_case, strip_accents) to "
                           "tokenizer_config.json, remove what the model does not need, or use sentence-transformers")
    return declared_length(sbert, sbert_file)


def cross_encoder_max_seq_length(directory: Path) -> int | None:
    """Where a cross-encoder ``directory``'s pairs are cut, as its sentence_bert_config.json declares it (None: the
    tokenizer's model_max_length), for ``CrossEncoder`` and the rerank pipeline. What the directory sets that
    bertkit's CrossEncoder does not apply is refused rather than loaded: another transformer_task (no classifier), the
    file's do_lower_case (sentence-transformers lowercases both texts of each pair; bertkit scored them as given), a
    setting a SentenceTransformer's file is refused for (``transformer_max_seq_length``), a default_prompt_name
    naming none of the prompts (sentence-transformers refuses it too), and a default prompt in
    config_sentence_transformers.json (sentence-transformers puts it before every query; bertkit implements no
    cross-encoder prompts and scored the bare pairs, 0.5124 against 0.5127 for a SQuAD pair with "query: ")."""
    sbert_file = directory / SBERT_CONFIG
    sbert = read_json(sbert_file) or {}
    task = sbert.get("transformer_task", _CROSS_ENCODER_KEYS["transformer_task"])
    if task != _CROSS_ENCODER_KEYS["transformer_task"]:  # an embedder's ("feature-extraction"), a sparse encoder's
        raise BertkitError(f"{sbert_file}: transformer_task {task!r} is not a cross-encoder's (sequence-classification), "
                           "so this directory holds no classifier to score pairs with: serve an embedder's as "
                           "sentence-embedding (CrossEncoder(path) gives its encoder a new classifier to train), a "
                           "sparse encoder's as sparse-embedding")
    if sbert.get("do_lower_case"):
        raise BertkitError(f"{sbert_file} sets do_lower_case, which bertkit's CrossEncoder does not apply "
                           "(sentence-transformers lowercases both texts of each pair): set it in the tokenizer's "
                           "files instead (do_lower_case: true in tokenizer_config.json, with strip_accents: false "
                           "where the tokenizer keeps accents, as that lowercasing does) and remove it here, or use "
                           "sentence-transformers")
    config = read_json(directory / ST_CONFIG) or {}
    name, prompts = config.get("default_prompt_name"), config.get("prompts") or {}
    if name is not None and name not in prompts:
        # sentence-transformers refuses to load it (ValueError); bertkit loaded it and scored the bare pairs
        raise BertkitError(f"{directory / ST_CONFIG} sets default_prompt_name {name!r}, which is not one of its prompts "
                           f"{sorted(prompts)} (sentence-transformers refuses to load it): set default_prompt_name to "
                           "null there, or add the prompt it names")
    prompt = prompts.get(name) if name is not None else None
    if prompt:
        raise BertkitError(f"{directory / ST_CONFIG} sets default_prompt_name {name!r}: sentence-transformers puts its "
                           f"prompt {prompt!r} before every query, and bertkit does not implement cross-encoder "
                           "prompts; load it with sentence-transformers, or set default_prompt_name to null there and "
                           "put the prompt before each query yourself")
    return transformer_max_seq_length(sbert, sbert_file, _CROSS_ENCODER_KEYS)


def _whole(value: Any, name: str, where: Path | str) -> int | None:
    if value is None:
        return None
    if not is_whole(value):
        raise BertkitError(f"{where}: {name} {value!r} must be a whole number >= 1 (or absent)")
    return value
