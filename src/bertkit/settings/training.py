"""Settings of the commands that train: ``pretrain``, ``finetune TASK``, ``feature-study`` and ``demo``.

``TrainingSettings`` holds what every training command shares (the optimiser, the schedule, logging and
checkpoints), named as in transformers' ``TrainingArguments`` / ``run_glue.py`` where the concept is the
same (``learning_rate``, ``num_train_epochs``, ``gradient_accumulation_steps``, ``warmup_ratio``, ...).
Each task adds its own fields beside them and overrides the defaults the paper gives for that task.

Batch sizes are global: ``batch_size`` sequences make one optimiser step, whatever the number of
processes and gradient-accumulation steps they are split into (the paper states global batches).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

from bertkit.errors import BertkitError
from bertkit.settings.fields import (
    LR_SCHEDULES,
    OPTIMIZERS,
    OverwriteSettings,
    ProgressSettings,
    SquadWindowSettings,
    _at_least_one,
    _positive,
    coerce_paths,
    default_lr,
    flag,
    parse_lr_grid,
    parse_one_lr,
)
from bertkit.tasks.files import MAX_LINE_BYTES

# -------------------------------------------------------------------------------------------------
# Training: shared fields
# -------------------------------------------------------------------------------------------------


@dataclass(kw_only=True)
class TrainingSettings(OverwriteSettings, ProgressSettings):
    """Optimisation, logging and checkpoint settings shared by every training command."""

    output_dir: Path = flag(aliases=("--out",))
    """Directory for this run's model, metrics.jsonl and report."""
    learning_rate: float | None = flag(None, aliases=("--lr",), parse=parse_one_lr)
    """Peak learning rate. Default: the paper's rate for the task on models 768 wide and up, 1e-4 below."""
    num_train_epochs: float | None = flag(None, aliases=("--epochs",))
    """Passes over the training data (fractions allowed). Default: the task's (the paper's) number."""
    batch_size: int | None = None
    """GLOBAL batch: sequences per optimiser step, split over gradient-accumulation steps (and processes)."""
    gradient_accumulation_steps: int = 1
    """Micro-batches per optimiser step: each is batch_size / gradient_accumulation_steps sequences."""
    warmup_ratio: float = 0.1
    """Share of all optimiser steps over which the learning rate rises linearly from 0."""
    warmup_steps: int | None = None
    """Warm-up as a step count; overrides --warmup-ratio when given."""
    lr_scheduler_type: Literal["linear", "cosine", "constant_with_warmup"] = "linear"
    """The learning rate after warm-up (transformers' names): linear decay to 0 at the last step (the paper's),
    cosine (half a cosine to 0), or constant_with_warmup (stays at the peak)."""
    weight_decay: float = 0.01
    """Decoupled weight decay (not on biases and LayerNorm weights, as in the paper's code)."""
    optimizer: Literal["adamw", "lamb"] = "adamw"
    """adamw (the paper's Adam with weight decay) or lamb (large-batch pre-training, You et al. 2019)."""
    adam_beta1: float = 0.9
    """Adam's first-moment decay."""
    adam_beta2: float = 0.999
    """Adam's second-moment decay."""
    adam_epsilon: float = 1e-6
    """Adam's epsilon (google-research/bert uses 1e-6)."""
    max_grad_norm: float = 1.0
    """Clip the global gradient norm to this; 0 disables clipping."""
    bf16: bool = False
    """bfloat16 autocast (CPUs with AVX-512 BF16 or AMX, recent GPUs); weights and optimiser stay fp32."""
    compile: bool = False
    """torch.compile each encoder layer (off by default: measured in BENCHMARKS.md)."""
    seed: int = 1
    """Seed for the initial weights of new heads, dropout and the data order."""
    logging_steps: int = 50
    """Write a training record to metrics.jsonl every N optimiser steps."""
    eval_steps: int | None = None
    """Evaluate every N optimiser steps. Default: at the end of every epoch and of the run."""
    save_steps: int | None = None
    """Save a resumable checkpoint every N optimiser steps. Default: at the end only."""
    save_total_limit: int = 2
    """Keep the newest N checkpoints."""
    skip_nonfinite: int = 0
    """Skip up to N optimiser steps whose loss or gradient is NaN or infinite (their batches are dropped and
    counted in metrics.jsonl). Default 0: the first one stops the run, naming the step and last checkpoint."""
    max_train_samples: int | None = None
    """Train on the first N training examples (quick runs). Default: all."""
    device: str = "auto"
    """Where to train: auto (CUDA when present, else cpu), cpu, cuda, cuda:1, ... Under torchrun, auto and
    cuda mean each process's own GPU (cuda:LOCAL_RANK)."""
    fp16: bool = False
    """float16 autocast with a gradient scaler (GPUs without bf16); weights and optimiser stay fp32."""
    fsdp: bool = False
    """Under torchrun: shard parameters, gradients and optimiser state over the processes (FSDP2, per encoder
    layer) instead of replicating the model (DDP). For models whose training state does not fit one device."""
    gradient_checkpointing: bool = False
    """Recompute each encoder layer's activations in the backward pass: less memory, about a third more compute."""
    dataloader_num_workers: int | None = None
    """Processes collating batches ahead of the step. Default: 2 on CUDA, 0 on the CPU (where workers would
    take cores from the step itself)."""
    ddp_timeout: float = 1800.0
    """Under torchrun: seconds a process waits for a peer in a collective before it gives up (exit non-zero)."""
    report_to: Literal["none", "tensorboard"] = "none"
    """Also write TensorBoard event files to OUTPUT_DIR/tensorboard (pip install 'bertkit[tensorboard]')."""

    # Checked as one positive number each; a subclass whose learning_rate is a grid checks it rate by rate.
    positive_fields: ClassVar[tuple[str, ...]] = ("learning_rate", "num_train_epochs", "adam_epsilon")

    def __post_init__(self) -> None:
        coerce_paths(self)  # str -> Path for every field typed Path (the type hints say which)
        if self.bf16 and self.fp16:
            raise BertkitError("bf16 and fp16 are both set; choose one autocast type")
        if self.dataloader_num_workers is not None and self.dataloader_num_workers < 0:
            raise BertkitError(f"dataloader_num_workers must be >= 0, got {self.dataloader_num_workers}")
        if not (math.isfinite(self.ddp_timeout) and self.ddp_timeout > 0):
            raise BertkitError(f"ddp_timeout must be a positive number of seconds, got {self.ddp_timeout}")
        _positive(self, *self.positive_fields)
        _positive(self, "weight_decay", "max_grad_norm", strict=False, allow_none=False)
        _at_least_one(self, "batch_size", "gradient_accumulation_steps", "logging_steps", "eval_steps", "save_steps",
                      "save_total_limit", "max_train_samples")
        if not 0 <= self.warmup_ratio < 1:
            raise BertkitError(f"warmup_ratio must be in [0, 1), got {self.warmup_ratio}")
        if self.skip_nonfinite < 0:
            raise BertkitError(f"skip_nonfinite must be >= 0, got {self.skip_nonfinite}")
        if self.warmup_steps is not None and self.warmup_steps < 0:
            raise BertkitError(f"warmup_steps must be >= 0, got {self.warmup_steps}")
        for name in ("adam_beta1", "adam_beta2"):
            if not 0 <= getattr(self, name) < 1:
                raise BertkitError(f"{name} must be in [0, 1), got {getattr(self, name)}")
        if self.optimizer not in OPTIMIZERS:
            raise BertkitError(f"optimizer {self.optimizer!r} is not one of {OPTIMIZERS}")
        if self.lr_scheduler_type not in LR_SCHEDULES:
            raise BertkitError(f"lr_scheduler_type {self.lr_scheduler_type!r} is not one of {LR_SCHEDULES}")

    def training(self, **overrides: Any) -> TrainingSettings:
        """The shared fields alone (what the training loop reads), with ``overrides`` applied."""
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(TrainingSettings)}
        return TrainingSettings(**{**values, **overrides})

    def as_dict(self) -> dict[str, Any]:
        return {k: (str(v) if isinstance(v, Path) else v) for k, v in dataclasses.asdict(self).items()}


