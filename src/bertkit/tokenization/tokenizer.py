"""BertTokenizer: text -> BERT input ids, with character offsets, token for token as BertTokenizerFast.

Pipeline for one text (each step in its own module):

1. special tokens written in the text (``[MASK]``, ``[SEP]``, ...) are cut out first, matched exactly
   and case-sensitively anywhere, as Hugging Face does for its special "added tokens";
2. the rest is split on whitespace into chunks; each chunk goes through the basic tokenizer (``basic``)
   and WordPiece (``wordpiece``);
3. ``[CLS]``/``[SEP]`` are added, then truncation and padding (``encoding``).

Speed, in pure Python: step 2 is memoised per chunk (the whitespace-delimited piece of the original text,
e.g. ``"world,"``), mapping it to its ids and their offsets relative to the chunk. Text is Zipfian, so
most chunks are dictionary hits and a sentence costs one C-level ``str.split`` plus one dict lookup per
chunk; misses run the per-character path once. Caches are bounded (``cache_size`` entries each) and
never change results, which depend only on the text and the configuration.

Offsets are character offsets into the original string, as BertTokenizerFast reports them: a token
spans from the first to the last original character its normalised characters came from (so ``"é"``
lower-cased and stripped to ``"e"`` spans the ``"é"``, a ``##`` piece spans only its own characters,
``[UNK]`` spans its whole word), and added special tokens and padding get ``(0, 0)``.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from bertkit.errors import BertkitError, MissingFileError
from bertkit.outputs import atomic_write_json
from bertkit.tokenization.basic import CHUNK_RE, NON_SEPARATOR_SPACE_RE, BasicTokenizer
from bertkit.tokenization.encoding import (
    BatchEncoding,
    pad_rows,
    resolve_padding,
    resolve_truncation,
    to_batch_encoding,
    truncation_lengths,
)
from bertkit.tokenization.wordpiece import VOCAB_FILE, Memo, WordPiece, load_vocab, write_vocab_file

__all__ = ["BertTokenizer"]

CONFIG_FILE = "tokenizer_config.json"
SPECIAL_TOKENS_MAP_FILE = "special_tokens_map.json"
SPECIAL_TOKEN_KEYS = ("unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
# WordPiece decoder clean-up (tokenizers' `decoders::wordpiece::cleanup`), applied to each token with
# the space that joins it to the previous one.
_CLEANUP = (
    (" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"), (" 'm", "'m"),
    (" do not", " don't"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re"),
)  # fmt: skip


class BertTokenizer:
    """BERT's WordPiece tokenizer, with the behaviour of Hugging Face's BertTokenizerFast.

    >>> tok = BertTokenizer.from_pretrained("models/minilm")
    >>> tok("Hello, world!")["input_ids"]
    [101, 7592, 1010, 2088, 999, 102]

    ``vocab`` is a ``vocab.txt`` path or a ``{token: id}`` dict with ids 0..n-1. The special tokens must be
    in it. See ``__call__`` for encoding, ``decode`` for the way back.
    """

    def __init__(
        self,
        vocab: str | os.PathLike | Mapping[str, int],
        do_lower_case: bool = True,
        strip_accents: bool | None = None,
        tokenize_chinese_chars: bool = True,
        never_split: Iterable[str] | None = None,
        unk_token: str = "[UNK]",
        sep_token: str = "[SEP]",
        pad_token: str = "[PAD]",
        cls_token: str = "[CLS]",
        mask_token: str = "[MASK]",
        additional_special_tokens: Sequence[str] = (),
        model_max_length: int = 512,
        max_input_chars_per_word: int = 100,
        cache_size: int = 65536,
    ):
        if isinstance(vocab, Mapping):
            tokens = _tokens_from_mapping(vocab)
        else:
            tokens = load_vocab(vocab)
        self._tokens = tokens
        self.vocab: dict[str, int] = {t: i for i, t in enumerate(tokens)}  # duplicates: last id wins, as HF
        self.ids_to_tokens: dict[int, str] = dict(enumerate(tokens))
        self.do_lower_case = bool(do_lower_case)
        self.strip_accents = strip_accents
        self.tokenize_chinese_chars = bool(tokenize_chinese_chars)
        self.never_split = sorted(set(never_split or ()))
        self.unk_token, self.sep_token, self.pad_token = unk_token, sep_token, pad_token
        self.cls_token, self.mask_token = cls_token, mask_token
        self.additional_special_tokens = list(additional_special_tokens)
        self.model_max_length = int(model_max_length)
        self.max_input_chars_per_word = max_input_chars_per_word
        self.cache_size = cache_size

        specials = [unk_token, sep_token, pad_token, cls_token, mask_token, *self.additional_special_tokens]
        missing = [t for t in specials if t not in self.vocab]
        if missing:
            raise BertkitError(
                f"the vocabulary ({len(tokens)} tokens) lacks the special tokens {missing}; add them to the "
                f"vocabulary or pass the names it uses (unk_token=, sep_token=, pad_token=, cls_token=, "
                f"mask_token=)"
            )
        self.all_special_tokens: list[str] = list(dict.fromkeys(specials))
        self.all_special_ids: list[int] = [self.vocab[t] for t in self.all_special_tokens]
        self.unk_token_id = self.vocab[unk_token]
        self.sep_token_id = self.vocab[sep_token]
        self.pad_token_id = self.vocab[pad_token]
        self.cls_token_id = self.vocab[cls_token]
        self.mask_token_id = self.vocab[mask_token]
        self._build()

    def _build(self) -> None:
        """Derived tables and caches (rebuilt after unpickling rather than shipped to DataLoader workers)."""
        self._basic = BasicTokenizer(
            self.do_lower_case, self.strip_accents, self.tokenize_chinese_chars, self.never_split
        )
        self._wordpiece = WordPiece(
            self.vocab, self.unk_token, self.max_input_chars_per_word, "##", self.cache_size
        )
        self._chunks = Memo(self._encode_chunk, self.cache_size)
        self._special_id_set = frozenset(self.all_special_ids)
        self._special_first_chars = "".join(sorted({t[0] for t in self.all_special_tokens}))
        # Longest first, so that at one position the longest special token wins (leftmost-longest).
        by_length = sorted(self.all_special_tokens, key=len, reverse=True)
        self._special_re = re.compile("|".join(map(re.escape, by_length)))

    def __getstate__(self) -> dict:
        # What a DataLoader worker receives: the settings and the token list, not caches or derived maps.
        derived = ("vocab", "ids_to_tokens", "_basic", "_wordpiece", "_chunks", "_special_id_set",
                   "_special_first_chars", "_special_re")  # fmt: skip
        return {k: v for k, v in self.__dict__.items() if k not in derived}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.vocab = {t: i for i, t in enumerate(self._tokens)}
        self.ids_to_tokens = dict(enumerate(self._tokens))
        self._build()

    # ------------------------------------------------------------------------------------------------
    # Loading and saving
    # ------------------------------------------------------------------------------------------------

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, **overrides: Any) -> BertTokenizer:
        """Load ``vocab.txt`` + ``tokenizer_config.json`` (+ ``special_tokens_map.json``) from a directory.

        Settings (``do_lower_case``, ``strip_accents``, ``tokenize_chinese_chars``, ``never_split``,
        ``model_max_length``, special tokens) come from the files; keyword arguments override them.
        """
        path = Path(path)
        if not path.is_dir():
            raise MissingFileError(
                f"tokenizer directory {path} does not exist; pass the checkpoint directory that holds "
                f"{VOCAB_FILE} and {CONFIG_FILE}"
            )
        vocab_file = path / VOCAB_FILE
        if not vocab_file.is_file():
            raise MissingFileError(
                f"{vocab_file} not found: a BERT tokenizer directory needs {VOCAB_FILE} (and {CONFIG_FILE}); "
                f"copy them from the checkpoint, or build one with BertTokenizer(vocab).save_pretrained({str(path)!r})"
            )
        settings = _read_settings(path)
        settings.update(overrides)
        if "do_lower_case" not in settings:
            raise MissingFileError(
                f"{path / CONFIG_FILE} not found (or it has no do_lower_case), so whether this checkpoint is "
                f"cased is unknown: pass do_lower_case=True for an uncased checkpoint or False for a cased one"
            )
        tokenizer = cls(vocab_file, **settings)
        _check_fits_model(tokenizer, path)
        return tokenizer

    def save_pretrained(self, path: str | os.PathLike) -> list[Path]:
        """Write ``vocab.txt``, ``tokenizer_config.json`` and ``special_tokens_map.json``; returns their paths."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        special_map = {k: getattr(self, k) for k in SPECIAL_TOKEN_KEYS}
        if self.additional_special_tokens:
            special_map["additional_special_tokens"] = self.additional_special_tokens
        config = {
            "tokenizer_class": "BertTokenizer",
            "do_lower_case": self.do_lower_case,
            "strip_accents": self.strip_accents,
            "tokenize_chinese_chars": self.tokenize_chinese_chars,
            "never_split": self.never_split or None,
            "model_max_length": self.model_max_length,
            "max_input_chars_per_word": self.max_input_chars_per_word,
            **special_map,
        }
        written = [write_vocab_file(self._tokens, path / VOCAB_FILE)]
        for name, data in ((CONFIG_FILE, config), (SPECIAL_TOKENS_MAP_FILE, special_map)):
            written.append(atomic_write_json(path / name, data))  # never through a symlink already there
        return written

    # ------------------------------------------------------------------------------------------------
    # Vocabulary
    # ------------------------------------------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        return len(self._tokens)

    def __len__(self) -> int:
        return len(self._tokens)

    def __repr__(self) -> str:
        return (
            f"BertTokenizer(vocab_size={self.vocab_size}, do_lower_case={self.do_lower_case}, "
            f"strip_accents={self.strip_accents}, tokenize_chinese_chars={self.tokenize_chinese_chars}, "
            f"model_max_length={self.model_max_length})"
        )

    def convert_tokens_to_ids(self, tokens: str | Iterable[str]) -> int | list[int]:
        """Token string(s) -> id(s); strings not in the vocabulary map to ``unk_token_id``."""
        if isinstance(tokens, str):
            return self.vocab.get(tokens, self.unk_token_id)
        get, unk = self.vocab.get, self.unk_token_id
        return [get(t, unk) for t in tokens]

    def convert_ids_to_tokens(self, ids: int | Iterable[int]) -> str | list[str]:
        """Id(s) -> token string(s); an id outside 0..vocab_size-1 is a ValueError."""
        if isinstance(ids, int) or (hasattr(ids, "ndim") and ids.ndim == 0):
            return self._token_of(int(ids))
        return [self._token_of(int(i)) for i in _as_id_list(ids)]

    def _token_of(self, i: int) -> str:
        if not 0 <= i < len(self._tokens):
            raise BertkitError(f"token id {i} is outside the vocabulary (0..{len(self._tokens) - 1})")
        return self._tokens[i]

    # ------------------------------------------------------------------------------------------------
    # Text -> ids
    # ------------------------------------------------------------------------------------------------

    def tokenize(self, text: str) -> list[str]:
        """WordPiece strings of ``text`` (no [CLS]/[SEP]): ``"unaffable"`` -> ``["una", "##ffa", "##ble"]``."""
        tokens = self._tokens
        return [tokens[i] for i in self._encode_text(text, None)]

    def _encode_text(self, text: str, offsets: list[tuple[int, int]] | None) -> list[int]:
        """Ids of ``text`` without [CLS]/[SEP]; appends their offsets to ``offsets`` unless it is None."""
        if not isinstance(text, str):
            raise TypeError(f"the tokenizer takes str (or a list of str), got {type(text).__name__}")
        ids: list[int] = []
        if any(c in text for c in self._special_first_chars) and self._special_re.search(text):
            pos = 0
            for m in self._special_re.finditer(text):
                self._encode_plain(text[pos : m.start()], pos, ids, offsets)
                ids.append(self.vocab[m.group()])
                if offsets is not None:
                    offsets.append(m.span())
                pos = m.end()
            self._encode_plain(text[pos:], pos, ids, offsets)
        else:
            self._encode_plain(text, 0, ids, offsets)
        return ids

    def _encode_plain(
        self, text: str, base: int, ids: list[int], offsets: list[tuple[int, int]] | None
    ) -> None:
        chunks = self._chunks
        odd_spaces = NON_SEPARATOR_SPACE_RE.search(text) is not None
        if offsets is None:
            if odd_spaces:  # dropped by BERT anyway; removing them makes str.split() split where BERT does
                text = NON_SEPARATOR_SPACE_RE.sub("", text)
            for chunk in text.split():
                ids += chunks[chunk][0]
            return
        if odd_spaces:
            spans = ((m.start(), m.group()) for m in CHUNK_RE.finditer(text))
        else:
            spans = _spans(text)
        append = offsets.append
        for start, chunk in spans:
            chunk_ids, chunk_offsets = chunks[chunk]
            ids += chunk_ids
            start += base
            if len(chunk_offsets) == 1:  # most chunks are one token
                a, b = chunk_offsets[0]
                append((start + a, start + b))
            else:
                offsets += [(start + a, start + b) for a, b in chunk_offsets]

    def _encode_chunk(self, chunk: str) -> tuple[tuple[int, ...], tuple[tuple[int, int], ...]]:
        """One whitespace-free chunk -> (ids, offsets relative to the chunk). Memoised in ``_chunks``."""
        kept = self._basic.never_split_match(chunk)
        if kept is not None:
            token, start, end = kept
            return (self.vocab.get(token, self.unk_token_id),), ((start, end),)
        words, source = self._basic.split_chunk(chunk)
        ids: list[int] = []
        offsets: list[tuple[int, int]] = []
        segment = self._wordpiece.segment
        for word, w in words:
            for i, a, b in segment(word):
                ids.append(i)
                if source is None:
                    offsets.append((w + a, w + b))
                else:
                    offsets.append((source[w + a], source[w + b - 1] + 1))
        return tuple(ids), tuple(offsets)

    def encode(self, text: str, text_pair: str | None = None, **kwargs: Any) -> list[int]:
        """``input_ids`` of one text (or pair), special tokens included; keyword arguments as ``__call__``."""
        if not isinstance(text, str):
            raise TypeError(
                f"encode takes one str; for a batch call the tokenizer itself (got {type(text).__name__})"
            )
        return self(text, text_pair, **kwargs)["input_ids"]

    def __call__(
        self,
        text: str | Sequence[str],
        text_pair: str | Sequence[str] | None = None,
        *,
        add_special_tokens: bool = True,
        max_length: int | None = None,
        truncation: bool | str | None = None,
        padding: bool | str = False,
        return_tensors: str | None = None,
        return_offsets_mapping: bool = False,
        return_special_tokens_mask: bool = False,
    ) -> BatchEncoding:
        """Encode one text / pair, or a batch of them.

        Returns a BatchEncoding (a dict) with ``input_ids``, ``token_type_ids``, ``attention_mask`` and, when
        asked, ``special_tokens_mask`` and ``offset_mapping`` ((start, end) into the original text; (0, 0)
        for [CLS]/[SEP]/[PAD]). A str gives lists of ints, a list of str gives lists of lists; with
        ``return_tensors="pt"`` / ``"np"`` every value is a (B, T) tensor / int64 array ((B, T, 2) for
        offsets), B = 1 for a single text.

        truncation: None (default) = Hugging Face's default, i.e. ``longest_first`` only when ``max_length``
        is given and ``padding`` is False; True = ``longest_first``; or ``"only_first"``/``"only_second"``.
        ``max_length`` defaults to ``model_max_length`` when truncating or padding to ``"max_length"``.
        padding: False, True/``"longest"`` (to the longest in the batch) or ``"max_length"``.
        A sequence longer than ``model_max_length`` is not an error here: the model checks its positions.
        """
        batched = not isinstance(text, str)
        texts = list(text) if batched else [text]
        if text_pair is None:
            pairs: list[str | None] = [None] * len(texts)
        elif batched:
            if isinstance(text_pair, str):
                raise TypeError(
                    "text is a batch (a list) but text_pair is a single str; pass a list of the same length"
                )
            pairs = list(text_pair)
            if len(pairs) != len(texts):
                raise BertkitError(f"text has {len(texts)} entries but text_pair has {len(pairs)}")
        else:
            if not isinstance(text_pair, str):
                raise TypeError(
                    f"text is a single str, so text_pair must be a str too, got {type(text_pair).__name__}"
                )
            # As Hugging Face (and Google's run_classifier): a single empty text_pair means "no pair". In a
            # batch, "" stays an empty second segment ([CLS] A [SEP] [SEP]), again as Hugging Face.
            pairs = [text_pair or None]
        strategy = resolve_truncation(truncation, max_length, padding)
        pad = resolve_padding(padding)
        if max_length is None and (strategy is not None or pad == "max_length"):
            max_length = self.model_max_length
        if max_length is not None and max_length < 0:
            raise BertkitError(f"max_length must be >= 0, got {max_length}")

        rows = [
            self._encode_row(a, b, add_special_tokens, strategy, max_length, return_offsets_mapping,
                             return_special_tokens_mask)
            for a, b in zip(texts, pairs)
        ]  # fmt: skip
        if pad is not None and rows:
            length = max_length if pad == "max_length" else max(len(r["input_ids"]) for r in rows)
            pad_rows(rows, length, self.pad_token_id)
        return to_batch_encoding(rows, batched, return_tensors)

    def _encode_row(
        self,
        a: str,
        b: str | None,
        add_special_tokens: bool,
        strategy: str | None,
        max_length: int | None,
        with_offsets: bool,
        with_special_mask: bool,
    ) -> dict[str, list]:
        offs_a: list[tuple[int, int]] | None = [] if with_offsets else None
        offs_b: list[tuple[int, int]] | None = [] if with_offsets else None
        ids_a = self._encode_text(a, offs_a)
        ids_b = None if b is None else self._encode_text(b, offs_b)
        if strategy is not None:
            num_special = (2 if b is None else 3) if add_special_tokens else 0
            n_a, n_b = truncation_lengths(
                len(ids_a), None if b is None else len(ids_b), max_length, strategy, num_special
            )
            del ids_a[n_a:]
            if offs_a is not None:
                del offs_a[n_a:]
            if ids_b is not None:
                del ids_b[n_b:]
                if offs_b is not None:
                    del offs_b[n_b:]
        len_a, len_b = len(ids_a), (None if ids_b is None else len(ids_b))
        if add_special_tokens:
            cls_, sep = self.cls_token_id, self.sep_token_id
            input_ids = [cls_, *ids_a, sep]
            type_ids = [0] * (len_a + 2)
            special = [1, *[0] * len_a, 1]
            if ids_b is not None:
                input_ids += [*ids_b, sep]
                type_ids += [1] * (len_b + 1)
                special += [*[0] * len_b, 1]
        else:
            input_ids = ids_a + (ids_b or [])
            type_ids = [0] * len_a + [1] * (len_b or 0)
            special = [0] * len(input_ids)
        row = {"input_ids": input_ids, "token_type_ids": type_ids, "attention_mask": [1] * len(input_ids)}
        if with_special_mask:
            row["special_tokens_mask"] = special
        if with_offsets:
            if add_special_tokens:
                offsets = [(0, 0), *offs_a, (0, 0)]
                if offs_b is not None and b is not None:
                    offsets += [*offs_b, (0, 0)]
            else:
                offsets = offs_a + (offs_b if b is not None else [])
            row["offset_mapping"] = offsets
        return row

    # ------------------------------------------------------------------------------------------------
    # Ids -> text
    # ------------------------------------------------------------------------------------------------

    def decode(
        self, ids: Iterable[int], skip_special_tokens: bool = True, clean_up_tokenization_spaces: bool = True
    ) -> str:
        """Ids -> text: ``##`` pieces joined to the previous token, other tokens separated by a space.

        As BertTokenizerFast's WordPiece decoder: with ``clean_up_tokenization_spaces`` the space before
        ``. ? ! ,`` and a few English contractions is dropped (token by token); ``skip_special_tokens``
        drops every special token ([CLS], [SEP], [PAD], [MASK], [UNK]). The text is the normalised one
        (lower-cased, accents stripped for uncased models): use offsets to recover original text.
        """
        tokens = self._tokens
        pieces: list[str] = []
        for i in _as_id_list(ids):
            if not 0 <= i < len(tokens):
                raise BertkitError(f"token id {i} is outside the vocabulary (0..{len(tokens) - 1})")
            if skip_special_tokens and i in self._special_id_set:
                continue
            token = tokens[i]
            if pieces:
                token = token[2:] if token.startswith("##") else " " + token
            if clean_up_tokenization_spaces:
                for dirty, clean in _CLEANUP:
                    token = token.replace(dirty, clean)
            pieces.append(token)
        return "".join(pieces)

    def batch_decode(self, sequences: Iterable[Iterable[int]], **kwargs: Any) -> list[str]:
        """``decode`` for each sequence of a batch (a list of lists or a (B, T) tensor)."""
        return [self.decode(ids, **kwargs) for ids in sequences]


