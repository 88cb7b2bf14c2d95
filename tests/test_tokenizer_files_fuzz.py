"""Randomized differential test of tokenizer directories: bertkit's AutoTokenizer against transformers 5's.

Each draw is one directory made from the real checkpoint's tokenizer, varied as users' directories vary: which files
it holds (vocab.txt, tokenizer.json, both disagreeing), tokenizer.json's normalizer, pre-tokenizer, post-processor,
padding and truncation blocks, added tokens and their flags, the WordPiece model's unk_token; tokenizer_config.json's
settings, special tokens, added_tokens_decoder (listing vocabulary tokens too), sides, model_max_length (1e30, null);
special_tokens_map.json and added_tokens.json; vocab.txt's CRLF, trailing whitespace, lone "\\r", blank and missing
final lines. Either bertkit refuses it (a BertkitError) or both load it and give the same ids, segment ids, masks,
offsets and decoded text on varied texts and pairs, and what bertkit saves reloads in transformers with those ids.
"""

from __future__ import annotations

import copy
import json
import random
import shutil

import pytest

from bertkit.errors import BertkitError
from bertkit.tokenization import AutoTokenizer

transformers = pytest.importorskip("transformers")

TEXTS = ["Hello, world!", "Héllo Wörld CAFÉ naïve", "日本語のテキスト 中文", "tab\there\nnew\x00line\x07bell",
         "a" * 120, "[MASK] is [CLS] x[SEP]y [PAD] [mask]", "x[unused1]y qqqxzzq 😀 hello", "İstanbul ΣΟΦΙΑ straße",
         "x<new_tok>y <NEW_TOK> [E1]", "<s> </s> [unused4] [unused6] don't ."]
PAIRS = [("Who wrote it?", "It was written by Shakespeare in 1600."), ("", "b [MASK]")]
SPECIAL_KEYS = ["unk_token", "sep_token", "pad_token", "cls_token", "mask_token"]
ENTRY = {"single_word": False, "lstrip": False, "rstrip": False}


def _entry(token, special, rng):
    flags = {**ENTRY, "normalized": not special}
    if rng.random() < 0.15:
        key = rng.choice(list(flags))
        flags[key] = not flags[key]
    return {"content": token, **flags, "special": special}


def _tokenizer_json(rng, source):
    data = copy.deepcopy(source)
    data["normalizer"] = rng.choice([
        data["normalizer"], data["normalizer"], None,
        {"type": "BertNormalizer", "clean_text": True, "handle_chinese_chars": rng.random() < 0.8,
         "strip_accents": rng.choice([None, True, False]), "lowercase": rng.random() < 0.7},
        {"type": "Sequence", "normalizers": [{"type": "Lowercase"}, data["normalizer"]]}])
    data["pre_tokenizer"] = rng.choice([data["pre_tokenizer"]] * 3 + [{"type": "Whitespace"}, None])
    data["post_processor"] = rng.choice([data["post_processor"]] * 3 + [
        {"type": "BertProcessing", "sep": ["[SEP]", 102], "cls": ["[CLS]", 101]}, None])
    direction = ["Right", "Right", "Left"]
    data["truncation"] = rng.choice([None, {"max_length": rng.choice([8, 128]), "strategy": "LongestFirst",
                                            "stride": 0, "direction": rng.choice(direction)}])
    data["padding"] = rng.choice([None, {"strategy": rng.choice(["BatchLongest", {"Fixed": 24}]),
                                         "direction": rng.choice(direction), "pad_to_multiple_of": None, "pad_id": 0,
                                         "pad_type_id": 0, "pad_token": "[PAD]"}])
    if rng.random() < 0.15:
        data["model"]["unk_token"] = rng.choice(["[unused9]", "[UNK]"])
    for token in rng.sample(["<new_tok>", "[E1]", "<s>", "[unused5]", "Hello"], rng.randint(0, 2)):
        i = data["model"]["vocab"].get(token, 30522 + len([e for e in data["added_tokens"] if e["id"] >= 30522]))
        data["added_tokens"].append({"id": i, **_entry(token, rng.random() < 0.5, rng)})
    return data


