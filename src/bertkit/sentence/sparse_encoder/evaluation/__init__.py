"""Evaluators of sparse encoders with sentence-transformers' names (``sentence_transformers.sparse_encoder.evaluation``):
the dense evaluators' metrics, and the embeddings' sparsity. sentence-transformers' other sparse evaluators are
refused by name with what to use (``_REFUSED``)."""

from __future__ import annotations

from bertkit.errors import refusing_getattr
from bertkit.sentence.sparse_encoder.evaluation.information_retrieval import (
    SparseInformationRetrievalEvaluator,
)
from bertkit.sentence.sparse_encoder.evaluation.reranking import SparseRerankingEvaluator
from bertkit.sentence.sparse_encoder.evaluation.similarity import SparseEmbeddingSimilarityEvaluator
from bertkit.sentence.sparse_encoder.evaluation.triplet import SparseTripletEvaluator

__all__ = ["SparseInformationRetrievalEvaluator", "SparseEmbeddingSimilarityEvaluator", "SparseTripletEvaluator",
           "SparseRerankingEvaluator"]

_REFUSED = {
    "SparseBinaryClassificationEvaluator": "score the pairs with model.similarity_pairwise(model.encode(sentences1), "
                                           "model.encode(sentences2)) and choose the threshold on them with "
                                           "bertkit.sentence.evaluation.BinaryClassificationEvaluator's "
                                           "find_best_acc_and_threshold and find_best_f1_and_threshold; "
                                           "SparseEmbeddingSimilarityEvaluator gives the correlation with the labels",
    "SparseMSEEvaluator": "it compares a student's embeddings with a teacher model's of the same width: compute "
                          "torch.nn.functional.mse_loss(model.encode(target_sentences, convert_to_sparse_tensor="
                          "False), teacher.encode(source_sentences, convert_to_sparse_tensor=False))",
    "SparseTranslationEvaluator": "use SparseInformationRetrievalEvaluator with the source sentences as queries, the "
                                  "target sentences as the corpus, each source's translation as its relevant "
                                  "document and score_functions={'cosine': bertkit.sentence.util.cos_sim}: "
                                  "accuracy@1 is the source-to-target accuracy (swap them for target-to-source)",
    "SparseNanoBEIREvaluator": "bertkit reads local files only: load the NanoBEIR datasets and run a "
                               "SparseInformationRetrievalEvaluator on each (bertkit.sentence.evaluation."
                               "SequentialEvaluator runs several)",
    "ReciprocalRankFusionEvaluator": "it scores two rankings given to it: fuse them (each document scores the sum "
                                     "of 1 / (rrf_k + its rank from 1) in each) and score the fused order with "
                                     "bertkit.sentence.evaluation.reranking's average_precision and ndcg_at_k",
}


__getattr__ = refusing_getattr(__name__, _REFUSED)
