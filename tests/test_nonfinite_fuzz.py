"""A seeded generator of models whose outputs overflow or hold a NaN (weights edited to -inf, +inf or NaN at one
or several labels, or finite weights past float32's range), run through bertkit's pipelines and transformers' on
the same texts. Wherever transformers' answer holds a NaN or an infinity, bertkit refuses with NonFiniteError;
wherever it is finite, bertkit's is the same (labels, scores within 1e-6) and finite."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch

import bertkit
from bertkit.errors import NonFiniteError

pytestmark = pytest.mark.slow

WORDS = ["hello", "world", "the", "cat", "sat", "in", "paris", "where", "dogs", "run", "fast", "john"]
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]
POISONS = [-math.inf, math.inf, math.nan]


def _edit(model, rng: random.Random, head: str) -> str:
    """Poison ``model`` in place; returns what was done, for the failure message."""
    prefix = "" if head == "BertModel" else "bert."
    params = dict(model.named_parameters())
    kind = rng.choice(["bias", "bias_all", "overflow", "layer_norm", "none"] if head != "BertModel"
                      else ["layer_norm", "overflow", "none"])
    with torch.no_grad():
        if kind == "bias":
            bias = params["classifier.bias"]
            for i in rng.sample(range(len(bias)), rng.randint(1, len(bias))):
                bias[i] = rng.choice(POISONS)
        elif kind == "bias_all":
            params["classifier.bias"].fill_(-math.inf)
        elif kind == "overflow":  # finite weights, outputs past float32's range
            norm = params[f"{prefix}encoder.layer.1.output.LayerNorm.bias"]
            params[f"{prefix}encoder.layer.1.output.LayerNorm.weight"].zero_()
            norm.fill_(1.0)
            if head == "BertModel":
                norm[rng.randrange(len(norm))] = rng.choice([-3e38, 3e38])
            else:
                if head == "BertForSequenceClassification":
                    params["bert.pooler.dense.weight"].zero_()
                    params["bert.pooler.dense.bias"].fill_(100.0)
                weight = params["classifier.weight"]
                for i in rng.sample(range(len(weight)), rng.randint(1, len(weight))):
                    weight[i].fill_(rng.choice([-3e37, 3e37]))
        elif kind == "layer_norm":
            params[f"{prefix}encoder.layer.1.output.LayerNorm.bias"][rng.randrange(32)] = rng.choice(POISONS)
    return kind


def _finite(x) -> bool:
    return bool(np.isfinite(np.asarray(x, dtype=np.float64)).all())


@pytest.mark.parametrize("seed", range(3))
def test_overflowing_models_never_give_a_score(tmp_path, tiny_checkpoint, seed):
    import transformers

    transformers.logging.set_verbosity_error()
    rng = random.Random(seed)
    torch.manual_seed(seed)
    heads = {"text-classification": ("BertForSequenceClassification", "AutoModelForSequenceClassification"),
             "token-classification": ("BertForTokenClassification", "AutoModelForTokenClassification"),
             "feature-extraction": ("BertModel", "AutoModel")}
    dirs = {}
    for task, (head, _) in heads.items():
        labels = ["O", "B-PER", "I-PER"] if task == "token-classification" else ["neg", "neu", "pos"]
        dirs[task] = tiny_checkpoint(tmp_path / f"{task}-{seed}", head, tokenizer=VOCAB,
                                     labels=None if head == "BertModel" else labels, seed=seed)
    refused = answered = 0
    for draw in range(8):
        task = rng.choice(list(heads))
        head, auto = heads[task]
        texts = [" ".join(rng.choices(WORDS, k=rng.randint(1, 6))) for _ in range(rng.randint(1, 3))]
        state = rng.getstate()
        ours = getattr(bertkit, head).from_pretrained(dirs[task])
        kind = _edit(ours, rng, head)
        rng.setstate(state)
        theirs = getattr(transformers, auto).from_pretrained(dirs[task])
        _edit(theirs, rng, head)
        tokenizer = transformers.AutoTokenizer.from_pretrained(dirs[task])
        with torch.no_grad():
            enc = tokenizer(texts, return_tensors="pt", padding=True)
            out = theirs(**enc)
        if task == "feature-extraction":
            mask = enc["attention_mask"].bool()
            # the mean over real tokens, summed in float32 as sentence-transformers pools: 3e38 twice is inf
            reference = [out.last_hidden_state[i][mask[i]].sum(0).numpy() / int(mask[i].sum())
                         for i in range(len(texts))]
            defined = [_finite(r) for r in reference]
        else:
            logits = out.logits
            probs = torch.softmax(logits.double(), -1)
            if task == "token-classification":
                mask = enc["attention_mask"].bool()
                probs = [probs[i][mask[i]] for i in range(len(texts))]
            defined = [_finite(p) and not (torch.isneginf(logits[i]).all(-1)).any() for i, p in enumerate(probs)]
        pipe = bertkit.pipeline(task, model=ours, tokenizer=bertkit.BertTokenizer.from_pretrained(dirs[task]))
        case = f"seed {seed} draw {draw}: {task}, {kind}, {texts}"
        if not all(defined):
            with pytest.raises(NonFiniteError, match=rf"^the {task} result for input \d+ ") as error:
                pipe(texts)
            assert not defined[error.value.index], case  # an input whose answer is not finite there either
            refused += 1
            continue
        results = pipe(texts)
        answered += 1
        for i, result in enumerate(results):
            if task == "text-classification":
                assert result["label"] == ["neg", "neu", "pos"][int(probs[i].argmax())], case
                assert [result["scores"][n] for n in ("neg", "neu", "pos")] == pytest.approx(
                    probs[i].tolist(), abs=1e-6), case
            elif task == "token-classification":
                assert all(math.isfinite(w["score"]) for w in result["words"]), case
            else:
                assert np.allclose(result, reference[i], atol=1e-5), case
    assert refused and answered  # the draws reach both sides
