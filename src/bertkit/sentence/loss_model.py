"""The module the training loop drives for the sentence trainers: the loss (a loss per dataset, by name) over the
model, a batch of text columns in and the loss out, with a multi-term loss's terms kept for the log; and the checks a
trainer makes of its losses before it trains."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from bertkit._parallel import info_from_env
from bertkit.errors import BertkitError
from bertkit.sentence.losses import SentenceLoss
from bertkit.training.distributed import all_gather, current


@dataclass
class LossOutput:
    loss: Tensor


class DatasetLosses(nn.Module):
    """The loss as the training loop drives it, a batch in and the loss out: with a loss per dataset ({name: loss}),
    each batch trains on the loss of the dataset it comes from (``dataset_name``). Saving it writes the model's
    directory (checkpoints are sentence-transformers directories)."""

    def __init__(self, loss: nn.Module | dict[str, nn.Module]):
        super().__init__()
        # a loss per dataset under the dataset's name: the parameter names sentence-transformers' optimiser sees
        # (``{name}.model.0.…``, each shared parameter under the first name)
        self.loss = nn.ModuleDict(loss) if isinstance(loss, dict) else loss

    def loss_of(self, dataset_name: str | None) -> nn.Module:
        return self.loss[dataset_name] if isinstance(self.loss, nn.ModuleDict) else self.loss

    def save_pretrained(self, path: str | Path) -> Path:
        return self._model().save(path)

    def _model(self) -> nn.Module:
        loss = next(iter(self.loss.values())) if isinstance(self.loss, nn.ModuleDict) else self.loss
        return loss.model


class LossModel(DatasetLosses):
    """``DatasetLosses`` on a padded batch of the C text columns. A loss that returns its terms by name (SpladeLoss)
    is trained on their sum, and each term's mean since the last log is logged beside the loss (``components``,
    rounded to 4 decimals), as sentence-transformers' trainer does."""

    def __init__(self, loss: SentenceLoss | dict[str, SentenceLoss]):
        super().__init__(loss)
        self._sums: dict[str, dict[str, Tensor]] = {"train": {}, "eval": {}}  # split -> term -> sum (detached)
        self._counts = {"train": 0, "eval": 0}

    def forward(self, input_ids: Tensor, attention_mask: Tensor, token_type_ids: Tensor, widths: list[int],
                prompt_length: list[int], task: list[str | None], label: Tensor, index: Tensor,
                dataset_name: str | None = None, has_targets: bool = True) -> LossOutput:
        features = [{"input_ids": input_ids[:, c, :w], "attention_mask": attention_mask[:, c, :w],
                     "token_type_ids": token_type_ids[:, c, :w], "prompt_length": prompt_length[c], "task": task[c],
                     "index": index} for c, w in enumerate(widths)]  # input_ids (B, C, T) -> C x (B, width)
        loss = self.loss_of(dataset_name)
        # the dataset's labels whenever it has a label column, as sentence-transformers passes them: a loss of the
        # user's own (needs_label left False) reads them too; None where it has none
        value = loss(features, label if has_targets else None)
        if isinstance(value, dict):
            split = "train" if self.training else "eval"
            sums = self._sums[split]
            for name, term in value.items():  # kept on the device: no read-back until logged
                sums[name] = sums[name] + term.detach() if name in sums else term.detach()
            self._counts[split] += 1
            value = torch.stack(list(value.values())).sum()
        return LossOutput(value)

    def components(self, split: str) -> dict[str, float]:
        """Each term's mean over the batches since the last call (then reset), under torchrun over every process's
        batches (every rank logs the same records), rounded to 4 decimals as sentence-transformers logs it; {} for a
        loss of one term."""
        parts = all_gather(({name: total.cpu() for name, total in self._sums[split].items()}, self._counts[split]))
        self._sums[split], self._counts[split] = {}, 0
        count = sum(n for _, n in parts)
        names = dict.fromkeys(name for sums, _ in parts for name in sums)  # a rank may have evaluated no batch
        return {name: round((sum(sums[name] for sums, _ in parts if name in sums) / count).item(), 4)
                for name in names} if count else {}

    def clipped_parameters(self) -> Iterator[nn.Parameter]:
        """The parameters whose gradients ``max_grad_norm`` clips, and whose norm is logged: the model's, not a loss's
        own (SoftmaxLoss's classifier), as sentence-transformers clips them (transformers' Trainer clips the model it
        was given, the SentenceTransformer). Clipped with the classifier, a SoftmaxLoss step on RTE pairs whose norm
        passed 1 moved other weights than sentence-transformers' (the next loss 0.6843 against 0.6863)."""
        return self._model().parameters()


