"""create_pretraining_data on real text: masking and NSP statistics, whole-word masking,
determinism across seeds and worker counts, dynamic masking, the reader and collate, error cases.

Real text: a few files of the shared corpus (skipped when absent); tokenizer: the vocabulary in
$BERTKIT_TEST_MODEL or models/minilm (skipped when absent).
"""

from __future__ import annotations

import os
import pickle
import random
from pathlib import Path

import numpy as np
import pytest

from bertkit.data import PretrainingDataset, collate_pretraining, create_pretraining_data
from bertkit.data.config import PretrainingConfig
from bertkit.data.pairs import create_instances_from_document
from bertkit.data.shards import read_manifest
from bertkit.data.text import iter_documents, plan_work_units, split_sentences
from bertkit.manifests import sha256_of
from bertkit.tokenization import BertTokenizer
from bertkit.tokenization.trainer import train_wordpiece_vocab

ROOT = Path(__file__).resolve().parents[1]
CORPUS = Path("/work/shared/data/corpus")
MODEL = Path(os.environ.get("BERTKIT_TEST_MODEL", ROOT / "models" / "minilm"))

needs_corpus = pytest.mark.skipif(not (CORPUS / "wikipedia").is_dir(), reason="shared corpus not present")
needs_model = pytest.mark.skipif(not (MODEL / "vocab.txt").is_file(), reason=f"no vocab.txt in {MODEL}")


def wiki_files(n: int, skip: int = 0) -> list[Path]:
    return sorted((CORPUS / "wikipedia").glob("*.md"))[skip : skip + n]


@pytest.fixture(scope="module")
def tok() -> BertTokenizer:
    if not (MODEL / "vocab.txt").is_file():
        pytest.skip(f"no vocab.txt in {MODEL}")
    return BertTokenizer.from_pretrained(MODEL)


@pytest.fixture(scope="module")
def static_dir(tok, tmp_path_factory) -> Path:
    """~3 MB of Wikipedia + Alice in Wonderland, static masking, dupe_factor 2: ~10k instances."""
    if not (CORPUS / "wikipedia").is_dir():
        pytest.skip("shared corpus not present")
    out = tmp_path_factory.mktemp("static")
    files = wiki_files(90) + [CORPUS / "gutenberg" / "11-0.txt"]
    create_pretraining_data(files, tok, out, dupe_factor=2, seed=1, num_workers=0, progress=False,
                            unit_bytes=1_000_000)
    return out


def originals(item: dict) -> np.ndarray:
    """The unmasked ids of a dataset item (labels hold the originals at masked positions)."""
    ids = item["input_ids"].copy()
    masked = item["labels"] != -100
    ids[masked] = item["labels"][masked]
    return ids


# --------------------------------------------------------------------------------------------------
# Statistics of the stored instances
# --------------------------------------------------------------------------------------------------


@needs_corpus
@needs_model
def test_masking_and_nsp_statistics(static_dir, tok):
    ds = PretrainingDataset(static_dir)
    assert len(ds) > 8000
    cls, sep, mask = tok.cls_token_id, tok.sep_token_id, tok.mask_token_id
    maskable = predicted = as_mask = kept = 0
    positives = 0
    for i in range(len(ds)):
        item = ds[i]
        ids, labels, types = item["input_ids"], item["labels"], item["token_type_ids"]
        n = len(ids)
        assert 5 <= n <= 128
        b = int(np.argmax(types))  # first segment-B position
        assert ids[0] == cls and ids[b - 1] == sep and ids[-1] == sep
        assert (types[:b] == 0).all() and (types[b:] == 1).all()
        # Special tokens are never predicted (and appear nowhere else).
        assert labels[0] == labels[b - 1] == labels[-1] == -100
        assert np.flatnonzero(np.isin(originals(item), [cls, sep])).tolist() == [0, b - 1, n - 1]
        where = labels != -100
        assert 1 <= where.sum() <= 20
        maskable += n - 3
        predicted += int(where.sum())
        as_mask += int((ids[where] == mask).sum())
        kept += int((ids[where] == labels[where]).sum())
        positives += int(item["next_sentence_label"] == 0)
    rate = predicted / maskable
    assert 0.145 <= rate <= 0.155, rate
    assert abs(as_mask / predicted - 0.8) <= 0.015
    assert abs(kept / predicted - 0.1) <= 0.015  # (a random replacement can hit the same id: ~1/30,000)
    assert abs((predicted - as_mask - kept) / predicted - 0.1) <= 0.015
    assert abs(positives / len(ds) - 0.5) <= 0.02
    manifest = read_manifest(static_dir)
    assert manifest["counts"]["instances"] == len(ds)
    assert manifest["counts"]["random_next"] == len(ds) - positives


