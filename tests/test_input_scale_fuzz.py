"""Seeded generator of growing inputs (slow): files of many short or few long lines, in every format, with and
without a final newline, and Project Gutenberg books joined in one file, read whole and in order whatever their size;
a row's prediction is the same among 10 or 200 neighbours, in any order."""

from __future__ import annotations

import csv
import json
import os
import random
from pathlib import Path

import numpy as np
import pytest

from bertkit.data.text import iter_documents, plan_work_units
from bertkit.tasks.files import file_format, read_records

pytestmark = pytest.mark.slow
MODEL = Path(os.environ.get("BERTKIT_TEST_MODEL", "models/minilm"))
WORDS = ("the river rose at night and the town was quiet while a long train crossed the bridge over it slowly "
         "before dawn; no one saw what came after, though many said so later").split()


def _text(rng: random.Random, chars: int) -> str:
    out = []
    while sum(map(len, out)) + len(out) < chars:
        out.append(rng.choice(WORDS))
    return " ".join(out)[:chars].strip() or "x"


def _write(path: Path, texts: list[str], trailing_newline: bool) -> None:
    if path.suffix == ".jsonl":
        lines = [json.dumps({"text": t}) for t in texts]
    elif path.suffix == ".txt":
        lines = texts
    else:
        with open(path, "w", encoding="utf-8", newline="") as f:
            writer = csv.writer(f, delimiter="\t" if path.suffix == ".tsv" else ",", quoting=csv.QUOTE_MINIMAL,
                                lineterminator="\n")
            writer.writerow(["text"])
            writer.writerows([t.replace(";", "")] for t in texts)  # a TSV field holds no tab, quote or newline here
        if not trailing_newline:
            path.write_bytes(path.read_bytes()[:-1])
        return
    path.write_text("\n".join(lines) + ("\n" if trailing_newline else ""), encoding="utf-8")


def test_files_of_growing_size_are_read_whole_and_in_order(tmp_path):
    rng = random.Random(20261130)
    for trial in range(60):
        shape = rng.choice(["many short", "few long", "mixed"])
        base = rng.choice([3, 10, 40])
        n = base * rng.choice([1, 10, 100])
        chars = {"many short": (1, 40), "few long": (400, 2000), "mixed": (1, 2000)}[shape]
        texts = [_text(rng, rng.randint(*chars)) for _ in range(n if shape != "few long" else max(1, n // 20))]
        texts = [t.replace(";", "") for t in texts]
        path = tmp_path / f"in{trial}.{rng.choice(['txt', 'jsonl', 'csv', 'tsv'])}"
        _write(path, texts, trailing_newline=rng.random() < 0.5)
        limit = 2500  # each line fits; the file is up to 1,500 times larger
        read = [r if isinstance(r, str) else r["text"] for _, r in read_records(path, file_format(path), limit)]
        assert read == texts, (trial, path.name, len(texts), path.stat().st_size)


def _book(rng: random.Random, title: str) -> tuple[str, list[str]]:
    paragraphs = [" ".join(_text(rng, rng.randint(20, 300)).capitalize() + "." for _ in range(rng.randint(1, 3)))
                  for _ in range(rng.randint(1, 60))]
    head = "".join(f"Licence line {i} of {title}, read it.\n" for i in range(rng.randint(0, 30)))
    tail = "".join(f"Licence term {i}: you may copy it.\n\n" for i in range(rng.randint(0, 30)))
    return (f"{head}\n*** START OF THE PROJECT GUTENBERG EBOOK {title} ***\n\n" + "\n\n".join(paragraphs)
            + f"\n\n*** END OF THE PROJECT GUTENBERG EBOOK {title} ***\n\n{tail}"), paragraphs


def test_gutenberg_books_joined_are_read_as_each_alone_whatever_the_units(tmp_path):
    rng = random.Random(7)
    for trial in range(40):
        books = [_book(rng, f"BOOK {trial}-{k}") for k in range(rng.randint(1, 5))]
        alone = []
        for k, (text, _) in enumerate(books):
            (tmp_path / f"{trial}-{k}.txt").write_text(text, encoding="utf-8")
            alone += list(iter_documents(tmp_path / f"{trial}-{k}.txt", "prose"))
        joined = tmp_path / f"{trial}.txt"
        joined.write_text("".join(text for text, _ in books), encoding="utf-8")
        assert list(iter_documents(joined, "prose")) == alone, trial
        sentences = [s for d in alone for s in d]
        assert not any("Licence" in s for s in sentences)
        # cuts inside books and inside the licences between them; not inside the first header (under 1,300 bytes
        # here): a unit that ends before the first START line cannot know that its lines are a licence
        unit_bytes = rng.choice([2000, 5000, 20000, 4 << 20])
        parts = [p for u in plan_work_units([joined], "prose", unit_bytes) for p in u.parts]
        assert [s for p in parts for d in iter_documents(p.path, "prose", start=p.start, end=p.end)
                for s in d] == sentences, (trial, unit_bytes)


@pytest.mark.skipif(not (MODEL / "config.json").is_file(), reason=f"no checkpoint at {MODEL}")
def test_a_rows_prediction_does_not_depend_on_its_neighbours(tmp_path):
    import torch

    from bertkit.cli import main

    torch.set_num_threads(1)
    rng = random.Random(3)
    base = [_text(rng, rng.randint(1, 600)) for _ in range(10)]
    others = [_text(rng, rng.randint(1, 600)) for _ in range(190)]
    every = base + others
    order = list(range(len(every)))
    rng.shuffle(order)

    def predict(texts: list[str], name: str) -> list[list[float]]:
        path = tmp_path / f"{name}.txt"
        _write(path, texts, trailing_newline=name == "alone")
        out = tmp_path / f"{name}.jsonl"
        assert main(["predict", "sentence-embedding", "--model", str(MODEL), "--input", str(path), "--output-file",
                     str(out), "--no-progress", "--batch-size", "16"]) in (0, None)
        return [json.loads(line)["embedding"] for line in out.read_text(encoding="utf-8").splitlines()]

    alone = np.asarray(predict(base, "alone"))
    among = np.asarray(predict([every[i] for i in order], "among"))
    at = {i: k for k, i in enumerate(order)}
    np.testing.assert_allclose(among[[at[i] for i in range(10)]], alone, atol=2e-6, rtol=0)
