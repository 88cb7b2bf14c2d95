"""An output that overflowed never becomes a pick, a code or a file: weights that are finite (so loading takes them)
but outputs that are -inf for every label or position, or an infinite value or feature. The runner refuses NaN and
+inf outputs and lets -inf through (a head may mask with it); transformers' pipelines, sentence-transformers and
run_squad.py's post-processing turn such outputs into a label, a tag, a span, an int8 code or a rank, with a NaN
score, and bertkit's pipelines did the same and `bertkit predict` wrote them as `NaN` or `-Infinity`, which is no
JSON."""

from __future__ import annotations

import json
import math
import re
import shutil

import numpy as np
import pytest
import torch

import bertkit
from bertkit.errors import BertkitError, NonFiniteError

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "hello", "world", "the", "cat", "sat", "in", "paris", "where",
         "?"]
HUGE = -3e37  # 32 hidden units of 1.0 times this: -9.6e38, past float32's 3.4e38, so -inf from finite weights


def _saturated_pooler(model):
    model.bert.pooler.dense.weight.zero_()
    model.bert.pooler.dense.bias.fill_(100.0)  # tanh: every pooled unit 1.0


def _constant_tokens(model):
    layer_norm = model.bert.encoder.layer[-1].output.LayerNorm
    layer_norm.weight.zero_()
    layer_norm.bias.fill_(1.0)  # every token's last hidden state all 1.0


def _all_labels(model):
    _saturated_pooler(model)
    model.classifier.weight.fill_(HUGE)


def _token_labels(model):
    _constant_tokens(model)
    model.classifier.weight.fill_(HUGE)


def _starts(model):
    _constant_tokens(model)
    model.qa_outputs.weight[0].fill_(HUGE)


def _feature(model):
    model.encoder.layer[-1].output.LayerNorm.bias[3] = -3e38  # one dimension of every token overflows


RUNNER = (r"^the text-classification result for input 0 \('hello world'\): the model's output for "
          r"text-classification row 0 is not finite \(NaN or inf\)")
CASES = {  # head, labels, edit, input, refusal
    "text-classification": ("BertForSequenceClassification", ["neg", "pos"], _all_labels, "hello world", RUNNER),
    "regression": ("BertForSequenceClassification", 1, _all_labels, "hello world", RUNNER),
    "token-classification": ("BertForTokenClassification", ["O", "B-LOC"], _token_labels, "hello world",
                             RUNNER.replace("text", "token")),
    "question-answering": ("BertForQuestionAnswering", None, _starts,
                           {"question": "where ?", "context": "hello world in paris"},
                           r"^the question-answering result for input 0 \(\"\{'question': 'where \?', .*\): question "
                           r"'q': its logits \(features \[0\]\) are -inf at every start"),
    "feature-extraction": ("BertModel", None, _feature, "hello world",
                           r"^the feature-extraction result for input 0 \('hello world'\) holds -inf at \[3\]: the "
                           "model's outputs for it overflowed"),
}


def _overflowing(tmp_path, tiny_checkpoint, case):
    head, labels, edit, _, _ = CASES[case]
    directory = tiny_checkpoint(tmp_path / case, head, tokenizer=VOCAB, labels=labels)
    model = getattr(bertkit, head).from_pretrained(directory)
    with torch.no_grad():
        edit(model)
    model.save_pretrained(directory)  # finite weights: saved and loaded as any others
    return directory


@pytest.mark.parametrize("case", list(CASES))
def test_pipelines_refuse_a_result_an_overflow_made(tmp_path, tiny_checkpoint, case):
    """transformers' text-classification pipeline answers label 'neg' with score NaN for logits all -inf, and the
    token task's 'O' tags with NaN; bertkit's gave the same (and the QA pipeline a span with NaN), the regression
    value -inf and the features -inf. Logits -inf at every label are refused as the model's output (as NaN is), a
    result holding NaN or an infinity as the input's result."""
    task = "text-classification" if case == "regression" else case
    pipe = bertkit.pipeline(task, model=_overflowing(tmp_path, tiny_checkpoint, case))
    with pytest.raises(NonFiniteError, match=CASES[case][4]) as refused:
        pipe([CASES[case][3]])
    assert refused.value.index == 0


