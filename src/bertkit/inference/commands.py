"""Settings of the inference-side commands (``bertkit export onnx``, ``bertkit convert-tf-checkpoint``).

Plain dataclasses in the form ``cli.py`` derives flags from: one field, one flag, help from the string
under the field.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal


def _aliases(*names: str, default=None):
    meta = {"aliases": names}
    return field(metadata=meta) if default is None else field(default=default, metadata=meta)


@dataclass(kw_only=True)
class ExportOnnxSettings:
    """Write a checkpoint (encoder and its head) as one ONNX file with dynamic batch and sequence axes;
    checked against bertkit's own outputs with onnxruntime when it is installed."""

    model: Path
    """Checkpoint directory (config.json, model.safetensors, vocab.txt); its 'architectures' picks the head."""
    output_file: Path = _aliases("--out")
    """The .onnx file to write."""
    opset: int = 17
    """ONNX opset version."""
    verify: bool = True
    """Run the file in onnxruntime (if installed) and require outputs within 1e-4 of bertkit's."""
    overwrite: bool = False
    """Replace an existing output file."""


@dataclass(kw_only=True)
class ConvertTfSettings:
    """Convert a google-research/bert TensorFlow checkpoint (pre-training heads included) to the Hugging Face
    layout bertkit and transformers read. No TensorFlow needed."""

    tf_checkpoint: Path
    """Checkpoint prefix, e.g. uncased_L-12_H-768_A-12/bert_model.ckpt (beside .index and .data-* files)."""
    bert_config: Path = _aliases("--config", "--bert-config-file")
    """The checkpoint's bert_config.json."""
    vocab: Path = _aliases("--vocab-file")
    """The checkpoint's vocab.txt."""
    output_dir: Path = _aliases("--out")
    """Directory to write config.json, model.safetensors, vocab.txt and tokenizer_config.json to."""
    do_lower_case: Literal["auto", "true", "false"] = "auto"
    """Lower-case input text (uncased models); auto: guessed from the vocabulary (uncased ones have no capitals)."""
    overwrite: bool = False
    """Replace what an earlier bertkit run wrote to the output directory (only files bertkit recorded there)."""
