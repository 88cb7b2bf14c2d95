"""A loss of the user's own in the sentence trainers, against sentence-transformers 6: a module with parameters of its
own (a projection, a learnable scale) that reads the dataset's label column, derived from bertkit's loss base class
with ``needs_label`` left at its default, as a sentence-transformers user's ``nn.Module`` loss is ported."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import bertkit.sentence
from bertkit.sentence import (
    SentenceTransformer,
    SentenceTransformerTrainer,
    SentenceTransformerTrainingArguments,
)
from bertkit.sentence.cross_encoder import CrossEncoder, CrossEncoderTrainer, CrossEncoderTrainingArguments
from bertkit.sentence.cross_encoder.losses import CrossEncoderLoss
from bertkit.sentence.losses import SentenceLoss
from cross_encoder_helpers import cross_encoder_directory
from sentence_helpers import glue_rows, st_directory

st = pytest.importorskip("sentence_transformers")
datasets = pytest.importorskip("datasets")
QUIET = {"report_to": "none", "use_cpu": True, "disable_tqdm": True, "save_strategy": "no"}


def _projected_loss(base: type) -> type:
    """A regression loss on a learnt 16-wide projection of both columns' embeddings, through a learnt scale."""

    class Projected(base):
        def __init__(self, model):
            if base is nn.Module:
                super().__init__()
                self.model = model
            else:
                super().__init__(model)
            torch.manual_seed(1)
            self.proj = nn.Linear(model.get_embedding_dimension(), 16)
            self.scale = nn.Parameter(torch.tensor(5.0))

        def forward(self, sentence_features, labels):
            a, b = (self.proj(self.model(f)["sentence_embedding"]) for f in sentence_features)
            return ((torch.sigmoid(self.scale * nn.functional.cosine_similarity(a, b)) - labels) ** 2).mean()

    return Projected


def _train(lib, model, loss_class, rows, out):
    loss = loss_class(model)
    trainer = lib.SentenceTransformerTrainer(
        model=model,
        loss=loss,
        train_dataset=datasets.Dataset.from_list(rows),
        args=lib.SentenceTransformerTrainingArguments(
            output_dir=str(out),
            per_device_train_batch_size=3,
            learning_rate=1e-3,
            gradient_accumulation_steps=2,
            num_train_epochs=2,
            logging_steps=1,
            seed=6,
            **QUIET,
        ),
    )
    trainer.train()
    return (
        [h["loss"] for h in trainer.state.log_history if "loss" in h],
        loss.proj.weight.detach().numpy(),
        loss.scale.item(),
    )


def test_a_users_loss_gets_the_score_column_and_trains_its_own_parameters(
    data_dir, minilm_2_layers, tmp_path
):
    """The loss got labels None (bertkit passed the label column only to losses declaring needs_label), so a port of
    a sentence-transformers loss that reads it stopped in a TypeError at the first step, and one that reads labels
    when given trained without them. sentence-transformers passes the label column whenever the dataset has one."""
    path = st_directory(minilm_2_layers, tmp_path / "st", dropout=0.0, max_seq_length=32)
    rows = [{"s1": r[7], "s2": r[8], "score": float(r[9]) / 5} for r in glue_rows(data_dir, "STS-B", n=10)]
    ours = _train(
        bertkit.sentence, SentenceTransformer(str(path)), _projected_loss(SentenceLoss), rows, tmp_path / "bk"
    )
    theirs = _train(
        st,
        st.SentenceTransformer(str(path), device="cpu"),
        _projected_loss(nn.Module),
        rows,
        tmp_path / "st-run",
    )
    assert len(ours[0]) == len(theirs[0]) == 4
    np.testing.assert_allclose(ours[0], theirs[0], rtol=1e-4)
    np.testing.assert_allclose(ours[1], theirs[1], atol=1e-5)  # the loss's own weights, trained as theirs
    assert ours[2] == pytest.approx(theirs[2], abs=1e-5) and ours[2] != 5.0


@pytest.mark.parametrize("labelled", [True, False])
def test_a_users_cross_encoder_loss_gets_the_label_column_or_none(minilm_2_layers, tmp_path, labelled):
    """As for the bi-encoder: the labels when the dataset has a label column (bertkit passed None to a loss not
    declaring needs_label), None when it has none, as sentence-transformers passes them."""
    seen = []

    class Recording(CrossEncoderLoss):
        def forward(self, inputs, labels):
            seen.append(None if labels is None else labels.tolist())
            return self.logits(*inputs).sum() * 0

    model = CrossEncoder(str(cross_encoder_directory(minilm_2_layers, tmp_path / "ce")))
    rows = [
        {"q": f"question {i}", "p": f"paragraph {i}", **({"label": float(i % 2)} if labelled else {})}
        for i in range(4)
    ]
    CrossEncoderTrainer(
        model=model,
        loss=Recording(model),
        train_dataset=datasets.Dataset.from_list(rows),
        args=CrossEncoderTrainingArguments(
            output_dir=str(tmp_path / "out"), max_steps=1, per_device_train_batch_size=4, **QUIET
        ),
    ).train()
    assert len(seen) == 1
    assert (sorted(seen[0]) == [0.0, 0.0, 1.0, 1.0]) if labelled else seen[0] is None


def test_a_users_loss_on_a_dataset_without_labels_gets_none(minilm_2_layers, tmp_path):
    """No label column: the loss gets None, as sentence-transformers' (not a column of zeros)."""
    seen = []

    class Recording(SentenceLoss):
        def forward(self, sentence_features, labels):
            seen.append(labels)
            return sum(self.model(f)["sentence_embedding"].sum() for f in sentence_features) * 0

    model = SentenceTransformer(str(st_directory(minilm_2_layers, tmp_path / "st", max_seq_length=32)))
    SentenceTransformerTrainer(
        model=model,
        loss=Recording(model),
        train_dataset=datasets.Dataset.from_list([{"a": "x y", "b": "y z"}] * 4),
        args=SentenceTransformerTrainingArguments(output_dir=str(tmp_path / "o"), max_steps=1, **QUIET),
    ).train()
    assert seen == [None]
