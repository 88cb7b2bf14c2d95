"""The same sparse training script run with sentence-transformers 6 and with bertkit.sentence (the import changed):
the masked-LM checkpoint of sparse_helpers (dropout off) as a new SPLADE model, SQuAD dev questions against their
paragraphs, SpladeLoss around several of its losses and CachedSpladeLoss, for a few steps. Same terms (base loss, document and query
regularisers) at every step, same regulariser weights during the warm-up sentence-transformers' trainer adds by
itself, same vectors after training. The inference-free layout (a Router: static query weights, SPLADE documents)
trains with router_mapping and learning_rate_mapping: same terms, same learning rate per parameter, same weights,
and each library opens the directory the other saved. Bad input refused by name before any work."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest
import torch

from bertkit.errors import BertkitError
from bertkit.sentence import SparseEncoder
from sparse_helpers import masked_lm_checkpoint

st = pytest.importorskip("sentence_transformers")
datasets = pytest.importorskip("datasets")

STEPS, BATCH, MAX_LENGTH = 6, 8, 64
WEIGHTS = {"document_regularizer_weight": 3e-3, "query_regularizer_weight": 5e-3}  # large: the terms must count


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, minilm_2_layers):
    return masked_lm_checkpoint(minilm_2_layers, tmp_path_factory.mktemp("sparse-train") / "mlm", dropout=0.0)


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
    if kind in ("mnrl", "triplet", "cached"):
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


def _library(lib: str):
    """(the sentence package, the sparse losses, BatchSamplers) of ``lib``: the one line a ported script changes."""
    if lib == "sentence_transformers":
        import sentence_transformers as S
        from sentence_transformers.sentence_transformer.training_args import BatchSamplers
        from sentence_transformers.sparse_encoder import losses
    else:
        import bertkit.sentence as S
        from bertkit.sentence.sparse_encoder import losses
        from bertkit.sentence.training_args import BatchSamplers
    return S, losses, BatchSamplers


def _train(lib: str, model_dir, out_dir, rows, kind: str, **arguments):
    """The training script; ``lib`` picks the import, nothing else differs (``arguments``: more training arguments).
    Returns each step's terms and the regulariser weights the loss held, the vectors of a few texts after training
    (documents, then queries) and the model."""
    S, losses, BatchSamplers = _library(lib)
    model = S.SparseEncoder(str(model_dir), device="cpu")
    model.max_seq_length = MAX_LENGTH
    steps = []

    def recorded(splade):  # each step's terms, unrounded, and the weights they were computed with
        class Recorded(splade):
            def forward(self, features, labels=None):
                terms = super().forward(features, labels)
                steps.append({**{k: v.item() for k, v in terms.items()},
                              "document_regularizer_weight": self.document_regularizer_weight,
                              "query_regularizer_weight": self.query_regularizer_weight})
                return terms
        return Recorded

    Recorded, Cached = recorded(losses.SpladeLoss), recorded(losses.CachedSpladeLoss)

    base = {"mnrl": lambda: losses.SparseMultipleNegativesRankingLoss(model),
            "cached": lambda: losses.SparseMultipleNegativesRankingLoss(model),
            "triplet": lambda: losses.SparseTripletLoss(model),
            "margin_mse": lambda: losses.SparseMarginMSELoss(model),
            "kl_div": lambda: losses.SparseDistillKLDivLoss(model),
            "cosent": lambda: losses.SparseCoSENTLoss(model)}[kind]()
    # the cached one in mini-batches of 3 rows of 8 (the last one short)
    loss = Recorded(model, loss=base, **WEIGHTS) if kind != "cached" else \
        Cached(model, loss=base, **WEIGHTS, mini_batch_size=3)
    args = S.SparseEncoderTrainingArguments(
        output_dir=str(out_dir), per_device_train_batch_size=BATCH, max_steps=STEPS, learning_rate=2e-5,
        logging_steps=1, save_strategy="no", report_to="none", seed=42, use_cpu=True, disable_tqdm=True,
        batch_sampler=BatchSamplers.NO_DUPLICATES if kind in ("mnrl", "cached") else BatchSamplers.BATCH_SAMPLER,
        **arguments)
    trainer = S.SparseEncoderTrainer(model=model, args=args, train_dataset=datasets.Dataset.from_list(rows), loss=loss)
    trainer.train()
    return steps, _vectors(model, rows), model


def _vectors(model, rows) -> torch.Tensor:
    """A few texts as documents, and as queries (an inference-free model's other route), dense."""
    texts = [r[c] for r in rows[:4] for c in list(r)[:2]]
    return torch.cat([model.encode_document(texts, convert_to_sparse_tensor=False),
                      model.encode_query(texts, convert_to_sparse_tensor=False)])


@pytest.mark.slow  # about a minute a loss on two shared cores (the cached one up to five): make test-slow
@pytest.mark.parametrize("kind", ["mnrl", "cached", "triplet", "margin_mse", "kl_div", "cosent"])
def test_training_script_gives_sentence_transformers_numbers(kind, checkpoint, squad, tmp_path):
    rows = _rows(kind, squad)
    want, want_vectors, _ = _train("sentence_transformers", checkpoint, tmp_path / "st", rows, kind)
    got, got_vectors, _ = _train("bertkit", checkpoint, tmp_path / "bk", rows, kind)
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


ROUTES = {"query": "query", "positive": "document", "negative": "document"}
# "query" also matches the document encoder's attention.self.query; the later, narrower pattern takes the static
# query weights from it (a later pattern wins): sentence-transformers' order of groups
RATES = {r"query": 1e-4, r"sub_modules\.query\.": 1e-3}


@pytest.fixture(scope="module")
def inference_free(checkpoint, tmp_path_factory):
    """sentence-transformers' inference-free layout (a Router: SparseStaticEmbedding queries with weights in
    [0.5, 1.5), SPLADE documents), as it writes it."""
    from sentence_transformers.sparse_encoder.modules import Router, SparseStaticEmbedding, SpladePooling
    from sentence_transformers.sparse_encoder.modules import Transformer as STTransformer

    document = STTransformer(str(checkpoint), transformer_task="fill-mask")
    query = SparseStaticEmbedding(tokenizer=document.tokenizer,
                                  weight=torch.rand(len(document.tokenizer), generator=torch.Generator().manual_seed(1)) + 0.5)
    router = Router.for_query_document(query_modules=[query], document_modules=[document, SpladePooling("max")])
    out = tmp_path_factory.mktemp("router") / "inference_free"
    st.SparseEncoder(modules=[router], device="cpu").save(str(out))
    return out


@pytest.mark.slow  # about a minute and a half on two shared cores: make test-slow
def test_inference_free_training_gives_sentence_transformers_numbers(inference_free, squad, tmp_path):
    """router_mapping sends the question column through the static query weights and the paragraphs through
    SPLADE; learning_rate_mapping gives the static weights (and, first, every parameter named "query") their own
    rates; weight decay 0.1, which sentence-transformers (transformers' rule) applies to the static weights."""
    rows = _rows("mnrl", squad)
    arguments = {"router_mapping": ROUTES, "learning_rate_mapping": RATES, "weight_decay": 0.1}
    want, want_vectors, theirs = _train("sentence_transformers", inference_free, tmp_path / "st", rows, "mnrl",
                                        **arguments)
    got, got_vectors, ours = _train("bertkit", inference_free, tmp_path / "bk", rows, "mnrl", **arguments)
    assert len(want) == len(got) == STEPS
    for term in ["base_loss", "document_regularizer_loss", "query_regularizer_loss"]:
        np.testing.assert_allclose([s[term] for s in got], [s[term] for s in want], rtol=1e-5, atol=1e-6, err_msg=term)
    want_weights, got_weights = dict(theirs.named_parameters()), dict(ours.named_parameters())
    assert list(got_weights) == list(want_weights)
    # Within 1e-5, but for a word piece whose maximum logit in a text falls within float rounding of 0 at some step:
    # relu gives it a gradient in one library and none in the other, and Adam turns either into a step of about the
    # learning rate on its row of the decoder, tied to the input embeddings (measured: one row, "##bank", 2.1e-5
    # apart; every other parameter within 1.6e-6)
    for name, value in want_weights.items():
        apart = (got_weights[name] - value).abs()
        if name.endswith("word_embeddings.weight"):
            assert (apart > 1e-5).any(1).sum() <= 2 and apart.max() < 1e-4, name
        else:
            assert apart.max() <= 1e-5, name
    static = "0.sub_modules.query.0.weight"
    moved = (want_weights[static] - SparseEncoder(inference_free).state_dict()[static]).abs().max().item()
    assert moved > 2e-3  # at 1e-3 a step: the mapping's rate, not learning_rate's 2e-5
    assert torch.equal(got_vectors != 0, want_vectors != 0)
    torch.testing.assert_close(got_vectors, want_vectors, atol=1e-4, rtol=1e-4)
    # each library opens the directory the other wrote, to the same vectors
    ours.save(tmp_path / "bk_saved")
    theirs.save(str(tmp_path / "st_saved"))
    torch.testing.assert_close(_vectors(st.SparseEncoder(str(tmp_path / "bk_saved"), device="cpu"), rows), got_vectors,
                               atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(_vectors(SparseEncoder(tmp_path / "st_saved"), rows), want_vectors, atol=1e-5, rtol=1e-5)


def _groups(lib: str, model_dir, tmp_path, mapping: dict) -> list[tuple[float, float, list[str]]]:
    """The optimiser's groups a trainer builds, as (learning rate, weight decay, parameter names): for
    sentence-transformers its AdamW's, for bertkit those its loop builds AdamW over (at learning_rate where a group
    sets none)."""
    S, losses, _ = _library(lib)
    model = S.SparseEncoder(str(model_dir), device="cpu")
    loss = losses.SpladeLoss(model, losses.SparseMultipleNegativesRankingLoss(model), 3e-5, 5e-5)
    args = S.SparseEncoderTrainingArguments(output_dir=str(tmp_path / lib), learning_rate=2e-5, weight_decay=0.1,
                                            report_to="none", use_cpu=True, router_mapping=ROUTES,
                                            learning_rate_mapping=mapping)
    rows = datasets.Dataset.from_list([{"query": "a question", "positive": "a passage", "negative": "another"}] * 4)
    trainer = S.SparseEncoderTrainer(model=model, args=args, train_dataset=rows, loss=loss)
    built = trainer.create_optimizer().param_groups if lib == "sentence_transformers" else trainer._parameter_groups()
    names = {id(p): n for n, p in loss.named_parameters()}
    return [(g.get("lr", 2e-5), g["weight_decay"], [names[id(p)] for p in g["params"]]) for g in built]


@pytest.mark.parametrize("mapping", [{}, {r"sub_modules\.query\.": 1e-3}, {**RATES, "LayerNorm": 0.0}])
def test_learning_rates_per_parameter_are_sentence_transformers(mapping, inference_free, tmp_path):
    """The same groups, in the same order, with the same parameters at the same rate and weight decay."""
    want = _groups("sentence_transformers", inference_free, tmp_path, mapping)
    got = _groups("bertkit", inference_free, tmp_path, mapping)
    assert got == want
    rate = {n: lr for lr, _, names in got for n in names}
    assert rate["model.0.sub_modules.query.0.weight"] == (1e-3 if mapping else 2e-5)
    decay = {n: wd for _, wd, names in got for n in names}
    assert decay["model.0.sub_modules.query.0.weight"] == 0.1  # a one-dimensional weight, decayed by name
    assert decay["model.0.sub_modules.document.0.model.cls.predictions.bias"] == 0.0


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


@pytest.mark.parametrize("make", [lambda m, L: L.SparseCoSENTLoss(m, scale=math.nan),
                                  lambda m, L: L.SparseCoSENTLoss(m, scale=0),
                                  lambda m, L: L.SparseCoSENTLoss(m, scale=-20.0),
                                  lambda m, L: L.SparseMultipleNegativesRankingLoss(m, scale=math.inf),
                                  lambda m, L: L.SparseDistillKLDivLoss(m, temperature=0)])
def test_a_scale_or_temperature_that_is_not_positive_and_finite_is_refused(sparse_model, make):
    """sentence-transformers takes them, and trains on a NaN loss (NaN, infinity), a constant one (0) or the
    ranking inverted (a negative scale) without a word."""
    from bertkit.sentence.sparse_encoder import losses

    with pytest.raises(BertkitError, match=r"Sparse\w+Loss: (scale|temperature) must be a positive finite number"):
        make(sparse_model, losses)
    assert sparse_model.similarity_fn_name == "dot"  # left as it was (SparseCoSENTLoss sets "cosine")


def test_a_loss_called_on_too_few_columns_is_refused_and_on_enough_gives_sentence_transformers_number(checkpoint,
                                                                                                       sparse_model):
    """The trainer checks a dataset's columns; a direct call is checked too: a softmax over one candidate column is
    a constant 0 (sentence-transformers refuses it), and one column failed inside torch.cat. The numbers are compared
    in float64: in float32 the reference's own FLOPS term moves by 5e-5 (relative) between runs on a Xeon with AMX
    (MKL picks its GEMM blocking by the buffers' alignment), more than the 1e-5 the comparison asks of it."""
    st = pytest.importorskip("sentence_transformers")
    from sentence_transformers.sparse_encoder import losses as reference

    from bertkit.sentence.sparse_encoder import losses

    columns = [["who drove", "what is the weather"], ["He drove to the stadium.", "The weather is lovely."],
               ["Cats sleep.", "The river is wide."]]
    teacher = torch.tensor([[3.0, 1.0], [0.5, 0.2]], dtype=torch.float64)

    def value(lib, model, n):
        loss = lib.SpladeLoss(model, lib.SparseDistillKLDivLoss(model), 3e-3, 5e-3)
        return loss([model.tokenize(texts) for texts in columns[:n]], teacher[:, :n - 1])

    with pytest.raises(BertkitError, match=r"SparseDistillKLDivLoss takes 3 or more text column\(s\) and a label "
                                           r"column \('label' or 'score'\), got a batch of 2 text column\(s\)"):
        value(losses, sparse_model, 2)
    mnrl = losses.SpladeLoss(sparse_model, losses.SparseMultipleNegativesRankingLoss(sparse_model), 3e-3, 5e-3)
    with pytest.raises(BertkitError, match=r"SparseMultipleNegativesRankingLoss takes 2 or more text column\(s\), got "
                                           r"a batch of 1 text column\(s\)"):
        mnrl([sparse_model.tokenize(columns[0])], None)
    got = value(losses, type(sparse_model)(checkpoint).to(torch.float64), 3)  # the fixture's model stays float32
    want = value(reference, st.SparseEncoder(str(checkpoint), device="cpu").to(torch.float64), 3)
    assert got.keys() == want.keys()
    for name in want:  # float64 rounding of the same sums
        torch.testing.assert_close(got[name], want[name], rtol=1e-12, atol=0)


def test_numpy_numbers_are_weights(sparse_model):
    import numpy as np

    from bertkit.sentence.sparse_encoder import losses

    loss = losses.SpladeLoss(sparse_model, losses.SparseMultipleNegativesRankingLoss(sparse_model, scale=np.float32(2)),
                             np.float32(3e-5), np.float32(5e-5), document_regularizer_threshold=np.int64(10))
    assert (loss.document_regularizer_weight, loss.query_regularizer_weight) == (float(np.float32(3e-5)),
                                                                               float(np.float32(5e-5)))
    assert loss.document_regularizer.threshold == 10


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


def test_what_bertkit_does_not_implement_is_refused_by_name(sparse_model, tmp_path):
    from bertkit.sentence import SparseEncoderTrainer
    from bertkit.sentence.sparse_encoder import losses

    for name in ("CSRLoss", "CSRReconstructionLoss"):
        with pytest.raises(BertkitError, match=f"losses.{name} is not implemented in bertkit: "):
            getattr(losses, name)
    from bertkit.sentence.losses import MatryoshkaLoss

    matryoshka = MatryoshkaLoss(sparse_model, losses.SparseMultipleNegativesRankingLoss(sparse_model), [64])
    with pytest.raises(BertkitError, match="SpladeLoss\\(loss=MatryoshkaLoss\\) is not implemented"):
        losses.SpladeLoss(sparse_model, matryoshka, 3e-5)
    with pytest.raises(BertkitError, match="model must be a bertkit.sentence.SparseEncoder"):
        SparseEncoderTrainer(model=torch.nn.Linear(1, 1))


def test_bad_router_and_learning_rate_mappings_are_refused_by_name(inference_free, sparse_model, tmp_path):
    """Each refused when the arguments or the trainer are made, naming the value and the fix; nothing written.
    sentence-transformers refuses a Router model without router_mapping and a pattern that matches no parameter
    too (the latter when training starts); an unknown route it refuses at the first step, an unknown column and a
    negative rate it takes."""
    from bertkit.sentence import SparseEncoderTrainer, SparseEncoderTrainingArguments
    from bertkit.sentence.sparse_encoder import losses

    out = tmp_path / "out"
    rows = datasets.Dataset.from_list([{"query": "a question", "positive": "a passage", "negative": "another"}] * 4)
    router = SparseEncoder(inference_free)

    def trainer(model=router, **arguments):
        args = SparseEncoderTrainingArguments(output_dir=str(out), report_to="none", use_cpu=True, **arguments)
        loss = losses.SpladeLoss(model, losses.SparseMultipleNegativesRankingLoss(model), 3e-5, None)
        return SparseEncoderTrainer(model=model, args=args, train_dataset=rows, loss=loss)

    with pytest.raises(BertkitError, match=r"this SparseEncoder has a Router \(routes \['query', 'document'\]\): "
                                           "give router_mapping in the training arguments"):
        trainer()
    with pytest.raises(BertkitError, match=r"router_mapping names the column\(s\) \['question'\], which are not text "
                                           r"columns of train_dataset \(its text columns: \['query', 'positive', "
                                           r"'negative'\]"):
        trainer(router_mapping={"question": "query", "positive": "document"})
    # one mapping for a dict of datasets, each naming its own columns: the fix is a mapping per dataset
    args = SparseEncoderTrainingArguments(output_dir=str(out), report_to="none", use_cpu=True,
                                          router_mapping={**ROUTES, "q2": "query", "d2": "document"})
    with pytest.raises(BertkitError, match=re.escape(
            "not text columns of train_dataset['squad'] (its text columns: ['query', 'positive', 'negative']): map "
            "those, e.g. one mapping per dataset, {'squad': {'query': 'query', 'negative': 'document'}, ...}")):
        SparseEncoderTrainer(model=router, args=args, loss=losses.SpladeLoss(
            router, losses.SparseMultipleNegativesRankingLoss(router), 3e-5, None), train_dataset={
                "squad": rows, "other": datasets.Dataset.from_list([{"q2": "a question", "d2": "a passage"}] * 4)})
    with pytest.raises(BertkitError, match=r"the Router has no route for the train_dataset column\(s\) "
                                           r"\{'query': 'queries'\}.*its routes are \['query', 'document'\]"):
        trainer(router_mapping={"query": "queries", "positive": "document"})
    no_default = SparseEncoder(inference_free)
    no_default[0].default_route = None
    with pytest.raises(BertkitError, match=r"column\(s\) \{'positive': None, 'negative': None\} \(None: not mapped, and the Router "
                                           r"has no default route\)"):
        trainer(no_default, router_mapping={"query": "query"})
    with pytest.raises(BertkitError, match=r"router_mapping=\{'query': 'query'\} maps columns to a Router's routes, "
                                           "and a bertkit SparseEncoder has no Router: drop router_mapping"):
        trainer(sparse_model, router_mapping={"query": "query"})
    with pytest.raises(BertkitError, match=r"router_mapping maps dataset names \(\['squad'\]\) to \{column: ...\}, and "
                                           "train_dataset is one dataset"):
        trainer(router_mapping={"squad": {"query": "query", "positive": "document"}})
    # a mapping per dataset of a dict of them: each dataset's columns go through its routes
    args = SparseEncoderTrainingArguments(output_dir=str(out), report_to="none", use_cpu=True, router_mapping={
        "squad": {"query": "query", "positive": "document"}, "msmarco": {"query": "document"}})
    loss = losses.SpladeLoss(router, losses.SparseMultipleNegativesRankingLoss(router), 3e-5, None)
    parts = SparseEncoderTrainer(model=router, args=args, train_dataset={"squad": rows, "msmarco": rows},
                                 loss=loss).train_dataset.parts
    assert {name: part.tasks for name, part in parts.items()} == {"squad": ["query", "document", None],
                                                                  "msmarco": ["document", None, None]}
    # sentence-transformers' docs write the class name; a parameter's name is its module path, in both libraries
    by_class = {r"SparseStaticEmbedding\.*": 1e-3}
    with pytest.raises(BertkitError, match=re.escape(
            f"the pattern {next(iter(by_class))!r} matches no parameter name (re.search on names such as "
            "'model.0.sub_modules.query.0.weight'); a name is a module path, not a class: the SparseStaticEmbedding at "
            f"'model.0.sub_modules.query.0' is matched by {re.escape('model.0.sub_modules.query.0.')!r}")):
        trainer(router_mapping=ROUTES, learning_rate_mapping=by_class)
    theirs = st.SparseEncoder(str(inference_free), device="cpu")
    st_args = st.SparseEncoderTrainingArguments(output_dir=str(tmp_path / "st"), report_to="none", use_cpu=True,
                                                router_mapping=ROUTES, learning_rate_mapping=by_class)
    st_loss = st.sparse_encoder.losses.SpladeLoss(theirs, st.sparse_encoder.losses.SparseMultipleNegativesRankingLoss(
        theirs), 3e-5, None)
    with pytest.raises(ValueError, match=re.escape(f"No parameters found matching the pattern '{next(iter(by_class))}'")):
        st.SparseEncoderTrainer(model=theirs, args=st_args, train_dataset=rows, loss=st_loss).create_optimizer()
    with pytest.raises(ValueError, match="you did not provide a `router_mapping`"):
        st.SparseEncoderTrainer(model=theirs, args=st.SparseEncoderTrainingArguments(
            output_dir=str(tmp_path / "st"), report_to="none", use_cpu=True), train_dataset=rows, loss=st_loss)
    for rate in (-1e-3, math.nan, math.inf, "1e-3", True):
        with pytest.raises(BertkitError, match=r"learning_rate_mapping: the learning rate of 'query' must be a finite "
                                               "number >= 0, got"):
            SparseEncoderTrainingArguments(output_dir=str(out), learning_rate_mapping={"query": rate})
    with pytest.raises(BertkitError, match=r"learning_rate_mapping: 'query\(' is not a regular expression"):
        SparseEncoderTrainingArguments(output_dir=str(out), learning_rate_mapping={"query(": 1e-3})
    assert not out.exists()
    # as in sentence-transformers, each mapping may come as JSON text (a command line's)
    args = SparseEncoderTrainingArguments(output_dir=str(out), router_mapping='{"query": "query"}',
                                          learning_rate_mapping='{"query": 0.001}')
    assert (args.router_mapping, args.learning_rate_mapping) == ({"query": "query"}, {"query": 1e-3})


def test_evaluation_logs_the_terms_of_its_own_pass(checkpoint, tmp_path):
    """Evaluating every 2 steps with an evaluator and metric_for_best_model: eval_loss and each term logged beside it
    (eval_base_loss, the regularisers) are sentence-transformers'. The batch that checks metric_for_best_model before
    training added its terms to the first evaluation's (here eval_base_loss 1.174 where sentence-transformers logs
    0.920, beside the same eval_loss)."""
    rows = [{"query": f"question {i} on topic {i % 4}", "positive": f"answer {i // 2} about topic {i % 4}"}
            for i in range(16)]
    logs = {}
    for lib in ("sentence_transformers", "bertkit"):
        S, losses, _ = _library(lib)
        evaluation = (__import__("sentence_transformers.sparse_encoder.evaluation", fromlist=["x"])
                      if lib == "sentence_transformers" else __import__("bertkit.sentence.sparse_encoder.evaluation",
                                                                        fromlist=["x"]))
        model = S.SparseEncoder(str(checkpoint), device="cpu")
        model.max_seq_length = MAX_LENGTH
        loss = losses.SpladeLoss(model, losses.SparseMultipleNegativesRankingLoss(model), **WEIGHTS)
        evaluator = evaluation.SparseEmbeddingSimilarityEvaluator(
            [r["query"] for r in rows[:6]], [r["positive"] for r in rows[:6]], [float(i % 3) for i in range(6)],
            name="sts")
        args = S.SparseEncoderTrainingArguments(
            output_dir=str(tmp_path / lib), per_device_train_batch_size=BATCH, max_steps=2, learning_rate=2e-5,
            eval_strategy="steps", eval_steps=2, save_strategy="no", metric_for_best_model="eval_sts_spearman_dot",
            report_to="none", seed=42, use_cpu=True, disable_tqdm=True)
        trainer = S.SparseEncoderTrainer(model=model, args=args, train_dataset=datasets.Dataset.from_list(rows),
                                         eval_dataset=datasets.Dataset.from_list(rows[:8]), loss=loss,
                                         evaluator=evaluator)
        trainer.train()
        logs[lib] = next(h for h in trainer.state.log_history if "eval_loss" in h)
    want, got = logs["sentence_transformers"], logs["bertkit"]
    terms = ["eval_loss", "eval_base_loss", "eval_document_regularizer_loss", "eval_query_regularizer_loss"]
    assert set(terms) <= set(want) and set(terms) <= set(got)
    # sentence-transformers logs the terms rounded to 4 decimals (eval_loss, transformers' own, unrounded)
    assert all(round(got[k], 4) == got[k] for k in terms[1:]), got
    np.testing.assert_allclose([got[k] for k in terms], [want[k] for k in terms], rtol=1e-4, atol=1e-4,
                               err_msg=str(terms))
    assert got["eval_base_loss"] + got["eval_document_regularizer_loss"] + got["eval_query_regularizer_loss"] == \
        pytest.approx(got["eval_loss"], abs=2e-4)


def test_evaluation_logs_its_terms_under_its_own_prefix(checkpoint, tmp_path):
    """sentence-transformers 6.3 logs an evaluation's loss terms under that evaluation's prefix: evaluate() of a dict
    of datasets as eval_{name}_base_loss, ...; evaluate(metric_key_prefix="test") as test_base_loss, ... 6.2, and
    bertkit, logged terms beside eval_loss alone, so these went unlogged."""
    rows = [{"query": f"question {i} on topic {i % 4}", "positive": f"answer {i // 2} about topic {i % 4}"}
            for i in range(12)]
    logs = {}
    for lib in ("sentence_transformers", "bertkit"):
        S, losses, _ = _library(lib)
        model = S.SparseEncoder(str(checkpoint), device="cpu")
        model.max_seq_length = MAX_LENGTH
        loss = losses.SpladeLoss(model, losses.SparseMultipleNegativesRankingLoss(model), **WEIGHTS)
        args = S.SparseEncoderTrainingArguments(output_dir=str(tmp_path / lib), per_device_eval_batch_size=4,
                                                report_to="none", use_cpu=True, disable_tqdm=True)
        trainer = S.SparseEncoderTrainer(model=model, args=args, train_dataset=datasets.Dataset.from_list(rows),
                                         eval_dataset={"a": datasets.Dataset.from_list(rows[:4]),
                                                       "b": datasets.Dataset.from_list(rows[4:8])}, loss=loss)
        trainer.evaluate()
        trainer.evaluate(datasets.Dataset.from_list(rows[8:]), metric_key_prefix="test")
        logs[lib] = [{k: v for k, v in h.items() if k.endswith("loss")} for h in trainer.state.log_history]
    want, got = logs["sentence_transformers"], logs["bertkit"]
    assert [sorted(h) for h in got] == [sorted(h) for h in want] == [
        sorted(f"{p}_{t}" for t in ("loss", "base_loss", "document_regularizer_loss", "query_regularizer_loss"))
        for p in ("eval_a", "eval_b", "test")]
    for g, w in zip(got, want):
        np.testing.assert_allclose([g[k] for k in w], list(w.values()), rtol=1e-4, atol=1e-4)
