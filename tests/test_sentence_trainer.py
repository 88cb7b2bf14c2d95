"""bertkit.sentence's trainer and arguments: what a user can get wrong is named before anything is written, the
no-duplicates sampler makes sentence-transformers' batches, and a trained model is saved as a sentence-transformers directory."""

from __future__ import annotations

import collections
import re
import sys
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from bertkit.errors import BertkitError
from bertkit.sentence import (
    SentenceTransformer,
    SentenceTransformerTrainer,
    SentenceTransformerTrainingArguments,
    evaluation,
    losses,
)
from bertkit.sentence.cross_encoder import CrossEncoder, CrossEncoderTrainer, CrossEncoderTrainingArguments
from bertkit.sentence.cross_encoder import losses as ce_losses
from bertkit.sentence.data import SentenceExamples, no_duplicates_batches
from bertkit.sentence.training_args import BatchSamplers
from bertkit.training.callbacks import TrainerCallback
from cases import slow_after
from cross_encoder_helpers import cross_encoder_directory
from sentence_helpers import POOLING, st_args, st_directory

PAIRS = [{"anchor": f"question {i}", "positive": f"paragraph {i // 2}"} for i in range(12)]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, minilm_2_layers, tiny_checkpoint):
    """A tiny random encoder with MiniLM's tokenizer, drawn at 0.5 (texts' embeddings far apart, as a trained one's):
    the checks compare with sentence-transformers on the same weights or check what a run leaves, none MiniLM's
    numbers, which cost most of their time and checkpoints. MiniLM's 6 layers' optimiser groups take ``minilm_st``."""
    out = tmp_path_factory.mktemp("st")
    base = tiny_checkpoint(out / "base", tokenizer=minilm_2_layers, hidden_size=64, intermediate_size=128,
                           initializer_range=0.5)
    return st_directory(base, out / "m", dropout=0.0, max_seq_length=32,
                        pooling={**POOLING, "word_embedding_dimension": 64})


@pytest.fixture(scope="module")
def minilm_st(tmp_path_factory, minilm_dir):
    return st_directory(minilm_dir, tmp_path_factory.mktemp("st") / "minilm", dropout=0.0, max_seq_length=32)


@pytest.fixture(scope="module")
def model(model_dir):
    return SentenceTransformer(model_dir)


def test_bad_input_is_named_before_anything_is_written(model, tmp_path):
    mnrl = losses.MultipleNegativesRankingLoss(model)
    with pytest.raises(BertkitError, match=r"text columns \['anchor'\].*takes 2 or more text column"):
        SentenceTransformerTrainer(model=model, args=st_args(tmp_path), loss=mnrl,
                                   train_dataset=[{"anchor": p["anchor"]} for p in PAIRS])
    with pytest.raises(BertkitError, match="CoSENTLoss takes 2 text column.*label column"):
        SentenceTransformerTrainer(model=model, args=st_args(tmp_path), loss=losses.CoSENTLoss(model), train_dataset=PAIRS)
    with pytest.raises(BertkitError, match="TripletLoss takes 3 text column"):
        SentenceTransformerTrainer(model=model, args=st_args(tmp_path), loss=losses.TripletLoss(model), train_dataset=PAIRS)
    with pytest.raises(BertkitError, match="a batch of 1 holds none: set per_device_train_batch_size to 2"):
        SentenceTransformerTrainer(model=model, args=st_args(tmp_path, per_device_train_batch_size=1), loss=mnrl,
                                   train_dataset=PAIRS)
    with pytest.raises(BertkitError, match=r"router_mapping=\{'anchor': 'query'\} maps columns to a Router's routes, "
                                           "and a bertkit SentenceTransformer has no Router: drop router_mapping "
                                           r"\(sentence-transformers ignores it on a model without a Router\)"):
        SentenceTransformerTrainer(model=model, args=st_args(tmp_path, router_mapping={"anchor": "query"}), loss=mnrl,
                                   train_dataset=PAIRS)
    with pytest.raises(BertkitError, match=r"batch_sampler 'by_label' is not implemented: give one of \['batch_sampler', "
                                           r"'no_duplicates', 'no_duplicates_hashed', 'group_by_label'\]"):
        st_args(tmp_path, batch_sampler="by_label")
    with pytest.raises(BertkitError, match="optimizers"):
        SentenceTransformerTrainer(model=model, args=st_args(tmp_path), loss=mnrl, train_dataset=PAIRS,
                                   optimizers=(object(), None))
    for reserved in ("dataset_name", "return_loss"):  # sentence-transformers refuses both; a text column otherwise
        with pytest.raises(BertkitError, match=rf"train_dataset has the column\(s\) \['{reserved}'\], whose names "
                                               r"sentence-transformers reserves.*dataset.remove_columns"):
            SentenceTransformerTrainer(model=model, args=st_args(tmp_path), loss=mnrl,
                                       train_dataset=[{**p, reserved: "x"} for p in PAIRS])
    holes = [{**p, "positive": None if i == 9 else p["positive"]} for i, p in enumerate(PAIRS)]  # not at the first step
    with pytest.raises(BertkitError, match=r"train_dataset: row 9, column 'positive' holds None, not a text.*"
                                           r"dataset.filter"):
        SentenceTransformerTrainer(model=model, args=st_args(tmp_path), loss=mnrl, train_dataset=holes)
    columns = {"anchor": [p["anchor"] for p in PAIRS], "positive": [p["positive"] for p in PAIRS]}
    with pytest.raises(BertkitError, match=r"train_dataset\['anchor'\]: row 0 is 'question 0' \(str\), not a dict of "
                                           r"columns; give a datasets.Dataset \(Dataset.from_dict"):
        SentenceTransformerTrainer(model=model, args=st_args(tmp_path), loss=mnrl, train_dataset=columns)
    with pytest.raises(BertkitError, match=r"train_dataset: row 0 is 'question 0' \(str\), not a dict of columns"):
        SentenceTransformerTrainer(model=model, args=st_args(tmp_path), loss=mnrl, train_dataset=columns["anchor"])
    with pytest.raises(BertkitError, match=r"relevant document id\(s\) are not in the corpus, e.g. \['d9'\]"):
        evaluation.InformationRetrievalEvaluator({"q": "a question"}, {"d1": "a doc"}, {"q": {"d1", "d9"}})
    assert not (tmp_path / "out").exists()


