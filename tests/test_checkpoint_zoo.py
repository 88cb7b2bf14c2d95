"""The checkpoints users have, as their files are written on the Hub (tests/zoo_helpers.py recreates them at a tiny
size), loaded by bertkit and by transformers / sentence-transformers side by side; other networks are refused by
their model_type before anything else of them is read.

The first tests are the cases the generator at the end found; the generator (slow) draws checkpoints and inputs."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch

import bertkit
import bertkit.inference.base
import bertkit.sentence
import bertkit.weight_files
import zoo_helpers as zoo
from bertkit.errors import BertkitError

transformers = pytest.importorskip("transformers")

ENTRIES = {  # entry point -> (the other network's head it is given, sentence-transformers files, the call)
    "feature-extraction": ("Model", None, lambda d: bertkit.pipeline("feature-extraction", str(d))),
    "fill-mask": ("ForMaskedLM", None, lambda d: bertkit.pipeline("fill-mask", str(d))),
    "text-classification": ("ForSequenceClassification", None, lambda d: bertkit.pipeline("text-classification", str(d))),
    "sentence-embedding": ("Model", "dense", lambda d: bertkit.pipeline("sentence-embedding", str(d))),
    "SparseEncoder": ("ForMaskedLM", "sparse", lambda d: bertkit.sentence.SparseEncoder(str(d))),
    "tokenizer_of": ("Model", None, lambda d: bertkit.inference.base.Pipeline.tokenizer_of(d)),
}


def _sentence_files(directory: Path, kind: str | None) -> None:
    if kind == "dense":  # msmarco-distilbert-base-v4 / all-distilroberta-v1 / paraphrase-xlm-r-multilingual-v1
        zoo.write_json(directory / "modules.json", zoo.modules("Transformer", "Pooling", "Normalize"))
        zoo.write_json(directory / "1_Pooling" / "config.json", zoo.pooling_config("mean", 32, newer=False))
        zoo.write_json(directory / "sentence_bert_config.json", {"max_seq_length": 512, "do_lower_case": False})
    elif kind == "sparse":  # opensearch-neural-sparse-encoding-doc-v2-distill (a DistilBERT)
        zoo.write_json(directory / "modules.json", zoo.modules("MLMTransformer", "SpladePooling"))
        zoo.write_json(directory / "1_SpladePooling" / "config.json",
                       {"pooling_strategy": "max", "activation_function": "relu", "word_embedding_dimension": 30522})
        zoo.write_json(directory / "config_sentence_transformers.json",
                       {"model_type": "SparseEncoder", "similarity_fn_name": "dot"})


@pytest.mark.parametrize("kind", ["distilbert", "roberta", "xlm-roberta"])
@pytest.mark.parametrize("entry", list(ENTRIES))
def test_other_networks_are_refused_by_their_model_type(tmp_path, kind, entry):
    """A DistilBERT, RoBERTa or XLM-R directory given to a pipeline, a SparseEncoder or predict's tokenizer check was
    refused with another diagnosis, whose fix does not apply: "has no fill-mask head ... use a checkpoint that keeps
    it", "has no masked-LM head (... architectures ['DistilBertForMaskedLM']) ... start from a checkpoint saved with
    its head", "vocab.txt not found", or (a DistilBERT's BERT vocabulary) its tokenizer loaded. Each names the
    model_type now, before the weights or the tokenizer are read."""
    head, sentence, call = ENTRIES[entry]
    directory = zoo.non_bert(tmp_path / f"{kind}-model", kind, head)
    _sentence_files(directory, sentence)
    with pytest.raises(BertkitError, match=f"model_type '{kind}'.*load it with transformers"):
        call(directory)


def test_tinybert_distillation_layers_are_refused_with_the_way_to_load_it(minilm_dir, tmp_path):
    """huawei-noah/TinyBERT_General_4L_312D: a config.json without model_type (TinyBERT's own keys "cell", "emb_size",
    ...) and a BertForPreTraining state dict with the distillation projections fit_denses.0-4, which transformers'
    BertModel drops. bertkit refused it listing the keys and no fix; the message now gives the call that loads the
    model without them, and that call gives transformers' outputs."""
    config = {"attention_probs_dropout_prob": 0.1, "cell": {}, "emb_size": 312, "hidden_act": "gelu",
              "hidden_dropout_prob": 0.1, "hidden_size": 24, "initializer_range": 0.02, "intermediate_size": 40,
              "max_position_embeddings": 512, "num_attention_heads": 12, "num_hidden_layers": 2, "pre_trained": "",
              "structure": [], "training": "", "type_vocab_size": 2, "vocab_size": 30522}
    directory = tmp_path / "TinyBERT_General_4L_312D"
    directory.mkdir()
    zoo.write_json(directory / "config.json", config)
    torch.manual_seed(0)
    weights = transformers.BertForPreTraining(transformers.BertConfig(**config)).state_dict()
    weights.update({f"fit_denses.{i}.{p}": torch.randn(768, 24) if p == "weight" else torch.randn(768)
                    for i in range(5) for p in ("weight", "bias")})
    torch.save(weights, directory / "pytorch_model.bin")
    with pytest.raises(BertkitError, match=r"fit_denses\.4\.weight.*transformers drops.*state_dict=") as refused:
        bertkit.BertModel.from_pretrained(directory)
    assert "('fit_denses.',)" in str(refused.value)
    path = directory
    model = bertkit.BertModel.from_pretrained(path, state_dict={
        k: v for k, v in bertkit.weight_files.read_weights(Path(path)).items() if not k.startswith(("fit_denses.",))})
    theirs = transformers.BertModel.from_pretrained(directory).eval()
    ids = torch.tensor([[101, 7592, 1010, 2088, 999, 102]])
    with torch.no_grad():
        torch.testing.assert_close(model(ids).last_hidden_state, theirs(ids).last_hidden_state, atol=1e-5, rtol=1e-5)


