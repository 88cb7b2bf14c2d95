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
