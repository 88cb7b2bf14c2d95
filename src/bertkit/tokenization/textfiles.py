"""Reading text files line by line with errors that name the file, line and byte.

Below both the vocabulary trainer (``tokenization/trainer.py``) and the pre-training data pipeline
(``data/``), so the tokenizer package does not import the data package (and numpy with it).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

from bertkit.errors import BertkitError

DECODE_ERRORS = ("strict", "replace", "ignore")


def refuse_lone_carriage_returns(first_line: bytes, where: str) -> None:
    """Lines end at \\n (\\r\\n too): a file whose lines end in \\r alone would be read as one line, so one input,
    one sentence, or one paragraph of a whole book. ``where`` names the file (and line) in the error."""
    if b"\r" in first_line.rstrip(b"\r\n"):
        raise BertkitError(f"{where}: a carriage return (\\r) inside the first line: a file whose lines end in \\r "
                           "alone (classic Mac OS) would be read as one line; end its lines with \\n "
                           "(e.g. tr '\\r' '\\n' < FILE > NEW), or remove the \\r from the text")


def iter_lines(
    path: str | os.PathLike, errors: str = "strict", start: int = 0, end: int | None = None
) -> Iterator[str]:
    """Yield the lines of ``path[start:end]`` (byte offsets at line starts) without line endings.

    Reads in binary and decodes line by line, so a bad byte is reported with its file, line (counted
    from ``start``) and absolute byte offset. A UTF-8 byte-order mark at offset 0 is dropped.
    """
    if errors not in DECODE_ERRORS:
        raise BertkitError(f"errors={errors!r} is not one of {DECODE_ERRORS}")
    offset = start
    with open(path, "rb") as f:
        f.seek(start)
        for lineno, raw in enumerate(f, start=1):
            if end is not None and offset >= end:
                return
            try:
                line = raw.decode("utf-8", errors=errors)
            except UnicodeDecodeError as exc:
                where = f"line {lineno}" if start == 0 else f"line {lineno} after byte {start}"
                raise BertkitError(
                    f"{path}: {where} (byte offset {offset + exc.start}) is not valid UTF-8 "
                    f"({raw[exc.start : exc.start + 4]!r}); fix the file or pass --errors replace "
                    "(errors='replace') to read bad bytes as U+FFFD"
                ) from None
            if offset == 0 and line.startswith("\ufeff"):
                line = line[1:]
            offset += len(raw)
            yield line.rstrip("\r\n")
