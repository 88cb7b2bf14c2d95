"""Evaluators of sparse encoders with sentence-transformers' names (``sentence_transformers.sparse_encoder.evaluation``):
the dense evaluators' metrics, and the embeddings' sparsity."""

from bertkit.sentence.sparse_encoder.evaluation.information_retrieval import (
    SparseInformationRetrievalEvaluator,
)

__all__ = ["SparseInformationRetrievalEvaluator"]
