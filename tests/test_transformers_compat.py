"""The same user code against transformers and bertkit: the model side of the compatibility contract.

Two kinds of check, side by side for each topic:

- code as transformers' documentation writes it, run once with ``transformers`` and once with ``bertkit`` on the
  real MiniLM checkpoint (a 6-layer BERT) in both, comparing what the user gets;
- tiny random models (``TINY``) built with transformers and loaded into bertkit with the same weights, for the
  calls whose numbers a real checkpoint would not change (attentions, tuple access, embeddings, resizing).

The silent differences come first: each of those failed on the code before it was fixed.
"""

from __future__ import annotations

import copy
import json
import re
import shutil
import sys

import pytest
import torch

import bertkit
import bertkit.heads as H
from bertkit import BertConfig, BertModel, BertTokenizer
from bertkit.errors import BertkitError, MissingFileError

transformers = pytest.importorskip("transformers")

TEXTS = ["The lobster is blue until it is cooked.", "Paris is the capital of France, and a large city."]
SENTENCES = ["The cat sat on the mat.", "Paris is the capital of France, and its largest city.",
             "A gripping, beautifully acted film."]
ATOL = 1e-5
TOL = dict(atol=1e-5, rtol=0)
TINY = dict(vocab_size=211, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
            max_position_embeddings=40, type_vocab_size=2, hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0)


@pytest.fixture(scope="module")
def batch(minilm_dir):
    """``TEXTS`` through transformers' fast tokenizer, padded."""
    tok = transformers.BertTokenizerFast.from_pretrained(minilm_dir)
    return tok(TEXTS, padding=True, return_tensors="pt")


@pytest.fixture(scope="module")
def small_batch(minilm_2_layers):
    """``TEXTS`` through the fast tokenizer of MiniLM's first 2 layers (``minilm_2_layers``), padded: for the checks
    of what arguments and keys mean, which hold at any depth and vocabulary."""
    tok = transformers.BertTokenizerFast.from_pretrained(minilm_2_layers)
    return tok(TEXTS, padding=True, return_tensors="pt")


def _close(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor | None = None) -> None:
    if mask is not None:  # bertkit leaves zeros at padding positions of hidden states
        a, b = a[mask.bool()], b[mask.bool()]
    # torch's own float32 tolerance: an MLM logit of magnitude 2.5 may differ by 1.03e-05 where the attention kernel
    # sums in another order (keys rounded up to its vector width in inference)
    torch.testing.assert_close(a, b, atol=ATOL, rtol=1.3e-6)


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


# ---- silent differences: code that runs on both and must give the same numbers ---------------------------------


def test_from_pretrained_returns_eval_mode_so_model_card_code_is_deterministic(minilm_2_layers, small_batch):
    ours = bertkit.BertModel.from_pretrained(minilm_2_layers)
    theirs = transformers.BertModel.from_pretrained(minilm_2_layers)
    assert ours.training is theirs.training is False
    with torch.no_grad():  # no .eval(): as model cards write it
        a, b = ours(**small_batch).last_hidden_state, theirs(**small_batch).last_hidden_state
    _close(a, b, small_batch["attention_mask"])


def test_one_row_of_position_ids_is_broadcast_as_transformers_does(minilm_2_layers, small_batch):
    # position_ids of shape (T,): transformers broadcasts it over the batch; bertkit refused the shape
    ours = bertkit.BertModel.from_pretrained(minilm_2_layers)
    theirs = transformers.BertModel.from_pretrained(minilm_2_layers)
    positions = torch.arange(small_batch["input_ids"].shape[1]) + 3  # not the default: reaches the embeddings
    with torch.no_grad():
        for layout in ("auto", "padded"):
            ours.layout = layout
            a, b = ours(**small_batch, position_ids=positions), theirs(**small_batch, position_ids=positions)
            _close(a.last_hidden_state, b.last_hidden_state, small_batch["attention_mask"])
            _close(ours(**small_batch, position_ids=positions[None]).last_hidden_state, a.last_hidden_state)


@pytest.mark.parametrize("name", ["BertModel", "BertForSequenceClassification", "BertForTokenClassification",
                                  "BertForQuestionAnswering", "BertForMaskedLM", "BertForPreTraining",
                                  "BertForNextSentencePrediction"])
def test_positional_arguments_mean_what_they_mean_in_transformers(minilm_2_layers, small_batch, name):
    torch.manual_seed(0)
    theirs = getattr(transformers, name).from_pretrained(minilm_2_layers)
    ours = getattr(bertkit, name).from_pretrained(None, config=bertkit.BertConfig.from_pretrained(minilm_2_layers),
                                                  state_dict=theirs.state_dict())
    ids, mask = small_batch["input_ids"], small_batch["attention_mask"]
    positions = torch.arange(ids.shape[1]).flip(0).unsqueeze(0)  # not the default: must reach the embeddings
    with torch.no_grad():
        for args in ((ids, mask), (ids, mask, small_batch["token_type_ids"]), (ids, mask, None, positions)):
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


def test_config_return_dict_false_gives_tuples(minilm_2_layers, small_batch):
    ours = bertkit.BertForSequenceClassification.from_pretrained(minilm_2_layers, return_dict=False)
    theirs = transformers.BertForSequenceClassification.from_pretrained(minilm_2_layers, return_dict=False)
    ours.classifier.load_state_dict(theirs.classifier.state_dict())
    with torch.no_grad():
        a, b = ours(**small_batch), theirs(**small_batch)
    assert isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b) == 1
    _close(a[0], b[0])


def test_word_embeddings_padding_idx_is_the_pad_token(minilm_dir):
    ours, theirs = bertkit.BertModel.from_pretrained(minilm_dir), transformers.BertModel.from_pretrained(minilm_dir)
    assert ours.embeddings.word_embeddings.padding_idx == theirs.embeddings.word_embeddings.padding_idx == 0
    fresh = bertkit.BertModel(bertkit.BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                                 intermediate_size=64, vocab_size=50))
    assert float(fresh.embeddings.word_embeddings.weight[0].detach().abs().max()) == 0.0  # starts at zero, as transformers

# ---- loading: the names and keywords people type, dtype and device, hub ids ------------------------------------


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


def test_labels_named_on_the_config_as_run_glue_names_them():
    configs = bertkit.BertConfig(num_labels=3), transformers.BertConfig(num_labels=3)
    for config in configs:  # run_glue.py, after loading the model with num_labels
        config.label2id = {"neg": 0, "neu": 1, "pos": 2}
        config.id2label = {i: label for label, i in config.label2id.items()}
    ours, theirs = configs
    assert ours.id2label == theirs.id2label == {0: "neg", 1: "neu", 2: "pos"}
    assert ours.label2id == theirs.label2id and ours.num_labels == 3
    for bad in ({"neg": 0, "pos": 0}, {"neg": 1, "pos": 2}, ["neg", "pos"]):
        with pytest.raises(BertkitError, match="label2id must map each label to its own id 0..n-1"):
            ours.label2id = bad
    assert ours.id2label == {0: "neg", 1: "neu", 2: "pos"}


def test_a_one_label_single_label_classifier_is_refused_however_the_label_count_is_given(tiny_checkpoint, tmp_path):
    # a softmax over one label: every loss 0.0; transformers refuses BertConfig(num_labels=1, ...) too
    with pytest.raises(ValueError, match="requires `num_labels > 1`"):
        transformers.BertConfig(num_labels=1, problem_type="single_label_classification")
    for make in (lambda: BertConfig(num_labels=1, problem_type="single_label_classification"),
                 lambda: H.BertForSequenceClassification.from_pretrained(
                     tiny_checkpoint(tmp_path), num_labels=1, problem_type="single_label_classification")):
        with pytest.raises(BertkitError, match="'single_label_classification' needs num_labels > 1, got 1 label"):
            make()


