"""The CUDA path: every head against transformers on the same GPU, gradients, bf16/fp16 autocast, the Trainer guide
run by both libraries on the GPU, pipelines and the GPU-side errors. Skipped where torch sees no CUDA device (this
project's machines are CPU-only; these run where one is lent, `pytest tests/test_cuda.py`).

TF32 is switched off in each test: with it on, both libraries' fp32 matrix products round to 10-bit mantissas and
agree only to about 1e-3, which would hide a real difference. The tolerances are the CPU tests' except where the
GPU's kernels reduce in another order (noted at each)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import bertkit
import bertkit.heads as H
from bertkit import BertModel
from bertkit.errors import BertkitError

transformers = pytest.importorskip("transformers")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device: these checks run where torch.cuda.is_available()", allow_module_level=True)

from test_parity_hf import CASES, HF_CLASSES, TINY, _compare, _inputs  # noqa: E402  (after the module-level skip)

CUDA = torch.device("cuda")
TOL = dict(atol=2e-5, rtol=0)  # the CPU tests' 1e-5, doubled: cuBLAS and the SDPA kernels sum in another order


@pytest.fixture(autouse=True)
def _no_tf32():
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def _to(d: dict, device) -> dict:
    return {k: v.to(device) for k, v in d.items()}


@pytest.mark.parametrize("layout", ["auto", "padded"])
@pytest.mark.parametrize("cls,num_labels", CASES, ids=lambda x: getattr(x, "__name__", str(x)))
def test_every_head_matches_transformers_on_the_gpu(cls, num_labels, layout, tmp_path, monkeypatch):
    import test_parity_hf

    monkeypatch.setattr(test_parity_hf, "TOL", TOL)
    torch.manual_seed(0)
    hf = getattr(transformers, HF_CLASSES[cls])(transformers.BertConfig(**TINY, num_labels=num_labels))
    hf.save_pretrained(tmp_path)
    ours = cls.from_pretrained(tmp_path).to(CUDA)
    getattr(ours, "bert", ours).layout = layout
    inputs, labels = _inputs(cls, torch.Generator().manual_seed(1), num_labels)
    _compare(ours, hf.to(CUDA), cls, _to(inputs, CUDA), _to(labels, CUDA))


def test_gpu_gradients_match_transformers_and_the_cpu(tmp_path):
    """One backward pass of a padded batch: every parameter's gradient equals transformers' on the GPU and
    bertkit's own on the CPU."""
    torch.manual_seed(0)
    hf = transformers.BertForSequenceClassification(transformers.BertConfig(**TINY, num_labels=3))
    hf.save_pretrained(tmp_path)
    inputs, labels = _inputs(H.BertForSequenceClassification, torch.Generator().manual_seed(5), 3)
    grads = {}
    for name, model, device in (("hf", hf.to(CUDA), CUDA),
                                ("gpu", H.BertForSequenceClassification.from_pretrained(tmp_path).to(CUDA), CUDA),
                                ("cpu", H.BertForSequenceClassification.from_pretrained(tmp_path), "cpu")):
        model.train()
        model.zero_grad()
        model(**_to(inputs, device), **_to(labels, device)).loss.backward()
        grads[name] = {n: p.grad.detach().cpu() for n, p in model.named_parameters() if p.grad is not None}
    assert set(grads["gpu"]) == set(grads["cpu"]) and set(grads["gpu"]) <= set(grads["hf"])
    assert len(grads["gpu"]) > 30
    for n, g in grads["gpu"].items():
        torch.testing.assert_close(g, grads["hf"][n], atol=2e-5, rtol=1e-4, msg=f"{n} against transformers")
        torch.testing.assert_close(g, grads["cpu"][n], atol=2e-5, rtol=1e-4, msg=f"{n} against the CPU")
    assert max(g.abs().max().item() for g in grads["gpu"].values()) > 1e-2  # gradients that say something


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_autocast_is_as_close_to_fp32_as_transformers(dtype, tmp_path):
    """Under the GPU's half-precision autocast, bertkit's hidden states stay as close to fp32 as transformers'
    do under the same autocast (each library's error against its own fp32 pass), on a MiniLM-shaped model."""
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=1000, hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
                                     intermediate_size=1536, hidden_dropout_prob=0.0,
                                     attention_probs_dropout_prob=0.0)
    hf = transformers.BertModel(config).eval()
    hf.save_pretrained(tmp_path)
    ours = BertModel.from_pretrained(tmp_path).to(CUDA).eval()
    hf = hf.to(CUDA)
    g = torch.Generator().manual_seed(6)
    ids = torch.randint(1, 1000, (8, 64), generator=g)
    mask = torch.ones_like(ids)
    for row, length in enumerate((64, 50, 33, 12, 64, 7, 40, 21)):
        mask[row, length:] = 0
    inputs = _to(dict(input_ids=ids, attention_mask=mask), CUDA)
    real = inputs["attention_mask"].bool()
    errors = {}
    with torch.no_grad():
        for name, model in (("ours", ours), ("hf", hf)):
            full = model(**inputs).last_hidden_state[real]
            with torch.autocast("cuda", dtype=dtype):
                half = model(**inputs).last_hidden_state[real].float()
            errors[name] = (half - full).abs().max().item()
            cos = torch.nn.functional.cosine_similarity(half, full, dim=-1).min().item()
            assert cos > 0.999, (name, cos)
        torch.testing.assert_close(ours(**inputs).last_hidden_state[real], hf(**inputs).last_hidden_state[real],
                                   **TOL)
    assert errors["ours"] <= 1.5 * errors["hf"] + 1e-3, errors


