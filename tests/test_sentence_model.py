"""bertkit.sentence.SentenceTransformer against sentence-transformers on the same all-MiniLM-L6-v2 directory:
the same embeddings (every pooling mode, prompts, truncation, normalisation), quantization equal byte for byte,
a saved directory that sentence-transformers opens, and clear refusals."""

from __future__ import annotations

import copy
import json
import re

import numpy as np
import pytest
import torch

from bertkit.errors import BertkitError
from bertkit.sentence import SentenceTransformer, quantize_embeddings
from sentence_helpers import POOLING, assert_chain_as_sentence_transformers, st_directory

st = pytest.importorskip("sentence_transformers")
st_models = pytest.importorskip("sentence_transformers.models")

TEXTS = ["A man is eating food.", "A man is riding a horse on a sunny beach.", "hi",
         "Sentence embeddings put similar sentences close together, and different ones apart. " * 12,
         "The new movie is awesome", "Ünïcödé accents and CJK 漢字 too"]


@pytest.fixture(scope="module")
def st_dir(tmp_path_factory, minilm_dir):
    return st_directory(minilm_dir, tmp_path_factory.mktemp("st") / "all-MiniLM-L6-v2",
                        st_config={"prompts": {"query": "query: ", "doc": ""}, "similarity_fn_name": "dot"})


@pytest.fixture(scope="module")
def models(st_dir):
    return SentenceTransformer(st_dir), st.SentenceTransformer(str(st_dir), device="cpu")


@pytest.fixture(scope="module")
def st_dir_2_layers(tmp_path_factory, minilm_2_layers):
    """``st_dir`` on MiniLM's first 2 layers, for the checks of saving, chaining the modules, threads and half
    types: the same at any depth, at a third of the cost (MiniLM's own numbers take ``st_dir``)."""
    return st_directory(minilm_2_layers, tmp_path_factory.mktemp("st") / "all-MiniLM-L6-v2",
                        st_config={"prompts": {"query": "query: ", "doc": ""}, "similarity_fn_name": "dot"})


@pytest.fixture(scope="module")
def models_2_layers(st_dir_2_layers):
    return SentenceTransformer(st_dir_2_layers), st.SentenceTransformer(str(st_dir_2_layers), device="cpu")


def test_embeddings_match_sentence_transformers(models):
    ours, ref = models
    assert ours.normalize and ours.max_seq_length == 256 and ours.similarity_fn_name == "dot"
    torch.testing.assert_close(ours.encode(TEXTS), ref.encode(TEXTS), atol=1e-5, rtol=0)
    for kwargs in ({"prompt_name": "query"}, {"prompt": "passage: ", "truncate_dim": 64},
                   {"truncate_dim": 32, "normalize_embeddings": True, "batch_size": 2}):
        torch.testing.assert_close(ours.encode(TEXTS, **kwargs), ref.encode(TEXTS, **kwargs), atol=1e-5, rtol=0)
    one = ours.encode(TEXTS[0], convert_to_tensor=True)
    assert one.shape == (384,) and isinstance(one, torch.Tensor)
    assert isinstance(ours.encode(TEXTS, convert_to_numpy=False), list)
    a, b = ours.encode(TEXTS[:3]), ref.encode(TEXTS[:3])
    torch.testing.assert_close(ours.similarity(a, a), ref.similarity(b, b), atol=1e-5, rtol=0)


def test_pooling_modes_match(tmp_path, minilm_2_layers):
    """cls, max, mean and mean_sqrt_len_tokens at once: sentence-transformers concatenates them in that order."""
    modes = {"pooling_mode_cls_token": True, "pooling_mode_max_tokens": True, "pooling_mode_mean_tokens": True,
             "pooling_mode_mean_sqrt_len_tokens": True}
    d = st_directory(minilm_2_layers, tmp_path / "m", pooling={**POOLING, **modes}, normalize=False)
    ours, ref = SentenceTransformer(d), st.SentenceTransformer(str(d), device="cpu")
    got, want = ours.encode(TEXTS[:4]), ref.encode(TEXTS[:4])
    assert ours.pooling.modes == ("cls", "max", "mean", "mean_sqrt_len_tokens") and got.shape == want.shape == (4, 1536)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


