"""`bertkit serve` answers each request as it answers it alone, whatever the requests its batcher joins it with: the
tasks whose options go to the pipeline call (fill-mask's top_k and targets, token-classification's
aggregation_strategy and ignore_labels, question-answering's top_k, doc_stride, max_answer_len,
handle_impossible_answer and align_to_words) or shape only the answer (text-classification's TEI fields beside
the Inference API's top_k and function_to_apply; single texts, TEI's sequences, pairs and batches of them), on tiny
random checkpoints with MiniLM's tokenizer. Seeded requests are sent at once from eight threads, then one at a
time; every answer, refusals included, must be the same (the sentence tasks' routes: test_serve_sentence_fuzz.py).
"""

from __future__ import annotations

import json
import random
from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("fastapi", reason='bertkit serve needs FastAPI: pip install "bertkit[serve]"')
pytest.importorskip("uvicorn", reason='bertkit serve needs uvicorn: pip install "bertkit[serve]"')
httpx = pytest.importorskip("httpx", reason="the HTTP client of these tests: pip install httpx")

from serve_helpers import Server  # noqa: E402 (after the skips: Server runs uvicorn)

TEXTS = ["A man is eating food.", "hi", "Ünïcödé and 漢字 text", "Angela Merkel met Barack Obama in Berlin yesterday",
         "word " * 30, "naïve café in London"]
MASKED = ["The capital of France is [MASK].", "I [MASK] to the store and bought [MASK] apples.", "[MASK]"]
CONTEXTS = ["The Eiffel Tower is in Paris. It was built in 1889 for the World's Fair. " * 3,
            "Hamlet was written by William Shakespeare around 1600."]
HEADS = {"text-classification": ("BertForSequenceClassification", ["neg", "neu", "pos"]),
         "fill-mask": ("BertForMaskedLM", None),
         "token-classification": ("BertForTokenClassification", ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]),
         "question-answering": ("BertForQuestionAnswering", None)}


def _some(r: random.Random, choices: dict) -> dict:
    return {k: r.choice(v) for k, v in choices.items() if r.random() < 0.4}


def _texts(r: random.Random, pool: list[str]) -> str | list[str]:
    return r.choice(pool) if r.random() < 0.4 else [r.choice(pool) for _ in range(r.choice([1, 2, 3, 5]))]


def _request(task: str, r: random.Random) -> dict:
    if task == "text-classification":
        inputs = r.choice([lambda: _texts(r, TEXTS), lambda: {"text": r.choice(TEXTS), "text_pair": r.choice(TEXTS)},
                           lambda: [[r.choice(TEXTS), r.choice(TEXTS)], [r.choice(TEXTS)]]])()
        if r.random() < 0.5:  # TEI's fields, TEI's answer
            return {"inputs": inputs, **_some(r, {"raw_scores": [True, False], "truncate": [True, False],
                                                   "truncation_direction": ["right", "Left"]})}
        return {"inputs": inputs, "parameters": _some(r, {"top_k": [1, 2], "function_to_apply": ["sigmoid", "none"]})}
    if task == "fill-mask":
        return {"inputs": _texts(r, MASKED), "parameters": _some(r, {"top_k": [1, 3], "targets": [["paris", "went"]]})}
    if task == "token-classification":
        return {"inputs": _texts(r, TEXTS), "parameters": _some(r, {"aggregation_strategy": ["first", "max"],
                                                                      "ignore_labels": [[], ["O", "B-PER"]]})}
    question = lambda: {"question": r.choice(["Where is the tower?", "Who wrote Hamlet?"]),  # noqa: E731
                        "context": r.choice(CONTEXTS)}
    return {"inputs": question() if r.random() < 0.5 else [question() for _ in range(r.choice([1, 2]))],
            "parameters": _some(r, {"top_k": [1, 2], "doc_stride": [8, 16], "max_answer_len": [3, 15],
                                    "handle_impossible_answer": [True, False], "align_to_words": [True, False]})}


# slow: thirty requests a task (2-9 s each on a busy 2-core machine); make test runs ten of text-classification's
@pytest.mark.parametrize(("task", "requests"), [("text-classification", 10),
                                                *(pytest.param(task, 30, marks=pytest.mark.slow) for task in HEADS)])
def test_each_request_is_answered_as_alone_whatever_it_is_batched_with(task, requests, tiny_checkpoint, minilm_dir,
                                                                        tmp_path):
    from bertkit import pipeline
    from bertkit.inference.serve import create_app

    head, labels = HEADS[task]
    directory = tiny_checkpoint(tmp_path / task, head, tokenizer=minilm_dir, labels=labels)
    pipe = pipeline(task, directory, batch_size=4, max_length=96 if task == "question-answering" else 48, progress=False)
    r = random.Random(0)
    bodies = [_request(task, r) for _ in range(requests)]
    server = Server(create_app(pipe, str(directory), max_batch_size=8, max_wait_ms=20))
    try:
        with ThreadPoolExecutor(8) as pool:  # at once: the batcher joins requests of other options and shapes
            together = list(pool.map(lambda b: httpx.post(f"{server.url}/predict", json=b, timeout=60), bodies))
        with httpx.Client(base_url=server.url, timeout=60) as client:
            alone = [client.post("/predict", json=b) for b in bodies]
    finally:
        server.stop()
    assert sum(a.status_code == 200 for a in alone) >= 0.8 * requests, [a.text[:100] for a in alone]
    for body, joined, single in zip(bodies, together, alone):
        assert joined.status_code == single.status_code, (json.dumps(body)[:200], joined.text[:200], single.text[:200])
        assert _difference(joined.json(), single.json()) is None, json.dumps(body)[:200]


def _difference(a, b, at: str = "") -> str | None:
    """Where two answers differ (a number by more than 1e-6), or None."""
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return f"{at}: keys {sorted(a)} and {sorted(b)}"
        return next((d for k in a if (d := _difference(a[k], b[k], f"{at}[{k!r}]"))), None)
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return f"{at}: {len(a)} and {len(b)} items"
        return next((d for i, (x, y) in enumerate(zip(a, b)) if (d := _difference(x, y, f"{at}[{i}]"))), None)
    if isinstance(a, float) and isinstance(b, float):
        return None if abs(a - b) <= 1e-6 else f"{at}: {a} and {b}"
    return None if a == b else f"{at}: {a!r} and {b!r}"
