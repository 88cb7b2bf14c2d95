"""What every loss shares: the columns it takes, whether it needs labels or in-batch negatives, and one forward
pass over all its columns.

A loss is an ``nn.Module`` holding the model (``loss.model``), called as sentence-transformers calls it,
``loss(sentence_features, labels)`` with one tokenized batch per column, and computing its value from the
columns' embeddings in ``compute_loss_from_embeddings(embeddings, labels)``.
"""

from __future__ import annotations

import enum
import math
import numbers
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from bertkit.errors import BertkitError
from bertkit.sentence.losses.gather import gather_rows, gathering, scale_gradient

# Columns merge into one forward pass when the merged rectangle is at most this much larger than theirs apart.
MERGE_SLACK = 1.25


_PLAIN = (bool, int, float, str, type(None))


def loss_settings(loss: nn.Module) -> dict[str, Any]:
    """What a resumed run must find unchanged in its loss (the trainer's fingerprint): the class, each public plain
    setting (scale, margin, Matryoshka's dims, a regulariser's weight, the similarity function by name) and the
    losses it wraps, by theirs; not the model, weights or state. A run resumed under another loss trained on
    without a word, as sentence-transformers' does."""
    settings = _plain_settings(loss)
    for key, child in loss.named_children():  # a wrapped loss, or torch's (CrossEntropyLoss' label_smoothing)
        if isinstance(child, nn.modules.loss._Loss) or type(child).__name__.endswith("Loss"):
            settings[key] = loss_settings(child)
    return {type(loss).__qualname__: settings}


# the names in a model's config of where it came from, not of the model (as ``training.checkpoint`` compares configs)
_PROVENANCE = ("_name_or_path", "architectures", "transformers_version")


def module_settings(module: nn.Module) -> dict[str, Any]:
    """What a resumed run must find unchanged in a model's module beside its weights, which the checkpoint holds (the
    trainer's fingerprint): the class, each public plain setting (pooling modes, a Dense layer's sizes, SPLADE's
    pooling and activation) and its submodules' by theirs, an encoder by its config. A run resumed with another
    pooling, or without its Normalize, trained another model without a word."""
    config = getattr(module, "config", None)
    if callable(getattr(config, "to_dict", None)):
        return {"config": {k: v for k, v in config.to_dict().items() if k not in _PROVENANCE}}
    settings = _plain_settings(module)
    for key, child in module.named_children():
        settings[key] = {type(child).__qualname__: module_settings(child)}
    return settings


def _plain_settings(module: nn.Module) -> dict[str, Any]:
    """``module``'s public attributes that are plain values (or lists of them), enums by name, functions by theirs."""
    settings: dict[str, Any] = {}
    for key, value in sorted(vars(module).items()):
        if key.startswith("_") or key == "training":
            continue
        if isinstance(value, enum.Enum):
            value = value.name
        elif isinstance(value, (list, tuple)) and all(isinstance(v, _PLAIN) for v in value):
            value = list(value)
        elif callable(value) and not isinstance(value, nn.Module):
            value = getattr(value, "__qualname__", type(value).__qualname__)
        elif not isinstance(value, _PLAIN):
            continue
        settings[key] = value
    return settings


def embed_columns(model: nn.Module, features: Sequence[dict[str, Any]]) -> list[Tensor]:
    """Each column's (B, D) embeddings. Columns with the same prompt length and task (a Router's route: a sparse
    model's) run together (``_embed_alike``), each such group apart: so a prompted anchor column leaves its
    candidate columns merged, as sentence-transformers merges them, and a text in both a positive and a negative
    column gets the same embedding bit for bit (GISTEmbedLoss compares the guide's scores of the two with ``>``:
    embedded apart, float rounding broke that tie, and masked other false negatives than sentence-transformers)."""
    groups: dict[tuple[int, Any], list[int]] = {}
    for i, f in enumerate(features):
        groups.setdefault((int(f.get("prompt_length", 0)), f.get("task")), []).append(i)
    embeddings: list[Tensor | None] = [None] * len(features)
    for kind, columns in groups.items():
        for i, e in zip(columns, _embed_alike(model, [features[i] for i in columns], kind), strict=True):
            embeddings[i] = e
    return embeddings


def _embed_alike(model: nn.Module, features: Sequence[dict[str, Any]], kind: tuple[int, Any]) -> list[Tensor]:
    """The embeddings of columns of one prompt length and task: of similar widths, as one batch (C x B rows, padded
    to the longest), else one forward each: a GPU computes on the padded rectangle in half precision, where a
    20-token query column padded to its 256-token passages' width would cost as much as the passages
    (sentence-transformers, too, runs each column at its own width)."""
    widths = [f["input_ids"].shape[1] for f in features]
    rows = [f["input_ids"].shape[0] for f in features]
    width = max(widths)
    merged_cost = width * sum(rows)
    if len(features) == 1 or merged_cost > MERGE_SLACK * sum(w * r for w, r in zip(widths, rows)):
        return [embed(model, f) for f in features]

    def cat(key: str) -> Tensor:
        return torch.cat([F.pad(f[key], (0, width - f[key].shape[1])) for f in features])  # (C*B, T)

    keys = [k for k in ("input_ids", "attention_mask", "token_type_ids") if all(k in f for f in features)]
    merged = {**{k: cat(k) for k in keys}, **dict(zip(("prompt_length", "task"), kind))}
    return list(embed(model, merged).split(rows))  # (C*B, D), split back into the columns


