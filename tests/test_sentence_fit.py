"""sentence-transformers' legacy ``model.fit`` in bertkit.sentence, against sentence-transformers: the same script
(only the import differs) with one objective (MultipleNegativesRankingLoss on InputExample pairs) and with two
(and CoSENTLoss on scored pairs) trains to the same loss at every step and saves the same model at output_path;
a CrossEncoder's fit trains to its numbers too; what bertkit cannot do is refused by name."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bertkit.errors import BertkitError, NotImplementedInBertkit
from sentence_helpers import st_directory

pytest.importorskip("sentence_transformers")
pytest.importorskip("datasets")

PAIRS = [(f"question {i}", f"paragraph {i // 2}") for i in range(11)]
SCORED = [(f"sentence {i}", f"another {i % 3}", (i % 5) / 4) for i in range(9)]
PROBE = ["question 3", "a paragraph", "another sentence"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, minilm_2_layers):
    return st_directory(minilm_2_layers, tmp_path_factory.mktemp("st") / "m", dropout=0.0, max_seq_length=16)


def _fit(lib: str, model_dir, out, two: bool, evaluate: bool = False, evaluation_steps: int = 0, **fit_kwargs):
    """The fit script; ``lib`` picks the import, nothing else differs. Returns each step's (rows, loss), the model
    saved at output_path's embeddings of PROBE and, with ``evaluate``, each evaluation's (score, epoch, steps) as
    fit's callback gets them."""
    if lib == "sentence_transformers":
        import sentence_transformers as S
        from sentence_transformers import losses as L
        from sentence_transformers.sentence_transformer import evaluation
    else:
        import bertkit.sentence as S
        from bertkit.sentence import evaluation
        from bertkit.sentence import losses as L
    model = S.SentenceTransformer(str(model_dir), device="cpu")
    seen = []

    def recorded(cls):
        class Recorded(cls):  # each batch's rows and loss, unrounded
            def forward(self, features, labels):
                value = super().forward(features, labels)
                seen.append((len(features[0]["input_ids"]), value.item()))
                return value
        return Recorded(model)

    pairs = [S.InputExample(texts=[a, b]) for a, b in PAIRS]
    objectives = [(torch.utils.data.DataLoader(pairs, shuffle=True, batch_size=3),
                   recorded(L.MultipleNegativesRankingLoss))]
    if two:
        scored = [S.InputExample(texts=[a, b], label=s) for a, b, s in SCORED]
        objectives.append((torch.utils.data.DataLoader(scored, shuffle=True, batch_size=3), recorded(L.CoSENTLoss)))
    scores, evaluator = [], None
    if evaluate:
        evaluator = evaluation.EmbeddingSimilarityEvaluator([a for a, _, _ in SCORED], [b for _, b, _ in SCORED],
                                                            [s for _, _, s in SCORED], name="sts")
    torch.manual_seed(7)  # the DataLoaders' shuffle, drawn from torch's global generator
    model.fit(train_objectives=objectives, evaluator=evaluator, **{"epochs": 2, **fit_kwargs}, warmup_steps=2,
              optimizer_params={"lr": 1e-4}, output_path=str(out / "model"), checkpoint_path=str(out / "ckpt"),
              checkpoint_save_steps=3, checkpoint_save_total_limit=2, show_progress_bar=False,
              evaluation_steps=evaluation_steps,
              callback=lambda score, epoch, steps: scores.append((score, epoch, steps)))
    saved = S.SentenceTransformer(str(out / "model"), device="cpu")
    checkpoints = sorted(int(p.name.split("-")[1]) for p in (out / "ckpt").glob("checkpoint-*"))
    return seen, saved.encode(PROBE, convert_to_numpy=True), scores, checkpoints


