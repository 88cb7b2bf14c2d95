"""SoftmaxLoss (the SBERT paper's NLI objective) and LabelAccuracyEvaluator against sentence-transformers' on the
same model (MiniLM's first 2 layers, dropout off), the same classifier (drawn from the same seed) and real pairs
(GLUE MRPC dev): the same loss and logits on a batch for each concatenation, the same loss at every training step
(gradient clipping on), the same accuracy and results CSV; bad arguments and labels are refused by name."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import bertkit.sentence as bk
from bertkit.errors import BertkitError, NonFiniteError
from bertkit.sentence import InputExample, SentenceTransformer, evaluation, losses
from sentence_helpers import glue_rows, st_directory

st = pytest.importorskip("sentence_transformers")
st_evaluation = pytest.importorskip("sentence_transformers.sentence_transformer.evaluation")
st_losses = pytest.importorskip("sentence_transformers.sentence_transformer.losses")
datasets = pytest.importorskip("datasets")


@pytest.fixture(scope="module")
def mrpc(data_dir):
    rows = glue_rows(data_dir, "MRPC", n=24)
    return [(r[3], r[4], int(r[0])) for r in rows]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, minilm_2_layers):
    return st_directory(minilm_2_layers, tmp_path_factory.mktemp("st") / "m", dropout=0.0, max_seq_length=32)


def _loss(model, lib, **flags):
    """SoftmaxLoss of one library on ``model``, the classifier drawn from seed 0."""
    torch.manual_seed(0)
    return (st_losses if lib == "st" else losses).SoftmaxLoss(model, model.get_embedding_dimension(), 2, **flags)


def _model(model_dir, lib):
    return (st if lib == "st" else bk).SentenceTransformer(str(model_dir), device="cpu")


@pytest.fixture(scope="module")
def models(model_dir):
    return _model(model_dir, "bk"), _model(model_dir, "st")


@pytest.mark.parametrize("flags", [{}, {"concatenation_sent_multiplication": True},
                                   {"concatenation_sent_rep": False, "concatenation_sent_multiplication": True}])
def test_softmax_loss_equals_sentence_transformers(models, mrpc, flags):
    a, b, labels = (list(c) for c in zip(*mrpc[:8]))
    got_model, want_model = models
    got, want = _loss(got_model, "bk", **flags), _loss(want_model, "st", **flags)
    torch.testing.assert_close(got.classifier.weight, want.classifier.weight, atol=0, rtol=0)
    assert got.get_config_dict() == want.get_config_dict()
    got_value = got([got_model.tokenize(a), got_model.tokenize(b)], torch.tensor(labels))
    want_value = want([want_model.tokenize(a), want_model.tokenize(b)], torch.tensor(labels))
    torch.testing.assert_close(got_value, want_value, atol=0, rtol=1e-5)
    (u, v), got_logits = got([got_model.tokenize(a), got_model.tokenize(b)], None)
    _, want_logits = want([want_model.tokenize(a), want_model.tokenize(b)], None)
    torch.testing.assert_close(got_logits, want_logits, atol=1e-5, rtol=0)
    assert u.shape == v.shape == (8, 384)
    # a row of class probabilities per pair, sentence-transformers' soft labels
    soft = torch.softmax(torch.arange(16.0).reshape(8, 2).sin(), dim=1)
    torch.testing.assert_close(got([got_model.tokenize(a), got_model.tokenize(b)], soft),
                               want([want_model.tokenize(a), want_model.tokenize(b)], soft), atol=0, rtol=1e-5)


def _train(lib, model_dir, out, rows, dev):
    """Three steps of SoftmaxLoss, then LabelAccuracyEvaluator on held-out pairs; ``lib`` picks the import."""
    S = st if lib == "st" else bk
    ev = st_evaluation if lib == "st" else evaluation
    model = _model(model_dir, lib)
    loss = _loss(model, lib)
    steps = []

    class Recorded(type(loss)):
        def forward(self, features, labels):
            value = super().forward(features, labels)
            if labels is not None:  # not the evaluator's calls
                steps.append(value.item())
            return value

    loss.__class__ = Recorded
    args = S.SentenceTransformerTrainingArguments(
        output_dir=str(out), per_device_train_batch_size=4, max_steps=3, learning_rate=1e-3, max_grad_norm=0.05,
        save_strategy="no", report_to="none", seed=42, use_cpu=True, disable_tqdm=True)
    S.SentenceTransformerTrainer(model=model, args=args, train_dataset=datasets.Dataset.from_list(rows),
                                 loss=loss).train()
    loader = DataLoader([S.InputExample(texts=[a, b], label=y) for a, b, y in dev], batch_size=4)
    evaluator = ev.LabelAccuracyEvaluator(loader, name="mrpc", softmax_model=loss)
    metrics = evaluator(model, output_path=str(out / "ev"), epoch=1, steps=3)
    return steps, metrics, evaluator.primary_metric, (out / "ev" / evaluator.csv_file).read_bytes()


def test_training_gives_sentence_transformers_losses_and_accuracy(model_dir, mrpc, tmp_path):
    """Was: bertkit clipped the gradient norm of the model and the classifier together, sentence-transformers the
    model's alone (transformers' Trainer clips the model it is given): with clipping on, every step after the first
    moved other weights (on RTE, the default max_grad_norm=1 at step 5: 0.6843 against 0.6863 at step 6)."""
    rows = [{"sentence1": a, "sentence2": b, "label": y} for a, b, y in mrpc[:12]]
    want = _train("st", model_dir, tmp_path / "st", rows, mrpc[12:])
    got = _train("bk", model_dir, tmp_path / "bk", rows, mrpc[12:])
    assert len(got[0]) == len(want[0]) == 3
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=0)
    assert got[1:3] == want[1:3] and want[2] == "mrpc_accuracy"
    assert got[3] == want[3] and want[3].startswith(b"epoch,steps,accuracy\r\n1,3,")


def test_bad_softmax_arguments_and_labels_are_refused(models, tmp_path):
    model = models[0]
    with pytest.raises(BertkitError, match=r"embedding_dimension 768 is not the width of the model's embeddings, 384"):
        losses.SoftmaxLoss(model, 768, 3)  # sentence-transformers fails at the first step inside the product
    with pytest.raises(BertkitError, match=r"num_labels must be a whole number >= 2 .*, got 1"):
        losses.SoftmaxLoss(model, 384, 1)  # a constant 0 loss with cross-entropy
    with pytest.raises(BertkitError, match="concatenation_sent_rep='False'; each concatenation flag is True or False"):
        losses.SoftmaxLoss(model, 384, 3, concatenation_sent_rep="False")  # truthy there
    with pytest.raises(BertkitError, match="all False, leaving the classifier no input"):
        losses.SoftmaxLoss(model, 384, 3, concatenation_sent_rep=False, concatenation_sent_difference=False)
    loss = losses.SoftmaxLoss(model, sentence_embedding_dimension=384, num_labels=3)  # the name before 6
    # its classifier takes the whole width: a bare NotImplementedError here, a shape error inside torch there
    with pytest.raises(BertkitError, match="MatryoshkaLoss cannot wrap SoftmaxLoss, which does not score cut"):
        losses.MatryoshkaLoss(model, loss, [384, 64])
    assert loss.classifier.in_features == 3 * 384
    features = [model.tokenize(["a", "b"]), model.tokenize(["c", "d"])]
    with pytest.raises(BertkitError, match=r"label 3 is not a class of num_labels=3 \(0 to 2\)"):
        loss(features, torch.tensor([0, 3]))
    # refused when the trainer is made, before any step: sentence-transformers stops inside torch at the first
    for label, message in ((1.0, r"row 2 has the label 1.0; .*cast the column to integers"),
                           ("entailment", r"row 2 has the label 'entailment'; .*map the dataset's labels"),
                           (3, r"row 2 has the label 3; SoftmaxLoss\(num_labels=3\) takes a class index, an int from 0 to 2")):
        rows = [{"a": "x", "b": "y", "label": 0}, {"a": "z", "b": "w", "label": 2}, {"a": "x", "b": "w", "label": label}]
        args = bk.SentenceTransformerTrainingArguments(output_dir=str(tmp_path), report_to="none", use_cpu=True,
                                                       max_steps=1)
        with pytest.raises(BertkitError, match=f"train_dataset: {message}"):
            bk.SentenceTransformerTrainer(model=model, args=args, train_dataset=rows, loss=loss)


def test_bad_label_accuracy_input_is_refused(models, model_dir):
    model = models[0]
    loss = losses.SoftmaxLoss(model, 384, 2)
    examples = [InputExample(texts=["a", "b"], label=1), InputExample(texts=["c", "d"], label=2)]
    with pytest.raises(BertkitError, match="softmax_model is NoneType; give the losses.SoftmaxLoss"):
        evaluation.LabelAccuracyEvaluator(DataLoader(examples), softmax_model=None)
    with pytest.raises(BertkitError, match="takes a torch DataLoader of InputExample pairs, got list"):
        evaluation.LabelAccuracyEvaluator(examples, softmax_model=loss)
    # a class the classifier lacks is never its argmax: sentence-transformers counts it wrong without a word
    with pytest.raises(BertkitError, match=r"example 1 has the label 2, not a class of the classifier \(2 labels"):
        evaluation.LabelAccuracyEvaluator(DataLoader(examples, batch_size=2), softmax_model=loss)(model)
    other = SentenceTransformer(model_dir)
    evaluator = evaluation.LabelAccuracyEvaluator(DataLoader(examples[:1]), softmax_model=loss)
    with pytest.raises(BertkitError, match="softmax_model was built on another model than the one evaluated"):
        evaluator(other)
    # the trainer checks metric_for_best_model on a deep copy, which copied the model inside the loss and was refused
    copied = copy.deepcopy(evaluator)
    assert copied.softmax_model is loss and copied(model) == evaluator(model)
    # a NaN logit was argmax's class 0, counted right for a label 0 (accuracy 0.5 here, as sentence-transformers)
    pairs = [InputExample(texts=["a", "b"], label=1), InputExample(texts=["c", "d"], label=0)]
    with torch.no_grad():
        loss.classifier.weight[:, :1] = float("nan")
    with pytest.raises(NonFiniteError, match=r"^LabelAccuracyEvaluator \(the batch from example 0\): the model's "
                                             r"output of input 0 \(\"\('a', 'b'\)\"\) is not finite"):
        evaluation.LabelAccuracyEvaluator(DataLoader(pairs, batch_size=2), softmax_model=loss)(model)


def test_a_loss_factory_draws_its_classifier_from_the_trainers_seed(models, mrpc, tmp_path):
    """A loss given as a factory (``functools.partial(SoftmaxLoss, ...)``) is built by sentence-transformers' trainer
    after transformers' Trainer.__init__ seeds, so its classifier comes from ``seed`` whatever the script drew
    before; bertkit built it before seeding, from the script's generator state (another classifier, so other losses:
    1.0952 against 1.1162 at the first step on MiniLM)."""
    import functools

    rows = [{"sentence1": a, "sentence2": b, "label": y} for a, b, y in mrpc[:8]]
    got_model, want_model = models
    built = []
    for lib, model in (("st", want_model), ("bk", got_model)):
        S = st if lib == "st" else bk
        args = S.SentenceTransformerTrainingArguments(output_dir=str(tmp_path / lib), save_strategy="no",
                                                      report_to="none", seed=3, use_cpu=True, disable_tqdm=True)
        torch.manual_seed(100 if lib == "st" else 200)  # the scripts' generators differ: the seed decides
        factory = functools.partial((st_losses if lib == "st" else losses).SoftmaxLoss,
                                    sentence_embedding_dimension=model.get_embedding_dimension(), num_labels=2)
        trainer = S.SentenceTransformerTrainer(model=model, args=args, loss=factory,
                                               train_dataset=datasets.Dataset.from_list(rows))
        built.append((trainer.loss.classifier.weight.detach().clone(), torch.rand(4)))
    (want, want_next), (got, got_next) = built
    torch.testing.assert_close(got, want, atol=0, rtol=0)
    torch.testing.assert_close(got_next, want_next, atol=0, rtol=0)  # and torch's generator goes on alike
