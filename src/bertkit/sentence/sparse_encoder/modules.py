"""The modules of sentence-transformers 6's sparse encoders, under its class names, configuration files and
parameter names (``model.bert.…``, ``model.cls.predictions.…``, ``sub_modules.query.0.weight``), so a state dict
or a ``learning_rate_mapping`` written for sentence-transformers addresses the same tensors here.

- ``Transformer`` (``transformer_task="fill-mask"``; ``MLMTransformer``, sentence-transformers 5's name, reads the
  same files): ``bertkit.sentence.models``' Transformer holding bertkit's ``BertForMaskedLM`` as ``model``.
- ``SpladePooling``: the masked-LM head's vocabulary logits -> one weight per word piece, log(1 + relu(logit))
  (log1p twice for "log1p_relu"), the maximum or the sum over a text's tokens (SPLADE v2, arXiv:2109.10086,
  eq. 1-2). The head is applied here, to the real tokens only, a block of rows at a time (``chunk_size``): the
  logits, 30,522 floats a token for BERT's vocabulary, are never held for a whole batch.
- ``SparseStaticEmbedding``: the inference-free query side: a weight per word piece (an IDF), given to each piece
  the text holds; no transformer runs (arXiv:2504.14839's opensearch models).
- ``Router``: a list of modules per route ("query", "document"), picked by the task as sentence-transformers picks.

Each module reads and writes its own directory, as sentence-transformers' ``load`` / ``save`` do.
"""

from __future__ import annotations

import ast
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from bertkit.config import refuse_other_network
from bertkit.errors import BertkitError, MissingFileError, is_whole, refusing_getattr
from bertkit.heads import BertForMaskedLM
from bertkit.hub import SBERT_CONFIG, cache_hint, read_json
from bertkit.modeling import BertModelOutput
from bertkit.outputs import atomic_target, atomic_write_json
from bertkit.padding import moved
from bertkit.sentence import models
from bertkit.sentence.directory import transformer_max_seq_length
from bertkit.sentence.sparse_encoder.screen import ScreenedMaxLogits, _blocks
from bertkit.tokenization import AutoTokenizer
from bertkit.weight_files import read_weights

# The head's row block when chunk_size is unset, on the CPU: the decoder's (rows, H) x (H, V) product ran at 78
# GFLOPS on 64 rows and 48 on 1,024 (one EPYC core, MiniLM's 384 x 30,522), whose logits stay in the caches.
CPU_ROWS = 64


def accumulating(dtype: torch.dtype) -> torch.dtype:
    """The type logits are pooled in: float32 for a half-precision model (its sums and activations kept from
    fp16/bf16 rounding), the model's own otherwise (a float64 model's weights were pooled at float32's 1e-8)."""
    return torch.promote_types(dtype, torch.float32)


def _check_choice(name: str, value: Any, choices: Sequence[str]) -> None:
    if value not in choices:
        raise BertkitError(f"SpladePooling {name} {value!r} is not one of {list(choices)}")