def test_pipelines_keep_a_finite_result_beside_a_masked_label(tmp_path, tiny_checkpoint):
    """One label's bias -inf is a label switched off: probability 0.0, as transformers gives; not refused."""
    directory = tiny_checkpoint(tmp_path / "m", "BertForSequenceClassification", tokenizer=VOCAB,
                                labels=["neg", "neu", "pos"])
    model = bertkit.BertForSequenceClassification.from_pretrained(directory)
    with torch.no_grad():
        model.classifier.bias[0] = -torch.inf
    out = bertkit.pipeline("text-classification", model=model, tokenizer=bertkit.BertTokenizer.from_pretrained(
        directory))("hello world")
    assert out["scores"]["neg"] == 0.0 and out["label"] in ("neu", "pos")
    assert out["scores"]["neu"] + out["scores"]["pos"] == pytest.approx(1.0)


def test_predict_refuses_an_overflowed_output_and_keeps_the_old_file(tmp_path, tiny_checkpoint, capsys):
    """`bertkit predict text-classification` wrote {"label": "neg", "score": NaN, ...} lines (a regression model's
    {"value": -Infinity}) and exited 0: no JSON reader takes them, and the label was no prediction."""
    from bertkit.cli import main

    (tmp_path / "in.txt").write_text("the cat\nhello world\n")
    out = tmp_path / "out.jsonl"
    out.write_text("kept\n")
    for case in ("text-classification", "regression"):
        args = ["predict", "text-classification", "--model", str(_overflowing(tmp_path, tiny_checkpoint, case)),
                "--input", str(tmp_path / "in.txt"), "--output-file", str(out), "--overwrite", "--no-progress"]
        capsys.readouterr()
        assert main(args) == 2
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert err.startswith(f"bertkit predict text-classification: error: {tmp_path / 'in.txt'}: input 1 (id 0): "
                              "the text-classification result for input 0 ('the cat'): the model's output for "
                              "text-classification row 0 is not finite (NaN or inf)")
        assert err.endswith(f"; nothing was written to {out} (a file there is kept as it was)")
        assert out.read_text() == "kept\n"


def test_squad_post_processing_refuses_spans_that_all_score_minus_infinity():
    """run_squad.py's post-processing sorts the -inf spans and answers the first ("hello", probability NaN);
    predictions.json got that text."""
    from bertkit.tasks import squad

    tok = bertkit.BertTokenizer({t: i for i, t in enumerate(VOCAB)})
    examples = [squad.SquadExample(qas_id="q7", title="", question="where ?", context="hello world in paris",
                                   answers=())]
    features = squad.featurize_squad(examples, tok, max_seq_length=32, doc_stride=16, max_query_length=8)
    n = len(features[0]["input_ids"])
    ends = np.linspace(0.0, 1.0, n)
    with pytest.raises(NonFiniteError, match=r"^question 'q7': its logits \(features \[0\]\) are -inf at every"):
        squad.postprocess_predictions(examples, features, [np.full(n, -np.inf)], [ends])
    starts = np.full(n, -np.inf)
    starts[6] = 0.5  # one finite start: the other spans rank below it, probability 0, as before
    preds = squad.postprocess_predictions(examples, features, [starts], [ends])
    probabilities = [e["probability"] for e in preds.nbest["q7"]]
    assert preds.predictions["q7"] and np.isfinite(probabilities).all() and sum(probabilities) == pytest.approx(1.0)


@pytest.mark.parametrize("precision", ["int8", "uint8", "binary", "ubinary"])
def test_quantize_embeddings_refuses_an_infinity(precision):
    """sentence-transformers clips +inf into code 127 (uint8 255; binary a 1 bit) under finite ranges and
    -inf into -128: a code like any other. bertkit refused a NaN only."""
    from bertkit.sentence import quantize_embeddings

    e = np.random.default_rng(0).standard_normal((3, 8)).astype(np.float32)
    e[1, 2] = np.inf
    ranges = np.stack([-np.ones(8), np.ones(8)]).astype(np.float32)
    with pytest.raises(BertkitError, match=rf"^embeddings\[1, 2\] is inf, which {precision} quantization would turn "
                                           "into a number"):
        quantize_embeddings(e, precision, ranges=ranges)
    e[1, 2] = 0.5
    assert quantize_embeddings(e, precision, ranges=ranges).shape[0] == 3


