"""Randomized differential test of text that is not plain ASCII as it comes back out of bertkit: words, entities and
their spans (token-classification), answers and their spans (question-answering, and serve's answers widened to
words), candidates and filled sequences (fill-mask), and `bertkit predict`'s JSON lines. Each seed draws CoNLL-2003
sentences and SQuAD paragraphs mutated with accented Latin (NFC and NFD), combining marks, CJK, emoji and other astral
characters, zero-width and right-to-left marks, NBSP and other Unicode whitespace, control characters, [UNK] words,
words past max_input_chars_per_word, Turkish dotted I and German sharp s, and compares them with transformers on the
same weights (tiny random heads over MiniLM's vocabulary): spans are code-point offsets into the original text, equal
to the Rust tokenizer's, and ``text[start:end]`` is the word or answer.

Question-answering is compared with the SQuAD recipe run on transformers' own windows, offsets and logits (transformers
5 has no question-answering pipeline). Entities are compared wherever transformers' pipeline can tell a word's first
piece from a continuation: it takes a piece whose text length differs from its token's (``len("ecole") !=
len("e\\u0301cole")``, an emoji read as ``[UNK]``) for a continuation of the word before and groups the two, where
bertkit's words are the tokenizer's (docs/inference.md); those texts are checked against ``word_ids()`` alone.

Slow: ``BERTKIT_FUZZ_UNICODE`` draws per task, 40 by default (about 30 s on a busy 2-core machine)."""

from __future__ import annotations

import json
import os
import random
import unicodedata

import numpy as np
import pytest
import torch

import bertkit
from bertkit.cli import main
from bertkit.inference.tasks import _answer, _word_bounds
from bertkit.tasks.ner import read_conll

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.slow

from pipeline_helpers import tiny_dir  # noqa: E402 (after the skip: it imports transformers)

DRAWS = int(os.environ.get("BERTKIT_FUZZ_UNICODE", "40"))
POOLS = {
    "accent": list("éèêëàâäôöûüçñÉÀÖÜÑøåæœÆØÅłŁđĐ"),
    "combining": ["e\u0301", "a\u0308", "o\u0302\u0323", "\u0301", "\u0327", "u\u0308\u0301"],
    "cjk": list("中文日本語漢字北京東京大学ひらがなカタカナ") + ["東京大学", "한국어", "\u1100\u1161"],
    "astral": ["😀", "👍🏽", "👨\u200d👩\u200d👧", "🇫🇷", "𝔘𝔫𝔦", "𐍈", "❤️", "𝐀𝐁", "\U00020000"],
    "zero-width": ["\u200b", "\u200c", "\u200d", "\u2060", "\ufeff", "\u00ad"],
    "space": ["\u00a0", "\u2003", "\u3000", "\u202f", "\t", "\n", "  ", "\r\n", "\u2028", "\u0085", "\u1680"],
    "control": ["\x00", "\x01", "\x07", "\x1b", "\x7f", "\x9f", "\x1c", "\x0b", "\x0c", "\ufffd"],
    "rtl": ["שלום", "عربية", "مرحبا", "\u200f", "\u200e", "\u202b", "\u202c"],
    "case": ["İstanbul", "İ", "ı", "ß", "Straße", "ẞ", "ﬁ", "Σίσυφος", "ΌΣΟΣ", "ǅ", "ŉ", "ᾼ", "K", "Å"],
    "long": ["x" * 101, "supercalifragilistic" * 6, "é" * 120, "a" * 99 + "é"],
    "unknown": ["☃", "⅓", "℃", "𝟘", "ꙮ", "ʘ"],
    "special": ["[SEP]", "[MASK]", "[CLS]", "[UNK]", "[mask]"],
    "punctuation": ["«", "»", "„", "“", "—", "…", "¿", "·", "§", "€", "£"],
}


def _mutated(rng: random.Random, text: str, most: int = 6) -> str:
    words = text.split(" ")
    for _ in range(rng.randint(1, most)):
        piece = rng.choice(POOLS[rng.choice(list(POOLS))])
        j = rng.randrange(len(words))
        where = rng.random()
        if where < 0.4:
            words.insert(j, piece)
        elif where < 0.7:
            k = rng.randrange(len(words[j]) + 1)
            words[j] = words[j][:k] + piece + words[j][k:]
        else:
            words[j] += piece
    text = rng.choice([" ", " ", "\u00a0", "  "]).join(words)
    return unicodedata.normalize(rng.choice(["NFC", "NFD", "NFKC"]), text) if rng.random() < 0.3 else text


@pytest.fixture(scope="module")
def corpus(data_dir):
    sentences = [" ".join(s.words) for s in read_conll(data_dir / "conll2003/valid.txt")[:300]]
    squad = json.loads((data_dir / "squad/dev-v1.1.json").read_text(encoding="utf-8"))["data"][:4]
    questions = [(qa["question"], p["context"]) for a in squad for p in a["paragraphs"][:5] for qa in p["qas"][:2]]
    return sentences, questions


