"""Max pooling's vocabulary maxima for CPU inference, screened: a cheap int8 product over the whole vocabulary, an
upper bound on each (text, word piece) maximum from its measured rounding, and fp32 only for the pieces the bound
leaves possibly active (``SpladePooling`` with a ``ScreenedMaxLogits`` decoder; ``screened_max_logits`` builds it
where this CPU runs it exactly: AVX512-VNNI or AMX, where ``torch._int_mm`` sums int8 codes at twice bf16's rate,
14.8 against 29.8 ms for 256 x 384 x 30,522 on one core of the AVX-512 EPYC).

Elsewhere (an AVX2-only CPU: ``torch._int_mm`` there sums pairs of 8-bit products in int16 and saturates) the head
runs the plain fp32 product (``inference.prepare.PreparedLinear``). A bf16 screen ran before this one: every CPU with
bf16 instructions has VNNI too, and there the int8 screen's head took 0.78-0.82x its time (BENCHMARKS.md).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import ClassVar

import torch
from torch import Tensor, nn

from bertkit.errors import BertkitError

_TINY = torch.finfo(torch.float32).tiny
# fp32's unit roundoff is 2^-24. The bound below is a sum of a handful of fp32 products and sums, each off by at most
# 2^-24 of the magnitudes it adds: 2^-20 of them (16 roundings' worth) covers its own arithmetic, and 2^-22 of a
# vector's norm covers the rounding of the subtraction that measured a quantisation error within it.
_SLACK, _PAD = 2.0 ** -20, 2.0 ** -22


class ScreenedMaxLogits(nn.Module):
    """Inference on a CPU with AVX512-VNNI or AMX: each text's maximum logit per word piece where it is positive, the
    others 0, from the (N, H) transformed states of the texts' tokens (``lengths`` of them each, in order): what max
    pooling's log1p(relu(.)) reads of ``_MaxLogits``' maxima, in about half its arithmetic. A text activates a few
    hundred of the 30,522 word pieces: the vocabulary product runs first in int8, exact in int32 (``torch._int_mm``),
    its error bounded for each (text, piece), and only the pieces the bound leaves possibly active are recomputed in
    fp32 (2.7x the active ones on MiniLM), the bias added to the maximum (max(x + b) = max(x) + b). No gradient:
    training runs ``_MaxLogits``.

    Each decoder row w is rounded to int8 codes with its own step (w~ = s_w q_w, s_w = max|w| / 127); each text's
    states with one step for the text (x~ = s_x q_x, s_x = the text's max |x_i| / 127), so that a text's maxima are
    taken on the int32 sums q_x . q_w themselves, before any scaling. The bound, for a token x of text k and row w:

        x . w = x~ . w~ + x~ . (w - w~) + (x - x~) . w       (exact: x = x~ + (x - x~), w = w~ + (w - w~))
        x~ . w~ = s_x s_w (q_x . q_w)                         (exact: integers summed in int32, |sum| < H 127^2)
        |x~ . (w - w~)| <= |x~| |w - w~|,  |(x - x~) . w| <= |x - x~| |w|   (Cauchy-Schwarz)

    so max over the text's tokens of x . w <= s_x s_w max(q_x . q_w) + X~ E_w + E_x |w| (s_x s_w >= 0), with X~ and
    E_x the text's largest |x~| and |x - x~|. The fp32 product the result is compared with differs from x . w by at
    most gamma |x| |w| (gamma = 2 H 2^-24: twice what one fp32 sum of H terms errs), and the bias by adding it once
    more. Every measured term is taken 1% larger and padded by 2^-22 of the norm it was measured in (the subtraction's own
    rounding), and 2^-20 of |y~| + |b| (|y~| <= X~ (|w| + |w - w~|)) covers the six roundings of the bound's own
    fp32 arithmetic, each at most 2^-24 of what it sums: a piece whose bound is <= 0 has an
    fp32 maximum logit <= 0, whatever the summation order, and is left at 0; the others are recomputed in fp32. A
    text holding NaN or inf gets a NaN step, so a NaN bound at every piece: all recomputed, as in fp32."""


    # The int8 product's row block when chunk_size is unset: the block's int32 sums, 31.3 MB at 256 rows of
    # MiniLM's vocabulary, within KEEP_BYTES (256 rows ran 1.1-1.2x as fast as CPU_ROWS on one EPYC core)
    ROWS: ClassVar[int] = 256
    # Scratch buffers up to this size are kept from call to call (the block's logits, 15.6 MB at ROWS): under the
    # server's mmap threshold a fresh one is a new mapping faulted in page by page (MiniLM's head: 99 ms a 16-text
    # batch against 66). Larger ones (a chunk_size of many rows, a NaN text's every piece) are freed after the call.
    KEEP_BYTES: ClassVar[int] = 32 * 2**20

    def __init__(self, weight: Tensor, bias: Tensor):
        super().__init__()
        self.weight, self.bias = weight.detach().float(), bias.detach().float()  # (V, H), (V,)
        self.gamma = 2 * weight.shape[1] * 2.0 ** -24
        self.spare: list[dict[str, Tensor]] = []  # kept scratch buffers, taken by one call at a time
        self._prepare()

    def scratch(self, buffers: dict[str, Tensor], name: str, shape: tuple[int, ...], dtype: torch.dtype) -> Tensor:
        """A ``shape`` tensor of ``dtype`` over ``buffers[name]`` (kept up to KEEP_BYTES), as the last call left it."""
        numel = math.prod(shape)
        buffer = buffers.get(name)
        if buffer is None or buffer.dtype != dtype or buffer.numel() < numel:
            with torch.inference_mode(False):  # the next call may run outside inference mode (another thread's)
                buffer = torch.empty(numel, dtype=dtype)
            if numel * buffer.element_size() <= self.KEEP_BYTES:
                buffers[name] = buffer
        return buffer[:numel].view(shape)

    def forward(self, states: Tensor, lengths: list[int], rows: int) -> Tensor:
        """(B, V), ``rows`` states at a time through the screening product, in blocks as ``_MaxLogits``'."""
        if torch.is_grad_enabled() and states.requires_grad:
            raise BertkitError(f"{type(self).__name__} computes no gradient: train through SpladePooling's own path")
        try:  # a call in another thread takes its own (list.pop and append are atomic)
            buffers = self.spare.pop()
        except IndexError:
            buffers = {}
        try:
            return self._pooled(states.float(), lengths, rows, buffers)
        finally:
            self.spare.append(buffers)
            del self.spare[1:]  # one set kept however many threads called at once

    def _pooled(self, states: Tensor, lengths: list[int], rows: int, buffers: dict[str, Tensor]) -> Tensor:
        ends = torch.tensor(lengths).cumsum(0).tolist()
        bound = self._bound(states, lengths, ends, rows, buffers)  # (B, V), in a kept buffer
        maybe = torch.le(bound, 0, out=self.scratch(buffers, "maybe", bound.shape, torch.bool)).logical_not_()
        text, piece = maybe.nonzero(as_tuple=True)  # (K,): maybe active (NaN included)
        exact = torch.empty(piece.shape[0], dtype=torch.float32)  # (K,)
        # where each text's candidates end (text is sorted): bincount ran 0.8 ms on 15k, a sum over maybe made a
        # (B, V) int64 copy, faulted in under the server's mmap threshold
        at = torch.searchsorted(text, torch.arange(len(lengths)), right=True).tolist()
        for k, (e, n) in enumerate(zip(ends, lengths)):
            lo, hi = at[k - 1] if k else 0, at[k]
            rows_of = torch.index_select(self.weight, 0, piece[lo:hi],  # (K_k, H): the text's pieces' rows
                                         out=self.scratch(buffers, "rows", (hi - lo, states.shape[1]), torch.float32))
            products = torch.mm(states[e - n:e], rows_of.T,
                                out=self.scratch(buffers, "products", (n, hi - lo), torch.float32))  # (n, K_k)
            torch.amax(products, 0, out=exact[lo:hi])
        pooled = torch.zeros(bound.shape)  # (B, V)
        pooled[text, piece] = (exact + self.bias[piece]).relu_()
        return pooled

    def _prepare(self) -> None:
        w = self.weight
        if w.shape[1] * 127 * 127 >= 2**31:
            raise BertkitError(f"ScreenedMaxLogits sums {w.shape[1]} products of int8 codes in int32, which may "
                               "overflow past 133,143 (screened_max_logits runs the fp32 product there)")
        self.step = (w.abs().amax(1) / 127).clamp_(min=_TINY)  # (V,): s_w
        codes = (w / self.step[:, None]).round_().clamp_(-127, 127)
        # (H, V): the transposed view of (V, H) codes, which torch._int_mm ran faster than a contiguous copy
        self.codes_t = codes.nan_to_num(0).to(torch.int8).T
        norm = w.norm(dim=1)
        self.row_norm = norm  # (V,): |w|
        self.row_error = (w - codes * self.step[:, None]).norm(dim=1).add_(norm, alpha=_PAD)  # (V,): |w - w~|
        self.bias_up = self.bias + _SLACK * self.bias.abs()
        self.low_slack = 1.01 * self.row_error + _SLACK * (norm + self.row_error)  # (V,)

    def _bound(self, states: Tensor, lengths: list[int], ends: list[int], rows: int,
               buffers: dict[str, Tensor]) -> Tensor:
        """(B, V): an upper bound on each text's fp32 maximum logit per word piece, bias included, in a kept buffer."""
        V, shape = self.weight.shape[0], states.shape
        # the (N, H) passes write into kept buffers: under the server's mmap threshold each new one is faulted in
        low = torch.abs(states, out=self.scratch(buffers, "low", shape, torch.float32))
        step = (_per_text(low.amax(1), lengths, ends) / 127).clamp_(min=_TINY)  # (B,): s_x; NaN for NaN or inf
        steps = step.repeat_interleave(torch.tensor(lengths))[:, None]  # (N, 1): each token's text's
        scaled = torch.div(states, steps, out=self.scratch(buffers, "scaled", shape, torch.float32))
        scaled.round_().clamp_(-127, 127)  # (N, H): q_x
        norm = states.norm(dim=1)  # (N,): |x|
        low_norm = torch.mul(scaled, steps, out=low).norm(dim=1)  # |x~|
        error = torch.sub(states, low, out=low).norm(dim=1).add_(norm, alpha=_PAD)  # |x - x~|
        codes = self.scratch(buffers, "codes", shape, torch.int8).copy_(scaled.nan_to_num_(0))
        top = self.scratch(buffers, "top", (len(lengths), V), torch.int32)  # (B, V): max q_x . q_w
        for a, b, spans in _blocks(lengths, rows):
            sums = torch._int_mm(codes[a:b], self.codes_t,
                                 out=self.scratch(buffers, "block", (b - a, V), torch.int32))  # (R, V)
            for k, lo, hi, first in spans:
                value = _max_rows(sums[lo - a:hi - a])
                top[k] = value if first else torch.maximum(top[k], value)
        x, x_low, dx = (_per_text(v, lengths, ends)[:, None] for v in (norm, low_norm, error))
        # copied, then scaled in place: a mul of the int32 sums into an fp32 out makes a new fp32 copy first
        bound = self.scratch(buffers, "bound", top.shape, torch.float32).copy_(top)
        bound.mul_(step[:, None]).mul_(self.step).add_(self.bias_up)  # (B, V): y~ + b, the maxima in fp32
        # |y~| <= |x~| |w~| <= |x~| (|w| + |w - w~|): its 2^-20 is folded into the |x~| term (self.low_slack)
        return bound.addcmul_(x_low, self.low_slack).addcmul_(dx + self.gamma * x, self.row_norm, value=1.01)


def screened_max_logits(weight: Tensor, bias: Tensor) -> ScreenedMaxLogits | None:
    """The screen for a (V, H) fp32 decoder where this CPU runs it exactly and fast: ``torch._int_mm`` sums int8 codes
    exactly and the CPU has 8-bit int8 dot products (AVX512-VNNI or AMX: ``_hardware.int8_kernel`` at 8 bits); None
    elsewhere (the plain fp32 product runs)."""
    from bertkit._hardware import int8_kernel, int_mm_exact

    kernel = int8_kernel()
    if kernel is not None and kernel.activation_bits == 8 and int_mm_exact() and weight.shape[1] * 127**2 < 2**31:
        return ScreenedMaxLogits(weight, bias)
    return None


def _per_text(values: Tensor, lengths: list[int], ends: list[int]) -> Tensor:
    """(N,) -> (B,): each text's largest value (NaN where it holds one)."""
    return torch.stack([values[e - n:e].max() for e, n in zip(ends, lengths)])


def _blocks(lengths: list[int], rows: int) -> Iterator[tuple[int, int, list[tuple[int, int, int, bool]]]]:
    """The texts' token rows (``lengths`` of them each, in order) in blocks of ``rows``: (a, b, spans) for each
    block a:b, a span (k, lo, hi, first) for each text k with rows lo:hi in it, first where the text begins there."""
    ends = torch.tensor(lengths).cumsum(0).tolist()
    starts = [e - n for e, n in zip(ends, lengths)]
    N, k = (ends[-1] if ends else 0), 0  # k: the first text not wholly in earlier blocks
    for a in range(0, N, rows):
        b = min(a + rows, N)
        while k < len(lengths) and ends[k] <= a:
            k += 1
        spans, j = [], k
        while j < len(lengths) and starts[j] < b:
            spans.append((j, max(starts[j], a), min(ends[j], b), starts[j] >= a))
            j += 1
        yield a, b, spans


def _max_rows(x: Tensor) -> Tensor:
    """(R, V) -> (V,): the rows' elementwise maximum, by halves, in place in ``x`` (bf16's max reduction over rows
    ran 3x slower; a half's new tensor is a fresh mapping in a served batch)."""
    while x.shape[0] > 1:
        half = x.shape[0] // 2
        top = torch.maximum(x[:half], x[half:2 * half], out=x[:half])
        if x.shape[0] % 2:
            torch.maximum(top[0], x[-1], out=top[0])
        x = top
    return x[0]
