"""Users' files in, predictions out: ``bertkit predict TASK --input FILE --output-file FILE``.

What is read, what is refused and what is written: docs/inference.md, "Your own files".
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bertkit.errors import (
    BertkitError,
    MissingFileError,
    NonFiniteError,
    NotStandardJson,
    read_json_object,
    standard_json,
)
from bertkit.inference.base import refuse_empty_text
from bertkit.inference.tasks import TASK_LIST, Task, task_named
from bertkit.tasks.files import MAX_LINE_BYTES, file_format, other_separator, read_records, second_text_fields

logger = logging.getLogger("bertkit")
CHUNK_BATCHES = 64  # batches per chunk of inputs, and
MIN_CHUNK = 1024  # inputs per chunk at the least: the unit a killed run's rows are kept in, and resumed from


@dataclass(frozen=True)
class Columns:
    """Which column (CSV/TSV header) or field (JSONL) holds each part of an input."""

    text: str = "text"
    text_pair: str | None = None
    query: str = "query"
    question: str = "question"
    context: str = "context"
    choices: str = "choices"
    id: str | None = None
    label: str | None = None  # finetune classify's label column (read with ``rows=True``)


def read_inputs(path: str | os.PathLike, task: str, columns: Columns = Columns(), input_format: str = "auto", *,
                tokenizer: Any, max_line_bytes: int = MAX_LINE_BYTES, pair_model: bool = False,
                rows: bool = False) -> tuple[list[Any], list[Any]]:
    """The pipeline inputs in ``path`` and their ids, in file order; a bad record names its file and line.

    ``input_format``: jsonl, csv, tsv, text, or auto (by suffix). ``tokenizer`` (the model's; no weights are
    needed) decides, before the model loads, what the pipeline would refuse: an empty text (``refuse_empty_text``,
    the pipelines' one rule) and a fill-mask text without its mask token.
    ``max_line_bytes``: the longest line read (see ``bertkit.tasks.files``). A record holding a second text that
    ``columns`` does not name (``text_pair``, ``sentence2``, ...) is refused when ``pair_model`` (the model was
    fine-tuned on pairs), else logged as a warning, once, naming the first line that holds one. ``rows`` (finetune
    classify): every record must name its columns (no plain text), and each item carries its
    ``line`` and, when ``columns.label`` names one, its ``label``.
    """
    path = Path(path)
    spec = task_named(task)
    fields, _ = spec.record_fields()
    fmt = _input_format(path, spec, fields, columns, input_format, rows)
    takes_pairs = "text_pair" in fields and columns.text_pair is None
    # a classifier's pairs only: an embedding of two texts joined is not what sentence-transformers' encode gives
    # for such a file (each text's own vector), so there a text_pair field is warned about as any second text is
    implies = takes_pairs and spec.pair_head
    unnamed_pair: tuple[int, list[str]] | None = None  # the first line holding a second text no flag names
    implied: int | None = None  # the first record's line, where its "text_pair" field made the file one of pairs
    inputs: list[Any] = []
    ids: list[Any] = []
    for line, record in read_records(path, fmt, max_line_bytes):
        if implies and not inputs and isinstance(record, dict) and _implies_pairs(record, columns):
            # transformers' text-classification pipeline reads {"text", "text_pair"} as a pair: so is such a file
            implied, columns = line, dataclasses.replace(columns, text_pair=IMPLIED_PAIR)
            _refuse_two_second_texts(path, line, record, columns, fmt)
        elif implies and inputs and isinstance(record, dict) and (implied is not None) != (IMPLIED_PAIR in record):
            raise BertkitError(_mixed_pairs(path, line, implied, fmt))
        bare = isinstance(record, str) and fields[0] == "text" and not columns.text_pair and not rows
        if bare:  # a text file's line, a JSON string: the text alone, checked as a text field is
            if columns.id is not None:  # its id would be its position, beside the other lines' ids from the column
                fix = "a .txt file has no columns: write JSONL, CSV or TSV" if fmt == "text" else "write an object"
                raise BertkitError(f"{path}:{line}: a bare text has no {columns.id!r} field for --id-column; {fix} "
                                   "holding the id, or leave --id-column out")
            record = {columns.text: record}
        if not isinstance(record, dict):
            array = " (a JSON array: write JSON lines, one object per line)" if isinstance(record, list) else ""
            raise BertkitError(f"{path}:{line}: expected an object with fields "
                               f"{', '.join(str(getattr(columns, f)) for f in fields if getattr(columns, f))}, "
                               f"got {type(record).__name__}{array}")
        if takes_pairs and implied is None and unnamed_pair is None:
            found = second_text_fields(record, used=(columns.text, columns.id, columns.label))
            if found:
                unnamed_pair = (line, found)
                if pair_model:
                    raise BertkitError(_unnamed_pair(path, line, found, fmt, refused=True))
        item = _record_item(path, line, record, spec, fields, columns, fmt, tokenizer)
        if rows:
            item["line"] = line
            if columns.label is not None:
                item["label"] = _label(path, line, columns.label, record, fmt)
        if columns.id is not None:
            if columns.id not in record:
                raise BertkitError(f"{path}:{line}: no {columns.id!r} id column")
            ids.append(record[columns.id])
        else:
            ids.append(len(ids))
        inputs.append(item["text"] if bare or fields == ("text",) else item)  # what the task's pipeline takes
    if not inputs:
        raise BertkitError(f"{path} holds no inputs (every line is empty, or only a header)")
    if unnamed_pair is not None:
        logger.warning("%s", _unnamed_pair(path, *unnamed_pair, fmt, refused=False))
    return inputs, ids


IMPLIED_PAIR = "text_pair"  # the field or column read as a pair's second text when no --text-pair-column names one


def _implies_pairs(record: dict[str, Any], columns: Columns) -> bool:
    """Whether a file whose first record is ``record`` holds pairs that no flag names: it has transformers' key
    ``text_pair`` beside the text column (a CSV's header is every row's)."""
    return IMPLIED_PAIR in record and columns.text != IMPLIED_PAIR and columns.text in record


def _refuse_two_second_texts(path: Path, line: int, record: dict[str, Any], columns: Columns, fmt: str) -> None:
    """A record holding text_pair and another field named like a pair's text (``hypothesis``, ``sentence2``): which
    one is the second text is the user's to say."""
    others = second_text_fields(record, used=(columns.text, columns.text_pair, columns.id, columns.label))
    if others:
        kind = "field" if fmt == "jsonl" else "column"
        raise BertkitError(f"{path}:{line}: the inputs hold {IMPLIED_PAIR!r} and another {kind} named like a pair's "
                           f"second text ({', '.join(map(repr, others))}); which one is the pair's is yours to say: "
                           f"pass --text-pair-column {IMPLIED_PAIR} (or --text-pair-column {others[0]})")


def _mixed_pairs(path: Path, line: int, implied: int | None, fmt: str) -> str:
    kind = "field" if fmt == "jsonl" else "column"
    if implied is not None:
        return (f"{path}:{line}: no {IMPLIED_PAIR!r} {kind}, where line {implied} holds one, which makes the file one "
                f"of (text, text_pair) pairs: a line without it would be read as a single text; give every line "
                f"its {IMPLIED_PAIR}, or put the single texts in a file of their own")
    return (f"{path}:{line}: a {IMPLIED_PAIR!r} {kind}, where the first line holds none: the file's first line makes it "
            f"one of single texts, so this pair's second text would be left out; give every line its {IMPLIED_PAIR}, "
            "or put the pairs in a file of their own")


def _input_format(path: Path, task: Task, fields: tuple[str, ...], columns: Columns, input_format: str,
                  rows: bool) -> str:
    """The format ``path`` is read as, once the task, the file and the columns are known to fit together; checked
    before any line is read."""
    if path.is_dir():
        raise BertkitError(f"{path} is a directory; pass the file of inputs")  # --input, --train-file, ...
    if not path.is_file():
        raise MissingFileError(f"input file not found: {path}")
    # finetune classify's label column too: a label read from a text column is a class per text, and a text read
    # from the label column is a model that learns to read its label.
    named = [(f, getattr(columns, f)) for f in (*fields, *(("label",) if rows else ())) if getattr(columns, f)]
    twice = next(((g, f, n) for i, (f, n) in enumerate(named) for g, m in named[:i] if m == n), None)
    if twice is not None:  # (text, text) pairs, a context that is the question: every row read, none as meant
        first, second = (f"--{x.replace('_', '-')}-column" for x in twice[:2])
        raise BertkitError(f"{first} and {second} both name the column {twice[2]!r}: each part of an input is its "
                           "own column; name the other one")
    fmt = file_format(path, input_format)
    if fmt == "text" and (fields[0] != "text" or columns.text_pair or rows):
        raise BertkitError(f"{path}: a plain-text file holds one text per line; {task.name}"
                           f"{' with pairs' if columns.text_pair else ''} needs a JSONL, CSV or TSV file with named "
                           "columns (name the format with --input-format)")
    return fmt


def _record_item(path: Path, line: int, record: dict[str, Any], task: Task, fields: tuple[str, ...],
                 columns: Columns, fmt: str, tokenizer: Any) -> dict[str, Any]:
    """The pipeline input of one record: each of ``fields`` a column is named for (``--text-pair-column`` too: a
    JSON line without it is refused, not read as a text alone), from that column, checked."""
    item: dict[str, Any] = {}
    for field in fields:
        name = getattr(columns, field)  # the column or field holding it
        if name is None:
            continue
        if name not in record:
            have = ", ".join(map(str, record)) or "none"
            flag = f"--{field.replace('_', '-')}-column"
            other = other_separator(list(record), fmt)
            fix = f"{other}; or, if that is the column, name it with {flag}" if other else f"name it with {flag}"
            raise BertkitError(f"{path}:{line}: no {name!r} {'column' if fmt != 'jsonl' else 'field'} "
                               f"(it has {have}); {fix}")
        value = _field_value(path, line, field, name, record[name], fmt, tokenizer)
        task.check_text(f"{path}:{line}", value, tokenizer)
        item[field] = value
    return item


def _field_value(path: Path, line: int, field: str, name: str, value: Any, fmt: str, tokenizer: Any) -> Any:
    """A field's value, checked: a string that is not empty (``refuse_empty_text``), or for ``choices`` a non-empty
    list of them (in a CSV or TSV cell, written as a JSON list)."""
    if field == "choices" and fmt != "jsonl" and isinstance(value, str):
        try:
            value = standard_json(value)  # a CSV cell holding a JSON list, read as a JSON line is
        except json.JSONDecodeError:
            raise BertkitError(f"{path}:{line}: the {name!r} column must hold a JSON list of "
                               f"strings, got {value[:60]!r}") from None
        except NotStandardJson as e:
            raise BertkitError(f"{path}:{line}: the {name!r} column's JSON list is not valid JSON ({e}); write it as "
                               "standard JSON") from None
    ok = (isinstance(value, list) and value and all(isinstance(v, str) for v in value)
          if field == "choices" else isinstance(value, str))
    if not ok:
        raise BertkitError(f"{path}:{line}: {name!r} must be "
                           f"{'a non-empty list of strings' if field == 'choices' else 'a string'}, "
                           f"got {json.dumps(value)[:60]}")
    # An empty text is a missing value (a spreadsheet's empty cell, a null exported as ""): a prediction for it would
    # be a guess.
    for i, text in enumerate(value if field == "choices" else [value]):
        where = name if field != "choices" else f"{name}[{i}]"
        refuse_empty_text(tokenizer, text, f"{path}:{line}: {where!r}", "every input needs its text: fill in or remove "
                          f"that {'row' if fmt in ('csv', 'tsv') else 'line'}")
    return value


def _label(path: Path, line: int, name: str, record: dict[str, Any], fmt: str) -> str:
    """A record's label as written (a JSON number as its repr: "3.8", "1"; a JSON boolean as JSON writes it: "true"),
    stripped; an empty one is refused."""
    if name not in record:
        raise BertkitError(f"{path}:{line}: no {name!r} {'column' if fmt != 'jsonl' else 'field'} (it has "
                           f"{', '.join(map(str, record))}); name it with --label-column")
    value = record[name]
    if isinstance(value, bool):  # a class, as datasets' JSON reader (so run_glue.py) reads it; not the number 0 or 1
        value = json.dumps(value)
    elif isinstance(value, (int, float)):
        value = repr(value)
    if not isinstance(value, str):
        raise BertkitError(f"{path}:{line}: {name!r} must be a string, number or boolean, got "
                           f"{json.dumps(value)[:60]}")
    if not value.strip():
        raise BertkitError(f"{path}:{line}: empty {name!r}")
    return value.strip()


def _unnamed_pair(path: Path, line: int, found: list[str], fmt: str, *, refused: bool) -> str:
    kind = "field" if fmt == "jsonl" else "column"
    names = ", ".join(map(repr, found))
    if refused:
        return (f"{path}:{line}: the model was fine-tuned on text pairs and this input holds a second text ({kind} "
                f"{names}) that no flag names; pass --text-pair-column {found[0]} (the model was not trained to "
                "classify a first text alone)")
    return (f"{path}:{line}: the inputs hold a second text ({kind} {names}) that no flag names, so each is "
            f"classified on its first text alone; pass --text-pair-column {found[0]} to read pairs")


def trained_on_pairs(model: str | os.PathLike) -> bool:
    """Whether the checkpoint directory ``model`` was fine-tuned on text pairs, as its config.json says: bertkit's
    ``"text_pair": true`` (finetune glue and classify write it), or a GLUE pair task as transformers'
    ``finetuning_task`` (run_glue.py writes it). False when it says neither, or is no local directory (a Hub
    id, or a missing one: the pipeline names that when it loads)."""
    config = Path(model) / "config.json"
    if not config.is_file():
        return False
    data = read_json_object(config, "re-save the checkpoint")
    if isinstance(data.get("text_pair"), bool):
        return data["text_pair"]
    task = data.get("finetuning_task")
    if isinstance(task, str):
        from bertkit.tasks import glue

        try:
            return len(glue.get_task(task).text_columns) == 2
        except BertkitError:  # a task name that is not GLUE's (transformers writes any run_glue task name)
            return False
    return False


def check_writable(path: Path) -> None:
    """Refuse an output file whose directory cannot be written (read-only, no permission, not a directory),
    naming the file, before any work is done: the predictions would be lost at the end otherwise."""
    import tempfile

    where = Path(path).absolute().parent
    while not where.exists() and where != where.parent:  # the directories still to be made: test their ancestor
        where = where.parent
    if not where.is_dir():
        raise BertkitError(f"--output-file {path}: {where} is not a directory")
    try:
        with tempfile.TemporaryFile(dir=where):
            pass
    except OSError as e:
        raise BertkitError(f"--output-file {path} cannot be written: {e.strerror or e} in {where}; choose a "
                           "writable directory") from None


def refuse_unread(task: Any, s: Any, command: str = "bertkit predict",
                  reads: Callable[[Task], Collection[str]] = Task.settings_read) -> None:
    """A setting another task reads, given to ``task`` with other than its default (``--top-k 3`` to
    text-classification, ``--query-column`` to sentence-embedding, ``bertkit serve --pooling cls`` to fill-mask):
    refused, naming the tasks that read it, where it would be ignored and the output not what was asked for.
    ``reads(task)``: the settings ``command`` reads for a task (serve: its ``load_settings``)."""
    readers: dict[str, list[str]] = {}
    for t in TASK_LIST:
        for name in reads(t):
            readers.setdefault(name, []).append(t.name)
    read = reads(task)
    for f in dataclasses.fields(s):
        if f.name in readers and f.name not in read and getattr(s, f.name) != f.default:
            raise BertkitError(f"{command} {task.name} does not read --{f.name.replace('_', '-')} (it is for "
                               f"{', '.join(readers[f.name])}); leave it out")


def predict_file(s: Any) -> dict[str, Any]:
    """``bertkit predict TASK``: run the task's pipeline over ``s.input`` and write ``s.output_file`` (JSONL)."""
    import time

    from bertkit.inference import pipeline
    from bertkit.inference.base import int8_options
    from bertkit.partial_output import PartialOutput, file_identity, model_identity
    from bertkit.settings import resume_fingerprint

    columns = Columns(text=s.text_column, text_pair=s.text_pair_column, query=s.query_column,
                      question=s.question_column,
                      context=s.context_column, choices=s.choices_column, id=s.id_column)
    task = task_named(s.task)
    refuse_unread(task, s)
    task.check_settings(s)
    pair_model = task.pair_head and trained_on_pairs(s.model_name_or_path)
    inputs, ids = read_inputs(s.input, s.task, columns, s.input_format, max_line_bytes=s.max_line_bytes,
                              tokenizer=task.pipeline_class().tokenizer_of(s.model_name_or_path),  # no weights yet
                              pair_model=pair_model)  # checked before the model loads
    check_writable(s.output_file)  # and where the predictions go: before the model runs, not after
    # the rows of a run cut short are kept, and --resume goes on from its last chunk, batched as this run batches:
    # a run cut short is found (and a plain run refused) before the model loads
    chunk = max(s.batch_size * CHUNK_BATCHES, MIN_CHUNK)  # bounded memory; each chunk is still batched by length
    plan = {"settings": resume_fingerprint(s), "chunk": chunk, "input": file_identity(s.input),
            "model": model_identity(s.model_name_or_path)}
    partial = PartialOutput(Path(s.output_file), f"predict {s.task}", plan, resume=s.resume, overwrite=s.overwrite)
    try:  # a refusal before the run starts lets go of the output's lock (taken by PartialOutput)
        inputs, options = task.call_inputs(inputs, s)
        task.pipeline_class().check_options(options)  # --top-k and the like: before the model loads, not at its first call
        pipe = pipeline(s.task, s.model_name_or_path, device=s.device, bf16=s.bf16, batch_size=s.batch_size,
                        max_length=s.max_length, progress=False, **task.load_options(s), **int8_options(s))
        # the bounds the loaded pipeline sets (--stride below its max_length - 2): refused at the first call, the
        # refusal was taken for a record's and replaced by what encoding that record alone said
        pipe.check_options(options, pipe)
        task.check_loaded(pipe, s)
        from bertkit.progress import progress_bar

        t0 = time.perf_counter()
        out = Path(s.output_file)
    except BaseException:
        partial.release()
        raise
    with partial, progress_bar(total=len(inputs), unit="input", enabled=s.progress, desc=f"predict {s.task}",
                               dynamic_ncols=True) as bar:
        f = partial.appender(out)
        bar.update(f.rows)
        for a in range(f.rows, len(inputs), chunk):
            try:
                results = pipe(inputs[a:a + chunk], **options)
            except NonFiniteError as e:  # no record's result is written; say which record's output overflowed
                if e.index is None:
                    raise
                raise NonFiniteError(f"{s.input}: input {a + e.index + 1} (id {ids[a + e.index]!r}): {e}; nothing "
                                     f"was written to {s.output_file} (a file there is kept as it was)") from None
            except BertkitError as e:  # an input the pipeline refuses as it encodes the chunk: say which record
                raise _located(e, pipe, inputs, ids, a, chunk, options, s.input) from None
            for id_, result in zip(ids[a:a + chunk], results):
                f.write(json_line(task.record(id_, result)))
            f.commit(min(a + chunk, len(inputs)))
            bar.update(min(chunk, len(inputs) - a))
        f.close()
        partial.finish([(f.tmp, out)])
    seconds = time.perf_counter() - t0
    return {"task": s.task, "input": str(s.input), "output_file": str(s.output_file), "inputs": len(inputs),
            **pipe.precision.record(), "seconds": round(seconds, 2),
            "inputs_per_s": round(len(inputs) / max(seconds, 1e-9), 1)}


# Characters JSON writes as they are (inside strings) but Python's str.splitlines() ends a line at: a text holding one
# (NEL from cp1252 text read as Latin-1, a line separator from a word processor) made its record two or three "lines"
# to such a reader, none of them JSON. Escaped, every reader sees one line; a JSON parser reads the same string.
_LINE_BREAKS_JSON_KEEPS = str.maketrans({"\x85": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"})


def json_line(record: Any) -> str:
    """``record`` as one line of JSON lines, UTF-8 text as written (not \\u-escaped) but for line breaks."""
    return json.dumps(record, ensure_ascii=False).translate(_LINE_BREAKS_JSON_KEEPS) + "\n"


def _located(error: BertkitError, pipe: Any, inputs: list[Any], ids: list[Any], start: int, chunk: int,
             options: dict[str, Any], path: Any) -> BertkitError:
    """``error`` naming the file and the record whose encoding raised it (a fill-mask [MASK] past --max-length, which
    only the loaded pipeline knows): the chunk's inputs are encoded again, alone, without the model, until one
    fails. The error as it is when none does (it was no one input's)."""
    read = pipe.read_options(options)
    for i in range(start, min(start + chunk, len(inputs))):
        try:
            pipe.encode(pipe.check_input(inputs[i], i), **read)
        except BertkitError as e:
            return BertkitError(f"{path}: input {i + 1} (id {ids[i]!r}): {e}")
    return error
