"""Randomized differential test of unusual and bad arguments to the public Python API, against transformers and
sentence-transformers on the same weights: each seed draws calls to the token-classification and fill-mask pipelines
(their call options, None among them), the sentence model classes with a ``device=`` of every kind (``"meta"``,
``"CPU"``, an int, a GPU this machine may lack), ``optimize_for_inference`` on such devices, and head forward passes
with labels of every container (tensor, list, numpy array, int) and dtype, and the embedding pipeline made with
construction keywords of every type (``normalize="no"``, ``progress=0``). Each call either gives the reference's
result (entities, candidates, embeddings, scores, losses within float rounding) or is refused with a BertkitError
naming the argument, and a refused call leaves the model's outputs as they were: never another exception, never a
model that lost its weights. What docs/coming-from-transformers.md documents bertkit refusing (aggregation
"simple"/"none", fill-mask's top_k 0, ...) is drawn too and must be a BertkitError.

Slow: ``BERTKIT_FUZZ_ARGUMENTS`` draws, 120 by default (about 30 s on a busy 2-core machine)."""

from __future__ import annotations

import os
import random

import numpy as np
import pytest
import torch

import bertkit
from bertkit.errors import BertkitError

transformers = pytest.importorskip("transformers")
st = pytest.importorskip("sentence_transformers", reason="the reference: pip install -e '.[test-references]'")
pytestmark = pytest.mark.slow

DRAWS = int(os.environ.get("BERTKIT_FUZZ_ARGUMENTS", "120"))
TEXTS = [
    "John Smith lives in New York City",
    "a gorgeous, witty, seductive movie",
    "the film is unbelievably dull",
    "Zürich-Nord opened a café in 1999 ; honestly",
    "it 's a work by an artist so in control",
]
TAGS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
# devices a call names; where a GPU is present the ones naming it are left out (the model would move there, rightly)
DEVICES = ["cpu", None, "meta", "CPU", "xla", -1, "cpu:0"] + (
    [] if torch.cuda.is_available() else ["cuda", "cuda:7", 0, "auto"]
)


@pytest.fixture(scope="module")
def dirs(tmp_path_factory, tiny_checkpoint, minilm_dir):
    root = tmp_path_factory.mktemp("argfuzz")
    made = {
        kind: tiny_checkpoint(
            root / kind, head, tokenizer=minilm_dir, labels=labels, seed=3, max_position_embeddings=512
        )
        for kind, head, labels in (
            ("tok", "BertForTokenClassification", TAGS),
            ("mlm", "BertForMaskedLM", None),
            ("clf", "BertForSequenceClassification", ["neg", "pos"]),
            ("enc", "BertModel", None),
        )
    }
    for kind in ("tok", "mlm", "clf"):  # larger head weights, so scores spread and rankings are not ties
        model = getattr(
            bertkit,
            {
                "tok": "BertForTokenClassification",
                "mlm": "BertForMaskedLM",
                "clf": "BertForSequenceClassification",
            }[kind],
        ).from_pretrained(made[kind])
        with torch.no_grad():
            for name, p in model.named_parameters():
                if not name.startswith("bert."):
                    p.mul_(8.0)
        model.save_pretrained(made[kind])
    return made


def _refused(call):
    """(True, message) when ``call`` raised a BertkitError, (False, result) when it returned; any other exception
    fails the test."""
    try:
        return False, call()
    except BertkitError as e:
        return True, str(e)


def _reference(call):
    try:
        return True, call()
    except Exception:  # noqa: BLE001 (the reference's refusals come in every type)
        return False, None


def _close(a, b, tol=2e-5):
    return abs(float(a) - float(b)) <= tol


