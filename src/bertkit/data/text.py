"""Corpus reading: files -> documents -> sentences, streaming, with the clean-up BERT's data needs.

A *document* is a list of sentence strings; next-sentence pairs never cross documents. The input formats
(``"sentences"``: google's one sentence per line; ``"prose"``: one file (one Project Gutenberg book), one document;
``"wikitext"``; ``"auto"``)
and the clean-up rules (the paper, section 3.1: "we extract only the text passages and ignore lists, tables, and
headers") are described in docs/pretraining-data.md, section 2. Bytes that are not UTF-8 raise a ``ValueError``
naming the file, line and byte offset unless ``errors`` is ``"replace"`` or ``"ignore"``.
"""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from bertkit.errors import BertkitError
from bertkit.tokenization._unicode_tables import CONTROL
from bertkit.tokenization.textfiles import iter_lines, refuse_compressed, refuse_lone_carriage_returns

INPUT_FORMATS = ("auto", "prose", "sentences", "wikitext")

_WIKITEXT_TITLE = re.compile(r"^ ?= (?!=)(.*?) = ?$")
_WIKITEXT_SUBHEADING = re.compile(r"^ ?(= ){2,}.*( =){2,} ?$")
_GUTENBERG_START = re.compile(r"^\s*\*{3}\s*START OF (THE|THIS) PROJECT GUTENBERG", re.IGNORECASE)
_GUTENBERG_END = re.compile(
    r"^\s*(\*{3}\s*END OF (THE|THIS) PROJECT GUTENBERG|End of (the )?Project Gutenberg)", re.IGNORECASE
)
_GUTENBERG_HEADER_LINES = 1000
_CITATION = re.compile(r"\[(?:\d+(?:\s*[,–-]\s*\d+)*|[a-z]|citation needed|note \d+|nb \d+)\]")
_REFERENCE_LINE = re.compile(r"^\[\d+\]")
_TABLE_MARKUP = re.compile(r"\|-|-{3,} +-{3,}")
_CLOSERS = "\"'”’»)]_*"
# What may follow a paragraph's last word: closers, and the characters the tokenizer deletes (NUL, U+FFFD, a
# left-to-right mark, C1 controls such as the U+0094 of a Windows-1252 closing quote decoded as Latin-1), which the
# model never sees. Not a space: "produced. ]]" is a stray image caption's markup, not a sentence's end.
_TAIL_CHAR = re.compile("[" + re.escape(_CLOSERS) + "".join(f"\\U{a:08x}-\\U{b:08x}" for a, b in CONTROL) + "]")
_PROSE_END = ".!?:;…"
_DETECT_BYTES = 64 * 1024
# Lines that are one whole sentence, for "auto" to read a file as google's layout.
_SENTENCE_LINES_SHARE = 0.85


# --------------------------------------------------------------------------------------------------
# Sentence splitting
# --------------------------------------------------------------------------------------------------

# Words that end in "." but (almost) never end a sentence: titles before a name, Latin and reference
# abbreviations, months before a day. Compared lower-cased, without the final period.
ABBREVIATIONS = frozenset(
    """
    mr mrs ms messrs mme mlle dr prof rev hon sr jr st mt ft gen col lt capt cmdr maj sgt cpl adm gov
    sen rep pres supt insp fr sec
    e.g i.e viz cf vs etc al approx ca c circa fig figs no nos vol vols p pp ch chap sect art ed eds
    op ibid est dept univ assn bros corp inc ltd co
    jan feb mar apr jun jul aug sep sept oct nov dec
    """.split()
)
# Of those, the ones that often do end a sentence ("... and so on, etc. The next ..."): split after
# them when a capitalised word follows.
_SENTENCE_FINAL_ABBREVIATIONS = frozenset({"etc", "inc", "ltd", "co", "bros", "corp", "al"})

_CANDIDATE = re.compile(r"([.!?…]+)([\"'”’»)\]]*)(\s+)")
_OPENERS = "\"'“‘«([¿¡"


