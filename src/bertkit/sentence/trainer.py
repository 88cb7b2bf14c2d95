"""``SentenceTransformerTrainer``: sentence-transformers' trainer on bertkit's ``Trainer`` and its training loop.

    model = SentenceTransformer("models/minilm")
    loss = losses.MultipleNegativesRankingLoss(model)
    args = SentenceTransformerTrainingArguments(output_dir="out", batch_sampler=BatchSamplers.NO_DUPLICATES)
    SentenceTransformerTrainer(model=model, args=args, train_dataset=pairs, loss=loss, evaluator=ir).train()

The loss is what the loop trains (``trainer.model`` stays the model passed in, as in sentence-transformers): a
module whose forward takes one padded (B, C, T) batch of the dataset's C text columns and returns the loss, so
optimisation, schedules, accumulation, bf16, checkpoints (each a sentence-transformers directory) and exact resume
are the loop's. The optimiser's groups are
sentence-transformers': transformers' weight-decay rule over the loss's parameters, and a group at its own rate
for each ``learning_rate_mapping`` pattern, matched against the loss's parameter names (sentence-transformers'
names: ``model.0.…``). Evaluation is ``eval_loss`` on the eval_dataset plus the evaluator's metrics, prefixed
``eval_``.

Several datasets train as in sentence-transformers: ``train_dataset`` a dict (or DatasetDict) of named datasets,
``loss`` one loss for all or a dict {name: loss}; each batch holds one dataset's rows and trains on its loss, the
datasets' batches ordered by ``multi_dataset_batch_sampler`` (``data.multi_dataset_batches``). A dict eval_dataset
gives ``eval_{name}_loss`` per dataset (each on its loss); in training the evaluator runs once, after the first.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn

from bertkit import dir_lock
from bertkit.errors import BertkitError, keyword_only
from bertkit.runs import output_dir
from bertkit.sentence.data import (
    MultiDatasetExamples,
    SentenceCollator,
    SentenceExamples,
    group_by_label_batches,
    group_by_label_count,
    label_groups,
    multi_dataset_batches,
    no_duplicates_batches,
    paired_groups,
)
from bertkit.sentence.evaluation.sequential import SequentialEvaluator
from bertkit.sentence.loss_model import (
    LossModel,
    check_batch_holds_negatives,
    check_loss_names,
    check_same_parameters,
)
from bertkit.sentence.losses import CoSENTLoss, SentenceLoss
from bertkit.sentence.losses.base import loss_settings, module_settings
from bertkit.sentence.model import SentenceTransformer
from bertkit.sentence.prompts import check_prompt_columns
from bertkit.sentence.training_args import (
    TRAINER_POSITIONS,
    BatchSamplers,
    MultiDatasetBatchSamplers,
    SentenceTransformerTrainingArguments,
    for_dataset,
)
from bertkit.training import trainer_data
from bertkit.training.callbacks import EvalPrediction, metric_key
from bertkit.training.checkpoint import OptimizerLayout, optimizer_layout
from bertkit.training.distributed import all_gather, current
from bertkit.training.optim import parameter_groups
from bertkit.training.seeding import seed_generators
from bertkit.training.trainer import NOT_CALLED, Trainer, logger
from bertkit.training.trainer_eval import EvalOptions

_REFUSED = {
    "model_init": "hyper-parameter search is not implemented; pass model=",
    "compute_metrics": "give an evaluator (bertkit.sentence.evaluation) instead",
    "data_collator": "bertkit.sentence tokenizes and pads the text columns itself; drop this argument",
    "processing_class": "the model's own tokenizer is used; drop this argument",
    "optimizers": "bertkit's loop builds AdamW from the arguments (learning_rate, weight_decay, adam_*)",
    "optimizer_cls_and_kwargs": "bertkit's loop builds AdamW from the arguments (learning_rate, weight_decay, adam_*)",
    "preprocess_logits_for_metrics": "give an evaluator (bertkit.sentence.evaluation) instead",
}


def _groups(examples: Any, batch_size: int) -> dict[int, list[int]]:
    """The rows the label-grouped sampler batches, by label (checked when the trainer was made)."""
    return paired_groups(label_groups(examples.label_column(), examples.label, "the dataset"), batch_size,
                         "the dataset")


class SentenceTransformerTrainer(Trainer):
    """Train a ``SentenceTransformer`` with a bertkit.sentence loss on a dataset whose columns are the loss's
    inputs in order; see the module docstring. Without ``loss``, CoSENTLoss (sentence-transformers' default)."""

    _reads_sampling_strategy = False  # as sentence-transformers': its batch_sampler alone orders the rows

    model_class: ClassVar[type[nn.Module]] = SentenceTransformer
    # sentence-transformers' compute_loss calls the loss on the features: an override written for it gets (model, batch)
    _not_called = (*NOT_CALLED, "compute_loss")
    _custom_loss = "a custom loss is a loss module, given as loss="
    training_args_class: ClassVar[type[SentenceTransformerTrainingArguments]] = SentenceTransformerTrainingArguments
    examples_class: ClassVar[type] = SentenceExamples  # what ``_examples_of`` makes of a dataset
    loss_class: ClassVar[type[nn.Module]] = SentenceLoss  # what ``_loss`` takes
    _evaluations_write_csv = True  # off for the check of metric_for_best_model (``_check_metric``)

    # callbacks by keyword only: sentence-transformers' seventh argument is data_collator (refused by name here)
    @keyword_only(TRAINER_POSITIONS, "sentence-transformers")
    def __init__(self, model: SentenceTransformer | None = None, args: SentenceTransformerTrainingArguments | None = None,
                 train_dataset: Any = None, eval_dataset: Any = None,
                 loss: SentenceLoss | Callable[[SentenceTransformer], SentenceLoss] | None = None,
                 evaluator: Any = None, *, callbacks: Sequence[Any] | None = None, **unknown: Any):
        args = self._checked_arguments(model, args, unknown)
        check_loss_names(loss, train_dataset, eval_dataset)
        if args.bf16_full_eval or args.fp16_full_eval:  # the evaluator would score another model than the loss's
            raise BertkitError(f"{type(self).__name__}: bf16_full_eval / fp16_full_eval are not implemented for the "
                               "sentence trainers (sentence-transformers casts the model itself, and the evaluator "
                               "then runs it cast); use bf16=True, or model.to(torch.bfloat16) before evaluate()")
        # seeded before a loss is built from a factory (or by default): sentence-transformers seeds in
        # transformers' Trainer.__init__ and builds the loss after it, so a SoftmaxLoss factory's classifier is drawn
        # from the seed, not from the script's generator state (``_seed`` does not seed again)
        seed_generators(args.seed)
        loss = ({name: self._loss(model, one) for name, one in loss.items()} if isinstance(loss, dict)
                else self._loss(model, loss))
        check_batch_holds_negatives(loss, args)
        check_same_parameters(loss)
        # a list of evaluators is one SequentialEvaluator, as sentence-transformers' trainer makes it
        # (``eval_sequential_score`` beside each one's metrics)
        if evaluator is not None and not callable(evaluator):
            evaluator = SequentialEvaluator(evaluator)
        self.model, self.loss, self.evaluator = model, loss, evaluator
        pooler = getattr(getattr(model, "bert", None), "pooler", None)
        if pooler is not None:  # dense + tanh over [CLS]: no part of a sentence embedding, so it gets no
            pooler.requires_grad_(False)  # gradient, which DDP (torchrun) refuses; AdamW leaves it as is
        self._check_router_mapping(model, args.router_mapping)
        train, dev = (self._examples_of(data, args, name) if data is not None else None
                      for data, name in ((train_dataset, "train_dataset"), (eval_dataset, "eval_dataset")))
        check_prompt_columns(args.prompts, [part for data in (train, dev) if data is not None
                                            for part in (data.values() if isinstance(data, dict) else [data])])
        if isinstance(train, dict):  # the datasets end to end, batched by multi_dataset_batch_sampler
            train = MultiDatasetExamples(train)
        super().__init__(model=model, args=args, data_collator=self._collator(model), train_dataset=train,
                         eval_dataset=dev, callbacks=callbacks,
                         compute_metrics=self._evaluator_metrics if evaluator is not None else None)
        self._parameter_groups()  # each learning_rate_mapping pattern matches a parameter, before any work

    def _seed(self) -> None:
        """Seeded already, before the loss was built (``__init__``)."""

    def _checked_arguments(self, model: Any, args: Any, unknown: dict[str, Any]) -> Any:
        """``args`` (the class's defaults when None), once the model, the arguments and any other keyword are what
        the trainer takes: transformers' Trainer arguments it does not implement are refused by name, with the fix."""
        trainer, args_cls = type(self).__name__, self.training_args_class
        for name, value in unknown.items():
            if name in _REFUSED:
                if value is None or (name == "optimizers" and value == (None, None)):
                    continue
                raise BertkitError(f"{trainer}({name}=...) is not implemented in bertkit: {_REFUSED[name]}")
            raise BertkitError(f"{trainer} got an unknown argument {name!r}")
        if not isinstance(model, self.model_class):
            raise BertkitError(f"model must be a bertkit.sentence.{self.model_class.__name__}, got "
                               f"{type(model).__name__}")
        args = args if args is not None else args_cls()
        if not isinstance(args, args_cls):
            raise BertkitError(f"args must be {args_cls.__module__.rsplit('.', 1)[0]}.{args_cls.__name__}, got "
                               f"{type(args).__name__}")
        if args.save_only_model:  # its checkpoints hold the loss too, which a model-only save leaves out
            raise BertkitError(f"{trainer}: save_only_model=True is not implemented for the sentence trainers; train "
                               "with save_only_model=False and save the model alone with trainer.save_model(DIR)")
        if args.include_num_input_tokens_seen != "no":  # its columns' features are no batch input_ids there
            raise BertkitError(f"{trainer}: include_num_input_tokens_seen={args.include_num_input_tokens_seen!r} is not "
                               "implemented for the sentence trainers (sentence-transformers' trainers count no token: "
                               "their batches name each column's input_ids apart, so it logs 0); leave it at 'no'")
        return args

    def _collator(self, model: SentenceTransformer) -> Callable[[list[dict[str, Any]]], dict[str, Any]]:
        return SentenceCollator(model.tokenizer.pad_token_id)

    def _trained_module(self, model: SentenceTransformer) -> LossModel:
        """The loop trains the loss (which holds the model): ``self.model`` stays the model passed in."""
        return LossModel(self.loss)

    def _check_router_mapping(self, model: SentenceTransformer, mapping: dict[str, str]) -> None:
        """A SentenceTransformer has no Router: no route to map a column to. sentence-transformers takes the mapping
        and trains as without it (its Transformer reads a column's task only for a query_length, document_length,
        query_expansion or chat template, which bertkit refuses), so a mapping here is a mistake, refused by name."""
        if mapping:
            raise BertkitError(f"router_mapping={mapping!r} maps columns to a Router's routes, and a bertkit "
                               f"{type(model).__name__} has no Router: drop router_mapping (sentence-transformers "
                               "ignores it on a model without a Router)")

    def _examples_of(self, dataset: Any, args: SentenceTransformerTrainingArguments,
                     what: str) -> SentenceExamples | dict[str, SentenceExamples]:
        """``dataset`` as examples of its loss; a dict of datasets as a dict of them, each of its loss."""
        if not isinstance(dataset, Mapping):
            return self._grouped_checked(self._dataset_examples(dataset, args, what, None), args, what)
        if not dataset:
            raise BertkitError(f"{what} is an empty dict; give at least one {{name: dataset}}")
        bad = [n for n in dataset if not isinstance(n, str) or not n]
        if bad:
            raise BertkitError(f"{what}: {bad} cannot name a dataset; name each by a non-empty string")
        return {name: self._grouped_checked(self._dataset_examples(part, args, f"{what}[{name!r}]", name), args,
                                            f"{what}[{name!r}]") for name, part in dataset.items()}

    @staticmethod
    def _grouped_checked(examples: Any, args: SentenceTransformerTrainingArguments, what: str) -> Any:
        """``examples``, once the label-grouped sampler can batch them (a label column of ints, two labels of two rows
        or more, an even batch of 4 or more: ``paired_groups``), before anything is written."""
        if args.batch_sampler is BatchSamplers.GROUP_BY_LABEL:
            size = args.per_device_train_batch_size if what.startswith("train") else args.per_device_eval_batch_size
            paired_groups(label_groups(examples.label_column(), examples.label, what), size, what)
        return examples

    def _dataset_examples(self, dataset: Any, args: SentenceTransformerTrainingArguments, what: str,
                          name: str | None) -> SentenceExamples:
        return SentenceExamples(dataset, self.model, self._loss_of(name, what),
                                for_dataset(args.prompts, "prompts", name, what),
                                for_dataset(args.router_mapping, "router_mapping", name, what), what, name)

    def _loss_of(self, name: str | None, what: str) -> Any:
        """The loss of the dataset ``name`` (None: a dataset of its own)."""
        if not isinstance(self.loss, dict):
            return self.loss
        if name not in self.loss:
            raise BertkitError(f"{what}: the loss dict (keys {sorted(self.loss)}) has no loss for "
                               + (f"the dataset {name!r}" if name is not None else "a dataset without a name")
                               + ": give a dict of datasets named as the losses")
        return self.loss[name]

    def _parameter_groups(self) -> list[dict]:
        """sentence-transformers' groups: over the loss's parameters (a loss per dataset: under the datasets' names),
        under its names (``learning_rate_mapping``)."""
        return parameter_groups(self._module.loss, self.args.weight_decay, self.args.learning_rate_mapping)

    def _transformers_files(self) -> OptimizerLayout:
        """optimizer.pt and scheduler.pt in sentence-transformers' groups, which hold the pooler bertkit freezes (it
        gets no gradient): so their trainers continue a checkpoint as their own run (``checkpoint.OptimizerLayout``)."""
        pooler = getattr(getattr(self.model, "bert", None), "pooler", None)
        model = set(self.model.parameters())
        layout = optimizer_layout(self._module.loss, self.args.weight_decay, self.args.learning_rate_mapping,
                                  set(pooler.parameters()) if pooler is not None else set(), model)
        if layout.withheld and self.args.save_strategy != "no":  # said as the run starts, not found at a resume
            own = [n for n, p in self._module.loss.named_parameters() if p not in model]
            logger.warning("the loss has weights of its own (%s), which this run's checkpoints hold in state.pt: "
                           "resume_from_checkpoint here continues them exactly; sentence-transformers' trainers keep "
                           "the model alone (a resume of theirs draws such weights anew) and refuse these "
                           "checkpoints' optimizer.pt (\"loaded state dict contains a parameter group that doesn't "
                           "match the size of optimizer's group\"); SentenceTransformer(checkpoint) loads the model",
                           ", ".join(own))
        return layout

    def _fingerprint(self, examples: Sequence, total: int, world_size: int) -> dict[str, Any]:
        """The base Trainer's, with the learning rates per pattern (a checkpoint's optimiser state holds the rates it
        was saved with: resuming with others would keep those) and the samplers that draw the batches (for several
        datasets, both; for one, batch_sampler unless it is the default, which checkpoints written before it was
        recorded were trained with): a run resumed under another sampler went on with other batches without a word;
        and the model's modules, whose settings (pooling, Normalize) a checkpoint does not hold beside their weights."""
        mapping, args = self.args.learning_rate_mapping, self.args
        samplers = {"batch_sampler": args.batch_sampler.value}
        if isinstance(self.train_dataset, MultiDatasetExamples):
            samplers["multi_dataset_batch_sampler"] = args.multi_dataset_batch_sampler.value
        elif args.batch_sampler is BatchSamplers.BATCH_SAMPLER:
            samplers = {}
        losses = self.loss if isinstance(self.loss, dict) else {None: self.loss}
        loss = {name: loss_settings(value) for name, value in losses.items()}
        modules = {str(i): {type(m).__qualname__: module_settings(m)} for i, m in enumerate(self.model)}
        return {**super()._fingerprint(examples, total, world_size), "loss": loss.get(None, loss), "modules": modules,
                **({"learning_rate_mapping": mapping} if mapping else {}), **({"samplers": samplers} if samplers else {})}

    def _data_fingerprint(self, examples: Sequence) -> dict[str, Any]:
        """What the training examples are made from (``SentenceExamples.fingerprint``): no row is tokenized for it."""
        return self.train_dataset.fingerprint()

    def get_default_loss(self, model: SentenceTransformer) -> SentenceLoss:
        return CoSENTLoss(model)

    def _loss(self, model: SentenceTransformer, loss: Any) -> SentenceLoss:
        if loss is None:
            loss = self.get_default_loss(model)
        elif not isinstance(loss, nn.Module) and callable(loss):
            loss = loss(model)
        if not isinstance(loss, self.loss_class):
            self._refuse_loss(loss, f"{type(loss).__module__}.{type(loss).__name__}")
        if loss.model is not model:
            raise BertkitError("the loss was built with another model than the trainer's; build it with "
                               "losses.X(model) of the model passed to the trainer")
        return loss

    @staticmethod
    def _refuse_loss(loss: Any, kind: str) -> None:
        """Refuse ``loss``, of class ``kind``, which is no loss of this trainer's kind, with the fix."""
        if isinstance(loss, nn.Module) and not kind.startswith("sentence_transformers."):
            # a loss of the user's own (sentence-transformers' docs build GlobalOrthogonalRegularizationLoss's
            # pairing with MultipleNegativesRankingLoss so): the import is not what to change
            raise BertkitError(f"loss {kind} is no bertkit.sentence loss: derive it from "
                               "bertkit.sentence.losses.SentenceLoss (class "
                               f"{type(loss).__name__}(SentenceLoss), its __init__ calling "
                               "super().__init__(model)); its forward(sentence_features, labels) stays as it is")
        raise BertkitError(f"loss must be a bertkit.sentence.losses loss, got {kind}; change the import to "
                           "`from bertkit.sentence import losses`")

    def _collate(self, examples: list) -> dict:
        return self.data_collator(examples)  # its host-side ints (column widths, prompt lengths) too

    # -- the base Trainer's batches, sentence-transformers' no-duplicates or label-grouped sampler's, or its
    # multi-dataset ones. N processes x B rows train as one process x N*B (docs/sentence.md): a short last batch is
    # split over the processes, a process without rows of it running a stand-in at weight 0, not filled up.
    fills_short_last_batch = False

    def _batches(self, examples: Sequence) -> Callable[[int], list[list[int]]]:
        size, seed = self.args.per_device_train_batch_size * current().world_size, self.args.seed
        sampler = self.args.batch_sampler
        if isinstance(self.train_dataset, MultiDatasetExamples):
            parts = list(self.train_dataset.parts.values())
            round_robin = self.args.multi_dataset_batch_sampler is MultiDatasetBatchSamplers.ROUND_ROBIN
            drop_last = self.args.dataloader_drop_last
            return functools.lru_cache(maxsize=2)(
                lambda epoch: multi_dataset_batches(parts, size, seed + epoch, round_robin, sampler.value, drop_last))
        examples = self.train_dataset  # the SentenceExamples (the base Trainer passes a column-dropping view)
        if sampler is BatchSamplers.GROUP_BY_LABEL:
            groups, drop_last = _groups(examples, size), self.args.dataloader_drop_last
            return functools.lru_cache(maxsize=2)(
                lambda epoch: list(group_by_label_batches(groups, size, torch.Generator(), seed + epoch, drop_last)))
        if sampler is BatchSamplers.NO_DUPLICATES:
            return functools.lru_cache(maxsize=2)(lambda epoch: no_duplicates_batches(examples, size, seed + epoch))
        return super()._batches(examples)

    def _batches_per_epoch(self, examples: Sequence) -> int | None:
        """The label-grouped sampler's count (``group_by_label_count``); several datasets: each one's batches
        (ceil(rows / global batch), floor under dataloader_drop_last, or that count) (PROPORTIONAL), or the fewest of
        them for each dataset (ROUND_ROBIN), as sentence-transformers' samplers count them."""
        if self.args.dataloader_drop_last and self.eval_dataset is not None:
            self._eval_batches([])  # refused before anything is written
        size = self.args.per_device_train_batch_size * current().world_size
        grouped = self.args.batch_sampler is BatchSamplers.GROUP_BY_LABEL
        if not isinstance(self.train_dataset, MultiDatasetExamples):
            if grouped:
                return group_by_label_count(_groups(self.train_dataset, size), size, self.args.dataloader_drop_last)
            return super()._batches_per_epoch(examples)
        drop_last = self.args.dataloader_drop_last  # each dataset's sampler leaves out its own short batch
        counts = [group_by_label_count(_groups(part, size), size, drop_last) if grouped
                  else len(part) // size if drop_last else -(-len(part) // size)
                  for part in self.train_dataset.parts.values()]
        if self.args.multi_dataset_batch_sampler is MultiDatasetBatchSamplers.ROUND_ROBIN:
            return min(counts) * len(counts)
        return sum(counts)

    def _eval_batches(self, dataset: Sequence) -> list[list[int]]:
        """sentence-transformers' evaluation batches: drawn as its training batches are, by the same sampler with a
        generator seeded with ``seed`` at each evaluation (an in-batch-negatives loss depends on them); under
        torchrun every world_size-th batch, as accelerate deals them out. The default sampler's shuffle is
        accelerate's seedable one there, seeded with ``data_seed`` where it is set, as the training order is (with
        ``seed`` 1 and ``data_seed`` 3, MNRL's eval_loss on 12 SQuAD pairs was 0.7073 here against its 0.4219)."""
        size, seed, info = self.args.per_device_eval_batch_size, self.args.seed, current()
        if self.args.dataloader_drop_last:  # sentence-transformers' eval_loss there is not the kept batches' mean
            raise BertkitError("dataloader_drop_last=True in an evaluation of sentence-transformers' trainers is not "
                               "implemented: train with it and no eval_dataset, or set dataloader_drop_last=False")
        if self.args.batch_sampler is BatchSamplers.NO_DUPLICATES:
            batches = no_duplicates_batches(dataset, size, seed)
        elif self.args.batch_sampler is BatchSamplers.GROUP_BY_LABEL:  # rows it leaves out are not evaluated
            batches = list(group_by_label_batches(_groups(dataset, size), size, torch.Generator(), seed))
        else:
            shuffle = torch.Generator().manual_seed(seed if self.args.data_seed is None else self.args.data_seed)
            rows = torch.randperm(len(dataset), generator=shuffle).tolist()
            batches = [rows[i:i + size] for i in range(0, len(rows), size)]
        return batches[info.rank::info.world_size]

    def _loss_weights(self, batches: list[list[int]], rows: int) -> list[int] | None:
        """sentence-transformers' eval_loss, transformers' evaluation loop's: each batch's loss counted
        per_device_eval_batch_size times, the last batch's as many times as the rows left over (rows % size, or size).
        That is each batch's rows, but where the no-duplicates sampler leaves a batch short before the last (batches
        of 7, 6, 3 rows weigh 8, 8, 8: 0.584 where the rows give 0.642). Under torchrun the same weights, in the
        order the parts are gathered (each process's batches, rank by rank), the batches having been dealt out in turn
        (``_eval_batches``): each batch weighed by its rows there gave 0.0201 for one process's 0.0115 on six SQuAD pairs."""
        size, info = self.args.per_device_eval_batch_size, current()
        counts = all_gather(len(batches))  # every process evaluates (its parts are gathered): a collective is safe
        last = sum(counts) - 1  # the last batch, in the order one process evaluates them
        if last < 0:
            return None
        return [rows % size or size if rank + i * info.world_size == last else size
                for rank, count in enumerate(counts) for i in range(count)]

    # the metric prefix of the last evaluation pass ("eval", "eval_{name}" for a dict's dataset, evaluate()'s own),
    # under which that pass's loss terms are logged, as sentence-transformers 6.3 logs them
    _eval_prefix = "eval"

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """The record, with the loss's terms' means beside "loss" / "{prefix}_loss" for a loss that names them."""
        split = "train" if "loss" in logs else "eval" if f"{self._eval_prefix}_loss" in logs else None
        if split is not None:  # a copy, as sentence-transformers logs these: the epoch goes into it, not the caller's
            prefix = f"{self._eval_prefix}_" if split == "eval" else ""
            logs = {**logs, **self._loss_terms(split, prefix)}
        super().log(logs, start_time)

    def _loss_terms(self, split: str, prefix: str) -> dict[str, float]:
        """The loss's terms' means since they were last read (then reset), prefixed; {} for a loss of one term."""
        components = self._module.components(split) if isinstance(self._module, LossModel) else {}
        return {prefix + k: v for k, v in components.items()}

    def _prediction_output(self, dataset: Any, what: str, prefix: str, module: nn.Module | None = None,
                           check: bool = True, ignore_keys: list[str] | None = None) -> Any:
        self._eval_prefix = prefix
        return super()._prediction_output(dataset, what, prefix, module, check, ignore_keys)

    # -- evaluation ---------------------------------------------------------------------------------------------
    def _evaluator_metrics(self, _: EvalPrediction) -> dict[str, float]:
        """The evaluator's metrics, called as sentence-transformers' trainer calls it: with the epoch, the step and
        (on rank 0) ``output_dir/eval``, where it writes its results CSV. Outside training (``evaluate()`` before
        ``train()``) output_dir is claimed for the write as training claims it, so the CSV is recorded as the run's
        and a later ``train()`` into the same output_dir goes on (it refused a file it did not know)."""
        output_path, out = None, Path(self.args.output_dir)
        if current().is_main and self._evaluations_write_csv:
            output_path = os.path.join(out, "eval")
        claimed = output_path is not None and not dir_lock.holds(out)
        with output_dir(out, "Trainer", in_place=True) if claimed else contextlib.nullcontext():
            if output_path is not None:
                os.makedirs(output_path, exist_ok=True)
            metrics = self.evaluator(self.model, output_path=output_path, epoch=self.state.epoch,
                                     steps=self.state.global_step)
        # an evaluator of sentence-transformers 2 returns its primary score alone: their trainer logs it as
        # "evaluator" (eval_evaluator), where dict(0.25) stopped the evaluation with "'float' object is not iterable"
        metrics = dict(metrics) if isinstance(metrics, Mapping) else {"evaluator": metrics}
        # under torchrun every rank takes rank 0's metrics, as sentence-transformers broadcasts its rank 0's: each rank
        # chooses its best checkpoint and its early stop from them, and an evaluator that samples (ranks are seeded
        # seed + rank) would otherwise lead the ranks to other choices
        return all_gather(metrics)[0]

    def _prediction_parts(self, examples: Sequence, module: nn.Module | None, events: bool,
                          batches: list[list[int]], **options: Any) -> list:
        """The base Trainer's, each pass's loss terms counted from zero: the terms logged beside eval_loss are those
        of the evaluation that computed it (the batch that checks metric_for_best_model, or a predict(), added
        theirs to the next evaluation's: eval_base_loss 356.7 beside an eval_loss of 224.4)."""
        if isinstance(self._module, LossModel):
            self._module.components("eval")
        return super()._prediction_parts(examples, module, events, batches, **options)

    def _eval_options(self) -> EvalOptions:
        """transformers' defaults: sentence-transformers' evaluation loop is the loss and the evaluator (it runs
        transformers' with prediction_loss_only=True), so prediction_loss_only, eval_do_concat_batches,
        include_for_metrics and batch_eval_metrics change nothing there, nor here."""
        return EvalOptions()

    def _check_metric(self) -> None:
        """The base Trainer's check that metric_for_best_model is computed, which runs the evaluator once before
        training: a copy of it (the user's sees the evaluations alone, as in sentence-transformers, and keeps no state
        from this run: the retrieval evaluator's primary metric is its first call's), writing no row to
        output_dir/eval (sentence-transformers' CSV holds the evaluations alone, and output_dir is not the run's yet)."""
        evaluator, self.evaluator = self.evaluator, copy.deepcopy(self.evaluator)
        self._evaluations_write_csv = False
        try:
            if isinstance(self.eval_dataset, Mapping | None) and self.compute_metrics is not None:
                self._check_metric_of_datasets()
            else:
                super()._check_metric()
        finally:
            self.evaluator, self._evaluations_write_csv = evaluator, True

    def _check_metric_of_datasets(self) -> None:
        """metric_for_best_model among the metrics of an evaluation of a dict of datasets (or none) with an evaluator:
        each dataset's, and the evaluator's once, as ``eval_{metric}`` (``_evaluate_in_loop``), not per dataset."""
        name = self.args.metric_for_best_model
        if name is None:
            return
        keys = [f"eval_{dataset}_{k}" for dataset in self.eval_dataset or {}
                for k in ("loss", "runtime", "samples_per_second", "steps_per_second")]
        keys += [metric_key(k) for k in self._evaluator_metrics(None)]
        if metric_key(name) not in keys:
            raise BertkitError(f"metric_for_best_model {name!r} is not a metric this run computes: evaluation "
                               f"returns {keys}; name one of them (without or with the eval_ prefix)")

    _evaluates_with = ("an eval_dataset or an evaluator", "eval_dataset=..., or evaluator=...")

    def _evaluates(self) -> bool:
        """An eval_dataset, or an evaluator alone (sentence-transformers' trainer evaluates with either)."""
        return self.eval_dataset is not None or self.compute_metrics is not None

    def _evaluate_in_loop(self, module: nn.Module) -> dict[str, float]:
        """The base Trainer's; with an evaluator alone, its metrics prefixed ``eval_``; for a dict of evaluation
        datasets, as sentence-transformers' trainer evaluates them in training: each dataset's ``eval_{name}_loss``,
        and the evaluator once, after the first dataset, its metrics prefixed ``eval_`` alone (``evaluate()`` outside
        training runs it for each dataset, ``eval_{name}_``)."""
        if self.eval_dataset is None:
            trainer_data.loader_draw()  # sentence-transformers' loop starts a loader over no rows all the same
            return {metric_key(k): v for k, v in self._evaluator_metrics(None).items()}
        if not isinstance(self.eval_dataset, Mapping) or self.compute_metrics is None:
            return super()._evaluate_in_loop(module)
        compute_metrics, self.compute_metrics = self.compute_metrics, None
        try:
            # each dataset's loss terms under its own prefix, as sentence-transformers 6.3 logs them
            parts = [{**self._prediction_output(dataset, what, prefix, module, check=False).metrics,
                      **self._loss_terms("eval", f"{prefix}_")}
                     for prefix, what, dataset in self._eval_sets(self.eval_dataset, "eval")]
        finally:
            self.compute_metrics = compute_metrics
        evaluated = {metric_key(k): v for k, v in self._evaluator_metrics(None).items()}
        return {**parts[0], **evaluated, **{k: v for part in parts[1:] for k, v in part.items()}}

    def evaluate(self, eval_dataset: Any = None, ignore_keys: list[str] | None = None,
                 metric_key_prefix: str = "eval") -> dict[str, float]:
        """eval_loss on the eval dataset and the evaluator's metrics, prefixed ``eval_``; with no eval dataset, the
        evaluator's metrics alone; ``eval_dataset`` a name: that dataset of a dict eval_dataset."""
        eval_dataset = self._named_eval_set(eval_dataset)
        if eval_dataset is not None and not isinstance(eval_dataset, self.examples_class):  # (a dict's, made already)
            eval_dataset = self._examples_of(eval_dataset, self.args, "eval_dataset")
        if eval_dataset is None and self.eval_dataset is None:
            if self.evaluator is None:
                raise BertkitError("evaluate() needs an eval_dataset or an evaluator")
            trainer_data.loader_draw()  # as in training (_evaluate_in_loop)
            # a key under the prefix already (an evaluator named "eval") keeps it, as in the loop's evaluations:
            # sentence-transformers prefixes only the others (eval_eval_cosine_accuracy was logged here)
            metrics = {metric_key(k, metric_key_prefix): v for k, v in self._evaluator_metrics(None).items()}
            self.log(metrics)
            return metrics
        return super().evaluate(eval_dataset, ignore_keys, metric_key_prefix)

    def save_model(self, output_dir: str | Path | None = None, _internal_call: bool = False) -> None:
        """The model in sentence-transformers' layout (rank 0 under torchrun)."""
        if current().is_main:
            self.model.save(output_dir if output_dir is not None else self.args.output_dir)