def test_an_empty_id2label_counts_no_labels_as_in_transformers(tiny_checkpoint, tmp_path):
    """``"id2label": {}`` (a backbone's config.json, or ``id2label={}`` passed) is no labels in transformers; bertkit
    counted two, built a 2-output classifier without a word and wrote ``"id2label": {}`` into its config.json, which
    transformers then read as a 0-output head and could not load."""
    ours, theirs = BertConfig(id2label={}), transformers.BertConfig(id2label={})
    assert ours.num_labels == theirs.num_labels == 0
    assert ours.to_dict()["id2label"] == {} and ours.label2id == {}
    directory = tiny_checkpoint(tmp_path)
    assert H.BertModel.from_pretrained(directory, id2label={}).config.num_labels == 0  # no classifier to size
    for head in (H.BertForSequenceClassification, H.BertForTokenClassification):
        with pytest.raises(BertkitError, match=r"config.id2label is empty \(num_labels 0\).*name the labels"):
            head.from_pretrained(directory, id2label={})
        with pytest.raises(BertkitError, match=r"config.id2label is empty"):
            head(BertConfig(**TINY, id2label={}))


def test_from_pretrained_keywords(minilm_2_layers, small_batch, tmp_path):
    kw = dict(num_labels=3, id2label={0: "neg", 1: "neu", 2: "pos"}, label2id={"neg": 0, "neu": 1, "pos": 2},
              problem_type="single_label_classification", output_hidden_states=True)
    ours = bertkit.BertForSequenceClassification.from_pretrained(minilm_2_layers, **kw)
    theirs = transformers.BertForSequenceClassification.from_pretrained(minilm_2_layers, **kw)
    assert ours.config.id2label == theirs.config.id2label and ours.config.label2id == theirs.config.label2id
    assert ours.config.problem_type == theirs.config.problem_type and ours.config.output_hidden_states
    with torch.no_grad():
        assert len(ours(**small_batch).hidden_states) == len(theirs(**small_batch).hidden_states)
    # config= as transformers passes it
    config = bertkit.AutoConfig.from_pretrained(minilm_2_layers, num_labels=4)
    assert bertkit.BertForSequenceClassification.from_pretrained(minilm_2_layers, config=config
                                                                 ).classifier.out_features == 4
    # add_pooling_layer
    bare, hf_bare = (bertkit.BertModel.from_pretrained(minilm_2_layers, add_pooling_layer=False),
                     transformers.BertModel.from_pretrained(minilm_2_layers, add_pooling_layer=False))
    with torch.no_grad():
        assert bare(**small_batch).pooler_output is None and hf_bare(**small_batch).pooler_output is None
    # attn_implementation: eager computes the same; an unavailable one is refused, naming both values
    eager = bertkit.BertModel.from_pretrained(minilm_2_layers, attn_implementation="eager")
    hf_eager = transformers.BertModel.from_pretrained(minilm_2_layers, attn_implementation="eager")
    with torch.no_grad():
        _close(eager(**small_batch).last_hidden_state, hf_eager(**small_batch).last_hidden_state,
               small_batch["attention_mask"])
    with pytest.raises(BertkitError, match="'sdpa'.*'eager'"):
        bertkit.BertModel.from_pretrained(minilm_2_layers, attn_implementation="flash_attention_2")


def test_unknown_keyword_arguments_are_an_error_naming_them(minilm_dir):
    with pytest.raises(BertkitError, match=r"unknown keyword argument num_label: not a BertConfig field"):
        H.BertForSequenceClassification.from_pretrained(minilm_dir, num_label=3)
    model = H.BertForSequenceClassification.from_pretrained(minilm_dir, num_labels=3, hidden_dropout_prob=0.2)
    assert model.config.num_labels == 3 and model.config.hidden_dropout_prob == 0.2
    # the constructor too (it was the dataclass's TypeError, naming no field and no way to keep config.json's keys)
    with pytest.raises(BertkitError, match=r"unknown keyword arguments hidden_szie, use_cache: not a field \(fields: "
                                           r"architectures, .*or num_labels, label2id\); .*BertConfig.from_dict"):
        BertConfig(hidden_szie=8, use_cache=False)


def test_from_pretrained_dtype_device_and_strict_keywords(tmp_path, tiny_checkpoint):
    tiny_checkpoint(tmp_path, **TINY)
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


@pytest.mark.parametrize("key,named,stored", [("torch_dtype", "float32", torch.float16),
                                               ("dtype", "bfloat16", torch.float32)])
def test_dtype_auto_is_transformers_config_json_first(tmp_path, key, named, stored):
    """transformers' dtype="auto" is the one config.json names (``dtype``, ``torch_dtype`` before 4.56), else the
    weights': a checkpoint whose weights were cast after its config was written computes as transformers does."""
    torch.manual_seed(0)
    transformers.BertForMaskedLM(transformers.BertConfig(**TINY)).to(stored).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config.pop("dtype")
    (tmp_path / "config.json").write_text(json.dumps({**config, key: named}))
    theirs = transformers.BertForMaskedLM.from_pretrained(tmp_path, dtype="auto")
    ours = H.BertForMaskedLM.from_pretrained(tmp_path, dtype="auto")
    assert ours.dtype == theirs.dtype == getattr(torch, named)
    ids = torch.randint(1, TINY["vocab_size"], (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids).logits, theirs(ids).logits, atol=1e-5, rtol=0)


@pytest.mark.parametrize("kwargs,dtype", [({"dtype": torch.bfloat16}, torch.bfloat16),
                                          ({"torch_dtype": "float16"}, torch.float16)])
def test_from_config_takes_transformers_dtype(tmp_path, kwargs, dtype):
    """``AutoModelForSequenceClassification.from_config(config, dtype=torch.bfloat16)`` (``torch_dtype=`` before
    transformers 4.56) builds the model in that dtype, as transformers does, and save_pretrained writes it so: bertkit
    passed the keyword to the model class, a TypeError ("unexpected keyword argument 'dtype'")."""
    theirs = transformers.AutoModelForSequenceClassification.from_config(transformers.BertConfig(**TINY), **kwargs)
    ours = bertkit.AutoModelForSequenceClassification.from_config(BertConfig(**TINY), **kwargs)
    assert ours.dtype == theirs.dtype == dtype
    ids = torch.randint(1, TINY["vocab_size"], (2, 9), generator=torch.Generator().manual_seed(0))
    assert ours(ids).logits.dtype == theirs(ids).logits.dtype == dtype
    ours.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["dtype"] == str(dtype).removeprefix("torch.")
    assert transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path).dtype == dtype
    with pytest.raises(BertkitError, match="pass dtype= or torch_dtype="):
        bertkit.AutoModel.from_config(BertConfig(**TINY), dtype="bfloat16", torch_dtype="bfloat16")


def test_a_transformers_config_is_refused_where_it_would_build_another_network(tmp_path):
    """transformers' BertConfig has bertkit's field names, so a model built on it ran, without the checks that
    refuse what bertkit does not implement: is_decoder=True (causal attention in transformers) gave the bidirectional
    encoder's outputs, unannounced."""
    torch.manual_seed(0)
    transformers.BertModel(transformers.BertConfig(**TINY)).save_pretrained(tmp_path)
    decoder = transformers.BertConfig.from_pretrained(tmp_path, is_decoder=True)
    for build in (lambda: BertModel.from_pretrained(tmp_path, config=decoder), lambda: H.BertForMaskedLM(decoder),
                  lambda: bertkit.AutoModel.from_config(decoder)):
        with pytest.raises(BertkitError, match="needs a bertkit BertConfig, got transformers.*BertConfig.from_dict"):
            build()
    with pytest.raises(BertkitError, match="is_decoder=true"):
        BertConfig.from_dict(decoder.to_dict())
    ours = BertModel.from_pretrained(tmp_path, config=BertConfig.from_dict(transformers.BertConfig.from_pretrained(
        tmp_path).to_dict()))
    theirs = transformers.BertModel.from_pretrained(tmp_path).eval()
    ids = torch.randint(1, TINY["vocab_size"], (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids).last_hidden_state, theirs(ids).last_hidden_state, atol=1e-5, rtol=0)


