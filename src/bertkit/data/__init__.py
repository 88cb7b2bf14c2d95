"""Pre-training data: corpus text -> masked-LM / next-sentence instances on disk -> training batches.

Public names are imported lazily (PEP 562), so importing a light submodule (``data.config``, ``data.text``)
does not pull in numpy, torch and the pipeline.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "PretrainingConfig": "bertkit.data.config",
    "PretrainingDataset": "bertkit.data.dataset",
    "collate_pretraining": "bertkit.data.dataset",
    "create_pretraining_data": "bertkit.data.pretraining",
}
__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'bertkit.data' has no attribute {name!r}")
