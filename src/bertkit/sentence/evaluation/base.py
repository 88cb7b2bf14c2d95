"""What the evaluators share: how their texts become embeddings (``EmbeddingEvaluator.embed``, the one place; a
sparse evaluator overrides it and nothing else of how texts are embedded), the refusal of a model output that is
not finite (``bertkit.sentence.finite``), how metric keys are named, and the results CSV each writes when given an
``output_path`` (``ResultsCsv``)."""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Mapping, Set
from pathlib import Path
from typing import Any

import torch

from bertkit.errors import BertkitError, WholeSetting
from bertkit.outputs import append_whole, atomic_write_text
from bertkit.runs import record
from bertkit.sentence.finite import refuse_nonfinite


def prefixed(metrics: dict[str, float], name: str) -> dict[str, float]:
    """``{name}_{key}`` for each metric (the keys as they are for no name), as sentence-transformers names them."""
    return {f"{name}_{k}" if name else k: float(v) for k, v in metrics.items()}


def refuse_one_text(who: str, **texts: Any) -> None:
    """Refuse a str, dict or set given where an evaluator takes a list of texts: a str would be read as its
    characters (sentence-transformers reads it so, where its lengths happen to agree), a dict as its keys, a set in no
    order."""
    for what, value in texts.items():
        if isinstance(value, (str, bytes, Mapping, Set)):
            raise BertkitError(f"{who}: {what} is {type(value).__name__} {str(value)[:60]!r}; give a list of texts "
                               f"(one a pair, in the order of the others)")


class EmbeddingEvaluator:
    """An evaluator that embeds its texts with ``embed``, in batches of ``batch_size``, at ``truncate_dim``."""

    show_progress_bar: bool
    truncate_dim = WholeSetting(none="the model's")  # the model's width bounds it too, checked by encode
    batch_size = WholeSetting()

    def embed(self, model: Any, texts: list[str], kind: str | None = None, **prompt: Any) -> torch.Tensor:
        """``texts``' (N, D) embeddings, encoded as queries (``kind`` "query"), documents ("document") or plain texts
        (None): the model's prompt for that kind, unless ``prompt`` gives ``prompt`` or ``prompt_name``."""
        # only the method used is looked up: a distillation teacher need have nothing but encode
        encode = getattr(model, {"query": "encode_query", "document": "encode_document", None: "encode"}[kind])
        embeddings = encode(texts, batch_size=self.batch_size, show_progress_bar=self.show_progress_bar,
                            **self.encode_options(), **prompt)
        refuse_nonfinite(embeddings, texts, type(self).__name__, f"{kind} embedding" if kind else "embedding",
                         model=model)
        return embeddings

    def encode_options(self) -> dict[str, Any]:
        """What ``embed`` asks of ``encode`` besides the texts, batch size, progress bar and prompt."""
        return {"convert_to_tensor": True, "truncate_dim": self.truncate_dim}


class ResultsCsv:
    """The results CSV of an evaluator called with an ``output_path``, as sentence-transformers writes it:
    ``output_path/csv_file``, a header row then one row a call (``[epoch, steps, *values]``), appended on later calls.
    A file already at that name is appended to only when its header row is the one this evaluator writes (another
    file there, or one with other columns, is refused: bertkit does not write into a file it did not create) and
    never through a symbolic link. Inside a directory a bertkit run writes (the trainer's ``eval/``) the file is
    recorded as the run's, appends included. ``write_csv=False`` writes nothing."""

    csv_file: str
    write_csv: bool
    csv_lineterminator = "\r\n"  # Python's csv writer's; the information-retrieval evaluator writes "\n"

    def write_results(self, output_path: str | os.PathLike | None, headers: list[str], row: list[Any]) -> None:
        if output_path is None or not self.write_csv:
            return
        write_results_csv(Path(output_path) / self.csv_file, headers, row, self.csv_lineterminator)


def results_csv_name(stem: str, *parts: str | None, tail: str = "") -> str:
    """sentence-transformers' name for an evaluator's results CSV: ``{stem}[_{part}...]_results{tail}.csv``, the
    parts left out where empty (an evaluator without a name)."""
    return "_".join([stem, *(p for p in parts if p)]) + f"_results{tail}.csv"


def write_results_csv(path: Path, headers: list[str], row: list[Any], lineterminator: str = "\r\n") -> None:
    """Append ``row`` to the results CSV ``path`` (its ``headers`` first when it is new); see ``ResultsCsv``."""
    def line(values: list[Any]) -> str:
        text = io.StringIO()
        csv.writer(text, lineterminator=lineterminator).writerow(values)  # str() of each value, as ST writes them
        return text.getvalue()

    header, data = line(headers), line(row)
    if not os.path.lexists(path):
        record(path, appends=True, data=(header + data).encode("utf-8"))
        atomic_write_text(path, header + data)
        return
    fix = "give another output_path, or move the file away"
    try:
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        raise BertkitError(f"{path} exists and cannot be appended to ({e.strerror}); bertkit writes an evaluator's "
                           f"results only into a plain file it wrote: {fix}") from None
    try:
        with os.fdopen(os.dup(fd), "r", encoding="utf-8", newline="") as f:
            first = f.readline()
        if first != header:
            raise BertkitError(f"{path} exists with the header {first.rstrip()!r}, not this evaluator's "
                               f"{header.rstrip()!r}; bertkit appends results only to a file with the same columns: "
                               f"{fix}")
        append_whole(fd, data.encode("utf-8"), path)
    finally:
        os.close(fd)
