"""CoNLL-2003 reader, IOB1/IOB2, first-sub-token featurization, and conlleval scoring.

conlleval's numbers are checked on hand-computed cases (the boundary rules included) and, when
`seqeval` is installed, against seqeval's default mode (which follows conlleval) on random and real tags.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from bertkit.data.collate import collate
from bertkit.tasks import ner
from bertkit.tokenization import BertTokenizer

LABELS = ["O", "B-LOC", "I-LOC", "B-MISC", "I-MISC", "B-ORG", "I-ORG", "B-PER", "I-PER"]


@pytest.fixture(scope="module")
def tok(minilm_dir):
    """bertkit's own tokenizer on the example checkpoint's vocabulary (uncased)."""
    return BertTokenizer.from_pretrained(minilm_dir)


@pytest.fixture(scope="module")
def conll_dir(data_dir):
    path = data_dir / "conll2003"
    if not path.is_dir():
        pytest.skip(f"shared data absent at {path}")
    return path


def _write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


# ---------------------------------------------------------------- reading


@pytest.mark.parametrize(
    "split, sentences, tokens, b_counts",
    [
        ("train", 14041, 203621, {"PER": 6600, "ORG": 6321, "LOC": 7140, "MISC": 3438}),
        ("valid", 3250, 51362, {"PER": 1842, "ORG": 1341, "LOC": 1837, "MISC": 922}),
        ("test", 3453, 46435, {"PER": 1617, "ORG": 1661, "LOC": 1668, "MISC": 702}),
    ],
)
def test_real_conll_counts(split, sentences, tokens, b_counts, conll_dir):
    data = ner.read_conll(conll_dir / f"{split}.txt")
    assert len(data) == sentences
    assert sum(len(s.words) for s in data) == tokens
    assert {t: sum(tag == f"B-{t}" for s in data for tag in s.tags) for t in b_counts} == b_counts
    assert ner.label_list(data) == LABELS


def test_real_conll_first_and_last_sentence(conll_dir):
    data = ner.read_conll(conll_dir / "train.txt")
    first = data[0]
    assert first.words == ("EU", "rejects", "German", "call", "to", "boycott", "British", "lamb", ".")
    assert first.tags == ("B-ORG", "O", "B-MISC", "O", "O", "O", "B-MISC", "O", "O")
    assert first.line == 3  # after "-DOCSTART- -X- -X- O" and a blank line
    assert data[1].words == ("Peter", "Blackburn") and data[1].tags == ("B-PER", "I-PER")
    assert data[-1].words == ("Swansea", "1", "Lincoln", "2")
    assert data[-1].tags == ("B-ORG", "O", "B-ORG", "O")


def test_iob1_to_iob2_by_hand():
    iob1 = ["I-PER", "I-PER", "B-PER", "O", "I-LOC", "I-ORG", "I-ORG", "O", "B-MISC"]
    assert ner.iob1_to_iob2(iob1) == [
        "B-PER",
        "I-PER",
        "B-PER",
        "O",
        "B-LOC",
        "B-ORG",
        "I-ORG",
        "O",
        "B-MISC",
    ]
    iob2 = ["B-PER", "I-PER", "O", "B-LOC"]
    assert ner.iob1_to_iob2(iob2) == iob2  # IOB2 is a fixed point


def test_read_iob1_file_converts_and_iob2_check_names_the_line(tmp_path):
    path = _write(tmp_path / "eng.train", (
        "-DOCSTART- -X- O O\n\n"
        "EU NNP I-NP I-ORG\nrejects VBZ I-VP O\nGerman JJ I-NP I-MISC\n\n"
        "Peter NNP I-NP I-PER\nBlackburn NNP I-NP I-PER\n"
    ))  # fmt: skip
    s1, s2 = ner.read_conll(path, tag_scheme="iob1")
    assert s1.tags == ("B-ORG", "O", "B-MISC") and s2.tags == ("B-PER", "I-PER")
    assert (s1.line, s2.line) == (3, 7)
    fix = r"pass --tag-scheme iob1 \(tag_scheme='iob1' from Python\)"
    with pytest.raises(ValueError, match=rf"{path} line 3: tag 'I-ORG' follows 'O'.*{fix}"):
        ner.read_conll(path)


def test_malformed_lines_name_file_and_line(tmp_path):
    path = _write(tmp_path / "bad.txt", "EU NNP B-NP B-ORG\nrejects VBZ O\n")
    with pytest.raises(
        ValueError, match=rf"malformed line in {path} line 2: expected 4 space-separated columns"
    ):
        ner.read_conll(path)
    path = _write(tmp_path / "tag.txt", "EU NNP B-NP ORG\n")
    with pytest.raises(ValueError, match=r"tag\.txt line 1: tag 'ORG' is not O, B-TYPE or I-TYPE"):
        ner.read_conll(path)
    path = _write(tmp_path / "words.txt", "-DOCSTART- -X- O O\n\nEU\nrejects O\n")  # a word with no tag first
    with pytest.raises(ValueError, match=r"malformed line in .*words\.txt line 3: expected 'word \.\.\. tag'"):
        ner.read_conll(path)
    with pytest.raises(FileNotFoundError, match="missing.txt"):
        ner.read_conll(tmp_path / "missing.txt")


def test_two_column_files_and_trailing_sentence_without_blank_line(tmp_path):
    path = _write(tmp_path / "two.txt", "\n\nJohn B-PER\nlives O\n\n\nin O\nParis B-LOC")
    a, b = ner.read_conll(path)
    assert a.words == ("John", "lives") and b.tags == ("O", "B-LOC") and b.line == 7


def test_columns_are_split_at_spaces_and_tabs_so_a_word_may_hold_a_no_break_space(tmp_path):
    """As datasets' conll2003 reader splits them (at " "); was refused: "expected 2 ... columns, got 3"."""
    path = _write(tmp_path / "nbsp.txt", "It O\nwas\tO\n10\u00a0000 O\nEUR\u2009 B-MISC\n\nOK  O\n")
    a, b = ner.read_conll(path)
    assert a.words == ("It", "was", "10\u00a0000", "EUR\u2009") and a.tags == ("O", "O", "O", "B-MISC")
    assert b.words == ("OK",) and b.line == 6


