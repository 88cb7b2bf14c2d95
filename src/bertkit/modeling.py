"""The BERT encoder: the whole forward pass in one file.

Implements the model of Devlin et al. 2018 ("BERT: Pre-training of Deep Bidirectional Transformers for
Language Understanding", section 3): the sum of token, segment and learned absolute position embeddings,
LayerNorm and dropout; L post-LayerNorm Transformer encoder layers (Vaswani et al. 2017) with GELU
feed-forward blocks; a pooler (dense + tanh) over the first token, [CLS].

Where this differs from the paper's text (not from its released code, which it follows):
- Module and parameter names are transformers' (``encoder.layer.3.attention.self.query``, ...), so state dicts
  move between the two libraries as they are. Every projection is a plain ``nn.Linear``; CPU inference
  speed-ups are a transform applied to a copy by ``bertkit.inference.prepare_model``.
- Padding is not computed on: by default (``layout="auto"``) padding tokens are dropped after the embeddings and
  every per-token layer runs on the real tokens only; attention, the one op that mixes tokens, is
  ``padding.self_attention`` (``TokenLayout``), which gathers q/k/v into per-sequence rectangles for SDPA.
  ``layout="padded"`` computes on the rectangle as transformers does; real positions agree within rounding.
- Inputs may be on the host while the model is on a GPU: they are checked and laid out there (no read-back,
  which would wait for every queued kernel) and copied over without waiting; transformers refuses them.
- ``output_attentions=True`` writes attention out (``attention_probs``) on the padded rectangle, as
  transformers' "eager" attention; otherwise the fused SDPA kernel runs.
- Initialisation is transformers' (the paper does not state one): normal(0, ``initializer_range``) weights (0.02),
  zero biases, unit LayerNorms, the padding row zeroed, module by module in transformers' order, so a seed gives
  transformers' weights bit for bit and leaves torch's generator where it does. google-research/bert's
  ``create_initializer`` cuts the normal at two standard deviations; transformers does not, nor does bertkit.

Shape legend: B batch, T sequence length, H hidden size, nh heads, hs head size (H / nh), I intermediate
size, L layers.
"""

from __future__ import annotations

import math
from collections.abc import Container, Iterable
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from bertkit.checkpoint_io import PretrainedMixin
from bertkit.compat import TupleAccess, returns_dataclass
from bertkit.config import BertConfig
from bertkit.construction import initialise_on_construction, new_embedding, new_linear
from bertkit.errors import BertkitError
from bertkit.model_checks import (
    check_fits_in_memory,
    check_inputs,
    compile_options,
    require_compiler,
    require_inductor_cache,
)
from bertkit.padding import TokenLayout, is_tracing, moved, self_attention, token_layout

# ---------------------------------------------------------------------------------------------------
# Layers
# ---------------------------------------------------------------------------------------------------


class NewGELU(nn.Module):
    """``hidden_act: "gelu_new"``: GELU's tanh approximation written out as google-research/bert (and transformers'
    ``NewGELUActivation``) computes it, op by op in the input's dtype. The function of ``nn.GELU(approximate="tanh")``
    ("gelu_pytorch_tanh"), whose fused kernel rounds once: in bf16 the two part by bf16 rounding, which grows through
    the layers (masked-LM logits 0.16 apart on a two-layer model)."""

    def forward(self, x: Tensor) -> Tensor:
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


class FastGELU(nn.Module):
    """``hidden_act: "gelu_fast"``: the same tanh approximation in transformers' ``FastGELUActivation`` arrangement
    (the constant rounded to 0.7978845608, x factored out of the cubic), op by op as there, so its roundings are
    transformers' in every dtype."""

    def forward(self, x: Tensor) -> Tensor:
        return 0.5 * x * (1.0 + torch.tanh(x * 0.7978845608 * (1.0 + 0.044715 * x * x)))


