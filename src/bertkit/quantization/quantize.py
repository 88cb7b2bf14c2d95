"""Quantizing a float model: ``quantize_int8`` makes its encoder projections int8, ``quantize_int8_on_texts``
calibrates it on texts first (the built-in sentences by default), as pipelines and commands do."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from torch import Tensor, nn

from bertkit._hardware import check_int8_kernel
from bertkit.calibration_text import CALIBRATION_SENTENCES
from bertkit.construction import copy_model
from bertkit.errors import BertkitError, NonFiniteError
from bertkit.quantization.calibration import activation_absmax, calibration_batches, smoothing_scale
from bertkit.quantization.kernels import Int8Linear
from bertkit.quantization.projections import (
    PER_TOKEN,
    PROJECTIONS,
    encoder_of,
    float_projection,
    set_projection,
)
from bertkit.tokenization import BertTokenizer

# SmoothQuant's migration strength: 0.5, 0.7 and 0.85 measured on MiniLM; 0.7 gave the highest minimum cosine.
ALPHA = 0.7


def check_int8_support(model: nn.Module) -> None:
    """Refuse, naming what is wrong and the fix, a model or machine that cannot run int8 (where it runs is
    ``_hardware.resolve_device``'s answer, ``int8=True``)."""
    check_int8_kernel()
    params = list(model.parameters())
    devices = sorted({p.device.type for p in params})
    if devices != ["cpu"]:
        raise BertkitError(f"int8 runs on the CPU only, the model is on {', '.join(devices)}; quantize the model "
                           "on the CPU (model.to('cpu')) and run it there")
    dtypes = sorted({str(p.dtype).removeprefix("torch.") for p in params if p.is_floating_point()})
    if dtypes != ["float32"]:
        raise BertkitError(f"int8 quantization starts from float32 weights, the model holds {', '.join(dtypes)}; "
                           "load it in float32 (model.float())")


def quantize_int8(model: nn.Module, *, calibration: Iterable[Mapping[str, Tensor]]) -> nn.Module:
    """A copy of ``model`` whose encoder projections ``qkv``, ``attn_out``, ``ffn_in`` and ``ffn_out`` are
    ``Int8Linear`` on this machine's int8 kernel (``ffn_out``'s activations per token); in eval mode, for inference.

    ``model`` is a bertkit ``BertModel`` or head model in float32 on the CPU. ``calibration``: encoder input
    batches (``calibration_batches(tokenizer, texts)``, a few hundred texts like the model's inputs) from which
    the smoothing factors are measured. Embeddings, LayerNorms, attention, the pooler and heads stay float. Quantizing MiniLM on 256 sentences takes about a second; ``save_int8`` (``bertkit quantize``) keeps the
    result for a 0.1 s load."""
    encoder = encoder_of(model)
    check_int8_support(model)
    targets = [(i, kind) for i in range(len(encoder.encoder.layer)) for kind in PROJECTIONS]
    for i, kind in targets:
        module = float_projection(encoder.encoder.layer[i], kind)
        if isinstance(module, Int8Linear):
            raise BertkitError(f"layer {i}'s {kind} is Int8Linear: the model is quantized already; quantize the fp32 "
                               "model once")
        if type(module) is not nn.Linear:
            # named, not imported: inference.prepare is a layer above (its PreparedLinear fuses ffn_in's GELU, which
            # an int8 copy of its weights alone would lose)
            what = ("a copy prepared for inference (a pipeline's .model, optimize_for_inference)"
                    if type(module).__name__ == "PreparedLinear" else "not a plain nn.Linear (peft's wrapper, a hook)")
            raise BertkitError(f"layer {i}'s {kind} is {type(module).__name__}, {what}: quantize the model as "
                               "from_pretrained loads it (pipeline(task, model, quantize='int8') makes its own copy)")
    if calibration is None:
        raise BertkitError("quantize_int8 needs calibration batches: calibration_batches(tokenizer, texts) with a few "
                           "hundred texts like the model's inputs (quantize_int8_on_texts uses built-in sentences)")
    # calibrated on the copy, never on the model passed in: its hooks and mode switch there saw the forward passes
    # another thread ran on that model meanwhile (a SentenceTransformer serving it: the int8 vectors 0.09 from those
    # of the same model quantized alone), and switched that thread's dropout back on
    target_model = copy_model(model)
    target_encoder = encoder_of(target_model)
    absmax = activation_absmax(target_encoder, calibration, targets)
    for i, kind in targets:
        layer = target_encoder.encoder.layer[i]
        linear = float_projection(layer, kind)
        scale = smoothing_scale(absmax[(i, kind)], linear.weight, ALPHA)
        set_projection(layer, kind, Int8Linear.from_float(linear, scale, per_token=kind in PER_TOKEN))
    return target_model.eval()


def quantize_int8_on_texts(model: nn.Module, tokenizer: BertTokenizer,
                           calibration_texts: Sequence[str | tuple[str, str]] | None = None, *,
                           max_length: int = 128, batch_size: int = 32) -> nn.Module:
    """``quantize_int8`` calibrated on ``calibration_texts``, or, when None, on the 64 built-in English sentences
    (``bertkit.calibration_text``): the same on every call and every machine, and on MiniLM as close to fp32 as
    calibrating on SST-2's own training sentences (docs/inference.md)."""
    check_int8_support(model)  # before the tokenizer runs over the texts
    model.config.check_sequence_length(max_length, "max_length")
    texts = CALIBRATION_SENTENCES if calibration_texts is None else calibration_texts
    calibration = calibration_batches(tokenizer, texts, batch_size=batch_size, max_length=max_length)
    try:
        return quantize_int8(model, calibration=calibration)
    except NonFiniteError as e:
        if e.index is None:
            raise
        text = texts[e.index]  # calibration_batches keeps the texts' order
        raise NonFiniteError(f"{e} (calibration text {e.index}: {str(text)[:60]!r})", index=e.index) from None
