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
_EXPORTS["mine_hard_negatives"] = "bertkit.sentence.util"  # sentence-transformers exports it here too
# the names sentence-transformers exports here that bertkit does not implement, with what to use (an
# AttributeError named them without a fix)
_SAMPLER = (
    "choose the batches with the training arguments' batch_sampler=BatchSamplers.… and "
    "multi_dataset_batch_sampler=MultiDatasetBatchSamplers.… (bertkit.sentence.training_args); a custom "
    "sampler class is not supported"
)
_CARD = (
    "bertkit writes no model card (README.md): a model keeps its model_card_data= for the script that reads "
    "it back; write the card yourself"
)
_MULTI_VECTOR = (
    "multi-vector (late-interaction) models are not implemented in bertkit; token states come from "
    "bertkit.pipeline('feature-extraction', pooling='none')"
)
_EXPORT = "bertkit runs its own PyTorch encoder (no ONNX or OpenVINO): for int8 use bertkit.pipeline(..., quantize='int8')"
REFUSED = {
    "LoggingHandler": "use Python's logging module (bertkit logs under the 'bertkit' logger)",
    "SentencesDataset": "give fit the list of InputExample itself: DataLoader(examples, shuffle=True, batch_size=...)",
    "ParallelSentencesDataset": "train with SentenceTransformerTrainer on (source, target) rows with a teacher's "
    "embeddings as the label (losses.MSELoss)",
    "resolve_ids": "it is part of sentence-transformers' own machinery, which bertkit does not reproduce",
    "DefaultBatchSampler": _SAMPLER,
    "MultiDatasetDefaultBatchSampler": _SAMPLER,
    **dict.fromkeys(
        [
            "SentenceTransformerModelCardData",
            "CrossEncoderModelCardData",
            "SparseEncoderModelCardData",
            "MultiVectorEncoderModelCardData",
        ],
        _CARD,
    ),
    **dict.fromkeys(
        ["MultiVectorEncoder", "MultiVectorEncoderTrainer", "MultiVectorEncoderTrainingArguments"],
        _MULTI_VECTOR,
    ),
    **dict.fromkeys(
        [
            "export_optimized_onnx_model",
            "export_dynamic_quantized_onnx_model",
            "export_static_quantized_openvino_model",
        ],
        _EXPORT,
    ),
}
__getattr__ = _lazy_getattr("bertkit.sentence", _EXPORTS, REFUSED)