def test_dtype_device_and_config_from_pretrained(minilm_2_layers):
    model = BertModel.from_pretrained(minilm_2_layers, dtype="bfloat16", device="cpu")
    assert model.dtype == torch.bfloat16 and model.device == torch.device("cpu")
    assert BertModel.from_pretrained(minilm_2_layers, dtype=torch.float16).dtype == torch.float16
    with pytest.raises(BertkitError, match="dtype .int8. is not a torch floating-point dtype"):
        BertModel.from_pretrained(minilm_2_layers, dtype="int8")
    ours = BertConfig.from_pretrained(minilm_2_layers)
    theirs = transformers.BertConfig.from_pretrained(minilm_2_layers)
    for name in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size",
                 "max_position_embeddings", "layer_norm_eps"):
        assert getattr(ours, name) == getattr(theirs, name), name


def test_ignore_mismatched_sizes_reinitialises_the_head_and_lists_it(minilm_2_layers, tmp_path, caplog):
    three = tmp_path / "three"
    bertkit.BertForSequenceClassification.from_pretrained(minilm_2_layers, num_labels=3).save_pretrained(three)
    with pytest.raises(BertkitError, match="classifier.weight.*ignore_mismatched_sizes=True"):
        bertkit.BertForSequenceClassification.from_pretrained(three, num_labels=5)
    with pytest.raises((RuntimeError, ValueError)):  # transformers refuses too
        transformers.BertForSequenceClassification.from_pretrained(three, num_labels=5)
    ours = bertkit.BertForSequenceClassification.from_pretrained(three, num_labels=5, ignore_mismatched_sizes=True)
    theirs = transformers.BertForSequenceClassification.from_pretrained(three, num_labels=5,
                                                                        ignore_mismatched_sizes=True)
    assert ours.classifier.out_features == theirs.classifier.out_features == 5
    assert "classifier.weight" in caplog.text


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


def test_hub_id_without_files_says_how_to_get_them(monkeypatch):
    hub = pytest.importorskip("huggingface_hub")
    monkeypatch.setattr(hub.constants, "HF_HUB_OFFLINE", True)  # offline: fail at once, no network wait
    monkeypatch.setenv("HF_HOME", "/nonexistent-bertkit-test-cache")
    monkeypatch.setattr(hub.constants, "HF_HUB_CACHE", "/nonexistent-bertkit-test-cache/hub")
    with pytest.raises(MissingFileError, match=r"hf download bertkit-test/no-such-model --local-dir DIR.*HF_HUB_OFFLINE "
                                               r"is set \(huggingface_hub's offline mode: unset it to download\)"):
        BertModel.from_pretrained("bertkit-test/no-such-model")
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # not installed: the same advice, no download
    with pytest.raises(MissingFileError, match="hf download bert-base-uncased"):
        BertConfig.from_pretrained("bert-base-uncased")
    with pytest.raises(MissingFileError, match="does not exist"):
        BertModel.from_pretrained("./no/such/dir")


def test_a_hub_id_reads_the_caches_main_snapshot_and_refuses_another_revision_before_reading(minilm_2_layers,
                                                                                                tmp_path, monkeypatch):
    """A cache as `hf download` leaves it (snapshots/<commit>/ linking into blobs/, refs/main naming one): the id
    loads refs/main's snapshot, as transformers does. revision= (subfolder=, cache_dir=, ...) at anything but
    transformers' default was refused only after the main snapshot was read, as an unknown config field, so online
    bertkit downloaded the main revision first; now it is refused before, saying how to fetch that revision."""
    hub = pytest.importorskip("huggingface_hub")
    repo = tmp_path / "hub" / "models--org--mini"
    main, other = "a" * 40, "b" * 40
    for commit in (main, other):
        (repo / "snapshots" / commit).mkdir(parents=True)
        for f in minilm_2_layers.iterdir():
            (repo / "blobs").mkdir(exist_ok=True)
            blob = repo / "blobs" / f.name  # (a real blob is named by its hash)
            if not blob.exists():
                blob.write_bytes(f.read_bytes())
            (repo / "snapshots" / commit / f.name).symlink_to(f"../../blobs/{f.name}")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(main)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    ids = torch.tensor([[101, 7592, 2088, 102]])
    with torch.no_grad():
        ours = BertModel.from_pretrained("org/mini", revision="main", cache_dir=None)(ids).last_hidden_state
        theirs = transformers.BertModel.from_pretrained("org/mini", cache_dir=tmp_path / "hub")(ids).last_hidden_state
        local = BertModel.from_pretrained(minilm_2_layers)(ids).last_hidden_state
    assert torch.equal(ours, local)
    torch.testing.assert_close(ours, theirs, atol=1e-6, rtol=0)
    assert BertTokenizer.from_pretrained("org/mini", revision=None)("hello world")["input_ids"] == [101, 7592, 2088, 102]
    for load in (BertModel.from_pretrained, BertConfig.from_pretrained, bertkit.AutoTokenizer.from_pretrained):
        for name in ("org/mini", "org/not-cached"):
            with pytest.raises(BertkitError, match=rf"revision=.*hf download {name} --revision REV --local-dir DIR"):
                load(name, revision=other)
    for load in (BertModel.from_pretrained, BertConfig.from_pretrained):  # any unknown keyword too (it was refused
        with pytest.raises(BertkitError, match="unknown keyword argument device_map"):  # after the download)
            load("org/not-cached", device_map="auto")
    # A snapshot another library cached in part, read offline: the error names the repo and how to fetch the rest
    # (it said to re-save the directory, or to fetch bertkit's example model).
    for names, load in ((["model.safetensors"], BertModel.from_pretrained), (["config.json"], BertConfig.from_pretrained),
                        (["vocab.txt", "tokenizer.json"], BertTokenizer.from_pretrained)):
        for name in names:
            (repo / "snapshots" / main / name).unlink()
        with pytest.raises(MissingFileError, match=r"cache of org/mini, holding part of it: fetch the rest with `hf "
                                                   r"download org/mini`"):
            load("org/mini")
    for option in ({"subfolder": "sub"}, {"cache_dir": str(tmp_path)}, {"local_files_only": "yes"}, {"token": "hf_x"}):
        with pytest.raises(BertkitError, match=f"{next(iter(option))}=") as raised:
            BertModel.from_pretrained("org/mini", **option)
        assert "hf_x" not in str(raised.value)
    # local_files_only=True (offline scripts pass it) only forbids a download: a local directory loads, as in
    # transformers; it was refused as an option bertkit does not implement.
    for load in (BertModel.from_pretrained, BertConfig.from_pretrained, BertTokenizer.from_pretrained,
                 bertkit.AutoTokenizer.from_pretrained):
        assert type(load(minilm_2_layers, local_files_only=True)) is type(load(minilm_2_layers))


