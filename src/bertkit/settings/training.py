"""Settings of the commands that train: ``pretrain``, ``finetune TASK``, ``feature-study`` and ``demo``.

``TrainingSettings`` holds what every training command shares; ``pretrain``'s, ``demo``'s and ``feature-study``'s
settings are here too, ``finetune TASK``'s (each task's fields and the paper's defaults for it) in
``bertkit.settings.finetune``. Batch sizes are global, as the paper states them: ``batch_size`` sequences make one optimiser step,
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
    at_least_one,
    flag,
    in_range,
    in_seed_range,
    non_negative,
    parse_one_lr,
    positive,
    redefault,
    share,
    step_count,
    strict_share,
    tokenizer_path,
)

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
            refuse_unused(self, ("eval_steps", "eval_delay"), why)
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



def first(items: list, n: int | None) -> list:
    """The first ``n`` items (all when n is None): what --max-train-samples / --max-eval-samples mean."""
    return list(items) if n is None else list(items[:n])



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
            refuse_unused(self, ("config_name",), f"shapes a new model, but --init-from {self.init_from} starts "
                           "from a checkpoint of its own shape (its config.json): drop {flag}, or --init-from")
        # settings of a part of the run that is not there: dropped without a word, the run would not be the one asked
        if self.phase2_data is None:
            refuse_unused(self, ("phase1_fraction",), "splits --max-steps between --data and --phase2-data: add "
                           "--phase2-data, or drop {flag}")
        if self.eval_data is None:  # eval_strategy, eval_steps and eval_delay: refused as nothing_to_evaluate says
            refuse_unused(self, ("eval_instances", "eval_batch_size"), self.nothing_to_evaluate())
        refuse_dropped_cadence(self)



def refuse_unused(s: Any, names: tuple[str, ...], why: str) -> None:
    """Refuse the first of the fields ``names`` of ``s`` set to other than its default: ``why`` (``{flag}`` in it
    names the flag) says which part of the run, not there, it sets."""
    for f in dataclasses.fields(s):
        if f.name in names and getattr(s, f.name) != f.default:
            flag = f"--{f.name.replace('_', '-')}"
            raise BertkitError(f"{flag} {getattr(s, f.name)} {why.format(flag=flag)}")


def refuse_dropped_cadence(s: TrainingSettings) -> None:
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
                refuse_unused(s, (name,), f"is read only with {flag} {' or '.join(used_by)}, but {flag} is "
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
