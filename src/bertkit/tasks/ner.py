"""CoNLL-2003 named-entity recognition: read, convert tag schemes, featurize, score like conlleval.

Labels go on the first WordPiece of each word, -100 elsewhere (Devlin et al. 2018, section 5.3), and
predictions are read back there. Long sentences are split at word boundaries into windows, not truncated
(truncation would count the tail's entities as missed). Scoring ports the conlleval Perl script (version
2004-01-26) chunk by chunk, its overall and per-type precision/recall/F1 in percent.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from bertkit.errors import BertkitError, MissingFileError
from bertkit.heads import IGNORE_INDEX
from bertkit.outputs import atomic_write
from bertkit.tasks.files import read_lines


@dataclass(frozen=True)
class NerSentence:
    words: tuple[str, ...]
    tags: tuple[str, ...]  # IOB2 after reading, whatever the file's scheme
    line: int  # 1-based line of the first word in the source file


def _split_tag(tag: str) -> tuple[str, str]:
    """conlleval's split: "B-PER" -> ("B", "PER"); "O" -> ("O", ""); hyphens may occur in the type."""
    prefix, sep, kind = tag.partition("-")
    return (prefix, kind) if sep else (tag, "")


def is_tag(tag: str) -> bool:
    """``O``, ``B-TYPE`` or ``I-TYPE``: a tag conlleval reads as outside or in an entity."""
    prefix, kind = _split_tag(tag)
    return tag == "O" or (prefix in ("B", "I") and bool(kind))


def iob1_to_iob2(tags: Sequence[str]) -> list[str]:
    """IOB1 (B- only between adjacent same-type entities) -> IOB2: an ``I-X`` after ``O`` or another type is ``B-X``."""
    out, prev = [], "O"
    for tag in tags:
        prefix, kind = _split_tag(tag)
        if prefix == "I" and (prev == "O" or _split_tag(prev)[1] != kind):
            tag = f"B-{kind}"
        out.append(tag)
        prev = tag
    return out


def read_conll(path: str | os.PathLike, tag_scheme: Literal["iob1", "iob2"] = "iob2") -> list[NerSentence]:
    """Read a CoNLL file: ``word ... tag`` per token line (split at spaces and tabs), blank lines between
    sentences, ``-DOCSTART-`` skipped. IOB1 is converted to IOB2; in an IOB2 file an ``I-X`` that starts an
    entity is an error naming the line (the file is likely IOB1, as the original 2003 release)."""
    path = Path(path)
    if tag_scheme not in ("iob1", "iob2"):
        raise BertkitError(f"tag_scheme {tag_scheme!r} must be 'iob1' or 'iob2'")
    if not path.is_file():
        raise MissingFileError(f"CoNLL file not found: {path}")
    sentences: list[NerSentence] = []
    words: list[str] = []
    tags: list[str] = []
    lines: list[int] = []
    n_columns = None

    def flush() -> None:
        if not words:
            return
        sentences.append(_sentence(path, words, tags, lines, tag_scheme))
        words.clear()
        tags.clear()
        lines.clear()

    for lineno, raw in read_lines(path):
        # Columns are split at spaces and tabs only, as conll2003's reader splits at spaces: a word may hold other
        # whitespace (a no-break space in "10\u00a0000"), which str.split() would take for a column break.
        cols = [c for c in raw.replace("\t", " ").split(" ") if c]
        if not cols or cols[0] == "-DOCSTART-":  # a sentence ends at a blank line and at a document's start
            flush()
            continue
        n_columns = _check_token_line(path, lineno, raw, cols, n_columns)
        words.append(cols[0])
        tags.append(cols[-1])
        lines.append(lineno)
    flush()
    if not sentences:
        raise BertkitError(f"{path} holds no sentences (an empty CoNLL file); every split must have some")
    return sentences


def _check_token_line(path: Path, lineno: int, raw: str, cols: list[str], n_columns: int | None) -> int:
    """The file's column count (the first token line's, at least two), once this line has it and ends in a tag."""
    if n_columns is None:
        if len(cols) < 2:
            raise BertkitError(
                f"malformed line in {path} line {lineno}: expected 'word ... tag', got {raw!r}"
            )
        n_columns = len(cols)
    elif len(cols) != n_columns:
        raise BertkitError(
            f"malformed line in {path} line {lineno}: expected {n_columns} space-separated "
            f"columns like the first token line, got {len(cols)}"
        )
    if not is_tag(cols[-1]):
        raise BertkitError(
            f"malformed line in {path} line {lineno}: tag {cols[-1]!r} is not O, B-TYPE or I-TYPE"
        )
    return n_columns


