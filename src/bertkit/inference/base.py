"""What every pipeline shares: loading, checking inputs, running their rows through the one evaluation loop
(``runner``: batched by length, input order restored), turning each input's rows back into one result.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import re
import types
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor, nn

from bertkit.config import refuse_other_network
from bertkit.errors import BertkitError, MissingFileError, NonFiniteError, is_whole, nonfinite_cause
from bertkit.hub import declared_max_seq_length, download_hint, not_a_directory
from bertkit.inference.options import Option, checked_flag, refusal
from bertkit.inference.prepare import (
    ModelState,
    check_request,
    has_own_hooks,
    int8_model_request,
    prepare_model,
)
from bertkit.inference.runner import distinct, readable, run_length_sorted
from bertkit.padding import pad_batch
from bertkit.quantization import is_int8_checkpoint, load_for_inference, read_calibration_file, require_head
from bertkit.tokenization import BertTokenizer

logger = logging.getLogger(__name__)

# Rows at or above which a progress bar is drawn when ``progress`` is None (auto): a few seconds of work.
_PROGRESS_ROWS = 512
# transformers' pipelines take their tokenizer's length options and the batch size per call too; a pipeline here
# keeps the ones it was made with, so a call's is refused naming where it goes
_MADE_WITH = {**dict.fromkeys(
    ("truncation", "max_length", "max_seq_len", "tokenizer_kwargs", "tokenize_kwargs"),
    "sequences hold at most the pipeline's max_length tokens (a text is cut there), given when it is made: "
    "bertkit.pipeline(task, model, max_length=N)"),
    "batch_size": "the pipeline's batch_size, given when it is made: bertkit.pipeline(task, model, batch_size=N)",
    # transformers loads the weights in that dtype; bertkit's reduced precision is bf16 autocast over the weights
    **dict.fromkeys(("dtype", "torch_dtype"), "bf16=True computes in bfloat16 (autocast over the checkpoint's weights)")}
# A printable ASCII character other than a space: BERT's tokenizer keeps every one (a word piece or punctuation).
_KEPT = re.compile(r"[!-~]")
_NOTHING = object()  # what an exhausted generator gives in place of a first input


def refuse_empty_text(tokenizer: Any, text: str, where: str, fix: str = "send text, or leave it out") -> None:
    """The one rule for an empty text, wherever bertkit applies a model to text: the pipelines (every task, every
    text of an input), so ``predict`` (whose files are checked by line as they are read) and every ``serve`` route.
    A text is empty when the tokenizer keeps no token of it: "", whitespace, or only characters it drops (control
    and zero-width characters, accents alone where it strips accents). Its result would be that of [CLS] [SEP]
    alone, the same for every empty text, so it is refused naming ``where``. A character the vocabulary lacks is
    not empty: it is [UNK], a token the model reads (a text of emoji is [CLS] [UNK] [SEP]). bertkit.sentence's model
    classes (SentenceTransformer, CrossEncoder, SparseEncoder) take such a text, as sentence-transformers' do."""
    if _KEPT.search(text) is None and not tokenizer(text, add_special_tokens=False)["input_ids"]:
        raise BertkitError(f"{where} is empty: {text[:40]!r} holds no token (it is blank, or only control or "
                           "zero-width characters), so the model would read [CLS] and [SEP] alone in its place, the "
                           f"same for every empty text; {fix}")


def int8_options(settings: Any) -> dict[str, Any]:
    """The pipeline keywords of a command's ``--int8`` and ``--calibration-file`` (``Int8Settings``)."""
    if not settings.int8:
        return {}
    texts = read_calibration_file(settings.calibration_file) if settings.calibration_file is not None else None
    return {"quantize": "int8", "calibration_texts": texts}


def _row_length(row: dict[str, Any]) -> int:
    ids = row["input_ids"]
    return max(len(s) for s in ids) if ids and isinstance(ids[0], list) else len(ids)