def test_weightedmean_and_lasttoken_pool_as_sentence_transformers(tmp_path, minilm_2_layers):
    """weightedmean (token i weighs i) and lasttoken (the last token, [SEP]), concatenated after the other modes in
    the order sentence-transformers gives them, a prompt left out: refused before ("pooling ['weightedmean',
    'lasttoken'] is not implemented"), in SentenceTransformer and the pipelines. A save writes their legacy keys too,
    and sentence-transformers reads the save as the same model."""
    import bertkit

    legacy = {"pooling_mode_weightedmean_tokens": True, "pooling_mode_lasttoken": True, "include_prompt": False}
    d = st_directory(minilm_2_layers, tmp_path / "m", pooling={**POOLING, **legacy}, normalize=False,
                     st_config={"prompts": {"query": "query: "}})
    ours, ref = SentenceTransformer(d), st.SentenceTransformer(str(d), device="cpu")
    assert ours.pooling.modes == ("mean", "weightedmean", "lasttoken")
    got, want = ours.encode(TEXTS, prompt_name="query"), ref.encode(TEXTS, prompt_name="query")
    assert got.shape == want.shape == (len(TEXTS), 3 * 384)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    ours.save(tmp_path / "saved")
    saved = json.loads((tmp_path / "saved" / "1_Pooling" / "config.json").read_text())
    assert (saved["pooling_mode_weightedmean_tokens"], saved["pooling_mode_lasttoken"]) == (True, True)
    again = st.SentenceTransformer(str(tmp_path / "saved"), device="cpu").encode(TEXTS, prompt_name="query")
    torch.testing.assert_close(again, want, atol=1e-5, rtol=0)
    for mode in ("weightedmean", "lasttoken"):
        pipe = bertkit.pipeline("feature-extraction", minilm_2_layers, pooling=mode, progress=False)
        single = st_directory(minilm_2_layers, tmp_path / mode, normalize=False,
                              pooling={"word_embedding_dimension": 384, "pooling_mode": mode})
        np.testing.assert_allclose(np.asarray(pipe(TEXTS)), st.SentenceTransformer(str(single), device="cpu").encode(
            TEXTS), atol=2e-5)


def test_prompt_left_out_of_pooling(tmp_path, minilm_2_layers):
    d = st_directory(minilm_2_layers, tmp_path / "m", pooling={**POOLING, "include_prompt": False})
    ours, ref = SentenceTransformer(d), st.SentenceTransformer(str(d), device="cpu")
    kwargs = {"prompt": "Represent this sentence for searching relevant passages: "}
    torch.testing.assert_close(ours.encode(TEXTS, **kwargs), ref.encode(TEXTS, **kwargs), atol=1e-5, rtol=0)


@pytest.mark.parametrize("precision", ["float32", "int8", "uint8", "binary", "ubinary"])
def test_quantization_equals_sentence_transformers(models, precision):
    ours, _ = models
    floats = ours.encode(TEXTS)
    want = st.quantize_embeddings(floats, precision=precision)
    got = quantize_embeddings(floats, precision)
    assert got.dtype == want.dtype and np.array_equal(got, want)
    assert np.array_equal(ours.encode(TEXTS, precision=precision), want)
    ranges = np.stack([floats.min(0) - 0.1, floats.max(0) + 0.1])
    if precision.endswith("int8"):
        assert np.array_equal(quantize_embeddings(floats[:2], precision, ranges=ranges),
                              st.quantize_embeddings(floats[:2], precision=precision, ranges=ranges))
    # a list of matrices (a multi-vector model's per-token embeddings) is refused, with the recipe that gives
    # sentence-transformers' numbers (stacked, int8 took each position's buckets across the matrices)
    matrices = [floats[:3], floats[3:6]]
    with pytest.raises(BertkitError, match="a list of 2 matrices"):
        quantize_embeddings(matrices, precision)
    rows = quantize_embeddings(np.concatenate(matrices), precision)
    for got, want in zip(np.split(rows, [3]), st.quantize_embeddings(matrices, precision=precision), strict=True):
        assert np.array_equal(got, want)



def test_quantization_reads_tensors_in_their_own_precision():
    """float64 tensors are bucketed in float64, as sentence-transformers reads them: rounded to float32 first (as
    bertkit did), 166 of 76,800 int8 values of 200 SQuAD questions' embeddings landed one bucket up. An empty list
    comes back as one, and an empty matrix as an empty int8 matrix, as sentence-transformers returns them."""
    g = torch.Generator().manual_seed(0)
    floats = torch.randn(64, 384, generator=g, dtype=torch.float64)
    for precision in ("int8", "uint8", "binary", "ubinary", "float32"):
        for embeddings in (floats, list(floats[:8]), floats.to(torch.bfloat16), floats.half()):
            got, want = quantize_embeddings(embeddings, precision), st.quantize_embeddings(embeddings, precision)
            assert got.dtype == want.dtype and np.array_equal(got, want), (precision, embeddings[0].dtype)
    assert quantize_embeddings([], "int8") == st.quantize_embeddings([], "int8") == []
    for precision in ("int8", "uint8", "binary"):
        got, want = quantize_embeddings(np.zeros((0, 384), np.float32), precision), st.quantize_embeddings(
            np.zeros((0, 384), np.float32), precision)
        assert got.dtype == want.dtype and got.shape == want.shape, precision


