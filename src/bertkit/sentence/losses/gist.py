"""GISTEmbedLoss (Solatorio, 2024, arXiv:2402.16829): MultipleNegativesRankingLoss whose in-batch negatives a guide
model vets. A candidate the guide scores above the anchor's own positive (less ``margin``) is likely a false
negative (a second answer to the same question) and is left out of the softmax, as sentence-transformers 6 computes it.

The guide embeds the model's token ids, so it must share the model's vocabulary: sentence-transformers decodes and
re-tokenizes for a guide with another tokenizer, bertkit refuses one by name.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from bertkit.errors import BertkitError
from bertkit.sentence.losses.base import SentenceLoss, check_positive, embed_columns
from bertkit.sentence.util import cos_sim


class GISTEmbedLoss(SentenceLoss):
    """Columns (anchor, positive) or (anchor, positive, negative). Each anchor's candidates are every positive of
    the batch, and with ``contrast_anchors`` / ``contrast_positives`` the other anchors / positives, and the
    negatives; cross-entropy over cosine similarity / ``temperature``. A candidate whose guide similarity exceeds
    the guide's anchor-positive similarity less ``margin`` ("absolute") or less ``|that| * margin`` ("relative")
    is masked out. The guide runs without gradients and is not trained, saved or switched to training mode."""

    columns = (2, 3)
    in_batch_negatives = True

    def __init__(self, model: nn.Module, guide: nn.Module, temperature: float = 0.01,
                 margin_strategy: str = "absolute", margin: float = 0.0, contrast_anchors: bool = True,
                 contrast_positives: bool = True, gather_across_devices: bool = False):
        super().__init__(model)
        from bertkit.sentence.model import SentenceTransformer

        if not isinstance(guide, SentenceTransformer):
            raise BertkitError(f"GISTEmbedLoss: guide must be a bertkit.sentence.SentenceTransformer, got "
                               f"{type(guide).__module__}.{type(guide).__name__}")
        _check_same_tokens(model, guide)
        if margin_strategy not in ("absolute", "relative"):
            raise BertkitError(f"GISTEmbedLoss: margin_strategy {margin_strategy!r} is not 'absolute' or 'relative'")
        check_positive("GISTEmbedLoss", "temperature", temperature)
        # not a submodule: the trainer's optimizer, checkpoints and train()/eval() must not reach the guide
        object.__setattr__(self, "guide", guide)
        self.temperature, self.margin_strategy, self.margin = temperature, margin_strategy, margin
        self.contrast_anchors, self.contrast_positives = contrast_anchors, contrast_positives
        self.gather_across_devices = bool(gather_across_devices)

    def forward(self, sentence_features: Sequence[dict[str, Any]], labels: Tensor | None) -> Tensor:
        return self.loss_on_batch(embed_columns(self.model, sentence_features), sentence_features, labels,
                                  guide=self.embed_guide(sentence_features))

    @torch.no_grad()
    def embed_guide(self, sentence_features: Sequence[dict[str, Any]]) -> list[Tensor]:
        """The guide's (B, D) embeddings of each column, on the model's device."""
        device = sentence_features[0]["input_ids"].device
        if self.guide.device != device:
            self.guide.to(device)
        return embed_columns(self.guide, sentence_features)

    def compute_loss_from_embeddings(self, embeddings: list[Tensor], labels: Tensor | None,
                                     guide_embeddings: list[Tensor] | None = None) -> Tensor:
        if guide_embeddings is None:
            raise BertkitError("GISTEmbedLoss needs the guide's embeddings: call the loss on tokenized features, "
                               "loss(features, labels), or pass guide_embeddings=loss.embed_guide(features)")
        anchor, positive, *negative = embeddings  # (B, D) each
        g_anchor, g_positive, *g_negative = guide_embeddings
        g_ap = guide_similarity(g_anchor, g_positive)  # (B, B)
        own = g_ap.diagonal().unsqueeze(1)  # (B, 1): the guide's similarity of each anchor with its positive
        limit = own - self.margin if self.margin_strategy == "absolute" else own - own.abs() * self.margin

        def vetted(scores: Tensor, guided: Tensor, own: str | None = None) -> Tensor:
            drop = guided > limit
            eye = torch.eye(len(drop), dtype=torch.bool, device=drop.device)
            if own == "target":  # the anchor's own positive is the target, never a false negative
                drop = drop & ~eye
            elif own == "self":  # a text is no negative of itself (sentence-transformers 6.3; the guide's margin let
                drop = drop | eye  # it through when an anchor's guide similarity with its positive was 1)
            return scores.masked_fill(drop, -torch.inf)

        scores = [vetted(cos_sim(anchor, positive), g_ap, own="target")]
        if self.contrast_anchors:
            scores.append(vetted(cos_sim(anchor, anchor), guide_similarity(g_anchor, g_anchor), own="self"))
        if self.contrast_positives:
            scores.append(vetted(cos_sim(positive, positive), guide_similarity(g_positive, g_positive), own="self"))
        for n, g_n in zip(negative, g_negative):
            scores.append(vetted(cos_sim(anchor, n), guide_similarity(g_anchor, g_n)))
        logits = torch.cat(scores, dim=1) / self.temperature  # (B, B * columns)
        return F.cross_entropy(logits, torch.arange(len(anchor), device=anchor.device))


# Rows of a guide_similarity chunk: at most this many elements in its (rows, M, D) products (64 MB in float32).
_GUIDE_CHUNK_ELEMENTS = 1 << 24


def guide_similarity(a: Tensor, b: Tensor) -> Tensor:
    """(N, M) cosine similarities of the guide's embeddings, computed as sentence-transformers computes them (torch's
    ``cosine_similarity`` of each pair: the products summed along D), not as ``cos_sim``'s matrix product, whose sums
    round otherwise. A candidate is masked on a strict ``>`` against the anchor's own score, and a text in two
    mini-batches (or columns) of other widths embeds a rounding apart: scores one unit apart in the last place
    masked another candidate than sentence-transformers did, and moved the loss by a fifth. The rows run in chunks,
    to bound the (rows, M, D) products; each score is the same whatever the chunk."""
    rows = max(1, _GUIDE_CHUNK_ELEMENTS // max(1, b.shape[0] * b.shape[1]))
    return torch.cat([F.cosine_similarity(a[i:i + rows].unsqueeze(1), b.unsqueeze(0), dim=-1)  # (rows, M)
                      for i in range(0, max(1, a.shape[0]), rows)])


def _check_same_tokens(model: Any, guide: Any) -> None:
    """The guide must read the model's token ids as the same tokens, and see every token the model sees."""
    ours, theirs = model.tokenizer.get_vocab(), guide.tokenizer.get_vocab()
    if ours != theirs:
        by_id = {i: t for t, i in theirs.items()}
        differ = next((f"id {i}: {t!r} in the model's, {by_id.get(i)!r} in the guide's"
                       for t, i in sorted(ours.items(), key=lambda x: x[1]) if by_id.get(i) != t),
                      f"the guide's has tokens beyond id {len(ours) - 1}")
        raise BertkitError(
            f"GISTEmbedLoss: the guide {guide.name_or_path} has another tokenizer than the model "
            f"{model.name_or_path} ({len(theirs)} tokens against {len(ours)}; first difference at {differ}). The "
            "guide embeds the model's token ids, so it must share the model's vocabulary: pick a guide built on "
            "the same tokenizer (use sentence-transformers to guide with another one)")
    if guide.max_seq_length < model.max_seq_length:
        raise BertkitError(
            f"GISTEmbedLoss: the guide {guide.name_or_path} truncates at max_seq_length {guide.max_seq_length}, the "
            f"model {model.name_or_path} at {model.max_seq_length}; set guide.max_seq_length = "
            f"{model.max_seq_length} (or lower model.max_seq_length)")
