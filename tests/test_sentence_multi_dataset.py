"""Multi-dataset training in bertkit.sentence, against sentence-transformers: a dict of datasets with a loss per
dataset draws the same batches in the same order (PROPORTIONAL and ROUND_ROBIN, each dataset batched by the default
or the no-duplicates sampler), trains to the same loss at every step, evaluates each dataset to the same
``eval_{name}_loss``, resumes as the uninterrupted run; what cannot train is refused by name before anything is
written."""

from __future__ import annotations

import re

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
from bertkit.sentence.data import SentenceExamples, multi_dataset_batches
from cases import slow_after
from sentence_helpers import st_args, st_directory

datasets = pytest.importorskip("datasets")

PAIRS = [{"anchor": f"question {i}", "positive": f"paragraph {i // 2}"} for i in range(7)]
SCORED = [{"s1": f"sentence {i}", "s2": f"another {i % 3}", "score": (i % 5) / 4} for i in range(5)]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, minilm_2_layers):
    return st_directory(minilm_2_layers, tmp_path_factory.mktemp("st") / "m", dropout=0.0, max_seq_length=16)


@pytest.fixture(scope="module")
def model(model_dir):
    return SentenceTransformer(model_dir)


@pytest.mark.parametrize("no_duplicates, drop_last", [(False, False), (True, False), (False, True)])
def test_batches_are_sentence_transformers(model, no_duplicates, drop_last):
    """The batches of the datasets end to end, in sentence-transformers' order, for many seeds and sizes: its
    samplers share one generator (reseeded with seed + epoch by the multi-dataset sampler, each dataset's shuffle
    drawn from it when that dataset first gives a batch, and the next shuffle when its rows run out), so a dataset
    of one short batch moves the shuffle of a dataset first drawn after it. With dataloader_drop_last each dataset's
    sampler leaves out its own short batch (bertkit refused it with a dict of datasets)."""
    st_sampler = pytest.importorskip("sentence_transformers.base.sampler")
    mnrl = losses.MultipleNegativesRankingLoss(model)
    for sizes, batch in (((7, 5), 3), ((2, 9, 4), 3), ((6, 6), 2), ((1, 5, 3), 4)):
        rows = [[{"a": f"q{k}-{i}", "b": f"p{k}-{i // 2}"} for i in range(n)] for k, n in enumerate(sizes)]
        parts = [SentenceExamples(r, model, mnrl, None, {}, "train_dataset", str(k)) for k, r in enumerate(rows)]
        concat = torch.utils.data.ConcatDataset([datasets.Dataset.from_list(r) for r in rows])
        for seed in range(10):
            generator = torch.Generator().manual_seed(seed)  # sentence-transformers' trainer seeds it, then reseeds
            if no_duplicates:
                children = [st_sampler.NoDuplicatesBatchSampler(d, batch, drop_last=False, generator=generator, seed=seed)
                            for d in concat.datasets]
            else:
                children = [st_sampler.DefaultBatchSampler(torch.utils.data.RandomSampler(d, generator=generator),
                                                           batch_size=batch, drop_last=drop_last, generator=generator,
                                                           seed=seed) for d in concat.datasets]
            for cls, round_robin in ((st_sampler.ProportionalBatchSampler, False),
                                     (st_sampler.RoundRobinBatchSampler, True)):
                sampler = cls(concat, children, generator=generator, seed=seed)
                for epoch in (0, 1):
                    sampler.set_epoch(epoch)
                    want = list(sampler)[:len(sampler)]  # the trainer takes len(sampler) batches an epoch
                    got = multi_dataset_batches(parts, batch, seed + epoch, round_robin,
                                                "no_duplicates" if no_duplicates else "batch_sampler", drop_last)
                    assert got == want, (sizes, batch, seed, cls.__name__, epoch)


