"""`bertkit predict ner|squad|swag` on benchmark files (CoNLL-2003 test, SQuAD dev, swagaf CSV columns):
the prediction files and scores equal what the finetune recipes' own prediction code gives on the same model.
Task heads are small random ones on MiniLM's vocabulary (the real checkpoint has none)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from bertkit import BertTokenizer
from bertkit.cli import main
from bertkit.heads import (
    BertForMultipleChoice,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
)
from bertkit.inference.prepare import for_cpu_inference
from bertkit.tasks import ner, squad, squad_eval, swag
from bertkit.tasks.metrics import to_fractions
from bertkit.training.token_tasks import ner_scores, predict_ner, predict_squad, predict_swag

# The tiny heads on MiniLM's vocabulary: tiny_checkpoint copies its tokenizer files beside them.
ON_MINILM = dict(vocab_size=30522, max_position_embeddings=512)
CONLL_TAGS = ["O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC"]


@pytest.fixture(scope="module")
def sst2_dev(data_dir) -> list[dict]:
    with open(data_dir / "glue/SST-2/dev.tsv", encoding="utf-8") as f:
        return list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))


def _run(capsys, *argv) -> tuple[int, dict | None, str]:
    benchmark = argv[1] in ("ner", "squad", "swag")  # the recipes' prediction code draws no bar
    code = main([*map(str, argv), *([] if benchmark else ["--no-progress"])])
    out, err = capsys.readouterr()
    return code, (json.loads(out) if code == 0 and out.strip() else None), err


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_predict_ner_equals_the_recipes_predictions(tmp_path, minilm_dir, data_dir, capsys, tiny_checkpoint):
    d = tiny_checkpoint(tmp_path / "model", BertForTokenClassification, tokenizer=minilm_dir, seed=3,
                        id2label=dict(enumerate(CONLL_TAGS)), **ON_MINILM)
    code, report, err = _run(capsys, "predict", "ner", "--model", d, "--data-file", data_dir / "conll2003/test.txt",
                             "--out", tmp_path / "run", "--max-predict-samples", 200)
    assert code == 0, err
    sentences = ner.read_conll(data_dir / "conll2003/test.txt")[:200]
    tok = BertTokenizer.from_pretrained(d)
    model = BertForTokenClassification.from_pretrained(d)
    tags = predict_ner(model, sentences, ner.featurize_ner(sentences, tok, CONLL_TAGS, 128), CONLL_TAGS,
                       pad_id=tok.pad_token_id)
    lines = (tmp_path / "run/predictions.txt").read_text(encoding="utf-8").split("\n")
    words = [line.split(" ") for line in lines if line]
    assert [w[2] for w in words] == [t for sent in tags for t in sent]
    assert [w[1] for w in words] == [t for s in sentences for t in s.tags]
    assert report["sentences"] == 200 and report["scores"] == json.loads(json.dumps(ner_scores(sentences, tags)))
    assert report["scores"] == json.loads((tmp_path / "run/report.json").read_text())["scores"]


def test_predict_squad_equals_the_recipes_predictions(tmp_path, minilm_dir, data_dir, capsys, tiny_checkpoint):
    d = tiny_checkpoint(tmp_path / "model", BertForQuestionAnswering, tokenizer=minilm_dir, seed=4, **ON_MINILM)
    config = json.loads((d / "config.json").read_text())  # fine-tuned at 192, as finetune squad records it
    (d / "config.json").write_text(json.dumps({**config, "max_seq_length": 192}))
    dev = data_dir / "squad/dev-v1.1.json"
    code, report, err = _run(capsys, "predict", "squad", "--model", d, "--predict-file", dev, "--out",
                             tmp_path / "run", "--max-predict-samples", 40)
    assert code == 0, err
    assert report["max_seq_length"] == 192  # not predict squad's 384 for a checkpoint that records no length
    examples = squad.read_squad(dev)[:40]
    tok = BertTokenizer.from_pretrained(d)
    features = squad.featurize_squad(examples, tok, max_seq_length=192, doc_stride=128, max_query_length=64)
    preds, _ = predict_squad(BertForQuestionAnswering.from_pretrained(d), examples, features,
                             pad_id=tok.pad_token_id)
    written = json.loads((tmp_path / "run/predictions.json").read_text(encoding="utf-8"))
    assert written == preds.predictions and len(written) == 40
    first40 = {e.qas_id for e in examples}
    data = squad.load_squad(dev)["data"]
    subset = [{**a, "paragraphs": [{**p, "qas": [q for q in p["qas"] if q["id"] in first40]} for p in a["paragraphs"]]}
              for a in data]
    assert report["scores"] == to_fractions(squad_eval.evaluate_v1(subset, preds.predictions))


def test_predict_swag_refuses_a_one_output_regressor_for_its_choices(tmp_path, minilm_dir, capsys, tiny_checkpoint):
    """An STS-B regressor's classifier has the multiple-choice head's shape (1 x hidden): `predict swag` scored the
    choices with it and wrote an accuracy. The class config.json names is another head, so it is refused."""
    d = tiny_checkpoint(tmp_path / "model", BertForSequenceClassification, tokenizer=minilm_dir, labels=["score"],
                        **ON_MINILM)
    path = tmp_path / "val.csv"
    path.write_text("video-id,sent1,sent2,ending0,ending1,ending2,ending3,label\nv,A man,He,runs.,sits.,eats.,sings.,0\n")
    code, _, err = _run(capsys, "predict", "swag", "--model", d, "--predict-file", path, "--out", tmp_path / "run")
    assert code != 0 and "config.json names BertForSequenceClassification, not the BertForMultipleChoice swag runs" in err
    assert not (tmp_path / "run").exists()


def test_predict_swag_equals_the_recipes_predictions(tmp_path, minilm_dir, sst2_dev, capsys, tiny_checkpoint):
    d = tiny_checkpoint(tmp_path / "model", BertForMultipleChoice, tokenizer=minilm_dir, seed=5, **ON_MINILM)
    texts = [r["sentence"] for r in sst2_dev[:150]]
    header = ["", "video-id", "fold-ind", "startphrase", "sent1", "sent2", "gold-source", "ending0", "ending1",
              "ending2", "ending3", "label"]
    path = tmp_path / "val.csv"
    with open(path, "w", encoding="utf-8", newline="") as f:  # swagaf's columns, real sentences in them
        w = csv.writer(f)
        w.writerow(header)
        for i in range(0, 150, 5):
            a, b, *ends = texts[i:i + 6] if i + 6 <= 150 else texts[i - 1:i + 5]
            w.writerow([i, f"v{i}", i, f"{a} {b}", a, b, "gold", *ends[:4], i % 4])
    code, report, err = _run(capsys, "predict", "swag", "--model", d, "--predict-file", path, "--out", tmp_path / "run")
    assert code == 0, err
    examples = swag.read_swag(path)
    tok = BertTokenizer.from_pretrained(d)
    # the command runs the copy prepare_model makes for CPU inference (oneDNN's weight layout): so does the reference
    model = for_cpu_inference(BertForMultipleChoice.from_pretrained(d).eval(), bf16=False)
    scores = predict_swag(model, swag.featurize_swag(examples, tok, 128), pad_id=tok.pad_token_id)
    got = _records(tmp_path / "run/predictions.jsonl")
    assert [g["prediction"] for g in got] == scores.argmax(-1).tolist()
    assert [g["scores"] for g in got] == [[float(x) for x in row] for row in scores]
    assert report["accuracy"] == float((scores.argmax(-1) == np.array([e.label for e in examples])).mean())