@pytest.mark.parametrize(("two", "fit_kwargs", "steps", "checkpoints"), [
    # 11 pairs in batches of 3: 4 a epoch (in `make test-slow`: one dataset's fit is test_fit_evaluates' too)
    pytest.param(False, {}, 2 * 4, [6, 8], marks=pytest.mark.slow),
    # ROUND_ROBIN: the fewest batches (3 of 9 scored rows) of each dataset
    pytest.param(True, {}, 2 * 6, [9, 12], marks=pytest.mark.slow),
    (True, {"epochs": 1, "steps_per_epoch": 5, "scheduler": "WarmupCosine"}, 5, [3, 5]),
], ids=["mnrl", "mnrl+cosent", "steps_per_epoch+cosine"])
def test_fit_gives_sentence_transformers_numbers(two, fit_kwargs, steps, checkpoints, model_dir, tmp_path):
    """Same rows per step, same loss at every step (relative 1e-5), same saved model (encode within 1e-5), the same
    checkpoints kept (checkpoint_save_steps 3 and the last step, checkpoint_save_total_limit 2)."""
    want_steps, want_emb, _, want_checkpoints = _fit("sentence_transformers", model_dir, tmp_path / "st", two,
                                                     **fit_kwargs)
    got_steps, got_emb, _, got_checkpoints = _fit("bertkit", model_dir, tmp_path / "bk", two, **fit_kwargs)
    assert [n for n, _ in got_steps] == [n for n, _ in want_steps]
    assert len(got_steps) == steps
    np.testing.assert_allclose([v for _, v in got_steps], [v for _, v in want_steps], rtol=1e-5)
    np.testing.assert_allclose(got_emb, want_emb, atol=1e-5)
    assert got_checkpoints == want_checkpoints == checkpoints


@pytest.mark.parametrize(("evaluation_steps", "evaluations"), [
    (0, [(1.0, 4), (2.0, 8)]),
    # every 3 steps and at the end (transformers' rule), beside each epoch's end: step 8 is evaluated twice
    pytest.param(3, [(0.75, 3), (1.0, 4), (1.5, 6), (2.0, 8), (2.0, 8)], marks=pytest.mark.slow),
])
def test_fit_evaluates_as_sentence_transformers(model_dir, tmp_path, evaluation_steps, evaluations):
    """With an evaluator: it runs at each epoch's end (and every evaluation_steps), fit's callback gets (score,
    epoch, steps) of each, the model at output_path is the best evaluation's and the evaluator's CSV is in
    output_path/eval, as in sentence-transformers."""
    _, want_emb, want, _ = _fit("sentence_transformers", model_dir, tmp_path / "st", False, True, evaluation_steps)
    _, got_emb, got, _ = _fit("bertkit", model_dir, tmp_path / "bk", False, True, evaluation_steps)
    assert [(e, s) for _, e, s in got] == [(e, s) for _, e, s in want] == evaluations
    np.testing.assert_allclose([v for v, _, _ in got], [v for v, _, _ in want], rtol=1e-5)
    np.testing.assert_allclose(got_emb, want_emb, atol=1e-5)
    csv = "similarity_evaluation_sts_results.csv"
    assert (tmp_path / "bk" / "model" / "eval" / csv).is_file() and (tmp_path / "st" / "model" / "eval" / csv).is_file()


@pytest.fixture(scope="module")
def model(model_dir):
    from bertkit.sentence import SentenceTransformer

    return SentenceTransformer(model_dir)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"optimizer_class": torch.optim.SGD}, r"optimizer_class=SGD.*torch.optim.AdamW"),
    ({"optimizer_params": {"lr": 1e-4, "amsgrad": True}}, r"\['amsgrad'\].*\['lr', 'eps', 'betas'\]"),
    ({"scheduler": "WarmupCosineWithHardRestarts"}, r"WarmupCosineWithHardRestarts.*WarmupLinear"),
])
def test_fit_refuses_what_bertkit_cannot_do(model, tmp_path, kwargs, message):
    """Refused by name with what to use, before anything is read or written."""
    from bertkit.sentence import InputExample, losses

    loader = torch.utils.data.DataLoader([InputExample(texts=[a, b]) for a, b in PAIRS], batch_size=3)
    with pytest.raises(NotImplementedInBertkit, match=message):
        model.fit([(loader, losses.MultipleNegativesRankingLoss(model))], output_path=str(tmp_path / "out"), **kwargs)
    assert not (tmp_path / "out").exists()


