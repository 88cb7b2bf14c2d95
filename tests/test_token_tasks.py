"""NER, SQuAD and SWAG fine-tuning recipes: end to end on a tiny model and tiny files, metrics checked exactly.

Metric plumbing is checked with oracle models (their logits put the gold answer on top), so the
reported numbers must be exactly 100; the trained tiny models only have to run and report what their
own prediction files score.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from torch import nn

from bertkit import BertForTokenClassification, BertTokenizer
from bertkit.heads import ClassifierOutput, QuestionAnsweringOutput
from bertkit.tasks import ner, squad, squad_eval
from bertkit.tasks.metrics import to_fractions
from bertkit.training import token_tasks as tt

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]

CONLL = {
    "train": """-DOCSTART- -X- -X- O

EU NNP B-NP B-ORG
rejects VBZ B-VP O
German JJ B-NP B-MISC
call NN I-NP O
to TO B-VP O
boycott VB I-VP O
British JJ B-NP B-MISC
lamb NN I-NP O
. . O O

Peter NNP B-NP B-PER
Blackburn NNP I-NP I-PER

BRUSSELS NNP B-NP B-LOC
1996-08-22 CD I-NP O

The DT B-NP O
European NNP I-NP B-ORG
Commission NNP I-NP I-ORG
said VBD B-VP O
on IN B-PP O
Thursday NNP B-NP O
it PRP B-NP O
disagreed VBD B-VP O
with IN B-PP O
German JJ B-NP B-MISC
advice NN I-NP O
. . O O
""",
    "valid": """CRICKET NNP B-NP O
- : O O
LEICESTERSHIRE NNP B-NP B-ORG
TAKE NNP I-NP O
OVER IN B-PP O
AT NNP B-NP O
TOP NNP I-NP O

LONDON NNP B-NP B-LOC
1996-08-30 CD I-NP O
""",
    "test": """SOCCER NN B-NP O
- : O O
JAPAN NNP B-NP B-LOC
GET VB B-VP O
LUCKY NNP B-NP O
WIN NNP I-NP O
, , O O
CHINA NNP B-NP B-PER
IN IN B-PP O
SURPRISE DT B-NP O
DEFEAT NN I-NP O
. . O O

