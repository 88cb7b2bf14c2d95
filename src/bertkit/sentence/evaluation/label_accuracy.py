"""LabelAccuracyEvaluator: the accuracy of SoftmaxLoss's classifier on labelled pairs, as sentence-transformers
computes it (same key, same number, same CSV)."""

from __future__ import annotations

import copy
import numbers
from typing import Any

import torch

from bertkit.errors import BertkitError
from bertkit.inference.runner import eval_mode
from bertkit.padding import moved
from bertkit.sentence.evaluation.base import ResultsCsv, prefixed, results_csv_name
from bertkit.sentence.finite import refuse_nonfinite


class LabelAccuracyEvaluator(ResultsCsv):
    """``{name}_accuracy``: the fraction of the ``dataloader``'s pairs (a torch DataLoader over
    ``InputExample(texts=[a, b], label=class)``) whose class is the argmax of ``softmax_model``'s logits (a
    ``losses.SoftmaxLoss`` on the model evaluated). The pairs are tokenized a batch of the loader at a time, each column
    at the model's max_seq_length, as sentence-transformers' collate does. With an ``output_path``:
    ``accuracy_evaluation[_{name}]_results.csv`` (epoch, steps, accuracy)."""

    def __init__(self, dataloader: Any, name: str = "", softmax_model: Any = None, write_csv: bool = True):
        if not all(hasattr(dataloader, a) for a in ("dataset", "batch_sampler", "collate_fn")):
            raise BertkitError(f"LabelAccuracyEvaluator takes a torch DataLoader of InputExample pairs, got "
                               f"{type(dataloader).__name__}: wrap them, DataLoader(examples, batch_size=16)")
        if dataloader.batch_sampler is None:
            raise BertkitError("LabelAccuracyEvaluator: the DataLoader was made with batch_size=None (no batches); give "
                               "it a batch_size")
        if softmax_model is None or not callable(softmax_model) or not hasattr(softmax_model, "classifier"):
            # sentence-transformers fails at the first call with "'NoneType' object is not callable"
            raise BertkitError(f"LabelAccuracyEvaluator: softmax_model is {type(softmax_model).__name__}; give the "
                               "losses.SoftmaxLoss whose classifier it scores (softmax_model=train_loss)")
        self.dataloader, self.name, self.softmax_model, self.write_csv = dataloader, name, softmax_model, write_csv
        self.csv_file = results_csv_name("accuracy_evaluation", name)
        self.primary_metric = "accuracy"

    def __deepcopy__(self, memo: dict) -> LabelAccuracyEvaluator:
        """A copy sharing the loader and the loss (the trainer runs a copy to check metric_for_best_model): a deep one
        copied the model inside the loss, another model than the one evaluated."""
        return copy.copy(self)

    def __call__(self, model: Any, output_path: str | None = None, epoch: int = -1, steps: int = -1) -> dict[str, float]:
        loss = self.softmax_model
        if getattr(loss, "model", model) is not model:
            # sentence-transformers tokenizes with the model given and embeds with the loss's: another model's accuracy
            raise BertkitError("LabelAccuracyEvaluator: softmax_model was built on another model than the one "
                               "evaluated, whose accuracy this would not be; build SoftmaxLoss on this model (its "
                               "classifier's weights: loss.classifier.load_state_dict(...))")
        correct = total = 0
        loader = self.dataloader
        collate, loader.collate_fn = loader.collate_fn, list  # its examples, as sentence-transformers iterates it
        try:
            with eval_mode(model):  # put back as found, also under calls from other threads
                for examples in loader:
                    texts, labels = self._batch(examples, total)
                    features = [{k: moved(v, model.device) if isinstance(v, torch.Tensor) else v
                                 for k, v in model.tokenize(list(column)).items()} for column in zip(*texts)]
                    with torch.no_grad():
                        _, logits = loss(features, labels=None)
                    # argmax takes a NaN for the largest: a NaN row counted as class 0, right or wrong like any other
                    refuse_nonfinite(logits, [tuple(t) for t in texts], f"LabelAccuracyEvaluator (the batch from example "
                                     f"{total})", "output")
                    total += len(logits)
                    correct += int((logits.argmax(dim=1).cpu() == torch.tensor(labels)).sum())
        finally:
            loader.collate_fn = collate
        if total == 0:
            raise BertkitError("LabelAccuracyEvaluator: the DataLoader gave no pairs to evaluate")
        accuracy = correct / total
        self.write_results(output_path, ["epoch", "steps", "accuracy"], [epoch, steps, accuracy])
        self.primary_metric = f"{self.name}_accuracy" if self.name else "accuracy"
        return prefixed({"accuracy": accuracy}, self.name)

    def _batch(self, examples: Any, start: int) -> tuple[list[list[str]], list[int]]:
        """A batch's (text pair, class) per example, refused naming the example where it is not a labelled pair."""
        classes = getattr(self.softmax_model, "num_labels", None)
        texts, labels = [], []
        for i, example in enumerate(examples, start):
            pair, label = getattr(example, "texts", None), getattr(example, "label", None)
            if not (isinstance(pair, (list, tuple)) and len(pair) == 2 and all(isinstance(t, str) for t in pair)):
                raise BertkitError(f"LabelAccuracyEvaluator: example {i} is {str(example)[:80]!r}, not an InputExample "
                                   "with two texts; give InputExample(texts=[premise, hypothesis], label=class)")
            whole = isinstance(label, numbers.Real) and not isinstance(label, bool) and float(label).is_integer()
            if not whole or (classes is not None and not 0 <= label < classes):
                # an unknown class is never the argmax: sentence-transformers counts it wrong without a word
                raise BertkitError(f"LabelAccuracyEvaluator: example {i} has the label {label!r}, not a class of "
                                   f"the classifier ({classes} labels, 0 to {classes - 1 if classes else '?'}); map "
                                   "the labels to those indices")
            texts.append(list(pair))
            labels.append(int(label))
        return texts, labels
