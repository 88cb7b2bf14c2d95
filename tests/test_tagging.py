"""The token-classification pipeline on real text (CoNLL-2003, SQuAD dev) against transformers' on the same weights: a
tiny-config head with random weights (``pipeline_helpers.tiny_dir``), loaded by both libraries."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch

import bertkit
from bertkit.errors import BertkitError
from bertkit.inference.tagging import group_entities
from bertkit.tasks.ner import read_conll

transformers = pytest.importorskip("transformers")

from pipeline_helpers import tiny_dir  # noqa: E402 (after the skip: it imports transformers)


@pytest.fixture(scope="module")
def hf_tok(minilm_dir):
    return transformers.BertTokenizerFast.from_pretrained(minilm_dir)


# ---------------------------------------------------------------------------------------------------
# token-classification
# ---------------------------------------------------------------------------------------------------


def test_token_classification_words_tags_and_offsets(tmp_path_factory, minilm_dir, hf_tok, data_dir):
    sentences = read_conll(data_dir / "conll2003/valid.txt")[:30]
    tags = sorted({t for s in sentences for t in s.tags})
    id2label = dict(enumerate(tags))
    d, hf_model = tiny_dir(tmp_path_factory, minilm_dir, "BertForTokenClassification", id2label=id2label,
                            label2id={v: k for k, v in id2label.items()})
    texts = [" ".join(s.words) for s in sentences]
    got = bertkit.pipeline("token-classification", d, batch_size=4)(texts)
    for text, o in zip(texts, got, strict=True):
        enc = hf_tok(text, return_offsets_mapping=True, return_tensors="pt")
        offsets = enc.pop("offset_mapping")[0].tolist()
        with torch.no_grad():
            logits = hf_model(**enc).logits[0]
        word_ids = enc.word_ids()
        expected = []
        for w in sorted({w for w in word_ids if w is not None}):
            toks = [i for i, x in enumerate(word_ids) if x == w]
            p = logits[toks[0]].double().softmax(-1)
            expected.append((offsets[toks[0]][0], offsets[toks[-1]][1], id2label[int(p.argmax())], float(p.max())))
        assert [(w["start"], w["end"], w["tag"]) for w in o["words"]] == [e[:3] for e in expected]
        np.testing.assert_allclose([w["score"] for w in o["words"]], [e[3] for e in expected], atol=1e-5, rtol=0)
        for w in o["words"]:
            assert text[w["start"]:w["end"]] == w["word"]
        for e in o["entities"]:
            assert text[e["start"]:e["end"]] == e["word"]
    # Every CoNLL token is one or more whole words (punctuation splits "U.N." into four).
    for s, o in zip(sentences, got):
        assert "".join(w["word"] for w in o["words"]) == "".join(s.words)


@pytest.fixture(scope="module")
def conll_tagger(tmp_path_factory, minilm_dir, data_dir):
    """(bertkit's pipeline, transformers', texts, CoNLL sentences, the model's directory): a tiny head with CoNLL-2003's tags, and CoNLL's spaced tokens and
    SQuAD's running text to tag."""
    sentences = read_conll(data_dir / "conll2003/valid.txt")[:30]
    tags = sorted({t for s in sentences for t in s.tags})
    id2label = dict(enumerate(tags))
    d, _ = tiny_dir(tmp_path_factory, minilm_dir, "BertForTokenClassification", seed=3, id2label=id2label,
                    label2id={v: k for k, v in id2label.items()})
    contexts = [p["context"][:300] for a in json.loads((data_dir / "squad/dev-v1.1.json").read_text())["data"][:2]
                for p in a["paragraphs"][:10]]
    texts = [" ".join(s.words) for s in sentences] + contexts
    return (bertkit.pipeline("token-classification", d, batch_size=8),
            transformers.pipeline("token-classification", model=str(d), device="cpu"), texts, sentences, d)


def _same_entities(ours: list[dict], theirs: list[dict], why: object = None) -> int:
    assert [(e["entity_group"], e["start"], e["end"]) for e in ours] == \
        [(e["entity_group"], e["start"], e["end"]) for e in theirs], why
    np.testing.assert_allclose([e["score"] for e in ours], [float(e["score"]) for e in theirs], atol=1e-5)
    return len(theirs)


def test_token_classification_entities_are_transformers_first_aggregation(conll_tagger):
    """``entities`` are what transformers' pipeline gives with aggregation_strategy="first" (spans, types, scores)."""
    ours, theirs, texts, *_ = conll_tagger
    n = sum(_same_entities(o["entities"], theirs(t, aggregation_strategy="first")) for t, o in zip(texts, ours(texts)))
    assert n > 100  # a comparison of many entities, of several types
    with pytest.raises(BertkitError, match=r"instead of batch_size: the pipeline's batch_size, given when it is made"):
        ours(texts[0], batch_size=2)  # transformers' per-call batch_size; the refusal named no fix


def test_token_classification_average_and_max_are_transformers_strategies(conll_tagger):
    # "average" and "max" (how a word of several pieces is tagged) were refused, naming "first"
    ours, theirs, texts, *_ = conll_tagger
    texts = texts[-12:]  # SQuAD's running text: words of several pieces
    for strategy in ("average", "max"):
        got = ours(texts, aggregation_strategy=strategy)
        assert sum(_same_entities(o["entities"], theirs(t, aggregation_strategy=strategy), strategy)
                   for t, o in zip(texts, got)) > 50
    assert ours(texts, aggregation_strategy="max") != ours(texts)  # the strategies differ on these words
    with pytest.raises(BertkitError, match=r'^aggregation_strategy must be "first" or "average" or "max" \(how a word '
                                           r'of several pieces is tagged; bertkit tags words: "first", the default, as '
                                           r'NER models are trained; "none" and "simple" tag each piece on its own\), '
                                           r"got 'simple'$"):
        ours(texts[0], aggregation_strategy="simple")
    with pytest.raises(BertkitError, match=r"^aggregation_strategy must be .*, got 'firsts'$"):
        ours(texts[0], aggregation_strategy="firsts")


def test_token_classification_reads_a_strategy_in_any_case_as_transformers(conll_tagger):
    """transformers upper-cases the name (``AggregationStrategy("FIRST")``), so "MAX", "Average" and its enum members
    work there; bertkit refused them as no strategy."""
    from transformers.pipelines.token_classification import AggregationStrategy

    ours, theirs, texts, *_ = conll_tagger
    text = texts[-1]
    for name, given in (("max", "MAX"), ("average", "Average"), ("first", AggregationStrategy.FIRST)):
        got = ours(text, aggregation_strategy=given)
        assert got == ours(text, aggregation_strategy=name)
        assert _same_entities(got["entities"], theirs(text, aggregation_strategy=given), given) > 3


def test_token_classification_ignore_labels_as_transformers(conll_tagger):
    # ignore_labels, as transformers' (it was refused): the entity types left out, default ["O"]; a list without "O"
    # gives each run of words tagged O as an entity group "O" (tests/test_serve_wire.py, whose head tags O)
    ours, theirs, texts, *_ = conll_tagger
    texts = texts[:8]
    assert {"PER", "MISC"} & {e["entity_group"] for o in ours(texts) for e in o["entities"]}  # something to leave out
    for ignore in (["PER", "MISC"], [], ["O", "LOC", "B-ORG"]):
        for o, text in zip(ours(texts, ignore_labels=ignore), texts, strict=True):
            _same_entities(o["entities"], theirs(text, aggregation_strategy="first", ignore_labels=ignore), ignore)
    with pytest.raises(BertkitError, match=r"^ignore_labels must be a list of this model's label names \(B-LOC, B-MISC, "
                                           r".*\), got \['PERSON'\]$"):
        ours(texts[0], ignore_labels=["PERSON"])  # a misspelt type would leave out nothing


def test_token_classification_stride_reads_a_long_text_in_windows_as_transformers(conll_tagger, data_dir):
    # stride: a text past max_length read in windows sharing that many tokens, as transformers' (it was refused: the
    # text was cut at max_length)
    _, _, texts, _, d = conll_tagger
    short = bertkit.pipeline("token-classification", d, max_length=48)
    theirs = transformers.pipeline("token-classification", model=str(d), device="cpu")
    theirs.tokenizer.model_max_length = 48  # where its windows end (its pipeline takes no max_length)
    long_texts = [p["context"] for p in json.loads((data_dir / "squad/dev-v1.1.json").read_text())["data"][0]
                  ["paragraphs"][:2]]
    for strategy, stride, ignore in (("first", 0, ["O"]), ("first", 20, ["O"]), ("max", 12, [])):
        got = short(long_texts, stride=stride, aggregation_strategy=strategy, ignore_labels=ignore)
        n = 0
        for text, o in zip(long_texts, got, strict=True):
            n += _same_entities(o["entities"], theirs(text, stride=stride, aggregation_strategy=strategy,
                                                      ignore_labels=ignore), (strategy, stride))
            assert o["words"][-1]["end"] == len(text.rstrip())  # tagged to the end
        assert n > 50
    for stride in (-1, 46):  # a short text too: the refusal does not hang on a text's length
        with pytest.raises(BertkitError, match=r"^stride must be an int in \[0, 45\] \(the tokens consecutive "
                                               rf"windows share, below max_length - 2\), got {stride}$"):
            short(texts[0], stride=stride)


def test_token_classification_is_split_into_words_as_transformers(conll_tagger):
    # Pre-tokenized words, transformers' is_split_into_words=True (it was refused): one list of words is one input, a
    # list of them several; offsets into the words joined by the delimiter, as there
    ours, theirs, texts, sentences, _ = conll_tagger
    words = [list(s.words) for s in sentences[:8]]
    words[0] = [words[0][0], "", "New York", *words[0][1:]]  # an empty word, a word holding a space
    for delimiter in (None, "\t"):
        split = theirs(words, is_split_into_words=True, aggregation_strategy="first",
                       **({"delimiter": delimiter} if delimiter else {}))
        got = ours(words, is_split_into_words=True, delimiter=delimiter)
        alone = ours(words[0], is_split_into_words=True, delimiter=delimiter)  # padded in a batch of 8 above
        assert [{**w, "score": None} for w in got[0]["words"]] == [{**w, "score": None} for w in alone["words"]]
        np.testing.assert_allclose([w["score"] for w in got[0]["words"]], [w["score"] for w in alone["words"]], atol=1e-6)
        _same_entities(got[0]["entities"], alone["entities"])
        assert sum(_same_entities(o["entities"], ref) for o, ref in zip(got, split, strict=True)) > 10
    with pytest.raises(BertkitError, match=r"^delimiter must be whitespace \(BERT's tokenizer splits words there\), "
                                           r"got '\|'$"):
        ours(words[0], is_split_into_words=True, delimiter="|")
    with pytest.raises(BertkitError, match=r"^with is_split_into_words=True an input is a non-empty list of words"):
        ours(texts[0], is_split_into_words=True)


def test_a_classifier_refuses_top_k_and_function_to_apply_naming_its_scores(tmp_path_factory, minilm_dir):
    clf, _ = tiny_dir(tmp_path_factory, minilm_dir, "BertForSequenceClassification")
    with pytest.raises(BertkitError, match=r"does not take top_k; .* instead of top_k: every label's probability is in "
                                           r"the result's \"scores\""):
        bertkit.pipeline("text-classification", clf, top_k=None)
    with pytest.raises(BertkitError, match=r"instead of function_to_apply: the config's problem_type picks it"):
        bertkit.pipeline("text-classification", clf)("a film", function_to_apply="sigmoid")


def test_token_classification_word_keeps_pieces_across_characters_the_tokenizer_drops(tmp_path_factory, minilm_dir,
                                                                                      hf_tok):
    """A zero-width space, soft hyphen or combining accent inside a word is dropped by the tokenizer, so the pieces
    on either side are one word (transformers' word_ids()); the piece after it took a tag of its own before."""
    id2label = {0: "O", 1: "B-PER", 2: "I-PER"}
    d, hf_model = tiny_dir(tmp_path_factory, minilm_dir, "BertForTokenClassification", id2label=id2label,
                            label2id={v: k for k, v in id2label.items()})
    texts = ["hello\u200bworld", "Barbara Stre\u0301isand sings", "The cafe\u0301s of Paris"]
    got = bertkit.pipeline("token-classification", d)(texts)
    assert [[w["word"] for w in o["words"]] for o in got] == [
        ["hello\u200bworld"], ["Barbara", "Stre\u0301isand", "sings"], ["The", "cafe\u0301s", "of", "Paris"]]
    for text, o in zip(texts, got, strict=True):
        enc = hf_tok(text, return_offsets_mapping=True, return_tensors="pt")
        offsets = enc.pop("offset_mapping")[0].tolist()
        with torch.no_grad():
            p = hf_model(**enc).logits[0].double().softmax(-1)
        word_ids = enc.word_ids()
        firsts = [word_ids.index(w) for w in sorted({w for w in word_ids if w is not None})]
        lasts = [len(word_ids) - 1 - word_ids[::-1].index(w) for w in sorted({w for w in word_ids if w is not None})]
        assert [(w["start"], w["end"], w["tag"]) for w in o["words"]] == [
            (offsets[a][0], offsets[b][1], id2label[int(p[a].argmax())]) for a, b in zip(firsts, lasts)]
        np.testing.assert_allclose([w["score"] for w in o["words"]], [float(p[a].max()) for a in firsts], atol=1e-5,
                                   rtol=0)


def test_a_decomposed_accent_starts_no_continuation_where_transformers_length_test_would(tmp_path_factory, minilm_dir):
    """transformers' pipeline takes a piece whose text length differs from its own for a continuation of the word
    before: "e\u0301cole" (6 characters) read as the piece "ecole" (5) joins "Paris", and two words each tagged B-LOC
    become one entity. bertkit's words are the tokenizer's (word_ids()), the same for the NFC and the NFD text."""
    id2label = {0: "O", 1: "B-LOC", 2: "I-LOC"}
    d, model = tiny_dir(tmp_path_factory, minilm_dir, "BertForTokenClassification", id2label=id2label,
                        label2id={v: k for k, v in id2label.items()})
    with torch.no_grad():
        model.classifier.bias.copy_(torch.tensor([0.0, 20.0, 0.0]))  # every piece B-LOC: each word an entity
    model.save_pretrained(d)
    ours = bertkit.pipeline("token-classification", d)
    theirs = transformers.pipeline("token-classification", model=str(d), device="cpu")
    for text in ("Paris école Lyon", "Paris e\u0301cole Lyon", "Paris z\u200bone Lyon"):
        spans = [(w.start(), w.end()) for w in re.finditer(r"\S+", text)]
        assert [(e["entity_group"], e["start"], e["end"]) for e in ours(text)["entities"]] == [
            ("LOC", s, e) for s, e in spans]
        assert [e["entity"] for e in theirs(text, aggregation_strategy="none")] == ["B-LOC"] * 3  # the model's tags
    # transformers' grouping of the decomposed text, for the record: "Paris" and "école" one entity
    assert [(e["start"], e["end"]) for e in theirs("Paris e\u0301cole Lyon", aggregation_strategy="first")] == [
        (0, 12), (13, 17)]
    # a word read as [UNK] (an emoji, a word holding one) is a word of its own in both: transformers' length test
    # leaves [UNK] out
    for text, spans in (("Paris \U0001F600 Lyon", [(0, 5), (6, 7), (8, 12)]),
                        ("Paris x\U0001F600 Lyon", [(0, 5), (6, 8), (9, 13)])):
        assert [(e["start"], e["end"]) for e in ours(text)["entities"]] == spans
        assert [(e["start"], e["end"]) for e in theirs(text, aggregation_strategy="first")] == spans


def test_group_entities_reads_iob2_iob1_and_bioes():
    text = "Jim Smith went to New York City and Paris"
    spans = [(0, 3), (4, 9), (10, 14), (15, 17), (18, 21), (22, 26), (27, 31), (32, 35), (36, 41)]

    def words(tags):
        return [{"start": s, "end": e, "tag": t, "score": 0.5 + i / 100} for i, ((s, e), t) in enumerate(zip(spans, tags))]

    iob2 = ["B-PER", "I-PER", "O", "O", "B-LOC", "I-LOC", "I-LOC", "O", "B-LOC"]
    iob1 = ["I-PER", "I-PER", "O", "O", "I-LOC", "I-LOC", "I-LOC", "O", "I-LOC"]
    bioes = ["B-PER", "E-PER", "O", "O", "B-LOC", "I-LOC", "E-LOC", "O", "S-LOC"]
    for tags in (iob2, iob1, bioes):
        ents = group_entities(words(tags), text)
        assert [(e["entity_group"], e["word"]) for e in ents] == [("PER", "Jim Smith"), ("LOC", "New York City"),
                                                                  ("LOC", "Paris")]
        assert ents[0]["score"] == pytest.approx(0.505)
    adjacent = group_entities(words(["B-LOC", "B-LOC", "I-PER", "O", "O", "O", "O", "O", "O"]), text)
    assert [e["word"] for e in adjacent] == ["Jim", "Smith", "went"]



def test_group_entities_reads_bilou_and_lower_case_prefixes():
    # BILOU's L- (last) and U- (unit) are BIOES's E- and S-, and a lower-case prefix is a prefix: "U-PER" and "b-per"
    # were types of their own, and consecutive "b-per" words (two people) one entity "b-per"
    text = "Jim Smith went to New York City and Paris"
    spans = [(0, 3), (4, 9), (10, 14), (15, 17), (18, 21), (22, 26), (27, 31), (32, 35), (36, 41)]

    def grouped(tags):
        words = [{"start": s, "end": e, "tag": t, "score": 0.5} for (s, e), t in zip(spans, tags)]
        return [(e["entity_group"], e["word"]) for e in group_entities(words, text)]

    assert grouped(["B-PER", "L-PER", "O", "O", "B-LOC", "I-LOC", "L-LOC", "O", "U-LOC"]) == [
        ("PER", "Jim Smith"), ("LOC", "New York City"), ("LOC", "Paris")]
    assert grouped(["b-per", "i-per", "O", "O", "b-loc", "i-loc", "i-loc", "O", "b-loc"]) == [
        ("per", "Jim Smith"), ("loc", "New York City"), ("loc", "Paris")]
    assert grouped(["b-per", "b-per", "O", "O", "u-loc", "u-loc", "O", "O", "O"]) == [
        ("per", "Jim"), ("per", "Smith"), ("loc", "New"), ("loc", "York")]


def test_lower_case_tags_make_transformers_entities_of_the_upper_case_tags(tmp_path_factory, minilm_dir):
    """One head's weights with IOB2 tags written in lower case: bertkit named each entity after its whole tag ("b-per",
    "i-per") and joined consecutive "b-per" words into one; transformers names them "per". Its entities are now
    transformers' entities of the same weights tagged in upper case (types, spans and scores), lower-cased."""
    upper = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
    d, model = tiny_dir(tmp_path_factory, minilm_dir, "BertForTokenClassification", seed=7,
                        id2label=dict(enumerate(upper)), label2id={t: i for i, t in enumerate(upper)})
    lower = tmp_path_factory.mktemp("lower_tags")
    model.config.id2label = {i: t.lower() for i, t in enumerate(upper)}
    model.config.label2id = {t.lower(): i for i, t in enumerate(upper)}
    model.save_pretrained(lower)
    for name in ("vocab.txt", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.json"):
        (lower / name).write_bytes((d / name).read_bytes())
    text = "Jim Smith went to New York City and Paris with Anna Karenina."
    theirs = transformers.pipeline("token-classification", model=str(d), device="cpu")(text, aggregation_strategy="first")
    got = bertkit.pipeline("token-classification", lower)(text)["entities"]
    assert len(theirs) > 3 and {e["entity_group"] for e in theirs} == {"PER", "LOC"}
    assert [(e["entity_group"], e["start"], e["end"]) for e in got] == [
        (e["entity_group"].lower(), e["start"], e["end"]) for e in theirs]
    np.testing.assert_allclose([e["score"] for e in got], [float(e["score"]) for e in theirs], atol=1e-6, rtol=0)
