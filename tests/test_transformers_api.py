"""The model API people port from transformers, checked against transformers on the same weights."""

from __future__ import annotations

import json
import sys

import pytest
import torch

import bertkit.heads as H
from bertkit import BertConfig, BertModel
from bertkit.errors import BertkitError, MissingFileError

transformers = pytest.importorskip("transformers")

TOL = dict(atol=1e-5, rtol=0)
TINY = dict(vocab_size=211, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
            max_position_embeddings=40, type_vocab_size=2, hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0)


def _batch(seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, TINY["vocab_size"], (3, 11), generator=g)
    mask = torch.ones(3, 11, dtype=torch.long)
    mask[1, 5:] = 0  # padded rows: the default layout drops padding, output_attentions must not
    mask[2, 9:] = 0
    return dict(input_ids=ids, token_type_ids=torch.randint(0, 2, (3, 11), generator=g), attention_mask=mask)


def _pair(hf_name: str, tmp_path, num_labels: int = 3):
    """A transformers model with random weights (eager attention: the one that returns probabilities) and the
    same weights in bertkit."""
    torch.manual_seed(0)
    hf = getattr(transformers, hf_name)(transformers.BertConfig(**TINY, num_labels=num_labels,
                                                                attn_implementation="eager")).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    ours = getattr(H, hf_name, BertModel).from_pretrained(None, config=BertConfig(**TINY).with_labels(num_labels),
                                                          state_dict=hf.state_dict()).eval()
    return ours, hf


@pytest.mark.parametrize("hf_name", ["BertModel", "BertForSequenceClassification", "BertForTokenClassification"])
def test_output_attentions_equal_transformers(hf_name, tmp_path):
    ours, hf = _pair(hf_name, tmp_path)
    inputs = _batch()
    with torch.no_grad():
        a = ours(**inputs, output_attentions=True, output_hidden_states=True)
        b = hf(**inputs, output_attentions=True, output_hidden_states=True)
        plain = ours(**inputs)  # default path: padding dropped, SDPA
    assert len(a.attentions) == TINY["num_hidden_layers"]
    for x, y in zip(a.attentions, b.attentions):
        assert x.shape == (3, 4, 11, 11)
        torch.testing.assert_close(x, y, **TOL)
    real = inputs["attention_mask"].bool()
    for x, y in zip(a.hidden_states, b.hidden_states):
        torch.testing.assert_close(x[real], y[real], **TOL)
    # Asking for attentions changes nothing else: same outputs as the fast path at real positions.
    if hf_name == "BertModel":
        torch.testing.assert_close(a.last_hidden_state[real], plain.last_hidden_state[real], **TOL)
        assert plain.attentions is None and a[3] is a.attentions
    else:
        torch.testing.assert_close(a.logits[real] if a.logits.dim() == 3 else a.logits,
                                   plain.logits[real] if plain.logits.dim() == 3 else plain.logits, **TOL)


def test_output_attentions_with_gradient_checkpointing_and_dropout_in_eval_equal():
    model = BertModel(BertConfig(**TINY)).train()
    model.gradient_checkpointing_enable()
    out = model(**_batch(), output_attentions=True)
    out.last_hidden_state.sum().backward()
    rows = out.attentions[0].sum(-1)  # each query's probabilities sum to 1 (no dropout: TINY has p = 0)
    torch.testing.assert_close(rows, torch.ones_like(rows), **TOL)


def test_tuple_access_and_return_dict_false_match_transformers(tmp_path):
    ours, hf = _pair("BertForSequenceClassification", tmp_path)
    inputs, labels = _batch(), torch.tensor([0, 2, 1])
    with torch.no_grad():
        a = ours(**inputs, labels=labels, return_dict=False)
        b = hf(**inputs, labels=labels, return_dict=False)
        out = ours(**inputs)
    assert isinstance(a, tuple) and len(a) == len(b) == 2  # (loss, logits)
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, **TOL)
    torch.testing.assert_close(out[0], b[1], **TOL)  # no labels: loss is left out, as in ModelOutput
    assert out["logits"] is out.logits and len(out) == 1

    enc, hf_enc = _pair("BertModel", tmp_path)
    with torch.no_grad():
        a, b = enc(**inputs, return_dict=False), hf_enc(**inputs, return_dict=False)
    real = inputs["attention_mask"].bool()
    torch.testing.assert_close(a[0][real], b[0][real], **TOL)
    torch.testing.assert_close(a[1], b[1], **TOL)


