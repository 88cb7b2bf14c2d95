"""Parity with transformers on the same weights: every head, both directions, outputs and losses."""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

import pytest
import torch

import bertkit
import bertkit.heads as H
from bertkit import BertConfig, BertModel

transformers = pytest.importorskip("transformers")

TOL = dict(atol=1e-5, rtol=0)
HF_CLASSES = {
    BertModel: "BertModel",
    H.BertForPreTraining: "BertForPreTraining",
    H.BertForMaskedLM: "BertForMaskedLM",
    H.BertForNextSentencePrediction: "BertForNextSentencePrediction",
    H.BertForSequenceClassification: "BertForSequenceClassification",
    H.BertForTokenClassification: "BertForTokenClassification",
    H.BertForQuestionAnswering: "BertForQuestionAnswering",
    H.BertForMultipleChoice: "BertForMultipleChoice",
}
TINY = dict(vocab_size=211, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
            max_position_embeddings=40, type_vocab_size=2, hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0)


def _inputs(cls, gen: torch.Generator, num_labels: int):
    B, T, C = 3, 11, 4
    shape = (B, C, T) if cls is H.BertForMultipleChoice else (B, T)
    ids = torch.randint(1, TINY["vocab_size"], shape, generator=gen)
    tt = torch.randint(0, 2, shape, generator=gen)
    mask = torch.ones(shape, dtype=torch.long)
    mask[..., 0, 7:] = 0 if cls is H.BertForMultipleChoice else 1
    mask[1, ..., 5:] = 0  # a padded row
    mask[2, ..., 9:] = 0
    inputs = dict(input_ids=ids, token_type_ids=tt, attention_mask=mask)
    labels: dict[str, torch.Tensor] = {}
    if cls is H.BertForPreTraining or cls is H.BertForMaskedLM:
        mlm = torch.full((B, T), -100)
        mlm[:, 2] = 5
        mlm[0, 4] = 17
        mlm[2, 6] = 100
        labels["labels"] = mlm
        if cls is H.BertForPreTraining:
            labels["next_sentence_label"] = torch.tensor([0, 1, 1])
    elif cls is H.BertForNextSentencePrediction:
        labels["labels"] = torch.tensor([0, 1, 0])
    elif cls is H.BertForSequenceClassification:
        labels["labels"] = torch.tensor([0.5, 2.0, -1.0]) if num_labels == 1 else torch.tensor([0, 2, 1])
    elif cls is H.BertForTokenClassification:
        tl = torch.randint(0, num_labels, (B, T), generator=gen)
        tl[:, 0] = -100
        tl[mask == 0] = -100  # padding never carries a label
        labels["labels"] = tl
    elif cls is H.BertForQuestionAnswering:
        labels = {"start_positions": torch.tensor([1, 3, 40]), "end_positions": torch.tensor([2, 4, 8])}
    elif cls is H.BertForMultipleChoice:
        labels["labels"] = torch.tensor([3, 0, 1])
    return inputs, labels


