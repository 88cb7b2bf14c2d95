"""No wrong numbers: a NaN never becomes a score, a diverging run stops (or skips, when asked) and says where."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace
from unittest import mock

import numpy as np
import pytest
import torch
from torch import nn

from bertkit.errors import BertkitError, NonFiniteError
from bertkit.inference.predict import predict
from bertkit.settings import TrainingSettings
from bertkit.tasks import glue, metrics
from bertkit.training.batch_plan import BatchPlan
from bertkit.training.loop import Phase, train
from bertkit.training.sequence_grid import summarize_grid


def test_pearson_never_turns_nan_into_a_score():
    gold = np.array([0.0, 1.0, 2.5, 4.0, 5.0])
    assert math.isnan(metrics.pearson(gold, np.array([1.0, np.nan, 2.0, 3.0, 4.0])))  # was clamped to 1.0
    assert math.isnan(metrics.pearson(gold, np.array([1.0, np.inf, 2.0, 3.0, 4.0])))
    assert math.isnan(metrics.spearman(gold, np.array([1.0, 2.0, np.nan, 3.0, 4.0])))  # ranks would hide it
    assert math.isnan(metrics.pearson(gold, np.full(5, 2.0)))  # constant: undefined, as scipy
    assert metrics.pearson(gold, gold * 2 + 1) == pytest.approx(1.0)
    assert metrics.pearson(gold, -gold) == pytest.approx(-1.0)
    stsb = glue.get_task("stsb").metric(np.array([np.nan] * 5), gold)
    assert all(math.isnan(v) for v in stsb.values())


@pytest.mark.parametrize("poison", [np.nan, np.inf])
@pytest.mark.parametrize("side", ["y_true", "y_pred"])
def test_class_metrics_of_a_nan_or_inf_are_nan_not_a_score(poison, side):
    """sklearn refuses a NaN class; counted as a wrong class it made accuracy 0.5, macro F1 0.39 and MCC 0.22 here
    (and f1_binary refused it as a third class)."""
    labels, poisoned = [0.0, 1.0, 1.0, 0.0], [0.0, poison, 1.0, 1.0]
    pair = (labels, poisoned) if side == "y_pred" else (poisoned, labels)
    for metric in (metrics.accuracy, metrics.f1_binary, metrics.f1_macro, metrics.matthews_corrcoef):
        assert math.isnan(metric(*pair)), metric.__name__
    assert metrics.accuracy(labels, [0.0, 0.0, 1.0, 1.0]) == 0.5  # finite floats still scored
    assert metrics.matthews_corrcoef(labels, [0.0, 0.0, 1.0, 1.0]) == 0.0
    scores = glue.get_task("mrpc").metric(np.array(pair[1]), np.array(pair[0]))
    assert scores and all(math.isnan(v) for v in scores.values())


def test_grid_selection_skips_non_finite_runs_and_says_so():
    task = glue.get_task("stsb")
    runs = [{"lr": 1e-4, "seed": 1, "dev": {"pearson": 0.80, "spearmanr": 0.79}},
            {"lr": 1e-4, "seed": 2, "dev": {"pearson": float("nan"), "spearmanr": float("nan")}, "failed": "dev pearson is nan"},
            {"lr": 3e-4, "seed": 1, "dev": None, "failed": "the loss is nan"}]
    report = summarize_grid(task, runs)
    assert report["best"]["lr"] == 1e-4 and report["best"]["pearson"]["values"] == [0.80]
    assert [(s["lr"], s["seed"]) for s in report["skipped"]] == [(1e-4, 2), (3e-4, 1)]
    with pytest.raises(NonFiniteError, match="every sts-b run failed"):
        summarize_grid(task, runs[1:])


class _Linear(nn.Module):
    """y = w . x with a squared loss; the batch whose first id is 99 gives a NaN (a poisoned example)."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(3))

    def forward(self, input_ids, labels):
        pred = (input_ids.float() * self.w).sum(-1)
        loss = ((pred - labels) ** 2).mean()
        if (input_ids[:, 0] == 99).any():
            loss = loss * float("nan")
        return SimpleNamespace(loss=loss)