def _guide_rows(tokenizer, texts):
    return [{**tokenizer(r["text"], truncation=True), "label": r["label"]} for r in texts]


def test_the_trainer_guide_on_the_gpu_gives_transformers_numbers(minilm_tokenizer_dir, tmp_path):
    """The text-classification guide (tests/test_trainer.py) with ``use_cpu=False`` on a CUDA machine: both
    Trainers place the model on the GPU and log the same losses, and end with the same evaluation."""
    from trainer_helpers import TEST, TRAIN, _losses, accuracy, tiny_classifier

    checkpoint = tiny_classifier(tmp_path / "tiny-classifier", minilm_tokenizer_dir)
    runs = []
    for lib in (transformers, bertkit):
        tokenizer = lib.AutoTokenizer.from_pretrained(checkpoint)
        model = lib.AutoModelForSequenceClassification.from_pretrained(checkpoint)
        args = lib.TrainingArguments(output_dir=str(tmp_path / lib.__name__), learning_rate=1e-3,
                                     per_device_train_batch_size=4, per_device_eval_batch_size=8, num_train_epochs=2,
                                     logging_steps=1, save_strategy="no", report_to="none", use_cpu=False, seed=7,
                                     disable_tqdm=True)
        trainer = lib.Trainer(model=model, args=args, train_dataset=_guide_rows(tokenizer, TRAIN),
                              eval_dataset=_guide_rows(tokenizer, TEST), processing_class=tokenizer,
                              data_collator=lib.DataCollatorWithPadding(tokenizer), compute_metrics=accuracy)
        trainer.train()
        assert next(trainer.model.parameters()).device.type == "cuda", lib.__name__
        runs.append((_losses(trainer.state.log_history), trainer.evaluate()))
    (theirs, hf_eval), (ours, bk_eval) = runs
    assert [s for s, _, _ in ours] == [s for s, _, _ in theirs] == list(range(1, 21))
    np.testing.assert_allclose([x[1] for x in ours], [x[1] for x in theirs], rtol=1e-4, atol=1e-5)
    assert len({round(x[1], 4) for x in ours}) > 10
    assert bk_eval["eval_loss"] == pytest.approx(hf_eval["eval_loss"], rel=1e-4)
    assert bk_eval["eval_accuracy"] == hf_eval["eval_accuracy"]


