"""Randomized differential test of the tokenizer's call keywords against transformers' BertTokenizerFast.

Each draw is one call (``__call__``, ``encode``, ``encode_plus``, ``batch_encode_plus``) on texts, pairs, batches or
pre-split words of SST-2, with keywords drawn from those transformers takes (padding, truncation, max_length down to
1, overflowing windows with a stride, pad_to_multiple_of, return_tensors, every return_* flag), run through both
tokenizers. Every key and value (tensor kind and dtype included) and the BatchEncoding's maps must be equal, or both
must refuse; bertkit's refusals that docs/tokenizer.md lists as deliberate are the only ones let through.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from bertkit.tokenization import BertTokenizer

transformers = pytest.importorskip("transformers")

# bertkit's deliberate refusals (docs/tokenizer.md, "Deliberate differences"), by their messages
DOCUMENTED = ("cannot stack sequences", "return_overflowing_tokens on text pairs needs", "special tokens this input",
              "special tokens each window", "holds only the", "encode takes one str")
SPECIAL = ["[CLS]", "[SEP]", "[PAD]", "[MASK]", "[UNK]", "x[MASK]y"]


def _text(rng, sentences):
    r = rng.random()
    if r < 0.1:
        return rng.choice(["", " "])
    if r < 0.25:
        words = rng.choice(sentences).split()[:6]
        words.insert(rng.randint(0, len(words)), rng.choice(SPECIAL))
        return " ".join(words)
    if r < 0.3:
        return " ".join(rng.choice(sentences) for _ in range(12))
    return rng.choice(sentences)


def _draw(rng, sentences):
    split = rng.random() < 0.15
    one = (lambda: _text(rng, sentences).split()) if split else (lambda: _text(rng, sentences))
    n = rng.choice([1, 2, 3])
    args = rng.choice([(one(),), (one(), one()), ([one() for _ in range(n)],),
                       ([one() for _ in range(n)], [one() for _ in range(n)]), ([(one(), one()) for _ in range(n)],)])
    kw = {"is_split_into_words": True} if split else {}
    options = {
        "add_special_tokens": [True, False], "padding": [True, False, "longest", "max_length", "do_not_pad"],
        "truncation": [True, False, "longest_first", "only_first", "only_second", "do_not_truncate"],
        "max_length": [1, 2, 3, 4, 6, 10, 32, np.int64(16)], "pad_to_multiple_of": [2, 8],
        "return_tensors": ["pt", "np", None], "return_token_type_ids": [True, False, 0],
        "return_attention_mask": [True, False], "return_special_tokens_mask": [True, False],
        "return_offsets_mapping": [True, False], "return_length": [True, False], "verbose": [True, False],
    }
    for key, values in options.items():
        if rng.random() < 0.3:
            kw[key] = rng.choice(values)
    if rng.random() < 0.2:
        kw["return_overflowing_tokens"] = True
        kw["stride"] = rng.choice([0, 1, 3])
    method = rng.choice(["__call__", "__call__", "encode", "encode_plus", "batch_encode_plus"])
    return method, args, kw


def _plain(value):
    if isinstance(value, (torch.Tensor, np.ndarray)):
        return type(value).__name__, str(value.dtype), value.tolist()
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _outcome(tok, method, args, kw):
    try:
        out = getattr(tok, method)(*args, **kw)
    except KeyboardInterrupt:
        raise
    except BaseException as e:  # noqa: BLE001 - errors differ in type (tokenizers panics: a BaseException); that both
        return "error", str(e)  # refuse is what is compared
    if method == "encode":
        return "ok", _plain(out)
    ids = out["input_ids"]
    rows = (len(ids) if ids and isinstance(ids[0], list) else 1) if isinstance(ids, list) else (
        ids.shape[0] if ids.ndim == 2 else 1)
    maps = [(out.word_ids(i), out.sequence_ids(i), out.tokens(i), [out.token_to_chars(i, t) for t in range(4)],
             [out.char_to_token(i, c, sequence_index=s) for c in range(0, 30, 3) for s in (0, 1)])
            for i in range(rows)]
    return "ok", ({k: _plain(v) for k, v in sorted(out.items())}, maps)


@pytest.mark.slow
def test_call_keywords_match_transformers_on_random_draws(minilm_dir, data_dir):
    ours, hf = BertTokenizer.from_pretrained(minilm_dir), transformers.BertTokenizerFast.from_pretrained(minilm_dir)
    lines = (data_dir / "glue" / "SST-2" / "dev.tsv").read_text(encoding="utf-8").splitlines()[1:301]
    sentences = [line.split("\t")[0] for line in lines]
    rng = random.Random(0)
    compared = 0
    for _ in range(2500):
        method, args, kw = _draw(rng, sentences)
        a, b = _outcome(ours, method, args, kw), _outcome(hf, method, args, kw)
        if a[0] == "error" and (b[0] == "error" or any(s in a[1] for s in DOCUMENTED)):
            continue
        assert a == b, f"{method}{args!r:.300} {kw}"
        compared += 1
    assert compared > 900
