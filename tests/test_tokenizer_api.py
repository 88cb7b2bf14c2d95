"""The tokenizer API people port from transformers, against BertTokenizerFast on real sentences."""

from __future__ import annotations

import json
import random
import re

import pytest
import torch

from bertkit import BertTokenizer, DataCollatorWithPadding
from bertkit.errors import BertkitError

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")


@pytest.fixture(scope="module")
def toks(minilm_dir):
    return BertTokenizer.from_pretrained(minilm_dir), transformers.BertTokenizerFast.from_pretrained(minilm_dir)


@pytest.fixture(scope="module")
def sentences(data_dir):
    lines = (data_dir / "glue" / "SST-2" / "dev.tsv").read_text(encoding="utf-8").splitlines()[1:121]
    return [line.split("\t")[0] for line in lines]


@pytest.fixture(scope="module")
def squad(data_dir):
    data = json.loads((data_dir / "squad" / "dev-v1.1.json").read_text(encoding="utf-8"))["data"]
    para = [p for article in data[:3] for p in article["paragraphs"]][:12]
    return [p["qas"][0]["question"] for p in para], [p["context"] for p in para]


@pytest.fixture(scope="module")
def conll_words(data_dir):
    sents, cur = [], []
    for line in (data_dir / "conll2003" / "valid.txt").read_text(encoding="utf-8").splitlines()[:800]:
        if not line.strip() or line.startswith("-DOCSTART-"):
            if cur:
                sents.append(cur)
            cur = []
        else:
            cur.append(line.split()[0])
    return sents


def test_word_ids_and_sequence_ids(toks, sentences, squad):
    ours, hf = toks
    a, b = ours(sentences, padding=True), hf(sentences, padding=True)
    assert a["input_ids"] == b["input_ids"]
    for i in range(len(sentences)):
        assert a.word_ids(i) == b.word_ids(i), sentences[i]
    questions, contexts = squad
    a, b = ours(questions, contexts, return_tensors="pt", padding=True), hf(questions, contexts,
                                                                            return_tensors="pt", padding=True)
    for i in range(len(questions)):
        assert a.word_ids(i) == b.word_ids(i) and a.sequence_ids(i) == b.sequence_ids(i)


@pytest.mark.parametrize("split", [False, True])
def test_a_none_in_a_batch_of_pairs_is_refused_naming_its_row(toks, squad, split):
    # A missing ending (datasets reads an empty CSV field as None) among SWAG-style pairs: transformers raises
    # "TextInputSequence must be str"; bertkit encoded that row as [CLS] question [SEP], no second segment, silently.
    ours, hf = toks
    questions, contexts = squad
    pairs = [c.split() if split else c for c in contexts[:4]]
    pairs[2] = None
    firsts = [q.split() for q in questions[:4]] if split else questions[:4]
    with pytest.raises(TypeError):
        hf(firsts, pairs, is_split_into_words=split)
    with pytest.raises(BertkitError, match=r"text_pair\[2\] is None .* give '' for an empty second segment"):
        ours(firsts, pairs, is_split_into_words=split, truncation=True, max_length=64)
    pairs[2] = [] if split else ""  # an empty second segment is one: [CLS] question [SEP] [SEP], as transformers
    assert ours(firsts, pairs, is_split_into_words=split)["input_ids"] == hf(firsts, pairs,
                                                                             is_split_into_words=split)["input_ids"]


def test_is_split_into_words(toks, conll_words):
    ours, hf = toks
    batch = conll_words[:60]
    a = ours(batch, is_split_into_words=True, return_offsets_mapping=True, truncation=True, max_length=32)
    b = hf(batch, is_split_into_words=True, return_offsets_mapping=True, truncation=True, max_length=32)
    assert a["input_ids"] == b["input_ids"] and a["offset_mapping"] == [[tuple(o) for o in r] for r in
                                                                         b["offset_mapping"]]
    for i in range(len(batch)):
        assert a.word_ids(i) == b.word_ids(i)
    one_a, one_b = ours(batch[3], is_split_into_words=True), hf(batch[3], is_split_into_words=True)
    assert one_a["input_ids"] == one_b["input_ids"] and one_a.word_ids() == one_b.word_ids()


def test_a_list_of_pairs_of_word_lists_is_a_batch_of_pairs(toks, conll_words):
    # transformers reads [(words, pair_words), ...] with is_split_into_words=True as a batch of pairs; bertkit refused
    # it ("each text is a list of words (str), got tuple"), and called a str text a batch
    ours, hf = toks
    pairs = [(a[:5], b) for a, b in zip(conll_words[:6], conll_words[6:12])]
    assert ours([(["a", "b"], ["c"])], is_split_into_words=True)["input_ids"] == [[101, 1037, 1038, 102, 1039, 102]]
    kw = dict(is_split_into_words=True, return_offsets_mapping=True, truncation="only_second", max_length=32, stride=4,
              return_overflowing_tokens=True)
    a, b = ours(pairs, **kw), hf(pairs, **kw)
    assert a["input_ids"] == b["input_ids"] and a["token_type_ids"] == b["token_type_ids"]
    assert a["offset_mapping"] == [[tuple(o) for o in r] for r in b["offset_mapping"]]
    assert a["overflow_to_sample_mapping"] == b["overflow_to_sample_mapping"]
    for i in range(len(b["input_ids"])):
        assert a.word_ids(i) == b.word_ids(i) and a.sequence_ids(i) == b.sequence_ids(i)
    with pytest.raises(TypeError, match="got the str 'hello world'; pass its words"):
        ours("hello world", "x y", is_split_into_words=True)


def test_encode_takes_one_list_of_words(toks, conll_words):
    # transformers' encode(words, is_split_into_words=True) gives that text's ids; bertkit refused the list as a batch
    ours, hf = toks
    words, pair = conll_words[0], conll_words[1]
    assert ours.encode(words, is_split_into_words=True) == hf.encode(words, is_split_into_words=True)
    assert ours.encode(["a", "b"], ["c"], is_split_into_words=True) == [101, 1037, 1038, 102, 1039, 102]
    assert ours.encode(words, pair, is_split_into_words=True, max_length=12, truncation=True) == hf.encode(
        words, pair, is_split_into_words=True, max_length=12, truncation=True)
    with pytest.raises(TypeError, match="for a batch call the tokenizer itself"):
        ours.encode([words, pair], is_split_into_words=True)


