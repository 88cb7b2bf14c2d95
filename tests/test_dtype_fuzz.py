"""Randomized differential test of the places a user picks a dtype, against transformers 5 and sentence-transformers
6 at the same precision. Each seed draws one case:

- ``checkpoint``: a small random BertConfig and head, saved by transformers in float32, float16 or bfloat16, its
  config.json's ``dtype`` kept, dropped, renamed ``torch_dtype`` or contradicting the weights, the weights in
  safetensors, ``pytorch_model.bin`` or half of them in another type; loaded by both with ``dtype=`` /
  ``torch_dtype=`` (a dtype, its name, ``"auto"``, or nothing: bertkit's documented float32); then cast
  (``.half()``, ``.bfloat16()``, ``.double()``, ``.to(...)``) and saved by both. The model's dtype, its outputs'
  dtype and values (within the type's rounding), the saved files' tensor types and config.json ``dtype`` agree.
- ``sparse``: a SparseEncoder (a tiny masked-LM, max or sum pooling) cast to float16, bfloat16 or float64: its
  vectors' dtype and values, dense and sparse.
- ``quantize``: ``quantize_embeddings`` of float16/bfloat16/float32/float64 tensors, arrays and lists, with
  calibration embeddings or ranges in any of those types.
- ``cross``: a CrossEncoder (a tiny random classifier, 1 or 3 labels) loaded with ``model_kwargs`` dtypes or cast:
  its scores' dtype (float32 for half types, float64 for float64, float32 numpy always) and values.

Slow: ``BERTKIT_FUZZ_DTYPE`` seeds, 40 by default (about 40 s on 2 cores)."""

from __future__ import annotations

import json
import os
import random
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

import bertkit

transformers = pytest.importorskip("transformers", reason="the reference: pip install -e '.[test-references]'")
st = pytest.importorskip("sentence_transformers", reason="the reference: pip install -e '.[test-references]'")
pytestmark = pytest.mark.slow

SEEDS = int(os.environ.get("BERTKIT_FUZZ_DTYPE", "40"))
TYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# relative to the output's largest magnitude: one type's rounding through a layer or two
TOL = {torch.float32: 1e-4, torch.float16: 3e-2, torch.bfloat16: 2e-1, torch.float64: 1e-6}
HEADS = ["AutoModel", "AutoModelForSequenceClassification", "AutoModelForMaskedLM", "AutoModelForTokenClassification",
         "AutoModelForQuestionAnswering", "AutoModelForMultipleChoice", "AutoModelForPreTraining"]
CASTS = {"half": lambda m: m.half(), "bfloat16": lambda m: m.bfloat16(), "float": lambda m: m.float(),
         "double": lambda m: m.double(), "to": lambda m: m.to(torch.float16), "to_cpu": lambda m: m.to("cpu", torch.bfloat16)}


def _file_types(directory: Path) -> list[str]:
    from safetensors import safe_open

    with safe_open(str(directory / "model.safetensors"), "pt") as f:
        return sorted({str(f.get_slice(k).get_dtype()) for k in f.keys()})


def _forward(model, head: str, rng: random.Random, vocab: int):
    g = torch.Generator().manual_seed(rng.randrange(1 << 30))
    ids = torch.randint(0, vocab, (rng.choice([1, 3]), rng.choice([4, 9])), generator=g)
    mask = torch.ones_like(ids)
    if len(ids) > 1:
        mask[1, ids.shape[1] // 2:] = 0
    if head == "AutoModelForMultipleChoice":
        ids, mask = ids[:, None].expand(-1, 2, -1).clone(), mask[:, None].expand(-1, 2, -1).clone()
    return ids, mask


def _output(model, head: str, ids, mask) -> torch.Tensor:
    key = {"AutoModel": "last_hidden_state", "AutoModelForQuestionAnswering": "start_logits",
           "AutoModelForPreTraining": "prediction_logits"}.get(head, "logits")
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask)[key]
    if head in ("AutoModelForSequenceClassification", "AutoModelForMultipleChoice"):
        return out
    return out[mask.bool()]  # real tokens: padding positions are the documented difference


