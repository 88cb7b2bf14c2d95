"""The sparse losses beyond SpladeLoss's first four (tests/test_sparse_training.py): SparseTripletLoss,
SparseCosineSimilarityLoss, SparseAnglELoss, SparseMSELoss and CachedSpladeLoss, on the masked-LM checkpoint of
sparse_helpers (dropout off) and real rows (SQuAD dev triplets, GLUE STS-B dev pairs). Each gives
sentence-transformers' terms and parameter gradients on the same batch; CachedSpladeLoss gives SpladeLoss's with
mini-batches smaller than the batch; bad input is refused by name."""

from __future__ import annotations

import csv
import json

import pytest
import torch

from bertkit.errors import BertkitError
from sparse_helpers import masked_lm_checkpoint

st = pytest.importorskip("sentence_transformers")

MAX_LENGTH = 32
WEIGHTS = {"document_regularizer_weight": 3e-3, "query_regularizer_weight": 5e-3}  # large: the terms must count


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, minilm_2_layers):
    """MiniLM cut to 2 layers and 8,960 word pieces (conftest.py), as a masked-LM checkpoint: the code path's
    parity at a fraction of the cost."""
    return masked_lm_checkpoint(minilm_2_layers, tmp_path_factory.mktemp("sparse-losses") / "mlm", dropout=0.0)


@pytest.fixture(scope="module")
def triplets(data_dir):
    """(question, its paragraph, the next paragraph) for 4 SQuAD dev paragraphs, as three columns (few: the
    reference's backward through max pooling takes seconds a batch on a CPU)."""
    path = data_dir / "squad" / "dev-v1.1.json"
    if not path.is_file():
        pytest.skip(f"{path} absent")
    paragraphs = json.loads(path.read_text())["data"][0]["paragraphs"][:4]
    return [[p["qas"][0]["question"] for p in paragraphs], [p["context"] for p in paragraphs],
            [paragraphs[(i + 1) % 4]["context"] for i in range(4)]]


@pytest.fixture(scope="module")
def scored_pairs(data_dir):
    """8 GLUE STS-B dev pairs, their scores scaled to [0, 1]."""
    path = data_dir / "glue" / "STS-B" / "dev.tsv"
    if not path.is_file():
        pytest.skip(f"{path} absent")
    rows = list(csv.reader(path.open(), delimiter="\t", quoting=csv.QUOTE_NONE))[1:9]
    return [[r[7] for r in rows], [r[8] for r in rows]], torch.tensor([float(r[9]) / 5 for r in rows])


def _models(checkpoint):
    """(sentence-transformers' model and losses, bertkit's), the same checkpoint."""
    from sentence_transformers.sparse_encoder import losses as reference

    from bertkit.sentence import SparseEncoder
    from bertkit.sentence.sparse_encoder import losses

    want = st.SparseEncoder(str(checkpoint), device="cpu")
    got = SparseEncoder(str(checkpoint), device="cpu")
    want.max_seq_length = got.max_seq_length = MAX_LENGTH
    return (want, reference), (got, losses)


def _step(model, loss, columns, labels) -> tuple[dict[str, float], dict[str, torch.Tensor]]:
    """The loss's terms on the batch and each parameter's gradient of their sum (the trainer's backward)."""
    model.zero_grad()
    out = loss([model.tokenize(texts) for texts in columns], labels)
    terms = out if isinstance(out, dict) else {"loss": out}
    sum(terms.values()).backward()
    return ({name: value.item() for name, value in terms.items()},
            {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None})


def _assert_same(got, want):
    (got_terms, got_grads), (want_terms, want_grads) = got, want
    assert got_terms.keys() == want_terms.keys()
    for name in want_terms:  # float32 rounding of the same sums
        assert got_terms[name] == pytest.approx(want_terms[name], rel=1e-5, abs=1e-7), name
    assert got_grads.keys() == want_grads.keys()
    # against the largest gradient: a parameter whose exact gradient is 0 (the attention keys' biases, which the
    # softmax cancels) holds float32 noise of 1e-9 that differs from library to library
    scale = max(g.abs().max().item() for g in want_grads.values())
    worst = max((got_grads[n] - want_grads[n]).abs().max().item() for n in want_grads)
    assert worst <= 1e-5 * scale, (worst, scale)


def _cosine(L):
    """Each library's TripletDistanceMetric.COSINE (the dense losses' enum, as a ported script imports it)."""
    if L.__name__.startswith("sentence_transformers"):
        return st.sentence_transformer.losses.TripletDistanceMetric.COSINE
    from bertkit.sentence.losses import TripletDistanceMetric

    return TripletDistanceMetric.COSINE


