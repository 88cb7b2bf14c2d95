"""TripletEvaluator, RerankingEvaluator and SequentialEvaluator against sentence-transformers' on the same model
(all-MiniLM-L6-v2's first 2 layers, ``minilm_2_layers``, with query and document prompts) and real data: SQuAD
dev questions with their paragraph and other paragraphs of the article, and STS-B dev pairs. Same keys, same numbers; ties in the
rankings (scikit-learn's tie-averaged nDCG and average precision) on fixed embeddings."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from bertkit.errors import BertkitError
from bertkit.sentence import SentenceTransformer, evaluation, util
from cases import slow_after
from sentence_helpers import glue_rows, st_directory

st = pytest.importorskip("sentence_transformers")
st_evaluation = pytest.importorskip("sentence_transformers.sentence_transformer.evaluation")

FNS = ["cosine", "dot", "euclidean", "manhattan"]


@pytest.fixture(scope="module")
def models(tmp_path_factory, minilm_2_layers):
    d = st_directory(minilm_2_layers, tmp_path_factory.mktemp("eval") / "m", max_seq_length=64,
                     st_config={"prompts": {"query": "query: ", "document": "passage: "}})
    return SentenceTransformer(d), st.SentenceTransformer(str(d), device="cpu")


@pytest.fixture(scope="module")
def squad(data_dir):
    """12 questions of one article, each with its paragraph and the next three paragraphs of the article."""
    path = data_dir / "squad" / "dev-v1.1.json"
    if not path.is_file():
        pytest.skip(f"{path} absent")
    paragraphs = json.loads(path.read_text())["data"][2]["paragraphs"][:15]
    return [{"query": p["qas"][0]["question"], "positive": [p["context"]],
             "negative": [paragraphs[(i + j) % 15]["context"] for j in range(1, 4)]}
            for i, p in enumerate(paragraphs[:12])]


@pytest.fixture(scope="module")
def stsb(data_dir):
    rows = glue_rows(data_dir, "STS-B", n=40)
    return [r[7] for r in rows], [r[8] for r in rows], [float(r[9]) / 5 for r in rows]


def _assert_same(got: dict, want: dict, atol: float = 1e-6) -> None:
    assert list(got) == list(want)
    np.testing.assert_allclose([got[k] for k in want], list(want.values()), atol=atol, rtol=0)


def test_triplet_evaluator_matches(models, squad):
    ours, ref = models
    args = ([s["query"] for s in squad], [s["positive"][0] for s in squad], [s["negative"][0] for s in squad])
    for kwargs in ({"similarity_fn_names": FNS, "margin": {"cosine": 0.05, "euclidean": 0.1}, "name": "squad"},
                   {"main_similarity_function": "dot", "margin": 0.005, "truncate_dim": 64}):
        want_eval = st_evaluation.TripletEvaluator(*args, **kwargs)
        got_eval = evaluation.TripletEvaluator(*args, **kwargs)
        want, got = want_eval(ref), got_eval(ours)
        _assert_same(got, want)
        assert got_eval.primary_metric == want_eval.primary_metric
    assert got["dot_accuracy"] == pytest.approx(5 / 12)  # measured: 64 dimensions and the margin fail 7 of 12 (5 without it)


def test_reranking_evaluator_matches(models, squad):
    ours, ref = models
    for kwargs in ({"name": "squad"}, {"at_k": 3, "truncate_dim": 32}):
        want_eval = st_evaluation.RerankingEvaluator(squad, **kwargs)
        got_eval = evaluation.RerankingEvaluator(squad, **kwargs)
        want, got = want_eval(ref), got_eval(ours)
        _assert_same(got, want)
        assert got_eval.primary_metric == want_eval.primary_metric
    assert 0.5 < got["map"] < 1


def test_sequential_evaluator_matches(models, squad, stsb):
    ours, ref = models
    queries = {f"q{i}": s["query"] for i, s in enumerate(squad)}
    corpus = {f"p{i}": s["positive"][0] for i, s in enumerate(squad)}
    relevant = {f"q{i}": {f"p{i}"} for i in range(len(squad))}

    def build(lib):
        return [lib.InformationRetrievalEvaluator(queries, corpus, relevant, name="ir"),
                lib.EmbeddingSimilarityEvaluator(*stsb, name="sts"),
                lib.TripletEvaluator([s["query"] for s in squad], [s["positive"][0] for s in squad],
                                     [s["negative"][1] for s in squad], name="triplet")]

    mean = lambda s: sum(s) / len(s)  # noqa: E731
    want = st_evaluation.SequentialEvaluator(build(st_evaluation), main_score_function=mean)(ref)
    got = evaluation.SequentialEvaluator(build(evaluation), main_score_function=mean)(ours)
    _assert_same(got, want)
    assert got["sequential_score"] == pytest.approx((got["ir_cosine_ndcg@10"] + got["sts_spearman_cosine"]
                                                     + got["triplet_cosine_accuracy"]) / 3)
    assert evaluation.SequentialEvaluator([])(ours) == {"sequential_score": 0.0}


class _Fixed:
    """A model whose encode returns fixed embeddings (by text), for comparing evaluators on exact ties; it scores
    with cosine similarity, or the dot product with ``similarity_fn_name="dot"``."""

    def __init__(self, table: dict[str, torch.Tensor], similarity_fn_name: str = "cosine"):
        self.table = table
        self.model_card_data = self  # sentence-transformers' evaluators record their metrics here
        self.similarity_fn_name = similarity_fn_name
        self.similarity = {"cosine": util.cos_sim, "dot": util.dot_score}[similarity_fn_name]

    def set_evaluation_metrics(self, *_):
        pass

    def encode(self, texts, convert_to_tensor=False, normalize_embeddings=False, **_):
        out = torch.stack([self.table[t] for t in texts])
        out = torch.nn.functional.normalize(out, dim=-1) if normalize_embeddings else out
        return out if convert_to_tensor else out.numpy()

    encode_query = encode_document = encode


def test_reranking_ties_match_scikit_learn():
    """Candidates with equal scores (duplicated texts): nDCG shares the tied discounts, AP takes the tied group at
    once, as scikit-learn (through sentence-transformers) does."""
    g = torch.Generator().manual_seed(0)
    texts = [f"t{i}" for i in range(8)]
    table = {t: torch.randn(6, generator=g) for t in texts}
    table["q0"], table["q1"] = torch.randn(6, generator=g), torch.randn(6, generator=g)
    samples = [{"query": "q0", "positive": ["t0", "t3"], "negative": ["t3", "t1", "t2", "t3", "t4"]},
               {"query": "q1", "positive": "t5", "negative": ["t5", "t6", "t7", "t5"]},
               {"query": "q1", "positive": [], "negative": ["t1"]}]  # no positive: left out, as by sentence-transformers
    for at_k in (1, 2, 10, None):  # None: the whole ranking (refused before; sentence-transformers takes it)
        want = st_evaluation.RerankingEvaluator(samples, at_k=at_k)(_Fixed(table))
        got = evaluation.RerankingEvaluator(samples, at_k=at_k)(_Fixed(table))
        _assert_same(got, want, atol=1e-12)


def test_reranking_scores_with_the_models_similarity_by_default():
    """similarity_fct=None, sentence-transformers 6.3's default: the model's own similarity (a dot-product model's dot
    products), where 6.2 and bertkit before scored cosine whatever the model's similarity_fn_name (MAP 0.8333 here
    against the dot product's 0.7500)."""
    g = torch.Generator().manual_seed(3)
    table = {t: torch.randn(6, generator=g) * (1 + i) for i, t in enumerate([f"t{i}" for i in range(6)] + ["q"])}
    samples = [{"query": "q", "positive": ["t0", "t4"], "negative": ["t1", "t2", "t3", "t5"]}]
    model = _Fixed(table, "dot")
    want = st_evaluation.RerankingEvaluator(samples, write_csv=False)(model)
    got = evaluation.RerankingEvaluator(samples, write_csv=False)(model)
    _assert_same(got, want, atol=1e-12)
    cosine = evaluation.RerankingEvaluator(samples, similarity_fct=util.cos_sim, write_csv=False)(model)
    assert (round(got["map"], 4), round(cosine["map"], 4)) == (0.75, 0.8333)


