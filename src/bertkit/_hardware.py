"""What the machine can do: which device a run uses (``resolve_device``, the one place that decides it), whether
int8 can run here, and what runs fast, checked where a setting would silently run slow on it."""

from __future__ import annotations

import functools
import logging
import os
import platform
from dataclasses import dataclass

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
        if torch.backends.cpu.get_cpu_capability() in ("DEFAULT", "AVX2"):  # ATen held below AVX-512
            return False  # (ATEN_CPU_CAPABILITY=avx2, how an AVX2-only CPU is emulated): its kernels have no bf16 either
        cpu = torch.cpu
        return (_onednn_bf16() and bool(getattr(cpu, "_is_avx512_bf16_supported", lambda: False)()
                                         or getattr(cpu, "_is_amx_tile_supported", lambda: False)()))
    return _onednn_bf16()


def _onednn_bf16() -> bool:
    """oneDNN's own answer: False where it is held below AVX-512 (``ONEDNN_MAX_CPU_ISA=AVX2``, the other half of the
    AVX2 emulation) or where this build has no oneDNN."""
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


# PyTorch's quantized engines whose dynamic int8 Linear is fbgemm's (x86 CPUs; "x86" wraps fbgemm).
X86_ENGINES = ("x86", "fbgemm")


@dataclass(frozen=True)
class Int8Kernel:
    """The int8 GEMM this machine runs, and the activation width at which it is exact."""

    name: str  # "onednn" (oneDNN's quantized Linear) or "fbgemm" (torch.ao's dynamic Linear)
    activation_bits: int  # 8 or 7

    @property
    def levels(self) -> int:
        """Codes run from -levels to levels around the call's zero point (127 at 8 bits, 63 at 7)."""
        return 127 if self.activation_bits == 8 else 63


@functools.cache
def int8_kernel() -> Int8Kernel | None:
    """The one int8 path for this CPU class, chosen by measurement (BENCHMARKS.md, "int8 kernels"); None where
    this PyTorch has no exact int8 kernel here.

    - AVX512-VNNI or AMX: oneDNN's quantized Linear at 8-bit activations (``vpdpbusd`` / AMX sum into int32):
      1.02-1.07x fbgemm on a VNNI EPYC, 1.13-1.18x with AMX.
    - AVX2 without VNNI: fbgemm at 7-bit activations. ``vpmaddubsw`` sums two products into int16, which 8-bit
      codes overflow (2 x 255 x 127 > 32767) and 7-bit ones cannot; oneDNN at 7 bits ran 0.83-0.87x, and is the
      path where this PyTorch no longer ships torch.ao's kernel.

    Decided by running the kernels, not by the CPU flags: oneDNN may be held to a narrower ISA than the CPU has
    (``ONEDNN_MAX_CPU_ISA``), and the tests take their expectations from here."""
    # oneDNN's kernel takes codes that PyTorch's dynamic quantization makes (kernels.quantize_per_call)
    dynamic = hasattr(torch, "quantize_per_tensor_dynamic")
    if dynamic and onednn_int8_exact(127):
        return Int8Kernel("onednn", 8)
    if fbgemm_int8():
        return Int8Kernel("fbgemm", 7)
    if dynamic and onednn_int8_exact(63):
        return Int8Kernel("onednn", 7)
    return None


def cpu_class() -> str:
    """The CPU class whose paths this process runs, as the probes that choose them see it (what benchmarks report):
    ``"avx512-bf16"`` (``cpu_has_bf16``), ``"avx512-vnni"`` (int8 exact at 8 bits), ``"avx2"``, else PyTorch's kernel
    capability in lower case. A process held to a narrower ISA (how an AVX2-only CPU is emulated) is of that class."""
    if cpu_has_bf16():
        return "avx512-bf16"
    kernel = int8_kernel()
    if kernel is not None and kernel.activation_bits == 8:
        return "avx512-vnni"
    if kernel is not None or torch.backends.cpu.get_cpu_capability() == "AVX2":
        return "avx2"
    return torch.backends.cpu.get_cpu_capability().lower()


