"""Which encoder projections int8 can take: per projection type and per layer, the worst sentence's embedding.

For each configuration (a ``keep_fp32`` list for ``bertkit.quantization.quantize_int8``) the MiniLM encoder
is quantized (smoothing calibrated on the first 256 SST-2 training sentences, another corpus than the one
measured; two rows without smoothing for comparison) and run on 1,000 STS-B dev sentences (sentence1 and sentence2 of the first 500 pairs,
length-sorted batches of 32, max_length 128, bertkit's default unpadded layout); each sentence's
mean-pooled embedding (over its real tokens, as the sentence-embedding pipeline pools) is compared with
fp32's. Reported: the minimum and mean cosine, how many sentences fall below 0.99, the same minimum on
the 872 SST-2 dev sentences (another corpus, as a check that the choice carries over), the share of the
projections' FLOPs left in fp32, and sentences per second on this machine (noisy on a shared machine).

``--activation-bits 7|8`` fixes the activation width (default: 8 on CPUs with AVX512-VNNI, else 7; the
tables in docs/inference.md say which). ``--calibration builtin`` calibrates on the 256 built-in sentences instead (``bertkit.calibration_text``, what
pipelines and ``--int8`` use when given no calibration texts).

With ``--metrics`` the configurations named by ``--metric-configs`` also get task metrics against fp32:
STS-B dev Spearman (x100) of the embeddings' cosine over all 1,500 pairs, and SST-2 dev accuracy (x100) of
a logistic-regression classifier fitted on fp32 mean-pooled embeddings of 2,000 SST-2 training sentences
(the same classifier reads the fp32 and the int8 embeddings).

    python bench/int8_sensitivity.py --model models/minilm [--threads 1] [--metrics] [--calibration builtin]

Prints one JSON line per configuration.
"""

from __future__ import annotations

import argparse
import csv
import json
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from bertkit import BertModel, BertTokenizer
from bertkit.calibration_text import CALIBRATION_SENTENCES
from bertkit.quantization import (
    DEFAULT_ALPHA,
    PROJECTIONS,
    calibration_batches,
    int8_projections,
    quantize_int8,
)

REPO = Path(__file__).resolve().parents[1]
# Relative FLOPs of the four projections per layer with intermediate_size = 4 * hidden_size.
FLOPS = {"qkv": 3, "attn_out": 1, "ffn_in": 4, "ffn_out": 4}


def read_tsv(path: Path) -> list[dict[str, str]]:
    with open(path, encoding="utf-8") as f:
        return list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))


def stsb_pairs(data: Path) -> list[tuple[str, str, float]]:
    return [(r["sentence1"], r["sentence2"], float(r["score"])) for r in read_tsv(data / "glue/STS-B/dev.tsv")]