def test_reranking_scores_each_sample_on_a_slice_as_sentence_transformers():
    """Each sample's candidates are a slice of the batch's embeddings, as sentence-transformers takes them: a copy of
    those rows (index_select) sits elsewhere in memory, and at a width no multiple of 8 its dot products came out an
    ulp apart from the slice's, so a text that is both a positive and a negative tied in one and not the other (MAP
    0.5200 against sentence-transformers' 0.5282 here, nDCG@10 0.6370 against 0.6425)."""
    g = torch.Generator().manual_seed(0)
    table = {t: torch.randn(7, generator=g) for t in [f"t{i}" for i in range(8)] + ["q"]}
    samples = [{"query": "q", "positive": ["t0"] * i + ["t1"], "negative": ["t2", "t1", "t3"]} for i in range(8)]
    for fct in (st.util.dot_score, st.util.cos_sim):
        want = st_evaluation.RerankingEvaluator(samples, similarity_fct=fct, write_csv=False)(_Fixed(table))
        got = evaluation.RerankingEvaluator(samples, similarity_fct=fct, write_csv=False)(_Fixed(table))
        _assert_same(got, want, atol=1e-12)


def test_bad_evaluator_input_is_named():
    with pytest.raises(BertkitError, match="3 anchors, 2 positives and 3 negatives"):
        evaluation.TripletEvaluator(["a", "b", "c"], ["p", "q"], ["n", "m", "o"])
    with pytest.raises(BertkitError, match=r"margin has the keys \['cos'\]"):
        evaluation.TripletEvaluator(["a"], ["p"], ["n"], margin={"cos": 0.1})
    # a NaN margin counts every triplet as wrong (accuracy 0.0 in sentence-transformers and, before, in bertkit)
    for margin, shown in ((float("nan"), "'cosine': nan"), ({"dot": float("inf")}, "'dot': inf"),
                          ({"cosine": "0.1"}, "'cosine': '0.1'")):
        with pytest.raises(BertkitError, match=rf"^TripletEvaluator: margin {{{shown}.*}} is not a finite number; "
                                               r"give a number \(0 for none\)$"):
            evaluation.TripletEvaluator(["a"], ["p"], ["n"], margin=margin)
    assert evaluation.TripletEvaluator(["a"], ["p"], ["n"], margin={"cosine": np.float32(0.5)}).margin["cosine"] == 0.5
    with pytest.raises(BertkitError, match=r"sample 0 lacks \['negative'\]"):
        evaluation.RerankingEvaluator([{"query": "q", "positive": ["p"]}])
    with pytest.raises(BertkitError, match="no sample has both a positive and a negative"):
        evaluation.RerankingEvaluator([{"query": "q", "positive": ["p"], "negative": []}])
    with pytest.raises(BertkitError, match=r"relevant document id\(s\) are not in the corpus, e.g. \['d2'\]; add them"):
        evaluation.InformationRetrievalEvaluator({"q": "a question"}, {"d1": "a doc"}, {"q": {"d2"}}, name="ir")