def _sentence(path: Path, words: list[str], tags: list[str], lines: list[int], tag_scheme: str) -> NerSentence:
    """One sentence with its tags in IOB2: converted from IOB1, or checked to be valid IOB2."""
    fixed = iob1_to_iob2(tags)
    if tag_scheme == "iob2" and fixed != tags:  # an I-X that starts an entity
        bad = next(i for i, (tag, iob2) in enumerate(zip(tags, fixed)) if tag != iob2)
        raise BertkitError(
            f"{path} line {lines[bad]}: tag {tags[bad]!r} follows {tags[bad - 1] if bad else 'O'!r}, "
            "which is not valid IOB2 (every entity starts with B-); if the file is IOB1, "
            "pass --tag-scheme iob1 (tag_scheme='iob1' from Python)"
        )
    return NerSentence(tuple(words), tuple(fixed), lines[0])


def label_list(sentences: Sequence[NerSentence]) -> list[str]:
    """The IOB2 tag set of the entity types seen: "O" first, then by type, B- before I- (both for every type,
    even one seen only as B-), so label indices mean the same on every run."""
    types = sorted({_split_tag(t)[1] for s in sentences for t in s.tags if t != "O"})
    return ["O", *(f"{p}-{t}" for t in types for p in ("B", "I"))]


def training_labels(sentences: Sequence[NerSentence], path: str | os.PathLike) -> list[str]:
    """``label_list`` of the training file ``path``, refused when it holds no entity: a tagger whose one label is "O"
    scores it with probability 1, so its loss is 0 at every step and it learns nothing (a file whose last column is
    not its tags, or whose tags were all lost in an export)."""
    labels = label_list(sentences)
    if len(labels) < 2:
        raise BertkitError(f"{path}: every tag of its {len(sentences)} sentences is O, so there is no entity type to "
                           "learn (a tagger of the one label O has a loss of 0 at every step); the tag is read from "
                           "each line's last column: check that it holds the NER tags (B-PER, I-LOC, ...)")
    return labels


def featurize_ner(
    sentences: Sequence[NerSentence], tokenizer: Any, labels: Sequence[str], max_seq_length: int = 128
) -> list[dict[str, Any]]:
    """One unpadded ``[CLS] pieces [SEP]`` feature per window of a sentence, with ``labels`` and, for
    `align_predictions`, ``sentence_index``, ``num_words`` and ``word_ids`` (on first pieces). A word
    WordPiece turns into nothing gets one ``[UNK]``, so it still gets a tag."""
    if max_seq_length < 3:
        raise BertkitError(f"max_seq_length {max_seq_length} leaves no room for a word; use at least 3")
    label_to_id = {label: i for i, label in enumerate(labels)}
    room = max_seq_length - 2
    unk = tokenizer.unk_token_id
    pieces_of: dict[str, list[int]] = {}  # CoNLL-2003 train: 204k words, 24k distinct
    features: list[dict[str, Any]] = []

    def emit(sent_index: int, ids: list[int], lab: list[int], wids: list[int | None]) -> None:
        input_ids = [tokenizer.cls_token_id, *ids, tokenizer.sep_token_id]
        features.append(
            {
                "input_ids": input_ids,
                "token_type_ids": [0] * len(input_ids),
                "attention_mask": [1] * len(input_ids),
                "labels": [IGNORE_INDEX, *lab, IGNORE_INDEX],
                "sentence_index": sent_index,
                "num_words": len(sentences[sent_index].words),
                "word_ids": [None, *wids, None],
            }
        )

    for si, sent in enumerate(sentences):
        ids: list[int] = []
        lab: list[int] = []
        wids: list[int | None] = []
        for wi, (word, tag) in enumerate(zip(sent.words, sent.tags, strict=True)):
            if tag not in label_to_id:
                raise BertkitError(
                    f"tag {tag!r} (sentence at line {sent.line}) is not in the label list {list(labels)}; "
                    "build the list from the training data with label_list()"
                )
            if word not in pieces_of:
                pieces_of[word] = (tokenizer.convert_tokens_to_ids(tokenizer.tokenize(word)) or [unk])[:room]
            pieces = pieces_of[word]
            if len(ids) + len(pieces) > room:
                emit(si, ids, lab, wids)
                ids, lab, wids = [], [], []
            ids += pieces
            lab += [label_to_id[tag]] + [IGNORE_INDEX] * (len(pieces) - 1)
            wids += [wi] + [None] * (len(pieces) - 1)
        emit(si, ids, lab, wids)
    return features


