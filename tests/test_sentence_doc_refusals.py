"""What docs/sentence.md says bertkit.sentence refuses by name, called as a sentence-transformers script calls it:
each call is refused with a BertkitError that names the argument or input and what to do instead, never Python's
TypeError about a missing or unexpected argument (CrossEncoder.predict(sentences=pairs) ended in "missing 1 required
positional argument: 'inputs'"). A seeded draw of the documented refusals, each with an unrelated valid argument
beside it or not, in a random order."""

from __future__ import annotations

import random

import pytest
import torch

from cross_encoder_helpers import cross_encoder_directory

pd = pytest.importorskip("pandas")

from bertkit.errors import BertkitError  # noqa: E402
from bertkit.sentence import SentenceTransformer, models  # noqa: E402
from bertkit.sentence.cross_encoder import CrossEncoder  # noqa: E402

PAIRS = [("Where is Paris?", "Paris is in France."), ("Who wrote it?", "Nobody knows.")]
FRAME = {"text": ["a", "b"]}


def _cases(ce: CrossEncoder, st: SentenceTransformer, ce_dir, st_dir, vocab_dir):
    """(what the doc names, the call, a piece of the message that says what to do instead)."""
    sigmoid = torch.nn.Sigmoid()
    return [
        # docs/sentence.md, Cross-encoders: "Refused by name, with what to do instead"
        *[(name, lambda name=name, value=value: CrossEncoder(ce_dir, **{name: value}), fix)
          for name, value, fix in (
              ("prompts", {"q": "q: "}, "put the text before the query yourself"),
              ("default_prompt_name", "q", "put the text before the query yourself"),
              ("cache_folder", "/tmp", "download the model first"),
              ("revision", "main", "check out the revision first"),
              ("token", "x", "download the model first"),
              ("trust_remote_code", True, "drop this argument"),
              ("backend", "onnx", "bertkit serve --quantize int8"),
              ("processor_kwargs", {"a": 1}, "use max_length="),
              ("tokenizer_kwargs", {"a": 1}, "use max_length="),
              ("config_kwargs", {"a": 1}, "use num_labels="),
              ("keep_in_fp32_modules", ["classifier"], "drop this argument"),
              ("default_activation_function", sigmoid, "pass activation_fn="),
              ("classifier_dropout", 0.2, "set classifier_dropout in config.json"),
              ("tokenizer_args", {"a": 1}, "use max_length="),
              ("automodel_args", {"a": 1}, "pass model_kwargs="),
              ("config_args", {"a": 1}, "use num_labels="),
              ("cache_dir", "/tmp", "download the model first"))],
        ("model_kwargs", lambda: CrossEncoder(ce_dir, model_kwargs={"low_cpu_mem_usage": True}), "drop the others"),
        *[(name, lambda name=name, value=value: ce.predict(PAIRS, **{name: value}), fix)
          for name, value, fix in (
              ("prompt", "q: ", "put the text before the query yourself"),
              ("prompt_name", "query", "put the text before the query yourself"),
              ("pool", {}, "call predict in one process"),
              ("chunk_size", 2, "call predict in one process"),
              ("activation_fct", sigmoid, "pass activation_fn="),
              ("num_workers", 2, "drop it"))],
        # the old keyword alone, as a sentence-transformers 5 script passes its pairs
        ("sentences", lambda: ce.predict(sentences=PAIRS), "pass the pairs first, predict(pairs)"),
        ("device", lambda: ce.predict(PAIRS, device=["cpu", "cpu"]), "on one device"),
        ("convert_to_numpy", lambda: ce.rank("q", ["a", "b"], convert_to_numpy=True), "drop it"),
        ("activation_fn", lambda: ce.predict(PAIRS, activation_fn="sigmoid"), "must be a callable"),
        ("DataFrame", lambda: ce.rank("q", pd.DataFrame(FRAME)), "pass a column"),
        # docs/sentence.md, embedders: Transformer arguments, encode's and tokenize's inputs
        ("transformer_task", lambda: models.Transformer(st_dir, transformer_task="fill-mask"), "SparseEncoder"),
        ("backend", lambda: models.Transformer(st_dir, backend="onnx"), "drop these arguments"),
        ("tokenizer_name_or_path", lambda: models.Transformer(st_dir, tokenizer_name_or_path=vocab_dir),
         "drop these arguments"),
        ("keys", lambda: st.encode({"text": "a", "label": 1}), "nothing else"),
        ("pair", lambda: st.encode([("a", "b")]), "score the pair with a CrossEncoder"),
        ("DataFrame", lambda: st.encode(pd.DataFrame(FRAME)), "pass a column"),
        ("str", lambda: st.tokenize("a lone str"), "pass [text] for one"),
        ("pool", lambda: st.encode(["a"], pool={}), "call encode() in one process"),
        ("device", lambda: st.encode(["a"], device=["cpu", "cpu"]), "call encode() in one process"),
    ]


@pytest.mark.slow
def test_each_documented_refusal_names_what_to_do(minilm_2_layers, tmp_path):
    ce_dir = cross_encoder_directory(minilm_2_layers, tmp_path / "ce")
    vocab_dir = tmp_path / "vocab"
    vocab_dir.mkdir()
    (vocab_dir / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "b"]) + "\n")
    ce, st = CrossEncoder(ce_dir), SentenceTransformer(minilm_2_layers)
    cases = _cases(ce, st, ce_dir, minilm_2_layers, vocab_dir)
    rng = random.Random(20261130)
    for name, call, fix in rng.sample(cases, len(cases)):
        with pytest.raises(BertkitError) as caught:
            call()
        message = str(caught.value)
        assert name in message and fix in message, (name, message)