def _compare(ours, theirs, cls, inputs, labels):
    """Outputs at real positions (padding positions hold nothing meaningful in either) and losses."""
    ours.eval()
    theirs.eval()
    real = inputs["attention_mask"].bool()
    with torch.no_grad():
        a = ours(**inputs)
        b = theirs(**inputs)
        if cls is BertModel:
            torch.testing.assert_close(a.last_hidden_state[real], b.last_hidden_state[real], **TOL)
            torch.testing.assert_close(a.pooler_output, b.pooler_output, **TOL)
            return
        if cls in (H.BertForPreTraining, H.BertForMaskedLM):
            torch.testing.assert_close(a.prediction_logits[real], (b.prediction_logits if cls is H.BertForPreTraining
                                       else b.logits)[real], **TOL)
        if cls is H.BertForPreTraining:
            torch.testing.assert_close(a.seq_relationship_logits, b.seq_relationship_logits, **TOL)
        elif cls is H.BertForQuestionAnswering:
            torch.testing.assert_close(a.start_logits[real], b.start_logits[real], **TOL)
            torch.testing.assert_close(a.end_logits[real], b.end_logits[real], **TOL)
            # Every layout: padding logits are the lowest finite value, so the span softmax covers real tokens
            # only (the loss does not depend on the layout). Expected: transformers' logits with padding masked.
            lowest = torch.finfo(a.start_logits.dtype).min
            assert (a.start_logits[~real] == lowest).all() and (a.end_logits[~real] == lowest).all()
            T = real.size(1)
            s, e = labels["start_positions"].clamp(0, T), labels["end_positions"].clamp(0, T)
            masked = [x.masked_fill(~real, lowest) for x in (b.start_logits, b.end_logits)]
            want = (torch.nn.functional.cross_entropy(masked[0], s, ignore_index=T)
                    + torch.nn.functional.cross_entropy(masked[1], e, ignore_index=T)) / 2
            got = ours(**inputs, **labels).loss
            assert abs(want.item() - theirs(**inputs, **labels).loss.item()) > 1e-3  # the masking matters here
            torch.testing.assert_close(got, want, **TOL)
            return
        elif cls is H.BertForTokenClassification:
            torch.testing.assert_close(a.logits[real], b.logits[real], **TOL)
        elif cls is not H.BertForMaskedLM:
            torch.testing.assert_close(a.logits, b.logits, **TOL)
        la, lb = ours(**inputs, **labels).loss, theirs(**inputs, **labels).loss
        assert torch.isfinite(la)
        torch.testing.assert_close(la, lb, **TOL)


# QA keeps transformers' default of two outputs (start, end); every other head gets three labels.
CASES = [(cls, 2 if cls is H.BertForQuestionAnswering else 3) for cls in HF_CLASSES] + [
    (H.BertForSequenceClassification, 1)]


@pytest.mark.parametrize("layout", ["auto", "padded"])
@pytest.mark.parametrize("cls,num_labels", CASES, ids=lambda x: getattr(x, "__name__", str(x)))
def test_transformers_to_bertkit(cls, num_labels, layout, tmp_path):
    torch.manual_seed(0)
    hf_cls = getattr(transformers, HF_CLASSES[cls])
    hf = hf_cls(transformers.BertConfig(**TINY, num_labels=num_labels))
    hf.save_pretrained(tmp_path)
    ours = cls.from_pretrained(tmp_path)
    getattr(ours, "bert", ours).layout = layout
    assert ours.config.num_labels == num_labels
    _compare(ours, hf, cls, *_inputs(cls, torch.Generator().manual_seed(1), num_labels))


@pytest.mark.parametrize("cls,num_labels", CASES, ids=lambda x: getattr(x, "__name__", str(x)))
def test_bertkit_to_transformers(cls, num_labels, tmp_path):
    torch.manual_seed(0)
    ours = cls(BertConfig(**TINY).with_labels(num_labels))
    # Non-trivial LayerNorm and bias values, so a swapped or dropped tensor cannot pass unnoticed.
    with torch.no_grad():
        for p in ours.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    ours.save_pretrained(tmp_path)
    hf = getattr(transformers, HF_CLASSES[cls]).from_pretrained(tmp_path)
    _compare(ours, hf, cls, *_inputs(cls, torch.Generator().manual_seed(2), num_labels))


def test_pretraining_checkpoint_loads_into_every_head(tmp_path, caplog):
    """The everyday case: pre-trained weights with cls.* heads, loaded into a fresh task head."""
    torch.manual_seed(0)
    transformers.BertForPreTraining(transformers.BertConfig(**TINY)).save_pretrained(tmp_path)
    base = BertModel.from_pretrained(tmp_path)
    for cls in (H.BertForSequenceClassification, H.BertForTokenClassification, H.BertForQuestionAnswering,
                H.BertForMultipleChoice):
        with caplog.at_level("WARNING", logger="bertkit"):
            caplog.clear()
            m = cls.from_pretrained(tmp_path, num_labels=5)
        fresh = [r.getMessage() for r in caplog.records if "initialised fresh" in r.getMessage()]
        assert len(fresh) == 1, caplog.records
        torch.testing.assert_close(m.bert.embeddings.word_embeddings.weight, base.embeddings.word_embeddings.weight)
        torch.testing.assert_close(m.bert.encoder.layer[1].attention.self.key.weight,
                                   base.encoder.layer[1].attention.self.key.weight)