def test_a_hub_repo_without_safetensors_or_cached_in_part_downloads_its_weights(minilm_2_layers, tmp_path, monkeypatch):
    """Online, only the safetensors patterns were fetched: a repo from before safetensors (the Google miniatures)
    came down without weights and failed "no float weights". transformers falls back to pytorch_model.bin; so does
    bertkit now, and still leaves the TF and Flax weights on the Hub. (The Hub is faked: snapshot_download copies
    what allow_patterns selects from a folder.)"""
    import fnmatch

    from huggingface_hub.errors import EntryNotFoundError, LocalEntryNotFoundError
    from safetensors.torch import load_file

    import bertkit.hub

    remote = tmp_path / "remote"
    remote.mkdir()
    for f in minilm_2_layers.iterdir():
        if f.name != "model.safetensors":
            shutil.copy(f, remote / f.name)
    torch.save(load_file(minilm_2_layers / "model.safetensors"), remote / "pytorch_model.bin")
    (remote / "tf_model.h5").write_bytes(b"not fetched")
    snapshot = tmp_path / "cache" / "snapshots" / ("a" * 40)

    def snapshot_download(repo_id, allow_patterns, local_files_only=False):
        if local_files_only:
            if not snapshot.is_dir():
                raise LocalEntryNotFoundError("not cached")
            return str(snapshot)
        snapshot.mkdir(parents=True, exist_ok=True)
        for f in remote.iterdir():
            if any(fnmatch.fnmatch(f.name, pattern) for pattern in allow_patterns):
                shutil.copy(f, snapshot / f.name)
        return str(snapshot)

    def hf_hub_download(repo_id, filename):  # bertkit asks for modules.json first, as sentence-transformers does
        raise EntryNotFoundError(f"{filename} is not in {repo_id}")

    monkeypatch.setattr("huggingface_hub.snapshot_download", snapshot_download)
    monkeypatch.setattr("huggingface_hub.hf_hub_download", hf_hub_download)
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", False)
    monkeypatch.setattr(bertkit.hub, "_hub_reachable", lambda endpoint: True)
    ids = torch.tensor([[101, 7592, 2088, 102]])
    with pytest.raises(MissingFileError, match="local_files_only=True and the files are not in the local cache"):
        BertModel.from_pretrained("google/bert_uncased_L-2_H-128_A-2", local_files_only=True)
    assert not snapshot.exists()  # nothing downloaded
    with torch.no_grad():
        got = BertModel.from_pretrained("google/bert_uncased_L-2_H-128_A-2")(ids).last_hidden_state
        local = BertModel.from_pretrained(minilm_2_layers)(ids).last_hidden_state
        cached = BertModel.from_pretrained("google/bert_uncased_L-2_H-128_A-2", local_files_only=True)
        assert torch.equal(cached(ids).last_hidden_state, local)
    assert torch.equal(got, local)
    assert sorted(f.name for f in snapshot.iterdir()) == sorted(f.name for f in remote.iterdir() if f.suffix != ".h5")
    # A snapshot that another library cached in part (transformers' AutoTokenizer: config.json and the tokenizer's
    # files) was taken as the whole checkpoint: "no float weights", online too. Its missing files are fetched now.
    (snapshot / "pytorch_model.bin").unlink()
    with torch.no_grad():
        got = BertModel.from_pretrained("google/bert_uncased_L-2_H-128_A-2")(ids).last_hidden_state
    assert torch.equal(got, local)


def test_an_empty_a_file_and_a_tilde_path_are_refused_as_transformers_refuses_them(minilm_2_layers, tmp_path,
                                                                                     monkeypatch):
    """"" read the working directory (Path("") is "."): a checkpoint there loaded, and save_pretrained("")'s
    directory loaded back, where transformers refuses the name. A file, or a "~" path (which neither library
    expands), was reported as a directory that "does not exist"."""
    shutil.copytree(minilm_2_layers, tmp_path / "run")
    monkeypatch.chdir(tmp_path / "run")
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from bertkit.sentence import CrossEncoder, SentenceTransformer

    for load in (BertModel.from_pretrained, BertConfig.from_pretrained, BertTokenizer.from_pretrained,
                 bertkit.AutoTokenizer.from_pretrained, transformers.BertModel.from_pretrained, SentenceTransformer,
                 CrossEncoder, lambda path: bertkit.pipeline("feature-extraction", path)):
        with pytest.raises((BertkitError, OSError), match="empty string|Repo id must"):
            load("")
    for load in (BertModel.from_pretrained, bertkit.AutoTokenizer.from_pretrained):
        with pytest.raises(MissingFileError, match=r"config.json is a file; pass the directory that holds it \(\.\)"):
            load("config.json")
        with pytest.raises(MissingFileError, match=r"~/run does not exist \(a leading ~ is not expanded"):
            load("~/run")
    with pytest.raises(OSError):
        transformers.BertModel.from_pretrained("~/run")
    assert BertModel.from_pretrained(".").config.num_hidden_layers == 2  # "." is the working directory, as there


def test_the_loaders_of_local_directories_say_how_to_download_a_hub_id(tmp_path, monkeypatch):
    """SentenceTransformer, CrossEncoder, SparseEncoder and pipeline() read local directories only (docs/sentence.md,
    docs/inference.md); given a Hub id they said it "does not exist" (pipeline(): "config.json not found") and no
    more."""
    from bertkit.sentence import CrossEncoder, SentenceTransformer, SparseEncoder

    monkeypatch.chdir(tmp_path)
    for load in (SentenceTransformer, CrossEncoder, SparseEncoder, lambda path: bertkit.pipeline("text-classification",
                 path), lambda path: bertkit.pipeline("sentence-embedding", path)):
        with pytest.raises(MissingFileError, match=r"org/name does not exist; .*download it with `hf download "
                                                   r"org/name --local-dir DIR`"):
            load("org/name")

# ---- outputs: attentions, hidden states, tuple and mapping access ----------------------------------------------


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



def test_regression_losses_with_one_and_several_targets(tmp_path):
    # problem_type="regression" with num_labels=2 (two scores per example): transformers takes the MSE of the
    # (B, 2) logits against (B, 2) labels; bertkit flattened the labels and failed inside mse_loss.
    inputs = _batch()
    for num_labels, labels in [(1, torch.tensor([0.5, -1.0, 2.0])), (1, torch.tensor([[0.5], [-1.0], [2.0]])),
                               (2, torch.tensor([[0.5, 1.0], [-1.0, 0.0], [2.0, 3.0]]))]:
        ours, hf = _pair("BertForSequenceClassification", tmp_path, num_labels=num_labels)
        ours.config.problem_type = hf.config.problem_type = "regression"
        with torch.no_grad():
            a, b = ours(**inputs, labels=labels).loss, hf(**inputs, labels=labels).loss
        torch.testing.assert_close(a, b, **TOL)
        assert b.item() > 0.5  # the targets are far from a random head's outputs
    with pytest.raises(BertkitError, match=r"labels of shape \(3,\) for logits of shape \(3, 2\)"):
        ours(**inputs, labels=torch.tensor([0.5, -1.0, 2.0]))

def test_outputs_index_like_transformers(minilm_2_layers):
    """out[0], out["logits"], out.to_tuple(): transformers' fields and order, None fields left out."""
    tok = BertTokenizer.from_pretrained(minilm_2_layers)
    batch = tok(SENTENCES, padding=True, return_tensors="pt")
    torch.manual_seed(0)
    ours = H.BertForSequenceClassification.from_pretrained(minilm_2_layers, num_labels=2).eval()
    hf = transformers.BertForSequenceClassification.from_pretrained(minilm_2_layers, num_labels=2).eval()
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


def test_outputs_behave_as_mappings(minilm_2_layers, small_batch):
    ours = bertkit.BertModel.from_pretrained(minilm_2_layers)
    theirs = transformers.BertModel.from_pretrained(minilm_2_layers)
    with torch.no_grad():
        a, b = ours(**small_batch), theirs(**small_batch)
    assert list(a.keys()) == list(b.keys()) == ["last_hidden_state", "pooler_output"]
    assert [k for k, _ in a.items()] == [k for k, _ in b.items()]
    _close(list(a.values())[1], list(b.values())[1])
    assert "pooler_output" in a and "pooler_output" in b and "attentions" not in a
    # out.get(...), the custom compute_loss of transformers' Trainer guide: an AttributeError here
    assert a.get("pooler_output") is a.pooler_output and b.get("pooler_output") is b.pooler_output
    assert a.get("attentions") is None is b.get("attentions") and a.get("loss", 7) == 7 == b.get("loss", 7)