@pytest.mark.parametrize("stride", [0, 7, 40])
def test_overflowing_tokens_with_stride(toks, squad, stride):
    ours, hf = toks
    questions, contexts = squad
    kw = dict(truncation="only_second", max_length=96, stride=stride, return_overflowing_tokens=True,
              return_offsets_mapping=True, padding="max_length")
    a, b = ours(questions, contexts, **kw), hf(questions, contexts, **kw)
    assert len(a["input_ids"]) > len(questions)  # contexts really are cut into several windows
    assert a["input_ids"] == b["input_ids"] and a["token_type_ids"] == b["token_type_ids"]
    assert a["overflow_to_sample_mapping"] == b["overflow_to_sample_mapping"]
    assert a["offset_mapping"] == [[tuple(o) for o in r] for r in b["offset_mapping"]]
    for i in range(len(a["input_ids"])):
        assert a.word_ids(i) == b.word_ids(i) and a.sequence_ids(i) == b.sequence_ids(i)
    # A single long text, one at a time (output batched) and as tensors.
    kw = dict(truncation=True, max_length=64, stride=stride % 30, return_overflowing_tokens=True)
    a, b = ours(contexts[0], **kw), hf(contexts[0], **kw)
    assert a["input_ids"] == b["input_ids"] and a["overflow_to_sample_mapping"] == b["overflow_to_sample_mapping"]
    assert [a.word_ids(i) for i in range(len(a["input_ids"]))] == [b.word_ids(i) for i in range(len(b["input_ids"]))]
    with pytest.raises(BertkitError, match="stride 62 must be smaller"):
        ours(contexts[0], truncation=True, max_length=64, stride=62, return_overflowing_tokens=True)


def test_a_stride_no_window_can_hold_is_refused_whatever_the_texts_length(toks, squad):
    # transformers refuses a stride above max_length less the special tokens before it reads any text; bertkit
    # refused it only for a text long enough to need a second window, so a batch of short texts went through
    ours, hf = toks
    questions, contexts = squad
    kw = dict(truncation="only_second", max_length=32, return_overflowing_tokens=True)
    for texts in ((questions[0],), (questions[0], contexts[0])):
        with pytest.raises(ValueError, match="stride set to 31"):
            hf(*texts, stride=31, **kw)
        with pytest.raises(BertkitError, match="stride 31 is more than the 30 tokens .* max_length 32"):
            ours(*texts, stride=31, **kw)
    a, b = ours(questions[0], stride=30, **kw), hf(questions[0], stride=30, **kw)  # the edge both let through
    assert a["input_ids"] == b["input_ids"]


def test_windows_of_a_pair_whose_max_length_holds_only_the_special_tokens_are_refused_naming_it(toks, squad):
    # max_length 3 leaves a pair no token of text: transformers returns rows of 14 and 171 tokens for max_length 3;
    # bertkit's refusal said to use a stride smaller than 0
    ours, hf = toks
    questions, contexts = squad
    kw = dict(truncation="only_second", max_length=3, stride=0, return_overflowing_tokens=True)
    assert [len(row) for row in hf(questions[0], contexts[0], **kw)["input_ids"]][:3] == [3, 14, 171]
    with pytest.raises(BertkitError, match="max_length 3 holds only the 3 special tokens.*use max_length > 3"):
        ours(questions[0], contexts[0], **kw)


def test_pad_and_pad_to_multiple_of(toks, sentences):
    ours, hf = toks
    for kw in (dict(padding=True, pad_to_multiple_of=8), dict(padding="max_length", max_length=50,
                                                              pad_to_multiple_of=16)):
        a, b = ours(sentences[:16], **kw), hf(sentences[:16], **kw)
        assert a["input_ids"] == b["input_ids"] and a["attention_mask"] == b["attention_mask"]
        assert len(a["input_ids"][0]) % kw["pad_to_multiple_of"] == 0
    # padded past max_length to its multiple without truncation, as transformers pads; with truncation to a
    # length that is not a multiple, both refuse (bertkit cut at 10 and padded to 16 without a word)
    a = ours(sentences[:4], padding="max_length", max_length=10, pad_to_multiple_of=8)
    assert a["input_ids"] == hf(sentences[:4], padding="max_length", max_length=10, pad_to_multiple_of=8)["input_ids"]
    for padding in (True, "max_length"):
        with pytest.raises(ValueError, match="not a multiple of pad_to_multiple_of"):
            hf(sentences[:4], padding=padding, truncation=True, max_length=10, pad_to_multiple_of=8)
        with pytest.raises(BertkitError, match="max_length=10 and padding to a multiple of pad_to_multiple_of=8"):
            ours(sentences[:4], padding=padding, truncation=True, max_length=10, pad_to_multiple_of=8)
    # pad() on per-example dicts (what a data collator does), with a label passed through.
    features = [{**ours(s, return_special_tokens_mask=True), "label": i} for i, s in enumerate(sentences[:9])]
    hf_features = [{**hf(s, return_special_tokens_mask=True), "label": i} for i, s in enumerate(sentences[:9])]
    a = ours.pad(features, pad_to_multiple_of=8, return_tensors="pt")
    b = hf.pad(hf_features, pad_to_multiple_of=8, return_tensors="pt")
    assert set(a) == set(b)
    for key in b:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=0)
    a = ours.pad(ours(sentences[:5]), padding="max_length", max_length=70)
    b = hf.pad(hf(sentences[:5]), padding="max_length", max_length=70)
    assert dict(a) == dict(b)


def test_batch_encoding_to(toks, sentences):
    ours, _ = toks
    enc = ours(sentences[:3], padding=True, return_tensors="pt")
    assert enc.to(torch.device("cpu")) is enc and all(v.device.type == "cpu" for v in enc.values())
    assert enc.word_ids(1)[0] is None  # the row structure survives the move


def test_add_tokens_and_special_tokens_with_model_resize(minilm_dir, sentences, tmp_path):
    from bertkit import BertForMaskedLM

    ours = BertTokenizer.from_pretrained(minilm_dir)
    hf = transformers.BertTokenizerFast.from_pretrained(minilm_dir)
    new = ["covid19", "mrna-1273", "Bertkit"]
    assert ours.add_tokens(new) == hf.add_tokens(new) == 3
    assert ours.add_special_tokens({"additional_special_tokens": ["[ENT]"]}) == 1
    hf.add_special_tokens({"additional_special_tokens": ["[ENT]"]})
    assert len(ours) == len(hf) == 30526
    texts = [f"COVID19 and mrna-1273: [ENT] {s} bertkit[ENT]covid19x" for s in sentences[:20]]
    a, b = ours(texts, return_offsets_mapping=True), hf(texts, return_offsets_mapping=True)
    assert a["input_ids"] == b["input_ids"]
    assert a["offset_mapping"] == [[tuple(o) for o in r] for r in b["offset_mapping"]]
    for i in range(len(texts)):
        assert a.word_ids(i) == b.word_ids(i)
    skip = dict(skip_special_tokens=True)
    assert ours.decode(a["input_ids"][0], **skip) == hf.decode(b["input_ids"][0], **skip)
    # The model grows with the tokenizer; the round trip through save_pretrained keeps both.
    model = BertForMaskedLM.from_pretrained(minilm_dir)
    model.resize_token_embeddings(len(ours))
    assert model.config.vocab_size == len(ours)
    ours.save_pretrained(tmp_path)
    model.save_pretrained(tmp_path)
    again = BertTokenizer.from_pretrained(tmp_path)
    assert again.added_tokens == ["covid19", "mrna-1273", "Bertkit"] and "[ENT]" in again.all_special_tokens
    assert again(texts)["input_ids"] == a["input_ids"]
    with torch.no_grad():
        logits = BertForMaskedLM.from_pretrained(tmp_path).eval()(torch.tensor([a["input_ids"][0]])).prediction_logits
    assert logits.shape[-1] == len(ours)


