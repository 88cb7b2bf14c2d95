"""Training losses with sentence-transformers' names and numbers (``sentence_transformers.losses``)."""

from bertkit.errors import refusing_getattr
from bertkit.sentence.losses.base import SentenceLoss
from bertkit.sentence.losses.batch_triplet import (
    BatchAllTripletLoss,
    BatchHardSoftMarginTripletLoss,
    BatchHardTripletLoss,
    BatchHardTripletLossDistanceFunction,
    BatchSemiHardTripletLoss,
)
from bertkit.sentence.losses.cached import (
    CachedGISTEmbedLoss,
    CachedMultipleNegativesRankingLoss,
    CachedMultipleNegativesSymmetricRankingLoss,
)
from bertkit.sentence.losses.distill import DistillKLDivLoss, EmbedDistillLoss, MarginMSELoss, MSELoss
from bertkit.sentence.losses.gist import GISTEmbedLoss
from bertkit.sentence.losses.matryoshka import MatryoshkaLoss
from bertkit.sentence.losses.multiple_negatives import (
    MultipleNegativesRankingLoss,
    MultipleNegativesSymmetricRankingLoss,
)
from bertkit.sentence.losses.pairs import (
    AnglELoss,
    ContrastiveLoss,
    CoSENTLoss,
    CosineSimilarityLoss,
    OnlineContrastiveLoss,
    SiameseDistanceMetric,
    TripletDistanceMetric,
    TripletLoss,
)
from bertkit.sentence.losses.softmax import SoftmaxLoss
from bertkit.sentence.losses.spread import GlobalOrthogonalRegularizationLoss, MegaBatchMarginLoss

__all__ = ["SentenceLoss", "MultipleNegativesRankingLoss", "MultipleNegativesSymmetricRankingLoss",
           "CachedMultipleNegativesRankingLoss", "MatryoshkaLoss", "CoSENTLoss", "AnglELoss", "CosineSimilarityLoss",
           "ContrastiveLoss", "OnlineContrastiveLoss", "SiameseDistanceMetric", "TripletLoss", "TripletDistanceMetric",
           "GISTEmbedLoss", "MarginMSELoss", "DistillKLDivLoss", "EmbedDistillLoss", "MSELoss", "BatchAllTripletLoss",
           "BatchHardTripletLoss", "BatchSemiHardTripletLoss", "BatchHardSoftMarginTripletLoss",
           "BatchHardTripletLossDistanceFunction", "SoftmaxLoss", "CachedMultipleNegativesSymmetricRankingLoss",
           "CachedGISTEmbedLoss", "MegaBatchMarginLoss", "GlobalOrthogonalRegularizationLoss"]

# sentence-transformers' losses bertkit does not implement, with what to use
_REFUSED = {
    "AdaptiveLayerLoss": "use MatryoshkaLoss for embeddings that can be cut short",
    "Matryoshka2dLoss": "use MatryoshkaLoss for embeddings that can be cut short",
    "DenoisingAutoEncoderLoss": "adapt the encoder to a domain with masked-LM pre-training (bertkit pretrain "
                                "--init-from), then train the embedder",
    "ContrastiveTensionLoss": "use MultipleNegativesRankingLoss on (text, text) rows of the same text (SimCSE)",
    "ContrastiveTensionLossInBatchNegatives": "use MultipleNegativesRankingLoss on (text, text) rows of the same text "
                                              "(SimCSE)",
    "ContrastiveTensionDataLoader": "use MultipleNegativesRankingLoss on (text, text) rows of the same text (SimCSE)",
}
__getattr__ = refusing_getattr(__name__, _REFUSED)
