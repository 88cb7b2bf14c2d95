"""What a built tokenizer lets a user change: its vocabulary, its special and added tokens, and nothing else.

``Vocabulary`` holds the tokens, the special and added tokens, the settings the text pipeline is built from, and
what is built from them (the id maps, ``text.TextEncoder``); ``add_tokens`` and ``add_special_tokens`` edit it and
rebuild. ``EditableVocabulary``, the base of ``BertTokenizer``, reads those attributes through to it and decides what
an assignment to a tokenizer attribute does: ``tok.pad_token = "[MASK]"`` is ``add_special_tokens``, a setting
the pipeline is built from is refused (with the way to change it), the padding and truncation sides are "right".

A shallow copy of a tokenizer (``copy.copy``) shares its ``SharedVocabulary``, as a copy of transformers'
BertTokenizerFast shares its Rust backend: a token added to either is matched by both. ``copy.deepcopy`` and
pickling (DataLoader workers) give a tokenizer of its own, its tables rebuilt rather than shipped. An edit builds a new
``Vocabulary`` and swaps it in: one is never changed once a tokenizer reads it.
"""

from __future__ import annotations

import logging
import numbers
import operator
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from bertkit.errors import BertkitError
from bertkit.tokenization.added_token import AddedToken, token_text
from bertkit.tokenization.basic import BasicTokenizer
from bertkit.tokenization.batch import Segment
from bertkit.tokenization.decoding import as_id_list
from bertkit.tokenization.encoding import word_index
from bertkit.tokenization.loading import EXTRA_SPECIAL_TOKENS, SPECIAL_TOKEN_KEYS, renamed_extra
from bertkit.tokenization.text import TextEncoder, check_added_tokens
from bertkit.tokenization.wordpiece import WordPiece

# What the text pipeline is built from, with how to change it. transformers' fast tokenizer ignores an assignment
# (until saved and loaded again); a pickled copy (DataLoader and datasets.map workers) rebuilt from the new value would
# give other ids than the tokenizer it was copied from, so an assignment is refused.
_BUILT_FROM = {**dict.fromkeys(("do_lower_case", "strip_accents", "tokenize_chinese_chars", "max_input_chars_per_word"),
                               "load the tokenizer with it: AutoTokenizer.from_pretrained(path, {name}={value!r})"),
               "additional_special_tokens": "add them with tok.add_special_tokens({{'{name}': {value!r}}})",
               "unlisted_special_tokens": "add them with tok.add_tokens({value!r}, special_tokens=True)",
               "added_tokens": "add them with tok.add_tokens({value!r})"}
_SPECIAL_IDS = {f"{key}_id": key for key in SPECIAL_TOKEN_KEYS}  # unk_token_id, sep_token_id, ...
# The tokens transformers 5 builds into its backend when the tokenizer is made (the post-processor's [CLS] and [SEP],
# WordPiece's [UNK]): one changed later is what a reloaded tokenizer encodes with, while the one in memory keeps the old.
_BUILT_INTO_BACKEND = ("cls_token", "sep_token", "unk_token")
logger = logging.getLogger("bertkit")


def right_only(name: str, value: object) -> None:
    if value != "right":
        raise BertkitError(f"{name}={value!r}: bertkit's tokenizer pads and truncates on the right only (BERT's "
                           "layout; its models read a batch padded either way); leave it \"right\"")