def test_inputs_embeds_equal_transformers(tmp_path):
    ours, hf = _pair("BertForSequenceClassification", tmp_path)
    inputs = _batch()
    embeds = torch.randn(3, 11, TINY["hidden_size"], generator=torch.Generator().manual_seed(3))
    kwargs = dict(token_type_ids=inputs["token_type_ids"], attention_mask=inputs["attention_mask"])
    with torch.no_grad():
        a = ours(inputs_embeds=embeds, **kwargs).logits
        b = hf(inputs_embeds=embeds, **kwargs).logits
        c = ours(inputs_embeds=embeds, **kwargs, output_attentions=True).logits  # padded layout
        # The word-embedding lookup given as inputs_embeds gives the input_ids result.
        d = ours(inputs_embeds=ours.get_input_embeddings()(inputs["input_ids"]), **kwargs).logits
        e = ours(**inputs).logits
    torch.testing.assert_close(a, b, **TOL)
    torch.testing.assert_close(c, b, **TOL)
    torch.testing.assert_close(d, e, **TOL)
    with pytest.raises(BertkitError, match="exactly one of input_ids"):
        ours(input_ids=inputs["input_ids"], inputs_embeds=embeds)


def test_resize_token_embeddings_matches_transformers(tmp_path):
    ours, hf = _pair("BertForMaskedLM", tmp_path)
    old = ours.get_input_embeddings().weight.detach().clone()
    n = TINY["vocab_size"] + 5
    hf.resize_token_embeddings(n)  # transformers' default: new rows at the old rows' mean (plus ~1e-6 noise)
    emb = ours.resize_token_embeddings(n)
    assert emb is ours.get_input_embeddings() and emb.num_embeddings == n
    assert ours.config.vocab_size == n and ours.bert.config.vocab_size == n
    torch.testing.assert_close(emb.weight[: n - 5], old, rtol=0, atol=0)
    torch.testing.assert_close(emb.weight, hf.get_input_embeddings().weight, atol=1e-4, rtol=0)
    torch.testing.assert_close(ours.cls.predictions.bias, hf.cls.predictions.bias, **TOL)  # zeros for the new tokens
    # Same new rows in both: the MLM logits (decoder tied to the resized embeddings) are equal everywhere.
    with torch.no_grad():
        hf.get_input_embeddings().weight.copy_(emb.weight)
        ids = torch.tensor([[2, 211, 50, 215, 3]])
        torch.testing.assert_close(ours(ids).prediction_logits, hf(ids).logits, **TOL)
    assert ours.resize_token_embeddings(n + 1, pad_to_multiple_of=8).num_embeddings == 224
    ours.save_pretrained(tmp_path / "resized")
    again = H.BertForMaskedLM.from_pretrained(tmp_path / "resized")
    assert again.config.vocab_size == 224
    torch.testing.assert_close(again.cls.predictions.bias, ours.cls.predictions.bias, rtol=0, atol=0)


def test_set_input_embeddings_and_device_dtype():
    model = H.BertForTokenClassification(BertConfig(**TINY))
    assert model.device == torch.device("cpu") and model.dtype == torch.float32
    new = torch.nn.Embedding(300, TINY["hidden_size"])
    model.set_input_embeddings(new)
    assert model.get_input_embeddings() is new and model.config.vocab_size == 300
    with pytest.raises(BertkitError, match="hidden_size 32"):
        model.set_input_embeddings(torch.nn.Embedding(300, 16))


def test_gradient_checkpointing_enable_gives_the_same_gradients():
    torch.manual_seed(0)
    model = H.BertForSequenceClassification(BertConfig(**TINY))
    inputs, labels = _batch(), torch.tensor([0, 1, 1])
    model(**inputs, labels=labels).loss.backward()
    want = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model.gradient_checkpointing_enable()
    assert model.is_gradient_checkpointing and model.bert.gradient_checkpointing  # the switch the loop sets
    model(**inputs, labels=labels).loss.backward()
    for p, w in zip(model.parameters(), want):
        torch.testing.assert_close(p.grad, w, atol=1e-6, rtol=0)
    with pytest.raises(BertkitError, match="non-reentrant"):
        model.gradient_checkpointing_enable({"use_reentrant": True})
    model.gradient_checkpointing_disable()
    assert not model.is_gradient_checkpointing


