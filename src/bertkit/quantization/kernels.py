"""``Int8Linear``: the int8 module that replaces an encoder projection, on this machine's one int8 kernel.

y = Q(x * inv_scale) @ Q(W / inv_scale)^T + b: int8 weights with one scale per output channel, activations
quantized after SmoothQuant's per-channel division (``inv_scale``) with one scale and zero point per call, or, for a
``per_token`` projection (``ffn_out``, whose input spans three orders of magnitude between tokens), per token. The
module holds the integers and scales (its state dict) and packs them for the kernel ``_hardware.int8_kernel``
chose: oneDNN's quantized Linear (``torch.ops.onednn.qlinear_pointwise``, Inductor's x86 int8 kernel), fed codes
from ``quantize_per_call`` and applying scales, zero point, bias and a fused activation inside; or fbgemm's dynamic
Linear (AVX2), which quantizes the activations itself. A per-token projection runs oneDNN's kernel at the class's width
on every class (fbgemm's takes one scale per call) on codes from ``quantize_per_token``, and applies each token's
scale and zero point to the product.
"""

from __future__ import annotations

import copy
import logging
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from bertkit._hardware import X86_ENGINES, Int8Kernel, check_int8_kernel, check_onednn_int8
from bertkit.errors import BertkitError
from bertkit.model_checks import compile_options

log = logging.getLogger(__name__)
_TINY = torch.finfo(torch.float32).tiny
# The smoothing factors quantize_int8 writes lie in [1 / SMOOTHING_BOUND, SMOOTHING_BOUND] (calibration.py), and
# so do their inverses, the ``inv_scale`` a directory holds; anything outside is a damaged or edited file.
SMOOTHING_BOUND = 1e5


def quantize_per_call(x: Tensor, inv_scale: Tensor, activation_bits: int) -> tuple[Tensor, float, int]:
    """``x * inv_scale`` (T, in) as uint8 codes with one step and integer zero point for the call: ``x * inv_scale
    ~= step * (codes - zero_point)``, codes 0..255 (0..127 at 7 bits) over the call's range widened to hold 0.
    Returns the codes, the step and the zero point. ``x`` has at least one row; a non-finite value raises
    RuntimeError (``Int8Linear.forward`` answers NaN for the call).

    PyTorch's dynamic quantization (``torch.quantize_per_tensor_dynamic``: the range and the codes in one C++ call,
    fbgemm's vectorised loops); the codes are the quantized tensor's own bytes, viewed as uint8, not copied. It
    replaced eight eager passes (multiply, range, shift, divide, round, clamp, offset, cast) and their Inductor-compiled
    form: 82 against 221 us on 470 x 384 activations, 320 against 373 us (compiled) on 2,048 x 384, one thread of the
    AVX-512 EPYC (BENCHMARKS.md, "int8 on short texts"). Quantized tensors are deprecated in PyTorch:
    ``_hardware.int8_kernel`` checks that this one still exists before choosing oneDNN's kernel."""
    q = torch.quantize_per_tensor_dynamic(x * inv_scale, torch.quint8, activation_bits == 7)  # float32: inv_scale is
    codes = torch.empty(0, dtype=torch.uint8).set_(q.untyped_storage(), q.storage_offset(), q.shape, q.stride())
    return codes, q.q_scale(), q.q_zero_point()


def quantize_per_token(x: Tensor, inv_scale: Tensor, steps: int) -> tuple[Tensor, Tensor, Tensor]:
    """``x * inv_scale`` (T, in) as uint8 codes 0..``steps``, each row with its own low end ``lo`` and step (T, 1),
    float32: ``x * inv_scale ~= lo + step * codes``, every row on every level whatever its range. ``x`` has at least
    one row; a row holding NaN gives NaN ``lo`` (and so NaN outputs)."""
    x = x * inv_scale  # float32: inv_scale is
    # amin and amax, not aminmax: PyTorch 2.13's aminmax along a dimension ran 20x slower (1.65 ms against 77 us on
    # 470 x 1536, one thread)
    lo, hi = x.amin(-1, keepdim=True), x.amax(-1, keepdim=True)
    step = ((hi * 0.5 - lo * 0.5) * (2 / steps)).clamp_(min=_TINY)  # halved: a +-3e38 range does not overflow
    codes = x.sub_(lo).div_(step).round_().clamp_(0, steps)
    return codes.to(torch.uint8), lo, step