class Pipeline:
    """Base class: subclasses say which head they need and how inputs become rows and rows results.

    Subclasses implement ``encode(input, **options) -> list[row]`` (a row is a dict with ``input_ids`` and
    ``token_type_ids`` lists, plus anything ``decode`` needs), ``forward(batch) -> list[np.ndarray]`` (one
    float32 array per row of the batch, from the model's outputs) and ``decode(input, rows, outputs,
    **options) -> result``.
    """

    task: ClassVar[str] = ""
    model_class: ClassVar[type[nn.Module]]
    # Published weight names the checkpoint must hold for this task (its head); none for the bare encoder.
    required_keys: ClassVar[tuple[str, ...]] = ()
    # The fields of a dict input, each a str or (list) a non-empty list of str; none: an input is one str.
    fields: ClassVar[dict[str, type]] = {}
    optional: ClassVar[tuple[str, ...]] = ()  # fields that may be absent (or None)
    # Keyword options a call accepts (``pipe(texts, top_k=3)``), each with its rule; encode and decode take what they
    # use.
    call_options: ClassVar[tuple[Option, ...]] = ()
    # transformers' options of this task that bertkit does not take, with what gives their answer here: named when
    # one is refused, so that ported code finds the field instead of a list of what is taken.
    instead_of: ClassVar[dict[str, str]] = {}
    missing_head_fix: ClassVar[str] = ("fine-tune it for this task first (bertkit finetune ...), or embed with the "
                                       "feature-extraction pipeline, which needs only the encoder")

    @property
    def input_kinds(self) -> tuple[type, ...]:
        """What one input is: a dict of ``fields``, or a str."""
        return (dict,) if self.fields else (str,)

    def __init__(self, model: nn.Module, tokenizer: BertTokenizer, *, device: str | torch.device = "cpu",
                 bf16: bool | None = None, batch_size: int = 32, max_length: int | None = None,
                 progress: bool | None = None, quantize: str | None = None,
                 calibration_texts: Sequence[str | tuple[str, str]] | None = None, prepare_in_place: bool = False):
        if not is_whole(batch_size):
            raise BertkitError(f"batch_size must be a positive int, got {batch_size!r}")
        progress = checked_flag("progress", progress, "None: a bar for long inputs only")
        if max_length is None:
            max_length = min(tokenizer.model_max_length, model.config.max_position_embeddings)
        model.config.check_sequence_length(max_length, "max_length")
        # a max_length over the tokenizer's model_max_length cuts there, as transformers' pipelines cut at a
        # max_length given and sentence-transformers at a max_seq_length set: every encode passes it to the tokenizer
        if max_length < 8:
            raise BertkitError(f"max_length must be at least 8 (a pipeline's shortest sequence), got {max_length} "
                               "(max_length=, else a sentence-transformers directory's max_seq_length or the "
                               "tokenizer's model_max_length): pass max_length=8 or more")
        # int8 already (load_int8, or quantize_int8 by the caller) runs as such; quantize="int8" makes a quantized
        # copy, calibrated on the given texts or the built-in sentences
        # a model passed in is left as it is (the pipeline runs a copy prepared for inference); with
        # prepare_in_place (from_pretrained's, whose model nothing else holds) it is the one prepared
        in_place = bool(checked_flag("prepare_in_place", prepare_in_place, "off"))
        self._prepare = functools.partial(prepare_model, device=device, bf16=bf16, quantize=quantize,
                                          calibration_texts=calibration_texts, tokenizer=tokenizer,
                                          max_length=max_length)
        self.model, self.precision = self._prepared(model, in_place)
        # a model the caller keeps is watched: changed after this (weights, layers, head, hooks, dtype), it is
        # prepared again at the next call, so the pipeline answers with the model as it is, as transformers' does
        self._made_from = None if in_place else ModelState(model)
        self.device = self.precision.device
        self.quantize = self.precision.quantize
        self.tokenizer = tokenizer
        self.config = model.config
        self.bf16 = self.precision.bf16  # as asked; unset is off (prepare_model)
        self.batch_size = batch_size
        self.max_length = max_length
        self.progress = progress

    # -- construction ---------------------------------------------------------------------------------
    @classmethod
    def from_pretrained(cls, model_dir: str | Path, **kwargs: Any) -> Pipeline:
        """Load the tokenizer and the task's head model from a Hugging Face-layout checkpoint directory."""
        directory = Path(model_dir)
        quantize = kwargs.get("quantize")
        if is_int8_checkpoint(directory):  # written by `bertkit quantize`: it runs in int8, unasked too
            quantize = int8_model_request(quantize, f"{directory} is an int8 model directory (written by `bertkit "
                                                    "quantize`)")
        # An int8 request that cannot run is refused before the weights load.
        check_request(kwargs.get("device", "cpu"), bf16=kwargs.get("bf16"), quantize=quantize,
                      calibrating=kwargs.get("calibration_texts") is not None)
        if not directory.is_dir():  # a Hub id among them: bertkit's pipelines read local directories
            raise not_a_directory(directory, "checkpoint directory", "pass a checkpoint directory written by "
                                  f"save_pretrained (config.json, model.safetensors, vocab.txt){download_hint(model_dir)}")
        if not (directory / "config.json").is_file():
            raise MissingFileError(f"{directory / 'config.json'} not found: pass a checkpoint directory written by "
                                   "save_pretrained (config.json, model.safetensors, vocab.txt)")
        refuse_other_network(directory)
        require_head(directory, cls.model_class, cls.required_keys, cls.task, cls.missing_head_fix)
        tokenizer = BertTokenizer.from_pretrained(directory)
        declared = declared_max_seq_length(directory)
        if declared is not None:
            # a sentence-transformers directory: its Transformer module gives the max_seq_length it declares (or the
            # max_length asked for) to the tokenizer as its model_max_length, over tokenizer_config.json's, so a
            # tokenizer saying 128 under a declared 256 cuts at 256 there (bertkit refused the directory)
            tokenizer.model_max_length = kwargs.get("max_length") or declared
        model = load_for_inference(cls.model_class, directory)
        return cls(model, tokenizer, **{"prepare_in_place": True, **kwargs})

    @classmethod
    def tokenizer_of(cls, model_dir: str | Path) -> BertTokenizer:
        """The tokenizer a checkpoint directory's pipeline reads its texts with, loaded without the weights (``bertkit
        predict`` checks a file's texts with it before the model loads)."""
        refuse_other_network(model_dir)
        return BertTokenizer.from_pretrained(model_dir)

    def text_form(self, prompt_name: str | None) -> tuple[str, bool, bool]:
        """(the prompt put before a text, whether the text is lower-cased before the tokenizer, whether [CLS] and
        [SEP] frame it): how the model writes a text before tokenizing it, which ``/tokenize`` shows. None, no and yes
        here; a sentence-transformers directory says otherwise (the embedding and sparse pipelines)."""
        return "", False, True

    # -- the three task-specific steps ----------------------------------------------------------------
    def encode(self, item: Any, **options: Any) -> list[dict[str, Any]]:
        raise NotImplementedError

    def forward(self, batch: dict[str, Tensor], rows: Sequence[dict[str, Any]]) -> list[np.ndarray]:
        """The head's logits, one array per row (sequence and multiple-choice heads)."""
        return list(readable(self.model(**batch).logits).cpu().numpy())

    def decode(self, item: Any, rows: list[dict[str, Any]], outputs: list[np.ndarray], **options: Any) -> Any:
        raise NotImplementedError

    def check_input(self, item: Any, index: int | str) -> Any:
        """The input as the pipeline reads it (``fields``); a wrong type or an empty text (``refuse_empty_text``) is
        an error naming the input's index."""
        if not self.fields:
            if not isinstance(item, str):
                raise BertkitError(f"{self.task} input {index} is {type(item).__name__} {str(item)[:60]!r}; expected "
                                   "a str")
            refuse_empty_text(self.tokenizer, item, f"{self.task} input {index}")
            return item
        # A key the task does not read is refused, naming it: {"text": a, "text_pairr": b} would otherwise be
        # answered as the single text a, a silently wrong answer. (The server's 422 is this.)
        unknown = sorted(str(k) for k in item if k not in self.fields) if isinstance(item, dict) else []
        if unknown:
            raise BertkitError(f"{self.task} input {index} has unknown field(s) {', '.join(unknown)}; a {self.task} "
                               f"input holds {', '.join(self.fields)} (a misspelling?)")
        if isinstance(item, dict) and all(_has(item.get(k), kind) or (k in self.optional and item.get(k) is None)
                                          for k, kind in self.fields.items()):
            for field, value in item.items():
                for j, text in enumerate([value] if isinstance(value, str) else value or []):
                    where = f"{self.task} input {index}'s {field}" + (f"[{j}]" if isinstance(value, list) else "")
                    refuse_empty_text(self.tokenizer, text, where)
            return item
        shape = ", ".join(f"{k!r}: {'[str, ...]' if kind is list else 'str'}" for k, kind in self.fields.items())
        raise BertkitError(f"{self.task} input {index} is {type(item).__name__} {str(item)[:80]!r}; expected "
                           f"{{{shape}}}{' (lists non-empty)' if list in self.fields.values() else ''}")

    # -- running --------------------------------------------------------------------------------------
    @classmethod
    def check_options(cls, options: Mapping[str, Any], pipe: Pipeline | None = None) -> None:
        """Refuse call options the pipeline cannot take, and values their ``Option`` refuses; without ``pipe``
        (``bertkit predict`` checks its flags before the model loads) a bound the pipeline sets waits for the call."""
        declared = {o.name: o for o in cls.call_options}
        unknown = sorted(set(options) - set(declared))
        if unknown:
            raise BertkitError(f"{cls.task} pipeline does not take {', '.join(unknown)}; its options are "
                               f"{', '.join(declared) or 'none'}{cls.instead(unknown)}")
        for name, value in options.items():
            if why := refusal(name, value, declared[name].check(pipe)):
                raise BertkitError(why)

    def read_options(self, options: dict[str, Any]) -> dict[str, Any]:
        """A call's checked options as ``encode`` and ``decode`` read them, worked out once per call (fill-mask reads
        its ``targets`` as token ids). An option given as None is left out, so its default applies: None is what a
        rule that takes it (``or_none``) means by the default, as transformers' pipelines read ``ignore_labels=None``
        (passed on, a token-classification call failed with "'NoneType' object is not iterable")."""
        return {k: v for k, v in options.items() if v is not None}

    @classmethod
    def instead(cls, names: Sequence[str]) -> str:
        """What answers the transformers options ``names`` here (``instead_of``, and each option's ``help`` under its
        ``wire`` name), for a refusal's message."""
        known = {**_MADE_WITH, **cls.instead_of, **{o.wire: f"{o.name}={o.help}" for o in cls.call_options if o.wire}}
        advice: dict[str, list[str]] = {}
        for n in names:
            if n in known:
                advice.setdefault(known[n], []).append(n)
        return "".join(f"; instead of {', '.join(ns)}: {a}" for a, ns in advice.items())

    def __call__(self, inputs: Any = None, **options: Any) -> Any:
        """One input gives one result; a list of inputs (any iterable) gives the list of results, in input order; a
        generator (any iterator) or a torch Dataset (indexed 0..len-1, or iterated) gives an iterator of them, read as
        they are taken."""
        named = [f"{k}=" for k in self.fields if k in options]
        if named:  # transformers' question-answering call, pipe(question=..., context=...): one input's fields
            shape = ", ".join(f"{k!r}: ..." for k in self.fields)
            raise BertkitError(f"{self.task} takes each input as one dict, not as keywords ({', '.join(named)}): "
                               f"pipe({{{shape}}}), or a list of such dicts")
        if isinstance(inputs, (str, dict, *self.input_kinds)):
            return self.run([inputs], **options)[0]
        if isinstance(inputs, (set, frozenset)):
            raise BertkitError(f"{self.task} inputs are a {type(inputs).__name__}, which has no order, so the "
                               "results could not be matched to them; pass a list")
        a_generator = isinstance(inputs, types.GeneratorType)  # before a Dataset is turned into one
        if not isinstance(inputs, (bytes, bytearray, Iterable)) and hasattr(inputs, "__len__") \
                and hasattr(inputs, "__getitem__"):
            # a map-style torch Dataset (transformers' KeyDataset over a datasets column) has no __iter__: its items
            # are those of its indices, as a DataLoader and transformers' pipelines read them
            inputs = map(inputs.__getitem__, range(len(inputs)))
        elif isinstance(inputs, torch.utils.data.Dataset) and isinstance(inputs, Iterable):  # an IterableDataset
            inputs = iter(inputs)
        if isinstance(inputs, (bytes, bytearray)) or not isinstance(inputs, Iterable):
            kinds = " or ".join(k.__name__ for k in self.input_kinds)
            raise BertkitError(f"{self.task} pipeline takes a {kinds} or a list of them, got {type(inputs).__name__} "
                               f"{str(inputs)[:60]!r}")
        if isinstance(inputs, Iterator):
            # read as the results are taken, as transformers' pipelines stream a generator or a torch Dataset: the
            # first result comes once the first batch of inputs is read, and an endless generator is served for as
            # long as it is read
            self.check_options(options, self)  # refused at the call, not at the first result
            if a_generator:
                # transformers reads a generator's first input at the call and answers an empty one with [] (code
                # testing the result, `if not results`, sees no results); other iterators stream from the start
                first = next(inputs, _NOTHING)
                if first is _NOTHING:
                    return []
                inputs = itertools.chain([first], inputs)
            return self._stream(inputs, options)
        return self.run(list(inputs), **options)

    def _stream(self, inputs: Iterator[Any], options: dict[str, Any]) -> Iterator[Any]:
        """Results for the iterator ``inputs``, in their order: each ``batch_size`` inputs read in turn are run as one
        call (``run``: their rows batched by length), so no more than that is held at a time."""
        done = 0
        while chunk := list(itertools.islice(inputs, self.batch_size)):
            yield from self._run(chunk, options, done)
            done += len(chunk)

    def refresh(self) -> None:
        """Prepare the model passed in again where it changed since it was prepared (``ModelState``); every call
        checks first. A model the pipeline loaded itself, or was given with ``prepare_in_place``, is held by nothing
        else and is not watched."""
        if self._made_from is not None and self._made_from.changed():
            self.remake(self._made_from.model)
            self._made_from = ModelState(self._made_from.model)

    def remake(self, model: nn.Module) -> None:
        """What ``refresh`` does with the changed ``model``: its copy prepared as the first was (subclasses that
        derive more from it derive that again)."""
        self.model, self.precision = self._prepared(model, False)
        self.device, self.quantize = self.precision.device, self.precision.quantize

    def _prepared(self, model: nn.Module, in_place: bool) -> tuple[nn.Module, Any]:
        """(what the pipeline runs, its precision): the copy of ``model`` prepared for inference, or on the CPU without
        bf16 or int8 ``model`` itself where one of its modules has a hook of the caller's own (``register_forward_hook``,
        as code capturing a layer's activations registers): the copy calls such a hook with its own module, so a
        hook keyed by module (``module is layer``) captured nothing, where transformers' pipeline, which runs the
        model itself, calls it with the module it was registered on (``encode`` decides alike). Run so, the model is
        in eval mode during each call and back in its own mode after (``run_rows``)."""
        prepared, precision = self._prepare(model, in_place=in_place)
        self._runs_given = (not in_place and precision.device.type == "cpu" and not precision.bf16
                            and precision.quantize is None and has_own_hooks(model))
        return (model if self._runs_given else prepared), precision

    def run(self, inputs: Sequence[Any], **options: Any) -> list[Any]:
        """Results for ``inputs``, in their order. All rows of all inputs are batched together by length."""
        return self._run(inputs, options, 0)

    def _run(self, inputs: Sequence[Any], options: dict[str, Any], first: int) -> list[Any]:
        """``run``, for inputs that start at index ``first`` of the caller's (the index errors name)."""
        self.refresh()
        self.check_options(options, self)
        options = self.read_options(options)
        items = [self.check_input(x, first + i) for i, x in enumerate(inputs)]
        per_input = [self.encode(x, **options) for x in items]
        flat = [(i, r) for i, rows in enumerate(per_input) for r in rows]
        try:
            outputs = self.run_rows([r for _, r in flat])
        except NonFiniteError as e:  # the runner names a row (a window, a choice); say whose input it is
            if e.index is None:
                raise
            i = flat[e.index][0]
            raise NonFiniteError(f"the {self.task} result for input {first + i} ({str(inputs[i])[:60]!r}): {e}",
                                 index=first + i) from None
        grouped: list[list[np.ndarray]] = [[] for _ in items]
        for (i, _), out in zip(flat, outputs):
            grouped[i].append(out)
        results = []
        for i, (x, item, rows, outs) in enumerate(zip(inputs, items, per_input, grouped), start=first):
            try:
                result = self.decode(item, rows, outs, **options)
            except NonFiniteError as e:  # refused as it was decoded (QA's spans): say which input
                raise NonFiniteError(f"the {self.task} result for input {i} ({str(x)[:60]!r}): {e}", index=i) from None
            results.append(result)
            if (where := nonfinite_in(result)) is not None:
                raise NonFiniteError(
                    f"the {self.task} result for input {i} ({str(x)[:60]!r}) holds {where}: the model's outputs for "
                    "it overflowed (to an infinite value or feature, or to -inf for every label or position, whose "
                    "softmax is NaN and whose pick is no pick), so no result was produced; "
                    f"{nonfinite_cause(self.model)}", index=i)
        return results

    @torch.inference_mode()
    def run_rows(self, rows: Sequence[dict[str, Any]]) -> list[np.ndarray]:
        """The model's outputs for each row, in row order: rows are run longest first in batches of
        ``batch_size`` (similar lengths together), then put back. The model runs as ``refresh`` last left it: ``run``
        refreshes before it encodes the inputs into rows."""
        if not rows:
            return []
        if not self.bf16 and torch.is_autocast_enabled(self.device.type) and not getattr(self, "_said_autocast", False):
            # transformers' pipelines compute inside a caller's autocast; this one was prepared for its weights'
            # dtype and runs in it: say so once, rather than hand back float32 numbers the caller took for bf16 ones
            self._said_autocast = True
            logger.warning("%s pipeline called inside torch.autocast(%r, dtype=%s): it runs in its weights' dtype "
                           "(%s), as made without bf16=True, and leaves the caller's autocast aside; make it with "
                           "bf16=True to run in bf16", self.task, self.device.type,
                           torch.get_autocast_dtype(self.device.type), self.precision.dtype)
        firsts, places = distinct([_row_key(r) for r in rows])  # copies of a row computed once, so they tie exactly
        rows_run = [rows[i] for i in firsts]
        show = self.progress if self.progress is not None else len(rows_run) >= _PROGRESS_ROWS
        from bertkit.progress import progress_bar

        bar = progress_bar(total=len(rows_run), desc=self.task, unit="seq", enabled=show, leave=False)
        pad_values = {"input_ids": self.tokenizer.pad_token_id, "token_type_ids": 0}  # (B, T), or (B, C, T) for choices
        # Longest first: the first batch is the largest, so running out of memory shows at once. Rows with
        # different numbers of choices (multiple-choice) never share a batch: it must be one (B, C, T) tensor.
        results = run_length_sorted(self.forward, rows_run, batch_size=self.batch_size, device=self.device,
                                    pad=lambda batch: pad_batch(batch, pad_values, attention_mask=True),
                                    bf16=self.bf16, lengths=[_row_length(r) for r in rows_run],
                                    model=self.model if self._runs_given else None,  # eval mode during the call
                                    longest_first=True, groups=[_group(r) for r in rows_run], bar=bar,
                                    nonfinite=lambda i: f"the model's output for {self.task} row {firsts[i]} is not "
                                    f"finite (NaN or inf), so no result was produced: {nonfinite_cause(self.model)}")
        bar.close()
        # a copy's output is its own array: a caller that changes one in place leaves the others as computed
        return [results[p] if firsts[p] == i else results[p].copy() for i, p in enumerate(places)]