@needs_corpus
@needs_model
def test_whole_word_masking_never_splits_a_word(tok, tmp_path):
    out = tmp_path / "wwm"
    create_pretraining_data(wiki_files(12), tok, out, dupe_factor=1, whole_word_mask=True, seed=3,
                            num_workers=0, progress=False)
    ds = PretrainingDataset(out)
    is_cont = np.array([t.startswith("##") for t in tok.convert_ids_to_tokens(list(range(len(tok))))])
    words_with_pieces = predicted = maskable = 0
    for i in range(len(ds)):
        item = ds[i]
        ids, where = originals(item), item["labels"] != -100
        b = int(np.argmax(item["token_type_ids"]))
        special = np.zeros(len(ids), dtype=bool)
        special[[0, b - 1, len(ids) - 1]] = True
        starts = ~is_cont[ids] | np.roll(special, 1)
        word = np.cumsum(starts)
        for w in np.unique(word[where]):
            members = (word == w) & ~special
            assert where[members].all(), (i, w)  # a masked word is masked whole
            words_with_pieces += members.sum() > 1
        predicted += where.sum()
        maskable += len(ids) - 3
    assert words_with_pieces > 100
    assert 0.14 <= predicted / maskable <= 0.155  # skipping words that overshoot lowers it a little


def test_special_tokens_written_in_the_text_are_text(tmp_path):
    """A "[SEP]" or "[MASK]" in the corpus is "[", "sep", "]" as google's tokenizer reads it: special ids stand only
    where the layout puts them ([CLS] A [SEP] B [SEP]) and are never masked-LM targets."""
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "[", "]", ".", "sep", "mask", "cls", "pad", "unk", "a", "b"]
    tok = BertTokenizer({t: i for i, t in enumerate(words)})
    corpus = tmp_path / "c.txt"
    corpus.write_text("a [SEP] b.\nb [MASK] a [CLS].\na[PAD]b [UNK].\n\nb a.\na b [SEP].\n")
    create_pretraining_data([corpus], tok, tmp_path / "out", dupe_factor=20, masked_lm_prob=0.5, input_format="sentences",
                            num_workers=0, progress=False)
    ds = PretrainingDataset(tmp_path / "out")
    seen = np.zeros(len(words), dtype=int)
    for i in range(len(ds)):
        item = ds[i]
        ids, b = originals(item), int(np.argmax(item["token_type_ids"]))
        assert np.flatnonzero(ids <= 4).tolist() == [0, b - 1, len(ids) - 1], tok.convert_ids_to_tokens(ids.tolist())
        seen += np.bincount(ids, minlength=len(words))
    assert seen[[5, 6, 8, 9, 10, 11, 12]].min() > 0  # "[", "]", "sep", "mask", "cls", "pad", "unk"


# --------------------------------------------------------------------------------------------------
# Next-sentence negatives
# --------------------------------------------------------------------------------------------------


@needs_corpus
@needs_model
def test_random_negatives_come_from_other_documents(tok):
    documents = [[ids for ids in tok([*d], add_special_tokens=False)["input_ids"] if ids]
                 for f in wiki_files(6) for d in iter_documents(f)]
    rng = random.Random(1)
    config = PretrainingConfig()
    negatives = [inst for d in range(len(documents))
                 for inst in create_instances_from_document(documents, d, config, rng) if inst.is_random_next]
    assert len(negatives) > 100
    assert all(inst.b_span[0] != inst.a_span[0] for inst in negatives)


# --------------------------------------------------------------------------------------------------
# Determinism, dynamic masking, reader
# --------------------------------------------------------------------------------------------------


def file_bytes(d: Path) -> dict[str, bytes]:
    """The data files (not bertkit's bookkeeping: its lock and the manifest that names the run)."""
    return {p.name: p.read_bytes() for p in sorted(d.iterdir()) if not p.name.startswith(".bertkit-")}


