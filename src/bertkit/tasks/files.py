"""Records from users' files: JSON lines, CSV/TSV with a header row, or plain text (one item per line).

The readers of ``bertkit predict TASK`` and ``bertkit finetune classify``; every record comes with its
1-based line number, so an error can name ``file:line``. The format is the one ``--input-format`` names,
or (``auto``) the one the file's suffix names; a suffix that names none is an error, not a guess.

A blank line is an error, except at the end of a file (its trailing newlines): an input silently skipped
would shift every later output's position against the file. In CSV a row of empty fields (``,,``) is a row.
"""

from __future__ import annotations

import csv
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bertkit.errors import BertkitError

FORMATS = ("jsonl", "csv", "tsv", "text")
SUFFIXES = {".jsonl": "jsonl", ".json": "jsonl", ".ndjson": "jsonl", ".csv": "csv", ".tsv": "tsv", ".txt": "text"}


def file_format(path: Path, input_format: str = "auto") -> str:
    """The format to read ``path`` as: ``input_format``, or with ``auto`` the one its suffix names."""
    if input_format != "auto":
        if input_format not in FORMATS:
            raise BertkitError(f"input format {input_format!r} is not one of auto, {', '.join(FORMATS)}")
        return input_format
    if path.suffix.lower() not in SUFFIXES:
        raise BertkitError(f"{path}: cannot tell the format from the suffix {path.suffix or '(none)'!r}; pass "
                           f"--input-format ({', '.join(FORMATS)}) or name the file {', '.join(SUFFIXES)}")
    return SUFFIXES[path.suffix.lower()]


def _blank_line(path: Path, line: int) -> BertkitError:
    return BertkitError(f"{path}:{line}: blank line; every line is one input (outputs are one per input, in "
                        "order), so remove it (blank lines at the end of the file are fine)")


def _csv_rows(reader: Any, path: Path, fmt: str) -> Iterator[tuple[int, list[str]]]:
    """(line, fields) of each CSV/TSV record, the line being the record's last (a quoted field may span lines);
    a malformed record is an error naming the line it starts on."""
    while True:
        start = reader.line_num + 1
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as e:
            raise BertkitError(f"{path}:{start}: not valid {fmt.upper()} from this line on ({e}); a field holding "
                               "the delimiter, a quote or a newline must be quoted as a whole, with its quotes "
                               'doubled ("she said ""hi""")') from None
        yield reader.line_num, row


def read_records(path: Path, fmt: str) -> Iterator[tuple[int, Any]]:
    """(line number, raw record): a dict (CSV/TSV/JSONL object), a str (text line or JSON string) or other."""
    blank: int | None = None  # the first blank line since the last record; an error if a record follows
    # utf-8-sig: a byte-order mark (Windows editors write one) is not part of the first record
    with open(path, encoding="utf-8-sig", newline="" if fmt in ("csv", "tsv") else None) as f:
        if fmt in ("csv", "tsv"):
            csv.field_size_limit(min(sys.maxsize, 2**31 - 1))  # long contexts in one field
            # TSV as GLUE and most tools write it: no quoting (a field holds no tab or newline, and a quote is
            # text); CSV with RFC 4180 quoting (a quoted field may hold commas and newlines). strict: a quote
            # left open is an error, not a field that swallows every later row up to the end of the file.
            reader = (csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE, strict=True) if fmt == "tsv"
                      else csv.reader(f, strict=True))
            header: list[str] | None = None
            for line, row in _csv_rows(reader, path, fmt):
                if len(row) <= 1 and not "".join(row).strip():
                    blank = blank or line
                    continue
                if blank is not None:
                    raise _blank_line(path, blank)
                if header is None:
                    header = [h.strip().lstrip("\ufeff") for h in row]
                    repeated = next((h for i, h in enumerate(header) if h in header[:i]), None)
                    if repeated is not None:
                        raise BertkitError(f"{path}:{line}: the header names column {repeated!r} more than once "
                                           f"({', '.join(header)}); give every column its own name")
                    continue
                if len(row) != len(header):
                    raise BertkitError(f"{path}:{line}: {len(row)} fields but the header names {len(header)} "
                                       f"({', '.join(header)}); quote fields holding the delimiter")
                yield line, dict(zip(header, row))
            return
        for line, text in enumerate(f, 1):
            text = text.rstrip("\r\n")
            if not text.strip():
                blank = blank or line
                continue
            if blank is not None:
                raise _blank_line(path, blank)
            if fmt == "text":
                yield line, text
                continue
            try:
                yield line, json.loads(text)
            except json.JSONDecodeError as e:
                raise BertkitError(f"{path}:{line}: not valid JSON ({e.msg} at column {e.colno})") from None
