"""Label-grouped training in bertkit.sentence, against sentence-transformers: ``BatchSamplers.GROUP_BY_LABEL`` draws
its GroupByLabelBatchSampler's batches (one dataset and several, for many seeds, sizes and epochs), the batch
triplet losses give its numbers and gradients on the same embeddings for each distance, and a (sentence, label)
training script on SST-2 gives its loss at every step, its eval_loss and its evaluator's metric; what the sampler or
the losses cannot train on is refused by name before anything is written."""

from __future__ import annotations

import functools
import random

import numpy as np
import pytest
import torch

from bertkit.errors import BertkitError
from bertkit.sentence import (
    SentenceTransformer,
    SentenceTransformerTrainer,
    SentenceTransformerTrainingArguments,
    losses,
)
from bertkit.sentence.data import (
    group_by_label_batches,
    group_by_label_count,
    label_groups,
    multi_dataset_batches,
    paired_groups,
)
from bertkit.sentence.training_args import BatchSamplers
from sentence_helpers import glue_rows, st_args, st_directory

datasets = pytest.importorskip("datasets")
st_sampler = pytest.importorskip("sentence_transformers.base.sampler")
st_losses = pytest.importorskip("sentence_transformers.sentence_transformer.losses")

LOSSES = ("BatchHardTripletLoss", "BatchAllTripletLoss", "BatchSemiHardTripletLoss", "BatchHardSoftMarginTripletLoss")


class _Labels:
    """A dataset's label column, as the multi-dataset batches read it."""

    label = "label"

    def __init__(self, labels: list[int]):
        self.labels = labels

    def __len__(self) -> int:
        return len(self.labels)

    def label_column(self) -> list[int]:
        return self.labels


def _dataset(labels: list[int]):
    return datasets.Dataset.from_dict({"text": [f"t{i}" for i in range(len(labels))], "label": labels})


def _st(dataset, batch: int, generator: torch.Generator, seed: int, drop_last: bool = False):
    return st_sampler.GroupByLabelBatchSampler(dataset, batch, drop_last=drop_last, valid_label_columns=["label"],
                                               generator=generator, seed=seed)


def test_batches_are_sentence_transformers():
    """The same batches as sentence-transformers' sampler, and as many (its len), over random label mixes (a label of
    one row, odd counts, a dominant label), batch sizes and epochs; for several datasets, in its proportional and
    round-robin order, the datasets' samplers sharing one generator that each reseeds at its first batch and draws
    from as its batches are taken."""
    rng = random.Random(0)
    for _ in range(60):
        labels = [rng.randrange(rng.randint(2, 5)) for _ in range(rng.randint(6, 40))]
        batch, seed = rng.choice([4, 6, 8, 10]), rng.randrange(100)
        try:
            sampler = _st(_dataset(labels), batch, torch.Generator().manual_seed(seed), seed)
        except ValueError:
            with pytest.raises(BertkitError):
                paired_groups(label_groups(labels, "label", "train_dataset"), batch, "train_dataset")
            continue
        groups = paired_groups(label_groups(labels, "label", "train_dataset"), batch, "train_dataset")
        dropping = _st(_dataset(labels), batch, torch.Generator().manual_seed(seed), seed, drop_last=True)
        for epoch in (0, 1):
            for drop_last, reference in ((False, sampler), (True, dropping)):  # dataloader_drop_last's
                reference.set_epoch(epoch)
                want = list(reference)
                assert list(group_by_label_batches(groups, batch, torch.Generator(), seed + epoch, drop_last)) == want
                assert group_by_label_count(groups, batch, drop_last) == len(reference) == len(want)
    for _ in range(20):
        parts = [[rng.randrange(rng.randint(2, 4)) for _ in range(rng.randint(8, 24))] for _ in range(rng.randint(2, 3))]
        batch, seed = rng.choice([4, 6]), rng.randrange(100)
        generator = torch.Generator().manual_seed(seed)
        children = [_st(_dataset(p), batch, generator, seed) for p in parts]
        concat = torch.utils.data.ConcatDataset([_dataset(p) for p in parts])
        for cls, round_robin in ((st_sampler.ProportionalBatchSampler, False), (st_sampler.RoundRobinBatchSampler, True)):
            sampler = cls(concat, children, generator=generator, seed=seed)
            for epoch in (0, 1):
                sampler.set_epoch(epoch)
                want = list(sampler)[:len(sampler)]
                got = multi_dataset_batches([_Labels(p) for p in parts], batch, seed + epoch, round_robin,
                                            "group_by_label")
                assert got == want, (parts, batch, seed, cls.__name__, epoch)