def test_masked_lm_without_labels_gives_logits_for_every_position(minilm_dir, batch):
    theirs = transformers.BertForMaskedLM.from_pretrained(minilm_dir)  # MiniLM has no MLM head: theirs is fresh
    ours = bertkit.BertForMaskedLM.from_pretrained(None, config=bertkit.BertConfig.from_pretrained(minilm_dir),
                                                   state_dict=theirs.state_dict())
    with torch.no_grad():
        a, b = ours(**batch), theirs(**batch)
    assert a.logits.shape == b.logits.shape == (*batch["input_ids"].shape, 30522)
    _close(a.logits, b.logits, batch["attention_mask"])

# ---- embeddings and model objects ------------------------------------------------------------------------------


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


def test_the_embeddings_called_directly_default_their_token_types_and_positions_as_transformers(tmp_path):
    """``model.bert.embeddings(input_ids)``, as adversarial-training and attribution recipes call it: transformers
    defaults the token types to 0 and the positions to 0..T-1; bertkit's module needed both (a TypeError)."""
    ours, hf = _pair("BertForSequenceClassification", tmp_path)
    inputs = _batch()
    embeds = hf.get_input_embeddings()(inputs["input_ids"]).detach()
    with torch.no_grad():
        for kwargs in ({"input_ids": inputs["input_ids"]}, {"inputs_embeds": embeds},
                       {"input_ids": inputs["input_ids"], "token_type_ids": inputs["token_type_ids"]}):
            torch.testing.assert_close(ours.bert.embeddings(**kwargs), hf.bert.embeddings(**kwargs), rtol=0, atol=0)
        torch.testing.assert_close(ours.bert.embeddings(inputs["input_ids"]), hf.bert.embeddings(inputs["input_ids"]),
                                   rtol=0, atol=0)


def test_input_embeddings_and_a_transformers_state_dict_through_the_key_table(minilm_2_layers):
    hf = transformers.BertModel.from_pretrained(minilm_2_layers).eval()
    ours = BertModel(BertConfig.from_pretrained(minilm_2_layers)).eval()
    ours.load_published_state_dict(hf.state_dict(), source="transformers BertModel")
    assert torch.equal(ours.get_input_embeddings().weight, hf.get_input_embeddings().weight)
    tok = BertTokenizer.from_pretrained(minilm_2_layers)
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


def test_set_input_embeddings_and_device_dtype():
    model = H.BertForTokenClassification(BertConfig(**TINY))
    assert model.device == torch.device("cpu") and model.dtype == torch.float32
    new = torch.nn.Embedding(300, TINY["hidden_size"])
    model.set_input_embeddings(new)
    assert model.get_input_embeddings() is new and model.config.vocab_size == 300
    with pytest.raises(BertkitError, match="hidden_size 32"):
        model.set_input_embeddings(torch.nn.Embedding(300, 16))


def test_resize_token_embeddings_matches_transformers(tmp_path):
    ours, hf = _pair("BertForMaskedLM", tmp_path)
    old = ours.get_input_embeddings().weight.detach().clone()
    n = TINY["vocab_size"] + 5
    torch.manual_seed(3)
    hf.resize_token_embeddings(n)  # transformers' default: new rows drawn around the old rows' mean (mean_resizing)
    after_hf = torch.randn(4)
    torch.manual_seed(3)
    emb = ours.resize_token_embeddings(n)
    # the same rows bit for bit, and the same random numbers drawn: dropout, a head's init afterwards follow the seed
    # as in transformers (the plain mean, drawing nothing, gave rows up to 1e-5 off and another stream after)
    torch.testing.assert_close(torch.randn(4), after_hf, rtol=0, atol=0)
    assert emb is ours.get_input_embeddings() and emb.num_embeddings == n
    assert ours.config.vocab_size == n and ours.bert.config.vocab_size == n
    torch.testing.assert_close(emb.weight[: n - 5], old, rtol=0, atol=0)
    torch.testing.assert_close(emb.weight, hf.get_input_embeddings().weight, atol=0, rtol=0)
    assert 0 < (emb.weight[n - 5:] - old.mean(0)).abs().max() < 1e-4  # drawn with 1e-9 of the old rows' covariance
    torch.testing.assert_close(ours.cls.predictions.bias, hf.cls.predictions.bias, **TOL)  # zeros for the new tokens
    # Same new rows in both: the MLM logits (decoder tied to the resized embeddings) are equal everywhere.
    with torch.no_grad():
        ids = torch.tensor([[2, 211, 50, 215, 3]])
        torch.testing.assert_close(ours(ids).prediction_logits, hf(ids).logits, **TOL)
    # mean_resizing=False: the whole new matrix drawn from N(0, initializer_range), the old rows then copied back
    torch.manual_seed(4)
    hf.resize_token_embeddings(n + 20, mean_resizing=False)
    after_hf = torch.randn(4)
    torch.manual_seed(4)
    emb = ours.resize_token_embeddings(n + 20, mean_resizing=False)
    torch.testing.assert_close(torch.randn(4), after_hf, rtol=0, atol=0)
    torch.testing.assert_close(emb.weight, hf.get_input_embeddings().weight, atol=0, rtol=0)
    assert ours.resize_token_embeddings(n + 21, pad_to_multiple_of=8).num_embeddings == 240
    ours.save_pretrained(tmp_path / "resized")
    again = H.BertForMaskedLM.from_pretrained(tmp_path / "resized")
    assert again.config.vocab_size == 240
    torch.testing.assert_close(again.cls.predictions.bias, ours.cls.predictions.bias, rtol=0, atol=0)
    with pytest.raises(BertkitError, match="mean_resizing='yes'"):
        ours.resize_token_embeddings(300, mean_resizing="yes")


@pytest.mark.parametrize("kwargs,message", [
    (dict(new_num_tokens=0), r"new_num_tokens must be a positive int, got 0 \(the tokenizer's size: len\(tokenizer\)\)"),
    (dict(new_num_tokens=-5), "new_num_tokens must be a positive int, got -5"),
    (dict(new_num_tokens=220.0), "new_num_tokens must be a positive int, got 220.0"),
    (dict(new_num_tokens=220, pad_to_multiple_of=8.0), "pad_to_multiple_of must be a positive int, got 8.0"),
])
def test_resize_token_embeddings_names_a_size_it_cannot_take(kwargs, message):
    """An IndexError from inside torch (0 rows), a RuntimeError (negative), a TypeError from torch.empty (a float
    pad_to_multiple_of, as transformers refuses it by name); a float size was taken after int()."""
    model = H.BertForMaskedLM(BertConfig(**TINY))
    with pytest.raises(BertkitError, match=message):
        model.resize_token_embeddings(**kwargs)
    assert model.get_input_embeddings().num_embeddings == model.config.vocab_size == TINY["vocab_size"]