def check_batch_holds_negatives(loss: Any, args: Any) -> None:
    """A loss with in-batch negatives needs a global batch of two rows or more. Checked before the trainer joins the
    process group, so torchrun's world size is read from its environment (current() there is one process: 2 x 1 rows
    with gather_across_devices=True were refused as "a batch of 1")."""
    batch = args.per_device_train_batch_size * info_from_env().world_size
    for one in loss.values() if isinstance(loss, dict) else [loss]:
        if one.in_batch_negatives and batch < 2:
            raise BertkitError(f"{type(one).__name__} uses the batch's other rows as negatives, and a batch of {batch} "
                               "holds none: set per_device_train_batch_size to 2 or more (32 or more trains better)")


def check_loss_names(loss: Any, train_dataset: Any, eval_dataset: Any) -> None:
    """A loss per dataset ({name: loss}) needs dicts of datasets, a loss for each of their names and no loss for a
    name neither has (a misspelt name would leave a dataset without its loss); sentence-transformers refuses the
    first two alike."""
    if not isinstance(loss, dict):
        return
    bad = [n for n in loss if not isinstance(n, str) or not n or "." in n]
    if bad:
        raise BertkitError(f"loss: {bad} cannot name a dataset's loss (a name is a non-empty string without '.', as "
                           "torch names modules); rename those datasets")
    named: set[str] = set()
    for what, dataset in (("train_dataset", train_dataset), ("eval_dataset", eval_dataset)):
        if dataset is None:
            continue
        if not isinstance(dataset, Mapping):
            raise BertkitError(f"loss is a dict (a loss per dataset: {sorted(loss)}), so {what} must be a dict of "
                               f"datasets (or a DatasetDict) by those names, got a {type(dataset).__name__}; or give "
                               "one loss")
        missing = [n for n in dataset if n not in loss]
        if missing:
            raise BertkitError(f"{what} has the dataset(s) {missing}, for which the loss dict (keys {sorted(loss)}) "
                               "has no loss: add {name: loss} for each")
        named |= set(dataset)
    unknown = [n for n in loss if n not in named]
    if unknown and (train_dataset is not None or eval_dataset is not None):
        raise BertkitError(f"the loss dict names {unknown}, which is no dataset of train_dataset or eval_dataset "
                           f"(their names: {sorted(named)}): name the datasets' losses by their keys")


def check_same_parameters(loss: Any) -> None:
    """Under torchrun a step's gradients are averaged over the parameters every loss trains: a loss per dataset with
    parameters of its own would leave them without a gradient in the steps of another dataset, which DDP refuses
    (transformers' Trainer runs it with ddp_find_unused_parameters, not implemented here)."""
    if not isinstance(loss, dict) or current().world_size == 1:
        return
    trained = {name: {id(p) for p in one.parameters() if p.requires_grad} for name, one in loss.items()}
    first, params = next(iter(trained.items()))
    other = [name for name, ids in trained.items() if ids != params]
    if other:
        raise BertkitError(f"under torchrun the losses of {other} train other parameters than the loss of {first!r} "
                           "(a loss with parameters of its own): give the datasets losses over the model alone, or "
                           "train them in one process")