def _token_classification(rng, pipes):
    bk, hf = pipes["tok"]
    text = " ".join([rng.choice(TEXTS)] * rng.choice([1, 1, 70]))  # long ones: windows
    options = {}
    if rng.random() < 0.6:
        options["aggregation_strategy"] = rng.choice(
            ["first", "average", "max", "FIRST", "Max", "simple", "none", 1]
        )
    if rng.random() < 0.4:
        options["stride"] = rng.choice([None, 0, 4, 60, 509, 510, -1, 2.0])
    if rng.random() < 0.4:
        options["ignore_labels"] = rng.choice([None, [], ["O"], ["PER"], ["B-LOC", "O"], ["o"], "O"])
    refused, got = _refused(lambda: bk(text, **options))
    if refused:
        assert any(k in got for k in options), (options, got)
        return
    ok, ref = _reference(
        lambda: hf(
            text, **{"aggregation_strategy": "first", **{k: v for k, v in options.items() if v is not None}}
        )
    )
    if not ok:  # transformers refuses a stride with its default strategy "none": nothing to compare
        return
    assert [(e["entity_group"], e["start"], e["end"]) for e in got["entities"]] == [
        (e["entity_group"], e["start"], e["end"]) for e in ref
    ], (options, text)
    assert all(_close(a["score"], b["score"]) for a, b in zip(got["entities"], ref)), options


def _fill_mask(rng, pipes):
    bk, hf = pipes["mlm"]
    words = rng.choice(TEXTS).split()
    for _ in range(rng.choice([1, 1, 2])):
        words.insert(rng.randrange(len(words) + 1), "[MASK]")
    text = " ".join(words)
    options = {}
    if rng.random() < 0.7:
        options["top_k"] = rng.choice([None, 1, 3, 10, 0, -1, 2.0, True, np.int64(2)])
    if rng.random() < 0.5:
        options["targets"] = rng.choice(
            [
                None,
                "the",
                ["the", "a"],
                ["film", "film"],
                ["Paris", "london"],
                [],
                "",
                ["##s", "[UNK]"],
                ("good", "bad"),
                [1, 2],
            ]
        )
    refused, got = _refused(lambda: bk(text, **options))
    if refused:
        assert any(k in got for k in options) or "target" in got, (options, got)
        return
    ok, ref = _reference(lambda: hf(text, **options))
    assert ok, (options, "bertkit answered a call transformers refuses")
    per_mask = (got, ref) if text.count("[MASK]") > 1 else ([got], [ref])
    for g, r in zip(*per_mask):
        assert [c["token"] for c in g] == [c["token"] for c in r], options
        assert all(_close(a["score"], b["score"], 1e-6) for a, b in zip(g, r)), options


def _sentence(rng, models):
    kind = rng.choice(["st", "ce"])
    bk, ref, inputs = models[kind]
    call = (
        (lambda m, **kw: m.encode(inputs, **kw))
        if kind == "st"
        else (lambda m, **kw: m.predict(inputs, **kw))
    )
    before = call(bk, convert_to_numpy=True)
    device = rng.choice(DEVICES)
    options = {"device": device}
    if rng.random() < 0.5:
        options["batch_size"] = rng.choice([1, 2, 32, 0, -1, 1.5])
    refused, got = _refused(lambda: call(bk, **options))
    if refused:
        assert any(k in got for k in ("device", "batch_size")), (options, got)
    else:
        np.testing.assert_allclose(np.asarray(got), call(ref, convert_to_numpy=True), atol=2e-5, rtol=0)
    assert bk.device.type == "cpu", options
    np.testing.assert_allclose(call(bk, convert_to_numpy=True), before, atol=0, rtol=0)


def _optimized(rng, models):
    model, ids = models["head"]
    before = model(ids).logits
    device = rng.choice(DEVICES)
    refused, got = _refused(lambda: bertkit.optimize_for_inference(model, device=device))
    if refused:
        assert "device" in got, got
    else:
        torch.testing.assert_close(got(ids).logits, before, atol=1e-4, rtol=1e-4)
    assert next(model.parameters()).device.type == "cpu"
    torch.testing.assert_close(model(ids).logits, before, atol=0, rtol=0)


