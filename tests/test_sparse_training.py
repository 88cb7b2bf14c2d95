"""The same sparse training script run with sentence-transformers 6 and with bertkit.sentence (the import changed):
the masked-LM checkpoint of sparse_helpers (dropout off) as a new SPLADE model, SQuAD dev questions against their
paragraphs, each of SpladeLoss's wrapped losses for a few steps. Same terms (base loss, document and query
regularisers) at every step, same regulariser weights during the warm-up sentence-transformers' trainer adds by
itself, same vectors after training. Bad input refused by name before any work."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest
import torch

from bertkit.errors import BertkitError
from sparse_helpers import masked_lm_checkpoint

st = pytest.importorskip("sentence_transformers")
datasets = pytest.importorskip("datasets")

STEPS, BATCH, MAX_LENGTH = 6, 8, 64
WEIGHTS = {"document_regularizer_weight": 3e-3, "query_regularizer_weight": 5e-3}  # large: the terms must count


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, minilm_dir):
    return masked_lm_checkpoint(minilm_dir, tmp_path_factory.mktemp("sparse-train") / "mlm", dropout=0.0)


def _words(text: str) -> set[str]:
    return set(re.findall(r"\w+", text.lower()))


def _overlap(question: str, paragraph: str) -> float:
    """A lexical teacher: the share of the question's words the paragraph holds."""
    q = _words(question)
    return len(q & _words(paragraph)) / max(len(q), 1)


@pytest.fixture(scope="module")
def squad(data_dir):
    path = data_dir / "squad" / "dev-v1.1.json"
    if not path.is_file():
        pytest.skip(f"{path} absent")
    paragraphs = [p for a in json.loads(path.read_text())["data"][:2] for p in a["paragraphs"][:16]]
    # (question, its paragraph, the next paragraph, the one after): two questions per paragraph, so the
    # no-duplicates sampler has work to do
    return [(q["question"], p["context"], paragraphs[(i + 1) % len(paragraphs)]["context"],
             paragraphs[(i + 2) % len(paragraphs)]["context"])
            for i, p in enumerate(paragraphs) for q in p["qas"][:2]]


def _rows(kind: str, squad) -> list[dict]:
    if kind == "mnrl":
        return [{"query": q, "positive": p, "negative": n} for q, p, n, _ in squad]
    if kind == "margin_mse":
        return [{"query": q, "positive": p, "negative": n, "label": _overlap(q, p) - _overlap(q, n)}
                for q, p, n, _ in squad]
    if kind == "kl_div":
        return [{"query": q, "positive": p, "negative_1": n1, "negative_2": n2,
                 "label": [10 * _overlap(q, p), 10 * _overlap(q, n1), 10 * _overlap(q, n2)]} for q, p, n1, n2 in squad]
    assert kind == "cosent"  # pairs scored by the lexical teacher: a question against its paragraph or another
    return [{"sentence1": q, "sentence2": p if i % 2 else n, "score": _overlap(q, p if i % 2 else n)}
            for i, (q, p, n, _) in enumerate(squad)]


def _train(lib: str, model_dir, out_dir, rows, kind: str):
    """The training script; ``lib`` picks the import, nothing else differs. Returns each step's terms and the
    regulariser weights the loss held, and the vectors of a few texts after training."""
    if lib == "sentence_transformers":
        import sentence_transformers as S
        from sentence_transformers.sentence_transformer.training_args import BatchSamplers
        from sentence_transformers.sparse_encoder import losses
    else:
        import bertkit.sentence as S
        from bertkit.sentence.sparse_encoder import losses
        from bertkit.sentence.training_args import BatchSamplers
    model = S.SparseEncoder(str(model_dir), device="cpu")
    model.max_seq_length = MAX_LENGTH
    steps = []

    class Recorded(losses.SpladeLoss):  # each step's terms, unrounded, and the weights they were computed with
        def forward(self, features, labels=None):
            terms = super().forward(features, labels)
            steps.append({**{k: v.item() for k, v in terms.items()},
                          "document_regularizer_weight": self.document_regularizer_weight,
                          "query_regularizer_weight": self.query_regularizer_weight})
            return terms

    base = {"mnrl": lambda: losses.SparseMultipleNegativesRankingLoss(model),
            "margin_mse": lambda: losses.SparseMarginMSELoss(model),
            "kl_div": lambda: losses.SparseDistillKLDivLoss(model),
            "cosent": lambda: losses.SparseCoSENTLoss(model)}[kind]()
    loss = Recorded(model, loss=base, **WEIGHTS)
    args = S.SparseEncoderTrainingArguments(
        output_dir=str(out_dir), per_device_train_batch_size=BATCH, max_steps=STEPS, learning_rate=2e-5,
        logging_steps=1, save_strategy="no", report_to="none", seed=42, use_cpu=True, disable_tqdm=True,
        batch_sampler=BatchSamplers.NO_DUPLICATES if kind == "mnrl" else BatchSamplers.BATCH_SAMPLER)
    trainer = S.SparseEncoderTrainer(model=model, args=args, train_dataset=datasets.Dataset.from_list(rows), loss=loss)
    trainer.train()
    texts = [r[c] for r in rows[:4] for c in list(r)[:2]]
    return steps, model.encode_document(texts, convert_to_sparse_tensor=False)


