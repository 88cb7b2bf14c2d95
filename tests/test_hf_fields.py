"""transformers' save_pretrained keywords on bertkit's model and tokenizer, from transformers' live signatures."""

from __future__ import annotations

import pytest

import bertkit
from bertkit.errors import BertkitError

transformers = pytest.importorskip("transformers")


def _keywords(function) -> dict[str, object]:
    """transformers' keywords of ``function`` (its live signature) with their defaults, past the directory."""
    import inspect

    return {p.name: p.default for p in list(inspect.signature(function).parameters.values())[2:]
            if p.kind is p.POSITIONAL_OR_KEYWORD}


def test_save_pretrained_takes_each_transformers_keyword_at_its_default_and_refuses_others(tmp_path, minilm_dir):
    """model.save_pretrained(d, max_shard_size="10MB") (or is_main_process=False, state_dict=..., push_to_hub=True),
    tokenizer.save_pretrained(d, legacy_format=False): a bare TypeError, naming the keyword and no way on, and at
    transformers' own default too (a script passing its defaults through stopped). Now each keyword of transformers'
    live signature is taken at its default (the same files) and refused by name with what to do otherwise."""
    from bertkit.checkpoint_io import SAVE_OPTIONS as MODEL_OPTIONS
    from bertkit.tokenization.tokenizer import SAVE_OPTIONS as TOKENIZER_OPTIONS

    config = bertkit.BertConfig(vocab_size=99, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                                intermediate_size=16)
    model = bertkit.BertModel(config)
    tokenizer = bertkit.AutoTokenizer.from_pretrained(minilm_dir)
    for saver, reference, table in ((model.save_pretrained, transformers.BertModel.save_pretrained, MODEL_OPTIONS),
                                    (tokenizer.save_pretrained, transformers.BertTokenizerFast.save_pretrained,
                                     TOKENIZER_OPTIONS)):
        theirs = _keywords(reference)
        assert set(theirs) <= set(table), set(theirs) - set(table)
        assert all(table[k][0] == v for k, v in theirs.items()), {k: (table[k][0], v) for k, v in theirs.items()}
        plain = tmp_path / f"{type(saver.__self__).__name__}-plain"
        given = tmp_path / f"{type(saver.__self__).__name__}-defaults"
        saver(plain)
        saver(given, **theirs)
        assert {p.name: p.read_bytes() for p in given.iterdir()} == {p.name: p.read_bytes() for p in plain.iterdir()}
        for name, default in theirs.items():
            other = object() if default is None else (not default if isinstance(default, bool) else "10MB")
            with pytest.raises(BertkitError, match=rf"save_pretrained\({name}=.*\) is not implemented in bertkit "
                                                   rf"\(only {name}={default!r}, transformers' default\): \w+"):
                saver(tmp_path / "refused", **{name: other})
            assert not (tmp_path / "refused").exists()
        with pytest.raises(BertkitError, match="save_pretrained got an unknown argument 'safe_serialisation'"):
            saver(tmp_path / "refused", safe_serialisation=True)
