"""Copies of an input in one request score bit for bit alike, so that their tie is broken by TEI's rule (/rerank: the
later index first) and not by which rows shared a forward batch; and /info answers every field with TEI's type
(its ``Info`` struct: ``max_batch_tokens`` a number, which typed clients parse as an integer). One server: a
cross-encoder (MiniLM's first 2 layers, a seeded head) whose forward batches drift apart by 1e-3 each, as real
batches do by a float32 step (a row's numbers depend on the kernels its batch's shape picks)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("fastapi", reason='bertkit serve needs FastAPI: pip install "bertkit[serve]"')
pytest.importorskip("uvicorn", reason='bertkit serve needs uvicorn: pip install "bertkit[serve]"')
httpx = pytest.importorskip("httpx", reason="the HTTP client of these tests: pip install httpx")

from serve_helpers import Server  # noqa: E402  (uvicorn on a free loopback port, in a thread)

QUERY = "Which city is the capital of France?"
SAME = "Paris is the capital of France."
TEXTS = [SAME, "A man is playing a guitar.", SAME, "The new movie is awesome!", SAME]  # three copies


def _drifting(cls):
    """``cls`` whose every forward batch adds 1e-3 more than the one before to its outputs."""
    class Drifting(cls):
        batches = 0

        def forward(self, batch, rows):
            Drifting.batches += 1
            return [o + np.float32(1e-3 * Drifting.batches) for o in super().forward(batch, rows)]

    return Drifting


@pytest.fixture(scope="module")
def reranker(tmp_path_factory, minilm_2_layers):
    from bertkit.heads import BertForSequenceClassification
    from bertkit.inference.pipelines import RerankPipeline
    from bertkit.inference.serve import create_app
    from bertkit.tokenization import BertTokenizer

    d = tmp_path_factory.mktemp("cross_encoder")
    torch.manual_seed(0)
    BertForSequenceClassification.from_pretrained(minilm_2_layers, num_labels=1).save_pretrained(d)
    BertTokenizer.from_pretrained(minilm_2_layers).save_pretrained(d)
    pipe = _drifting(RerankPipeline).from_pretrained(d, batch_size=2, progress=False)  # 5 pairs: 3 forward batches
    server = Server(create_app(pipe, str(d), max_batch_size=8, max_wait_ms=1))
    yield server.url
    server.stop()


def test_copies_in_one_rerank_tie_exactly_and_rank_later_index_first(reranker):
    """The three copies were run in two or three forward batches (batch_size 2) and scored 1e-3 apart (on MiniLM,
    two raw scores a float32 step apart for one pair in one request: the slow test below), so their order was the
    batches'. Each distinct pair is now computed once per call: one score, TEI's order 4, 2, 0."""
    for raw in (True, False):
        got = httpx.post(f"{reranker}/rerank", json={"query": QUERY, "texts": TEXTS, "raw_scores": raw}).json()
        scores = {g["index"]: g["score"] for g in got}
        assert scores[0] == scores[2] == scores[4], scores
        at = [g["index"] for g in got]
        copies = at.index(4)
        assert at[copies:copies + 3] == [4, 2, 0], at
        assert len({scores[0], scores[1], scores[3]}) == 3  # other pairs keep their own scores


def test_info_answers_every_field_with_teis_type(reranker):
    """``max_batch_tokens`` was null for an app made without it (no bound): TEI's Info has ``usize`` there, and its
    Rust client and Elasticsearch's parse an integer. Now TEI's default, 16384, which the batcher holds calls to."""
    info = httpx.get(f"{reranker}/info").json()
    assert info["max_batch_tokens"] == 16384
    integers = ("max_concurrent_requests", "max_input_length", "max_batch_tokens", "max_client_batch_size",
                "tokenization_workers")
    assert all(type(info[k]) is int and info[k] >= 1 for k in integers), {k: info[k] for k in integers}
    assert type(info["max_batch_requests"]) is int or info["max_batch_requests"] is None
    assert all(type(info[k]) is str for k in ("model_id", "model_dtype", "served_model_name", "version"))
    assert all(info[k] is None or type(info[k]) is str for k in ("model_sha", "sha", "docker_label"))
    assert type(info["auto_truncate"]) is bool
    (kind, model), = info["model_type"].items()  # serde's externally tagged enum: one variant
    assert kind == "reranker" and model == {"id2label": {"0": "LABEL_0"}, "label2id": {"LABEL_0": 0}}


def test_an_app_without_a_whole_max_batch_tokens_is_refused(minilm_2_layers):
    from bertkit import pipeline
    from bertkit.errors import BertkitError
    from bertkit.inference.serve import create_app

    pipe = pipeline("feature-extraction", minilm_2_layers, progress=False)
    with pytest.raises(BertkitError, match=r"max_batch_tokens must be a whole number >= 1, got None"):
        create_app(pipe, "m", max_batch_tokens=None)


def test_copies_of_a_text_embed_alike_in_one_call(minilm_2_layers):
    """/embed's rows run through the same ``run_rows``: a text sent three times, its copies in other forward batches,
    got three vectors 1e-3 apart; now one, three times (each its own array)."""
    from bertkit.inference.embedding import SentenceEmbeddingPipeline

    pipe = _drifting(SentenceEmbeddingPipeline).from_pretrained(minilm_2_layers, batch_size=2, progress=False)
    rows = [pipe.encode(t)[0] for t in TEXTS]
    out = pipe.run_rows(rows)
    assert np.array_equal(out[0], out[2]) and np.array_equal(out[0], out[4]) and out[0] is not out[2]
    assert not np.array_equal(out[0], out[1])


@pytest.mark.slow
def test_copies_rerank_to_one_score_with_minilms_real_numbers(minilm_dir, tmp_path):
    """Without a drift: MiniLM (6 layers, a seeded head), 40 copies of a pair beside 1 to 63 longer pairs, in forward
    batches of 32. On a 2-core x86 machine the copies scored 0.03274720162153244 or 0.03274722397327423 (raw) as
    the rows beside them changed; now one score, and /rerank's order among them is TEI's, the last copy first."""
    from bertkit import pipeline
    from bertkit.heads import BertForSequenceClassification
    from bertkit.tokenization import BertTokenizer

    torch.manual_seed(0)
    BertForSequenceClassification.from_pretrained(minilm_dir, num_labels=1).save_pretrained(tmp_path)
    BertTokenizer.from_pretrained(minilm_dir).save_pretrained(tmp_path)
    pipe = pipeline("rerank", tmp_path, batch_size=32, progress=False)
    long = "Paris is the capital of France and a big city, and a very long text about many things " * 3
    for n in (1, 31, 63):
        texts = [SAME] * 40 + [long] * n
        got = pipe({"query": QUERY, "texts": texts}, raw_scores=True)
        assert len({g["score"] for g in got if g["index"] < 40}) == 1, n
        assert [g["index"] for g in got if g["index"] < 40] == list(range(39, -1, -1))
