"""Task pipelines of the heads: fill-mask, text classification, reranking, question answering, multiple choice
(``bertkit.pipeline``; token classification is ``tagging.py``'s, the embedding pipelines ``embedding.py``'s). Each turns plain inputs into JSON-able results; what
they share (batching, order, the non-finite check) is ``base.Pipeline``'s, SQuAD windows and answer decoding
``tasks.squad``'s (the same code that scores the benchmark).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from bertkit.errors import BertkitError
from bertkit.heads import (
    BertForMaskedLM,
    BertForMultipleChoice,
    BertForQuestionAnswering,
    BertForSequenceClassification,
)
from bertkit.inference import tasks
from bertkit.inference.base import Pipeline, refuse_empty_text, scored
from bertkit.inference.options import BOOL, FINITE, Option, int_in, or_none
from bertkit.inference.runner import readable
from bertkit.sentence.directory import cross_encoder_max_seq_length, saved_activation
from bertkit.tasks import squad
from bertkit.tokenization.batch import left_truncated
from bertkit.tokenization.encoding import segment_ids

logger = logging.getLogger("bertkit")


def per_row(x: Tensor, rows: Sequence[dict[str, Any]]) -> list[np.ndarray]:
    """(B, T, ...) batch output -> one array per row (float32, float64 for a float64 model), cut to its own length."""
    x = readable(x).cpu().numpy()
    return [x[b, : len(r["input_ids"])] for b, r in enumerate(rows)]


class FillMaskPipeline(Pipeline):
    """Text with one or more ``[MASK]`` tokens -> the ``top_k`` most likely tokens for each.

    One mask gives a list of candidates ``{"score", "token", "token_str", "sequence"}`` (as transformers'
    fill-mask pipeline); several masks give one such list per mask. Only the masked positions go through
    the vocabulary-wide output layer. ``targets`` (a str or a list of them) ranks those tokens alone, as transformers
    does: each keeps its probability over the whole vocabulary, and ``top_k`` is capped at their number.
    """

    task = tasks.FillMask.name
    model_class = BertForMaskedLM
    required_keys = ("cls.predictions.bias", "cls.predictions.transform.dense.weight")
    # None is the default, as transformers' fill-mask reads top_k=None (5 candidates) and targets=None (the vocabulary)
    call_options = (Option("top_k", or_none(int_in(1))), Option("targets", or_none((
        lambda v: isinstance(v, str) or isinstance(v, (list, tuple)) and bool(v) and all(isinstance(t, str) for t in v),
        "a string or a non-empty list of strings (the tokens to rank)"))))
    missing_head_fix = ("fill-mask needs the masked-LM head of pre-training: use a checkpoint that keeps it "
                        "(google's or Hugging Face's bert-base-*, one converted by convert-tf-checkpoint, or "
                        "bertkit pretrain's output)")

    def read_options(self, options: dict[str, Any]) -> dict[str, Any]:
        options = super().read_options(options)
        if "targets" not in options:
            return options
        return {**options, "targets": self.target_ids(options["targets"])}

    def target_ids(self, targets: str | Sequence[str]) -> list[int]:
        """The token ids ``targets`` name, each once, as transformers' fill-mask reads them: a token of the
        vocabulary (``"##s"`` and ``"[UNK]"`` too) is itself; any other text is replaced by its first word piece, with
        a warning (``"Paris"`` is ``paris`` in an uncased vocabulary, ``"unbelievable"`` is ``un``). A target that
        holds no token ("" or blanks) is refused: it names nothing to score (transformers leaves it out, warning)."""
        vocab = self.tokenizer.get_vocab()
        ids: dict[int, None] = {}
        for target in [targets] if isinstance(targets, str) else targets:
            if target in vocab:
                ids[vocab[target]] = None
                continue
            pieces = self.tokenizer(target, add_special_tokens=False)["input_ids"]
            if not pieces:
                raise BertkitError(f"fill-mask target {target!r} holds no token, so there is nothing to score: "
                                   "leave it out of targets")
            logger.warning("fill-mask target %r is not a token of the vocabulary: scoring its first piece %r instead "
                           "(as transformers does)", target, self.tokenizer.convert_ids_to_tokens(pieces[0]))
            ids[pieces[0]] = None
        past = [t for t in ids if t >= self.config.vocab_size]
        if past:  # a token added to the tokenizer after the model was saved: the model has no row to score it by
            raise BertkitError(f"fill-mask targets {self.tokenizer.convert_ids_to_tokens(past)} are token ids {past}, "
                               f"past the {self.config.vocab_size} rows of this model's output layer, which scores no "
                               "such token: resize the model's token embeddings to its tokenizer, or leave them out")
        return list(ids)

    def encode(self, item: str, top_k: int | None = None, targets: list[int] | None = None,
               **_: Any) -> list[dict[str, Any]]:
        # rows past the tokenizer's ids hold no token (its ids, not len(tokenizer): a token a vocab.txt lists twice
        # counts once there, and has its last line's id)
        vocab = min(self.config.vocab_size, len(self.tokenizer.ids_to_tokens))
        # the ranking would stop at the vocabulary: fewer than asked, unsaid (targets cap top_k at their number, as
        # transformers' do: the caller named every candidate)
        if top_k is not None and top_k > vocab and targets is None:
            raise BertkitError(f"top_k {top_k} exceeds the {vocab} tokens of this model's vocabulary, every candidate "
                               f"a {self.tokenizer.mask_token} has: ask for top_k {vocab} or fewer")
        enc = self.tokenizer(item, truncation=True, max_length=self.max_length)
        mask = self.tokenizer.mask_token
        masks = [i for i, t in enumerate(enc["input_ids"]) if t == self.tokenizer.mask_token_id]
        cut = 0
        if len(enc["input_ids"]) >= self.max_length:  # the text may have been cut: count its masks whole
            cut = self.tokenizer(item, add_special_tokens=False)["input_ids"].count(self.tokenizer.mask_token_id) \
                - len(masks)
        if cut:  # answered, it would read as the text's only (or first few) masks: the list's shape changes too
            n = len(masks) + cut
            which = f"its only {mask} token" if n == 1 else f"{n} {mask} tokens, {cut} of them"
            positions = self.config.max_position_embeddings
            # at the model's positions already, a larger max_length is refused: shortening is the only fix left
            raise_it = (f", or raise max_length (up to {positions}, the model's positions)"
                        if self.max_length < positions else f" (max_length {self.max_length} is already all of the "
                        f"model's {positions} positions)")
            raise BertkitError(f"fill-mask input {item[:60]!r} has {which} past its first {self.max_length} tokens "
                               f"(max_length), which the model does not read: shorten the text before "
                               f"{'it' if n == 1 else 'them'}{raise_it}")
        if not masks:
            raise BertkitError(f"fill-mask input {item[:60]!r} has no {mask} token; write {mask} where a word should be "
                               "predicted")
        return [{"input_ids": enc["input_ids"], "token_type_ids": segment_ids(enc), "masks": masks}]

    def forward(self, batch: dict[str, Tensor], rows: Sequence[dict[str, Any]]) -> list[np.ndarray]:
        model: BertForMaskedLM = self.model  # type: ignore[assignment]
        out = model.bert(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
        selected = batch["input_ids"] == self.tokenizer.mask_token_id  # (B, T), False at padding
        hidden = out.token_layout.select(out.tokens, selected)  # (M, H): the masked positions, row-major
        probs = torch.softmax(readable(model.cls.predictions(hidden)), -1)  # (M, V)
        counts = [len(r["masks"]) for r in rows]
        return [p.cpu().numpy() for p in probs.split(counts)]

    def decode(self, item: str, rows, outputs, top_k: int = 5, targets: list[int] | None = None,
               **_: Any) -> list[dict[str, Any]] | list[list[dict[str, Any]]]:
        ids, masks, probs = rows[0]["input_ids"], rows[0]["masks"], outputs[0]
        tok = self.tokenizer
        n_ids = len(tok.ids_to_tokens)
        per_mask = []
        for m, p in zip(masks, probs):
            candidates = []
            if targets is None:
                order = np.argsort(-p, kind="stable")
                # rows past the tokenizer's ids (resize_token_embeddings' pad_to_multiple_of) hold no token: no
                # candidate (transformers lists them, token_str ""); the scores stay those of the softmax over every row
                ranking = order[order < n_ids].tolist()
            else:  # the targets' own probabilities (not renormalised among them), best first, ties in token-id order
                ranking = sorted(targets, key=lambda t: (-p[t], t))
            for t in ranking[:top_k]:
                # [PAD] is left out, a candidate [PAD] too, as transformers leaves out its batch's padding. With several
                # masks the other masks stay visible, and so do [CLS] and [SEP], as transformers decodes the sequence
                # then ("[CLS] the cat sat on the [MASK]. [SEP]")
                filled = [x for x in (*ids[:m], t, *ids[m + 1:]) if x != tok.pad_token_id]
                candidates.append({"score": float(p[t]), "token": t,  # a special token shows, as transformers
                                   "token_str": tok.decode([t], skip_special_tokens=False),
                                   "sequence": tok.decode(filled, skip_special_tokens=len(masks) == 1)})
            per_mask.append(candidates)
        return per_mask[0] if len(per_mask) == 1 else per_mask


class TextOrPairPipeline(Pipeline):
    """A pipeline reading one text or a (text, text_pair): a str, a ``(text, text_pair)`` tuple or ``{"text": ...,
    "text_pair": ...}``, encoded as one row ``[CLS] text [SEP] (text_pair [SEP])``."""

    input_kinds = (str, dict, tuple)
    fields = {"text": str, "text_pair": str}
    optional = ("text_pair",)

    def check_input(self, item: Any, index: int | str) -> tuple[str, str | None]:
        if isinstance(item, str):
            refuse_empty_text(self.tokenizer, item, f"{self.task} input {index}")
            return item, None
        if isinstance(item, tuple) and len(item) == 2 and all(isinstance(x, str) for x in item):
            return super().check_input({"text": item[0], "text_pair": item[1]}, index)["text"], item[1]
        if isinstance(item, dict):
            item = super().check_input(item, index)
            return item["text"], item.get("text_pair")
        raise BertkitError(f"{self.task} input {index} is {type(item).__name__} {str(item)[:60]!r}; expected a str, "
                           "a (text, text_pair) tuple or {'text': ..., 'text_pair': ...}")

    def encode(self, item: tuple[str, str | None], truncate: bool = True, truncation_direction: str = "right",
               **_: Any) -> list[dict[str, Any]]:
        """The row, cut at max_length (``truncation_direction`` "left": keeping each text's end, as TEI's "Left");
        ``truncate=False`` keeps it whole (the server refuses it when too long)."""
        if truncate and truncation_direction.lower() == "left":
            return [left_truncated(self.tokenizer, item[0], item[1], self.max_length)]
        enc = self.tokenizer(item[0], item[1], truncation=truncate, max_length=self.max_length if truncate else None)
        return [{"input_ids": enc["input_ids"], "token_type_ids": segment_ids(enc)}]


class TextClassificationPipeline(TextOrPairPipeline):
    """A text or a pair -> ``{"label", "score", "scores"}`` (softmax per label name, from the config's
    ``id2label``); multi-label models give sigmoid ``scores`` and the ``labels`` above 0.5; regression
    models give ``{"value"}`` for one output (e.g. STS-B) and ``{"values"}``, each output's by label name, for
    several (transformers' regression answers every output)."""

    task = tasks.TextClassification.name
    model_class = BertForSequenceClassification
    required_keys = ("pooler.dense.weight", "classifier.weight")  # the classifier reads the pooler
    instead_of = {
        "top_k": "every label's probability is in the result's \"scores\" (by label name)",
        "return_all_scores": "every label's probability is in the result's \"scores\" (by label name)",
        "function_to_apply": "the config's problem_type picks it: softmax (single-label), sigmoid (multi-label, "
                             "\"labels\" above 0.5), none (regression: \"value\")"}

    def __init__(self, model, tokenizer, **kwargs: Any):
        names = tasks.label_names(model.config)
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:  # the scores are keyed by name: one label's would overwrite the other's
            ids = {n: [i for i, m in enumerate(names) if m == n] for n in twice}
            alike = "; ".join(f"{n!r} names ids {v}" for n, v in ids.items())
            raise BertkitError(f"this model's id2label gives several labels one name ({alike}), so their scores, keyed "
                               "by name, would be one; give each id its own name in config.json's id2label (and "
                               "label2id)")
        super().__init__(model, tokenizer, **kwargs)

    @classmethod
    def from_pretrained(cls, model_dir: str | Path, **kwargs: Any) -> Pipeline:
        """A cross-encoder directory's pairs are cut at the max_seq_length its sentence_bert_config.json declares, else
        the tokenizer's model_max_length (``max_length`` given wins): where its ``CrossEncoder`` cuts them, and where TEI
        does, which reads that file without a modules.json too (sentence-transformers and ``CrossEncoder`` do not).
        What its ``CrossEncoder`` refuses (the file's do_lower_case, a default prompt) is refused here too, for
        text-classification as for rerank: read as a classifier, the directory was scored without them, unsaid."""
        declared = cross_encoder_max_seq_length(Path(model_dir))  # whether or not max_length is given: it refuses
        if kwargs.get("max_length") is None:
            kwargs["max_length"] = declared
        return super().from_pretrained(model_dir, **kwargs)

    def decode(self, item, rows, outputs, **_: Any) -> dict[str, Any]:
        logits = outputs[0]
        kind = self.config.problem_type or ("regression" if self.config.num_labels == 1
                                            else "single_label_classification")
        names = tasks.label_names(self.config)
        if kind == "regression":
            values = [float(v) for v in logits]
            return {"value": values[0]} if len(values) == 1 else {"values": dict(zip(names, values))}
        if kind == "multi_label_classification":
            p = scored(logits, "sigmoid")
            return {"labels": [n for n, s in zip(names, p) if s > 0.5], "scores": dict(zip(names, map(float, p)))}
        p = scored(logits)
        best = int(np.argmax(p))
        return {"label": names[best], "score": float(p[best]), "scores": dict(zip(names, map(float, p)))}


# Label names of a two-label head, (relevant, not relevant): bertkit's own QNLI/RTE recipe (id2label
# entailment / not_entailment, so label 0 is the relevant one), its MRPC/QQP recipe ("1": paraphrase, duplicate),
# transformers' default names, and the names a cross-encoder is given. Any other pair is refused, not guessed.
_RELEVANCE_NAMES = (("entailment", "not_entailment"), ("1", "0"), ("label_1", "label_0"), ("relevant", "irrelevant"),
                    ("relevant", "not_relevant"))


def relevant_label(config) -> int | None:
    """The index of a two-label cross-encoder's "relevant" label, read from its label names (``id2label``);
    None for one logit. Refuses a head whose names do not say which label is relevant (``positive`` /
    ``negative``, three labels, ...): ranking by the wrong one puts the least relevant texts first."""
    if config.num_labels == 1:
        return None
    if config.num_labels != 2:
        raise BertkitError(f"rerank needs a cross-encoder with one logit or two labels; this model has "
                           f"{config.num_labels} labels: serve it as text-classification")
    names = tasks.label_names(config)
    lower = [n.lower() for n in names]
    for yes, no in _RELEVANCE_NAMES:
        if lower in ([yes, no], [no, yes]):
            return lower.index(yes)
    raise BertkitError(f"rerank cannot tell which of this model's two labels {names} is the relevant one: name them "
                       f"(id2label in its config.json) "
                       f"{{0: \"irrelevant\", 1: \"relevant\"}} (or entailment / not_entailment, as bertkit's QNLI "
                       "recipe does), or serve it as text-classification")


def ranked(logits: Sequence[np.ndarray], relevant: int | None, texts: Sequence[str], raw_scores: bool,
           return_text: bool) -> list[dict[str, Any]]:
    """A cross-encoder's texts by relevance, best first: ``[{"index", "score"}, ...]`` (``"text"`` too with
    ``return_text``), as TEI's /rerank answers; ``logits`` are each (query, text) pair's.

    One logit (``relevant`` None): its sigmoid (TEI's /rerank, sentence-transformers' CrossEncoder). Two labels:
    the probability of label ``relevant`` (``relevant_label``), softmax over the two, which is the sigmoid of
    l_relevant - l_other (TEI refuses /rerank on a two-label model, typing it a classifier). ``raw_scores``: the
    logit, or that difference for two labels, so that raw and probability scores rank alike.

    As TEI: the sigmoid in float32 (logits above ~17 all score 1.0 and tie), and equal scores last index first (it
    sorts ascending, stably, then reverses; sentence-transformers' rank keeps them first index first)."""
    x = np.stack([np.asarray(v, dtype=np.float32).reshape(-1) for v in logits])  # (N, labels)
    z = x[:, 0] if relevant is None else x[:, relevant] - x[:, 1 - relevant]
    with np.errstate(over="ignore"):  # exp(-z) of a logit below ~-88 is inf in float32: the score 0, as in TEI
        scores = z if raw_scores else (1 / (1 + np.exp(-z))).astype(np.float32)
    order = sorted(range(len(scores)), key=lambda i: scores[i])[::-1]
    return [{"index": i, "score": float(scores[i]), **({"text": texts[i]} if return_text else {})} for i in order]


class RerankPipeline(TextClassificationPipeline):
    """A query and texts -> the texts ranked by relevance, ``[{"index", "score"}, ...]`` best first (``"text"``
    too with ``return_text=True``), as TEI's /rerank answers. The model is a cross-encoder: a sequence
    classifier over (query, text) with one logit or two labels named as ``relevant_label`` reads them, scored by
    ``ranked``.

        rank = bertkit.pipeline("rerank", "my_cross_encoder")
        rank({"query": "What is Paris?", "texts": ["Paris is the capital of France.", "Berlin is in Germany."]})
    """

    task = tasks.Rerank.name
    fields = {"query": str, "texts": list}
    optional = ()
    call_options = (Option("raw_scores", BOOL), Option("return_text", BOOL))

    def __init__(self, model, tokenizer, **kwargs: Any):
        self.relevant = relevant_label(model.config)
        super().__init__(model, tokenizer, **kwargs)

    @classmethod
    def from_pretrained(cls, model_dir: str | Path, **kwargs: Any) -> Pipeline:
        pipe = super().from_pretrained(model_dir, **kwargs)
        named = saved_activation(Path(model_dir), pipe.model.config.extra)
        if pipe.relevant is None and named and named.rsplit(".", 1)[-1] != "Sigmoid":
            # TEI's /rerank scores a one-logit model by its sigmoid whatever the directory names; its CrossEncoder
            # does not, so the two would give other numbers for the same pair without a word
            logger.warning("%s names the activation %s (the scores of its CrossEncoder's predict and rank); the "
                           "rerank pipeline and bertkit serve's /rerank score by the sigmoid of the logit, as TEI "
                           "does; for the logit itself pass raw_scores=True to the pipeline, --raw-scores to "
                           "bertkit predict rerank, or send \"raw_scores\": true to /rerank", model_dir, named)
        return pipe

    def check_input(self, item: Any, index: int) -> dict:
        return Pipeline.check_input(self, item, index)

    def encode(self, item: dict, truncation_direction: str = "right", **_: Any) -> list[dict[str, Any]]:
        return [row for text in item["texts"]
                for row in TextOrPairPipeline.encode(self, (item["query"], text),
                                                     truncation_direction=truncation_direction)]

    def decode(self, item: dict, rows, outputs, raw_scores: bool = False, return_text: bool = False,
               **_: Any) -> list[dict[str, Any]]:
        return ranked(outputs, self.relevant, item["texts"], raw_scores, return_text)


class QuestionAnsweringPipeline(Pipeline):
    """``{"question", "context"}`` -> ``{"answer", "start", "end", "score", "nbest"}``.

    Contexts of any length: ``tasks.squad.featurize_squad`` cuts them into windows of ``max_length``
    tokens, 128 tokens apart as the recipe's (run_squad.py's ``doc_stride``, a step), or, given ``doc_stride``, as
    transformers' pipeline and the Inference API mean it: consecutive windows share that many context tokens (the
    tokenizer's ``stride``). Then ``postprocess_predictions`` picks the best span over all windows (each
    token scored in the window where it has most context), exactly as the SQuAD recipe is scored. ``score``
    is the answer's probability among the n-best candidates; ``start``/``end`` are character offsets into
    the context (``context[start:end] == answer``). With ``allow_no_answer=True`` (SQuAD 2.0 models) the
    answer is ``""`` with ``start``/``end`` None when the null score beats the best span by more than
    ``null_threshold``. ``top_k`` returns the first of the ``n_best_size`` (20, run_squad.py's) candidates, so it
    changes neither the answer nor a score.
    """

    task = tasks.QuestionAnswering.name
    model_class = BertForQuestionAnswering
    required_keys = ("qa_outputs.weight",)
    fields = {"question": str, "context": str}
    n_best_size = 20  # the recipe's candidates per question: spans among each window's 20 best starts and ends
    # more top_k would change which spans compete, so the answer and scores; a question cut to 0 or -1 tokens, spans
    # of 0: quietly wrong answers. The wire names are transformers' (bertkit serve takes them, as the API sends them).
    call_options = (
        Option("top_k", int_in(1, n_best_size, " (the SQuAD recipe's n-best size)")),
        # below a window's context tokens (squad.stride_for_overlap). serve keeps its own range, [1, max_length], here
        # and for max_answer_len; the pipeline takes a doc_stride of 0 and any max_answer_length, as transformers' does
        Option("doc_stride", or_none(int_in(0)), served=lambda pipe: int_in(1, pipe.max_length, " (at most max_length)")),
        Option("max_question_length", lambda pipe: int_in(1) if pipe is None else
               int_in(1, pipe.max_length - 4, " (max_length - 4 leaves the context room)"),
               "max_question_len", "N, the same cut of the question's tokens"),
        Option("max_answer_length", int_in(1), "max_answer_len", "N, the same limit on an answer's tokens",
               lambda pipe: int_in(1, pipe.max_length, " (at most max_length)")),
        Option("allow_no_answer", BOOL, "handle_impossible_answer", "True: \"\" when the null score beats the best "
               "span (the SQuAD 2.0 recipe's rule; null_threshold moves the bar)"),
        Option("null_threshold", FINITE))  # NaN would never predict "no answer" (score_diff > nan is False)
    instead_of = {"align_to_words": "answers are the token span the SQuAD recipe scores (transformers' "
                                    "align_to_words=False); bertkit serve widens them to whole words, as the Inference "
                                    "API does"}

    def _example(self, item: dict) -> squad.SquadExample:
        return squad.SquadExample(qas_id="q", title="", question=item["question"], context=item["context"],
                                  answers=())

    @classmethod
    def check_options(cls, options: Mapping[str, Any], pipe: Pipeline | None = None) -> None:
        super().check_options(options, pipe)
        if "null_threshold" in options and not options.get("allow_no_answer", False):
            # without it every question gets a span: the threshold would change nothing, without a word
            raise BertkitError(f"null_threshold {options['null_threshold']!r} sets when to predict no answer, which "
                               "only allow_no_answer=True (SQuAD 2.0) does: pass allow_no_answer=True, or drop "
                               "null_threshold")

    def window_step(self, question: str, doc_stride: int | None, max_question_length: int) -> int:
        """run_squad.py's step between window starts: the recipe's 128, or the step whose windows share
        ``doc_stride`` context tokens (transformers' meaning of the name)."""
        if doc_stride is None:
            return 128
        return squad.stride_for_overlap(question, self.tokenizer, max_seq_length=self.max_length,
                                        max_query_length=max_question_length, overlap=doc_stride)

    def encode(self, item: dict, doc_stride: int | None = None, max_question_length: int = 64, **_: Any) -> list[dict]:
        step = self.window_step(item["question"], doc_stride, max_question_length)
        return squad.featurize_squad([self._example(item)], self.tokenizer, max_seq_length=self.max_length,
                                     doc_stride=step, max_query_length=max_question_length)

    def forward(self, batch, rows) -> list[np.ndarray]:
        out = self.model(**batch)
        return per_row(torch.stack([out.start_logits, out.end_logits], -1), rows)  # (T, 2) each

    def decode(self, item: dict, rows, outputs, top_k: int = 1, max_answer_length: int = 30,
               allow_no_answer: bool = False, null_threshold: float = 0.0, **_: Any) -> dict[str, Any]:
        preds = squad.postprocess_predictions(
            [self._example(item)], rows, [o[:, 0] for o in outputs], [o[:, 1] for o in outputs],
            n_best_size=self.n_best_size, max_answer_length=max_answer_length,
            version_2_with_negative=allow_no_answer, null_score_diff_threshold=null_threshold)
        nbest = [{"answer": e["text"] if span else "", "start": span[0] if span else None,
                  "end": span[1] if span else None, "score": float(e["probability"])}
                 for e, span in zip(preds.nbest["q"], preds.spans["q"])
                 if span is not None or e["text"] == ""]  # the "empty" placeholders are not answers
        answer = preds.predictions["q"]
        best = next((n for n in nbest if n["answer"] == answer and (answer or n["start"] is None)), None)
        if best is None:  # no span fits at all (an empty context)
            best = {"answer": "", "start": None, "end": None, "score": 0.0}
        return {**best, "nbest": nbest[:top_k]}


class MultipleChoicePipeline(Pipeline):
    """``{"context", "choices": [...]}`` -> ``{"choice", "text", "score", "scores"}``: each choice scored as
    ``[CLS] context [SEP] choice [SEP]`` (SWAG, paper section 4.4), softmax over the choices."""

    task = tasks.MultipleChoice.name
    model_class = BertForMultipleChoice
    required_keys = ("pooler.dense.weight", "classifier.weight")  # as text-classification's
    fields = {"context": str, "choices": list}

    def encode(self, item: dict, **_: Any) -> list[dict[str, Any]]:
        n = len(item["choices"])
        enc = self.tokenizer([item["context"]] * n, item["choices"], truncation="longest_first",
                             max_length=self.max_length)
        return [{"input_ids": enc["input_ids"], "token_type_ids": segment_ids(enc)}]

    def decode(self, item: dict, rows, outputs, **_: Any) -> dict[str, Any]:
        p = scored(outputs[0])
        best = int(np.argmax(p))
        return {"choice": best, "text": item["choices"][best], "score": float(p[best]), "scores": p.tolist()}
