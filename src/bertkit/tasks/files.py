"""Records from users' files: JSON lines, CSV/TSV with a header row, or plain text (one item per line).

The readers of ``bertkit predict TASK`` and ``bertkit finetune classify``; every record comes with its
1-based line number, so an error can name ``file:line``.
"""

from __future__ import annotations

import csv
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bertkit.errors import BertkitError


def file_format(path: Path) -> str:
    suffix = path.suffix.lower()
    return {".jsonl": "jsonl", ".json": "jsonl", ".csv": "csv", ".tsv": "tsv"}.get(suffix, "text")


def read_records(path: Path, fmt: str) -> Iterator[tuple[int, Any]]:
    """(line number, raw record): a dict (CSV/TSV/JSONL object), a str (text line or JSON string) or other."""
    with open(path, encoding="utf-8", newline="" if fmt in ("csv", "tsv") else None) as f:
        if fmt in ("csv", "tsv"):
            csv.field_size_limit(min(sys.maxsize, 2**31 - 1))  # long contexts in one field
            # TSV as GLUE and most tools write it: no quoting (a field holds no tab or newline, and a quote is
            # text); CSV with RFC 4180 quoting (a quoted field may hold commas and newlines).
            reader = (csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE) if fmt == "tsv"
                      else csv.reader(f))
            header = next(reader, None)
            if header is None:
                return
            header = [h.strip().lstrip("\ufeff") for h in header]
            for row in reader:
                line = reader.line_num
                if not any(cell.strip() for cell in row):
                    continue
                if len(row) != len(header):
                    raise BertkitError(f"{path}:{line}: {len(row)} fields but the header names {len(header)} "
                                       f"({', '.join(header)}); quote fields holding the delimiter")
                yield line, dict(zip(header, row))
            return
        for line, text in enumerate(f, 1):
            text = text.rstrip("\r\n")
            if fmt == "text":
                if text.strip():
                    yield line, text
                continue
            if not text.strip():
                continue
            try:
                yield line, json.loads(text)
            except json.JSONDecodeError as e:
                raise BertkitError(f"{path}:{line}: not valid JSON ({e.msg} at column {e.colno})") from None
