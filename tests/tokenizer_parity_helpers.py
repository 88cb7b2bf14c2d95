"""The reference tokenizer of the parity tests (test_tokenizer_parity.py, test_fuzz.py) and what can be sent to it.

The reference must be built with the vocabulary passed as `vocab=` under transformers 5 (it silently ignores
`vocab_file=` there and keeps a 5-token vocabulary); `hf_reference` checks it loaded.
"""

from __future__ import annotations

from pathlib import Path

import pytest


def hf_reference(vocab_file: Path, do_lower_case: bool):
    """BertTokenizerFast really holding ``vocab_file`` (see the module docstring)."""
    import inspect

    transformers = pytest.importorskip("transformers", reason="transformers is the parity reference")
    with open(vocab_file, encoding="utf-8") as f:
        tokens = [line.rstrip("\n") for line in f]
    vocab = {t: i for i, t in enumerate(tokens)}
    cls = transformers.BertTokenizerFast
    if "vocab" in inspect.signature(cls.__init__).parameters:
        ref = cls(vocab=vocab, do_lower_case=do_lower_case)
    else:
        ref = cls(vocab_file=str(vocab_file), do_lower_case=do_lower_case)
    assert len(ref) == len(tokens) and ref.convert_tokens_to_ids("hello") == vocab["hello"]
    return ref


def sendable(text: str) -> bool:
    return not any(0xD800 <= ord(c) <= 0xDFFF for c in text)  # Rust strings cannot hold lone surrogates
