"""Pipelines on real text (SST-2, RTE, SQuAD dev, CoNLL-2003) against transformers on the same weights.

The real MiniLM checkpoint has no task heads, so each head is checked on a tiny-config model built with
transformers, saved with MiniLM's vocabulary and loaded by both libraries: the numbers must agree. The
embedding check runs on MiniLM itself against sentence-transformers.
"""

from __future__ import annotations

import csv
import json
import random
import re
import shutil
from collections.abc import Iterator

import numpy as np
import pytest
import torch

import bertkit
from bertkit.errors import BertkitError
from bertkit.inference.pipelines import QuestionAnsweringPipeline
from bertkit.tasks import squad

transformers = pytest.importorskip("transformers")

from pipeline_helpers import tiny_dir  # noqa: E402 (after the skip: it imports transformers)


@pytest.fixture(scope="module")
def hf_tok(minilm_dir):
    return transformers.BertTokenizerFast.from_pretrained(minilm_dir)


@pytest.fixture(scope="module")
def sst2(data_dir) -> list[str]:
    with open(data_dir / "glue/SST-2/dev.tsv", encoding="utf-8") as f:
        return [r["sentence"] for r in csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)]


@pytest.fixture(scope="module")
def rte(data_dir) -> list[tuple[str, str]]:
    with open(data_dir / "glue/RTE/dev.tsv", encoding="utf-8") as f:
        return [(r["sentence1"], r["sentence2"]) for r in csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)]


@torch.no_grad()
def _hf_logits(model, hf_tok, texts, pairs=None) -> np.ndarray:
    rows = []
    for i, t in enumerate(texts):  # one at a time: no padding anywhere in the reference
        enc = hf_tok(t, pairs[i] if pairs else None, return_tensors="pt", truncation=True, max_length=512)
        rows.append(model(**enc).logits[0].numpy())
    return rows


# ---------------------------------------------------------------------------------------------------
# fill-mask
# ---------------------------------------------------------------------------------------------------


def _masked(sentences: list[str], n: int, rng: random.Random) -> list[str]:
    out = []
    for s in sentences[:n]:
        words = s.split()
        words[rng.randrange(len(words))] = "[MASK]"
        out.append(" ".join(words))
    return out


def test_fill_mask_matches_transformers_pipeline(tmp_path_factory, minilm_dir, hf_tok, sst2):
    d, hf_model = tiny_dir(tmp_path_factory, minilm_dir, "BertForMaskedLM")
    texts = _masked(sst2, 24, random.Random(0))
    ours = bertkit.pipeline("fill-mask", d, batch_size=5)(texts, top_k=5)
    ref = transformers.pipeline("fill-mask", model=hf_model, tokenizer=hf_tok, device="cpu", top_k=5)(texts)
    for o, r in zip(ours, ref, strict=True):
        assert [c["token"] for c in o] == [c["token"] for c in r]
        np.testing.assert_allclose([c["score"] for c in o], [c["score"] for c in r], atol=1e-5, rtol=0)
        assert [c["token_str"] for c in o] == [c["token_str"] for c in r]
        assert [c["sequence"] for c in o] == [c["sequence"] for c in r]


def test_fill_mask_several_masks_and_errors(tmp_path_factory, minilm_dir, hf_tok):
    d, hf_model = tiny_dir(tmp_path_factory, minilm_dir, "BertForMaskedLM")
    fill = bertkit.pipeline("fill-mask", d)
    text = "the [MASK] sat on the [MASK] ."
    out = fill(text, top_k=3)
    assert len(out) == 2 and all(len(c) == 3 for c in out)
    # transformers keeps the special tokens in a several-mask sequence: "[CLS] the x sat on the [MASK]. [SEP]"
    ref = transformers.pipeline("fill-mask", model=hf_model, tokenizer=hf_tok, device="cpu", top_k=3)(text)
    assert [[c["sequence"] for c in m] for m in out] == [[c["sequence"] for c in m] for m in ref]
    assert out[1][0]["sequence"].startswith("[CLS] the [MASK] sat on the ")
    enc = hf_tok(text, return_tensors="pt")
    with torch.no_grad():
        probs = hf_model(**enc).logits[0].softmax(-1)
    for k, pos in enumerate((enc["input_ids"][0] == hf_tok.mask_token_id).nonzero().flatten()):
        top = probs[pos].topk(3)
        assert [c["token"] for c in out[k]] == top.indices.tolist()
        np.testing.assert_allclose([c["score"] for c in out[k]], top.values.numpy(), atol=1e-5, rtol=0)
    with pytest.raises(BertkitError, match="has no \\[MASK\\]"):
        fill("no mask here")
    with pytest.raises(BertkitError, match="does not take temperature"):
        fill(text, temperature=2.0)
    with pytest.raises(BertkitError, match="has no fill-mask head"):
        bertkit.pipeline("fill-mask", minilm_dir)


def test_fill_mask_sequences_of_several_masks_leave_out_pad_as_transformers(tmp_path_factory, minilm_dir, hf_tok):
    # transformers drops [PAD] from a filled sequence (its batch's padding), a [PAD] candidate and one in the text too;
    # with several masks the special tokens stay, and bertkit's read "[CLS] the [PAD] sat on the [MASK] . [SEP]" where
    # transformers' reads "[CLS] the sat on the [MASK]. [SEP]"
    d, hf_model = tiny_dir(tmp_path_factory, minilm_dir, "BertForMaskedLM")
    with torch.no_grad():
        hf_model.cls.predictions.bias[hf_tok.pad_token_id] += 20  # [PAD] the first candidate
    hf_model.save_pretrained(d)
    texts = ["the [MASK] sat on the [MASK] .", "a [PAD] b [MASK] c [MASK] d", "one [MASK] [PAD] mask"]
    ours = bertkit.pipeline("fill-mask", d)(texts, top_k=2)
    ref = transformers.pipeline("fill-mask", model=hf_model, tokenizer=hf_tok, device="cpu")(texts, top_k=2)
    assert ours[0][0][0]["token"] == hf_tok.pad_token_id and ours[0][0][0]["sequence"] == "[CLS] the sat on the [MASK]. [SEP]"
    for o, r in zip(ours, ref, strict=True):
        o, r = (o, r) if isinstance(o[0], list) else ([o], [r])
        assert [[(c["token"], c["token_str"], c["sequence"]) for c in m] for m in o] == \
               [[(c["token"], c["token_str"], c["sequence"]) for c in m] for m in r]
        np.testing.assert_allclose([[c["score"] for c in m] for m in o], [[c["score"] for c in m] for m in r], rtol=1e-5)