@pytest.fixture(scope="module")
def minilm_tokenizer_dir():
    """MiniLM's tokenizer files (the weights are not needed here): the real checkpoint where present."""
    from conftest import model_dir

    d = model_dir()
    if not (d / "vocab.txt").is_file():
        pytest.skip(f"MiniLM's vocabulary absent at {d}: run `make model` or set BERTKIT_TEST_MODEL")
    return d


def test_pipelines_on_the_gpu_equal_the_cpu(tiny_checkpoint, minilm_tokenizer_dir, tmp_path):
    """pipeline(device="cuda") gives the CPU's scores and vectors; bf16 on the GPU stays within bf16 rounding."""
    ckpt = tiny_checkpoint(tmp_path / "clf", "BertForSequenceClassification", tokenizer=minilm_tokenizer_dir,
                           labels=["neg", "pos", "neutral"])
    texts = ["The movie was great.", "A terrible, boring plot that never ends.", "fine", "It rained all day " * 9]
    cpu = bertkit.pipeline("text-classification", model=str(ckpt), progress=False)(texts)
    gpu = bertkit.pipeline("text-classification", model=str(ckpt), device="cuda", progress=False)(texts)
    for a, b in zip(cpu, gpu):
        assert a["label"] == b["label"] and list(a["scores"]) == ["neg", "pos", "neutral"]
        np.testing.assert_allclose(list(a["scores"].values()), list(b["scores"].values()), atol=1e-5)
    emb = tiny_checkpoint(tmp_path / "emb", tokenizer=minilm_tokenizer_dir)
    vectors = {}
    for name, kw in (("cpu", {}), ("gpu", {"device": "cuda"}), ("gpu-bf16", {"device": "cuda", "bf16": True})):
        vectors[name] = np.asarray(bertkit.pipeline("sentence-embedding", model=str(emb), progress=False, **kw)(texts))
    np.testing.assert_allclose(vectors["gpu"], vectors["cpu"], atol=1e-5)
    cos = (vectors["gpu-bf16"] * vectors["cpu"]).sum(1) / (
        np.linalg.norm(vectors["gpu-bf16"], axis=1) * np.linalg.norm(vectors["cpu"], axis=1))
    assert cos.min() > 0.999 and not np.allclose(vectors["gpu-bf16"], vectors["cpu"], atol=1e-7)


def test_int8_on_the_gpu_is_refused_with_the_fix(tiny_checkpoint, minilm_tokenizer_dir, tmp_path):
    ckpt = tiny_checkpoint(tmp_path / "emb", tokenizer=minilm_tokenizer_dir)
    with pytest.raises(BertkitError, match="(?i)cpu"):
        bertkit.pipeline("sentence-embedding", model=str(ckpt), device="cuda", quantize="int8", progress=False)


