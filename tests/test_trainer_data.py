"""Data a notebook makes in the ordinary way, given to bertkit.Trainer and its collators: labels as strings, pandas
floats, a NaN, all -100; a dict of eval sets; a streaming dataset; a text column kept; per-token labels longer than
the input; rows of different lengths for DefaultDataCollator. Each is read as transformers' models read it, or
named with its row and the fix, before anything trains (none ends in an error from inside PyTorch or numpy)."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import numpy as np
import pytest
import torch

import bertkit
from bertkit.errors import BertkitError
from trainer_helpers import TEST, TRAIN, _losses, accuracy, tiny_classifier

transformers = pytest.importorskip("transformers")
datasets = pytest.importorskip("datasets")
pd = pytest.importorskip("pandas")
pytest.importorskip("accelerate")  # transformers' Trainer needs it


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, minilm_2_layers) -> Path:
    return tiny_classifier(tmp_path_factory.mktemp("data") / "tiny-classifier", minilm_2_layers)


@pytest.fixture(scope="module")
def tok(checkpoint):
    return bertkit.AutoTokenizer.from_pretrained(checkpoint)


def _dataset(tok, rows: list[dict]):
    return datasets.Dataset.from_list(rows).map(lambda b: tok(b["text"], truncation=True), batched=True)


def _labelled(rows: list[dict], label) -> list[dict]:
    return [{**r, "label": label(r["label"])} for r in rows]


def _train(checkpoint, tok, out: Path, train, model=None, collator=None, **overrides):
    args = dict(output_dir=str(out), max_steps=3, per_device_train_batch_size=4, learning_rate=1e-3, logging_steps=1,
                save_strategy="no", use_cpu=True, seed=7, disable_tqdm=True)
    model = model if model is not None else bertkit.AutoModelForSequenceClassification.from_pretrained(checkpoint)
    trainer = bertkit.Trainer(model=model, args=bertkit.TrainingArguments(**{**args, **overrides}),
                              train_dataset=train, processing_class=tok, data_collator=collator)
    trainer.train()
    return [loss for _, loss, _ in _losses(trainer.state.log_history)]


def test_string_labels_go_through_the_configs_label2id_or_are_named(checkpoint, tok, tmp_path):
    """"pos"/"neg" labels met `ValueError: too many dimensions 'str'` inside torch.tensor."""
    words = _dataset(tok, _labelled(TRAIN, lambda y: "pos" if y else "neg"))
    named = bertkit.AutoModelForSequenceClassification.from_pretrained(checkpoint, id2label={0: "neg", 1: "pos"})
    ids = _train(checkpoint, tok, tmp_path / "ids", _dataset(tok, TRAIN))
    assert _train(checkpoint, tok, tmp_path / "words", words, model=named) == ids  # the same run, step by step
    with pytest.raises(BertkitError, match=re.escape(
            "train_dataset: label holds strings ['neg', 'pos'], but the model's config names its labels ['LABEL_0', "
            "'LABEL_1']; name them when loading the model (from_pretrained(..., id2label={0: 'neg', 1: 'pos'}, "
            "label2id={'neg': 0, 'pos': 1})), or map label to ids (dataset.class_encode_column('label'))")):
        _train(checkpoint, tok, tmp_path / "unnamed", words)


def test_whole_number_float_labels_are_class_ids_and_others_are_named(checkpoint, tok, tmp_path, caplog):
    """A pandas-made dataset's 0.0/1.0 labels on a two-label head met "Target size (torch.Size([4])) must be the
    same as input size (torch.Size([4, 2]))" from the multi-label loss (transformers' own inference)."""
    frame = pd.DataFrame(TRAIN)
    frame["label"] = frame["label"].astype(float)
    floats = datasets.Dataset.from_pandas(frame).map(lambda b: tok(b["text"], truncation=True), batched=True)
    assert floats.features["label"].dtype == "float64"
    ids = _train(checkpoint, tok, tmp_path / "ids", _dataset(tok, TRAIN))
    with caplog.at_level(logging.WARNING, logger="bertkit"):
        assert _train(checkpoint, tok, tmp_path / "floats", floats) == ids
    assert "train_dataset: label holds floats (0.0, 1.0); read as the class ids 0, 1, for " \
           "BertForSequenceClassification's 2-label classification" in caplog.text
    with pytest.raises(BertkitError, match=re.escape(
            "train_dataset: label 0.3 at row 0 is not a class id, and BertForSequenceClassification classifies "
            "into 2 labels; give class ids 0..1, or for a score load the model with num_labels=1 (regression)")):
        _train(checkpoint, tok, tmp_path / "scores", _dataset(tok, _labelled(TRAIN, lambda y: 0.3 + y)))


