"""A saved model carried between bertkit, transformers and sentence-transformers, each loading the directory the
previous one saved and saving it again: nothing the directory held is lost, left stale or changed.

The first tests are the cases the generator at the end found; the generator (slow) draws chains of such hops."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import bertkit
from bertkit.sentence import SentenceTransformer

transformers = pytest.importorskip("transformers")

TINY = dict(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
            max_position_embeddings=64)
TEXTS = ["A man is eating food.", "Ünïcödé accents and CJK 漢字 too", "hi"]


def _sharded(minilm_dir: Path, out: Path, head: str = "BertForSequenceClassification") -> Path:
    """A tiny checkpoint transformers saved in 1 MB shards (four of them), with MiniLM's tokenizer."""
    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    getattr(transformers, head)(transformers.BertConfig(**TINY)).save_pretrained(out, max_shard_size="1MB")
    transformers.AutoTokenizer.from_pretrained(str(minilm_dir)).save_pretrained(out)
    assert len(list(out.glob("model-0000*-of-0000*.safetensors"))) > 1
    return out


def test_a_save_over_a_sharded_checkpoint_replaces_its_shards(minilm_dir, tmp_path):
    """Loaded, changed and saved in place, a sharded checkpoint is one model.safetensors: the index and the shards it
    lists go (they were left beside it: a stale copy of the old weights, which a loader reading the index first would
    take), a user's file stays, and both libraries load the new weights."""
    d = _sharded(minilm_dir, tmp_path / "ckpt")
    (d / "notes.txt").write_text("mine")
    model = bertkit.BertForSequenceClassification.from_pretrained(d)
    with torch.no_grad():
        model.classifier.weight.add_(1.0)
    model.save_pretrained(d)
    assert sorted(p.name for p in d.iterdir()) == ["config.json", "model.safetensors", "notes.txt", "tokenizer.json",
                                                   "tokenizer_config.json"]
    ids = torch.tensor([[101, 7592, 2088, 102]])
    with torch.no_grad():
        want = model(ids).logits
        torch.testing.assert_close(bertkit.BertForSequenceClassification.from_pretrained(d)(ids).logits, want)
        theirs = transformers.BertForSequenceClassification.from_pretrained(d).eval()
        torch.testing.assert_close(theirs(ids).logits, want, atol=1e-5, rtol=1e-5)


def test_a_sentence_save_over_a_sharded_checkpoint_replaces_its_shards(minilm_dir, tmp_path):
    """The same through SentenceTransformer.save, whose encoder is written inside its staged directory: no shard of
    the old weights is left, and sentence-transformers reads the vectors bertkit gives."""
    st = pytest.importorskip("sentence_transformers")
    d = _sharded(minilm_dir, tmp_path / "ckpt", head="BertModel")
    index = json.loads((d / "model.safetensors.index.json").read_text())
    model = SentenceTransformer(d)
    with torch.no_grad():
        model.bert.embeddings.word_embeddings.weight.mul_(1.5)
    model.save(d)
    names = {p.name for p in d.iterdir()}
    assert "model.safetensors" in names
    assert not names & ({"model.safetensors.index.json"} | set(index["weight_map"].values()))
    np.testing.assert_allclose(st.SentenceTransformer(str(d), device="cpu").encode(TEXTS), model.encode(TEXTS),
                               atol=2e-5)


def test_an_index_that_lists_other_files_keeps_them(minilm_dir, tmp_path):
    """An index whose shards are not plain names beside it proves nothing: it and every file stay."""
    d = _sharded(minilm_dir, tmp_path / "ckpt")
    index = d / "model.safetensors.index.json"
    data = json.loads(index.read_text())
    data["weight_map"]["extra.weight"] = "../elsewhere.safetensors"
    index.write_text(json.dumps(data))
    before = sorted(p.name for p in d.iterdir())
    # bertkit's loader refuses such an index; the save writes a model read from elsewhere
    torch.manual_seed(0)
    bertkit.BertForSequenceClassification(bertkit.BertConfig(**TINY)).save_pretrained(d)
    assert sorted(p.name for p in d.iterdir()) == sorted(before + ["model.safetensors"])