def _close(ours: torch.Tensor, ref: torch.Tensor, what: str) -> None:
    assert ours.dtype == ref.dtype, what
    scale = max(1.0, ref.float().abs().max().item())
    assert (ours.double() - ref.double()).abs().max().item() <= TOL[ref.dtype] * scale, what


def _checkpoint_case(rng: random.Random, root: Path) -> None:
    head = rng.choice(HEADS)
    config = transformers.BertConfig(vocab_size=rng.choice([50, 99]), hidden_size=rng.choice([16, 32]),
                                     num_hidden_layers=rng.choice([1, 2]), num_attention_heads=rng.choice([1, 2, 4]),
                                     intermediate_size=rng.choice([32, 64]), max_position_embeddings=32,
                                     num_labels=2 if head == "AutoModelForQuestionAnswering" else rng.choice([2, 3]))
    saved_as = rng.choice(list(TYPES))
    torch.manual_seed(rng.randrange(1 << 30))
    source = root / "source"
    getattr(transformers, head).from_config(config).to(TYPES[saved_as]).save_pretrained(source)
    stored = json.loads((source / "config.json").read_text())
    variant = rng.choice(["as saved", "no dtype", "torch_dtype", "contradicting"])
    if variant == "no dtype":
        stored.pop("dtype", None)
    elif variant == "torch_dtype":
        stored["torch_dtype"] = stored.pop("dtype", saved_as)
    elif variant == "contradicting":
        stored["dtype"] = rng.choice([t for t in TYPES if t != saved_as])
    (source / "config.json").write_text(json.dumps(stored))
    from safetensors.torch import load_file, save_file

    layout = rng.choice(["safetensors", "bin", "mixed"])
    if layout == "bin":
        weights = load_file(source / "model.safetensors")
        (source / "model.safetensors").unlink()
        torch.save(weights, source / "pytorch_model.bin")
    elif layout == "mixed":  # some tensors in another type (transformers' keep_in_fp32 checkpoints)
        weights = load_file(source / "model.safetensors")
        for key in sorted(weights)[: len(weights) // 2]:
            weights[key] = weights[key].to(rng.choice(list(TYPES.values())))
        save_file(weights, source / "model.safetensors", metadata={"format": "pt"})
    arg = rng.choice([None, "auto", "float16", "bfloat16", "float32", "float64", "half", torch.float16,
                      torch.bfloat16, torch.float32])
    kwargs = {} if arg is None else {rng.choice(["dtype", "torch_dtype"]): arg}
    what = f"{head} saved {saved_as} ({variant}, {layout}) loaded with {kwargs}"
    ref = getattr(transformers, head).from_pretrained(source, **kwargs).eval()
    ours = getattr(bertkit, head).from_pretrained(source, **kwargs)
    if arg is None:  # bertkit's documented default: float32 (docs/coming-from-transformers.md)
        assert ours.dtype == torch.float32, what
        ours = ours.to(ref.dtype)
    assert ours.dtype == ref.dtype, what
    ids, mask = _forward(ref, head, rng, config.vocab_size)
    _close(_output(ours, head, ids, mask), _output(ref, head, ids, mask), what)
    for name, model in (("ref", ref), ("ours", ours)):
        model.save_pretrained(root / name)
    assert _file_types(root / "ours") == _file_types(root / "ref"), what
    written = [json.loads((root / name / "config.json").read_text()) for name in ("ours", "ref")]
    assert written[0].get("dtype") == written[1].get("dtype") and "torch_dtype" not in written[0], what
    assert getattr(bertkit, head).from_pretrained(root / "ref", dtype="auto").dtype == ref.dtype, what
    assert getattr(transformers, head).from_pretrained(root / "ours").dtype == ref.dtype, what
    cast = rng.choice(list(CASTS))
    ref, ours = CASTS[cast](ref), CASTS[cast](ours)
    _close(_output(ours, head, ids, mask), _output(ref, head, ids, mask), f"{what}, then {cast}")


@pytest.fixture(scope="module")
def sparse_dirs(minilm_dir, tmp_path_factory):
    """{pooling: directory} of a tiny masked-LM SparseEncoder sentence-transformers wrote, MiniLM's tokenizer."""
    from sentence_transformers.sparse_encoder import SparseEncoder
    from sentence_transformers.sparse_encoder.modules import MLMTransformer, SpladePooling

    root = tmp_path_factory.mktemp("dtype-fuzz-sparse")
    transformers.logging.set_verbosity_error()
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(minilm_dir))
    torch.manual_seed(5)
    config = transformers.BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=2, intermediate_size=64)
    mlm = transformers.BertForMaskedLM(config)
    mlm.save_pretrained(root / "mlm")
    tokenizer.save_pretrained(root / "mlm")
    dirs = {}
    for pooling in ("max", "sum"):
        SparseEncoder(modules=[MLMTransformer(str(root / "mlm")), SpladePooling(pooling)], device="cpu").save(
            str(root / pooling))
        dirs[pooling] = root / pooling
    return dirs