class SpladePooling(nn.Module):
    """``pooling_strategy`` "max" (SPLADE v2 and later) or "sum" (the first SPLADE); ``activation_function``
    "relu" (log(1 + relu(x))) or "log1p_relu" (log(1 + log(1 + relu(x))), opensearch's). ``chunk_size``: token
    positions per block of the head's logits (rows = chunk_size x batch size), as sentence-transformers'; None
    leaves it to bertkit (``CPU_ROWS`` rows on the CPU, the whole batch elsewhere)."""

    st_type: ClassVar[str] = "sentence_transformers.sparse_encoder.modules.splade_pooling.SpladePooling"
    STRATEGIES: ClassVar[tuple[str, ...]] = ("max", "sum")
    ACTIVATIONS: ClassVar[tuple[str, ...]] = ("relu", "log1p_relu")

    def __init__(self, pooling_strategy: str = "max", activation_function: str = "relu",
                 embedding_dimension: int | None = None, chunk_size: int | None = None):
        super().__init__()
        _check_choice("pooling_strategy", pooling_strategy, self.STRATEGIES)
        _check_choice("activation_function", activation_function, self.ACTIVATIONS)
        if chunk_size is not None and not is_whole(chunk_size):
            raise BertkitError(f"SpladePooling chunk_size {chunk_size!r} must be a whole number >= 1 (or None)")
        self.pooling_strategy, self.activation_function = pooling_strategy, activation_function
        self.embedding_dimension, self.chunk_size = embedding_dimension, chunk_size

    @classmethod
    def load(cls, directory: Path) -> SpladePooling:
        config = read_json(directory / "config.json")
        if config is None:
            raise MissingFileError(f"{directory / 'config.json'} is missing: a SpladePooling module's settings"
                                   f"{cache_hint(directory.parent)}")
        dim = config.get("embedding_dimension", config.get("word_embedding_dimension"))
        return cls(config.get("pooling_strategy", "max"), config.get("activation_function", "relu"), dim)

    def save(self, directory: Path) -> None:
        atomic_write_json(directory / "config.json", {
            "pooling_strategy": self.pooling_strategy, "activation_function": self.activation_function,
            "embedding_dimension": self.embedding_dimension})

    def activate(self, logits: Tensor) -> Tensor:
        x = logits.relu()  # log1p in place but where relu's backward will read its output
        x = x.log1p() if x.requires_grad else x.log1p_()
        return (x.log1p() if x.requires_grad else x.log1p_()) if self.activation_function == "log1p_relu" else x

    def forward(self, out: BertModelOutput, attention_mask: Tensor, head: nn.Module,
                decoder: nn.Module | None = None) -> Tensor:
        """(B, V): ``head`` (the masked-LM head: ``transform``, then ``decoder`` to the vocabulary logits) on
        ``out``'s real tokens, activated and pooled per text; ``decoder``: what computes the logits instead of
        ``head.decoder`` (the copy ``splade_embedder`` prepares for CPU inference), or for max pooling the pooled
        maxima (``ScreenedMaxLogits``). The activation is monotonic, so max pooling takes each text's maximum logit
        per word piece and activates the (B, V) maxima only (``_MaxLogits``): the numbers of activating every
        token's logits first."""
        mask = attention_mask.bool()
        lengths = mask.sum(1).tolist()  # nothing read back where the batch is still on the host
        hidden = out.token_layout.select(out.tokens, mask)  # (N, H): each text's tokens, found on the host
        N = hidden.shape[0]
        rows = self.chunk_size * len(lengths) if self.chunk_size else CPU_ROWS if hidden.device.type == "cpu" \
            else max(N, 1)
        decoder = decoder if decoder is not None else head.decoder
        states = head.transform(hidden)  # (N, H)
        if isinstance(decoder, ScreenedMaxLogits):  # inference on a CPU with AVX512-VNNI or AMX (max pooling)
            return self.activate(decoder(states, lengths, rows if self.chunk_size else decoder.ROWS))
        if self.pooling_strategy == "max":
            weight, bias = head.decoder.weight, head.bias
            backward = torch.is_grad_enabled() and (states.requires_grad or weight.requires_grad or bias.requires_grad)
            return self.activate(_MaxLogits.apply(states, weight, bias, decoder, lengths, rows, backward))
        text_of = moved(torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths)),
                        hidden.device)  # (N,) each token's text, made on the host
        pooled = None
        for a in range(0, N, rows):
            logits = decoder(states[a:a + rows])  # (R, V)
            part = self.activate(logits.to(accumulating(logits.dtype)))
            if pooled is None:
                pooled = part.new_zeros(len(lengths), part.shape[-1])
            pooled = pooled.index_add(0, text_of[a:a + rows], part)
        return pooled

    def extra_repr(self) -> str:
        return f"pooling_strategy={self.pooling_strategy!r}, activation_function={self.activation_function!r}"