def fbgemm_int8() -> bool:
    """Whether this PyTorch still has torch.ao's dynamic int8 Linear on fbgemm (deprecated, removal scheduled)."""
    try:
        return (hasattr(torch.ops.quantized, "linear_dynamic")
                and any(e in torch.backends.quantized.supported_engines for e in X86_ENGINES))
    except (AttributeError, RuntimeError):
        return False


def check_int8_kernel() -> Int8Kernel:
    """This machine's int8 kernel, or an error naming why there is none and the fix."""
    kernel = int8_kernel()
    if kernel is None:
        raise BertkitError(f"int8 needs oneDNN's quantized Linear (torch.ops.onednn.qlinear_pointwise) or PyTorch's "
                           f"fbgemm quantized engine (x86 CPUs with AVX2), and this PyTorch build has neither here "
                           f"(its quantized engines: {list(torch.backends.quantized.supported_engines)}); run the "
                           "fp32 model here (without int8)")
    return kernel


def check_onednn_int8(activation_bits: int) -> Int8Kernel:
    """oneDNN's quantized Linear at ``activation_bits``, which the per-token projections run on every class (fbgemm's
    dynamic Linear takes one activation scale per call), or an error naming why it cannot run here and the fix."""
    kernel = Int8Kernel("onednn", activation_bits)
    if not onednn_int8_exact(kernel.levels):
        raise BertkitError(f"int8 runs its per-token projections on oneDNN's quantized Linear "
                           f"(torch.ops.onednn.qlinear_pointwise), which this PyTorch build does not compute exactly at "
                           f"{activation_bits}-bit activations here; run the fp32 model here (without int8)")
    return kernel


def host_workers(device_type: str) -> int:
    """Loader processes that tokenize and collate training batches ahead of the step: none on a CPU, where they
    would take cores from the step itself; on a GPU every core but two (the process driving the device and its
    pinned-memory thread), 2 to 4. On an H100 one BERT-BASE step of 64 SQuAD (question, paragraph) pairs took
    48 ms of kernels, and a loader worker tokenizes and collates about 3,100 such pairs per CPU second
    (bench/bench_datapath.py): two workers feed the step about 4.5x over, four about 9x; more would only cost their
    start (a fork of the whole training process each)."""
    if device_type != "cuda":
        return 0
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(2, min(4, cores - 2))


# The kinds of torch.device a model runs on here; resolve_device refuses every other kind (meta, xla, xpu, ...).
RUN_DEVICE_TYPES = ("cpu", "cuda", "mps")


def resolve_device(spec: str | int | torch.device, local_rank: int = 0, *, int8: bool = False,
                   bf16: bool = False) -> str:
    """The one answer to "which device does this run on", for training, pipelines, commands and int8 models.

    ``auto``: CUDA when present, else the CPU. A bare ``cuda`` (or ``auto`` on a GPU machine) is this process's GPU,
    ``cuda:LOCAL_RANK`` (0 outside torchrun), so N processes on a node use N GPUs without any flag. A device this
    machine does not have is an error naming it (PyTorch's own would be an AssertionError from inside ``.to``). An
    int is transformers' pipeline ``device``: -1 the CPU, N ``cuda:N``. With ``int8``: the CPU (``auto`` means it),
    or an error naming why int8 cannot run here and the fix (bf16 on a CPU without bf16 instructions, a GPU or MPS
    device, a PyTorch with no int8 kernel for this CPU).
    """
    if isinstance(spec, int) and not isinstance(spec, bool) and spec >= -1:
        spec = "cpu" if spec == -1 else f"cuda:{spec}"  # transformers' pipeline(device=): -1 the CPU, N its GPU N
    spec = str(spec).strip()
    if int8 and bf16 and not cpu_has_bf16():
        # int8 with bf16 runs what stays float (attention, GELU, LayerNorm, the projections kept fp32) in bf16
        raise BertkitError("int8 with bf16 runs the layers int8 leaves in float in bf16, and this CPU has no bf16 "
                           "instructions (AVX512-BF16 or AMX: emulated, several times slower): drop bf16, int8 alone "
                           "is the fast path here (docs/inference.md, section int8)")
    if spec == "auto":
        spec = "cuda" if torch.cuda.is_available() and not int8 else "cpu"  # int8 runs on the CPU only
    try:
        dev = torch.device(spec)
    except (RuntimeError, TypeError):
        raise BertkitError(f"device {spec!r} is not a device: use auto, cpu, cuda or cuda:N") from None
    if dev.type not in RUN_DEVICE_TYPES:
        # torch names more kinds than bertkit runs on; "meta" holds shapes and no numbers, so a model moved there
        # (sentence-transformers' encode(device=...) moves the model itself) has lost its weights for good
        raise BertkitError(f"device {spec!r}: bertkit runs models on {', '.join(RUN_DEVICE_TYPES)} (a {dev.type!r} "
                           "device " + ("holds no weights, so a model moved there would lose them" if dev.type == "meta"
                                        else "is not one") + "); use auto, cpu, cuda or cuda:N")
    if int8:
        if dev.type != "cpu":
            raise BertkitError(f"int8 runs on the CPU only (its kernels, oneDNN's and fbgemm's, are for x86 CPUs), "
                               f"device is {spec!r}; use device cpu for int8, or run the fp32 model (or bf16) on "
                               "the GPU")
        check_int8_kernel()
        return str(dev)
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


