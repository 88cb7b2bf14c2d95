"""``bertkit.pipeline("sparse-embedding", DIR)``: a sparse encoder's vectors through the pipelines' one loop (batched
by length, in input order), so that ``bertkit predict sparse-embedding`` and ``bertkit serve``'s ``/embed_sparse``
run it as they run every task.

    embed = bertkit.pipeline("sparse-embedding", "models/my-splade")
    embed("The weather is lovely today.")           # [{"index": 1996, "value": 0.41}, ...], index order
    embed("sunny weather", prompt_name="query")     # encode_query's vector
    embed("sunny weather", return_tokens=True)      # [{"token": "weather", "value": 2.1}, ...], largest first

``DIR`` is whatever ``SparseEncoder`` opens (a sentence-transformers sparse directory in any layout it reads, or a
checkpoint with a masked-LM head, which becomes a new SPLADE model). ``prompt_name`` "document" gives
``SparseEncoder.encode_document``'s vector (its document prompt, a Router's "document" route), "query"
``encode_query``'s (its query prompt and route: an inference-free model's static weights), none ``encode``'s (the
default prompt, or none, as TEI's /embed_sparse puts none unless asked; a Router's default route), the same numbers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from bertkit.errors import BertkitError
from bertkit.hub import encoder_path, read_json, read_modules
from bertkit.inference import tasks
from bertkit.inference.base import Pipeline
from bertkit.inference.options import BOOL, Option
from bertkit.inference.prepare import ModelState, check_request, prepare_model
from bertkit.quantization import is_int8_checkpoint
from bertkit.sentence.sparse_encoder.model import SparseEncoder, select_max_active_dims, splade_embedder
from bertkit.sentence.sparse_encoder.modules import Router, SparseStaticEmbedding, Transformer
from bertkit.tokenization import BertTokenizer
from bertkit.tokenization.batch import left_truncated
from bertkit.tokenization.encoding import segment_ids

SIDES = ("document", "query")  # what prompt_name selects: encode_document's vectors, encode_query's (none: encode's)

# Why a sparse encoder runs in float only, and what to run instead.
_NO_INT8 = "(its vectors are the masked-LM head's float logits)"


@dataclass
class _Side:
    """How the texts of one side become vectors: the prompt put before each, where they are cut, and the embedder
    (a padded batch -> (B, V)) of the side's route."""

    name: str | None  # the prompt_name that selects it
    prompt: str
    limit: int  # tokens a text keeps: where the route cuts (a Transformer at its max_seq_length, the static query
    # weights at their tokenizer's model_max_length, as encode does), or the caller's max_length where lower
    static: bool  # SparseStaticEmbedding: no special tokens, no transformer
    lower: bool
    embed: Callable[[dict[str, Tensor]], Tensor]


