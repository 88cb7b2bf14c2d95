"""A ``Dense`` after the Pooling (LaBSE's 768->768 tanh, a fine-tuned embedder's width reduction), beside
sentence-transformers 6.3 on MiniLM's first 2 layers: a directory it saves with Dense layers embeds to its vectors in
bertkit, bertkit's save loads to the same vectors there, and MultipleNegativesRankingLoss trains the Dense layers to its
losses. The embedding pipelines (predict, serve) refuse such a directory by name."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from bertkit.errors import BertkitError
from bertkit.sentence import SentenceTransformer, models

st = pytest.importorskip("sentence_transformers")
st_models = pytest.importorskip("sentence_transformers.models")

TEXTS = ["A man is eating food.", "The quick brown fox jumps over the lazy dog near the river bank.", "hi",
         "Ünïcödé accents and CJK 漢字 too"]


def _weights(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(256, 384, generator=g) * 0.05, torch.randn(256, generator=g) * 0.05,
            torch.randn(128, 256, generator=g) * 0.05)


def _modules(lib, path, normalize: bool = True, dropout: float | None = None, pooling: str = "cls") -> list:
    """Transformer, Pooling (cls: LaBSE's), Dense 384->256 tanh with a bias, Dense 256->128 identity without, Normalize."""
    w1, b1, w2 = _weights()
    config = {"hidden_dropout_prob": dropout, "attention_probs_dropout_prob": dropout} if dropout is not None else {}
    return [lib.Transformer(str(path), max_seq_length=64, config_args=config), lib.Pooling(384, pooling_mode=pooling),
            lib.Dense(384, 256, bias=True, activation_function=torch.nn.Tanh(), init_weight=w1.clone(),
                      init_bias=b1.clone()),
            lib.Dense(256, 128, bias=False, activation_function=torch.nn.Identity(), init_weight=w2.clone()),
            *([lib.Normalize()] if normalize else [])]


def test_a_directory_with_dense_layers_embeds_as_sentence_transformers(minilm_2_layers, tmp_path):
    """Refused by name before; now sentence-transformers' save (safetensors, and pytorch_model.bin) gives its vectors,
    with truncate_dim after the Dense layers, and bertkit's save loads there to the same vectors."""
    for normalize, safe in ((True, True), (False, False)):
        theirs = st.SentenceTransformer(modules=_modules(st_models, minilm_2_layers, normalize), device="cpu")
        saved = tmp_path / f"st-{normalize}"
        theirs.save(str(saved), safe_serialization=safe)
        assert (saved / "2_Dense" / ("model.safetensors" if safe else "pytorch_model.bin")).is_file()
        ours = SentenceTransformer(saved)
        assert [type(m).__name__ for m in ours][1:] == ["Pooling", "Dense", "Dense", *(["Normalize"] * normalize)]
        assert ours.get_sentence_embedding_dimension() == ours[-1 - normalize].get_embedding_dimension() == 128
        expected = theirs.encode(TEXTS, convert_to_tensor=True)
        torch.testing.assert_close(ours.encode(TEXTS, convert_to_tensor=True), expected, atol=1e-5, rtol=0)
        torch.testing.assert_close(ours.encode(TEXTS, truncate_dim=32, normalize_embeddings=True, convert_to_tensor=True),
                                   theirs.encode(TEXTS, truncate_dim=32, normalize_embeddings=True,
                                                 convert_to_tensor=True), atol=1e-5, rtol=0)
        back = st.SentenceTransformer(str(ours.save(tmp_path / f"ours-{normalize}")), device="cpu")
        assert [type(m).__name__ for m in back] == [type(m).__name__ for m in theirs]
        torch.testing.assert_close(back.encode(TEXTS, convert_to_tensor=True), expected, atol=1e-5, rtol=0)
        assert json.loads((tmp_path / f"ours-{normalize}" / "2_Dense" / "config.json").read_text()) == \
            json.loads((saved / "2_Dense" / "config.json").read_text())
    # model_kwargs' dtype loads the Dense layers in it too, as there (kept in float32 they gave vectors 1e-3 from its)
    half = [lib(str(saved), model_kwargs={"dtype": torch.bfloat16}) for lib in (SentenceTransformer, st.SentenceTransformer)]
    assert half[0][2].linear.weight.dtype == torch.bfloat16
    torch.testing.assert_close(half[0].encode(TEXTS, convert_to_tensor=True), half[1].encode(TEXTS, convert_to_tensor=True),
                               atol=1e-6, rtol=0)


def test_modules_run_one_by_one_with_dense_layers_update_the_features_as_sentence_transformers(minilm_2_layers):
    """``features = model[2](features)``: bertkit's Dense took the embedding tensor, not sentence-transformers' features
    (AttributeError: 'dict' object has no attribute 'to'), and ``model(features)`` returned a new dict. Now the chain (Transformer,
    Pooling without the prompt, two Dense layers, with and without Normalize) updates the same dict as there, within
    1e-5."""
    from sentence_helpers import assert_chain_as_sentence_transformers

    for normalize in (True, False):
        ours, ref = (model(modules=_modules(lib, minilm_2_layers, normalize, pooling="mean"), device="cpu")
                     for model, lib in ((SentenceTransformer, models), (st.SentenceTransformer, st_models)))
        ours[1].include_prompt = ref[1].include_prompt = False
        assert assert_chain_as_sentence_transformers(ours, ref, TEXTS, prompt="query: ").shape == (4, 128)


def test_mnrl_trains_the_dense_layers_to_sentence_transformers_losses(minilm_2_layers, tmp_path):
    """3 steps of MultipleNegativesRankingLoss (dropout off) on a model assembled with two Dense layers: the same
    losses, the Dense layers trained (their own rate by sentence-transformers' module name, ``2.linear``), and the
    same vectors after training."""
    datasets = pytest.importorskip("datasets")
    rows = [{"q": f"question {i} about topic {i % 5}?", "p": f"A paragraph {i} on topic {i % 5} and its {i}th fact."}
            for i in range(24)]
    from bertkit.sentence import SentenceTransformerTrainer, SentenceTransformerTrainingArguments, losses

    st_losses = pytest.importorskip("sentence_transformers.losses")
    runs = []
    for lib, model_cls, trainer_cls, args_cls, loss_cls in (
            (models, SentenceTransformer, SentenceTransformerTrainer, SentenceTransformerTrainingArguments,
             losses.MultipleNegativesRankingLoss),
            (st_models, st.SentenceTransformer, st.SentenceTransformerTrainer, st.SentenceTransformerTrainingArguments,
             st_losses.MultipleNegativesRankingLoss)):
        model = model_cls(modules=_modules(lib, minilm_2_layers, dropout=0.0, pooling="mean"), device="cpu")
        args = args_cls(output_dir=str(tmp_path / lib.__name__), report_to="none", use_cpu=True, disable_tqdm=True,
                        per_device_train_batch_size=8, max_steps=3, learning_rate=1e-3, logging_steps=1, seed=1,
                        save_strategy="no", learning_rate_mapping={r"2\.linear": 5e-3})
        trainer = trainer_cls(model=model, args=args, train_dataset=datasets.Dataset.from_list(rows), loss=loss_cls(model))
        trainer.train()
        runs.append(([h["loss"] for h in trainer.state.log_history if "loss" in h],
                     model.encode(TEXTS, convert_to_tensor=True), model[2].linear.weight.detach()))
    (ours, ours_vectors, ours_dense), (theirs, theirs_vectors, theirs_dense) = runs
    assert len(ours) == 3
    torch.testing.assert_close(torch.tensor(ours), torch.tensor(theirs), atol=1e-5, rtol=0)
    assert (ours_dense - _weights()[0]).abs().max() > 5e-3  # trained: two Adam steps of 5e-3 (no warm-up)
    # Adam makes float32 rounding of a near-zero gradient a step of up to its rate (5e-3 here): the weights are
    # compared through the vectors they give
    torch.testing.assert_close(ours_dense, theirs_dense, atol=5e-3, rtol=0)
    torch.testing.assert_close(ours_vectors, theirs_vectors, atol=1e-5, rtol=0)


def test_what_a_dense_layer_cannot_be_is_refused_by_name(minilm_2_layers, tmp_path):
    """Another activation, a residual, widths that do not chain, weights of another shape; and the pipelines, which
    run no Dense, refuse the directory naming SentenceTransformer."""
    import bertkit

    saved = tmp_path / "st"
    st.SentenceTransformer(modules=_modules(st_models, minilm_2_layers), device="cpu").save(str(saved))
    for task in ("feature-extraction", "sentence-embedding"):
        with pytest.raises(BertkitError, match=r"has Dense modules after its Pooling \(2_Dense, 3_Dense\), which the "
                                               r"embedding pipelines.*load it with bertkit.sentence.SentenceTransformer"):
            bertkit.pipeline(task, saved)
    config_file = saved / "2_Dense" / "config.json"
    config = json.loads(config_file.read_text())
    for change, message in [({"activation_function": "torch.nn.modules.activation.ReLU"},
                             r"activation_function 'torch.nn.modules.activation.ReLU' is not implemented"),
                            ({"use_residual": True}, r"use_residual=True.*is not implemented in bertkit"),
                            ({"bias": False}, r"weights in .*2_Dense are \{'linear.bias': \(256,\), 'linear.weight': "
                                              r"\(256, 384\)\}, but its config.json makes a Dense of \{'linear.weight'")]:
        config_file.write_text(json.dumps({**config, **change}))
        with pytest.raises(BertkitError, match=message):
            SentenceTransformer(saved)
    shutil.rmtree(saved / "2_Dense")
    with pytest.raises(FileNotFoundError, match=r"2_Dense/config.json is missing; modules.json lists a Dense"):
        SentenceTransformer(saved)
    word, pool = models.Transformer(minilm_2_layers), models.Pooling(384)
    with pytest.raises(BertkitError, match=r"Dense 1 takes 64 dimensions but Dense 0 gives 128; make its in_features"):
        SentenceTransformer(modules=[word, pool, models.Dense(384, 128), models.Dense(64, 32)])
    with pytest.raises(BertkitError, match=r"Dense 0 takes 768 dimensions but its Pooling gives 384"):
        SentenceTransformer(modules=[word, pool, models.Dense(768, 128)])
    with pytest.raises(BertkitError, match=r"activation_function=torch.nn.modules.activation.GELU\) is not implemented"):
        models.Dense(384, 128, activation_function=torch.nn.GELU())
    with pytest.raises(BertkitError, match=r"init_weight=...\) has the shape \(384, 128\); a Dense of 384 -> 128 takes "
                                           r"\(128, 384\)"):  # a RuntimeError from torch's copy before
        models.Dense(384, 128, init_weight=torch.zeros(384, 128))


def test_add_module_appends_a_dense_as_sentence_transformers_does(minilm_2_layers, tmp_path):
    """sentence-transformers' model_distillation example appends a PCA Dense to its teacher with add_module. Was:
    bertkit registered the module and never ran it (the teacher kept embedding 384 dimensions)."""
    from sentence_helpers import st_directory

    path = st_directory(minilm_2_layers, tmp_path / "m", normalize=False, max_seq_length=64)
    weight = torch.randn(128, 384, generator=torch.Generator().manual_seed(1)) * 0.05
    vectors = []
    for lib, model in ((models, SentenceTransformer(path)), (st_models, st.SentenceTransformer(str(path), device="cpu"))):
        model.add_module("dense", lib.Dense(384, 128, bias=False, activation_function=torch.nn.Identity(),
                                            init_weight=weight.clone()))
        vectors.append(model.encode(TEXTS, convert_to_tensor=True))
        assert model.get_sentence_embedding_dimension() == 128
    torch.testing.assert_close(vectors[0], vectors[1], atol=1e-5, rtol=0)
    normalized = SentenceTransformer(st_directory(minilm_2_layers, tmp_path / "n"))
    with pytest.raises(BertkitError, match=r"add_module\('dense', ...\) on a model that normalises its embeddings"):
        normalized.add_module("dense", models.Dense(384, 128))
    with pytest.raises(BertkitError, match=r"add_module\('norm', ...\) on a LayerNorm is not implemented"):
        normalized.add_module("norm", torch.nn.LayerNorm(384))
    with pytest.raises(BertkitError, match="it takes 256 dimensions but the model embeds 384"):
        SentenceTransformer(path).add_module("dense", models.Dense(256, 128))


def test_a_dense_layer_saved_alone_on_a_full_disk_keeps_its_earlier_weights(tmp_path, monkeypatch):
    """Was: ``Dense.save(path)`` (sentence-transformers' module API, called alone) wrote model.safetensors in place:
    a full disk left it torn, the earlier weights gone. Now it is written beside and renamed in, as every file."""
    import errno

    import safetensors.torch

    from bertkit.errors import WriteError

    torch.manual_seed(0)
    models.Dense(4, 2).save(tmp_path)
    earlier = (tmp_path / "model.safetensors").read_bytes()

    def full_disk(tensors, filename, metadata=None):
        Path(filename).write_bytes(b"half a file")
        raise OSError(errno.ENOSPC, "No space left on device", filename)

    monkeypatch.setattr(safetensors.torch, "save_file", full_disk)
    with pytest.raises(WriteError, match="No space left on device"):
        models.Dense(4, 2).save(tmp_path)
    assert (tmp_path / "model.safetensors").read_bytes() == earlier
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "model.safetensors"]
