"""A float16 model whose activations pass 65504 on finite weights: refused as an overflow of float16, with the fix
(load it in float32 or bfloat16), not as broken weights, which sent the user looking for another checkpoint for
one that runs in float32 to the same numbers as transformers'."""

from __future__ import annotations

import pytest
import torch

from bertkit import pipeline
from bertkit.errors import NonFiniteError
from bertkit.heads import BertForSequenceClassification
from bertkit.sentence import CrossEncoder

HALF = r"the model runs in float16, whose largest value is 65504, and its activations passed it: load it in float32"


@pytest.fixture(scope="module")
def past_float16(minilm_2_layers, tmp_path_factory):
    """MiniLM's first 2 layers with a one-label head, layer 0's output LayerNorm scaled by 1e6: its states near 1e6,
    finite in float32 (the next LayerNorm brings them back), inf in float16."""
    torch.manual_seed(0)
    model = BertForSequenceClassification.from_pretrained(minilm_2_layers, num_labels=1)
    with torch.no_grad():
        model.bert.encoder.layer[0].output.LayerNorm.weight.mul_(1e6)
    out = tmp_path_factory.mktemp("past-float16")
    model.save_pretrained(out)
    (out / "vocab.txt").write_bytes((minilm_2_layers / "vocab.txt").read_bytes())
    (out / "tokenizer_config.json").write_bytes((minilm_2_layers / "tokenizer_config.json").read_bytes())
    return out


def test_pipeline_of_a_float16_model_names_float16_and_the_fix(past_float16):
    model = BertForSequenceClassification.from_pretrained(past_float16).eval()
    finite = pipeline("text-classification", model, tokenizer=past_float16)(["the cat sat on the mat"])
    assert all(torch.isfinite(torch.tensor(r["value"])) for r in finite)
    with pytest.raises(NonFiniteError, match=r"input 0 \('the cat sat on the mat'\).* so no result was produced: " + HALF):
        pipeline("text-classification", model.half(), tokenizer=past_float16)(["the cat sat on the mat"])


def test_cross_encoder_rank_in_float16_names_float16_and_the_fix(past_float16):
    documents = ["a cat", "the weather"]
    ranked = CrossEncoder(str(past_float16), device="cpu").rank("where is the cat", documents)
    assert sorted(r["corpus_id"] for r in ranked) == [0, 1]
    half = CrossEncoder(str(past_float16), device="cpu", model_kwargs={"dtype": torch.float16})
    with pytest.raises(NonFiniteError, match=r"rank\(\): the model's score of input 0 \('a cat'\) is not finite "
                                             r"\(NaN or inf\), so nothing was ranked: " + HALF):
        half.rank("where is the cat", documents)
