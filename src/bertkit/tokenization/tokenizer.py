"""BertTokenizer: text -> BERT input ids, with character offsets, token for token as BertTokenizerFast.

The class holds the vocabulary, the special tokens and the settings; docs/tokenizer.md says which module does
the rest.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from bertkit._parallel import job_of
from bertkit.errors import BertkitError, MissingFileError, given_path
from bertkit.outputs import atomic_write_json
from bertkit.staging import staged
from bertkit.tokenization.basic import BasicTokenizer
from bertkit.tokenization.batch import (
    Segment,
    as_tensor,
    encode_rows,
    pad_rows,
    plan_call,
    split_inputs,
    to_batch_encoding,
)
from bertkit.tokenization.decoding import as_id_list, cleaned_up, wordpiece_text
from bertkit.tokenization.encoding import BatchEncoding
from bertkit.tokenization.loading import (
    ADDED_TOKENS_FILE,
    CONFIG_FILE,
    SETTING_TYPES,
    SPECIAL_TOKEN_KEYS,
    SPECIAL_TOKENS_MAP_FILE,
    TOKENIZER_FILE,
    added_past,
    check_fits_model,
    read_settings,
    read_tokenizer_json,
    tokenizer_json,
    typed_setting,
)
from bertkit.tokenization.pad import pad_examples
from bertkit.tokenization.text import TextEncoder, check_added_tokens
from bertkit.tokenization.wordpiece import VOCAB_FILE, WordPiece, load_vocab, unique_tokens, write_vocab_file

__all__ = ["BertTokenizer", "BertTokenizerFast"]

# transformers' model_max_length for a tokenizer whose files set none (its VERY_LARGE_INTEGER): no limit of the
# tokenizer's own, so a model's positions decide where its texts are cut (sentence-transformers caps it at them)
NO_MODEL_MAX_LENGTH = int(1e30)
def _right_only(name: str, value: object) -> None:
    if value != "right":
        raise BertkitError(f"{name}={value!r}: bertkit pads and truncates on the right only (BERT's layout; "
                           "the encoder's unpadded path expects right padding); leave it \"right\"")


# What _build makes the text pipeline from, with how to change it. transformers' fast tokenizer ignores an assignment
# (until saved and loaded again); a pickled copy (DataLoader and datasets.map workers) rebuilt from the new value would
# give other ids than the tokenizer it was copied from, so an assignment is refused.
_BUILT_FROM = {**dict.fromkeys(("do_lower_case", "strip_accents", "tokenize_chinese_chars", "max_input_chars_per_word"),
                               "load the tokenizer with it: AutoTokenizer.from_pretrained(path, {name}={value!r})"),
               "additional_special_tokens": "add them with tok.add_special_tokens({{'{name}': {value!r}}})",
               "added_tokens": "add them with tok.add_tokens({value!r})"}


class _RightOnly:
    """A tokenizer attribute that reads "right" and refuses any other value set to it, naming itself."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, owner: type | None = None) -> str:
        return "right"

    def __set__(self, obj: Any, value: object) -> None:
        _right_only(self.name, value)


