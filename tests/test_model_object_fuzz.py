"""Seeded random chains of what transformers users do to a model object besides calling it, run on a bertkit model and
on transformers' model with the same weights, comparing the outputs after every step.

Each chain draws a head class, a small random config, and 1-4 operations: state dicts crossed both ways, copies
(``copy.deepcopy``, pickle, ``torch.save`` of the whole model), a dtype round trip, gradient checkpointing and
partial freezing (losses and every gradient), ``train()``/``eval()``, ``set_attn_implementation``, the config's output
switches, tables assigned in place of the embeddings' own, and the recipe that lengthens the position table. What
differs by design (docs/coming-from-transformers.md) is left out: outputs at padding, the span softmax over padding,
the masked-LM decoder after a new word table. ``make test-slow`` runs it; BERTKIT_FUZZ_MODEL_CHAINS sets the count.
"""

from __future__ import annotations

import copy
import io
import os
import pickle
import random

import pytest
import torch

import bertkit
import bertkit.heads as H

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.slow

CHAINS = int(os.environ.get("BERTKIT_FUZZ_MODEL_CHAINS", "40"))
CLASSES = ("BertModel", "BertForMaskedLM", "BertForPreTraining", "BertForSequenceClassification",
           "BertForTokenClassification", "BertForQuestionAnswering", "BertForMultipleChoice")


def _config(r: random.Random) -> dict:
    heads = r.choice([1, 2, 4])
    return dict(vocab_size=r.randint(20, 90), hidden_size=heads * r.choice([2, 4, 8]), num_hidden_layers=r.randint(1, 3),
                num_attention_heads=heads, intermediate_size=r.randint(3, 40), max_position_embeddings=r.randint(12, 30),
                type_vocab_size=r.randint(1, 3), hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                hidden_act=r.choice(["gelu", "relu", "gelu_new"]), pad_token_id=r.choice([0, 1]))


def _batch(r: random.Random, kw: dict, name: str, length: int | None = None) -> dict:
    g = torch.Generator().manual_seed(r.randrange(2**31))
    B, T = r.randint(1, 3), length or r.randint(2, min(9, kw["max_position_embeddings"]))
    mask = torch.ones(B, T, dtype=torch.long)
    for row in range(1, B):  # right padding, the first row whole
        mask[row, r.randint(1, T):] = 0
    batch = dict(input_ids=torch.randint(2, kw["vocab_size"], (B, T), generator=g), attention_mask=mask,
                 token_type_ids=torch.randint(0, kw["type_vocab_size"], (B, T), generator=g))
    if name == "BertForMultipleChoice":
        batch = {k: v.unsqueeze(1).expand(B, 2, T).contiguous() for k, v in batch.items()}
    return batch


def _real(out, batch: dict) -> list[torch.Tensor]:
    """The output tensors at real tokens (bertkit's outputs at padding differ by design)."""
    mask = batch["attention_mask"].reshape(-1, batch["attention_mask"].shape[-1]).bool()
    tensors = []
    for value in out.to_tuple():
        for t in value if isinstance(value, tuple) else (value,):
            tensors.append(t[mask] if t.dim() >= 2 and t.shape[:2] == mask.shape else t.float())
    return tensors


def _labels(name: str, batch: dict, kw: dict, num_labels: int) -> dict:
    ids, mask = batch["input_ids"], batch["attention_mask"]
    g = torch.Generator().manual_seed(int(ids.sum()))
    B = ids.shape[0]
    if name == "BertForSequenceClassification":
        return {"labels": torch.randint(0, num_labels, (B,), generator=g)}
    if name in ("BertForTokenClassification", "BertForMaskedLM", "BertForPreTraining"):
        top = num_labels if name == "BertForTokenClassification" else kw["vocab_size"]
        labels = {"labels": torch.randint(0, top, ids.shape, generator=g).masked_fill(mask == 0, -100)}
        return labels | ({"next_sentence_label": torch.randint(0, 2, (B,), generator=g)} if "PreTraining" in name else {})
    if name == "BertForQuestionAnswering":
        return {"start_positions": torch.zeros(B, dtype=torch.long), "end_positions": torch.ones(B, dtype=torch.long)}
    if name == "BertForMultipleChoice":
        return {"labels": torch.randint(0, 2, (B,), generator=g)}
    return {}


def _grads(name: str, model, batch: dict, kw: dict, num_labels: int) -> list:
    if name == "BertForQuestionAnswering":  # the span softmax leaves padding out here (by design)
        batch = {**batch, "attention_mask": torch.ones_like(batch["attention_mask"])}
    model.train()
    out = model(**batch, **_labels(name, batch, kw, num_labels))
    loss = out.loss if name != "BertModel" else out.last_hidden_state[batch["attention_mask"].bool()].pow(2).mean()
    loss.backward()
    grads = [loss.detach()] + [p.grad for _, p in sorted(model.named_parameters())]
    model.zero_grad()
    model.eval()
    return grads


