"""sentence-transformers' cross-encoder API on bertkit's sequence classifier and training loop
(``sentence_transformers.cross_encoder``): ``CrossEncoder``, ``CrossEncoderTrainer``,
``CrossEncoderTrainingArguments`` and the submodules ``losses`` and ``evaluation``. What is implemented and what
is refused: docs/sentence.md, "Cross-encoders"."""

from __future__ import annotations

from bertkit import _lazy_getattr

_EXPORTS = {
    "CrossEncoder": "bertkit.sentence.cross_encoder.model",
    "CrossEncoderTrainer": "bertkit.sentence.cross_encoder.trainer",
    "CrossEncoderTrainingArguments": "bertkit.sentence.cross_encoder.training_args",
}
__all__ = list(_EXPORTS)
_REFUSED = {
    "CrossEncoderDataCollator": "the trainer collates its batches itself (each text column tokenized, with the arguments' "
    "prompts); a custom data_collator is not supported",
    "CrossEncoderModelCardData": "bertkit writes no model card (README.md): a model keeps its model_card_data= for the script "
    "that reads it back; write the card yourself",
}
__getattr__ = _lazy_getattr("bertkit.sentence.cross_encoder", _EXPORTS, _REFUSED)