class _MaxLogits(torch.autograd.Function):
    """Each text's maximum logit per word piece, (B, V), from the (N, H) transformed states of the texts' tokens
    (``lengths`` of them each, in order), ``rows`` states at a time: the (N, V) logits are never held whole, in
    the forward pass or for the backward.

    The backward pass is sparse. A maximum's gradient goes to the one token that holds it (as torch.max's), and
    the activation's is 0 wherever the maximum logit is <= 0 (relu): only the K active (text, word piece) pairs,
    some hundreds a text, carry one. So the decoder's gradients are K rows, not the (N, V) x (V, H) products a
    dense backward computes: dstates[n] += g W[v], dW[v] += g states[n], dbias[v] += g for each active (b, v)
    with n its token. For MiniLM's 384 x 30,522 decoder that dense backward cost twice the decoder's forward, as
    much as the encoder's forward and backward together."""

    @staticmethod
    def forward(ctx: Any, states: Tensor, weight: Tensor, bias: Tensor, decoder: nn.Module, lengths: list[int],
                rows: int, backward: bool) -> Tensor:
        """``backward``: whether a backward pass will follow (then each maximum's token is kept)."""
        keep = backward
        pooled = at = None
        for a, b, spans in _blocks(lengths, rows):
            logits = decoder(states[a:b])  # (R, V)
            logits = logits.to(accumulating(logits.dtype))
            if pooled is None:
                pooled = logits.new_full((len(lengths), logits.shape[1]), -torch.inf)
                at = torch.zeros(pooled.shape, dtype=torch.long, device=pooled.device) if keep else None
            for k, lo, hi, first in spans:
                if keep:
                    value, index = logits[lo - a:hi - a].max(0)
                    if first:
                        pooled[k], at[k] = value, index + lo
                    else:  # the text began in an earlier block
                        better = value > pooled[k]
                        pooled[k] = torch.where(better, value, pooled[k])
                        at[k] = torch.where(better, index + lo, at[k])
                else:
                    value = logits[lo - a:hi - a].amax(0)
                    pooled[k] = value if first else torch.maximum(pooled[k], value)
        if keep:
            ctx.save_for_backward(states, weight, at)
        return pooled

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        states, weight, at = ctx.saved_tensors
        text, piece = grad.nonzero(as_tuple=True)  # the K (b, v) pairs with a gradient
        g = grad[text, piece].unsqueeze(1)  # (K, 1)
        token = at[text, piece]  # (K,): the row of states that holds each maximum
        d_states = d_weight = d_bias = None
        if ctx.needs_input_grad[0]:
            d_states = torch.zeros(states.shape, dtype=g.dtype, device=states.device)
            d_states = d_states.index_add_(0, token, g * weight[piece].to(g.dtype)).to(states.dtype)
        if ctx.needs_input_grad[1]:
            d_weight = torch.zeros_like(weight).index_add_(0, piece, (g * states[token].to(g.dtype)).to(weight.dtype))
        if ctx.needs_input_grad[2]:
            d_bias = torch.zeros(weight.shape[0], dtype=grad.dtype, device=grad.device).index_add_(0, piece, g[:, 0])
        return d_states, d_weight, d_bias, None, None, None, None