def test_a_nan_label_is_named_by_its_row(checkpoint, tok, tmp_path):
    rows = _labelled(TRAIN, float)
    rows[5]["label"] = float("nan")
    with pytest.raises(BertkitError, match=re.escape("train_dataset: row 5 has label nan; every example needs a "
                                                     "label: give it one, or drop the row")):
        _train(checkpoint, tok, tmp_path / "out", _dataset(tok, rows))
    assert not (tmp_path / "out").exists()


def test_a_label_that_is_no_class_is_named_by_its_row_before_training(checkpoint, tok, tmp_path):
    """A class id the two-label head does not have (2, or a -1 for "unknown") was refused by the head at the step
    whose batch held it: the run failed there, after the steps before it, or trained on when max_steps ended first."""
    for value in (2, -1):
        rows = [dict(r) for r in TRAIN]
        rows[-1]["label"] = value
        with pytest.raises(BertkitError, match=re.escape(
                f"train_dataset: label {value} at row {len(rows) - 1} is not a class of BertForSequenceClassification, "
                "whose 2 labels are 0 to 1 (or -100 for no loss)")):
            _train(checkpoint, tok, tmp_path / "out", _dataset(tok, rows))
    assert not (tmp_path / "out").exists()
    rows[-1]["label"] = -100  # no loss: kept
    assert len(_train(checkpoint, tok, tmp_path / "out", _dataset(tok, rows))) == 3


def test_labels_that_are_all_ignored_are_named_not_blamed_on_the_learning_rate(checkpoint, tok, tmp_path):
    """All -100 stopped with "the loss is nan ... Lower --learning-rate" (sequence labels) or trained on nothing at
    loss 0.0 (token labels)."""
    with pytest.raises(BertkitError, match="train_dataset: no example has a label to learn from: every label is -100"):
        _train(checkpoint, tok, tmp_path / "seq", _dataset(tok, _labelled(TRAIN, lambda y: -100)))
    rows = [{**dict(tok(r["text"])), "labels": [-100] * len(tok(r["text"])["input_ids"])} for r in TRAIN]
    tagger = bertkit.AutoModelForTokenClassification.from_pretrained(checkpoint)
    with pytest.raises(BertkitError, match="train_dataset: no example has a label to learn from: every token's "
                                           "labels is -100"):
        _train(checkpoint, tok, tmp_path / "tok", rows, model=tagger,
               collator=bertkit.DataCollatorForTokenClassification(tok))


def test_token_labels_of_another_length_than_the_input_are_named(checkpoint, tok, tmp_path):
    """Labels longer than the input met "expected sequence of length 14 at dim 1 (got 16)" from torch.tensor, or
    trained silently on labels shifted against the tokens when the row was not the batch's longest."""
    rows = [{"input_ids": [101, 2000 + i, 2050 + i, 102], "labels": [-100, 1, 0, -100]} for i in range(12)]
    rows[3]["labels"] = rows[3]["labels"] + [0, 0]
    tagger = bertkit.AutoModelForTokenClassification.from_pretrained(checkpoint)
    collator = bertkit.DataCollatorForTokenClassification(tok)
    with pytest.raises(BertkitError, match=re.escape("train_dataset: row 3 has 6 labels for 4 input_ids; give one "
                                                     "label per token")):
        _train(checkpoint, tok, tmp_path / "out", rows, model=tagger, collator=collator)
    # the collator alone (a DataLoader's collate_fn) names the example of its batch
    with pytest.raises(BertkitError, match=re.escape("DataCollatorForTokenClassification: example 1 of the batch "
                                                     "has 6 labels for 4 input_ids")):
        collator(rows[2:4])


