"""The same user code against transformers and bertkit: the model side of the contract.

Each test runs code as transformers' documentation writes it, once with ``transformers`` and once with
``bertkit`` (MiniLM, a real 6-layer BERT checkpoint, in both), and compares what the user gets. The
silent differences come first: each of those failed on the code before it was fixed.
"""

from __future__ import annotations

import json

import pytest
import torch

import bertkit
from bertkit.errors import BertkitError

transformers = pytest.importorskip("transformers")
TEXTS = ["The lobster is blue until it is cooked.", "Paris is the capital of France, and a large city."]
ATOL = 1e-5


@pytest.fixture(scope="module")
def batch(minilm_dir):
    tok = transformers.BertTokenizerFast.from_pretrained(minilm_dir)
    return tok(TEXTS, padding=True, return_tensors="pt")


def _close(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor | None = None) -> None:
    if mask is not None:  # bertkit leaves zeros at padding positions of hidden states
        a, b = a[mask.bool()], b[mask.bool()]
    torch.testing.assert_close(a, b, atol=ATOL, rtol=0)


# ---- silent differences -------------------------------------------------------------------------------------


def test_from_pretrained_returns_eval_mode_so_model_card_code_is_deterministic(minilm_dir, batch):
    ours, theirs = bertkit.BertModel.from_pretrained(minilm_dir), transformers.BertModel.from_pretrained(minilm_dir)
    assert ours.training is theirs.training is False
    with torch.no_grad():  # no .eval(): as model cards write it
        a, b = ours(**batch).last_hidden_state, theirs(**batch).last_hidden_state
    _close(a, b, batch["attention_mask"])


@pytest.mark.parametrize("name", ["BertModel", "BertForSequenceClassification", "BertForTokenClassification",
                                  "BertForQuestionAnswering", "BertForMaskedLM", "BertForPreTraining",
                                  "BertForNextSentencePrediction"])
def test_positional_arguments_mean_what_they_mean_in_transformers(minilm_dir, batch, name):
    torch.manual_seed(0)
    theirs = getattr(transformers, name).from_pretrained(minilm_dir)
    ours = getattr(bertkit, name).from_pretrained(None, config=bertkit.BertConfig.from_pretrained(minilm_dir),
                                                  state_dict=theirs.state_dict())
    ids, mask = batch["input_ids"], batch["attention_mask"]
    positions = torch.arange(ids.shape[1]).flip(0).unsqueeze(0)  # not the default: must reach the embeddings
    with torch.no_grad():
        for args in ((ids, mask), (ids, mask, batch["token_type_ids"]), (ids, mask, None, positions)):
            a, b = ours(*args), theirs(*args)
            per_token = a[0].dim() >= 2 and a[0].shape[:2] == mask.shape  # padding positions differ by design
            _close(a[0], b[0], mask if per_token else None)


def test_output_switches_set_on_the_config_are_honoured(minilm_dir, batch):
    ours = bertkit.BertModel.from_pretrained(minilm_dir)
    theirs = transformers.BertModel.from_pretrained(minilm_dir, attn_implementation="eager")  # its attentions need it
    for model in (ours, theirs):
        model.config.output_hidden_states = True
        model.config.output_attentions = True
    with torch.no_grad():
        a, b = ours(**batch), theirs(**batch)
    assert len(a.hidden_states) == len(b.hidden_states) == 7 and len(a.attentions) == len(b.attentions) == 6
    _close(a.attentions[2], b.attentions[2])
    _close(a.hidden_states[3], b.hidden_states[3], batch["attention_mask"])
    with torch.no_grad():
        a, b = ours(**batch, output_hidden_states=False, output_attentions=False), theirs(
            **batch, output_hidden_states=False, output_attentions=False)
    assert a.hidden_states is None and b.hidden_states is None and a.attentions is None


def test_config_return_dict_false_gives_tuples(minilm_dir, batch):
    ours = bertkit.BertForSequenceClassification.from_pretrained(minilm_dir, return_dict=False)
    theirs = transformers.BertForSequenceClassification.from_pretrained(minilm_dir, return_dict=False)
    ours.classifier.load_state_dict(theirs.classifier.state_dict())
    with torch.no_grad():
        a, b = ours(**batch), theirs(**batch)
    assert isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b) == 1
    _close(a[0], b[0])


def test_word_embeddings_padding_idx_is_the_pad_token(minilm_dir):
    ours, theirs = bertkit.BertModel.from_pretrained(minilm_dir), transformers.BertModel.from_pretrained(minilm_dir)
    assert ours.embeddings.word_embeddings.padding_idx == theirs.embeddings.word_embeddings.padding_idx == 0
    fresh = bertkit.BertModel(bertkit.BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                                 intermediate_size=64, vocab_size=50))
    assert float(fresh.embeddings.word_embeddings.weight[0].detach().abs().max()) == 0.0  # starts at zero, as transformers


