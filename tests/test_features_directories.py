"""``bertkit extract-features`` on sentence-transformers directories: the states written are those of the tokens the
directory's model sees (sentence-transformers' ``encode``): its default prompt or ``--prompt-name``'s before each
text, its do_lower_case, its max_seq_length, and its Transformer's own directory (0_Transformer/ in older layouts).
Values are compared with ``model(..., output_hidden_states=True)`` on those tokens, bit for bit (one text, batch 1).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from bertkit import BertModel, BertTokenizer
from bertkit import features as fx
from bertkit.errors import BertkitError
from bertkit.inference.prepare import for_cpu_inference

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = "the quick brown fox jumps over lazy dog hello world eu".split()


def _reference(model, tok, text, max_len):
    model = for_cpu_inference(model.eval(), bf16=False)  # the computation extraction runs on the CPU
    enc = tok(text, max_length=max_len, truncation=True)
    with torch.no_grad():
        states = model(torch.tensor([enc["input_ids"]]), output_hidden_states=True).hidden_states
    return tok.convert_ids_to_tokens(enc["input_ids"]), [s[0].numpy() for s in states]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, tiny_checkpoint) -> Path:
    tok = BertTokenizer({t: i for i, t in enumerate(SPECIALS + WORDS)})
    return tiny_checkpoint(tmp_path_factory.mktemp("tiny_encoder"), tokenizer=tok, num_hidden_layers=3)




def _st_directory(tiny_checkpoint, root: Path, sbert: dict, st_config: dict, layout: str = "0_Transformer") -> Path:
    """A sentence-transformers directory (v2-v5 files) over a cased tokenizer of the tiny vocabulary, its Transformer
    in ``layout`` (sentence-transformers' older 0_Transformer/, or "" for the root)."""
    cased = BertTokenizer({t: i for i, t in enumerate(SPECIALS + WORDS)}, do_lower_case=False)
    encoder = tiny_checkpoint(root / layout if layout else root, tokenizer=cased, num_hidden_layers=3)
    (root / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": layout, "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]))
    (root / "1_Pooling").mkdir()
    (root / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": 32,
                                                                "pooling_mode_mean_tokens": True}))
    (encoder / "sentence_bert_config.json").write_text(json.dumps(sbert))
    (root / "config_sentence_transformers.json").write_text(json.dumps(st_config))
    return root


@pytest.mark.parametrize("layout", ["", "0_Transformer"])
def test_cli_writes_the_tokens_a_sentence_transformers_directorys_model_sees(tiny_checkpoint, tmp_path, capsys,
                                                                             layout):
    """Was: extract-features read the directory as a plain checkpoint: no default prompt, no do_lower_case (a cased
    tokenizer then made [UNK] of every capitalised word) and google's 128 tokens over the directory's max_seq_length
    (on all-MiniLM-L6-v2-like MiniLM directories: 21 tokens written where encode(output_value="token_embeddings")
    has 10, the prompt's tokens missing), and a 0_Transformer/ layout failed for want of vocab.txt at the root. Now
    the states are those of sentence-transformers' tokens (MiniLM: within 6e-6 of transformers' hidden states on
    them, every layer)."""
    from bertkit.cli import main

    d = _st_directory(tiny_checkpoint, tmp_path / "st", {"max_seq_length": 7, "do_lower_case": True},
                      {"prompts": {"query": "Hello ", "doc": "EU "}, "default_prompt_name": "query"}, layout)
    inp = tmp_path / "in.txt"
    inp.write_text("The quick BROWN fox jumps over\n")
    out = tmp_path / "o.jsonl"
    assert main(["extract-features", "--model", str(d), "--input", str(inp), "--out", str(out), "--layers=-1,0",
                 "--no-progress"]) == 0
    (row,) = fx.read_features(out)
    assert row["tokens"] == ["[CLS]", "hello", "the", "quick", "brown", "fox", "[SEP]"]
    report = json.loads(capsys.readouterr().out)
    assert (report["max_seq_length"], report["prompt"], report["lowercase"]) == (7, "Hello ", True)
    model, tok = BertModel.from_pretrained(d / layout), BertTokenizer.from_pretrained(d / layout)
    tokens, states = _reference(model, tok, "hello the quick brown fox jumps over", max_len=7)
    assert tokens == row["tokens"]
    np.testing.assert_array_equal(row["layers"][-1], states[-1])
    np.testing.assert_array_equal(row["layers"][0], states[0])

    assert main(["extract-features", "--model", str(d), "--input", str(inp), "--out", str(out), "--overwrite",
                 "--prompt-name", "doc", "--max-seq-length", "5", "--no-progress"]) == 0
    assert next(fx.read_features(out))["tokens"] == ["[CLS]", "eu", "the", "quick", "[SEP]"]