# ---------------------------------------------------------------- conlleval by hand


def _scores(gold, pred):
    r = ner.conlleval(gold, pred)
    return (
        r["found_gold"],
        r["found_guessed"],
        r["correct"],
        round(r["precision"], 6),
        round(r["recall"], 6),
        round(r["f1"], 6),
    )


def test_conlleval_type_error_counts_against_both_sides():
    r = ner.conlleval([["B-PER", "I-PER", "O", "B-LOC"]], [["B-PER", "I-PER", "O", "B-ORG"]])
    assert (r["found_gold"], r["found_guessed"], r["correct"]) == (2, 2, 1)
    assert (r["precision"], r["recall"], r["f1"], r["accuracy"]) == (50.0, 50.0, 50.0, 75.0)
    assert r["per_type"]["PER"]["f1"] == 100.0
    assert r["per_type"]["LOC"] == {
        "precision": 0.0,
        "recall": 0.0,
        "f1": 0.0,
        "found_gold": 1,
        "found_guessed": 0,
        "correct": 0,
    }
    assert r["per_type"]["ORG"] == {
        "precision": 0.0,
        "recall": 0.0,
        "f1": 0.0,
        "found_gold": 0,
        "found_guessed": 1,
        "correct": 0,
    }


@pytest.mark.parametrize(
    "gold, pred, expected",
    [
        # I- after O starts a chunk (conlleval's startOfChunk O->I): same chunk as B-PER I-PER.
        (["O", "I-PER", "I-PER", "O"], ["O", "B-PER", "I-PER", "O"], (1, 1, 1, 100.0, 100.0, 100.0)),
        # A type change inside I- tags ends one chunk and starts another: PER(0) + LOC(1) vs PER(0-1).
        (["B-PER", "I-PER"], ["B-PER", "I-LOC"], (1, 2, 0, 0.0, 0.0, 0.0)),
        # B- after B- of the same type: two one-word chunks.
        (["B-PER", "B-PER"], ["B-PER", "I-PER"], (2, 1, 0, 0.0, 0.0, 0.0)),
        # Right start and type, wrong end: not correct.
        (["B-ORG", "I-ORG", "I-ORG"], ["B-ORG", "I-ORG", "O"], (1, 1, 0, 0.0, 0.0, 0.0)),
        # I- after B- of another type (ill-formed IOB2) still starts a new chunk.
        (["B-LOC", "I-PER", "O"], ["B-LOC", "B-PER", "O"], (2, 2, 2, 100.0, 100.0, 100.0)),
        # Nothing predicted: precision 0 by convention, no division by zero.
        (["B-MISC", "O"], ["O", "O"], (1, 0, 0, 0.0, 0.0, 0.0)),
        # Hyphens in types are allowed (everything after the first hyphen is the type).
        (["B-ORG-X", "I-ORG-X"], ["B-ORG-X", "I-ORG-X"], (1, 1, 1, 100.0, 100.0, 100.0)),
        # 2 of 3 gold chunks found, 1 spurious: P 2/3, R 2/3.
        (["B-PER", "O", "B-LOC", "I-LOC", "O", "B-ORG"], ["B-PER", "O", "B-LOC", "I-LOC", "B-MISC", "O"],
         (3, 3, 2, 66.666667, 66.666667, 66.666667)),
    ],
)  # fmt: skip
def test_conlleval_boundary_cases(gold, pred, expected):
    assert _scores([gold], [pred]) == expected


