"""int8 encoder inference on the CPU: bertkit int8 against bertkit fp32, transformers fp32, transformers with
torch's quantize_dynamic, and ONNX Runtime fp32 / int8, on the same batches, outputs compared.

Workload: MiniLM (models/minilm) on SST-2 dev sentences (all 872; GLUE's QNLI is not in the shared data),
in file order, batch 32, max_length 128, each batch padded to its longest. Every engine runs every batch
in each of ``--rounds`` interleaved rounds (engine A, B, ... then again), so load from other jobs on the
machine falls on all of them alike; the median round is reported, for each thread count.

Engines:
- ``bertkit-fp32``: ``BertModel`` (unpadded layout, the default);
- ``bertkit-int8``: ``quantize_int8(model, calibration=256 SST-2 training sentences)``, its default
  ``keep_fp32`` (ffn_out in fp32, the other projections int8 with SmoothQuant smoothing);
- ``bertkit-int8-fast``: ``keep_fp32=FAST_KEEP_FP32, per_token=FAST_PER_TOKEN`` (``bertkit quantize --fast``:
  every projection int8, ffn_out with one activation scale per token through ``torch._int_mm``), on CPUs with
  AVX512-VNNI only;
- ``bertkit-int8-all``: the same with every projection int8 (``keep_fp32=()``): faster, min cosine below 0.99,
  the accuracy CTranslate2's int8 has;
- ``transformers-fp32``: ``transformers.BertModel`` (SDPA), the same weights;
- ``transformers-qdynamic``: that model through ``torch.ao.quantization.quantize_dynamic`` with the
  per-channel qconfig on every ``nn.Linear`` (what most tutorials do);
- ``onnxruntime-fp32`` / ``onnxruntime-int8``: bertkit's ONNX export (``bertkit.inference.export``) and
  its ``--int8`` form (``onnxruntime.quantization.quantize_dynamic``, per-channel int8 weights), needs
  ``bertkit[bench]``;
- ``ctranslate2-float32`` / ``ctranslate2-int8``: CTranslate2's own converter
  (``ctranslate2.converters.TransformersConverter``) on the checkpoint, its ``Encoder`` at compute type
  float32 and int8 (int8 weights, activations quantized per call), one intra-op thread set per thread
  count; needs ``bertkit[bench]``. It takes token ids (without padding) and returns the padded states.

``min_cos_pooled`` is the worst sentence's cosine between an engine's mean-pooled last layer (over real
tokens) and bertkit fp32's.

    python bench/bench_int8.py --model models/minilm --threads 1,2 [--rounds 3]

Prints one JSON line per engine and thread count.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
import transformers

from bertkit import BertModel, BertTokenizer
from bertkit.quantization import (
    FAST_KEEP_FP32,
    FAST_PER_TOKEN,
    calibration_batches,
    per_token_supported,
    quantize_int8,
)

REPO = Path(__file__).resolve().parents[1]


def sst2(data: Path, split: str) -> list[str]:
    with open(data / f"glue/SST-2/{split}.tsv", encoding="utf-8") as f:
        return [r["sentence"] for r in csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)]


def pooled(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    m = mask.unsqueeze(-1).to(hidden.dtype)  # (B, T, 1)
    return (hidden * m).sum(1) / m.sum(1)


def onnx_engines(model_dir: Path, tmp: Path) -> dict[str, Callable]:
    """ONNX Runtime on bertkit's export, fp32 and dynamically quantized int8 (one intra-op thread set later)."""
    from bench_engines import onnxruntime_engine  # imported here: bench_engines imports this module
    from bertkit.inference.export import export_onnx

    fp32_path, int8_path = tmp / "minilm.onnx", tmp / "minilm-int8.onnx"
    export_onnx(model_dir, fp32_path, verify=False)
    export_onnx(model_dir, int8_path, verify=False, int8=True)  # `bertkit export onnx --int8`
    return {"onnxruntime-fp32": onnxruntime_engine(fp32_path), "onnxruntime-int8": onnxruntime_engine(int8_path)}


