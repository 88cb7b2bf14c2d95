"""Where a user picks a dtype, beside the reference at the same precision: quantize_embeddings' calibration
embeddings and ranges given as half-precision tensors (what encode(convert_to_tensor=True) returns for such a
model), and the config.json an int8 directory quantized from a bf16 checkpoint writes."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from bertkit.sentence import quantize_embeddings

st_util = pytest.importorskip("sentence_transformers.util")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("precision", ["int8", "uint8"])
def test_half_tensors_calibrate_as_their_float32_values(dtype, precision):
    rng = np.random.default_rng(0)
    embeddings = rng.standard_normal((6, 16)).astype(np.float32)
    calibration = torch.from_numpy(rng.standard_normal((40, 16)).astype(np.float32) * 2).to(dtype)
    as_array = calibration.float().numpy()  # the values the tensor holds, as sentence-transformers would read them
    ranges = np.vstack((as_array.min(0), as_array.max(0)))
    expected = st_util.quantize_embeddings(embeddings, precision, ranges=ranges)
    # a bfloat16 tensor stopped numpy's conversion: "Got unsupported ScalarType BFloat16"
    np.testing.assert_array_equal(quantize_embeddings(embeddings, precision, calibration_embeddings=calibration), expected)
    np.testing.assert_array_equal(quantize_embeddings(embeddings, precision, ranges=torch.from_numpy(ranges).to(dtype)),
                                  st_util.quantize_embeddings(embeddings, precision,
                                                              ranges=torch.from_numpy(ranges).to(dtype).float().numpy()))
    np.testing.assert_array_equal(quantize_embeddings(embeddings, precision, calibration_embeddings=list(calibration)),
                                  expected)


def test_an_int8_directory_from_a_bf16_checkpoint_names_its_float32_tensors(minilm_2_layers, tmp_path):
    from safetensors import safe_open

    from bertkit import BertModel
    from bertkit.quantization import load_int8, quantize_checkpoint

    bf16 = tmp_path / "bf16"
    BertModel.from_pretrained(minilm_2_layers, dtype="bfloat16").save_pretrained(bf16)
    for name in ("vocab.txt", "tokenizer_config.json", "special_tokens_map.json"):
        if (minilm_2_layers / name).is_file():
            (bf16 / name).write_bytes((minilm_2_layers / name).read_bytes())
    assert json.loads((bf16 / "config.json").read_text())["dtype"] == "bfloat16"
    quantize_checkpoint(bf16, tmp_path / "int8")
    config = json.loads((tmp_path / "int8" / "config.json").read_text())
    with safe_open(str(tmp_path / "int8" / "model.int8.safetensors"), "pt") as f:
        floats = {str(f.get_slice(k).get_dtype()) for k in f.keys()} - {"I8", "I64", "I32"}
    assert floats == {"F32"}
    # it said "bfloat16", the source checkpoint's, over float32 embeddings and norms
    assert config["dtype"] == "float32" and "torch_dtype" not in config
    assert load_int8(tmp_path / "int8").embeddings.word_embeddings.weight.dtype == torch.float32


@pytest.mark.parametrize("num_labels", [1, 3])
def test_a_float64_cross_encoder_scores_in_float64_and_a_half_one_in_float32(minilm_2_layers, tmp_path, num_labels):
    st = pytest.importorskip("sentence_transformers")
    transformers = pytest.importorskip("transformers")
    from bertkit.sentence import CrossEncoder

    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    transformers.AutoModelForSequenceClassification.from_pretrained(str(minilm_2_layers), num_labels=num_labels) \
        .save_pretrained(tmp_path / "ce")
    for name in ("vocab.txt", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.json"):
        if (minilm_2_layers / name).is_file():
            (tmp_path / "ce" / name).write_bytes((minilm_2_layers / name).read_bytes())
    pairs = [("A man is eating food.", "A man is eating a meal."), ("The cat sleeps.", "Stocks fell sharply today.")]
    for cast, dtype in (("double", torch.float64), ("half", torch.float32)):
        ref = getattr(st.CrossEncoder(str(tmp_path / "ce"), device="cpu"), cast)()
        ours = getattr(CrossEncoder(str(tmp_path / "ce")), cast)()
        for kwargs in ({"convert_to_tensor": True}, {"convert_to_numpy": False}, {"convert_to_tensor": True,
                                                                                 "apply_softmax": True}):
            expected, got = ref.predict(pairs, **kwargs), ours.predict(pairs, **kwargs)
            expected, got = (torch.stack(x) if isinstance(x, list) else x for x in (expected, got))
            # a float64 model's scores came back float32, 1e-8 from sentence-transformers' float64 ones
            assert got.dtype == expected.dtype == dtype, (cast, kwargs)
            torch.testing.assert_close(got, expected, rtol=1e-12 if cast == "double" else 0, atol=1e-12 if
                                       cast == "double" else 0)
        assert ours.predict(pairs).dtype == ref.predict(pairs).dtype == np.float32  # numpy: float32 always, as there



@pytest.mark.parametrize("stored", [torch.bfloat16, torch.float16])
def test_auto_takes_the_dtype_transformers_takes_from_a_checkpoint_of_mixed_types(minilm_2_layers, tmp_path, stored):
    transformers = pytest.importorskip("transformers")
    from safetensors.torch import load_file, save_file

    import bertkit

    # a classifier stored in half precision but for its head, kept in float32, and a config.json naming no dtype
    # (written by hand, or before transformers wrote one): "auto" takes the first floating-point tensor by name
    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    transformers.AutoModelForSequenceClassification.from_pretrained(str(minilm_2_layers), num_labels=2) \
        .save_pretrained(tmp_path / "mixed")
    weights = load_file(tmp_path / "mixed" / "model.safetensors")
    weights = {k: v if k.startswith("classifier.") or not v.is_floating_point() else v.to(stored)
               for k, v in weights.items()}
    save_file(weights, tmp_path / "mixed" / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((tmp_path / "mixed" / "config.json").read_text())
    config.pop("dtype", None), config.pop("torch_dtype", None)
    (tmp_path / "mixed" / "config.json").write_text(json.dumps(config))
    ref = transformers.AutoModelForSequenceClassification.from_pretrained(str(tmp_path / "mixed"), dtype="auto")
    ours = bertkit.AutoModelForSequenceClassification.from_pretrained(tmp_path / "mixed", dtype="auto")
    # bertkit's was float32: safetensors' load_file lists a file's tensors by type, the float32 classifier first
    assert ours.dtype == ref.dtype == stored
