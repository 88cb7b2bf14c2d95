"""True/False label columns in the sentence trainers, against sentence-transformers: a relevant/not or similar/not
column as pandas and datasets make it (bool) trains each loss that takes labels to sentence-transformers' numbers
(True/False read as 1/0), and where sentence-transformers stops inside torch at the first step (a cross-entropy,
ContrastiveLoss's 1 - label), bertkit either takes them as 1/0 or refuses when the trainer is made, naming the row and
the fix. bertkit refused every bool column ("give class ids 0/1 instead"), a transformers head's rule."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from cross_encoder_helpers import cross_encoder_directory

pytest.importorskip("sentence_transformers")
datasets = pytest.importorskip("datasets")
transformers = pytest.importorskip("transformers")

WORDS = "cat dog film river city music paper green quick slow old new".split()
PAIR_LOSSES = ("CoSENTLoss", "AnglELoss", "CosineSimilarityLoss", "OnlineContrastiveLoss", "ContrastiveLoss")
GROUP_LOSSES = ("BatchAllTripletLoss", "BatchHardTripletLoss", "BatchSemiHardTripletLoss",
                "BatchHardSoftMarginTripletLoss")
CROSS_LOSSES = ("BinaryCrossEntropyLoss", "MSELoss")


@pytest.fixture(scope="module")
def encoders(minilm_2_layers, tmp_path_factory) -> dict[str, Path]:
    """MiniLM's first 2 layers, dropout off (the two trainers draw no common dropout masks): as an embedding model
    and as a one-label and a two-label cross-encoder."""
    root = tmp_path_factory.mktemp("bool-labels")
    model = transformers.AutoModel.from_pretrained(minilm_2_layers, hidden_dropout_prob=0.0,
                                                   attention_probs_dropout_prob=0.0)
    model.save_pretrained(root / "dense")
    transformers.AutoTokenizer.from_pretrained(minilm_2_layers).save_pretrained(root / "dense")
    return {"dense": root / "dense", "one": cross_encoder_directory(minilm_2_layers, root / "one"),
            "two": cross_encoder_directory(minilm_2_layers, root / "two", num_labels=2)}


def _train(lib: str, kind: str, loss_name: str, model_dir: Path, rows: list[dict], out: Path, batch: int,
           steps: int) -> list:
    """Each step's loss, unrounded (the same script, ``lib`` picks the import)."""
    if lib == "sentence_transformers" and kind == "dense":
        from sentence_transformers import SentenceTransformer as Model
        from sentence_transformers import SentenceTransformerTrainer as Trainer
        from sentence_transformers import SentenceTransformerTrainingArguments as Args
        from sentence_transformers.sentence_transformer import losses
    elif lib == "sentence_transformers":
        from sentence_transformers.cross_encoder import CrossEncoder as Model
        from sentence_transformers.cross_encoder import CrossEncoderTrainer as Trainer
        from sentence_transformers.cross_encoder import CrossEncoderTrainingArguments as Args
        from sentence_transformers.cross_encoder import losses
    elif kind == "dense":
        from bertkit.sentence import SentenceTransformer as Model
        from bertkit.sentence import SentenceTransformerTrainer as Trainer
        from bertkit.sentence import SentenceTransformerTrainingArguments as Args
        from bertkit.sentence import losses
    else:
        from bertkit.sentence.cross_encoder import CrossEncoder as Model
        from bertkit.sentence.cross_encoder import CrossEncoderTrainer as Trainer
        from bertkit.sentence.cross_encoder import CrossEncoderTrainingArguments as Args
        from bertkit.sentence.cross_encoder import losses
    model = Model(str(model_dir), device="cpu") if kind == "dense" else Model(str(model_dir), max_length=32)
    losses_seen = []

    class Recorded(getattr(losses, loss_name)):
        def forward(self, *args, **kwargs):
            value = super().forward(*args, **kwargs)
            losses_seen.append(value.item())
            return value

    args = Args(output_dir=str(out / lib), per_device_train_batch_size=batch, max_steps=steps, learning_rate=1e-4,
                logging_steps=1, save_strategy="no", report_to="none", seed=42, use_cpu=True, disable_tqdm=True)
    Trainer(model=model, args=args, train_dataset=datasets.Dataset.from_list(rows), loss=Recorded(model)).train()
    return losses_seen


