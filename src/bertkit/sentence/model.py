"""``SentenceTransformer``: a BERT encoder, pooling and an optional unit-length normalisation, read from and
written to sentence-transformers' directory layout.

    model = SentenceTransformer("models/all-MiniLM-L6-v2")
    emb = model.encode(["A man is eating food.", "A man rides a horse."], normalize_embeddings=True)
    model.similarity(emb, emb)

The directory: ``modules.json`` lists the modules (Transformer at "" or "0_Transformer", Pooling at 1_Pooling,
Normalize at 2_Normalize); ``sentence_bert_config.json`` holds max_seq_length and do_lower_case;
``config_sentence_transformers.json`` the prompts, default_prompt_name and similarity_fn_name. A plain Hugging
Face checkpoint (no modules.json) gets mean pooling and no normalisation, as sentence-transformers gives it. A
module bertkit does not implement (Dense, a custom module) is refused by name.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from bertkit import __version__
from bertkit.errors import BertkitError
from bertkit.modeling import BertModel
from bertkit.outputs import atomic_write_json
from bertkit.sentence.pooling import Pooling
from bertkit.sentence.quantization import PRECISIONS, quantize_embeddings
from bertkit.sentence.util import SIMILARITY_FUNCTIONS, similarity_function
from bertkit.tokenization import AutoTokenizer

logger = logging.getLogger("bertkit")

MODULES = "modules.json"
ST_CONFIG = "config_sentence_transformers.json"
SBERT_CONFIG = "sentence_bert_config.json"
_TYPES = {"Transformer", "Pooling", "Normalize"}

# sentence-transformers' constructor arguments bertkit does not implement, with what to do instead
_REFUSED_INIT = {
    "modules": "build the directory with sentence-transformers, or start from a BERT checkpoint directory",
    "cache_folder": "bertkit loads local directories; download the model first",
    "trust_remote_code": "bertkit runs BERT only; drop this argument",
    "revision": "bertkit loads local directories; check out the revision first",
    "token": "bertkit loads local directories; download the model first",
    "backend": "bertkit runs its own PyTorch encoder; for int8 use bertkit.pipeline(..., quantize='int8')",
    "model_kwargs": "bertkit builds its BertModel from config.json; drop this argument",
    "tokenizer_kwargs": "bertkit reads the tokenizer's settings from its files; drop this argument",
    "config_kwargs": "edit config.json, or set dropout on model.bert after loading",
    "model_card_data": "bertkit writes no model card; drop this argument",
}


def _module_type(entry: dict[str, Any]) -> str:
    return str(entry.get("type", "")).rsplit(".", 1)[-1]



def as_requested(rows: Tensor, convert_to_tensor: bool, convert_to_numpy: bool, single: bool) -> Any:
    """``rows`` as sentence-transformers returns them: a tensor, an array, or a list of row tensors; one row for a
    single input."""
    result: Any = rows if convert_to_tensor else rows.numpy() if convert_to_numpy else list(rows)
    return result[0] if single else result

class SentenceTransformer(nn.Module):
    """A BERT encoder + pooling (+ Normalize). ``forward`` takes a tokenized batch and returns the sentence
    embeddings (B, D); ``encode`` takes texts."""

    def __init__(self, model_name_or_path: str | Path, device: str | None = None, *,
                 prompts: dict[str, str] | None = None, default_prompt_name: str | None = None,
                 similarity_fn_name: str | None = None, truncate_dim: int | None = None,
                 local_files_only: bool = True, **unknown: Any):
        super().__init__()
        for name in unknown:
            if name in _REFUSED_INIT:
                raise BertkitError(f"SentenceTransformer({name}=...) is not implemented in bertkit: {_REFUSED_INIT[name]}")
            raise BertkitError(f"SentenceTransformer got an unknown argument {name!r}")
        if not local_files_only:
            raise BertkitError("bertkit.sentence loads local directories only; download the model and pass its path")
        path = Path(model_name_or_path)
        if not path.is_dir():
            raise FileNotFoundError(f"sentence-transformers directory {path} does not exist; pass a directory with "
                                    f"{MODULES} (or a BERT checkpoint directory with config.json)")
        self.name_or_path = str(path)
        encoder_dir, pooling, self.normalize = self._read_modules(path)
        self.bert = BertModel.from_pretrained(encoder_dir)
        self.tokenizer = AutoTokenizer.from_pretrained(encoder_dir)
        if pooling is None:
            logger.warning("%s has no %s: mean pooling, no normalisation (as sentence-transformers builds it)",
                           path, MODULES)
            pooling = Pooling(self.bert.config.hidden_size)
        if pooling.embedding_dimension != self.bert.config.hidden_size:
            raise BertkitError(f"{path}: 1_Pooling says {pooling.embedding_dimension} dimensions but the encoder's "
                               f"hidden_size is {self.bert.config.hidden_size}; the directory is inconsistent")
        self.pooling = pooling
        sbert = _read_json(encoder_dir / SBERT_CONFIG) or _read_json(path / SBERT_CONFIG) or {}
        positions = self.bert.config.max_position_embeddings
        self.max_seq_length = int(sbert.get("max_seq_length") or min(self.tokenizer.model_max_length, positions))
        if self.max_seq_length > positions:
            raise BertkitError(f"{path}: max_seq_length {self.max_seq_length} exceeds max_position_embeddings "
                               f"{positions} of this checkpoint; lower it in {SBERT_CONFIG}")
        self.do_lower_case = bool(sbert.get("do_lower_case", False))
        st = _read_json(path / ST_CONFIG) or {}
        self.prompts: dict[str, str] = dict(st.get("prompts") or {}) if prompts is None else dict(prompts)
        self.default_prompt_name = default_prompt_name if default_prompt_name is not None \
            else st.get("default_prompt_name")
        if self.default_prompt_name is not None and self.default_prompt_name not in self.prompts:
            raise BertkitError(f"default_prompt_name {self.default_prompt_name!r} is not one of the prompts "
                               f"{sorted(self.prompts)}")
        self.similarity_fn_name = similarity_function(similarity_fn_name or st.get("similarity_fn_name") or "cosine")
        self.truncate_dim = self._check_dim(truncate_dim, "truncate_dim")
        self.bert.eval()
        if device is not None:
            self.to(device)

    # -- reading the directory --------------------------------------------------------------------------------
    @staticmethod
    def _read_modules(path: Path) -> tuple[Path, Pooling | None, bool]:
        """(the encoder's directory, the pooling, whether embeddings are normalised) from modules.json."""
        modules = _read_json(path / MODULES)
        if modules is None:
            return path, None, False
        types = [_module_type(m) for m in modules]
        unknown = [t for t in types if t not in _TYPES]
        if unknown or types[:2] != ["Transformer", "Pooling"] or types[2:] not in ([], ["Normalize"]):
            raise BertkitError(f"{path / MODULES} lists the modules {types}; bertkit implements Transformer, Pooling "
                               "and an optional Normalize, in that order (not "
                               f"{unknown or types}); use sentence-transformers for this model")
        encoder_dir = path / modules[0].get("path", "")
        pooling_file = path / modules[1]["path"] / "config.json"
        config = _read_json(pooling_file)
        if config is None:
            raise FileNotFoundError(f"{pooling_file} is missing; {path / MODULES} lists a Pooling module there")
        return encoder_dir, Pooling.from_config(config, str(pooling_file)), len(types) == 3

    def _check_dim(self, dim: int | None, name: str) -> int | None:
        if dim is None:
            return None
        full = self.get_sentence_embedding_dimension()
        if isinstance(dim, bool) or not isinstance(dim, int) or not 1 <= dim <= full:
            raise BertkitError(f"{name} {dim!r} must be a whole number in [1, {full}] (this model's dimension)")
        return dim

    # -- what sentence-transformers' model exposes ------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return self.bert.embeddings.word_embeddings.weight.device

    def get_sentence_embedding_dimension(self) -> int:
        """The width of the embeddings ``encode`` returns (``truncate_dim`` when set)."""
        full = self.pooling.output_dimension
        return min(full, self.truncate_dim) if getattr(self, "truncate_dim", None) else full

    def get_max_seq_length(self) -> int:
        return self.max_seq_length

    @property
    def similarity(self):
        """``model.similarity(a, b)``: the (N, M) similarity matrix by ``similarity_fn_name``."""
        return SIMILARITY_FUNCTIONS[self.similarity_fn_name][0]

    @property
    def similarity_pairwise(self):
        return SIMILARITY_FUNCTIONS[self.similarity_fn_name][1]

    # -- tokenizing and the forward pass ------------------------------------------------------------------------
    def tokenize(self, texts: Sequence[str], prompt: str | None = None) -> dict[str, Tensor]:
        """``input_ids``, ``token_type_ids``, ``attention_mask`` (B, T), truncated to max_seq_length, and
        ``prompt_length`` (the prompt's tokens after [CLS], 0 without one)."""
        texts = [(prompt or "") + t for t in texts]
        if self.do_lower_case:
            texts = [t.lower() for t in texts]
        batch = dict(self.tokenizer(texts, padding=True, truncation=True, max_length=self.max_seq_length,
                                    return_tensors="pt"))
        batch["prompt_length"] = self.prompt_length(prompt)
        return batch

    def prompt_length(self, prompt: str | None) -> int:
        """How many leading tokens (with [CLS]) the prompt takes: what Pooling leaves out when include_prompt is False."""
        if not prompt:
            return 0
        return len(self.tokenizer(prompt.lower() if self.do_lower_case else prompt)["input_ids"]) - 1

    def embed(self, input_ids: Tensor, attention_mask: Tensor, token_type_ids: Tensor | None = None,
              prompt_length: int = 0) -> Tensor:
        """(B, D) sentence embeddings of a tokenized batch: encoder, pooling, then Normalize if the model has it."""
        out = self.bert(input_ids, attention_mask, token_type_ids)
        v = self.pooling(out, attention_mask, prompt_length)
        return F.normalize(v, p=2, dim=-1) if self.normalize else v

    def forward(self, features: dict[str, Tensor]) -> dict[str, Tensor]:
        """sentence-transformers' ``model(features)``: the features with ``sentence_embedding`` added."""
        emb = self.embed(features["input_ids"], features["attention_mask"], features.get("token_type_ids"),
                         int(features.get("prompt_length", 0)))
        return {**features, "sentence_embedding": emb}

    # -- encode ----------------------------------------------------------------------------------------------------
    def encode(self, sentences: str | Sequence[str], prompt_name: str | None = None, prompt: str | None = None,
               batch_size: int = 32, show_progress_bar: bool | None = None,
               output_value: str | None = "sentence_embedding", precision: str = "float32",
               convert_to_numpy: bool = True, convert_to_tensor: bool = False, device: str | None = None,
               normalize_embeddings: bool = False, truncate_dim: int | None = None, **unknown: Any) -> Any:
        """Embed texts: a (N, D) numpy array by default, a tensor with ``convert_to_tensor``, a list of tensors
        with both conversions off; one string gives one vector. Texts run longest first in batches of
        ``batch_size`` and come back in their order. ``prompt`` (or ``prompt_name``, a key of ``prompts``) is put
        before each text; ``truncate_dim`` keeps the first dimensions, before ``normalize_embeddings`` scales each
        to unit length; ``precision`` quantizes the result as ``quantize_embeddings`` does (int8/uint8 buckets from
        these embeddings)."""
        if unknown:
            extra = {"pool", "chunk_size"} & set(unknown)
            raise BertkitError(f"encode() got arguments bertkit does not implement: {sorted(unknown)}"
                               + ("; multi-process encoding is not implemented: call encode in one process"
                                  if extra else ""))
        if output_value != "sentence_embedding":
            raise BertkitError(f"output_value {output_value!r} is not implemented; bertkit.sentence returns sentence "
                               "embeddings (for token states use bertkit.pipeline('feature-extraction', pooling='none'))")
        if precision not in PRECISIONS:
            raise BertkitError(f"precision {precision!r} is not one of {PRECISIONS}")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise BertkitError(f"batch_size must be a whole number >= 1, got {batch_size!r}")
        single = isinstance(sentences, str)
        texts = [sentences] if single else list(sentences)
        bad = next((i for i, t in enumerate(texts) if not isinstance(t, str)), None)
        if bad is not None:
            raise BertkitError(f"encode() takes strings; input {bad} is {type(texts[bad]).__name__}")
        prompt = self._resolve_prompt(prompt, prompt_name)
        dim = self._check_dim(truncate_dim, "truncate_dim") if truncate_dim is not None else self.truncate_dim
        if device is not None:
            self.to(device)
        if show_progress_bar is None:
            show_progress_bar = logger.getEffectiveLevel() <= logging.INFO and len(texts) > 10 * batch_size
        vectors = self._embed_texts(texts, prompt, batch_size, bool(show_progress_bar))
        if dim is not None:
            vectors = vectors[:, :dim]
        if normalize_embeddings:
            vectors = F.normalize(vectors, p=2, dim=1)
        if precision != "float32" and len(texts):
            vectors = torch.from_numpy(quantize_embeddings(vectors, precision))
        return as_requested(vectors, convert_to_tensor, convert_to_numpy, single)

    def encode_query(self, sentences: str | Sequence[str], prompt_name: str | None = None, prompt: str | None = None,
                     **kwargs: Any) -> Any:
        """``encode`` for queries: without a prompt given, the model's "query" prompt if it has one."""
        if prompt_name is None and prompt is None and "query" in self.prompts:
            prompt_name = "query"
        return self.encode(sentences, prompt_name=prompt_name, prompt=prompt, **kwargs)

    def encode_document(self, sentences: str | Sequence[str], prompt_name: str | None = None,
                        prompt: str | None = None, **kwargs: Any) -> Any:
        """``encode`` for documents: without a prompt given, the model's "document", "passage" or "corpus"
        prompt, the first it has."""
        if prompt_name is None and prompt is None:
            prompt_name = next((n for n in ("document", "passage", "corpus") if n in self.prompts), None)
        return self.encode(sentences, prompt_name=prompt_name, prompt=prompt, **kwargs)

    def _resolve_prompt(self, prompt: str | None, prompt_name: str | None) -> str | None:
        if prompt is not None:
            return prompt
        name = prompt_name if prompt_name is not None else self.default_prompt_name
        if name is None:
            return None
        if name not in self.prompts:
            raise BertkitError(f"prompt_name {name!r} is not one of this model's prompts {sorted(self.prompts)}; "
                               "pass prompt='...' or add it to prompts")
        return self.prompts[name]

    @torch.inference_mode()
    def _embed_texts(self, texts: list[str], prompt: str | None, batch_size: int, progress: bool) -> Tensor:
        """(N, D) float32 on the CPU, in the texts' order; batches of similar length, longest first.

        On the CPU, more than one batch runs on the encoder's copy made for inference there (``for_cpu_inference``:
        oneDNN-reordered weights, q/k/v in one product; the same numbers within float rounding): on 334 SQuAD
        paragraphs it encoded 1.24x faster, and the copy (about 60 ms for MiniLM) is paid back within a batch."""
        was_training = self.training
        self.eval()
        plain = self.bert
        if self.device.type == "cpu" and len(texts) > batch_size:
            from bertkit.inference.prepare import for_cpu_inference

            self.bert = for_cpu_inference(plain, bf16=False)
        order = np.argsort([-len(t) for t in texts], kind="stable")
        batches = [order[start:start + batch_size] for start in range(0, len(texts), batch_size)]
        device = self.device
        out = torch.empty(len(texts), self.pooling.output_dimension, device=device)  # read back once, at the end
        from tqdm.auto import tqdm

        from bertkit.inference.runner import prepared_ahead

        try:
            ahead = prepared_ahead(lambda rows: {**self.tokenize([texts[i] for i in rows], prompt),
                                                 "rows": torch.as_tensor(rows)}, batches, device)
            for batch in tqdm(ahead, total=len(batches), desc="Batches", disable=not progress):
                out[batch["rows"]] = self.embed(
                    batch["input_ids"], batch["attention_mask"], batch["token_type_ids"], batch["prompt_length"]).float()
        finally:
            self.bert = plain
            self.train(was_training)
        return out.cpu()

    # -- save -------------------------------------------------------------------------------------------------------
    def save(self, path: str | Path) -> Path:
        """Write the model in sentence-transformers' layout (the encoder and tokenizer at the top, 1_Pooling,
        2_Normalize when normalising, modules.json and the two configs); sentence-transformers opens it."""
        directory = Path(path)
        directory.mkdir(parents=True, exist_ok=True)
        self.bert.save_pretrained(directory)
        self.tokenizer.save_pretrained(directory)
        (directory / "1_Pooling").mkdir(exist_ok=True)
        atomic_write_json(directory / "1_Pooling" / "config.json", self.pooling.to_config())
        modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
                   {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
        if self.normalize:
            (directory / "2_Normalize").mkdir(exist_ok=True)
            modules.append({"idx": 2, "name": "2", "path": "2_Normalize",
                            "type": "sentence_transformers.models.Normalize"})
        atomic_write_json(directory / MODULES, modules)
        atomic_write_json(directory / SBERT_CONFIG, {"max_seq_length": self.max_seq_length,
                                                     "do_lower_case": self.do_lower_case})
        atomic_write_json(directory / ST_CONFIG, {
            "__version__": {"bertkit": __version__, "pytorch": torch.__version__},
            "model_type": "SentenceTransformer", "prompts": self.prompts,
            "default_prompt_name": self.default_prompt_name, "similarity_fn_name": self.similarity_fn_name})
        return directory

    save_pretrained = save


def _read_json(path: Path) -> Any:
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise BertkitError(f"{path} is not valid JSON ({e}); restore it from the model's source") from None
