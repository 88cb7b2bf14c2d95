"""bertkit.sentence.losses: each loss equals sentence-transformers' on the same embeddings and labels; the cached
(GradCache) loss gives the uncached loss's value and parameter gradients; bad arguments are named."""

from __future__ import annotations

import json
import re

import pytest
import torch

from bertkit.errors import BertkitError
from bertkit.sentence import SentenceTransformer, losses
from bertkit.sentence.util import dot_score
from cases import slow_after
from cross_encoder_helpers import squad_rerank
from sentence_helpers import POOLING, st_directory

st = pytest.importorskip("sentence_transformers")
st_losses = st.sentence_transformer.losses


class _Dim:
    """What sentence-transformers' loss constructors ask of a model, for comparing losses on given embeddings."""

    def get_embedding_dimension(self):
        return 16

    get_sentence_embedding_dimension = get_embedding_dimension


def _embeddings(columns: int, rows: int = 6, dim: int = 16) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(columns)
    return [torch.randn(rows, dim, generator=g) for _ in range(columns)]


CASES = [
    ("MultipleNegativesRankingLoss", {}, 2, None),
    ("MultipleNegativesRankingLoss", {"scale": 7.0}, 4, None),
    ("MultipleNegativesRankingLoss", {"directions": ("query_to_doc", "query_to_query", "doc_to_query", "doc_to_doc")}, 3, None),
    ("MultipleNegativesRankingLoss", {"directions": ("query_to_doc", "doc_to_query"), "partition_mode": "per_direction"}, 3, None),
    # hardness: alpha x cos added to the negatives' logits each mode names (these failed as "not implemented")
    ("MultipleNegativesRankingLoss", {"hardness_mode": "in_batch_negatives", "hardness_strength": 9.0}, 3, None),
    ("MultipleNegativesRankingLoss", {"hardness_mode": "hard_negatives", "hardness_strength": 5.0}, 4, None),
    ("MultipleNegativesRankingLoss", {"hardness_mode": "all_negatives", "hardness_strength": 3.0,
                                      "directions": ("query_to_doc", "doc_to_query"), "partition_mode": "per_direction"},
     3, None),
    ("MultipleNegativesSymmetricRankingLoss", {}, 2, None),
    ("CoSENTLoss", {}, 2, torch.tensor([0.1, 0.9, 0.5, 0.5, 0.0, 1.0])),
    ("CosineSimilarityLoss", {}, 2, torch.tensor([0.1, 0.9, 0.5, 0.5, 0.0, 1.0])),
    ("TripletLoss", {}, 3, None),
    ("MarginMSELoss", {}, 3, torch.tensor([0.3, -1.2, 2.0, 0.0, 5.1, -0.4])),  # one margin per row
    ("MarginMSELoss", {}, 4, torch.arange(18.0).reshape(6, 3).sin() * 4),  # the teacher's 3 scores per row
    ("DistillKLDivLoss", {}, 3, torch.arange(12.0).reshape(6, 2).cos() * 3),
    ("DistillKLDivLoss", {"temperature": 2.0, "teacher_temperature": 0.5}, 4, torch.arange(18.0).reshape(6, 3).cos()),
    ("AnglELoss", {}, 2, torch.tensor([0.1, 0.9, 0.5, 0.5, 0.0, 1.0])),
    ("AnglELoss", {"scale": 5.0}, 4, torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 1.0])),  # anchor x each candidate
    ("ContrastiveLoss", {}, 2, torch.tensor([1, 0, 1, 1, 0, 0])),
    ("ContrastiveLoss", {"distance_metric": "EUCLIDEAN", "margin": 6.0, "size_average": False}, 2,
     torch.tensor([1, 0, 1, 1, 0, 0])),
    ("OnlineContrastiveLoss", {}, 2, torch.tensor([1, 0, 1, 1, 0, 0])),
    ("OnlineContrastiveLoss", {"distance_metric": "MANHATTAN", "margin": 20.0}, 2, torch.tensor([1, 0, 1, 1, 0, 0])),
    ("OnlineContrastiveLoss", {}, 2, torch.ones(6)),  # no dissimilar pair: the similar ones beyond their mean
]


