"""``AutoTokenizer.from_pretrained(path)``, as code written against transformers calls it, for BERT directories.

It reads what the directory says it holds, in transformers' order (``tokenizer_class`` in tokenizer_config.json,
else in config.json, else config.json's ``model_type``): a BERT tokenizer loads; any other is an error naming it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from bertkit.errors import BertkitError
from bertkit.tokenization.loading import CONFIG_FILE, read_json
from bertkit.tokenization.tokenizer import BertTokenizer

__all__ = ["AutoTokenizer"]

BERT_TOKENIZER_CLASSES = ("BertTokenizer", "BertTokenizerFast")
MODEL_CONFIG_FILE = "config.json"


class AutoTokenizer:
    """``AutoTokenizer.from_pretrained(path)`` -> a ``BertTokenizer`` for a BERT tokenizer directory.

    >>> tok = AutoTokenizer.from_pretrained("models/minilm")
    >>> type(tok).__name__
    'BertTokenizer'
    """

    def __init__(self) -> None:
        raise TypeError("AutoTokenizer is not instantiated: use AutoTokenizer.from_pretrained(path)")

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, use_fast: bool = True, **kwargs: Any) -> BertTokenizer:
        """Load the BERT tokenizer in ``path`` (a directory or Hub id); ``kwargs`` as
        ``BertTokenizer.from_pretrained``. ``use_fast=False`` (transformers' Python tokenizer, which
        normalises a few characters differently) is refused: bertkit's tokenizer is the fast one's twin."""
        from bertkit.hub import not_a_directory, refuse_hub_options, resolve_directory

        local_files_only = refuse_hub_options(path, kwargs)
        if use_fast is not True:
            raise BertkitError(f"use_fast={use_fast!r}: bertkit's tokenizer reproduces BertTokenizerFast only; "
                               "drop the argument (or pass use_fast=True)")
        directory = resolve_directory(path, "tokenizer directory", local_files_only)
        if not directory.is_dir():
            raise not_a_directory(directory, "tokenizer directory", "pass the checkpoint directory")
        _check_is_bert(directory)
        return BertTokenizer.from_pretrained(directory, **kwargs)


def _check_is_bert(directory: Path) -> None:
    """Raise unless the first name the directory's files give, in transformers' order, is BERT's."""
    tokenizer_config, model_config = read_json(directory / CONFIG_FILE), read_json(directory / MODEL_CONFIG_FILE)
    named = ((CONFIG_FILE, "tokenizer_class", tokenizer_config, BERT_TOKENIZER_CLASSES),
             (MODEL_CONFIG_FILE, "tokenizer_class", model_config, BERT_TOKENIZER_CLASSES),
             (MODEL_CONFIG_FILE, "model_type", model_config, ("bert",)))
    file, key, name, bert = next(((f, k, c[k], b) for f, k, c, b in named if c.get(k) is not None), (None,) * 4)
    if name is None:
        raise BertkitError(f"{directory} does not say which tokenizer it holds (no tokenizer_class in {CONFIG_FILE}, "
                           f"no {MODEL_CONFIG_FILE} with model_type): load it with BertTokenizer.from_pretrained if it "
                           "is BERT's, or add \"tokenizer_class\": \"BertTokenizer\" to its tokenizer_config.json")
    if name not in bert:
        raise BertkitError(f"{directory / file} names {key} {name!r}; bertkit's AutoTokenizer loads BERT tokenizers "
                           f"only ({key} {' or '.join(map(repr, bert))}): use transformers for that model")
