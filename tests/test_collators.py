"""bertkit's data collators against transformers 5's on the same rows: what a script that swaps the import gets.

The hand-picked cases are in tests/test_trainer.py; here, what a randomized comparison found, and the comparison
itself (slow): rows drawn as users have them (lists, numpy, tensors, with or without token_type_ids and
attention_mask, label / labels / label_ids of every type, one row or several) through every collator, every
output key compared for dtype, shape and value, the masks of a seeded masked-LM collator equal.
"""

from __future__ import annotations

import copy
import random

import numpy as np
import pytest
import torch

import bertkit
from bertkit.errors import BertkitError

transformers = pytest.importorskip("transformers")

SENTENCES = ["a gripping, funny film", "the worst plot of the year, really", "ok", "don't stop believing in 東京"]


@pytest.fixture(scope="module")
def toks(minilm_dir):
    return bertkit.AutoTokenizer.from_pretrained(minilm_dir), transformers.AutoTokenizer.from_pretrained(minilm_dir)


def test_default_data_collator_is_importable_as_from_transformers():
    """run_glue / run_qa pick ``default_data_collator`` (the function) for rows padded to max_length; ``from bertkit
    import default_data_collator`` was an AttributeError."""
    rows = [{"input_ids": [101, 7592, 102], "attention_mask": [1, 1, 1], "label": 1, "idx": 7},
            {"input_ids": [101, 2088, 102], "attention_mask": [1, 1, 0], "label": 0, "idx": 8}]
    ours, theirs = bertkit.default_data_collator(rows), transformers.default_data_collator(rows)
    assert sorted(ours) == sorted(theirs) == ["attention_mask", "idx", "input_ids", "labels"]
    for key in theirs:
        assert ours[key].tolist() == theirs[key].tolist() and ours[key].dtype == theirs[key].dtype, key
    assert ours["labels"].tolist() == [1, 0]
    with pytest.raises(BertkitError, match=r"return_tensors='np'\): bertkit's collators return PyTorch tensors only"):
        bertkit.default_data_collator(rows, return_tensors="np")


LABELS = {
    "float64 tensor scores": [torch.tensor(1.5, dtype=torch.float64), torch.tensor(2.25, dtype=torch.float64)],
    "float16 tensor scores": [torch.tensor(1.5, dtype=torch.float16), torch.tensor(2.25, dtype=torch.float16)],
    "int32 tensor ids": [torch.tensor(1, dtype=torch.int32), torch.tensor(0, dtype=torch.int32)],
    "bool tensor ids": [torch.tensor(True), torch.tensor(False)],
    "multi-hot int lists": [[1, 0, 1], [0, 1, 0]],
    "multi-hot bool lists": [[True, False, True], [False, True, False]],
    "multi-hot int arrays": [np.array([1, 0, 1]), np.array([0, 1, 0])],
    "python floats": [1.5, 2.25], "numpy float64": [np.float64(1.5), np.float64(2.25)],
    "numpy float32": [np.float32(1.5), np.float32(2.25)], "python ints": [1, 0], "python bools": [True, False],
    "numpy int64": [np.int64(1), np.int64(0)], "float lists": [[0.5, 1.0], [1.5, 2.0]],
}


@pytest.mark.parametrize("kind", sorted(LABELS))
def test_default_collator_makes_each_kind_of_label_as_transformers(kind):
    """A ``label`` is a class id (int64) when the first is an integer, else a float32 target, as transformers'
    default_data_collator reads it. A float64 tensor label (a dataset's torch format on a float64 score column) came out
    float64, and multi-hot int rows int64, which bertkit's classifier reads as class ids and refuses where transformers
    trains a multi-label model on them."""
    rows = [{"input_ids": [101, 7592, 102], "label": value} for value in LABELS[kind]]
    ours, theirs = bertkit.default_data_collator(rows), transformers.default_data_collator(copy.deepcopy(rows))
    assert ours["labels"].dtype == theirs["labels"].dtype, (ours["labels"].dtype, theirs["labels"].dtype)
    assert ours["labels"].tolist() == theirs["labels"].tolist()


def test_the_masking_collator_refuses_numpy_or_tf_output_instead_of_returning_tensors(toks):
    """``DataCollatorForLanguageModeling(tok, return_tensors="np")`` returned torch tensors without a word (the other
    collators refuse it); transformers returns numpy arrays."""
    tok = toks[0]
    for value in ("np", "tf"):
        with pytest.raises(BertkitError, match=rf"DataCollatorForLanguageModeling\(return_tensors='{value}'\): "
                                               "bertkit's collators return PyTorch tensors only; use return_tensors"):
            bertkit.DataCollatorForLanguageModeling(tok, return_tensors=value)