LOSSES = {
    "triplet": lambda L, m: L.SpladeLoss(m, L.SparseTripletLoss(m), **WEIGHTS),
    "triplet_cosine_margin": lambda L, m: L.SpladeLoss(
        m, L.SparseTripletLoss(m, distance_metric=_cosine(L), triplet_margin=0.5), **WEIGHTS),
    "cosine_similarity": lambda L, m: L.SpladeLoss(m, L.SparseCosineSimilarityLoss(m), 3e-3,
                                                   use_document_regularizer_only=True),
    "angle": lambda L, m: L.SpladeLoss(m, L.SparseAnglELoss(m), 3e-3, use_document_regularizer_only=True),
    "angle_query_weight": lambda L, m: L.SpladeLoss(m, L.SparseAnglELoss(m, scale=10.0), **WEIGHTS),
}


# one loss per kind of data in make test (triplets; scored pairs on documents only), the other three in make test-slow
@pytest.mark.parametrize("kind", [k if k in ("triplet", "cosine_similarity") else pytest.param(k, marks=pytest.mark.slow)
                                  for k in LOSSES])
def test_loss_gives_sentence_transformers_terms_and_gradients(kind, checkpoint, triplets, scored_pairs):
    columns, labels = (triplets, None) if kind.startswith("triplet") else scored_pairs
    (want_model, reference), (got_model, losses) = _models(checkpoint)
    want = _step(want_model, LOSSES[kind](reference, want_model), columns, labels)
    got = _step(got_model, LOSSES[kind](losses, got_model), columns, labels)
    _assert_same(got, want)
    assert got_model.similarity_fn_name == want_model.similarity_fn_name  # "cosine" for the scored pairs
    if kind.startswith("triplet"):
        assert want[0]["base_loss"] > 0  # the margin is not met: the base loss has a gradient


def test_sparse_mse_loss_trains_alone_as_sentence_transformers_and_inside_splade_loss(checkpoint, scored_pairs):
    """A teacher's sparse embeddings as labels (here the checkpoint's own of the second column: a translation pair's
    other side). Alone: sentence-transformers' value and gradients. Inside SpladeLoss each column is compared with
    the teacher's embedding of its row; sentence-transformers' SpladeLoss hands the (B, V) labels to MSELoss as
    a list of columns, so it compares every row with the teacher's first and second rows (0.00262 on 6-layer
    MiniLM, against this mean squared error of 0.000496): bertkit does not follow it there."""
    (columns, _), ((want_model, reference), (got_model, losses)) = scored_pairs, _models(checkpoint)
    teacher = st.SparseEncoder(str(checkpoint), device="cpu").encode(columns[1], convert_to_tensor=True,
                                                                     convert_to_sparse_tensor=False)
    want = _step(want_model, reference.SparseMSELoss(want_model), columns[:1], teacher)
    got = _step(got_model, losses.SparseMSELoss(got_model), columns[:1], teacher)
    _assert_same(got, want)
    splade = losses.SpladeLoss(got_model, losses.SparseMSELoss(got_model), 3e-3, use_document_regularizer_only=True)
    terms = splade([got_model.tokenize(texts) for texts in columns], teacher)
    with torch.no_grad():
        student = [got_model.encode(texts, convert_to_tensor=True, convert_to_sparse_tensor=False) for texts in columns]
    mean_squared = sum(torch.nn.functional.mse_loss(s, teacher) for s in student) / 2
    assert terms["base_loss"].item() == pytest.approx(mean_squared.item(), rel=1e-5)


@pytest.mark.parametrize("mini_batch_size", [3])
def test_cached_splade_loss_gives_splade_loss_terms_and_gradients(mini_batch_size, checkpoint, triplets,
                                                                   scored_pairs):
    """GradCache in mini-batches of 3 rows (the last one short; of 4 triplets, of 8 scored pairs): SpladeLoss's
    terms and gradients, and sentence-transformers' CachedSpladeLoss's; on scored pairs with documents only."""
    (want_model, reference), (got_model, losses) = _models(checkpoint)
    for columns, labels, make, weights in (
            (triplets, None, "SparseMultipleNegativesRankingLoss", WEIGHTS),
            (*scored_pairs, "SparseCoSENTLoss", {"document_regularizer_weight": 3e-3,
                                                 "use_document_regularizer_only": True})):
        uncached = _step(got_model, losses.SpladeLoss(got_model, getattr(losses, make)(got_model), **weights),
                         columns, labels)
        cached = losses.CachedSpladeLoss(got_model, getattr(losses, make)(got_model), **weights,
                                         mini_batch_size=mini_batch_size)
        got = _step(got_model, cached, columns, labels)
        _assert_same(got, uncached)
        want = _step(want_model, reference.CachedSpladeLoss(want_model, getattr(reference, make)(want_model),
                                                            **weights, mini_batch_size=mini_batch_size),
                     columns, labels)
        _assert_same(got, want)
        with torch.no_grad():  # evaluation: the same terms, no backward prepared
            terms = cached([got_model.tokenize(texts) for texts in columns], labels)
        assert {k: v.item() for k, v in terms.items()} == pytest.approx(got[0], rel=1e-6)