def test_a_text_where_a_list_of_texts_goes_is_refused():
    """A str where a list goes was read as its characters: EmbeddingSimilarityEvaluator("abc", "def", [1, 2, 3])
    gave correlations of 3 one-letter pairs; a relevant id "12" was matched as a substring, so corpus ids "1" and "2"
    counted as relevant (sentence-transformers does both)."""
    for make, what in [(lambda: evaluation.EmbeddingSimilarityEvaluator("abc", "def", [1.0, 2.0, 3.0]), "sentences1"),
                       (lambda: evaluation.TripletEvaluator(["a"], ["p"], {"n"}), "negatives"),
                       (lambda: evaluation.BinaryClassificationEvaluator(["ab"], "x", [1]), "sentences2")]:
        with pytest.raises(BertkitError, match=f"{what} is .*give a list of texts"):
            make()
    with pytest.raises(BertkitError, match=r"relevant_docs\['q'\] is str '12'; give the relevant corpus ids as a set"):
        evaluation.InformationRetrievalEvaluator({"q": "a question"}, {"1": "a", "2": "b", "12": "c"}, {"q": "12"})
    with pytest.raises(BertkitError, match="corpus is list; give a dict"):
        evaluation.InformationRetrievalEvaluator({"q": "a question"}, ["a doc"], {"q": {"0"}})


