"""Seeded random draws of what a text's output must not depend on: what it is batched with, the batch size, the order
of the inputs, the padding, the thread count, or the entry point that computes it.

The model draws: small random configs (one head, odd head sizes, intermediate sizes not multiples of 8, one token
type, pad ids other than 0, position tables of a few rows filled to their last), masks right- and left-padded, with
holes or an all-zero row, with and without ``token_type_ids`` / ``position_ids``; the plain model,
``optimize_for_inference``'s copy and transformers' ``BertModel`` on the same weights agree at every real token, and a
right-padded row alone gives what it gives in its batch. The pipeline draws: text-classification (texts and pairs,
against transformers' pipeline too), token-classification (every word strategy, with and without ``stride``),
question-answering (with and without ``doc_stride``), fill-mask and feature-extraction, on tiny checkpoints with
MiniLM's tokenizer, each run at two batch sizes on shuffled inputs and each input alone. A pair given to a model with
one token type is refused, saying so. ``make test-slow`` runs it; BERTKIT_FUZZ_INVARIANCE sets the model draws.
"""

from __future__ import annotations

import os
import random

import numpy as np
import pytest
import torch

import bertkit
from bertkit import BertConfig, BertModel
from bertkit.errors import BertkitError

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.slow

DRAWS = int(os.environ.get("BERTKIT_FUZZ_INVARIANCE", "120"))
WORDS = ("the a film was good bad not dull fine John lives in New York Paris capital of France , . ! ? ' - "
         "naïve café Zürich 東京 émigré 😀 well-made it's 1999 $5 runs running unaffable").split()
NER_TAGS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]


@pytest.fixture(autouse=True)
def _threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def _config(rng: random.Random) -> dict:
    heads, head_size = rng.choice([1, 1, 2, 3, 5]), rng.choice([1, 2, 3, 5, 7, 8])
    return dict(vocab_size=rng.randint(20, 80), hidden_size=heads * head_size, num_hidden_layers=rng.randint(1, 3),
                num_attention_heads=heads, intermediate_size=rng.randint(3, 70),
                max_position_embeddings=rng.randint(4, 24), type_vocab_size=rng.choice([1, 2, 3]),
                pad_token_id=rng.choice([0, 1, 3]), hidden_act=rng.choice(["gelu", "relu", "gelu_new"]),
                hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, layer_norm_eps=rng.choice([1e-12, 1e-5]))


def _batch(rng: random.Random, c: dict, seed: int) -> tuple[torch.Tensor, torch.Tensor, str, dict]:
    B = rng.randint(1, 5)
    T = rng.choice([c["max_position_embeddings"], rng.randint(1, c["max_position_embeddings"])])
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, c["vocab_size"], (B, T), generator=g)
    kind = rng.choice(["right", "right", "left", "holes", "zero_row", "none"])
    mask = torch.ones(B, T, dtype=torch.long)
    for i in range(B):
        n = T if rng.random() < 0.3 else rng.randint(1, T)
        if kind in ("right", "holes"):
            mask[i, n:] = 0
        elif kind == "left":
            mask[i, :T - n] = 0
        if kind == "holes":
            mask[i, 1:] *= (torch.rand(T - 1, generator=g) > 0.2).long()
    if kind == "zero_row":
        mask[rng.randrange(B)] = 0
    kw = {} if kind == "none" else {"attention_mask": mask.to(rng.choice([torch.long, torch.bool, torch.float32]))}
    if rng.random() < 0.5:
        kw["token_type_ids"] = torch.randint(0, c["type_vocab_size"], (B, T), generator=g)
    if rng.random() < 0.3:  # (B, T): transformers gathers its token-type buffer with them, which a (T,) breaks
        kw["position_ids"] = (torch.randint(0, c["max_position_embeddings"], (B, T), generator=g) if rng.random() < 0.5
                              else (mask.cumsum(1) - 1).clamp(min=0))
    return ids, mask, kind, kw