@dataclass(kw_only=True)
class FinetuneSettings(TrainingSettings):
    """Fine-tuning a pre-trained checkpoint on a task."""

    paper_learning_rate: ClassVar[float] = 2e-5

    model_name_or_path: Path = flag(aliases=("--model",))
    """Pre-trained checkpoint directory (Hugging Face layout: config.json, model.safetensors, vocab.txt)."""
    max_seq_length: int = 128
    """Tokens per input after WordPiece, [CLS] and [SEP] included; longer inputs are truncated."""
    eval_batch_size: int = 64
    """Sequences per batch when predicting."""
    max_eval_samples: int | None = None
    """Evaluate on the first N evaluation examples. Default: all."""
    resume: bool = False
    """Continue the run in --output-dir from its last checkpoint (write them with --save-steps); the result
    equals an uninterrupted run's. A GLUE grid re-runs the (rate, seed) runs that had finished."""

    def __post_init__(self) -> None:
        super().__post_init__()
        _at_least_one(self, "max_seq_length", "eval_batch_size", "max_eval_samples")

    def learning_rate_for(self, hidden_size: int) -> float:
        return self.learning_rate if self.learning_rate is not None else default_lr(hidden_size,
                                                                                    self.paper_learning_rate)


def first(items: list, n: int | None) -> list:
    """The first ``n`` items (all when n is None): what --max-train-samples / --max-eval-samples mean."""
    return list(items) if n is None else list(items[:n])