def test_fill_mask_targets_rank_those_tokens_as_transformers(tmp_path_factory, minilm_dir, hf_tok, caplog):
    """transformers' ``targets=``: the named tokens alone, each with its probability over the whole vocabulary, top_k
    capped at their number; a text that is no token is its first piece, with a warning. bertkit refused the option."""
    d, hf_model = tiny_dir(tmp_path_factory, minilm_dir, "BertForMaskedLM")
    fill = bertkit.pipeline("fill-mask", d)
    theirs = transformers.pipeline("fill-mask", model=hf_model, tokenizer=hf_tok, device="cpu")
    texts = ["the capital of france is [MASK] .", "the [MASK] sat on the [MASK] .", "i like [MASK] very much"]
    cases = [({"targets": ["paris", "london", "berlin", "##s", "[UNK]"]}, texts),
             ({"targets": ["Paris", "cats", "cat", "cat"], "top_k": 2}, texts),  # "Paris" is "paris"; cat once
             ({"targets": "dog"}, texts[0]),
             ({"targets": ["paris", "rome"], "top_k": 40000}, texts[1])]  # capped at the 2 targets, not refused
    for options, inputs in cases:
        ours, ref = fill(inputs, **options), theirs(inputs, **options)
        ours, ref = _candidates(ours), _candidates(ref)
        assert [c[:3] for c in ours] == [c[:3] for c in ref], options
        np.testing.assert_allclose([c[3] for c in ours], [c[3] for c in ref], rtol=1e-5, atol=0)
    assert sorted(c["token_str"] for c in fill(texts[0], targets=["Paris", "cats", "cat", "cat"])) == \
        ["cat", "cats", "paris"]
    assert "fill-mask target 'Paris' is not a token of the vocabulary: scoring its first piece 'paris'" in caplog.text
    with pytest.raises(BertkitError, match=r"^fill-mask target '  ' holds no token, so there is nothing to score: "
                                           r"leave it out of targets$"):
        fill(texts[0], targets=["paris", "  "])
    for bad in ([], 3, ["paris", None]):
        with pytest.raises(BertkitError, match=r"^targets must be a string or a non-empty list of strings"):
            fill(texts[0], targets=bad)
    # a token added to the tokenizer of a model not resized to it has no output row to score it by (an IndexError)
    tok = bertkit.AutoTokenizer.from_pretrained(d)
    tok.add_tokens(["<brandnew>"])
    grown = bertkit.pipeline("fill-mask", bertkit.AutoModelForMaskedLM.from_pretrained(d), tokenizer=tok)
    with pytest.raises(BertkitError, match=r"^fill-mask targets \['<brandnew>'\] are token ids \[30522\], past the 30522 "
                                           r"rows of this model's output layer"):
        grown(texts[0], targets=["cat", "<brandnew>"])


def _candidates(result) -> list[tuple]:
    """(token, token_str, sequence, score) of each candidate of a fill-mask result, whatever its nesting (per input,
    per mask), in order."""
    if isinstance(result, dict):
        return [(result["token"], result["token_str"], result["sequence"], float(result["score"]))]
    return [c for r in result for c in _candidates(r)]


def test_fill_mask_top_k_none_is_the_default_as_transformers(tmp_path_factory, minilm_dir, hf_tok):
    # transformers reads top_k=None (and targets=None) as not given: 5 candidates; bertkit refused None as no int
    d, hf_model = tiny_dir(tmp_path_factory, minilm_dir, "BertForMaskedLM")
    fill = bertkit.pipeline("fill-mask", d)
    text = "the [MASK] sat on the mat ."
    got = fill(text, top_k=None, targets=None)
    ref = transformers.pipeline("fill-mask", model=hf_model, tokenizer=hf_tok, device="cpu")(text, top_k=None)
    assert got == fill(text) and len(got) == 5
    assert [c[:3] for c in _candidates(got)] == [c[:3] for c in _candidates(ref)]
    np.testing.assert_allclose([c["score"] for c in got], [c["score"] for c in ref], atol=1e-5, rtol=0)

def test_fill_mask_top_k_past_the_vocabulary_is_refused(tmp_path_factory, minilm_dir, hf_tok):
    # top_k 30,523 on a 30,522-token vocabulary answered 30,522 candidates, fewer than asked and without a word (`bertkit
    # predict --top-k 40000` wrote an 11 MB file); transformers' pipeline fails inside torch.topk after the model ran
    d, hf_model = tiny_dir(tmp_path_factory, minilm_dir, "BertForMaskedLM")
    fill = bertkit.pipeline("fill-mask", d)
    with pytest.raises(BertkitError, match=r"^top_k 30523 exceeds the 30522 tokens of this model's vocabulary, every "
                                           r"candidate a \[MASK\] has: ask for top_k 30522 or fewer$"):
        fill("the [MASK] sat .", top_k=30523)
    every = fill("the [MASK] sat .", top_k=30522)  # the whole vocabulary, best first: the probabilities sum to 1
    assert len(every) == 30522 and abs(sum(c["score"] for c in every) - 1) < 1e-5
    ref = transformers.pipeline("fill-mask", model=hf_model, tokenizer=hf_tok, device="cpu")("the [MASK] sat .", top_k=3)
    assert [c["token"] for c in every[:3]] == [c["token"] for c in ref]
    np.testing.assert_allclose([c["score"] for c in every[:3]], [c["score"] for c in ref], rtol=1e-5, atol=0)


def test_fill_mask_never_answers_a_row_past_the_tokenizer(tmp_path_factory, minilm_dir, hf_tok):
    """After add_tokens and resize_token_embeddings(len(tok), pad_to_multiple_of=64) the rows past len(tok) hold no
    token; scored high (here by their bias), they were candidates and decode failed with "token id 30523 is outside
    the vocabulary" (transformers lists them with token_str ""). They are left out, the scores those of the softmax
    over every row, and top_k counts the tokenizer's tokens."""
    d, _ = tiny_dir(tmp_path_factory, minilm_dir, "BertForMaskedLM")
    tok = bertkit.AutoTokenizer.from_pretrained(d)
    model = bertkit.BertForMaskedLM.from_pretrained(d).eval()
    tok.add_tokens(["covid19"])
    model.resize_token_embeddings(len(tok), pad_to_multiple_of=64)
    assert (len(tok), model.config.vocab_size) == (30523, 30528)
    with torch.no_grad():
        model.cls.predictions.bias[30523:] = 50.0
        model.cls.predictions.bias[30522] = 40.0
    fill = bertkit.pipeline("fill-mask", model=model, tokenizer=tok)
    best = fill("the [MASK] sat .", top_k=2)
    assert [c["token"] for c in best] == [30522, best[1]["token"]] and best[1]["token"] < 30522
    assert best[0]["token_str"] == "covid19" and best[0]["sequence"] == "the covid19 sat."
    assert best[0]["score"] < 1e-4  # the five rows past the tokenizer take the rest of the probability
    with pytest.raises(BertkitError, match="top_k 30524 exceeds the 30523 tokens"):
        fill("the [MASK] sat .", top_k=30524)


