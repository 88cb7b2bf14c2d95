"""Loading a model for int8 inference: quantizing a float checkpoint at every start against loading the int8
directory ``bertkit quantize`` wrote once, with transformers' float load beside them for reference.

Each of ``--rounds`` interleaved rounds (engine A, B, C, then again; load from other jobs falls on all alike)
times, in this process, from the directory on disk to a model ready to run:

- ``transformers-fp32``: ``transformers.BertModel.from_pretrained`` (the reference; needs transformers);
- ``bertkit-fp32``: ``BertModel.from_pretrained``;
- ``bertkit-int8-at-load``: ``BertModel.from_pretrained`` then ``quantize_int8_on_texts`` (the 256 built-in
  calibration sentences): what ``pipeline(..., quantize="int8")`` and ``--int8`` do at every start;
- ``bertkit-int8-saved``: ``load_int8`` of the directory ``quantize_checkpoint`` wrote (before the rounds).

The file is in the page cache after the first round, so the figures are CPU time, not disk. Prints one JSON
line per engine (median seconds, the file's bytes) and one with the ratios, and checks that the two int8
models give identical outputs on a few sentences.

    python bench/bench_quantize_load.py --model models/minilm --threads 1 [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from bertkit import BertModel, BertTokenizer
from bertkit.quantization import load_int8, quantize_checkpoint, quantize_int8_on_texts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=Path("models/minilm"))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    tok = BertTokenizer.from_pretrained(args.model)
    with tempfile.TemporaryDirectory() as tmp:
        saved = Path(tmp) / "int8"
        quantize_checkpoint(args.model, saved)
        engines = {
            "bertkit-fp32": lambda: BertModel.from_pretrained(args.model),
            "bertkit-int8-at-load": lambda: quantize_int8_on_texts(BertModel.from_pretrained(args.model), tok),
            "bertkit-int8-saved": lambda: load_int8(saved, BertModel),
        }
        try:
            import transformers

            engines = {"transformers-fp32": lambda: transformers.BertModel.from_pretrained(args.model), **engines}
        except ImportError:
            pass
        times: dict[str, list[float]] = {name: [] for name in engines}
        models = {}
        for _ in range(args.rounds):
            for name, load in engines.items():
                start = time.perf_counter()
                models[name] = load()
                times[name].append(time.perf_counter() - start)
        enc = tok(["the saved model and the one quantized at load", "are the same model"], padding=True,
                  return_tensors="pt")
        with torch.inference_mode():
            a, b = (models[n](enc["input_ids"], enc["attention_mask"]).last_hidden_state
                    for n in ("bertkit-int8-at-load", "bertkit-int8-saved"))
        sizes = {"bertkit-int8-saved": (saved / "model.int8.safetensors").stat().st_size}
    float_bytes = (args.model / "model.safetensors").stat().st_size
    medians = {name: statistics.median(t) for name, t in times.items()}
    for name, t in times.items():
        print(json.dumps({"bench": "quantize_load", "engine": name, "threads": args.threads, "rounds": args.rounds,
                          "median_s": round(medians[name], 4), "min_s": round(min(t), 4),
                          "file_bytes": sizes.get(name, float_bytes)}))
    print(json.dumps({"bench": "quantize_load", "summary": True, "threads": args.threads,
                      "saved_vs_at_load_speedup": round(medians["bertkit-int8-at-load"] / medians["bertkit-int8-saved"], 2),
                      "saved_vs_fp32_load": round(medians["bertkit-int8-saved"] / medians["bertkit-fp32"], 2),
                      "file_ratio": round(sizes["bertkit-int8-saved"] / float_bytes, 3),
                      "int8_outputs_identical": bool(torch.equal(a, b))}))


if __name__ == "__main__":
    main()