@needs_corpus
@needs_model
def test_same_seed_same_bytes_any_worker_count(tok, tmp_path):
    files = wiki_files(6, skip=100)  # 142 KB
    kwargs = dict(dupe_factor=1, progress=False, unit_bytes=30_000)
    assert len(plan_work_units(files, unit_bytes=30_000)) >= 3
    a = create_pretraining_data(files, tok, tmp_path / "a", seed=7, num_workers=0, **kwargs)
    create_pretraining_data(files, tok, tmp_path / "b", seed=7, num_workers=2, **kwargs)
    create_pretraining_data(files, tok, tmp_path / "c", seed=8, num_workers=0, **kwargs)
    same, other = file_bytes(tmp_path / "a"), file_bytes(tmp_path / "b")
    assert len(same) == 2 + 7 * len(a["shards"]) and same == other
    different = file_bytes(tmp_path / "c")
    assert different.keys() == same.keys()
    assert different["vocab.txt"] == same["vocab.txt"]
    assert all(different[k] != same[k] for k in same if k.endswith("input_ids.npy"))
    entries = [e for shard in a["shards"] for e in shard["files"].values()]  # the manifest's sha256 of each file
    assert all(sha256_of(tmp_path / "a" / e["file"]) == e["sha256"] for e in entries)


@needs_corpus
@needs_model
def test_dynamic_masking(tok, tmp_path):
    out = tmp_path / "dyn"
    create_pretraining_data(wiki_files(12), tok, out, dupe_factor=1, masking="dynamic", seed=5,
                            num_workers=0, progress=False)
    assert not list(out.glob("*masked*"))
    e0, e0_again = PretrainingDataset(out, epoch=0), PretrainingDataset(out, epoch=0)
    e1 = PretrainingDataset(out, epoch=1)
    assert len(e0) > 300
    differ = predicted = maskable = 0
    for i in range(len(e0)):
        x, y, z = e0[i], e0_again[i], e1[i]
        assert all(np.array_equal(x[k], y[k]) for k in x)  # same (seed, epoch, index): same masks
        assert np.array_equal(originals(x), originals(z))  # same instance underneath
        differ += not np.array_equal(x["labels"], z["labels"])
        predicted += (x["labels"] != -100).sum()
        maskable += len(x["input_ids"]) - 3
    assert differ >= 0.95 * len(e0)
    assert 0.145 <= predicted / maskable <= 0.16
    e0.set_epoch(1)
    assert np.array_equal(e0[3]["labels"], e1[3]["labels"])
    other_seed = PretrainingDataset(out, epoch=0, seed=6)
    assert not np.array_equal(other_seed[3]["labels"], e0_again[3]["labels"])


@needs_corpus
@needs_model
def test_collate_pads(static_dir, tok):
    ds = PretrainingDataset(static_dir)
    items = [ds[i] for i in range(16)]
    batch = collate_pretraining(items, pad_id=tok.pad_token_id)
    width = max(len(x["input_ids"]) for x in items)
    assert batch["input_ids"].shape == (16, width) and batch["next_sentence_label"].shape == (16,)
    for row, item in enumerate(items):
        n = len(item["input_ids"])
        assert batch["input_ids"][row, :n].tolist() == item["input_ids"].tolist()
        assert (batch["input_ids"][row, n:] == tok.pad_token_id).all()
        assert batch["attention_mask"][row].sum() == n
        assert (batch["labels"][row, n:] == -100).all() and (batch["token_type_ids"][row, n:] == 0).all()
    assert ds.max_seq_length == 128 and ds.path == static_dir
    # A spawned DataLoader worker gets a pickled dataset: it re-opens the memory maps, copying nothing.
    blob = pickle.dumps(ds)
    assert len(blob) < 2_000_000 and all(np.array_equal(pickle.loads(blob)[7][k], ds[7][k]) for k in ds[7])


# --------------------------------------------------------------------------------------------------
# Text reading
# --------------------------------------------------------------------------------------------------


def test_sentence_splitter_rules():
    text = ('Mr. Smith paid $3.50 for it, i.e. too much. "Stop!" he said. J. R. R. Tolkien was born '
            'in the U.S. Army? It was No. 4 in the list... Then it ended, etc. The end.')
    assert split_sentences(text) == [
        "Mr. Smith paid $3.50 for it, i.e. too much.",
        '"Stop!" he said.',
        "J. R. R. Tolkien was born in the U.S. Army?",
        "It was No. 4 in the list...",
        "Then it ended, etc.",
        "The end.",
    ]
    assert split_sentences("“Why?” asked Dr. Watson. (He knew.) 12 men came.") == [
        "“Why?” asked Dr. Watson.", "(He knew.)", "12 men came."
    ]


