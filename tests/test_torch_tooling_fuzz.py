"""Seeded random draws of the PyTorch tooling a user applies to a loaded model, run on a bertkit model and on
transformers' model with the same weights, comparing outputs (1e-5), gradients (1e-4) and what hooks see.

Each draw takes a head class, a small random config and one situation: a hook of one kind (forward, pre-forward
replacing the input, full backward, one on every module) on a random submodule; a ``forward`` set on a projection;
a weight transform (``torch.nn.utils.prune``, ``parametrize``, ``weight_norm``, ``quantize_dynamic``) followed by a
copy (``deepcopy``, ``torch.save`` of the model) and the inference copy ``optimize_for_inference``; ``torch.func``'s
``functional_call`` with other weights and ``grad``; ``vmap`` over rows. What differs by design
(docs/coming-from-transformers.md) is left out: outputs at padding, the span softmax over padding, the layer's
output tuple. ``make test-slow`` runs it; BERTKIT_FUZZ_TOOLING_DRAWS sets the count.
"""

from __future__ import annotations

import copy
import io
import os
import random

import pytest
import torch
from torch import nn
from torch.func import functional_call, grad, vmap
from torch.nn.utils import parametrize, prune

import bertkit
import bertkit.heads as H

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.slow

DRAWS = int(os.environ.get("BERTKIT_FUZZ_TOOLING_DRAWS", "60"))
CLASSES = ("BertModel", "BertForMaskedLM", "BertForPreTraining", "BertForSequenceClassification",
           "BertForTokenClassification", "BertForQuestionAnswering", "BertForMultipleChoice",
           "BertForNextSentencePrediction")
SUBMODULES = ("embeddings", "embeddings.LayerNorm", "encoder.layer.0", "encoder.layer.1.attention",
              "encoder.layer.0.attention.self", "encoder.layer.0.attention.self.query",
              "encoder.layer.1.attention.self.key", "encoder.layer.1.attention.self.value",
              "encoder.layer.0.attention.output", "encoder.layer.1.intermediate.dense", "encoder.layer.1.output",
              "encoder.layer.0.output.dense", "pooler", "pooler.dense")
SITUATIONS = ("forward_hook", "pre_hook", "backward_hook", "global_hook", "own_forward", "transform", "func_grad",
              "vmap")
TRANSFORMS = ("l1", "structured", "parametrize", "weight_norm", "quantize_dynamic")


def _config(r: random.Random) -> dict:
    heads = r.choice([2, 4])
    return dict(vocab_size=r.randint(40, 90), hidden_size=heads * r.choice([8, 16]), num_hidden_layers=2,
                num_attention_heads=heads, intermediate_size=r.randint(20, 70), max_position_embeddings=32,
                type_vocab_size=2, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                hidden_act=r.choice(["gelu", "relu", "gelu_new"]), pad_token_id=0)


def _pair(name: str, kw: dict, seed: int):
    num_labels = 2 if name in ("BertForQuestionAnswering", "BertForNextSentencePrediction") else 3
    torch.manual_seed(seed)
    hf = getattr(transformers, name)(transformers.BertConfig(**kw, num_labels=num_labels, attn_implementation="eager"))
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    ours = getattr(H, name, bertkit.BertModel).from_pretrained(
        None, config=bertkit.BertConfig(**kw, num_labels=num_labels), state_dict=hf.state_dict())
    return ours.eval(), hf.eval()


def _batch(r: random.Random, kw: dict, name: str, padded: bool = True) -> dict:
    g = torch.Generator().manual_seed(r.randrange(2**31))
    B, T = r.randint(2, 3), r.randint(3, 12)
    mask = torch.ones(B, T, dtype=torch.long)
    for row in range(1, B):
        if padded and name != "BertForQuestionAnswering":  # the span softmax leaves padding out by design
            mask[row, r.randint(1, T):] = 0
    batch = dict(input_ids=torch.randint(2, kw["vocab_size"], (B, T), generator=g), attention_mask=mask,
                 token_type_ids=torch.randint(0, 2, (B, T), generator=g))
    if name == "BertForMultipleChoice":
        batch = {k: v.unsqueeze(1).expand(B, 2, T).contiguous() for k, v in batch.items()}
    return batch


