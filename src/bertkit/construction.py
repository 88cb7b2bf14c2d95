"""Building a model's layers: each draws its initial weights, except while ``from_pretrained`` builds a model it is
about to load (the checkpoint sets every value; what it lacks is initialised after loading)."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch

# While from_pretrained builds a model it is about to load, constructors skip their random draws (the weights would
# overwrite them); what the checkpoint lacks is initialised after loading.
_BUILDING_TO_LOAD: ContextVar[bool] = ContextVar("bertkit_building_to_load", default=False)


@contextmanager
def building_to_load() -> Iterator[None]:
    """Inside, constructors skip their random draws (``from_pretrained``: the weights loaded next set them)."""
    token = _BUILDING_TO_LOAD.set(True)
    try:
        yield
    finally:
        _BUILDING_TO_LOAD.reset(token)


def initialise_on_construction() -> bool:
    """Whether a model's constructor draws its initial weights: always, except inside ``from_pretrained``."""
    return not _BUILDING_TO_LOAD.get()


def new_linear(in_features: int, out_features: int, bias: bool = True) -> torch.nn.Linear:
    """``nn.Linear``; inside ``from_pretrained`` without its default draw (loading sets every value)."""
    if initialise_on_construction():
        return torch.nn.Linear(in_features, out_features, bias=bias)
    return empty_linear(in_features, out_features, bias)


def empty_linear(in_features: int, out_features: int, bias: bool = True) -> torch.nn.Linear:
    """``nn.Linear`` with uninitialised weights, for a caller that sets them all. Drawn on the meta device (no work),
    then given empty weights: torch's skip_init makes them with empty_like on meta tensors, through torch._refs, whose
    first call imports sympy and the symbolic shapes (0.5 s of a process)."""
    layer = torch.nn.Linear(in_features, out_features, bias=bias, device="meta")
    layer.weight = torch.nn.Parameter(torch.empty(out_features, in_features))
    if bias:
        layer.bias = torch.nn.Parameter(torch.empty(out_features))
    return layer


def new_embedding(num_embeddings: int, embedding_dim: int, padding_idx: int | None = None) -> torch.nn.Embedding:
    """``nn.Embedding``, skipping its default draw inside ``from_pretrained`` (see ``new_linear``)."""
    if initialise_on_construction():
        return torch.nn.Embedding(num_embeddings, embedding_dim, padding_idx=padding_idx)
    # a weight given is not drawn; skip_init's draw on the meta device goes through torch._refs, whose first call
    # imports torch._dynamo: 2 s of every process's first from_pretrained
    return torch.nn.Embedding(num_embeddings, embedding_dim, padding_idx=padding_idx,
                              _weight=torch.empty(num_embeddings, embedding_dim))


def copy_model(model: torch.nn.Module) -> torch.nn.Module:
    """``copy.deepcopy(model)`` where a module holds a tensor computed from its parameters as a plain attribute:
    ``torch.nn.utils.prune`` keeps ``weight = weight_orig * weight_mask`` so, which ``deepcopy`` refuses ("Only
    Tensors created explicitly by the user (graph leaves) support the deepcopy protocol") until a forward pass under
    ``no_grad`` recomputes it. Such a tensor is copied detached: the hook that computed it computes it again from the
    copy's own parameters at the copy's next call."""
    memo: dict[int, object] = {}
    for module in model.modules():
        for value in vars(module).values():
            if isinstance(value, torch.Tensor) and not value.is_leaf:
                memo[id(value)] = value.detach().clone()
    return copy.deepcopy(model, memo)