def test_a_length_over_a_directorys_or_a_prompt_it_lacks_is_refused_by_name(tiny_checkpoint, tmp_path):
    """Was: --max-seq-length 128 on a directory cut at 7 wrote states over 128 tokens without a word."""
    d = _st_directory(tiny_checkpoint, tmp_path / "st", {"max_seq_length": 7, "do_lower_case": False},
                      {"prompts": {"query": "Hello "}}, layout="")
    form = fx.text_form(d)
    assert (form.encoder_dir, form.prompt, form.lowercase, form.max_seq_length) == (d, "", False, 7)
    tok = BertTokenizer.from_pretrained(d)
    with pytest.raises(BertkitError, match=r"max_seq_length 128 exceeds the 7 tokens .*sentence_bert_config.json "
                                           r"declares.*--max-seq-length 7 or less"):
        fx.max_seq_length_for(128, form, tok, 512)
    assert fx.max_seq_length_for(None, form, tok, 512) == 7
    with pytest.raises(BertkitError, match=r"sentence_bert_config.json: max_seq_length 7 exceeds the encoder's 6 "
                                           r"positions \(max_position_embeddings\); write 6 or less there"):
        fx.max_seq_length_for(None, form, tok, 6)  # was: cut at 6 without a word
    assert fx.max_seq_length_for(None, fx.text_form(tmp_path / "st"), tok, 512) == 7
    with pytest.raises(BertkitError, match="prompt_name 'doc' is not one of this model's prompts: 'query', 'document'"):
        fx.text_form(d, "doc")
    # every model's "document" prompt, empty here, as sentence-transformers 6 gives it (was refused, naming the others)
    assert fx.text_form(d, "document").prompt == ""


def test_a_cross_encoder_directory_is_cut_at_its_tokenizers_length(tiny, tiny_checkpoint, tmp_path):
    """sentence-transformers 6 saves a cross-encoder's max_length as its tokenizer's model_max_length (no
    sentence_bert_config.json key): extraction cuts there, as CrossEncoder.predict does; a plain checkpoint keeps
    google's 128 whatever its tokenizer says."""
    tok = BertTokenizer({t: i for i, t in enumerate(SPECIALS + WORDS)}, model_max_length=6)
    d = tiny_checkpoint(tmp_path / "ce", "BertForSequenceClassification", tokenizer=tok, num_hidden_layers=3)
    (d / "modules.json").write_text(json.dumps([{"idx": 0, "name": "0", "path": "",
                                                 "type": "sentence_transformers.base.modules.transformer.Transformer"}]))
    (d / "config_sentence_transformers.json").write_text(json.dumps({"model_type": "CrossEncoder", "prompts": {}}))
    form = fx.text_form(d)
    assert fx.max_seq_length_for(None, form, BertTokenizer.from_pretrained(d), 512) == 6
    assert fx.max_seq_length_for(None, fx.text_form(tiny), tok, 512) == fx.MAX_SEQ_LENGTH


def test_a_plain_checkpoint_of_fewer_positions_is_cut_at_them_by_default(tiny_checkpoint, tmp_path, capsys):
    """A plain checkpoint of 64 positions: extract-features and quantize without --max-seq-length were refused
    ("max_length 128 exceeds max_position_embeddings 64 ... pass max_length 64 or less", a flag neither has); google's
    128 now stops at the model's positions, as pipelines stop theirs. A length given over them is still refused."""
    from bertkit.cli import main

    tok = BertTokenizer({t: i for i, t in enumerate(SPECIALS + WORDS)})
    d = tiny_checkpoint(tmp_path / "p64", "BertModel", tokenizer=tok, max_position_embeddings=64)
    texts = tmp_path / "texts.txt"
    texts.write_text("the quick\nquick the\n", encoding="utf-8")
    out = tmp_path / "feat.jsonl"
    assert main(["extract-features", "--model", str(d), "--input", str(texts), "--out", str(out), "--layers=-1",
                 "--no-progress"]) == 0
    assert len(list(fx.read_features(out))) == 2
    assert main(["quantize", "--model", str(d), "--output-dir", str(tmp_path / "q")]) == 0
    assert json.loads((tmp_path / "q" / "config.json").read_text())["max_position_embeddings"] == 64
    assert main(["extract-features", "--model", str(d), "--input", str(texts), "--out", str(out), "--overwrite",
                 "--max-seq-length", "65"]) == 2
    assert "--max-seq-length 65 exceeds max_position_embeddings 64" in capsys.readouterr().err