def _embedding_pipeline(rng, models):
    """pipeline("feature-extraction", d, ...) with construction keywords of every type: sentence-transformers'
    encode(normalize_embeddings=...) vectors, or a refusal naming the keyword (normalize="no" normalised)."""
    _, ref, inputs = models["st"]
    options = {
        name: rng.choice(values)
        for name, values in (
            ("normalize", [None, True, False, "no", 1]),
            ("progress", [None, False, "no", 0]),
            ("device", DEVICES),
            ("batch_size", [1, 32, 0, 2.5]),
            ("max_length", [None, 8, 64, 7, 513]),
        )
        if rng.random() < 0.5
    }
    refused, pipe = _refused(lambda: bertkit.pipeline("feature-extraction", models["st"][0].path, **options))
    if refused:
        assert any(k in pipe for k in options), (options, pipe)
        return
    got = np.asarray(pipe(inputs))
    length = ref.max_seq_length
    ref.max_seq_length = options.get("max_length") or length
    try:
        want = ref.encode(inputs, normalize_embeddings=bool(options.get("normalize")))
    finally:
        ref.max_seq_length = length
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=0)


def _labels(rng, models):
    bk, hf = models["pair"]
    ids = torch.tensor([[101, 1037, 2204, 2143, 102, 0], [101, 2198, 3268, 1999, 2047, 102]])
    mask = (ids > 0).long()
    values = rng.choice([[0, 1], [1, 1], [-100, 1], [0, 2], [-1, 0]])
    kind = rng.choice(["long", "int32", "float", "list", "numpy", "int", "bool"])
    labels = {
        "long": lambda: torch.tensor(values),
        "int32": lambda: torch.tensor(values, dtype=torch.int32),
        "float": lambda: torch.tensor(values, dtype=torch.float),
        "list": lambda: values,
        "numpy": lambda: np.array(values),
        "int": lambda: values[0],
        "bool": lambda: torch.tensor(values) > 0,
    }[kind]()
    refused, got = _refused(lambda: bk(input_ids=ids, attention_mask=mask, labels=labels))
    if refused:
        assert "labels" in got, (kind, values, got)
        return
    ok, ref = _reference(
        lambda: hf(input_ids=ids, attention_mask=mask, labels=torch.as_tensor(labels).long())
    )
    assert ok, (kind, values)
    torch.testing.assert_close(got.loss, ref.loss, atol=1e-5, rtol=1e-5)


def test_unusual_arguments_match_the_references_or_are_refused_by_name(dirs, minilm_dir):
    torch.manual_seed(0)
    pipes = {
        "tok": (
            bertkit.pipeline("token-classification", dirs["tok"]),
            transformers.pipeline("token-classification", str(dirs["tok"])),
        ),
        "mlm": (
            bertkit.pipeline("fill-mask", dirs["mlm"]),
            transformers.pipeline("fill-mask", str(dirs["mlm"])),
        ),
    }
    from bertkit import sentence

    encoder = sentence.SentenceTransformer(str(dirs["enc"]))
    encoder.path = dirs["enc"]
    models = {
        "st": (encoder, st.SentenceTransformer(str(dirs["enc"])), TEXTS),
        "ce": (
            sentence.CrossEncoder(str(dirs["clf"])),
            st.CrossEncoder(str(dirs["clf"])),
            [(TEXTS[0], TEXTS[1]), (TEXTS[2], TEXTS[3])],
        ),
        "head": (
            bertkit.BertForSequenceClassification.from_pretrained(dirs["clf"]).eval(),
            torch.tensor([[101, 1037, 2204, 2143, 102]]),
        ),
        "pair": (
            bertkit.BertForSequenceClassification.from_pretrained(dirs["clf"]).eval(),
            transformers.BertForSequenceClassification.from_pretrained(str(dirs["clf"])).eval(),
        ),
    }
    rng = random.Random(20261130)
    draws = [_token_classification, _fill_mask, _sentence, _optimized, _labels, _embedding_pipeline]
    for _ in range(DRAWS):
        draw = rng.choice(draws)
        if draw in (_token_classification, _fill_mask):
            draw(rng, pipes)
        else:
            draw(rng, models)