@pytest.mark.slow  # about a minute a loss on two shared cores: make test-slow
@pytest.mark.parametrize("kind", ["mnrl", "margin_mse", "kl_div", "cosent"])
def test_training_script_gives_sentence_transformers_numbers(kind, checkpoint, squad, tmp_path):
    rows = _rows(kind, squad)
    want, want_vectors = _train("sentence_transformers", checkpoint, tmp_path / "st", rows, kind)
    got, got_vectors = _train("bertkit", checkpoint, tmp_path / "bk", rows, kind)
    assert len(want) == len(got) == STEPS
    terms = ["base_loss", "document_regularizer_loss", "query_regularizer_loss"]
    assert [sorted(s) for s in got] == [sorted(s) for s in want] and set(terms) <= set(want[0])
    # the warm-up: weight x (step / 2) ** 2 for steps 0 and 1 of 6 (warmup_ratio 1/3), then the weight; exact
    for name, value in WEIGHTS.items():
        assert [s[name] for s in got] == [s[name] for s in want] == [0.0, value / 4] + [value] * (STEPS - 2)
    # relative 1e-5, and 1e-6 absolute: a near-zero cross-entropy (0.027 at a step of the MNRL run) is the
    # difference of two much larger numbers (the positive's dot product and the log-sum-exp), whose float32
    # rounding then shows as a larger relative difference (measured there: 4.8e-7 absolute, 1.8e-5 relative, with
    # the sparse backward of max pooling; 3e-6 relative at the other steps)
    for term in terms:
        np.testing.assert_allclose([s[term] for s in got], [s[term] for s in want], rtol=1e-5, atol=1e-6, err_msg=term)
    assert want[-1]["base_loss"] != pytest.approx(want[0]["base_loss"], rel=1e-3)  # the steps did train
    assert want[-1]["document_regularizer_loss"] > 0
    assert torch.equal(got_vectors != 0, want_vectors != 0)
    torch.testing.assert_close(got_vectors, want_vectors, atol=1e-4, rtol=1e-4)


# -- the warm-up schedule alone ------------------------------------------------------------------------------------
class _State:
    def __init__(self, max_steps: int):
        self.max_steps, self.global_step = max_steps, 0


@pytest.mark.parametrize(("max_steps", "scheduler_type", "warmup_ratio"),
                         [(30, "quadratic", 1 / 3), (7, "linear", 0.5), (2, "quadratic", 0.2), (100, "linear", 1.0)])
