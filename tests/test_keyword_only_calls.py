"""Calls whose later arguments bertkit takes by keyword only, where the reference library takes them by position
too: one positional argument more than bertkit takes is refused naming what the reference reads it as and to pass
it by keyword (Python's bare TypeError "takes 6 positional arguments but 7 were given" named neither), each
enumerated from the reference's own signature; and the tokenizer call's keywords bertkit does not implement
(text_target, text_pair_target, split_special_tokens), refused naming the keyword and what to do."""

from __future__ import annotations

import inspect
import warnings

import pytest

from bertkit.errors import BertkitError

st = pytest.importorskip("sentence_transformers")
transformers = pytest.importorskip("transformers")

# (bertkit's module, reference's module, name)
SENTENCE_CALLS = [("bertkit.sentence", "sentence_transformers", n) for n in (
    "SentenceTransformerTrainingArguments", "SentenceTransformerTrainer", "mine_hard_negatives",
    "SparseEncoderTrainingArguments", "SparseEncoderTrainer")] + [
    ("bertkit.sentence.cross_encoder", "sentence_transformers.cross_encoder", n)
    for n in ("CrossEncoderTrainingArguments", "CrossEncoderTrainer")]


def _positional(fn) -> list[str]:
    params = inspect.signature(fn).parameters.values()
    return [p.name for p in params if p.name != "self" and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


@pytest.mark.parametrize("names", SENTENCE_CALLS, ids=lambda n: n[2])
def test_one_positional_argument_too_many_is_named_as_sentence_transformers_reads_it(names, tmp_path):
    import importlib

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        ours, ref = (getattr(importlib.import_module(m), names[2]) for m in names[:2])
    theirs = _positional(ref.__init__ if inspect.isclass(ref) else ref)
    taken = len(_positional(ours.__init__ if inspect.isclass(ours) else ours))
    assert taken < len(theirs)  # still keyword-only here: else the test has nothing to check
    args = [str(tmp_path)] + [None] * taken  # output_dir first for the training arguments
    with pytest.raises(BertkitError, match=rf"takes {taken} argument\(s\) by position .*reads the others as "
                                           rf"{theirs[taken]} \('None'\): pass it by keyword \({theirs[taken]}=\.\.\.\)"):
        ours(*args)


@pytest.fixture(scope="module")
def tokenizers(minilm_dir):
    from bertkit.tokenization.auto import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(minilm_dir)), transformers.AutoTokenizer.from_pretrained(str(minilm_dir))


def test_tokenizer_call_keywords_and_positions_are_named_with_the_fix(tokenizers):
    ours, ref = tokenizers
    theirs = _positional(type(ref).__call__)
    with pytest.raises(BertkitError, match=rf"reads the others as {theirs[2]} \('c'\): pass it by keyword "
                                           rf"\({theirs[2]}=\.\.\.\)"):
        ours("a", "b", "c")
    for name in ("text_target", "text_pair_target"):
        with pytest.raises(BertkitError, match=rf"tok\(\.\.\., {name}=\.\.\.\) is not implemented in bertkit: .*"
                                               r"second call, tok\(targets\)"):
            ours("a", **{name: "b"})
    with pytest.raises(BertkitError, match=r"split_special_tokens=True\) is not implemented in bertkit: .*"
                                           r"tokenize such text with transformers"):
        ours("a [MASK]", split_special_tokens=True)
    with pytest.raises(BertkitError, match=r"tok\(\.\.\., paddding=\.\.\.\) is not an argument"):
        ours("a", paddding=True)
    # the calls both take are unchanged: transformers' ids, its defaults given explicitly too
    for call in (lambda t: t("a [MASK] b", "c d"), lambda t: t("a [MASK]", split_special_tokens=False,
                                                               text_target=None, text_pair_target=None)):
        assert dict(call(ours)) == dict(call(ref))
