"""Putting models to use: task pipelines (``pipeline``), export (``export``).

    import bertkit
    fill = bertkit.pipeline("fill-mask", "models/bert-base-uncased")
    fill("Paris is the [MASK] of France.")[0]["token_str"]   # 'capital'

Every pipeline takes a list of inputs of any size, batches them by length (little padding, which the
encoder then drops) and returns JSON-able results in input order.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from bertkit.errors import BertkitError
from bertkit.inference.base import Pipeline
from bertkit.inference.pipelines import (
    FeatureExtractionPipeline,
    FillMaskPipeline,
    MultipleChoicePipeline,
    QuestionAnsweringPipeline,
    RerankPipeline,
    SentenceEmbeddingPipeline,
    TextClassificationPipeline,
    TokenClassificationPipeline,
)
from bertkit.tokenization import BertTokenizer

TASKS: dict[str, type[Pipeline]] = {
    **{c.task: c for c in (FillMaskPipeline, TextClassificationPipeline, RerankPipeline, TokenClassificationPipeline,
                           QuestionAnsweringPipeline, MultipleChoicePipeline, FeatureExtractionPipeline,
                           SentenceEmbeddingPipeline)},
    "sentiment-analysis": TextClassificationPipeline,  # transformers' aliases
    "ner": TokenClassificationPipeline,
}


def pipeline(task: str | None = None, model: str | os.PathLike | nn.Module | None = None, *,
             tokenizer: str | os.PathLike | BertTokenizer | None = None, device: str | torch.device = "cpu",
             bf16: bool | None = None, batch_size: int = 32, max_length: int | None = None, progress: bool | None = None,
             quantize: str | None = None,
             calibration_texts: Sequence[str | tuple[str, str]] | None = None, **options: Any) -> Pipeline:
    """The ``task`` pipeline over ``model``, as transformers' ``pipeline(task, model)`` is called.

    ``model`` is a checkpoint directory (config.json, model.safetensors, vocab.txt), or a bertkit model already
    built, with ``tokenizer=`` (a ``BertTokenizer`` or its directory). ``bf16=True`` runs the model under bfloat16
    autocast, ``bf16=False`` in the weights' dtype; left unset, it is on for int8 on CPUs with bf16 instructions and off otherwise (``.bf16`` says
    which). ``quantize="int8"`` runs the encoder's projections in int8 on the CPU (docs/inference.md section int8):
    a quantized copy, made once, calibrated on ``calibration_texts`` (a few hundred texts like the inputs; strings
    or ``(text, text_pair)`` tuples) or by default on 64 built-in English sentences. ``batch_size`` sequences run
    at once, grouped by length; ``max_length`` (default: the model's positions, or a sentence-transformers
    directory's max_seq_length) caps each sequence: texts are
    truncated, QA contexts windowed.
    ``progress`` draws a bar (None: only for long inputs). ``options`` go to the task's pipeline (e.g.
    ``pooling="cls"``, ``normalize=True`` for embeddings).
    """
    tasks = ", ".join(TASKS)
    if task is not None and not (isinstance(task, str) and task in TASKS):
        hint = ""
        if isinstance(task, (str, os.PathLike)) and isinstance(model, str) and model in TASKS:
            hint = f" (the arguments are (task, model): pipeline({model!r}, {str(task)!r}))"
        raise BertkitError(f"unknown pipeline task {task!r}{hint}; choose one of {tasks}")
    if task is None and model is not None:
        raise BertkitError(f"pipeline(model=...) needs a task: a head serves several (a sequence classifier classifies "
                           f"or reranks, an encoder extracts features or sentence embeddings); pass one of {tasks}")
    if model is None:
        called = f"pipeline({task!r})" if task is not None else "pipeline()"
        raise BertkitError(f"{called} needs a model: pipeline(task, model=\"checkpoint_dir\"), the directory "
                           f"written by save_pretrained (config.json, model.safetensors, vocab.txt), with task one "
                           f"of {tasks}")
    if not isinstance(model, (str, os.PathLike, nn.Module)):
        raise BertkitError(f"pipeline model must be a checkpoint directory (a str or Path) or a bertkit model, got "
                           f"{type(model).__name__} {str(model)[:60]!r}")
    kwargs = dict(device=device, bf16=bf16, batch_size=batch_size, max_length=max_length, progress=progress,
                  quantize=quantize, calibration_texts=calibration_texts, **options)
    cls = TASKS[task]
    if isinstance(model, nn.Module):
        if not isinstance(model, cls.model_class):
            raise BertkitError(f"the {task} pipeline runs a {cls.model_class.__name__}, got a {type(model).__name__}; "
                               f"load the checkpoint as {cls.model_class.__name__}.from_pretrained(...)")
        if tokenizer is None:
            raise BertkitError("pipeline(task, model=<a model object>) needs tokenizer= (a BertTokenizer or the "
                               "checkpoint directory holding vocab.txt)")
        if not isinstance(tokenizer, BertTokenizer):
            tokenizer = BertTokenizer.from_pretrained(tokenizer)
        return cls(model, tokenizer, **kwargs)
    if tokenizer is not None:
        raise BertkitError("tokenizer= goes with a model object; a checkpoint directory brings its own vocab.txt")
    return cls.from_pretrained(model, **kwargs)


__all__ = ["TASKS", "FeatureExtractionPipeline", "FillMaskPipeline", "MultipleChoicePipeline", "Pipeline",
           "QuestionAnsweringPipeline", "RerankPipeline", "SentenceEmbeddingPipeline", "TextClassificationPipeline",
           "TokenClassificationPipeline", "pipeline"]