Nadim NNP B-NP B-PER
Ladki NNP I-NP I-PER
""",
}


def _squad_file(path: Path, n_articles: int = 6, impossible: bool = False) -> Path:
    articles = []
    for a in range(n_articles):
        context = f"The city of Town{a} was founded in {1800 + a} by the river people. It has {a + 3} bridges."
        qas = [{"id": f"q{a}-year", "question": f"When was Town{a} founded?",
                "answers": [{"text": str(1800 + a), "answer_start": context.index(str(1800 + a))}]},
               {"id": f"q{a}-who", "question": "Who founded it?",
                "answers": [{"text": "the river people", "answer_start": context.index("the river people")},
                            {"text": "river people", "answer_start": context.index("river people")}]}]
        if impossible:
            qas.append({"id": f"q{a}-none", "question": "What is the mayor's name?", "answers": [],
                        "is_impossible": True})
        articles.append({"title": f"Town{a}", "paragraphs": [{"context": context, "qas": qas}]})
    path.write_text(json.dumps({"version": "2.0" if impossible else "1.1", "data": articles}))
    return path


SWAG_HEADER = ["", "video-id", "fold-ind", "startphrase", "sent1", "sent2", "gold-source",
               "ending0", "ending1", "ending2", "ending3", "label"]  # fmt: skip


def _swag_file(path: Path, n: int, labelled: bool = True) -> Path:
    rows = []
    for i in range(n):
        row = [str(i), f"vid{i}", str(i), "", f"the man picks up a ball {i} .", "he", "gold",
               "throws it .", "eats the river .", "sings a bridge .", "city the people .", str(i % 4)]
        rows.append(row if labelled else row[:-1])
    with open(path, "w", encoding="utf-8", newline="") as f:
        csv.writer(f).writerows([SWAG_HEADER if labelled else SWAG_HEADER[:-1], *rows])
    return path


@pytest.fixture(scope="module")
def encoder_dir(tmp_path_factory, tiny_checkpoint) -> Path:
    """A 2-layer, 32-wide encoder with a vocabulary of the words used in these tests."""
    words = set()
    for text in CONLL.values():
        words |= {line.split()[0].lower() for line in text.splitlines() if line.strip()}
    words |= set("the city of was founded in by river people it has bridges when who what is mayor's name "
                 "man picks up a ball he throws eats sings bridge . , ? - ' s".split())
    words |= {f"town{a}" for a in range(6)} | {str(1800 + a) for a in range(6)} | {str(n) for n in range(12)}
    return tiny_checkpoint(tmp_path_factory.mktemp("encoder"), tokenizer=SPECIALS + sorted(words))


@pytest.fixture(scope="module")
def conll_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("conll")
    for split, text in CONLL.items():
        (d / f"{split}.txt").write_text(text)
    return d


# ---------------------------------------------------------------- NER


class _OracleTagger(nn.Module):
    """Logits one-hot at the gold label of each first piece: what a perfect tagger predicts."""

    def __init__(self, features, num_labels):
        super().__init__()
        self.gold = {tuple(f["input_ids"]): f["labels"] for f in features}
        self.num_labels = num_labels

    def forward(self, input_ids, token_type_ids=None, attention_mask=None):
        logits = torch.zeros(*input_ids.shape, self.num_labels)
        for row, (ids, mask) in enumerate(zip(input_ids.tolist(), attention_mask.tolist())):
            labels = self.gold[tuple(ids[: sum(mask)])]
            for pos, label in enumerate(labels):
                logits[row, pos, max(label, 0)] = 10.0
        return ClassifierOutput(None, logits)


def test_ner_gold_predictions_score_100(conll_dir, encoder_dir):
    tok = BertTokenizer.from_pretrained(encoder_dir)
    sentences = ner.read_conll(conll_dir / "train.txt")
    labels = ner.label_list(sentences)
    features = ner.featurize_ner(sentences, tok, labels, max_seq_length=8)  # windows: sentences are split
    assert len(features) > len(sentences)
    tags = tt.predict_ner(_OracleTagger(features, len(labels)), sentences, features, labels, pad_id=0, batch_size=3)
    assert tags == [list(s.tags) for s in sentences]
    scores = tt.ner_scores(sentences, tags)
    assert (scores["precision"], scores["recall"], scores["f1"], scores["accuracy"]) == (1.0, 1.0, 1.0, 1.0)
    assert scores["found_gold"] == 7


def test_iob2_labels_complete_every_type():
    sents = [ner.NerSentence(("a", "b"), ("B-PER", "O"), 1), ner.NerSentence(("c",), ("B-LOC",), 3)]
    assert ner.label_list(sents) == ["O", "B-LOC", "I-LOC", "B-PER", "I-PER"]


def _conlleval_file(path):
    """Score a ``word ... gold pred`` file as ``conlleval < file`` does: the last two columns, sentence by sentence."""
    sentences = [[line.split() for line in block.splitlines()] for block in path.read_text().split("\n\n")]
    sentences = [[cols for cols in s if cols[0] != "-DOCSTART-"] for s in sentences]
    sentences = [s for s in sentences if s]
    return ner.conlleval([[c[-2] for c in s] for s in sentences], [[c[-1] for c in s] for s in sentences])


def test_conlleval_on_a_hand_made_file(tmp_path):
    # Gold: [EU]ORG, [Peter Blackburn]PER, [BRUSSELS]LOC  -> 3 entities.
    # Predicted: [EU]ORG correct; [Peter]PER only (wrong span); [BRUSSELS]ORG (wrong type); [lamb]MISC spurious.
    text = """-DOCSTART- O O

EU B-ORG B-ORG
rejects O O
lamb O B-MISC

Peter B-PER B-PER
Blackburn I-PER O

