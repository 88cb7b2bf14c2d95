"""An engine that runs in a child process and answers one line per request over its stdin/stdout (the benchmarks'
workers: CTranslate2 in bench_engines.py, sentence-transformers' other backends in bench_embeddings.py). Standard
library only, so a worker in another environment can share it."""

from __future__ import annotations

import subprocess


class Remote:
    """The child ``cmd`` (with ``env``, or this process's environment): ``ask`` sends a line and returns its
    one-line answer; a child that ended instead is reported by its ``name`` and exit status."""

    def __init__(self, name: str, cmd: list[str], env: dict[str, str] | None = None):
        self.name = name
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)

    def ask(self, line: str) -> str:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline().strip()
        if not answer:
            raise SystemExit(f"worker {self.name} ended (exit {self.proc.wait()})")
        return answer

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()
