"""The two kernels of bertkit's default int8 (``SmoothedInt8Linear``) side by side: ``torch._int_mm`` and
``torch.ao``'s deprecated dynamic Linear (fbgemm), on the same quantized MiniLM.

MiniLM quantized twice with ``quantize_int8`` (its default ``keep_fp32``, 256 SST-2 training sentences to
calibrate, 8-bit activations), once per kernel, and fp32 beside them; all 872 SST-2 dev sentences in batches of
32 (max 128 tokens), ``--rounds`` interleaved rounds (fp32, fbgemm, int_mm, then again), the median round
reported. ``min_cos`` is the worst sentence's cosine between the mean-pooled last layer and fp32's. Needs a CPU
with AVX512-VNNI (``torch._int_mm`` is exact at 8 bits only there).

    python bench/bench_int8_kernels.py --threads 1 --rounds 3

Prints one JSON line per engine.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
SST2 = ROOT.parent / "shared" / "data" / "glue" / "SST-2"


def sentences(split: str) -> list[str]:
    with open(SST2 / f"{split}.tsv", encoding="utf-8", newline="") as f:
        return [r[0] for r in csv.reader(f, delimiter="\t", quotechar=None)][1:]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, default=ROOT / "models" / "minilm")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    torch.set_num_threads(args.threads)

    import bertkit.quantization.kernels as kernels
    from bertkit import BertModel, BertTokenizer
    from bertkit.quantization import per_token_supported, quantize_int8

    if not per_token_supported():
        raise SystemExit("torch._int_mm is not exact on this CPU (no AVX512-VNNI): only fbgemm runs here")
    tok = BertTokenizer.from_pretrained(args.model)
    dev, train = sentences("dev"), sentences("train")[:256]

    def batches(texts: list[str]) -> list[dict]:
        return [dict(tok(texts[i:i + 32], padding=True, truncation=True, max_length=128, return_tensors="pt"))
                for i in range(0, len(texts), 32)]

    data, calibration = batches(dev), batches(train)
    fp32 = BertModel.from_pretrained(args.model).eval()
    models = {"fp32": fp32}
    chosen = kernels.default_backend
    for backend in ("fbgemm", "int_mm"):
        kernels.default_backend = lambda bits, backend=backend: backend
        models[backend] = quantize_int8(fp32, calibration=calibration)
    kernels.default_backend = chosen

    def pooled(model, batch: dict) -> torch.Tensor:
        states = model(**batch).last_hidden_state
        mask = batch["attention_mask"].unsqueeze(-1).float()
        return (states * mask).sum(1) / mask.sum(1)

    seconds: dict[str, list[float]] = {name: [] for name in models}
    with torch.inference_mode():
        reference = [pooled(fp32, b) for b in data]
        cosine = {name: min(float(torch.nn.functional.cosine_similarity(pooled(m, b), r).min())
                            for b, r in zip(data, reference)) for name, m in models.items()}
        for _ in range(args.rounds):
            for name, model in models.items():
                t0 = time.perf_counter()
                for batch in data:
                    pooled(model, batch)
                seconds[name].append(time.perf_counter() - t0)
    for name in models:
        print(json.dumps({"bench": "int8_kernels", "engine": name, "threads": args.threads,
                          "seq_per_s": round(len(dev) / statistics.median(seconds[name]), 1),
                          "rounds_s": [round(s, 2) for s in seconds[name]], "min_cos": round(cosine[name], 4),
                          "loadavg": os.getloadavg(), "torch": torch.__version__}))


if __name__ == "__main__":
    main()
