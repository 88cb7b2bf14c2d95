"""bertkit's int8 kernels side by side on the same quantized MiniLM, at the three input lengths of
``bench_engines.py``: ``torch.ao``'s deprecated dynamic Linear (fbgemm) against ``torch._int_mm`` and oneDNN's
quantized Linear (``torch.ops.onednn.qlinear_pointwise``, where it is exact: VNNI or AMX), the activations'
quantization compiled by Inductor (the default) or eager (``BERTKIT_INT8_EAGER=1``).

Models, each quantized by ``quantize_int8`` from the same fp32 weights with 256 SST-2 training sentences:
- ``fbgemm`` / ``int_mm`` / ``int_mm-eager``: the default set (``ffn_out`` fp32, the rest one activation scale per
  call, smoothed, 8-bit activations) on each kernel;
- ``fast-int_mm`` / ``fast-onednn`` (and ``-eager``): ``bertkit quantize --fast``'s set (every ``ffn_out`` per
  token) on each kernel;
- ``fbgemm+bf16``, ``onednn+bf16``, ``fast-onednn+bf16``: those models under bf16 autocast (attention, GELU,
  LayerNorm and the fp32-kept projections in bf16, as OpenVINO's int8 computes them on a bf16 CPU).
fp32 runs beside them. Every model runs every batch of a workload in each of ``--rounds`` interleaved rounds after
a warm-up round (which compiles); the median round is reported. ``min_cos`` is the worst row's cosine between
the mean-pooled last layer and fp32's. Needs a CPU with AVX512-VNNI (``torch._int_mm`` is exact at 8 bits only
there).

``--activation-bits 7`` runs the width of CPUs without VNNI instead: the default set on fbgemm and on oneDNN at 7
bits, beside fp32. On a VNNI CPU, oneDNN, MKL and ATen can be held to AVX2 to see what such a CPU's kernels do
(fbgemm chooses its kernels from the CPU's flags and may not be held):

    python bench/bench_int8_kernels.py --threads 1 --rounds 5
    ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 ATEN_CPU_CAPABILITY=avx2 \
        python bench/bench_int8_kernels.py --threads 1 --rounds 3 --activation-bits 7

Prints one JSON line per workload and model.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from bench_engines import workloads
from bench_int8 import pooled, sst2

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, default=ROOT / "models" / "minilm")
    p.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--pairs", type=int, default=256)
    p.add_argument("--windows", type=int, default=64)
    p.add_argument("--activation-bits", type=int, choices=(7, 8), default=8,
                   help="7: the width of CPUs without VNNI (fbgemm against oneDNN at 7 bits)")
    args = p.parse_args()
    bits = args.activation_bits
    torch.set_num_threads(args.threads)

    import bertkit.quantization.kernels as kernels
    from bertkit import BertModel, BertTokenizer
    from bertkit.quantization import (
        FAST_KEEP_FP32,
        FAST_PER_TOKEN,
        calibration_batches,
        per_token_supported,
        quantize_int8,
    )
    from bertkit.quantization.device import onednn_supported

    if bits == 8 and not per_token_supported():
        raise SystemExit("torch._int_mm is not exact on this CPU (no AVX512-VNNI): only fbgemm runs here")
    tok = BertTokenizer.from_pretrained(args.model)
    data = workloads(tok, args.data, args.pairs, args.windows)
    calibration = calibration_batches(tok, sst2(args.data, "train")[:256])
    fp32 = BertModel.from_pretrained(args.model).eval()
    chosen, supported = kernels.default_backend, kernels.onednn_supported
    built = {}
    if bits == 8:
        backends = ("fbgemm", "int_mm") + (("onednn",) if onednn_supported() else ())
    else:
        backends = ("fbgemm",) + (("onednn",) if onednn_supported(7) else ())
    for backend in backends:
        kernels.default_backend = lambda bits, backend=backend: backend
        kernels.onednn_supported = lambda bits=8, backend=backend: backend == "onednn"  # the per-token layers' kernel
        built[backend] = quantize_int8(fp32, calibration=calibration, activation_bits=bits)
        if backend != "fbgemm" and bits == 8:
            built["fast-" + backend] = quantize_int8(fp32, calibration=calibration, keep_fp32=FAST_KEEP_FP32,
                                                     per_token=FAST_PER_TOKEN)
    kernels.default_backend, kernels.onednn_supported = chosen, supported
    # (model, eager?): the eager runs set BERTKIT_INT8_EAGER=1 around their own calls only
    models = {"fp32": (fp32, False), "fbgemm": (built["fbgemm"], False)}
    for name in built.keys() - {"fbgemm"}:
        models[name] = (built[name], False)
        models[name + "-eager"] = (built[name], True)
    # the same models under bf16 autocast: the float parts (attention, GELU, LayerNorm, kept fp32 projections) in bf16
    for name in [n for n in models if n in ("fbgemm", "onednn", "fast-onednn") and bits == 8]:
        models[name + "+bf16"] = (built[name], False)

    def run(name: str, batches: list[dict]) -> list[torch.Tensor]:
        model, eager = models[name]
        os.environ["BERTKIT_INT8_EAGER"] = "1" if eager else "0"
        try:
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=name.endswith("+bf16")):
                return [model(**b).last_hidden_state for b in batches]
        finally:
            os.environ.pop("BERTKIT_INT8_EAGER")

    with torch.inference_mode():
        for workload, batches in data.items():
            ref = torch.cat([pooled(h, b["attention_mask"]) for h, b in zip(run("fp32", batches), batches)])
            cosine = {}
            for name in models:  # also the warm-up round: the compiled functions are built here
                out = torch.cat([pooled(h, b["attention_mask"]) for h, b in zip(run(name, batches), batches)])
                cosine[name] = float(F.cosine_similarity(out, ref).min())
            seconds: dict[str, list[float]] = {name: [] for name in models}
            for _ in range(args.rounds):
                for name in models:
                    t0 = time.perf_counter()
                    run(name, batches)
                    seconds[name].append(time.perf_counter() - t0)
            rows = sum(len(b["input_ids"]) for b in batches)
            base = statistics.median(seconds["fbgemm"])
            for name, ts in seconds.items():
                secs = statistics.median(ts)
                print(json.dumps({"bench": "int8_kernels", "workload": workload, "engine": name,
                                  "threads": args.threads, "seq_per_s": round(rows / secs, 1),
                                  "vs_fbgemm": round(base / secs, 3), "spread": round((max(ts) - min(ts)) / secs, 3),
                                  "min_cos": round(cosine[name], 4), "activation_bits": bits,
                                  "cpu_capability": torch.backends.cpu.get_cpu_capability(), "loadavg": [round(x, 2) for x in os.getloadavg()],
                                  "torch": torch.__version__}), flush=True)


if __name__ == "__main__":
    main()
