"""Settings of the commands that apply a model: ``predict``, ``extract-features``, ``serve``, ``quantize``,
``export onnx`` and ``convert-tf-checkpoint``."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Literal

from bertkit.errors import BertkitError, file_to_write, read_json_object
from bertkit.settings.fields import (
    Int8Settings,
    OverwriteSettings,
    ProgressSettings,
    Settings,
    SquadWindowSettings,
    at_least_one,
    between,
    flag,
    in_range,
    non_negative,
    positive,
    redefault,
)
from bertkit.tasks.files import MAX_LINE_BYTES, SUFFIXES

# A pipeline's shortest sequence (its [CLS] and [SEP] and a little text): refused here, before a model loads
pipeline_length = in_range(lambda v: v >= 8, "at least 8 (a pipeline's shortest sequence)")


def json_lines_name(name: str, path: Path) -> None:
    """predict writes JSON lines: a name whose suffix says another format that bertkit reads (preds.csv, .tsv, .txt)
    would hold JSON lines unannounced, and read back as that format (each line one CSV row or one text)."""
    fmt = SUFFIXES.get(path.suffix.lower())
    if fmt not in (None, "jsonl"):
        raise BertkitError(f"{name} {path}: predict writes JSON lines (one object per input), not {fmt}; name the "
                           f"file {path.with_suffix('.jsonl').name}")


@dataclass(kw_only=True)
class EmbeddingSettings(Settings):
    """How the embedding tasks embed, for `bertkit predict` and `bertkit serve` alike (TEI's launcher's --pooling
    and --default-prompt-name); another task refuses them (``files.refuse_unread``)."""

    pooling: Literal["auto", "mean", "cls"] = "auto"
    """feature-extraction / sentence-embedding: how token states become one vector (auto: as a
    sentence-transformers directory's 1_Pooling says, else mean)."""
    prompt_name: str | None = None
    """feature-extraction / sentence-embedding: the prompt of the sentence-transformers directory's prompts put before
    each text (default: its default prompt), as SentenceTransformer(default_prompt_name=...); serve: a request's own
    prompt_name wins. predict sparse-embedding: "document" (SparseEncoder.encode_document's vectors, the default) or
    "query" (encode_query's: the query prompt, an inference-free model's query route)."""


@dataclass(kw_only=True)
class PredictBenchmarkSettings(OverwriteSettings, Int8Settings):
    """Shared by `predict glue|ner|squad|swag`: a fine-tuned checkpoint over a benchmark file, written in the files
    the finetune recipe writes (and scored when the file holds gold answers)."""

    model_name_or_path: Path = flag(aliases=("--model",))
    """A fine-tuned checkpoint (e.g. OUTPUT_DIR/model or OUTPUT_DIR/best of a `bertkit finetune` run)."""
    output_dir: Path = flag(aliases=("--out",))
    """Directory for the prediction files (or the GLUE submission file) and report.json."""
    max_seq_length: int | None = flag(None, check=at_least_one)
    """Tokens per input; longer inputs are truncated (SQuAD: windowed; NER: split into windows at word boundaries).
    Default: the length the checkpoint was fine-tuned at (config.json's max_seq_length, which `bertkit finetune`
    records), else finetune's default (128; SQuAD 384)."""
    batch_size: int = flag(64, check=at_least_one)
    """Sequences per batch."""
    max_predict_samples: int | None = flag(None, check=at_least_one)
    """Predict only the first N examples (sentences, questions)."""
    FINETUNE_LENGTH: ClassVar[int] = 128  # finetune's default length for the task, for a checkpoint recording none

    def take_fine_tuned_length(self, config: Path) -> None:
        """Set max_seq_length, when not given, to the length the checkpoint was fine-tuned at (``config``'s
        ``max_seq_length``), else to ``FINETUNE_LENGTH``: a model predicted at another length than it was trained and
        scored at gives other predictions than its finetune report's without a word."""
        if self.max_seq_length is not None:
            return
        recorded = read_json_object(config, "re-save the checkpoint").get("max_seq_length")
        if recorded is not None and not (isinstance(recorded, int) and not isinstance(recorded, bool) and recorded >= 1):
            raise BertkitError(f"{config}'s max_seq_length is {recorded!r}, not a positive whole number: correct it "
                               "(the length the model was fine-tuned at), or pass --max-seq-length")
        self.max_seq_length = recorded or self.FINETUNE_LENGTH
        self.__post_init__()  # the checks that need the length (SQuAD's room for context), now that it is known


@redefault(batch_size=128)
class PredictGlueSettings(PredictBenchmarkSettings):
    """Predict a GLUE split with a fine-tuned checkpoint and write the GLUE-submission TSV. The checkpoint's outputs
    are read by its config.json id2label when it names the task's labels, in any order or case (as run_glue.py reads
    them), else in output order as the task's labels sorted, as Hugging Face's GLUE processors list them (MNLI and AX:
    contradiction, entailment, neutral; the `datasets` glue config lists MNLI's as entailment, neutral, contradiction,
    so a LABEL_0..2 model trained on that is misread)."""

    task: str
    """cola, sst2, mrpc, stsb, qqp, mnli, mnli-mm (MNLI's mismatched files), qnli, rte, wnli or ax (the diagnostic
    set, with an MNLI model)."""
    data_dir: Path
    """The GLUE root holding SST-2/, MRPC/, ..."""
    split: Literal["test", "dev"] = "test"
    """The file to predict; dev also prints its scores."""


@dataclass(kw_only=True)
class PredictNerSettings(PredictBenchmarkSettings):
    """Tag a CoNLL file (word ... tag per line) with a fine-tuned NER checkpoint: predictions.txt in
    conlleval's input format (word gold pred) and conlleval's scores against the file's tags."""

    data_file: Path = flag(aliases=("--input",))
    """The CoNLL file (e.g. test.txt); its last column is the gold tag (write O where unknown)."""
    tag_scheme: Literal["iob1", "iob2"] = "iob2"
    """The file's tagging scheme."""


@dataclass(kw_only=True)
class PredictSquadSettings(PredictBenchmarkSettings, SquadWindowSettings):
    """Answer a SQuAD JSON file with a fine-tuned QA checkpoint: predictions.json and nbest_predictions.json
    (null_odds.json for 2.0) in run_squad.py's formats, and the official scores where answers are given."""

    predict_file: Path = flag(aliases=("--input",))
    """The SQuAD JSON (dev-v1.1.json, dev-v2.0.json, or your own in that format)."""
    FINETUNE_LENGTH: ClassVar[int] = 384
    null_threshold: float = flag(0.0, check=in_range(math.isfinite, "a finite number"))  # as serve's null_threshold
    """2.0: predict no answer when the null score beats the best span by more than this (finetune squad's
    report gives the threshold chosen on dev)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.null_threshold != 0.0 and self.version != "2.0":  # v1.1 answers every question: it would change nothing
            raise BertkitError(f"--null-threshold {self.null_threshold} sets when to predict no answer, which only "
                               f"--version 2.0 does (version {self.version} answers every question): add --version "
                               "2.0, or drop --null-threshold")


@dataclass(kw_only=True)
class PredictSwagSettings(PredictBenchmarkSettings):
    """Score the four endings of every row of a swagaf CSV with a fine-tuned multiple-choice checkpoint:
    predictions.jsonl (as finetune swag writes it) and accuracy when the file has labels."""

    predict_file: Path = flag(aliases=("--input",))
    """val.csv (scored) or test.csv (predicted only), in swagaf's columns."""


@dataclass(kw_only=True)
class ResumableFileSettings(OverwriteSettings):
    """For commands whose output file is written row by row: whether a run cut short is continued."""

    resume: bool = flag(False, how_to_run=True)
    """Continue the run into --output-file that a kill, Ctrl-C or an error cut short: the rows it finished (kept
    beside the file, in .NAME.bertkit-partial) are kept and the run goes on from the first unfinished one, the file
    the bytes of an uninterrupted run. Refused when the settings, the input file (its size and modification time)
    or the model's files differ from that run's."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.resume and self.overwrite:  # either winning quietly would do what one of them did not ask
            raise BertkitError("--resume and --overwrite are both set: --resume continues the run cut short into "
                               "--output-file, --overwrite starts it again (the rows it wrote are removed); choose one")


@dataclass(kw_only=True)
class ExtractSettings(ResumableFileSettings, ProgressSettings, Int8Settings):
    """Per-token hidden states of chosen layers (google-research/bert's extract_features.py)."""

    model_name_or_path: Path = flag(aliases=("--model",))
    """Checkpoint directory (any head: the encoder is used)."""
    input: Path
    """One text per line, or 'text_a ||| text_b' pairs."""
    output_file: Path = flag(aliases=("--out",), parse=file_to_write)
    """FILE.jsonl (google's format) or FILE.safetensors."""
    layers: tuple[int, ...] = (-1, -2, -3, -4)
    """Hidden states to write: 0 = embeddings .. L = last, negative from the end (e.g. -1,-2)."""
    max_seq_length: int | None = flag(None, check=at_least_one)
    """Tokens per input; longer inputs are truncated (default: a sentence-transformers directory's max_seq_length,
    which a larger value is refused over; else 128, google's)."""
    prompt_name: str | None = None
    """A sentence-transformers directory's prompt put before each text (default: its default prompt, if any)."""
    batch_size: int = flag(32, check=at_least_one)
    """Sequences per batch."""
    dtype: Literal["float32", "float16"] = "float32"
    """Value type of the written states (float16: rounded so, in .jsonl as in .safetensors)."""
    ddp_timeout: float = flag(1800.0, check=positive)
    """Under torchrun: seconds a process waits for the others before the run stops with an error."""

    def __post_init__(self) -> None:
        if not self.layers:
            raise BertkitError("layers: give at least one layer index (e.g. --layers=-1)")
        super().__post_init__()
        if self.output_file.suffix not in (".jsonl", ".safetensors"):  # before an existing file's --overwrite advice
            raise BertkitError(f"output {self.output_file} must end in .jsonl (google's JSON lines) or .safetensors "
                               "(tensors)")


@dataclass(kw_only=True)
class ExportOnnxSettings(OverwriteSettings):
    """Write a checkpoint (encoder and its head) as one ONNX file with dynamic batch and sequence axes;
    checked against bertkit's own outputs with onnxruntime when it is installed."""

    model: Path
    """Checkpoint directory (config.json, model.safetensors, vocab.txt); its 'architectures' picks the head."""
    output_file: Path = flag(aliases=("--out",), parse=file_to_write)
    """The .onnx file to write."""
    opset: int = 17
    """ONNX opset version."""
    verify: bool = True
    """Run the file in onnxruntime (if installed) and require outputs within 1e-4 of bertkit's."""


@dataclass(kw_only=True)
class QuantizeSettings(OverwriteSettings):
    """Write a checkpoint as an int8 model directory (x86 CPUs): the encoder's projections as int8 weights with
    their scales, calibrated once here, so predict, serve, extract-features and pipelines load it in int8
    without quantizing at every start, from a smaller file (docs/inference.md, section int8)."""

    model: Path = flag(aliases=("--model-name-or-path",))
    """Float checkpoint directory (config.json, model.safetensors, vocab.txt); its 'architectures' picks the head."""
    output_dir: Path = flag(aliases=("--out",))
    """Directory to write config.json, model.int8.safetensors and the tokenizer files to."""
    calibration_file: Path | None = None
    """A text file, one sentence per line (a few hundred, like the inputs), to calibrate on. Default: 64 built-in
    English sentences."""
    max_seq_length: int | None = flag(None, check=in_range(lambda v: v >= 3, "at least 3 (a word of each "
                                                                              "calibration text, [CLS] and [SEP])"))
    """Calibration sentences are cut to this many tokens (default: a sentence-transformers directory's
    max_seq_length, where its pipelines cut texts, which a larger value is refused over; else 128)."""


@dataclass(kw_only=True)
class ConvertTfSettings(OverwriteSettings):
    """Convert a google-research/bert TensorFlow checkpoint (pre-training heads included) to the Hugging Face
    layout bertkit and transformers read. No TensorFlow needed."""

    tf_checkpoint: Path
    """Checkpoint prefix, e.g. uncased_L-12_H-768_A-12/bert_model.ckpt (beside .index and .data-* files)."""
    bert_config: Path = flag(aliases=("--bert-config-file",))
    """The checkpoint's bert_config.json."""
    vocab: Path = flag(aliases=("--vocab-file",))
    """The checkpoint's vocab.txt."""
    output_dir: Path = flag(aliases=("--out",))
    """Directory to write config.json, model.safetensors, vocab.txt and tokenizer_config.json to."""
    do_lower_case: bool | None = None
    """Lower-case input text (uncased models). Default: guessed from the vocabulary (uncased ones have no capitals)."""


@dataclass(kw_only=True)
class PredictFileSettings(ResumableFileSettings, ProgressSettings, Int8Settings, EmbeddingSettings):
    """Apply a model to your own file (JSONL, CSV/TSV with a header, or one text per line) -> JSONL, one
    record per input in input order."""

    task: str = flag("", cli=False)
    """The pipeline task: set by the command's name (``bertkit predict text-classification``)."""
    model_name_or_path: Path = flag(aliases=("--model",))
    """Checkpoint directory (config.json, model.safetensors, vocab.txt) with the task's head."""
    input: Path
    """Inputs: .jsonl (objects, or strings), .csv/.tsv (a header row naming the columns) or .txt (one per line)."""
    input_format: Literal["auto", "jsonl", "csv", "tsv", "text"] = "auto"
    """How to read --input; auto: by its suffix (.jsonl/.json/.ndjson, .csv, .tsv, .txt; another is an error)."""
    output_file: Path = flag(aliases=("--out",), parse=file_to_write, check=json_lines_name)
    """The JSONL file to write: {"id": ..., <the pipeline's result>} per input."""
    text_column: str = "text"
    """Column (CSV/TSV) or field (JSONL) holding the text."""
    text_pair_column: str | None = None
    """Column holding the second text of a pair (sentence-pair classification, e.g. MRPC); unset, a column named
    text_pair is (transformers' key)."""
    query_column: str = "query"
    """rerank: the query's column (the passage is in --text-column)."""
    question_column: str = "question"
    """question-answering: the question's column."""
    context_column: str = "context"
    """question-answering / multiple-choice: the context's column."""
    choices_column: str = "choices"
    """multiple-choice: the choices (a JSON list of strings; in CSV/TSV a cell holding one)."""
    id_column: str | None = None
    """Column copied to each output record's id (default: the input's 0-based position)."""
    max_line_bytes: int = flag(MAX_LINE_BYTES, check=at_least_one)
    """The longest line (CSV: record) --input may hold, in bytes; a longer one stops the run naming it."""
    batch_size: int = flag(32, check=at_least_one)
    """Sequences per batch (inputs are grouped by length, so batches carry little padding)."""
    max_length: int | None = flag(None, check=pipeline_length)
    """Tokens per sequence (default: the tokenizer's model_max_length capped at the model's positions, or a
    sentence-transformers directory's max_seq_length); texts are truncated, QA contexts windowed."""
    top_k: int | None = flag(None, check=at_least_one)
    """fill-mask: tokens per [MASK] (default 5); question-answering: answers per question (default 1, at most 20, the
    SQuAD recipe's n-best): the pipeline's defaults."""
    targets: tuple[str, ...] | None = None
    """fill-mask: comma list of the tokens to rank alone (transformers' targets: each scored by its probability over
    the vocabulary; a text that is no token is its first word piece)."""
    aggregation_strategy: Literal["first", "average", "max"] = "first"
    """token-classification: how a word of several pieces is tagged (transformers' aggregation_strategy: its first
    piece's tag, as NER models are trained; the mean of its pieces' probabilities; its surest piece's tag)."""
    stride: int | None = flag(None, check=non_negative)
    """token-classification: tag a text past --max-length whole, in windows of --max-length tokens sharing this many
    (transformers' stride; below --max-length - 2). Default: only a text's first --max-length tokens are tagged."""
    raw_scores: bool = False
    """rerank: write the cross-encoder's logit (l1 - l0 for two labels) instead of its sigmoid."""
    return_tokens: bool = False
    """sparse-embedding: write (token, value) pairs, the largest first, instead of (index, value) pairs."""


@dataclass(kw_only=True)
class RequestLimits(Settings):
    """What one request to ``bertkit serve`` may be and cost (the server's ``serve_wire.Limits``)."""

    max_items: int = flag(64, check=at_least_one)
    """Inputs per request (more: 422)."""
    max_text_chars: int = flag(20_000, check=at_least_one)
    """Characters per input, all its texts together (more: 422)."""
    max_body_bytes: int = flag(1_000_000, check=at_least_one)
    """Request body size (more: 413)."""
    max_concurrent_requests: int = flag(64, check=at_least_one)
    """Inputs admitted and not yet answered; a request that would go over gets 429 with Retry-After at once (size it
    as your model's inputs/s times the longest wait you accept: docs/inference.md, Limits)."""
    max_json_depth: int = flag(16, check=at_least_one)
    """Nesting of lists and objects in a request body (deeper: 413, refused before the JSON is parsed)."""
    max_windows_per_request: int = flag(256, check=at_least_one)
    """Model sequences one request may cost: question-answering windows, fill-mask [MASK] tokens, one per input
    otherwise (more: 422); one model call carries at most this many too."""
    max_top_k: int = flag(100, check=at_least_one)
    """top_k of any task: candidates per [MASK] (fill-mask), answers per question, labels (more: 422)."""
    max_candidates: int = flag(1000, check=at_least_one)
    """Candidates one answer may hold over all its inputs: fill-mask top_k x [MASK]s, question-answering top_k x
    questions (more: 422)."""
    body_timeout_s: float = flag(10.0, check=positive)
    """Seconds a request's body may take to arrive once its headers have (slower: 408, connection closed)."""

    def __post_init__(self) -> None:
        """Refuse limits that together would refuse every request of the largest allowed size."""
        super().__post_init__()
        if self.max_windows_per_request < self.max_items:
            raise BertkitError(f"max_windows_per_request {self.max_windows_per_request} is below max_items "
                               f"{self.max_items}: every input costs at least one model sequence, so a request of "
                               "max_items inputs would be refused; raise --max-windows-per-request or lower "
                               "--max-items")
        if self.max_items > self.max_concurrent_requests:
            raise BertkitError(f"max_items {self.max_items} exceeds max_concurrent_requests "
                               f"{self.max_concurrent_requests}: a request that large could never be admitted; "
                               "raise --max-concurrent-requests or lower --max-items")


@dataclass(kw_only=True)
class ServeSettings(RequestLimits, Int8Settings, EmbeddingSettings):
    """Serve a model's pipeline over HTTP (FastAPI + uvicorn; pip install "bertkit[serve]")."""

    model_name_or_path: Path = flag(aliases=("--model",))
    """Checkpoint directory with the task's head (config.json, model.safetensors, vocab.txt)."""
    task: str
    """The pipeline to serve, one of the served tasks (bertkit.inference.tasks; rerank: a cross-encoder, a sequence
    classifier with one logit or two labels)."""
    host: str = "127.0.0.1"
    """Address to listen on (0.0.0.0: every interface)."""
    port: int = flag(8000, check=between(0, 65535))
    """TCP port."""
    max_batch_size: int = flag(32, check=at_least_one)
    """Inputs gathered from concurrent requests into one model call."""
    max_wait_ms: float = flag(5.0, check=between(0, 10_000))
    """How long the first waiting request waits for others to join its batch."""
    max_batch_tokens: int = flag(16_384, check=at_least_one)
    """Padded tokens one model call may carry (its sequences x the longest; TEI's name and default): 32 sequences
    of 512 tokens, or more of shorter ones (up to --max-batch-size inputs). A request with more runs alone."""
    graceful_shutdown_s: float = flag(30.0, check=non_negative)
    """On SIGTERM, how long admitted requests may take to finish before the server stops anyway: a deadline for
    every connection (requests still open then are cut off) and for the model call under way."""
    max_length: int | None = flag(None, check=pipeline_length)
    """Tokens per sequence (default: the tokenizer's model_max_length capped at the model's positions, or a
    sentence-transformers directory's max_seq_length); texts are truncated, QA contexts windowed."""
    log_level: Literal["critical", "error", "warning", "info", "debug"] = "info"
    """uvicorn's log level."""
    served_model_name: str | None = None
    """The model's name in OpenAI answers (``model``) and /info (``model_id``), which then do not show the model's
    path; default: --model-name-or-path."""
    api_key: str | None = field(default=None, repr=False, metadata=flag().metadata)
    """Every route but /health then needs the header ``Authorization: Bearer KEY`` (401 otherwise). Prefer the
    environment variable BERTKIT_API_KEY, which keeps the key out of process listings (this flag wins over it).
    An empty key from either is refused: it would leave the routes open."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.host or self.host != self.host.strip() or not self.host.isprintable():
            # uvicorn binds "" to every interface: a templated but unset --host "$HOST" must not open the server
            raise BertkitError(f"host {self.host!r} is not an address: give 127.0.0.1 (this machine only) or "
                               "0.0.0.0 (every interface), without spaces")
        if self.api_key is not None:
            check_api_key(self.api_key, "--api-key")
        if self.served_model_name is not None:
            check_served_name(self.served_model_name, "--served-model-name")


API_KEY_VARIABLE = "BERTKIT_API_KEY"


def check_api_key(key: str, source: str) -> None:
    """Refuse an API key that no ``Authorization: Bearer <key>`` header can carry, naming where it came from
    (``source``). An empty one above all: a secret templated but unset must not leave every route open."""
    if not (key.strip() and key.isprintable() and key.isascii() and " " not in key):
        what = "empty" if not key.strip() else "not printable ASCII without spaces"
        raise BertkitError(f"the API key from {source} is {what}; give a key of printable ASCII without spaces (it "
                           f"is sent as Authorization: Bearer <key>), or remove {source} to serve without one")



def check_served_name(name: str, source: str) -> None:
    """Refuse a served model name that is empty (answers would show the model's path in its place) or holds
    characters an answer's JSON or a log line should not carry."""
    if not (name.strip() and name.isprintable()):
        raise BertkitError(f"the served model name from {source} ({name!r}) is empty or not printable: answers would "
                           f"name the model by its path; give a name, or remove {source} to show the path")