def test_from_pretrained_dtype_device_and_strict_keywords(tmp_path):
    BertModel(BertConfig(**TINY)).save_pretrained(tmp_path)
    assert BertModel.from_pretrained(tmp_path, dtype=torch.bfloat16).dtype == torch.bfloat16
    assert BertModel.from_pretrained(tmp_path, dtype="float16", device="cpu").dtype == torch.float16
    assert BertModel.from_pretrained(tmp_path, torch_dtype=torch.bfloat16).dtype == torch.bfloat16
    assert BertModel.from_pretrained(tmp_path, dtype="auto").dtype == torch.float32
    with pytest.raises(BertkitError, match="not a torch floating-point dtype"):
        BertModel.from_pretrained(tmp_path, dtype="int8")
    # A keyword that is no config field is an error naming it, not a key that breaks the next save.
    with pytest.raises(BertkitError, match="unknown keyword arguments device_map, output_attention:"):
        BertModel.from_pretrained(tmp_path, output_attention=True, device_map="auto")
    # Unknown keys of a config.json are still kept and saved back.
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "gradient_checkpointing": False, "foo": [1]}))
    model = BertModel.from_pretrained(tmp_path, hidden_dropout_prob=0.2)
    assert model.config.extra["foo"] == [1] and model.config.hidden_dropout_prob == 0.2
    model.save_pretrained(tmp_path / "again")
    assert json.loads((tmp_path / "again" / "config.json").read_text())["foo"] == [1]
    cfg = BertConfig.from_pretrained(tmp_path, num_labels=4)
    assert cfg.hidden_size == 32 and cfg.num_labels == 4
    assert BertConfig.from_pretrained(tmp_path / "config.json") == BertConfig.from_pretrained(tmp_path)


@pytest.mark.parametrize("hf_name", ["BertForPreTraining", "BertForQuestionAnswering", "BertForMultipleChoice"])
def test_transformers_state_dict_in_memory(hf_name, tmp_path):
    """A transformers model's state_dict() (bert. prefix, separate q/k/v, tied decoder) through the key table."""
    ours, hf = _pair(hf_name, tmp_path, num_labels=2)
    g = torch.Generator().manual_seed(4)
    shape = (2, 3, 9) if hf_name == "BertForMultipleChoice" else (2, 9)
    ids = torch.randint(1, TINY["vocab_size"], shape, generator=g)
    with torch.no_grad():
        for x, y in zip(ours(ids, return_dict=False), hf(ids, return_dict=False)):
            torch.testing.assert_close(x, y, **TOL)
    # The bare encoder takes a head model's state dict too (the head's weights are reported and dropped).
    enc = BertModel.from_pretrained(None, config=BertConfig(**TINY), state_dict=hf.state_dict())
    torch.testing.assert_close(enc.get_input_embeddings().weight, hf.get_input_embeddings().weight, rtol=0, atol=0)
    bad = dict(hf.state_dict())
    bad["bert.encoder.layer.0.attention.self.query.weight_typo"] = bad.pop("bert.encoder.layer.0.attention.self.query.weight")
    with pytest.raises(BertkitError, match="missing keys.*unexpected keys"):
        type(ours).from_pretrained(None, config=ours.config, state_dict=bad)


def test_hub_id_without_files_says_how_to_get_them(monkeypatch):
    hub = pytest.importorskip("huggingface_hub")
    monkeypatch.setattr(hub.constants, "HF_HUB_OFFLINE", True)  # offline: fail at once, no network wait
    monkeypatch.setenv("HF_HOME", "/nonexistent-bertkit-test-cache")
    monkeypatch.setattr(hub.constants, "HF_HUB_CACHE", "/nonexistent-bertkit-test-cache/hub")
    with pytest.raises(MissingFileError, match=r"hf download bertkit-test/no-such-model --local-dir DIR.*not "
                                               r"reachable"):
        BertModel.from_pretrained("bertkit-test/no-such-model")
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # not installed: the same advice, no download
    with pytest.raises(MissingFileError, match="hf download bert-base-uncased"):
        BertConfig.from_pretrained("bert-base-uncased")
    with pytest.raises(MissingFileError, match="does not exist"):
        BertModel.from_pretrained("./no/such/dir")