class QuickGELU(nn.Module):
    """``hidden_act: "quick_gelu"``: x * sigmoid(1.702 x) (transformers' ``QuickGELUActivation``)."""

    def forward(self, x: Tensor) -> Tensor:
        return x * torch.sigmoid(1.702 * x)


# hidden_act -> the module transformers' ACT2FN builds for it, computed op for op as there ("silu" and "swish" are
# the same function, as in transformers)
_ACTIVATION_MODULES = {"gelu": nn.GELU, "gelu_new": NewGELU, "gelu_fast": FastGELU,
                       "gelu_pytorch_tanh": lambda: nn.GELU(approximate="tanh"), "quick_gelu": QuickGELU,
                       "relu": nn.ReLU, "silu": nn.SiLU, "swish": nn.SiLU, "mish": nn.Mish, "tanh": nn.Tanh}


def activation(name: str) -> nn.Module:
    """The feed-forward non-linearity ``hidden_act`` names (one of ``config.ACTIVATIONS``), as a module
    (transformers' ``intermediate_act_fn``); the paper (section 3.1) uses GELU."""
    return _ACTIVATION_MODULES[name]()


class BertEmbeddings(nn.Module):
    """Token + segment + position embeddings, then LayerNorm and dropout (paper, section 3, Figure 2)."""

    def __init__(self, config: BertConfig):
        super().__init__()
        # padding_idx as transformers: the [PAD] row gets no gradient through the lookup (and starts at zero)
        self.word_embeddings = new_embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        self.position_embeddings = new_embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = new_embedding(config.type_vocab_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)  # noqa: N815 - transformers' name
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        # (1, max_position_embeddings), where transformers keeps it: the positions of a padded batch, 0..T-1, so the
        # recipe that lengthens the position table (new position_embeddings, this buffer and the config's size
        # assigned) lengthens them too
        self.register_buffer("position_ids", torch.arange(config.max_position_embeddings).expand((1, -1)),
                             persistent=False)

    def forward(self, input_ids: Tensor | None = None, token_type_ids: Tensor | None = None,
                position_ids: Tensor | None = None, inputs_embeds: Tensor | None = None) -> Tensor:
        # inputs_embeds (given instead of input_ids) replaces only the word-embedding lookup, as in transformers.
        words = self.word_embeddings(input_ids) if inputs_embeds is None else inputs_embeds
        # Called directly (``model.bert.embeddings(input_ids)``, as adversarial-training and attribution recipes do),
        # token types default to 0 and positions to 0..T-1, as transformers' defaults; BertModel passes both
        if token_type_ids is None:
            token_type_ids = torch.zeros(words.shape[:-1], dtype=torch.long, device=words.device)
        if position_ids is None:
            position_ids = self.position_ids[0, :words.shape[-2]]  # (T,), broadcast over the batch
        x = words + self.token_type_embeddings(token_type_ids)
        x = x + self.position_embeddings(position_ids)  # (B, T, H)
        return self.dropout(self.LayerNorm(x))


def global_module_hooks() -> bool:
    """Whether a hook registered for every module (the ``register_module_*_hook`` functions of
    ``torch.nn.modules.module``: profilers, activation recorders) is set: it watches each module call as a module's
    own hook does."""
    g = torch.nn.modules.module
    return bool(g._global_forward_hooks or g._global_forward_pre_hooks or g._global_backward_hooks
                or g._global_backward_pre_hooks)


def has_hooks(m: nn.Module) -> bool:
    """Whether ``m`` has a hook of its own: forward, forward-pre, backward or backward-pre."""
    return bool(m._forward_hooks or m._forward_pre_hooks or m._backward_hooks or m._backward_pre_hooks)