def test_searches_refuse_an_infinite_similarity():
    """dot_score of an embedding holding an infinity is inf for every pair with it: semantic_search returned the
    tied hits in position order, as sentence-transformers does, and paraphrase_mining ranked them first."""
    from bertkit.sentence import util

    good = torch.tensor([[1.0, 0, 0, 0], [0, 1, 0, 0], [1, 1, 0, 0]])
    bad = good.clone()
    bad[2, 0] = torch.inf
    with pytest.raises(NonFiniteError, match=r"^semantic_search: the similarity of query 0 and corpus entry 2 is inf, "
                                             "and a NaN or an infinity has no rank"):
        util.semantic_search(good[:1], bad, top_k=2, score_function=util.dot_score)
    with pytest.raises(NonFiniteError, match=r"^paraphrase_mining: the similarity of embedding 0 and embedding 2 is "):
        util.paraphrase_mining_embeddings(bad, top_k=2, score_function=util.dot_score)
    assert [h["corpus_id"] for h in util.semantic_search(good[:1], good, top_k=2,
                                                         score_function=util.dot_score)[0]] == [0, 2]


def test_serve_refuses_an_answer_holding_nan_or_inf(tmp_path, tiny_checkpoint):
    """`serve` answered 500 "ValueError: Out of range float values are not JSON compliant" (starlette's encoder),
    naming neither the input nor the cause, for logits all -inf on /predict (refused now as the model's output) and
    a feature -inf on /embed and /v1/embeddings."""
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from bertkit.inference.serve import create_app

    for case, route, body, where in [
        ("feature-extraction", "/embed", {"inputs": ["hello"], "normalize": False}, r"-inf at \[0\]\[3\]"),
        ("feature-extraction", "/v1/embeddings", {"input": ["hello"], "model": "m"},
         r"NaN at \['data'\]\[0\]\['embedding'\]\[3\]"),  # normalised, as OpenAI's are: -inf / inf
    ]:
        directory = _overflowing(tmp_path, tiny_checkpoint, case)
        with TestClient(create_app(bertkit.pipeline(case, directory), str(directory))) as client:
            answer = client.post(route, json=body)
        assert answer.status_code == 500
        error = answer.json()["error"]
        message = error["message"] if isinstance(error, dict) else error
        assert re.match(rf"^the answer to {route} holds {where} \(the path's first index is the input's", message), \
            message
    directory = _overflowing(tmp_path, tiny_checkpoint, "text-classification")
    with TestClient(create_app(bertkit.pipeline("text-classification", directory), str(directory))) as client:
        answer = client.post("/predict", json={"inputs": ["hello", "the cat"]})
    assert answer.status_code == 500
    assert answer.json()["error"].startswith("the model's output for text-classification row 0 is not finite")


def test_predict_refuses_logits_minus_infinity_at_every_label():
    """`bertkit predict glue --split dev` (and a fine-tuning run's evaluation, through the same `predict`) read
    logits -inf at both labels of every SST-2 sentence as label 0 and scored accuracy 0.5. One -inf among finite
    logits (a label switched off), and a QA head's masked padding, still pass."""
    from types import SimpleNamespace

    from torch import nn

    from bertkit.inference.predict import predict

    class Out(nn.Module):
        def forward(self, input_ids, **_):
            logits = torch.stack([input_ids[:, 0].float(), -input_ids[:, 0].float()], -1)  # (B, 2)
            logits[:, 1] = torch.where(input_ids[:, 0] == 5, -torch.inf, logits[:, 1])  # 5: one label off
            logits[input_ids[:, 0] == 7] = -torch.inf  # 7: every label -inf
            return SimpleNamespace(logits=logits)

    with pytest.raises(NonFiniteError, match=r"^the model's output for example 2 \(0-based, input order\) is not "):
        predict(Out(), [{"input_ids": [i, 1]} for i in (3, 5, 7, 9)], 0, batch_size=2)
    kept = predict(Out(), [{"input_ids": [i, 1]} for i in (3, 5, 9)], 0, batch_size=2)
    assert [r.tolist() for r in kept] == [[3.0, -3.0], [5.0, -np.inf], [9.0, -9.0]]