class _Model(torch.nn.Module):
    pass


@pytest.mark.parametrize("name", LOSSES)
def test_losses_and_gradients_are_sentence_transformers(name):
    """On the same embeddings and labels (batches of 4 to 16, 2 to 5 labels, a row repeated), each loss at each
    distance (euclidean, squared, cosine) and margin gives sentence-transformers' value and gradient."""
    torch.manual_seed(0)
    bk_fn, st_fn = losses.BatchHardTripletLossDistanceFunction, st_losses.BatchHardTripletLossDistanceFunction
    distances = [(bk_fn.euclidean_distance, st_fn.euclidean_distance), (bk_fn.cosine_distance, st_fn.cosine_distance),
                 (functools.partial(bk_fn.euclidean_distance, squared=True),
                  functools.partial(st_fn.euclidean_distance, squared=True))]
    margins = [{}] if name == "BatchHardSoftMarginTripletLoss" else [{}, {"margin": 0.3}]
    checked = 0
    for rows, classes, scale in ((4, 2, 1.0), (8, 3, 0.1), (16, 5, 1.0), (6, 2, 0.1)):
        labels = torch.randint(0, classes, (rows,))
        embeddings = torch.randn(rows, 12) * scale
        embeddings[1] = embeddings[0]  # a text twice: distance 0, where sqrt's gradient is infinite
        for (bk_distance, st_distance) in distances:
            for margin in margins:
                got_in, want_in = embeddings.clone().requires_grad_(), embeddings.clone().requires_grad_()
                got = getattr(losses, name)(_Model(), distance_metric=bk_distance, **margin)
                want = getattr(st_losses, name)(_Model(), distance_metric=st_distance, **margin)
                got_value = got.compute_loss_from_embeddings([got_in], labels)
                want_value = want.compute_loss_from_embeddings([want_in], labels)
                got_value.backward()
                want_value.backward()
                torch.testing.assert_close(got_value, want_value, rtol=1e-6, atol=0)
                torch.testing.assert_close(got_in.grad, want_in.grad, rtol=1e-5, atol=1e-7)
                checked += want_value.item() > 0
    assert checked > 10


def _sst2(data_dir, split: str, n: int) -> list[dict]:
    rows = glue_rows(data_dir, "SST-2", split, n)
    return [{"sentence": s, "label": int(label)} for s, label in rows]


def _train(lib: str, model_dir, out_dir, loss_name: str, train: list[dict], dev: list[dict], drop_last: bool = False):
    """The training script, ``lib`` picking the import: every loss computed (training and evaluation, with its
    batch's rows) and the evaluations' eval_loss and evaluator metric; with ``drop_last``, one epoch under
    dataloader_drop_last and no evaluation."""
    if lib == "sentence_transformers":
        import sentence_transformers as S
        from sentence_transformers.base.sampler import BatchSamplers as Samplers
        from sentence_transformers.sentence_transformer import evaluation
        from sentence_transformers.sentence_transformer import losses as L
    else:
        import bertkit.sentence as S
        from bertkit.sentence import evaluation
        from bertkit.sentence import losses as L
        from bertkit.sentence.training_args import BatchSamplers as Samplers
    model = S.SentenceTransformer(str(model_dir), device="cpu")
    seen = []

    class Recorded(getattr(L, loss_name)):
        def forward(self, features, labels):
            value = super().forward(features, labels)
            seen.append((torch.is_grad_enabled(), len(features[0]["input_ids"]), value.item()))
            return value

    distance = L.BatchHardTripletLossDistanceFunction.cosine_distance
    loss = Recorded(model, distance_metric=distance, **({"margin": 0.5} if "SoftMargin" not in loss_name else {}))
    evaluator = evaluation.BinaryClassificationEvaluator([r["sentence"] for r in dev[:6]],
                                                         [r["sentence"] for r in dev[6:12]],
                                                         [int(a["label"] == b["label"]) for a, b in zip(dev, dev[6:12])],
                                                         name="sst2")
    schedule = ({"num_train_epochs": 1, "eval_strategy": "no", "dataloader_drop_last": True} if drop_last else
                {"max_steps": 4, "eval_strategy": "steps", "eval_steps": 4})
    args = S.SentenceTransformerTrainingArguments(
        output_dir=str(out_dir), per_device_train_batch_size=6, per_device_eval_batch_size=4, learning_rate=1e-4,
        logging_steps=1, save_strategy="no", report_to="none", seed=3, use_cpu=True, disable_tqdm=True,
        batch_sampler=Samplers.GROUP_BY_LABEL, **schedule)
    evaluation_set = {} if drop_last else {"eval_dataset": datasets.Dataset.from_list(dev), "evaluator": evaluator}
    trainer = S.SentenceTransformerTrainer(model=model, args=args, train_dataset=datasets.Dataset.from_list(train),
                                           loss=loss, **evaluation_set)
    trainer.train()
    evaluations = [(r["eval_loss"], r["eval_sst2_cosine_ap"]) for r in trainer.state.log_history if "eval_loss" in r]
    return seen, evaluations