class SparseEmbeddingPipeline(Pipeline):
    """A text -> its sparse vector, ``[{"index", "value"}, ...]`` in index order (TEI's /embed_sparse), or with
    ``return_tokens=True`` ``[{"token", "value"}, ...]`` largest first (``SparseEncoder.decode``). ``prompt_name``
    "query" gives ``encode_query``'s vector, "document" ``encode_document``'s, None ``encode``'s. The model's
    ``max_active_dims`` applies (``max_active_dims=`` overrides it)."""

    task = tasks.SparseEmbedding.name
    model_class = SparseEncoder
    # the pipeline reads prompt_name where it is used (``side``)
    call_options = (Option("prompt_name", served=(lambda v: v in SIDES, '"query" (encode_query\'s vectors) or '
                                                  '"document" (encode_document\'s; none: encode\'s)')),
                    Option("return_tokens", BOOL))

    def __init__(self, model: SparseEncoder, tokenizer: BertTokenizer, *, max_active_dims: int | None = None,
                 **kwargs: Any):
        if kwargs.get("quantize"):
            raise BertkitError(f"quantize={kwargs['quantize']!r} is not implemented for sparse-embedding {_NO_INT8}: "
                               "run it in float32 or with bf16")
        routes = {}
        for side in (*SIDES, None):  # None: no prompt_name, encode's route (a Router's default)
            try:
                routes[side] = model._route(side)
            except BertkitError as e:  # a Router without that route: the side is refused when asked for
                routes[side] = e
        encoders = [r[0] for r in routes.values() if isinstance(r, list) and isinstance(r[0], Transformer)]
        if not encoders:
            raise BertkitError(f"{model.name_or_path or 'this SparseEncoder'} runs no transformer on its routes "
                               "(SparseStaticEmbedding only): there is no model to serve; encode with it directly")
        document = encoders[0]
        self._made_with = (max_active_dims, dict(kwargs))  # what ``remake`` makes it from again
        cap = kwargs.get("max_length")  # the caller's cut, for every side; unset: each route cuts where it does
        if cap is None:
            kwargs["max_length"] = document.max_seq_length
        super().__init__(document.model.bert, tokenizer, **kwargs)  # self.model: the encoder prepared for inference
        self.encoder = model
        if self._made_from is not None:  # the whole model is watched: its head's decoder is prepared here too
            self._made_from = ModelState(model)
        self.max_active_dims = model._check_active_dims(max_active_dims) if max_active_dims is not None \
            else model.max_active_dims
        self.sides: dict[str | None, _Side | BertkitError] = {}
        embedders: dict[tuple[int, ...], Callable[[dict[str, Tensor]], Tensor]] = {}  # one per route's modules
        for side, route in routes.items():
            if isinstance(route, BertkitError):
                self.sides[side] = route
                continue
            # encode_query's and encode_document's prompts; without prompt_name the default prompt, or none (TEI's
            # /embed_sparse puts no prompt unless asked, sentence-transformers' encode the default one)
            prompt = (model.prompts.get(side) if side is not None else model._resolve_prompt(None, None)) or ""
            made = embedders.get(key := tuple(map(id, route)))
            if isinstance(route[0], SparseStaticEmbedding):
                static = route[0].to(self.device).eval()
                limit = min(static.tokenizer.model_max_length, cap or static.tokenizer.model_max_length)
                self.sides[side] = _Side(side, prompt, limit, True, False, made or (lambda b, m=static: m(b)))
            else:
                transformer, pooling = route
                if made is None:
                    bert = self.model if transformer is document else prepare_model(
                        transformer.model.bert, device=self.device, bf16=self.bf16)[0]
                    made = self._splade(bert, transformer.head, pooling)
                limit = self.max_length if transformer is document else min(transformer.max_seq_length,
                                                                            cap or transformer.max_seq_length)
                self.sides[side] = _Side(side, prompt, limit, False, transformer.do_lower_case, made)
            embedders[key] = self.sides[side].embed

    def remake(self, model: nn.Module) -> None:
        # every route's encoder and decoder copies, and what was read from the model, made again
        max_active_dims, kwargs = self._made_with
        self.__init__(model, self.tokenizer, max_active_dims=max_active_dims, **kwargs)  # type: ignore[misc]

    def _splade(self, bert: nn.Module, head: nn.Module, pooling: nn.Module) -> Callable[[dict[str, Tensor]], Tensor]:
        # the vocabulary product on oneDNN's reordered weight on a CPU, made once (as SparseEncoder.encode makes it)
        return splade_embedder(bert, head.to(self.device).eval(), pooling, self.device.type == "cpu")

    @classmethod
    def from_pretrained(cls, model_dir: str | Path, **kwargs: Any) -> Pipeline:
        """Open ``model_dir`` as ``SparseEncoder`` does (a directory without a masked-LM head, or a dense model's, is
        refused there, by name); a request the device cannot run is refused first."""
        check_request(kwargs.get("device", "cpu"), bf16=kwargs.get("bf16"), quantize=kwargs.get("quantize"),
                      calibrating=kwargs.get("calibration_texts") is not None)
        if is_int8_checkpoint(model_dir):  # SparseEncoder would say it has no float weights, and name this pipeline
            raise BertkitError(f"{model_dir} is an int8 model written by `bertkit quantize`, and int8 is not "
                               f"implemented for sparse-embedding {_NO_INT8}: run the float checkpoint it was "
                               "quantized from, in float32 or with bf16")
        model = SparseEncoder(model_dir)
        return cls(model, model.tokenizer, **kwargs)

    @classmethod
    def tokenizer_of(cls, model_dir: str | Path) -> BertTokenizer:
        """The tokenizer of ``model_dir``'s first module (a Router's first route's), read without the weights."""
        directory = Path(model_dir)
        listed = read_modules(directory)
        if listed:
            directory = directory / encoder_path(listed)
            router = read_json(directory / Router.CONFIG)
            if isinstance(router, dict) and router.get("types"):
                directory = directory / next(iter(router["types"]))
        return super().tokenizer_of(directory)

    def side(self, prompt_name: str | None) -> _Side:
        """The side ``prompt_name`` selects (None: ``encode``'s)."""
        if prompt_name is not None and prompt_name not in SIDES:
            raise BertkitError(f"prompt_name {prompt_name!r} is not one of {SIDES}: \"query\" embeds a text as "
                               "encode_query does, \"document\" as encode_document does, none as encode does")
        side = self.sides[prompt_name]
        if isinstance(side, BertkitError):
            raise side
        return side

    def text_form(self, prompt_name: str | None) -> tuple[str, bool, bool]:
        side = self.side(prompt_name)  # an inference-free model's static query weights read no [CLS] or [SEP]
        return side.prompt, side.lower, not side.static

    def length(self, text: str, prompt_name: str | None = None) -> tuple[int, int]:
        """(tokens of ``text`` as its side reads it, before any cut; where the side cuts)."""
        side = self.side(prompt_name)
        text = side.prompt + text
        if side.lower:
            text = self.tokenizer.lowercase(text)
        return len(self.tokenizer(text, add_special_tokens=not side.static)["input_ids"]), side.limit

    def encode(self, item: str, prompt_name: str | None = None, truncation_direction: str = "right",
               **_: Any) -> list[dict[str, Any]]:
        side = self.side(prompt_name)
        text = side.prompt + item  # as the route's input module tokenizes (Transformer / SparseStaticEmbedding)
        if side.lower:
            text = self.tokenizer.lowercase(text)
        if truncation_direction.lower() == "left":  # TEI's "Left": the text's end kept
            return [{**left_truncated(self.tokenizer, text, None, side.limit, not side.static), "side": side.name}]
        enc = self.tokenizer(text, add_special_tokens=not side.static, truncation=True, max_length=side.limit)
        return [{"input_ids": enc["input_ids"], "token_type_ids": segment_ids(enc), "side": side.name}]

    def forward(self, batch: dict[str, Tensor], rows: Any) -> list[np.ndarray]:
        """One (2, n) float64 array per row: its active dimensions (ascending) over their values. A batch may mix
        queries and documents (the server's batches do): each side's rows run through their own route."""
        names = [r["side"] for r in rows]
        out: list[np.ndarray] = [np.empty((2, 0))] * len(rows)
        for name in dict.fromkeys(names):
            at = [i for i, n in enumerate(names) if n == name]
            part = batch if len(at) == len(rows) else {k: v[at] for k, v in batch.items()}
            emb = select_max_active_dims(self.sides[name].embed(part).float(), self.max_active_dims)  # (b, V)
            nz = emb.nonzero()  # (n, 2): (row, dimension), row-major
            pairs = torch.stack([nz[:, 1].double(), emb[nz[:, 0], nz[:, 1]].double()]).cpu().numpy()  # (2, n)
            counts = torch.bincount(nz[:, 0], minlength=len(at)).cumsum(0)[:-1].cpu().numpy()
            for i, p in zip(at, np.split(pairs, counts, axis=1)):
                out[i] = p
        return out

    def decode(self, item: Any, rows: Any, outputs: list[np.ndarray], return_tokens: bool = False,
               **_: Any) -> list[dict[str, Any]]:
        index, value = outputs[0]
        if return_tokens:
            order = np.argsort(-value, kind="stable")
            index, value = index[order], value[order]
        pieces = index.astype(np.int64).tolist()  # Python ints and floats at C speed: hundreds per text
        if return_tokens:
            pieces = self.tokenizer.convert_ids_to_tokens(pieces)
        key = "token" if return_tokens else "index"
        return [{key: k, "value": v} for k, v in zip(pieces, value.tolist())]
