"""TrainingArguments transformers users set, run through transformers' Trainer and bertkit's on the same tiny
checkpoint and data: the values logged and the files written must be transformers' own.
include_num_input_tokens_seen: the input tokens counted at every log, under gradient accumulation and resumed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import bertkit
from bertkit.errors import BertkitError
from trainer_helpers import TEST, TRAIN, accuracy, tiny_classifier

transformers = pytest.importorskip("transformers")
datasets = pytest.importorskip("datasets")
pytest.importorskip("accelerate")  # transformers' Trainer needs it

@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, minilm_2_layers) -> Path:
    return tiny_classifier(tmp_path_factory.mktemp("args") / "tiny-classifier", minilm_2_layers)


def _trainer(lib, checkpoint: Path, out: Path, **overrides):
    tokenizer = lib.AutoTokenizer.from_pretrained(checkpoint)
    model = lib.AutoModelForSequenceClassification.from_pretrained(checkpoint)

    def tokenize(batch):
        return tokenizer(batch["text"], truncation=True)

    train = datasets.Dataset.from_list(TRAIN[:12]).map(tokenize, batched=True, remove_columns=["text"])
    test = datasets.Dataset.from_list(TEST[:4]).map(tokenize, batched=True, remove_columns=["text"])
    settings = dict(output_dir=str(out), learning_rate=1e-3, per_device_train_batch_size=2,
                    per_device_eval_batch_size=4, gradient_accumulation_steps=2, max_steps=3, logging_steps=1,
                    eval_strategy="steps", eval_steps=2, save_strategy="steps", save_steps=2, report_to="none",
                    use_cpu=True, seed=7, disable_tqdm=True)
    return lib.Trainer(model=model, args=lib.TrainingArguments(**{**settings, **overrides}), train_dataset=train,
                       eval_dataset=test, processing_class=tokenizer, compute_metrics=accuracy)


def _logged(history: list[dict]) -> list[tuple]:
    """Each record's names in order, its step and epoch, and its token count (its losses are other tests' matter;
    total_flos, which bertkit does not log, docs/coming-from-transformers.md)."""
    return [([k for k in h if k != "total_flos"], h["step"], round(h["epoch"], 4), h["num_input_tokens_seen"])
            for h in history]


def _tokens_in_checkpoints(out: Path) -> dict[str, int]:
    return {p.name: json.loads((p / "trainer_state.json").read_text())["num_input_tokens_seen"]
            for p in sorted(out.glob("checkpoint-*"))}


def test_num_input_tokens_seen_counts_each_accumulated_micro_batch(checkpoint, tmp_path):
    """bertkit alone, fast: the counts of the slow test below's "all" run, which are transformers' (44 tokens in the
    first step's two micro-batches, padded to their longest rows), in the log and the checkpoint."""
    trainer = _trainer(bertkit, checkpoint, tmp_path, include_num_input_tokens_seen="all", eval_strategy="no")
    trainer.train()
    assert [(h["step"], h["num_input_tokens_seen"]) for h in trainer.state.log_history] == [
        (1, 44), (2, 102), (3, 138), (3, 138)]
    assert _tokens_in_checkpoints(tmp_path) == {"checkpoint-2": 102, "checkpoint-3": 138}


@pytest.mark.slow
@pytest.mark.parametrize("how", ["all", "non_padding", True])
def test_num_input_tokens_seen_is_logged_as_transformers_logs_it(checkpoint, tmp_path, how):
    """include_num_input_tokens_seen was refused. Now every record (training loss, evaluation, the run's end) carries
    transformers' count, each accumulated micro-batch counted, and the training loss's records its
    train_tokens_per_second; each checkpoint's trainer_state.json holds the count at its step."""
    logged, written = {}, {}
    for lib in (transformers, bertkit):
        trainer = _trainer(lib, checkpoint, tmp_path / lib.__name__, include_num_input_tokens_seen=how)
        trainer.train()
        logged[lib.__name__] = _logged(trainer.state.log_history)
        written[lib.__name__] = _tokens_in_checkpoints(tmp_path / lib.__name__)
    assert logged["bertkit"] == logged["transformers"]
    assert written["bertkit"] == written["transformers"]
    counts = [count for names, _, _, count in logged["bertkit"] if "loss" in names]
    assert len(counts) == 3 and 0 < counts[0] < counts[1] < counts[2]
    assert logged["bertkit"][0][0][-4:-1] == ["num_input_tokens_seen", "train_runtime", "train_tokens_per_second"]


@pytest.mark.slow
def test_num_input_tokens_seen_goes_on_from_the_checkpoint_resumed(checkpoint, tmp_path):
    """A run resumed from checkpoint-2 logs the counts the uninterrupted run logs, as transformers' resumed run does
    (its trainer_state.json's count, then the batches after it)."""
    logged = {}
    for lib in (transformers, bertkit):
        out = tmp_path / lib.__name__
        _trainer(lib, checkpoint, out, include_num_input_tokens_seen="non_padding").train()
        resumed = _trainer(lib, checkpoint, out, include_num_input_tokens_seen="non_padding")
        resumed.train(resume_from_checkpoint=str(out / "checkpoint-2"))
        logged[lib.__name__] = [(h["step"], h["num_input_tokens_seen"]) for h in resumed.state.log_history]
    assert logged["bertkit"] == logged["transformers"]
    assert [step for step, _ in logged["bertkit"]] == [1, 2, 2, 3, 3, 3]  # the checkpoint's records, then its own


def _files(out: Path) -> dict[str, list[str]]:
    return {p.name: sorted(f.name for f in p.iterdir()) for p in sorted(out.glob("checkpoint-*"))}


@pytest.mark.slow
def test_save_only_model_writes_transformers_files_and_keeps_the_best(checkpoint, tmp_path):
    """save_only_model was refused. Now each checkpoint holds the model, the tokenizer and trainer_state.json, the
    files transformers writes there (bertkit's manifest beside them), save_total_limit keeps the checkpoints
    transformers keeps, and load_best_model_at_end loads the best one's weights (read from its model.safetensors)."""
    kept, best = {}, {}
    for lib in (transformers, bertkit):
        out, kept[lib.__name__] = tmp_path / lib.__name__, []

        class Seen(lib.TrainerCallback):
            def on_save(self, args, state, control, out=out, seen=kept[lib.__name__], **kwargs):
                seen.append((state.global_step, _files(out)))

        # (accumulation 1: transformers 5 doubles a BERT head's gradient at 2, docs/coming-from-transformers.md)
        trainer = _trainer(lib, checkpoint, out, save_only_model=True, eval_steps=1, save_steps=1, max_steps=4,
                           gradient_accumulation_steps=1,
                           load_best_model_at_end=True, metric_for_best_model="eval_loss", greater_is_better=True,
                           save_total_limit=2)
        trainer.add_callback(Seen())
        trainer.train()
        best[lib.__name__] = (Path(trainer.state.best_model_checkpoint).name,
                              {k: v.detach().clone() for k, v in trainer.model.state_dict().items()})
    # as in every checkpoint: bertkit's manifest, and vocab.txt beside tokenizer.json (docs/coming-from-transformers.md);
    # transformers' pickled TrainingArguments
    manifest = bertkit.outputs.MARKER
    ours, theirs = ([(step, {d: [f for f in names if f not in leave] for d, names in dirs.items()})
                     for step, dirs in kept[name]]
                    for name, leave in (("bertkit", (manifest, "vocab.txt")), ("transformers", ("training_args.bin",))))
    assert ours == theirs
    assert all(manifest in names for _, dirs in kept["bertkit"] for names in dirs.values())
    assert "optimizer.pt" not in str(kept["bertkit"]) and "state.pt" not in str(kept["bertkit"])
    assert best["bertkit"][0] == best["transformers"][0] == "checkpoint-1"  # the greatest loss: the first
    from safetensors.torch import load_file

    written = load_file(str(tmp_path / "bertkit" / "checkpoint-1" / "model.safetensors"))
    trained = best["bertkit"][1]
    assert len(written) > 10 and all(torch.equal(trained[k], v) for k, v in written.items() if k in trained)


def test_a_save_only_model_checkpoint_holds_the_model_alone_and_resuming_it_is_refused(checkpoint, tmp_path):
    """The checkpoints of save_only_model hold no optimiser, schedule or random states (transformers' files for it,
    the slow test above compares them), and resuming one, by path or with True, is refused naming why and the way on
    (transformers' Trainer continues it with a fresh optimiser and the schedule from its first step, without a word)."""
    out = tmp_path / "out"
    _trainer(bertkit, checkpoint, out, save_only_model=True, eval_strategy="no", max_steps=2, save_steps=1).train()
    assert _files(out) == {f"checkpoint-{n}": sorted([bertkit.outputs.MARKER, "config.json", "model.safetensors",
                                                      "tokenizer.json", "tokenizer_config.json", "trainer_state.json",
                                                      "vocab.txt"]) for n in (1, 2)}
    for resume in (True, str(out / "checkpoint-2")):
        with pytest.raises(BertkitError, match=r"checkpoint-2 was written with save_only_model=True and holds the "
                                               r"model without the optimiser, schedule and random states, so it cannot "
                                               r"continue the run .* from_pretrained\("):
            _trainer(bertkit, checkpoint, out, save_only_model=True, eval_strategy="no", max_steps=4,
                     save_steps=1).train(resume_from_checkpoint=resume)
    assert sorted(_files(out)) == ["checkpoint-1", "checkpoint-2"]  # nothing written