@pytest.mark.parametrize("name,kwargs,columns,labels", CASES)
def test_loss_equals_sentence_transformers(name, kwargs, columns, labels):
    embeddings = _embeddings(columns)

    def build(module):  # a distance is each library's own SiameseDistanceMetric member of that name
        args = {k: getattr(module.SiameseDistanceMetric, v) if k == "distance_metric" else v for k, v in kwargs.items()}
        return getattr(module, name)(_Dim(), **args)

    want = build(st_losses).compute_loss_from_embeddings(embeddings, labels)
    got = build(losses).compute_loss_from_embeddings(embeddings, labels)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)


def test_embedding_distillation_and_angle_similarity_equal_sentence_transformers():
    """A teacher's embeddings as labels, one for every column (B, D) or one per column (B, C, D); AnglE's
    similarity on an odd width (padded with a zero)."""
    embeddings, teacher = _embeddings(3), _embeddings(3, dim=16)[::-1]
    for metric in ("mse", "l2", "cosine"):
        for labels, per_column in ((teacher[0], [teacher[0]] * 3), (torch.stack(teacher, 1), teacher)):
            want = st_losses.EmbedDistillLoss(_Dim(), distance_metric=metric).compute_loss_from_embeddings(
                embeddings, per_column)
            got = losses.EmbedDistillLoss(_Dim(), distance_metric=metric).compute_loss_from_embeddings(embeddings, labels)
            torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)
            # sentence-transformers' own call, a list of one tensor per column (was: "'list' object has no attribute
            # 'detach'"), as a custom loss composing it writes
            got = losses.EmbedDistillLoss(_Dim(), distance_metric=metric).compute_loss_from_embeddings(embeddings,
                                                                                                       per_column)
            torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)
    with pytest.raises(BertkitError, match=r"MSELoss: 2 teacher embedding tensor\(s\) for 3 text column\(s\)"):
        losses.MSELoss(_Dim()).compute_loss_from_embeddings(embeddings, teacher[:2])  # there, zip drops a column
    want = st_losses.MSELoss(_Dim()).compute_loss_from_embeddings(embeddings, [teacher[1]] * 3)
    torch.testing.assert_close(losses.MSELoss(_Dim()).compute_loss_from_embeddings(embeddings, teacher[1]), want)
    with pytest.raises(BertkitError, match=r"the teacher's embeddings are \(6, 8\) and the student's \(6, 16\)"):
        losses.MSELoss(_Dim()).compute_loss_from_embeddings(embeddings, teacher[1][:, :8])
    with pytest.raises(BertkitError, match="projection_dim=8"):
        losses.MSELoss(_Dim(), projection_dim=8)
    odd = _embeddings(2, dim=15)
    torch.testing.assert_close(losses.AnglELoss(_Dim()).similarity_fct(*odd), st.util.pairwise_angle_sim(*odd))
    wide = [e.double() for e in odd]  # float64 stays float64, as in every similarity function
    got, want = losses.AnglELoss(_Dim()).similarity_fct(*wide), st.util.pairwise_angle_sim(*wide)
    assert got.dtype == want.dtype == torch.float64
    torch.testing.assert_close(got, want)


def test_mnrl_dot_product_and_triplet_cosine():
    embeddings = _embeddings(3)
    want = st_losses.MultipleNegativesRankingLoss(_Dim(), scale=1.0, similarity_fct=st.util.dot_score)
    got = losses.MultipleNegativesRankingLoss(_Dim(), scale=1.0, similarity_fct=dot_score)
    torch.testing.assert_close(got.compute_loss_from_embeddings(embeddings), want.compute_loss_from_embeddings(embeddings, None))
    want = st_losses.TripletLoss(_Dim(), distance_metric=st_losses.TripletDistanceMetric.COSINE, triplet_margin=0.5)
    got = losses.TripletLoss(_Dim(), distance_metric=losses.TripletDistanceMetric.COSINE, triplet_margin=0.5)
    torch.testing.assert_close(got.compute_loss_from_embeddings(embeddings), want.compute_loss_from_embeddings(embeddings, None))


