"""A training run's log: ``metrics.jsonl``, one JSON record a line appended as the run goes, and with
``--report-to tensorboard`` the same scalars as TensorBoard events. In a run written in place (the Trainer's) each
is recorded as bertkit's once, when it starts (``bertkit.runs.record``). Rank 0 alone writes; every rank keeps
the history."""

from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path

from bertkit.errors import BertkitError
from bertkit.manifests import owns
from bertkit.outputs import append_whole, atomic_write_text, json_text
from bertkit.runs import record

logger = logging.getLogger("bertkit")


class RunLog:
    def __init__(self, out_dir: Path, writes: bool):
        self.path, self.writes = out_dir / "metrics.jsonl", writes
        self.history: list[dict] = []  # every record of the run (a resumed run's earlier ones first)
        self.board = None

    def start(self) -> None:
        """A fresh run's metrics.jsonl: empty; a file there that this run did not write is refused."""
        if self.writes:
            if os.path.lexists(self.path) and not owns(self.path):
                raise BertkitError(f"{self.path} exists and this run did not write it; bertkit does not replace it: "
                                   "pass --resume to continue that run, or choose a new output directory")
            record(self.path, appends=True, data=b"")  # before it is written: a kill leaves it recorded
            atomic_write_text(self.path, "")

    def resume(self, step: int, records: int | None = None) -> None:
        """The history as the checkpoint of ``step`` found it, its first ``records`` (None: those up to ``step``); the
        records after it (a killed run's: an epoch's log and evaluation come after its last step's checkpoint, which
        the resumed run makes again) are dropped."""
        self.history = [r for r in read_metrics(self.path) if r["step"] <= step][:records]
        if self.writes:
            text = "".join(json_text(r) + "\n" for r in self.history)
            record(self.path, appends=True, data=text.encode("utf-8"))
            atomic_write_text(self.path, text)

    def open_tensorboard(self) -> None:
        if not self.writes:
            return
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ModuleNotFoundError:
            raise BertkitError("--report-to tensorboard needs the tensorboard package: pip install "
                               "'bertkit[tensorboard]' (or pip install tensorboard), or leave --report-to at none") from None
        self.board = SummaryWriter(str(self.path.parent / "tensorboard"))
        # tensorboard writes its event file itself (named with this process's pid), appending: recorded once too
        for path in Path(self.board.get_logdir()).glob(f"events.out.tfevents.*.{os.getpid()}.*"):
            record(path, appends=True)

    def write(self, record: dict) -> None:
        self.history.append(record)
        if not self.writes:
            return
        # Not through a symbolic link put at its name during the run: that would append to a file bertkit did not write.
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as e:
            raise BertkitError(f"{self.path} is no longer the file this run writes ({e.strerror}): something replaced it "
                               "during the run; bertkit does not write through it. Put the run's metrics.jsonl back, "
                               "or continue the run with --resume into a new output directory") from None
        try:
            append_whole(fd, (json_text(record) + "\n").encode("utf-8"), self.path)  # a NaN loss as null, not NaN
        finally:
            os.close(fd)
        if self.board is not None:
            for k, v in record.items():
                if isinstance(v, (int, float)) and k not in ("step", "epoch"):
                    self.board.add_scalar(f"{record['split']}/{k}", v, record["step"])
            self.board.flush()

    def evaluated_at(self, step: int) -> bool:
        """Whether the records at ``step``, the newest ones, hold an evaluation (after a resume: one the interrupted
        run made). Not only the newest record: with logging_strategy "epoch" the epoch's train record comes after
        the evaluation of its last step, which the run's end then evaluated again."""
        for entry in reversed(self.history):
            if entry.get("step") != step:
                return False
            if entry.get("split") == "eval":
                return True
        return False

    def close(self) -> None:
        if self.board is not None:
            self.board.close()


def _record(pairs: list[tuple[str, object]]) -> dict:
    # null is a value that was not finite when logged (a NaN loss): read back as NaN, never as 0 or None, so the
    # comparisons of early stopping and best-model selection treat it as they treated the value itself
    return {k: math.nan if v is None else v for k, v in pairs}


def read_metrics(path: Path) -> list[dict]:
    """metrics.jsonl's records, null read as NaN (and the NaN token of files written before null, as json reads
    it); a torn last line (a kill mid-append) is dropped with a warning, a bad line elsewhere is an error."""
    if not path.is_file():
        return []
    lines = [(i, line) for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if line.strip()]
    records = []
    for n, (lineno, line) in enumerate(lines):
        try:
            records.append(json.loads(line, object_pairs_hook=_record))
        except json.JSONDecodeError:
            if n == len(lines) - 1:
                logger.warning("%s line %d is torn (a write interrupted by a kill); dropping it", path, lineno)
                break
            raise BertkitError(f"{path} line {lineno} is not JSON ({line[:60]!r}); the metrics of this run are "
                               "damaged: move the file away to resume without its history") from None
    return records