def test_similarity_gold_scores_that_are_not_finite_are_refused():
    """A NaN gold score made both correlations NaN, as sentence-transformers (scipy) gives them, for every evaluation
    of a run; an infinite one made Pearson NaN and Spearman a number that ranks it highest (0.8 here, as
    sentence-transformers'): each is refused when the evaluator is made, naming the pair."""
    from bertkit.sentence.cross_encoder import evaluation as ce_evaluation

    g = torch.Generator().manual_seed(1)
    table = {t: torch.randn(6, generator=g) for t in ["a0", "a1", "a2", "a3", "b0", "b1", "b2", "b3"]}
    for bad in (float("nan"), float("inf"), None):
        args = (["a0", "a1", "a2", "a3"], ["b0", "b1", "b2", "b3"], [0.9, bad, 0.2, 0.5])
        if bad is not None:
            want = st_evaluation.EmbeddingSimilarityEvaluator(*args)(_Fixed(table))
            assert np.isnan(want["pearson_cosine"]) and (np.isnan(want["spearman_cosine"]) if bad != bad
                                                         else want["spearman_cosine"] == pytest.approx(0.8))
        with pytest.raises(BertkitError, match=rf"^EmbeddingSimilarityEvaluator: gold score 1 is {bad}; a "
                                               "correlation needs a finite number for each pair"):
            evaluation.EmbeddingSimilarityEvaluator(*args)
        with pytest.raises(BertkitError, match=rf"^CrossEncoderCorrelationEvaluator: gold score 1 is {bad}; "):
            ce_evaluation.CrossEncoderCorrelationEvaluator(list(zip(*args[:2])), args[2])


def test_similarity_of_close_scores_is_scipy_pearson():
    """Each sentence against itself: cosine similarities within a float32 rounding of 1, so Pearson rests on those
    roundings; it is scipy's, computed in float64 from the start (the scores' mean taken in float32 gave 0.3822
    here where sentence-transformers gives 0.3953, and 0.1104 against 0.1562 on MiniLM's embeddings of such
    pairs)."""
    g = torch.Generator().manual_seed(0)
    texts = [f"s{i}" for i in range(12)]
    table = {t: torch.randn(384, generator=g) for t in texts}
    args = (texts, texts, [i / 11 for i in range(12)])
    want = st_evaluation.EmbeddingSimilarityEvaluator(*args)(_Fixed(table))
    got = evaluation.EmbeddingSimilarityEvaluator(*args)(_Fixed(table))
    _assert_same(got, want, atol=1e-12)


def _scaled_table(seed: int, keys: list[str]) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {k: torch.randn(4, generator=g) * (0.2 + 2 * torch.rand((), generator=g)) for k in keys}


def test_retrieval_primary_metric_is_chosen_at_the_first_call_and_kept():
    """With several score functions and no main one, the primary metric is the best nDCG at the first call (the
    first by name on a tie), then kept, as sentence-transformers keeps it: a later call where another function
    is better reports the same primary metric, so the SequentialEvaluator's score is that function's nDCG."""
    queries, corpus = {f"q{i}": f"q{i}" for i in range(3)}, {f"d{i}": f"d{i}" for i in range(6)}
    relevant = {f"q{i}": {f"d{i}"} for i in range(3)}
    tables = [_scaled_table(seed, [*queries, *corpus]) for seed in (12, 1)]  # cosine better, then dot better
    functions = {"dot": st.util.dot_score, "cosine": st.util.cos_sim}
    want_ir = st_evaluation.InformationRetrievalEvaluator(queries, corpus, relevant, score_functions=functions,
                                                          ndcg_at_k=[3], name="ir", write_csv=False)
    got_ir = evaluation.InformationRetrievalEvaluator(queries, corpus, relevant, score_functions=functions,
                                                      ndcg_at_k=[3], name="ir")
    want_seq, got_seq = st_evaluation.SequentialEvaluator([want_ir]), evaluation.SequentialEvaluator([got_ir])
    scores = []
    for table in tables:
        want, got = want_seq(_Fixed(table)), got_seq(_Fixed(table))
        assert got_ir.primary_metric == want_ir.primary_metric == "ir_cosine_ndcg@3"
        assert got["sequential_score"] == pytest.approx(want["sequential_score"], abs=1e-6)
        scores.append((got["ir_cosine_ndcg@3"], got["ir_dot_ndcg@3"]))
    assert scores[0][0] > scores[0][1] + 0.1 and scores[1][1] > scores[1][0] + 0.1  # the best function did change
    # a tie (unit vectors: the same rankings) goes to the first function by name, whatever the dict's order
    unit = {k: v / v.norm() for k, v in tables[0].items()}
    tied = evaluation.InformationRetrievalEvaluator(queries, corpus, relevant, score_functions=functions)
    tied_want = st_evaluation.InformationRetrievalEvaluator(queries, corpus, relevant, score_functions=functions,
                                                            write_csv=False)
    tied(_Fixed(unit)), tied_want(_Fixed(unit))
    assert tied.primary_metric == tied_want.primary_metric == "cosine_ndcg@10"


