"""Each public call of bertkit.sentence beside sentence-transformers 6's, on the same weights (all-MiniLM-L6-v2's first 2
layers, as a sentence-transformers directory with max_seq_length 256: the calls are compared, not the depth) and the same inputs: every input type ``encode`` takes
(a str, a list, a tuple, a string array, a ``{"text": ...}`` dict, a dataset row and column), every output type
(numpy, tensor, list of tensors), normalisation, precision, truncate_dim, prompts and batch sizes, the edge values
(an empty list, texts past max_seq_length), the similarity functions, quantization, evaluators, mining, cross-encoders,
and directories saved by one library and loaded by the other. Outputs are equal within float rounding, or bertkit
refuses the call by name. The embedding pipeline, ``bertkit predict`` and ``bertkit serve`` give ``encode``'s
vectors for the directory (its max_seq_length and truncate_dim), and /info says what they use."""

from __future__ import annotations

import importlib
import json
import logging
import shutil

import numpy as np
import pytest
import torch

from bertkit.errors import BertkitError
from bertkit.sentence import CrossEncoder, SentenceTransformer, quantize_embeddings, util
from cases import slow_after
from sentence_helpers import POOLING, st_directory

st = pytest.importorskip("sentence_transformers", reason="the reference: pip install -e '.[test-references]'")
st_util = pytest.importorskip("sentence_transformers.util")
datasets = pytest.importorskip("datasets")

LONG = "Sentence embeddings put similar sentences close together and different ones apart. " * 35  # ~455 tokens
TEXTS = ["A man is eating food.", "A man is riding a horse on a sunny beach.", "hi", LONG,
         "Ünïcödé accents and CJK 漢字 too", "The new movie is awesome"]
# TEXTS less LONG, for the calls whose property is not the cut at max_seq_length (an output type, a precision, a
# dimension): LONG pads the batch to 256 tokens, which made each such call cost both encoders about 5 times as much
SHORT = [t for t in TEXTS if t != LONG]
PROMPTS = {"query": "query: ", "passage": "passage: "}


@pytest.fixture(scope="module")
def st_dir(tmp_path_factory, minilm_2_layers):
    return st_directory(minilm_2_layers, tmp_path_factory.mktemp("calls") / "all-MiniLM-L6-v2",
                        st_config={"prompts": PROMPTS})


@pytest.fixture(scope="module")
def tiny_st_dir(tmp_path_factory, minilm_2_layers, tiny_checkpoint):
    """``st_dir`` on a tiny random encoder (32 wide, 512 positions, MiniLM's tokenizer), for the checks of the
    types vectors come back in and of the pooling set on the model, which MiniLM's layers only made slower."""
    out = tmp_path_factory.mktemp("calls-tiny")
    base = tiny_checkpoint(out / "base", tokenizer=minilm_2_layers, max_position_embeddings=512,
                           initializer_range=0.5)
    return st_directory(base, out / "m", pooling={**POOLING, "word_embedding_dimension": 32},
                        st_config={"prompts": PROMPTS})


@pytest.fixture(scope="module")
def models(st_dir):
    return SentenceTransformer(st_dir), st.SentenceTransformer(str(st_dir), device="cpu")


def _same(got, want, atol: float = 2e-5) -> None:
    """The same kind of result (array, tensor, list of tensors), dtype and shape, and the same numbers."""
    assert type(got) is type(want), (type(got), type(want))
    if isinstance(want, list):
        assert len(got) == len(want)
        for g, w in zip(got, want):
            _same(g, w, atol)
        return
    assert got.dtype == want.dtype and tuple(got.shape) == tuple(want.shape), (got.dtype, want.dtype, got.shape,
                                                                               want.shape)
    g, w = (np.asarray(x.float() if isinstance(x, torch.Tensor) else x, dtype=np.float64) for x in (got, want))
    if want.dtype in (np.int8, np.uint8, torch.int8, torch.uint8):
        # measured on TEXTS: up to 13 of 2,304 int8 values one bucket apart (values on a bucket's edge, moved by the
        # two encoders' float rounding; none on an AVX-512 EPYC, nor of SHORT's 1,920); the binary precisions equal
        assert np.abs(g - w).max(initial=0) <= 1 and (g != w).mean() < 0.01
    else:
        np.testing.assert_allclose(g, w, atol=atol, rtol=0)


ENCODE_CASES = [
    (TEXTS[0], {}),
    (TEXTS, {}),
    (tuple(TEXTS[:3]), {}),
    (np.array(TEXTS[:3]), {}),
    ({"text": TEXTS[1]}, {}),  # sentence-transformers 6's text input
    ([{"text": TEXTS[0]}, TEXTS[1]], {}),
    (SHORT, {"convert_to_tensor": True}),
    (TEXTS[2], {"convert_to_tensor": True}),
    (SHORT, {"convert_to_numpy": False}),
    (TEXTS[2], {"convert_to_numpy": False}),
    (TEXTS[:3], {"normalize_embeddings": True, "batch_size": 1}),
    (SHORT, {"truncate_dim": 32, "normalize_embeddings": True, "batch_size": 4}),
    (TEXTS, {"prompt": "Represent this: "}),
    (TEXTS, {"prompt_name": "passage", "convert_to_tensor": True}),
    (SHORT, {"precision": "int8"}),
    (SHORT, {"precision": "uint8", "convert_to_tensor": True}),
    (SHORT, {"precision": "binary"}),
    (SHORT, {"precision": "ubinary", "truncate_dim": 64}),
    ([], {}),
    ([], {"convert_to_tensor": True}),
    ([], {"convert_to_numpy": False}),
]


@pytest.mark.parametrize(("inputs", "kwargs"), ENCODE_CASES, ids=lambda v: str(v)[:30])
def test_encode_gives_sentence_transformers_results(models, inputs, kwargs):
    ours, ref = models
    _same(ours.encode(inputs, **kwargs), ref.encode(inputs, **kwargs))


def test_a_dataset_row_and_column_embed_their_text(models):
    """``encode(dataset[0])`` on a dataset of one "text" column embeds the text, as sentence-transformers 6 does
    (bertkit used to embed the dict's keys); a row with other columns is refused by both, and bertkit names the fix."""
    ours, ref = models
    texts = datasets.Dataset.from_list([{"text": t} for t in TEXTS[:3]])
    _same(ours.encode(texts[0]), ref.encode(texts[0]))
    _same(ours.encode(texts["text"]), ref.encode(texts["text"]))
    np.testing.assert_allclose(ours.encode(texts[1]), ours.encode(TEXTS[1]), atol=0)
    labelled = datasets.Dataset.from_list([{"sentence": TEXTS[0], "label": 1}])
    with pytest.raises(ValueError):
        ref.encode(labelled[0])
    with pytest.raises(BertkitError, match=r"input is a dict with the keys \['sentence', 'label'\].*"
                                           r"encode\(row\['sentence'\]\) or encode\(dataset\['sentence'\]\)"):
        ours.encode(labelled[0])


@pytest.mark.parametrize(("inputs", "message"), [
    ({"text": "a", "label": 1}, r"input is a dict with the keys \['text', 'label'\]"),
    ([TEXTS[0], None], "input 1 is NoneType"),
    (5, "input is int"),
    ({"text": None}, "holds 'text' NoneType"),
    ({}, r"input is a dict with the keys \[\]"),
    ([{"role": "user", "content": "hi"}], "chat message"),
    ({"b", "a"}, r"a set of 2 texts: a set has no order"),  # its vectors could not be matched back to the texts
    (np.array("hi"), "input is ndarray 'hi'; encode takes strings"),  # a 0-d array: Python's "len() of unsized object"
])
def test_what_sentence_transformers_refuses_bertkit_refuses_by_name(models, inputs, message):
    ours, ref = models
    with pytest.raises(ValueError):
        ref.encode(inputs)
    with pytest.raises(BertkitError, match=message):
        ours.encode(inputs)


def test_a_data_frame_is_refused_naming_its_columns(models, st_dir):
    """A pandas DataFrame iterates over its column names: ``encode(df)`` gave one vector, of the word "text", for a frame
    of three texts (sentence-transformers refuses it by type), and ``rank(query, df)`` ranked the column names
    (sentence-transformers does too). Both are refused naming the column to pass."""
    pd = pytest.importorskip("pandas")
    ours, ref = models
    frame = pd.DataFrame({"text": TEXTS[:3]})
    with pytest.raises(ValueError):
        ref.encode(frame)
    for call in (lambda: ours.encode(frame), lambda: ours.encode_query(frame)):
        with pytest.raises(BertkitError, match=r"encode\(\) got a pandas DataFrame of 3 rows and the columns \['text'\], "
                                               r"which iterates over its column names.*pass a column, "
                                               r"encode\(df\['text'\]\)"):
            call()
    _same(ours.encode(frame["text"]), ref.encode(frame["text"].tolist()))  # a column is a batch of texts
    with pytest.raises(BertkitError, match=r"rank\(\) got a pandas DataFrame of 3 rows .* pass a column, "
                                           r"rank\(query, df\['text'\]\)"):
        CrossEncoder(st_dir).rank("a query", frame)


def test_a_text_pair_is_refused_by_name(models):
    """sentence-transformers embeds (a, b) as one sequence; bertkit.sentence does not implement it and says so."""
    ours, _ = models
    with pytest.raises(BertkitError, match="input 0 is the text pair .* not implemented"):
        ours.encode([("a question", "a passage")])
    # a 2-D string array's rows are pairs there too (bertkit named only the ndarray's type)
    with pytest.raises(BertkitError, match="input 0 is the text pair .* not implemented"):
        ours.encode(np.array([["a question", "a passage"], ["another", "pair"]]))


@pytest.mark.parametrize(("prompts", "default_prompt_name"), [
    (PROMPTS, "passage"), ({**PROMPTS, "document": "document: "}, None), ({"passage": "p: "}, "passage"), ({}, None)])
def test_query_and_document_prompts_are_sentence_transformers(tmp_path, minilm_2_layers, prompts, default_prompt_name):
    """encode_query / encode_document choose sentence-transformers 6's prompt: "query", and "document" before
    "passage" or "corpus"; both models carry the placeholders "query" and "document" (""), which also keep a default
    prompt out. bertkit used to pick "passage" for a model with "query" and "passage" prompts."""
    d = st_directory(minilm_2_layers, tmp_path / "m", max_seq_length=64,
                     st_config={"prompts": prompts, "default_prompt_name": default_prompt_name})
    ours, ref = SentenceTransformer(d), st.SentenceTransformer(str(d), device="cpu")
    assert ours.prompts == ref.prompts and ours.default_prompt_name == ref.default_prompt_name
    for call in ("encode", "encode_query", "encode_document"):
        _same(getattr(ours, call)(TEXTS[:3]), getattr(ref, call)(TEXTS[:3]))
    given = {"query": "q: ", "other": "o: "}  # the caller's prompts over the directory's, merged as in st 6
    assert SentenceTransformer(d, prompts=given).prompts == st.SentenceTransformer(str(d), prompts=given).prompts


def test_model_attributes_and_similarity_calls(models):
    ours, ref = models
    assert ours.max_seq_length == ref.max_seq_length == 256 == ours.get_max_seq_length()
    assert ours.get_embedding_dimension() == ref.get_embedding_dimension() == 384
    assert ours.similarity_fn_name == ref.similarity_fn_name == "cosine"
    # model.config (the encoder's, which deepspeed and scripts read) was an AttributeError
    assert ours.config is ours.bert.config and ours.config.hidden_size == ref.config.hidden_size == 384
    assert ours.config.num_hidden_layers == ref.config.num_hidden_layers
    a, b = ours.encode(TEXTS[:4]), ref.encode(TEXTS[:4])
    _same(ours.similarity(a, a), ref.similarity(b, b))
    _same(ours.similarity_pairwise(a, a[::-1].copy()), ref.similarity_pairwise(b, b[::-1].copy()))
    rows = a[:3].tolist()  # Python floats: float32, as sentence-transformers computes them
    assert ours.similarity(rows, rows).dtype == ref.similarity(rows, rows).dtype == torch.float32
    assert ours.similarity_pairwise(rows, rows).dtype == ref.similarity_pairwise(rows, rows).dtype == torch.float32
    with ours.truncate_embeddings(16), ref.truncate_embeddings(16):
        assert ours.get_embedding_dimension() == ref.get_embedding_dimension() == 16
        _same(ours.encode(TEXTS[:2]), ref.encode(TEXTS[:2]))
    assert ours.get_embedding_dimension() == 384
    features, want = ours.preprocess(TEXTS[:2]), ref.preprocess(TEXTS[:2])
    assert torch.equal(features["input_ids"], want["input_ids"]) and torch.equal(ours.tokenize(TEXTS[:2])["input_ids"],
                                                                                 want["input_ids"])
    _same(ours(features)["sentence_embedding"].detach(), ref(want)["sentence_embedding"].detach())


def test_pytorch_dynamic_quantization_quantizes_every_linear_as_on_sentence_transformers(st_dir):
    """torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8), the usual CPU recipe: it walks
    every module and sets ``qconfig`` on each (model[0] refused that as an unknown setting); every projection is
    quantized, as on sentence-transformers' model, with its vectors for texts embedded one at a time."""
    ours, ref = SentenceTransformer(st_dir), st.SentenceTransformer(str(st_dir), device="cpu")
    linears = sum(type(m) is torch.nn.Linear for m in ours.modules())
    assert linears == sum(type(m) is torch.nn.Linear for m in ref.modules()) == 2 * 6 + 1  # 2 layers, pooler
    quantized = [torch.ao.quantization.quantize_dynamic(m, {torch.nn.Linear}, dtype=torch.qint8) for m in (ours, ref)]
    for model in quantized:
        assert sum(type(m) is torch.ao.nn.quantized.dynamic.Linear for m in model.modules()) == linears
        assert not any(type(m) is torch.nn.Linear for m in model.modules())
    texts = [t for t in TEXTS if t != LONG]
    _same(quantized[0].encode(texts, batch_size=1), quantized[1].encode(texts, batch_size=1), atol=1e-4)