@pytest.mark.parametrize("tokens", [None, [None], "", [" x"], [tokenizers.AddedToken(" x")]])
def test_add_tokens_names_a_token_it_cannot_add(minilm_dir, tokens):
    """transformers adds " x" with its space (so "a x b" is "a", " x", "b"), and counts None or "" as 0 tokens;
    bertkit refuses each, naming it, before anything is added (None was Python's "'NoneType' object is not
    iterable"). An AddedToken with options bertkit does not match as transformers does: test_tokenizer_contract."""
    ours = BertTokenizer.from_pretrained(minilm_dir)
    with pytest.raises(BertkitError, match=r"tokens to add must be non-empty strings .*: pass each as a str"):
        ours.add_tokens(tokens)
    assert len(ours) == 30522 and ours.added_tokens == []


# ["york", "York"] is ["Foo", "FOO"]'s case again: in make test-slow
@pytest.mark.parametrize("tokens", [["Foo", "FOO"], ["ët", "e\u0301t"], pytest.param(["york", "York"], marks=pytest.mark.slow),
                                    ["\u0301"]])
def test_an_added_token_the_normalised_text_cannot_tell_apart_is_refused(minilm_dir, tmp_path, tokens):
    """An uncased tokenizer matches added tokens by their normalised forms: "Foo" and "FOO" are both "foo". transformers
    gave "FOO foo" [30522, 30522] live and [30523, 30523] once saved and loaded (["Foo", "FOO"] in one call; added
    one by one, the other way round), and from bertkit's save 30523 where bertkit gave 30522: the same directory, other
    ids. A token that normalises to nothing ("\u0301") made transformers fail on every text ("AddedVocabulary bad
    split"). Refused, naming both, before anything is added, and in a directory transformers saved with both; as
    special tokens (matched as written), or cased, each keeps its id, as in transformers."""
    ours = BertTokenizer.from_pretrained(minilm_dir)
    clash = r"to nothing, so no text" if len(tokens) == 1 else rf"to .*, as the added '{tokens[0]}' does, so no text"
    message = rf"token '{tokens[-1]}' normalises \(BasicTokenizer\(do_lower_case=True.*{clash}.*special_tokens=True"
    with pytest.raises(BertkitError, match=message):
        ours.add_tokens(tokens)
    assert len(ours) == 30522 and ours.added_tokens == []
    if len(tokens) == 2:  # transformers adds them: its save is refused too
        hf = transformers.BertTokenizerFast.from_pretrained(minilm_dir)
        hf.add_tokens(tokens)
        hf.save_pretrained(tmp_path)
        with pytest.raises(BertkitError, match=message):
            BertTokenizer.from_pretrained(tmp_path)
    text = "Foo FOO ët e\u0301t York york"
    for lower, special in ((True, True), (False, False)):
        ours = BertTokenizer.from_pretrained(minilm_dir, do_lower_case=lower)
        hf = transformers.BertTokenizerFast.from_pretrained(minilm_dir, do_lower_case=lower)
        if tokens != ["\u0301"] or special:
            assert ours.add_tokens(tokens, special_tokens=special) >= 1
            hf.add_tokens(tokens, special_tokens=special)
        assert ours(text)["input_ids"] == hf(text)["input_ids"]


def test_an_added_token_is_never_made_from_a_words_pieces(minilm_dir):
    """An added special token is matched exactly in the text, as in Hugging Face, whose WordPiece model never holds
    it: the uncased "NEWTOK" is lower-cased to "newtok" but stays newt ##ok (bertkit's WordPiece made the added
    token of it)."""
    ours = BertTokenizer.from_pretrained(minilm_dir)
    hf = transformers.BertTokenizerFast.from_pretrained(minilm_dir)
    for tok in (ours, hf):
        tok.add_special_tokens({"additional_special_tokens": ["newtok"]})
    text = "NEWTOK Newtok newtoks, newtok"
    assert ours(text)["input_ids"] == hf(text)["input_ids"] == [101, 25597, 6559, 25597, 6559, 30522, 1055, 1010,
                                                                30522, 102]


def test_adding_a_token_the_vocabulary_has_cuts_it_out_of_words(minilm_dir):
    """add_tokens(["york"]) with "york" already in the vocabulary: Hugging Face cuts it out of the text wherever it
    occurs, as any added token ("NewYorker" is new, york, er); bertkit left it to WordPiece (new ##yo ##rke ##r)."""
    ours = BertTokenizer.from_pretrained(minilm_dir)
    hf = transformers.BertTokenizerFast.from_pretrained(minilm_dir)
    assert ours.add_tokens(["york"]) == 0 and len(ours) == len(hf) == 30522  # no new id: the model keeps its size
    hf.add_tokens(["york"])
    text = "NewYorker, yorky"
    a, b = ours(text, return_offsets_mapping=True), hf(text, return_offsets_mapping=True)
    assert a["input_ids"] == b["input_ids"] == [101, 2047, 2259, 9413, 1010, 2259, 1061, 102]
    assert a["offset_mapping"] == [tuple(o) for o in b["offset_mapping"]]
    assert a.word_ids() == b.word_ids() == [None, 0, 1, 2, 3, 4, 5, None]


