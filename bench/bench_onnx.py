"""The ONNX Runtime anchor: bertkit's encoder vs its own ONNX export run in onnxruntime, and vs
transformers, on the same real sentence pairs in one process.

Workload: SQuAD v1.1 dev questions, each paired with the sentence of its context that holds the answer
(real question / sentence pairs), in file order, batch 32, max_length 128, each batch padded to its
longest pair (what a user feeding a server or a file in natural order gets). The MiniLM encoder.

Implementations, each over every batch (median of ``--repeats`` passes, after a warm-up pass):
- ``transformers`` fp32 (its default SDPA attention, padded rectangle);
- ``bertkit`` fp32 (padding dropped, its default) and bf16 autocast;
- ``onnxruntime``: ``bertkit export onnx``'s file, ORT_ENABLE_ALL graph optimisations, intra-op threads =
  torch's; ``onnxruntime-fused``: the same file after ``onnxruntime.transformers.optimizer.optimize_model``
  (model_type "bert": fused attention, LayerNorm and GELU kernels), what ONNX Runtime's BERT guide does.
Every implementation's last_hidden_state is checked against bertkit fp32 at the real positions.

    python bench/bench_onnx.py --model models/minilm [--pairs 2048] [--repeats 3]

Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import transformers

from bertkit import BertModel, BertTokenizer
from bertkit.inference.export import export_onnx

REPO = Path(__file__).resolve().parents[1]


def question_sentence_pairs(data: Path, n: int) -> list[tuple[str, str]]:
    """(question, the context sentence holding the first answer) for SQuAD dev questions in file order."""
    squad = json.loads((data / "squad/dev-v1.1.json").read_text(encoding="utf-8"))
    pairs = []
    for art in squad["data"]:
        for para in art["paragraphs"]:
            context = para["context"]
            starts = [0] + [m.end() for m in re.finditer(r"(?<=[.!?])\s+", context)]
            for qa in para["qas"]:
                at = qa["answers"][0]["answer_start"]
                begin = max(s for s in starts if s <= at)
                end = next((s for s in starts if s > at), len(context))
                pairs.append((qa["question"], context[begin:end].strip()))
                if len(pairs) == n:
                    return pairs
    return pairs


def median_pass(fn, batches, repeats: int) -> float:
    fn(batches[0])
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for b in batches:
            fn(b)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, default=REPO / "models" / "minilm")
    p.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data")
    p.add_argument("--pairs", type=int, default=2048)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()

    import onnxruntime as ort
    from onnxruntime.transformers import optimizer

    tok = BertTokenizer.from_pretrained(args.model)
    pairs = question_sentence_pairs(args.data, args.pairs)
    batches = []
    for i in range(0, len(pairs), args.batch_size):
        chunk = pairs[i:i + args.batch_size]
        enc = tok([q for q, _ in chunk], text_pair=[s for _, s in chunk], max_length=128, truncation=True,
                  padding=True, return_tensors="pt")
        batches.append({k: enc[k] for k in ("input_ids", "token_type_ids", "attention_mask")})
    real = sum(int(b["attention_mask"].sum()) for b in batches)
    padding = 1 - real / sum(b["attention_mask"].numel() for b in batches)

    ours = BertModel.from_pretrained(args.model).eval()
    theirs = transformers.BertModel.from_pretrained(args.model).eval()
    threads = torch.get_num_threads()
    with tempfile.TemporaryDirectory() as tmp:
        plain = Path(tmp) / "model.onnx"
        export_onnx(args.model, plain)
        config = ours.config
        fused_model = optimizer.optimize_model(str(plain), model_type="bert", num_heads=config.num_attention_heads,
                                               hidden_size=config.hidden_size)
        fused = Path(tmp) / "model-fused.onnx"
        fused_model.save_model_to_file(str(fused))
        fused_ops = sorted({n.op_type for n in fused_model.model.graph.node} & {
            "Attention", "MultiHeadAttention", "SkipLayerNormalization", "EmbedLayerNormalization", "FastGelu",
            "BiasGelu", "Gelu"})
        sessions = {}
        for name, path in (("onnxruntime", plain), ("onnxruntime-fused", fused)):
            so = ort.SessionOptions()
            so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
            so.intra_op_num_threads = threads
            sessions[name] = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])

        def run_ort(session):
            names = [i.name for i in session.get_inputs()]
            return lambda b: session.run(["last_hidden_state"], {n: b[n].numpy() for n in names})[0]

        impls = {
            "transformers_fp32": lambda b: theirs(**b).last_hidden_state,
            "bertkit_fp32": lambda b: ours(**b).last_hidden_state,
            "bertkit_bf16": lambda b: _bf16(ours, b),
            "onnxruntime_fp32": run_ort(sessions["onnxruntime"]),
            "onnxruntime_fused_fp32": run_ort(sessions["onnxruntime-fused"]),
        }
        results, diffs = {}, {}
        with torch.inference_mode():
            reference = [ours(**b).last_hidden_state for b in batches[:4]]
            for name, fn in impls.items():
                diff = 0.0
                for b, ref in zip(batches[:4], reference):
                    out = torch.as_tensor(np.asarray(fn(b), dtype=np.float32)).float()
                    mask = b["attention_mask"].bool()
                    diff = max(diff, float((out[mask] - ref[mask]).abs().max()))
                diffs[name] = diff
                results[name] = len(pairs) / median_pass(fn, batches, args.repeats)
    base = results["transformers_fp32"]
    print(json.dumps({
        "bench": "onnx", "model": str(args.model), "pairs": len(pairs), "batch_size": args.batch_size,
        "padding_fraction": round(padding, 4), "threads": threads, "torch": torch.__version__,
        "transformers": transformers.__version__, "onnxruntime": ort.__version__, "fused_ops": fused_ops,
        "seq_per_s": {k: round(v, 1) for k, v in results.items()},
        "vs_transformers": {k: round(v / base, 3) for k, v in results.items()},
        "bertkit_fp32_vs_onnxruntime_fused": round(results["bertkit_fp32"] / results["onnxruntime_fused_fp32"], 3),
        "bertkit_bf16_vs_onnxruntime_fused": round(results["bertkit_bf16"] / results["onnxruntime_fused_fp32"], 3),
        "max_abs_diff_vs_bertkit_fp32": {k: float(f"{v:.2e}") for k, v in diffs.items()},
    }))


def _bf16(model, batch):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        return model(**batch).last_hidden_state.float()


if __name__ == "__main__":
    main()
