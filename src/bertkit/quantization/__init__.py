"""int8 inference on x86 CPUs: the encoder's Linear layers with int8 weights and int8 activations.

Why: most BERT inference runs on CPUs that have AVX2 (often AVX-512 VNNI) but no bf16 instructions, where
bf16 is emulated and several times slower than fp32 (BENCHMARKS.md). An int8 GEMM there is 2-4x cheaper
than fp32, and the projections and feed-forward blocks are ~97% of the encoder's FLOPs at 128 tokens. On CPUs
with bf16 instructions int8 runs beside bf16 for what stays float (below), faster than either alone.

What ``quantize_int8`` does, per encoder projection (dynamic quantization on oneDNN's quantized Linear where
8-bit activations are exact, AVX512-VNNI or AMX; else on ``torch.ao.nn.quantized.dynamic.Linear``'s fbgemm / x86
kernels while PyTorch has it, then oneDNN at 7 bits; ``torch._int_mm`` where oneDNN's operator is missing;
``kernels.default_backend``; the activations' quantization compiled into one pass):

- weights: int8, symmetric, one scale per output channel, quantized once;
- activations: uint8, one scale per call computed from the input tensor at run time ("dynamic"), 8 bits
  on CPUs with AVX512-VNNI and 7 elsewhere (``int8_activation_bits``: 8 bits would saturate AVX2's
  ``vpmaddubsw``, which is why PyTorch's own module always uses 7). The extra bit halves the rounding
  error (docs/inference.md, section int8);
- smoothing (SmoothQuant, Xiao et al. 2023, section 4): BERT's activations have a few channels 10-20x larger
  than the rest (MiniLM: channel 99 entering ``ffn_in`` reaches 30, the median channel 1.7), and one
  per-tensor 7-bit scale then leaves the ordinary channels a handful of levels. Each projection's input
  channel j is divided by s_j and the weight's column j multiplied by it, s_j = max|X_j|^alpha /
  max|W_j|^(1 - alpha), which is exact in real arithmetic and moves the outliers into the per-channel
  weight scales. max|X_j| comes from ``calibration`` batches (a few hundred sentences are plenty; the
  measured embeddings did not depend on their domain), after which nothing is data-dependent but the
  per-call activation scale. The division is one (N, H_in) multiply per projection, next to a GEMM of
  H_in x H_out per token.

Only the encoder layers' four projections are candidates, named as bertkit names them in ``keep_fp32`` and in
int8 directories: ``qkv`` (the modules ``attention.self.query``, ``key`` and ``value``, one int8 GEMM when
quantized), ``attn_out`` (``attention.output.dense``), ``ffn_in`` (``intermediate.dense``) and ``ffn_out``
(``output.dense``).
Embeddings, LayerNorms, attention itself (SDPA), the pooler and every task head stay fp32: they are a small
share of the time, and heads are where a classifier's decision is made. Projections named in ``keep_fp32``
stay fp32 too. The defaults are the cheapest sets measured to keep every one of 1,000 STS-B sentences' and
of SST-2 dev's mean-pooled embeddings within cosine 0.99 of fp32 on MiniLM (``bench/int8_sensitivity.py``;
the tables are in docs/inference.md, section int8): the input of ``ffn_out`` (after GELU) is the hardest,
so every layer's ``ffn_out`` stays fp32 by default (``DEFAULT_KEEP_FP32``). With AVX512-VNNI, ``ffn_out`` can
be int8 with one activation scale and zero point per token instead (``PerTokenInt8Linear``, oneDNN or ``torch._int_mm``):
``bertkit quantize --fast`` (``FAST_KEEP_FP32``, ``FAST_PER_TOKEN``) holds the embedding bars and runs 1.2-1.4x
the default, but moved a fine-tuned SQuAD model by +0.8 EM: an option, not the default.

Things to know:

- The activation scale is per call, over the whole input tensor, so an output depends slightly on the
  other sequences in its batch, and on the layout (the padded layout includes padding positions in the
  range); the unpadded layout, bertkit's default, computes the range on real tokens only.
- ``torch.ao.quantization`` and quantized tensors are deprecated as of PyTorch 2.10+ (its warnings point
  to torchao). torchao 0.18 installs beside torch 2.13 (``pip install -c constraints.txt
  torchao``); its int8 dynamic Linear (per-token activation scales, no calibration) is as accurate but,
  on CPU in eager mode, ran at about 0.6x the speed of these kernels here (docs/inference.md). With 8-bit
  activations (AVX512-VNNI or AMX) the projections run on oneDNN's quantized Linear
  (``torch.ops.onednn.qlinear_pointwise``, the kernel Inductor's x86 int8 path calls: weights prepacked, scales
  and bias applied in the kernel), 1.02-1.07x the deprecated fbgemm kernel's speed on an AVX512-VNNI EPYC and
  1.13-1.18x with AMX (BENCHMARKS.md, "int8 kernels"); with 7-bit ones on fbgemm while PyTorch has it, then on
  oneDNN at 7 bits. ``torch._int_mm`` runs the same saved integers where oneDNN's operator is missing.
- Under bf16 autocast (CPUs with AVX512-BF16 or AMX; what pipelines and commands run an int8 model under by
  default there, ``bertkit.inference.prepare.default_bf16``) what stays float (attention, GELU, LayerNorm, the
  projections kept fp32) runs in bf16, as OpenVINO's int8 does; the oneDNN kernel then writes bf16 directly. A
  model quantized here and called directly runs as any module does: in fp32 unless the caller enters autocast.
- CPU only, fp32 models only, inference only: the quantized Linear has no backward and no CUDA kernel.

    model = BertForSequenceClassification.from_pretrained("sst2_run/best").eval()
    calibration = calibration_batches(tokenizer, texts[:256])  # a few hundred of your texts
    model = quantize_int8(model, calibration=calibration)  # a quantized copy; the fp32 model is unchanged

Pipelines and commands switch it on with ``pipeline(task, model, quantize="int8")`` and ``--int8``; they
calibrate on ``calibration_texts`` / ``--calibration-file`` when given, else on the 256 built-in English
sentences of ``bertkit.calibration_text`` (``quantize_int8_on_texts``). Calibration is not left out by
default: plain dynamic int8 (``calibration=None``) left MiniLM's sentences at cosine 0.96 of fp32, while the
built-in sentences reach the same closeness as calibrating on the task's own text (docs/inference.md).

Modules: ``kernels`` (the int8 Linear modules, ``SmoothedInt8Linear`` and ``PerTokenInt8Linear``),
``projections`` (an encoder layer's projections: finding, naming and swapping them, ``resolve_keep_fp32``),
``calibration`` (calibration texts and batches, SmoothQuant's factors), ``quantize`` (``quantize_int8``,
``quantize_int8_on_texts`` and the default sets), ``saved`` (the int8 directory: ``save_int8``, ``load_int8``,
``quantize_checkpoint``, ``load_for_inference``), ``device`` (the quantized engine and the CPU's instructions). The public names (``__all__``) are imported from here: ``from bertkit.quantization import ...``.
"""

