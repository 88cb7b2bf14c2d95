"""Bad input, faults and concurrency over bertkit's user-facing surfaces; prints one table row per case.

    .venv/bin/python experiments/reliability_campaign.py              # every case (about 5 minutes on 2 cores)
    .venv/bin/python experiments/reliability_campaign.py --only predict --timeout 60

Surfaces: ``bertkit predict`` on users' files, ``bertkit finetune classify`` on users' label columns,
``torchrun``, ``export onnx`` / ``convert-tf-checkpoint`` / ``merge-pretraining-data`` on corrupt or
mismatched inputs, output directories (``--overwrite`` and ``--resume`` beside users' files, received markers,
lock files, a command's own inputs), the Python API (``pipeline`` and its inputs, models, checkpoints), and ``bertkit serve``
over loopback (bad fields and parameters, bodies built to exhaust it, slow and vanishing clients). Every model is
tiny (2 layers, 32 wide, MiniLM's vocabulary from ``models/minilm``) and every file a few rows.

Each case ends in one class:

- ``ok``: the command succeeded and its result is right (checked against the Python pipeline, a count, or
  the file it must not have touched);
- ``clear-error``: refused with one line naming what is wrong (exit 2 on the command line; a
  ``BertkitError``/``ValueError`` from the Python API), nothing written, nothing lost;
- ``traceback``: any other exception, or an exit 1 with a traceback, for a mistake the user made;
- ``silent-wrong``: success with a wrong result; ``data-loss``: a user's file removed or changed;
- ``hang``: still running after ``--timeout`` seconds;
- ``resource-bound-exceeded``: a server answered, but one request cost more than its limits allow (an answer of
  megabytes, a minute of work) or left admitted work behind.

Command-line cases call ``bertkit.cli.main`` in this process (``--subprocess``: ``python -m bertkit`` in a
process each, as the shell runs it; torchrun and concurrency cases always do); Python API cases run here.
Each case runs under an alarm of ``--timeout`` seconds.
The exit status is 1 when any case is in a class that is not ``ok`` or ``clear-error``.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import hashlib
import json
import math
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
MINILM = Path(os.environ.get("BERTKIT_TEST_MODEL", ROOT / "models" / "minilm"))
GOOD = ("ok", "clear-error")


@dataclass
class Outcome:
    klass: str
    detail: str = ""


@dataclass
class Case:
    surface: str
    name: str
    fn: Callable[[Path], Outcome]


CASES: list[Case] = []


def case(surface: str, name: str):
    def register(fn: Callable[[Path], Outcome]) -> Callable[[Path], Outcome]:
        CASES.append(Case(surface, name, fn))
        return fn

    return register


class Timeout(BaseException):  # not an Exception: no handler in bertkit may swallow it
    pass


TIMEOUT = 120.0
SUBPROCESS = False
W: Path  # the campaign's working directory (fixtures live here; each case gets a fresh subdirectory)


# -------------------------------------------------------------------------------------------------
# Fixtures: tiny checkpoints of every head, built once
# -------------------------------------------------------------------------------------------------

TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
            max_position_embeddings=128)


def build_models(root: Path) -> dict[str, Path]:
    from bertkit import BertConfig
    from bertkit.heads import (
        BertForMaskedLM,
        BertForMultipleChoice,
        BertForQuestionAnswering,
        BertForSequenceClassification,
        BertForTokenClassification,
    )
    from bertkit.modeling import BertModel
    from bertkit.tokenization import BertTokenizer

    tok = BertTokenizer.from_pretrained(MINILM)
    models = {
        "clf": (BertForSequenceClassification, {"id2label": {0: "negative", 1: "positive"}}),
        "reg": (BertForSequenceClassification, {"id2label": {0: "score"}, "problem_type": "regression"}),
        "ner": (BertForTokenClassification, {"id2label": {0: "O", 1: "B-PER", 2: "I-PER"}}),
        "qa": (BertForQuestionAnswering, {}),
        "mlm": (BertForMaskedLM, {}),
        "mc": (BertForMultipleChoice, {}),
        "enc": (BertModel, {}),
    }
    out = {}
    for name, (cls, extra) in models.items():
        d = root / "models" / name
        torch.manual_seed(0)
        config = BertConfig(vocab_size=len(tok), **TINY, **extra)
        cls(config).save_pretrained(d)
        tok.save_pretrained(d)
        out[name] = d
    return out


MODELS: dict[str, Path] = {}
_PIPES: dict[str, object] = {}


def pipe(task: str, model: str):
    from bertkit import pipeline

    key = f"{task}:{model}"
    if key not in _PIPES:
        _PIPES[key] = pipeline(task, MODELS[model], progress=False)
    return _PIPES[key]


# -------------------------------------------------------------------------------------------------
# Running and classifying
# -------------------------------------------------------------------------------------------------


@dataclass
class Run:
    rc: int | None  # None: timed out
    out: str
    err: str


def bertkit(*argv: object, timeout: float | None = None, runner: tuple[str, ...] = ("-m", "bertkit"),
            env: dict | None = None) -> Run:
    """``bertkit ARGV``: in this process through ``cli.main`` (as the shell would run it, minus interpreter start),
    or as a subprocess for ``--subprocess`` and for any other ``runner`` (torchrun)."""
    if runner == ("-m", "bertkit") and not SUBPROCESS and env is None:
        return _in_process([str(a) for a in argv], timeout or TIMEOUT)
    cmd = [sys.executable, *runner, *map(str, argv)]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout or TIMEOUT, cwd=ROOT,
                           env={**os.environ, **(env or {})})
    except subprocess.TimeoutExpired as e:
        return Run(None, str(e.stdout or ""), str(e.stderr or ""))
    return Run(p.returncode, p.stdout, p.stderr)


def _in_process(argv: list[str], timeout: float) -> Run:
    import io
    import logging

    from bertkit.cli import main as cli_main

    out, err = io.StringIO(), io.StringIO()
    root = logging.getLogger()
    for h in root.handlers[:]:  # cli.main's logging.basicConfig then writes to this run's stderr
        root.removeHandler(h)

    def alarm(*_):
        raise Timeout()

    old = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc: int | None = cli_main(argv)
            except SystemExit as e:  # argparse: a bad flag
                rc = e.code if isinstance(e.code, int) else 1
            except Timeout:
                rc = None
            except Exception:  # noqa: BLE001 - what python -m bertkit would print before exiting 1
                traceback.print_exc(file=err)
                rc = 1
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        for h in root.handlers[:]:
            root.removeHandler(h)
    return Run(rc, out.getvalue(), err.getvalue())


def _last(text: str) -> str:
    lines = [x for x in text.strip().splitlines() if x.strip()]
    return lines[-1] if lines else ""


def cli_outcome(run: Run, expect: tuple[str, ...] = (), ok: Callable[[], Outcome] | None = None,
                after: Callable[[], str | None] | None = None) -> Outcome:
    """The class of a command's run: ``expect`` are substrings a clear error must hold; ``ok`` checks a success;
    ``after`` checks, whatever happened, that nothing of the user's was lost (returns what was lost, or None)."""
    lost = after() if after is not None else None
    if lost:
        return Outcome("data-loss", lost)
    if run.rc is None:
        return Outcome("hang", f"no exit after {TIMEOUT:.0f} s")
    if "Traceback (most recent call last)" in run.err or run.rc not in (0, 2):
        return Outcome("traceback", f"exit {run.rc}: {_last(run.err)[:160]}")
    if run.rc == 2:
        line = _last(run.err)
        missing = [e for e in expect if e not in run.err]
        if not line.startswith("bertkit") or missing:
            return Outcome("traceback", f"exit 2 but unclear ({'lacks ' + repr(missing) if missing else ''}): "
                                        f"{line[:160]}")
        return Outcome("clear-error", line[:200])
    if ok is None:
        return Outcome("silent-wrong", "succeeded where an error was expected")
    return ok()


def api_outcome(fn: Callable[[], object], expect: tuple[str, ...] = (),
                ok: Callable[[object], Outcome] | None = None) -> Outcome:
    """The class of a Python call: a ``ValueError`` (``BertkitError`` included) holding ``expect`` is clear."""
    def alarm(*_):
        raise Timeout()

    old = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, TIMEOUT)
    try:
        result = fn()
    except Timeout:
        return Outcome("hang", f"no return after {TIMEOUT:.0f} s")
    except ValueError as e:  # BertkitError, MissingFileError and the validators' ValueErrors
        text = str(e)
        missing = [x for x in expect if x not in text]
        if missing or "\n" in text.strip() or not text:
            return Outcome("traceback", f"{type(e).__name__} without {missing}: {text[:160]}")
        return Outcome("clear-error", f"{type(e).__name__}: {text[:200]}")
    except Exception as e:  # noqa: BLE001 - classifying every failure is the point here
        tb = traceback.extract_tb(e.__traceback__)[-1]
        return Outcome("traceback", f"{type(e).__name__} at {Path(tb.filename).name}:{tb.lineno}: {str(e)[:140]}")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    if ok is None:
        return Outcome("silent-wrong", f"returned {str(result)[:100]} where an error was expected")
    return ok(result)


def check(condition: bool, wrong: str, klass: str = "silent-wrong") -> Outcome:
    return Outcome("ok") if condition else Outcome(klass, wrong)


def write(d: Path, name: str, content: str | bytes) -> Path:
    path = d / name
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        with open(path, "w", encoding="utf-8", newline="") as f:
            f.write(content)
    return path


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines()]


# -------------------------------------------------------------------------------------------------
# predict
# -------------------------------------------------------------------------------------------------


def predict(d: Path, input_path: Path, *extra: object, task: str = "text-classification", model: str = "clf",
            out: Path | None = None) -> tuple[Run, Path]:
    out = out or d / "pred.jsonl"
    return bertkit("predict", task, "--model", MODELS[model], "--input", input_path, "--output-file", out,
                   "--no-progress", *extra), out


def same_as_pipeline(out: Path, texts: list, task: str = "text-classification", model: str = "clf"
                     ) -> Callable[[], Outcome]:
    """A success is right when the file holds one record per text, in order, equal to the pipeline's result."""
    def ok() -> Outcome:
        got = read_jsonl(out)
        want = pipe(task, model)(texts)
        if len(got) != len(texts):
            return Outcome("silent-wrong", f"{len(got)} records for {len(texts)} inputs")
        for i, (g, w) in enumerate(zip(got, want)):
            if g.get("id") != i or g.get("label") != w["label"] or not math.isclose(g["score"], w["score"],
                                                                                   abs_tol=1e-5):
                return Outcome("silent-wrong", f"record {i} is {g}, the pipeline gives {w}")
        return Outcome("ok", f"{len(got)} records equal the pipeline's")
    return ok


def unchanged(path: Path, content: bytes) -> Callable[[], str | None]:
    return lambda: None if path.is_file() and path.read_bytes() == content else f"{path.name} changed or removed"


def _predict_case(name: str, file_name: str, content: str | bytes, texts: list[str] | None,
                  expect: tuple[str, ...] = (), extra: tuple = ()):
    @case("predict", name)
    def _(d: Path) -> Outcome:
        path = write(d, file_name, content)
        run, out = predict(d, path, *extra)
        if texts is None:
            return cli_outcome(run, expect, after=lambda: f"{out.name} written by a failed run"
                               if run.rc != 0 and out.exists() else None)
        return cli_outcome(run, expect, ok=same_as_pipeline(out, texts))


_predict_case("CSV: doubled quotes and commas in a quoted field", "q.csv",
              'text\n"He said ""hi"", then left"\nplain\n', ['He said "hi", then left', "plain"])
_predict_case("CSV: a newline inside a quoted field", "nl.csv", 'text,n\n"two\nlines",1\nnext,2\n',
              ["two\nlines", "next"])
_predict_case("CSV: UTF-8 byte-order mark", "bom.csv", "\ufefftext\ngood\nbad\n", ["good", "bad"])
_predict_case("JSONL: UTF-8 byte-order mark", "bom.jsonl", '\ufeff{"text": "good"}\n{"text": "bad"}\n',
              ["good", "bad"])
_predict_case("TXT: UTF-8 byte-order mark", "bom.txt", "\ufeffgood\nbad\n", ["good", "bad"])
_predict_case("CSV: CRLF line ends", "crlf.csv", "text\r\ngood\r\n\"a\r\nb\"\r\n", ["good", "a\r\nb"])
_predict_case("TSV: CRLF line ends", "crlf.tsv", "id\ttext\r\n1\tgood\r\n2\tbad\r\n", ["good", "bad"])
_predict_case("TXT: CRLF line ends", "crlf.txt", "good\r\nbad\r\n", ["good", "bad"])
_predict_case("JSONL: CRLF line ends", "crlf.jsonl", '{"text": "good"}\r\n"bad"\r\n', ["good", "bad"])
_predict_case("TSV: a double quote is text", "quote.tsv", 'text\n"quoted" word\nit"s\n', ['"quoted" word', 'it"s'])
_predict_case("CSV: the text column missing", "nocol.csv", "review\ngood\n", None, ("no 'text' column",))
_predict_case("CSV: a row with an extra field", "ragged.csv", "text\ngood\nbad,1\n", None, ("ragged.csv:3",))
_predict_case("CSV: an unclosed quote swallowing the rest of the file", "unclosed.csv",
              'text\n"never closed\nsecond\nthird\n', None, ("unclosed.csv:2",))
_predict_case("CSV: a NUL byte in a row", "nul.csv", "text\ngood\nb\x00ad\n", None, ("nul.csv:3", "NUL byte"))
_predict_case("TSV: a NUL byte in a row", "nul.tsv", "text\ngood\nb\x00ad\n", None, ("nul.tsv:3", "NUL byte"))
_predict_case("JSONL: a NUL byte in a line", "nul.jsonl", '{"text": "good"}\n{"text": "b\x00ad"}\n', None,
              ("nul.jsonl:2", "NUL byte"))
_predict_case("TXT: a NUL byte in a line", "nul.txt", "good\nb\x00ad\n", None, ("nul.txt:2", "NUL byte"))
_predict_case("TXT: a UTF-16 file (NUL in every other byte)", "utf16.txt", "good\nbad\n".encode("utf-16"), None,
              ("utf16.txt:1", "NUL byte"))
