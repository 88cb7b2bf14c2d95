"""Inputs as they grow: what a command reads of a file, and what it writes, must not depend on the file's size."""

from __future__ import annotations

import json

import pytest

from bertkit.errors import BertkitError
from bertkit.tasks.files import file_format, read_records


def _write(path, n):
    """``n`` short records in ``path``'s format (a header first for CSV/TSV), about 25 bytes each."""
    rows = [f"a short input number {i}" for i in range(n)]
    if path.suffix == ".jsonl":
        body = "".join(json.dumps({"text": r}) + "\n" for r in rows)
    else:
        body = ("text\n" if path.suffix in (".csv", ".tsv") else "") + "".join(r + "\n" for r in rows)
    path.write_text(body, encoding="utf-8")


@pytest.mark.parametrize("name", ["in.txt", "in.jsonl", "in.csv", "in.tsv"])
def test_the_line_limit_is_per_record_not_per_file(tmp_path, name):
    """A file larger in all than --max-line-bytes (1 MiB by default: any text or JSONL file of 30,000 short lines)
    is read whole; the limit bounds each line. The text and JSONL readers counted every line since the first against
    it, so `bertkit predict` refused such a file as one record "from line 1 to line 34,953 ... a quote left open?"."""
    path = tmp_path / name
    _write(path, 200)  # about 5,000 bytes: five times the limit below
    assert path.stat().st_size > 4 * 1000
    first = 2 if name.endswith(("csv", "tsv")) else 1  # after the header
    records = list(read_records(path, file_format(path), max_line_bytes=1000))
    assert [n for n, _ in records] == list(range(first, first + 200))
    assert [r if isinstance(r, str) else r["text"] for _, r in records] == [f"a short input number {i}"
                                                                            for i in range(200)]
    with open(path, "a", encoding="utf-8") as f:  # one line over the limit still is refused, by its number
        f.write(("x" * 1200 if name.endswith((".txt", ".csv", ".tsv")) else json.dumps("x" * 1200)) + "\n")
    with pytest.raises(BertkitError, match=rf"in\.\w+:{first + 200}: this line is longer than 1,000 bytes"):
        list(read_records(path, file_format(path), max_line_bytes=1000))
