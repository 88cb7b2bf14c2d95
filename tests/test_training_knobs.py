"""The two training front ends cannot drift: each knob is declared once (``bertkit.settings.TrainingSettings``), and
the command line and ``bertkit.TrainingArguments`` are derived from it. Here every knob both expose is set to the
same value in each, a real `bertkit finetune glue` and a real ``Trainer.train`` are run up to the loop, and the loop
must receive the same value, the same run length, cadence and warm-up, and the same checkpoint fingerprint."""

from __future__ import annotations

import dataclasses
import typing

import pytest

import bertkit
from bertkit.cli import main
from bertkit.settings import GlueSettings, TrainingSettings
from bertkit.settings.fields import on_command_line
from bertkit.training import finetune_run, trainer
from bertkit.training.run_setup import cadence, run_fingerprint

WORDS = ["good", "bad", "the", "movie", "was"]
ROWS = [(f"the movie was {w}", int(w == "good")) for w in ("good", "bad") * 8]  # 16 rows: 2 batches of 8

# Every knob both front ends share, set alike in both (their defaults differ: bertkit's on the command line,
# transformers' in TrainingArguments); each case then changes one of them. A new knob needs an entry here.
BASE = {"learning_rate": 1e-3, "num_train_epochs": 3.0, "max_steps": -1, "gradient_accumulation_steps": 1,
        "warmup_ratio": 0.1, "warmup_steps": 0, "lr_scheduler_type": "linear", "weight_decay": 0.01,
        "adam_beta1": 0.9, "adam_beta2": 0.999, "adam_epsilon": 1e-6, "max_grad_norm": 1.0, "bf16": False, "seed": 1,
        "logging_strategy": "steps", "logging_steps": 50, "eval_strategy": "epoch", "eval_steps": None, "eval_delay": 0,
        "save_strategy": "steps", "save_steps": 4, "save_total_limit": 2, "skip_nonfinite": 0,
        "gradient_checkpointing": False, "dataloader_num_workers": 0, "ddp_timeout": 1800.0}
# The other value each numeric knob is tried at (bool and Literal knobs are flipped to another value).
NUMBERS = {"learning_rate": 0.25, "num_train_epochs": 2.0, "max_steps": 3, "gradient_accumulation_steps": 2,
           "warmup_ratio": 0.25, "warmup_steps": 3, "adam_beta1": 0.5, "adam_beta2": 0.75, "adam_epsilon": 1e-7,
           "weight_decay": 0.125, "max_grad_norm": 2.0, "seed": 7, "logging_steps": 2, "eval_steps": 2, "eval_delay": 1.5,
           "save_steps": 2, "save_total_limit": 3, "skip_nonfinite": 1, "dataloader_num_workers": 1,
           "ddp_timeout": 60.0}
# Knobs that only make sense together with another one (transformers evaluates every eval_steps only under
# eval_strategy="steps"; the command line infers it from --eval-steps).
TOGETHER = {"eval_steps": {"eval_strategy": "steps"}}
# How a run is carried out on this machine, decided for it where each front end starts: not compared by value.
DEVICE_DECIDED = {"fp16": "the Trainer trains in fp32 on a CPU, as transformers' does (tests/test_trainer_data.py)",
                  "torch_compile": "needs a C++ compiler, checked by the command line before anything else",
                  "report_to": "tensorboard needs its package; checked when the loop starts"}


def _shared_knobs() -> list[dataclasses.Field]:
    trainer_fields = {f.name for f in dataclasses.fields(bertkit.TrainingArguments) if f.init}
    return [f for f in dataclasses.fields(TrainingSettings)
            if f.name in trainer_fields and on_command_line(f) and f.name != "output_dir"]


def _value(f: dataclasses.Field) -> object:
    """Another value than ``BASE``'s for the knob ``f``."""
    hint = typing.get_type_hints(TrainingSettings)[f.name]
    if typing.get_origin(hint) is not typing.Literal:  # Literal[...] | None: the Literal
        hint = next((a for a in typing.get_args(hint) if typing.get_origin(a) is typing.Literal), hint)
    if hint is bool:
        return not BASE[f.name]
    if typing.get_origin(hint) is typing.Literal:
        return next(c for c in typing.get_args(hint) if c != BASE[f.name])
    return NUMBERS[f.name]


def _flag(name: str, value: object) -> list[str]:
    flag = "--" + name.replace("_", "-")
    if isinstance(value, bool):
        return [flag if value else f"--no-{name.replace('_', '-')}"]
    return [flag, str(value)]


class _Reached(Exception):
    """Raised by the stand-in loop once it has seen what it was given."""