def test_warmup_weights_are_sentence_transformers(checkpoint, sparse_model, max_steps, scheduler_type, warmup_ratio):
    """Both callbacks driven through a run's steps: the weights they set on their loss, step by step, are equal."""
    from sentence_transformers.sparse_encoder.callbacks import (
        SpladeRegularizerWeightSchedulerCallback as STCallback,
    )

    from bertkit.sentence.sparse_encoder import losses
    from bertkit.sentence.sparse_encoder.callbacks import SpladeRegularizerWeightSchedulerCallback

    ours = losses.SpladeLoss(sparse_model, losses.SparseMultipleNegativesRankingLoss(sparse_model),
                             document_regularizer_weight=3e-5, query_regularizer_weight=5e-5)
    model = st.SparseEncoder(str(checkpoint), device="cpu")
    theirs = st.sparse_encoder.losses.SpladeLoss(model, st.sparse_encoder.losses.SparseMultipleNegativesRankingLoss(
        model), document_regularizer_weight=3e-5, query_regularizer_weight=5e-5)
    weights = {}
    for name, loss, cls in (("ours", ours, SpladeRegularizerWeightSchedulerCallback), ("theirs", theirs, STCallback)):
        callback, state, seen = cls(loss, scheduler_type=scheduler_type, warmup_ratio=warmup_ratio), _State(max_steps), []
        callback.on_train_begin(None, state, None)
        seen.append((loss.document_regularizer_weight, loss.query_regularizer_weight))
        for step in range(max_steps):
            state.global_step = step
            callback.on_step_begin(None, state, None)
            seen.append((loss.document_regularizer_weight, loss.query_regularizer_weight))
        weights[name] = seen
    assert weights["ours"] == weights["theirs"]
    warmup = max(1, int(max_steps * warmup_ratio))  # W: step s < W has the weight w * (s / W) ** 2 (or s / W)
    power = 1 if scheduler_type == "linear" else 2
    expected = [(0.0, 0.0)] + [tuple(w * (s / warmup) ** power if s < warmup else w for w in (3e-5, 5e-5))
                               for s in range(max_steps)]
    assert weights["ours"] == expected


# -- bad input -----------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def sparse_model(checkpoint):
    from bertkit.sentence import SparseEncoder

    return SparseEncoder(checkpoint)


@pytest.mark.parametrize("weights", [{"document_regularizer_weight": -1e-5},
                                     {"document_regularizer_weight": math.nan},
                                     {"document_regularizer_weight": 3e-5, "query_regularizer_weight": -5e-5},
                                     {"document_regularizer_weight": 3e-5, "query_regularizer_weight": math.nan},
                                     {"document_regularizer_weight": math.inf},
                                     {"document_regularizer_weight": None}])
def test_bad_regulariser_weight_is_refused_by_name(sparse_model, weights):
    from bertkit.sentence.sparse_encoder import losses

    name = next(k for k, v in weights.items() if not (isinstance(v, float) and 0 <= v < math.inf))
    with pytest.raises(BertkitError, match=rf"SpladeLoss: {name} must be a finite number >= 0"):
        losses.SpladeLoss(sparse_model, losses.SparseMultipleNegativesRankingLoss(sparse_model), **weights)


def test_bad_threshold_and_schedule_are_refused(sparse_model):
    from bertkit.sentence.sparse_encoder import losses
    from bertkit.sentence.sparse_encoder.callbacks import SpladeRegularizerWeightSchedulerCallback

    mnrl = losses.SparseMultipleNegativesRankingLoss(sparse_model)
    with pytest.raises(BertkitError, match="FlopsLoss: threshold must be"):
        losses.SpladeLoss(sparse_model, mnrl, 3e-5, 5e-5, document_regularizer_threshold=-1)
    loss = losses.SpladeLoss(sparse_model, mnrl, 3e-5, 5e-5)
    with pytest.raises(BertkitError, match="scheduler_type 'cosine' is not one of"):
        SpladeRegularizerWeightSchedulerCallback(loss, scheduler_type="cosine")
    with pytest.raises(BertkitError, match="warmup_ratio must be in"):
        SpladeRegularizerWeightSchedulerCallback(loss, warmup_ratio=0)
    with pytest.raises(BertkitError, match="schedules a SpladeLoss's weights, got SparseMultipleNegativesRankingLoss"):
        SpladeRegularizerWeightSchedulerCallback(mnrl)
    with pytest.raises(BertkitError, match="SpladeLoss\\(loss=SpladeLoss\\)"):
        losses.SpladeLoss(sparse_model, loss, 3e-5, 5e-5)


