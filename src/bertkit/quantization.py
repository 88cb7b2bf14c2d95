"""int8 inference on CPUs without bf16: the encoder's Linear layers with int8 weights and int8 activations.

Why: most BERT inference runs on CPUs that have AVX2 (often AVX-512 VNNI) but no bf16 instructions, where
bf16 is emulated and several times slower than fp32 (BENCHMARKS.md). An int8 GEMM there is 2-4x cheaper
than fp32, and the projections and feed-forward blocks are ~97% of the encoder's FLOPs at 128 tokens.

What ``quantize_int8`` does, per encoder projection (the framework's dynamic quantization,
``torch.ao.nn.quantized.dynamic.Linear``, on fbgemm / x86 kernels):

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
be int8 with one activation scale and zero point per token instead (``PerTokenInt8Linear``, ``torch._int_mm``):
``bertkit quantize --fast`` (``FAST_KEEP_FP32``, ``FAST_PER_TOKEN``) holds the embedding bars and runs 1.2-1.4x
the default, but moved a fine-tuned SQuAD model by +0.8 EM: an option, not the default.

Things to know:

- The activation scale is per call, over the whole input tensor, so an output depends slightly on the
  other sequences in its batch, and on the layout (the padded layout includes padding positions in the
  range); the unpadded layout, bertkit's default, computes the range on real tokens only.
- ``torch.ao.quantization`` and quantized tensors are deprecated as of PyTorch 2.10+ (its warnings point
  to torchao). torchao 0.18 installs beside torch 2.13 (``pip install -c constraints.txt
  torchao``); its int8 dynamic Linear (per-token activation scales, no calibration) is as accurate but,
  on CPU in eager mode, ran at about 0.6x the speed of these kernels here (docs/inference.md), so the
  framework's fbgemm kernels are used while they exist; this module is the one place to change when they go.
- CPU only, fp32 models only, inference only: the quantized Linear has no backward and no CUDA kernel.

    model = BertForSequenceClassification.from_pretrained("sst2_run/best").eval()
    calibration = calibration_batches(tokenizer, texts[:256])  # a few hundred of your texts
    model = quantize_int8(model, calibration=calibration)  # a quantized copy; the fp32 model is unchanged

Pipelines and commands switch it on with ``pipeline(task, model, quantize="int8")`` and ``--int8``; they
calibrate on ``calibration_texts`` / ``--calibration-file`` when given, else on the 256 built-in English
sentences of ``bertkit.calibration_text`` (``quantize_int8_on_texts``). Calibration is not left out by
default: plain dynamic int8 (``calibration=None``) left MiniLM's sentences at cosine 0.96 of fp32, while the
built-in sentences reach the same closeness as calibrating on the task's own text (docs/inference.md).
"""

from __future__ import annotations

import copy
import json
import logging
import re
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import Tensor, nn

from bertkit import heads
from bertkit.calibration_text import CALIBRATION_SENTENCES
from bertkit.checkpoint_io import CONFIG_NAME, INT8_WEIGHTS_NAME, encoder_published_names, read_config_json
from bertkit.config import BertConfig
from bertkit.errors import BertkitError, MissingFileError
from bertkit.modeling import BertModel
from bertkit.outputs import atomic_target, atomic_write_text
from bertkit.tokenization import BertTokenizer

# The encoder layer's projections that can be int8, in forward order.
PROJECTIONS = ("qkv", "attn_out", "ffn_in", "ffn_out")
# Kept fp32 by default: at 7 bits the cheapest set measured to keep min cosine >= 0.99 on 1,000 STS-B sentences
# and on SST-2 dev (MiniLM), and at both widths one that kept every fine-tuned task metric measured within 0.5
# points of fp32 (docs/inference.md, section int8; RESULTS.md).
DEFAULT_KEEP_FP32: tuple[str, ...] = ("ffn_out",)
# ``bertkit quantize --fast`` (AVX512-VNNI): nothing fp32, every ffn_out int8 with one activation scale and
# zero point per token (``PerTokenInt8Linear``), since ffn_out's input (after GELU) is where one scale per call
# loses too much. The embedding bars hold; on the fine-tuned tasks SQuAD moved by +0.8 EM / +0.5 F1 (the
# others within 0.5), which is why it is an option and not the default (RESULTS.md, int8 section).
FAST_KEEP_FP32: tuple[str, ...] = ()
FAST_PER_TOKEN: tuple[str, ...] = ("ffn_out",)
ACTIVATION_BITS = (7, 8)
# SmoothQuant's migration strength: 0.5, 0.7 and 0.85 measured; 0.7 gave the highest minimum cosine.
DEFAULT_ALPHA = 0.7
# Quantized engines with per-channel int8 dynamic Linear kernels for x86 (fbgemm, and "x86" which wraps it).
X86_ENGINES = ("x86", "fbgemm")
# What pipelines' ``quantize=`` takes (``None``: the model as loaded).
QUANTIZE_MODES = ("int8",)
# config.json's ``quantization_config.quant_method`` of a saved int8 model, and the layout's version.
QUANT_METHOD = "bertkit-int8"
INT8_FORMAT_VERSION = 2  # 2: per-token projections (weight and weight_scale only); 1 had none and still loads
INT8_FORMAT_VERSIONS = (1, 2)

_INDEX = re.compile(r"^-?\d+$")
logger = logging.getLogger("bertkit")


# ---------------------------------------------------------------------------------------------------
# The projections in an encoder layer. int8 directories and ``keep_fp32`` name them as bertkit always has
# (``layers.3.qkv``); the modules carry transformers' names (the key table in ``checkpoint_io`` maps one to
# the other). "qkv" is the three modules query, key and value: quantized, they become one int8 module,
# ``attention.self.qkv`` (one GEMM), and query/key/value are None.
# ---------------------------------------------------------------------------------------------------


def _layers(encoder: BertModel) -> nn.ModuleList:
    return encoder.encoder.layer


def _path(kind: str) -> str:
    """The module path inside a layer of a single-module projection (``ffn_in`` -> ``intermediate.dense``)."""
    (published,) = encoder_published_names(f"layers.0.{kind}.weight")  # encoder.layer.0.<path>.weight
    return published[len("encoder.layer.0."):-len(".weight")]


def get_projection(layer: nn.Module, kind: str) -> nn.Module | None:
    """The module computing projection ``kind`` of an encoder layer; for ``qkv`` the int8 module, or None
    while query, key and value are separate modules (``qkv_linears``)."""
    if kind == "qkv":
        return layer.attention.self.qkv
    return layer.get_submodule(_path(kind))


def qkv_linears(layer: nn.Module) -> tuple[nn.Module, nn.Module, nn.Module]:
    attn = layer.attention.self
    return attn.query, attn.key, attn.value


