"""bertkit.sentence.cross_encoder against sentence-transformers' CrossEncoder on the same checkpoint (MiniLM's first
2 layers with a seeded classifier: what is compared is the code, not MiniLM's numbers): the same scores from predict and rank, a saved directory that sentence-transformers opens with
the same scores, the same loss values and gradients on the same SQuAD pairs (predict, rank, several labels and the losses on a
tiny random encoder with MiniLM's tokenizer: their code sees only the scores, and MiniLM's 384-wide layers were
most of their time), the same reranking metrics on fixed scores (ties
included); and the refusals of what bertkit does not implement."""

from __future__ import annotations

import logging
import re
import shutil

import numpy as np
import pytest
import torch

from cases import slow_after
from cross_encoder_helpers import cross_encoder_directory, squad_rerank

st_ce = pytest.importorskip("sentence_transformers.cross_encoder")
st_losses = pytest.importorskip("sentence_transformers.cross_encoder.losses")
st_evaluation = pytest.importorskip("sentence_transformers.cross_encoder.evaluation")
st_sequential = pytest.importorskip("sentence_transformers.evaluation")

from bertkit.errors import BertkitError  # noqa: E402
from bertkit.sentence import evaluation as sentence_evaluation  # noqa: E402
from bertkit.sentence.cross_encoder import CrossEncoder, evaluation, losses  # noqa: E402

LONG = "Paris is the capital and most populous city of France, on the Seine. " * 12


@pytest.fixture(scope="module")
def directory(minilm_2_layers, tmp_path_factory):
    return cross_encoder_directory(minilm_2_layers, tmp_path_factory.mktemp("ce"))


@pytest.fixture(scope="module")
def tiny_directory(minilm_2_layers, tiny_checkpoint, tmp_path_factory):
    """A one-label cross-encoder as ``directory`` (seeded, dropout 0, MiniLM's tokenizer files, 512 positions) on a
    tiny random encoder, for predict, rank and the losses. Drawn at the default 0.02 its scores of the SQuAD pairs
    were all 0.0011 within 1e-5, ties at float rounding for rank and the ranking losses; drawn at 0.5 they spread
    with a standard deviation of about 1, no two of 30 closer than 2e-4."""
    return _tiny_cross_encoder(tiny_checkpoint, minilm_2_layers, tmp_path_factory.mktemp("ce-tiny") / "ce")


def _tiny_cross_encoder(tiny_checkpoint, minilm_2_layers, out, labels: int = 1):
    return tiny_checkpoint(out, "BertForSequenceClassification", tokenizer=minilm_2_layers, labels=labels,
                           hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, initializer_range=0.5,
                           max_position_embeddings=512)


@pytest.fixture(scope="module")
def rows(data_dir):
    return squad_rerank(data_dir, 2, 6)


def _pairs(rows):
    return [(r["query"], d) for r in rows for d in [r["positive"], *r["negatives"][:2]]] + [("Where is Paris?", LONG)]


def test_predict_and_rank_give_sentence_transformers_scores(tiny_directory, rows, tmp_path):
    pairs = _pairs(rows)
    for max_length in (None, 32):
        want_model = st_ce.CrossEncoder(str(tiny_directory), max_length=max_length)
        got_model = CrossEncoder(tiny_directory, max_length=max_length)
        want, got = want_model.predict(pairs, batch_size=4), got_model.predict(pairs, batch_size=4)
        assert got.shape == want.shape == (len(pairs),) and got.dtype == np.float32
        np.testing.assert_allclose(got, want, atol=2e-6, rtol=1e-5)  # a score of 0.57 is 2.7e-6 apart
        raw = got_model.predict(pairs, activation_fn=torch.nn.Identity(), convert_to_tensor=True)
        torch.testing.assert_close(raw, want_model.predict(pairs, activation_fn=torch.nn.Identity(),
                                                           convert_to_tensor=True), atol=2e-5, rtol=0)
    assert got_model.predict(pairs[0]) == pytest.approx(float(got[0]), abs=1e-6)  # one pair: one score
    # numpy scores are float32 whatever dtype the activation gives, as there (these were float64 and int64)
    for activation in (lambda x: x.double(), lambda x: (x > 0).long()):
        st_scores, scores = (m.predict(pairs, activation_fn=activation) for m in (want_model, got_model))
        assert scores.dtype == st_scores.dtype == np.float32
        np.testing.assert_allclose(scores, st_scores, atol=2e-6, rtol=1e-5)
    np.testing.assert_allclose(got_model.predict(np.array(pairs), batch_size=4), want, atol=2e-6, rtol=1e-5)  # (N, 2)
    with pytest.raises(BertkitError, match="got a set: pass a list"):  # no order to give the scores back in
        got_model.predict(set(pairs))
    query, docs = rows[0]["query"], [rows[0]["positive"], *rows[0]["negatives"]]
    want = want_model.rank(query, docs, top_k=3, return_documents=True)
    got = got_model.rank(query, docs, top_k=3, return_documents=True)
    assert [(g["corpus_id"], g["text"]) for g in got] == [(w["corpus_id"], w["text"]) for w in want]
    assert [g["score"] for g in got] == pytest.approx([w["score"] for w in want], abs=2e-6)
    # sentence-transformers 6 takes rank's apply_softmax and ignores it (deprecated): a script passing it ran here too
    assert got_model.rank(query, docs, top_k=3, return_documents=True, apply_softmax=True) == got
    # documents from a generator are ranked as the list (they were read by the check, and none were left to score)
    from_generator = got_model.rank(query, (d for d in docs), top_k=3, return_documents=True)
    assert [(g["corpus_id"], g["text"]) for g in from_generator] == [(w["corpus_id"], w["text"]) for w in want]
    assert [g["score"] for g in from_generator] == pytest.approx([w["score"] for w in want], abs=2e-6)
    for wrong in (docs[0], dict.fromkeys(docs), set(docs)):  # ranked as characters or keys; a set has no order
        with pytest.raises(BertkitError, match=f"rank\\(\\) takes the documents as a list of strings, got a "
                                               f"{type(wrong).__name__}"):
            got_model.rank(query, wrong)

    # saved by bertkit: sentence-transformers opens it (max_length and activation included), and so does bertkit
    got_model.save(tmp_path / "saved")
    again = st_ce.CrossEncoder(str(tmp_path / "saved"))
    assert again.max_seq_length == 32 and isinstance(again.activation_fn, torch.nn.Sigmoid)
    np.testing.assert_allclose(again.predict(pairs), got_model.predict(pairs), atol=2e-6, rtol=0)
    assert CrossEncoder(tmp_path / "saved").max_length == 32


def test_pairs_are_batched_as_sentence_transformers_batches_them(directory):
    """Pairs are run longest first, as in sentence-transformers, which sorts the lengths with np.argsort's default
    sort: not stable past 16 inputs. bertkit sorted stably, so past 16 pairs of one length its batches held other
    pairs, and a pair's score moved by a float32 step with the batch it was padded in: copies of a document ranked in
    another order than there (with MiniLM's first 2 layers and a classifier 50 times larger, 8 random draws of 40
    same-length documents out of 8)."""
    rng = np.random.default_rng(0)
    same_length = ["Denver won the game.", "Carolina lost it...", "The Broncos played.", "Santa Clara hosted."]
    documents = [same_length[i] for i in rng.integers(0, 4, 40)] + [LONG[:60]] * 3
    batches = {}
    for name, model in (("want", st_ce.CrossEncoder(str(directory), max_length=48)),
                        ("got", CrossEncoder(directory, max_length=48))):
        seen, preprocess = batches.setdefault(name, []), model.preprocess
        model.preprocess = lambda pairs, *args, seen=seen, preprocess=preprocess, **kwargs: (
            seen.append([tuple(p) for p in pairs]) or preprocess(pairs, *args, **kwargs))
        model.rank("Who won Super Bowl 50?", documents, batch_size=8)
    assert batches["got"] == batches["want"]


