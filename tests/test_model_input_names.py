"""A tokenizer_config.json's ``model_input_names``: a list without ``token_type_ids`` makes transformers (and
sentence-transformers) leave them out, so the model reads a pair as one segment, all type 0. bertkit read the key
nowhere and gave the second text type 1: a cross-encoder's scores, a pipeline's, fine-tuning's features all
quietly differed from the reference's. Lists transformers would pad wrongly or feed without a mask are refused."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from bertkit import BertTokenizer
from bertkit.errors import BertkitError

NO_TYPES = ["input_ids", "attention_mask"]
PAIRS = [("the cat sat on the mat", "a dog ran"), ("hello world", "the river bank is full of money today")]


def _with_names(source: Path, out: Path, names) -> Path:
    """``source``'s checkpoint copied to ``out`` with tokenizer_config.json's model_input_names set to ``names``."""
    shutil.copytree(source, out)
    config = json.loads((out / "tokenizer_config.json").read_text())
    config["model_input_names"] = names
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    return out


@pytest.fixture(scope="module")
def tiny_pair_classifier(tiny_checkpoint, minilm_dir, tmp_path_factory) -> Path:
    """A tiny random one-label classifier on MiniLM's vocabulary whose tokenizer lists no token_type_ids."""
    source = tiny_checkpoint(tmp_path_factory.mktemp("mi") / "src", "BertForSequenceClassification",
                             tokenizer=minilm_dir, labels=1, seed=3, type_vocab_size=2)
    return _with_names(source, tmp_path_factory.mktemp("mi") / "no_types", NO_TYPES)


def test_tokenizer_reads_saves_and_defaults_from_model_input_names(minilm_dir, tmp_path) -> None:
    transformers = pytest.importorskip("transformers")
    path = tmp_path / "tok"
    path.mkdir()
    for name in ("vocab.txt", "tokenizer_config.json", "tokenizer.json"):
        shutil.copy(minilm_dir / name, path / name)
    _with_names(path, tmp_path / "no_types", NO_TYPES)
    tok = BertTokenizer.from_pretrained(tmp_path / "no_types")
    ref = transformers.AutoTokenizer.from_pretrained(tmp_path / "no_types")
    for args in [("hello world", "second text"), ([a for a, _ in PAIRS], [b for _, b in PAIRS]), ("one text",)]:
        got, want = tok(*args, padding=True), ref(*args, padding=True)
        assert dict(got) == dict(want) and "token_type_ids" not in got
    assert tok("a", "b", return_token_type_ids=True)["token_type_ids"] == [0, 0, 0, 1, 1]
    tok.save_pretrained(tmp_path / "saved")
    assert json.loads((tmp_path / "saved" / "tokenizer_config.json").read_text())["model_input_names"] == NO_TYPES
    assert BertTokenizer.from_pretrained(tmp_path / "saved").model_input_names == NO_TYPES
    assert BertTokenizer.from_pretrained(path, model_input_names=NO_TYPES).model_input_names == NO_TYPES


@pytest.mark.parametrize("names, message", [
    (["input_ids"], r"lacks \['attention_mask'\].*add \"attention_mask\""),
    (["input_ids", "token_type_id", "attention_mask"], r"names \['token_type_id'\].*fix or remove them"),
    (["attention_mask", "input_ids"], r"starts with 'attention_mask'.*put \"input_ids\" first"),
    ("input_ids", r"'input_ids' is not a list of column names"),
])
def test_model_input_names_transformers_would_misuse_are_refused_by_value(minilm_dir, tmp_path, names,
                                                                           message) -> None:
    path = _with_names(minilm_dir, tmp_path / "ckpt", names)
    with pytest.raises(BertkitError, match=r"tokenizer_config.json: model_input_names=.*" + message):
        BertTokenizer.from_pretrained(path)


def test_cross_encoder_and_pipeline_score_pairs_as_one_segment(tiny_pair_classifier) -> None:
    """Before: the second text got type 1 and the scores differed from transformers', which feeds all type 0."""
    transformers = pytest.importorskip("transformers")
    import bertkit
    from bertkit.sentence import CrossEncoder

    ref_tok = transformers.AutoTokenizer.from_pretrained(tiny_pair_classifier)
    ref = transformers.AutoModelForSequenceClassification.from_pretrained(tiny_pair_classifier).eval()
    with torch.no_grad():
        want = ref(**ref_tok([a for a, _ in PAIRS], [b for _, b in PAIRS], padding=True,
                             return_tensors="pt")).logits[:, 0].numpy()
    got = CrossEncoder(str(tiny_pair_classifier), device="cpu", activation_fn=torch.nn.Identity()).predict(PAIRS)
    np.testing.assert_allclose(got, want, atol=1e-5)
    pipe = bertkit.pipeline("text-classification", model=str(tiny_pair_classifier), device="cpu")
    values = [r["value"] for r in pipe([{"text": a, "text_pair": b} for a, b in PAIRS])]
    np.testing.assert_allclose(values, want, atol=1e-5)


