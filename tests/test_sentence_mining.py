"""util.mine_hard_negatives against sentence-transformers' on the same model and SQuAD dev pairs (questions with
several positives and paragraphs with several questions among them): the same negatives, in the same rows, for
each output format, filter and sampling strategy; more negatives than the corpus holds is refused."""

from __future__ import annotations

import functools
import json
import random

import numpy as np
import pytest

from bertkit.errors import BertkitError
from bertkit.sentence import SentenceTransformer
from bertkit.sentence.util import mine_hard_negatives
from sentence_helpers import st_directory

st = pytest.importorskip("sentence_transformers")
datasets = pytest.importorskip("datasets")


def _memo(encode):
    """Each library's own embeddings, computed once per input (the configurations below share them)."""
    cache = {}

    @functools.wraps(encode)
    def wrapped(texts, **kwargs):
        key = (tuple(texts), repr(sorted(kwargs.items())))
        if key not in cache:
            cache[key] = encode(texts, **kwargs)
        return cache[key]
    return wrapped


@pytest.fixture(scope="module")
def models(tmp_path_factory, minilm_2_layers):
    d = st_directory(minilm_2_layers, tmp_path_factory.mktemp("mine") / "m", max_seq_length=64)
    ours, ref = SentenceTransformer(d), st.SentenceTransformer(str(d), device="cpu")
    for m in (ours, ref):
        m.encode_query, m.encode_document = _memo(m.encode_query), _memo(m.encode_document)
    return ours, ref


@pytest.fixture(scope="module")
def squad(data_dir):
    """(question, paragraph) pairs of one article, two questions per paragraph; two questions repeated with a second
    paragraph (several positives); the next article's paragraphs as an extra corpus."""
    path = data_dir / "squad" / "dev-v1.1.json"
    if not path.is_file():
        pytest.skip(f"{path} absent")
    articles = json.loads(path.read_text())["data"]
    paragraphs = articles[3]["paragraphs"][:16]
    pairs = [{"question": q["question"], "paragraph": p["context"]} for p in paragraphs for q in p["qas"][:2]]
    pairs += [{"question": pairs[0]["question"], "paragraph": paragraphs[5]["context"]},
              {"question": pairs[7]["question"], "paragraph": paragraphs[9]["context"]}]
    return pairs, [p["context"] for p in articles[4]["paragraphs"][:10]]


CASES = [
    {},
    {"output_format": "n-tuple", "range_min": 2, "relative_margin": 0.05, "output_scores": True},
    {"output_format": "labeled-pair", "absolute_margin": 0.0, "max_score": 0.8, "num_negatives": 2},
    {"output_format": "labeled-list", "output_scores": True, "corpus": "extra", "min_score": 0.2},
    {"output_format": "triplet", "output_scores": True, "margin": 0.02, "range_max": 12, "num_negatives": 2},
    {"sampling_strategy": "random", "range_max": 10, "num_negatives": 4, "output_format": "n-tuple"},
    {"include_positives": True, "num_negatives": 4},
    # the anchors in the corpus: an anchor is no negative of itself (sentence-transformers 6.3), and the search is one
    # wider for it
    {"corpus": "with-anchors", "output_format": "n-tuple", "num_negatives": 3, "output_scores": True},
]


@pytest.mark.parametrize("kwargs", CASES)
def test_same_negatives_as_sentence_transformers(models, squad, kwargs):
    ours, ref = models
    pairs, extra = squad
    if "corpus" in kwargs:
        anchors = [p["question"] for p in pairs] if kwargs["corpus"] == "with-anchors" else []
        kwargs = {**kwargs, "corpus": extra + anchors + [p["paragraph"] for p in pairs]}
    random.seed(7)
    want = st.util.mine_hard_negatives(datasets.Dataset.from_list(pairs), ref, verbose=False, **kwargs)
    got = mine_hard_negatives(datasets.Dataset.from_list(pairs), ours, verbose=False, rng=random.Random(7), **kwargs)
    assert isinstance(got, datasets.Dataset) and got.column_names == want.column_names
    assert len(got) == len(want) > len(pairs) // 2
    score_columns = [c for c in want.column_names if c in ("score", "scores")]
    for c in want.column_names:
        if c not in score_columns:
            assert got[c] == want[c], c
    for c in score_columns:
        for g, w in zip(got[c], want[c]):
            np.testing.assert_allclose(np.asarray(g, dtype=float), np.asarray(w, dtype=float), atol=2e-5)
    negatives = [c for c in got.column_names if c.startswith("negative")]
    assert not [row for row in got if row["question"] in [row[c] for c in negatives]]