_predict_case("an empty file", "empty.csv", "", None, ("holds no inputs",))
_predict_case("TSV: an empty file", "empty.tsv", "", None, ("holds no inputs",))
_predict_case("JSONL: an empty file", "empty.jsonl", "", None, ("holds no inputs",))
_predict_case("TXT: an empty file", "empty.txt", "", None, ("holds no inputs",))
_predict_case("CSV: a header and no rows", "header.csv", "text\n", None, ("holds no inputs",))
_predict_case("JSONL: a bad line mid-file", "bad.jsonl", '{"text": "a"}\n{"text": "b"\n{"text": "c"}\n', None,
              ("bad.jsonl:2", "not valid JSON"))
_predict_case("JSONL: a number where the text goes", "num.jsonl", '{"text": "a"}\n{"text": 5}\n', None,
              ("num.jsonl:2",))
_predict_case("JSONL: NaN where the text goes", "nan.jsonl", '{"text": NaN}\n', None, ("nan.jsonl:1",))
_predict_case("JSONL: a list on a line", "list.jsonl", '["a", "b"]\n', None, ("list.jsonl:1",))
_predict_case("TXT: only blank lines", "blank.txt", "\n\n\n", None, ("holds no inputs",))
_predict_case("TXT: only blank lines, one of whitespace", "blank_ws.txt", "\n  \n\n", None, ("blank_ws.txt:2", "whitespace"))
_predict_case("TXT: a blank line mid-file", "gap.txt", "a\n\nb\n", None, ("gap.txt:2", "blank line"))
_predict_case("not UTF-8 (Latin-1)", "latin.csv", "text\ncaf\xe9\n".encode("latin-1"), None,
              ("not UTF-8", "line 2"))
_predict_case("CSV: empty texts", "empty_text.csv", 'text,n\n"",1\n,2\n', None, ("empty_text.csv:2", "empty"))
_predict_case("CSV: a whitespace text in the last row", "ws.csv", "text,n\ngood,1\n   ,2\n", None,
              ("ws.csv:3", "only whitespace"))
_predict_case("CSV: a line of whitespace at the end (one column)", "ws1.csv", "text\ngood\n  \n", None,
              ("ws1.csv:3", "whitespace"))
_predict_case("TSV: a whitespace text in the last row", "ws.tsv", "text\tn\ngood\t1\n \t2\n", None,
              ("ws.tsv:3", "only whitespace"))
_predict_case("JSONL: a whitespace text", "ws.jsonl", '{"text": "good"}\n{"text": " \\t "}\n', None,
              ("ws.jsonl:2", "only whitespace"))
_predict_case("JSONL: a whitespace string on a line", "ws_str.jsonl", '"good"\n"  "\n', None,
              ("ws_str.jsonl:2", "only whitespace"))
_predict_case("TXT: a line of whitespace at the end", "ws.txt", "good\nbad\n \t \n", None, ("ws.txt:3", "whitespace"))
_predict_case("TXT: empty lines at the end (a file's trailing newlines)", "trail.txt", "good\nbad\n\n\r\n",
              ["good", "bad"])
_predict_case("TSV: UTF-8 byte-order mark", "bom.tsv", "\ufefftext\ngood\nbad\n", ["good", "bad"])
_predict_case("TSV: the text column missing", "nocol.tsv", "review\ngood\n", None, ("no 'text' column",))
_predict_case("JSONL: the text field missing", "nocol.jsonl", '{"review": "good"}\n', None,
              ("nocol.jsonl:1", "no 'text' field"))
_predict_case("TSV: a row with an extra field", "ragged.tsv", "text\ngood\nbad\t1\n", None, ("ragged.tsv:3",))
_predict_case("CSV: a row with a field missing", "short.csv", "text,n\ngood,1\nbad\n", None, ("short.csv:3",))
_predict_case("JSONL: an extra field (not read)", "extra.jsonl", '{"text": "good", "source": "web"}\n',
              ["good"])
for _fmt in ("csv", "tsv", "jsonl", "txt"):
    _big = {"csv": "text\n" + "w" * 2_000_000 + "\n", "tsv": "text\n" + "w" * 2_000_000 + "\n",
            "jsonl": '"' + "w" * 2_000_000 + '"\n', "txt": "w" * 2_000_000 + "\n"}[_fmt]
    _predict_case(f"{_fmt.upper()}: a 2 MB line (over the 1 MiB default --max-line-bytes)", f"huge.{_fmt}", _big, None,
                  (f"huge.{_fmt}:{2 if _fmt in ('csv', 'tsv') else 1}", "longer than 1,048,576 bytes"))
_predict_case("CSV: a quote left open over 2 MB of lines", "open.csv", 'text\n"open\n' + "more\n" * 400_000, None,
              ("open.csv:2", "longer than 1,048,576 bytes"))
_predict_case("TXT: a line over --max-line-bytes 100", "long.txt", "good\n" + "w " * 100 + "\n", None,
              ("long.txt:2", "longer than 100 bytes"), ("--max-line-bytes", "100"))
_predict_case("JSONL: text and text_pair without --text-pair-column (a single-text model: warned, first texts)",
              "pairs.jsonl", '{"text": "good", "text_pair": "bad"}\n{"text": "fine", "text_pair": "dull"}\n',
              ["good", "fine"])


@case("predict", "TXT: a 1 GB file of one line of NUL bytes (sparse)")
def _(d: Path) -> Outcome:
    path = d / "zeros.txt"
    with open(path, "wb") as f:
        f.truncate(2**30)  # sparse: no disk used, and predict must read no more than its line limit of it
    run, out = predict(d, path)
    return cli_outcome(run, ("zeros.txt:1", "NUL byte"))


@case("predict", "JSONL: pairs without --text-pair-column on a pair-trained model")
def _(d: Path) -> Outcome:
    m = copy_model(MODELS["clf"], d / "m")
    _edit_config(m, text_pair=True)
    path = write(d, "pairs.jsonl", '{"text": "good", "text_pair": "bad"}\n')
    run = bertkit("predict", "text-classification", "--model", m, "--input", path, "--output-file", d / "p.jsonl",
                  "--no-progress")
    return cli_outcome(run, ("pairs.jsonl:1", "fine-tuned on text pairs", "--text-pair-column text_pair"))


@case("predict", "CSV: sentence1,sentence2 with --text-column sentence1 on a GLUE pair model (finetuning_task mrpc)")
def _(d: Path) -> Outcome:
    m = copy_model(MODELS["clf"], d / "m")
    _edit_config(m, finetuning_task="mrpc")
    path = write(d, "mrpc.csv", "sentence1,sentence2\ngood,bad\n")
    run = bertkit("predict", "text-classification", "--model", m, "--input", path, "--output-file", d / "p.jsonl",
                  "--text-column", "sentence1", "--no-progress")
    return cli_outcome(run, ("mrpc.csv:2", "'sentence2'"))
_predict_case("JSONL: the id column missing in a row", "ids.jsonl", '{"text": "a", "k": 1}\n{"text": "b"}\n', None,
              ("ids.jsonl:2",), ("--id-column", "k"))


@case("predict", "the input file is a directory")
def _(d: Path) -> Outcome:
    (d / "dir.csv").mkdir()
    run, out = predict(d, d / "dir.csv")
    return cli_outcome(run, ("dir.csv is a directory",))


@case("predict", "a missing input file")
def _(d: Path) -> Outcome:
    run, _ = predict(d, d / "nope.csv")
    return cli_outcome(run, ("nope.csv",))


@case("predict", "output = input")
def _(d: Path) -> Outcome:
    content = b"text\ngood\n"
    path = write(d, "same.csv", content)
    run, _ = predict(d, path, out=path)
    return cli_outcome(run, ("is the input file",), after=unchanged(path, content))


@case("predict", "output = input through another spelling (./dir/../file)")
def _(d: Path) -> Outcome:
    content = b"text\ngood\n"
    path = write(d, "same.csv", content)
    (d / "sub").mkdir()
    run, _ = predict(d, path, out=d / "sub" / ".." / "same.csv")
    return cli_outcome(run, ("is the input file",), after=unchanged(path, content))


@case("predict", "output exists, no --overwrite")
def _(d: Path) -> Outcome:
    content = b"my notes\n"
    out = write(d, "notes.jsonl", content)
    run, _ = predict(d, write(d, "in.txt", "good\n"), out=out)
    return cli_outcome(run, ("--overwrite",), after=unchanged(out, content))


@case("predict", "output is a symlink to a user's file (--overwrite): the link replaced, the file kept")
def _(d: Path) -> Outcome:
    content = b"precious\n"
    target = write(d, "precious.txt", content)
    link = d / "link.jsonl"
    link.symlink_to(target)
    run, _ = predict(d, write(d, "in.txt", "good\nbad\n"), "--overwrite", out=link)

    def ok() -> Outcome:
        if link.is_symlink():
            return Outcome("silent-wrong", "the link still stands: predictions went elsewhere")
        return same_as_pipeline(link, ["good", "bad"])()
    return cli_outcome(run, ok=ok, after=unchanged(target, content))


@case("predict", "output is the symlink that is the input (output = input through a link)")
def _(d: Path) -> Outcome:
    content = b"good\nbad\n"
    path = write(d, "in.txt", content)
    link = d / "alias.txt"
    link.symlink_to(path)
    run, _ = predict(d, path, "--overwrite", out=link)
    return cli_outcome(run, ("is the input file",), after=unchanged(path, content))


@case("predict", "output in a read-only directory")
def _(d: Path) -> Outcome:
    ro = d / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    if os.geteuid() == 0:  # root writes anywhere but where the kernel forbids it
        ro = Path("/sys")
    run, _ = predict(d, write(d, "in.txt", "good\n"), out=ro / "out.jsonl")
    return cli_outcome(run, ("out.jsonl", "cannot be written"))


@case("predict", "output's directory is a file")
def _(d: Path) -> Outcome:
    write(d, "afile", "x")
    run, _ = predict(d, write(d, "in.txt", "good\n"), out=d / "afile" / "out.jsonl")
    return cli_outcome(run, ("out.jsonl", "not a directory"))


@case("predict", "output's directory does not exist")
def _(d: Path) -> Outcome:
    out = d / "new" / "deeper" / "out.jsonl"
    run, _ = predict(d, write(d, "in.txt", "good\n"), out=out)
    return cli_outcome(run, ok=same_as_pipeline(out, ["good"]), expect=("new",))


@case("predict", "a checkpoint without the task's head")
def _(d: Path) -> Outcome:
    run, _ = predict(d, write(d, "in.txt", "good\n"), model="enc")
    return cli_outcome(run, ("no text-classification head",))


@case("predict", "fill-mask: a row without [MASK]")
def _(d: Path) -> Outcome:
    run, _ = predict(d, write(d, "in.txt", "a [MASK] b\nno mask\n"), task="fill-mask", model="mlm")
    return cli_outcome(run, ("in.txt:2", "[MASK]"))


@case("predict", "question-answering: the context column missing")
def _(d: Path) -> Outcome:
    run, _ = predict(d, write(d, "qa.jsonl", '{"question": "who?"}\n'), task="question-answering", model="qa")
    return cli_outcome(run, ("qa.jsonl:1", "context"))


@case("predict", "multiple-choice: a choices cell that is not a JSON list")
def _(d: Path) -> Outcome:
    run, _ = predict(d, write(d, "mc.csv", "context,choices\nA man,eats\n"), task="multiple-choice", model="mc")
    return cli_outcome(run, ("mc.csv:2", "JSON list"))


@case("predict", "1,000 rows in batches of 7 keep their order")
def _(d: Path) -> Outcome:
    texts = [f"review number {i} " + "word " * (i % 37) for i in range(1000)]
    run, out = predict(d, write(d, "many.txt", "\n".join(texts) + "\n"), "--batch-size", "7")
    return cli_outcome(run, ok=same_as_pipeline(out, texts))


@case("predict", "--overwrite with a checkpoint whose outputs are NaN: the earlier predictions kept")
def _(d: Path) -> Outcome:
    from safetensors.torch import load_file, save_file

    m = copy_model(MODELS["clf"], d / "nan_model")
    weights = load_file(str(m / "model.safetensors"))
    weights["classifier.bias"] = torch.full_like(weights["classifier.bias"], float("nan"))
    save_file(weights, str(m / "model.safetensors"), metadata={"format": "pt"})
    content = b'{"id": 0, "label": "positive"}\n'
    out = write(d, "pred.jsonl", content)
    run = bertkit("predict", "text-classification", "--model", m, "--input", write(d, "in.txt", "good\n"),
                  "--output-file", out, "--overwrite", "--no-progress")
    return cli_outcome(run, ("not finite",), after=unchanged(out, content))


