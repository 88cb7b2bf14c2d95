"""The results CSV every evaluator writes when called with an output_path, beside sentence-transformers 6's on the
same model (MiniLM's first 2 layers; a cross-encoder and a SPLADE model drawn on them, seed 0): the same file names,
header rows, line endings and values (within 1e-6), appended on a second call; a file bertkit did not write is
refused, never appended to."""

from __future__ import annotations

import csv
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from bertkit.errors import BertkitError
from bertkit.sentence import SentenceTransformer, evaluation
from bertkit.sentence import util as bk_util
from bertkit.sentence.cross_encoder import CrossEncoder
from bertkit.sentence.cross_encoder import evaluation as ce_evaluation
from bertkit.sentence.sparse_encoder import SparseEncoder
from bertkit.sentence.sparse_encoder import evaluation as sparse_evaluation
from cases import slow_after
from sentence_helpers import st_directory
from sparse_helpers import masked_lm_checkpoint

st = pytest.importorskip("sentence_transformers")
from sentence_transformers.cross_encoder import evaluation as st_ce_evaluation  # noqa: E402
from sentence_transformers.sentence_transformer import evaluation as st_evaluation  # noqa: E402
from sentence_transformers.sparse_encoder import evaluation as st_sparse_evaluation  # noqa: E402

S1 = ["A man is playing a guitar.", "A woman eats pasta.", "The cat sleeps on the sofa.", "Kids play football.",
      "It rains today in the city."]
S2 = ["Someone plays an instrument.", "A lady is eating.", "A dog barks at the mailman.", "Children are playing soccer.",
      "The sun shines over the hills."]
LABELS, GOLD = [1, 1, 0, 1, 0], [4.5, 4.0, 0.5, 4.8, 1.0]
QUERIES = {f"q{i}": s for i, s in enumerate(S1)}
CORPUS = {f"d{i}": s for i, s in enumerate(S2)}
RELEVANT = {f"q{i}": {f"d{i}"} for i in range(5)}
SAMPLES = [{"query": S1[i], "positive": [S2[i]], "negative": [S2[(i + 1) % 5], S2[(i + 2) % 5]]} for i in range(5)]
SENTENCES = dict(enumerate(S1 + S2))


def _dense(e):
    util = bk_util if e is evaluation else st.util
    return {
        "binary": lambda: e.BinaryClassificationEvaluator(S1, S2, LABELS, name="b"),
        "binary-all": lambda: e.BinaryClassificationEvaluator(
            S1, S2, LABELS, similarity_fn_names=["cosine", "euclidean", "dot", "manhattan"]),
        "similarity": lambda: e.EmbeddingSimilarityEvaluator(S1, S2, GOLD, name="sts", similarity_fn_names=["cosine", "dot"]),
        "similarity-float32": lambda: e.EmbeddingSimilarityEvaluator(S1, S2, GOLD, precision="float32"),
        "triplet": lambda: e.TripletEvaluator(S1, S2, S2[1:] + S2[:1], name="t", similarity_fn_names=["cosine", "euclidean"]),
        "retrieval": lambda: e.InformationRetrievalEvaluator(QUERIES, CORPUS, RELEVANT, name="ir"),
        "retrieval-two": lambda: e.InformationRetrievalEvaluator(
            QUERIES, CORPUS, RELEVANT, accuracy_at_k=[1, 2], precision_recall_at_k=[2], mrr_at_k=[3], ndcg_at_k=[3, 5],
            map_at_k=[4], score_functions={"dot": util.dot_score, "cos": util.cos_sim}),
        "reranking": lambda: e.RerankingEvaluator(SAMPLES, name="r", at_k=3),
        "mining": lambda: e.ParaphraseMiningEvaluator(SENTENCES, [(0, 5), (1, 6), (3, 8)], name="pm"),
        "mining-none-found": lambda: e.ParaphraseMiningEvaluator(SENTENCES, [(0, 1)]),
    }


def _cross(e):
    pairs = list(zip(S1, S2))
    return {
        "ce-classification": lambda: e.CrossEncoderClassificationEvaluator(pairs, LABELS, name="c"),
        "ce-correlation": lambda: e.CrossEncoderCorrelationEvaluator(pairs, GOLD),
        "ce-reranking": lambda: e.CrossEncoderRerankingEvaluator(SAMPLES, at_k=3, name="r"),
    }


