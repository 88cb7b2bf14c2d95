"""``SparseEncoder``: SPLADE on bertkit's masked-LM model, read from and written to sentence-transformers 6's
sparse directories, with its API (``encode`` / ``encode_query`` / ``encode_document`` returning sparse COO tensors,
``max_active_dims``, ``decode``, ``similarity``, ``sparsity``, prompts).

    model = SparseEncoder("models/my-splade")           # or any checkpoint with a masked-LM head: a new SPLADE model
    docs = model.encode_document(["The weather is lovely today.", "He drove to the stadium."])
    model.similarity(model.encode_query("sunny weather"), docs)
    model.decode(docs[0], top_k=5)                      # [("weather", 2.1), ("lovely", 1.7), ...]

Layouts read (``modules.json``): a fill-mask ``Transformer`` (or the older ``MLMTransformer``) then
``SpladePooling``; a ``Router`` whose routes are each that pair or a ``SparseStaticEmbedding`` (the inference-free
layout: queries weighted by a static table, documents by SPLADE). A checkpoint directory without modules.json (with
a masked-LM head) becomes Transformer + SpladePooling("max", "relu"), as sentence-transformers builds it for a
...ForMaskedLM architecture (for the others it builds a CSR model: bertkit warns, ``_read_modules``). bertkit
writes sentence-transformers 6's layout. What sentence-transformers 6 has and bertkit does not implement is refused
by name (``REFUSED_INIT`` (bertkit.sentence.calls), ``_REFUSED_ENCODE``, the modules ``route_of`` refuses).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from bertkit._parallel import job_of
from bertkit.config import BertConfig
from bertkit.errors import BertkitError, NonFiniteError, given_path, is_whole
from bertkit.hub import (
    MODULES,
    ST_CONFIG,
    download_hint,
    module_types,
    not_a_directory,
    read_json,
    read_modules,
)
from bertkit.outputs import atomic_write_json
from bertkit.sentence.calls import (
    PROCESSING_KWARGS,
    REFUSED_INIT,
    ReferenceCalls,
    check_local_files_only,
    check_save_arguments,
    model_path,
    move_to_device,
    refuse_arguments,
    texts_of,
)
from bertkit.sentence.directory import token_limit, write_st_config
from bertkit.sentence.finite import nonfinite_rows
from bertkit.sentence.prompts import Prompted
from bertkit.sentence.sparse_encoder.modules import (
    MLMTransformer,
    Router,
    SparseStaticEmbedding,
    SpladePooling,
    Transformer,
    route_of,
)
from bertkit.sentence.sparse_encoder.screen import screened_max_logits
from bertkit.sentence.util import SimilarityByName
from bertkit.staging import staged
from bertkit.weight_files import read_config_json

logger = logging.getLogger("bertkit")

_MODULE_CLASSES: dict[str, Any] = {"Transformer": Transformer, "MLMTransformer": MLMTransformer,
                                   "SpladePooling": SpladePooling, "SparseStaticEmbedding": SparseStaticEmbedding,
                                   "Router": Router, "Asym": Router}  # Asym: the Router's name before 5
# encode arguments of SentenceTransformer that SparseEncoder (sentence-transformers' too) does not take
_REFUSED_ENCODE = {
    "convert_to_numpy": "a sparse encoder returns tensors: convert_to_sparse_tensor=False gives dense ones, and "
                        "embeddings.to_dense().numpy() an array",
    "output_value": "a sparse encoder returns one vector per text (for token states use "
                    "bertkit.pipeline('feature-extraction'))",
    "precision": "sparse embeddings are float32; keep fewer dimensions with max_active_dims",
    "normalize_embeddings": "use similarity_fn_name='cosine', which normalises when it compares",
    "truncate_dim": "a sparse vector's dimensions are word pieces: keep the largest with max_active_dims",
}


def _load_module(type_name: str, directory: Path) -> nn.Module:
    name = type_name.rsplit(".", 1)[-1]
    cls = _MODULE_CLASSES.get(name)
    if cls is None:
        raise BertkitError(f"{directory}: module {type_name!r} is not implemented in bertkit's SparseEncoder (it "
                           f"reads {sorted(_MODULE_CLASSES)}); use sentence-transformers for this model")
    return Router.load(directory, _load_module) if cls is Router else cls.load(directory)


def _save_module(module: nn.Module, directory: Path) -> None:
    if isinstance(module, Router):
        module.save(directory, _save_module)
    else:
        module.save(directory)


def _read_modules(path: Path) -> tuple[list[nn.Module], dict[str, Any]]:
    """``path``'s modules and its config_sentence_transformers.json ({} when absent)."""
    st = read_json(path / ST_CONFIG) or {}
    if st.get("model_type") not in (None, "SparseEncoder"):
        raise BertkitError(f"{path / ST_CONFIG} says model_type {st['model_type']!r}; a SparseEncoder reads "
                           "SparseEncoder directories and checkpoints with a masked-LM head (for a dense model use "
                           "bertkit.sentence.SentenceTransformer)")
    prompts = st.get("prompts") or {}
    if not (isinstance(prompts, dict) and all(isinstance(v, str) or v is None for v in prompts.values())):
        raise BertkitError(f"{path / ST_CONFIG}: prompts must be an object of strings, got {str(prompts)[:80]}")
    listed = read_modules(path)
    if listed is None:
        logger.info("%s has no %s: a new SPLADE model, the masked-LM head with SpladePooling('max', 'relu')",
                    path, MODULES)
        modules = [Transformer(path, transformer_task="fill-mask"), SpladePooling("max", "relu")]
        architectures = read_config_json(path).get("architectures") or []
        if not any(str(a).endswith("ForMaskedLM") for a in architectures):
            logger.warning("%s: config.json's architectures %s name no ...ForMaskedLM: sentence-transformers opens "
                           "this checkpoint as a new CSR model (Pooling + SparseAutoEncoder, drawn at random), bertkit "
                           "as SPLADE on its masked-LM head; save the model (model.save) for a directory both read as "
                           "SPLADE", path, architectures)
        return modules, st
    unknown = [t for t in module_types(listed) if t not in _MODULE_CLASSES]
    if unknown:
        raise BertkitError(f"{path / MODULES} lists {unknown}, which bertkit's SparseEncoder does not implement (it "
                           f"reads {sorted(_MODULE_CLASSES)}); use sentence-transformers for this model")
    return [_load_module(m.get("type", ""), path / m.get("path", "")) for m in listed], st