BRUSSELS B-LOC B-ORG
"""
    path = tmp_path / "pred.txt"
    path.write_text(text)
    scores = _conlleval_file(path)
    # 1 correct of 4 guessed and 3 gold: P 25, R 33.33, F1 = 2PR/(P+R) = 28.57; 3 of 6 tags right.
    assert (scores["correct"], scores["found_guessed"], scores["found_gold"]) == (1, 4, 3)
    assert scores["precision"] == pytest.approx(25.0)
    assert scores["recall"] == pytest.approx(100 / 3)
    assert scores["f1"] == pytest.approx(2 * 25 * (100 / 3) / (25 + 100 / 3))
    assert scores["accuracy"] == pytest.approx(50.0)
    assert scores["per_type"]["ORG"]["correct"] == 1 and scores["per_type"]["ORG"]["found_guessed"] == 2


def test_write_conll_round_trips_through_conlleval(tmp_path):
    sents = [ner.NerSentence(("EU", "rejects"), ("B-ORG", "O"), 1), ner.NerSentence(("Peter",), ("B-PER",), 4)]
    pred = [["B-ORG", "O"], ["B-LOC"]]
    path = ner.write_conll(tmp_path / "p.txt", sents, pred)
    assert path.read_text() == "EU B-ORG B-ORG\nrejects O O\n\nPeter B-PER B-LOC\n\n"
    assert _conlleval_file(path) == ner.conlleval([s.tags for s in sents], pred)


def test_finetune_ner_end_to_end(conll_dir, encoder_dir, tmp_path):
    out = tmp_path / "ner"
    report = tt.finetune_ner(tt.NerSettings(data_dir=conll_dir, model_name_or_path=encoder_dir, output_dir=out, num_train_epochs=2,
                                            batch_size=2, learning_rate=1e-3, progress=False))
    assert report["steps"] == 4 and len(report["dev_per_epoch"]) == 2
    assert report["labels"] == ["O", "B-LOC", "I-LOC", "B-MISC", "I-MISC", "B-ORG", "I-ORG", "B-PER", "I-PER"]
    # The written prediction files score exactly what the report says.
    for split in ("dev", "test"):
        assert to_fractions(_conlleval_file(out / f"predictions_{split}.txt")) == report[split]
    assert report["dev_per_epoch"][-1]["f1"] == report["dev"]["f1"]
    # The saved model carries its tag names and reproduces the test predictions.
    model = BertForTokenClassification.from_pretrained(out / "model")
    assert model.config.id2label == dict(enumerate(report["labels"]))
    # and the length it was fine-tuned at, predict ner's default
    assert json.loads((out / "model" / "config.json").read_text())["max_seq_length"] == 128
    tok = BertTokenizer.from_pretrained(out / "model")
    test = ner.read_conll(conll_dir / "test.txt")
    feats = ner.featurize_ner(test, tok, report["labels"], 128)
    tags = tt.predict_ner(model, test, feats, report["labels"], pad_id=tok.pad_token_id)
    assert tt.ner_scores(test, tags) == report["test"]
    assert json.loads((out / "report.json").read_text())["test"] == report["test"]
    assert not (out / "checkpoints").exists()



def test_finetune_ner_predicts_dev_once_per_evaluation(conll_dir, encoder_dir, tmp_path, monkeypatch):
    """The final evaluation's dev tags are the report's and predictions_dev.txt's: dev is not predicted again."""
    passes = []
    real = tt.predict_ner

    def counted(model, sentences, *args, **kwargs):
        passes.append(len(sentences))
        return real(model, sentences, *args, **kwargs)

    monkeypatch.setattr(tt, "predict_ner", counted)
    out = tmp_path / "ner"
    report = tt.finetune_ner(tt.NerSettings(data_dir=conll_dir, model_name_or_path=encoder_dir, output_dir=out,
                                            num_train_epochs=2, batch_size=2, learning_rate=1e-3, progress=False))
    dev, test = (len(ner.read_conll(conll_dir / f)) for f in ("valid.txt", "test.txt"))
    assert passes == [dev, dev, test]
    assert report["dev_per_epoch"][-1]["f1"] == report["dev"]["f1"]
    assert to_fractions(_conlleval_file(out / "predictions_dev.txt")) == report["dev"]

def test_finetune_ner_reports_its_train_subset_the_epochs_it_trained_and_its_dev_subset(conll_dir, encoder_dir,
                                                                                         tmp_path):
    """One run, three lines of its report: a --max-train-samples cut is named; --max-steps overrides
    --num-train-epochs, so the report's epochs are those the steps made (transformers' epoch, steps / steps per
    epoch: 3 steps of 2 an epoch), not the unused setting (3.0 here); dev scores of a --max-eval-samples cut say so
    (as SQuAD's do): a dev F1 on 1 sentence is not the dev set's."""
    report = tt.finetune_ner(tt.NerSettings(data_dir=conll_dir, model_name_or_path=encoder_dir, output_dir=tmp_path,
                                            max_steps=3, batch_size=2, max_train_samples=3, max_eval_samples=1,
                                            progress=False))
    assert report["train_sentences"] == 3 and "the first 3 of the 4" in report["subset"]
    assert report["steps"] == 3 and report["epochs"] == 1.5
    dev = len(ner.read_conll(conll_dir / "valid.txt"))
    assert report["evaluated_on"] == (f"{conll_dir / 'valid.txt'}: all {dev} sentences. Only the first 1 of these "
                                      f"{dev} sentences are scored (--max-eval-samples).")
    assert report["dev"]["found_gold"] == 1  # CRICKET's sentence: the one kept


def test_finetune_swag_reports_which_examples_max_eval_samples_kept(encoder_dir, tmp_path):
    train_file, val_file = _swag_file(tmp_path / "train.csv", 4), _swag_file(tmp_path / "val.csv", 6)
    report = tt.finetune_swag(tt.SwagSettings(train_file=train_file, predict_file=val_file, max_steps=1, batch_size=4,
                                              model_name_or_path=encoder_dir, output_dir=tmp_path / "s",
                                              max_eval_samples=2, progress=False))
    assert report["evaluated_on"] == (f"{val_file}: all 6 examples. Only the first 2 of these 6 examples are scored "
                                      "(--max-eval-samples).")


