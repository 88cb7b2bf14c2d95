"""What a benchmark script printed (test helper, not a test module): the bench scripts print JSON lines on stdout
and nothing else there, so that `| tee x.jsonl` and every reader of it get records only."""

from __future__ import annotations

import json
import subprocess

import pytest


def json_lines(done: subprocess.CompletedProcess, what: str = "stdout") -> list[dict]:
    """The records ``done`` printed, after it exited 0; a line that is not JSON fails the test, naming ``what``."""
    assert done.returncode == 0, done.stderr[-3000:]
    records = []
    for line in filter(str.strip, done.stdout.splitlines()):
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            pytest.fail(f"{what} holds more than JSON lines: {line[:200]!r}")
    return records