def test_bad_sparse_loss_input_is_refused_by_name(checkpoint, tmp_path):
    datasets = pytest.importorskip("datasets")
    from bertkit.sentence import SparseEncoderTrainer, SparseEncoderTrainingArguments
    from bertkit.sentence.sparse_encoder import losses

    _, (model, _) = _models(checkpoint)
    mnrl = losses.SparseMultipleNegativesRankingLoss(model)
    for name in ("CSRLoss", "CSRReconstructionLoss"):
        with pytest.raises(BertkitError, match=f"losses.{name} is not implemented in bertkit: CSR models .* train a "
                                               "SPLADE model .* with SpladeLoss or CachedSpladeLoss"):
            getattr(losses, name)
    for size in (0, 2.5, True):
        with pytest.raises(BertkitError, match=rf"CachedSpladeLoss: mini_batch_size must be a whole number >= 1, "
                                               rf"got {size!r}"):
            losses.CachedSpladeLoss(model, mnrl, 3e-5, 5e-5, mini_batch_size=size)
    with pytest.raises(BertkitError, match=r"CachedSpladeLoss\(mini_batch_num_tokens=512\) is not implemented"):
        losses.CachedSpladeLoss(model, mnrl, 3e-5, 5e-5, mini_batch_num_tokens=512)
    with pytest.raises(BertkitError, match="SpladeLoss: document_regularizer_weight must be a finite number"):
        losses.CachedSpladeLoss(model, mnrl, -1.0)
    # one column inside SpladeLoss: no documents (sentence-transformers fails inside torch.cat)
    one = losses.SpladeLoss(model, losses.SparseMSELoss(model), 3e-3, 5e-3)
    with pytest.raises(BertkitError, match="a batch of one text column has no documents to regularise .* "
                                           "use_document_regularizer_only=True"):
        one([model.tokenize(["a text"])], torch.zeros(1, 8960))
    rows = datasets.Dataset.from_list([{"a": "a question", "p": "a passage", "n": "another"}] * 4)
    args = SparseEncoderTrainingArguments(output_dir=str(tmp_path / "out"), per_device_train_batch_size=2)
    for loss in (losses.SparseTripletLoss(model), losses.SparseAnglELoss(model),
                 losses.SparseCosineSimilarityLoss(model)):
        with pytest.raises(BertkitError, match=f"{type(loss).__name__} trains inside SpladeLoss"):
            SparseEncoderTrainer(model=model, args=args, train_dataset=rows, loss=loss)
    assert not (tmp_path / "out").exists()  # refused before anything was written


def test_cached_splade_loss_routes_each_column_as_splade_loss_does(checkpoint, tmp_path):
    """An inference-free model (a Router: static query weights, SPLADE documents): each mini-batch goes through its
    column's route, the query column through the static weights, as in SpladeLoss; same terms and gradients."""
    from sentence_transformers.sparse_encoder.modules import Router, SparseStaticEmbedding, SpladePooling
    from sentence_transformers.sparse_encoder.modules import Transformer as STTransformer

    from bertkit.sentence import SparseEncoder
    from bertkit.sentence.sparse_encoder import losses

    document = STTransformer(str(checkpoint), transformer_task="fill-mask")
    query = SparseStaticEmbedding(tokenizer=document.tokenizer, weight=torch.rand(
        document.auto_model.config.vocab_size, generator=torch.Generator().manual_seed(1)) + 0.5)
    router = Router.for_query_document(query_modules=[query], document_modules=[document, SpladePooling("max")])
    st.SparseEncoder(modules=[router], device="cpu").save(str(tmp_path / "inference_free"))
    model = SparseEncoder(str(tmp_path / "inference_free"), device="cpu")
    columns = [["who drove", "what is the weather", "where is paris", "why do cats sleep"],
               ["He drove to the stadium.", "The weather is lovely.", "Paris is in France.", "Cats sleep a lot."],
               ["Cats sleep.", "The river is wide.", "Berlin is big.", "Dogs bark."]]
    features = [model.tokenize(texts, task=task) for texts, task in zip(columns, ("query", "document", "document"))]

    def step(loss):
        model.zero_grad()
        terms = loss(features, None)
        sum(terms.values()).backward()
        return ({name: value.item() for name, value in terms.items()},
                {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None})

    mnrl = losses.SparseMultipleNegativesRankingLoss(model)
    want = step(losses.SpladeLoss(model, mnrl, **WEIGHTS))
    got = step(losses.CachedSpladeLoss(model, mnrl, **WEIGHTS, mini_batch_size=3))
    _assert_same(got, want)
    assert "0.sub_modules.query.0.weight" in got[1]  # the static query weights took the query column's gradient