def test_module_0_scores_the_pairs_as_sentence_transformers_transformer(directory, rows):
    """``model[0](features)`` was refused; sentence-transformers' cross-encoder Transformer adds ``scores`` (the
    logits) and, where the config sets ``output_hidden_states``, ``all_layer_embeddings``. Now the same: the model's
    own scores exactly, sentence-transformers' within 1e-5, the dict returned updated in place with the keys added
    there. ``model(features)`` (a new dict before, leaving the caller's without ``scores``) updates it in place too."""
    ours, ref = CrossEncoder(directory), st_ce.CrossEncoder(str(directory), device="cpu")
    pairs = _pairs(rows)[:4]
    with torch.no_grad():
        features, want = ours.preprocess(pairs), ref.preprocess(pairs)
        given, given_ref = set(features), set(want)
        got, expected = ours[0](features), ref[0](want)
        assert got is features and set(got) - given == set(expected) - given_ref == {"scores"}
        whole = ours.preprocess(pairs)
        assert ours(whole) is whole and set(whole) == set(got)
        torch.testing.assert_close(got["scores"], whole["scores"], atol=0, rtol=0)
        torch.testing.assert_close(got["scores"], expected["scores"], atol=1e-5, rtol=0)
        assert ours.transformers_model is ours.model and type(ref.transformers_model).__name__ == \
            type(ours.transformers_model).__name__ == "BertForSequenceClassification"  # an AttributeError before
        for model in (ours, ref):
            model[0].auto_model.config.output_hidden_states = True
        got, expected = ours[0](ours.preprocess(pairs)), ref[0](ref.preprocess(pairs))
    real = want["attention_mask"].bool()
    assert len(got["all_layer_embeddings"]) == len(expected["all_layer_embeddings"]) == 3  # embeddings + 2 layers
    for layer, reference in zip(got["all_layer_embeddings"], expected["all_layer_embeddings"], strict=True):
        torch.testing.assert_close(layer[real], reference[real], atol=1e-5, rtol=0)


def test_several_labels_predict_softmax_as_sentence_transformers(minilm_2_layers, tiny_checkpoint, tmp_path, rows):
    d = _tiny_cross_encoder(tiny_checkpoint, minilm_2_layers, tmp_path / "three", labels=3)
    pairs = _pairs(rows)[:5]
    want_model, got_model = st_ce.CrossEncoder(str(d)), CrossEncoder(d)
    for kwargs in ({}, {"apply_softmax": True}):
        want, got = want_model.predict(pairs, **kwargs), got_model.predict(pairs, **kwargs)
        assert got.shape == want.shape == (5, 3)
        np.testing.assert_allclose(got, want, atol=2e-5, rtol=0)
    with pytest.raises(BertkitError, match="one-label"):
        got_model.rank("q", ["a", "b"])
    with pytest.raises(BertkitError, match="1 output label"):
        losses.BinaryCrossEntropyLoss(got_model)
    # num_labels other than the directory's classifier's: refused, as there, but naming what CrossEncoder can do (the
    # loader's advice, ignore_mismatched_sizes=True, is no argument of it); the directory's own count loads it
    with pytest.raises(RuntimeError, match="ignore_mismatched_sizes"):
        st_ce.CrossEncoder(str(d), num_labels=1)
    with pytest.raises(BertkitError, match=re.escape(
            f"{d} holds a classifier of 3 label(s), and num_labels=1 asks for another: leave num_labels out to load "
            "it, or load the checkpoint it was fine-tuned from with num_labels=1 for a new classifier")):
        CrossEncoder(d, num_labels=1)
    np.testing.assert_array_equal(CrossEncoder(d, num_labels=3).predict(pairs), got_model.predict(pairs))


@pytest.mark.parametrize(("pooler", "num_labels"), [(True, None), (True, 3), (False, None)])
def test_a_new_classifier_is_drawn_as_sentence_transformers_draws_it(minilm_2_layers, tmp_path, pooler, num_labels):
    """A BERT checkpoint given to CrossEncoder gets a new classifier (and pooler, where it has none): for the same seed,
    sentence-transformers' weights (drawn through transformers, as bertkit's heads draw them: CrossEncoder loads with
    the plain from_pretrained) and torch's generator left where it leaves it."""
    from safetensors.torch import load_file, save_file

    checkpoint = minilm_2_layers
    if not pooler:
        checkpoint = tmp_path / "no-pooler"
        shutil.copytree(minilm_2_layers, checkpoint)
        weights = {k: v for k, v in load_file(checkpoint / "model.safetensors").items() if "pooler" not in k}
        save_file(weights, checkpoint / "model.safetensors", metadata={"format": "pt"})
    kwargs = {} if num_labels is None else {"num_labels": num_labels}
    torch.manual_seed(0)
    want = st_ce.CrossEncoder(str(checkpoint), **kwargs)
    want_next = torch.rand(4)
    torch.manual_seed(0)
    got = CrossEncoder(checkpoint, **kwargs)
    torch.testing.assert_close(torch.rand(4), want_next, rtol=0, atol=0)
    want_weights = want.model.state_dict()
    assert sorted(got.model.state_dict()) == sorted(want_weights)
    for name, value in got.model.state_dict().items():
        torch.testing.assert_close(value, want_weights[name], rtol=0, atol=0, msg=name)
    pairs = [("Where is Paris?", "Paris is in France."), ("Who won?", "The Broncos won the Super Bowl.")]
    np.testing.assert_allclose(got.predict(pairs), want.predict(pairs), atol=1e-6, rtol=0)


def _both(directory):
    """The same checkpoint in both libraries, in training mode (dropout is 0)."""
    a, b = st_ce.CrossEncoder(str(directory), max_length=64), CrossEncoder(directory, max_length=64)
    a.train(), b.train()
    return a, b


