"""What decides the bytes of pre-training instances: one frozen, self-validating dataclass (stored in the manifest)."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Literal

from bertkit.data.text import INPUT_FORMATS
from bertkit.errors import BertkitError
from bertkit.tokenization.textfiles import DECODE_ERRORS


@dataclass(frozen=True)
class PretrainingConfig:
    """Everything that decides the instances' bytes (it is stored in the manifest)."""

    max_seq_length: int = 128
    """Tokens per instance, [CLS] and the two [SEP] included (the paper: 128, then 512)."""
    max_predictions_per_seq: int = 20
    """Most masked positions per instance (google's 20 at 128 tokens, 80 at 512)."""
    masked_lm_prob: float = 0.15
    """Share of tokens to predict; of those 80% become [MASK], 10% a random token, 10% stay (section 3.1)."""
    short_seq_prob: float = 0.1
    """Share of instances made shorter than max_seq_length, so fine-tuning lengths are seen too."""
    dupe_factor: int = 5
    """Passes over the corpus, each with different masks and pairs."""
    random_next_prob: float = 0.5
    """Share of pairs whose second segment is not the true next text."""
    whole_word_mask: bool = False
    """Mask all WordPieces of a word together (google's later whole-word-masking models)."""
    masking: Literal["static", "dynamic"] = "static"
    """dynamic: store unmasked instances and draw masks afresh each epoch at load time."""
    input_format: Literal["auto", "prose", "sentences", "wikitext"] = "auto"
    """How documents and sentences are marked in the files (docs/pretraining-data.md)."""
    errors: Literal["strict", "replace", "ignore"] = "strict"
    """Non-UTF-8 bytes: stop naming file, line and byte (strict), replace with U+FFFD, or drop them."""
    unit_bytes: int = 4 << 20
    """Bytes of text per unit of work (each unit is processed independently with its own seed)."""
    seed: int = 12345
    """Seed of pairs and masks: same seed, same bytes."""

    def __post_init__(self):
        # Types first: a truthy "no" would mask whole words, 3.7 predictions would mask up to 3.7 tokens, a float
        # length would fail in a worker (the Literal fields are checked against their values below).
        for f in fields(PretrainingConfig):
            value, kind = getattr(self, f.name), _KINDS.get(f.type)
            if kind is not None and (isinstance(value, bool) != (kind[0] is bool) or not isinstance(value, kind)):
                raise BertkitError(f"{f.name} must be {_KIND_NAMES[f.type]}, got {value!r} ({type(value).__name__})")
        checks = [
            ("max_seq_length", self.max_seq_length >= 5, "must be at least 5 ([CLS] a [SEP] b [SEP])"),
            ("max_predictions_per_seq", self.max_predictions_per_seq >= 1, "must be at least 1"),
            ("masked_lm_prob", 0 < self.masked_lm_prob < 1, "must be in (0, 1)"),
            ("short_seq_prob", 0 <= self.short_seq_prob <= 1, "must be in [0, 1]"),
            ("dupe_factor", self.dupe_factor >= 1, "must be at least 1"),
            ("random_next_prob", 0 <= self.random_next_prob <= 1, "must be in [0, 1]"),
            ("masking", self.masking in ("static", "dynamic"), "must be 'static' or 'dynamic'"),
            ("input_format", self.input_format in INPUT_FORMATS, f"must be one of {INPUT_FORMATS}"),
            ("errors", self.errors in DECODE_ERRORS, f"must be one of {DECODE_ERRORS}"),
            ("unit_bytes", self.unit_bytes >= 1, "must be positive"),
            ("seed", self.seed >= 0, "must be a non-negative integer"),
        ]
        for name, ok, why in checks:
            if not ok:
                raise BertkitError(f"{name}={getattr(self, name)!r} {why}")


_KINDS = {"int": (int,), "float": (int, float), "bool": (bool,)}  # the annotations (strings, as written above)
_KIND_NAMES = {"int": "an int", "float": "a number", "bool": "a bool"}
