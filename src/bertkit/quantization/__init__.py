"""int8 inference on x86 CPUs: the encoder's projections with int8 weights and int8 activations.

Why: most BERT inference runs on CPUs that have AVX2 (often AVX-512 VNNI) but no bf16 instructions, where bf16
is emulated and several times slower than fp32 (BENCHMARKS.md). An int8 GEMM there is 2-4x cheaper than fp32,
and the projections and feed-forward blocks are ~97% of the encoder's FLOPs at 128 tokens.

One path per CPU class, chosen once by ``bertkit._hardware.int8_kernel`` (measured, BENCHMARKS.md "int8
kernels"): AVX2 without VNNI runs fbgemm with 7-bit activations; AVX512-VNNI and AMX run oneDNN's quantized
Linear with 8-bit activations; on CPUs with bf16 instructions (AVX512-BF16, AMX) what stays float runs in bf16
under autocast, as OpenVINO's int8 does (``bertkit.inference.prepare.default_bf16``). What ``quantize_int8``
does, per encoder layer:

- ``qkv`` (query, key and value as one GEMM), ``attn_out`` and ``ffn_in`` become ``Int8Linear``: weights int8,
  symmetric, one scale per output channel; activations uint8 with one scale and zero point per call, computed
  from the input at run time ("dynamic"). ``ffn_out`` (its input, after GELU, is the hardest to quantize),
  embeddings, LayerNorms, attention itself (SDPA), the pooler and every task head stay float.
- smoothing (SmoothQuant, Xiao et al. 2023, section 4): BERT's activations have a few channels 10-20x larger
  than the rest (MiniLM: channel 99 entering ``ffn_in`` reaches 30, the median channel 1.7), and one
  per-tensor scale then leaves the ordinary channels a handful of levels. Each projection's input channel j is
  divided by s_j and the weight's column j multiplied by it, s_j = max|X_j|^alpha / max|W_j|^(1 - alpha), which
  is exact in real arithmetic and moves the outliers into the per-channel weight scales. max|X_j| comes from
  ``calibration`` batches (a few hundred sentences; blank texts are refused).

Measured on MiniLM: every one of 1,000 STS-B sentences' mean-pooled embeddings within cosine 0.99 of fp32's, and
every fine-tuned task metric within 0.5 points (RESULTS.md, "int8 accuracy"). The activation scale is per call,
over the whole input, so an output depends slightly on the other sequences in its batch. CPU only, fp32 models
only, inference only.

    model = BertForSequenceClassification.from_pretrained("sst2_run/best").eval()
    calibration = calibration_batches(tokenizer, texts[:256])  # a few hundred of your texts
    model = quantize_int8(model, calibration=calibration)  # a quantized copy; the fp32 model is unchanged

Pipelines and commands switch it on with ``pipeline(task, model, quantize="int8")`` and ``--int8``, calibrated on
``calibration_texts`` / ``--calibration-file`` when given, else on the 256 built-in English sentences of
``bertkit.calibration_text`` (``quantize_int8_on_texts``); ``bertkit quantize`` writes the result to a directory
(``save_int8`` / ``load_int8``) that loads in 0.1 s.

Modules: ``kernels`` (``Int8Linear``), ``projections`` (an encoder layer's projections: finding, naming and
swapping them), ``calibration`` (calibration batches, SmoothQuant's factors), ``quantize`` (``quantize_int8``,
``quantize_int8_on_texts``), ``saved`` (the int8 directory), ``device`` (what int8 runs on).
"""

from bertkit.quantization.calibration import calibration_batches, read_calibration_file
from bertkit.quantization.device import check_int8_support
from bertkit.quantization.kernels import Int8Linear
from bertkit.quantization.projections import PROJECTIONS, encoder_of, int8_projections, is_int8_model
from bertkit.quantization.quantize import (
    INT8_PROJECTIONS,
    QUANTIZE_MODES,
    quantize_int8,
    quantize_int8_on_texts,
)
from bertkit.quantization.saved import (
    QUANT_METHOD,
    is_int8_checkpoint,
    load_for_inference,
    load_int8,
    quantize_checkpoint,
    save_int8,
)

__all__ = ["quantize_int8", "quantize_int8_on_texts", "calibration_batches", "check_int8_support",
           "read_calibration_file", "int8_projections", "encoder_of", "Int8Linear", "PROJECTIONS",
           "INT8_PROJECTIONS", "QUANTIZE_MODES", "save_int8", "load_int8", "load_for_inference", "quantize_checkpoint",
           "is_int8_model", "is_int8_checkpoint", "QUANT_METHOD"]