@pytest.mark.parametrize("lower", [True, False], ids=["uncased", "cased"])
def test_added_tokens_are_matched_in_the_normalised_text(minilm_dir, lower):
    """Hugging Face matches an added token's normalised form in the normalised text: an uncased "NAIVE" or
    "nai\u0308ve" is the added "naïve", "NEW\tYORK" the added "New York", "ISTANBUL" the added "İstanbul" (bertkit
    matched the raw text case-insensitively: WordPiece read the first three, and the last raised a KeyError)."""
    ours = BertTokenizer.from_pretrained(minilm_dir, do_lower_case=lower)
    hf = transformers.BertTokenizerFast.from_pretrained(minilm_dir, do_lower_case=lower)
    added = ["naïve", "New York", "İstanbul", "中文", "x\u200by"]
    assert ours.add_tokens(added) == hf.add_tokens(added) == 5
    fragments = ["NAIVE", "nai\u0308ve", "Naïve", "New York", "NEW\tYORK", "new\u200byork", "new  york", "ISTANBUL",
                 "İstanbul", "我中文字", "中 文", "xy", "x\u200by", "[MASK]", ",", "hello", "\u0301", " "]
    rng = random.Random(0)
    texts = ["".join(rng.choice(fragments) + rng.choice(["", " ", "\t"]) for _ in range(rng.randint(1, 6)))
             for _ in range(300)]
    a, b = ours(texts, return_offsets_mapping=True), hf(texts, return_offsets_mapping=True)
    assert a["input_ids"] == b["input_ids"]
    assert a["offset_mapping"] == [[tuple(o) for o in r] for r in b["offset_mapping"]]
    if lower:
        got = ours("NAIVE nai\u0308ve NEW\tYORK from ISTANBUL", return_offsets_mapping=True)
        assert got["input_ids"] == [101, 30522, 30522, 30523, 2013, 30524, 102]
        assert got["offset_mapping"] == [(0, 0), (0, 5), (6, 12), (13, 21), (22, 26), (27, 35), (0, 0)]


@pytest.mark.parametrize("lower", [True, False], ids=["uncased", "cased"])
def test_an_added_token_reads_back_as_its_normalised_form(minilm_dir, lower):
    """tokenizers stores an added token normalised: an uncased tokenizer's added "[E1]" converts and decodes as
    "[e1]", "Café" as "cafe", "中文" with the spaces BertNormalizer puts around CJK characters (bertkit gave each
    back as it was added); special tokens read back as written."""
    ours = BertTokenizer.from_pretrained(minilm_dir, do_lower_case=lower)
    hf = transformers.BertTokenizerFast.from_pretrained(minilm_dir, do_lower_case=lower)
    for tok in (ours, hf):
        tok.add_tokens(["[E1]", "Café", "中文", "New York", "hello"])
        tok.add_special_tokens({"additional_special_tokens": ["[ENT]"]})
    text = "[E1] CAFÉ 中文 new york [ENT] Hello"
    a, b = ours(text), hf(text)
    assert a["input_ids"] == b["input_ids"]
    assert ours.convert_ids_to_tokens(a["input_ids"]) == hf.convert_ids_to_tokens(b["input_ids"]) == a.tokens()
    for skip in (False, True):
        assert ours.decode(a["input_ids"], skip_special_tokens=skip) == hf.decode(b["input_ids"],
                                                                                  skip_special_tokens=skip)
    if lower:
        assert ours.convert_ids_to_tokens(a["input_ids"]) == [
            "[CLS]", "[e1]", "cafe", " 中  文 ", "new york", "[ENT]", "hello", "[SEP]"]
    assert ours.convert_tokens_to_ids(["[E1]", "Café"]) == hf.convert_tokens_to_ids(["[E1]", "Café"]) == [30522,
                                                                                                        30523]


def test_from_pretrained_names_a_keyword_it_does_not_take(minilm_dir):
    # transformers' from_pretrained takes Hub options; bertkit's constructor raised a bare TypeError after the files
    # were read
    with pytest.raises(BertkitError, match=re.escape("unknown keyword arguments ['lowercase']")):
        BertTokenizer.from_pretrained(minilm_dir, lowercase=True)
    with pytest.raises(BertkitError, match="cache_dir=.*drop it"):  # a Hub option, not at transformers' default
        BertTokenizer.from_pretrained(minilm_dir, cache_dir="/tmp/x", trust_remote_code=False)
    assert BertTokenizer.from_pretrained(minilm_dir, revision="main").model_max_length == 512
    assert BertTokenizer.from_pretrained(minilm_dir, model_max_length=128, do_lower_case=True).model_max_length == 128


def test_hub_id_for_tokenizer_says_how_to_get_it(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "huggingface_hub", None)
    with pytest.raises(FileNotFoundError, match="hf download bert-base-uncased"):
        BertTokenizer.from_pretrained("bert-base-uncased")


def test_pad_refuses_an_example_whose_columns_differ_in_length(toks):
    tok = toks[0] if isinstance(toks, tuple) else toks
    good = {"input_ids": [101, 7592, 102], "attention_mask": [1, 1, 1], "token_type_ids": [0, 0, 0]}
    assert tok.pad([good, {**good, "input_ids": [101, 102]} | {"attention_mask": [1, 1], "token_type_ids": [0, 0]}],
                   return_tensors="pt")["attention_mask"].tolist() == [[1, 1, 1], [1, 1, 0]]
    with pytest.raises(BertkitError, match=r"example 1 has 3 input_ids but attention_mask of length 2"):
        tok.pad([good, {**good, "attention_mask": [1, 1]}])


@pytest.mark.parametrize("key", ["attention_mask", "token_type_ids", "special_tokens_mask"])
def test_pad_refuses_a_column_that_only_some_examples_have(toks, key):
    """An attention_mask given by example 1 alone was kept ([1, 1, 0] where transformers makes [1, 1, 1]), token_type_ids
    or a special_tokens_mask of example 1 alone was dropped (in both libraries), and one of example 0 alone met a bare
    KeyError."""
    ours, hf = toks
    given = {"input_ids": [101, 7592, 102], key: [1, 1, 0] if key == "attention_mask" else [1, 0, 1]}
    bare = {"input_ids": [101, 102]}
    for examples, lacking, having in (([bare, given], 0, 1), ([given, bare], 1, 0)):
        with pytest.raises(BertkitError, match=rf"example {lacking} of the batch has no '{key}' but example {having} "):
            ours.pad(examples)
    if key == "attention_mask":
        assert hf.pad([bare, given])["attention_mask"] == [[1, 1, 0], [1, 1, 1]]
    assert ours.pad([{**bare, key: [1, 1]}, given])[key] == [[1, 1, 1 if key == "special_tokens_mask" else 0], given[key]]



@pytest.mark.parametrize("side", ["padding_side", "truncation_side"])
def test_setting_a_side_to_left_is_refused_not_ignored(minilm_dir, side):
    # transformers honours `tok.padding_side = "left"` ([0, ..., 101, 1037, 102]); bertkit kept the attribute
    # and went on padding and truncating on the right.
    ours = BertTokenizer.from_pretrained(minilm_dir)
    with pytest.raises(BertkitError, match=f"{side}='left'.*right only"):
        setattr(ours, side, "left")
    setattr(ours, side, "right")  # the one value it has is accepted
    assert getattr(ours, side) == "right"
    assert ours(["hello world", "a"], padding=True)["input_ids"] == [[101, 7592, 2088, 102], [101, 1037, 102, 0]]
    # from_pretrained(dir, padding_side=...), as transformers takes it: "left" named as above (it was an unknown
    # keyword argument, "right" too)
    with pytest.raises(BertkitError, match=f"{side}='left'.*right only"):
        BertTokenizer.from_pretrained(minilm_dir, **{side: "left"})
    assert BertTokenizer.from_pretrained(minilm_dir, **{side: "right"})(["a b", "a"], padding=True)["input_ids"] == [
        [101, 1037, 1038, 102], [101, 1037, 102, 0]]