def float_projection(layer: nn.Module, kind: str) -> nn.Module:
    """Projection ``kind`` as one module; for float q/k/v a new ``nn.Linear(H, 3H)`` holding their weights
    concatenated (the layer's own modules when any is not a plain ``nn.Linear``: the caller refuses it)."""
    module = get_projection(layer, kind)
    if module is not None:
        return module
    linears = qkv_linears(layer)
    odd = next((m for m in linears if type(m) is not nn.Linear), None)
    if odd is not None:
        return odd
    fused = torch.nn.utils.skip_init(nn.Linear, linears[0].in_features, 3 * linears[0].out_features,
                                     bias=linears[0].bias is not None)
    with torch.no_grad():
        fused.weight.copy_(torch.cat([m.weight for m in linears]))
        if fused.bias is not None:
            fused.bias.copy_(torch.cat([m.bias for m in linears]))
    return fused


def set_projection(layer: nn.Module, kind: str, module: nn.Module) -> None:
    """Put ``module`` in place of projection ``kind``. For ``qkv`` a float ``nn.Linear(H, 3H)`` is split back
    into query, key and value; anything else (an int8 module) replaces the three."""
    if kind != "qkv":
        parent, _, name = _path(kind).rpartition(".")
        setattr(layer.get_submodule(parent), name, module)
        return
    attn = layer.attention.self
    if type(module) is nn.Linear:
        H = module.in_features
        for i, name in enumerate(("query", "key", "value")):
            linear = torch.nn.utils.skip_init(nn.Linear, H, module.out_features // 3, bias=module.bias is not None)
            rows = slice(i * linear.out_features, (i + 1) * linear.out_features)
            with torch.no_grad():
                linear.weight.copy_(module.weight[rows])
                if linear.bias is not None:
                    linear.bias.copy_(module.bias[rows])
            setattr(attn, name, linear)
        attn.qkv = None
        attn.pack_projections()
    else:
        attn.qkv = module
        attn.query = attn.key = attn.value = None


def encoder_of(model: nn.Module) -> BertModel:
    """The ``BertModel`` inside ``model``: the model itself, or a head model's ``.bert``."""
    if isinstance(model, BertModel):
        return model
    enc = getattr(model, "bert", None)
    if isinstance(enc, BertModel):
        return enc
    raise BertkitError(f"quantize_int8 takes a bertkit BertModel or head model (one with .bert), got "
                       f"{type(model).__name__}")


def resolve_keep_fp32(keep_fp32: Iterable[str], num_layers: int, argument: str = "keep_fp32") -> set[tuple[int, str]]:
    """``keep_fp32`` (or ``per_token``: ``argument`` names it in errors) entries -> the (layer index,
    projection) pairs they name.

    An entry is a projection in every layer (``"ffn_out"``), a whole layer (``"layers.0"``, ``"layers.-1"``
    for the last), or one projection of one layer (``"layers.5.ffn_out"``).
    """
    if isinstance(keep_fp32, str):
        raise BertkitError(f"{argument} must be a list of names, got the string {keep_fp32!r}; "
                           f"write {argument}=[{keep_fp32!r}]")
    kept: set[tuple[int, str]] = set()
    for entry in keep_fp32:
        parts = entry.split(".") if isinstance(entry, str) else []
        index, kinds = None, list(PROJECTIONS)
        if len(parts) == 1 and parts[0] in PROJECTIONS:
            kinds = parts
        elif len(parts) in (2, 3) and parts[0] == "layers" and _INDEX.match(parts[1]) and (
                len(parts) == 2 or parts[2] in PROJECTIONS):
            index, kinds = int(parts[1]), parts[2:] or kinds
        else:
            raise BertkitError(f"{argument} entry {entry!r} is not a projection ({', '.join(PROJECTIONS)}), "
                               f"a layer ('layers.0', 'layers.-1') or one projection of one layer "
                               f"('layers.5.ffn_out')")
        if index is not None and not -num_layers <= index < num_layers:
            raise BertkitError(f"{argument} entry {entry!r}: this encoder has {num_layers} layers "
                               f"(indices 0..{num_layers - 1}, or -1..-{num_layers} from the end)")
        layers = range(num_layers) if index is None else [index % num_layers]
        kept |= {(i, k) for i in layers for k in kinds}
    return kept


def _check_engine() -> None:
    engines = list(torch.backends.quantized.supported_engines)
    if not any(e in engines for e in X86_ENGINES):
        raise BertkitError(f"int8 needs PyTorch's fbgemm or x86 quantized engine (x86 CPUs with AVX2), but this "
                           f"PyTorch build supports only {engines}; run the fp32 model here (without int8)")


def int8_activation_bits() -> int:
    """The activation width that is exact on this CPU: 8 with AVX512-VNNI, else 7.

    fbgemm multiplies uint8 activations by int8 weights. With AVX512-VNNI (``vpdpbusd``) the products are
    summed straight into int32, so full 8-bit activations are exact; without it (AVX2's ``vpmaddubsw``) two
    products are summed into int16 first, which 8-bit activations can overflow (2 x 255 x 127 > 32767), so
    PyTorch's default is 7 bits (``reduce_range``). The extra bit halves the activation rounding error, which
    lets the feed-forward output projections be int8 too (docs/inference.md, section int8)."""
    try:
        return 8 if torch.cpu.get_capabilities().get("avx512_vnni", False) else 7
    except (AttributeError, RuntimeError):  # an older PyTorch without the query: the safe width
        return 7


def check_int8_support(model: nn.Module) -> None:
    """Refuse, naming what is wrong and the fix, a model or machine that cannot run int8 dynamic Linear."""
    _check_engine()
    params = list(model.parameters())
    devices = sorted({p.device.type for p in params})
    if devices != ["cpu"]:
        raise BertkitError(f"int8 runs on the CPU only, the model is on {', '.join(devices)}; quantize the model "
                           "on the CPU (model.to('cpu')) and run it there")
    dtypes = sorted({str(p.dtype).removeprefix("torch.") for p in params if p.is_floating_point()})
    if dtypes != ["float32"]:
        raise BertkitError(f"int8 quantization starts from float32 weights, the model holds {', '.join(dtypes)}; "
                           "load it in float32 (model.float())")


@contextmanager
def _packing() -> Iterator[None]:
    """While int8 weights are packed: this machine's x86 quantized engine set (the kernels are chosen at
    packing), and torch.ao's deprecation warnings silenced (known, and stated in this module's docstring;
    users should not see them on every call)."""
    before = torch.backends.quantized.engine
    torch.backends.quantized.engine = next(e for e in X86_ENGINES if e in torch.backends.quantized.supported_engines)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r".*torch\.ao\.quantization is deprecated",
                                    category=DeprecationWarning)
            warnings.filterwarnings("ignore", message=r".*quantized tensor creation functions.*deprecated",
                                    category=UserWarning)
            yield
    finally:
        torch.backends.quantized.engine = before


