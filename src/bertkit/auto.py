"""``AutoConfig`` and ``AutoModel*``: the names transformers users type, resolving BERT checkpoints.

A checkpoint's ``config.json`` names its ``model_type``; bertkit implements BERT only, so anything else
(``roberta``, ``distilbert``, ...) is refused with the type it found rather than loaded into the wrong
network. Each ``AutoModelFor<Task>`` builds the bertkit head class of that task; ``AutoTokenizer`` lives
with the tokenizer (``bertkit.tokenization``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from bertkit.checkpoint_io import dtype_argument, resolve_dtype
from bertkit.config import BertConfig
from bertkit.errors import BertkitError
from bertkit.heads import MODEL_CLASSES
from bertkit.modeling import BertModel


class AutoConfig:
    """``AutoConfig.from_pretrained(path_or_id, **overrides)`` -> ``BertConfig``."""

    def __init__(self) -> None:
        raise BertkitError("AutoConfig is not instantiated: use AutoConfig.from_pretrained(path)")

    @staticmethod
    def from_pretrained(path: str | Path, **overrides: Any) -> BertConfig:
        return BertConfig.from_pretrained(path, **overrides)


class _AutoModel:
    """``from_pretrained`` / ``from_config`` onto one bertkit model class."""

    model_class: type = BertModel

    def __init__(self) -> None:
        raise BertkitError(f"{type(self).__name__} is not instantiated: use {type(self).__name__}.from_pretrained(path)"
                           " or .from_config(config)")

    @classmethod
    def from_pretrained(cls, path: str | Path | None, **kwargs: Any):
        return cls.model_class.from_pretrained(path, **kwargs)

    @classmethod
    def from_config(cls, config: BertConfig, *, dtype: torch.dtype | str | None = None, **kwargs: Any):
        """A freshly initialised model of this config (no weights loaded), as transformers' ``from_config``:
        ``dtype`` (or its older name ``torch_dtype``; a name, or ``"auto"``: config.json's, else float32) is the
        model's, as there (it was a TypeError from the model class)."""
        dtype = dtype_argument(dtype, kwargs)
        model = cls.model_class(config, **kwargs)
        resolved = resolve_dtype(dtype, {}, config)
        return model if resolved is None else model.to(resolved)


def _auto_model(model_class: type) -> type[_AutoModel]:
    """``AutoModel`` for ``BertModel``, ``AutoModelFor<Task>`` for ``BertFor<Task>``: transformers' name for it."""
    name = "AutoModel" + model_class.__name__.removeprefix("BertModel").removeprefix("Bert")
    return type(name, (_AutoModel,), {"model_class": model_class, "__module__": __name__, "__qualname__": name,
                                      "__doc__": f"``from_pretrained`` / ``from_config`` onto ``{model_class.__name__}``."})


# One per bertkit model class, so a new head has its AutoModelFor<Task> without being named here.
globals().update({auto.__name__: auto for auto in map(_auto_model, MODEL_CLASSES.values())})
