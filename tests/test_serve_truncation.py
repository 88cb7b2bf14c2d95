"""`bertkit serve`'s ``truncation_direction``, TEI's: "Left" keeps the end of a text too long for max_length (its
[CLS] and [SEP] kept), the tokens transformers' tokenizer keeps with ``truncation_side="left"``; the vectors are
sentence-transformers' on those tokens. MiniLM cut to two layers, max_seq_length 16."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("fastapi", reason='bertkit serve needs FastAPI: pip install "bertkit[serve]"')
pytest.importorskip("uvicorn", reason='bertkit serve needs uvicorn: pip install "bertkit[serve]"')
httpx = pytest.importorskip("httpx", reason="the HTTP client of these tests: pip install httpx")

from sentence_helpers import st_directory  # noqa: E402
from serve_helpers import Server  # noqa: E402

# 20 tokens with [CLS] and [SEP]: over max_seq_length 16, so either direction cuts it
LONG = "one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen seventeen " \
       "eighteen"


@pytest.fixture(scope="module")
def served(minilm_2_layers, tmp_path_factory):
    from bertkit import pipeline
    from bertkit.inference.serve import create_app

    d = st_directory(minilm_2_layers, tmp_path_factory.mktemp("truncation") / "m", max_seq_length=16)
    pipe = pipeline("sentence-embedding", d, batch_size=8, progress=False)
    server = Server(create_app(pipe, str(d), max_batch_size=8, max_wait_ms=2))
    yield server.url, d
    server.stop()


@pytest.mark.parametrize("direction", ["Left", "left", "Right", "right"])
def test_embed_truncates_from_the_side_asked_as_transformers_tokenizer_and_sentence_transformers(served, direction):
    # "Left" was refused with a 422, though TEI takes it on /embed, /embed_all, /embed_sparse, /rerank and /predict
    st = pytest.importorskip("sentence_transformers")
    from transformers import BertTokenizerFast

    url, d = served
    side = direction.lower()
    want_ids = BertTokenizerFast.from_pretrained(d, truncation_side=side)(LONG, truncation=True,
                                                                         max_length=16)["input_ids"]
    assert len(want_ids) == 16 and want_ids[0] == 101 and want_ids[-1] == 102
    reference = st.SentenceTransformer(str(d), device="cpu")
    reference.tokenizer.truncation_side = side
    assert reference.tokenize([LONG])["input_ids"][0].tolist() == want_ids
    want = reference.encode([LONG], normalize_embeddings=True)[0]
    r = httpx.post(f"{url}/embed", json={"inputs": [LONG], "truncate": True, "truncation_direction": direction})
    assert r.status_code == 200, r.text
    np.testing.assert_allclose(r.json()[0], want, atol=2e-6)
    tokens = httpx.post(f"{url}/embed_all", json={"inputs": LONG, "truncation_direction": direction}).json()[0]
    np.testing.assert_allclose(tokens, reference.encode([LONG], output_value="token_embeddings")[0], atol=2e-5)


def test_left_and_right_differ_and_a_short_text_is_not_cut(served):
    url, _ = served
    both = [httpx.post(f"{url}/embed", json={"inputs": [LONG, "a short text"], "truncation_direction": d}).json()
            for d in ("Left", "Right")]
    assert not np.allclose(both[0][0], both[1][0], atol=1e-3)  # another 14 tokens read
    np.testing.assert_allclose(both[0][1], both[1][1], atol=1e-6)
    r = httpx.post(f"{url}/embed", json={"inputs": LONG, "truncation_direction": "up"})
    assert r.status_code == 422, r.text
    assert r.json()["error"] == ('truncation_direction must be "right" (keep a text\'s beginning, the default) or '
                                 '"left" (keep its end), got \'up\'')


def test_predict_takes_truncation_direction_at_the_top_and_in_parameters(served):
    url, _ = served
    want = httpx.post(f"{url}/embed", json={"inputs": [LONG], "truncation_direction": "Left"}).json()[0]
    right = httpx.post(f"{url}/embed", json={"inputs": [LONG]}).json()[0]
    for body in ({"inputs": LONG, "truncation_direction": "Left"},
                 {"inputs": LONG, "parameters": {"truncation_direction": "left"}}):
        r = httpx.post(f"{url}/predict", json=body)
        assert r.status_code == 200, r.text
        got = np.asarray(r.json()).reshape(-1)
        np.testing.assert_allclose(got / np.linalg.norm(got), want, atol=2e-6)
        assert not np.allclose(got / np.linalg.norm(got), right, atol=1e-3)


PAIRS = [("a b c d e f g h i j k l", "m n"), ("a b", "c d e f g h i j k l m n o p"), ("a b c d e f g h", "i j k l m n o p q")]


@pytest.mark.parametrize("text, pair", PAIRS)
def test_a_pair_keeps_each_texts_end_as_transformers_longest_first_from_the_left(served, text, pair):
    # the rows /rerank and /predict build for a (query, text) pair: the longer text loses tokens first, from its start
    from transformers import BertTokenizerFast

    from bertkit import pipeline

    _, d = served
    want = BertTokenizerFast.from_pretrained(d, truncation_side="left")(text, pair, truncation=True, max_length=16)
    row = pipeline("sentence-embedding", d, progress=False).encode((text, pair), truncation_direction="left")[0]
    assert (row["input_ids"], row["token_type_ids"]) == (want["input_ids"], want["token_type_ids"])
    assert len(row["input_ids"]) == 16


def test_similarity_takes_truncation_direction_in_parameters(served):
    from transformers import BertTokenizerFast

    url, d = served
    left = BertTokenizerFast.from_pretrained(d, truncation_side="left")
    kept = left.decode(left(LONG, truncation=True, max_length=16)["input_ids"][1:-1])  # "five six ... eighteen"
    scores = [httpx.post(f"{url}/similarity", json={"inputs": {"source_sentence": LONG, "sentences": [kept]},
                                                     "parameters": {"truncation_direction": side}}).json()[0]
              for side in ("Left", "Right")]
    assert scores[0] == pytest.approx(1.0, abs=1e-6) and scores[1] < 0.99