def _check_scales(**scales: Tensor) -> None:
    """Refuse saved scales that are not finite and positive: a zero, negative, infinite or NaN scale (a
    damaged or hand-edited file) would otherwise load and make every output of its projection 0, NaN or
    sign-flipped without a word."""
    for name, value in scales.items():
        bad = ~(torch.isfinite(value) & (value > 0))
        if bool(bad.any()):
            first = int(bad.nonzero()[0, 0])
            raise BertkitError(f"an int8 projection's {name} must be finite and > 0; entry {first} of "
                               f"{value.numel()} is {float(value.reshape(-1)[first])!r} ({int(bad.sum())} such): the "
                               "file is damaged; write the directory again with `bertkit quantize`")


class SmoothedInt8Linear(nn.Module):
    """``linear`` as int8: y = Q(x / s) @ Q(W * s)^T + b, with W * s quantized per output channel and x / s
    quantized per call (``torch.ao``'s dynamic Linear, fbgemm). ``s`` (in_features,) > 0 moves activation
    outliers into the weights (SmoothQuant); s = 1 is plain dynamic quantization."""

    def __init__(self, linear: nn.Linear, scale: Tensor, activation_bits: int = 7):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.activation_bits = activation_bits
        self.register_buffer("inv_scale", (1.0 / scale).to(torch.float32))  # (in_features,)
        scaled = nn.Linear(linear.in_features, linear.out_features, bias=linear.bias is not None)
        with torch.no_grad():
            scaled.weight.copy_(linear.weight * scale[None, :])  # (out, in): column j times s_j
            if linear.bias is not None:
                scaled.bias.copy_(linear.bias)
        scaled.qconfig = torch.ao.quantization.per_channel_dynamic_qconfig
        self.int8 = torch.ao.nn.quantized.dynamic.Linear.from_float(scaled)
        self.training = False

    @classmethod
    def from_saved(cls, weight: Tensor, weight_scale: Tensor, inv_scale: Tensor, bias: Tensor | None,
                   activation_bits: int = 7) -> SmoothedInt8Linear:
        """The layer ``saved_tensors`` wrote: int8 ``weight`` (out, in), its per-output-channel
        ``weight_scale`` (out,), the fp32 ``bias`` and the smoothing ``inv_scale`` (in,). The weights are
        packed here, for this machine's engine, so a file saved on one x86 CPU runs on any other."""
        out_features, in_features = weight.shape
        if weight.dtype != torch.int8 or weight_scale.shape != (out_features,) or inv_scale.shape != (in_features,):
            raise BertkitError(f"an int8 projection needs an int8 weight (out, in) with scales (out,) and (in,); got "
                               f"{weight.dtype} {tuple(weight.shape)}, scales {tuple(weight_scale.shape)} and "
                               f"{tuple(inv_scale.shape)}: the file is not one `bertkit quantize` wrote, or damaged")
        _check_scales(weight_scale=weight_scale, inv_scale=inv_scale)
        self = cls.__new__(cls)
        nn.Module.__init__(self)
        self.in_features, self.out_features = in_features, out_features
        self.activation_bits = activation_bits
        self.register_buffer("inv_scale", inv_scale.to(torch.float32).clone())
        scales = weight_scale.to(torch.float64)
        # Re-quantizing int8 * scale with the same scale returns the same integers (|error| << 0.5 step).
        qweight = torch.quantize_per_channel(weight.to(torch.float32) * scales[:, None].float(), scales,
                                             torch.zeros(out_features, dtype=torch.int64), 0, torch.qint8)
        self.int8 = torch.ao.nn.quantized.dynamic.Linear(in_features, out_features, dtype=torch.qint8)
        self.int8.set_weight_bias(qweight, None if bias is None else bias.to(torch.float32).clone())
        self.training = False
        return self

    def saved_tensors(self) -> dict[str, Tensor]:
        """What ``from_saved`` rebuilds this layer from (the bias aside): the integers and scales, not an
        engine's packing."""
        qweight = self.int8.weight()
        # torch.ao stores per-channel symmetric weights as per_channel_affine with zero points 0
        if qweight.qscheme() not in (torch.per_channel_affine, torch.per_channel_symmetric) or bool(
                qweight.q_per_channel_zero_points().any()):
            raise BertkitError(f"an int8 projection with {qweight.qscheme()} weights (non-zero zero points) cannot "
                               "be saved: save_int8 writes the per-channel symmetric weights quantize_int8 makes")
        return {"weight": qweight.int_repr().contiguous(), "weight_scale": qweight.q_per_channel_scales().float(),
                "inv_scale": self.inv_scale.detach().clone()}

    def float_bias(self) -> Tensor | None:
        return self.int8.bias()

    def forward(self, x: Tensor) -> Tensor:
        # torch.ao's dynamic Linear always quantizes activations to 7 bits (reduce_range=True); its kernel is
        # called here with the width chosen for this CPU (int8_activation_bits).
        y = torch.ops.quantized.linear_dynamic(x * self.inv_scale, self.int8._packed_params._packed_params,
                                               self.activation_bits == 7)
        # PyTorch's int8 Linear has no backward: without this, gradients through it would be silently wrong
        # (PyTorch only warns), so a backward pass through an int8 projection is refused instead.
        return _NoBackward.apply(y) if torch.is_grad_enabled() and y.requires_grad else y

    def train(self, mode: bool = True) -> SmoothedInt8Linear:
        if mode:
            raise BertkitError(_NOT_FOR_TRAINING)
        return super().train(False)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, int8 weights per output channel, "
                f"{self.activation_bits}-bit activations")

    def dequantized(self) -> nn.Linear:
        """This layer as a float ``nn.Linear``: the int8 weights times their scales, with the smoothing folded
        back into the columns; for CPUs that cannot run it at its activation width (``load_int8``)."""
        qweight = self.int8.weight()
        linear = nn.Linear(self.in_features, self.out_features, bias=self.int8.bias() is not None)
        with torch.no_grad():
            linear.weight.copy_(qweight.dequantize() * self.inv_scale[None, :])
            if linear.bias is not None:
                linear.bias.copy_(self.int8.bias())
        return linear.eval()


_NOT_FOR_TRAINING = ("an int8 model is for inference only (PyTorch's int8 Linear has no backward): train or "
                     "fine-tune the fp32 checkpoint, then quantize it (quantize='int8', --int8) to predict")


class _NoBackward(torch.autograd.Function):
    """Identity forward; the backward pass refuses, naming why (see ``SmoothedInt8Linear.forward``)."""

    @staticmethod
    def forward(ctx, y: Tensor) -> Tensor:
        return y.view_as(y)

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        raise BertkitError(_NOT_FOR_TRAINING)


