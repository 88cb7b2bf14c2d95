"""Tokenizer directories as users' checkpoints hold them, read by bertkit and by transformers 5: the same ids, or a
refusal naming the file, the value and the fix.

Each case is a file transformers 5 reads otherwise than its name suggests: special_tokens_map.json and
added_tokens.json beside a config with added_tokens_decoder (not read), tokenizer.json's padding and truncation
blocks (their direction is the tokenizer's side), its WordPiece model's unk_token (not read), vocab.txt's lines (read
by the tokenizers library: whitespace at a line's end dropped, lines split at "\\n" only), a null model_max_length.
"""

from __future__ import annotations

import json
import shutil

import pytest

from bertkit.tokenization import AutoTokenizer, load_vocab

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

# The minilm checkpoint's added_tokens_decoder, as transformers 4.34 and later save it
DECODER = {str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
                    "special": True} for i, t in ((0, "[PAD]"), (100, "[UNK]"), (101, "[CLS]"), (102, "[SEP]"),
                                                  (103, "[MASK]"))}


def _directory(minilm_dir, out, files, config=None, tokenizer_json=None):
    """``out`` holding minilm's ``files`` (tokenizer_config.json too), ``config`` merged into its config and
    ``tokenizer_json`` into its tokenizer.json."""
    out.mkdir(exist_ok=True)
    for name in files:
        shutil.copy(minilm_dir / name, out / name)
    if tokenizer_json is not None:
        data = json.loads((minilm_dir / "tokenizer.json").read_text(encoding="utf-8"))
        (out / "tokenizer.json").write_text(json.dumps({**data, **tokenizer_json}), encoding="utf-8")
    base = json.loads((minilm_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    (out / "tokenizer_config.json").write_text(json.dumps({**base, **(config or {})}), encoding="utf-8")
    return out


def _both(path, texts, **call):
    """(bertkit's rows, transformers') for ``texts`` from the directory ``path``."""
    ours = dict(AutoTokenizer.from_pretrained(path)(texts, **call))
    theirs = dict(transformers.AutoTokenizer.from_pretrained(str(path))(texts, **call))
    return ours, theirs


@pytest.mark.parametrize("line", ["hello ", "hello\t", "hello\r", "hello\u3000", "hello\u00a0 "])
def test_vocab_txt_lines_are_read_as_transformers_5_reads_them(minilm_dir, tmp_path, line):
    """transformers 5 reads vocab.txt with the tokenizers library, which drops the whitespace that ends a line
    (Rust's trim_end) and splits lines at "\\n" only. bertkit kept it (Python's rstrip("\\n"), transformers 4's
    load_vocab): a line "hello " (id 7592) gave "hello world" [101, 3109, 2080, 2088, 102] where transformers gives
    [101, 7592, 2088, 102]; a lone "\\r" inside a line made two lines of it, shifting every later id by one."""
    path = _directory(minilm_dir, tmp_path / "tok", [])
    words = (minilm_dir / "vocab.txt").read_text(encoding="utf-8").split("\n")[:-1]
    words[7592] = line
    words[7593] = "ab\rcd"  # one line ("ab\rcd"), as tokenizers reads it
    (path / "vocab.txt").write_bytes("\n".join(words).encode("utf-8"))  # no final newline
    ours, theirs = _both(path, "hello world [SEP] é")
    assert ours == theirs and ours["input_ids"] == [101, 7592, 2088, 102, 1041, 102]
    tokens = load_vocab(path / "vocab.txt")
    assert {t: i for i, t in enumerate(tokens)} == tokenizers.models.WordPiece.read_file(str(path / "vocab.txt"))
    assert tokens[7592:7594] == ["hello", "ab\rcd"] and len(tokens) == 30522
