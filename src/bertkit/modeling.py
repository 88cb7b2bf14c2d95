"""The BERT encoder: the whole forward pass in one file.

Implements the model of Devlin et al. 2018 ("BERT: Pre-training of Deep Bidirectional Transformers for
Language Understanding", section 3): the sum of token, segment and learned absolute position embeddings,
LayerNorm and dropout; L post-LayerNorm Transformer encoder layers (Vaswani et al. 2017) with GELU
feed-forward blocks; a pooler (dense + tanh) over the first token, [CLS].

Where this differs from the paper's text (not from its released code, which it follows):
- The query, key and value projections are one fused ``Linear(H, 3H)``: one GEMM instead of three. The
  checkpoint key table (``checkpoint_io.py``) splits and joins the published separate q/k/v weights, so
  checkpoints are unchanged.
- Attention goes through one function, ``self_attention``, which receives the fused projections and a
  *layout* describing where each sequence's tokens are. The padded layout below uses PyTorch's
  ``scaled_dot_product_attention`` with a key-padding mask; an unpadded (variable-length, packed) layout
  can be added there without touching the layers.
- Initialisation is a truncated normal with std ``initializer_range`` (0.02), cut at two standard
  deviations, as google-research/bert's ``create_initializer`` does; the paper does not state it.

Shape legend: B batch, T sequence length, H hidden size, nh heads, hs head size (H / nh), I intermediate
size, L layers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from bertkit.checkpoint_io import PretrainedMixin
from bertkit.config import BertConfig

# ---------------------------------------------------------------------------------------------------
# Attention: the one place that knows how sequences are laid out in memory.
# ---------------------------------------------------------------------------------------------------


@dataclass
class PaddedLayout:
    """Sequences stored as a (B, T) rectangle; ``key_mask`` (B, 1, 1, T) is True where a key is real."""

    key_mask: Tensor | None

    @classmethod
    def from_attention_mask(cls, attention_mask: Tensor | None) -> PaddedLayout:
        if attention_mask is None or bool(attention_mask.all()):
            return cls(None)  # no padding: let SDPA take its fastest, mask-free kernel
        return cls(attention_mask.bool()[:, None, None, :])  # (B, 1, 1, T)


def self_attention(qkv: Tensor, layout: PaddedLayout, num_heads: int, dropout_p: float) -> Tensor:
    """Multi-head scaled dot-product attention over the fused projections ``qkv`` (B, T, 3H) -> (B, T, H)."""
    B, T, three_h = qkv.shape
    hs = three_h // (3 * num_heads)
    q, k, v = qkv.view(B, T, 3, num_heads, hs).permute(2, 0, 3, 1, 4)  # 3 x (B, nh, T, hs)
    y = F.scaled_dot_product_attention(q, k, v, attn_mask=layout.key_mask, dropout_p=dropout_p)  # (B, nh, T, hs)
    return y.transpose(1, 2).reshape(B, T, num_heads * hs)  # (B, T, H)


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
    raise ValueError(f"unsupported hidden_act {name!r}")


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

    def forward(self, x: Tensor, layout: PaddedLayout) -> Tensor:
        p = self.attn_dropout_p if self.training else 0.0
        a = self_attention(self.qkv(x), layout, self.num_heads, p)  # (B, T, H)
        x = self.attn_norm(x + self.dropout(self.attn_out(a)))
        h = self.act(self.ffn_in(x))  # (B, T, I)
        return self.ffn_norm(x + self.dropout(self.ffn_out(h)))


class BertPooler(nn.Module):
    """Dense + tanh over the [CLS] state: the sentence representation NSP and classifiers read (section 3)."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, hidden: Tensor) -> Tensor:
        return torch.tanh(self.dense(hidden[:, 0]))  # (B, H)


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


@dataclass
class BertModelOutput:
    last_hidden_state: Tensor  # (B, T, H)
    pooler_output: Tensor | None  # (B, H); None when built with add_pooling_layer=False
    # With output_hidden_states: L + 1 tensors (B, T, H), the embeddings' output first.
    hidden_states: tuple[Tensor, ...] | None = None


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
        self.apply(lambda m: init_bert_weights(m, config.initializer_range))

    def forward(
        self,
        input_ids: Tensor,
        token_type_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
        position_ids: Tensor | None = None,
        output_hidden_states: bool = False,
    ) -> BertModelOutput:
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must be (batch, seq_len), got shape {tuple(input_ids.shape)}")
        B, T = input_ids.shape
        if T > self.config.max_position_embeddings:
            raise ValueError(
                f"sequence length {T} exceeds max_position_embeddings {self.config.max_position_embeddings} "
                f"of this model; truncate the input (e.g. tokenizer(..., truncation=True, "
                f"max_length={self.config.max_position_embeddings}))"
            )
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        if position_ids is None:
            position_ids = self.position_ids[:T].unsqueeze(0)  # (1, T), broadcast over the batch
        layout = PaddedLayout.from_attention_mask(attention_mask)

        x = self.embeddings(input_ids, token_type_ids, position_ids)  # (B, T, H)
        states = [x] if output_hidden_states else None
        for layer in self.layers:
            x = layer(x, layout)
            if states is not None:
                states.append(x)
        pooled = self.pooler(x) if self.pooler is not None else None
        return BertModelOutput(x, pooled, tuple(states) if states is not None else None)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())


def _expected_param_count(config: BertConfig) -> int:
    """Closed-form parameter count of BertModel (with pooler); used by tests against the paper's 110M/340M."""
    H, I, L = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    emb = (config.vocab_size + config.max_position_embeddings + config.type_vocab_size) * H + 2 * H
    layer = 3 * H * H + 3 * H + H * H + H + 2 * H + H * I + I + I * H + H + 2 * H
    return emb + L * layer + H * H + H


__all__ = ["BertModel", "BertModelOutput", "BertLayer", "BertEmbeddings", "BertPooler", "PaddedLayout",
           "self_attention", "init_bert_weights", "activation"]