def test_default_collator_names_rows_of_different_lengths(checkpoint, tok, tmp_path):
    """DefaultDataCollator on unpadded rows met numpy's "setting an array element with a sequence. The requested
    array has an inhomogeneous shape after 1 dimensions"."""
    rows = [dict(tok("the movie was great")), dict(tok("bad"))]
    with pytest.raises(BertkitError, match=re.escape(
            "DefaultDataCollator stacks examples of one length, but 'input_ids' has 6 values in example 0 of the "
            "batch and 3 in example 1; use DataCollatorWithPadding(tokenizer)")):
        bertkit.DefaultDataCollator()(rows)
    with pytest.raises(BertkitError, match="DefaultDataCollator stacks examples of one length"):
        _train(checkpoint, None, tmp_path / "out", _dataset(tok, TRAIN))  # no tokenizer: DefaultDataCollator


def test_a_text_column_kept_for_a_padding_collator_is_named(checkpoint, tok, tmp_path):
    """remove_unused_columns=False with the text column met "too many dimensions 'str'" inside tokenizer.pad."""
    with pytest.raises(BertkitError, match=re.escape(
            "DataCollatorWithPadding: column(s) ['text'] hold text, which cannot be padded into a tensor; remove "
            "them (dataset.remove_columns(['text'])) or keep remove_unused_columns=True in TrainingArguments")):
        _train(checkpoint, tok, tmp_path / "out", _dataset(tok, TRAIN), remove_unused_columns=False)
    with pytest.raises(BertkitError, match=re.escape("DataCollatorForLanguageModeling: column(s) ['text'] hold text")):
        bertkit.DataCollatorForLanguageModeling(tok, seed=0)([{**dict(tok("a fine plot")), "text": "a fine plot"}])


def test_a_dataset_tokenized_by_with_transform_trains_as_the_mapped_one(checkpoint, tok, tmp_path):
    """ds.with_transform(tokenize) with remove_unused_columns=True (the default) stopped with KeyError: 'text' before
    the first step (as transformers does): the Arrow column the transform reads was removed as unused. The transform's
    keys the model does not take are left out of its rows instead: the run of the mapped dataset, loss for loss, with
    the extra column "idx" the transform passes on."""
    rows = [{**r, "idx": i} for i, r in enumerate(TRAIN)]
    lazy = datasets.Dataset.from_list(rows).with_transform(
        lambda b: {**tok(b["text"], truncation=True), "label": b["label"], "idx": b["idx"]})
    assert _train(checkpoint, tok, tmp_path / "lazy", lazy) == _train(checkpoint, tok, tmp_path / "mapped",
                                                                      _dataset(tok, rows))


def test_an_iterable_dataset_is_refused_naming_what_to_give(checkpoint, tok, tmp_path):
    """A datasets streaming dataset met "TypeError: object of type 'IterableDataset' has no len()"."""
    stream = _dataset(tok, TRAIN).to_iterable_dataset()

    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter(_dataset(tok, TRAIN).remove_columns(["text"]))

    for data, name in ((stream, "IterableDataset"), (Stream(), "Stream")):
        with pytest.raises(BertkitError, match=re.escape(f"train_dataset: {name} has no length or index (an iterable "
                                                         "or streaming dataset)")):
            _train(checkpoint, tok, tmp_path / "out", data)