def split_sentences(paragraph: str) -> list[str]:
    """Split one paragraph of prose into sentences, by the rules docs/pretraining-data.md ("Sentence
    splitter") lists: at ``. ! ? …`` before an upper-case word or a digit, except after an abbreviation
    (:data:`ABBREVIATIONS`), an initial or a dotted acronym, or a digit after a title-like abbreviation
    (``No. 4``)."""
    text = paragraph.strip()
    if not text:
        return []
    sentences: list[str] = []
    start = 0
    for match in _CANDIDATE.finditer(text):
        after = match.end()
        if after >= len(text):
            break
        nxt = after
        while nxt < len(text) and text[nxt] in _OPENERS:
            nxt += 1
        if nxt >= len(text) or not (text[nxt].isupper() or text[nxt].isdigit()):
            continue
        if match.group(1) == "." and not _period_ends_sentence(text, match.start(), text[nxt].isdigit()):
            continue
        sentence = text[start : match.end(2)].strip()
        if sentence:
            sentences.append(sentence)
        start = after
    tail = text[start:].strip()
    if tail:
        sentences.append(tail)
    return sentences


def _period_ends_sentence(text: str, period: int, digit_follows: bool) -> bool:
    word_start = period
    while word_start > 0 and not text[word_start - 1].isspace() and text[word_start - 1] not in _OPENERS:
        word_start -= 1
    word = text[word_start:period]
    if not word:
        return True
    bare = word.lower()
    if bare in ABBREVIATIONS:
        return bare in _SENTENCE_FINAL_ABBREVIATIONS and not digit_follows
    if len(word) == 1 and word.isalpha():
        return False
    # Dotted acronyms: "U.S", "Ph.D", "e.g" (the last period is the one we are looking at).
    return not ("." in word and all(len(part) <= 2 for part in word.split(".")))


# --------------------------------------------------------------------------------------------------
# Documents
# --------------------------------------------------------------------------------------------------


def detect_format(path: str | os.PathLike) -> str:
    """``"wikitext"`` if the first 64 KiB hold two or more `` = Title = `` lines; ``"sentences"`` if they are laid
    out as google's files are (:func:`_one_sentence_per_line`); else ``"prose"``."""
    with open(path, "rb") as f:
        raw = f.read(_DETECT_BYTES)
    lines = raw.decode("utf-8", errors="replace").splitlines()
    if len(raw) == _DETECT_BYTES:
        lines = lines[:-1]  # cut short by the 64 KiB
    titles = sum(1 for line in lines if _WIKITEXT_TITLE.match(line.rstrip("\r")))
    if titles >= 2:
        return "wikitext"
    return "sentences" if _one_sentence_per_line(lines) else "prose"


def _one_sentence_per_line(lines: list[str]) -> bool:
    """google-research/bert's layout (its sample_text.txt): blank lines between documents of several lines, nearly
    every line one whole sentence (90% in sample_text.txt; of the shared corpus' books and articles, at most 74%, a
    play's speaker lines). Read as prose such a file would be one document, its negatives drawn from itself."""
    blocks = [
        len(list(group))
        for blank, group in itertools.groupby(lines, key=lambda s: not s.strip())
        if not blank
    ]
    if len(blocks) < 2 or sum(n >= 2 for n in blocks) < len(blocks) / 2:
        return False
    if any(_GUTENBERG_START.match(line) for line in lines):
        return False  # a Project Gutenberg book: prose, whose licence header prose reading drops
    text = [line.strip() for line in lines if line.strip()]
    whole = sum(
        1 for line in text if _ends_like_prose(line) and len(split_sentences(line)) == 1
    )
    return whole >= _SENTENCE_LINES_SHARE * len(text)


def clean_paragraph(paragraph: str) -> str | None:
    """Prose clean-up of one paragraph: drop citation markers; ``None`` if it is not a text passage."""
    text = _CITATION.sub("", paragraph).strip()
    if not text or _REFERENCE_LINE.match(text) or _TABLE_MARKUP.search(text):
        return None
    return text if _ends_like_prose(text) else None