class Transformer(models.Transformer):
    """A fill-mask transformer: ``bertkit.sentence.models``' Transformer holding bertkit's ``BertForMaskedLM`` as
    ``model``, whose encoder gives ``SpladePooling`` its inputs and whose ``head`` it applies. ``Transformer(path,
    transformer_task="fill-mask")`` opens a checkpoint directory, as sentence-transformers' does; a checkpoint
    without a masked-LM head, or whose vocabulary is not its tokenizer's, is refused before the weights load."""

    st_type: ClassVar[str] = "sentence_transformers.base.modules.transformer.Transformer"
    # what sentence-transformers 6 writes for its fill-mask Transformer, beside max_seq_length and do_lower_case
    task_keys: ClassVar[dict[str, Any]] = {"transformer_task": "fill-mask", "modality_config": {
        "text": {"method": "forward", "method_output_name": "logits"}}, "module_output_name": "token_embeddings"}

    # sentence-transformers' default: its Transformer(path) is the dense feature-extraction module whatever it is
    # imported from, whose token states SpladePooling pools into hidden_size (384) weights, not a vocabulary's. This
    # one defaulted to "fill-mask", so the same script gave 30,522 SPLADE weights here and 384 dense ones there.
    def __init__(self, model_name_or_path: str | Path, *, transformer_task: str = "feature-extraction",
                 max_seq_length: int | None = None, do_lower_case: bool = False):
        nn.Module.__init__(self)  # the base's __init__ loads a dense encoder and takes its arguments
        if transformer_task != "fill-mask":
            default = " (sentence-transformers' default)" if transformer_task == "feature-extraction" else ""
            raise BertkitError(f"Transformer(transformer_task={transformer_task!r}){default}: a bertkit SparseEncoder "
                               "runs the fill-mask task only (SPLADE): pass transformer_task='fill-mask' (or use "
                               "MLMTransformer(path)); sentence-transformers' feature-extraction Transformer under "
                               "SpladePooling gives hidden_size dense weights, which bertkit does not implement; for "
                               "dense embeddings use bertkit.sentence.SentenceTransformer")
        path = Path(model_name_or_path)
        models.refuse_adapter(path, "SparseEncoder(base)", "model[0].model")
        self.model = load_masked_lm(path)
        # SparseEncoder takes no model_kwargs: the model is cast after loading
        models.warn_saved_half(path, {}, self.model.config, "call .half() or .bfloat16() on the SparseEncoder")
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        vocab, words = self.model.config.vocab_size, len(self.tokenizer)
        if vocab != words:
            raise BertkitError(f"{path}: the model's vocabulary has {vocab} entries (config.json vocab_size) but its "
                               f"tokenizer {words}; each SPLADE dimension is a word piece, so they must be the "
                               "same: use the checkpoint's own tokenizer, or resize the embeddings to the tokenizer")
        try:
            # 0 is a length (refused), not "the default": sentence-transformers cuts at what it is given
            self.max_seq_length = max_seq_length if max_seq_length is not None else min(
                self.tokenizer.model_max_length, self.model.config.max_position_embeddings)
        except BertkitError as e:
            raise BertkitError(f"{path}: {e}; lower it in {SBERT_CONFIG}") from None
        self.do_lower_case = do_lower_case

    @classmethod
    def load(cls, directory: Path) -> Transformer:
        """The file is read as a dense Transformer's (``transformer_max_seq_length``): a model_max_length in its
        processor_kwargs cuts texts over max_seq_length, and per-task lengths or processing_kwargs, which would cut
        them elsewhere in sentence-transformers, are refused. Another transformer_task is refused by the
        constructor."""
        sbert_file = directory / SBERT_CONFIG
        sbert = read_json(sbert_file) or {}
        task = sbert.get("transformer_task", "fill-mask")
        length = transformer_max_seq_length({k: v for k, v in sbert.items() if k != "transformer_task"}, sbert_file,
                                            cls.task_keys)
        return cls(directory, transformer_task=task, max_seq_length=length,
                   do_lower_case=bool(sbert.get("do_lower_case", False)))

    @property
    def head(self) -> nn.Module:
        """The masked-LM head: token states (..., H) -> vocabulary logits (..., V)."""
        return self.model.cls.predictions

    def forward(self, features: dict[str, Tensor]) -> BertModelOutput:
        return self.model.bert(features["input_ids"], features["attention_mask"], features.get("token_type_ids"))


class MLMTransformer(Transformer):
    """sentence-transformers 5's name for the fill-mask Transformer; its directories read the same."""

    def __init__(self, model_name_or_path: str | Path, *, transformer_task: str = "fill-mask",
                 max_seq_length: int | None = None, do_lower_case: bool = False):
        super().__init__(model_name_or_path, transformer_task=transformer_task, max_seq_length=max_seq_length,
                         do_lower_case=do_lower_case)


