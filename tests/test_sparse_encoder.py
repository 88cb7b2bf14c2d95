"""bertkit.sentence.SparseEncoder beside sentence-transformers 6's on the same weights: MiniLM's first 2 layers with a
masked-LM head drawn by transformers (seed 0; its bias set to -3.5, so a text activates some hundreds of the
30,522 word pieces, as a trained SPLADE model's few), in each directory layout sentence-transformers writes. Same
sparse vectors (indices identical, values within 1e-5), each directory read both ways, the same parameter names,
decode / similarity / sparsity, the same evaluator metrics; bad input refused by name. Texts: SQuAD dev."""

from __future__ import annotations

import copy
import json
import re
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from bertkit.errors import BertkitError
from cases import slow_after
from sentence_helpers import glue_rows
from sparse_helpers import masked_lm_checkpoint

st = pytest.importorskip("sentence_transformers")
transformers = pytest.importorskip("transformers")
from sentence_transformers.sparse_encoder.modules import (  # noqa: E402
    MLMTransformer,
    Router,
    SparseStaticEmbedding,
    SpladePooling,
)
from sentence_transformers.sparse_encoder.modules import Transformer as STTransformer  # noqa: E402

LAYOUTS = ("checkpoint", "splade", "mlm_transformer", "inference_free")


def _squad(data_dir: Path):
    path = data_dir / "squad" / "dev-v1.1.json"
    if not path.is_file():
        pytest.skip(f"{path} absent")
    return json.loads(path.read_text())["data"]


@pytest.fixture(scope="module")
def texts(data_dir):
    articles = _squad(data_dir)
    # 3 paragraphs (~150 word pieces: several batches of the head's chunks) and 9 questions: each layout's
    # vectors are computed several ways by both libraries, in every test of this file and test_sparse_serve.py
    paragraphs = [p["context"] for p in articles[0]["paragraphs"][:3]]
    questions = [q["question"] for p in articles[0]["paragraphs"][:3] for q in p["qas"][:3]]
    return paragraphs + questions


@pytest.fixture(scope="module")
def vocab_size(minilm_2_layers) -> int:
    return json.loads((minilm_2_layers / "config.json").read_text())["vocab_size"]


@pytest.fixture(scope="module")
def layouts(tmp_path_factory, minilm_2_layers, vocab_size):
    """{layout: directory}: the masked-LM checkpoint, and the sparse directories sentence-transformers writes."""
    root = tmp_path_factory.mktemp("sparse")
    checkpoint = masked_lm_checkpoint(minilm_2_layers, root / "checkpoint")
    dirs = {"checkpoint": checkpoint}
    st.SparseEncoder(str(checkpoint), device="cpu").save(str(root / "splade"))
    dirs["splade"] = root / "splade"
    st.SparseEncoder(modules=[MLMTransformer(str(checkpoint)), SpladePooling("sum")], device="cpu").save(
        str(root / "mlm_transformer"))
    dirs["mlm_transformer"] = root / "mlm_transformer"
    document = STTransformer(str(checkpoint), transformer_task="fill-mask")
    torch.manual_seed(1)
    query = SparseStaticEmbedding(tokenizer=document.tokenizer, weight=torch.rand(vocab_size) * (torch.rand(vocab_size) < 0.5))
    router = Router.for_query_document(query_modules=[query],
                                       document_modules=[document, SpladePooling("max", "log1p_relu")])
    st.SparseEncoder(modules=[router], similarity_fn_name="dot", device="cpu").save(str(root / "inference_free"))
    dirs["inference_free"] = root / "inference_free"
    return dirs


def _assert_same_vectors(got: torch.Tensor, want: torch.Tensor, summed: bool = False) -> None:
    """Indices identical; values within 1e-5 (measured: 5.3e-6 at most, max pooling). Sum pooling adds a paragraph's
    ~150 token weights, each within 1e-6 of the reference's: within 5e-5 (measured: 1.6e-5)."""
    assert got.is_sparse and got.shape == want.shape
    got, want = got.coalesce(), want.coalesce()
    assert torch.equal(got.indices(), want.indices())
    torch.testing.assert_close(got.values(), want.values().float(), atol=5e-5 if summed else 1e-5, rtol=1e-5)


# the checkpoint's layout in make test; each sentence-transformers directory's vectors are make test's in
# test_directories_read_both_ways (on fewer texts), and all of them here in make test-slow
@pytest.mark.parametrize("layout", slow_after(LAYOUTS, keep=1))
def test_same_sparse_vectors_as_sentence_transformers(layout, layouts, texts, vocab_size):
    from bertkit.sentence import SparseEncoder

    ours, theirs = SparseEncoder(layouts[layout]), st.SparseEncoder(str(layouts[layout]), device="cpu")
    summed = layout == "mlm_transformer"
    # the reference in batches of 4 (its paragraphs apart from most questions): one batch of 12 pads every question to
    # a paragraph's length through the (B, T, vocabulary) head, 2.5x the time for the same vectors
    for method in ("encode_query", "encode_document"):
        want = getattr(theirs, method)(texts, batch_size=4)
        # several batches: the copies prepared for the CPU; one batch: the model as it is
        _assert_same_vectors(getattr(ours, method)(texts, batch_size=8), want, summed)
        _assert_same_vectors(getattr(ours, method)(texts, batch_size=64), want, summed)
    want = theirs.encode_document(texts, max_active_dims=20, convert_to_sparse_tensor=False, batch_size=4)
    got = ours.encode_document(texts, max_active_dims=20, convert_to_sparse_tensor=False)
    assert not got.is_sparse and (got != 0).sum(1).tolist() == (want != 0).sum(1).tolist()
    torch.testing.assert_close(got, want, atol=5e-5 if summed else 1e-5, rtol=1e-5)
    one = ours.encode_query(texts[-1])
    assert one.shape == (vocab_size,) and one.is_sparse
    _assert_same_vectors(one, theirs.encode_query(texts[-1]))


