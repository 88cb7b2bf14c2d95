"""The sentence trainers' public surface against sentence-transformers 6's, the same code run with each library:
what ``trainer.model`` is, what ``args.device`` is, what a refused run leaves in output_dir, and what the trainers'
results, records and saved models hold."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch

from bertkit.errors import BertkitError
from bertkit.sentence import (
    SentenceTransformer,
    SentenceTransformerTrainer,
    SentenceTransformerTrainingArguments,
    losses,
)
from bertkit.sentence.cross_encoder import CrossEncoder, CrossEncoderTrainer, CrossEncoderTrainingArguments
from bertkit.sentence.cross_encoder import losses as ce_losses
from bertkit.sentence.sparse_encoder import (
    SparseEncoder,
    SparseEncoderTrainer,
    SparseEncoderTrainingArguments,
)
from bertkit.training.callbacks import TrainerCallback
from cases import slow_after
from cross_encoder_helpers import cross_encoder_directory
from sentence_helpers import st_directory
from sparse_helpers import masked_lm_checkpoint

st = pytest.importorskip("sentence_transformers")
datasets = pytest.importorskip("datasets")

PAIRS = [{"anchor": f"question {i}", "positive": f"paragraph {i // 2}"} for i in range(8)]
SCORED = [{"query": f"question {i}", "passage": f"paragraph {i // 2}", "label": float(i % 2)} for i in range(8)]
QUIET = {"report_to": "none", "use_cpu": True, "disable_tqdm": True}


@pytest.fixture(scope="module")
def dirs(tmp_path_factory, minilm_2_layers):
    """MiniLM's first 2 layers in each layout: every check here compares bertkit's trainer with the reference's on
    the same weights, or what a run does and leaves, none MiniLM's own numbers; a checkpoint a third smaller to save
    and resume."""
    root = tmp_path_factory.mktemp("trainer-api")
    return {"dense": st_directory(minilm_2_layers, root / "st", dropout=0.0, max_seq_length=32),
            "cross": cross_encoder_directory(minilm_2_layers, root / "ce"),
            "cross3": cross_encoder_directory(minilm_2_layers, root / "ce3", num_labels=3),
            "sparse": masked_lm_checkpoint(minilm_2_layers, root / "mlm", dropout=0.0)}


def _bertkit_trainer(kind: str, path, out, **kwargs):
    """A trainer of ``kind`` (dense, cross, sparse) on a fresh model from ``path``, its default loss."""
    if kind == "dense":
        model = SentenceTransformer(path)
        return SentenceTransformerTrainer(
            model=model, args=SentenceTransformerTrainingArguments(output_dir=str(out), **QUIET, **kwargs),
            train_dataset=PAIRS, loss=losses.MultipleNegativesRankingLoss(model))
    if kind == "cross":
        model = CrossEncoder(path, max_length=16)
        return CrossEncoderTrainer(model=model, args=CrossEncoderTrainingArguments(output_dir=str(out), **QUIET, **kwargs),
                                   train_dataset=SCORED, loss=ce_losses.BinaryCrossEntropyLoss(model))
    model = SparseEncoder(path)
    return SparseEncoderTrainer(model=model, args=SparseEncoderTrainingArguments(output_dir=str(out), **QUIET, **kwargs),
                                train_dataset=PAIRS)


def _reference_trainer(kind: str, path, out):
    if kind == "dense":
        from sentence_transformers.sentence_transformer import losses as st_losses

        model = st.SentenceTransformer(str(path), device="cpu")
        trainer, args, loss, rows = (st.SentenceTransformerTrainer, st.SentenceTransformerTrainingArguments,
                                     st_losses.MultipleNegativesRankingLoss(model), PAIRS)
    elif kind == "cross":
        from sentence_transformers import cross_encoder

        model = cross_encoder.CrossEncoder(str(path), device="cpu", max_length=16)
        trainer, args, loss, rows = (cross_encoder.CrossEncoderTrainer, cross_encoder.CrossEncoderTrainingArguments,
                                     cross_encoder.losses.BinaryCrossEntropyLoss(model), SCORED)
    else:
        from sentence_transformers import sparse_encoder

        model = sparse_encoder.SparseEncoder(str(path), device="cpu")
        trainer, args, rows = sparse_encoder.SparseEncoderTrainer, sparse_encoder.SparseEncoderTrainingArguments, PAIRS
        loss = sparse_encoder.losses.SpladeLoss(model, sparse_encoder.losses.SparseMultipleNegativesRankingLoss(model),
                                                query_regularizer_weight=5e-5, document_regularizer_weight=3e-5)
    return model, trainer(model=model, args=args(output_dir=str(out), report_to="none", use_cpu=True),
                          train_dataset=datasets.Dataset.from_list(rows), loss=loss)


@pytest.mark.parametrize("kind", ["dense", "cross", "sparse"])
def test_trainer_model_is_the_model_passed_in(kind, dirs, tmp_path):
    """``trainer.model`` is the model given to the trainer, as in sentence-transformers, where scripts end with
    ``trainer.model.save_pretrained(path)`` or ``trainer.model.encode(...)``: bertkit's was the loss wrapper the loop
    trains (no encode/predict, another module). After training it holds the trained weights, and what it saves is
    the model that encodes so."""
    reference, theirs = _reference_trainer(kind, dirs[kind], tmp_path / "reference")
    assert theirs.model is reference
    trainer = _bertkit_trainer(kind, dirs[kind], tmp_path / "out", max_steps=2, per_device_train_batch_size=4,
                               learning_rate=1e-4, save_strategy="no")
    model = trainer.model
    assert type(model).__name__ == type(reference).__name__
    dense = {} if kind == "dense" else {"convert_to_sparse_tensor": False}
    before = model.predict([("question 1", "paragraph 0")]) if kind == "cross" else model.encode(["question 1"],
                                                                                               convert_to_tensor=True,
                                                                                               **dense)
    assert trainer.train().global_step == 2
    assert trainer.model is model
    trainer.model.save_pretrained(str(tmp_path / "saved"))
    if kind == "cross":
        after = trainer.model.predict([("question 1", "paragraph 0")])
        assert abs(after - before).max() > 1e-5
        again = CrossEncoder(tmp_path / "saved", max_length=16).predict([("question 1", "paragraph 0")])
        assert abs(again - after).max() < 1e-5
    else:
        after = trainer.model.encode(["question 1"], convert_to_tensor=True, **dense)
        assert (after - before).abs().max() > 1e-5
        loaded = (SentenceTransformer if kind == "dense" else SparseEncoder)(tmp_path / "saved")
        assert (loaded.encode(["question 1"], convert_to_tensor=True, **dense) - after).abs().max() < 1e-5


def test_args_device_is_the_torch_device_transformers_gives(tmp_path):
    """``args.device`` is a torch.device, transformers' (scripts do ``batch.to(args.device)``, ``args.device.type``):
    bertkit's was the string "auto" (and "cpu" with use_cpu), which has no ``.type`` and which ``.to`` refuses."""
    import transformers

    import bertkit

    for use_cpu in (False, True):
        want = transformers.TrainingArguments(output_dir=str(tmp_path / "t"), use_cpu=use_cpu).device
        assert st.SentenceTransformerTrainingArguments(output_dir=str(tmp_path / "s"), use_cpu=use_cpu).device == want
        for cls in (bertkit.TrainingArguments, SentenceTransformerTrainingArguments, CrossEncoderTrainingArguments,
                    SparseEncoderTrainingArguments):
            got = cls(output_dir=str(tmp_path / "b"), use_cpu=use_cpu).device
            assert isinstance(got, torch.device) and got == want, (cls.__name__, use_cpu, got, want)
            assert torch.zeros(1).to(got).device.type == want.type
    assert not list(tmp_path.iterdir())


