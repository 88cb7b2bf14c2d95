"""Calibration and smoothing: the texts and batches int8 is calibrated on, and SmoothQuant's factors from them.

``calibration_batches`` turns texts into encoder batches (``read_calibration_file`` reads them from a file,
one a line); ``activation_absmax`` runs the float encoder over them and records each projection input's
per-channel max |x|; ``smoothing_scale`` turns that into SmoothQuant's factors s_j (Xiao et al. 2023,
section 4.1), which ``quantize_int8`` moves from the activations into the weights.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import torch
from torch import Tensor, nn

from bertkit.errors import BertkitError, MissingFileError, NonFiniteError, is_whole
from bertkit.modeling import BertModel
from bertkit.quantization.kernels import SMOOTHING_BOUND
from bertkit.quantization.projections import get_projection
from bertkit.tokenization import BertTokenizer
from bertkit.tokenization.encoding import segment_ids
from bertkit.tokenization.textfiles import refuse_compressed_format, refuse_record_file


def smoothing_scale(act_absmax: Tensor, weight: Tensor, alpha: float) -> Tensor:
    """SmoothQuant's per-input-channel factor s_j = max|X_j|^alpha / max|W_j|^(1 - alpha) (section 4.1)."""
    w = weight.detach().abs().amax(0).clamp(min=1e-5)  # (in,)
    return (act_absmax.clamp(min=1e-5) ** alpha / w ** (1 - alpha)).clamp(1 / SMOOTHING_BOUND, SMOOTHING_BOUND)


@torch.inference_mode()
def activation_absmax(encoder: BertModel, calibration: Iterable[Mapping[str, Tensor]],
                      targets: list[tuple[int, str]]) -> dict[tuple[int, str], Tensor]:
    """Per-input-channel max |x| entering each target projection over the calibration batches (each a dict
    with ``input_ids`` and ``attention_mask``, optionally ``token_type_ids``; computed in the unpadded layout, so
    the statistics are over real tokens only). A NaN or an infinity there is refused (``NonFiniteError``, its
    ``index`` the row over all batches): clamped, an infinity became the largest smoothing factor and a NaN a NaN
    scale, and ``bertkit quantize`` wrote either to the int8 file as if measured."""
    stats: dict[tuple[int, str], Tensor] = {}
    rows = 0
    for batch in calibration:
        if not isinstance(batch, Mapping) or "input_ids" not in batch or "attention_mask" not in batch:
            raise BertkitError("each calibration batch must be a dict with input_ids and attention_mask "
                               "(and optionally token_type_ids): use calibration_batches(tokenizer, texts)")
        measured = _batch_absmax(encoder, batch, targets)
        if not all(bool(torch.isfinite(m).all()) for m in measured.values()):
            _refuse_overflow(encoder, batch, targets, rows)
        stats = measured if not stats else {k: torch.maximum(stats[k], measured[k]) for k in stats}
        rows += len(batch["input_ids"])
    if rows == 0:
        raise BertkitError("calibration holds no batches; pass calibration_batches(tokenizer, texts) with a few "
                           "hundred texts like the ones the model will see")
    return stats


def _batch_absmax(encoder: BertModel, batch: Mapping[str, Tensor],
                  targets: list[tuple[int, str]]) -> dict[tuple[int, str], Tensor]:
    stats: dict[tuple[int, str], Tensor] = {}
    hooks = []
    for i, kind in targets:
        def record(module: nn.Module, inputs: tuple[Tensor, ...], output: Tensor, key=(i, kind)) -> None:
            x = inputs[0].detach().reshape(-1, inputs[0].size(-1)).abs().amax(0).float()  # (in,)
            stats[key] = x if key not in stats else torch.maximum(stats[key], x)
        layer = encoder.encoder.layer[i]
        # q, k and v read the same input, which is attention.self's (the three may run as one GEMM, unhooked).
        hooked = layer.attention.self if kind == "qkv" else get_projection(layer, kind)
        hooks.append(hooked.register_forward_hook(record))
    was_training = encoder.training
    encoder.eval()
    try:
        # Named, not "auto": the hooks above would keep the padded rectangle and count padding's activations
        encoder(batch["input_ids"], batch["attention_mask"], batch.get("token_type_ids"), layout="unpadded")
    finally:
        for h in hooks:
            h.remove()
        encoder.train(was_training)
    return stats