def test_losses_equal_sentence_transformers_on_the_same_pairs(tiny_directory, rows):
    # 4 of the 6 rows: still 2, 3 and 4 documents a row, a short last mini-batch (PListMLE's 3) and 3 in-batch
    # negatives a query; MultipleNegativesRankingLoss scores every query against every document (quadratic in rows)
    rows = rows[:4]
    want_model, got_model = _both(tiny_directory)
    queries = [r["query"] for r in rows]
    positives = [r["positive"] for r in rows]
    hard = [r["negatives"][0] for r in rows]
    # (name, sentence-transformers' loss, bertkit's, inputs, labels)
    pairs = [queries + queries, positives + hard]
    bce_labels = torch.tensor([1.0] * len(rows) + [0.0] * len(rows))
    docs = [[r["positive"], *r["negatives"][:1 + i % 3]] for i, r in enumerate(rows)]  # 2-4 documents a row
    graded = [torch.tensor([1.0, *[0.5 / (j + 1) for j in range(len(d) - 1)]]) for d in docs]
    cases = [
        ("bce", {}, [pairs, bce_labels]),
        ("bce", {"pos_weight": torch.tensor(2.0)}, [pairs, bce_labels]),
        # torch's keyword arguments, which sentence-transformers passes on (bertkit refused them)
        ("bce", {"reduction": "sum", "weight": torch.linspace(0.5, 2.0, 2 * len(rows))}, [pairs, bce_labels]),
        ("mnrl", {"num_negatives": None}, [[queries, positives], None]),
        ("mnrl", {"num_negatives": None, "scale": 5.0}, [[queries, positives, hard], None]),
        ("listnet", {}, [[queries, docs], graded]),
        ("lambda", {}, [[queries, docs], graded]),
        ("lambda", {"k": 2, "reduction_log": "natural"}, [[queries, docs], graded]),
    ]
    for scheme in ("NoWeightingScheme", "NDCGLoss1Scheme", "NDCGLoss2Scheme", "LambdaRankScheme", None):
        cases.append(("lambda", {"weighting_scheme": scheme}, [[queries, docs], graded]))  # None: no weighting
    # a teacher's numbers to distil: a score per pair (MSE), margins or scores per row (MarginMSE)
    teacher = torch.linspace(-3.0, 5.0, 2 * len(rows))
    second = [r["negatives"][1] for r in rows]
    margins = torch.stack([teacher[:len(rows)], teacher[len(rows):]], 1)  # (B, 2): one per negative column
    scores = torch.cat([teacher[:len(rows), None] + 1, margins], 1)  # (B, 3): positive first
    tied = [torch.tensor([1.0, *[0.0] * (len(d) - 2), 1.0]) for d in docs]  # ties: ranks averaged / label order
    cases += [
        ("mse", {}, [pairs, teacher]),
        ("mse", {"activation_fn": torch.nn.Sigmoid()}, [pairs, bce_labels]),
        ("margin", {}, [[queries, positives, hard], teacher[:len(rows)]]),
        ("margin", {}, [[queries, positives, hard, second], margins]),
        ("margin", {}, [[queries, positives, hard, second], scores]),
        ("ranknet", {"k": 2}, [[queries, docs], graded]),
        ("plistmle", {}, [[queries, docs], graded]),
        ("plistmle", {"respect_input_order": False, "mini_batch_size": 3}, [[queries, docs], tied]),
        ("listmle", {"activation_fn": torch.nn.Sigmoid()}, [[queries, docs], graded]),
        ("adrmse", {}, [[queries, docs], graded]),
        ("adrmse", {"alpha": 3.0}, [[queries, docs], tied]),
    ]
    names = {"bce": "BinaryCrossEntropyLoss", "mnrl": "MultipleNegativesRankingLoss", "listnet": "ListNetLoss",
             "lambda": "LambdaLoss", "mse": "MSELoss", "margin": "MarginMSELoss", "ranknet": "RankNetLoss",
             "plistmle": "PListMLELoss", "listmle": "ListMLELoss", "adrmse": "ADRMSELoss"}
    for name, kwargs, (inputs, labels) in cases:
        def build(module, model, name=name, kwargs=kwargs):
            args = {k: getattr(module, v)() if k == "weighting_scheme" and v else v for k, v in kwargs.items()}
            return getattr(module, names[name])(model, **args)

        want = build(st_losses, want_model)(inputs, labels)
        got = build(losses, got_model)(inputs, labels)
        assert got.item() == pytest.approx(want.item(), rel=1e-5), (name, kwargs)


def test_cross_entropy_trains_a_model_with_several_labels_as_sentence_transformers(minilm_2_layers, tiny_checkpoint,
                                                                                   tmp_path, rows):
    """The default loss of a three-label model (an NLI-style classifier of pairs) is CrossEntropyLoss, with class
    indices as labels and torch's keyword arguments; a label that is no class is refused naming the classes."""
    from bertkit.sentence.cross_encoder import CrossEncoderTrainer, CrossEncoderTrainingArguments

    d = _tiny_cross_encoder(tiny_checkpoint, minilm_2_layers, tmp_path / "three", labels=3)
    (want_model, got_model) = _both(d)
    pairs = [[r["query"] for r in rows] * 2, [r["positive"] for r in rows] + [r["negatives"][0] for r in rows]]
    labels = torch.arange(len(pairs[0])) % 3
    for kwargs in ({}, {"label_smoothing": 0.1, "weight": torch.tensor([1.0, 2.0, 0.5])}):
        want = st_losses.CrossEntropyLoss(want_model, **kwargs)(pairs, labels)
        got = losses.CrossEntropyLoss(got_model, **kwargs)(pairs, labels)
        assert got.item() == pytest.approx(want.item(), rel=1e-5), kwargs
    with pytest.raises(BertkitError, match=r"label 3 is not a class of this model, whose 3 labels are 0 to 2"):
        losses.CrossEntropyLoss(got_model)(pairs, labels + 1)
    trainer = CrossEncoderTrainer(model=got_model, args=CrossEncoderTrainingArguments(output_dir=str(tmp_path / "run")),
                                  train_dataset=[{"q": "a", "d": "b", "label": 2}])
    assert type(trainer.loss) is losses.CrossEntropyLoss  # sentence-transformers' default for several labels


@pytest.mark.parametrize("kwargs,columns", slow_after([({"mini_batch_size": 5}, 3),
                                                       ({"mini_batch_size": 4, "num_negatives": None, "scale": 5.0}, 2)]))
def test_cached_mnrl_gives_sentence_transformers_and_the_uncached_values_and_gradients(tiny_directory, rows, kwargs,
                                                                                        columns):
    """CachedMultipleNegativesRankingLoss (refused as not implemented): the pairs scored in mini-batches smaller
    than the step's give sentence-transformers' value and gradients, and the uncached loss's, its in-batch negatives
    drawn from the same random state."""
    want_model, got_model = _both(tiny_directory)
    inputs = [[r["query"] for r in rows], [r["positive"] for r in rows], [r["negatives"][0] for r in rows]][:columns]

    def run(model, loss):
        model.zero_grad(set_to_none=True)
        torch.manual_seed(3)
        value = loss(inputs, None)
        value.backward()
        grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
        model.zero_grad(set_to_none=True)
        return value.detach(), grads

    got, got_grad = run(got_model, losses.CachedMultipleNegativesRankingLoss(got_model, **kwargs))
    want, want_grad = run(want_model, st_losses.CachedMultipleNegativesRankingLoss(want_model, **kwargs))
    plain = {k: v for k, v in kwargs.items() if k != "mini_batch_size"}
    uncached, uncached_grad = run(got_model, losses.MultipleNegativesRankingLoss(got_model, **plain))
    # the uncached loss sums the gradient in another order: on the second case (a gradient of norm 0.0012, mostly
    # cancelled), sentence-transformers' own cached and uncached gradients are 2.1e-4 of it apart
    for value, grad, within in ((want, want_grad, 2e-5), (uncached, uncached_grad, 5e-4)):
        torch.testing.assert_close(got, value, atol=1e-5, rtol=1e-5)
        assert (got_grad - grad).norm() <= within * grad.norm()
    with torch.no_grad():
        torch.manual_seed(3)
        torch.testing.assert_close(losses.CachedMultipleNegativesRankingLoss(got_model, **kwargs)(inputs), want,
                                   atol=1e-5, rtol=1e-5)
    assert losses.CachedMultipleNegativesRankingLoss(got_model, **kwargs).get_config_dict() == \
        st_losses.CachedMultipleNegativesRankingLoss(want_model, **kwargs).get_config_dict()
    with pytest.raises(BertkitError, match="CachedMultipleNegativesRankingLoss: mini_batch_size must be a whole number "
                                           ">= 1, got 0"):
        losses.CachedMultipleNegativesRankingLoss(got_model, mini_batch_size=0)


def test_mnrl_draws_its_in_batch_negatives_as_sentence_transformers(tiny_directory, rows):
    """num_negatives below the batch's candidates: both draw them with torch.multinomial from the global RNG."""
    want_model, got_model = _both(tiny_directory)
    inputs = [[r["query"] for r in rows], [r["positive"] for r in rows]]
    torch.manual_seed(3)
    want = st_losses.MultipleNegativesRankingLoss(want_model, num_negatives=2)(inputs, None)
    torch.manual_seed(3)
    got = losses.MultipleNegativesRankingLoss(got_model, num_negatives=2)(inputs, None)
    assert got.item() == pytest.approx(want.item(), rel=1e-5)


