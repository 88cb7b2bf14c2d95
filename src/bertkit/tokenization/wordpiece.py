"""WordPiece: the vocabulary file and greedy longest-match-first segmentation of one word.

BERT (Devlin et al., 2018, section 3) uses WordPiece embeddings (Wu et al., 2016): a word is cut into the
longest vocabulary entry that starts it, then the longest ``##``-prefixed entry that continues it, and so
on. A word that cannot be covered this way, or longer than ``max_input_chars_per_word``, becomes a single
``[UNK]``: no backtracking, no character fallback (Google's ``WordpieceTokenizer``, Hugging Face's
``models.WordPiece``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Hashable, Mapping, Sequence
from pathlib import Path
from typing import Any

from bertkit.errors import BertkitError, MissingFileError
from bertkit.outputs import atomic_write

__all__ = ["Memo", "WordPiece", "SPECIAL_TOKENS", "load_vocab", "write_vocab_file"]

logger = logging.getLogger("bertkit")

VOCAB_FILE = "vocab.txt"
PREFIX = "##"  # what marks a WordPiece that continues a word
CACHE_SIZE = 65536  # entries of each memo (words, chunks): far more than a corpus's frequent words
# What tokenizers (Rust's str::trim_end: Unicode White_Space) strips from the end of a vocab.txt line; Python's
# str.isspace would take U+001C..U+001F too.
LINE_END_WHITESPACE = ("\t\n\x0b\x0c\r \x85\xa0\u1680" + "".join(map(chr, range(0x2000, 0x200B)))
                       + "\u2028\u2029\u202f\u205f\u3000")
# BERT's special tokens, in the order a learned vocabulary starts with them (ids 0-4): defined once here.
SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


def load_vocab(path: str | os.PathLike) -> list[str]:
    """The tokens of a ``vocab.txt`` in id order (line ``i`` holds token ``i``)."""
    path = Path(path)
    if not path.is_file():
        raise MissingFileError(
            f"vocabulary file {path} does not exist: a BERT tokenizer needs the checkpoint's {VOCAB_FILE} "
            f"(one token per line, line i = id i); point to the directory or file that holds it"
        )
    # Read as transformers 5 reads it (the tokenizers library's WordPiece.read_file): lines end at "\n" only, and
    # each loses the whitespace that ends it, so "hello \r" is "hello" (Python's text mode and rstrip("\n"), as
    # transformers 4's load_vocab read it, would keep "hello " and make a lone "\r" a line of its own)
    raw = path.read_bytes()
    try:
        lines = raw.decode("utf-8").split("\n")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise BertkitError(f"{path} is not UTF-8 text: line {line}, byte {e.start} ({raw[e.start:e.start + 1]!r}); "
                           "a vocab.txt holds one UTF-8 token per line") from None
    if lines[-1] == "":  # the final newline ends the last line; it does not start another
        lines.pop()
    tokens = [line.rstrip(LINE_END_WHITESPACE) for line in lines]
    if tokens and tokens[0].startswith("\ufeff"):
        raise BertkitError(f"{path} starts with a UTF-8 byte-order mark, which would become part of its first "
                           f"token ({tokens[0][1:]!r}); save the file as UTF-8 without BOM")
    return tokens


def listed_tokens(tokens: Sequence[str]) -> list[str]:
    """``tokens`` (line ``i`` of a vocab.txt, id ``i``) as a list, with a warning where a token but "" (a blank line)
    is listed twice: as transformers and the tokenizers library read the file, it takes the id of its last line, the
    ids of its earlier lines encode nothing, and ``len(tokenizer)`` counts it once."""
    if len(set(tokens)) == len(tokens):  # no token twice: the one pass below names the lines of those that are
        return list(tokens)
    last = {token: i for i, token in enumerate(tokens)}
    repeated = [f"{token!r} on line {i + 1}, also on line {last[token] + 1} (id {last[token]})"
                for i, token in enumerate(tokens) if token and last[token] != i]
    if repeated:
        logger.warning("the vocabulary lists %d token(s) more than once (%s): each takes the id of its last line, as "
                       "transformers reads the file, and len(tokenizer) counts it once; remove the repeated lines to "
                       "give every line its own token", len(repeated), "; ".join(repeated[:5]))
    return list(tokens)


def write_vocab_file(tokens: list[str], path: str | os.PathLike) -> Path:
    """Write one ``vocab.txt`` (line i = token i). To save a whole tokenizer directory use
    ``BertTokenizer(tokens).save_pretrained``."""
    path = Path(path)
    bad = [t for t in tokens if "\n" in t]  # a "\r" inside a token reads back as written (load_vocab)
    if bad:
        raise BertkitError(f"tokens with a line break (\\n) cannot be written to {path}: {bad[:5]}")
    with atomic_write(path, "w") as f:
        f.write("".join(t + "\n" for t in tokens))
    return path


class Memo(dict):
    """A dict that fills itself with ``compute(key)`` on a miss and empties itself when full (``maxsize``).

    Hits stay a C-level dict lookup; clearing everything when full keeps every operation O(1). Safe to share
    between threads: a race at worst computes the same value twice.
    """

    def __init__(self, compute: Callable[[Any], Any], maxsize: int):
        super().__init__()
        self._compute = compute
        self.maxsize = maxsize

    def __missing__(self, key: Hashable) -> Any:
        value = self._compute(key)
        if len(self) >= self.maxsize:
            self.clear()
        self[key] = value
        return value


class WordPiece:
    """Greedy longest-match-first segmentation of normalised words into vocabulary ids.

    ``segment(word)`` returns ``((id, start, end), ...)`` with character offsets into ``word``; results are
    memoised per word (``CACHE_SIZE`` words at most).
    """

    def __init__(self, vocab: Mapping[str, int], unk_token: str = "[UNK]", max_input_chars_per_word: int = 100):
        if unk_token not in vocab:
            raise BertkitError(f"unk_token {unk_token!r} is not in the vocabulary")
        if max_input_chars_per_word < 1:
            raise BertkitError(f"max_input_chars_per_word must be >= 1, got {max_input_chars_per_word}")
        self.vocab = vocab
        self.unk_token = unk_token
        self.unk_id = vocab[unk_token]
        self.max_input_chars_per_word = max_input_chars_per_word
        # Longest entry that can match at the start of a word / after the prefix: bounds the inner loop.
        self._max_first = max(map(len, vocab), default=0)
        self._max_next = max(map(len, [t for t in vocab if t.startswith(PREFIX)]), default=len(PREFIX)) - len(PREFIX)
        self._memo = Memo(self._segment, CACHE_SIZE)

    def segment(self, word: str) -> tuple[tuple[int, int, int], ...]:
        """``word`` -> ((id, start, end), ...); ``((unk_id, 0, len(word)),)`` when it cannot be covered."""
        return self._memo[word]

    def tokenize(self, word: str) -> list[str]:
        """Token strings of one word, e.g. ``"unaffable"`` -> ``["una", "##ffa", "##ble"]``."""
        return [PREFIX + word[a:b] if a else word[a:b] for _, a, b in self.segment(word)]

    def _segment(self, word: str) -> tuple[tuple[int, int, int], ...]:
        n = len(word)
        unk = ((self.unk_id, 0, n),)
        if n > self.max_input_chars_per_word:
            return unk
        vocab, prefix = self.vocab, PREFIX
        pieces = []
        start = 0
        while start < n:
            if start == 0:
                end = min(n, self._max_first)
                while end > 0 and word[:end] not in vocab:
                    end -= 1
                if end == 0:
                    return unk
                pieces.append((vocab[word[:end]], 0, end))
            else:
                end = min(n, start + self._max_next)
                while end > start and prefix + word[start:end] not in vocab:
                    end -= 1
                if end == start:
                    return unk
                pieces.append((vocab[prefix + word[start:end]], start, end))
            start = end
        return tuple(pieces)