def test_batch_cosine_distance_is_zero_to_itself_and_never_negative_as_sentence_transformers_6_3():
    """BatchHardTripletLossDistanceFunction.cosine_distance: 1 - cosine clamped at 0 with an exact 0 diagonal, as
    sentence-transformers 6.3 computes it; before, rounding left a text 2.4e-7 from itself and a duplicated text
    -2.4e-7 from its copy. The four batch losses on it equal sentence-transformers'."""
    g = torch.Generator().manual_seed(2)
    x = torch.randn(8, 16, generator=g)
    x[5] = x[1]  # a duplicated text
    raw = 1 - st.util.cos_sim(x, x)
    assert raw.diagonal().abs().max() > 0 and raw.min() < 0  # what the clamp and the diagonal change, in this batch
    got = losses.BatchHardTripletLossDistanceFunction.cosine_distance(x)
    assert torch.equal(got, st_losses.BatchHardTripletLossDistanceFunction.cosine_distance(x))
    assert got.min() == 0 and not got.diagonal().any()
    labels = torch.tensor([0, 1, 0, 1, 2, 1, 2, 0])
    for name in ("BatchHardTripletLoss", "BatchHardSoftMarginTripletLoss", "BatchAllTripletLoss",
                 "BatchSemiHardTripletLoss"):
        want = getattr(st_losses, name)(_Dim(), distance_metric=st_losses.BatchHardTripletLossDistanceFunction
                                        .cosine_distance).compute_loss_from_embeddings([x], labels)
        ours = getattr(losses, name)(_Dim(), distance_metric=losses.BatchHardTripletLossDistanceFunction.cosine_distance)
        torch.testing.assert_close(ours.compute_loss_from_embeddings([x], labels), want, atol=1e-7, rtol=0)


@pytest.mark.parametrize("metric", ["EUCLIDEAN", "MANHATTAN", "COSINE"])
def test_triplet_gradients_where_anchor_and_positive_are_the_same_text(metric):
    """A duplicate (the same text as anchor and positive) has distance 0; its gradient is sentence-transformers'
    (0 for the Euclidean distance, where the square root's is infinite), not NaN for every parameter."""
    want_leaves, got_leaves = ([e.clone().requires_grad_() for e in _embeddings(3)] for _ in range(2))
    for leaves in (want_leaves, got_leaves):
        leaves[1].data[:3] = leaves[0].data[:3]  # rows 0-2: anchor == positive
    want = st_losses.TripletLoss(_Dim(), distance_metric=getattr(st_losses.TripletDistanceMetric, metric),
                                 triplet_margin=50.0).compute_loss_from_embeddings(want_leaves, None)
    got = losses.TripletLoss(_Dim(), distance_metric=getattr(losses.TripletDistanceMetric, metric),
                             triplet_margin=50.0).compute_loss_from_embeddings(got_leaves, None)
    want.backward()
    got.backward()
    torch.testing.assert_close(got, want)
    for g, w in zip(got_leaves, want_leaves):
        assert not g.grad.isnan().any()
        torch.testing.assert_close(g.grad, w.grad, atol=1e-6, rtol=1e-6)


@pytest.fixture(scope="module")
def model(tmp_path_factory, minilm_2_layers):
    return SentenceTransformer(st_directory(minilm_2_layers, tmp_path_factory.mktemp("st") / "m"))


def test_matryoshka_follows_sentence_transformers_6_3(model, tmp_path):
    """MatryoshkaLoss as sentence-transformers 6.3 has it: its dims are checked against the width the forward pass
    gives, not a saved truncate_dim (which cuts encode's output only: a model saved with truncate_dim=64 had every
    larger dimension refused); half-precision embeddings are cut and normalised in float32, then put back in their
    type (normalised in bfloat16, the loss came out 14.5363 for 6.3's 14.5170 on these embeddings)."""
    from sentence_transformers.sentence_transformer.losses.matryoshka import shrink

    saved = tmp_path / "truncated"
    model.save(str(saved))
    config = json.loads((saved / "config_sentence_transformers.json").read_text())
    (saved / "config_sentence_transformers.json").write_text(json.dumps({**config, "truncate_dim": 64}))
    truncated = SentenceTransformer(str(saved))
    assert truncated.get_embedding_dimension() == 64
    assert losses.MatryoshkaLoss(truncated, losses.CoSENTLoss(truncated), [384, 128, 64]).matryoshka_dims == (384, 128, 64)
    g = torch.Generator().manual_seed(0)
    embeddings = [(torch.randn(6, 16, generator=g) * 40).bfloat16() for _ in range(2)]
    labels = torch.tensor([0.1, 0.9, 0.5, 0.5, 0.0, 1.0])
    inner = losses.CoSENTLoss(_Dim())
    got = losses.MatryoshkaLoss(_Dim(), inner, [16, 4]).compute_loss_from_embeddings(embeddings, labels)
    want = sum(inner.compute_loss_from_embeddings([shrink(e, d) for e in embeddings], labels) for d in (16, 4))
    assert got.item() == want.item()