def per_token_supported() -> bool:
    """Whether ``PerTokenInt8Linear`` runs exactly here: ``torch._int_mm`` (int8 x int8 -> int32, oneDNN) on a
    CPU with AVX512-VNNI, whose instructions sum the products straight into int32 (AVX2's pairwise int16 sums
    can saturate, as ``int8_activation_bits`` explains), and a PyTorch that has the CPU kernel."""
    if int8_activation_bits() != 8 or not hasattr(torch, "_int_mm"):
        return False
    try:
        # Runs of equal large values are what saturate a pairwise int16 sum (127*127 + 127*127 > 32767), and
        # oneDNN may pick its non-VNNI kernel where the CPU flags say VNNI (ONEDNN_MAX_CPU_ISA), so the probe
        # multiplies such runs, of both signs, and compares with int32 arithmetic.
        a = torch.tensor([[127] * 32 + [-128] * 16 + [-127, 127, 5, -3] * 4] * 17, dtype=torch.int8)
        b = torch.tensor([[127] * 32 + [-128] * 16 + [-3, 5, 127, -127] * 4] * 16, dtype=torch.int8)
        return bool(torch.equal(torch._int_mm(a, b.t().contiguous()), a.int() @ b.t().int()))
    except RuntimeError:  # an older PyTorch without the CPU kernel
        return False


class PerTokenInt8Linear(nn.Module):
    """``linear`` as int8 with one activation scale and zero point per token (row):

        y = step_t * (q_t @ Wq^T) * w_scale + zero_t * rowsum(W) + b,   q_t = round((x_t - zero_t) / step_t)

    where zero_t is the middle of row t's range and step_t its width / 254, so every row uses all of int8's
    levels whatever its range, and the weights are int8 with one scale per output channel. The GEMM is
    ``torch._int_mm`` (int8 x int8 -> int32, exact; ``per_token_supported``). What it is for: ``ffn_out``'s
    input (after GELU) spans 0.01 to 30 between tokens, which one scale per call (``SmoothedInt8Linear``)
    cannot hold; per token it can (docs/inference.md, section int8). No smoothing: measured on MiniLM, it
    did not help once the scale is per token."""

    activation_bits = 8

    def __init__(self, weight: Tensor, weight_scale: Tensor, bias: Tensor | None):
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.register_buffer("weight_t", weight.t().contiguous())  # (in, out) int8, _int_mm's layout
        self.register_buffer("weight_scale", weight_scale.to(torch.float32).clone())  # (out,)
        # sum_j W[o, j], from the int8 weights: what the zero points add back
        self.register_buffer("weight_rowsum", weight.to(torch.float32).sum(1) * self.weight_scale)
        self.register_buffer("bias", None if bias is None else bias.detach().to(torch.float32).clone())
        self.training = False

    @classmethod
    def from_float(cls, linear: nn.Linear) -> PerTokenInt8Linear:
        w = linear.weight.detach().to(torch.float32)
        scale = (w.abs().amax(1) / 127).clamp(min=torch.finfo(torch.float32).tiny)
        q = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)
        return cls(q, scale, linear.bias)

    @classmethod
    def from_saved(cls, weight: Tensor, weight_scale: Tensor, bias: Tensor | None) -> PerTokenInt8Linear:
        if weight.dtype != torch.int8 or weight.dim() != 2 or weight_scale.shape != (weight.shape[0],):
            raise BertkitError(f"a per-token int8 projection needs an int8 weight (out, in) and its scales (out,); "
                               f"got {weight.dtype} {tuple(weight.shape)} and {tuple(weight_scale.shape)}: the file "
                               "is not one `bertkit quantize` wrote, or damaged")
        _check_scales(weight_scale=weight_scale)
        return cls(weight, weight_scale, bias)

    def saved_tensors(self) -> dict[str, Tensor]:
        return {"weight": self.weight_t.t().contiguous(), "weight_scale": self.weight_scale.clone()}

    def float_bias(self) -> Tensor | None:
        return self.bias

    def forward(self, x: Tensor) -> Tensor:
        shape = x.shape
        if not shape or shape[-1] != self.in_features:
            raise BertkitError(f"per-token int8 linear: input of shape {tuple(shape)}, but this projection takes "
                               f"{self.in_features} features in the last dimension")
        x = x.reshape(-1, self.in_features)
        # Halved before adding, so a row reaching +-1.7e38 does not overflow to inf; the same bits otherwise
        # (halving is exact, and (h - l) / 127 rounds the same real number as (hi - lo) / 254).
        hi, lo = x.amax(1, keepdim=True).mul_(0.5), x.amin(1, keepdim=True).mul_(0.5)  # (T, 1) each
        zero = hi + lo
        step = ((hi - lo) / 127).clamp_(min=torch.finfo(torch.float32).tiny)
        # One new (T, in) buffer, the rest in place: fresh large buffers cost page faults on every call.
        q = x.sub(zero).div_(step).round_().clamp_(-127, 127).to(torch.int8)
        acc = torch._int_mm(q, self.weight_t).to(torch.float32).mul_(self.weight_scale)  # (T, out)
        y = zero * self.weight_rowsum if self.bias is None else torch.addcmul(self.bias, zero, self.weight_rowsum)
        y = y.addcmul_(acc, step).reshape(*shape[:-1], self.out_features)
        return _NoBackward.apply(y) if torch.is_grad_enabled() and y.requires_grad else y

    def train(self, mode: bool = True) -> PerTokenInt8Linear:
        if mode:
            raise BertkitError(_NOT_FOR_TRAINING)
        return super().train(False)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, int8 weights per output channel, "
                "8-bit activations per token")

    def dequantized(self) -> nn.Linear:
        """This layer as a float ``nn.Linear`` (the int8 weights times their scales), for CPUs where
        ``per_token_supported`` is false (``load_int8``)."""
        linear = nn.Linear(self.in_features, self.out_features, bias=self.bias is not None)
        with torch.no_grad():
            linear.weight.copy_(self.weight_t.t().to(torch.float32) * self.weight_scale[:, None])
            if self.bias is not None:
                linear.bias.copy_(self.bias)
        return linear.eval()


INT8_LAYERS = (SmoothedInt8Linear, PerTokenInt8Linear)


def smoothing_scale(act_absmax: Tensor, weight: Tensor, alpha: float) -> Tensor:
    """SmoothQuant's per-input-channel factor s_j = max|X_j|^alpha / max|W_j|^(1 - alpha) (section 4.1)."""
    w = weight.detach().abs().amax(0).clamp(min=1e-5)  # (in,)
    return (act_absmax.clamp(min=1e-5) ** alpha / w ** (1 - alpha)).clamp(min=1e-5)