class Vocabulary:
    """The tokens in id order, the first ``_wordpiece_size`` of them WordPiece's (the rest added, matched in the text
    and never made from a word's pieces, as Hugging Face keeps them out of its WordPiece model), the special and
    added tokens, the settings of the text pipeline, and the tables ``_build`` makes from them."""

    # What it pickles; the rest is derived (rebuilt after unpickling rather than shipped to DataLoader workers).
    _STATE = ("_tokens", "_wordpiece_size", *_BUILT_FROM, *SPECIAL_TOKEN_KEYS)
    # left out of the state while empty, so that a tokenizer without such tokens pickles (and fingerprints, for a
    # resumed run's check) as it did before they had a list of their own
    _EMPTY_UNSTATED = ("unlisted_special_tokens",)
    _DERIVED = ("vocab", "all_special_tokens", "all_special_ids", *_SPECIAL_IDS, "ids_to_tokens", "_text",
                "_special_id_set", "_decode_skip_ids", "_continuation_ids", "_cut_continuation", "_wordpiece_count")

    def __init__(self, tokens: list[str], settings: Mapping[str, Any], special: Mapping[str, str],
                 additional_special_tokens: Sequence[str], added_tokens: Sequence[str],
                 unlisted_special_tokens: Sequence[str] = ()):
        self._tokens = tokens
        self._wordpiece_size = len(tokens)
        for key in ("do_lower_case", "strip_accents", "tokenize_chinese_chars", "max_input_chars_per_word"):
            setattr(self, key, settings[key])
        for key in SPECIAL_TOKEN_KEYS:
            setattr(self, key, special[key])
        self.additional_special_tokens = list(additional_special_tokens)
        # Tokens added with add_tokens: cut out of the text before WordPiece, like special tokens, but matched
        # normalised in the normalised text, as Hugging Face matches them (an uncased "NAIVE" is the added "naïve").
        self.added_tokens: list[str] = list(dict.fromkeys(added_tokens))
        # Tokens added special (add_tokens(..., special_tokens=True), a files' added token flagged special, an
        # additional special token replaced) that no special-token list names, as transformers 5 keeps them: cut
        # out of the text as written and skipped by decode(skip_special_tokens=True), yet not in all_special_ids, so
        # get_special_tokens_mask and convert_ids_to_tokens(skip_special_tokens=True) treat them as words.
        self.unlisted_special_tokens: list[str] = [t for t in dict.fromkeys(unlisted_special_tokens)
                                                   if t not in self._special_list()]
        missing = [t for t in (*self._special_list(), *added_tokens, *self.unlisted_special_tokens) if t not in tokens]
        if missing:
            raise BertkitError(
                f"the vocabulary ({len(tokens)} tokens) lacks the special tokens {missing}; add them to the "
                f"vocabulary or pass the names it uses (unk_token=, sep_token=, pad_token=, cls_token=, "
                f"mask_token=)"
            )
        self._build()
        check_added_tokens(self._text.basic, self.added_tokens, self._cut_as_written())

    def _cut_as_written(self) -> list[str]:
        """The special tokens, listed or not: matched in the text as written."""
        return [*self.all_special_tokens, *self.unlisted_special_tokens]

    def _special_list(self) -> list[str]:
        return [*(getattr(self, key) for key in SPECIAL_TOKEN_KEYS), *self.additional_special_tokens]

    def _build(self) -> None:
        self.vocab: dict[str, int] = {t: i for i, t in enumerate(self._tokens)}  # duplicates: last id wins, as HF
        # WordPiece's tokens counted once each (vocab_size), as tokenizers counts its vocab.txt: a token on two lines
        # (two blank lines at a file's end) has one id, the last
        self._wordpiece_count = len(set(self._tokens[:self._wordpiece_size]))
        self.all_special_tokens: list[str] = list(dict.fromkeys(self._special_list()))
        self.all_special_ids: list[int] = [self.vocab[t] for t in self.all_special_tokens]
        for name, key in _SPECIAL_IDS.items():
            setattr(self, name, self.vocab[getattr(self, key)])
        basic = BasicTokenizer(self.do_lower_case, self.strip_accents, self.tokenize_chinese_chars)
        # An id reads back (convert_ids_to_tokens, decode) as the text it matches: an added token's normalised
        # form, as tokenizers stores it (an uncased tokenizer's added "[E1]" is "[e1]", "Café" "cafe").
        # A named special token its files flag not special is an added token too, and reads back so ("[mask]").
        read_back = list(self._tokens)
        for t in self.added_tokens:
            read_back[self.vocab[t]] = basic.normalize(t)[0]
        self.ids_to_tokens: dict[int, str] = dict(enumerate(read_back))
        pieces = self.vocab if len(self._tokens) == self._wordpiece_size else \
            {t: i for t, i in self.vocab.items() if i < self._wordpiece_size or t == self.unk_token}
        wordpiece = WordPiece(pieces, self.unk_token, self.max_input_chars_per_word)
        # a named token that is an added one too is matched in the normalized text only, as its files flag it
        as_written = [t for t in self._cut_as_written() if t not in self.added_tokens]
        self._text = TextEncoder(self.vocab, basic, wordpiece, as_written, self.added_tokens)
        self._special_id_set = frozenset(self.all_special_ids)
        # decode(skip_special_tokens=True) drops an id whose text reads back as a special token, as tokenizers' decoder
        # does: an uncased "[MASK]" flagged not special reads back "[mask]" and is kept (a cased one is dropped), where
        # convert_ids_to_tokens(skip_special_tokens=True), transformers' all_special_ids, drops it either way
        specials = set(self._cut_as_written())
        self._decode_skip_ids = frozenset(i for i in (self.vocab[t] for t in specials) if read_back[i] in specials)
        # word_ids: a token starts a word unless it is a WordPiece continuation ("##..."); an added token past the
        # vocabulary is never one, "##" or not (it is cut out of the text as a word of its own, as in tokenizers)
        self._continuation_ids = frozenset(i for i, t in enumerate(self._tokens[:self._wordpiece_size])
                                           if t.startswith("##"))
        # ... unless a token cut out of the text has its id ("##zz" added, the vocabulary's own): then where the text
        # has it is what says whether an id starts a word (segment)
        cut_ids = {*self._text.match_ids.values(), *self._text.added_ids.values()}
        self._cut_continuation = not self._continuation_ids.isdisjoint(cut_ids)

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items()
                if k not in self._DERIVED and not (k in self._EMPTY_UNSTATED and not v)}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update({**dict.fromkeys(self._EMPTY_UNSTATED, []), **state})
        self._build()

    def edited(self) -> Vocabulary:
        """A copy to edit, its lists its own: an edit is made on it and swapped in whole (``EditableVocabulary``)."""
        new = object.__new__(Vocabulary)
        new.__dict__.update(self.__dict__)
        new._tokens, new.vocab = list(self._tokens), dict(self.vocab)
        new.additional_special_tokens, new.added_tokens = list(self.additional_special_tokens), list(self.added_tokens)
        new.unlisted_special_tokens = list(self.unlisted_special_tokens)
        return new

    def segment(self, text: Any, with_offsets: bool, split: bool) -> Segment:
        """One input text's ids, offsets (None unless ``with_offsets``) and, for pre-split words, word indices."""
        offsets: list[tuple[int, int]] | None = [] if with_offsets else None
        if not split:
            if not self._cut_continuation:
                return Segment(self._text.encode(text, offsets), offsets, None)  # words worked out from the ids
            cut: list[int] = []
            ids = self._text.encode(text, offsets, cut)
            return Segment(ids, offsets, word_index(ids, self._continuation_ids, frozenset(cut)))
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

    def add_tokens(self, tokens: list[str], special_tokens: bool | Sequence[bool]) -> int:
        """Add ``tokens``, each special where ``special_tokens`` (one flag, or one per token) says; returns how many
        ids were new."""
        bad = [t for t in tokens if not isinstance(t, str) or not t or t != t.strip()]
        if bad:
            raise BertkitError(f"tokens to add must be non-empty strings without surrounding spaces, got {bad}: pass "
                               "each as a str, stripped (or an AddedToken without lstrip, rstrip or single_word)")
        special = [special_tokens] * len(tokens) if isinstance(special_tokens, bool) else list(special_tokens)
        plain = [t for t, s in zip(tokens, special) if not s]
        if plain:  # before anything is added
            check_added_tokens(self._text.basic, [*self.added_tokens, *plain],
                               [t for t in self._cut_as_written() if t not in plain])
        added = 0
        for token, is_special in dict(zip(tokens, special)).items():
            if token not in self.vocab:
                self._tokens.append(token)
                self.vocab[token] = len(self._tokens) - 1  # for the next token's check; _build remakes it
                added += 1
            # A token the vocabulary has already is cut out of the text from now on too ("york" in "newyorker"),
            # as Hugging Face does; it keeps its id. One added before takes the flag given last, as in transformers
            # 5 (special or not, so matched as written or normalised); a listed special token keeps its own.
            if token in self.all_special_tokens:
                continue
            target, other = ((self.unlisted_special_tokens, self.added_tokens) if is_special else
                             (self.added_tokens, self.unlisted_special_tokens))
            if token in other:
                other.remove(token)
            if token not in target:
                target.append(token)
        self._build()
        return added

    def add_special_tokens(self, special_tokens_dict: Mapping[str, str | Sequence[str]], replace_extra: bool) -> int:
        if "additional_special_tokens" in special_tokens_dict:
            # transformers 5 renames the key to extra_special_tokens by popping it, so its tokens take ids after the
            # named ones' whatever the dict's order ({"additional_special_tokens": ["<e>"], "cls_token": "<c>"}:
            # "<c>" 30522, "<e>" 30523); under transformers 5's own name the list keeps its place
            special_tokens_dict = {**{k: v for k, v in special_tokens_dict.items() if k != "additional_special_tokens"},
                                   "additional_special_tokens": special_tokens_dict["additional_special_tokens"]}
        special_tokens_dict = renamed_extra(special_tokens_dict, "add_special_tokens")
        unknown = sorted(set(special_tokens_dict) - {*SPECIAL_TOKEN_KEYS, "additional_special_tokens"})
        if unknown:
            raise BertkitError(f"unknown special token keys {unknown}; use {SPECIAL_TOKEN_KEYS} or "
                               f"additional_special_tokens (transformers 5: {EXTRA_SPECIAL_TOKENS})")
        added = 0
        rebuilt = []  # (key, old, new) of the tokens transformers builds into its backend
        for key, value in special_tokens_dict.items():
            if key == "additional_special_tokens":
                tokens = [token_text(t, True)[0] for t in value]  # a list: renamed_extra's
                added += self.add_tokens(tokens, special_tokens=True)
                named = [getattr(self, k) for k in SPECIAL_TOKEN_KEYS]
                listed = [t for t in tokens if t not in named]
                # transformers 5 replaces the list unless told not to; a token dropped from it stays special, unlisted
                kept = [] if replace_extra else self.additional_special_tokens
                self._unlist([t for t in self.additional_special_tokens if t not in kept and t not in listed])
                self.additional_special_tokens = list(dict.fromkeys([*kept, *listed]))
                self.unlisted_special_tokens = [t for t in self.unlisted_special_tokens if t not in listed]
                continue
            value = token_text(value, True)[0]
            if not isinstance(value, str):
                raise BertkitError(f"{key} must be a str, got {value!r}")
            added += self.add_tokens([value], special_tokens=True)
            for own in (self.additional_special_tokens, self.unlisted_special_tokens):  # a named token now
                if value in own:
                    own.remove(value)
            old = getattr(self, key)
            if key in _BUILT_INTO_BACKEND and value != old:
                rebuilt.append((key, old, value))
            setattr(self, key, value)
            if old not in self._special_list():
                # the token it replaces stays special (cut out of the text, skipped by decode), as transformers
                # keeps it and as from_pretrained reads a tokenizer.json that flags it special
                self._unlist([old])
        self._build()
        for key, old, value in rebuilt:  # said once the edit holds: a refused one changes nothing
            logger.warning(
                "%s is now %r (id %d): bertkit encodes with it from now on, as transformers does once the tokenizer "
                "is saved and loaded again; until then transformers' tokenizer keeps encoding %r (id %d) while its "
                "%s_id says %d. To encode alike in both, load the tokenizer with it: "
                "AutoTokenizer.from_pretrained(path, %s=%r)", key, value, self.vocab[value], old, self.vocab[old], key,
                self.vocab[value], key, value)
        return added


    def _unlist(self, tokens: Iterable[str]) -> None:
        self.unlisted_special_tokens = list(dict.fromkeys([*self.unlisted_special_tokens, *tokens]))


