"""sentence-transformers 6's sparse encoders (``sentence_transformers.sparse_encoder``) on bertkit's masked-LM
model: ``SparseEncoder`` (SPLADE), its ``modules``, ``losses``, ``callbacks`` and ``evaluation``, and
``SparseEncoderTrainer``. What is implemented and what is refused:
docs/sentence.md."""

from __future__ import annotations

from bertkit import _lazy_getattr

_EXPORTS = {
    "SparseEncoder": "bertkit.sentence.sparse_encoder.model",
    "SparseEncoderTrainer": "bertkit.sentence.sparse_encoder.trainer",
    "SparseEncoderTrainingArguments": "bertkit.sentence.sparse_encoder.training_args",
}
__all__ = list(_EXPORTS)
_REFUSED = {
    "SparseEncoderDataCollator": "the trainer collates its batches itself (each text column tokenized, with the arguments' "
    "prompts and router_mapping); a custom data_collator is not supported",
    "SparseEncoderModelCardData": "bertkit writes no model card (README.md): a model keeps its model_card_data= for the script "
    "that reads it back; write the card yourself",
}
__getattr__ = _lazy_getattr("bertkit.sentence.sparse_encoder", _EXPORTS, _REFUSED)
