"""What the machine can do: which device a run uses (``resolve_device``, the one place that decides it), whether
int8 can run here, and what runs fast, checked where a setting would silently run slow on it."""

from __future__ import annotations

import functools
import logging
import platform

import torch
from torch import Tensor

from bertkit.errors import BertkitError

logger = logging.getLogger("bertkit")


def cpu_has_bf16() -> bool:
    """True when this CPU computes bf16 in hardware: AVX512-BF16 or AMX on x86; on other CPUs (Arm), when oneDNN
    has bf16 kernels for it.

    oneDNN's own answer (``torch.ops.mkldnn._is_mkldnn_bf16_supported``) is also yes on x86 CPUs with AVX-512 but
    neither (Skylake to Ice Lake Xeons), where it emulates bf16 slower than fp32: int8's float parts, which run in
    bf16 by default where this is True, would silently run slower there, so x86 asks for the instructions."""
    if platform.machine().lower() in ("x86_64", "amd64", "i386", "i686"):
        cpu = torch.cpu
        return bool(getattr(cpu, "_is_avx512_bf16_supported", lambda: False)()
                    or getattr(cpu, "_is_amx_tile_supported", lambda: False)())
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # a build without oneDNN: no fast bf16 either
        return False


@functools.cache
def warn_if_bf16_is_emulated(device_type: str) -> bool:
    """Warn (once per process) when bf16 is asked for on a CPU without bf16 instructions: the kernels then
    convert to fp32 and back, and run several times slower than fp32 (BENCHMARKS.md). Returns whether it warned."""
    if device_type != "cpu" or cpu_has_bf16():
        return False
    logger.warning("bf16 was requested, but this CPU has no bf16 instructions (AVX512-BF16 or AMX; PyTorch "
                   "reports %s): bf16 runs emulated, several times slower than fp32. Leave bf16 off here.",
                   torch.backends.cpu.get_cpu_capability())
    return True


# Quantized engines with per-channel int8 dynamic Linear kernels for x86 (fbgemm, and "x86" which wraps it).
X86_ENGINES = ("x86", "fbgemm")


def check_x86_engine() -> None:
    """Refuse, naming the fix, a PyTorch build with no int8 kernel for this CPU: neither oneDNN's quantized Linear
    (exact here at 7 or 8 bits) nor an x86 quantized engine for torch.ao's dynamic Linear."""
    engines = list(torch.backends.quantized.supported_engines)
    if any(e in engines for e in X86_ENGINES):
        return
    if not onednn_int8_exact(63):  # 7-bit codes: what every x86 CPU with AVX2 runs exactly
        raise BertkitError(f"int8 needs oneDNN's quantized Linear (torch.ops.onednn.qlinear_pointwise) or PyTorch's "
                           f"fbgemm or x86 quantized engine (x86 CPUs with AVX2), but this PyTorch build has neither "
                           f"(its quantized engines: {engines}); run the fp32 model here (without int8)")


def resolve_device(spec: str | torch.device, local_rank: int = 0, *, int8: bool = False, bf16: bool = False) -> str:
    """The one answer to "which device does this run on", for training, pipelines, commands and int8 models.

    ``auto``: CUDA when present, else the CPU. A bare ``cuda`` (or ``auto`` on a GPU machine) is this process's
    GPU, ``cuda:LOCAL_RANK`` (0 outside torchrun), so N processes on a node use N GPUs without any flag. A device
    this machine does not have is an error naming it (PyTorch's own would be an AssertionError from inside
    ``.to``). With ``int8``: the CPU (``auto`` means it), or an error naming why int8 cannot run here and the fix
    (bf16 on a CPU without bf16 instructions, a GPU or MPS device, a PyTorch with no int8 kernel for this CPU)."""
    if int8:
        return _int8_device(spec, bf16)
    spec = str(spec).strip()
    if spec == "auto":
        spec = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        dev = torch.device(spec)
    except (RuntimeError, TypeError):
        raise BertkitError(f"device {spec!r} is not a device: use auto, cpu, cuda or cuda:N") from None
    if dev.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise BertkitError(f"device {spec!r}: PyTorch sees no CUDA GPU here; use cpu (or auto)")
        if dev.index is None and local_rank >= count:
            raise BertkitError(f"LOCAL_RANK {local_rank} has no GPU: this node has {count}; "
                               "launch at most that many processes per node (--nproc_per_node)")
        if dev.index is not None and dev.index >= count:
            raise BertkitError(f"device {spec!r}: this machine has {count} GPU(s), cuda:0..cuda:{count - 1}")
        return f"cuda:{local_rank if dev.index is None else dev.index}"
    if dev.type == "mps" and not torch.backends.mps.is_available():
        raise BertkitError(f"device {spec!r}: PyTorch sees no MPS device here; use cpu (or auto)")
    return str(dev)


def _int8_device(spec: str | torch.device, bf16: bool) -> str:
    if bf16 and not cpu_has_bf16():
        # int8 with bf16 runs what stays float (attention, GELU, LayerNorm, the projections kept fp32) in bf16
        raise BertkitError("int8 with bf16 runs the layers int8 leaves in float in bf16, and this CPU has no bf16 "
                           "instructions (AVX512-BF16 or AMX: emulated, several times slower): drop bf16, int8 alone "
                           "is the fast path here (docs/inference.md, section int8)")
    if isinstance(spec, str) and spec.strip() == "auto":
        spec = "cpu"  # int8 runs on the CPU only, so that is the device auto picks for it
    try:
        dev = torch.device(spec)
    except (RuntimeError, TypeError):
        raise BertkitError(f"device {spec!r} is not a device: int8 runs on cpu") from None
    if dev.type != "cpu":
        raise BertkitError(f"int8 runs on the CPU only (its kernels, oneDNN's and fbgemm's, are for x86 CPUs), "
                           f"device is {str(spec)!r}; use device cpu for int8, or run the fp32 model (or bf16) "
                           "on the GPU")
    check_x86_engine()
    return str(dev)


