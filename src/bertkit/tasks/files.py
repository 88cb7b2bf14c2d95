"""Records from users' files: JSON lines, CSV/TSV with a header row, or plain text (one item per line).

Every record comes with its 1-based line number, so an error names ``file:line``. The formats and what is
refused (blank lines, NUL bytes, over-long lines, bytes that are not UTF-8, lines that end in a carriage return
alone): docs/inference.md, "Your own files".
"""

from __future__ import annotations

import codecs
import csv
import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from bertkit.errors import BertkitError, NotStandardJson, standard_json
from bertkit.tokenization.textfiles import refuse_compressed_format, refuse_lone_carriage_returns

FORMATS = ("jsonl", "csv", "tsv", "text")
SUFFIXES = {".jsonl": "jsonl", ".json": "jsonl", ".ndjson": "jsonl", ".csv": "csv", ".tsv": "tsv", ".txt": "text"}
# The longest line (or CSV record) a user's file may hold: far above any real text row, far below a binary file.
MAX_LINE_BYTES = 2**20


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


# Columns that hold one text of a pair in common files: one beside the text a command reads, unused, is almost
# surely the second text of a pair it was not told about.
PAIR_TEXT_NAMES = ("text_pair", "text_b", "sentence2", "question2", "hypothesis", "text", "text_a", "sentence",
                   "sentence1", "question1", "question", "premise")


def second_text_fields(record: dict[str, Any], used: tuple[str | None, ...]) -> list[str]:
    """The fields of ``record`` named like one text of a pair, holding a string, and not among ``used`` (the
    columns a command reads), in ``PAIR_TEXT_NAMES`` order."""
    return [k for k in PAIR_TEXT_NAMES if k in record and k not in used and isinstance(record[k], str)]


# What separates a CSV's or TSV's fields, and what to do when a file's header shows it is separated by another:
# Excel writes CSV with ";" where the decimal mark is a comma.
_SEPARATORS = {"csv": ",", "tsv": "\t"}
_OTHER_SEPARATORS = {";": "re-save it separated by commas (pandas: pd.read_csv(FILE, sep=';').to_csv('NEW.csv', "
                          "index=False))", "\t": "name it .tsv or pass --input-format tsv",
                     ",": "name it .csv or pass --input-format csv"}


def other_separator(header: list[str], fmt: str) -> str | None:
    """When a CSV/TSV header is one column holding another separator (``text;label`` read as CSV), what the file is
    separated by and the fix; None otherwise."""
    if fmt not in _SEPARATORS or len(header) != 1:
        return None
    sep = next((c for c in _OTHER_SEPARATORS if c in header[0] and c != _SEPARATORS[fmt]), None)
    if sep is None:
        return None
    return (f"read as {fmt.upper()} (separated by {_SEPARATORS[fmt]!r}) the header is one column, so the file is "
            f"separated by {sep!r}: {_OTHER_SEPARATORS[sep]}")


def _blank_line(path: Path, line: int, whitespace: bool = False) -> BertkitError:
    if whitespace:
        return BertkitError(f"{path}:{line}: blank line (only whitespace); every line is one input (outputs are one "
                            "per input, in order), so remove it or write the text it is missing")
    return BertkitError(f"{path}:{line}: blank line; every line is one input (outputs are one per input, in "
                        "order), so remove it (empty lines at the end of the file are fine)")


