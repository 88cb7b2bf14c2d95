"""The pipeline tasks, each one class that declares everything about it: its name and help line, the pipeline that
runs it, what ``bertkit predict TASK`` reads and writes, and how ``bertkit serve`` parses, costs and answers it and
on which routes. ``TASK_LIST`` names them once; ``bertkit.pipeline``, the predict commands, serve's ``--task``
choices and routes, and the wire's per-task parameters all come from it (its pipeline's options, each declared on the
pipeline class: ``options.Option``), and no other module switches on a task's name. A new task is one class here,
added to ``TASK_LIST``.

Importing this module loads no torch, nor numpy (the command line reads it for its help, where numpy was a fifth
of ``bertkit --help``'s time): a task names its pipeline as ``"module:Class"``, imported when the task runs.
"""

from __future__ import annotations

import importlib
import inspect
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from bertkit.errors import BertkitError, given_path
from bertkit.inference import serve_tei
from bertkit.inference.serve_wire import (
    EMBED_FIELDS,
    PREDICT,
    SIMILARITY,
    Call,
    RequestError,
    Route,
    _default,
    embedding,
    fields,
    read_input,
)

if TYPE_CHECKING:
    import numpy as np


def label_names(config: Any) -> list[str]:
    """A head's label names by output index (transformers' LABEL_i where the config names none)."""
    return [config.id2label[i] if config.id2label else f"LABEL_{i}" for i in range(config.num_labels)]


