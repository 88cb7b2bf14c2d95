"""Export: the encoder plus its head as a graph (torch.export, torch.jit.trace, ONNX); docs/inference.md, "Export".

Under tracing the encoder computes on the padded rectangle (``padding.is_tracing``), since dropping padding gives
data-dependent shapes a static graph cannot hold; ``TupleOutputModel`` gives the tuples jit.trace and ONNX need.
"""

from __future__ import annotations

import time
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from bertkit.errors import BertkitError, file_to_write, is_whole
from bertkit.heads import MODEL_CLASSES, BertForMultipleChoice
from bertkit.hub import encoder_path, module_types, read_modules
from bertkit.quantization.saved import load_named_class

INPUT_NAMES = ("input_ids", "token_type_ids", "attention_mask")


class TupleOutputModel(nn.Module):
    """``model`` with a tuple of tensors as output (its class's ``output_names``), for torch.jit.trace and ONNX.

    Inputs are positional: ``input_ids, token_type_ids, attention_mask``, each (B, T) ((B, C, T) for
    multiple choice). The weights are ``model``'s own (not copied).
    """

    def __init__(self, model: nn.Module):
        super().__init__()
        if not isinstance(model, tuple(MODEL_CLASSES.values())):
            raise BertkitError(f"{type(model).__name__} is not a bertkit model class; export one of "
                               f"{', '.join(MODEL_CLASSES)}")
        self.model = model
        self.output_names = model.output_names

    def forward(self, input_ids: Tensor, token_type_ids: Tensor, attention_mask: Tensor) -> tuple[Tensor, ...]:
        # config.json's runtime switches are a caller's defaults; the graph returns the head's outputs alone
        out = self.model(input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask, return_dict=True,
                         output_hidden_states=False, output_attentions=False)
        return tuple(getattr(out, n) for n in self.output_names)


def load_for_export(model_dir: str | Path) -> nn.Module:
    """The model class the checkpoint was saved as (config.json ``architectures``; the bare encoder if none), its
    head refused where the weights lack it (``load_named_class``)."""
    return load_named_class(Path(model_dir))


TRACE_TEXTS = ("BERT reads text in both directions at once.", "Short one.")
CHECK_TEXTS = ("Is the graph", "exported with dynamic axes, so that other batch sizes", "and lengths run?")


def example_inputs(model: nn.Module, tokenizer: Any, texts: tuple[str, ...] = TRACE_TEXTS
                   ) -> tuple[Tensor, Tensor, Tensor]:
    """Real sentences of different lengths, padded: the shapes the exporter traces with (or checks on)."""
    enc = tokenizer(list(texts), padding=True, return_tensors="pt")
    ids, types, mask = (enc[k] for k in INPUT_NAMES)
    if isinstance(model, BertForMultipleChoice):  # (B, C, T): the two sentences as two choices, batch of 1
        ids, types, mask = ids[None], types[None], mask[None]
    return ids, types, mask


def _require_onnx() -> None:
    try:
        import onnx  # noqa: F401
    except ImportError:
        raise BertkitError("ONNX export needs the onnx package: pip install 'bertkit[onnx]' "
                           "(or pip install onnx onnxruntime)") from None


# Attention is exported as ONNX's fused pattern of torch's scaled_dot_product_attention, which the exporter
# writes from opset 14 on; below it stops with UnsupportedOperatorError (opsets 10-13) or a dynamic-Slice error.
MIN_OPSET = 14


def supported_opsets() -> range:
    """The opsets ``export_onnx`` can write: from ``MIN_OPSET`` to the newest the installed torch's TorchScript
    exporter writes (torch.onnx's ``ONNX_MAX_OPSET`` is the dynamo exporter's; above its own newest the TorchScript
    one warns that the opset is not supported)."""
    from torch.onnx import _constants

    return range(MIN_OPSET, _constants.ONNX_TORCHSCRIPT_EXPORTER_MAX_OPSET + 1)