@case("predict", "interrupted (SIGINT) mid-run: no partial output, no temporary file left")
def _(d: Path) -> Outcome:
    texts = [f"review {i} " + "word " * 60 for i in range(40_000)]
    path = write(d, "many.txt", "\n".join(texts) + "\n")
    out = d / "pred.jsonl"
    p = subprocess.Popen([sys.executable, "-m", "bertkit", "predict", "text-classification", "--model",
                          str(MODELS["clf"]), "--input", str(path), "--output-file", str(out), "--no-progress"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    deadline = time.time() + TIMEOUT
    while time.time() < deadline and not any(d.glob(".pred.jsonl*")) and p.poll() is None:
        time.sleep(0.05)  # until the output's temporary file exists: predictions are being written
    time.sleep(0.5)
    p.send_signal(signal.SIGINT)
    try:
        _, err = p.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        p.kill()
        return Outcome("hang", "no exit after SIGINT")
    left = sorted(x.name for x in d.iterdir() if x.name not in ("many.txt",))
    if p.returncode == 0:
        return Outcome("ok", "finished before the signal") if out.is_file() else Outcome("data-loss", "no output")
    if left:
        return Outcome("data-loss" if out.exists() else "silent-wrong", f"left behind: {left} (exit {p.returncode})")
    how = "Python's KeyboardInterrupt traceback" if "Traceback" in err else _last(err)[:80]
    return Outcome("ok", f"stopped (exit {p.returncode}, {how}); no output and no temporary file left behind")


def _close(a: object, b: object) -> bool:
    """Equal JSON values, floats within 1e-5 (batches of other lengths round differently)."""
    if isinstance(a, float) and isinstance(b, (int, float)):
        return math.isclose(a, b, abs_tol=1e-5)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    return a == b


def same_records(out: Path, inputs: list, task: str, model: str, key: str | None = None,
                 **options) -> Callable[[], Outcome]:
    """A success of any task is right when each record (less its id) is the pipeline's result for its input."""
    def ok() -> Outcome:
        got = read_jsonl(out)
        want = pipe(task, model)(inputs, **options)
        if len(got) != len(inputs):
            return Outcome("silent-wrong", f"{len(got)} records for {len(inputs)} inputs")
        for i, (g, w) in enumerate(zip(got, want)):
            g = {k: v for k, v in g.items() if k != "id"}
            if not _close(g[key] if key else g, w) or key is None and not isinstance(w, dict):
                return Outcome("silent-wrong", f"record {i} is {str(g)[:80]}, the pipeline gives {str(w)[:80]}")
        return Outcome("ok", f"{len(got)} records equal the pipeline's")
    return ok


@case("predict", "question-answering from CSV (a context with commas, quotes and a newline)")
def _(d: Path) -> Outcome:
    items = [{"question": "Who wrote it?", "context": 'It was written, "they say", by Ada\nin 1843.'},
             {"question": "When?", "context": "In 1843."}]
    rows = "".join('"' + x["question"].replace('"', '""') + '","' + x["context"].replace('"', '""') + '"\n'
                   for x in items)
    run, out = predict(d, write(d, "qa.csv", "question,context\n" + rows), task="question-answering", model="qa")
    return cli_outcome(run, ok=same_records(out, items, "question-answering", "qa", top_k=1))


@case("predict", "token-classification from TSV")
def _(d: Path) -> Outcome:
    texts = ["Ada Lovelace wrote it .", "no names here"]
    run, out = predict(d, write(d, "ner.tsv", "text\n" + "\n".join(texts) + "\n"), task="token-classification",
                       model="ner")
    return cli_outcome(run, ok=same_records(out, texts, "token-classification", "ner"))


@case("predict", "multiple-choice from CSV (choices as a JSON list in a cell)")
def _(d: Path) -> Outcome:
    items = [{"context": "He opened the door", "choices": ["and walked in.", "and the sky, green."]}]
    run, out = predict(d, write(d, "mc.csv", 'context,choices\n"He opened the door","[""and walked in."", '
                                '""and the sky, green.""]"\n'), task="multiple-choice", model="mc")
    return cli_outcome(run, ok=same_records(out, items, "multiple-choice", "mc"))


@case("predict", "sentence-embedding from TXT")
def _(d: Path) -> Outcome:
    texts = ["one sentence", "another, longer sentence"]
    run, out = predict(d, write(d, "e.txt", "\n".join(texts) + "\n"), task="sentence-embedding", model="enc")
    return cli_outcome(run, ok=same_records(out, texts, "sentence-embedding", "enc", key="embedding"))


@case("predict", "a 1 MB text in one CSV field")
def _(d: Path) -> Outcome:
    text = "word " * 200_000
    run, out = predict(d, write(d, "big.csv", f'text\n"{text}"\nsmall\n'))
    return cli_outcome(run, ok=same_as_pipeline(out, [text, "small"]))


@case("predict", "--max-length 4 (below the minimum)")
def _(d: Path) -> Outcome:
    run, _ = predict(d, write(d, "in.txt", "good\n"), "--max-length", "4")
    return cli_outcome(run, ("max_length 4",))


@case("predict", "--device cuda on a machine without one" if not torch.cuda.is_available() else
      "--device cuda:99 (no such GPU)")
def _(d: Path) -> Outcome:
    spec = "cuda" if not torch.cuda.is_available() else "cuda:99"
    run, out = predict(d, write(d, "in.txt", "good\n"), "--device", spec)
    return cli_outcome(run, (spec,))


@case("predict", "--device gpu (not a device name)")
def _(d: Path) -> Outcome:
    run, out = predict(d, write(d, "in.txt", "good\n"), "--device", "gpu")
    return cli_outcome(run, ("gpu",))


# -------------------------------------------------------------------------------------------------
# finetune classify
# -------------------------------------------------------------------------------------------------


def finetune(d: Path, train: str, dev: str | None = None, *extra: object, suffix: str = "csv",
             out: Path | None = None, runner: tuple[str, ...] = ("-m", "bertkit"), timeout: float | None = None
             ) -> tuple[Run, Path]:
    out = out or d / "run"
    t = write(d, f"train.{suffix}", train)
    v = write(d, f"dev.{suffix}", dev) if dev is not None else t
    return bertkit("finetune", "classify", "--model", MODELS["clf"], "--train-file", t, "--validation-file", v,
                   "--output-dir", out, "--num-train-epochs", "1", "--batch-size", "4", "--max-seq-length", "32",
                   "--no-progress", *extra, runner=runner, timeout=timeout), out


def report_ok(out: Path, labels: list[str] | None, metric: str) -> Callable[[], Outcome]:
    def ok() -> Outcome:
        report = json.loads((out / "report.json").read_text())
        config = json.loads((out / "best" / "config.json").read_text())
        got = [config["id2label"][str(i)] for i in range(len(config["id2label"]))] if labels is not None else None
        if report["metric"] != metric or (labels is not None and got != labels):
            return Outcome("silent-wrong", f"metric {report['metric']}, labels {got}")
        value = report["runs"][0]["dev"][metric]
        return check(math.isfinite(value), f"{metric} {value}", "silent-wrong") if labels is None else \
            Outcome("ok", f"{metric} {value:.3f}, labels {got}")
    return ok


ROWS = ["a gorgeous film", "dull and overlong", "a joy", "tedious", "warm and funny", "a mess"]


def _rows(labels: list[str], header: str = "text,label") -> str:
    return header + "\n" + "".join(f"{t},{y}\n" for t, y in zip(ROWS, labels))


@case("finetune", "a score column with nan and inf (validation = training file)")
def _(d: Path) -> Outcome:
    run, out = finetune(d, "text,score\ngood,1.5\nfine,2.0\nok,3.1\nbad,inf\nawful,nan\n", None,
                        "--label-column", "score")
    return cli_outcome(run, ("train.csv:5", "'inf' is not a finite number"))


@case("finetune", "--problem-type regression with NaN in the training column")
def _(d: Path) -> Outcome:
    run, _ = finetune(d, _rows(["0.5", "1.5", "NaN", "2.5", "0.1", "3.0"]), _rows(["0.5", "1.0"]),
                      "--problem-type", "regression")
    return cli_outcome(run, ("train.csv:4", "not a finite number"))


@case("finetune", "regression with inf in the validation column")
def _(d: Path) -> Outcome:
    run, _ = finetune(d, _rows(["0.5", "1.5", "2.2", "2.5", "0.1", "3.0"]), _rows(["0.5", "inf"]))
    return cli_outcome(run, ("dev.csv:3", "not a finite number"))


@case("finetune", "JSONL: NaN and Infinity as JSON numbers")
def _(d: Path) -> Outcome:
    lines = [json.dumps({"text": t, "label": y}) for t, y in zip(ROWS, [0.5, 1.5, float("nan"), 2.0, 1.0, 3.5])]
    run, _ = finetune(d, "\n".join(lines) + "\n", None, suffix="jsonl")
    return cli_outcome(run, ("train.jsonl:3", "not a finite number"))


@case("finetune", "mixed label types: numbers and names")
def _(d: Path) -> Outcome:
    run, out = finetune(d, _rows(["1", "pos", "1", "pos", "1", "pos"]))
    return cli_outcome(run, ok=report_ok(out, ["1", "pos"], "accuracy"))


@case("finetune", "JSONL: integer labels 0/1 as numbers")
def _(d: Path) -> Outcome:
    lines = [json.dumps({"text": t, "label": y}) for t, y in zip(ROWS, [0, 1, 0, 1, 1, 0])]
    run, out = finetune(d, "\n".join(lines) + "\n", None, suffix="jsonl")
    return cli_outcome(run, ok=report_ok(out, ["0", "1"], "accuracy"))


@case("finetune", "JSONL: booleans as labels")
def _(d: Path) -> Outcome:
    lines = [json.dumps({"text": t, "label": y}) for t, y in zip(ROWS, [True, False] * 3)]
    run, _ = finetune(d, "\n".join(lines) + "\n", None, suffix="jsonl")
    return cli_outcome(run, ("train.jsonl:1", "'label'"))


@case("finetune", "one class number written two ways (1 and 1.0)")
def _(d: Path) -> Outcome:
    run, _ = finetune(d, _rows(["1", "0", "1.0", "0", "1", "0"]))
    return cli_outcome(run, ("'1' (line 2) and '1.0' (line 4)",))


@case("finetune", "a whitespace text in the last training row")
def _(d: Path) -> Outcome:
    run, _ = finetune(d, _rows(["pos", "neg", "pos", "neg", "pos", "neg"]) + "   ,pos\n")
    return cli_outcome(run, ("train.csv:8", "'text' is only whitespace"))


@case("finetune", "a NUL byte in the validation file")
def _(d: Path) -> Outcome:
    run, _ = finetune(d, _rows(["pos", "neg", "pos", "neg", "pos", "neg"]), "text,label\ngo\x00od,pos\n")
    return cli_outcome(run, ("dev.csv:2", "NUL byte"))


@case("finetune", "one class")
def _(d: Path) -> Outcome:
    run, _ = finetune(d, _rows(["pos"] * 6))
    return cli_outcome(run, ("at least two classes",))


@case("finetune", "empty texts")
def _(d: Path) -> Outcome:
    run, out = finetune(d, "text,label\n,pos\n,neg\ngood,pos\n\"\",neg\n")
    return cli_outcome(run, ("train.csv:2", "'text' is empty"))  # a missing value, not a text to learn from


@case("finetune", "validation labels unseen in training")
def _(d: Path) -> Outcome:
    run, _ = finetune(d, _rows(["pos", "neg"] * 3), _rows(["pos", "meh"]))
    return cli_outcome(run, ("dev.csv:3", "'meh' never occurs"))


@case("finetune", "the label column missing")
def _(d: Path) -> Outcome:
    run, _ = finetune(d, _rows(["pos", "neg"] * 3), None, "--label-column", "sentiment")
    return cli_outcome(run, ("train.csv:2", "'sentiment'"))


@case("finetune", "an empty label")
def _(d: Path) -> Outcome:
    run, _ = finetune(d, _rows(["pos", "neg", "", "neg", "pos", "neg"]))
    return cli_outcome(run, ("train.csv:4", "empty"))


@case("finetune", "an empty validation file")
def _(d: Path) -> Outcome:
    run, _ = finetune(d, _rows(["pos", "neg"] * 3), "")
    return cli_outcome(run, ("dev.csv holds no rows",))


@case("finetune", "regression on a constant validation column (Pearson undefined)")
def _(d: Path) -> Outcome:
    run, _ = finetune(d, _rows(["0.5", "1.5", "2.2", "2.5", "0.1", "3.0"]), _rows(["1.5", "1.5", "1.5"]))
    return cli_outcome(run, ("dev.csv",))


@case("finetune", "regression on a well-formed score column")
def _(d: Path) -> Outcome:
    run, out = finetune(d, _rows(["0.5", "1.5", "2.2", "2.5", "0.1", "3.0"]), _rows(["0.5", "2.5", "1.0"]))
    return cli_outcome(run, ok=report_ok(out, None, "pearson"))


@case("finetune", "a test file without the text column")
def _(d: Path) -> Outcome:
    write(d, "test.csv", "review\ngood\n")
    run, out = finetune(d, _rows(["pos", "neg"] * 3), None, "--test-file", d / "test.csv")
    return cli_outcome(run, ("test.csv:2", "'text'"), after=lambda: "trained before the test file was checked"
                       if (out / "best").exists() else None)


@case("finetune", "a global batch larger than the training set")
def _(d: Path) -> Outcome:
    run, out = finetune(d, _rows(["pos", "neg"] * 3), None, "--batch-size", "64")
    return cli_outcome(run, ok=report_ok(out, ["neg", "pos"], "accuracy"))


@case("finetune", "nearly one class per row: trains, with a warning naming the fix")
def _(d: Path) -> Outcome:
    run, out = finetune(d, _rows(["1", "2", "3", "4", "5", "6"]))

    def ok() -> Outcome:
        if "--problem-type regression" not in run.err:
            return Outcome("silent-wrong", "6 classes from 6 rows without a warning")
        return report_ok(out, ["1", "2", "3", "4", "5", "6"], "accuracy")()
    return cli_outcome(run, ok=ok)


@case("finetune", "sentence pairs: the pair column missing")
def _(d: Path) -> Outcome:
    run, _ = finetune(d, _rows(["pos", "neg"] * 3), None, "--text-pair-column", "hypothesis")
    return cli_outcome(run, ("train.csv:2", "'hypothesis'"))


@case("finetune", "labels padded with spaces (' pos' and 'pos' are one class)")
def _(d: Path) -> Outcome:
    run, out = finetune(d, _rows([" pos", "neg ", "pos", "neg", " pos ", "neg"]))
    return cli_outcome(run, ok=report_ok(out, ["neg", "pos"], "accuracy"))


@case("finetune", "--output-dir is a file")
def _(d: Path) -> Outcome:
    content = b"my notes"
    out = write(d, "notes", content)
    run, _ = finetune(d, _rows(["pos", "neg"] * 3), None, out=out)
    return cli_outcome(run, ("notes",), after=unchanged(out, content))


@case("finetune", "--model a directory without config.json")
def _(d: Path) -> Outcome:
    (d / "empty_model").mkdir()
    t = write(d, "train.csv", _rows(["pos", "neg"] * 3))
    run = bertkit("finetune", "classify", "--model", d / "empty_model", "--train-file", t, "--validation-file", t,
                  "--output-dir", d / "run", "--no-progress")
    return cli_outcome(run, ("config.json",))


# -------------------------------------------------------------------------------------------------
# torchrun and concurrency
# -------------------------------------------------------------------------------------------------

TORCHRUN = ("-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m", "bertkit")


@case("torchrun", "finetune classify: a global batch 5 over 2 processes")
def _(d: Path) -> Outcome:
    run, _ = finetune(d, _rows(["pos", "neg"] * 3), None, "--batch-size", "5", runner=TORCHRUN)
    worker_lines = [x for x in run.err.splitlines() if x.startswith("bertkit finetune classify: error:")]
    if run.rc == 1 and worker_lines and "exitcode  : 2" in run.err and "Traceback" not in run.err.split(
            worker_lines[-1])[0]:
        # every worker exits 2 with the one line; torchrun then reports the failed workers (exit 1) with its own
        # launcher traceback, which bertkit does not control
        return Outcome("clear-error", f"(workers exit 2; torchrun's summary follows) {worker_lines[0][:160]}")
    return cli_outcome(run, ("split evenly",))


@case("torchrun", "finetune classify on 2 processes: the same report as 1 process")
def _(d: Path) -> Outcome:
    rows = _rows(["pos", "neg"] * 3)
    one, out1 = finetune(d, rows, None, "--batch-size", "4", out=d / "one")
    two, out2 = finetune(d, rows, None, "--batch-size", "4", out=d / "two", runner=TORCHRUN)
    if one.rc != 0:
        return cli_outcome(one)

    def ok() -> Outcome:
        a, b = (json.loads((o / "report.json").read_text())["runs"][0] for o in (out1, out2))
        return check(a["steps"] == b["steps"] and a["dev"]["accuracy"] == b["dev"]["accuracy"],
                     f"1 process {a['dev']} in {a['steps']} steps, 2 processes {b['dev']} in {b['steps']}")
    return cli_outcome(two, ok=ok)


@case("concurrency", "two finetune jobs into one directory at once")
def _(d: Path) -> Outcome:
    t = write(d, "train.csv", _rows(["pos", "neg"] * 3))
    cmd = [sys.executable, "-m", "bertkit", "finetune", "classify", "--model", str(MODELS["clf"]), "--train-file",
           str(t), "--validation-file", str(t), "--output-dir", str(d / "run"), "--num-train-epochs", "3",
           "--batch-size", "2", "--no-progress"]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
             for _ in range(2)]
    try:
        results = [p.communicate(timeout=TIMEOUT) for p in procs]
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        return Outcome("hang", "a job did not finish")
    codes = sorted(p.returncode for p in procs)
    errs = " | ".join(_last(e) for _, e in results if _last(e).startswith("bertkit"))
    if "Traceback" in "".join(e for _, e in results):
        return Outcome("traceback", errs[:200])
    if codes == [0, 2]:
        report = json.loads((d / "run" / "report.json").read_text())
        if report["runs"][0]["steps"] != 9:  # 6 rows / batch 2 x 3 epochs
            return Outcome("silent-wrong", f"the finished job's report says {report['runs'][0]['steps']} steps")
        return Outcome("ok", f"one finished (9 steps), the other refused: {errs[:160]}")
    if codes == [0, 0]:
        return Outcome("silent-wrong", "both jobs wrote the same directory")
    return Outcome("traceback", f"exits {codes}: {errs[:200]}")


@case("concurrency", "a torchrun job (2 processes) and a plain job into one directory at once")
def _(d: Path) -> Outcome:
    t = write(d, "train.csv", _rows(["pos", "neg"] * 3))
    args = ["finetune", "classify", "--model", str(MODELS["clf"]), "--train-file", str(t), "--validation-file",
            str(t), "--output-dir", str(d / "run"), "--num-train-epochs", "3", "--batch-size", "2", "--no-progress"]
    procs = [subprocess.Popen([sys.executable, *runner, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, cwd=ROOT) for runner in (TORCHRUN, ("-m", "bertkit"))]
    try:
        results = [p.communicate(timeout=TIMEOUT) for p in procs]
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        return Outcome("hang", "a job did not finish")
    codes = [p.returncode for p in procs]
    torchrun_err, plain_err = results[0][1], results[1][1]
    # torchrun prints one traceback of its own when a worker fails; a second one would be a worker's
    if torchrun_err.count("Traceback (most recent call last)") > (1 if codes[0] else 0) or "Traceback" in plain_err:
        return Outcome("traceback", f"exits {codes}: {_last(torchrun_err)[:100]} | {_last(plain_err)[:100]}")
    winners = [c == 0 for c in codes]
    if sum(winners) != 1:
        return Outcome("silent-wrong" if all(winners) else "traceback", f"exits {codes}")
    loser = torchrun_err if codes[0] else plain_err
    line = next((x for x in loser.splitlines() if x.startswith("bertkit finetune classify: error:")), "")
    report = json.loads((d / "run" / "report.json").read_text())
    if not line or report["runs"][0]["steps"] != 9:
        return Outcome("silent-wrong", f"exits {codes}, steps {report['runs'][0]['steps']}, refusal {line[:80]!r}")
    return Outcome("ok", f"{'plain' if codes[0] else 'torchrun'} job finished (9 steps); the other refused: "
                         f"{line[34:150]}")


# -------------------------------------------------------------------------------------------------
# export onnx, convert-tf-checkpoint, merge-pretraining-data
# -------------------------------------------------------------------------------------------------


def copy_model(src: Path, dst: Path) -> Path:
    dst.mkdir(parents=True)
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    return dst


def _edit_config(m: Path, **changes) -> None:
    config = json.loads((m / "config.json").read_text())
    config.update(changes)
    (m / "config.json").write_text(json.dumps(config))


@case("export", "onnx: a tiny classifier (the good path)")
def _(d: Path) -> Outcome:
    run = bertkit("export", "onnx", "--model", MODELS["clf"], "--out", d / "m.onnx")
    return cli_outcome(run, ok=lambda: check((d / "m.onnx").stat().st_size > 0 and
                                             "verified_max_abs_diff" in run.out or "skipped" in run.out,
                                             f"no verification: {run.out[-200:]}"))


@case("export", "onnx: config.json is not JSON")
def _(d: Path) -> Outcome:
    m = copy_model(MODELS["clf"], d / "m")
    (m / "config.json").write_text('{"hidden_size": 32,')
    return cli_outcome(bertkit("export", "onnx", "--model", m, "--out", d / "m.onnx"), ("config.json",))


@case("export", "onnx: architectures is a string, not a list")
def _(d: Path) -> Outcome:
    m = copy_model(MODELS["clf"], d / "m")
    _edit_config(m, architectures="BertForSequenceClassification")
    run = bertkit("export", "onnx", "--model", m, "--out", d / "m.onnx")
    return cli_outcome(run, ("architectures",), ok=lambda: Outcome("ok", "read as a one-name list"))


@case("export", "onnx: weights truncated")
def _(d: Path) -> Outcome:
    m = copy_model(MODELS["clf"], d / "m")
    data = (m / "model.safetensors").read_bytes()
    (m / "model.safetensors").write_bytes(data[: len(data) // 2])
    return cli_outcome(bertkit("export", "onnx", "--model", m, "--out", d / "m.onnx"), ("model.safetensors",))


@case("export", "onnx: config says 3 layers, weights hold 2")
def _(d: Path) -> Outcome:
    m = copy_model(MODELS["clf"], d / "m")
    _edit_config(m, num_hidden_layers=3)
    return cli_outcome(bertkit("export", "onnx", "--model", m, "--out", d / "m.onnx"), ("layer.2",))


@case("export", "onnx: output exists (no --overwrite)")
def _(d: Path) -> Outcome:
    out = write(d, "m.onnx", b"keep me")
    run = bertkit("export", "onnx", "--model", MODELS["clf"], "--out", out)
    return cli_outcome(run, ("--overwrite",), after=unchanged(out, b"keep me"))


@case("export", "onnx: --model is not a directory")
def _(d: Path) -> Outcome:
    return cli_outcome(bertkit("export", "onnx", "--model", d / "nope", "--out", d / "m.onnx"), ("nope",))


# A TensorFlow tensor bundle written by hand (the format tf.train.Saver writes, each tensor's crc32c included; no
# TensorFlow needed): the tests' writer, tests/tf_bundle_helpers.py.
sys.path.insert(0, str(ROOT / "tests"))
from tf_bundle_helpers import write_bundle  # noqa: E402


def tf_checkpoint(d: Path) -> Path:
    """A google-research/bert-named bundle of the tiny MLM model, with its bert_config.json and vocab.txt."""
    from bertkit.heads import BertForMaskedLM

    model = BertForMaskedLM.from_pretrained(MODELS["mlm"])
    google = {}
    for name, t in model.published_state_dict().items():
        g = name.replace("bert.encoder.layer.", "bert/encoder/layer_").replace(".", "/")
        a = t.numpy()
        if g.endswith("LayerNorm/weight"):
            g = g[: -len("weight")] + "gamma"
        elif g.endswith("LayerNorm/bias"):
            g = g[: -len("bias")] + "beta"
        elif g.endswith("_embeddings/weight"):
            g = g[: -len("/weight")]
        elif g == "cls/predictions/bias":
            g = "cls/predictions/output_bias"
        elif g.endswith("/weight"):
            g, a = g[: -len("weight")] + "kernel", a.T
        if g == "cls/predictions/decoder/kernel":  # tied to the word embeddings
            continue
        google[g] = a
    write_bundle(d / "bert_model.ckpt", google)
    config = {k: v for k, v in json.loads((MODELS["mlm"] / "config.json").read_text()).items()
              if k not in ("architectures", "model_type")}
    (d / "bert_config.json").write_text(json.dumps(config))
    (d / "vocab.txt").write_bytes((MODELS["mlm"] / "vocab.txt").read_bytes())
    return d / "bert_model.ckpt"


def convert(d: Path, ckpt: Path, config: Path | None = None, vocab: Path | None = None) -> Run:
    return bertkit("convert-tf-checkpoint", "--tf-checkpoint", ckpt, "--config", config or d / "bert_config.json",
                   "--vocab", vocab or d / "vocab.txt", "--out", d / "out")


@case("convert", "a hand-written bundle of the tiny MLM (the good path)")
def _(d: Path) -> Outcome:
    run = convert(d, tf_checkpoint(d))

    def ok() -> Outcome:
        from bertkit import pipeline

        a = pipeline("fill-mask", d / "out")("a [MASK] film")[0]
        b = pipe("fill-mask", "mlm")("a [MASK] film")[0]
        return check(a["token"] == b["token"] and math.isclose(a["score"], b["score"], rel_tol=1e-5),
                     f"converted gives {a}, original {b}")
    return cli_outcome(run, ok=ok)


@case("convert", "the .index file is garbage")
def _(d: Path) -> Outcome:
    ckpt = tf_checkpoint(d)
    Path(f"{ckpt}.index").write_bytes(os.urandom(300))
    return cli_outcome(convert(d, ckpt), ("bert_model.ckpt.index",))


@case("convert", "the .index file corrupted inside (its magic number intact)")
def _(d: Path) -> Outcome:
    ckpt = tf_checkpoint(d)
    index = Path(f"{ckpt}.index")
    data = bytearray(index.read_bytes())
    rng = np.random.default_rng(0)
    for i in rng.choice(len(data) - 60, 40, replace=False):
        data[i] = 0xFF
    index.write_bytes(bytes(data))
    return cli_outcome(convert(d, ckpt), ("bert_model.ckpt.index",))


@case("convert", "20 random corruptions of the .index (bytes set to random values)")
def _(d: Path) -> Outcome:
    from bertkit.errors import BertkitError
    from bertkit.inference.tf_checkpoint import read_tf_checkpoint

    ckpt = tf_checkpoint(d)
    index = Path(f"{ckpt}.index")
    good = index.read_bytes()
    rng = np.random.default_rng(1)
    seen = Counter()
    for _ in range(20):
        data = bytearray(good)
        for i in rng.choice(len(data), 8, replace=False):
            data[i] = int(rng.integers(256))
        index.write_bytes(bytes(data))
        try:
            read_tf_checkpoint(ckpt)
            seen["read (corruption in padding or in values)"] += 1
        except BertkitError:
            seen["clear"] += 1
        except Exception as e:  # noqa: BLE001 - the finding
            return Outcome("traceback", f"{type(e).__name__}: {str(e)[:150]}")
    return Outcome("ok" if not seen.get("clear") else "clear-error", str(dict(seen)))


@case("convert", "the .data file truncated")
def _(d: Path) -> Outcome:
    ckpt = tf_checkpoint(d)
    data = Path(f"{ckpt}.data-00000-of-00001")
    data.write_bytes(data.read_bytes()[:1000])
    return cli_outcome(convert(d, ckpt), ("truncated",))


@case("convert", "bert_config.json is not JSON")
def _(d: Path) -> Outcome:
    ckpt = tf_checkpoint(d)
    (d / "bert_config.json").write_text("hidden_size = 32\n")
    return cli_outcome(convert(d, ckpt), ("bert_config.json",))


@case("convert", "bert_config.json of another model (1 layer)")
def _(d: Path) -> Outcome:
    ckpt = tf_checkpoint(d)
    config = json.loads((d / "bert_config.json").read_text())
    (d / "bert_config.json").write_text(json.dumps({**config, "num_hidden_layers": 1}))
    return cli_outcome(convert(d, ckpt), ("num_hidden_layers",))


@case("convert", "bert_config.json of another width (64)")
def _(d: Path) -> Outcome:
    ckpt = tf_checkpoint(d)
    config = json.loads((d / "bert_config.json").read_text())
    (d / "bert_config.json").write_text(json.dumps({**config, "hidden_size": 64, "intermediate_size": 128}))
    return cli_outcome(convert(d, ckpt), ("shape",))


@case("convert", "a vocab.txt of another size")
def _(d: Path) -> Outcome:
    ckpt = tf_checkpoint(d)
    write(d, "small_vocab.txt", "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\na\n")
    return cli_outcome(convert(d, ckpt, vocab=d / "small_vocab.txt"), ("vocab_size",))


def pretraining_parts(d: Path, start: int = 0) -> list[Path]:
    """The two parts of a 2-way split create-pretraining-data run over four documents of README.md text."""
    corpus = d / "corpus"
    corpus.mkdir(parents=True)
    text = (ROOT / "README.md").read_text(encoding="utf-8")[start:]
    for i in range(4):
        (corpus / f"doc{i}.txt").write_text(text[i * 1500:(i + 1) * 1500] + "\n", encoding="utf-8")
    parts = []
    for i in range(2):
        run = bertkit("create-pretraining-data", *sorted(corpus.iterdir()), "--vocab", MODELS["mlm"], "--out",
                      d / f"part{i}", "--num-shards", "2", "--shard-index", str(i), "--max-seq-length", "32",
                      "--unit-bytes", "1000", "--dupe-factor", "1", "--no-progress", "--num-workers", "1")
        if run.rc != 0:
            raise RuntimeError(f"create-pretraining-data failed: {run.err[-500:]}")
        parts.append(d / f"part{i}")
    return parts


def merge(d: Path, *parts: Path) -> Run:
    return bertkit("merge-pretraining-data", *parts, "--out", d / "merged")


@case("merge", "two parts (the good path)")
def _(d: Path) -> Outcome:
    parts = pretraining_parts(d)
    run = merge(d, *parts)

    def ok() -> Outcome:
        from bertkit.data.dataset import PretrainingDataset

        n = len(PretrainingDataset(d / "merged", verify=True))
        return check(n > 0, "no instances")
    return cli_outcome(run, ok=ok)


@case("merge", "a part's part.json is not JSON")
def _(d: Path) -> Outcome:
    parts = pretraining_parts(d)
    (parts[1] / "part.json").write_text('{"part": ')
    return cli_outcome(merge(d, *parts), ("part1", "part.json"))


@case("merge", "a part's part.json lacks its fields")
def _(d: Path) -> Outcome:
    parts = pretraining_parts(d)
    (parts[1] / "part.json").write_text('{"format": 1}')
    return cli_outcome(merge(d, *parts), ("part1",))


@case("merge", "the same part twice")
def _(d: Path) -> Outcome:
    parts = pretraining_parts(d)
    return cli_outcome(merge(d, parts[0], parts[0]), ("given twice",))


@case("merge", "a part with a truncated shard file")
def _(d: Path) -> Outcome:
    parts = pretraining_parts(d)
    shard = sorted(parts[1].glob("shard-*.npy"))[0]
    shard.write_bytes(shard.read_bytes()[:-40])
    return cli_outcome(merge(d, *parts), (shard.name,))


@case("merge", "a part with a shard file missing")
def _(d: Path) -> Outcome:
    parts = pretraining_parts(d)
    shard = sorted(parts[1].glob("shard-*.npy"))[0]
    shard.unlink()
    run = merge(d, *parts)
    return cli_outcome(run, (shard.name,), after=lambda: "a partial merged directory was left" if
                       any((d / "merged").glob("shard-*")) else None)


@case("merge", "parts of two different corpora")
def _(d: Path) -> Outcome:
    parts = pretraining_parts(d / "a")
    other = pretraining_parts(d / "b", start=500)
    return cli_outcome(merge(d, parts[0], other[1]), ("made with other",))


# -------------------------------------------------------------------------------------------------
# Trainer (bertkit.Trainer, TrainingArguments, collators): transformers users' way in
# -------------------------------------------------------------------------------------------------

_SENTENCES = ["a fine film", "dull and slow", "great acting", "a waste of time", "loved it", "boring",
              "a masterpiece", "not good", "superb", "awful plot", "charming", "tedious"]


def _trainer_rows(labels: bool = True, **extra) -> list[dict]:
    from bertkit import BertTokenizer

    tok = BertTokenizer.from_pretrained(MODELS["clf"])
    rows = []
    for i, text in enumerate(_SENTENCES):
        enc = tok(text, truncation=True, max_length=32)
        row = {k: enc[k] for k in ("input_ids", "token_type_ids", "attention_mask")}
        if labels:
            row["labels"] = i % 2
        rows.append({**row, **extra})
    return rows


def _trainer(d: Path, rows: list[dict] | None = None, eval_rows: list[dict] | None = None,
             compute_metrics=None, collator=None, **args):
    from bertkit import (
        BertForSequenceClassification,
        BertTokenizer,
        DataCollatorWithPadding,
        Trainer,
        TrainingArguments,
    )

    tok = BertTokenizer.from_pretrained(MODELS["clf"])
    base = dict(output_dir=str(d / "out"), per_device_train_batch_size=4, num_train_epochs=1, report_to="none",
                disable_tqdm=True, save_strategy="no", eval_strategy="no", use_cpu=True)
    targs = TrainingArguments(**{**base, **args})
    return Trainer(model=BertForSequenceClassification.from_pretrained(MODELS["clf"]), args=targs,
                   train_dataset=_trainer_rows() if rows is None else rows, eval_dataset=eval_rows,
                   data_collator=collator or DataCollatorWithPadding(tok), processing_class=tok,
                   compute_metrics=compute_metrics)


def _trains(d: Path, **kw) -> object:
    return _trainer(d, **kw).train()


def _finite_loss(result: object) -> Outcome:
    loss = getattr(result, "training_loss", None)
    return check(isinstance(loss, float) and math.isfinite(loss) and getattr(result, "global_step", 0) > 0,
                 f"returned {result!r}")


def _tr(name: str, call: Callable[[Path], object], expect: tuple[str, ...] = (),
        ok: Callable[[object], Outcome] | None = None):
    @case("trainer", name)
    def _(d: Path) -> Outcome:
        return api_outcome(lambda: call(d), expect, ok)


_tr("the good path: 12 rows, one epoch", lambda d: _trains(d), ok=_finite_loss)
_tr("TrainingArguments: misspelled field learning_rat", lambda d: _trains(d, learning_rat=1e-4), ("learning_rat",))
_tr("TrainingArguments: a transformers field bertkit does not implement (label_smoothing_factor 0.1)",
    lambda d: _trains(d, label_smoothing_factor=0.1), ("label_smoothing_factor",))
for _arg, _value in [("learning_rate", float("nan")), ("learning_rate", float("inf")), ("learning_rate", -1e-4),
                     ("learning_rate", "1e-4"), ("per_device_train_batch_size", 0),
                     ("per_device_train_batch_size", -4), ("per_device_train_batch_size", 2.5),
                     ("num_train_epochs", -1), ("num_train_epochs", float("nan")), ("num_train_epochs", 0),
                     ("gradient_accumulation_steps", 0), ("weight_decay", -0.1), ("weight_decay", float("inf")),
                     ("warmup_steps", -3), ("warmup_ratio", 1.5), ("max_grad_norm", float("nan")),
                     ("max_grad_norm", -1.0), ("logging_steps", 0), ("save_total_limit", -1),
                     ("lr_scheduler_type", "cosine_with_restartz"), ("eval_strategy", "sometimes"),
                     ("seed", -1), ("seed", 2.5), ("report_to", "wandb"), ("dataloader_num_workers", -1),
                     ("train_sampling_strategy", "longest_first")]:
    _tr(f"TrainingArguments: {_arg}={_value!r}",
        lambda d, f=_arg, v=_value: _trains(d, **{f: v}), (_arg,))
_tr("train(): a dataset without labels", lambda d: _trains(d, rows=_trainer_rows(labels=False)), ("label",))
_tr("train(): an empty dataset", lambda d: _trains(d, rows=[]), ("empty",))
_tr("train(): a column the model cannot take, remove_unused_columns=False",
    lambda d: _trains(d, rows=_trainer_rows(idx=1), remove_unused_columns=False), ("idx",))
_tr("train(): extra column dropped as transformers does (remove_unused_columns=True)",
    lambda d: _trains(d, rows=_trainer_rows(idx=1)), ok=_finite_loss)
_tr("train(): a label out of range (5 for a 2-label model)",
    lambda d: _trains(d, rows=[{**r, "labels": 5 if i == 3 else r["labels"]} for i, r in enumerate(_trainer_rows())]),
    ("5",))
_tr("train(): an input id past the vocabulary",
    lambda d: _trains(d, rows=[{**r, "input_ids": [101, 10**6] + r["input_ids"][2:]} if i == 2 else r
                               for i, r in enumerate(_trainer_rows())]), ("1000000",))
_tr("train(): a row whose attention_mask is shorter than its input_ids",
    lambda d: _trains(d, rows=[{**r, "attention_mask": r["attention_mask"][:-1]} if i == 2 else r
                               for i, r in enumerate(_trainer_rows())]), ("attention_mask",))
_tr("train(): float labels on a 2-label model (multi-label targets, as transformers infers)",
    lambda d: _trains(d, rows=[{**r, "labels": [1.0, 0.0] if r["labels"] else [0.0, 1.0]} for r in _trainer_rows()]),
    ok=_finite_loss)
_tr("train(): learning rate 1e4 (the loss diverges)", lambda d: _trains(d, learning_rate=1e4, num_train_epochs=20,
                                                                       per_device_train_batch_size=12),
    ("step",), ok=_finite_loss)
_tr("eval_strategy='steps' without an eval_dataset", lambda d: _trains(d, eval_strategy="steps", eval_steps=1),
    ("eval_dataset",))
_tr("metric_for_best_model naming a metric compute_metrics does not return",
    lambda d: _trains(d, eval_rows=_trainer_rows(), eval_strategy="epoch", save_strategy="epoch", load_best_model_at_end=True,
                      metric_for_best_model="f1", compute_metrics=lambda p: {"accuracy": 0.5}), ("f1",))
_tr("compute_metrics returning NaN: reported as NaN, not a number",
    lambda d: _trainer(d, eval_rows=_trainer_rows(), compute_metrics=lambda p: {"score": float("nan")}).evaluate(),
    ok=lambda m: check(isinstance(m, dict) and math.isnan(m.get("eval_score", 0.0)), f"got {m!r}"))
_tr("resume_from_checkpoint=True with no checkpoint", lambda d: _trainer(d).train(resume_from_checkpoint=True),
    ("checkpoint",))


def _resume_other_settings(d: Path) -> object:
    _trains(d, save_strategy="epoch")
    return _trainer(d, save_strategy="epoch", learning_rate=3e-5).train(resume_from_checkpoint=True)


_tr("resume into an output_dir trained with other settings", _resume_other_settings, ("learning_rate",))


def _user_file_in_output_dir(d: Path) -> object:
    out = d / "out"
    mine = write(out, "checkpoint-1/notes.txt", "mine")
    result = _trainer(d, save_strategy="steps", save_steps=1, save_total_limit=1).train()
    if not mine.is_file() or mine.read_text() != "mine":
        raise AssertionError("DATA LOSS: the user's checkpoint-1/notes.txt was removed")
    return result


@case("trainer", "output_dir holding a user's checkpoint-1/notes.txt, save_total_limit=1")
def _(d: Path) -> Outcome:
    out = api_outcome(lambda: _user_file_in_output_dir(d), ("checkpoint-1",), ok=_finite_loss)
    return Outcome("data-loss", out.detail) if "DATA LOSS" in out.detail else out


def _no_pad_collator(d: Path) -> object:
    from bertkit import BertTokenizer, DataCollatorWithPadding

    tok = BertTokenizer.from_pretrained(MODELS["clf"])
    tok.pad_token = None
    return DataCollatorWithPadding(tok)(_trainer_rows()[:2])


_tr("a collator given a tokenizer without a pad token", _no_pad_collator, ("pad",))


# -------------------------------------------------------------------------------------------------
# Python API
# -------------------------------------------------------------------------------------------------


def _api(name: str, call: Callable[[Path], object], expect: tuple[str, ...] = (),
         ok: Callable[[object], Outcome] | None = None):
    @case("python", name)
    def _(d: Path) -> Outcome:
        return api_outcome(lambda: call(d), expect, ok)


def _pipeline(*args, **kwargs):
    from bertkit import pipeline

    return pipeline(*args, **kwargs)


def _is_pipeline(task: str) -> Callable[[object], Outcome]:
    return lambda p: check(type(p).__name__.lower().startswith(task.replace("-", "")), f"got {type(p).__name__}")


_api("pipeline(None)", lambda d: _pipeline(None), ("text-classification",))
_api("pipeline(5)", lambda d: _pipeline(5), ("text-classification",))
_api("pipeline(['text-classification'], dir)", lambda d: _pipeline(["text-classification"], MODELS["clf"]),
     ("text-classification",))
_api("pipeline('text-classification') without a model", lambda d: _pipeline("text-classification"), ("model",))
_api("pipeline('no-such-task', dir)", lambda d: _pipeline("no-such-task", MODELS["clf"]), ("fill-mask",))
_api("pipeline(dir, task) (arguments swapped)", lambda d: _pipeline(str(MODELS["clf"]), "text-classification"),
     ("(task, model)",))
_api("pipeline(task, model=dir)", lambda d: _pipeline("text-classification", model=MODELS["clf"]),
     ok=_is_pipeline("textclassification"))
_api("pipeline(task=..., model=str(dir))", lambda d: _pipeline(task="text-classification", model=str(MODELS["clf"])),
     ok=_is_pipeline("textclassification"))
_api("pipeline(model=dir): the task from the checkpoint's head", lambda d: _pipeline(model=MODELS["ner"]),
     ok=_is_pipeline("tokenclassification"))
_api("pipeline(task, model=a model object, tokenizer=dir)",
     lambda d: _pipeline("question-answering", model=__import__("bertkit").BertForQuestionAnswering.from_pretrained(
         MODELS["qa"]), tokenizer=MODELS["qa"]), ok=_is_pipeline("questionanswering"))
_api("pipeline(task, model=5)", lambda d: _pipeline("text-classification", model=5), ("model",))
_api("pipeline(batch_size=0)", lambda d: _pipeline("text-classification", MODELS["clf"], batch_size=0),
     ("batch_size",))
_api("pipeline(max_length=3)", lambda d: _pipeline("text-classification", MODELS["clf"], max_length=3),
     ("max_length",))
_api("a missing checkpoint directory", lambda d: _pipeline("text-classification", d / "nope"), ("nope",))

_api("classifier(None)", lambda d: pipe("text-classification", "clf")(None), ("None",))
_api("classifier(5)", lambda d: pipe("text-classification", "clf")(5), ("int",))
_api("classifier(b'bytes')", lambda d: pipe("text-classification", "clf")(b"good"), ("bytes",))
_api("classifier([None])", lambda d: pipe("text-classification", "clf")([None]), ("input 0",))
_api("classifier([['a', 'b']]) (a nested list)", lambda d: pipe("text-classification", "clf")([["a", "b"]]),
     ("input 0",))
_api("classifier([('a', 5)])", lambda d: pipe("text-classification", "clf")([("a", 5)]), ("input 0",))
_api("classifier({'a', 'b'}) (a set has no order)", lambda d: pipe("text-classification", "clf")({"a", "b"}),
     ("set",))
_api("classifier([]) (no inputs)", lambda d: pipe("text-classification", "clf")([]),
     ok=lambda r: check(r == [], f"got {r}"))
_api("classifier(['']) (an empty text)", lambda d: pipe("text-classification", "clf")([""]),
     ok=lambda r: check(len(r) == 1 and r[0]["label"] in ("negative", "positive"), f"got {r}"))
_api("classifier(a generator)", lambda d: pipe("text-classification", "clf")(t for t in ["a", "b"]),
     ok=lambda r: check(len(r) == 2, f"got {r}"))


_api("pipeline(device='gpu')", lambda d: _pipeline("text-classification", MODELS["clf"], device="gpu"), ("gpu",))
_api("pipeline(device='cuda') without CUDA" if not torch.cuda.is_available() else "pipeline(device='cuda:99')",
     lambda d: _pipeline("text-classification", MODELS["clf"],
                         device="cuda" if not torch.cuda.is_available() else "cuda:99"), ("cuda",))
_api("question-answering(top_k=0)",
     lambda d: pipe("question-answering", "qa")({"question": "who?", "context": "Ada."}, top_k=0), ("top_k",))
_api("fill-mask(top_k='3')", lambda d: pipe("fill-mask", "mlm")("a [MASK]", top_k="3"), ("top_k",))
_api("classifier(a 100,000-character text) (truncated to the model's positions)",
     lambda d: pipe("text-classification", "clf")("word " * 20_000),
     ok=lambda r: check(r["label"] in ("negative", "positive"), f"got {r}"))


def _tokenizer():
    from bertkit.tokenization import BertTokenizer

    return BertTokenizer.from_pretrained(MODELS["clf"])


_api("tokenizer(None)", lambda d: _tokenizer()(None), ("None",))
_api("tokenizer(5)", lambda d: _tokenizer()(5), ("int",))
_api("tokenizer([['a', 'b']]) (pre-split words without is_split_into_words)",
     lambda d: _tokenizer()([["a", "b"]]), ("list",), ok=lambda r: check(len(r["input_ids"]) == 1, f"got {r}"))
_api("tokenizer.decode([10**9]) (an id past the vocabulary)", lambda d: _tokenizer().decode([10**9]), ("1000000000",))


def _ten_thousand(d: Path) -> Outcome:
    texts = [f"text {i} " + "w " * (i % 50) for i in range(10_000)]
    clf = pipe("text-classification", "clf")
    got = clf(texts)
    spot = [0, 1, 4_999, 9_999]
    want = [clf(texts[i]) for i in spot]
    same = all(got[i]["label"] == w["label"] and math.isclose(got[i]["score"], w["score"], abs_tol=1e-5)
               for i, w in zip(spot, want))
    return check(len(got) == 10_000 and same, "order or results differ from one-by-one calls")


_api("classifier(10,000 texts) in input order", _ten_thousand, ok=lambda r: r)
_api("classifier(texts, top_k=3) (an option it does not take)",
     lambda d: pipe("text-classification", "clf")(["a"], top_k=3), ("top_k",))
_api("question-answering(None)", lambda d: pipe("question-answering", "qa")(None), ("None",))
_api("question-answering({'question': 5, ...})",
     lambda d: pipe("question-answering", "qa")({"question": 5, "context": "c"}), ("input 0",))
_api("question-answering with an empty context",
     lambda d: pipe("question-answering", "qa")({"question": "who?", "context": ""}),
     ok=lambda r: check(r["answer"] == "" and r["start"] is None, f"got {r}"))
_api("fill-mask([[...]]) (a nested list)", lambda d: pipe("fill-mask", "mlm")([["a [MASK]"]]), ("input 0",))
_api("fill-mask(3.5)", lambda d: pipe("fill-mask", "mlm")(3.5), ("float",))
_api("multiple-choice with no choices", lambda d: pipe("multiple-choice", "mc")({"context": "c", "choices": []}),
     ("at least one choice",))
_api("sentence-embedding(None)", lambda d: _pipeline("sentence-embedding", MODELS["enc"])(None), ("None",))
_api("token-classification([5])", lambda d: pipe("token-classification", "ner")([5]), ("input 0",))


def _model(name: str = "enc"):
    return _model_from(MODELS[name])


def _model_from(directory: Path):
    from bertkit.modeling import BertModel

    return BertModel.from_pretrained(directory)


_api("BertModel: input_ids past the vocabulary",
     lambda d: _model()(torch.tensor([[101, 10**6, 102]])), ("input_ids",))
_api("BertModel: negative input_ids", lambda d: _model()(torch.tensor([[101, -1, 102]])), ("input_ids",))
_api("BertModel: float input_ids", lambda d: _model()(torch.tensor([[101.0, 2000.0, 102.0]])), ("input_ids",))
_api("BertModel: an empty batch (0 sequences)",
     lambda d: _model()(torch.zeros(0, 5, dtype=torch.long)),
     ok=lambda out: check(tuple(out.last_hidden_state.shape) == (0, 5, 32), f"shape {out.last_hidden_state.shape}"))
_api("BertModel: zero-length sequences (B, 0)",
     lambda d: _model()(torch.zeros(2, 0, dtype=torch.long)), ("empty",),
     ok=lambda out: check(tuple(out.last_hidden_state.shape) == (2, 0, 32), f"shape {out.last_hidden_state.shape}"))
_api("BertModel: a float attention_mask holding 0.5",
     lambda d: _model()(torch.tensor([[101, 2000, 102]]), attention_mask=torch.tensor([[1.0, 0.5, 1.0]])),
     ("attention_mask", "0.5"))
_api("BertModel: an additive attention_mask (0 / -10000)",
     lambda d: _model()(torch.tensor([[101, 2000, 102]]), attention_mask=torch.tensor([[0.0, 0.0, -10000.0]])),
     ("attention_mask", "-10000.0", "additive"))
_api("BertModel: an int attention_mask holding 2",
     lambda d: _model()(torch.tensor([[101, 2000, 102]]), attention_mask=torch.tensor([[1, 2, 1]])),
     ("attention_mask", "2"))
_api("BertModel: a float attention_mask of 0/1 (as transformers users pass) equals the long one",
     lambda d: [_model()(torch.tensor([[101, 2000, 102, 0]]), attention_mask=m).last_hidden_state
                for m in (torch.tensor([[1.0, 1.0, 1.0, 0.0]]), torch.tensor([[1, 1, 1, 0]]))],
     ok=lambda r: check(torch.equal(r[0], r[1]), "float and long masks give different outputs"))
_api("BertModel: attention_mask all zero in a row",
     lambda d: _model()(torch.tensor([[101, 2000, 102]]), attention_mask=torch.zeros(1, 3, dtype=torch.long)),
     ("attention_mask",), ok=lambda out: check(bool(torch.isfinite(out.last_hidden_state).all()), "NaN outputs"))


def _broken_checkpoint(d: Path, name: str, edit: Callable[[Path], None]) -> Path:
    m = copy_model(MODELS[name], d / "m")
    edit(m)
    return m


def _config_edit(**changes) -> Callable[[Path], None]:
    def edit(m: Path) -> None:
        text = (m / "config.json").read_text()
        config = json.loads(text)
        config.update(changes)
        (m / "config.json").write_text(json.dumps(config))  # json writes float('nan') as NaN
    return edit


_api("checkpoint: NaN in config.json (layer_norm_eps)",
     lambda d: _pipeline("text-classification", _broken_checkpoint(d, "clf", _config_edit(layer_norm_eps=float("nan")))),
     ("layer_norm_eps",))
_api("checkpoint: NaN in config.json (hidden_dropout_prob)",
     lambda d: _pipeline("text-classification",
                         _broken_checkpoint(d, "clf", _config_edit(hidden_dropout_prob=float("nan")))),
     ("hidden_dropout_prob",))
_api("checkpoint: Infinity in config.json (initializer_range)",
     lambda d: _pipeline("text-classification",
                         _broken_checkpoint(d, "clf", _config_edit(initializer_range=float("inf")))),
     ("initializer_range",))
_api("checkpoint: config.json says vocab_size 2**40",
     lambda d: _pipeline("text-classification", _broken_checkpoint(d, "clf", _config_edit(vocab_size=2**40))),
     ("vocab_size 1099511627776",))
_api("checkpoint: config.json says num_hidden_layers 200,000 (the weights hold 2)",
     lambda d: _pipeline("text-classification",
                         _broken_checkpoint(d, "clf", _config_edit(num_hidden_layers=200_000))),
     ("num_hidden_layers is 200000 but the weights have 2",))
_api("checkpoint: config.json's hidden_size is not the weights'",
     lambda d: _model_from(_broken_checkpoint(d, "enc", _config_edit(hidden_size=64, intermediate_size=128))),
     ("hidden_size is 64 but the weights have 32", "intermediate_size is 128"))
_api("BertModel(a config whose parameters exceed this machine's memory)",
     lambda d: __import__("bertkit").BertModel(__import__("bertkit").BertConfig(
         hidden_size=1024, num_attention_heads=16, intermediate_size=4096, num_hidden_layers=20_000)),  # 1 TB
     ("GiB of memory",))
_api("checkpoint: config.json is not JSON",
     lambda d: _pipeline("text-classification", _broken_checkpoint(
         d, "clf", lambda m: (m / "config.json").write_text("{oops"))), ("config.json",))
_api("checkpoint: config.json is a list",
     lambda d: _pipeline("text-classification", _broken_checkpoint(
         d, "clf", lambda m: (m / "config.json").write_text("[1, 2]"))), ("config.json",))


def _truncate(fraction: float) -> Callable[[Path], None]:
    def edit(m: Path) -> None:
        data = (m / "model.safetensors").read_bytes()
        (m / "model.safetensors").write_bytes(data[: int(len(data) * fraction)])
    return edit


_api("checkpoint: model.safetensors truncated to half",
     lambda d: _pipeline("text-classification", _broken_checkpoint(d, "clf", _truncate(0.5))), ("model.safetensors",))
_api("checkpoint: model.safetensors truncated to 4 bytes (encoder pipeline)",
     lambda d: _pipeline("feature-extraction", _broken_checkpoint(d, "enc", _truncate(4 / 5e6))),
     ("model.safetensors",))
_api("checkpoint: model.safetensors truncated by 8 bytes (BertModel.from_pretrained)",
     lambda d: _model_from(_broken_checkpoint(d, "enc", lambda m: (m / "model.safetensors").write_bytes(
         (m / "model.safetensors").read_bytes()[:-8]))), ("model.safetensors",))
_api("checkpoint: vocab.txt missing",
     lambda d: _pipeline("text-classification", _broken_checkpoint(
         d, "clf", lambda m: (m / "vocab.txt").unlink())), ("vocab.txt",))


class _Payload:
    """Unpickling this runs os.system-like code: here it only creates a marker file."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def _pickle_checkpoint(d: Path) -> Path:
    m = copy_model(MODELS["clf"], d / "m")
    (m / "model.safetensors").unlink()
    with open(m / "pytorch_model.bin", "wb") as f:
        pickle.dump({"bert.embeddings.word_embeddings.weight": _Payload(d / "PWNED")}, f)
    return m


def _pickle_case(d: Path) -> object:
    try:
        return _pipeline("text-classification", _pickle_checkpoint(d))
    finally:
        if (d / "PWNED").exists():
            raise RuntimeError("the pickle's code ran")


@case("python", "checkpoint: a pickle payload in pytorch_model.bin must never run")
def _(d: Path) -> Outcome:
    out = api_outcome(lambda: _pickle_case(d), ("pytorch_model.bin",))
    if (d / "PWNED").exists():
        return Outcome("data-loss", "the pickle's code ran")
    return out


# -------------------------------------------------------------------------------------------------
# output-dirs: bertkit deletes or replaces only what it can prove it wrote, never a command's inputs
# -------------------------------------------------------------------------------------------------


def _owned_outcome(fn: Callable[[], object], expect: tuple[str, ...], lost: Callable[[], str | None],
                   ok: Callable[[object], Outcome] | None = None) -> Outcome:
    """``api_outcome``, but a user's file removed or changed is data-loss whatever the call did."""
    outcome = api_outcome(fn, expect, ok)
    what = lost()
    return Outcome("data-loss", what) if what else outcome


def _claim_and_release(path: Path, command: str, **kwargs) -> object:
    from bertkit.outputs import claim_output_dir

    claim = claim_output_dir(path, command, **kwargs)
    claim.release(True)  # a claim that succeeded: let go of it (this process goes on to other cases)
    return claim


def _killed_claim(path: Path, command: str, **kwargs):
    """A claim whose process was SIGKILLed: its lock dropped, its marker left unfinished."""
    import bertkit.outputs as outputs

    claim = outputs.claim_output_dir(path, command, **kwargs)
    active = getattr(outputs, "_ACTIVE", [])  # the claims this process holds (it "dies": they go)
    return claim, lambda: (active.remove(claim) if claim in active else None, claim.lock.close())


@case("output-dirs", "--overwrite of a killed run: a notebook saved there while it ran")
def _(d: Path) -> Outcome:
    from bertkit.outputs import atomic_write_text

    claim, kill = _killed_claim(d / "run", "pretrain")
    atomic_write_text(d / "run" / "checkpoints" / "state.pt", "weights")
    notebook = write(d, "run/analysis.ipynb", b"the user's notebook")
    kill()
    return _owned_outcome(lambda: _claim_and_release(d / "run", "pretrain", overwrite=True), ("analysis.ipynb",),
                          unchanged(notebook, b"the user's notebook"))


@case("output-dirs", "--resume, then --overwrite: a file the user had put in the directory")
def _(d: Path) -> Outcome:
    from bertkit.outputs import atomic_write_text, output_dir

    with output_dir(d / "run", "pretrain", {"seed": 1}):
        atomic_write_text(d / "run" / "metrics.jsonl", "{}\n")
    notes = write(d, "run/notes.txt", b"mine")
    with output_dir(d / "run", "pretrain", {"seed": 1}, resume=True):
        pass
    return _owned_outcome(lambda: _claim_and_release(d / "run", "pretrain", fingerprint={"seed": 2}, overwrite=True),
                          ("notes.txt",), unchanged(notes, b"mine"))


@case("output-dirs", "--overwrite of a received directory whose marker lists ../victim.txt and an absolute path")
def _(d: Path) -> Outcome:
    victim, absolute = write(d, "victim.txt", b"the user's"), write(d, "elsewhere/abs.txt", b"the user's too")
    write(d, "received/report.json", b"{}")
    entry = {"size": 10, "sha256": hashlib.sha256(b"the user's").hexdigest()}
    write(d, "received/.bertkit-run.json", json.dumps({"command": "pretrain", "finished": True, "cwd": str(d),
                                                       "files": {p: entry for p in ("../victim.txt", str(absolute),
                                                                                    "report.json")}}))

    def lost() -> str | None:
        return unchanged(victim, b"the user's")() or unchanged(absolute, b"the user's too")()
    return _owned_outcome(lambda: _claim_and_release(d / "received", "pretrain", overwrite=True), ("outside",), lost)


@case("output-dirs", ".bertkit-lock is a symlink to a user's file")
def _(d: Path) -> Outcome:
    precious = write(d, "precious.txt", b"the user's data")
    (d / "out").mkdir()
    (d / "out" / ".bertkit-lock").symlink_to(precious)
    return _owned_outcome(lambda: _claim_and_release(d / "out", "pretrain"), ("symbolic link",),
                          unchanged(precious, b"the user's data"))


def _data_run(directory: Path) -> Path:
    """A directory as `create-pretraining-data` leaves it (its marker records the files)."""
    from bertkit.outputs import atomic_write_text, output_dir

    with output_dir(directory, "create-pretraining-data"):
        atomic_write_text(directory / "manifest.json", "{}")
        atomic_write_text(directory / "vocab.txt", "[PAD]\n")
    return directory / "manifest.json"


@case("output-dirs", "pretrain --overwrite with --output-dir equal to its --data")
def _(d: Path) -> Outcome:
    manifest = _data_run(d / "data")
    run = bertkit("pretrain", "--data", d / "data", "--vocab", d / "data", "--output-dir", d / "data", "--overwrite",
                  "--max-steps", 1, "--no-progress")
    return cli_outcome(run, ("inputs", "--data"), after=unchanged(manifest, b"{}"))


@case("output-dirs", "pretrain --overwrite with --output-dir holding its --data")
def _(d: Path) -> Outcome:
    manifest = _data_run(d / "runs" / "data")
    run = bertkit("pretrain", "--data", d / "runs" / "data", "--vocab", d / "runs" / "data", "--output-dir",
                  d / "runs", "--overwrite", "--max-steps", 1, "--no-progress")
    return cli_outcome(run, ("inputs", "--data"), after=unchanged(manifest, b"{}"))


@case("output-dirs", "predict --overwrite with --output-file equal to its --input")
def _(d: Path) -> Outcome:
    texts = write(d, "texts.jsonl", b'{"text": "a fine film"}\n')
    run, _ = predict(d, texts, "--overwrite", out=texts)
    return cli_outcome(run, ("input",), after=unchanged(texts, b'{"text": "a fine film"}\n'))


@case("output-dirs", "export onnx --overwrite into a directory a running command holds")
def _(d: Path) -> Outcome:
    held = d / "held"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import time; from bertkit.outputs import claim_output_dir, atomic_write_text;"
         f"c = claim_output_dir({str(held)!r}, 'finetune glue'); atomic_write_text({str(held / 'report.json')!r}, "
         "'theirs'); print('ready', flush=True); time.sleep(120)"], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        if holder.stdout.readline().strip() != "ready":
            return Outcome("traceback", "the holding process did not start")
        run = bertkit("export", "onnx", "--model", MODELS["clf"], "--out", held / "report.json", "--overwrite")
        return cli_outcome(run, ("in use by",), after=unchanged(held / "report.json", b"theirs"))
    finally:
        holder.kill()
        holder.wait()


@case("output-dirs", "export onnx --overwrite: the new graph fails its check")
def _(d: Path) -> Outcome:
    import bertkit.inference.export as export

    out = write(d, "model.onnx", b"the earlier export, in production")
    real = export.max_abs_difference
    export.max_abs_difference = lambda *args: 1.0  # a wrong graph, as an exporter bug would make
    try:
        return _owned_outcome(lambda: export.export_onnx(MODELS["clf"], out, overwrite=True), ("left as it was",),
                              unchanged(out, b"the earlier export, in production"))
    finally:
        export.max_abs_difference = real


@case("output-dirs", "export onnx --opset 13 (before the attention operator)")
def _(d: Path) -> Outcome:
    return cli_outcome(bertkit("export", "onnx", "--model", MODELS["clf"], "--out", d / "m.onnx", "--opset", 13),
                       ("supported opsets",))


@case("output-dirs", "convert-tf-checkpoint: one flipped byte in the data shard (crc32c recorded)")
def _(d: Path) -> Outcome:

    ckpt = tf_checkpoint(d)  # its bundle records each tensor's crc32c, as TensorFlow writes it
    shard = Path(f"{ckpt}.data-00000-of-00001")
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x10
    shard.write_bytes(bytes(data))
    run = convert(d, ckpt)
    return cli_outcome(run, ("fails its checksum", "data-00000-of-00001"),
                       ok=lambda: Outcome("silent-wrong", "a corrupted data shard converted without error"))



# ---- serve ----
# `bertkit serve` as its own process on 127.0.0.1: requests that must be refused naming what is wrong (a
# misspelled, unknown, duplicated or out-of-range field), bodies built to exhaust it (deep nesting, doc_stride 1,
# top_k 100,000), and clients that hold it (a slow body, a disconnect mid-body, a flood, SIGTERM with a slow
# client). Every server runs under coreutils' timeout (it stops itself), and each case stops the ones it started.

SERVE_LIFETIME_S = 300  # the longest a campaign server may live, whatever becomes of the campaign
_SERVERS: dict[tuple, tuple[subprocess.Popen, str]] = {}


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(task: str, model: str, *flags: object, shared: bool = True) -> tuple[subprocess.Popen, str]:
    """(process, url) of ``bertkit serve`` on ``MODELS[model]``; shared servers are reused by later cases."""
    import httpx

    key = (task, model, *map(str, flags))
    if shared and key in _SERVERS and _SERVERS[key][0].poll() is None:
        return _SERVERS[key]
    port = _free_port()
    cmd = ["timeout", "--signal=TERM", "--kill-after=10", str(SERVE_LIFETIME_S), sys.executable, "-m", "bertkit",
           "serve", "--model", str(MODELS[model]), "--task", task, "--port", str(port), "--log-level", "warning",
           *map(str, flags)]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 90
    while time.time() < deadline and proc.poll() is None:
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.2)
    else:
        _stop(proc)
        raise RuntimeError(f"bertkit serve did not answer /health within 90 s: {proc.stderr.read()[-300:]}")
    if shared:
        if not _SERVERS:
            atexit.register(_stop_servers)
        _SERVERS[key] = (proc, url)
    return proc, url


def _stop(proc: subprocess.Popen, grace: float = 30) -> float:
    """SIGTERM to the server (the timeout wrapper passes it on), SIGKILL after ``grace`` s; seconds it took."""
    t0 = time.perf_counter()
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return time.perf_counter() - t0


def _stop_servers() -> None:
    while _SERVERS:
        _stop(_SERVERS.popitem()[1][0])


def _post(url: str, body: dict | bytes, route: str = "predict", timeout: float = 60):
    import httpx

    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    try:
        return httpx.post(f"{url}/{route}", content=content, headers={"content-type": "application/json"},
                          timeout=timeout)
    except httpx.TimeoutException:
        return None


def http_outcome(r, expect: tuple[str, ...] = (), ok: Callable[[object], Outcome] | None = None,
                 max_answer_bytes: int = 2_000_000, max_seconds: float = 30) -> Outcome:
    """The class of a server's answer: a 4xx whose error holds ``expect`` is clear; a 5xx is a traceback; a 200
    is checked by ``ok`` (none: silent-wrong); an answer too large or too slow exceeded a resource bound."""
    if r is None:
        return Outcome("hang", "no answer within the client's timeout")
    seconds = r.elapsed.total_seconds()
    if len(r.content) > max_answer_bytes or seconds > max_seconds:
        return Outcome("resource-bound-exceeded", f"HTTP {r.status_code}, {len(r.content):,} bytes in {seconds:.1f} s")
    try:
        error = r.json().get("error", "") if r.status_code >= 400 else ""
    except ValueError:
        error = r.text[:160]
    if r.status_code >= 500:
        return Outcome("traceback", f"HTTP {r.status_code}: {error[:160]}")
    if 400 <= r.status_code < 500:
        missing = [e for e in expect if e not in error]
        if missing:
            return Outcome("traceback", f"HTTP {r.status_code} without {missing}: {error[:160]}")
        return Outcome("clear-error", f"HTTP {r.status_code}: {error[:180]}")
    if ok is None:
        return Outcome("silent-wrong", f"HTTP 200 where an error was expected: {r.text[:100]}")
    return ok(r.json())


QA_INPUT = {"question": "Who led the Vikings?", "context": "Normandy was settled in the 10th century by Vikings led "
                                                            "by Rollo, who swore fealty to the king."}


def _serve_case(name: str, task: str, model: str, body: dict | bytes, expect: tuple[str, ...]):
    @case("serve", name)
    def _(d: Path) -> Outcome:
        _, url = _serve(task, model)
        return http_outcome(_post(url, body), expect)


@case("serve", "question-answering: a good request (the good path, equal to the pipeline)")
def _(d: Path) -> Outcome:
    _, url = _serve("question-answering", "qa")
    want = pipe("question-answering", "qa")(QA_INPUT)
    return http_outcome(_post(url, {"inputs": QA_INPUT}), ok=lambda got: check(
        (got["answer"], got["start"], got["end"]) == (want["answer"], want["start"], want["end"]),
        f"answered {got}, the pipeline gives {want}"))


_serve_case("misspelled key: a pair's text_pairr", "text-classification", "clf",
            {"inputs": {"text": "a good film", "text_pairr": "a bad one"}}, ("text_pairr",))
_serve_case("misspelled key: parameter stride for doc_stride", "question-answering", "qa",
            {"inputs": QA_INPUT, "parameters": {"stride": 64}}, ("stride",))
_serve_case("unknown key at the top level: parameter", "text-classification", "clf",
            {"inputs": "a film", "parameter": {"top_k": 1}}, ("parameter",))
_serve_case("wrong type: doc_stride \"128\"", "question-answering", "qa",
            {"inputs": QA_INPUT, "parameters": {"doc_stride": "128"}}, ("doc_stride",))
_serve_case("wrong type: parameters is a list", "text-classification", "clf",
            {"inputs": "a film", "parameters": []}, ("parameters must be an object",))
_serve_case("bool as int: handle_impossible_answer 1", "question-answering", "qa",
            {"inputs": QA_INPUT, "parameters": {"handle_impossible_answer": 1}}, ("handle_impossible_answer",))
_serve_case("bool as int: top_k true", "fill-mask", "mlm",
            {"inputs": "a [MASK] film", "parameters": {"top_k": True}}, ("top_k",))
_serve_case("negative: max_answer_len -1", "question-answering", "qa",
            {"inputs": QA_INPUT, "parameters": {"max_answer_len": -1}}, ("max_answer_len",))
_serve_case("zero: top_k 0", "fill-mask", "mlm", {"inputs": "a [MASK] film", "parameters": {"top_k": 0}}, ("top_k",))
_serve_case("zero: doc_stride 0", "question-answering", "qa",
            {"inputs": QA_INPUT, "parameters": {"doc_stride": 0}}, ("doc_stride",))
_serve_case("huge: max_question_len 10**9", "question-answering", "qa",
            {"inputs": QA_INPUT, "parameters": {"max_question_len": 10**9}}, ("max_question_len",))
_serve_case("non-finite: null_threshold 1e400", "question-answering", "qa",
            b'{"inputs": {"question": "q", "context": "c"}, "parameters": {"null_threshold": 1e400}}',
            ("null_threshold",))
_serve_case("non-finite: top_k NaN", "fill-mask", "mlm",
            b'{"inputs": "a [MASK] film", "parameters": {"top_k": NaN}}', ("NaN",))
_serve_case("duplicate key: inputs twice", "text-classification", "clf",
            b'{"inputs": "a good film", "inputs": "a bad film"}', ("twice",))
_serve_case("duplicate parameter: max_answer_len and max_answer_length", "question-answering", "qa",
            {"inputs": QA_INPUT, "parameters": {"max_answer_len": 3, "max_answer_length": 30}}, ("same parameter",))
_serve_case("deep nesting: 100,000 lists", "text-classification", "clf",
            b"[" * 100_000 + b"]" * 100_000, ("max_json_depth",))


@case("serve", "unknown key in the query string: /predict?top_k=1")
def _(d: Path) -> Outcome:
    _, url = _serve("text-classification", "clf")
    return http_outcome(_post(url, {"inputs": "a good film"}, route="predict?top_k=1"), ("query",))


@case("serve", "amplification: 330 KB of question-answering at doc_stride 1")
def _(d: Path) -> Outcome:
    _, url = _serve("question-answering", "qa")
    context = " ".join(f"word{i % 89}" for i in range(3300))[:19_500]
    body = {"inputs": [{"question": "which word?", "context": context}] * 17, "parameters": {"doc_stride": 1}}
    return http_outcome(_post(url, body, timeout=120), ("max_windows_per_request",), max_seconds=10)


@case("serve", "amplification: fill-mask top_k 100,000 on 20 masks")
def _(d: Path) -> Outcome:
    _, url = _serve("fill-mask", "mlm")
    body = {"inputs": " ".join(["[MASK]"] * 20), "parameters": {"top_k": 100_000}}
    return http_outcome(_post(url, body, timeout=120), ("top_k",), max_answer_bytes=2_000_000)


@case("serve", "amplification: multiple-choice with 2,000 choices")
def _(d: Path) -> Outcome:
    _, url = _serve("multiple-choice", "mc")
    body = {"inputs": {"context": "c", "choices": ["x"] * 2000}}
    return http_outcome(_post(url, body, timeout=120), ("2000 choices",), max_seconds=10)


def _raw(port: int, head: bytes):
    """A raw connection that has sent ``head`` (a request whose body is not all there)."""
    import socket

    sock = socket.create_connection(("127.0.0.1", port), timeout=20)
    sock.sendall(head)
    return sock


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


@case("serve", "slow client: declares 100 bytes, sends 1")
def _(d: Path) -> Outcome:
    proc, url = _serve("text-classification", "clf", "--body-timeout-s", 2, shared=False)
    try:
        sock = _raw(_port(url), b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
        t0 = time.perf_counter()
        raw = b""
        try:
            while chunk := sock.recv(65536):
                raw += chunk
        except TimeoutError:
            return Outcome("hang", f"no answer and the connection still open after {time.perf_counter() - t0:.0f} s")
        finally:
            sock.close()
        waited = time.perf_counter() - t0
        if raw.startswith(b"HTTP/1.1 408") and b"body_timeout_s" in raw:
            return Outcome("clear-error", f"408 after {waited:.1f} s, connection closed")
        return Outcome("traceback", f"answered {raw[:80]!r} after {waited:.1f} s")
    finally:
        _stop(proc)


@case("serve", "slow client holding the server at SIGTERM (--graceful-shutdown-s 2)")
def _(d: Path) -> Outcome:
    proc, url = _serve("text-classification", "clf", "--graceful-shutdown-s", 2, "--body-timeout-s", 120,
                       shared=False)
    sock = _raw(_port(url), b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
    try:
        time.sleep(0.5)
        took = _stop(proc, grace=30)
    finally:
        sock.close()
    if took > 10:
        return Outcome("hang", f"SIGTERM took {took:.1f} s (killed at 30 s) with the grace period 2 s")
    if proc.returncode != 0:
        return Outcome("traceback", f"exit {proc.returncode} after SIGTERM: {_last(proc.stderr.read())[:140]}")
    return Outcome("ok", f"exited 0 {took:.1f} s after SIGTERM")


@case("serve", "disconnect mid-body, then a request")
def _(d: Path) -> Outcome:
    import httpx

    _, url = _serve("text-classification", "clf")
    body = json.dumps({"inputs": ["a long text"] * 8}).encode()
    for _ in range(5):
        sock = _raw(_port(url), b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body)
                    + body[: len(body) // 2])
        sock.close()
    time.sleep(0.5)
    admitted = httpx.get(f"{url}/ready", timeout=10).json()["admitted_inputs"]
    after = _post(url, {"inputs": "a good film"}, timeout=30)
    if after is None:
        return Outcome("hang", "the request after the disconnects got no answer")
    return check(admitted == 0 and after.status_code == 200,
                 f"admitted_inputs {admitted}, then HTTP {after.status_code}", klass="resource-bound-exceeded")


@case("serve", "flood: 200 requests at once on --max-concurrent-requests 8")
def _(d: Path) -> Outcome:
    import asyncio

    import httpx

    proc, url = _serve("text-classification", "clf", "--max-concurrent-requests", 8, "--max-items", 8,
                       shared=False)

    async def flood() -> list:
        limits = httpx.Limits(max_connections=200, max_keepalive_connections=0)
        async with httpx.AsyncClient(timeout=60, limits=limits) as client:
            async def one(i: int):
                try:
                    return (await client.post(f"{url}/predict", json={"inputs": [f"text {i}"] * 4})).status_code
                except httpx.TimeoutException:
                    return "timeout"
                except httpx.TransportError as e:
                    return type(e).__name__
            return await asyncio.gather(*(one(i) for i in range(200)))

    try:
        codes = Counter(asyncio.run(flood()))
        health = httpx.get(f"{url}/health", timeout=10).status_code
        admitted = httpx.get(f"{url}/ready", timeout=10).json()["admitted_inputs"]
    finally:
        _stop(proc)
    if codes.get("timeout"):
        return Outcome("hang", f"{codes['timeout']} of 200 clients timed out at 60 s: {dict(codes)}")
    if set(codes) - {200, 429}:
        return Outcome("traceback", f"answers {dict(codes)}")
    if health != 200 or admitted != 0 or codes[200] < 2:
        return Outcome("resource-bound-exceeded", f"answers {dict(codes)}, /health {health}, admitted_inputs "
                                                  f"{admitted} after")
    return Outcome("ok", f"answers {dict(codes)}; /health 200 and nothing admitted after")


# ---- serve: the OpenAI and text-embeddings-inference routes ----
# /v1/embeddings, /rerank, /tokenize, /decode, /embed_all, /metrics and --api-key on their own servers: every field
# misspelled, of the wrong type, out of range or past a bound is refused naming it; the good paths equal the pipeline.

_EMB = ("sentence-embedding", "enc")
_RR = ("rerank", "reg")  # a one-logit classifier is a cross-encoder


def _route_case(name: str, server: tuple[str, str], route: str, body: dict | bytes, expect: tuple[str, ...]):
    @case("serve-routes", name)
    def _(d: Path) -> Outcome:
        _, url = _serve(*server)
        return http_outcome(_post(url, body, route), expect)


@case("serve-routes", "/v1/embeddings: a good request equals the sentence-embedding pipeline")
def _(d: Path) -> Outcome:
    _, url = _serve(*_EMB)
    texts = ["A man is eating food.", "A plane takes off."]
    want = np.asarray(pipe("sentence-embedding", "enc")(texts))
    want = want / np.linalg.norm(want, axis=1, keepdims=True)

    def same(got: dict) -> Outcome:
        vectors = np.asarray([x["embedding"] for x in sorted(got["data"], key=lambda x: x["index"])])
        return check(vectors.shape == want.shape and float(np.abs(vectors - want).max()) < 1e-4,
                     f"vectors differ from the pipeline's by {float(np.abs(vectors - want).max()):.2g}")
    return http_outcome(_post(url, {"input": texts, "encoding_format": "float"}, "v1/embeddings"), ok=same)


for _name, _body, _expect in [
    ("TEI's key 'inputs' on the OpenAI route", {"inputs": ["a"]}, ("inputs",)),
    ("encoding_format 'base65'", {"input": "a", "encoding_format": "base65"}, ("encoding_format",)),
    ("dimensions 0", {"input": "a", "dimensions": 0}, ("dimensions",)),
    ("dimensions -1", {"input": "a", "dimensions": -1}, ("dimensions",)),
    ("dimensions 10**9", {"input": "a", "dimensions": 10**9}, ("dimensions",)),
    ("dimensions 1.5", {"input": "a", "dimensions": 1.5}, ("dimensions",)),
    ("dimensions true", {"input": "a", "dimensions": True}, ("dimensions",)),
    ("input []", {"input": []}, ("input",)),
    ("input [['a']] (nested strings)", {"input": [["a"]]}, ("input",)),
    ("input token id past the vocabulary", {"input": [[101, 10**9, 102]]}, ("10000000",)),
    ("input token id -1", {"input": [[101, -1, 102]]}, ("-1",)),
    ("input 100,000 strings", {"input": ["a"] * 100_000}, ("input",)),
]:
    _route_case(f"/v1/embeddings: {_name}", _EMB, "v1/embeddings", _body, _expect)


@case("serve-routes", "/rerank: a good request equals the rerank pipeline, sorted by score")
def _(d: Path) -> Outcome:
    _, url = _serve(*_RR)
    texts = ["Paris is the capital of France.", "Bananas are yellow.", "France's capital city is Paris."]
    want = pipe("rerank", "reg")({"query": "capital of France", "texts": texts})

    def same(got: list) -> Outcome:
        scores = {x["index"]: x["score"] for x in got}
        order = [x["index"] for x in got]
        want_scores = {x["index"]: x["score"] for x in want} if isinstance(want, list) else {}
        return check(order == sorted(order, key=lambda i: -scores[i]) and set(scores) == {0, 1, 2}
                     and all(abs(scores[i] - want_scores.get(i, np.nan)) < 1e-5 for i in scores),
                     f"answered {got}, the pipeline gives {want}")
    return http_outcome(_post(url, {"query": "capital of France", "texts": texts}, "rerank"), ok=same)


for _name, _body, _expect in [
    ("no texts", {"query": "q"}, ("texts",)),
    ("texts []", {"query": "q", "texts": []}, ("texts",)),
    ("query 5", {"query": 5, "texts": ["a"]}, ("query",)),
    ("raw_scores 'yes'", {"query": "q", "texts": ["a"], "raw_scores": "yes"}, ("raw_scores",)),
    ("misspelled return_texts", {"query": "q", "texts": ["a"], "return_texts": True}, ("return_texts",)),
    ("10,000 texts", {"query": "q", "texts": ["a passage"] * 10_000}, ("texts",)),
]:
    _route_case(f"/rerank: {_name}", _RR, "rerank", _body, _expect)

for _route, _name, _body, _expect in [
    ("tokenize", "add_special_tokens 'no'", {"inputs": "a", "add_special_tokens": "no"}, ("add_special_tokens",)),
    ("tokenize", "inputs 5", {"inputs": 5}, ("inputs",)),
    ("decode", "an id past the vocabulary", {"ids": [101, 10**9]}, ("1000000000",)),
    ("decode", "a negative id", {"ids": [-5]}, ("-5",)),
    ("decode", "ids as strings", {"ids": ["101"]}, ("ids",)),
    ("embed_all", "64 inputs of 500 words (the answer would be ~250 MB)", {"inputs": ["word " * 500] * 64},
     ("max_candidates",)),
]:
    _route_case(f"/{_route}: {_name}", _EMB, _route, _body, _expect)


@case("serve-routes", "--api-key: no key, a wrong key and the right key on /v1/embeddings and /metrics")
def _(d: Path) -> Outcome:
    import httpx

    key = "campaign-key-0123456789"
    proc, url = _serve(*_EMB, "--api-key", key, shared=False)
    try:
        body = json.dumps({"input": "a"}).encode()
        answers = {}
        for who, headers in [("none", {}), ("wrong", {"authorization": "Bearer nope"}),
                             ("right", {"authorization": f"Bearer {key}"})]:
            answers[who] = (httpx.post(f"{url}/v1/embeddings", content=body, timeout=30, headers={
                "content-type": "application/json", **headers}).status_code,
                httpx.get(f"{url}/metrics", timeout=30, headers=headers).status_code)
        health = httpx.get(f"{url}/health", timeout=30).status_code
    finally:
        _stop(proc)
    return check(answers == {"none": (401, 401), "wrong": (401, 401), "right": (200, 200)} and health == 200,
                 f"statuses {answers}, /health {health}")


# -------------------------------------------------------------------------------------------------
# Main
# -------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    global TIMEOUT, W, SUBPROCESS
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default=None, help="run the cases whose surface or name holds this text")
    parser.add_argument("--timeout", type=float, default=TIMEOUT, help="seconds per case before it counts as a hang")
    parser.add_argument("--workdir", type=Path, default=None, help="keep fixtures and outputs here (default: a "
                        "temporary directory, removed at the end)")
    parser.add_argument("--json", type=Path, default=None, help="also write the table as JSON lines here")
    parser.add_argument("--subprocess", action="store_true", help="run every command as its own process "
                        "(python -m bertkit: real exit codes; slower), not through cli.main in this process")
    args = parser.parse_args(argv)
    TIMEOUT, SUBPROCESS = args.timeout, args.subprocess
    if not (MINILM / "vocab.txt").is_file():
        print(f"{MINILM}/vocab.txt not found: run `make model` first (the tiny models use MiniLM's vocabulary)")
        return 2
    torch.set_num_threads(1)
    cases = [c for c in CASES if args.only is None or args.only in c.surface or args.only in c.name]
    with contextlib.ExitStack() as stack:
        W = args.workdir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bertkit-campaign-")))
        W.mkdir(parents=True, exist_ok=True)
        MODELS.update(build_models(W))
        rows = []
        width = max(len(f"{c.surface}: {c.name}") for c in cases)
        for i, c in enumerate(cases):
            d = W / "cases" / f"{i:03d}"
            d.mkdir(parents=True, exist_ok=True)
            t0 = time.perf_counter()
            try:
                outcome = c.fn(d)
            except Exception as e:  # noqa: BLE001 - a fixture failing is reported, not fatal to the campaign
                outcome = Outcome("traceback", f"(in the campaign's own setup) {type(e).__name__}: {e}"[:200])
            seconds = time.perf_counter() - t0
            rows.append({"surface": c.surface, "case": c.name, "class": outcome.klass, "detail": outcome.detail,
                         "seconds": round(seconds, 1)})
            print(f"{c.surface + ': ' + c.name:<{width}}  {outcome.klass:<12} {seconds:5.1f}s  {outcome.detail}",
                  flush=True)
        counts = Counter(r["class"] for r in rows)
        print()
        print("| class | cases |")
        print("|---|---|")
        for k in ("ok", "clear-error", "traceback", "silent-wrong", "data-loss", "hang", "resource-bound-exceeded"):
            print(f"| {k} | {counts.get(k, 0)} |")
        print(f"| total | {len(rows)} |")
        by_surface = Counter((r["surface"], r["class"]) for r in rows)
        print("\nby surface: " + "; ".join(f"{s} {k} {n}" for (s, k), n in sorted(by_surface.items())))
        if args.json:
            args.json.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return 0 if all(r["class"] in GOOD for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
