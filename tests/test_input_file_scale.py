"""Inputs as they grow: what a command reads of a file, and what it writes, must not depend on the file's size."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from bertkit.data.text import iter_documents, plan_work_units
from bertkit.errors import BertkitError
from bertkit.tasks.files import file_format, read_records


def _write(path, n):
    """``n`` short records in ``path``'s format (a header first for CSV/TSV), about 25 bytes each."""
    rows = [f"a short input number {i}" for i in range(n)]
    if path.suffix == ".jsonl":
        body = "".join(json.dumps({"text": r}) + "\n" for r in rows)
    else:
        body = ("text\n" if path.suffix in (".csv", ".tsv") else "") + "".join(r + "\n" for r in rows)
    path.write_text(body, encoding="utf-8")


@pytest.mark.parametrize("name", ["in.txt", "in.jsonl", "in.csv", "in.tsv"])
def test_the_line_limit_is_per_record_not_per_file(tmp_path, name):
    """A file larger in all than --max-line-bytes (1 MiB by default: any text or JSONL file of 30,000 short lines)
    is read whole; the limit bounds each line. The text and JSONL readers counted every line since the first against
    it, so `bertkit predict` refused such a file as one record "from line 1 to line 34,953 ... a quote left open?"."""
    path = tmp_path / name
    _write(path, 200)  # about 5,000 bytes: five times the limit below
    assert path.stat().st_size > 4 * 1000
    first = 2 if name.endswith(("csv", "tsv")) else 1  # after the header
    records = list(read_records(path, file_format(path), max_line_bytes=1000))
    assert [n for n, _ in records] == list(range(first, first + 200))
    assert [r if isinstance(r, str) else r["text"] for _, r in records] == [f"a short input number {i}"
                                                                            for i in range(200)]
    with open(path, "a", encoding="utf-8") as f:  # one line over the limit still is refused, by its number
        f.write(("x" * 1200 if name.endswith((".txt", ".csv", ".tsv")) else json.dumps("x" * 1200)) + "\n")
    with pytest.raises(BertkitError, match=rf"in\.\w+:{first + 200}: this line is longer than 1,000 bytes"):
        list(read_records(path, file_format(path), max_line_bytes=1000))


CORPUS = Path(os.environ.get("BERTKIT_DATA", "/work/shared/data")) / "corpus"


def _book(title: str, n: int) -> str:
    """A Project Gutenberg file as they are laid out: header, START, ``n`` paragraphs, END, licence."""
    body = "\n\n".join(f"In {title} paragraph {i} begins.\nIt is wrapped, and ends here." for i in range(n))
    return (f"The Project Gutenberg EBook of {title}\n\nYou may copy it under the terms of the licence.\n\n"
            f"*** START OF THIS PROJECT GUTENBERG EBOOK {title.upper()} ***\n\n{body}\n\n"
            f"End of Project Gutenberg's {title}\n\n*** END OF THIS PROJECT GUTENBERG EBOOK {title.upper()} ***\n\n"
            "Updated editions will replace the previous one.\n\nThe licence permits redistribution.\n")


def _sentences(path, unit_bytes=4 << 20):
    return [s for unit in plan_work_units([path], "prose", unit_bytes) for part in unit.parts
            for doc in iter_documents(part.path, part.input_format, start=part.start, end=part.end) for s in doc]


def test_gutenberg_books_joined_in_one_file_are_each_read(tmp_path):
    """`cat *.txt > books.txt` of three Project Gutenberg books: reading stopped at the first END marker, so
    create-pretraining-data made instances of the first book alone (a 3 MB slice of the shared books gave the very
    shards of its 0.3 MB first book), and how much was read changed with --unit-bytes (a later work unit read on,
    licences included). Each book is a document now, its licence dropped, wherever the units are cut."""
    books = [_book(t, n) for t, n in (("Alice", 40), ("Beowulf", 25), ("Candide", 30))]
    for i, b in enumerate(books):
        (tmp_path / f"{i}.txt").write_text(b, encoding="utf-8")
    joined = tmp_path / "books.txt"
    joined.write_text("".join(books), encoding="utf-8")
    alone = [list(iter_documents(tmp_path / f"{i}.txt", "prose")) for i in range(3)]
    assert [[len(d) for d in docs] for docs in alone] == [[80], [50], [60]]  # two sentences a paragraph
    assert list(iter_documents(joined, "prose")) == [d for docs in alone for d in docs]
    assert list(iter_documents(joined)) == [d for docs in alone for d in docs]  # "auto" reads it as prose
    every = [s for docs in alone for d in docs for s in d]
    assert not any("licence" in s or "Gutenberg" in s for s in every)
    for unit_bytes in range(200, 4000, 50):  # cuts inside books and inside the licences after them
        assert _sentences(joined, unit_bytes) == every, unit_bytes