def test_finetune_ner_refuses_an_entity_type_the_training_data_lacks(encoder_dir, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    for split, text in CONLL.items():
        (data / f"{split}.txt").write_text(text.replace("B-LOC", "B-DATE") if split == "test" else text)
    with pytest.raises(ValueError, match=rf"{data / 'test.txt'} has tags \['B-DATE'\] that train.txt lacks"):
        tt.finetune_ner(tt.NerSettings(data_dir=data, model_name_or_path=encoder_dir, output_dir=tmp_path / "o"))
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("max_eval_samples, message", [
    (1, "--max-eval-samples 1 keeps 1 dev sentences, every tag O: with no entity to find, conlleval's (and seqeval's) "
        "precision, recall and F1 are 0.0 whatever is predicted; pass a larger --max-eval-samples"),
    pytest.param(None, "valid.txt holds 2 sentences, every tag O: with no entity to find, conlleval's (and "
                       "seqeval's) precision, recall and F1 are 0.0 whatever is predicted; score a dev file with "
                       "entities", marks=pytest.mark.slow),
])
def test_finetune_ner_refuses_dev_sentences_without_an_entity(encoder_dir, tmp_path, max_eval_samples, message):
    # Was: trained, then reported dev F1 0.0 after every epoch, for any tagger (a perfect one too)
    data = tmp_path / "data"
    data.mkdir()
    for split, text in CONLL.items():
        if split == "valid":
            text = text.replace("B-ORG", "O") if max_eval_samples else text.replace("B-ORG", "O").replace("B-LOC", "O")
        (data / f"{split}.txt").write_text(text)
    with pytest.raises(ValueError) as e:
        tt.finetune_ner(tt.NerSettings(data_dir=data, model_name_or_path=encoder_dir, output_dir=tmp_path / "o",
                                       max_eval_samples=max_eval_samples, max_steps=1, progress=False))
    assert str(e.value).endswith(message)
    assert not (tmp_path / "o").exists()


def test_finetune_ner_keeps_the_tag_order_of_a_checkpoint_that_has_them(conll_dir, encoder_dir, tiny_checkpoint,
                                                                        tmp_path):
    # run_ner.py's order (sorted names): each row of the head keeps its tag, as run_ner.py keeps it. The rows were
    # renamed in bertkit's order instead, so a tagger fine-tuned further started from the wrong tags (MiniLM on
    # CoNLL-2003, lr 1e-12: dev F1 0.004 where the checkpoint scores 0.249).
    labels = sorted(ner.label_list(ner.read_conll(conll_dir / "train.txt")))
    assert labels[0] == "B-LOC" and labels[-1] == "O"
    tagger = tiny_checkpoint(tmp_path / "tagger", "BertForTokenClassification", tokenizer=encoder_dir, labels=labels)
    report = tt.finetune_ner(tt.NerSettings(data_dir=conll_dir, model_name_or_path=tagger, output_dir=tmp_path / "o",
                                            num_train_epochs=1, batch_size=4, learning_rate=1e-12, progress=False))
    assert report["labels"] == labels
    tok = BertTokenizer.from_pretrained(tagger)
    test = ner.read_conll(conll_dir / "test.txt")
    tags = tt.predict_ner(BertForTokenClassification.from_pretrained(tagger), test,
                          ner.featurize_ner(test, tok, labels), labels, pad_id=tok.pad_token_id)
    assert report["test"] == tt.ner_scores(test, tags)
    # the checkpoint's own tags (random weights, drawn as transformers draws them): none of the 14 right, where its rows
    # named in label_list's unsorted order score 2 / 14
    assert report["test"]["accuracy"] == 0.0


def test_finetune_ner_starts_a_fresh_head_on_a_tagger_of_another_label_count(conll_dir, encoder_dir, tiny_checkpoint,
                                                                            tmp_path):
    # Was: a token classifier of 3 labels (O, B-X, I-X) was refused, "shape mismatches: classifier.weight: file (3,
    # 32), model (9, 32) ... pass ignore_mismatched_sizes=True", a keyword `bertkit finetune ner` has no flag for,
    # where `finetune glue` and `finetune classify` start such a checkpoint's head afresh. Now ner does the same.
    tagger = tiny_checkpoint(tmp_path / "tagger", "BertForTokenClassification", tokenizer=encoder_dir,
                             labels=["O", "B-X", "I-X"])
    report = tt.finetune_ner(tt.NerSettings(data_dir=conll_dir, model_name_or_path=tagger, output_dir=tmp_path / "o",
                                            num_train_epochs=1, batch_size=4, learning_rate=1e-12, progress=False))
    labels = ner.label_list(ner.read_conll(conll_dir / "train.txt"))
    assert report["labels"] == labels and len(labels) == 9
    model = BertForTokenClassification.from_pretrained(tmp_path / "o" / "model")
    assert model.config.id2label == dict(enumerate(labels)) and model.classifier.weight.shape[0] == 9
    encoder = BertForTokenClassification.from_pretrained(tagger).bert.state_dict()
    for name, value in model.bert.state_dict().items():  # the encoder is the checkpoint's (lr 1e-12)
        torch.testing.assert_close(value, encoder[name], rtol=0, atol=1e-9)


@pytest.mark.parametrize("labels", [9, ["NN", "VB", "O"]])
def test_predict_ner_refuses_a_checkpoint_whose_labels_are_not_tags(conll_dir, encoder_dir, tiny_checkpoint, tmp_path,
                                                                   labels):
    # transformers' default names (LABEL_0 ...) or a POS tagger's: conlleval finds no entity in them, so the file was
    # tagged LABEL_3 and scored F1 0.0 against the gold entities.
    model = tiny_checkpoint(tmp_path / "tagger", "BertForTokenClassification", tokenizer=encoder_dir, labels=labels)
    bad = "'LABEL_0', 'LABEL_1'" if labels == 9 else "'NN', 'VB'"
    with pytest.raises(ValueError, match=rf"id2label has labels that are not NER tags \(O, B-TYPE, I-TYPE\): \[{bad}"):
        tt.predict_ner_file(tt.PredictNerSettings(model_name_or_path=model, data_file=conll_dir / "test.txt",
                                                  output_dir=tmp_path / "o"))
    assert not (tmp_path / "o").exists()


# ---------------------------------------------------------------- SQuAD


class _OracleReader(nn.Module):
    """Start/end logits +10 at the gold positions of each window (the [CLS] when the answer is outside)."""

    def __init__(self, features):
        super().__init__()
        self.gold = {tuple(f["input_ids"]): (f["start_positions"], f["end_positions"]) for f in features}

    def forward(self, input_ids, token_type_ids=None, attention_mask=None):
        start, end = torch.full(input_ids.shape, -10.0), torch.full(input_ids.shape, -10.0)
        for row, (ids, mask) in enumerate(zip(input_ids.tolist(), attention_mask.tolist())):
            s, e = self.gold[tuple(ids[: sum(mask)])]
            start[row, s], end[row, e] = 10.0, 10.0
        return QuestionAnsweringOutput(None, start, end)


@pytest.mark.parametrize("version", ["1.1", "2.0"])
def test_squad_gold_logits_score_100(tmp_path, encoder_dir, version):
    path = _squad_file(tmp_path / "d.json", n_articles=3, impossible=version == "2.0")
    examples = squad.read_squad(path)
    tok = BertTokenizer.from_pretrained(encoder_dir)
    # Short windows: every context is cut into several, most without the answer.
    features = squad.featurize_squad(examples, tok, max_seq_length=20, doc_stride=4, max_query_length=8)
    assert len(features) >= 3 * len(examples)
    preds, _ = tt.predict_squad(_OracleReader(features), examples, features, pad_id=0, version=version)
    data = squad.load_squad(path)
    if version == "1.1":
        assert squad_eval.evaluate_v1(data, preds.predictions) == {"exact_match": 100.0, "f1": 100.0}
    else:
        scores = squad_eval.evaluate_v2(data, preds.predictions, na_probs=preds.null_odds)
        assert (scores["exact"], scores["f1"], scores["NoAns_total"]) == (100.0, 100.0, 3)


def test_finetune_squad_on_a_split_says_so(tmp_path, encoder_dir):
    path = _squad_file(tmp_path / "dev-v1.1.json")
    out = tmp_path / "squad"
    report = tt.finetune_squad(tt.SquadSettings(predict_file=path, model_name_or_path=encoder_dir, output_dir=out,
                                                num_train_epochs=1, batch_size=4, max_seq_length=48, doc_stride=16,
                                                max_query_length=12, progress=False))
    split = report["split"]
    assert (split["train_articles"], split["heldout_articles"], split["heldout_questions"]) == (5, 1, 2)
    assert report["evaluated_on"] == split["note"] and "NOT the official evaluation" in split["note"]
    assert report["train_questions"] == 10 and report["eval_questions"] == 2
    heldout = [a for a in squad.load_squad(path)["data"] if a["title"] in split["heldout_titles"]]
    predictions = json.loads((out / "predictions.json").read_text())
    assert sorted(predictions) == sorted(qa["id"] for a in heldout for p in a["paragraphs"] for qa in p["qas"])
    assert report["scores"] == to_fractions(squad_eval.evaluate_v1(heldout, predictions))
    nbest = json.loads((out / "nbest_predictions.json").read_text())
    assert all(1 <= len(v) <= 20 and v[0]["text"] == predictions[k] for k, v in nbest.items())
    assert (out / "model" / "config.json").is_file() and not (out / "null_odds.json").exists()


def test_finetune_squad_with_a_train_file_uses_it_unchanged(tmp_path, encoder_dir):
    train_file = _squad_file(tmp_path / "train.json", n_articles=2)
    dev_file = _squad_file(tmp_path / "dev.json", n_articles=3)
    report = tt.finetune_squad(tt.SquadSettings(train_file=train_file, predict_file=dev_file,
                                                model_name_or_path=encoder_dir, output_dir=tmp_path / "o", num_train_epochs=1,
                                                batch_size=4, max_seq_length=48, max_query_length=12,
                                                progress=False))
    assert report["split"] is None and report["train_questions"] == 4 and report["eval_questions"] == 6
    assert "all 6 questions" in report["evaluated_on"]


@pytest.mark.parametrize("version", ["1.1", "2.0"])
def test_finetune_squad_scores_only_the_max_eval_samples_questions(tmp_path, encoder_dir, version):
    train_file = _squad_file(tmp_path / "train.json", n_articles=2, impossible=version == "2.0")
    dev_file = _squad_file(tmp_path / "dev.json", n_articles=3, impossible=version == "2.0")
    out = tmp_path / "o"
    report = tt.finetune_squad(tt.SquadSettings(train_file=train_file, predict_file=dev_file, version=version,
                                                model_name_or_path=encoder_dir, output_dir=out, num_train_epochs=1,
                                                batch_size=4, max_seq_length=48, max_query_length=12,
                                                max_eval_samples=4, progress=False))
    predictions = json.loads((out / "predictions.json").read_text())
    # The official script on the 4 questions predicted: the others neither count as wrong (v1.1) nor are refused as
    # unanswered (v2.0).
    scored = [{**a, "paragraphs": [{**p, "qas": [q for q in p["qas"] if q["id"] in predictions]}
                                   for p in a["paragraphs"]]} for a in squad.load_squad(dev_file)["data"]]
    if version == "1.1":
        assert report["scores"] == to_fractions(squad_eval.evaluate_v1(scored, predictions))
    else:
        assert report["scores"]["total"] == 4
        assert report["scores"]["f1"] == pytest.approx(squad_eval.evaluate_v2(scored, predictions)["f1"] / 100)
    assert report["eval_questions"] == len(predictions) == 4 and "Only the first 4 of these" in report["evaluated_on"]


@pytest.mark.parametrize("asked", [{}, {"eval_steps": 2}, {"eval_strategy": "epoch"}])
def test_finetune_squad_evaluates_in_the_loop_exactly_when_asked(tmp_path, encoder_dir, asked):
    # --eval-strategy steps --eval-steps 2 was recorded in report.json's settings and never run: SQuAD gave the loop
    # nothing to evaluate with. Left unset, the held-out questions are still scored once, at the end.
    path = _squad_file(tmp_path / "dev-v1.1.json")
    out = tmp_path / "squad"
    report = tt.finetune_squad(tt.SquadSettings(predict_file=path, model_name_or_path=encoder_dir, output_dir=out,
                                                num_train_epochs=2, batch_size=4, max_seq_length=48, doc_stride=16,
                                                max_query_length=12, progress=False, save_strategy="no", **asked))
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    evals = [(r["step"], r["exact_match"], r["f1"]) for r in records if r["split"] == "eval"]
    expected = {"": [], "eval_steps": [2, 4, 6], "eval_strategy": [3, 6]}[next(iter(asked), "")]
    assert [step for step, *_ in evals] == expected
    assert report["settings"]["eval_strategy"] == ("no" if not asked else "steps" if "eval_steps" in asked else "epoch")
    if evals:  # the last evaluation is of the final weights: the report's scores
        assert evals[-1][1:] == (report["scores"]["exact_match"], report["scores"]["f1"])
        assert [(r["step"], r["exact_match"], r["f1"]) for r in report["per_epoch"]] == evals
    else:
        assert "per_epoch" not in report and set(report["scores"]) == {"exact_match", "f1"}


def test_finetune_squad_v2_picks_the_best_f1_threshold(tmp_path, encoder_dir):
    path = _squad_file(tmp_path / "dev-v2.0.json", impossible=True)
    out = tmp_path / "v2"
    report = tt.finetune_squad(tt.SquadSettings(predict_file=path, model_name_or_path=encoder_dir, output_dir=out,
                                                version="2.0", num_train_epochs=1, batch_size=4, max_seq_length=48,
                                                max_query_length=12, progress=False))
    scores = report["scores"]
    null_odds = json.loads((out / "null_odds.json").read_text())
    predictions = json.loads((out / "predictions.json").read_text())
    assert scores["null_threshold"] == scores["best_f1_thresh"]
    # predictions.json applies that threshold: a question is unanswered exactly when its null odds exceed it.
    assert all((predictions[q] == "") == (null_odds[q] > scores["null_threshold"]) for q in null_odds)
    heldout = [a for a in squad.load_squad(path)["data"] if a["title"] in report["split"]["heldout_titles"]]
    assert scores["f1"] == pytest.approx(squad_eval.evaluate_v2(heldout, predictions)["f1"] / 100)


def test_squad_v1_refuses_unanswerable_questions(tmp_path, encoder_dir):
    path = _squad_file(tmp_path / "dev-v2.0.json", impossible=True)
    with pytest.raises(ValueError, match="unanswerable.*--version 2.0"):
        tt.finetune_squad(tt.SquadSettings(predict_file=path, model_name_or_path=encoder_dir, output_dir=tmp_path / "o"))


@pytest.mark.parametrize("threshold", [float("nan"), float("inf")])
def test_predict_squad_refuses_a_null_threshold_that_is_not_finite(tmp_path, threshold):
    # NaN would quietly never predict "no answer" (score_diff > nan is False); serve refuses both too.
    with pytest.raises(ValueError, match=f"null_threshold must be a finite number, got {threshold}"):
        tt.PredictSquadSettings(model_name_or_path=tmp_path, predict_file=tmp_path / "d.json", output_dir=tmp_path,
                                version="2.0", null_threshold=threshold)


def test_predict_squad_v1_refuses_unanswerable_questions_before_predicting(tmp_path, encoder_dir, tiny_checkpoint):
    model = tiny_checkpoint(tmp_path / "qa", "BertForQuestionAnswering", tokenizer=encoder_dir)
    path = _squad_file(tmp_path / "dev-v2.0.json", impossible=True)
    with pytest.raises(ValueError, match="prediction data holds 6 unanswerable.*--version 2.0"):
        tt.predict_squad_file(tt.PredictSquadSettings(model_name_or_path=model, predict_file=path,
                                                      output_dir=tmp_path / "o", max_seq_length=48,
                                                           max_query_length=12))
    assert not (tmp_path / "o").exists()
    # A file without gold answers (a test set) is answered, not refused.
    unlabelled = json.loads(path.read_text())
    for a in unlabelled["data"]:
        for q in a["paragraphs"][0]["qas"]:
            q["answers"] = []
            q.pop("is_impossible", None)
    path.write_text(json.dumps(unlabelled))
    report = tt.predict_squad_file(tt.PredictSquadSettings(model_name_or_path=model, predict_file=path,
                                                           output_dir=tmp_path / "o", max_seq_length=48,
                                                           max_query_length=12))
    assert report["questions"] == 18 and "scores" not in report


def test_predict_squad_v2_scores_its_predictions_at_the_null_threshold_they_were_answered_at(
        tmp_path, encoder_dir, tiny_checkpoint, monkeypatch):
    # Was: scored with evaluate-v2.0.py's default --na-prob-thresh 1.0, so at --null-threshold 2 every right answer
    # here (null odds 1.5, answered) was scored unanswered: HasAns exact 0.0 where predictions.json scores 1.0.
    model = tiny_checkpoint(tmp_path / "qa", "BertForQuestionAnswering", tokenizer=encoder_dir)
    path = _squad_file(tmp_path / "dev-v2.0.json", n_articles=2, impossible=True)

    def reader(model, features, pad_id, **kwargs):  # gold span 5 + 5, [CLS] 5.75 + 5.75 in every window
        rows = []
        for f in features:
            row = np.zeros((len(f["input_ids"]), 2))
            row[0] = 5.75
            if f["start_positions"]:
                row[f["start_positions"], 0] = row[f["end_positions"], 1] = 5.0
            rows.append(row)
        return rows

    monkeypatch.setattr(tt, "predict", reader)
    out = tmp_path / "o"
    report = tt.predict_squad_file(tt.PredictSquadSettings(model_name_or_path=model, predict_file=path, output_dir=out,
                                                           version="2.0", null_threshold=2.0, max_seq_length=48,
                                                           max_query_length=12))
    predictions = json.loads((out / "predictions.json").read_text())
    null_odds = json.loads((out / "null_odds.json").read_text())
    assert {q: v for q, v in null_odds.items() if not q.endswith("none")} == dict.fromkeys(
        ["q0-year", "q0-who", "q1-year", "q1-who"], 1.5)
    assert predictions == {"q0-year": "1800", "q0-who": "the river people", "q0-none": "",
                           "q1-year": "1801", "q1-who": "the river people", "q1-none": ""}
    data = squad.load_squad(path)
    scores = report["scores"]
    assert (scores["exact"], scores["f1"], scores["HasAns_exact"], scores["NoAns_exact"]) == (1.0, 1.0, 1.0, 1.0)
    alone = to_fractions(squad_eval.evaluate_v2(data, predictions))
    assert {k: scores[k] for k in alone} == alone
    official = squad_eval.evaluate_v2(data, predictions, na_probs=null_odds, na_prob_thresh=2.0)
    assert scores == to_fractions(official)
    assert json.loads((out / "report.json").read_text())["scores"] == scores


# ---------------------------------------------------------------- SWAG


def test_finetune_swag_on_small_csvs(tmp_path, encoder_dir):
    train_file = _swag_file(tmp_path / "train.csv", 8)
    val_file = _swag_file(tmp_path / "val.csv", 6)
    out = tmp_path / "swag"
    report = tt.finetune_swag(tt.SwagSettings(train_file=train_file, predict_file=val_file,
                                              model_name_or_path=encoder_dir, output_dir=out, num_train_epochs=2, batch_size=4,
                                              progress=False))
    assert report["steps"] == 4 and len(report["per_epoch"]) == 2
    rows = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert [r["label"] for r in rows] == [i % 4 for i in range(6)]
    assert all(r["prediction"] == int(np.argmax(r["scores"])) for r in rows)
    assert report["accuracy"] == pytest.approx(np.mean([r["prediction"] == r["label"] for r in rows]))
    assert report["per_epoch"][-1]["accuracy"] == pytest.approx(report["accuracy"])


def test_finetune_swag_with_accumulation_trains_as_the_full_batch(tmp_path, encoder_dir, tiny_checkpoint):
    """10 examples in steps of 6: the last step holds 4, which accumulation 2 feeds as micro-batches of 3 and 1. Each
    micro-batch's mean counts by its share of the step's examples, so the weights are the full batch's (the two means
    counted alike gave the one example three times its weight)."""
    encoder = tiny_checkpoint(tmp_path / "encoder", tokenizer=encoder_dir, hidden_dropout_prob=0.0,
                              attention_probs_dropout_prob=0.0)
    train_file, predict_file = _swag_file(tmp_path / "train.csv", 10), _swag_file(tmp_path / "val.csv", 1)
    weights = []
    for accumulation in (1, 2):
        out = tmp_path / f"x{accumulation}"
        report = tt.finetune_swag(tt.SwagSettings(train_file=train_file, predict_file=predict_file, model_name_or_path=encoder,
                                                  output_dir=out, num_train_epochs=1, batch_size=6, learning_rate=1e-2,
                                                  gradient_accumulation_steps=accumulation, progress=False))
        assert report["steps"] == 2
        weights.append(load_file(out / "model" / "model.safetensors"))
    # the classifier's bias moves all four scores alike, a direction the softmax ignores: Adam moves it by rounding noise
    diff = {k: float((weights[0][k] - weights[1][k]).abs().max()) for k in weights[0] if k != "classifier.bias"}
    assert max(diff.values()) <= 1e-5, diff


def test_finetune_swag_predicts_an_unlabelled_test_file(tmp_path, encoder_dir):
    report = tt.finetune_swag(tt.SwagSettings(train_file=_swag_file(tmp_path / "train.csv", 4),
                                              predict_file=_swag_file(tmp_path / "test.csv", 3, labelled=False),
                                              model_name_or_path=encoder_dir, output_dir=tmp_path / "o", num_train_epochs=1,
                                              batch_size=4, progress=False))
    assert report["accuracy"] is None and report["per_epoch"] == []
    rows = [json.loads(line) for line in (tmp_path / "o" / "predictions.jsonl").read_text().splitlines()]
    assert len(rows) == 3 and all(r["label"] is None for r in rows)


# ---------------------------------------------------------------- CLI and real data


def test_cli_finetune_ner(conll_dir, encoder_dir, tmp_path, capsys):
    from bertkit.cli import main

    assert main(["finetune", "ner", "--data-dir", str(conll_dir), "--model", str(encoder_dir), "--out",
                 str(tmp_path), "--epochs", "1", "--batch-size", "4", "--lr", "1e-3", "--no-progress"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["task"] == "ner" and report["lr"] == 1e-3 and report["steps"] == 1


@pytest.mark.slow
def test_minilm_ner_learns_on_a_real_slice(minilm_dir, data_dir, tmp_path):
    """MiniLM on 1,000 real CoNLL-2003 training sentences, 2 epochs: dev F1 well above chance."""
    report = tt.finetune_ner(tt.NerSettings(data_dir=data_dir / "conll2003", model_name_or_path=minilm_dir, output_dir=tmp_path,
                                            num_train_epochs=2, learning_rate=2e-4, max_train_samples=1000, progress=False))
    assert report["dev"]["f1"] > 0.40