def ctranslate2_engines(model_dir: Path, tmp: Path) -> dict[str, Callable]:
    """CTranslate2 Encoder on its own conversion of the checkpoint, float32 and int8, in this process: its OpenMP
    runtime then slows PyTorch's later two-thread passes (bench_engines.py runs it in child processes instead)."""
    from bench_engines import convert_ctranslate2, ctranslate2_engine

    convert_ctranslate2(model_dir, tmp)
    return {name: ctranslate2_engine(name, tmp) for name in ("ctranslate2-float32", "ctranslate2-int8")}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, default=REPO / "models" / "minilm")
    p.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--no-onnx", action="store_true", help="skip the ONNX Runtime rows")
    p.add_argument("--no-ctranslate2", action="store_true", help="skip the CTranslate2 rows")
    p.add_argument("--engines", default=None, help="comma list: run only these engines (bertkit-fp32 always runs)")
    args = p.parse_args()

    tok = BertTokenizer.from_pretrained(args.model)
    texts = sst2(args.data, "dev")
    batches = []
    for a in range(0, len(texts), 32):
        enc = tok(texts[a:a + 32], truncation=True, max_length=128, padding=True, return_tensors="pt")
        batches.append({k: enc[k] for k in ("input_ids", "token_type_ids", "attention_mask")})

    ours = BertModel.from_pretrained(args.model).eval()
    t0 = time.perf_counter()
    calibration = calibration_batches(tok, sst2(args.data, "train")[:256])
    ours_int8 = quantize_int8(ours, calibration=calibration)
    quantize_s = time.perf_counter() - t0
    ours_int8_all = quantize_int8(ours, calibration=calibration, keep_fp32=())
    ours_int8_fast = quantize_int8(ours, calibration=calibration, keep_fp32=FAST_KEEP_FP32,
                                   per_token=FAST_PER_TOKEN) if per_token_supported() else None
    theirs = transformers.BertModel.from_pretrained(args.model).eval()
    theirs_q = torch.ao.quantization.quantize_dynamic(
        transformers.BertModel.from_pretrained(args.model).eval(),
        {torch.nn.Linear: torch.ao.quantization.per_channel_dynamic_qconfig}, dtype=torch.qint8)

    engines: dict[str, Callable] = {
        "bertkit-fp32": lambda b: ours(**b).last_hidden_state,
        "bertkit-int8": lambda b: ours_int8(**b).last_hidden_state,
        "bertkit-int8-all": lambda b: ours_int8_all(**b).last_hidden_state,
        **({"bertkit-int8-fast": lambda b: ours_int8_fast(**b).last_hidden_state} if ours_int8_fast else {}),
        "transformers-fp32": lambda b: theirs(**b).last_hidden_state,
        "transformers-qdynamic": lambda b: theirs_q(**b).last_hidden_state,
    }
    tmp = tempfile.TemporaryDirectory()
    if not args.no_onnx:
        engines.update(onnx_engines(args.model, Path(tmp.name)))
    if not args.no_ctranslate2:
        engines.update(ctranslate2_engines(args.model, Path(tmp.name)))
    if args.engines:
        keep = {"bertkit-fp32", *args.engines.split(",")}
        unknown = keep - set(engines)
        if unknown:
            raise SystemExit(f"--engines: unknown {sorted(unknown)}; the engines are {sorted(engines)}")
        engines = {name: fn for name, fn in engines.items() if name in keep}

    with torch.inference_mode():
        outputs = {name: torch.cat([pooled(fn(b), b["attention_mask"]) for b in batches])
                   for name, fn in engines.items()}
        ref = outputs["bertkit-fp32"]
        min_cos = {name: float(F.cosine_similarity(o.float(), ref).min()) for name, o in outputs.items()}
        for threads in [int(t) for t in args.threads.split(",")]:
            torch.set_num_threads(threads)
            times: dict[str, list[float]] = {name: [] for name in engines}
            for fn in engines.values():
                fn(batches[0])  # warm-up at this thread count (ONNX Runtime builds its session here)
            for _ in range(args.rounds):
                for name, fn in engines.items():
                    t0 = time.perf_counter()
                    for b in batches:
                        fn(b)
                    times[name].append(time.perf_counter() - t0)
            base = statistics.median(times["bertkit-fp32"])
            for name in engines:
                secs = statistics.median(times[name])
                print(json.dumps({
                    "bench": "int8", "engine": name, "threads": threads, "sequences": len(texts),
                    "seq_per_s": round(len(texts) / secs, 1), "vs_bertkit_fp32": round(base / secs, 3),
                    "min_cos_pooled": round(min_cos[name], 4), "rounds": args.rounds,
                    "round_seconds": [round(t, 2) for t in times[name]],
                    "quantize_s": round(quantize_s, 2) if name == "bertkit-int8" else None,
                    "cpu_capability": torch.backends.cpu.get_cpu_capability(), "torch": torch.__version__,
                }), flush=True)
    tmp.cleanup()


if __name__ == "__main__":
    main()
