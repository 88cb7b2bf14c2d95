"""The same training script run with sentence-transformers and with bertkit.sentence (the import changed):
MiniLM (all-MiniLM-L6-v2's weights, dropout off), MultipleNegativesRankingLoss on SQuAD (question, paragraph)
pairs, batches of 8 drawn by the no-duplicates sampler, 8 steps. Same loss at every step, same retrieval
metrics on another article's questions, same embeddings after training. The evaluators' metrics are also
compared on fixed embeddings (ties included)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from sentence_helpers import st_directory

st = pytest.importorskip("sentence_transformers")
st_evaluation = pytest.importorskip("sentence_transformers.sentence_transformer.evaluation")
datasets = pytest.importorskip("datasets")

STEPS, BATCH = 8, 8


def _squad(data_dir):
    path = data_dir / "squad" / "dev-v1.1.json"
    if not path.is_file():
        pytest.skip(f"{path} absent")
    articles = json.loads(path.read_text())["data"]
    # two questions per paragraph: paragraphs repeat, so the no-duplicates sampler has work to do
    pairs = [{"question": q["question"], "paragraph": p["context"]}
             for p in articles[0]["paragraphs"][:32] for q in p["qas"][:2]]
    held_out = articles[1]["paragraphs"][:20]
    corpus = {f"p{i}": p["context"] for i, p in enumerate(held_out)}
    queries = {f"q{i}-{j}": q["question"] for i, p in enumerate(held_out) for j, q in enumerate(p["qas"][:2])}
    relevant = {qid: {f"p{qid[1:].split('-')[0]}"} for qid in queries}
    return pairs, (queries, corpus, relevant)


def _train(lib: str, model_dir, out_dir, pairs, ir_data):
    """The training script; ``lib`` picks the import, nothing else differs."""
    if lib == "sentence_transformers":
        import sentence_transformers as S
        from sentence_transformers.sentence_transformer import evaluation, losses
        from sentence_transformers.sentence_transformer.training_args import BatchSamplers
    else:
        import bertkit.sentence as S
        from bertkit.sentence import evaluation, losses
        from bertkit.sentence.training_args import BatchSamplers
    model = S.SentenceTransformer(str(model_dir), device="cpu")
    step_losses = []

    class Recorded(losses.MultipleNegativesRankingLoss):  # each step's loss, unrounded
        def forward(self, features, labels):
            value = super().forward(features, labels)
            step_losses.append(value.item())
            return value

    args = S.SentenceTransformerTrainingArguments(
        output_dir=str(out_dir), per_device_train_batch_size=BATCH, max_steps=STEPS, learning_rate=1e-4,
        logging_steps=1, save_strategy="no", report_to="none", seed=42, use_cpu=True, disable_tqdm=True,
        batch_sampler=BatchSamplers.NO_DUPLICATES)
    evaluator = evaluation.InformationRetrievalEvaluator(*ir_data, name="squad-dev", batch_size=16)
    trainer = S.SentenceTransformerTrainer(model=model, args=args, train_dataset=datasets.Dataset.from_list(pairs),
                                           loss=Recorded(model), evaluator=evaluator)
    trainer.train()
    embeddings = model.encode([p["question"] for p in pairs[:16]] + [pairs[0]["paragraph"]], convert_to_tensor=True)
    return step_losses, evaluator(model), embeddings


@pytest.mark.slow  # 20-40 s: make test-slow (make test stays near five minutes on two cores)
def test_training_script_gives_sentence_transformers_numbers(tmp_path, minilm_dir, data_dir):
    pairs, ir_data = _squad(data_dir)
    model_dir = st_directory(minilm_dir, tmp_path / "minilm", dropout=0.0, max_seq_length=64)
    want_losses, want_metrics, want_emb = _train("sentence_transformers", model_dir, tmp_path / "st", pairs, ir_data)
    got_losses, got_metrics, got_emb = _train("bertkit", model_dir, tmp_path / "bk", pairs, ir_data)
    assert len(want_losses) == len(got_losses) == STEPS
    # measured: largest relative difference 2.1e-6 (float32 rounding of two encoders' summation orders)
    np.testing.assert_allclose(got_losses, want_losses, rtol=1e-5, atol=0)
    assert want_losses[0] != pytest.approx(want_losses[-1], rel=1e-2)  # the steps did train
    assert got_metrics.keys() == want_metrics.keys() and "squad-dev_cosine_ndcg@10" in got_metrics
    np.testing.assert_allclose([got_metrics[k] for k in want_metrics], list(want_metrics.values()), atol=1e-6)
    torch.testing.assert_close(got_emb, want_emb, atol=1e-5, rtol=0)


def _steps(lib: str, model_dir, out_dir, loss_name: str, rows: list[dict]) -> list[float]:
    """Three steps of a labelled-data training script (default sampler); ``lib`` picks the import."""
    if lib == "sentence_transformers":
        import sentence_transformers as S
        from sentence_transformers.sentence_transformer import losses
    else:
        import bertkit.sentence as S
        from bertkit.sentence import losses
    model = S.SentenceTransformer(str(model_dir), device="cpu")
    step_losses = []

    class Recorded(getattr(losses, loss_name)):
        def forward(self, features, labels):
            value = super().forward(features, labels)
            step_losses.append(value.item())
            return value

    args = S.SentenceTransformerTrainingArguments(
        output_dir=str(out_dir), per_device_train_batch_size=4, max_steps=3, learning_rate=1e-4, logging_steps=1,
        save_strategy="no", report_to="none", seed=42, use_cpu=True, disable_tqdm=True)
    S.SentenceTransformerTrainer(model=model, args=args, train_dataset=datasets.Dataset.from_list(rows),
                                 loss=Recorded(model)).train()
    return step_losses


@pytest.mark.slow  # 5-10 s each
@pytest.mark.parametrize("loss", ["ContrastiveLoss", "OnlineContrastiveLoss", "AnglELoss", "MSELoss"])
def test_labelled_losses_train_as_sentence_transformers(loss, tmp_path, minilm_dir, data_dir):
    """0/1 pairs (the contrastive losses), scored pairs (AnglE) and a teacher's embeddings (MSELoss, the list label
    per row): the same loss at every step."""
    from bertkit.sentence import SentenceTransformer

    pairs, _ = _squad(data_dir)
    pairs = [(p["question"], p["paragraph"][:200]) for p in pairs[:12]]
    model_dir = st_directory(minilm_dir, tmp_path / "minilm", dropout=0.0, max_seq_length=64)
    if loss == "MSELoss":
        teacher = SentenceTransformer(minilm_dir).encode([q for q, _ in pairs]).tolist()
        rows = [{"text": c, "label": t} for (_, c), t in zip(pairs, teacher)]
    elif loss == "AnglELoss":
        rows = [{"a": q, "b": c, "label": (i % 5) / 4} for i, (q, c) in enumerate(pairs)]
    else:
        rows = [{"a": q, "b": c if i % 2 else pairs[(i + 3) % len(pairs)][1], "label": i % 2}
                for i, (q, c) in enumerate(pairs)]
    want = _steps("sentence_transformers", model_dir, tmp_path / "st", loss, rows)
    got = _steps("bertkit", model_dir, tmp_path / "bk", loss, rows)
    assert len(got) == len(want) == 3 and any(want)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)


class _Fixed:
    """A model whose encode returns fixed embeddings (by text), for comparing evaluators alone."""

    similarity_fn_name = "cosine"

    def __init__(self, table: dict[str, torch.Tensor]):
        self.table = table
        self.similarity = st.util.cos_sim
        self.model_card_data = self  # sentence-transformers' evaluators record their metrics here

    def set_evaluation_metrics(self, *_):
        pass

    def encode(self, texts, convert_to_tensor=False, convert_to_numpy=True, **_):
        out = torch.stack([self.table[t] for t in texts])
        return out if convert_to_tensor else out.numpy()

    encode_query = encode_document = encode


def test_evaluators_match_sentence_transformers():
    from bertkit.sentence import evaluation

    g = torch.Generator().manual_seed(0)
    corpus = {f"d{i:02d}": f"doc {i}" for i in range(40)}
    queries = {f"q{i}": f"query {i}" for i in range(25)}
    table = {t: torch.randn(8, generator=g) for t in [*corpus.values(), *queries.values()]}
    table["doc 7"] = table["doc 3"].clone()  # a tie, broken by corpus id in both
    relevant = {f"q{i}": {f"d{(3 * i + j) % 40:02d}" for j in range(1 + i % 3)} for i in range(24)}  # q24: none
    kwargs = {"mrr_at_k": [5, 10], "ndcg_at_k": [3, 10], "accuracy_at_k": [1, 5], "precision_recall_at_k": [2, 10],
              "map_at_k": [10, 100], "name": "ir"}
    want = st_evaluation.InformationRetrievalEvaluator(queries, corpus, relevant, **kwargs)(_Fixed(table))
    got = evaluation.InformationRetrievalEvaluator(queries, corpus, relevant, **kwargs)(_Fixed(table))
    assert got.keys() == want.keys()
    np.testing.assert_allclose([got[k] for k in want], list(want.values()), atol=1e-12)

    s1, s2 = list(queries.values())[:20], list(corpus.values())[:20]
    scores = [float(i % 5) for i in range(20)]  # tied gold scores: Spearman's average ranks
    for fns in (None, ["cosine", "dot", "euclidean", "manhattan"]):
        want = st_evaluation.EmbeddingSimilarityEvaluator(s1, s2, scores, similarity_fn_names=fns,
                                                                              name="sts")(_Fixed(table))
        got = evaluation.EmbeddingSimilarityEvaluator(s1, s2, scores, similarity_fn_names=fns, name="sts")(_Fixed(table))
        assert got.keys() == want.keys()
        np.testing.assert_allclose([got[k] for k in want], list(want.values()), atol=1e-6)
