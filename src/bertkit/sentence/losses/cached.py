"""GradCache (Gao et al., 2021): a loss over a batch of any size trained in the memory of ``mini_batch_size`` rows,
with the uncached loss's value and gradients. One mechanism, ``grad_cached``, for every cached loss: the embedders'
(CachedMultipleNegativesRankingLoss, its symmetric variant, CachedGISTEmbedLoss, MegaBatchMarginLoss, through
``embedded_in_mini_batches``), the sparse CachedSpladeLoss (the same) and the cross-encoder's
CachedMultipleNegativesRankingLoss, whose pieces are logits of pairs.

Three passes: (1) compute every piece (a mini-batch's embeddings or logits), dropping each one's graph at once,
keeping each one's random state; (2) compute the loss on those pieces (leaves), backward to the pieces only, and
keep their gradients; (3) when the training loop calls ``loss.backward()``, the loss's autograd node recomputes each
piece with its random state replayed (same dropout), takes the parameters' gradients through it for the cached
gradient, and hands their sum to autograd. The parameters' gradients are those of the uncached loss on the same
batch (tests/test_sentence_losses.py). One node for all of them, not a backward pass per mini-batch: autograd
accumulates each parameter's gradient once, where DDP's hook sees it; per mini-batch, DDP averaged the first one's
gradient over the processes and left the others' local (tests/test_sentence_gather.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from bertkit.errors import BertkitError, is_whole
from bertkit.sentence.losses.base import embed, refuse
from bertkit.sentence.losses.gist import GISTEmbedLoss
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


def grad_cached(pieces: Sequence[Callable[[], Tensor]], loss_fn: Callable[[list[Tensor]], Tensor],
                model: nn.Module, device: torch.device) -> Tensor:
    """``loss_fn`` of the pieces' outputs, each piece a call computing one mini-batch's outputs with ``model``'s
    parameters; with gradients on, the loss's backward recomputes each piece (module docstring)."""
    if not torch.is_grad_enabled():  # evaluation: no backward to prepare
        return loss_fn([piece() for piece in pieces])
    outputs, states = [], []
    for piece in pieces:
        states.append(_RandomState(device))
        # with a graph, dropped at once: bertkit's encoder computes differently without one (its inference paths),
        # and the backward pass's recomputation must see the numbers and dropout masks of this pass
        outputs.append(piece().detach())
    leaves = [o.requires_grad_() for o in outputs]
    loss = loss_fn(leaves)
    grads = torch.autograd.grad(loss, leaves, allow_unused=True)
    params = [p for p in model.parameters() if p.requires_grad]
    return _Recomputed.apply(loss.detach(), lambda grad_output: _backward(pieces, states, grads, params, grad_output),
                             *params)


def _backward(pieces: Sequence[Callable[[], Tensor]], states: list[_RandomState], grads: Sequence[Tensor | None],
              params: list[Tensor], grad_output: Tensor) -> list[Tensor | None]:
    """The gradients of ``params``: each piece recomputed with its random state replayed, its cached gradient taken
    through it, summed over the pieces."""
    total: list[Tensor | None] = [None] * len(params)
    with torch.enable_grad():
        for piece, state, grad in zip(pieces, states, grads):
            if grad is None:  # a piece the loss did not read (GlobalOrthogonalRegularizationLoss's weight 0)
                continue
            fork = state.replay()
            try:
                out = piece()
            finally:
                fork.__exit__(None, None, None)
            parts = torch.autograd.grad(out, params, grad * grad_output, allow_unused=True)
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


def check_mini_batch(loss: str, mini_batch_size: Any, mini_batch_num_tokens: Any = None) -> int:
    """``mini_batch_size``, refused unless a whole number >= 1; ``mini_batch_num_tokens`` (packing mini-batches by
    tokens) is not implemented."""
    refuse(loss, "mini_batch_num_tokens", mini_batch_num_tokens, None, "mini-batches are mini_batch_size rows each")
    if not is_whole(mini_batch_size):
        raise BertkitError(f"{loss}: mini_batch_size must be a whole number >= 1, got {mini_batch_size!r}")
    return int(mini_batch_size)


def _rows(features: dict[str, Any], start: int, end: int) -> dict[str, Any]:
    return {k: (v[start:end] if isinstance(v, Tensor) and v.dim() > 0 else v) for k, v in features.items()}


