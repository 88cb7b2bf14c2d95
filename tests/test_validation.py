"""Inputs are validated where they enter: model tensors, checkpoint files and data files each give a clear
error naming the tensor / file, the field or line, the value and the limit."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from bertkit import BertConfig, BertForSequenceClassification, BertModel, BertTokenizer
from bertkit.errors import BertkitError
from bertkit.tasks import glue, ner, squad

TINY = dict(vocab_size=30, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=24,
            max_position_embeddings=8)


@pytest.fixture(scope="module")
def model(tiny_model):
    return tiny_model(**TINY).eval()


# ---------------------------------------------------------------- model inputs


@pytest.mark.parametrize("kwargs,message", [
    (dict(attention_mask=torch.ones(1, 4, dtype=torch.long)), r"attention_mask has shape \(1, 4\) but input_ids has \(2, 4\)"),
    (dict(attention_mask=torch.ones(2, 3, dtype=torch.long)), r"attention_mask has shape \(2, 3\) but input_ids has \(2, 4\)"),
    (dict(token_type_ids=torch.zeros(2, 5, dtype=torch.long)), r"token_type_ids has shape \(2, 5\)"),
    (dict(token_type_ids=torch.full((2, 4), 2)), r"token_type_ids holds 2, outside \[0, 1\] \(type_vocab_size 2"),
    (dict(position_ids=torch.tensor([[0, 1, 2, 8]])), r"position_ids holds 8, outside \[0, 7\] \(max_position_embeddings 8"),
    (dict(position_ids=torch.zeros(3, 4, dtype=torch.long)), r"position_ids has shape \(3, 4\); expected \(2, 4\)"),
])
def test_mismatched_or_out_of_range_inputs_are_named(model, kwargs, message):
    ids = torch.tensor([[2, 5, 6, 3], [2, 7, 3, 0]])
    with pytest.raises(BertkitError, match=message):
        model(input_ids=ids, **kwargs)


@pytest.mark.parametrize("bad,message", [(30, r"input_ids holds 30, outside \[0, 29\] \(vocab_size 30 .*tokenizer\?"
                                               r" \(after tokenizer.add_tokens or add_special_tokens, grow the model to"
                                               r" the tokenizer with model.resize_token_embeddings\(len\(tokenizer\)\)"),
                                         (-1, r"input_ids holds -1, outside \[0, 29\]")])
def test_ids_outside_the_vocabulary_are_named(model, bad, message):
    with pytest.raises(BertkitError, match=message):
        model(input_ids=torch.tensor([[2, bad, 3]]))


def test_a_sequence_longer_than_the_positions_is_refused(model):
    with pytest.raises(BertkitError, match="sequence length 9 exceeds max_position_embeddings 8"):
        model(input_ids=torch.ones(1, 9, dtype=torch.long))


def test_a_max_length_beyond_the_positions_is_refused_by_every_api_that_takes_one(model):
    """Was: int8 calibration (quantize_int8_on_texts, quantize_checkpoint, pipelines with quantize="int8") took a
    max_length above the positions and failed in the forward pass with advice to truncate in the tokenizer; the
    pipeline and extract_features refused it each in their own words. Now one check, one message."""
    from bertkit.features import extract_features
    from bertkit.inference.embedding import FeatureExtractionPipeline
    from bertkit.quantization import quantize_int8_on_texts

    tok = BertTokenizer({t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a"])})
    said = ("max_length 9 exceeds max_position_embeddings 8 of this model: it has no position embedding beyond 8 "
            "tokens; pass max_length 8 or less")
    with pytest.raises(BertkitError, match=f"^{said}$"):
        FeatureExtractionPipeline(model, tok, max_length=9)
    with pytest.raises(BertkitError, match=f"^{said}$"):
        quantize_int8_on_texts(model, tok, ["a a a a a a a a a a"], max_length=9)
    with pytest.raises(BertkitError, match=f"^{said.replace('max_length', 'max_seq_length')}$"):
        extract_features(model, tok, [("a", None)], "unused.jsonl", max_seq_length=9)
    assert FeatureExtractionPipeline(model, tok, max_length=8).max_length == 8


def test_valid_inputs_still_give_the_same_outputs(model):
    ids = torch.tensor([[2, 5, 6, 3], [2, 7, 3, 0]])
    mask = (ids != 0).long()
    out = model(input_ids=ids, attention_mask=mask).last_hidden_state
    ref = model(input_ids=ids, attention_mask=mask, layout="padded").last_hidden_state
    torch.testing.assert_close(out[mask.bool()], ref[mask.bool()], atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------- checkpoint files


@pytest.fixture()
def saved(tmp_path, tiny_checkpoint):
    return tiny_checkpoint(tmp_path, "BertForSequenceClassification", labels=["neg", "pos"], **TINY)


def _edit_config(path, **changes):
    cfg = json.loads((path / "config.json").read_text())
    cfg.update(changes)
    (path / "config.json").write_text(json.dumps(cfg))


@pytest.mark.parametrize("change,message", [
    (dict(hidden_dropout_prob="0.1"), r"hidden_dropout_prob must be a finite number, got '0.1' \(a string"),
    (dict(layer_norm_eps=None), "layer_norm_eps must be a finite number, got None"),
    (dict(id2label=["neg", "pos"]), r"id2label must be a mapping .* got a list"),
    (dict(num_labels=0, id2label=None), "num_labels must be a positive int .* got 0"),
    (dict(num_labels=-1, id2label=None), "num_labels must be a positive int .* got -1"),
    (dict(hidden_size="16"), "hidden_size must be a positive int, got '16'"),
])
def test_bad_config_values_name_file_field_and_value(saved, change, message):
    _edit_config(saved, **change)
    with pytest.raises(BertkitError, match=message) as info:
        BertForSequenceClassification.from_pretrained(saved)
    assert str(saved / "config.json") in str(info.value)


@pytest.mark.parametrize("kw,message", [
    (dict(num_labels=4, id2label={0: "a", 1: "b", 2: "c"}), r"num_labels=4 but 3 labels are named \(\{0: 'a', 1: 'b', "
                                                            r"2: 'c'\}\): pass the labels alone"),
    (dict(num_labels=2, id2label={"0": "a", "1": "b", "2": "c"}), r"num_labels=2 but 3 labels are named"),
    (dict(num_labels=4, label2id={"a": 0, "b": 1, "c": 2}), r"num_labels=4 but 3 labels are named"),
    (dict(id2label={0: "a", 1: "b"}, label2id={"a": 0, "b": 1, "c": 2}),
     r"label2id \{'a': 0, 'b': 1, 'c': 2\} does not invert id2label \{0: 'a', 1: 'b'\}: pass one of the two"),
    (dict(id2label={0: "a", 2: "c"}), r"^BertConfig.id2label keys must be 0..n-1, got \[0, 2\]"),
])
def test_label_keywords_that_disagree_are_refused_naming_the_keywords_not_the_file(saved, kw, message):
    """from_pretrained(dir, num_labels=4, id2label=<3 labels>) built a 3-label head and dropped num_labels (transformers:
    a 3-output head with 4 label2id entries), BertConfig(...) with the same keywords dropped the names instead, and a
    label2id beside id2label was dropped without a word; a refusal blamed config.json for a keyword's value."""
    for load in (lambda: BertForSequenceClassification.from_pretrained(saved, **kw), lambda: BertConfig(**kw)):
        with pytest.raises(BertkitError, match=message) as info:
            load()
        assert "config.json" not in str(info.value)
    # keys as config.json has them (strings), label2id beside them, num_labels agreeing: all one set of labels
    model = BertForSequenceClassification.from_pretrained(saved, num_labels=2, id2label={"0": "x", "1": "y"},
                                                          label2id={"x": 0, "y": 1})
    assert model.config.id2label == {0: "x", 1: "y"} and model.classifier.out_features == 2
    assert BertForSequenceClassification.from_pretrained(saved, num_labels=3, ignore_mismatched_sizes=True).config.id2label \
        == {0: "LABEL_0", 1: "LABEL_1", 2: "LABEL_2"}  # a count alone still renames the file's labels
    assert BertForSequenceClassification.from_pretrained(saved, num_labels=2).config.id2label == {0: "neg", 1: "pos"}