UTIL = ["cos_sim", "dot_score", "euclidean_sim", "manhattan_sim", "pairwise_cos_sim", "pairwise_dot_score",
        "pairwise_euclidean_sim", "pairwise_manhattan_sim"]


@pytest.mark.parametrize("name", UTIL)
def test_util_similarities_are_sentence_transformers(models, name):
    """Every input form (numpy, tensor, list of rows, one vector); int8 codes as float32 values computed as
    sentence-transformers computes them (the codes themselves are refused: the test after this one); mismatched
    shapes named with both shapes."""
    ours, _ = models
    emb = ours.encode(TEXTS)
    mine, theirs = getattr(util, name), getattr(st_util, name)
    for a, b in ((emb, emb[::-1].copy()), (torch.from_numpy(emb), torch.from_numpy(emb)), (list(emb), list(emb)),
                 (emb[0], emb[1]), (emb[:1], emb)):
        if name.startswith("pairwise") and isinstance(a, list):
            continue  # sentence-transformers' pairwise functions do not take a list of arrays
        _same(mine(a, b), theirs(a, b), atol=1e-4)
    # Python numbers are float32 (torch.tensor's default), numpy's float64 stays float64: both as sentence-transformers
    rows = [[0.1, -2.0, 3.5], [1.0, 0.25, -0.75]]
    for a, b in ((rows, rows[::-1]), (rows[0], rows[1]), (np.asarray(rows), np.asarray(rows[::-1]))):
        want = theirs(a, b)
        assert mine(a, b).dtype == want.dtype == (torch.float64 if isinstance(a, np.ndarray) else torch.float32)
        torch.testing.assert_close(mine(a, b), want, atol=1e-6, rtol=0)
    q = quantize_embeddings(emb, "int8").astype(np.float32)
    _same(mine(q, q), theirs(q, q), atol=1e-3)
    with pytest.raises(BertkitError, match=r"384 and 32 dimensions \(shapes \(6, 384\) and \(6, 32\)\).*truncate_dim"):
        mine(emb, emb[:, :32])
    with pytest.raises(BertkitError, match=r"shape \(1, 6, 384\); give one embedding \(D,\) or a batch \(N, D\)"):
        mine(emb[None], emb)
    if name.startswith("pairwise"):
        with pytest.raises(BertkitError, match=r"a has 6 embeddings and b 4 \(shapes \(6, 384\) and \(4, 384\)\)"):
            mine(emb, emb[:4])


@pytest.mark.parametrize("precision", ["int8", "uint8", "binary", "ubinary"])
def test_similarity_of_quantized_codes_is_refused_naming_the_fix(models, precision):
    """Codes from encode(precision=...) are no embeddings: sentence-transformers raises PyTorch's error for
    model.similarity (cosine) and the Euclidean and Manhattan matrices, and computes dot products in int8 (wrapping
    around) and pairwise distances in the codes' type (NaN, or wrapped sums). bertkit computed every one in float32:
    a "cosine" of 0.82 between two ubinary rows of random bytes, a pairwise Manhattan distance of bytes that each
    pack 8 dimensions, where the Hamming distance counts bits. Every function refuses them, naming the fix; the
    fix's numbers are sentence-transformers' evaluator's (float32 codes, bits unpacked)."""
    ours, ref = models
    codes = ours.encode(SHORT, precision=precision)
    np.testing.assert_array_equal(codes, ref.encode(SHORT, precision=precision))
    message = (rf"^a holds {codes.dtype} values: quantized codes \(encode\(precision=\.\.\.\) or quantize_embeddings\), "
               r"whose similarities are not the embeddings' .*\(binary codes XOR 0x80 first\), or the number of "
               r"differing bits \(Hamming distance\)$")
    with pytest.raises(RuntimeError):
        ref.similarity(codes, codes)
    for call in (ours.similarity, ours.similarity_pairwise, *(getattr(util, n) for n in UTIL),
                 lambda a, b: util.semantic_search(a, b, score_function=util.dot_score)):
        with pytest.raises(BertkitError, match=message):
            call(codes, codes)
        with pytest.raises(BertkitError, match=message):
            call(torch.from_numpy(codes), torch.from_numpy(codes))
    if precision in ("binary", "ubinary"):  # the fix: bits unpacked, whose Manhattan distance is the Hamming distance
        packed = codes.view(np.uint8) ^ 0x80 if precision == "binary" else codes
        bits = np.unpackbits(packed, axis=-1).astype(np.float32)
        hamming = [[int(np.unpackbits(np.bitwise_xor(x, y)).sum()) for y in packed] for x in packed]
        assert (-util.manhattan_sim(bits, bits)).int().tolist() == hamming
    else:
        bits = codes.astype(np.float32)
    _same(util.pairwise_dot_score(bits, bits), st_util.pairwise_dot_score(bits, bits), atol=1e-3)
    _same(ours.similarity(bits, bits), ref.similarity(bits, bits), atol=1e-5)


def test_semantic_search_and_quantization(models):
    ours, _ = models
    emb = ours.encode(TEXTS)
    got = util.semantic_search(emb[:2], emb, top_k=3)
    want = st_util.semantic_search(torch.from_numpy(emb[:2]), torch.from_numpy(emb), top_k=3)
    assert [[h["corpus_id"] for h in hits] for hits in got] == [[h["corpus_id"] for h in hits] for hits in want]
    np.testing.assert_allclose([[h["score"] for h in hits] for hits in got],
                               [[h["score"] for h in hits] for hits in want], atol=1e-5)
    for precision in ("int8", "uint8", "binary", "ubinary"):
        _same(quantize_embeddings(emb, precision), st.quantize_embeddings(emb, precision=precision))


def test_semantic_search_with_corpus_chunks_smaller_than_top_k():
    """Chunks of the corpus smaller than top_k (which failed with torch's "selected index k out of range" once two
    chunks held fewer than top_k entries): sentence-transformers' hits and scores."""
    g = torch.Generator().manual_seed(0)
    queries, corpus = torch.randn(3, 8, generator=g), torch.randn(7, 8, generator=g)
    for top_k, chunk in ((5, 2), (7, 3), (3, 1), (10, 4)):
        got = util.semantic_search(queries, corpus, top_k=top_k, corpus_chunk_size=chunk)
        want = st_util.semantic_search(queries, corpus, top_k=top_k, corpus_chunk_size=chunk)
        assert [[h["corpus_id"] for h in hits] for hits in got] == [[h["corpus_id"] for h in hits] for hits in want]
        np.testing.assert_allclose([[h["score"] for h in hits] for hits in got],
                                   [[h["score"] for h in hits] for hits in want], atol=1e-6)


def test_semantic_search_refuses_chunk_sizes_below_one_by_name():
    """A chunk size below 0 searched nothing: every query came back with no hits, without a word, as
    sentence-transformers' (range() with a negative step is empty); 0 failed inside range()."""
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(0))
    assert st_util.semantic_search(x, x, query_chunk_size=-1) == [[], [], [], []]
    for kwargs in ({"query_chunk_size": -1}, {"corpus_chunk_size": -5}, {"corpus_chunk_size": 0}, {"top_k": 0}):
        (name, value), = kwargs.items()
        with pytest.raises(BertkitError, match=rf"^{name} must be a whole number >= 1, got {value}$"):
            util.semantic_search(x, x, **kwargs)


def test_semantic_search_keeps_sentence_transformers_ids_among_equal_scores(models):
    """A corpus holding texts twice (equal scores): sentence-transformers keeps, of equal scores, the ones its min-heap
    of (score, corpus_id) keeps, the larger ids, in the heap's order; bertkit merged torch.topk's and returned other
    ids of the same scores (76 of 300 hits on 50 STS-B queries with a third of the corpus doubled). Paraphrase mining
    keeps its own order (each chunk's topk merged), also sentence-transformers'."""
    ours, _ = models
    emb = torch.from_numpy(ours.encode(TEXTS * 2 + TEXTS[:3]))
    for kwargs in ({"top_k": 3}, {"top_k": 4, "corpus_chunk_size": 5}, {"top_k": 2, "query_chunk_size": 2},
                   {"top_k": 5, "score_function": "dot"}):
        mine, theirs = dict(kwargs), dict(kwargs)
        if "score_function" in kwargs:
            mine["score_function"], theirs["score_function"] = util.dot_score, st_util.dot_score
        got, want = util.semantic_search(emb, emb, **mine), st_util.semantic_search(emb, emb, **theirs)
        assert [[h["corpus_id"] for h in hits] for hits in got] == [[h["corpus_id"] for h in hits] for hits in want]
        np.testing.assert_allclose([[h["score"] for h in hits] for hits in got],
                                   [[h["score"] for h in hits] for hits in want], atol=1e-6)
    got, want = util.paraphrase_mining_embeddings(emb, top_k=3), st_util.paraphrase_mining_embeddings(emb, top_k=3)
    assert [p[1:] for p in got] == [p[1:] for p in want]



def test_sparse_embeddings_in_search_and_similarities_are_sentence_transformers(models):
    """Sparse COO embeddings (a SparseEncoder's; here MiniLM's with the values under 0.05 dropped): semantic_search
    in chunks (bertkit sliced the sparse tensor, which PyTorch cannot do), paraphrase mining (which
    sentence-transformers cannot do: the pairs of their dense form), manhattan_sim in float64 given in float32, as
    sentence-transformers' scipy (bertkit's float32 sums were 3e-6 off, and a float64 dense operand raised), and a
    pairwise score of one dense vector with every sparse row (bertkit made the vector sparse, which no longer
    broadcast)."""
    ours, _ = models
    dense = torch.from_numpy(ours.encode(TEXTS * 2))
    sparse = torch.where(dense.abs() > 0.05, dense, 0).to_sparse()
    for kwargs in ({"top_k": 3, "query_chunk_size": 4, "corpus_chunk_size": 5}, {"top_k": 20}, {"top_k": 2}):
        mine, theirs = dict(kwargs), dict(kwargs)
        if kwargs == {"top_k": 2}:
            mine["score_function"], theirs["score_function"] = util.dot_score, st_util.dot_score
        got, want = util.semantic_search(sparse, sparse, **mine), st_util.semantic_search(sparse, sparse, **theirs)
        assert [[h["corpus_id"] for h in hits] for hits in got] == [[h["corpus_id"] for h in hits] for hits in want]
        np.testing.assert_allclose([[h["score"] for h in hits] for hits in got],
                                   [[h["score"] for h in hits] for hits in want], atol=1e-6)
    distinct = sparse.index_select(0, torch.arange(len(TEXTS)))
    got = util.paraphrase_mining_embeddings(distinct, query_chunk_size=4, corpus_chunk_size=3, top_k=2)
    want = st_util.paraphrase_mining_embeddings(distinct.to_dense(), query_chunk_size=4, corpus_chunk_size=3, top_k=2)
    assert [p[1:] for p in got] == [p[1:] for p in want] and len(got) > 3
    np.testing.assert_allclose([p[0] for p in got], [p[0] for p in want], atol=1e-6)
    for a, b in ((sparse, sparse), (sparse, dense), (dense.double(), sparse)):
        _same(util.manhattan_sim(a, b), st_util.manhattan_sim(a, b), atol=1e-6)
    for name in ("pairwise_cos_sim", "pairwise_dot_score"):
        for a, b in ((sparse, dense[0]), (dense[:1], sparse), (dense[3], sparse)):
            _same(getattr(util, name)(a, b), getattr(st_util, name)(a, b), atol=1e-6)


def test_csr_and_csc_embeddings_are_read_as_coo():
    """sentence-transformers computes dot_score of CSR or CSC embeddings (torch.mm takes them), and bertkit failed
    inside PyTorch; every function now gives what sentence-transformers gives for the same COO tensor (where its own
    functions other than dot_score fail inside PyTorch)."""
    dense = 0.1 * torch.randn(12, 64, generator=torch.Generator().manual_seed(0))  # MiniLM's scale
    coo = torch.where(dense.abs() > 0.1, dense, 0).to_sparse()
    for compressed in (coo.to_sparse_csr(), coo.to_sparse_csc()):
        _same(util.dot_score(compressed, compressed), st_util.dot_score(compressed, compressed), atol=1e-6)
        for name in UTIL:
            _same(getattr(util, name)(compressed, dense), getattr(st_util, name)(coo, dense), atol=1e-6)
        got, want = util.semantic_search(compressed, compressed, top_k=3), st_util.semantic_search(coo, coo, top_k=3)
        assert [[h["corpus_id"] for h in hits] for hits in got] == [[h["corpus_id"] for h in hits] for hits in want]


def test_community_detection_shows_its_progress_bar_when_asked(capsys):
    """show_progress_bar=True was taken and ignored; sentence-transformers draws "Finding clusters" over the batches."""
    x = torch.randn(40, 8, generator=torch.Generator().manual_seed(0))
    kwargs = {"threshold": 0.5, "min_community_size": 3, "batch_size": 16}
    assert util.community_detection(x, **kwargs) == st_util.community_detection(x, **kwargs)
    assert "Finding clusters" not in capsys.readouterr().err
    assert util.community_detection(x, show_progress_bar=True, **kwargs) == st_util.community_detection(x, **kwargs)
    err = capsys.readouterr().err
    assert "Finding clusters: 100%" in err and "3/3" in err