def test_mnrl_on_a_batch_of_one_row_is_sentence_transformers_zero(tiny_directory):
    """A dataset's last batch of 1 row (3 rows in batches of 2), without hard negatives, has its positive alone: 0
    with zero gradients in sentence-transformers, whose trainer steps on through it; bertkit refused it with "needs
    negatives", ending the training at that step. Now sentence-transformers' value; a hard-negative column still
    scores."""
    want_model, got_model = _both(tiny_directory)
    for name in ("MultipleNegativesRankingLoss", "CachedMultipleNegativesRankingLoss"):
        for inputs in ([["Who wrote Hamlet?"], ["Shakespeare wrote it."]],
                       [["Who wrote Hamlet?"], ["Shakespeare wrote it."], ["Paris is in France."]]):
            want = getattr(st_losses, name)(want_model)(inputs, None)
            got_model.zero_grad()
            got = getattr(losses, name)(got_model)(inputs, None)
            got.backward()
            assert got.item() == pytest.approx(want.item(), rel=1e-5, abs=1e-7), (name, len(inputs))
            if len(inputs) == 2:
                assert want.item() == got.item() == 0.0
                assert all(p.grad is None or not p.grad.any() for p in got_model.parameters())
            else:
                assert got.item() > 0.01


class _Table:
    """A cross-encoder whose predict returns fixed scores (by pair), for comparing the evaluators alone."""

    def __init__(self, table):
        self.table = table
        self.model_card_data = self

    def set_evaluation_metrics(self, *_):
        pass

    def predict(self, pairs, **_):
        return np.array([self.table[tuple(p)] for p in pairs], dtype=np.float32)


def test_reranking_evaluator_gives_sentence_transformers_metrics():
    g = torch.Generator().manual_seed(0)
    samples, table = [], {}
    for i in range(12):
        docs = [f"d{i}-{j}" for j in range(3 + i % 5)]
        for d in docs:
            table[(f"q{i}", d)] = float(torch.randint(0, 4, (), generator=g)) if i % 2 else float(torch.rand((), generator=g))
        positive = docs[: 1 + i % 2]
        if i % 3 == 0:  # a first-stage ranking to rerank, which may miss a positive (base_* metrics)
            samples.append({"query": f"q{i}", "positive": positive, "documents": docs[i % 2:][::-1]})
        else:
            samples.append({"query": f"q{i}", "positive": positive, "negative": docs[len(positive):]})
    # nothing relevant: sentence-transformers averages in 0 for its undefined metrics (map 0.4957 of the 13 samples
    # where the 12 give 0.5370); refused, naming the sample
    nothing = {"query": "none", "positive": [], "negative": ["x"]}
    with pytest.raises(BertkitError, match=r"^CrossEncoderRerankingEvaluator: sample 12's 'positive' is empty, so its "
                                           r"MAP, MRR and nDCG are undefined"):
        evaluation.CrossEncoderRerankingEvaluator([*samples, nothing])
    for kwargs in ({"at_k": 10}, {"at_k": 2, "name": "squad"}, {"at_k": 3, "always_rerank_positives": False}):
        want_evaluator = st_evaluation.CrossEncoderRerankingEvaluator(samples, write_csv=False, **kwargs)
        got_evaluator = evaluation.CrossEncoderRerankingEvaluator(samples, write_csv=False, **kwargs)
        want, got = want_evaluator(_Table(table)), got_evaluator(_Table(table))
        assert got.keys() == want.keys()
        np.testing.assert_allclose([got[k] for k in want], [float(v) for v in want.values()], atol=1e-12)
        assert got_evaluator.primary_metric == want_evaluator.primary_metric  # "squad_ndcg@2" when named
    # a named one in a SequentialEvaluator: its primary metric is among its (prefixed) results
    want = st_sequential.SequentialEvaluator(
        [st_evaluation.CrossEncoderRerankingEvaluator(samples, name=n, write_csv=False) for n in ("a", "b")])
    got = sentence_evaluation.SequentialEvaluator(
        [evaluation.CrossEncoderRerankingEvaluator(samples, name=n, write_csv=False) for n in ("a", "b")])
    assert got(_Table(table))["sequential_score"] == pytest.approx(want(_Table(table))["sequential_score"], abs=1e-12)


@pytest.mark.parametrize("sample", [
    {"query": "q", "positive": ["a man plays"], "negative": "a dog runs"},  # ranked as its 10 characters: map 0.1
    {"query": "q", "positive": ["a man plays"], "documents": "a man plays"},
    {"query": "q", "positive": {"a man plays"}, "negative": ["a dog runs"]},
    {"query": "q", "positive": ["a man plays"], "negative": ["a dog runs", None]},
])
def test_reranking_evaluator_refuses_a_text_where_a_list_of_texts_goes(sample):
    key = next(k for k in ("negative", "documents", "positive") if k in sample and not (
        isinstance(sample[k], list) and all(isinstance(t, str) for t in sample[k])))
    with pytest.raises(BertkitError, match=f"sample 0's '{key}' is {type(sample[key]).__name__} .*give a list of texts"):
        evaluation.CrossEncoderRerankingEvaluator([sample])
    # one positive text is one positive, in both libraries
    one = {"query": "q", "positive": "a man plays", "negative": ["a dog runs", "a cat"]}
    table = {("q", "a man plays"): 0.5, ("q", "a dog runs"): 0.7, ("q", "a cat"): 0.1}
    want = st_evaluation.CrossEncoderRerankingEvaluator([one], write_csv=False)(_Table(table))
    assert evaluation.CrossEncoderRerankingEvaluator([one], write_csv=False)(_Table(table)) == pytest.approx(
        {k: float(v) for k, v in want.items()}, abs=1e-12)


def test_reranking_evaluator_takes_at_k_none_and_the_rankings_sentence_transformers_6_3_scores():
    """at_k=None (the whole ranking) gives sentence-transformers 6.3's numbers at an at_k beyond every ranking: 6.3
    itself fails on it (min(positives, None) in its ideal DCG; 6.2 took it), so bertkit keeps it (docs/sentence.md).
    What 6.3 scores and bertkit refused after 6.2 failed on it: a ranking of one document (nDCG 1 for a found
    positive), empty first-stage documents (base metrics 0; the positives still reranked). A positive the first stage
    missed now counts against it (base nDCG 0.6131, MAP 0.5 where the missed positive was appended as found: 1.0)."""
    samples = [{"query": "q", "positive": ["p1", "p2"], "negative": ["n1", "n2", "n3"]},
               {"query": "r", "positive": ["p"], "documents": ["a", "p", "b", "c"]},
               {"query": "s", "positive": ["x", "p"], "documents": ["p", "a"]}]
    table = {("q", "p1"): 0.3, ("q", "p2"): 0.2, ("q", "n1"): 0.1, ("q", "n2"): 0.9, ("q", "n3"): 0.4,
             ("r", "p"): 0.05, ("r", "a"): 0.5, ("r", "b"): 0.6, ("r", "c"): 0.01, ("s", "x"): 0.7, ("s", "p"): 0.2,
             ("s", "a"): 0.3, ("t", "p"): 1.0}
    want = st_evaluation.CrossEncoderRerankingEvaluator(samples, at_k=100, write_csv=False)(_Table(table))
    got = evaluation.CrossEncoderRerankingEvaluator(samples, at_k=None, write_csv=False)(_Table(table))
    assert list(got) == [k.replace("@100", "@None") for k in want]
    np.testing.assert_allclose(list(got.values()), [float(v) for v in want.values()], atol=1e-12)
    assert got["ndcg@None"] == pytest.approx(0.663454169367836, abs=1e-12)
    with pytest.raises(TypeError):
        st_evaluation.CrossEncoderRerankingEvaluator(samples, at_k=None, write_csv=False)(_Table(table))
    for sample, kwargs in (({"query": "t", "positive": ["p"], "negative": []}, {}),
                           ({"query": "t", "positive": "p", "documents": ["p"]}, {}),
                           ({"query": "t", "positive": ["p"], "documents": ["p"]}, {"always_rerank_positives": False}),
                           ({"query": "t", "positive": ["p"], "documents": []}, {}),
                           ({"query": "t", "positive": ["p"], "documents": []}, {"always_rerank_positives": False})):
        want = st_evaluation.CrossEncoderRerankingEvaluator([sample], write_csv=False, **kwargs)(_Table(table))
        got = evaluation.CrossEncoderRerankingEvaluator([sample], write_csv=False, **kwargs)(_Table(table))
        assert got == pytest.approx({k: float(v) for k, v in want.items()}, abs=1e-12), (sample, kwargs)
    for sample, kwargs, message in (
            (samples[0], {"at_k": 0}, "at_k must be a whole number >= 1 (or None: the whole ranking), got 0"),
            (samples[0], {"mrr_at_k": -1}, "mrr_at_k must be a whole number >= 1 (or None: the whole ranking), got -1")):
        with pytest.raises(BertkitError, match=re.escape(message)):
            evaluation.CrossEncoderRerankingEvaluator([sample], **kwargs)
    missed = [{"query": "q", "positive": ["p", "x"], "documents": ["p"]}]
    scores = _Table({("q", "p"): 0.5, ("q", "x"): 0.4})
    want = st_evaluation.CrossEncoderRerankingEvaluator(missed, write_csv=False)(scores)
    got = evaluation.CrossEncoderRerankingEvaluator(missed, write_csv=False)(scores)
    assert got == pytest.approx({k: float(v) for k, v in want.items()}, abs=1e-12)
    assert (round(got["base_ndcg@10"], 4), got["base_map"]) == (0.6131, 0.5)