_PLAIN = (str, int, float, np.generic, type(None))  # a record's values that hold no other values


def nonfinite_in(result: Any, at: str = "") -> str | None:
    """Where ``result`` (a pipeline's: dicts, lists, numbers, arrays) holds a NaN or an infinity, as "NaN at
    ['score']", else None. The runner refuses outputs holding NaN or +inf but lets -inf through, as a head may mask
    with it; a row whose logits are all -inf still comes out a NaN score (and its argmax a label, its span a pick),
    and a -inf regression value or feature is no JSON number for ``predict``'s files and ``serve``'s answers."""
    if isinstance(result, float | np.floating) and not np.isfinite(result):
        return f"{'NaN' if np.isnan(result) else float(result)} at {at or 'the top'}"
    if isinstance(result, Tensor):
        result = result.detach().float().cpu().numpy() if result.is_floating_point() else None
    if isinstance(result, list | tuple) and result and isinstance(result[0], float | int | list):
        # a feature-extraction result is (T, H) nested lists of floats: searched as one array, as walking each float
        # in Python cost 7 ms a call, a third of a short text's whole pipeline call (ragged or mixed ones are walked)
        with contextlib.suppress(ValueError, TypeError):
            numbers = np.asarray(result)
            if numbers.dtype.kind in "fiub":  # numbers alone (a None or a str beside them: walked)
                result = numbers
    if isinstance(result, list | tuple) and result and all(isinstance(r, Mapping) for r in result):
        # records of plain values (a sparse vector's hundreds of {"index", "value"}): their floats checked as one
        # array, as walking each cost 3.9 ms a text, a quarter of a sparse pipeline's call; a bad one is then walked to
        values = [v for r in result for v in r.values()]
        if all(isinstance(v, _PLAIN) for v in values) and np.isfinite(
                np.asarray([v for v in values if isinstance(v, float | np.floating)], dtype=np.float64)).all():
            return None
    if isinstance(result, np.ndarray):
        bad = np.argwhere(~np.isfinite(result)) if result.dtype.kind == "f" else []
        return nonfinite_in(float(result[tuple(bad[0])]), at + "".join(f"[{int(i)}]" for i in bad[0])) \
            if len(bad) else None
    if isinstance(result, Mapping):
        found = (nonfinite_in(v, f"{at}[{k!r}]") for k, v in result.items())
    elif isinstance(result, list | tuple):
        found = (nonfinite_in(v, f"{at}[{j}]") for j, v in enumerate(result))
    else:
        return None
    return next((w for w in found if w is not None), None)