def embedded_in_mini_batches(model: nn.Module, sentence_features: Sequence[dict[str, Any]], mini_batch_size: int,
                             loss_fn: Callable[[list[Tensor]], Tensor]) -> Tensor:
    """``loss_fn`` of the columns' embeddings, each column embedded ``mini_batch_size`` rows at a time (a piece each)
    through ``grad_cached``: the parameters' gradients are those of the uncached loss."""
    m = mini_batch_size
    spans = [(c, s) for c, f in enumerate(sentence_features) for s in range(0, f["input_ids"].shape[0], m)]
    pieces = [lambda c=c, s=s: embed(model, _rows(sentence_features[c], s, s + m)) for c, s in spans]

    def on_pieces(parts: list[Tensor]) -> Tensor:
        return loss_fn([torch.cat([p for (c, _), p in zip(spans, parts) if c == column])
                        for column in range(len(sentence_features))])

    return grad_cached(pieces, on_pieces, model, sentence_features[0]["input_ids"].device)


class CachedLoss:
    """A sentence loss whose columns are embedded in mini-batches of ``mini_batch_size`` rows through
    ``grad_cached``; mixed in before the uncached loss whose ``loss_on_batch`` it computes."""

    mini_batch_size: int

    def forward(self, sentence_features: Sequence[dict[str, Any]], labels: Tensor | None,
                loss_fn: Callable[..., Tensor] | None = None) -> Tensor:
        """``loss_fn(embeddings, labels)`` replaces this loss's own (MatryoshkaLoss wraps it so)."""
        loss_fn = loss_fn or self.compute_loss_from_embeddings
        guide = self.guide_embeddings(sentence_features)
        return embedded_in_mini_batches(self.model, sentence_features, self.mini_batch_size, lambda embeddings:
                                        self.loss_on_batch(embeddings, sentence_features, labels, loss_fn, guide))

    def guide_embeddings(self, sentence_features: Sequence[dict[str, Any]]) -> list[Tensor] | None:
        return None


class CachedMultipleNegativesRankingLoss(CachedLoss, MultipleNegativesRankingLoss):
    """MultipleNegativesRankingLoss computed with GradCache in mini-batches of ``mini_batch_size`` rows."""

    def __init__(self, model: nn.Module, scale: float = 20.0, similarity_fct: Callable[[Tensor, Tensor], Tensor] = cos_sim,
                 mini_batch_size: int = 32, mini_batch_num_tokens: int | None = None,
                 gather_across_devices: bool = False, directions: tuple[str, ...] = ("query_to_doc",),
                 partition_mode: str = "joint", show_progress_bar: bool = False, hardness_mode: str | None = None,
                 hardness_strength: float = 0.0):
        super().__init__(model, scale, similarity_fct, gather_across_devices, directions, partition_mode,
                         hardness_mode, hardness_strength)
        self.mini_batch_size = check_mini_batch(type(self).__name__, mini_batch_size, mini_batch_num_tokens)


class CachedMultipleNegativesSymmetricRankingLoss(CachedMultipleNegativesRankingLoss):
    """MultipleNegativesSymmetricRankingLoss computed with GradCache: anchor -> positives and positive -> anchors,
    one softmax each, averaged."""

    def __init__(self, model: nn.Module, scale: float = 20.0, similarity_fct: Callable[[Tensor, Tensor], Tensor] = cos_sim,
                 mini_batch_size: int = 32, mini_batch_num_tokens: int | None = None,
                 gather_across_devices: bool = False, show_progress_bar: bool = False):
        super().__init__(model, scale, similarity_fct, mini_batch_size, mini_batch_num_tokens, gather_across_devices,
                         directions=("query_to_doc", "doc_to_query"), partition_mode="per_direction")


class CachedGISTEmbedLoss(CachedLoss, GISTEmbedLoss):
    """GISTEmbedLoss computed with GradCache: the model's and the guide's embeddings both in mini-batches of
    ``mini_batch_size`` rows (the guide without gradients)."""

    def __init__(self, model: nn.Module, guide: nn.Module, temperature: float = 0.01, mini_batch_size: int = 32,
                 mini_batch_num_tokens: int | None = None, show_progress_bar: bool = False,
                 margin_strategy: str = "absolute", margin: float = 0.0, contrast_anchors: bool = True,
                 contrast_positives: bool = True, gather_across_devices: bool = False):
        super().__init__(model, guide, temperature, margin_strategy, margin, contrast_anchors, contrast_positives,
                         gather_across_devices)
        self.mini_batch_size = check_mini_batch(type(self).__name__, mini_batch_size, mini_batch_num_tokens)

    @torch.no_grad()
    def guide_embeddings(self, sentence_features: Sequence[dict[str, Any]]) -> list[Tensor]:
        m = self.mini_batch_size
        return [torch.cat([self.embed_guide([_rows(f, s, s + m)])[0] for s in range(0, f["input_ids"].shape[0], m)])
                for f in sentence_features]