@pytest.mark.parametrize("task,num_labels", [("text-classification", 3), ("multiple-choice", 1)])
def test_a_token_classifier_is_refused_by_the_pipelines_whose_head_reads_the_pooler(tmp_path_factory, minilm_dir, task,
                                                                                    num_labels):
    """A token-classification checkpoint has a classifier.weight of the shape these heads take, but no pooler (their
    classifier reads the pooled [CLS]): loaded, its pooler would be random and every score noise."""
    d, _ = tiny_dir(tmp_path_factory, minilm_dir, "BertForTokenClassification", num_labels=num_labels)
    with pytest.raises(BertkitError, match=f"has no {task} head \\(its weights lack pooler.dense.weight\\)"):
        bertkit.pipeline(task, d)


@pytest.mark.parametrize("hf_class,num_labels,task", [("BertForSequenceClassification", 1, "multiple-choice"),
                                                      ("BertForSequenceClassification", 3, "token-classification"),
                                                      ("BertForMultipleChoice", 1, "text-classification"),
                                                      ("BertForTokenClassification", 3, "token-classification")])
def test_a_classifier_trained_for_another_task_is_refused_by_the_class_its_config_names(
        tmp_path_factory, minilm_dir, hf_class, num_labels, task):
    """Sequence, token and multiple-choice classifiers store the same weights (classifier.weight; a one-output
    regressor's has a multiple-choice head's shape): an STS-B regressor loaded for multiple choice ran and scored the
    choices with its similarity head. config.json's architectures tells them apart, and a mismatch is refused."""
    d, _ = tiny_dir(tmp_path_factory, minilm_dir, hf_class, num_labels=num_labels)
    if hf_class == "BertForTokenClassification":  # its own task loads, as before
        assert bertkit.pipeline(task, d).model_class.__name__ == hf_class
        return
    with pytest.raises(BertkitError, match=f"config.json names {hf_class}, not the .* {task} runs: its classifier was "
                                           "trained for another task"):
        bertkit.pipeline(task, d)


def test_call_options_given_to_pipeline_are_refused(tmp_path_factory, minilm_dir):
    # transformers' pipeline("fill-mask", model, top_k=3) answers 3 candidates per call; bertkit's failed with a bare
    # TypeError from Pipeline.__init__
    d, _ = tiny_dir(tmp_path_factory, minilm_dir, "BertForMaskedLM")
    with pytest.raises(BertkitError, match=r"pipeline\('fill-mask', \.\.\., top_k=3\): top_k is an option of each "
                                           r"call here, not of pipeline\(\) .*pipe\(inputs, top_k=3\)"):
        bertkit.pipeline("fill-mask", d, top_k=3)
    assert len(bertkit.pipeline("fill-mask", d)("a [MASK] b", top_k=3)) == 3


def test_transformers_construction_of_a_directory_pipeline_is_taken(tmp_path_factory, minilm_dir):
    """transformers' scripts write pipeline(task, model=d, tokenizer=d, device=-1): the directory named twice, and -1
    for the CPU. bertkit refused both (tokenizer= only with a model object; device '-1' no device)."""
    d, _ = tiny_dir(tmp_path_factory, minilm_dir, "BertForSequenceClassification")
    text = "a gorgeous film"
    ref = transformers.pipeline("text-classification", model=str(d), tokenizer=str(d), device=-1)(text, top_k=None)
    got = bertkit.pipeline("text-classification", model=d, tokenizer=str(d), device=-1)(text)
    assert got == bertkit.pipeline("text-classification", d)(text)
    np.testing.assert_allclose([got["scores"][r["label"]] for r in ref], [r["score"] for r in ref], atol=1e-5, rtol=0)
    with pytest.raises(BertkitError, match=r"^tokenizer= goes with a model object; a checkpoint directory brings its "
                                           r"own vocab.txt \(tokenizer='.*', the model's own directory, is taken; got "
                                           r"'.*minilm'\)$"):
        bertkit.pipeline("text-classification", model=d, tokenizer=str(minilm_dir))
    with pytest.raises(BertkitError, match=r"^device '-2' is not a device: use auto, cpu, cuda or cuda:N$"):
        bertkit.pipeline("text-classification", d, device=-2)

def test_a_calls_length_options_are_refused_naming_the_pipelines_max_length(tmp_path_factory, minilm_dir):
    # transformers' classifier(text, truncation=True, max_length=64) cuts at 64; the refusal here said only "its
    # options are none", not that the length is the pipeline's, given when it is made
    d, _ = tiny_dir(tmp_path_factory, minilm_dir, "BertForSequenceClassification")
    with pytest.raises(BertkitError, match=r"does not take max_length, truncation; its options are none; instead of "
                                           r"max_length, truncation: sequences hold at most the pipeline's max_length "
                                           r"tokens \(a text is cut there\), given when it is made: "
                                           r"bertkit.pipeline\(task, model, max_length=N\)$"):
        bertkit.pipeline("text-classification", d)("a b", truncation=True, max_length=64)
    assert bertkit.pipeline("text-classification", d, max_length=64).max_length == 64


def test_question_and_context_as_keywords_are_refused_naming_the_dict(tmp_path_factory, minilm_dir):
    # transformers' question-answering is called pipe(question=..., context=...); bertkit's ended in a bare TypeError
    # (missing 'inputs') that named neither the task nor the input it takes
    d, _ = tiny_dir(tmp_path_factory, minilm_dir, "BertForQuestionAnswering")
    qa = bertkit.pipeline("question-answering", d)
    with pytest.raises(BertkitError, match=r"question-answering takes each input as one dict, not as keywords "
                                           r"\(question=, context=\): pipe\(\{'question': \.\.\., 'context': \.\.\.\}\)"):
        qa(question="Who sang?", context="Ella sang.")
    answer = qa({"question": "Who sang?", "context": "Ella sang."})
    assert "Ella sang."[answer["start"]:answer["end"]] == answer["answer"] != ""


