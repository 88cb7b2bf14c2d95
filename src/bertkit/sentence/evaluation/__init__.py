"""Evaluators with sentence-transformers' names, arguments and metric keys (``sentence_transformers.evaluation``):
call one on a model, ``evaluator(model)``, for a dict of metrics; give one to the trainer as ``evaluator=``.
sentence-transformers' other evaluators are refused by name with what to use (``_REFUSED``)."""

from bertkit.errors import refusing_getattr
from bertkit.sentence.evaluation.binary_classification import BinaryClassificationEvaluator
from bertkit.sentence.evaluation.information_retrieval import InformationRetrievalEvaluator
from bertkit.sentence.evaluation.label_accuracy import LabelAccuracyEvaluator
from bertkit.sentence.evaluation.mse import MSEEvaluator, MSEEvaluatorFromDataFrame, TranslationEvaluator
from bertkit.sentence.evaluation.paraphrase_mining import ParaphraseMiningEvaluator
from bertkit.sentence.evaluation.reranking import RerankingEvaluator
from bertkit.sentence.evaluation.sequential import SequentialEvaluator
from bertkit.sentence.evaluation.similarity import EmbeddingSimilarityEvaluator
from bertkit.sentence.evaluation.triplet import TripletEvaluator
from bertkit.sentence.util import SimilarityFunction

__all__ = ["InformationRetrievalEvaluator", "EmbeddingSimilarityEvaluator", "TripletEvaluator", "RerankingEvaluator",
           "SequentialEvaluator", "BinaryClassificationEvaluator", "ParaphraseMiningEvaluator", "SimilarityFunction",
           "LabelAccuracyEvaluator", "MSEEvaluator", "MSEEvaluatorFromDataFrame", "TranslationEvaluator"]

_REFUSED = {
    "NanoBEIREvaluator": "bertkit reads local files only: load the NanoBEIR datasets and run an "
                         "InformationRetrievalEvaluator on each (SequentialEvaluator runs several)",
    "SentenceEvaluator": "subclass nothing: an evaluator is any callable evaluator(model, output_path=None, "
                         "epoch=-1, steps=-1) returning a dict of metrics, with a primary_metric attribute",
    "BaseEvaluator": "subclass nothing: an evaluator is any callable evaluator(model, output_path=None, "
                     "epoch=-1, steps=-1) returning a dict of metrics, with a primary_metric attribute",
}

__getattr__ = refusing_getattr(__name__, _REFUSED)