@pytest.mark.parametrize("name", ["DataCollatorForLanguageModeling", "DataCollatorForTokenClassification",
                                  "DataCollatorForMultipleChoice", "DefaultDataCollator"])
def test_return_tensors_at_the_call_is_taken_as_transformers_collators_take_it(toks, name):
    """transformers' mixin collators take ``collator(features, return_tensors="pt")``; bertkit's (but the default
    collator's) were a TypeError. "pt" gives transformers' batch, another value is refused by name."""
    tok = toks[0]
    rows = [{"input_ids": [101, 7592, 2088, 102], "labels": [0, 1, 2, 0]}, {"input_ids": [101, 2088, 102],
                                                                          "labels": [0, 2, 0]}]
    if name == "DataCollatorForMultipleChoice":
        rows = [{"input_ids": [r["input_ids"], r["input_ids"][:2]], "label": i} for i, r in enumerate(rows)]
    if name == "DefaultDataCollator":
        rows = [{"input_ids": r["input_ids"][:3], "label": i} for i, r in enumerate(rows)]
    if name == "DataCollatorForLanguageModeling":
        rows = [{"input_ids": r["input_ids"]} for r in rows]
    kwargs = {"seed": 3, "mlm_probability": 0.5} if name == "DataCollatorForLanguageModeling" else {}
    make = (lambda lib: getattr(lib, name)(**kwargs)) if name == "DefaultDataCollator" else \
        (lambda lib: getattr(lib, name)(tok, **kwargs))
    ours = make(bertkit)(copy.deepcopy(rows), return_tensors="pt")
    theirs = make(transformers)(copy.deepcopy(rows), return_tensors="pt")
    assert sorted(ours) == sorted(theirs)
    for key in theirs:
        assert ours[key].tolist() == theirs[key].tolist() and ours[key].dtype == theirs[key].dtype, key
    with pytest.raises(BertkitError, match=rf"{name}\(return_tensors='np'\): bertkit's collators return PyTorch"):
        make(bertkit)(copy.deepcopy(rows), return_tensors="np")


# -------------------------------------------------------------------------------------------------
# The randomized comparison
# -------------------------------------------------------------------------------------------------

LABEL_VALUES = {"int": lambda r: r.randint(0, 2), "float": lambda r: r.choice([0.0, 0.5, 2.4]),
                "npint": lambda r: np.int64(r.randint(0, 2)), "pt": lambda r: torch.tensor(r.randint(0, 2)),
                "ptfloat": lambda r: torch.tensor(r.choice([0.0, 0.25, 3.0]))}


def _rows(rng: random.Random, tok, kind: str) -> list:
    """A batch as a dataset hands it over: one to six rows, pairs or not, columns of one container type."""
    texts = [rng.choice(SENTENCES) + " " + rng.choice(SENTENCES)[: rng.randint(0, 30)] for _ in range(rng.randint(1, 6))]
    padded = kind == "default"
    keys = ["input_ids"] + [k for k in ("token_type_ids", "attention_mask") if rng.random() < 0.6]
    container = rng.choice([list, list, np.array, torch.tensor])
    label = rng.choice([None, "label", "labels"] + (["label_ids"] if kind == "default" else []))
    value = LABEL_VALUES[rng.choice(sorted(LABEL_VALUES))]
    rows = []
    for text in texts:
        enc = tok(text, rng.choice(SENTENCES) if rng.random() < 0.3 else None, truncation=True, max_length=24,
                  padding="max_length" if padded else False)
        row = {k: container(enc[k]) for k in keys}
        if label is not None:
            row[label] = [rng.choice([-100, 0, 1, 4]) for _ in enc["input_ids"]] if kind == "tok" else value(rng)
        rows.append(row)
    if kind == "mc":
        rows = [{k: [v, v[: rng.randint(1, len(v))]] if k in keys else v for k, v in row.items()} for row in rows]
    if kind == "mlm" and rng.random() < 0.3:
        rows = [row["input_ids"] for row in rows]
    return rows


def _settings(rng: random.Random, kind: str) -> dict:
    if kind == "default":
        return {}
    if kind == "mlm":
        return {"mlm_probability": rng.choice([0.15, 0.5, 1.0]), "mask_replace_prob": rng.choice([0.8, 0.5, 0.0]),
                "random_replace_prob": rng.choice([0.1, 0.2]), "pad_to_multiple_of": rng.choice([None, 8]),
                "seed": rng.choice([None, rng.randint(0, 9)])}
    padding = rng.choice([True, "longest", "max_length"])
    return {"padding": padding, "max_length": rng.choice([None, 32]) if padding != "max_length" else 32,
            "pad_to_multiple_of": rng.choice([None, 8]),
            **({"label_pad_token_id": rng.choice([-100, 0])} if kind == "tok" else {})}


