"""What a tokenizer directory holds -> BertTokenizer's constructor arguments, and the ``tokenizer.json`` it writes.

Two layouts are read: ``vocab.txt`` + ``tokenizer_config.json`` (+ ``special_tokens_map.json``,
``added_tokens.json``), as every published BERT checkpoint has them, and the ``tokenizer.json`` +
``tokenizer_config.json`` that transformers 5 saves; ``tokenizer.json`` is read first where both are, as
transformers reads it (docs/tokenizer.md, "Loading and saving").
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

from bertkit.errors import BertkitError, read_json_object
from bertkit.tokenization.added_token import options_bertkit_lacks, unmatched_message

__all__ = ["read_json", "read_settings", "read_tokenizer_json", "tokenizer_json", "check_fits_model",
           "typed_setting"]

CONFIG_FILE = "tokenizer_config.json"
SPECIAL_TOKENS_MAP_FILE = "special_tokens_map.json"
ADDED_TOKENS_FILE = "added_tokens.json"
TOKENIZER_FILE = "tokenizer.json"
SPECIAL_TOKEN_KEYS = ("unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
_SPECIAL_SETTINGS = (*SPECIAL_TOKEN_KEYS, "additional_special_tokens")
EXTRA_SPECIAL_TOKENS = "extra_special_tokens"  # transformers 5's name for additional_special_tokens
_DEFAULT_SPECIAL = {"unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]", "cls_token": "[CLS]",
                    "mask_token": "[MASK]"}
# What makes a tokenizer.json BERT's: (part, key, the value it must have).
_BERT_TOKENIZER_JSON = (("model", "type", "WordPiece"), ("model", "continuing_subword_prefix", "##"),
                        ("normalizer", "type", "BertNormalizer"), ("normalizer", "clean_text", True))
# tokenizer.json's settings: (part, key, the constructor argument it gives, tokenizers' default).
_TOKENIZER_JSON_SETTINGS = (("model", "unk_token", "unk_token", "[UNK]"),
                            ("model", "max_input_chars_per_word", "max_input_chars_per_word", 100),
                            ("normalizer", "lowercase", "do_lower_case", True),
                            ("normalizer", "strip_accents", "strip_accents", None),
                            ("normalizer", "handle_chinese_chars", "tokenize_chinese_chars", True))
# The settings tokenizer_config.json holds (save_pretrained writes them, in this order), with the types it or
# tokenizer.json may give for each (special tokens: str).
SETTING_TYPES = {"do_lower_case": (bool,), "strip_accents": (bool, type(None)), "tokenize_chinese_chars": (bool,),
                 "model_max_length": (int, float), "max_input_chars_per_word": (int,),
                 "clean_up_tokenization_spaces": (bool,)}


# The columns a tokenizer may give a BERT model, in transformers' BertTokenizer order (its model_input_names).
MODEL_INPUT_NAMES = ("input_ids", "token_type_ids", "attention_mask")


def model_input_names(value: Any, where: str) -> list[str]:
    """``value`` as a tokenizer's model_input_names: the columns its calls return by default. transformers leaves out
    ``token_type_ids`` where the list lacks it (pairs are then one segment, all type 0, to the model) and bertkit does
    the same; a list without ``input_ids`` or ``attention_mask``, or with another name, is refused naming ``where``:
    without a mask transformers' model attends to the padding, so a row's score depends on the rows batched with it,
    and a misspelt name ("token_type_id") would drop the segments without a word; ``input_ids`` must come first."""
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)) or not all(
            isinstance(n, str) for n in value):
        raise BertkitError(f"{where}: model_input_names={value!r} is not a list of column names; give a list such as "
                           f"{list(MODEL_INPUT_NAMES)}")
    unknown = [n for n in value if n not in MODEL_INPUT_NAMES]
    if unknown:
        raise BertkitError(f"{where}: model_input_names={list(value)!r} names {unknown}, which a BERT tokenizer does "
                           f"not make (its columns are {list(MODEL_INPUT_NAMES)}): fix or remove them")
    missing = [n for n in ("input_ids", "attention_mask") if n not in value]
    if missing:
        raise BertkitError(f"{where}: model_input_names={list(value)!r} lacks {missing}; transformers then returns no "
                           "attention_mask and its model attends to the padding (a row's numbers depend on the rows "
                           "padded with it), which bertkit does not reproduce: add \"attention_mask\" (and "
                           "\"input_ids\") to the list")
    if value[0] != "input_ids":
        raise BertkitError(f"{where}: model_input_names={list(value)!r} starts with {value[0]!r}; transformers takes "
                           "the first name as the main column (what its pad and Trainer pad and measure rows by) and "
                           "pads such rows wrongly or not at all: put \"input_ids\" first")
    return list(value)


def renamed_extra(given: Mapping[str, Any], what: str) -> dict[str, Any]:
    """``given`` with transformers 5's ``extra_special_tokens`` under bertkit's (and transformers 4's) name,
    ``additional_special_tokens``, as a list (``special_token_list``); both given is an error naming ``what``."""
    if EXTRA_SPECIAL_TOKENS in given and "additional_special_tokens" in given:
        raise BertkitError(f"{what} got both extra_special_tokens and additional_special_tokens (two names for the "
                           "same list, transformers 5's and 4's): pass one")
    renamed = {("additional_special_tokens" if k == EXTRA_SPECIAL_TOKENS else k): v for k, v in given.items()}
    if renamed.get("additional_special_tokens") is not None:
        name = EXTRA_SPECIAL_TOKENS if EXTRA_SPECIAL_TOKENS in given else "additional_special_tokens"
        renamed["additional_special_tokens"] = special_token_list(renamed["additional_special_tokens"],
                                                                  f"{what}({name}=...)")
    return renamed


def special_token_list(value: Any, what: str) -> list[Any]:
    """The extra special tokens as a list: a list or tuple as given, transformers 5's dict of named tokens
    ({"image_token": "<img>"}) as its tokens, as transformers adds them (a config file's dict is read so too). One str
    is refused: iterated, it would make each of its characters a special token."""
    if isinstance(value, Mapping):
        return list(value.values())
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        raise BertkitError(f"{what}: {value!r} is not a list of tokens; pass a list, e.g. [{value!r}]"
                           if isinstance(value, str) else
                           f"{what}: {value!r} is not a list of tokens; pass a list of str (or AddedToken)")
    return list(value)


def read_json(file: Path) -> dict[str, Any]:
    """The JSON object in a tokenizer file, or {} when there is no such file."""
    return read_json_object(file, "re-save the tokenizer (save_pretrained) or fix the file") if file.is_file() else {}


def read_settings(path: Path) -> dict[str, Any]:
    """Constructor arguments from tokenizer_config.json and special_tokens_map.json (either may be absent)."""
    settings: dict[str, Any] = {}
    config_file = path / CONFIG_FILE
    config = read_json(config_file)
    if config.get("do_basic_tokenize", True) is False:
        raise BertkitError(
            f"{config_file} sets do_basic_tokenize=false, which bertkit does not support "
            f"(WordPiece straight on whitespace-split text); remove the key to use BERT's basic tokenizer"
        )
    # transformers' BertJapaneseTokenizer (cl-tohoku's model_type "bert" checkpoints): words split by MeCab (or
    # Sudachi, Juman++), pieces that are characters; BERT's basic tokenizer and WordPiece would give other ids.
    for key, bert in (("word_tokenizer_type", "basic"), ("subword_tokenizer_type", "wordpiece")):
        if config.get(key, bert) != bert:
            raise BertkitError(f"{config_file} sets {key}={config[key]!r}, a setting of transformers' "
                               f"BertJapaneseTokenizer that bertkit does not implement (its tokenizer is BERT's basic "
                               f"tokenizer and WordPiece, {key}={bert!r}), so the ids would not be the checkpoint's: "
                               "tokenize with transformers")
    for key in ("padding_side", "truncation_side"):
        if config.get(key, "right") != "right":
            raise BertkitError(f"{config_file} sets {key}={config[key]!r}; bertkit pads and truncates on the "
                               f"right only (BERT's layout): remove the key or set it to \"right\"")
    if "model_max_length" not in config and "max_len" in config:  # its name in older configs, still read by HF
        config["model_max_length"] = config["max_len"]
    if config.get("model_max_length", 0) is None:  # transformers reads null as no limit, as it reads the key left out
        del config["model_max_length"]
    for key, types in SETTING_TYPES.items():
        if key in config:
            settings[key] = typed_setting(config[key], types, f"{config_file}: {key}")
    if config.get("model_input_names") is not None:  # transformers reads null as the class's list
        settings["model_input_names"] = model_input_names(config["model_input_names"], str(config_file))
    special = {k: v for k, v in config.items() if k in _SPECIAL_SETTINGS and v is not None}
    extra = config.get(EXTRA_SPECIAL_TOKENS)
    if extra and "additional_special_tokens" not in special:
        special["additional_special_tokens"] = special_token_list(extra, f"{config_file}: {EXTRA_SPECIAL_TOKENS}")
    # special_tokens_map.json overrides the config's special tokens where transformers 5 reads it: for a config
    # without added_tokens_decoder (older than transformers 4.34) only; a newer config's special tokens are the ones
    special_map = {k: v for k, v in read_json(path / SPECIAL_TOKENS_MAP_FILE).items()
                   if k in _SPECIAL_SETTINGS and not has_added_tokens_decoder(config)}
    special.update(special_map)
    for key, value in special.items():
        many = key == "additional_special_tokens"
        settings[key] = [token_content(t, key) for t in value] if many else token_content(value, key)
        for entry in value if many else [value]:  # a serialised AddedToken: transformers 5 applies its flags
            if isinstance(entry, dict):
                check_added_token({**entry, "special": True},
                                  path / (SPECIAL_TOKENS_MAP_FILE if key in special_map else CONFIG_FILE))
    if isinstance(settings.get("model_max_length"), float):  # HF writes 1e30 for "no limit"
        settings["model_max_length"] = int(settings["model_max_length"])
    return settings


def added_past(tokens: list[str], path: Path, settings: dict[str, Any]) -> int:
    """Append to ``tokens`` (a vocab.txt's) the added tokens transformers keeps past it, at their ids:
    tokenizer_config.json's ``added_tokens_decoder`` (transformers 4.34 and later), else ``added_tokens.json``'s; a
    special one the files list nowhere joins ``settings``' unlisted special tokens, the others its added tokens.
    Returns vocab.txt's own size (WordPiece's vocabulary: the tokens appended are matched in the text only)."""
    size = len(tokens)
    found: dict[int, tuple[str, bool]] = {}
    config = read_json(path / CONFIG_FILE)
    # bertkit writes added_tokens.json's tokens into vocab.txt as well, at the same ids; transformers 5 reads the file
    # for a config without added_tokens_decoder only (a newer one lists the added tokens itself)
    added = {} if has_added_tokens_decoder(config) else read_json(path / ADDED_TOKENS_FILE)
    if added:
        settings["added_tokens"] = [t for t, _ in sorted(added.items(), key=lambda kv: kv[1])]
    for token, i in added.items():
        found[i] = (token, False)
    for key, entry in (config.get("added_tokens_decoder") or {}).items():
        found[int(key)] = (token_content(entry, "added_tokens_decoder"), bool(entry.get("special")))
        check_added_token(entry, path / CONFIG_FILE)  # vocab.txt's [MASK] too: transformers applies its flags
    for i in sorted(found):
        token, special = found[i]
        if i < size and tokens[i] != token:
            raise BertkitError(f"{path}: added token {token!r} has id {i}, but line {i + 1} of vocab.txt is "
                               f"{tokens[i]!r}: give it an id past vocab.txt's {size} tokens (or fix the line), or "
                               "re-save the tokenizer")
        if i > len(tokens):
            raise BertkitError(f"{path}: added token {token!r} has id {i}, but {len(tokens)} tokens come before it; "
                               "added ids must follow vocab.txt without a gap: re-save the tokenizer")
        if i == len(tokens):
            tokens.append(token)
        _cut_out(token, special, settings)  # one vocab.txt has too: transformers cuts it out of the text all the same
    return size


def _cut_out(token: str, special: bool, settings: dict[str, Any]) -> None:
    """Make ``token`` an added token of ``settings`` (matched in the text, never made from a word's pieces): special,
    none of the special tokens the files list, one of its unlisted special tokens (transformers 5 lists it nowhere);
    else one of its added tokens."""
    named = {settings.get(k, _DEFAULT_SPECIAL[k]) for k in SPECIAL_TOKEN_KEYS}
    if any(token in settings.get(key, ()) for key in ("added_tokens", "additional_special_tokens",
                                                       "unlisted_special_tokens")):
        return
    if token in named:
        # a named token the files flag not special is matched in the normalized text and read back normalized, as
        # transformers 5 matches it (so decode(skip_special_tokens=True) keeps an uncased "[mask]"): it is one of
        # the added tokens too (tokenizer.json's entry for it reads the same way, in read_tokenizer_json)
        if not special:
            settings.setdefault("added_tokens", []).append(token)
        return
    settings.setdefault("unlisted_special_tokens" if special else "added_tokens", []).append(token)


def added_beside_tokenizer_json(tokens: list[str], path: Path, settings: dict[str, Any]) -> None:
    """Append to ``tokens`` (a tokenizer.json's, its added tokens included) the added tokens the files beside it name
    and it lacks, as transformers 5 adds them: tokenizer_config.json's ``added_tokens_decoder`` where the config has
    one, else ``added_tokens.json`` (a token special when it is one of the special tokens), each at the next id in the
    order of the ids they give; a special one none of the named tokens joins ``settings``' unlisted special tokens,
    the others its added tokens. tokenizer.json's own added tokens and ids stay as they are."""
    config = read_json(path / CONFIG_FILE)
    if has_added_tokens_decoder(config):
        entries = config["added_tokens_decoder"] or {}
        given = {int(i): (token_content(e, "added_tokens_decoder"), bool(isinstance(e, dict) and e.get("special")), e)
                 for i, e in entries.items()}
    else:
        special = {*(settings.get(k, _DEFAULT_SPECIAL[k]) for k in SPECIAL_TOKEN_KEYS),
                   *settings.get("additional_special_tokens", ())}
        given = {i: (t, t in special, None) for t, i in read_json(path / ADDED_TOKENS_FILE).items()}
        # transformers 5 reads tokenizer.json's added tokens over added_tokens.json's, id by id: an entry whose id
        # tokenizer.json's added tokens hold is dropped (a stale file's); one whose id is another WordPiece token's
        # makes it renumber tokenizer.json's added tokens, which bertkit does not do
        added = {*special, *settings.get("added_tokens", ()), *settings.get("unlisted_special_tokens", ())}
        for i, (token, _, _) in list(given.items()):
            if i < len(tokens) and tokens[i] != token:
                if tokens[i] not in added:
                    raise BertkitError(
                        f"{path / ADDED_TOKENS_FILE} gives id {i} to {token!r}, which {TOKENIZER_FILE} gives to "
                        f"{tokens[i]!r}: transformers 5 then adds it ahead of {TOKENIZER_FILE}'s added tokens past the "
                        f"vocabulary, renumbering them, which bertkit does not do; remove "
                        f"{ADDED_TOKENS_FILE} (left by an earlier save) or re-save the tokenizer")
                del given[i]
    have = set(tokens)
    for i in sorted(given):
        token, special, entry = given[i]
        check_added_token(entry, path / CONFIG_FILE)
        if token not in have:
            tokens.append(token)
            have.add(token)
        _cut_out(token, special, settings)  # one tokenizer.json has too: transformers cuts it out of the text as well


def has_added_tokens_decoder(config: Mapping[str, Any]) -> bool:
    """Whether a tokenizer_config.json lists its added tokens (transformers 4.34 and later write the key): transformers
    5 then reads neither special_tokens_map.json nor added_tokens.json, files older versions wrote beside it."""
    return "added_tokens_decoder" in config


def typed_setting(value: Any, types: tuple[type, ...], where: str) -> Any:
    """``value`` when it has one of ``types`` (a bool is not an int here), else a ValueError naming ``where``."""
    if not isinstance(value, types) or (bool not in types and isinstance(value, bool)):
        want = " or ".join("null" if t is type(None) else t.__name__ for t in types)
        hint = (f" (a string: write {'true/false' if bool in types else 'the number'} without quotes)"
                if isinstance(value, str) else "")
        raise BertkitError(f"{where} must be {want}, got {value!r}{hint}")
    return value


def check_added_token(entry: Any, file: Path) -> None:
    """Refuse a token cut out of the text (a serialised AddedToken) that transformers matches otherwise than bertkit
    does (``added_token``: a special token as written, another in the normalized text, inside words too, its offsets
    its own characters)."""
    if not isinstance(entry, dict):
        return
    flags, wanted = options_bertkit_lacks(entry)
    if flags:
        raise BertkitError(unmatched_message(f"{file}: ", entry.get("content"), bool(entry.get("special")), flags,
                                             wanted, "set {wanted} in its entry (transformers then matches it as "
                                             "bertkit does), or tokenize with transformers"))


def token_content(value: Any, key: str) -> str:
    """A special token from a config: a plain str, or Hugging Face's serialised AddedToken dict."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    raise BertkitError(f"{key} in the tokenizer config must be a string or {{'content': ...}}, got {value!r}")


def read_tokenizer_json(file: Path, settings: dict[str, Any],
                        sides_given: Collection[str] = ()) -> tuple[list[str], dict[str, Any], int]:
    """(the tokens in id order, added tokens included, constructor arguments, the size of the WordPiece model's own
    vocabulary: ids 0..size-1) from a BERT ``tokenizer.json``: its WordPiece model and BertNormalizer give the
    defaults, ``settings`` (tokenizer_config.json's) win, as in transformers 5; so do the ``padding_side`` and
    ``truncation_side`` the caller was given (``sides_given``, each "right"). Added special tokens the config does
    not list are ``unlisted_special_tokens``: transformers 5 cuts every token tokenizer.json flags special out of the
    text (a ``[CLS]`` that a new ``cls_token`` replaced included) and skips it in decode, yet lists it nowhere."""
    data = read_json(file)
    parts = {part: data[part] if isinstance(data.get(part), dict) else {} for part in ("model", "normalizer")}
    model = parts["model"]
    if "type" not in model and "continuing_subword_prefix" in model and "merges" not in model:
        # A model without its type (files of tokenizers before 0.9, as some Hub checkpoints still have them): tokenizers
        # and transformers read it as WordPiece.
        parts["model"] = {**model, "type": "WordPiece"}
    lowercase_first = _lowercase_before_bert(parts["normalizer"])
    if lowercase_first:
        parts["normalizer"] = parts["normalizer"]["normalizers"][1]
    for part, key, want in _BERT_TOKENIZER_JSON:
        got = parts[part].get(key, None if key == "type" else want)
        if got != want:
            raise BertkitError(f"{file}: {part}.{key} is {got!r}, not {want!r}, so it is not BERT's WordPiece "
                               "tokenizer, the only kind bertkit reads; use the tokenizer library of that model")
    _check_sides_right(data, file, {*sides_given, *read_json(file.parent / CONFIG_FILE)})
    vocab = parts["model"].get("vocab")
    if not isinstance(vocab, dict) or not vocab:
        raise BertkitError(f"{file}: model.vocab must be a non-empty {{token: id}} object, got "
                           f"{type(vocab).__name__}")
    merged = {arg: typed_setting(parts[part].get(key, default), SETTING_TYPES.get(arg, (str,)),
                                 f"{file}: {part}.{key}")
              for part, key, arg, default in _TOKENIZER_JSON_SETTINGS}
    ids = dict(vocab)
    added, special = [], []
    for entry in data.get("added_tokens") or ():
        content, i = entry.get("content"), entry.get("id")
        if not isinstance(content, str) or not isinstance(i, int):
            raise BertkitError(f"{file}: an added_tokens entry needs a string content and an int id, got {entry!r}")
        if ids.setdefault(content, i) != i:
            raise BertkitError(f"{file}: added token {content!r} has id {i} but the vocabulary gives it "
                               f"{ids[content]}")
        (special if entry.get("special") else added).append((i, content))
        check_added_token(entry, file)
    if added:
        merged["added_tokens"] = [t for _, t in sorted(added)]
    for part, key, arg, default in _TOKENIZER_JSON_SETTINGS:
        # transformers 5 (so sentence-transformers, pipelines) builds the normalizer and the WordPiece model's unknown
        # token from tokenizer_config.json (special_tokens_map.json too, where it reads that) and its own defaults,
        # ignoring this file's; tokenizers reads the file: without the setting in the config, a value here other than
        # the default gives other ids in each, and neither could be matched quietly
        if arg != "max_input_chars_per_word" and arg not in settings and merged[arg] != default:
            raise BertkitError(
                f"{file}: {part}.{key} is {json.dumps(merged[arg])} but {CONFIG_FILE} sets no {arg}, so transformers "
                f"5 and sentence-transformers tokenize with their default {json.dumps(default)} where tokenizers reads "
                f"{json.dumps(merged[arg])}: add \"{arg}\": {json.dumps(merged[arg])} to {CONFIG_FILE} (or pass "
                f"{arg}= to from_pretrained) to say which")
    merged.update(settings)
    if lowercase_first and not merged["do_lower_case"]:
        raise BertkitError(
            f"{file}: normalizer is Lowercase before BertNormalizer (sentence-transformers 6 saves do_lower_case so) "
            "but the tokenizer is cased (do_lower_case false), and transformers 5 and sentence-transformers build the "
            "normalizer from tokenizer_config.json and keep the case, where tokenizers (and TEI) read this file and "
            "lower it: to lower texts, set \"do_lower_case\": true in tokenizer_config.json (with \"strip_accents\": "
            "false to keep accents, as Lowercase does), which all of them read; to keep the case, remove the Lowercase")
    named = {merged.get(k, _DEFAULT_SPECIAL[k]) for k in SPECIAL_TOKEN_KEYS}
    listed = list(merged.get("additional_special_tokens", ()))
    unlisted = [t for _, t in sorted(special) if t not in named and t not in listed]
    if unlisted:
        merged["unlisted_special_tokens"] = unlisted
    return _in_id_order(ids, file), merged, 1 + max(vocab.values())


def _check_sides_right(data: dict[str, Any], file: Path, given: Collection[str]) -> None:
    """Refuse a tokenizer.json whose padding or truncation block says "Left" where neither tokenizer_config.json nor
    the caller names the side (``given``): transformers 5 takes that direction as the tokenizer's padding_side or
    truncation_side, so it would pad (or cut) on the left where bertkit, right-only, pads on the right."""
    for block, side in (("padding", "padding_side"), ("truncation", "truncation_side")):
        direction = data[block].get("direction", "Right") if isinstance(data.get(block), dict) else "Right"
        if side not in given and direction != "Right":
            raise BertkitError(
                f"{file}: {block}.direction is {direction!r} and {CONFIG_FILE} sets no {side}, so transformers 5 "
                f"reads {side}={str(direction).lower()!r} from it; bertkit pads and truncates on the right only "
                f"(BERT's layout): set \"{side}\": \"right\" in {CONFIG_FILE} (transformers then reads that) or remove "
                f"the {block} block from {file.name}")


def _lowercase_before_bert(normalizer: dict[str, Any]) -> bool:
    """Whether ``normalizer`` is the Sequence of Lowercase and BertNormalizer that sentence-transformers 6 saves for a
    Transformer with do_lower_case (its only record of the setting). Where the BertNormalizer lowers too (an uncased
    tokenizer), the Lowercase changes no text: tokenizers gives the same string for every code point, alone and with
    a combining accent, whatever strip_accents and handle_chinese_chars say."""
    steps = normalizer.get("normalizers") if normalizer.get("type") == "Sequence" else None
    return (isinstance(steps, list) and len(steps) == 2 and all(isinstance(s, dict) for s in steps)
            and steps[0] == {"type": "Lowercase"} and steps[1].get("type") == "BertNormalizer")


def _in_id_order(ids: dict[str, Any], file: Path) -> list[str]:
    """The tokens of ``{token: id}`` in id order. An id no token has is the blank token's: a vocab.txt that lists the
    blank line twice (as bertkit and transformers read it) gives a tokenizer.json without one of its ids."""
    values = ids.values()
    if values and set(map(type, values)) == {int} and 0 <= min(values) and max(values) < len(ids) \
            and len(set(values)) == len(ids):
        return sorted(ids, key=ids.__getitem__)  # ids 0..n-1, each once (every tokenizer.json a tokenizer wrote)
    bad = {t: i for t, i in ids.items() if type(i) is not int or not 0 <= i < 2 * len(ids)}
    if bad:
        raise BertkitError(f"{file}: token ids must be integers from 0 to {2 * len(ids) - 1} (the file has {len(ids)} "
                           f"tokens), got {dict(list(bad.items())[:5])}; re-save the tokenizer")
    tokens: list[str | None] = [None] * (1 + max(ids.values()))
    for token, i in ids.items():
        if tokens[i] is not None:
            raise BertkitError(f"{file}: tokens {tokens[i]!r} and {token!r} both have id {i}; each token needs its "
                               "own id: re-save the tokenizer")
        tokens[i] = token
    return ["" if t is None else t for t in tokens]


def tokenizer_json(wordpiece: Sequence[str], ids: Mapping[str, int], special_tokens: Sequence[str],
                   added_tokens: Sequence[str], config: Mapping[str, Any]) -> dict[str, Any]:
    """The ``tokenizer.json`` (the tokenizers library's serialisation) that transformers 5's BertTokenizer writes for a
    tokenizer: its WordPiece model holds ``wordpiece`` (the tokens WordPiece makes words of, ids 0..n-1), every token
    of ``special_tokens`` (matched as written) and ``added_tokens`` (matched normalised) is an ``added_tokens`` entry at
    its id in ``ids``, the normalizer and the [CLS] A [SEP] (B [SEP]) post-processor take ``config``'s settings and
    special tokens (tokenizer_config.json's). ``read_tokenizer_json`` reads it."""
    def entry(token: str, special: bool) -> dict[str, Any]:
        return {"id": ids[token], "content": token, "single_word": False, "lstrip": False, "rstrip": False,
                "normalized": not special, "special": special}

    def special(token: str, type_id: int) -> dict[str, Any]:
        return {"SpecialToken": {"id": token, "type_id": type_id}}

    added = {t: entry(t, special=True) for t in special_tokens}
    # a special token that is an added one too (a named token its files flag not special) keeps that flag
    added.update((t, entry(t, special=False)) for t in added_tokens)
    cls, sep = config["cls_token"], config["sep_token"]
    single = [special(cls, 0), {"Sequence": {"id": "A", "type_id": 0}}, special(sep, 0)]
    return {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": sorted(added.values(), key=lambda e: e["id"]),
        "normalizer": {"type": "BertNormalizer", "clean_text": True,
                       "handle_chinese_chars": config["tokenize_chinese_chars"],
                       "strip_accents": config["strip_accents"], "lowercase": config["do_lower_case"]},
        "pre_tokenizer": {"type": "BertPreTokenizer"},
        "post_processor": {
            "type": "TemplateProcessing",
            "single": single,
            "pair": [*single, {"Sequence": {"id": "B", "type_id": 1}}, special(sep, 1)],
            "special_tokens": {t: {"id": t, "ids": [ids[t]], "tokens": [t]} for t in sorted({cls, sep})}},
        "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": True},
        "model": {"type": "WordPiece", "unk_token": config["unk_token"], "continuing_subword_prefix": "##",
                  "max_input_chars_per_word": config["max_input_chars_per_word"],
                  "vocab": {t: i for i, t in enumerate(wordpiece)}},
    }


def check_fits_model(vocab_size_needed: int, path: Path, source: Path) -> None:
    """Where a tokenizer sits beside a model (a checkpoint directory), every id must have an embedding row:
    a vocabulary longer than config.json's vocab_size fails later as torch's "index out of range"."""
    config_file = path / "config.json"
    if not config_file.is_file():
        return
    try:
        vocab_size = json.loads(config_file.read_text(encoding="utf-8")).get("vocab_size")
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
        return  # the model's own loader reports a damaged config.json with its details
    if isinstance(vocab_size, int) and vocab_size_needed > vocab_size:
        raise BertkitError(f"{source} has {vocab_size_needed} tokens but {config_file} has vocab_size "
                           f"{vocab_size}: ids from {vocab_size} up would have no embedding; use the vocabulary "
                           "the model was trained with, or, where tokens were added to it (add_tokens), save the "
                           "model grown to the tokenizer: model.resize_token_embeddings(len(tokenizer))")
