"""Settings of ``bertkit finetune TASK``: what fine-tuning a pre-trained checkpoint adds to the training loop's
knobs (``FinetuneSettings``), and each task's fields and the paper's defaults for it: sentence classification and
regression (GLUE, your own files: section 4.1, with its grid of rates and restarts), NER (section 5.3), SQuAD v1.1
and v2.0 (sections 4.2, 4.3) and SWAG (section 4.4).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

from bertkit.errors import BertkitError
from bertkit.settings.fields import (
    SquadWindowSettings,
    at_least_one,
    default_lr,
    flag,
    in_seed_range,
    parse_lr_grid,
    positive,
    redefault,
    strict_share,
)
from bertkit.settings.training import TrainingSettings, refuse_dropped_cadence, refuse_unused
from bertkit.tasks.files import MAX_LINE_BYTES, read_records


@dataclass(kw_only=True)
class FinetuneSettings(TrainingSettings):
    """Fine-tuning a pre-trained checkpoint on a task."""

    paper_learning_rate: ClassVar[float] = 2e-5

    model_name_or_path: Path = flag(aliases=("--model",))
    """Pre-trained checkpoint directory (Hugging Face layout: config.json, model.safetensors, vocab.txt)."""
    max_seq_length: int = flag(128, check=at_least_one)
    """Tokens per input after WordPiece, [CLS] and [SEP] included; longer inputs are truncated (SQuAD: windowed;
    NER: split into windows at word boundaries)."""
    eval_batch_size: int = flag(64, check=at_least_one)
    """Sequences per batch when predicting."""
    max_eval_samples: int | None = flag(None, check=at_least_one)
    """Evaluate on the first N evaluation examples. Default: all."""

    def __post_init__(self) -> None:
        super().__post_init__()
        refuse_dropped_cadence(self)

    def learning_rate_for(self, hidden_size: int) -> float:
        return self.learning_rate if self.learning_rate is not None else default_lr(hidden_size,
                                                                                    self.paper_learning_rate)



@redefault(num_train_epochs=3.0, batch_size=32, eval_batch_size=128)
class SequenceClassificationSettings(FinetuneSettings):
    """[CLS] classification or regression of texts and text pairs (section 4.1): batch 32, 3 epochs,
    max_seq_length 128. The paper picks the learning rate on dev from 2e-5..5e-5 with several restarts;
    here one run by default, the grid with --learning-rate paper."""

    learning_rate: tuple[float, ...] | None = flag(None, aliases=("--lr",), parse=parse_lr_grid, check=positive)
    """One rate, a comma list (a grid: one run per rate and seed), or 'paper' (2e-5,3e-5,4e-5,5e-5). Default: one
    run at 2e-5 on models 768 wide and up, 1e-4 below."""
    seed: tuple[int, ...] = flag((1,), aliases=("--seeds",), check=in_seed_range)
    """Seed of each restart (a comma list runs one training per seed)."""

    def __post_init__(self) -> None:
        # One value (Python, --config JSON) or a grid: a tuple from here on, as the flags give it.
        # Anything else (3.5 seeds, a JSON object) is left as given, for the type check to name.
        lrs, seeds = self.learning_rate, self.seed
        one_lr = isinstance(lrs, (int, float)) and not isinstance(lrs, bool)
        self.learning_rate = (lrs,) if one_lr else tuple(lrs) if isinstance(lrs, (list, tuple)) else lrs
        one_seed = isinstance(seeds, int) and not isinstance(seeds, bool)
        self.seed = (seeds,) if one_seed else tuple(seeds) if isinstance(seeds, (list, tuple)) else seeds
        super().__post_init__()
        if not self.seed:
            raise BertkitError("seed: give at least one seed")
        # A repeat would train one run twice into one run directory and count it twice in the mean over seeds.
        if len(set(self.seed)) < len(self.seed):
            raise BertkitError(f"seed {','.join(map(str, self.seed))} repeats a seed: give each restart's seed once")
        names = [self.run_name(lr, 0) for lr in self.learning_rate or ()]
        if len(set(names)) < len(names):
            raise BertkitError(f"learning_rate {','.join(map(repr, self.learning_rate))} repeats a rate (to the 6 "
                               "significant digits of its run directory's name): give each rate of the grid once")

    def grid(self, hidden_size: int) -> tuple[float, ...]:
        return self.learning_rate or (default_lr(hidden_size, self.paper_learning_rate),)

    @staticmethod
    def run_name(lr: float, seed: int) -> str:
        """The directory, under ``output_dir/runs``, of the grid's run at rate ``lr`` and seed ``seed``."""
        return f"lr{lr:g}-seed{seed}"


@dataclass(kw_only=True)
class GlueSettings(SequenceClassificationSettings):
    """GLUE (section 4.1): batch 32, 3 epochs, max_seq_length 128; one run by default, the paper's grid of rates
    and restarts with --learning-rate paper --seeds 1,2,3."""

    task: str
    """cola, sst2, mrpc, stsb, qqp, mnli, qnli, rte or wnli."""
    data_dir: Path
    """The GLUE root holding SST-2/, MRPC/, ... (each with train.tsv, dev.tsv, test.tsv)."""