def stsb_sentences(data: Path, n: int = 1000) -> list[str]:
    """sentence1 and sentence2 of the first n / 2 STS-B dev pairs: n sentences."""
    return [s for a, b, _ in stsb_pairs(data)[: n // 2] for s in (a, b)]


@torch.inference_mode()
def embed(model: BertModel, tok: BertTokenizer, texts: list[str], batch_size: int = 32,
          max_length: int = 128) -> torch.Tensor:
    """Mean-pooled last-layer states over real tokens, (len(texts), H), in input order; batches are
    length-sorted as bertkit's pipelines batch them."""
    order = sorted(range(len(texts)), key=lambda i: -len(tok(texts[i], truncation=True, max_length=max_length)["input_ids"]))
    out = torch.empty(len(texts), model.config.hidden_size)
    for a in range(0, len(order), batch_size):
        idx = order[a:a + batch_size]
        enc = tok([texts[i] for i in idx], truncation=True, max_length=max_length, padding=True, return_tensors="pt")
        res = model(enc["input_ids"], enc["attention_mask"], enc["token_type_ids"])
        mask = enc["attention_mask"].unsqueeze(-1).float()  # (B, T, 1)
        out[idx] = (res.last_hidden_state * mask).sum(1) / mask.sum(1)
    return out


def configurations(num_layers: int) -> list[tuple[str, list[str]]]:
    """(name, keep_fp32) pairs: everything int8, one projection type fp32, one type int8, one layer fp32,
    ffn_out fp32 in one layer or all but one, and ffn_out with first/last layers. Names ending in
    "no smoothing" are quantized without calibration."""
    configs = [("all-int8, no smoothing", []), ("keep ffn_out, no smoothing", ["ffn_out"]), ("all-int8", [])]
    configs += [(f"keep {k}", [k]) for k in PROJECTIONS]
    configs += [(f"only {k} int8", [o for o in PROJECTIONS if o != k]) for k in PROJECTIONS]
    configs += [(f"keep layers.{i}", [f"layers.{i}"]) for i in range(num_layers)]
    configs += [(f"keep layers.{i}.ffn_out", [f"layers.{i}.ffn_out"]) for i in range(num_layers)]
    configs += [(f"keep ffn_out except layers.{i}", [f"layers.{j}.ffn_out" for j in range(num_layers) if j != i])
                for i in range(num_layers)]
    configs += [("keep ffn_out + layers.0", ["ffn_out", "layers.0"]),
                (f"keep ffn_out + layers.{num_layers - 1}", ["ffn_out", f"layers.{num_layers - 1}"]),
                ("keep ffn_out + attn_out", ["ffn_out", "attn_out"]),
                ("keep ffn_out + qkv", ["ffn_out", "qkv"]),
                ("keep ffn_out + ffn_in", ["ffn_out", "ffn_in"]),
                ("keep layers.0-1.ffn_out", ["layers.0.ffn_out", "layers.1.ffn_out"]),
                ("keep layers.0,5.ffn_out", ["layers.0.ffn_out", f"layers.{num_layers - 1}.ffn_out"]),
                ("keep layers.0-2.ffn_out", ["layers.0.ffn_out", "layers.1.ffn_out", "layers.2.ffn_out"])]
    return configs


def fp32_share(model: BertModel) -> float:
    total = len(model.encoder.layer) * sum(FLOPS.values())
    int8 = sum(FLOPS[name.rsplit(".", 1)[1]] for name in int8_projections(model))
    return 1 - int8 / total


def sst2_classifier_accuracy(fp32: BertModel, others: dict[str, BertModel], tok: BertTokenizer,
                             data: Path) -> dict[str, tuple[float, float]]:
    """SST-2 dev (accuracy, agreement with fp32's predictions), x100, per model."""
    from sklearn.linear_model import LogisticRegression

    train = read_tsv(data / "glue/SST-2/train.tsv")[:2000]
    dev = read_tsv(data / "glue/SST-2/dev.tsv")
    x = F.normalize(embed(fp32, tok, [r["sentence"] for r in train]), dim=-1).numpy()
    clf = LogisticRegression(max_iter=2000, C=10.0).fit(x, [int(r["label"]) for r in train])
    y = np.array([int(r["label"]) for r in dev])
    acc, preds = {}, {}
    for name, model in {"fp32": fp32, **others}.items():
        e = F.normalize(embed(model, tok, [r["sentence"] for r in dev]), dim=-1).numpy()
        preds[name] = clf.predict(e)
        acc[name] = (100 * float((preds[name] == y).mean()), 100 * float((preds[name] == preds["fp32"]).mean()))
    return acc


def stsb_spearman(model: BertModel, tok: BertTokenizer, data: Path) -> float:
    from scipy.stats import spearmanr

    pairs = stsb_pairs(data)
    a = embed(model, tok, [p[0] for p in pairs])
    b = embed(model, tok, [p[1] for p in pairs])
    return 100 * float(spearmanr(F.cosine_similarity(a, b).numpy(), [p[2] for p in pairs]).statistic)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, default=REPO / "models" / "minilm")
    p.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--configs", default=None, help="configuration names to run, separated by ';' (default: all)")
    p.add_argument("--alpha", type=float, default=DEFAULT_ALPHA, help="SmoothQuant migration strength")
    p.add_argument("--activation-bits", type=int, choices=(7, 8), default=None,
                   help="activation width (default: what this CPU runs exactly, 8 with AVX512-VNNI)")
    p.add_argument("--calibration", choices=("sst2-train", "builtin"), default="sst2-train",
                   help="calibration texts: the first 256 SST-2 training sentences, or the 256 built-in sentences")
    p.add_argument("--metrics", action="store_true", help="also STS-B Spearman and SST-2 accuracy (slower)")
    p.add_argument("--metric-configs", default="all-int8, no smoothing;all-int8;keep layers.0.ffn_out;keep ffn_out",
                   help="configurations that get --metrics (names separated by ';')")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    tok = BertTokenizer.from_pretrained(args.model)
    fp32 = BertModel.from_pretrained(args.model).eval()
    texts = stsb_sentences(args.data)
    calibration_texts = (list(CALIBRATION_SENTENCES) if args.calibration == "builtin"
                         else [r["sentence"] for r in read_tsv(args.data / "glue/SST-2/train.tsv")[:256]])
    calibration = calibration_batches(tok, calibration_texts)
    embed(fp32, tok, texts[:64])  # warm-up
    t0 = time.perf_counter()
    ref = embed(fp32, tok, texts)
    sst2 = [r["sentence"] for r in read_tsv(args.data / "glue/SST-2/dev.tsv")]
    sst2_ref = embed(fp32, tok, sst2)
    print(json.dumps({"config": "fp32", "keep_fp32": None, "sentences": len(texts), "min_cos": 1.0,
                      "mean_cos": 1.0, "below_0.99": 0, "fp32_flop_share": 1.0,
                      "seq_per_s": round(len(texts) / (time.perf_counter() - t0), 1), "threads": args.threads}),
          flush=True)
    wanted = None if args.configs is None else set(args.configs.split(";"))
    metric_models = {}
    for name, keep in configurations(len(fp32.encoder.layer)):
        if wanted is not None and name not in wanted:
            continue
        t0 = time.perf_counter()
        q = quantize_int8(fp32, keep_fp32=keep, alpha=args.alpha, activation_bits=args.activation_bits,
                          calibration=None if name.endswith("no smoothing") else calibration)
        quantize_s = time.perf_counter() - t0
        embed(q, tok, texts[:64])
        t0 = time.perf_counter()
        e = embed(q, tok, texts)
        secs = time.perf_counter() - t0
        cos = F.cosine_similarity(e, ref)
        sst2_cos = F.cosine_similarity(embed(q, tok, sst2), sst2_ref)
        worst = int(cos.argmin())
        print(json.dumps({"config": name, "keep_fp32": keep, "alpha": args.alpha, "calibration": args.calibration,
                          "activation_bits": next(m.activation_bits for m in q.modules() if hasattr(m, "activation_bits")),
                          "sentences": len(texts),
                          "min_cos": round(float(cos.min()), 4), "mean_cos": round(float(cos.mean()), 5),
                          "below_0.99": int((cos < 0.99).sum()), "sst2_dev_min_cos": round(float(sst2_cos.min()), 4),
                          "fp32_flop_share": round(fp32_share(q), 3),
                          "seq_per_s": round(len(texts) / secs, 1), "quantize_s": round(quantize_s, 2), "worst_sentence": texts[worst][:80],
                          "threads": args.threads}), flush=True)
        if args.metrics and name in args.metric_configs.split(";"):
            metric_models[name] = q
    if args.metrics:
        acc = sst2_classifier_accuracy(fp32, metric_models, tok, args.data)
        for name, model in {"fp32": fp32, **metric_models}.items():
            print(json.dumps({"config": name, "metrics": True, "stsb_dev_spearman": round(stsb_spearman(model, tok, args.data), 2),
                              "sst2_dev_accuracy_logreg_on_embeddings": round(acc[name][0], 2),
                              "sst2_dev_agreement_with_fp32": round(acc[name][1], 2)}), flush=True)


if __name__ == "__main__":
    main()
