"""A compressed file given where text or records are read is refused by every reader in the same words, naming its
format and the command that decompresses it (as create-pretraining-data and train-tokenizer always did)."""

from __future__ import annotations

import bz2
import gzip

import pytest

from bertkit.cli import main


@pytest.mark.parametrize("kind", ["gzip", "bzip2"])
@pytest.mark.parametrize("command", ["predict", "extract-features", "finetune classify", "quantize"])
def test_a_compressed_input_is_named_as_compressed_not_as_a_stray_byte(tmp_path, monkeypatch, capsys, tiny_checkpoint,
                                                                       command, kind):
    """Was: predict and extract-features read a gzip file as text and stopped at its first bytes ("a carriage return
    (\\r) inside the first line ... classic Mac OS"), a bzip2 one as "a NUL byte ... most likely a binary file (or
    one in UTF-16)"; quantize's --calibration-file said "is not UTF-8 text ... save it as UTF-8": each the wrong
    fix."""
    monkeypatch.chdir(tmp_path)
    tiny_checkpoint(tmp_path / "model", "BertForSequenceClassification", labels=["neg", "pos"],
                    tokenizer=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "film"])
    name = {"predict": "texts.jsonl", "extract-features": "texts.txt", "finetune classify": "train.csv",
            "quantize": "calibration.txt"}[command]
    text = {"texts.jsonl": '{"text": "a film"}\n', "train.csv": "text,label\na film,pos\nfilm,neg\n"}.get(name, "a film\n")
    (tmp_path / name).write_bytes((gzip.compress if kind == "gzip" else bz2.compress)(text.encode()))
    (tmp_path / "dev.csv").write_text("text,label\na film,pos\n")
    argv = {"predict": ["predict", "text-classification", "--model", "model", "--input", name, "--out", "p.jsonl"],
            "extract-features": ["extract-features", "--model", "model", "--input", name, "--out", "f.jsonl"],
            "finetune classify": ["finetune", "classify", "--model", "model", "--train-file", name,
                                  "--validation-file", "dev.csv", "--out", "run", "--no-progress"],
            "quantize": ["quantize", "--model", "model", "--calibration-file", name, "--out", "int8"]}[command]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    tool, stem, ext = "gunzip" if kind == "gzip" else "bunzip2", *name.rsplit(".", 1)
    assert err.endswith(f"{name} is {kind}-compressed, not text: decompress it first ({tool} -c {name} > "
                        f"{stem}-decompressed.{ext}) and pass the decompressed file"), err
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["model", name, "dev.csv"])
