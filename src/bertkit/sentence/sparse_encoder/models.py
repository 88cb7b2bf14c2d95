"""sentence-transformers 5's name for the sparse encoder's modules (``from sentence_transformers.sparse_encoder.models
import MLMTransformer, SpladePooling``, which 6 still imports): ``bertkit.sentence.sparse_encoder.modules``' classes,
and its refusals of the modules bertkit does not implement."""

from bertkit.sentence.sparse_encoder.modules import (
    MLMTransformer,
    Router,
    SparseStaticEmbedding,
    SpladePooling,
    Transformer,
    __getattr__,  # noqa: F401  (the refusals, by name)
)

__all__ = ["MLMTransformer", "Router", "SparseStaticEmbedding", "SpladePooling", "Transformer"]