class Task:
    """A pipeline task (``TASK_LIST`` holds one of each). A subclass declares its own ``name``, ``help`` and
    ``pipeline`` (checked when the class is defined); everything else has the default of a task whose input is one
    model sequence and whose answer is the pipeline's result as it is."""

    name: ClassVar[str]
    help: ClassVar[str]  # `bertkit predict --help`'s line: what the task writes
    pipeline: ClassVar[str]  # "module:Class" of the pipeline that runs it, imported when it runs
    aliases: ClassVar[tuple[str, ...]] = ()  # transformers' other names for it
    not_served: ClassVar[str] = ""  # why `bertkit serve` refuses the task, if it does

    # -- bertkit predict TASK: files in, JSON lines out ------------------------------------------------------------
    # (fields, those it may lack) of a record in the task's files, where they are not the pipeline's input's
    records: ClassVar[tuple[tuple[str, ...], tuple[str, ...]] | None] = None
    result_key: ClassVar[str] = "result"  # the key of a result that is a list (a dict's keys are written as they are)
    predict_options: ClassVar[tuple[str, ...]] = ()  # the settings (PredictFileSettings) passed to each call
    load_settings: ClassVar[tuple[str, ...]] = ()  # the settings load_options reads (predict's and serve's)
    pair_head: ClassVar[bool] = False  # a head fine-tuned on pairs: a second text that no flag names is refused

    # -- bertkit serve: the wire ------------------------------------------------------------------------------------
    body_fields: ClassVar[tuple[str, ...]] = ()  # TEI's fields a /predict body may hold beside inputs and parameters
    answer_params: ClassVar[tuple[str, ...]] = ()  # Inference API parameters that shape the answer, not the call
    encoded: ClassVar[bool] = False  # inputs encoded while parsing, the model's outputs rendered here (not decoded)
    # TEI's /predict reads a list of one or two strings as ONE input (its Sequence: ["a"] a text, ["a", "b"] a pair),
    # trying that before a batch; a task whose inputs may be pairs reads them so, other tasks as a batch
    tei_sequence: ClassVar[bool] = False
    counted: ClassVar[bool] = False  # one model sequence per input, whose tokens are counted while parsing
    candidates_per: ClassVar[str] = ""  # what top_k counts candidates of, where an answer holds top_k x something
    routes: ClassVar[tuple[Route, ...]] = ()  # the routes only this kind of model answers (others answer 424)
    root: ClassVar[Route] = PREDICT  # what TEI's POST / is on its server
    model_type: ClassVar[str] = "classifier"  # what TEI's /info calls the model
    sentence_class: ClassVar[str] = ""  # the bertkit.sentence class whose directories it runs, where it runs one

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        missing = [k for k in ("name", "help", "pipeline") if not isinstance(cls.__dict__.get(k), str)
                   or not cls.__dict__[k]]
        if missing:
            raise TypeError(f"task class {cls.__name__} must declare its own {', '.join(missing)} (non-empty str)")
        module, _, attr = cls.pipeline.partition(":")
        if not (module.startswith("bertkit.") and attr.isidentifier()):
            raise TypeError(f"task {cls.name}: pipeline {cls.pipeline!r} must be 'bertkit.module:PipelineClass'")
        if cls.root is not PREDICT and cls.root not in cls.routes:
            raise TypeError(f"task {cls.name}: its root route {cls.root.path} is not one of its routes")
        if any(not r.needs for r in cls.routes):
            raise TypeError(f"task {cls.name}: a route of its own must say what other servers answer (Route.needs)")

    def pipeline_class(self) -> type:
        module, _, attr = self.pipeline.partition(":")
        return getattr(importlib.import_module(module), attr)

    # -- predict --------------------------------------------------------------------------------------------------
    def record_fields(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """The fields a record of the task's files holds ("text" for a pipeline of bare texts), and those it may
        lack: the pipeline's own, unless the task's records differ (``records``)."""
        p = self.pipeline_class()
        return self.records or (tuple(p.fields) or ("text",), p.optional)

    def settings_read(self) -> set[str]:
        """The PredictFileSettings fields this task's predict reads (its record fields' columns, its load and call
        options); one that another task reads, given to this one, is refused (``files.refuse_unread``)."""
        fields, optional = self.record_fields()
        return {f"{f}_column" for f in (*fields, *optional)} | {*self.predict_options, *self.load_settings}

    def check_text(self, where: str, text: str, tokenizer: Any) -> None:
        """Refuse a record's text the pipeline would refuse, before the model loads."""

    def check_settings(self, s: Any) -> None:
        """Refuse `bertkit predict`'s or `bertkit serve`'s settings that no input of the task could run with, naming
        the flag, before any input is read or the model loads."""
        if s.max_length is not None:
            self.check_length(s.max_length, f"--max-length {s.max_length}")

    def check_loaded(self, pipe: Any, s: Any) -> None:
        """``check_settings``' refusal of a length, for the checkpoint's own (``--max-length`` unset), known once
        ``pipe`` has loaded."""
        if s.max_length is None:
            self.check_length(pipe.max_length, f"this checkpoint's max_length {pipe.max_length} (--max-length unset)")

    def check_length(self, max_length: int, given: str) -> None:
        """Refuse a pipeline length no input of the task could run with by default; ``given`` says where it comes
        from (a flag, or the checkpoint once loaded)."""

    def load_options(self, s: Any) -> dict[str, Any]:
        """The pipeline's construction options from predict's or serve's settings (``load_settings``), checked
        before the model loads."""
        return {}

    def call_inputs(self, inputs: list[Any], s: Any) -> tuple[list[Any], dict[str, Any]]:
        """The pipeline's inputs and call options for the records read (a setting left unset: its default)."""
        return inputs, {k: getattr(s, k) for k in self.predict_options if getattr(s, k) is not None}

    def record(self, id_: Any, result: Any) -> dict[str, Any]:
        """One line of predict's output."""
        return {"id": id_, **result} if isinstance(result, dict) else {"id": id_, self.result_key: result}

    # -- serve ----------------------------------------------------------------------------------------------------
    def cost(self, pipe: Any, item: Any, options: dict[str, Any], index: int) -> tuple[int, int, str]:
        """(model sequences, answer candidates, what the sequences are, for the refusal) of one checked input."""
        return 1, 0, "inputs"

    def check_answer(self, answer: dict[str, Any]) -> None:
        """Refuse (422) parameters that shape the answer (``answer_params``, ``body_fields``) and contradict each other,
        before the request is admitted."""

    def render(self, server: Any, call: Call, results: list[Any]) -> Any:
        """/predict's answer: the Inference API's shape for the task (by default the pipeline's results)."""
        return results[0] if call.single else results

    def info(self, pipe: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        """TEI's /info: (``model_type``, the other fields this task fills in)."""
        labels = label_names(pipe.config)
        return {self.model_type: {"id2label": {str(i): n for i, n in enumerate(labels)},
                                  "label2id": {n: i for i, n in enumerate(labels)}}}, {}


class FillMask(Task):
    name = "fill-mask"
    help = "top-k tokens for each [MASK]"
    pipeline = "bertkit.inference.pipelines:FillMaskPipeline"
    result_key = "predictions"
    predict_options = ("top_k", "targets")
    counted = True
    candidates_per = "[MASK]s"

    def check_text(self, where: str, text: str, tokenizer: Any) -> None:
        if tokenizer.mask_token not in text:
            raise BertkitError(f"{where}: no {tokenizer.mask_token} in {text[:60]!r}; fill-mask predicts the token at "
                               f"each {tokenizer.mask_token}: write one where a word is to be predicted")

    def cost(self, pipe: Any, item: Any, options: dict[str, Any], index: int) -> tuple[int, int, str]:
        try:  # the [MASK]s within max_length, as the model sees them; a top_k past the vocabulary is refused there
            masks = len(pipe.encode(item, **options)[0]["masks"])
        except BertkitError as e:
            raise RequestError(422, f"input {index}: {e}") from None
        top_k = options.get("top_k", _default(pipe.decode, "top_k"))
        targets = options.get("targets")
        if targets is not None:  # the answer ranks the targets alone: at most one candidate per target and mask
            top_k = min(top_k, len([targets] if isinstance(targets, str) else targets))
        return masks, masks * top_k, f"[MASK] tokens (input {index} has {masks})"


class TextClassification(Task):
    name = "text-classification"
    help = "labels and scores per text or pair"
    pipeline = "bertkit.inference.pipelines:TextClassificationPipeline"
    aliases = ("sentiment-analysis",)
    pair_head = True
    # TEI's fields, which select TEI's answer; InferenceClient sends top_k and function_to_apply
    body_fields = ("raw_scores", "truncate", "truncation_direction")
    answer_params = ("top_k", "function_to_apply")
    encoded = counted = tei_sequence = True

    def check_answer(self, answer: dict[str, Any]) -> None:
        fn = answer.get("function_to_apply")
        if answer.get("raw_scores") and fn is not None and fn.lower() != "none":
            # TEI's raw_scores and transformers' function_to_apply both pick the scores: the logits would be answered
            # for a request that also asked for their softmax or sigmoid, without a word
            raise RequestError(422, f"raw_scores true answers the logits, and function_to_apply {fn!r} asks for their "
                                    f"{fn.lower()} instead: send one of them (function_to_apply \"none\" is the logits)")

    def render(self, server: Any, call: Call, results: list[Any]) -> Any:
        out = [_classification(server.pipe.config, r, call.answer, call.tei) for r in results]
        return (out[0] if call.tei else out) if call.single else out


def _classification(config: Any, logits: np.ndarray, answer: dict[str, Any], tei: bool) -> list[dict[str, Any]]:
    """``[{label, score}]`` best first, scored as transformers' pipeline does (TEI: softmax, or sigmoid for
    one label; ``raw_scores``: the logits)."""
    from bertkit.inference.base import scored  # the server's, loaded with the model

    n = len(logits)
    fn = answer.get("function_to_apply")
    fn = fn.lower() if fn is not None else None  # any case, as transformers reads it ("SIGMOID")
    if answer.get("raw_scores"):
        fn = "none"
    elif fn is None and tei:
        fn = "softmax" if n > 1 else "sigmoid"
    elif fn is None:  # transformers' TextClassificationPipeline.postprocess
        if config.problem_type == "regression":
            fn = "none"
        elif config.problem_type == "multi_label_classification" or n == 1:
            fn = "sigmoid"
        else:
            fn = "softmax"
    scores = scored(logits, fn)
    names = label_names(config)
    out = sorted(({"label": names[i], "score": float(scores[i])} for i in range(n)), key=lambda d: -d["score"])
    key = ("score", "label") if tei else ("label", "score")
    out = [{k: d[k] for k in key} for d in out]
    return out[:answer["top_k"]] if answer.get("top_k") else out


class Rerank(Task):
    """A record of predict's files holds one (query, passage) pair: the pipeline's query with one text."""

    name = "rerank"
    help = "a relevance score per (query, passage) record"
    pipeline = "bertkit.inference.pipelines:RerankPipeline"
    sentence_class = "CrossEncoder"
    records = ("query", "text"), ()
    predict_options = ("raw_scores",)
    routes = (serve_tei.RERANK,)
    root = serve_tei.RERANK
    model_type = "reranker"

    def call_inputs(self, inputs: list[Any], s: Any) -> tuple[list[Any], dict[str, Any]]:
        return [{"query": x["query"], "texts": [x["text"]]} for x in inputs], {"raw_scores": s.raw_scores}

    def record(self, id_: Any, result: Any) -> dict[str, Any]:
        return {"id": id_, "score": result[0]["score"]}

    def cost(self, pipe: Any, item: Any, options: dict[str, Any], index: int) -> tuple[int, int, str]:
        n = len(item["texts"])
        return n, 0, f"(query, text) pairs (input {index} has {n})"


class TokenClassification(Task):
    name = "token-classification"
    help = "word tags and entity spans with character offsets"
    pipeline = "bertkit.inference.tagging:TokenClassificationPipeline"
    aliases = ("ner",)
    # stride: without it a text past --max-length was tagged only to there, the rest of the file's text left out
    predict_options = ("aggregation_strategy", "stride")
    counted = True

    def render(self, server: Any, call: Call, results: list[Any]) -> Any:
        out = [r["entities"] for r in results]  # the pipeline left out what ignore_labels names (default ["O"])
        return out[0] if call.single else out


class QuestionAnswering(Task):
    name = "question-answering"
    help = "answer spans in contexts of any length"
    pipeline = "bertkit.inference.pipelines:QuestionAnsweringPipeline"
    predict_options = ("top_k",)
    answer_params = ("align_to_words", "max_seq_len")
    candidates_per = "questions"

    def check_length(self, max_length: int, given: str) -> None:
        # predict and serve cut questions where the pipeline does by default, and have no flag to cut them shorter:
        # the pipeline's own message would name its max_question_length, which predict does not take, and a server
        # started so refused every request that did not send max_question_len (422), after loading the model
        question = _default(self.pipeline_class().encode, "max_question_length")
        if max_length <= question + 3:
            raise BertkitError(f"{given} leaves no room for a context: question-answering cuts each question to "
                               f"{question} tokens, and [CLS] and two [SEP] make {question + 3}; raise --max-length "
                               f"above {question + 3} (384: the SQuAD recipe's)")

    def cost(self, pipe: Any, item: Any, options: dict[str, Any], index: int) -> tuple[int, int, str]:
        from bertkit.tasks import squad

        question = options.get("max_question_length", _default(pipe.encode, "max_question_length"))
        overlap = options.get("doc_stride")
        try:
            step = pipe.window_step(item["question"], overlap, question)
        except BertkitError as e:
            raise RequestError(422, f"input {index}: {e}") from None
        windows = squad.count_windows(item["question"], item["context"], pipe.tokenizer,
                                      max_seq_length=pipe.max_length, doc_stride=step, max_query_length=question)
        return windows, options.get("top_k", _default(pipe.decode, "top_k")), (
            f"windows (input {index} alone makes {windows} at doc_stride {overlap if overlap is not None else 'unset'}"
            ", the overlap between windows; a smaller doc_stride makes fewer)")

    def render(self, server: Any, call: Call, results: list[Any]) -> Any:
        several = (call.answer.get("top_k") or 1) > 1
        align = call.answer.get("align_to_words", True)  # the Inference API's default
        out = []
        for item, result in zip(call.items, results, strict=True):
            context = item["context"]
            bounds = _word_bounds(server.pipe.tokenizer, context) if align else ({}, {})
            answers = [_answer(r, context, bounds) for r in (result["nbest"] if several else [result])]
            out.append(answers if several else answers[0])
        return out[0] if call.single else out


def _answer(r: dict[str, Any], context: str, bounds: tuple[dict[int, int], dict[int, int]]) -> dict[str, Any]:
    """One answer in transformers' keys, its ends moved to ``bounds`` (``_word_bounds``; empty: the token span); no
    answer is "" at 0..0."""
    if r["start"] is None:
        return {"score": r["score"], "start": 0, "end": 0, "answer": r["answer"]}
    start, end = bounds[0].get(r["start"], r["start"]), bounds[1].get(r["end"], r["end"])
    return {"score": r["score"], "start": start, "end": end, "answer": context[start:end]}


def _word_bounds(tokenizer: Any, context: str) -> tuple[dict[int, int], dict[int, int]]:
    """(each token's first character -> its word's, each token's end -> its word's), in ``context``: how
    transformers' ``align_to_words`` widens an answer span (a token span, "Ku" of "Kuechly") to whole words."""
    enc = tokenizer(context, add_special_tokens=False, return_offsets_mapping=True)
    words = [enc.word_to_chars(w) for w in enc.word_ids()]  # each token's word's characters
    return ({s: w.start for (s, _), w in zip(enc["offset_mapping"], words, strict=True)},
            {e: w.end for (_, e), w in zip(enc["offset_mapping"], words, strict=True)})


class MultipleChoice(Task):
    name = "multiple-choice"
    help = "the best choice and its score"
    pipeline = "bertkit.inference.pipelines:MultipleChoicePipeline"
    not_served = ("bertkit serve does not serve multiple-choice (no client API has the task): run it with bertkit "
                  "predict or bertkit.pipeline(\"multiple-choice\", ...)")


class FeatureExtraction(Task):
    name = "feature-extraction"
    help = "one vector per input (mean or CLS pooling)"
    pipeline = "bertkit.inference.embedding:FeatureExtractionPipeline"
    result_key = "embedding"
    body_fields = answer_params = EMBED_FIELDS  # InferenceClient sends TEI's fields at the top level
    encoded = counted = True
    routes = (SIMILARITY, serve_tei.OPENAI, serve_tei.OPENAI_UNVERSIONED, serve_tei.EMBED, serve_tei.EMBED_ALL)
    root = serve_tei.EMBED

    load_settings = ("pooling", "prompt_name")  # predict's and serve's (a request's prompt_name wins over it)

    def load_options(self, s: Any) -> dict[str, Any]:
        if s.prompt_name is not None:  # one of the directory's prompts: read from its files before the model loads
            self.pipeline_class().directory_prompt(s.model_name_or_path, s.prompt_name)
        return {"pooling": None if s.pooling == "auto" else s.pooling, "default_prompt_name": s.prompt_name}

    def render(self, server: Any, call: Call, results: list[Any]) -> Any:
        a = call.answer
        if a.get("similarity"):  # cosines of the source sentence's unit vector with the others'
            import numpy as np

            v = np.asarray(embedding(results, {**a, "normalize": True}, True), dtype=np.float64)
            return (v[1:] @ v[0]).tolist()
        return [embedding(r, a, server.default_normalize) for r in results]  # one text too gives a list of one

    def info(self, pipe: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        # what the pipeline uses: the directory's prompts and truncate_dim included
        return {"embedding": {"pooling": pipe.pooling}}, {
            "prompts": pipe.prompts or None, "default_prompt_name": pipe.default_prompt_name,
            "default_prompt": pipe.prompt or None, "embedding_dimension": pipe.dimension}


class SentenceEmbedding(FeatureExtraction):
    name = "sentence-embedding"
    help = "unit-length sentence vectors"
    pipeline = "bertkit.inference.embedding:SentenceEmbeddingPipeline"


class SparseEmbedding(Task):
    """SPLADE vectors of a sparse encoder (``bertkit.sentence.SparseEncoder``), on TEI's ``POST /embed_sparse``: its
    body (``inputs``, ``truncate``, ``truncation_direction``, ``prompt_name``) and its answer, a list of
    ``{"index", "value"}`` per input, the active word pieces in index order. A text is embedded as ``encode`` does
    (the default prompt, or none, as TEI), as ``encode_document`` does for ``prompt_name`` "document", as
    ``encode_query`` for "query" (the query prompt, an inference-free model's static query route). ``truncate``
    unset cuts at max_length, as /info's ``auto_truncate`` says."""

    name = "sparse-embedding"
    help = "(index, value) pairs of the active word pieces (SPLADE)"
    pipeline = "bertkit.sentence.sparse_encoder.pipeline:SparseEmbeddingPipeline"
    sentence_class = "SparseEncoder"
    result_key = "sparse_embedding"
    predict_options = ("prompt_name", "return_tokens")
    counted = True
    model_type = "embedding"
    routes = (Route("/embed_sparse", "TEI's: texts -> [[{index, value}, ...]] (SPLADE); prompt_name \"query\" embeds "
                    "queries", lambda data, server: server.task.parse_sparse(data, server),
                    lambda server, call, results: [server.pipe.decode(None, [], [r]) for r in results],
                    needs="needs a sparse encoder; this server runs {task}: start it with --task {tasks}"),)
    root = routes[0]

    def parse_sparse(self, data: Any, server: Any) -> Call:
        """/embed_sparse's body: each text encoded for its side here (422 for one over max_length with ``truncate``
        false, as TEI answers), before the request is admitted."""
        pipe, limits = server.pipe, server.limits
        f = fields(data, "/embed_sparse", ("inputs",), ("truncate", "truncation_direction", "prompt_name"), server)
        texts = serve_tei.embedded_texts(f["inputs"], "/embed_sparse", limits, serve_tei.SEND_THE_TEXT)
        side, rows = f.get("prompt_name"), []
        for i, text in enumerate(texts):
            read = read_input(pipe, text, i)
            tokens, limit = pipe.length(read, side)
            if not f.get("truncate", True) and tokens > limit:
                raise RequestError(422, f"input {i} has {tokens} tokens, over max_length {limit}; send truncate: "
                                        "true to cut it, or shorten it")
            rows.extend(pipe.encode(read, prompt_name=side, truncation_direction=f.get("truncation_direction", "right")))
        return Call(rows, {"rows": True}, {}, cost=len(rows), tokens=[len(r["input_ids"]) for r in rows],
                    chars=sum(map(len, texts)))

    def info(self, pipe: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        # the prompts as an embedding server's: the one put before every text sent without prompt_name (encode's; a
        # Router without a default route embeds none)
        encoder, side = pipe.encoder, pipe.sides[None]
        default = "" if isinstance(side, BertkitError) else side.prompt
        return {"embedding": {"pooling": "splade"}}, {
            "prompts": dict(encoder.prompts) or None, "default_prompt_name": encoder.default_prompt_name,
            "default_prompt": default or None, "embedding_dimension": encoder.get_embedding_dimension()}


TASK_LIST: tuple[Task, ...] = (FillMask(), TextClassification(), Rerank(), TokenClassification(), QuestionAnswering(),
                               MultipleChoice(), FeatureExtraction(), SentenceEmbedding(), SparseEmbedding())
# Every name a task answers to, its own first (in TASK_LIST's order), then the aliases.
TASKS: dict[str, Task] = {**{t.name: t for t in TASK_LIST}, **{a: t for t in TASK_LIST for a in t.aliases}}
if len(TASKS) != sum(1 + len(t.aliases) for t in TASK_LIST):
    raise TypeError(f"two tasks share a name: {[n for t in TASK_LIST for n in (t.name, *t.aliases)]}")
SERVED: tuple[Task, ...] = tuple(t for t in TASK_LIST if not t.not_served)


TASK_ROUTES: tuple[Route, ...] = tuple(dict.fromkeys(r for t in SERVED for r in t.routes))  # each once, in order


def task_named(name: Any, where: str = "predict") -> Task:
    """The task ``name`` names, or the error that lists them."""
    if not (isinstance(name, str) and name in TASKS):
        raise BertkitError(f"{where} has no task {name!r}; choose one of {', '.join(TASKS)}")
    return TASKS[name]


def pipeline(task: str | None = None, model: Any = None, *, tokenizer: Any = None, device: Any = "cpu",
             bf16: bool | None = None, batch_size: int = 32, max_length: int | None = None, progress: bool | None = None,
             quantize: str | None = None, calibration_texts: Sequence[str | tuple[str, str]] | None = None,
             **options: Any) -> Any:
    """The ``task`` pipeline over ``model``, as transformers' ``pipeline(task, model)`` is called.

    ``model`` is a checkpoint directory (config.json, model.safetensors, vocab.txt), or a bertkit model already
    built, with ``tokenizer=`` (a ``BertTokenizer`` or its directory). ``bf16=True`` runs the model under bfloat16
    autocast, ``bf16=False`` or unset in the weights' dtype (``.bf16`` says
    which). ``quantize="int8"`` runs the encoder's projections in int8 on the CPU (docs/inference.md section int8):
    a quantized copy, made once, calibrated on ``calibration_texts`` (a few hundred texts like the inputs; strings
    or ``(text, text_pair)`` tuples) or by default on 64 built-in English sentences. ``batch_size`` sequences run
    at once, grouped by length; ``max_length`` (default: the tokenizer's model_max_length capped at the model's
    positions, or a sentence-transformers directory's max_seq_length; given, up to the positions) caps each
    sequence: texts are truncated, QA contexts windowed.
    ``progress`` draws a bar (None: only for long inputs). ``options`` go to the task's pipeline (e.g.
    ``pooling="cls"``, ``normalize=True`` for embeddings).
    """
    from torch import nn

    from bertkit.tokenization import BertTokenizer

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
    if not isinstance(model, nn.Module):
        given_path(model, "pipeline model")
    kwargs = dict(device=device, bf16=bf16, batch_size=batch_size, max_length=max_length, progress=progress,
                  quantize=quantize, calibration_texts=calibration_texts, **options)
    cls = TASKS[task].pipeline_class()
    names = [o.name for o in cls.call_options]
    per_call = [k for k in options if k in names]
    if per_call:  # transformers' pipeline() keeps them as defaults of every call; bertkit takes them per call
        given = ", ".join(f"{k}={options[k]!r}" for k in per_call)
        raise BertkitError(f"pipeline({task!r}, ..., {given}): {', '.join(per_call)} is an option of each call here, "
                           f"not of pipeline() (transformers keeps it as a default): pass it to the call, "
                           f"pipe(inputs, {given})")
    known = {name for c in cls.__mro__ if "__init__" in vars(c) for name, p in
             inspect.signature(vars(c)["__init__"]).parameters.items() if p.kind == p.KEYWORD_ONLY} - {"directory"}
    unknown = sorted(set(options) - known)
    if unknown:  # a bare TypeError from the pipeline's constructor named neither the task nor what it takes
        calls = f"; per call: {', '.join(names)}" if names else ""
        raise BertkitError(f"pipeline({task!r}) does not take {', '.join(unknown)}; it takes "
                           f"{', '.join(sorted(known))}{calls}{cls.instead(unknown)}")
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
    # transformers' scripts name the directory twice, pipeline(task, model=d, tokenizer=d): that is its own tokenizer
    same = isinstance(tokenizer, (str, os.PathLike)) and os.path.realpath(tokenizer) == os.path.realpath(model)
    if tokenizer is not None and not same:
        raise BertkitError(f"tokenizer= goes with a model object; a checkpoint directory brings its own vocab.txt "
                           f"(tokenizer={str(model)!r}, the model's own directory, is taken; got {str(tokenizer)[:80]!r})")
    return cls.from_pretrained(model, **kwargs)