def test_list_of_dicts_and_refusals(models, squad):
    ours, _ = models
    pairs, _ = squad
    rows = mine_hard_negatives(pairs, ours, num_negatives=1, verbose=False)
    assert isinstance(rows, list) and list(rows[0]) == ["question", "paragraph", "negative"]
    assert all(r["negative"] != r["paragraph"] for r in rows)
    few = pairs[:6]  # 3 paragraphs, so at most 2 negatives beside a question's own paragraph
    with pytest.raises(BertkitError, match="cannot mine 3 negatives per anchor after skipping range_min 0: the corpus "
                                           "holds 3 distinct texts, and up to 1 of them are an anchor's own text and "
                                           "positives, which leaves 2; lower num_negatives"):
        mine_hard_negatives(few, ours, verbose=False)
    with pytest.raises(BertkitError, match="leaves 0"):
        mine_hard_negatives(few, ours, range_min=3, num_negatives=1, range_max=10, verbose=False)
    with pytest.raises(BertkitError, match="use_faiss"):
        mine_hard_negatives(few, ours, use_faiss=True)
    # sentence-transformers' order: cross_encoder, range_min 0, range_max 10 (bertkit's next keyword was max_score)
    with pytest.raises(BertkitError, match=r"reads the others as cross_encoder \('None'\), range_min \('0'\), "
                                           r"range_max \('10'\): pass them by keyword"):
        mine_hard_negatives(pairs, ours, "question", "paragraph", None, None, 0, 10)
    with pytest.raises(BertkitError, match="range_max 4 leave 2 candidates for num_negatives 3"):
        mine_hard_negatives(pairs, ours, range_min=2, range_max=4)
    with pytest.raises(BertkitError, match=r"anchor_column_name 'query' is not a column of the dataset \['question', 'paragraph'\]"):
        mine_hard_negatives(pairs, ours, anchor_column_name="query")



def test_a_dataset_mining_cannot_use_is_refused_before_any_work(models, squad):
    """No rows (bertkit raised max()'s "empty sequence"), the positive column defaulting to the anchor's (bertkit
    mined each anchor against itself as its positive; sentence-transformers raises a KeyError), a margin or score
    that is not a finite number, a range that is not a whole number, and a first column that is not text (the fix
    named is the columns, not filling in a None)."""
    ours, _ = models
    pairs, _ = squad
    with pytest.raises(BertkitError, match=r"the dataset \(columns \['question', 'paragraph'\]\) has no rows"):
        mine_hard_negatives(datasets.Dataset.from_dict({"question": [], "paragraph": []}), ours, verbose=False)
    with pytest.raises(BertkitError, match="anchor_column_name and positive_column_name are both 'paragraph' .*; name "
                                           "the positive column with positive_column_name="):
        mine_hard_negatives(datasets.Dataset.from_list(pairs), ours, anchor_column_name="paragraph", verbose=False)
    for name, value, want in (("relative_margin", float("nan"), "a finite number or None"),
                              ("max_score", "0.8", "a finite number or None"),
                              ("range_min", 1.0, "a whole number >= 0"), ("range_min", -1, "a whole number >= 0")):
        # a NaN margin kept every candidate (as in sentence-transformers); a float range_min failed in torch.topk
        # after the encoding
        with pytest.raises(BertkitError, match=f"{name} must be {want}, got {value!r}"):
            mine_hard_negatives(pairs, ours, verbose=False, **{name: value})
    numbered = [{"id": i, **row} for i, row in enumerate(pairs)]
    with pytest.raises(BertkitError, match=r"row 0, column 'id' is int '0', not a text; name the text columns with "
                                           r"anchor_column_name= and positive_column_name= \(the columns: \['id', "):
        mine_hard_negatives(numbered, ours, verbose=False)