def test_tokens_added_special_are_read_by_transformers_as_its_own_save_gives_them(minilm_dir, tmp_path):
    """A token added with add_tokens(..., special_tokens=True) is special in tokenizer.json alone: transformers lists
    it nowhere, so its masked-LM collator may mask it. bertkit's save listed it in additional_special_tokens, and
    transformers reading that directory took it as declared: get_special_tokens_mask marked it 1 and the collator never
    masked it (labels -100 where the directory transformers saved gives 30522). A token declared with
    add_special_tokens stays listed; bertkit itself reads either save to the same ids and special tokens, listed as
    transformers lists them."""
    transformers.logging.set_verbosity_error()
    ref = transformers.BertTokenizerFast.from_pretrained(str(minilm_dir))
    ref.add_tokens(["<ent>"], special_tokens=True)
    ref.add_special_tokens({"additional_special_tokens": ["[Q]"]})
    ref.add_tokens(["covid19"])
    ref.save_pretrained(tmp_path / "hf")
    ours = bertkit.AutoTokenizer.from_pretrained(tmp_path / "hf")
    ours.save_pretrained(tmp_path / "bk")
    theirs = {name: transformers.AutoTokenizer.from_pretrained(tmp_path / name) for name in ("hf", "bk")}
    text = "<ent> covid19 [Q] x <ent>"
    ids = theirs["hf"](text)["input_ids"]
    collated = {}
    for name, tok in theirs.items():
        assert tok(text)["input_ids"] == ids
        assert sorted(tok.all_special_tokens) == sorted(theirs["hf"].all_special_tokens), name
        assert tok.get_special_tokens_mask(ids, already_has_special_tokens=True) == [1, 0, 0, 1, 0, 0, 1]
        collator = transformers.DataCollatorForLanguageModeling(tok, mlm_probability=1.0, seed=0)
        collated[name] = collator([{"input_ids": ids}])["labels"].tolist()
    assert collated["bk"] == collated["hf"] == [[-100, 30522, 30524, -100, 1060, 30522, -100]]
    again = bertkit.AutoTokenizer.from_pretrained(tmp_path / "bk")
    assert again(text)["input_ids"] == ours(text)["input_ids"] == ids
    assert again.all_special_tokens == ours.all_special_tokens
    # as transformers lists them: the declared one, not the one special by its flag alone (docs/tokenizer.md)
    assert sorted(ours.all_special_tokens) == sorted(theirs["hf"].all_special_tokens)
    assert "[Q]" in ours.all_special_tokens and ours.unlisted_special_tokens == ["<ent>"]


def test_a_transformers_save_after_bertkits_reads_back_what_it_saved(minilm_dir, tmp_path):
    """bertkit's save wrote special_tokens_map.json and added_tokens.json, transformers 4's files, which transformers
    5 reads beside its own tokenizer_config.json and no longer writes: after a bertkit hop, a transformers save that
    set pad_token "[unused1]" (id 2) read back "[PAD]" (id 0) in both libraries, the stale map overriding it. bertkit
    writes them only where the directory holds them already (MiniLM's own, here rewritten, not left stale)."""
    transformers.logging.set_verbosity_error()
    ref = transformers.BertTokenizerFast.from_pretrained(str(minilm_dir))
    ref.add_tokens(["covid19"])
    ref.save_pretrained(tmp_path / "d")
    bertkit.AutoTokenizer.from_pretrained(tmp_path / "d").save_pretrained(tmp_path / "d")
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == ["tokenizer.json", "tokenizer_config.json",
                                                                   "vocab.txt"]
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path / "d")
    theirs.add_special_tokens({"pad_token": "[unused1]"})
    theirs.add_tokens(["newword"])
    theirs.save_pretrained(tmp_path / "d")
    batch = ["covid19 newword", "a b c d"]
    want = theirs(batch, padding=True)["input_ids"]
    assert want[0][-1] == 2
    for tok in (transformers.AutoTokenizer.from_pretrained(tmp_path / "d"),
                bertkit.AutoTokenizer.from_pretrained(tmp_path / "d")):
        assert (tok.pad_token, tok.pad_token_id) == ("[unused1]", 2)
        assert tok(batch, padding=True)["input_ids"] == want
    # a directory holding transformers 4's files (MiniLM's) gets them rewritten: none is left to decide the ids
    old = tmp_path / "old"
    for name in ("vocab.txt", "tokenizer_config.json", "special_tokens_map.json"):
        (old / name).parent.mkdir(exist_ok=True)
        (old / name).write_bytes((minilm_dir / name).read_bytes())
    mine = bertkit.AutoTokenizer.from_pretrained(old)
    mine.add_special_tokens({"pad_token": "[unused1]"})
    mine.save_pretrained(old)
    assert json.loads((old / "special_tokens_map.json").read_text())["pad_token"] == "[unused1]"
    assert transformers.AutoTokenizer.from_pretrained(old).pad_token_id == 2


# ---------------------------------------------------------------------------------------------------
# The generator: seeded chains of hops between bertkit and transformers
# ---------------------------------------------------------------------------------------------------

HEADS = ["BertModel", "BertForSequenceClassification", "BertForTokenClassification", "BertForMaskedLM"]
HOP_TEXTS = ["<ent> covid19 [Q] x <ent>", "Ünïcödé café 漢字 naïve", "A longer text " * 30]


