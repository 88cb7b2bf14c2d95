"""sentence-transformers 6's sparse encoders (``sentence_transformers.sparse_encoder``) on bertkit's masked-LM
model: ``SparseEncoder`` (SPLADE), its ``modules`` and ``evaluation``. What is implemented and what is refused:
docs/sentence.md."""

from __future__ import annotations

from bertkit import _lazy_getattr

_EXPORTS = {
    "SparseEncoder": "bertkit.sentence.sparse_encoder.model",
}
__all__ = list(_EXPORTS)
__getattr__ = _lazy_getattr("bertkit.sentence.sparse_encoder", _EXPORTS)