def test_similarity_at_float32_precision_scores_normalized_embeddings():
    """precision="float32" makes sentence-transformers encode normalized (normalize_embeddings=bool(precision)), so
    dot, euclidean and manhattan score unit vectors: bertkit scored the raw embeddings (pearson_dot 0.8458 against
    0.9272 on STS-B dev and MiniLM without its Normalize module)."""
    table = _scaled_table(3, [f"{side}{i}" for side in "ab" for i in range(8)])
    args = ([f"a{i}" for i in range(8)], [f"b{i}" for i in range(8)], [0.1, 0.9, 0.4, 0.3, 0.8, 0.2, 0.6, 0.5])
    for precision in (None, "float32"):
        kwargs = {"precision": precision, "similarity_fn_names": FNS}
        want = st_evaluation.EmbeddingSimilarityEvaluator(*args, **kwargs)(_Fixed(table))
        got = evaluation.EmbeddingSimilarityEvaluator(*args, **kwargs)(_Fixed(table))
        _assert_same(got, want)
        if precision is None:
            raw = got
    assert abs(raw["pearson_dot"] - got["pearson_dot"]) > 0.02  # normalizing did change the dot products


@pytest.mark.parametrize("precision, truncate_dim", slow_after([("int8", 20), ("ubinary", 20), ("uint8", 20), ("binary", 20),
                                                                ("int8", None)], keep=2))
def test_similarity_at_quantized_precisions_matches(models, stsb, precision, truncate_dim, tmp_path):
    """EmbeddingSimilarityEvaluator(precision="int8" / "uint8" / "binary" / "ubinary") was refused as not implemented,
    where sentence-transformers scores the quantized embeddings (int8 buckets from both sides together, bits unpacked;
    40 STS-B dev pairs, MiniLM's first 2 layers at truncate_dim 20: spearman_cosine 0.4299 in int8, 0.4119 in binary,
    0.4923 in float32). 20 dimensions pack into 3 bytes: the 4 padding bits score as sentence-transformers scores them."""
    ours, ref = models
    kwargs = {"precision": precision, "truncate_dim": truncate_dim, "similarity_fn_names": FNS, "name": "sts"}
    want = st_evaluation.EmbeddingSimilarityEvaluator(*stsb, **kwargs)(ref, output_path=str(tmp_path / "st"))
    # on the same model's codes the metrics are sentence-transformers' (within float64 rounding of the correlations)
    _assert_same(evaluation.EmbeddingSimilarityEvaluator(*stsb, **kwargs)(ref), want, atol=1e-8)
    got = evaluation.EmbeddingSimilarityEvaluator(*stsb, **kwargs)(ours, output_path=str(tmp_path / "bk"))
    # bertkit's own model: embeddings within 1e-6 of sentence-transformers' put a few of the 1,600 values in the next
    # int8 bucket (measured: 6.9e-5 on the correlations); bits flip at 0 only, so binary agrees as on one model
    _assert_same(got, want, atol=2e-4 if precision.endswith("int8") else 1e-8)
    name = f"similarity_evaluation_sts_{precision}_results.csv"
    assert (tmp_path / "bk" / name).read_text().splitlines()[0] == (tmp_path / "st" / name).read_text().splitlines()[0]
    with pytest.raises(BertkitError, match=r"precision 'int4' is not one of"):
        evaluation.EmbeddingSimilarityEvaluator(*stsb, precision="int4")