def test_quantization_refuses_what_it_would_turn_into_numbers():
    """A NaN was quantized as a number, and as the minimum of its dimension made that dimension of every embedding
    one bucket; ranges of shape (2, 1), or calibration embeddings of one dimension or one embedding, were broadcast
    over every dimension. sentence-transformers does all of it without a word; bertkit refuses each by name, as it
    does its quantization module's faiss and usearch searches."""
    floats = torch.randn(20, 8, generator=torch.Generator().manual_seed(0)).numpy()
    nan = floats.copy()
    nan[3, 5] = np.nan
    assert len(set(st.quantize_embeddings(nan, "int8")[:, 5])) == 1
    for precision in ("int8", "uint8", "binary", "ubinary"):
        with pytest.raises(BertkitError, match=rf"^embeddings\[3, 5\] is NaN, which {precision} quantization"):
            quantize_embeddings(nan, precision)
    assert np.isnan(quantize_embeddings(nan, "float32")[3, 5])
    ranges = np.stack([floats.min(0), floats.max(0)])
    for embeddings, kwargs, message in (
            (floats, {"ranges": ranges[:, :1]}, r"the int8 ranges from ranges= have the shape \(2, 1\), and the "
                                                r"embeddings 8 dimensions: give ranges of shape \(2, 8\)"),
            (floats[:, :1], {"ranges": ranges}, r"ranges= have the shape \(2, 8\), and the embeddings 1 dimensions"),
            (floats, {"calibration_embeddings": floats[:, :1]}, r"from calibration_embeddings= have the shape \(2, 1\)"),
            (floats, {"calibration_embeddings": floats[0]}, r"from calibration_embeddings= of shape \(8,\)"),
            (floats.reshape(2, 10, 8), {}, r"from the embeddings of shape \(2, 10, 8\)"),
            (floats, {"calibration_embeddings": nan}, r"range of dimension 5 from calibration_embeddings=, nan to nan, "
                                                      r"is not finite")):
        with pytest.raises(BertkitError, match=message):
            quantize_embeddings(embeddings, "int8", **kwargs)
    with pytest.raises(BertkitError, match=r"quantization.semantic_search_usearch is not implemented in bertkit: "
                                           r"search exactly with bertkit.sentence.util.semantic_search"):
        from bertkit.sentence.quantization import semantic_search_usearch  # noqa: F401


def test_saved_directory_opens_in_sentence_transformers(models_2_layers, tmp_path):
    ours, ref = models_2_layers
    ours.save(tmp_path / "saved")
    modules = json.loads((tmp_path / "saved" / "modules.json").read_text())
    assert [m["type"].rsplit(".", 1)[-1] for m in modules] == ["Transformer", "Pooling", "Normalize"]
    reopened = st.SentenceTransformer(str(tmp_path / "saved"), device="cpu")
    assert reopened.prompts["query"] == "query: " and reopened.similarity_fn_name == "dot"
    assert reopened.max_seq_length == 256
    torch.testing.assert_close(reopened.encode(TEXTS), ref.encode(TEXTS), atol=1e-5, rtol=0)
    again = SentenceTransformer(tmp_path / "saved")
    assert again.prompts == ours.prompts and again.normalize
    torch.testing.assert_close(again.encode(TEXTS), ours.encode(TEXTS), atol=0, rtol=0)


def test_save_takes_sentence_transformers_arguments(models_2_layers, tmp_path):
    """sentence-transformers' save(path, model_name, create_model_card, train_datasets, safe_serialization), as a
    ported script passes them (a TypeError before): the model-card arguments write the same directory, and
    safe_serialization=False, which bertkit does not write, is refused naming it before anything is written."""
    ours, ref = models_2_layers
    ours.save_pretrained(tmp_path / "saved", model_name="minilm-embedder", create_model_card=False,
                         train_datasets=["squad"], safe_serialization=True)
    reopened = st.SentenceTransformer(str(tmp_path / "saved"), device="cpu")
    torch.testing.assert_close(reopened.encode(TEXTS[:3]), ref.encode(TEXTS[:3]), atol=1e-5, rtol=0)
    with pytest.raises(BertkitError, match=r"save\(safe_serialization=False\) is not implemented in bertkit: it "
                                           "writes model.safetensors"):
        ours.save(tmp_path / "bin", safe_serialization=False)
    with pytest.raises(BertkitError, match=r"create_model_card='no'\): create_model_card takes bool, got str"):
        ours.save(tmp_path / "bin", create_model_card="no")
    assert not (tmp_path / "bin").exists()


def test_dtype_is_the_weights_type_as_in_sentence_transformers(models):
    """model.dtype, which sentence-transformers' models have (an AttributeError before): the weights' type, also
    after model.half() or .to(torch.bfloat16), as there."""
    ours, ref = models
    assert ours.dtype == ref.dtype == torch.float32
    half = copy.deepcopy(ours).half()  # a copy: the module's other tests share the model
    assert half.dtype == torch.float16
    assert half.to(torch.bfloat16).dtype == torch.bfloat16


