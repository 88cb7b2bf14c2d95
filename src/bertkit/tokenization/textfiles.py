"""Reading text files line by line with errors that name the file, line and byte.

Below both the vocabulary trainer (``tokenization/trainer.py``) and the pre-training data pipeline
(``data/``), so the tokenizer package does not import the data package (and numpy with it).
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterator, Sequence

from bertkit.errors import BertkitError, InputError, MissingFileError
from bertkit.manifests import owns
from bertkit.runs import match_files

DECODE_ERRORS = ("strict", "replace", "ignore")


# Leading bytes of the compressed formats a corpus comes in: read as text (--errors replace), they are noise.
_COMPRESSED = ((b"\x1f\x8b", "gzip", "gunzip -k"), (b"\xfd7zXZ\x00", "xz", "unxz -k"),
               (b"\x28\xb5\x2f\xfd", "zstd", "unzstd"), (b"PK\x03\x04", "zip", "unzip"))
# Each format's suffix and the command writing it decompressed to standard output: the tools above decompress a
# file in place only when it has that suffix (gunzip -k preds.jsonl: "unknown suffix -- ignored").
_TO_STDOUT = {"gzip": (".gz", "gunzip -c"), "xz": (".xz", "unxz -c"), "zstd": (".zst", "unzstd -c"),
              "zip": (".zip", "unzip -p"), "bzip2": (".bz2", "bunzip2 -c")}


def refuse_compressed(head: bytes, path: str | os.PathLike) -> None:
    """A compressed file, or UTF-16/32 text, is refused, naming its format and how to decompress or convert it: read
    as UTF-8 it would be an error whose fix (errors='replace') turns its bytes into instances or words of noise."""
    # Byte-order marks of UTF-32 before UTF-16 (UTF-32 LE's starts with UTF-16 LE's): what Windows saves as "Unicode".
    for bom, name in ((b"\xff\xfe\x00\x00", "UTF-32"), (b"\x00\x00\xfe\xff", "UTF-32"), (b"\xff\xfe", "UTF-16"),
                      (b"\xfe\xff", "UTF-16")):
        if head.startswith(bom):
            raise BertkitError(f"{path} is {name} text, not UTF-8: convert it first (iconv -f {name} -t UTF-8 {path} > "
                               "NEW.txt) and pass the converted file; read as UTF-8 (errors='replace') its line breaks "
                               "leave a NUL on each next line, so no line is blank and documents run together")
    wide = _wide_without_bom(head)
    if wide is not None:
        raise BertkitError(f"{path} is {wide} text without a byte-order mark (NUL bytes between its letters), not UTF-8: "
                           f"convert it first (iconv -f {wide} -t UTF-8 {path} > NEW.txt) and pass the converted file; "
                           "read as UTF-8 its line breaks leave a NUL on each next line, so no line is blank: documents "
                           "run together, and a paragraph ending in a NUL is no prose")
    refuse_compressed_format(head, path)


def _wide_without_bom(head: bytes) -> str | None:
    """The encoding of UTF-16 or UTF-32 text without a byte-order mark whose first bytes are ``head`` (16 or more):
    Latin text in it has a NUL in every byte of a character but the one that holds the letter, which UTF-8 text never
    has; None for anything else."""
    head = head[: len(head) // 4 * 4]
    if len(head) < 16:
        return None
    nul = [head[r::4].count(0) / (len(head) // 4) for r in range(4)]  # share of NUL bytes at each place of 4
    for name, zeros in (("UTF-32LE", (1, 2, 3)), ("UTF-32BE", (0, 1, 2)), ("UTF-16LE", (1, 3)), ("UTF-16BE", (0, 2))):
        if all(nul[r] >= 0.75 for r in zeros) and all(nul[r] < 0.5 for r in range(4) if r not in zeros):
            return name
    return None


def refuse_compressed_format(head: bytes, path: str | os.PathLike) -> None:
    """A file whose first bytes ``head`` are a compressed format's is refused, naming the format and the command
    that decompresses it: every reader of text or records asks this first, since read as text such a file fails
    on whichever of its bytes comes first (a NUL, a lone carriage return, bad UTF-8), in words that name another problem."""
    found = next(((kind, how) for magic, kind, how in _COMPRESSED if head.startswith(magic)), None)
    if head[:3] == b"BZh" and head[3:4].isdigit() and head[4:10] == b"1AY&SY":
        found = ("bzip2", "bunzip2 -k")
    if found is not None:
        kind, how = found
        suffix, to_stdout = _TO_STDOUT[kind]
        name = os.fspath(path)
        command = f"{how} {name}"
        if not name.endswith(suffix):
            stem, ext = os.path.splitext(os.path.basename(name))
            command = f"{to_stdout} {name} > {stem}-decompressed{ext}"
        raise BertkitError(f"{name} is {kind}-compressed, not text: decompress it first ({command}) and pass the "
                           "decompressed file")


# The suffixes of files whose lines are records (`bertkit predict` and `finetune classify` read them by column): read
# as plain text, their JSON syntax, header row and other columns would be learnt, or calibrated on, as words.
RECORD_SUFFIXES = (".jsonl", ".json", ".ndjson", ".csv", ".tsv")


def refuse_record_file(path: str | os.PathLike, what: str, reads: str) -> None:
    """A file named as records (``RECORD_SUFFIXES``) given where plain text is read is refused: ``what`` names it
    ("calibration file"), ``reads`` says how such a file is read ("one sentence per line")."""
    suffix = os.path.splitext(path)[1].lower()
    if suffix in RECORD_SUFFIXES:
        raise BertkitError(f"{what} {path} is a {suffix[1:]} file, whose lines are records (JSON syntax, a header "
                           f"row, columns), and {what}s are read as plain text, {reads}: write the texts to a .txt "
                           "file (of JSON lines: jq -r .text FILE > NEW.txt; of a CSV or TSV: its text column)")


def refuse_lone_carriage_returns(first_line: bytes, where: str) -> None:
    """Lines end at \\n (\\r\\n too): a file whose lines end in \\r alone would be read as one line, so one input,
    one sentence, or one paragraph of a whole book. ``where`` names the file (and line) in the error."""
    if b"\r" in first_line.rstrip(b"\r\n"):
        raise BertkitError(f"{where}: a carriage return (\\r) inside the first line: a file whose lines end in \\r "
                           "alone (classic Mac OS) would be read as one line; end its lines with \\n "
                           "(e.g. tr '\\r' '\\n' < FILE > NEW), or remove the \\r from the text")


def iter_lines(
    path: str | os.PathLike, errors: str = "strict", start: int = 0, end: int | None = None
) -> Iterator[str]:
    """Yield the lines of ``path[start:end]`` (byte offsets at line starts) without line endings.

    Reads in binary and decodes line by line, so a bad byte is reported with its file, line (counted
    from ``start``) and absolute byte offset. A UTF-8 byte-order mark at offset 0 is dropped.
    """
    if errors not in DECODE_ERRORS:
        raise BertkitError(f"errors={errors!r} is not one of {DECODE_ERRORS}")
    offset = start
    with open(path, "rb") as f:
        if start == 0:
            refuse_compressed(f.read(16), path)
        f.seek(start)
        for lineno, raw in enumerate(f, start=1):
            if end is not None and offset >= end:
                return
            try:
                line = raw.decode("utf-8", errors=errors)
            except UnicodeDecodeError as exc:
                where = f"line {lineno}" if start == 0 else f"line {lineno} after byte {start}"
                raise InputError(
                    f"{path}: {where} (byte offset {offset + exc.start}) is not valid UTF-8 "
                    f"({raw[exc.start : exc.start + 4]!r}); fix the file or pass --errors replace "
                    "(errors='replace') to read bad bytes as U+FFFD"
                ) from None
            if offset == 0 and line.startswith("\ufeff"):
                line = line[1:]
            offset += len(raw)
            yield line.rstrip("\r\n")


def expand_input_files(files: str | os.PathLike | Sequence[str | os.PathLike],
                       twice: str = "its text would be read twice; pass each file once") -> list[str]:
    """The input files, a glob pattern (``corpus/*.txt``, as google's ``--input_file`` takes; ``corpus/**/*.txt`` at
    any depth) replaced by the files it matches (``match_files``); one path alone is one file (as tokenizers' ``train(files="corpus.txt")`` takes it). A directory, a
    pattern matching nothing, a missing file, or a file given twice (``twice`` says what reading it twice would do) is
    refused."""
    if isinstance(files, (str, os.PathLike)):  # else a str is read as its characters, each a file name ("/", "t", ...)
        files = [files]
    paths: list[str] = []
    for file in files:
        name = str(file)
        if not os.path.lexists(name) and glob.has_magic(name):
            matched = match_files(name)
            if not matched:
                raise MissingFileError(f"no file matches {name}: check the pattern, or name the files")
            # A command's output under the corpus (train-tokenizer --out corpus/vocab, then 'corpus/*/*.txt') would
            # be read as text without a word: vocab.txt's 30,522 lines as documents.
            if written := [p for p in matched if owns(p)]:
                more = f" and {len(written) - 1} more" if len(written) > 1 else ""
                raise BertkitError(f"{name} matches {written[0]}{more}, which bertkit wrote (a command's output, as the "
                                   "manifest beside it records), not text to read: narrow the pattern, move that "
                                   "output out of the corpus, or name the files")
            paths.extend(matched)
        elif os.path.isdir(name):
            raise MissingFileError(f"{name} is a directory: pass the files in it ({os.path.join(name, '*.txt')}, "
                                   "a pattern bertkit expands, or the shell's)")
        elif not os.path.isfile(name):
            raise MissingFileError(f"input file {name} does not exist (or is not a file)")
        else:
            paths.append(name)
    for path in paths:  # a pattern's matches too (corpus/*)
        refuse_record_file(path, "corpus file", "line by line")
    seen: dict[tuple[int, int], str] = {}
    for path in paths:
        stat = os.stat(path)
        key = (stat.st_dev, stat.st_ino)
        if key not in seen:
            seen[key] = path
            continue
        first = seen[key]
        raise BertkitError(f"{os.path.basename(path)} is given twice (as {first} and {path}): {twice}")
    return paths
