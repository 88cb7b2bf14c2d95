"""Settings of the inference-side commands (``bertkit predict TASK``, ``bertkit export onnx``,
``bertkit convert-tf-checkpoint``).

Plain dataclasses in the form ``cli.py`` derives flags from: one field, one flag, help from the string
under the field.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from bertkit.errors import BertkitError
from bertkit.training.settings import Int8Settings, coerce_paths


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


@dataclass(kw_only=True)
class PredictFileSettings(Int8Settings):
    """Apply a model to your own file (JSONL, CSV/TSV with a header, or one text per line) -> JSONL, one
    record per input in input order."""

    task: str = field(default="", metadata={"cli": False})
    """The pipeline task: set by the command's name (``bertkit predict text-classification``)."""
    model_name_or_path: Path = _aliases("--model")
    """Checkpoint directory (config.json, model.safetensors, vocab.txt) with the task's head."""
    input: Path
    """Inputs: .jsonl (objects, or strings), .csv/.tsv (a header row naming the columns) or .txt (one per line)."""
    input_format: Literal["auto", "jsonl", "csv", "tsv", "text"] = "auto"
    """How to read --input; auto: by its suffix (.jsonl/.json/.ndjson, .csv, .tsv, .txt; another is an error)."""
    output_file: Path = _aliases("--output", "--out")
    """The JSONL file to write: {"id": ..., <the pipeline's result>} per input."""
    text_column: str = "text"
    """Column (CSV/TSV) or field (JSONL) holding the text."""
    text_pair_column: str | None = None
    """Column holding the second text of a pair (sentence-pair classification, e.g. MRPC)."""
    question_column: str = "question"
    """question-answering: the question's column."""
    context_column: str = "context"
    """question-answering / multiple-choice: the context's column."""
    choices_column: str = "choices"
    """multiple-choice: the choices (a JSON list of strings; in CSV/TSV a cell holding one)."""
    id_column: str | None = None
    """Column copied to each output record's id (default: the input's 0-based position)."""
    batch_size: int = 32
    """Sequences per batch (inputs are grouped by length, so batches carry little padding)."""
    max_length: int | None = None
    """Tokens per sequence (default: the model's positions); texts are truncated, QA contexts windowed."""
    top_k: int = 1
    """fill-mask: tokens per [MASK]; question-answering: answers per question."""
    pooling: Literal["mean", "cls"] = "mean"
    """feature-extraction / sentence-embedding: how token states become one vector."""
    bf16: bool = False
    """bfloat16 autocast (CPUs with AVX-512 BF16 or AMX, recent GPUs)."""
    device: str = "cpu"
    """cpu, cuda or cuda:N."""
    progress: bool = True
    """Show a progress bar."""
    overwrite: bool = False
    """Replace --output-file if it exists."""

    def __post_init__(self) -> None:
        coerce_paths(self)  # str -> Path for every field typed Path (the type hints say which)
        for name in ("batch_size", "top_k"):
            if getattr(self, name) < 1:
                raise BertkitError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.output_file.resolve() == self.input.resolve():
            raise BertkitError(f"--output-file {self.output_file} is the input file; choose another name")
        self.check_int8()


@dataclass(kw_only=True)
class ServeSettings(Int8Settings):
    """Serve a model's pipeline over HTTP (FastAPI + uvicorn; pip install "bertkit[serve]")."""

    model_name_or_path: Path = _aliases("--model")
    """Checkpoint directory with the task's head (config.json, model.safetensors, vocab.txt)."""
    task: Literal["text-classification", "token-classification", "question-answering", "fill-mask",
                  "multiple-choice", "feature-extraction", "sentence-embedding"]
    """The pipeline to serve."""
    host: str = "127.0.0.1"
    """Address to listen on (0.0.0.0: every interface)."""
    port: int = 8000
    """TCP port."""
    max_batch_size: int = 32
    """Inputs gathered from concurrent requests into one model call."""
    max_wait_ms: float = 5.0
    """How long the first waiting request waits for others to join its batch."""
    max_items: int = 64
    """Inputs per request (more: 422)."""
    max_text_chars: int = 20_000
    """Characters per input, all its texts together (more: 422)."""
    max_body_bytes: int = 1_000_000
    """Request body size (more: 413)."""
    max_concurrent_requests: int = 64
    """Inputs admitted and not yet answered; a request that would go over gets 429 with Retry-After at once.
    64 is ~8 s of MiniLM work on 2 cores at 300-word texts (docs/inference.md): size it as your model's
    inputs/s times the longest wait you accept."""
    graceful_shutdown_s: float = 30.0
    """On SIGTERM, how long admitted requests may take to finish before the server stops anyway."""
    max_length: int | None = None
    """Tokens per sequence (default: the model's positions); texts are truncated, QA contexts windowed."""
    bf16: bool = False
    """bfloat16 autocast (CPUs with AVX-512 BF16 or AMX, recent GPUs)."""
    device: str = "cpu"
    """cpu, cuda or cuda:N."""
    log_level: Literal["critical", "error", "warning", "info", "debug"] = "info"
    """uvicorn's log level."""

    def __post_init__(self) -> None:
        coerce_paths(self)  # str -> Path for every field typed Path (the type hints say which)
        for name in ("max_batch_size", "max_items", "max_text_chars", "max_body_bytes", "max_concurrent_requests"):
            if getattr(self, name) < 1:
                raise BertkitError(f"{name} must be at least 1, got {getattr(self, name)}")
        if not 0 <= self.port <= 65535:
            raise BertkitError(f"port must be in [0, 65535], got {self.port}")
        if not (0 <= self.max_wait_ms <= 10_000):
            raise BertkitError(f"max_wait_ms must be in [0, 10000], got {self.max_wait_ms}")
        from bertkit.inference.serve import Limits

        Limits(self.max_body_bytes, self.max_items, self.max_text_chars, self.max_concurrent_requests)  # checks them
        if self.graceful_shutdown_s < 0:
            raise BertkitError(f"graceful_shutdown_s must be at least 0, got {self.graceful_shutdown_s}")
        self.check_int8()