def _features(model, columns):
    return [model.tokenize(texts) for texts in columns]


TRIPLES = [["what is the capital of france", "who wrote hamlet", "how tall is everest", "speed of light",
            "largest ocean", "first man on the moon", "boiling point of water"],
           ["Paris is the capital of France.", "Hamlet was written by Shakespeare.", "Everest is 8,849 m high.",
            "Light travels at 299,792 km/s.", "The Pacific is the largest ocean.", "Neil Armstrong, 1969.",
            "Water boils at 100 degrees Celsius at sea level."],
           ["Berlin is in Germany.", "Macbeth is a tragedy.", "K2 is the second highest.", "Sound is slower.",
            "The Atlantic is second.", "Buzz Aldrin was second.", "Ice melts at 0 degrees."]]


def _loss_and_grads(model, loss, columns):
    model.zero_grad(set_to_none=True)
    value = loss(_features(model, columns), None)
    value.backward()
    return value.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("wrap", slow_after([False, True]), ids=["mnrl", "matryoshka"])
def test_cached_loss_has_the_uncached_gradients(model, wrap):
    model.train()  # dropout on: the cached loss must replay it per mini-batch
    plain = losses.MultipleNegativesRankingLoss(model)
    cached = losses.CachedMultipleNegativesRankingLoss(model, mini_batch_size=3)  # 7 rows: 3 + 3 + 1
    if wrap:
        plain = losses.MatryoshkaLoss(model, plain, [384, 64, 16], [1.0, 0.5, 0.25])
        cached = losses.MatryoshkaLoss(model, cached, [384, 64, 16], [1.0, 0.5, 0.25])
    for m in model.modules():  # the same dropout masks in both runs needs the same draws: switch dropout off
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    want, want_grads = _loss_and_grads(model, plain, TRIPLES)
    got, got_grads = _loss_and_grads(model, cached, TRIPLES)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)
    assert got_grads.keys() == want_grads.keys() and len(got_grads) == 5 + 2 * 16  # embeddings and 2 layers: all but the pooler
    _assert_same_gradient(got_grads, want_grads)
    model.zero_grad(set_to_none=True)


def _assert_same_gradient(got: dict, want: dict) -> None:
    """The whole gradient within float32 summation noise: 1e-5 of its norm overall, and per parameter 1e-4 of
    the largest entry (attention's key biases have a gradient of zero, up to noise, so no relative test each)."""
    flat_got = torch.cat([got[n].flatten() for n in want])
    flat_want = torch.cat([want[n].flatten() for n in want])
    assert (flat_got - flat_want).norm() <= 1e-5 * flat_want.norm()
    scale = flat_want.abs().max()
    for name in want:
        torch.testing.assert_close(got[name], want[name], atol=1e-4 * scale, rtol=0, msg=name)


def test_cached_loss_replays_dropout(model):
    """With dropout on, the re-embedding draws the masks of the first pass: the gradient equals the uncached
    loss's when both start from the same random state."""
    model.train()
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.1
    cached = losses.CachedMultipleNegativesRankingLoss(model, mini_batch_size=7)  # one mini-batch per column
    plain = losses.MultipleNegativesRankingLoss(model)
    # the uncached loss embeds the columns in one merged batch; per column it draws as the cached loss does
    torch.manual_seed(0)
    got, got_grads = _loss_and_grads(model, cached, TRIPLES[:2])
    torch.manual_seed(0)
    features = _features(model, TRIPLES[:2])
    model.zero_grad(set_to_none=True)
    value = plain.compute_loss_from_embeddings([model.embed(f["input_ids"], f["attention_mask"], f["token_type_ids"])
                                                for f in features])
    value.backward()
    torch.testing.assert_close(got, value.detach(), atol=1e-6, rtol=1e-6)
    _assert_same_gradient(got_grads, {n: p.grad for n, p in model.named_parameters() if p.grad is not None})
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    model.zero_grad(set_to_none=True)
    model.eval()


@pytest.mark.parametrize("name,labels", [("MSELoss", (7, 384)), ("EmbedDistillLoss", (7, 384)),
                                         ("EmbedDistillLoss", (7, 2, 384))])