def test_auto_layout_on_the_gpu(tiny_model):
    """``layout="auto"`` on the GPU drops padding in exact fp32 from ``GPU_UNPAD_MIN_LENGTH`` positions up, in
    training and inference, and keeps the rectangle for shorter batches, in TF32, and when training under autocast
    (``padding.gpu_keeps_rectangle`` says why); in half precision without attention dropout (inference, half
    weights) it drops padding for the variable-length kernel where there is one. The states agree either way."""
    from bertkit.padding import GPU_UNPAD_MIN_LENGTH, varlen_attention

    varlen = varlen_attention(CUDA, torch.bfloat16)

    model = tiny_model(max_position_embeddings=GPU_UNPAD_MIN_LENGTH).to(CUDA).eval()
    long = torch.randint(1, 99, (3, GPU_UNPAD_MIN_LENGTH), device=CUDA)
    mask = torch.ones_like(long)
    mask[1, 70:] = 0
    short = long[:, :100]
    with torch.no_grad():
        exact = model(input_ids=long, attention_mask=mask)
        assert not exact.token_layout.is_padded
        assert model(input_ids=short, attention_mask=mask[:, :100]).token_layout.is_padded
        with torch.enable_grad():
            assert not model(input_ids=long, attention_mask=mask).token_layout.is_padded
        torch.backends.cuda.matmul.allow_tf32 = True
        assert model(input_ids=long, attention_mask=mask).token_layout.is_padded
        torch.backends.cuda.matmul.allow_tf32 = False
        with torch.autocast("cuda", dtype=torch.bfloat16):
            assert model(input_ids=long, attention_mask=mask).token_layout.is_padded is not varlen
            model.train()  # attention dropout: the rectangle
            rect = model(input_ids=long, attention_mask=mask)
            assert rect.token_layout.is_padded
            assert (rect.last_hidden_state[1, 70:] == 0).all() and (rect.tokens[1, 70:] != 0).any()
            assert not model(input_ids=long, attention_mask=mask, layout="unpadded").token_layout.is_padded
            model.eval()
        half = model.half()(input_ids=long, attention_mask=mask)
        assert half.token_layout.is_padded is not varlen
        real = mask.bool()
        torch.testing.assert_close(half.last_hidden_state[real].float(), exact.last_hidden_state[real],
                                   atol=2e-2, rtol=0)


def _syncs(fn) -> int:
    """How many times ``fn`` makes the host wait for the GPU (torch's synchronisation debug mode)."""
    import warnings

    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fn()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in caught)


def test_half_precision_inference_drops_padding_with_the_varlen_kernel(tiny_model):
    """In bf16 without attention dropout (inference), padding is dropped and attention is PyTorch's variable-length
    kernel: the states at real tokens equal the rectangle's within bf16 rounding, and the forward waits on the GPU
    fewer times than the plan of length groups does. Training with attention dropout keeps the rectangle."""
    from bertkit.padding import varlen_attention

    if not varlen_attention(CUDA, torch.bfloat16):
        pytest.skip("no variable-length attention here (PyTorch < 2.10 or a GPU before compute capability 8.0)")
    model = tiny_model(max_position_embeddings=128).to(CUDA).eval()
    ids = torch.randint(1, 99, (4, 96), device=CUDA)
    mask = torch.ones_like(ids)
    for row, n in enumerate((96, 70, 9, 41)):
        mask[row, n:] = 0
    real = mask.bool()
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        varlen = model(input_ids=ids, attention_mask=mask)
        rect = model(input_ids=ids, attention_mask=mask, layout="padded")
        assert varlen.token_layout.cu_seqlens is not None and rect.token_layout.is_padded
        torch.testing.assert_close(varlen.last_hidden_state[real].float(), rect.last_hidden_state[real].float(),
                                   atol=3e-2, rtol=0)
        assert (varlen.last_hidden_state[~real] == 0).all()
        torch.testing.assert_close(varlen.pooler_output.float(), rect.pooler_output.float(), atol=3e-2, rtol=0)
        n_varlen = _syncs(lambda: model(input_ids=ids, attention_mask=mask))
    with torch.no_grad():
        n_groups = _syncs(lambda: model(input_ids=ids, attention_mask=mask, layout="unpadded"))  # fp32: groups
    assert n_varlen < n_groups, (n_varlen, n_groups)
    model.train()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        assert model(input_ids=ids, attention_mask=mask).token_layout.cu_seqlens is None