def test_an_option_no_pipeline_takes_is_refused_naming_the_task(minilm_dir):
    # transformers' aggregation_strategy (or a typo) ended in a bare TypeError from Pipeline.__init__ that named
    # neither the task nor what it takes; the model is not loaded first
    with pytest.raises(BertkitError, match=r"pipeline\('feature-extraction'\) does not take aggregation_strategy, "
                                           r"poolng; it takes batch_size, .*normalize, pooling, .*; per call: prompt_name"):
        bertkit.pipeline("feature-extraction", minilm_dir, poolng="cls", aggregation_strategy="simple")
    assert len(bertkit.pipeline("feature-extraction", minilm_dir, pooling="cls", truncate_dim=8)("a b")) == 8
    # transformers' dtype= / torch_dtype= (weights loaded in bf16): the refusal names bf16=True, bertkit's bf16
    for name in ("dtype", "torch_dtype"):
        with pytest.raises(BertkitError, match=rf"does not take {name}; .* instead of {name}: bf16=True computes in "
                                               r"bfloat16 \(autocast over the checkpoint's weights\)"):
            bertkit.pipeline("text-classification", minilm_dir, **{name: torch.bfloat16})


def test_feature_extraction_per_token_is_transformers_feature_extraction(minilm_2_layers, sst2, data_dir):
    """transformers' feature-extraction pipeline answers every token's vector ([CLS] and [SEP] too): bertkit's with
    pooling="none" answers the same (within 1e-5), and a call's return_tensors= is refused naming it."""
    texts = sst2[:20] + [p["context"] for p in json.loads((data_dir / "squad/dev-v1.1.json").read_text())["data"][0][
        "paragraphs"][:4]]
    ours = bertkit.pipeline("feature-extraction", minilm_2_layers, pooling="none", batch_size=8)(texts)
    theirs = transformers.pipeline("feature-extraction", model=str(minilm_2_layers), device="cpu")
    for text, o in zip(texts, ours, strict=True):
        np.testing.assert_allclose(np.array(o), np.array(theirs(text))[0], atol=1e-5, rtol=0)
    with pytest.raises(BertkitError, match=r"instead of return_tensors: .*pooling=\"none\""):
        bertkit.pipeline("feature-extraction", minilm_2_layers)("a b", return_tensors=True)


def test_fill_mask_refuses_a_mask_past_max_length(tmp_path_factory, minilm_dir, hf_tok):
    # the second [MASK] lies past max_length: the answer was the first mask's candidates alone, a flat list as for a
    # one-mask text, the second mask dropped without a word
    d, hf_model = tiny_dir(tmp_path_factory, minilm_dir, "BertForMaskedLM")
    fill = bertkit.pipeline("fill-mask", d, max_length=16)
    text = "the [MASK] sat on the mat and then it went on and on and on and on and on [MASK] ."
    with pytest.raises(BertkitError, match=r"has 2 \[MASK\] tokens, 1 of them past its first 16 tokens"):
        fill(text)
    # its only [MASK] past max_length: the refusal said the text had none and to write one
    with pytest.raises(BertkitError, match=r"has its only \[MASK\] token past its first 16 tokens \(max_length\), "
                                           r"which the model does not read: shorten the text before it, or raise "
                                           r"max_length \(up to 512"):
        fill("it went on and on and on and on and on and on and then the [MASK] sat .")
    # at the model's 512 positions the fix named a larger max_length ("up to 512"), which it refuses
    whole = bertkit.pipeline("fill-mask", d)
    with pytest.raises(BertkitError, match=r"past its first 512 tokens \(max_length\), which the model does not read: "
                                           r"shorten the text before it \(max_length 512 is already all of the "
                                           r"model's 512 positions\)$"):
        whole("the cat sat " * 200 + "[MASK] .")
    short = "the [MASK] sat on the mat and [MASK] ."  # both within 16 tokens: one list per mask, transformers' numbers
    ref = transformers.pipeline("fill-mask", model=hf_model, tokenizer=hf_tok, device="cpu", top_k=2)(short)
    got = fill(short, top_k=2)
    assert [[c["token"] for c in m] for m in got] == [[c["token"] for c in m] for m in ref]
    np.testing.assert_allclose([[c["score"] for c in m] for m in got], [[c["score"] for c in m] for m in ref],
                               atol=1e-5, rtol=0)


# ---------------------------------------------------------------------------------------------------
# text-classification
# ---------------------------------------------------------------------------------------------------


def test_text_classification_single_and_pairs(tmp_path_factory, minilm_dir, hf_tok, sst2, rte):
    labels = {0: "negative", 1: "neutral", 2: "positive"}
    d, hf_model = tiny_dir(tmp_path_factory, minilm_dir, "BertForSequenceClassification", id2label=labels,
                            label2id={v: k for k, v in labels.items()})
    clf = bertkit.pipeline("text-classification", d, batch_size=7)
    texts = sst2[:40]
    got = clf(texts)
    for o, logits in zip(got, _hf_logits(hf_model, hf_tok, texts), strict=True):
        p = torch.tensor(logits).double().softmax(-1).numpy()
        np.testing.assert_allclose([o["scores"][labels[i]] for i in range(3)], p, atol=1e-5, rtol=0)
        assert o["label"] == labels[int(p.argmax())] and o["score"] == pytest.approx(p.max(), abs=1e-5)
    a, b = [x for x, _ in rte[:20]], [y for _, y in rte[:20]]
    got = clf(list(zip(a, b)))
    single = clf({"text": a[3], "text_pair": b[3]})
    assert single["label"] == got[3]["label"] and single["score"] == pytest.approx(got[3]["score"], abs=1e-6)
    for o, logits in zip(got, _hf_logits(hf_model, hf_tok, a, b), strict=True):
        p = torch.tensor(logits).double().softmax(-1).numpy()
        np.testing.assert_allclose([o["scores"][labels[i]] for i in range(3)], p, atol=1e-5, rtol=0)
    json.dumps(got)  # JSON-able
    with pytest.raises(BertkitError, match="input 1 is int"):
        clf(["fine", 3])


def test_text_classification_regression_returns_the_value(tmp_path_factory, minilm_dir, hf_tok, sst2):
    d, hf_model = tiny_dir(tmp_path_factory, minilm_dir, "BertForSequenceClassification", num_labels=1)
    got = bertkit.pipeline("text-classification", d)(sst2[:10])
    ref = _hf_logits(hf_model, hf_tok, sst2[:10])
    np.testing.assert_allclose([o["value"] for o in got], [r[0] for r in ref], atol=1e-5, rtol=0)