@pytest.mark.parametrize("loss", ["BatchSemiHardTripletLoss",
                                  pytest.param("BatchHardSoftMarginTripletLoss", marks=pytest.mark.slow)])
def test_training_script_gives_sentence_transformers_numbers(loss, minilm_2_layers, data_dir, tmp_path):
    """22 (sentence, label) rows of SST-2 (13 negative, 9 positive), batches of 6 grouped by label, cosine distance:
    batches of 6, 6 and 4 an epoch (pairs of each label in turn until the positives run out: 6 rows left out), the
    same rows and the same loss at every step, the same evaluation batches (a row of an odd label count left out)
    and eval_loss (weighted as transformers' loop weighs them), and the same evaluator metric."""
    model_dir = st_directory(minilm_2_layers, tmp_path / "m", dropout=0.0, max_seq_length=16)
    train, dev = _sst2(data_dir, "train", 22), _sst2(data_dir, "dev", 13)
    want = _train("sentence_transformers", model_dir, tmp_path / "st", loss, train, dev)
    got = _train("bertkit", model_dir, tmp_path / "bk", loss, train, dev)
    (want_seen, want_evals), (got_seen, got_evals) = want, got
    assert [s[:2] for s in got_seen] == [s[:2] for s in want_seen]
    assert [s[1] for s in got_seen if s[0]] == [6, 6, 4, 6] and any(s[2] > 0 for s in want_seen)
    np.testing.assert_allclose([s[2] for s in got_seen], [s[2] for s in want_seen], rtol=1e-5, atol=1e-7)
    assert len(got_evals) == len(want_evals) == 1
    np.testing.assert_allclose(got_evals, want_evals, rtol=1e-5, atol=1e-7)


def test_dataloader_drop_last_leaves_out_the_short_grouped_batch_as_sentence_transformers(minilm_2_layers, data_dir,
                                                                                           tmp_path):
    """dataloader_drop_last=True with GROUP_BY_LABEL: the epoch's batches of 6, 6 and 4 lose the 4, in both libraries,
    with the same losses (bertkit refused the pair before)."""
    model_dir = st_directory(minilm_2_layers, tmp_path / "m", dropout=0.0, max_seq_length=16)
    train = _sst2(data_dir, "train", 22)
    want, _ = _train("sentence_transformers", model_dir, tmp_path / "st", "BatchHardTripletLoss", train, train, True)
    got, _ = _train("bertkit", model_dir, tmp_path / "bk", "BatchHardTripletLoss", train, train, True)
    assert [s[:2] for s in got] == [s[:2] for s in want] == [(True, 6), (True, 6)]
    np.testing.assert_allclose([s[2] for s in got], [s[2] for s in want], rtol=1e-5, atol=1e-7)


