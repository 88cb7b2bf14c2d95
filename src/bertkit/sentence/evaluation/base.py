"""What the embedding evaluators share: how their texts become embeddings (``EmbeddingEvaluator.embed``, the one
place; a sparse evaluator overrides it and nothing else of how texts are embedded) and how metric keys are
named."""

from __future__ import annotations

from typing import Any

import torch


def prefixed(metrics: dict[str, float], name: str) -> dict[str, float]:
    """``{name}_{key}`` for each metric (the keys as they are for no name), as sentence-transformers names them."""
    return {f"{name}_{k}" if name else k: float(v) for k, v in metrics.items()}


class EmbeddingEvaluator:
    """An evaluator that embeds its texts with ``embed``, in batches of ``batch_size``, at ``truncate_dim``."""

    batch_size: int
    show_progress_bar: bool
    truncate_dim: int | None

    def embed(self, model: Any, texts: list[str], kind: str | None = None, **prompt: Any) -> torch.Tensor:
        """``texts``' (N, D) embeddings, encoded as queries (``kind`` "query"), documents ("document") or plain texts
        (None): the model's prompt for that kind, unless ``prompt`` gives ``prompt`` or ``prompt_name``."""
        encode = {"query": model.encode_query, "document": model.encode_document, None: model.encode}[kind]
        return encode(texts, batch_size=self.batch_size, show_progress_bar=self.show_progress_bar,
                      **self.encode_options(), **prompt)

    def encode_options(self) -> dict[str, Any]:
        """What ``embed`` asks of ``encode`` besides the texts, batch size, progress bar and prompt."""
        return {"convert_to_tensor": True, "truncate_dim": self.truncate_dim}
