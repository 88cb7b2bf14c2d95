"""A cross-encoder trained with CrossEncoderTrainer is what `bertkit serve --task rerank` loads: the directory the
trainer saves, served over loopback, answers /rerank with CrossEncoder.rank's order and scores (the sigmoid of
the logit, pairs cut to the trained max_length)."""

from __future__ import annotations

import pytest

from cross_encoder_helpers import cross_encoder_directory, squad_rerank

pytest.importorskip("fastapi", reason='bertkit serve needs FastAPI: pip install "bertkit[serve]"')
pytest.importorskip("uvicorn", reason='bertkit serve needs uvicorn: pip install "bertkit[serve]"')
pytest.importorskip("prometheus_client", reason='bertkit serve needs prometheus_client: pip install "bertkit[serve]"')
httpx = pytest.importorskip("httpx", reason="the HTTP client of these tests: pip install httpx")

from serve_helpers import Server  # noqa: E402  (uvicorn on a free loopback port, in a thread)


def test_rerank_serves_a_trained_cross_encoder_with_rank_scores(tmp_path, minilm_2_layers, data_dir):
    from bertkit import pipeline
    from bertkit.inference.serve import create_app
    from bertkit.sentence.cross_encoder import (
        CrossEncoder,
        CrossEncoderTrainer,
        CrossEncoderTrainingArguments,
        losses,
    )

    rows = squad_rerank(data_dir, 0, 8)
    model = CrossEncoder(cross_encoder_directory(minilm_2_layers, tmp_path / "base"), max_length=48)
    before = model.predict([(rows[0]["query"], rows[0]["positive"])])
    train = [{"query": r["query"], "text": t, "label": float(t == r["positive"])}
             for r in rows for t in (r["positive"], r["negatives"][0])]
    args = CrossEncoderTrainingArguments(output_dir=str(tmp_path / "run"), per_device_train_batch_size=8, max_steps=2,
                                         learning_rate=1e-4, save_strategy="no", report_to="none", disable_tqdm=True)
    trainer = CrossEncoderTrainer(model=model, args=args, train_dataset=train, loss=losses.BinaryCrossEntropyLoss(model))
    trainer.train()
    trainer.save_model(str(tmp_path / "trained"))
    trained = CrossEncoder(tmp_path / "trained")
    assert trained.max_length == 48
    assert trained.predict([(rows[0]["query"], rows[0]["positive"])]) != pytest.approx(before, abs=1e-4)  # it trained

    query = rows[1]["query"]
    texts = [rows[1]["positive"], *rows[1]["negatives"], " ".join(rows[2]["negatives"]) * 3]  # the last is cut to 48
    want = trained.rank(query, texts)
    pipe = pipeline("rerank", tmp_path / "trained", batch_size=4, progress=False)
    server = Server(create_app(pipe, str(tmp_path / "trained"), max_batch_size=4, max_wait_ms=2))
    try:
        r = httpx.post(f"{server.url}/rerank", json={"query": query, "texts": texts}, timeout=120)
    finally:
        server.stop()
    assert r.status_code == 200, r.text
    got = r.json()
    assert [g["index"] for g in got] == [w["corpus_id"] for w in want]
    assert [g["score"] for g in got] == pytest.approx([w["score"] for w in want], abs=1e-5)


def test_rerank_scores_and_orders_ties_as_tei():
    """TEI's /rerank takes the sigmoid in float32 and orders equal scores last index first (a stable ascending sort,
    reversed). bertkit took it in float64 and kept ties first index first: for the same texts twice it answered
    [1, 3] where TEI answers [3, 1], and logits 20 and 17, both 1.0 in TEI (so the later first), came back as 1.0
    and 0.99999996 in the logits' order."""
    import numpy as np

    from bertkit.inference.pipelines import ranked

    texts = ["a", "b", "a", "b", "c"]
    logits = [np.array([x], dtype=np.float32) for x in (20.0, 1.5, 17.0, 1.5, -100.0)]
    got = ranked(logits, None, texts, raw_scores=False, return_text=True)
    assert [g["index"] for g in got] == [2, 0, 3, 1, 4]  # 1.0, 1.0 (a tie: last first), the 1.5 tie, then 0.0
    assert [g["score"] for g in got] == [1.0, 1.0, pytest.approx(0.81757448, abs=1e-7),
                                         pytest.approx(0.81757448, abs=1e-7), 0.0]
    assert [g["text"] for g in got] == [texts[g["index"]] for g in got]
    raw = ranked(logits, None, texts, raw_scores=True, return_text=False)
    assert [(g["index"], g["score"]) for g in raw] == [(0, 20.0), (2, 17.0), (3, 1.5), (1, 1.5), (4, -100.0)]
    # two labels ("relevant" is label 1): the sigmoid of l1 - l0, the same ties
    pairs = [np.array([0.0, 2.0], dtype=np.float32), np.array([1.0, 3.0], dtype=np.float32)]
    assert [g["index"] for g in ranked(pairs, 1, ["x", "y"], raw_scores=False, return_text=False)] == [1, 0]