def test_a_calls_padding_side_left_is_refused_naming_it(minilm_dir):
    # transformers 5 takes padding_side= in __call__ and pad; bertkit's TypeError did not say why
    ours = BertTokenizer.from_pretrained(minilm_dir)
    for call in (lambda side: ours(["hello world", "a"], padding=True, padding_side=side),
                 lambda side: ours.pad([{"input_ids": [101, 7592, 102]}, {"input_ids": [101, 102]}], padding_side=side)):
        with pytest.raises(BertkitError, match="padding_side='left'.*right only"):
            call("left")
        assert call("right")["input_ids"][1][-1] == 0


def test_decode_of_a_batch_names_batch_decode(minilm_dir):
    # transformers 5's decode of [[...], [...]] returns a list of strings; bertkit's TypeError named no way on
    ours = BertTokenizer.from_pretrained(minilm_dir)
    with pytest.raises(TypeError, match="use batch_decode"):
        ours.decode([[101, 1037, 102], [101, 1038, 102]])
    assert ours.batch_decode([[101, 1037, 102], [101, 1038, 102]]) == ["[CLS] a [SEP]", "[CLS] b [SEP]"]


def test_ids_as_numpy_integers_or_0_d_tensors_decode_as_in_transformers(toks, sentences):
    # list(array) and list(tensor) hold numpy integers and 0-d tensors: transformers decodes them, bertkit refused them
    # saying to use batch_decode
    ours, hf = toks
    ids = hf(sentences[0], return_tensors="pt")["input_ids"][0]
    for row in (list(ids), list(ids.numpy())):
        assert ours.decode(row) == hf.decode(row) == "[CLS] it ' s a charming and often affecting journey. [SEP]"
        assert ours.decode(row, skip_special_tokens=True) == hf.decode(row, skip_special_tokens=True)
        assert ours.convert_ids_to_tokens(row) == hf.convert_ids_to_tokens(row)
        assert ours.batch_decode([row, row]) == hf.batch_decode([row, row])
    with pytest.raises(TypeError, match="use batch_decode"):
        ours.decode(list(hf(sentences[:2], padding=True, return_tensors="np")["input_ids"]))


def test_ids_that_are_not_integers_and_a_flat_batch_are_refused_not_decoded(toks):
    # decode([101, 2.0, 102]) read the float as id 2 ("[CLS] [unused1] [SEP]"; transformers: TypeError) and 2.7 failed
    # with KeyError(2.7); batch_decode of one flat sequence decoded each id as a row of its own (["[CLS]", "[SEP]"],
    # where transformers 5 gives the one row "[CLS] [SEP]"); convert_tokens_to_string("hello") gave "h e l l o"
    ours, hf = toks
    for ids in ([101, 2.0, 102], [101, 2.7, 102], [101, torch.tensor(5.0), 102], torch.tensor([101.0, 102.0])):
        with pytest.raises(TypeError):
            hf.decode(ids)
        with pytest.raises(TypeError, match=r"token ids are integers: got .* at position (1|0)"):
            ours.decode(ids)
        with pytest.raises(TypeError, match=r"token ids are integers"):
            ours.convert_ids_to_tokens(ids)
    assert hf.batch_decode([101, 7592, 102]) == ["[CLS] hello [SEP]"]  # deprecated there: one sequence, one row
    for flat in ([101, 7592, 102], torch.tensor([101, 7592, 102])):
        with pytest.raises(TypeError, match="one sequence of 3 ids.*decode"):
            ours.batch_decode(flat)
    assert ours.batch_decode(torch.tensor([[101, 7592, 102]])) == hf.batch_decode(torch.tensor([[101, 7592, 102]]))
    with pytest.raises(TypeError):
        hf.convert_tokens_to_string("hello")
    with pytest.raises(TypeError, match="a list of token strings, got the str 'hello'"):
        ours.convert_tokens_to_string("hello")


def test_an_unknown_return_tensors_is_refused_before_any_text_is_read(toks, sentences, monkeypatch):
    # return_tensors="tf" was refused only after every text of the batch had been tokenized and padded
    ours, _ = toks
    monkeypatch.setattr(ours._text, "encode", lambda *args: pytest.fail("a text was tokenized"))
    with pytest.raises(BertkitError, match="return_tensors='tf' is not supported; use 'pt', 'np' or None"):
        ours(sentences, padding=True, return_tensors="tf")


def test_batch_encoding_copy_keeps_its_type_and_maps(toks, sentences):
    # transformers' BatchEncoding.copy() (and `enc | {...}`) is a BatchEncoding; bertkit's was a plain dict, so the
    # copy lost attribute access, .to() and word_ids()
    ours, hf = toks
    a, b = ours(sentences[:3], padding=True), hf(sentences[:3], padding=True)
    for copy_a, copy_b in ((a.copy(), b.copy()), (a | {"labels": [0, 1, 0]}, b | {"labels": [0, 1, 0]})):
        assert type(copy_a).__name__ == type(copy_b).__name__ == "BatchEncoding"
        assert copy_a.input_ids == copy_b.input_ids and copy_a.word_ids(1) == b.word_ids(1)
    copy_a = a.copy()
    copy_a["input_ids"] = []
    assert a["input_ids"] == b["input_ids"]  # a shallow copy: the original keeps its keys
    assert (a | {"labels": [0, 1, 0]})["labels"] == [0, 1, 0] and "labels" not in a


@pytest.mark.parametrize("lower", [True, False], ids=["uncased", "cased"])
def test_tokenize_gives_an_added_token_as_its_ids_read_back(minilm_dir, lower):
    """tokenize() is the ids read back: an uncased tokenizer's added "[E1]" is "[e1]", "Café" "cafe", as
    transformers' tokenize and bertkit's own convert_ids_to_tokens give them (bertkit's tokenize gave them as
    added)."""
    ours = BertTokenizer.from_pretrained(minilm_dir, do_lower_case=lower)
    hf = transformers.BertTokenizerFast.from_pretrained(minilm_dir, do_lower_case=lower)
    for tok in (ours, hf):
        tok.add_tokens(["[E1]", "Café", "New York"])
        tok.add_special_tokens({"additional_special_tokens": ["[ENT]"]})
    text = "[E1] CAFÉ new york [ENT] Hello café"
    assert ours.tokenize(text) == hf.tokenize(text) == ours.convert_ids_to_tokens(
        ours.encode(text, add_special_tokens=False))
    if lower:
        assert ours.tokenize(text) == ["[e1]", "cafe", "new york", "[ENT]", "hello", "cafe"]


