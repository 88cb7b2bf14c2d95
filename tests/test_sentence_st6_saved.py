"""A directory sentence-transformers 6 saved itself, with the settings a real one carries (a short max_seq_length and
do_lower_case, which it records only in tokenizer_config.json and tokenizer.json; prompts, a default prompt, a
similarity function and truncate_dim; CLS pooling that leaves the prompt out; Normalize), read by every bertkit entry
point: ``SentenceTransformer``, the embedding pipelines, ``bertkit predict`` and ``bertkit serve`` give the vectors
sentence-transformers gives for it, prompts included."""

from __future__ import annotations

import json

import numpy as np
import pytest

import bertkit
from bertkit.sentence import SentenceTransformer

st = pytest.importorskip("sentence_transformers", reason="the reference: pip install -e '.[test-references]'")
st_models = pytest.importorskip("sentence_transformers.models")

TEXTS = ["A man is eating food.", "THE QUICK Brown Fox jumps over the lazy dog near the RIVER bank in June.", "hi",
         "Ünïcödé accents and CJK 漢字 too, İstanbul",
         "Sentence embeddings put similar sentences close together. " * 5]
PROMPTS = {"query": "Query: ", "document": "Passage: "}


@pytest.fixture(scope="module")
def saved(minilm_2_layers, tmp_path_factory):
    """sentence-transformers' own save: max_seq_length 16 (below the tokenizer's 512) and do_lower_case."""
    transformer = st_models.Transformer(str(minilm_2_layers), max_seq_length=16, do_lower_case=True)
    modules = [transformer, st_models.Pooling(384, pooling_mode="cls", include_prompt=False), st_models.Normalize()]
    ref = st.SentenceTransformer(modules=modules, device="cpu", prompts=PROMPTS, default_prompt_name="query",
                                 similarity_fn_name="dot", truncate_dim=64)
    d = tmp_path_factory.mktemp("st6") / "saved"
    ref.save(str(d))
    return d, st.SentenceTransformer(str(d), device="cpu")


def test_its_own_save_records_do_lower_case_only_in_the_tokenizer(saved):
    d, _ = saved
    assert "do_lower_case" not in json.loads((d / "sentence_bert_config.json").read_text())
    assert json.loads((d / "tokenizer.json").read_text())["normalizer"]["normalizers"][0] == {"type": "Lowercase"}


def test_sentence_transformer_and_pipelines_give_its_vectors(saved):
    """Refused before whole (the Lowercase in tokenizer.json), so no entry point read such a directory."""
    d, ref = saved
    ours = SentenceTransformer(d)
    assert (ours.max_seq_length, ours.truncate_dim, ours.similarity_fn_name) == (16, 64, "dot")
    for got, want in [(ours.encode(TEXTS), ref.encode(TEXTS)), (ours.encode_query(TEXTS), ref.encode_query(TEXTS)),
                      (ours.encode_document(TEXTS), ref.encode_document(TEXTS))]:
        np.testing.assert_allclose(got, want, atol=2e-5)
    features = bertkit.pipeline("feature-extraction", str(d), progress=False)
    for name in (None, "query", "document"):
        kwargs = {"prompt_name": name} if name else {}
        np.testing.assert_allclose(np.asarray(features(TEXTS, **kwargs)), ref.encode(TEXTS, **kwargs), atol=2e-5)
    unit = bertkit.pipeline("sentence-embedding", str(d), progress=False)
    np.testing.assert_allclose(np.asarray(unit(TEXTS)), ref.encode(TEXTS, normalize_embeddings=True), atol=2e-5)


def test_predict_and_serve_give_its_vectors(saved, tmp_path):
    d, ref = saved
    from bertkit.inference.files import predict_file
    from bertkit.settings.inference import PredictFileSettings

    (tmp_path / "in.txt").write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    predict_file(PredictFileSettings(task="feature-extraction", model_name_or_path=d, input=tmp_path / "in.txt",
                                     output_file=tmp_path / "out.jsonl", prompt_name="document", progress=False))
    rows = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    np.testing.assert_allclose(np.asarray([r["embedding"] for r in rows]), ref.encode_document(TEXTS), atol=2e-5)

    httpx = pytest.importorskip("httpx")
    pytest.importorskip("uvicorn")
    from bertkit.inference.serve import create_app
    from serve_helpers import Server

    server = Server(create_app(bertkit.pipeline("sentence-embedding", str(d), progress=False), str(d),
                               max_batch_size=8, max_wait_ms=1))
    try:
        info = httpx.get(f"{server.url}/info").json()
        assert (info["max_input_length"], info["embedding_dimension"]) == (16, 64)
        tei = httpx.post(f"{server.url}/embed", json={"inputs": TEXTS, "normalize": False}).json()
        np.testing.assert_allclose(np.asarray(tei), ref.encode(TEXTS), atol=2e-5)
        openai = httpx.post(f"{server.url}/v1/embeddings", json={"input": TEXTS, "model": "m"}).json()
        np.testing.assert_allclose(np.asarray([e["embedding"] for e in openai["data"]]),
                                   ref.encode(TEXTS, normalize_embeddings=True), atol=2e-5)
    finally:
        server.stop()