@pytest.fixture(scope="module")
def hf_tok(minilm_dir):
    return transformers.BertTokenizerFast.from_pretrained(minilm_dir)


def _spans(entities) -> list[tuple]:
    return [(e["entity_group"], e["start"], e["end"]) for e in entities]


def test_tagged_words_and_entities_are_transformers_on_unicode_text(tmp_path_factory, minilm_dir, corpus, hf_tok):
    sentences, questions = corpus
    tags = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC", "B-ORG", "I-ORG", "B-MISC", "I-MISC"]
    d, _ = tiny_dir(tmp_path_factory, minilm_dir, "BertForTokenClassification", seed=3,
                    id2label=dict(enumerate(tags)), label2id={t: i for i, t in enumerate(tags)})
    ours = bertkit.pipeline("token-classification", d, batch_size=8)
    theirs = transformers.pipeline("token-classification", model=str(d), device="cpu")
    rng = random.Random(0)
    bases = sentences + [c[:400] for _, c in questions]
    texts = [_mutated(rng, rng.choice(bases)) for _ in range(DRAWS)]
    compared = 0
    for text, got in zip(texts, ours(texts), strict=True):
        enc = hf_tok(text, return_offsets_mapping=True, truncation=True, max_length=512)
        word_ids, offsets = enc.word_ids(), enc["offset_mapping"]
        words = sorted({w for w in word_ids if w is not None})
        expected = [(offsets[word_ids.index(w)][0], offsets[len(word_ids) - 1 - word_ids[::-1].index(w)][1])
                    for w in words]
        assert [(w["start"], w["end"]) for w in got["words"]] == expected, text
        for w in got["words"] + got["entities"]:
            assert text[w["start"]:w["end"]] == w["word"], text
        pieces = hf_tok.convert_ids_to_tokens(enc["input_ids"])
        if any((len(p) != e - s) != p.startswith("##") for p, (s, e) in zip(pieces, offsets) if e > s):
            continue  # transformers' length test takes a first piece for a continuation here (module docstring)
        for strategy in ("first", "average", "max"):
            ignore = rng.choice([["O"], [], ["O", "PER"]])
            mine = ours(text, aggregation_strategy=strategy, ignore_labels=ignore)["entities"]
            ref = theirs(text, aggregation_strategy=strategy, ignore_labels=ignore)
            assert _spans(mine) == _spans(ref), (text, strategy, ignore)
            np.testing.assert_allclose([e["score"] for e in mine], [float(e["score"]) for e in ref], atol=1e-5)
            compared += len(ref)
    assert compared > 5 * DRAWS  # most texts compared, with many entities each


def _recipe_answer(hf_model, hf_tok, question: str, context: str, align_to_words: bool) -> tuple[int, int, str]:
    """The SQuAD recipe's best span (20 best starts and ends, both in the context, at most 30 tokens) on transformers'
    logits and offsets for one window, widened to words as transformers' ``align_to_words`` does where asked."""
    enc = hf_tok(question, context, truncation="only_second", max_length=384, return_offsets_mapping=True,
                 return_tensors="pt")
    offsets, sequence = enc.pop("offset_mapping")[0].tolist(), enc.sequence_ids(0)
    with torch.no_grad():
        out = hf_model(**enc)
    start_logits, end_logits = out.start_logits[0].double().numpy(), out.end_logits[0].double().numpy()
    best = None
    for s in np.argsort(-start_logits, kind="stable")[:20]:
        for e in np.argsort(-end_logits, kind="stable")[:20]:
            if sequence[s] == 1 and sequence[e] == 1 and s <= e < s + 30:
                if best is None or start_logits[s] + end_logits[e] > best[0]:
                    best = (start_logits[s] + end_logits[e], s, e)
    _, s, e = best
    a, b = offsets[s][0], offsets[e][1]
    if align_to_words:
        a = enc.word_to_chars(enc.token_to_word(s), sequence_index=1)[0]
        b = enc.word_to_chars(enc.token_to_word(e), sequence_index=1)[1]
    return a, b, context[a:b]