def test_fine_tuning_features_have_one_segment(tiny_pair_classifier) -> None:
    from bertkit.features import encode_texts
    from bertkit.tasks.glue import GlueExample, featurize
    from bertkit.tasks.squad import SquadExample, featurize_squad
    from bertkit.tasks.swag import SwagExample, featurize_swag

    tok = BertTokenizer.from_pretrained(tiny_pair_classifier)
    glue = featurize([GlueExample("0", a, b, "entailment", 1) for a, b in PAIRS], tok, 32, "mnli")
    squad = featurize_squad([SquadExample("q", "t", "what sat?", "the cat sat on the mat", ())], tok, 32, 8, 8)
    features = encode_texts(tok, PAIRS, 32)
    swag = featurize_swag([SwagExample(None, "a cat", "it", ("sat", "ran", "hid", "ate"), 0, 1)], tok, 16)
    for row in [*glue, *squad, *features]:
        assert set(row["token_type_ids"]) == {0}, row
    assert swag[0]["token_type_ids"].shape == swag[0]["input_ids"].shape and not swag[0]["token_type_ids"].any()
    tok.model_input_names = ["input_ids", "token_type_ids", "attention_mask"]
    assert 1 in featurize_squad([SquadExample("q", "t", "what?", "the cat", ())], tok, 32, 8, 8)[0]["token_type_ids"]


@pytest.mark.slow
def test_model_input_names_random_configs_match_transformers(tiny_pair_classifier, tmp_path) -> None:
    """Seeded draws of configs (the key absent, with and without token_type_ids, in other orders) and inputs
    (single texts, pairs, batches, return_token_type_ids given or not): ids, token types and masks as transformers',
    and a cross-encoder's scores of random pairs as transformers' model scores its tokenizer's rows."""
    transformers = pytest.importorskip("transformers")
    from bertkit.sentence import CrossEncoder

    ref_model = transformers.AutoModelForSequenceClassification.from_pretrained(tiny_pair_classifier).eval()
    rng = random.Random(0)
    words = "the cat sat on a mat Hello WORLD café naïve 東京 don't 3.14 ! ? unaffable".split()

    def text() -> str:
        return " ".join(rng.choice(words) for _ in range(rng.randint(0, 8)))

    base = tmp_path / "base"
    shutil.copytree(tiny_pair_classifier, base)
    config = json.loads((base / "tokenizer_config.json").read_text())
    del config["model_input_names"]
    (base / "tokenizer_config.json").write_text(json.dumps(config))
    variants = [None, NO_TYPES, ["input_ids", "token_type_ids", "attention_mask"],
                ["input_ids", "attention_mask", "token_type_ids"]]
    for k, names in enumerate(variants):
        path = _with_names(base, tmp_path / f"v{k}", names) if names else base
        tok, ref = BertTokenizer.from_pretrained(path), transformers.AutoTokenizer.from_pretrained(path)
        for _ in range(40):
            kw = {"padding": True} if rng.random() < 0.5 else {}
            if rng.random() < 0.3:
                kw["return_token_type_ids"] = rng.choice([True, False])
            shape = rng.randrange(4)
            args = [(text(),), (text(), text() or "x"), ([text() for _ in range(3)],),
                    ([text() for _ in range(3)], [text() for _ in range(3)])][shape]
            assert dict(tok(*args, **kw)) == dict(ref(*args, **kw)), (names, args, kw)
        pairs = [(text() or "x", text() or "y") for _ in range(rng.randint(1, 6))]
        with torch.no_grad():
            want = ref_model(**ref([a for a, _ in pairs], [b for _, b in pairs], padding=True,
                                   return_tensors="pt")).logits[:, 0].numpy()
        got = CrossEncoder(str(path), device="cpu", activation_fn=torch.nn.Identity()).predict(pairs)
        np.testing.assert_allclose(got, want, atol=1e-5, err_msg=str((names, pairs)))


def test_sentence_transformer_encodes_and_trains_without_token_type_ids(tiny_pair_classifier, tmp_path,
                                                                        monkeypatch) -> None:
    """Before: KeyError 'token_type_ids' in encode and in fit's examples, where sentence-transformers feeds none."""
    monkeypatch.chdir(tmp_path)  # fit's default checkpoint_path is checkpoints/model under the working directory
    import bertkit.sentence as S
    from bertkit.sentence import losses

    model = S.SentenceTransformer(str(tiny_pair_classifier), device="cpu")
    texts = [a for a, _ in PAIRS]
    with torch.no_grad():
        enc = model.tokenize(texts)
        assert "token_type_ids" not in enc
        out = model.bert(enc["input_ids"], enc["attention_mask"]).last_hidden_state
        mask = enc["attention_mask"][..., None].float()
        want = (out * mask).sum(1) / mask.sum(1)  # mean pooling, the directory's default
    np.testing.assert_allclose(model.encode(texts), want.numpy(), atol=1e-5)
    rows = [S.InputExample(texts=[a, b]) for a, b in PAIRS]
    model.fit([(torch.utils.data.DataLoader(rows, batch_size=2), losses.MultipleNegativesRankingLoss(model))],
              epochs=1, show_progress_bar=False, output_path=str(tmp_path / "out"))


def test_int8_calibration_batches_feed_one_segment(tiny_pair_classifier) -> None:
    """Before: KeyError 'token_type_ids' calibrating on pairs with such a tokenizer."""
    from bertkit.quantization.calibration import calibration_batches

    tok = BertTokenizer.from_pretrained(tiny_pair_classifier)
    (batch,) = calibration_batches(tok, PAIRS)
    assert batch["token_type_ids"].shape == batch["input_ids"].shape and not batch["token_type_ids"].any()


def test_model_input_names_edited_in_place_is_one_tokenizers(minilm_dir) -> None:
    """The list is the tokenizer's own: removing a name from one tokenizer's left the class's list (every other
    tokenizer's) edited too."""
    one, other = BertTokenizer.from_pretrained(minilm_dir), BertTokenizer.from_pretrained(minilm_dir)
    one.model_input_names.remove("token_type_ids")
    assert "token_type_ids" not in one("a", "b")
    assert other("a", "b")["token_type_ids"] == [0, 0, 0, 1, 1]
    assert BertTokenizer.model_input_names == ["input_ids", "token_type_ids", "attention_mask"]
