"""Bad checkpoints and bad inputs get errors that name the file, the keys and the fix."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from bertkit import BertConfig, BertForSequenceClassification, BertModel
from bertkit.config import encoder_parameter_count

TINY = dict(vocab_size=97, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=24,
            max_position_embeddings=20)


@pytest.fixture()
def saved(tmp_path, tiny_checkpoint):
    return tiny_checkpoint(tmp_path, **TINY)


def test_missing_config(saved):
    (saved / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match="config.json"):
        BertModel.from_pretrained(saved)


def test_missing_weights(saved):
    (saved / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        BertModel.from_pretrained(saved)


def test_truncated_safetensors(saved):
    path = saved / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="truncated or corrupt"):
        BertModel.from_pretrained(saved)


def test_shape_mismatch_lists_keys(saved):
    cfg = json.loads((saved / "config.json").read_text())
    cfg["intermediate_size"] = 32
    (saved / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError) as e:  # a config.json size the weights do not have: named before the model is built
        BertModel.from_pretrained(saved)
    assert ("the config does not match the weights: intermediate_size is 32 but the weights have 24 "
            "(encoder.layer.0.intermediate.dense.weight (24, 16))") in str(e.value)
    cfg["intermediate_size"] = 24
    (saved / "config.json").write_text(json.dumps(cfg))
    state = load_file(saved / "model.safetensors")  # tensors whose shapes no config size explains: every one listed
    state["encoder.layer.0.output.dense.weight"] = torch.zeros(16, 32)
    state["encoder.layer.1.output.dense.weight"] = torch.zeros(16, 32)
    save_file(state, saved / "model.safetensors")
    with pytest.raises(ValueError) as e:
        BertModel.from_pretrained(saved)
    msg = str(e.value)
    assert "encoder.layer.0.output.dense.weight: file (16, 32), model (16, 24)" in msg
    assert "encoder.layer.1.output.dense.weight" in msg


def test_missing_and_unexpected_keys_listed(saved):
    state = load_file(saved / "model.safetensors")
    del state["encoder.layer.1.attention.self.key.weight"]
    state["encoder.layer.1.attention.self.rotary.weight"] = torch.zeros(2)
    save_file(state, saved / "model.safetensors")
    with pytest.raises(ValueError) as e:
        BertModel.from_pretrained(saved)
    assert "missing keys: ['encoder.layer.1.attention.self.key.weight']" in str(e.value)
    assert "unexpected keys: ['encoder.layer.1.attention.self.rotary.weight']" in str(e.value)


@pytest.mark.parametrize("stored, other", [
    ("embeddings.word_embeddings.weight", "bert.embeddings.word_embeddings.weight"),  # with and without the prefix
    ("encoder.layer.0.output.LayerNorm.weight", "encoder.layer.0.output.LayerNorm.gamma"),  # and its TF-era name
])
def test_two_tensors_for_one_weight_are_refused_naming_both(saved, stored, other):
    """A file holding one weight under two of its published names, with different values: loading kept whichever came
    last in name order, where transformers may take the other, so the two
    libraries computed different numbers from one file without a word. Refused now, naming both; the same values
    under both names (an exported copy) load as before."""
    state = load_file(saved / "model.safetensors")
    state[other] = state[stored] + 1.0
    save_file(state, saved / "model.safetensors")
    with pytest.raises(ValueError) as e:
        BertModel.from_pretrained(saved)
    first, second = sorted((stored, other))  # in the file's order, safetensors' sorted names
    assert f"{saved}: {first} and {second} hold different values for one weight" in str(e.value), str(e.value)
    state[other] = state[stored].clone()
    save_file(state, saved / "model.safetensors")
    model = BertModel.from_pretrained(saved)
    torch.testing.assert_close(model.state_dict()[stored], state[stored], rtol=0, atol=0)


def test_a_stray_layer_tensor_is_named_with_advice_that_loads(saved):
    """Was: one tensor of a layer 3 in a 2-layer checkpoint got "num_hidden_layers is 2 but the weights have 4: fix
    config.json", advice that fails next on the missing layer 2 and the rest of layer 3."""
    clean = load_file(saved / "model.safetensors")
    state = dict(clean, **{"encoder.layer.3.output.dense.weight": torch.zeros(16, 24)})
    save_file(state, saved / "model.safetensors")
    with pytest.raises(ValueError) as e:
        BertModel.from_pretrained(saved)
    assert str(e.value) == (
        f"{saved}: the weights hold layers 0 to 1 whole, as config.json's num_hidden_layers 2 says, and stray tensors "
        "beyond them (layer 3: 1 of its 16 tensors): encoder.layer.3.output.dense.weight. Raising num_hidden_layers "
        "does not load them: 4 would leave layer 2 missing and layer 3 incomplete. Remove the stray tensors from the "
        "weights file (a 2-layer model never writes them), or pair the weights with the config.json they were saved "
        "with")
    whole = {k.replace("layer.1.", "layer.3.").replace("encoder.", "bert.encoder."): v.clone()  # a head's names
             for k, v in clean.items() if "layer.1." in k}
    save_file({**clean, **whole}, saved / "model.safetensors")
    with pytest.raises(ValueError, match=r"\(layer 3: whole\): bert\.encoder\.layer\.3\.attention\.output\.LayerNorm"
                                         r"\.bias, .* and 11 more\. Raising num_hidden_layers does not load them: 4 "
                                         r"would leave layer 2 missing\. Remove"):
        BertModel.from_pretrained(saved)
    save_file(clean, saved / "model.safetensors")  # the advice: the stray tensors removed, the checkpoint loads
    assert BertModel.from_pretrained(saved).config.num_hidden_layers == 2
    save_file({**clean, **{k.replace("layer.1.", "layer.2."): v.clone() for k, v in clean.items() if "layer.1." in k}},
              saved / "model.safetensors")  # layers 0 to 2 whole: the count is the weights', and said so
    with pytest.raises(ValueError, match=r"num_hidden_layers is 2 but the weights have 3 \(encoder\.layer\.0 to 2\)"):
        BertModel.from_pretrained(saved)