def _sparse(e):
    return {
        "sparse-retrieval": lambda: e.SparseInformationRetrievalEvaluator(QUERIES, CORPUS, RELEVANT, name="ir"),
        "sparse-similarity": lambda: e.SparseEmbeddingSimilarityEvaluator(S1, S2, GOLD),
        "sparse-triplet": lambda: e.SparseTripletEvaluator(S1, S2, S2[1:] + S2[:1], name="t"),
        "sparse-reranking": lambda: e.SparseRerankingEvaluator(SAMPLES, at_k=3),
    }


@pytest.fixture(scope="module")
def models(tmp_path_factory, minilm_2_layers):
    """{kind: (bertkit's model, sentence-transformers')} for the dense, cross-encoder and sparse evaluators."""
    root = tmp_path_factory.mktemp("csv")
    dense = st_directory(minilm_2_layers, root / "dense")
    torch.manual_seed(0)
    st.CrossEncoder(str(minilm_2_layers), num_labels=1, device="cpu").save(str(root / "ce"))
    sparse = masked_lm_checkpoint(minilm_2_layers, root / "mlm")
    return {"dense": (SentenceTransformer(dense), st.SentenceTransformer(str(dense), device="cpu")),
            "ce": (CrossEncoder(root / "ce"), st.CrossEncoder(str(root / "ce"), device="cpu")),
            "sparse": (SparseEncoder(sparse), st.SparseEncoder(str(sparse), device="cpu"))}


CASES = [("dense", name) for name in _dense(evaluation)] + [("ce", name) for name in _cross(ce_evaluation)] + [
    ("sparse", name) for name in _sparse(sparse_evaluation)]
MAKERS = {"dense": (_dense, evaluation, st_evaluation), "ce": (_cross, ce_evaluation, st_ce_evaluation),
          "sparse": (_sparse, sparse_evaluation, st_sparse_evaluation)}


def _rows(path: Path) -> tuple[list[str], list[list[float]], bytes]:
    data = path.read_bytes()
    header, *rows = list(csv.reader(data.decode("utf-8").splitlines()))
    terminator = b"\r\n" if data.endswith(b"\r\n") else b"\n"
    return header, [[float(v) for v in row] for row in rows], terminator


@pytest.mark.parametrize("kind, name", CASES)
def test_results_csv_as_sentence_transformers_writes_it(kind, name, models, tmp_path):
    cases, ours_module, st_module = MAKERS[kind]
    ours, ref = models[kind]
    got_evaluator, want_evaluator = cases(ours_module)[name](), cases(st_module)[name]()
    for epoch, steps in ((0, 10), (1, 25)):
        got_metrics = got_evaluator(ours, output_path=str(tmp_path / "got"), epoch=epoch, steps=steps)
        want_metrics = want_evaluator(ref, output_path=str(tmp_path / "want"), epoch=epoch, steps=steps)
    assert got_metrics.keys() == want_metrics.keys()
    assert os.listdir(tmp_path / "got") == os.listdir(tmp_path / "want") == [want_evaluator.csv_file]
    got, want = _rows(tmp_path / "got" / got_evaluator.csv_file), _rows(tmp_path / "want" / want_evaluator.csv_file)
    assert got[0] == want[0] and got[2] == want[2]  # the header row and the line ending
    assert [r[:2] for r in got[1]] == [r[:2] for r in want[1]] == [[0, 10], [1, 25]]
    np.testing.assert_allclose(got[1], want[1], atol=1e-6, rtol=0)


def test_no_output_path_or_write_csv_false_writes_nothing(models, tmp_path):
    ours, _ = models["dense"]
    evaluation.TripletEvaluator(S1, S2, S2[::-1], write_csv=False)(ours, output_path=str(tmp_path))
    evaluation.TripletEvaluator(S1, S2, S2[::-1])(ours)
    assert os.listdir(tmp_path) == []


