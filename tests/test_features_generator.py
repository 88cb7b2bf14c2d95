"""A seeded generator of extractions, each checked against transformers' ``output_hidden_states`` on the same weights
and google-research/bert's extract_features.py rules: the checkpoint (MiniLM cut to 2 layers, or a small random
config saved by transformers with a cased or uncased tokenizer), layers (negative, positive, 0), max_seq_length,
batch and chunk sizes, .jsonl or sharded .safetensors, float16, pairs, real text and edge text in a file with CRLF
or a BOM. Every value is compared with transformers' states at the same layer and token (1e-5; float16: its
rounding), the tokens with google's cut of BertTokenizerFast's, the records with the input lines, each output
read back by ``read_features`` and by hand, and a rerun with overwrite writes the same values.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from bertkit import BertModel, BertTokenizer
from bertkit import features as fx

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.slow

DRAWS = 100
EDGE = ["", "   ", "héllo Wörld", "ÀÉÎ naïve Straße", "東京は日本の首都です", "emoji 😀", "\u200b", "ctrl\x01\x07chars",
        "a" * 150, "[SEP] in [CLS]", "x ||| y ||| z", "a|||b", "tab\tin", "line\u2028sep", "\u00a0nbsp ", "|||"]


def _real_texts(data: Path) -> list[str]:
    squad = json.loads((data / "squad/dev-v1.1.json").read_text(encoding="utf-8"))
    paras = [p["context"] for article in squad["data"][:2] for p in article["paragraphs"][:5]]
    conll = " ".join(line.split(" ")[0] if line.strip() else "\n" for line in
                     (data / "conll2003/valid.txt").read_text(encoding="utf-8").splitlines()[2:600])
    rte = [r.split("\t") for r in (data / "glue/RTE/dev.tsv").read_text(encoding="utf-8").splitlines()[1:40]]
    return paras + [s.strip() for s in conll.split("\n") if s.strip()] + [f"{r[1]} ||| {r[2]}" for r in rte]


@pytest.fixture(scope="module")
def checkpoints(minilm_2_layers, tmp_path_factory) -> list[tuple]:
    """(BertModel, BertTokenizer, transformers' BertModel, BertTokenizerFast) of each checkpoint."""
    dirs = [minilm_2_layers]
    for seed, (layers, positions, lower) in enumerate([(1, 40, True), (3, 512, False), (2, 64, False)]):
        config = transformers.BertConfig(vocab_size=8960, hidden_size=16, num_hidden_layers=layers,
                                         num_attention_heads=2, intermediate_size=37, max_position_embeddings=positions,
                                         hidden_act=["gelu", "relu", "gelu_new"][seed])
        torch.manual_seed(seed)
        d = tmp_path_factory.mktemp(f"random-{seed}")
        transformers.BertModel(config).save_pretrained(d)
        transformers.BertTokenizerFast(vocab_file=str(minilm_2_layers / "vocab.txt"), do_lower_case=lower,
                                       strip_accents=[None, False, True][seed]).save_pretrained(d)
        dirs.append(d)
    return [(BertModel.from_pretrained(d), BertTokenizer.from_pretrained(d),
             transformers.BertModel.from_pretrained(d).eval(), transformers.BertTokenizerFast.from_pretrained(d))
            for d in dirs]


def _google(hf_tok, line: str, max_len: int) -> tuple[list[int], list[int]]:
    """google's read_examples and convert_examples_to_features on BertTokenizerFast's pieces."""
    m = re.match(r"^(.*) \|\|\| (.*)$", line.strip())
    a, b = (m.group(1), m.group(2)) if m else (line.strip(), None)
    ta, tb = hf_tok.tokenize(a), hf_tok.tokenize(b) if b else []
    if tb:  # _truncate_seq_pair: one token at a time off the longer, off b on a tie (b may end with none)
        while len(ta) + len(tb) > max_len - 3:
            (ta if len(ta) > len(tb) else tb).pop()
    else:
        del ta[max_len - 2:]
    ids = hf_tok.convert_tokens_to_ids(["[CLS]", *ta, "[SEP]", *tb] + (["[SEP]"] if tb else []))
    return ids, [0] * (len(ta) + 2) + [1] * (len(tb) + 1 if tb else 0)


def _by_hand(out: Path, layers: list[int]) -> list[tuple[int, list, dict]]:
    """(line index, tokens or ids, {layer: (T, H)}) of each record, read without bertkit."""
    if out.suffix == ".jsonl":
        objs = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
        assert all([ly["index"] for ly in f["layers"]] == layers for o in objs for f in o["features"])
        return [(o["linex_index"], [f["token"] for f in o["features"]],
                 {n: np.array([f["layers"][k]["values"] for f in o["features"]], np.float32)
                  for k, n in enumerate(layers)}) for o in objs]
    from safetensors.numpy import load_file

    shards = [out] if out.exists() else sorted(out.parent.glob(f"{out.stem}-*-of-*.safetensors"))
    records = []
    for shard in shards:
        t, off = load_file(str(shard)), load_file(str(shard))["offsets"]
        records += [(line, t["input_ids"][a:b].tolist(), {n: t[f"layer.{n}"][a:b].astype(np.float32) for n in layers})
                    for line, a, b in zip(t["line_index"].tolist(), off[:-1].tolist(), off[1:].tolist())]
    return records


def test_seeded_extractions_equal_transformers_states(checkpoints, data_dir, tmp_path):
    real = _real_texts(data_dir)
    for seed in range(DRAWS):
        rng = random.Random(seed)
        model, tok, hf_model, hf_tok = rng.choice(checkpoints)
        states = model.config.num_hidden_layers + 1
        picked = rng.sample(range(states), rng.randint(1, min(4, states)))
        layers = [s - states if rng.random() < 0.5 else s for s in picked]
        max_len = min(model.config.max_position_embeddings, rng.choice([3, 5, 9, 24, 64]))
        dtype, suffix = rng.choice(["float32", "float32", "float16"]), rng.choice([".jsonl", ".safetensors"])
        lines = [rng.choice(real) if rng.random() < 0.6 else rng.choice(EDGE) for _ in range(rng.randint(0, 6))]
        eol = rng.choice(["\n", "\r\n"])
        raw = ("\ufeff" if rng.random() < 0.2 else "") + "".join(line + eol for line in lines)
        (tmp_path / "in.txt").write_bytes(raw.encode("utf-8"))
        out = tmp_path / f"f{seed}{suffix}"
        kwargs = dict(layers=layers, max_seq_length=max_len, batch_size=rng.choice([1, 2, 8]), dtype=dtype,
                      chunk_size=rng.choice([1, 3, 2048]), max_shard_bytes=rng.choice([1, 4000, 1 << 30]),
                      progress=False)
        report = fx.extract_features(model, tok, fx.read_texts(tmp_path / "in.txt"), out, **kwargs)
        records, by_hand = list(fx.read_features(out)), _by_hand(out, layers)
        assert len(records) == len(by_hand) == report["lines"] == len(lines), seed
        for i, (line, rec, (index, pieces, values)) in enumerate(zip(lines, records, by_hand)):
            ids, types = _google(hf_tok, line, max_len)
            assert rec["line_index"] == index == i, seed
            got = rec["tokens"] if suffix == ".jsonl" else rec["input_ids"].tolist()
            assert got == pieces == (hf_tok.convert_ids_to_tokens(ids) if suffix == ".jsonl" else ids), (seed, i, line)
            with torch.no_grad():
                want = hf_model(torch.tensor([ids]), token_type_ids=torch.tensor([types]),
                                output_hidden_states=True).hidden_states
            for name in layers:
                ref = want[name][0].numpy()
                tol = 1e-5 + np.abs(ref) * (2.0**-10 if dtype == "float16" else 1e-5)
                for read in (rec["layers"][name], values[name]):
                    assert read.shape == ref.shape and (np.abs(read - ref) <= tol).all(), (seed, i, name)
        before = records
        fx.extract_features(model, tok, fx.read_texts(tmp_path / "in.txt"), out, overwrite=True, **kwargs)
        for old, new in zip(before, fx.read_features(out), strict=True):
            assert all(np.array_equal(old["layers"][n], new["layers"][n]) for n in layers), seed
