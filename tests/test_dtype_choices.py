"""Where a user picks a dtype, beside the reference at the same precision: quantize_embeddings' calibration
embeddings and ranges given as half-precision tensors (what encode(convert_to_tensor=True) returns for such a
model)."""

from __future__ import annotations

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

