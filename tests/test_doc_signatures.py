"""Every signature the documentation writes out matches the function it names.

A reader copies ``train_wordpiece_vocab(files, vocab_size=30522, ...)`` from the docs and trusts its defaults and
which arguments go by position. For each documented signature in ``SIGNATURES`` this finds the code span in the
named document (inline or in a fenced block, over several lines), parses its parameter list as Python's, and checks it
against ``inspect.signature`` of the function:

- each parameter written with a default exists, with that default, keyword-only exactly when the code's is;
- a parameter without a default whose name the code does not use is a placeholder (``path``) for the code's
  positional parameter in that place;
- a parameter written by position without a default is the code's parameter in that place, and the
  documented parameters come in the code's order;
- a list that does not end in ``...`` or ``**options`` names every parameter the code has.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_FENCE = re.compile(r"^\s*```[^\n]*\n(.*?)^\s*```", re.S | re.M)
_MISSING = object()


def _pretraining_parameters():
    """create_pretraining_data's own arguments with ``**config_fields`` spelt out as PretrainingConfig's fields."""
    from bertkit.data.config import PretrainingConfig
    from bertkit.data.pretraining import create_pretraining_data

    own = [
        p for p in inspect.signature(create_pretraining_data).parameters.values() if p.kind != p.VAR_KEYWORD
    ]
    fields = [
        inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default)
        for f in dataclasses.fields(PretrainingConfig)
    ]
    positional = [p for p in own if p.kind != p.KEYWORD_ONLY]
    return positional + fields + [p for p in own if p.kind == p.KEYWORD_ONLY]


def _code(dotted: str):
    """The object ``module:a.b.c`` names; ``a`` may be a submodule not imported yet (``cross_encoder.evaluation``)."""
    import importlib

    module, _, name = dotted.rpartition(":")
    obj = importlib.import_module(module)
    for part in name.split("."):
        if not hasattr(obj, part) and inspect.ismodule(obj):
            importlib.import_module(f"{obj.__name__}.{part}")
        obj = getattr(obj, part)
    return obj


def _trainer_keywords():
    """train_new_from_iterator's ``**trainer`` spelt out: the keywords it hands to train_new_tokenizer."""
    from bertkit.tokenization.trainer import train_new_tokenizer

    own = list(
        inspect.signature(
            _code("bertkit.tokenization:BertTokenizer.train_new_from_iterator")
        ).parameters.values()
    )
    extra = [
        p for p in inspect.signature(train_new_tokenizer).parameters.values() if p.kind == p.KEYWORD_ONLY
    ]
    return [p for p in own if p.name != "self" and p.kind != p.VAR_KEYWORD] + extra


# (document, how the signature starts in it, the function it documents, "module:qualified.name")
SIGNATURES = [
    (
        "pretraining-data.md",
        "train_wordpiece_vocab(files, vocab_size=30522, min_frequency=2, lowercase=True, *",
        "bertkit.tokenization.trainer:train_wordpiece_vocab",
    ),
    (
        "pretraining-data.md",
        "create_pretraining_data(input_files,",
        "bertkit.data.pretraining:create_pretraining_data",
    ),
    ("pretraining-data.md", "PretrainingDataset(dir,", "bertkit.data:PretrainingDataset.__init__"),
    ("pretraining-data.md", "collate_pretraining(batch, pad_id)", "bertkit.data:collate_pretraining"),
    ("inference.md", "bertkit.pipeline(task, model,", "bertkit:pipeline"),
    (
        "tokenizer.md",
        "tok = BertTokenizer(vocab_file_or_dict,",
        "bertkit.tokenization:BertTokenizer.__init__",
    ),
    ("tokenizer.md", "enc = tok(text_or_texts,", "bertkit.tokenization:BertTokenizer.__call__"),
    (
        "tokenizer.md",
        "tok.train_new_from_iterator(text_iterator,",
        "bertkit.tokenization:BertTokenizer.train_new_from_iterator",
    ),
    ("python.md", "compute_loss(model, inputs,", "bertkit:Trainer.compute_loss"),
    (
        "sentence.md",
        "SentenceTransformerTrainer(model, args,",
        "bertkit.sentence:SentenceTransformerTrainer.__init__",
    ),
    ("sentence.md", "CrossEncoder(path,", "bertkit.sentence.cross_encoder:CrossEncoder.__init__"),
    (
        "sentence.md",
        "CrossEncoderTrainer(model, args,",
        "bertkit.sentence.cross_encoder:CrossEncoderTrainer.__init__",
    ),
    (
        "sentence.md",
        "evaluation.CrossEncoderRerankingEvaluator(samples,",
        "bertkit.sentence.cross_encoder:evaluation.CrossEncoderRerankingEvaluator.__init__",
    ),
    (
        "sentence.md",
        "evaluation.CrossEncoderClassificationEvaluator(sentence_pairs,",
        "bertkit.sentence.cross_encoder:evaluation.CrossEncoderClassificationEvaluator.__init__",
    ),
    (
        "sentence.md",
        "evaluation.CrossEncoderCorrelationEvaluator(sentence_pairs,",
        "bertkit.sentence.cross_encoder:evaluation.CrossEncoderCorrelationEvaluator.__init__",
    ),
]


