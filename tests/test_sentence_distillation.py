"""sentence-transformers' model-distillation recipe in bertkit.sentence, against sentence-transformers running the
same script (only the import differs): a student made by keeping some of the teacher's layers
(``student[0].auto_model.encoder.layer = nn.ModuleList([...])`` and the config's num_hidden_layers), trained with
MSELoss on the teacher's embeddings of STS-B sentences, evaluated with MSEEvaluator, MSEEvaluatorFromDataFrame and
TranslationEvaluator (same metrics, same results CSVs), saved, and read back by sentence-transformers with the same
vectors. A student whose layers and config disagree is refused when saved."""

from __future__ import annotations

import csv

import numpy as np
import pytest
import torch

import bertkit.sentence as bk
from bertkit.errors import BertkitError
from bertkit.sentence import evaluation, losses
from sentence_helpers import glue_rows, st_directory

st = pytest.importorskip("sentence_transformers")
st_evaluation = pytest.importorskip("sentence_transformers.sentence_transformer.evaluation")
st_losses = pytest.importorskip("sentence_transformers.sentence_transformer.losses")
datasets = pytest.importorskip("datasets")


@pytest.fixture(scope="module")
def stsb(data_dir):
    rows = glue_rows(data_dir, "STS-B", n=12)
    return [r[7] for r in rows], [r[8] for r in rows]


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory, minilm_2_layers):
    return st_directory(minilm_2_layers, tmp_path_factory.mktemp("st") / "m", dropout=0.0, max_seq_length=32)


def _evaluators(ev, teacher, first, second):
    rows = [{"en": a, "de": b, "fr": b.upper() if i % 3 else ""} for i, (a, b) in enumerate(zip(first, second))]
    targets = second[:-1] + second[:1]  # the last source's target repeats the first's: either counts as its match
    return [ev.MSEEvaluator(first, second, teacher_model=teacher, name="stsb"),
            ev.MSEEvaluator(first, first, teacher_model=teacher, batch_size=5),  # unnamed: mse_evaluation__results.csv
            ev.MSEEvaluatorFromDataFrame(rows, teacher, [("en", "de"), ("en", "fr")], name="df"),
            ev.TranslationEvaluator(first, targets, name="pairs"),
            ev.TranslationEvaluator(first, second, truncate_dim=32)]


def _student(S, teacher_dir):
    """The teacher's second layer alone, as sentence-transformers' model_distillation_layer_reduction.py cuts it."""
    student = S.SentenceTransformer(str(teacher_dir), device="cpu")
    auto_model = student[0].auto_model
    auto_model.encoder.layer = torch.nn.ModuleList([auto_model.encoder.layer[1]])
    auto_model.config.num_hidden_layers = 1
    return student


def _evaluate(lib, teacher_dir, out, first, second):
    """Each evaluator called twice with an output_path: (metrics, primary metrics, {CSV name: bytes})."""
    S, ev = (st, st_evaluation) if lib == "st" else (bk, evaluation)
    evaluators = _evaluators(ev, S.SentenceTransformer(str(teacher_dir), device="cpu"), first, second)
    student = _student(S, teacher_dir)
    metrics = [e(student, output_path=str(out), epoch=e_, steps=s) for e_, s in ((0, 2), (1, 3)) for e in evaluators]
    return metrics, [e.primary_metric for e in evaluators], {p.name: p.read_bytes() for p in sorted(out.iterdir())}


def test_distillation_evaluators_give_sentence_transformers_numbers_and_files(teacher_dir, stsb, tmp_path):
    first, second = stsb
    want = _evaluate("st", teacher_dir, tmp_path / "st", first, second)
    got = _evaluate("bk", teacher_dir, tmp_path / "bk", first, second)
    for got_metrics, want_metrics in zip(got[0], want[0]):
        assert list(got_metrics) == list(want_metrics)
        np.testing.assert_allclose(list(got_metrics.values()), list(want_metrics.values()), rtol=1e-6, atol=0)
    assert got[1] == want[1] == ["stsb_negative_mse", "negative_mse", "df_negative_mse", "pairs_mean_accuracy",
                                 "mean_accuracy"]
    assert got[2].keys() == want[2].keys() and "mse_evaluation__results.csv" in want[2]
    for name, data in want[2].items():  # the same columns and values, appended on the second call
        got_rows = list(csv.reader(got[2][name].decode().splitlines()))
        want_rows = list(csv.reader(data.decode().splitlines()))
        assert got_rows[0] == want_rows[0] and len(got_rows) == len(want_rows) == 3, name
        np.testing.assert_allclose(np.asarray(got_rows[1:], float), np.asarray(want_rows[1:], float), rtol=1e-6)
    assert want[2]["translation_evaluation_pairs_results.csv"].startswith(b"epoch,steps,src2trg,trg2src\r\n0,2,")