def _probe_operands(levels: int) -> tuple[Tensor, Tensor]:
    """Codes (17, 64) and int8 weights (16, 64) for the exactness probes: runs of equal extreme values, of both
    signs, are what saturate a pairwise int16 sum (127*127 + 127*127 > 32767), and oneDNN may run a narrower
    kernel than the CPU flags say (``ONEDNN_MAX_CPU_ISA``), so the probes multiply such runs and compare with int32
    arithmetic."""
    a = torch.tensor([[levels] * 32 + [-levels - 1] * 16 + [-levels, levels, 5, -3] * 4] * 17, dtype=torch.int8)
    b = torch.tensor([[127] * 32 + [-128] * 16 + [-3, 5, 127, -127] * 4] * 16, dtype=torch.int8)
    return a, b


def _probe(probe):
    """A hardware probe: run once per process (cached: a model's every layer asks) and in plain fp32 arithmetic on
    the CPU, whatever context its first caller is in, often a model's forward pass. Under bf16 autocast ``F.linear``
    computed the reference in bf16 (a dtype error); under a caller's ``torch.set_default_device("cuda")`` the
    probe's tensors would be made there. The contexts here are the calling thread's own; the default dtype (a
    process-wide setting, which a caller's ``set_default_dtype(torch.float64)`` changes) is not touched: every
    float tensor the probes make names float32."""
    @functools.wraps(probe)
    def run(*args, **kwargs):
        with torch.autocast("cpu", enabled=False), torch.no_grad(), torch.device("cpu"):
            return probe(*args, **kwargs)
    return functools.cache(run)


@_probe
def int_mm_exact() -> bool:
    """Whether ``torch._int_mm`` (int8 x int8 -> int32) sums full 8-bit codes exactly here
    (``bertkit.quantization.device.per_token_supported``)."""
    a, b = _probe_operands(127)
    try:
        return bool(torch.equal(torch._int_mm(a, b.t().contiguous()), a.int() @ b.t().int()))
    except RuntimeError:  # an older PyTorch without the CPU kernel
        return False


@_probe
def onednn_int8_exact(levels: int) -> bool:
    """Whether oneDNN's quantized Linear sums uint8 codes shifted by ``levels + 1`` (127: 8-bit activations, 63:
    7-bit) times int8 weights exactly here (``bertkit.quantization.device.onednn_supported``)."""
    a, b = _probe_operands(levels)
    a = a.clamp(-levels, levels)  # uint8 after the shift: the codes are symmetric
    try:
        packed = torch.ops.onednn.qlinear_prepack(b, None)
        y = torch.ops.onednn.qlinear_pointwise.tensor(
            (a.to(torch.int16) + levels + 1).to(torch.uint8), torch.tensor(1.0, dtype=torch.float32),
            torch.tensor(levels + 1), packed, torch.ones(16, dtype=torch.float32), torch.zeros(16, dtype=torch.int64),
            None, 1.0, 0, torch.float32, "none", [], "")
        return bool(torch.equal(y, (a.int() @ b.t().int()).float()))
    except (AttributeError, RuntimeError):  # a PyTorch without the operator, or a build without oneDNN
        return False


@_probe
def onednn_linear() -> bool:
    """Whether oneDNN's Linear (``torch.ops.mkldnn._linear_pointwise`` over a weight reordered once by
    ``_reorder_linear_weight``: the kernels Inductor's CPU backend calls) runs here and agrees with ``F.linear``
    within fp32 rounding, the GELU fused into it included: where CPU inference runs its projections on it
    (``bertkit.inference.prepare.PreparedLinear``), and elsewhere on ``F.linear`` (a build without oneDNN, a
    non-x86 CPU)."""
    if platform.machine().lower() not in ("x86_64", "amd64") or not torch.backends.mkldnn.is_available():
        return False
    g = torch.Generator().manual_seed(0)
    f32 = torch.float32  # named, not the default dtype: a caller may have set float64
    x, w, b = (torch.randn(5, 48, generator=g, dtype=f32), torch.randn(24, 48, generator=g, dtype=f32),
               torch.randn(24, generator=g, dtype=f32))
    try:
        packed = torch.ops.mkldnn._reorder_linear_weight(w, 64)
        y = torch.ops.mkldnn._linear_pointwise(x, packed, b, "gelu", [], "none")
    except (AttributeError, RuntimeError):
        return False
    return bool(torch.allclose(y, torch.nn.functional.gelu(torch.nn.functional.linear(x, w, b)), atol=1e-4, rtol=1e-5))


@functools.cache
def onednn_bf16_linear() -> bool:
    """``onednn_linear`` for bf16 inference: only where the CPU has bf16 instructions (``cpu_has_bf16``); elsewhere
    bf16 runs emulated, and ``F.linear`` over bf16 weights."""
    return onednn_linear() and cpu_has_bf16()