def test_fit_refuses_loaders_it_cannot_read(model, model_dir):
    """A custom batch_sampler (whose batches fit would not keep), rows that are no InputExample, a dataset shorter
    than one batch (fit's schedule would be 0 steps long), in SentenceTransformer.fit and CrossEncoder.fit (old_fit:
    test_sentence_calls)."""
    from bertkit.sentence import CrossEncoder, InputExample, losses
    from bertkit.sentence.readers import InputExample as FromReaders

    assert FromReaders is InputExample
    mnrl = losses.MultipleNegativesRankingLoss(model)
    rows = [InputExample(texts=[a, b]) for a, b in PAIRS]
    batched = torch.utils.data.DataLoader(rows, batch_sampler=torch.utils.data.BatchSampler(range(11), 3, False))
    with pytest.raises(NotImplementedInBertkit, match=r"custom batch_sampler \(BatchSampler\).*batch_size="):
        model.fit([(batched, mnrl)])
    with pytest.raises(BertkitError, match=r"gives \('question 0', 'paragraph 0'\) where an InputExample"):
        model.fit([(torch.utils.data.DataLoader(PAIRS, batch_size=3), mnrl)])
    with pytest.raises(BertkitError, match=r"\{'_dataset_1': 2\} hold fewer rows than one batch of 3"):
        model.fit([(torch.utils.data.DataLoader(rows[:2], batch_size=3), mnrl)])
    with pytest.raises(NotImplementedInBertkit, match=r"custom batch_sampler \(BatchSampler\)"):
        CrossEncoder(model_dir).fit(batched)
    # pairs and triplets in one objective: sentence-transformers 6.3 refuses them (6.2, and bertkit, dropped every
    # triplet's negative without a word)
    mixed = [*rows[:4], InputExample(texts=["q", "p", "n"]), *rows[4:]]
    with pytest.raises(BertkitError, match=r"fit: the InputExamples of train objective 1 have 2 to 3 texts \(e.g. "
                                           r"example 0: 2, example 4: 3\); all of one objective need the same number"):
        model.fit([(torch.utils.data.DataLoader(mixed, batch_size=3), mnrl)])


def test_fit_reads_an_evaluator_without_a_primary_metric_as_its_score():
    """An evaluator whose primary_metric is None (one that returns a float): its score is the "evaluator" metric,
    as sentence-transformers 6.3 reads it (6.2 and bertkit failed in str.endswith(None))."""
    from types import SimpleNamespace

    from bertkit.sentence.fit import _ScoreCallback

    calls = []
    callback = _ScoreCallback(lambda *a: calls.append(a), SimpleNamespace(primary_metric=None))
    callback.on_evaluate(None, SimpleNamespace(epoch=1.0, global_step=4), None, metrics={"eval_evaluator": 0.25})
    assert calls == [(0.25, 1.0, 4)]


RERANK = [(f"question {i}", f"paragraph {i // 2}" if i % 3 else f"unrelated {i}", float(i % 3 != 0)) for i in range(10)]


def _cross_fit(lib: str, model_dir, out, monkeypatch, loss_fct: bool = False):
    """CrossEncoder.fit's script: each step's loss (BinaryCrossEntropyLoss's, fit's default; ``loss_fct``: the same
    loss as torch's BCEWithLogitsLoss through fit's loss_fct), the evaluator's CSV rows, fit's callback calls and the
    trained model's scores of the pairs."""
    if lib == "sentence_transformers":
        import sentence_transformers as S
        from sentence_transformers.cross_encoder import CrossEncoder
        from sentence_transformers.cross_encoder.evaluation import CrossEncoderCorrelationEvaluator
        from sentence_transformers.cross_encoder.losses import BinaryCrossEntropyLoss
    else:
        import bertkit.sentence as S
        from bertkit.sentence.cross_encoder import CrossEncoder
        from bertkit.sentence.cross_encoder.evaluation import CrossEncoderCorrelationEvaluator
        from bertkit.sentence.cross_encoder.losses import BinaryCrossEntropyLoss
    model = CrossEncoder(str(model_dir), max_length=16, device="cpu")
    examples = [S.InputExample(texts=[q, p], label=y) for q, p, y in RERANK]
    evaluator = CrossEncoderCorrelationEvaluator([[q, p] for q, p, _ in RERANK], [y for _, _, y in RERANK], name="dev")
    calls, losses_seen = [], []

    def recorded(forward):
        def record(self, *args):
            value = forward(self, *args)
            losses_seen.append(value.item())
            return value
        return record

    bce = torch.nn.BCEWithLogitsLoss
    if loss_fct:
        class Recorded(bce):
            forward = recorded(bce.forward)
    else:
        monkeypatch.setattr(BinaryCrossEntropyLoss, "forward", recorded(BinaryCrossEntropyLoss.forward))
    torch.manual_seed(3)
    model.fit(torch.utils.data.DataLoader(examples, shuffle=True, batch_size=4), evaluator=evaluator, epochs=2,
              loss_fct=Recorded() if loss_fct else None, warmup_steps=1, optimizer_params={"lr": 1e-4},
              output_path=str(out), show_progress_bar=False,
              callback=lambda score, epoch, steps: calls.append((score, epoch, steps)))
    monkeypatch.undo()
    rows = (out / "eval" / "CrossEncoderCorrelationEvaluator_dev_results.csv").read_text().splitlines()[1:]
    csv = [tuple(float(v) for v in row.split(",")) for row in rows]
    return losses_seen, csv, calls, model.predict([[q, p] for q, p, _ in RERANK])