class _Refuse(TrainerCallback):
    """Fails the run at the start of step ``at`` (what a first batch the model refuses does)."""

    def __init__(self, at: int):
        self.at = at

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step + 1 == self.at:
            raise ValueError(f"refused at step {self.at}")


def test_a_run_refused_as_it_starts_leaves_nothing_it_created(dirs, tmp_path):
    """A run that fails before it has written anything (its first step refused) leaves nothing it created: bertkit's
    left output_dir with its lock, its manifest and an empty metrics.jsonl (and the parents it made). A directory that
    was there before stays; a run that logged a step keeps its record."""
    runs = tmp_path / "runs"
    trainer = _bertkit_trainer("cross", dirs["cross"], runs / "a" / "out", max_steps=2, per_device_train_batch_size=4)
    trainer.add_callback(_Refuse(at=1))
    with pytest.raises(ValueError, match="refused at step 1"):
        trainer.train()
    assert not runs.exists()
    mine = tmp_path / "mine"
    mine.mkdir()
    trainer = _bertkit_trainer("cross", dirs["cross"], mine, max_steps=2, per_device_train_batch_size=4)
    trainer.add_callback(_Refuse(at=1))
    with pytest.raises(ValueError, match="refused at step 1"):
        trainer.train()
    assert mine.is_dir() and not list(mine.iterdir())
    trainer = _bertkit_trainer("cross", dirs["cross"], mine, max_steps=2, per_device_train_batch_size=4,
                               logging_steps=1)
    trainer.add_callback(_Refuse(at=2))
    with pytest.raises(ValueError, match="refused at step 2"):
        trainer.train()
    assert [json.loads(r)["step"] for r in (mine / "metrics.jsonl").read_text().splitlines()] == [1]