def test_a_mining_left_without_rows_keeps_its_columns(models, squad):
    """Every candidate filtered out (min_score above every score): sentence-transformers' dataset of no rows, with its
    columns; bertkit's had no columns at all, so that ``dataset["negative"]`` or a concatenation failed later."""
    ours, ref = models
    pairs, _ = squad
    for kwargs in ({}, {"output_format": "n-tuple", "output_scores": True, "num_negatives": 2},
                   {"output_format": "labeled-list"}):
        want = st.util.mine_hard_negatives(datasets.Dataset.from_list(pairs), ref, min_score=0.99, verbose=False,
                                           **kwargs)
        got = mine_hard_negatives(datasets.Dataset.from_list(pairs), ours, min_score=0.99, verbose=False, **kwargs)
        assert len(got) == len(want) == 0 and got.column_names == want.column_names, kwargs


def test_as_triplets_false_is_refused_not_mined_as_triplets(models, squad):
    """sentence-transformers' older as_triplets=False asks for n-tuples; bertkit let False through as a default and
    mined triplets. Any value of it is refused, with what to use; the flags whose False is their default still pass."""
    ours, _ = models
    pairs, _ = squad
    for value in (False, True):
        with pytest.raises(BertkitError, match=r"as_triplets=...\) is not implemented in bertkit: use output_format="):
            mine_hard_negatives(pairs, ours, as_triplets=value, verbose=False)
    with pytest.raises(BertkitError, match="output_format='n-tuple', output_scores=True"):
        mine_hard_negatives(pairs, ours, output_format="n-tuple-scores", verbose=False)
    rows = mine_hard_negatives(pairs, ours, num_negatives=1, use_faiss=False, use_multi_process=False, verbose=False)
    assert list(rows[0]) == ["question", "paragraph", "negative"]


@pytest.fixture(scope="module")
def cross_encoders(tmp_path_factory, minilm_2_layers):
    from bertkit.sentence import CrossEncoder
    from cross_encoder_helpers import cross_encoder_directory

    # 2 layers and pairs cut at 64 tokens: the rescoring, not the cross-encoder's depth or a paragraph's length, is
    # what is compared (the pairs of questions and whole paragraphs took 40 s a call at 512)
    directory = cross_encoder_directory(minilm_2_layers, tmp_path_factory.mktemp("mine-ce") / "ce")
    return CrossEncoder(directory, max_length=64), st.CrossEncoder(str(directory), device="cpu", max_length=64)


@pytest.mark.slow  # two libraries' cross-encoders loaded for it: about 5 s
@pytest.mark.parametrize("kwargs", [
    {"max_score": 0.6, "output_scores": True},
    {"output_format": "labeled-list", "min_score": 0.3, "range_min": 2, "num_negatives": 2, "output_scores": True},
    {"output_scores": True},  # no filter: sentence-transformers 6.3 rescores all the same (6.2 did not)
])
def test_cross_encoder_rescores_as_sentence_transformers(models, squad, cross_encoders, kwargs):
    """With a cross-encoder (bertkit's beside sentence-transformers', on the same directory), with or without a filter,
    its scores replace the model's for the candidates and the positives: the same negatives, rows and scores. Five paragraphs'
    questions and the next article's paragraphs: the pairs a cross-encoder scores, both libraries, stay few."""
    (ours, ref), (ours_ce, ref_ce) = models, cross_encoders
    pairs, extra = squad
    pairs, corpus = pairs[:10], extra + [p["paragraph"] for p in pairs[:10]]
    want = st.util.mine_hard_negatives(datasets.Dataset.from_list(pairs), ref, corpus=corpus, verbose=False,
                                       cross_encoder=ref_ce, **kwargs)
    got = mine_hard_negatives(datasets.Dataset.from_list(pairs), ours, corpus=corpus, verbose=False,
                              cross_encoder=ours_ce, **kwargs)
    assert got.column_names == want.column_names and len(got) == len(want) >= len(pairs)
    score = next(c for c in want.column_names if c in ("score", "scores"))
    for c in want.column_names:
        if c != score:
            assert got[c] == want[c], c
    for g, w in zip(got[score], want[score]):
        np.testing.assert_allclose(np.asarray(g, dtype=float), np.asarray(w, dtype=float), atol=2e-5)