def test_a_replaced_special_token_stays_special_as_in_transformers(minilm_dir, tmp_path):
    """add_special_tokens({"pad_token": "[PAD2]"}): transformers keeps the old "[PAD]" a special token (cut out of
    the text as id 0, skipped by decode, written to tokenizer.json); bertkit made it plain text ("[", "pad", "]"),
    in memory and in what it saved."""
    ours = BertTokenizer.from_pretrained(minilm_dir)
    hf = transformers.BertTokenizerFast.from_pretrained(minilm_dir)
    assert ours.add_special_tokens({"pad_token": "[PAD2]"}) == hf.add_special_tokens({"pad_token": "[PAD2]"}) == 1
    text = "x [PAD] y [PAD2]"
    assert ours(text)["input_ids"] == hf(text)["input_ids"] == [101, 1060, 0, 1061, 30522, 102]
    assert ours.tokenize(text) == hf.tokenize(text) == ["x", "[PAD]", "y", "[PAD2]"]
    assert ours.pad_token_id == hf.pad_token_id == 30522
    assert ours(["a", "a b"], padding=True)["input_ids"] == hf(["a", "a b"], padding=True)["input_ids"]
    for skip in (False, True):
        assert ours.decode([101, 1060, 0, 1061, 102], skip_special_tokens=skip) == hf.decode(
            [101, 1060, 0, 1061, 102], skip_special_tokens=skip)
    assert ours.get_added_vocab() == hf.get_added_vocab()
    ours.save_pretrained(tmp_path)
    for again in (BertTokenizer.from_pretrained(tmp_path), transformers.BertTokenizerFast.from_pretrained(tmp_path)):
        assert again(text)["input_ids"] == [101, 1060, 0, 1061, 30522, 102] and again.pad_token == "[PAD2]"


def test_assigning_a_special_token_moves_its_id_as_in_transformers(minilm_dir):
    # tok.pad_token = "[MASK]": transformers pads with 103 and says pad_token_id 103; bertkit's pad_token read
    # "[MASK]" while pad_token_id stayed 0 and rows were padded with 0
    ours = BertTokenizer.from_pretrained(minilm_dir)
    hf = transformers.BertTokenizerFast.from_pretrained(minilm_dir)
    ours.pad_token = hf.pad_token = "[MASK]"
    ours.mask_token = hf.mask_token = "[PAD]"
    assert ours.pad_token_id == hf.pad_token_id == 103 and ours.mask_token_id == hf.mask_token_id == 0
    text = ["x [PAD] y [MASK]", "a"]
    a, b = ours(text, padding=True, return_special_tokens_mask=True), hf(text, padding=True, return_special_tokens_mask=True)
    assert a["input_ids"] == b["input_ids"] == [[101, 1060, 0, 1061, 103, 102], [101, 1037, 102, 103, 103, 103]]
    assert a["special_tokens_mask"] == b["special_tokens_mask"]
    assert ours.pad([{"input_ids": [5, 6]}, {"input_ids": [5]}])["input_ids"] == [[5, 6], [5, 103]]
    assert ours.decode(a["input_ids"][0], skip_special_tokens=True) == hf.decode(b["input_ids"][0],
                                                                               skip_special_tokens=True) == "x y"
    for value in ("hello", "<new>"):  # transformers pads with hello's id, or [UNK]'s for a token it lacks
        with pytest.raises(BertkitError, match=f"pad_token='{value}' is not one of .* add_special_tokens"):
            ours.pad_token = value
    assert ours.pad_token == "[MASK]" and ours.pad_token_id == 103


def test_assigning_a_special_token_id_moves_the_token_and_what_is_saved_as_in_transformers(minilm_2_layers, tmp_path):
    """tok.pad_token_id = 103 (a DataCollator recipe) was kept as a bare number: rows padded with 103 while pad_token
    stayed "[PAD]", so the saved tokenizer padded with 0 once reloaded. transformers makes "[MASK]" the pad token. A
    table made from the tokens (vocab, all_special_ids) assigned was kept and read by convert_tokens_to_ids (every
    token [UNK]); transformers has no setter for them."""
    ours = BertTokenizer.from_pretrained(minilm_2_layers)
    hf = transformers.BertTokenizerFast.from_pretrained(minilm_2_layers)
    ours.pad_token_id = hf.pad_token_id = 103
    assert ours.pad_token == hf.pad_token == "[MASK]"
    rows = [[101, 1037, 102, 103], [101, 1038, 1039, 102]]
    assert ours(["a", "b c"], padding=True)["input_ids"] == hf(["a", "b c"], padding=True)["input_ids"] == rows
    ours.save_pretrained(tmp_path)
    for again in (BertTokenizer.from_pretrained(tmp_path), transformers.BertTokenizerFast.from_pretrained(tmp_path)):
        assert again.pad_token_id == 103 and again(["a", "b c"], padding=True)["input_ids"] == rows
    for name, value in (("vocab", {}), ("all_special_ids", [1]), ("ids_to_tokens", {})):
        with pytest.raises(AttributeError, match=f"tok.{name} cannot be assigned: .*tok.add_tokens"):
            setattr(ours, name, value)
    assert ours.convert_tokens_to_ids(["hello", "[MASK]"]) == [7592, 103]
    for value in (None, "0", 0.0):
        with pytest.raises(BertkitError, match=r"pad_token_id=.*: a token id is an int; .*'\[PAD\]': 0"):
            ours.pad_token_id = value
    assert ours.pad_token_id == 103


@pytest.mark.parametrize("change", [lambda t: setattr(t, "sep_token", "[MASK]"), lambda t: setattr(t, "sep_token_id", 103),
                                    lambda t: t.add_special_tokens({"sep_token": "[MASK]"})])