class BertTokenizer:
    """BERT's WordPiece tokenizer, with the behaviour of Hugging Face's BertTokenizerFast.

    >>> tok = BertTokenizer.from_pretrained("models/minilm")
    >>> tok("Hello, world!")["input_ids"]
    [101, 7592, 1010, 2088, 999, 102]

    ``vocab`` is a ``vocab.txt`` path, a ``{token: id}`` dict with ids 0..n-1 or the list of tokens in id
    order. The special tokens must be in it. See ``__call__`` for encoding, ``decode`` for the way back.
    """

    def __init__(
        self,
        vocab: str | os.PathLike | Mapping[str, int] | Sequence[str],
        do_lower_case: bool = True,
        strip_accents: bool | None = None,
        tokenize_chinese_chars: bool = True,
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
    ):
        if isinstance(vocab, Mapping):
            tokens = _tokens_from_mapping(vocab)
        elif isinstance(vocab, (list, tuple)):  # e.g. a vocabulary just learned (tokenization.trainer)
            tokens = unique_tokens(vocab, "the vocabulary")
        else:
            tokens = load_vocab(vocab)
        self._tokens = tokens
        settings = {"do_lower_case": do_lower_case, "strip_accents": strip_accents,
                    "tokenize_chinese_chars": tokenize_chinese_chars, "model_max_length": model_max_length,
                    "max_input_chars_per_word": max_input_chars_per_word,
                    "clean_up_tokenization_spaces": clean_up_tokenization_spaces}
        for key, value in settings.items():  # as transformers refuses them: bool("false") would lower-case
            typed_setting(value, SETTING_TYPES[key], key)
        # WordPiece segments words with these first tokens only: add_tokens appends tokens that are matched in the
        # text, never produced from a word's pieces (Hugging Face keeps them out of its WordPiece model).
        self._wordpiece_size = len(tokens)
        self.do_lower_case = do_lower_case
        self.strip_accents = strip_accents
        self.tokenize_chinese_chars = tokenize_chinese_chars
        self.unk_token, self.sep_token, self.pad_token = unk_token, sep_token, pad_token
        self.cls_token, self.mask_token = cls_token, mask_token
        self.additional_special_tokens = list(additional_special_tokens)
        # Tokens added with add_tokens: cut out of the text before WordPiece, like special tokens, but matched
        # normalised in the normalised text, as Hugging Face matches them (an uncased "NAIVE" is the added "naïve").
        self.added_tokens: list[str] = list(dict.fromkeys(added_tokens))
        self.model_max_length = int(model_max_length)
        self.max_input_chars_per_word = max_input_chars_per_word
        self.clean_up_tokenization_spaces = clean_up_tokenization_spaces

        missing = [t for t in (*self._special_list(), *added_tokens) if t not in tokens]
        if missing:
            raise BertkitError(
                f"the vocabulary ({len(tokens)} tokens) lacks the special tokens {missing}; add them to the "
                f"vocabulary or pass the names it uses (unk_token=, sep_token=, pad_token=, cls_token=, "
                f"mask_token=)"
            )
        self._build()
        check_added_tokens(self._text.basic, self.added_tokens, self.all_special_tokens)

    def __setattr__(self, name: str, value: Any) -> None:
        # tok.pad_token = "[MASK]", as transformers users write it: pad_token_id and what pads follow (assigned alone,
        # the ids stayed the old token's). transformers cuts out of the text and skips in decode the tokens it did
        # before, so only a token already special keeps that set as it is.
        if name in _BUILT_FROM and "_text" in self.__dict__ and value != getattr(self, name):
            raise BertkitError(f"tok.{name} = {value!r}: the tokenizer's text pipeline is built from it once "
                               "(transformers' tokenizer ignores the assignment until saved and loaded again); "
                               f"{_BUILT_FROM[name].format(name=name, value=value)}")
        if name == "model_input_names" and list(value) != type(self).model_input_names:
            # transformers then leaves out the keys it lacks: pairs without token_type_ids, scored as one segment
            raise BertkitError(f"tok.model_input_names = {value!r}: bertkit's tokenizer does not read it and would still "
                               "return every key; pass return_token_type_ids=False (return_attention_mask=False) to "
                               "the calls instead (docs/tokenizer.md)")
        if name in SPECIAL_TOKEN_KEYS and "vocab" in self.__dict__:
            if value not in self.all_special_tokens:
                raise BertkitError(f"{name}={value!r} is not one of this tokenizer's special tokens "
                                   f"{self.all_special_tokens}; make it one with add_special_tokens({{{name!r}: "
                                   f"{value!r}}}) (a token the vocabulary lacks is added: resize the model's "
                                   "embeddings to len(tokenizer))")
            self.add_special_tokens({name: value})
        else:
            super().__setattr__(name, value)

    def _special_list(self) -> list[str]:
        return [*(getattr(self, key) for key in SPECIAL_TOKEN_KEYS), *self.additional_special_tokens]

    def _build(self) -> None:
        """Derived tables and caches (rebuilt after unpickling rather than shipped to DataLoader workers)."""
        self.vocab: dict[str, int] = {t: i for i, t in enumerate(self._tokens)}  # duplicates: last id wins, as HF
        self.all_special_tokens: list[str] = list(dict.fromkeys(self._special_list()))
        self.all_special_ids: list[int] = [self.vocab[t] for t in self.all_special_tokens]
        for key in SPECIAL_TOKEN_KEYS:  # unk_token_id, sep_token_id, ...
            setattr(self, f"{key}_id", self.vocab[getattr(self, key)])
        basic = BasicTokenizer(self.do_lower_case, self.strip_accents, self.tokenize_chinese_chars)
        # An id reads back (convert_ids_to_tokens, decode) as the text it matches: an added token's normalised
        # form, as tokenizers stores it (an uncased tokenizer's added "[E1]" is "[e1]", "Café" "cafe").
        read_back = list(self._tokens)
        for t in self.added_tokens:
            if t not in self.all_special_tokens:
                read_back[self.vocab[t]] = basic.normalize(t)[0]
        self.ids_to_tokens: dict[int, str] = dict(enumerate(read_back))
        pieces = self.vocab if len(self._tokens) == self._wordpiece_size else \
            {t: i for t, i in self.vocab.items() if i < self._wordpiece_size or t == self.unk_token}
        wordpiece = WordPiece(pieces, self.unk_token, self.max_input_chars_per_word)
        self._text = TextEncoder(self.vocab, basic, wordpiece, self.all_special_tokens, self.added_tokens)
        self._special_id_set = frozenset(self.all_special_ids)
        # word_ids: a token starts a word unless it is a WordPiece continuation ("##...").
        self._continuation_ids = frozenset(i for i, t in enumerate(self._tokens) if t.startswith("##"))

    def __getstate__(self) -> dict:
        # What a DataLoader worker receives: the settings and the token list, not caches or derived maps.
        derived = ("vocab", "ids_to_tokens", "_text", "_special_id_set", "_continuation_ids")
        return {k: v for k, v in self.__dict__.items() if k not in derived}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._build()

    # ------------------------------------------------------------------------------------------------
    # Loading and saving
    # ------------------------------------------------------------------------------------------------

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, **overrides: Any) -> BertTokenizer:
        """Load a tokenizer directory (the layouts ``loading`` reads); keyword arguments override the settings
        its files hold. Files that set no model_max_length give transformers' "no limit" (``NO_MODEL_MAX_LENGTH``),
        where the constructor's default is 512."""
        from bertkit.hub import cache_hint, not_a_directory, refuse_hub_options, resolve_directory

        refuse_hub_options(path, overrides)
        for side in ("padding_side", "truncation_side"):  # transformers takes them here too; "right" is all there is
            if side in overrides:
                _right_only(side, overrides.pop(side))
        settings_known = (*SETTING_TYPES, *SPECIAL_TOKEN_KEYS, "additional_special_tokens")
        unknown = sorted(set(overrides) - set(settings_known))
        if unknown:  # else the constructor's TypeError, after the files are read, names one and no way on
            raise BertkitError(f"from_pretrained got unknown keyword arguments {unknown}: it overrides the settings "
                               f"{list(settings_known)}")
        path = resolve_directory(path, "tokenizer directory")
        if not path.is_dir():
            raise not_a_directory(path, "tokenizer directory", f"pass the checkpoint directory that holds {VOCAB_FILE} "
                                  f"(or {TOKENIZER_FILE}) and {CONFIG_FILE}")
        vocab: Path | list[str] = path / VOCAB_FILE
        source = json_file = path / TOKENIZER_FILE
        settings = read_settings(path)
        if json_file.is_file():  # first, as transformers and sentence-transformers read it: the same ids as theirs
            vocab, settings, wordpiece_size = read_tokenizer_json(json_file, {**settings, **overrides})
        elif vocab.is_file():
            source, vocab = vocab, load_vocab(vocab)
            wordpiece_size = added_past(vocab, path, settings)  # transformers' added tokens past it, at their ids
        else:
            raise MissingFileError(
                f"{vocab} not found (nor {TOKENIZER_FILE}){cache_hint(path)}: a BERT tokenizer directory needs "
                f"{VOCAB_FILE} (and {CONFIG_FILE}), or transformers' {TOKENIZER_FILE}; copy them from the checkpoint, or build one "
                f"with BertTokenizer(vocab).save_pretrained({str(path)!r})"
            )
        settings.update(overrides)
        settings.setdefault("model_max_length", NO_MODEL_MAX_LENGTH)  # as transformers reads files that set none
        if "do_lower_case" not in settings:
            raise MissingFileError(
                f"{path / CONFIG_FILE} not found (or it has no do_lower_case), so whether this checkpoint is "
                f"cased is unknown: pass do_lower_case=True for an uncased checkpoint or False for a cased one"
            )
        tokenizer = cls(vocab, **settings)
        if wordpiece_size < len(tokenizer):  # added tokens (ids from wordpiece_size) are not WordPiece's, as in HF
            tokenizer._wordpiece_size = wordpiece_size
            tokenizer._build()
        check_fits_model(len(tokenizer.vocab), path, source)
        return tokenizer

    def save_pretrained(self, path: str | os.PathLike) -> list[Path]:
        """Write ``vocab.txt``, ``tokenizer_config.json``, ``special_tokens_map.json``, ``tokenizer.json`` and
        ``added_tokens.json``; returns their paths. The files are written beside ``path`` and moved in together
        (``bertkit.staging.staged``). tokenizer.json is the file transformers and sentence-transformers read first
        (and bertkit too): one left in ``path`` by another tokenizer would give their ids, not this tokenizer's."""
        path = given_path(path, "the directory to save into")
        special_map = {k: getattr(self, k) for k in SPECIAL_TOKEN_KEYS}
        if self.additional_special_tokens:
            special_map["additional_special_tokens"] = self.additional_special_tokens
        config = {"tokenizer_class": "BertTokenizer", **{k: getattr(self, k) for k in SETTING_TYPES}, **special_map}
        backend = tokenizer_json(self._tokens[:self._wordpiece_size], self.vocab, self.all_special_tokens,
                                 self.added_tokens, config)
        # added_tokens.json ({token: id}, Hugging Face's file for them) is written when empty too: transformers reads
        # it beside tokenizer.json, so one left by an earlier save would bring its tokens back.
        files = [(CONFIG_FILE, config), (SPECIAL_TOKENS_MAP_FILE, special_map), (TOKENIZER_FILE, backend),
                 (ADDED_TOKENS_FILE, {t: self.vocab[t] for t in self.added_tokens})]
        with staged(path, shared_by=job_of()) as out:  # every rank of a torchrun job may save it (job_of)
            write_vocab_file(self._tokens, out / VOCAB_FILE)
            for name, data in files:
                atomic_write_json(out / name, data)
        return [path / VOCAB_FILE, *(path / name for name, _ in files)]

    def train_new_from_iterator(self, text_iterator: Iterable[str | Sequence[str]], vocab_size: int,
                                length: int | None = None, new_special_tokens: Sequence[str] | None = None,
                                special_tokens_map: Mapping[str, str] | None = None, **trainer: Any) -> BertTokenizer:
        """A new tokenizer with this one's settings and special tokens and a vocabulary learned from ``text_iterator``
        (texts or batches of texts), as transformers': ``bertkit.tokenization.trainer.train_new_tokenizer``."""
        from bertkit.tokenization.trainer import train_new_tokenizer

        return train_new_tokenizer(self, text_iterator, vocab_size, length, new_special_tokens, special_tokens_map,
                                   **trainer)

    # ------------------------------------------------------------------------------------------------
    # Vocabulary
    # ------------------------------------------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        """The WordPiece vocabulary's size, without the tokens added past it (``len(tok)`` counts those), as
        transformers gives it: ``range(tok.vocab_size, len(tok))`` are the added ids."""
        return self._wordpiece_size

    def __len__(self) -> int:
        return len(self._tokens)

    def get_vocab(self) -> dict[str, int]:
        """A copy of ``{token: id}``, added tokens included (``len(tok.get_vocab()) == len(tok)``)."""
        return dict(self.vocab)

    def get_added_vocab(self) -> dict[str, int]:
        """``{token: id}`` of the tokens cut out of the text before WordPiece (the special tokens and those added),
        in id order, as transformers' fast tokenizer lists them."""
        added = dict.fromkeys([*self.all_special_tokens, *self.added_tokens])
        return dict(sorted(((t, self.vocab[t]) for t in added), key=lambda item: item[1]))

    @property
    def special_tokens_map(self) -> dict[str, str]:
        """``{"unk_token": "[UNK]", ...}``: the named special tokens (transformers 5 lists no others here)."""
        return {key: getattr(self, key) for key in SPECIAL_TOKEN_KEYS}

    def num_special_tokens_to_add(self, pair: bool = False) -> int:
        """The special tokens ``__call__`` adds: [CLS] and [SEP], and one more [SEP] for a pair."""
        return 3 if pair else 2

    @property
    def max_len_single_sentence(self) -> int:
        return self.model_max_length - self.num_special_tokens_to_add(pair=False)

    @property
    def max_len_sentences_pair(self) -> int:
        return self.model_max_length - self.num_special_tokens_to_add(pair=True)

    def __repr__(self) -> str:
        return (
            f"BertTokenizer(vocab_size={self.vocab_size}, do_lower_case={self.do_lower_case}, "
            f"strip_accents={self.strip_accents}, tokenize_chinese_chars={self.tokenize_chinese_chars}, "
            f"model_max_length={self.model_max_length})"
        )

    def add_tokens(self, new_tokens: str | Sequence[str], special_tokens: bool = False) -> int:
        """Add tokens at the end of the vocabulary; returns how many were new (resize the model with
        ``model.resize_token_embeddings(len(tokenizer))``). As in Hugging Face, an added token (one the vocabulary
        had already too) is cut out of the text before WordPiece wherever its normalised form occurs in the normalised
        text, inside a word too ("NAIVE" or "Naïve" for an uncased tokenizer's "naïve", "new\tyork" for "new york"),
        and WordPiece never makes one from a word's pieces; with
        ``special_tokens=True`` it becomes an additional special token (matched exactly, skipped by decode).
        """
        many = isinstance(new_tokens, Iterable) and not isinstance(new_tokens, str)
        tokens = list(new_tokens) if many else [new_tokens]
        bad = [t for t in tokens if not isinstance(t, str) or not t or t != t.strip()]
        if bad:
            # transformers takes an AddedToken too; its options (single_word, lstrip, rstrip, normalized) would match
            # the token otherwise than bertkit matches added tokens (docs/tokenizer.md, "Loading and saving")
            raise BertkitError(f"tokens to add must be non-empty strings without surrounding spaces, got {bad}: pass "
                               "each as a str, stripped (an AddedToken's .content: its options are not implemented)")
        if not special_tokens:  # before anything is added
            check_added_tokens(self._text.basic, [*self.added_tokens, *tokens], self.all_special_tokens)
        added = 0
        for token in dict.fromkeys(tokens):
            if token not in self.vocab:
                self._tokens.append(token)
                self.vocab[token] = len(self._tokens) - 1  # for the next token's check; _build remakes it
                added += 1
            # A token the vocabulary has already is cut out of the text from now on too ("york" in "newyorker"),
            # as Hugging Face does; it keeps its id
            target = self.additional_special_tokens if special_tokens else self.added_tokens
            if token not in target and token not in self.all_special_tokens:
                target.append(token)
        self._build()
        return added

    def add_special_tokens(self, special_tokens_dict: Mapping[str, str | Sequence[str]]) -> int:
        """Set special tokens (``pad_token``, ``cls_token``, ... or ``additional_special_tokens``: a list),
        adding the ones the vocabulary lacks; returns how many were new. Additional special tokens are
        appended to those already there (transformers can replace the list; the old ones stay in the
        vocabulary either way). A named special token replaced (``pad_token`` "[PAD]" by "[PAD2]") becomes an
        additional special token: transformers keeps it special too."""
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
                old = getattr(self, key)
                self.__dict__[key] = value  # not through __setattr__, which comes here
                if old not in self._special_list():
                    # the token it replaces stays special (cut out of the text, skipped by decode), as transformers
                    # keeps it and as from_pretrained reads a tokenizer.json that flags it special
                    self.additional_special_tokens.append(old)
        self._build()
        return added

    def convert_tokens_to_ids(self, tokens: str | Iterable[str]) -> int | list[int]:
        """Token string(s) -> id(s); strings not in the vocabulary map to ``unk_token_id``."""
        if isinstance(tokens, str):
            return self.vocab.get(tokens, self.unk_token_id)
        get, unk = self.vocab.get, self.unk_token_id
        return [get(t, unk) for t in tokens]

    def convert_ids_to_tokens(self, ids: int | Iterable[int]) -> str | list[str]:
        """Id(s) -> token string(s); an id outside 0..len(self)-1 is a ValueError."""
        if isinstance(ids, int) or getattr(ids, "ndim", None) == 0:
            return self._token_of(as_id_list([ids])[0])
        return [self._token_of(i) for i in as_id_list(ids)]

    # What transformers' data collators read besides pad(): BERT pads and truncates on the right only, so
    # setting either to "left" (as transformers allows) is refused rather than kept and ignored.
    padding_side = _RightOnly()
    truncation_side = _RightOnly()

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
        return self.ids_to_tokens[i]

    # ------------------------------------------------------------------------------------------------
    # Text -> ids
    # ------------------------------------------------------------------------------------------------

    def lowercase(self, text: str) -> str:
        """``text`` lower-cased as a sentence-transformers directory's do_lower_case lower-cases it before this
        tokenizer: its special tokens left as they are."""
        return self._text.lowercase(text)

    def tokenize(self, text: str) -> list[str]:
        """WordPiece strings of ``text`` (no [CLS]/[SEP]): ``"unaffable"`` -> ``["una", "##ffa", "##ble"]``; its ids
        read back as ``convert_ids_to_tokens`` reads them (an added token in its normalised form, as transformers)."""
        tokens = self.ids_to_tokens
        return [tokens[i] for i in self._text.encode(text)]

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
        padding_side: str | None = None,
    ) -> BatchEncoding:
        """Encode one text / pair, or a batch of them, as BertTokenizerFast's ``__call__``: a BatchEncoding (a dict)
        with ``input_ids``, ``token_type_ids``, ``attention_mask`` and the keys asked for. A str gives lists of
        ints, a list of str lists of lists, ``return_tensors="pt"`` / ``"np"`` (B, T) tensors / int64 arrays.
        docs/tokenizer.md gives every argument's meaning (truncation, padding, pre-split words, overflowing
        windows). A sequence longer than ``model_max_length`` is not an error here: the model checks its positions.
        """
        if padding_side is not None:
            _right_only("padding_side", padding_side)
        texts, pairs, batched = split_inputs(text, text_pair, is_split_into_words)
        strategy, pad, max_length = plan_call(truncation, max_length, padding, pad_to_multiple_of, stride,
                                              return_overflowing_tokens, return_tensors, add_special_tokens,
                                              self.model_max_length, self._max_length_to_pad_to)

        segment = functools.partial(self._segment, with_offsets=return_offsets_mapping, split=is_split_into_words)
        segments = [(segment(a), None if b is None else segment(b)) for a, b in zip(texts, pairs)]
        specials = (self.cls_token_id, self.sep_token_id) if add_special_tokens else None
        rows, infos, sample_mapping = encode_rows(segments, list(zip(texts, pairs)), specials, strategy, max_length,
                                                  return_overflowing_tokens, stride, return_special_tokens_mask,
                                                  self._continuation_ids)
        pad_rows(rows, pad, max_length, pad_to_multiple_of, self.pad_token_id)
        for key, wanted in (("token_type_ids", return_token_type_ids), ("attention_mask", return_attention_mask)):
            if wanted is False:
                for row in rows:
                    del row[key]
        batched = batched or return_overflowing_tokens
        out = to_batch_encoding(rows, batched, return_tensors)
        if return_length:
            out["length"] = as_tensor([len(r["input_ids"]) for r in rows], return_tensors)  # [n] for one text too
        if return_overflowing_tokens:
            out["overflow_to_sample_mapping"] = as_tensor(sample_mapping, return_tensors)
        # What word_ids, tokens, char_to_token... of the output need (attributes, not keys).
        out._row_info, out._tokenizer, out._split = infos, self, is_split_into_words
        out._batched = batched or return_tensors is not None  # values are per-row (lists of lists, or (B, T))
        return out

    def _segment(self, text: Any, with_offsets: bool, split: bool) -> Segment:
        """One input text's ids, offsets (None unless ``with_offsets``) and, for pre-split words, word indices."""
        offsets: list[tuple[int, int]] | None = [] if with_offsets else None
        if not split:
            return Segment(self._text.encode(text, offsets), offsets, None)
        if isinstance(text, str) or not all(isinstance(w, str) for w in text):
            raise TypeError("with is_split_into_words=True each text is a list of words (str), got "
                            f"{type(text).__name__}: {str(text)[:60]!r}")
        ids: list[int] = []
        words: list[int] = []
        for w, word in enumerate(text):
            n = len(ids)
            ids += self._text.encode(word, offsets)  # offsets relative to the word, as Hugging Face gives them
            words += [w] * (len(ids) - n)
        return Segment(ids, offsets, words)

    def pad(
        self,
        encoded_inputs: Mapping[str, Any] | Sequence[Mapping[str, Any]],
        padding: bool | str = True,
        max_length: int | None = None,
        pad_to_multiple_of: int | None = None,
        return_tensors: str | None = None,
        padding_side: str | None = None,
    ) -> BatchEncoding:
        """Pad already-encoded inputs, as Hugging Face's ``tokenizer.pad`` (what DataCollatorWithPadding calls):
        a BatchEncoding / dict of lists, or a list of per-example dicts. ``input_ids``, ``token_type_ids``,
        ``attention_mask`` (made when absent), ``special_tokens_mask`` and ``offset_mapping`` are padded on
        the right; other keys (labels, ...) are passed through unchanged (as tensors: integers int64, floats float32,
        bools bool, as transformers makes them). Without ``return_tensors``, torch or numpy inputs give the same
        kind of tensors; one example (not a batch) gives (T,) columns."""
        if padding_side is not None:
            _right_only("padding_side", padding_side)
        return pad_examples(encoded_inputs, self.pad_token_id, self._max_length_to_pad_to, padding, max_length,
                            pad_to_multiple_of, return_tensors)

    def _max_length_to_pad_to(self) -> int:
        """model_max_length, which padding="max_length" without a max_length pads to; an error when the files set
        none (transformers warns and leaves the rows unpadded)."""
        if self.model_max_length >= NO_MODEL_MAX_LENGTH:
            raise BertkitError("padding='max_length' without max_length pads to model_max_length, and this tokenizer "
                               "has none (its files set no model_max_length): pass max_length=, or padding=True to "
                               "pad to the longest row")
        return self.model_max_length

    def encode(self, text: str, text_pair: str | None = None, **kwargs: Any) -> list[int]:
        """``input_ids`` of one text (or pair), special tokens included; keyword arguments as ``__call__``."""
        words = kwargs.get("is_split_into_words") and isinstance(text, (list, tuple)) and all(
            isinstance(w, str) for w in text)
        if not isinstance(text, str) and not words:
            raise TypeError(
                "encode takes one str (with is_split_into_words=True one list of words); for a batch call the "
                f"tokenizer itself (got {type(text).__name__})"
            )
        return self(text, text_pair, **kwargs)["input_ids"]

    # ------------------------------------------------------------------------------------------------
    # Ids -> text
    # ------------------------------------------------------------------------------------------------

    def decode(
        self,
        ids: Iterable[int],
        skip_special_tokens: bool = False,
        clean_up_tokenization_spaces: bool | None = None,
    ) -> str:
        """Ids -> text, as BertTokenizerFast (docs/tokenizer.md, "Decode"): special tokens are kept unless
        ``skip_special_tokens=True``; ``clean_up_tokenization_spaces`` None takes the tokenizer's setting. The text
        is the normalised one (lower-cased, accents stripped for uncased models): use offsets to recover the original.
        """
        skip = self._special_id_set if skip_special_tokens else frozenset()
        text = wordpiece_text([self._token_of(i) for i in as_id_list(ids) if i not in skip])
        if clean_up_tokenization_spaces is None:
            clean_up_tokenization_spaces = self.clean_up_tokenization_spaces
        return cleaned_up(text) if clean_up_tokenization_spaces else text

    def batch_decode(self, sequences: Iterable[Iterable[int]], **kwargs: Any) -> list[str]:
        """``decode`` for each sequence of a batch (a list of lists or a (B, T) tensor)."""
        rows = sequences.tolist() if hasattr(sequences, "tolist") else list(sequences)
        if rows and (isinstance(rows[0], int) or getattr(rows[0], "ndim", None) == 0):
            # transformers 5 decodes it as one row (deprecated); each id as a row of its own is no one's answer
            raise TypeError(f"batch_decode takes a batch of sequences (a list of id lists, a 2-D tensor), got one "
                            f"sequence of {len(rows)} ids: use decode for it")
        return [self.decode(ids, **kwargs) for ids in rows]

    def convert_tokens_to_string(self, tokens: Sequence[str]) -> str:
        """Token strings -> text with the WordPiece decoder (``decoding.wordpiece_text``)."""
        if isinstance(tokens, str):  # else spelled out letter by letter ("h e l l o"); transformers refuses it too
            raise TypeError(f"convert_tokens_to_string takes a list of token strings, got the str {tokens!r:.60}: "
                            "pass tokenizer.tokenize(text)")
        return wordpiece_text(tokens)


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


# The name code written against transformers imports; one class, with BertTokenizerFast's behaviour.
BertTokenizerFast = BertTokenizer
