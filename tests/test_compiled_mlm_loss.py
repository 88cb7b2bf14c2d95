"""The masked-LM loss inside torch.compile(fullgraph=True): labels gathered into a fixed number of rows (no
``nonzero``, no read back), the same losses and gradients as eagerly and as transformers' heads."""

import pytest
import torch
import transformers

import bertkit.heads as H
from bertkit import BertConfig

TINY = dict(vocab_size=61, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
            max_position_embeddings=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def _batch(seed: int, B: int = 3, T: int = 9, labelled: float = 0.3):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, TINY["vocab_size"], (B, T), generator=g)
    mask = torch.ones(B, T, dtype=torch.long)
    mask[1, T - 3:] = 0  # a padded row
    labels = torch.randint(0, TINY["vocab_size"], (B, T), generator=g)
    labels[(torch.rand(B, T, generator=g) > labelled) | (mask == 0)] = -100
    return ids, mask, labels


def _run(model, call, ids, mask, labels, **kw):
    model.zero_grad()
    extra = {"next_sentence_label": torch.tensor([0, 1, 1])} if isinstance(model, H.BertForPreTraining) else {}
    out = call(ids, mask, labels=labels, **extra, **kw)
    if torch.isfinite(out.loss):
        out.loss.backward()
    return out, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


# the pre-training head computes its masked-LM loss through the same code: its other cases in make test-slow; the
# masked-LM head's "none" (eager's NaN over no label is make test's in test_parity_hf.py's
# test_token_losses_over_no_label_are_transformers_nan, num_items_in_batch as well) and "num_items" (the same
# gather, another divisor) too
_MAKE_TEST = {(H.BertForMaskedLM, "some"), (H.BertForMaskedLM, "bounded"), (H.BertForPreTraining, "some")}


# aot_eager (the autograd graph traced too) in make test-slow: 3-6 s a case against eager's 1-2
@pytest.mark.parametrize("backend", ["eager", pytest.param("aot_eager", marks=pytest.mark.slow)])
@pytest.mark.parametrize(("cls", "case"), [
    pytest.param(cls, case, marks=[] if (cls, case) in _MAKE_TEST else [pytest.mark.slow])
    for cls in (H.BertForMaskedLM, H.BertForPreTraining) for case in ("some", "none", "num_items", "bounded")])
def test_compiled_masked_lm_loss_equals_eager_and_transformers(cls, backend, case, tmp_path):
    torch.manual_seed(0)
    model = cls(BertConfig(**TINY)).train()
    ids, mask, labels = _batch(1)
    if case == "none":
        labels[:] = -100
    kw = {"num_items_in_batch": torch.tensor(11)} if case == "num_items" else {}
    if case == "bounded":
        model.max_predictions_per_seq = 5  # the rows the compiled head scores: 15 of the 27 positions
        assert int((labels != -100).sum()) <= 15
    eager, eager_grads = _run(model, model, ids, mask, labels, **kw)
    torch._dynamo.reset()
    compiled, grads = _run(model, torch.compile(model, backend=backend, fullgraph=True), ids, mask, labels, **kw)
    if case == "none":  # a mean over no labelled token is NaN, as transformers'
        assert torch.isnan(eager.loss) and torch.isnan(compiled.loss)
    else:
        torch.testing.assert_close(compiled.loss, eager.loss, atol=1e-6, rtol=0)
        assert grads.keys() == eager_grads.keys() and grads
        for name, grad in grads.items():
            torch.testing.assert_close(grad, eager_grads[name], atol=1e-6, rtol=0, msg=name)
    if case != "num_items":  # transformers' Bert heads take no num_items_in_batch
        model.save_pretrained(tmp_path)
        theirs = getattr(transformers, cls.__name__).from_pretrained(tmp_path).train()
        extra = {"next_sentence_label": torch.tensor([0, 1, 1])} if cls is H.BertForPreTraining else {}
        ref = theirs(input_ids=ids, attention_mask=mask, labels=labels, **extra).loss
        torch.testing.assert_close(compiled.loss, ref, atol=1e-6, rtol=0, equal_nan=True)