def test_sparse_decode_refuses_a_weight_that_has_no_rank(tmp_path, tiny_checkpoint):
    """SparseEncoder.decode took a NaN weight (an MLM bias or a word embedding holding NaN) for the row's largest,
    listing ('hello', nan) first, or with every weight NaN '[PAD]', '[unused0]', ... in id order, as
    sentence-transformers does."""
    from bertkit.sentence.sparse_encoder.model import SparseEncoder
    from bertkit.sentence.sparse_encoder.models import MLMTransformer, SpladePooling

    directory = tiny_checkpoint(tmp_path / "mlm", "BertForMaskedLM", tokenizer=VOCAB)
    encoder = SparseEncoder(modules=[MLMTransformer(str(directory)), SpladePooling("max")], device="cpu")
    embeddings = torch.zeros(2, len(VOCAB))
    embeddings[:, 6] = 0.3
    assert encoder.decode(embeddings, top_k=2) == [[("world", pytest.approx(0.3))]] * 2
    for poison in (float("nan"), float("inf")):
        embeddings[1, 5] = poison
        with pytest.raises(NonFiniteError, match=rf"^decode: embedding 1's weight of word piece 'hello' \(id 5\) is "
                                                 rf"{poison}, which has no rank"):
            encoder.decode(embeddings, top_k=2)


def test_a_distillation_target_holding_nan_is_refused_naming_its_row(tmp_path, tiny_checkpoint):
    """MSELoss's teacher embedding holding a NaN reached the loss (NaN at step 1), and training stopped telling the
    user to lower the learning rate; a scalar NaN label was already refused by its row."""
    from datasets import Dataset

    from bertkit.sentence import (
        SentenceTransformer,
        SentenceTransformerTrainer,
        SentenceTransformerTrainingArguments,
    )
    from bertkit.sentence.losses import MSELoss

    model = SentenceTransformer(str(tiny_checkpoint(tmp_path / "m", tokenizer=VOCAB)), device="cpu")
    teacher = [[0.1] * 32, [0.2] * 31 + [float("nan")], [0.3] * 32]
    data = Dataset.from_dict({"text": ["hello world", "the cat", "sat in paris"], "label": teacher})
    args = SentenceTransformerTrainingArguments(output_dir=str(tmp_path / "out"), max_steps=1, report_to=[],
                                                per_device_train_batch_size=3, save_strategy="no")
    with pytest.raises(BertkitError, match=r"^train_dataset: row 1 has label holding nan \(at position 31\); every "
                                           "value of a label must be a number"):
        SentenceTransformerTrainer(model=model, args=args, train_dataset=data, loss=MSELoss(model)).train()
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


@pytest.mark.parametrize("poison", [float("nan"), -math.inf])
def test_trainer_metrics_of_nonfinite_predictions_are_nan(tmp_path, tiny_model, caplog, poison):
    """A model whose logits are NaN (or -inf at every label) was scored eval_accuracy 0.5 by an argmax
    compute_metrics, as transformers' Trainer reports it; bertkit reports NaN (never the best) and says which row."""
    from datasets import Dataset

    model = tiny_model("BertForSequenceClassification", labels=["a", "b"], vocab_size=len(VOCAB))
    rows = Dataset.from_dict({"input_ids": [[2, 5, 6, 3], [2, 7, 8, 3], [2, 5, 3]], "labels": [0, 1, 0]})

    def accuracy(p):
        return {"accuracy": float((np.argmax(p.predictions, -1) == p.label_ids).mean()), "rows": len(p.label_ids)}

    def evaluate():
        args = bertkit.TrainingArguments(output_dir=str(tmp_path / "out"), per_device_eval_batch_size=2, use_cpu=True,
                                         report_to=[])
        collator = bertkit.DataCollatorWithPadding(bertkit.BertTokenizer({t: i for i, t in enumerate(VOCAB)}))
        return bertkit.Trainer(model=model, args=args, eval_dataset=rows, data_collator=collator,
                               compute_metrics=accuracy).evaluate()

    assert math.isfinite(evaluate()["eval_accuracy"])
    with torch.no_grad():
        model.classifier.bias.fill_(poison)
    with caplog.at_level("WARNING", logger="bertkit"):
        metrics = evaluate()
    assert math.isnan(metrics["eval_accuracy"]) and metrics["eval_rows"] == 3
    assert "the predictions of evaluation row 0 (0-based, in evaluation order) are not finite" in caplog.text
    assert "compute_metrics' accuracy are reported as NaN" in caplog.text