def test_a_head_is_its_modules_and_only_other_modules_weights_are_dropped(tmp_path, caplog):
    """A head's checkpoint keys are its modules' names (no table lists them): a key of a module the model does
    not have is another head's and is dropped with a log line; a key inside one of the model's own modules that
    the module lacks, or a key under no module at all, is unexpected."""
    from bertkit import BertForMaskedLM, BertForPreTraining

    pre = BertForPreTraining(BertConfig(**TINY))
    weights = pre.published_state_dict()
    assert [k for k in weights if not k.startswith("bert.")] == [
        "cls.predictions.bias", "cls.predictions.transform.dense.weight", "cls.predictions.transform.dense.bias",
        "cls.predictions.transform.LayerNorm.weight", "cls.predictions.transform.LayerNorm.bias",
        "cls.seq_relationship.weight", "cls.seq_relationship.bias"]
    with caplog.at_level("INFO", logger="bertkit"):
        mlm = BertForMaskedLM.from_pretrained(None, config=pre.config, state_dict=weights)
    assert "ignored weights of heads this model does not have: bert.pooler.dense.bias, bert.pooler.dense.weight, " \
           "cls.seq_relationship.bias, cls.seq_relationship.weight" in caplog.text
    torch.testing.assert_close(mlm.cls.predictions.bias, pre.cls.predictions.bias, rtol=0, atol=0)
    for key in ("cls.predictions.transform.rotary", "classifier_typo"):
        with pytest.raises(ValueError, match=rf"unexpected keys: \['{key}'\]"):
            BertForMaskedLM.from_pretrained(None, config=pre.config, state_dict={**weights, key: torch.zeros(2)})