def align_predictions(
    features: Sequence[Mapping[str, Any]],
    predictions: Sequence[Sequence[int]],
    labels: Sequence[str],
    num_sentences: int | None = None,
) -> list[list[str]]:
    """Per-token predicted label indices (a row per feature) -> one tag list per sentence, windows stitched."""
    if len(features) != len(predictions):
        raise BertkitError(
            f"{len(features)} features but {len(predictions)} prediction rows; pass one per feature"
        )
    by_sentence: dict[int, dict[int, str]] = {}
    num_words: dict[int, int] = {}
    for f, row in zip(features, predictions, strict=True):
        words = by_sentence.setdefault(f["sentence_index"], {})
        num_words[f["sentence_index"]] = f["num_words"]
        for pos, wi in enumerate(f["word_ids"]):
            if wi is not None:
                words[wi] = labels[int(row[pos])]
    n = num_sentences if num_sentences is not None else max(by_sentence, default=-1) + 1
    out = []
    for si in range(n):
        words = by_sentence.get(si)
        if not words or len(words) != num_words[si]:
            raise BertkitError(f"features do not cover every word of sentence {si}; pass all of its features")
        out.append([words[i] for i in range(len(words))])
    return out


# ---------------------------------------------------------------- conlleval


def _end_of_chunk(prev_tag: str, tag: str, prev_type: str, type_: str) -> bool:
    """conlleval ``endOfChunk``: did a chunk end between the previous word and this one?"""
    return (
        (prev_tag, tag)
        in {("B", "B"), ("B", "O"), ("I", "B"), ("I", "O"), ("E", "E"), ("E", "I"), ("E", "O")}
        or (prev_tag not in ("O", ".") and prev_type != type_)
        or prev_tag in ("]", "[")
    )


def _start_of_chunk(prev_tag: str, tag: str, prev_type: str, type_: str) -> bool:
    """conlleval ``startOfChunk``: did a chunk start at this word? (I- after O, or after another
    type, starts one: how conlleval reads IOB1 and ill-formed IOB2 alike.)"""
    return (
        (prev_tag, tag)
        in {("B", "B"), ("I", "B"), ("O", "B"), ("O", "I"), ("E", "E"), ("E", "I"), ("O", "E")}
        or (tag not in ("O", ".") and prev_type != type_)
        or tag in ("[", "]")
    )


def _prf(correct: int, guessed: int, gold: int) -> dict[str, float]:
    precision = 100.0 * correct / guessed if guessed > 0 else 0.0
    recall = 100.0 * correct / gold if gold > 0 else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall > 0 else 0.0
    return {"precision": precision, "recall": recall, "f1": f1}


class _ChunkCounter:
    """conlleval's counters (the Perl script's names), fed one (gold, guessed) tag pair at a time."""

    def __init__(self) -> None:
        self.correct_chunk = self.found_correct = self.found_guessed = 0
        self.per_correct: Counter[str] = Counter()
        self.per_found_correct: Counter[str] = Counter()
        self.per_found_guessed: Counter[str] = Counter()
        self.in_correct = False
        self.last_c, self.last_ct, self.last_g, self.last_gt = "O", "", "O", ""

    def step(self, c: str, ct: str, g: str, gt: str) -> None:
        """One word: gold prefix and type ``c``, ``ct``; guessed ``g``, ``gt``."""
        last_c, last_ct, last_g, last_gt = self.last_c, self.last_ct, self.last_g, self.last_gt
        end_c, end_g = _end_of_chunk(last_c, c, last_ct, ct), _end_of_chunk(last_g, g, last_gt, gt)
        start_c, start_g = _start_of_chunk(last_c, c, last_ct, ct), _start_of_chunk(last_g, g, last_gt, gt)
        if self.in_correct:
            if end_c and end_g and last_gt == last_ct:
                self.in_correct = False
                self.correct_chunk += 1
                self.per_correct[last_ct] += 1
            elif end_c != end_g or gt != ct:
                self.in_correct = False
        if start_c and start_g and gt == ct:
            self.in_correct = True
        if start_c:
            self.found_correct += 1
            self.per_found_correct[ct] += 1
        if start_g:
            self.found_guessed += 1
            self.per_found_guessed[gt] += 1
        self.last_c, self.last_ct, self.last_g, self.last_gt = c, ct, g, gt

    def finish(self) -> None:
        """The end of the input closes a chunk both sides still have open."""
        if self.in_correct:
            self.correct_chunk += 1
            self.per_correct[self.last_ct] += 1

    def per_type(self) -> dict[str, dict[str, Any]]:
        """Each entity type's scores and counts, types in sorted order."""
        return {
            t: {
                **_prf(self.per_correct[t], self.per_found_guessed[t], self.per_found_correct[t]),
                "found_gold": self.per_found_correct[t],
                "found_guessed": self.per_found_guessed[t],
                "correct": self.per_correct[t],
            }
            for t in sorted(set(self.per_found_correct) | set(self.per_found_guessed))
        }


