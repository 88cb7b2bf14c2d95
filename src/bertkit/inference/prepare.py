"""One way to make a model ready to run: its device, bf16 autocast or int8, and a record of which it got.

Every command, pipeline and the server that applies a model goes through ``prepare_model``: the device comes from
``bertkit._hardware.resolve_device`` (the one function that decides it), a float model asked to run in int8 is
quantized here (calibrated on the given texts, a calibration file, or the built-in sentences), and a model that
is int8 already (a `bertkit quantize` directory) runs as it is, on the CPU. ``check_request`` refuses what cannot
run before any weights load.

bf16 left unset (None) is decided here too (``default_bf16``): an int8 model runs what stays float in it
(attention, GELU, LayerNorm, the projections kept fp32) in bf16 on CPUs with bf16 instructions, as OpenVINO
runs its int8 models on them; everything else runs as loaded, fp32 in fp32.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from bertkit import _hardware, quantization
from bertkit._hardware import resolve_device, warn_if_bf16_is_emulated
from bertkit.errors import BertkitError


@dataclass(frozen=True)
class Precision:
    """How a prepared model runs: its device, the dtype its matmuls compute in, and whether (and on what text) its
    encoder's projections were quantized to int8."""

    device: torch.device
    dtype: str  # "float32", or "bfloat16" (autocast over float32 weights)
    quantize: str | None  # "int8" or None
    calibration: str | None = None  # with int8: "built-in", a calibration file, "texts", or what the int8 dir records

    @property
    def bf16(self) -> bool:
        """Whether the model runs under bf16 autocast (asked for, or ``default_bf16``'s choice)."""
        return self.dtype == "bfloat16"

    def record(self) -> dict[str, Any]:
        """What a prediction report says about precision (as pipelines' ``.quantize`` and ``.bf16`` and serve's
        /metadata): int8 or not (with its calibration), and the dtype what is not int8 ran in ("bfloat16" under
        bf16 autocast)."""
        calibration = {} if self.quantize is None else {"calibration": self.calibration}
        return {"quantize": self.quantize, **calibration, "float_dtype": self.dtype}


def default_bf16(quantize: str | None, device: torch.device) -> bool:
    """bf16 when the caller left it unset: on for an int8 model on a CPU with bf16 instructions (AVX512-BF16 or
    AMX), off otherwise (fp32 models stay fp32: their default is transformers' numbers).

    Measured on an AVX512-BF16 EPYC (BENCHMARKS.md, "every bertkit int8 mode"; RESULTS.md, "int8 accuracy"): the
    int8 model's float parts in bf16 ran 1.06-1.33x as fast as in fp32 at every input length and thread count, at
    the same cosine to fp32 (0.9976 / 0.9991 / 0.9992 against 0.9975 / 0.9992 / 0.9993), and kept every fine-tuned
    metric within 0.20 points of fp32 (0.33 with the float parts in fp32). Without bf16 instructions bf16 is
    emulated, several times slower, so it stays off there."""
    return quantize == "int8" and device.type == "cpu" and _hardware.cpu_has_bf16()  # looked up here: tests patch it


def check_request(device: str | torch.device = "cpu", *, bf16: bool | None = None, quantize: str | None = None,
                  calibrating: bool = False, local_rank: int = 0) -> torch.device:
    """The device a model asked to run so will run on, or an error naming why it cannot and the fix (an int8
    request on a GPU, with bf16 asked for on a CPU without bf16 instructions, without an int8 kernel for this CPU;
    an unknown ``quantize``; calibration without int8). Called before the weights load."""
    bf16 = _checked_bf16(bf16)
    if quantize is None:
        if calibrating:
            raise BertkitError("calibration_texts calibrate int8 inference: pass them with quantize='int8'")
        return torch.device(resolve_device(device, local_rank))
    if quantize not in quantization.QUANTIZE_MODES:
        raise BertkitError(f"quantize {quantize!r} is not one of {quantization.QUANTIZE_MODES}: quantize='int8' runs "
                           "the encoder in int8 on the CPU, quantize=None (the default) as loaded")
    return torch.device(resolve_device(device, local_rank, int8=True, bf16=bf16 is True))


