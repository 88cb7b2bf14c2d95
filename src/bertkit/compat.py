"""transformers' object habits, kept out of the forward pass: output access and the tied MLM decoder.

Code written for transformers indexes outputs (``out[0]``, ``out["logits"]``, ``out.keys()``). Module paths
need nothing here: bertkit's modules carry transformers' names (``model.bert.encoder.layer[i]``).
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


def tied_output_embeddings(word_embeddings: nn.Embedding, bias: nn.Parameter) -> nn.Linear:
    """The MLM decoder as transformers shows it (``get_output_embeddings()``): a ``Linear(H, V)`` whose weight
    *is* the word-embedding matrix and whose bias is the head's output bias (tied, as google-research/bert
    ties them), built around the model's own parameters on each call, so it never holds a copy."""
    linear = nn.Linear.__new__(nn.Linear)
    nn.Module.__init__(linear)
    linear.in_features, linear.out_features = word_embeddings.embedding_dim, word_embeddings.num_embeddings
    linear.weight, linear.bias = word_embeddings.weight, bias
    return linear