# Calls on fewer activations than this quantize eagerly: on a handful of tokens the passes compiling saves take
# microseconds. Above it the compiled pass ran 2-7x the eager one and the model 4-10% faster.
COMPILE_FROM = 1 << 18
# Compiling costs seconds once per process (2.9 s on the Zen 4 EPYC with a warm Inductor cache, 10-15 s without),
# and the compiled pass saves about 1 ns an activation (MiniLM int8 on 512 SQuAD questions, one thread: 0.71 against
# 0.77 s of CPU time, 6.6e7 activations): a `predict --int8` on a few hundred texts would never earn it back. So a
# process compiles once its eager calls have quantized about as many activations as the compile costs (the
# ski-rental rule: whatever the run's length, at most twice the cost of the better choice made in hindsight; about
# 25,000 short questions on MiniLM). A server pays it at start-up instead (``compile_next``), not in a request.
COMPILE_AFTER = 3_000_000_000


class _Compiled:
    """``quantize_per_token`` compiled by Inductor (``dynamic=True``: one kernel for every token count) for calls on
    ``COMPILE_FROM`` activations or more, once the process has quantized ``COMPILE_AFTER`` activations eagerly (or
    ``compile_next`` was called); eager before that, below it, when traced or inside the caller's own
    ``torch.compile``, and where compiling fails (no C++ compiler; logged once). The first compiled result is
    checked against the eager one: Inductor's cache has served a kernel built under another
    ``ATEN_CPU_CAPABILITY`` that computed a wrong range, which nothing else would notice."""

    def __init__(self, fn: Callable):
        self.fn = fn
        self.compiled: Callable | None = None
        self.failed = False
        self.checked = False
        self.eager_activations = 0

    def compile_next(self) -> None:
        """Compile at the next call on ``COMPILE_FROM`` activations, however few ran eagerly: a long-lived process
        (``serve``'s warm-up) pays the compile before its first request rather than inside one."""
        self.eager_activations = max(self.eager_activations, COMPILE_AFTER)

    def __call__(self, x: Tensor, *args) -> tuple[Tensor, Tensor, Tensor]:
        if (self.failed or x.numel() < COMPILE_FROM or self.eager_activations < COMPILE_AFTER
                or torch.jit.is_tracing() or torch.compiler.is_compiling()):
            self.eager_activations += x.numel()
            return self.fn(x, *args)
        try:
            if self.compiled is None:  # inside the try: torch.compile itself makes the Inductor cache directory
                # (a read-only one ended `serve --int8`); the SIMD width keys the cache by CPU class
                self.compiled = torch.compile(self.fn, dynamic=True, options=compile_options())
            result = self.compiled(x, *args)
        except Exception as e:  # noqa: BLE001 - compiling failed, unless the eager call fails the same way
            result = self.fn(x, *args)  # an error of the input itself raises here
            self.failed = True
            log.warning("int8: compiling the activations' quantization failed (%s: %s); quantizing eagerly (same "
                        "codes, slower)", type(e).__name__, str(e).splitlines()[0] if str(e) else "")
            return result
        if not self.checked:
            expected = self.fn(x, *args)
            codes_agree = int((result[0].int() - expected[0].int()).abs().max()) <= 1  # a rounding tie at most
            if not (codes_agree and all(torch.allclose(r, e, rtol=1e-5) for r, e in zip(result[1:], expected[1:]))):
                self.failed = True
                log.warning("int8: the compiled activation quantization disagreed with its eager definition (a stale "
                            "Inductor cache, TORCHINDUCTOR_CACHE_DIR?); quantizing eagerly from now on")
                return expected
            self.checked = True
        return result


compiled_quantize_per_token = _Compiled(quantize_per_token)
_DEPRECATED_CREATION = r".*quantized tensor creation functions.*deprecated"  # torch.ao's warning, known
# PyTorch's deprecation of quantized tensors (its internals: the caller can do nothing about it) is said once per
# process, at the first quantized tensor made, whichever function makes it: that tensor is made here, as the module
# loads, under a filter for that message alone, so it is never said later, whatever filters a caller sets. A
# warnings.catch_warnings() around each packing swapped the process's filter list, and restoring it from one serving
# thread dropped the filters another thread had added meanwhile.
warnings.filterwarnings("ignore", message=_DEPRECATED_CREATION, category=UserWarning)
if hasattr(torch, "quantize_per_tensor_dynamic"):  # a PyTorch without it has no quantized tensors to warn about
    torch.quantize_per_tensor_dynamic(torch.zeros(1, device="cpu"), torch.quint8, False)