def test_a_dict_of_eval_sets_is_evaluated_set_by_set_as_transformers_does(checkpoint, tok, tmp_path):
    """eval_dataset={"a": ..., "b": ...} met "KeyError: 0"; transformers evaluates each set, prefixed eval_{name}_."""
    sets = {"a": _dataset(tok, TEST), "b": _dataset(tok, TRAIN[:8])}
    results = []
    for lib in (transformers, bertkit):
        args = lib.TrainingArguments(output_dir=str(tmp_path / lib.__name__), per_device_eval_batch_size=4,
                                     use_cpu=True, report_to="none", disable_tqdm=True)
        trainer = lib.Trainer(model=lib.AutoModelForSequenceClassification.from_pretrained(checkpoint), args=args,
                              eval_dataset=sets, processing_class=tok, compute_metrics=accuracy,
                              data_collator=lib.DataCollatorWithPadding(tok))
        results.append({k: v for k, v in trainer.evaluate().items() if k.endswith(("_loss", "_accuracy"))})
        # a set by its name, under the prefix given (was read as a dataset of one row, the string)
        results.append({k: v for k, v in trainer.evaluate("b").items() if k.endswith(("_loss", "_accuracy"))})
    theirs, theirs_b, ours, ours_b = results
    assert sorted(ours) == sorted(theirs) == ["eval_a_accuracy", "eval_a_loss", "eval_b_accuracy", "eval_b_loss"]
    for key in theirs:
        assert ours[key] == pytest.approx(theirs[key], rel=1e-5), key
    assert sorted(ours_b) == sorted(theirs_b) == ["eval_accuracy", "eval_loss"]
    assert ours_b["eval_loss"] == pytest.approx(theirs_b["eval_loss"], rel=1e-5) == theirs["eval_b_loss"]

    # during training: each set at each evaluation, and the best model chosen by a metric of one set
    args = bertkit.TrainingArguments(output_dir=str(tmp_path / "best"), max_steps=4, per_device_train_batch_size=4,
                                     learning_rate=1e-3, eval_strategy="steps", eval_steps=2, save_steps=2,
                                     load_best_model_at_end=True, metric_for_best_model="b_accuracy", use_cpu=True,
                                     seed=7, disable_tqdm=True)
    trainer = bertkit.Trainer(model=bertkit.AutoModelForSequenceClassification.from_pretrained(checkpoint), args=args,
                              train_dataset=_dataset(tok, TRAIN), eval_dataset=sets, processing_class=tok,
                              compute_metrics=accuracy)
    trainer.train()
    evals = [h for h in trainer.state.log_history if "eval_b_accuracy" in h]
    assert [h["step"] for h in evals] == [2, 4]
    # one record per set at each evaluation, as transformers' evaluate() logs each set's on its own
    assert [sorted({k.split("_")[1] for k in h if k.startswith("eval_")}) for h in trainer.state.log_history
            if any(k.startswith("eval_") for k in h)] == [["a"], ["b"]] * 2
    assert trainer.state.best_metric == max(h["eval_b_accuracy"] for h in evals)

    # the default metric, the loss, is per set: the choice is named
    args = bertkit.TrainingArguments(output_dir=str(tmp_path / "loss"), max_steps=2, eval_strategy="steps",
                                     eval_steps=2, save_steps=2, load_best_model_at_end=True, use_cpu=True)
    with pytest.raises(BertkitError, match=re.escape(
            "metric_for_best_model 'loss' is not a metric this run computes: evaluation returns ['eval_a_loss', "
            "'eval_a_accuracy', 'eval_b_loss', 'eval_b_accuracy']")):
        bertkit.Trainer(model=bertkit.AutoModelForSequenceClassification.from_pretrained(checkpoint), args=args,
                        train_dataset=_dataset(tok, TRAIN), eval_dataset=sets, processing_class=tok,
                        compute_metrics=accuracy).train()


def test_fp16_on_a_cpu_trains_in_fp32_as_transformers_does(checkpoint, tok, tmp_path, caplog):
    """fp16=True on a CPU ran float16 autocast: 31x slower than fp32 per MiniLM step on an AVX2 CPU, without a
    word. transformers' Trainer (accelerate) enables fp16 on GPUs only."""
    data = _dataset(tok, TRAIN)
    fp32 = _train(checkpoint, tok, tmp_path / "fp32", data)
    with caplog.at_level(logging.WARNING, logger="bertkit"):
        assert _train(checkpoint, tok, tmp_path / "fp16", data, fp16=True) == fp32
    assert "fp16=True on the CPU: training runs in fp32, as transformers' Trainer does there" in caplog.text


