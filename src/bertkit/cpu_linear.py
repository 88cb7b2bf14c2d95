"""How the encoder's Linear layers run: ``linear(module, x)`` for a layer, ``linear_with(owner, x, W, b)`` for a
product of several (the fused q/k/v projection), kept apart from the forward pass in ``modeling.py``.

Under autograd, on GPUs, while tracing, or for anything but a plain ``nn.Linear`` (a peft wrapper, a hooked
module) they are ``F.linear`` / ``module(x)``. In CPU inference the weights are prepared once and kept while
the parameters are unchanged (``_derived``):
- fp32: on oneDNN's Linear over the weight reordered into its blocked layout, the feed-forward's activation fused
  (``_onednn_linear``, where ``_hardware.onednn_linear``): 10-27% faster than ATen's ``addmm`` (MKL) on MiniLM;
- bf16 autocast: the same kernel over a reordered bf16 weight (``_hardware.onednn_bf16_linear``), else
  ``F.linear`` over bf16 copies (``_bf16_copies``); either way the bits autocast's own cast gives, without
  casting the weights on every call.
BENCHMARKS.md, sections "Linear layers on oneDNN" and "Attention at any key length, ... bf16 weights cast once".
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.optim.optimizer import register_optimizer_step_post_hook

from bertkit._hardware import onednn_bf16_linear, onednn_linear
from bertkit.padding import is_tracing

_GLOBAL_HOOKS = (nn.modules.module._global_forward_hooks, nn.modules.module._global_forward_pre_hooks,
                 nn.modules.module._global_backward_hooks, nn.modules.module._global_backward_pre_hooks)


def plain_linear(module: nn.Module) -> bool:
    """An ``nn.Linear`` itself (not a subclass, not wrapped by peft, no hooks of its own or global ones, no
    patched forward as accelerate's offloading hooks write), with a bias: one whose call is exactly
    ``F.linear(x, weight, bias)``, so its weights may be prepared, and three of them run as one GEMM, unnoticed."""
    return (type(module) is nn.Linear and module.bias is not None and not module._forward_hooks
            and not module._forward_pre_hooks and not module._backward_hooks and not module._backward_pre_hooks
            and "forward" not in module.__dict__ and not any(_GLOBAL_HOOKS))


def linear(module: nn.Module, x: Tensor, act: nn.Module | None = None) -> Tensor:
    """``act(module(x))`` (``act`` None: ``module(x)``), through ``linear_with`` for a plain ``nn.Linear``."""
    if plain_linear(module):
        return linear_with(module, x, module.weight, module.bias, act)
    y = module(x)
    return y if act is None else act(y)


def linear_with(owner: nn.Module, x: Tensor, weight: Tensor, bias: Tensor | None, act: nn.Module | None = None,
                sources: tuple[Tensor, ...] | None = None) -> Tensor:
    """``act(F.linear(x, weight, bias))``; in CPU inference over weights prepared once and kept on ``owner`` while
    ``sources`` (the parameters ``weight`` and ``bias`` come from; by default the two themselves) are unchanged."""
    if _cpu_bf16_inference(x):
        if onednn_bf16_linear():
            return _onednn_linear(owner, x, weight, bias, act, torch.bfloat16, sources)
        y = F.linear(x, *_bf16_copies(owner, weight, bias, sources))
    elif _cpu_fp32_inference(x, weight):
        return _onednn_linear(owner, x, weight, bias, act, torch.float32, sources)
    else:
        y = F.linear(x, weight, bias)
    return y if act is None else act(y)


def _cpu_bf16_inference(x: Tensor) -> bool:
    """Inside bf16 autocast on the CPU, without autograd: where ``linear_with`` reads bf16 weights prepared once."""
    return (x.device.type == "cpu" and not torch.is_grad_enabled() and torch.is_autocast_enabled("cpu")
            and torch.get_autocast_dtype("cpu") == torch.bfloat16 and not is_tracing())


def _cpu_fp32_inference(x: Tensor, weight: Tensor) -> bool:
    """fp32 on the CPU without autograd or autocast, where oneDNN's Linear runs (``_hardware.onednn_linear``):
    where ``linear_with`` reads weights reordered once for it."""
    return (x.device.type == "cpu" and x.dtype == torch.float32 and weight.dtype == torch.float32
            and type(weight.data) is Tensor and not torch.is_grad_enabled()
            and not torch.is_autocast_enabled("cpu") and not is_tracing() and onednn_linear())


# Optimiser steps taken in this process (any optimiser: a global step hook counts them). PyTorch's fused AdamW
# kernel updates parameters in place without bumping their version counters, so ``_derived`` also keys on this.
_optimizer_steps = 0


def _count_optimizer_step(*_: Any) -> None:
    global _optimizer_steps
    _optimizer_steps += 1


register_optimizer_step_post_hook(_count_optimizer_step)


def _derived(owner: nn.Module, name: str, sources: tuple[Tensor, ...], make) -> Any:
    """``make()`` (a tensor or tuple derived from ``sources``: a cast, a reordering), computed once and kept on
    ``owner`` as ``name`` (outside its state dict) for as long as ``sources`` are unchanged.

    It is kept with aliases of the source tensors: while they live, their memory cannot be reused by another
    tensor, so an equal ``data_ptr`` means the same memory, and an equal ``_version`` means no in-place change
    since (``load_state_dict``, ``copy_``, most optimisers). The fused q/k/v projection is a view of three
    parameters, each with its own version: all three are sources. Any optimiser step in the process also derives
    again: the fused AdamW kernel (bertkit's and transformers' Trainer's default) changes the parameters without
    bumping their versions. Edits through ``.data`` are not seen (their version counter is another)."""
    key = [_optimizer_steps, *((t.data_ptr(), t._version, t.shape, t.dtype) for t in sources)]
    cached = owner.__dict__.get(name)
    if cached is None or cached[0] != key:
        cached = _Cached((key, tuple(t.detach() for t in sources), make()))
        owner.__dict__[name] = cached
    return cached[2]


class _Cached(tuple):
    """``_derived``'s (key, aliases, value). ``copy.deepcopy`` and pickling (``torch.save(model)``) leave it out (the
    copy derives its own on its first call): a weight reordered for oneDNN is an opaque tensor neither can copy."""

    def __deepcopy__(self, memo: dict) -> None:
        return None

    def __reduce__(self) -> tuple:
        return _dropped, ()


def _dropped() -> None:
    return None


def _sources(weight: Tensor, bias: Tensor | None, sources: tuple[Tensor, ...] | None) -> tuple[Tensor, ...]:
    return tuple(t for t in (weight, bias) if t is not None) if sources is None else sources


def _bf16_copies(owner: nn.Module, weight: Tensor, bias: Tensor | None,
                 sources: tuple[Tensor, ...] | None = None) -> tuple[Tensor, Tensor | None]:
    """``weight`` and ``bias`` in bf16, cast once and kept on ``owner`` (``_derived``).

    Autocast casts a Linear's fp32 weight to bf16 on every call (its own cache lasts one autocast region, one
    forward), which cost 10-17% of a bf16 forward of MiniLM on short inputs. The copy holds the same rounded
    values autocast's cast makes, so outputs are bit-identical."""
    return _derived(owner, "_bf16_copies", _sources(weight, bias, sources), lambda: (
        weight.detach().to(torch.bfloat16), None if bias is None else bias.detach().to(torch.bfloat16)))