# On the CPU by name: this module may first be imported under a caller's default device (`with torch.device("meta")`,
# or "cuda"), which would otherwise place these module-wide tensors there (and meta has no quantized kernel at all).
_ZERO = torch.tensor(0, device="cpu")  # the per-token codes' zero point: each token's low end is applied after the product
_ONE = torch.tensor(1.0, device="cpu")


def check_saved(name: str, value: Tensor, low: float, high: float) -> None:
    """Refuse a saved scale outside [low, high] (or not finite): a damaged or hand-edited file would otherwise load
    and make its projection's outputs 0, NaN, inf or sign-flipped, or fail inside a kernel."""
    bad = ~(torch.isfinite(value) & (value >= low) & (value <= high))
    if bool(bad.any()):
        first = int(bad.reshape(-1).nonzero()[0, 0])
        raise BertkitError(f"{name} must be finite and within [{low:g}, {high:g}]; entry {first} of {value.numel()} "
                           f"is {float(value.reshape(-1)[first])!r} ({int(bad.sum())} such): the file is damaged; write "
                           "it again: bertkit quantize --model FLOAT_CHECKPOINT --output-dir DIR --overwrite")


class Int8Linear(nn.Module):
    """An encoder projection in int8 (see the module docstring). Built by ``from_float`` (quantizing a float
    ``nn.Linear`` whose inputs are divided by the smoothing factors ``scale``) or ``from_saved``; inference only.
    ``per_token``: its activations take one scale per token (``projections.PER_TOKEN`` says which)."""

    def __init__(self, weight: Tensor, weight_scale: Tensor, inv_scale: Tensor, bias: Tensor | None,
                 per_token: bool = False):
        super().__init__()
        self.per_token = per_token
        self.out_features, self.in_features = weight.shape
        self.register_buffer("weight", weight.contiguous())  # (out, in) int8
        self.register_buffer("weight_scale", weight_scale.to(torch.float32))  # (out,)
        self.register_buffer("inv_scale", inv_scale.to(torch.float32))  # (in,)
        self.register_buffer("bias", None if bias is None else bias.detach().to(torch.float32).clone())
        self.training = False
        self.activation: nn.Module | None = None  # applied to the output: fused into oneDNN's kernel (``fused_with``)
        self.post_op = ("none", "")
        self._pack()

    @classmethod
    def from_float(cls, linear: nn.Linear, scale: Tensor, per_token: bool = False) -> Int8Linear:
        """``linear`` with its input channel j divided by ``scale[j]`` > 0 and its weight's column j multiplied by
        it (exact in real arithmetic), the weight then quantized symmetrically per output channel."""
        w = linear.weight.detach().to(torch.float32) * scale[None, :]  # (out, in)
        weight_scale = (w.abs().amax(1) / 127).clamp(min=_TINY)
        weight = torch.round(w / weight_scale[:, None]).clamp(-127, 127).to(torch.int8)
        return cls(weight, weight_scale, (1.0 / scale).to(torch.float32), linear.bias, per_token)

    @classmethod
    def from_saved(cls, name: str, weight: Tensor, weight_scale: Tensor, inv_scale: Tensor,
                   bias: Tensor | None, per_token: bool = False) -> Int8Linear:
        """The layer ``save_int8`` wrote under ``name``, checked: shapes, dtypes and scales in range."""
        if (weight.dtype != torch.int8 or weight.dim() != 2 or weight_scale.shape != (weight.shape[0],)
                or inv_scale.shape != (weight.shape[1],)):
            raise BertkitError(f"{name}: an int8 projection needs an int8 weight (out, in) with scales (out,) and (in,); "
                               f"got {weight.dtype} {tuple(weight.shape)}, scales {tuple(weight_scale.shape)} and "
                               f"{tuple(inv_scale.shape)}: the file is not one `bertkit quantize` wrote, or damaged")
        check_saved(f"{name}.weight_scale", weight_scale, _TINY, 1e4)
        check_saved(f"{name}.inv_scale", inv_scale, 1 / SMOOTHING_BOUND * (1 - 1e-6), SMOOTHING_BOUND * (1 + 1e-6))
        return cls(weight, weight_scale, inv_scale, bias, per_token)

    def fused_with(self, activation: nn.Module | None, post_op: tuple[str, str]) -> Int8Linear:
        """A copy whose output is ``activation`` of this layer's, computed by oneDNN's kernel as its post-operation
        ``post_op`` (``qlinear_pointwise``'s attr and algorithm, e.g. ("gelu", "none")); ``None`` and ("none", "")
        give the layer without one (``inference.prepare._prepare_dense`` decides). oneDNN's kernel only."""
        if self.kernel.name != "onednn":
            raise ValueError(f"Int8Linear fuses an activation on oneDNN's kernel only, this one runs {self.kernel.name}")
        fused = copy.deepcopy(self)
        fused.activation, fused.post_op = activation, post_op
        return fused

    def _pack(self) -> None:
        """Pack the integers for this machine's kernel: an opaque copy, never saved, remade after a state-dict load
        or an unpickle."""
        self.kernel: Int8Kernel = check_int8_kernel()
        if self.per_token and self.kernel.name != "onednn":
            self.kernel = check_onednn_int8(self.kernel.activation_bits)
        if self.kernel.name == "onednn":
            self._packed = torch.ops.onednn.qlinear_prepack(self.weight, None)
            # what the activations' zero point adds to each output: zero * sum_j W[o, j], weights in float units
            self._rowsum = self.weight.to(torch.float32).sum(1) * self.weight_scale
            self._zero_points = torch.zeros(self.out_features, dtype=torch.int64)
            return
        # fbgemm's kernels are chosen at packing, under an x86 engine; torch.ao's deprecation warnings are known
        before = torch.backends.quantized.engine
        torch.backends.quantized.engine = next(e for e in X86_ENGINES if e in torch.backends.quantized.supported_engines)
        try:
            # re-quantizing int8 * scale with the same scale returns the same integers
            qweight = torch.quantize_per_channel(self.weight.to(torch.float32) * self.weight_scale[:, None],
                                                 self.weight_scale.to(torch.float64),
                                                 torch.zeros(self.out_features, dtype=torch.int64), 0, torch.qint8)
            self._packed = torch.ops.quantized.linear_prepack(qweight, self.bias)
        finally:
            torch.backends.quantized.engine = before

    def refuse_conversion(self, fn: Any) -> None:
        """Raise where ``fn`` (what ``.to()``, ``.half()``, ... apply; a bertkit model asks before converting any of
        its parameters) would change the scales' dtype or device: the kernels take float32 scales on the CPU, so a
        ``.half()`` int8 model failed at its next call ("Quantize only works on Float Tensor") with its scales
        rounded to float16, and ``.float()`` after it gave other outputs."""
        converted = fn(self.weight_scale)
        if (converted.dtype, converted.device) != (self.weight_scale.dtype, self.weight_scale.device):
            raise BertkitError(f"an int8 model keeps its scales in {self.weight_scale.dtype} on "
                               f"{self.weight_scale.device} for its kernels, not {converted.dtype} on "
                               f"{converted.device}: leave its dtype and device as they are; to run its float parts "
                               "in bf16 pass bf16=True (pipeline, optimize_for_inference) or --bf16, or convert and "
                               "quantize the float model instead")

    def _apply(self, fn: Any, recurse: bool = True) -> Int8Linear:
        self.refuse_conversion(fn)  # inside a model that is no bertkit model (which asks before converting anything)
        return super()._apply(fn, recurse)

    def _load_from_state_dict(self, *args, **kwargs) -> None:
        super()._load_from_state_dict(*args, **kwargs)
        self._pack()

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state.pop("_packed", None)  # opaque: packed again by __setstate__
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._pack()

    def forward(self, x: Tensor) -> Tensor:
        if torch.jit.is_tracing():
            raise BertkitError(NOT_TRACEABLE)
        if torch.compiler.is_compiling():
            # Inductor cannot lower the kernels' packed weights (an InductorError ended compile_layers() and
            # torch.compile of an int8 model): the projection runs eagerly between the compiled parts
            return _uncompiled_forward()(self, x)
        return self._forward(x)

    def _forward(self, x: Tensor) -> Tensor:
        shape = x.shape
        x = x.reshape(-1, self.in_features)
        if x.shape[0] == 0:  # no tokens: there is no range to take
            return x.new_zeros(*shape[:-1], self.out_features, dtype=torch.float32)
        if self.per_token:
            # lo + step * codes per token: the product of the codes, scaled per token, plus lo times each output's
            # weight sum, plus the bias
            q, lo, step = compiled_quantize_per_token(x, self.inv_scale, 2 * self.kernel.levels + 1)
            y = torch.ops.onednn.qlinear_pointwise.tensor(
                q, _ONE, _ZERO, self._packed, self.weight_scale, self._zero_points, None, 1.0, 0,
                torch.float32, "none", [], "")
            offset = lo * self._rowsum if self.bias is None else torch.addcmul(self.bias, lo, self._rowsum)
            y = torch.addcmul(offset, y, step)
        elif self.kernel.name == "fbgemm":  # reduce_range: 7-bit activations, quantized inside the kernel
            x = x * self.inv_scale
            # fbgemm takes the call's range over the finite values and gives finite outputs for a NaN (an infinity
            # it answers non-finite): a NaN has no range, and every output of the call is NaN, as on oneDNN. amax
            # carries a NaN; one read of it is 1-3% of the product (MiniLM's shapes, one thread)
            if bool(x.amax().isnan()):
                return x.new_full((*shape[:-1], self.out_features), float("nan"))
            y = torch.ops.quantized.linear_dynamic(x, self._packed, True)
            if self.activation is not None:  # fused on oneDNN; a layer fused there and loaded here applies it after
                y = self.activation(y)
        else:
            try:
                q, step, zero_point = quantize_per_call(x, self.inv_scale, self.kernel.activation_bits)
            except RuntimeError:
                if bool(torch.isfinite(x).all()):
                    raise
                # a NaN or inf has no range: every output of the call is NaN, as its one scale would make it
                return x.new_full((*shape[:-1], self.out_features), float("nan"), dtype=torch.float32)
            autocast_bf16 = torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
            y = torch.ops.onednn.qlinear_pointwise(
                q, step, zero_point, self._packed, self.weight_scale, self._zero_points, self.bias, 1.0, 0,
                torch.bfloat16 if autocast_bf16 else torch.float32, self.post_op[0], [], self.post_op[1])
        y = y.reshape(*shape[:-1], self.out_features)
        # The int8 kernels have no backward: without this, gradients through them would be silently wrong
        # (PyTorch only warns), so a backward pass through an int8 projection is refused instead.
        return without_backward(y, x, NOT_FOR_TRAINING)

    def refuse_training(self) -> None:
        """Raise: int8 is for inference only (a bertkit model asks before switching any module to training)."""
        raise BertkitError(NOT_FOR_TRAINING)

    def train(self, mode: bool = True) -> Int8Linear:
        if mode:
            self.refuse_training()
        return super().train(False)

    def extra_repr(self) -> str:
        per = "per token" if self.per_token else "per call"
        return (f"in_features={self.in_features}, out_features={self.out_features}, int8 weights per output channel, "
                f"{self.kernel.activation_bits}-bit activations {per} on {self.kernel.name}, post_op={self.post_op[0]}")


