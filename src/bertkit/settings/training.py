"""Settings of the commands that train: ``pretrain``, ``finetune TASK``, ``feature-study`` and ``demo``.

``TrainingSettings`` holds what every training command shares; each task adds its own fields and the paper's
defaults for it. Batch sizes are global, as the paper states them: ``batch_size`` sequences make one optimiser step,
however many processes and gradient-accumulation steps they are split into.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

from bertkit._parallel import info_from_env
from bertkit.config import PRESETS, BertConfig
from bertkit.errors import BertkitError
from bertkit.settings.fields import (
    OverwriteSettings,
    ProgressSettings,
    SquadWindowSettings,
    at_least_one,
    default_lr,
    flag,
    in_range,
    in_seed_range,
    non_negative,
    parse_lr_grid,
    parse_one_lr,
    positive,
    redefault,
    share,
    step_count,
    strict_share,
    tokenizer_path,
)
from bertkit.tasks.files import MAX_LINE_BYTES, read_records

# -------------------------------------------------------------------------------------------------
# The training knobs: each declared once, for the command line and bertkit.TrainingArguments alike
# -------------------------------------------------------------------------------------------------

STRATEGIES = Literal["no", "steps", "epoch"]


def micro_batch_size(global_batch: int, world_size: int, grad_accum: int) -> int:
    """Sequences each process feeds per micro-step: the global batch split over processes and accumulation."""
    per, rest = divmod(global_batch, world_size * grad_accum)
    if rest or per < 1:
        raise BertkitError(
            f"--batch-size {global_batch} (global) does not split evenly over {world_size} process(es) x "
            f"{grad_accum} gradient-accumulation step(s); choose a batch size divisible by {world_size * grad_accum}"
        )
    return per


@dataclass(kw_only=True)
class TrainingSettings(OverwriteSettings, ProgressSettings):
    """Every knob of the one training loop, each declared once (transformers' name where the concept is the same,
    and its default as ``hf`` where it differs, which ``bertkit.TrainingArguments`` takes). The loop reads this
    object, whichever front end built it."""

    # what eval_strategy left unset (and no eval_steps) becomes: a task whose evaluation is costly says "no"
    unset_eval_strategy: ClassVar[str] = "epoch"
    # entries a run's marker records beside these settings, each dating a meaning a setting took on: a marker
    # without one was written before it (as_meant reads its settings as they acted then)
    recorded_marks: ClassVar[dict[str, Any]] = {}

    output_dir: Path = flag(aliases=("--out",), hf=None)
    """Directory for this run's model, metrics.jsonl, checkpoints and report."""
    learning_rate: float | None = flag(None, hf=5e-5, aliases=("--lr",), parse=parse_one_lr, check=positive,
                                       checkpoint=True)
    """Peak learning rate. Default: the paper's rate for the task on models 768 wide and up, 1e-4 below."""
    num_train_epochs: float | None = flag(None, hf=3.0, aliases=("--epochs",), check=positive)
    """Passes over the training data (fractions allowed). Default: the task's (the paper's) number."""
    max_steps: int = flag(-1, check=in_range(lambda v: v == -1 or v >= 1, "at least 1 (or -1: not given)"))
    """Optimiser steps in all; overrides num_train_epochs when given (-1: not given)."""
    batch_size: int | None = flag(None, trainer=False, check=at_least_one)
    """GLOBAL batch: sequences per optimiser step, split over gradient-accumulation steps (and processes). Default:
    the task's (the paper's): SQuAD's 32 for version 1.1, 48 for 2.0."""
    gradient_accumulation_steps: int = flag(1, check=at_least_one, checkpoint=True)
    """Micro-batches per optimiser step: each is batch_size / gradient_accumulation_steps sequences."""
    warmup_ratio: float | None = flag(0.1, hf=None, check=share, checkpoint=True)
    """Share of all optimiser steps over which the learning rate rises linearly from 0."""
    warmup_steps: float | None = flag(None, hf=0, check=non_negative, checkpoint=True)
    """Warm-up as a step count (below 1: a share of all steps, as transformers 5 reads it); when above 0 it
    overrides --warmup-ratio."""
    lr_scheduler_type: Literal["linear", "cosine", "cosine_with_restarts", "polynomial", "constant",
                               "constant_with_warmup", "inverse_sqrt", "cosine_with_min_lr",
                               "warmup_stable_decay"] = flag("linear", checkpoint=True)
    """The learning rate after warm-up (transformers' names and defaults): linear decay to 0 at the last step (the
    paper's), cosine (half a cosine to 0; cosine_with_restarts, one cycle, the same), polynomial (linear to 1e-7),
    constant_with_warmup (stays at the peak), inverse_sqrt (1/sqrt(step / warm-up) after it), or constant (the peak
    from the first step: warm-up ignored, as in transformers). TrainingArguments also takes cosine_with_min_lr and
    warmup_stable_decay, which need lr_scheduler_kwargs (min_lr or min_lr_rate; num_decay_steps)."""
    weight_decay: float = flag(0.01, hf=0.0, check=non_negative, checkpoint=True)
    """Decoupled weight decay (not on biases and LayerNorm weights, as in the paper's code)."""
    optim: Literal["adamw", "adamw_torch", "adamw_torch_fused"] = flag(
        "adamw", hf="adamw_torch_fused", cli=False, how_to_run=True)
    """Accepted from transformers' scripts: all three name the one torch.optim.AdamW."""
    adam_beta1: float = flag(0.9, check=share, checkpoint=True)
    """Adam's first-moment decay."""
    adam_beta2: float = flag(0.999, check=share, checkpoint=True)
    """Adam's second-moment decay."""
    adam_epsilon: float = flag(1e-6, hf=1e-8, check=positive, checkpoint=True)
    """Adam's epsilon (google-research/bert uses 1e-6)."""
    max_grad_norm: float = flag(1.0, check=in_range(lambda v: math.isfinite(v) and v >= 0, (
        "a finite non-negative number (0: no clipping, the norm still logged as grad_norm; transformers' inf)")),
        checkpoint=True)
    """Clip the global gradient norm to this; 0 disables clipping (the norm is still measured and logged)."""
    bf16: bool = flag(False, checkpoint=True)
    """bfloat16 autocast (CPUs with AVX-512 BF16 or AMX, recent GPUs); weights and optimiser stay fp32."""
    fp16: bool = flag(False, checkpoint=True)
    """float16 autocast with a gradient scaler (GPUs without bf16); weights and optimiser stay fp32."""
    torch_compile: bool = flag(False, aliases=("--compile",))
    """torch.compile each encoder layer (off by default: measured in BENCHMARKS.md)."""
    seed: int = flag(1, hf=42, check=in_seed_range, checkpoint=True)
    """Seed for the initial weights of new heads, dropout and the data order."""
    logging_strategy: STRATEGIES = "steps"
    """When to write a training record to metrics.jsonl: every --logging-steps steps, at each epoch's end, or
    only at the last step."""
    logging_steps: float = flag(50, hf=500, check=step_count)
    """Write a training record every N optimiser steps (below 1: a share of all steps)."""
    eval_strategy: STRATEGIES | None = flag(None, hf="no")
    """When to evaluate: every --eval-steps steps (or --logging-steps), at each epoch's end (and the run's), or
    never. Default: steps when --eval-steps is given, else epoch (SQuAD: no; its held-out questions are scored
    once, at the end; no, and any other refused, where there is nothing to score: pretrain without --eval-data,
    SWAG's unlabelled test.csv)."""
    eval_steps: float | None = flag(None, check=step_count)
    """With eval_strategy steps: evaluate every N optimiser steps (below 1: a share of all steps)."""
    eval_delay: float = flag(0, check=non_negative)
    """No evaluation before this many optimiser steps (eval_strategy steps) or epochs (epoch), as transformers'."""
    save_strategy: STRATEGIES = "steps"
    """When to save a resumable checkpoint: every --save-steps steps, at each epoch's end, or never (also not at
    the end). A checkpoint is written at the end of the run unless no."""
    save_steps: float | None = flag(None, hf=500, check=step_count)
    """Save a resumable checkpoint every N optimiser steps (below 1: a share of all steps). Default: at the end
    only."""
    save_total_limit: int | None = flag(2, hf=None)
    """Keep N checkpoints in all: the newest, and the best among them when the best is kept (None, 0 or below: all,
    as transformers reads them)."""
    skip_nonfinite: int = flag(0, check=non_negative)
    """Skip up to N optimiser steps whose loss or gradient is NaN or infinite (their batches are dropped and
    counted in metrics.jsonl). Default 0: the first one stops the run, naming the step and last checkpoint."""
    max_train_samples: int | None = flag(None, trainer=False, check=at_least_one)
    """Train on the first N training examples (quick runs). Default: all."""
    device: str = flag("auto", trainer=False, how_to_run=True)
    """Where to train: auto (CUDA when present, else cpu), cpu, cuda, cuda:1, ... Under torchrun, auto and
    cuda mean each process's own GPU (cuda:LOCAL_RANK)."""
    gradient_checkpointing: bool = flag(False, hf=None, how_to_run=True)
    """Recompute each encoder layer's activations in the backward pass: less memory, about a third more compute."""
    dataloader_num_workers: int | None = flag(None, check=non_negative, how_to_run=True)
    """Processes tokenizing and collating batches ahead of the step. Default (also through TrainingArguments,
    where transformers defaults to 0): on CUDA every core but two, 2 to 4, so that the GPU never waits for the
    host; 0 on the CPU, where workers would take cores from the step itself."""
    ddp_timeout: float = flag(1800.0, hf=1800, check=positive, how_to_run=True)
    """Under torchrun: seconds a process waits for a peer in a collective before it gives up (exit non-zero)."""
    report_to: Literal["none", "tensorboard"] = flag("none", how_to_run=True)
    """Also write TensorBoard event files to OUTPUT_DIR/tensorboard (pip install 'bertkit[tensorboard]')."""
    resume: bool = flag(False, trainer=False, how_to_run=True)
    """Continue the run in --output-dir from its last checkpoint (write them with --save-steps); the result
    equals an uninterrupted run's. A GLUE grid re-runs the (rate, seed) runs that had finished."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.bf16 and self.fp16:
            raise BertkitError("bf16 and fp16 are both set; choose one autocast type")
        if self.resume and self.overwrite:  # either winning quietly would do what one of them did not ask
            raise BertkitError("--resume and --overwrite are both set: --resume continues the run in --output-dir "
                               "from its last checkpoint, --overwrite starts it again (bertkit's files there are "
                               "removed once the new run is finished); choose one")
        # the one refusal of an evaluation with nothing to score (pre-training without --eval-data, SWAG's test.csv):
        # unset, there is none; asked for (a strategy, a cadence), the run would have ended as if not asked
        why = self.nothing_to_evaluate()
        if self.eval_strategy is None:
            self.eval_strategy = "no" if why else "steps" if self.eval_steps else self.unset_eval_strategy
        if why:
            _refuse_unused(self, ("eval_steps", "eval_delay"), why)
            if self.eval_strategy != "no":
                raise BertkitError(f"--eval-strategy {self.eval_strategy} {why.format(flag='--eval-strategy')}")
        if self.batch_size is not None:  # under torchrun too: refused before a model or data is loaded
            micro_batch_size(self.batch_size, info_from_env().world_size, self.gradient_accumulation_steps)

    def nothing_to_evaluate(self) -> str | None:
        """None when the run has held-out data to score; else why an evaluation setting would do nothing and the fix,
        after its flag (``{flag}``). Then eval_strategy unset is "no", and any other is refused."""
        return None

    def as_meant(self, recorded: dict[str, Any]) -> dict[str, Any]:
        """An earlier run's recorded settings (its run marker's fingerprint) in this version's terms, for --resume to
        compare with these: eval_strategy "epoch" recorded by a run that scored nothing in its loop (what unset
        became before it became "no" there) reads as "no", which is what it did; a mark of ``recorded_marks`` it
        lacks reads as given (the run is read as it acted)."""
        if recorded.get("eval_strategy") == "epoch" and self._scored_nothing(recorded):
            recorded = {**recorded, "eval_strategy": "no"}
        return {**recorded, **self.recorded_marks}

    def _scored_nothing(self, recorded: dict[str, Any]) -> bool:
        """Whether the run ``recorded`` describes evaluated nothing in its loop, whatever its eval_strategy said."""
        return False

    def training(self, **overrides: Any) -> TrainingSettings:
        """The knobs alone (what the training loop reads), with ``overrides`` applied."""
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(TrainingSettings)}
        return TrainingSettings(**{**values, **overrides})

    def as_dict(self) -> dict[str, Any]:
        return {k: (str(v) if isinstance(v, Path) else v) for k, v in dataclasses.asdict(self).items()}

    # -- what the loop derives from the knobs, given the run's length ----------------------------------------
    def steps_of(self, value: float | None, total: int) -> int | None:
        """eval/save/logging steps: a count, or below 1 a share of the run's ``total`` steps (transformers)."""
        if value is None:
            return None
        return max(1, math.ceil(value * total)) if value < 1 else int(value)

    def warmup_for(self, total: int) -> int:
        """Warm-up steps of a ``total``-step run: warmup_steps when above 0 (or without a ratio), else the ratio."""
        if self.warmup_steps is not None and (self.warmup_steps > 0 or self.warmup_ratio is None):
            return int(self.warmup_steps) if self.warmup_steps >= 1 else math.ceil(total * self.warmup_steps)
        return math.ceil(total * (self.warmup_ratio or 0.0))


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
        _refuse_dropped_cadence(self)

    def learning_rate_for(self, hidden_size: int) -> float:
        return self.learning_rate if self.learning_rate is not None else default_lr(hidden_size,
                                                                                    self.paper_learning_rate)


