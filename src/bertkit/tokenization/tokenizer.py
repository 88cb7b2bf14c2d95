"""BertTokenizer: text -> BERT input ids, with character offsets, token for token as BertTokenizerFast.

The class holds the settings and reads and writes the files; its vocabulary and special tokens, and what a user
may change of them, are ``vocabulary``'s; docs/tokenizer.md says which module does the rest.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from bertkit._parallel import job_of
from bertkit.errors import BertkitError, MissingFileError, given_path, keyword_only, no_hub, refuse_options
from bertkit.outputs import atomic_write_json, placed
from bertkit.staging import staged
from bertkit.tokenization.added_token import token_text
from bertkit.tokenization.batch import (
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
    added_beside_tokenizer_json,
    added_past,
    check_fits_model,
    model_input_names,
    read_settings,
    read_tokenizer_json,
    renamed_extra,
    special_token_list,
    tokenizer_json,
    typed_setting,
)
from bertkit.tokenization.pad import pad_examples
from bertkit.tokenization.vocabulary import EditableVocabulary, SharedVocabulary, Vocabulary, right_only
from bertkit.tokenization.wordpiece import VOCAB_FILE, listed_tokens, load_vocab, write_vocab_file

__all__ = ["BertTokenizer", "BertTokenizerFast"]

# transformers' model_max_length for a tokenizer whose files set none (its VERY_LARGE_INTEGER): no limit of the
# tokenizer's own, so a model's positions decide where its texts are cut (sentence-transformers caps it at them)
NO_MODEL_MAX_LENGTH = int(1e30)

_UPLOAD = "save, then upload the directory with huggingface_hub's upload_folder"
# transformers' tokenizer save_pretrained keywords: (its default, which asks for what this save writes; what instead)
SAVE_OPTIONS: dict[str, tuple[Any, str]] = {
    "legacy_format": (None, "bertkit writes both formats, vocab.txt and tokenizer_config.json beside tokenizer.json"),
    "filename_prefix": (None, "bertkit writes the files under their plain names, which from_pretrained reads"),
    "push_to_hub": (False, _UPLOAD),
    "save_format": (None, "bertkit writes transformers' format"),
    "token": (None, _UPLOAD),
}


# transformers' positional order of the tokenizer's call: bertkit takes text and text_pair by position, the rest by
# keyword (``keyword_only``)
CALL_POSITIONS = ("text", "text_pair", "text_target", "text_pair_target", "add_special_tokens", "padding",
                  "truncation", "max_length", "stride", "is_split_into_words", "pad_to_multiple_of", "padding_side",
                  "return_tensors")
# the call's keywords transformers' tokenize takes and ignores (its _encode_plus reads truncation_strategy and
# padding_strategy, so max_length and stride alone cut nothing either)
TOKENIZE_IGNORES = ("truncation", "padding", "max_length", "stride", "pad_to_multiple_of", "return_overflowing_tokens")
_TARGETS = ("bertkit's tokenizer encodes inputs only (BERT has no target text): encode the targets with a second "
            "call, tok(targets), and take its input_ids as the labels")


def refuse_call_keywords(unknown: dict[str, Any]) -> None:
    """transformers' call keywords bertkit does not implement, refused naming the keyword and what to do instead;
    ``split_special_tokens=False`` (transformers' default) is what bertkit does, so it is taken."""
    for name, value in unknown.items():
        if name in ("text_target", "text_pair_target"):
            if value is not None:
                raise BertkitError(f"tok(..., {name}=...) is not implemented in bertkit: {_TARGETS}")
        elif name == "split_special_tokens":
            if value is not False:
                raise BertkitError(f"tok(..., split_special_tokens={value!r}) is not implemented in bertkit: its "
                                   "tokenizer always reads a special token written in the text as that token "
                                   "(split_special_tokens=False); tokenize such text with transformers, or take the "
                                   "special tokens' text out of it")
        else:
            raise BertkitError(f"tok(..., {name}=...) is not an argument of bertkit's tokenizer call (nor of "
                               "transformers' BertTokenizerFast): docs/tokenizer.md lists the arguments")

class BertTokenizer(EditableVocabulary):
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
        unlisted_special_tokens: Sequence[str] = (),
        model_max_length: int = 512,
        max_input_chars_per_word: int = 100,
        clean_up_tokenization_spaces: bool = False,
        model_input_names: Sequence[str] | None = None,
    ):
        if isinstance(vocab, Mapping):
            tokens = _tokens_from_mapping(vocab)
        elif isinstance(vocab, (list, tuple)):  # e.g. a vocabulary just learned (tokenization.trainer)
            tokens = listed_tokens(vocab)
        else:
            tokens = listed_tokens(load_vocab(vocab))
        settings = {"do_lower_case": do_lower_case, "strip_accents": strip_accents,
                    "tokenize_chinese_chars": tokenize_chinese_chars, "model_max_length": model_max_length,
                    "max_input_chars_per_word": max_input_chars_per_word,
                    "clean_up_tokenization_spaces": clean_up_tokenization_spaces}
        for key, value in settings.items():  # as transformers refuses them: bool("false") would lower-case
            typed_setting(value, SETTING_TYPES[key], key)
        special = {"unk_token": unk_token, "sep_token": sep_token, "pad_token": pad_token, "cls_token": cls_token,
                   "mask_token": mask_token}
        additional_special_tokens = special_token_list(additional_special_tokens, "additional_special_tokens")
        self._shared = SharedVocabulary(Vocabulary(tokens, settings, special, additional_special_tokens, added_tokens,
                                                   unlisted_special_tokens))
        self.model_max_length = int(model_max_length)
        self.clean_up_tokenization_spaces = clean_up_tokenization_spaces
        # this tokenizer's own list: tok.model_input_names.remove(...) on the class's would change every tokenizer's
        self.model_input_names = type(self).model_input_names if model_input_names is None else model_input_names

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "model_input_names":  # the columns calls return by default: without token_type_ids, no segments
            value = model_input_names(value, "tok.model_input_names")
        if name == "split_special_tokens" and value is not False:
            # transformers then tokenizes a special token written in the text as text ("[MASK]": "[", "mask", "]")
            raise BertkitError(f"tok.split_special_tokens = {value!r} is not implemented in bertkit: its tokenizer "
                               "always reads a special token written in the text as that token (transformers' "
                               "split_special_tokens=False); tokenize such text with transformers, or take the "
                               "special tokens' text out of it")
        super().__setattr__(name, value)  # the vocabulary's attributes: EditableVocabulary.__setattr__

    @property
    def segments_to_model(self) -> bool:
        """Whether the model is given this tokenizer's token_type_ids: False where its ``model_input_names`` lacks
        them, as transformers (and sentence-transformers) then feed none and the model reads every token as segment
        0. What bertkit feeds its own models (pipelines, sentence models, collators) follows it."""
        return "token_type_ids" in self.model_input_names

    # ------------------------------------------------------------------------------------------------
    # Loading and saving
    # ------------------------------------------------------------------------------------------------

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, **overrides: Any) -> BertTokenizer:
        """Load a tokenizer directory (the layouts ``loading`` reads); keyword arguments override the settings
        its files hold. Files that set no model_max_length give transformers' "no limit" (``NO_MODEL_MAX_LENGTH``),
        where the constructor's default is 512."""
        from bertkit.hub import cache_hint, not_a_directory, refuse_hub_options, resolve_directory

        local_files_only = refuse_hub_options(path, overrides)
        overrides = renamed_extra(overrides, "from_pretrained")
        for key in (*SPECIAL_TOKEN_KEYS, "additional_special_tokens"):  # an AddedToken is its text, special
            if key in overrides and overrides[key] is not None:
                value = overrides[key]
                many = key == "additional_special_tokens"  # a list (renamed_extra refused one str)
                overrides[key] = [token_text(t, True)[0] for t in value] if many else token_text(value, True)[0]
        sides = [side for side in ("padding_side", "truncation_side") if side in overrides]
        for side in sides:  # transformers takes them here too; "right" is all there is
            right_only(side, overrides.pop(side))
        if overrides.get("model_input_names") is not None:  # as transformers takes it: checked before the files
            overrides["model_input_names"] = model_input_names(overrides["model_input_names"], "from_pretrained")
        settings_known = (*SETTING_TYPES, *SPECIAL_TOKEN_KEYS, "additional_special_tokens", "model_input_names")
        unknown = sorted(set(overrides) - set(settings_known))
        if unknown:  # else the constructor's TypeError, after the files are read, names one and no way on
            raise BertkitError(f"from_pretrained got unknown keyword arguments {unknown}: it overrides the settings "
                               f"{list(settings_known)}")
        path = resolve_directory(path, "tokenizer directory", local_files_only)
        if not path.is_dir():
            raise not_a_directory(path, "tokenizer directory", f"pass the checkpoint directory that holds {VOCAB_FILE} "
                                  f"(or {TOKENIZER_FILE}) and {CONFIG_FILE}")
        vocab: Path | list[str] = path / VOCAB_FILE
        source = json_file = path / TOKENIZER_FILE
        settings = read_settings(path)
        if json_file.is_file():  # first, as transformers and sentence-transformers read it: the same ids as theirs
            # The word length past which a word is [UNK] is tokenizer.json's, as tokenizers reads it: transformers 5
            # reads neither file's and writes into tokenizer_config.json one passed to its from_pretrained, unused
            settings.pop("max_input_chars_per_word", None)
            vocab, settings, wordpiece_size = read_tokenizer_json(json_file, {**settings, **overrides}, sides)
            added_beside_tokenizer_json(vocab, path, settings)  # what transformers 5 adds from the files beside it
        elif vocab.is_file():
            source, vocab = vocab, load_vocab(vocab)
            wordpiece_size = added_past(vocab, path, settings)  # transformers' added tokens past it, at their ids
            settings.update(overrides)  # (read_tokenizer_json merges them itself, before its special-flagged tokens)
        else:
            raise MissingFileError(
                f"{vocab} not found (nor {TOKENIZER_FILE}){cache_hint(path)}: a BERT tokenizer directory needs "
                f"{VOCAB_FILE} (and {CONFIG_FILE}), or transformers' {TOKENIZER_FILE}; copy them from the checkpoint, or build one "
                f"with BertTokenizer(vocab).save_pretrained({str(path)!r})"
            )
        settings.setdefault("model_max_length", NO_MODEL_MAX_LENGTH)  # as transformers reads files that set none
        if "do_lower_case" not in settings:
            raise MissingFileError(
                f"{path / CONFIG_FILE} not found (or it has no do_lower_case), so whether this checkpoint is "
                f"cased is unknown: pass do_lower_case=True for an uncased checkpoint or False for a cased one"
            )
        # A special token passed here that the vocabulary lacks is added past it, as transformers' from_pretrained
        # adds it (resize the model's embeddings to len(tokenizer)).
        given = [*(overrides[k] for k in SPECIAL_TOKEN_KEYS if k in overrides),
                 *overrides.get("additional_special_tokens", ())]
        in_files = len(vocab)
        vocab = [*vocab, *(t for t in dict.fromkeys(given) if isinstance(t, str) and t not in set(vocab))]
        tokenizer = cls(vocab, **settings)
        if wordpiece_size < len(tokenizer):  # added tokens (ids from wordpiece_size) are not WordPiece's, as in HF
            tokenizer._vocabulary._wordpiece_size = wordpiece_size
            tokenizer._vocabulary._build()
        check_fits_model(in_files, path, source)
        return tokenizer

    def push_to_hub(self, *args: Any, **kwargs: Any) -> None:
        """Refused naming the fix (``no_hub``): transformers' method uploads, and bertkit reaches no hub."""
        raise no_hub(self)

    def save_pretrained(self, path: str | os.PathLike, **transformers_options: Any) -> list[Path]:
        """Write ``vocab.txt``, ``tokenizer_config.json`` and ``tokenizer.json`` (``special_tokens_map.json`` and
        ``added_tokens.json`` where the directory holds them); returns their paths. The files are written beside
        ``path`` and moved in together (``bertkit.staging.staged``). tokenizer.json is the file transformers and sentence-transformers read first
        (and bertkit too): one left in ``path`` by another tokenizer would give their ids, not this tokenizer's.
        transformers' keywords are taken at its defaults (``SAVE_OPTIONS``); another value is refused by name."""
        refuse_options("save_pretrained", transformers_options, SAVE_OPTIONS)
        path = given_path(path, "the directory to save into")
        v = self._vocabulary  # its tables as they are, not the copies a user reads
        special_map = {k: getattr(v, k) for k in SPECIAL_TOKEN_KEYS}
        if v.additional_special_tokens:  # the unlisted ones are special in tokenizer.json alone, as transformers saves
            special_map["additional_special_tokens"] = list(v.additional_special_tokens)
        config = {"tokenizer_class": "BertTokenizer", **{k: getattr(self, k) for k in SETTING_TYPES}, **special_map}
        if self.model_input_names != type(self).model_input_names:  # written where it differs, as transformers does
            config["model_input_names"] = list(self.model_input_names)
        backend = tokenizer_json(v._tokens[:v._wordpiece_size], v.vocab, v._cut_as_written(), v.added_tokens, config)
        files = [(CONFIG_FILE, config), (TOKENIZER_FILE, backend)]
        # special_tokens_map.json and added_tokens.json ({token: id}) are transformers 4's files, which transformers 5
        # reads beside a config without added_tokens_decoder (its own saves' too) and no longer writes. Each is written
        # where the directory holds one (an empty added_tokens.json too), so an older one decides nothing; a new one
        # would outlive the next transformers 5 save over the directory and override it: the pad_token that save set
        # read back as this one's, its added tokens' list as this one's.
        into = placed(path)
        for name, data in ((SPECIAL_TOKENS_MAP_FILE, special_map),
                           (ADDED_TOKENS_FILE, {t: v.vocab[t] for t in v.added_tokens})):
            if os.path.lexists(path / name) or os.path.lexists(into / name):
                files.append((name, data))
        with staged(path, shared_by=job_of()) as out:  # every rank of a torchrun job may save it (job_of)
            write_vocab_file(v._tokens, out / VOCAB_FILE)
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
    # The layout of a row (the vocabulary and its edits: EditableVocabulary)
    # ------------------------------------------------------------------------------------------------

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

    @property
    def pad_token_type_id(self) -> int:
        """The token_type_id of padding, 0 as in transformers (what collators pad token_type_ids with)."""
        return 0

    is_fast = True  # answers as BertTokenizerFast does (offsets, word_ids)
    split_special_tokens = False  # transformers' default, the one bertkit implements (another is refused)
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

    # ------------------------------------------------------------------------------------------------
    # Text -> ids
    # ------------------------------------------------------------------------------------------------

    def lowercase(self, text: str) -> str:
        """``text`` lower-cased as a sentence-transformers directory's do_lower_case lower-cases it before this
        tokenizer: its special tokens left as they are."""
        return self._text.lowercase(text)

    def tokenize(self, text: str, pair: str | None = None, add_special_tokens: bool = False, **kwargs: Any) -> list[str]:
        """WordPiece strings of ``text`` (no [CLS]/[SEP]): ``"unaffable"`` -> ``["una", "##ffa", "##ble"]``; its ids
        read back as ``convert_ids_to_tokens`` reads them (an added token in its normalised form, as transformers).
        As transformers', ``pair`` and ``add_special_tokens`` give the tokens of ``tok(text, pair,
        add_special_tokens=...)``: ``[CLS] a [SEP] b [SEP]`` with both; ``is_split_into_words`` reads ``text`` as
        words. transformers' tokenize ignores truncation and padding (its tokens are the whole text's): they are
        refused here, naming the call that applies them."""
        if pair is None and not add_special_tokens and not kwargs:
            tokens = self._vocabulary.ids_to_tokens
            return [tokens[i] for i in self._text.encode(text)]
        _one_text("tokenize", text, kwargs)  # transformers gives a batch's first row alone
        for name in TOKENIZE_IGNORES:
            if kwargs.get(name, None) not in (None, False, 0, "do_not_truncate", "do_not_pad"):
                raise BertkitError(f"tok.tokenize(..., {name}={kwargs[name]!r}): transformers' tokenize ignores "
                                   f"{name} and gives the whole text's tokens, so bertkit does not apply it either; "
                                   f"for the tokens of a truncated or padded call use tok(text, pair, {name}=..., "
                                   "...).tokens()")
        return self(text, pair, add_special_tokens=add_special_tokens, **kwargs).tokens()

    @keyword_only(CALL_POSITIONS, "transformers")
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
        verbose: bool = True,
        **unknown: Any,
    ) -> BatchEncoding:
        """Encode one text / pair, or a batch of them, as BertTokenizerFast's ``__call__``: a BatchEncoding (a dict)
        with ``input_ids``, ``token_type_ids``, ``attention_mask`` and the keys asked for. A str gives lists of
        ints, a list of str lists of lists, ``return_tensors="pt"`` / ``"np"`` (B, T) tensors / int64 arrays.
        docs/tokenizer.md gives every argument's meaning (truncation, padding, pre-split words, overflowing
        windows). A sequence longer than ``model_max_length`` is not an error here: the model checks its positions.
        ``verbose`` is transformers' switch for that warning; taken, with nothing to silence here.
        """
        refuse_call_keywords(unknown)
        if padding_side is not None:
            right_only("padding_side", padding_side)
        texts, pairs, batched = split_inputs(text, text_pair, is_split_into_words)
        strategy, pad, max_length, stride = plan_call(truncation, max_length, padding, pad_to_multiple_of, stride,
                                              return_overflowing_tokens, return_tensors, add_special_tokens,
                                              self.model_max_length, self._max_length_to_pad_to,
                                              pairs=any(p is not None for p in pairs))

        vocabulary = self._vocabulary  # the one these ids come from, kept by the output (SharedVocabulary)
        segment = functools.partial(vocabulary.segment, with_offsets=return_offsets_mapping, split=is_split_into_words)
        segments = [(segment(a), None if b is None else segment(b)) for a, b in zip(texts, pairs)]
        specials = (vocabulary.cls_token_id, vocabulary.sep_token_id) if add_special_tokens else None
        rows, infos, sample_mapping = encode_rows(segments, list(zip(texts, pairs)), specials, strategy, max_length,
                                                  return_overflowing_tokens, stride, return_special_tokens_mask,
                                                  vocabulary._continuation_ids)
        pad_rows(rows, pad, max_length, pad_to_multiple_of, vocabulary.pad_token_id)
        if return_token_type_ids is None:  # transformers' default: the column where model_input_names lists it
            return_token_type_ids = self.segments_to_model
        for key, wanted in (("token_type_ids", return_token_type_ids), ("attention_mask", return_attention_mask)):
            if wanted is not None and not wanted:  # 0 too, which transformers reads as False
                for row in rows:
                    del row[key]
        batched = batched or return_overflowing_tokens
        out = to_batch_encoding(rows, batched, return_tensors)
        if return_length:
            out["length"] = as_tensor([len(r["input_ids"]) for r in rows], return_tensors)  # [n] for one text too
        if return_overflowing_tokens:
            out["overflow_to_sample_mapping"] = as_tensor(sample_mapping, return_tensors)
        # What word_ids, tokens, char_to_token... of the output need (attributes, not keys).
        out._row_info, out._vocabulary, out._split = infos, vocabulary, is_split_into_words
        out._batched = batched or return_tensors is not None  # values are per-row (lists of lists, or (B, T))
        return out

    def pad(
        self,
        encoded_inputs: Mapping[str, Any] | Sequence[Mapping[str, Any]],
        padding: bool | str = True,
        max_length: int | None = None,
        pad_to_multiple_of: int | None = None,
        return_tensors: str | None = None,
        padding_side: str | None = None,
        return_attention_mask: bool | None = None,
        verbose: bool = True,
    ) -> BatchEncoding:
        """Pad already-encoded inputs, as Hugging Face's ``tokenizer.pad`` (what DataCollatorWithPadding calls):
        a BatchEncoding / dict of lists, or a list of per-example dicts. ``input_ids``, ``token_type_ids``,
        ``attention_mask`` (made when absent), ``special_tokens_mask`` and ``offset_mapping`` are padded on
        the right; other keys (labels, ...) are passed through unchanged (as tensors: integers int64, floats float32,
        bools bool, as transformers makes them). Without ``return_tensors``, torch or numpy inputs give the same
        kind of tensors; one example (not a batch) gives (T,) columns. ``return_attention_mask=False`` makes no
        mask where the examples have none and leaves one they have unpadded, as transformers (a ragged one makes no
        tensor: refused naming it); ``verbose`` is taken, unused."""
        if padding_side is not None:
            right_only("padding_side", padding_side)
        return pad_examples(encoded_inputs, self.pad_token_id, self._max_length_to_pad_to, padding, max_length,
                            pad_to_multiple_of, return_tensors, return_attention_mask in (None, True))

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
        _one_text("encode", text, kwargs)
        return self(text, text_pair, **kwargs)["input_ids"]

    # ------------------------------------------------------------------------------------------------
    # Ids -> text
    # ------------------------------------------------------------------------------------------------

    def decode(
        self,
        ids: Iterable[int],
        skip_special_tokens: bool = False,
        clean_up_tokenization_spaces: bool | None = None,
        spaces_between_special_tokens: bool = True,
    ) -> str:
        """Ids -> text, as BertTokenizerFast (docs/tokenizer.md, "Decode"): special tokens are kept unless
        ``skip_special_tokens=True``; ``clean_up_tokenization_spaces`` None takes the tokenizer's setting. The text
        is the normalised one (lower-cased, accents stripped for uncased models): use offsets to recover the original.
        ``spaces_between_special_tokens`` is the slow BertTokenizer's switch, which scripts pass; the fast one, whose
        text this is, accepts it and decodes the same either way, so it changes nothing here either.
        """
        skip = self._decode_skip_ids if skip_special_tokens else frozenset()
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

    def clean_up_tokenization(self, text: str) -> str:
        """transformers' clean-up of decoded text (`` ,`` -> ``,``, `` n't`` -> ``n't``...), the one
        ``decode(..., clean_up_tokenization_spaces=True)`` applies."""
        return cleaned_up(text)

    def convert_tokens_to_string(self, tokens: Sequence[str]) -> str:
        """Token strings -> text with the WordPiece decoder (``decoding.wordpiece_text``)."""
        if isinstance(tokens, str):  # else spelled out letter by letter ("h e l l o"); transformers refuses it too
            raise TypeError(f"convert_tokens_to_string takes a list of token strings, got the str {tokens!r:.60}: "
                            "pass tokenizer.tokenize(text)")
        return wordpiece_text(tokens)


def _one_text(method: str, text: Any, kwargs: Mapping[str, Any]) -> None:
    """Refuse a batch where ``method`` takes one text (a str, or with ``is_split_into_words`` one list of words)."""
    words = kwargs.get("is_split_into_words") and isinstance(text, (list, tuple)) and all(
        isinstance(w, str) for w in text)
    if not isinstance(text, str) and not words:
        raise TypeError(
            f"{method} takes one str (with is_split_into_words=True one list of words); for a batch call the "
            f"tokenizer itself (got {type(text).__name__})"
        )


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