def _refuse_overflow(encoder: BertModel, batch: Mapping[str, Tensor], targets: list[tuple[int, str]],
                     rows_before: int) -> None:
    """Raise for the first row of ``batch`` whose activations are not finite, each row run alone (the unpadded
    layout keeps no row order to read it from the batch's)."""
    for r in range(len(batch["input_ids"])):
        one = {k: v[r:r + 1] for k, v in batch.items() if isinstance(v, Tensor)}
        keep = one["attention_mask"][0].bool()
        one = {k: v[:, keep] for k, v in one.items()}
        measured = _batch_absmax(encoder, one, targets)
        bad = next((k for k in targets if k in measured and not bool(torch.isfinite(measured[k]).all())), None)
        if bad is None:
            continue
        values = measured[bad][~torch.isfinite(measured[bad])]
        shown = "NaN" if bool(values.isnan().any()) else "inf"
        raise NonFiniteError(
            f"calibration input {rows_before + r}: layer {bad[0]}'s {bad[1]} input holds {shown} in the float model, "
            "so no int8 scale can be measured from it and nothing was quantized: the checkpoint's activations overflow float32 on it (weights broken, or scaled "
            "past float32's range: its float outputs are not finite either); calibrate on texts whose activations "
            "stay finite, or use a checkpoint whose outputs are finite", index=rows_before + r)
    raise NonFiniteError(f"calibration inputs {rows_before} to {rows_before + len(batch['input_ids']) - 1}: the float "
                         "model's activations are not finite on this batch, though finite on each input alone; "
                         "calibrate in smaller batches, or use a checkpoint whose outputs are finite",
                         index=rows_before)


def calibration_batches(tokenizer: BertTokenizer, texts: Sequence[str | tuple[str, str]], *, batch_size: int = 32,
                        max_length: int = 128) -> list[dict[str, Tensor]]:
    """``texts`` (strings, or (text, text_pair) tuples) as encoder input batches for ``quantize_int8``."""
    if isinstance(texts, (str, bytes)) or not isinstance(texts, Sequence):
        raise BertkitError(f"calibration texts must be a list of texts (or (text, text_pair) tuples), got "
                           f"{type(texts).__name__} {str(texts)[:60]!r}")
    # by index: a None among the texts is a bad one too (it passed as "none found", then failed in the tokenizer)
    bad = next((i for i, t in enumerate(texts) if not (isinstance(t, str) or (
        isinstance(t, tuple) and len(t) == 2 and all(isinstance(x, str) for x in t)))), None)
    if bad is not None:
        raise BertkitError(f"calibration text {bad} is {type(texts[bad]).__name__} {str(texts[bad])[:60]!r}; give "
                           "strings or (text, text_pair) tuples")
    if not texts:
        raise BertkitError("calibration_batches needs at least one text (a few hundred is right)")
    if not is_whole(batch_size):
        raise BertkitError(f"batch_size must be a positive int, got {batch_size!r}")
    specials = 3 if any(isinstance(t, tuple) for t in texts) else 2  # [CLS] a [SEP] (b [SEP])
    if is_whole(max_length, 0) and max_length <= specials:
        raise BertkitError(f"max_length {max_length} leaves no room for a word beside the {specials} special tokens; "
                           f"pass max_length {specials + 1} or more (calibration measures the activations of real text)")
    out = []
    for a in range(0, len(texts), batch_size):
        chunk = texts[a:a + batch_size]
        firsts = [t[0] if isinstance(t, tuple) else t for t in chunk]
        pairs = [t[1] for t in chunk if isinstance(t, tuple)]
        if pairs and len(pairs) != len(chunk):
            raise BertkitError("calibration texts mix single texts and (text, text_pair) pairs; give one kind")
        enc = tokenizer(firsts, pairs or None, truncation=True, max_length=max_length, padding=True,
                        return_tensors="pt")
        # Calibration measures each channel's largest activation on real text; blank texts ([CLS] [SEP] alone)
        # measure the special tokens only, and gave embeddings at cosine 0.70 to fp32's.
        words = enc["attention_mask"].sum(1) - (3 if pairs else 2)
        if bool((words == 0).any()):
            first = a + int((words == 0).nonzero()[0, 0])
            raise BertkitError(f"calibration text {first} ({texts[first]!r}) holds no word once tokenized: calibration "
                               "measures the activations of real text; remove blank texts and give a few hundred "
                               "sentences like the model's inputs")
        # the segments the model is fed: none (0) where the tokenizer's model_input_names leaves them out
        out.append({"input_ids": enc["input_ids"], "token_type_ids": segment_ids(enc),
                    "attention_mask": enc["attention_mask"]})
    return out


def read_calibration_file(path: str | Path) -> list[str]:
    """Calibration texts from a text file, one per line (blank lines skipped)."""
    path = Path(path)
    if not path.is_file():
        raise MissingFileError(f"calibration file {path} {'is a directory' if path.is_dir() else 'not found'}: give "
                               "a text file with one sentence per line, like the ones the model will see (or leave "
                               "it out for the built-in sentences)")
    refuse_record_file(path, "calibration file", "one sentence per line")
    with open(path, "rb") as f:
        refuse_compressed_format(f.read(16), path)
    try:
        lines = path.read_text(encoding="utf-8-sig").split("\n")  # a byte-order mark is no part of the first text
    except UnicodeDecodeError as e:
        raise BertkitError(f"calibration file {path} is not UTF-8 text ({e}); save it as UTF-8") from None
    # Lines end at a line break (text mode reads \r\n and \r as \n): str.splitlines would also split a sentence at a
    # form feed (a PDF's page break), U+2028 or U+0085, calibrating on its pieces.
    texts = [t for t in (line.strip() for line in lines) if t]
    if not texts:
        raise BertkitError(f"calibration file {path} holds no text; write one sentence per line (a few hundred)")
    return texts
