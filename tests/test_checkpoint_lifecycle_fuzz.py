"""bertkit.Trainer's checkpoints and output_dir against transformers' Trainer, on drawn lifecycles: save and
evaluation cadences, save_total_limit, load_best_model_at_end with its metric and direction, max_steps or epochs, a
run stopped by a callback and resumed with resume_from_checkpoint=True; and things a user keeps in the output
directory, put there between the stopped run and its resume (notes, another tool's checkpoint-99, names no run
writes: checkpoint-abc, checkpoint-², checkpoint-٦, a symlink checkpoint-77 to a directory elsewhere, one of the
run's checkpoints made read-only). A fresh run into a directory holding them is refused before anything is written,
naming one; the resumed run leaves every one of them as it was, and ends with transformers' checkpoint-N
directories, best checkpoint, best metric, step, evaluations and weights (transformers running in a clean
directory: its rotation would count a stray checkpoint-99 as the newest). On MiniLM cut to 1 layer, SST-2 rows.

Left out as documented differences: save_total_limit=1 beside a best checkpoint (bertkit keeps both), and the
training-loss record bertkit adds at the last step."""

from __future__ import annotations

import csv
import hashlib
import json
import os
import random
import shutil
from pathlib import Path

import pytest
import torch

import bertkit
from bertkit.errors import BertkitError

transformers = pytest.importorskip("transformers")
datasets = pytest.importorskip("datasets")
pytest.importorskip("accelerate")
pytestmark = pytest.mark.slow

DRAWS = (3, 52)
CLUTTER = ("notes", "tool99", "abc", "superscript", "arabic", "link77", "read-only")


