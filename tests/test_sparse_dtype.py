"""A SparseEncoder cast with .half() / .bfloat16() / .double() beside sentence-transformers 6's: the vectors come back
in the model's type, as there, with its numbers (the same values in half precision; float64's, not float32's). The
model: MiniLM's first 2 layers with a masked-LM head (sparse_helpers), max and sum pooling; an inference-free
router's static query weights too."""

from __future__ import annotations

import warnings

import pytest
import torch

from sparse_helpers import masked_lm_checkpoint

st = pytest.importorskip("sentence_transformers")
pytest.importorskip("transformers")
from sentence_transformers.sparse_encoder.modules import (  # noqa: E402
    MLMTransformer,
    Router,
    SparseStaticEmbedding,
    SpladePooling,
)

TEXTS = ["The cat sat on the mat near the door.", "Which team won Super Bowl 50?", "hello"]


@pytest.fixture(scope="module")
def sparse_dirs(tmp_path_factory, minilm_2_layers):
    """{"max": ..., "sum": ..., "router": ...}: sparse directories sentence-transformers wrote."""
    root = tmp_path_factory.mktemp("sparse-dtype")
    checkpoint = masked_lm_checkpoint(minilm_2_layers, root / "checkpoint")
    dirs = {}
    for strategy in ("max", "sum"):
        st.SparseEncoder(modules=[MLMTransformer(str(checkpoint)), SpladePooling(strategy)], device="cpu").save(
            str(root / strategy))
        dirs[strategy] = root / strategy
    document = MLMTransformer(str(checkpoint))
    torch.manual_seed(1)
    vocab = document.tokenizer.vocab_size
    query = SparseStaticEmbedding(tokenizer=document.tokenizer, weight=torch.rand(vocab) * (torch.rand(vocab) < 0.5))
    router = Router.for_query_document(query_modules=[query], document_modules=[document, SpladePooling("max")])
    st.SparseEncoder(modules=[router], similarity_fn_name="dot", device="cpu").save(str(root / "router"))
    dirs["router"] = root / "router"
    return dirs


def _dense(x: torch.Tensor) -> torch.Tensor:
    return x.to_dense() if x.is_sparse else x


# make test: each layout once and each cast once (each of the three comparisons below); the other six in make test-slow
_IN_MAKE_TEST = {("max", "double"), ("sum", "half"), ("router", "bfloat16")}


@pytest.mark.parametrize(("layout", "cast"), [
    (layout, cast) if (layout, cast) in _IN_MAKE_TEST else pytest.param(layout, cast, marks=pytest.mark.slow)
    for cast in ("half", "bfloat16", "double") for layout in ("max", "sum", "router")])
def test_cast_sparse_encoder_keeps_its_type(sparse_dirs, layout, cast):
    from bertkit.sentence.sparse_encoder import SparseEncoder

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = getattr(st.SparseEncoder(str(sparse_dirs[layout]), device="cpu"), cast)()
    ours = getattr(SparseEncoder(str(sparse_dirs[layout])), cast)()
    calls = [("encode", {}), ("encode", {"convert_to_sparse_tensor": False}), ("encode", {"max_active_dims": 7})]
    if layout == "router":
        calls = [("encode_query", {}), ("encode_document", {"convert_to_sparse_tensor": False})]
    for method, kwargs in calls:
        expected = _dense(getattr(ref, method)(TEXTS, **kwargs))
        got = _dense(getattr(ours, method)(TEXTS, **kwargs))
        # bertkit gave float32 from every model: a float64 model's weights 2.6e-8 from sentence-transformers'
        assert got.dtype == expected.dtype == {"half": torch.float16, "bfloat16": torch.bfloat16,
                                               "double": torch.float64}[cast], (method, kwargs)
        assert torch.equal(got != 0, expected != 0), (method, kwargs)
        if cast == "double":
            torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
        elif layout == "sum":  # summed in float32 here, in the model's type there: within the type's rounding
            torch.testing.assert_close(got, expected)
        else:
            assert torch.equal(got, expected), (method, kwargs)


def test_a_sparse_encoder_saved_in_half_precision_warns_that_it_is_computed_in_float32(sparse_dirs, tmp_path, caplog):
    """A SparseEncoder cast with .bfloat16() and saved is computed in float32 when loaded again, where
    sentence-transformers 6 computes it in bfloat16: it came back without a word. The warning names the saved type
    and the cast that computes in it as there; a float32 directory warns nothing."""
    import logging

    from bertkit.sentence.sparse_encoder import SparseEncoder

    SparseEncoder(str(sparse_dirs["max"])).bfloat16().save(tmp_path / "bf16")
    with caplog.at_level(logging.WARNING, logger="bertkit"):
        ours = SparseEncoder(str(tmp_path / "bf16"))
    assert (f"{tmp_path / 'bf16'} was saved in bfloat16 and is computed in float32, where sentence-transformers 6 "
            "computes it in bfloat16: the vectors and scores differ by bfloat16 rounding; call .half() or .bfloat16() "
            "on the SparseEncoder to compute in bfloat16 as there") in caplog.text
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = st.SparseEncoder(str(tmp_path / "bf16"), device="cpu")
    assert next(ours.parameters()).dtype == torch.float32 and next(theirs.parameters()).dtype == torch.bfloat16
    # cast as the warning says, the vectors are sentence-transformers' on the same directory
    assert torch.equal(_dense(ours.bfloat16().encode(TEXTS)), _dense(theirs.encode(TEXTS)))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="bertkit"):
        SparseEncoder(str(sparse_dirs["max"]))
    assert caplog.text == ""