@needs_corpus
def test_corpus_clean_up():
    book = list(iter_documents(CORPUS / "gutenberg" / "11-0.txt"))
    assert len(book) == 1  # one book, one document
    text = " ".join(book[0])
    assert "Project Gutenberg" not in text and "Alice" in text
    assert book[0][-1].endswith("happy summer days.")
    article = " ".join(s for f in wiki_files(20) for d in iter_documents(f) for s in d)
    assert "[1]" not in article and "References" not in article and "|-" not in article
    wikitext = list(iter_documents(CORPUS / "wikitext-2" / "wiki.valid.raw"))
    assert len(wikitext) == 60  # one document per " = Title = " heading
    assert wikitext[0][0].startswith("Homarus gammarus , known as the European lobster")
    assert not any(s.startswith("= =") for d in wikitext for s in d)


def test_work_units_cut_large_files_at_document_boundaries(tmp_path):
    docs = [[f"Document {d} sentence {s} of {'many words ' * (d % 7)}here." for s in range(1 + d % 5)]
            for d in range(300)]
    big = tmp_path / "big.txt"
    big.write_text("\n\n".join("\n".join(doc) for doc in docs) + "\n", encoding="utf-8")
    small = tmp_path / "small.txt"
    small.write_text("Tiny one.\nTiny two.\n", encoding="utf-8")
    units = plan_work_units([big, small], input_format="sentences", unit_bytes=4000)
    parts = [part for unit in units for part in unit.parts]
    assert len(units) >= 5 and all(len(u.parts) >= 2 for u in units)
    assert [(p.start, p.end) for p in parts if p.path == str(big)][0][0] == 0
    assert all(a.end == b.start for a, b in zip(parts, parts[1:]) if a.path == b.path)
    read = [doc for p in parts for doc in iter_documents(p.path, p.input_format, start=p.start, end=p.end)]
    assert read == docs + [["Tiny one.", "Tiny two."]]  # every document once, none cut


# --------------------------------------------------------------------------------------------------
# Errors a user can cause
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("input_format", ["sentences", "prose", "auto"])
def test_lines_ending_in_a_carriage_return_alone_are_refused_before_any_work(tmp_path, input_format):
    """Was: read as one line, so one document of one sentence (google's reader too, its words glued at each \\r)."""
    path = tmp_path / "mac.txt"
    path.write_bytes(b"First sentence here.\rSecond one here.\r\rA second document.\rWith two lines.\r")
    with pytest.raises(ValueError, match=r"mac\.txt: a carriage return .* \(classic Mac OS\) would be "
                                         r"read as one line"):
        plan_work_units([path], input_format=input_format)
    path.write_bytes(path.read_bytes().replace(b"\r", b"\r\n"))  # CRLF line ends are line ends
    (unit,) = plan_work_units([path], input_format="sentences")
    assert [d for p in unit.parts for d in iter_documents(p.path, p.input_format, start=p.start, end=p.end)] == [
        ["First sentence here.", "Second one here."], ["A second document.", "With two lines."]]