def test_whole_word_masking_honours_explicit_replace_shares(tok):
    """whole_word_mask=True replaced mask_replace_prob=0.5, random_replace_prob=0.3 with 1.0 and 0.0 silently."""
    texts = ["unbelievably tokenization isn't trivial for the zygote", "the quick brown fox jumps over the lazy dog"]
    features = [dict(tok(t, return_offsets_mapping=True)) for t in texts * 64]
    collator = bertkit.DataCollatorForLanguageModeling(tok, whole_word_mask=True, mlm_probability=0.3,
                                                       mask_replace_prob=0.5, random_replace_prob=0.3, seed=0)
    assert (collator.mask_replace_prob, collator.random_replace_prob) == (0.5, 0.3)
    batch = collator(features)
    targets = batch["labels"] != -100
    original = torch.tensor(_padded(features, tok.pad_token_id))
    as_mask = batch["input_ids"][targets] == tok.mask_token_id
    kept = batch["input_ids"][targets] == original[targets]
    n = int(targets.sum())
    assert n > 300
    assert abs(float(as_mask.float().mean()) - 0.5) < 0.08
    changed = 1 - float(as_mask.float().mean()) - float(kept.float().mean())  # random tokens
    assert abs(changed - 0.3) < 0.08
    # neither share given: every piece of a chosen word becomes [MASK], as transformers does
    default = bertkit.DataCollatorForLanguageModeling(tok, whole_word_mask=True, seed=0)
    assert (default.mask_replace_prob, default.random_replace_prob) == (1.0, 0.0)


def _padded(features: list[dict], pad: int) -> list[list[int]]:
    width = max(len(f["input_ids"]) for f in features)
    return [f["input_ids"] + [pad] * (width - len(f["input_ids"])) for f in features]



def test_a_batch_whose_labels_are_all_ignored_is_named_not_blamed_on_the_learning_rate(checkpoint, tok, tmp_path):
    """One labelled row among ignored ones passes the dataset check, but a batch of only -100 has a nan mean loss:
    the error says so, and does not tell the user to lower the learning rate."""
    rows = _labelled(TRAIN, lambda y: -100)
    rows[0]["label"] = 1
    with pytest.raises(BertkitError, match="every label of this batch is -100") as caught:
        _train(checkpoint, tok, tmp_path / "out", _dataset(tok, rows))
    assert "learning-rate" not in str(caught.value)


def test_a_seeded_masking_collator_draws_other_masks_in_each_dataloader_worker(checkpoint, tok):
    """The collator made its generator when built, so the Trainer's loader workers (2 to 4 on a GPU) each forked the
    same one: worker 1's first batch masked exactly the positions worker 0's did (agreement 1.0 on 98 token
    positions; 0.58 with transformers, whose workers seed ``seed + worker id``). Now as transformers: one generator
    per process, made on first use, and the masks are those of transformers' collator worker for worker."""
    rows = [dict(tok(t, truncation=True, max_length=16, padding="max_length")) for t in [r["text"] for r in TRAIN] * 4]

    def masks(lib, tokenizer, num_workers):
        collator = lib.DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.3, seed=0)
        loader = torch.utils.data.DataLoader(rows, batch_size=4, num_workers=num_workers, collate_fn=collator)
        return [batch["labels"] != -100 for batch in loader]

    theirs_tok = transformers.AutoTokenizer.from_pretrained(checkpoint)
    ours = masks(bertkit, tok, 2)
    assert len(ours) >= 4 and not torch.equal(ours[0], ours[1])  # worker 0's first batch, worker 1's first batch
    for workers in (2, 0):
        theirs = masks(transformers, theirs_tok, workers)
        assert all(torch.equal(a, b) for a, b in zip(masks(bertkit, tok, workers), theirs, strict=True))


def test_default_collator_refuses_a_string_label_it_used_to_drop(tok):
    """A 'label' of strings was skipped like any text column: the batch had no labels and nothing said so
    (transformers fails on it: "too many dimensions 'str'")."""
    rows = [{"input_ids": [101, 2204, 102], "label": "pos"}, {"input_ids": [101, 2919, 102], "label": "neg"}]
    with pytest.raises(BertkitError, match=re.escape("DefaultDataCollator: 'label' holds strings ('pos'); labels are "
                                                     "class ids or scores: map names to ids with")):
        bertkit.DefaultDataCollator()(rows)
    assert sorted(bertkit.DefaultDataCollator()([{**r, "label": 1} for r in rows])) == ["input_ids", "labels"]