def _real(value, mask: torch.Tensor) -> list[torch.Tensor]:
    """The tensors in ``value`` (an output, a tuple, a tensor) at real tokens: those shaped (B, T, ...) masked."""
    values = value.to_tuple() if hasattr(value, "to_tuple") else value if isinstance(value, (tuple, list)) else (value,)
    tensors = []
    for v in values:
        for t in v if isinstance(v, tuple) else (v,):
            if isinstance(t, torch.Tensor):
                tensors.append(t[mask] if t.dim() >= 2 and t.shape[:2] == mask.shape else t)
    return tensors


def _close(ours: list, hf: list, tol: float, what: str) -> None:
    assert len(ours) == len(hf), what
    for a, b in zip(ours, hf, strict=True):
        assert a.shape == b.shape, what
        torch.testing.assert_close(a.float(), b.float(), atol=tol, rtol=tol, msg=what)


def _transform(kind: str, model: nn.Module, name: str, seed: int) -> nn.Module:
    enc = model if name == "BertModel" else model.bert
    rng = random.Random(seed)
    target = enc.encoder.layer[rng.randrange(2)].attention.self.get_submodule(rng.choice(["query", "key", "value"]))
    dense = enc.encoder.layer[1].intermediate.dense
    torch.manual_seed(seed)
    if kind == "l1":
        prune.l1_unstructured(target, "weight", amount=0.4)
    elif kind == "structured":
        prune.ln_structured(dense, "weight", amount=0.3, n=2, dim=0)
    elif kind == "parametrize":
        parametrize.register_parametrization(target, "weight", _Scale())
    elif kind == "weight_norm":
        torch.nn.utils.parametrizations.weight_norm(dense)
    else:
        return torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)
    return model


class _Scale(nn.Module):
    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        return weight * 0.7


def _hooked_run(situation: str, model: nn.Module, module: nn.Module, batch: dict, mask: torch.Tensor):
    """(outputs at real tokens, what the hook saw) with one hook of ``situation``'s kind on ``module``."""
    seen = []
    if situation == "forward_hook":
        handle = module.register_forward_hook(lambda m, a, o: seen.append(o[0] if isinstance(o, tuple) else o))
    elif situation == "pre_hook":  # replaces the input, as a noise-injection or steering recipe does
        handle = module.register_forward_pre_hook(
            lambda m, a: (a[0] * 0.7, *a[1:]) if a and a[0].is_floating_point() else None)
    elif situation == "backward_hook":
        handle = module.register_full_backward_hook(lambda m, gi, go: seen.append(go[0]))
    else:
        handle = nn.modules.module.register_module_forward_hook(
            lambda m, a, o: seen.append(o) if type(m) is nn.Linear else None)
    try:
        model.train(situation == "backward_hook")
        out = _real(model(**batch), mask)
        if situation == "backward_hook":
            out[0].float().pow(2).sum().backward()
    finally:
        handle.remove()
        model.eval()
    return [t.detach() for t in out], [t.detach() for t in seen if t is not None]


def _loss(name: str, out, mask: torch.Tensor) -> torch.Tensor:
    first = out[0]
    return (first[mask] if first.dim() >= 2 and first.shape[:2] == mask.shape else first).float().pow(2).mean()