def _ends_like_prose(text: str) -> bool:
    """Whether the last character of ``text`` before its closing quotes and brackets, and before what the tokenizer
    deletes, ends a sentence."""
    end = len(text)
    while end and _TAIL_CHAR.match(text, end - 1):
        end -= 1
    return end > 0 and text[end - 1] in _PROSE_END


def iter_documents(
    path: str | os.PathLike,
    input_format: str = "auto",
    errors: str = "strict",
    start: int = 0,
    end: int | None = None,
) -> Iterator[list[str]]:
    """Yield the documents of one file (or of its byte range ``[start, end)``) as lists of sentences.

    Documents with no sentence left after clean-up are skipped. docs/pretraining-data.md says what each
    ``input_format`` means.
    """
    if input_format not in INPUT_FORMATS:
        raise BertkitError(f"input_format={input_format!r} is not one of {INPUT_FORMATS}")
    if input_format == "auto":
        input_format = detect_format(path)
    lines = iter_lines(path, errors=errors, start=start, end=end)
    if input_format == "sentences":
        yield from _blocks(lines)
    elif input_format == "wikitext":
        yield from _wikitext_documents(lines)
    else:
        yield from _prose_documents(_gutenberg_books(lines, in_licence=_in_gutenberg_licence(path, start)))


def _blocks(lines: Iterator[str | None]) -> Iterator[list[str] | None]:
    """The stripped lines of each run of non-blank lines: a document of sentences, or a paragraph's lines. A
    ``None`` (``_gutenberg_books``' end of a book) ends the block and is passed on."""
    block: list[str] = []
    for line in lines:
        line = line.strip() if line is not None else None
        if line:
            block.append(line)
            continue
        if block:
            yield block
            block = []
        if line is None:
            yield None
    if block:
        yield block


def _in_gutenberg_licence(path: str | os.PathLike, start: int) -> bool:
    """Whether byte ``start`` of ``path`` (where a work unit's part begins) is inside the licence after a book's END
    marker: the last marker in the ``_DETECT_BYTES`` before it is an END (a licence is about 20 KB long)."""
    if start == 0:
        return False
    with open(path, "rb") as f:
        f.seek(max(0, start - _DETECT_BYTES))
        before = f.read(min(start, _DETECT_BYTES)).decode("utf-8", errors="replace").splitlines()
    last = next((line for line in reversed(before) if _GUTENBERG_END.match(line) or _GUTENBERG_START.match(line)),
                None)
    return last is not None and bool(_GUTENBERG_END.match(last))


def _gutenberg_books(lines: Iterator[str], in_licence: bool = False) -> Iterator[str | None]:
    """The text lines of the Project Gutenberg books in ``lines``, ``None`` after each book that ends at an END
    marker: a licence header up to a START marker among the first lines is dropped, and so is each licence from an
    END marker to the next book's START (a file of books joined with ``cat``). A part of a file that begins inside
    one (a work unit cut there) is ``in_licence`` or finds its START among its first lines with no END before it."""
    if not in_licence:
        head = list(itertools.islice(lines, _GUTENBERG_HEADER_LINES))
        end = next((i for i, line in enumerate(head) if _GUTENBERG_END.match(line)), len(head))
        start = next((i + 1 for i, line in enumerate(head[:end]) if _GUTENBERG_START.match(line)), 0)
        lines = itertools.chain(head[start:], lines)
    for line in lines:
        if in_licence:
            in_licence = not _GUTENBERG_START.match(line)
        elif _GUTENBERG_END.match(line):
            in_licence = True
            yield None
        else:
            yield line


def _prose_documents(lines: Iterator[str | None]) -> Iterator[list[str]]:
    """One document of sentences per book (``None`` ends one; a file without Gutenberg markers is one)."""
    document: list[str] = []
    for block in _blocks(lines):
        if block is None:
            if document:
                yield document
            document = []
            continue
        cleaned = clean_paragraph(" ".join(block))
        if cleaned is not None:
            document.extend(split_sentences(cleaned))
    if document:
        yield document