def test_wrong_num_labels_is_named(tmp_path, tiny_checkpoint):
    tiny_checkpoint(tmp_path, "BertForSequenceClassification", labels=3, **TINY)
    with pytest.raises(ValueError, match=r"classifier.weight: file \(3, 16\), model \(5, 16\).*num_labels=5"):
        BertForSequenceClassification.from_pretrained(tmp_path, num_labels=5)
    m = BertForSequenceClassification.from_pretrained(tmp_path)
    assert m.config.id2label == {0: "LABEL_0", 1: "LABEL_1", 2: "LABEL_2"}


def test_input_longer_than_positions(tiny_model):
    model = tiny_model(**TINY)
    with pytest.raises(ValueError, match="sequence length 21 exceeds max_position_embeddings 20"):
        model(torch.ones(1, 21, dtype=torch.long))


def test_config_validation_names_field_and_value():
    with pytest.raises(ValueError, match="hidden_size 100 is not divisible by num_attention_heads 12"):
        BertConfig(hidden_size=100)
    with pytest.raises(ValueError, match="hidden_act 'gelu_10'"):
        BertConfig(hidden_act="gelu_10")
    with pytest.raises(ValueError, match="hidden_dropout_prob must be in \\[0, 1\\), got 1.5"):
        BertConfig(hidden_dropout_prob=1.5)
    with pytest.raises(ValueError, match="unknown preset 'huge'"):
        BertConfig.preset("huge")
    # transformers' decoder switches: its BertModel then masks attention causally; ignoring them changed the outputs
    with pytest.raises(ValueError, match="is_decoder=true: BERT as a decoder .* is not implemented"):
        BertConfig.from_dict({**TINY, "is_decoder": True})
    with pytest.raises(ValueError, match="add_cross_attention=true"):
        BertConfig.from_dict({**TINY, "add_cross_attention": True})
    assert BertConfig.from_dict({**TINY, "is_decoder": False}).extra == {"is_decoder": False}


def test_config_json_round_trip_keeps_unknown_keys(tmp_path):
    data = {**TINY, "hidden_act": "gelu", "transformers_version": "4.8.2", "_name_or_path": "x",
            "id2label": {"0": "neg", "1": "pos"}}
    cfg = BertConfig.from_dict(data)
    assert cfg.id2label == {0: "neg", 1: "pos"} and cfg.num_labels == 2
    out = cfg.to_dict()
    assert out["transformers_version"] == "4.8.2" and out["label2id"] == {"neg": 0, "pos": 1}
    assert BertConfig.from_dict(out) == cfg


@pytest.mark.parametrize("name,params", [("base", 110), ("large", 340)])
def test_paper_parameter_counts(name, params):
    """The paper's BERT-BASE has 110M parameters and BERT-LARGE 340M (section 3)."""
    cfg = BertConfig.preset(name)
    count = encoder_parameter_count(cfg)
    assert abs(count / 1e6 - params) / params < 0.02, count
    with torch.device("meta"):  # the real model's modules, without memory or initialisation
        assert BertModel(cfg).num_parameters() == count  # the closed form counts what the model holds