def _spans(text: str) -> list[str]:
    return [*_FENCE.findall(text), *re.findall(r"`([^`]+)`", _FENCE.sub("", text))]


def _documented(document: str, start: str) -> str:
    """The parameter list of the one signature in ``document`` that starts with ``start``."""
    found = []
    for span in _spans((ROOT / "docs" / document).read_text(encoding="utf-8")):
        text = " ".join(span.split())  # a span or a fenced call broken over lines
        i = text.find(start)
        if i < 0:
            continue
        i = text.index("(", i) + 1
        depth, j = 1, i
        while depth:
            depth += {"(": 1, ")": -1}.get(text[j], 0)
            j += 1
        found.append(text[i : j - 1])
    assert len(found) == 1, f"{document}: {len(found)} signatures start with {start!r}"
    return found[0]


def _parse(params: str) -> tuple[list[tuple[str, object, bool]], bool]:
    """[(name, default or _MISSING, keyword-only)] and whether the list is open (ends in ``...``/``**x``).

    The docs' notation: ``4 MiB`` is 4 << 20; ``a|b|c`` lists the values a parameter takes, the first its default;
    ``# ...`` comments (in a fenced signature) are dropped."""
    params = re.sub(r"#[^,]*?(?=\s+\w+=|$)", "", params)
    params = re.sub(r"(\d+) MiB", lambda m: str(int(m.group(1)) << 20), params)
    params = re.sub(r"=([^,|()]+)(?:\|[^,()]+)+", r"=\1", params)
    open_ = bool(re.search(r"(?:^|,)\s*(?:\.\.\.|\*\*\w+)\s*$", params))
    params = re.sub(r",\s*(?:\.\.\.|\*\*\w+)\s*$", "", params)
    fn = ast.parse(f"def f({params}): pass").body[0].args
    out = []
    defaults = [_MISSING] * (len(fn.args) - len(fn.defaults)) + list(fn.defaults)
    for arg, default in zip(fn.args, defaults):
        out.append((arg.arg, default if default is _MISSING else ast.literal_eval(default), False))
    for arg, default in zip(fn.kwonlyargs, fn.kw_defaults):
        out.append((arg.arg, _MISSING if default is None else ast.literal_eval(default), True))
    return out, open_


def _parameters(dotted: str) -> list[inspect.Parameter]:
    if dotted.endswith(":create_pretraining_data"):
        return _pretraining_parameters()
    if dotted.endswith(".train_new_from_iterator"):
        return _trainer_keywords()
    params = list(inspect.signature(_code(dotted)).parameters.values())
    return [p for p in params if p.name != "self" and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)]


@pytest.mark.parametrize("document,start,dotted", SIGNATURES, ids=[s[2].split(":")[1] for s in SIGNATURES])
def test_documented_signature_matches_the_code(document, start, dotted):
    documented, open_ = _parse(_documented(document, start))
    code = _parameters(dotted)
    by_name = {p.name: (i, p) for i, p in enumerate(code)}
    problems = []
    order = []
    for k, (name, default, keyword_only) in enumerate(documented):
        if default is _MISSING and not keyword_only and name not in by_name:
            if k >= len(code) or code[k].kind == code[k].KEYWORD_ONLY:  # a placeholder name: by position
                problems.append(f"{name!r}: the code has no positional parameter {k}")
            order.append(k)
            continue
        if name not in by_name:
            problems.append(f"{name!r}: no such parameter")
            continue
        i, p = by_name[name]
        order.append(i)
        if default is _MISSING and not keyword_only and i != k:  # written by position: a call passes it there
            problems.append(f"{name!r} is written as positional argument {k}; it is the code's {i}")
        if default is not _MISSING and p.default != default:
            problems.append(f"{name}={default!r}: the code's default is {p.default!r}")
        if keyword_only != (p.kind == p.KEYWORD_ONLY):
            problems.append(f"{name!r}: keyword-only is {p.kind == p.KEYWORD_ONLY} in the code")
    if order != sorted(order):
        problems.append(f"not in the code's order: {[code[i].name for i in order]}")
    if not open_:
        left_out = [p.name for i, p in enumerate(code) if i not in order]
        if left_out:
            problems.append(f"left out (end the list with ... if that is meant): {left_out}")
    assert not problems, f"docs/{document}: {start} ...\n" + "\n".join(problems)