@needs_model
def test_errors(tok, tmp_path):
    good = tmp_path / "good.txt"
    good.write_text("One sentence here.\nAnother one here.\n\nA second document.\nWith two lines.\n")
    kwargs = dict(num_workers=0, progress=False, input_format="sentences")

    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"Fine sentence.\nBad \xe9 byte.\n\nMore text.\nAnd more.\n")
    with pytest.raises(ValueError, match=r"bad\.txt: line 2 \(byte offset 19\) is not valid UTF-8.*errors='replace'"):
        create_pretraining_data([bad], tok, tmp_path / "o1", **kwargs)
    assert not list((tmp_path / "o1").glob("shard-*"))  # nothing half-written is left
    summary = create_pretraining_data([bad], tok, tmp_path / "o2", errors="replace", **kwargs)
    assert summary["counts"]["documents"] == 2

    empty = tmp_path / "empty.txt"
    empty.write_text("")
    with pytest.raises(ValueError, match="corpus is empty"):
        create_pretraining_data([empty], tok, tmp_path / "o3", **kwargs)
    with pytest.raises(ValueError, match="no input files"):
        create_pretraining_data([], tok, tmp_path / "o3", **kwargs)
    headings = tmp_path / "headings.txt"
    headings.write_text("Early life\n\nCareer\n")
    with pytest.raises(ValueError, match="no text found"):
        create_pretraining_data([headings], tok, tmp_path / "o4", num_workers=0, progress=False)

    singles = tmp_path / "singles.txt"
    singles.write_text("Only one sentence.\n\nAnother lonely one.\n\nAnd a third.\n")
    with pytest.raises(ValueError, match="two or more sentences"):
        create_pretraining_data([singles], tok, tmp_path / "o5", **kwargs)

    # The tokenizer's own special tokens are used, whatever their names ("<mask>" here).
    other = BertTokenizer({t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "<mask>", "a"])},
                          mask_token="<mask>")
    create_pretraining_data([good], other, tmp_path / "o6", dupe_factor=10, **kwargs)
    ds = PretrainingDataset(tmp_path / "o6")
    masked = np.concatenate([ds[i]["input_ids"][ds[i]["labels"] != -100] for i in range(len(ds))])
    assert 4 in masked and set(masked.tolist()) <= {1, 4, 5}  # [UNK] kept, <mask>, or "a" drawn at random

    with pytest.raises(ValueError, match="max_seq_length=4"):
        create_pretraining_data([good], tok, tmp_path / "o7", max_seq_length=4, **kwargs)
    with pytest.raises(FileNotFoundError, match="nope.txt"):
        create_pretraining_data([tmp_path / "nope.txt"], tok, tmp_path / "o8", **kwargs)

    create_pretraining_data([good], tok, tmp_path / "o9", **kwargs)
    with pytest.raises(ValueError, match="already holds the output of a `bertkit create-pretraining-data` run"):
        create_pretraining_data([good], tok, tmp_path / "o9", **kwargs)
    create_pretraining_data([good], tok, tmp_path / "o9", overwrite=True, **kwargs)
    assert len(PretrainingDataset(tmp_path / "o9")) > 0


@pytest.mark.parametrize("field, value, kind", [("whole_word_mask", "no", "a bool"), ("max_seq_length", 64.5, "an int"),
                                               ("dupe_factor", 2.5, "an int"), ("max_predictions_per_seq", 3.7, "an int"),
                                               ("masked_lm_prob", "0.2", "a number"), ("seed", True, "an int")])
def test_a_field_of_the_wrong_type_is_refused_before_anything_is_written(tmp_path, field, value, kind):
    """A truthy string would have masked whole words quietly, 3.7 predictions masked 1 to 3.7 tokens, and a float
    length or dupe factor failed in the worker; each is named before any work."""
    corpus = tmp_path / "c.txt"
    corpus.write_text("One sentence here.\nAnother one here.\n")
    tok = BertTokenizer({t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "one"])})
    with pytest.raises(ValueError, match=rf"^{field} must be {kind}, got {value!r} \({type(value).__name__}\)$"):
        create_pretraining_data([corpus], tok, tmp_path / "out", **{field: value}, num_workers=0, progress=False)
    assert not (tmp_path / "out").exists()
    assert PretrainingConfig(max_seq_length=64, masked_lm_prob=1 / 5, short_seq_prob=0).max_seq_length == 64


def test_a_lone_last_part_joins_the_last_work_unit(tmp_path):
    """Work units hold at least two file parts: a last part left on its own goes into the unit before it."""
    files = []
    for i in range(3):
        files.append(tmp_path / f"doc{i}.txt")
        files[-1].write_text(f"Sentence {i} one.\nSentence {i} two.\n")  # 34 bytes each
    units = plan_work_units(files, unit_bytes=60)
    assert len(units) == 1 and [p.path for p in units[0].parts] == [str(f) for f in files]


def test_overwrite_removes_only_shards_bertkit_owns(static_dir, tmp_path, capsys):
    """overwrite=True (--overwrite) replaces the shards of the earlier run its output directory's manifest records;
    shards without it are never removed on the word of the shards' own manifest.json."""
    import shutil
    import subprocess
    import sys

    from bertkit.cli import main

    copied = tmp_path / "copied"
    shutil.copytree(static_dir, copied, ignore=shutil.ignore_patterns(".bertkit-*"))  # shards, no run manifest
    before = {p.name: sha256_of(p) for p in copied.iterdir()}
    text = tmp_path / "text.txt"
    text.write_text("".join(f"Sentence {i} of a document here.\nAnother sentence {i} follows it.\n\n"
                            for i in range(40)))
    with pytest.raises(ValueError, match=r"holds \d+ file\(s\) bertkit did not write there"):
        create_pretraining_data([text], BertTokenizer.from_pretrained(MODEL), copied, overwrite=True,
                                num_workers=0, progress=False)
    assert {p.name: sha256_of(p) for p in copied.iterdir()} == before

    args = ["create-pretraining-data", str(text), "--vocab", str(MODEL / "vocab.txt"), "--output-dir",
            str(tmp_path / "cli"), "--no-progress"]
    subprocess.run([sys.executable, "-m", "bertkit", *args, "--dupe-factor", "1"], check=True,
                   capture_output=True)  # another process's run
    assert main([*args, "--dupe-factor", "2"]) == 2 and "--overwrite" in capsys.readouterr().err
    assert main([*args, "--dupe-factor", "2", "--overwrite"]) == 0
    assert read_manifest(tmp_path / "cli")["config"]["dupe_factor"] == 2