def test_eval_loss_of_a_batch_whose_outputs_are_nan_is_nan(tmp_path, tiny_model):
    """A batch whose loss is NaN because its logits are (token "sat" embedded as NaN) was left out of eval_loss as a
    batch with no label is, as transformers' logging_nan_inf_filter leaves out any: eval_loss 0.6932 from the other
    batch alone, a model whose outputs were NaN on half the set scored like a sound one (and load_best_model_at_end's
    default metric could pick it). It is NaN now; a batch with no label to score is still left out."""
    from datasets import Dataset

    model = tiny_model("BertForSequenceClassification", labels=["a", "b"], vocab_size=len(VOCAB))
    rows = Dataset.from_dict({"input_ids": [[2, 5, 6, 3], [2, 7, 8, 3], [2, 9, 3], [2, 5, 3]], "labels": [0, 1, 0, 1]})

    def eval_loss(data):
        args = bertkit.TrainingArguments(output_dir=str(tmp_path / "out"), per_device_eval_batch_size=2, use_cpu=True,
                                         report_to=[])
        collator = bertkit.DataCollatorWithPadding(bertkit.BertTokenizer({t: i for i, t in enumerate(VOCAB)}))
        return bertkit.Trainer(model=model, args=args, eval_dataset=data, data_collator=collator).evaluate()["eval_loss"]

    sound = eval_loss(rows)
    assert sound == pytest.approx(0.693, abs=1e-3)
    with torch.no_grad():
        model.bert.embeddings.word_embeddings.weight[VOCAB.index("sat")] = math.nan
    assert math.isnan(eval_loss(rows))
    assert eval_loss(rows.select([0, 1])) == pytest.approx(sound, abs=1e-3)  # the finite batch alone: as before


def test_sentence_eval_loss_of_nan_embeddings_is_nan(tmp_path, minilm_2_layers):
    """A sentence loss's batch over a text embedded as NaN: eval_loss was the other batch's, 0.0001."""
    from datasets import Dataset

    from bertkit.sentence import (
        SentenceTransformer,
        SentenceTransformerTrainer,
        SentenceTransformerTrainingArguments,
    )
    from bertkit.sentence.losses import MultipleNegativesRankingLoss

    model = SentenceTransformer(str(minilm_2_layers))
    data = Dataset.from_dict({"anchor": ["a cat", "a dog", "a red car", "a horse"],
                              "positive": ["the cat", "the dog", "the red car", "the horse"]})
    args = SentenceTransformerTrainingArguments(output_dir=str(tmp_path / "out"), per_device_eval_batch_size=2,
                                                report_to=[], use_cpu=True)
    trainer = SentenceTransformerTrainer(model=model, args=args, eval_dataset=data,
                                         loss=MultipleNegativesRankingLoss(model))
    assert math.isfinite(trainer.evaluate()["eval_loss"])
    with torch.no_grad():
        model.bert.embeddings.word_embeddings.weight[model.tokenizer.convert_tokens_to_ids("red")] = math.nan
    assert math.isnan(trainer.evaluate()["eval_loss"])


def test_cross_encoder_scores_of_logits_minus_infinity_are_nan(tmp_path, tiny_checkpoint):
    """A one-label cross-encoder whose logit overflowed to -inf scored 0.0 through the sigmoid (to +inf: 1.0), and
    rank() returned every document at that score in position order, as sentence-transformers does; the score is NaN
    now, which rank() refuses naming the document. One -inf label among finite ones keeps its softmax 0.0."""
    from bertkit.sentence import CrossEncoder

    directory = tiny_checkpoint(tmp_path / "ce", "BertForSequenceClassification", tokenizer=VOCAB, labels=1)
    model = CrossEncoder(str(directory), device="cpu")
    assert np.isfinite(model.predict([("hello", "world")])).all()
    with torch.no_grad():
        model.model.classifier.bias.fill_(-math.inf)
    assert np.isnan(model.predict([("hello", "world"), ("the cat", "sat")])).all()
    with pytest.raises(NonFiniteError, match=r"^rank\(\): the model's score of input 0 \('world'\) is not finite"):
        model.rank("hello", ["world", "sat"])
    with torch.no_grad():  # a logit overflowed to +inf: the sigmoid's 1.0 for every document, ranked in position order
        model.model.classifier.bias.fill_(math.inf)
    assert np.isnan(model.predict([("hello", "world"), ("the cat", "sat")])).all()
    assert np.isnan(model.predict([("hello", "world")], activation_fn=torch.nn.Identity())).all()
    with pytest.raises(NonFiniteError, match=r"^rank\(\): the model's score of input 0 \('world'\) is not finite"):
        model.rank("hello", ["world", "sat"])
    three = CrossEncoder(str(tiny_checkpoint(tmp_path / "ce3", "BertForSequenceClassification", tokenizer=VOCAB,
                                             labels=3)), device="cpu")
    with torch.no_grad():
        three.model.classifier.bias[0] = -math.inf
    scores = three.predict([("hello", "world")], apply_softmax=True)
    assert scores[0][0] == 0.0 and scores.sum() == pytest.approx(1.0)