def _spans(text: str) -> Iterator[tuple[int, str]]:
    """(start, chunk) for the chunks of ``str.split()``, located with ``str.find`` (faster than a regex).

    The first occurrence of a chunk at or after the end of the previous one is the chunk itself: only
    whitespace lies in between, and a chunk starts with a non-whitespace character.
    """
    pos = 0
    find = text.find
    for chunk in text.split():
        start = find(chunk, pos)
        pos = start + len(chunk)
        yield start, chunk


def _tokens_from_mapping(vocab: Mapping[str, int]) -> list[str]:
    tokens: list[str | None] = [None] * len(vocab)
    for token, i in vocab.items():
        if not isinstance(i, int) or not 0 <= i < len(vocab) or tokens[i] is not None:
            raise BertkitError(
                f"vocabulary ids must be the integers 0..{len(vocab) - 1}, each used once; "
                f"token {token!r} has id {i!r}"
            )
        tokens[i] = token
    return tokens  # type: ignore[return-value]


def _as_id_list(ids: Any) -> list[int]:
    """A flat list of ints from a list, tuple, 1-D tensor or 1-D array."""
    if hasattr(ids, "tolist"):
        ids = ids.tolist()
    if isinstance(ids, int):
        return [ids]
    ids = list(ids)
    if ids and not isinstance(ids[0], int):
        raise TypeError(
            f"expected a flat sequence of token ids, got elements of type {type(ids[0]).__name__}"
        )
    return ids


