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

import functools
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
    RowInfo,
    pad_rows,
    resolve_padding,
    resolve_truncation,
    to_batch_encoding,
    truncation_lengths,
    word_index,
)
from bertkit.tokenization.loading import (
    ADDED_TOKENS_FILE,
    CONFIG_FILE,
    SPECIAL_TOKEN_KEYS,
    SPECIAL_TOKENS_MAP_FILE,
    TOKENIZER_FILE,
    check_fits_model,
    merge_tokenizer_json,
    read_settings,
    read_tokenizer_json,
)
from bertkit.tokenization.wordpiece import VOCAB_FILE, Memo, WordPiece, load_vocab, write_vocab_file

__all__ = ["BertTokenizer", "BertTokenizerFast"]

# WordPiece decoder clean-up (tokenizers' `decoders::wordpiece::cleanup`), applied to each token with
# the space that joins it to the previous one.
_CLEANUP = (
    (" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"), (" 'm", "'m"),
    (" do not", " don't"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re"),
)  # fmt: skip
# transformers' `clean_up_tokenization`, applied to the whole decoded string when
# clean_up_tokenization_spaces is on (no " do not" here, unlike the decoder's list).
_CLEANUP_TEXT = (
    (" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"), (" 'm", "'m"),
    (" 's", "'s"), (" 've", "'ve"), (" 're", "'re"),
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
        added_tokens: Sequence[str] = (),
        model_max_length: int = 512,
        max_input_chars_per_word: int = 100,
        clean_up_tokenization_spaces: bool = False,
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
        # Tokens added with add_tokens: cut out of the text before WordPiece, like special tokens, but
        # matched case-insensitively by an uncased tokenizer (Hugging Face matches them on normalised text).
        self.added_tokens: list[str] = []
        self.model_max_length = int(model_max_length)
        self.max_input_chars_per_word = max_input_chars_per_word
        self.clean_up_tokenization_spaces = bool(clean_up_tokenization_spaces)
        self.cache_size = cache_size

        missing = [t for t in (*self._special_list(), *added_tokens) if t not in self.vocab]
        if missing:
            raise BertkitError(
                f"the vocabulary ({len(tokens)} tokens) lacks the special tokens {missing}; add them to the "
                f"vocabulary or pass the names it uses (unk_token=, sep_token=, pad_token=, cls_token=, "
                f"mask_token=)"
            )
        self.added_tokens = list(dict.fromkeys(added_tokens))
        self._build()

    def _special_list(self) -> list[str]:
        return [self.unk_token, self.sep_token, self.pad_token, self.cls_token, self.mask_token,
                *self.additional_special_tokens]

    def _build(self) -> None:
        """Derived tables and caches (rebuilt after unpickling rather than shipped to DataLoader workers)."""
        self.all_special_tokens: list[str] = list(dict.fromkeys(self._special_list()))
        self.all_special_ids: list[int] = [self.vocab[t] for t in self.all_special_tokens]
        self.unk_token_id = self.vocab[self.unk_token]
        self.sep_token_id = self.vocab[self.sep_token]
        self.pad_token_id = self.vocab[self.pad_token]
        self.cls_token_id = self.vocab[self.cls_token]
        self.mask_token_id = self.vocab[self.mask_token]
        self._basic = BasicTokenizer(
            self.do_lower_case, self.strip_accents, self.tokenize_chinese_chars, self.never_split
        )
        self._wordpiece = WordPiece(
            self.vocab, self.unk_token, self.max_input_chars_per_word, "##", self.cache_size
        )
        self._chunks = Memo(self._encode_chunk, self.cache_size)
        self._special_id_set = frozenset(self.all_special_ids)
        # word_ids: a token starts a word unless it is a WordPiece continuation ("##...").
        self._continuation_ids = frozenset(i for i, t in enumerate(self._tokens) if t.startswith("##"))
        fold = self.do_lower_case
        plain = [t for t in self.added_tokens if t not in self._special_id_set and t not in self.all_special_tokens]
        self._match_ids = {t: self.vocab[t] for t in self.all_special_tokens}
        self._match_ids.update({(t.lower() if fold else t): self.vocab[t] for t in plain})
        firsts = {t[0] for t in self.all_special_tokens} | {c for t in plain for c in {t[0], t[0].lower(), t[0].upper()}}
        self._special_first_chars = "".join(sorted(firsts))
        # Longest first, so that at one position the longest special token wins (leftmost-longest).
        patterns = [(t, re.escape(t)) for t in self.all_special_tokens]
        patterns += [(t, f"(?i:{re.escape(t)})" if fold else re.escape(t)) for t in plain]
        self._special_re = re.compile("|".join(p for _, p in sorted(patterns, key=lambda x: len(x[0]), reverse=True)))

    def __getstate__(self) -> dict:
        # What a DataLoader worker receives: the settings and the token list, not caches or derived maps.
        derived = ("vocab", "ids_to_tokens", "_basic", "_wordpiece", "_chunks", "_special_id_set",
                   "_special_first_chars", "_special_re", "_continuation_ids", "_match_ids")  # fmt: skip
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
        """Load a tokenizer directory: ``vocab.txt`` + ``tokenizer_config.json`` (+ ``special_tokens_map.json``,
        ``added_tokens.json``), or, without ``vocab.txt``, the ``tokenizer.json`` + ``tokenizer_config.json``
        that transformers 5 saves (its WordPiece model and BertNormalizer settings; see ``loading``).

        Settings (``do_lower_case``, ``strip_accents``, ``tokenize_chinese_chars``, ``never_split``,
        ``model_max_length``, ``clean_up_tokenization_spaces``, special tokens) come from the files; keyword
        arguments override them.
        """
        from bertkit.hub import resolve_directory

        path = resolve_directory(path, "tokenizer directory")
        if not path.is_dir():
            raise MissingFileError(
                f"tokenizer directory {path} does not exist; pass the checkpoint directory that holds "
                f"{VOCAB_FILE} (or {TOKENIZER_FILE}) and {CONFIG_FILE}"
            )
        vocab: Path | dict[str, int] = path / VOCAB_FILE
        source = json_file = path / TOKENIZER_FILE
        settings = read_settings(path)
        if vocab.is_file():
            source = vocab
        elif json_file.is_file():
            vocab, from_json, special = read_tokenizer_json(json_file)
            settings = merge_tokenizer_json(from_json, special, settings, overrides, json_file, path / CONFIG_FILE)
        else:
            raise MissingFileError(
                f"{vocab} not found (nor {TOKENIZER_FILE}): a BERT tokenizer directory needs {VOCAB_FILE} (and "
                f"{CONFIG_FILE}), or transformers' {TOKENIZER_FILE}; copy them from the checkpoint, or build one "
                f"with BertTokenizer(vocab).save_pretrained({str(path)!r})"
            )
        settings.update(overrides)
        if "do_lower_case" not in settings:
            raise MissingFileError(
                f"{path / CONFIG_FILE} not found (or it has no do_lower_case), so whether this checkpoint is "
                f"cased is unknown: pass do_lower_case=True for an uncased checkpoint or False for a cased one"
            )
        tokenizer = cls(vocab, **settings)
        check_fits_model(len(tokenizer.vocab), path, source)
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
            "clean_up_tokenization_spaces": self.clean_up_tokenization_spaces,
            **special_map,
        }
        written = [write_vocab_file(self._tokens, path / VOCAB_FILE)]
        files = [(CONFIG_FILE, config), (SPECIAL_TOKENS_MAP_FILE, special_map)]
        if self.added_tokens:  # Hugging Face's file for them: {token: id}
            files.append((ADDED_TOKENS_FILE, {t: self.vocab[t] for t in self.added_tokens}))
        for name, data in files:
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

    def get_vocab(self) -> dict[str, int]:
        """A copy of ``{token: id}``, added tokens included (``len(tok.get_vocab()) == len(tok)``)."""
        return dict(self.vocab)

    def __repr__(self) -> str:
        return (
            f"BertTokenizer(vocab_size={self.vocab_size}, do_lower_case={self.do_lower_case}, "
            f"strip_accents={self.strip_accents}, tokenize_chinese_chars={self.tokenize_chinese_chars}, "
            f"model_max_length={self.model_max_length})"
        )

    def add_tokens(self, new_tokens: str | Sequence[str], special_tokens: bool = False) -> int:
        """Add tokens at the end of the vocabulary; returns how many were new (resize the model with
        ``model.resize_token_embeddings(len(tokenizer))``). As in Hugging Face, an added token is cut out of
        the text before WordPiece wherever it occurs (case-insensitively for an uncased tokenizer); with
        ``special_tokens=True`` it becomes an additional special token (matched exactly, skipped by decode).
        """
        tokens = [new_tokens] if isinstance(new_tokens, str) else list(new_tokens)
        bad = [t for t in tokens if not isinstance(t, str) or not t or t != t.strip()]
        if bad:
            raise BertkitError(f"tokens to add must be non-empty strings without surrounding spaces, got {bad}")
        added = 0
        for token in dict.fromkeys(tokens):
            if token not in self.vocab:
                self.vocab[token] = len(self._tokens)
                self.ids_to_tokens[len(self._tokens)] = token
                self._tokens.append(token)
                added += 1
            elif not special_tokens:
                continue  # already a WordPiece token: Hugging Face leaves it to WordPiece too
            target = self.additional_special_tokens if special_tokens else self.added_tokens
            if token not in target and token not in self.all_special_tokens:
                target.append(token)
        self._build()
        return added

    def add_special_tokens(self, special_tokens_dict: Mapping[str, str | Sequence[str]]) -> int:
        """Set special tokens (``pad_token``, ``cls_token``, ... or ``additional_special_tokens``: a list),
        adding the ones the vocabulary lacks; returns how many were new. Additional special tokens are
        appended to those already there (transformers can replace the list; the old ones stay in the
        vocabulary either way)."""
        unknown = sorted(set(special_tokens_dict) - {*SPECIAL_TOKEN_KEYS, "additional_special_tokens"})
        if unknown:
            raise BertkitError(f"unknown special token keys {unknown}; use {SPECIAL_TOKEN_KEYS} or "
                               "additional_special_tokens")
        added = 0
        for key, value in special_tokens_dict.items():
            if key == "additional_special_tokens":
                added += self.add_tokens([value] if isinstance(value, str) else list(value), special_tokens=True)
            else:
                if not isinstance(value, str):
                    raise BertkitError(f"{key} must be a str, got {value!r}")
                added += self.add_tokens(value, special_tokens=True)
                if value in self.additional_special_tokens:  # now a named special token instead
                    self.additional_special_tokens.remove(value)
                setattr(self, key, value)
        self._build()
        return added

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

    # What transformers' data collators read besides pad(): BERT pads and truncates on the right only.
    padding_side = "right"
    truncation_side = "right"
    is_fast = True  # answers as BertTokenizerFast does (offsets, word_ids)
    model_input_names = ["input_ids", "token_type_ids", "attention_mask"]

    def get_special_tokens_mask(self, token_ids_0: Sequence[int], token_ids_1: Sequence[int] | None = None,
                                already_has_special_tokens: bool = False) -> list[int]:
        """1 for a special token, 0 otherwise (what masked-LM collators keep unmasked). With
        ``already_has_special_tokens`` the ids are a whole encoded sequence; without, the mask is that of
        ``[CLS] A [SEP]`` or ``[CLS] A [SEP] B [SEP]`` built from them, as Hugging Face's."""
        if already_has_special_tokens:
            if token_ids_1 is not None:
                raise BertkitError("get_special_tokens_mask: give one sequence when already_has_special_tokens=True")
            return [1 if int(i) in self._special_id_set else 0 for i in token_ids_0]
        mask = [1] + [0] * len(token_ids_0) + [1]
        return mask if token_ids_1 is None else mask + [0] * len(token_ids_1) + [1]

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
                token = m.group()
                i = self._match_ids.get(token)
                ids.append(self._match_ids[token.lower()] if i is None else i)
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
        text: str | Sequence[str] | Sequence[Sequence[str]],
        text_pair: str | Sequence[str] | Sequence[Sequence[str]] | None = None,
        *,
        add_special_tokens: bool = True,
        max_length: int | None = None,
        truncation: bool | str | None = None,
        padding: bool | str = False,
        pad_to_multiple_of: int | None = None,
        return_tensors: str | None = None,
        return_token_type_ids: bool | None = None,
        return_attention_mask: bool | None = None,
        return_offsets_mapping: bool = False,
        return_special_tokens_mask: bool = False,
        return_length: bool = False,
        is_split_into_words: bool = False,
        return_overflowing_tokens: bool = False,
        stride: int = 0,
    ) -> BatchEncoding:
        """Encode one text / pair, or a batch of them.

        Returns a BatchEncoding (a dict) with ``input_ids``, ``token_type_ids``, ``attention_mask`` and, when
        asked, ``special_tokens_mask``, ``offset_mapping`` ((start, end) into the original text; (0, 0)
        for [CLS]/[SEP]/[PAD]) and ``length`` (tokens per row, padding included). A str gives lists of ints,
        a list of str gives lists of lists; with ``return_tensors="pt"`` / ``"np"`` every value is a (B, T)
        tensor / int64 array ((B, T, 2) for offsets, (B,) for length), B = 1 for a single text.
        ``return_token_type_ids=False`` / ``return_attention_mask=False`` leave those keys out (None or True:
        included). The BatchEncoding also maps tokens to words and characters: ``word_ids(i)``,
        ``sequence_ids(i)``, ``tokens(i)``, ``char_to_token``, ``token_to_chars``, ``word_to_tokens``.

        truncation: None (default) = Hugging Face's default, i.e. ``longest_first`` only when ``max_length``
        is given and ``padding`` is False; True = ``longest_first``; or ``"only_first"``/``"only_second"``.
        ``max_length`` defaults to ``model_max_length`` when truncating or padding to ``"max_length"``.
        padding: False, True/``"longest"`` (to the longest in the batch) or ``"max_length"``; with
        ``pad_to_multiple_of`` the padded length is rounded up to a multiple of it.
        is_split_into_words: each text is a list of words (NER); word ids index them, offsets are
        relative to each word, as in Hugging Face.
        return_overflowing_tokens: the truncated text (the single text, or the one ``only_first`` /
        ``only_second`` names) is cut into windows that overlap by ``stride`` tokens, each its own row;
        ``overflow_to_sample_mapping`` gives each row's input index. The output is then always batched.
        A sequence longer than ``model_max_length`` is not an error here: the model checks its positions.
        """
        texts, pairs, batched = _inputs(text, text_pair, is_split_into_words)
        strategy = resolve_truncation(truncation, max_length, padding)
        pad = resolve_padding(padding)
        if max_length is None and (strategy is not None or pad == "max_length"):
            max_length = self.model_max_length
        _check_lengths(max_length, pad_to_multiple_of, stride, return_overflowing_tokens)

        rows, infos, sample_mapping = self._encode_rows(
            texts, pairs, add_special_tokens, strategy, max_length, return_overflowing_tokens, stride,
            return_offsets_mapping, return_special_tokens_mask, is_split_into_words)
        self._pad_and_select(rows, pad, max_length, pad_to_multiple_of, return_token_type_ids, return_attention_mask)
        batched = batched or return_overflowing_tokens
        out = _batch_encoding(rows, sample_mapping, batched, return_tensors, return_length, return_overflowing_tokens)
        self._attach_rows(out, infos, batched or return_tensors is not None, is_split_into_words)
        return out

    def _pad_and_select(self, rows: list[dict[str, list]], pad: str | None, max_length: int | None,
                        multiple: int | None, token_type_ids: bool | None, attention_mask: bool | None) -> None:
        """In place: pad ``rows`` to ``max_length`` or the longest row, rounded up to ``multiple`` (``pad`` None:
        not at all), then drop the keys the caller turned off (False; None or True keeps them)."""
        if pad is not None and rows:
            length = max_length if pad == "max_length" else max(len(r["input_ids"]) for r in rows)
            pad_rows(rows, _round_up(length, multiple), self.pad_token_id)
        for key, wanted in (("token_type_ids", token_type_ids), ("attention_mask", attention_mask)):
            if wanted is False:
                for row in rows:
                    del row[key]

    def _encode_rows(self, texts: list, pairs: list, add_special: bool, strategy: str | None,
                     max_length: int | None, overflow: bool, stride: int, with_offsets: bool,
                     special_mask: bool, split: bool) -> tuple[list[dict[str, list]], list[RowInfo], list[int]]:
        """(the unpadded output rows, what each row's word and character maps need, each row's input index):
        each text or pair segmented once, then cut into one row or, with ``overflow``, several windows."""
        rows: list[dict[str, list]] = []
        infos: list[RowInfo] = []
        sample_mapping: list[int] = []
        for index, (a, b) in enumerate(zip(texts, pairs)):
            seg_a = self._segment(a, with_offsets, split)
            seg_b = None if b is None else self._segment(b, with_offsets, split)
            for (win_a, start_a), (win_b, start_b) in self._windows(
                seg_a, seg_b, add_special, strategy, max_length, overflow, stride
            ):
                rows.append(self._assemble(win_a, win_b, add_special, special_mask))
                infos.append(RowInfo(len(win_a[0]), None if win_b is None else len(win_b[0]), add_special,
                                     win_a[2], None if win_b is None else win_b[2], a, b, start_a, start_b))
                sample_mapping.append(index)
        return rows, infos, sample_mapping

    def _attach_rows(self, out: BatchEncoding, infos: list[RowInfo], nested: bool, split: bool) -> None:
        """What ``word_ids``, ``tokens``, ``char_to_token``... of the output need (attributes, not keys)."""
        out._row_info = infos
        out._continuation_ids = self._continuation_ids
        out._batched = nested  # values are per-row (lists of lists, or (B, T) tensors)
        out._token_strings = self.convert_ids_to_tokens
        out._offsets_of = functools.partial(self._text_offsets, split=split)  # picklable, unlike a lambda

    def _text_offsets(self, text: Any, split: bool) -> list[tuple[int, int]]:
        """Offsets of every token of one input text (no special tokens), as ``return_offsets_mapping`` gives."""
        return self._segment(text, True, split)[1]

    def _segment(self, text: Any, with_offsets: bool, split: bool) -> tuple[list, list | None, list | None]:
        """(ids, offsets or None, word index per token or None: worked out later from the ids)."""
        offsets: list[tuple[int, int]] | None = [] if with_offsets else None
        if not split:
            return self._encode_text(text, offsets), offsets, None
        if isinstance(text, str) or not all(isinstance(w, str) for w in text):
            raise TypeError("with is_split_into_words=True each text is a list of words (str), got "
                            f"{type(text).__name__}: {str(text)[:60]!r}")
        ids: list[int] = []
        words: list[int] = []
        for w, word in enumerate(text):
            n = len(ids)
            ids += self._encode_text(word, offsets)  # offsets relative to the word, as Hugging Face gives them
            words += [w] * (len(ids) - n)
        return ids, offsets, words

    def _windows(self, seg_a, seg_b, add_special: bool, strategy: str | None, max_length: int | None,
                 overflow: bool, stride: int):
        """The (A, B) segment slices of each output row, each with the index of its first token in its text:
        one row, or overlapping windows with ``overflow``."""
        len_a, len_b = len(seg_a[0]), None if seg_b is None else len(seg_b[0])
        if strategy is None:
            return [((seg_a, 0), (seg_b, 0))]
        num_special = (2 if seg_b is None else 3) if add_special else 0
        n_a, n_b = truncation_lengths(len_a, len_b, max_length, strategy, num_special)
        cut = lambda seg, lo, hi: (seg[0][lo:hi], None if seg[1] is None else seg[1][lo:hi],  # noqa: E731
                                   None if seg[2] is None else seg[2][lo:hi])
        if not overflow or (n_a == len_a and n_b == len_b):
            return [((cut(seg_a, 0, n_a), 0), (None if seg_b is None else cut(seg_b, 0, n_b), 0))]
        if seg_b is not None and strategy == "longest_first":
            raise BertkitError("return_overflowing_tokens on text pairs needs truncation='only_first' or "
                               "'only_second' (which text to cut into windows), not 'longest_first'")
        which, full, keep = (0, seg_a, n_a) if n_a != len_a else (1, seg_b, n_b)
        if stride >= keep:
            raise BertkitError(f"stride {stride} must be smaller than the {keep} tokens of the text that fit in "
                               f"each window (max_length {max_length}); use a smaller stride or a larger max_length")
        if full[2] is None:  # word ids count from the start of the text, also in later windows
            full = (*full[:2], word_index(full[0], self._continuation_ids))
        rows, start = [], 0
        while True:
            stop = min(start + keep, len(full[0]))
            window = (cut(full, start, stop), start)
            rows.append((window, (seg_b, 0)) if which == 0 else ((seg_a, 0), window))
            if stop == len(full[0]):
                return rows
            start += keep - stride

    def _assemble(self, seg_a, seg_b, add_special_tokens: bool, with_special_mask: bool) -> dict[str, list]:
        ids_a, offs_a = seg_a[0], seg_a[1]
        ids_b, offs_b = (None, None) if seg_b is None else seg_b[:2]
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
        if offs_a is not None:
            if add_special_tokens:
                offsets = [(0, 0), *offs_a, (0, 0)]
                if offs_b is not None:
                    offsets += [*offs_b, (0, 0)]
            else:
                offsets = offs_a + (offs_b or [])
            row["offset_mapping"] = offsets
        return row

    def pad(
        self,
        encoded_inputs: Mapping[str, Any] | Sequence[Mapping[str, Any]],
        padding: bool | str = True,
        max_length: int | None = None,
        pad_to_multiple_of: int | None = None,
        return_tensors: str | None = None,
    ) -> BatchEncoding:
        """Pad already-encoded inputs, as Hugging Face's ``tokenizer.pad`` (what DataCollatorWithPadding calls):
        a BatchEncoding / dict of lists, or a list of per-example dicts. ``input_ids``, ``token_type_ids``,
        ``attention_mask`` (made when absent), ``special_tokens_mask`` and ``offset_mapping`` are padded on
        the right; other keys (labels, ...) are passed through unchanged."""
        if isinstance(encoded_inputs, Mapping):
            ids = encoded_inputs["input_ids"]
            batched = len(ids) > 0 and not isinstance(_as_py(ids)[0], int)
            columns = {k: _as_py(v) if batched else [_as_py(v)] for k, v in encoded_inputs.items()}
            n = len(columns["input_ids"])
            examples = [{k: v[i] for k, v in columns.items()} for i in range(n)]
        else:
            batched, examples = True, [{k: _as_py(v) for k, v in e.items()} for e in encoded_inputs]
        if any("input_ids" not in e for e in examples):
            raise BertkitError("pad needs input_ids in every example (the tokenizer's output)")
        padded_keys = ("input_ids", "token_type_ids", "attention_mask", "special_tokens_mask", "offset_mapping")
        rows = [{k: list(e[k]) for k in padded_keys if k in e} for e in examples]
        for i, row in enumerate(rows):
            row.setdefault("attention_mask", [1] * len(row["input_ids"]))
            n = len(row["input_ids"])
            uneven = {k: len(v) for k, v in row.items() if len(v) != n}
            if uneven:  # padded as they are, the tokens and their mask or segments would no longer line up
                raise BertkitError(f"pad: example {i} has {n} input_ids but "
                                   + ", ".join(f"{k} of length {m}" for k, m in uneven.items())
                                   + "; every column of an example is one entry per token: encode it again")
        pad = resolve_padding(padding)
        if pad == "max_length" and max_length is None:
            max_length = self.model_max_length
        if pad is not None and rows:
            length = max_length if pad == "max_length" else max(len(r["input_ids"]) for r in rows)
            pad_rows(rows, _round_up(length, pad_to_multiple_of), self.pad_token_id)
        out = to_batch_encoding(rows, batched, return_tensors)
        for key in examples[0] if examples else ():
            if key not in padded_keys:
                values = [e[key] for e in examples]
                out[key] = _as_tensor(values if batched else values[0], return_tensors)
        return out

    # ------------------------------------------------------------------------------------------------
    # Ids -> text
    # ------------------------------------------------------------------------------------------------

    def decode(
        self,
        ids: Iterable[int],
        skip_special_tokens: bool = False,
        clean_up_tokenization_spaces: bool | None = None,
    ) -> str:
        """Ids -> text, as BertTokenizerFast: special tokens are kept unless ``skip_special_tokens=True``.

        ``##`` pieces are joined to the previous token, other tokens separated by a space, and the WordPiece
        decoder's clean-up drops the space before ``. ? ! ,`` and a few English contractions, token by token
        (so ``"don ' t"`` stays). ``clean_up_tokenization_spaces=True`` then applies transformers' clean-up to
        the whole string (``"don ' t"`` -> ``"don't"``); None takes the tokenizer's setting (from
        ``tokenizer_config.json``, default False as in transformers 5). ``skip_special_tokens`` drops every
        special token ([CLS], [SEP], [PAD], [MASK], [UNK], additional ones). The text is the normalised one
        (lower-cased, accents stripped for uncased models): use offsets to recover original text.
        """
        tokens = self._tokens
        kept: list[str] = []
        for i in _as_id_list(ids):
            if not 0 <= i < len(tokens):
                raise BertkitError(f"token id {i} is outside the vocabulary (0..{len(tokens) - 1})")
            if not (skip_special_tokens and i in self._special_id_set):
                kept.append(tokens[i])
        text = self.convert_tokens_to_string(kept)
        if clean_up_tokenization_spaces is None:
            clean_up_tokenization_spaces = self.clean_up_tokenization_spaces
        if clean_up_tokenization_spaces:
            for dirty, clean in _CLEANUP_TEXT:
                text = text.replace(dirty, clean)
        return text

    def batch_decode(self, sequences: Iterable[Iterable[int]], **kwargs: Any) -> list[str]:
        """``decode`` for each sequence of a batch (a list of lists or a (B, T) tensor)."""
        return [self.decode(ids, **kwargs) for ids in sequences]

    def convert_tokens_to_string(self, tokens: Sequence[str]) -> str:
        """Token strings -> text with the WordPiece decoder (tokenizers' ``decoders.WordPiece``): a ``##``
        piece joins the previous token (the first token keeps its ``##``), the others get a space, and the
        space before ``. ? ! ,`` and a few contractions is dropped token by token."""
        pieces: list[str] = []
        for token in tokens:
            if pieces:
                token = token[2:] if token.startswith("##") else " " + token
            for dirty, clean in _CLEANUP:
                token = token.replace(dirty, clean)
            pieces.append(token)
        return "".join(pieces)