def test_a_compute_loss_override_and_label_smoothing_are_refused_with_the_fix(dirs, tmp_path):
    """The base Trainer calls a compute_loss override with (model, batch); sentence-transformers' calls the loss on the
    batch's features, so an override written for it is refused, as label_smoothing_factor, which its trainers never
    apply, and save_only_model and include_num_input_tokens_seen, which the base Trainer implements."""

    class Custom(SentenceTransformerTrainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            raise AssertionError("never called")

    model = SentenceTransformer(dirs["dense"])
    with pytest.raises(BertkitError, match="Custom overrides compute_loss, .*a loss module, given as loss="):
        Custom(model=model, args=SentenceTransformerTrainingArguments(output_dir=str(tmp_path / "never"), **QUIET),
               train_dataset=PAIRS, loss=losses.MultipleNegativesRankingLoss(model))
    with pytest.raises(BertkitError, match="label_smoothing_factor 0.1: sentence-transformers' trainers never apply"):
        CrossEncoderTrainingArguments(output_dir=str(tmp_path / "never"), label_smoothing_factor=0.1, **QUIET)
    # the base Trainer's bf16_full_eval evaluates a bf16 copy of the model; the evaluator would score the model
    with pytest.raises(BertkitError, match="bf16_full_eval / fp16_full_eval are not implemented for the sentence"):
        SentenceTransformerTrainer(model=model, args=SentenceTransformerTrainingArguments(
            output_dir=str(tmp_path / "never"), bf16_full_eval=True, **QUIET), train_dataset=PAIRS,
            loss=losses.MultipleNegativesRankingLoss(model))
    # a model-only checkpoint would leave out the loss (and its own weights): refused, naming save_model
    with pytest.raises(BertkitError, match=r"SentenceTransformerTrainer: save_only_model=True is not implemented for "
                                           r"the sentence trainers; .* trainer\.save_model\(DIR\)"):
        SentenceTransformerTrainer(model=model, args=SentenceTransformerTrainingArguments(
            output_dir=str(tmp_path / "never"), save_only_model=True, **QUIET), train_dataset=PAIRS,
            loss=losses.MultipleNegativesRankingLoss(model))
    with pytest.raises(BertkitError, match=r"SentenceTransformerTrainer: include_num_input_tokens_seen='all' is not "
                                           r"implemented for the sentence trainers \(sentence-transformers' .* logs 0\)"):
        SentenceTransformerTrainer(model=model, args=SentenceTransformerTrainingArguments(
            output_dir=str(tmp_path / "never"), include_num_input_tokens_seen=True, **QUIET), train_dataset=PAIRS,
            loss=losses.MultipleNegativesRankingLoss(model))
    # the cross-encoder trainer, built by the same constructor, refuses it too (its evaluator scores the model)
    cross = CrossEncoder(dirs["cross"])
    with pytest.raises(BertkitError, match="CrossEncoderTrainer: bf16_full_eval / fp16_full_eval are not implemented"):
        CrossEncoderTrainer(model=cross, args=CrossEncoderTrainingArguments(
            output_dir=str(tmp_path / "never"), fp16_full_eval=True, **QUIET),
            train_dataset=[{**row, "label": 1.0} for row in PAIRS])
    assert not (tmp_path / "never").exists()


@pytest.mark.parametrize("labels", ["cross", "cross3"])
def test_predict_of_no_pairs_is_sentence_transformers_empty_result(labels, dirs):
    """``CrossEncoder.predict([])`` is sentence-transformers' ``np.array([])``, shape (0,) float64, whatever the
    labels (bertkit's was (0, 3) float32 for three); ``torch.tensor([])`` with convert_to_tensor, ``[]`` with both
    conversions off."""
    from sentence_transformers.cross_encoder import CrossEncoder as Reference

    ours, theirs = CrossEncoder(dirs[labels]), Reference(str(dirs[labels]), device="cpu")
    assert ours.num_labels == theirs.num_labels == (1 if labels == "cross" else 3)
    for kwargs in ({}, {"apply_softmax": True}, {"convert_to_tensor": True}, {"convert_to_numpy": False},
                   {"convert_to_tensor": True, "apply_softmax": True}):
        got, want = ours.predict([], **kwargs), theirs.predict([], **kwargs)
        assert type(got) is type(want), kwargs
        if isinstance(want, list):
            assert got == want == []
        else:
            assert (tuple(got.shape), got.dtype) == (tuple(want.shape), want.dtype), kwargs


def test_a_float_class_label_is_refused_before_training_with_the_fix(dirs, tmp_path):
    """CrossEntropyLoss (a model with 3 labels) given a float class id, 1.0 from a float column: sentence-transformers
    trains into torch's bare "expected target dtype to be Long or Byte, but got Float" at the first step, and so did
    bertkit. bertkit refuses it when the trainer is made, naming the row and the fix, which then trains."""
    from sentence_transformers import cross_encoder

    rows = [{"query": f"question {i}", "passage": f"paragraph {i}", "label": float(i % 3)} for i in range(4)]
    reference = cross_encoder.CrossEncoder(str(dirs["cross3"]), device="cpu")
    theirs = cross_encoder.CrossEncoderTrainer(
        model=reference, args=cross_encoder.CrossEncoderTrainingArguments(
            output_dir=str(tmp_path / "reference"), report_to="none", use_cpu=True, max_steps=1,
            per_device_train_batch_size=4, save_strategy="no"),
        train_dataset=datasets.Dataset.from_list(rows), loss=cross_encoder.losses.CrossEntropyLoss(reference))
    with pytest.raises(RuntimeError, match="expected target dtype to be Long or Byte, but got Float"):
        theirs.train()
    model = CrossEncoder(dirs["cross3"], max_length=16)
    args = CrossEncoderTrainingArguments(output_dir=str(tmp_path / "out"), **QUIET, max_steps=1,
                                         per_device_train_batch_size=4, save_strategy="no")
    data = datasets.Dataset.from_list(rows)
    with pytest.raises(BertkitError, match=re.escape(
            "train_dataset: row 0 has label 0.0, a float, and CrossEntropyLoss takes a class index, an int from 0 to 2 "
            "(or a list of 3 class probabilities); cast the column to integers: dataset.cast_column('label', "
            "Value('int64')) (from datasets import Value), or int() each")):
        CrossEncoderTrainer(model=model, args=args, train_dataset=data)
    with pytest.raises(BertkitError, match=re.escape(
            "row 2 has label 1.5, a float, and CrossEntropyLoss takes a class index, an int from 0 to 2 (or a list of 3 "
            "class probabilities); map the labels to class indices")):
        CrossEncoderTrainer(model=model, args=args, train_dataset=[*rows[:2], {**rows[2], "label": 1.5}, *rows[3:]])
    assert not (tmp_path / "out").exists()
    advised = data.cast_column("label", datasets.Value("int64"))
    assert CrossEncoderTrainer(model=model, args=args, train_dataset=advised).train().global_step == 1
    soft = [{**r, "label": [0.2, 0.3, 0.5]} for r in rows]  # class probabilities: torch's soft targets
    assert CrossEncoderTrainer(model=model, args=args, train_dataset=soft).train().global_step == 1


@pytest.mark.parametrize("kind", ["dense", "cross"])
def test_gradient_checkpointing_trains_the_model_a_loss_wraps(kind, dirs, tmp_path):
    """gradient_checkpointing=True, which sentence-transformers' trainers take, was refused by the sentence trainers
    (the loop looked for ``.bert`` on the loss it is handed); it recomputes the layers of the encoder the loss holds,
    to the same losses (dropout off)."""
    losses_by_run = []
    for checkpointing in (False, True):
        trainer = _bertkit_trainer(kind, dirs[kind], tmp_path / str(checkpointing), max_steps=2, logging_steps=1,
                                   per_device_train_batch_size=4, save_strategy="no",
                                   gradient_checkpointing=checkpointing)
        trainer.train()
        losses_by_run.append([r["loss"] for r in trainer.state.log_history if "loss" in r])
    assert len(losses_by_run[0]) == 2
    np.testing.assert_allclose(losses_by_run[1], losses_by_run[0], rtol=1e-5)


def _evaluate_then_train(lib, path, out, eval_data: bool = True) -> tuple[list[str], list[list[str]]]:
    """evaluate() then train() with an evaluator (and the pairs as eval_dataset when ``eval_data``); (the evaluate()
    metric names, the results CSV's epoch and step columns)."""
    import csv
    import importlib

    dense = importlib.import_module(lib if lib == "sentence_transformers" else "bertkit.sentence")
    evaluation = importlib.import_module(f"{dense.__name__}.evaluation")
    model = dense.SentenceTransformer(str(path), **({"device": "cpu"} if dense is st else {}))
    evaluator = evaluation.EmbeddingSimilarityEvaluator(["a cat", "a dog", "a car"], ["the cat", "a car", "a bus"],
                                                              [1.0, 0.0, 0.6], name="sts")
    args = dense.SentenceTransformerTrainingArguments(
        output_dir=str(out), report_to="none", use_cpu=True, max_steps=2, per_device_train_batch_size=4,
        eval_strategy="steps", eval_steps=2, save_strategy="no")
    if dense is st:
        from sentence_transformers.sentence_transformer import losses as st_losses

        loss, rows = st_losses.MultipleNegativesRankingLoss(model), datasets.Dataset.from_list(PAIRS)
    else:
        loss, rows = losses.MultipleNegativesRankingLoss(model), PAIRS
    trainer = dense.SentenceTransformerTrainer(model=model, args=args, train_dataset=rows, loss=loss,
                                               eval_dataset=rows if eval_data else None, evaluator=evaluator)
    names = sorted(k for k in trainer.evaluate() if "runtime" not in k and "per_second" not in k and "preparation" not in k)
    trainer.train()
    with open(out / "eval" / "similarity_evaluation_sts_results.csv", newline="") as f:
        return names, [row[:2] for row in csv.reader(f)]


def test_evaluate_before_train_then_train_into_the_same_output_dir(dirs, tmp_path):
    """``trainer.evaluate()`` before ``trainer.train()`` (a script's baseline): the evaluator's results CSV goes to
    output_dir/eval, and bertkit's train() then refused output_dir as holding a file it did not write. It trains on,
    the CSV holding the baseline's row and the run's, as sentence-transformers'."""
    theirs = _evaluate_then_train("sentence_transformers", dirs["dense"], tmp_path / "reference")
    ours = _evaluate_then_train("bertkit", dirs["dense"], tmp_path / "out")
    assert ours == theirs, (ours, theirs)


def test_evaluate_with_the_evaluator_alone_returns_the_epoch_as_sentence_transformers(dirs, tmp_path):
    """With no eval_dataset, evaluate() returns the evaluator's metrics and the epoch (0 before training), as
    sentence-transformers' does (transformers' log() adds it to the dict it logs); bertkit's lacked the epoch."""
    theirs = _evaluate_then_train("sentence_transformers", dirs["dense"], tmp_path / "reference", eval_data=False)
    ours = _evaluate_then_train("bertkit", dirs["dense"], tmp_path / "out", eval_data=False)
    assert ours == theirs, (ours, theirs)
    assert "epoch" in ours[0]


@pytest.mark.parametrize("kind", ["dense", "cross"])
def test_an_evaluation_by_the_evaluator_alone_draws_what_sentence_transformers_draws(kind, dirs, tmp_path):
    """With no eval_dataset, sentence-transformers' evaluation loop still starts a data loader (over no rows), which
    draws one number from torch's global generator; bertkit's drew none, so after an evaluation in training a loss that
    samples from that generator (the cross-encoder MultipleNegativesRankingLoss's negatives, dropout) trained on other
    draws: torch's generator at each step's start, and after evaluate(), is sentence-transformers'."""
    import transformers
    from sentence_transformers import cross_encoder as st_cross
    from sentence_transformers.cross_encoder import evaluation as st_ce_evaluation
    from sentence_transformers.sentence_transformer import evaluation as st_evaluation

    from bertkit.sentence import evaluation
    from bertkit.sentence.cross_encoder import evaluation as ce_evaluation

    pairs = [(r["query"], r["passage"]) for r in SCORED]
    scores = [r["label"] for r in SCORED]

    def next_draws() -> list[float]:  # what the global generator draws next, left as it is
        generator = torch.Generator()
        generator.set_state(torch.get_rng_state())
        return torch.rand(4, generator=generator).tolist()

    def states(lib: str) -> list[list[float]]:
        reference = lib == "st"
        seen = []

        class Seen(transformers.TrainerCallback if reference else TrainerCallback):
            def on_step_begin(self, args, state, control, **kwargs):
                seen.append(next_draws())

        common = dict(output_dir=str(tmp_path / lib), max_steps=2, eval_strategy="steps", eval_steps=1,
                      per_device_train_batch_size=4, save_strategy="no", **QUIET)
        if kind == "dense":
            E = st_evaluation if reference else evaluation
            evaluator = E.EmbeddingSimilarityEvaluator(*map(list, zip(*pairs)), scores)
            if reference:
                from sentence_transformers.sentence_transformer import losses as st_losses

                model = st.SentenceTransformer(str(dirs["dense"]), device="cpu")
                trainer = st.SentenceTransformerTrainer(
                    model=model, args=st.SentenceTransformerTrainingArguments(**common), evaluator=evaluator,
                    train_dataset=datasets.Dataset.from_list(PAIRS), callbacks=[Seen()],
                    loss=st_losses.MultipleNegativesRankingLoss(model))
            else:
                model = SentenceTransformer(dirs["dense"])
                trainer = SentenceTransformerTrainer(model=model, args=SentenceTransformerTrainingArguments(**common),
                                                     train_dataset=PAIRS, evaluator=evaluator, callbacks=[Seen()],
                                                     loss=losses.MultipleNegativesRankingLoss(model))
        else:
            E = st_ce_evaluation if reference else ce_evaluation
            evaluator = E.CrossEncoderCorrelationEvaluator(pairs, scores)
            if reference:
                model = st_cross.CrossEncoder(str(dirs["cross"]), device="cpu", max_length=16)
                trainer = st_cross.CrossEncoderTrainer(
                    model=model, args=st_cross.CrossEncoderTrainingArguments(**common), evaluator=evaluator,
                    train_dataset=datasets.Dataset.from_list(SCORED), callbacks=[Seen()],
                    loss=st_cross.losses.BinaryCrossEntropyLoss(model))
            else:
                model = CrossEncoder(dirs["cross"], max_length=16)
                trainer = CrossEncoderTrainer(model=model, args=CrossEncoderTrainingArguments(**common),
                                              train_dataset=SCORED, evaluator=evaluator, callbacks=[Seen()],
                                              loss=ce_losses.BinaryCrossEntropyLoss(model))
        trainer.train()
        torch.manual_seed(0)
        trainer.evaluate()
        return [*seen, next_draws()]

    theirs, ours = states("st"), states("bk")
    assert len(ours) == len(theirs) == 3
    assert ours == theirs


# the cross-encoder (5 s) checks the trainers' shared seeding; the dense trainer (14 s) runs in `make test-slow`
@pytest.mark.parametrize("kind", slow_after(["cross", "dense"]))
def test_draws_between_making_the_trainer_and_train_move_the_run_as_sentence_transformers(kind, dirs, minilm_2_layers,
                                                                                          tmp_path):
    """Dropout on, an evaluate() and a script's torch.rand between making the trainer and train(): sentence-transformers
    seeds when the trainer is made (transformers' Trainer.__init__) and trains on from there, so both draws move its
    masks; bertkit's train() seeded again, so its losses were those of a run without them (1% apart)."""
    from sentence_transformers import cross_encoder as st_cross
    from sentence_transformers.sentence_transformer import losses as st_losses

    path = tmp_path / "dropout"
    if kind == "dense":
        st_directory(minilm_2_layers, path, dropout=0.1, max_seq_length=32)
    else:
        path.mkdir()
        for f in dirs["cross"].iterdir():
            (path / f.name).symlink_to(f)
        (path / "config.json").unlink()
        config = json.loads((dirs["cross"] / "config.json").read_text())
        (path / "config.json").write_text(json.dumps({**config, "hidden_dropout_prob": 0.1,
                                                      "attention_probs_dropout_prob": 0.1}))

    def losses_of(lib: str) -> list[float]:
        common = dict(output_dir=str(tmp_path / lib), max_steps=4, per_device_train_batch_size=4, learning_rate=1e-4,
                      logging_steps=1, save_strategy="no", seed=5, **QUIET)
        rows = PAIRS if kind == "dense" else SCORED
        if lib == "st" and kind == "dense":
            model = st.SentenceTransformer(str(path), device="cpu")
            trainer = st.SentenceTransformerTrainer(
                model=model, args=st.SentenceTransformerTrainingArguments(**common), loss=st_losses.
                MultipleNegativesRankingLoss(model), train_dataset=datasets.Dataset.from_list(rows),
                eval_dataset=datasets.Dataset.from_list(rows))
        elif lib == "st":
            model = st_cross.CrossEncoder(str(path), device="cpu", max_length=16)
            trainer = st_cross.CrossEncoderTrainer(
                model=model, args=st_cross.CrossEncoderTrainingArguments(**common), train_dataset=datasets.Dataset.
                from_list(rows), eval_dataset=datasets.Dataset.from_list(rows),
                loss=st_cross.losses.BinaryCrossEntropyLoss(model))
        elif kind == "dense":
            model = SentenceTransformer(path)
            trainer = SentenceTransformerTrainer(model=model, args=SentenceTransformerTrainingArguments(**common),
                                                 train_dataset=rows, eval_dataset=rows,
                                                 loss=losses.MultipleNegativesRankingLoss(model))
        else:
            model = CrossEncoder(path, max_length=16)
            trainer = CrossEncoderTrainer(model=model, args=CrossEncoderTrainingArguments(**common), train_dataset=rows,
                                          eval_dataset=rows, loss=ce_losses.BinaryCrossEntropyLoss(model))
        trainer.evaluate()
        torch.rand(3)
        trainer.train()
        return [r["loss"] for r in trainer.state.log_history if "loss" in r]

    theirs, ours = losses_of("st"), losses_of("bk")
    assert len(ours) == len(theirs) == 4
    np.testing.assert_allclose(ours, theirs, rtol=1e-5)


def _resumed_loss(lib, path, out) -> tuple[float, list[float], int]:
    """A 4-step run saved at step 2, then resumed from checkpoint-2 by a new trainer: (its training_loss, the
    losses logged at steps 3 and 4, its global_step)."""
    import importlib

    dense = importlib.import_module(lib if lib == "sentence_transformers" else "bertkit.sentence")
    losses_module = importlib.import_module(f"{lib}.sentence_transformer.losses" if dense is st else "bertkit.sentence.losses")
    rows = datasets.Dataset.from_list(PAIRS) if dense is st else PAIRS
    args = dense.SentenceTransformerTrainingArguments(output_dir=str(out), report_to="none", use_cpu=True, max_steps=4,
                                                      save_steps=2, logging_steps=1, per_device_train_batch_size=4)
    for resume in (None, str(out / "checkpoint-2")):
        model = dense.SentenceTransformer(str(path), **({"device": "cpu"} if dense is st else {}))
        trainer = dense.SentenceTransformerTrainer(model=model, args=args, train_dataset=rows,
                                                   loss=losses_module.MultipleNegativesRankingLoss(model))
        result = trainer.train(resume_from_checkpoint=resume)
    logged = [r["loss"] for r in trainer.state.log_history if "loss" in r and r["step"] > 2]
    return result.training_loss, logged, result.global_step


@pytest.mark.slow  # long; in make test-slow (make test stays under 5 minutes)
def test_a_resumed_run_reports_the_mean_loss_of_the_steps_it_trained(dirs, tmp_path):
    """train(resume_from_checkpoint=...)'s training_loss is the mean of the steps that call trained (3 and 4 of a run
    resumed at step 2), as transformers computes it; bertkit's was the mean over all 4 steps, the checkpoint's
    history included."""
    for lib in ("sentence_transformers", "bertkit"):
        loss, logged, step = _resumed_loss(lib, dirs["dense"], tmp_path / lib)
        assert step == 4 and len(logged) == 2, lib
        assert loss == pytest.approx(sum(logged) / 2, rel=1e-6), (lib, loss, logged)


def _two_evaluators(lib, path, out) -> tuple[list[str], list[str], list[str]]:
    """evaluator=[sts, sts2]: (the evaluation record's metric names, evaluate()'s, the results CSVs written)."""
    import importlib

    dense = importlib.import_module(lib if lib == "sentence_transformers" else "bertkit.sentence")
    evaluation = importlib.import_module(f"{dense.__name__}.evaluation")
    losses_module = importlib.import_module(f"{lib}.sentence_transformer.losses" if dense is st else "bertkit.sentence.losses")
    model = dense.SentenceTransformer(str(path), **({"device": "cpu"} if dense is st else {}))
    evaluators = [evaluation.EmbeddingSimilarityEvaluator(["a cat", "a dog", "a car"], [second, "a car", "a bus"],
                                                          [1.0, 0.0, 0.6], name=name)
                  for name, second in (("sts", "the cat"), ("sts2", "a tree"))]
    args = dense.SentenceTransformerTrainingArguments(
        output_dir=str(out), report_to="none", use_cpu=True, max_steps=2, per_device_train_batch_size=4,
        eval_strategy="steps", eval_steps=2, save_strategy="no")
    rows = datasets.Dataset.from_list(PAIRS) if dense is st else PAIRS
    trainer = dense.SentenceTransformerTrainer(model=model, args=args, train_dataset=rows, eval_dataset=rows,
                                               loss=losses_module.MultipleNegativesRankingLoss(model),
                                               evaluator=evaluators)
    trainer.train()

    def names(metrics: dict) -> list[str]:
        return sorted(k for k in metrics if not k.endswith(("runtime", "per_second", "preparation_time")))

    record = next(r for r in trainer.state.log_history if "eval_loss" in r)
    return names(record), names(trainer.evaluate()), sorted(p.name for p in (out / "eval").iterdir())


def test_a_list_of_evaluators_is_one_sequential_evaluator(dirs, tmp_path):
    """``evaluator=[a, b]``: sentence-transformers' trainer wraps the list in a SequentialEvaluator (each one's
    metrics and ``eval_sequential_score``, each one's CSV); bertkit's called the list at the first evaluation,
    mid-training (TypeError: 'list' object is not callable)."""
    theirs = _two_evaluators("sentence_transformers", dirs["dense"], tmp_path / "reference")
    ours = _two_evaluators("bertkit", dirs["dense"], tmp_path / "out")
    assert ours == theirs
    assert "eval_sequential_score" in ours[1] and len(ours[2]) == 2


def _cross_encoder_evaluations(lib, path, out) -> tuple[list[str], list[str], list[str]]:
    """A CrossEncoderTrainer with a classification evaluator: (evaluate()'s metric names before training, the
    evaluation record's, the results CSVs)."""
    import importlib

    package = lib if lib == "sentence_transformers" else "bertkit.sentence"
    cross = importlib.import_module(f"{package}.cross_encoder")
    evaluation = importlib.import_module(f"{package}.cross_encoder.evaluation")
    model = cross.CrossEncoder(str(path), **({"device": "cpu"} if lib == "sentence_transformers" else {}))
    evaluator = evaluation.CrossEncoderClassificationEvaluator(
        [("a cat", "the cat"), ("a dog", "a car"), ("a bus", "the bus"), ("x", "y")], [1, 0, 1, 0], name="cls")
    args = cross.CrossEncoderTrainingArguments(output_dir=str(out), report_to="none", use_cpu=True, max_steps=2,
                                               per_device_train_batch_size=4, eval_strategy="steps", eval_steps=2,
                                               save_strategy="no")
    rows = datasets.Dataset.from_list(SCORED)
    trainer = cross.CrossEncoderTrainer(model=model, args=args, train_dataset=rows, eval_dataset=rows,
                                        loss=cross.losses.BinaryCrossEntropyLoss(model), evaluator=evaluator)

    def names(metrics: dict) -> list[str]:
        return sorted(k for k in metrics if not k.endswith(("runtime", "per_second", "preparation_time")))

    before = names(trainer.evaluate())
    trainer.train()
    record = next(r for r in trainer.state.log_history if "eval_loss" in r and r["step"] == 2)
    return before, names(record), sorted(p.name for p in (out / "eval").iterdir())


def test_cross_encoder_trainer_runs_its_evaluator(dirs, tmp_path):
    """A CrossEncoderTrainer given an evaluator evaluates with it, before and during training, as
    sentence-transformers' does (same metric names, same CSV); bertkit's raised AttributeError
    ('_evaluations_write_csv') at its first evaluation."""
    theirs = _cross_encoder_evaluations("sentence_transformers", dirs["cross"], tmp_path / "reference")
    ours = _cross_encoder_evaluations("bertkit", dirs["cross"], tmp_path / "out")
    assert ours == theirs
    assert "eval_cls_accuracy" in ours[0]


@pytest.mark.parametrize("kind", ["dense", "cross"])
def test_eval_strategy_without_anything_to_evaluate_names_the_evaluator_too(kind, dirs, tmp_path):
    """Was: "eval_strategy 'steps' needs an eval_dataset: pass SentenceTransformerTrainer(eval_dataset=...)", where
    these trainers evaluate with an evaluator alone too (sentence-transformers: "Either provide an `eval_dataset` or
    an `evaluator`")."""
    name = "SentenceTransformerTrainer" if kind == "dense" else "CrossEncoderTrainer"
    with pytest.raises(BertkitError, match=re.escape(
            f"eval_strategy 'steps' needs an eval_dataset or an evaluator: pass {name}(eval_dataset=..., or "
            "evaluator=...), or set eval_strategy='no'")):
        _bertkit_trainer(kind, dirs[kind], tmp_path / "out", eval_strategy="steps", eval_steps=1)
    assert not (tmp_path / "out").exists()


def test_a_streaming_dataset_is_refused_naming_how_to_give_one_with_rows():
    """A stream (load_dataset(..., streaming=True), Dataset.to_iterable_dataset()), which sentence-transformers trains
    on with max_steps, was refused as "a IterableDataset is not supported" without saying how to get rows."""
    datasets = pytest.importorskip("datasets")
    from bertkit.sentence.data import loss_columns

    stream = datasets.Dataset.from_list([{"anchor": "a", "positive": "b"}]).to_iterable_dataset()
    with pytest.raises(BertkitError, match=re.escape(
            "train_dataset is an IterableDataset (a stream: no length, no row by index), which bertkit's sentence "
            "trainers do not read; give a datasets.Dataset (load_dataset without streaming=True, or "
            "Dataset.from_generator over the stream), a list of dicts, or a dict of them")):
        loss_columns(stream, None, "train_dataset")


def _evaluations_by_name(lib: str, path, out) -> list[dict]:
    """evaluate() with an evaluator named "eval" (alone, then under metric_key_prefix="test", then beside an
    eval_dataset) and with one that returns its score alone (sentence-transformers 2's evaluators), the same script
    run with each library: the metrics, values rounded, timings left out."""
    if lib == "sentence_transformers":
        from sentence_transformers.sentence_transformer import evaluation
        from sentence_transformers.sentence_transformer import losses as lib_losses
        S, base = st, evaluation.SentenceEvaluator
    else:
        import bertkit.sentence as S
        from bertkit.sentence import evaluation
        from bertkit.sentence import losses as lib_losses
        base = object  # bertkit's evaluators are callables (SentenceEvaluator is refused, naming this)

    class ScoreAlone(base):
        def __call__(self, model, output_path=None, epoch=-1, steps=-1):
            return 0.25

    model = S.SentenceTransformer(str(path), device="cpu")
    texts = [row["anchor"] for row in PAIRS], [row["positive"] for row in PAIRS]
    named_eval = evaluation.BinaryClassificationEvaluator(*texts, [i % 2 for i in range(8)], name="eval")

    def trainer(evaluator, **data):
        args = S.SentenceTransformerTrainingArguments(output_dir=str(out), **QUIET)
        return S.SentenceTransformerTrainer(model=model, args=args, train_dataset=datasets.Dataset.from_list(PAIRS),
                                            loss=lib_losses.MultipleNegativesRankingLoss(model), evaluator=evaluator,
                                            **data)

    def kept(metrics):
        return {k: round(v, 5) for k, v in metrics.items() if not re.search("runtime|per_second|preparation", k)}

    eval_data = {"eval_dataset": datasets.Dataset.from_list(PAIRS)}
    return [kept(trainer(named_eval).evaluate()), kept(trainer(named_eval).evaluate(metric_key_prefix="test")),
            kept(trainer(named_eval, **eval_data).evaluate()), kept(trainer(ScoreAlone()).evaluate()),
            kept(trainer(ScoreAlone(), **eval_data).evaluate()),
            kept(trainer(named_eval, eval_dataset={"all": datasets.Dataset.from_list(PAIRS),
                                                   "half": datasets.Dataset.from_list(PAIRS[:4])}).evaluate("half"))]


def test_evaluator_metric_names_under_the_prefix_as_sentence_transformers(dirs, tmp_path):
    """Was: with the evaluator alone, evaluate() prefixed every key, so an evaluator named "eval" gave
    eval_eval_cosine_accuracy where sentence-transformers (and bertkit's evaluations with an eval_dataset) give
    eval_cosine_accuracy; an evaluator returning its score alone stopped the evaluation with "'float' object is not
    iterable", where sentence-transformers logs it as eval_evaluator; evaluate("name") of a dict eval_dataset was
    refused as a dataset of one row."""
    theirs = _evaluations_by_name("sentence_transformers", dirs["dense"], tmp_path / "reference")
    ours = _evaluations_by_name("bertkit", dirs["dense"], tmp_path / "out")
    assert ours == theirs, (ours, theirs)
    assert "eval_cosine_accuracy" in ours[0] and "test_eval_cosine_accuracy" in ours[1]
    assert ours[3] == {"eval_evaluator": 0.25, "epoch": 0}
    # evaluate("half"), transformers' name of a dataset of the dict (read as a dataset of one row before): its loss
    assert ours[5]["eval_loss"] != ours[2]["eval_loss"] and "eval_cosine_accuracy" in ours[5]
    model = SentenceTransformer(dirs["dense"])
    trainer = SentenceTransformerTrainer(model=model, args=SentenceTransformerTrainingArguments(str(tmp_path), **QUIET),
                                         train_dataset=PAIRS, eval_dataset={"half": PAIRS[:4]},
                                         loss=losses.MultipleNegativesRankingLoss(model))
    with pytest.raises(BertkitError, match=re.escape("evaluate('all') names an evaluation dataset, and the trainer's "
                                                     "eval_dataset is a dict of ['half']: name one of them")):
        trainer.evaluate("all")