def test_what_cannot_be_grouped_is_refused_before_anything_is_written(minilm_2_layers, tmp_path):
    """Labels that are no class ids (texts, floats; True/False are two classes, 1 and 0, as sentence-transformers
    compares them: tests/test_bool_labels.py), a dataset without a label column, too few rows per
    label, a batch the sampler cannot fill with pairs (train or eval), a bad margin or distance, and a second text
    column: each refused by name, when the loss or the trainer is made."""
    model = SentenceTransformer(minilm_2_layers)
    grouped = st_args(tmp_path, batch_sampler=BatchSamplers.GROUP_BY_LABEL, per_device_train_batch_size=4)
    rows = [{"text": f"sentence {i}", "label": i % 2} for i in range(8)]
    loss = losses.BatchHardTripletLoss(model)

    def train(data, args=grouped, eval_dataset=None, loss=loss):
        SentenceTransformerTrainer(model=model, args=args, train_dataset=data, eval_dataset=eval_dataset, loss=loss)

    for label, kind in (("pos", "str"), (1.0, "float")):
        bad = [dict(r) for r in rows]
        bad[3]["label"] = label
        with pytest.raises(BertkitError, match=rf"train_dataset: row 3 has label {label!r} \({kind}\); the rows are "
                                               "grouped by label, which must be class ids"):
            train(bad)
        with pytest.raises(BertkitError, match=r"row 3 has label"):  # also with the default sampler, and wrapped
            train(bad, args=st_args(tmp_path))
        with pytest.raises(BertkitError, match=r"row 3 has label"):
            train(bad, args=st_args(tmp_path), loss=losses.MatryoshkaLoss(model, loss, [384, 64]))
    with pytest.raises(BertkitError, match=r"train_dataset has no label column: rows are grouped and compared by "
                                           r"their label, so add a 'label' column"):
        train([{"a": f"q{i}", "b": f"p{i}"} for i in range(8)], loss=losses.MultipleNegativesRankingLoss(model))
    with pytest.raises(BertkitError, match=r"needs two labels with two rows or more each .* the rows per label are "
                                           r"\{0: 7, 1: 1\}"):
        train([{"text": f"s{i}", "label": int(i == 7)} for i in range(8)])
    for size in (2, 5):
        with pytest.raises(BertkitError, match=rf"train_dataset: batch_sampler=GROUP_BY_LABEL .* an even number >= 4, "
                                               rf"got {size}"):
            train(rows, args=st_args(tmp_path, batch_sampler="group_by_label", per_device_train_batch_size=size))
    with pytest.raises(BertkitError, match=r"eval_dataset: batch_sampler=GROUP_BY_LABEL .* got 3"):
        train(rows, args=st_args(tmp_path, batch_sampler="group_by_label", per_device_train_batch_size=4,
                                 per_device_eval_batch_size=3), eval_dataset=rows)
    with pytest.raises(BertkitError, match=r"BatchHardTripletLoss takes 1 text column\(s\) and a label column"):
        train([{"a": f"q{i}", "b": f"p{i}", "label": i % 2} for i in range(8)])
    with pytest.raises(BertkitError, match=r"BatchHardTripletLoss uses the batch's other rows as negatives, and a "
                                           r"batch of 1 holds none"):
        train(rows, args=st_args(tmp_path, per_device_train_batch_size=1))
    for margin in (-1, float("nan"), "5"):
        with pytest.raises(BertkitError, match=r"BatchAllTripletLoss: margin must be a finite number >= 0"):
            losses.BatchAllTripletLoss(model, margin=margin)
    with pytest.raises(BertkitError, match=r"distance_metric must be a function of the \(B, D\) embeddings"):
        losses.BatchSemiHardTripletLoss(model, distance_metric="cosine")
    with pytest.raises(BertkitError, match=r"distance_metric gave \(4,\) for 4 embeddings"):
        losses.BatchHardTripletLoss(model, distance_metric=lambda e: e.sum(1)).compute_loss_from_embeddings(
            [torch.randn(4, 8)], torch.tensor([0, 0, 1, 1]))
    with pytest.raises(BertkitError, match=r"compares labels as class ids, got torch.float32 labels"):
        loss.compute_loss_from_embeddings([torch.randn(4, 8)], torch.tensor([0.0, 0.0, 1.0, 1.0]))
    assert not (tmp_path / "out").exists()


