"""A generator (any iterator) given to a pipeline gives an iterator of results, read as they are taken, as
transformers' pipelines stream one: the first result after the first batch of inputs, results in input order, the
rows batched by batch_size, and the numbers those of the same inputs given as a list. Every task."""

from __future__ import annotations

import csv
import itertools

import numpy as np
import pytest
import torch

import bertkit

transformers = pytest.importorskip("transformers")

from pipeline_helpers import tiny_dir  # noqa: E402 (after the skip: it imports transformers)

BATCH = 3
HEADS_KEY_CLS = ("BertForSequenceClassification",)  # the text-classification pipeline's key in pipes.directories
HEADS = {"fill-mask": ("BertForMaskedLM", {}), "text-classification": ("BertForSequenceClassification", {}),
         "rerank": ("BertForSequenceClassification", {"num_labels": 1}),
         "token-classification": ("BertForTokenClassification", {}),
         "question-answering": ("BertForQuestionAnswering", {}), "multiple-choice": ("BertForMultipleChoice", {}),
         "feature-extraction": ("BertModel", {}), "sentence-embedding": ("BertModel", {}),
         "sparse-embedding": ("BertForMaskedLM", {})}


@pytest.fixture(scope="module")
def sst2(data_dir) -> list[str]:
    with open(data_dir / "glue/SST-2/dev.tsv", encoding="utf-8") as f:
        return [r["sentence"] for r in itertools.islice(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE), 7)]


def _inputs(task: str, texts: list[str]) -> list:
    """Seven inputs of the task's kind (three batches), made from SST-2 sentences."""
    pairs = list(zip(texts, texts[1:] + texts[:1]))
    return {"fill-mask": [f"{t.split()[0]} [MASK] ." for t in texts],
            "rerank": [{"query": a, "texts": [b, a]} for a, b in pairs],
            "question-answering": [{"question": b, "context": a} for a, b in pairs],
            "multiple-choice": [{"context": a, "choices": [b, a]} for a, b in pairs]}.get(task, texts)


def _numbers_and_words(result) -> tuple[list[float], list[str]]:
    """Every number of a result (nested dicts, lists, arrays), and every string in it, in a fixed order."""
    numbers, words = [], []

    def walk(x) -> None:
        if isinstance(x, dict):
            for k in sorted(x):
                walk(x[k])
        elif isinstance(x, (list, tuple)):
            for v in x:
                walk(v)
        elif isinstance(x, (np.ndarray, torch.Tensor)):
            numbers.extend(np.asarray(x.to_dense() if isinstance(x, torch.Tensor) else x, dtype=np.float64).ravel())
        elif isinstance(x, str):
            words.append(x)
        else:
            numbers.append(float(x))

    walk(result)
    return numbers, words


def _assert_same(streamed: list, listed: list) -> None:
    assert len(streamed) == len(listed)
    for got, want in zip(streamed, listed):
        (got_numbers, got_words), (want_numbers, want_words) = _numbers_and_words(got), _numbers_and_words(want)
        assert got_words == want_words
        # the same rows batched beside other rows (the list call sorts all of them by length): float32 rounding only
        np.testing.assert_allclose(got_numbers, want_numbers, rtol=0, atol=1e-5)


@pytest.fixture(scope="module")
def pipes(tmp_path_factory, minilm_dir):
    made, directories = {}, {}

    def make(task: str):
        if task not in made:
            hf_class, config = HEADS[task]
            key = (hf_class, *sorted(config.items()))
            if key not in directories:  # fill-mask and sparse-embedding share one masked LM
                directories[key] = tiny_dir(tmp_path_factory, minilm_dir, hf_class, **config)[0]
            made[task] = bertkit.pipeline(task, str(directories[key]), batch_size=BATCH)
        return made[task]

    make.directories = directories  # for the reference's own pipeline on the same files
    return make


