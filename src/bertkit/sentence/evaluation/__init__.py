"""Evaluators with sentence-transformers' names, arguments and metric keys (``sentence_transformers.evaluation``):
call one on a model, ``evaluator(model)``, for a dict of metrics; give one to the trainer as ``evaluator=``."""

from bertkit.sentence.evaluation.information_retrieval import InformationRetrievalEvaluator
from bertkit.sentence.evaluation.similarity import EmbeddingSimilarityEvaluator

__all__ = ["InformationRetrievalEvaluator", "EmbeddingSimilarityEvaluator"]