@pytest.mark.skipif(not (CORPUS / "gutenberg").is_dir(), reason="shared corpus not present")
def test_shared_gutenberg_books_joined_read_as_each_alone(tmp_path):
    names = ["11-0.txt", "The-Dunwich-Horror.txt", "43-0.txt"]  # each with its START and END markers
    joined = tmp_path / "joined.txt"
    joined.write_bytes(b"".join((CORPUS / "gutenberg" / n).read_bytes() for n in names))
    alone = [d for n in names for d in iter_documents(CORPUS / "gutenberg" / n)]
    assert len(alone) == 3
    assert list(iter_documents(joined)) == alone


def test_a_safetensors_shard_is_held_once_while_it_is_written(tmp_path):
    """extract-features to .safetensors kept every work unit's states and then concatenated them into one tensor per
    layer: twice the shard's bytes at the peak (10,000 short lines, one layer: 814 MB against 684 MB now; 2 GB for
    the default 1 GB shards). Each layer's tensor is filled in place as units come (in a file, where a resumed run
    finds them), and the file is the same."""
    import tracemalloc

    import numpy as np

    from bertkit.feature_files import read_features, safetensors_meta, write_safetensors
    from bertkit.partial_output import PartialOutput

    layers, hidden, lines, width = [-1, -2, -3, -4], 64, 400, 40  # a 9 MB shard of 4 layers
    rng = np.random.default_rng(0)
    lengths = rng.integers(2, width, lines).tolist()
    encoded = [{"input_ids": [101] + [7] * (n - 2) + [102], "token_type_ids": [0] * n} for n in lengths]
    units = [[list(range(a, min(a + 64, lines))) for a in range(0, lines, 64)]]

    def states_of(p, u):  # a unit's states, made as the model makes them: new arrays for each unit
        return {i: np.stack([np.full((lengths[i], hidden), 1000 * i + k, np.float32) for k in range(len(layers))])
                for i in units[p][u]}

    out = tmp_path / "out.safetensors"
    shard_bytes = sum(lengths) * hidden * 4 * len(layers)
    tracemalloc.start()
    try:
        write_safetensors(PartialOutput(out, "extract-features", {}, resume=False, overwrite=False), [out],
                          [range(lines)], units, states_of, encoded, layers, np.dtype("float32"),
                          safetensors_meta(layers, "float32", hidden, width, "", False))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1.25 * shard_bytes, (peak, shard_bytes)  # the shard once, and a unit's states
    read = list(read_features(out))
    assert [r["line_index"] for r in read] == list(range(lines))
    for i in (0, 63, 64, 399):
        assert list(read[i]["layers"]) == layers
        assert [float(read[i]["layers"][name].min()) for name in layers] == [1000 * i + k for k in range(4)]
        assert [float(read[i]["layers"][name].max()) for name in layers] == [1000 * i + k for k in range(4)]
        assert read[i]["layers"][-1].shape == (lengths[i], hidden)


def test_extract_features_holds_its_encoded_lines_compactly(tmp_path, tiny_checkpoint, monkeypatch):
    """The token ids of every input line are held while extract-features runs (the shards are planned from their
    lengths): as a list of dicts of Python lists, 35 bytes a token (a 3 MB text file's 789,121 tokens: 28 MB; a
    100 MB corpus, about 1 GB, before any state is computed). Held as flat int32/int8 arrays, 5."""
    import tracemalloc

    from bertkit import BertModel, BertTokenizer
    from bertkit import features as fx

    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(900)]
    tok = BertTokenizer({t: i for i, t in enumerate(words)})
    model = BertModel.from_pretrained(tiny_checkpoint(tmp_path / "tiny", tokenizer=tok, num_hidden_layers=1))
    texts = [(" ".join(f"w{(i * 7 + k) % 900}" for k in range(100)), None) for i in range(1000)]
    held = {}

    def plan(out, encoded, *args):  # what the run holds from here on: measured, then stopped
        held["bytes"] = tracemalloc.get_traced_memory()[0] - held["before"]
        held["tokens"] = sum(len(e["input_ids"]) for e in encoded)
        raise KeyboardInterrupt

    fx.extract_features(model, tok, texts[:2], tmp_path / "warm.jsonl", layers=[-1], progress=False)  # imports
    [tok(a) for a, _ in texts]  # and the tokenizer's caches of these words, filled before the count
    monkeypatch.setattr(fx, "_plan_output", plan)
    tracemalloc.start()
    try:
        held["before"] = tracemalloc.get_traced_memory()[0]
        with pytest.raises(KeyboardInterrupt):
            fx.extract_features(model, tok, texts, tmp_path / "out.jsonl", layers=[-1], max_seq_length=128,
                                progress=False)
    finally:
        tracemalloc.stop()
    assert held["tokens"] == 1000 * 102
    assert held["bytes"] / held["tokens"] < 8, held  # lists: 20 here (the ids of 900 words, shared), 35 on real text
