"""Where int8 runs: on the CPU, from a float32 model, on this machine's one int8 kernel
(``bertkit._hardware.int8_kernel``, the one function that chooses it). Which device an int8 model runs on is
``bertkit._hardware.resolve_device``'s answer (``int8=True``), as for every other model."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from bertkit._hardware import X86_ENGINES, check_int8_kernel
from bertkit.errors import BertkitError


def check_int8_support(model: nn.Module) -> None:
    """Refuse, naming what is wrong and the fix, a model or machine that cannot run int8."""
    check_int8_kernel()
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
def packing() -> Iterator[None]:
    """While fbgemm's weights are packed: the x86 quantized engine set (the kernels are chosen at packing), and
    torch.ao's deprecation warnings silenced (known: ``_hardware.int8_kernel`` says when it is used)."""
    before = torch.backends.quantized.engine
    torch.backends.quantized.engine = next(e for e in X86_ENGINES if e in torch.backends.quantized.supported_engines)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r".*torch\.ao\.quantization is deprecated",
                                    category=DeprecationWarning)
            warnings.filterwarnings("ignore", message=r".*quantized tensor creation functions.*deprecated",
                                    category=UserWarning)
            yield
    finally:
        torch.backends.quantized.engine = before