@dataclass(kw_only=True)
class ClassifySettings(SequenceClassificationSettings):
    """Your own texts (CSV/TSV with a header, or JSON lines) and labels: classification, or regression when
    the labels are numbers. Same loop, grid and report as GLUE; the label names are saved in the model."""

    train_file: Path
    """Training data: .csv, .tsv or .jsonl (another suffix: --input-format)."""
    validation_file: Path
    """Scored after each epoch (the report's numbers); same columns as --train-file."""
    text_column: str = "text"
    """Column (or JSONL field) holding the text."""
    text_pair_column: str | None = None
    """Column holding a second text (sentence-pair tasks); unset, a column named text_pair is (transformers' key)."""
    label_column: str = "label"
    """Column holding the label (a class name, or a number for regression)."""
    problem_type: Literal["auto", "classification", "regression"] = "auto"
    """auto: regression when every training label is a number and some are not integers, else classification."""
    input_format: Literal["auto", "jsonl", "csv", "tsv"] = "auto"
    """How to read the train and validation files; auto: by each one's suffix (.csv, .tsv, .jsonl)."""
    max_line_bytes: int = flag(MAX_LINE_BYTES, check=at_least_one)
    """The longest line (CSV: record) the files may hold, in bytes; a longer one stops the run naming it."""


@redefault(num_train_epochs=3.0, batch_size=32)
class NerSettings(FinetuneSettings):
    """CoNLL-2003 NER (section 5.3): the tag of each word read at its first WordPiece, no CRF."""

    paper_learning_rate: ClassVar[float] = 5e-5

    data_dir: Path
    """Directory holding train.txt, valid.txt and test.txt in CoNLL column format."""
    tag_scheme: Literal["iob1", "iob2"] = "iob2"
    """The files' tagging scheme (the original CoNLL-2003 release is iob1)."""


SQUAD_PAPER = {"1.1": {"num_train_epochs": 3.0, "batch_size": 32}, "2.0": {"num_train_epochs": 2.0, "batch_size": 48}}


@redefault(max_seq_length=384)
class SquadSettings(FinetuneSettings, SquadWindowSettings):
    """SQuAD v1.1 (section 4.2: 3 epochs, lr 5e-5, batch 32) and v2.0 (section 4.3: 2 epochs, batch 48).
    Without --train-file the predict file is split by article, and every report says so."""

    paper_learning_rate: ClassVar[float] = 5e-5
    # scoring every held-out question costs a sizeable share of an epoch on a CPU: evaluated in the loop only when
    # asked (--eval-strategy, --eval-steps), and once at the end in any case
    unset_eval_strategy: ClassVar[str] = "no"
    # until 2026-11-30 the loop scored no held-out question, and unset eval_strategy was recorded as "epoch": runs
    # started since record this, so that an earlier run's "epoch" reads as the "no" it acted as, and a later one's
    # (asked for: scored each epoch) as itself
    recorded_marks: ClassVar[dict[str, Any]] = {"eval_strategy_scores": True}

    predict_file: Path
    """The SQuAD JSON to predict and score (dev-v1.1.json, dev-v2.0.json)."""
    train_file: Path | None = None
    """Training JSON. Default: train on most articles of --predict-file and score the held-out ones."""
    heldout_fraction: float = flag(1 / 6, check=strict_share)
    """Without --train-file: the share of articles held out for scoring."""
    split_seed: int = 0
    """Without --train-file: the seed of the article split."""

    def _scored_nothing(self, recorded: dict[str, Any]) -> bool:
        return "eval_strategy_scores" not in recorded  # an earlier bertkit's run

    def __post_init__(self) -> None:
        paper = SQUAD_PAPER.get(self.version, {}) if isinstance(self.version, str) else {}  # a {} from JSON: checked
        for name, value in paper.items():  # the paper's per-version defaults, then checked
            if getattr(self, name) is None:
                setattr(self, name, value)
        super().__post_init__()
        if self.train_file is not None:  # the split's settings: without a word, the run would not be the one asked
            refuse_unused(self, ("heldout_fraction", "split_seed"), "splits --predict-file into training and "
                           "held-out articles, which only a run without --train-file does (with one, all of "
                           "--predict-file is scored): drop {flag}, or --train-file")


@redefault(num_train_epochs=3.0, batch_size=16)
class SwagSettings(FinetuneSettings):
    """SWAG (section 4.4): 3 epochs, lr 2e-5, batch 16; swagaf CSV files."""

    train_file: Path
    """Labelled training CSV (train.csv)."""
    predict_file: Path
    """val.csv (scored) or test.csv (predicted only)."""

    def nothing_to_evaluate(self) -> str | None:
        header = _csv_header(self.predict_file)
        if header is None or "label" in header:
            return None
        return (f"sets when the loop scores --predict-file {self.predict_file}, which has no label column (a test "
                "file): nothing would be scored; drop {flag}, or give a labelled --predict-file (val.csv)")

    def _scored_nothing(self, recorded: dict[str, Any]) -> bool:
        # the same file (the marker compares the paths) without labels: no loop of any version scored it
        return self.nothing_to_evaluate() is not None



def _csv_header(path: Path) -> list[str] | None:
    """The column names of the CSV ``path``; None where it cannot be read yet (missing, not CSV, empty), which the run
    itself reads and refuses naming the file."""
    try:
        first_record = next(read_records(Path(path), "csv"), None)
    except (OSError, BertkitError):
        return None
    return None if first_record is None else list(first_record[1])