def test_no_duplicates_batches_are_sentence_transformers(model):
    """The no-duplicates sampler's batches are sentence-transformers' NoDuplicatesBatchSampler's, row for row, also
    where duplicates cannot be kept apart in full batches (a smaller batch then, where bertkit used to refuse)."""
    st_sampler = pytest.importorskip("sentence_transformers.base.sampler")
    datasets = pytest.importorskip("datasets")
    mnrl = losses.MultipleNegativesRankingLoss(model)
    for pairs in ([{"anchor": f"question {i}", "positive": f"paragraph {i // 3}"} for i in range(24)],
                  [{"anchor": f"q{i}", "positive": "the same paragraph" if i < 3 else f"p{i}"} for i in range(8)]):
        examples = SentenceExamples(pairs, model, mnrl, None, {}, "train_dataset")
        dataset = datasets.Dataset.from_list(pairs)
        short = 0
        for seed in range(12):
            want = list(st_sampler.NoDuplicatesBatchSampler(dataset, 4, drop_last=False, generator=torch.Generator(),
                                                            seed=seed))
            got = no_duplicates_batches(examples, 4, seed)
            assert got == want
            short += sum(len(b) < 4 for b in got[:-1])
            for batch in got:
                paragraphs = [pairs[i]["positive"] for i in batch]
                assert len(set(paragraphs)) == len(paragraphs)
        assert short > 0  # some seeds need a smaller batch before the last


def test_no_duplicates_trains_where_duplicates_cannot_be_kept_apart(model, tmp_path):
    """3 rows share a paragraph and 8 rows make 2 batches of 4: sentence-transformers trains on smaller batches (the
    first ceil(8 / 4) of them each epoch); so does bertkit, where it used to refuse."""
    pairs = [{"anchor": f"q{i}", "positive": "the same paragraph" if i < 3 else f"p{i}"} for i in range(8)]
    args = st_args(tmp_path, per_device_train_batch_size=4, batch_sampler=BatchSamplers.NO_DUPLICATES, max_steps=3,
                   learning_rate=1e-5, save_strategy="no", logging_steps=1, seed=3, warmup_steps=10)
    trainer = SentenceTransformerTrainer(model=model, args=args, loss=losses.MultipleNegativesRankingLoss(model),
                                         train_dataset=pairs)
    assert [len(b) for b in no_duplicates_batches(trainer.train_dataset, 4, 3)] == [4, 3, 1]
    assert trainer.train().global_step == 3
    # warmup_steps past the run's 3 steps (refused before): each step's rate is step / 10 of the peak throughout, as
    # transformers' schedule gives it
    rates = [r["learning_rate"] for r in trainer.state.log_history if "learning_rate" in r]
    assert rates == pytest.approx([0.0, 1e-6, 2e-6])


def test_training_saves_a_sentence_transformers_directory(model, tmp_path):
    loss = losses.MatryoshkaLoss(model, losses.CachedMultipleNegativesRankingLoss(model, mini_batch_size=2), [64, 32])
    args = st_args(tmp_path, per_device_train_batch_size=4, max_steps=2, learning_rate=1e-4, save_strategy="no",
                   prompts={"anchor": "query: "})
    before = model.encode(["query: question 1"])
    result = SentenceTransformerTrainer(model=model, args=args, train_dataset=PAIRS, loss=loss).train()
    assert result.global_step == 2 and result.training_loss > 0
    assert abs(model.encode(["query: question 1"]) - before).max() > 1e-4
    SentenceTransformerTrainer(model=model, args=args, train_dataset=PAIRS, loss=loss).save_model(tmp_path / "saved")
    again = SentenceTransformer(tmp_path / "saved")
    assert abs(again.encode(["question 1"], truncate_dim=32) - model.encode(["question 1"], truncate_dim=32)).max() == 0


@pytest.mark.parametrize("mapping", [{}, {r"0\.model\.encoder\.layer\.[0-2]\.": 1e-4, r"LayerNorm": 3e-5},
                                     {r"\.0\.": 1e-4}])
def test_learning_rate_mapping_selects_sentence_transformers_parameters(mapping, minilm_st, tmp_path):
    r"""The dense trainer's optimiser groups are sentence-transformers': the loss's parameter names are its
    (``model.0.model.…``; r"\.0\." matches every encoder parameter there, and would match layer 0 alone under
    names such as ``model.bert.…``), and each parameter has the same rate and weight decay (the pooler aside, which
    bertkit does not train: no part of a sentence embedding)."""
    st = pytest.importorskip("sentence_transformers")
    datasets = pytest.importorskip("datasets")
    from sentence_transformers.sentence_transformer import losses as st_losses

    import bertkit.sentence

    rates = {}
    for lib, S, L in (("sentence_transformers", st, st_losses), ("bertkit", bertkit.sentence, losses)):
        encoder = S.SentenceTransformer(str(minilm_st), device="cpu")
        loss = L.MultipleNegativesRankingLoss(encoder)
        args = S.SentenceTransformerTrainingArguments(output_dir=str(tmp_path / lib), learning_rate=2e-5,
                                                      weight_decay=0.1, report_to="none", use_cpu=True,
                                                      learning_rate_mapping=mapping)
        trainer = S.SentenceTransformerTrainer(model=encoder, args=args, train_dataset=datasets.Dataset.from_list(PAIRS),
                                               loss=loss)
        # bertkit's: what the loop builds AdamW over
        groups = trainer.create_optimizer().param_groups if lib == "sentence_transformers" else trainer._parameter_groups()
        names = {id(p): n for n, p in loss.named_parameters()}
        rates[lib] = {names[id(p)]: (g.get("lr", 2e-5), g["weight_decay"]) for g in groups for p in g["params"]}
    want = {n: r for n, r in rates["sentence_transformers"].items() if ".pooler." not in n}
    assert rates["bertkit"] == want and len(want) == 101
    assert want["model.0.model.encoder.layer.1.attention.self.query.weight"] == ((1e-4, 0.1) if mapping else (2e-5, 0.1))
    assert want["model.0.model.encoder.layer.4.output.LayerNorm.bias"] == \
        ((3e-5 if "LayerNorm" in mapping else 1e-4 if mapping else 2e-5), 0.0)