def test_a_bad_keyword_value_is_named_beside_the_file_it_overrides(saved):
    """from_pretrained(dir, classifier_dropout=1.5) said "dir/config.json: BertConfig.classifier_dropout must be in
    [0, 1), got 1.5", as if the file held it."""
    with pytest.raises(BertkitError, match=r"config.json with classifier_dropout=1.5: BertConfig.classifier_dropout "
                                           r"must be in \[0, 1\), got 1.5"):
        BertForSequenceClassification.from_pretrained(saved, classifier_dropout=1.5)


def test_run_glue_config_keywords_are_taken_and_finetuning_task_is_saved(saved, tmp_path):
    """run_glue.py and run_ner.py call AutoConfig.from_pretrained(name, num_labels=, finetuning_task=task, cache_dir=,
    revision=, token=, trust_remote_code=): finetuning_task was refused as an unknown keyword, though bertkit reads it
    back from config.json (a GLUE pair task tells a pipeline that the model takes text pairs)."""
    from bertkit import AutoConfig

    config = AutoConfig.from_pretrained(saved, num_labels=2, finetuning_task="mrpc", cache_dir=None, revision="main",
                                        token=None, trust_remote_code=False)
    model = BertForSequenceClassification.from_pretrained(saved, config=config)
    model.save_pretrained(tmp_path / "out")
    assert json.loads((tmp_path / "out" / "config.json").read_text())["finetuning_task"] == "mrpc"
    transformers = pytest.importorskip("transformers")
    assert transformers.AutoConfig.from_pretrained(tmp_path / "out").finetuning_task == "mrpc"
    with pytest.raises(BertkitError, match=r"^finetuning_task must be a str \(or None\), got 3"):
        AutoConfig.from_pretrained(saved, finetuning_task=3)