# ---- the names people type ----------------------------------------------------------------------------------


@pytest.mark.parametrize("auto", ["AutoModel", "AutoModelForSequenceClassification", "AutoModelForTokenClassification",
                                  "AutoModelForQuestionAnswering", "AutoModelForMaskedLM",
                                  "AutoModelForMultipleChoice", "AutoModelForPreTraining"])
def test_auto_classes_resolve_bert_checkpoints(minilm_dir, auto):
    ours, theirs = getattr(bertkit, auto).from_pretrained(minilm_dir), getattr(transformers, auto).from_pretrained(minilm_dir)
    assert type(ours).__name__ == type(theirs).__name__
    assert ours.num_parameters() == theirs.num_parameters()
    assert bertkit.AutoConfig.from_pretrained(minilm_dir).to_dict()["hidden_size"] == 384


def test_auto_classes_refuse_another_model_type_naming_it(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "roberta", "hidden_size": 8}))
    for auto in (bertkit.AutoConfig, bertkit.AutoModel, bertkit.AutoModelForMaskedLM):
        with pytest.raises(BertkitError, match="'roberta' checkpoint.*BERT"):
            auto.from_pretrained(tmp_path)


def test_from_pretrained_keywords(minilm_dir, batch, tmp_path):
    kw = dict(num_labels=3, id2label={0: "neg", 1: "neu", 2: "pos"}, label2id={"neg": 0, "neu": 1, "pos": 2},
              problem_type="single_label_classification", output_hidden_states=True)
    ours = bertkit.BertForSequenceClassification.from_pretrained(minilm_dir, **kw)
    theirs = transformers.BertForSequenceClassification.from_pretrained(minilm_dir, **kw)
    assert ours.config.id2label == theirs.config.id2label and ours.config.label2id == theirs.config.label2id
    assert ours.config.problem_type == theirs.config.problem_type and ours.config.output_hidden_states
    with torch.no_grad():
        assert len(ours(**batch).hidden_states) == len(theirs(**batch).hidden_states)
    # config= as transformers passes it
    config = bertkit.AutoConfig.from_pretrained(minilm_dir, num_labels=4)
    assert bertkit.BertForSequenceClassification.from_pretrained(minilm_dir, config=config).classifier.out_features == 4
    # add_pooling_layer
    bare, hf_bare = (bertkit.BertModel.from_pretrained(minilm_dir, add_pooling_layer=False),
                     transformers.BertModel.from_pretrained(minilm_dir, add_pooling_layer=False))
    with torch.no_grad():
        assert bare(**batch).pooler_output is None and hf_bare(**batch).pooler_output is None
    # attn_implementation: eager computes the same; an unavailable one is refused, naming both values
    eager = bertkit.BertModel.from_pretrained(minilm_dir, attn_implementation="eager")
    hf_eager = transformers.BertModel.from_pretrained(minilm_dir, attn_implementation="eager")
    with torch.no_grad():
        _close(eager(**batch).last_hidden_state, hf_eager(**batch).last_hidden_state, batch["attention_mask"])
    with pytest.raises(BertkitError, match="'sdpa'.*'eager'"):
        bertkit.BertModel.from_pretrained(minilm_dir, attn_implementation="flash_attention_2")


def test_ignore_mismatched_sizes_reinitialises_the_head_and_lists_it(minilm_dir, tmp_path, caplog):
    three = tmp_path / "three"
    bertkit.BertForSequenceClassification.from_pretrained(minilm_dir, num_labels=3).save_pretrained(three)
    with pytest.raises(BertkitError, match="classifier.weight.*ignore_mismatched_sizes=True"):
        bertkit.BertForSequenceClassification.from_pretrained(three, num_labels=5)
    with pytest.raises((RuntimeError, ValueError)):  # transformers refuses too
        transformers.BertForSequenceClassification.from_pretrained(three, num_labels=5)
    ours = bertkit.BertForSequenceClassification.from_pretrained(three, num_labels=5, ignore_mismatched_sizes=True)
    theirs = transformers.BertForSequenceClassification.from_pretrained(three, num_labels=5,
                                                                        ignore_mismatched_sizes=True)
    assert ours.classifier.out_features == theirs.classifier.out_features == 5
    assert "classifier.weight" in caplog.text


# ---- objects and outputs ------------------------------------------------------------------------------------


