"""The int8 Linear modules that replace an encoder layer's float projections.

``SmoothedInt8Linear``: int8 weights per output channel, activations quantized with one scale per call, the
input divided by SmoothQuant's factors first; on oneDNN's quantized Linear (``torch.ops.onednn.qlinear_pointwise``)
with 8-bit activations (AVX512-VNNI or AMX), on ``torch.ao``'s deprecated dynamic Linear (fbgemm) with 7-bit ones
while PyTorch has it, then on oneDNN at 7 bits (``default_backend``); ``torch._int_mm`` runs the same integers.
``PerTokenInt8Linear``: int8 weights per output channel, one activation scale and zero point per token (oneDNN's
quantized Linear or ``torch._int_mm``; CPUs with AVX512-VNNI). Both can be rebuilt from the integers and scales they save
(``from_saved`` / ``saved_tensors``), turned back into a float ``nn.Linear`` (``dequantized``), and refuse
training and backward passes.

A ``torch._int_mm`` projection is one function per scheme (``linear_per_call``, ``linear_per_token``) that
Inductor compiles on first use: the activations' range, then shift, scale, rounding, clamping and the cast in one
pass (eager PyTorch takes seven passes over the activations, five times the time of the matrix product itself on a
short sentence's ``ffn_out``), and the int32 sums turned into floats, scaled and offset in one more. The compiled
function computes the same integers as the eager one, which runs instead where nothing can be compiled (no C++
compiler, tracing, ``BERTKIT_INT8_EAGER=1``); the float results agree to rounding.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

import torch
from torch import Tensor, nn

from bertkit._hardware import X86_ENGINES
from bertkit.errors import BertkitError
from bertkit.quantization.device import onednn_supported, per_token_supported

log = logging.getLogger(__name__)
_TINY = torch.finfo(torch.float32).tiny


def _codes_per_call(x: Tensor, inv_scale: Tensor, levels: int) -> tuple[Tensor, Tensor, Tensor]:
    """``x * inv_scale`` (the smoothing) as float codes in [-levels, levels] with one zero point and step for the
    whole call: the middle of its range and its width / (2 * levels), so the activations use every level whatever
    their offset. Returns the codes (T, in), the zero point and the step (0-d). ``x`` has at least one row."""
    x = x * inv_scale
    lo, hi = torch.aminmax(x)
    lo, hi = lo * 0.5, hi * 0.5  # halved: a +-3e38 range does not overflow to inf
    zero = hi + lo
    step = ((hi - lo) / levels).clamp_(min=_TINY)
    # in place on this call's own copy: eagerly, fresh large buffers cost page faults on every call
    return x.sub_(zero).div_(step).round_().clamp_(-levels, levels), zero, step


def _codes_per_token(x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``x`` (T, in) as float codes in [-127, 127] with one zero point and step per row (the middle of its range,
    its width / 254). Returns the codes (T, in), the zero points and the steps (T, 1), in float32 whatever ``x``'s
    dtype: under bf16 autocast the layer before hands over bf16 activations, and codes computed in bf16 (8
    significant bits) would land up to a few levels off (``_codes_per_call`` promotes through its fp32 smoothing
    scale; here the cast does it)."""
    x = x.float()
    # Halved before adding, so a row reaching +-1.7e38 does not overflow to inf; the same bits otherwise
    # (halving is exact, and (h - l) / 127 rounds the same real number as (hi - lo) / 254).
    hi, lo = x.amax(1, keepdim=True).mul_(0.5), x.amin(1, keepdim=True).mul_(0.5)  # (T, 1) each
    zero = hi + lo
    step = ((hi - lo) / 127).clamp_(min=_TINY)
    # one new (T, in) buffer, the rest in place: eagerly, fresh large buffers cost page faults on every call
    return x.sub(zero).div_(step).round_().clamp_(-127, 127), zero, step