def test_what_bertkit_does_not_implement_is_refused_by_name(directory, rows, tmp_path):
    from bertkit.sentence.cross_encoder import CrossEncoderTrainer, CrossEncoderTrainingArguments

    for kwargs, name in (({"prompts": {"q": "query: "}}, "prompts"), ({"backend": "onnx"}, "backend"),
                         ({"trust_remote_code": True}, "trust_remote_code"), ({"colour": 1}, "colour")):
        with pytest.raises(BertkitError, match=name):
            CrossEncoder(directory, **kwargs)
    with pytest.raises(FileNotFoundError, match="cross-encoder/ms-marco-MiniLM-L6-v2 does not exist; bertkit loads "
                                                "local directories"):
        CrossEncoder("cross-encoder/ms-marco-MiniLM-L6-v2")
    # sentence-transformers' old names, taken there with a warning: refused naming the new one ("unknown" before)
    with pytest.raises(BertkitError, match="old name of activation_fn: pass activation_fn="):
        CrossEncoder(directory, default_activation_function=torch.nn.Identity())
    # its older names of the arguments above, which it still takes: refused as those ("unknown argument" before)
    for name, instead in (("tokenizer_args", "use max_length="), ("automodel_args", "sentence-transformers. old name of model_kwargs: pass model_kwargs="),
                          ("config_args", "use num_labels="), ("cache_dir", "bertkit loads local directories")):
        with pytest.raises(BertkitError, match=rf"CrossEncoder\({name}=...\) is not implemented in bertkit: {instead}"):
            CrossEncoder(directory, **{name: {"model_max_length": 16}})
    model = CrossEncoder(directory, max_length=32)
    for kwargs, name in (({"pool": object()}, "pool"), ({"prompt": "q: "}, "prompt"), ({"colour": 1}, "colour"),
                         ({"activation_fct": torch.nn.Identity()}, "old name of activation_fn: pass activation_fn="),
                         ({"num_workers": 2}, "no effect in sentence-transformers 6 either: drop it"),
                         ({"sentences": [("a", "b")]}, r"old name of inputs: pass the pairs first, predict\(pairs\)")):
        with pytest.raises(BertkitError, match=name):
            model.predict([("a", "b")], **kwargs)
    # the old keyword alone, as a sentence-transformers 5 script calls it (Python's "missing 1 required positional
    # argument: 'inputs'" before)
    with pytest.raises(BertkitError, match=r"predict\(sentences=...\) is not implemented in bertkit: .*pass the pairs"):
        model.predict(sentences=[("a", "b")])
    with pytest.raises(BertkitError, match=re.escape("rank(convert_to_tensor=...) is not implemented in bertkit: rank "
                                                     "returns Python floats")):
        model.rank("q", ["a"], convert_to_tensor=True)
    with pytest.raises(BertkitError, match="pairs"):
        model.predict(["a", "b", "c"])
    # sentence-transformers' multi-process inference by a list of devices: torch's "to() received an invalid
    # combination of arguments" before, from predict and from rank
    for call in (lambda: model.predict([("a", "b")], device=["cpu", "cpu"]),
                 lambda: model.rank("q", ["a", "b"], device=["cpu"])):
        with pytest.raises(BertkitError, match=r"predict\(device=\['cpu'.*\]\): multi-process inference is not "
                                               r"implemented: call predict in one process, on one device"):
            call()
    # the pool's methods name the CrossEncoder's own calls (they said "call encode()", which it does not have)
    with pytest.raises(BertkitError, match=r"start_multi_process_pool is not implemented in bertkit: call encode\(\) "
                                           r"\(a CrossEncoder's predict\(\) or rank\(\)\) in one process"):
        model.start_multi_process_pool()
    for limit in (600, 2):  # refused where it is set (at predict it was the encoder's error, advising the tokenizer)
        with pytest.raises(BertkitError, match=rf"max_length {limit} must be a whole number in \[3, 512\]"):
            model.max_length = limit
    assert model.max_length == 32
    # sentence-transformers takes max_length=0 and then cuts no pair (past 512 tokens the encoder fails); read as "not
    # given", it cut pairs at the directory's length instead: scores 4e-6 apart on SQuAD pairs, more on long ones
    with pytest.raises(BertkitError, match=r"max_length 0 must be a whole number in \[3, 512\]"):
        CrossEncoder(directory, max_length=0)
    # a top_k that is no count failed in the slice after every document was scored (1.5), or dropped the last (-1)
    for top_k in (1.5, -1, True, "3"):
        with pytest.raises(BertkitError, match=re.escape(f"top_k must be a whole number >= 0 or None, got {top_k!r}")):
            model.rank("q", ["a", "b"], top_k=top_k)
    with pytest.raises(BertkitError, match="prompts"):
        CrossEncoderTrainingArguments(output_dir="unused", prompts="query: ")
    with pytest.raises(BertkitError, match="LambdaLoss takes a query column, a column of document lists"):
        CrossEncoderTrainer(model=model, args=CrossEncoderTrainingArguments(output_dir="unused"),
                            train_dataset=[{"q": "a", "d": "b", "label": 1.0}], loss=losses.LambdaLoss(model))
    with pytest.raises(BertkitError, match="label column"):
        CrossEncoderTrainer(model=model, args=CrossEncoderTrainingArguments(output_dir="unused"),
                            train_dataset=[{"q": "a", "d": "b"}], loss=losses.BinaryCrossEntropyLoss(model))
    with pytest.raises(BertkitError, match="per_device_train_batch_size to 2"):
        CrossEncoderTrainer(model=model, args=CrossEncoderTrainingArguments(output_dir="unused",
                                                                            per_device_train_batch_size=1),
                            train_dataset=[{"q": "a", "d": "b"}], loss=losses.MultipleNegativesRankingLoss(model))
    with pytest.raises(BertkitError, match="compute_metrics"):
        CrossEncoderTrainer(model=model, train_dataset=[{"q": "a", "d": "b", "label": 1}], compute_metrics=len)
    model.save(tmp_path / "custom")  # config_sentence_transformers.json is read beside modules.json
    (tmp_path / "custom" / "config_sentence_transformers.json").write_text(
        '{"model_type": "CrossEncoder", "activation_fn": "my.module.Act"}')
    with pytest.raises(BertkitError, match="torch activations only"):
        CrossEncoder(tmp_path / "custom")