def _plan(poison_at: int | None) -> BatchPlan:
    feats = [{"input_ids": [1, 2, 3], "labels": 1.0} for _ in range(8)]
    if poison_at is not None:
        feats[poison_at] = {"input_ids": [99, 2, 3], "labels": 1.0}

    def collate(b):
        return {"input_ids": torch.tensor([f["input_ids"] for f in b]),
                "labels": torch.tensor([f["labels"] for f in b])}

    return BatchPlan(feats, 1, collate, shuffle=False, seed=0)


def test_a_nan_loss_stops_training_naming_step_batch_and_checkpoint(tmp_path):
    args = TrainingSettings(output_dir=tmp_path, learning_rate=0.01, warmup_ratio=0, save_steps=2, progress=False)
    with pytest.raises(NonFiniteError) as info:
        train(_Linear(), [Phase(_plan(poison_at=5), 8)], args)
    message = str(info.value)
    assert "step 6 (train, epoch 0, batch 5)" in message and "the loss is nan" in message
    assert "step-00000004" in message  # the last good checkpoint
    # the Python Trainers' user reads the argument names, the command line's the flags (it named the flags alone)
    assert message.endswith("Lower the learning rate (learning_rate, --learning-rate) or raise the warmup "
                            "(warmup_ratio, --warmup-ratio) and start again, resume from that checkpoint "
                            "(resume_from_checkpoint, --resume), or skip up to N such steps (skip_nonfinite=N, "
                            "--skip-nonfinite N); no final model was saved")
    assert not any("step-00000006" in str(p) for p in (tmp_path / "checkpoints").iterdir())


def test_skip_nonfinite_drops_the_batch_and_counts_it(tmp_path):
    args = TrainingSettings(output_dir=tmp_path, learning_rate=0.01, warmup_ratio=0, logging_steps=1,
                            skip_nonfinite=1, progress=False)
    model = _Linear()
    result = train(model, [Phase(_plan(poison_at=5), 6)], args)
    assert result.skipped_nonfinite == 1 and result.step == 6
    assert torch.isfinite(model.w).all()
    records = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert records[-1]["skipped_nonfinite"] == 1 and all(math.isfinite(r["loss"]) for r in records)
    # Same weights as training on the 6 clean batches (the poisoned one contributes nothing).
    clean = _Linear()
    train(clean, [Phase(_plan(poison_at=None), 6)], TrainingSettings(
        output_dir=tmp_path / "clean", learning_rate=0.01, warmup_ratio=0, progress=False))
    torch.testing.assert_close(model.w, clean.w)


def test_predict_refuses_non_finite_outputs_naming_the_first_bad_row():
    class Out(nn.Module):
        def forward(self, input_ids, **_):
            logits = input_ids.float()
            logits[input_ids[:, 0] == 7] = float("nan")
            return SimpleNamespace(logits=logits)

    feats = [{"input_ids": [i, 1]} for i in (3, 5, 7, 9)]
    with pytest.raises(NonFiniteError, match="example 2 "):
        predict(Out(), feats, 0, batch_size=2)


