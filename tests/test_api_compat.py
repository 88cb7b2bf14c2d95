"""The calls people port from transformers: strict keyword arguments, dtype/device on load, hub ids,
BertConfig.from_pretrained, input embeddings, and transformers' own state dicts through the key table."""

from __future__ import annotations

import pytest
import torch

from bertkit import BertConfig, BertModel, BertTokenizer
from bertkit.errors import BertkitError, MissingFileError
from bertkit.heads import BertForSequenceClassification

transformers = pytest.importorskip("transformers")

SENTENCES = ["The cat sat on the mat.", "Paris is the capital of France, and its largest city.",
             "A gripping, beautifully acted film."]


def test_unknown_keyword_arguments_are_an_error_naming_them(minilm_dir):
    with pytest.raises(BertkitError, match=r"unknown keyword argument num_label: not a BertConfig field"):
        BertForSequenceClassification.from_pretrained(minilm_dir, num_label=3)
    model = BertForSequenceClassification.from_pretrained(minilm_dir, num_labels=3, hidden_dropout_prob=0.2)
    assert model.config.num_labels == 3 and model.config.hidden_dropout_prob == 0.2


def test_dtype_device_and_config_from_pretrained(minilm_dir):
    model = BertModel.from_pretrained(minilm_dir, dtype="bfloat16", device="cpu")
    assert model.dtype == torch.bfloat16 and model.device == torch.device("cpu")
    assert BertModel.from_pretrained(minilm_dir, dtype=torch.float16).dtype == torch.float16
    with pytest.raises(BertkitError, match="dtype .int8. is not a torch floating-point dtype"):
        BertModel.from_pretrained(minilm_dir, dtype="int8")
    ours, theirs = BertConfig.from_pretrained(minilm_dir), transformers.BertConfig.from_pretrained(minilm_dir)
    for name in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size",
                 "max_position_embeddings", "layer_norm_eps"):
        assert getattr(ours, name) == getattr(theirs, name), name


def test_a_hub_id_says_how_to_get_the_files(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # an empty cache
    with pytest.raises(MissingFileError, match=r"hf download bert-base-uncased --local-dir"):
        BertModel.from_pretrained("bert-base-uncased")
    with pytest.raises(MissingFileError, match=r"google/bert_uncased_L-2_H-128_A-2"):
        BertModel.from_pretrained("google/bert_uncased_L-2_H-128_A-2")
    with pytest.raises(MissingFileError, match=r"checkpoint directory runs/x/final does not exist"):
        BertModel.from_pretrained("runs/x/final")


def test_input_embeddings_and_a_transformers_state_dict_through_the_key_table(minilm_dir):
    hf = transformers.BertModel.from_pretrained(minilm_dir).eval()
    ours = BertModel(BertConfig.from_pretrained(minilm_dir)).eval()
    ours.load_published_state_dict(hf.state_dict(), source="transformers BertModel")
    assert torch.equal(ours.get_input_embeddings().weight, hf.get_input_embeddings().weight)
    tok = BertTokenizer.from_pretrained(minilm_dir)
    batch = tok(SENTENCES, padding=True, return_tensors="pt")
    with torch.no_grad():
        a = ours(**batch).last_hidden_state
        b = hf(**batch).last_hidden_state
    mask = batch["attention_mask"].bool()
    assert (a[mask] - b[mask]).abs().max().item() < 1e-5
    wider = torch.nn.Embedding(10, 384)
    with pytest.raises(BertkitError, match="embeddings have dim 32, the model hidden_size 384"):
        ours.set_input_embeddings(torch.nn.Embedding(10, 32))
    ours.set_input_embeddings(wider)
    assert ours.get_input_embeddings() is wider and ours.config.vocab_size == 10


def test_outputs_index_like_transformers(minilm_dir):
    """out[0], out["logits"], out.to_tuple(): transformers' fields and order, None fields left out."""
    tok = BertTokenizer.from_pretrained(minilm_dir)
    batch = tok(SENTENCES, padding=True, return_tensors="pt")
    torch.manual_seed(0)
    ours = BertForSequenceClassification.from_pretrained(minilm_dir, num_labels=2).eval()
    hf = transformers.BertForSequenceClassification.from_pretrained(minilm_dir, num_labels=2).eval()
    hf.classifier.load_state_dict(ours.classifier.state_dict())
    labels = torch.tensor([0, 1, 1])
    with torch.no_grad():
        a, b = ours(**batch, labels=labels), hf(**batch, labels=labels)
        enc_a, enc_b = ours.bert(**batch), hf.bert(**batch)
    assert len(a.to_tuple()) == len(b.to_tuple()) == 2
    assert torch.allclose(a[0], b[0], atol=1e-5) and torch.allclose(a[1], b[1], atol=1e-5)
    assert torch.equal(a["logits"], a.logits)
    mask = batch["attention_mask"].bool()
    assert (enc_a[0][mask] - enc_b[0][mask]).abs().max() < 1e-5 and torch.allclose(enc_a[1], enc_b[1], atol=1e-5)
    assert list(enc_a) == list(enc_b) == ["last_hidden_state", "pooler_output"]  # iteration: keys, as a dict
    with pytest.raises(KeyError, match="this output has"):
        a["start_logits"]


def test_gradient_checkpointing_enable_keeps_the_attention_gradients(minilm_dir):
    """Layer 0's attention projection gets the same gradient with and without gradient checkpointing, and it is
    transformers' query, key and value gradients stacked as the key table stacks their weights (fused q/k/v)."""
    tok = BertTokenizer.from_pretrained(minilm_dir)
    batch = tok(SENTENCES, padding=True, return_tensors="pt")
    labels = torch.tensor([0, 1, 1])
    no_dropout = dict(num_labels=2, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    grads = []
    for enable in (False, True):
        model = BertForSequenceClassification.from_pretrained(minilm_dir, **no_dropout)
        torch.manual_seed(0)
        model.classifier.reset_parameters()
        if enable:
            model.gradient_checkpointing_enable()
        model.train()
        model(**batch, labels=labels).loss.backward()
        attention = model.bert.encoder.layer[0].attention.self
        grads.append(torch.cat([attention.query.weight.grad, attention.key.weight.grad, attention.value.weight.grad]))
    assert model.bert.gradient_checkpointing
    assert grads[0].abs().max() > 0
    torch.testing.assert_close(grads[1], grads[0], atol=1e-6, rtol=1e-5)

    hf = transformers.BertForSequenceClassification.from_pretrained(minilm_dir, **no_dropout)
    hf.classifier.load_state_dict(model.classifier.state_dict())
    hf.train()
    hf(**batch, labels=labels).loss.backward()
    attention = hf.bert.encoder.layer[0].attention.self
    theirs = torch.cat([attention.query.weight.grad, attention.key.weight.grad, attention.value.weight.grad])
    torch.testing.assert_close(grads[0], theirs, atol=1e-6, rtol=1e-4)
