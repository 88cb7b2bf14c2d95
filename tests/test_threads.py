"""One inference object shared by threads at once (a web server's workers, a ThreadPoolExecutor): each call gives what
it gives alone, and the object's state (its mode, torch's thread-local settings) is what it was. A forced
interleaving per class, and a seeded random mix of calls with different arguments (slow)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from bertkit.sentence import SentenceTransformer
from bertkit.sentence.cross_encoder import CrossEncoder
from bertkit.sentence.sparse_encoder import SparseEncoder

TEXTS = ["a first short text", "the second text, longer than the first one", "third"]


@pytest.fixture(scope="module")
def mlm_dir(minilm_2_layers, tmp_path_factory) -> Path:
    from sparse_helpers import masked_lm_checkpoint

    return masked_lm_checkpoint(minilm_2_layers, tmp_path_factory.mktemp("mlm"))


def _first_ends_inside_second(encoder: torch.nn.Module, call: Callable[[], np.ndarray]) -> dict[str, np.ndarray]:
    """``call`` from two threads: the second enters while the first runs, and runs its forward pass only after the
    first has ended (forced by a hook on ``encoder``). Returns each thread's result."""
    first_in, first_done = threading.Event(), threading.Event()
    results: dict[str, np.ndarray] = {}
    passes = {"second": 0}

    def meet(module, args):
        name = threading.current_thread().name
        if name == "first":
            first_in.set()
        elif name == "second":
            passes["second"] += 1
            if passes["second"] == 1:
                assert first_done.wait(30)

    def first():
        results["first"] = call()
        first_done.set()

    def second():
        assert first_in.wait(30)
        results["second"] = call()

    hook = encoder.register_forward_pre_hook(meet)
    try:
        threads = [threading.Thread(target=f, name=f.__name__) for f in (first, second)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    finally:
        hook.remove()
    assert set(results) == {"first", "second"}
    return results


@pytest.mark.parametrize("kind", ["sentence", "cross", "sparse"])
def test_a_call_ending_leaves_dropout_off_under_one_still_running(kind, minilm_2_layers, mlm_dir):
    """A model left in training mode (after training; MiniLM's dropout 0.1) called from two threads at once. Each call
    put the model in eval mode and, at its end, back in the mode it found: the first to end turned dropout back on
    under the second, whose vectors came out up to 0.40 (SentenceTransformer), 0.70 (SparseEncoder) and 0.03
    (CrossEncoder scores) from the model's, without an error, and the second, having found eval mode, left the model
    in it. Now both give the model's numbers and the model is back in training mode after the last call."""
    if kind == "sentence":
        model = SentenceTransformer(minilm_2_layers)
        encoder, call = model.bert, lambda: model.encode(TEXTS, batch_size=8)
    elif kind == "cross":
        torch.manual_seed(0)
        model = CrossEncoder(minilm_2_layers, num_labels=1)
        encoder, call = model.model.bert, lambda: model.predict([(t, t) for t in TEXTS], batch_size=1)
    else:
        model = SparseEncoder(mlm_dir)
        encoder = model[0].model.bert
        call = lambda: model.encode(TEXTS, batch_size=8, convert_to_sparse_tensor=False).numpy()  # noqa: E731
    want = call()
    model.train()
    results = _first_ends_inside_second(encoder, call)
    for name in ("first", "second"):
        np.testing.assert_allclose(results[name], want, atol=1e-6, rtol=0, err_msg=name)
    assert model.training and all(m.training for m in model.modules())
    model.eval()
    assert not any(m.training for m in model.modules())


def test_a_model_copied_while_a_call_runs_gets_a_mode_switch_of_its_own(minilm_2_layers, monkeypatch):
    """The calls under way on a model are counted in the model (``inference.runner.eval_mode``); a copy made in the
    middle of one (pickle, deepcopy: a DataLoader worker's) starts with none under way and keeps its own mode."""
    import copy
    import pickle

    model = SentenceTransformer(minilm_2_layers)
    want = model.encode(TEXTS)
    model.train()
    copies = []
    embed = SentenceTransformer.embed

    def copy_inside(self, *args, **kwargs):
        if not copies:
            copies.extend([copy.deepcopy(self), pickle.loads(pickle.dumps(self))])
        return embed(self, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(SentenceTransformer, "embed", copy_inside)
        model.encode(TEXTS)
    assert model.training and len(copies) == 2
    for other in copies:
        other.train()
        np.testing.assert_allclose(other.encode(TEXTS), want, atol=1e-6, rtol=0)
        assert other.training


def test_an_int8_copy_made_while_another_thread_runs_the_model_is_the_one_made_alone(minilm_2_layers):
    """``pipeline(..., quantize="int8")`` over a model another thread is running (a SentenceTransformer's encoder
    being served): calibration hooked and ran the model passed in, so the other thread's forward passes, made while
    it ran, counted among the calibration's activations and the int8 vectors came out 0.09 from those of the same
    model quantized alone. Forced here: the other thread encodes an outlier text while the calibration's first batch
    runs (a hook on the model, which its copy carries); the int8 pipeline's vectors equal those made alone."""
    import bertkit
    from bertkit._hardware import int8_kernel

    if int8_kernel() is None:
        pytest.skip("this PyTorch has no int8 kernel for this CPU")
    model = SentenceTransformer(minilm_2_layers)
    calibration = [f"calibration sentence {i} about cats, dogs and the weather" for i in range(16)]

    def int8_pipeline():
        return bertkit.pipeline("feature-extraction", model.bert, tokenizer=model.tokenizer, quantize="int8",
                                calibration_texts=calibration)

    want = int8_pipeline()(TEXTS)
    outlier_done = threading.Event()

    def outlier():
        model.encode(["ZZZZ " * 50 + "loud outlier text !!!! 12345 " * 10])
        outlier_done.set()

    def meet(module, args):
        if threading.current_thread().name == "quantize" and not outlier_done.is_set():
            threading.Thread(target=outlier, name="serving").start()
            assert outlier_done.wait(60)

    hook = model.bert.register_forward_pre_hook(meet)
    results = {}
    try:
        thread = threading.Thread(target=lambda: results.setdefault("int8", int8_pipeline()), name="quantize")
        thread.start()
        thread.join(120)
    finally:
        hook.remove()
    assert outlier_done.is_set()
    assert results["int8"](TEXTS) == want


# -- a seeded random mix (slow) ------------------------------------------------------------------------------------
_WORDS = ("the movie was great but its plot was thin and the actors tried hard , naïve café 東京 unaffable "
          "antidisestablishmentarianism ! ? 😀").split()


def _texts(rng, n: int) -> list[str]:
    return [" ".join(rng.choice(_WORDS) for _ in range(rng.randint(1, 40))) for _ in range(n)]


def _as_numbers(x):
    if isinstance(x, torch.Tensor):
        x = x.to_dense() if x.is_sparse else x
        return x.float().numpy()
    return x


def _same(a, b) -> bool:
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, np.ndarray):
        return a.shape == b.shape and a.dtype == b.dtype and bool(np.allclose(a, b, atol=1e-6, rtol=0))
    if isinstance(a, float):
        return abs(a - b) <= 1e-6
    return a == b


@pytest.mark.slow
def test_calls_from_threads_at_once_give_what_they_give_alone(minilm_2_layers, mlm_dir, tmp_path):
    """12 seeded draws of 2-8 threads, each a different call with different arguments on objects they share (a
    tokenizer, a SentenceTransformer with prompts, a one-label CrossEncoder, a SparseEncoder, fp32 / bf16 / int8
    feature-extraction pipelines, a token-classification pipeline, an optimize_for_inference copy, and pickled copies
    of them, as a spawned worker gets), bf16 autocast in some threads and not in others, the models in training mode
    in half the draws: every call's ids and numbers are those of the same call made alone (fp32 within 1e-6), and the
    models' modes and torch's settings in the calling thread are as before."""
    import pickle
    import random

    import bertkit
    from bertkit import BertForTokenClassification, BertModel, BertTokenizer
    from bertkit._hardware import int8_kernel

    torch.manual_seed(0)
    BertForTokenClassification.from_pretrained(minilm_2_layers, num_labels=4).save_pretrained(tmp_path / "tagger")
    tok = BertTokenizer.from_pretrained(minilm_2_layers)
    tok.save_pretrained(tmp_path / "tagger")
    st = SentenceTransformer(minilm_2_layers, prompts={"query": "query: ", "doc": "passage: "})
    torch.manual_seed(0)
    ce = CrossEncoder(minilm_2_layers, num_labels=1)
    sp = SparseEncoder(mlm_dir)
    pipes = {"fp32": bertkit.pipeline("feature-extraction", minilm_2_layers),
             "bf16": bertkit.pipeline("feature-extraction", minilm_2_layers, bf16=True),
             "tagger": bertkit.pipeline("token-classification", tmp_path / "tagger")}
    if int8_kernel() is not None:
        pipes["int8"] = bertkit.pipeline("feature-extraction", minilm_2_layers, quantize="int8")
    fast = bertkit.optimize_for_inference(BertModel.from_pretrained(minilm_2_layers))
    models = (st, ce, sp)

    def draw(rng):
        kind = rng.choice(["tok", "pair", "st", "ce", "sp", "pipe", "fast", "pickled"])
        texts = _texts(rng, rng.randint(1, 9))
        if kind == "tok":
            kw = dict(truncation=rng.choice([True, False]), max_length=rng.choice([8, 16, 64]),
                      padding=rng.choice([False, "longest", "max_length"]), return_offsets_mapping=rng.random() < .5)
            return lambda: dict(tok(texts, **kw))
        if kind == "pair":
            windows = rng.random() < .5  # windows over the first text (transformers' rule: only_first to have them)
            kw = dict(truncation="only_first" if windows else rng.choice(["longest_first", "only_first"]),
                      max_length=rng.choice([24, 48]), stride=rng.choice([0, 4]) if windows else 0,
                      return_overflowing_tokens=windows)
            seconds = [" ".join(rng.choice(_WORDS[:10]) for _ in range(3)) for _ in texts]
            return lambda: dict(tok(texts, seconds, **kw))
        if kind == "st":
            kw = dict(batch_size=rng.choice([1, 3, 32]), normalize_embeddings=rng.random() < .5,
                      prompt_name=rng.choice([None, "query", "doc"]), truncate_dim=rng.choice([None, 100]),
                      precision=rng.choice(["float32", "float32", "ubinary"]))
            autocast = rng.random() < .3

            def call():
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                    return _as_numbers(st.encode(texts + texts[:1], **kw))
            return call
        if kind == "ce":
            kw = dict(batch_size=rng.choice([1, 2, 32]), top_k=rng.choice([None, 2]))
            return lambda: [{k: float(v) for k, v in r.items()} for r in ce.rank(texts[0], texts, **kw)]
        if kind == "sp":
            kw = dict(batch_size=rng.choice([1, 4, 32]), max_active_dims=rng.choice([None, 32]))
            return lambda: _as_numbers(sp.encode(texts, **kw))
        if kind == "pipe":
            name = rng.choice(sorted(pipes))
            kw = {"aggregation_strategy": rng.choice(["first", "average", "max"])} if name == "tagger" else {}
            return lambda: pipes[name](texts, **kw)
        batch = tok(texts, padding=True, truncation=True, max_length=64, return_tensors="pt")
        model = fast if kind == "fast" else pickle.loads(pickle.dumps(rng.choice([fast, st.bert, pipes["fp32"].model])))
        model.eval()  # st.bert is in training mode in half the draws: a forward of its own would draw dropout

        def forward():
            with torch.inference_mode():
                return _as_numbers(model(**batch).last_hidden_state)
        return forward

    def settings():
        return (torch.is_grad_enabled(), torch.is_inference_mode_enabled(), torch.is_autocast_enabled("cpu"),
                torch.get_num_threads(), [m.training for m in models])

    for seed in range(12):
        rng = random.Random(seed)
        calls = [draw(rng) for _ in range(rng.randint(2, 8))]
        alone = [call() for call in calls]
        training = seed % 2 == 1
        for model in models:
            model.train(training)
        before = settings()
        results: list = [None] * len(calls)
        barrier = threading.Barrier(len(calls))

        def run(i, calls=calls, results=results, barrier=barrier):
            barrier.wait()
            results[i] = calls[i]()

        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert settings() == before, seed
        for i, (want, got) in enumerate(zip(alone, results)):
            assert _same(want, got), f"seed {seed}, call {i}"
    for model in models:
        model.eval()


def test_sparse_similarity_in_one_thread_keeps_the_filters_another_thread_adds():
    """A server scores sparse embeddings (cos_sim) on one thread while another sets a warnings filter and warns: the
    filter holds. cos_sim silenced PyTorch's CSR warning in warnings.catch_warnings(), which restores the filter list
    it saved on entry: a filter the other thread added meanwhile was dropped (most of 200 here), and its warning, to
    be raised as an error, went by. The similarities are those of the dense embeddings."""
    import time
    import warnings

    from bertkit.sentence.util import cos_sim

    dense = torch.tensor([[0.0, 1.0, 0.0, 2.0], [3.0, 0.0, 0.0, 1.0]])
    sparse = dense.to_sparse()
    torch.testing.assert_close(cos_sim(sparse, sparse), cos_sim(dense, dense))
    stop = threading.Event()

    def score() -> None:
        while not stop.is_set():
            cos_sim(sparse, sparse)

    scorer = threading.Thread(target=score)
    scorer.start()
    lost = 0
    try:
        with warnings.catch_warnings():  # this thread's filters, restored when the test ends (no other thread's)
            for i in range(200):
                warnings.filterwarnings("error", message=f"thread probe {i}$")
                time.sleep(0.0005)
                try:
                    warnings.warn(f"thread probe {i}", UserWarning, stacklevel=1)
                    lost += 1
                except UserWarning:
                    pass
    finally:
        stop.set()
        scorer.join()
    assert lost == 0