def test_similarity_gold_scores_are_refused_before_encoding_unless_numbers_that_differ():
    """Gold scores given as strings were converted to numbers, where sentence-transformers ranks them as text for
    Spearman; gold scores all equal (one pair included) gave an error only once the model had encoded every pair."""
    for scores, message in (([0.5, "4.0", 2.0], r"score 1 is the string '4.0'; give the gold scores as numbers"),
                            ([3.0, 3.0, 3.0], r"3 gold score\(s\), all equal \(\[3.0, 3.0, 3.0\]\); a correlation"),
                            ([1.0], r"1 gold score\(s\), all equal")):
        with pytest.raises(BertkitError, match=message):
            evaluation.EmbeddingSimilarityEvaluator(["a", "b", "c"][:len(scores)], ["d", "e", "f"][:len(scores)], scores)


def test_similarities_all_equal_are_refused_where_sentence_transformers_reports_nan():
    """Every pair embedded alike: sentence-transformers reports NaN correlations (scipy's constant input); bertkit
    refuses them, as docs/sentence.md says, rather than log a NaN for the run's evaluation."""
    table = {t: torch.ones(4) for t in ["a", "b", "c", "d", "e", "f"]}
    args = (["a", "b", "c"], ["d", "e", "f"], [0.1, 0.5, 0.9])
    want = st_evaluation.EmbeddingSimilarityEvaluator(*args)(_Fixed(table))
    assert np.isnan(want["pearson_cosine"]) and np.isnan(want["spearman_cosine"])
    with pytest.raises(BertkitError, match="a correlation is undefined: the model's similarities or scores are all "
                                           r"equal \(1.0"):
        evaluation.EmbeddingSimilarityEvaluator(*args)(_Fixed(table))


def test_numpy_labels_and_texts_are_taken_as_sentence_transformers_takes_them():
    """A numpy array of labels (a DataFrame column's .values) or of texts stopped bertkit with numpy's "truth value
    of an array is ambiguous"."""
    table = _scaled_table(5, [f"{side}{i}" for side in "apn" for i in range(6)])
    a, p, n = (np.array([f"{side}{i}" for i in range(6)]) for side in "apn")
    labels = np.array([1, 0, 1, 1, 0, 0])
    for make in (lambda e: e.BinaryClassificationEvaluator(a, p, labels, similarity_fn_names=FNS),
                 lambda e: e.TripletEvaluator(a, p, n, similarity_fn_names=FNS)):
        want, got = make(st_evaluation)(_Fixed(table)), make(evaluation)(_Fixed(table))
        _assert_same(got, want, atol=1e-6)


def test_retrieval_cutoffs_keep_their_order_and_are_refused_twice_or_empty():
    """Each metric's keys come in the order its ks are given, as sentence-transformers lists them (bertkit sorted
    them). A k given twice is refused: sentence-transformers counts accuracy@k and MRR@k once per mention (an
    accuracy of 1.49 where 0.74 of the SQuAD questions find their paragraph first). An empty list of ks, or of score
    functions, is refused too (sentence-transformers fails on it once the corpus is encoded)."""
    queries, corpus = {f"q{i}": f"q{i}" for i in range(4)}, {f"d{i}": f"d{i}" for i in range(7)}
    relevant = {f"q{i}": {f"d{i}", f"d{i + 3}"} for i in range(4)}
    table = _scaled_table(2, [*queries, *corpus])
    kwargs = {"score_functions": {"cosine": st.util.cos_sim}, "accuracy_at_k": [5, 1, 3], "precision_recall_at_k": [10, 2], "mrr_at_k": [3, 1], "map_at_k": [4, 2]}
    want = st_evaluation.InformationRetrievalEvaluator(queries, corpus, relevant, write_csv=False, **kwargs)(
        _Fixed(table))
    got = evaluation.InformationRetrievalEvaluator(queries, corpus, relevant, **kwargs)(_Fixed(table))
    _assert_same(got, want, atol=1e-12)
    assert list(got)[:5] == ["cosine_accuracy@5", "cosine_accuracy@1", "cosine_accuracy@3", "cosine_precision@10",
                             "cosine_precision@2"]
    for bad, message in (({"accuracy_at_k": [1, 1, 3]}, r"accuracy_at_k is \[1, 1, 3\]; give a list of different"),
                         ({"map_at_k": []}, r"map_at_k is \[\]; give"), ({"mrr_at_k": [0]}, r"mrr_at_k is \[0\]"),
                         ({"score_functions": {}}, "score_functions is empty"),
                         # a lone k failed in iterating it (TypeError: 'int' object is not iterable)
                         ({"ndcg_at_k": 10}, r"ndcg_at_k is 10; give a list of different whole numbers >= 1 \(\[10\] "
                                             r"for one\)$")):
        with pytest.raises(BertkitError, match=message):
            evaluation.InformationRetrievalEvaluator(queries, corpus, relevant, **bad)
    # ks in a numpy array or a range, as sentence-transformers iterates them (an array failed in its truth value)
    for ks in (np.array([3, 1]), range(1, 3)):
        want = st_evaluation.InformationRetrievalEvaluator(queries, corpus, relevant, mrr_at_k=ks, write_csv=False,
                                                           score_functions={"cosine": st.util.cos_sim})(_Fixed(table))
        _assert_same(evaluation.InformationRetrievalEvaluator(queries, corpus, relevant, mrr_at_k=ks)(_Fixed(table)),
                     want, atol=1e-12)