@pytest.mark.parametrize("task", list(HEADS))
def test_a_generator_gives_results_as_its_inputs_are_read(task, pipes, sst2):
    """Was: the generator was read whole before the first result (read 10 of 10 at the call; an endless one never
    returned). Now its first input is read at the call (as transformers reads it), 3 (batch_size) of 7 inputs for the
    first result, and all of them give the list call's results, in order, their rows in batches of at most 3."""
    pipe, inputs = pipes(task), _inputs(task, sst2)
    read, sizes = [], []

    def generator():
        for x in inputs:
            read.append(x)
            yield x

    forward = pipe.forward
    pipe.forward = lambda batch, rows: sizes.append(len(rows)) or forward(batch, rows)
    try:
        results = pipe(generator())
        assert len(read) == 1 and not isinstance(results, list)
        first = next(results)
        assert len(read) == BATCH and sizes[0] == BATCH  # rows of those 3 inputs only (rerank: 2 each)
        streamed = [first, *results]
    finally:
        del pipe.forward
    assert len(read) == len(inputs) and max(sizes) <= BATCH
    _assert_same(streamed, pipe(inputs))


@pytest.mark.parametrize("task", ["text-classification", "question-answering"])
def test_an_endless_generator_is_served_as_far_as_it_is_read(task, pipes, sst2):
    """Was: an endless generator was read until memory ran out. Its first 5 results now come after reading 6 inputs
    (two batches of 3), equal to the list call's."""
    pipe, inputs = pipes(task), _inputs(task, sst2)
    read = []

    def endless():
        for x in itertools.cycle(inputs):
            assert len(read) < 100, "read on past the results taken"
            read.append(x)
            yield x

    taken = list(itertools.islice(pipe(endless()), 5))
    assert len(read) == 2 * BATCH
    _assert_same(taken, pipe(inputs[:5]))


def test_a_streamed_call_refuses_a_bad_option_at_the_call_and_names_the_input_of_a_bad_item(pipes, sst2):
    """Options are checked when the pipeline is called (as transformers' are), and an input is named by its place
    in the whole stream (the 5th input, in the second batch, is input 4)."""
    pipe = pipes("text-classification")
    with pytest.raises(ValueError, match="does not take"):
        pipe(iter(sst2), top_kk=2)
    results = pipe(iter([*sst2[:4], 7]))
    assert len([next(results) for _ in range(3)]) == 3
    with pytest.raises(ValueError, match="text-classification input 4 is int '7'"):
        next(results)


def test_an_empty_generator_gives_an_empty_list_as_transformers_gives_it(pipes):
    """Was: an iterator of no results, which `if not results` took for some. transformers answers an empty generator
    with [] (it reads the first input at the call); any other empty iterator streams, as transformers streams it."""
    pipe = pipes("text-classification")
    assert pipe(x for x in []) == []
    reference = transformers.pipeline("text-classification", model=str(pipes.directories[HEADS_KEY_CLS]))
    assert reference(x for x in []) == []
    results = pipe(iter([]))
    assert not isinstance(results, list) and list(results) == []


def test_words_from_a_generator_are_tagged_as_a_list_of_them(pipes, sst2):
    """is_split_into_words=True: a generator of word lists streams too, each joined as it is read."""
    pipe = pipes("token-classification")
    words = [t.split() for t in sst2]
    _assert_same(list(pipe(iter(words), is_split_into_words=True)), pipe(words, is_split_into_words=True))
    with pytest.raises(ValueError, match="input 1 is str 'loose'"):
        list(pipe(iter([words[0], "loose"]), is_split_into_words=True))


def test_a_torch_iterable_dataset_streams_as_transformers_streams_it(pipes, sst2):
    """A torch IterableDataset (transformers streams every torch Dataset) was read whole into a list of results; it
    is read as its results are taken now, the first after one batch."""
    pipe, read = pipes("text-classification"), []

    class Texts(torch.utils.data.IterableDataset):
        def __iter__(self):
            for x in sst2:
                read.append(x)
                yield x

    results = pipe(Texts())
    assert read == [] and not isinstance(results, list)
    first = next(results)
    assert len(read) == BATCH
    _assert_same([first, *results], pipe(sst2))
