"""Pipelines over a float64 model compute in float64, as transformers' pipelines read one: fill-mask, token
classification, feature extraction, question answering's logits, text classification and ``predict`` against
transformers 5 on tiny random float64 models and on MiniLM loaded in float64 (within 1e-12). bertkit cast every output
to float32 first, about 2e-8 from transformers. A float32 model's outputs stay what the float32 cast gave."""

from __future__ import annotations

import shutil
import warnings

import numpy as np
import pytest
import torch

import bertkit
from bertkit import auto
from bertkit.inference.predict import predict

transformers = pytest.importorskip("transformers")

TEXTS = ["The cat sat on the mat.", "Paris is the capital of France, a big city.", "hello world"]
CONTEXT = "The Eiffel Tower is in Paris. It was built in 1889 by Gustave Eiffel's company."


@pytest.fixture(scope="module")
def tiny_dirs(minilm_dir, tmp_path_factory):
    """A tiny random checkpoint per head (transformers' initialisation, seeded), MiniLM's tokenizer beside it."""
    root = tmp_path_factory.mktemp("float64")
    dirs = {}
    for head in (
        "AutoModelForSequenceClassification",
        "AutoModelForTokenClassification",
        "AutoModelForQuestionAnswering",
        "AutoModelForMaskedLM",
        "AutoModel",
    ):
        config = transformers.BertConfig(
            vocab_size=30522,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=37,
            max_position_embeddings=128,
            num_labels=2 if "Question" in head else 3,
        )
        torch.manual_seed(0)
        d = root / head
        getattr(transformers, head).from_config(config).save_pretrained(d)
        for name in ("vocab.txt", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.json"):
            shutil.copy(minilm_dir / name, d)
        dirs[head] = d
    return dirs


def _pair(head: str, d, dtype=torch.float64):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = getattr(transformers, head).from_pretrained(d, dtype=dtype).eval()
    return theirs, getattr(auto, head).from_pretrained(d, dtype=dtype)


def _hf_pipeline(task: str, model, d):
    return transformers.pipeline(task, model=model, tokenizer=transformers.AutoTokenizer.from_pretrained(d))


def test_fill_mask_token_classification_and_features_in_float64_as_transformers(tiny_dirs):
    theirs, ours = _pair("AutoModelForMaskedLM", tiny_dirs["AutoModelForMaskedLM"])
    hp, kp = (
        _hf_pipeline("fill-mask", theirs, tiny_dirs["AutoModelForMaskedLM"]),
        bertkit.pipeline("fill-mask", model=ours, tokenizer=tiny_dirs["AutoModelForMaskedLM"]),
    )
    for text in ("The cat sat on the [MASK].", "Paris is the [MASK] of France."):
        a, b = hp(text), kp(text)
        assert [x["token"] for x in a] == [x["token"] for x in b]
        assert all(isinstance(x["score"], float) for x in b)
        np.testing.assert_allclose([x["score"] for x in b], [x["score"] for x in a], rtol=1e-12, atol=0)

    d = tiny_dirs["AutoModelForTokenClassification"]
    theirs, ours = _pair("AutoModelForTokenClassification", d)
    hp, kp = (
        _hf_pipeline("token-classification", theirs, d),
        bertkit.pipeline("token-classification", model=ours, tokenizer=d),
    )
    for strategy in ("first", "average", "max"):
        for text in TEXTS:
            a, b = (
                hp(text, aggregation_strategy=strategy),
                kp(text, aggregation_strategy=strategy)["entities"],
            )
            assert [(e["entity_group"], e["start"], e["end"]) for e in a] == [
                (e["entity_group"], e["start"], e["end"]) for e in b
            ]
            np.testing.assert_allclose([e["score"] for e in b], [e["score"] for e in a], rtol=1e-12, atol=0)

    d = tiny_dirs["AutoModel"]
    theirs, ours = _pair("AutoModel", d)
    hp = _hf_pipeline("feature-extraction", theirs, d)
    kp = bertkit.pipeline("feature-extraction", model=ours, tokenizer=d, pooling="none")
    for text in TEXTS:
        a, b = np.asarray(hp(text)[0]), np.asarray(kp(text))
        assert b.dtype == np.float64 and a.shape == b.shape
        np.testing.assert_allclose(b, a, rtol=0, atol=1e-12)


def test_classification_qa_and_predict_logits_in_float64(tiny_dirs):
    """transformers' text-classification pipeline rounds its logits to float32 (for fp16/bf16 models) before the
    softmax: bertkit's scores are the float64 softmax of transformers' float64 logits, within float32 rounding of
    its pipeline's."""
    d = tiny_dirs["AutoModelForSequenceClassification"]
    theirs, ours = _pair("AutoModelForSequenceClassification", d)
    hp, kp = (
        _hf_pipeline("text-classification", theirs, d),
        bertkit.pipeline("text-classification", model=ours, tokenizer=d),
    )
    tok = hp.tokenizer
    for text in TEXTS:
        with torch.no_grad():
            logits = theirs(**tok(text, return_tensors="pt")).logits[0].numpy()
        e = np.exp(logits - logits.max())
        want = dict(zip((theirs.config.id2label[i] for i in range(3)), e / e.sum()))
        got = kp(text)["scores"]
        np.testing.assert_allclose([got[k] for k in want], list(want.values()), rtol=1e-12, atol=0)
        pipe = {x["label"]: x["score"] for x in hp(text, top_k=None)}
        np.testing.assert_allclose([got[k] for k in pipe], list(pipe.values()), rtol=1e-6, atol=0)
        rows = [{"input_ids": tok(text)["input_ids"], "token_type_ids": tok(text)["token_type_ids"]}]
        (predicted,) = predict(ours, rows, tok.pad_token_id)
        assert predicted.dtype == np.float64
        np.testing.assert_allclose(predicted, logits, rtol=0, atol=1e-12)

    d = tiny_dirs["AutoModelForQuestionAnswering"]
    theirs, ours = _pair("AutoModelForQuestionAnswering", d)
    kp = bertkit.pipeline("question-answering", model=ours, tokenizer=d)
    enc = kp.tokenizer("Where is the tower?", CONTEXT, return_tensors="pt")
    with torch.no_grad():
        out = theirs(**enc)
    with torch.inference_mode():  # as the pipeline runs it
        (ends,) = kp.forward(dict(enc), [{"input_ids": enc["input_ids"][0].tolist()}])
    assert ends.dtype == np.float64
    want = torch.stack([out.start_logits[0], out.end_logits[0]], -1).numpy()
    np.testing.assert_allclose(ends, want, rtol=0, atol=1e-12)
    assert isinstance(kp({"question": "Where is the tower?", "context": CONTEXT})["score"], float)


def test_minilm_in_float64_embeds_as_transformers(minilm_dir):
    theirs, ours = _pair("AutoModel", minilm_dir)
    tok = transformers.AutoTokenizer.from_pretrained(minilm_dir)
    tokens = bertkit.pipeline("feature-extraction", model=ours, tokenizer=minilm_dir, pooling="none")
    pooled = bertkit.pipeline("feature-extraction", model=ours, tokenizer=minilm_dir, pooling="mean")
    for text in TEXTS:
        with torch.no_grad():
            states = theirs(**tok(text, return_tensors="pt")).last_hidden_state[0].numpy()
        a = np.asarray(tokens(text))
        assert a.dtype == np.float64
        np.testing.assert_allclose(a, states, rtol=0, atol=1e-12)
        np.testing.assert_allclose(pooled(text), states.mean(0), rtol=0, atol=1e-12)


def test_float32_models_give_the_float32_outputs_they_gave(tiny_dirs, monkeypatch):
    """A float32 model's outputs are bit for bit what the float32 cast every output took before gave."""
    import bertkit.inference.base as base
    import bertkit.inference.embedding as embedding
    import bertkit.inference.pipelines as pipelines
    import bertkit.inference.predict as predicting

    def outputs() -> list:
        got = []
        for head, task, options in (
            ("AutoModelForSequenceClassification", "text-classification", {}),
            ("AutoModelForTokenClassification", "token-classification", {}),
            ("AutoModelForMaskedLM", "fill-mask", {}),
            ("AutoModel", "feature-extraction", {"pooling": "none"}),
            ("AutoModel", "feature-extraction", {"pooling": "mean"}),
        ):
            _, ours = _pair(head, tiny_dirs[head], torch.float32)
            pipe = bertkit.pipeline(task, model=ours, tokenizer=tiny_dirs[head], **options)
            texts = ["The cat sat on the [MASK]."] if task == "fill-mask" else TEXTS
            got += [pipe(t) for t in texts]
            if head == "AutoModelForSequenceClassification":
                enc = pipe.tokenizer(TEXTS[0])
                rows = [{"input_ids": enc["input_ids"], "token_type_ids": enc["token_type_ids"]}]
                (logits,) = predict(ours, rows, pipe.tokenizer.pad_token_id)
                assert logits.dtype == np.float32
                got.append(logits.tolist())
        _, ours = _pair(
            "AutoModelForQuestionAnswering", tiny_dirs["AutoModelForQuestionAnswering"], torch.float32
        )
        qa = bertkit.pipeline(
            "question-answering", model=ours, tokenizer=tiny_dirs["AutoModelForQuestionAnswering"]
        )
        return [*got, qa({"question": "Where is the tower?", "context": CONTEXT})]

    now = outputs()
    for module in (base, embedding, pipelines, predicting):  # the cast every output took before
        monkeypatch.setattr(module, "readable", lambda x: x.float())
    assert outputs() == now