def test_normalize_embeddings_of_half_precision_sparse_rows_is_sentence_transformers():
    """sentence-transformers sums a float16 or bfloat16 sparse row's squares in float32 and gives the values back in
    their own precision; summed in float16, a fifth of MiniLM's sparse values came out one unit off."""
    dense = torch.randn(16, 256, generator=torch.Generator().manual_seed(0))
    sparse = torch.where(dense.abs() > 1, dense, 0).to_sparse()
    for dtype in (torch.float16, torch.bfloat16):
        got, want = util.normalize_embeddings(sparse.to(dtype)), st_util.normalize_embeddings(sparse.to(dtype))
        assert got.dtype == want.dtype == dtype and torch.equal(got.to_dense(), want.to_dense()), dtype


def test_similarity_function_enum_is_sentence_transformers(models):
    """SimilarityFunction is an enum with sentence-transformers' static methods: to_similarity_fn,
    to_similarity_pairwise_fn (which bertkit lacked) and possible_values, less the multi-vector MaxSim names."""
    ours, _ = models
    emb = ours.encode(TEXTS)
    for name in ("cosine", "dot", "euclidean", "manhattan", util.SimilarityFunction.EUCLIDEAN,
                 st.SimilarityFunction.DOT_PRODUCT):
        value = getattr(name, "value", name)  # sentence-transformers takes its own enum's members only
        fn, ref = util.SimilarityFunction.to_similarity_fn(name), st.SimilarityFunction.to_similarity_fn(value)
        _same(fn(emb, emb[:3]), ref(emb, emb[:3]), atol=1e-6)
        fn = util.SimilarityFunction.to_similarity_pairwise_fn(similarity_function=name)
        _same(fn(emb, emb[[2, 0, 1, 5, 4, 3]]), st.SimilarityFunction.to_similarity_pairwise_fn(value)(
            emb, emb[[2, 0, 1, 5, 4, 3]]), atol=1e-6)
    assert util.SimilarityFunction("dot") is util.SimilarityFunction.DOT is util.SimilarityFunction.DOT_PRODUCT
    assert util.SimilarityFunction.possible_values() == st.SimilarityFunction.possible_values()[:4]
    with pytest.raises(BertkitError, match=r"'maxsim' is not one of \['cosine', 'dot', 'euclidean', 'manhattan'\]"):
        util.SimilarityFunction.to_similarity_fn("maxsim")


def test_directories_saved_by_one_library_load_in_the_other(models, tmp_path):
    """truncate_dim, written where sentence-transformers 6 writes it (config_sentence_transformers.json) and read back
    (bertkit neither wrote nor read it: a model saved at 16 dimensions loaded at 384); prompts, max_seq_length, the
    similarity function and the vectors, both ways."""
    ours, ref = models
    truncated = SentenceTransformer(ours.name_or_path, truncate_dim=16, similarity_fn_name="dot")
    truncated.save(tmp_path / "bertkit")
    assert json.loads((tmp_path / "bertkit" / "config_sentence_transformers.json").read_text())["truncate_dim"] == 16
    theirs = st.SentenceTransformer(str(tmp_path / "bertkit"), device="cpu")
    assert (theirs.truncate_dim, theirs.prompts, theirs.max_seq_length, theirs.similarity_fn_name) == (
        16, ours.prompts, 256, "dot")
    _same(theirs.encode(TEXTS[:3]), truncated.encode(TEXTS[:3]))
    reopened = SentenceTransformer(tmp_path / "bertkit")
    assert reopened.truncate_dim == 16 and reopened.get_embedding_dimension() == 16
    _same(reopened.encode(TEXTS[:3]), truncated.encode(TEXTS[:3]), atol=0)

    st_truncated = st.SentenceTransformer(ours.name_or_path, device="cpu", truncate_dim=24)
    st_truncated.save(str(tmp_path / "st"))
    mine = SentenceTransformer(tmp_path / "st")
    assert (mine.truncate_dim, mine.prompts, mine.max_seq_length, mine.normalize) == (24, ref.prompts, 256, True)
    _same(mine.encode(TEXTS[:3], prompt_name="query"), st_truncated.encode(TEXTS[:3], prompt_name="query"))


@pytest.mark.parametrize(("sbert", "named"), [
    ({"tokenizer_args": {"do_lower_case": False}}, "tokenizer_args.do_lower_case"),
    ({"config_args": {"num_hidden_layers": 1}}, "config_args.num_hidden_layers"),
    ({"model_args": {"dtype": "bfloat16"}}, "model_args.dtype"),
    ({"model_kwargs": {"trust_remote_code": True, "dtype": "float16"}}, "model_kwargs.dtype"),
    ({"transformer_task": "fill-mask"}, "transformer_task"),
    ({"modality_config": {"text": {"method": "forward", "method_output_name": "pooler_output"}}}, "modality_config"),
    ({"query_length": 8, "document_length": 16}, "query_length"),
    ({"tokenizer_name_or_path": "bert-base-cased"}, "tokenizer_name_or_path"),
])
def test_a_transformer_setting_bertkit_does_not_apply_is_refused_by_name(tmp_path, minilm_2_layers, sbert, named):
    """sentence-transformers 6 gives every key of sentence_bert_config.json to its Transformer: tokenizer, model and
    config arguments, another task or output, per-task lengths for encode_query / encode_document. bertkit read
    max_seq_length and do_lower_case and ignored the rest, so each of these directories gave other vectors than
    sentence-transformers' without a word (a SQuAD question cut at 8 tokens: cosine 0.44 on all-MiniLM-L6-v2); it
    now names the key."""
    d = st_directory(minilm_2_layers, tmp_path / "m")
    (d / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 256, **sbert}))
    with pytest.raises(BertkitError, match=rf"sentence_bert_config.json sets .*'{named}'.* use sentence-transformers"):
        SentenceTransformer(d)
    import bertkit

    with pytest.raises(BertkitError, match=named):
        bertkit.pipeline("sentence-embedding", str(d))


def test_a_tokenizers_model_max_length_in_the_transformer_config_cuts_the_texts(tmp_path, minilm_2_layers):
    """tokenizer_args (processor_kwargs since sentence-transformers 6) {"model_max_length": 32} wins over
    max_seq_length 256 there: bertkit cut at 256 (a SQuAD paragraph's cosine 0.52 on all-MiniLM-L6-v2); both now
    cut at 32, and the directory
    that sentence-transformers 6 saves from it (max_seq_length in tokenizer_config.json) does too. Keys that change
    no vector (unpad_inputs, a trust_remote_code that sentence-transformers drops) are accepted."""
    d = st_directory(minilm_2_layers, tmp_path / "m")
    (d / "sentence_bert_config.json").write_text(json.dumps({
        "max_seq_length": 256, "do_lower_case": False, "unpad_inputs": False,
        "tokenizer_args": {"model_max_length": 32, "trust_remote_code": True}}))
    ours, ref = SentenceTransformer(d), st.SentenceTransformer(str(d), device="cpu")
    assert ours.max_seq_length == ref.max_seq_length == 32
    _same(ours.encode(TEXTS), ref.encode(TEXTS))
    ref.save(str(tmp_path / "st"))
    reopened = SentenceTransformer(tmp_path / "st")
    assert reopened.max_seq_length == 32
    _same(reopened.encode(TEXTS), ref.encode(TEXTS))


def test_poolings_concatenated_in_another_order_keep_it_through_a_save(tmp_path, minilm_2_layers):
    """pooling_mode ["mean", "cls"] (sentence-transformers 6 concatenates the modes as listed): bertkit read it, but
    saved only the legacy booleans, which both libraries read back as cls then mean, so the reopened model's vectors
    had their halves swapped (values 5.7 apart on SQuAD texts with all-MiniLM-L6-v2)."""
    d = st_directory(minilm_2_layers, tmp_path / "m", normalize=False,
                     pooling={"embedding_dimension": 384, "pooling_mode": ["mean", "cls"]})
    want = st.SentenceTransformer(str(d), device="cpu").encode(TEXTS)
    SentenceTransformer(d).save(tmp_path / "bertkit")
    reopened = SentenceTransformer(tmp_path / "bertkit")
    assert reopened.pooling.modes == ("mean", "cls")
    _same(reopened.encode(TEXTS), want)
    _same(st.SentenceTransformer(str(tmp_path / "bertkit"), device="cpu").encode(TEXTS), want)
    # modes in the booleans' order are written as the booleans alone, which sentence-transformers before 6 reads
    legacy = st_directory(minilm_2_layers, tmp_path / "legacy", pooling={**POOLING, "pooling_mode_cls_token": True})
    SentenceTransformer(legacy).save(tmp_path / "legacy-saved")
    assert "pooling_mode" not in json.loads((tmp_path / "legacy-saved" / "1_Pooling" / "config.json").read_text())
    assert SentenceTransformer(tmp_path / "legacy-saved").pooling.modes == ("cls", "mean")


def test_poolings_concatenated_embed_as_sentence_transformers_in_the_pipeline_predict_and_serve(tmp_path,
                                                                                                minilm_2_layers):
    """pooling_mode ["max", "cls", "mean"] with truncate_dim 500 (past one mode's 384), a prompt left out and a
    Normalize: the pipelines refused such a directory ("1_Pooling concatenates the poolings"), so `predict` and `serve`
    did; they now give its encode() vectors, 1,152 wide before truncate_dim, and /info says the modes."""
    import bertkit
    from bertkit.inference.files import predict_file
    from bertkit.settings.inference import PredictFileSettings

    d = st_directory(minilm_2_layers, tmp_path / "m", max_seq_length=16,
                     st_config={"prompts": PROMPTS, "default_prompt_name": "query", "truncate_dim": 500},
                     pooling={"embedding_dimension": 384, "pooling_mode": ["max", "cls", "mean"],
                              "include_prompt": False})
    ref = st.SentenceTransformer(str(d), device="cpu")
    want = ref.encode(TEXTS)
    assert want.shape == (len(TEXTS), 500)
    pipe = bertkit.pipeline("feature-extraction", str(d), progress=False)
    assert (pipe.pooling, pipe.dimension) == (["max", "cls", "mean"], 500)
    np.testing.assert_allclose(np.asarray(pipe(TEXTS)), want, atol=2e-5)
    np.testing.assert_allclose(np.asarray(pipe(TEXTS, prompt_name="passage")),
                               ref.encode(TEXTS, prompt_name="passage"), atol=2e-5)
    (tmp_path / "in.txt").write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    predict_file(PredictFileSettings(task="sentence-embedding", model_name_or_path=d, input=tmp_path / "in.txt",
                                     output_file=tmp_path / "out.jsonl", progress=False))
    rows = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    np.testing.assert_allclose(np.asarray([r["embedding"] for r in rows]),
                               ref.encode(TEXTS, normalize_embeddings=True), atol=2e-5)

    httpx = pytest.importorskip("httpx")
    pytest.importorskip("uvicorn")
    from bertkit.inference.serve import create_app
    from serve_helpers import Server

    server = Server(create_app(pipe, str(d), max_batch_size=8, max_wait_ms=1))
    try:
        info = httpx.get(f"{server.url}/info").json()
        assert (info["model_type"], info["embedding_dimension"]) == ({"embedding": {"pooling": ["max", "cls", "mean"]}},
                                                                     500)
        tei = httpx.post(f"{server.url}/embed", json={"inputs": TEXTS, "normalize": False}).json()
        np.testing.assert_allclose(np.asarray(tei), want, atol=2e-5)
    finally:
        server.stop()

def test_a_tokenizers_max_len_is_its_model_max_length(tmp_path, minilm_2_layers):
    """tokenizer_config.json's older "max_len" (64, no model_max_length): transformers reads it as model_max_length,
    so sentence-transformers cut texts at 64 where bertkit cut them at 512 (0.65 cosine on a SQuAD paragraph with
    all-MiniLM-L6-v2)."""
    d = tmp_path / "m"
    shutil.copytree(minilm_2_layers, d)
    config = json.loads((d / "tokenizer_config.json").read_text())
    config.pop("model_max_length", None)
    (d / "tokenizer_config.json").write_text(json.dumps({**config, "max_len": 64}))
    ours, ref = SentenceTransformer(d), st.SentenceTransformer(str(d), device="cpu")
    assert ours.max_seq_length == ref.max_seq_length == ours.tokenizer.model_max_length == 64
    _same(ours.encode(TEXTS), ref.encode(TEXTS))


def test_the_pipeline_cuts_at_the_declared_max_seq_length_over_a_smaller_tokenizer_limit(tmp_path, minilm_2_layers):
    """sentence_bert_config.json declares max_seq_length 256, tokenizer_config.json says model_max_length 128:
    sentence-transformers gives 256 to the tokenizer and cuts there, as bertkit's SentenceTransformer does; the
    embedding pipeline (so `bertkit serve` and `bertkit predict`) refused the directory ("max_length 256 is outside
    [8, 128]")."""
    import bertkit

    d = st_directory(minilm_2_layers, tmp_path / "m", max_seq_length=256)
    config = json.loads((d / "tokenizer_config.json").read_text())
    (d / "tokenizer_config.json").unlink()  # a link to the shared checkpoint's file
    (d / "tokenizer_config.json").write_text(json.dumps({**config, "model_max_length": 128}))
    ref = st.SentenceTransformer(str(d), device="cpu")
    assert ref.max_seq_length == SentenceTransformer(d).max_seq_length == 256
    pipe = bertkit.pipeline("sentence-embedding", str(d), progress=False)
    assert pipe.max_length == 256
    _same(np.asarray(pipe([LONG, TEXTS[0]]), dtype=np.float32), ref.encode([LONG, TEXTS[0]], normalize_embeddings=True))