def test_the_python_api_reads_the_directory_the_model_was_loaded_from(tiny_checkpoint, tmp_path):
    """Was: ``extract_features(BertModel.from_pretrained(st_dir), ...)`` wrote the states of the bare text at 128
    tokens. Now its prompt, do_lower_case and max_seq_length apply unless given."""
    d = _st_directory(tiny_checkpoint, tmp_path / "st", {"max_seq_length": 6, "do_lower_case": True},
                      {"prompts": {"query": "Hello "}, "default_prompt_name": "query"}, layout="")
    model, tok = BertModel.from_pretrained(d), BertTokenizer.from_pretrained(d)
    texts = [("The quick BROWN fox jumps over", None)]
    fx.extract_features(model, tok, texts, tmp_path / "a.jsonl", layers=[-1], progress=False)
    assert next(fx.read_features(tmp_path / "a.jsonl"))["tokens"] == ["[CLS]", "hello", "the", "quick", "brown",
                                                                      "[SEP]"]
    fx.extract_features(model, tok, texts, tmp_path / "b.jsonl", layers=[-1], progress=False, prompt="",
                        lowercase=False, max_seq_length=5)
    assert next(fx.read_features(tmp_path / "b.jsonl"))["tokens"] == ["[CLS]", "[UNK]", "quick", "[UNK]", "[SEP]"]
    with pytest.raises(BertkitError, match="max_seq_length 7 exceeds the 6 tokens"):
        fx.extract_features(model, tok, texts, tmp_path / "c.jsonl", max_seq_length=7, progress=False)


CONLL = "The DT B-NP O\nQuick JJ I-NP B-ORG\nBrown NNP I-NP I-ORG\nFOX NN I-NP O\n\nHello UH O O\nWorld NN B-NP B-LOC\n"


def test_the_feature_study_reads_a_sentence_transformers_directory(tiny_checkpoint, tmp_path):
    """Was: ``bertkit feature-study`` on a sentence-transformers directory took its words as given (a cased tokenizer
    made [UNK] of every capitalised word the directory's do_lower_case lowers), windowed at 128 over its
    max_seq_length, left its default prompt out without a word, and could not read a 0_Transformer/ layout. Now the
    words are lowered, a longer window or a default prompt is refused by name."""
    from bertkit.settings import StudySettings
    from bertkit.tasks import ner
    from bertkit.training import feature_study as fs

    d = _st_directory(tiny_checkpoint, tmp_path / "st", {"max_seq_length": 16, "do_lower_case": True}, {}, layout="")
    data = tmp_path / "conll"
    data.mkdir()
    for split in ("train", "valid"):
        (data / f"{split}.txt").write_text(CONLL)
    settings = StudySettings(data_dir=data, model_name_or_path=d, output_dir=tmp_path / "study", num_train_epochs=1,
                             combinations=("last_hidden",), progress=False, max_seq_length=16)
    fs.feature_study(settings)
    got = np.load(tmp_path / "study" / "activations" / "dev.npy")
    enc = d
    lowered = [ner.NerSentence(tuple(w.lower() for w in x.words), x.tags, x.line)
               for x in ner.read_conll(data / "valid.txt", "iob1")]
    want = fs.extract_word_activations(BertModel.from_pretrained(enc), BertTokenizer.from_pretrained(enc), lowered,
                                       tmp_path / "want.npy", max_seq_length=16, progress=False)
    np.testing.assert_array_equal(got, want.values)
    with pytest.raises(BertkitError, match="max_seq_length 128 exceeds the 16 tokens"):
        fs.feature_study(dataclasses.replace(settings, max_seq_length=128, output_dir=tmp_path / "s2"))
    (d / "config_sentence_transformers.json").write_text(json.dumps({"prompts": {"q": "hello "},
                                                                     "default_prompt_name": "q"}))
    with pytest.raises(BertkitError, match="puts the prompt 'hello ' before every text"):
        fs.feature_study(dataclasses.replace(settings, output_dir=tmp_path / "s3"))