@pytest.fixture(scope="module")
def cross_dirs(minilm_dir, tmp_path_factory):
    """{num_labels: directory} of tiny random sequence classifiers with MiniLM's tokenizer, saved by transformers."""
    root = tmp_path_factory.mktemp("dtype-fuzz-cross")
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(minilm_dir))
    dirs = {}
    for labels in (1, 3):
        torch.manual_seed(labels)
        config = transformers.BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2,
                                         num_attention_heads=2, intermediate_size=64, num_labels=labels)
        transformers.BertForSequenceClassification(config).save_pretrained(root / str(labels))
        tokenizer.save_pretrained(root / str(labels))
        dirs[labels] = root / str(labels)
    return dirs


def _cross_case(rng: random.Random, dirs: dict[int, Path], texts: list[str]) -> None:
    from bertkit.sentence import CrossEncoder

    labels, cast = rng.choice(sorted(dirs)), rng.choice(["half", "bfloat16", "double", "float", None])
    kwargs = {"batch_size": rng.choice([1, 2, 32]), "convert_to_tensor": rng.random() < 0.5,
              "convert_to_numpy": rng.random() < 0.5, "apply_softmax": rng.random() < 0.3}
    pairs = [(rng.choice(texts), rng.choice(texts)) for _ in range(rng.choice([1, 2, 5]))]
    model_kwargs = {"dtype": rng.choice(["float16", "bfloat16", torch.float64])} if cast is None else None
    what = f"CrossEncoder({labels} labels, {model_kwargs}).{cast}().predict({len(pairs)} pairs, {kwargs})"
    ref = st.CrossEncoder(str(dirs[labels]), device="cpu", model_kwargs=model_kwargs)
    ours = CrossEncoder(str(dirs[labels]), model_kwargs=model_kwargs)
    if cast is not None:
        ref, ours = getattr(ref, cast)(), getattr(ours, cast)()
    expected, got = ref.predict(pairs, **kwargs), ours.predict(pairs, **kwargs)
    expected, got = (torch.stack(x) if isinstance(x, list) else torch.as_tensor(x) for x in (expected, got))
    assert got.dtype == expected.dtype, what  # float32 from a float64 model before
    scale = max(1.0, expected.abs().max().item())
    tol = 1e-12 if expected.dtype == torch.float64 else 1e-6
    assert (got.double() - expected.double()).abs().max().item() <= tol * scale, what