def test_model_objects(minilm_dir):
    ours = bertkit.BertForMaskedLM.from_pretrained(minilm_dir)
    theirs = transformers.BertForMaskedLM.from_pretrained(minilm_dir)
    assert type(ours.base_model).__name__ == type(theirs.base_model).__name__ == "BertModel"
    for model in (ours, theirs):  # the freeze-lower-layers recipe
        for layer in model.bert.encoder.layer[:3]:
            for p in layer.parameters():
                p.requires_grad = False
    assert ours.num_parameters(only_trainable=True) == theirs.num_parameters(only_trainable=True)
    assert ours.num_parameters(only_trainable=True) < ours.num_parameters()
    # the embedding matrices left out, their LayerNorm counted (10,826,682 of this masked LM's 22,744,506)
    for only_trainable in (False, True):
        assert (ours.num_parameters(only_trainable, exclude_embeddings=True)
                == theirs.num_parameters(only_trainable, exclude_embeddings=True))
    # the tied decoder, visible: the output embedding's weight *is* the input embedding's
    assert ours.get_output_embeddings().weight is ours.get_input_embeddings().weight
    assert theirs.get_output_embeddings().weight is theirs.get_input_embeddings().weight
    assert ours.get_output_embeddings().weight.shape == theirs.get_output_embeddings().weight.shape
    assert bertkit.BertForSequenceClassification.from_pretrained(minilm_dir).get_output_embeddings() is None
    # what a head copied from transformers' source reads (both were AttributeErrors)
    assert ours.main_input_name == theirs.main_input_name == "input_ids"
    for value in (True, False):
        ours.config.return_dict = theirs.config.return_dict = value
        assert ours.config.use_return_dict is theirs.config.use_return_dict is value
    # peft's prepare_model_for_kbit_training reads supports_gradient_checkpointing and calls
    # enable_input_require_grads (both AttributeErrors): frozen embeddings' output then requires grad, as there
    assert ours.supports_gradient_checkpointing is theirs.supports_gradient_checkpointing is True
    ids = torch.tensor([[101, 7592, 2088, 102]])
    for model in (ours, theirs):
        model.get_input_embeddings().weight.requires_grad_(False)
        model.enable_input_require_grads()
        assert model.get_input_embeddings()(ids).requires_grad
        model.disable_input_require_grads()
        assert not model.get_input_embeddings()(ids).requires_grad
    ours.enable_input_require_grads()
    ours.enable_input_require_grads()  # twice is one hook (transformers' second call leaks the first)
    ours.disable_input_require_grads()
    assert not ours.get_input_embeddings()(ids).requires_grad

def test_model_attributes_transformers_code_reads(tmp_path):
    """``can_generate()``, ``config_class``, ``base_model_prefix``, ``get_memory_footprint()`` and transformers 5's
    ``set_attn_implementation`` were AttributeErrors; each now answers as transformers' does."""
    ours, theirs = _pair("BertForMaskedLM", tmp_path)
    assert ours.can_generate() is theirs.can_generate() is False and H.BertForMaskedLM.can_generate() is False
    assert ours.base_model_prefix == theirs.base_model_prefix == "bert"
    assert getattr(ours, ours.base_model_prefix) is ours.bert
    assert ours.config_class is BertConfig and ours.config_class.__name__ == theirs.config_class.__name__
    # the parameters' bytes, the tied decoder once (transformers also holds a token_type_ids buffer bertkit has not)
    assert ours.get_memory_footprint(return_buffers=False) == theirs.get_memory_footprint(return_buffers=False)
    assert ours.get_memory_footprint() == ours.get_memory_footprint(return_buffers=False) + 8 * TINY["max_position_embeddings"]
    batch = _batch()
    want = ours(**batch, output_attentions=True).attentions
    for model in (ours, theirs):
        model.set_attn_implementation("eager")
    assert ours.bert.attn_implementation == "eager"
    with torch.no_grad():
        got, hf = ours(**batch, output_attentions=True).attentions, theirs(**batch, output_attentions=True).attentions
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    mask = batch["attention_mask"].bool()
    for a, b in zip(got, hf):  # bertkit's rows at padded queries are zeros
        torch.testing.assert_close(a.permute(0, 2, 1, 3)[mask], b.permute(0, 2, 1, 3)[mask], **TOL)
    ours.set_attn_implementation("sdpa")
    assert ours.bert.attn_implementation == "sdpa"
    with pytest.raises(BertkitError, match="'flash_attention_2' is not available.*'sdpa'.*'eager'"):
        ours.set_attn_implementation("flash_attention_2")

def test_the_recipe_that_lengthens_the_position_table_gives_transformers_outputs(tmp_path):
    """New position embeddings, ``embeddings.position_ids`` and the config's size assigned (transformers' recipe for
    longer inputs): bertkit kept its positions in another buffer, so a batch without padding failed in torch ("size
    of tensor a (50) must match ... (40)") while a padded one ran."""
    ours, theirs = _pair("BertForSequenceClassification", tmp_path)
    n = 64
    table = torch.randn(n, TINY["hidden_size"], generator=torch.Generator().manual_seed(2))
    for model in (ours, theirs):
        model.bert.embeddings.position_embeddings = torch.nn.Embedding.from_pretrained(table, freeze=False)
        model.bert.embeddings.position_ids = torch.arange(n).expand((1, -1))
        model.bert.embeddings.token_type_ids = torch.zeros(1, n, dtype=torch.long)  # transformers' second buffer
        model.config.max_position_embeddings = n
    assert [name for name, _ in ours.named_buffers()] == ["bert.embeddings.position_ids"]
    ids = torch.randint(1, TINY["vocab_size"], (2, 50), generator=torch.Generator().manual_seed(3))
    for mask in (torch.ones_like(ids), torch.ones_like(ids).index_fill(1, torch.arange(44, 50), 0)):
        with torch.no_grad():
            torch.testing.assert_close(ours(ids, mask).logits, theirs(ids, mask).logits, **TOL)


def test_ids_are_checked_against_the_tables_the_model_holds(tmp_path):
    """A word or token-type table assigned in place of another (more segments, a larger vocabulary) leaves the config
    as it was, in both libraries: bertkit checked the ids against the config's sizes and refused those transformers
    looks up ("token_type_ids holds 3, outside [0, 1]"); a sequence longer than the position table is still refused."""
    ours, theirs = _pair("BertForSequenceClassification", tmp_path)
    g = torch.Generator().manual_seed(4)
    words, segments = torch.randn(TINY["vocab_size"] + 20, TINY["hidden_size"], generator=g), torch.randn(4, TINY["hidden_size"], generator=g)
    for model in (ours, theirs):
        model.bert.embeddings.word_embeddings = torch.nn.Embedding.from_pretrained(words, padding_idx=0)
        model.bert.embeddings.token_type_embeddings = torch.nn.Embedding.from_pretrained(segments)
    batch = _batch()
    batch["input_ids"][0, 2], batch["token_type_ids"][0, :4] = TINY["vocab_size"] + 19, 3
    with torch.no_grad():
        torch.testing.assert_close(ours(**batch).logits, theirs(**batch).logits, **TOL)
    batch["input_ids"][0, 2] = TINY["vocab_size"] + 20
    with pytest.raises(BertkitError, match=rf"input_ids holds {TINY['vocab_size'] + 20}, outside \[0, "
                                           rf"{TINY['vocab_size'] + 19}\]"):
        ours(**batch)
    with pytest.raises(BertkitError, match="sequence length 41 exceeds max_position_embeddings 40"):
        ours(torch.ones(1, 41, dtype=torch.long))

# ---- state dicts through the key table -------------------------------------------------------------------------


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


def test_state_dicts_cross_both_ways_with_strict_loading(minilm_2_layers, small_batch):
    theirs = transformers.BertForSequenceClassification.from_pretrained(minilm_2_layers, num_labels=3)
    config = bertkit.BertConfig.from_pretrained(minilm_2_layers, num_labels=3)
    ours = bertkit.BertForSequenceClassification(config).eval()
    ours.load_state_dict(theirs.state_dict(), strict=True)  # transformers' keys, strict
    with torch.no_grad():
        _close(ours(**small_batch).logits, theirs(**small_batch).logits)
    back = transformers.BertForSequenceClassification(
        transformers.BertConfig.from_pretrained(minilm_2_layers, num_labels=3))
    back.load_state_dict(ours.published_state_dict(), strict=True)  # bertkit -> transformers' keys, strict
    with torch.no_grad():
        _close(back.eval()(**small_batch).logits, ours(**small_batch).logits)
    with pytest.raises(RuntimeError, match="Unexpected key"):
        ours.load_state_dict({**theirs.state_dict(), "bert.extra.weight": torch.zeros(1)}, strict=True)

# ---- gradient checkpointing ------------------------------------------------------------------------------------