class SharedVocabulary:
    """The Vocabulary a tokenizer and its shallow copies read. An edit swaps in a new one: the copies see it at once
    (as copies of transformers' tokenizer share its backend), an encoding made before keeps the Vocabulary its ids
    came from (its offsets and word_ids recomputed with it, as transformers keeps them from encode time), and an
    edit that fails halfway changes nothing."""

    __slots__ = ("current",)

    def __init__(self, vocabulary: Vocabulary):
        self.current = vocabulary

    def edit(self, change: Callable[[Vocabulary], int]) -> int:
        new = self.current.edited()
        result = change(new)
        self.current = new
        return result


class _RightOnly:
    """A tokenizer attribute that reads "right" and refuses any other value set to it, naming itself."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, owner: type | None = None) -> str:
        return "right"

    def __set__(self, obj: Any, value: object) -> None:
        right_only(self.name, value)


class EditableVocabulary:
    """The vocabulary side of ``BertTokenizer``: its ``Vocabulary`` read through (tokens <-> ids, sizes), edited with
    ``add_tokens`` and ``add_special_tokens``, and the assignments a user may make to it."""

    _shared: SharedVocabulary
    _vocabulary: Vocabulary = property(operator.attrgetter("_shared.current"))  # type: ignore[assignment]
    # What transformers' data collators read besides pad(): BERT pads and truncates on the right only, so
    # setting either to "left" (as transformers allows) is refused rather than kept and ignored.
    padding_side = _RightOnly()
    truncation_side = _RightOnly()

    def __copy__(self) -> EditableVocabulary:
        # copy.copy: the same SharedVocabulary, as a copy of transformers' fast tokenizer shares its Rust backend
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__)
        return new

    def __getstate__(self) -> dict:
        # pickle and copy.deepcopy: a tokenizer of its own. What a DataLoader worker receives is the tokens and the
        # settings in one flat dict, the special tokens' ids and lists included: the dict the tokenizer pickled before
        # its vocabulary had an object of its own, so older pickles load, and sentence.data.tokenizer_fingerprint (a
        # resumed run's check) reads the same state from the same tokenizer.
        vocabulary = self._vocabulary
        listed = {k: getattr(vocabulary, k) for k in ("all_special_tokens", "all_special_ids", *_SPECIAL_IDS)}
        own = {k: v for k, v in self.__dict__.items() if k != "_shared"}
        return {**vocabulary.__getstate__(), **listed, **own}

    def __setstate__(self, state: dict) -> None:
        vocabulary = object.__new__(Vocabulary)
        vocabulary.__setstate__({k: v for k, v in state.items() if k in Vocabulary._STATE})
        self.__dict__.update({k: v for k, v in state.items() if k not in _READ_THROUGH})
        self.__dict__["_shared"] = SharedVocabulary(vocabulary)

    @property
    def extra_special_tokens(self) -> list[str]:
        """transformers 5's name for ``additional_special_tokens``."""
        return self.additional_special_tokens

    def __setattr__(self, name: str, value: Any) -> None:
        if name == EXTRA_SPECIAL_TOKENS:
            name = "additional_special_tokens"  # refused as it is (transformers 5 keeps it and reads it nowhere)
        if name not in _READ_THROUGH:
            super().__setattr__(name, value)
        elif name in SPECIAL_TOKEN_KEYS or name in _SPECIAL_IDS:
            # tok.pad_token = "[MASK]", as transformers users write it: pad_token_id and what pads follow (assigned
            # alone, the ids stayed the old token's). transformers cuts out of the text and skips in decode the tokens
            # it did before, so only a token already special keeps that set as it is.
            key = _SPECIAL_IDS.get(name, name)
            value = token_text(value, True)[0] if name in SPECIAL_TOKEN_KEYS else value  # an AddedToken: its text
            special = {t: self._vocabulary.vocab[t] for t in self._vocabulary._cut_as_written()}  # listed or not
            if name in _SPECIAL_IDS and (isinstance(value, bool) or not isinstance(value, numbers.Integral)):
                raise BertkitError(f"{name}={value!r}: a token id is an int; pass the id of one of this tokenizer's "
                                   f"special tokens {special}")
            token = self.convert_ids_to_tokens(int(value)) if name in _SPECIAL_IDS else value
            if token not in special:
                raise BertkitError(f"{name}={value!r} is not one of this tokenizer's special tokens "
                                   f"{list(special)}; make it one with add_special_tokens({{{key!r}: "
                                   f"{token!r}}}) (a token the vocabulary lacks is added: resize the model's "
                                   "embeddings to len(tokenizer))")
            self.add_special_tokens({key: token})
        elif name not in _BUILT_FROM:  # as transformers' properties without a setter
            raise AttributeError(f"tok.{name} cannot be assigned: it is made from the tokens; change them with "
                                 "tok.add_tokens([...]) or tok.add_special_tokens({...})")
        elif value != getattr(self, name):
            raise BertkitError(f"tok.{name} = {value!r}: the tokenizer's text pipeline is built from it once "
                               "(transformers' tokenizer ignores the assignment until saved and loaded again); "
                               f"{_BUILT_FROM[name].format(name=name, value=value)}")

    def add_tokens(self, new_tokens: str | Sequence[str], special_tokens: bool = False) -> int:
        """Add tokens at the end of the vocabulary; returns how many were new (resize the model with
        ``model.resize_token_embeddings(len(tokenizer))``). As in Hugging Face, an added token (one the vocabulary
        had already too) is cut out of the text before WordPiece wherever its normalised form occurs in the normalised
        text, inside a word too ("NAIVE" or "Naïve" for an uncased tokenizer's "naïve", "new\\tyork" for "new york"),
        and WordPiece never makes one from a word's pieces; with
        ``special_tokens=True`` it is special (matched as written, skipped by ``decode(skip_special_tokens=True)``)
        without joining ``all_special_tokens``, as in transformers 5: ``unlisted_special_tokens`` lists it.
        """
        many = isinstance(new_tokens, Iterable) and not isinstance(new_tokens, str)
        pairs = [token_text(t, special_tokens) for t in (new_tokens if many else [new_tokens])]
        tokens, special = [t for t, _ in pairs], [s for _, s in pairs]
        return self._shared.edit(lambda vocabulary: vocabulary.add_tokens(tokens, special))

    def add_special_tokens(self, special_tokens_dict: Mapping[str, str | Sequence[str]],
                           replace_extra_special_tokens: bool = True) -> int:
        """Set special tokens (``pad_token``, ``cls_token``, ... or ``additional_special_tokens``, transformers 5's
        ``extra_special_tokens``: a list),
        adding the ones the vocabulary lacks; returns how many were new. Additional special tokens replace those
        already listed (``replace_extra_special_tokens=False``: are appended to them), as in transformers 5; a token
        dropped from the list, and a named special token replaced (``pad_token`` "[PAD]" by "[PAD2]"), stays special
        without being listed (``unlisted_special_tokens``): cut out of the text, skipped by decode."""
        if not isinstance(replace_extra_special_tokens, bool):
            raise BertkitError(f"replace_extra_special_tokens={replace_extra_special_tokens!r}: pass True or False")
        return self._shared.edit(lambda vocabulary: vocabulary.add_special_tokens(special_tokens_dict,
                                                                                  replace_extra_special_tokens))

    @property
    def vocab_size(self) -> int:
        """The WordPiece vocabulary's size, without the tokens added past it (``len(tok)`` counts those), as
        transformers gives it: ``range(tok.vocab_size, len(tok))`` are the added ids. A token a vocab.txt lists twice
        (a blank line) counts once, as in transformers."""
        return self._wordpiece_count

    def __len__(self) -> int:
        """The tokens, added ones included, each once (``len(tok.get_vocab())``), as transformers counts them."""
        return len(self._vocabulary.vocab)

    def get_vocab(self) -> dict[str, int]:
        """A copy of ``{token: id}``, added tokens included (``len(tok.get_vocab()) == len(tok)``)."""
        return dict(self._vocabulary.vocab)

    def get_added_vocab(self) -> dict[str, int]:
        """``{token: id}`` of the tokens cut out of the text before WordPiece (the special tokens and those added),
        in id order, as transformers' fast tokenizer lists them."""
        vocabulary = self._vocabulary
        added = dict.fromkeys([*vocabulary._cut_as_written(), *vocabulary.added_tokens])
        return dict(sorted(((t, vocabulary.vocab[t]) for t in added), key=lambda item: item[1]))

    @property
    def added_tokens_encoder(self) -> dict[str, int]:
        """``{token: id}`` of the tokens cut out of the text before WordPiece, as ``get_added_vocab()``."""
        return self.get_added_vocab()

    @property
    def added_tokens_decoder(self) -> dict[int, AddedToken]:
        """``{id: AddedToken}`` of the tokens cut out of the text before WordPiece, in id order, as transformers gives
        them: the special ones matched as written (``normalized`` False), the others in the normalized text."""
        special, added = set(self._vocabulary._cut_as_written()), set(self._vocabulary.added_tokens)
        return {i: AddedToken(t, special=t in special, normalized=t in added)
                for t, i in self.get_added_vocab().items()}

    @property
    def special_tokens_map(self) -> dict[str, str]:
        """``{"unk_token": "[UNK]", ...}``: the named special tokens (transformers 5 lists no others here)."""
        return {key: getattr(self, key) for key in SPECIAL_TOKEN_KEYS}

    def convert_tokens_to_ids(self, tokens: str | Iterable[str]) -> int | list[int]:
        """Token string(s) -> id(s); strings not in the vocabulary map to ``unk_token_id``."""
        vocabulary = self._vocabulary
        if isinstance(tokens, str):
            return vocabulary.vocab.get(tokens, vocabulary.unk_token_id)
        get, unk = vocabulary.vocab.get, vocabulary.unk_token_id
        return [get(t, unk) for t in tokens]

    def convert_ids_to_tokens(self, ids: int | Iterable[int], skip_special_tokens: bool = False) -> str | list[str]:
        """Id(s) -> token string(s); an id no line of the vocabulary (or added token) has is a ValueError. ``skip_special_tokens=True`` leaves
        out the ids of ``all_special_ids`` from a list, as transformers does (one id is returned either way)."""
        if isinstance(ids, int) or getattr(ids, "ndim", None) == 0:
            return self._token_of(as_id_list([ids])[0])
        skip = self._vocabulary._special_id_set if skip_special_tokens else frozenset()
        return [self._token_of(i) for i in as_id_list(ids) if i not in skip]

    def _token_of(self, i: int) -> str:
        if not 0 <= i < len(self._tokens):
            raise BertkitError(f"token id {i} is outside the vocabulary (0..{len(self._tokens) - 1})")
        return self._vocabulary.ids_to_tokens[i]


# The tokenizer's attributes that are its Vocabulary's, read through (attrgetter: C speed, read per call by __call__).
# Its lists and dicts are read as copies, as transformers builds them anew on each read: tok.vocab["x"] = 5 or
# tok.additional_special_tokens.append("[E3]") changed the tables without rebuilding what reads text (and a pickled
# copy then failed to build); the tokenizer's own code reads them from its Vocabulary.
_READ_THROUGH = frozenset((*Vocabulary._STATE, *Vocabulary._DERIVED))
_READ_AS_COPIES = ("vocab", "ids_to_tokens", "all_special_tokens", "all_special_ids", "additional_special_tokens",
                   "added_tokens", "unlisted_special_tokens")
for _name in _READ_THROUGH:
    _read = operator.attrgetter(f"_shared.current.{_name}")
    if _name in _READ_AS_COPIES:
        _read = (lambda read: lambda tok: read(tok).copy())(_read)
    setattr(EditableVocabulary, _name, property(_read))