def test_compiled_masked_lm_refuses_more_labels_than_its_fixed_rows():
    torch.manual_seed(0)
    model = H.BertForMaskedLM(BertConfig(**TINY))
    model.max_predictions_per_seq = 2  # 6 rows for 3 sequences
    ids, mask, labels = _batch(2, labelled=0.6)
    assert int((labels != -100).sum()) > 6
    torch._dynamo.reset()
    with pytest.raises(RuntimeError, match="max_predictions_per_seq 2 per sequence allow \\(6 rows for 3 sequences"):
        torch.compile(model, backend="eager", fullgraph=True)(ids, mask, labels=labels)


def test_per_example_masked_lm_gradients_under_vmap_equal_one_example_at_a_time():
    """vmap(grad(f)) over masked-LM labels: shapes fixed (``nonzero`` has no batching rule: it was refused)."""
    from torch.func import functional_call, grad, vmap

    torch.manual_seed(0)
    model = H.BertForMaskedLM(BertConfig(**TINY)).eval()
    params = {k: v.detach() for k, v in model.named_parameters()}
    ids, _, labels = _batch(3, T=6)
    labels[:, 0] = 7  # a label in every row

    def loss(p, i, lab):
        return functional_call(model, p, (i[None],), {"labels": lab[None]}).loss

    per_example = vmap(grad(loss), in_dims=(None, 0, 0))(params, ids, labels)
    for b in range(len(ids)):
        one = grad(loss)(params, ids[b], labels[b])
        for name in ("cls.predictions.transform.dense.weight", "bert.encoder.layer.0.output.dense.weight"):
            torch.testing.assert_close(per_example[name][b], one[name], atol=1e-6, rtol=0)


@pytest.mark.slow
def test_drawn_batches_compile_to_eager_and_transformers_losses(tmp_path):
    """Drawn heads, shapes, padding, label densities and dtypes, max_predictions_per_seq and num_items_in_batch:
    the fullgraph-compiled loss is eager's, and eager's transformers'."""
    import random

    r = random.Random(0)
    for trial in range(10):
        cls = r.choice([H.BertForMaskedLM, H.BertForPreTraining])
        B, T = r.randint(1, 4), r.randint(2, 12)
        torch.manual_seed(trial)
        model = cls(BertConfig(**TINY)).train()
        ids, mask = torch.randint(0, TINY["vocab_size"], (B, T)), torch.ones(B, T, dtype=torch.long)
        for b in range(B):
            mask[b, r.randint(1, T):] = 0
        labelled = (torch.rand(B, T) < r.choice([0.0, 0.1, 0.5, 1.0])) & (mask == 1)
        labels = torch.where(labelled, torch.randint(0, TINY["vocab_size"], (B, T)), -100)
        labels = labels.to(r.choice([torch.int64, torch.int32]))
        model.max_predictions_per_seq = r.choice([None, max(1, -(-int(labelled.sum()) // B)), T])
        kw = {"num_items_in_batch": torch.tensor(float(r.randint(1, 30)))} if r.random() < 0.3 else {}
        extra = {"next_sentence_label": torch.randint(0, 2, (B,))} if cls is H.BertForPreTraining else {}
        given = mask if r.random() < 0.8 else None
        eager = model(ids, given, labels=labels, **extra, **kw).loss
        torch._dynamo.reset()
        compiled = torch.compile(model, backend="eager", fullgraph=True)(ids, given, labels=labels, **extra, **kw).loss
        torch.testing.assert_close(compiled, eager, atol=1e-6, rtol=0, equal_nan=True, msg=f"draw {trial}")
        if not kw:
            model.save_pretrained(tmp_path / str(trial))
            theirs = getattr(transformers, cls.__name__).from_pretrained(tmp_path / str(trial)).train()
            ref = theirs(input_ids=ids, attention_mask=given, labels=labels.long(), **extra).loss
            torch.testing.assert_close(eager, ref, atol=1e-5, rtol=0, equal_nan=True, msg=f"draw {trial}")