def test_the_feature_study_without_a_length_windows_at_the_directorys_or_the_models_positions(tiny_checkpoint,
                                                                                              tmp_path):
    """Was: feature-study without --max-seq-length windowed at 128 whatever the model: a sentence-transformers
    directory declaring 16 tokens was refused ("max_seq_length 128 exceeds the 16 tokens ...: give
    --max-seq-length 16 or less (or leave it out)", left out already) and a plain checkpoint of 64 positions failed.
    Now, as extract-features, the directory's max_seq_length applies, else google's 128 within the positions."""
    from bertkit.settings import StudySettings
    from bertkit.tasks import ner
    from bertkit.training import feature_study as fs

    data = tmp_path / "conll"
    data.mkdir()
    for split in ("train", "valid"):  # a sentence of 20 words: two windows at 16 tokens, one at 64
        (data / f"{split}.txt").write_text(CONLL + "\n" + "".join(f"{w} NN I-NP O\n" for w in WORDS * 2)[:-1] + "\n")
    d = _st_directory(tiny_checkpoint, tmp_path / "st", {"max_seq_length": 16, "do_lower_case": True}, {}, layout="")
    plain = tiny_checkpoint(tmp_path / "p64", "BertModel", tokenizer=BertTokenizer(
        {t: i for i, t in enumerate(SPECIALS + WORDS)}), max_position_embeddings=64, num_hidden_layers=3)
    for model_dir, length in ((d, 16), (plain, 64)):
        out = tmp_path / f"study-{length}"
        report = fs.feature_study(StudySettings(data_dir=data, model_name_or_path=model_dir, output_dir=out,
                                                num_train_epochs=1, combinations=("last_hidden",), progress=False))
        assert report["settings"]["max_seq_length"] == length
        dev = [ner.NerSentence(tuple(w.lower() for w in x.words), x.tags, x.line)
               for x in ner.read_conll(data / "valid.txt", "iob1")]
        want = fs.extract_word_activations(BertModel.from_pretrained(model_dir), BertTokenizer.from_pretrained(
            model_dir), dev, tmp_path / f"want-{length}.npy", max_seq_length=length, progress=False)
        np.testing.assert_array_equal(np.load(out / "activations" / "dev.npy"), want.values)
    with pytest.raises(BertkitError, match="--max-seq-length 65 exceeds max_position_embeddings 64 of .*p64: .*pass "
                                           "--max-seq-length 64 or less"):  # before any activation, naming the flag
        fs.feature_study(StudySettings(data_dir=data, model_name_or_path=plain, output_dir=tmp_path / "s65",
                                       max_seq_length=65, combinations=("last_hidden",), progress=False))
    assert not (tmp_path / "s65" / "activations").exists()


