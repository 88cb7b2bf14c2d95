"""Training losses with sentence-transformers' names and numbers (``sentence_transformers.losses``)."""

from bertkit.sentence.losses.base import SentenceLoss
from bertkit.sentence.losses.cached import CachedMultipleNegativesRankingLoss
from bertkit.sentence.losses.distill import DistillKLDivLoss, MarginMSELoss
from bertkit.sentence.losses.gist import GISTEmbedLoss
from bertkit.sentence.losses.matryoshka import MatryoshkaLoss
from bertkit.sentence.losses.multiple_negatives import (
    MultipleNegativesRankingLoss,
    MultipleNegativesSymmetricRankingLoss,
)
from bertkit.sentence.losses.pairs import CoSENTLoss, CosineSimilarityLoss, TripletDistanceMetric, TripletLoss

__all__ = ["SentenceLoss", "MultipleNegativesRankingLoss", "MultipleNegativesSymmetricRankingLoss",
           "CachedMultipleNegativesRankingLoss", "MatryoshkaLoss", "CoSENTLoss", "CosineSimilarityLoss",
           "TripletLoss", "TripletDistanceMetric", "GISTEmbedLoss", "MarginMSELoss", "DistillKLDivLoss"]
