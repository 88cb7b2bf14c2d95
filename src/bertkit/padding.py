"""Variable-length layouts: how the sequences of a batch lie in memory, kept apart from the forward pass (as
MosaicBERT keeps ``bert_padding.py`` beside its layers).

``modeling.py`` computes every per-token layer on whatever ``TokenLayout`` says are the real tokens: the padded
(B, T) rectangle (as transformers does), or the N real tokens of a right-padded batch. Attention, the one operation
that mixes tokens, goes through ``self_attention``, which gathers q/k/v into per-sequence rectangles for PyTorch's
``scaled_dot_product_attention``, splitting sequences of very different lengths into a few groups of similar
length (``AttentionPlan``), so long ragged batches (SQuAD windows) spend little attention work on padding either.

Two roundings change no output and are off (1) unless ``bertkit.inference.prepare`` sets them for CPU inference
(``BertModel.key_multiple``, ``token_multiple``): attention's keys padded with masked keys up to a multiple, and
the unpadded layout's N rounded up with rows in no sequence (``TokenLayout.pack`` / ``unpack``).

``pad_batch`` builds the padded batches: every collate, the pipelines, feature extraction and the tokenizer's
``pad`` call it, so there is one rule for pad values and widths.

Shape legend: B batch, T sequence length, N real tokens, H hidden size, nh heads, hs head size.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor
from torch._functorch.pyfunctorch import retrieve_all_functorch_interpreters

from bertkit.errors import BertkitError

# ---------------------------------------------------------------------------------------------------
# Attention: the one place that knows how sequences are laid out in memory.
# ---------------------------------------------------------------------------------------------------


@dataclass
class AttentionGroup:
    """Sequences whose attention runs as one rectangle: S_b sequences of at most T_b tokens as queries, over
    ``kv_length`` keys (T_b rounded up, ``key_multiple``). Its keys are rows ``rect_offset`` .. ``rect_offset +
    S_b * kv_length`` of the plan's key buffer; its S_b * T_b outputs follow the previous group's in the output
    buffer. ``key_mask`` (S_b, 1, 1, kv_length) is True at real keys (None: every sequence fills the rectangle)."""

    shape: tuple[int, int]
    kv_length: int
    key_mask: Tensor | None
    rect_offset: int


@dataclass
class AttentionPlan:
    """How the unpadded layout's attention runs: every group's rectangle lies in one key buffer and every group's
    output in one output buffer, so a layer moves its tokens in with one gather (``rect_index`` (rect_rows,): the
    stored token each rectangle row holds) and back with another (``gather`` (N,): each token's row in the output
    buffer), whatever the number of groups; only the attention kernel runs per group. A rectangle's rows past a
    sequence's end repeat its last token: finite keys that its mask hides, and never a buffer to zero first."""

    groups: tuple[AttentionGroup, ...]
    rect_index: Tensor
    gather: Tensor
    rect_rows: int
    out_rows: int


# Grouping sequences by length for attention: an extra group is formed only when it saves more than this many
# (query x key) positions, about what one more SDPA call and its copies cost on a CPU core.
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


def _attention_plan(lengths: Tensor, starts: Tensor, kv_multiple: int = 1) -> AttentionPlan:
    """The plan for sequences stored contiguously: sequence i is tokens starts[i] .. starts[i] + lengths[i] - 1.
    Each group's keys are rounded up to a multiple of ``kv_multiple``.

    The lengths come to the host once; every size below is taken from that list, so building the plan costs no
    further device synchronisation.
    """
    host_lengths = lengths.tolist()
    device = lengths.device
    n = sum(host_lengths)
    rect_index, gather = [], torch.empty(n, dtype=torch.long, device=device)
    groups, rect_rows, out_rows = [], 0, 0
    for members in _split_by_length(host_lengths):
        member_lengths = [host_lengths[i] for i in members]
        S_b, T_b, n_b = len(members), max(member_lengths), sum(member_lengths)
        T_kv = round_up_tokens(T_b, kv_multiple)
        idx = torch.tensor(members, device=device)
        lens, first = lengths[idx], starts[idx]  # (S_b,)
        positions = torch.arange(T_kv, device=device)
        rect_index.append((first[:, None] + torch.minimum(positions, lens[:, None] - 1)).reshape(-1))  # (S_b * T_kv,)
        offsets = torch.cumsum(lens, 0) - lens
        intra = torch.arange(n_b, device=device) - torch.repeat_interleave(offsets, lens, output_size=n_b)
        rows = torch.arange(S_b, device=device)
        tokens = torch.repeat_interleave(first, lens, output_size=n_b) + intra  # (n_b,) among the stored tokens
        gather[tokens] = torch.repeat_interleave(rows * T_b + out_rows, lens, output_size=n_b) + intra
        key_mask = None
        if min(member_lengths) != T_kv:
            key_mask = (positions[None, :] < lens[:, None])[:, None, None, :]
        groups.append(AttentionGroup((S_b, T_b), T_kv, key_mask, rect_rows))
        rect_rows, out_rows = rect_rows + S_b * T_kv, out_rows + S_b * T_b
    return AttentionPlan(tuple(groups), torch.cat(rect_index), gather, rect_rows, out_rows)