def test_resuming_with_other_learning_rates_is_refused(model, tmp_path):
    """A checkpoint's optimiser state holds the rates of its groups: a run resumed with another learning_rate_mapping
    is refused, naming it, before anything is written; with the same one it resumes."""
    def trainer(rate: float) -> SentenceTransformerTrainer:
        args = st_args(tmp_path, per_device_train_batch_size=4, max_steps=2, learning_rate=1e-5, save_steps=1,
                       learning_rate_mapping={r"LayerNorm": rate})
        return SentenceTransformerTrainer(model=model, args=args, loss=losses.MultipleNegativesRankingLoss(model),
                                          train_dataset=PAIRS)

    trainer(1e-4).train()
    written = sorted(p.name for p in (tmp_path / "out").iterdir())
    with pytest.raises(BertkitError, match=r"other settings or data \(field: \(checkpoint, now\)\) "
                                           r"\{'learning_rate_mapping.LayerNorm': \(0.0001, 0.0002\)\}"):
        trainer(2e-4).train(resume_from_checkpoint=True)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == written
    assert trainer(1e-4).train(resume_from_checkpoint=True).global_step == 2


@pytest.mark.parametrize("sampler", slow_after([BatchSamplers.BATCH_SAMPLER, BatchSamplers.NO_DUPLICATES]))
def test_eval_loss_is_sentence_transformers(model_dir, sampler, tmp_path):
    """sentence-transformers evaluates in batches its sampler draws (shuffled with ``seed``, or without duplicate
    texts), not in the dataset's order; an in-batch-negatives loss's eval_loss depends on them. 12 and 14 pairs (a
    short last batch, weighted by its rows) in batches of 4, three rows per paragraph: both trainers give the same
    eval_loss, for two seeds. 10 pairs over 3 paragraphs leave the no-duplicates batches short (3, 3, 2, 2 rows),
    which sentence-transformers weighs as 4, 4, 4, 2 (transformers' evaluation loop). With data_seed set, the
    default sampler's shuffle is drawn with it there (accelerate's seedable sampler), and bertkit drew it with seed
    (eval_loss 0.7073 against 0.4219 on SQuAD pairs); the no-duplicates sampler draws with seed in both."""
    st = pytest.importorskip("sentence_transformers")
    datasets = pytest.importorskip("datasets")
    st_losses = pytest.importorskip("sentence_transformers.sentence_transformer.losses")
    st_sampler = pytest.importorskip("sentence_transformers.sentence_transformer.training_args").BatchSamplers
    for n, seed, group, data_seed in ((12, 0, 3, None), (12, 7, 3, None), (14, 0, 3, None), (14, 7, 3, None),
                                      (10, 0, 4, None), (14, 0, 3, 7)):
        pairs = [{"anchor": f"question {i}", "positive": f"paragraph {i // group}"} for i in range(n)]
        common = {"per_device_eval_batch_size": 4, "seed": seed, "data_seed": data_seed}
        want_model = st.SentenceTransformer(str(model_dir), device="cpu")
        want = st.SentenceTransformerTrainer(
            model=want_model, loss=st_losses.MultipleNegativesRankingLoss(want_model),
            args=st.SentenceTransformerTrainingArguments(output_dir=str(tmp_path / "st"), report_to="none", use_cpu=True,
                                                         disable_tqdm=True, batch_sampler=st_sampler(sampler.value),
                                                         **common),
            eval_dataset=datasets.Dataset.from_list(pairs)).evaluate()["eval_loss"]
        ours = SentenceTransformer(model_dir)
        got = SentenceTransformerTrainer(model=ours, args=st_args(tmp_path, **{**common, "batch_sampler": sampler}),
                                         loss=losses.MultipleNegativesRankingLoss(ours),
                                         eval_dataset=datasets.Dataset.from_list(pairs)).evaluate()["eval_loss"]
        assert got == pytest.approx(want, rel=1e-5)


@pytest.mark.parametrize("sampler", [BatchSamplers.NO_DUPLICATES, pytest.param(BatchSamplers.GROUP_BY_LABEL, marks=pytest.mark.slow)])
def test_load_best_model_at_end_with_a_sampler_of_its_own(model_dir, sampler, tmp_path):
    """load_best_model_at_end (metric_for_best_model "loss") with an eval_dataset and the no-duplicates or
    label-grouped sampler: the check of the metric before training evaluated a list of rows with the sampler, which
    draws from a whole dataset's texts or labels, and stopped with an AttributeError ('list' object has no attribute
    'texts_by_row' / 'label_column'). Now it trains as sentence-transformers: the same eval_loss at each of the 3
    evaluations and the same best checkpoint."""
    st = pytest.importorskip("sentence_transformers")
    datasets = pytest.importorskip("datasets")
    st_losses = pytest.importorskip("sentence_transformers.sentence_transformer.losses")
    if sampler is BatchSamplers.GROUP_BY_LABEL:
        rows, loss = [{"text": f"sentence {i}", "label": i % 3} for i in range(12)], "BatchHardTripletLoss"
    else:
        rows, loss = [{"anchor": f"question {i}", "positive": f"paragraph {i // 3}"} for i in range(12)], \
            "MultipleNegativesRankingLoss"
    common = {"per_device_train_batch_size": 4, "per_device_eval_batch_size": 4, "max_steps": 3, "seed": 1,
              "eval_strategy": "steps", "eval_steps": 1, "save_steps": 1, "load_best_model_at_end": True,
              "learning_rate": 1e-3, "batch_sampler": sampler.value}
    runs = {}
    for lib in (st, None):
        model = lib.SentenceTransformer(str(model_dir), device="cpu") if lib else SentenceTransformer(model_dir)
        args = (lib.SentenceTransformerTrainingArguments(output_dir=str(tmp_path / "st"), report_to="none",
                                                         use_cpu=True, disable_tqdm=True, **common)
                if lib else st_args(tmp_path, **common))
        trainer = (lib.SentenceTransformerTrainer if lib else SentenceTransformerTrainer)(
            model=model, args=args, loss=getattr(st_losses if lib else losses, loss)(model),
            train_dataset=datasets.Dataset.from_list(rows), eval_dataset=datasets.Dataset.from_list(rows[:8]))
        trainer.train()
        runs[lib is None] = ([h["eval_loss"] for h in trainer.state.log_history if "eval_loss" in h],
                             trainer.state.best_model_checkpoint.rsplit("/", 1)[-1])
    (want, want_best), (got, got_best) = runs[False], runs[True]
    assert len(got) == 3 and got == pytest.approx(want, rel=1e-5) and got_best == want_best