def test_older_positional_arguments_are_read_as_sentence_transformers_6_3_reads_them(tiny_directory, rows, caplog):
    """sentence-transformers 6.3 reads the arguments after the path in its 5.3 order (num_labels, max_length,
    activation_fn, device, ...), logging a deprecation warning for each: bertkit's keyword-only constructor gave
    Python's "takes from 1 to 2 positional arguments but 5 were given"."""
    pairs = _pairs(rows)[:4]
    caplog.set_level(logging.WARNING)
    want_model = st_ce.CrossEncoder(str(tiny_directory), 1, 32, torch.nn.Identity(), "cpu")
    want = [r.getMessage() for r in caplog.records if "positional" in r.getMessage()]
    caplog.clear()
    got_model = CrossEncoder(tiny_directory, 1, 32, torch.nn.Identity(), "cpu")
    assert [r.getMessage() for r in caplog.records if "positional" in r.getMessage()] == want
    assert len(want) == 4 and want[1] == ("Passing `max_length` as a positional argument to CrossEncoder is "
                                          "deprecated. Please pass `max_length` as a keyword argument instead.")
    assert got_model.max_length == want_model.max_seq_length == 32
    np.testing.assert_allclose(got_model.predict(pairs), want_model.predict(pairs), atol=2e-5, rtol=0)
    # each then taken or refused as its keyword is: the 11th is tokenizer_kwargs
    with pytest.raises(BertkitError, match=r"CrossEncoder\(tokenizer_kwargs=...\) is not implemented in bertkit"):
        CrossEncoder(tiny_directory, *[None] * 10, {"model_max_length": 16})
    # what sentence-transformers drops without a word is refused: a name given both ways (it keeps the keyword's),
    # and values past its 14 names
    with pytest.raises(BertkitError, match=r"got max_length twice, by position \(64\) and by keyword \(32\)"):
        CrossEncoder(tiny_directory, 1, 64, max_length=32)
    with pytest.raises(BertkitError, match=r"got 16 arguments by position; .* drops the rest \('x'\)"):
        CrossEncoder(tiny_directory, *[None] * 14, "x")


def test_the_activation_older_sentence_transformers_recorded_in_config_json_is_read(minilm_2_layers, tmp_path):
    import json

    d = cross_encoder_directory(minilm_2_layers, tmp_path / "old")
    config = json.loads((d / "config.json").read_text())
    config["sbert_ce_default_activation_function"] = "torch.nn.modules.linear.Identity"  # before v4
    (d / "config.json").write_text(json.dumps(config))
    model = CrossEncoder(d, max_length=16)
    assert isinstance(model.activation_fn, torch.nn.Identity)
    assert isinstance(st_ce.CrossEncoder(str(d)).activation_fn, torch.nn.Identity)
    model.save(tmp_path / "saved")  # written where sentence-transformers reads it now
    assert json.loads((tmp_path / "saved" / "config_sentence_transformers.json").read_text())["activation_fn"] == \
        "torch.nn.modules.linear.Identity"
    assert isinstance(CrossEncoder(tmp_path / "saved").activation_fn, torch.nn.Identity)


def test_an_activation_function_is_recorded_as_sentence_transformers_records_it(directory, tmp_path, caplog):
    """A function as the activation (torch.nn.functional.sigmoid, torch.sigmoid) is recorded under its class's name,
    as sentence-transformers records it ("function", "builtin_function_or_method"): bertkit wrote the function's
    own name, on which sentence-transformers' load called it with no argument and stopped with a TypeError. Each
    library now refuses (bertkit) or replaces with the default (sentence-transformers) the same name, and the save
    warns of it, naming the module to use, as sentence-transformers 6.3 does (a function went without a word)."""
    import json

    for fn in (torch.nn.functional.sigmoid, torch.sigmoid, torch.nn.Tanh()):
        want_model, got_model = st_ce.CrossEncoder(str(directory)), CrossEncoder(directory)
        want_model.activation_fn = got_model.activation_fn = fn
        want_model.save(str(tmp_path / "st"))
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="bertkit"):
            got_model.save(tmp_path / "bk")
        warned = [r.getMessage() for r in caplog.records if r.name == "bertkit" and "plain function" in r.getMessage()]
        assert len(warned) == (not isinstance(fn, torch.nn.Module)), fn
        assert all(f"saving activation function {fn!r}, a plain function" in w and "torch.nn.Module" in w
                   for w in warned)
        recorded = [json.loads((tmp_path / d / "config_sentence_transformers.json").read_text())["activation_fn"]
                    for d in ("st", "bk")]
        assert recorded[1] == recorded[0], fn
    st_ce.CrossEncoder(str(tmp_path / "bk"))  # opens: the recorded torch.nn.modules.activation.Tanh
    got_model.activation_fn = torch.nn.functional.sigmoid
    got_model.save(tmp_path / "function")
    assert isinstance(st_ce.CrossEncoder(str(tmp_path / "function")).activation_fn, torch.nn.Sigmoid)
    with pytest.raises(BertkitError, match="names the activation 'function'; bertkit resolves torch activations only"):
        CrossEncoder(tmp_path / "function")


def test_an_activation_that_is_no_callable_is_refused_before_scoring(directory, tmp_path):
    """activation_fn="sigmoid" (a name, where a callable goes) at init, set on the model or passed to predict failed
    with "'str' object is not callable" only after every pair was scored, as in sentence-transformers, and saved, the
    directory named the activation "str". Refused when given, naming the value; a callable still scores."""
    from bertkit.sentence.cross_encoder.model import fullname

    message = "activation_fn must be a callable applied to the logits (torch.nn.Sigmoid(), torch.nn.Identity(), " \
              "torch.sigmoid, ...), got str 'sigmoid'"
    with pytest.raises(BertkitError, match=re.escape(message)):
        CrossEncoder(directory, activation_fn="sigmoid")
    model = CrossEncoder(directory, activation_fn=torch.sigmoid)
    with pytest.raises(BertkitError, match=re.escape(message)):
        model.activation_fn = "sigmoid"
    with pytest.raises(BertkitError, match=re.escape(message)):
        model.predict([("a question", "a passage")], activation_fn="sigmoid")
    assert fullname(model.activation_fn) == "builtin_function_or_method"
    pairs = [("Where is Paris?", "Paris is in France."), ("Where is Paris?", "Bread is baked.")]
    want = st_ce.CrossEncoder(str(directory)).predict(pairs, activation_fn=torch.sigmoid)
    np.testing.assert_allclose(model.predict(pairs), want, atol=2e-6, rtol=0)