def load_masked_lm(path: Path) -> BertForMaskedLM:
    """``path``'s ``BertForMaskedLM``, refused when the checkpoint has no masked-LM head (``cls.predictions``):
    SPLADE's weights are that head's logits, and a head drawn at random would give random word pieces. Another
    network's (opensearch's DistilBERT encoders) is refused first, by its model_type."""
    refuse_other_network(path)
    weights = read_weights(path)
    if not any(k.startswith(("cls.predictions.", "bert.cls.predictions.")) for k in weights):
        from bertkit.weight_files import read_config_json

        architectures = read_config_json(path).get("architectures")
        raise BertkitError(f"{path} has no masked-LM head (no cls.predictions weights; architectures "
                           f"{architectures}): a SPLADE encoder's weights are that head's vocabulary logits. Start "
                           "from a checkpoint saved with its head (BertForMaskedLM or BertForPreTraining, e.g. one "
                           "`bertkit pretrain` wrote); sentence-transformers' CSR encoder for such a model "
                           "(Pooling + SparseAutoEncoder) is not implemented in bertkit")
    return BertForMaskedLM.from_pretrained(path, state_dict=weights)  # a transform it lacks drawn as transformers does


class SparseStaticEmbedding(nn.Module):
    """``weight`` (V,): a word piece's weight; a text's embedding holds it at each piece the text has (counted
    once, special tokens not added), as sentence-transformers' module. Texts are cut at the tokenizer's
    ``model_max_length``, as there: ``max_seq_length`` starts at it, and setting it (``model.max_seq_length = 64``)
    changes what the module reports, not where it cuts, in both libraries."""

    st_type: ClassVar[str] = \
        "sentence_transformers.sparse_encoder.modules.sparse_static_embedding.SparseStaticEmbedding"

    def __init__(self, tokenizer: Any, weight: Tensor | None = None, frozen: bool = False):
        super().__init__()
        self.tokenizer = tokenizer
        if weight is None:
            weight = torch.ones(len(tokenizer))
        if weight.dim() != 1 or weight.shape[0] != len(tokenizer):
            raise BertkitError(f"SparseStaticEmbedding weight has the shape {tuple(weight.shape)} but its tokenizer "
                               f"has {len(tokenizer)} word pieces; give one weight per word piece")
        self.weight = nn.Parameter(weight.float(), requires_grad=not frozen)
        self.frozen = bool(frozen)
        self.max_seq_length = tokenizer.model_max_length

    @classmethod
    def from_json(cls, json_path: str | Path, tokenizer: Any, frozen: bool = False) -> SparseStaticEmbedding:
        """Weights from a JSON object {word piece: weight} (an idf.json); pieces it leaves out weigh 0."""
        idf = read_json(Path(json_path))
        if not isinstance(idf, dict):
            raise MissingFileError(f"{json_path} is not a JSON object of word-piece weights (an idf.json)")
        vocab = tokenizer.get_vocab()
        unknown = [t for t in idf if t not in vocab]
        if unknown:
            raise BertkitError(f"{json_path}: {len(unknown)} word piece(s) are not in the tokenizer's vocabulary, "
                               f"e.g. {unknown[:5]}; the weights belong to another tokenizer")
        weight = torch.zeros(len(tokenizer))
        weight[torch.tensor([vocab[t] for t in idf], dtype=torch.long)] = torch.tensor(list(idf.values()),
                                                                                      dtype=torch.float32)
        return cls(tokenizer, weight, frozen)

    @classmethod
    def load(cls, directory: Path) -> SparseStaticEmbedding:
        config = read_json(directory / "config.json") or {}
        tokenizer = AutoTokenizer.from_pretrained(directory)
        if config.get("path") is not None:
            raise BertkitError(f"{directory / 'config.json'} points at weights elsewhere ({config['path']!r}); "
                               "bertkit reads the module's own weight file: load it with "
                               "SparseStaticEmbedding.from_json(path, tokenizer) and save the model")
        weights = read_weights(directory)
        if set(weights) != {"weight"}:
            raise BertkitError(f"{directory}: a SparseStaticEmbedding's weights are one tensor 'weight', found "
                               f"{sorted(weights)[:5]}")
        return cls(tokenizer, weights["weight"], bool(config.get("frozen", False)))

    def save(self, directory: Path) -> None:
        from safetensors.torch import save_file

        self.tokenizer.save_pretrained(directory)
        with atomic_target(directory / "model.safetensors") as tmp:  # called alone, it replaces the earlier file whole
            save_file({"weight": self.weight.detach().contiguous().cpu()}, str(tmp))
        atomic_write_json(directory / "config.json", {"frozen": self.frozen})

    def tokenize(self, texts: Sequence[str], prompt: str | None = None) -> dict[str, Tensor]:
        texts = [(prompt or "") + t for t in texts]
        return dict(self.tokenizer(texts, padding=True, truncation=True, add_special_tokens=False,
                                   return_tensors="pt"))

    def forward(self, features: dict[str, Tensor]) -> Tensor:
        ids, mask = (moved(features[k], self.weight.device) for k in ("input_ids", "attention_mask"))
        present = self.weight.new_zeros(ids.shape[0], self.weight.shape[0])  # (B, V)
        present.scatter_(1, ids, mask.to(present.dtype))  # padding writes 0 at [PAD]'s column, as in the reference
        return present * self.weight

    def extra_repr(self) -> str:
        return f"dim={self.weight.shape[0]}, frozen={self.frozen}"


