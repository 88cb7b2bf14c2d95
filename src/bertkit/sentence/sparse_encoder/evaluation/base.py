"""What the sparse evaluators share: the dense evaluator's ``embed`` hook replaced by sparse encoding, each
embedding kept until the evaluator has read its sparsity (``sparsity_of``), as sentence-transformers reports it."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import torch

from bertkit.errors import WholeSetting
from bertkit.sentence.evaluation.base import ResultsCsv, prefixed


class SparseEvaluator(ABC):
    """Placed before a dense evaluator (``class SparseTripletEvaluator(SparseEvaluator, TripletEvaluator)``): the
    dense evaluator's metrics on sparse (N, V) embeddings on the CPU (each row's ``max_active_dims`` largest
    weights; None: the model's), then ``sparsity_of``'s statistics of the embeddings, under the same name
    prefix. ``sparsity_stats`` keeps the last call's statistics. The results CSV is the dense evaluator's with the
    statistics' columns after its own (and every line ended ``\\r\\n``), as sentence-transformers writes it."""

    name: str
    csv_lineterminator = "\r\n"  # sentence-transformers rewrites the file with Python's csv writer to add the columns

    # the vocabulary size, which bounds it too, is the model's, checked by encode before the evaluator encodes
    max_active_dims = WholeSetting(none="the model's", bound=" (at most the model's vocabulary size)")

    def __call__(self, model: Any, output_path: str | None = None, epoch: int = -1, steps: int = -1) -> dict[str, float]:
        self._embedded: list[torch.Tensor] = []
        self._results: tuple[Any, list[str], list[Any]] | None = None
        try:
            metrics = super().__call__(model, output_path, epoch, steps)  # type: ignore[misc]
            self.sparsity_stats = self.sparsity_of(model, self._embedded)
        finally:
            self._embedded = []
        if self._results is not None:
            output_path, headers, row = self._results
            ResultsCsv.write_results(self, output_path, [*headers, *self.sparsity_stats],  # type: ignore[arg-type]
                                     [*row, *self.sparsity_stats.values()])
        return {**metrics, **prefixed(self.sparsity_stats, self.name)}

    def write_results(self, output_path: Any, headers: list[str], row: list[Any]) -> None:
        """The dense evaluator's row, kept to be written with the sparsity's columns once they are known."""
        self._results = (output_path, headers, row)

    def embed(self, model: Any, texts: list[str], kind: str | None = None, **prompt: Any) -> torch.Tensor:
        embeddings = super().embed(model, texts, kind, **prompt).coalesce()  # type: ignore[misc]
        self._embedded.append(embeddings)
        return embeddings

    def encode_options(self) -> dict[str, Any]:
        return {"convert_to_sparse_tensor": True, "save_to_cpu": True, "max_active_dims": self.max_active_dims}

    @abstractmethod
    def sparsity_of(self, model: Any, embedded: list[torch.Tensor]) -> dict[str, float]:
        """The statistics of ``embedded``, the embeddings of each ``embed`` call in the order the dense evaluator
        made them: each sparse evaluator says which is which."""


def sparsity(model: Any, embeddings: torch.Tensor, prefix: str) -> dict[str, float]:
    """``model.sparsity`` (mean active dimensions, sparsity ratio), its keys prefixed ``{prefix}_``."""
    return prefixed(model.sparsity(embeddings), prefix)


def mean_sparsity(model: Any, embeddings: torch.Tensor, sizes: list[int], prefix: str,
                  weighted: bool) -> dict[str, float]:
    """The mean over consecutive groups of rows (``sizes[i]`` rows each) of each group's ``model.sparsity``,
    weighted by the group's rows or not: what sentence-transformers reports for embeddings it encoded in parts."""
    stats, start = [], 0
    for n in sizes:
        stats.append(model.sparsity(embeddings.index_select(0, torch.arange(start, start + n))))
        start += n
    weights = sizes if weighted else [1] * len(sizes)
    return {f"{prefix}_{key}": sum(s[key] * w for s, w in zip(stats, weights)) / sum(weights) for key in stats[0]}