def _rows(r: random.Random, loss: str, n: int) -> list[dict]:
    text = lambda: " ".join(r.choice(WORDS) for _ in range(r.randint(2, 7)))  # noqa: E731
    share = r.choice([0.25, 0.5, 0.75])
    labels = [r.random() < share for _ in range(n)]
    labels[:2] = [True, False]  # both values, in every draw
    if loss in GROUP_LOSSES:
        return [{"text": text(), "label": y} for y in labels]
    return [{"first": text(), "second": text(), "label": y} for y in labels]


def _same_steps(kind: str, loss: str, model_dir: Path, rows: list[dict], out: Path, batch: int, steps: int = 2) -> None:
    ours = _train("bertkit", kind, loss, model_dir, rows, out, batch, steps)
    # ContrastiveLoss: sentence-transformers cannot subtract a bool tensor; bertkit's numbers are its 0/1 ones
    reference = [{**row, "label": int(row["label"])} for row in rows] if loss == "ContrastiveLoss" else rows
    theirs = _train("sentence_transformers", kind, loss, model_dir, reference, out, batch, steps)
    assert len(ours) == len(theirs) == steps
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-7)


def test_a_bool_label_column_trains_a_cross_encoder_and_an_embedder_to_sentence_transformers(encoders, tmp_path):
    """The common cases: BinaryCrossEntropyLoss over relevant/not pairs, CoSENTLoss over similar/not pairs."""
    r = random.Random(0)
    _same_steps("cross", "BinaryCrossEntropyLoss", encoders["one"], _rows(r, "BinaryCrossEntropyLoss", 8), tmp_path, 4)
    _same_steps("dense", "CoSENTLoss", encoders["dense"], _rows(r, "CoSENTLoss", 8), tmp_path, 4)


def test_a_bool_label_a_loss_cannot_read_as_a_class_is_refused_naming_the_row(encoders, tmp_path):
    """CrossEntropyLoss and SoftmaxLoss take class ids: torch's cross-entropy takes no bool target
    (sentence-transformers stops at the first step); refused when the trainer is made."""
    from bertkit.errors import BertkitError
    from bertkit.sentence import SentenceTransformer, SentenceTransformerTrainer, losses
    from bertkit.sentence.cross_encoder import CrossEncoder, CrossEncoderTrainer
    from bertkit.sentence.cross_encoder import losses as ce_losses

    rows = datasets.Dataset.from_list(_rows(random.Random(1), "CrossEntropyLoss", 8))
    two = CrossEncoder(str(encoders["two"]), max_length=32)
    with pytest.raises(BertkitError, match=r"train_dataset: row 0 has label True, a bool, and CrossEntropyLoss takes a "
                                           r"class index, an int from 0 to 1: cast the column to integers"):
        CrossEncoderTrainer(model=two, train_dataset=rows, loss=ce_losses.CrossEntropyLoss(two))
    dense = SentenceTransformer(str(encoders["dense"]), device="cpu")
    with pytest.raises(BertkitError, match=r"train_dataset: row 0 has the label True; SoftmaxLoss\(num_labels=2\) "
                                           r"takes a class index"):
        SentenceTransformerTrainer(model=dense, train_dataset=rows, loss=losses.SoftmaxLoss(
            dense, sentence_embedding_dimension=dense.get_sentence_embedding_dimension(), num_labels=2))


@pytest.mark.slow  # 18 trainings: about 40 s on 2 busy cores, make test-slow
def test_bool_labels_generator_matches_sentence_transformers(encoders, tmp_path):
    """Seeded draws over every other loss that takes a label (BinaryCrossEntropyLoss and CoSENTLoss are the fast
    test's): the share of True, the rows, the texts and the batch size vary; the first step's loss is
    sentence-transformers'."""
    r = random.Random(7)
    for loss in (*CROSS_LOSSES[1:], *PAIR_LOSSES[1:], *GROUP_LOSSES):
        kind = "cross" if loss in CROSS_LOSSES else "dense"
        batch = r.choice([4, 6])
        _same_steps(kind, loss, encoders["one" if kind == "cross" else "dense"], _rows(r, loss, batch),
                    tmp_path / loss, batch, steps=1)