def test_the_pipeline_reads_the_older_layout_with_the_encoder_in_0_transformer(tmp_path, minilm_2_layers):
    """sentence-transformers' older layout: the encoder, its tokenizer and sentence_bert_config.json (max_seq_length
    32 here) in 0_Transformer/, which modules.json names. Both SentenceTransformers read it; the embedding pipeline
    (`bertkit serve`, `bertkit predict`) looked for config.json at the top and refused the directory."""
    import bertkit
    from bertkit.inference.embedding import FeatureExtractionPipeline

    d = st_directory(minilm_2_layers, tmp_path / "m", max_seq_length=32, st_config={"prompts": PROMPTS,
                                                                                    "default_prompt_name": "query"})
    (d / "0_Transformer").mkdir()
    for f in d.iterdir():
        if f.is_file() and f.name not in ("modules.json", "config_sentence_transformers.json"):
            f.rename(d / "0_Transformer" / f.name)
    modules = json.loads((d / "modules.json").read_text())
    (d / "modules.json").write_text(json.dumps([{**modules[0], "path": "0_Transformer"}, *modules[1:]]))
    ref = st.SentenceTransformer(str(d), device="cpu")
    assert ref.max_seq_length == SentenceTransformer(d).max_seq_length == 32
    want = ref.encode([LONG, TEXTS[0]], normalize_embeddings=True)  # with the default prompt, as the pipeline's
    _same(SentenceTransformer(d).encode([LONG, TEXTS[0]], normalize_embeddings=True), want)
    pipe = bertkit.pipeline("sentence-embedding", str(d), progress=False)
    assert (pipe.max_length, pipe.prompt) == (32, "query: ")
    _same(np.asarray(pipe([LONG, TEXTS[0]]), dtype=np.float32), want)
    assert FeatureExtractionPipeline.tokenizer_of(d)("hi")["input_ids"] == ref.tokenizer("hi")["input_ids"]


def test_a_sentence_bert_config_beside_modules_json_is_not_the_0_transformers(tmp_path, minilm_2_layers):
    """In the older layout sentence-transformers reads the Transformer's sentence_bert_config.json from 0_Transformer/
    only; one at the top (max_seq_length 16 here) is no module's file. bertkit read it when 0_Transformer/ had none and
    cut texts at 16 where sentence-transformers cuts at the tokenizer's 512 (vectors 1.7 apart on a long text)."""
    import bertkit

    d = st_directory(minilm_2_layers, tmp_path / "m", max_seq_length=16)
    (d / "0_Transformer").mkdir()
    for f in d.iterdir():
        if f.is_file() and f.name not in ("modules.json", "config_sentence_transformers.json",
                                          "sentence_bert_config.json"):
            f.rename(d / "0_Transformer" / f.name)
    modules = json.loads((d / "modules.json").read_text())
    (d / "modules.json").write_text(json.dumps([{**modules[0], "path": "0_Transformer"}, *modules[1:]]))
    ref = st.SentenceTransformer(str(d), device="cpu")
    ours = SentenceTransformer(d)
    assert ref.max_seq_length == ours.max_seq_length == 512
    want = ref.encode([LONG, TEXTS[0]], normalize_embeddings=True)
    _same(ours.encode([LONG, TEXTS[0]], normalize_embeddings=True), want)
    pipe = bertkit.pipeline("sentence-embedding", str(d), progress=False)
    assert pipe.max_length == 512
    _same(np.asarray(pipe([LONG, TEXTS[0]]), dtype=np.float32), want)


def test_positions_past_512_without_a_model_max_length_cut_where_sentence_transformers_does(tmp_path,
                                                                                          minilm_2_layers,
                                                                                          tiny_checkpoint):
    """A checkpoint of 1,024 positions whose tokenizer_config.json sets no model_max_length: transformers' tokenizer
    has no limit, so sentence-transformers cuts at the positions (1,024) in its three models; bertkit's tokenizer
    said 512, cutting a 700-token text there (vectors 0.03 apart, SPLADE weights 0.15). Every model and pipeline now
    cuts at 1,024, with sentence-transformers' vectors and scores."""
    from bertkit.inference.tasks import pipeline
    from bertkit.sentence import SparseEncoder

    dirs = {}
    for head in ("BertModel", "BertForSequenceClassification", "BertForMaskedLM"):
        # MiniLM's cut vocabulary: the masked LM's 700 x vocabulary logits 3.4x smaller, the cut the same
        d = tiny_checkpoint(tmp_path / head, head, tokenizer=minilm_2_layers, max_position_embeddings=1024,
                            labels=1)
        config = json.loads((d / "tokenizer_config.json").read_text())
        config.pop("model_max_length")
        (d / "tokenizer_config.json").write_text(json.dumps(config))
        (d / "tokenizer.json").unlink(missing_ok=True)
        dirs[head] = d
    text = " ".join(["word"] * 700)
    ours, ref = SentenceTransformer(dirs["BertModel"]), st.SentenceTransformer(str(dirs["BertModel"]), device="cpu")
    assert ours.max_seq_length == ref.max_seq_length == 1024
    assert ours.tokenizer.model_max_length == ref.tokenizer.model_max_length == 1024  # capped, as there
    _same(ours.encode([text, "short"]), ref.encode([text, "short"]))
    embed = pipeline("sentence-embedding", str(dirs["BertModel"]), normalize=False)
    assert embed.max_length == 1024
    _same(np.asarray(embed([text]), dtype=np.float32), ref.encode([text]))
    ours, ref = CrossEncoder(dirs["BertForSequenceClassification"]), st.CrossEncoder(
        str(dirs["BertForSequenceClassification"]), device="cpu")
    assert ours.max_length == ref.max_length == 1024
    want = float(ref.predict([("a query", text)])[0])
    assert float(ours.predict([("a query", text)])[0]) == pytest.approx(want, abs=1e-6)
    rerank = pipeline("rerank", str(dirs["BertForSequenceClassification"]))
    assert rerank.max_length == 1024
    assert rerank([{"query": "a query", "texts": [text]}])[0][0]["score"] == pytest.approx(want, abs=1e-6)
    ours, ref = SparseEncoder(dirs["BertForMaskedLM"]), st.SparseEncoder(str(dirs["BertForMaskedLM"]), device="cpu")
    assert ours.max_seq_length == ref.max_seq_length == 1024
    torch.testing.assert_close(ours.encode([text], convert_to_tensor=True).to_dense(),
                               ref.encode([text], convert_to_tensor=True).to_dense(), atol=1e-5, rtol=0)
    assert pipeline("sparse-embedding", str(dirs["BertForMaskedLM"])).max_length == 1024


def test_a_module_of_another_package_is_not_taken_for_sentence_transformers(st_dir, tmp_path):
    """A model's own module ("custom_st.Transformer", which sentence-transformers loads only with trust_remote_code,
    running the model's code) was read as sentence-transformers' Transformer by its last name."""
    d = tmp_path / "custom"
    shutil.copytree(st_dir, d, symlinks=True)
    modules = json.loads((d / "modules.json").read_text())
    modules[0]["type"] = "custom_st.Transformer"
    (d / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(BertkitError, match=r"lists the modules \['custom_st.Transformer', 'Pooling', 'Normalize'\]"):
        SentenceTransformer(d)


def test_similarity_fn_name_set_to_sentence_transformers_enum_computes_and_saves_by_its_name(st_dir, tmp_path):
    """model.similarity_fn_name = SimilarityFunction.EUCLIDEAN (sentence-transformers' enum, which its setter reads as
    "euclidean"): bertkit kept the enum, so similarity() raised KeyError and save() wrote
    "SimilarityFunction.EUCLIDEAN", which sentence-transformers then loaded as cosine."""
    ours, ref = SentenceTransformer(st_dir), st.SentenceTransformer(str(st_dir), device="cpu")
    for model in (ours, ref):
        model.similarity_fn_name = st.SimilarityFunction.EUCLIDEAN
    assert ours.similarity_fn_name == "euclidean"
    emb = ours.encode(TEXTS[:3])
    _same(ours.similarity(emb, emb), ref.similarity(emb, emb), atol=1e-4)
    ours.save(tmp_path / "bertkit")
    assert json.loads((tmp_path / "bertkit" / "config_sentence_transformers.json").read_text())[
        "similarity_fn_name"] == "euclidean"
    assert st.SentenceTransformer(str(tmp_path / "bertkit"), device="cpu").similarity_fn_name == "euclidean"
    with pytest.raises(BertkitError, match="similarity_fn_name 'maxsim' is not one of"):
        ours.similarity_fn_name = "maxsim"


def test_pipeline_predict_and_serve_give_encodes_vectors(tmp_path, minilm_2_layers):
    """The sentence-embedding pipeline, `bertkit predict` and `bertkit serve` (/v1/embeddings, /embed) cut a text at
    the directory's max_seq_length (256, not the tokenizer's 512: cosine 0.89 on this 455-token text before) and
    keep its truncate_dim; /info reports both."""
    import bertkit
    from bertkit.inference.files import predict_file
    from bertkit.settings.inference import PredictFileSettings

    d = st_directory(minilm_2_layers, tmp_path / "m", st_config={"truncate_dim": 128})
    ref = st.SentenceTransformer(str(d), device="cpu")
    want = ref.encode(TEXTS, normalize_embeddings=True)
    assert want.shape == (6, 128)
    pipe = bertkit.pipeline("sentence-embedding", str(d), progress=False)
    assert (pipe.max_length, pipe.dimension) == (256, 128)
    np.testing.assert_allclose(np.asarray(pipe(TEXTS)), want, atol=2e-5)

    (tmp_path / "in.txt").write_text("\n".join(t.replace("\n", " ") for t in TEXTS) + "\n", encoding="utf-8")
    predict_file(PredictFileSettings(task="sentence-embedding", model_name_or_path=d, input=tmp_path / "in.txt",
                                     output_file=tmp_path / "out.jsonl", progress=False))
    rows = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    np.testing.assert_allclose(np.asarray([r["embedding"] for r in rows]), want, atol=2e-5)

    httpx = pytest.importorskip("httpx")
    pytest.importorskip("uvicorn")
    from bertkit.inference.serve import create_app
    from serve_helpers import Server

    server = Server(create_app(pipe, str(d), max_batch_size=8, max_wait_ms=1))
    try:
        info = httpx.get(f"{server.url}/info").json()
        assert (info["max_input_length"], info["embedding_dimension"]) == (256, 128)
        openai = httpx.post(f"{server.url}/v1/embeddings", json={"input": TEXTS, "model": "m"}).json()
        np.testing.assert_allclose(np.asarray([e["embedding"] for e in openai["data"]]), want, atol=2e-5)
        tei = httpx.post(f"{server.url}/embed", json={"inputs": TEXTS[2:4], "dimensions": 64}).json()
        np.testing.assert_allclose(np.asarray(tei), ref.encode(TEXTS[2:4], truncate_dim=64, normalize_embeddings=True),
                                   atol=2e-5)
        wide = httpx.post(f"{server.url}/embed", json={"inputs": TEXTS[:1], "dimensions": 129})
        assert wide.status_code == 422 and "dimensions must be an int in [1, 128]" in wide.json()["error"]
    finally:
        server.stop()


def test_a_normalize_module_scales_before_truncate_dim_in_the_pipeline_and_the_server(tmp_path, minilm_2_layers):
    """A directory with 2_Normalize and truncate_dim: encode() normalises the whole vector, then keeps its first 128
    dimensions (not unit-length). The feature-extraction pipeline (and `bertkit predict`) and /embed with
    normalize: false gave the cut vector normalised instead (values up to 0.26 off on these texts); /embed's default
    normalises after the cut, as encode(normalize_embeddings=True)."""
    import bertkit

    httpx = pytest.importorskip("httpx")
    pytest.importorskip("uvicorn")
    from bertkit.inference.serve import create_app
    from serve_helpers import Server

    d = st_directory(minilm_2_layers, tmp_path / "m", st_config={"truncate_dim": 128})
    ref = st.SentenceTransformer(str(d), device="cpu")
    want = ref.encode(TEXTS)
    assert want.shape == (6, 128) and np.linalg.norm(want, axis=1).max() < 0.99
    pipe = bertkit.pipeline("feature-extraction", str(d), progress=False)
    np.testing.assert_allclose(np.asarray(pipe(TEXTS)), want, atol=2e-5)
    server = Server(create_app(pipe, str(d), max_batch_size=8, max_wait_ms=1))
    try:
        raw = httpx.post(f"{server.url}/embed", json={"inputs": TEXTS, "normalize": False}).json()
        np.testing.assert_allclose(np.asarray(raw), want, atol=2e-5)
        short = httpx.post(f"{server.url}/embed", json={"inputs": TEXTS, "normalize": False, "dimensions": 64}).json()
        np.testing.assert_allclose(np.asarray(short), ref.encode(TEXTS, truncate_dim=64), atol=2e-5)
        unit = httpx.post(f"{server.url}/embed", json={"inputs": TEXTS}).json()
        np.testing.assert_allclose(np.asarray(unit), ref.encode(TEXTS, normalize_embeddings=True), atol=2e-5)
    finally:
        server.stop()


def test_pipeline_honours_the_directorys_default_prompt_and_lower_casing(tmp_path, minilm_2_layers):
    import bertkit

    d = st_directory(minilm_2_layers, tmp_path / "m", max_seq_length=64,
                     st_config={"prompts": PROMPTS, "default_prompt_name": "query"},
                     pooling={"word_embedding_dimension": 384, "pooling_mode_mean_tokens": True,
                              "include_prompt": False})
    sbert = json.loads((d / "sentence_bert_config.json").read_text())
    (d / "sentence_bert_config.json").write_text(json.dumps({**sbert, "do_lower_case": True}))
    ref = st.SentenceTransformer(str(d), device="cpu")
    texts = ["Cased TEXT", TEXTS[1], GREEK]
    got = np.asarray(bertkit.pipeline("sentence-embedding", str(d), progress=False)(texts))
    np.testing.assert_allclose(got, ref.encode(texts, normalize_embeddings=True), atol=2e-5)



def test_a_default_prompt_name_naming_no_prompt_is_refused_by_the_pipeline_as_by_sentence_transformers(
        tmp_path, minilm_2_layers):
    """config_sentence_transformers.json's default_prompt_name "classification" without such a prompt:
    sentence-transformers and SentenceTransformer refuse to load the directory; the pipeline (so `predict` and
    `serve`) embedded every text with no prompt. "document", which sentence-transformers 6 gives every model (""),
    is no such case: its vectors are sentence-transformers'."""
    import bertkit

    d = st_directory(minilm_2_layers, tmp_path / "m", max_seq_length=64,
                     st_config={"prompts": PROMPTS, "default_prompt_name": "classification"})
    with pytest.raises(ValueError, match="Default prompt name 'classification' not found"):
        st.SentenceTransformer(str(d), device="cpu")
    for task in ("feature-extraction", "sentence-embedding"):
        with pytest.raises(BertkitError, match=r"config_sentence_transformers.json: default_prompt_name "
                                               r"'classification' is not one of its prompts \['document', 'passage', "
                                               r"'query'\], so sentence-transformers refuses to load it"):
            bertkit.pipeline(task, str(d), progress=False)
    (d / "config_sentence_transformers.json").write_text(json.dumps({"prompts": PROMPTS,
                                                                     "default_prompt_name": "document"}))
    got = bertkit.pipeline("feature-extraction", str(d), progress=False)(TEXTS[:3])
    np.testing.assert_allclose(np.asarray(got), st.SentenceTransformer(str(d), device="cpu").encode(TEXTS[:3]),
                               atol=2e-5)

GREEK = "Ο ΛΟΓΟΣ ΤΟΥ ΘΕΟΣ"  # each word ends in Σ: lower-cased as a whole, a final Σ becomes ς


def test_do_lower_case_lowers_each_character_as_sentence_transformers(tmp_path, minilm_2_layers):
    """do_lower_case in sentence_bert_config.json: sentence-transformers 6 puts tokenizers' Lowercase normalizer
    before the tokenizer, which lowers character by character; bertkit lower-cased whole texts with str.lower(),
    which makes a word's final Σ a ς (its own piece, "##ος"), so such a text got another vector (cosine 0.92 on
    all-MiniLM-L6-v2) in encode, the prompt's length, and the embedding pipeline."""
    d = st_directory(minilm_2_layers, tmp_path / "m", st_config={"prompts": {"q": "ΕΡΩΤΗΣΙΣ: "}})
    (d / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 256, "do_lower_case": True}))
    ours, ref = SentenceTransformer(d), st.SentenceTransformer(str(d), device="cpu")
    _same(ours.encode([GREEK, TEXTS[0]]), ref.encode([GREEK, TEXTS[0]]))
    assert ours.tokenize([GREEK])["input_ids"].tolist() == ref.tokenize([GREEK])["input_ids"].tolist()
    _same(ours.encode([GREEK], prompt_name="q"), ref.encode([GREEK], prompt_name="q"))