def round_up_tokens(n: int, multiple: int) -> int:
    """``n`` real tokens rounded up to a multiple of ``multiple`` (1: unchanged): the rows the layers compute on."""
    if n < 1 or multiple < 1:
        raise ValueError(f"round_up_tokens needs n >= 1 and multiple >= 1, got n={n}, multiple={multiple} "
                         "(an empty batch never reaches the unpadded layout: the model refuses empty sequences)")
    return -(-n // multiple) * multiple


def is_tracing() -> bool:
    """Inside torch.jit.trace, torch.export, torch.compile or torch.func.vmap, where a tensor's values are not known
    (vmap's batched tensors have no storage to read): the model then takes the padded layout (static shapes) and
    skips checks that read values."""
    return (torch.jit.is_tracing() or torch.compiler.is_compiling() or torch.compiler.is_exporting()
            or under_vmap())


def under_vmap() -> bool:
    """Inside ``torch.func.vmap`` (per-example gradients: ``vmap(grad(f))``), at any depth of functorch's transforms.
    ``torch.func.grad`` alone reads values as eager code does, and keeps the unpadded layout. Asked last in
    ``is_tracing``: never while compiling, exporting or tracing."""
    return any(i.key().name == "Vmap" for i in retrieve_all_functorch_interpreters())  # [] outside any transform


@dataclass
class TokenLayout:
    """Where the tokens of each sequence are: the padded (B, T) rectangle, whose attention masks padded keys, or
    only the N real tokens as (N, H), so every per-token layer (~97% of the FLOPs at T=128) skips padding and
    attention gathers them into a rectangle per group of similar length.

    ``flat_index`` (N,) are the real tokens' positions in the flattened (B*T) input (None: padded); ``key_mask``
    (B, 1, 1, T) is the padded layout's mask (None: no padding); ``attention`` the unpadded layout's plan;
    ``first_token`` (B,) indexes each sequence's [CLS] among the stored tokens; ``extra_rows`` the rows that round N
    up (``pack``), which attend to nothing, nothing attends to, and ``unpack`` drops. ``zero_padding``: a padded
    layout whose ``to_batch`` gives zeros at padding, as the unpadded one does (where "auto" keeps the rectangle on
    a GPU). ``key_multiple``: the padded layout's keys are rounded up to a multiple of it. ``cu_seqlens``: an
    unpadded layout whose attention is PyTorch's variable-length kernel (``varlen``) instead of a plan.
    """

    batch_shape: tuple[int, int]
    key_mask: Tensor | None
    flat_index: Tensor | None = None
    attention: AttentionPlan | None = None
    first_token: Tensor | None = None
    extra_rows: int = 0
    zero_padding: bool = False
    key_multiple: int = 1
    cu_seqlens: Tensor | None = None  # (B + 1,) int32: where each sequence starts among the stored tokens
    attn_bias: Tensor | None = None  # (B, 1, 1, T): key_mask as SDPA's additive bias (0 / min), made once a pass
    traced: bool = False  # made inside a whole-model torch.compile / torch.export / jit.trace: attention traced too

    @classmethod
    def padded(cls, attention_mask: Tensor | None, shape: tuple[int, int], zero_padding: bool = False,
               key_multiple: int = 1) -> TokenLayout:
        traced = is_tracing()
        if attention_mask is None or (not traced and bool(attention_mask.all())):
            return cls(shape, None, key_multiple=key_multiple, traced=traced)  # no padding: SDPA's mask-free kernel
        return cls(shape, attention_mask.bool()[:, None, None, :], zero_padding=zero_padding,
                   key_multiple=key_multiple, traced=traced)  # mask (B, 1, 1, T)

    @classmethod
    def unpadded(cls, attention_mask: Tensor, token_multiple: int = 1, key_multiple: int = 1) -> TokenLayout:
        """Right-padded rows (each row's real tokens first), as every BERT tokenizer produces. The layers
        compute on N rounded up to a multiple of ``token_multiple``; each attention group's keys are rounded up to
        a multiple of ``key_multiple``."""
        B, T = attention_mask.shape
        mask = attention_mask.bool()
        flat_index = mask.reshape(-1).nonzero().squeeze(1)  # (N,)
        lengths = mask.sum(1)  # (B,)
        first = torch.cumsum(lengths, 0) - lengths  # (B,) offsets of each row's first real token
        n = flat_index.numel()
        plan = _attention_plan(lengths, first, key_multiple)
        return cls((B, T), None, flat_index, plan, first, round_up_tokens(n, token_multiple) - n)

    @classmethod
    def varlen(cls, attention_mask: Tensor) -> TokenLayout:
        """Right-padded rows for a GPU's variable-length attention: the sequences' boundaries stay on the device
        (``cu_seqlens``); the only value read back to the host is the token count N, which sizes every layer."""
        B, T = attention_mask.shape
        mask = attention_mask.bool()
        flat_index = mask.reshape(-1).nonzero().squeeze(1)  # (N,)
        cu = F.pad(torch.cumsum(mask.sum(1, dtype=torch.int32), 0, dtype=torch.int32), (1, 0))  # (B + 1,)
        return cls((B, T), None, flat_index, None, cu[:-1].long(), cu_seqlens=cu)

    @property
    def is_padded(self) -> bool:
        return self.flat_index is None

    def to(self, device: torch.device) -> TokenLayout:
        """This layout with its tensors on ``device`` (``token_layout`` makes it where the mask is)."""
        plan = self.attention
        if plan is not None:
            groups = tuple(replace(g, key_mask=moved(g.key_mask, device)) for g in plan.groups)
            plan = replace(plan, groups=groups, rect_index=moved(plan.rect_index, device),
                           gather=moved(plan.gather, device))
        return replace(self, key_mask=moved(self.key_mask, device), flat_index=moved(self.flat_index, device),
                       attention=plan, first_token=moved(self.first_token, device),
                       cu_seqlens=moved(self.cu_seqlens, device), attn_bias=moved(self.attn_bias, device))

    def pack(self, x: Tensor) -> Tensor:
        """The N real tokens' states (N, D) -> the rows the layers compute on (N + extra_rows, D): zero rows
        appended to round N up. Identity when there are none."""
        if not self.extra_rows:
            return x
        return torch.cat([x, x.new_zeros(self.extra_rows, x.size(-1))])  # (N + extra_rows, D)

    def unpack(self, x: Tensor) -> Tensor:
        """Rows the layers computed on -> the N real tokens' states (a view): what ``pack`` added is dropped."""
        return x[: x.size(0) - self.extra_rows] if self.extra_rows else x  # (N, D)

    def to_batch(self, x: Tensor) -> Tensor:
        """Stored tokens -> the caller's padded (B, T, D) shape (zeros at padding); identity when padded, except
        with ``zero_padding``."""
        if self.is_padded:
            if self.zero_padding and self.key_mask is not None:
                return x.masked_fill(~self.key_mask.view(*self.batch_shape, 1), 0)
            return x
        B, T = self.batch_shape
        return x.new_zeros(B * T, x.size(-1)).index_copy_(0, self.flat_index, x).view(B, T, -1)

    def select(self, x: Tensor, mask: Tensor) -> Tensor:
        """Rows of stored tokens ``x`` where the caller's (B, T) boolean ``mask`` is True, row-major order.

        ``mask`` must be False at padding (labels there are -100). No re-padding is needed. In the padded layout the
        positions are found where ``mask`` is: a mask still on the host (a GPU model's batch from the host) makes the
        host wait for nothing, where one on the GPU waits for the kernels queued before it.
        """
        if self.is_padded:
            index = mask.reshape(-1).nonzero().squeeze(1)
            return x.reshape(-1, x.size(-1)).index_select(0, moved(index, x.device))
        return x[moved(mask, x.device).reshape(-1)[self.flat_index]]

    def first_tokens(self, x: Tensor) -> Tensor:
        """Each sequence's first token state (the [CLS] the pooler reads): (B, D)."""
        return x[:, 0] if self.is_padded else x.index_select(0, self.first_token)


torch.utils._pytree.register_dataclass(TokenLayout)  # part of BertModelOutput under torch.export


def token_layout(layout: str, attention_mask: Tensor | None, B: int, T: int, dtype: torch.dtype, device: torch.device,
                 key_multiple: int = 1, token_multiple: int = 1, attention_dropout: float = 0.0,
                 keep_rectangle: Callable[[], bool] = lambda: False) -> TokenLayout:
    """Which tokens ``BertModel`` computes on ``device`` (``layout``: "auto", "padded" or "unpadded"): the (B, T)
    rectangle, or with ``layout`` not "padded" and right-padded rows, the real tokens only (padding dropped before
    the first layer). On a GPU ``"auto"`` drops padding only where that pays there (``gpu_keeps_rectangle``). The
    two multiples round attention's keys and the unpadded layout's rows up (1: not rounded; see the module's
    header). On a GPU in half precision without ``attention_dropout`` (inference), padding is dropped and attention
    runs as the variable-length kernel (``varlen_attention``). ``keep_rectangle()`` true: ``"auto"`` computes on the
    rectangle, zeros at padding in the outputs as when padding is dropped (hooks are watching the layers); asked
    only where padding would be dropped.

    The layout is worked out where the mask is. A mask still on the host (bertkit's batch runners leave it there)
    gives it without a read-back from the device, which on a GPU waits for every queued kernel (1.3x the fp32
    predict rows' wall time, H100); its tensors then go to ``device`` without waiting (``moved``)."""
    if layout == "auto" and attention_dropout > 0 and attention_mask is not None \
            and gpu_keeps_rectangle(device, dtype, T):
        # Training on a GPU keeps the rectangle however the rows are padded: nothing is read back to the host
        # (which would stall the queue of kernels at every forward pass); an unpadded batch gets an all-True mask.
        key_mask = moved(attention_mask, device).bool()[:, None, None, :]
        return TokenLayout((B, T), key_mask, zero_padding=True, key_multiple=key_multiple,
                           attn_bias=additive_bias(key_mask, dtype))
    lay = _token_layout(layout, attention_mask, B, T, dtype, device, key_multiple, token_multiple, attention_dropout,
                        keep_rectangle)
    return lay if attention_mask is None or attention_mask.device == device else lay.to(device)


def _token_layout(layout: str, attention_mask: Tensor | None, B: int, T: int, dtype: torch.dtype,
                  device: torch.device, key_multiple: int, token_multiple: int, attention_dropout: float,
                  keep_rectangle: Callable[[], bool]) -> TokenLayout:
    if layout == "padded" or attention_mask is None:
        return TokenLayout.padded(attention_mask, (B, T), key_multiple=key_multiple)
    full, right_padded = torch.stack((attention_mask.all(), attention_mask[:, 0].all())).tolist()  # one read back
    if full or not right_padded:
        # No padding to drop, or left-padded rows (first position is padding): keep the rectangle.
        return TokenLayout.padded(None if full else attention_mask, (B, T), key_multiple=key_multiple)
    if layout == "auto" and keep_rectangle():
        return TokenLayout.padded(attention_mask, (B, T), zero_padding=True, key_multiple=key_multiple)
    if attention_dropout == 0 and varlen_attention(device, dtype):
        return TokenLayout.varlen(attention_mask)
    if layout == "auto" and gpu_keeps_rectangle(device, dtype, T):
        return TokenLayout.padded(attention_mask, (B, T), zero_padding=True)  # zeros at padding, as "auto" gives
    return TokenLayout.unpadded(attention_mask, token_multiple, key_multiple)


def moved(t: Tensor | None, device: torch.device) -> Tensor | None:
    """``t`` on ``device``; to a GPU from pinned memory without waiting (a copy from pageable memory first waits
    for every kernel already queued)."""
    if t is None or t.device == device:
        return t
    if device.type == "cuda" and t.device.type == "cpu":
        return (t if t.is_pinned() else t.pin_memory()).to(device, non_blocking=True)
    return t.to(device)


def additive_bias(key_mask: Tensor, dtype: torch.dtype) -> Tensor:
    """``key_mask`` (B, 1, 1, T) as the additive bias SDPA's GPU kernels take: 0 at real keys, the dtype's minimum
    at padding, in the dtype attention computes in (autocast's, else ``dtype``), its rows 16-element aligned.
    Handed a boolean mask, SDPA converts it to this in every layer, and pads it to alignment there too (a few
    kernels per layer, for a step that is launch-bound on the GPU); made once per forward pass instead."""
    B, _, _, T = key_mask.shape
    dt = torch.get_autocast_dtype("cuda") if torch.is_autocast_enabled("cuda") else dtype
    bias = torch.full((B, 1, 1, -(-T // 16) * 16), torch.finfo(dt).min, dtype=dt, device=key_mask.device)
    return bias[..., :T].masked_fill_(key_mask, 0)  # a view into aligned rows


def varlen_attention(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether attention over dropped padding runs as PyTorch's variable-length (flash) kernel: on a CUDA GPU of
    compute capability 8.0 or more, in half precision (bf16/fp16 weights or autocast), with a PyTorch that has
    ``torch.nn.attention.varlen``. It takes no dropout, so training with attention dropout keeps the rectangle.
    The sequences' boundaries stay on the device: the plan of length groups (``AttentionPlan``) reads the lengths
    back to the host, which on a GPU stalls the queue of kernels."""
    if device.type != "cuda" or not (dtype in (torch.float16, torch.bfloat16) or torch.is_autocast_enabled("cuda")):
        return False
    try:
        from torch.nn.attention.varlen import varlen_attn  # noqa: F401  (PyTorch >= 2.10)
    except ImportError:
        return False
    return torch.cuda.get_device_capability(device) >= (8, 0)


# On a GPU, padding is dropped in exact fp32 from this many positions per sequence (the batch's T) up.
GPU_UNPAD_MIN_LENGTH = 256


def gpu_keeps_rectangle(device: torch.device, dtype: torch.dtype, T: int) -> bool:
    """On a CUDA device, whether ``"auto"`` computes on the padded rectangle (as transformers does): whenever the
    products run in reduced precision (TF32, fp16/bf16), and in exact fp32 below ``GPU_UNPAD_MIN_LENGTH``. Dropping
    padding reads the lengths back to the host (``AttentionPlan``), which stalls the GPU's queue of kernels; it paid
    only on long fp32 batches (1.6-1.7x on SQuAD windows, H100, BENCHMARKS.md "On a GPU")."""
    if device.type != "cuda":
        return False
    return (dtype in (torch.float16, torch.bfloat16) or torch.is_autocast_enabled("cuda")
            or torch.backends.cuda.matmul.allow_tf32 or T < GPU_UNPAD_MIN_LENGTH)


def self_attention(qkv: Tensor, layout: TokenLayout, num_heads: int, dropout_p: float) -> Tensor:
    """Multi-head scaled dot-product attention over the fused projections: qkv (..., 3H) -> (..., H).

    ``qkv`` is (B, T, 3H) for a padded layout and (N + extra_rows, 3H) otherwise; the result has the same
    leading shape, zero at the rounding rows (they are in no group: they attend to nothing and nothing to them).
    On a GPU the padded layout's attention is one SDPA call that ``compile_layers`` compiles with the rest of the
    layer (no graph break: where bf16 keeps the rectangle, the whole layer is one compiled graph, 1.13x the
    pre-training step with the break). A whole model traced (``torch.compile(model)``, ``torch.export``) computes
    the padded layout and traces its attention with the rest, in one graph as transformers' model
    (``fullgraph=True`` works). Elsewhere attention stays eager (``_attend_groups``).
    """
    if layout.is_padded and (qkv.is_cuda or layout.traced):
        mask = layout.key_mask if layout.attn_bias is None else layout.attn_bias
        return _attend_padded(qkv, mask, num_heads, dropout_p, layout.key_multiple)
    if layout.cu_seqlens is not None:
        return _attend_varlen(qkv, layout, num_heads, dropout_p)
    if torch.compiler.is_compiling() or torch.compiler.is_exporting():
        return _uncompiled_attention()(qkv, layout, num_heads, dropout_p)
    return _attend_groups(qkv, layout, num_heads, dropout_p)


def _uncompiled_attention() -> Any:
    """``_attend_groups`` behind ``torch.compiler.disable``, made where torch.compile or torch.export first traces
    attention: the decorator imports torch._dynamo (1.2 s, more than torch itself), which an eager process (every
    command, the pipelines, training) never needs."""
    if not _UNCOMPILED:
        _UNCOMPILED.append(torch.compiler.disable(_attend_groups))
    return _UNCOMPILED[0]


_UNCOMPILED: list[Any] = []


def _attend_varlen(qkv: Tensor, layout: TokenLayout, num_heads: int, dropout_p: float) -> Tensor:
    """(N, 3H) -> (N, H) with PyTorch's variable-length flash kernel over ``cu_seqlens``; the longest sequence
    is bounded by the caller's T, a host number, so nothing is read back."""
    from torch.nn.attention.varlen import varlen_attn

    if dropout_p:
        raise BertkitError("variable-length attention takes no dropout: a layout made for inference "
                           "(TokenLayout.varlen) was used in training; build the layout with attention_dropout")
    N, three_h = qkv.shape
    q, k, v = qkv.view(N, 3, num_heads, three_h // (3 * num_heads)).unbind(1)  # 3 x (N, nh, hs)
    T = layout.batch_shape[1]
    return varlen_attn(q, k, v, layout.cu_seqlens, layout.cu_seqlens, T, T).reshape(N, three_h // 3)


def _attend_groups(qkv: Tensor, layout: TokenLayout, num_heads: int, dropout_p: float) -> Tensor:
    """Attention never compiled (``compile_layers`` compiles the per-token work around it). The unpadded layout's
    groups: their number, and whether each has a mask, change from batch to batch, and tracing them made
    torch.compile recompile until it gave up, slower than eager; SDPA is one fused kernel already. On the CPU the
    padded layout's SDPA too: compiled inside the layers, a later whole-model ``torch.compile`` in the same
    process aborted in PyTorch 2.13's CPU attention."""
    if layout.is_padded:
        return _attend_padded(qkv, layout.key_mask, num_heads, dropout_p, layout.key_multiple)
    plan = layout.attention
    keys = layout.unpack(qkv).index_select(0, plan.rect_index)  # (rect_rows, 3H): every group's rectangle
    outs = []
    for g in plan.groups:
        S_b, T_b = g.shape
        rect = keys[g.rect_offset:g.rect_offset + S_b * g.kv_length].view(S_b, g.kv_length, -1)
        y = _sdpa(rect, g.key_mask, num_heads, dropout_p, T_b)  # (S_b, nh, T_b, hs)
        outs.append(y.transpose(1, 2).reshape(S_b * T_b, -1))  # a view: the CPU kernel writes (S_b, T_b, nh, hs)
    out = outs[0] if len(outs) == 1 else torch.cat(outs)  # (out_rows, H)
    return layout.pack(out.index_select(0, plan.gather))  # (N, H), in the stored order


def _attend_padded(qkv: Tensor, key_mask: Tensor | None, num_heads: int, dropout_p: float,
                   key_multiple: int) -> Tensor:
    """The padded layout's attention, (B, T, 3H) -> (B, T, H): its keys too rounded up to ``key_multiple``, except
    when traced (an exported graph keeps the caller's shapes)."""
    B, T, three_h = qkv.shape
    T_kv = T if is_tracing() else round_up_tokens(T, key_multiple)
    rect = qkv
    if T_kv != T:
        rect = qkv.new_zeros(B, T_kv, three_h)
        rect[:, :T] = qkv
        key_mask = (torch.arange(T_kv, device=qkv.device) < T).view(1, 1, 1, T_kv) if key_mask is None \
            else F.pad(key_mask, (0, T_kv - T), value=False)  # (B or 1, 1, 1, T_kv): the added keys masked
    y = _sdpa(rect, key_mask, num_heads, dropout_p, T)  # (B, nh, T, hs)
    return y.transpose(1, 2).reshape(B, T, three_h // 3)


def _sdpa(rect: Tensor, key_mask: Tensor | None, num_heads: int, dropout_p: float, q_len: int) -> Tensor:
    """SDPA on one rectangle of keys, the first ``q_len`` of which are also the queries: (S, T_kv, 3H) ->
    (S, nh, q_len, hs); ``key_mask`` (S, 1, 1, T_kv) True at real keys."""
    S, T_kv, three_h = rect.shape
    hs = three_h // (3 * num_heads)
    q, k, v = rect.view(S, T_kv, 3, num_heads, hs).permute(2, 0, 3, 1, 4)  # 3 x (S, nh, T_kv, hs)
    q = q[:, :, :q_len]  # (S, nh, q_len, hs): the rows past q_len are keys only
    return F.scaled_dot_product_attention(q, k, v, attn_mask=key_mask, dropout_p=dropout_p)


# ---------------------------------------------------------------------------------------------------
# Padding a batch: the one function every collate, pipeline, feature extractor and the tokenizer pad with.
# ---------------------------------------------------------------------------------------------------


def pad_batch(rows: Sequence[Mapping[str, Any]], pad_values: Mapping[str, Any], *, width: int | None = None,
              side: Literal["right", "left"] = "right", attention_mask: bool = False,
              return_tensors: Literal["pt", "np"] | None = "pt") -> dict[str, Any]:
    """Pad the ``pad_values`` keys of ``rows`` to one length, filling with each key's pad value.

    A row's value for a key is one sequence of tokens, or (a multiple-choice row) a list of C sequences,
    which gives (B, C, W) instead of (B, W). A pad value that is a tuple (``offset_mapping``'s ``(0, 0)``)
    is the shape of one token. ``width`` defaults to the longest sequence of the batch. ``attention_mask``
    adds that key: 1 over each ``input_ids`` sequence, 0 at padding. Keys of ``pad_values`` that ``rows[0]``
    lacks are skipped.

    ``return_tensors``: "pt" (``torch.long``) or "np" (``int64``) stacks the batch; None returns a list of
    padded lists per key, where a row longer than ``width`` stays as it is (the tokenizer's ``pad`` does so).
    """
    if side not in ("right", "left"):
        raise ValueError(f"side must be 'right' or 'left', got {side!r}")
    fills = {k: v for k, v in pad_values.items() if k in rows[0]}
    columns = {k: [r[k] for r in rows] for k in fills}
    if attention_mask:
        fills["attention_mask"] = 0
        columns["attention_mask"] = [_ones_like(r["input_ids"]) for r in rows]
    if return_tensors is None:
        return {k: [_pad_list(v, fills[k], width or 0, side) for v in values] for k, values in columns.items()}
    if width is None:
        width = max((_longest(v, fills[k]) for k, values in columns.items() for v in values), default=0)
    out = {k: _pad_array(values, fills[k], width, side) for k, values in columns.items()}
    return {k: torch.from_numpy(v) for k, v in out.items()} if return_tensors == "pt" else out


def _is_choices(value: Any, fill: Any) -> bool:
    """A row value holding several sequences (C, T) rather than one (T,), for a scalar pad value."""
    return np.ndim(fill) == 0 and len(value) > 0 and isinstance(value[0], (list, np.ndarray))


def _ones_like(value: Any) -> Any:
    return [[1] * len(s) for s in value] if _is_choices(value, 0) else [1] * len(value)


def _longest(value: Any, fill: Any) -> int:
    return max((len(s) for s in value), default=0) if _is_choices(value, fill) else len(value)


def _pad_list(value: Any, fill: Any, width: int, side: str) -> list:
    pad = [fill] * (width - len(value))
    return pad + list(value) if side == "left" else list(value) + pad


def _pad_array(values: Sequence[Any], fill: Any, width: int, side: str) -> np.ndarray:
    """(B, W, *fill's shape), or (B, C, W) for rows of C sequences each; int64."""
    choices = _is_choices(values[0], fill) if values else False
    lead = (len(values[0]),) if choices else ()
    out = np.full((len(values), *lead, width, *np.shape(fill)), fill, dtype=np.int64)
    for b, value in enumerate(values):
        for c, seq in enumerate(value if choices else [value]):
            at = (b, c) if choices else (b,)
            n = len(seq)
            if n:
                out[at][slice(width - n, width) if side == "left" else slice(0, n)] = np.asarray(seq, dtype=np.int64)
    return out