@torch.inference_mode()
def activation_absmax(encoder: BertModel, calibration: Iterable[Mapping[str, Tensor]],
                      targets: list[tuple[int, str]]) -> dict[tuple[int, str], Tensor]:
    """Per-input-channel max |x| entering each target projection over the calibration batches (each a dict
    with ``input_ids`` and ``attention_mask``, optionally ``token_type_ids``; the default unpadded layout
    sees real tokens only)."""
    stats: dict[tuple[int, str], Tensor] = {}
    hooks = []
    for i, kind in targets:
        def record(module: nn.Module, inputs: tuple[Tensor, ...], output: Tensor, key=(i, kind)) -> None:
            x = inputs[0].detach().reshape(-1, inputs[0].size(-1)).abs().amax(0).float()  # (in,)
            stats[key] = x if key not in stats else torch.maximum(stats[key], x)
        layer = _layers(encoder)[i]
        # q, k and v read the same input, which is attention.self's (the three may run as one GEMM, unhooked).
        hooked = layer.attention.self if kind == "qkv" else get_projection(layer, kind)
        hooks.append(hooked.register_forward_hook(record))
    was_training = encoder.training
    encoder.eval()
    try:
        batches = 0
        for batch in calibration:
            if not isinstance(batch, Mapping) or "input_ids" not in batch or "attention_mask" not in batch:
                raise BertkitError("each calibration batch must be a dict with input_ids and attention_mask "
                                   "(and optionally token_type_ids): use calibration_batches(tokenizer, texts)")
            encoder(batch["input_ids"], batch["attention_mask"], batch.get("token_type_ids"))
            batches += 1
    finally:
        for h in hooks:
            h.remove()
        encoder.train(was_training)
    if batches == 0:
        raise BertkitError("calibration holds no batches; pass calibration_batches(tokenizer, texts) with a few "
                           "hundred texts like the ones the model will see (or calibration=None for no smoothing)")
    return stats


def calibration_batches(tokenizer: BertTokenizer, texts: Sequence[str | tuple[str, str]], *, batch_size: int = 32,
                        max_length: int = 128) -> list[dict[str, Tensor]]:
    """``texts`` (strings, or (text, text_pair) tuples) as encoder input batches for ``quantize_int8``."""
    if not texts:
        raise BertkitError("calibration_batches needs at least one text (a few hundred is right)")
    out = []
    for a in range(0, len(texts), batch_size):
        chunk = texts[a:a + batch_size]
        firsts = [t[0] if isinstance(t, tuple) else t for t in chunk]
        pairs = [t[1] for t in chunk if isinstance(t, tuple)]
        if pairs and len(pairs) != len(chunk):
            raise BertkitError("calibration texts mix single texts and (text, text_pair) pairs; give one kind")
        enc = tokenizer(firsts, pairs or None, truncation=True, max_length=max_length, padding=True,
                        return_tensors="pt")
        out.append({k: enc[k] for k in ("input_ids", "token_type_ids", "attention_mask")})
    return out


def quantize_int8(model: nn.Module, *, calibration: Iterable[Mapping[str, Tensor]] | None,
                  keep_fp32: Iterable[str] = DEFAULT_KEEP_FP32, per_token: Iterable[str] = (),
                  alpha: float = DEFAULT_ALPHA, activation_bits: int | None = None,
                  inplace: bool = False) -> nn.Module:
    """A copy of ``model`` (or ``model`` itself with ``inplace=True``) whose encoder projections are int8.

    ``model`` is a bertkit ``BertModel`` or head model in float32 on the CPU. Every encoder layer's
    ``qkv``, ``attn_out``, ``ffn_in`` and ``ffn_out`` becomes int8, except those named in ``keep_fp32``
    (see ``resolve_keep_fp32``; ``()`` quantizes all four everywhere): those named in ``per_token`` (the
    same kind of names) a ``PerTokenInt8Linear`` (one activation scale per token; CPUs with AVX512-VNNI),
    the others a ``SmoothedInt8Linear`` (one activation scale per call). ``keep_fp32=FAST_KEEP_FP32,
    per_token=FAST_PER_TOKEN`` is ``bertkit quantize --fast``; ``keep_fp32=()`` alone loses accuracy
    (docs/inference.md).

    ``calibration``: encoder input batches (``calibration_batches(tokenizer, texts)``) from which the
    smoothing factors are measured, ``alpha`` the SmoothQuant migration strength (0.7 measured best on
    MiniLM); ``None`` quantizes without smoothing (s = 1), which on MiniLM left sentences at cosine 0.96.
    ``activation_bits``: 8 or 7; None (default) takes what is exact on this CPU (``int8_activation_bits``: 8
    with AVX512-VNNI); per-token projections are 8-bit whatever it says.
    Embeddings, LayerNorms, attention, the pooler and heads stay fp32. The result is in eval mode, for
    inference only; both layouts work. Quantizing MiniLM with 256 calibration sentences takes about a
    second; ``save_int8`` (``bertkit quantize``) keeps the result for a 0.1 s load.
    """
    encoder = encoder_of(model)
    check_int8_support(model)
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0.0 <= alpha <= 1.0:
        raise BertkitError(f"alpha must be a number in [0, 1] (SmoothQuant's migration strength), got {alpha!r}")
    if activation_bits is None:
        activation_bits = int8_activation_bits()
    if activation_bits not in ACTIVATION_BITS:
        raise BertkitError(f"activation_bits must be 7 or 8 (None: what this CPU runs exactly), got {activation_bits!r}")
    if activation_bits == 8 and int8_activation_bits() == 7:
        raise BertkitError("8-bit activations need AVX512-VNNI, which this CPU lacks (its int8 instructions would "
                           "overflow); use activation_bits=7 or None")
    kept = resolve_keep_fp32(keep_fp32, len(_layers(encoder)))
    tokenwise = resolve_keep_fp32(per_token, len(_layers(encoder)), "per_token")
    if tokenwise & kept:
        both = sorted(f"layers.{i}.{k}" for i, k in tokenwise & kept)
        raise BertkitError(f"{', '.join(both[:4])} named in both keep_fp32 and per_token; a projection is either "
                           "kept fp32 or quantized")
    if tokenwise and not per_token_supported():
        raise BertkitError("per-token int8 projections need AVX512-VNNI (and torch._int_mm's CPU kernel), which this "
                           "machine lacks; leave per_token out")
    targets = [(i, kind) for i in range(len(_layers(encoder))) for kind in PROJECTIONS if (i, kind) not in kept]
    for i, kind in targets:
        module = float_projection(_layers(encoder)[i], kind)
        if type(module) is not nn.Linear:
            raise BertkitError(f"layer {i}'s {kind} is {type(module).__name__}, not an fp32 nn.Linear: the model "
                               "is quantized already; quantize the fp32 model once")
    smoothed = [t for t in targets if t not in tokenwise]
    absmax = activation_absmax(encoder, calibration, smoothed) if calibration is not None and smoothed else {}
    target_model = model if inplace else copy.deepcopy(model)
    target_encoder = encoder_of(target_model)
    with _packing():
        for i, kind in targets:
            layer = _layers(target_encoder)[i]
            linear = float_projection(layer, kind)
            if (i, kind) in tokenwise:
                set_projection(layer, kind, PerTokenInt8Linear.from_float(linear))
                continue
            scale = (smoothing_scale(absmax[(i, kind)], linear.weight, alpha) if absmax
                     else torch.ones(linear.in_features))
            set_projection(layer, kind, SmoothedInt8Linear(linear, scale, activation_bits))
    return target_model.eval()