def prepare_model(model: nn.Module | type[nn.Module], model_dir: str | Path | None = None, *,
                  device: str | torch.device = "cpu", bf16: bool | None = None, quantize: str | None = None,
                  calibration_texts: Sequence[str | tuple[str, str]] | None = None,
                  calibration_file: str | Path | None = None, tokenizer: Any = None, max_length: int | None = None,
                  local_rank: int = 0) -> tuple[nn.Module, Precision]:
    """``model`` (a loaded model, or a model class to load from ``model_dir``: a `bertkit quantize` directory loads
    in int8) on its device in eval mode, with the record of its precision.

    ``quantize="int8"`` quantizes a float model as pipelines always have (``quantize_int8_on_texts`` on
    ``calibration_texts``, the lines of ``calibration_file``, or the built-in sentences, cut to ``max_length``
    tokens by ``tokenizer``); an int8 model runs as it is and refuses a calibration (it was calibrated when
    quantized). ``model_dir`` names the model in that refusal. ``bf16`` None: ``default_bf16`` decides (the
    returned ``Precision`` says what it chose)."""
    if isinstance(model, type):
        if model_dir is None:
            raise BertkitError(f"prepare_model got the class {model.__name__}: pass model_dir to load it from")
        model = quantization.load_for_inference(model, Path(model_dir))
    bf16 = _checked_bf16(bf16)
    calibrating = calibration_texts is not None or calibration_file is not None
    int8_already = quantization.is_int8_model(model)
    if int8_already:
        if calibrating:
            raise BertkitError(_calibrating_int8(model_dir))
        quantize = "int8"
    dev = check_request(device, bf16=bf16, quantize=quantize, calibrating=calibrating, local_rank=local_rank)
    model = model.eval() if int8_already else model.to(dev).eval()
    calibration = None
    if int8_already:
        calibration = (model.config.extra.get("quantization_config") or {}).get("calibration") or "built-in"
    elif quantize == "int8":
        texts = calibration_texts
        if calibration_file is not None:
            texts = quantization.read_calibration_file(Path(calibration_file))
        # looked up at the call (not imported by name): tests and tools can wrap it
        model = quantization.quantize_int8_on_texts(model, tokenizer, texts, max_length=max_length)
        calibration = (str(calibration_file) if calibration_file is not None
                       else "texts" if calibration_texts is not None else "built-in")
    if bf16 is None:
        bf16 = default_bf16(quantize, dev)
    elif bf16:
        warn_if_bf16_is_emulated(dev.type)
        # autocast cannot mix bf16 with float16 weights: PyTorch fails inside the first layer with a bare error
        if not int8_already and any(p.dtype == torch.float16 for p in model.parameters()):
            raise BertkitError("bf16 autocast cannot run float16 weights: call model.float() (or .bfloat16()) "
                               "before passing the model with bf16, or leave bf16 off to run it in float16")
    return model, Precision(dev, "bfloat16" if bf16 else "float32", quantize, calibration)


def _checked_bf16(bf16: Any) -> bool | None:
    """``bf16`` as True, False or None (unset); anything else (a string such as "false", a number) is refused
    rather than read by its truthiness."""
    if bf16 is None or isinstance(bf16, bool):
        return bf16
    if isinstance(bf16, np.bool_):  # numpy's bool, from a config or an array
        return bool(bf16)
    raise BertkitError(f"bf16 must be True, False or None (unset: on for int8 on CPUs with bf16 instructions), got "
                       f"{bf16!r} ({type(bf16).__name__})")


def _calibrating_int8(model_dir: str | Path | None) -> str:
    if model_dir is None:
        return ("the model is int8 already (calibrated when it was quantized); calibration_texts apply when "
                "quantizing a float model: pass the float checkpoint with them")
    return (f"{model_dir} is int8 already (written by `bertkit quantize`, calibrated then); a calibration file or "
            "texts apply when quantizing a float checkpoint")