# -------------------------------------------------------------------------------------------------
# Tasks
# -------------------------------------------------------------------------------------------------


@dataclass(kw_only=True)
class SequenceClassificationSettings(FinetuneSettings):
    """[CLS] classification or regression of texts and text pairs (section 4.1): batch 32, 3 epochs,
    max_seq_length 128. The paper picks the learning rate on dev from 2e-5..5e-5 with several restarts;
    here one run by default, the grid with --learning-rate paper."""

    learning_rate: tuple[float, ...] | None = flag(None, aliases=("--lr",), parse=parse_lr_grid)
    """One rate, a comma list (a grid: one run per rate and seed), or 'paper' (2e-5,3e-5,4e-5,5e-5) or
    'miniature' (3e-5,5e-5,1e-4,3e-4). Default: one run at 2e-5 on models 768 wide and up, 1e-4 below."""
    seed: tuple[int, ...] = flag((1,), aliases=("--seeds",))
    """Seed of each restart (a comma list runs one training per seed)."""
    num_train_epochs: float = flag(3.0, aliases=("--epochs",))
    """Passes over the training data."""
    batch_size: int = 32
    """GLOBAL batch: sequences per optimiser step."""
    eval_batch_size: int = 128
    """Sequences per batch when predicting."""

    positive_fields: ClassVar[tuple[str, ...]] = ("num_train_epochs", "adam_epsilon")  # learning_rate: below

    def __post_init__(self) -> None:
        # One value (Python, --config JSON) or a grid: a tuple from here on, as the flags give it (coerced
        # while the object is built, as coerce_paths turns str into Path).
        lrs, seeds = self.learning_rate, self.seed
        lrs = (lrs,) if isinstance(lrs, (int, float)) else lrs
        self.learning_rate = tuple(lrs) if lrs is not None else None
        self.seed = (seeds,) if isinstance(seeds, int) else tuple(seeds)
        super().__post_init__()
        for lr in self.learning_rate or ():
            if not (math.isfinite(lr) and lr > 0):
                raise BertkitError(f"learning_rate must be finite and positive, got {lr}")
        if not self.seed:
            raise BertkitError("seed: give at least one seed")

    def grid(self, hidden_size: int) -> tuple[float, ...]:
        return self.learning_rate or (default_lr(hidden_size, self.paper_learning_rate),)


@dataclass(kw_only=True)
class GlueSettings(SequenceClassificationSettings):
    """GLUE (section 4.1): batch 32, 3 epochs, max_seq_length 128. The paper picks the learning rate on dev
    from 2e-5..5e-5 with several restarts; here one run by default, the grid with --learning-rate paper."""

    task: str
    """cola, sst2, mrpc, stsb, qqp, mnli, qnli, rte or wnli."""
    data_dir: Path
    """The GLUE root holding SST-2/, MRPC/, ... (each with train.tsv, dev.tsv, test.tsv)."""

    def __post_init__(self) -> None:
        super().__post_init__()


