"""Putting models to use: task pipelines (``pipeline``), export (``export``).

    import bertkit
    fill = bertkit.pipeline("fill-mask", "models/bert-base-uncased")
    fill("Paris is the [MASK] of France.")[0]["token_str"]   # 'capital'

Every pipeline takes a list of inputs of any size, batches them by length (little padding, which the
encoder then drops) and returns JSON-able results in input order. The tasks are declared in ``tasks.py``. Public
names are imported on first use (PEP 562), so that the command line reads the tasks without loading torch.
"""

from __future__ import annotations

from bertkit import _lazy_getattr

_EXPORTS = {
    "TASKS": "bertkit.inference.tasks",
    "pipeline": "bertkit.inference.tasks",
    "Pipeline": "bertkit.inference.base",
    "FeatureExtractionPipeline": "bertkit.inference.embedding",
    "FillMaskPipeline": "bertkit.inference.pipelines",
    "MultipleChoicePipeline": "bertkit.inference.pipelines",
    "QuestionAnsweringPipeline": "bertkit.inference.pipelines",
    "RerankPipeline": "bertkit.inference.pipelines",
    "SentenceEmbeddingPipeline": "bertkit.inference.embedding",
    "TextClassificationPipeline": "bertkit.inference.pipelines",
    "TokenClassificationPipeline": "bertkit.inference.tagging",
}
__all__ = list(_EXPORTS)
__getattr__ = _lazy_getattr("bertkit.inference", _EXPORTS)