def test_sentence_break_ends_chunks():
    # B-PER at the end of one sentence, I-PER at the start of the next: two entities, not one.
    gold = [["O", "B-PER"], ["I-PER", "O"]]
    assert _scores(gold, gold) == (2, 2, 2, 100.0, 100.0, 100.0)
    assert _scores([["O", "B-PER", "I-PER", "O"]], [["O", "B-PER", "I-PER", "O"]])[:3] == (1, 1, 1)
    with pytest.raises(ValueError, match="sentence 0: 2 gold tags but 1 predicted"):
        ner.conlleval([["O", "O"]], [["O"]])


@pytest.mark.parametrize(
    ("gold", "pred", "message"),
    [
        # IOBES: conlleval took two S-PER in a row for one person (F1 0 here, seqeval's 66.7).
        ([["S-PER", "S-PER"]], [["S-PER", "O"]], "sentence 0: gold tag 'S-PER' is not O, B-TYPE or I-TYPE"),
        ([["B-PER", "I-PER"]], [["B-PER", "E-PER"]], "sentence 0: predicted tag 'E-PER' is not O, B-TYPE"),
        ([["O"], ["B-", "O"]], [["O"], ["O", "O"]], "sentence 1: gold tag 'B-' is not"),
        # Nothing to score: was P = R = F1 = accuracy = 0.
        ([], [], r"no tags to score \(0 sentences"),
        ([[]], [[]], r"no tags to score \(1 sentences"),
    ],
)  # fmt: skip
def test_conlleval_refuses_tags_it_cannot_read_and_an_empty_input(gold, pred, message):
    with pytest.raises(ValueError, match=message) as info:
        ner.conlleval(gold, pred)
    if "tag" in message and "no tags" not in message:
        assert "convert IOBES (S-, E-) tags to IOB2" in str(info.value)


def _seqeval_scores(gold, pred):
    metrics = pytest.importorskip("seqeval.metrics")
    report = metrics.classification_report(gold, pred, output_dict=True, zero_division=0)
    per_type = {k: v for k, v in report.items() if k not in ("micro avg", "macro avg", "weighted avg")}
    return (
        100 * metrics.precision_score(gold, pred, zero_division=0),
        100 * metrics.recall_score(gold, pred, zero_division=0),
        100 * metrics.f1_score(gold, pred, zero_division=0),
        per_type,
    )


def _check_against_seqeval(gold, pred):
    ours = ner.conlleval(gold, pred)
    p, r, f, per_type = _seqeval_scores(gold, pred)
    assert (ours["precision"], ours["recall"], ours["f1"]) == (
        pytest.approx(p),
        pytest.approx(r),
        pytest.approx(f),
    )
    assert set(per_type) == set(ours["per_type"])
    for t, s in per_type.items():
        assert ours["per_type"][t]["precision"] == pytest.approx(100 * s["precision"]), t
        assert ours["per_type"][t]["recall"] == pytest.approx(100 * s["recall"]), t
        assert ours["per_type"][t]["f1"] == pytest.approx(100 * s["f1-score"]), t
        assert ours["per_type"][t]["found_gold"] == s["support"], t


@pytest.mark.parametrize("seed", range(20))
def test_conlleval_matches_seqeval_on_random_ill_formed_tags(seed):
    pytest.importorskip("seqeval")
    rng = random.Random(seed)
    tags = ["O", "O", "O", "B-PER", "I-PER", "B-LOC", "I-LOC", "B-ORG", "I-ORG"]
    gold = [[rng.choice(tags) for _ in range(rng.randint(1, 15))] for _ in range(rng.randint(1, 12))]
    pred = [[rng.choice(tags) if rng.random() < 0.4 else t for t in s] for s in gold]
    _check_against_seqeval(gold, pred)


def test_conlleval_matches_seqeval_on_real_corrupted_predictions(conll_dir):
    pytest.importorskip("seqeval")
    gold = [list(s.tags) for s in ner.read_conll(conll_dir / "valid.txt")]
    assert ner.conlleval(gold, gold)["f1"] == 100.0
    rng = random.Random(0)
    pred = [[rng.choice(LABELS) if rng.random() < 0.1 else t for t in s] for s in gold]
    _check_against_seqeval(gold, pred)


# ---------------------------------------------------------------- featurization