@dataclass(kw_only=True)
class ClassifySettings(SequenceClassificationSettings):
    """Your own texts (CSV/TSV with a header, or JSON lines) and labels: classification, or regression when
    the labels are numbers. Same loop, grid and report as GLUE; the label names are saved in the model."""

    train_file: Path
    """Training data: .csv, .tsv or .jsonl (another suffix: --input-format)."""
    validation_file: Path
    """Scored after each epoch (the report's numbers); same columns as --train-file."""
    test_file: Path | None = None
    """Inputs to predict with the best run (labels not needed): written to OUTPUT_DIR/test_predictions.jsonl."""
    text_column: str = "text"
    """Column (or JSONL field) holding the text."""
    text_pair_column: str | None = None
    """Column holding a second text (sentence-pair tasks)."""
    label_column: str = "label"
    """Column holding the label (a class name, or a number for regression)."""
    problem_type: Literal["auto", "classification", "regression"] = "auto"
    """auto: regression when every training label is a number and some are not integers, else classification."""
    input_format: Literal["auto", "jsonl", "csv", "tsv"] = "auto"
    """How to read the train, validation and test files; auto: by each one's suffix (.csv, .tsv, .jsonl)."""
    max_line_bytes: int = MAX_LINE_BYTES
    """The longest line (CSV: record) the files may hold, in bytes; a longer one stops the run naming it."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.max_line_bytes < 1:
            raise BertkitError(f"max_line_bytes must be at least 1, got {self.max_line_bytes}")


@dataclass(kw_only=True)
class NerSettings(FinetuneSettings):
    """CoNLL-2003 NER (section 5.3): the tag of each word read at its first WordPiece, no CRF."""

    paper_learning_rate: ClassVar[float] = 5e-5

    data_dir: Path
    """Directory holding train.txt, valid.txt and test.txt in CoNLL column format."""
    tag_scheme: Literal["iob1", "iob2"] = "iob2"
    """The files' tagging scheme (the original CoNLL-2003 release is iob1)."""
    num_train_epochs: float = flag(3.0, aliases=("--epochs",))
    """Passes over the training data."""
    batch_size: int = 32
    """GLOBAL batch: sentences per optimiser step."""

    def __post_init__(self) -> None:
        super().__post_init__()


SQUAD_PAPER = {"1.1": {"num_train_epochs": 3.0, "batch_size": 32}, "2.0": {"num_train_epochs": 2.0, "batch_size": 48}}


@dataclass(kw_only=True)
class SquadSettings(FinetuneSettings, SquadWindowSettings):
    """SQuAD v1.1 (section 4.2: 3 epochs, lr 5e-5, batch 32) and v2.0 (section 4.3: 2 epochs, batch 48).
    Without --train-file the predict file is split by article, and every report says so."""

    paper_learning_rate: ClassVar[float] = 5e-5

    predict_file: Path
    """The SQuAD JSON to predict and score (dev-v1.1.json, dev-v2.0.json)."""
    train_file: Path | None = None
    """Training JSON. Default: train on most articles of --predict-file and score the held-out ones."""
    version: Literal["1.1", "2.0"] = "1.1"
    """2.0 adds unanswerable questions (the no-answer threshold is chosen on the predicted file)."""
    max_seq_length: int = 384
    """Tokens per window (question + context chunk)."""
    heldout_fraction: float = 1 / 6
    """Without --train-file: the share of articles held out for scoring."""
    split_seed: int = 0
    """Without --train-file: the seed of the article split."""

    def __post_init__(self) -> None:
        if self.version not in SQUAD_PAPER:
            raise BertkitError(f"version {self.version!r} must be '1.1' or '2.0'")
        for name, value in SQUAD_PAPER[self.version].items():  # the paper's per-version defaults, then checked
            if getattr(self, name) is None:
                setattr(self, name, value)
        super().__post_init__()
        if not 0 < self.heldout_fraction < 1:
            raise BertkitError(f"heldout_fraction must be in (0, 1), got {self.heldout_fraction}")
        self.check_windows()