def test_the_plain_model_its_inference_copy_and_transformers_agree_whatever_the_batch():
    for seed in range(DRAWS):
        rng = random.Random(seed)
        torch.set_num_threads(1 + seed % 2)
        c = _config(rng)
        torch.manual_seed(seed)
        theirs = transformers.BertModel(transformers.BertConfig(**c)).eval()
        ours = BertModel(BertConfig(**c)).eval()
        ours.load_state_dict(theirs.state_dict(), strict=False)  # the position_ids buffer is not persistent
        fast = bertkit.optimize_for_inference(ours)
        ids, mask, kind, kw = _batch(rng, c, seed)
        real = mask.bool() & mask.any(1, keepdim=True)  # an all-zero row has no real token to compare
        rows = mask.any(1)
        with torch.no_grad():
            ref = theirs(ids, **kw)
            outs = {"plain": ours(ids, **kw), "optimized": fast(ids, **kw)}
            for name, out in outs.items():
                where = f"seed {seed} {name} {kind} {c} {sorted(kw)}"
                torch.testing.assert_close(out.last_hidden_state[real], ref.last_hidden_state[real], atol=1e-4,
                                           rtol=0, msg=where)
                torch.testing.assert_close(out.pooler_output[rows], ref.pooler_output[rows], atol=1e-4, rtol=0,
                                           msg=where)
            if kind not in ("right", "none"):
                continue
            for i in rng.sample(range(len(ids)), min(2, len(ids))):
                n = int(mask[i].sum())
                alone = {k: v[i:i + 1, :n] for k, v in kw.items() if k != "attention_mask"}
                for name, model in (("plain", ours), ("optimized", fast)):
                    one = model(ids[i:i + 1, :n], **alone)
                    torch.testing.assert_close(one.last_hidden_state[0], outs[name].last_hidden_state[i, :n],
                                               atol=1e-5, rtol=0, msg=f"seed {seed} {name} row {i} alone")
                    torch.testing.assert_close(one.pooler_output[0], outs[name].pooler_output[i], atol=1e-5, rtol=0,
                                               msg=f"seed {seed} {name} row {i} alone")


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, tiny_checkpoint, minilm_dir):
    root = tmp_path_factory.mktemp("invariance")
    sizes = dict(hidden_size=15, num_attention_heads=5, intermediate_size=37, max_position_embeddings=20)
    made = {name: tiny_checkpoint(root / name, head, tokenizer=minilm_dir, seed=i, **sizes, **extra)
            for i, (name, head, extra) in enumerate([
                ("clf", "BertForSequenceClassification", {"labels": 3}),
                ("ner", "BertForTokenClassification", {"labels": NER_TAGS}),
                ("qa", "BertForQuestionAnswering", {}),
                ("mlm", "BertForMaskedLM", {}),
                ("base", "BertModel", {}),
                ("one_type", "BertForSequenceClassification", {"labels": 2, "type_vocab_size": 1})])}
    return made


def _text(rng: random.Random, lo: int = 1, hi: int = 30) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))


def _close(a, b) -> bool:
    """Results equal: ids, labels, offsets exactly; every float within 1e-5."""
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b))
    if isinstance(a, float):
        return abs(a - b) <= 1e-5
    return a == b


def _same_whatever_the_batch(rng, task, directory, inputs, **options):
    sizes = rng.choice([1, 2, 3]), rng.choice([5, 32])
    first = bertkit.pipeline(task, directory, batch_size=sizes[0])
    results = first(inputs, **options)
    order = list(range(len(inputs)))
    rng.shuffle(order)
    shuffled = bertkit.pipeline(task, directory, batch_size=sizes[1])([inputs[i] for i in order], **options)
    for j, i in enumerate(order):
        assert _close(shuffled[j], results[i]), (task, sizes, options, inputs[i])
    for i in rng.sample(range(len(inputs)), min(2, len(inputs))):
        assert _close(first(inputs[i], **options), results[i]), (task, "alone", options, inputs[i])
    return results


def test_pipelines_give_each_input_its_result_whatever_it_is_batched_with(checkpoints):
    torch.set_num_threads(1)
    for seed in range(6):
        rng = random.Random(seed)
        texts = [_text(rng) for _ in range(rng.randint(2, 9))]
        inputs = texts if seed % 2 else [{"text": t, "text_pair": _text(rng)} for t in texts]
        got = _same_whatever_the_batch(rng, "text-classification", checkpoints["clf"], inputs)
        theirs = transformers.pipeline("text-classification", str(checkpoints["clf"]), device="cpu", top_k=None)
        for x, result in zip(inputs, got):
            ref = theirs(x, truncation=True, max_length=20)
            ref = ref[0] if isinstance(ref[0], list) else ref
            assert np.allclose([result["scores"][d["label"]] for d in ref], [d["score"] for d in ref], atol=1e-5)
        strategy = rng.choice(["first", "average", "max"])
        stride = rng.choice([None, 2, 5])
        _same_whatever_the_batch(rng, "ner", checkpoints["ner"], texts, aggregation_strategy=strategy,
                                 **({} if stride is None else {"stride": stride}))
        questions = [{"question": _text(rng, 1, 4), "context": _text(rng, 5, 60)} for _ in range(rng.randint(1, 4))]
        _same_whatever_the_batch(rng, "question-answering", checkpoints["qa"], questions, max_question_length=4,
                                 **({"doc_stride": rng.choice([0, 1, 3])} if seed % 3 else {}))
        masked = [" ".join(["[MASK]" if j == k else w for j, w in enumerate(t.split())])
                  for t in texts[:4] for k in [rng.randrange(min(len(t.split()), 4))]]
        _same_whatever_the_batch(rng, "fill-mask", checkpoints["mlm"], masked)
        _same_whatever_the_batch(rng, "feature-extraction", checkpoints["base"], texts)


def test_a_pair_for_a_model_with_one_token_type_is_refused_saying_so(checkpoints):
    clf = bertkit.pipeline("text-classification", checkpoints["one_type"])
    assert _close(clf(["a good film", "bad"])[1], clf("bad"))  # single texts run
    with pytest.raises(BertkitError, match=r"one token type \(type_vocab_size 1.*single texts only"):
        clf([{"text": "a good film", "text_pair": "bad"}])
