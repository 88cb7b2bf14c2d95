"""A token-classification step whose rows hold no label (every label -100) has no loss (0 / 0). transformers'
Trainer logs it by its logging_nan_inf_filter: the window's loss so far over 1 + its steps before it; bertkit logged
0 there, pulling the record and train_loss down (0.508 against transformers' 0.763 for a window of two steps)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

import bertkit
from trainer_helpers import tiny_classifier

transformers = pytest.importorskip("transformers")
datasets = pytest.importorskip("datasets")
pytest.importorskip("accelerate")
_WORDS = "the cat sat on a mat while dogs ran far away from home".split()


@pytest.fixture(scope="module")
def tagger(minilm_dir, tmp_path_factory) -> Path:
    return tiny_classifier(tmp_path_factory.mktemp("unlabelled") / "tagger", minilm_dir, "BertForTokenClassification",
                           hidden_size=16, num_hidden_layers=1, intermediate_size=32, num_labels=3)


def _rows(tokenizer, r: random.Random, n: int, unlabelled: set[int]) -> list[dict]:
    out = []
    for i in range(n):
        enc = tokenizer(r.sample(_WORDS, r.randint(2, 6)), is_split_into_words=True)
        labels = [-100 if w is None or i in unlabelled else r.randint(0, 2) for w in enc.word_ids()]
        out.append({"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"], "labels": labels})
    return out


def _logged(lib, path: Path, rows: list, batch: int, logging_steps: int, out: Path) -> list[float]:
    tokenizer = lib.AutoTokenizer.from_pretrained(path)
    args = lib.TrainingArguments(output_dir=str(out / lib.__name__), report_to="none", use_cpu=True,
                                 disable_tqdm=True, save_strategy="no", train_sampling_strategy="sequential",
                                 per_device_train_batch_size=batch, num_train_epochs=1, learning_rate=1e-3,
                                 logging_steps=logging_steps)
    trainer = lib.Trainer(model=lib.AutoModelForTokenClassification.from_pretrained(path), args=args,
                          train_dataset=datasets.Dataset.from_list(rows),
                          data_collator=lib.DataCollatorForTokenClassification(tokenizer), processing_class=tokenizer)
    result = trainer.train()
    # bertkit logs the run's last step too (docs/coming-from-transformers.md): the records both write are compared
    return [h["loss"] for h in trainer.state.log_history
            if "loss" in h and h["step"] % logging_steps == 0] + [result.training_loss]


def _compare(tagger, tmp_path, seed: int, n: int, unlabelled: set[int], batch: int, logging_steps: int) -> None:
    tokenizer = transformers.BertTokenizerFast.from_pretrained(tagger)
    rows = _rows(tokenizer, random.Random(seed), n, unlabelled)
    ours, theirs = (_logged(lib, tagger, rows, batch, logging_steps, tmp_path) for lib in (bertkit, transformers))
    assert ours == pytest.approx(theirs, rel=1e-5, abs=1e-7), (unlabelled, batch, logging_steps)


def test_a_step_with_no_label_is_logged_as_transformers_logs_it(tagger, tmp_path):
    # 12 steps of one row, windows of 2: unlabelled steps 1, 5 and 6 (a whole window), 7, 9 (first in their window)
    # and 12 (second in its window: its record was 0.508 where transformers logs 0.763)
    _compare(tagger, tmp_path, 1, 12, {0, 4, 5, 6, 8, 11}, 1, 2)


@pytest.mark.slow
@pytest.mark.parametrize("draw", range(6))
def test_drawn_unlabelled_steps_log_transformers_losses(draw, tagger, tmp_path):
    r = random.Random(draw)
    n = r.choice([8, 10, 12])
    _compare(tagger, tmp_path, draw, n, set(r.sample(range(n), n // 2)), r.choice([1, 2]), r.choice([2, 3, 4]))