@pytest.mark.parametrize("lib", [bertkit, transformers], ids=["bertkit", "transformers"])
def test_a_seeded_collators_process_id_is_not_a_setting_a_resume_must_share(checkpoint, tok, tmp_path, lib):
    """A seeded masking collator remembers the process that made its generator (``_generator_pid``, transformers'
    and now bertkit's); the resume fingerprint took it for a setting, so a resumed run (another process) was refused
    as another run."""
    tokenizer = tok if lib is bertkit else transformers.AutoTokenizer.from_pretrained(checkpoint)
    trainer = bertkit.Trainer(
        model=bertkit.AutoModelForSequenceClassification.from_pretrained(checkpoint),
        args=bertkit.TrainingArguments(output_dir=str(tmp_path / "out"), use_cpu=True, disable_tqdm=True),
        data_collator=lib.DataCollatorForLanguageModeling(tokenizer, seed=3), processing_class=tok)
    examples = [dict(tok(r["text"])) for r in TRAIN]
    trainer.data_collator(examples[:2])
    settings = trainer._fingerprint(examples, 3, 1)["trainer"]["data_collator"]["DataCollatorForLanguageModeling"]
    assert settings["seed"] == 3 and settings["mlm_probability"] == 0.15
    assert not any(k.startswith("_") for k in settings), settings


def test_a_model_returning_tuples_is_refused_not_predicted_as_none(checkpoint, tok, tmp_path):
    """config.return_dict=False: transformers' Trainer takes the loss and logits from the tuple; bertkit's predict()
    returned predictions None and no test_loss (compute_metrics fed None), and train() met "'tuple' object has no
    attribute 'loss'"."""
    data = _dataset(tok, TEST)
    args = dict(use_cpu=True, report_to="none", disable_tqdm=True, per_device_eval_batch_size=4)
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(checkpoint)
    hf.config.return_dict = False
    expected = transformers.Trainer(model=hf, args=transformers.TrainingArguments(str(tmp_path / "hf"), **args),
                                    processing_class=transformers.AutoTokenizer.from_pretrained(checkpoint)).predict(data)
    model = bertkit.AutoModelForSequenceClassification.from_pretrained(checkpoint)
    trainer = bertkit.Trainer(model=model, args=bertkit.TrainingArguments(str(tmp_path / "bk"), **args),
                              train_dataset=data, processing_class=tok)
    got = trainer.predict(data)
    torch.testing.assert_close(got.predictions, expected.predictions, rtol=1e-5, atol=1e-6)
    assert got.metrics["test_loss"] == pytest.approx(expected.metrics["test_loss"], rel=1e-5)
    model.config.return_dict = False
    fix = re.escape("the model's config sets return_dict=False, so BertForSequenceClassification returns tuples, and "
                    "bertkit's Trainer reads its outputs by name (loss, logits); set model.config.return_dict = True")
    with pytest.raises(BertkitError, match=f"test_dataset: {fix}"):
        trainer.predict(data)
    with pytest.raises(BertkitError, match=f"train_dataset: {fix}"):
        trainer.train()
    assert not (tmp_path / "bk").exists()  # refused before anything is written