def _check_fits_model(tokenizer: BertTokenizer, path: Path) -> None:
    """Where a tokenizer sits beside a model (a checkpoint directory), every id must have an embedding row:
    a vocab.txt longer than config.json's vocab_size fails later as torch's "index out of range"."""
    config_file = path / "config.json"
    if not config_file.is_file():
        return
    try:
        vocab_size = json.loads(config_file.read_text(encoding="utf-8")).get("vocab_size")
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
        return  # the model's own loader reports a damaged config.json with its details
    if isinstance(vocab_size, int) and len(tokenizer.vocab) > vocab_size:
        raise BertkitError(f"{path / VOCAB_FILE} has {len(tokenizer.vocab)} tokens but {config_file} has vocab_size "
                           f"{vocab_size}: ids from {vocab_size} up would have no embedding; use the vocab.txt "
                           "the model was trained with")


def _read_settings(path: Path) -> dict[str, Any]:
    """Constructor arguments from tokenizer_config.json and special_tokens_map.json (either may be absent)."""
    settings: dict[str, Any] = {}
    config_file = path / CONFIG_FILE
    if config_file.is_file():
        try:
            with open(config_file, encoding="utf-8") as f:
                config = json.load(f)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise BertkitError(f"{config_file} is not valid JSON: {e}") from None
        if not isinstance(config, dict):
            raise BertkitError(f"{config_file} must hold a JSON object, got {type(config).__name__}")
        if config.get("do_basic_tokenize", True) is False:
            raise BertkitError(
                f"{config_file} sets do_basic_tokenize=false, which bertkit does not support "
                f"(WordPiece straight on whitespace-split text); remove the key to use BERT's basic tokenizer"
            )
        kinds = {"do_lower_case": (bool,), "tokenize_chinese_chars": (bool,), "strip_accents": (bool, type(None)),
                 "model_max_length": (int, float), "max_input_chars_per_word": (int,)}
        for key, types in kinds.items():
            if key in config:
                value = config[key]
                if not isinstance(value, types) or (bool not in types and isinstance(value, bool)):
                    want = " or ".join("null" if t is type(None) else t.__name__ for t in types)
                    raise BertkitError(f"{config_file}: {key} must be {want}, got {value!r}"
                                       + (" (a string: write true/false without quotes)" if isinstance(value, str)
                                          else ""))
                settings[key] = value
        if config.get("never_split"):
            settings["never_split"] = list(config["never_split"])
        for key in (*SPECIAL_TOKEN_KEYS, "additional_special_tokens"):
            if config.get(key) is not None:
                settings[key] = config[key]
    map_file = path / SPECIAL_TOKENS_MAP_FILE
    if map_file.is_file():  # Hugging Face lets this file override the config's special tokens
        with open(map_file, encoding="utf-8") as f:
            settings.update(
                {
                    k: v
                    for k, v in json.load(f).items()
                    if k in (*SPECIAL_TOKEN_KEYS, "additional_special_tokens")
                }
            )
    for key in SPECIAL_TOKEN_KEYS:
        if key in settings:
            settings[key] = _token_content(settings[key], key)
    if "additional_special_tokens" in settings:
        settings["additional_special_tokens"] = [
            _token_content(t, "additional_special_tokens") for t in settings["additional_special_tokens"]
        ]
    if isinstance(settings.get("model_max_length"), float):  # HF writes 1e30 for "no limit"
        settings["model_max_length"] = int(settings["model_max_length"])
    return settings


def _token_content(value: Any, key: str) -> str:
    """A special token from a config: a plain str, or Hugging Face's serialised AddedToken dict."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    raise BertkitError(f"{key} in the tokenizer config must be a string or {{'content': ...}}, got {value!r}")