def _inputs(text: Any, text_pair: Any, split: bool) -> tuple[list[Any], list[Any], bool]:
    """(texts, their pairs or Nones, whether the call was batched) from ``__call__``'s first two arguments."""
    accepted = ("the tokenizer takes a str, a list of str, or with is_split_into_words=True a list of words (or "
                "a list of such lists)")
    if not isinstance(text, (str, list, tuple)):
        raise BertkitError(f"{accepted}; got {type(text).__name__} {text!r:.60}")
    if not split and not isinstance(text, str):
        bad = next((t for t in text if not isinstance(t, str)), None)
        if bad is not None:
            hint = ": for pre-split words pass is_split_into_words=True" if isinstance(bad, (list, tuple)) else ""
            raise BertkitError(f"{accepted}; got a list holding {type(bad).__name__} {bad!r:.60}{hint}")
    if split:
        batched = not (isinstance(text, (list, tuple)) and (not text or isinstance(text[0], str)))
    else:
        batched = not isinstance(text, str)
    texts = list(text) if batched else [text]
    if text_pair is None:
        return texts, [None] * len(texts), batched
    if batched:
        if isinstance(text_pair, str) or (split and text_pair and isinstance(text_pair[0], str)):
            raise TypeError(
                "text is a batch (a list) but text_pair is a single str (or word list); pass a list of the same length"
            )
        pairs = list(text_pair)
        if len(pairs) != len(texts):
            raise BertkitError(f"text has {len(texts)} entries but text_pair has {len(pairs)}")
        return texts, pairs, batched
    if not isinstance(text_pair, list if split else str):
        raise TypeError(f"text is a single text, so text_pair must be one too, got {type(text_pair).__name__}")
    # As Hugging Face (and Google's run_classifier): a single empty text_pair means "no pair". In a batch,
    # "" stays an empty second segment ([CLS] A [SEP] [SEP]), again as Hugging Face.
    return texts, [text_pair or None], batched