def test_text_classification_regression_returns_every_output(tmp_path_factory, minilm_dir, hf_tok):
    # a regression head with several targets: each output's value by label name (the first alone was returned, the
    # others dropped without a word; transformers' pipeline answers all of them)
    d, hf_model = tiny_dir(tmp_path_factory, minilm_dir, "BertForSequenceClassification", num_labels=3,
                            id2label={0: "valence", 1: "arousal", 2: "dominance"}, problem_type="regression")
    texts = ["a gripping, beautifully shot film", "dull.", "I would not watch it again", "Héllo, naïve café!"]
    got = bertkit.pipeline("text-classification", d)(texts)
    ref = _hf_logits(hf_model, hf_tok, texts)
    assert all(set(o) == {"values"} and list(o["values"]) == ["valence", "arousal", "dominance"] for o in got)
    np.testing.assert_allclose([list(o["values"].values()) for o in got], ref, atol=1e-5, rtol=0)
    theirs = transformers.pipeline("text-classification", model=str(d))(texts[0], top_k=None)
    assert {r["label"]: r["score"] for r in theirs} == pytest.approx(got[0]["values"], abs=1e-5)


def test_one_label_single_label_classifier_is_refused(tmp_path_factory, minilm_dir):
    # a softmax over one label: the pipeline scored every text 1.0 ({"label": "LABEL_0", "score": 1.0}); transformers
    # refuses the config when it loads
    d, _ = tiny_dir(tmp_path_factory, minilm_dir, "BertForSequenceClassification", num_labels=1)
    config = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**config, "problem_type": "single_label_classification"}))
    with pytest.raises(ValueError, match="requires `num_labels > 1`"):
        transformers.BertConfig.from_pretrained(d)
    with pytest.raises(BertkitError, match=r"'single_label_classification' needs num_labels > 1, got 1 label "
                                           r"\['LABEL_0'\]: a softmax over one label scores every input 1.0"):
        bertkit.pipeline("text-classification", d)
    (d / "config.json").write_text(json.dumps({**config, "problem_type": "multi_label_classification"}))
    assert bertkit.pipeline("text-classification", d)("a fine film")["scores"]["LABEL_0"] == pytest.approx(
        transformers.pipeline("text-classification", model=str(d))("a fine film")[0]["score"], abs=1e-5)


def test_text_classification_refuses_two_labels_of_one_name(tmp_path_factory, minilm_dir):
    # scores keyed by name: label 0's score was overwritten by label 1's ({"x": 0.335, "y": 0.333}, two of three
    # scores; transformers' pipeline lists all three, two named "x")
    d, _ = tiny_dir(tmp_path_factory, minilm_dir, "BertForSequenceClassification", num_labels=3,
                     id2label={0: "x", 1: "x", 2: "y"})
    theirs = transformers.pipeline("text-classification", model=str(d))("a fine film", top_k=None)
    assert sorted(r["label"] for r in theirs) == ["x", "x", "y"]
    with pytest.raises(BertkitError, match=r"several labels one name \('x' names ids \[0, 1\]\)"):
        bertkit.pipeline("text-classification", d)
    config = json.loads((d / "config.json").read_text())
    config["id2label"], config["label2id"] = {"0": "x", "1": "z", "2": "y"}, {"x": 0, "z": 1, "y": 2}
    (d / "config.json").write_text(json.dumps(config))
    ours = bertkit.pipeline("text-classification", d)("a fine film")["scores"]
    theirs = transformers.pipeline("text-classification", model=str(d))("a fine film", top_k=None)
    assert ours == pytest.approx({r["label"]: r["score"] for r in theirs}, abs=1e-5)


def test_results_keep_input_order_whatever_the_batching(tmp_path_factory, minilm_dir, sst2):
    d, _ = tiny_dir(tmp_path_factory, minilm_dir, "BertForSequenceClassification")
    texts = sst2[:50]
    one_by_one = [bertkit.pipeline("text-classification", d, batch_size=1)(t) for t in texts[:10]]
    batched = bertkit.pipeline("text-classification", d, batch_size=8)(texts)
    for a, b in zip(one_by_one, batched[:10]):
        np.testing.assert_allclose(list(a["scores"].values()), list(b["scores"].values()), atol=1e-5, rtol=0)
    perm = list(range(len(texts)))
    random.Random(1).shuffle(perm)
    shuffled = bertkit.pipeline("text-classification", d, batch_size=8)([texts[i] for i in perm])
    for k, i in enumerate(perm):
        np.testing.assert_allclose(list(shuffled[k]["scores"].values()), list(batched[i]["scores"].values()),
                                   atol=1e-5, rtol=0)


def test_a_map_style_dataset_is_read_as_transformers_key_dataset_is(tmp_path_factory, minilm_dir, hf_tok):
    """transformers' ``pipe(KeyDataset(dataset, "text"))`` (a torch Dataset: __len__ and __getitem__, no __iter__)
    gives each row's result, as an iterator that reads the dataset as its results are taken (transformers' too); bertkit
    refused it as no list of inputs, then read it whole into a list of results."""
    from transformers.pipelines.pt_utils import KeyDataset

    d, hf_model = tiny_dir(tmp_path_factory, minilm_dir, "BertForSequenceClassification")
    read = []

    class Rows(list):
        def __getitem__(self, i):
            read.append(i)
            return super().__getitem__(i)

    rows = Rows([{"text": "a gorgeous film", "label": 1}, {"text": "dull and long", "label": 0},
                 {"text": "fine", "label": 1}])
    column = KeyDataset(rows, "text")
    streamed = bertkit.pipeline("text-classification", d, batch_size=2)(column)
    assert read == [] and isinstance(streamed, Iterator)
    first = next(streamed)
    assert read == [0, 1]  # one batch of the dataset read for the first result
    ours = [first, *streamed]
    read.clear()
    ref = list(transformers.pipeline("text-classification", model=hf_model, tokenizer=hf_tok, device="cpu")(
        column, top_k=None))
    assert len(ours) == len(ref) == 3
    for o, r in zip(ours, ref, strict=True):
        assert o["label"] == r[0]["label"]
        np.testing.assert_allclose([o["scores"][x["label"]] for x in r], [x["score"] for x in r], atol=1e-5, rtol=0)
    listed = bertkit.pipeline("text-classification", d)([r["text"] for r in rows])
    assert [o["label"] for o in ours] == [o["label"] for o in listed]
    # the same rows batched beside other neighbours (two batches of the dataset, one of the list): float32 rounding
    np.testing.assert_allclose([o["score"] for o in ours], [o["score"] for o in listed], atol=1e-6, rtol=0)

# ---------------------------------------------------------------------------------------------------
# question-answering
# ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def squad_all(data_dir) -> list[squad.SquadExample]:
    return squad.read_squad(data_dir / "squad/dev-v1.1.json")


@pytest.fixture(scope="module")
def squad_examples(squad_all) -> list[squad.SquadExample]:
    return squad_all[:40]


