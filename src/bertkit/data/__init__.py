"""Pre-training data: corpus text -> masked-LM / next-sentence instances on disk -> training batches.

Public names are imported lazily (PEP 562), so importing a light submodule (``data.config``, ``data.text``)
does not pull in numpy, torch and the pipeline.
"""

from __future__ import annotations

from bertkit import _lazy_getattr

_EXPORTS = {
    "PretrainingConfig": "bertkit.data.config",
    "PretrainingDataset": "bertkit.data.dataset",
    "collate_pretraining": "bertkit.data.dataset",
    "create_pretraining_data": "bertkit.data.pretraining",
}
__all__ = list(_EXPORTS)


__getattr__ = _lazy_getattr("bertkit.data", _EXPORTS)