class Router(nn.Module):
    """Routes (``sub_modules``: name -> modules) picked by the task: ``route_mappings`` {(task, modality): route}
    first, then the route named as the task, then a route named "text" (texts are the "text" modality), then
    ``default_route`` (the first route when unset and ``allow_empty_key``), as sentence-transformers' Router."""

    st_type: ClassVar[str] = "sentence_transformers.base.modules.router.Router"
    CONFIG: ClassVar[str] = "router_config.json"

    def __init__(self, sub_modules: dict[str, list[nn.Module]], default_route: str | None = None,
                 allow_empty_key: bool = True, route_mappings: dict[tuple[str | None, str | None], str] | None = None):
        super().__init__()
        if not sub_modules:
            raise BertkitError("Router needs at least one route")
        if default_route is not None and default_route not in sub_modules:
            raise BertkitError(f"Router default_route {default_route!r} is not one of its routes {list(sub_modules)}")
        bad = {k: v for k, v in (route_mappings or {}).items() if v not in sub_modules}
        if bad:
            raise BertkitError(f"Router route_mappings {bad} name routes it does not have ({list(sub_modules)})")
        self.sub_modules = nn.ModuleDict({name: nn.ModuleList(mods) for name, mods in sub_modules.items()})
        self.default_route = default_route if default_route is not None or not allow_empty_key \
            else next(iter(sub_modules))
        self.allow_empty_key = allow_empty_key
        self.route_mappings = dict(route_mappings or {})

    @classmethod
    def for_query_document(cls, query_modules: list[nn.Module], document_modules: list[nn.Module],
                           default_route: str | None = "document", allow_empty_key: bool = True) -> Router:
        return cls({"query": query_modules, "document": document_modules}, default_route, allow_empty_key)

    def resolve(self, task: str | None) -> str | None:
        """The route a text of ``task`` ("query", "document" or None) goes through; None where there is none."""
        for key in ((task, "text"), (task, None), (None, "text"), (None, None)):
            if key in self.route_mappings:
                return self.route_mappings[key]
        for name in (task, "text"):  # the task's route, then the text modality's, as sentence-transformers looks
            if name and name in self.sub_modules:
                return name
        return self.default_route if task is None else None

    def route(self, task: str | None) -> str:
        """``resolve``'s route, refused where there is none."""
        route = self.resolve(task)
        if route is None and task is not None:
            raise BertkitError(f"the Router has no route for task {task!r}; its routes are {list(self.sub_modules)}")
        if route is None:
            raise BertkitError(f"the Router has no default route: pass task= (one of {list(self.sub_modules)}) or "
                               "use encode_query / encode_document")
        return route

    @classmethod
    def load(cls, directory: Path, load_module: Any) -> Router:
        """``load_module(type_name, directory)`` loads each route's modules from their directories."""
        config = read_json(directory / cls.CONFIG) or read_json(directory / "config.json")
        if not isinstance(config, dict) or "types" not in config or "structure" not in config:
            raise MissingFileError(f"{directory / cls.CONFIG} is missing or lists no 'types' and 'structure'; a "
                                   "Router's directory names its modules there")
        modules = {}
        for name, type_name in config["types"].items():
            if "/" in name or "\\" in name or name in ("", ".", ".."):
                raise BertkitError(f"{directory / cls.CONFIG}: module directory {name!r} is not a plain name")
            modules[name] = load_module(type_name, directory / name)
        params = dict(config.get("parameters") or {})
        mappings = {}
        for key, route in (params.pop("route_mappings", None) or {}).items():
            mappings[ast.literal_eval(key)] = route
        routes = {route: [modules[name] for name in names] for route, names in config["structure"].items()}
        return cls(routes, route_mappings=mappings, **params)

    def save(self, directory: Path, save_module: Any) -> None:
        """Each module into its own directory ("{route}_{index}_{class}", a module shared by routes once), then
        router_config.json, as sentence-transformers writes them."""
        names: dict[int, str] = {}
        types, structure = {}, {}
        for route, mods in self.sub_modules.items():
            structure[route] = []
            for i, module in enumerate(mods):
                if id(module) not in names:
                    names[id(module)] = name = f"{route}_{i}_{type(module).__name__}"
                    types[name] = module.st_type
                    (directory / name).mkdir(exist_ok=True)
                    save_module(module, directory / name)
                structure[route].append(names[id(module)])
        params = {"default_route": self.default_route, "allow_empty_key": self.allow_empty_key,
                  "route_mappings": {str(k): v for k, v in self.route_mappings.items()}}
        atomic_write_json(directory / self.CONFIG, {"types": types, "structure": structure, "parameters": params},
                          indent=4)

    @property
    def tokenizer(self) -> Any:
        return next(mods[0].tokenizer for mods in self.sub_modules.values())

    def extra_repr(self) -> str:
        return f"default_route={self.default_route!r}" + (f", route_mappings={self.route_mappings}"
                                                          if self.route_mappings else "")


