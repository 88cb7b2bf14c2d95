"""Checkpoints in the Hugging Face layout: one declarative key table, strict loading, safe saving.

A checkpoint directory holds ``config.json`` and ``model.safetensors`` (or a legacy ``pytorch_model.bin``,
read only with ``torch.load(weights_only=True)``), plus the tokenizer's ``vocab.txt`` and
``tokenizer_config.json``. Every parameter bertkit has is named in ``KEY_TABLE`` below together with the
published name(s) it comes from; nothing else in the code base knows the published names.

Loading is strict: a key the model needs that the file lacks, a key in the file that no row of the table
knows, or a tensor whose shape does not fit the config is an error that lists every such key. Two cases
are not errors because users rely on them, and each is reported in one log line:
- a task head (or the pooler) absent from a pre-trained checkpoint is initialised fresh
  (fine-tuning starts exactly so);
- weights of a head the model does not have (e.g. the pre-training heads of ``bert-base-uncased`` when
  loading a classifier) are dropped.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from bertkit.config import BertConfig
from bertkit.errors import BertkitError, MissingFileError
from bertkit.outputs import atomic_target, atomic_write_text

logger = logging.getLogger("bertkit")

WEIGHTS_NAME = "model.safetensors"
LEGACY_WEIGHTS_NAME = "pytorch_model.bin"
CONFIG_NAME = "config.json"

# ---------------------------------------------------------------------------------------------------
# The key table: (bertkit name, published name or names). Several published names are concatenated
# along dim 0 on load and split back on save (the fused q/k/v projection). "{i}" is the layer index.
# Encoder names are relative to the encoder; head models prefix "bert." on both sides.
# ---------------------------------------------------------------------------------------------------
Row = tuple[str, tuple[str, ...]]

_ENCODER: list[Row] = [
    ("embeddings.word_embeddings.weight", ("embeddings.word_embeddings.weight",)),
    ("embeddings.position_embeddings.weight", ("embeddings.position_embeddings.weight",)),
    ("embeddings.token_type_embeddings.weight", ("embeddings.token_type_embeddings.weight",)),
    ("embeddings.layer_norm.weight", ("embeddings.LayerNorm.weight",)),
    ("embeddings.layer_norm.bias", ("embeddings.LayerNorm.bias",)),
]
_LAYER: list[Row] = [
    *[(f"layers.{{i}}.qkv.{p}", tuple(f"encoder.layer.{{i}}.attention.self.{n}.{p}" for n in ("query", "key", "value")))
      for p in ("weight", "bias")],
    *[(f"layers.{{i}}.{ours}.{p}", (f"encoder.layer.{{i}}.{theirs}.{p}",))
      for ours, theirs in (("attn_out", "attention.output.dense"), ("attn_norm", "attention.output.LayerNorm"),
                           ("ffn_in", "intermediate.dense"), ("ffn_out", "output.dense"),
                           ("ffn_norm", "output.LayerNorm"))
      for p in ("weight", "bias")],
]
_POOLER: list[Row] = [(f"pooler.dense.{p}", (f"pooler.dense.{p}",)) for p in ("weight", "bias")]

_MLM: list[Row] = [
    ("mlm.transform.weight", ("cls.predictions.transform.dense.weight",)),
    ("mlm.transform.bias", ("cls.predictions.transform.dense.bias",)),
    ("mlm.layer_norm.weight", ("cls.predictions.transform.LayerNorm.weight",)),
    ("mlm.layer_norm.bias", ("cls.predictions.transform.LayerNorm.bias",)),
    ("mlm.bias", ("cls.predictions.bias",)),
]
_NSP: list[Row] = [(f"nsp.{p}", (f"cls.seq_relationship.{p}",)) for p in ("weight", "bias")]
_CLASSIFIER: list[Row] = [(f"classifier.{p}", (f"classifier.{p}",)) for p in ("weight", "bias")]
_QA: list[Row] = [(f"qa_outputs.{p}", (f"qa_outputs.{p}",)) for p in ("weight", "bias")]

KEY_TABLE: dict[str, list[Row]] = {
    "base": [],
    "pretraining": _MLM + _NSP,
    "masked_lm": _MLM,
    "next_sentence": _NSP,
    "sequence_classification": _CLASSIFIER,
    "token_classification": _CLASSIFIER,
    "question_answering": _QA,
    "multiple_choice": _CLASSIFIER,
}

# Published names that carry no information of their own: the MLM decoder is tied to the word
# embeddings and its bias to cls.predictions.bias (paper's code: output_weights = embedding table), and
# old checkpoints store the position-id buffer. Accepted on load, never written.
IGNORED_KEYS = ("cls.predictions.decoder.weight", "cls.predictions.decoder.bias", "embeddings.position_ids")


def _expand(rows: list[Row], num_layers: int) -> list[Row]:
    out: list[Row] = []
    for ours, theirs in rows:
        if "{i}" in ours:
            out += [(ours.format(i=i), tuple(t.format(i=i) for t in theirs)) for i in range(num_layers)]
        else:
            out.append((ours, theirs))
    return out


def _normalise_published_key(key: str) -> str:
    """Keys of TF-converted checkpoints use LayerNorm.gamma/beta; transformers renamed them weight/bias."""
    if key.endswith(".gamma"):
        return key[: -len("gamma")] + "weight"
    if key.endswith(".beta"):
        return key[: -len("beta")] + "bias"
    return key


def _strip_encoder_prefix(key: str) -> str:
    return key[len("bert."):] if key.startswith("bert.") else key


def _all_known_published_keys(num_layers: int) -> set[str]:
    rows = _expand(_ENCODER + _LAYER + _POOLER, num_layers)
    for head_rows in KEY_TABLE.values():
        rows += head_rows
    return {t for _, theirs in rows for t in theirs} | set(IGNORED_KEYS)


# ---------------------------------------------------------------------------------------------------
# Reading weight files
# ---------------------------------------------------------------------------------------------------


def read_weights(directory: Path) -> dict[str, Tensor]:
    """The state dict stored in ``directory`` (safetensors first, else the legacy torch pickle, safely)."""
    st_path, bin_path = directory / WEIGHTS_NAME, directory / LEGACY_WEIGHTS_NAME
    if st_path.is_file():
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        try:
            return load_file(str(st_path))
        except SafetensorError as e:
            raise BertkitError(
                f"{st_path} could not be read as safetensors ({e}); the file is truncated or corrupt "
                f"(size {st_path.stat().st_size} bytes): copy or download it again"
            ) from e
    if bin_path.is_file():
        # weights_only=True refuses arbitrary pickled objects: a checkpoint must not be able to run code.
        import pickle

        try:
            return torch.load(bin_path, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as e:
            raise BertkitError(f"{bin_path} holds Python code, not only tensors, so bertkit will not load it; "
                               f"convert it to {WEIGHTS_NAME} with a tool you trust ({str(e).splitlines()[0]})"
                               ) from None
    raise MissingFileError(
        f"no weights in {directory}: expected {WEIGHTS_NAME} (or legacy {LEGACY_WEIGHTS_NAME}); "
        "point at a directory written by save_pretrained, or fetch the example with "
        "`bertkit download-example-model DIR`"
    )


# ---------------------------------------------------------------------------------------------------
# The mixin every bertkit model inherits
# ---------------------------------------------------------------------------------------------------


_DTYPES = {"float32": torch.float32, "float": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
           "half": torch.float16}


def _as_dtype(dtype: torch.dtype | str) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if str(dtype).removeprefix("torch.") in _DTYPES:
        return _DTYPES[str(dtype).removeprefix("torch.")]
    raise BertkitError(f"dtype {dtype!r} is not one of {', '.join(_DTYPES)} (or a torch.dtype)")


def resolve_checkpoint_dir(path: str | Path) -> Path:
    """A checkpoint directory on disk. A Hugging Face hub id (``bert-base-uncased``, ``google/bert_uncased_L-2_H-128_A-2``)
    is looked up in huggingface_hub's local cache when that package is installed; bertkit never downloads at
    run time, so otherwise the error says how to get the files."""
    directory = Path(path)
    if directory.is_dir():
        return directory
    text = str(path)
    looks_like_hub_id = (re.fullmatch(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?", text) is not None
                         and not text.startswith(".") and not directory.suffix)
    if looks_like_hub_id:
        try:
            from huggingface_hub import snapshot_download

            return Path(snapshot_download(text, local_files_only=True))  # the cache only: no network, no hang
        except Exception:  # noqa: BLE001 (not installed, not cached, or any hub error: same advice)
            pass
        raise MissingFileError(
            f"{text!r} is not a directory here. If it is a Hugging Face hub model id, bertkit does not download "
            f"at run time: fetch the files once (`huggingface-cli download {text} --local-dir models/{text}`, or "
            f"`git clone https://huggingface.co/{text} models/{text}`) and pass that directory")
    raise MissingFileError(f"checkpoint directory {directory} does not exist")


class PretrainedMixin:
    """``from_pretrained`` / ``save_pretrained`` for ``BertModel`` and every head model.

    Subclasses set ``checkpoint_head`` (a key of ``KEY_TABLE``). A head model keeps its encoder in
    ``self.bert``; ``BertModel`` is its own encoder.
    """

    checkpoint_head: str = "base"
    config: BertConfig

    # -- the rows this model owns ---------------------------------------------------------------------
    def _encoder(self):
        return getattr(self, "bert", self)

    def _rows(self) -> tuple[list[Row], list[Row]]:
        """(encoder rows, head rows) with bertkit and published names as this model's state dict has them."""
        enc = self._encoder()
        prefix = "bert." if enc is not self else ""
        base = _ENCODER + _LAYER + (_POOLER if enc.pooler is not None else [])
        encoder_rows = [(prefix + o, tuple(prefix + t for t in ts))
                        for o, ts in _expand(base, self.config.num_hidden_layers)]
        return encoder_rows, list(KEY_TABLE[self.checkpoint_head])

    # -- loading --------------------------------------------------------------------------------------
    @classmethod
    def from_pretrained(cls, path: str | Path, *, config: BertConfig | None = None,
                        dtype: torch.dtype | str | None = None, device: torch.device | str | None = None,
                        **config_overrides: Any):
        """Build the model from a Hugging Face-layout directory; keyword arguments override config fields.

        ``num_labels=3`` or ``id2label={0: "neg", ...}`` set the size of a fresh classification head.
        ``dtype`` (``torch.bfloat16`` or ``"bfloat16"``) and ``device`` place the loaded model. A keyword
        that is no config field is an error (transformers would keep it as an attribute; here a typo such
        as ``num_label=3`` must not pass silently).
        """
        unknown = sorted(set(config_overrides) - BertConfig.field_names() - {"num_labels"})
        if unknown:
            raise BertkitError(f"{cls.__name__}.from_pretrained got unknown keyword argument(s) {', '.join(unknown)}; "
                               f"it takes config=, dtype=, device= and BertConfig fields "
                               f"({', '.join(sorted(BertConfig.field_names()))}, num_labels)")
        directory = resolve_checkpoint_dir(path)
        if config is None:
            config = BertConfig.from_json_file(directory / CONFIG_NAME, **config_overrides)
        elif config_overrides:
            raise BertkitError("pass either config= or config field overrides, not both")
        model = cls(config)
        model.load_published_state_dict(read_weights(directory), source=str(directory))
        if dtype is not None:
            model.to(dtype=_as_dtype(dtype))
        if device is not None:
            model.to(device)
        return model

    # -- what transformers users call -------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.parameters()).dtype

    def gradient_checkpointing_enable(self) -> None:
        """Recompute each encoder layer in the backward pass instead of storing its activations (training only)."""
        self._encoder().gradient_checkpointing = True

    def gradient_checkpointing_disable(self) -> None:
        self._encoder().gradient_checkpointing = False

    def get_input_embeddings(self) -> torch.nn.Embedding:
        return self._encoder().embeddings.word_embeddings

    def set_input_embeddings(self, embeddings: torch.nn.Embedding) -> None:
        if embeddings.embedding_dim != self.config.hidden_size:
            raise BertkitError(f"input embeddings of width {embeddings.embedding_dim} do not fit hidden_size "
                               f"{self.config.hidden_size}")
        self._encoder().embeddings.word_embeddings = embeddings
        self.config.vocab_size = embeddings.num_embeddings

    def load_published_state_dict(self, published: dict[str, Tensor], source: str = "state dict") -> None:
        """Load weights named as Hugging Face names them (with or without the ``bert.`` prefix)."""
        # Canonicalise the file's names: LayerNorm.gamma -> weight, and the encoder prefix to this model's.
        prefix = "bert." if self._encoder() is not self else ""
        tensors: dict[str, Tensor] = {}
        for key, value in published.items():
            key = _normalise_published_key(key)
            bare = _strip_encoder_prefix(key)
            is_encoder = bare.startswith(("embeddings.", "encoder.", "pooler."))
            tensors[prefix + bare if is_encoder else key] = value

        encoder_rows, head_rows = self._rows()
        own = self.state_dict()
        new_state: dict[str, Tensor] = {}
        missing_encoder, fresh, shape_errors = [], [], []
        for rows, required in ((encoder_rows, True), (head_rows, False)):
            for ours, theirs in rows:
                if not all(t in tensors for t in theirs):
                    # The pooler is optional like a head: MLM-only checkpoints do not carry it.
                    optional = not required or ours.startswith(("pooler.", "bert.pooler."))
                    (fresh if optional else missing_encoder).append(", ".join(t for t in theirs if t not in tensors))
                    continue
                value = torch.cat([tensors[t] for t in theirs], 0) if len(theirs) > 1 else tensors[theirs[0]]
                if value.shape != own[ours].shape:
                    shape_errors.append(f"{'+'.join(theirs)}: file {tuple(value.shape)}, model {tuple(own[ours].shape)}")
                    continue
                new_state[ours] = value
        used = {t for _, theirs in encoder_rows + head_rows for t in theirs}
        leftovers = sorted(k for k in tensors if k not in used and _strip_encoder_prefix(k) not in IGNORED_KEYS
                           and k not in IGNORED_KEYS)
        known = _all_known_published_keys(self.config.num_hidden_layers)
        unknown = [k for k in leftovers if _strip_encoder_prefix(k) not in known and k not in known]
        other_heads = [k for k in leftovers if k not in unknown]

        problems = []
        if missing_encoder:
            problems.append(f"missing keys: {missing_encoder}")
        if unknown:
            problems.append(f"unexpected keys: {unknown}")
        if shape_errors:
            problems.append(
                f"shape mismatches: {shape_errors} (the config says hidden_size={self.config.hidden_size}, "
                f"num_hidden_layers={self.config.num_hidden_layers}, vocab_size={self.config.vocab_size}, "
                f"num_labels={self.config.num_labels}; fix config.json or pass matching overrides)"
            )
        if problems:
            raise BertkitError(f"{source} does not match {type(self).__name__}: " + "; ".join(problems))
        if fresh:
            logger.warning("%s: initialised fresh (not in %s): %s", type(self).__name__, source, ", ".join(fresh))
        if other_heads:
            logger.info("%s: ignored weights of heads this model does not have: %s", type(self).__name__,
                        ", ".join(other_heads))
        result = self.load_state_dict(new_state, strict=False)  # type: ignore[attr-defined]
        assert not result.unexpected_keys, result.unexpected_keys

    # -- saving ---------------------------------------------------------------------------------------
    def published_state_dict(self) -> dict[str, Tensor]:
        """This model's weights under the published names (q/k/v split back into three tensors)."""
        own = self.state_dict()  # type: ignore[attr-defined]
        out: dict[str, Tensor] = {}
        encoder_rows, head_rows = self._rows()
        for ours, theirs in encoder_rows + head_rows:
            chunks = own[ours].chunk(len(theirs), 0) if len(theirs) > 1 else (own[ours],)
            for name, chunk in zip(theirs, chunks):
                out[name] = chunk.detach().contiguous().cpu()
        return out

    def save_pretrained(self, path: str | Path) -> Path:
        """Write config.json and model.safetensors in the Hugging Face layout; returns the directory.

        Files are written to temporary names and renamed, so an interrupted save never leaves a
        half-written checkpoint under the final name.
        """
        directory = Path(path)
        directory.mkdir(parents=True, exist_ok=True)
        config = self.config.to_dict()
        config["architectures"] = [type(self).__name__]
        from safetensors.torch import save_file

        with atomic_target(directory / WEIGHTS_NAME) as tmp:
            save_file(self.published_state_dict(), str(tmp), metadata={"format": "pt"})
        atomic_write_text(directory / CONFIG_NAME, json.dumps(config, indent=2, sort_keys=True) + "\n")
        return directory