def test_a_masked_lm_transform_the_checkpoint_lacks_is_drawn_as_sentence_transformers_draws_it(layouts, texts,
                                                                                                  tmp_path):
    """A checkpoint with the masked-LM head's bias but not its transform: for the same seed, sentence-transformers'
    transform (drawn through transformers, as bertkit's heads draw it: SparseEncoder loads with the plain
    from_pretrained), so the same sparse vectors, and torch's generator left where it leaves it."""
    from safetensors.torch import load_file, save_file

    from bertkit.sentence import SparseEncoder

    checkpoint = shutil.copytree(layouts["checkpoint"], tmp_path / "no-transform")
    weights = {k: v for k, v in load_file(checkpoint / "model.safetensors").items() if ".transform." not in k}
    save_file(weights, checkpoint / "model.safetensors", metadata={"format": "pt"})
    torch.manual_seed(0)
    theirs = st.SparseEncoder(str(checkpoint), device="cpu")
    their_next = torch.rand(4)
    torch.manual_seed(0)
    ours = SparseEncoder(checkpoint)
    torch.testing.assert_close(torch.rand(4), their_next, rtol=0, atol=0)
    _assert_same_vectors(ours.encode(texts[-3:]), theirs.encode(texts[-3:]))


def test_model_of_features_updates_the_callers_dict_as_sentence_transformers(layouts, texts):
    """``model(features)``: sentence-transformers adds ``sentence_embedding`` (B, V) to the caller's dict and returns
    it; bertkit returned a new dict, so a ported script reading ``features["sentence_embedding"]`` after the call got a
    KeyError. Now the caller's dict, with the reference's values within 1e-5."""
    from bertkit.sentence import SparseEncoder

    ours, theirs = SparseEncoder(layouts["splade"]), st.SparseEncoder(str(layouts["splade"]), device="cpu")
    features, want = ours.tokenize(texts[:3]), theirs.preprocess(texts[:3])
    with torch.no_grad():
        assert ours(features) is features and theirs(want) is want
    torch.testing.assert_close(features["sentence_embedding"], want["sentence_embedding"], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("layout", LAYOUTS[1:])
def test_directories_read_both_ways(layout, layouts, texts, tmp_path, vocab_size):
    """bertkit reads sentence-transformers' directory, keeps its parameter names and values, writes one that
    sentence-transformers reads back to the same vectors."""
    from bertkit.sentence import SparseEncoder

    ours, theirs = SparseEncoder(layouts[layout]), st.SparseEncoder(str(layouts[layout]), device="cpu")
    want = dict(theirs.named_parameters())
    got = dict(ours.named_parameters())
    assert list(got) == list(want)  # a learning_rate_mapping's patterns select the same tensors
    assert sorted(ours.state_dict()) == sorted(theirs.state_dict())
    for name, value in want.items():
        torch.testing.assert_close(got[name], value, atol=0, rtol=0)
    ours.save(tmp_path / "saved")
    again = st.SparseEncoder(str(tmp_path / "saved"), device="cpu")
    # each SpladePooling names its width, as sentence-transformers writes it once the module has run: without it
    # sentence-transformers reports the hidden size (384) as the model's dimension until its first encode
    assert again.get_embedding_dimension() == vocab_size
    assert [m.embedding_dimension for m in again.modules() if isinstance(m, SpladePooling)] == [vocab_size]
    assert [type(m).__name__ for m in again] == [type(m).__name__ for m in theirs if type(m).__name__ != "MLMTransformer"] \
        or layout == "mlm_transformer"
    for method in ("encode_query", "encode_document"):
        _assert_same_vectors(getattr(again, method)(texts[-6:]), getattr(theirs, method)(texts[-6:]))
    assert again.max_seq_length == theirs.max_seq_length
    mine = SparseEncoder(tmp_path / "saved")
    assert dict(mine.named_parameters()).keys() == want.keys()
    assert mine.max_seq_length == ours.max_seq_length == theirs.max_seq_length


def test_decode_similarity_sparsity_as_sentence_transformers(layouts, texts, vocab_size):
    from bertkit.sentence import SparseEncoder

    ours, theirs = SparseEncoder(layouts["splade"]), st.SparseEncoder(str(layouts["splade"]), device="cpu")
    q, d = theirs.encode_query(texts[-8:]), theirs.encode_document(texts[:4])
    assert ours.similarity_fn_name == theirs.similarity_fn_name == "dot"
    assert ours.config.vocab_size == theirs.config.vocab_size == vocab_size  # an AttributeError before
    assert ours.config.num_hidden_layers == theirs.config.num_hidden_layers == 2
    assert ours.decode(q, top_k=7) == theirs.decode(q, top_k=7)
    assert ours.decode(d[0]) == theirs.decode(d[0])
    assert ours.sparsity(q) == theirs.sparsity(q) and ours.sparsity(d.to_dense()) == theirs.sparsity(d.to_dense())
    assert ours.sparsity(q)["active_dims"] > 10  # the texts do activate word pieces
    for layout in (q.to_sparse_csr(), q.to_dense().to_sparse_csc(), q[0], q.to_dense()[0]):
        assert ours.sparsity(layout) == theirs.sparsity(layout)
    # stored entries as sentence-transformers counts them: a duplicate summed, a stored zero counted
    stored = torch.sparse_coo_tensor(torch.tensor([[0, 0, 1, 2], [4, 4, 7, 9]]), torch.tensor([1.0, 2.0, 0.0, 3.0]),
                                     (3, vocab_size))
    assert ours.sparsity(stored) == theirs.sparsity(stored) == {"active_dims": 1.0, "sparsity_ratio": 1 - 1 / vocab_size}
    with pytest.raises(BertkitError, match="got the layout torch.sparse_bsr"):
        ours.sparsity(q.to_dense()[:, :vocab_size - vocab_size % 2].to_sparse_bsr((2, 2)))
    inter = ours.intersection(q[0], d)
    torch.testing.assert_close(inter.to_dense(), theirs.intersection(q[0], d).to_dense())
    for name in ("dot", "cosine", "euclidean", "manhattan"):
        ours.similarity_fn_name = theirs.similarity_fn_name = name
        with warnings.catch_warnings():  # sparse products without PyTorch's "CSR is in beta" on every call
            warnings.simplefilter("error")
            ours.similarity(q, d)
        # dot products of ~2,500 shared word pieces: float32 rounding of two summation orders (measured 2.2e-6)
        torch.testing.assert_close(ours.similarity(q, d), theirs.similarity(q, d), atol=1e-4, rtol=1e-5)
        torch.testing.assert_close(ours.similarity(q.to_dense(), d), theirs.similarity(q.to_dense(), d),
                                   atol=1e-4, rtol=1e-5)
        pairs = torch.stack([d[i] for i in (0, 1, 2, 3)]), torch.stack([q[i] for i in (0, 1, 2, 3)])
        torch.testing.assert_close(ours.similarity_pairwise(*pairs), theirs.similarity_pairwise(*pairs),
                                   atol=1e-4, rtol=1e-5)
    assert ours.similarity(q, d).shape == (8, 4)


def test_a_route_named_text_is_the_modalitys(layouts, texts, tmp_path, vocab_size):
    """sentence-transformers' Router looks for a route named as the task, then one named as the modality ("text"),
    then takes the default route: a text without a task, or of a task without a route, goes through "text"."""
    from bertkit.sentence import SparseEncoder

    document = STTransformer(str(layouts["checkpoint"]), transformer_task="fill-mask")
    query = SparseStaticEmbedding(tokenizer=document.tokenizer, weight=torch.ones(vocab_size))
    router = Router({"query": [query], "text": [document, SpladePooling("max")]}, default_route="query")
    st.SparseEncoder(modules=[router], device="cpu").save(str(tmp_path / "text-route"))
    ours, theirs = SparseEncoder(tmp_path / "text-route"), st.SparseEncoder(str(tmp_path / "text-route"), device="cpu")
    one = texts[-1:]
    for method in ("encode", "encode_document", "encode_query"):
        _assert_same_vectors(getattr(ours, method)(one), getattr(theirs, method)(one))
    assert ours.sparsity(ours.encode(one))["active_dims"] > 10 * ours.sparsity(ours.encode_query(one))["active_dims"]



def test_a_task_against_its_method_or_keyed_texts_are_refused(layouts, texts):
    """encode_query(task="document") (sentence-transformers raises a TypeError) embedded queries by the document
    route under encode_query's name; [{"query": text}], which sentence-transformers' Router reads as texts of that
    task, was refused as a dict "sentence-transformers refuses too". Each now names the call to make instead."""
    from bertkit.sentence import SparseEncoder

    ours = SparseEncoder(layouts["inference_free"])
    with pytest.raises(BertkitError, match=r"encode_query\(\) routes by task='query', not task='document': call "
                                           r"encode\(..., task='document'\)"):
        ours.encode_query(texts[-2:], task="document")
    with pytest.raises(BertkitError, match=r"encode_document\(\) routes by task='document', not task='query'"):
        ours.encode_document(texts[-2:], task="query")
    with pytest.raises(BertkitError, match=r"input 0 is \{'query': ...\}, sentence-transformers' older form of texts "
                                           r"of a task: pass the texts and task='query'"):
        ours.encode([{"query": t} for t in texts[-2:]])


# each layout once and each max_active_dims once (the grid's other two cells repeat what these exercise). The corpus
# in chunks of 9 and 3: sentence-transformers reports the corpus sparsity as each chunk's float32 mean weighted by
# its size (a mean of 9 paragraphs' counts is seldom a float32); bertkit took the whole corpus's mean (corpus active
# dims 3390.25 against sentence-transformers' 3390.24994, measured)
# the inference-free layout with max_active_dims under an evaluator is make test's in test_triplet_evaluator_metrics
@pytest.mark.parametrize("layout,max_active_dims,chunk", [("splade", None, 9),
                                                          pytest.param("inference_free", 48, 50000, marks=pytest.mark.slow)])
def test_information_retrieval_evaluator_metrics(layout, max_active_dims, chunk, layouts, data_dir, vocab_size):
    from sentence_transformers.sparse_encoder.evaluation import (
        SparseInformationRetrievalEvaluator as Reference,
    )

    from bertkit.sentence import SparseEncoder
    from bertkit.sentence.sparse_encoder.evaluation import SparseInformationRetrievalEvaluator

    held_out = _squad(data_dir)[1]["paragraphs"][:12]
    corpus = {f"p{i}": p["context"] for i, p in enumerate(held_out)}
    queries = {f"q{i}-{j}": q["question"] for i, p in enumerate(held_out) for j, q in enumerate(p["qas"][:2])}
    relevant = {qid: {f"p{qid[1:].split('-')[0]}"} for qid in queries}
    # the reference in batches of 4 (its default of 32 pads the 12 paragraphs to the longest through the (B, T, vocabulary)
    # head: 1.6x the time for the same vectors)
    want = Reference(queries, corpus, relevant, name="squad", max_active_dims=max_active_dims, batch_size=4,
                     corpus_chunk_size=chunk)(st.SparseEncoder(str(layouts[layout]), device="cpu"))
    got = SparseInformationRetrievalEvaluator(queries, corpus, relevant, name="squad", max_active_dims=max_active_dims,
                                              corpus_chunk_size=chunk)(SparseEncoder(layouts[layout]))
    assert list(got) == list(want)
    # Where the CPU has no bf16 instructions the vocabulary product runs on oneDNN's fp32 kernel (the same probe as
    # splade_embedder's), whose rounding differs from F.linear's by ~1e-7: a logit that close to 0 is active on one
    # side only (one word piece of one paragraph on an AVX2 EPYC: corpus active dims 1673.25 against 1673.1667)
    from bertkit._hardware import cpu_has_bf16, onednn_linear

    flip = 0.0 if onednn_linear() and cpu_has_bf16() else 1.0
    sizes = {"query": len(queries), "corpus": len(corpus)}
    for key, value in want.items():
        side = next((n for n in sizes if key.startswith(f"squad_{n}_")), None)
        # a flip moves a side's mean active dims by 1 / its texts, and its sparsity ratio by that over the vocabulary
        tolerance = 1e-6 if side is None else 1e-6 + flip / sizes[side] * (1.0 if key.endswith("active_dims")
                                                                          else 1.0 / vocab_size)
        assert got[key] == pytest.approx(value, abs=tolerance), key
    assert {"squad_dot_ndcg@10", "squad_query_active_dims", "squad_corpus_sparsity_ratio", "squad_avg_flops"} <= set(got)
    assert got["squad_avg_flops"] > 0


def _same_metrics(got: dict, want: dict) -> None:
    assert list(got) == list(want)
    for key, value in want.items():
        assert got[key] == pytest.approx(float(value), abs=1e-6), key


# max_active_dims=None under an evaluator is make test's in test_information_retrieval_evaluator_metrics
@pytest.mark.parametrize("max_active_dims", [pytest.param(None, marks=pytest.mark.slow), 48])
def test_embedding_similarity_evaluator_metrics(max_active_dims, layouts, data_dir, vocab_size):
    """STS-B dev's first 24 pairs: correlations per similarity function and the mean sparsity of the two sides."""

    from sentence_transformers.sparse_encoder.evaluation import (
        SparseEmbeddingSimilarityEvaluator as Reference,
    )

    from bertkit.sentence import SparseEncoder
    from bertkit.sentence.sparse_encoder.evaluation import SparseEmbeddingSimilarityEvaluator

    rows = glue_rows(data_dir, "STS-B", n=24)
    args = [r[7] for r in rows], [r[8] for r in rows], [float(r[9]) for r in rows]
    kwargs = {"name": "sts", "max_active_dims": max_active_dims} | (
        {} if max_active_dims is None else {"similarity_fn_names": ["dot", "cosine", "euclidean", "manhattan"]})
    want = Reference(*args, **kwargs)(st.SparseEncoder(str(layouts["splade"]), device="cpu"))
    evaluator = SparseEmbeddingSimilarityEvaluator(*args, **kwargs)
    got = evaluator(SparseEncoder(layouts["splade"]))
    _same_metrics(got, want)
    assert evaluator.primary_metric == ("sts_spearman_dot" if max_active_dims is None else "sts_spearman_max")
    # the texts activate more than 48 word pieces each: max_active_dims keeps 48
    assert got["sts_active_dims"] > 48 if max_active_dims is None else got["sts_active_dims"] == 48
    assert got["sts_sparsity_ratio"] == pytest.approx(1 - got["sts_active_dims"] / vocab_size)


@pytest.mark.parametrize("max_active_dims", [pytest.param(None, marks=pytest.mark.slow), 48])
def test_triplet_evaluator_metrics(max_active_dims, layouts, texts):
    """Inference-free layout (anchors through the static query side): each question, its paragraph, and the next
    paragraph; accuracies per similarity function (with margins), each side's sparsity."""
    from sentence_transformers.sparse_encoder.evaluation import SparseTripletEvaluator as Reference

    from bertkit.sentence import SparseEncoder
    from bertkit.sentence.sparse_encoder.evaluation import SparseTripletEvaluator

    paragraphs, questions = texts[:3], texts[3:]  # questions i // 3 of paragraph i % 3; 5 of them
    picked = range(0, 9, 2)
    args = ([questions[i] for i in picked], [paragraphs[i // 3] for i in picked],
            [paragraphs[(i // 3 + 1) % 3] for i in picked])
    kwargs = {"name": "squad", "max_active_dims": max_active_dims} | (
        {} if max_active_dims is None else {"similarity_fn_names": ["dot", "cosine"], "margin": {"dot": 2.0}})
    want = Reference(*args, **kwargs)(st.SparseEncoder(str(layouts["inference_free"]), device="cpu"))
    got = SparseTripletEvaluator(*args, **kwargs)(SparseEncoder(layouts["inference_free"]))
    _same_metrics(got, want)
    assert [k for k in got if "active_dims" in k] == [f"squad_{side}_active_dims" for side in
                                                      ("anchor", "positive", "negative")]
    # the static query side weighs a question's own word pieces only (half of them drawn 0: 3.4 of ~10, measured);
    # SPLADE's paragraphs activate a thousand and more (1656.2 here, measured), or max_active_dims of them
    assert got["squad_anchor_active_dims"] == pytest.approx(17 / 5)
    assert got["squad_positive_active_dims"] == pytest.approx(max_active_dims or 1656.2, abs=0.01)


@pytest.mark.parametrize("max_active_dims,batched", [(48, True), pytest.param(None, False, marks=pytest.mark.slow)])
def test_reranking_evaluator_metrics(max_active_dims, batched, layouts, texts):
    """Each question against its paragraph and one or two others (cosine, at_k 2); unbatched, the candidates'
    sparsity is the mean of each sample's mean, as sentence-transformers reports it then."""
    from sentence_transformers.sparse_encoder.evaluation import SparseRerankingEvaluator as Reference

    from bertkit.sentence import SparseEncoder
    from bertkit.sentence.sparse_encoder.evaluation import SparseRerankingEvaluator

    paragraphs, questions = texts[:3], texts[3:]
    samples = [{"query": questions[i], "positive": [paragraphs[i // 3]],
                "negative": [paragraphs[(i // 3 + j) % 3] for j in range(1, 3 if i < 3 else 2)]} for i in range(0, 9, 2)]
    kwargs = {"name": "squad", "at_k": 2, "max_active_dims": max_active_dims, "use_batched_encoding": batched}
    want = Reference(samples, **kwargs)(st.SparseEncoder(str(layouts["splade"]), device="cpu"))
    got = SparseRerankingEvaluator(samples, **kwargs)(SparseEncoder(layouts["splade"]))
    _same_metrics(got, want)
    assert 0 < got["squad_map"] < 1
    if max_active_dims:
        assert got["squad_corpus_active_dims"] == max_active_dims
        return
    # samples of 3 and of 2 candidates: the mean over samples of each one's mean is not the mean over candidates
    active = [SparseEncoder.sparsity(v)["active_dims"] for v in SparseEncoder(layouts["splade"]).encode_document(paragraphs)]
    per_sample = [[active[paragraphs.index(c)] for c in x["positive"] + x["negative"]] for x in samples]
    assert got["squad_corpus_active_dims"] == pytest.approx(sum(sum(a) / len(a) for a in per_sample) / len(samples))
    assert abs(got["squad_corpus_active_dims"] - sum(map(sum, per_sample)) / sum(map(len, per_sample))) > 1


def test_information_retrieval_evaluator_takes_its_arguments_in_sentence_transformers_order(layouts, tmp_path):
    """max_active_dims is the 14th argument, where the dense evaluator has truncate_dim: given by position it keeps
    each vector's 5 largest weights (bertkit took it for truncate_dim and kept every weight: the queries' active
    dimensions 141.7 against 5.0, and the ranking metrics of unpruned vectors)."""
    from sentence_transformers.sparse_encoder.evaluation import (
        SparseInformationRetrievalEvaluator as Reference,
    )

    from bertkit.sentence import SparseEncoder
    from bertkit.sentence.sparse_encoder.evaluation import SparseInformationRetrievalEvaluator

    corpus = dict(enumerate(["The weather is lovely today.", "He drove to the stadium after lunch.",
                             "Cats sleep all day long.", "Rain fell on the town all week.",
                             "The stadium holds fifty thousand fans."]))
    queries = {"q0": "how is the weather", "q1": "who drove to the stadium", "q2": "stadium size"}
    relevant = {"q0": {0, 3}, "q1": {1}, "q2": {4, 1}}
    by_position = (queries, corpus, relevant, 50000, [10], [10], [1, 3], [1, 3], [100], False, 32, "ir", False, 5)
    got = SparseInformationRetrievalEvaluator(*by_position)(SparseEncoder(layouts["splade"]), str(tmp_path))
    want = Reference(*by_position)(st.SparseEncoder(str(layouts["splade"]), device="cpu"), str(tmp_path))
    assert got["ir_query_active_dims"] == got["ir_corpus_active_dims"] == 5.0
    assert got.keys() == want.keys()
    for key, value in want.items():
        assert got[key] == pytest.approx(value, abs=1e-6), key


def test_sparse_evaluators_refuse_a_bad_max_active_dims_when_made():
    """Before any work: an evaluator handed to the trainer first runs after eval_steps of training (and their
    checkpoints), where encode would refuse it (bertkit accepted max_active_dims 0 when the evaluator was made, as
    sentence-transformers does). Above the vocabulary size is refused by encode, before the evaluator encodes."""
    from bertkit.sentence.sparse_encoder import evaluation

    makers = {"SparseInformationRetrievalEvaluator": lambda k: evaluation.SparseInformationRetrievalEvaluator(
                  {"q": "a question"}, {"d": "a document"}, {"q": {"d"}}, max_active_dims=k),
              "SparseEmbeddingSimilarityEvaluator": lambda k: evaluation.SparseEmbeddingSimilarityEvaluator(
                  ["a", "c"], ["b", "d"], [1.0, 0.0], max_active_dims=k),
              "SparseTripletEvaluator": lambda k: evaluation.SparseTripletEvaluator(["a"], ["b"], ["c"], max_active_dims=k),
              "SparseRerankingEvaluator": lambda k: evaluation.SparseRerankingEvaluator(
                  [{"query": "a", "positive": ["b"], "negative": ["c"]}], max_active_dims=k)}
    for name, make in makers.items():
        for k in (0, -3, 2.5, True, "5"):
            with pytest.raises(BertkitError, match=rf"{name}: max_active_dims {k!r} must be a whole number >= 1"):
                make(k)
        assert make(np.int64(5)).max_active_dims == 5 and make(None).max_active_dims is None


def test_sparse_evaluators_not_implemented_are_refused_by_name():
    """Every sparse evaluator sentence-transformers has: bertkit's, or refused naming what to use instead."""
    from sentence_transformers.sparse_encoder import evaluation as reference

    from bertkit.sentence import evaluation as dense
    from bertkit.sentence.sparse_encoder import evaluation

    refused = []
    for name in reference.__all__:
        if name in evaluation.__all__:  # built on bertkit's dense evaluator, as sentence-transformers' on its own
            assert issubclass(getattr(evaluation, name), getattr(dense, getattr(reference, name).__mro__[1].__name__))
            continue
        with pytest.raises(BertkitError, match=f"evaluation.{name} is not implemented in bertkit: "):
            getattr(evaluation, name)
        refused.append(name)
    assert sorted(evaluation.__all__) == ["SparseEmbeddingSimilarityEvaluator", "SparseInformationRetrievalEvaluator",
                                          "SparseRerankingEvaluator", "SparseTripletEvaluator"]
    assert len(refused) == len(reference.__all__) - 4
    with pytest.raises(AttributeError, match="has no attribute 'SparseNoSuchEvaluator'"):
        evaluation.SparseNoSuchEvaluator  # noqa: B018



def test_the_models_import_of_sentence_transformers_5_assembles_the_same_encoder(layouts, texts):
    """``from sentence_transformers.sparse_encoder.models import MLMTransformer, SpladePooling`` (sentence-transformers
    5's module name, which 6 still imports) was a ModuleNotFoundError here; now it is the modules', and every module
    sentence-transformers has is bertkit's or refused by name (SparseAutoEncoder was Python's "cannot import name")."""
    from sentence_transformers.sparse_encoder import modules as reference

    from bertkit.sentence.sparse_encoder import SparseEncoder, models, modules

    checkpoint = str(layouts["checkpoint"])
    ours = SparseEncoder(modules=[models.MLMTransformer(checkpoint), models.SpladePooling("sum")])
    theirs = st.SparseEncoder(modules=[MLMTransformer(checkpoint), SpladePooling("sum")], device="cpu")
    _assert_same_vectors(ours.encode(texts[:4]), theirs.encode(texts[:4]), summed=True)
    for name in reference.__all__:
        if name in models.__all__:
            assert getattr(models, name) is getattr(modules, name)
            continue
        with pytest.raises(BertkitError, match=rf"^sparse_encoder.modules.{name} is not implemented in bertkit: "):
            getattr(models, name)
    assert sorted(set(reference.__all__) - set(models.__all__)) == ["Asym", "Dense", "InputModule", "Module",
                                                                    "SparseAutoEncoder"]

@pytest.mark.parametrize("strategy,activation", [("max", "relu"), ("sum", "log1p_relu")])
def test_splade_pooling_chunks_give_the_same_vectors(strategy, activation, tmp_path, tiny_checkpoint, minilm_dir,
                                                    caplog):
    """Blocks of the head's rows (chunk_size; blocks that split a text) give what the whole batch gives, which is
    the reference's formula on the full (B, T, V) logits."""
    from bertkit.sentence import SparseEncoder
    from bertkit.sentence.sparse_encoder.modules import SpladePooling as Pooling
    from bertkit.sentence.sparse_encoder.modules import Transformer

    directory = tiny_checkpoint(tmp_path / "tiny", "BertForPreTraining", tokenizer=minilm_dir)  # a bertkit checkpoint
    transformer = Transformer(directory, transformer_task="fill-mask")
    texts = ["The weather is lovely today.", "He drove to the stadium in a red car after a long lunch.", "Hi"]
    batch = transformer.tokenize(texts)
    with torch.no_grad():
        logits = transformer.model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"]).logits
        x = (logits * batch["attention_mask"].unsqueeze(-1)).relu().log1p()
        x = x.log1p() if activation == "log1p_relu" else x
        want = x.amax(1) if strategy == "max" else x.sum(1)
        for chunk in (None, 1, 3, 100):
            model = SparseEncoder(modules=[transformer, Pooling(strategy, activation, chunk_size=chunk)])
            got = model(dict(batch))["sentence_embedding"]
            torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)
    with caplog.at_level("WARNING", logger="bertkit"):
        opened = SparseEncoder(directory)  # a checkpoint with a masked-LM head: a new SPLADE model, max and relu
    # sentence-transformers builds SPLADE only for a ...ForMaskedLM architecture, CSR (not SPLADE) for this one
    assert "architectures ['BertForPreTraining'] name no ...ForMaskedLM: sentence-transformers opens" in caplog.text
    assert [type(m).__name__ for m in opened] == ["Transformer", "SpladePooling"]
    assert (opened[1].pooling_strategy, opened[1].activation_function) == ("max", "relu")
    assert opened.get_embedding_dimension() == 30522


# -- bad input: refused by name, before any work, nothing written ------------------------------------------------

def _listing(directory: Path) -> list[str]:
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*"))


def test_a_masked_lm_checkpoint_is_splade_in_both_libraries(layouts, caplog):
    from bertkit.sentence import SparseEncoder

    with caplog.at_level("WARNING", logger="bertkit"):
        SparseEncoder(layouts["checkpoint"])  # architectures ['BertForMaskedLM']: sentence-transformers' SPLADE too
    assert "ForMaskedLM" not in caplog.text


def test_checkpoint_without_masked_lm_head_is_refused(minilm_dir):
    from bertkit.sentence import SparseEncoder

    before = _listing(minilm_dir)
    with pytest.raises(BertkitError, match=r"no masked-LM head .*architectures \['BertModel'\]"):
        SparseEncoder(minilm_dir)
    assert _listing(minilm_dir) == before


def test_vocabulary_other_than_the_tokenizers_is_refused(layouts, tmp_path, vocab_size):
    from bertkit.sentence import SparseEncoder

    broken = tmp_path / "other-vocab"
    shutil.copytree(layouts["checkpoint"], broken)
    (broken / "tokenizer.json").unlink()
    words = (broken / "vocab.txt").read_text().splitlines()
    (broken / "vocab.txt").write_text("\n".join(words[:8000]) + "\n")
    before = _listing(broken)
    with pytest.raises(BertkitError, match=f"vocabulary has {vocab_size} entries .* but its tokenizer 8000"):
        SparseEncoder(broken)
    assert _listing(broken) == before


def test_bad_arguments_are_refused(layouts, tmp_path, vocab_size):
    from bertkit.sentence import SparseEncoder
    from bertkit.sentence.sparse_encoder.modules import SpladePooling as Pooling

    model = SparseEncoder(layouts["splade"])
    assert model.encode(["a text"], max_active_dims=np.int64(3)).coalesce().values().numel() == 3
    for k in (0, vocab_size + 1, True, 2.5, np.int64(0)):
        with pytest.raises(BertkitError, match=rf"max_active_dims .* must be a whole number in \[1, {vocab_size}\]"):
            model.encode(["a text"], max_active_dims=k)
        with pytest.raises(BertkitError, match="max_active_dims"):
            SparseEncoder(layouts["splade"], max_active_dims=k)
    with pytest.raises(BertkitError, match="pooling_strategy 'mean' is not one of"):
        Pooling("mean")
    with pytest.raises(BertkitError, match="activation_function 'gelu' is not one of"):
        Pooling("max", "gelu")
    with pytest.raises(BertkitError, match="convert_to_numpy=...\\) is not an argument of sparse encoders"):
        model.encode(["a text"], convert_to_numpy=True)
    with pytest.raises(BertkitError, match="backend=...\\) is not implemented"):
        SparseEncoder(layouts["splade"], backend="onnx")
    with pytest.raises(BertkitError, match="multi-process encoding"):
        model.encode(["a text"], device=["cpu", "cpu"])
    # sentence-transformers 6's per-call tokenizer settings: "encode() got arguments bertkit does not implement" before
    with pytest.raises(BertkitError, match=r"encode\(processing_kwargs=...\) is not implemented in bertkit: texts are "
                                           "cut at the model's max_seq_length"):
        model.encode(["a text"], processing_kwargs={"text": {"max_length": 8}})
    assert model.encode(["a text"], processing_kwargs=None).shape == (1, vocab_size)
    bad = tmp_path / "bad-pooling"
    shutil.copytree(layouts["splade"], bad)
    (bad / "1_SpladePooling" / "config.json").write_text(json.dumps({"pooling_strategy": "mean"}))
    with pytest.raises(BertkitError, match="pooling_strategy 'mean' is not one of \\['max', 'sum'\\]"):
        SparseEncoder(bad)
    modules = json.loads((bad / "modules.json").read_text())
    modules[1]["type"] = "sentence_transformers.sparse_encoder.modules.sparse_auto_encoder.SparseAutoEncoder"
    (bad / "modules.json").write_text(json.dumps(modules))
    before = _listing(bad)
    with pytest.raises(BertkitError, match=r"lists \['SparseAutoEncoder'\], which bertkit's SparseEncoder does not"):
        SparseEncoder(bad)
    assert _listing(bad) == before


def test_do_lower_case_lowers_each_character_as_sentence_transformers(layouts, tmp_path):
    """A SPLADE directory with do_lower_case lowers each character as sentence-transformers does (its Lowercase
    normalizer, Rust's char::to_lowercase): str.lower() of a whole word made a final Σ a ς, other word pieces
    (values 0.72 apart on this Greek text)."""
    from bertkit.sentence import SparseEncoder

    directory = tmp_path / "lower"
    shutil.copytree(layouts["splade"], directory)
    config_file = directory / "sentence_bert_config.json"
    config_file.write_text(json.dumps({**json.loads(config_file.read_text()), "do_lower_case": True}))
    texts = ["ΟΔΟΣ ΠΡΟΣ ΤΗΝ ΑΘΗΝΑ ΚΑΙ ΤΟΝ ΠΕΙΡΑΙΑ", "Plain English text"]
    want = st.SparseEncoder(str(directory), device="cpu").encode_document(texts).to_dense()
    got = SparseEncoder(str(directory)).encode_document(texts).to_dense()
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


def test_sentence_bert_config_is_read_as_sentence_transformers_reads_it(layouts, texts, tmp_path):
    """sentence_bert_config.json's processor_kwargs model_max_length cuts texts in sentence-transformers, over
    max_seq_length; bertkit's sparse Transformer read max_seq_length alone and cut at 512 (7,450 active (text, piece)
    pairs against 1,601 at 24, MiniLM on 4 SQuAD paragraphs). Per-task lengths (query_length, document_length) and
    processing_kwargs cut there too, and are refused here by name, as the dense Transformer's file is read."""
    from bertkit.sentence import SparseEncoder

    directory = tmp_path / "cut"
    shutil.copytree(layouts["splade"], directory)
    config_file = directory / "sentence_bert_config.json"
    config = json.loads(config_file.read_text())
    for key in ("processor_kwargs", "tokenizer_args"):  # sentence-transformers 6's name, and its name before
        config_file.write_text(json.dumps({**config, "max_seq_length": 32, key: {"model_max_length": 24}}))
        ours, theirs = SparseEncoder(directory), st.SparseEncoder(str(directory), device="cpu")
        assert ours.max_seq_length == theirs.max_seq_length == 24
        _assert_same_vectors(ours.encode_document(texts[:2]), theirs.encode_document(texts[:2]))
    for extra in ({"query_length": 8}, {"document_length": 12}, {"processing_kwargs": {"text": {"max_length": 10}}}):
        config_file.write_text(json.dumps({**config, **extra}))
        before = _listing(directory)
        with pytest.raises(BertkitError, match=f"sets {{'{next(iter(extra))}': .*which bertkit does not apply"):
            SparseEncoder(directory)
        assert _listing(directory) == before


@pytest.mark.parametrize("strategy", ["max", "sum"])
def test_splade_pooling_reads_a_host_batch_without_the_devices_values(tiny_model, strategy):
    """A sparse encode's batch stays on the host (a GPU model takes it there): the pooling finds each text's tokens
    from the host's mask, so the host never waits for the device's values (it moved the mask over and selected
    there: torch.nonzero on the GPU, a wait per batch). States and head on the meta device stand in for a GPU's,
    whose values cannot be read; on the CPU the result is the one from a mask on the tokens' device."""
    from bertkit.modeling import BertModelOutput
    from bertkit.padding import TokenLayout
    from bertkit.sentence.sparse_encoder.modules import SpladePooling

    head = tiny_model("BertForMaskedLM").eval().cls.predictions
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    layout = TokenLayout.padded(mask, (2, 4))
    pooling = SpladePooling(strategy)
    with torch.no_grad():
        on_meta = BertModelOutput(torch.empty(2, 4, head.transform.dense.in_features, device="meta"), None, layout)
        assert pooling(on_meta, mask, copy.deepcopy(head).to("meta")).shape == (2, head.decoder.out_features)
        states = torch.randn(2, 4, head.transform.dense.in_features)
        got = pooling(BertModelOutput(states, None, layout), mask, head)
        torch.testing.assert_close(got, pooling(BertModelOutput(states, None, layout), mask.to(states.device), head))


def test_the_tokenizers_model_max_length_is_max_seq_length(layouts, texts):
    """``model.tokenizer.model_max_length = 16`` cuts texts at 16 in sentence-transformers (its max_seq_length is the
    tokenizer's); bertkit kept a limit of its own and cut where the directory said (SPLADE weights up to 1.39 apart at
    16 against 256 with all-MiniLM-L6-v2's encoder). Set on either, both read it; past the positions it is refused at
    encode, naming it."""
    from bertkit.sentence import SparseEncoder

    ours, theirs = SparseEncoder(layouts["splade"]), st.SparseEncoder(str(layouts["splade"]), device="cpu")
    for model in (ours, theirs):
        model.tokenizer.model_max_length = 16
    assert ours.max_seq_length == theirs.max_seq_length == 16
    _assert_same_vectors(ours.encode_document(texts[:4]), theirs.encode_document(texts[:4], batch_size=4))
    ours.max_seq_length = 24
    assert ours.tokenizer.model_max_length == 24
    ours.tokenizer.model_max_length = 600
    with pytest.raises(BertkitError, match=r"max_seq_length \(the tokenizer's model_max_length\) 600 must be"):
        ours.encode_document(texts[:2])


def test_a_fill_mask_transformers_max_seq_length_of_0_is_refused_not_read_as_the_default(tmp_path, tiny_checkpoint,
                                                                                         minilm_dir):
    """Was: ``Transformer(path, max_seq_length=0)`` cut texts at the checkpoint's 512 without a word."""
    from bertkit.sentence.sparse_encoder.modules import Transformer

    directory = tiny_checkpoint(tmp_path / "tiny", "BertForPreTraining", tokenizer=minilm_dir)
    transformer = Transformer(directory, transformer_task="fill-mask", max_seq_length=7)
    assert transformer.max_seq_length == transformer.tokenizer.model_max_length == 7
    with pytest.raises(BertkitError, match="max_seq_length 0"):
        Transformer(directory, transformer_task="fill-mask", max_seq_length=0)
    # a SentenceTransformer's model[0] holding the masked-LM model: its print and refusals
    assert repr(transformer) == "Transformer({'max_seq_length': 7, 'do_lower_case': False, 'architecture': " \
                                "'BertForMaskedLM'})"
    with pytest.raises(BertkitError, match=r"^model\[0\]\.max_seq_len is not a setting of bertkit's Transformer"):
        transformer.max_seq_len = 64


def test_a_peft_adapter_directory_is_refused_naming_the_recipe(layouts, tmp_path):
    """model[0].model = get_peft_model(...), then save: the directory holds the adapter over its base
    (adapter_config.json, no config.json). SparseEncoder said "config.json does not exist"; it now names the adapter
    and its base as SentenceTransformer and CrossEncoder do, and its recipe gives the vectors back."""
    peft = pytest.importorskip("peft")
    from bertkit.sentence import SparseEncoder

    torch.manual_seed(0)
    model = SparseEncoder(layouts["checkpoint"])
    model[0].model = peft.get_peft_model(model[0].model, peft.LoraConfig(r=4, target_modules=["query", "value"],
                                                                         init_lora_weights="gaussian"))
    texts = ["Where is Paris?", "Paris is in France."]
    want = model.encode(texts, convert_to_sparse_tensor=False)
    model[0].model.save_pretrained(tmp_path / "lora")
    with pytest.raises(BertkitError, match=rf"holds a peft adapter \(adapter_config.json\) over "
                                           rf"{layouts['checkpoint']}, not a whole encoder; bertkit loads no adapters: "
                                           r"load the base \(SparseEncoder\(base\)\), wrap its encoder with peft's "
                                           r"PeftModel.from_pretrained\(model\[0\].model, this directory\)"):
        SparseEncoder(tmp_path / "lora")
    base = SparseEncoder(layouts["checkpoint"])
    base[0].model = peft.PeftModel.from_pretrained(base[0].model, str(tmp_path / "lora")).merge_and_unload()
    torch.testing.assert_close(base.encode(texts, convert_to_sparse_tensor=False), want, atol=1e-6, rtol=0)


def test_texts_without_words_give_sentence_transformers_vectors(layouts):
    """"", whitespace, control and zero-width characters: sentence-transformers' SparseEncoder (as its
    SentenceTransformer and CrossEncoder, and bertkit's) reads [CLS] [SEP] alone for each. bertkit's SparseEncoder
    refused "" and " " ("empty text(s)") but took "\\x00\\x01" and "\\u200b", which have no words either; it now takes
    them all, with sentence-transformers' vectors (79 active dimensions each, a static query route's none)."""
    from bertkit.sentence import SparseEncoder

    texts = ["", " ", "\t\n", "\x00\x01", "\u200b", "a text"]
    for layout, method in (("splade", "encode"), ("inference_free", "encode_query"),
                           ("inference_free", "encode_document")):
        ours = getattr(SparseEncoder(layouts[layout]), method)(texts)
        _assert_same_vectors(ours, getattr(st.SparseEncoder(str(layouts[layout]), device="cpu"), method)(texts))
        dense = ours.to_dense()
        # each [CLS] [SEP]'s vector, to float32 rounding (the GEMM may round a row by where it falls in a block: MKL's
        # AVX2 path on a Xeon put 1.6e-6 between the five), within what _assert_same_vectors allows the reference
        torch.testing.assert_close(dense[:5], dense[:1].expand(5, -1), rtol=1e-5, atol=1e-5)
        assert torch.equal(dense[:5] != 0, (dense[:1] != 0).expand(5, -1))  # on the same word pieces
        assert (dense != 0).sum(1).tolist() == ([0] * 5 + [2] if method == "encode_query" else [79] * 5 + [88])


def test_pairwise_similarity_of_sparse_rows_of_other_shapes_is_refused_naming_both():
    """PyTorch broadcasts no sparse operand: one sparse query against two sparse documents failed, in
    sentence-transformers too, with "sparse_binary_op_intersection_cpu(): expects sparse inputs with equal
    dimensionality" (dot, cosine) or "add: expected sizes of 'self' and 'other' to match" (euclidean, manhattan, a
    dense vector beside sparse rows too). Now refused naming both shapes; what broadcasts still does, with the dense
    product's values."""
    from bertkit.sentence import util

    docs = torch.tensor([[0.0, 2.0, 0.0, 1.0], [3.0, 0.0, 0.0, 1.0]])
    query = torch.tensor([1.0, 0.5, 0.0, 2.0])
    for name in ("pairwise_dot_score", "pairwise_cos_sim", "pairwise_euclidean_sim", "pairwise_manhattan_sim"):
        fn = getattr(util, name)
        for a in (query.to_sparse(), query[None].to_sparse()):
            with pytest.raises(BertkitError, match=rf"same shape, got the shapes {re.escape(str(tuple(a.shape)))} and \(2, 4\): "
                                                   r"repeat the one vector .*torch.stack"):
                fn(a, docs.to_sparse())
        torch.testing.assert_close(fn(torch.stack([query] * 2).to_sparse(), docs.to_sparse()),
                                   fn(torch.stack([query] * 2), docs))
    with pytest.raises(BertkitError, match=r"the shapes \(1, 4\) and \(2, 4\)"):
        util.pairwise_euclidean_sim(query[None], docs.to_sparse())
    # a dense vector times sparse rows broadcasts in PyTorch, as in sentence-transformers: kept
    torch.testing.assert_close(util.pairwise_dot_score(query[None], docs.to_sparse()), torch.tensor([3.0, 5.0]))