def test_the_largest_real_encoders_are_still_valid_configs():
    assert BertConfig.preset("large") and BertConfig(hidden_size=5120, num_hidden_layers=48, num_attention_heads=40,
                                                      intermediate_size=20480, vocab_size=250_002)  # ~15B: XLM-R XXL+


@pytest.mark.parametrize("change,message", [
    (dict(vocab_size=2**40), r"vocab_size is 1099511627776 but the weights have 30"),
    (dict(num_hidden_layers=200_000), r"num_hidden_layers is 200000 but the weights have 1 \(encoder\.layer\.0 to 0; no encoder\.layer\.1\)"),
    (dict(vocab_size=31, num_hidden_layers=3),
     r"vocab_size is 31 but the weights have 30 \(embeddings\.word_embeddings\.weight \(30, 16\)\); "
     r"num_hidden_layers is 3 but the weights have 1"),
    (dict(max_position_embeddings=4096), r"max_position_embeddings is 4096 but the weights have 8"),
    (dict(intermediate_size=48), r"intermediate_size is 48 but the weights have 24"),
])
def test_a_config_that_does_not_match_its_weights_is_refused_before_the_model_is_built(saved, change, message,
                                                                                        monkeypatch):
    from bertkit import modeling

    _edit_config(saved, **change)

    def built(*args, **kwargs):
        raise AssertionError("the model was built before the config was checked against the weights")

    monkeypatch.setattr(modeling.BertModel, "__init__", built)
    with pytest.raises(BertkitError, match=rf"{saved}: the config does not match the weights: .*{message}"):
        BertForSequenceClassification.from_pretrained(saved)


def test_a_legacy_pickle_and_a_state_dict_are_checked_against_the_config_too(saved):
    weights = BertForSequenceClassification.from_pretrained(saved).published_state_dict()
    _edit_config(saved, num_hidden_layers=4)
    (saved / "model.safetensors").unlink()
    torch.save(weights, saved / "pytorch_model.bin")
    with pytest.raises(BertkitError, match=r"num_hidden_layers is 4 but the weights have 1"):
        BertForSequenceClassification.from_pretrained(saved)
    with pytest.raises(BertkitError, match=r"state_dict: the config does not match the weights: hidden_size is 32"):
        BertForSequenceClassification.from_pretrained(None, config=BertConfig(**{**TINY, "hidden_size": 32}),
                                                      state_dict=weights)


def test_a_model_larger_than_the_machines_memory_is_refused_before_any_layer_is_built(monkeypatch):
    from bertkit import model_checks

    monkeypatch.setattr(model_checks, "physical_memory_bytes", lambda: 2**30)  # a 1 GiB machine
    config = BertConfig(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096)
    with pytest.raises(BertkitError, match=r"this BertConfig's 335,141,888 parameters need 1\.2 GiB in torch\.float32, "
                                           r"more than this machine's 1\.0 GiB of memory \(num_hidden_layers 24"):
        BertModel(config)
    with torch.device("meta"):  # shapes only: no memory needed, no check
        assert BertModel(config).num_parameters() == 335_141_888