def test_matryoshka_distillation_cuts_the_teacher_as_sentence_transformers(model, name, labels):
    """MatryoshkaLoss over a distillation loss: the teacher's embeddings (the labels) are cut to each width too (they
    were compared whole with the cut student's, and refused)."""
    teacher = torch.randn(*labels, generator=torch.Generator().manual_seed(3))
    ref = st.SentenceTransformer(model.name_or_path, device="cpu").eval()
    with torch.no_grad():
        got = losses.MatryoshkaLoss(model, getattr(losses, name)(model), [384, 64, 16])(
            _features(model, TRIPLES[:2]), teacher)
        want = st_losses.MatryoshkaLoss(ref, getattr(st_losses, name)(ref), [384, 64, 16])(
            [ref.tokenize(texts) for texts in TRIPLES[:2]], teacher)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_bad_arguments_are_named(model):
    with pytest.raises(BertkitError, match=r"matryoshka_dims \[768, 64\] must be whole numbers in \[1, 384\]"):
        losses.MatryoshkaLoss(model, losses.MultipleNegativesRankingLoss(model), [768, 64])
    # both reached training: a NaN weight made every step's loss NaN without a word (in sentence-transformers too),
    # a float n_dims_per_step stopped the first step with "can't multiply sequence by non-int of type 'float'"
    mnrl = losses.MultipleNegativesRankingLoss(model)
    with pytest.raises(BertkitError, match=r"MatryoshkaLoss: matryoshka_weights \[1, nan\] must be finite numbers"):
        losses.MatryoshkaLoss(model, mnrl, [384, 64], [1, float("nan")])
    for n in (1.5, "2", True):
        with pytest.raises(BertkitError, match=rf"MatryoshkaLoss: n_dims_per_step {n!r} must be a whole number \(k > 0 "
                                               r"draws k of the dimensions a step; 0 or less takes them all\)"):
            losses.MatryoshkaLoss(model, mnrl, [384, 64], n_dims_per_step=n)
    assert losses.MatryoshkaLoss(model, mnrl, [384, 64], n_dims_per_step=-5)._dims() == [0, 1]  # all, as there
    with pytest.raises(BertkitError, match="mini_batch_size"):
        losses.CachedMultipleNegativesRankingLoss(model, mini_batch_size=0)
    with pytest.raises(BertkitError, match=r"CachedMultipleNegativesRankingLoss\(mini_batch_num_tokens=4096\) is not impl"):
        losses.CachedMultipleNegativesRankingLoss(model, mini_batch_num_tokens=4096)
    with pytest.raises(BertkitError, match="hardness_mode 'hard' is not one of"):  # a ValueError there
        losses.MultipleNegativesRankingLoss(model, hardness_mode="hard", hardness_strength=1.0)
    for bad in (-1.0, float("nan"), "5"):
        with pytest.raises(BertkitError, match=r"hardness_strength must be a finite number >= 0, got"):
            losses.CachedMultipleNegativesRankingLoss(model, hardness_mode="all_negatives", hardness_strength=bad)
    with pytest.raises(BertkitError, match="GISTEmbedLoss: temperature must be a positive finite number, got inf"):
        losses.GISTEmbedLoss(model, model, temperature=float("inf"))  # every logit 0: a constant loss
    with pytest.raises(BertkitError, match="needs one label per row"):
        losses.CoSENTLoss(model).compute_loss_from_embeddings(_embeddings(2), None)


def test_importing_a_loss_bertkit_does_not_implement_names_what_to_use():
    """A ported script's `from ... import` shows the advice (an AttributeError would become "cannot import name")."""
    with pytest.raises(BertkitError, match="DenoisingAutoEncoderLoss is not implemented in bertkit: adapt the encoder"):
        from bertkit.sentence.losses import DenoisingAutoEncoderLoss  # noqa: F401
    for name in set(st_losses.__all__) - set(losses.__all__):  # each of sentence-transformers' names, helpers too
        with pytest.raises(BertkitError, match=f"losses.{name} is not implemented in bertkit: "):
            getattr(losses, name)


@pytest.mark.parametrize("name,columns,labels", [
    ("MarginMSELoss", 3, torch.tensor([0.3, -1.2, 2.0, 0.0, 5.1, -0.4])),
    ("DistillKLDivLoss", 3, torch.arange(12.0).reshape(6, 2).cos() * 3)])
