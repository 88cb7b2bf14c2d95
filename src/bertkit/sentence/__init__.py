"""sentence-transformers' training API on bertkit's encoder and training loop.

A script written for sentence-transformers runs after changing its imports from ``sentence_transformers`` to
``bertkit.sentence``: ``SentenceTransformer``, ``SentenceTransformerTrainer``,
``SentenceTransformerTrainingArguments``, ``quantize_embeddings`` and the submodules ``losses``, ``evaluation``,
``training_args`` (``BatchSamplers``), ``readers`` (``InputExample``, also exported here), ``datasets``
(``SentenceLabelDataset``, for the legacy ``fit``), ``util`` and ``cross_encoder`` (``CrossEncoder`` and its trainer, also
exported here, as sentence-transformers does); ``models`` (``Transformer``, ``Pooling``, ``Dense`` and ``Normalize``, to assemble
a model from; its other modules are refused by name). What is implemented and what is refused: docs/sentence.md.
"""

from __future__ import annotations

from bertkit import _lazy_getattr

_EXPORTS = {
    "SentenceTransformer": "bertkit.sentence.model",
    "InputExample": "bertkit.sentence.readers",
    "quantize_embeddings": "bertkit.sentence.quantization",
    "SentenceTransformerTrainer": "bertkit.sentence.trainer",
    "SentenceTransformerTrainingArguments": "bertkit.sentence.training_args",
    "SimilarityFunction": "bertkit.sentence.util",
    "CrossEncoder": "bertkit.sentence.cross_encoder.model",
    "CrossEncoderTrainer": "bertkit.sentence.cross_encoder.trainer",
    "CrossEncoderTrainingArguments": "bertkit.sentence.cross_encoder.training_args",
    "SparseEncoder": "bertkit.sentence.sparse_encoder.model",
    "SparseEncoderTrainer": "bertkit.sentence.sparse_encoder.trainer",
    "SparseEncoderTrainingArguments": "bertkit.sentence.sparse_encoder.training_args",
}
__all__ = list(_EXPORTS)
__getattr__ = _lazy_getattr("bertkit.sentence", _EXPORTS)