def quantize_per_call(x: Tensor, inv_scale: Tensor, levels: int) -> tuple[Tensor, Tensor, Tensor]:
    """``_codes_per_call`` as int8 (``torch._int_mm``'s activation type)."""
    codes, zero, step = _codes_per_call(x, inv_scale, levels)
    return codes.to(torch.int8), zero, step


def quantize_per_token(x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``_codes_per_token`` as int8 (``torch._int_mm``'s activation type)."""
    codes, zero, step = _codes_per_token(x)
    return codes.to(torch.int8), zero, step


def quantize_per_call_u8(x: Tensor, inv_scale: Tensor, levels: int) -> tuple[Tensor, Tensor, Tensor]:
    """``_codes_per_call`` shifted by ``levels + 1`` into uint8, oneDNN's activation type (zero point 128 at 8
    bits, codes 1..255; 64 at 7 bits, codes 1..127, which AVX2's pairwise int16 sums hold exactly): the same
    integers as ``quantize_per_call``, in one pass when compiled."""
    codes, zero, step = _codes_per_call(x, inv_scale, levels)
    return codes.add_(levels + 1).to(torch.uint8), zero, step


def quantize_per_token_u8(x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``_codes_per_token`` shifted by 128 into uint8 (oneDNN's activation type, zero point 128)."""
    codes, zero, step = _codes_per_token(x)
    return codes.add_(128).to(torch.uint8), zero, step


def zero_point_offset(zero: Tensor, weight_rowsum: Tensor, bias: Tensor | None) -> Tensor:
    """zero * rowsum(W) + b: what the activations' zero point (per call or per token) adds to each output, with the
    bias; the integer product is of the codes alone."""
    return zero * weight_rowsum if bias is None else torch.addcmul(bias, zero, weight_rowsum)


def per_token_epilogue(acc: Tensor, zero: Tensor, step: Tensor, weight_rowsum: Tensor, bias: Tensor | None) -> Tensor:
    """y_t = step_t * acc_t + zero_t * rowsum(W) + b, where ``acc`` already holds (q_t @ Wq) * w_scale."""
    return zero_point_offset(zero, weight_rowsum, bias).addcmul_(acc, step)


def linear_per_call(x: Tensor, inv_scale: Tensor, levels: int, weight_t: Tensor, weight_scale: Tensor,
                    weight_rowsum: Tensor, bias: Tensor | None) -> Tensor:
    """``SmoothedInt8Linear`` on ``torch._int_mm``: y = step * (q @ Wq) * w_scale + zero * rowsum(W) + b, with q,
    zero and step from ``quantize_per_call``; the int32 sums are exact, the zero point comes back through the
    weights' row sums. ``x`` (T, in), T >= 1."""
    q, zero, step = quantize_per_call(x, inv_scale, levels)
    return torch.addcmul(zero_point_offset(zero, weight_rowsum, bias), torch._int_mm(q, weight_t).to(torch.float32),
                         weight_scale * step)


def linear_per_token(x: Tensor, weight_t: Tensor, weight_scale: Tensor, weight_rowsum: Tensor,
                     bias: Tensor | None) -> Tensor:
    """``PerTokenInt8Linear``: y_t = step_t * (q_t @ Wq) * w_scale + zero_t * rowsum(W) + b, with q, zero and
    step from ``quantize_per_token``. ``x`` (T, in), T >= 1."""
    q, zero, step = quantize_per_token(x)
    acc = torch._int_mm(q, weight_t).to(torch.float32).mul_(weight_scale)  # (T, out)
    return per_token_epilogue(acc, zero, step, weight_rowsum, bias)


# Calls on fewer activations than this run eagerly: compiling costs seconds once per process (BENCHMARKS.md), and
# on a handful of tokens the passes it saves take microseconds, so a one-sentence prediction never pays for it.
_COMPILE_FROM = 1 << 18


class _Fused:
    """``fn`` compiled by Inductor (``dynamic=True``: one kernel for every token count) on its first call on at
    least ``_COMPILE_FROM`` activations, or ``fn`` itself where that cannot be or need not be: fewer activations,
    ``BERTKIT_INT8_EAGER=1``, inside a ``torch.jit`` trace or the caller's own ``torch.compile`` (traced into its
    graph), an input that requires grad (int8 layers have no backward; the eager call lets the layer refuse one),
    or when compiling fails (no C++ compiler, a platform Inductor does not support), which is logged once. Both
    give the same integers."""

    def __init__(self, fn: Callable):
        self.fn = fn
        self.compiled: Callable | None = None
        self.failed = False
        self.checked = False

    def __call__(self, *args):
        if (self.failed or args[0].numel() < _COMPILE_FROM or torch.jit.is_tracing() or torch.compiler.is_compiling()
                or os.environ.get("BERTKIT_INT8_EAGER") == "1"
                or (torch.is_grad_enabled() and any(isinstance(a, Tensor) and a.requires_grad for a in args))):
            return self.fn(*args)
        if self.compiled is None:
            self.compiled = torch.compile(self.fn, dynamic=True)
        try:
            result = self.compiled(*args)
        except Exception as e:  # noqa: BLE001 - compiling failed, unless the eager call fails the same way
            result = self.fn(*args)  # an error of the input itself raises here, and compiling stays on
            self.failed = True
            log.warning("int8: compiling %s failed (%s: %s); quantizing activations eagerly (same results, slower)",
                        self.fn.__name__, type(e).__name__, str(e).splitlines()[0] if str(e) else "")
            return result
        if not self.checked:
            # Once per process, the compiled kernel is checked against the eager function on a real input (none of
            # these functions writes to its inputs): Inductor's cache has served a kernel built under another
            # ATEN_CPU_CAPABILITY that computed a wrong range (every code off), which nothing else would notice.
            expected = self.fn(*args)
            if not _agree(result, expected):
                self.failed = True
                log.warning("int8: the compiled %s disagreed with its eager definition (a stale Inductor cache, "
                            "TORCHINDUCTOR_CACHE_DIR?); quantizing activations eagerly from now on", self.fn.__name__)
                return expected
            self.checked = True
        return result


def _agree(got, expected) -> bool:
    """Compiled and eager outputs agree: integer codes within one step (a rounding tie), floats to rounding."""
    got, expected = (got, expected) if isinstance(got, tuple) else ((got,), (expected,))
    for a, b in zip(got, expected):
        if a.shape != b.shape or a.dtype != b.dtype:
            return False
        if a.is_floating_point():
            scale = float(b.abs().max()) if b.numel() else 0.0
            if not torch.allclose(a, b, rtol=1e-3, atol=1e-3 * max(scale, 1e-30)):
                return False
        elif b.numel() and int((a.to(torch.int32) - b.to(torch.int32)).abs().max()) > 1:
            return False
    return True


_linear_per_call = _Fused(linear_per_call)
_linear_per_token = _Fused(linear_per_token)
_quantize_per_call_u8 = _Fused(quantize_per_call_u8)
_quantize_per_token_u8 = _Fused(quantize_per_token_u8)
_per_token_epilogue = _Fused(per_token_epilogue)


def _check_scales(**scales: Tensor) -> None:
    """Refuse saved scales that are not finite and positive: a zero, negative, infinite or NaN scale (a
    damaged or hand-edited file) would otherwise load and make every output of its projection 0, NaN or
    sign-flipped without a word."""
    for name, value in scales.items():
        bad = ~(torch.isfinite(value) & (value > 0))
        if bool(bad.any()):
            first = int(bad.nonzero()[0, 0])
            raise BertkitError(f"an int8 projection's {name} must be finite and > 0; entry {first} of "
                               f"{value.numel()} is {float(value.reshape(-1)[first])!r} ({int(bad.sum())} such): the "
                               "file is damaged; write the directory again with `bertkit quantize`")


BACKENDS = ("int_mm", "fbgemm", "onednn")


def fbgemm_available() -> bool:
    """Whether this PyTorch still has ``torch.ao``'s dynamic int8 Linear (deprecated, removal scheduled)."""
    try:
        return (hasattr(torch.ao.nn.quantized.dynamic, "Linear") and hasattr(torch.ops.quantized, "linear_dynamic")
                and any(e in torch.backends.quantized.supported_engines for e in X86_ENGINES))
    except (AttributeError, RuntimeError):
        return False


def default_backend(activation_bits: int) -> str:
    """The kernel a ``SmoothedInt8Linear`` runs on when none is named. oneDNN's quantized Linear
    (``torch.ops.onednn.qlinear_pointwise``, the kernel Inductor's x86 int8 path calls; a PyTorch operator outside
    the deprecated quantized-tensor API) wherever it is exact: 8-bit activations on a CPU with AVX512-VNNI or AMX.
    Measured on MiniLM at three input lengths (BENCHMARKS.md, "int8 kernels"), it ran at 1.02-1.07x the speed of
    ``torch.ao``'s dynamic Linear (fbgemm) on an AVX512-VNNI EPYC and 1.13-1.18x on a Xeon with AMX, where
    ``torch._int_mm`` ran at 0.89-1.03x. Elsewhere (7-bit activations) fbgemm while PyTorch has it; the same saved
    integers run on any of the three."""
    if activation_bits == 8 and onednn_supported(8):
        return "onednn"
    if fbgemm_available():
        return "fbgemm"
    if onednn_supported(activation_bits):  # 7 bits on AVX2: exact, 0.83-0.87x fbgemm held to AVX2 (BENCHMARKS.md)
        return "onednn"
    if activation_bits == 8 and per_token_supported():
        return "int_mm"
    raise BertkitError(f"int8 at {activation_bits}-bit activations needs oneDNN's quantized Linear "
                       "(torch.ops.onednn.qlinear_pointwise) or torch.ao's dynamic int8 Linear, and this PyTorch has "
                       "neither: run the model in fp32 or bf16, or use a PyTorch built with oneDNN (the x86 wheels)")


_ZERO_POINTS = {127: torch.tensor(128), 63: torch.tensor(64)}  # levels -> uint8 zero point
_ONE = torch.tensor(1.0)


def _output_dtype() -> torch.dtype:
    """bf16 inside CPU bf16 autocast (the next operation would cast to it anyway), else float32."""
    return torch.bfloat16 if (torch.is_autocast_enabled("cpu")
                              and torch.get_autocast_dtype("cpu") == torch.bfloat16) else torch.float32


class OneDNNWeights:
    """oneDNN's packed copy of a projection's int8 weights, made on first use (and again if the integers are
    replaced): the packing is an opaque tensor that cannot be saved, copied or moved, so a layer keeps its integers
    as a buffer (``weight_t``) and this as a cache beside them."""

    def __init__(self):
        self.packed: Tensor | None = None
        self.key: tuple | None = None
        self.zero_points: Tensor | None = None

    def __call__(self, q: Tensor, x_scale: Tensor, weight_t: Tensor, weight_scale: Tensor, bias: Tensor | None,
                 out_dtype: torch.dtype | None = None, levels: int = 127) -> Tensor:
        """(q - levels - 1) @ W^T * x_scale * weight_scale + bias, from uint8 codes ``q`` (T, in)."""
        # inference tensors cannot be changed in place, and keep no version counter
        key = (weight_t.data_ptr(), 0 if weight_t.is_inference() else weight_t._version, tuple(weight_t.shape))
        if self.key != key:
            self.packed = torch.ops.onednn.qlinear_prepack(weight_t.t().contiguous(), None)
            self.zero_points = torch.zeros(weight_t.shape[1], dtype=torch.int64)
            self.key = key
        return torch.ops.onednn.qlinear_pointwise.tensor(q, x_scale, _ZERO_POINTS[levels], self.packed, weight_scale,
                                                         self.zero_points, bias, 1.0, 0, out_dtype or _output_dtype(), "none",
                                                         [], "")


def _without_packing(layer: nn.Module) -> dict:
    """A layer's state for pickling and ``copy.deepcopy``, with an empty oneDNN cache (the packing is opaque)."""
    state = layer.__dict__.copy()
    state["_onednn"] = OneDNNWeights()
    return state


class SmoothedInt8Linear(nn.Module):
    """``linear`` as int8: y = Q(x / s) @ Q(W * s)^T + b, with W * s quantized per output channel and x / s
    quantized per call (``torch._int_mm`` or ``torch.ao``'s dynamic Linear: ``backend``). ``s`` (in_features,) > 0 moves activation
    outliers into the weights (SmoothQuant); s = 1 is plain dynamic quantization."""

    def __init__(self, linear: nn.Linear, scale: Tensor, activation_bits: int = 7, backend: str | None = None):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.activation_bits = activation_bits
        self.register_buffer("inv_scale", (1.0 / scale).to(torch.float32))  # (in_features,)
        scaled = nn.Linear(linear.in_features, linear.out_features, bias=linear.bias is not None)
        with torch.no_grad():
            scaled.weight.copy_(linear.weight * scale[None, :])  # (out, in): column j times s_j
            if linear.bias is not None:
                scaled.bias.copy_(linear.bias)
        w = scaled.weight.detach()
        weight_scale = (w.abs().amax(1) / 127).clamp(min=torch.finfo(torch.float32).tiny)
        qweight = torch.round(w / weight_scale[:, None]).clamp(-127, 127).to(torch.int8)
        self._build(qweight, weight_scale, scaled.bias.detach() if scaled.bias is not None else None, backend)
        self.training = False

    @classmethod
    def from_saved(cls, weight: Tensor, weight_scale: Tensor, inv_scale: Tensor, bias: Tensor | None,
                   activation_bits: int = 7, backend: str | None = None) -> SmoothedInt8Linear:
        """The layer ``saved_tensors`` wrote: int8 ``weight`` (out, in), its per-output-channel
        ``weight_scale`` (out,), the fp32 ``bias`` and the smoothing ``inv_scale`` (in,). The weights are
        packed here, for this machine's engine, so a file saved on one x86 CPU runs on any other."""
        out_features, in_features = weight.shape
        if weight.dtype != torch.int8 or weight_scale.shape != (out_features,) or inv_scale.shape != (in_features,):
            raise BertkitError(f"an int8 projection needs an int8 weight (out, in) with scales (out,) and (in,); got "
                               f"{weight.dtype} {tuple(weight.shape)}, scales {tuple(weight_scale.shape)} and "
                               f"{tuple(inv_scale.shape)}: the file is not one `bertkit quantize` wrote, or damaged")
        _check_scales(weight_scale=weight_scale, inv_scale=inv_scale)
        self = cls.__new__(cls)
        nn.Module.__init__(self)
        self.in_features, self.out_features = in_features, out_features
        self.activation_bits = activation_bits
        self.register_buffer("inv_scale", inv_scale.to(torch.float32).clone())
        self._build(weight, weight_scale.to(torch.float32), None if bias is None else bias.to(torch.float32), backend)
        self.training = False
        return self

    def _build(self, qweight: Tensor, weight_scale: Tensor, bias: Tensor | None, backend: str | None) -> None:
        """Hold the int8 weights (out, in) and their per-channel scales for ``backend`` (``int8_backend()``'s
        choice when None): ``"int_mm"`` keeps the integers in ``torch._int_mm``'s layout, ``"fbgemm"`` packs
        them into ``torch.ao``'s dynamic Linear."""
        self.backend = backend or default_backend(self.activation_bits)
        if self.backend not in BACKENDS:
            raise BertkitError(f"int8 backend {self.backend!r} is not one of {BACKENDS}")
        if self.backend == "onednn" and not onednn_supported(self.activation_bits):
            raise BertkitError(f"int8 backend 'onednn' is not exact here at activation_bits={self.activation_bits} "
                               "(8 bits need AVX512-VNNI or AMX, and PyTorch's torch.ops.onednn.qlinear_pointwise): "
                               "use backend=None for this CPU's kernel")
        self._onednn = OneDNNWeights()
        if self.backend in ("int_mm", "onednn"):  # the same integers in the same layout; oneDNN packs its own copy
            self.register_buffer("weight_t", qweight.t().contiguous())  # (in, out) int8
            self.register_buffer("weight_scale", weight_scale.clone())  # (out,)
            # sum_j W[o, j]: what the activations' zero point adds back
            self.register_buffer("weight_rowsum", qweight.to(torch.float32).sum(1) * weight_scale)
            self.register_buffer("bias", None if bias is None else bias.detach().clone())
            return
        scales = weight_scale.to(torch.float64)
        # Re-quantizing int8 * scale with the same scale returns the same integers (|error| << 0.5 step).
        packed = torch.quantize_per_channel(qweight.to(torch.float32) * scales[:, None].float(), scales,
                                            torch.zeros(self.out_features, dtype=torch.int64), 0, torch.qint8)
        self.int8 = torch.ao.nn.quantized.dynamic.Linear(self.in_features, self.out_features, dtype=torch.qint8)
        self.int8.set_weight_bias(packed, None if bias is None else bias.clone())

    def saved_tensors(self) -> dict[str, Tensor]:
        """What ``from_saved`` rebuilds this layer from (the bias aside): the integers and scales, not an
        engine's packing."""
        if self.backend != "fbgemm":
            return {"weight": self.weight_t.t().contiguous(), "weight_scale": self.weight_scale.clone(),
                    "inv_scale": self.inv_scale.detach().clone()}
        qweight = self.int8.weight()
        # torch.ao stores per-channel symmetric weights as per_channel_affine with zero points 0
        if qweight.qscheme() not in (torch.per_channel_affine, torch.per_channel_symmetric) or bool(
                qweight.q_per_channel_zero_points().any()):
            raise BertkitError(f"an int8 projection with {qweight.qscheme()} weights (non-zero zero points) cannot "
                               "be saved: save_int8 writes the per-channel symmetric weights quantize_int8 makes")
        return {"weight": qweight.int_repr().contiguous(), "weight_scale": qweight.q_per_channel_scales().float(),
                "inv_scale": self.inv_scale.detach().clone()}

    def float_bias(self) -> Tensor | None:
        return self.int8.bias() if self.backend == "fbgemm" else self.bias

    def forward(self, x: Tensor) -> Tensor:
        if self.backend == "int_mm":
            y = self._int_mm(x)
        elif self.backend == "onednn":
            y = self._onednn_linear(x)
        else:
            # torch.ao's dynamic Linear always quantizes activations to 7 bits (reduce_range=True); its kernel is
            # called here with the width chosen for this CPU (int8_activation_bits).
            y = torch.ops.quantized.linear_dynamic(x * self.inv_scale, self.int8._packed_params._packed_params,
                                                   self.activation_bits == 7)
        # PyTorch's int8 Linear has no backward: without this, gradients through it would be silently wrong
        # (PyTorch only warns), so a backward pass through an int8 projection is refused instead.
        return _NoBackward.apply(y) if torch.is_grad_enabled() and y.requires_grad else y

    def _int_mm(self, x: Tensor) -> Tensor:
        """One scale and zero point for the whole call (``quantize_per_call``: L = 127 levels each side at 8
        bits, 63 at 7); the products are summed exactly in int32 by ``torch._int_mm`` and the zero point is added
        back through the weights' row sums."""
        shape = x.shape
        x = x.reshape(-1, self.in_features)
        if x.shape[0] == 0:  # no tokens: aminmax has nothing to reduce
            return x.new_zeros(*shape[:-1], self.out_features)
        y = _linear_per_call(x, self.inv_scale, 127 if self.activation_bits == 8 else 63, self.weight_t,
                             self.weight_scale, self.weight_rowsum, self.bias)
        return y.reshape(*shape[:-1], self.out_features)

    def _onednn_linear(self, x: Tensor) -> Tensor:
        """``_int_mm``'s integers on oneDNN: the codes shifted into uint8 (zero point 128, or 64 at 7 bits), the
        per-call zero point folded into this call's bias, scales and bias applied inside the kernel."""
        shape = x.shape
        x = x.reshape(-1, self.in_features)
        if x.shape[0] == 0:
            return x.new_zeros(*shape[:-1], self.out_features, dtype=torch.float32)
        levels = 127 if self.activation_bits == 8 else 63
        q, zero, step = _quantize_per_call_u8(x, self.inv_scale, levels)
        y = self._onednn(q, step, self.weight_t, self.weight_scale, zero_point_offset(zero, self.weight_rowsum, self.bias),
                         levels=levels)
        return y.reshape(*shape[:-1], self.out_features)

    def __getstate__(self) -> dict:
        return _without_packing(self)

    def train(self, mode: bool = True) -> SmoothedInt8Linear:
        if mode:
            raise BertkitError(_NOT_FOR_TRAINING)
        return super().train(False)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, int8 weights per output channel, "
                f"{self.activation_bits}-bit activations")

    def dequantized(self) -> nn.Linear:
        """This layer as a float ``nn.Linear``: the int8 weights times their scales, with the smoothing folded
        back into the columns; for CPUs that cannot run it at its activation width (``load_int8``)."""
        saved, bias = self.saved_tensors(), self.float_bias()
        linear = nn.Linear(self.in_features, self.out_features, bias=bias is not None)
        with torch.no_grad():
            weight = saved["weight"].to(torch.float32) * saved["weight_scale"][:, None]
            linear.weight.copy_(weight * self.inv_scale[None, :])
            if bias is not None:
                linear.bias.copy_(bias)
        return linear.eval()


_NOT_FOR_TRAINING = ("an int8 model is for inference only (PyTorch's int8 Linear has no backward): train or "
                     "fine-tune the fp32 checkpoint, then quantize it (quantize='int8', --int8) to predict")


class _NoBackward(torch.autograd.Function):
    """Identity forward; the backward pass refuses, naming why (see ``SmoothedInt8Linear.forward``)."""

    @staticmethod
    def forward(ctx, y: Tensor) -> Tensor:
        return y.view_as(y)

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        raise BertkitError(_NOT_FOR_TRAINING)


class PerTokenInt8Linear(nn.Module):
    """``linear`` as int8 with one activation scale and zero point per token (row):

        y = step_t * (q_t @ Wq^T) * w_scale + zero_t * rowsum(W) + b,   q_t = round((x_t - zero_t) / step_t)

    where zero_t is the middle of row t's range and step_t its width / 254, so every row uses all of int8's
    levels whatever its range, and the weights are int8 with one scale per output channel. The GEMM is
    oneDNN's quantized Linear where it is exact at 8 bits, else ``torch._int_mm`` (int8 x int8 -> int32, exact;
    ``per_token_supported``). What it is for: ``ffn_out``'s
    input (after GELU) spans 0.01 to 30 between tokens, which one scale per call (``SmoothedInt8Linear``)
    cannot hold; per token it can (docs/inference.md, section int8). No smoothing: measured on MiniLM, it
    did not help once the scale is per token."""

    activation_bits = 8

    def __init__(self, weight: Tensor, weight_scale: Tensor, bias: Tensor | None):
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.register_buffer("weight_t", weight.t().contiguous())  # (in, out) int8, _int_mm's layout
        self.register_buffer("weight_scale", weight_scale.to(torch.float32).clone())  # (out,)
        # sum_j W[o, j], from the int8 weights: what the zero points add back
        self.register_buffer("weight_rowsum", weight.to(torch.float32).sum(1) * self.weight_scale)
        self.register_buffer("bias", None if bias is None else bias.detach().to(torch.float32).clone())
        self.backend = "onednn" if onednn_supported(8) else "int_mm"  # the same integers either way
        self._onednn = OneDNNWeights()
        self.training = False

    def __getstate__(self) -> dict:
        return _without_packing(self)

    @classmethod
    def from_float(cls, linear: nn.Linear) -> PerTokenInt8Linear:
        w = linear.weight.detach().to(torch.float32)
        scale = (w.abs().amax(1) / 127).clamp(min=torch.finfo(torch.float32).tiny)
        q = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)
        return cls(q, scale, linear.bias)

    @classmethod
    def from_saved(cls, weight: Tensor, weight_scale: Tensor, bias: Tensor | None) -> PerTokenInt8Linear:
        if weight.dtype != torch.int8 or weight.dim() != 2 or weight_scale.shape != (weight.shape[0],):
            raise BertkitError(f"a per-token int8 projection needs an int8 weight (out, in) and its scales (out,); "
                               f"got {weight.dtype} {tuple(weight.shape)} and {tuple(weight_scale.shape)}: the file "
                               "is not one `bertkit quantize` wrote, or damaged")
        _check_scales(weight_scale=weight_scale)
        return cls(weight, weight_scale, bias)

    def saved_tensors(self) -> dict[str, Tensor]:
        return {"weight": self.weight_t.t().contiguous(), "weight_scale": self.weight_scale.clone()}

    def float_bias(self) -> Tensor | None:
        return self.bias

    def forward(self, x: Tensor) -> Tensor:
        shape = x.shape
        if not shape or shape[-1] != self.in_features:
            raise BertkitError(f"per-token int8 linear: input of shape {tuple(shape)}, but this projection takes "
                               f"{self.in_features} features in the last dimension")
        x = x.reshape(-1, self.in_features)
        if x.shape[0] == 0:  # no tokens: amax has nothing to reduce
            return x.new_zeros(*shape[:-1], self.out_features)
        if self.backend == "onednn":
            q, zero, step = _quantize_per_token_u8(x)
            acc = self._onednn(q, _ONE, self.weight_t, self.weight_scale, None, torch.float32)
            y = _per_token_epilogue(acc, zero, step, self.weight_rowsum, self.bias)
        else:
            y = _linear_per_token(x, self.weight_t, self.weight_scale, self.weight_rowsum, self.bias)
        y = y.reshape(*shape[:-1], self.out_features)
        return _NoBackward.apply(y) if torch.is_grad_enabled() and y.requires_grad else y

    def train(self, mode: bool = True) -> PerTokenInt8Linear:
        if mode:
            raise BertkitError(_NOT_FOR_TRAINING)
        return super().train(False)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, int8 weights per output channel, "
                "8-bit activations per token")

    def dequantized(self) -> nn.Linear:
        """This layer as a float ``nn.Linear`` (the int8 weights times their scales), for CPUs where
        ``per_token_supported`` is false (``load_int8``)."""
        linear = nn.Linear(self.in_features, self.out_features, bias=self.bias is not None)
        with torch.no_grad():
            linear.weight.copy_(self.weight_t.t().to(torch.float32) * self.weight_scale[:, None])
            if self.bias is not None:
                linear.bias.copy_(self.bias)
        return linear.eval()


INT8_LAYERS = (SmoothedInt8Linear, PerTokenInt8Linear)