def _tokenizer_dir(tmp_path, minilm_dir):
    d = tmp_path / "tok"
    d.mkdir()
    for name in ("vocab.txt", "tokenizer_config.json"):
        shutil.copy(minilm_dir / name, d / name)
    return d


def test_tokenizer_config_string_booleans_are_refused(tmp_path, minilm_dir):
    d = _tokenizer_dir(tmp_path, minilm_dir)
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    cfg["do_lower_case"] = "false"  # was read as True
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    with pytest.raises(BertkitError, match=r"tokenizer_config.json: do_lower_case must be bool, got 'false' \(a string"):
        BertTokenizer.from_pretrained(d)


@pytest.mark.parametrize("mutate,message", [
    (lambda b: b"\xef\xbb\xbf" + b, "starts with a UTF-8 byte-order mark"),
    (lambda b: b.replace(b"[unused5]", b"\xff\xfe", 1), r"is not UTF-8 text: line 7, byte"),
])
def test_damaged_vocab_files_are_named(tmp_path, minilm_dir, mutate, message):
    d = _tokenizer_dir(tmp_path, minilm_dir)
    (d / "vocab.txt").write_bytes(mutate((d / "vocab.txt").read_bytes()))
    with pytest.raises(BertkitError, match=message) as info:
        BertTokenizer.from_pretrained(d)
    assert str(d / "vocab.txt") in str(info.value)


def test_a_vocab_longer_than_the_model_is_refused_where_they_meet(tmp_path, minilm_dir):
    d = _tokenizer_dir(tmp_path, minilm_dir)
    (d / "config.json").write_text(json.dumps({"vocab_size": 1000}))
    with pytest.raises(BertkitError, match=r"has 30522 tokens but .*config.json has vocab_size 1000"):
        BertTokenizer.from_pretrained(d)


def test_a_tokenizer_saved_with_added_tokens_beside_a_model_not_grown_names_the_resize(tmp_path, minilm_dir):
    """add_tokens, then both saved without resize_token_embeddings: the refusal said only to use the vocabulary the
    model was trained with."""
    d = _tokenizer_dir(tmp_path, minilm_dir)
    (d / "config.json").write_text(json.dumps({"vocab_size": 30522}))
    tok = BertTokenizer.from_pretrained(minilm_dir)
    tok.add_tokens(["covid19"])
    tok.save_pretrained(d)
    with pytest.raises(BertkitError, match=r"has 30523 tokens but .*vocab_size 30522: .*save the model grown to the "
                                           r"tokenizer: model.resize_token_embeddings\(len\(tokenizer\)\)$"):
        BertTokenizer.from_pretrained(d)


def test_a_checkpoint_holding_code_is_refused_without_suggesting_weights_only_false(tmp_path):
    from bertkit.training.checkpoint import read_state

    (tmp_path / "step-00000001").mkdir()
    torch.save({"model": Payload()}, tmp_path / "step-00000001" / "state.pt")
    with pytest.raises(BertkitError, match="holds Python code, not only tensors") as info:
        read_state(tmp_path / "step-00000001")
    assert "weights_only=False" not in str(info.value) and "state.pt" in str(info.value)


class Payload:
    """Stands for any pickled object: loading it would run the code that rebuilds it."""


# ---------------------------------------------------------------- data files


def _glue_file(tmp_path, task_dir, split, text):
    d = tmp_path / task_dir
    d.mkdir(parents=True, exist_ok=True)
    (d / f"{split}.tsv").write_text(text)
    return tmp_path


STSB_HEADER = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n"


@pytest.mark.parametrize("score", ["nan", "1e309", "-40", "5.5"])
def test_stsb_scores_must_be_finite_in_0_to_5(tmp_path, score):
    root = _glue_file(tmp_path, "STS-B", "train", STSB_HEADER + f"0\tg\tf\t2012\t1\ts\ts\tA man.\tA dog.\t{score}\n")
    with pytest.raises(BertkitError, match=rf"train.tsv line 2: sts-b score '{score}' is outside \[0, 5\]"):
        glue.read_glue("stsb", root, "train")


def test_a_glue_file_without_its_header_is_refused(tmp_path):
    root = _glue_file(tmp_path, "SST-2", "dev", "a fine film\t1\na bad film\t0\n")
    with pytest.raises(BertkitError, match="dev.tsv line 1 is not the header sst-2 files start with"):
        glue.read_glue("sst2", root, "dev")
    ok = _glue_file(tmp_path, "SST-2", "dev", "sentence\tlabel\na fine film\t1\n")
    assert [e.text_a for e in glue.read_glue("sst2", ok, "dev")] == ["a fine film"]