# fit's default loss in make test; the same loss handed in as loss_fct (the same fit around it) in make test-slow
@pytest.mark.parametrize("loss_fct", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["default", "loss_fct"])
def test_cross_encoder_fit_gives_sentence_transformers_numbers(loss_fct, minilm_2_layers, tmp_path, monkeypatch,
                                                              one_thread):
    """CrossEncoder.fit with its default loss (BinaryCrossEntropyLoss), and with the same loss as a torch loss_fct
    (against sentence-transformers 6.3's fit given the same loss_fct, which 6.2's failed on: its FitMixinLoss called
    the model as a transformers model): the same loss at every step, the same evaluations at each epoch's end (its CSV)
    and the same trained model. On one thread: on two, on a Xeon with AMX, the first epoch's Pearson correlation of
    scores still close together came out 2.6e-5 (relative) from sentence-transformers', the two libraries' float32
    sums split differently over the threads. fit's callback gets each evaluation and output_path the best epoch's
    model, in both (sentence-transformers 6.2's epoch-end evaluation was never handed the trainer, so its callback got
    none and nothing was saved; 6.3 hands it, as bertkit did)."""
    from bertkit.sentence.cross_encoder import CrossEncoder
    from cross_encoder_helpers import cross_encoder_directory

    monkeypatch.chdir(tmp_path)  # fit's trainer directory: checkpoints/model under the working directory
    model_dir = cross_encoder_directory(minilm_2_layers, tmp_path / "ce")
    want_losses, want_csv, want_calls, want_pred = _cross_fit("sentence_transformers", model_dir, tmp_path / "st",
                                                              monkeypatch, loss_fct)
    monkeypatch.chdir(tmp_path)
    got_losses, got_csv, got_calls, got_pred = _cross_fit("bertkit", model_dir, tmp_path / "bk", monkeypatch, loss_fct)
    assert len(got_losses) == len(want_losses) == 6  # 3 batches of 10 rows, 2 epochs
    np.testing.assert_allclose(got_losses, want_losses, rtol=1e-5)
    assert [r[:2] for r in got_csv] == [r[:2] for r in want_csv] == [(1.0, 3.0), (2.0, 6.0)]
    np.testing.assert_allclose([r[2:] for r in got_csv], [r[2:] for r in want_csv], rtol=1e-5)
    np.testing.assert_allclose(got_pred, want_pred, atol=1e-5)
    assert got_calls == [(spearman, epoch, int(steps)) for epoch, steps, _, spearman in got_csv]
    assert [c[1:] for c in got_calls] == [c[1:] for c in want_calls]
    np.testing.assert_allclose([c[0] for c in got_calls], [c[0] for c in want_calls], rtol=1e-5)
    assert (tmp_path / "st" / "config.json").is_file() and (tmp_path / "bk" / "config.json").is_file()
    assert (tmp_path / "checkpoints" / "model").is_dir()
    if got_csv[1][3] > got_csv[0][3]:  # the last epoch's model is the best: the one saved
        saved = CrossEncoder(str(tmp_path / "bk"), max_length=16).predict([[q, p] for q, p, _ in RERANK])
        np.testing.assert_allclose(saved, got_pred, atol=1e-6)
    else:
        assert (tmp_path / "bk" / "config.json").is_file()


def test_fit_never_keeps_a_nan_evaluation_as_the_best_model(tmp_path):
    """Was: a first evaluation of NaN (a custom evaluator's, or a Spearman correlation of constant scores) was saved
    to output_path as the best, and no later score beat it (``0.5 > nan`` is False): the NaN model stayed there."""
    from types import SimpleNamespace

    from bertkit.sentence.fit import _SaveModel

    saved = []
    model = SimpleNamespace(save=lambda path: saved.append((path, score)))
    keep = _SaveModel(str(tmp_path / "out"), SimpleNamespace(primary_metric="spearman"), True, True)
    for step, score in enumerate([float("nan"), 0.2, float("nan"), 0.5, 0.4], start=1):
        keep.on_evaluate(None, SimpleNamespace(global_step=step), None, metrics={"eval_sts_spearman": score},
                         model=model)
    assert saved == [(str(tmp_path / "out"), 0.2), (str(tmp_path / "out"), 0.5)] and keep.best == 0.5
