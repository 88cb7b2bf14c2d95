"""SWAG (Zellers et al., 2018): read the swagaf CSV files and featurize the four endings.

The files (rowanz/swagaf `data/`) are CSV with a header; columns are found by name (`test.csv` has no
``label``; a file of one's own without swagaf's ``video-id``, which run_swag.py does not read, has no video ids). Each example becomes four sequences ``[CLS] sent1 [SEP] sent2 + " " + ending_i [SEP]`` (Devlin
et al. 2018, section 4.4; Hugging Face's run_swag.py).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bertkit.errors import BertkitError, MissingFileError
from bertkit.tasks.files import read_records
from bertkit.tokenization.encoding import segment_ids

NUM_CHOICES = 4
MODEL_INPUTS = ("input_ids", "token_type_ids", "attention_mask")
_REQUIRED = ("sent1", "sent2", "ending0", "ending1", "ending2", "ending3")  # run_swag.py's columns


@dataclass(frozen=True)
class SwagExample:
    video_id: str | None  # swagaf's video-id column; None in a file without one
    sent1: str
    sent2: str
    endings: tuple[str, str, str, str]
    label: int | None  # index of the true ending; None in test.csv
    line: int  # line of the record in the CSV (its first, if a quoted field spans several)


def read_swag(path: str | os.PathLike) -> list[SwagExample]:
    """Read a swagaf CSV; labels are read when the header has a ``label`` column (not in test.csv)."""
    path = Path(path)
    if not path.is_file():
        raise MissingFileError(f"SWAG file not found: {path}")
    examples: list[SwagExample] = []
    for lineno, row in read_records(path, "csv"):  # checks the encoding, the header and each row's field count
        if not examples:
            missing = [c for c in _REQUIRED if c not in row]
            if missing:
                raise BertkitError(f"{path} line 1: header lacks the SWAG columns {missing}; is this a swagaf CSV?")
            extra = [c for c in row if c.startswith("ending") and c[6:].isdigit() and int(c[6:]) >= NUM_CHOICES]
            if extra:  # read as SWAG, the file's other endings were never scored and the rest trained as 4-way
                raise BertkitError(f"{path} line 1: header has the columns {extra} beyond SWAG's {NUM_CHOICES} "
                                   "endings (ending0 to ending3), which the swag commands score; remove them, or "
                                   "train on another number of choices with AutoModelForMultipleChoice, "
                                   "DataCollatorForMultipleChoice and Trainer")
        label = None
        if "label" in row:
            raw = row["label"]
            if raw not in ("0", "1", "2", "3"):
                raise BertkitError(
                    f"malformed row in {path} line {lineno}: label {raw!r} is not 0, 1, 2 or 3"
                )
            label = int(raw)
        examples.append(
            SwagExample(
                video_id=row.get("video-id"),
                sent1=row["sent1"],
                sent2=row["sent2"],
                endings=tuple(row[f"ending{i}"] for i in range(NUM_CHOICES)),  # type: ignore[arg-type]
                label=label,
                line=lineno,
            )
        )
    if not examples:
        raise BertkitError(f"{path} holds no examples (an empty SWAG file); every file must have rows")
    return examples


def featurize_swag(
    examples: Sequence[SwagExample], tokenizer: Any, max_seq_length: int = 128
) -> list[dict[str, Any]]:
    """Four ``[CLS] sent1 [SEP] sent2 ending_i [SEP]`` sequences per example, as (4, T) int64 arrays padded to
    the longest of the four (long pairs cut from the longer segment, as run_swag.py), with ``labels`` if known."""
    if max_seq_length < 4:
        raise BertkitError(f"max_seq_length {max_seq_length} leaves no room for text; use at least 4")
    features = []
    for ex in examples:
        second = [f"{ex.sent2} {ending}" for ending in ex.endings]
        enc = tokenizer([ex.sent1] * NUM_CHOICES, text_pair=second, max_length=max_seq_length,
                        truncation="longest_first", padding=True, return_tensors="np")
        enc["token_type_ids"] = segment_ids(enc)  # zeros where the tokenizer's model_input_names leaves them out
        feat: dict[str, Any] = {key: enc[key].astype(np.int64) for key in MODEL_INPUTS}
        if ex.label is not None:
            feat["labels"] = ex.label
        features.append(feat)
    return features