def test_dataloader_drop_last_gives_sentence_transformers_steps(model_dir, tmp_path):
    """dataloader_drop_last=True: 14 pairs in batches of 4 train 3 steps an epoch (the batch of 2 left out), as
    sentence-transformers' sampler drops it: the same steps, rates and losses. bertkit refused the argument; with
    the no-duplicates sampler, or with evaluations (sentence-transformers' eval_loss there is not the kept batches'
    mean: 0.2332 against their mean 0.2104 on these pairs), it still is, by name, before anything is written."""
    st = pytest.importorskip("sentence_transformers")
    datasets = pytest.importorskip("datasets")
    st_losses = pytest.importorskip("sentence_transformers.sentence_transformer.losses")
    pairs = datasets.Dataset.from_list([{"anchor": f"question {i}", "positive": f"paragraph {i}"} for i in range(14)])
    common = {"per_device_train_batch_size": 4, "num_train_epochs": 2, "seed": 3, "logging_steps": 1,
              "learning_rate": 1e-4, "warmup_steps": 2, "save_strategy": "no", "dataloader_drop_last": True}
    runs = {}
    for lib, args in ((st, lambda: st.SentenceTransformerTrainingArguments(
            output_dir=str(tmp_path / "st"), report_to="none", use_cpu=True, disable_tqdm=True, **common)),
                      (None, lambda: st_args(tmp_path, **common))):
        model = (lib.SentenceTransformer(str(model_dir), device="cpu") if lib else SentenceTransformer(model_dir))
        loss = (st_losses if lib else losses).MultipleNegativesRankingLoss(model)
        trainer = (lib.SentenceTransformerTrainer if lib else SentenceTransformerTrainer)(
            model=model, args=args(), train_dataset=pairs, loss=loss)
        trainer.train()
        runs["st" if lib else "bk"] = [(h["step"], h["learning_rate"], h["loss"])
                                       for h in trainer.state.log_history if "loss" in h]
    theirs, ours = runs["st"], runs["bk"]
    assert [s for s, _, _ in ours] == [s for s, _, _ in theirs] == list(range(1, 7))
    assert [r for _, r, _ in ours] == [r for _, r, _ in theirs]
    assert [x for _, _, x in ours] == pytest.approx([x for _, _, x in theirs], rel=1e-5)
    with pytest.raises(BertkitError, match="dataloader_drop_last=True with batch_sampler 'no_duplicates'"):
        st_args(tmp_path, dataloader_drop_last=True, batch_sampler=BatchSamplers.NO_DUPLICATES)
    model = SentenceTransformer(model_dir)
    evaluated = SentenceTransformerTrainer(model=model, args=st_args(tmp_path / "eval", **common), train_dataset=pairs,
                                           eval_dataset=pairs, loss=losses.MultipleNegativesRankingLoss(model))
    with pytest.raises(BertkitError, match="dataloader_drop_last=True in an evaluation"):
        evaluated.train()
    assert not (tmp_path / "eval").exists()


class _Reads(TorchDispatchMode):
    """Every read of a tensor's value into Python (``item``, ``float``, ``int``, ``bool``: aten's
    _local_scalar_dense; and ``tolist``), by the bertkit file nearest on the stack. On a GPU each one waits for
    every kernel queued before it."""

    def __init__(self, monkeypatch):
        super().__init__()
        self.where: collections.Counter = collections.Counter()
        tolist = torch.Tensor.tolist

        def counted(tensor, *args, **kwargs):
            self.where[_asker()] += 1
            return tolist(tensor, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, "tolist", counted)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default:
            self.where[_asker()] += 1
        return func(*args, **(kwargs or {}))


def _asker() -> str:
    frame = sys._getframe(2)
    while frame is not None and "/bertkit/" not in frame.f_code.co_filename:
        frame = frame.f_back
    return "" if frame is None else frame.f_code.co_filename.split("/bertkit/")[-1]


