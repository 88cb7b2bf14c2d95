"""Where int8 runs: this machine's quantized engine and CPU instructions.

int8 runs on x86 CPUs only (PyTorch's fbgemm / x86 quantized engine), on fp32 models, for inference. This
module holds those decisions: whether the engine is there (``check_int8_support``), which activation width
is exact on this CPU (``int8_activation_bits``) and whether per-token projections run
(``per_token_supported``). Which device an int8 model runs on is ``bertkit._hardware.resolve_device``'s
answer (``int8=True``), as for every other model. ``_packing`` sets the engine while weights are packed.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from bertkit import _hardware
from bertkit._hardware import X86_ENGINES, check_x86_engine
from bertkit.errors import BertkitError

# The activation widths the kernels run at (``int8_activation_bits``: which one is exact on this CPU).
ACTIVATION_BITS = (7, 8)


def int8_activation_bits() -> int:
    """The activation width that is exact on this CPU: 8 with AVX512-VNNI, else 7.

    fbgemm multiplies uint8 activations by int8 weights. With AVX512-VNNI (``vpdpbusd``) the products are
    summed straight into int32, so full 8-bit activations are exact; without it (AVX2's ``vpmaddubsw``) two
    products are summed into int16 first, which 8-bit activations can overflow (2 x 255 x 127 > 32767), so
    PyTorch's default is 7 bits (``reduce_range``). The extra bit halves the activation rounding error, which
    lets the feed-forward output projections be int8 too (docs/inference.md, section int8)."""
    try:
        return 8 if torch.cpu.get_capabilities().get("avx512_vnni", False) else 7
    except (AttributeError, RuntimeError):  # an older PyTorch without the query: the safe width
        return 7


def check_int8_support(model: nn.Module) -> None:
    """Refuse, naming what is wrong and the fix, a model or machine that cannot run int8 dynamic Linear."""
    check_x86_engine()
    params = list(model.parameters())
    devices = sorted({p.device.type for p in params})
    if devices != ["cpu"]:
        raise BertkitError(f"int8 runs on the CPU only, the model is on {', '.join(devices)}; quantize the model "
                           "on the CPU (model.to('cpu')) and run it there")
    dtypes = sorted({str(p.dtype).removeprefix("torch.") for p in params if p.is_floating_point()})
    if dtypes != ["float32"]:
        raise BertkitError(f"int8 quantization starts from float32 weights, the model holds {', '.join(dtypes)}; "
                           "load it in float32 (model.float())")


@contextmanager
def _packing() -> Iterator[None]:
    """While int8 weights are packed: this machine's x86 quantized engine set (the kernels are chosen at
    packing), and torch.ao's deprecation warnings silenced (known, and stated in the package's docstring;
    users should not see them on every call)."""
    before = torch.backends.quantized.engine
    engine = next((e for e in X86_ENGINES if e in torch.backends.quantized.supported_engines), None)
    if engine is not None:  # without one, the layers run on oneDNN's operator (check_x86_engine)
        torch.backends.quantized.engine = engine
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r".*torch\.ao\.quantization is deprecated",
                                    category=DeprecationWarning)
            warnings.filterwarnings("ignore", message=r".*quantized tensor creation functions.*deprecated",
                                    category=UserWarning)
            yield
    finally:
        torch.backends.quantized.engine = before


def per_token_supported() -> bool:
    """Whether ``PerTokenInt8Linear`` runs exactly here: ``torch._int_mm`` (int8 x int8 -> int32, oneDNN) on a
    CPU with AVX512-VNNI, whose instructions sum the products straight into int32 (AVX2's pairwise int16 sums
    can saturate, as ``int8_activation_bits`` explains), and a PyTorch that has the CPU kernel."""
    return int8_activation_bits() == 8 and hasattr(torch, "_int_mm") and _hardware.int_mm_exact()


def onednn_supported(activation_bits: int = 8) -> bool:
    """Whether oneDNN's quantized Linear (``torch.ops.onednn.qlinear_pointwise``, the kernel Inductor's x86 int8
    path calls; uint8 activations with a zero point, int8 weights prepacked per output channel) computes exact
    integer sums here at ``activation_bits``. 8 bits (codes shifted into uint8 0..254) need AVX512-VNNI or AMX;
    7 bits (shifted into 1..127) are exact on AVX2 as well, where a pair of products summed into int16 stays
    below 2 x 127 x 127 (``int8_activation_bits``). The probe multiplies runs of the extreme codes, which would
    saturate a pairwise int16 sum, and compares with int32 arithmetic: oneDNN may run a narrower ISA than the CPU
    flags say (``ONEDNN_MAX_CPU_ISA``)."""
    if activation_bits not in ACTIVATION_BITS:
        raise BertkitError(f"activation_bits must be one of {ACTIVATION_BITS}, got {activation_bits!r}")
    if activation_bits == 8 and int8_activation_bits() != 8:
        return False
    return _hardware.onednn_int8_exact(127 if activation_bits == 8 else 63)