def test_a_run_resumes_only_under_its_batch_sampler(minilm_2_layers, tmp_path):
    """Stopped after step 2 of 4 and resumed, a label-grouped run trains the uninterrupted run's batches to its
    losses; resumed under another batch_sampler (either way), it is refused naming it, where it went on with other
    batches without a word."""
    from bertkit.training.callbacks import TrainerCallback

    model_dir = st_directory(minilm_2_layers, tmp_path / "m", dropout=0.0, max_seq_length=8)
    rows = [{"text": f"sentence {i}", "label": i % 3} for i in range(14)]

    class StopAt2(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            control.should_training_stop = state.global_step == 2

    def run(out, sampler, resume=None, stop=False):
        model = SentenceTransformer(model_dir)
        args = SentenceTransformerTrainingArguments(
            output_dir=str(out), per_device_train_batch_size=4, max_steps=4, save_steps=2, logging_steps=1, seed=4,
            batch_sampler=sampler, report_to="none", use_cpu=True, disable_tqdm=True)
        trainer = SentenceTransformerTrainer(model=model, args=args, train_dataset=rows,
                                             loss=losses.BatchAllTripletLoss(model, margin=0.5),
                                             callbacks=[StopAt2()] if stop else None)
        trainer.train(resume_from_checkpoint=resume)
        return [r["loss"] for r in trainer.state.log_history if "loss" in r]

    whole = run(tmp_path / "whole", "group_by_label")
    run(tmp_path / "cut", "group_by_label", stop=True)
    with pytest.raises(BertkitError, match=r"other settings or data .*'samplers': \(\{'batch_sampler': "
                                           r"'group_by_label'\}, None\)"):
        run(tmp_path / "cut", "batch_sampler", resume=True)
    assert run(tmp_path / "cut", "group_by_label", resume=True) == whole and len(whole) == 4
    run(tmp_path / "plain", "batch_sampler", stop=True)
    with pytest.raises(BertkitError, match=r"'samplers': \(None, \{'batch_sampler': 'group_by_label'\}\)"):
        run(tmp_path / "plain", "group_by_label", resume=True)


def _fit(lib: str, model_dir, workdir, monkeypatch, texts: list[str], labels: list[int]):
    """The legacy fit script of sentence-transformers' batch-hard examples (a SentenceLabelDataset of InputExample,
    BatchAllTripletLoss); ``lib`` picks the import. Each step's labels and loss."""
    if lib == "sentence_transformers":
        import sentence_transformers as S
        from sentence_transformers import losses as L
        from sentence_transformers.datasets import SentenceLabelDataset
    else:
        import bertkit.sentence as S
        from bertkit.sentence import losses as L
        from bertkit.sentence.datasets import SentenceLabelDataset
    monkeypatch.chdir(workdir)  # fit's trainer directory: checkpoints/model under the working directory
    model = S.SentenceTransformer(str(model_dir), device="cpu")
    seen = []

    class Recorded(L.BatchAllTripletLoss):
        def forward(self, features, labels):
            value = super().forward(features, labels)
            seen.append((labels.tolist(), value.item()))
            return value

    np.random.seed(3)  # SentenceLabelDataset draws from numpy's global generator
    data = SentenceLabelDataset([S.InputExample(texts=[t], label=c) for t, c in zip(texts, labels)])
    model.fit(train_objectives=[(torch.utils.data.DataLoader(data, batch_size=4), Recorded(model, margin=0.5))],
              epochs=2, warmup_steps=1, show_progress_bar=False)
    return seen


def test_fit_on_a_sentence_label_dataset_is_sentence_transformers(minilm_2_layers, data_dir, tmp_path, monkeypatch):
    """``model.fit`` on a DataLoader of a SentenceLabelDataset (STS-B sentences, their scores rounded to 6 classes):
    the dataset's pass draws the same examples, fit batches them grouped by label, and every step trains on the
    same labels to the same loss, as in sentence-transformers (where bertkit had no such dataset)."""
    model_dir = st_directory(minilm_2_layers, tmp_path / "m", dropout=0.0, max_seq_length=16)
    rows = glue_rows(data_dir, "STS-B", "train", 24)
    texts, labels = [r[7] for r in rows], [int(round(float(r[9]))) for r in rows]
    for lib in ("sentence_transformers", "bertkit"):
        (tmp_path / lib).mkdir()
    want = _fit("sentence_transformers", model_dir, tmp_path / "sentence_transformers", monkeypatch, texts, labels)
    got = _fit("bertkit", model_dir, tmp_path / "bertkit", monkeypatch, texts, labels)
    assert [g[0] for g in got] == [w[0] for w in want] and len(got) >= 4
    assert all(len(set(g[0])) >= 2 for g in got)  # pairs of two labels or more a batch
    np.testing.assert_allclose([g[1] for g in got], [w[1] for w in want], rtol=1e-5, atol=1e-7)
    with pytest.raises(BertkitError, match=r"datasets.NoDuplicatesDataLoader is not implemented in bertkit: give fit a "
                                           r"DataLoader"):
        from bertkit.sentence.datasets import NoDuplicatesDataLoader  # noqa: F401
