"""transformers' object habits, kept out of the forward pass: output access and module paths people type.

Code written for transformers indexes outputs (``out[0]``, ``out["logits"]``, ``out.keys()``), and
fine-tuning recipes walk ``model.bert.encoder.layer[i]`` to freeze the lower layers. bertkit's modules are
named for what they do (``BertModel.layers``), so these are views onto the same objects, never copies:
freezing through a view freezes the model.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, ClassVar

from torch import nn


class TupleAccess:
    """transformers' ``ModelOutput`` habits: ``out[0]``, ``out["logits"]``, ``out.to_tuple()``, ``keys()``,
    ``items()``, ``values()``. The tuple holds the fields transformers' output class has, in its order,
    leaving out those that are None (as it does)."""

    tuple_fields: ClassVar[tuple[str, ...]] = ()

    def keys(self) -> list[str]:
        return [f for f in self.tuple_fields if getattr(self, f) is not None]

    def values(self) -> list[Any]:
        return [getattr(self, f) for f in self.keys()]

    def items(self) -> list[tuple[str, Any]]:
        return [(f, getattr(self, f)) for f in self.keys()]

    def to_tuple(self) -> tuple[Any, ...]:
        return tuple(self.values())

    def __getitem__(self, key: int | slice | str) -> Any:
        if isinstance(key, str):
            if key not in self.tuple_fields:
                raise KeyError(f"{key!r}: this output has {', '.join(self.tuple_fields)}")
            return getattr(self, key)
        return self.to_tuple()[key]

    def __contains__(self, key: object) -> bool:
        return key in self.keys()

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys())  # as a dict (transformers' ModelOutput is an OrderedDict)

    def __len__(self) -> int:
        return len(self.keys())


class EncoderView:
    """``model.bert.encoder.layer[i]``: transformers' path to the encoder layers, onto ``BertModel.layers``."""

    def __init__(self, layers: nn.ModuleList):
        self.layer = layers

    def parameters(self, recurse: bool = True):
        return self.layer.parameters(recurse)

    def __repr__(self) -> str:
        return f"EncoderView(layer={len(self.layer)} x {type(self.layer[0]).__name__ if len(self.layer) else '-'})"


def tied_output_embeddings(word_embeddings: nn.Embedding, bias: nn.Parameter) -> nn.Linear:
    """The MLM decoder as transformers shows it (``get_output_embeddings()``): a ``Linear(H, V)`` whose weight
    *is* the word-embedding matrix and whose bias is the head's output bias (tied, as google-research/bert
    ties them), built around the model's own parameters on each call, so it never holds a copy."""
    linear = nn.Linear.__new__(nn.Linear)
    nn.Module.__init__(linear)
    linear.in_features, linear.out_features = word_embeddings.embedding_dim, word_embeddings.num_embeddings
    linear.weight, linear.bias = word_embeddings.weight, bias
    return linear
