"""Evaluators with sentence-transformers' names, arguments and metric keys (``sentence_transformers.evaluation``):
call one on a model, ``evaluator(model)``, for a dict of metrics; give one to the trainer as ``evaluator=``."""

from bertkit.sentence.evaluation.information_retrieval import InformationRetrievalEvaluator
from bertkit.sentence.evaluation.reranking import RerankingEvaluator
from bertkit.sentence.evaluation.sequential import SequentialEvaluator
from bertkit.sentence.evaluation.similarity import EmbeddingSimilarityEvaluator
from bertkit.sentence.evaluation.triplet import TripletEvaluator

__all__ = ["InformationRetrievalEvaluator", "EmbeddingSimilarityEvaluator", "TripletEvaluator", "RerankingEvaluator",
           "SequentialEvaluator"]