def _check_tags(sentence: int, tags: Sequence[str], side: str) -> None:
    """Refuse a tag conlleval cannot read as IOB1/IOB2. An IOBES ``S-X`` is not a chunk start to conlleval (two
    ``S-PER`` in a row are one person, where seqeval and the scheme count two) and ``E-X`` only half-known: the
    scores came out quietly wrong (gold S-PER S-PER, predicted S-PER O: F1 0, where seqeval's is 66.7)."""
    bad = next((t for t in tags if not isinstance(t, str) or not is_tag(t)), None)
    if bad is not None:
        raise BertkitError(f"sentence {sentence}: {side} tag {bad!r} is not O, B-TYPE or I-TYPE; conlleval scores "
                           "IOB1/IOB2 tags: convert IOBES (S-, E-) tags to IOB2 (S- to B-, E- to I-) first")


def conlleval(gold: Sequence[Sequence[str]], predicted: Sequence[Sequence[str]]) -> dict[str, Any]:
    """Entity-level scores as conlleval computes them, in percent: precision, recall, f1, accuracy (per
    token), found_gold, found_guessed, correct, and per_type {TYPE: the same less accuracy}."""
    if len(gold) != len(predicted):
        raise BertkitError(f"{len(gold)} gold sentences but {len(predicted)} predicted; pass one per sentence")
    counter = _ChunkCounter()
    correct_tags = token_count = 0
    for i, (gold_tags, pred_tags) in enumerate(zip(gold, predicted, strict=True)):
        if len(gold_tags) != len(pred_tags):
            raise BertkitError(f"sentence {i}: {len(gold_tags)} gold tags but {len(pred_tags)} predicted")
        _check_tags(i, gold_tags, "gold")
        _check_tags(i, pred_tags, "predicted")
        for gold_tag, pred_tag in zip(gold_tags, pred_tags, strict=True):
            c, ct = _split_tag(gold_tag)
            g, gt = _split_tag(pred_tag)
            counter.step(c, ct, g, gt)
            correct_tags += c == g and ct == gt
            token_count += 1
        counter.step("O", "", "O", "")  # the blank line after each sentence: "sentence breaks ... out of chunk"
    counter.finish()
    if token_count == 0:  # every score would be 0/0: an empty evaluation set is a mistake, not a score of 0
        raise BertkitError(f"no tags to score ({len(gold)} sentences, none with a word); pass the evaluation set's "
                           "tags")

    result: dict[str, Any] = _prf(counter.correct_chunk, counter.found_guessed, counter.found_correct)
    result.update(
        accuracy=100.0 * correct_tags / token_count if token_count else 0.0,
        found_gold=counter.found_correct,
        found_guessed=counter.found_guessed,
        correct=counter.correct_chunk,
    )
    result["per_type"] = counter.per_type()
    return result


def write_conll(path: Path, sentences: Sequence[NerSentence], predicted: Sequence[Sequence[str]]) -> Path:
    """``word gold pred`` per line, a blank line after each sentence: the input conlleval reads."""
    with atomic_write(path) as f:
        for sent, tags in zip(sentences, predicted, strict=True):
            for word, gold, pred in zip(sent.words, sent.tags, tags, strict=True):
                f.write(f"{word} {gold} {pred}\n")
            f.write("\n")
    return path