def test_dataloader_drop_last_trains_each_datasets_whole_batches(model, tmp_path):
    """dataloader_drop_last=True with a dict of datasets (refused before): each dataset's short batch is left out, as
    each of sentence-transformers' samplers leaves out its own: 7 and 5 rows in batches of 3 train 2 + 1 steps an
    epoch, every batch whole, PROPORTIONAL; ROUND_ROBIN 1 + 1."""
    for sampler, steps in (("proportional", 3), ("round_robin", 2)):
        seen = []
        mnrl, cosent = losses.MultipleNegativesRankingLoss(model), losses.CoSENTLoss(model)
        for loss in (mnrl, cosent):
            loss.register_forward_pre_hook(lambda module, args, seen=seen: seen.append(len(args[0][0]["input_ids"])))
        args = st_args(tmp_path / sampler, per_device_train_batch_size=3, num_train_epochs=1, save_strategy="no",
                       dataloader_drop_last=True, multi_dataset_batch_sampler=sampler)
        trainer = SentenceTransformerTrainer(model=model, args=args, loss={"pairs": mnrl, "scored": cosent},
                                             train_dataset={"pairs": PAIRS, "scored": SCORED})
        assert trainer.train().global_step == steps and seen == [3] * steps, sampler


def _train(lib: str, model_dir, out_dir, sampler: str, steps: int):
    """The training script; ``lib`` picks the import, nothing else differs. Each step's (dataset, rows, loss) and
    the evaluations: in training (every 4 steps, with an evaluator) and after it."""
    if lib == "sentence_transformers":
        import sentence_transformers as S
        from sentence_transformers.sentence_transformer import evaluation
        from sentence_transformers.sentence_transformer import losses as L
    else:
        import bertkit.sentence as S
        from bertkit.sentence import evaluation
        from bertkit.sentence import losses as L
    model = S.SentenceTransformer(str(model_dir), device="cpu")
    steps_seen = []

    def recorded(cls, name):
        class Recorded(cls):  # each batch's dataset, rows and loss, unrounded
            def forward(self, features, labels):
                value = super().forward(features, labels)
                if torch.is_grad_enabled():  # not an evaluation
                    steps_seen.append((name, len(features[0]["input_ids"]), value.item()))
                return value
        return Recorded(model)

    loss = {"pairs": recorded(L.MultipleNegativesRankingLoss, "pairs"), "scored": recorded(L.CoSENTLoss, "scored")}
    args = S.SentenceTransformerTrainingArguments(
        output_dir=str(out_dir), per_device_train_batch_size=3, per_device_eval_batch_size=4, max_steps=steps,
        learning_rate=1e-4, logging_steps=1, eval_strategy="steps", eval_steps=4, save_strategy="no",
        report_to="none", seed=5, use_cpu=True, disable_tqdm=True, multi_dataset_batch_sampler=sampler,
        metric_for_best_model="sts_spearman_cosine")
    train = datasets.DatasetDict({"pairs": datasets.Dataset.from_list(PAIRS),
                                  "scored": datasets.Dataset.from_list(SCORED)})
    dev = {"pairs": datasets.Dataset.from_list(PAIRS[:5]), "scored": datasets.Dataset.from_list(SCORED[:4])}
    evaluator = evaluation.EmbeddingSimilarityEvaluator([r["s1"] for r in SCORED], [r["s2"] for r in SCORED],
                                                        [r["score"] for r in SCORED], name="sts")
    trainer = S.SentenceTransformerTrainer(model=model, args=args, train_dataset=train, eval_dataset=dev, loss=loss,
                                           evaluator=evaluator)
    trainer.train()
    in_training = [{k: v for k, v in r.items() if "runtime" not in k and "per_second" not in k}
                   for r in trainer.state.log_history if "eval_pairs_loss" in r]
    after = {k: v for k, v in trainer.evaluate().items() if "runtime" not in k and "per_second" not in k}
    return steps_seen, in_training + [{"best_metric": trainer.state.best_metric}], after