def first(items: list, n: int | None) -> list:
    """The first ``n`` items (all when n is None): what --max-train-samples / --max-eval-samples mean."""
    return list(items) if n is None else list(items[:n])


# -------------------------------------------------------------------------------------------------
# Tasks
# -------------------------------------------------------------------------------------------------


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
            _refuse_unused(self, ("heldout_fraction", "split_seed"), "splits --predict-file into training and "
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


@redefault(max_steps=dataclasses.MISSING, learning_rate=1e-4, warmup_ratio=0.01, batch_size=32, logging_steps=10,
           seed=42, hidden=("num_train_epochs", "max_train_samples"))  # pre-training runs --max-steps on its own data
class PretrainSettings(TrainingSettings):
    """Masked LM + next-sentence pre-training (section 3.1, appendix A.2): Adam(W) at 1e-4, warm-up over
    1% of the steps (the paper's 10,000 of 1,000,000), optionally 90% of steps at 128 tokens then 512."""

    data: Path
    """Instances from create-pretraining-data (phase 1, e.g. 128 tokens)."""
    vocab: Path = flag(check=tokenizer_path)
    """The tokenizer the data was made with: its directory or its vocab.txt."""
    config_name: str | Path | BertConfig = "mini"
    """Model shape: a preset (tiny, mini, small, medium, base, large), a config.json path (or a model directory
    holding one), or a BertConfig."""
    phase2_data: Path | None = None
    """Longer instances (e.g. 512 tokens) for the last (1 - phase1_fraction) of the steps."""
    phase1_fraction: float = flag(0.9, check=strict_share)
    """Share of the steps spent on --data when --phase2-data is given."""
    init_from: Path | None = None
    """Continue pre-training from this checkpoint (e.g. a released BERT, for domain adaptation) instead of random
    weights; its config.json is the model's shape (another --config-name is refused), and heads it lacks start
    fresh."""
    nsp: bool = True
    """Train next-sentence prediction beside the masked LM; --no-nsp trains the masked LM alone (a BertForMaskedLM)."""
    mlm_bias_init: Literal["zeros", "unigram"] = "zeros"
    """Initial masked-LM output bias: zeros (google-research/bert), or unigram: the log-frequency of the training
    targets, so a new model does not spend its first thousand steps learning token frequencies."""
    position_init: Literal["normal", "sinusoidal"] = "normal"
    """Initial position embeddings: normal (normal(0, initializer_range), as transformers draws them), or sinusoidal:
    the Transformer's sine/cosine table (Vaswani et al. 2017) scaled to the word embeddings, still learned."""
    eval_data: Path | None = None
    """Held-out instances for MLM and NSP accuracy."""
    eval_instances: int = flag(2000, check=at_least_one)
    """Held-out instances scored at each evaluation."""
    eval_batch_size: int = flag(64, check=at_least_one)
    """Sequences per held-out batch."""
    dynamic_masking_seed: int | None = None
    """Seed for masks drawn at load time, for data made with create-pretraining-data --masking dynamic.
    Default: the seed in the data's manifest."""

    def nothing_to_evaluate(self) -> str | None:
        return None if self.eval_data is not None else (
            "sets when or how the held-out instances of --eval-data are scored: add --eval-data, or drop {flag}")

    def _scored_nothing(self, recorded: dict[str, Any]) -> bool:
        return recorded.get("eval_data") is None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.max_steps < 1:
            raise BertkitError(f"max_steps must be at least 1, got {self.max_steps}")
        chosen = [f"--{k.replace('_', '-')} {v}" for k, v, new_only in (
            ("mlm_bias_init", self.mlm_bias_init, "unigram"), ("position_init", self.position_init, "sinusoidal"))
            if v == new_only]
        if self.init_from is not None and chosen:  # else silently not applied: from_pretrained keeps the weights
            raise BertkitError(f"{' and '.join(chosen)} initialise new weights, but --init-from {self.init_from} "
                               "starts from the checkpoint's (its masked-LM bias and position embeddings are kept; "
                               "a masked-LM head it lacks starts at zeros): drop them, or drop --init-from")
        if isinstance(self.config_name, (str, Path)) and not str(self.config_name).strip():  # Path("") is "."
            raise BertkitError(f"--config-name {str(self.config_name)!r} is empty: give a preset "
                               f"({', '.join(PRESETS)}) or a config.json path")
        if self.init_from is not None:  # its config.json is the model's shape: another one asked for would be dropped
            _refuse_unused(self, ("config_name",), f"shapes a new model, but --init-from {self.init_from} starts "
                           "from a checkpoint of its own shape (its config.json): drop {flag}, or --init-from")
        # settings of a part of the run that is not there: dropped without a word, the run would not be the one asked
        if self.phase2_data is None:
            _refuse_unused(self, ("phase1_fraction",), "splits --max-steps between --data and --phase2-data: add "
                           "--phase2-data, or drop {flag}")
        if self.eval_data is None:  # eval_strategy, eval_steps and eval_delay: refused as nothing_to_evaluate says
            _refuse_unused(self, ("eval_instances", "eval_batch_size"), self.nothing_to_evaluate())
        _refuse_dropped_cadence(self)


def _csv_header(path: Path) -> list[str] | None:
    """The column names of the CSV ``path``; None where it cannot be read yet (missing, not CSV, empty), which the run
    itself reads and refuses naming the file."""
    try:
        first_record = next(read_records(Path(path), "csv"), None)
    except (OSError, BertkitError):
        return None
    return None if first_record is None else list(first_record[1])


def _refuse_unused(s: Any, names: tuple[str, ...], why: str) -> None:
    """Refuse the first of the fields ``names`` of ``s`` set to other than its default: ``why`` (``{flag}`` in it
    names the flag) says which part of the run, not there, it sets."""
    for f in dataclasses.fields(s):
        if f.name in names and getattr(s, f.name) != f.default:
            flag = f"--{f.name.replace('_', '-')}"
            raise BertkitError(f"{flag} {getattr(s, f.name)} {why.format(flag=flag)}")


def _refuse_dropped_cadence(s: TrainingSettings) -> None:
    """Refuse a cadence setting its strategy does not read (``--eval-strategy epoch --eval-steps 5`` evaluated each
    epoch and dropped the 5 without a word; ``--save-strategy no --save-total-limit 3`` kept nothing). The command
    line's settings only: ``TrainingArguments`` takes them as transformers does, which ignores them."""
    for strategy, reads in (("eval_strategy", {"eval_steps": ("steps",), "eval_delay": ("steps", "epoch")}),
                            ("save_strategy", {"save_steps": ("steps",), "save_total_limit": ("steps", "epoch")}),
                            ("logging_strategy", {"logging_steps": ("steps",)})):
        chosen = getattr(s, strategy)
        for name, used_by in reads.items():
            if chosen not in used_by:
                flag = f"--{strategy.replace('_', '-')}"
                _refuse_unused(s, (name,), f"is read only with {flag} {' or '.join(used_by)}, but {flag} is "
                               f"{chosen}: drop {{flag}}, or pass {flag} {used_by[0]}")


@dataclass(kw_only=True)
class DemoSettings(OverwriteSettings, ProgressSettings):
    """The BERT recipe end to end on Python's own documentation."""

    model_name_or_path: Path | None = flag(None, aliases=("--model",))
    """The example checkpoint (bertkit download-example-model DIR) for the similarity stage; omitted: skipped."""
    output_dir: Path = flag(Path("runs/demo"), aliases=("--out",))
    """Directory for everything the demo makes."""
    steps: int = flag(2000, check=at_least_one)
    """Pre-training steps (600 shows the mechanics; the fine-tuning stage gains from about 2,000)."""
    seed: int = 0
    """Seed of every stage."""


STUDY_COMBINATIONS = ("embeddings", "second_to_last_hidden", "last_hidden", "weighted_sum_last_four",
                      "concat_last_four", "weighted_sum_all_layers")  # the rows of the paper's Table 7


def _combination(name: str, value: str) -> None:
    if value not in STUDY_COMBINATIONS:
        raise BertkitError(f"unknown layer combination {value!r}; choose from {list(STUDY_COMBINATIONS)}")


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
    combinations: tuple[str, ...] = flag(STUDY_COMBINATIONS, check=_combination)
    """Comma list of layer combinations (the rows of Table 7)."""
    lstm_hidden: int | None = flag(None, check=at_least_one)
    """BiLSTM width per direction. Default: hidden_size // 2."""
    lstm_layers: int = flag(2, check=at_least_one)
    """BiLSTM layers."""
    dropout: float = flag(0.25, check=share)
    """Dropout on the BiLSTM's input, between its layers and before the classifier."""
    num_train_epochs: int = flag(3, aliases=("--epochs",), check=at_least_one)
    """Passes over the training sentences."""
    batch_size: int = flag(32, check=at_least_one)
    """Sentences per batch."""
    learning_rate: float = flag(1e-3, aliases=("--lr",), parse=parse_one_lr, check=positive)
    """Adam's learning rate for the tagger."""
    max_seq_length: int | None = flag(None, check=at_least_one)
    """Tokens per window when extracting activations (a longer sentence is split at word boundaries; default: a
    sentence-transformers directory's max_seq_length, which a larger value is refused over; else 128 within the
    model's positions)."""
    extract_batch_size: int = flag(64, check=at_least_one)
    """Sentences per batch when extracting activations."""
    max_train_samples: int | None = flag(None, check=at_least_one)
    """Train on the first N training sentences (reduced runs)."""
    tag_scheme: Literal["iob1", "iob2"] = "iob2"
    """The files' tagging scheme."""
    seed: int = 1
    """Seed of the tagger's weights and the data order."""
    device: str = "cpu"
    """cpu, cuda, ..."""
    resume: bool = flag(False, how_to_run=True)
    """Continue the study in --output-dir that a kill, Ctrl-C or an error cut short: its activations and finished
    combinations are kept, a tagger it cut short goes on from its last checkpoint. Refused when the settings differ
    from that run's."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.resume and self.overwrite:  # either winning quietly would do what one of them did not ask
            raise BertkitError("--resume and --overwrite are both set: --resume continues the study cut short in "
                               "--output-dir, --overwrite starts it again (bertkit's files there are removed once "
                               "the new one is finished); choose one")
        if not self.combinations:  # else a run that trains nothing and reports an empty table
            raise BertkitError(f"combinations: give at least one of {list(STUDY_COMBINATIONS)}")
        # a repeat would train the same tagger again into the same runs/NAME, and the table holds one row per name
        twice = next((c for k, c in enumerate(self.combinations) if c in self.combinations[:k]), None)
        if twice is not None:
            raise BertkitError(f"combination {twice} is given twice in {list(self.combinations)}; give each once")