def _sparse_case(rng: random.Random, dirs: dict[str, Path], texts: list[str]) -> None:
    from bertkit.sentence.sparse_encoder import SparseEncoder

    pooling, cast = rng.choice(sorted(dirs)), rng.choice(["half", "bfloat16", "double", "float"])
    kwargs = {"batch_size": rng.choice([1, 2, 32]), "convert_to_sparse_tensor": rng.random() < 0.5}
    if rng.random() < 0.3:
        kwargs["max_active_dims"] = rng.choice([3, 20])
    chosen = rng.sample(texts, rng.choice([1, 3, 5]))
    what = f"SparseEncoder({pooling}).{cast}().encode({len(chosen)} texts, {kwargs})"
    ref = getattr(st.SparseEncoder(str(dirs[pooling]), device="cpu"), cast)().encode(chosen, **kwargs)
    ours = getattr(SparseEncoder(str(dirs[pooling])), cast)().encode(chosen, **kwargs)
    ref, ours = ref.to_dense() if ref.is_sparse else ref, ours.to_dense() if ours.is_sparse else ours
    assert ours.dtype == ref.dtype, what  # float32 from every model before
    scale = max(1.0, ref.float().abs().max().item())
    tol = 1e-12 if ref.dtype == torch.float64 else TOL[ref.dtype] * 0.1
    assert (ours.double() - ref.double()).abs().max().item() <= tol * scale, what


def _quantize_case(rng: random.Random) -> None:
    from sentence_transformers.util import quantize_embeddings as reference

    from bertkit.sentence import quantize_embeddings

    nrs = np.random.default_rng(rng.randrange(1 << 30))
    n, d = rng.choice([2, 5, 17]), rng.choice([8, 13, 64])
    precision = rng.choice(["float32", "int8", "uint8", "binary", "ubinary"])

    def typed(x: np.ndarray, rows_allowed: bool = True):
        kind = rng.choice(["np16", "np32", "np64", "t16", "tbf16", "t32", "t64"] + (["rows"] if rows_allowed else []))
        if kind.startswith("np"):
            return x.astype({"np16": np.float16, "np32": np.float32, "np64": np.float64}[kind])
        tensor = torch.from_numpy(x).to({"t16": torch.float16, "tbf16": torch.bfloat16, "t32": torch.float32,
                                         "t64": torch.float64, "rows": torch.bfloat16}[kind])
        return list(tensor) if kind == "rows" else tensor

    def as_reference(x):  # sentence-transformers takes no bfloat16 tensor as calibration embeddings or ranges
        x = torch.stack(x) if isinstance(x, list) else x
        return (x.float() if x.dtype == torch.bfloat16 else x).numpy() if isinstance(x, torch.Tensor) else x

    def drawn(rows: int) -> np.ndarray:
        return nrs.standard_normal((rows, d)).astype(np.float32)

    embeddings, extra = typed(drawn(n)), {}
    if precision.endswith("int8") and rng.random() < 0.6:
        if rng.random() < 0.5:
            extra["calibration_embeddings"] = typed(drawn(rng.choice([4, 40])))
        else:
            low = drawn(1)
            extra["ranges"] = typed(np.vstack((low - 1, low + 2)), rows_allowed=False)
    expected = reference(embeddings, precision, **{k: as_reference(v) for k, v in extra.items()})
    got = quantize_embeddings(embeddings, precision, **extra)
    what = f"quantize_embeddings({type(embeddings).__name__} {n}x{d}, {precision}, {sorted(extra)})"
    assert got.dtype == expected.dtype and got.shape == expected.shape, what
    np.testing.assert_array_equal(got, expected, err_msg=what)


@pytest.mark.parametrize("seed", range(SEEDS))
def test_dtype_choices_match_the_references(seed, tmp_path, sparse_dirs, cross_dirs, sst2_texts):
    torch.set_num_threads(1)
    rng = random.Random(seed)
    kind = ("checkpoint", "sparse", "quantize", "cross")[seed % 4]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        transformers.logging.set_verbosity_error()
        if kind == "checkpoint":
            _checkpoint_case(rng, tmp_path)
        elif kind == "sparse":
            _sparse_case(rng, sparse_dirs, sst2_texts)
        elif kind == "cross":
            _cross_case(rng, cross_dirs, sst2_texts)
        else:
            _quantize_case(rng)
    shutil.rmtree(tmp_path, ignore_errors=True)


@pytest.fixture(scope="module")
def sst2_texts(data_dir) -> list[str]:
    path = data_dir / "glue" / "SST-2" / "dev.tsv"
    return [line.split("\t")[0].strip() for line in path.read_text(encoding="utf-8").splitlines()[1:40]]
