"""Every ``bertkit ...`` command line in the documentation parses with today's command line.

Flags get renamed; documentation that still shows the old name fails a user on the first paste. This reads
README.md, RESULTS.md, BENCHMARKS.md and docs/*.md (fenced code blocks and inline code, backslash
continuations joined), keeps the ``bertkit`` part of each command (after a ``torchrun ... -m`` or
``python -m`` launcher, before a pipe, ``&&`` or a comment) and runs it through ``cli.build_parser()``'s
``parse_args``: no command is executed.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import re
import shlex
from pathlib import Path

import pytest

from bertkit.cli import build_parser, normalize_argv

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", ROOT / "RESULTS.md", ROOT / "BENCHMARKS.md", *sorted((ROOT / "docs").glob("*.md"))]

_FENCE = re.compile(r"^\s*```[^\n]*\n(.*?)^\s*```", re.S | re.M)
# The command starts a line or a code span, possibly after a prompt, environment assignments or a launcher
# (torchrun ... -m, python -m); "from bertkit import" and "bertkit.pipeline(" are Python, not commands.
_COMMAND = re.compile(r"(?:^|\s-m\s|^\$\s+|^(?:[A-Z_]+=\S*\s+)+)bertkit((?:\s+\S+)+)")
_END = re.compile(r"\s(?:&&|\|\||;|\||>|2>|#)(?:\s|$)")  # a second command, a redirection or a comment
_PLACEHOLDER = re.compile(r"^(?:<.*>|[A-Z][A-Z_]*)$")  # `bertkit predict TASK`, `bertkit <command> --help`


def _snippets(text: str) -> list[str]:
    lines = []
    for block in _FENCE.findall(text):
        lines += re.sub(r"\\\n\s*", " ", block).splitlines()
    for span in re.findall(r"`([^`\n]+)`", _FENCE.sub("", text)):
        lines.append(span)
    return lines


def _argv(tail: str) -> list[str] | None:
    """The arguments after ``bertkit``, with the docs' notation for optional flags ("[--bf16]") and
    alternatives ("iob1|iob2") resolved to a real command line; None for a placeholder command."""
    tail = _END.split(" " + tail.strip() + " ")[0]
    tail = re.sub(r"\$\{?\w+\}?", "0", tail)  # shell variables (`--shard-index $i`): the shell fills in a value
    argv = [a.strip("[]").split("|")[0] for a in shlex.split(tail)]
    argv = [a for a in argv if a]
    command = [a for a in argv[:2] if not a.startswith("-")]
    if any(_PLACEHOLDER.match(a) for a in command):
        return None
    return argv


def _commands() -> list[tuple[str, list[str]]]:
    found = []
    for path in DOCS:
        for line in _snippets(path.read_text(encoding="utf-8")):
            m = _COMMAND.search(line.strip())
            if m:
                argv = _argv(m.group(1))
                if argv is not None:
                    found.append((f"{path.name}: bertkit {' '.join(argv)}", argv))
    return found


COMMANDS = _commands()


def test_the_documentation_shows_commands():
    """The extraction works: the README's quick start and the distributed recipes are among them."""
    names = [c[0] for c in COMMANDS]
    assert any(n.startswith("README.md: bertkit pretrain --data") for n in names)
    assert any(n.startswith("distributed.md: bertkit pretrain") for n in names)  # after a torchrun launcher
    assert len(COMMANDS) >= 40


@functools.cache
def _parser() -> argparse.ArgumentParser:
    return build_parser()  # built once: parse_args keeps no state between calls


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
    return dict(action.choices) if action else {}


def _named_only(argv: list[str]) -> bool:
    """Whether ``argv`` only names a command (`bertkit finetune squad` in prose, its required arguments left
    out): every word is a command or a task of the one before. A misspelt name is not, and fails to parse."""
    parser = _parser()
    for word in argv:
        choices = _subcommands(parser)
        if word not in choices:
            return False
        parser = choices[word]
    return True


@pytest.mark.parametrize("name,argv", COMMANDS, ids=[c[0] for c in COMMANDS])
def test_documented_command_parses(name, argv):
    if _named_only(argv):
        return
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            _parser().parse_args(normalize_argv(argv))
    except SystemExit as e:  # --help and --version exit 0; a bad flag or value exits 2 with argparse's message
        assert e.code == 0, f"{name}\n{err.getvalue().strip()}"


_PATH = re.compile(r"\b(?:tests|bench|experiments|examples|src/bertkit|docs|configs)/[\w./-]*\w")


def test_documented_files_exist():
    """A script, test or module the documentation names exists, unless its paragraph says which commit kept it
    ("at commit 4403231"): a reader's first paste of a command must not meet a missing file."""
    missing = []
    for path in [*DOCS, ROOT / "CONTRIBUTING.md"]:
        for paragraph in re.split(r"\n\s*\n", path.read_text(encoding="utf-8")):
            if re.search(r"\bcommit\s+[0-9a-f]{7,40}\b", paragraph):
                continue
            missing += [f"{path.name}: {p}" for p in _PATH.findall(paragraph) if not (ROOT / p).exists()]
    assert not missing, missing