@pytest.mark.parametrize("field,value,message", [
    ("learning_rate", float("nan"), "learning_rate must be a finite positive number, got nan"),
    ("learning_rate", float("inf"), "learning_rate must be a finite positive number, got inf"),
    ("learning_rate", 0.0, "learning_rate must be a finite positive number, got 0.0"),
    ("warmup_ratio", float("nan"), r"warmup_ratio must be in \[0, 1\), got nan"),
    ("warmup_ratio", 1.0, r"warmup_ratio must be in \[0, 1\), got 1.0"),
    ("warmup_steps", -1, "warmup_steps must be a finite non-negative number, got -1"),
    ("weight_decay", -0.01, "weight_decay must be a finite non-negative number, got -0.01"),
    ("weight_decay", float("inf"), "weight_decay must be a finite non-negative number, got inf"),
    ("adam_beta1", 1.0, r"adam_beta1 must be in \[0, 1\), got 1.0"),
    ("adam_beta2", float("nan"), r"adam_beta2 must be in \[0, 1\), got nan"),
    ("adam_epsilon", 0.0, "adam_epsilon must be a finite positive number, got 0.0"),
    ("max_grad_norm", float("nan"), r"max_grad_norm must be a finite non-negative number \(0: .*\), got nan"),
    ("max_grad_norm", -1.0, r"max_grad_norm must be a finite non-negative number \(0: .*\), got -1.0"),
    # transformers' idiom for "measure the norm, never clip"; here it is 0
    ("max_grad_norm", float("inf"), r"\(0: no clipping, the norm still logged as grad_norm; transformers' inf\), got inf"),
    ("skip_nonfinite", -1, "skip_nonfinite must be a finite non-negative number, got -1"),
    ("num_train_epochs", float("inf"), "num_train_epochs must be a finite positive number, got inf"),
])
def test_hyper_parameters_are_checked_before_any_work(tmp_path, field, value, message):
    """Each bad value is refused when the settings are built, before a model, data or directory is touched."""
    with pytest.raises(ValueError, match=message):
        TrainingSettings(output_dir=tmp_path / "never", **{field: value})
    assert not (tmp_path / "never").exists()


class _Embeddings:
    """A model whose encode gives fixed embeddings (by text)."""

    similarity_fn_name = "cosine"

    def __init__(self, table: dict[str, torch.Tensor]):
        self.table = table

    def encode(self, texts, convert_to_tensor=False, **_):
        out = torch.stack([self.table[t] for t in texts])
        return out if convert_to_tensor else out.numpy()

    encode_query = encode_document = encode

    def similarity(self, a, b):  # the model's own similarity, which the mining evaluator scores with
        from bertkit.sentence import util

        return util.cos_sim(a, b)


class _Scores:
    """A one-label cross-encoder whose predict gives a fixed score (by document)."""

    num_labels = 1

    def __init__(self, table: dict[str, float]):
        self.table = table

    def predict(self, pairs, **_):
        return np.array([self.table[d] for _, d in pairs], dtype=np.float32)


def test_evaluators_refuse_non_finite_embeddings_and_scores_naming_the_input():
    """A NaN embedding or score was ranked or thresholded into a metric like any other: the retrieval evaluator
    reported accuracy@1 0.5 (the NaN document dropped from the ranking), the reranking evaluator MAP 0.333, the
    cross-encoder classification evaluator accuracy 1.0 at a NaN threshold."""
    from bertkit.sentence import evaluation
    from bertkit.sentence.cross_encoder import evaluation as ce_evaluation

    nan = float("nan")
    table = {"q1": torch.tensor([1.0, 0, 0]), "q2": torch.tensor([0.0, 1, 0]), "d1": torch.tensor([1.0, 0.1, 0]),
             "d2": torch.tensor([0.1, 1, 0]), "d3": torch.tensor([nan, 0, 1])}
    retrieval = evaluation.InformationRetrievalEvaluator({"q1": "q1", "q2": "q2"}, {"a": "d1", "b": "d2", "c": "d3"},
                                                         {"q1": {"c"}, "q2": {"b"}})
    with pytest.raises(NonFiniteError, match=r"^InformationRetrievalEvaluator: the model's document embedding of "
                                             r"input 2 \('d3'\) is not finite \(NaN or inf\), so no metric"):
        retrieval(_Embeddings(table))
    reranking = evaluation.RerankingEvaluator([{"query": "q1", "positive": ["d3"], "negative": ["d1", "d2"]}])
    with pytest.raises(NonFiniteError, match=r"^RerankingEvaluator: the model's document embedding of input 0 "):
        reranking(_Embeddings(table))
    similarity = evaluation.EmbeddingSimilarityEvaluator(["q1", "q2", "d1"], ["d2", "d3", "q1"], [0.2, 0.9, 0.5])
    with pytest.raises(NonFiniteError, match=r"^EmbeddingSimilarityEvaluator: the model's embedding of input 1 "):
        similarity(_Embeddings(table))
    mining = evaluation.ParaphraseMiningEvaluator({"1": "q1", "2": "d1", "3": "d3"}, [("1", "2")])
    with pytest.raises(NonFiniteError, match=r"^ParaphraseMiningEvaluator: the model's embedding of input 2 "):
        mining(_Embeddings(table))
    scores = _Scores({"x": 0.9, "y": nan, "z": 0.5})
    pairs = [("q", "x"), ("q", "y"), ("q", "z")]
    for evaluator in (ce_evaluation.CrossEncoderClassificationEvaluator(pairs, [1, 0, 1]),
                      ce_evaluation.CrossEncoderCorrelationEvaluator(pairs, [0.9, 0.1, 0.5]),
                      ce_evaluation.CrossEncoderRerankingEvaluator([{"query": "q", "positive": ["x"],
                                                                     "negative": ["y", "z"]}])):
        with pytest.raises(NonFiniteError, match=rf"^{type(evaluator).__name__}: the model's score of input 1 "):
            evaluator(scores)
    # sparse embeddings (the sparse evaluators'): the row of the first value that is not finite
    from bertkit.sentence.finite import refuse_nonfinite

    sparse = torch.sparse_coo_tensor([[0, 2, 2], [5, 1, 7]], [0.5, 1.0, float("inf")], (3, 9))
    with pytest.raises(NonFiniteError, match=r"^E: the model's embedding of input 2 \('c'\)"):
        refuse_nonfinite(sparse, ["a", "b", "c"], "E", "embedding")
    refuse_nonfinite(torch.tensor([[0.5, -1.0]]), ["a"], "E", "embedding")  # finite: nothing to say
    assert retrieval(_Embeddings({**table, "d3": torch.tensor([0.0, 0, 1])}))["cosine_accuracy@1"] == 0.5