def test_a_saved_default_prompt_is_refused_not_dropped(directory, rows, tmp_path):
    """sentence-transformers 6 saves a cross-encoder's prompts and default_prompt_name in
    config_sentence_transformers.json and puts the default prompt before every query; bertkit loaded such a directory
    and scored the bare pairs (logits up to 9e-5 apart here, 45 times the parity tolerance), said nowhere. It is refused, naming the prompt;
    prompts without a default change no score and load."""
    import json

    pairs, prompts = _pairs(rows)[:6], {"query": "Find the sentence that answers this question: "}
    CrossEncoder(directory).save(tmp_path / "ce")
    config_file = tmp_path / "ce" / "config_sentence_transformers.json"
    config = json.loads(config_file.read_text())
    config_file.write_text(json.dumps({**config, "prompts": prompts, "default_prompt_name": "query"}))
    reference = st_ce.CrossEncoder(str(tmp_path / "ce"))
    logits = reference.predict(pairs, activation_fn=torch.nn.Identity())
    bare = reference.predict(pairs, activation_fn=torch.nn.Identity(), prompt="")  # "": no prompt there
    assert np.abs(logits - bare).max() > 2e-5  # the default prompt moves the scores there, beyond parity's 2e-6
    with pytest.raises(BertkitError, match=r"sets default_prompt_name 'query': sentence-transformers puts its prompt "
                                           r"'Find the sentence .*' before every query"):
        CrossEncoder(tmp_path / "ce")
    config_file.write_text(json.dumps({**config, "prompts": prompts, "default_prompt_name": None}))
    np.testing.assert_allclose(CrossEncoder(tmp_path / "ce").predict(pairs),
                               st_ce.CrossEncoder(str(tmp_path / "ce")).predict(pairs), atol=2e-6, rtol=0)


def test_a_saved_default_prompt_name_without_its_prompt_is_refused_as_sentence_transformers_refuses_it(directory,
                                                                                                        tmp_path):
    """A default_prompt_name that names none of the saved prompts: sentence-transformers 6 refuses to load the
    directory; bertkit's CrossEncoder and rerank pipeline loaded it and scored the bare pairs, said nowhere."""
    import json

    import bertkit

    CrossEncoder(directory).save(tmp_path / "ce")
    config_file = tmp_path / "ce" / "config_sentence_transformers.json"
    config = json.loads(config_file.read_text())
    config_file.write_text(json.dumps({**config, "prompts": {"query": "query: "}, "default_prompt_name": "missing"}))
    with pytest.raises(ValueError, match="Default prompt name 'missing' not found"):
        st_ce.CrossEncoder(str(tmp_path / "ce"))
    refused = r"sets default_prompt_name 'missing', which is not one of its prompts \['query'\]"
    with pytest.raises(BertkitError, match=refused):
        CrossEncoder(tmp_path / "ce")
    with pytest.raises(BertkitError, match=refused):
        bertkit.pipeline("rerank", tmp_path / "ce", progress=False)


def _rerank_cuts_as_sentence_transformers(directory, max_length: int) -> None:
    """Both CrossEncoders and the rerank pipeline on ``directory`` cut pairs at ``max_length``: the pipeline's raw
    scores are sentence-transformers' logits (a long text among short ones)."""
    import bertkit

    want_model = st_ce.CrossEncoder(str(directory))
    assert want_model.max_length == CrossEncoder(directory).max_length == max_length
    texts = ["Paris is in France.", LONG, "Berlin is the capital of Germany."]
    want = want_model.predict([("Where is Paris?", t) for t in texts], activation_fn=torch.nn.Identity())
    pipe = bertkit.pipeline("rerank", directory, progress=False)
    assert pipe.max_length == max_length
    got = {r["index"]: r["score"] for r in pipe({"query": "Where is Paris?", "texts": texts}, raw_scores=True)}
    np.testing.assert_allclose([got[i] for i in range(3)], want, atol=2e-5, rtol=0)
    for name in ("raw_scores", "return_text"):  # a truthy string would have been taken as true: logits, unsaid
        with pytest.raises(BertkitError, match=f"{name} must be true or false, got 'no'"):
            pipe({"query": "Where is Paris?", "texts": texts}, **{name: "no"})


def test_a_directory_without_modules_json_is_read_as_a_plain_checkpoint(directory, rows, tmp_path):
    """Without modules.json, sentence-transformers loads a directory as a Hugging Face checkpoint and reads neither
    config_sentence_transformers.json nor sentence_bert_config.json: an activation or a max_seq_length found there
    changes nothing. bertkit read both (Identity there: 0.05 against sentence-transformers' 0.51 for a pair;
    max_seq_length 16 there: scores 4e-3 apart). The activation of config.json's "sentence_transformers" (v4) ends the
    search even when null, as there (bertkit went on to the older key)."""
    import json
    import shutil

    pairs = [(rows[0]["query"], d) for d in [rows[0]["positive"], *rows[0]["negatives"]]]
    plain = shutil.copytree(directory, tmp_path / "plain")
    (plain / "config_sentence_transformers.json").write_text('{"activation_fn": "torch.nn.modules.linear.Identity"}')
    (plain / "sentence_bert_config.json").write_text('{"max_seq_length": 16}')
    want_model, got_model = st_ce.CrossEncoder(str(plain)), CrossEncoder(plain)
    assert isinstance(want_model.activation_fn, torch.nn.Sigmoid) and isinstance(got_model.activation_fn, torch.nn.Sigmoid)
    assert got_model.max_length == want_model.max_seq_length == 512
    np.testing.assert_allclose(got_model.predict(pairs), want_model.predict(pairs), atol=2e-6, rtol=0)

    config = json.loads((directory / "config.json").read_text())
    v4 = shutil.copytree(directory, tmp_path / "v4")
    (v4 / "config.json").write_text(json.dumps({**config, "sentence_transformers": {"activation_fn": None},
                                                "sbert_ce_default_activation_function": "torch.nn.modules.linear.Identity"}))
    assert isinstance(st_ce.CrossEncoder(str(v4)).activation_fn, torch.nn.Sigmoid)
    assert isinstance(CrossEncoder(v4).activation_fn, torch.nn.Sigmoid)

    # beside a modules.json too, unless config_sentence_transformers.json names the model a CrossEncoder (its
    # "model_type"; without the file or the key, "SentenceTransformer"): sentence-transformers then converts the
    # directory ("Converting SentenceTransformer model ... to CrossEncoder.") and reads it as a plain checkpoint. bertkit
    # read the files as a CrossEncoder's: cut at 16, Identity (0.07 against 0.52 for a pair), the prompt refused
    CrossEncoder(directory).save(tmp_path / "untyped")
    sbert = json.loads((tmp_path / "untyped" / "sentence_bert_config.json").read_text())
    (tmp_path / "untyped" / "sentence_bert_config.json").write_text(json.dumps({**sbert, "max_seq_length": 16}))
    for st_config in (None, {"activation_fn": "torch.nn.modules.linear.Identity", "prompts": {"query": "query: "},
                             "default_prompt_name": "query"}):
        config_file = tmp_path / "untyped" / "config_sentence_transformers.json"
        config_file.unlink(missing_ok=True)
        if st_config is not None:
            config_file.write_text(json.dumps(st_config))
        want_model, got_model = st_ce.CrossEncoder(str(tmp_path / "untyped")), CrossEncoder(tmp_path / "untyped")
        assert isinstance(want_model.activation_fn, torch.nn.Sigmoid) and isinstance(got_model.activation_fn,
                                                                                      torch.nn.Sigmoid)
        assert got_model.max_length == want_model.max_seq_length == 512
        np.testing.assert_allclose(got_model.predict(pairs), want_model.predict(pairs), atol=2e-6, rtol=0)


@pytest.mark.parametrize("declared", [{"max_seq_length": 24},
                                      {"max_seq_length": 256, "tokenizer_args": {"model_max_length": 24}},
                                      {"processor_kwargs": {"model_max_length": 24}}])