def test_question_answering_equals_the_squad_recipe(tmp_path_factory, minilm_dir, squad_examples):
    """Windows of 128 tokens sharing 48 context tokens (``doc_stride`` as transformers means it) force several per
    context; answers must be what featurize_squad at the step those windows make + the transformers model's logits
    + postprocess_predictions give, and map back to the context exactly."""
    d, hf_model = tiny_dir(tmp_path_factory, minilm_dir, "BertForQuestionAnswering")
    tok = bertkit.BertTokenizer.from_pretrained(d)
    qa = bertkit.pipeline("question-answering", d, max_length=128, batch_size=6)
    refs, windows = {}, 0
    for ex in squad_examples:  # the step depends on the question's length: one example at a time
        step = qa.window_step(ex.question, 48, 64)
        features = squad.featurize_squad([ex], tok, max_seq_length=128, doc_stride=step)
        windows += len(features)
        starts, ends = [], []
        with torch.no_grad():
            for f in features:
                out = hf_model(**{k: torch.tensor([f[k]]) for k in ("input_ids", "token_type_ids", "attention_mask")})
                starts.append(out.start_logits[0].numpy())
                ends.append(out.end_logits[0].numpy())
        refs[ex.qas_id] = squad.postprocess_predictions([ex], features, starts, ends)
    assert windows > 1.5 * len(squad_examples)  # real sliding windows
    inputs = [{"question": ex.question, "context": ex.context} for ex in squad_examples]
    got = qa(inputs, doc_stride=48, top_k=3)
    for ex, o in zip(squad_examples, got, strict=True):
        ref = refs[ex.qas_id]
        assert o["answer"] == ref.predictions[ex.qas_id]
        assert ex.context[o["start"]:o["end"]] == o["answer"]
        assert o["score"] == pytest.approx(ref.nbest[ex.qas_id][0]["probability"], abs=1e-5)
        assert len(o["nbest"]) == 3 and all(ex.context[n["start"]:n["end"]] == n["answer"] for n in o["nbest"])
    json.dumps(got)


def test_question_answering_top_k_changes_neither_answer_nor_scores(tmp_path_factory, minilm_dir):
    # top_k was the recipe's n-best size too (max(20, top_k)): more candidates entered each window's search and the
    # softmax over them, so asking for more alternatives changed the answer ("St" at score 1.0 with top_k 1,
    # "000" at 0.035 with top_k 100) and every score
    d, hf_model = tiny_dir(tmp_path_factory, minilm_dir, "BertForQuestionAnswering")
    qa = bertkit.pipeline("question-answering", d)
    item = {"question": "What is the thing?", "context": "U.S. İstanbul café tower's İstanbul , $3,000 The "
            "antidisestablishmentarianism Eiffel U.S. Straße (1889) don't . Straße e-mail Eiffel (1889) tower's"}
    tok = bertkit.BertTokenizer.from_pretrained(d)
    features = squad.featurize_squad([squad.SquadExample("q", "", item["question"], item["context"], ())], tok,
                                     max_seq_length=512, doc_stride=128, max_query_length=64)
    with torch.no_grad():
        out = hf_model(**{k: torch.tensor([features[0][k]]) for k in ("input_ids", "token_type_ids",
                                                                         "attention_mask")})
    ref = squad.postprocess_predictions([squad.SquadExample("q", "", item["question"], item["context"], ())],
                                        features, out.start_logits.numpy(), out.end_logits.numpy(),
                                        n_best_size=20, max_answer_length=2)
    answers = [qa(item, top_k=k, max_answer_length=2) for k in (1, 5, 20)]
    for k, a in zip((1, 5, 20), answers):
        assert a["answer"] == ref.predictions["q"] and len(a["nbest"]) == min(k, len(ref.nbest["q"]))
        np.testing.assert_allclose([n["score"] for n in a["nbest"]],
                                   [n["probability"] for n in ref.nbest["q"][:k]], atol=1e-6, rtol=0)
    with pytest.raises(BertkitError, match=re.escape("top_k must be an int in [1, 20] (the SQuAD recipe's n-best size), "
                                                     "got 21")):
        qa(item, top_k=21)


@pytest.mark.parametrize("threshold", [float("nan"), float("inf"), "1"])
def test_question_answering_refuses_a_null_threshold_that_is_not_a_finite_number(threshold):
    # NaN would quietly never answer "" (score_diff > nan is False); serve refuses the same values.
    with pytest.raises(BertkitError, match=f"null_threshold must be a finite number, got {threshold!r}"):
        QuestionAnsweringPipeline.check_options({"allow_no_answer": True, "null_threshold": threshold})


@pytest.mark.parametrize(("option", "value", "message"), [
    ("max_answer_length", 0, "max_answer_length must be an int of at least 1, got 0"),
    ("max_answer_length", True, "max_answer_length must be an int of at least 1, got True"),
    ("max_answer_length", 2.5, "max_answer_length must be an int of at least 1, got 2.5"),
    ("max_question_length", 0, "max_question_length must be an int of at least 1, got 0"),
    ("max_question_length", -1, "max_question_length must be an int of at least 1, got -1"),
    ("doc_stride", -1, "doc_stride must be an int of at least 0, got -1"),
    ("doc_stride", 2.5, "doc_stride must be an int of at least 0, got 2.5"),
    ("allow_no_answer", "yes", "allow_no_answer must be true or false, got 'yes'"),
])
def test_question_answering_refuses_sizes_that_would_answer_quietly_wrong(option, value, message):
    # max_answer_length 0 answered "" at score 0; max_question_length 0 dropped the question (-1: its last token);
    # "yes" was taken for True: each refused before the model runs, as serve refuses them
    with pytest.raises(BertkitError, match=re.escape(message)):
        QuestionAnsweringPipeline.check_options({option: value})
    QuestionAnsweringPipeline.check_options({"max_answer_length": 1, "max_question_length": 1, "doc_stride": 0,
                                             "allow_no_answer": True})


@pytest.mark.parametrize(("theirs", "ours"), [
    ("max_answer_len", "max_answer_length=N, the same limit"), ("max_question_len", "max_question_length=N, the same"),
    ("handle_impossible_answer", "allow_no_answer=True: \"\" when the null score beats the best span"),
    ("align_to_words", "answers are the token span the SQuAD recipe scores")])
def test_question_answering_refuses_transformers_names_naming_its_own(theirs, ours):
    # a port's qa(..., max_answer_len=10) was refused with the list of options, which never said that max_answer_length
    # is the same limit (bertkit serve takes transformers' names, so only the pipeline's refusal has to say it)
    with pytest.raises(BertkitError, match=rf"does not take {theirs}; .*; instead of {theirs}: {re.escape(ours)}"):
        QuestionAnsweringPipeline.check_options({theirs: True})


