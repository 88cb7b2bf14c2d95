"""The token-classification pipeline (``bertkit.pipeline("ner", ...)``): word tags from a token classifier, entity
spans grouped from them, and the windows of a text longer than ``max_length`` put back together; its shared parts
(batching, order, checks) are ``base.Pipeline``'s.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from bertkit.errors import BertkitError
from bertkit.heads import BertForTokenClassification
from bertkit.inference import tasks
from bertkit.inference.base import Pipeline, scored
from bertkit.inference.options import Option, Rule, int_in, or_none
from bertkit.inference.pipelines import per_row
from bertkit.tokenization.encoding import segment_ids

# A tag's prefix in any case, as BIOES's: BILOU's L(ast) and U(nit) are BIOES's E(nd) and S(ingle).
_PREFIXES = {"B": "B", "I": "I", "E": "E", "S": "S", "L": "E", "U": "S"}


def _split_tag(tag: str) -> tuple[str, str | None]:
    """("B", "PER") from "B-PER" (and "b-per" gives ("B", "per"), "U-PER" ("S", "PER")); ("O", None) from "O"; a tag
    without a prefix is its own type ("I")."""
    if tag == "O":
        return "O", None
    if len(tag) > 2 and tag[1] in "-_" and tag[0].upper() in _PREFIXES:
        return _PREFIXES[tag[0].upper()], tag[2:]
    return "I", tag


def group_entities(words: Sequence[dict[str, Any]], text: str, outside: bool = False) -> list[dict[str, Any]]:
    """Word tags -> entity spans. IOB2, IOB1, BIOES and BILOU all read right, prefixes in either case: an entity
    starts at B/S (U), at a type change, or after O, and ends before O, B or S, at E (L), or at a type change; its
    score is the mean of its words' scores and ``word`` the exact input substring from its first word's start to its last's end.
    ``outside``: each run of words tagged O is a group of type "O" too (transformers' pipeline with an
    ``ignore_labels`` that leaves out "O")."""
    groups: list[tuple[str, list[dict[str, Any]]]] = []  # (type, its words), one per entity
    inside = False
    for w in words:
        prefix, kind = _split_tag(w["tag"])
        if kind is None and outside:
            prefix, kind = "I", "O"
        elif kind is None:
            inside = False
            continue
        if not inside or prefix in "BS" or kind != groups[-1][0]:
            groups.append((kind, []))
        groups[-1][1].append(w)
        inside = prefix not in "ES"
    return [{"entity_group": kind, "score": float(np.mean([w["score"] for w in ws])),
             "word": text[ws[0]["start"]:ws[-1]["end"]], "start": ws[0]["start"], "end": ws[-1]["end"]}
            for kind, ws in groups]


def keep_longest(spans: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Spans of overlapping windows (``start``, ``end``, ``score``) -> one per place, in text order: of two that
    overlap, the longer, or the surer of two of one length, the first on a tie (transformers'
    ``aggregate_overlapping_entities``: a word cut at a window's edge loses to the whole word in the window before)."""
    kept: list[dict[str, Any]] = []
    for span in sorted(spans, key=lambda x: x["start"]):
        last = kept[-1] if kept else None
        if last is None or not last["start"] <= span["start"] < last["end"]:
            kept.append(span)
        elif (span["end"] - span["start"], span["score"]) > (last["end"] - last["start"], last["score"]):
            kept[-1] = span
    return kept


def _words(item: Any, index: int) -> Sequence[str]:
    """``item``, an is_split_into_words input read from an iterator: a non-empty list of words (str)."""
    if isinstance(item, (list, tuple)) and item and all(isinstance(w, str) for w in item):
        return item
    raise BertkitError(f"with is_split_into_words=True an input is a non-empty list of words (str); input {index} is "
                       f"{type(item).__name__} {str(item)[:60]!r}")