def test_a_batch_on_the_host_is_laid_out_there_without_waiting_for_the_gpu(tiny_model, tiny_checkpoint,
                                                                           minilm_tokenizer_dir, tmp_path):
    """Inputs still on the host (where encode and predict leave their batches) are checked and laid out there: the
    forward pass never makes the host wait for the GPU, in each layout "auto" picks (the rectangle of a short fp32
    batch, the plan of length groups of a long one, the variable-length kernel under bf16, training's rectangle),
    where the same batch on the GPU waits at least once; the states are the same. encode and predict over several
    batches wait once each, for the result."""
    from bertkit.padding import GPU_UNPAD_MIN_LENGTH
    from bertkit.sentence import CrossEncoder, SentenceTransformer

    model = tiny_model(max_position_embeddings=GPU_UNPAD_MIN_LENGTH, hidden_dropout_prob=0.0,
                       attention_probs_dropout_prob=1e-9).to(CUDA).eval()
    ids = torch.randint(1, 99, (3, GPU_UNPAD_MIN_LENGTH))
    mask = torch.ones_like(ids)
    mask[1, 70:] = 0
    mask[2, 9:] = 0
    cases = {"groups": (GPU_UNPAD_MIN_LENGTH, False, False), "rectangle": (100, False, False),
             "bf16": (GPU_UNPAD_MIN_LENGTH, True, False), "training": (100, True, True)}
    for name, (T, bf16, train) in cases.items():
        model.train(train)
        host = {"input_ids": ids[:, :T].pin_memory(), "attention_mask": mask[:, :T].pin_memory()}
        on_gpu = _to(host, CUDA)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16), torch.set_grad_enabled(train):
            want = model(**on_gpu)  # also the warm-up: handles and kernels made before counting
            got = model(**host)
            assert _syncs(lambda h=host: model(**h)) == 0, name
            assert _syncs(lambda g=on_gpu: model(**g)) >= 1, name
        assert got.token_layout.is_padded == want.token_layout.is_padded, name
        real = mask[:, :T].bool().to(CUDA)
        torch.testing.assert_close(got.last_hidden_state[real].float(), want.last_hidden_state[real].float(),
                                   atol=1e-6, rtol=0, msg=name)
    directory = str(tiny_checkpoint(tmp_path / "enc", tokenizer=minilm_tokenizer_dir))
    ce_directory = str(tiny_checkpoint(tmp_path / "ce", "BertForSequenceClassification", tokenizer=minilm_tokenizer_dir,
                                       labels=1))
    texts = [("the movie was great " * (1 + i % 9)).strip() + f" number {i}" for i in range(40)]
    st, ce = SentenceTransformer(directory, device="cuda"), CrossEncoder(ce_directory, device="cuda")
    st.encode(texts[:8], batch_size=8)
    ce.predict([(t, t) for t in texts[:8]], batch_size=8)
    assert _syncs(lambda: st.encode(texts, batch_size=8)) == 1
    assert _syncs(lambda: ce.predict([(t, t) for t in texts], batch_size=8)) == 1


def test_sparse_encode_reads_each_batch_without_waiting_for_the_next(tiny_checkpoint, minilm_tokenizer_dir,
                                                                      tmp_path):
    """A sparse encode reads a batch's non-zero weights after the next batch is queued, waiting for that batch's
    count alone: over five batches the host waits as often as over one (nonzero() waited once a batch), and the
    vectors are the dense result's, made without that reading."""
    from bertkit.sentence import SparseEncoder

    directory = str(tiny_checkpoint(tmp_path / "mlm", "BertForMaskedLM", tokenizer=minilm_tokenizer_dir))
    texts = [("the movie was great " * (1 + i % 9)).strip() + f" number {i}" for i in range(40)]
    model = SparseEncoder(directory, device="cuda")
    model.encode_document(texts[:8], batch_size=8)  # warm-up
    assert _syncs(lambda: model.encode_document(texts, batch_size=8)) == \
        _syncs(lambda: model.encode_document(texts[:8], batch_size=8))
    got = model.encode_document(texts, batch_size=8)
    assert got.is_sparse and got.shape == (40, model.get_embedding_dimension())
    assert torch.equal(got.to_dense(), model.encode_document(texts, batch_size=8, convert_to_sparse_tensor=False))


