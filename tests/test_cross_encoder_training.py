"""The same cross-encoder training script run with sentence-transformers and with bertkit.sentence.cross_encoder
(the import changed): MiniLM with a seeded classifier (dropout off) on SQuAD questions against the sentence of
their paragraph that holds the answer and the paragraph's other sentences, for each loss; the same loss at every
step, the same reranking metrics on another article's questions after training, the same scores."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from bertkit.sentence.cross_encoder import CrossEncoder, CrossEncoderTrainer, CrossEncoderTrainingArguments
from bertkit.sentence.cross_encoder import losses as ce_losses
from bertkit.sentence.data import no_duplicates_batches
from bertkit.sentence.training_args import BatchSamplers
from cross_encoder_helpers import cross_encoder_directory, squad_rerank

pytest.importorskip("sentence_transformers.cross_encoder")
datasets = pytest.importorskip("datasets")

STEPS = 3
LEARNING_RATE = 1e-4
LISTWISE = ("ListNetLoss", "LambdaLoss", "PListMLELoss")
SHIFT_INVARIANT = (*LISTWISE, "MarginMSELoss")  # losses of score differences only


def _dataset(loss: str, rows: list[dict]) -> list[dict]:
    if loss == "BinaryCrossEntropyLoss":  # a positive and a negative pair per question
        return [{"query": r["query"], "text": t, "label": float(t == r["positive"])}
                for r in rows for t in (r["positive"], r["negatives"][0])]
    if loss.endswith("MultipleNegativesRankingLoss"):  # (anchor, positive, hard negative)
        return [{"query": r["query"], "positive": r["positive"], "negative": r["negatives"][0]} for r in rows]
    if loss == "CrossEntropyLoss":  # three classes: the answer's sentence, another sentence, another question's
        return [{"query": r["query"], "text": t, "label": c} for i, r in enumerate(rows)
                for c, t in enumerate((r["positive"], r["negatives"][0], rows[i - 1]["positive"]))]
    if loss == "MarginMSELoss":  # a teacher's margins, one per negative column (a list a row)
        return [{"query": r["query"], "positive": r["positive"], "negative_1": r["negatives"][0],
                 "negative_2": r["negatives"][1], "label": [2.0 + 0.1 * i, 3.0 - 0.1 * i]} for i, r in enumerate(rows)]
    # listwise: the answer sentence first, 2-4 documents a question, graded labels
    return [{"query": r["query"], "docs": [r["positive"], *r["negatives"][:1 + i % 3]],
             "labels": [1.0, *[0.5 / (j + 1) for j in range(min(len(r["negatives"]), 1 + i % 3))]]}
            for i, r in enumerate(rows)]


def _train(lib: str, model_dir, out_dir, loss_name: str, train_rows: list[dict], held_out: list[dict]):
    """The training script; ``lib`` picks the import, nothing else differs."""
    if lib == "sentence_transformers":
        from sentence_transformers.cross_encoder import (
            CrossEncoder,
            CrossEncoderTrainer,
            CrossEncoderTrainingArguments,
            evaluation,
            losses,
        )
    else:
        from bertkit.sentence.cross_encoder import (
            CrossEncoder,
            CrossEncoderTrainer,
            CrossEncoderTrainingArguments,
            evaluation,
            losses,
        )
    model = CrossEncoder(str(model_dir), max_length=64)
    step_losses = []

    class Recorded(getattr(losses, loss_name)):  # each step's loss, unrounded
        def forward(self, inputs, labels, **kwargs):
            value = super().forward(inputs, labels, **kwargs)
            step_losses.append(value.item())
            return value

    batch = 4 if loss_name in LISTWISE else 8
    args = CrossEncoderTrainingArguments(
        output_dir=str(out_dir), per_device_train_batch_size=batch, max_steps=STEPS, learning_rate=LEARNING_RATE,
        logging_steps=1, save_strategy="no", report_to="none", seed=42, use_cpu=True, disable_tqdm=True)
    samples = [{"query": r["query"], "positive": [r["positive"]], "negative": r["negatives"]} for r in held_out]
    evaluator = evaluation.CrossEncoderRerankingEvaluator(samples, at_k=5, name="squad", batch_size=16) \
        if loss_name != "CrossEntropyLoss" else None  # reranking needs one relevance score a pair
    # MNRL with all the batch's other candidates as negatives: a draw of fewer (num_negatives=4, the default) comes
    # from torch's global generator, which the two trainers leave in different states (test_cross_encoder.py
    # compares such draws from one state)
    kwargs = {"num_negatives": None} if loss_name.endswith("MultipleNegativesRankingLoss") else {}
    if loss_name.startswith("Cached"):
        kwargs["mini_batch_size"] = 5  # 8 rows x 9 candidates: 15 mini-batches
    trainer = CrossEncoderTrainer(model=model, args=args, train_dataset=datasets.Dataset.from_list(
        _dataset(loss_name, train_rows)), loss=Recorded(model, **kwargs), evaluator=evaluator)
    trainer.train()
    return (step_losses, evaluator(model) if evaluator else {},
            model.predict([(r["query"], r["positive"]) for r in held_out]))


@pytest.mark.slow  # 20-40 s each: make test-slow
@pytest.mark.parametrize("loss", ["BinaryCrossEntropyLoss", "MultipleNegativesRankingLoss",
                                  "CachedMultipleNegativesRankingLoss", "ListNetLoss",
                                  "LambdaLoss", "PListMLELoss", "CrossEntropyLoss", "MarginMSELoss"])
def test_training_script_gives_sentence_transformers_numbers(loss, tmp_path, minilm_dir, data_dir):
    # all 6 layers: cut to 2, MultipleNegativesRankingLoss's 6 steps leave the loss where it started (2.77253 -> 2.77260)
    train_rows, held_out = squad_rerank(data_dir, 0, 24), squad_rerank(data_dir, 1, 12)
    model_dir = cross_encoder_directory(minilm_dir, tmp_path / "minilm-ce", num_labels=3 if loss == "CrossEntropyLoss" else 1)
    want_losses, want_metrics, want_scores = _train("sentence_transformers", model_dir, tmp_path / "st", loss,
                                                    train_rows, held_out)
    got_losses, got_metrics, got_scores = _train("bertkit", model_dir, tmp_path / "bk", loss, train_rows, held_out)
    assert len(want_losses) == len(got_losses) == STEPS
    np.testing.assert_allclose(got_losses, want_losses, rtol=1e-5, atol=0)
    assert want_losses[0] != pytest.approx(want_losses[-1], rel=1e-3)  # the steps did train
    assert got_metrics.keys() == want_metrics.keys() and ("squad_ndcg@5" in got_metrics or loss == "CrossEntropyLoss")
    np.testing.assert_allclose([got_metrics[k] for k in want_metrics], list(want_metrics.values()), atol=1e-6)
    if loss in SHIFT_INVARIANT:
        # a listwise loss does not change when every score of a list moves together, so the classifier bias's
        # gradient is zero up to rounding, and Adam turns that rounding noise into steps of up to the learning rate
        # either way: the two trainings may end with biases up to 2 x STEPS x lr apart. Compared without that
        # common shift, the scores agree as closely as the other losses' do.
        got_logits, want_logits = _logit(got_scores), _logit(want_scores)
        shift = float(np.mean(got_logits - want_logits))
        assert abs(shift) <= 2 * STEPS * LEARNING_RATE * 1.01, shift
        np.testing.assert_allclose(got_logits - shift, want_logits, atol=4e-5, rtol=0)
    else:
        np.testing.assert_allclose(got_scores, want_scores, atol=1e-5, rtol=0)


def _logit(p) -> np.ndarray:
    p = np.asarray(p, dtype=np.float64)
    return np.log(p / (1 - p))


def test_the_best_model_by_an_evaluator_alone_is_sentence_transformers(tmp_path, minilm_2_layers, data_dir):
    """load_best_model_at_end with metric_for_best_model named as the evaluator writes it and no eval_dataset (a
    reranker trained with its reranking evaluator alone): the same evaluations, the same best checkpoint, and the
    model it loads scores as sentence-transformers' (bertkit refused it: "needs an eval_dataset"). A metric the
    evaluator does not write is refused before training, naming the ones it does."""
    import re

    from bertkit.errors import BertkitError

    rows, held = squad_rerank(data_dir, 0, 4), squad_rerank(data_dir, 1, 4)
    model_dir = cross_encoder_directory(minilm_2_layers, tmp_path / "ce")
    train = datasets.Dataset.from_list(_dataset("BinaryCrossEntropyLoss", rows))
    samples = [{"query": r["query"], "positive": [r["positive"]], "negative": r["negatives"]} for r in held]
    pairs = [(r["query"], t) for r in held for t in (r["positive"], *r["negatives"])]

    def run(lib, metric="dev_map"):
        ce = __import__(f"{lib}.cross_encoder", fromlist=["evaluation"])
        model = ce.CrossEncoder(str(model_dir), max_length=32)
        args = ce.CrossEncoderTrainingArguments(
            output_dir=str(tmp_path / lib), per_device_train_batch_size=4, max_steps=2, learning_rate=LEARNING_RATE,
            eval_strategy="steps", eval_steps=1, save_strategy="steps", save_steps=1, load_best_model_at_end=True,
            metric_for_best_model=metric, greater_is_better=False, report_to="none", seed=42, use_cpu=True,
            disable_tqdm=True)
        trainer = ce.CrossEncoderTrainer(model=model, args=args, train_dataset=train,
                                         evaluator=ce.evaluation.CrossEncoderRerankingEvaluator(samples, name="dev"))
        trainer.train()
        evaluations = [e["eval_dev_map"] for e in trainer.state.log_history if "eval_dev_map" in e]
        return evaluations, trainer.state.best_model_checkpoint, model.predict(pairs)

    want_maps, want_best, want_scores = run("sentence_transformers")
    got_maps, got_best, got_scores = run("bertkit.sentence")
    assert len(got_maps) == len(want_maps) == 2 and len(set(want_maps)) > 1  # the steps changed the ranking
    np.testing.assert_allclose(got_maps, want_maps, atol=1e-12)
    assert Path(got_best).name == Path(want_best).name == f"checkpoint-{1 + int(np.argmin(want_maps))}"
    np.testing.assert_allclose(got_scores, want_scores, atol=1e-6, rtol=0)
    with pytest.raises(BertkitError, match=re.escape(
            "metric_for_best_model 'ndcg@10' is not a metric this run computes: evaluation returns ['eval_dev_map', "
            "'eval_dev_mrr@10', 'eval_dev_ndcg@10']")):
        run("bertkit.sentence", "ndcg@10")


def test_string_labels_advice_leads_to_a_model_the_loss_accepts(tmp_path, minilm_2_layers):
    """"0"/"1" labels with BinaryCrossEntropyLoss: the error's advice, followed, trains (the advice used to be to name
    the labels when loading, id2label of two labels, which BinaryCrossEntropyLoss refuses: it needs one)."""
    import re

    from bertkit.errors import BertkitError
    from bertkit.sentence.cross_encoder import (
        CrossEncoder,
        CrossEncoderTrainer,
        CrossEncoderTrainingArguments,
        losses,
    )

    rows = [{"query": f"question {i}", "text": f"passage {i % 3}", "label": str(i % 2)} for i in range(8)]
    model = CrossEncoder(cross_encoder_directory(minilm_2_layers, tmp_path / "ce"), max_length=16)
    args = CrossEncoderTrainingArguments(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, max_steps=2,
                                         save_strategy="no", report_to="none", use_cpu=True, disable_tqdm=True)

    def train(dataset):
        trainer = CrossEncoderTrainer(model=model, args=args, train_dataset=dataset,
                                      loss=losses.BinaryCrossEntropyLoss(model))
        return trainer.train()

    with pytest.raises(BertkitError, match=re.escape(
            "label holds strings ['0', '1'], and the model takes a number per example (its loss scores, it has no "
            "label names); make them numbers: dataset.cast_column('label', Value('float32')) (from datasets "
            "import Value), or float() each")):
        train(datasets.Dataset.from_list(rows))
    advised = datasets.Dataset.from_list(rows).cast_column("label", datasets.Value("float32"))
    assert train(advised).global_step == 2


def test_labels_the_loss_cannot_learn_from_are_refused_before_training(tmp_path, minilm_2_layers):
    """BinaryCrossEntropyLoss with a label outside [0, 1] (a 0-5 score, a -1 negative) trained without a word, as
    sentence-transformers does; CrossEntropyLoss found a label that is no class only at the step whose batch held it.
    Both are refused when the trainer is made, naming the row, and nothing is written."""
    import re

    from bertkit.errors import BertkitError
    from bertkit.sentence.cross_encoder import (
        CrossEncoder,
        CrossEncoderTrainer,
        CrossEncoderTrainingArguments,
        losses,
    )

    args = CrossEncoderTrainingArguments(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, max_steps=2,
                                         save_strategy="no", report_to="none", use_cpu=True, disable_tqdm=True)
    one = CrossEncoder(cross_encoder_directory(minilm_2_layers, tmp_path / "one"), max_length=16)
    rows = [{"query": f"question {i}", "text": f"passage {i % 3}", "label": [1.0, 0.0, 0.5][i % 3]} for i in range(8)]
    for bad, value in ((5, 3.0), (6, -1)):
        data = [*rows[:bad], {**rows[bad], "label": value}, *rows[bad + 1:]]
        with pytest.raises(BertkitError, match=re.escape(
                f"train_dataset: row {bad} has label {value!r}, and BinaryCrossEntropyLoss takes a label in [0, 1]")):
            CrossEncoderTrainer(model=one, args=args, train_dataset=data, loss=losses.BinaryCrossEntropyLoss(one))
    three = CrossEncoder(cross_encoder_directory(minilm_2_layers, tmp_path / "three", num_labels=3), max_length=16)
    classes = [{**r, "label": i % 3} for i, r in enumerate(rows)]
    classes[7]["label"] = 3
    with pytest.raises(BertkitError, match=re.escape(
            "train_dataset: CrossEntropyLoss: label 3 is not a class of this model, whose 3 labels are 0 to 2")):
        CrossEncoderTrainer(model=three, args=args, train_dataset=classes)
    assert not (tmp_path / "out").exists()
    trainer = CrossEncoderTrainer(model=one, args=args, train_dataset=rows, loss=losses.BinaryCrossEntropyLoss(one))
    assert trainer.train().global_step == 2  # 0, 1 and a probability between are labels


def test_torch_compile_compiles_the_encoder_a_loss_wraps(tmp_path, minilm_2_layers):
    """torch_compile=True on a cross-encoder's or a sparse encoder's trainer compiles the layers of the encoder the
    loss holds (the loop is handed the loss, not a model with ``.bert``; it used to refuse them), and refuses a
    model that holds no bertkit encoder, by name."""
    import torch

    from bertkit.errors import BertkitError
    from bertkit.sentence.cross_encoder import CrossEncoder, losses
    from bertkit.sentence.cross_encoder.trainer import CrossEncoderLossModel
    from bertkit.training.run_setup import compile_encoders

    model = CrossEncoder(cross_encoder_directory(minilm_2_layers, tmp_path / "ce"), max_length=16)
    wrapped = CrossEncoderLossModel(losses.BinaryCrossEntropyLoss(model))
    layers = [m for m in wrapped.modules() if type(m).__name__ == "BertLayer"]
    assert len(layers) == 2 and not any(layer._compiled_call_impl for layer in layers)
    compile_encoders(wrapped)
    assert all(layer._compiled_call_impl is not None for layer in layers)
    with pytest.raises(BertkitError, match="Linear holds no encoder with compile_layers"):
        compile_encoders(torch.nn.Linear(2, 2))


def test_listwise_no_duplicates_batches_are_sentence_transformers(minilm_2_layers, tmp_path):
    """A listwise cross-encoder dataset (query, list of documents, labels): sentence-transformers' no-duplicates
    sampler compares a row's query and its whole list of documents, not each document (another row's documents are
    no negatives of a listwise loss). bertkit kept rows sharing any one document apart: 8 rows whose lists share
    documents made 4 batches of 5 where sentence-transformers makes 2, so an epoch (its first 2 batches) left 4 rows
    out and trained other batches to other losses (LambdaLoss 3.7385 against 3.6017 at the first log)."""
    st_sampler = pytest.importorskip("sentence_transformers.base.sampler")
    datasets = pytest.importorskip("datasets")
    rows = [{"query": f"question {i}", "docs": [f"answer {i}", f"sentence {i // 2}", f"sentence {i // 3 + 5}"],
             "labels": [1, 0, 0]} for i in range(8)]
    model = CrossEncoder(cross_encoder_directory(minilm_2_layers, tmp_path / "ce"), max_length=32)
    trainer = CrossEncoderTrainer(model=model, args=CrossEncoderTrainingArguments(
        output_dir=str(tmp_path / "out"), report_to="none", use_cpu=True, batch_sampler=BatchSamplers.NO_DUPLICATES),
        loss=ce_losses.LambdaLoss(model), train_dataset=datasets.Dataset.from_list(rows))
    for seed in range(12):
        want = list(st_sampler.NoDuplicatesBatchSampler(datasets.Dataset.from_list(rows), 5, drop_last=False,
                                                        valid_label_columns=["labels"], generator=torch.Generator(),
                                                        seed=seed))
        assert no_duplicates_batches(trainer.train_dataset, 5, seed) == want and len(want) == 2, seed


def test_cross_encoder_learning_rate_mapping_is_sentence_transformers(minilm_2_layers, tmp_path):
    """CrossEncoderTrainingArguments(learning_rate_mapping=...) was refused ("one learning rate for the whole
    model"), where sentence-transformers' cross-encoder trainer applies it: now every parameter has its rate and
    weight decay (its names are sentence-transformers', ``model.0.model.classifier.weight``), and a rate of 0 keeps
    the classifier as it was through training."""
    st_ce = pytest.importorskip("sentence_transformers.cross_encoder")
    datasets = pytest.importorskip("datasets")
    import bertkit.sentence.cross_encoder as bk_ce

    path = cross_encoder_directory(minilm_2_layers, tmp_path / "ce")
    pairs = datasets.Dataset.from_list([{"q": f"question {i}", "d": f"paragraph {i // 2}", "label": i % 2}
                                        for i in range(8)])
    mapping = {r"classifier": 0.0, r"encoder\.layer\.0\.": 1e-3}
    rates = {}
    for lib, S in (("sentence_transformers", st_ce), ("bertkit", bk_ce)):
        model = S.CrossEncoder(str(path), max_length=32, device="cpu")
        loss = S.losses.BinaryCrossEntropyLoss(model)
        args = S.CrossEncoderTrainingArguments(output_dir=str(tmp_path / lib), learning_rate=2e-5, weight_decay=0.1,
                                               report_to="none", use_cpu=True, learning_rate_mapping=mapping,
                                               max_steps=1, per_device_train_batch_size=4, save_strategy="no")
        trainer = S.CrossEncoderTrainer(model=model, args=args, train_dataset=pairs, loss=loss)
        groups = trainer.create_optimizer().param_groups if lib == "sentence_transformers" else trainer._parameter_groups()
        names = {id(p): n for n, p in loss.named_parameters()}
        rates[lib] = {names[id(p)]: (g.get("lr", 2e-5), g["weight_decay"]) for g in groups for p in g["params"]}
    assert rates["bertkit"] == rates["sentence_transformers"] and len(rates["bertkit"]) == 41
    assert rates["bertkit"]["model.0.model.classifier.weight"] == (0.0, 0.1)
    assert rates["bertkit"]["model.0.model.bert.encoder.layer.0.output.dense.bias"] == (1e-3, 0.0)
    classifier = dict(model.named_parameters())
    key = next(k for k in classifier if k.endswith("classifier.weight"))
    before = classifier[key].detach().clone()
    trainer.train()
    assert torch.equal(dict(model.named_parameters())[key], before)


def _label_forms_losses(lib: str, model_dir, out_dir, loss_name: str, dataset, steps: int = 2) -> list[float]:
    """Each step's loss of the same two-step training script, ``lib`` picking the import."""
    import importlib

    S = importlib.import_module(f"{lib}.sentence.cross_encoder" if lib == "bertkit" else f"{lib}.cross_encoder")
    model = S.CrossEncoder(str(model_dir), max_length=32)
    step_losses = []

    class Recorded(getattr(S.losses, loss_name)):
        def forward(self, inputs, labels, **kwargs):
            value = super().forward(inputs, labels, **kwargs)
            step_losses.append(value.item())
            return value

    args = S.CrossEncoderTrainingArguments(
        output_dir=str(out_dir), per_device_train_batch_size=4, max_steps=steps, learning_rate=1e-3,
        save_strategy="no", report_to="none", seed=42, use_cpu=True, disable_tqdm=True)
    S.CrossEncoderTrainer(model=model, args=args, train_dataset=dataset, loss=Recorded(model)).train()
    return step_losses


def _label_form_rows(kind: str) -> list[dict]:
    q = [f"question {i} about topic {i % 3}" for i in range(8)]
    t = [f"passage {i} text on topic {(i * 2) % 5}" for i in range(8)]
    if kind == "listwise":
        return [{"query": q[i], "docs": [t[i], *t[:1 + i % 3]], "labels": [1.0, *[0.5 / (j + 1) for j in
                                                                              range(1 + i % 3)]]} for i in range(8)]
    if kind == "margins":
        return [{"query": q[i], "positive": t[i], "n1": t[i - 1], "n2": t[i - 2], "label": [1.0 + 0.1 * i,
                                                                                         2.0 - 0.1 * i]}
                for i in range(8)]
    return [{"query": q[i], "text": t[i], "label": i % (3 if kind == "classes" else 2)} for i in range(8)]


_LABEL_FORM_LOSSES = {"listwise": "ListNetLoss", "margins": "MarginMSELoss", "classes": "CrossEntropyLoss",
                      "binary": "BinaryCrossEntropyLoss"}


@pytest.mark.parametrize("kind, cast", [("listwise", None), ("margins", None), ("classes", "int64"),
                                        ("classes", "int8"), ("binary", "bool"), ("binary", "int64"),
                                        ("binary", "float32")])
def test_torch_formatted_labels_train_as_in_sentence_transformers(kind, cast, tiny_checkpoint, minilm_2_layers,
                                                                  tmp_path):
    """Labels as a dataset with format "torch" hands them over (0-d tensors of the column's dtype, or a tensor per
    row for a list of labels), sentence-transformers 6.3's CrossEncoderDataCollator stacks them or keeps each row's:
    the same loss at each step. A listwise dataset in that format was refused as having no list of labels."""
    model_dir = tiny_checkpoint(tmp_path / "ce", "BertForSequenceClassification", tokenizer=minilm_2_layers,
                                labels=3 if kind == "classes" else 1, hidden_dropout_prob=0.0,
                                attention_probs_dropout_prob=0.0, initializer_range=0.5, max_position_embeddings=512)
    dataset = datasets.Dataset.from_list(_label_form_rows(kind))
    if cast:
        dataset = dataset.cast_column("label", datasets.Value(cast))
    dataset = dataset.with_format("torch")
    loss = _LABEL_FORM_LOSSES[kind]
    want = _label_forms_losses("sentence_transformers", model_dir, tmp_path / "st", loss, dataset)
    got = _label_forms_losses("bertkit", model_dir, tmp_path / "bk", loss, dataset)
    assert len(got) == len(want) == 2 and want[0] != want[1]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=0)  # 1.5574417 against 1.5574405 at ListNetLoss's 2nd


def test_torch_and_numpy_labels_train_as_plain_ones(tiny_checkpoint, minilm_2_layers, tmp_path):
    """bertkit alone: a listwise dataset with format "torch" (refused before: "row
    0 has 'docs' list and 'labels' Tensor") and a bool label column with format "numpy" (0-d bool arrays, which
    failed in the collator with "len() of unsized object"; sentence-transformers 6.3 takes no "numpy" format) train
    to the losses of the same rows as plain lists and bools."""
    model_dir = tiny_checkpoint(tmp_path / "ce", "BertForSequenceClassification", tokenizer=minilm_2_layers,
                                labels=1, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, initializer_range=0.5,
                                max_position_embeddings=512, num_hidden_layers=1)
    listwise = datasets.Dataset.from_list(_label_form_rows("listwise"))
    binary = datasets.Dataset.from_list(_label_form_rows("binary")).cast_column("label", datasets.Value("bool"))
    for loss, plain, formatted in (("ListNetLoss", listwise, listwise.with_format("torch")),
                                   ("BinaryCrossEntropyLoss", binary, binary.with_format("numpy"))):
        want = _label_forms_losses("bertkit", model_dir, tmp_path / "a", loss, plain, steps=1)
        got = _label_forms_losses("bertkit", model_dir, tmp_path / "b", loss, formatted, steps=1)
        assert len(got) == 1 and got == pytest.approx(want, rel=1e-6), loss