def test_labels_on_first_sub_token_only(tok):
    sent = ner.NerSentence(("Lithuanians", "visit", "EU"), ("B-MISC", "O", "B-ORG"), 1)
    (f,) = ner.featurize_ner([sent], tok, LABELS)
    pieces = [tok.tokenize(w) for w in sent.words]
    assert pieces[0] == ["lithuanian", "##s"]
    assert f["input_ids"] == [tok.cls_token_id, *tok.convert_tokens_to_ids(sum(pieces, [])), tok.sep_token_id]
    assert f["labels"] == [-100, LABELS.index("B-MISC"), -100, 0, LABELS.index("B-ORG"), -100]
    assert f["word_ids"] == [None, 0, None, 1, 2, None]
    assert f["attention_mask"] == [1] * 6 and f["token_type_ids"] == [0] * 6
    batch = collate(
        [f, {**f, "input_ids": f["input_ids"][:3], "labels": f["labels"][:3]}], tok.pad_token_id
    )
    assert batch["labels"][1].tolist() == [-100, LABELS.index("B-MISC"), -100, -100, -100, -100]


def test_word_without_pieces_gets_unk_and_unknown_tag_is_an_error(tok):
    (f,) = ner.featurize_ner([ner.NerSentence(("a", "\u200b", "b"), ("O", "B-PER", "O"), 1)], tok, LABELS)
    assert f["input_ids"][2] == tok.unk_token_id and f["labels"][2] == LABELS.index("B-PER")
    with pytest.raises(ValueError, match="tag 'B-DATE' .* is not in the label list"):
        ner.featurize_ner([ner.NerSentence(("x",), ("B-DATE",), 4)], tok, LABELS)


def test_long_sentence_is_split_into_windows_not_truncated(tok):
    words = tuple(f"Lithuanians{i}" for i in range(40))  # several pieces each
    tags = tuple("B-MISC" if i % 3 == 0 else "O" for i in range(40))
    sentences = [ner.NerSentence(("Short", "one"), ("O", "O"), 1), ner.NerSentence(words, tags, 3)]
    feats = ner.featurize_ner(sentences, tok, LABELS, max_seq_length=32)
    assert len(feats) > 3 and all(len(f["input_ids"]) <= 32 for f in feats)
    assert [f["sentence_index"] for f in feats][:2] == [0, 1]
    # Oracle predictions (the labels themselves; -100 positions carry anything) give back every tag.
    preds = [[lab if lab >= 0 else 0 for lab in f["labels"]] for f in feats]
    assert ner.align_predictions(feats, preds, LABELS) == [["O", "O"], list(tags)]
    with pytest.raises(ValueError, match="do not cover every word of sentence 1"):
        ner.align_predictions(feats[:2], preds[:2], LABELS, num_sentences=2)


def test_real_valid_set_round_trip(tok, conll_dir):
    data = ner.read_conll(conll_dir / "valid.txt")
    feats = ner.featurize_ner(data, tok, LABELS, max_seq_length=128)
    n_split = len(feats) - len(data)
    print(f"CoNLL valid at 128: {n_split} sentences needed a second window")
    assert all(len(f["input_ids"]) <= 128 for f in feats)
    preds = [[lab if lab >= 0 else 0 for lab in f["labels"]] for f in feats]
    words_tags = ner.align_predictions(feats, preds, LABELS)
    assert words_tags == [list(s.tags) for s in data]
    assert ner.conlleval([list(s.tags) for s in data], words_tags)["f1"] == 100.0


def test_a_training_file_without_an_entity_is_refused_not_trained_as_a_one_label_tagger(tmp_path, tiny_checkpoint):
    """Every tag O: transformers' run_ner.py trains a tagger of the one label O, whose loss is 0 at every step."""
    from bertkit.errors import BertkitError
    from bertkit.settings import NerSettings
    from bertkit.training.token_tasks import finetune_ner

    tiny_checkpoint(tmp_path / "model", tokenizer=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "said", "paris"])
    (tmp_path / "conll").mkdir()
    for split in ("train", "valid", "test"):
        (tmp_path / "conll" / f"{split}.txt").write_text("the X X O\nsaid X X O\n\nparis X X O\n")
    settings = NerSettings(model_name_or_path=tmp_path / "model", output_dir=tmp_path / "out",
                           data_dir=tmp_path / "conll", max_steps=1, batch_size=2, progress=False, device="cpu")
    with pytest.raises(BertkitError, match=r"conll/train\.txt: every tag of its 2 sentences is O.*last column"):
        finetune_ner(settings)
    assert not (tmp_path / "out").exists()
    # a set without entities still has a label list (extracting its activations needs one)
    assert ner.label_list(ner.read_conll(tmp_path / "conll" / "train.txt")) == ["O"]
