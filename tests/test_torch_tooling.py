"""PyTorch's own tooling applied to a bertkit model as to transformers' (the same weights, the same call): module
hooks of every kind, a ``forward`` set on one module (accelerate's ``add_hook_to_module``), ``torch.func.vmap`` for
per-example outputs and gradients, and saving a model that ``torch.nn.utils.prune`` / ``parametrize`` /
``weight_norm`` changed. ``test_torch_tooling_fuzz.py`` draws random combinations of these."""

from __future__ import annotations

import pytest
import torch
import transformers
from torch import nn
from torch.func import functional_call, grad, vmap
from torch.nn.utils import parametrize, prune

import bertkit
import bertkit.heads as H
from bertkit.config import BertConfig
from bertkit.errors import BertkitError
from bertkit.modeling import BertModel

TINY = dict(vocab_size=61, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
            max_position_embeddings=32, type_vocab_size=2, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
TOL = dict(atol=1e-5, rtol=1e-5)


def _pair(cls=BertModel, seed: int = 0, **overrides):
    """(bertkit model, transformers model) with the same weights, in eval mode."""
    torch.manual_seed(seed)
    hf = getattr(transformers, cls.__name__)(transformers.BertConfig(**TINY, **overrides)).eval()
    ours = cls(BertConfig(**TINY, **overrides)).eval()
    ours.load_state_dict(hf.state_dict(), strict=True)
    return ours, hf


def _batch(B: int = 3, T: int = 9, seed: int = 0, padded: bool = True) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(T // 2, T + 1, (B,), generator=g) if padded else torch.full((B,), T)
    lengths[0] = T
    mask = (torch.arange(T)[None] < lengths[:, None]).long()
    ids = torch.randint(5, TINY["vocab_size"], (B, T), generator=g) * mask
    types = (torch.arange(T)[None] >= (lengths[:, None] // 2)).long() * mask
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}


# ---------------------------------------------------------------------------------------------------
# Hooks and forwards of one projection: the fused query/key/value product must not stand in for them
# ---------------------------------------------------------------------------------------------------


def test_a_full_backward_hook_on_a_projection_runs_with_transformers_gradient():
    """A full backward hook on ``attention.self.value`` (gradient attribution, per-example gradient recipes) ran
    once per backward on transformers' model and never on bertkit's, whose fused query/key/value product skipped
    the module call; it now sees transformers' gradient."""
    ours, hf = _pair()
    batch = _batch()
    mask = batch["attention_mask"].bool()
    seen = {}
    for name, model in (("ours", ours), ("hf", hf)):
        grads = seen[name] = []
        model.encoder.layer[1].attention.self.value.register_full_backward_hook(
            lambda m, grad_in, grad_out, grads=grads: grads.append(grad_out[0].detach().clone()))
        model(**batch).last_hidden_state[mask].pow(2).sum().backward()
    assert len(seen["ours"]) == len(seen["hf"]) == 1
    torch.testing.assert_close(seen["ours"][0][mask], seen["hf"][0][mask], **TOL)


def test_a_forward_set_on_a_projection_runs_as_on_transformers():
    """accelerate's ``add_hook_to_module`` (offloading, device maps) sets ``module.forward``: bertkit's fused product
    skipped it (last_hidden_state sum -2.7410 against transformers' -2.7147 with a query forward doubling its
    output, 2 layers, hidden 32); now the module's own forward runs."""
    ours, hf = _pair()
    batch = _batch()
    mask = batch["attention_mask"].bool()
    outs = []
    for model in (ours, hf):
        value = model.encoder.layer[0].attention.self.value
        value.forward = lambda x, plain=value.forward: plain(x) * 3.0
        with torch.no_grad():
            outs.append(model(**batch).last_hidden_state[mask])
    torch.testing.assert_close(outs[0], outs[1], **TOL)
    with torch.no_grad():
        plain = _pair()[1](**batch).last_hidden_state[mask]
    assert (outs[0] - plain).abs().max() > 1e-2  # the forward did change the outputs


def test_a_hook_on_every_module_sees_every_projection_and_transformers_shapes():
    """``register_module_forward_hook`` (a hook on every module: profilers, activation recorders) saw 7 Linear calls
    of bertkit's 2-layer model against transformers' 13 (query, key and value fused) and (N, H) real-token rows;
    now the same 13 calls with transformers' (B, T, H) tensors and numbers."""
    ours, hf = _pair()
    batch = _batch()
    mask = batch["attention_mask"].bool()
    seen = {}
    for name, model in (("ours", ours), ("hf", hf)):
        calls = seen[name] = []
        handle = nn.modules.module.register_module_forward_hook(
            lambda m, args, out, calls=calls: calls.append(out.detach()) if type(m) is nn.Linear else None)
        try:
            with torch.no_grad():
                model(**batch)
        finally:
            handle.remove()
    assert len(seen["ours"]) == len(seen["hf"]) == 13
    for got, want in zip(seen["ours"][:12], seen["hf"][:12], strict=True):  # the pooler's last: (B, H)
        assert got.shape == want.shape
        torch.testing.assert_close(got[mask], want[mask], **TOL)


def test_a_pooler_hook_gets_transformers_token_states():
    """transformers' pooler takes the (B, T, H) token states and reads the first: a pre-hook on ``pooler`` reading
    ``args[0][:, 0]`` (the [CLS] states) got the first feature of each (B, H) row from bertkit, quietly other numbers.
    Now the hook gets (B, T, H), transformers' numbers at real tokens, and a hook replacing the input pools it."""
    ours, hf = _pair()
    batch = _batch()
    mask = batch["attention_mask"].bool()
    seen, pooled = {}, {}
    for name, model in (("ours", ours), ("hf", hf)):
        handle = model.pooler.register_forward_pre_hook(
            lambda m, args, name=name: seen.__setitem__(name, args[0].detach()))
        with torch.no_grad():
            model(**batch)
        handle.remove()
        # A recipe that pools the mean of the real tokens instead of [CLS], through the pooler's dense + tanh
        handle = model.pooler.register_forward_pre_hook(lambda m, args: (
            (args[0] * mask[..., None]).sum(1, keepdim=True) / mask.sum(1)[:, None, None],))
        with torch.no_grad():
            pooled[name] = model(**batch).pooler_output
        handle.remove()
    assert seen["ours"].shape == seen["hf"].shape == (3, 9, TINY["hidden_size"])
    torch.testing.assert_close(seen["ours"][mask], seen["hf"][mask], **TOL)
    torch.testing.assert_close(pooled["ours"], pooled["hf"], **TOL)


@pytest.mark.parametrize("cls", [H.BertForMaskedLM, H.BertForNextSentencePrediction, H.BertForPreTraining],
                         ids=lambda c: c.__name__)
def test_a_hook_on_cls_runs_with_transformers_inputs_and_scores(cls):
    """transformers calls ``model.cls`` (the masked-LM and next-sentence heads); bertkit called only the modules in it,
    so a forward hook on ``cls`` never ran (0 calls against 1). Now it runs once per forward with the same inputs
    and scores."""
    ours, hf = _pair(cls)
    batch = _batch()
    mask = batch["attention_mask"].bool()
    seen = {}
    for name, model in (("ours", ours), ("hf", hf)):
        calls = seen[name] = []
        model.cls.register_forward_hook(lambda m, args, out, calls=calls: calls.append((args, out)))
        with torch.no_grad():
            model(**batch)
    assert len(seen["ours"]) == len(seen["hf"]) == 1
    (args, out), (want_args, want_out) = seen["ours"][0], seen["hf"][0]
    for got, want in zip((*args, *(out if isinstance(out, tuple) else (out,))),
                         (*want_args, *(want_out if isinstance(want_out, tuple) else (want_out,))), strict=True):
        assert got.shape == want.shape
        torch.testing.assert_close(got[mask] if got.dim() == 3 else got, want[mask] if want.dim() == 3 else want, **TOL)


# ---------------------------------------------------------------------------------------------------
# torch.func
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cls", [BertModel, H.BertForSequenceClassification, H.BertForTokenClassification],
                         ids=lambda c: c.__name__)
def test_vmap_gives_per_example_outputs_and_gradients_as_transformers(cls):
    """``vmap(model)`` and per-example gradients ``vmap(grad(loss))`` over rows: transformers' model runs them (with
    no attention mask), bertkit's failed inside its input checks ("Cannot access data pointer of Tensor that doesn't
    have storage"). Now the same outputs and gradients; with a mask too (which transformers' refuses), each row's
    outputs are its own forward's."""
    ours, hf = _pair(cls)
    batch = _batch(padded=False)
    results = {}
    for name, model in (("ours", ours), ("hf", hf)):
        params = {k: v.detach() for k, v in model.named_parameters()}

        def loss(p, ids, types, model=model):
            return functional_call(model, p, (), {"input_ids": ids[None], "token_type_ids": types[None]})[0].pow(2).mean()

        outs = vmap(lambda ids, types, model=model: model(input_ids=ids[None], token_type_ids=types[None])[0][0])(
            batch["input_ids"], batch["token_type_ids"])
        grads = vmap(grad(loss), in_dims=(None, 0, 0))(params, batch["input_ids"], batch["token_type_ids"])
        results[name] = outs, grads
    torch.testing.assert_close(results["ours"][0], results["hf"][0], **TOL)
    assert results["ours"][1].keys() == results["hf"][1].keys()
    for key, want in results["hf"][1].items():
        torch.testing.assert_close(results["ours"][1][key], want, atol=1e-4, rtol=1e-4, msg=key)

    padded = _batch(seed=1)
    rows = vmap(lambda ids, m, types: ours(input_ids=ids[None], attention_mask=m[None], token_type_ids=types[None])[0][0])(
        padded["input_ids"], padded["attention_mask"], padded["token_type_ids"])
    for i in range(3):
        n = int(padded["attention_mask"][i].sum())
        with torch.no_grad():
            want = ours(**{k: v[i:i + 1, :n] for k, v in padded.items()})[0][0]
        torch.testing.assert_close(rows[i][:n] if rows.dim() == 3 else rows[i], want[:n] if want.dim() == 2 else want,
                                   **TOL)


# ---------------------------------------------------------------------------------------------------
# Saving a model a weight transform changed
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("transform", ["prune", "parametrize", "weight_norm", "prune_bias"])
def test_save_pretrained_of_a_transformed_weight_names_the_call_that_makes_it_permanent(transform, tmp_path):
    """transformers' ``save_pretrained`` of a pruned model writes ``weight_orig``/``weight_mask``, which its
    ``from_pretrained`` drops as unexpected, drawing the weight afresh (0.22 off): the pruned model is lost. bertkit
    refused too, but said its projections were "not float weights" and told an int8 model's story. Now the message
    names the weight, the transform and the call that makes it permanent; after that call the save loads back with
    the transformed model's outputs."""
    ours, _ = _pair(H.BertForSequenceClassification)
    module = ours.bert.encoder.layer[0].attention.self.key
    path = "bert.encoder.layer[0].attention.self.key"
    if transform == "prune":
        prune.l1_unstructured(module, "weight", amount=0.5)
        expect, undo = r"key\.weight is pruned .*prune\.remove\(model\.get_submodule\('bert\.encoder\.layer\.0\.", \
            lambda: prune.remove(module, "weight")
    elif transform == "prune_bias":
        prune.l1_unstructured(module, "bias", amount=0.5)
        expect, undo = r"key\.bias is pruned .*'bias'\)", lambda: prune.remove(module, "bias")
    elif transform == "parametrize":
        parametrize.register_parametrization(module, "weight", _Half())
        expect, undo = r"key\.weight is parametrized \(_Half\).*remove_parametrizations\(", \
            lambda: parametrize.remove_parametrizations(module, "weight")
    else:
        torch.nn.utils.weight_norm(module)
        expect, undo = r"key\.weight is weight-normed .*remove_weight_norm\(", \
            lambda: torch.nn.utils.remove_weight_norm(module)
    batch = _batch()
    with torch.no_grad():
        want = ours(**batch).logits
    with pytest.raises(BertkitError, match=expect):
        ours.save_pretrained(tmp_path / "out")
    assert not (tmp_path / "out").exists(), path
    undo()
    ours.save_pretrained(tmp_path / "out")
    with torch.no_grad():
        got = H.BertForSequenceClassification.from_pretrained(tmp_path / "out").eval()(**batch).logits
    torch.testing.assert_close(got, want, **TOL)


class _Half(nn.Module):
    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        return weight * 0.5


# ---------------------------------------------------------------------------------------------------
# bertkit's inference copies (optimize_for_inference, pipelines, encode) of a transformed or hooked model
# ---------------------------------------------------------------------------------------------------


def test_the_inference_copy_of_a_freshly_pruned_model_keeps_the_pruning():
    """Right after ``prune.l1_unstructured``, ``optimize_for_inference`` (and pipelines, ``SentenceTransformer.encode``
    of more than one batch, ``quantize_int8``) failed in its copy: "Only Tensors created explicitly by the user (graph
    leaves) support the deepcopy protocol". Now the copy computes the pruned model's outputs (transformers' model
    pruned alike), and the model passed in keeps its mask."""
    ours, hf = _pair(H.BertForSequenceClassification)
    for model in (ours, hf):
        prune.l1_unstructured(model.bert.encoder.layer[0].attention.self.value, "weight", amount=0.5)
    batch = _batch()
    fast = bertkit.optimize_for_inference(ours)
    with torch.no_grad():
        torch.testing.assert_close(fast(**batch).logits, hf(**batch).logits, **TOL)
        torch.testing.assert_close(ours(**batch).logits, hf(**batch).logits, **TOL)
    assert hasattr(ours.bert.encoder.layer[0].attention.self.value, "weight_mask")


def test_a_hook_on_every_module_runs_on_the_inference_copy_of_the_model_it_knows():
    """A hook registered for every module that acts on one module it knows (``m is target``) never matched the
    inference copy's modules: ``SentenceTransformer.encode`` of MiniLM was 0.28 off sentence-transformers' with one
    halving a layer's output. While such a hook is set, the model runs as it is, with transformers' numbers."""
    ours, hf = _pair(H.BertForSequenceClassification)
    batch = _batch()
    logits = []
    for model in (ours, hf):
        target = model.bert.encoder.layer[1].output.dense
        handle = nn.modules.module.register_module_forward_hook(
            lambda m, args, out, target=target: out * 5.0 if m is target else None)
        try:
            with torch.no_grad():
                logits.append((bertkit.optimize_for_inference(model) if model is ours else model)(**batch).logits)
        finally:
            handle.remove()
    torch.testing.assert_close(logits[0], logits[1], **TOL)
    with torch.no_grad():
        assert (logits[0] - hf(**batch).logits).abs().max() > 1e-4  # the hook did change the outputs


@pytest.mark.parametrize("every_module", [False, True], ids=["decoder-hook", "every-module-hook"])
def test_sparse_encoder_runs_a_hooked_decoder_as_it_is(every_module, minilm_2_layers, tmp_path):
    """``SparseEncoder.encode`` of more than one batch computes the vocabulary logits on a copy of the masked-LM
    decoder prepared for the CPU, which skipped a forward hook on ``cls.predictions.decoder``: with a hook scaling
    the logits by 1.3, vectors 0.22 off sentence-transformers' with the same hook. Now a hooked decoder is called
    as it is, and the vectors agree within 1e-5."""
    st = pytest.importorskip("sentence_transformers")
    from bertkit.sentence import SparseEncoder
    from sparse_helpers import masked_lm_checkpoint

    checkpoint = masked_lm_checkpoint(minilm_2_layers, tmp_path / "checkpoint")
    texts = ["the cat sat on the mat", "a quick brown fox jumps over the lazy dog by the river", "hello",
             "pruning the weights of a model", "five short texts in batches of two"]
    vectors = []
    for model in (SparseEncoder(checkpoint), st.SparseEncoder(str(checkpoint), device="cpu")):
        decoder = next(m for n, m in model.named_modules() if n.endswith("cls.predictions.decoder"))
        if every_module:
            handle = nn.modules.module.register_module_forward_hook(
                lambda m, args, out, decoder=decoder: out * 1.3 if m is decoder else None)
        else:
            handle = decoder.register_forward_hook(lambda m, args, out: out * 1.3)
        try:
            vectors.append(model.encode(texts, batch_size=2, convert_to_tensor=True).to_dense())
        finally:
            handle.remove()
    torch.testing.assert_close(vectors[0], vectors[1], atol=1e-5, rtol=1e-5)