def _wikitext_documents(lines: Iterator[str]) -> Iterator[list[str]]:
    document: list[str] = []
    for line in lines:
        if _WIKITEXT_TITLE.match(line):
            if document:
                yield document
            document = []
            continue
        if _WIKITEXT_SUBHEADING.match(line):
            continue
        cleaned = clean_paragraph(line)
        if cleaned is not None:
            document.extend(split_sentences(cleaned))
    if document:
        yield document


# --------------------------------------------------------------------------------------------------
# Work units: the corpus cut into pieces of about `unit_bytes`, on document boundaries
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FilePart:
    """Bytes ``[start, end)`` of one file, read as ``input_format`` (already resolved, never auto)."""

    path: str
    input_format: str
    start: int
    end: int


@dataclass(frozen=True)
class WorkUnit:
    """Consecutive file parts processed together: one shard, one seed, one pool of documents."""

    index: int
    parts: tuple[FilePart, ...]

    @property
    def num_bytes(self) -> int:
        return sum(p.end - p.start for p in self.parts)


def plan_work_units(
    files: Sequence[str | os.PathLike], input_format: str = "auto", unit_bytes: int = 4 << 20
) -> list[WorkUnit]:
    """Cut the corpus into work units of about ``unit_bytes``, in file order, deterministically.

    Consecutive files are grouped until a unit holds at least ``unit_bytes`` and two files (so that
    "random next" segments can come from another document); a larger file is cut at the first document
    boundary after each multiple of ``unit_bytes`` (docs/pretraining-data.md, "Parallel, streaming,
    deterministic"). The plan never depends on the number of workers. A corpus of empty files is an error.
    ``files`` are files (``tokenization.textfiles.expand_input_files`` expands patterns and refuses the rest).
    """
    if unit_bytes < 1:
        raise BertkitError(f"unit_bytes must be positive, got {unit_bytes}")
    if input_format not in INPUT_FORMATS:
        raise BertkitError(f"input_format={input_format!r} is not one of {INPUT_FORMATS}")
    parts: list[FilePart] = []
    for path in map(str, files):
        size = os.path.getsize(path)
        if size == 0:
            continue
        with open(path, "rb") as f:
            first_line = f.readline(_DETECT_BYTES)
            f.seek(0)
            head = f.read(64)
        refuse_compressed(head, path)  # a line's worth of bytes: a UTF-16 file's first line may be one NUL
        refuse_lone_carriage_returns(first_line, path)
        fmt = detect_format(path) if input_format == "auto" else input_format
        cuts = [0] + _cut_points(path, fmt, size, unit_bytes) + [size]
        parts.extend(FilePart(path, fmt, a, b) for a, b in zip(cuts, cuts[1:], strict=False) if b > a)

    units: list[WorkUnit] = []
    current: list[FilePart] = []
    for part in parts:
        current.append(part)
        if sum(p.end - p.start for p in current) >= unit_bytes and len(current) >= 2:
            units.append(WorkUnit(len(units), tuple(current)))
            current = []
    if current:
        if units and len(current) < 2:
            units[-1] = WorkUnit(units[-1].index, units[-1].parts + tuple(current))
        else:
            units.append(WorkUnit(len(units), tuple(current)))
    if not units:
        raise BertkitError(f"the corpus is empty: all {len(files)} input file(s) have 0 bytes")
    return units


def _cut_points(path: str, fmt: str, size: int, unit_bytes: int) -> list[int]:
    cuts: list[int] = []
    target = unit_bytes
    with open(path, "rb") as f:
        while target < size:
            f.seek(target)
            f.readline()  # finish the line the target falls in
            cut = None
            previous_blank = False
            while True:
                pos = f.tell()
                raw = f.readline()
                if not raw:
                    break
                if fmt == "wikitext":
                    if _WIKITEXT_TITLE.match(raw.decode("utf-8", errors="replace").rstrip("\r\n")):
                        cut = pos
                        break
                elif raw.strip():
                    if previous_blank:
                        cut = pos
                        break
                else:
                    previous_blank = True
            if cut is None or cut >= size:
                break
            cuts.append(cut)
            target = cut + unit_bytes
    return cuts