NAMES = {"pad": "DataCollatorWithPadding", "tok": "DataCollatorForTokenClassification", "mc": "DataCollatorForMultipleChoice",
         "mlm": "DataCollatorForLanguageModeling", "default": "DefaultDataCollator"}


@pytest.mark.slow
def test_random_batches_collate_as_transformers_collates_them(toks):
    """400 draws (about 10 s): both libraries' collators on the same rows, under the same torch seed, give the same
    keys, dtypes, shapes and values, or both refuse. The differences docs/coming-from-transformers.md lists are
    left out of the draws (float64 and int32 numpy columns, a token-classification ``label`` renamed ``labels``), and
    a multiple-choice label that is no whole number, refused where transformers truncates it."""
    compared = 0
    for draw in range(400):
        rng = random.Random(draw)
        kind = rng.choice(sorted(NAMES))
        tok = rng.choice(toks)
        rows, settings = _rows(rng, toks[1], kind), _settings(rng, kind)
        if kind == "tok":
            rows = [{("labels" if k == "label" else k): v for k, v in row.items()} for row in rows]
        results = []
        for lib, lib_tok in ((bertkit, tok), (transformers, toks[1])):
            cls = getattr(lib, NAMES[kind])
            torch.manual_seed(draw)
            try:
                collator = cls(**settings) if kind == "default" else cls(lib_tok, **settings)
                results.append(collator(copy.deepcopy(rows)))
            except (BertkitError, ValueError, KeyError, TypeError, IndexError) as e:
                results.append(type(e))
        ours, theirs = results
        if isinstance(theirs, type):  # transformers refuses (a scalar label_ids, a multiple-choice batch unlabelled)
            continue
        if kind == "mc" and ours is BertkitError and any(
                float(r[k]) != int(r[k]) for r in rows for k in ("label", "labels") if k in r):
            continue  # a choice label 2.4 is refused; transformers truncates it to 2
        assert not isinstance(ours, type), (draw, kind, settings, ours)
        assert sorted(ours) == sorted(theirs), (draw, kind, settings)
        for key in theirs:
            assert ours[key].dtype == theirs[key].dtype and ours[key].shape == theirs[key].shape, (draw, kind, key)
            assert torch.equal(ours[key], theirs[key]), (draw, kind, settings, key)
        compared += 1
    assert compared > 250


def test_multiple_choice_labels_are_never_truncated(toks):
    """transformers' DataCollatorForMultipleChoice casts every label to int64: a label 1.7 became choice 1, and soft
    targets [0.7, 0.3] became [0, 0], without a word (bertkit's did the same). Whole labels give its batch; rows of
    probabilities over the choices stay float32, as both libraries' BertForMultipleChoice take them; anything else is
    refused naming the example."""
    tok = toks[0]
    rows = [{"input_ids": [[101, 7592, 102], [101, 2088, 2003, 102]]}, {"input_ids": [[101, 2088, 102], [101, 102]]}]
    for labels in ([1, 0], [1.0, 0.0], [True, False], [np.int64(1), np.int64(0)]):
        features = [{**r, "label": v} for r, v in zip(rows, labels)]
        ours = bertkit.DataCollatorForMultipleChoice(tok)(copy.deepcopy(features))
        theirs = transformers.DataCollatorForMultipleChoice(toks[1])(copy.deepcopy(features))
        for key in theirs:
            assert ours[key].dtype == theirs[key].dtype and torch.equal(ours[key], theirs[key]), (labels, key)
    soft = bertkit.DataCollatorForMultipleChoice(tok)([{**r, "labels": v} for r, v in zip(rows, ([0.7, 0.3], [0, 1]))])
    assert soft["labels"].dtype == torch.float32 and soft["labels"].tolist() == [[0.699999988079071, 0.30000001192092896],
                                                                                  [0.0, 1.0]]
    for bad, shown in ((1.7, "1.7"), (float("nan"), "nan"), ([0.5, 0.25, 0.25], r"\[0.5, 0.25, 0.25\]")):
        with pytest.raises(BertkitError, match=rf"example 1 of the batch has label {shown}; a label is the index of "
                                               r"the right one of the 2 choices \(an int\), or 2 probabilities"):
            bertkit.DataCollatorForMultipleChoice(tok)([{**rows[0], "label": 0}, {**rows[1], "label": bad}])