def test_a_file_bertkit_did_not_write_is_refused(models, tmp_path):
    ours, _ = models["dense"]
    evaluator = evaluation.TripletEvaluator(S1, S2, S2[::-1], name="t")
    path = tmp_path / evaluator.csv_file
    path.write_bytes(b"my,own,notes\r\n1,2,3\r\n")
    with pytest.raises(BertkitError, match="not this evaluator's 'epoch,steps,accuracy_cosine'"):
        evaluator(ours, output_path=str(tmp_path))
    assert path.read_bytes() == b"my,own,notes\r\n1,2,3\r\n"
    path.unlink()
    (tmp_path / "elsewhere.csv").write_bytes(b"epoch,steps,accuracy_cosine\r\n")
    path.symlink_to(tmp_path / "elsewhere.csv")
    with pytest.raises(BertkitError, match="cannot be appended to"):
        evaluator(ours, output_path=str(tmp_path))
    assert (tmp_path / "elsewhere.csv").read_bytes() == b"epoch,steps,accuracy_cosine\r\n"


@pytest.mark.parametrize("best", slow_after([{}, {"metric_for_best_model": "t_cosine_accuracy", "load_best_model_at_end": True,
                                                 "save_strategy": "steps", "save_steps": 2}]))
def test_the_trainer_writes_the_evaluators_csv_as_sentence_transformers(minilm_2_layers, tmp_path, best):
    """Training with an evaluator, evaluating every 2 of 4 steps: output_dir/eval holds the same CSV, byte for byte
    (epoch and step of each evaluation, the accuracies), recorded as the run's file. With metric_for_best_model, the
    evaluation that checks the metric exists before training wrote a row of its own into output_dir/eval, before the
    run claimed the directory, which train() then refused as a file bertkit did not write there."""
    datasets = pytest.importorskip("datasets")
    from sentence_transformers.sentence_transformer import losses as st_losses

    from bertkit.manifests import owns
    from bertkit.sentence import SentenceTransformerTrainer, SentenceTransformerTrainingArguments, losses

    directory = st_directory(minilm_2_layers, tmp_path / "m", dropout=0.0, max_seq_length=32)
    pairs = [{"anchor": f"question {i}", "positive": f"paragraph {i // 2}"} for i in range(12)]
    anchors, positives = [r["anchor"] for r in pairs], [r["positive"] for r in pairs]
    common = {"report_to": "none", "use_cpu": True, "disable_tqdm": True, "eval_strategy": "steps", "eval_steps": 2,
              "max_steps": 4, "per_device_train_batch_size": 4, "seed": 0, **best}
    data = {"train_dataset": datasets.Dataset.from_list(pairs), "eval_dataset": datasets.Dataset.from_list(pairs[:4])}
    def counted(library):  # the user's evaluator object, counting the calls it sees
        class Counted(library.TripletEvaluator):
            calls = 0

            def __call__(self, *args, **kwargs):
                self.calls += 1
                return super().__call__(*args, **kwargs)

        return Counted(anchors, positives, positives[::-1], name="t")

    want_model, want_evaluator = st.SentenceTransformer(str(directory), device="cpu"), counted(st_evaluation)
    st.SentenceTransformerTrainer(
        model=want_model, loss=st_losses.MultipleNegativesRankingLoss(want_model),
        args=st.SentenceTransformerTrainingArguments(output_dir=str(tmp_path / "st"), **common),
        evaluator=want_evaluator, **data).train()
    got_model, got_evaluator = SentenceTransformer(directory), counted(evaluation)
    SentenceTransformerTrainer(
        model=got_model, loss=losses.MultipleNegativesRankingLoss(got_model),
        args=SentenceTransformerTrainingArguments(output_dir=str(tmp_path / "bk"), **common),
        evaluator=got_evaluator, **data).train()
    # the evaluator sees the evaluations alone: the check of metric_for_best_model runs a copy of it (an evaluator
    # that keeps state from its first call, as the retrieval one's primary metric, would have kept the check's)
    assert got_evaluator.calls == want_evaluator.calls == 2
    want = (tmp_path / "st" / "eval" / "triplet_evaluation_t_results.csv").read_bytes()
    assert want.startswith(b"epoch,steps,accuracy_cosine\r\n0.6666666666666666,2,")
    assert (tmp_path / "bk" / "eval" / "triplet_evaluation_t_results.csv").read_bytes() == want
    assert owns(tmp_path / "bk" / "eval" / "triplet_evaluation_t_results.csv")