def _has(value: Any, kind: type) -> bool:
    if kind is list:
        return isinstance(value, list) and bool(value) and all(isinstance(v, str) for v in value)
    return isinstance(value, kind)


def _row_key(row: dict[str, Any]) -> Any:
    """A row as a hashable value, equal for rows the model computes alike (every key of the row, which the forward
    may read); None for a row holding anything but strings, numbers, None, lists and dicts of them."""
    def frozen(x: Any) -> Any:
        if isinstance(x, list | tuple):
            return tuple(map(frozen, x))
        if isinstance(x, dict):
            return tuple((k, frozen(v)) for k, v in sorted(x.items()))
        if x is None or type(x) in (str, int, float, bool):
            return x
        raise TypeError

    try:
        return frozen(row)
    except TypeError:  # an array or a tensor in it (or keys that do not sort): computed on its own
        return None


def _group(row: dict[str, Any]) -> tuple[int, int, bool]:
    """Rows of one batch share this: their number of choices (multiple-choice: one (B, C, T) tensor), the
    length of a prompt their pooling leaves out (an embedding pipeline's, per call or per request), and whether
    they ask for every token's state instead of the pooled vector (``all_tokens``: TEI's /embed_all)."""
    ids = row["input_ids"]
    return len(ids) if ids and isinstance(ids[0], list) else 0, row.get("prompt_length", 0), row.get("all_tokens", False)


def scored(x: np.ndarray, fn: str = "softmax") -> np.ndarray:
    """Logits as scores over the last axis, in float64 (scores a user reads should not carry bf16 rounding):
    ``fn`` "softmax", "sigmoid", or "none" (the logits)."""
    x = x.astype(np.float64)
    if fn == "softmax":
        with np.errstate(invalid="ignore"):  # every logit -inf: NaN, which ``run`` refuses; numpy's warning is noise
            e = np.exp(x - x.max(axis=-1, keepdims=True))
            return e / e.sum(axis=-1, keepdims=True)
    return 1.0 / (1.0 + np.exp(-x)) if fn == "sigmoid" else x