def export_onnx(model_dir: str | Path, out: str | Path, *, opset: int = 17, overwrite: bool = False,
                verify: bool = True) -> dict[str, Any]:
    """Write the checkpoint in ``model_dir`` (encoder and head) as one ONNX file with dynamic batch and
    sequence axes; returns a summary. With ``verify`` and onnxruntime installed, the file is run on a batch
    of another size and length than the traced one, and the largest difference from bertkit's outputs is
    reported (and must be < 1e-4).
    """
    from bertkit.outputs import atomic_target
    from bertkit.runs import refuse_existing_file
    from bertkit.tokenization import BertTokenizer

    out = file_to_write(out)
    refuse_existing_file(out, overwrite, inputs={"model": model_dir})  # never a file of the model itself
    _require_onnx()
    opsets = supported_opsets()
    if not is_whole(opset) or opset not in opsets:  # 17.0 is in range(14, 21), and fails inside the exporter
        raise BertkitError(f"--opset {opset!r} is not one bertkit can export: the supported opsets are {opsets.start} "
                           f"to {opsets.stop - 1} (from {MIN_OPSET}, the first with the attention operator, to the "
                           f"newest this torch {torch.__version__}'s TorchScript exporter writes)")
    listed = read_modules(Path(model_dir)) or []
    encoder = Path(model_dir) / encoder_path(listed)  # 0_Transformer/ in sentence-transformers' older layout
    model = load_for_export(encoder)
    tokenizer = BertTokenizer.from_pretrained(encoder)
    wrapper = TupleOutputModel(model).eval()
    inputs = example_inputs(model, tokenizer)
    t0 = time.perf_counter()
    checked: dict[str, Any] = {}

    def check(path: Path) -> None:
        """The new file, still under its temporary name: an existing ``out`` is replaced only once this passes."""
        if verify:
            checked.update(_verify(path, out, wrapper, example_inputs(model, tokenizer, CHECK_TEXTS)))

    with atomic_target(out, verify=check) as tmp:
        _write_graph(tmp, wrapper, inputs, _dynamic_axes(model, wrapper, inputs), opset)
    # a sentence-transformers directory's other modules (pooling, Dense, Normalize, SPLADE pooling) run after the
    # graph: named, so that its outputs are not taken for the model's embeddings
    outside = [f"{m.get('path')} ({kind})" for m, kind in zip(listed[1:], module_types(listed)[1:])]
    return {"onnx": str(out), "model_class": type(model).__name__, "inputs": list(INPUT_NAMES),
            "outputs": list(wrapper.output_names), "opset": opset, "bytes": out.stat().st_size,
            "seconds": round(time.perf_counter() - t0, 1), **checked, **({"not_in_graph": outside} if outside else {})}


def _dynamic_axes(model: nn.Module, wrapper: TupleOutputModel,
                  inputs: tuple[Tensor, ...]) -> dict[str, dict[int, str]]:
    """The axes left free in the graph: every input's batch and sequence (and choices, for multiple choice); each
    output's batch, and its sequence unless it has one vector per input (the pooler, a sequence's logits)."""
    axes = {0: "batch", 1: "choices", 2: "sequence"} if inputs[0].dim() == 3 else {0: "batch", 1: "sequence"}
    dynamic_axes = {name: axes for name in INPUT_NAMES}
    for name in wrapper.output_names:
        dynamic_axes[name] = {0: "batch"} if name in ("pooler_output", "seq_relationship_logits") or (
            name == "logits" and type(model).__name__ in ("BertForSequenceClassification", "BertForMultipleChoice",
                                                          "BertForNextSentencePrediction")) else {0: "batch", 1: "sequence"}
    return dynamic_axes


def _write_graph(tmp: Path, wrapper: TupleOutputModel, inputs: tuple[Tensor, ...],
                 dynamic_axes: dict[str, dict[int, str]], opset: int) -> None:
    """Trace ``wrapper`` on ``inputs`` into the ONNX file ``tmp``."""
    with torch.no_grad(), warnings.catch_warnings():
        # Tracing turns shape arithmetic into Python ints and says so; the graph keeps the shapes symbolic
        # (verified on other shapes), so the warnings would only alarm the user.
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        # The TorchScript-based exporter: it needs only torch (the torch.export-based one needs onnxscript)
        # and writes one self-contained file.
        torch.onnx.export(wrapper, inputs, str(tmp), input_names=list(INPUT_NAMES),
                          output_names=list(wrapper.output_names), dynamic_axes=dynamic_axes, opset_version=opset,
                          dynamo=False)


def _verify(path: Path, out: Path, wrapper: TupleOutputModel, check: tuple[Tensor, ...]) -> dict[str, Any]:
    """Run the graph at ``path`` on ``check`` (other shapes than the traced ones) against bertkit; raise if it
    is wrong (``out``, if it exists, then stays as it was)."""
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        return {"verified": "skipped: onnxruntime not installed (pip install onnxruntime)"}
    diff = max_abs_difference(path, wrapper, check)
    if not diff < 1e-4:
        kept = f" ({out} was left as it was)" if out.exists() else ""
        raise BertkitError(f"{out}: onnxruntime's outputs differ from bertkit's by {diff:.2e} (limit 1e-4); "
                           f"the export is wrong: please report it with the model's config.json{kept}")
    return {"verified_max_abs_diff": diff}


def max_abs_difference(path: str | Path, wrapper: TupleOutputModel, inputs: tuple[Tensor, ...]) -> float:
    """Largest |onnxruntime - bertkit| over all outputs, at real (unpadded) positions."""
    import onnxruntime as ort

    with torch.no_grad():
        ours = wrapper(*inputs)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    theirs = session.run(None, {n: t.numpy() for n, t in zip(INPUT_NAMES, inputs)})
    mask = inputs[2].bool()
    diffs = []
    for a, b in zip(ours, theirs):
        b = torch.from_numpy(b)
        if a.dim() >= 2 and a.shape[:2] == mask.shape:
            a, b = a[mask], b[mask]
        diffs.append(float((a - b).abs().max()))
    return max(diffs)
