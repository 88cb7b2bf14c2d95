"""A seeded generator of finite checkpoints whose float activations overflow (a word's embedding row at 3e38, a
LayerNorm scaled past float32's or float16's range) on some calibration texts and not others, quantized to int8 and
run in float16. int8 calibration refuses exactly when a text's float activations are not finite, naming the first
such text, and quantizes otherwise; a float16 model that overflows where its float32 weights do not is refused as a
float16 overflow with the fix, never as broken weights."""

from __future__ import annotations

import random

import pytest
import torch

from bertkit import BertModel, BertTokenizer, pipeline
from bertkit._hardware import int8_kernel
from bertkit.errors import NonFiniteError
from bertkit.heads import BertForSequenceClassification
from bertkit.quantization import quantize_int8_on_texts

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(int8_kernel() is None, reason="this PyTorch has no int8 kernel for this CPU")]
WORDS = ["the", "cat", "sat", "on", "mat", "weather", "is", "mild", "today", "paris", "dogs", "run", "fast"]
TRIGGERS = ["cat", "paris", "dogs"]


def _texts(rng: random.Random, trigger: str, n: int) -> list[str]:
    words = [w for w in WORDS if w != trigger]
    texts = [" ".join(rng.choices(words, k=rng.randint(1, 9))) for _ in range(n)]
    for i in rng.sample(range(n), rng.randint(0, 2)):
        t = texts[i].split()
        t.insert(rng.randint(0, len(t)), trigger)
        texts[i] = " ".join(t)
    return texts


def test_calibration_refuses_exactly_the_texts_whose_activations_overflow(minilm_2_layers):
    rng = random.Random(2026)
    tok = BertTokenizer.from_pretrained(minilm_2_layers)
    base = BertModel.from_pretrained(minilm_2_layers).eval()
    refused = quantized = 0
    for case in range(12):
        model = BertModel.from_pretrained(minilm_2_layers).eval()
        model.load_state_dict(base.state_dict())
        mode, trigger = rng.choice(["word", "layer_norm", "none"]), rng.choice(TRIGGERS)
        with torch.no_grad():
            if mode == "word":
                model.embeddings.word_embeddings.weight[tok.convert_tokens_to_ids(trigger)] = rng.uniform(2e38, 3.4e38)
            elif mode == "layer_norm":
                w = model.encoder.layer[0].output.LayerNorm.weight
                w.copy_(w / w.abs().max() * rng.uniform(1e38, 3.4e38))
        texts = _texts(rng, trigger, rng.randint(2, 7))
        batch_size = rng.randint(1, 4)
        with torch.no_grad():  # the float model's own verdict, text by text
            finite = [bool(torch.isfinite(model(**tok([t], return_tensors="pt")).last_hidden_state).all())
                      for t in texts]
        where = f"case {case}: {mode} {trigger!r} batch_size {batch_size} texts {texts}"
        if all(finite):
            quantize_int8_on_texts(model, tok, texts, batch_size=batch_size)
            quantized += 1
            continue
        first = finite.index(False)
        with pytest.raises(NonFiniteError, match=rf"calibration input {first}: layer \d's \w+ input holds (NaN|inf)"
                                                 rf".*\(calibration text {first}: ") as e:
            quantize_int8_on_texts(model, tok, texts, batch_size=batch_size)
        assert e.value.index == first, where
        refused += 1
    assert refused >= 3 and quantized >= 2, (refused, quantized)  # the seed reaches both sides


def test_a_float16_overflow_is_named_as_one(minilm_2_layers):
    rng = random.Random(7)
    for case in range(4):
        torch.manual_seed(case)
        model = BertForSequenceClassification.from_pretrained(minilm_2_layers, num_labels=rng.randint(1, 3)).eval()
        scale = rng.choice([1e6, 1e5, 1.0])  # 1: finite in float16 too
        with torch.no_grad():
            model.bert.encoder.layer[0].output.LayerNorm.weight.mul_(scale)
        texts = [" ".join(rng.choices(WORDS, k=rng.randint(1, 8))) for _ in range(3)]
        run = pipeline("text-classification", model, tokenizer=minilm_2_layers)
        assert run(texts)  # float32: finite at every scale
        half = pipeline("text-classification", model.half(), tokenizer=minilm_2_layers)
        if scale == 1.0:
            assert half(texts)
            continue
        with pytest.raises(NonFiniteError, match="the model runs in float16, whose largest value is 65504"):
            half(texts)