def check_int8_request(device: str | torch.device, *, bf16: bool = False) -> torch.device:
    """The device an int8 model runs on (the CPU; ``auto`` means it), or an error naming why int8 cannot run
    here and the fix: a GPU or MPS device, bf16 asked for too, a PyTorch without an x86 quantized engine.
    Pipelines and commands call it before loading a model."""
    if bf16:
        raise BertkitError("int8 and bf16 are both asked for; choose one: bf16 on CPUs with AVX512-BF16 or AMX (and "
                           "GPUs), int8 on other x86 CPUs (docs/inference.md, section int8)")
    if isinstance(device, str) and device.strip() == "auto":
        device = "cpu"  # int8 runs on the CPU only, so that is the device auto picks for it
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise BertkitError(f"device {device!r} is not a device: int8 runs on cpu") from None
    if dev.type != "cpu":
        raise BertkitError(f"int8 runs on the CPU only (PyTorch's int8 Linear kernels are fbgemm's, for x86 CPUs), "
                           f"device is {str(device)!r}; use device cpu for int8, or run the fp32 model (or bf16) "
                           "on the GPU")
    _check_engine()
    return dev


def read_calibration_file(path: str | Path) -> list[str]:
    """Calibration texts from a text file, one per line (blank lines skipped)."""
    path = Path(path)
    if not path.is_file():
        raise MissingFileError(f"calibration file {path} not found: give a text file with one sentence per line, "
                               "like the ones the model will see (or leave it out for the built-in sentences)")
    try:
        texts = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]
    except UnicodeDecodeError as e:
        raise BertkitError(f"calibration file {path} is not UTF-8 text ({e}); save it as UTF-8") from None
    texts = [t for t in texts if t]
    if not texts:
        raise BertkitError(f"calibration file {path} holds no text; write one sentence per line (a few hundred)")
    return texts


def quantize_int8_on_texts(model: nn.Module, tokenizer: BertTokenizer,
                           calibration_texts: Sequence[str | tuple[str, str]] | None = None, *,
                           max_length: int = 128, batch_size: int = 32,
                           keep_fp32: Iterable[str] = DEFAULT_KEEP_FP32,
                           per_token: Iterable[str] = ()) -> nn.Module:
    """``quantize_int8`` (defaults kept) calibrated on ``calibration_texts``, or, when None, on the 256
    built-in English sentences (``bertkit.calibration_text``): the same on every call and every machine, and
    on MiniLM as close to fp32 as calibrating on SST-2's own training sentences (docs/inference.md)."""
    if calibration_texts is None:
        calibration_texts = CALIBRATION_SENTENCES
    elif isinstance(calibration_texts, (str, bytes)) or not isinstance(calibration_texts, Sequence):
        raise BertkitError(f"calibration_texts must be a list of texts (or (text, text_pair) tuples), got "
                           f"{type(calibration_texts).__name__} {str(calibration_texts)[:60]!r}")
    bad = next((t for t in calibration_texts if not (isinstance(t, str) or (
        isinstance(t, tuple) and len(t) == 2 and all(isinstance(x, str) for x in t)))), None)
    if bad is not None:
        raise BertkitError(f"calibration_texts holds {type(bad).__name__} {str(bad)[:60]!r}; give strings or "
                           "(text, text_pair) tuples")
    check_int8_support(model)  # before the tokenizer runs over the texts
    calibration = calibration_batches(tokenizer, list(calibration_texts), batch_size=batch_size,
                                      max_length=max_length)
    return quantize_int8(model, calibration=calibration, keep_fp32=keep_fp32, per_token=per_token)


def int8_projections(model: nn.Module) -> list[str]:
    """Names of the encoder projections of ``model`` that are int8 (``layers.3.qkv``, ...), in order."""
    encoder = encoder_of(model)
    return [f"layers.{i}.{kind}" for i, layer in enumerate(_layers(encoder)) for kind in PROJECTIONS
            if isinstance(get_projection(layer, kind), INT8_LAYERS)]


def per_token_projections(model: nn.Module) -> list[str]:
    """Names of the encoder projections of ``model`` that are int8 with per-token scales, in order."""
    encoder = encoder_of(model)
    return [f"layers.{i}.{kind}" for i, layer in enumerate(_layers(encoder)) for kind in PROJECTIONS
            if isinstance(get_projection(layer, kind), PerTokenInt8Linear)]


def is_int8_model(model: nn.Module) -> bool:
    """Whether any of ``model``'s modules is an int8 projection (``quantize_int8`` or ``load_int8`` made it)."""
    return any(isinstance(m, INT8_LAYERS) for m in model.modules())


def is_int8_checkpoint(model_dir: str | Path) -> bool:
    """Whether ``model_dir`` holds an int8 model written by ``save_int8`` / ``bertkit quantize``."""
    return (Path(model_dir) / INT8_WEIGHTS_NAME).is_file()