@pytest.mark.slow  # 13 s (loading sentence-transformers and transformers): make test-slow
def test_minilm_states_are_sentence_transformers_and_transformers_on_its_tokens(minilm_2_layers, tmp_path):
    """Parity on real weights: a v5 directory over a cased tokenizer with do_lower_case, a default prompt and
    max_seq_length 12; every layer against transformers' hidden states on the ids sentence-transformers' encode
    feeds its model, the last also against its token_embeddings."""
    st = pytest.importorskip("sentence_transformers")
    transformers = pytest.importorskip("transformers")
    d = tmp_path / "st"
    d.mkdir()
    for name in ("config.json", "model.safetensors", "vocab.txt", "special_tokens_map.json"):
        if (minilm_2_layers / name).exists():
            (d / name).symlink_to(minilm_2_layers / name)
    config = json.loads((minilm_2_layers / "tokenizer_config.json").read_text())
    (d / "tokenizer_config.json").write_text(json.dumps({**config, "do_lower_case": False, "strip_accents": False}))
    fast = json.loads((minilm_2_layers / "tokenizer.json").read_text())
    fast["normalizer"].update(lowercase=False, strip_accents=False)
    (d / "tokenizer.json").write_text(json.dumps(fast))
    (d / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]))
    (d / "1_Pooling").mkdir()
    (d / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": 384,
                                                            "pooling_mode_mean_tokens": True}))
    (d / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 12, "do_lower_case": True}))
    (d / "config_sentence_transformers.json").write_text(json.dumps({"prompts": {"query": "Query: "},
                                                                     "default_prompt_name": "query"}))
    texts = ["The 1964 Michigan Wolverines football team won the Big Ten.", "Hello World", "ÉCOLE in PARIS"]
    fx.extract_features(BertModel.from_pretrained(d), BertTokenizer.from_pretrained(d), [(t, None) for t in texts],
                        tmp_path / "f.jsonl", layers=[-1, -2, 0], progress=False)
    ref = st.SentenceTransformer(str(d), device="cpu")
    hf = transformers.BertModel.from_pretrained(str(d), add_pooling_layer=False).eval()
    token_embeddings = ref.encode(texts, output_value="token_embeddings", convert_to_numpy=False)
    for text, row, last in zip(texts, fx.read_features(tmp_path / "f.jsonl"), token_embeddings):
        ids = ref.tokenize(["Query: " + text])["input_ids"]
        assert row["tokens"] == ref.tokenizer.convert_ids_to_tokens(ids[0].tolist())
        with torch.no_grad():
            states = hf(ids, output_hidden_states=True).hidden_states
        for layer in (-1, -2, 0):
            np.testing.assert_allclose(row["layers"][layer], states[layer][0].numpy(), atol=2e-5, rtol=0)
        np.testing.assert_allclose(row["layers"][-1], last.numpy(), atol=2e-5, rtol=0)
    assert [len(r["tokens"]) for r in fx.read_features(tmp_path / "f.jsonl")] == [12, 8, 9]


def test_a_prompt_written_as_null_is_empty(tiny_checkpoint, tmp_path):
    """Was: ``--prompt-name doc`` where config_sentence_transformers.json has ``"doc": null`` failed inside the
    feature-extraction pipeline (TypeError: None + str); sentence-transformers embeds with no prompt."""
    import bertkit

    d = _st_directory(tiny_checkpoint, tmp_path / "st", {"max_seq_length": 16, "do_lower_case": False},
                      {"prompts": {"query": "Hello ", "doc": None}}, layout="")
    assert fx.text_form(d, "doc").prompt == ""
    pipe = bertkit.pipeline("feature-extraction", str(d))
    assert pipe("the fox", prompt_name="doc") == pipe("the fox")
    assert pipe("the fox", prompt_name="query") != pipe("the fox")