def test_evaluators_refuse_a_similarity_that_overflows_from_finite_embeddings():
    """Finite embeddings of 1e20 pass the embedding check, but their dot product is inf: every pair at it tied, and the
    evaluators ranked the big document first (accuracy@1 0.0), thresholded at inf, counted inf > inf as a miss, or
    gave pearson NaN beside the others' numbers (pearson_max took whichever came first)."""
    from bertkit.sentence import evaluation, util

    table = {"q": torch.tensor([1.0, 0, 0]), "a": torch.tensor([1.0, 0.1, 0]), "b": torch.tensor([0.0, 1, 0]),
             "big": torch.full((3,), 1e20), "big2": torch.full((3,), 2e20)}
    model = _Embeddings(table)
    model.similarity_fn_name = "dot"
    found = r" is inf, and a NaN or an infinity has no rank: .* finite ones so large that their similarity overflows"
    retrieval = evaluation.InformationRetrievalEvaluator({"q1": "big", "q2": "q"}, {"d1": "a", "d2": "big2"},
                                                         {"q1": {"d1"}, "q2": {"d1"}})
    with pytest.raises(NonFiniteError, match=r"^InformationRetrievalEvaluator \(dot\): the similarity of query 0 and "
                                             r"corpus entry 1" + found):
        retrieval(model)
    reranking = evaluation.RerankingEvaluator([{"query": "q", "positive": ["a"], "negative": ["b"]},
                                               {"query": "big", "positive": ["a"], "negative": ["big2"]}],
                                              similarity_fct=util.dot_score)
    with pytest.raises(NonFiniteError, match=r"^RerankingEvaluator: the similarity of sample 1's candidate 1" + found):
        reranking(model)
    pairs = (["q", "big", "a"], ["a", "big2", "b"])
    binary = evaluation.BinaryClassificationEvaluator(*pairs, [1, 0, 0])
    with pytest.raises(NonFiniteError, match=r"^BinaryClassificationEvaluator \(dot\): the similarity of pair 1" + found):
        binary(model)
    similarity = evaluation.EmbeddingSimilarityEvaluator(*pairs, [0.9, 0.1, 0.2], similarity_fn_names=["euclidean"])
    with pytest.raises(NonFiniteError, match=r"^EmbeddingSimilarityEvaluator \(euclidean\): the similarity of pair 1"):
        similarity(model)  # 1e20 apart in 3 dimensions: the squared distance passes float32's range
    triplet = evaluation.TripletEvaluator(["q", "big"], ["a", "a"], ["b", "big2"])
    with pytest.raises(NonFiniteError, match=r"^TripletEvaluator \(dot\): the similarity of anchor and negative of "
                                             r"triplet 1" + found):
        triplet(model)
    del table["big"], table["big2"]  # finite similarities: scored as before
    assert evaluation.TripletEvaluator(["q"], ["a"], ["b"])(model) == {"dot_accuracy": 1.0}
    assert evaluation.BinaryClassificationEvaluator(["q", "q"], ["a", "b"], [1, 0])(model)["dot_ap"] == 1.0