def _train(lib, teacher_dir, out, first, second):
    """The distillation script; ``lib`` picks the import, nothing else differs."""
    S, ev, ls = (st, st_evaluation, st_losses) if lib == "st" else (bk, evaluation, losses)
    teacher = S.SentenceTransformer(str(teacher_dir), device="cpu")
    student = _student(S, teacher_dir)
    train = datasets.Dataset.from_dict({"sentence": first + second})
    train = train.map(lambda b: {"label": teacher.encode(b["sentence"]).tolist()}, batched=True)
    steps = []

    class Recorded(ls.MSELoss):
        def forward(self, features, labels):
            value = super().forward(features, labels)
            steps.append(value.item())
            return value

    evaluator = ev.MSEEvaluator(first, second, teacher_model=teacher, name="stsb")
    args = S.SentenceTransformerTrainingArguments(
        output_dir=str(out), per_device_train_batch_size=4, max_steps=3, learning_rate=1e-3, save_strategy="no",
        report_to="none", seed=42, use_cpu=True, disable_tqdm=True, eval_strategy="steps", eval_steps=3)
    S.SentenceTransformerTrainer(model=student, args=args, train_dataset=train, loss=Recorded(student),
                                 evaluator=evaluator).train()
    student.save(str(out / "student"))
    return steps, (out / "eval" / evaluator.csv_file).read_bytes()


@pytest.mark.slow  # 20-40 s on two cores
def test_distillation_training_gives_sentence_transformers_numbers(teacher_dir, stsb, tmp_path):
    first, second = stsb
    want_steps, want_csv = _train("st", teacher_dir, tmp_path / "st", first, second)
    got_steps, got_csv = _train("bk", teacher_dir, tmp_path / "bk", first, second)
    np.testing.assert_allclose(got_steps, want_steps, rtol=1e-5, atol=0)  # each step's MSELoss
    assert len(want_steps) == 3 and want_steps[0] != want_steps[-1]
    got_rows, want_rows = (list(csv.reader(data.decode().splitlines())) for data in (got_csv, want_csv))
    assert got_rows[0] == want_rows[0] == ["epoch", "steps", "MSE"] and len(got_rows) == len(want_rows) == 2
    assert got_rows[1][:2] == want_rows[1][:2] and want_rows[1][1] == "3"  # the evaluation at step 3
    np.testing.assert_allclose(float(got_rows[1][2]), float(want_rows[1][2]), rtol=1e-6)
    probe = first[:4] + ["a sentence neither saw"]
    vectors = bk.SentenceTransformer(tmp_path / "bk" / "student").encode(probe)
    read_by_st = st.SentenceTransformer(str(tmp_path / "bk" / "student"), device="cpu").encode(probe)
    trained_by_st = st.SentenceTransformer(str(tmp_path / "st" / "student"), device="cpu").encode(probe)
    np.testing.assert_allclose(read_by_st, vectors, atol=1e-6, rtol=0)
    np.testing.assert_allclose(vectors, trained_by_st, atol=1e-5, rtol=0)


def test_a_student_whose_layers_and_config_disagree_is_refused_when_saved(teacher_dir, tmp_path):
    """Was: with num_hidden_layers lowered and the layers kept, the checkpoint held the first layers and read back
    with other vectors (0.41 apart on MiniLM); with the layers cut and the config kept, save blamed int8 weights."""
    for cut_layers, cut_config in ((True, False), (False, True)):
        student = bk.SentenceTransformer(teacher_dir)
        if cut_layers:
            student[0].auto_model.encoder.layer = torch.nn.ModuleList([student[0].auto_model.encoder.layer[0]])
        if cut_config:
            student[0].auto_model.config.num_hidden_layers = 1
        runs, says = (1, 2) if cut_layers else (2, 1)
        with pytest.raises(BertkitError, match=rf"runs {runs} encoder layers but its config says "
                                               rf"num_hidden_layers={says}, .* set config.num_hidden_layers = {runs}"):
            student.save(tmp_path / "student")
        assert not (tmp_path / "student").exists()


def test_bad_distillation_evaluator_input_is_refused(teacher_dir):
    model = bk.SentenceTransformer(teacher_dir)
    with pytest.raises(BertkitError, match="MSEEvaluator: teacher_model is NoneType, not a model with encode"):
        evaluation.MSEEvaluator(["a"], ["b"])  # sentence-transformers: 'NoneType' object has no attribute 'encode'
    with pytest.raises(BertkitError, match="MSEEvaluator: 2 source_sentences and 1 target_sentences"):
        evaluation.MSEEvaluator(["a", "b"], ["c"], teacher_model=model)
    with pytest.raises(BertkitError, match="TranslationEvaluator: 1 source_sentences and 2 target_sentences"):
        evaluation.TranslationEvaluator(["a"], ["b", "c"])  # an AssertionError there
    with pytest.raises(BertkitError, match="TranslationEvaluator: no sentences to evaluate"):
        evaluation.TranslationEvaluator([], [])
    narrow = evaluation.MSEEvaluator(["a", "b"], ["c", "d"], teacher_model=_Narrow(model))
    with pytest.raises(BertkitError, match="the teacher's embeddings have 16 dimensions and the model's 384"):
        narrow(model)  # numpy's broadcasting error there
    with pytest.raises(BertkitError, match=r"row 1 has 'de' None, not a text"):
        evaluation.MSEEvaluatorFromDataFrame([{"en": "a", "de": "b"}, {"en": "c", "de": None}], model,
                                                [("en", "de")])
    pandas = pytest.importorskip("pandas")
    with pytest.raises(BertkitError, match=r"takes a list of dicts, one a row; .*dataframe.to_dict\('records'\)"):
        evaluation.MSEEvaluatorFromDataFrame(pandas.DataFrame({"en": ["a"], "de": ["b"]}), model, [("en", "de")])


class _Narrow:
    """A teacher of 16 dimensions, with nothing but encode."""

    def __init__(self, model):
        self.model = model

    def encode(self, texts, **kwargs):
        return self.model.encode(texts, **{**kwargs, "truncate_dim": 16})