def _label_names_rule(config: Any) -> Rule:
    """What ``ignore_labels`` may name for a model of ``config``: its tags, the entity types they make as
    ``group_entities`` reads them (B-PER, B_PER, S-PER: PER) and "O", transformers' default, whatever the tags."""
    tags = tasks.label_names(config)
    names = {"O", *tags, *(e["entity_group"] for t in tags for e in
                           group_entities([{"tag": t, "score": 0.0, "start": 0, "end": 0}], "", outside=True))}
    return (lambda v: isinstance(v, (list, tuple)) and all(isinstance(x, str) and x in names for x in v),
            f"a list of this model's label names ({', '.join(sorted(names))})")


class TokenClassificationPipeline(Pipeline):
    """A text -> ``{"words": [...], "entities": [...]}``.

    Words are WordPiece words (a token and its ``##`` continuations: whitespace and punctuation split
    them, as BERT's basic tokenizer does); each gets the tag of its first piece (how bertkit and the paper,
    section 5.3, train NER) with that tag's softmax probability, and ``start``/``end`` character offsets
    into the input, so ``text[start:end]`` is the word exactly as written; ``aggregation_strategy`` "average" (the mean
    of its pieces' probabilities) or "max" (its surest piece's tag), as transformers', changes how a word of several
    pieces is tagged. Entities group the word tags
    (``group_entities``). Text past ``max_length`` tokens is cut off and tagged no further, unless ``stride`` is given:
    then, as transformers' ``stride``, the text is read in windows of ``max_length`` tokens that share ``stride``
    tokens, each window's words and entities are made alone, and where two overlap the longer is kept (the surer one
    between two of one length: ``keep_longest``).
    """

    task = tasks.TokenClassification.name
    model_class = BertForTokenClassification
    required_keys = ("classifier.weight",)
    # transformers' strategies that give a word one tag, each as a function of the word's pieces' probabilities (T, L)
    word_strategies = {"first": lambda p: p[0], "average": lambda p: p.mean(0),
                       "max": lambda p: p[int(np.argmax(p.max(1)))]}  # the piece surest of its tag, the first on a tie
    call_options = (
        # "none" and "simple" tag each piece on its own: a word can be cut in two, so no "words" to give; a name in any
        # case, as transformers reads it ("FIRST", its AggregationStrategy.FIRST)
        Option("aggregation_strategy", (
            lambda v, known=tuple(word_strategies): isinstance(v, str) and v.lower() in known,
            " or ".join(f'"{s}"' for s in word_strategies) + " (how a word of several pieces is tagged; bertkit tags "
            "words: \"first\", the default, as NER models are trained; \"none\" and \"simple\" tag each piece on its own)")),
        # windows that never advance, whatever the texts' lengths, at or past a window's tokens besides [CLS] and [SEP]
        Option("stride", lambda pipe: or_none(int_in(0, pipe.max_length - 3 if pipe else math.inf,
                                                     " (the tokens consecutive windows share, below max_length - 2)")),
               # the pipeline's windows would cost more model sequences than a request is counted for
               served=(lambda v: False, "left out: bertkit serve tags a text's first max_length tokens (send a long "
                                        "text in parts; bertkit.pipeline takes stride)")),
        # a misspelt name would leave out nothing, without a word
        Option("ignore_labels", lambda pipe: None if pipe is None else or_none(_label_names_rule(pipe.config))))

    def read_options(self, options: dict[str, Any]) -> dict[str, Any]:
        options = super().read_options(options)
        if "aggregation_strategy" not in options:
            return options
        return {**options, "aggregation_strategy": options["aggregation_strategy"].lower()}

    def __call__(self, inputs: Any = None, *, is_split_into_words: bool = False, delimiter: str | None = None,
                 **options: Any) -> Any:
        """As transformers' ``is_split_into_words=True``: a list of words is one input, a list of such lists several,
        each read as its words joined by ``delimiter`` (default " "), into which the offsets point. BERT's tokenizer
        splits at whitespace whatever the words, so the joined text gives the words, tags and entities of the words
        tokenized one by one."""
        if not isinstance(is_split_into_words, bool):
            raise BertkitError(f"is_split_into_words must be True or False, got {is_split_into_words!r}")
        if delimiter is not None and not is_split_into_words:
            raise BertkitError("delimiter joins the words of is_split_into_words=True inputs; pass that too, or leave "
                               "delimiter out")
        if not is_split_into_words:
            return super().__call__(inputs, **options)
        delimiter = " " if delimiter is None else delimiter
        if not isinstance(delimiter, str) or not delimiter.isspace():  # another would join words into one
            raise BertkitError(f"delimiter must be whitespace (BERT's tokenizer splits words there), got {delimiter!r}")

        def is_words(x: Any) -> bool:
            return isinstance(x, (list, tuple)) and bool(x) and all(isinstance(w, str) for w in x)

        if is_words(inputs):
            return super().__call__(delimiter.join(inputs), **options)
        if isinstance(inputs, (list, tuple)) and inputs and all(map(is_words, inputs)):
            return super().__call__([delimiter.join(words) for words in inputs], **options)
        if isinstance(inputs, Iterator):  # streamed, as any iterator is: each list of words joined as it is read
            return super().__call__((delimiter.join(_words(x, i)) for i, x in enumerate(inputs)), **options)
        raise BertkitError(f"with is_split_into_words=True an input is a non-empty list of words (str), or a list of "
                           f"such lists; got {type(inputs).__name__} {str(inputs)[:60]!r}")

    def encode(self, item: str, stride: int | None = None, **_: Any) -> list[dict[str, Any]]:
        """One row: the text's first max_length tokens; with ``stride``, one per window of the whole text."""
        windows = {} if stride is None else {"stride": stride, "return_overflowing_tokens": True}
        enc = self.tokenizer(item, truncation=True, max_length=self.max_length, return_offsets_mapping=True,
                             return_special_tokens_mask=True, **windows)
        enc["token_type_ids"] = segment_ids(enc)  # zeros where the tokenizer's model_input_names leaves them out
        keys = ("input_ids", "token_type_ids", "offset_mapping", "special_tokens_mask")
        per_window = zip(*(enc[k] for k in keys)) if windows else [tuple(enc[k] for k in keys)]
        return [{"input_ids": ids, "token_type_ids": types, "offsets": offsets, "special": special}
                for ids, types, offsets, special in per_window]

    def forward(self, batch, rows) -> list[np.ndarray]:
        return per_row(self.model(**batch).logits, rows)

    def decode(self, item: str, rows, outputs, aggregation_strategy: str = "first",
               ignore_labels: Sequence[str] = ("O",), **_: Any) -> dict[str, Any]:
        windows = [self._tagged(item, row, logits, aggregation_strategy, set(ignore_labels))
                   for row, logits in zip(rows, outputs)]
        if len(windows) == 1:
            return windows[0]
        return {k: keep_longest([x for w in windows for x in w[k]]) for k in ("words", "entities")}

    def _tagged(self, item: str, row: dict[str, Any], logits: np.ndarray, aggregation_strategy: str,
                ignore: set[str]) -> dict[str, Any]:
        """One window's words and entities: those of the types not in ``ignore``, the runs of words tagged O as
        entities of type "O" too when "O" is not in it (transformers' ``ignore_labels``)."""
        names = tasks.label_names(self.config)
        probs = scored(logits)
        pieces = self.tokenizer.convert_ids_to_tokens(row["input_ids"])
        spans: list[list[int]] = []  # each word's pieces (their row indices)
        for i, (piece, special) in enumerate(zip(pieces, row["special"])):
            if special:
                continue
            # one word even where a dropped character (a zero-width space, a combining accent) lies between pieces
            if piece.startswith("##") and spans:
                spans[-1].append(i)
            else:
                spans.append([i])
        tag_of = self.word_strategies[aggregation_strategy]
        words: list[dict[str, Any]] = []
        for span in spans:
            p = tag_of(probs[span])  # (L,)
            best = int(np.argmax(p))
            s, e = row["offsets"][span[0]][0], row["offsets"][span[-1]][1]
            words.append({"word": item[s:e], "start": s, "end": e, "tag": names[best], "score": float(p[best])})
        entities = group_entities(words, item, outside="O" not in ignore)
        return {"words": words, "entities": [e for e in entities if e["entity_group"] not in ignore]}