def test_a_row_whose_norm_overflows_is_normalised_not_zeroed(tmp_path, tiny_checkpoint):
    """F.normalize divides a row of 1e20s (float32) or 5000s (float16, 384 wide) by its norm, inf: all zeros, so its
    cosine with a text it equals was 0.0 and semantic_search ranked it so (sentence-transformers does the same). It is
    the unit vector it is now, in util (sparse rows too), encode(normalize_embeddings=True) and the sentence-embedding
    pipeline."""
    import torch.nn.functional as F

    import bertkit
    from bertkit.sentence import SentenceTransformer, util
    from bertkit.sentence.finite import unit_length

    big = torch.tensor([[1e20, 1e20, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]])
    corpus = torch.tensor([[1.0, 1.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0]])
    torch.testing.assert_close(util.cos_sim(big, corpus), torch.tensor([[1.0, 0.0], [0.5**0.5, 0.0]]))
    assert util.semantic_search(big, corpus, top_k=1)[0] == [{"corpus_id": 0, "score": pytest.approx(1.0)}]
    torch.testing.assert_close(util.cos_sim(big.to_sparse(), corpus.to_sparse()).to_dense(),
                               torch.tensor([[1.0, 0.0], [0.5**0.5, 0.0]]))  # sparse rows too
    half = torch.full((1, 384), 5000.0, dtype=torch.float16)
    assert float(unit_length(half)[0, 0]) == pytest.approx(384**-0.5, rel=1e-3)
    ordinary = torch.randn(64, 48, generator=torch.Generator().manual_seed(0)) * 3
    assert torch.equal(unit_length(ordinary), F.normalize(ordinary, p=2, dim=-1))  # the same numbers, bit for bit
    mixed = torch.cat([big, ordinary[:2, :4], torch.tensor([[math.nan, 1.0, 0.0, 0.0]])])
    asked = unit_length(mixed)
    with mock.patch.object(torch.compiler, "is_compiling", return_value=True):  # the GPU's and compile's way: no sync
        assert torch.equal(unit_length(mixed)[:4], asked[:4]) and torch.isnan(unit_length(mixed)[4]).all()
    assert torch.isnan(util.cos_sim(torch.tensor([[math.inf, 1.0, 0.0, 0.0]]), corpus)).all()  # still refused after
    directory = tiny_checkpoint(tmp_path / "m", "BertModel", tokenizer=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]",
                                                                         "a", "b"])
    model = SentenceTransformer(str(directory))
    with torch.no_grad():
        model.bert.encoder.layer[-1].output.LayerNorm.weight.zero_()
        model.bert.encoder.layer[-1].output.LayerNorm.bias.fill_(1e20)  # every state 1e20: finite, its norm inf
    unit = model.encode(["a b"], normalize_embeddings=True)
    assert unit[0] == pytest.approx(np.full(32, 32**-0.5), rel=1e-6)
    pipe = bertkit.pipeline("sentence-embedding", model=model.bert, tokenizer=bertkit.BertTokenizer.from_pretrained(
        directory))
    assert pipe(["a b"])[0] == pytest.approx(np.full(32, 32**-0.5).tolist(), rel=1e-6)