class _Lines:
    """A binary file's lines, each checked as read (at most ``limit`` bytes, no NUL, UTF-8) and decoded with
    its line end; ``record_bytes`` bounds a CSV record spanning lines too."""

    def __init__(self, f: BinaryIO, path: Path, limit: int):
        self.f, self.path, self.limit = f, path, limit
        self.number = 0  # 1-based number of the last line read
        self.offset = 0  # bytes read before it
        self.record_bytes = 0
        self.record_start = 1

    def __iter__(self) -> _Lines:
        return self

    def __next__(self) -> str:
        raw = self.f.readline(self.limit + 1)
        if not raw:
            raise StopIteration
        self.number += 1
        offset, self.offset = self.offset, self.offset + len(raw)
        if self.number == 1 and raw.startswith(codecs.BOM_UTF8):  # a byte-order mark is not part of the first record
            raw, offset = raw[len(codecs.BOM_UTF8):], offset + len(codecs.BOM_UTF8)
            if not raw:  # nor a line: a file of the mark alone is an empty file an editor saved
                raise StopIteration
        if self.number == 1:  # before the length check: such a file is one line
            refuse_compressed_format(raw, self.path)  # a .gz or .bz2: its bytes would be named as a NUL or a \r
            refuse_lone_carriage_returns(raw, f"{self.path}:1")
        nul = raw.find(b"\0")
        if nul >= 0:
            raise BertkitError(f"{self.path}:{self.number}: a NUL byte (byte {offset + nul} of the file): a text file "
                               "holds none, so this is most likely a binary file (or one in UTF-16); pass the UTF-8 "
                               "text file of inputs")
        if len(raw.rstrip(b"\n")) > self.limit:
            raise BertkitError(f"{self.path}:{self.number}: this line is longer than {self.limit:,} bytes (the line "
                               "limit, --max-line-bytes); a file without line breaks or a binary file? Split the "
                               "input into lines, or raise the limit if such a long line is meant")
        self.record_bytes += len(raw)
        if self.record_bytes > self.limit:
            raise BertkitError(f"{self.path}:{self.record_start}: the record from line {self.record_start} to line "
                               f"{self.number} is longer than {self.limit:,} bytes (the line limit, --max-line-bytes); "
                               "a quote left open? Close it, or raise the limit if such a long record is meant")
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise BertkitError(f"{self.path} is not UTF-8 text: line {self.number}, byte {offset + e.start} "
                               f"({raw[e.start:e.start + 1]!r}); convert it to UTF-8 (e.g. iconv -t UTF-8)") from None

    def start_record(self) -> None:
        self.record_bytes, self.record_start = 0, self.number + 1


def _csv_rows(reader: Any, lines: _Lines, path: Path, fmt: str) -> Iterator[tuple[int, list[str]]]:
    """(line, fields) of each CSV/TSV record, the line being the one it starts on (a quoted field may span lines:
    an error about the record, or a prediction's line, names where an editor shows it begin); a malformed record is
    an error naming that line too."""
    while True:
        start = reader.line_num + 1
        lines.start_record()
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as e:
            fix = ('a field holding the delimiter, a quote or a newline must be quoted as a whole, with its quotes '
                   'doubled ("she said ""hi""")' if fmt == "csv" else "a TSV field holds no line break (quotes are "
                   "text in TSV): remove it, or write the file as CSV, where quotes hold one")
            raise BertkitError(f"{path}:{start}: not valid {fmt.upper()} from this line on ({e}); {fix}") from None
        yield start, row


# A field as a CSV writer quotes it: wrapped in quotes, every quote inside doubled. In a TSV read unquoted (a quote is
# text, as in GLUE's files) such a field is a TSV written with CSV quoting (pandas' to_csv(sep="\t") quotes a text
# holding a quote: he said "hi" as "he said ""hi"""), whose quotes would be read into the text.
_CSV_QUOTED = re.compile(r'"(?:[^"]|"")*"')


def _refuse_csv_quoting(path: Path, line: int, row: list[str], header: bool) -> None:
    """A TSV field quoted as CSV quotes it, refused naming it: in the header (a column name in quotes) any such
    field, in a row one holding a doubled quote (a GLUE sentence may be a quotation, never one with its quotes
    doubled)."""
    quoted = next((f for f in row if _CSV_QUOTED.fullmatch(f) and (header or '""' in f[1:-1])), None)
    if quoted is not None:
        raise BertkitError(f"{path}:{line}: the field {quoted[:60]!r} is quoted as a CSV writer quotes it; a .tsv is "
                           "read unquoted, as GLUE's files are (a quote is text), so its quotes would be read into "
                           "the text: write the TSV unquoted (pandas: to_csv(..., sep='\\t', "
                           "quoting=csv.QUOTE_NONE)) or save the file as .csv")