@pytest.mark.parametrize("loss_name", ["LambdaLoss", "RankNetLoss"])
def test_lambda_losses_of_a_nan_logit_are_nan(tmp_path, tiny_checkpoint, loss_name):
    """LambdaLoss set a NaN logit difference to 0 (allRank's mask for its -inf padding; padding here is -1e16): a
    document scored NaN gave a finite loss (4.06 here), so an evaluation's eval_loss hid it. It is NaN now."""
    from bertkit.sentence import CrossEncoder
    from bertkit.sentence.cross_encoder import losses

    directory = tiny_checkpoint(tmp_path / "ce", "BertForSequenceClassification", tokenizer=VOCAB, labels=1)
    model = CrossEncoder(str(directory), device="cpu")
    loss = getattr(losses, loss_name)(model)
    inputs = (["hello", "hello"], [["world", "cat"], ["world", "the"]])
    labels = [torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0])]
    assert math.isfinite(loss(inputs, labels).item())
    with torch.no_grad():
        model.model.bert.embeddings.word_embeddings.weight[VOCAB.index("cat")] = math.nan
    assert math.isnan(loss(inputs, labels).item())


def test_online_contrastive_loss_of_a_nan_embedding_is_nan(minilm_2_layers):
    """OnlineContrastiveLoss keeps the pairs harder than the others by comparisons, which drop a NaN distance: a text
    embedded as NaN gave the rest's finite loss (as in sentence-transformers), which the step's loss and eval_loss
    showed as if nothing were wrong."""
    from bertkit.sentence import SentenceTransformer
    from bertkit.sentence.losses import OnlineContrastiveLoss

    model = SentenceTransformer(str(minilm_2_layers))
    loss = OnlineContrastiveLoss(model)
    pairs = [model.tokenize(["a cat", "a dog", "a red car", "a horse"]),
             model.tokenize(["the cat", "the dog", "the red car", "the horse"])]
    labels = torch.tensor([1, 0, 1, 0])
    assert math.isfinite(loss(pairs, labels).item())
    with torch.no_grad():
        model.bert.embeddings.word_embeddings.weight[model.tokenizer.convert_tokens_to_ids("red")] = math.nan
    value = loss(pairs, labels)
    assert math.isnan(value.item())
    value.backward()  # a NaN gradient too, which the training loop refuses naming the step
    assert not torch.isfinite(model.bert.encoder.layer[0].output.dense.weight.grad).all()


def test_a_json_report_writes_nan_and_infinity_as_null(tmp_path):
    """Python's NaN token is no JSON: jq, JavaScript and bertkit's own JSONL reader refuse a file holding one."""
    from bertkit.outputs import atomic_write_json

    path = atomic_write_json(tmp_path / "r.json", {"dev": {"pearson": math.nan, "x": np.float64(-math.inf)},
                                                   "per_epoch": [{"f1": math.inf}, {"f1": 0.5}], "steps": (2, 0.25)})
    strict = json.loads(path.read_text(), parse_constant=lambda c: pytest.fail(f"{c} written to the JSON"))
    assert strict == {"dev": {"pearson": None, "x": None}, "per_epoch": [{"f1": None}, {"f1": 0.5}], "steps": [2, 0.25]}