# Each sampler once in `make test` (proportional here, round_robin in the cross-encoder's run below, which shares
# this trainer's multi-dataset code), each in both in `make test-slow`.
@pytest.mark.parametrize("sampler", slow_after(["proportional", "round_robin"]))
def test_training_script_gives_sentence_transformers_numbers(sampler, model_dir, tmp_path):
    """Two datasets, MultipleNegativesRankingLoss on (anchor, positive) pairs and CoSENTLoss on scored pairs, batches
    of 3, over two epochs (5 and 4 batches an epoch, a short one each): every step trains on the same dataset's same
    rows to the same loss; each evaluation dataset gives the same eval_{name}_loss; in training the evaluator runs
    once (eval_sts_*: metric_for_best_model names one), after training once per dataset (eval_{name}_sts_*), as in
    sentence-transformers."""
    pytest.importorskip("sentence_transformers")
    want = _train("sentence_transformers", model_dir, tmp_path / "st", sampler, 8)
    got = _train("bertkit", model_dir, tmp_path / "bk", sampler, 8)
    (want_steps, want_evals, want_after), (got_steps, got_evals, got_after) = want, got
    assert [s[:2] for s in got_steps] == [s[:2] for s in want_steps] and len(got_steps) == 8
    assert {s[0] for s in got_steps} == {"pairs", "scored"} and any(s[1] < 3 for s in got_steps)
    # measured on MiniLM (6 layers), 9 steps: largest relative difference 5.5e-6
    np.testing.assert_allclose([s[2] for s in got_steps], [s[2] for s in want_steps], rtol=1e-5, atol=1e-7)
    assert len(got_evals) == len(want_evals) == 3  # two evaluations, then the best evaluator metric
    for got_eval, want_eval in zip(got_evals, want_evals):
        assert got_eval.keys() == want_eval.keys() and ("eval_sts_spearman_cosine" in got_eval or "best_metric" in got_eval)
        np.testing.assert_allclose([got_eval[k] for k in want_eval], list(want_eval.values()), rtol=1e-5, atol=1e-6)
    assert got_after.keys() == want_after.keys()
    assert {"eval_pairs_loss", "eval_scored_loss", "eval_scored_sts_spearman_cosine"} <= got_after.keys()
    np.testing.assert_allclose([got_after[k] for k in want_after], list(want_after.values()), rtol=1e-5, atol=1e-6)


def test_bad_input_is_named_before_anything_is_written(model, minilm_2_layers, tmp_path):
    from bertkit.sentence.cross_encoder import (
        CrossEncoder,
        CrossEncoderTrainer,
        CrossEncoderTrainingArguments,
    )
    from bertkit.sentence.cross_encoder import losses as ce_losses
    from cross_encoder_helpers import cross_encoder_directory

    mnrl, cosent = losses.MultipleNegativesRankingLoss(model), losses.CoSENTLoss(model)
    train = {"pairs": PAIRS, "scored": SCORED}

    def trainer(**kwargs):
        return SentenceTransformerTrainer(model=model, args=st_args(tmp_path), **{"train_dataset": train, **kwargs})

    with pytest.raises(BertkitError, match=r"train_dataset has the dataset\(s\) \['scored'\], for which the loss dict "
                                           r"\(keys \['pairs'\]\) has no loss"):
        trainer(loss={"pairs": mnrl})
    with pytest.raises(BertkitError, match=r"the loss dict names \['other'\], which is no dataset of train_dataset or "
                                           r"eval_dataset \(their names: \['pairs', 'scored'\]\)"):
        trainer(loss={"pairs": mnrl, "scored": cosent, "other": mnrl})
    with pytest.raises(BertkitError, match=r"eval_dataset has the dataset\(s\) \['extra'\]"):
        trainer(loss={"pairs": mnrl, "scored": cosent}, eval_dataset={"pairs": PAIRS, "extra": PAIRS})
    with pytest.raises(BertkitError, match=r"train_dataset\['scored'\] has the text columns \['anchor', 'positive'\] "
                                           r"and no label column; CoSENTLoss takes 2 text column"):
        trainer(loss={"pairs": mnrl, "scored": cosent}, train_dataset={"pairs": PAIRS, "scored": PAIRS})
    with pytest.raises(BertkitError, match="so train_dataset must be a dict of datasets"):
        trainer(loss={"pairs": mnrl}, train_dataset=PAIRS)
    with pytest.raises(BertkitError, match="train_dataset is an empty dict"):
        trainer(loss=mnrl, train_dataset={})
    with pytest.raises(BertkitError, match="multi_dataset_batch_sampler 'by_size' is not implemented"):
        st_args(tmp_path, multi_dataset_batch_sampler="by_size")
    encoder = CrossEncoder(cross_encoder_directory(minilm_2_layers, tmp_path / "ce"))
    with pytest.raises(BertkitError, match=r"train_dataset has the dataset\(s\) \['b'\], for which the loss dict"):
        CrossEncoderTrainer(model=encoder, args=CrossEncoderTrainingArguments(str(tmp_path / "out"), use_cpu=True),
                            loss={"a": ce_losses.BinaryCrossEntropyLoss(encoder)},
                            train_dataset={"a": [{"q": "a", "d": "b", "label": 1.0}], "b": [{"q": "a", "d": "b"}]})
    assert not (tmp_path / "out").exists()