def _probe_operands(levels: int) -> tuple[Tensor, Tensor]:
    """Codes (17, 64) and int8 weights (16, 64) for the exactness probes: runs of equal extreme values, of both
    signs, are what saturate a pairwise int16 sum (127*127 + 127*127 > 32767), and oneDNN may run a narrower
    kernel than the CPU flags say (``ONEDNN_MAX_CPU_ISA``), so the probes multiply such runs and compare with int32
    arithmetic."""
    a = torch.tensor([[levels] * 32 + [-levels - 1] * 16 + [-levels, levels, 5, -3] * 4] * 17, dtype=torch.int8)
    b = torch.tensor([[127] * 32 + [-128] * 16 + [-3, 5, 127, -127] * 4] * 16, dtype=torch.int8)
    return a, b


def _probe(probe):
    """A hardware probe: run once per process (cached: every layer asks) in plain fp32 on the CPU, whatever context
    its first caller is in, often a forward pass (under bf16 autocast the reference would be bf16; under
    ``torch.set_default_device("cuda")`` the tensors would be made there). Every float tensor the probes make names
    float32, as a caller may have changed the default dtype."""
    @functools.wraps(probe)
    def run(*args, **kwargs):
        with torch.autocast("cpu", enabled=False), torch.no_grad(), torch.device("cpu"):
            return probe(*args, **kwargs)
    return functools.cache(run)


@_probe
def onednn_int8_exact(levels: int) -> bool:
    """Whether oneDNN's quantized Linear sums uint8 codes shifted by ``levels + 1`` (127: 8-bit activations, 63:
    7-bit) times int8 weights exactly here (``int8_kernel``)."""
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
def int_mm_exact() -> bool:
    """Whether ``torch._int_mm`` sums int8 times int8 products exactly in int32 here, the probes' saturating runs
    included (``sparse_encoder.screen.Int8ScreenedMaxLogits``). False on AVX2 without VNNI (oneDNN's kernel sums
    pairs of products in int16 there, and 127 x 127 x 2 overflows it) and in a PyTorch without the CPU kernel."""
    a, b = _probe_operands(127)
    try:
        return bool(torch.equal(torch._int_mm(a, b.t()), a.int() @ b.t().int()))
    except (AttributeError, RuntimeError):
        return False


@_probe
def onednn_linear() -> bool:
    """Whether oneDNN's Linear (``torch.ops.mkldnn._linear_pointwise`` over a weight reordered by
    ``_reorder_linear_weight``: the kernels Inductor's CPU backend calls) runs here and agrees with ``F.linear``
    within fp32 rounding, fused GELU included: where ``inference.prepare.PreparedLinear`` runs on it, else on
    ``F.linear`` (a build without oneDNN, a non-x86 CPU)."""
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