def test_finetune_report_of_an_evaluation_scoring_nan_is_json(minilm_2_layers, data_dir, tmp_path):
    """STS-B predictions all equal at the first evaluation (a pooler of zeros: every input pools to the same vector)
    score Pearson NaN there; report.json held the token NaN, which no strict JSON reader reads."""
    from safetensors.torch import load_file, save_file

    from bertkit.cli import main

    model = tmp_path / "model"
    shutil.copytree(minilm_2_layers, model)
    weights = load_file(model / "model.safetensors")
    key = next(k for k in weights if k.endswith("pooler.dense.weight"))
    weights[key] = torch.zeros_like(weights[key])
    save_file(weights, model / "model.safetensors")
    out = tmp_path / "out"
    assert main(["finetune", "glue", "--task", "stsb", "--data-dir", str(data_dir / "glue"), "--model", str(model),
                 "--out", str(out), "--learning-rate", "1e-4", "--seeds", "1", "--max-train-samples", "16",
                 "--max-eval-samples", "20", "--max-steps", "2", "--eval-strategy", "steps", "--eval-steps", "1",
                 "--batch-size", "8", "--no-progress", "--device", "cpu"]) == 0
    report = json.loads((out / "report.json").read_text(), parse_constant=lambda c: pytest.fail(f"{c} in report"))
    first, last = report["runs"][0]["per_epoch"]
    assert (first["step"], first["pearson"], first["spearman"]) == (1, None, None)
    assert last["step"] == 2 and math.isfinite(last["pearson"]) and report["best_run"]["dev"] == {
        k: last[k] for k in ("pearson", "spearman")}


def test_a_result_is_searched_for_non_finite_values_in_any_nesting():
    """Feature-extraction results, (T, H) nested lists of floats, are checked in one numpy pass; the place of the
    first NaN or infinity is named the same way in every shape, ragged and mixed ones included."""
    from bertkit.inference.base import nonfinite_in

    features = np.random.default_rng(0).standard_normal((7, 5)).tolist()
    assert nonfinite_in(features) is None and nonfinite_in([features, features]) is None
    features[3][2] = float("-inf")
    assert nonfinite_in(features) == "-inf at [3][2]"
    assert nonfinite_in([[[1.0, 2.0]], features]) == "-inf at [1][3][2]"  # ragged: walked
    assert nonfinite_in([{"label": "x", "score": math.nan}]) == "NaN at [0]['score']"
    assert nonfinite_in([1, 2.5, [float("inf")]]) == "inf at [2][0]"
    assert nonfinite_in([3, 4, 5]) is None and nonfinite_in([]) is None and nonfinite_in(["a", "b"]) is None
    assert nonfinite_in([[0.5, None]]) is None  # no number to check beside a None
    # records of plain values (a sparse vector's {"index", "value"}) are checked as one array, then walked to name
    records = [{"index": i, "value": float(i) / 7, "token": None} for i in range(800)]
    assert nonfinite_in(records) is None and nonfinite_in([{"n": np.float32(1.5), "ok": True}]) is None
    records[512]["value"] = np.float32("nan")
    assert nonfinite_in(records) == "NaN at [512]['value']"
    assert nonfinite_in([{"scores": [1.0, float("inf")]}]) == "inf at [0]['scores'][1]"  # a list inside: walked


@pytest.mark.parametrize("poison", [float("nan"), float("inf"), float("-inf")])
def test_sparse_similarities_of_a_nonfinite_embedding_are_nan(poison):
    """A sparse product multiplies only the dimensions both rows store: [NaN, 1, 0] scored 1.0 against [0, 1, 0] in
    cos_sim and dot_score (and [inf, 1, 0] 0.0 in cos_sim), as in sentence-transformers, and a search of that query
    ranked it first. Its similarities are NaN now, sparse and mixed, the other pairs' the dense numbers."""
    from bertkit.sentence import util

    good = torch.tensor([[1.0, 0, 0], [0, 1, 0], [1, 1, 0]])
    bad = good.clone()
    bad[1, 0] = poison
    for name in ("cos_sim", "dot_score"):
        fn = getattr(util, name)
        expected = fn(good, good)
        expected[:, 1] = torch.nan
        torch.testing.assert_close(fn(good.to_sparse(), bad.to_sparse()), expected, equal_nan=True)
        torch.testing.assert_close(fn(bad.to_sparse(), good.to_sparse()), expected.T, equal_nan=True)
    for name in ("pairwise_cos_sim", "pairwise_dot_score"):
        fn = getattr(util, name)
        expected = torch.tensor([1.0, torch.nan, 2.0 if name == "pairwise_dot_score" else 1.0])
        for a, b in ((good.to_sparse(), bad.to_sparse()), (good.to_sparse(), bad), (bad, good.to_sparse())):
            torch.testing.assert_close(fn(a, b), expected, equal_nan=True)
    with pytest.raises(NonFiniteError, match=r"^semantic_search: the similarity of query 0 and corpus entry 1 is NaN"):
        util.semantic_search(good[1:2].to_sparse(), bad.to_sparse(), top_k=2)