def test_rerank_pipeline_cuts_pairs_at_the_max_seq_length_the_directory_declares(directory, tmp_path, declared):
    """A cross-encoder directory whose sentence_bert_config.json declares max_seq_length 24 (its tokenizer says 512):
    sentence-transformers' and bertkit's CrossEncoder cut pairs at 24; the rerank pipeline (`bertkit serve --task
    rerank`) cut them at 512, so its scores for a long pair were another text's. A model_max_length in the
    tokenizer's arguments wins over max_seq_length in sentence-transformers 6; bertkit read max_seq_length alone (256
    or 512: scores 4e-3 apart on SQuAD pairs with all-MiniLM-L6-v2)."""
    import json

    import bertkit

    CrossEncoder(directory).save(tmp_path / "ce")
    sbert = json.loads((tmp_path / "ce" / "sentence_bert_config.json").read_text())
    sbert.pop("max_seq_length", None)
    (tmp_path / "ce" / "sentence_bert_config.json").write_text(json.dumps({**sbert, **declared}))
    _rerank_cuts_as_sentence_transformers(tmp_path / "ce", 24)
    assert bertkit.pipeline("rerank", tmp_path / "ce", max_length=64, progress=False).max_length == 64


def test_rerank_pipeline_cuts_at_the_declared_max_seq_length_over_a_smaller_tokenizer_limit(directory, tmp_path):
    """sentence_bert_config.json declares max_seq_length 48, tokenizer_config.json says model_max_length 24: both
    CrossEncoders cut pairs at 48 (sentence-transformers gives it to the tokenizer); the rerank pipeline (`bertkit
    serve --task rerank`) refused the directory ("max_length 48 is outside [8, 24]")."""
    import json

    CrossEncoder(directory).save(tmp_path / "ce")
    sbert = json.loads((tmp_path / "ce" / "sentence_bert_config.json").read_text())
    (tmp_path / "ce" / "sentence_bert_config.json").write_text(json.dumps({**sbert, "max_seq_length": 48}))
    config = json.loads((tmp_path / "ce" / "tokenizer_config.json").read_text())
    (tmp_path / "ce" / "tokenizer_config.json").write_text(json.dumps({**config, "model_max_length": 24}))
    _rerank_cuts_as_sentence_transformers(tmp_path / "ce", 48)


def test_rerank_pipeline_warns_when_the_directory_scores_by_another_activation(directory, tmp_path, caplog):
    """A cross-encoder saved with activation_fn Identity (a model trained with MSELoss on teacher logits): its
    CrossEncoder's rank gives the logit, the rerank pipeline (`bertkit serve --task rerank`'s /rerank, TEI's) its
    sigmoid, 0.5049 against 0.0196 for the same pair, said nowhere. The pipeline keeps TEI's scores and warns, naming
    raw_scores, which gives rank's numbers."""
    import logging

    import bertkit

    pairs = [("Where is Paris?", "Paris is in France."), ("Where is Paris?", "Berlin is the capital of Germany.")]
    CrossEncoder(directory, activation_fn=torch.nn.Identity()).save(tmp_path / "identity")
    want = st_ce.CrossEncoder(str(tmp_path / "identity")).rank(pairs[0][0], [t for _, t in pairs])
    with caplog.at_level(logging.WARNING, logger="bertkit"):
        pipe = bertkit.pipeline("rerank", tmp_path / "identity", progress=False)
    assert "names the activation torch.nn.modules.linear.Identity" in caplog.text
    assert "pass raw_scores=True to the pipeline, --raw-scores to bertkit predict rerank" in caplog.text
    got = pipe({"query": pairs[0][0], "texts": [t for _, t in pairs]}, raw_scores=True)
    assert [(g["index"], g["score"]) for g in got] == [(w["corpus_id"], pytest.approx(float(w["score"]), abs=2e-6))
                                                       for w in want]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="bertkit"):  # the default sigmoid: the same numbers, nothing to say
        bertkit.pipeline("rerank", directory, progress=False)
    assert "names the activation" not in caplog.text


def test_a_peft_adapter_directory_is_refused_naming_the_recipe(directory, tmp_path):
    """model.model = get_peft_model(...), then save: the directory holds the adapter over its base (adapter_config.json,
    no config.json), as sentence-transformers writes one. CrossEncoder said "has no config.json"; it now names the
    adapter and its base as SentenceTransformer does, and its recipe gives the scores back."""
    peft = pytest.importorskip("peft")
    torch.manual_seed(0)
    model = CrossEncoder(directory)
    model.model = peft.get_peft_model(model.model, peft.LoraConfig(r=4, target_modules=["query", "value"],
                                                                   init_lora_weights="gaussian"))
    pairs = [("Where is Paris?", "Paris is in France."), ("Where is Rome?", "Paris is in France.")]
    want = model.predict(pairs)
    model.save(tmp_path / "lora")
    with pytest.raises(BertkitError, match=rf"holds a peft adapter \(adapter_config.json\) over {directory}, not a "
                                           r"whole encoder; bertkit loads no adapters: load the base \(CrossEncoder"
                                           r"\(base\)\), wrap its encoder with peft's PeftModel.from_pretrained"
                                           r"\(model.model, this directory\)"):
        CrossEncoder(tmp_path / "lora")
    base = CrossEncoder(directory)
    base.model = peft.PeftModel.from_pretrained(base.model, str(tmp_path / "lora")).merge_and_unload()
    np.testing.assert_allclose(base.predict(pairs), want, atol=1e-6)


@pytest.mark.parametrize("method", ["append", "extend", "insert"])
def test_changing_the_modules_is_refused_naming_the_cross_encoder(directory, method):
    """sentence-transformers' CrossEncoder is a Sequential (append / extend / insert); bertkit's holds one module, and
    the refusal spoke of a SentenceTransformer ("bertkit's SentenceTransformer holds one Transformer, Pooling...")."""
    from bertkit.errors import NotImplementedInBertkit

    with pytest.raises(NotImplementedInBertkit) as caught:
        getattr(CrossEncoder(directory), method)
    assert str(caught.value).startswith(f"CrossEncoder.{method} is not implemented in bertkit: bertkit's CrossEncoder "
                                        "holds one Transformer (model[0]: the encoder with its classifier")
    assert "SentenceTransformer holds" not in str(caught.value)


@pytest.mark.parametrize("setting", ["do_lower_case", "default_prompt"])
def test_every_classifier_surface_refuses_what_the_cross_encoder_refuses(directory, tmp_path, setting):
    """A cross-encoder's directory read as text-classification (the pipeline, `bertkit predict`, `bertkit serve`) was
    scored with neither its sentence_bert_config.json's do_lower_case nor its default prompt, both of which its
    ``CrossEncoder`` and the rerank pipeline refuse: the same pair got another score there than in
    sentence-transformers (-0.022597 against -0.022463 for a cased pair on MiniLM's first 2 layers), without a word.
    Every surface now reads the directory through one check and refuses it by name."""
    import json

    import bertkit
    from bertkit.cli import main

    d = CrossEncoder(directory, max_length=32).save(tmp_path / "ce")  # what sentence-transformers' CrossEncoder saves
    name, key, value = ("sentence_bert_config.json", "do_lower_case", True) if setting == "do_lower_case" else (
        "config_sentence_transformers.json", "prompts", {"query": "query: "})
    saved = json.loads((d / name).read_text())
    (d / name).write_text(json.dumps({**saved, key: value, **({"default_prompt_name": "query"} if key == "prompts" else {})}))
    match = (r"sentence_bert_config.json sets do_lower_case" if setting == "do_lower_case"
             else r"sets default_prompt_name 'query'.*cross-encoder prompts")
    for load in (CrossEncoder, lambda d: bertkit.pipeline("rerank", d, progress=False),
                 lambda d: bertkit.pipeline("text-classification", d, progress=False)):
        with pytest.raises(BertkitError, match=match):
            load(d)
    (tmp_path / "pairs.jsonl").write_text(json.dumps({"text": "HOW MANY live there?", "text_pair": "3.5 MILLION"}) + "\n")
    out = tmp_path / "out.jsonl"
    assert main(["predict", "text-classification", "--model", str(d), "--input", str(tmp_path / "pairs.jsonl"),
                 "--text-pair-column", "text_pair", "--output-file", str(out), "--no-progress"]) == 2
    assert not out.exists()
