"""docs/sentence.md's worked example, end to end and small: train an embedder with bertkit.sentence on SQuAD
(question, paragraph) pairs, save it, serve the directory with `bertkit serve --task sentence-embedding` (its own
process, as a user starts it) and ask OpenAI's Python client for embeddings: they are what ``encode`` gives."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import numpy as np
import pytest

from distributed_helpers import free_port  # tests/ is on sys.path under pytest

datasets = pytest.importorskip("datasets")
httpx = pytest.importorskip("httpx")
pytest.importorskip("uvicorn", reason='bertkit serve needs uvicorn: pip install "bertkit[serve]"')


@pytest.mark.slow  # 20-60 s on two loaded cores (training steps and a server process): make test-slow
def test_a_trained_embedder_served_answers_the_openai_client_with_encode(tmp_path, minilm_dir, data_dir):
    openai = pytest.importorskip("openai")  # here, not at collection: its import is 0.9 s in every `make test` worker
    from bertkit.sentence import (
        SentenceTransformer,
        SentenceTransformerTrainer,
        SentenceTransformerTrainingArguments,
        losses,
    )
    from bertkit.sentence.training_args import BatchSamplers

    articles = json.loads((data_dir / "squad" / "dev-v1.1.json").read_text())["data"]
    pairs = [{"question": q["question"], "paragraph": p["context"]}
             for p in articles[0]["paragraphs"][:16] for q in p["qas"][:2]]
    model = SentenceTransformer(minilm_dir)
    model.max_seq_length = 128
    questions = [q["question"] for q in articles[1]["paragraphs"][0]["qas"][:4]]
    before = model.encode(questions, normalize_embeddings=True)
    args = SentenceTransformerTrainingArguments(output_dir=str(tmp_path / "run"), per_device_train_batch_size=16,
                                                max_steps=2, learning_rate=1e-4, save_strategy="no", seed=1,
                                                use_cpu=True, disable_tqdm=True,
                                                batch_sampler=BatchSamplers.NO_DUPLICATES)
    SentenceTransformerTrainer(model=model, args=args, train_dataset=datasets.Dataset.from_list(pairs),
                               loss=losses.MultipleNegativesRankingLoss(model)).train()
    final = model.save(tmp_path / "final")
    want = model.encode(questions, normalize_embeddings=True)
    assert np.abs(want - before).max() > 1e-3  # it trained: the served model must be this one, not the start

    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "bertkit", "serve", "--model", str(final), "--task",
                               "sentence-embedding", "--port", str(port), "--served-model-name", "squad-embedder",
                               "--log-level", "warning"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 180
        while True:
            assert server.poll() is None, f"bertkit serve exited {server.returncode}: {server.stdout.read()}"
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.time() < deadline, "bertkit serve did not answer /health in 180 s"
            time.sleep(0.2)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
        answer = client.embeddings.create(model="squad-embedder", input=questions, encoding_format="float")
        assert answer.model == "squad-embedder" and [d.index for d in answer.data] == [0, 1, 2, 3]
        np.testing.assert_allclose(np.asarray([d.embedding for d in answer.data]), want, atol=1e-5)
        short = client.embeddings.create(model="squad-embedder", input=questions[:1], dimensions=64,
                                         encoding_format="float")
        truncated = model.encode(questions[:1], truncate_dim=64, normalize_embeddings=True)
        np.testing.assert_allclose(np.asarray(short.data[0].embedding), truncated[0], atol=1e-5)
    finally:
        server.terminate()
        server.wait(60)
