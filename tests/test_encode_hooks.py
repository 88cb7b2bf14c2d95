"""A forward hook the caller registers on a module of a sentence model's encoder is called with that module, as in
sentence-transformers, when ``encode`` runs more than one batch: such a call ran on the encoder's inference copy,
whose copied hooks were handed the copy's modules, so a hook that knows its module (``module is layer``, a dict keyed
by module) captured nothing (``encoder_for_encode`` now runs the model itself where a module has a hook)."""

from __future__ import annotations

import pytest
import torch

st = pytest.importorskip("sentence_transformers")

TEXTS = [f"sentence number {i} is a short one" for i in range(12)]


def _captured(model, layer) -> list[bool]:
    seen = []
    layer.register_forward_hook(lambda module, args, output: seen.append(module is layer))
    model.encode(TEXTS, batch_size=4)
    return seen


def test_sentence_transformer_encode_calls_a_hook_with_the_models_own_module(minilm_2_layers):
    from bertkit.sentence import SentenceTransformer

    ours = SentenceTransformer(minilm_2_layers)
    theirs = st.SentenceTransformer(str(minilm_2_layers), device="cpu")
    want = _captured(theirs, theirs[0].auto_model.encoder.layer[1])
    assert want == [True] * 3
    assert _captured(ours, ours[0].auto_model.encoder.layer[1]) == want
    # and the vectors are still sentence-transformers'
    torch.testing.assert_close(
        torch.from_numpy(ours.encode(TEXTS, batch_size=4)),
        torch.from_numpy(theirs.encode(TEXTS, batch_size=4)),
        atol=1e-5,
        rtol=0,
    )


def test_sparse_encoder_encode_calls_a_hook_with_the_models_own_module(minilm_2_layers, tmp_path):
    from bertkit.sentence import SparseEncoder
    from sparse_helpers import masked_lm_checkpoint

    directory = masked_lm_checkpoint(minilm_2_layers, tmp_path / "mlm")
    ours = SparseEncoder(directory)
    theirs = st.SparseEncoder(str(directory), device="cpu")
    want = _captured(theirs, theirs[0].auto_model.bert.encoder.layer[0])
    assert want == [True] * 3
    assert _captured(ours, ours[0].auto_model.bert.encoder.layer[0]) == want


def test_a_pipeline_made_from_a_hooked_model_calls_the_hook_with_its_own_module(minilm_2_layers):
    """The same for a pipeline made from a model object, as transformers' pipeline (which runs the model itself)
    calls it; the model stays in the mode the caller left it in, and the states are transformers'."""
    import numpy as np
    import transformers

    import bertkit

    def captured(pipe, layer, model) -> tuple[list[bool], list]:
        seen = []
        handle = layer.register_forward_hook(lambda module, args, output: seen.append(module is layer))
        out = pipe(TEXTS[:5])
        handle.remove()
        return seen, out

    ours = bertkit.BertModel.from_pretrained(minilm_2_layers).train()
    theirs = transformers.BertModel.from_pretrained(str(minilm_2_layers)).eval()
    pipe = bertkit.pipeline("feature-extraction", model=ours, tokenizer=bertkit.AutoTokenizer.from_pretrained(
        minilm_2_layers), batch_size=2, pooling="none")
    reference = transformers.pipeline("feature-extraction", model=theirs, device="cpu",
                                      tokenizer=transformers.AutoTokenizer.from_pretrained(str(minilm_2_layers)))
    want, want_out = captured(reference, theirs.encoder.layer[1], theirs)
    got, got_out = captured(pipe, ours.encoder.layer[1], ours)
    assert want == [True] * 5 and got == [True] * 3  # transformers runs one text a call, bertkit batches of 2
    assert ours.training  # left in its mode: the call ran it in eval mode
    for a, b in zip(got_out, want_out):
        np.testing.assert_allclose(np.asarray(a).reshape(-1), np.asarray(b).reshape(-1), atol=1e-5, rtol=0)
    # without the hook, the next call runs the prepared copy again (the pipeline saw the hook go)
    pipe(TEXTS[:1])
    assert not pipe._runs_given