def test_a_variant_encoders_extra_tensors_get_no_advice_to_drop_them(tiny_checkpoint, tmp_path):
    """Unexpected tensors inside the encoder (a variant's gated MLP) are not another module's: dropping them would
    load another network half-way, so the refusal does not suggest it."""
    directory = tiny_checkpoint(tmp_path / "variant")
    from safetensors.torch import load_file, save_file

    weights = load_file(directory / "model.safetensors")
    weights["encoder.layer.0.mlp.gated_layers.weight"] = torch.zeros(4, 4)
    save_file(weights, directory / "model.safetensors")
    with pytest.raises(BertkitError, match="gated_layers") as refused:
        bertkit.BertModel.from_pretrained(directory)
    assert "state_dict=" not in str(refused.value)


# ---- the generator ------------------------------------------------------------------------------------------------
TEXTS = ["Hello World!", "Café au lait in Zürich, naïve ÉCOLE.", "BERT 模型很好用。你好世界", "don't stop-believing...",
         "Apple Inc. is based in Cupertino , California", "Ünïcödé ﬁ ligature ½", "a [MASK] b [SEP] c", "x" * 30,
         "  spaces\tand\ttabs ", "ÅNGSTRÖM Über straße"]


def _hf_recipe(name: str, directory: Path, vocab: list[str], shape: dict, rng: random.Random) -> Path:
    base, uncased = zoo.BERT_BASE, {"do_lower_case": True, "model_max_length": 512}
    cased = {"do_lower_case": False, "model_max_length": 512}
    old = {k: v for k, v in base.items() if k not in ("model_type", "gradient_checkpointing", "use_cache",
                                                      "position_embedding_type", "transformers_version")}
    recipes = {
        "bert-base-uncased": (base, vocab, uncased, None),
        "bert-base-cased": (base, zoo.cased_vocab(vocab), cased, None),
        "bert-base-chinese": ({**base, **zoo.POOLER_KEYS}, zoo.chinese_vocab(), cased, None),
        "bert-base-multilingual-cased": ({**base, **zoo.POOLER_KEYS}, zoo.cased_vocab(vocab), cased, None),
        "transformers-2x": ({**old, **zoo.TRANSFORMERS_2X, "model_type": "bert", "architectures": ["BertForPreTraining"]},
                            vocab, {"do_lower_case": True, "max_len": 128, "init_inputs": []}, zoo.SPECIAL_TOKENS_MAP),
        "dslim/bert-base-NER": ({**base, "architectures": ["BertForTokenClassification"], "_num_labels": 9,
                                 "id2label": zoo.NER_LABELS, "label2id": {v: int(k) for k, v in zoo.NER_LABELS.items()},
                                 "output_past": True}, zoo.cased_vocab(vocab), {"do_lower_case": False},
                                zoo.SPECIAL_TOKENS_MAP),
        "ProsusAI/finbert": ({**base, "architectures": ["BertForSequenceClassification"],
                              "id2label": {"0": "positive", "1": "negative", "2": "neutral"},
                              "label2id": {"positive": 0, "negative": 1, "neutral": 2}}, vocab, uncased, None),
        "nlptown": ({**base, **zoo.POOLER_KEYS, "architectures": ["BertForSequenceClassification"], "_num_labels": 5,
                     "finetuning_task": "sentiment-analysis",
                     "id2label": {str(i): f"{i + 1} star{'s' if i else ''}" for i in range(5)},
                     "label2id": {f"{i + 1} star{'s' if i else ''}": i for i in range(5)}}, vocab,
                    {"do_lower_case": True, "max_len": 512}, zoo.SPECIAL_TOKENS_MAP),
        "bert-squad": ({**base, "architectures": ["BertForQuestionAnswering"]}, vocab,
                       {"do_lower_case": True, "model_max_length": 384}, None),
    }
    config, words, tokenizer_config, special = recipes[name]
    return zoo.checkpoint(directory, config, words, tokenizer_config=tokenizer_config, shape=shape,
                          special_tokens_map=special, tokenizer_json=rng.random() < 0.5, pickle=rng.random() < 0.3,
                          seed=rng.randrange(1000))


