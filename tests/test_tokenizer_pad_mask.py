"""``tokenizer.pad(return_attention_mask=...)`` against transformers on a seeded draw of batches: examples with and
without their attention_mask, of equal or different lengths, one example or a batch, each padding strategy and
output kind. transformers' ``return_attention_mask=False`` leaves a mask the examples hold unpadded: bertkit
padded it (a different result); now it leaves it too, and where that ragged mask can make no tensor (transformers'
"Unable to create tensor", or a numpy object array) refuses naming return_attention_mask and what to do."""

from __future__ import annotations

import random

import numpy as np
import pytest

from bertkit.errors import BertkitError

transformers = pytest.importorskip("transformers")

TEXTS = ["hello world", "a", "the quick brown fox jumps", "paris is in france .", "x y"]


@pytest.fixture(scope="module")
def tokenizers(minilm_dir):
    from bertkit.tokenization.auto import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(minilm_dir)), transformers.AutoTokenizer.from_pretrained(str(minilm_dir))


def _plain(out) -> dict:
    return {k: [np.asarray(r).tolist() for r in v] if isinstance(v, list) else np.asarray(v).tolist()
            for k, v in out.items()}


def test_pad_attention_mask_as_transformers_on_a_seeded_draw(tokenizers):
    ours, ref = tokenizers
    rng = random.Random(0)
    compared = refused = 0
    for _ in range(120):
        texts = rng.sample(TEXTS, rng.randint(1, 3))
        if rng.random() < 0.3:
            texts = [texts[0]] * len(texts)  # equal lengths: nothing to pad
        keep_mask, one = rng.random() < 0.7, rng.random() < 0.15
        kwargs = {"return_attention_mask": rng.choice([None, True, False]),
                  "return_tensors": rng.choice([None, "pt", "np"]),
                  "padding": rng.choice([True, "longest", "max_length"]),
                  "pad_to_multiple_of": rng.choice([None, 8])}
        if kwargs["padding"] == "max_length":
            kwargs["max_length"] = 12
        outs = []
        for tok in (ref, ours):
            feats = [dict(tok(t)) for t in texts]
            if not keep_mask:
                feats = [{k: v for k, v in f.items() if k != "attention_mask"} for f in feats]
            try:
                outs.append(_plain(tok.pad(feats[0] if one else feats, **kwargs)))
            except (ValueError, TypeError) as e:
                outs.append(e)
        theirs, mine = outs
        ragged = (keep_mask and kwargs["return_attention_mask"] is False and not one
                  and len({len(ref(t)["input_ids"]) for t in texts}) > 1)
        if ragged and kwargs["return_tensors"] is not None:
            # transformers: "Unable to create tensor" (pt) or an object array of rows (np)
            assert isinstance(mine, BertkitError), (texts, kwargs, mine)
            assert "pad(return_attention_mask=False) leaves the examples' attention_mask unpadded" in str(mine)
            assert "leave return_attention_mask at None" in str(mine)
            refused += 1
            continue
        assert not isinstance(theirs, Exception), (texts, kwargs, theirs)
        assert mine == theirs, (texts, keep_mask, one, kwargs)
        compared += 1
    assert compared > 80 and refused >= 3, (compared, refused)


def test_pad_without_a_mask_leaves_a_given_mask_unpadded_as_transformers(tokenizers):
    ours, ref = tokenizers
    got, want = (t.pad([dict(t("hello world")), dict(t("a"))], return_attention_mask=False) for t in (ours, ref))
    assert dict(got) == dict(want) and got["attention_mask"] == [[1, 1, 1, 1], [1, 1, 1]]