NOT_TRACEABLE = ("an int8 model cannot be traced (torch.jit.trace, ONNX export): its kernels' packed weights are "
                 "opaque to a trace; trace or export the float model it was quantized from")


def _uncompiled_forward() -> Callable:
    """``Int8Linear._forward`` behind ``torch.compiler.disable``, made where torch.compile first traces an int8
    projection: the decorator imports torch._dynamo (over a second), which an eager process never needs."""
    if not _UNCOMPILED:
        _UNCOMPILED.append(torch.compiler.disable(Int8Linear._forward))
    return _UNCOMPILED[0]


_UNCOMPILED: list[Callable] = []

NOT_FOR_TRAINING = ("an int8 model is for inference only (its int8 kernels have no backward): train or fine-tune "
                    "the fp32 checkpoint, then quantize it (quantize='int8', --int8) to predict")


def without_backward(y: Tensor, x: Tensor, refusal: str) -> Tensor:
    """``y``, computed from ``x`` by kernels autograd does not see (int8's, oneDNN's prepared Linear), as a result of
    ``x`` whose backward pass refuses with ``refusal``: PyTorch alone would only warn and give wrong gradients."""
    return _NoBackward.apply(y, x, refusal) if torch.is_grad_enabled() and x.requires_grad else y


class _NoBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, y: Tensor, x: Tensor, refusal: str) -> Tensor:
        ctx.refusal = refusal
        return y.view_as(y)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, Tensor, None]:
        raise BertkitError(ctx.refusal)
