"""``SentenceTransformer``: a BERT encoder, pooling, any Dense layers and an optional unit-length normalisation, read
from and written to sentence-transformers' directory layout, or assembled from ``bertkit.sentence.models``' modules.

    model = SentenceTransformer("models/all-MiniLM-L6-v2")
    emb = model.encode(["A man is eating food.", "A man rides a horse."], normalize_embeddings=True)
    model.similarity(emb, emb)

What the directory declares (modules, pooling, max_seq_length, prompts, similarity function, truncate_dim) is read
by ``bertkit.sentence.directory``. A plain Hugging Face checkpoint (no modules.json) gets mean pooling and no
normalisation, as sentence-transformers gives it. A module bertkit does not implement (a LayerNorm, a custom module)
is refused by name.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from bertkit._parallel import job_of
from bertkit.config import BertConfig
from bertkit.errors import BertkitError, given_path, is_whole
from bertkit.hub import download_hint, not_a_directory
from bertkit.outputs import atomic_write_json
from bertkit.sentence.calls import (
    ONE_PROCESS,
    PROCESSING_KWARGS,
    REFUSED_INIT,
    ReferenceCalls,
    as_requested,
    check_local_files_only,
    check_save_arguments,
    model_path,
    move_to_device,
    one_text,
    refuse_arguments,
    refuse_data_frame,
    texts_of,
)
from bertkit.sentence.directory import (
    MODULES,
    SBERT_CONFIG,
    ST_CONFIG,
    SentenceDirectory,
    read_directory,
    write_st_config,
)
from bertkit.sentence.finite import unit_length
from bertkit.sentence.models import (
    Dense,
    Indexed,
    Normalize,
    Transformer,
    in_order,
    model_kwargs_options,
    of_first_module,
)
from bertkit.sentence.pooling import Pooling
from bertkit.sentence.prompts import Prompted, prompt_tokens
from bertkit.sentence.quantization import PRECISIONS, quantize_embeddings
from bertkit.sentence.util import SIMILARITY_FUNCTIONS, SimilarityByName
from bertkit.staging import staged

logger = logging.getLogger("bertkit")

class SentenceTransformer(Indexed, ReferenceCalls, Prompted, SimilarityByName, nn.Module):
    """A BERT encoder + pooling (+ Dense layers) (+ Normalize): the modules "0", "1", ... (``Indexed``). ``forward``
    runs them on a tokenized batch's features and returns them with the sentence embeddings (B, D) added; ``encode``
    takes texts."""

    default_similarity = "cosine"
    model_type, default_huggingface_organization = "SentenceTransformer", "sentence-transformers"
    # model[0]'s: model.bert is model[0].auto_model, its parameters named 0.model.… as there
    bert, tokenizer, do_lower_case = (of_first_module(name) for name in ("model", "tokenizer", "do_lower_case"))
    _fixed_modules = ("one Transformer, Pooling, any Dense and an optional Normalize (model[0], model[1], ...); build "
                      "another with SentenceTransformer(modules=[...]) from bertkit.sentence.models")

    def __init__(self, model_name_or_path: str | Path | None = None, device: str | None = None, *,
                 modules: Sequence[Any] | None = None, prompts: dict[str, str] | None = None,
                 default_prompt_name: str | None = None, similarity_fn_name: str | None = None,
                 truncate_dim: int | None = None, local_files_only: bool = False,
                 model_kwargs: dict[str, Any] | None = None, model_card_data: Any = None, **unknown: Any):
        super().__init__()
        refuse_arguments("SentenceTransformer", unknown, REFUSED_INIT)
        self.model_card_data = model_card_data  # kept for the script that reads it back; bertkit writes no card
        options = model_kwargs_options("SentenceTransformer", model_kwargs)
        check_local_files_only("SentenceTransformer", local_files_only)
        if modules is not None:
            if model_name_or_path is not None or options:
                raise BertkitError("SentenceTransformer takes a directory (model_name_or_path, model_kwargs) or "
                                   "modules=[...], one of them; give model_kwargs to models.Transformer")
            modules = in_order(modules)
            saved = SentenceDirectory(Path(), Path())  # prompts, similarity, truncate_dim: the defaults
            # the Transformer's directory, as a message names the model (GISTEmbedLoss's guide)
            self.name_or_path, where = modules[0].model.name_or_path, "SentenceTransformer(modules=...)"
        else:
            # a directory is read into the modules a script assembles: the one model either way
            path = model_path(model_name_or_path, "SentenceTransformer")
            if not path.is_dir():
                raise not_a_directory(path, "sentence-transformers directory", f"pass a directory with {MODULES} (or "
                                      f"a BERT checkpoint directory with config.json){download_hint(model_name_or_path)}")
            self.name_or_path = where = str(path)
            saved = read_directory(path)
            word = Transformer(saved.encoder_dir, do_lower_case=saved.do_lower_case, model_kwargs=options)
            try:  # the directory's, else the tokenizer's limit capped at the positions; checked by the setter
                if saved.max_seq_length is not None:
                    word.max_seq_length = saved.max_seq_length
            except BertkitError as e:
                raise BertkitError(f"{path}: {e}; lower it in {SBERT_CONFIG}") from None
            pooling = saved.pooling
            if pooling is None:
                logger.warning("%s has no %s: mean pooling, no normalisation (as sentence-transformers builds it)",
                               path, MODULES)
                pooling = Pooling(word.get_embedding_dimension())
            # in the encoder's type, as sentence-transformers loads every module in model_kwargs' dtype (a bf16
            # encoder's vectors through a float32 Dense were 1e-3 from its)
            modules = [word, pooling, *(Dense.load(d).to(word.model.dtype) for d in saved.dense),
                       *([Normalize()] if saved.normalize else [])]
        pooling, hidden = modules[1], modules[0].get_embedding_dimension()
        if pooling.embedding_dimension != hidden:
            raise BertkitError(f"{where}: its Pooling says {pooling.embedding_dimension} dimensions but the encoder's "
                               f"hidden_size is {hidden}; give Pooling the encoder's "
                               "(word.get_word_embedding_dimension())")
        width = pooling.output_dimension
        for i, layer in enumerate(m for m in modules if isinstance(m, Dense)):
            if layer.in_features != width:
                raise BertkitError(f"{where}: Dense {i} takes {layer.in_features} dimensions but "
                                   f"{'its Pooling' if i == 0 else f'Dense {i - 1}'} gives {width}; make its "
                                   f"in_features {width}")
            width = layer.out_features
        for i, module in enumerate(modules):  # nn.Module's add_module: this class's is sentence-transformers' append
            nn.Module.add_module(self, str(i), module)
        self._set_prompts(prompts, default_prompt_name, saved.prompts, saved.default_prompt_name)
        if similarity_fn_name is None and saved.similarity_fn_name not in (None, *SIMILARITY_FUNCTIONS):
            # sentence-transformers 6 ignores a name it does not support here and scores with cosine, without a word
            raise BertkitError(f"{saved.path / ST_CONFIG}: similarity_fn_name {saved.similarity_fn_name!r} is not one of "
                               f"{sorted(SIMILARITY_FUNCTIONS)}; sentence-transformers 6 ignores it and scores with "
                               "cosine: write \"cosine\" there for its scores, or pass similarity_fn_name=")
        self.similarity_fn_name = similarity_fn_name or saved.similarity_fn_name
        self.truncate_dim = truncate_dim if truncate_dim is not None else saved.truncate_dim_within(self._width)
        self.eval()  # as loaded models are: encode, which puts back the mode it found, must not turn dropout on
        if device is not None:
            move_to_device(self, device)

    def _check_dim(self, dim: int | None, name: str) -> int | None:
        if dim is None:
            return None
        full = self._width
        if not is_whole(dim, 1, full):
            raise BertkitError(f"{name} {dim!r} must be a whole number in [1, {full}] (this model's dimension)")
        return int(dim)  # a numpy integer would not be written to config_sentence_transformers.json

    @property
    def pooling(self) -> Pooling:
        return self[1]

    @property
    def dense(self) -> list[Dense]:
        """The Dense layers, in order: modules "2", "3", ..."""
        return [m for m in self if isinstance(m, Dense)]

    @property
    def normalize(self) -> bool:
        """Whether the last module is Normalize; set False, it is removed, set True, one is appended."""
        return isinstance(self[-1], Normalize)

    @normalize.setter
    def normalize(self, value: bool) -> None:
        if value and not self.normalize:
            nn.Module.add_module(self, str(len(self)), Normalize())
        elif not value and self.normalize:
            del self._modules[str(len(self) - 1)]

    @property
    def _width(self) -> int:
        """The sentence embedding's dimensions: the last Dense's out_features, else the pooling's."""
        return self.dense[-1].out_features if len(self.dense) else self.pooling.output_dimension

    # -- what sentence-transformers' model exposes ------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return self.bert.embeddings.word_embeddings.weight.device

    def add_module(self, name: str, module: nn.Module | None) -> None:
        """sentence-transformers' ``model.add_module(name, module)`` appends a module to its pipeline (its
        model_distillation example appends a PCA Dense to the teacher): a Dense is appended after the model's Dense
        layers, on a model without Normalize. Anything else is refused: registered under a new name, a module was kept
        but never run (a teacher given a 384->128 Dense kept embedding 384 dimensions), and a Dense after Normalize
        would run on normalised vectors, which bertkit's order (Dense layers, then Normalize) cannot hold."""
        if isinstance(module, Dense) and not self.normalize:
            if module.in_features != self._width:
                raise BertkitError(f"add_module({name!r}, Dense): it takes {module.in_features} dimensions but the "
                                   f"model embeds {self._width}; make its in_features {self._width}")
            dtype = self.bert.embeddings.word_embeddings.weight.dtype
            nn.Module.add_module(self, str(len(self)), module.to(self.device, dtype))
            return
        where = ("a model that normalises its embeddings (the Dense would run after Normalize there)"
                 if isinstance(module, Dense) else f"a {type(module).__name__}")
        raise BertkitError(f"add_module({name!r}, ...) on {where} is not implemented in bertkit.sentence: build the "
                           "model with the module in place, SentenceTransformer(modules=[model[0], model[1], dense, "
                           "...]) from bertkit.sentence.models (a Dense before an optional models.Normalize())")

    def set_pooling_include_prompt(self, include_prompt: bool) -> None:
        """Whether a prompt's tokens are pooled (``model[1].include_prompt``), as sentence-transformers' method."""
        self.pooling.include_prompt = include_prompt

    @property
    def transformers_model(self) -> nn.Module:
        """The encoder (``model.bert``), as sentence-transformers' ``transformers_model`` gives model[0].auto_model."""
        return self.bert

    @property
    def config(self) -> BertConfig:
        """The encoder's config, which sentence-transformers gives too: integrations (deepspeed, transformers'
        Trainer) and scripts read ``model.config.hidden_size``."""
        return self.bert.config

    def get_embedding_dimension(self) -> int:
        """The width of the embeddings ``encode`` returns (``truncate_dim`` when set)."""
        return self.truncate_dim or self._width  # truncate_dim is checked to be at most that

    get_sentence_embedding_dimension = get_embedding_dimension  # sentence-transformers' name before 6

    @contextmanager
    def truncate_embeddings(self, truncate_dim: int | None) -> Iterator[None]:
        """``with model.truncate_embeddings(64):`` encode gives 64 dimensions inside the block."""
        before = self.truncate_dim
        self.truncate_dim = truncate_dim
        try:
            yield
        finally:
            self.truncate_dim = before

    truncate_sentence_embeddings = truncate_embeddings  # sentence-transformers' name before 6

    @property
    def truncate_dim(self) -> int | None:
        """The dimensions ``encode`` keeps (None: all of them); checked where it is set, as at load and per call:
        sentence-transformers slices with any value (-1 keeps 383 of 384 dimensions)."""
        return self._truncate_dim

    @truncate_dim.setter
    def truncate_dim(self, value: int | None) -> None:
        self._truncate_dim = self._check_dim(value, "truncate_dim")

    def get_max_seq_length(self) -> int:
        return self.max_seq_length

    @staticmethod
    def load(input_path: str | Path) -> SentenceTransformer:
        """``SentenceTransformer(input_path)``: sentence-transformers' old way to load (deprecated there)."""
        return SentenceTransformer(input_path)

    max_seq_length = of_first_module("max_seq_length")

    # -- tokenizing and the forward pass ------------------------------------------------------------------------
    def tokenize(self, texts: Sequence[str], prompt: str | None = None) -> dict[str, Tensor]:
        """``input_ids``, ``token_type_ids``, ``attention_mask`` (B, T), truncated to max_seq_length, and
        ``prompt_length`` (the prompt's tokens after [CLS], 0 without one)."""
        if isinstance(texts, (str, Mapping)) or not isinstance(texts, Iterable):
            # sentence-transformers tokenizes a str's characters as texts (a dict's keys), a batch of one-letter rows
            raise BertkitError(f"tokenize() takes a list of texts, got {type(texts).__name__} {str(texts)[:60]!r}; "
                               "pass [text] for one")
        refuse_data_frame(texts, "tokenize()", "tokenize(df[{}])")
        batch = self[0].tokenize([one_text(t, f"input {i}", "tokenize") for i, t in enumerate(texts)], prompt)
        batch["prompt_length"] = self.prompt_length(prompt)
        return batch

    def preprocess(self, inputs: Sequence[str], prompt: str | None = None) -> dict[str, Tensor]:
        """sentence-transformers 6's name of ``tokenize``, under its argument's name (``preprocess(inputs=...)``)."""
        return self.tokenize(inputs, prompt)

    def prompt_length(self, prompt: str | None) -> int:
        """How many leading tokens (with [CLS]) the prompt takes: what Pooling leaves out when include_prompt is False."""
        if not prompt:
            return 0
        lowered = self.tokenizer.lowercase(prompt) if self.do_lower_case else prompt
        return prompt_tokens(self.tokenizer, lowered, self.max_seq_length)

    def embed(self, input_ids: Tensor, attention_mask: Tensor, token_type_ids: Tensor | None = None,
              prompt_length: int = 0, *, bert: nn.Module | None = None) -> Tensor:
        """(B, D) sentence embeddings of a tokenized batch: ``model(features)["sentence_embedding"]``, module "0"'s
        step run on ``bert`` in place of ``self.bert`` where given (``encode``'s copy made for CPU inference)."""
        features = {"input_ids": input_ids, "attention_mask": attention_mask, "prompt_length": prompt_length,
                    **({"token_type_ids": token_type_ids} if token_type_ids is not None else {})}
        features = self[0](features, bert)
        for module in list(self)[1:]:  # the Pooling, the Dense layers, Normalize: ``forward``'s chain
            features = module(features)
        return features["sentence_embedding"]

    # -- encode ----------------------------------------------------------------------------------------------------
    def encode(self, inputs: Any = None, prompt_name: str | None = None, prompt: str | None = None,
               batch_size: int = 32, show_progress_bar: bool | None = None,
               output_value: str | None = "sentence_embedding", precision: str | None = "float32",
               convert_to_numpy: bool = True, convert_to_tensor: bool = False, device: str | None = None,
               normalize_embeddings: bool = False, truncate_dim: int | None = None, **unknown: Any) -> Any:
        """Embed texts: a (N, D) numpy array by default, a tensor with ``convert_to_tensor``, a list of tensors
        with both conversions off; one input gives one vector, an empty list an empty result (as
        sentence-transformers 6: ``np.array([])``, ``torch.tensor([])``, ``[]``). An input is a string or
        sentence-transformers 6's text dict ``{"text": ...}`` (``texts_of``); a list, tuple or array of them is a
        batch. Texts run longest first in batches of ``batch_size`` and come back in their order. ``prompt`` (or
        ``prompt_name``, a key of ``prompts``) is put before each text; ``truncate_dim`` keeps the first dimensions,
        before ``normalize_embeddings`` scales each to unit length; ``precision`` quantizes the result as
        ``quantize_embeddings`` does (int8/uint8 buckets from these embeddings)."""
        if "sentences" in unknown and inputs is None:  # sentence-transformers' name before 6
            inputs = unknown.pop("sentences")
        multi = f"multi-process encoding is not implemented: {ONE_PROCESS}"
        refuse_arguments("encode", unknown, {"pool": multi, "chunk_size": multi, "processing_kwargs": PROCESSING_KWARGS,
                                             "task": (
            "a SentenceTransformer has no Router to route a task through (sentence-transformers ignores it then); "
            "drop this argument")})
        if isinstance(device, (list, tuple)):  # sentence-transformers' multi-process encoding, a process per device
            raise BertkitError(f"encode(device={device!r}): {multi}")
        if output_value != "sentence_embedding":
            raise BertkitError(f"output_value {output_value!r} is not implemented; bertkit.sentence returns sentence "
                               "embeddings (for token states use bertkit.pipeline('feature-extraction', pooling='none'))")
        precision = "float32" if precision is None else precision  # None quantizes nothing in sentence-transformers
        if precision not in PRECISIONS:
            raise BertkitError(f"precision {precision!r} is not one of {PRECISIONS}")
        if not is_whole(batch_size):
            raise BertkitError(f"batch_size must be a whole number >= 1, got {batch_size!r}")
        texts, single = texts_of(inputs)
        prompt = self._resolve_prompt(prompt, prompt_name)
        dim = self._check_dim(truncate_dim, "truncate_dim") if truncate_dim is not None else self.truncate_dim
        if device is not None:
            move_to_device(self, device)
        if not texts:
            return torch.tensor([], device=self.device) if convert_to_tensor else np.array([]) if convert_to_numpy else []
        if show_progress_bar is None:
            show_progress_bar = logger.getEffectiveLevel() <= logging.INFO and len(texts) > 10 * batch_size
        vectors = self._embed_texts(texts, prompt, batch_size, bool(show_progress_bar))
        if dim is not None:
            vectors = vectors[:, :dim]
        if normalize_embeddings:
            vectors = unit_length(vectors, dim=1)
        # in the model's type, as sentence-transformers returns a half model's vectors and quantizes them (bertkit gave
        # float32, and quantized those)
        vectors = vectors.to(self.bert.embeddings.word_embeddings.weight.dtype)
        if precision != "float32":
            vectors = torch.from_numpy(quantize_embeddings(vectors, precision))
        # quantized rows come from numpy, on the CPU, as sentence-transformers returns them
        device = self.device if precision == "float32" else torch.device("cpu")
        return as_requested(vectors, convert_to_tensor, convert_to_numpy, single, device)

    @torch.inference_mode()
    def _embed_texts(self, texts: list[str], prompt: str | None, batch_size: int, progress: bool) -> Tensor:
        """(N, D) on the CPU, float32 (float64 from a float64 model), in the texts' order; batches of similar length,
        longest first.

        On the CPU, more than one batch runs on the encoder's copy made for inference there (``for_cpu_inference``:
        oneDNN-reordered weights, q/k/v in one product; the same numbers within float rounding): on 334 SQuAD
        paragraphs it encoded 1.24x faster, and the copy (about 60 ms for MiniLM) is paid back within a batch. The
        copy is this call's own, never put in ``self.bert``: encode called from two threads at once left it there for
        good (each put back the encoder it found), so that ``save`` failed and training trained other weights."""
        from bertkit.inference.runner import eval_mode, longest_first

        bert = self.bert
        dtype = torch.promote_types(self.bert.embeddings.word_embeddings.weight.dtype, torch.float32)
        out = torch.empty(len(texts), self._width, dtype=dtype, device=self.device)  # read back once
        with eval_mode(self):  # calls from other threads at once included
            if self.device.type == "cpu" and len(texts) > batch_size:
                from bertkit.inference.prepare import encoder_for_encode

                bert = encoder_for_encode(bert)
            for batch in longest_first(texts, batch_size, lambda b: self.tokenize(b, prompt), self.device, progress):
                # no token_type_ids where the tokenizer's model_input_names leaves them out: segment 0, as the reference
                out[batch["rows"]] = self.embed(batch["input_ids"], batch["attention_mask"], batch.get("token_type_ids"),
                                                batch["prompt_length"], bert=bert).to(dtype)
        return out.cpu()

    def fit(self, train_objectives: Iterable[tuple[Any, nn.Module]], **kwargs: Any) -> None:
        """sentence-transformers' legacy ``fit`` (DataLoaders of InputExample, a loss each), on the trainer as
        sentence-transformers runs it: ``bertkit.sentence.fit``, found when called (the trainer it runs imports this
        module: the model stays below the training code, as pipelines stay below their tasks)."""
        importlib.import_module("bertkit.sentence.fit").fit(self, train_objectives, **kwargs)

    # -- save -------------------------------------------------------------------------------------------------------
    def save(self, path: str | Path, model_name: str | None = None, create_model_card: bool = True,
             train_datasets: list[str] | None = None, safe_serialization: bool = True) -> Path:
        """Write the model in sentence-transformers' layout (the encoder and tokenizer at the top, 1_Pooling, a
        2_Dense, 3_Dense, ... per Dense layer, N_Normalize when normalising, modules.json and the two configs,
        truncate_dim where sentence-transformers 6 writes it); sentence-transformers opens it. The directory is written beside ``path`` and moved into place
        whole (``bertkit.staging.staged``): a kill or a full disk leaves what was there before, never a directory that
        loads with other settings."""
        check_save_arguments("SentenceTransformer.save", model_name, create_model_card, train_datasets, safe_serialization)
        default_prompt_name = self._saved_default_prompt_name()
        directory = given_path(path, "the directory to save into")
        with staged(directory, shared_by=job_of()) as out:
            self[0].save(out)
            atomic_write_json(out / "1_Pooling" / "config.json", self.pooling.to_config())
            modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
                       {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
            for i, layer in enumerate(self.dense, start=2):
                layer.save(out / f"{i}_Dense")
                modules.append({"idx": i, "name": str(i), "path": f"{i}_Dense",
                                "type": "sentence_transformers.models.Dense"})
            if self.normalize:
                i = len(modules)
                (out / f"{i}_Normalize").mkdir(exist_ok=True)
                modules.append({"idx": i, "name": str(i), "path": f"{i}_Normalize",
                                "type": "sentence_transformers.models.Normalize"})
            write_st_config(out, self.model_type, prompts=self.prompts,
                            default_prompt_name=default_prompt_name, similarity_fn_name=self.similarity_fn_name,
                            **({"truncate_dim": self.truncate_dim} if self.truncate_dim is not None else {}))
            atomic_write_json(out / MODULES, modules)  # last: it names the modules written before it
        return directory

    save_pretrained = save