def test_question_answering_long_context_and_no_answer(tmp_path_factory, minilm_dir, squad_all):
    d, _ = tiny_dir(tmp_path_factory, minilm_dir, "BertForQuestionAnswering")
    qa = bertkit.pipeline("question-answering", d)
    squad_examples = squad_all[:300]
    long_context = " ".join(dict.fromkeys(ex.context for ex in squad_examples))  # several paragraphs
    assert len(bertkit.BertTokenizer.from_pretrained(d).tokenize(long_context)) > 1500
    item = {"question": squad_examples[0].question, "context": long_context}
    o = qa(item)
    assert o["answer"] and long_context[o["start"]:o["end"]] == o["answer"]
    never = qa(item, allow_no_answer=True, null_threshold=1e9)
    always = qa(item, allow_no_answer=True, null_threshold=-1e9)
    assert never["answer"] == o["answer"]
    assert always["answer"] == "" and always["start"] is None and 0 < always["score"] <= 1
    with pytest.raises(BertkitError, match=r"question-answering input 0 is dict .*; expected \{'question': str, "
                                           r"'context': str\}"):
        qa([{"question": "who?"}])


# ---------------------------------------------------------------------------------------------------
# multiple-choice
# ---------------------------------------------------------------------------------------------------


def test_multiple_choice_matches_transformers(tmp_path_factory, minilm_dir, hf_tok, sst2):
    d, hf_model = tiny_dir(tmp_path_factory, minilm_dir, "BertForMultipleChoice")
    items = [{"context": sst2[i], "choices": sst2[i + 1:i + 3 + i % 2]} for i in range(0, 60, 4)]  # 2 or 3 choices
    got = bertkit.pipeline("multiple-choice", d, batch_size=4)(items)
    for item, o in zip(items, got, strict=True):
        n = len(item["choices"])
        enc = hf_tok([item["context"]] * n, item["choices"], padding=True, return_tensors="pt")
        with torch.no_grad():
            p = hf_model(**{k: v[None] for k, v in enc.items()}).logits[0].double().softmax(-1).numpy()
        np.testing.assert_allclose(o["scores"], p, atol=1e-5, rtol=0)
        assert o["choice"] == int(p.argmax()) and o["text"] == item["choices"][o["choice"]]


# ---------------------------------------------------------------------------------------------------
# sentence embeddings
# ---------------------------------------------------------------------------------------------------


