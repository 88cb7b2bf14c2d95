"""GradCache (Gao et al., 2021), so a batch of any size trains in the memory of ``mini_batch_size`` rows:
``grad_cached``, which every cached loss calls (CachedMultipleNegativesRankingLoss here, the sparse CachedSpladeLoss),
and CachedMultipleNegativesRankingLoss, MultipleNegativesRankingLoss computed so.

Three passes: (1) embed every column in mini-batches, dropping each one's graph at once, keeping each mini-batch's random state;
(2) compute the loss on those embeddings (leaves), backward to the embeddings only, and keep their gradients;
(3) when the training loop calls ``loss.backward()``, the loss's autograd node re-embeds each mini-batch with its
random state replayed (same dropout), takes the parameters' gradients through it for the cached gradient, and hands
their sum to autograd. The parameters' gradients are those of the uncached loss on the same batch
(tests/test_sentence_losses.py). One node for all of them, not a backward pass per mini-batch: autograd accumulates
each parameter's gradient once, where DDP's hook sees it; per mini-batch, DDP averaged the first one's gradient over
the processes and left the others' local (tests/test_sentence_gather.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from bertkit.errors import BertkitError, is_whole
from bertkit.sentence.losses.base import embed, refuse
from bertkit.sentence.losses.multiple_negatives import MultipleNegativesRankingLoss
from bertkit.sentence.util import cos_sim


class _RandomState:
    """The CPU and CUDA generator states at one point, to replay dropout exactly."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.cpu_state = torch.get_rng_state()
        self.cuda_state = torch.cuda.get_rng_state(device) if self.cuda else None
        self.device = device

    def replay(self):
        fork = torch.random.fork_rng(devices=[self.device] if self.cuda else [])
        fork.__enter__()
        torch.set_rng_state(self.cpu_state)
        if self.cuda:
            torch.cuda.set_rng_state(self.cuda_state, self.device)
        return fork


def _rows(features: dict[str, Any], start: int, end: int) -> dict[str, Any]:
    return {k: (v[start:end] if isinstance(v, Tensor) and v.dim() > 0 else v) for k, v in features.items()}


class CachedMultipleNegativesRankingLoss(MultipleNegativesRankingLoss):
    """MultipleNegativesRankingLoss computed with GradCache in mini-batches of ``mini_batch_size`` rows."""

    def __init__(self, model: nn.Module, scale: float = 20.0, similarity_fct: Callable[[Tensor, Tensor], Tensor] = cos_sim,
                 mini_batch_size: int = 32, mini_batch_num_tokens: int | None = None,
                 gather_across_devices: bool = False, directions: tuple[str, ...] = ("query_to_doc",),
                 partition_mode: str = "joint", show_progress_bar: bool = False, hardness_mode: str | None = None,
                 hardness_strength: float = 0.0):
        super().__init__(model, scale, similarity_fct, gather_across_devices, directions, partition_mode,
                         hardness_mode, hardness_strength)
        self.mini_batch_size = check_mini_batch(type(self).__name__, mini_batch_size, mini_batch_num_tokens)

    def forward(self, sentence_features: Sequence[dict[str, Any]], labels: Tensor | None,
                loss_fn: Callable[[list[Tensor], Tensor | None], Tensor] | None = None) -> Tensor:
        """``loss_fn(embeddings, labels)`` replaces this loss's own (MatryoshkaLoss wraps it so)."""
        loss_fn = loss_fn or self.compute_loss_from_embeddings
        return grad_cached(self.model, sentence_features, self.mini_batch_size,
                           lambda embeddings: self.loss_on_batch(embeddings, sentence_features, labels, loss_fn))


def check_mini_batch(loss: str, mini_batch_size: Any, mini_batch_num_tokens: Any) -> int:
    """``mini_batch_size``, refused unless a whole number >= 1; ``mini_batch_num_tokens`` (packing mini-batches by
    tokens) is not implemented."""
    refuse(loss, "mini_batch_num_tokens", mini_batch_num_tokens, None, "mini-batches are mini_batch_size rows each")
    if not is_whole(mini_batch_size):
        raise BertkitError(f"{loss}: mini_batch_size must be a whole number >= 1, got {mini_batch_size!r}")
    return int(mini_batch_size)