@needs_model
@pytest.mark.parametrize("compress, kind", [("gzip", "gzip"), ("bz2", "bzip2"), ("lzma", "xz")])
def test_a_compressed_file_is_refused_naming_how_to_decompress_it(tok, tmp_path, compress, kind):
    """Was: a .gz was refused as "not valid UTF-8 ... pass --errors replace", and with --errors replace (or ignore)
    its compressed bytes were read as text: 355 instances of noise ("[CLS]wyxш & ] [UNK]? 0cq < ) 8mh ...") from
    two gzip'd files, trained on without a word."""
    import importlib

    text = b"One sentence here.\nAnother one here.\n\nA second document.\nWith two lines.\n" * 20
    path = tmp_path / f"corpus.txt.{kind}"
    path.write_bytes(importlib.import_module(compress).compress(text))
    for errors in ("strict", "replace", "ignore"):
        with pytest.raises(ValueError, match=rf"corpus\.txt\.{kind} is {kind}-compressed, not text: decompress it "
                                             rf"first"):
            create_pretraining_data([path], tok, tmp_path / "out", num_workers=0, progress=False,
                                    input_format="sentences", errors=errors)
    assert not (tmp_path / "out").exists()
    with pytest.raises(ValueError, match=rf"corpus\.txt\.{kind} is {kind}-compressed"):
        train_wordpiece_vocab([str(path)], vocab_size=100, errors="replace", num_workers=0, progress=False)


# google-research/bert's sample_text.txt, in its layout: one sentence per line, a blank line between documents, the
# first line without a final stop (three documents, 10 + 8 + 12 lines there; fewer here).
GOOGLE_SAMPLE = """This text is included to make sure Unicode is handled properly: 力加勝北区ᴵᴺᵀᵃছজটডণত
Text should be one-sentence-per-line, with empty lines between documents.
This sample text is public domain and was randomly selected from Project Guttenberg.

The rain had only ceased with the gray streaks of morning at Blazing Star, and the settlement awoke to a moral sense.
Indeed, it was recorded in Blazing Star that a fortunate early riser had once picked up a chunk of gold quartz.
Nothing of this kind was found this morning.
But the mining camp was in a state of excitement.
There had been a shooting in the night.

Somewhere in the town a dog barked.
The stranger looked up from his coffee.
He did not know that the sheriff had been waiting for him since dawn.
"""


def test_auto_reads_googles_one_sentence_per_line_files_as_sentences(tmp_path):
    """Was: ``input_format="auto"`` read google's own layout (its sample_text.txt) as prose: one file, one document,
    so sample_text.txt's three documents became one (and its first line, without a final stop, was dropped: 28 of
    31 sentences), and every "random next" segment came from that same document (6 of 6 at dupe_factor 1)."""
    path = tmp_path / "sample_text.txt"
    path.write_text(GOOGLE_SAMPLE, encoding="utf-8")
    (unit,) = plan_work_units([path], input_format="auto")
    assert [p.input_format for p in unit.parts] == ["sentences"]
    docs = list(iter_documents(path, "auto"))
    assert [len(d) for d in docs] == [3, 5, 3] and docs[0][0].startswith("This text is included")
    assert docs == list(iter_documents(path, "sentences"))


@needs_corpus
def test_auto_reads_every_file_of_the_shared_corpus_as_before():
    """The sentence-per-line test of ``auto`` picks none of the shared corpus' prose (the closest, a play, pg1254.txt:
    74% of its lines are one sentence, against 90% for google's sample_text.txt)."""
    from bertkit.data.text import detect_format

    files = sorted(CORPUS.glob("*/*.txt")) + sorted(CORPUS.glob("*/*.md")) + sorted(CORPUS.glob("*/*.raw"))
    formats = [detect_format(f) for f in files]
    assert len(files) == 1021 and formats.count("sentences") == 0
    assert formats.count("wikitext") == 1  # wiki.valid.raw


