"""What the machine can do fast: checked where a setting would silently run slow on it."""

from __future__ import annotations

import functools
import logging

import torch

logger = logging.getLogger("bertkit")


def cpu_has_bf16() -> bool:
    """True when oneDNN has bf16 kernels on this CPU (AVX512-BF16 or AMX); False on AVX2-only CPUs."""
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


def physical_memory_bytes() -> int | None:
    """This machine's physical memory in bytes, or None where the OS does not say (no sysconf: Windows)."""
    import os

    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None