class SparseEncoder(ReferenceCalls, Prompted, SimilarityByName, nn.Sequential):
    """Modules "0", "1" as sentence-transformers' (``model[0]`` is the Transformer or the Router). ``forward`` takes
    a tokenized batch and adds ``sentence_embedding`` (B, V); ``encode`` takes texts."""

    default_similarity = "dot"
    model_type, default_huggingface_organization = "SparseEncoder", "sparse-encoder"

    def __init__(self, model_name_or_path: str | Path | None = None, *, modules: Sequence[nn.Module] | None = None,
                 device: str | None = None, prompts: dict[str, str] | None = None,
                 default_prompt_name: str | None = None, similarity_fn_name: str | None = None,
                 max_active_dims: int | None = None, local_files_only: bool = False, model_card_data: Any = None,
                 **unknown: Any):
        refuse_arguments("SparseEncoder", unknown, REFUSED_INIT)
        check_local_files_only("SparseEncoder", local_files_only)
        if (model_name_or_path is None) == (modules is None):
            raise BertkitError("SparseEncoder takes a directory (model_name_or_path) or modules=[...], one of them")
        saved: dict[str, Any] = {}
        if modules is None:
            path = model_path(model_name_or_path, "SparseEncoder")
            if not path.is_dir():
                raise not_a_directory(path, "sparse encoder directory", f"pass a directory with {MODULES} (or a "
                                      f"checkpoint directory with a masked-LM head){download_hint(model_name_or_path)}")
            modules, saved = _read_modules(path)
        super().__init__(*modules)
        self.model_card_data = model_card_data  # kept for the script that reads it back; bertkit writes no card
        self.name_or_path = str(model_name_or_path) if model_name_or_path is not None else None
        for route in self._route_lists():
            route_of(route, "the SparseEncoder")
            if isinstance(route[-1], SpladePooling) and route[-1].embedding_dimension is None:
                # the width sentence-transformers' SpladePooling records when it first runs, and saves: a directory
                # without it reports the hidden size as the model's dimension there until its first encode
                route[-1].embedding_dimension = route[0].model.config.vocab_size
        self._set_prompts(prompts, default_prompt_name, saved.get("prompts") or {}, saved.get("default_prompt_name"))
        self.similarity_fn_name = similarity_fn_name or saved.get("similarity_fn_name") or None
        self.max_active_dims = self._check_active_dims(
            max_active_dims if max_active_dims is not None else saved.get("max_active_dims"))
        self.eval()
        if device is not None:
            move_to_device(self, device)

    # -- the routes ----------------------------------------------------------------------------------------------
    def _route_lists(self) -> list[list[nn.Module]]:
        first = self[0]
        if isinstance(first, Router):
            if len(self) != 1:
                raise BertkitError("a Router must be the SparseEncoder's only module (each route ends in its pooling)")
            return [list(mods) for mods in first.sub_modules.values()]
        return [list(self)]

    def _route(self, task: str | None) -> list[nn.Module]:
        """The modules a text of ``task`` goes through."""
        first = self[0]
        return list(first.sub_modules[first.route(task)]) if isinstance(first, Router) else list(self)

    def _input_modules(self) -> list[nn.Module]:
        return [route[0] for route in self._route_lists()]

    # -- what sentence-transformers' model exposes ------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    @property
    def tokenizer(self) -> Any:
        return self[0].tokenizer

    def get_model_kwargs(self) -> list[str]:
        """``["task"]`` with a Router, else none (SPLADE pooling takes no argument), as sentence-transformers lists
        the modules' arguments: its Router's "modality" is left out, as bertkit's models take text only."""
        return ["task"] if isinstance(self[0], Router) else []

    def set_pooling_include_prompt(self, include_prompt: bool) -> None:
        """Nothing to set: sentence-transformers' sets a Pooling module's ``include_prompt``, and a bertkit
        SparseEncoder has SPLADE pooling only (a CSR model's Pooling is refused when loading), as there for SPLADE."""

    @property
    def max_seq_length(self) -> int:
        """Where texts are cut (a Router's: the largest of its routes', as sentence-transformers)."""
        return max(m.max_seq_length for m in self._input_modules())

    @max_seq_length.setter
    def max_seq_length(self, value: int) -> None:
        for module in self._input_modules():
            if isinstance(module, Transformer):
                token_limit("max_seq_length", value, module.model.config.max_position_embeddings)
        for module in self._input_modules():  # every route checked first: none is changed by a refused value
            module.max_seq_length = value

    def get_max_seq_length(self) -> int:
        return self.max_seq_length

    def get_embedding_dimension(self) -> int:
        """The vocabulary size: one dimension per word piece."""
        module = self._route_lists()[0][0]
        return module.weight.shape[0] if isinstance(module, SparseStaticEmbedding) else module.model.config.vocab_size

    get_sentence_embedding_dimension = get_embedding_dimension  # sentence-transformers' name before 6

    @property
    def transformers_model(self) -> nn.Module | None:
        """The first route's masked-LM model (bertkit's ``BertForMaskedLM``)."""
        return next((m.model for route in self._route_lists() for m in route if isinstance(m, Transformer)), None)

    @property
    def config(self) -> BertConfig | None:
        """The masked-LM model's config (None for a layout without one), as sentence-transformers' ``config``."""
        model = self.transformers_model
        return model.config if model is not None else None

    @property
    def splade_pooling_chunk_size(self) -> int | None:
        pooling = next((m for m in self if isinstance(m, SpladePooling)), None)
        return pooling.chunk_size if pooling is not None else None

    @splade_pooling_chunk_size.setter
    def splade_pooling_chunk_size(self, value: int | None) -> None:
        for pooling in (m for route in self._route_lists() for m in route if isinstance(m, SpladePooling)):
            pooling.chunk_size = SpladePooling(chunk_size=value).chunk_size  # checked as the constructor checks

    def _check_active_dims(self, k: Any) -> int | None:
        if k is None:
            return None
        vocab = self.get_embedding_dimension()
        if not is_whole(k, 1, vocab):
            raise BertkitError(f"max_active_dims {k!r} must be a whole number in [1, {vocab}] (this model's "
                               "vocabulary size), or None to keep every active dimension")
        return int(k)  # a numpy integer too; saved in config_sentence_transformers.json as a JSON number

    @property
    def do_lower_case(self) -> bool:
        """Whether texts are lower-cased before tokenizing (the first route's Transformer's setting)."""
        return bool(getattr(self._route_lists()[0][0], "do_lower_case", False))

    @staticmethod
    def prompt_length(prompt: str | None) -> int:
        """0: SpladePooling pools a prompt's tokens with the text's (the training data's prompt bookkeeping)."""
        return 0

    # -- the forward pass ------------------------------------------------------------------------------------------
    def embed(self, input_ids: Tensor, attention_mask: Tensor, token_type_ids: Tensor | None = None,
              prompt_length: int = 0, task: str | None = None) -> Tensor:
        """(B, V) sparse embeddings of a tokenized batch, dense and with their graph (what the losses train)."""
        features = {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids}
        return _embedder(self._route(task), prepared=False)(features)

    def tokenize(self, texts: Sequence[str], prompt: str | None = None, task: str | None = None) -> dict[str, Any]:
        """The batch ``task``'s route tokenizes (its input module's ``tokenize``), with ``task`` recorded."""
        return {**self._route(task)[0].tokenize(texts, prompt), "task": task}

    def preprocess(self, inputs: Sequence[str], prompt: str | None = None, task: str | None = None) -> dict[str, Any]:
        """sentence-transformers 6's name of ``tokenize``, under its argument's name (``preprocess(inputs=...)``)."""
        return self.tokenize(inputs, prompt, task)

    def forward(self, features: dict[str, Any], task: str | None = None) -> dict[str, Any]:
        """sentence-transformers' ``model(features)``: the features with ``sentence_embedding`` (B, V) added, in place
        as there, and returned."""
        route = self._route(task if task is not None else features.get("task"))
        features["sentence_embedding"] = _embedder(route, prepared=False)(features)
        return features

    # -- encode ----------------------------------------------------------------------------------------------------
    def encode(self, inputs: Any = None, prompt_name: str | None = None, prompt: str | None = None,
               batch_size: int = 32, show_progress_bar: bool | None = None, convert_to_tensor: bool = True,
               convert_to_sparse_tensor: bool = True, save_to_cpu: bool = False, device: str | None = None,
               max_active_dims: int | None = None, pool: Any = None, chunk_size: int | None = None,
               task: str | None = None, **unknown: Any) -> Any:
        """Embed texts: a (N, V) sparse COO tensor by default (``convert_to_sparse_tensor=False``: dense), a list
        of row tensors with ``convert_to_tensor=False``, one row for one input; an empty list gives an empty
        tensor (or list). Texts run longest first in batches of ``batch_size`` and come back in their order, on
        the model's device (``save_to_cpu``: on the CPU). ``max_active_dims`` keeps each row's largest weights
        (default: the model's). ``task`` picks a Router's route ("query" / "document"; what encode_query and
        encode_document pass)."""
        if "sentences" in unknown and inputs is None:  # sentence-transformers' name before 6
            inputs = unknown.pop("sentences")
        if unknown.get("processing_kwargs") is not None:
            raise BertkitError(f"encode(processing_kwargs=...) is not implemented in bertkit: {PROCESSING_KWARGS}")
        unknown.pop("processing_kwargs", None)  # None: sentence-transformers' default, nothing asked for
        for name in unknown:
            if name in _REFUSED_ENCODE:
                raise BertkitError(f"SparseEncoder.encode({name}=...) is not an argument of sparse encoders: "
                                   f"{_REFUSED_ENCODE[name]}")
        if unknown:
            raise BertkitError(f"encode() got arguments bertkit does not implement: {sorted(unknown)}")
        if pool is not None or chunk_size is not None or isinstance(device, (list, tuple)):
            raise BertkitError("multi-process encoding (pool, chunk_size, a list of devices) is not implemented in "
                               "bertkit: call encode in one process, on one device")
        if not is_whole(batch_size):
            raise BertkitError(f"batch_size must be a whole number >= 1, got {batch_size!r}")
        first = inputs[0] if isinstance(inputs, list) and inputs else None
        if isinstance(self[0], Router) and isinstance(first, Mapping) and len(first) == 1 and "text" not in first:
            # sentence-transformers' Router reads [{task: text}] as texts of that task, an older form kept there
            key = next(iter(first))
            raise BertkitError(f"encode() input 0 is {{{key!r}: ...}}, sentence-transformers' older form of texts of "
                               f"a task: pass the texts and task={key!r}")
        texts, single = texts_of(inputs)
        prompt = self._resolve_prompt(prompt, prompt_name)
        k = self._check_active_dims(max_active_dims) if max_active_dims is not None else self.max_active_dims
        route = self._route(task)
        if device is not None:
            move_to_device(self, device)
        if not texts:
            result = torch.tensor([], device="cpu" if save_to_cpu else self.device)
            return (result.to_sparse() if convert_to_sparse_tensor else result) if convert_to_tensor else []
        if show_progress_bar is None:
            show_progress_bar = logger.getEffectiveLevel() <= logging.INFO and len(texts) > 10 * batch_size
        rows = self._embed_texts(texts, prompt, task, route, batch_size, bool(show_progress_bar), k,
                                 convert_to_sparse_tensor)
        if save_to_cpu:
            rows = rows.cpu()
        result = rows if convert_to_tensor else list(rows)
        return result[0] if single else result

    def encode_query(self, inputs: Any = None, prompt_name: str | None = None, prompt: str | None = None,
                     *args: Any, **kwargs: Any) -> Any:
        """``encode`` with the "query" prompt (``Prompted.encode_query``) and the "query" route."""
        return super().encode_query(inputs, prompt_name, prompt, *args, **_with_task("query", kwargs))

    def encode_document(self, inputs: Any = None, prompt_name: str | None = None, prompt: str | None = None,
                        *args: Any, **kwargs: Any) -> Any:
        """``encode`` with the "document" prompt (``Prompted.encode_document``) and the "document" route."""
        return super().encode_document(inputs, prompt_name, prompt, *args, **_with_task("document", kwargs))

    @torch.inference_mode()
    def _embed_texts(self, texts: list[str], prompt: str | None, task: str | None, route: list[nn.Module],
                     batch_size: int, progress: bool, k: int | None, sparse: bool) -> Tensor:
        """(N, V) on the model's device in the texts' order, sparse COO (coalesced) or dense; batches of similar
        length, longest first. Each batch is made sparse as it is computed, so a sparse result never holds N dense
        rows. On the CPU, more than one batch runs on copies made for inference there (``_embedder``)."""
        from bertkit.inference.runner import eval_mode, longest_first

        device = self.device
        V = self.get_embedding_dimension()
        # in the model's type, as sentence-transformers returns a half or float64 model's weights (pooled in float32
        # for half models, modules.accumulating); bertkit returned float32 from every model
        dtype = next(p.dtype for p in route[0].parameters() if p.is_floating_point())
        dense = None if sparse else torch.zeros(len(texts), V, dtype=dtype, device=device)
        found: list[tuple[Tensor, Tensor]] = []  # (indices (2, n), values (n,)) per batch

        def keep(rows: Tensor, emb: Tensor, count: Tensor, ready: torch.cuda.Event | None) -> None:
            # How many weights a batch keeps is known on the host only once its kernels ran: a batch's non-zero
            # entries are read after the next batch is queued, waiting for this batch's count alone (nonzero()
            # would wait for every kernel queued, and the GPU would idle while the next batch is tokenized).
            if ready is not None:
                ready.synchronize()
            at = torch.nonzero_static(emb, size=int(count)).T  # (2, n): (row in batch, dimension)
            found.append((torch.stack([rows[at[0]], at[1]]), emb[at[0], at[1]]))

        pending: list[tuple[Tensor, Tensor, Tensor, torch.cuda.Event | None]] = []
        with eval_mode(self):  # calls from other threads at once included
            embed = _embedder(route, prepared=device.type == "cpu" and len(texts) > batch_size)
            for batch in longest_first(texts, batch_size, lambda b: route[0].tokenize(b, prompt), device, progress):
                emb = select_max_active_dims(embed(batch).to(dtype), k)  # (B, V)
                if dense is not None:
                    dense[batch["rows"]] = emb
                    continue
                count, ready = emb.count_nonzero(), None
                if count.is_cuda:
                    count, ready = count.to("cpu", non_blocking=True), torch.cuda.Event()
                    ready.record()
                if pending:
                    keep(*pending.pop())
                pending.append((batch["rows"], emb, count, ready))
            if pending:
                keep(*pending.pop())
        if dense is not None:
            return dense
        indices, values = torch.cat([i for i, _ in found], 1), torch.cat([v for _, v in found])
        return torch.sparse_coo_tensor(indices, values, (len(texts), V), check_invariants=False).coalesce()

    # -- reading sparse vectors ------------------------------------------------------------------------------------
    @staticmethod
    def sparsity(embeddings: Tensor) -> dict[str, float]:
        """{"active_dims": mean active dimensions per row, "sparsity_ratio": 1 - that / V} of one (V,) or a batch
        (N, V) of embeddings: dense (its non-zeros), sparse COO, CSR or CSC (its stored entries, duplicates summed,
        a stored zero counted, as sentence-transformers counts them)."""
        if not isinstance(embeddings, Tensor):
            raise BertkitError(f"sparsity() takes a tensor, got {type(embeddings).__name__}")
        if embeddings.dim() not in (1, 2):
            raise BertkitError(f"sparsity() takes a (V,) or (N, V) tensor, got the shape {tuple(embeddings.shape)}")
        rows = embeddings.unsqueeze(0) if embeddings.dim() == 1 else embeddings
        if rows.shape[0] == 0 or rows.shape[1] == 0:
            return {"active_dims": 0.0, "sparsity_ratio": 1.0}
        if rows.layout in (torch.sparse_csc, torch.sparse_bsr, torch.sparse_bsc):
            if rows.layout != torch.sparse_csc:
                raise BertkitError(f"sparsity() takes a dense, sparse COO, CSR or CSC tensor, got the layout {rows.layout}: "
                                   "convert it with .to_dense() or .to_sparse()")
            rows = rows.to_sparse()
        if rows.layout == torch.sparse_csr:
            counts = rows.crow_indices().diff()
        elif rows.is_sparse:  # counted on the stored entries (not through CSR, which warns that it is in beta)
            counts = torch.bincount(rows.coalesce().indices()[0], minlength=rows.shape[0])
        else:
            counts = (rows != 0).sum(1)
        active = counts.float().mean().item()
        return {"active_dims": active, "sparsity_ratio": 1.0 - active / rows.shape[1]}

    def decode(self, embeddings: Tensor, top_k: int | None = None) -> list[Any]:
        """Each row's (word piece, weight) pairs, the largest weight first (``top_k`` of them): a list for a (V,)
        embedding, a list of lists for (N, V)."""
        if top_k is not None and not is_whole(top_k):
            raise BertkitError(f"top_k must be a whole number >= 1 (or None for every active word piece), got {top_k!r}")
        if not isinstance(embeddings, Tensor) or embeddings.dim() not in (1, 2):
            raise BertkitError("decode() takes a (V,) or (N, V) tensor of sparse embeddings, got "
                               f"{tuple(embeddings.shape) if isinstance(embeddings, Tensor) else type(embeddings).__name__}")
        one = embeddings.dim() == 1
        rows = (embeddings.unsqueeze(0) if one else embeddings)
        rows = (rows if rows.is_sparse else rows.to_sparse()).coalesce()
        which, dims = rows.indices()
        values = rows.values()
        counts = torch.bincount(which, minlength=rows.shape[0]).tolist()
        if not torch.isfinite(values).all():
            # torch.topk and torch.sort take a NaN for the largest weight: it came out the row's first word piece,
            # as in sentence-transformers, and tied infinities in position order
            at = int(torch.nonzero(~torch.isfinite(values))[0])
            piece = self.tokenizer.convert_ids_to_tokens([int(dims[at])])[0]
            raise NonFiniteError(f"decode: embedding {int(which[at])}'s weight of word piece {piece!r} (id "
                                 f"{int(dims[at])}) is {float(values[at])}, which has no rank: the model's outputs "
                                 "are not finite (broken weights?); find such rows with "
                                 "torch.isfinite(embeddings.to_dense()).all(dim=-1), and encode with a model whose "
                                 "outputs are finite")
        results, start = [], 0
        for count in counts:
            vals, toks = values[start:start + count], dims[start:start + count]
            start += count
            if top_k is not None and top_k < count:  # the reference's order: topk, else a descending sort
                vals, pick = torch.topk(vals, top_k)
            else:
                vals, pick = torch.sort(vals, descending=True)
            results.append(list(zip(self.tokenizer.convert_ids_to_tokens(toks[pick].tolist()), vals.tolist())))
        return results[0] if one else results

    @staticmethod
    def intersection(embeddings_1: Tensor, embeddings_2: Tensor) -> Tensor:
        """The dimensions both have, weighted by the product (sparse, ``embeddings_2``'s shape): which word pieces
        a query and a document share, for ``decode``."""
        a = (embeddings_1 if embeddings_1.is_sparse else embeddings_1.to_sparse())
        b = (embeddings_2 if embeddings_2.is_sparse else embeddings_2.to_sparse())
        if a.dim() != 1 or b.dim() not in (1, 2) or a.shape[-1] != b.shape[-1]:
            raise BertkitError(f"intersection() takes a (V,) embedding and a (V,) or (N, V) one of the same V, got "
                               f"{tuple(a.shape)} and {tuple(b.shape)}")
        # a product skips the dimensions one side does not store and the filter below drops a NaN (NaN > 0 is
        # False): an embedding holding a NaN came out a finite intersection, which decode lists as the shared pieces
        for what, x in (("embeddings_1", a), ("embeddings_2", b)):
            bad = nonfinite_rows(x)
            if bad.any():
                row = f" row {int(bad.nonzero()[0])}" if x.dim() == 2 else ""
                raise NonFiniteError(f"intersection: {what}{row} holds a NaN or an infinity, which shares no word "
                                     "piece with anything: the model's outputs are not finite (broken weights?); find "
                                     "such rows with torch.isfinite(embeddings.to_dense()).all(dim=-1), and encode "
                                     "with a model whose outputs are finite")
        both = (a * b if b.dim() == 1 else torch.stack([a * row for row in b])).coalesce()
        keep = both.values() > 0
        return torch.sparse_coo_tensor(both.indices()[:, keep], both.values()[keep], both.size(), check_invariants=False)

    # -- save -------------------------------------------------------------------------------------------------------
    def save(self, path: str | Path, model_name: str | None = None, create_model_card: bool = True,
             train_datasets: list[str] | None = None, safe_serialization: bool = True) -> Path:
        """Write the model in sentence-transformers 6's layout: the Transformer (or the Router) at the top, each
        other module in "{index}_{class}", modules.json and config_sentence_transformers.json; sentence-transformers
        opens it. Staged beside ``path`` and moved into place whole (``bertkit.staging.staged``)."""
        check_save_arguments("SparseEncoder.save", model_name, create_model_card, train_datasets, safe_serialization)
        default_prompt_name = self._saved_default_prompt_name()
        directory = given_path(path, "the directory to save into")
        with staged(directory, shared_by=job_of()) as out:
            listed = []
            for i, module in enumerate(self):
                sub = "" if isinstance(module, (Transformer, Router)) else f"{i}_{type(module).__name__}"
                (out / sub).mkdir(exist_ok=True)
                _save_module(module, out / sub)
                listed.append({"idx": i, "name": str(i), "path": sub, "type": module.st_type})
            write_st_config(out, self.model_type, prompts=self.prompts, default_prompt_name=default_prompt_name,
                            similarity_fn_name=self._similarity_fn_name,
                            **({"max_active_dims": self.max_active_dims} if self.max_active_dims is not None else {}))
            atomic_write_json(out / MODULES, listed)  # last: it names the modules written before it
        return directory

    save_pretrained = save