def test_do_lower_case_assigned_after_loading_says_sentence_transformers_ignores_it_until_saved(tmp_path,
                                                                                               minilm_2_layers, caplog):
    """sentence-transformers 6 lowercases by adding Lowercase to its tokenizer as its Transformer is made: assigning
    model[0].do_lower_case later leaves its vectors as they were (until a save and a load), where bertkit's encode
    lowercases at once. Over a cased tokenizer that was another vector without a word; now a warning names the
    constructor argument that gives the same vectors in both."""
    d = st_directory(minilm_2_layers, tmp_path / "m")
    for name, key in (("tokenizer_config.json", None), ("tokenizer.json", "normalizer")):  # a cased tokenizer
        data = json.loads((d / name).read_text())
        (data[key] if key else data).update({"lowercase": False} if key else {"do_lower_case": False})
        (d / name).unlink()
        (d / name).write_text(json.dumps(data))
    text = ["Paris Is In FRANCE"]
    ours, ref = SentenceTransformer(d), st.SentenceTransformer(str(d), device="cpu")
    before = ref.encode(text)
    _same(ours.encode(text), before)
    with caplog.at_level(logging.WARNING, logger="bertkit"):
        ours[0].do_lower_case = True
    assert "only as its Transformer is made" in caplog.text and "do_lower_case=True" in caplog.text
    ref[0].do_lower_case = True
    np.testing.assert_array_equal(ref.encode(text), before)  # sentence-transformers: unchanged
    _same(ours.encode(text), ours.encode([text[0].lower()]))  # bertkit: lowercased, as the warning says
    assert float(np.abs(ours.encode(text) - before).max()) > 0.01
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="bertkit"):
        SentenceTransformer(d)[0].do_lower_case = False  # unchanged: nothing to say
        SentenceTransformer(minilm_2_layers)[0].do_lower_case = True  # an uncased tokenizer lowercases anyway
    assert "do_lower_case" not in caplog.text


def test_do_lower_case_leaves_a_texts_special_tokens_as_they_are(tmp_path, minilm_2_layers):
    """do_lower_case: tokenizers splits a text's special tokens ("[SEP]" between a title and its passage, a prompt's
    "[CLS]") off before sentence-transformers' Lowercase normalizer runs, so they stay tokens; bertkit lower-cased
    them into the pieces of "[sep]" (cosine 0.93 to sentence-transformers' vector), in encode, a prompt's length,
    the training columns (``tokenize``) and the embedding pipeline."""
    import bertkit

    d = st_directory(minilm_2_layers, tmp_path / "m", max_seq_length=64,
                     st_config={"prompts": {"query": "[CLS] Query: "}, "default_prompt_name": "query"},
                     pooling={"word_embedding_dimension": 384, "pooling_mode_mean_tokens": True,
                              "include_prompt": False})
    (d / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 64, "do_lower_case": True}))
    ours, ref = SentenceTransformer(d), st.SentenceTransformer(str(d), device="cpu")
    texts = ["Super Bowl 50 [SEP] The Broncos WON", "[MASK] is Cased"]
    assert ours.tokenize(texts)["input_ids"].tolist() == ref.preprocess(texts)["input_ids"].tolist()
    assert ours.prompt_length("[CLS] Query: ") == ref.preprocess(texts, prompt="[CLS] Query: ")["prompt_length"] == 6
    want = ref.encode(texts)
    _same(ours.encode(texts), want)
    got = bertkit.pipeline("sentence-embedding", str(d), progress=False)(texts)
    np.testing.assert_allclose(np.asarray(got), ref.encode(texts, normalize_embeddings=True), atol=2e-5)


@pytest.mark.parametrize("mode", ["max", "mean", "cls", "lasttoken", "weightedmean"])
def test_a_prompt_longer_than_max_seq_length_leaves_the_sep_to_pool(tmp_path, minilm_2_layers, mode):
    """include_prompt False and a prompt of 10 word pieces with max_seq_length 8: sentence-transformers measures the
    prompt cut as a text is (7 tokens with [CLS]) and pools the [SEP] left; bertkit left out 10, so max pooling gave
    -inf, mean zeros and cls an IndexError, in encode and in the pipeline (its default prompt)."""
    import bertkit

    d = st_directory(minilm_2_layers, tmp_path / "m", max_seq_length=8,
                     st_config={"prompts": {"query": "represent this sentence for searching relevant passages: "},
                                "default_prompt_name": "query"},
                     pooling={"word_embedding_dimension": 384, f"pooling_mode_{MODE_KEYS[mode]}": True,
                              "include_prompt": False}, normalize=False)
    ref, ours = st.SentenceTransformer(str(d), device="cpu"), SentenceTransformer(d)
    want = ref.encode(TEXTS[:3])
    assert np.isfinite(want).all() and np.abs(want).max() > 0.1
    _same(ours.encode(TEXTS[:3]), want)
    got = bertkit.pipeline("feature-extraction", str(d), progress=False)(TEXTS[:3])
    np.testing.assert_allclose(np.asarray(got), want, atol=2e-5)


MODE_KEYS = {"max": "max_tokens", "mean": "mean_tokens", "cls": "cls_token", "lasttoken": "lasttoken",
             "weightedmean": "weightedmean_tokens"}


def test_cls_pooling_of_a_text_the_prompt_takes_whole_is_its_cls(tmp_path, minilm_2_layers):
    """include_prompt False, cls pooling, and a prompt ending inside a word: "quest" is 3 pieces (q ##ue ##st), and
    "quest" + "ion" is the one piece "question", so the prompt's 4 leading tokens cover that text's whole row.
    sentence-transformers pools its [CLS] (the first of no unmasked token); bertkit pooled position 4: past that row,
    zeros or a padding token's state in a batch (0.9 off on all-MiniLM-L6-v2), an IndexError alone."""
    d = st_directory(minilm_2_layers, tmp_path / "m", normalize=False,
                     pooling={"word_embedding_dimension": 384, "pooling_mode_cls_token": True, "include_prompt": False})
    ref, ours = st.SentenceTransformer(str(d), device="cpu"), SentenceTransformer(d)
    for texts in (["ion", TEXTS[0]], ["ion"]):
        want = ref.encode(texts, prompt="quest")
        _same(ours.encode(texts, prompt="quest"), want)
    np.testing.assert_allclose(want[0], ref.encode(["question"])[0], atol=1e-6)  # the row's [CLS]: no prompt cut


def test_cross_encoder_on_an_embedders_directory(st_dir, minilm_2_layers, caplog):
    """CrossEncoder(an embedder's directory) loads its transformer with a new one-label classifier and
    sentence-transformers' warning, where bertkit refused; with the same classifier weights it scores as
    sentence-transformers' does. A plain checkpoint gets one label too (bertkit gave it two)."""
    st_ce = pytest.importorskip("sentence_transformers.cross_encoder")
    with caplog.at_level(logging.WARNING):
        ours = CrossEncoder(st_dir)
    assert f"Converting SentenceTransformer model {st_dir} to CrossEncoder." in caplog.text
    ref = st_ce.CrossEncoder(str(st_dir), device="cpu")
    assert (ours.num_labels, ours.max_length, type(ours.activation_fn)) == (ref.num_labels, ref.max_seq_length,
                                                                            type(ref.activation_fn))
    ours.model.classifier.load_state_dict(ref[0].model.classifier.state_dict())
    pairs = [(TEXTS[0], TEXTS[1]), (TEXTS[2], LONG), (TEXTS[4], TEXTS[5])]
    _same(ours.predict(pairs), ref.predict(pairs, show_progress_bar=False), atol=1e-5)
    assert [r["corpus_id"] for r in ours.rank(TEXTS[0], TEXTS[1:])] == \
        [r["corpus_id"] for r in ref.rank(TEXTS[0], TEXTS[1:], show_progress_bar=False)]
    plain, ref_plain = CrossEncoder(minilm_2_layers), st_ce.CrossEncoder(str(minilm_2_layers), device="cpu")
    assert (plain.num_labels, type(plain.activation_fn)) == (ref_plain.num_labels, type(ref_plain.activation_fn)) == \
        (1, torch.nn.Sigmoid)


@pytest.mark.parametrize(("pair", "message"), [
    ((TEXTS[0], None), r"input 1 \(.*\) has NoneType 'None' as its second text"),
    ((3.5, TEXTS[0]), r"input 1 \(.*\) has float '3.5' as its first text"),
])
def test_cross_encoder_predict_names_a_bad_pair(st_dir, pair, message):
    ours = CrossEncoder(st_dir)
    with pytest.raises(BertkitError, match=message):
        ours.predict([(TEXTS[0], TEXTS[1]), pair])
    with pytest.raises(BertkitError, match=r"rank\(\) document 1 is NoneType"):
        ours.rank(TEXTS[0], [TEXTS[1], None])


def test_evaluators_and_mining_use_sentence_transformers_prompts(models):
    """A model with "query" and "passage" prompts: the retrieval evaluator and mining embed queries and documents
    with sentence-transformers 6's prompts (no passage prompt: "document" comes first), so the same metrics and
    negatives."""
    from sentence_transformers.sentence_transformer import evaluation as st_evaluation

    from bertkit.sentence import evaluation

    ours, ref = models
    queries = {"q0": "Who eats food?", "q1": "Where does the horse run?", "q2": "What do you think of the film?"}
    corpus = {f"d{i}": t for i, t in enumerate(TEXTS)}
    relevant = {"q0": {"d0"}, "q1": {"d1"}, "q2": {"d5"}}
    got = evaluation.InformationRetrievalEvaluator(queries, corpus, relevant, name="tiny")(ours)
    want = st_evaluation.InformationRetrievalEvaluator(queries, corpus, relevant, name="tiny", show_progress_bar=False,
                                                       write_csv=False)(ref)
    assert got.keys() == want.keys()
    np.testing.assert_allclose([got[k] for k in want], [want[k] for k in want], atol=1e-6)
    pairs = datasets.Dataset.from_list([{"anchor": q, "positive": corpus[next(iter(relevant[k]))]}
                                        for k, q in queries.items()])
    mined = util.mine_hard_negatives(pairs, ours, corpus=list(corpus.values()), num_negatives=2, verbose=False)
    assert mined.to_list() == st_util.mine_hard_negatives(pairs, ref, corpus=list(corpus.values()), num_negatives=2,
                                                          verbose=False).to_list()