def test_plain_checkpoint_gets_mean_pooling(minilm_dir, models):
    plain = SentenceTransformer(minilm_dir)
    assert plain.pooling.modes == ("mean",) and not plain.normalize
    torch.testing.assert_close(plain.encode(TEXTS[:3], normalize_embeddings=True), models[0].encode(TEXTS[:3]),
                               atol=1e-6, rtol=0)


def test_bad_input_is_named(models, tmp_path, minilm_dir):
    ours, _ = models
    with pytest.raises(BertkitError, match=r"truncate_dim 500 must be a whole number in \[1, 384\]"):
        ours.encode(TEXTS, truncate_dim=500)
    with pytest.raises(BertkitError, match="prompt_name 'passage' is not one of"):
        ours.encode(TEXTS, prompt_name="passage")
    with pytest.raises(BertkitError, match="precision 'int4'"):
        ours.encode(TEXTS, precision="int4")
    # refused where it is set (it reached the encoder at encode, whose error advised the tokenizer's truncation)
    with pytest.raises(BertkitError, match=r"max_seq_length 600 must be a whole number in \[2, 512\] \(the "
                                           r"encoder's positions"):
        ours.max_seq_length = 600
    assert ours.max_seq_length == 256
    with pytest.raises(BertkitError, match="multi-process"):
        ours.encode(TEXTS, pool={})
    # sentence-transformers encodes in a process per device; bertkit raised torch's "to() received an invalid combination"
    with pytest.raises(BertkitError, match=r"encode\(device=\['cpu', 'cpu'\]\): multi-process encoding is not"):
        ours.encode(TEXTS, device=["cpu", "cpu"])
    with pytest.raises(BertkitError, match="trust_remote_code"):
        SentenceTransformer(minilm_dir, trust_remote_code=True)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        SentenceTransformer(tmp_path / "absent")
    with pytest.raises(BertkitError, match="single embedding"):
        quantize_embeddings(np.ones((1, 8), np.float32), "int8")
    d = st_directory(minilm_dir, tmp_path / "dense")
    (d / "modules.json").write_text(json.dumps(json.loads((d / "modules.json").read_text())[:2] + [
        {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"}]))
    with pytest.raises(FileNotFoundError, match="2_Dense/config.json is missing; modules.json lists a Dense"):
        SentenceTransformer(d)
    for pooling, message in (({"pooling_mode": "mean"}, "has no embedding_dimension"),
                             ({"embedding_dimension": 384, "pooling_mode": 5}, "pooling_mode 5 must be a mode's name"),
                             # mean pooling before, without a word; sentence-transformers fails at encode
                             ({"embedding_dimension": 384, "pooling_mode": []}, r"pooling_mode \[\] names no mode")):
        d = st_directory(minilm_dir, tmp_path / f"pooling-{len(message)}", pooling=pooling)
        with pytest.raises(BertkitError, match=message):  # a TypeError from int() or tuple() before
            SentenceTransformer(d)


@pytest.mark.parametrize("listed", [{"0": {"type": "Transformer"}}, [1, 2], [{"path": ""}], [{"type": "Pooling", "path": 1}],
                                    b"\xff["])
def test_a_modules_json_of_another_shape_is_refused_naming_it(tmp_path, listed):
    """A modules.json that is valid JSON but not a list of modules reached the readers' indexing: AttributeError or
    TypeError from inside SentenceTransformer, CrossEncoder or SparseEncoder (one not UTF-8: UnicodeDecodeError).
    `bertkit quantize` read it as no modules, and wrote an int8 directory that every loader then refused."""
    from bertkit.quantization import quantize_checkpoint
    from bertkit.sentence import CrossEncoder, SentenceTransformer, SparseEncoder

    (tmp_path / "st").mkdir()
    (tmp_path / "st" / "modules.json").write_bytes(listed if isinstance(listed, bytes) else json.dumps(listed).encode())
    for load in (SentenceTransformer, CrossEncoder, SparseEncoder, lambda d: quantize_checkpoint(d, tmp_path / "q")):
        with pytest.raises(BertkitError, match=r"modules.json (must be a list of modules \({'idx', 'name', 'path', "
                                               r"'type'} each\), got .*|is not valid JSON \(.*\)); restore it from the "
                                               r"model's source"):
            load(str(tmp_path / "st"))


def test_a_saved_truncate_dim_wider_than_the_model_is_refused_naming_the_file(tmp_path, minilm_2_layers):
    """A config_sentence_transformers.json whose truncate_dim exceeds the model's width (sentence-transformers slices
    with it and returns every dimension): the refusal named neither the file nor the fix, so SentenceTransformer,
    the embedding pipelines, `bertkit predict` and `bertkit serve` said "truncate_dim 500 must be a whole number in
    [1, 384]" of a value the caller never gave."""
    from bertkit import pipeline

    saved = st_directory(minilm_2_layers, tmp_path / "wide", st_config={"truncate_dim": 500})
    file = re.escape(str(saved / "config_sentence_transformers.json"))
    want = (rf"^{file}: truncate_dim 500 exceeds this model's 384 dimensions \(sentence-transformers then keeps all "
            r"384\); write a truncate_dim in \[1, 384\] there or remove it \(in Python, truncate_dim= chooses another\)")
    with pytest.raises(BertkitError, match=want):
        SentenceTransformer(saved)
    with pytest.raises(BertkitError, match=want):
        pipeline("sentence-embedding", model=str(saved))
    # the caller's truncate_dim wins over the file's, as in sentence-transformers
    assert SentenceTransformer(saved, truncate_dim=64).encode(TEXTS[:2]).shape == (2, 64)
    assert np.asarray(pipeline("feature-extraction", model=str(saved), truncate_dim=64)(TEXTS[:2])).shape == (2, 64)


def test_forward_returns_the_token_embeddings_beside_the_sentence_embedding(models):
    """``model(features)["token_embeddings"]``, sentence-transformers' last-layer token states: a KeyError before
    (bertkit's forward added only ``sentence_embedding``)."""
    ours, ref = models
    features, want = ours.tokenize(TEXTS[:3]), ref.tokenize(TEXTS[:3])
    with torch.no_grad():
        got, expected = ours(features), ref(want)
    assert {"token_embeddings", "sentence_embedding", "attention_mask"} <= set(got)
    real = want["attention_mask"].bool()  # (B, T): sentence-transformers' padding positions hold unpooled states
    assert got["token_embeddings"].shape == expected["token_embeddings"].shape == (3, *real.shape[1:], 384)
    torch.testing.assert_close(got["token_embeddings"][real], expected["token_embeddings"][real], atol=1e-5, rtol=0)
    torch.testing.assert_close(got["sentence_embedding"], expected["sentence_embedding"], atol=1e-5, rtol=0)



def test_module_0_returns_the_token_embeddings_and_every_layer_when_asked(models):
    """``model[0](features)``, sentence-transformers' Transformer.forward (features -> features with
    ``token_embeddings``, and ``all_layer_embeddings`` where the encoder's config sets ``output_hidden_states``), was
    refused. Now it is the model's own first step: ``model(features)``'s token_embeddings exactly, sentence-transformers'
    at the real tokens within 1e-5, the same dict returned (updated in place, as there), every layer when asked."""
    ours, ref = models
    features, want = ours.tokenize(TEXTS[:3]), ref.tokenize(TEXTS[:3])
    real = want["attention_mask"].bool()  # (B, T): sentence-transformers' padding positions hold unpooled states
    with torch.no_grad():
        whole = ours(dict(features))
        got, expected = ours[0](features), ref[0](want)
        assert got is features and set(got) == set(whole) - {"sentence_embedding"} and "all_layer_embeddings" not in got
        torch.testing.assert_close(got["token_embeddings"], whole["token_embeddings"], atol=0, rtol=0)
        torch.testing.assert_close(got["token_embeddings"][real], expected["token_embeddings"][real], atol=1e-5, rtol=0)
        configs = [m[0].auto_model.config for m in models]
        try:
            for config in configs:
                config.output_hidden_states = True
            got, expected = ours[0](ours.tokenize(TEXTS[:3])), ref[0](ref.tokenize(TEXTS[:3]))
            assert "all_layer_embeddings" in ours(ours.tokenize(TEXTS[:3]))
        finally:
            for config in configs:
                config.output_hidden_states = False
    assert len(got["all_layer_embeddings"]) == len(expected["all_layer_embeddings"]) == 7  # embeddings + 6 layers
    for layer, reference in zip(got["all_layer_embeddings"], expected["all_layer_embeddings"], strict=True):
        torch.testing.assert_close(layer[real], reference[real], atol=1e-5, rtol=0)
    torch.testing.assert_close(got["all_layer_embeddings"][-1], got["token_embeddings"], atol=0, rtol=0)


def test_modules_run_one_by_one_update_the_features_as_sentence_transformers(models_2_layers):
    """sentence-transformers 6.3's chain, ``features = model[i](features)`` module by module, and ``model(features)``,
    which updates the caller's dict: ``model[1](model[0](features))`` failed in bertkit (its Pooling took the encoder's
    output, not the features: TypeError), as did ``model[-1](features)`` (Normalize was not callable), and
    ``model(features)`` returned a new dict, so a script reading ``features["sentence_embedding"]`` after it got a
    KeyError. Now each step updates the same dict with sentence-transformers' keys and values (within 1e-5), a prompt
    left out of the pooling where include_prompt is False, and ``model(features)`` is that chain."""
    ours, ref = models_2_layers
    pooled = {}
    try:
        for include_prompt in (True, False):
            ours[1].include_prompt = ref[1].include_prompt = include_prompt
            pooled[include_prompt] = assert_chain_as_sentence_transformers(ours, ref, TEXTS[:4], prompt="query: ")
        assert_chain_as_sentence_transformers(ours, ref, TEXTS[:4])
    finally:
        ours[1].include_prompt = ref[1].include_prompt = True
    assert (pooled[True] - pooled[False]).abs().max() > 1e-2  # the prompt's tokens were left out
    with pytest.raises(BertkitError, match=re.escape("model[1](features) needs ['token_embeddings'] (the features hold "
                                                     "['attention_mask', 'input_ids', 'prompt_length', 'token_type_ids']"
                                                     "): build them with model[0](model.tokenize(texts))")):
        ours[1](ours.tokenize(TEXTS[:2]))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_forward_of_a_half_model_gives_its_embedding_in_that_type(st_dir_2_layers, dtype):
    """``model.half()`` then ``model(features)``: the sentence embedding came back in float32 where
    sentence-transformers' (and the token embeddings here) are float16, so a product with the model's other outputs
    failed in torch ("expected m1 and m2 to have the same dtype")."""
    ours = SentenceTransformer(st_dir_2_layers).to(dtype)
    ref = st.SentenceTransformer(str(st_dir_2_layers), device="cpu").to(dtype)
    with torch.no_grad():
        got, want = ours(ours.tokenize(TEXTS[:3])), ref(ref.tokenize(TEXTS[:3]))
    assert got["sentence_embedding"].dtype == want["sentence_embedding"].dtype == got["token_embeddings"].dtype == dtype
    # the same steps in the same type as there (0 measured; 1.2e-4 fp16, 9.8e-4 bf16 when bertkit pooled and
    # normalised in float32 before the rounding); one step of the type allowed
    torch.testing.assert_close(got["sentence_embedding"].float(), want["sentence_embedding"].float(),
                               atol=5e-4 if dtype == torch.float16 else 4e-3, rtol=0)

@pytest.fixture(scope="module")
def words(minilm_2_layers):
    """Each library's models.Transformer on MiniLM's first 2 layers, cut at 128 tokens (TEXTS[3] is longer): what
    is compared is how the modules assemble, save and show, the same at any depth."""
    from bertkit.sentence import models as ours

    return (ours.Transformer(minilm_2_layers, max_seq_length=128),
            st_models.Transformer(str(minilm_2_layers), max_seq_length=128))


def test_a_model_assembled_from_modules_embeds_as_sentence_transformers(words, tmp_path):
    """The classic script, ``SentenceTransformer(modules=[models.Transformer(path), models.Pooling(dim, mode),
    models.Normalize()])``, was refused; now it gives sentence-transformers' vectors for each pooling (a list
    concatenated in its order, the older booleans read as sentence-transformers 6 reads them), and saves a directory
    sentence-transformers loads to those vectors."""
    from bertkit.sentence import models as ours

    texts = TEXTS[2:]  # a one-word text, a long one (cut at 128), accents and CJK
    for normalize, modes, legacy in [(False, ("cls",), {}), (True, ("max",), {}), (False, ("mean_sqrt_len_tokens",), {}),
                                     (True, (["max", "cls"],), {}),
                                     (False, (), {"pooling_mode_max_tokens": True, "pooling_mode_mean_tokens": True})]:
        built = [model(modules=[word, lib.Pooling(word.get_word_embedding_dimension(), *modes, **legacy),
                                *([lib.Normalize()] if normalize else [])])
                 for word, lib, model in zip(words, (ours, st_models), (SentenceTransformer, st.SentenceTransformer))]
        assert built[0].get_sentence_embedding_dimension() == built[1].get_sentence_embedding_dimension() == \
            built[0].pooling.get_sentence_embedding_dimension() == built[1][1].get_sentence_embedding_dimension()
        torch.testing.assert_close(built[0].encode(texts, convert_to_tensor=True), built[1].encode(
            texts, convert_to_tensor=True), atol=1e-5, rtol=0, msg=f"{modes} {legacy} {normalize}")
    saved = st.SentenceTransformer(str(built[0].save(tmp_path / "m")), device="cpu")
    assert saved.max_seq_length == 128
    torch.testing.assert_close(saved.encode(texts, convert_to_tensor=True), built[1].encode(texts, convert_to_tensor=True),
                               atol=1e-5, rtol=0)



def test_print_shows_every_module_with_its_settings_as_sentence_transformers(words):
    """``print(model)`` showed module 0 alone (``SentenceTransformer((0): Transformer({...}))``), as if the model had
    no pooling, Dense or Normalize; sentence-transformers lists each module with its settings. Now the same lines
    (several pooling modes a tuple, as there: ``model[1].pooling_mode`` was a list), but for the Transformer's, which
    shows the settings bertkit's save writes (sentence-transformers 5's line)."""
    from bertkit.sentence import models as ours

    built = [model(modules=[word, lib.Pooling(384, ["cls", "mean"]),
                            lib.Dense(768, 64), lib.Dense(64, 32, activation_function=torch.nn.Identity()),
                            lib.Normalize()])
             for word, lib, model in zip(words, (ours, st_models), (SentenceTransformer, st.SentenceTransformer))]
    got, want = (repr(m).splitlines() for m in built)
    assert got[0] == want[0] == "SentenceTransformer(" and got[-1] == want[-1] == ")" and len(got) == len(want) == 7
    assert got[1] == "  (0): Transformer({'max_seq_length': 128, 'do_lower_case': False, 'architecture': 'BertModel'})"
    assert got[2:-1] == want[2:-1] and got[3].startswith("  (2): Dense({'in_features': 768, 'out_features': 64, ")
    assert got[2] == "  (1): Pooling({'embedding_dimension': 384, 'pooling_mode': ('cls', 'mean'), 'include_prompt': True})"
    assert [repr(m) for m in built[0]] == [line.split(": ", 1)[1] for line in got[1:-1]]

def test_the_transformers_arguments_are_sentence_transformers(words, minilm_2_layers):
    """max_seq_length lives on the tokenizer, shared with the model assembled from it (``word.max_seq_length = 32``
    cuts its texts at 32, as there); tokenizer_args' model_max_length wins over max_seq_length; config_args sets the
    encoder's config. What would change a vector and bertkit does not apply is refused by name."""
    from bertkit.sentence import models as ours

    word = ours.Transformer(minilm_2_layers, max_seq_length=256, tokenizer_args={"model_max_length": 16},
                            config_args={"hidden_dropout_prob": 0.0}, model_args={"torch_dtype": torch.float32})
    model = SentenceTransformer(modules=[word, ours.Pooling(384, "cls")])
    assert (model.max_seq_length, word.auto_model.config.hidden_dropout_prob, word.get_word_embedding_dimension(),
            model.name_or_path) == (16, 0.0, 384, str(minilm_2_layers))
    assert ours.Transformer(minilm_2_layers).max_seq_length == 512  # the tokenizer's, within the positions
    word.max_seq_length = 32
    assert model.tokenize([TEXTS[3]])["input_ids"].shape == (1, 32)
    for bad, message in [({"transformer_task": "fill-mask"}, r"fill-mask'\): this is a SentenceTransformer's .*sparse_encoder.models.Transformer"),
                         ({"tokenizer_args": {"do_lower_case": False}}, r"sets \{'processor_kwargs.do_lower_case'"),
                         ({"model_args": {"device_map": "auto"}}, r"model_kwargs=...\) sets \['device_map'\]"),
                         ({"max_seq_length": 1000}, r"max_seq_length 1000 must be a whole number in \[2, 512\]"),
                         ({"backend": "onnx"}, r"backend=.* is not implemented in bertkit"),
                         ({"max_seq_lenght": 64}, r"unknown arguments \['max_seq_lenght'\]")]:
        with pytest.raises(BertkitError, match=message):
            ours.Transformer(minilm_2_layers, **bad)
    with pytest.raises(BertkitError, match=r"pooling \['CLS'\] is not implemented"):  # modes are lower-case there too
        ours.Pooling(384, pooling_mode="CLS")
    with pytest.raises(BertkitError, match=r"Pooling's embedding_dimension must be a whole number >= 1.*got None"):
        ours.Pooling(pooling_mode="cls")
    with pytest.raises(BertkitError, match=r"its Pooling says 768 dimensions but the encoder's hidden_size is 384"):
        SentenceTransformer(modules=[words[0], ours.Pooling(768)])


def test_modules_are_a_transformer_a_pooling_and_a_normalize_in_that_order(words, models):
    """Any other list, and every other module of sentence-transformers' models, is refused naming it; so is
    ``model.append(...)``, which sentence-transformers' Sequential has."""
    from sentence_transformers.sentence_transformer import modules as reference

    from bertkit.errors import NotImplementedInBertkit
    from bertkit.sentence import models as ours

    word, pool, norm = words[0], ours.Pooling(384), ours.Normalize()
    for modules, names in [([pool, word], "['Pooling', 'Transformer']"), ([word], "['Transformer']"),
                           ([word, norm, pool], "['Transformer', 'Normalize', 'Pooling']"),
                           ([word, pool, norm, norm], "['Transformer', 'Pooling', 'Normalize', 'Normalize']"),
                           ([words[1], st_models.Pooling(384)],
                            "['sentence_transformers.base.modules.transformer.Transformer', "
                            "'sentence_transformers.sentence_transformer.modules.pooling.Pooling']"),
                           ([word, pool, 3], "['Transformer', 'Pooling', 'builtins.int']")]:
        with pytest.raises(BertkitError, match=re.escape(f"SentenceTransformer(modules={names}): bertkit's ") +
                           "SentenceTransformer is bertkit.sentence.models' Transformer, Pooling, any Dense and an optional"):
            SentenceTransformer(modules=modules)
    assert SentenceTransformer(modules=(m for m in [word, pool])).pooling == pool  # any iterable, as there
    with pytest.raises(BertkitError, match=r"modules=...\) takes a list of modules, got Transformer"):
        SentenceTransformer(modules=word)
    with pytest.raises(BertkitError, match=r"models.Transformer takes the path of a local directory .*got NoneType"):
        ours.Transformer(None)
    with pytest.raises(BertkitError, match=r"takes a directory \(model_name_or_path, model_kwargs\) or modules"):
        SentenceTransformer(models[0].name_or_path, modules=[word, pool])
    for name in set(reference.__all__) - {"Transformer", "Pooling", "Dense", "Normalize"}:
        with pytest.raises(BertkitError, match=rf"^models.{name} is not implemented in bertkit: .*use sentence-transformers"):
            getattr(ours, name)
    with pytest.raises(NotImplementedInBertkit, match=r"SentenceTransformer.append is not implemented .* build another with "
                                                      r"SentenceTransformer\(modules=\[...\]\)"):
        models[0].append(None)


def test_tokenize_takes_a_list_of_texts_and_names_what_is_not_one(models):
    """A str was tokenized a character at a time (as sentence-transformers does: 11 one-letter rows for "hello
    world"), and a None or a number in the list raised Python's "can only concatenate str"; a {"text": ...} dict,
    which encode takes, was that TypeError too. Now a dict is its text and the others are refused by name."""
    ours, ref = models
    got, want = ours.tokenize([{"text": TEXTS[0]}, TEXTS[1]]), ref.tokenize([{"text": TEXTS[0]}, TEXTS[1]])
    assert torch.equal(got["input_ids"], want["input_ids"]) and got["input_ids"].shape[0] == 2
    with pytest.raises(BertkitError, match=r"^tokenize\(\) takes a list of texts, got str 'hello world'; pass \[text\]"):
        ours.tokenize("hello world")
    for bad, message in ((None, "is NoneType 'None'; tokenize takes strings"), (5, "is int '5'; tokenize takes"),
                         (("a", "b"), "is the text pair \\('a', 'b'\\)")):
        with pytest.raises(BertkitError, match=rf"^tokenize\(\) input 1 {message}"):
            ours.tokenize(["fine", bad])


def test_encode_from_two_threads_leaves_the_model_its_own_encoder(st_dir_2_layers, tmp_path):
    """Two threads encoding at once on one model (a web server's workers): the second starts while the first runs and
    ends after it. Each call ran on a copy of the encoder made for CPU inference, put in ``model.bert`` and put back at
    its end, so the second put back the first's copy: the model kept it for good, ``save`` failed ("BertModel has no
    float encoder.layer.0.attention.self.query.weight") and training would have trained other weights. Forced here in
    that order by a hook on the encoder; each call's vectors are the model's."""
    import threading

    model = SentenceTransformer(st_dir_2_layers)
    encoder, texts = model.bert, TEXTS * 2  # more texts than a batch: the copy for CPU inference
    want = model.encode(texts, batch_size=4)
    first_in, second_in, first_done = threading.Event(), threading.Event(), threading.Event()
    results: dict[str, np.ndarray] = {}

    def meet(module, args):
        name = threading.current_thread().name
        if name == "first" and not first_in.is_set():
            first_in.set()
            assert second_in.wait(30)  # the second call has its encoder before the first ends
        elif name == "second" and not second_in.is_set():
            second_in.set()
            assert first_done.wait(30)  # the second call ends after the first

    def first():
        results["first"] = model.encode(texts, batch_size=4)
        first_done.set()

    def second():
        assert first_in.wait(30)
        results["second"] = model.encode(texts, batch_size=4)

    hook = model.bert.register_forward_pre_hook(meet)  # the copy for CPU inference is made with it
    try:
        threads = [threading.Thread(target=f, name=f.__name__) for f in (first, second)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    finally:
        hook.remove()
    assert model.bert is encoder, "encode left its copy for CPU inference in model.bert"
    for name in ("first", "second"):
        np.testing.assert_allclose(results[name], want, atol=1e-6, rtol=0)
    model.save(tmp_path / "saved")  # the float checkpoint, as before any encode
    np.testing.assert_allclose(SentenceTransformer(tmp_path / "saved").encode(texts), want, atol=1e-6, rtol=0)