def plain_linear(m: nn.Module | None) -> bool:
    """Whether ``m`` is a plain ``nn.Linear`` whose call is ``F.linear(x, m.weight, m.bias)``: no subclass (a
    parametrized one is), no hook of its own (forward or backward: pruning's mask is a forward pre-hook, a full
    backward hook watches the gradients) and no ``forward`` of its own (accelerate's ``add_hook_to_module`` sets one:
    offloading, device maps). Anything else must be called as a module: a product fused from its weights skipped
    the hook or the forward without a word."""
    return type(m) is nn.Linear and "forward" not in m.__dict__ and not has_hooks(m)


def runs_as_f_linear(m: nn.Module | None) -> bool:
    """``plain_linear(m)`` with no hook set for every module either: what a fused product may stand in for now."""
    return plain_linear(m) and not global_module_hooks()


class BertSelfAttention(nn.Module):
    """Multi-head self-attention (Vaswani et al. 2017, section 3.2.2) with transformers' projection names (so
    peft's ``target_modules=["query", "value"]`` finds them). int8 and CPU-inference copies replace the three
    with one module, ``qkv``."""

    def __init__(self, config: BertConfig):
        super().__init__()
        H = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.query = new_linear(H, H)
        self.key = new_linear(H, H)
        self.value = new_linear(H, H)
        self.dropout = nn.Dropout(config.attention_probs_dropout_prob)
        self.qkv: nn.Module | None = None  # (..., H) -> (..., 3H) in place of the three

    def project(self, x: Tensor) -> Tensor:
        """q, k and v side by side: (..., H) -> (..., 3H)."""
        if self.qkv is not None:
            return self.qkv(x)
        parts = (self.query, self.key, self.value)
        if all(runs_as_f_linear(m) and m.bias is not None for m in parts):
            # One product with the three weights stacked (in training too: the weights' gradients come back through
            # the stacking): one GEMM instead of three and no (..., 3H) copy of the outputs
            return F.linear(x, torch.cat([m.weight for m in parts]), torch.cat([m.bias for m in parts]))
        # wrapped projections (peft's LoRA, hooks, pruning, accelerate's forward) run as modules
        return torch.cat([m(x) for m in parts], -1)

    def forward(self, x: Tensor, layout: TokenLayout, output_attentions: bool = False) -> tuple[Tensor, Tensor | None]:
        """(context like x, attention probabilities (B, nh, T, T) or None); probabilities need the padded layout."""
        p = self.dropout.p if self.training else 0.0
        if output_attentions:
            return attention_probs(self.project(x), layout.key_mask, self.num_heads, p)  # (B, T, H)
        return self_attention(self.project(x), layout, self.num_heads, p), None  # like x


class BertOutput(nn.Module):
    """A block's output: projection back to H, dropout and residual post-LayerNorm, LN(x + dropout(W h)). This one
    ends the feed-forward block, (..., I) -> (..., H); ``BertSelfOutput`` ends the attention block."""

    def __init__(self, config: BertConfig, in_features: int | None = None):
        super().__init__()
        self.dense = new_linear(config.intermediate_size if in_features is None else in_features, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)  # noqa: N815 - transformers' name
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, h: Tensor, x: Tensor) -> Tensor:
        return self.LayerNorm(x + self.dropout(self.dense(h)))  # (..., H)


class BertSelfOutput(BertOutput):
    """The attention block's output (transformers' ``attention.output``): W is (H, H)."""

    def __init__(self, config: BertConfig):
        super().__init__(config, config.hidden_size)


class BertAttention(nn.Module):
    """Self-attention and its output block (transformers' ``attention.self`` and ``attention.output``)."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.self = BertSelfAttention(config)
        self.output = BertSelfOutput(config)

    def forward(self, x: Tensor, layout: TokenLayout, output_attentions: bool = False) -> tuple[Tensor, Tensor | None]:
        a, probs = self.self(x, layout, output_attentions)
        return self.output(a, x), probs


class BertIntermediate(nn.Module):
    """The feed-forward block's first half: act(W1 x), (..., H) -> (..., I)."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = new_linear(config.hidden_size, config.intermediate_size)
        self.intermediate_act_fn = activation(config.hidden_act)

    def forward(self, x: Tensor) -> Tensor:
        return self.intermediate_act_fn(self.dense(x))  # (..., I)