@pytest.mark.parametrize("act", ["gelu_new", "relu", "gelu_fast", "quick_gelu", "silu", "swish", "mish", "tanh"])
def test_other_activations_match_transformers(act, tmp_path):
    """Every hidden_act bertkit takes is transformers' ACT2FN function; "gelu_fast" to "tanh" were refused."""
    torch.manual_seed(0)
    hf = transformers.BertModel(transformers.BertConfig(**TINY, hidden_act=act))
    hf.save_pretrained(tmp_path)
    ours = BertModel.from_pretrained(tmp_path)
    assert ours.config.hidden_act == act
    _compare(ours, hf, BertModel, *_inputs(BertModel, torch.Generator().manual_seed(3), 2))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gelu_new_in_half_precision_is_transformers_own_formula(dtype, tmp_path):
    """hidden_act "gelu_new" is transformers' NewGELUActivation, the tanh approximation written out step by step in the
    input's dtype. bertkit ran PyTorch's fused tanh GELU, the same function rounded once: in bf16 the masked-LM logits
    came 0.16 apart from transformers' (fp16 0.023), where "gelu" and "gelu_pytorch_tanh" agree to the bit."""
    torch.manual_seed(0)
    hf = transformers.BertForMaskedLM(transformers.BertConfig(**{**TINY, "hidden_size": 64, "intermediate_size": 256},
                                                              hidden_act="gelu_new"))
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(torch.randn_like(p) * 0.3)  # activations spread wide, where the two roundings part
    hf.to(dtype).save_pretrained(tmp_path)
    theirs = transformers.BertForMaskedLM.from_pretrained(tmp_path).eval()
    ours = H.BertForMaskedLM.from_pretrained(tmp_path, dtype="auto")
    assert ours.dtype == theirs.dtype == dtype
    ids = torch.randint(1, TINY["vocab_size"], (4, 20), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(ours(input_ids=ids).logits, theirs(input_ids=ids).logits, rtol=0, atol=0)


def test_a_config_without_a_pad_token_loads_and_trains_its_first_row_as_transformers(tmp_path):
    """transformers writes "pad_token_id": null for BertConfig(pad_token_id=None), and its word embeddings then have no
    padding row: every row, id 0's too, takes gradients. bertkit refused the checkpoint ("must be a non-negative int,
    got None"); it loads now, trains as transformers does, and saves null back."""
    torch.manual_seed(0)
    hf = transformers.BertForSequenceClassification(transformers.BertConfig(**TINY, pad_token_id=None))
    hf.save_pretrained(tmp_path / "hf")
    ours = H.BertForSequenceClassification.from_pretrained(tmp_path / "hf")
    assert ours.config.pad_token_id is None and ours.bert.embeddings.word_embeddings.padding_idx is None
    ids = torch.tensor([[2, 0, 5, 0, 7]])
    grads = []
    for model in (ours, hf):
        model.eval()
        model(input_ids=ids, labels=torch.tensor([1])).loss.backward()
        grads.append(model.bert.embeddings.word_embeddings.weight.grad[0])
    assert grads[1].abs().sum() > 0
    torch.testing.assert_close(grads[0], grads[1], atol=1e-6, rtol=0)
    ours.save_pretrained(tmp_path / "ours")
    assert json.loads((tmp_path / "ours" / "config.json").read_text())["pad_token_id"] is None
    assert transformers.BertForSequenceClassification.from_pretrained(tmp_path / "ours").config.pad_token_id is None


def test_legacy_pytorch_model_bin_loads_with_weights_only(tmp_path):
    torch.manual_seed(0)
    hf = transformers.BertForMaskedLM(transformers.BertConfig(**TINY))
    hf.config.save_pretrained(tmp_path)
    torch.save(hf.state_dict(), tmp_path / "pytorch_model.bin")
    ours = H.BertForMaskedLM.from_pretrained(tmp_path)
    _compare(ours, hf, H.BertForMaskedLM, *_inputs(H.BertForMaskedLM, torch.Generator().manual_seed(4), 2))


def _same_draws(ours, theirs, seed: int = 42) -> None:
    """``ours()`` and ``theirs()`` (model builders) from the same seed: every parameter equal, bit for bit and in the
    same dtype, and torch's generator left in the same state (so dropout masks and shuffles after them agree)."""
    torch.manual_seed(seed)
    want = theirs().state_dict()
    their_generator = torch.get_rng_state()
    torch.manual_seed(seed)
    got = ours().state_dict()
    assert torch.equal(torch.get_rng_state(), their_generator)
    assert sorted(got) == sorted(want)
    for name, value in got.items():
        assert value.dtype == want[name].dtype and torch.equal(value, want[name]), name


def _labels(cls) -> dict[str, int]:
    return {} if cls is H.BertForQuestionAnswering else {"num_labels": 3}  # transformers' span head: num_labels 2


@pytest.mark.parametrize("cls", list(HF_CLASSES), ids=lambda c: c.__name__)
def test_a_model_built_from_a_config_draws_transformers_weights(cls):
    """transformers' initialisation, bit for bit: normal(0, initializer_range) weights (not google-research/bert's
    truncated normal, bertkit's before), zero biases, unit LayerNorms, the padding row zeroed, in module order, and
    the masked-LM decoder's own draws before it is tied to the word embeddings. A seeded transformers script that
    builds its model from a config (``set_seed(42); BertForPreTraining(config)``) gets the same weights here."""
    _same_draws(lambda: cls(BertConfig(**TINY, **_labels(cls))),
                lambda: getattr(transformers, HF_CLASSES[cls])(transformers.BertConfig(**TINY, **_labels(cls))))


@pytest.mark.parametrize("dtype", [None, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("cls", list(HF_CLASSES), ids=lambda c: c.__name__)
def test_auto_from_config_draws_transformers_weights_in_its_dtype(cls, dtype):
    """``AutoModelFor<Task>.from_config(config, dtype=...)``: transformers draws in that dtype, bertkit in float32 and
    casts; both give the same values (and the same generator state)."""
    name = "AutoModel" + cls.__name__.removeprefix("BertModel").removeprefix("Bert")
    kwargs = {} if dtype is None else {"dtype": dtype}
    _same_draws(lambda: getattr(bertkit, name).from_config(BertConfig(**TINY, **_labels(cls)), **kwargs),
                lambda: getattr(transformers, name).from_config(transformers.BertConfig(**TINY, **_labels(cls)), **kwargs))


def _without(checkpoint: Path, out: Path, *names: str) -> Path:
    """A copy of ``checkpoint`` without the weights ``names``."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(checkpoint, out)
    weights = {k: v for k, v in load_file(out / "model.safetensors").items() if k not in names}
    save_file(weights, out / "model.safetensors", metadata={"format": "pt"})
    return out


@pytest.mark.parametrize("cls", list(HF_CLASSES), ids=lambda c: c.__name__)
def test_from_pretrained_draws_the_missing_heads_as_transformers(cls, minilm_2_layers):
    """MiniLM (an encoder with its pooler, no heads) under every head: what the checkpoint lacks (a classifier, the
    masked-LM transform and output bias, the NSP layer) is drawn as transformers draws it, so a seeded fine-tuning
    script (``set_seed(42); AutoModelForSequenceClassification.from_pretrained(bert, num_labels=3)``) starts from the
    same head and the same generator state; what it holds is the file's."""
    _same_draws(lambda: cls.from_pretrained(minilm_2_layers, **_labels(cls)),
                lambda: getattr(transformers, HF_CLASSES[cls]).from_pretrained(str(minilm_2_layers), **_labels(cls)))


@pytest.mark.parametrize("dtype", [None, torch.bfloat16])
@pytest.mark.parametrize(("missing", "name"), [
    (("pooler.dense.weight", "pooler.dense.bias"), "AutoModelForSequenceClassification"),
    (("pooler.dense.weight", "pooler.dense.bias"), "AutoModel"),
    (("pooler.dense.bias",), "AutoModelForPreTraining")])  # a module half loaded: only its bias is set (zero), no draw
def test_a_pooler_the_checkpoint_lacks_is_drawn_as_transformers(missing, name, dtype, minilm_2_layers, tmp_path):
    checkpoint = _without(minilm_2_layers, tmp_path / "lacking", *missing)
    kwargs = {} if dtype is None else {"dtype": dtype}
    _same_draws(lambda: getattr(bertkit, name).from_pretrained(checkpoint, **kwargs),
                lambda: getattr(transformers, name).from_pretrained(str(checkpoint), **kwargs))


def test_a_mismatched_head_is_drawn_again_as_transformers(minilm_2_layers, tmp_path):
    """``ignore_mismatched_sizes=True`` starts a classifier of another label count afresh, drawn as there."""
    torch.manual_seed(0)
    H.BertForSequenceClassification.from_pretrained(minilm_2_layers, num_labels=2).save_pretrained(tmp_path)
    _same_draws(lambda: H.BertForSequenceClassification.from_pretrained(tmp_path, num_labels=3,
                                                                         ignore_mismatched_sizes=True),
                lambda: transformers.BertForSequenceClassification.from_pretrained(
                    str(tmp_path), num_labels=3, ignore_mismatched_sizes=True))


def test_training_steps_follow_transformers_with_dropout_off(tmp_path):
    """Five AdamW steps on ragged padded batches (bertkit drops the padding, transformers computes it):
    same losses at every step and same weights after, so training differs only by dropout draws."""
    from bertkit.training.optim import build_optimizer

    torch.manual_seed(0)
    cfg = BertConfig(**{**TINY, "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}).with_labels(3)
    ours = H.BertForSequenceClassification(cfg)
    ours.save_pretrained(tmp_path)
    theirs = transformers.BertForSequenceClassification.from_pretrained(tmp_path)
    gen = torch.Generator().manual_seed(9)
    batches = [_inputs(H.BertForSequenceClassification, gen, 3) for _ in range(5)]
    losses = {}
    for name, model in (("bertkit", ours), ("transformers", theirs)):
        opt = build_optimizer(model, 1e-3, 0.01)
        model.train()
        losses[name] = []
        for inputs, labels in batches:
            loss = model(**inputs, **labels).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses[name].append(loss.item())
    assert losses["bertkit"][0] != losses["bertkit"][-1]  # the weights did move
    torch.testing.assert_close(torch.tensor(losses["bertkit"]), torch.tensor(losses["transformers"]), atol=1e-5, rtol=0)
    theirs_state = theirs.state_dict()
    for key, value in ours.published_state_dict().items():
        torch.testing.assert_close(value, theirs_state[key], atol=1e-5, rtol=1e-4, msg=key)


@pytest.mark.parametrize("stored,cast", [(torch.bfloat16, None), (torch.float32, torch.bfloat16)])
def test_a_saved_checkpoint_names_its_weights_dtype_for_transformers(stored, cast, tmp_path):
    """transformers 5 loads a checkpoint in config.json's ``dtype`` (its default ``dtype="auto"``), so a bf16
    checkpoint loaded as float32 (bertkit's default) and saved must say float32, and a model cast to bf16 must say
    bf16: transformers then computes what bertkit does, not a rounding of it."""
    torch.manual_seed(0)
    transformers.BertForMaskedLM(transformers.BertConfig(**TINY)).to(stored).save_pretrained(tmp_path / "hf")
    ours = H.BertForMaskedLM.from_pretrained(tmp_path / "hf")
    if cast is not None:
        ours.to(cast)
    ours.save_pretrained(tmp_path / "ours")
    theirs = transformers.BertForMaskedLM.from_pretrained(tmp_path / "ours")
    assert theirs.dtype == ours.dtype == (cast or torch.float32)
    inputs, _ = _inputs(H.BertForMaskedLM, torch.Generator().manual_seed(5), 2)
    real = inputs["attention_mask"].bool()
    with torch.no_grad():
        a, b = ours(**inputs).logits[real], theirs(**inputs).logits[real]
        torch.testing.assert_close(a, b, **TOL)


def test_a_masked_lm_saved_from_an_untied_config_loads_tied_in_transformers(tmp_path):
    """An untied checkpoint's encoder loads (its decoder left out) and its config.json keeps tie_word_embeddings
    false; a masked LM built on that config and saved must not tell transformers to draw its decoder afresh:
    bertkit's decoder is the word embeddings, written once."""
    torch.manual_seed(0)
    ours = H.BertForMaskedLM(BertConfig.from_dict({**TINY, "tie_word_embeddings": False})).eval()
    ours.save_pretrained(tmp_path)
    theirs, info = transformers.BertForMaskedLM.from_pretrained(tmp_path, output_loading_info=True)
    assert not any(info.values()), info
    inputs, _ = _inputs(H.BertForMaskedLM, torch.Generator().manual_seed(6), 2)
    real = inputs["attention_mask"].bool()
    with torch.no_grad():
        torch.testing.assert_close(ours(**inputs).logits[real], theirs.eval()(**inputs).logits[real], **TOL)


def test_a_span_head_loaded_from_a_three_label_checkpoint_saves_what_transformers_loads(tmp_path):
    """A question-answering model started from an MNLI classifier keeps the config's 3 labels, and its 2-output
    qa_outputs; config.json said 3 labels, so transformers built a 3-output head and refused the file ("You set
    `ignore_mismatched_sizes` to `False`"; with it, a fresh head in place of the trained one). The saved config
    names the 2 outputs the weights have."""
    torch.manual_seed(0)
    H.BertForSequenceClassification(BertConfig(**TINY).with_labels(["entailment", "neutral", "contradiction"])
                                    ).save_pretrained(tmp_path / "mnli")
    ours = H.BertForQuestionAnswering.from_pretrained(tmp_path / "mnli")
    assert ours.config.num_labels == 3
    ours.save_pretrained(tmp_path / "qa")
    hf = transformers.BertForQuestionAnswering.from_pretrained(tmp_path / "qa")
    assert hf.config.num_labels == 2 and H.BertForQuestionAnswering.from_pretrained(tmp_path / "qa").config.num_labels == 2
    _compare(ours, hf, H.BertForQuestionAnswering, *_inputs(H.BertForQuestionAnswering, torch.Generator().manual_seed(3), 3))


# ---- randomized differential draws (slow) ----------------------------------------------------------------------
FUZZ_DRAWS = int(os.environ.get("BERTKIT_FUZZ_HF", "200"))  # make test-slow's count; 300 draws take 2 minutes
# gradients that are rounding alone: a softmax ignores a shift shared by its inputs (attention keys, span or choice biases)
SHIFT_FREE = ("key.bias", "qa_outputs.bias")


def _draw(seed: int, tmp_path):
    """A head, a small config saved by transformers, and one forward call: the same call for both libraries."""
    r = random.Random(seed)
    cls = r.choice(list(HF_CLASSES))
    heads = r.choice([1, 2, 4])
    config = dict(TINY, vocab_size=r.randint(20, 60), hidden_size=heads * r.choice([4, 8]), num_attention_heads=heads,
                  num_hidden_layers=r.randint(1, 2), intermediate_size=r.choice([8, 37]),
                  hidden_act=r.choice(["gelu", "gelu_new", "relu", "gelu_pytorch_tanh"]),
                  max_position_embeddings=r.randint(6, 24), type_vocab_size=r.choice([1, 2]),
                  layer_norm_eps=r.choice([1e-12, 0.1]), pad_token_id=r.choice([0, 3]),
                  num_labels=2 if cls is H.BertForQuestionAnswering else r.choice([2, 3, 5]),
                  classifier_dropout=r.choice([None, 0.0]), initializer_range=r.choice([0.02, 0.5]))
    torch.manual_seed(seed)
    hf = getattr(transformers, HF_CLASSES[cls])(transformers.BertConfig(**config))
    with torch.no_grad():  # LayerNorm and biases away from 1 and 0, so a swapped tensor shows
        for name, p in hf.named_parameters():
            if "LayerNorm" in name or name.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.1)
    hf.save_pretrained(tmp_path / str(seed))
    impl = r.choice(["sdpa", "eager"])
    ours = cls.from_pretrained(tmp_path / str(seed), attn_implementation=impl)
    hf = type(hf).from_pretrained(tmp_path / str(seed), attn_implementation=impl)
    B, T, V = r.choice([1, 2, 3]), r.randint(1, config["max_position_embeddings"]), config["vocab_size"]
    shape = (B, r.choice([1, 3]), T) if cls is H.BertForMultipleChoice else (B, T)
    gen = torch.Generator().manual_seed(seed)
    call = {"input_ids": torch.randint(0, V, shape, generator=gen)}
    rows = call["input_ids"].reshape(-1, T)
    mask = torch.ones_like(rows)
    kind = r.choice(["none", "right", "left", "holes"])
    for i in range(len(rows)):
        n = r.randint(1, T)
        mask[i, n:] = 0 if kind in ("right", "left") else 1
    mask = mask.flip(-1) if kind == "left" else (torch.rand(mask.shape, generator=gen) < 0.7).long().clamp(
        min=(torch.arange(T) == 0).long()) if kind == "holes" else mask
    if kind != "none":
        call["attention_mask"] = mask.view(shape).to(r.choice([torch.long, torch.bool, torch.float]))
    if r.random() < 0.5:
        call["token_type_ids"] = torch.randint(0, config["type_vocab_size"], shape, generator=gen)
    if r.random() < 0.2:
        call["position_ids"] = torch.randint(0, config["max_position_embeddings"], shape, generator=gen)
    for switch in ("output_hidden_states", "output_attentions", "return_dict"):
        if r.random() < 0.3:
            call[switch] = r.random() < 0.5
    tokens = torch.where(mask.bool(), torch.randint(0, V, rows.shape, generator=gen), -100).view(B, -1)[:, :T]
    tokens[torch.rand(tokens.shape, generator=gen) < 0.5] = -100
    tokens[torch.arange(B), mask.argmax(-1)[:B]] = 1  # a label in every batch (all -100: the NaN test below)
    labels = {H.BertForMaskedLM: {"labels": tokens}, H.BertForPreTraining: {"labels": tokens,
              "next_sentence_label": torch.randint(0, 2, (B,), generator=gen)},
              H.BertForNextSentencePrediction: {"labels": torch.randint(0, 2, (B,), generator=gen)},
              H.BertForSequenceClassification: {"labels": torch.randint(0, config["num_labels"], (B,), generator=gen)},
              H.BertForTokenClassification: {"labels": torch.where(tokens >= 0, tokens % config["num_labels"], -100)},
              H.BertForMultipleChoice: {"labels": torch.randint(0, shape[1], (B,), generator=gen)},
              H.BertForQuestionAnswering: {"start_positions": mask.argmax(-1)[:B],  # first real tokens
                                           "end_positions": (mask.cumsum(-1) == mask.sum(-1, keepdim=True)).long(
                                           ).argmax(-1)[:B]}}.get(cls, {})
    return cls, ours, hf, call, labels if r.random() < 0.7 else {}, mask.bool(), r.random() < 0.5


def _named(out) -> dict:
    """Every tensor of an output by its place: ("logits",), ("hidden_states", 1), (1,) for a tuple's second item."""
    items = out.items() if hasattr(out, "items") else enumerate(out)
    flat = {}
    for key, value in items:
        if isinstance(value, tuple):
            flat.update({(key, i): v for i, v in enumerate(value)})
        elif value is not None:
            flat[(key,)] = value
    return flat


@pytest.mark.slow
def test_random_draws_match_transformers(tmp_path):
    """Seeded draws of head, config, inputs, masks (right- and left-padded, holes), switches and labels, eval and
    train mode (dropout 0): every output at real positions, the loss and every gradient as transformers'. What differs
    by design is left out: a masked LM's logits with labels (the labelled positions only, compared there), the span
    loss with padding (bertkit's softmax leaves padding out), SDPA's missing attentions, BertModel's cross_attentions."""
    for seed in range(FUZZ_DRAWS):
        cls, ours, hf, call, labels, real, train = _draw(seed, tmp_path)
        ours.train(train), hf.train(train)
        a, b = ours(**call, **labels), hf(**call, **labels)
        theirs = _named(b)
        for key, x in _named(a).items():
            if key not in theirs:  # attentions: none from transformers' SDPA
                assert x.dim() == 4, (seed, key)
                continue
            y = theirs[key]
            if x.shape != y.shape and "labels" in labels and cls in (H.BertForMaskedLM, H.BertForPreTraining):
                y = y[labels["labels"] != -100]
            elif x.dim() == 0 and cls is H.BertForQuestionAnswering and not real.all():
                continue
            elif x.dim() == 4:  # (B, nh, T, T): between real tokens
                both = (real[:, None, :, None] & real[:, None, None, :]).expand_as(x)
                x, y = x[both], y[both]
            elif x.dim() >= 2 and x.shape[:2] == real.shape:
                x, y = x[real], y[real]
            torch.testing.assert_close(x, y, atol=1e-5, rtol=1e-4, msg=lambda m, key=key, seed=seed: f"seed {seed} {key}: {m}")
        if train and labels and not (cls is H.BertForQuestionAnswering and not real.all()):
            (a[0] if isinstance(a, tuple) else a.loss).backward()
            (b[0] if isinstance(b, tuple) else b.loss).backward()
            grads = {n: p.grad for n, p in hf.named_parameters() if p.grad is not None}
            for n, p in ours.named_parameters():
                if p.grad is not None and not n.endswith(SHIFT_FREE) and not (
                        cls is H.BertForMultipleChoice and n == "classifier.bias"):
                    torch.testing.assert_close(p.grad, grads[n], atol=1e-4, rtol=1e-3, msg=f"seed {seed} grad {n}")


# the padded layout runs the same loss after another forward pass: in make test-slow
@pytest.mark.parametrize("layout", ["auto", pytest.param("padded", marks=pytest.mark.slow)])
@pytest.mark.parametrize("name", ["BertForTokenClassification", "BertForMaskedLM", "BertForPreTraining"])
def test_token_losses_over_no_label_are_transformers_nan(name, layout, tmp_path):
    """Labels all -100, some, with and without num_items_in_batch: the loss is transformers' (a mean over no label is
    NaN, as transformers' BERT heads give; with a count, its ForMaskedLMLoss/ForTokenClassification sum over the
    count: 0 over 4, 0 / 0 is NaN). bertkit gave 0.0 where transformers gives NaN. The loss compiled whole (no host
    read: the tagger, and ``token_loss`` for the masked LM, whose selection of the labelled rows has a data-dependent
    shape), the same."""
    from transformers.loss.loss_utils import fixed_cross_entropy

    torch.manual_seed(0)
    config = transformers.BertConfig(**TINY, num_labels=3)
    hf = getattr(transformers, name)(config).eval()
    hf.save_pretrained(tmp_path)
    ours = getattr(H, name).from_pretrained(tmp_path).eval()
    ours.bert.layout = layout
    ids = torch.tensor([[2, 17, 33, 9, 4, 3], [2, 51, 3, 0, 0, 0]])
    call = {"input_ids": ids, "attention_mask": (ids != 0).long()}
    if name == "BertForPreTraining":
        call["next_sentence_label"] = torch.tensor([0, 1])
    compiled = torch.compile(ours if name == "BertForTokenClassification" else H.token_loss, fullgraph=True,
                             backend="eager")
    for some in (False, True):
        labels = torch.full_like(ids, -100)
        if some:
            labels[0, 2], labels[0, 3] = 1, 2
        with torch.no_grad():
            out = hf(**call, labels=labels)
            logits = (out.prediction_logits if name == "BertForPreTraining" else out.logits).flatten(0, 1)
            nsp = torch.nn.functional.cross_entropy(out.seq_relationship_logits, call["next_sentence_label"]) \
                if name == "BertForPreTraining" else 0
            assert torch.isnan(out.loss) != some
            for count in (None, torch.tensor(0.0), torch.tensor(4.0)):
                # transformers' BERT heads ignore the count; its loss functions (the Trainer's) honour it
                want = out.loss if count is None else fixed_cross_entropy(logits, labels.flatten(), count) + nsp
                kwargs = {} if count is None else {"num_items_in_batch": count}
                torch.testing.assert_close(ours(**call, labels=labels, **kwargs).loss, want, equal_nan=True, **TOL)
                if name == "BertForTokenClassification":
                    got = compiled(**call, labels=labels, **kwargs).loss
                    torch.testing.assert_close(got, want, equal_nan=True, **TOL)
                elif name == "BertForMaskedLM":
                    got = compiled(logits, labels.flatten(), count)[count is not None]
                    torch.testing.assert_close(got, want, equal_nan=True, **TOL)
            if name != "BertForTokenClassification":
                mean = ours(**call, labels=labels).mlm_loss
                assert torch.isnan(mean) != some