def test_a_batch_is_laid_out_for_the_attention_dropout_the_modules_apply(monkeypatch):
    """The layout of a training batch was chosen by ``config.attention_probs_dropout_prob``, while attention applies
    its module's rate (transformers reads that one too): with the config set to 0 after construction, a GPU in half
    precision laid the batch out for variable-length attention, which then refused the modules' 0.1 dropout."""
    import bertkit.padding

    monkeypatch.setattr(bertkit.padding, "varlen_attention", lambda device, dtype: True)  # a GPU's choice, here
    torch.manual_seed(0)
    model = BertModel(BertConfig(**{**TINY, "attention_probs_dropout_prob": 0.1})).train()
    model.config.attention_probs_dropout_prob = 0.0
    torch.manual_seed(1)
    out = model(**_batch()).last_hidden_state
    for layer in model.encoder.layer:
        assert layer.attention.self.dropout.p == 0.1
    torch.manual_seed(1)
    model.config.attention_probs_dropout_prob = 0.1
    torch.testing.assert_close(model(**_batch()).last_hidden_state, out, rtol=0, atol=0)


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


def test_gradient_checkpointing_enable_keeps_the_attention_gradients(minilm_2_layers):
    """Layer 0's attention projection gets the same gradient with and without gradient checkpointing, and it is
    transformers' query, key and value gradients stacked as the key table stacks their weights (fused q/k/v)."""
    tok = BertTokenizer.from_pretrained(minilm_2_layers)
    batch = tok(SENTENCES, padding=True, return_tensors="pt")
    labels = torch.tensor([0, 1, 1])
    no_dropout = dict(num_labels=2, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    grads = []
    for enable in (False, True):
        model = H.BertForSequenceClassification.from_pretrained(minilm_2_layers, **no_dropout)
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

    hf = transformers.BertForSequenceClassification.from_pretrained(minilm_2_layers, **no_dropout)
    hf.classifier.load_state_dict(model.classifier.state_dict())
    hf.train()
    hf(**batch, labels=labels).loss.backward()
    attention = hf.bert.encoder.layer[0].attention.self
    theirs = torch.cat([attention.query.weight.grad, attention.key.weight.grad, attention.value.weight.grad])
    torch.testing.assert_close(grads[0], theirs, atol=1e-6, rtol=1e-4)

# ---- config ----------------------------------------------------------------------------------------------------


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


def test_id2label_assigned_from_json_is_read_with_int_ids(tmp_path):
    """``config.id2label = json.load(f)`` after construction has string keys: they were kept, so ``id2label[0]``
    (the pipelines' label names) was a KeyError and ``label2id`` mapped to the strings "0", "1" (written so into
    config.json, where transformers' run_glue reads them as ids)."""
    config = bertkit.BertConfig(num_labels=2)
    config.id2label = json.loads('{"0": "neg", "1": "pos"}')
    assert config.id2label == {0: "neg", 1: "pos"} and config.label2id == {"neg": 0, "pos": 1}
    config.save_pretrained(tmp_path)
    assert transformers.BertConfig.from_pretrained(tmp_path).label2id == {"neg": 0, "pos": 1}
    for bad, message in (({"1": "pos"}, r"0..n-1, got \[1\]"), (["neg", "pos"], "mapping.*got a list")):
        with pytest.raises(BertkitError, match=message):
            config.id2label = bad
    assert config.id2label == {0: "neg", 1: "pos"}  # a refused map changes nothing


def test_label_names_that_are_no_name_are_refused_not_written_as_their_repr(tiny_checkpoint, tmp_path):
    """``id2label={0: None, 1: "pos"}`` (or a list, a bool, a float as a name; ``label2id`` keyed by them) became the
    label "None" (``"['a']"``, ``"True"``), which pipelines and metrics report and config.json keeps, where
    transformers keeps the value it was given. A whole number is still read as its name, "0" (config.json files on
    the Hub hold ``{"0": 0, "1": 1}``)."""
    for bad in ({0: None, 1: "pos"}, {0: ["a"], 1: "b"}, {0: True, 1: False}, {0: 0.5, 1: "b"}):
        with pytest.raises(BertkitError, match=r"id2label values must be label names \(strings\), got"):
            BertConfig(id2label=bad)
        with pytest.raises(BertkitError, match=r"id2label values must be label names"):
            H.BertForSequenceClassification.from_pretrained(tiny_checkpoint(tmp_path), id2label=bad)
    config = BertConfig(num_labels=2)
    for assign in (lambda: setattr(config, "id2label", {0: None, 1: "x"}),
                   lambda: setattr(config, "label2id", {None: 0, "x": 1})):
        with pytest.raises(BertkitError, match=r"id2label values must be label names"):
            assign()
    assert config.id2label == {0: "LABEL_0", 1: "LABEL_1"}
    import numpy as np

    assert BertConfig(id2label={0: 0, 1: np.int64(1)}).id2label == {0: "0", 1: "1"}


def test_dropout_masks_are_transformers_in_the_padded_layout(minilm_2_layers, small_batch):
    """One seed, dropout on (train mode): the padded layout draws transformers' dropout masks, so a same-seed run
    gives its numbers; the default layout draws them over the real tokens only, other masks on a padded batch
    (docs/coming-from-transformers.md)."""
    ours = BertModel.from_pretrained(minilm_2_layers).train()
    theirs = transformers.BertModel.from_pretrained(minilm_2_layers).train()
    mask = small_batch["attention_mask"]
    assert bool((mask == 0).any())  # a padded batch
    with torch.no_grad():
        torch.manual_seed(0)
        expected = theirs(**small_batch).last_hidden_state
        ours.layout = "padded"
        torch.manual_seed(0)
        _close(ours(**small_batch).last_hidden_state, expected, mask)
        ours.layout = "auto"
        torch.manual_seed(0)
        unpadded = ours(**small_batch).last_hidden_state
    assert float((unpadded - expected)[mask.bool()].abs().max()) > 0.1


def test_a_loss_for_the_labels_given_where_transformers_gives_none_or_nan(tmp_path):
    """A difference by design (docs/coming-from-transformers.md): BertForPreTraining scores the part whose labels
    are given (transformers: no loss); and a token head without a labelled token has transformers' loss, NaN."""
    inputs = _batch()
    mlm = torch.full((3, 11), -100)
    mlm[0, 2], mlm[2, 4] = 7, 100
    nsp = torch.tensor([0, 1, 0])
    ours, hf = _pair("BertForPreTraining", tmp_path)
    with torch.no_grad():
        both, mlm_only, nsp_only = (ours(**inputs, **kw).loss for kw in (
            dict(labels=mlm, next_sentence_label=nsp), dict(labels=mlm), dict(next_sentence_label=nsp)))
        assert hf(**inputs, labels=mlm).loss is None and hf(**inputs, next_sentence_label=nsp).loss is None
        torch.testing.assert_close(both, hf(**inputs, labels=mlm, next_sentence_label=nsp).loss, **TOL)
        nsp_ref = torch.nn.functional.cross_entropy(hf(**inputs).seq_relationship_logits, nsp)
    torch.testing.assert_close(nsp_only, nsp_ref, **TOL)
    torch.testing.assert_close(mlm_only, both - nsp_ref, **TOL)
    for name in ("BertForTokenClassification", "BertForMaskedLM"):
        ours, hf = _pair(name, tmp_path)
        with torch.no_grad():
            none = torch.full((3, 11), -100)
            a, b = ours(**inputs, labels=none).loss, hf(**inputs, labels=none).loss
        assert a.isnan() and b.isnan(), (name, a, b)  # a mean over no label: no score in either library


@pytest.mark.parametrize("name", ["BertForMaskedLM", "BertForTokenClassification"])
def test_token_labels_of_another_shape_than_the_inputs_are_refused(name, tmp_path):
    """transformers flattens token labels: any shape with one label per input token gives its loss, and labels of
    another size fail there. bertkit read labels one short against other tokens than their own and answered a loss:
    32 labels on (3, 11) inputs gave 5.4837 (masked LM), 1.0310 (token classification)."""
    inputs = _batch()
    labels = torch.randint(0, 3, (3, 11), generator=torch.Generator().manual_seed(5))
    labels[inputs["attention_mask"] == 0] = -100
    labels[:, ::2] = -100
    ours, hf = _pair(name, tmp_path)
    with torch.no_grad():
        expected = hf(**inputs, labels=labels).loss
        for same in (labels, labels.reshape(-1)):
            torch.testing.assert_close(ours(**inputs, labels=same).loss, expected, atol=1e-6, rtol=0)
        for short in (labels[:, :-1], labels[:-1], labels.reshape(-1)[1:]):
            with pytest.raises(BertkitError, match=rf"^labels of shape {re.escape(str(tuple(short.shape)))} for inputs "
                                                   r"of shape \(3, 11\): give one label per input token \(-100 where "
                                                   r"none applies\)"):
                ours(**inputs, labels=short)


def test_config_update_architectures_and_name_or_path_as_transformers(minilm_dir, tmp_path):
    # config.update, config.architectures and config.name_or_path were AttributeErrors; the file's stale
    # "_name_or_path" (a Hub id) was kept and written back into every saved config.json, which transformers drops
    ours, theirs = bertkit.BertConfig.from_pretrained(minilm_dir), transformers.AutoConfig.from_pretrained(minilm_dir)
    assert ours.architectures == theirs.architectures == ["BertModel"]
    assert ours.name_or_path == ours._name_or_path == theirs.name_or_path == theirs._name_or_path == str(minilm_dir)
    for config in (ours, theirs):
        config.update({"hidden_dropout_prob": 0.0, "num_labels": 3})
    assert ours.hidden_dropout_prob == theirs.hidden_dropout_prob == 0.0
    assert ours.id2label == theirs.id2label == {0: "LABEL_0", 1: "LABEL_1", 2: "LABEL_2"}
    with pytest.raises(BertkitError, match="hidden_dropout_prob must be in"):
        ours.update({"hidden_dropout_prob": 1.5, "vocab_size": 7})
    with pytest.raises(BertkitError, match="unknown keyword argument hiden_dropout_prob"):
        ours.update({"hiden_dropout_prob": 0.3})  # transformers keeps the typo as a new attribute
    assert (ours.hidden_dropout_prob, ours.vocab_size) == (0.0, 30522)  # a refused update changes nothing
    model = bertkit.BertForSequenceClassification.from_pretrained(minilm_dir, num_labels=2)
    assert model.config.name_or_path == model.name_or_path == str(minilm_dir)
    model.save_pretrained(tmp_path / "saved")
    written = json.loads((tmp_path / "saved" / "config.json").read_text())
    assert written["architectures"] == ["BertForSequenceClassification"] and "_name_or_path" not in written
    assert bertkit.BertConfig().architectures is None and bertkit.BertConfig().name_or_path == ""


def test_config_keys_that_are_no_field_read_and_assign_as_in_transformers(tmp_path):
    """config.json's other keys read as attributes (``getattr(config, "use_cache", None)`` gave the default where
    transformers gives the file's value), and an assigned one is written by save_pretrained: it was a plain attribute
    never saved, and one the file held already was saved with its old value."""
    transformers.BertConfig(**TINY, my_key=5, task_specific_params={"a": 1}).save_pretrained(tmp_path / "hf")
    ours, theirs = bertkit.BertConfig.from_pretrained(tmp_path / "hf"), transformers.BertConfig.from_pretrained(tmp_path / "hf")
    for key in ("my_key", "task_specific_params", "use_cache", "tie_word_embeddings"):
        assert getattr(ours, key) == getattr(theirs, key), key
    assert getattr(ours, "absent", "default") == "default"
    with pytest.raises(AttributeError, match="model.dtype"):  # config.json's, not the loaded model's (transformers')
        _ = ours.dtype
    for config in (ours, theirs):
        config.use_cache, config.my_key, config.new_key, config.hidden_dropout_prob = False, 7, "v", 0.25
        config.save_pretrained(tmp_path / type(config).__module__.split(".")[0])
    for reader in (bertkit.BertConfig, transformers.BertConfig):
        for directory in ("bertkit", "transformers"):
            back = reader.from_pretrained(tmp_path / directory)
            assert (back.use_cache, back.my_key, back.new_key, back.hidden_dropout_prob) == (False, 7, "v", 0.25)
    copied = copy.copy(ours)
    copied.my_key = 8  # a copy's assignment leaves the original as it was
    assert (ours.my_key, copied.my_key) == (7, 8)


def test_decode_takes_an_encoding_and_the_slow_tokenizers_spacing_switch(minilm_dir):
    ours = BertTokenizer.from_pretrained(minilm_dir)
    theirs = transformers.AutoTokenizer.from_pretrained(minilm_dir)
    encoding = "hello world [SEP] there", "pair"
    for kwargs in ({}, {"spaces_between_special_tokens": False}, {"skip_special_tokens": True}):
        assert ours.decode(ours(*encoding), **kwargs) == theirs.decode(theirs(*encoding), **kwargs)
    assert ours.decode(ours(*encoding), spaces_between_special_tokens=False) == \
        "[CLS] hello world [SEP] there [SEP] pair [SEP]"


@pytest.mark.parametrize("cls, source, kwargs", [
    ("BertForSequenceClassification", "encoder", {"num_labels": 3}),  # a new head: its weights missing
    ("BertForPreTraining", "encoder", {}),  # the MLM head fresh, its tied decoder bias too
    ("BertForMaskedLM", "encoder", {}),  # the encoder's pooler left out, under the file's name (no "bert.")
    ("BertForQuestionAnswering", "encoder", {}),
    ("BertForMaskedLM", "pretraining", {}),
    ("BertModel", "pretraining", {}),
    ("BertForSequenceClassification", "pretraining", {}),  # the checkpoint's heads left out
    ("BertForTokenClassification", "pretraining", {}),  # and its pooler, which this head has not
    ("BertForSequenceClassification", "classifier", {"num_labels": 5, "ignore_mismatched_sizes": True}),
])
def test_output_loading_info_reports_as_transformers(minilm_2_layers, tmp_path, cls, source, kwargs):
    """Was: from_pretrained(..., output_loading_info=True), with which scripts list what a checkpoint left
    initialised afresh, refused as 'not a BertConfig field'. Now (model, info) with transformers' four keys: the same
    missing, unexpected and mismatched names as transformers 5 reports for the same checkpoint."""
    made = {"encoder": minilm_2_layers}
    for name, head, kw in (("pretraining", "BertForPreTraining", {}),
                           ("classifier", "BertForSequenceClassification", {"num_labels": 3})):
        made[name] = tmp_path / name
        getattr(transformers, head).from_pretrained(minilm_2_layers, **kw).save_pretrained(made[name])
    _, theirs = getattr(transformers, cls).from_pretrained(made[source], output_loading_info=True, **kwargs)
    model, ours = getattr(bertkit, cls).from_pretrained(made[source], output_loading_info=True, **kwargs)
    assert isinstance(model, getattr(bertkit, cls))
    assert ours.keys() == theirs.keys() == {"missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"}
    assert ours["error_msgs"] == [] == list(theirs["error_msgs"])
    for key in ("missing_keys", "unexpected_keys"):
        assert ours[key] == set(theirs[key]), key
    assert {(k, tuple(a), tuple(b)) for k, a, b in ours["mismatched_keys"]} \
        == {(k, tuple(a), tuple(b)) for k, a, b in theirs["mismatched_keys"]}
    if kwargs.get("ignore_mismatched_sizes"):
        assert {k for k, _, _ in ours["mismatched_keys"]} == {"classifier.weight", "classifier.bias"}
    if cls == "BertForPreTraining":
        assert "cls.predictions.decoder.bias" in ours["missing_keys"]