def _check_hf(directory: Path, texts: list[str], tmp: Path) -> None:
    ours, theirs = bertkit.AutoTokenizer.from_pretrained(directory), transformers.AutoTokenizer.from_pretrained(directory)
    assert ours.model_max_length == theirs.model_max_length
    assert ours(texts)["input_ids"] == theirs(texts)["input_ids"]
    assert ours(texts[:2], texts[2:4], truncation=True)["token_type_ids"] == \
        theirs(texts[:2], texts[2:4], truncation=True)["token_type_ids"]
    arch = bertkit.AutoConfig.from_pretrained(directory).architectures[0]
    name = "AutoModel" + arch.removeprefix("Bert").removeprefix("Model")
    model = getattr(bertkit, name).from_pretrained(directory)
    reference = getattr(transformers, name).from_pretrained(directory).eval()
    assert model.config.id2label == reference.config.id2label
    batch = theirs(texts, padding=True, truncation=True, max_length=24, return_tensors="pt")
    real = batch["attention_mask"].bool()
    with torch.no_grad():
        got, want = model(**batch), reference(**batch)
        for key in want.keys():
            a, b = getattr(got, key), want[key]
            a, b = (a[real], b[real]) if a.dim() >= 2 and a.shape[:2] == real.shape else (a, b)
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5, msg=f"{key}")
    saved = tmp / "saved-by-bertkit"
    model.save_pretrained(saved)
    ours.save_pretrained(saved)
    again = getattr(transformers, name).from_pretrained(saved).eval()
    assert again.config.id2label == reference.config.id2label
    assert transformers.AutoTokenizer.from_pretrained(saved)(texts)["input_ids"] == theirs(texts)["input_ids"]
    with torch.no_grad():
        key = next(iter(want.keys()))
        a, b = again(**batch)[key], want[key]
        a, b = (a[real], b[real]) if a.dim() >= 2 and a.shape[:2] == real.shape else (a, b)
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    if arch == "BertForSequenceClassification":
        got = bertkit.pipeline("text-classification", str(directory))(texts)
        want = transformers.pipeline("text-classification", model=str(directory))(texts)
        assert [g["label"] for g in got] == [w["label"] for w in want]
        np.testing.assert_allclose([g["score"] for g in got], [w["score"] for w in want], atol=1e-5)