class BertLayer(nn.Module):
    """One post-LayerNorm encoder layer: x = LN(x + Attn(x)); x = LN(x + FFN(x)). Submodules carry
    transformers' names (``attention.self.query``, ``attention.output.dense``, ``intermediate.dense``,
    ``output.dense``, ...), so its state dict and module paths are transformers' own."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.attention = BertAttention(config)
        self.intermediate = BertIntermediate(config)
        self.output = BertOutput(config)

    def forward(self, x: Tensor, layout: TokenLayout, output_attentions: bool = False) -> tuple[Tensor, Tensor | None]:
        """(new x, attention probabilities (B, nh, T, T) or None). ``output_attentions`` needs the padded layout."""
        # x is (B, T, H) in the padded layout and (N, H) otherwise; every op but attention is per token.
        x, probs = self.attention(x, layout, output_attentions)
        return self.output(self.intermediate(x), x), probs


class BertEncoder(nn.Module):
    """The L layers, as ``encoder.layer`` (transformers' path), run in turn: a module of its own, as transformers'
    encoder, so a hook on ``model.encoder`` runs once per forward."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(config) for _ in range(config.num_hidden_layers))

    def forward(self, x: Tensor, layout: TokenLayout, eager: bool = False, output_hidden_states: bool = False,
                recompute: bool = False) -> tuple[Tensor, tuple[Tensor, ...] | None, tuple[Tensor, ...] | None]:
        """(the last layer's states, each layer's states or None, each layer's attention probabilities or None) for
        ``x``, the embeddings' output as ``layout`` stores it; probabilities with ``eager`` (attention written out).
        ``recompute``: each layer recomputed in the backward pass (gradient checkpointing)."""
        states = [x] if output_hidden_states else None
        x = layout.pack(x)  # the rows the layers compute on: N rounded up to token_multiple
        attentions = [] if eager else None
        for layer in self.layer:
            # Non-reentrant checkpointing replays the layer's dropout with the same random state
            if recompute:
                x, probs = checkpoint(layer, x, layout, eager, use_reentrant=False)
            else:
                x, probs = layer(x, layout, eager)
            if states is not None:
                states.append(layout.unpack(x))
            if attentions is not None:
                attentions.append(probs)
        x = layout.unpack(x)  # (N, H) or (B, T, H): the real tokens only
        return x, None if states is None else tuple(states), None if attentions is None else tuple(attentions)


def attention_probs(qkv: Tensor, key_mask: Tensor | None, num_heads: int, dropout_p: float) -> tuple[Tensor, Tensor]:
    """softmax(q k^T / sqrt(hs)) v written out (Vaswani et al. 2017, eq. 1), with the probabilities (after
    dropout, as transformers returns them); ``key_mask`` (B, 1, 1, T) is True at real keys."""
    B, T, three_h = qkv.shape
    hs = three_h // (3 * num_heads)
    q, k, v = qkv.view(B, T, 3, num_heads, hs).permute(2, 0, 3, 1, 4)  # 3 x (B, nh, T, hs)
    scores = (q @ k.transpose(-1, -2)) / hs**0.5  # (B, nh, T, T)
    if key_mask is not None:
        scores = scores.masked_fill(~key_mask, torch.finfo(scores.dtype).min)
    probs = F.dropout(scores.softmax(-1), dropout_p, training=dropout_p > 0)  # (B, nh, T, T)
    y = probs @ v  # (B, nh, T, hs)
    return y.transpose(1, 2).reshape(B, T, num_heads * hs), probs


class BertPooler(nn.Module):
    """Dense + tanh over the [CLS] state: the sentence representation NSP and classifiers read (section 3)."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = new_linear(config.hidden_size, config.hidden_size)
        self.activation = nn.Tanh()

    def forward(self, hidden_states: Tensor) -> Tensor:
        """(B, T', H) -> (B, H) from each sequence's first token, as transformers' pooler: a hook on it sees (B, T, H)
        token states there, here too when hooked (``BertModel._pooler_input``); T' is 1 otherwise."""
        return self.activation(self.dense(hidden_states[:, 0]))  # (B, H)


def init_bert_weights(module: nn.Module, std: float, keep: Container[str] = ()) -> None:
    """transformers' ``_init_weights`` for one module: normal(0, std) Linear and Embedding weights (the padding row
    zeroed), zero biases, unit LayerNorm. A parameter named in ``keep`` (one a checkpoint set) keeps its value and
    draws nothing, as transformers skips a loaded one, so the generator advances only for what is drawn."""
    with torch.no_grad():
        if isinstance(module, (nn.Linear, nn.Embedding)):
            if "weight" not in keep:
                module.weight.normal_(0.0, std)
                if isinstance(module, nn.Embedding) and module.padding_idx is not None:
                    module.weight[module.padding_idx].zero_()
            if isinstance(module, nn.Linear) and module.bias is not None and "bias" not in keep:
                module.bias.zero_()
        elif isinstance(module, nn.LayerNorm):
            if "weight" not in keep:
                module.weight.fill_(1.0)
            if "bias" not in keep:
                module.bias.zero_()


# ---------------------------------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------------------------------


@dataclass
class BertModelOutput(TupleAccess):
    """Encoder outputs. ``tokens`` are the stored token states: (B, T, H) in the padded layout, (N, H)
    for the N real tokens otherwise; ``last_hidden_state`` always gives the caller's padded (B, T, H)."""

    tokens: Tensor
    pooler_output: Tensor | None  # (B, H); None without pooler
    token_layout: TokenLayout  # where the real tokens are (not model.layout, the setting that chose it)
    layer_tokens: tuple[Tensor, ...] | None = None  # with output_hidden_states: L + 1, embeddings first
    attentions: tuple[Tensor, ...] | None = None  # with output_attentions: L tensors (B, nh, T, T)
    tuple_fields: ClassVar[tuple[str, ...]] = ("last_hidden_state", "pooler_output", "hidden_states",
                                               "attentions")

    @property
    def last_hidden_state(self) -> Tensor:
        """(B, T, H). In the unpadded layout padding positions hold zeros."""
        return self.token_layout.to_batch(self.tokens)

    @property
    def hidden_states(self) -> tuple[Tensor, ...] | None:
        """L + 1 tensors (B, T, H), the embeddings' output first (the feature-based approach reads these)."""
        return None if self.layer_tokens is None else tuple(self.token_layout.to_batch(t) for t in self.layer_tokens)


def _flatten_output(out: BertModelOutput) -> tuple[list[Any], str]:
    """A pytree node for torch.export: a plain padded layout is rebuilt from the token states' shape, so an
    exported graph outputs tensors only (as ONNX needs); an unpadded one (eager only) is a child of its own."""
    if out.token_layout.is_padded and out.token_layout.extra_rows == 0 and not out.token_layout.zero_padding:
        return [out.tokens, out.pooler_output, out.layer_tokens, out.attentions], "padded"
    return [out.tokens, out.pooler_output, out.layer_tokens, out.attentions, out.token_layout], "layout"


def _unflatten_output(children: Iterable[Any], context: str) -> BertModelOutput:
    tokens, pooled, layer_tokens, attentions, *layout = children
    lay = layout[0] if context == "layout" else TokenLayout(tuple(tokens.shape[:2]), None)
    return BertModelOutput(tokens, pooled, lay, layer_tokens, attentions)


torch.utils._pytree.register_pytree_node(
    BertModelOutput, _flatten_output, _unflatten_output, serialized_type_name="bertkit.modeling.BertModelOutput",
    flatten_with_keys_fn=lambda out: ([(torch.utils._pytree.GetAttrKey(k), v) for k, v in zip(
        ("tokens", "pooler_output", "layer_tokens", "attentions", "token_layout"), _flatten_output(out)[0])],
        _flatten_output(out)[1]))

LAYOUTS = ("auto", "padded", "unpadded")


class BertModel(PretrainedMixin, nn.Module):
    """The bidirectional Transformer encoder with its pooler."""

    output_names = ("last_hidden_state", "pooler_output")

    def __init__(self, config: BertConfig, add_pooling_layer: bool = True):
        super().__init__()
        if not isinstance(config, BertConfig):  # transformers' has the same fields, unchecked (is_decoder, ...)
            raise BertkitError(f"{type(self).__name__} needs a bertkit BertConfig, got {type(config).__module__}."
                               f"{type(config).__name__}; convert it with bertkit.BertConfig.from_dict(config.to_dict()), "
                               "which refuses what bertkit does not implement, or read the checkpoint's with "
                               "bertkit.AutoConfig.from_pretrained(path)")
        check_fits_in_memory(config)  # before the first layer is allocated, not when the allocator gives up
        self.config = config
        self.embeddings = BertEmbeddings(config)
        self.encoder = BertEncoder(config)
        self.pooler = BertPooler(config) if add_pooling_layer else None
        # The layout forward uses when the caller names none; set "padded" to compute as transformers does.
        self.layout = "auto"
        # Recompute each layer's activations in the backward pass instead of keeping them (training memory
        # for compute); the training loop sets it for --gradient-checkpointing. Results are unchanged.
        self.gradient_checkpointing = False
        # "sdpa" (default): PyTorch's fused attention on real tokens; "eager": attention written out on the padded
        # rectangle, as transformers' eager implementation (what output_attentions=True uses anyway).
        self.attn_implementation = "sdpa"
        # Rounding up with masked zeros that changes no output (1: none), set by prepare_model for CPU inference:
        # attention's keys to a multiple of key_multiple, the unpadded rows to one of token_multiple.
        self.key_multiple = 1
        self.token_multiple = 1
        if initialise_on_construction():  # not when from_pretrained is about to load the weights
            self.apply(self._init_weights)

    def _init_weights(self, module: nn.Module, keep: Container[str] = ()) -> None:
        init_bert_weights(module, self.config.initializer_range, keep)

    def forward(
        self,
        input_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        position_ids: Tensor | None = None,
        inputs_embeds: Tensor | None = None,
        *,
        output_hidden_states: bool | None = None,
        output_attentions: bool | None = None,
        return_dict: bool | None = None,
        layout: str | None = None,
    ) -> BertModelOutput | tuple[Tensor, ...]:
        """Encode a batch; positional arguments in transformers' order, the rest keywords only.

        ``layout="auto"`` drops padding before the first layer (on a GPU only where that is faster there,
        ``padding.gpu_keeps_rectangle``); outputs are zero at padding. ``"padded"`` computes on the rectangle.
        ``inputs_embeds``, ``output_attentions`` (B, nh, T, T) per layer, ``return_dict=False`` and the config's
        defaults for the three switches are transformers'; under ``torch.jit.trace`` the output is the tuple.
        """
        output_hidden_states = self.config.output_hidden_states if output_hidden_states is None else output_hidden_states
        output_attentions = self.config.output_attentions if output_attentions is None else output_attentions
        return_dict = returns_dataclass(self.config.return_dict, return_dict)
        B, T = check_inputs(self.config, input_ids, token_type_ids, attention_mask, position_ids, inputs_embeds,
                            self._table_rows())
        layout, eager = self._resolve_layout(layout, output_attentions, T)
        # The rate the attention modules apply (their nn.Dropout's p, as transformers reads it), not the config's: a
        # config changed after construction, or a dropout module set to 0, would lay out a batch for another rate
        # (a layout for no dropout is refused by attention that applies some: variable-length attention on a GPU).
        attention_dropout = 0.0
        for layer in self.encoder.layer if self.training else ():  # a loop, not max() of a generator: no graph break
            attention_dropout = max(attention_dropout, layer.attention.self.dropout.p)
        device = self.embeddings.position_ids.device
        if device.type == "meta" and self.embeddings.word_embeddings.weight.device.type != "meta":
            raise BertkitError(
                f"the position_ids buffer is on the meta device while the weights are on "
                f"{self.embeddings.word_embeddings.weight.device}: a model built on the meta device (torch.device"
                "('meta'), accelerate's init_empty_weights(include_buffers=True)) and given its weights with "
                "load_state_dict(..., assign=True) keeps its non-persistent buffers there; build it under "
                "init_empty_weights() (buffers on the host) or load it with from_pretrained(path)")
        lay = token_layout(layout, attention_mask, B, T, self.embeddings.word_embeddings.weight.dtype, device,
                           self.key_multiple, self.token_multiple, attention_dropout, self._hooked)
        # Inputs may come from the host (bertkit's batch runners leave them there): checked and laid out there
        # above, with nothing read back from the device, then copied over without waiting.
        input_ids, token_type_ids, position_ids, inputs_embeds = (
            moved(t, device) for t in (input_ids, token_type_ids, position_ids, inputs_embeds))
        if token_type_ids is None:
            token_type_ids = (torch.zeros_like(input_ids) if input_ids is not None  # zeros_like: traces dynamically
                              else torch.zeros(B, T, dtype=torch.long, device=inputs_embeds.device))

        x = self._embed(lay, B, T, input_ids, token_type_ids, position_ids, inputs_embeds)  # (B, T, H) or (N, H)
        recompute = self.gradient_checkpointing and self.training and torch.is_grad_enabled()
        x, states, attentions = self.encoder(x, lay, eager, output_hidden_states, recompute)
        pooled = self.pooler(self._pooler_input(lay, x)) if self.pooler is not None else None
        out = BertModelOutput(x, pooled, lay, states, attentions if output_attentions else None)
        return out if return_dict else out.to_tuple()

    def _table_rows(self) -> tuple[int, int, int]:
        """The rows of the word, token-type and position tables (the positions: as many as the position_ids buffer
        holds too). The ids are checked against these, not the config's sizes: a table assigned in place of another
        (``model.bert.embeddings.token_type_embeddings = nn.Embedding(4, H)``) is what the lookup indexes, as in
        transformers, whose config a direct assignment leaves as it was."""
        e = self.embeddings
        return (e.word_embeddings.num_embeddings, e.token_type_embeddings.num_embeddings,
                min(e.position_embeddings.num_embeddings, e.position_ids.shape[-1]))

    def _resolve_layout(self, layout: str | None, output_attentions: bool, T: int) -> tuple[str, bool]:
        """(the layout to compute in, whether attention is written out): the caller's or the model's layout,
        padded when tracing or when attention probabilities are wanted; refuses a sequence longer than the
        position table."""
        layout = "padded" if is_tracing() else layout or self.layout  # export: static shapes, no data checks
        if layout not in LAYOUTS:
            raise BertkitError(f"layout {layout!r} is not one of {LAYOUTS}")
        eager = output_attentions or self.attn_implementation == "eager"
        if eager:
            layout = "padded"  # probabilities per (query, key) position of the caller's rectangle
        positions = self._table_rows()[2]
        if T > positions:
            raise BertkitError(
                f"sequence length {T} exceeds max_position_embeddings {positions} "
                f"of this model; truncate the input (e.g. tokenizer(..., truncation=True, "
                f"max_length={positions}))"
            )
        return layout, eager

    def _pooler_input(self, lay: TokenLayout, x: Tensor) -> Tensor:
        """What the pooler is called with: the padded rectangle (B, T, H) where it is at hand or where a hook on the
        pooler would read it (transformers' input: a hook reading ``args[0][:, 0]`` or ``args[0].mean(1)`` gets the
        same numbers, zeros at padding), else only the first tokens, (B, 1, H), with no (B, T, H) copy made."""
        if lay.is_padded:
            return x
        if has_hooks(self.pooler) or global_module_hooks():
            return lay.to_batch(x)
        return lay.first_tokens(x)[:, None]

    def _hooked(self) -> bool:
        """Whether a hook watches the embeddings or a layer (or a module in them): ``"auto"`` then keeps the padded
        rectangle, so a hook sees (B, T, ...) tensors, transformers' own, where dropping padding would hand it the
        (N, ...) real-token rows and code indexing them as (B, T, ...) would read the wrong numbers without error."""
        if global_module_hooks():  # a hook on every module watches these too
            return True
        stack: list[nn.Module] = [self.embeddings, self.encoder]  # a walk of _modules: modules() costs 2x more
        while stack:
            m = stack.pop()
            if has_hooks(m):
                return True
            stack.extend(child for child in m._modules.values() if child is not None)
        return False

    def _embed(self, lay: TokenLayout, B: int, T: int, input_ids: Tensor | None, token_type_ids: Tensor,
               position_ids: Tensor | None, inputs_embeds: Tensor | None) -> Tensor:
        """The embeddings of the tokens ``lay`` keeps: (B, T, H) on the rectangle, (N, H) with padding dropped,
        where only the real tokens are looked up."""
        if lay.is_padded:
            pos = self.embeddings.position_ids[:, :T] if position_ids is None else position_ids  # (1 or B, T)
            return self.embeddings(input_ids, token_type_ids, pos, inputs_embeds)  # (B, T, H)
        pos = (lay.flat_index % T) if position_ids is None else position_ids.expand(B, T).reshape(-1)[lay.flat_index]
        keep = lay.flat_index
        return self.embeddings(None if input_ids is None else input_ids.reshape(-1)[keep],
                               token_type_ids.reshape(-1)[keep], pos,
                               None if inputs_embeds is None else inputs_embeds.reshape(B * T, -1)[keep])  # (N, H)

    def compile_layers(self, **compile_kwargs: Any) -> BertModel:
        """Compile each encoder layer in place with ``torch.compile`` (optional; needs a C++ compiler on CPU).
        Layers, not the whole model, so the layout bookkeeping stays eager; state-dict names are unchanged."""
        device = self.embeddings.position_ids.device.type
        require_compiler(device)
        require_inductor_cache(compiling=True)  # compiling is lazy: torch's error came at the first forward
        # On the CPU the unpadded token count changes every batch: dynamic from the start. On a GPU the rectangle
        # is kept (gpu_keeps_rectangle) and shapes repeat: static kernels, made dynamic if a shape changes.
        kwargs = {"dynamic": True if device == "cpu" else None, **compile_kwargs}
        if device == "cpu" and kwargs.get("backend", "inductor") == "inductor" and not (
                kwargs.get("mode") and kwargs.get("options")):  # both: torch.compile's own error
            # the SIMD width in Inductor's cache key (``compile_options``): with a cache shared by an AVX-512 and an
            # AVX2 machine, each compiled the other's kernels and crashed; a mode is given as its options
            from torch._inductor import list_mode_options

            mode = kwargs.pop("mode", None)
            kwargs["options"] = {**(list_mode_options(mode, kwargs["dynamic"]) if mode else {}), **compile_options(),
                                 **(kwargs.get("options") or {})}
        for layer in self.encoder.layer:
            layer.compile(**kwargs)
        return self


__all__ = ["BertModel", "BertModelOutput", "BertEncoder", "BertLayer", "BertAttention", "BertSelfAttention",
           "BertSelfOutput", "BertIntermediate", "BertOutput", "BertEmbeddings", "BertPooler",
           "init_bert_weights", "activation", "has_hooks", "plain_linear", "runs_as_f_linear", "global_module_hooks"]