def test_a_key_the_collator_adds_is_named_as_the_collators(checkpoint, tok, tmp_path):
    """A data_collator returning a key the model does not take (an example id): transformers' Trainer passes it to
    the model's **kwargs, which ignore it; bertkit refused it as a dataset column, asking to remove it from the
    dataset or keep remove_unused_columns=True (which it was)."""
    def with_id(collate):
        return lambda rows: {**collate(rows), "row_id": torch.arange(len(rows))}

    args = dict(max_steps=3, per_device_train_batch_size=4, learning_rate=1e-3, logging_steps=1, save_strategy="no",
                use_cpu=True, seed=7, disable_tqdm=True, report_to="none")
    hf_tok = transformers.AutoTokenizer.from_pretrained(checkpoint)
    hf = transformers.Trainer(model=transformers.AutoModelForSequenceClassification.from_pretrained(checkpoint),
                              args=transformers.TrainingArguments(str(tmp_path / "hf"), **args),
                              train_dataset=_dataset(tok, TRAIN), processing_class=hf_tok,
                              data_collator=with_id(transformers.DataCollatorWithPadding(hf_tok)))
    hf.train()
    losses = _train(checkpoint, tok, tmp_path / "bk", _dataset(tok, TRAIN))
    assert losses == pytest.approx([loss for _, loss, _ in _losses(hf.state.log_history)], rel=1e-5)
    with pytest.raises(BertkitError, match=re.escape(
            "train_dataset: the data_collator returns ['row_id'], which are not arguments of "
            "BertForSequenceClassification.forward (input_ids, ")):
        _train(checkpoint, tok, tmp_path / "bk-id", _dataset(tok, TRAIN),
               collator=with_id(bertkit.DataCollatorWithPadding(tok)))
    assert not (tmp_path / "bk-id").exists()


@pytest.mark.parametrize("lib", ["transformers", "bertkit"])
def test_eval_prediction_has_transformers_fields(checkpoint, tok, tmp_path, lib):
    """transformers 5's EvalPrediction has ``losses`` (None unless include_for_metrics asks for them): a
    compute_metrics reading it met AttributeError under bertkit."""
    L = transformers if lib == "transformers" else bertkit
    seen = []

    def metrics(p):
        seen.append((p.inputs, p.losses, len(tuple(p))))
        return accuracy(p)

    model = L.AutoModelForSequenceClassification.from_pretrained(checkpoint)
    trainer = L.Trainer(model=model, args=L.TrainingArguments(str(tmp_path), use_cpu=True, report_to="none"),
                        processing_class=L.AutoTokenizer.from_pretrained(checkpoint), compute_metrics=metrics)
    got = trainer.evaluate(_dataset(tok, TEST))
    assert seen == [(None, None, 2)]
    assert (got["eval_loss"], got["eval_accuracy"]) == (pytest.approx(0.690184, rel=1e-5), pytest.approx(11 / 13))
    p = bertkit.EvalPrediction(np.zeros(2), np.ones(2), losses=np.full(2, 0.5))
    assert [x.tolist() for x in p] == [[0.0, 0.0], [1.0, 1.0], [0.5, 0.5]]


class _DictOutput(torch.nn.Module):
    """A custom model around a head, returning its outputs as a dict (or a tuple), as hand-written models do."""

    def __init__(self, head, kind: str):
        super().__init__()
        self.head, self.kind, self.config = head, kind, head.config

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None):
        out = self.head(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids, labels=labels)
        return {"loss": out.loss, "logits": out.logits} if self.kind == "dict" else (out.loss, out.logits)


def test_a_model_returning_a_dict_or_tuple_is_named_not_predicted_as_none(checkpoint, tok, tmp_path):
    """transformers' Trainer reads a dict's or tuple's loss and logits; bertkit's predict() returned predictions None
    and no test_loss, and compute_metrics was handed the None (one taking np.asarray of it scored 0.5 on 10 SST-2 rows)."""
    data = _dataset(tok, TEST)
    args = dict(use_cpu=True, report_to="none", disable_tqdm=True, per_device_eval_batch_size=4)
    head = transformers.AutoModelForSequenceClassification.from_pretrained(checkpoint)
    hf_tok = transformers.AutoTokenizer.from_pretrained(checkpoint)
    plain = bertkit.Trainer(model=bertkit.AutoModelForSequenceClassification.from_pretrained(checkpoint),
                            args=bertkit.TrainingArguments(str(tmp_path / "bk"), **args), processing_class=tok)
    expected = plain.predict(data)
    for kind in ("dict", "tuple"):
        theirs = transformers.Trainer(model=_DictOutput(head, kind), processing_class=hf_tok,
                                      args=transformers.TrainingArguments(str(tmp_path / "hf"), **args)).predict(data)
        torch.testing.assert_close(theirs.predictions, expected.predictions, rtol=1e-5, atol=1e-6)
        assert theirs.metrics["test_loss"] == pytest.approx(expected.metrics["test_loss"], rel=1e-5)
        model = _DictOutput(bertkit.AutoModelForSequenceClassification.from_pretrained(checkpoint), kind)
        trainer = bertkit.Trainer(model=model, args=bertkit.TrainingArguments(str(tmp_path / "bk"), **args),
                                  processing_class=tok, compute_metrics=accuracy)
        with pytest.raises(BertkitError, match=re.escape(
                f"_DictOutput's outputs are a {kind} (what its forward returned")):
            trainer.predict(data)