def test_searches_refuse_a_nan_similarity_instead_of_ranking_it():
    """torch.topk takes a NaN for the largest value: an embedding holding a NaN (or inf, whose cosine is NaN) came out
    semantic_search's best hit, above the true one's 1.0, and paraphrase_mining's best pair, as in
    sentence-transformers; community_detection returned no community at all, [] (sentence-transformers too)."""
    from bertkit.sentence import util

    good = torch.tensor([[1.0, 0, 0, 0], [0, 1, 0, 0], [1, 1, 0, 0]])
    assert [h["corpus_id"] for h in util.semantic_search(good[:1], good, top_k=3)[0]] == [0, 2, 1]
    for poison in (float("nan"), float("inf")):
        bad = good.clone()
        bad[1, 0] = poison
        with pytest.raises(NonFiniteError, match=r"^semantic_search: the similarity of query 0 and corpus entry 1 is "
                                                 r"NaN, and a NaN or an infinity has no rank"):
            util.semantic_search(good[:1], bad, top_k=3)
        with pytest.raises(NonFiniteError, match=r"^semantic_search: the similarity of query 3 and corpus entry 0 "):
            util.semantic_search(torch.cat([good, bad[1:2]]), good, query_chunk_size=2, corpus_chunk_size=2)
        with pytest.raises(NonFiniteError, match=r"^paraphrase_mining: the similarity of embedding 0 and embedding 1 "):
            util.paraphrase_mining_embeddings(bad, top_k=2)
        with pytest.raises(NonFiniteError, match=r"^community_detection: the similarity of embedding 0 and "
                                                 r"embedding 1 "):
            util.community_detection(bad, threshold=0.5, min_community_size=1)
    assert util.community_detection(good, threshold=0.5, min_community_size=2) == [[2, 0, 1]]


def test_rank_and_mining_refuse_non_finite_model_outputs(tmp_path, tiny_checkpoint):
    """A cross-encoder with NaN weights: rank() sorted its NaN scores with Python's sorted, which leaves a NaN where
    it falls (first here, as sentence-transformers ranks it); mine_hard_negatives took a NaN embedding's text as
    every anchor's hardest negative."""
    from bertkit.sentence import CrossEncoder, util

    d = tiny_checkpoint(tmp_path / "ce", "BertForSequenceClassification", labels=1,
                        tokenizer=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "b", "c"])
    ce = CrossEncoder(d)
    assert [r["corpus_id"] for r in ce.rank("a", ["b", "c", "a b"])] != []
    with torch.no_grad():
        ce.model.bert.embeddings.word_embeddings.weight[6] = float("nan")  # token "b"
    with pytest.raises(NonFiniteError, match=r"^rank\(\): the model's score of input 1 \('b'\) is not finite \(NaN "
                                             r"or inf\), so nothing was ranked"):
        ce.rank("a", ["c", "b", "a"])

    table = {"q1": torch.tensor([1.0, 0, 0]), "q2": torch.tensor([0.0, 1, 0]), "p1": torch.tensor([1.0, 0.1, 0]),
             "p2": torch.tensor([0.1, 1, 0]), "n1": torch.tensor([0.5, 0.5, 0.1]), "n2": torch.tensor([0.0, 0, 1])}

    class _Model(_Embeddings):
        similarity, similarity_pairwise = staticmethod(util.cos_sim), staticmethod(util.pairwise_cos_sim)

    pairs = [{"anchor": "q1", "positive": "p1"}, {"anchor": "q2", "positive": "p2"}]
    corpus = ["n1", "n2"]
    rows = util.mine_hard_negatives(pairs, _Model(table), corpus=corpus, num_negatives=1, verbose=False)
    assert [r["negative"] for r in rows] == ["n1", "n1"]
    table["n2"] = torch.tensor([float("nan"), 0, 1])
    with pytest.raises(NonFiniteError, match=r"^mine_hard_negatives: the model's document embedding of input \d+ "
                                             r"\('n2'\) is not finite \(NaN or inf\), so no negatives were mined"):
        util.mine_hard_negatives(pairs, _Model(table), corpus=corpus, num_negatives=1, verbose=False)


