"""BinaryClassificationEvaluator, ParaphraseMiningEvaluator, util.paraphrase_mining / community_detection and the
cross-encoder classification and correlation evaluators against sentence-transformers' on the same inputs: MRPC
and STS-B dev text, embedded once by MiniLM (2 layers) or given fixed embeddings and scores, with exact ties.
Same keys, same numbers within 1e-6, same thresholds, same pairs and communities in the same order. And every
name of sentence-transformers' evaluation, util and cross-encoder evaluation namespaces is bertkit's, or refused
by name with what to use."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest
import torch

from bertkit.errors import BertkitError
from bertkit.sentence import SentenceTransformer, evaluation, util
from bertkit.sentence.cross_encoder import CrossEncoder
from bertkit.sentence.cross_encoder import evaluation as ce_evaluation
from cross_encoder_helpers import cross_encoder_directory
from sentence_helpers import glue_rows, st_directory

st = pytest.importorskip("sentence_transformers")
st_evaluation = pytest.importorskip("sentence_transformers.sentence_transformer.evaluation")
st_ce_evaluation = pytest.importorskip("sentence_transformers.cross_encoder.evaluation")

FNS = ["cosine", "dot", "euclidean", "manhattan"]


@pytest.fixture(scope="module")
def mrpc(data_dir):
    """MRPC dev: (sentence1, sentence2, label) rows."""
    rows = glue_rows(data_dir, "MRPC")
    return [(r[3], r[4], int(r[0])) for r in rows]


@pytest.fixture(scope="module")
def models(tmp_path_factory, minilm_2_layers):
    d = st_directory(minilm_2_layers, tmp_path_factory.mktemp("pair-eval") / "m", max_seq_length=64)
    return SentenceTransformer(d), st.SentenceTransformer(str(d), device="cpu")


class _Fixed:
    """A model whose encode returns fixed embeddings (by text), for comparing the evaluators alone; it scores with
    cosine similarity, or the dot product with ``similarity_fn_name="dot"``."""

    def __init__(self, table: dict[str, torch.Tensor], similarity_fn_name: str = "cosine"):
        self.table = table
        self.model_card_data = self  # sentence-transformers' evaluators record their metrics here
        self.similarity_fn_name = similarity_fn_name
        self.similarity = {"cosine": util.cos_sim, "dot": util.dot_score}[similarity_fn_name]

    def set_evaluation_metrics(self, *_):
        pass

    def encode(self, texts, convert_to_tensor=False, **_):
        out = torch.stack([self.table[t] for t in texts])
        return out if convert_to_tensor else out.numpy()

    encode_query = encode_document = encode


class _Scores:
    """A cross-encoder whose predict returns fixed scores (by pair): (N,) for one label, (N, labels) otherwise."""

    def __init__(self, table: dict[tuple[str, str], np.ndarray], num_labels: int):
        self.table, self.num_labels = table, num_labels
        self.model_card_data = self

    def set_evaluation_metrics(self, *_):
        pass

    def predict(self, pairs, **_):
        return np.array([self.table[tuple(p)] for p in pairs], dtype=np.float32)


class _CardFor:
    """``model`` for sentence-transformers' evaluators, which record their metrics on the model's card: the model's
    own ``predict`` (with the evaluator's arguments) and ``num_labels``, and a card that records nothing."""

    def __init__(self, model):
        self.predict, self.num_labels, self.model_card_data = model.predict, model.num_labels, self

    def set_evaluation_metrics(self, *_):
        pass


def _assert_same(got: dict, want: dict, atol: float = 1e-6) -> None:
    assert list(got) == list(want)
    np.testing.assert_allclose([got[k] for k in want], [float(v) for v in want.values()], atol=atol, rtol=0)


def _tables(texts: list[str]) -> list[dict[str, torch.Tensor]]:
    """Gaussian embeddings, and small-integer ones whose scores tie across many pairs (the threshold search's
    groups of equal scores)."""
    g = torch.Generator().manual_seed(0)
    gaussian = {t: torch.randn(16, generator=g) for t in texts}
    grid = {t: torch.randint(-1, 2, (3,), generator=g).float() + torch.tensor([0.0, 0.0, 0.5]) for t in texts}
    return [gaussian, grid]


def test_binary_classification_evaluator_matches_on_fixed_embeddings(mrpc):
    s1, s2, labels = (list(c) for c in zip(*mrpc[:120]))
    for table in _tables([*s1, *s2]):
        for kwargs in ({"similarity_fn_names": FNS, "name": "mrpc"}, {}, {"similarity_fn_names": ["manhattan"]}):
            want_eval = st_evaluation.BinaryClassificationEvaluator(s1, s2, labels, write_csv=False, **kwargs)
            got_eval = evaluation.BinaryClassificationEvaluator(s1, s2, labels, **kwargs)
            want, got = want_eval(_Fixed(table)), got_eval(_Fixed(table))
            _assert_same(got, want)
            assert got_eval.primary_metric == want_eval.primary_metric
    assert got_eval.primary_metric == "manhattan_ap"
    grid = _Fixed(table).encode(s1, convert_to_tensor=True), _Fixed(table).encode(s2, convert_to_tensor=True)
    assert len(set(util.pairwise_manhattan_sim(*grid).tolist())) <= 7  # 120 pairs, a handful of distances: ties


@pytest.mark.parametrize("scores, labels", [
    ([0.5, 0.5, 0.5, 0.5], [1, 0, 1, 0]),  # one group of ties: no threshold beats "all dissimilar"
    ([0.9, 0.8, 0.8, 0.1], [0, 0, 0, 1]),  # the best accuracy is "all dissimilar", with its nextafter threshold
    ([1.0, np.nextafter(np.float32(1.0), np.float32(2.0)), 0.2], [0, 1, 0]),  # a midpoint that rounds onto a score
    ([0.3, 0.7, 0.7, 0.2, 0.9], [0, 1, 0, 0, 1]),
])
def test_threshold_search_matches_on_ties(scores, labels):
    scores = np.asarray(scores, dtype=np.float32)
    ours, ref = evaluation.BinaryClassificationEvaluator, st_evaluation.BinaryClassificationEvaluator
    for high in (True, False):
        assert ours.find_best_acc_and_threshold(scores, labels, high) == ref.find_best_acc_and_threshold(
            scores, labels, high)
        assert ours.find_best_f1_and_threshold(scores, labels, high) == ref.find_best_f1_and_threshold(
            scores, labels, high)


def test_binary_classification_evaluator_matches_on_minilm(models, mrpc):
    ours, ref = models
    s1, s2, labels = (list(c) for c in zip(*mrpc[:24]))
    for kwargs in ({"similarity_fn_names": FNS, "name": "mrpc", "truncate_dim": 128},):
        want_eval = st_evaluation.BinaryClassificationEvaluator(s1, s2, labels, write_csv=False, **kwargs)
        got_eval = evaluation.BinaryClassificationEvaluator(s1, s2, labels, **kwargs)
        want, got = want_eval(ref), got_eval(ours)
        _assert_same(got, want)
        assert got_eval.primary_metric == want_eval.primary_metric
    assert 0.5 < got["mrpc_cosine_ap"] < 1


def test_binary_classification_evaluator_refuses_bad_labels():
    with pytest.raises(BertkitError, match=r"label 1 is 2 \(1 such\)"):
        evaluation.BinaryClassificationEvaluator(["a", "b"], ["c", "d"], [0, 2])
    with pytest.raises(BertkitError, match="every label is 0"):
        evaluation.BinaryClassificationEvaluator(["a", "b"], ["c", "d"], [0, 0])
    with pytest.raises(BertkitError, match="2 sentences1, 2 sentences2 and 1 labels"):
        evaluation.BinaryClassificationEvaluator(["a", "b"], ["c", "d"], [1])


@pytest.fixture(scope="module")
def mined_sentences(mrpc, models):
    """100 MRPC sentences, the last 10 repeating earlier ones, and their MiniLM embeddings."""
    sentences = [s for a, b, _ in mrpc[:45] for s in (a, b)]
    sentences += sentences[:6] + sentences[40:44]
    return sentences, models[0].encode(sentences, convert_to_tensor=True)


def test_paraphrase_mining_matches(mined_sentences, models):
    sentences, embeddings = mined_sentences
    ours = models[0]
    assert util.paraphrase_mining(ours, sentences[:30], top_k=2, truncate_dim=64, prompt="q: ") == \
        util.paraphrase_mining_embeddings(ours.encode(sentences[:30], prompt="q: ", convert_to_tensor=True)[:, :64],
                                          top_k=2)
    with pytest.raises(BertkitError, match="corpus_chunk_size must be a whole number >= 1, got 0"):
        util.paraphrase_mining_embeddings(embeddings, corpus_chunk_size=0)
    with pytest.raises(BertkitError, match="max_pairs must be a whole number >= 1, got 0"):  # before encoding (it came after)
        util.paraphrase_mining(_Fixed({}), sentences, max_pairs=0)
    for kwargs in ({}, {"top_k": 3, "max_pairs": 40, "query_chunk_size": 17, "corpus_chunk_size": 23},
                   {"top_k": 1, "max_pairs": 7}, {"score_function": util.dot_score, "top_k": 5}):
        st_kwargs = kwargs | ({"score_function": st.util.dot_score} if "score_function" in kwargs else {})
        want = st.util.paraphrase_mining_embeddings(embeddings, **st_kwargs)
        got = util.paraphrase_mining_embeddings(embeddings, **kwargs)
        assert [p[1:] for p in got] == [p[1:] for p in want]
        np.testing.assert_allclose([p[0] for p in got], [p[0] for p in want], atol=1e-6, rtol=0)
    table = dict(zip(sentences, embeddings))
    want = st.util.paraphrase_mining(_Fixed(table), sentences, top_k=4, max_pairs=50)
    assert util.paraphrase_mining(_Fixed(table), sentences, top_k=4, max_pairs=50) == want
    repeats = {(k, 90 + k) for k in range(6)} | {(40 + k, 96 + k) for k in range(4)}
    assert repeats <= {tuple(p[1:]) for p in want[:12]}  # the repeated sentences come first (so does one of MRPC's)
    grid = _tables(sentences)[1]  # 3-dimensional small-integer embeddings: many pairs share a score
    x = torch.stack([grid[s] for s in sentences])
    for kwargs in ({"top_k": 10, "max_pairs": 100}, {"top_k": 4, "max_pairs": 33, "corpus_chunk_size": 40}):
        want = st.util.paraphrase_mining_embeddings(x, **kwargs)
        assert util.paraphrase_mining_embeddings(x, **kwargs) == want
        assert len({p[0] for p in want}) < len(want) / 4


def test_community_detection_matches(mined_sentences):
    _, embeddings = mined_sentences
    g = torch.Generator().manual_seed(0)
    centres = torch.randn(3, 32, generator=g)
    # 3 clusters of 70, 25 and 12 (over the 50 candidates first sorted per centre), and noise
    clustered = torch.cat([centres[i] + 0.3 * torch.randn(n, 32, generator=g) for i, n in enumerate((70, 25, 12))]
                          + [torch.randn(40, 32, generator=g)])[torch.randperm(147, generator=g)]
    for x, kwargs in ((embeddings, {"threshold": 0.8, "min_community_size": 2}),
                      (embeddings, {"threshold": 0.7, "min_community_size": 3, "batch_size": 16}),
                      (clustered, {"threshold": 0.75, "min_community_size": 10}),
                      (clustered.numpy(), {"threshold": 0.7, "min_community_size": 5, "batch_size": 50})):
        want = st.util.community_detection(x, **kwargs)
        assert util.community_detection(x, **kwargs) == want
        assert len(want) >= 2
    assert [len(c) for c in want][:3] == [70, 25, 12]
    assert util.community_detection(embeddings[:3], min_community_size=5) == []


def test_community_detection_compares_a_threshold_in_the_similarities_type_as_sentence_transformers():
    """sentence-transformers 6.3 compares any threshold with the similarities in their type (float32 here): a numpy
    float64 threshold just above a similarity is rounded onto it and passes it, as a Python float does. 6.2 compared
    it with a centre's similarities in float64, and so did bertkit after it: at the 30 float64 thresholds below, 14
    communities came out otherwise than 6.3's."""
    x = torch.randn(30, 16, generator=torch.Generator().manual_seed(0))
    nearest = util.cos_sim(x, x).fill_diagonal_(-1).max(1).values.tolist()
    found = 0
    for threshold in [np.float64(s) + 1e-12 for s in nearest] + [s + 1e-12 for s in nearest]:
        want = st.util.community_detection(x, threshold=threshold, min_community_size=2)
        assert util.community_detection(x, threshold=threshold, min_community_size=2) == want
        assert want == st.util.community_detection(x, threshold=float(threshold), min_community_size=2)
        found += bool(want)
    assert found == 60


def test_paraphrase_mining_evaluator_matches(mrpc, mined_sentences):
    sentences, embeddings = mined_sentences
    table = dict(zip(sentences, embeddings))
    sentences_map = {f"s{i}": s for i, s in enumerate(dict.fromkeys(sentences))}
    ids = {s: i for i, s in sentences_map.items()}
    duplicates = [(ids[a], ids[b]) for a, b, label in mrpc[:45] if label]
    chained = defaultdict(lambda: defaultdict(bool))  # as sentence-transformers needs it beside a list
    for a, b in (("s0", "s2"), ("s2", "s4"), ("x", "s6"), ("x", "s8")):  # x: an id outside sentences_map
        chained[a][b] = chained[b][a] = True
    for kwargs in ({"duplicates_list": duplicates, "name": "mrpc"},
                   {"duplicates_list": duplicates[:20], "max_pairs": 30, "top_k": 2},
                   {"duplicates_dict": chained, "duplicates_list": duplicates[:5], "add_transitive_closure": True}):
        want_eval = st_evaluation.ParaphraseMiningEvaluator(sentences_map, write_csv=False, **kwargs)
        got_eval = evaluation.ParaphraseMiningEvaluator(sentences_map, **kwargs)
        want, got = want_eval(_Fixed(table)), got_eval(_Fixed(table))
        _assert_same(got, want)
        assert got_eval.primary_metric == want_eval.primary_metric
        assert got_eval.total_num_duplicates == want_eval.total_num_duplicates
    assert 0 < want["average_precision"] < 1


def test_paraphrase_mining_evaluator_mines_with_the_models_similarity():
    """sentence-transformers 6.3 mines the pairs with the model's similarity (a dot-product model's dot products);
    6.2, and bertkit before, with cosine whatever the model's similarity_fn_name (average precision 0.1087 here
    against the dot product's 0.1118)."""
    g = torch.Generator().manual_seed(1)
    table = {f"s{i}": torch.randn(5, generator=g) * (1 + i % 4) for i in range(12)}
    sentences = {i: f"s{i}" for i in range(12)}
    duplicates = [(0, 4), (1, 5), (2, 9), (3, 7)]
    for fn in ("dot", "cosine"):
        want = st_evaluation.ParaphraseMiningEvaluator(sentences, duplicates, write_csv=False)(_Fixed(table, fn))
        got = evaluation.ParaphraseMiningEvaluator(sentences, duplicates)(_Fixed(table, fn))
        _assert_same(got, want)
        assert round(got["average_precision"], 4) == {"dot": 0.1118, "cosine": 0.1087}[fn]


def test_paraphrase_mining_evaluator_refuses_counts_that_are_not_whole_when_made():
    """top_k, max_pairs and the chunk sizes are checked when the evaluator is made (a trainer first runs it after
    steps of training). A max_pairs of 2.5 or NaN mined nothing and reported average precision 0.0, as
    sentence-transformers does, and a chunk size of 2.5 or "3" failed in range() once the sentences were encoded."""
    sentences = {i: f"s{i}" for i in range(6)}
    table = {f"s{i}": torch.eye(3)[i % 3] for i in range(6)}
    assert st_evaluation.ParaphraseMiningEvaluator(sentences, [(0, 3)], max_pairs=float("nan"), write_csv=False)(
        _Fixed(table))["average_precision"] == 0
    for name, value in (("max_pairs", float("nan")), ("max_pairs", 2.5), ("top_k", True), ("query_chunk_size", "3"),
                        ("corpus_chunk_size", None), ("top_k", 0)):
        with pytest.raises(BertkitError, match=rf"^ParaphraseMiningEvaluator: {name} {value!r} must be a whole "
                                               r"number >= 1$"):
            evaluation.ParaphraseMiningEvaluator(sentences, [(0, 3)], **{name: value})
        with pytest.raises(BertkitError, match=rf"^{name} must be a whole number >= 1, got {value!r}$"):
            util.paraphrase_mining_embeddings(torch.eye(3), **{name: value})
    assert evaluation.ParaphraseMiningEvaluator(sentences, [(0, 3)], max_pairs=np.int64(3))(_Fixed(table)) == \
        st_evaluation.ParaphraseMiningEvaluator(sentences, [(0, 3)], max_pairs=3, write_csv=False)(_Fixed(table))


def test_cross_encoder_classification_evaluator_matches(mrpc):
    pairs = [(a, b) for a, b, _ in mrpc[:100]]
    labels = [label for *_, label in mrpc[:100]]
    g = torch.Generator().manual_seed(0)
    one = torch.rand(100, generator=g).numpy()
    tied = np.round(one * 4) / 4  # 5 distinct scores: the thresholds fall between groups of ties
    for scores in (one, tied):
        table = dict(zip(pairs, scores))
        for kwargs in ({}, {"name": "mrpc"}):
            want_eval = st_ce_evaluation.CrossEncoderClassificationEvaluator(pairs, labels, write_csv=False, **kwargs)
            got_eval = ce_evaluation.CrossEncoderClassificationEvaluator(pairs, labels, **kwargs)
            want, got = want_eval(_Scores(table, 1)), got_eval(_Scores(table, 1))
            _assert_same(got, want)
            assert got_eval.primary_metric == want_eval.primary_metric
    three = torch.randn(100, 3, generator=g).numpy()
    labels3 = [(i * 7) % 3 for i in range(100)]
    table = dict(zip(pairs, three))
    want_eval = st_ce_evaluation.CrossEncoderClassificationEvaluator(pairs, labels3, name="nli", write_csv=False)
    got_eval = ce_evaluation.CrossEncoderClassificationEvaluator(pairs, labels3, name="nli")
    _assert_same(got_eval(_Scores(table, 3)), want_eval(_Scores(table, 3)))
    assert got_eval.primary_metric == want_eval.primary_metric == "nli_f1_macro"
    # whole floats (pandas' 1.0) are class ids, as sentence-transformers reads them
    floats = [float(v) for v in labels3]
    _assert_same(ce_evaluation.CrossEncoderClassificationEvaluator(pairs, floats, name="nli")(_Scores(table, 3)),
                 want_eval(_Scores(table, 3)))


def test_cross_encoder_classification_evaluator_refuses_labels_it_cannot_score():
    """A label a several-label model cannot predict (a GLUE test split's -1, a fourth class) or a NaN was scored by
    sentence-transformers as a class never predicted, or as none: F1 macro 0.3 from labels [1, 0, 3, 1, 0] on a
    2-label model, and 0.3 with a NaN in place of the 3. A one-label model's labels that are all 0 have no average
    precision, which sentence-transformers reports as 0.0."""
    pairs = [("q", d) for d in "vwxyz"]
    two = _Scores(dict(zip(pairs, np.eye(2, dtype=np.float32)[[1, 0, 1, 1, 0]])), 2)
    for bad, shown in ((3, "3"), (-1, "-1"), (float("nan"), "nan"), (0.5, "0.5")):
        evaluator = ce_evaluation.CrossEncoderClassificationEvaluator(pairs, [1, 0, bad, 1, 0])
        with pytest.raises(BertkitError, match=rf"^CrossEncoderClassificationEvaluator with a 2-label model: labels "
                                               rf"must be class ids 0 to 1; label 2 is {shown} \(1 such\)$"):
            evaluator(two)
    assert ce_evaluation.CrossEncoderClassificationEvaluator(pairs, [1, 0, 1, 1, 0])(two)["f1_macro"] == 1.0
    # bools are the classes 0 and 1, as for sentence-transformers (and the one-label model): they were refused
    for labels in ([True, False, False, True, False], np.array([True, False, False, True, False])):
        _assert_same(ce_evaluation.CrossEncoderClassificationEvaluator(pairs, labels, write_csv=False)(two),
                     {"f1_macro": 0.8, "f1_micro": 0.8, "f1_weighted": 0.8})
    one = _Scores(dict(zip(pairs, np.array([0.9, 0.1, 0.8, 0.7, 0.2], dtype=np.float32))), 1)
    with pytest.raises(BertkitError, match="^CrossEncoderClassificationEvaluator: every label is 0; average "
                                           "precision needs at least one positive pair"):
        ce_evaluation.CrossEncoderClassificationEvaluator(pairs, [0] * 5)(one)


def test_cross_encoder_evaluators_refuse_pairs_that_are_not_two_texts_and_bad_batch_sizes_when_made():
    """A pair given as one string was split into its characters, and predict refused "input 0 is ['a', ' ', 'd',
    ...]" once the evaluator ran; a pair of one or three texts likewise, and a batch size of 0 only when predicting
    (after steps of training, for the trainer's evaluator). Each is refused when the evaluator is made."""
    for pairs, shown in ((["a dog runs", "b"], "'a dog runs'"), ([("a",), ("b", "c")], r"\('a',\)"),
                         ([("a", "b"), ("a", "b", "c")], r"\('a', 'b', 'c'\)"), ([("a", 1)], r"\('a', 1\)")):
        bad = next(i for i, p in enumerate(pairs) if isinstance(p, str) or len(p) != 2 or not isinstance(p[1], str))
        for make, gold in ((ce_evaluation.CrossEncoderCorrelationEvaluator, [0.1, 0.5]),
                           (ce_evaluation.CrossEncoderClassificationEvaluator, [0, 1])):
            with pytest.raises(BertkitError, match=rf"^{make.__name__}: sentence_pairs\[{bad}\] is {shown}; give "
                                                   r"\(text, text\) pairs$"):
                make(pairs, gold[:len(pairs)])
    samples = [{"query": "q", "positive": ["p"], "negative": ["n"]}]
    for make, args in ((ce_evaluation.CrossEncoderCorrelationEvaluator, ([("a", "b"), ("c", "d")], [0.1, 0.5])),
                       (ce_evaluation.CrossEncoderClassificationEvaluator, ([("a", "b")], [1])),
                       (ce_evaluation.CrossEncoderRerankingEvaluator, (samples,))):
        with pytest.raises(BertkitError, match=rf"^{make.__name__}: batch_size 0 must be a whole number >= 1$"):
            make(*args, batch_size=0)


def test_cross_encoder_correlation_evaluator_matches(data_dir):
    rows = glue_rows(data_dir, "STS-B", n=80)
    pairs, gold = [(r[7], r[8]) for r in rows], [float(r[9]) for r in rows]
    g = torch.Generator().manual_seed(0)
    predicted = np.round(np.asarray(gold) / 5 + 0.3 * torch.rand(80, generator=g).numpy(), 1)  # tied ranks
    # float32 scores within 3e-5 of 0.5, as an untrained cross-encoder's sigmoid gives them: their mean taken in
    # float32 put Pearson 4.2e-6 from scipy's (0.231724 against 0.231728)
    untrained = (0.5 + 3e-5 * torch.rand(80, generator=g) + 1e-6 * torch.tensor(gold)).numpy()
    for scores, kwargs in ((predicted, {}), (predicted, {"name": "sts"}), (untrained, {})):
        table = dict(zip(pairs, scores))
        want_eval = st_ce_evaluation.CrossEncoderCorrelationEvaluator(pairs, gold, write_csv=False, **kwargs)
        got_eval = ce_evaluation.CrossEncoderCorrelationEvaluator(pairs, gold, **kwargs)
        want, got = want_eval(_Scores(table, 1)), got_eval(_Scores(table, 1))
        _assert_same(got, want, atol=1e-9)
        assert got_eval.primary_metric == want_eval.primary_metric
        if kwargs:
            assert 0.5 < got["sts_spearman"] < 1


@pytest.mark.parametrize("ours, reference", [
    (evaluation, st_evaluation), (util, st.util), (ce_evaluation, st_ce_evaluation)])
def test_every_reference_name_is_implemented_or_refused(ours, reference):
    """Each public name of sentence-transformers' namespace is bertkit's, or a BertkitError naming it (never a
    plain AttributeError)."""
    missing = []
    for name in (n for n in reference.__all__ if not n.startswith("_")):
        try:
            getattr(ours, name)
        except BertkitError as e:
            assert f".{name} is not implemented in bertkit: " in str(e)
        except AttributeError:
            missing.append(name)
    assert missing == []


def test_cross_encoder_evaluators_on_minilm(minilm_2_layers, tmp_path, mrpc):
    """On a real one-label cross-encoder the evaluators give sentence-transformers' keys and numbers (1e-6) on the
    same model, bertkit's: sentence-transformers' evaluators run on bertkit's CrossEncoder; and that model's scores
    are sentence-transformers' within the parity tests' tolerance. The two models' metrics are not compared with
    each other: a random head's scores are nearly equal, and their near-zero correlation (pearson 0.0854) moves by
    1e-4 with the scores' last digits, which differ between CPUs (AVX2 and AVX-512 sum in other orders)."""
    pairs, labels = [(a, b) for a, b, _ in mrpc[:16]], [label for *_, label in mrpc[:16]]
    d = cross_encoder_directory(minilm_2_layers, tmp_path / "ce")
    ours, ref = CrossEncoder(d), st.CrossEncoder(str(d))
    np.testing.assert_allclose(ours.predict(pairs), ref.predict(pairs), atol=2e-6, rtol=1e-5)
    want = st_ce_evaluation.CrossEncoderClassificationEvaluator(pairs, labels, name="mrpc", write_csv=False)(
        _CardFor(ours))
    got = ce_evaluation.CrossEncoderClassificationEvaluator(pairs, labels, name="mrpc")(ours)
    _assert_same(got, want)
    gold = [float(i % 5) for i in range(16)]
    want = st_ce_evaluation.CrossEncoderCorrelationEvaluator(pairs, gold, write_csv=False)(_CardFor(ours))
    got = ce_evaluation.CrossEncoderCorrelationEvaluator(pairs, gold)(ours)
    _assert_same(got, want)
    three = _Scores({p: np.zeros(3) for p in pairs}, 3)
    with pytest.raises(BertkitError, match="one score per pair; this model gives 3"):
        ce_evaluation.CrossEncoderCorrelationEvaluator(pairs, gold)(three)