@needs_model
def test_input_files_globs_directories_and_duplicates(tok, tmp_path):
    """google's --input_file takes glob patterns; bertkit refused them as missing files ("input file corpus/*.txt does
    not exist"), which a --config file (no shell to expand them) meets. A file given twice was read twice: its
    documents twice, so "random next" segments drawn from the twin were the true next text, labelled random."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for name in ("b.txt", "a.txt"):
        (corpus / name).write_text(f"First line of {name}.\nSecond line of {name}.\n\nOther document.\nIts end.\n")
    kwargs = dict(num_workers=0, progress=False, input_format="sentences", dupe_factor=1)
    made = create_pretraining_data([str(corpus / "*.txt")], tok, tmp_path / "o1", **kwargs)
    assert made["input_files"] == [str(corpus / "a.txt"), str(corpus / "b.txt")]  # sorted, as google's Glob
    assert made["counts"]["documents"] == 4
    with pytest.raises(FileNotFoundError, match=r"no file matches .*corpus/\*\.md"):
        create_pretraining_data([str(corpus / "*.md")], tok, tmp_path / "o2", **kwargs)
    with pytest.raises(FileNotFoundError, match=r"corpus is a directory: pass the files in it"):
        create_pretraining_data([corpus], tok, tmp_path / "o3", **kwargs)
    with pytest.raises(ValueError, match=r"a\.txt is given twice \(as .*corpus/a\.txt and .*corpus/\./a\.txt\)"):
        create_pretraining_data([corpus / "a.txt", corpus / "b.txt", f"{corpus}/./a.txt"], tok, tmp_path / "o4",
                                **kwargs)
    with pytest.raises(ValueError, match=r"a\.txt is given twice"):
        create_pretraining_data([str(corpus / "*.txt"), corpus / "a.txt"], tok, tmp_path / "o5", **kwargs)
    same = corpus / "b.txt"
    with pytest.raises(ValueError, match=r"b\.txt is given twice"):  # one path object twice, as a shell may pass it
        create_pretraining_data([same, same], tok, tmp_path / "o5", **kwargs)
    assert not any((tmp_path / f"o{i}").exists() for i in range(2, 6))
    # train-tokenizer reads its files the same way
    learned = train_wordpiece_vocab([str(corpus / "*.txt")], vocab_size=60, min_frequency=1, num_workers=0,
                                    progress=False)
    assert learned == train_wordpiece_vocab([corpus / "a.txt", corpus / "b.txt"], vocab_size=60, min_frequency=1,
                                            num_workers=0, progress=False)
    with pytest.raises(ValueError, match=r"a\.txt is given twice .*: its words would be counted twice"):
        train_wordpiece_vocab([corpus / "a.txt", corpus / "a.txt"], vocab_size=60, num_workers=0, progress=False)


@needs_model
@pytest.mark.parametrize("encoding, name", [("utf-16", "UTF-16"), ("utf-32", "UTF-32")])
def test_a_utf16_file_is_refused_naming_how_to_convert_it(tok, tmp_path, encoding, name):
    """Was: refused as "not valid UTF-8 ... pass --errors replace", which read google's sample (3 documents) as 1: each
    UTF-16 line break leaves a NUL on the next line, so no line was blank, and non-ASCII text came out as U+FFFD."""
    path = tmp_path / "notepad.txt"
    path.write_text(GOOGLE_SAMPLE, encoding=encoding)  # with its byte-order mark, as Windows Notepad saves "Unicode"
    for errors in ("strict", "replace"):
        with pytest.raises(ValueError, match=rf"notepad\.txt is {name} text, not UTF-8: convert it first \(iconv -f "
                                             rf"{name} -t UTF-8 "):
            create_pretraining_data([path], tok, tmp_path / "out", num_workers=0, progress=False,
                                    input_format="sentences", errors=errors)


@needs_model
def test_random_next_segments_drawn_from_their_own_document_are_counted_and_warned(tok, tmp_path, caplog):
    """Was silent: a file of one article per line (run_mlm's line_by_line layout; 150 Wikipedia articles, 1.95 MB) is
    one prose document, so all 2,067 "random next" segments came from that document, often the same article."""
    articles = [" ".join(f"Article {a} sentence {s} says something new." for s in range(12)) for a in range(30)]
    one = tmp_path / "one_per_line.txt"
    one.write_text("\n".join(articles) + "\n")
    kwargs = dict(num_workers=0, progress=False, dupe_factor=1)
    with caplog.at_level("WARNING", logger="bertkit"):
        made = create_pretraining_data([one], tok, tmp_path / "o1", **kwargs)
    counts = made["counts"]
    assert counts["documents"] == 1 and counts["random_next"] > 0
    assert counts["random_next_same_document"] == counts["random_next"]
    assert (f"{counts['random_next']} of the {counts['random_next']} random-next segments come from the document of "
            "their first segment") in caplog.text
    caplog.clear()
    two = tmp_path / "two.txt"
    two.write_text("\n\n".join(articles[:2]) + "\n")
    with caplog.at_level("WARNING", logger="bertkit"):
        made = create_pretraining_data([one, two], tok, tmp_path / "o2", **kwargs)  # two files, three documents
    assert made["counts"]["random_next_same_document"] == 0 < made["counts"]["random_next"]
    assert "random-next segments come from" not in caplog.text


@needs_model
def test_a_prediction_cap_below_the_masked_share_is_warned(tok, tmp_path, caplog):
    """Was silent: --max-seq-length 512 with the default --max-predictions-per-seq 20 (google's default too) masks 20
    tokens of a full 512-token instance, 3.9%, where masked_lm_prob 0.15 asks for 77. Here 64 tokens, a cap of 5: 10
    asked."""
    text = tmp_path / "doc.txt"
    text.write_text("\n\n".join(" ".join(f"Article {a} sentence {s} says something new and long enough." for s in
                                         range(40)) for a in range(3)) + "\n")
    kwargs = dict(num_workers=0, progress=False, dupe_factor=1, max_seq_length=64)
    with caplog.at_level("WARNING", logger="bertkit"):
        create_pretraining_data([text], tok, tmp_path / "capped", max_predictions_per_seq=5, **kwargs)
    assert ("max_predictions_per_seq 5 caps the masked-LM targets of a 64-token instance at 5 (7.8% of its tokens), "
            "below the 10 masked_lm_prob 0.15 asks for: pass --max-predictions-per-seq 10") in caplog.text
    ds = PretrainingDataset(tmp_path / "capped")
    full = [ds[i]["labels"] for i in range(len(ds)) if len(ds[i]["labels"]) == 64]
    assert full and all((labels != -100).sum() == 5 for labels in full)
    caplog.clear()
    with caplog.at_level("WARNING", logger="bertkit"):
        create_pretraining_data([text], tok, tmp_path / "enough", max_predictions_per_seq=10, **kwargs)
    assert "caps the masked-LM targets" not in caplog.text


@needs_model
def test_a_vocab_txt_without_a_tokenizer_config_takes_do_lower_case_on_the_command_line(tmp_path, capsys):
    """google's create_pretraining_data.py takes --do_lower_case with its checkpoints' vocab.txt, which says nothing of
    casing: `--vocab .../vocab.txt` was accepted, then refused for want of a do_lower_case no flag could give."""
    from bertkit.cli import main

    google = tmp_path / "uncased_L-2_H-128_A-2"
    google.mkdir()
    (google / "vocab.txt").write_bytes((MODEL / "vocab.txt").read_bytes())
    text = tmp_path / "docs.txt"
    text.write_text("The Cat sat.\nIt Purred loudly.\n\nParis is Big.\nIts streets are Long.\n")  # google's layout
    args = ["create-pretraining-data", str(text), "--vocab", str(google / "vocab.txt"), "--no-progress",
            "--num-workers", "1", "--input-format", "sentences"]
    assert main([*args, "--output-dir", str(tmp_path / "none")]) == 2
    assert "whether this checkpoint is cased is unknown" in capsys.readouterr().err
    for flag, lower in (("--do-lower-case", True), ("--no-do-lower-case", False)):
        assert main([*args, flag, "--output-dir", str(tmp_path / flag)]) == 0
        manifest = read_manifest(tmp_path / flag)
        assert manifest["tokenizer"]["do_lower_case"] is lower
        ids = PretrainingDataset(tmp_path / flag)[0]
        tokens = BertTokenizer.from_pretrained(MODEL).convert_ids_to_tokens(originals(ids).tolist())
        assert ("cat" in tokens) is lower and ("[UNK]" in tokens) is not lower  # the uncased vocabulary has no "Cat"