def grad_cached(model: nn.Module, sentence_features: Sequence[dict[str, Any]], mini_batch_size: int,
                loss_fn: Callable[[list[Tensor]], Tensor]) -> Tensor:
    """``loss_fn`` of the columns' embeddings, each column embedded ``mini_batch_size`` rows at a time, the
    parameters' gradients those of the uncached loss (the three passes of the module docstring). Without grad
    (evaluation) the embeddings are simply computed in mini-batches."""
    if not torch.is_grad_enabled():  # evaluation: no backward to prepare
        return loss_fn([torch.cat([_embed(model, _rows(f, s, s + mini_batch_size))
                                   for s in range(0, f["input_ids"].shape[0], mini_batch_size)])
                        for f in sentence_features])
    embeddings, states = [], []
    for features in sentence_features:
        parts, column_states = [], []
        for start in range(0, features["input_ids"].shape[0], mini_batch_size):
            column_states.append(_RandomState(features["input_ids"].device))
            # with a graph, dropped at once: bertkit's encoder computes differently without one (its inference
            # paths), and the backward pass's re-embedding must see the numbers and dropout masks of this pass
            parts.append(_embed(model, _rows(features, start, start + mini_batch_size)).detach())
        embeddings.append(torch.cat(parts))
        states.append(column_states)
    leaves = [e.detach().requires_grad_() for e in embeddings]
    with torch.enable_grad():
        loss = loss_fn(leaves)
        # a column the loss does not use (allow_unused) has no gradient to carry back
        grads = torch.autograd.grad(loss, leaves, allow_unused=True)
    params = [p for p in model.parameters() if p.requires_grad]
    return _Recomputed.apply(loss.detach(), lambda grad_output: _backward(
        model, sentence_features, mini_batch_size, states, grads, params, grad_output), *params)


def _embed(model: nn.Module, features: dict[str, Any]) -> Tensor:
    return embed(model, features["input_ids"], features["attention_mask"], features.get("token_type_ids"),
                 int(features.get("prompt_length", 0)), features.get("task"))


def _backward(model: nn.Module, sentence_features: Sequence[dict[str, Any]], mini_batch_size: int,
              states: list[list[_RandomState]], grads: Sequence[Tensor | None], params: list[Tensor],
              grad_output: Tensor) -> list[Tensor | None]:
    """The gradients of ``params``: each mini-batch re-embedded with its random state replayed, its cached
    gradient taken through it, summed over the mini-batches."""
    total: list[Tensor | None] = [None] * len(params)
    with torch.enable_grad():
        for features, column_states, grad in zip(sentence_features, states, grads):
            if grad is None:
                continue
            for i, state in enumerate(column_states):
                start = i * mini_batch_size
                fork = state.replay()
                try:
                    emb = _embed(model, _rows(features, start, start + mini_batch_size))
                finally:
                    fork.__exit__(None, None, None)
                parts = torch.autograd.grad(emb, params, grad[start:start + mini_batch_size] * grad_output,
                                            allow_unused=True)
                total = [t if g is None else g if t is None else t.add_(g) for t, g in zip(total, parts)]
    return total


class _Recomputed(torch.autograd.Function):
    """A loss value whose gradients for ``params`` ``recompute(grad_output)`` gives, in one backward step."""

    @staticmethod
    def forward(ctx: Any, loss: Tensor, recompute: Callable[[Tensor], list[Tensor | None]], *params: Tensor) -> Tensor:
        ctx.recompute = recompute
        return loss.clone()

    @staticmethod
    def backward(ctx: Any, grad_output: Tensor) -> tuple[Tensor | None, ...]:
        return (None, None, *ctx.recompute(grad_output))