# oneDNN's fused post-operations for the feed-forward activations (``_linear_pointwise``'s attr and algorithm).
_ONEDNN_ACTIVATIONS = {("GELU", "none"): ("gelu", "none"), ("GELU", "tanh"): ("gelu", "tanh"),
                       ("ReLU", None): ("relu", "")}


def _onednn_linear(owner: nn.Module, x: Tensor, weight: Tensor, bias: Tensor | None, act: nn.Module | None,
                   dtype: torch.dtype, sources: tuple[Tensor, ...] | None = None) -> Tensor:
    """act(x W^T + b) in ``dtype`` (fp32, or bf16 in CPU bf16 inference) on oneDNN's Linear, over ``weight`` in
    ``dtype`` reordered once into oneDNN's blocked layout (kept on ``owner``, ``_derived``: as much memory again as
    the weight in that dtype). In fp32 the activation is fused where oneDNN has it; in bf16 it runs after, on the
    bf16 product, so the result keeps autocast's bits (a fused GELU would round once instead of twice). The
    reordering's batch-size hint only picks the layout: any number of rows runs (1,024: about a batch of 32
    sentences)."""
    packed, b = _derived(owner, f"_onednn_{str(dtype).removeprefix('torch.')}", _sources(weight, bias, sources),
                         lambda: (torch.ops.mkldnn._reorder_linear_weight(weight.detach().to(dtype), 1024),
                                  None if bias is None else bias.detach().to(dtype)))
    fused = None
    if act is not None and dtype == torch.float32:
        fused = _ONEDNN_ACTIVATIONS.get((type(act).__name__, getattr(act, "approximate", None)))
    attr, algorithm = fused or ("none", "")
    y = torch.ops.mkldnn._linear_pointwise(x.to(dtype), packed, b, attr, [], algorithm)
    return y if act is None or fused else act(y)