def test_sentence_embeddings_equal_sentence_transformers(minilm_dir, sst2, monkeypatch):
    """MiniLM is all-MiniLM-L6-v2: mean pooling + L2 normalisation must give sentence-transformers' vectors."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    st = pytest.importorskip("sentence_transformers", reason="pip install sentence-transformers (test extra)")
    try:  # sentence-transformers >= 6 moved the modules
        from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer
    except ImportError:
        from sentence_transformers.models import Normalize, Pooling, Transformer
    word = Transformer(str(minilm_dir), max_seq_length=256)
    width = getattr(word, "get_embedding_dimension", None) or word.get_word_embedding_dimension  # renamed in 5.x
    ref_model = st.SentenceTransformer(modules=[word, Pooling(width(), "mean"),
                                                Normalize()], device="cpu")
    texts = sst2[:64]
    ref = ref_model.encode(texts, batch_size=16, convert_to_numpy=True)
    got = np.array(bertkit.pipeline("sentence-embedding", minilm_dir, batch_size=16)(texts))
    np.testing.assert_allclose(got, ref, atol=1e-5, rtol=0)
    assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-6)


def test_max_length_above_the_tokenizers_model_max_length_cuts_there(minilm_2_layers, tmp_path, data_dir,
                                                                      monkeypatch):
    """Under 512 positions, a tokenizer_config.json saying model_max_length 24 (where sentence-transformers 6 saves a
    model's max_seq_length; its sentence_bert_config.json then declares none): max_length=40 cuts texts at 40, as
    transformers' pipeline given truncation=True, max_length=40 and sentence-transformers given max_seq_length 40 do.
    bertkit refused it ("max_length 40 is outside [8, 24]"), and took it where sentence_bert_config.json declared
    the 24."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    st = pytest.importorskip("sentence_transformers")
    text = json.loads((data_dir / "squad/dev-v1.1.json").read_text())["data"][0]["paragraphs"][0]["context"]
    plain = tmp_path / "plain"
    shutil.copytree(minilm_2_layers, plain)
    config = json.loads((plain / "tokenizer_config.json").read_text())
    (plain / "tokenizer_config.json").write_text(json.dumps({**config, "model_max_length": 24}))
    theirs = transformers.pipeline("feature-extraction", model=str(plain), device="cpu",
                                   tokenize_kwargs={"truncation": True, "max_length": 40})(text)
    ours = bertkit.pipeline("feature-extraction", plain, pooling="none", max_length=40)(text)
    assert np.array(ours).shape == (40, 384)
    np.testing.assert_allclose(ours, np.array(theirs)[0], atol=1e-5, rtol=0)
    model = st.SentenceTransformer(str(plain), device="cpu")
    model.save(str(tmp_path / "st6"))
    assert "max_seq_length" not in json.loads((tmp_path / "st6" / "sentence_bert_config.json").read_text())
    model.max_seq_length = 40
    ours = bertkit.pipeline("sentence-embedding", tmp_path / "st6", max_length=40)([text])
    np.testing.assert_allclose(ours, model.encode([text], normalize_embeddings=True), atol=1e-5, rtol=0)
    # a directory declaring max_seq_length 4 (sentence-transformers loads it) is refused, and the refusal says where
    # the 4 came from and what to pass (it named max_length, which the call did not give)
    model.max_seq_length = 4
    model.save(str(tmp_path / "st4"))
    with pytest.raises(BertkitError, match=r"got 4 \(max_length=, else a sentence-transformers directory's "
                                           r"max_seq_length .*\): pass max_length=8 or more"):
        bertkit.pipeline("sentence-embedding", tmp_path / "st4")


def test_feature_extraction_cls_and_tokens(minilm_2_layers, sst2):
    texts = sst2[:12]
    hf = transformers.BertModel.from_pretrained(minilm_2_layers).eval()
    hf_tok = transformers.BertTokenizerFast.from_pretrained(minilm_2_layers)
    cls = bertkit.pipeline("feature-extraction", minilm_2_layers, pooling="cls", batch_size=5)(texts)
    tokens = bertkit.pipeline("feature-extraction", minilm_2_layers, pooling="none", batch_size=5)(texts)
    for t, c, tok_states in zip(texts, cls, tokens, strict=True):
        with torch.no_grad():
            ref = hf(**hf_tok(t, return_tensors="pt")).last_hidden_state[0].numpy()
        np.testing.assert_allclose(c, ref[0], atol=1e-5, rtol=0)
        np.testing.assert_allclose(np.array(tok_states), ref, atol=1e-5, rtol=0)
    bf16 = np.array(bertkit.pipeline("sentence-embedding", minilm_2_layers, bf16=True)(texts))
    fp32 = np.array(bertkit.pipeline("sentence-embedding", minilm_2_layers)(texts))
    assert (bf16 * fp32).sum(1).min() > 0.99  # cosine similarity: bf16 rounding, not a different vector
    with pytest.raises(BertkitError, match="pooling 'attention'"):
        bertkit.pipeline("feature-extraction", minilm_2_layers, pooling="attention")
    with pytest.raises(BertkitError, match="unknown pipeline task"):
        bertkit.pipeline("summarization", minilm_2_layers)


def test_bf16_on_a_cpu_without_bf16_instructions_warns_once(minilm_2_layers, monkeypatch, caplog):
    """On an AVX2-only CPU bf16 autocast runs emulated, several times slower than fp32: say so, once."""
    from bertkit import _hardware

    _hardware.warn_if_bf16_is_emulated.cache_clear()
    monkeypatch.setattr(_hardware, "cpu_has_bf16", lambda: False)
    with caplog.at_level("WARNING", logger="bertkit"):
        bertkit.pipeline("feature-extraction", minilm_2_layers, bf16=True)
        bertkit.pipeline("feature-extraction", minilm_2_layers, bf16=True)
        bertkit.pipeline("feature-extraction", minilm_2_layers)
    warned = [r for r in caplog.records if "no bf16 instructions" in r.getMessage()]
    assert len(warned) == 1 and "Leave bf16 off here" in warned[0].getMessage()
    _hardware.warn_if_bf16_is_emulated.cache_clear()
    monkeypatch.setattr(_hardware, "cpu_has_bf16", lambda: True)
    assert _hardware.warn_if_bf16_is_emulated("cpu") is False
    assert _hardware.warn_if_bf16_is_emulated("cuda") is False  # GPUs are not this check's business
    _hardware.warn_if_bf16_is_emulated.cache_clear()


def test_a_dict_input_with_a_key_the_task_does_not_read_is_refused_naming_it(tmp_path_factory, minilm_dir,
                                                                             minilm_2_layers):
    """{"text": a, "text_pairr": b} was answered as the single text a: a misspelled pair key is now refused."""
    d, _ = tiny_dir(tmp_path_factory, minilm_dir, "BertForSequenceClassification")
    clf = bertkit.pipeline("text-classification", d)
    pair = clf({"text": "A man is eating.", "text_pair": "Someone eats."})
    assert pair != clf("A man is eating.")  # the pair key is read
    with pytest.raises(BertkitError, match=r"unknown field\(s\) text_pairr; .* holds text, text_pair"):
        clf({"text": "A man is eating.", "text_pairr": "Someone eats."})
    embed = bertkit.pipeline("sentence-embedding", minilm_2_layers)
    with pytest.raises(BertkitError, match=r"input 1 has unknown field\(s\) pair;"):
        embed(["fine", {"text": "a", "pair": "b"}])
    qa_dir, _ = tiny_dir(tmp_path_factory, minilm_dir, "BertForQuestionAnswering")
    with pytest.raises(BertkitError, match=r"unknown field\(s\) top_k; .* holds question, context"):
        bertkit.pipeline("question-answering", qa_dir)({"question": "Who?", "context": "Ann came.", "top_k": 3})
    for top_k in (0, True, "3"):  # an option is checked once per call, before the model runs
        with pytest.raises(BertkitError, match=r"^top_k must be an int in \[1, 20\] \(the SQuAD recipe's n-best size\), "
                                               rf"got {re.escape(repr(top_k))}$"):
            bertkit.pipeline("question-answering", qa_dir)({"question": "Who?", "context": "Ann came."}, top_k=top_k)
    mc_dir, _ = tiny_dir(tmp_path_factory, minilm_dir, "BertForMultipleChoice")
    mc = bertkit.pipeline("multiple-choice", mc_dir)
    with pytest.raises(BertkitError, match=r"unknown field\(s\) label;"):
        mc({"context": "c", "choices": ["a", "b"], "label": 0})
    for bad in ({"context": "c", "choices": []}, {"context": "c", "choices": ["a", 1]}, {"context": "c"}, "c"):
        with pytest.raises(BertkitError, match=r"multiple-choice input 0 is \w+ .*; expected \{'context': str, "
                                               r"'choices': \[str, \.\.\.\]\} \(lists non-empty\)"):
            mc(bad)


def test_a_sentence_transformers_directory_pools_as_its_1_pooling_says(minilm_2_layers, tmp_path, caplog):
    """A CLS-pooled sentence-transformers model gives sentence-transformers' own vectors through the pipeline
    (and so through `bertkit serve` and `predict`), not mean-pooled ones; asking for another pooling warns."""
    st = pytest.importorskip("sentence_transformers")
    from sentence_transformers import models

    from bertkit.sentence.directory import read_directory

    d = tmp_path / "cls-model"
    word = models.Transformer(str(minilm_2_layers))
    model = st.SentenceTransformer(modules=[word, models.Pooling(word.get_embedding_dimension(), "cls"),
                                            models.Normalize()], device="cpu")
    model.save(str(d))
    texts = ["A man is playing a guitar.", "The new movie is awesome, the best I have seen this year.", "fine"]
    want = model.encode(texts, normalize_embeddings=True)
    assert read_directory(d).pooling.modes == ("cls",) and read_directory(minilm_2_layers).pooling is None
    got = np.asarray(bertkit.pipeline("sentence-embedding", model=str(d), progress=False)(texts))
    np.testing.assert_allclose(got, want, atol=2e-5)
    mean = np.asarray(bertkit.pipeline("sentence-embedding", model=str(d), pooling="mean", progress=False)(texts))
    assert np.abs(mean - want).max() > 0.05  # the vectors a mean would have given instead
    assert "pools by 'cls'" in caplog.text


def test_question_answering_refuses_a_null_threshold_without_allow_no_answer():
    """Was: accepted and without effect (every question answered with a span), as if the threshold were applied."""
    from bertkit.inference.pipelines import QuestionAnsweringPipeline

    with pytest.raises(BertkitError, match="null_threshold 0.5 sets when to predict no answer, which only "
                                           "allow_no_answer=True"):
        QuestionAnsweringPipeline.check_options({"null_threshold": 0.5})
    QuestionAnsweringPipeline.check_options({"null_threshold": 0.5, "allow_no_answer": True})