def test_an_sst2_dev_file_as_the_test_file_is_refused_by_its_header(tmp_path):
    # Both have two columns: read as a test file (index, sentence), the labels were the texts predicted and the
    # sentences the index echoed; the header names the columns where the test layout has others.
    # RTE's dev file has the test file's header columns where the test layout reads them, and one more: its rows
    # are refused, saying so; a test row short of a column is only that
    for where, (task, name, split, content), message in (
            ("sst2-test", ("sst2", "SST-2", "test", "sentence\tlabel\na fine film\t1\n"),
             r"test.tsv line 1 is not the header sst-2 test files start with \(column 2 is 'label', not 'sentence'\)"),
            ("sst2-dev", ("sst2", "SST-2", "dev", "index\tsentence\n0\ta fine film\n"),
             r"column 1 is 'index', not 'sentence'"),
            ("rte", ("rte", "RTE", "test", "index\tsentence1\tsentence2\tlabel\n0\tA.\tB.\tentailment\n"),
             r"expected 3 tab-separated columns for rte, got 4 \(as many as a train/dev file has: is this one read as "
             r"the test split\?\)"),
            ("rte2", ("rte", "RTE", "test", "index\tsentence1\tsentence2\n0\tA.\n"),
             r"expected 3 tab-separated columns for rte, got 2$")):
        root = _glue_file(tmp_path / where, name, split, content)
        with pytest.raises(BertkitError, match=message):
            glue.read_glue(task, root, split)
    ok = _glue_file(tmp_path / "ok", "SST-2", "test", "index\tsentence\n7\ta fine film\n")
    assert [(e.id, e.text_a) for e in glue.read_glue("sst2", ok, "test")] == [("7", "a fine film")]


def test_an_empty_split_is_refused_before_training(tmp_path):
    root = _glue_file(tmp_path, "SST-2", "dev", "sentence\tlabel\n")
    with pytest.raises(BertkitError, match="dev.tsv holds no examples"):
        glue.read_glue("sst2", root, "dev")
    (tmp_path / "valid.txt").write_text("-DOCSTART- -X- -X- O\n\n")
    with pytest.raises(BertkitError, match="valid.txt holds no sentences"):
        ner.read_conll(tmp_path / "valid.txt")


def _squad(tmp_path, qas, context="Normandy is a region in France."):
    path = tmp_path / "dev.json"
    path.write_text(json.dumps({"version": "1.1", "data": [
        {"title": "Normandy", "paragraphs": [{"context": context, "qas": qas}]}]}))
    return path


def test_squad_without_id_or_context_and_with_duplicate_ids(tmp_path):
    q = {"question": "Where?", "answers": [{"text": "France", "answer_start": 24}]}
    with pytest.raises(BertkitError, match=r"dev.json article 0 \('Normandy'\) paragraph 0 question 0: missing 'id'"):
        squad.read_squad(_squad(tmp_path, [q]))
    path = tmp_path / "noctx.json"
    path.write_text(json.dumps({"data": [{"title": "T", "paragraphs": [{"qas": [dict(q, id="a")]}]}]}))
    with pytest.raises(BertkitError, match="paragraph 0: missing 'context'"):
        squad.read_squad(path)
    with pytest.raises(BertkitError, match="question id 'a' is used twice"):
        squad.read_squad(_squad(tmp_path, [dict(q, id="a"), dict(q, id="a")]))