def _st_recipe(directory: Path, vocab: list[str], shape: dict, rng: random.Random) -> Path:
    """One of all-MiniLM-L6-v2 / bge-small-en-v1.5 / e5-small-v2 / gte-small / mxbai-embed-large-v1 / LaBSE /
    paraphrase-MiniLM-L6-v2 / multi-qa-*-dot-v1 as written (their pooling, Normalize, Dense, max_seq_length,
    do_lower_case, prompts, similarity), drawn."""
    width = shape["hidden_size"]
    mode = rng.choice(["mean", "cls", "max", "mean_sqrt_len"])
    kinds = ["Transformer", "Pooling"] + (["Dense"] if rng.random() < 0.3 else []) + \
        (["Normalize"] if rng.random() < 0.6 else [])
    cased = rng.random() < 0.3
    zoo.checkpoint(directory, {**zoo.BERT_BASE, "architectures": ["BertModel"]},
                   zoo.cased_vocab(vocab) if cased else vocab, shape=shape, tokenizer_json=rng.random() < 0.5,
                   tokenizer_config={"do_lower_case": not cased, "model_max_length": 512},
                   special_tokens_map=zoo.SPECIAL_TOKENS_MAP, seed=rng.randrange(1000))
    zoo.write_json(directory / "modules.json", zoo.modules(*kinds))
    zoo.write_json(directory / "1_Pooling" / "config.json", zoo.pooling_config(mode, width, newer=rng.random() < 0.5))
    zoo.write_json(directory / "sentence_bert_config.json",
                   {"max_seq_length": rng.choice([16, 128, 256, 512]), "do_lower_case": not cased and rng.random() < 0.5})
    st_config: dict = {"__version__": {"sentence_transformers": "2.2.2", "transformers": "4.28.1", "pytorch": "1.13.0"}}
    if rng.random() < 0.5:
        st_config.update(prompts={"query": "Represent this sentence for searching relevant passages: ", "passage": ""},
                         default_prompt_name=rng.choice([None, "passage"]),
                         similarity_fn_name=rng.choice(["cosine", "dot", "euclidean", None]))
    zoo.write_json(directory / "config_sentence_transformers.json", st_config)
    if "Dense" in kinds:
        out = rng.choice([16, width])
        dense = {"in_features": width, "out_features": out, "bias": True,
                 "activation_function": "torch.nn.modules.activation.Tanh"}
        zoo.write_json(directory / "2_Dense" / "config.json", dense)
        torch.manual_seed(rng.randrange(1000))
        torch.save({"linear.weight": torch.randn(out, width) * 0.3, "linear.bias": torch.randn(out) * 0.1},
                   directory / "2_Dense" / "pytorch_model.bin")  # LaBSE's Dense is a torch pickle
    return directory


def _check_st(directory: Path, texts: list[str], tmp: Path) -> None:
    from sentence_transformers import SentenceTransformer

    ours, theirs = bertkit.sentence.SentenceTransformer(str(directory)), SentenceTransformer(str(directory), device="cpu")
    for setting in ("max_seq_length", "similarity_fn_name", "prompts", "default_prompt_name"):
        assert getattr(ours, setting) == getattr(theirs, setting), setting
    np.testing.assert_allclose(ours.encode(texts), theirs.encode(texts), atol=1e-5)
    np.testing.assert_allclose(ours.encode_query(texts), theirs.encode_query(texts), atol=1e-5)
    np.testing.assert_allclose(ours.similarity(ours.encode(texts[:3]), ours.encode(texts[3:])),
                               theirs.similarity(theirs.encode(texts[:3]), theirs.encode(texts[3:])), atol=1e-5)
    ours.save(str(tmp / "saved-by-bertkit"))
    again = SentenceTransformer(str(tmp / "saved-by-bertkit"), device="cpu")
    assert (again.max_seq_length, again.similarity_fn_name) == (theirs.max_seq_length, theirs.similarity_fn_name)
    np.testing.assert_allclose(again.encode(texts), theirs.encode(texts), atol=1e-5)