def _sentence_runs(directory, ce_directory, device: str, out) -> dict:
    """encode, CrossEncoder.predict and one epoch of each trainer (fp32, dropout off) on ``device``."""
    from bertkit.sentence import (
        SentenceTransformer,
        SentenceTransformerTrainer,
        SentenceTransformerTrainingArguments,
        losses,
    )
    from bertkit.sentence.cross_encoder import (
        CrossEncoder,
        CrossEncoderTrainer,
        CrossEncoderTrainingArguments,
    )
    from bertkit.sentence.cross_encoder import losses as ce_losses

    texts = [("the movie was great " * (1 + i % 7)).strip() + f" number {i}" for i in range(40)]
    pairs = [(f"question {i}?", texts[(i * 7) % 40]) for i in range(40)]
    model = SentenceTransformer(directory, device=device)
    vectors = model.encode(texts, batch_size=8)  # five batches: tokenized ahead on a thread on the GPU
    rows = [{"anchor": f"question {i}?", "positive": t} for i, t in enumerate(texts[:32])]
    args = dict(output_dir=str(out / f"st-{device}"), per_device_train_batch_size=8, num_train_epochs=1,
                learning_rate=1e-4, save_strategy="no", report_to="none", seed=3, disable_tqdm=True,
                use_cpu=device == "cpu", logging_steps=1)
    trained = SentenceTransformerTrainer(model=model, args=SentenceTransformerTrainingArguments(**args),
                                         train_dataset=rows, loss=losses.MultipleNegativesRankingLoss(model)).train()
    ce = CrossEncoder(ce_directory, device=device)
    scores = ce.predict(pairs, batch_size=8)
    labelled = [{"query": q, "doc": d, "label": float(i % 2)} for i, (q, d) in enumerate(pairs[:32])]
    ce_args = CrossEncoderTrainingArguments(**{**args, "output_dir": str(out / f"ce-{device}")})
    ce_trained = CrossEncoderTrainer(model=ce, args=ce_args, train_dataset=labelled,
                                     loss=ce_losses.BinaryCrossEntropyLoss(ce)).train()
    return {"vectors": vectors, "scores": scores, "loss": trained.training_loss, "ce_loss": ce_trained.training_loss}


def test_sentence_encode_predict_and_training_on_the_gpu_equal_the_cpu(tiny_checkpoint, minilm_tokenizer_dir,
                                                                          tmp_path):
    """The GPU's feeding path (encode and predict tokenize ahead on a thread and copy from pinned memory; training
    collates in loader workers, a cross-encoder's word pieces stay on the host) gives the CPU's vectors, scores,
    in the inputs' order, and training losses."""
    directory = str(tiny_checkpoint(tmp_path / "enc", tokenizer=minilm_tokenizer_dir, hidden_dropout_prob=0.0,
                                    attention_probs_dropout_prob=0.0))
    ce_directory = str(tiny_checkpoint(tmp_path / "ce", "BertForSequenceClassification", tokenizer=minilm_tokenizer_dir,
                                       labels=1, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))
    torch.manual_seed(0)
    cpu = _sentence_runs(directory, ce_directory, "cpu", tmp_path)
    torch.manual_seed(0)
    gpu = _sentence_runs(directory, ce_directory, "cuda", tmp_path)
    np.testing.assert_allclose(gpu["vectors"], cpu["vectors"], atol=1e-5)
    np.testing.assert_allclose(gpu["scores"], cpu["scores"], atol=1e-5)
    assert gpu["loss"] == pytest.approx(cpu["loss"], rel=1e-4)
    assert gpu["ce_loss"] == pytest.approx(cpu["ce_loss"], rel=1e-4)


