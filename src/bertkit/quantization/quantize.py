"""Quantizing a float model: ``quantize_int8`` makes its encoder projections int8, ``quantize_int8_on_texts``
calibrates it on texts first (the built-in sentences by default), as pipelines and commands do.

The defaults here (``DEFAULT_KEEP_FP32``, and ``FAST_KEEP_FP32`` / ``FAST_PER_TOKEN`` for ``bertkit quantize
--fast``) are measured choices; the package docstring and docs/inference.md (section int8) give the figures.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping, Sequence

import torch
from torch import Tensor, nn

from bertkit.calibration_text import CALIBRATION_SENTENCES
from bertkit.errors import BertkitError
from bertkit.modeling import BertModel
from bertkit.quantization.calibration import (
    DEFAULT_ALPHA,
    activation_absmax,
    calibration_batches,
    smoothing_scale,
)
from bertkit.quantization.device import (
    ACTIVATION_BITS,
    _packing,
    check_int8_support,
    int8_activation_bits,
    per_token_supported,
)
from bertkit.quantization.kernels import PerTokenInt8Linear, SmoothedInt8Linear
from bertkit.quantization.projections import (
    PROJECTIONS,
    _layers,
    encoder_of,
    float_projection,
    resolve_keep_fp32,
    set_projection,
)
from bertkit.tokenization import BertTokenizer

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
# What pipelines' ``quantize=`` takes (``None``: the model as loaded).
QUANTIZE_MODES = ("int8",)


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
    activation_bits, kept, tokenwise = _check_request(encoder, keep_fp32, per_token, alpha, activation_bits)
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


def _check_request(encoder: BertModel, keep_fp32: Iterable[str], per_token: Iterable[str], alpha: float,
                   activation_bits: int | None) -> tuple[int, set[tuple[int, str]], set[tuple[int, str]]]:
    """``quantize_int8``'s arguments, checked against this encoder and this CPU: the activation width (None:
    what this CPU runs exactly), and the (layer, projection) pairs kept fp32 and made per-token."""
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
    return activation_bits, kept, tokenwise


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
