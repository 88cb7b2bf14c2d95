"""bertkit: BERT (Devlin et al., 2018) from scratch on PyTorch.

Public names are imported lazily (PEP 562) so ``import bertkit`` stays cheap for the command line.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "BertConfig": "bertkit.config",
    "BertModel": "bertkit.modeling",
    "BertForPreTraining": "bertkit.heads",
    "BertForMaskedLM": "bertkit.heads",
    "BertForNextSentencePrediction": "bertkit.heads",
    "BertForSequenceClassification": "bertkit.heads",
    "BertForTokenClassification": "bertkit.heads",
    "BertForQuestionAnswering": "bertkit.heads",
    "BertForMultipleChoice": "bertkit.heads",
    "BertTokenizer": "bertkit.tokenization",
    "BertTokenizerFast": "bertkit.tokenization",
    "AutoTokenizer": "bertkit.tokenization",
    "AddedToken": "bertkit.tokenization",
    "pipeline": "bertkit.inference",
    "optimize_for_inference": "bertkit.inference.prepare",
    "AutoConfig": "bertkit.auto",
    "AutoModel": "bertkit.auto",
    "AutoModelForPreTraining": "bertkit.auto",
    "AutoModelForMaskedLM": "bertkit.auto",
    "AutoModelForNextSentencePrediction": "bertkit.auto",
    "AutoModelForSequenceClassification": "bertkit.auto",
    "AutoModelForTokenClassification": "bertkit.auto",
    "AutoModelForQuestionAnswering": "bertkit.auto",
    "AutoModelForMultipleChoice": "bertkit.auto",
    "Trainer": "bertkit.training.trainer",
    "TrainerCallback": "bertkit.training.callbacks",
    "TrainerState": "bertkit.training.callbacks",
    "TrainerControl": "bertkit.training.callbacks",
    "EarlyStoppingCallback": "bertkit.training.callbacks",
    "EvalPrediction": "bertkit.training.callbacks",
    "TrainOutput": "bertkit.training.callbacks",
    "PredictionOutput": "bertkit.training.callbacks",
    "set_seed": "bertkit.training.seeding",
    "TrainingArguments": "bertkit.training.trainer_args",
    "DataCollatorWithPadding": "bertkit.data.collators",
    "DataCollatorForTokenClassification": "bertkit.data.collators",
    "DataCollatorForLanguageModeling": "bertkit.data.collators",
    "DefaultDataCollator": "bertkit.data.collators",
    "DataCollatorForMultipleChoice": "bertkit.data.collators",
    "default_data_collator": "bertkit.data.collators",
}
__all__ = list(_EXPORTS)




def _lazy_getattr(package: str, exports: dict[str, str],
                  refused: dict[str, str] | None = None) -> Callable[[str], Any]:
    """A PEP 562 module ``__getattr__`` that imports ``exports[name]`` on first use of ``name``; a name of
    ``refused`` (a reference library's name bertkit does not implement -> what to use) raises a BertkitError saying
    so, which ``from package import name`` shows as it is."""

    def __getattr__(name: str) -> Any:
        if name in exports:
            return getattr(importlib.import_module(exports[name]), name)
        if refused and name in refused:
            from bertkit.errors import refusing_getattr

            return refusing_getattr(package, refused)(name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__


__getattr__ = _lazy_getattr("bertkit", _EXPORTS)


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