def test_a_missing_text_in_mining_names_its_row_and_column(models):
    """A None among the anchors named "input 4" of encode; now its row and column in the dataset."""
    ours, _ = models
    pairs = [{"anchor": f"question {i}", "positive": f"passage {i}"} for i in range(6)]
    pairs[4]["positive"] = None
    with pytest.raises(BertkitError, match=r"row 4, column 'positive' is NoneType 'None', not a text"):
        util.mine_hard_negatives(datasets.Dataset.from_list(pairs), ours, verbose=False)
    with pytest.raises(BertkitError, match=r"corpus\[1\] is int '7', not a text"):
        util.mine_hard_negatives(pairs[:4], ours, corpus=["a text", 7], verbose=False)


def test_model_methods_beyond_encode_evaluate_checkpoint_or_are_refused_by_name(st_dir, tmp_path):
    """evaluate(evaluator, output_path) is evaluator(model, output_path); gradient_checkpointing_enable() recomputes the layers in backward
    (same loss and gradients); fit(), the multi-process pool, the Hub and peft adapter methods are refused naming
    what to use, as AttributeErrors (hasattr sees them absent, as for any missing name)."""
    from bertkit.errors import NotImplementedInBertkit
    from bertkit.sentence.cross_encoder import CrossEncoder

    model = SentenceTransformer(st_dir)
    assert model.evaluate(lambda m, path: {"seen": m is model, "path": path}, output_path=str(tmp_path / "e")) == {
        "seen": True, "path": str(tmp_path / "e")}
    assert (tmp_path / "e").is_dir()
    batch = model.tokenize(TEXTS[:3])

    def loss_and_grad():
        model.zero_grad()
        loss = model(batch)["sentence_embedding"].square().sum()
        loss.backward()
        return loss.item(), model.bert.encoder.layer[0].output.dense.weight.grad.clone()

    model.train()
    plain = loss_and_grad()
    model.gradient_checkpointing_enable()
    assert model.bert.gradient_checkpointing
    checkpointed = loss_and_grad()
    assert checkpointed[0] == pytest.approx(plain[0], rel=1e-6)
    torch.testing.assert_close(checkpointed[1], plain[1], atol=1e-6, rtol=1e-5)
    assert not hasattr(model, "old_fit") and getattr(model, "push_to_hub", None) is None
    with pytest.raises(NotImplementedInBertkit, match=r"SentenceTransformer.old_fit is not implemented in bertkit: "
                                                       r"old_fit is sentence-transformers' v2 training loop; call fit"):
        model.old_fit(train_objectives=[])
    with pytest.raises(NotImplementedInBertkit, match=r"CrossEncoder.start_multi_process_pool is not implemented"):
        CrossEncoder(st_dir).start_multi_process_pool()
    with pytest.raises(AttributeError, match="has no attribute 'colour'"):
        _ = model.colour


def test_the_tokenizers_model_max_length_is_max_seq_length(st_dir, tmp_path):
    """sentence-transformers keeps max_seq_length as its tokenizer's model_max_length, so
    ``model.tokenizer.model_max_length = 32`` cuts texts at 32 there; bertkit kept a limit of its own and went on
    cutting at 256 (cosine 0.86 on LONG with all-MiniLM-L6-v2). One value now: set either, both read it, a save writes
    it to both files, and a value past the positions set on the tokenizer is refused at encode, naming it."""
    ours, ref = SentenceTransformer(st_dir), st.SentenceTransformer(str(st_dir), device="cpu")
    for model in (ours, ref):
        model.tokenizer.model_max_length = 32
    assert ours.max_seq_length == ref.max_seq_length == 32
    _same(ours.encode(TEXTS), ref.encode(TEXTS))
    for model in (ours, ref):
        model.max_seq_length = 48
    assert ours.tokenizer.model_max_length == ref.tokenizer.model_max_length == 48
    _same(ours.encode(TEXTS), ref.encode(TEXTS))
    ours.save(tmp_path / "saved")
    assert json.loads((tmp_path / "saved" / "tokenizer_config.json").read_text())["model_max_length"] == 48
    assert json.loads((tmp_path / "saved" / "sentence_bert_config.json").read_text())["max_seq_length"] == 48
    ours.tokenizer.model_max_length = 600
    with pytest.raises(BertkitError, match=r"max_seq_length \(the tokenizer's model_max_length\) 600 must be a whole "
                                           r"number in \[2, 512\]"):
        ours.encode(TEXTS)


def test_a_cross_encoders_max_length_is_its_tokenizers_model_max_length(st_dir, tmp_path):
    """As for the embedder: ``model.tokenizer.model_max_length = 16`` cuts sentence-transformers' CrossEncoder's pairs
    at 16; bertkit kept its own max_length of 512 (scores up to 8e-3 apart on these pairs with all-MiniLM-L6-v2 and a
    new classifier)."""
    st_ce = pytest.importorskip("sentence_transformers.cross_encoder")
    ours, ref = CrossEncoder(st_dir), st_ce.CrossEncoder(str(st_dir), device="cpu")
    ours.model.classifier.load_state_dict(ref[0].model.classifier.state_dict())
    pairs = [(TEXTS[0], LONG), (TEXTS[1], TEXTS[5]), (LONG, TEXTS[4])]
    for model in (ours, ref):
        model.tokenizer.model_max_length = 16
    assert ours.max_length == ours.max_seq_length == ref.max_seq_length == 16
    _same(ours.predict(pairs), ref.predict(pairs, show_progress_bar=False), atol=1e-5)
    ours.max_seq_length = 24  # sentence-transformers 6's name; AttributeError before
    assert ours.tokenizer.model_max_length == ours.max_length == 24
    ours.save(tmp_path / "saved")
    assert st_ce.CrossEncoder(str(tmp_path / "saved"), device="cpu").max_seq_length == CrossEncoder(
        tmp_path / "saved").max_length == 24
    assert ours.tokenizer.model_max_length == 24  # the save leaves it as it was


def test_a_cross_encoders_module_by_position_is_sentence_transformers(st_dir):
    """sentence-transformers 6's CrossEncoder is a Sequential of one Transformer: ce[0].auto_model (to freeze or wrap),
    ce[0].max_seq_length = 16, len(ce), ce._first_module(). bertkit's said "not subscriptable"; now model[0] is its
    module holding the encoder (model.model) and tokenizer, and the same calls give the same scores."""
    st_ce = pytest.importorskip("sentence_transformers.cross_encoder")
    ours, ref = CrossEncoder(st_dir), st_ce.CrossEncoder(str(st_dir), device="cpu")
    ours.model.classifier.load_state_dict(ref[0].model.classifier.state_dict())
    assert len(ours) == len(ref) == 1 and list(ours) == [ours[0]] and ours[-1] is ours._first_module() is ours[0]
    assert ours[0].auto_model is ours.model and ours._last_module().tokenizer is ours.tokenizer
    pairs = [(TEXTS[0], LONG), (TEXTS[1], TEXTS[5]), (LONG, TEXTS[4])]
    for model in (ours, ref):
        model[0].max_seq_length = 16
    assert ours.max_length == 16
    _same(ours.predict(pairs), ref.predict(pairs, show_progress_bar=False), atol=1e-5)
    with pytest.raises(BertkitError, match=r"max_length 2 must be a whole number in \[3, 512\]"):
        ours[0].max_seq_length = 2  # the model's own limit: a pair needs 3 tokens (the view took 2 before)
    with pytest.raises(BertkitError, match=r"CrossEncoder\[0\].do_lower_case = True is not implemented"):
        ours[0].do_lower_case = True
    with pytest.raises(IndexError, match="index 1 is out of range: this model has 1 modules"):
        _ = ours[1]


def test_model_card_data_is_taken_as_the_training_examples_pass_it(models, st_dir, tmp_path, tiny_checkpoint,
                                                                  minilm_dir):
    """sentence-transformers' training examples start with SentenceTransformer(base, model_card_data=
    SentenceTransformerModelCardData(language="en", ...)): bertkit refused the script's first line (its three model
    classes). The card data is kept as model.model_card_data, and the vectors and saved files are the same."""
    from bertkit.sentence import CrossEncoder, SparseEncoder

    card = st.SentenceTransformerModelCardData(language="en", license="apache-2.0", model_name="MiniLM on NLI")
    ours, ref = models
    carded = SentenceTransformer(st_dir, model_card_data=card)
    assert carded.model_card_data is card and ours.model_card_data is None
    _same(carded.encode(TEXTS), ref.encode(TEXTS))
    carded.save(tmp_path / "carded")
    ours.save(tmp_path / "plain")
    assert sorted(p.name for p in (tmp_path / "carded").rglob("*")) == sorted(p.name for p in (tmp_path / "plain").rglob("*"))
    assert CrossEncoder(st_dir, num_labels=1, model_card_data=card).model_card_data is card
    masked_lm = tiny_checkpoint(tmp_path / "mlm", "BertForMaskedLM", tokenizer=minilm_dir)
    assert SparseEncoder(masked_lm, model_card_data=card).model_card_data is card


def test_arguments_at_sentence_transformers_defaults_are_nothing_asked_for(models, st_dir):
    """``SentenceTransformer(path, cache_folder=None, revision=None, ...)`` and ``encode(texts, pool=None,
    task=None)`` (a script passing its own defaults through) work as in sentence-transformers; bertkit refused any
    value of an argument it does not implement, None too, where its CrossEncoder took None as nothing asked for. A
    value is refused by name, processor_kwargs (sentence-transformers 6's name for tokenizer_kwargs) included."""
    ours, ref = models
    defaults = dict.fromkeys(("cache_folder", "revision", "token", "model_kwargs", "processor_kwargs",
                              "tokenizer_kwargs", "config_kwargs", "model_card_data"))
    _same(SentenceTransformer(st_dir, **defaults).encode(TEXTS), ref.encode(TEXTS))
    _same(ours.encode(TEXTS, pool=None, chunk_size=None, task=None),
          ref.encode(TEXTS, pool=None, chunk_size=None, task=None))
    _same(ours.encode(TEXTS, precision=None), ref.encode(TEXTS, precision=None))  # float32 there ("not one of" here)
    with pytest.raises(BertkitError, match=r"encode\(task=...\) is not implemented in bertkit: a SentenceTransformer "
                                           "has no Router to route a task through"):
        ours.encode(TEXTS, task="query")  # "unknown argument" before, None included
    # sentence-transformers 6 cuts this call's texts at 16 tokens: "unknown argument 'processing_kwargs'" before
    cut = {"text": {"max_length": 16, "truncation": True}}
    _same(ours.encode(TEXTS, processing_kwargs=None), ref.encode(TEXTS, processing_kwargs=None))
    with pytest.raises(BertkitError, match=r"encode\(processing_kwargs=...\) is not implemented in bertkit: texts are "
                                           "cut at the model's max_seq_length"):
        ours.encode(TEXTS, processing_kwargs=cut)
    cross_encoder = CrossEncoder(st_dir, **defaults)
    with pytest.raises(BertkitError, match=r"predict\(processing_kwargs=...\) is not implemented in bertkit: texts "
                                           r"are cut at the model's max_seq_length \(a CrossEncoder's max_length\)"):
        cross_encoder.predict([("a", "b")], processing_kwargs=cut)
    with pytest.raises(BertkitError, match=r"SentenceTransformer\(processor_kwargs=...\) is not implemented in bertkit: "
                                           "for its model_max_length set model.max_seq_length after loading"):
        SentenceTransformer(st_dir, processor_kwargs={"model_max_length": 16})  # it said "drop this argument"
    with pytest.raises(BertkitError, match=r"SentenceTransformer\(cache_folder=...\) is not implemented"):
        SentenceTransformer(st_dir, cache_folder="cache")
    # not a path: named (it was pathlib's "expected str, bytes or os.PathLike object, not NoneType")
    with pytest.raises(BertkitError, match="SentenceTransformer takes the path of a local directory .*, got NoneType"):
        SentenceTransformer(None)
    with pytest.raises(BertkitError, match="CrossEncoder takes the path of a local directory .*, got int 5"):
        CrossEncoder(5)