def test_a_new_cls_or_sep_token_encodes_as_transformers_encodes_it_once_saved_and_says_so(minilm_2_layers, tmp_path,
                                                                                          change, caplog):
    """tok.sep_token = "[MASK]" (or its id, or add_special_tokens): transformers 5 keeps adding [SEP] (102) to every
    encoding until the tokenizer is saved and loaded again, its sep_token_id saying 103 meanwhile; bertkit adds the
    new token at once, which is what transformers encodes once the tokenizer is saved and reloaded, and said nothing
    of the in-memory difference. On MiniLM's cut vocabulary (conftest.py: its ids below 8,000 unchanged), whose
    files each library writes and reads in a third of the time."""
    ours = BertTokenizer.from_pretrained(minilm_2_layers)
    hf = transformers.BertTokenizerFast.from_pretrained(minilm_2_layers)
    with caplog.at_level("WARNING", logger="bertkit"):
        change(ours)
        change(hf)
    assert ours.sep_token_id == hf.sep_token_id == 103
    assert hf("a", "b")["input_ids"] == [101, 1037, 102, 1038, 102]  # transformers in memory: the old [SEP]
    assert ours("a", "b")["input_ids"] == [101, 1037, 103, 1038, 103]
    for tok in (ours, hf):
        tok.save_pretrained(tmp_path / type(tok).__module__.split(".")[0])
    for saved in tmp_path.iterdir():  # either library's save, read by either: the new token, as bertkit's in memory
        for again in (BertTokenizer.from_pretrained(saved), transformers.BertTokenizerFast.from_pretrained(saved)):
            assert again("a", "b")["input_ids"] == [101, 1037, 103, 1038, 103]
    said = [r.getMessage() for r in caplog.records if r.name == "bertkit"]
    assert len(said) == 1 and re.search(r"sep_token is now '\[MASK\]' \(id 103\).*saved and loaded again; until then "
                                        r"transformers' tokenizer keeps encoding '\[SEP\]' \(id 102\).*"
                                        r"from_pretrained\(path, sep_token='\[MASK\]'\)", said[0]), said
    caplog.clear()
    with caplog.at_level("WARNING", logger="bertkit"):
        ours.add_special_tokens({"sep_token": "[MASK]", "pad_token": "[PAD]"})  # no change: nothing to say
        ours.cls_token = "[CLS]"
        with pytest.raises(BertkitError, match="cls_token must be a str"):  # refused whole: nothing changed
            ours.add_special_tokens({"sep_token": "[SEP]", "cls_token": 5})
    assert not [r for r in caplog.records if r.name == "bertkit"] and ours.sep_token_id == 103


def test_a_new_unk_token_reads_unknown_words_as_transformers_does_once_saved_and_says_so(minilm_2_layers, tmp_path, caplog):
    """tok.unk_token = "[MASK]": transformers 5's WordPiece keeps reading an unknown word as [UNK] (100) until the
    tokenizer is saved and loaded again; bertkit reads it as the new token at once, and said nothing."""
    ours = BertTokenizer.from_pretrained(minilm_2_layers)
    hf = transformers.BertTokenizerFast.from_pretrained(minilm_2_layers)
    with caplog.at_level("WARNING", logger="bertkit"):
        ours.unk_token = hf.unk_token = "[MASK]"
    assert ours.unk_token_id == hf.unk_token_id == 103
    assert hf("a \U0001f600")["input_ids"] == [101, 1037, 100, 102]
    assert ours("a \U0001f600")["input_ids"] == [101, 1037, 103, 102]
    ours.save_pretrained(tmp_path)
    assert transformers.BertTokenizerFast.from_pretrained(tmp_path)("a \U0001f600")["input_ids"] == [101, 1037, 103, 102]
    said = [r.getMessage() for r in caplog.records if r.name == "bertkit"]
    assert len(said) == 1 and "keeps encoding '[UNK]' (id 100) while its unk_token_id says 103" in said[0], said


@pytest.mark.parametrize("replace", [True, False])
def test_add_special_tokens_takes_replace_extra_special_tokens_as_transformers(minilm_dir, replace):
    """add_special_tokens(..., replace_extra_special_tokens=False), transformers 5's keyword, was a TypeError; either
    value gives transformers' ids and decode (its replaced tokens stay special)."""
    ours = BertTokenizer.from_pretrained(minilm_dir)
    hf = transformers.BertTokenizerFast.from_pretrained(minilm_dir)
    for t in (ours, hf):
        t.add_special_tokens({"additional_special_tokens": ["[E1]"]})
        assert t.add_special_tokens({"additional_special_tokens": ["[E2]"]}, replace_extra_special_tokens=replace) == 1
    ids = [101, 1060, 30522, 30523, 102]
    assert ours("x [E1] [E2]")["input_ids"] == hf("x [E1] [E2]")["input_ids"] == ids
    assert ours.decode(ids, skip_special_tokens=True) == hf.decode(ids, skip_special_tokens=True) == "x"
    with pytest.raises(BertkitError, match="replace_extra_special_tokens='no': pass True or False"):
        ours.add_special_tokens({"pad_token": "[E1]"}, replace_extra_special_tokens="no")
    assert ours.pad_token == "[PAD]"


def test_special_tokens_passed_to_from_pretrained_and_extra_special_tokens_as_transformers(minilm_dir, tmp_path):
    """from_pretrained(path, pad_token="[NEWPAD]") or (extra_special_tokens=["[E1]"]) was refused ("the vocabulary
    lacks the special tokens"): transformers adds them past the vocabulary. extra_special_tokens, transformers 5's
    name for additional_special_tokens, was refused by from_pretrained and add_special_tokens. from_pretrained(path,
    pad_token="[MASK]", additional_special_tokens=["hello"]) made the old "[PAD]" plain text ([1031, 11687, 1033]),
    where transformers still cuts it out as 0."""
    kw = {"pad_token": "[NEWPAD]", "extra_special_tokens": ["[E1]", "[MASK]"], "mask_token": "[M2]"}
    ours, hf = BertTokenizer.from_pretrained(minilm_dir, **kw), transformers.BertTokenizerFast.from_pretrained(minilm_dir, **kw)
    text = "x [E1] [NEWPAD] hello [M2] [PAD] [MASK]"
    want = [101, 1060, 30524, 30522, 7592, 30523, 0, 103, 102]
    assert ours(text)["input_ids"] == hf(text)["input_ids"] == want
    assert (len(ours), ours.vocab_size, ours.pad_token_id) == (len(hf), hf.vocab_size, hf.pad_token_id) == (30525, 30522, 30522)
    ours.save_pretrained(tmp_path)
    for again in (BertTokenizer.from_pretrained(tmp_path), transformers.BertTokenizerFast.from_pretrained(tmp_path)):
        assert again(text)["input_ids"] == want
    kw = {"pad_token": "[MASK]", "additional_special_tokens": ["hello"]}
    ours, hf = BertTokenizer.from_pretrained(minilm_dir, **kw), transformers.BertTokenizerFast.from_pretrained(minilm_dir, **kw)
    assert ours("[PAD] x hello")["input_ids"] == hf("[PAD] x hello")["input_ids"] == [101, 0, 1060, 7592, 102]
    ours, hf = BertTokenizer.from_pretrained(minilm_dir), transformers.BertTokenizerFast.from_pretrained(minilm_dir)
    assert ours.add_special_tokens({"extra_special_tokens": ["[E2]"]}) == hf.add_special_tokens(
        {"extra_special_tokens": ["[E2]"]}) == 1
    assert ours.extra_special_tokens == hf.extra_special_tokens == ["[E2]"]
    with pytest.raises(BertkitError, match=r"tok.additional_special_tokens = \['\[E3\]'\]: .*add_special_tokens"):
        ours.extra_special_tokens = ["[E3]"]
    with pytest.raises(BertkitError, match="got both extra_special_tokens and additional_special_tokens"):
        BertTokenizer.from_pretrained(minilm_dir, extra_special_tokens=["[E1]"], additional_special_tokens=["[E2]"])