def test_retrieval_refuses_a_relevant_document_named_twice_and_ids_of_two_types():
    """Relevant ids in a list that names one twice: sentence-transformers counts it twice in recall@k and the ideal
    nDCG, so the query that finds its one relevant document first has recall@1 0.5 and nDCG@10 0.61, without a
    word; bertkit did the same. It is refused, naming the query and the id."""
    queries, corpus = {"q0": "q0", "q1": "q1"}, {f"d{i}": f"d{i}" for i in range(4)}
    table = {t: torch.eye(4)[i % 4] for i, t in enumerate(["d0", "d1", "d2", "d3", "q0", "q1"])}  # q0 is d0, q1 d1
    twice = {"q0": ["d0", "d0"], "q1": {"d1"}}
    want = st_evaluation.InformationRetrievalEvaluator(queries, corpus, twice, write_csv=False,
                                                       score_functions={"cosine": st.util.cos_sim})(_Fixed(table))
    assert (want["cosine_recall@1"], round(want["cosine_ndcg@10"], 4)) == (0.75, 0.8066)  # q0: 0.5 and 0.6131
    with pytest.raises(BertkitError, match=r"^InformationRetrievalEvaluator: relevant_docs\['q0'\] names \['d0'\] "
                                           r"more than once; give the relevant corpus ids as a set \(set\(ids\)\)$"):
        evaluation.InformationRetrievalEvaluator(queries, corpus, twice)
    assert evaluation.InformationRetrievalEvaluator(queries, corpus, {"q0": ["d0"], "q1": ("d1",)})(
        _Fixed(table))["cosine_recall@1"] == 1.0
    # ids of two types, which equal scores are ranked by: a TypeError at the first tie, there as in
    # sentence-transformers ('<' not supported between instances of 'str' and 'int')
    mixed = {1: "d0", "x": "d0", "y": "d1"}
    with pytest.raises(BertkitError, match=r"^InformationRetrievalEvaluator: the corpus ids mix types \(int, str\), "
                                           r"and documents of equal score are ranked by id; give ids of one type"):
        evaluation.InformationRetrievalEvaluator(queries, mixed, {"q0": {1}})


def test_retrieval_scores_the_corpus_a_chunk_at_a_time_as_sentence_transformers():
    """Each document has a copy under another id, in another chunk of corpus_chunk_size documents: scored a chunk at a
    time, a copy and its original may score an ulp apart, which then decides their order, not the corpus id.
    bertkit scored the whole corpus at once (accuracy@1 1.0, the ids deciding every tie, where sentence-transformers
    gives 0.775 at chunks of 7 here); it now scores by chunks as sentence-transformers does."""
    g = torch.Generator().manual_seed(0)
    docs = {f"d{i}": torch.randn(384, generator=g) for i in range(40)}
    table = {f"q{i}": docs[f"d{i}"] + 0.1 * torch.randn(384, generator=g) for i in range(40)} | docs | {
        f"e{i}": docs[f"d{i}"].clone() for i in range(40)}
    queries, relevant = {f"q{i}": f"q{i}" for i in range(40)}, {f"q{i}": {f"d{i}"} for i in range(40)}
    corpus = {k: k for k in [*(f"e{i}" for i in range(40)), *docs]}
    kwargs = {"score_functions": {"cosine": st.util.cos_sim}, "accuracy_at_k": [1, 2], "precision_recall_at_k": [1],
              "mrr_at_k": [2], "ndcg_at_k": [2], "map_at_k": [2]}
    for chunk in (50000, 7, 3):
        want = st_evaluation.InformationRetrievalEvaluator(queries, corpus, relevant, corpus_chunk_size=chunk,
                                                           write_csv=False, **kwargs)(_Fixed(table))
        got = evaluation.InformationRetrievalEvaluator(queries, corpus, relevant, corpus_chunk_size=chunk,
                                                       **kwargs)(_Fixed(table))
        _assert_same(got, want, atol=1e-12)
    with pytest.raises(BertkitError, match="corpus_chunk_size must be a whole number >= 1, got 0"):
        evaluation.InformationRetrievalEvaluator(queries, corpus, relevant, corpus_chunk_size=0)


