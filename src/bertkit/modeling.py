"""The BERT encoder: the whole forward pass in one file.

Implements the model of Devlin et al. 2018 ("BERT: Pre-training of Deep Bidirectional Transformers for
Language Understanding", section 3): the sum of token, segment and learned absolute position embeddings,
LayerNorm and dropout; L post-LayerNorm Transformer encoder layers (Vaswani et al. 2017) with GELU
feed-forward blocks; a pooler (dense + tanh) over the first token, [CLS].

Where this differs from the paper's text (not from its released code, which it follows):
- The query, key and value projections are one fused ``Linear(H, 3H)``: one GEMM instead of three. The
  checkpoint key table (``checkpoint_io.py``) splits and joins the published separate q/k/v weights, so
  checkpoints are unchanged.
- Padding is not computed on. By default the encoder drops padding tokens after the embeddings and runs
  every per-token layer on the real tokens only (``TokenLayout``); attention, the one operation that
  mixes tokens, goes through one function, ``self_attention``, which scatters q/k/v into a per-sequence
  rectangle for PyTorch's ``scaled_dot_product_attention``. The same mechanism packs several sequences
  into one row (Krell et al. 2021). ``layout="padded"`` computes on the padded rectangle as transformers
  does; at real positions both agree within float rounding.
- Initialisation is a truncated normal with std ``initializer_range`` (0.02), cut at two standard
  deviations, as google-research/bert's ``create_initializer`` does; the paper does not state it.

Shape legend: B batch, T sequence length, H hidden size, nh heads, hs head size (H / nh), I intermediate
size, L layers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from bertkit.checkpoint_io import PretrainedMixin
from bertkit.config import BertConfig
from bertkit.errors import BertkitError

# ---------------------------------------------------------------------------------------------------
# Attention: the one place that knows how sequences are laid out in memory.
# ---------------------------------------------------------------------------------------------------


@dataclass
class AttentionGroup:
    """Sequences whose attention runs as one (S_b, T_b) rectangle: ``slot`` (n_b,) places their tokens in it,
    ``tokens`` (n_b,) picks them from the stored (N, ...) tokens (None: all N, in order), ``key_mask``
    (S_b, 1, 1, T_b) is True at real keys (None: every sequence fills T_b)."""

    shape: tuple[int, int]
    slot: Tensor
    tokens: Tensor | None
    key_mask: Tensor | None


# Grouping sequences by length for attention: an extra group is formed only when it saves more than this many
# (query x key) positions, about what one more gather/scatter and SDPA call cost on a CPU core.
_GROUP_OVERHEAD = 4096
_SPLIT_DEPTH = 2  # binary splits: at most 2**2 = 4 groups


def _split_by_length(lengths: list[int]) -> list[list[int]]:
    """Sequence indices, split into <= 2**_SPLIT_DEPTH groups of similar length that minimise sum(S_b * T_b^2).

    Binary splits of the length-sorted order, each kept only if it saves more than _GROUP_OVERHEAD: a
    batch of SQuAD windows (100 to 384 tokens) gets ~4 groups and roughly halves attention work; a batch of
    similar lengths stays one rectangle.
    """
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    sorted_len = [lengths[i] for i in order]

    def split(a: int, b: int, depth: int) -> list[tuple[int, int]]:  # inclusive range of sorted positions
        best_k, best = None, (b - a + 1) * sorted_len[b] ** 2 - _GROUP_OVERHEAD
        if depth > 0:
            for k in range(a, b):
                cost = (k - a + 1) * sorted_len[k] ** 2 + (b - k) * sorted_len[b] ** 2
                if cost < best:
                    best_k, best = k, cost
        if best_k is None:
            return [(a, b)]
        return split(a, best_k, depth - 1) + split(best_k + 1, b, depth - 1)

    return [sorted(order[a:b + 1]) for a, b in split(0, len(order) - 1, _SPLIT_DEPTH)]


def _attention_groups(lengths: Tensor, starts: Tensor) -> tuple[AttentionGroup, ...]:
    """Groups for sequences stored contiguously: sequence i is tokens starts[i] .. starts[i] + lengths[i] - 1.

    The lengths come to the host once; every size below is taken from that list, so building the groups
    costs no further device synchronisation.
    """
    host_lengths = lengths.tolist()
    device = lengths.device
    groups = []
    for members in _split_by_length(host_lengths):
        member_lengths = [host_lengths[i] for i in members]
        S_b, T_b, n_b = len(members), max(member_lengths), sum(member_lengths)
        idx = torch.tensor(members, device=device)
        lens, first = lengths[idx], starts[idx]  # (S_b,)
        offsets = torch.cumsum(lens, 0) - lens
        intra = torch.arange(n_b, device=device) - torch.repeat_interleave(offsets, lens, output_size=n_b)
        slot = torch.repeat_interleave(torch.arange(S_b, device=device) * T_b, lens, output_size=n_b) + intra
        tokens = None if S_b == len(host_lengths) else torch.repeat_interleave(first, lens, output_size=n_b) + intra
        key_mask = None
        if min(member_lengths) != T_b:
            key_mask = (torch.arange(T_b, device=device)[None, :] < lens[:, None])[:, None, None, :]
        groups.append(AttentionGroup((S_b, T_b), slot, tokens, key_mask))
    return tuple(groups)


@dataclass
class TokenLayout:
    """Where the tokens of each sequence are, for the three ways bertkit stores a batch.

    - padded: hidden states are the caller's (B, T) rectangle; attention masks padded keys.
    - unpadded: only the N real tokens are kept, as (N, H); every per-token layer (projections, FFN,
      LayerNorm: ~97% of the FLOPs at T=128) skips padding entirely. Attention alone scatters q/k/v into
      rectangles, one per group of sequences of similar length (``AttentionGroup``), so it too computes
      little padding: at 384 tokens attention is a third of the work, and one batch-wide rectangle would
      spend most of it on padding.
    - packed: several sequences share one row (Krell et al. 2021); ``sequence_ids`` (B, T) numbers them
      1, 2, ... per row (0 = padding). Each becomes its own attention sequence, so attention never
      crosses sequences, and positions restart at 0 for each.

    ``flat_index`` (N,) are the real tokens' positions in the flattened (B*T) input (None: padded);
    ``key_mask`` (B, 1, 1, T) is the padded layout's mask (None: no padding); ``groups`` the attention
    groups of the other layouts; ``first_token`` (S,) indexes each sequence's first token ([CLS]) among the
    stored tokens.
    """

    batch_shape: tuple[int, int]
    key_mask: Tensor | None
    flat_index: Tensor | None = None
    groups: tuple[AttentionGroup, ...] = ()
    first_token: Tensor | None = None
    position_ids: Tensor | None = None  # (N,) for packed batches: positions restart per sequence

    @classmethod
    def padded(cls, attention_mask: Tensor | None, shape: tuple[int, int]) -> TokenLayout:
        if attention_mask is None or bool(attention_mask.all()):
            return cls(shape, None)  # no padding: SDPA takes its fastest, mask-free kernel
        return cls(shape, attention_mask.bool()[:, None, None, :])  # (B, 1, 1, T)

    @classmethod
    def unpadded(cls, attention_mask: Tensor) -> TokenLayout:
        """Right-padded rows (each row's real tokens first), as every BERT tokenizer produces."""
        B, T = attention_mask.shape
        mask = attention_mask.bool()
        flat_index = mask.reshape(-1).nonzero().squeeze(1)  # (N,)
        lengths = mask.sum(1)  # (B,)
        first = torch.cumsum(lengths, 0) - lengths  # (B,) offsets of each row's first real token
        return cls((B, T), None, flat_index, _attention_groups(lengths, first), first)

    @classmethod
    def packed(cls, sequence_ids: Tensor) -> TokenLayout:
        """Rows holding several sequences, numbered 1.. within each row (0 = padding, at the row's end)."""
        B, T = sequence_ids.shape
        flat_ids = sequence_ids.reshape(-1)
        flat_index = (flat_ids > 0).nonzero().squeeze(1)  # (N,)
        row = flat_index // T
        # Sequence number over the whole batch: rows are taken in order, sequences in order within a row.
        per_row = sequence_ids.max(1).values  # (B,)
        row_offset = torch.cumsum(per_row, 0) - per_row
        seq = row_offset[row] + flat_ids[flat_index] - 1  # (N,) global sequence number
        S = int(per_row.sum())
        lengths = torch.bincount(seq, minlength=S)  # (S,)
        starts = torch.cumsum(lengths, 0) - lengths  # (S,) first stored token of each sequence
        pos = torch.arange(flat_index.numel(), device=flat_index.device) - starts[seq]  # restarts at 0
        return cls((B, T), None, flat_index, _attention_groups(lengths, starts), starts, pos)

    @property
    def is_padded(self) -> bool:
        return self.flat_index is None

    def to_batch(self, x: Tensor) -> Tensor:
        """Stored tokens -> the caller's padded (B, T, D) shape (zeros at padding); identity when padded."""
        if self.is_padded:
            return x
        B, T = self.batch_shape
        return x.new_zeros(B * T, x.size(-1)).index_copy_(0, self.flat_index, x).view(B, T, -1)

    def select(self, x: Tensor, mask: Tensor) -> Tensor:
        """Rows of stored tokens ``x`` where the caller's (B, T) boolean ``mask`` is True, row-major order.

        ``mask`` must be False at padding (labels there are -100). No re-padding is needed.
        """
        if self.is_padded:
            return x.reshape(-1, x.size(-1))[mask.reshape(-1)]
        return x[mask.reshape(-1)[self.flat_index]]

    def first_tokens(self, x: Tensor) -> Tensor:
        """Each sequence's first token state (the [CLS] the pooler reads): (S, D)."""
        return x[:, 0] if self.is_padded else x.index_select(0, self.first_token)


@torch.compiler.disable
def self_attention(qkv: Tensor, layout: TokenLayout, num_heads: int, dropout_p: float) -> Tensor:
    """Multi-head scaled dot-product attention over the fused projections: qkv (..., 3H) -> (..., H).

    ``qkv`` is (B, T, 3H) for a padded layout and (N, 3H) otherwise; the result has the same leading shape.
    Never compiled (``compile_layers`` compiles the per-token work around it): the number of length groups,
    and whether each has a mask, change from batch to batch, and tracing them made torch.compile recompile
    until it gave up, slower than eager; SDPA is one fused kernel already.
    """
    if layout.is_padded:
        return _attend(qkv, layout.key_mask, num_heads, dropout_p)
    out = None
    for g in layout.groups:
        part = qkv if g.tokens is None else qkv.index_select(0, g.tokens)  # (n_b, 3H)
        S_b, T_b = g.shape
        rect = part.new_zeros(S_b * T_b, part.size(-1)).index_copy_(0, g.slot, part).view(S_b, T_b, -1)
        y = _attend(rect, g.key_mask, num_heads, dropout_p).reshape(S_b * T_b, -1).index_select(0, g.slot)
        if g.tokens is None:
            return y  # one group holding every sequence in order
        if out is None:
            out = y.new_empty(qkv.size(0), y.size(-1))
        out.index_copy_(0, g.tokens, y)
    return out


def _attend(rect: Tensor, key_mask: Tensor | None, num_heads: int, dropout_p: float) -> Tensor:
    """SDPA on one rectangle: (S, T, 3H) -> (S, T, H); ``key_mask`` (S, 1, 1, T) True at real keys."""
    S, T, three_h = rect.shape
    hs = three_h // (3 * num_heads)
    q, k, v = rect.view(S, T, 3, num_heads, hs).permute(2, 0, 3, 1, 4)  # 3 x (S, nh, T, hs)
    y = F.scaled_dot_product_attention(q, k, v, attn_mask=key_mask, dropout_p=dropout_p)  # (S, nh, T, hs)
    return y.transpose(1, 2).reshape(S, T, num_heads * hs)


# ---------------------------------------------------------------------------------------------------
# Layers
# ---------------------------------------------------------------------------------------------------


def activation(name: str):
    """The feed-forward non-linearity. The paper (section 3.1) uses GELU; Google's code the exact erf form."""
    if name == "gelu":
        return F.gelu
    if name in ("gelu_new", "gelu_pytorch_tanh"):
        return lambda x: F.gelu(x, approximate="tanh")
    if name == "relu":
        return F.relu
    raise BertkitError(f"unsupported hidden_act {name!r}")


class BertEmbeddings(nn.Module):
    """Token + segment + position embeddings, then LayerNorm and dropout (paper, section 3, Figure 2)."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.layer_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, input_ids: Tensor, token_type_ids: Tensor, position_ids: Tensor) -> Tensor:
        x = self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids)
        x = x + self.position_embeddings(position_ids)  # (B, T, H)
        return self.dropout(self.layer_norm(x))


class BertLayer(nn.Module):
    """One post-LayerNorm encoder layer: x = LN(x + Attn(x)); x = LN(x + FFN(x))."""

    def __init__(self, config: BertConfig):
        super().__init__()
        H, I = config.hidden_size, config.intermediate_size
        self.num_heads = config.num_attention_heads
        self.attn_dropout_p = config.attention_probs_dropout_prob
        self.qkv = nn.Linear(H, 3 * H)
        self.attn_out = nn.Linear(H, H)
        self.attn_norm = nn.LayerNorm(H, eps=config.layer_norm_eps)
        self.ffn_in = nn.Linear(H, I)
        self.ffn_out = nn.Linear(I, H)
        self.ffn_norm = nn.LayerNorm(H, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.act = activation(config.hidden_act)

    def forward(self, x: Tensor, layout: TokenLayout) -> Tensor:
        # x is (B, T, H) in the padded layout and (N, H) otherwise; every op but attention is per token.
        p = self.attn_dropout_p if self.training else 0.0
        a = self_attention(self.qkv(x), layout, self.num_heads, p)  # like x
        x = self.attn_norm(x + self.dropout(self.attn_out(a)))
        h = self.act(self.ffn_in(x))  # (..., I)
        return self.ffn_norm(x + self.dropout(self.ffn_out(h)))


class BertPooler(nn.Module):
    """Dense + tanh over the [CLS] state: the sentence representation NSP and classifiers read (section 3)."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, first_token: Tensor) -> Tensor:
        return torch.tanh(self.dense(first_token))  # (S, H)


def init_bert_weights(module: nn.Module, std: float) -> None:
    """Truncated normal(0, std) weights cut at 2 std, zero biases, unit LayerNorm (google-research/bert)."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.trunc_normal_(module.weight, mean=0.0, std=std, a=-2 * std, b=2 * std)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)


# ---------------------------------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------------------------------


def check_inputs(config: BertConfig, input_ids: Tensor, token_type_ids: Tensor | None,
                 attention_mask: Tensor | None, position_ids: Tensor | None) -> None:
    """Shapes and id ranges checked where inputs enter, so a mistake is a clear error, not wrong outputs
    (a (1, T) mask broadcast over a (B, T) batch) or torch's "index out of range in self". One min/max
    pass per tensor; skipped while tracing or compiling (export), where values are symbolic."""
    if input_ids.dim() != 2:
        raise BertkitError(f"input_ids must be (batch, seq_len), got shape {tuple(input_ids.shape)}")
    shape = tuple(input_ids.shape)
    for name, t in (("attention_mask", attention_mask), ("token_type_ids", token_type_ids)):
        if t is not None and tuple(t.shape) != shape:
            raise BertkitError(f"{name} has shape {tuple(t.shape)} but input_ids has {shape}; pass one value per "
                               "token (the tokenizer's output with padding=True gives matching shapes)")
    if position_ids is not None and (position_ids.dim() != 2 or position_ids.shape[1] != shape[1]
                                     or position_ids.shape[0] not in (1, shape[0])):
        raise BertkitError(f"position_ids has shape {tuple(position_ids.shape)}; expected {shape} or (1, {shape[1]})")
    if torch.jit.is_tracing() or torch.compiler.is_compiling() or input_ids.numel() == 0:
        return
    for name, t, limit, what in (("input_ids", input_ids, config.vocab_size, "vocab_size"),
                                 ("token_type_ids", token_type_ids, config.type_vocab_size, "type_vocab_size"),
                                 ("position_ids", position_ids, config.max_position_embeddings,
                                  "max_position_embeddings")):
        if t is None:
            continue
        lo, hi = (int(v) for v in torch.aminmax(t))
        if lo < 0 or hi >= limit:
            bad = lo if lo < 0 else hi
            raise BertkitError(f"{name} holds {bad}, outside [0, {limit - 1}] ({what} {limit} of this model); "
                               "was the input made with this model's tokenizer?")


@dataclass
class BertModelOutput:
    """Encoder outputs. ``tokens`` are the stored token states: (B, T, H) in the padded layout, (N, H)
    for the N real tokens otherwise; ``last_hidden_state`` always gives the caller's padded (B, T, H)."""

    tokens: Tensor
    pooler_output: Tensor | None  # (S, H): one per sequence (S = B unless packed); None without pooler
    layout: TokenLayout
    layer_tokens: tuple[Tensor, ...] | None = None  # with output_hidden_states: L + 1, embeddings first

    @property
    def last_hidden_state(self) -> Tensor:
        """(B, T, H). In the unpadded and packed layouts padding positions hold zeros."""
        return self.layout.to_batch(self.tokens)

    @property
    def hidden_states(self) -> tuple[Tensor, ...] | None:
        """L + 1 tensors (B, T, H), the embeddings' output first (the feature-based approach reads these)."""
        return None if self.layer_tokens is None else tuple(self.layout.to_batch(t) for t in self.layer_tokens)


LAYOUTS = ("auto", "padded", "unpadded")


class BertModel(PretrainedMixin, nn.Module):
    """The bidirectional Transformer encoder with its pooler."""

    checkpoint_head = "base"

    def __init__(self, config: BertConfig, add_pooling_layer: bool = True):
        super().__init__()
        self.config = config
        self.embeddings = BertEmbeddings(config)
        self.layers = nn.ModuleList(BertLayer(config) for _ in range(config.num_hidden_layers))
        self.pooler = BertPooler(config) if add_pooling_layer else None
        self.register_buffer("position_ids", torch.arange(config.max_position_embeddings), persistent=False)
        # The layout forward uses when the caller names none; set "padded" to compute as transformers does.
        self.layout = "auto"
        self.apply(lambda m: init_bert_weights(m, config.initializer_range))

    def forward(
        self,
        input_ids: Tensor,
        token_type_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
        position_ids: Tensor | None = None,
        output_hidden_states: bool = False,
        sequence_ids: Tensor | None = None,
        layout: str | None = None,
    ) -> BertModelOutput:
        """Encode a batch.

        ``layout="auto"`` drops padding before the first layer whenever the batch has any (right-padded
        rows), computing every per-token layer on real tokens only; outputs at real positions equal the
        padded computation's within float rounding. ``"padded"`` computes on the rectangle as
        transformers does. ``sequence_ids`` (B, T) instead of ``attention_mask`` marks packed rows:
        sequences numbered 1, 2, ... within each row, 0 for padding; positions restart per sequence and
        ``pooler_output`` has one row per sequence.
        """
        check_inputs(self.config, input_ids, token_type_ids, attention_mask, position_ids)
        layout = layout or self.layout
        if layout not in LAYOUTS:
            raise BertkitError(f"layout {layout!r} is not one of {LAYOUTS}")
        B, T = input_ids.shape
        if T > self.config.max_position_embeddings:
            raise BertkitError(
                f"sequence length {T} exceeds max_position_embeddings {self.config.max_position_embeddings} "
                f"of this model; truncate the input (e.g. tokenizer(..., truncation=True, "
                f"max_length={self.config.max_position_embeddings}))"
            )
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        if sequence_ids is not None:
            if attention_mask is not None:
                raise BertkitError("pass either attention_mask (one sequence per row) or sequence_ids (packed), not both")
            lay = TokenLayout.packed(sequence_ids)
        elif (layout == "padded" or attention_mask is None or bool(attention_mask.all())
              or not bool(attention_mask[:, 0].all())):
            # No padding to drop, or left-padded rows (first position is padding): keep the rectangle.
            lay = TokenLayout.padded(attention_mask, (B, T))
        else:
            lay = TokenLayout.unpadded(attention_mask)

        if lay.is_padded:
            pos = self.position_ids[:T].unsqueeze(0) if position_ids is None else position_ids  # (1 or B, T)
            x = self.embeddings(input_ids, token_type_ids, pos)  # (B, T, H)
        else:
            if lay.position_ids is not None:
                if position_ids is not None:
                    raise BertkitError("packed batches compute their own position_ids (restarting per sequence)")
                pos = lay.position_ids
            else:
                pos = (lay.flat_index % T) if position_ids is None else position_ids.reshape(-1)[lay.flat_index]
            x = self.embeddings(input_ids.reshape(-1)[lay.flat_index], token_type_ids.reshape(-1)[lay.flat_index],
                                pos)  # (N, H)
        states = [x] if output_hidden_states else None
        for layer in self.layers:
            x = layer(x, lay)
            if states is not None:
                states.append(x)
        pooled = self.pooler(lay.first_tokens(x)) if self.pooler is not None else None
        return BertModelOutput(x, pooled, lay, tuple(states) if states is not None else None)

    def compile_layers(self, **compile_kwargs: Any) -> BertModel:
        """Compile each encoder layer in place with ``torch.compile`` (optional; needs a C++ compiler on CPU).

        Layers, not the whole model: dropping padding gives data-dependent shapes (the token count N changes
        every batch), so each layer is compiled with ``dynamic=True`` and the layout bookkeeping stays eager.
        Weights and state_dict names are unchanged. Attention is left eager (see ``self_attention``).
        Measured on this project's 2-core CPU (``bench/bench_compile.py``, ``bench/bench_inference.py
        --compile``): +1-3% fp32 inference and 0.94x fine-tuning steps with two idle threads; +14% inference
        and +24% steps with one thread on busy cores; nothing under bf16. Off by default for that reason; the
        first batch pays ~5-30 s of compilation. Compiling the padded model whole was slower than eager on
        ragged text (it computes the padding), so bertkit does not offer it.
        """
        require_compiler(self.position_ids.device.type)
        kwargs = {"dynamic": True, **compile_kwargs}
        for layer in self.layers:
            layer.compile(**kwargs)
        return self

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())


def require_compiler(device_type: str = "cpu") -> None:
    """Fail before any work when ``torch.compile`` cannot build CPU kernels (they are C++, compiled at run time)."""
    import shutil

    if device_type == "cpu" and not any(shutil.which(c) for c in ("g++", "c++", "clang++")):
        raise BertkitError("torch.compile on CPU needs a C++ compiler and none of g++, c++, clang++ is on PATH; "
                           "install one (e.g. apt install g++) or run without --compile / compile_layers()")


def _expected_param_count(config: BertConfig) -> int:
    """Closed-form parameter count of BertModel (with pooler); used by tests against the paper's 110M/340M."""
    H, I, L = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    emb = (config.vocab_size + config.max_position_embeddings + config.type_vocab_size) * H + 2 * H
    layer = 3 * H * H + 3 * H + H * H + H + 2 * H + H * I + I + I * H + H + 2 * H
    return emb + L * layer + H * H + H


__all__ = ["BertModel", "BertModelOutput", "BertLayer", "BertEmbeddings", "BertPooler", "TokenLayout",
           "self_attention", "init_bert_weights", "activation"]