# three training runs; a resume bit for bit and its refusal under another sampler are make test's in
# test_sentence_group_by_label.py::test_a_run_resumes_only_under_its_batch_sampler (the samplers in the same record)
@pytest.mark.slow
def test_a_resumed_run_is_the_uninterrupted_one(model_dir, tmp_path):
    """Stopped after step 3 of 7 (two epochs of 5 proportional batches) and resumed from its checkpoint, a multi-dataset run
    trains the same batches to the same losses and weights as the run that was not stopped, bit for bit; resumed
    with the other multi-dataset sampler, it is refused."""
    from bertkit.training.callbacks import TrainerCallback

    class StopAt3(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            control.should_training_stop = state.global_step == 3

    def run(out, resume=None, stop=False, sampler="proportional"):
        encoder = SentenceTransformer(model_dir)
        args = SentenceTransformerTrainingArguments(
            output_dir=str(out), per_device_train_batch_size=3, max_steps=7, learning_rate=1e-4, logging_steps=1,
            save_steps=3, report_to="none", use_cpu=True, disable_tqdm=True, seed=2, multi_dataset_batch_sampler=sampler)
        trainer = SentenceTransformerTrainer(
            model=encoder, args=args, train_dataset={"pairs": PAIRS, "scored": SCORED},
            loss={"pairs": losses.MultipleNegativesRankingLoss(encoder), "scored": losses.CoSENTLoss(encoder)},
            callbacks=[StopAt3()] if stop else None)
        trainer.train(resume_from_checkpoint=resume)
        return [r["loss"] for r in trainer.state.log_history if "loss" in r], encoder.state_dict()

    whole, whole_weights = run(tmp_path / "whole")
    first, _ = run(tmp_path / "cut", stop=True)
    with pytest.raises(BertkitError, match=r"other settings or data .*'samplers.multi_dataset_batch_sampler': "
                                           r"\('proportional', 'round_robin'\)"):
        run(tmp_path / "cut", resume=True, sampler="round_robin")  # other batches: refused before any work
    resumed, weights = run(tmp_path / "cut", resume=True)
    assert len(whole) == 7 and first == whole[:3] and resumed == whole
    assert all(torch.equal(weights[k], whole_weights[k]) for k in whole_weights)


def _sparse_steps(lib: str, checkpoint, out_dir) -> list[tuple[str, dict[str, float], float]]:
    """A sparse training script on the two datasets, a SpladeLoss each (the trainer adds each one's warm-up);
    ``lib`` picks the import. Each step's dataset, terms and query regulariser weight."""
    if lib == "sentence_transformers":
        import sentence_transformers as S
        from sentence_transformers.sparse_encoder import losses as L
    else:
        import bertkit.sentence as S
        from bertkit.sentence.sparse_encoder import losses as L
    model = S.SparseEncoder(str(checkpoint), device="cpu")
    model.max_seq_length = 16
    steps = []

    def recorded(name, base):
        class Recorded(L.SpladeLoss):
            def forward(self, features, labels=None):
                terms = super().forward(features, labels)
                if torch.is_grad_enabled():  # not an evaluation
                    steps.append((name, {k: v.item() for k, v in terms.items()}, self.query_regularizer_weight))
                return terms
        return Recorded(model, loss=base, document_regularizer_weight=3e-3, query_regularizer_weight=5e-3)

    loss = {"pairs": recorded("pairs", L.SparseMultipleNegativesRankingLoss(model)),
            "scored": recorded("scored", L.SparseCoSENTLoss(model))}
    args = S.SparseEncoderTrainingArguments(
        output_dir=str(out_dir), per_device_train_batch_size=3, max_steps=5, learning_rate=2e-5, logging_steps=1,
        save_strategy="no", report_to="none", seed=42, use_cpu=True, disable_tqdm=True)
    train = datasets.DatasetDict({"pairs": datasets.Dataset.from_list(PAIRS),
                                  "scored": datasets.Dataset.from_list(SCORED)})
    S.SparseEncoderTrainer(model=model, args=args, train_dataset=train, loss=loss).train()
    return steps


# the multi-dataset training it shares is make test's in test_training_script_gives_sentence_transformers_numbers
@pytest.mark.slow
def test_sparse_training_on_two_datasets_is_sentence_transformers(minilm_2_layers, tmp_path):
    """SparseEncoderTrainer shares the dense trainer's multi-dataset training: two SpladeLosses (each warmed up by
    a callback of its own) give the same dataset, terms and regulariser weight at every step."""
    pytest.importorskip("sentence_transformers")
    from sparse_helpers import masked_lm_checkpoint

    checkpoint = masked_lm_checkpoint(minilm_2_layers, tmp_path / "mlm", dropout=0.0)
    want = _sparse_steps("sentence_transformers", checkpoint, tmp_path / "st")
    got = _sparse_steps("bertkit", checkpoint, tmp_path / "bk")
    assert [(s[0], s[2]) for s in got] == [(s[0], s[2]) for s in want] and len(got) == 5
    assert {s[0] for s in got} == {"pairs", "scored"}
    for (_, got_terms, _), (_, want_terms, _) in zip(got, want):
        assert got_terms.keys() == want_terms.keys()
        np.testing.assert_allclose(list(got_terms.values()), list(want_terms.values()), rtol=1e-5, atol=1e-7)


def test_prompts_per_dataset_are_resolved_as_sentence_transformers(model, tmp_path):
    """``prompts`` for a dict of datasets: a dataset's name picks its prompt (one, or by column); a dict by dataset
    gives a dataset it does not name no prompt; a dict by column applies to every dataset. Each column's prompt is
    the one sentence-transformers' collator resolves for a batch of that dataset. A dict by dataset for a dataset of
    its own is refused (sentence-transformers refuses it at the first batch)."""
    collator = pytest.importorskip("sentence_transformers.sentence_transformer.data_collator")
    st_arguments = pytest.importorskip("sentence_transformers").SentenceTransformerTrainingArguments
    mnrl, cosent = losses.MultipleNegativesRankingLoss(model), losses.CoSENTLoss(model)
    loss = {"pairs": mnrl, "scored": cosent}
    for prompts in ({"pairs": "query: "}, {"pairs": {"anchor": "q: "}, "scored": {"s2": "d: "}},
                    {"scored": {"s1": "s: "}}, {"anchor": "q: ", "s2": "d: "}, "all: ",
                    '{"pairs": {"anchor": "q: "}}', '{"anchor": "q: "}', '"all: "'):  # JSON text: what it holds
        trainer = SentenceTransformerTrainer(model=model, args=st_args(tmp_path, prompts=prompts), loss=loss,
                                             train_dataset={"pairs": PAIRS, "scored": SCORED})
        theirs = st_arguments(output_dir=str(tmp_path / "st"), prompts=prompts, report_to="none").prompts
        reference = collator.SentenceTransformerDataCollator(preprocess_fn=None, prompts=theirs)
        for name, part in trainer.train_dataset.parts.items():
            resolved = reference._resolve_prompts({"dataset_name": name})
            assert part.prompts == [reference._get_prompt_for_column(resolved, c) for c in part.texts], (prompts, name)
    with pytest.raises(BertkitError, match=r"prompts maps dataset names \(\['pairs'\]\) to \{column: ...\}, and "
                                           "train_dataset is one dataset"):
        SentenceTransformerTrainer(model=model, args=st_args(tmp_path, prompts={"pairs": {"anchor": "q: "}}), loss=mnrl,
                                   train_dataset=PAIRS)


def test_a_prompt_for_no_text_column_is_refused_before_anything_is_written(model, tmp_path):
    """sentence-transformers leaves a prompt unused whose name is no text column (a misspelt column, the label column,
    a dataset's name for a dataset of its own) or no dataset: the model trains without the prompt meant for it, with
    nothing said. Refused, naming the keys, before anything is written; a column of the eval dataset alone is one the
    prompts may name."""
    mnrl, cosent = losses.MultipleNegativesRankingLoss(model), losses.CoSENTLoss(model)
    both = {"pairs": mnrl, "scored": cosent}
    for prompts, train, loss, unused in (
            ({"question": "q: "}, PAIRS, mnrl, "['question']"),
            ({"s1": "a: ", "score": "x: "}, SCORED, cosent, "['score']"),
            ({"pairs": "q: "}, PAIRS, mnrl, "['pairs']"),
            ({"anchor": "q: ", "s3": "d: "}, {"pairs": PAIRS, "scored": SCORED}, both, "['s3']"),
            ({"pairs": {"anchr": "q: "}}, {"pairs": PAIRS, "scored": SCORED}, both, "['pairs.anchr']"),
            ({"pairs": {"anchor": "q: "}, "other": {"s1": "a: "}}, {"pairs": PAIRS, "scored": SCORED}, both, "['other']")):
        with pytest.raises(BertkitError, match=rf"prompts names {re.escape(unused)}, no text column"):
            SentenceTransformerTrainer(model=model, args=st_args(tmp_path, prompts=prompts), loss=loss,
                                       train_dataset=train)
    assert not (tmp_path / "out").exists()
    trainer = SentenceTransformerTrainer(model=model, args=st_args(tmp_path, prompts={"negative": "n: "}), loss=mnrl,
                                         train_dataset=PAIRS, eval_dataset=[{**r, "negative": "x"} for r in PAIRS])
    assert trainer.eval_dataset.prompts == [None, None, "n: "]
    SentenceTransformerTrainer(model=model, args=st_args(tmp_path, prompts={"question": "q: "}), loss=mnrl,
                               evaluator=lambda *a, **k: {})  # no dataset: nothing to name


def _cross_encoder_steps(lib: str, model_dir, out_dir, sampler: str) -> list[tuple[str, int, float]]:
    """A cross-encoder training script on two datasets: BinaryCrossEntropyLoss on 0/1 labelled pairs, MSELoss on
    scored pairs; ``lib`` picks the import. Each step's dataset, rows and loss."""
    if lib == "sentence_transformers":
        from sentence_transformers.cross_encoder import (
            CrossEncoder,
            CrossEncoderTrainer,
            CrossEncoderTrainingArguments,
        )
        from sentence_transformers.cross_encoder import losses as L
    else:
        from bertkit.sentence.cross_encoder import (
            CrossEncoder,
            CrossEncoderTrainer,
            CrossEncoderTrainingArguments,
        )
        from bertkit.sentence.cross_encoder import losses as L
    model = CrossEncoder(str(model_dir), max_length=16)
    steps = []

    def recorded(cls, name):
        class Recorded(cls):
            def forward(self, inputs, labels, **kwargs):
                value = super().forward(inputs, labels, **kwargs)
                steps.append((name, len(labels), value.item()))
                return value
        return Recorded(model)

    args = CrossEncoderTrainingArguments(
        output_dir=str(out_dir), per_device_train_batch_size=3, max_steps=5, learning_rate=1e-4, logging_steps=1,
        save_strategy="no", report_to="none", seed=3, use_cpu=True, disable_tqdm=True,
        multi_dataset_batch_sampler=sampler)
    binary = [{"q": f"question {i}", "d": f"paragraph {i // 2}", "label": i % 2} for i in range(7)]
    scored = [{"q": r["s1"], "d": r["s2"], "score": r["score"]} for r in SCORED]
    train = datasets.DatasetDict({"binary": datasets.Dataset.from_list(binary),
                                  "scored": datasets.Dataset.from_list(scored)})
    CrossEncoderTrainer(model=model, args=args, train_dataset=train, loss={
        "binary": recorded(L.BinaryCrossEntropyLoss, "binary"), "scored": recorded(L.MSELoss, "scored")}).train()
    return steps


@pytest.mark.parametrize("sampler", slow_after(["round_robin", "proportional"]))
def test_cross_encoder_training_on_two_datasets_is_sentence_transformers(sampler, minilm_2_layers, tmp_path):
    """CrossEncoderTrainer shares the dense trainer's multi-dataset training: the same dataset and rows at every
    step, trained to the same loss."""
    pytest.importorskip("sentence_transformers")
    from cross_encoder_helpers import cross_encoder_directory

    model_dir = cross_encoder_directory(minilm_2_layers, tmp_path / "ce")
    want = _cross_encoder_steps("sentence_transformers", model_dir, tmp_path / "st", sampler)
    got = _cross_encoder_steps("bertkit", model_dir, tmp_path / "bk", sampler)
    assert [s[:2] for s in got] == [s[:2] for s in want] and len(got) == 5
    assert {s[0] for s in got} == {"binary", "scored"}
    np.testing.assert_allclose([s[2] for s in got], [s[2] for s in want], rtol=1e-5, atol=1e-7)
