"""What the Trainer prints and writes about a run beside its checkpoints, as transformers' example scripts call it
(its ``trainer_pt_utils`` helpers): ``log_metrics``, ``save_metrics``, ``save_state``, rank 0 alone, each report file
written whole and recorded as the run's."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bertkit import dir_lock
from bertkit._parallel import job_of
from bertkit.errors import read_json_object
from bertkit.job_writes import write_text_beside_job
from bertkit.outputs import atomic_write_text
from bertkit.runs import output_dir, record
from bertkit.training.distributed import current

TRAINER_STATE = "trainer_state.json"


class TrainerReports:
    """The Trainer's report methods (mixed into ``bertkit.Trainer``, whose ``args`` and ``state`` they read)."""

    # -- the example scripts' reports (transformers' trainer_pt_utils helpers): rank 0 prints and writes ----------
    def is_world_process_zero(self) -> bool:
        """Whether this is the process that writes (rank 0 under torchrun; the one process otherwise)."""
        return current().is_main

    def is_local_process_zero(self) -> bool:
        """Whether this process is the first of its machine."""
        return current().local_rank == 0

    @staticmethod
    def metrics_format(metrics: dict[str, Any]) -> dict[str, Any]:
        """``metrics`` for reading, as transformers formats them: runtimes as h:mm:ss.cc, floats to 4 places."""
        formatted = dict(metrics)
        for key, value in metrics.items():
            if "_mem_" in key:
                formatted[key] = f"{value >> 20}MB"
            elif "_runtime" in key:
                formatted[key] = f"{datetime.timedelta(seconds=int(value))}.{int(abs(value - int(value)) * 100):02d}"
            elif key == "total_flos":
                formatted[key] = f"{int(value) >> 30}GF"
            elif isinstance(value, float):
                formatted[key] = round(value, 4)
        return formatted

    def log_metrics(self, split: str, metrics: dict[str, Any]) -> None:
        """Print ``metrics`` under ``***** {split} metrics *****``, one aligned line each (rank 0 alone)."""
        if not self.is_world_process_zero():
            return
        print(f"***** {split} metrics *****")
        formatted = self.metrics_format(metrics)
        k_width, v_width = max(len(str(k)) for k in formatted), max(len(str(v)) for v in formatted.values())
        for key in sorted(formatted):
            print(f"  {key: <{k_width}} = {formatted[key]:>{v_width}}")

    def save_metrics(self, split: str, metrics: dict[str, Any], combined: bool = True) -> None:
        """Write ``metrics`` to ``output_dir/{split}_results.json`` and, with ``combined``, merge them into
        ``output_dir/all_results.json`` (rank 0 alone), as transformers writes them."""
        if not self.is_world_process_zero():
            return
        self._write_report(f"{split}_results.json", lambda: json.dumps(metrics, indent=4, sort_keys=True))
        if combined:
            everything = Path(self.args.output_dir) / "all_results.json"

            def merged() -> str:  # read when written: another rank's save of output_dir may be under way until then
                saved = read_json_object(everything, "move it away to write it anew") if everything.is_file() else {}
                return json.dumps({**saved, **metrics}, indent=4, sort_keys=True)

            self._write_report(everything.name, merged)

    def save_state(self) -> None:
        """Write ``state`` to ``output_dir/trainer_state.json`` (rank 0 alone), as TrainerState.save_to_json does."""
        if self.is_world_process_zero():
            self._write_report(TRAINER_STATE, lambda: json.dumps(dataclasses.asdict(self.state), indent=2,
                                                                 sort_keys=True) + "\n")

    def _write_report(self, name: str, text: Callable[[], str]) -> None:
        """A report file in output_dir, written whole. In one process it is recorded in output_dir's manifest as the
        run's (output_dir is claimed for the write when no train() holds it, as training claims it), so a later
        train() there goes on, and a directory holding files bertkit did not write is refused, never written into.
        Under torchrun the other ranks may be saving output_dir meanwhile (``model.save_pretrained(output_dir)`` on
        every rank, as transformers' scripts end): their saves are waited for and the file written beside them,
        unclaimed, since a claim would stop those saves."""
        out = Path(self.args.output_dir)
        if job_of() is not None:
            write_text_beside_job(out / name, text)
            return
        with output_dir(out, "Trainer", in_place=True) if not dir_lock.holds(out) else contextlib.nullcontext():
            content = text()
            record(out / name, data=content.encode("utf-8"))
            atomic_write_text(out / name, content)