@dataclass(kw_only=True)
class SwagSettings(FinetuneSettings):
    """SWAG (section 4.4): 3 epochs, lr 2e-5, batch 16; swagaf CSV files."""

    train_file: Path
    """Labelled training CSV (train.csv)."""
    predict_file: Path
    """val.csv (scored) or test.csv (predicted only)."""
    num_train_epochs: float = flag(3.0, aliases=("--epochs",))
    """Passes over the training data."""
    batch_size: int = 16
    """GLOBAL batch: examples (each with 4 endings) per optimiser step."""

    def __post_init__(self) -> None:
        super().__post_init__()


@dataclass(kw_only=True)
class PretrainSettings(TrainingSettings):
    """Masked LM + next-sentence pre-training (section 3.1, appendix A.2): Adam(W) at 1e-4, warm-up over
    1% of the steps (the paper's 10,000 of 1,000,000), optionally 90% of steps at 128 tokens then 512."""

    data: Path
    """Instances from create-pretraining-data (phase 1, e.g. 128 tokens)."""
    vocab: Path
    """The tokenizer the data was made with: its directory or its vocab.txt."""
    config_name: Any = "mini"
    """Model shape: a preset (tiny, mini, small, medium, base, large), a config.json path, or a BertConfig."""
    max_steps: int
    """Optimiser steps in all."""
    phase2_data: Path | None = None
    """Longer instances (e.g. 512 tokens) for the last (1 - phase1_fraction) of the steps."""
    phase1_fraction: float = 0.9
    """Share of the steps spent on --data when --phase2-data is given."""
    init_from: Path | None = None
    """Continue pre-training from this checkpoint (Hugging Face layout, e.g. a released BERT for domain
    adaptation) instead of random weights; its config.json replaces --config-name, and heads it lacks start
    fresh (they are listed in the log)."""
    nsp: bool = True
    """Train next-sentence prediction beside the masked LM; --no-nsp trains the masked LM alone (the model
    is then a BertForMaskedLM, without pooler or NSP head)."""
    mlm_bias_init: Literal["zeros", "unigram"] = "zeros"
    """Initial masked-LM output bias: zeros (google-research/bert), or unigram: the log-frequency of the
    training targets (counted on every 50th instance), so a new model starts at the prediction a reader of no
    context makes instead of spending its first thousand steps learning token frequencies (with --init-from,
    the checkpoint's bias is kept)."""
    position_init: Literal["normal", "sinusoidal"] = "normal"
    """Initial position embeddings: normal (google-research/bert's truncated normal), or sinusoidal: the
    Transformer's sine/cosine table (Vaswani et al. 2017) scaled to the word embeddings' size, which gives a
    new model relative positions from the first step; the table stays a learned parameter (with
    --init-from, the checkpoint's table is kept)."""
    eval_data: Path | None = None
    """Held-out instances for MLM and NSP accuracy."""
    eval_instances: int = 2000
    """Held-out instances scored at each evaluation."""
    eval_batch_size: int = 64
    """Sequences per held-out batch."""
    dynamic_masking_seed: int | None = None
    """Seed for masks drawn at load time, for data made with create-pretraining-data --masking dynamic.
    Default: the seed in the data's manifest."""
    resume: bool = False
    """Continue the run in --output-dir from its last checkpoint."""
    num_train_epochs: float | None = flag(None, cli=False)
    """Not used: pre-training runs --max-steps steps (epochs repeat as needed)."""
    max_train_samples: int | None = flag(None, cli=False)
    """Not used: make smaller data with create-pretraining-data instead."""
    learning_rate: float = flag(1e-4, aliases=("--lr",), parse=parse_one_lr)
    """Peak learning rate."""
    warmup_ratio: float = 0.01
    """Share of all steps spent warming up."""
    batch_size: int = 32
    """GLOBAL batch: sequences per optimiser step."""
    logging_steps: int = 10
    """Write a training record every N steps."""
    seed: int = 42
    """Seed for the initial weights, dropout and the data order."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.max_steps < 1:
            raise BertkitError(f"max_steps must be at least 1, got {self.max_steps}")
        if not 0 < self.phase1_fraction < 1:
            raise BertkitError(f"phase1_fraction must be in (0, 1), got {self.phase1_fraction}")
        for name in ("eval_instances", "eval_batch_size"):
            if getattr(self, name) < 1:
                raise BertkitError(f"{name} must be at least 1, got {getattr(self, name)}")


@dataclass(kw_only=True)
class DemoSettings(OverwriteSettings, ProgressSettings):
    """The BERT recipe end to end on Python's own documentation."""

    model_name_or_path: Path | None = flag(None, aliases=("--model",))
    """The example checkpoint (bertkit download-example-model DIR) for the similarity stage; omitted: skipped."""
    output_dir: Path = flag(Path("runs/demo"), aliases=("--out",))
    """Directory for everything the demo makes."""
    steps: int = 2000
    """Pre-training steps (600 shows the mechanics; the fine-tuning stage gains from about 2,000)."""
    seed: int = 0
    """Seed of every stage."""

    def __post_init__(self) -> None:
        coerce_paths(self)  # str -> Path for every field typed Path (the type hints say which)
        _at_least_one(self, "steps")