def test_a_matrix_similarity_in_a_distillation_loss_is_refused(name, columns, labels):
    """Was: cos_sim's (B, B) scores broadcast against the (B, 1) margins into a loss of other pairs, with only torch's
    broadcasting warning (MarginMSELoss), or failed inside torch."""
    from bertkit.sentence.util import cos_sim

    loss = getattr(losses, name)(_Dim(), similarity_fct=cos_sim)
    with pytest.raises(BertkitError, match=rf"{name}: similarity_fct gave scores of the shape \(6, 6\) for 6 pairs"):
        loss.compute_loss_from_embeddings(_embeddings(columns), labels)


CLS = {"word_embedding_dimension": 384, "pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False}
# (name, arguments, columns): each built in both libraries; a guide (GIST) is the model pooled on [CLS], so it scores
# other pairs as false negatives than the mean-pooled model would
TWINS = [  # each loss's second configuration in `make test-slow`
    ("CachedMultipleNegativesSymmetricRankingLoss", {"mini_batch_size": 3}, 3),
    ("CachedGISTEmbedLoss", {"mini_batch_size": 4, "margin": 0.05}, 3),
    ("MegaBatchMarginLoss", {"mini_batch_size": 3}, 2),
    ("GlobalOrthogonalRegularizationLoss", {}, 1),
    ("CachedMultipleNegativesRankingLoss", {"mini_batch_size": 4, "hardness_mode": "hard_negatives",
                                            "hardness_strength": 5.0}, 3),
    *slow_after([
        ("CachedGISTEmbedLoss", {"mini_batch_size": 3, "margin_strategy": "relative", "margin": 0.1,
                                 "contrast_anchors": False}, 2),
        ("MegaBatchMarginLoss", {"use_mini_batched_version": False, "positive_margin": 0.95, "negative_margin": 0.1}, 2),
        ("GlobalOrthogonalRegularizationLoss", {"aggregation": "sum", "mean_weight": 2.0, "second_moment_weight": 0.5},
         3)], keep=0),
]
# each cached loss's uncached twin in bertkit (and the arguments it lacks): the same value and gradients with
# mini-batches smaller than the batch
UNCACHED = {"CachedMultipleNegativesSymmetricRankingLoss": "MultipleNegativesSymmetricRankingLoss",
            "CachedGISTEmbedLoss": "GISTEmbedLoss", "MegaBatchMarginLoss": "MegaBatchMarginLoss"}


@pytest.fixture(scope="module")
def twins(tmp_path_factory, minilm_2_layers, tiny_checkpoint, data_dir):
    """A tiny random encoder with MiniLM's tokenizer (dropout 0) in both libraries, a [CLS]-pooled guide in both, and
    10 SQuAD questions, their answer sentences and another sentence of the paragraph. The losses' code sees only the
    embeddings: MiniLM's 384-wide layers were most of these tests' time. Drawn at 0.5 rather than 0.02, the 30
    texts' cosines spread from 0.22 (mean 0.76) rather than from 0.70 (mean 0.93): the hardest negatives and the
    guide's false negatives are picked by clear margins, alike in both libraries."""
    out = tmp_path_factory.mktemp("twins")
    base = tiny_checkpoint(out / "base", tokenizer=minilm_2_layers, hidden_dropout_prob=0.0,
                           attention_probs_dropout_prob=0.0, initializer_range=0.5)
    width = {"word_embedding_dimension": 32}
    model_dir = st_directory(base, out / "m", dropout=0.0, max_seq_length=48, pooling={**POOLING, **width})
    guide_dir = st_directory(base, out / "g", pooling={**CLS, **width}, max_seq_length=48)
    rows = squad_rerank(data_dir, 0, 10)
    columns = [[r["query"] for r in rows], [r["positive"] for r in rows], [r["negatives"][0] for r in rows]]
    return (SentenceTransformer(model_dir).train(), st.SentenceTransformer(str(model_dir), device="cpu").train(),
            SentenceTransformer(guide_dir), st.SentenceTransformer(str(guide_dir), device="cpu"), columns)


def _value_and_grads(model, loss, columns):
    model.zero_grad(set_to_none=True)
    value = loss([model.tokenize(texts) for texts in columns], None)
    terms = {k: v.item() for k, v in value.items()} if isinstance(value, dict) else {}
    value = sum(value.values()) if isinstance(value, dict) else value
    value.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return value.detach(), terms, grads


@pytest.mark.parametrize("name,kwargs,columns", TWINS)
def test_ported_losses_give_sentence_transformers_values_and_gradients(twins, name, kwargs, columns):
    """The losses a ported script met as "not implemented" give sentence-transformers' value (and terms) and
    gradients on real rows, and each cached loss, in mini-batches smaller than the batch, its uncached twin's."""
    import warnings

    model, ref, guide, ref_guide, texts = twins
    guided = name == "CachedGISTEmbedLoss"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # the symmetric loss's, in sentence-transformers
        want_loss = getattr(st_losses, name)(ref, *[ref_guide] * guided, **kwargs)
    got_loss = getattr(losses, name)(model, *[guide] * guided, **kwargs)
    texts = texts[:columns]
    want, want_terms, want_grads = _value_and_grads(ref, want_loss, texts)
    got, got_terms, got_grads = _value_and_grads(model, got_loss, texts)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert got_terms == pytest.approx(want_terms, rel=1e-5)
    assert got_grads.keys() == want_grads.keys() and len(got_grads) > 30
    _assert_same_gradient(got_grads, want_grads)
    if name in UNCACHED:
        plain = {k: v for k, v in kwargs.items() if k != "mini_batch_size" or name == "MegaBatchMarginLoss"}
        if name == "MegaBatchMarginLoss":
            plain["use_mini_batched_version"] = not kwargs.get("use_mini_batched_version", True)
        twin = getattr(losses, UNCACHED[name])(model, *[guide] * guided, **plain)
        uncached, _, uncached_grads = _value_and_grads(model, twin, texts)
        torch.testing.assert_close(got, uncached, atol=1e-5, rtol=1e-5)
        _assert_same_gradient(got_grads, uncached_grads)
        with torch.no_grad():  # evaluation: the value, in mini-batches
            torch.testing.assert_close(got_loss([model.tokenize(t) for t in texts], None), want, atol=1e-5, rtol=1e-5)


def test_ported_losses_name_bad_arguments(model):
    for name in ("CachedMultipleNegativesSymmetricRankingLoss", "MegaBatchMarginLoss"):
        for bad in (0, 2.5, "8", None):
            with pytest.raises(BertkitError, match=rf"{name}: mini_batch_size must be a whole number >= 1, got "
                                                   rf"{re.escape(repr(bad))}"):
                getattr(losses, name)(model, mini_batch_size=bad)
    with pytest.raises(BertkitError, match=r"CachedGISTEmbedLoss\(mini_batch_num_tokens=512\) is not implemented"):
        losses.CachedGISTEmbedLoss(model, model, mini_batch_num_tokens=512)
    with pytest.raises(BertkitError, match="MegaBatchMarginLoss: positive_margin must be a finite number .*got '0.8'"):
        losses.MegaBatchMarginLoss(model, positive_margin="0.8")
    with pytest.raises(BertkitError, match="GlobalOrthogonalRegularizationLoss: mean_weight and second_moment_weight "
                                           "are both 0/None, leaving no term; give one a weight"):
        losses.GlobalOrthogonalRegularizationLoss(model, mean_weight=0, second_moment_weight=None)
    with pytest.raises(BertkitError, match="aggregation must be 'mean' or 'sum', got 'max'"):
        losses.GlobalOrthogonalRegularizationLoss(model, aggregation="max")
    with pytest.raises(BertkitError, match=r"MegaBatchMarginLoss takes 2 text column\(s\), got a batch of 3"):
        losses.MegaBatchMarginLoss(model, mini_batch_size=2)([model.tokenize(["a", "b"])] * 3, None)



def _squad_pairs(data_dir) -> list[tuple[str, str]]:
    """(question, the first 160 characters of its paragraph) for 2 questions of each of SQuAD dev's first 20
    paragraphs: a paragraph is the positive of two rows."""
    path = data_dir / "squad" / "dev-v1.1.json"
    if not path.is_file():
        pytest.skip(f"{path} absent")
    paragraphs = json.loads(path.read_text())["data"][0]["paragraphs"][:20]
    return [(q["question"], p["context"][:160]) for p in paragraphs for q in p["qas"][:2]]


def test_a_prompted_anchor_leaves_the_candidates_embedded_together(tmp_path, minilm_2_layers, data_dir):
    """A prompt on the anchor column alone (prompts={"anchor": ...}) made every column run on its own, so a text in
    both the positive and the negative column (of another width) came out a rounding apart; GISTEmbedLoss's strict
    ``>`` on the guide's scores then masked that negative where sentence-transformers (whose candidate columns run
    merged) keeps it: 4 training steps gave losses up to 19% apart. The candidates now run merged, bit for bit
    alike, and the loss is sentence-transformers'."""
    from bertkit.sentence.losses.base import embed_columns

    model_dir = st_directory(minilm_2_layers, tmp_path / "m", dropout=0.0, max_seq_length=64)
    guide_dir = st_directory(minilm_2_layers, tmp_path / "g", dropout=0.0, max_seq_length=64, normalize=False)
    model, guide = SentenceTransformer(model_dir), SentenceTransformer(guide_dir)
    ref = st.SentenceTransformer(str(model_dir), device="cpu")
    ref_guide = st.SentenceTransformer(str(guide_dir), device="cpu")
    pairs = _squad_pairs(data_dir)
    # a batch sentence-transformers' trainer drew (seed 42) of (question, its paragraph, the paragraph 7 pairs on): the
    # negatives of rows 1 and 6 are the positives of rows 2 and 4, in a column of another width
    batch = [6, 15, 22, 2, 10, 19, 3, 18]
    queries, positives = [pairs[i][0] for i in batch], [pairs[i][1] for i in batch]
    negatives = [pairs[(i + 7) % len(pairs)][1] for i in batch]
    columns = [(queries, "query: "), (positives, None), (negatives, None)]
    got_features = [model.tokenize(texts, prompt=prompt) for texts, prompt in columns]
    want_features = [ref.preprocess(texts, prompt=prompt) for texts, prompt in columns]
    assert got_features[1]["input_ids"].shape[1] != got_features[2]["input_ids"].shape[1]
    with torch.no_grad():
        _, pos, neg = embed_columns(guide, got_features)
        assert torch.equal(neg[1], pos[2]) and torch.equal(neg[6], pos[4])
        got = losses.GISTEmbedLoss(model, guide)(got_features, None)
        want = st_losses.GISTEmbedLoss(ref, ref_guide)(want_features, None)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_cached_gist_masks_the_guides_near_ties_as_sentence_transformers(tmp_path, minilm_2_layers, data_dir):
    """A text in two mini-batches of other widths embeds a rounding apart, so the guide scores it against an anchor
    within a unit in the last place of the anchor's own positive: the strict ``>`` that masks false negatives then
    turns on how the score is rounded. Scored by a matrix product, rows 2 and 5's shared paragraph stayed in the
    softmax where sentence-transformers (torch's cosine_similarity) masks it: the 4th step of a CachedGISTEmbedLoss
    run with a prompt on every column and a pooling that leaves it out was 0.548 against 0.462. The guide's scores
    are now computed as there."""
    pooling = {**POOLING, "include_prompt": False}
    model_dir = st_directory(minilm_2_layers, tmp_path / "m", pooling=pooling, dropout=0.0, max_seq_length=64)
    model, ref = SentenceTransformer(model_dir), st.SentenceTransformer(str(model_dir), device="cpu")
    pairs = _squad_pairs(data_dir)
    # the 4th batch sentence-transformers' trainer drew (seed 42) of (question, its paragraph, the paragraph 7 pairs on)
    batch = [4, 12, 7, 22, 9, 6, 5, 20]
    columns = [[pairs[i][0] for i in batch], [pairs[i][1] for i in batch],
               [pairs[(i + 7) % len(pairs)][1] for i in batch]]
    assert columns[1][2] == columns[1][5]  # one paragraph, in the mini-batches of rows 0-2 and 3-5
    got_features = [model.tokenize(texts, prompt="query: ") for texts in columns]
    want_features = [ref.preprocess(texts, prompt="query: ") for texts in columns]
    with torch.no_grad():
        # the model guides itself: an untrained model's guide is a copy of it
        got = losses.CachedGISTEmbedLoss(model, model, mini_batch_size=3)(got_features, None)
        want = st_losses.CachedGISTEmbedLoss(ref, ref, mini_batch_size=3)(want_features, None)
    torch.testing.assert_close(got, want, atol=0, rtol=1e-5)