def save_int8(model: nn.Module, output_dir: str | Path, *, calibration: str = "built-in") -> Path:
    """Write an int8 model (``quantize_int8``'s result) to ``output_dir`` for ``load_int8``; returns the directory.

    ``model.int8.safetensors`` holds each int8 projection as its int8 weight (out, in), the weight's scale
    per output channel and the smoothing factors (``int8.layers.3.qkv.weight``, ``.weight_scale``,
    ``.inv_scale``), and every other tensor under its published name, in float32 (the embeddings, biases,
    LayerNorms, the pooler and the head). ``config.json`` is the model's, with ``quantization_config``
    saying how it was made (``calibration``: what it was calibrated on, recorded as given). The weights are
    stored as integers and scales, not as one engine's packed form, so the directory runs on any x86 CPU:
    ``load_int8`` packs them for the engine it finds. The tokenizer is not written (``bertkit quantize``
    copies it).
    """
    encoder = encoder_of(model)
    int8 = {(i, kind): get_projection(layer, kind) for i, layer in enumerate(_layers(encoder)) for kind in PROJECTIONS
            if isinstance(get_projection(layer, kind), INT8_LAYERS)}
    if not int8:
        raise BertkitError(f"save_int8 writes an int8 model, and this {type(model).__name__} has no int8 projection: "
                           "quantize it first (quantize_int8 / quantize_int8_on_texts), or save the float model "
                           "with save_pretrained")
    tensors: dict[str, Tensor] = {}
    for (i, kind), module in int8.items():
        tensors.update({f"int8.layers.{i}.{kind}.{k}": v for k, v in module.saved_tensors().items()})
        # A float stand-in with the real bias lets the key table name everything else; its weight is dropped.
        stand_in = torch.nn.utils.skip_init(nn.Linear, module.in_features, module.out_features,
                                            bias=module.float_bias() is not None)
        if stand_in.bias is not None:
            stand_in.bias.data.copy_(module.float_bias())
        set_projection(_layers(encoder)[i], kind, stand_in)
    try:
        published = model.published_state_dict()
    finally:
        for (i, kind), module in int8.items():
            set_projection(_layers(encoder)[i], kind, module)
    prefix = "" if encoder is model else "bert."
    dropped = {prefix + n for i, kind in int8 for n in encoder_published_names(f"layers.{i}.{kind}.weight")}
    tensors.update({k: v for k, v in published.items() if k not in dropped})
    config = model.config.to_dict()
    config["architectures"] = [type(model).__name__]
    bits = sorted({m.activation_bits for m in int8.values() if isinstance(m, SmoothedInt8Linear)}) or [8]
    if len(bits) != 1:
        raise BertkitError(f"save_int8 writes one activation width for all projections; this model mixes {bits}")
    config["quantization_config"] = {
        "quant_method": QUANT_METHOD, "format_version": INT8_FORMAT_VERSION,
        "weights": "int8, symmetric, one scale per output channel",
        "activations": "uint8, one scale per call over the whole input (dynamic); per_token_projections: int8, "
                       "one scale and zero point per token", "activation_bits": bits[0],
        "smoothing": "SmoothQuant: inputs times inv_scale, weights already times its inverse (not per-token ones)",
        "int8_projections": [f"layers.{i}.{kind}" for i, kind in int8],
        "per_token_projections": [f"layers.{i}.{kind}" for (i, kind), m in int8.items()
                                  if isinstance(m, PerTokenInt8Linear)],
        "calibration": calibration,
    }
    directory = Path(output_dir)
    directory.mkdir(parents=True, exist_ok=True)
    from safetensors.torch import save_file

    with atomic_target(directory / INT8_WEIGHTS_NAME) as tmp:
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp), metadata={"format": "pt",
                                                                                       "bertkit": QUANT_METHOD})
    atomic_write_text(directory / CONFIG_NAME, json.dumps(config, indent=2, sort_keys=True) + "\n")
    return directory


def _int8_model_class(directory: Path, raw: dict) -> type[nn.Module]:
    name = (raw.get("architectures") or ["BertModel"])[0]
    found = BertModel if name == "BertModel" else getattr(heads, name, None)
    if not (isinstance(found, type) and issubclass(found, nn.Module)):
        raise BertkitError(f"{directory / CONFIG_NAME} names architecture {name!r}, which bertkit does not have; "
                           "pass model_class= (BertModel or a bertkit head class)")
    return found