def test_label_names_the_model_does_not_take_are_named(checkpoint, tok, tmp_path):
    """label_names=["label"] (the dataset's column, which the collator renames labels): transformers' Trainer then finds
    no labels, its predictions a tuple (the batch losses, the logits); bertkit's predict() gave the logits with
    test_loss but label_ids None and no metrics."""
    data = _dataset(tok, TEST)
    args = dict(use_cpu=True, report_to="none", disable_tqdm=True, per_device_eval_batch_size=4, label_names=["label"])
    theirs = transformers.Trainer(model=transformers.AutoModelForSequenceClassification.from_pretrained(checkpoint),
                                  args=transformers.TrainingArguments(str(tmp_path / "hf"), **args),
                                  processing_class=transformers.AutoTokenizer.from_pretrained(checkpoint),
                                  compute_metrics=accuracy).predict(data)
    assert theirs.label_ids is None and [p.shape for p in theirs.predictions] == [(4,), (13, 2)]
    with pytest.raises(BertkitError, match=re.escape(
            "label_names ['label'] are not arguments of BertForSequenceClassification.forward (input_ids, ")):
        bertkit.Trainer(model=bertkit.AutoModelForSequenceClassification.from_pretrained(checkpoint),
                        args=bertkit.TrainingArguments(str(tmp_path / "bk"), **args), processing_class=tok)
    assert not (tmp_path / "bk").exists()


def test_a_dataset_dict_where_one_dataset_is_expected_is_named_with_its_splits(checkpoint, tok, tmp_path):
    """load_dataset(...) without split= gives a DatasetDict: as train_dataset or predict()'s data it stopped with
    "AttributeError: 'DatasetDict' object has no attribute 'format'" (a plain dict: "KeyError: 0") from inside bertkit.
    It is named with its splits and the one to pass; a dict as eval_dataset is still evaluated split by split."""
    splits = datasets.DatasetDict({"train": _dataset(tok, TRAIN[:8]), "validation": _dataset(tok, TEST[:5])})
    with pytest.raises(BertkitError, match=re.escape(
            "train_dataset is a DatasetDict of the datasets ['train', 'validation'], where one dataset is expected: "
            "pass one of them (train_dataset=dataset['train'])")):
        _train(checkpoint, tok, tmp_path / "dict", splits)
    with pytest.raises(BertkitError, match=re.escape("train_dataset is a dict of the datasets ['a']")):
        _train(checkpoint, tok, tmp_path / "plain", {"a": splits["train"]})
    args = bertkit.TrainingArguments(output_dir=str(tmp_path / "predict"), use_cpu=True, disable_tqdm=True)
    trainer = bertkit.Trainer(model=bertkit.AutoModelForSequenceClassification.from_pretrained(checkpoint), args=args,
                              processing_class=tok)
    with pytest.raises(BertkitError, match=re.escape(
            "test_dataset is a DatasetDict of the datasets ['train', 'validation'], where one dataset is expected: "
            "pass one of them (test_dataset=dataset['train'])")):
        trainer.predict(splits)
    assert sorted(k for k in trainer.evaluate(splits) if k.endswith("_loss")) == ["eval_train_loss",
                                                                                 "eval_validation_loss"]
    with pytest.raises(BertkitError, match=re.escape("eval_dataset is empty (0 rows): give it rows (a filter or "
                                                     "select may have left none)")):
        trainer.evaluate(splits["train"].select([]))