from bertkit.quantization.calibration import DEFAULT_ALPHA, calibration_batches, read_calibration_file
from bertkit.quantization.device import (
    X86_ENGINES,
    check_int8_support,
    int8_activation_bits,
    per_token_supported,
)
from bertkit.quantization.device import _packing as _packing  # not in __all__, imported by tests/test_int8.py
from bertkit.quantization.kernels import INT8_LAYERS as INT8_LAYERS  # likewise
from bertkit.quantization.kernels import PerTokenInt8Linear, SmoothedInt8Linear
from bertkit.quantization.projections import (
    PROJECTIONS,
    encoder_of,
    int8_projections,
    is_int8_model,
    per_token_projections,
    resolve_keep_fp32,
)
from bertkit.quantization.quantize import (
    DEFAULT_KEEP_FP32,
    FAST_KEEP_FP32,
    FAST_PER_TOKEN,
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
           "read_calibration_file", "resolve_keep_fp32", "int8_projections", "encoder_of",
           "SmoothedInt8Linear", "PROJECTIONS", "DEFAULT_KEEP_FP32", "DEFAULT_ALPHA", "X86_ENGINES", "QUANTIZE_MODES",
           "int8_activation_bits", "FAST_KEEP_FP32", "PerTokenInt8Linear", "FAST_PER_TOKEN", "per_token_supported",
           "per_token_projections", "save_int8", "load_int8", "load_for_inference", "quantize_checkpoint",
           "is_int8_model", "is_int8_checkpoint", "QUANT_METHOD"]