@pytest.mark.parametrize("command", [["predict", "squad", "--out", "preds"], ["finetune", "squad", "--output-dir", "run"]])
def test_squad_windows_without_room_for_context_are_refused_before_the_model_is_read(tmp_path, capsys, command):
    """--max-seq-length 60 with the default --max-query-length 64: no window could hold context. Refused from the
    flags alone (the model directory does not exist), with nothing written."""
    from bertkit.cli import main

    (tmp_path / "dev.json").write_text('{"data": []}')
    args = [*command[:2], "--model", str(tmp_path / "no-such-model"), "--predict-file", str(tmp_path / "dev.json"),
            "--max-seq-length", "60", command[2], str(tmp_path / command[3])]
    assert main(args) == 2
    assert ("--max-seq-length 60 must exceed --max-query-length 64 + 3 ([CLS] and two [SEP])"
            in capsys.readouterr().err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dev.json"]


# ---------------------------------------------------------------- pre-training data and its vocabulary


def test_pretraining_data_made_with_another_vocabulary_is_refused_before_training(tiny_pretraining_data, tmp_path,
                                                                                   capsys):
    """The instances are ids: under another vocabulary of the same size (two tokens swapped) every id is valid and
    names another word piece, so nothing else would notice; the run is refused before it trains or writes."""
    from bertkit.cli import main

    vocab = tiny_pretraining_data / "vocab"
    tokens = (vocab / "vocab.txt").read_text(encoding="utf-8").splitlines()
    other = tmp_path / "other-vocab"
    shutil.copytree(vocab, other)
    swapped = [*tokens[:1000], tokens[1001], tokens[1000], *tokens[1002:]]
    (other / "vocab.txt").write_text("\n".join(swapped) + "\n", encoding="utf-8")
    (other / "tokenizer.json").unlink(missing_ok=True)  # read before vocab.txt: it would still hold the old order
    args = ["pretrain", "--data", str(tiny_pretraining_data / "data"), "--config-name", "tiny", "--max-steps", "1",
            "--batch-size", "4", "--no-progress"]
    assert main([*args, "--vocab", str(other), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert (f"--data {tiny_pretraining_data / 'data'} was made with another vocabulary than --vocab {other} "
            f"(1500 entries against 1500; id 1000 is {tokens[1000]!r} there, {tokens[1001]!r} here)") in err
    # the fix it names works (it named --vocab DATA, which holds the vocab.txt alone, no tokenizer: refused in turn)
    assert (f"pass --vocab the tokenizer directory it was made with (the one whose vocab.txt create-pretraining-data "
            f"copied to {tiny_pretraining_data / 'data' / 'vocab.txt'}: the data directory holds no tokenizer)") in err
    assert main([*args, "--vocab", str(tiny_pretraining_data / "data"), "--out", str(tmp_path / "run")]) == 2
    assert "tokenizer_config.json not found" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other-vocab"]  # no run directory, nothing staged
    assert main([*args, "--vocab", str(vocab), "--eval-data", str(tiny_pretraining_data / "data"),
                 "--out", str(tmp_path / "run")]) == 0  # the data's own vocabulary: trained
    assert (tmp_path / "run" / "final" / "model.safetensors").is_file()


def test_a_directory_where_a_file_is_asked_for_is_named_as_one(tiny_checkpoint, tmp_path, capsys):
    """Was: a directory given for --calibration-file or convert-tf-checkpoint's --bert-config was "not found", and one
    given for export onnx's --output-file was told to write "DIR/features.jsonl"."""
    from bertkit.cli import main

    model = tiny_checkpoint(tmp_path / "m", "BertForSequenceClassification", tokenizer=["[PAD]", "[UNK]", "[CLS]",
                            "[SEP]", "[MASK]", "a", "film"], labels=2, num_attention_heads=2)
    folder = tmp_path / "folder"
    folder.mkdir()
    (tmp_path / "in.txt").write_text("a film\n", encoding="utf-8")
    for argv, said in (
            (["quantize", "--model", model, "--out", tmp_path / "q", "--calibration-file", folder],
             f"calibration file {folder} is a directory: give a text file with one sentence per line, like the "
             "ones the model will see (or leave it out for the built-in sentences)"),
            (["predict", "text-classification", "--model", model, "--input", tmp_path / "in.txt", "--out",
              tmp_path / "o.jsonl", "--int8", "--calibration-file", folder],
             f"calibration file {folder} is a directory: give a text file with one sentence per line, like the "
             "ones the model will see (or leave it out for the built-in sentences)"),
            (["convert-tf-checkpoint", "--tf-checkpoint", tmp_path / "ckpt", "--bert-config", folder, "--vocab",
              model / "vocab.txt", "--out", tmp_path / "t"],
             f"{folder} is a directory: pass the checkpoint's bert_config.json (it comes beside bert_model.ckpt)"),
            (["export", "onnx", "--model", model, "--out", folder],
             f"{folder} is a directory; give the path of the file to write (one inside it, or elsewhere)")):
        assert main([str(a) for a in argv]) == 2
        assert capsys.readouterr().err.strip().splitlines()[-1].endswith(said), argv
    assert sorted(p.name for p in tmp_path.iterdir()) == ["folder", "in.txt", "m"]
