"""int8 inference on x86 CPUs: the encoder's projections with int8 weights and int8 activations.

Where the CPU has no bf16 instructions an int8 GEMM is 2-4x cheaper than fp32, and the projections are ~97% of the
encoder's FLOPs. ``quantize_int8`` makes each layer's ``qkv``, ``attn_out`` and ``ffn_in`` an ``Int8Linear``
(weights per output channel; activations one scale per call, after SmoothQuant's smoothing measured on calibration
text); everything else stays float. Accuracy, kernels and figures: docs/inference.md, section int8.

    model = quantize_int8(model, calibration=calibration_batches(tokenizer, texts[:256]))  # a quantized copy

Modules: ``kernels`` (``Int8Linear``), ``projections`` (a layer's projections), ``calibration`` (batches,
SmoothQuant's factors), ``quantize``, ``saved`` (the ``bertkit quantize`` directory).
"""

from bertkit.quantization.calibration import calibration_batches, read_calibration_file
from bertkit.quantization.kernels import Int8Linear
from bertkit.quantization.projections import PROJECTIONS, encoder_of, int8_projections, is_int8_model
from bertkit.quantization.quantize import check_int8_support, quantize_int8, quantize_int8_on_texts
from bertkit.quantization.saved import (
    QUANT_METHOD,
    is_int8_checkpoint,
    load_for_inference,
    load_int8,
    quantize_checkpoint,
    require_head,
    save_int8,
)

__all__ = ["quantize_int8", "quantize_int8_on_texts", "calibration_batches", "check_int8_support",
           "read_calibration_file", "int8_projections", "encoder_of", "Int8Linear", "PROJECTIONS",
           "save_int8", "load_int8", "load_for_inference", "quantize_checkpoint",
           "is_int8_model", "is_int8_checkpoint", "require_head",
           "QUANT_METHOD"]