def test_training_rectangle_masks_with_one_aligned_bias_and_pair_widths_round_under_autocast(
        tiny_model, tiny_checkpoint, minilm_tokenizer_dir, tmp_path):
    """Training under bf16 autocast keeps the rectangle and masks padding with one additive bias in bf16 made per
    pass (``padding.additive_bias``), giving the states of the boolean mask (attention dropout ~0 here, so the
    training layout runs without dropping anything); a cross-encoder's pair batches round their width up to
    ``GPU_HALF_WIDTH_MULTIPLE`` there (bounded cuDNN graphs), and score the pairs as unrounded ones do."""
    from bertkit.sentence import CrossEncoder
    from bertkit.sentence.cross_encoder.model import GPU_HALF_WIDTH_MULTIPLE

    model = tiny_model(hidden_dropout_prob=0.0, attention_probs_dropout_prob=1e-9).to(CUDA)
    ids = torch.randint(1, 99, (3, 40), device=CUDA)
    mask = torch.ones_like(ids)
    mask[1, 25:] = 0
    with torch.autocast("cuda", dtype=torch.bfloat16):
        model.train()
        rect = model(input_ids=ids, attention_mask=mask)
        bias = rect.token_layout.attn_bias
        assert rect.token_layout.is_padded and bias.dtype == torch.bfloat16 and bias.stride(0) % 16 == 0
        model.eval()
        want = model(input_ids=ids, attention_mask=mask, layout="padded")
    real = mask.bool()
    torch.testing.assert_close(rect.last_hidden_state[real].float(), want.last_hidden_state[real].float(),
                               atol=2e-2, rtol=0)
    ce = CrossEncoder(str(tiny_checkpoint(tmp_path / "ce", "BertForSequenceClassification",
                                          tokenizer=minilm_tokenizer_dir, labels=1)), device="cuda")
    pairs = (["a short question"] * 2, ["a passage", "another passage with a few more words in it"])
    plain = ce.pair_batch(*pairs)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        rounded = ce.pair_batch(*pairs)
        assert rounded["input_ids"].shape[1] == GPU_HALF_WIDTH_MULTIPLE > plain["input_ids"].shape[1]
        torch.testing.assert_close(ce.scores(rounded).float(), ce.scores(plain).float(), atol=2e-2, rtol=0)


def test_tensors_come_back_on_the_models_device_as_sentence_transformers_returns_them(tiny_checkpoint,
                                                                                      minilm_tokenizer_dir, tmp_path):
    """sentence-transformers leaves on the model's device what it does not turn into numpy (convert_to_tensor, or
    a list of rows), and quantized rows on the CPU (they come from numpy); bertkit gathered every result on the
    CPU, so a GPU model's tensors met the user's GPU tensors on another device."""
    from bertkit.sentence import SentenceTransformer
    from bertkit.sentence.cross_encoder import CrossEncoder

    model = SentenceTransformer(str(tiny_checkpoint(tmp_path / "enc", tokenizer=minilm_tokenizer_dir)), device="cuda")
    texts = ["a first text", "and a second, longer text than the first"]
    assert model.encode(texts, convert_to_tensor=True).device.type == "cuda"
    assert {row.device.type for row in model.encode(texts, convert_to_numpy=False)} == {"cuda"}
    assert model.encode([], convert_to_tensor=True).device.type == "cuda"
    assert model.encode(texts, convert_to_tensor=True, precision="int8").device.type == "cpu"
    assert isinstance(model.encode(texts), np.ndarray)
    ce = CrossEncoder(str(tiny_checkpoint(tmp_path / "ce", "BertForSequenceClassification",
                                          tokenizer=minilm_tokenizer_dir, labels=1)), device="cuda")
    assert ce.predict([tuple(texts)], convert_to_tensor=True).device.type == "cuda"
    assert isinstance(ce.predict([tuple(texts)]), np.ndarray)


def test_unit_length_on_the_gpu_is_the_cpus_without_a_host_sync():
    """On the GPU unit_length rescales every row instead of asking the host whether a norm overflowed (a sync in
    each training step through Normalize): the same numbers as on the CPU, the overflowing row included."""
    from bertkit.sentence.finite import unit_length

    rows = torch.cat([torch.tensor([[1e20, 1e20, 0.0, 0.0]]), torch.randn(7, 4, generator=torch.Generator().manual_seed(0))])
    torch.cuda.set_sync_debug_mode("error")  # a synchronising call raises
    try:
        got = unit_length(rows.to(CUDA))
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.testing.assert_close(got.cpu(), unit_length(rows), **TOL)