def route_of(modules: Sequence[nn.Module], where: str) -> list[nn.Module]:
    """``modules`` (a route, or a model's modules) checked to be one of the two pipelines bertkit runs: a fill-mask
    ``Transformer`` then ``SpladePooling``, or a ``SparseStaticEmbedding`` alone."""
    kinds = [type(m).__name__ for m in modules]
    if (len(modules) == 2 and isinstance(modules[0], Transformer) and isinstance(modules[1], SpladePooling)) or \
            (len(modules) == 1 and isinstance(modules[0], SparseStaticEmbedding)):
        return list(modules)
    raise BertkitError(f"{where} lists the modules {kinds}; bertkit's SparseEncoder runs Transformer (fill-mask) + "
                       "SpladePooling, or SparseStaticEmbedding, on each route (a Router's routes, or the model's "
                       "modules). Other modules (SparseAutoEncoder, Dense, Pooling: sentence-transformers' CSR "
                       "encoders) are not implemented: use sentence-transformers for this model")


_CSR = ("bertkit's SparseEncoder runs Transformer (fill-mask) + SpladePooling, or SparseStaticEmbedding, on each route; "
        "sentence-transformers' CSR encoders (Pooling, SparseAutoEncoder) and a Dense are not implemented: use "
        "sentence-transformers for such a model")
# sentence-transformers' sparse modules bertkit does not implement, with what to use
_REFUSED = {"Dense": _CSR, "SparseAutoEncoder": _CSR,
            "Asym": "use Router.for_query_document(query_modules=[...], document_modules=[...])",
            **dict.fromkeys(("Module", "InputModule"), "a custom module is not implemented: bertkit assembles the "
                                                       "modules listed in docs/sentence.md")}
__getattr__ = refusing_getattr(__name__, _REFUSED)