def load_int8(model_dir: str | Path, model_class: type[nn.Module] | None = None) -> nn.Module:
    """The int8 model ``save_int8`` / ``bertkit quantize`` wrote to ``model_dir``, in eval mode on the CPU.

    ``model_class`` (``BertModel`` or a head class) defaults to the one config.json's ``architectures``
    names; a head model's directory loads as ``BertModel`` too (the head is left out), as from_pretrained
    does. The int8 weights are packed here for this machine's quantized engine: a directory written on one
    x86 CPU runs on another; a machine without the x86/fbgemm engine is refused, naming it.
    """
    directory = Path(model_dir)
    weights = directory / INT8_WEIGHTS_NAME
    if not weights.is_file():
        raise MissingFileError(f"{weights} not found: load_int8 reads a directory written by `bertkit quantize` "
                               "(or save_int8); a float checkpoint loads with from_pretrained, and "
                               "pipeline(..., quantize='int8') or --int8 quantize it at load")
    raw = read_config_json(directory)
    method = raw.get("quantization_config") if isinstance(raw.get("quantization_config"), dict) else {}
    if method.get("quant_method") != QUANT_METHOD or method.get("format_version") not in INT8_FORMAT_VERSIONS:
        raise BertkitError(f"{directory / CONFIG_NAME} does not describe a {QUANT_METHOD} model of format "
                           f"{' or '.join(map(str, INT8_FORMAT_VERSIONS))} (quantization_config: {method or 'absent'}); "
                           "write the directory again with this bertkit's `bertkit quantize`")
    tokenwise_names = method.get("per_token_projections", [])
    if not isinstance(tokenwise_names, list) or not all(isinstance(n, str) for n in tokenwise_names):
        raise BertkitError(f"{directory / CONFIG_NAME}: per_token_projections must be a list of names like "
                           f"'layers.0.ffn_out', got {tokenwise_names!r}; write the directory again with `bertkit quantize`")
    _check_engine()
    model_class = model_class or _int8_model_class(directory, raw)
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        tensors = load_file(str(weights))
    except SafetensorError as e:
        raise BertkitError(f"{weights} could not be read as safetensors ({e}); the file is truncated or corrupt "
                           f"(size {weights.stat().st_size} bytes): write it again with `bertkit quantize`") from e
    saved: dict[tuple[int, str], dict[str, Tensor]] = {}
    published: dict[str, Tensor] = {}
    for key, value in tensors.items():
        parts = key.split(".")
        if parts[0] != "int8":
            published[key] = value
        elif len(parts) == 5 and parts[1] == "layers" and parts[2].isdigit() and parts[3] in PROJECTIONS:
            saved.setdefault((int(parts[2]), parts[3]), {})[parts[4]] = value
        else:
            raise BertkitError(f"{weights} holds {key!r}, which is not an int8 projection's tensor "
                               "(int8.layers.<i>.<projection>.<weight|weight_scale|inv_scale>)")
    absent = sorted(set(tokenwise_names) - {f"layers.{i}.{kind}" for i, kind in saved})
    if absent:
        raise BertkitError(f"{directory / CONFIG_NAME} lists per-token projections {', '.join(absent[:4])} that "
                           f"{weights.name} does not hold; the file and config.json do not belong together")
    # The int8 projections' float weights are not stored: empty stand-ins of their shape let the key table
    # load the rest (and check it against the config); the int8 layers then replace them.
    for (i, kind), parts in saved.items():
        expected = {"weight", "weight_scale"} | (set() if f"layers.{i}.{kind}" in tokenwise_names else {"inv_scale"})
        if set(parts) != expected:
            raise BertkitError(f"{weights}: int8 projection layers.{i}.{kind} has {sorted(parts)}, expected "
                               f"{', '.join(sorted(expected))}; write the directory again with `bertkit quantize`")
        names = encoder_published_names(f"layers.{i}.{kind}.weight")
        out, inp = parts["weight"].shape
        for name in names:
            published[name] = torch.empty(out // len(names), inp)
    saved_bits = method.get("activation_bits", 7)
    if saved_bits not in ACTIVATION_BITS:
        raise BertkitError(f"{directory / CONFIG_NAME}: activation_bits {saved_bits!r} is not 7 or 8; write the "
                           "directory again with `bertkit quantize`")
    # Written on a CPU with AVX512-VNNI (8-bit activations) and loaded on one without: 8 bits would overflow
    # here, so the projections run at 7 bits, and those 7 bits cannot keep accurate (the default 7-bit set of
    # fp32 projections) run in float from their dequantized int8 weights.
    # Per-token projections likewise need VNNI (per_token_supported); without it they run in float too.
    bits = min(saved_bits, int8_activation_bits())
    config = BertConfig.from_json_file(directory / CONFIG_NAME)
    model = model_class.from_pretrained(None, config=config, state_dict=published)
    encoder = encoder_of(model)
    as_float = resolve_keep_fp32(DEFAULT_KEEP_FP32, len(_layers(encoder))) if bits < saved_bits else set()
    tokenwise_runs = per_token_supported()
    with _packing():
        for (i, kind), parts in sorted(saved.items()):
            if i >= len(_layers(encoder)):
                raise BertkitError(f"{weights} holds int8 layers.{i}.{kind} but the config has "
                                   f"{len(_layers(encoder))} layers; the file and config.json do not belong together")
            stand_in = float_projection(_layers(encoder)[i], kind)
            if tuple(parts["weight"].shape) != tuple(stand_in.weight.shape):
                raise BertkitError(f"{weights}: int8 layers.{i}.{kind} is {tuple(parts['weight'].shape)}, the config "
                                   f"makes it {tuple(stand_in.weight.shape)}; the file and config.json do not belong "
                                   "together")
            bias = stand_in.bias.detach() if stand_in.bias is not None else None
            if "inv_scale" not in parts:
                layer = PerTokenInt8Linear.from_saved(parts["weight"], parts["weight_scale"], bias)
                if not tokenwise_runs:
                    as_float.add((i, kind))
            else:
                layer = SmoothedInt8Linear.from_saved(parts["weight"], parts["weight_scale"], parts["inv_scale"],
                                                      bias, bits)
            set_projection(_layers(encoder)[i], kind, layer.dequantized() if (i, kind) in as_float else layer)
    converted = [key for key in saved if key in as_float]
    if converted:
        logger.info("%s was written with 8-bit or per-token activations (AVX512-VNNI), which this CPU cannot run "
                    "exactly: %d projections run in float from their int8 weights to stay close to fp32", directory,
                    len(converted))
    return model.eval()


def quantize_checkpoint(model_dir: str | Path, output_dir: str | Path, *, calibration_file: str | Path | None = None,
                        max_length: int = 128, fast: bool = False) -> dict:
    """``bertkit quantize``: the float checkpoint in ``model_dir`` (head chosen by its ``architectures``),
    quantized as pipelines quantize it (calibrated on ``calibration_file``'s lines, else the built-in
    sentences), written to ``output_dir`` with its tokenizer by ``save_int8``. ``fast``: every projection
    int8, ``ffn_out`` per token (``FAST_PER_TOKEN``; CPUs with AVX512-VNNI). Returns a report: the files' sizes and
    what was quantized. The caller owns ``output_dir`` (the command claims it)."""
    source = Path(model_dir)
    if fast and not per_token_supported():
        raise BertkitError("--fast quantizes with 8-bit and per-token activations, which need AVX512-VNNI, and this "
                           "CPU lacks it (at 7 bits every ffn_out must stay fp32); leave --fast out")
    if is_int8_checkpoint(source):
        raise BertkitError(f"{source} is an int8 model already (written by `bertkit quantize`); quantize the float "
                           "checkpoint it came from")
    model_class = _int8_model_class(source, read_config_json(source))
    texts = read_calibration_file(calibration_file) if calibration_file is not None else None
    tokenizer = BertTokenizer.from_pretrained(source)
    model = model_class.from_pretrained(source)
    keep, tokenwise = (FAST_KEEP_FP32, FAST_PER_TOKEN) if fast else (DEFAULT_KEEP_FP32, ())
    quantized = quantize_int8_on_texts(model, tokenizer, texts, max_length=max_length, keep_fp32=keep,
                                       per_token=tokenwise)
    calibration = "built-in" if calibration_file is None else f"{Path(calibration_file).name} ({len(texts or [])} texts)"
    out = save_int8(quantized, output_dir, calibration=calibration)
    tokenizer.save_pretrained(out)
    float_file = next((source / n for n in ("model.safetensors", "pytorch_model.bin") if (source / n).is_file()), None)
    return {"model": str(source), "output_dir": str(out), "architecture": model_class.__name__,
            "int8_projections": len(int8_projections(quantized)), "kept_fp32": list(keep),
            "per_token": list(tokenwise),
            "activation_bits": int8_activation_bits(),
            "calibration": calibration,
            "bytes": {"float": float_file.stat().st_size if float_file else None,
                      "int8": (out / INT8_WEIGHTS_NAME).stat().st_size}}


def int8_model_device(model_dir: str | Path, device: str | torch.device, *, calibrating: bool,
                      bf16: bool = False) -> torch.device:
    """For a model loaded int8 (a `bertkit quantize` directory): the device it runs on, the CPU, or an error
    naming the fix: a calibration asked for (it was calibrated when quantized), a GPU, bf16."""
    if calibrating:
        raise BertkitError(f"{model_dir} is int8 already (written by `bertkit quantize`, calibrated then); a "
                           "calibration file or texts apply when quantizing a float checkpoint")
    return check_int8_request(device, bf16=bf16)


def load_for_inference(model_class: type[nn.Module], model_dir: str | Path) -> nn.Module:
    """``model_class.from_pretrained(model_dir)``, or ``load_int8`` where the directory holds an int8 model:
    what every command and pipeline that applies a model loads it with."""
    if is_int8_checkpoint(model_dir):
        return load_int8(model_dir, model_class)
    return model_class.from_pretrained(model_dir)


__all__ = ["quantize_int8", "quantize_int8_on_texts", "calibration_batches", "check_int8_support",
           "check_int8_request", "read_calibration_file", "resolve_keep_fp32", "int8_projections", "encoder_of",
           "SmoothedInt8Linear", "PROJECTIONS", "DEFAULT_KEEP_FP32", "DEFAULT_ALPHA", "X86_ENGINES", "QUANTIZE_MODES",
           "int8_activation_bits", "FAST_KEEP_FP32", "PerTokenInt8Linear", "FAST_PER_TOKEN", "per_token_supported",
           "per_token_projections", "save_int8", "load_int8", "load_for_inference", "quantize_checkpoint",
           "int8_model_device", "is_int8_model", "is_int8_checkpoint", "QUANT_METHOD"]