def test_a_bad_batch_size_is_refused_when_the_evaluator_is_made():
    """Was: accepted until the first call, which for an evaluator given to a trainer comes after eval_steps of
    training and their checkpoints (sparse evaluators inherit the check)."""
    from bertkit.sentence.sparse_encoder import evaluation as sparse

    makers = {
        "InformationRetrievalEvaluator": lambda b: evaluation.InformationRetrievalEvaluator(
            {"q": "a question"}, {"d": "a document"}, {"q": {"d"}}, batch_size=b),
        "EmbeddingSimilarityEvaluator": lambda b: evaluation.EmbeddingSimilarityEvaluator(
            ["a", "c"], ["b", "d"], [1.0, 0.0], batch_size=b),
        "BinaryClassificationEvaluator": lambda b: evaluation.BinaryClassificationEvaluator(
            ["a", "c"], ["b", "d"], [1, 0], batch_size=b),
        "TripletEvaluator": lambda b: evaluation.TripletEvaluator(["a"], ["b"], ["c"], batch_size=b),
        "RerankingEvaluator": lambda b: evaluation.RerankingEvaluator(
            [{"query": "a", "positive": ["b"], "negative": ["c"]}], batch_size=b),
        "ParaphraseMiningEvaluator": lambda b: evaluation.ParaphraseMiningEvaluator({1: "a", 2: "b"}, [(1, 2)], batch_size=b),
        "SparseTripletEvaluator": lambda b: sparse.SparseTripletEvaluator(["a"], ["b"], ["c"], batch_size=b),
    }
    for name, make in makers.items():
        for bad in (0, -1, 2.5, True, "8"):
            with pytest.raises(BertkitError, match=rf"{name}: batch_size {bad!r} must be a whole number >= 1"):
                make(bad)
        assert make(np.int64(4)).batch_size == 4


def test_truncate_dim_is_checked_when_the_evaluator_is_made():
    """truncate_dim 0, -1 or 2.5 was taken and refused only by encode at the first evaluation, after eval_steps of
    training (sentence-transformers slices with it: 0 scores empty vectors, -1 drops the last dimension)."""
    makers = {
        "InformationRetrievalEvaluator": lambda **k: evaluation.InformationRetrievalEvaluator(
            {"q": "a question"}, {"d": "a document"}, {"q": {"d"}}, **k),
        "EmbeddingSimilarityEvaluator": lambda **k: evaluation.EmbeddingSimilarityEvaluator(
            ["a", "c"], ["b", "d"], [1.0, 0.0], **k),
        "BinaryClassificationEvaluator": lambda **k: evaluation.BinaryClassificationEvaluator(
            ["a", "c"], ["b", "d"], [1, 0], **k),
        "TripletEvaluator": lambda **k: evaluation.TripletEvaluator(["a"], ["b"], ["c"], **k),
        "RerankingEvaluator": lambda **k: evaluation.RerankingEvaluator(
            [{"query": "a", "positive": ["b"], "negative": ["c"]}], **k),
        "ParaphraseMiningEvaluator": lambda **k: evaluation.ParaphraseMiningEvaluator({1: "a", 2: "b"}, [(1, 2)], **k),
    }
    for name, make in makers.items():
        for bad in (0, -1, 2.5, True, "8"):
            with pytest.raises(BertkitError, match=rf"{name}: truncate_dim {bad!r} must be a whole number >= 1, or "
                                                   r"None for the model's"):
                make(truncate_dim=bad)
        assert make(truncate_dim=np.int64(4)).truncate_dim == 4 and make().truncate_dim is None