def test_answers_and_their_spans_are_the_recipe_on_transformers_windows(tmp_path_factory, minilm_dir, corpus, hf_tok):
    _, questions = corpus
    d, hf_model = tiny_dir(tmp_path_factory, minilm_dir, "BertForQuestionAnswering", seed=5)
    ours = bertkit.pipeline("question-answering", d, max_length=384)
    rng = random.Random(1)
    compared = 0
    for _ in range(DRAWS):
        question, context = rng.choice(questions)
        context = _mutated(rng, context, most=12)
        question = _mutated(rng, question, most=2) if rng.random() < 0.3 else question
        got = ours({"question": question, "context": context}, top_k=3)
        assert all(context[n["start"]:n["end"]] == n["answer"] for n in got["nbest"]), context
        windows = hf_tok(question, context, truncation="only_second", max_length=384, stride=128,
                         return_overflowing_tokens=True)["input_ids"]
        if len(windows) > 1:
            continue  # the recipe scores each token in the window where it has most context; the reference has one
        assert (got["start"], got["end"], got["answer"]) == _recipe_answer(hf_model, hf_tok, question, context, False)
        # bertkit serve widens answers to words, as the Inference API's align_to_words (its default)
        widened = _answer(got, context, _word_bounds(ours.tokenizer, context))
        assert (widened["start"], widened["end"], widened["answer"]) == _recipe_answer(
            hf_model, hf_tok, question, context, True)
        compared += 1
    assert compared > DRAWS // 2


def test_fill_mask_candidates_and_sequences_are_transformers_on_unicode_text(tmp_path_factory, minilm_dir, corpus,
                                                                             hf_tok):
    sentences, _ = corpus
    d, hf_model = tiny_dir(tmp_path_factory, minilm_dir, "BertForMaskedLM", seed=7)
    ours = bertkit.pipeline("fill-mask", d)
    theirs = transformers.pipeline("fill-mask", model=hf_model, tokenizer=hf_tok, device="cpu")
    rng = random.Random(2)
    for _ in range(DRAWS):
        words = _mutated(rng, rng.choice(sentences)[:200]).split(" ")
        for _ in range(1 if rng.random() < 0.8 else 2):
            words.insert(rng.randrange(len(words) + 1), "[MASK]" + rng.choice(["", "", "é", "中", "😀", "\u200b"]))
        text = " ".join(words)
        options = {"top_k": rng.choice([1, 3, 5])}
        if rng.random() < 0.3:  # targets outside the vocabulary are scored by their first piece, as transformers'
            options["targets"] = rng.sample(["café", "Straße", "İstanbul", "東", "😀", "naïve", "ß", "ﬁne", "the"], 3)
        got, ref = ours(text, **options), theirs(text, **options)
        got, ref = (got, ref) if isinstance(got[0], list) else ([got], [ref])
        for mine, theirs_ in zip(got, ref, strict=True):
            assert [(c["token"], c["token_str"], c["sequence"]) for c in mine] == \
                [(c["token"], c["token_str"], c["sequence"]) for c in theirs_], text
            np.testing.assert_allclose([c["score"] for c in mine], [c["score"] for c in theirs_], atol=1e-5)


def test_predict_writes_the_pipelines_words_for_escaped_json_and_refuses_half_a_pair(tmp_path, tiny_checkpoint,
                                                                                    minilm_dir, corpus, capsys):
    sentences, _ = corpus
    model = tiny_checkpoint(tmp_path / "ner", "BertForTokenClassification", tokenizer=minilm_dir, seed=3,
                            labels=["O", "B-PER", "I-PER", "B-LOC", "I-LOC"])
    rng = random.Random(3)
    texts = [_mutated(rng, rng.choice(sentences)) for _ in range(DRAWS)]
    path, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    # escaped (astral characters as surrogate pairs) and as UTF-8, line by line
    path.write_text("".join(json.dumps({"text": t}, ensure_ascii=i % 2 == 0) + "\n" for i, t in enumerate(texts)),
                    encoding="utf-8")
    args = ["predict", "token-classification", "--model", str(model), "--input", str(path), "--output-file", str(out),
            "--overwrite", "--no-progress"]
    assert main(args) == 0
    got = [{k: v for k, v in json.loads(line).items() if k != "id"} for line in out.read_text("utf-8").splitlines()]
    assert len(got) == len(texts)
    expected = json.loads(json.dumps(bertkit.pipeline("token-classification", model)(texts)))
    assert [[(w["word"], w["start"], w["end"], w["tag"]) for w in r["words"]] for r in got] == \
        [[(w["word"], w["start"], w["end"], w["tag"]) for w in r["words"]] for r in expected]
    np.testing.assert_allclose([w["score"] for r in got for w in r["words"]],
                               [w["score"] for r in expected for w in r["words"]], atol=1e-6)
    before = out.read_bytes()
    at = rng.randrange(len(texts))
    lines = path.read_text(encoding="utf-8").split("\n")[:-1]  # lines end at \n alone: a text may hold \u2028
    lines[at] = json.dumps({"text": texts[at] + "\ud83d"})  # half of a pair, escaped: Python's json reads it
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert main(args) == 2
    assert f"in.jsonl:{at + 1}: not valid JSON (a string holds \\ud83d, half of a UTF-16 surrogate pair" in \
        capsys.readouterr().err
    assert out.read_bytes() == before