@pytest.mark.parametrize("return_tensors", ["pt", "np"])
def test_pad_of_one_example_gives_its_row_unbatched(toks, sentences, return_tensors):
    # transformers pads one example dict to (T,) tensors (as its columns came); bertkit gave (1, T)
    ours, hf = toks
    for kw in ({}, {"padding": "max_length", "max_length": 40}):
        a = ours.pad(dict(ours(sentences[0])), return_tensors=return_tensors, **kw)
        b = hf.pad(dict(hf(sentences[0])), return_tensors=return_tensors, **kw)
        assert set(a) == set(b)
        for key in b:
            assert a[key].shape == b[key].shape and a[key].ndim == 1 and a[key].tolist() == b[key].tolist(), key


@pytest.mark.parametrize("kind", ["pt", "np"])
def test_pad_returns_the_kind_of_tensor_it_was_given(toks, sentences, kind):
    # transformers' pad without return_tensors returns torch tensors for torch inputs and arrays for numpy ones
    # (DataLoader collate functions rely on it); bertkit returned lists
    import numpy as np

    ours, hf = toks
    as_kind = torch.tensor if kind == "pt" else np.asarray
    examples = [{k: as_kind(v) for k, v in ours(s).items()} for s in sentences[:5]]
    a, b = ours.pad(examples), hf.pad([dict(e) for e in examples])
    assert set(a) == set(b)
    for key in b:
        assert type(a[key]) is type(b[key]) and a[key].dtype == b[key].dtype and a[key].tolist() == b[key].tolist()
    batch = {k: as_kind(v) for k, v in ours(sentences[:5], padding=True).items()}
    a, b = ours.pad(batch, padding="max_length", max_length=64), hf.pad(dict(batch), padding="max_length",
                                                                        max_length=64)
    for key in b:
        assert type(a[key]) is type(b[key]) and a[key].shape == b[key].shape == (5, 64)
        assert a[key].tolist() == b[key].tolist()
    assert isinstance(ours.pad(examples, return_tensors="np")["input_ids"], np.ndarray)  # an explicit kind wins


def test_padding_to_max_length_without_any_max_length_is_named(minilm_dir, tmp_path):
    # files that set no model_max_length leave transformers' "no limit" (10^30): transformers warns and leaves the
    # rows unpadded; bertkit tried to pad to 10^30 tokens and died with an OverflowError naming nothing
    for name in ("tokenizer.json", "special_tokens_map.json"):
        (tmp_path / name).write_bytes((minilm_dir / name).read_bytes())
    config = json.loads((minilm_dir / "tokenizer_config.json").read_text())
    del config["model_max_length"]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    ours = BertTokenizer.from_pretrained(tmp_path)
    hf = transformers.BertTokenizerFast.from_pretrained(tmp_path)
    assert ours.model_max_length == hf.model_max_length == int(1e30)
    examples = [{"input_ids": [101, 1037, 1038, 102]}, {"input_ids": [101, 1039, 102]}]
    for call in (lambda tok: tok(["a b", "c"], padding="max_length"),
                 lambda tok: tok.pad(examples, padding="max_length")):
        assert call(hf)["input_ids"] == [[101, 1037, 1038, 102], [101, 1039, 102]]
        with pytest.raises(BertkitError, match="padding='max_length' without max_length.*has none.*pass max_length="):
            call(ours)
    assert ours(["a b", "c"], padding="max_length", max_length=5)["input_ids"] == [[101, 1037, 1038, 102, 0],
                                                                                 [101, 1039, 102, 0, 0]]
    assert ours(["a b"], truncation=True)["input_ids"] == [[101, 1037, 1038, 102]]  # no limit to cut at: as it is


def test_pad_names_a_passed_through_column_of_uneven_rows(toks):
    # token labels left unpadded cannot become a tensor (transformers fails too); bertkit's error was numpy's
    # "inhomogeneous shape", naming no column
    ours, hf = toks
    examples = [{"input_ids": [101, 1037, 102], "labels": [-100, 3, -100]}, {"input_ids": [101, 102], "labels": [-100, -100]}]
    for return_tensors in ("pt", "np"):
        with pytest.raises(BertkitError, match=r"'labels' has rows of 2\.\.3 values.*-100"):
            ours.pad(examples, return_tensors=return_tensors)
    with pytest.raises(ValueError, match="labels"):
        hf.pad([dict(e) for e in examples], return_tensors="pt")
    assert ours.pad(examples)["labels"] == [[-100, 3, -100], [-100, -100]]  # lists: passed through as they are


def test_add_special_tokens_none_is_refused_not_read_as_false(toks):
    """add_special_tokens=None (a setting left unset) gave rows without [CLS] and [SEP], [7592, 2088] where the default
    gives [101, 7592, 2088, 102]; transformers raises a TypeError."""
    ours, hf = toks
    with pytest.raises(TypeError):
        hf("hello world", add_special_tokens=None)
    for bad in (None, "no"):
        with pytest.raises(BertkitError, match=f"add_special_tokens={bad!r}: pass True"):
            ours("hello world", add_special_tokens=bad)
    assert ours("hello world", add_special_tokens=True)["input_ids"] == [101, 7592, 2088, 102]
    assert ours.encode("hello world", add_special_tokens=False) == hf.encode("hello world", add_special_tokens=False)


def test_pad_names_examples_tokenized_with_return_tensors(toks):
    """Examples tokenized one by one with return_tensors="pt" hold (1, T) rows; the padding collators met numpy's
    "setting an array element with a sequence" (transformers: torch's "stack expects each tensor to be equal size")."""
    ours, hf = toks
    examples = [ours(t, return_tensors="pt") for t in ("hello world", "a")]
    with pytest.raises(BertkitError, match=r"example 0's input_ids hold 1 row\(s\) of tokens, not token ids.*"
                                           r"without return_tensors"):
        ours.pad(examples)
    with pytest.raises(BertkitError, match="example 0's input_ids hold 1 row"):
        DataCollatorWithPadding(ours)(examples)
    with pytest.raises(RuntimeError, match="stack expects each tensor to be equal size"):
        transformers.DataCollatorWithPadding(hf)([hf(t, return_tensors="pt") for t in ("hello world", "a")])
    assert ours.pad([{k: v[0] for k, v in e.items()} for e in examples])["input_ids"].tolist() == [
        [101, 7592, 2088, 102], [101, 1037, 102, 0]]