def _fake_hub(monkeypatch, cache: Path, remotes: dict[str, Path]) -> None:
    """huggingface_hub's downloads faked from local folders (``remotes``: repo id -> its files), into a cache laid out
    as huggingface_hub lays it: snapshots/<commit>/, refs/main, and .no_exist/<commit>/NAME for a file asked for by
    name that the repo lacks. snapshot_download fetches what allow_patterns selects, by huggingface_hub's matching."""
    import shutil

    import huggingface_hub
    from huggingface_hub.errors import EntryNotFoundError, LocalEntryNotFoundError
    from huggingface_hub.utils import filter_repo_objects

    import bertkit.hub

    commit = "c" * 40

    def storage(repo_id: str) -> Path:
        return cache / ("models--" + repo_id.replace("/", "--"))

    def fetch(repo_id: str, names) -> Path:
        snapshot = storage(repo_id) / "snapshots" / commit
        for name in names:
            (snapshot / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(remotes[repo_id] / name, snapshot / name)
        (storage(repo_id) / "refs").mkdir(parents=True, exist_ok=True)
        (storage(repo_id) / "refs" / "main").write_text(commit)
        return snapshot

    def snapshot_download(repo_id, allow_patterns=None, local_files_only=False):
        snapshot = storage(repo_id) / "snapshots" / commit
        if local_files_only:
            if not snapshot.is_dir():
                raise LocalEntryNotFoundError("not cached")
            return str(snapshot)
        files = [f.relative_to(remotes[repo_id]).as_posix() for f in remotes[repo_id].rglob("*") if f.is_file()]
        return str(fetch(repo_id, filter_repo_objects(files, allow_patterns=allow_patterns)))

    def hf_hub_download(repo_id, filename):
        if not (remotes[repo_id] / filename).is_file():
            absent = storage(repo_id) / ".no_exist" / commit / filename
            absent.parent.mkdir(parents=True, exist_ok=True)
            absent.touch()
            raise EntryNotFoundError(f"{filename} is not in {repo_id}")
        return str(fetch(repo_id, [filename]) / filename)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", hf_hub_download)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(bertkit.hub, "_hub_reachable", lambda endpoint: True)


@pytest.mark.parametrize("layout", ["", "0_Transformer"])
def test_a_hub_id_gives_the_states_of_the_same_directory_on_disk(tiny_checkpoint, tmp_path, capsys, monkeypatch,
                                                                   layout):
    """Was: a sentence-transformers repo given as a Hub id came down with BERT's files only (config.json, weights,
    tokenizer: no modules.json, sentence_bert_config.json, config_sentence_transformers.json, 1_Pooling/), so
    extract-features wrote the states of the bare, cased text at 128 tokens where the same directory on disk gives
    those of its prompt, do_lower_case and max_seq_length (an older 0_Transformer/ layout: no checkpoint at all).
    Now its files come down as sentence-transformers fetches them, module folders included, and the states equal the
    local directory's. (The Hub is faked: downloads copy from a folder into a cache laid out as huggingface_hub's.)"""
    from bertkit.cli import main

    local = _st_directory(tiny_checkpoint, tmp_path / "st", {"max_seq_length": 7, "do_lower_case": True},
                          {"prompts": {"query": "Hello "}, "default_prompt_name": "query"}, layout)
    (local / "tf_model.h5").write_bytes(b"not fetched")
    (local / "onnx").mkdir()
    (local / "onnx" / "model.onnx").write_bytes(b"not fetched")
    _fake_hub(monkeypatch, tmp_path / "hub", {"org/st": local})
    inp = tmp_path / "in.txt"
    inp.write_text("The quick BROWN fox jumps over\n")

    def extract(model: str, out: str) -> list:
        assert main(["extract-features", "--model", model, "--input", str(inp), "--out", str(tmp_path / out),
                     "--layers=-1,0", "--no-progress"]) == 0
        return list(fx.read_features(tmp_path / out))

    want = extract(str(local), "local.jsonl")
    assert want[0]["tokens"] == ["[CLS]", "hello", "the", "quick", "brown", "fox", "[SEP]"]
    got = extract("org/st", "hub.jsonl")
    assert got[0]["tokens"] == want[0]["tokens"]
    for layer in (-1, 0):
        np.testing.assert_array_equal(got[0]["layers"][layer], want[0]["layers"][layer])
    snapshot = tmp_path / "hub" / "models--org--st" / "snapshots" / ("c" * 40)
    fetched = sorted(f.relative_to(snapshot).as_posix() for f in snapshot.rglob("*") if f.is_file())
    assert fetched == sorted(f.relative_to(local).as_posix() for f in local.rglob("*")
                             if f.is_file() and f.suffix not in (".h5", ".onnx"))
    if not layout:  # the Python API: a model loaded by its Hub id reads the files that came with it
        fx.extract_features(BertModel.from_pretrained("org/st"), BertTokenizer.from_pretrained("org/st"),
                            [("The quick BROWN fox jumps over", None)], tmp_path / "py.jsonl", layers=[-1],
                            progress=False)
        np.testing.assert_array_equal(next(fx.read_features(tmp_path / "py.jsonl"))["layers"][-1], want[0]["layers"][-1])


def test_a_hub_repo_cached_in_part_is_completed_or_refused_never_read_as_a_plain_checkpoint(tiny_checkpoint, tmp_path,
                                                                                            monkeypatch):
    """Was: a cached snapshot holding config, weights and tokenizer counted as whole, so a sentence-transformers repo
    that transformers had cached (its BERT files only) was read as a plain checkpoint, online too. Now the snapshot
    is completed online (modules.json first, as sentence-transformers asks for it); offline, a snapshot whose cache
    does not record that the repo lacks modules.json is refused by name. A plain repo fetched once is known plain."""
    import huggingface_hub

    from bertkit.errors import MissingFileError

    local = _st_directory(tiny_checkpoint, tmp_path / "st", {"max_seq_length": 7, "do_lower_case": True},
                          {"prompts": {"query": "Hello "}, "default_prompt_name": "query"}, layout="")
    plain = tiny_checkpoint(tmp_path / "plain", tokenizer=SPECIALS + WORDS, num_hidden_layers=3)
    _fake_hub(monkeypatch, tmp_path / "hub", {"org/st": local, "org/plain": plain})
    snapshot = tmp_path / "hub" / "models--org--st" / "snapshots" / ("c" * 40)
    snapshot.mkdir(parents=True)
    for name in ("config.json", "model.safetensors", "vocab.txt", "tokenizer_config.json"):  # as transformers caches
        (snapshot / name).write_bytes((local / name).read_bytes())
    (tmp_path / "hub" / "models--org--st" / "refs").mkdir()
    (tmp_path / "hub" / "models--org--st" / "refs" / "main").write_text("c" * 40)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(MissingFileError, match=r"cache of org/st without a modules.json, and the cache does not "
                                               r"record whether the repo has one.*hf download org/st --local-dir DIR"):
        fx.text_form("org/st")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    form = fx.text_form("org/st")
    assert (form.encoder_dir, form.prompt, form.lowercase, form.max_seq_length) == (snapshot, "Hello ", True, 7)
    (snapshot / "1_Pooling" / "config.json").unlink()  # a module's file missing: fetched again
    assert fx.text_form("org/st").prompt == "Hello " and (snapshot / "1_Pooling" / "config.json").is_file()
    assert fx.text_form("org/plain") == fx.TextForm(tmp_path / "hub" / "models--org--plain" / "snapshots" / ("c" * 40))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # recorded: no modules.json there
    assert fx.text_form("org/plain").source == "" and fx.text_form("org/st").prompt == "Hello "


@pytest.mark.parametrize("lost", ["config_sentence_transformers.json", "sentence_bert_config.json"])
def test_a_cached_sentence_repo_missing_its_settings_fetches_them_online(tiny_checkpoint, tmp_path, monkeypatch, lost):
    """Was: a cached sentence-transformers snapshot holding modules.json, the BERT files and the modules but not
    config_sentence_transformers.json (its prompts) or sentence_bert_config.json (max_seq_length, do_lower_case),
    a download cut short, counted as whole: online, `--model org/st` wrote the states of the bare text at 128 tokens
    where sentence-transformers fetches those files and the directory on disk gives the prompt's tokens at 7. Now a
    settings file the cache does not hold, nor record as absent from the repo, is fetched first."""
    local = _st_directory(tiny_checkpoint, tmp_path / "st", {"max_seq_length": 7, "do_lower_case": True},
                          {"prompts": {"query": "Hello "}, "default_prompt_name": "query"}, layout="")
    _fake_hub(monkeypatch, tmp_path / "hub", {"org/st": local})
    want = fx.text_form(local)
    assert (want.prompt, want.lowercase, want.max_seq_length) == ("Hello ", True, 7)
    snapshot = Path(fx.text_form("org/st").encoder_dir)
    (snapshot / lost).unlink()
    got = fx.text_form("org/st")
    assert (got.prompt, got.lowercase, got.max_seq_length) == (want.prompt, want.lowercase, want.max_seq_length)
    assert (snapshot / lost).is_file()


def test_a_module_file_missing_from_a_cached_snapshot_is_one_line_naming_it(tiny_checkpoint, tmp_path, capsys,
                                                                            monkeypatch):
    """Was: a sentence-transformers repo cached without its 1_Pooling/config.json (a download cut short) made
    `bertkit extract-features --model org/st` (offline, HF_HUB_OFFLINE=1) end in a FileNotFoundError traceback (exit
    1), as did SentenceTransformer on the snapshot: a user's missing file, reported as a bug in bertkit. Now it is the
    one-line error (exit 2) naming the file and how to fetch the rest of the repo."""
    import shutil

    from huggingface_hub import constants

    from bertkit.cli import main
    from bertkit.errors import MissingFileError
    from bertkit.sentence import SentenceTransformer

    local = _st_directory(tiny_checkpoint, tmp_path / "st", {"max_seq_length": 7}, {}, layout="")
    repo = tmp_path / "hub" / "models--org--st"
    snapshot = repo / "snapshots" / ("c" * 40)
    shutil.copytree(local, snapshot)
    (snapshot / "1_Pooling" / "config.json").unlink()
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("c" * 40)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    (tmp_path / "in.txt").write_text("the fox\n")
    assert main(["extract-features", "--model", "org/st", "--input", str(tmp_path / "in.txt"), "--out",
                 str(tmp_path / "out.jsonl"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert f"error: {snapshot / '1_Pooling' / 'config.json'} is missing" in err
    assert "fetch the rest with `hf download org/st`" in err and "Traceback" not in err
    with pytest.raises(MissingFileError, match="1_Pooling/config.json is missing"):
        SentenceTransformer(snapshot)
    assert not (tmp_path / "out.jsonl").exists()


def test_a_model_loaded_from_0_transformer_reads_the_directory_holding_it(tiny_checkpoint, tmp_path):
    """Was: ``extract_features(BertModel.from_pretrained(st / "0_Transformer"), ...)`` (the only way to load an
    older layout's encoder in Python) wrote the bare, cased text at 128 tokens, where ``bertkit extract-features
    --model st`` applies 0_Transformer/sentence_bert_config.json and the directory's prompt. Now both write the same
    tokens and states."""
    from bertkit.cli import main

    d = _st_directory(tiny_checkpoint, tmp_path / "st", {"max_seq_length": 7, "do_lower_case": True},
                      {"prompts": {"query": "Hello "}, "default_prompt_name": "query"}, layout="0_Transformer")
    (tmp_path / "in.txt").write_text("The quick BROWN fox jumps over\n")
    assert main(["extract-features", "--model", str(d), "--input", str(tmp_path / "in.txt"), "--out",
                 str(tmp_path / "cli.jsonl"), "--layers=-1", "--no-progress"]) == 0
    encoder = d / "0_Transformer"
    fx.extract_features(BertModel.from_pretrained(encoder), BertTokenizer.from_pretrained(encoder),
                        [("The quick BROWN fox jumps over", None)], tmp_path / "py.jsonl", layers=[-1], progress=False)
    (want,), (got,) = fx.read_features(tmp_path / "cli.jsonl"), fx.read_features(tmp_path / "py.jsonl")
    assert got["tokens"] == want["tokens"] == ["[CLS]", "hello", "the", "quick", "brown", "fox", "[SEP]"]
    np.testing.assert_array_equal(got["layers"][-1], want["layers"][-1])
    assert fx.text_form(encoder) == fx.text_form(d)


def test_lowercase_with_a_transformers_tokenizer_keeps_its_special_tokens(tiny_checkpoint, tmp_path):
    """Was: ``extract_features(..., lowercase=True)`` with a transformers tokenizer (or a directory's do_lower_case
    applied through one) failed with AttributeError: no ``.lowercase``. Now the text is lowered around the
    tokenizer's special tokens, as sentence-transformers' Lowercase normalizer leaves them, as with bertkit's."""
    transformers = pytest.importorskip("transformers")
    d = _st_directory(tiny_checkpoint, tmp_path / "st", {"max_seq_length": 12, "do_lower_case": True}, {}, layout="")
    texts = [("The QUICK fox [SEP] Hello", "EU World")]
    fx.extract_features(BertModel.from_pretrained(d), BertTokenizer.from_pretrained(d), texts, tmp_path / "a.jsonl",
                        layers=[-1], progress=False, lowercase=True)
    fast = transformers.BertTokenizerFast.from_pretrained(str(d))
    assert fast.tokenize("The") == ["[UNK]"]  # cased: lowering is what makes the words known
    fx.extract_features(BertModel.from_pretrained(d), fast, texts, tmp_path / "b.jsonl", layers=[-1], progress=False,
                        lowercase=True)
    (want,), (got,) = fx.read_features(tmp_path / "a.jsonl"), fx.read_features(tmp_path / "b.jsonl")
    assert got["tokens"] == want["tokens"] == ["[CLS]", "the", "quick", "fox", "[SEP]", "hello", "[SEP]", "eu",
                                               "world", "[SEP]"]
    np.testing.assert_array_equal(got["layers"][-1], want["layers"][-1])
