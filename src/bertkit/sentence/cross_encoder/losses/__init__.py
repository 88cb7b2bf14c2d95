"""Cross-encoder training losses with sentence-transformers' names, arguments and numbers
(``sentence_transformers.cross_encoder.losses``).

A loss is called as sentence-transformers calls it, ``loss(inputs, labels)``: ``inputs`` holds one list per
dataset column, each entry a text or its word pieces (``CrossEncoder.token_ids``; the trainer passes those, so a
text is tokenized once, not once per pair it is in). Pairwise losses take (anchor, candidate, ...) columns; the
listwise ones (LambdaLoss, ListNetLoss) a query column and a column of document lists, with a list of labels
per row. Every pair a step scores goes through the model in one forward pass (bertkit's encoder drops the
padding, so this gives the per-column calls' numbers); ``mini_batch_size`` splits it.
"""


from bertkit.sentence.cross_encoder.losses.base import CrossEncoderLoss
from bertkit.sentence.cross_encoder.losses.listwise import (
    ADRMSELoss,
    BaseWeightingScheme,
    LambdaLoss,
    LambdaRankScheme,
    ListMLELoss,
    ListNetLoss,
    NDCGLoss1Scheme,
    NDCGLoss2PPScheme,
    NDCGLoss2Scheme,
    NoWeightingScheme,
    PListMLELambdaWeight,
    PListMLELoss,
    RankNetLoss,
)
from bertkit.sentence.cross_encoder.losses.pairs import (
    BinaryCrossEntropyLoss,
    CachedMultipleNegativesRankingLoss,
    CrossEntropyLoss,
    MarginMSELoss,
    MSELoss,
    MultipleNegativesRankingLoss,
)

__all__ = ["CrossEncoderLoss", "BinaryCrossEntropyLoss", "CrossEntropyLoss", "MSELoss", "MarginMSELoss",
           "MultipleNegativesRankingLoss", "CachedMultipleNegativesRankingLoss", "LambdaLoss", "RankNetLoss",
           "ListNetLoss", "PListMLELoss", "PListMLELambdaWeight", "ListMLELoss", "ADRMSELoss", "BaseWeightingScheme", "NoWeightingScheme",
           "NDCGLoss1Scheme", "NDCGLoss2Scheme", "LambdaRankScheme", "NDCGLoss2PPScheme"]