def _start(rng, minilm_dir: Path, out: Path) -> str:
    """A tiny checkpoint transformers saves: a random head, tokens added plain, special and declared, a
    model_max_length, shards or one file."""
    tok = transformers.BertTokenizerFast.from_pretrained(str(minilm_dir), model_max_length=rng.choice([16, 64, 512]))
    words = rng.sample(["<ent>", "covid19", "naïve", "[Q]"], rng.randint(0, 3))
    for word in words:
        kind = rng.choice(["plain", "special", "declared"])
        if kind == "declared":
            tok.add_special_tokens({"additional_special_tokens": [word]}, replace_extra_special_tokens=False)
        else:
            tok.add_tokens([word], special_tokens=kind == "special")
    head = rng.choice(HEADS)
    torch.manual_seed(rng.randrange(1000))
    model = getattr(transformers, head)(transformers.BertConfig(**{**TINY, "vocab_size": len(tok)}))
    model.save_pretrained(out, **({"max_shard_size": "1MB"} if rng.random() < 0.5 else {}))
    tok.save_pretrained(out)
    return head


def _hop(rng, lib: str, head: str, src: Path, dst: Path):
    """Load ``src`` with ``lib``, maybe change the weights (as training would) and, with transformers, the pad token,
    save to ``dst``: (the model saved, the tokenizer saved)."""
    module = transformers if lib == "hf" else bertkit
    model = getattr(module, head).from_pretrained(src)
    tok = (transformers.AutoTokenizer if lib == "hf" else bertkit.AutoTokenizer).from_pretrained(src)
    if rng.random() < 0.6:
        with torch.no_grad():
            model.get_input_embeddings().weight[: rng.randint(100, 5000)].mul_(1.25)
    if lib == "hf" and rng.random() < 0.7:
        tok.add_special_tokens({"pad_token": rng.choice(["[unused1]", "[unused2]"])})
    model.save_pretrained(dst)
    tok.save_pretrained(dst)
    return model.eval(), tok


def _read(tok) -> dict:
    """What a tokenizer gives that the hops must keep: ids, padded ids, its special tokens and their mask."""
    ids = [tok(t, truncation=True)["input_ids"] for t in HOP_TEXTS]
    return {"ids": ids, "padded": tok(HOP_TEXTS[:2], padding=True)["input_ids"],
            "pad": (tok.pad_token, tok.pad_token_id), "special": sorted(tok.all_special_tokens),
            "mask": [tok.get_special_tokens_mask(i, already_has_special_tokens=True) for i in ids]}


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(6))
def test_seeded_chains_of_hops_keep_weights_tokens_and_files(minilm_dir, tmp_path, seed):
    """2-4 hops, each transformers or bertkit loading the last directory (in place or into a new one) and saving it,
    the weights changed in some, the pad token in some of transformers': after every hop both libraries load the
    weights just saved (the saver's outputs within 1e-5), no index of older shards is left beside them, transformers
    reads the tokenizer as its last save left it (ids, padding, special tokens and their mask, which its masked-LM
    collator reads: a bertkit hop changes none of them), and bertkit with the same ids and padding."""
    import random

    transformers.logging.set_verbosity_error()
    rng = random.Random(seed)
    src = tmp_path / "h0"
    head = _start(rng, minilm_dir, src)
    start_tok = transformers.AutoTokenizer.from_pretrained(src)
    want = _read(start_tok)  # as transformers reads the directory: changed by its own hops only
    for i in range(1, rng.randint(2, 4) + 1):
        lib = rng.choice(["hf", "bk", "bk"])
        dst = src if rng.random() < 0.5 else tmp_path / f"h{i}"
        saved, tok = _hop(rng, lib, head, src, dst)
        if lib == "hf":
            want = _read(tok)
        step = f"seed {seed} hop {i} ({lib}, {'in place' if dst == src else 'new directory'})"
        batch = start_tok(HOP_TEXTS[:2], padding=True, return_tensors="pt")
        mask = batch["attention_mask"].bool()

        def real(out, mask=mask):  # per-token outputs at the real tokens (bertkit's padding holds zeros)
            return out[0][mask] if out[0].dim() == 3 else out[0]

        with torch.no_grad():
            expected = real(saved(**batch))
            for module in (transformers, bertkit):
                got = real(getattr(module, head).from_pretrained(dst).eval()(**batch))
                torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5, msg=f"{step}: {module.__name__} loads")
        if (dst / "model.safetensors").is_file():
            assert not (dst / "model.safetensors.index.json").is_file() or lib == "hf", step
        assert _read(transformers.AutoTokenizer.from_pretrained(dst)) == want, step
        ours = _read(bertkit.AutoTokenizer.from_pretrained(dst))
        assert (ours["ids"], ours["padded"], ours["pad"]) == (want["ids"], want["padded"], want["pad"]), step
        src = dst