def _ce_recipe(directory: Path, vocab: list[str], shape: dict, rng: random.Random) -> Path:
    """cross-encoder/ms-marco-MiniLM-L-6-v2 (the activation in its 2021 key or sentence-transformers 4's), or an NLI
    cross-encoder's three labels."""
    one = {"id2label": {"0": "LABEL_0"}, "label2id": {"LABEL_0": 0}}
    config = {**zoo.BERT_BASE, "architectures": ["BertForSequenceClassification"], **rng.choice([
        {**one, "sbert_ce_default_activation_function": "torch.nn.modules.linear.Identity"},
        {**one, "sentence_transformers": {"activation_fn": "torch.nn.modules.activation.Sigmoid", "version": "4.0.1"}},
        {"id2label": {"0": "contradiction", "1": "entailment", "2": "neutral"},
         "label2id": {"contradiction": 0, "entailment": 1, "neutral": 2}}])}
    return zoo.checkpoint(directory, config, vocab, shape=shape, tokenizer_json=rng.random() < 0.5,
                          tokenizer_config={"do_lower_case": True, "model_max_length": 512}, seed=rng.randrange(1000))


def _check_ce(directory: Path, texts: list[str], tmp: Path) -> None:
    from sentence_transformers import CrossEncoder

    ours, theirs = bertkit.sentence.CrossEncoder(str(directory)), CrossEncoder(str(directory), device="cpu")
    pairs = list(zip(texts[:4], texts[4:8]))
    np.testing.assert_allclose(ours.predict(pairs), theirs.predict(pairs), atol=1e-5)
    assert ours.max_length == theirs.max_seq_length
    ours.save(str(tmp / "saved-by-bertkit"))
    np.testing.assert_allclose(CrossEncoder(str(tmp / "saved-by-bertkit"), device="cpu").predict(pairs),
                               theirs.predict(pairs), atol=1e-5)


HF_NAMES = ["bert-base-uncased", "bert-base-cased", "bert-base-chinese", "bert-base-multilingual-cased",
            "transformers-2x", "dslim/bert-base-NER", "ProsusAI/finbert", "nlptown", "bert-squad"]


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_checkpoint_zoo_generator(minilm_dir, tmp_path, seed):
    """Drawn checkpoints of the zoo, at drawn tiny shapes, with drawn texts: ids, outputs, labels, sentence settings
    and vectors equal the references', live and after bertkit's save; other networks are refused by model_type."""
    st = pytest.importorskip("sentence_transformers")
    assert st
    transformers.logging.set_verbosity_error()
    rng = random.Random(seed)
    vocab = (minilm_dir / "vocab.txt").read_text(encoding="utf-8").splitlines()
    kinds = ["hf", "hf", "st", "st", "ce", "other", "other"]  # each kind drawn in every seed, in a drawn order
    rng.shuffle(kinds)
    for draw, kind in enumerate(kinds):
        heads = rng.choice([2, 4])
        shape = {"hidden_size": 8 * heads, "num_hidden_layers": rng.choice([1, 2]), "num_attention_heads": heads,
                 "intermediate_size": rng.choice([20, 37])}
        texts = rng.sample(TEXTS, 8)
        where = tmp_path / f"draw{draw}"
        if kind == "hf":
            _check_hf(_hf_recipe(rng.choice(HF_NAMES), where / "model", vocab, shape, rng), texts, where)
        elif kind == "st":
            _check_st(_st_recipe(where / "model", vocab, shape, rng), texts, where)
        elif kind == "ce":
            _check_ce(_ce_recipe(where / "model", vocab, shape, rng), texts, where)
        else:
            other, entry = rng.choice(["distilbert", "roberta", "xlm-roberta"]), rng.choice(list(ENTRIES))
            head, sentence, call = ENTRIES[entry]
            directory = zoo.non_bert(where / "model", other, head)
            _sentence_files(directory, sentence)
            with pytest.raises(BertkitError, match=f"model_type '{other}'"):
                call(directory)