@pytest.fixture()
def reach_loop(monkeypatch):
    """Replace the loop where both front ends call it; returns what the last call received."""
    seen: dict = {}

    def loop(model, phases, args, **kwargs):
        seen.clear()
        seen.update(args=args, steps=sum(p.steps for p in phases), cadence=cadence(args, sum(p.steps for p in phases)),
                    warmup=args.warmup_for(sum(p.steps for p in phases)), fingerprint=run_fingerprint(args, None))
        raise _Reached

    monkeypatch.setattr(finetune_run, "train", loop)
    monkeypatch.setattr(trainer, "train", loop)
    return seen


@pytest.fixture()
def sst2(tmp_path, tiny_checkpoint):
    d = tmp_path / "glue" / "SST-2"
    d.mkdir(parents=True)
    for split in ("train", "dev"):
        (d / f"{split}.tsv").write_text("sentence\tlabel\n" + "".join(f"{s}\t{y}\n" for s, y in ROWS))
    model = tiny_checkpoint(tmp_path / "model", tokenizer=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS],
                            hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
                            max_position_embeddings=32)
    return tmp_path / "glue", model


def _from_cli(seen: dict, sst2, out, knobs: dict) -> dict:
    data, model = sst2
    argv = ["finetune", "glue", "--task", "sst2", "--data-dir", str(data), "--model", str(model), "--out", str(out),
            "--batch-size", "8", "--max-seq-length", "32", "--no-progress", "--device", "cpu"]
    for name, value in knobs.items():
        argv += _flag(name, value)
    with pytest.raises(_Reached):
        main(argv)
    return dict(seen)


def _from_trainer(seen: dict, sst2, out, knobs: dict) -> dict:
    _, model_dir = sst2
    tok = bertkit.BertTokenizer.from_pretrained(model_dir)
    model = bertkit.BertForSequenceClassification.from_pretrained(model_dir, num_labels=2)
    rows = [{**tok(text), "label": label} for text, label in ROWS]
    # the command line's --batch-size 8 is the global batch, split over the accumulation steps
    per_device = 8 // knobs["gradient_accumulation_steps"]
    args = bertkit.TrainingArguments(output_dir=str(out), per_device_train_batch_size=per_device, use_cpu=True,
                                     disable_tqdm=True, **knobs)
    with pytest.raises(_Reached):
        bertkit.Trainer(model=model, args=args, train_dataset=rows, eval_dataset=rows, processing_class=tok).train()
    return dict(seen)


def test_every_knob_reaches_the_loop_with_the_same_value_from_both_front_ends(sst2, reach_loop, tmp_path):
    knobs = [f for f in _shared_knobs() if f.name not in DEVICE_DECIDED]
    assert len(knobs) >= 25, [f.name for f in knobs]  # the front ends share the loop's knobs, not a handful
    assert {f.name for f in knobs} == set(BASE), "every shared knob needs a BASE value (and NUMBERS, if a number)"
    for f in knobs:
        case = {**BASE, f.name: _value(f), **TOGETHER.get(f.name, {})}
        # the command line refuses a cadence its strategy does not read (--save-strategy no --save-steps 4: it saved
        # nothing); TrainingArguments takes it, as transformers does, and ignores it
        unread = {"save_steps"} if case["save_strategy"] != "steps" else set()
        cli = _from_cli(reach_loop, sst2, tmp_path / f"cli-{f.name}",
                        {k: v for k, v in case.items() if v is not None and k not in unread})
        ours = _from_trainer(reach_loop, sst2, tmp_path / f"trainer-{f.name}", case)
        for name, value in case.items():
            if name in unread:
                continue
            assert getattr(cli["args"], name) == getattr(ours["args"], name) == value, (f.name, name)
        for what in ("steps", "cadence", "warmup", "fingerprint"):
            assert cli[what] == ours[what], (f.name, what, cli[what], ours[what])


def test_each_front_end_exposes_exactly_what_its_declaration_says():
    """A knob is a TrainingArguments argument unless declared ``trainer=False`` (then it keeps bertkit's default
    there), takes transformers' default where one is declared (``hf``), and is a flag of the commands it names."""
    theirs = {f.name: f for f in dataclasses.fields(bertkit.TrainingArguments)}
    args = bertkit.TrainingArguments(output_dir="x")
    for f in dataclasses.fields(TrainingSettings):
        assert theirs[f.name].init == f.metadata.get("trainer", True), f.name
        if "hf" in f.metadata and f.name != "output_dir":
            assert getattr(args, f.name) == f.metadata["hf"], f.name
        elif f.default is not dataclasses.MISSING and f.name not in ("device", "progress", "eval_strategy"):
            assert getattr(args, f.name) == f.default, f.name
    pretrain = {f.name: f for f in dataclasses.fields(bertkit.settings.PretrainSettings)}
    assert not on_command_line(pretrain["num_train_epochs"])
    assert on_command_line({f.name: f for f in dataclasses.fields(GlueSettings)}["num_train_epochs"])