def test_outputs_behave_as_mappings(minilm_dir, batch):
    ours, theirs = bertkit.BertModel.from_pretrained(minilm_dir), transformers.BertModel.from_pretrained(minilm_dir)
    with torch.no_grad():
        a, b = ours(**batch), theirs(**batch)
    assert list(a.keys()) == list(b.keys()) == ["last_hidden_state", "pooler_output"]
    assert [k for k, _ in a.items()] == [k for k, _ in b.items()]
    _close(list(a.values())[1], list(b.values())[1])
    assert "pooler_output" in a and "pooler_output" in b and "attentions" not in a


def test_masked_lm_without_labels_gives_logits_for_every_position(minilm_dir, batch):
    theirs = transformers.BertForMaskedLM.from_pretrained(minilm_dir)  # MiniLM has no MLM head: theirs is fresh
    ours = bertkit.BertForMaskedLM.from_pretrained(None, config=bertkit.BertConfig.from_pretrained(minilm_dir),
                                                   state_dict=theirs.state_dict())
    with torch.no_grad():
        a, b = ours(**batch), theirs(**batch)
    assert a.logits.shape == b.logits.shape == (*batch["input_ids"].shape, 30522)
    _close(a.logits, b.logits, batch["attention_mask"])


def test_model_objects(minilm_dir):
    ours = bertkit.BertForMaskedLM.from_pretrained(minilm_dir)
    theirs = transformers.BertForMaskedLM.from_pretrained(minilm_dir)
    assert type(ours.base_model).__name__ == type(theirs.base_model).__name__ == "BertModel"
    for model in (ours, theirs):  # the freeze-lower-layers recipe
        for layer in model.bert.encoder.layer[:3]:
            for p in layer.parameters():
                p.requires_grad = False
    assert ours.num_parameters(only_trainable=True) == theirs.num_parameters(only_trainable=True)
    assert ours.num_parameters() == theirs.num_parameters()
    assert ours.num_parameters(only_trainable=True) < ours.num_parameters()
    # the tied decoder, visible: the output embedding's weight *is* the input embedding's
    assert ours.get_output_embeddings().weight is ours.get_input_embeddings().weight
    assert theirs.get_output_embeddings().weight is theirs.get_input_embeddings().weight
    assert ours.get_output_embeddings().weight.shape == theirs.get_output_embeddings().weight.shape
    assert bertkit.BertForSequenceClassification.from_pretrained(minilm_dir).get_output_embeddings() is None


def test_state_dicts_cross_both_ways_with_strict_loading(minilm_dir, batch):
    theirs = transformers.BertForSequenceClassification.from_pretrained(minilm_dir, num_labels=3)
    config = bertkit.BertConfig.from_pretrained(minilm_dir, num_labels=3)
    ours = bertkit.BertForSequenceClassification(config).eval()
    ours.load_state_dict(theirs.state_dict(), strict=True)  # transformers' keys, strict
    with torch.no_grad():
        _close(ours(**batch).logits, theirs(**batch).logits)
    back = transformers.BertForSequenceClassification(transformers.BertConfig.from_pretrained(minilm_dir, num_labels=3))
    back.load_state_dict(ours.published_state_dict(), strict=True)  # bertkit -> transformers' keys, strict
    with torch.no_grad():
        _close(back.eval()(**batch).logits, ours(**batch).logits)
    # the two conversions are inverse: q/k/v split and fused back
    again = ours.convert_published_state_dict(ours.published_state_dict())
    assert again.keys() == ours.state_dict().keys()
    assert all(torch.equal(again[k], v) for k, v in ours.state_dict().items())
    with pytest.raises(RuntimeError, match="Unexpected key"):
        ours.load_state_dict({**theirs.state_dict(), "bert.extra.weight": torch.zeros(1)}, strict=True)


def test_config_like_transformers(tmp_path):
    ours, theirs = bertkit.BertConfig(num_labels=3), transformers.BertConfig(num_labels=3)
    assert ours.id2label == theirs.id2label and ours.num_labels == theirs.num_labels == 3
    assert bertkit.BertConfig().id2label == transformers.BertConfig().id2label == {0: "LABEL_0", 1: "LABEL_1"}
    ours.num_labels, theirs.num_labels = 5, 5
    assert ours.id2label == theirs.id2label
    assert ours.model_type == theirs.model_type == "bert"
    assert ours.output_hidden_states is theirs.output_hidden_states is False
    assert ours.output_attentions is theirs.output_attentions is False
    assert json.loads(ours.to_json_string())["model_type"] == "bert" and ours.to_dict()["num_attention_heads"] == 12
    ours.save_pretrained(tmp_path / "cfg")
    assert transformers.BertConfig.from_pretrained(tmp_path / "cfg").id2label == ours.id2label