@pytest.mark.parametrize("poison", [float("nan"), float("inf"), float("-inf")])
def test_sparse_intersection_refuses_a_nonfinite_embedding(poison):
    """intersection() keeps the positive products: a NaN one (NaN > 0 is False) or a -inf one was dropped, and one
    where the other side stores nothing never computed, so [0, NaN, 0, 0.1] shared 'piece 3' with [0, 0.5, 0, 0.2]
    at 0.02, a finite intersection that decode listed, as in sentence-transformers. It is refused, naming the row."""
    from bertkit.sentence.sparse_encoder.model import SparseEncoder

    query = torch.tensor([0.0, 0.5, 0.0, 0.2])
    docs = torch.tensor([[0.0, 0.4, 0.0, 0.0], [0.0, 0.3, 0.0, 0.1]])
    shared = SparseEncoder.intersection(query, docs).to_dense()
    torch.testing.assert_close(shared, torch.tensor([[0.0, 0.2, 0.0, 0.0], [0.0, 0.15, 0.0, 0.02]]))
    for at in (1, 0):  # a piece both store, and one only the poisoned side stores
        bad = docs.clone()
        bad[1, at] = poison
        with pytest.raises(NonFiniteError, match=r"^intersection: embeddings_2 row 1 holds a NaN or an infinity"):
            SparseEncoder.intersection(query, bad)
        with pytest.raises(NonFiniteError, match=r"^intersection: embeddings_1 holds a NaN or an infinity"):
            SparseEncoder.intersection(bad[1], docs.to_sparse())


def test_serve_normalises_a_vector_whose_norm_overflows_to_the_unit_vector_it_is(tmp_path, tiny_checkpoint):
    """Every state 1e20 (finite; its float32 norm inf): /embed's normalisation divided it by inf, all zeros, and
    /similarity scored a text 0.0 against itself (encode and the sentence-embedding pipeline already rescale it)."""
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from bertkit.inference.serve import create_app

    directory = tiny_checkpoint(tmp_path / "fe", "BertModel", tokenizer=VOCAB)
    model = bertkit.BertModel.from_pretrained(directory)
    with torch.no_grad():
        model.encoder.layer[-1].output.LayerNorm.weight.zero_()
        model.encoder.layer[-1].output.LayerNorm.bias.fill_(1e20)
    model.save_pretrained(directory)
    with TestClient(create_app(bertkit.pipeline("feature-extraction", directory), str(directory))) as client:
        embedded = client.post("/embed", json={"inputs": ["hello world"]})
        similar = client.post("/similarity", json={"inputs": {"source_sentence": "hello world",
                                                              "sentences": ["hello world", "the cat"]}})
    assert embedded.status_code == 200 and similar.status_code == 200, (embedded.text, similar.text)
    assert embedded.json()[0] == pytest.approx([32**-0.5] * 32, rel=1e-6)
    assert similar.json() == pytest.approx([1.0, 1.0])


def test_serve_refuses_a_base64_embedding_holding_nan(tmp_path, tiny_checkpoint):
    """/v1/embeddings with encoding_format "base64" wrote a NaN into the answer's bytes: the JSON encoder, which refuses
    a NaN among floats, sees a string there, so the client decoded a vector of NaN from a 200 where "float" gets a 500."""
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from bertkit.inference.serve import create_app

    directory = _overflowing(tmp_path, tiny_checkpoint, "feature-extraction")
    with TestClient(create_app(bertkit.pipeline("feature-extraction", directory), str(directory))) as client:
        answer = client.post("/v1/embeddings", json={"input": ["the cat", "hello"], "encoding_format": "base64"})
    assert answer.status_code == 500, answer.text[:200]
    assert re.match(r"^the answer to /v1/embeddings holds NaN at \['data'\]\[0\]\['embedding'\]\[3\] \(the path's "
                    "first index is the input's", answer.json()["error"]["message"]), answer.text