def test_a_cross_encoder_directory_setting_what_bertkit_does_not_apply_is_refused(st_dir, tmp_path):
    """sentence_bert_config.json's do_lower_case makes sentence-transformers' CrossEncoder lowercase both texts (its
    logit moves by more than 1e-3 for this pair on a cased tokenizer), and its Transformer fails on a key it does not know;
    bertkit's CrossEncoder and rerank pipeline (`bertkit serve --task rerank`) read only the file's max_seq_length and
    scored the pair as given. Refused by name now, before the weights load, as a SentenceTransformer's file is; so is
    a default prompt in the rerank pipeline, as in CrossEncoder."""
    import bertkit

    st_ce = pytest.importorskip("sentence_transformers.cross_encoder")
    torch.manual_seed(0)
    model = CrossEncoder(st_dir, activation_fn=torch.nn.Identity())
    with torch.no_grad():
        model.model.classifier.weight.mul_(50)  # a new classifier's logits are near 0 for any pair
    d = model.save(tmp_path / "ce")
    tokenizer = json.loads((d / "tokenizer.json").read_text(encoding="utf-8"))
    tokenizer["normalizer"]["lowercase"] = False  # cased, so that lower-casing changes the tokens
    (d / "tokenizer.json").write_text(json.dumps(tokenizer), encoding="utf-8")
    config = json.loads((d / "tokenizer_config.json").read_text())
    (d / "tokenizer_config.json").write_text(json.dumps({**config, "do_lower_case": False}))
    pair = ("HOW MANY people LIVE in Berlin?", "BERLIN HAS 3.5 million inhabitants.")
    sbert = json.loads((d / "sentence_bert_config.json").read_text())
    cased = CrossEncoder(d).predict([pair])
    _same(cased, st_ce.CrossEncoder(str(d), device="cpu").predict([pair], show_progress_bar=False), atol=1e-6)
    (d / "sentence_bert_config.json").write_text(json.dumps({**sbert, "do_lower_case": True}))
    lowered = st_ce.CrossEncoder(str(d), device="cpu").predict([pair], show_progress_bar=False)
    assert np.abs(lowered - cased).max() > 1e-3
    for load in (CrossEncoder, lambda d: bertkit.pipeline("rerank", str(d), progress=False)):
        with pytest.raises(BertkitError, match=r"sentence_bert_config.json sets do_lower_case.*tokenizer_config.json"):
            load(d)
    # the fix the refusal names: the tokenizer's own do_lower_case, accents kept, scores as that lowercasing does
    accented = [pair, ("Où est le CAFÉ?", "İSTANBUL Straße ΣΑΣ")]
    lowered = st_ce.CrossEncoder(str(d), device="cpu").predict(accented, show_progress_bar=False)
    (d / "sentence_bert_config.json").write_text(json.dumps(sbert))
    (d / "tokenizer_config.json").write_text(json.dumps({**config, "do_lower_case": True, "strip_accents": False}))
    _same(CrossEncoder(d).predict(accented), lowered, atol=1e-6)
    (d / "tokenizer_config.json").write_text(json.dumps({**config, "do_lower_case": False}))
    (d / "sentence_bert_config.json").write_text(json.dumps({**sbert, "model_args": {"num_labels": 3}}))
    with pytest.raises(BertkitError, match=r"sets \{'model_args.num_labels': 3\}, which bertkit does not apply"):
        CrossEncoder(d)
    # a default prompt, which sentence-transformers puts before each query: CrossEncoder refused it, the rerank
    # pipeline scored the bare pairs
    (d / "sentence_bert_config.json").write_text(json.dumps(sbert))
    st_config = json.loads((d / "config_sentence_transformers.json").read_text())
    (d / "config_sentence_transformers.json").write_text(json.dumps({**st_config, "prompts": {"query": "query: "},
                                                                     "default_prompt_name": "query"}))
    prompted = st_ce.CrossEncoder(str(d), device="cpu").predict([pair], show_progress_bar=False)
    assert np.abs(prompted - cased).max() > 1e-4  # 0.71777 against 0.71752: 100x the parity's 2e-6
    for load in (CrossEncoder, lambda d: bertkit.pipeline("rerank", str(d), progress=False)):
        with pytest.raises(BertkitError, match="sets default_prompt_name 'query'"):
            load(d)


def test_a_similarity_fn_name_sentence_transformers_does_not_support_is_refused_not_renamed(st_dir, tmp_path):
    """config_sentence_transformers.json's "dot_product" (or "maxsim"): sentence-transformers 6 ignores a name it does
    not support and scores with cosine; bertkit read "dot_product" as dot, so a model without Normalize scored other
    similarities (with all-MiniLM-L6-v2 unnormalised, 31.7 for a text with itself and 4.99 for TEXTS[0] with TEXTS[1],
    where cosine gives 1 and 0.16). It now names the file and the fix; as an
    argument "dot_product" is refused by both."""
    d = tmp_path / "m"
    shutil.copytree(st_dir, d, symlinks=True)
    (d / "modules.json").write_text(json.dumps(json.loads((d / "modules.json").read_text())[:2]))
    (d / "config_sentence_transformers.json").write_text(json.dumps({"similarity_fn_name": "dot_product"}))
    ref = st.SentenceTransformer(str(d), device="cpu")
    assert ref.similarity_fn_name == "cosine"
    with pytest.raises(BertkitError, match=r"config_sentence_transformers.json: similarity_fn_name 'dot_product' is not "
                                           r"one of .* sentence-transformers 6 ignores it and scores with cosine"):
        SentenceTransformer(d)
    ours = SentenceTransformer(d, similarity_fn_name="cosine")
    emb = ours.encode(TEXTS[:3])
    _same(ours.similarity(emb, emb), ref.similarity(emb, emb), atol=1e-5)
    with pytest.raises(ValueError):
        st.SentenceTransformer(str(d), device="cpu", similarity_fn_name="dot_product")
    with pytest.raises(BertkitError, match="similarity_fn_name 'dot_product' is not one of"):
        SentenceTransformer(d, similarity_fn_name="dot_product")


def test_modules_by_position_are_sentence_transformers(st_dir, tmp_path):
    """sentence-transformers' model is a Sequential that scripts index: model[0].auto_model (to freeze), model[0].
    max_seq_length = 16, model[1] (the Pooling), model[-1], len, iteration, _first_module(). bertkit refused them all;
    now they are the model's modules, and the same script gives the same vectors, and a model saved after
    model[0].max_seq_length = 16 reloads cutting at 16 in both."""
    from bertkit.errors import NotImplementedInBertkit
    from bertkit.sentence import models

    ours, ref = SentenceTransformer(st_dir), st.SentenceTransformer(str(st_dir), device="cpu")
    assert len(ours) == len(ref) == 3 and bool(ours)
    assert [type(m).__name__ for m in ref] == ["Transformer", "Pooling", "Normalize"]
    assert [type(m) for m in ours] == [models.Transformer, type(ours.pooling), models.Normalize]
    assert isinstance(ours[0], models.Transformer) and ours[1] is ours.pooling and ours[-1] is ours[2]
    assert list(ours) == list(ours.children()) and ours[1] is ours.get_submodule("1")  # its modules, as there
    assert ours._first_module() is ours[0] and ours._last_module() is ours[-1] and ours[-3] is ours[0]
    assert ours[0].auto_model is ours.bert is ours.transformers_model
    assert ours[1].get_sentence_embedding_dimension() == ref[1].get_embedding_dimension() == 384
    assert ours[1].pooling_mode == ref[1].pooling_mode == "mean"
    assert ours[0].get_word_embedding_dimension() == 384
    for model in (ours, ref):
        model[0].max_seq_length = 16
        model[0].do_lower_case = True
    assert ours.max_seq_length == 16 and ours.do_lower_case
    loud = [t.upper() for t in TEXTS]
    _same(ours.encode(loud), ref.encode(loud), atol=1e-5)
    ours[0].do_lower_case = ref[0].do_lower_case = False
    _same(ours.encode(loud), ref.encode(loud), atol=1e-5)
    ours.save(tmp_path / "ours")
    ref.save(str(tmp_path / "ref"))
    for saved in (SentenceTransformer(tmp_path / "ours"), SentenceTransformer(tmp_path / "ref")):
        assert saved[0].max_seq_length == 16
        _same(saved.encode(TEXTS), ref.encode(TEXTS), atol=1e-5)
    # the encoder replaced (peft's wrapper, a copy): model[0] sees it, and a script's assignment replaces it
    ours.bert = SentenceTransformer(st_dir).bert
    assert ours[0].auto_model is ours.bert
    other = SentenceTransformer(st_dir).bert
    ours[0].auto_model = other
    assert ours.bert is other
    with pytest.raises(BertkitError, match=r"model\[0\].maxlen is not a setting of bertkit's Transformer"):
        ours[0].maxlen = 16  # kept on the view, the model would never read it
    with pytest.raises(IndexError, match=r"index 3 is out of range: this model has 3 modules"):
        _ = ours[3]
    with pytest.raises(NotImplementedInBertkit, match=r"slicing a SentenceTransformer is not implemented"):
        _ = ours[:2]
    ours.normalize = False
    assert len(ours) == 2 and ours[-1] is ours.pooling
    with pytest.raises(IndexError):
        _ = ours[2]


def test_pooling_set_through_model_1_pools_as_sentence_transformers(tiny_st_dir, tmp_path):
    """model[1].include_prompt = False, model.set_pooling_include_prompt(False) and model[1].pooling_mode = "cls"
    change what sentence-transformers pools (on MiniLM, a prompted vector 0.11 from the pooled prompt's, the cls one
    0.67 from the mean's); bertkit's Pooling was frozen ("cannot assign to field") and the method missing."""
    calls = (lambda m: setattr(m[1], "include_prompt", False), lambda m: m.set_pooling_include_prompt(False),
             lambda m: setattr(m[1], "pooling_mode", "cls"), lambda m: setattr(m[1], "pooling_mode", ["cls", "mean"]))
    for call in calls:
        ours, ref = SentenceTransformer(tiny_st_dir), st.SentenceTransformer(str(tiny_st_dir), device="cpu")
        call(ours)
        call(ref)
        _same(ours.encode(TEXTS, prompt_name="query"), ref.encode(TEXTS, prompt_name="query"), atol=1e-5)
    # two modes: 64 dimensions, which sentence-transformers encodes but still reports as 32 (set at its init)
    assert ours.get_embedding_dimension() == ref.encode(TEXTS).shape[1] == 64
    ours.save(tmp_path / "ours")  # the modes set are the ones saved
    _same(st.SentenceTransformer(str(tmp_path / "ours"), device="cpu").encode(TEXTS), ref.encode(TEXTS), atol=1e-5)
    with pytest.raises(BertkitError, match=r"Pooling.pooling_mode: pooling \['median'\] is not implemented"):
        ours[1].pooling_mode = "median"
    with pytest.raises(BertkitError, match=r"Pooling.mode is not a setting of bertkit's Pooling"):
        ours[1].mode = "cls"
    assert ours[1].modes == ("cls", "mean")


def test_a_peft_adapter_directory_is_refused_naming_the_recipe(st_dir, tmp_path):
    """model[0].auto_model = get_peft_model(...), then save: the directory holds the adapter over its base, as
    sentence-transformers writes one (and loads: the same vectors). bertkit said "config.json does not exist"; now it
    names the adapter and its base, and the recipe it gives (PeftModel.from_pretrained, merge_and_unload) gives the
    vectors back."""
    peft = pytest.importorskip("peft")
    torch.manual_seed(0)
    model = SentenceTransformer(st_dir)
    model[0].auto_model = peft.get_peft_model(model[0].auto_model, peft.LoraConfig(
        r=4, target_modules=["query", "value"], init_lora_weights="gaussian"))
    want = model.encode(TEXTS)
    model.save(tmp_path / "lora")
    _same(st.SentenceTransformer(str(tmp_path / "lora"), device="cpu").encode(TEXTS), want, atol=1e-5)
    with pytest.raises(BertkitError, match=rf"holds a peft adapter \(adapter_config.json\) over {st_dir}, not a whole "
                                           r"encoder; bertkit loads no adapters"):
        SentenceTransformer(tmp_path / "lora")
    base = SentenceTransformer(st_dir)
    base.bert = peft.PeftModel.from_pretrained(base.bert, str(tmp_path / "lora")).merge_and_unload()
    _same(base.encode(TEXTS), want, atol=1e-6)


def test_embeddings_frozen_through_model_0_train_as_sentence_transformers(tmp_path, minilm_2_layers):
    """The script freezes the embeddings through model[0].auto_model, then trains MNRL: the same losses, frozen
    weights and vectors as sentence-transformers (dropout off, so the steps agree)."""

    directory = st_directory(minilm_2_layers, tmp_path / "minilm", dropout=0.0)
    pairs = [{"anchor": f"question {i} about {w}", "positive": f"a paragraph on {w} number {i}"}
             for i, w in enumerate(["cats", "the sea", "tax law", "football", "jazz", "rain", "Rome", "code"])]
    runs = {}
    for name, package in (("ours", "bertkit.sentence"), ("ref", "sentence_transformers")):  # the import swapped
        lib, losses = importlib.import_module(package), importlib.import_module(f"{package}.losses")
        model = lib.SentenceTransformer(str(directory), device="cpu")
        for p in model[0].auto_model.embeddings.parameters():
            p.requires_grad = False
        frozen = model[0].auto_model.embeddings.word_embeddings.weight.detach().clone()
        args = lib.SentenceTransformerTrainingArguments(
            output_dir=str(tmp_path / name), report_to="none", use_cpu=True, disable_tqdm=True,
            per_device_train_batch_size=4, max_steps=2, learning_rate=1e-4, save_strategy="no", logging_steps=1, seed=1)
        trainer = lib.SentenceTransformerTrainer(model=model, args=args, loss=losses.MultipleNegativesRankingLoss(model),
                                                 train_dataset=datasets.Dataset.from_list(pairs))
        trainer.train()
        assert torch.equal(frozen, model[0].auto_model.embeddings.word_embeddings.weight)
        runs[name] = ([h["loss"] for h in trainer.state.log_history if "loss" in h], model.encode(TEXTS))
    assert len(runs["ours"][0]) == 2
    np.testing.assert_allclose(runs["ours"][0], runs["ref"][0], atol=1e-5)
    _same(runs["ours"][1], runs["ref"][1], atol=1e-5)


