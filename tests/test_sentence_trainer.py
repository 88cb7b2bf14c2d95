"""bertkit.sentence's trainer and arguments: what a user can get wrong is named before anything is written, the
no-duplicates order keeps repeated texts apart, and a trained model is saved as a sentence-transformers directory."""

from __future__ import annotations

import pytest

from bertkit.errors import BertkitError
from bertkit.sentence import (
    SentenceTransformer,
    SentenceTransformerTrainer,
    SentenceTransformerTrainingArguments,
    evaluation,
    losses,
)
from bertkit.sentence.data import SentenceExamples, no_duplicates_order
from bertkit.sentence.training_args import BatchSamplers
from sentence_helpers import st_directory

PAIRS = [{"anchor": f"question {i}", "positive": f"paragraph {i // 2}"} for i in range(12)]


@pytest.fixture(scope="module")
def model(tmp_path_factory, minilm_dir):
    return SentenceTransformer(st_directory(minilm_dir, tmp_path_factory.mktemp("st") / "m", dropout=0.0,
                                            max_seq_length=32))


def _args(tmp_path, **kwargs):
    return SentenceTransformerTrainingArguments(output_dir=str(tmp_path / "out"), report_to="none", use_cpu=True,
                                                disable_tqdm=True, **kwargs)


def test_bad_input_is_named_before_anything_is_written(model, tmp_path):
    mnrl = losses.MultipleNegativesRankingLoss(model)
    with pytest.raises(BertkitError, match=r"text columns \['anchor'\].*takes 2 or more text column"):
        SentenceTransformerTrainer(model=model, args=_args(tmp_path), loss=mnrl,
                                   train_dataset=[{"anchor": p["anchor"]} for p in PAIRS])
    with pytest.raises(BertkitError, match="CoSENTLoss takes 2 text column.*label column"):
        SentenceTransformerTrainer(model=model, args=_args(tmp_path), loss=losses.CoSENTLoss(model), train_dataset=PAIRS)
    with pytest.raises(BertkitError, match="TripletLoss takes 3 text column"):
        SentenceTransformerTrainer(model=model, args=_args(tmp_path), loss=losses.TripletLoss(model), train_dataset=PAIRS)
    with pytest.raises(BertkitError, match="a batch of 1 holds none: set per_device_train_batch_size to 2"):
        SentenceTransformerTrainer(model=model, args=_args(tmp_path, per_device_train_batch_size=1), loss=mnrl,
                                   train_dataset=PAIRS)
    with pytest.raises(BertkitError, match="router_mapping"):
        _args(tmp_path, router_mapping={"anchor": "query"})
    with pytest.raises(BertkitError, match="group_by_label"):
        _args(tmp_path, batch_sampler=BatchSamplers.GROUP_BY_LABEL)
    with pytest.raises(BertkitError, match="optimizers"):
        SentenceTransformerTrainer(model=model, args=_args(tmp_path), loss=mnrl, train_dataset=PAIRS,
                                   optimizers=(object(), None))
    with pytest.raises(BertkitError, match=r"relevant document id\(s\) are not in the corpus, e.g. \['d9'\]"):
        evaluation.InformationRetrievalEvaluator({"q": "a question"}, {"d1": "a doc"}, {"q": {"d1", "d9"}})
    # duplicates the no-duplicates sampler cannot keep apart: refused before the first step
    trainer = SentenceTransformerTrainer(
        model=model, args=_args(tmp_path, per_device_train_batch_size=4, batch_sampler=BatchSamplers.NO_DUPLICATES),
        loss=mnrl, train_dataset=[{"anchor": f"q{i}", "positive": "the same paragraph" if i < 3 else f"p{i}"}
                                  for i in range(8)])  # 3 rows share a text, 2 batches of 4 can hold only 2 of them
    with pytest.raises(BertkitError, match="cannot keep 'the same paragraph' out of a batch.*in 3 rows"):
        trainer.train()
    assert not (tmp_path / "out").exists()


def test_no_duplicates_order_keeps_repeats_apart(model):
    """Every row once per epoch, no batch repeating a text, also where the greedy pass alone gets stuck (seeds
    whose last rows all share paragraphs are repaired by swaps)."""
    pairs = [{"anchor": f"question {i}", "positive": f"paragraph {i // 3}"} for i in range(24)]
    examples = SentenceExamples(pairs, model, losses.MultipleNegativesRankingLoss(model), None, "train_dataset")
    for seed in range(20):
        order = no_duplicates_order(examples, 4, seed)
        assert sorted(order) == list(range(24))
        for start in range(0, 24, 4):
            paragraphs = [pairs[i]["positive"] for i in order[start:start + 4]]
            assert len(set(paragraphs)) == len(paragraphs)


def test_training_saves_a_sentence_transformers_directory(model, tmp_path):
    loss = losses.MatryoshkaLoss(model, losses.CachedMultipleNegativesRankingLoss(model, mini_batch_size=2), [384, 32])
    args = _args(tmp_path, per_device_train_batch_size=4, max_steps=2, learning_rate=1e-4, save_strategy="no",
                 prompts={"anchor": "query: "})
    before = model.encode(["query: question 1"])
    result = SentenceTransformerTrainer(model=model, args=args, train_dataset=PAIRS, loss=loss).train()
    assert result.global_step == 2 and result.training_loss > 0
    assert abs(model.encode(["query: question 1"]) - before).max() > 1e-4
    SentenceTransformerTrainer(model=model, args=args, train_dataset=PAIRS, loss=loss).save_model(tmp_path / "saved")
    again = SentenceTransformer(tmp_path / "saved")
    assert abs(again.encode(["question 1"], truncate_dim=32) - model.encode(["question 1"], truncate_dim=32)).max() == 0