def _with_task(task: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    """encode_query's / encode_document's arguments to ``encode``, with their task: another task, which would take
    another route under the method's name, is refused (sentence-transformers raises a TypeError)."""
    if "task" in kwargs:
        raise BertkitError(f"encode_{task}() routes by task={task!r}, not task={kwargs['task']!r}: call "
                           f"encode(..., task={kwargs['task']!r})")
    return {**kwargs, "task": task}


def select_max_active_dims(embeddings: Tensor, k: int | None) -> Tensor:
    """Each row's ``k`` largest weights by magnitude, the others 0 (as sentence-transformers'
    ``select_max_active_dims``); ``embeddings`` as it is for None."""
    if k is None:
        return embeddings
    top = torch.topk(embeddings.abs(), k=min(k, embeddings.shape[-1]), dim=-1).indices
    return torch.zeros_like(embeddings).scatter_(-1, top, embeddings.gather(-1, top))


def _embedder(route: list[nn.Module], prepared: bool) -> Callable[[dict[str, Any]], Tensor]:
    """features -> (B, V) along ``route``. ``prepared``: on copies of the encoder and of the head's decoder made
    for CPU inference (``for_cpu_inference``'s oneDNN-reordered projections; the decoder's 30,522-row product ran
    2.5x as fast on oneDNN's reordered weight as with F.linear, 64 rows at a time on one EPYC core), the same
    numbers within float rounding, made once per encode call."""
    if isinstance(route[0], SparseStaticEmbedding):
        return route[0]
    transformer, pooling = route
    bert, head = transformer.model.bert, transformer.head
    prepared = prepared and head.decoder.weight.dtype == torch.float32
    if prepared:
        from bertkit.inference.prepare import encoder_for_encode

        bert = encoder_for_encode(bert)
    return splade_embedder(bert, head, pooling, prepared)


def splade_embedder(bert: nn.Module, head: nn.Module, pooling: SpladePooling,
                    prepared_decoder: bool) -> Callable[[dict[str, Any]], Tensor]:
    """features -> (B, V): ``bert``'s states through the masked-LM ``head`` and ``pooling``; ``prepared_decoder``:
    the vocabulary product made once for CPU inference (fp32 weights): max pooling's maxima screened by an int8
    product where the CPU has AVX512-VNNI or AMX (``screen.screened_max_logits``), else the product on a copy of
    the decoder's weight reordered for oneDNN. A decoder with a hook, a forward of its own or a transform on its
    weight (``modeling.runs_as_f_linear``) is called as it is: a copy would skip them."""
    from bertkit.modeling import runs_as_f_linear

    decoder = None
    if prepared_decoder and head.decoder.weight.dtype == torch.float32 and runs_as_f_linear(head.decoder):
        from bertkit._hardware import onednn_linear
        from bertkit.inference.prepare import PreparedLinear

        if pooling.pooling_strategy == "max" and onednn_linear():
            decoder = screened_max_logits(head.decoder.weight, head.bias)
        if decoder is None:
            decoder = PreparedLinear(head.decoder.weight, head.bias, torch.float32)

    def embed(features: dict[str, Any]) -> Tensor:
        mask = features["attention_mask"]
        return pooling(bert(features["input_ids"], mask, features.get("token_type_ids")), mask, head, decoder)

    return embed