def test_a_training_step_reads_the_device_once(minilm_2_layers, tmp_path, monkeypatch):
    """The loop keeps each micro-batch's loss on the device and reads the step's losses with its gradient norm in
    one read at the step's end (it read the loss twice a micro-batch and the norm once: five waits for the device a
    step of two micro-batches); the cross-encoder's loss reads nothing. The logged losses are those read."""
    model = CrossEncoder(cross_encoder_directory(minilm_2_layers, tmp_path / "ce"), max_length=32)
    rows = [{"query": f"question {i}", "text": f"paragraph {i // 2} says {i}", "label": float(i % 2)} for i in range(24)]
    args = CrossEncoderTrainingArguments(output_dir=str(tmp_path / "out"), report_to="none", use_cpu=True,
                                         disable_tqdm=True, per_device_train_batch_size=4, gradient_accumulation_steps=2,
                                         max_steps=3, logging_steps=1, save_strategy="no", learning_rate=1e-4)
    trainer = CrossEncoderTrainer(model=model, args=args, train_dataset=rows,
                                  loss=ce_losses.BinaryCrossEntropyLoss(model))
    steps = []

    class Steps(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            steps.append(dict(reads.where))

    trainer.add_callback(Steps())
    with _Reads(monkeypatch) as reads:
        trainer.train()
    assert len(steps) == 3
    # by the step's end: what the loop (and anything under it but the forward pass) read in each step
    per_step = [{k: v - (steps[i - 1].get(k, 0) if i else 0) for k, v in s.items()} for i, s in enumerate(steps)]
    assert [{k: v for k, v in s.items() if k.startswith(("training/", "sentence/")) and v} for s in per_step[1:]] == \
        [{"training/step_reads.py": 1}] * 2
    logged = [r["loss"] for r in trainer.state.log_history if "loss" in r]
    assert len(logged) == 3 and all(0.3 < x < 1.2 for x in logged)


@pytest.mark.parametrize("trainer_kind", ["SentenceTransformerTrainer", "CrossEncoderTrainer"])
def test_training_tokenizes_each_row_once(trainer_kind, model, minilm_2_layers, tmp_path, monkeypatch):
    """Before training, the Trainer checks the labels and fingerprints the data: neither tokenizes a row (each did
    the whole dataset, two passes of the loader's work in the main process before the first step, 14 s for
    16,384 SQuAD pairs)."""
    rows = [{**p, "label": float(i % 2)} for i, p in enumerate(PAIRS)]
    if trainer_kind == "CrossEncoderTrainer":
        encoder = CrossEncoder(cross_encoder_directory(minilm_2_layers, tmp_path / "ce"), max_length=32)
        cls, tokenize = CrossEncoder, "token_ids"
        trainer = CrossEncoderTrainer(model=encoder, loss=ce_losses.BinaryCrossEntropyLoss(encoder), train_dataset=rows,
                                      args=CrossEncoderTrainingArguments(
                                          output_dir=str(tmp_path / "out"), report_to="none", use_cpu=True,
                                          disable_tqdm=True, per_device_train_batch_size=4, save_strategy="no",
                                          num_train_epochs=1))
    else:
        cls, tokenize = SentenceTransformer, "tokenize"
        trainer = SentenceTransformerTrainer(model=model, loss=losses.CoSENTLoss(model), train_dataset=rows,
                                             args=st_args(tmp_path, per_device_train_batch_size=4, save_strategy="no",
                                                            num_train_epochs=1))
    calls, real = [], getattr(cls, tokenize)
    monkeypatch.setattr(cls, tokenize, lambda self, *a, **k: calls.append(1) or real(self, *a, **k))
    assert trainer.train().global_step == 3
    # each row's two texts once, and row 0's twice more: read to learn its columns, collated to check them
    assert len(calls) == 2 * (len(rows) + 2)


def test_resuming_on_other_data_is_refused(model, tmp_path):
    """The fingerprint a checkpoint records is of the rows the examples are made from: one text changed is refused
    on resume, naming the data, before anything is written; the same rows resume."""
    def trainer(rows: list[dict]) -> SentenceTransformerTrainer:
        args = st_args(tmp_path, per_device_train_batch_size=4, max_steps=2, learning_rate=1e-5, save_steps=1)
        return SentenceTransformerTrainer(model=model, args=args, loss=losses.MultipleNegativesRankingLoss(model),
                                          train_dataset=rows)

    trainer(PAIRS).train()
    written = sorted(p.name for p in (tmp_path / "out").iterdir())
    with pytest.raises(BertkitError, match=r"other settings or data .*'trainer.train_data.rows'"):
        trainer([*PAIRS[:-1], {**PAIRS[-1], "positive": "another paragraph"}]).train(resume_from_checkpoint=True)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == written
    assert trainer(PAIRS).train(resume_from_checkpoint=True).global_step == 2


def test_resuming_under_another_loss_or_loss_setting_is_refused(model, tmp_path):
    """A run resumed with MultipleNegativesRankingLoss(scale=30) after training at scale 20 (or with another loss)
    trained on without a word, as sentence-transformers' does: the resumed run was neither. The loss's settings
    are in the fingerprint now: refused naming them, before anything is written; the same loss resumes."""
    def trainer(loss) -> SentenceTransformerTrainer:
        args = st_args(tmp_path, per_device_train_batch_size=4, max_steps=2, learning_rate=1e-5, save_steps=1)
        return SentenceTransformerTrainer(model=model, args=args, loss=loss, train_dataset=PAIRS)

    trainer(losses.MultipleNegativesRankingLoss(model)).train()
    written = sorted(p.name for p in (tmp_path / "out").iterdir())
    with pytest.raises(BertkitError, match=r"other settings or data .*'loss.MultipleNegativesRankingLoss.scale': "
                                           r"\(20.0, 30.0\)"):
        trainer(losses.MultipleNegativesRankingLoss(model, scale=30.0)).train(resume_from_checkpoint=True)
    with pytest.raises(BertkitError, match=r"'loss.CachedMultipleNegativesRankingLoss': \(None, \{"):
        trainer(losses.CachedMultipleNegativesRankingLoss(model)).train(resume_from_checkpoint=True)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == written
    assert trainer(losses.MultipleNegativesRankingLoss(model)).train(resume_from_checkpoint=True).global_step == 2


@pytest.mark.parametrize("kind", slow_after(["sentence", "cross", "sparse"]))
def test_resuming_with_another_model_is_refused_naming_what_differs(kind, tmp_path, tiny_checkpoint, minilm_2_layers):
    """A checkpoint holds the model's weights, not its modules' settings: a run resumed with CLS pooling after mean
    pooling, without its Normalize, or with SPLADE's sum after max trained another model without a word; one resumed
    on an encoder of another depth stopped at torch's "Error(s) in loading state_dict". The modules (their settings,
    an encoder's config) are in the fingerprint now: refused naming them, before anything is written; the same model
    resumes."""
    from bertkit.sentence import models
    from bertkit.sentence.sparse_encoder import (
        SparseEncoder,
        SparseEncoderTrainer,
        SparseEncoderTrainingArguments,
    )
    from bertkit.sentence.sparse_encoder import losses as sparse_losses
    from bertkit.sentence.sparse_encoder import models as sparse_models

    head = {"sentence": "BertModel", "cross": "BertForSequenceClassification", "sparse": "BertForMaskedLM"}[kind]
    two, one = (tiny_checkpoint(tmp_path / f"base{n}", head, tokenizer=minilm_2_layers, num_hidden_layers=n,
                                labels=1 if kind == "cross" else None) for n in (2, 1))

    def trainer(base=two, pooling: str = "mean", normalize: bool = True) -> Any:
        args = dict(output_dir=str(tmp_path / "out"), report_to="none", use_cpu=True, disable_tqdm=True,
                    per_device_train_batch_size=4, max_steps=2, learning_rate=1e-5, save_steps=1)
        if kind == "cross":
            model = CrossEncoder(str(base))
            rows = [{"query": f"question {i}", "passage": f"passage {i // 3}", "label": float(i % 2)} for i in range(12)]
            return CrossEncoderTrainer(model=model, loss=ce_losses.BinaryCrossEntropyLoss(model), train_dataset=rows,
                                       args=CrossEncoderTrainingArguments(**args))
        if kind == "sparse":
            model = SparseEncoder(modules=[sparse_models.MLMTransformer(str(base)),
                                           sparse_models.SpladePooling("max" if pooling == "mean" else "sum")])
            loss = sparse_losses.SpladeLoss(model, sparse_losses.SparseMultipleNegativesRankingLoss(model),
                                            document_regularizer_weight=3e-3, query_regularizer_weight=5e-3)
            return SparseEncoderTrainer(model=model, loss=loss, train_dataset=PAIRS,
                                        args=SparseEncoderTrainingArguments(**args))
        model = SentenceTransformer(modules=[models.Transformer(str(base), max_seq_length=16),
                                             models.Pooling(32, pooling), *([models.Normalize()] if normalize else [])])
        return SentenceTransformerTrainer(model=model, loss=losses.MultipleNegativesRankingLoss(model),
                                          train_dataset=PAIRS, args=SentenceTransformerTrainingArguments(**args))

    trainer().train()
    written = sorted(p.name for p in (tmp_path / "out").iterdir())
    changes = {"sentence": [(dict(pooling="cls"), r"'modules.1.Pooling.modes': \(\['mean'\], \['cls'\]\)"),
                            (dict(normalize=False), r"'modules.2': \(\{'Normalize': \{\}\}, None\)")],
               "cross": [],
               "sparse": [(dict(pooling="sum"), r"'modules.1.SpladePooling.pooling_strategy': \('max', 'sum'\)")]}
    depth = r"'modules.0.(MLM)?Transformer.model.Bert\w*.config.num_hidden_layers': \(2, 1\)"
    for change, named in [*changes[kind], (dict(base=one), depth)]:
        with pytest.raises(BertkitError, match=r"other settings or data \(field: \(checkpoint, now\)\) \{.*" + named):
            trainer(**change).train(resume_from_checkpoint=True)
        assert sorted(p.name for p in (tmp_path / "out").iterdir()) == written
    assert trainer().train(resume_from_checkpoint=True).global_step == 2


def test_a_datasets_columns_are_its_rows_keys_as_sentence_transformers_reads_them(model_dir, tmp_path):
    """sentence-transformers takes a batch's columns from its rows' keys; bertkit took the Arrow column names: a
    dataset whose with_transform renames its columns ("q" -> "anchor") stopped with KeyError: 'q', and one whose
    set_format(columns=[...]) leaves out an "id" column was refused for that third text column. Both train as the
    rows themselves, loss for loss."""
    datasets = pytest.importorskip("datasets")
    renamed = datasets.Dataset.from_list([{"q": r["anchor"], "p": r["positive"]} for r in PAIRS]).with_transform(
        lambda batch: {"anchor": batch["q"], "positive": batch["p"]})
    hidden = datasets.Dataset.from_list([{"id": i, **r} for i, r in enumerate(PAIRS)])
    hidden.set_format(columns=["anchor", "positive"])

    def losses_of(data: Any, name: str) -> list[float]:
        model = SentenceTransformer(model_dir)
        args = st_args(tmp_path / name, per_device_train_batch_size=4, max_steps=2, learning_rate=1e-4,
                       logging_steps=1, save_strategy="no")
        trainer = SentenceTransformerTrainer(model=model, args=args, loss=losses.MultipleNegativesRankingLoss(model),
                                             train_dataset=data)
        trainer.train()
        return [h["loss"] for h in trainer.state.log_history if "loss" in h]

    want = losses_of(PAIRS, "rows")
    assert len(want) == 2 and losses_of(renamed, "renamed") == want and losses_of(hidden, "hidden") == want


# 'epoch' asserts all that 'steps' (the default logging, which most runs here take) does, and the epoch's log after
# the last evaluation: 'steps' runs in `make test-slow`.
@pytest.mark.parametrize("logging", slow_after(["epoch", "steps"]))
def test_an_evaluator_alone_evaluates_in_training_as_sentence_transformers(logging, model_dir, tmp_path):
    """An evaluator without an eval_dataset evaluates in training (eval_strategy 'steps': every eval_steps and at
    the end), its metrics prefixed eval_ at the same steps with the same values; it was refused for want of an
    eval_dataset. With logging_strategy 'epoch' the epoch's log follows the last step's evaluation, and the run's
    end evaluated that step again (a third record, and a third row in the evaluator's CSV, where
    sentence-transformers writes two)."""
    st = pytest.importorskip("sentence_transformers")
    datasets = pytest.importorskip("datasets")
    st_losses = pytest.importorskip("sentence_transformers.sentence_transformer.losses")
    st_evaluation = pytest.importorskip("sentence_transformers.sentence_transformer.evaluation")
    from bertkit.sentence import evaluation

    scored = ([f"question {i}" for i in range(6)], [f"paragraph {i // 2}" for i in range(6)], [i % 3 / 2 for i in range(6)])
    common = {"per_device_train_batch_size": 4, "max_steps": 3, "eval_strategy": "steps", "eval_steps": 2,
              "learning_rate": 1e-4, "seed": 3, "logging_strategy": logging}

    def evaluations(trainer):
        trainer.train()
        rows = (tmp_path / ("st" if "sentence_transformers" in type(trainer).__module__ else "out") / "eval" /
                "similarity_evaluation_sts_results.csv").read_text().splitlines()
        assert len(rows) == 3  # the header and one row an evaluation
        return [(r["step"], r["eval_sts_spearman_cosine"]) for r in trainer.state.log_history
                if "eval_sts_spearman_cosine" in r]

    want_model = st.SentenceTransformer(str(model_dir), device="cpu")
    want = evaluations(st.SentenceTransformerTrainer(
        model=want_model, loss=st_losses.MultipleNegativesRankingLoss(want_model),
        args=st.SentenceTransformerTrainingArguments(output_dir=str(tmp_path / "st"), report_to="none", use_cpu=True,
                                                     disable_tqdm=True, save_strategy="no", **common),
        train_dataset=datasets.Dataset.from_list(PAIRS),
        evaluator=st_evaluation.EmbeddingSimilarityEvaluator(*scored, name="sts")))
    ours = SentenceTransformer(model_dir)
    got = evaluations(SentenceTransformerTrainer(
        model=ours, loss=losses.MultipleNegativesRankingLoss(ours), args=st_args(tmp_path, save_strategy="no", **common),
        train_dataset=datasets.Dataset.from_list(PAIRS),
        evaluator=evaluation.EmbeddingSimilarityEvaluator(*scored, name="sts")))
    assert [s for s, _ in got] == [s for s, _ in want] == [2, 3]
    assert [v for _, v in got] == pytest.approx([v for _, v in want], rel=1e-5)


def _former_name(key: str, kind: str, prefix: str = "") -> str:
    """A state-dict key (after ``prefix``: ``loss.model.`` in a trainer checkpoint's state.pt) as bertkit named it
    before its names were sentence-transformers 6's: a SentenceTransformer's encoder ``bert.…`` (``0.model.…`` now)
    and Dense layers ``dense.0.…`` (``2.…``), a CrossEncoder's classifier model ``model.…`` (``0.model.…``)."""
    rest = re.sub(r"^0\.model\.", "bert." if kind == "sentence" else "model.", key.removeprefix(prefix))
    return prefix + re.sub(r"^(\d+)\.linear\.", lambda m: f"dense.{int(m[1]) - 2}.linear.", rest)


@pytest.mark.parametrize("kind", slow_after(["sentence", "cross"]))
def test_a_checkpoint_written_under_the_former_names_resumes_exactly(kind, tmp_path, tiny_checkpoint,
                                                                    minilm_2_layers):
    """A checkpoint the trainer wrote before the model's names were sentence-transformers' (state.pt's weights under
    ``loss.model.bert.…`` and ``loss.model.dense.0.…``, a cross-encoder's ``loss.model.model.…``; built here by
    renaming the keys, as the former trainer wrote them) failed to resume, missing every key: an upgrade in the
    middle of a run made it unresumable, and a state dict saved with torch.save did not load. Now the run resumes to
    the uninterrupted run's losses, weights and Adam moments, exactly, and the state dict loads strictly."""
    import shutil

    from bertkit.sentence import models
    from bertkit.training.checkpoint import read_state

    head = "BertModel" if kind == "sentence" else "BertForSequenceClassification"
    path = tiny_checkpoint(tmp_path / "base", head, tokenizer=minilm_2_layers, labels=None if kind == "sentence" else 1)
    settings = dict(report_to="none", use_cpu=True, disable_tqdm=True, per_device_train_batch_size=4,
                    num_train_epochs=2, learning_rate=1e-2, weight_decay=0.01, logging_steps=1, save_steps=2, seed=7)

    def trainer(run: str) -> Any:
        out = str(tmp_path / run / "out")
        if kind == "sentence":
            word = models.Transformer(str(path), max_seq_length=16)
            torch.manual_seed(1)  # the Dense's weights
            model = SentenceTransformer(modules=[word, models.Pooling(32), models.Dense(32, 16), models.Normalize()])
            return SentenceTransformerTrainer(model=model, loss=losses.MultipleNegativesRankingLoss(model),
                                              train_dataset=PAIRS,
                                              args=SentenceTransformerTrainingArguments(output_dir=out, **settings))
        model = CrossEncoder(path)
        rows = [{"query": f"question {i}", "passage": f"passage {i // 3}", "label": float(i % 2)} for i in range(12)]
        return CrossEncoderTrainer(model=model, loss=ce_losses.BinaryCrossEntropyLoss(model), train_dataset=rows,
                                   args=CrossEncoderTrainingArguments(output_dir=out, **settings))

    def losses_of(run: Any) -> list[float]:
        return [r["loss"] for r in run.state.log_history if "loss" in r]

    whole = trainer("whole")
    whole.train()
    former = {"sentence": ["bert.embeddings.word_embeddings.weight", "dense.0.linear.bias"],
              "cross": ["model.bert.embeddings.word_embeddings.weight", "model.classifier.bias"]}[kind]
    # the run cut after its checkpoint at step 2, state.pt's weights under the former names
    shutil.copytree(tmp_path / "whole" / "out", tmp_path / "cut" / "out")
    for later in ("checkpoint-4", "checkpoint-6"):
        shutil.rmtree(tmp_path / "cut" / "out" / later)
    state_file = tmp_path / "cut" / "out" / "checkpoint-2" / "state.pt"
    state = torch.load(state_file, weights_only=True)
    state["model"] = {_former_name(k, kind, "loss.model."): v for k, v in state["model"].items()}
    assert {f"loss.model.{k}" for k in former} <= set(state["model"])
    torch.save(state, state_file)

    resumed = trainer("cut")
    resumed.train(resume_from_checkpoint=str(state_file.parent))
    assert losses_of(resumed) == losses_of(whole) and len(losses_of(whole)) == 6
    assert losses_of(whole)[3] != losses_of(whole)[2]
    want = whole.model.state_dict()
    for name, value in resumed.model.state_dict().items():
        assert torch.equal(value, want[name]), name
    moments = [read_state(tmp_path / run / "out" / "checkpoint-6")["optimizer"]["state"]  # (from optimizer.pt)
               for run in ("whole", "cut")]
    assert moments[0].keys() == moments[1].keys()
    for i, m in moments[0].items():
        assert torch.equal(moments[1][i]["exp_avg"], m["exp_avg"]) and torch.equal(moments[1][i]["exp_avg_sq"],
                                                                                  m["exp_avg_sq"]), i

    # torch.save(model.state_dict()) under the former names loads strictly, to the same weights
    saved = {_former_name(k, kind): v for k, v in want.items()}
    assert set(former) <= set(saved)
    fresh = trainer("fresh").model
    fresh.load_state_dict(saved, strict=True)
    for name, value in fresh.state_dict().items():
        assert torch.equal(value, want[name]), name
    # a tensor under both names is not loaded twice: the former name is left for strict loading to name
    with pytest.raises(RuntimeError, match=rf'Unexpected key\(s\) in state_dict: "{re.escape(former[0])}"'):
        fresh.load_state_dict({former[0]: saved[former[0]], **want}, strict=True)


_CLS = {"word_embedding_dimension": 384, "pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False}


@pytest.mark.parametrize("name", [  # the cached losses' values and gradients are in test_sentence_losses' fast tests
    pytest.param("CachedMultipleNegativesSymmetricRankingLoss", marks=pytest.mark.slow),
    pytest.param("CachedGISTEmbedLoss", marks=pytest.mark.slow), pytest.param("MegaBatchMarginLoss", marks=pytest.mark.slow),
    "GlobalOrthogonalRegularizationLoss"])
def test_ported_losses_train_as_sentence_transformers(name, model_dir, minilm_2_layers, data_dir, tmp_path):
    """A training script with a loss bertkit refused as not implemented, the import swapped: the same loss (and
    terms) at every step on SQuAD (question, answer sentence, other sentence) rows. GlobalOrthogonalRegularizationLoss
    trains beside MultipleNegativesRankingLoss as its docstring shows, a dict of losses over the dataset under two
    names: bertkit is given the one Dataset twice, as there; sentence-transformers, which then labels every batch
    with the last name (its transform is set on the one object) and trains the regulariser alone, two copies."""
    st = pytest.importorskip("sentence_transformers")
    datasets = pytest.importorskip("datasets")
    from cross_encoder_helpers import squad_rerank

    rows = [{"anchor": r["query"], "positive": r["positive"], "negative": r["negatives"][0]}
            for r in squad_rerank(data_dir, 0, 16)]
    if name == "MegaBatchMarginLoss":
        rows = [{k: v for k, v in r.items() if k != "negative"} for r in rows]
    guide_dir = st_directory(minilm_2_layers, tmp_path / "guide", pooling=_CLS, max_seq_length=32)
    common = {"per_device_train_batch_size": 8, "max_steps": 3, "seed": 3, "logging_steps": 1, "learning_rate": 1e-4,
              "save_strategy": "no"}
    kwargs = {"GlobalOrthogonalRegularizationLoss": {}, "MegaBatchMarginLoss": {"mini_batch_size": 3},
              "CachedGISTEmbedLoss": {"mini_batch_size": 3, "margin": 0.05}}.get(name, {"mini_batch_size": 3})
    runs = {}
    for lib in ("st", "bk"):
        if lib == "st":
            model, guide = (st.SentenceTransformer(str(d), device="cpu") for d in (model_dir, guide_dir))
            args = st.SentenceTransformerTrainingArguments(output_dir=str(tmp_path / "st"), report_to="none",
                                                           use_cpu=True, disable_tqdm=True, **common)
            found, trainer_cls = st.sentence_transformer.losses, st.SentenceTransformerTrainer
        else:
            model, guide = SentenceTransformer(model_dir), SentenceTransformer(guide_dir)
            args, found, trainer_cls = st_args(tmp_path / "bk", **common), losses, SentenceTransformerTrainer
        loss = getattr(found, name)(model, *[guide] * (name == "CachedGISTEmbedLoss"), **kwargs)
        train = datasets.Dataset.from_list(rows)  # one a library: sentence-transformers' trainer sets transforms on it
        if name == "GlobalOrthogonalRegularizationLoss":
            loss = {"main": found.MultipleNegativesRankingLoss(model), "gor": loss}
            train = {"main": train, "gor": datasets.Dataset.from_list(rows) if lib == "st" else train}
        trainer = trainer_cls(model=model, args=args, train_dataset=train, loss=loss)
        trainer.train()
        runs[lib] = [{k: h[k] for k in ("loss", "gor_mean", "gor_second_moment") if k in h and h[k] == h[k]}
                     for h in trainer.state.log_history if "loss" in h]  # h[k] == h[k]: not sentence-transformers' NaN
    assert len(runs["bk"]) == len(runs["st"]) == 3
    for got, want in zip(runs["bk"], runs["st"]):
        assert got == pytest.approx(want, rel=1e-5)
    if name == "GlobalOrthogonalRegularizationLoss":  # both losses trained
        assert {len(step) for step in runs["bk"]} == {1, 3}


def test_a_custom_loss_module_is_told_to_derive_from_sentence_loss(model, tmp_path):
    """sentence-transformers' docs pair GlobalOrthogonalRegularizationLoss with MultipleNegativesRankingLoss in a
    torch.nn.Module of the user's own; bertkit told its author to "change the import", which fixes nothing. Derived
    from SentenceLoss, the same class trains, its terms logged."""
    from bertkit.sentence.losses import SentenceLoss

    def gor_loss(base):
        class InfoNCEGORLoss(base):
            def __init__(self, model):
                super().__init__(*[model] * (base is SentenceLoss))
                self.model = model
                self.info_nce_loss = losses.MultipleNegativesRankingLoss(model)
                self.gor_loss = losses.GlobalOrthogonalRegularizationLoss(model)

            def forward(self, sentence_features, labels=None):
                embeddings = [self.model(f)["sentence_embedding"] for f in sentence_features]
                return {"info_nce": self.info_nce_loss.compute_loss_from_embeddings(embeddings, labels),
                        **self.gor_loss.compute_loss_from_embeddings(embeddings, labels)}
        return InfoNCEGORLoss(model)

    args = st_args(tmp_path, max_steps=1, logging_steps=1, save_strategy="no")
    with pytest.raises(BertkitError, match=re.escape(
            "InfoNCEGORLoss is no bertkit.sentence loss: derive it from bertkit.sentence.losses.SentenceLoss (class "
            "InfoNCEGORLoss(SentenceLoss), its __init__ calling super().__init__(model))")):
        SentenceTransformerTrainer(model=model, args=args, train_dataset=PAIRS[:4], loss=gor_loss(torch.nn.Module))
    trainer = SentenceTransformerTrainer(model=model, args=args, train_dataset=PAIRS[:4], loss=gor_loss(SentenceLoss))
    trainer.train()
    assert {"info_nce", "gor_mean", "gor_second_moment"} <= trainer.state.log_history[0].keys()
