"""Masked-LM targets: the reference's 15% budget and 80% [MASK] / 10% random / 10% unchanged (section 3.1).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class MaskingTables:
    """What masking needs to know about the vocabulary."""

    mask_id: int
    replacement_ids: np.ndarray  # ids a "random token" is drawn from: all but the special tokens
    is_continuation: np.ndarray  # bool per id: the token starts with "##"

    @classmethod
    def from_vocab(cls, tokens: Sequence[str], special_ids: Mapping[str, int]) -> MaskingTables:
        """``special_ids``: each special token's id by role (pad, unk, cls, sep, mask), as the manifest has them."""
        specials = set(special_ids.values())
        ids = np.array([i for i in range(len(tokens)) if i not in specials], dtype=np.int64)
        cont = np.array([t.startswith("##") for t in tokens], dtype=bool)
        return cls(special_ids["mask"], ids, cont)


def targets_asked(length: int, masked_lm_prob: float) -> int:
    """How many masked-LM targets ``masked_lm_prob`` asks of a ``length``-token sequence (google's rounding, at least
    one), before ``max_predictions_per_seq`` caps them."""
    return max(1, int(round(length * masked_lm_prob)))


def mask_tokens(
    input_ids: np.ndarray,
    type_start: int,
    tables: MaskingTables,
    *,
    masked_lm_prob: float,
    max_predictions: int,
    whole_word: bool,
    rng: np.random.Generator,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mask one ``[CLS] A [SEP] B [SEP]`` sequence; return (masked ids, sorted positions, original ids there)."""
    n = len(input_ids)
    special = np.zeros(n, dtype=bool)
    special[[0, type_start - 1, n - 1]] = True
    candidates = np.flatnonzero(~special)
    budget = min(max_predictions, targets_asked(n, masked_lm_prob), len(candidates))
    if whole_word:
        starts = ~tables.is_continuation[input_ids[candidates]] | special[candidates - 1]
        word_starts = np.flatnonzero(starts)
        word_lengths = np.diff(np.append(word_starts, len(candidates))).tolist()
        chosen, count = [], 0
        for w in rng.permutation(len(word_starts)).tolist():
            if count >= budget:
                break
            if count + word_lengths[w] > budget:
                continue
            chosen.append(w)
            count += word_lengths[w]
        picked = [candidates[word_starts[w] : word_starts[w] + word_lengths[w]] for w in chosen]
        positions = np.sort(np.concatenate(picked)) if picked else np.zeros(0, dtype=np.int64)
    else:
        positions = np.sort(rng.choice(candidates, size=budget, replace=False))
    labels = input_ids[positions]
    masked = np.array(input_ids, copy=True)
    # Section 3.1 / appendix A.1: 80% [MASK], 10% a random token, 10% unchanged.
    u = rng.random(len(positions))
    masked[positions[u < 0.8]] = tables.mask_id
    randomised = positions[u >= 0.9]
    draws = rng.integers(0, len(tables.replacement_ids), size=len(randomised))
    masked[randomised] = tables.replacement_ids[draws]
    return masked, positions, labels