def test_evaluators_refuse_input_without_a_defined_metric():
    """ParaphraseMiningEvaluator with no duplicate pair among its sentences (ids given as int where sentences_map's
    are str) reported average precision 0 as sentence-transformers does; an empty CrossEncoderRerankingEvaluator
    failed with a TypeError from numpy."""
    from bertkit.sentence import evaluation
    from bertkit.sentence.cross_encoder import evaluation as ce_evaluation

    with pytest.raises(BertkitError, match=r"^ParaphraseMiningEvaluator: no duplicate pair names two ids of "
                                           r"sentences_map \(ids such as \['1', '2', '3'\]\), so average precision is "
                                           r"undefined; the pairs given, such as \[\(1, 2\)\], name others"):
        evaluation.ParaphraseMiningEvaluator({"1": "q1", "2": "d1", "3": "d2"}, [(1, 2)])
    with pytest.raises(BertkitError, match=r"so average precision is undefined; give duplicates_list or "):
        evaluation.ParaphraseMiningEvaluator({"1": "q1", "2": "d1"}, duplicates_dict={"1": {"2": False}})
    table = {"q1": torch.tensor([1.0, 0, 0]), "d1": torch.tensor([1.0, 0.1, 0]), "d2": torch.tensor([0.0, 1, 0])}
    mining = evaluation.ParaphraseMiningEvaluator({"1": "q1", "2": "d1", "3": "d2"}, [("1", "2")])
    assert mining(_Embeddings(table))["average_precision"] == 1.0
    with pytest.raises(BertkitError, match=r"^CrossEncoderRerankingEvaluator: samples is empty"):
        ce_evaluation.CrossEncoderRerankingEvaluator([])


def test_saving_non_finite_weights_is_refused_and_keeps_what_was_there(tmp_path, tiny_model):
    """A diverged model's save_pretrained wrote its NaN weights over the directory's good ones (as transformers and
    sentence-transformers save them), leaving a directory from_pretrained refuses."""
    import bertkit

    model = tiny_model("BertForSequenceClassification", labels=2)
    model.save_pretrained(tmp_path / "m")
    before = (tmp_path / "m" / "model.safetensors").read_bytes()
    with torch.no_grad():
        model.bert.encoder.layer[1].output.dense.weight[0, :3] = torch.tensor([math.nan, math.inf, -math.inf])
    with pytest.raises(NonFiniteError, match=r"^BertForSequenceClassification holds NaN or infinite weights, "
                                             r"\['bert.encoder.layer.1.output.dense.weight \(3 of 2048\)'\], which "
                                             r"loading refuses; nothing was written"):
        model.save_pretrained(tmp_path / "m")
    assert (tmp_path / "m" / "model.safetensors").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]
    bertkit.BertForSequenceClassification.from_pretrained(tmp_path / "m")


def test_a_nan_metric_is_logged_as_null_and_read_back_as_nan_by_a_resumed_run(tmp_path):
    """metrics.jsonl wrote a NaN (an evaluation's Pearson on constant predictions) and an infinity as the bare tokens
    NaN / Infinity, which jq, JavaScript and bertkit's own JSON readers refuse: now null, as bertkit's JSON reports,
    and the resumed run (its history, its last evaluation, the plot) reads null as NaN, never 0 or None."""
    from bertkit.errors import standard_json

    values = iter([math.nan, math.inf, 0.5, math.nan])

    def evaluate(model):
        return {"pearson": next(values)}

    def settings():
        return TrainingSettings(output_dir=tmp_path, learning_rate=0.01, warmup_ratio=0, logging_steps=1,
                                eval_strategy="steps", eval_steps=1, save_steps=2, progress=False)

    train(_Linear(), [Phase(_plan(poison_at=None), 2)], settings(), evaluate=evaluate)
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [standard_json(x).get("pearson", 0) for x in lines if '"eval"' in x] == [None, None]
    result = train(_Linear(), [Phase(_plan(poison_at=None), 4)], settings(), evaluate=evaluate, resume=True)
    pearson = [r["pearson"] for r in result.history if r["split"] == "eval"]
    assert [math.isnan(p) for p in pearson] == [True, True, False, True] and pearson[2] == 0.5
    assert math.isnan(result.last_eval["pearson"])
    assert [standard_json(x)["step"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [
        r["step"] for r in result.history]  # every line standard JSON, the resumed run's records each once
    pytest.importorskip("matplotlib")
    from bertkit.training.plot import plot_metrics

    assert plot_metrics(tmp_path / "metrics.jsonl", tmp_path / "metrics.png").stat().st_size > 0