def _config(rng, source, data):
    config = dict(source)
    for key, values in (("do_lower_case", [True, False]), ("strip_accents", [None, True, False]),
                        ("tokenize_chinese_chars", [True, False]), ("clean_up_tokenization_spaces", [True, False]),
                        ("model_max_length", [1e30, 64, None]), ("padding_side", ["right", "left"]),
                        ("truncation_side", ["right"]), ("tokenizer_class", ["BertTokenizerFast", "ElectraTokenizer"])):
        if rng.random() < 0.15:
            config[key] = rng.choice(values)
    for key in SPECIAL_KEYS:
        r = rng.random()
        if r < 0.06:
            del config[key]
        elif r < 0.12:
            config[key] = rng.choice(["[unused3]", "[unused4]"])
    if rng.random() < 0.4:
        decoder = {str(e["id"]): {k: e[k] for k in ("content", *ENTRY, "normalized", "special")}
                   for e in data["added_tokens"]}
        if rng.random() < 0.5:
            decoder["2"] = _entry("[unused1]", rng.random() < 0.7, rng)
        config["added_tokens_decoder"] = decoder
    return config


def _vocab_txt(rng, words):
    words = list(words)
    if rng.random() < 0.2:
        words[7592] = rng.choice(["hello ", "hello\t", "hello\u3000", " hello"])
    if rng.random() < 0.1:
        words[7593] = "ab\rcd"
    if rng.random() < 0.1:
        words[2088] = ""
    if rng.random() < 0.1:
        words[2088], words[7592] = words[7592], words[2088]  # disagrees with tokenizer.json
    end = rng.choice(["\n", "\r\n"])
    return (end.join(words) + rng.choice([end, ""])).encode("utf-8")


def _directory(rng, out, minilm_dir, source_json, words):
    source_config = json.loads((minilm_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    data = _tokenizer_json(rng, source_json)
    config = _config(rng, source_config, data)
    layout = rng.choice(["both", "both", "tokenizer.json", "vocab.txt"])
    out.mkdir()
    if layout != "tokenizer.json":
        (out / "vocab.txt").write_bytes(_vocab_txt(rng, words))
    if layout != "vocab.txt":
        (out / "tokenizer.json").write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    (out / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    special_map = {k: config.get(k, f"[{k[:-6].upper()}]") for k in SPECIAL_KEYS}
    if rng.random() < 0.3:
        special_map[rng.choice(SPECIAL_KEYS)] = rng.choice(["[unused6]", "[unused4]"])
    if rng.random() < 0.8:
        (out / "special_tokens_map.json").write_text(json.dumps(special_map), encoding="utf-8")
    if rng.random() < 0.2:
        (out / "added_tokens.json").write_text(json.dumps({"<new_tok>": 30522}), encoding="utf-8")


def _calls(tok):
    out = {"specials": [tok.unk_token_id, tok.cls_token_id, tok.sep_token_id, tok.pad_token_id, tok.mask_token_id,
                        len(tok)]}
    for i, text in enumerate(TEXTS):
        enc = tok(text, return_offsets_mapping=True)
        out[f"text {i}"] = {k: [list(v) for v in enc[k]] if k == "offset_mapping" else enc[k] for k in enc}
        out[f"decode {i}"] = [tok.decode(enc["input_ids"], skip_special_tokens=skip) for skip in (False, True)]
    out["batch"] = dict(tok(TEXTS[:4], padding=True))
    out["cut"] = dict(tok(TEXTS[1], max_length=6, truncation=True))
    for i, (a, b) in enumerate(PAIRS):
        out[f"pair {i}"] = dict(tok(a, b, padding="max_length", max_length=24))
    return out


@pytest.mark.slow
def test_tokenizer_directories_give_transformers_ids_or_are_refused(minilm_dir, tmp_path):
    source_json = json.loads((minilm_dir / "tokenizer.json").read_text(encoding="utf-8"))
    words = (minilm_dir / "vocab.txt").read_text(encoding="utf-8").split("\n")[:-1]
    rng = random.Random(20261130)
    compared = 0
    for draw in range(200):
        path = tmp_path / f"d{draw}"
        _directory(rng, path, minilm_dir, source_json, words)
        try:
            ours = AutoTokenizer.from_pretrained(path)
        except BertkitError:
            continue  # refused by name; transformers may load it otherwise
        theirs = transformers.AutoTokenizer.from_pretrained(str(path))
        want = _calls(theirs)
        assert _calls(ours) == want, f"draw {draw}: {sorted(p.name for p in path.iterdir())}"
        saved = tmp_path / f"s{draw}"
        ours.save_pretrained(saved)
        assert _calls(transformers.AutoTokenizer.from_pretrained(str(saved))) == want, f"draw {draw}, saved"
        compared += 1
        shutil.rmtree(saved)
    assert compared >= 60  # the draws must reach the comparison, not only the refusals