@pytest.mark.parametrize("seed", range(DRAWS))
def test_torch_tooling_on_a_bertkit_model_gives_transformers_results(seed):
    torch.set_num_threads(1)
    r = random.Random(seed)
    name, kw = r.choice(CLASSES), _config(r)
    situation = SITUATIONS[seed % len(SITUATIONS)]
    ours, hf = _pair(name, kw, seed)
    batch = _batch(r, kw, name, padded=situation != "vmap")
    mask = batch["attention_mask"].reshape(-1, batch["attention_mask"].shape[-1]).bool()
    prefix = "" if name == "BertModel" else "bert."
    what = f"seed {seed}: {name} {situation}"
    if situation in ("forward_hook", "pre_hook", "backward_hook", "global_hook"):
        has_pooler = (ours if name == "BertModel" else ours.bert).pooler is not None
        sub = prefix + r.choice([s for s in SUBMODULES if has_pooler or not s.startswith("pooler")])
        what += f" on {sub}"
        runs = [_hooked_run(situation, m, m.get_submodule(sub), batch, mask) for m in (ours, hf)]
        _close(runs[0][0], runs[1][0], 1e-5, what)
        seen_ours, seen_hf = runs[0][1], runs[1][1]
        assert len(seen_ours) == len(seen_hf), what
        for a, b in zip(seen_ours, seen_hf, strict=True):
            if not sub.endswith(("layer.0", "layer.1", "encoder.layer.1.attention")):  # a layer's tuple: by design
                _close(_real(a, mask), _real(b, mask), 1e-4, what)
    elif situation == "own_forward":
        outs, layer = [], r.randrange(2)
        for model in (ours, hf):
            enc = model if name == "BertModel" else model.bert
            value = enc.encoder.layer[layer].attention.self.value
            value.forward = lambda x, plain=value.forward: plain(x) * 2.5
            with torch.no_grad():
                outs.append(_real(model(**batch), mask))
        _close(outs[0], outs[1], 1e-5, what)
    elif situation == "transform":
        kind = r.choice(TRANSFORMS)
        what += f" {kind}"
        ours, hf = _transform(kind, ours, name, seed), _transform(kind, hf, name, seed)
        tol = 2e-2 if kind == "quantize_dynamic" else 1e-5
        fast = bertkit.optimize_for_inference(ours)  # before any forward: prune's weight is still a graph's output
        with torch.no_grad():
            want = _real(hf(**batch), mask)
            _close(_real(ours(**batch), mask), want, tol, what)
            copies = [fast]
            if kind != "parametrize" and kind != "weight_norm":  # torch pickles no parametrized module
                buffer = io.BytesIO()
                torch.save(ours, buffer)
                buffer.seek(0)
                copies += [copy.deepcopy(ours), torch.load(buffer, weights_only=False)]
            for other in copies:
                _close(_real(other(**batch), mask), want, tol, what + " after a copy")
            _close(_real(ours(**batch), mask), want, tol, what + " on the model copied")
    elif situation == "func_grad":
        params = {k: v.detach() + 0.01 * torch.randn_like(v) for k, v in hf.named_parameters()}
        results = []
        for model in (ours, hf):
            with torch.no_grad():
                out = _real(functional_call(model, params, (), batch), mask)
            grads = grad(lambda p, model=model: _loss(name, functional_call(model, p, (), batch), mask))(params)
            results.append((out, [grads[k] for k in sorted(grads)]))
        _close(results[0][0], results[1][0], 1e-5, what)
        _close(results[0][1], results[1][1], 1e-4, what + " gradients")
    else:  # vmap over rows, per-example gradients; no mask (transformers' refuses one under vmap)
        ids, types = batch["input_ids"], batch["token_type_ids"]
        results = []
        for model in (ours, hf):
            params = {k: v.detach() for k, v in model.named_parameters()}

            def loss(p, i, t, model=model):
                return functional_call(model, p, (), {"input_ids": i[None], "token_type_ids": t[None]})[0].pow(2).mean()

            outs = vmap(lambda i, t, model=model: model(input_ids=i[None], token_type_ids=t[None])[0][0])(ids, types)
            grads = vmap(grad(loss), in_dims=(None, 0, 0))(params, ids, types)
            results.append(([outs], [grads[k] for k in sorted(grads)]))
        _close(results[0][0], results[1][0], 1e-5, what)
        _close(results[0][1], results[1][1], 1e-4, what + " per-example gradients")