def test_losses_are_trained_inside_splade_loss(sparse_model, tmp_path):
    """As in sentence-transformers, the sparse losses and FlopsLoss are not losses of their own; bertkit refuses
    them when the trainer is made, not at the first step; FlopsLoss's value is the FLOPS regulariser."""
    from bertkit.sentence import SparseEncoderTrainer, SparseEncoderTrainingArguments
    from bertkit.sentence.sparse_encoder import losses

    rows = datasets.Dataset.from_list([{"q": "a question", "p": "a passage"}] * 4)
    args = SparseEncoderTrainingArguments(output_dir=str(tmp_path / "out"), per_device_train_batch_size=2)
    for loss in (losses.SparseMultipleNegativesRankingLoss(sparse_model), losses.SparseCoSENTLoss(sparse_model)):
        with pytest.raises(BertkitError, match=f"{type(loss).__name__} trains inside SpladeLoss"):
            SparseEncoderTrainer(model=sparse_model, args=args, train_dataset=rows, loss=loss)
        with pytest.raises(BertkitError, match="trains inside SpladeLoss"):
            loss([], None)
    flops = losses.FlopsLoss(sparse_model)
    with pytest.raises(BertkitError, match="FlopsLoss is a regulariser"):
        SparseEncoderTrainer(model=sparse_model, args=args, train_dataset=rows, loss=flops)
    emb = torch.tensor([[1.0, 0.0, 2.0], [3.0, 0.0, 0.0]])
    assert flops.compute_loss_from_embeddings(emb).item() == pytest.approx(2.0 ** 2 + 1.0 ** 2)
    # threshold 1: the second row (one active dimension) counts as zeros
    assert losses.FlopsLoss(sparse_model, threshold=1).compute_loss_from_embeddings(emb).item() == pytest.approx(
        0.5 ** 2 + 1.0 ** 2)
    assert not (tmp_path / "out").exists()  # refused before anything was written


def test_what_bertkit_does_not_implement_is_refused_by_name(sparse_model, tmp_path, layouts_inference_free):
    from bertkit.sentence import SparseEncoder, SparseEncoderTrainer, SparseEncoderTrainingArguments
    from bertkit.sentence.sparse_encoder import losses

    for name in ("CSRLoss", "CachedSpladeLoss", "SparseTripletLoss", "SparseMSELoss", "SparseAnglELoss"):
        with pytest.raises(BertkitError, match=f"losses.{name} is not implemented in bertkit: "):
            getattr(losses, name)
    with pytest.raises(BertkitError, match="router_mapping=.* is not implemented in bertkit"):
        SparseEncoderTrainingArguments(output_dir=str(tmp_path), router_mapping={"query": "query"})
    with pytest.raises(BertkitError, match="learning_rate_mapping=.* is not implemented in bertkit"):
        SparseEncoderTrainingArguments(output_dir=str(tmp_path), learning_rate_mapping={r"SparseStatic.*": 1e-3})
    router = SparseEncoder(layouts_inference_free)
    with pytest.raises(BertkitError, match="training an inference-free SparseEncoder"):
        SparseEncoderTrainer(model=router, args=SparseEncoderTrainingArguments(output_dir=str(tmp_path / "o")))
    from bertkit.sentence.losses import MatryoshkaLoss

    matryoshka = MatryoshkaLoss(sparse_model, losses.SparseMultipleNegativesRankingLoss(sparse_model), [64])
    with pytest.raises(BertkitError, match="SpladeLoss\\(loss=MatryoshkaLoss\\) is not implemented"):
        losses.SpladeLoss(sparse_model, matryoshka, 3e-5)
    with pytest.raises(BertkitError, match="model must be a bertkit.sentence.SparseEncoder"):
        SparseEncoderTrainer(model=torch.nn.Linear(1, 1))


@pytest.fixture(scope="module")
def layouts_inference_free(checkpoint, tmp_path_factory):
    """sentence-transformers' inference-free layout (a Router: SparseStaticEmbedding queries, SPLADE documents)."""
    from sentence_transformers.sparse_encoder.modules import Router, SparseStaticEmbedding, SpladePooling
    from sentence_transformers.sparse_encoder.modules import Transformer as STTransformer

    document = STTransformer(str(checkpoint), transformer_task="fill-mask")
    query = SparseStaticEmbedding(tokenizer=document.tokenizer, weight=torch.ones(30522))
    router = Router.for_query_document(query_modules=[query], document_modules=[document, SpladePooling("max")])
    out = tmp_path_factory.mktemp("router") / "inference_free"
    st.SparseEncoder(modules=[router], device="cpu").save(str(out))
    return out
