"""Pre-training instances on disk: plain ``.npy`` arrays per shard, memory-mapped on read, plus a manifest.

The files and their dtypes are listed in docs/pretraining-data.md ("On disk"). No pickle anywhere
(``np.save(..., allow_pickle=False)``), so the files are safe to share and identical bytes for identical inputs.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from bertkit.errors import BertkitError, MissingFileError
from bertkit.manifests import sha256_of
from bertkit.outputs import atomic_write, atomic_write_text

FORMAT = "bertkit-pretraining-v1"
MANIFEST = "manifest.json"
VOCAB = "vocab.txt"
BASE_FIELDS = ("input_ids", "offsets", "type_start", "next_sentence_labels")
MASK_FIELDS = ("masked_positions", "masked_offsets", "masked_labels")


def shard_name(index: int) -> str:
    return f"shard-{index:05d}"


def save_shard(output_dir: str | os.PathLike, name: str, arrays: dict[str, np.ndarray]) -> dict[str, dict]:
    """Write one shard's arrays as ``{name}.{field}.npy``; return ``{field: {file, dtype, shape, sha256}}``."""
    out = Path(output_dir)
    info = {}
    for field, array in arrays.items():
        path = out / f"{name}.{field}.npy"
        with atomic_write(path, "wb") as f:  # a kill mid-write never leaves half a shard under its name
            np.save(f, np.ascontiguousarray(array), allow_pickle=False)
        info[field] = {
            "file": path.name,
            "dtype": str(array.dtype),
            "shape": list(array.shape),
            "sha256": sha256_of(path),
        }
    return info


def write_manifest(output_dir: str | os.PathLike, manifest: dict) -> Path:
    path = Path(output_dir) / MANIFEST
    atomic_write_text(path, json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return path


def read_manifest(data_dir: str | os.PathLike) -> dict:
    path = Path(data_dir) / MANIFEST
    if not path.is_file():
        raise MissingFileError(
            f"{path} not found: {data_dir} is not a pre-training data directory "
            "(make one with bertkit.data.create_pretraining_data / `bertkit create-pretraining-data`)"
        )
    manifest = json.loads(path.read_text(encoding="utf-8"))
    if manifest.get("format") != FORMAT:
        raise BertkitError(f"{path}: format {manifest.get('format')!r} is not {FORMAT!r}")
    return manifest