def embed(model: nn.Module, features: dict[str, Any]) -> Tensor:
    """``model.embed`` of one column's features, with the task where the column has one (only a sparse model's
    Router takes it)."""
    task = features.get("task")
    return model.embed(features["input_ids"], features["attention_mask"], features.get("token_type_ids"),
                       int(features.get("prompt_length", 0)), **({"task": task} if task is not None else {}))


class SentenceLoss(nn.Module):
    """Base of bertkit.sentence's losses: the columns it takes (``columns``: fewest, most or None), whether the
    dataset must carry a label column, whether its labels are class ids (ints, compared for equality), whether each
    row's negatives are the batch's other rows."""

    columns: ClassVar[tuple[int, int | None]] = (2, 2)
    needs_label: ClassVar[bool] = False
    in_batch_negatives: ClassVar[bool] = False
    gather_across_devices: bool = False

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, sentence_features: Sequence[dict[str, Any]], labels: Tensor | None) -> Tensor:
        return self.loss_on_batch(embed_columns(self.model, sentence_features), sentence_features, labels)

    def loss_on_batch(self, embeddings: list[Tensor], sentence_features: Sequence[dict[str, Any]],
                      labels: Tensor | None, compute: Callable[..., Tensor] | None = None,
                      guide: list[Tensor] | None = None) -> Tensor:
        """``compute`` (this loss's own by default) on this process's embeddings (and a guide model's, for
        GISTEmbedLoss), or with ``gather_across_devices`` under torchrun on the global batch's (losses/gather.py)."""
        lo, hi = self.columns
        if len(embeddings) < lo or (hi is not None and len(embeddings) > hi):
            # the trainer checks a dataset's columns when it is made; a direct call is checked here (a softmax over
            # one candidate column would be a constant 0, and one column would fail inside torch.cat)
            raise BertkitError(f"{self.describe_columns()}, got a batch of {len(embeddings)} text column(s)")
        compute = compute or self.compute_loss_from_embeddings
        extra = () if guide is None else (guide,)
        # Evaluation (no grad) gathers nothing: its batches are dealt out whole, so the ranks run different numbers
        # of them (a gather would wait for a peer with none left), and each batch's loss is then the one that one
        # process computes for it.
        if not (self.gather_across_devices and gathering() and torch.is_grad_enabled()):
            return compute(embeddings, labels, *extra)
        index = sentence_features[0].get("index")
        embeddings, factor = gather_rows(embeddings, index)
        if guide is not None:
            extra = (gather_rows(guide, index)[0],)
        return scale_gradient(compute(embeddings, labels, *extra), factor)

    def compute_loss_from_embeddings(self, embeddings: list[Tensor], labels: Tensor | None) -> Tensor:
        raise NotImplementedError

    def check_labels(self, labels: Sequence[Any], what: str) -> None:
        """Refuse a dataset's label column (every row's label) that this loss cannot train on, naming the row: called
        once when the trainer is made. Every label is accepted here; a loss with classes checks them."""

    def describe_columns(self) -> str:
        lo, hi = self.columns
        n = f"{lo}" if lo == hi else f"{lo} or more" if hi is None else f"{lo} to {hi}"
        return f"{type(self).__name__} takes {n} text column(s)" + (" and a label column ('label' or 'score')"
                                                                     if self.needs_label else "")


def refuse(loss: str, name: str, value: Any, default: Any, advice: str) -> None:
    """A sentence-transformers loss argument bertkit does not implement: refused unless given at its default."""
    if value != default:
        raise BertkitError(f"{loss}({name}={value!r}) is not implemented in bertkit: {advice}")


def check_positive(loss: str, name: str, value: Any) -> float:
    """``value`` as a float, refused unless a finite number > 0 (a scale or a temperature: 0, a negative, NaN or
    infinity gives a loss that is constant, inverted or NaN from the first step)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 < value < math.inf:
        raise BertkitError(f"{loss}: {name} must be a positive finite number, got {value!r}")
    return float(value)


def check_labels(loss: str, labels: Tensor | None, rows: int) -> Tensor:
    if labels is None or labels.numel() != rows:
        got = "none" if labels is None else f"{labels.numel()}"
        raise BertkitError(f"{loss} needs one label per row: {rows} rows, {got} labels; add a 'label' or 'score' "
                           "column to the dataset")
    return labels.reshape(-1)
