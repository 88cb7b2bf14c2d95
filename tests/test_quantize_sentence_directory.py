"""``quantize_checkpoint`` (``bertkit quantize`` from Python) on a sentence-transformers directory: the int8 directory
it writes embeds as ``pipeline(..., quantize="int8")`` on the float directory does, the calibration texts cut where
the directory's model cuts its texts (its max_seq_length), as the command cuts them."""

from __future__ import annotations

import numpy as np
import pytest

import bertkit._hardware
from sentence_helpers import st_directory  # tests/ is on sys.path under pytest

pytestmark = pytest.mark.skipif(bertkit._hardware.int8_kernel() is None,
                                reason="this PyTorch has no int8 kernel for this CPU")

TEXTS = ["A man is playing a guitar.", "The quick brown fox jumps over the lazy dog near the riverbank today again",
         "Café déjà vu"]


def test_quantize_checkpoint_calibrates_at_the_directorys_max_seq_length(minilm_2_layers, tmp_path):
    # Was: calibrated on the built-in sentences cut at 128 tokens where the directory's model sees 8: its int8
    # directory's vectors were 0.045 from the int8 pipeline's on the float directory (unit vectors), unsaid
    from bertkit import pipeline
    from bertkit.quantization import quantize_checkpoint

    d = st_directory(minilm_2_layers, tmp_path / "st", max_seq_length=8)
    report = quantize_checkpoint(d, tmp_path / "int8")
    want = np.asarray(pipeline("sentence-embedding", d, quantize="int8", progress=False)(TEXTS))
    got = np.asarray(pipeline("sentence-embedding", tmp_path / "int8", progress=False)(TEXTS))
    np.testing.assert_array_equal(got, want)
    assert report["max_seq_length"] == 8
