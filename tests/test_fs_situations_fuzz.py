"""Seeded draws of the file-system situations users put commands in: an output given relative, with spaces or
non-ASCII letters, a trailing slash, new parents, through a symlink (to a new directory, to the model, with ``..``
after it), equal to or inside the model or data directory, an existing directory or file of the user's, the
input file itself or a symlink to it; with or without --overwrite, once or twice.

Every draw: the model's and the data's files byte for byte as they were, each file of the user's kept, no
traceback (a refusal is one line), and an output that succeeded is where the system resolves the path given (what
``ls PATH`` lists), whole. The probe that wrote this ran about 130 draws over every writing command (plus
finetune and export onnx, too slow to keep here); it found output directories written beside a symlink given with
``..`` (``link/../out`` written as ``./out``) and output files named with a trailing slash written as files."""

from __future__ import annotations

import hashlib
import os
import random
from pathlib import Path

import pytest

from bertkit.cli import main

DIR_COMMANDS = ("quantize", "train-tokenizer", "create-pretraining-data")
FILE_COMMANDS = ("predict", "extract-features")
SITUATIONS = ("plain", "unicode", "trailing slash", "new parents", "symlink to new", "symlink to model", "model",
              "inside model", "data", "inside data", "user's directory", "user's file", "link/..", "input itself",
              "symlink to input")
TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "on", "mat", "a", "film", "dogs", "bark",
          ".", "it", "was", "good", "at", "night", "birds", "sing", "happy", "there"]


def _tree(directory: Path) -> dict[str, str]:
    return {str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.rglob("*")) if p.is_file() and not p.is_symlink()}


def _argv(command: str, out: str) -> list[str]:
    return {"quantize": ["quantize", "--model", "model", "--max-seq-length", "8"],
            "train-tokenizer": ["train-tokenizer", "data/corpus.txt", "--vocab-size", "40", "--no-progress",
                                "--num-workers", "1"],
            "create-pretraining-data": ["create-pretraining-data", "data/corpus.txt", "--vocab", "model",
                                        "--dupe-factor", "1", "--max-seq-length", "16", "--max-predictions-per-seq",
                                        "2", "--no-progress", "--num-workers", "1"],
            "predict": ["predict", "text-classification", "--model", "model", "--input", "data/texts.txt"],
            "extract-features": ["extract-features", "--model", "model", "--input", "data/texts.txt", "--layers=-1",
                                 "--max-seq-length", "8", "--no-progress"]}[command] + ["--out", out]


def _situation(work: Path, command: str, rng: random.Random) -> tuple[str, str, list[Path]]:
    """(the situation, the --out given, the user's files that must survive)."""
    is_dir = command in DIR_COMMANDS
    name = "out" if is_dir else rng.choice(["out.jsonl"] if command == "predict" else ["out.jsonl", "out.safetensors"])
    # the two situations an earlier version got wrong drawn twice as often
    kind = rng.choice((SITUATIONS if not is_dir else SITUATIONS[:-2]) + ("link/..", "trailing slash"))
    user: list[Path] = []
    if kind in ("symlink to new", "symlink to model", "link/.."):
        (work / "runs" / "latest").mkdir(parents=True)
    if kind in ("symlink to new", "symlink to model"):
        (work / "out").mkdir()
        (work / "out" / "notes.txt").write_text("the user's notes, named like the output")
        user.append(work / "out" / "notes.txt")
    if kind == "user's directory":
        (work / "mine").mkdir()
        for file in ("notes.txt", "config.json"):
            (work / "mine" / file).write_text(f"the user's {file}")
            user.append(work / "mine" / file)
    out = {"plain": name, "unicode": f"mý öut/{name}" if not is_dir else "mý öut", "trailing slash": f"{name}/",
           "new parents": f"a/b/{name}", "symlink to new": "lnk" if is_dir else f"lnk/{name}",
           "symlink to model": "lnk" if is_dir else f"lnk/{name}", "model": "model" if is_dir else f"model/{name}",
           "inside model": f"model/sub/{name}" if not is_dir else "model/sub", "data": "data" if is_dir else f"data/{name}",
           "inside data": "data/sub" if is_dir else f"data/sub/{name}",
           "user's directory": "mine" if is_dir else f"mine/{name}", "user's file": name, "link/..": f"lnk/../{name}",
           "input itself": "data/texts.txt", "symlink to input": name}[kind]
    if kind in ("symlink to new", "link/.."):
        (work / "lnk").symlink_to(work / "runs" / "latest")
    if kind == "symlink to model":
        (work / "lnk").symlink_to(work / "model")
    if kind == "symlink to input":
        (work / name).symlink_to(work / "data" / "texts.txt")
    if kind == "user's file":
        (work / name).write_text("the user's file")
        user.append(work / name)
    return kind, out, user


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(40))
def test_random_file_system_situations_lose_nothing_and_write_where_the_path_leads(seed, tmp_path, monkeypatch, capsys,
                                                                                  tiny_checkpoint):
    rng = random.Random(seed)
    command = rng.choice(DIR_COMMANDS + FILE_COMMANDS)
    work = tmp_path / "work"
    tiny_checkpoint(work / "model", "BertForSequenceClassification", labels=["neg", "pos"], tokenizer=TOKENS,
                    max_position_embeddings=32)
    (work / "data").mkdir()
    (work / "data" / "texts.txt").write_text("the cat sat on the mat\na good film\ndogs bark at night\n")
    (work / "data" / "corpus.txt").write_text("The cat sat on the mat. It was happy there.\nDogs bark at night. "
                                              "Birds sing.\n\n" * 20)
    monkeypatch.chdir(work)
    kind, out, user = _situation(work, command, rng)
    before = {d: _tree(work / d) for d in ("model", "data")}
    kept = {p: p.read_bytes() for p in user}
    overwrite = rng.random() < 0.5
    codes = []
    for run in range(rng.choice([1, 2])):
        argv = _argv(command, out) + (["--overwrite"] if overwrite or run else [])
        try:
            codes.append(main(argv))
        except SystemExit as e:  # argparse's usage error: one line too
            codes.append(e.code)
        err = capsys.readouterr().err
        assert "Traceback" not in err, (kind, out, err)
        if codes[-1]:
            assert err.strip().splitlines()[-1].startswith("bertkit "), (kind, out, err)
    where = f"{command} --out {out!r} ({kind}), exit codes {codes}"
    for d, files in before.items():  # nothing of the model or the data changed or removed (new files may be added)
        now = _tree(work / d)
        assert {k: now.get(k) for k in files} == files, where
    for path, data in kept.items():  # the file at the output's own name: replaced when --overwrite says so
        if not (kind == "user's file" and (overwrite or len(codes) == 2)):
            assert path.read_bytes() == data, where
    if kind == "trailing slash" and command in FILE_COMMANDS:
        assert codes[0] == 2, where  # a directory's name, not a file's: refused, nothing written
    if codes[-1] == 0:  # written where the system resolves the path given
        assert os.path.isdir(out) if command in DIR_COMMANDS else os.path.isfile(out), where
        if command == "train-tokenizer":
            assert (Path(out) / "vocab.txt").is_file(), where
        if kind == "link/..":  # runs/out, beside where lnk leads; not ./out, which shortening the text gives
            assert (work / "runs" / Path(out).name).exists() and not (work / Path(out).name).exists(), where