def _copy(how: str, model):
    if how == "deepcopy":
        return copy.deepcopy(model)
    if how == "pickle":
        return pickle.loads(pickle.dumps(model))
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=False)


def _step(op: str, r: random.Random, name: str, kw: dict, num_labels: int, models: dict, batch: dict):
    """Apply ``op`` to both models; returns what to compare (per library), or None."""
    seed, implementation = r.randrange(2**31), r.choice(["eager", "sdpa"])
    results = {}
    for lib, model in models.items():
        enc = model if name == "BertModel" else model.bert
        g = torch.Generator().manual_seed(seed)
        if op == "cross_state_dict":  # the other library's state dict, strictly
            model.load_state_dict(models["hf" if lib == "ours" else "ours"].state_dict(), strict=True)
        elif op in ("deepcopy", "pickle", "torch_save") and lib == "ours":
            # transformers' model is the reference, kept as it is: its hooks (gradient checkpointing's, the output
            # switches') fail to pickle there
            models[lib] = model = _copy(op, model)
            tied = model.get_output_embeddings()
            assert tied is None or tied.weight is model.get_input_embeddings().weight
        elif op == "bf16_and_back":
            model.to(torch.bfloat16).float()
        elif op in ("checkpointing", "freeze"):
            if op == "checkpointing":
                model.gradient_checkpointing_enable()
            else:
                enc.embeddings.requires_grad_(False)
            results[lib] = _grads(name, model, batch, kw, num_labels)
            model.gradient_checkpointing_disable()
        elif op == "train_eval":
            results[lib] = [all(m.training for m in model.train().modules()), model.training,
                            any(m.training for m in model.eval().modules()), model.training]
        elif op == "attn_implementation":
            model.set_attn_implementation(implementation)
        elif op == "output_switch":
            model.config.output_hidden_states = True
            with torch.no_grad():
                results[lib] = _real(model(**batch), batch)
            model.config.output_hidden_states = False
        elif op == "replace_tables" and model.get_output_embeddings() is None:
            words = torch.randn(kw["vocab_size"] + 5, kw["hidden_size"], generator=g)
            enc.embeddings.word_embeddings = torch.nn.Embedding.from_pretrained(words, padding_idx=kw["pad_token_id"])
            types = torch.randn(kw["type_vocab_size"] + 2, kw["hidden_size"], generator=g)
            enc.embeddings.token_type_embeddings = torch.nn.Embedding.from_pretrained(types)
        elif op == "lengthen_positions":
            n = kw["max_position_embeddings"] + 10
            table = torch.randn(n, kw["hidden_size"], generator=g) * 0.1
            enc.embeddings.position_embeddings = torch.nn.Embedding.from_pretrained(table)
            enc.embeddings.position_ids = torch.arange(n).expand((1, -1))
            enc.embeddings.token_type_ids = torch.zeros(1, n, dtype=torch.long)
            model.config.max_position_embeddings = n
            longer = _batch(random.Random(seed), {**kw, "type_vocab_size": 1}, name, length=kw["max_position_embeddings"] + 5)
            with torch.no_grad():
                results[lib] = _real(model(**longer), longer)
    return results or None


OPS = ("cross_state_dict", "deepcopy", "pickle", "torch_save", "bf16_and_back", "checkpointing", "freeze",
       "train_eval", "attn_implementation", "output_switch", "replace_tables", "lengthen_positions")


@pytest.mark.parametrize("seed", range(CHAINS))
def test_a_random_chain_of_model_operations_gives_transformers_results(seed):
    r = random.Random(seed)
    name, kw = r.choice(CLASSES), _config(r)
    num_labels = 2 if name == "BertForQuestionAnswering" else r.randint(2, 4)  # a span head has two outputs
    torch.manual_seed(seed)
    hf = getattr(transformers, name)(transformers.BertConfig(**kw, num_labels=num_labels, attn_implementation="eager"))
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    ours = getattr(H, name, bertkit.BertModel).from_pretrained(
        None, config=bertkit.BertConfig(**kw, num_labels=num_labels), state_dict=hf.state_dict())
    models = {"ours": ours, "hf": hf.eval()}
    batch = _batch(r, kw, name)
    ops = r.choices(OPS, k=r.randint(1, 4))
    for op in ops:
        compared = _step(op, r, name, kw, num_labels, models, batch)
        if compared is not None:
            for ours_value, hf_value in zip(compared["ours"], compared["hf"], strict=True):
                if isinstance(ours_value, torch.Tensor) or isinstance(hf_value, torch.Tensor):
                    assert (ours_value is None) == (hf_value is None), (ops, op)
                    if ours_value is not None:
                        torch.testing.assert_close(ours_value, hf_value, atol=2e-6, rtol=1e-5, msg=f"{ops}: {op}")
                else:
                    assert ours_value == hf_value, (ops, op)
        with torch.no_grad():
            for a, b in zip(_real(models["ours"](**batch), batch), _real(models["hf"](**batch), batch), strict=True):
                torch.testing.assert_close(a, b, atol=2e-6, rtol=1e-5, msg=f"{ops}: forward after {op}")