def read_lines(path: Path, max_line_bytes: int = MAX_LINE_BYTES) -> Iterator[tuple[int, str]]:
    """(line number, text without its line end) of a text file, blank lines included, each line checked."""
    with open(path, "rb") as f:
        lines = _Lines(f, path, max_line_bytes)
        for number, text in enumerate(lines, 1):
            lines.start_record()  # each line is a record of its own: the limit is per line, not per file
            yield number, text.rstrip("\r\n")


def read_records(path: Path, fmt: str, max_line_bytes: int = MAX_LINE_BYTES) -> Iterator[tuple[int, Any]]:
    """(line number, raw record): a dict (CSV/TSV/JSONL object), a str (text line or JSON string) or other."""
    blank: int | None = None  # the first empty line since the last record; an error if a record follows
    with open(path, "rb") as f:
        lines = _Lines(f, path, max_line_bytes)
        if fmt in ("csv", "tsv"):
            csv.field_size_limit(min(sys.maxsize, 2**31 - 1))  # long contexts in one field (_Lines bounds a record)
            # TSV as GLUE and most tools write it: no quoting (a field holds no tab or newline, and a quote is
            # text); CSV with RFC 4180 quoting (a quoted field may hold commas and newlines). strict: a quote
            # left open is an error, not a field that swallows every later row up to the end of the file.
            reader = (csv.reader(lines, delimiter="\t", quoting=csv.QUOTE_NONE, strict=True) if fmt == "tsv"
                      else csv.reader(lines, strict=True))
            header: list[str] | None = None
            for line, row in _csv_rows(reader, lines, path, fmt):
                if not row:  # an empty line
                    blank = blank or line
                    continue
                if len(row) == 1 and not row[0].strip():  # a line of whitespace: a row whose text is missing
                    raise _blank_line(path, line, whitespace=True)
                if blank is not None:
                    raise _blank_line(path, blank)
                if fmt == "tsv":
                    _refuse_csv_quoting(path, line, row, header is None)
                if header is None:
                    header = [h.strip().lstrip("\ufeff") for h in row]
                    repeated = next((h for i, h in enumerate(header) if h in header[:i]), None)
                    if repeated is not None:
                        raise BertkitError(f"{path}:{line}: the header names column {repeated!r} more than once "
                                           f"({', '.join(header)}); give every column its own name")
                    continue
                # Files joined by `cat`: the next one's header. Of one column, a row may be a text that is its name.
                if len(header) > 1 and [h.strip().lstrip("\ufeff") for h in row] == header:
                    raise BertkitError(f"{path}:{line}: this row repeats the header ({', '.join(header)}), so it would "
                                       "be read as one more input, the column names its text (and label); files "
                                       "joined with cat keep each one's header: remove this line (tail -n +2 FILE "
                                       "joins a file without its header)")
                if len(row) != len(header):
                    fix = ("quote fields holding the delimiter" if fmt == "csv" else "a TSV field holds no tab "
                           "(quotes are text in TSV, as in GLUE's files): remove it, or write the file as CSV, "
                           "where quotes hold one")
                    fix = other_separator(header, fmt) or fix
                    raise BertkitError(f"{path}:{line}: {len(row)} fields but the header names {len(header)} "
                                       f"({', '.join(header)}); {fix}")
                yield line, dict(zip(header, row))
            return
        for line, text in enumerate(lines, 1):
            lines.start_record()  # a JSON line or a text line is a record of its own: the limit is per line
            text = text.rstrip("\r\n")
            if not text:
                blank = blank or line
                continue
            if not text.strip():
                raise _blank_line(path, line, whitespace=True)
            if blank is not None:
                raise _blank_line(path, blank)
            if fmt == "text":
                yield line, text
                continue
            try:
                yield line, standard_json(text)
            except NotStandardJson as e:
                raise BertkitError(f"{path}:{line}: not valid JSON ({e}); write it as standard JSON") from None
            except json.JSONDecodeError as e:
                lines = ("; the file must be JSON lines, one value per line, not a JSON document spread over lines"
                         if line == 1 else "")
                raise BertkitError(f"{path}:{line}: not valid JSON ({e.msg} at column {e.colno}){lines}") from None