def _check_lengths(max_length: int | None, pad_to_multiple_of: int | None, stride: int, overflow: bool) -> None:
    if max_length is not None and max_length < 0:
        raise BertkitError(f"max_length must be >= 0, got {max_length}")
    if pad_to_multiple_of is not None and (isinstance(pad_to_multiple_of, bool) or pad_to_multiple_of < 1):
        raise BertkitError(f"pad_to_multiple_of must be a positive int, got {pad_to_multiple_of!r}")
    if stride < 0 or (stride and not overflow):
        raise BertkitError(f"stride={stride} needs return_overflowing_tokens=True and a value >= 0 (the number "
                           "of tokens consecutive windows share)")


def _round_up(length: int, multiple: int | None) -> int:
    return length if multiple is None else -(-length // multiple) * multiple


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


def _as_py(values: Any) -> Any:
    return values.tolist() if hasattr(values, "tolist") else values


def _as_tensor(values: list, return_tensors: str | None) -> Any:
    if return_tensors == "pt":
        import torch

        return torch.tensor(values)
    if return_tensors == "np":
        import numpy as np

        return np.asarray(values)
    return values


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


def _batch_encoding(rows: list[dict[str, list]], sample_mapping: list[int], batched: bool,
                    return_tensors: str | None, return_length: bool, overflow: bool) -> BatchEncoding:
    """The output of padded ``rows``, with ``length`` and ``overflow_to_sample_mapping`` when asked."""
    out = to_batch_encoding(rows, batched, return_tensors)
    if return_length:
        lengths = [len(r["input_ids"]) for r in rows]  # [n] for one text too, as transformers
        out["length"] = _as_tensor(lengths, return_tensors)
    if overflow:
        out["overflow_to_sample_mapping"] = _as_tensor(sample_mapping, return_tensors)
    return out

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


# The name code written against transformers imports; one class, with BertTokenizerFast's behaviour.
BertTokenizerFast = BertTokenizer
