"""bf16 inference on the CPU with the Linear weights cast once against autocast's cast per call.

Under ``torch.autocast("cpu", dtype=torch.bfloat16)`` every Linear casts its float32 weight to bf16 on every call;
the model ``prepare_model`` makes for bf16 owns bf16 copies made once (``prepare.PreparedLinear``; here with
oneDNN's reordering switched off, so only the cast is compared). Both run here in one process on the three
workloads of ``bench_engines.py`` (SST-2 sentences, question/sentence pairs, SQuAD windows), interleaved, the
plain model with the same rounding of keys and rows; the outputs must be bit-identical.

One JSON line per workload: ``{"workload", "seq_per_s_cast_per_call", "seq_per_s_cast_once", "speedup",
"identical"}``. Usage: ``python bench/bench_bf16_weights.py [--threads 1] [--rounds 5]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from unittest.mock import patch

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_engines import workloads  # noqa: E402
from bertkit import BertModel, BertTokenizer  # noqa: E402
from bertkit.inference import prepare  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", type=Path, default=REPO / "models/minilm")
    p.add_argument("--data", type=Path, default=REPO.parent / "shared/data")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--pairs", type=int, default=320)
    p.add_argument("--windows", type=int, default=64)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    model = BertModel.from_pretrained(args.model).eval()
    loads = workloads(BertTokenizer.from_pretrained(args.model), args.data, args.pairs, args.windows)
    with patch.object(prepare, "onednn_bf16_linear", lambda: False):
        copies = prepare.for_cpu_inference(model, bf16=True)
    model.key_multiple, model.token_multiple = copies.key_multiple, copies.token_multiple

    def run(batches, once: bool) -> list[torch.Tensor]:
        with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
            return [(copies if once else model)(**b).last_hidden_state for b in batches]

    for name, batches in loads.items():
        identical = all(torch.equal(a, b) for a, b in zip(run(batches, True), run(batches, False)))
        times: dict[bool, list[float]] = {True: [], False: []}
        for _ in range(args.rounds):
            for once in (False, True):
                start = time.perf_counter()
                run(batches, once)
                times[once].append(time.perf_counter() - start)
        n = sum(len(b["input_ids"]) for b in batches)
        per_call, once = n / statistics.median(times[False]), n / statistics.median(times[True])
        print(json.dumps({"workload": name, "threads": args.threads, "sequences": n,
                          "seq_per_s_cast_per_call": round(per_call, 1), "seq_per_s_cast_once": round(once, 1),
                          "speedup": round(once / per_call, 3), "identical": identical}))


if __name__ == "__main__":
    main()