# float64 first: its vectors came back as float32 too, and float16's matrix products are emulated on a CPU (2.5 s)
@pytest.mark.parametrize(("dtype", "atol"), slow_after([(torch.float64, 1e-12), (torch.float16, 5e-4), (torch.bfloat16, 4e-3)]))
def test_a_models_vectors_come_back_in_its_type(tiny_st_dir, dtype, atol):
    """model.half() / .to(torch.bfloat16) / .double(): sentence-transformers returns the vectors in the model's type (a
    bfloat16 array as float32, which numpy lacks); bertkit returned float32 whatever the model's type, so the same
    script saved arrays twice the size and compared other dtypes, and a float64 model's vectors were rounded to float32
    (4e-8 from its own). The numbers agree within the type's rounding."""
    ours = SentenceTransformer(tiny_st_dir).to(dtype)
    ref = st.SentenceTransformer(str(tiny_st_dir), device="cpu").to(dtype)
    for kwargs in ({}, {"convert_to_tensor": True}, {"convert_to_numpy": False}, {"normalize_embeddings": True}):
        _same(ours.encode(TEXTS, **kwargs), ref.encode(TEXTS, **kwargs), atol=atol)
    _same(ours.encode(TEXTS[0]), ref.encode(TEXTS[0]), atol=atol)


@pytest.mark.parametrize("dtype", slow_after([torch.bfloat16, torch.float16]))  # float16 emulated: 3.7 s against 0.5 s
def test_a_half_models_precision_quantizes_the_vectors_encode_returns(tiny_st_dir, dtype):
    """encode(precision=...) quantizes the vectors encode returns, in the model's type: byte for byte
    quantize_embeddings(encode(texts)), as in sentence-transformers. bertkit quantized the float32 values before their
    rounding to the model's type, other buckets than quantize_embeddings(encode(...)) gave (275 of 1,920 int8 values
    on a bfloat16 MiniLM)."""
    ours = SentenceTransformer(tiny_st_dir).to(dtype)
    ref = st.SentenceTransformer(str(tiny_st_dir), device="cpu").to(dtype)
    for precision in ("int8", "uint8", "binary"):
        np.testing.assert_array_equal(ref.encode(TEXTS, precision=precision),
                                      st.quantize_embeddings(ref.encode(TEXTS), precision))
        np.testing.assert_array_equal(ours.encode(TEXTS, precision=precision),
                                      quantize_embeddings(ours.encode(TEXTS), precision))


def test_truncate_dim_set_on_the_model_is_checked_as_at_load_and_per_call(models):
    """model.truncate_dim = -1 went unchecked (the constructor and encode(truncate_dim=) refuse it): encode sliced 383
    of 384 dimensions and get_embedding_dimension said -1, as sentence-transformers does; 0 gave empty vectors where
    get_embedding_dimension said 384. The setter checks the value as the constructor does."""
    ours, ref = models
    ref.truncate_dim = -1
    assert ref.encode(TEXTS[:2]).shape == (2, 383) and ref.get_embedding_dimension() == -1
    ref.truncate_dim = None
    for bad in (-1, 0, 385, 2.0, True):
        with pytest.raises(BertkitError, match=rf"truncate_dim {bad!r} must be a whole number in \[1, 384\]"):
            ours.truncate_dim = bad
    assert ours.truncate_dim is None and ours.encode(TEXTS[:2]).shape == (2, 384)
    with ours.truncate_sentence_embeddings(20), ref.truncate_embeddings(20):  # sentence-transformers' name before 6
        assert ours.get_embedding_dimension() == 20
        _same(ours.encode(TEXTS[:2]), ref.encode(TEXTS[:2]))
    assert ours.truncate_dim is None


def test_similarity_fn_name_set_to_none_is_cosine_as_in_sentence_transformers(st_dir):
    """model.similarity_fn_name = None: sentence-transformers' setter takes it (its getter then says, and its similarity
    computes, "cosine"); bertkit refused it as a name."""
    ours = SentenceTransformer(st_dir, similarity_fn_name="dot")
    ref = st.SentenceTransformer(str(st_dir), device="cpu", similarity_fn_name="dot")
    for model in (ours, ref):
        model.similarity_fn_name = None
    assert ours.similarity_fn_name == ref.similarity_fn_name == "cosine"
    emb = ours.encode(TEXTS[:3])
    _same(ours.similarity(emb, emb), ref.similarity(emb, emb), atol=1e-6)


def test_encode_puts_back_the_mode_it_found(models):
    """encode on a model in training mode embeds without dropout, as sentence-transformers does, and turns training
    mode back on, where sentence-transformers leaves the model in eval mode (docs/sentence.md, where bertkit differs)."""
    ours, ref = models
    try:
        for model in (ours, ref):
            model.train()
        _same(ours.encode(TEXTS[:3]), ref.encode(TEXTS[:3]))
        assert ours.training and ours.bert.training and not ref.training
    finally:
        ours.eval(), ref.eval()


def test_a_default_prompt_name_set_to_no_prompt_is_refused_naming_it(st_dir):
    """model.default_prompt_name = "qeury" (a prompt the model does not have): sentence-transformers encodes without a
    prompt, other vectors than the prompt meant, without a word; bertkit refuses it at encode, naming
    default_prompt_name (its message said prompt_name, which the call had not given)."""
    ours, ref = SentenceTransformer(st_dir), st.SentenceTransformer(str(st_dir), device="cpu")
    for model in (ours, ref):
        model.default_prompt_name = "qeury"
    _same(ref.encode(TEXTS[:2]), ref.encode(TEXTS[:2], prompt=""))
    with pytest.raises(BertkitError, match=r"default_prompt_name 'qeury' is not one of this model's prompts "
                                           r"\['document', 'passage', 'query'\]"):
        ours.encode(TEXTS[:2])


def test_a_default_prompt_name_the_prompts_lack_is_refused_at_save(st_dir, tmp_path):
    """A model whose prompts are replaced after loading (model.prompts = {"query": ...}) keeps its default_prompt_name
    "passage": sentence-transformers' save writes that directory, and neither library then loads it ("Default prompt
    name 'passage' not found"); bertkit's save wrote it too. It is refused at save now, naming the name and the
    prompts, before anything is written."""
    ours, ref = SentenceTransformer(st_dir, default_prompt_name="passage"), st.SentenceTransformer(
        str(st_dir), device="cpu", default_prompt_name="passage")
    for model in (ours, ref):
        model.prompts = {"query": "query: "}
    ref.save(str(tmp_path / "st"))
    with pytest.raises(ValueError, match="Default prompt name 'passage' not found"):
        st.SentenceTransformer(str(tmp_path / "st"), device="cpu")
    with pytest.raises(BertkitError, match=r"default_prompt_name 'passage' is not one of this model's prompts "
                                           r"\['query'\], so the saved directory would not load"):
        ours.save(tmp_path / "ours")
    assert not (tmp_path / "ours").exists()


def test_model_kwargs_dtype_loads_the_encoder_in_that_dtype_as_sentence_transformers(tiny_st_dir, data_dir):
    """``SentenceTransformer(path, model_kwargs={"torch_dtype": torch.bfloat16})`` (sentence-transformers' way to
    embed in bf16 or fp16; ``dtype`` since transformers 4.56, ``"auto"``: the saved one) loads the encoder in that
    type, as there: bertkit refused model_kwargs whole, advising to drop it, after which the script embedded in
    float32. The CrossEncoder takes it too; any other key is refused by name."""
    rows = (data_dir / "glue" / "SST-2" / "dev.tsv").read_text(encoding="utf-8").splitlines()[1:25]
    texts = [r.split("\t")[0] for r in rows]
    for kwargs in ({"torch_dtype": torch.bfloat16}, {"dtype": "bfloat16"}, {"torch_dtype": "float16"}):
        ours = SentenceTransformer(tiny_st_dir, model_kwargs=kwargs)
        theirs = st.SentenceTransformer(str(tiny_st_dir), device="cpu", model_kwargs=kwargs)
        dtype = next(theirs.parameters()).dtype
        assert next(ours.parameters()).dtype == dtype != torch.float32
        got = ours.encode(texts, convert_to_tensor=True)
        want = theirs.encode(texts, convert_to_tensor=True)
        assert got.dtype == want.dtype == dtype
        # bertkit normalises in float32 before rounding to the type: within one rounding of the type at 0.5
        torch.testing.assert_close(got.float(), want.float(), rtol=0, atol=4e-3 if dtype == torch.bfloat16 else 5e-4)
    auto = SentenceTransformer(tiny_st_dir, model_kwargs={"dtype": "auto"})
    assert next(auto.parameters()).dtype == torch.float32  # config.json's (the weights are float32)

    pairs = [(texts[i], texts[i + 1]) for i in range(8)]
    st_ce = pytest.importorskip("sentence_transformers.cross_encoder")
    ce = CrossEncoder(tiny_st_dir, model_kwargs={"torch_dtype": torch.bfloat16})
    st_ce_model = st_ce.CrossEncoder(str(tiny_st_dir), device="cpu", model_kwargs={"torch_dtype": torch.bfloat16})
    assert ce.model.dtype == next(st_ce_model.parameters()).dtype == torch.bfloat16
    assert ce.predict(pairs).dtype == np.float32
    with pytest.raises(BertkitError, match=r"SentenceTransformer\(model_kwargs=...\) sets \['device_map'\], which "
                                           "bertkit does not implement: it takes dtype, torch_dtype, attn_impl"):
        SentenceTransformer(tiny_st_dir, model_kwargs={"dtype": "bfloat16", "device_map": "auto"})
    with pytest.raises(BertkitError, match=r"CrossEncoder\(model_kwargs=...\) sets \['load_in_8bit'\]"):
        CrossEncoder(tiny_st_dir, model_kwargs={"load_in_8bit": True})
    with pytest.raises(BertkitError, match="pass dtype= or torch_dtype="):
        SentenceTransformer(tiny_st_dir, model_kwargs={"dtype": "bfloat16", "torch_dtype": "bfloat16"})


def test_a_model_saved_in_half_precision_warns_that_it_is_computed_in_float32(tiny_st_dir, tmp_path, caplog):
    """A model given model_kwargs={"dtype": torch.bfloat16} and saved is computed in float32 when loaded again, where
    sentence-transformers 6 computes it in bfloat16 (transformers 5 loads with dtype="auto"): it came back without a
    word, its vectors a bf16 rounding from sentence-transformers' on the same directory. The warning names the saved
    type and model_kwargs={"dtype": "auto"}, which computes in it as there; asking for a dtype, or a float32 save,
    warns nothing. The CrossEncoder likewise (the SparseEncoder: tests/test_sparse_dtype.py)."""
    texts = ["The cat sat on the mat near the door.", "Which team won Super Bowl 50?"]
    saved, ce_saved = tmp_path / "bf16", tmp_path / "ce-bf16"
    SentenceTransformer(tiny_st_dir, model_kwargs={"dtype": torch.bfloat16}).save(saved)
    CrossEncoder(tiny_st_dir, model_kwargs={"dtype": torch.bfloat16}).save(ce_saved)
    with caplog.at_level(logging.WARNING, logger="bertkit"):
        ours = SentenceTransformer(saved)
        CrossEncoder(ce_saved)
    for where in (saved, ce_saved):
        assert (f"{where} was saved in bfloat16 and is computed in float32, where sentence-transformers 6 computes it "
                'in bfloat16: the vectors and scores differ by bfloat16 rounding; load it with model_kwargs={"dtype": '
                '"auto"} to compute in bfloat16 as there') in caplog.text
    theirs = st.SentenceTransformer(str(saved), device="cpu")
    assert next(ours.parameters()).dtype == torch.float32 and next(theirs.parameters()).dtype == torch.bfloat16
    want = theirs.encode(texts, convert_to_tensor=True).float()
    assert (ours.encode(texts, convert_to_tensor=True) - want).abs().max() > 1e-3  # what the warning is about
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="bertkit"):
        auto = SentenceTransformer(saved, model_kwargs={"dtype": "auto"})
        SentenceTransformer(saved, model_kwargs={"dtype": torch.float32})
        CrossEncoder(ce_saved, model_kwargs={"dtype": "auto"})
        SentenceTransformer(tiny_st_dir)
    assert caplog.text == ""
    assert next(auto.parameters()).dtype == torch.bfloat16
    # bertkit normalises in float32 before rounding to the type: within one rounding of the type at 0.5
    torch.testing.assert_close(auto.encode(texts, convert_to_tensor=True).float(), want, rtol=0, atol=4e-3)


def test_texts_without_words_give_sentence_transformers_vectors_and_scores(models, minilm_2_layers, tmp_path):
    """The encoders' rule for an empty text (sentence-transformers 6.3's, in its three classes): "", whitespace,
    control and zero-width characters are read as [CLS] [SEP] alone, each giving the same vector or score, not
    refused (the pipelines and servers refuse them: docs/inference.md). SparseEncoder's: tests/test_sparse_encoder.py."""
    from cross_encoder_helpers import cross_encoder_directory

    texts = ["", " ", "\t\n", "\x00\x01", "\u200b", "hi"]
    ours, ref = models
    got = ours.encode(texts)
    _same(got, ref.encode(texts))
    # the same vector: to float32 rounding, as the GEMM may round a row by where it falls in a block (MKL's AVX2 path
    # on a Xeon put 1e-8 between the five)
    np.testing.assert_allclose(got[:5], np.repeat(got[:1], 5, axis=0), rtol=0, atol=1e-6)
    assert not np.allclose(got[0], got[5])
    directory = cross_encoder_directory(minilm_2_layers, tmp_path / "ce")
    pairs = [(t, "Paris is in France.") for t in texts] + [("Where is Paris?", t) for t in texts]
    scores = CrossEncoder(directory).predict(pairs)
    _same(scores, st.CrossEncoder(str(directory), device="cpu").predict(pairs))
    assert np.ptp(scores[:5]) <= 1e-6 and np.ptp(scores[6:11]) <= 1e-6
