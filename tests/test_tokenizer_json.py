"""tokenizer.json: what save_pretrained writes, which file a directory is read from, and the ids each library gives.

transformers 5 and sentence-transformers read a directory's tokenizer.json first. bertkit writes the one transformers'
BertTokenizer writes for the same vocabulary, settings and tokens, and reads it first too, so the three libraries
(and the tokenizers library on the file alone) give the same ids for one directory, whatever it held before a save.
"""

from __future__ import annotations

import json
import shutil

import pytest

from bertkit.errors import BertkitError
from bertkit.tokenization import BertTokenizer
from bertkit.tokenization.loading import read_tokenizer_json

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

TOKENIZER_FILES = ("vocab.txt", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.json")
ADDED = ["[E1]", "naïve", "covid19", "entity"]  # new, new with an accent, new, already in the vocabulary
SPECIAL = ["<ent>", "[unused5]"]
# Accents, CJK, other scripts, added and special tokens in and out of words
EXTRA = ["北京大学的学生在图书馆学习。Naïve café, résumé, Ångström, Zoë's crème brûlée",
         "東京タワーは333メートル 서울 Москва Ελλάδα İstanbul straße ﬁ",
         "[E1]Naïve NAÏVE naive covid19 COVID19x entity<ent> [unused5] [CLS] [MASK] [SEP] [UNK]"]
KEPT = ("do_lower_case", "strip_accents", "tokenize_chinese_chars", "model_max_length", "max_input_chars_per_word",
        "clean_up_tokenization_spaces", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
SETTINGS = {"uncased": {}, "cased": {"do_lower_case": False},
            "lower-keep-accents": {"strip_accents": False, "tokenize_chinese_chars": False},
            "cased-strip-accents": {"do_lower_case": False, "strip_accents": True}}


@pytest.fixture(scope="module")
def words(minilm_dir):
    return (minilm_dir / "vocab.txt").read_text(encoding="utf-8").splitlines()


@pytest.fixture(scope="module")
def texts(data_dir):
    """299 texts: 60 SQuAD dev questions and their contexts, 140 CoNLL-2003 (cased) sentences, 39 of EXTRA and
    the added tokens."""
    data = json.loads((data_dir / "squad" / "dev-v1.1.json").read_text(encoding="utf-8"))["data"]
    paragraphs = [p for article in data[:10] for p in article["paragraphs"]][:60]
    squad = [p["qas"][0]["question"] for p in paragraphs] + [p["context"] for p in paragraphs]
    sentences = (data_dir / "conll2003" / "valid.txt").read_text(encoding="utf-8").split("\n\n")
    conll = [" ".join(line.split()[0] for line in s.splitlines()) for s in sentences[1:141]]
    return squad + conll + [f"{t} [E1] {a}" for t, a in zip(EXTRA * 10, ADDED * 10)] + EXTRA * 3


@pytest.fixture(scope="module")
def pairs(data_dir):
    data = json.loads((data_dir / "squad" / "dev-v1.1.json").read_text(encoding="utf-8"))["data"]
    paragraphs = [p for article in data[10:20] for p in article["paragraphs"]][:40]
    return [p["qas"][0]["question"] for p in paragraphs], [p["context"] + " naïve [E1]" for p in paragraphs]


def _tokenizer(words, settings):
    tok = BertTokenizer(words, **settings)
    tok.add_tokens(ADDED)
    tok.add_special_tokens({"additional_special_tokens": SPECIAL})
    return tok


def _transformers_of(tok):
    """transformers 5's BertTokenizer with ``tok``'s vocabulary, settings and tokens, added in the same order."""
    ref = transformers.BertTokenizer(
        vocab={t: i for i, t in enumerate(tok._tokens[:tok._wordpiece_size])}, do_lower_case=tok.do_lower_case,
        strip_accents=tok.strip_accents, tokenize_chinese_chars=tok.tokenize_chinese_chars,
        unk_token=tok.unk_token, sep_token=tok.sep_token, pad_token=tok.pad_token, cls_token=tok.cls_token,
        mask_token=tok.mask_token)
    ref.add_tokens(list(tok.added_tokens))
    if tok.additional_special_tokens:
        ref.add_special_tokens({"additional_special_tokens": list(tok.additional_special_tokens)})
    return ref


def _copy_tokenizer(source, out):
    out.mkdir()
    for name in TOKENIZER_FILES:
        shutil.copy(source / name, out / name)
    return out


def _slow_but(cases, *kept):
    """``cases`` with all but ``kept`` marked slow: make test checks each test's mechanism on the settings kept (each
    test of this file keeps other settings, so make test writes and reads every one), make test-slow on all."""
    return [case if case in kept else pytest.param(*(case if isinstance(case, tuple) else (case,)),
                                                   marks=pytest.mark.slow) for case in cases]


@pytest.mark.parametrize("name", _slow_but([*SETTINGS, "another-cls-token"], "cased-strip-accents", "another-cls-token"))
def test_tokenizer_json_is_the_one_transformers_writes(words, tmp_path, name):
    """Byte for byte, but for the final newline: the WordPiece model (added tokens left out), the BertNormalizer's
    settings, the post-processor's [CLS]/[SEP] ids, every special and added token with its flags."""
    tok = _tokenizer(words, SETTINGS.get(name, {"cls_token": "[unused2]"}))
    written = tok.save_pretrained(tmp_path / "ours")
    _transformers_of(tok).save_pretrained(tmp_path / "theirs")
    ours, theirs = tmp_path / "ours" / "tokenizer.json", tmp_path / "theirs" / "tokenizer.json"
    assert ours in written
    assert json.loads(ours.read_text(encoding="utf-8")) == json.loads(theirs.read_text(encoding="utf-8"))
    assert ours.read_text(encoding="utf-8") == theirs.read_text(encoding="utf-8") + "\n"
    data = json.loads(ours.read_text(encoding="utf-8"))
    assert len(data["model"]["vocab"]) == 30522 and len(tok) == 30526  # "entity" and [unused5] had ids already
    cls = ("[unused2]", 3) if name == "another-cls-token" else ("[CLS]", 101)
    assert [(e["content"], e["id"], e["normalized"], e["special"]) for e in data["added_tokens"]] == sorted([
        ("[PAD]", 0, False, True), (*cls, False, True), ("[unused5]", 6, False, True), ("[UNK]", 100, False, True),
        ("[SEP]", 102, False, True), ("[MASK]", 103, False, True), ("entity", 9178, True, False),
        ("[E1]", 30522, True, False), ("naïve", 30523, True, False), ("covid19", 30524, True, False),
        ("<ent>", 30525, False, True)], key=lambda e: e[1])


@pytest.mark.parametrize("name", _slow_but(list(SETTINGS), "lower-keep-accents"))
def test_the_tokenizers_library_gives_bertkits_ids_from_the_file(words, tmp_path, texts, pairs, name):
    """tokenizers.Tokenizer.from_file on the written file alone: the same ids, segments and offsets as bertkit on
    SQuAD, CoNLL-2003 and CJK / accented text with added and special tokens, single texts and pairs."""
    tok = _tokenizer(words, SETTINGS[name])
    tok.save_pretrained(tmp_path)
    fast = tokenizers.Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    ours = tok(texts, return_offsets_mapping=True)
    theirs = fast.encode_batch(texts)
    assert ours["input_ids"] == [e.ids for e in theirs]
    assert ours["offset_mapping"] == [e.offsets for e in theirs]
    assert sum(row.count(tok.vocab["[E1]"]) for row in ours["input_ids"]) == 51  # the added tokens are in use
    questions, contexts = pairs
    ours, theirs = tok(questions, contexts), fast.encode_batch(list(zip(questions, contexts)))
    assert ours["input_ids"] == [e.ids for e in theirs]
    assert ours["token_type_ids"] == [e.type_ids for e in theirs]


@pytest.mark.parametrize("name", _slow_but([*SETTINGS, "blank-lines"], "cased", "blank-lines"))
def test_what_is_written_reads_back_as_the_same_tokenizer(words, tmp_path, texts, name):
    """read_tokenizer_json gives back the tokens, the WordPiece model's size and the settings; from_pretrained the
    same tokenizer. Read from vocab.txt, a special token added as "newtok" joined the WordPiece vocabulary, so the
    reloaded tokenizer made the special token of "NEWTOK" (ids 30526, where the saved one gave newt ##ok)."""
    if name == "blank-lines":  # a vocab.txt may list the blank token twice: tokenizer.json has one id fewer
        words = list(words)
        words[7] = words[8] = ""
    tok = _tokenizer(words, SETTINGS.get(name, {}))
    tok.add_special_tokens({"additional_special_tokens": ["newtok"]})
    tok.save_pretrained(tmp_path)
    normalizer = {k: getattr(tok, k) for k in ("do_lower_case", "strip_accents", "tokenize_chinese_chars")}
    tokens, settings, wordpiece_size = read_tokenizer_json(tmp_path / "tokenizer.json", normalizer)  # as saved
    assert tokens == tok._tokens and wordpiece_size == tok._wordpiece_size == 30522
    assert settings == {"unk_token": "[UNK]", "max_input_chars_per_word": 100, "do_lower_case": tok.do_lower_case,
                        "strip_accents": tok.strip_accents, "tokenize_chinese_chars": tok.tokenize_chinese_chars,
                        "added_tokens": ["entity", "[E1]", "naïve", "covid19"],
                        # tokenizer.json flags them special; tokenizer_config.json lists them (not read here)
                        "unlisted_special_tokens": ["[unused5]", "<ent>", "newtok"]}
    again = BertTokenizer.from_pretrained(tmp_path)
    assert again._tokens == tok._tokens and again._wordpiece_size == 30522
    assert again.all_special_tokens == tok.all_special_tokens
    assert again.added_tokens == sorted(tok.added_tokens, key=tok.vocab.get)  # in id order, as transformers lists them
    assert [getattr(again, k) for k in KEPT] == [getattr(tok, k) for k in KEPT]
    more = [*texts[:100], "NEWTOK Newtok newtok"]
    assert again(more)["input_ids"] == tok(more)["input_ids"]
    if tok.do_lower_case:
        assert again("NEWTOK newtok")["input_ids"] == [101, 25597, 6559, 30526, 102]
    again.save_pretrained(tmp_path / "again")
    assert (tmp_path / "again" / "tokenizer.json").read_bytes() == (tmp_path / "tokenizer.json").read_bytes()


def _reordered(words):
    """Another vocabulary: MiniLM's word pieces from id 1000 on in reverse order (the same pieces, other ids)."""
    return words[:1000] + words[:999:-1]


@pytest.mark.parametrize("case", _slow_but(["another-vocabulary", "another-cls-token", "added-tokens-dropped"],
                                           "another-vocabulary"))
def test_a_save_over_a_directory_gives_transformers_the_saved_tokenizers_ids(minilm_dir, words, tmp_path, texts,
                                                                             pairs, case):
    """Saved over a directory that held a tokenizer.json (a sentence-transformers or transformers directory, or
    another model's), bertkit's tokenizer is what transformers loads from it. bertkit wrote no tokenizer.json, so
    transformers tokenized with the one left there: the old vocabulary's ids (another-vocabulary), the old [CLS]
    kept as a special token (another-cls-token); and an added_tokens.json left by an earlier save brought its tokens
    back into both libraries (added-tokens-dropped: "[E1]" id 30522, where the saved tokenizer has no such token)."""
    d = _copy_tokenizer(minilm_dir, tmp_path / "tok")
    if case == "another-vocabulary":
        tok = BertTokenizer(_reordered(words))
    elif case == "another-cls-token":
        tok = BertTokenizer.from_pretrained(d)
        tok.add_special_tokens({"cls_token": "[unused2]"})
        tok.add_tokens(["[E1]"])
    else:
        earlier = BertTokenizer.from_pretrained(d)
        earlier.add_tokens(["[E1]"])
        earlier.save_pretrained(d)
        tok = BertTokenizer.from_pretrained(minilm_dir)
    tok.save_pretrained(d)
    ref = transformers.AutoTokenizer.from_pretrained(d)
    more = [*texts, "a [CLS] b [E1] c"]
    want = tok(more)["input_ids"]
    assert ref(more)["input_ids"] == want
    assert BertTokenizer.from_pretrained(d)(more)["input_ids"] == want
    questions, contexts = pairs
    assert ref(questions, contexts)["input_ids"] == tok(questions, contexts)["input_ids"]
    assert len(ref) == len(tok) == (30523 if case == "another-cls-token" else 30522)


def test_tokenizer_json_is_read_first_where_vocab_txt_disagrees(minilm_dir, words, tmp_path, texts):
    """A directory whose tokenizer.json (transformers', with an added token) and vocab.txt (another vocabulary, no
    added token) disagree: transformers reads tokenizer.json, and so does bertkit now (it read vocab.txt: other ids
    for nearly every word)."""
    ref = transformers.BertTokenizerFast.from_pretrained(minilm_dir)
    ref.add_tokens(["[E1]"])
    ref.save_pretrained(tmp_path)
    (tmp_path / "vocab.txt").write_text("".join(t + "\n" for t in _reordered(words)), encoding="utf-8")
    ref = transformers.AutoTokenizer.from_pretrained(tmp_path)
    ours = BertTokenizer.from_pretrained(tmp_path)
    more = [*texts, "a [E1] b"]
    assert ours(more)["input_ids"] == ref(more)["input_ids"]
    assert len(ours) == len(ref) == 30523 and ours.vocab["the"] == ref.convert_tokens_to_ids("the") == 1996


def test_a_word_length_transformers_wrote_into_its_config_unused_is_not_read(minilm_dir, tmp_path, texts):
    """transformers takes from_pretrained(..., max_input_chars_per_word=10), ignores it, and saves it into
    tokenizer_config.json beside a tokenizer.json that says 100: transformers and tokenizers read the directory with
    100, and so does bertkit now (it read the config's 10: one [UNK] for every word of 11 letters or more)."""
    transformers.BertTokenizerFast.from_pretrained(minilm_dir, max_input_chars_per_word=10).save_pretrained(tmp_path)
    assert json.loads((tmp_path / "tokenizer_config.json").read_text())["max_input_chars_per_word"] == 10
    assert json.loads((tmp_path / "tokenizer.json").read_text())["model"]["max_input_chars_per_word"] == 100
    ref, ours = transformers.BertTokenizerFast.from_pretrained(tmp_path), BertTokenizer.from_pretrained(tmp_path)
    file = tokenizers.Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    file.no_padding()  # the file keeps the padding of transformers' last call
    text = "Super Bowl internationalization determination"
    assert ours(text)["input_ids"] == ref(text)["input_ids"] == file.encode(text).ids == [
        101, 3565, 4605, 2248, 3989, 9128, 102]
    assert ours(texts[:120])["input_ids"] == ref(texts[:120])["input_ids"]
    assert ours.max_input_chars_per_word == 100
    # passed to from_pretrained, it is this tokenizer's (Google's BERT reads words of up to 200 characters)
    assert BertTokenizer.from_pretrained(tmp_path, max_input_chars_per_word=10)(text)["input_ids"] == [
        101, 3565, 4605, 100, 100, 102]


# the sentence models save through one path (CrossEncoder's and SparseEncoder's in make test-slow), Trainer another
@pytest.mark.parametrize("saver", _slow_but(["SentenceTransformer", "CrossEncoder", "SparseEncoder", "Trainer"],
                                            "SentenceTransformer", "Trainer"))
def test_model_saves_write_their_tokenizers_tokenizer_json(minilm_dir, words, tmp_path, texts, tiny_checkpoint,
                                                            saver):
    """SentenceTransformer.save, CrossEncoder.save, SparseEncoder.save and Trainer.save_model write the tokenizer
    through save_pretrained: into a directory that held MiniLM's tokenizer files, a model with another vocabulary
    leaves the tokenizer.json of its own tokenizer, which transformers reads."""
    from bertkit import BertForSequenceClassification, Trainer, TrainingArguments
    from bertkit.sentence import CrossEncoder, SentenceTransformer, SparseEncoder

    head = {"SentenceTransformer": "BertModel", "SparseEncoder": "BertForMaskedLM"}.get(
        saver, "BertForSequenceClassification")
    labels = 1 if head == "BertForSequenceClassification" else None
    src = tiny_checkpoint(tmp_path / "src", head, tokenizer=_reordered(words), labels=labels)
    out = _copy_tokenizer(minilm_dir, tmp_path / "out")
    if saver == "Trainer":
        trainer = Trainer(model=BertForSequenceClassification.from_pretrained(src),
                          args=TrainingArguments(output_dir=str(tmp_path / "run")),
                          processing_class=BertTokenizer.from_pretrained(src))
        trainer.save_model(out)
        tok = trainer.processing_class
    else:
        model = {"SentenceTransformer": SentenceTransformer, "CrossEncoder": CrossEncoder,
                 "SparseEncoder": SparseEncoder}[saver](src)
        model.save(out)
        tok = model.tokenizer
    tok.save_pretrained(tmp_path / "alone")
    assert (out / "tokenizer.json").read_bytes() == (tmp_path / "alone" / "tokenizer.json").read_bytes()
    assert transformers.AutoTokenizer.from_pretrained(out)(texts)["input_ids"] == tok(texts)["input_ids"]


def test_a_tokenizer_json_model_without_its_type_is_read_as_wordpiece(minilm_dir, tmp_path, texts):
    """tokenizer.json files written by tokenizers before 0.9 give the model no "type"; tokenizers and transformers read
    one with a continuing_subword_prefix and no merges as WordPiece. Read first, it must not be refused where its
    vocab.txt beside it was read before."""
    d = _copy_tokenizer(minilm_dir, tmp_path / "tok")
    data = json.loads((d / "tokenizer.json").read_text(encoding="utf-8"))
    del data["model"]["type"]
    (d / "tokenizer.json").write_text(json.dumps(data), encoding="utf-8")
    assert type(tokenizers.Tokenizer.from_file(str(d / "tokenizer.json")).model).__name__ == "WordPiece"
    assert BertTokenizer.from_pretrained(d)(texts)["input_ids"] == \
        transformers.AutoTokenizer.from_pretrained(d)(texts)["input_ids"]


@pytest.mark.parametrize("flag", [{"single_word": True}, {"normalized": False}, {"rstrip": True}])
def test_an_added_token_matched_otherwise_than_add_tokens_matches_is_refused(minilm_dir, tmp_path, flag):
    """transformers matches a single_word token only as a whole word, a normalized=false one in the raw text (so
    "NewWord" in an uncased tokenizer is case-sensitive), and an rstrip one's offsets take the whitespace after it;
    bertkit matches added tokens as add_tokens adds them, so such a file is refused, naming the token and the flag,
    from tokenizer.json and from tokenizer_config.json's added_tokens_decoder alike. ("a NewWord and newwords":
    transformers' ids, or offsets, differ from bertkit's either way.)"""
    hf = transformers.BertTokenizer.from_pretrained(minilm_dir)
    hf.add_tokens([tokenizers.AddedToken("NewWord", **flag)])
    hf.save_pretrained(tmp_path / "json")
    (key, value), = flag.items()
    message = f"added token 'NewWord' has {key}={str(value).lower()}"
    with pytest.raises(ValueError, match=message):
        BertTokenizer.from_pretrained(tmp_path / "json")
    d = _copy_tokenizer(minilm_dir, tmp_path / "vocab")
    (d / "tokenizer.json").unlink()
    config = json.loads((d / "tokenizer_config.json").read_text(encoding="utf-8"))
    entry = {"content": "NewWord", "lstrip": False, "rstrip": False, "single_word": False, "normalized": True,
             "special": False, **flag}
    (d / "tokenizer_config.json").write_text(json.dumps({**config, "added_tokens_decoder": {"30522": entry}}))
    with pytest.raises(ValueError, match=message):
        BertTokenizer.from_pretrained(d)


# one flag per file layout in make test; json's normalized and lstrip in make test-slow
@pytest.mark.parametrize(("flag", "layout"), [({"single_word": True}, "json"),
                                               pytest.param({"normalized": True}, "json", marks=pytest.mark.slow),
                                               pytest.param({"lstrip": True}, "json", marks=pytest.mark.slow),
                                               ({"rstrip": True}, "config"), ({"single_word": True}, "map")])
def test_a_special_token_matched_otherwise_than_as_written_is_refused(minilm_dir, tmp_path, flag, layout):
    """transformers matches a special token with single_word=true only as a whole word, a normalized=true one in the
    normalized text, and takes the whitespace beside an lstrip/rstrip one into its offsets; bertkit matches special
    tokens as written, inside words, offsets the token alone. Read as bertkit's, "x[MASK]y a [MASK]  b [mask]" gave
    bertkit [101, 1060, 103, 1061, ...] where single_word gives transformers [101, 1060, 1031, 7308, 1033, 1061, ...]
    ("[", "mask", "]"), normalized [..., 1038, 103, 102] where bertkit had [..., 1038, 1031, 7308, 1033, 102], and
    lstrip the second [MASK] the offsets (10, 17) where bertkit had (11, 17). Refused naming the token and the flag,
    from tokenizer.json, tokenizer_config.json's added_tokens_decoder (a vocab.txt's [MASK] too) and a special token
    written as a serialised AddedToken (special_tokens_map.json); with the flag as bertkit matches, transformers gives
    bertkit's ids and offsets."""
    d = _copy_tokenizer(minilm_dir, tmp_path / "tok")
    (key, value), = flag.items()
    entry = {"content": "[MASK]", "lstrip": False, "rstrip": False, "single_word": False, "normalized": False,
             "special": True}
    if layout == "json":
        data = json.loads((d / "tokenizer.json").read_text(encoding="utf-8"))
        data["added_tokens"] = [{**e, **flag} if e["content"] == "[MASK]" else e for e in data["added_tokens"]]
        (d / "tokenizer.json").write_text(json.dumps(data), encoding="utf-8")
    elif layout == "config":
        (d / "tokenizer.json").unlink()
        config = json.loads((d / "tokenizer_config.json").read_text(encoding="utf-8"))
        config["added_tokens_decoder"] = {"103": {**entry, **flag}}
        (d / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    else:  # transformers 4 wrote special tokens as serialised AddedTokens there
        (d / "tokenizer.json").unlink()
        (d / "special_tokens_map.json").write_text(json.dumps({"mask_token": {**entry, **flag}}), encoding="utf-8")
    with pytest.raises(BertkitError, match=f"special token '\\[MASK\\]' has {key}={str(value).lower()}, .*: set "
                                           f"{key}={str(not value).lower()} in its entry"):
        BertTokenizer.from_pretrained(d)
    text = "x[MASK]y a [MASK]  b [mask]"
    want = transformers.AutoTokenizer.from_pretrained(d)(text, return_offsets_mapping=True)
    assert want["input_ids"] != [101, 1060, 103, 1061, 1037, 103, 1038, 1031, 7308, 1033, 102] or \
        want["offset_mapping"][5] != (11, 17)  # the difference the refusal keeps out
    if layout == "json":
        (d / "tokenizer.json").write_text(json.dumps({**data, "added_tokens": [
            {**e, key: not value} if e["content"] == "[MASK]" else e for e in data["added_tokens"]]}), encoding="utf-8")
    elif layout == "config":
        (d / "tokenizer_config.json").write_text(json.dumps({**config, "added_tokens_decoder": {"103": entry}}))
    else:
        (d / "special_tokens_map.json").write_text(json.dumps({"mask_token": entry}), encoding="utf-8")
    got = BertTokenizer.from_pretrained(d)(text, return_offsets_mapping=True)
    want = transformers.AutoTokenizer.from_pretrained(d)(text, return_offsets_mapping=True)
    assert got["input_ids"] == want["input_ids"] == [101, 1060, 103, 1061, 1037, 103, 1038, 1031, 7308, 1033, 102]
    assert got["offset_mapping"] == want["offset_mapping"] and got["offset_mapping"][5] == (11, 17)


@pytest.mark.parametrize(("key", "value", "setting"), [("lowercase", False, "do_lower_case"),
                                                       ("strip_accents", True, "strip_accents"),
                                                       ("handle_chinese_chars", False, "tokenize_chinese_chars")])
def test_a_normalizer_setting_only_tokenizer_json_holds_is_refused(minilm_dir, tmp_path, key, value, setting):
    """transformers 5 builds the normalizer from tokenizer_config.json and its defaults, ignoring tokenizer.json's;
    tokenizers reads the file. With the setting only in tokenizer.json the two differ ("HELLO 中文": transformers
    [101, 7592, 1746, 1861, 102] where a file saying lowercase false gave bertkit and tokenizers [101, 100, 1746,
    1861, 102]; handle_chinese_chars false: 30387 for 文), and bertkit read the file: a sentence-transformers vector at
    cosine 0.52. Refused naming the line to add; with it in the config, bertkit gives transformers' ids."""
    transformers = pytest.importorskip("transformers")
    data = json.loads((minilm_dir / "tokenizer.json").read_text(encoding="utf-8"))
    data["normalizer"][key] = value
    (tmp_path / "tokenizer.json").write_text(json.dumps(data), encoding="utf-8")
    config = json.loads((minilm_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    config = {k: v for k, v in config.items() if k not in ("do_lower_case", "strip_accents", "tokenize_chinese_chars")}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    with pytest.raises(BertkitError, match=rf"normalizer.{key} is {json.dumps(value)} but tokenizer_config.json sets "
                                           rf"no {setting}, .*: add \"{setting}\": {json.dumps(value)} to"):
        BertTokenizer.from_pretrained(tmp_path)
    text = "HELLO Wörld 中文"
    assert BertTokenizer.from_pretrained(tmp_path, **{setting: value})(text)["input_ids"] == \
        transformers.BertTokenizer.from_pretrained(tmp_path, **{setting: value})(text)["input_ids"]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({**config, setting: value}), encoding="utf-8")
    assert BertTokenizer.from_pretrained(tmp_path)(text)["input_ids"] == \
        transformers.AutoTokenizer.from_pretrained(tmp_path)(text)["input_ids"]


def test_sentence_transformers_lowercase_before_the_bert_normalizer_reads_as_its_tokenizer(minilm_dir, tmp_path, texts):
    """sentence-transformers 6 saves a Transformer's do_lower_case only as a Lowercase normalizer put before the
    BertNormalizer in tokenizer.json (its sentence_bert_config.json no longer says it), so every directory it saved
    with do_lower_case=True was refused ("normalizer.type is 'Sequence'"). Before an uncased BertNormalizer the
    Lowercase changes no text (tokenizers gives the same string for every code point), so the three libraries give
    one set of ids; a cased tokenizer there is refused: transformers 5 rebuilds the normalizer from
    tokenizer_config.json and keeps the case ("HELLO" is [UNK]) where tokenizers reads the file and lowers it."""
    for name in ("vocab.txt", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(minilm_dir / name, tmp_path / name)
    data = json.loads((minilm_dir / "tokenizer.json").read_text(encoding="utf-8"))
    data["normalizer"] = {"type": "Sequence", "normalizers": [{"type": "Lowercase"}, data["normalizer"]]}
    (tmp_path / "tokenizer.json").write_text(json.dumps(data), encoding="utf-8")
    ours = BertTokenizer.from_pretrained(tmp_path)
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path)
    from_file = tokenizers.Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    from_file.no_padding()
    from_file.no_truncation()  # MiniLM's file pads and cuts at 128, which the tokenizers' callers set per call
    want = [e.ids for e in from_file.encode_batch(texts)]
    assert ours(texts)["input_ids"] == theirs(texts)["input_ids"] == want
    assert ours("HELLO Wörld")["input_ids"] == [101, 7592, 2088, 102]

    config = json.loads((minilm_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({**config, "do_lower_case": False}), encoding="utf-8")
    data["normalizer"]["normalizers"][1]["lowercase"] = False
    (tmp_path / "tokenizer.json").write_text(json.dumps(data), encoding="utf-8")
    assert transformers.AutoTokenizer.from_pretrained(tmp_path)("HELLO")["input_ids"] == [101, 100, 102]
    assert tokenizers.Tokenizer.from_file(str(tmp_path / "tokenizer.json")).encode("HELLO").ids[:3] == [101, 7592, 102]
    with pytest.raises(BertkitError, match=r"normalizer is Lowercase before BertNormalizer .* but the tokenizer is "
                                           r"cased .*set \"do_lower_case\": true in tokenizer_config.json"):
        BertTokenizer.from_pretrained(tmp_path)
    lowered = {**config, "do_lower_case": True, "strip_accents": False}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(lowered), encoding="utf-8")
    from_file = tokenizers.Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    from_file.no_padding()
    text = "HELLO Wörld Ünïcödé"
    assert BertTokenizer.from_pretrained(tmp_path)(text)["input_ids"] == from_file.encode(text).ids == \
        transformers.AutoTokenizer.from_pretrained(tmp_path)(text)["input_ids"]


def test_a_vocabulary_with_a_token_twice_or_ids_out_of_order_is_named(minilm_dir, tmp_path):
    """The checks a loaded vocabulary passes (one C-level pass when nothing is wrong): a token listed twice in
    vocab.txt takes its last line's id and is counted once, as transformers reads it; a tokenizer.json id held by two tokens names both, an id past the vocabulary names
    the range; a missing id (a blank line listed twice) reads as the blank token, as transformers reads it."""
    d = _copy_tokenizer(minilm_dir, tmp_path / "tok")
    (d / "tokenizer.json").unlink()
    lines = (d / "vocab.txt").read_text(encoding="utf-8").splitlines()
    (d / "vocab.txt").write_text("\n".join([*lines, lines[2000]]) + "\n", encoding="utf-8")
    twice = BertTokenizer.from_pretrained(d)
    assert (twice.convert_tokens_to_ids(lines[2000]), len(twice), twice.vocab_size) == (len(lines),) * 3
    d = _copy_tokenizer(minilm_dir, tmp_path / "json")
    data = json.loads((d / "tokenizer.json").read_text(encoding="utf-8"))
    vocab = data["model"]["vocab"]
    for change, message in ((lambda v: v.__setitem__("[unused0]", v["[unused1]"]), r"tokens .* both have id 2"),
                            (lambda v: v.__setitem__("[unused0]", 10 ** 6), r"token ids must be integers from 0"),
                            (lambda v: v.__setitem__("[unused0]", "1"), r"token ids must be integers from 0")):
        changed = dict(vocab)
        change(changed)
        (d / "tokenizer.json").write_text(json.dumps({**data, "model": {**data["model"], "vocab": changed}}),
                                          encoding="utf-8")
        with pytest.raises(BertkitError, match=message):
            BertTokenizer.from_pretrained(d)
    gap = {t: i for t, i in vocab.items() if i != 5}
    (d / "tokenizer.json").write_text(json.dumps({**data, "model": {**data["model"], "vocab": gap}}), encoding="utf-8")
    tok = BertTokenizer.from_pretrained(d)
    by_id = {i: t for t, i in vocab.items()}
    assert tok.convert_ids_to_tokens([4, 5, 6]) == [by_id[4], "", by_id[6]]