@pytest.fixture(scope="module")
def classifier(tmp_path_factory, minilm_2_layers) -> Path:
    """MiniLM's first layer (of the 2-layer cut) under a seeded 2-label head, dropout off."""
    config = transformers.BertConfig.from_pretrained(minilm_2_layers, num_hidden_layers=1, num_labels=2,
                                                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    torch.manual_seed(0)
    model = transformers.BertForSequenceClassification.from_pretrained(minilm_2_layers, config=config)
    out = tmp_path_factory.mktemp("lifecycle") / "classifier"
    model.save_pretrained(out)
    transformers.BertTokenizerFast.from_pretrained(minilm_2_layers).save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def rows(data_dir) -> list[dict]:
    with open(data_dir / "glue/SST-2/dev.tsv", encoding="utf-8") as f:
        return [{"text": r[0], "label": int(r[1])} for r in list(csv.reader(f, delimiter="\t", quotechar=None))[1:25]]


def _draw(r: random.Random) -> tuple[dict, int, list[str]]:
    args = {"per_device_train_batch_size": 4, "learning_rate": 1e-3, "seed": r.randint(0, 99),
            "save_strategy": r.choice(["steps", "epoch"]), "save_total_limit": r.choice([None, 1, 2, 3])}
    args.update({"max_steps": r.choice([5, 6, 7])} if r.random() < 0.5 else {"num_train_epochs": 2})
    if args["save_strategy"] == "steps":
        args["save_steps"] = r.choice([1, 2])
    args["eval_strategy"] = r.choice(["no", args["save_strategy"]])
    if args["eval_strategy"] != "no":
        args["eval_steps"] = args.get("save_steps")
        if args["save_total_limit"] == 1:  # bertkit keeps the best and the newest (documented)
            args["save_total_limit"] = 2
        args["load_best_model_at_end"] = r.random() < 0.7
        if r.random() < 0.6:
            args["metric_for_best_model"] = r.choice(["accuracy", "loss"])
            args["greater_is_better"] = r.choice([True, False])
    stop = r.choice([2, 3, 4]) if args["save_strategy"] == "steps" else 4  # a checkpoint exists to resume from
    return args, stop, r.sample(CLUTTER, r.randint(1, 4))


def _features(tokenizer, rows):
    return datasets.Dataset.from_list([dict(tokenizer(r["text"], truncation=True, max_length=32), label=r["label"])
                                       for r in rows])


def _accuracy(p):
    return {"accuracy": float((p.predictions.argmax(-1) == p.label_ids).mean())}


def _run(lib, model_dir: Path, out: Path, args: dict, rows: list[dict], stop: int | None = None, resume=None) -> dict:
    tokenizer = lib.AutoTokenizer.from_pretrained(model_dir)

    class Stop(lib.TrainerCallback):
        def on_step_end(self, a, state, control, **kwargs):
            control.should_training_stop |= state.global_step == stop

    trainer = lib.Trainer(
        model=lib.AutoModelForSequenceClassification.from_pretrained(model_dir),
        args=lib.TrainingArguments(output_dir=str(out), report_to="none", use_cpu=True, disable_tqdm=True, **args),
        train_dataset=_features(tokenizer, rows[:16]), eval_dataset=_features(tokenizer, rows[16:]),
        data_collator=lib.DataCollatorWithPadding(tokenizer), processing_class=tokenizer,
        compute_metrics=_accuracy, callbacks=[Stop()])
    trainer.train(resume_from_checkpoint=resume)
    state = trainer.state
    return {"step": state.global_step, "best": state.best_model_checkpoint and Path(state.best_model_checkpoint).name,
            "best_metric": state.best_metric, "evals": [h["eval_loss"] for h in state.log_history if "eval_loss" in h],
            "checkpoints": sorted(p.name for p in out.glob("checkpoint-*") if p.name[11:].isascii()
                                  and p.name[11:].isdigit() and p.name != "checkpoint-99" and p.name != "checkpoint-77"),
            "weights": {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}}


def _place(out: Path, clutter: list[str], elsewhere: Path) -> Path | None:
    """The user's things; returns the checkpoint made read-only (its removal refused), if drawn."""
    for kind in clutter:
        if kind == "notes":
            (out / "notes.txt").write_text("my notes")
        elif kind == "link77":
            elsewhere.mkdir(exist_ok=True)
            (elsewhere / "results.txt").write_text("another experiment")
            (out / "checkpoint-77").symlink_to(elsewhere)
        elif kind != "read-only":
            name = {"tool99": "checkpoint-99", "abc": "checkpoint-abc", "superscript": "checkpoint-²",
                    "arabic": "checkpoint-٦"}[kind]
            (out / name).mkdir()
            (out / name / "config.json").write_text(json.dumps({"written_by": "another tool"}))
    oldest = sorted((p for p in out.glob("checkpoint-*") if (p / "state.pt").is_file()), key=lambda p: int(p.name[11:]))
    return oldest[0] if "read-only" in clutter and oldest else None


def _snapshot(directory: Path) -> dict[str, str]:
    out = {}
    for root, dirs, files in os.walk(directory):
        for name in dirs + files:
            path = Path(root) / name
            out[str(path.relative_to(directory))] = (f"-> {os.readlink(path)}" if path.is_symlink() else "dir"
                                                     if path.is_dir() else hashlib.sha256(path.read_bytes()).hexdigest())
    return out


@pytest.mark.parametrize("draw", DRAWS)
def test_drawn_checkpoint_lifecycles_end_as_transformers_and_keep_the_users_files(draw, classifier, rows, tmp_path,
                                                                                    monkeypatch):
    args, stop, clutter = _draw(random.Random(draw))
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    _place(fresh, clutter, tmp_path / "elsewhere")
    if before := _snapshot(fresh):  # (a read-only checkpoint alone puts nothing there)
        with pytest.raises(BertkitError, match=r"(holds|bertkit did not write there).*(choose|move)"):
            _run(bertkit, classifier, fresh, args, rows)
        assert _snapshot(fresh) == before, "a refused run changed what the directory held"

    ours, theirs = tmp_path / "bertkit", tmp_path / "transformers"
    first = _run(bertkit, classifier, ours, args, rows, stop)
    reference = _run(transformers, classifier, theirs, args, rows, stop)
    assert first["checkpoints"] == reference["checkpoints"] and first["step"] == reference["step"] == stop
    run_files = _snapshot(ours)
    read_only = _place(ours, clutter, tmp_path / "elsewhere")
    kept = {k: v for k, v in _snapshot(ours).items()  # what the user put there, and the checkpoint they froze
            if k not in run_files or (read_only is not None and k.split("/")[0] == read_only.name)}
    if read_only is not None:
        refused, unlink, rmtree = read_only, Path.unlink, shutil.rmtree

        def refusing_unlink(self, missing_ok=False):  # chmod a-w, which root (running tests) passes through
            if Path(os.path.abspath(self)).parent == refused:
                raise PermissionError(13, "Permission denied", str(self))
            return unlink(self, missing_ok)

        def refusing_rmtree(path, *a, **kw):  # transformers' rotation: rmtree(ignore_errors=True) removes nothing
            return None if Path(path).name == refused.name else rmtree(path, *a, **kw)

        monkeypatch.setattr(Path, "unlink", refusing_unlink)
        monkeypatch.setattr(shutil, "rmtree", refusing_rmtree)
    ended = _run(bertkit, classifier, ours, args, rows, resume=True)
    expected = _run(transformers, classifier, theirs, args, rows, resume=True)
    monkeypatch.undo()
    after = _snapshot(ours)
    assert {k: after.get(k) for k in kept} == kept, "a file or directory of the user's was removed or changed"
    assert ended["checkpoints"] == expected["checkpoints"]
    assert (ended["step"], ended["best"]) == (expected["step"], expected["best"])
    assert (ended["best_metric"] is None) == (expected["best_metric"] is None)
    assert ended["best_metric"] == pytest.approx(expected["best_metric"], abs=1e-5)
    assert ended["evals"] == pytest.approx(expected["evals"], abs=1e-5)
    for name, tensor in expected["weights"].items():
        torch.testing.assert_close(ended["weights"][name], tensor, atol=2e-4, rtol=0, msg=name)