def _shard(directory, weights_name: str, save) -> dict[str, torch.Tensor]:
    """Rewrite ``directory``'s model.safetensors as two shards and the index transformers' save_pretrained(
    max_shard_size=...) writes beside them; returns the state dict."""
    state = load_file(directory / "model.safetensors")
    (directory / "model.safetensors").unlink()
    stem, ext = weights_name.rsplit(".", 1)
    names = sorted(state)
    files = [f"{stem}-0000{i}-of-00002.{ext}" for i in (1, 2)]
    halves = (names[: len(names) // 2], names[len(names) // 2:])
    for file, keys in zip(files, halves):
        save({k: state[k] for k in keys}, directory / file)
    index = {"metadata": {"total_size": 0}, "weight_map": {k: f for f, keys in zip(files, halves) for k in keys}}
    (directory / f"{weights_name}.index.json").write_text(json.dumps(index))
    return state


@pytest.mark.parametrize("weights_name, save", [("model.safetensors", lambda d, p: save_file(d, p)),
                                                 ("pytorch_model.bin", lambda d, p: torch.save(d, p))],
                         ids=["safetensors", "pickle"])
def test_a_sharded_checkpoint_loads_every_shard_and_refuses_a_missing_one(saved, weights_name, save):
    whole = BertModel.from_pretrained(saved)
    state = _shard(saved, weights_name, save)
    sharded = BertModel.from_pretrained(saved)
    for name, tensor in whole.state_dict().items():
        assert torch.equal(sharded.state_dict()[name], tensor), name
    assert set(state) <= set(sharded.state_dict())

    index = saved / f"{weights_name}.index.json"
    data = json.loads(index.read_text())
    data["weight_map"]["encoder.layer.9.output.dense.bias"] = next(iter(data["weight_map"].values()))
    index.write_text(json.dumps(data))  # a tensor the index lists and no shard holds: a damaged checkpoint
    with pytest.raises(ValueError, match=r"lists 1 tensors that none of its shards holds \(encoder.layer.9"):
        BertModel.from_pretrained(saved)
    data["weight_map"]["encoder.layer.9.output.dense.bias"] = "../elsewhere.bin"
    index.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=r"shard files outside its directory \(\['../elsewhere.bin'\]\)"):
        BertModel.from_pretrained(saved)
    del data["weight_map"]["encoder.layer.9.output.dense.bias"]
    index.write_text(json.dumps(data))
    second = sorted(set(data["weight_map"].values()))[1]
    (saved / second).unlink()  # a partial download: refused by the shard's name, not loaded with layers missing
    with pytest.raises(FileNotFoundError, match=rf"lists 2 shard files and 1 are not in .*\({second}\)"):
        BertModel.from_pretrained(saved)


@pytest.mark.parametrize("layout, resume", [("HF_LAYOUT", "trainer.train(resume_from_checkpoint=True)"),
                                            ("STEP_LAYOUT", "--resume")])
def test_a_refused_checkpoint_write_names_the_resume_of_the_run_that_wrote_it(tmp_path, monkeypatch, layout, resume):
    """Was: bertkit.Trainer's checkpoint refused by a full disk said "... free some space and run again with
    --resume", a flag a Python script has none of: its way is train(resume_from_checkpoint=True)."""
    import errno
    import os

    from bertkit.training import checkpoint

    def refused(obj, path, *args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(checkpoint.torch, "save", refused)
    with pytest.raises(ValueError) as info:
        checkpoint.save_checkpoint(tmp_path, {"model": {"w": torch.zeros(4)}}, 4, keep=2,
                                   layout=getattr(checkpoint, layout))
    assert str(info.value).endswith(f"free some space and run again with {resume}"), str(info.value)


def test_use_safetensors_picks_the_kind_of_file_as_transformers(saved):
    # A directory holding both kinds, with other values in the pickle: transformers reads safetensors for None and
    # True and the pickle for False; a kind that is absent is an error in both.
    import transformers

    weights = load_file(saved / "model.safetensors")
    torch.save({k: v + 1.0 for k, v in weights.items()}, saved / "pytorch_model.bin")
    ids = torch.tensor([[2, 7, 11, 3]])
    for choice in (None, True, False):
        ours = BertModel.from_pretrained(saved, use_safetensors=choice)
        theirs = transformers.BertModel.from_pretrained(saved, use_safetensors=choice)
        torch.testing.assert_close(ours(ids).last_hidden_state, theirs(ids).last_hidden_state, rtol=1e-5, atol=1e-5)
    with_pickle = BertModel.from_pretrained(saved, use_safetensors=False)
    assert torch.equal(with_pickle.embeddings.word_embeddings.weight,
                       weights["embeddings.word_embeddings.weight"] + 1.0)
    (saved / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="use_safetensors=True and .* holds no model.safetensors"):
        BertModel.from_pretrained(saved, use_safetensors=True)
    with pytest.raises(ValueError, match="use_safetensors='yes'"):
        BertModel.from_pretrained(saved, use_safetensors="yes")