STUDY_COMBINATIONS = ("embeddings", "second_to_last_hidden", "last_hidden", "weighted_sum_last_four",
                      "concat_last_four", "weighted_sum_all_layers")  # the rows of the paper's Table 7


@dataclass(kw_only=True)
class StudySettings(OverwriteSettings, ProgressSettings):
    """The feature-based study. The paper's BiLSTM is "768-dimensional" on a 768-wide model; the default
    here scales it with the model: ``lstm_hidden`` None = hidden_size // 2 per direction, so the BiLSTM's
    output is as wide as the model (384 for MiniLM-L6-H384)."""

    data_dir: Path
    """CoNLL-2003 directory (train.txt, valid.txt)."""
    model_name_or_path: Path = flag(aliases=("--model",))
    """Checkpoint whose frozen layers feed the tagger."""
    output_dir: Path = flag(aliases=("--out",))
    """Directory for report.json and the cached activations/."""
    combinations: tuple[str, ...] = STUDY_COMBINATIONS
    """Comma list of layer combinations (the rows of Table 7)."""
    lstm_hidden: int | None = None
    """BiLSTM width per direction. Default: hidden_size // 2."""
    lstm_layers: int = 2
    """BiLSTM layers."""
    dropout: float = 0.25
    """Dropout on the BiLSTM's input and between its layers."""
    num_train_epochs: int = flag(3, aliases=("--epochs",))
    """Passes over the training sentences."""
    batch_size: int = 32
    """Sentences per batch."""
    learning_rate: float = flag(1e-3, aliases=("--lr",), parse=parse_one_lr)
    """Adam's learning rate for the tagger."""
    max_seq_length: int = 128
    """Tokens per sentence when extracting activations."""
    extract_batch_size: int = 64
    """Sentences per batch when extracting activations."""
    max_train_samples: int | None = None
    """Train on the first N training sentences (reduced runs)."""
    tag_scheme: Literal["iob1", "iob2"] = "iob2"
    """The files' tagging scheme."""
    seed: int = 1
    """Seed of the tagger's weights and the data order."""
    device: str = "cpu"
    """cpu, cuda, ..."""

    def __post_init__(self) -> None:
        coerce_paths(self)  # str -> Path for every field typed Path (the type hints say which)
        for name in self.combinations:
            if name not in STUDY_COMBINATIONS:
                raise BertkitError(f"unknown layer combination {name!r}; choose from {list(STUDY_COMBINATIONS)}")
        for name in ("lstm_layers", "num_train_epochs", "batch_size", "learning_rate", "max_seq_length",
                     "extract_batch_size"):
            if getattr(self, name) <= 0:
                raise BertkitError(f"{name} must be positive, got {getattr(self, name)}")
        if not 0 <= self.dropout < 1:
            raise BertkitError(f"dropout must be in [0, 1), got {self.dropout}")
        _at_least_one(self, "lstm_hidden", "max_train_samples")
