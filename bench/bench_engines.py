"""bertkit against the other CPU inference engines for a BERT encoder, at four input lengths, each engine's
speed beside its accuracy.

Workloads (MiniLM, ``models/minilm``; batches in file order, each padded to its longest row, as a user's file or a
server's batch arrives):
- ``short``: SST-2 dev sentences (``--sentences``, all 872 by default; 25 tokens on average), batch 32, max_length 128;
- ``questions``: SQuAD dev questions alone (``--questions`` of them, 1,024 by default; about 14 tokens), batch 32,
  max_length 128: the shortest texts, where the passes between the products weigh most;
- ``pairs``: SQuAD dev questions each paired with the context sentence that holds the answer, which is how QNLI was
  built (GLUE's QNLI files are not in the shared data); ``--pairs`` of them (about 54 tokens), batch 32, max 128;
- ``windows``: SQuAD dev question + context, truncated to 384 tokens as SQuAD fine-tuning does (the first window of
  each; ``--windows`` of them, about 114 tokens, the longest 384), batch 16.

Engines (each one's last hidden state, mean-pooled over the real tokens, is compared with bertkit fp32's: the
worst row's cosine is ``min_cos``):
- ``bertkit-fp32`` (its Linear layers on oneDNN where ``_hardware.onednn_linear``; ``bertkit-fp32-aten`` /
  ``bertkit-bf16-aten`` the same models on ATen's ``addmm``); ``bertkit-bf16`` (autocast, as ``--bf16``); ``bertkit-int8``
  (``quantize_int8`` with its defaults, calibrated on 256 SST-2 training sentences, as ``bertkit quantize``; what
  stays float in fp32: ``--int8 --no-bf16``, and ``--int8``'s default on CPUs without bf16 instructions);
  ``bertkit-int8-bf16`` (the same int8 model with what stays float under bf16 autocast, as OpenVINO's int8 runs:
  ``--int8``'s default on CPUs with bf16 instructions, measured only there);
- ``ctranslate2-float32`` / ``ctranslate2-int8``: CTranslate2's converter on the checkpoint, its ``Encoder`` (token
  ids without padding in, padded states out) on oneDNN (``CT2_USE_MKL=0``, its default on non-Intel CPUs);
  ``ctranslate2-mkl-float32`` / ``ctranslate2-mkl-int8``: the same on MKL (``CT2_USE_MKL=1``, its Intel default).
  Each runs in a child process that times its own passes when the parent asks, keeping the rounds interleaved:
  CTranslate2 reads ``CT2_USE_MKL`` when it loads, and its OpenMP runtime, loaded beside PyTorch's, slowed
  PyTorch's later two-thread passes by 1.6x;
- ``onnxruntime-fp32``: ``bertkit export onnx``'s graph after ONNX Runtime's transformers optimizer
  (``optimize_model(model_type="bert")``: fused attention, LayerNorm, GELU), what ONNX Runtime's BERT guide does;
  ``onnxruntime-int8``: that graph through ``quantize_dynamic`` (int8 weights per channel, activations per call);
- ``openvino-fp32`` (``INFERENCE_PRECISION_HINT`` pinned to f32: OpenVINO would otherwise run bf16 on a CPU that
  has it), ``openvino-bf16``, ``openvino-int8`` (NNCF's post-training quantization, ``ModelType.TRANSFORMER``, on
  the same 256 calibration sentences; OpenVINO's default precision for what stays float).

Timing: for each thread count, every engine runs every batch of a workload once as a warm-up, then ``--rounds``
interleaved rounds (engine A, B, ... then again) so a busy neighbour falls on all of them alike; the median round is
the figure and ``spread`` is (slowest - fastest) / median. Each pass is also timed in CPU seconds of the process that
ran it (``seq_per_cpu_s``, ``cpu_vs_bertkit_fp32``, ``cpu_spread``): on a machine shared with other work (more
runnable threads than cores) the clock counts the time others ran, the CPU time far less so; at one thread it is
the figure to compare there (at two, it also counts the time a pool's threads spin while they wait). Each pass starts half a second after the one before, so
the thread pools of the engine that ran last (which wait by spinning) have gone to sleep: measured without that
pause, bertkit's two-thread passes ran up to 1.7x slower than alone. The load average before and after is printed.

    python bench/bench_engines.py --threads 1,2 --rounds 5 [--workloads short,questions,pairs,windows] [--engines a,b]

Every line names the CPU class bertkit chose its paths for (``cpu_class``, from ``bertkit._hardware``) and the ISA
limits in force. An AVX2-only CPU is emulated on an AVX-512 one by holding every library to AVX2 (``ISA_LIMITS``):

    ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 FBGEMM_ENABLE_INSTRUCTIONS=AVX2 \
        CT2_FORCE_CPU_ISA=AVX2 python bench/bench_engines.py --threads 1 ...

Needs ``pip install "bertkit[bench]"`` (ctranslate2, onnxruntime, openvino, nncf). Prints one JSON line per
workload, thread count and engine (NNCF's progress lines go to stdout as well: read the lines that start with ``{``).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from bertkit import BertModel, BertTokenizer
from workers import Remote

REPO = Path(__file__).resolve().parents[1]
Batch = dict[str, torch.Tensor]
FEED = ("input_ids", "token_type_ids", "attention_mask")
SETTLE_S = 0.5


# ---------------------------------------------------------------------------------------------------
# Workloads
# ---------------------------------------------------------------------------------------------------


def sst2(data: Path, split: str) -> list[str]:
    with open(data / f"glue/SST-2/{split}.tsv", encoding="utf-8") as f:
        return [r["sentence"] for r in csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)]


def pooled(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    m = mask.unsqueeze(-1).to(hidden.dtype)  # (B, T, 1)
    return (hidden * m).sum(1) / m.sum(1)


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


def squad_questions(data: Path, n: int) -> list[str]:
    squad = json.loads((data / "squad/dev-v1.1.json").read_text(encoding="utf-8"))
    return [qa["question"] for art in squad["data"] for para in art["paragraphs"] for qa in para["qas"]][:n]


def squad_windows(data: Path, n: int) -> list[tuple[str, str]]:
    squad = json.loads((data / "squad/dev-v1.1.json").read_text(encoding="utf-8"))
    rows = [(qa["question"], para["context"]) for art in squad["data"] for para in art["paragraphs"]
            for qa in para["qas"]]
    return rows[:n]


def encode(tok: BertTokenizer, rows: list, batch_size: int, max_length: int) -> list[Batch]:
    batches = []
    for a in range(0, len(rows), batch_size):
        chunk = rows[a:a + batch_size]
        if isinstance(chunk[0], tuple):
            enc = tok([r[0] for r in chunk], [r[1] for r in chunk], truncation="only_second" if max_length > 128
                      else True, max_length=max_length, padding=True, return_tensors="pt")
        else:
            enc = tok(chunk, truncation=True, max_length=max_length, padding=True, return_tensors="pt")
        batches.append({k: enc[k] for k in FEED})
    return batches


def workloads(tok: BertTokenizer, data: Path, sentences: int, questions: int, pairs: int,
              windows: int) -> dict[str, list[Batch]]:
    return {
        "short": encode(tok, sst2(data, "dev")[:sentences], 32, 128),
        "questions": encode(tok, squad_questions(data, questions), 32, 128),
        "pairs": encode(tok, question_sentence_pairs(data, pairs), 32, 128),
        "windows": encode(tok, squad_windows(data, windows), 16, 384),
    }


# ---------------------------------------------------------------------------------------------------
# Engines: each a callable batch -> (B, T, H) last hidden state; thread count read from torch at call time
# ---------------------------------------------------------------------------------------------------


def bertkit_engines(model_dir: Path, calibration: list[Batch]) -> dict[str, Callable]:
    from unittest.mock import patch

    from bertkit._hardware import cpu_has_bf16, onednn_linear
    from bertkit.inference import prepare
    from bertkit.quantization import quantize_int8
    from bertkit.quantization.kernels import compiled_quantize_per_token

    # timed as a long run or a server runs int8: its per-token quantization compiled (kernels.COMPILE_AFTER)
    compiled_quantize_per_token.compile_next()

    plain = BertModel.from_pretrained(model_dir).eval()
    int8 = quantize_int8(plain, calibration=calibration)
    # each as prepare_model makes it for CPU inference (what pipelines and commands run)
    fp32, bf16 = prepare.for_cpu_inference(plain, bf16=False), prepare.for_cpu_inference(plain, bf16=True)
    int8, int8_bf16 = prepare.for_cpu_inference(int8, bf16=False), prepare.for_cpu_inference(int8, bf16=True)

    def under_bf16(model: BertModel) -> Callable:
        def run(b: Batch) -> torch.Tensor:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return model(**b).last_hidden_state
        return run

    engines = {"bertkit-fp32": lambda b: fp32(**b).last_hidden_state, "bertkit-bf16": under_bf16(bf16),
               "bertkit-int8": lambda b: int8(**b).last_hidden_state}
    if onednn_linear():  # the Linear layers on ATen's addmm (MKL in fp32), as before oneDNN's was the default
        with patch.object(prepare, "onednn_linear", lambda: False):
            fp32_aten, bf16_aten = (prepare.for_cpu_inference(plain, bf16=x) for x in (False, True))
        engines["bertkit-fp32-aten"] = lambda b: fp32_aten(**b).last_hidden_state
        engines["bertkit-bf16-aten"] = under_bf16(bf16_aten)
    if cpu_has_bf16():
        engines["bertkit-int8-bf16"] = under_bf16(int8_bf16)
    return engines


def onnx_files(model_dir: Path, tmp: Path) -> tuple[Path, Path, Path]:
    """bertkit's export (plain), the same after ONNX Runtime's BERT optimizer (fused), and that quantized (int8)."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.transformers import optimizer

    from bertkit import BertConfig
    from bertkit.inference.export import export_onnx

    plain, fused, int8 = tmp / "plain.onnx", tmp / "fused.onnx", tmp / "fused-int8.onnx"
    if not plain.exists():
        export_onnx(model_dir, plain, verify=False)
        config = BertConfig.from_pretrained(model_dir)
        optimizer.optimize_model(str(plain), model_type="bert", num_heads=config.num_attention_heads,
                                 hidden_size=config.hidden_size).save_model_to_file(str(fused))
        # the fused graph's com.microsoft ops defeat shape inference: name float32 as the type it cannot infer
        quantize_dynamic(str(fused), str(int8), weight_type=QuantType.QInt8, per_channel=True,
                         extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
    return plain, fused, int8


def onnxruntime_engine(path: Path) -> Callable:
    """ONNX Runtime on the graph at ``path``: one session per thread count (intra-op threads = torch's)."""
    import onnxruntime as ort

    sessions: dict[int, ort.InferenceSession] = {}

    def run(b: Batch) -> torch.Tensor:
        threads = torch.get_num_threads()
        if threads not in sessions:
            opts = ort.SessionOptions()
            opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
            sessions[threads] = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        return torch.from_numpy(sessions[threads].run(["last_hidden_state"], {k: b[k].numpy() for k in FEED})[0])
    return run


def openvino_engines(plain: Path, calibration: list[Batch]) -> dict[str, Callable]:
    import nncf
    import openvino as ov

    core = ov.Core()
    model = core.read_model(str(plain))
    feeds = [{k: b[k].numpy() for k in FEED} for b in calibration]
    # NNCF counts dataset items: 8 batches of 32 sentences, every one used
    quantized = nncf.quantize(model, nncf.Dataset(feeds), model_type=nncf.ModelType.TRANSFORMER,
                              subset_size=len(feeds))

    def make(graph, hint: str | None) -> Callable:
        requests: dict[int, object] = {}

        def run(b: Batch) -> torch.Tensor:
            threads = torch.get_num_threads()
            if threads not in requests:
                config = {"INFERENCE_NUM_THREADS": threads, "PERFORMANCE_HINT": "LATENCY"}
                if hint:
                    config["INFERENCE_PRECISION_HINT"] = hint
                compiled = core.compile_model(graph, "CPU", config)
                requests[threads] = (compiled.create_infer_request(), compiled.output("last_hidden_state"))
            request, out = requests[threads]
            return torch.from_numpy(request.infer({k: b[k].numpy() for k in FEED})[out].copy())
        return run

    return {"openvino-fp32": make(model, "f32"), "openvino-bf16": make(model, "bf16"),
            "openvino-int8": make(quantized, None)}


# Environment variables that hold a library below the CPU's ISA: all five together emulate an AVX2-only CPU on an
# AVX-512 one (PyTorch's ATen kernels; oneDNN, PyTorch's and CTranslate2's; MKL, PyTorch's addmm and CTranslate2's
# with CT2_USE_MKL=1; fbgemm, PyTorch's int8 on AVX2; CTranslate2's own kernels). Without the last two, MKL's sgemm
# and fbgemm's int8 GEMM still run their AVX-512 (VNNI) kernels under ATEN_CPU_CAPABILITY=avx2.
ISA_LIMITS = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS", "FBGEMM_ENABLE_INSTRUCTIONS",
              "CT2_FORCE_CPU_ISA")
CT2_ENGINES = ("ctranslate2-float32", "ctranslate2-int8", "ctranslate2-mkl-float32", "ctranslate2-mkl-int8")


def convert_ctranslate2(model_dir: Path, tmp: Path) -> None:
    import ctranslate2

    ctranslate2.converters.TransformersConverter(str(model_dir)).convert(str(tmp / "ct2"), quantization="float32")


def ctranslate2_engine(name: str, tmp: Path) -> Callable:
    """CTranslate2's ``Encoder`` on the converted checkpoint at ``name``'s compute type (in a ``--worker``)."""
    import ctranslate2

    out = tmp / "ct2"
    compute_type = name.rsplit("-", 1)[1]

    encoders: dict[int, ctranslate2.Encoder] = {}

    def run(b: Batch) -> torch.Tensor:
        threads = torch.get_num_threads()
        if threads not in encoders:
            encoders[threads] = ctranslate2.Encoder(str(out), device="cpu", compute_type=compute_type,
                                                    intra_threads=threads, inter_threads=1)
        lengths = b["attention_mask"].sum(1).tolist()
        ids = [row[:n].tolist() for row, n in zip(b["input_ids"], lengths)]
        types = [row[:n].tolist() for row, n in zip(b["token_type_ids"], lengths)]
        result = encoders[threads].forward_batch(ids, token_type_ids=types)
        return torch.from_numpy(np.asarray(result.last_hidden_state))
    return run


# ---------------------------------------------------------------------------------------------------
# CTranslate2 runs in child processes: it reads CT2_USE_MKL when it loads, and in the benchmark's own process its
# OpenMP runtime slowed every later two-thread PyTorch pass by 1.6x (bertkit bf16 on 12 SST-2 batches: 0.43 s
# before its first call, 0.67 s after, with the pause between passes); the child times its own passes when asked
# ---------------------------------------------------------------------------------------------------


def ctranslate2_worker(name: str, model_dir: Path, tmp: Path, batches_file: Path) -> Remote:
    """CTranslate2 engine ``name`` in a child process (``--worker``), ``CT2_USE_MKL=1`` for the ``-mkl-`` rows (its
    default on Intel CPUs) and ``CT2_USE_MKL=0`` otherwise (oneDNN, its default on every other CPU, AMD's included):
    ``pooled`` and ``time`` are answered there."""
    cmd = [sys.executable, __file__, "--worker", name, "--model", str(model_dir), "--tmp", str(tmp),
           "--batches", str(batches_file)]
    return Remote(name, cmd, {**os.environ, "CT2_USE_MKL": "1" if "mkl" in name else "0"})


def worker(args: argparse.Namespace) -> None:
    """Serve one engine over stdin/stdout: 'pooled WORKLOAD PATH' saves its pooled outputs, 'time WORKLOAD THREADS'
    answers the seconds of one pass (the first call at a thread count builds the engine)."""
    batches = torch.load(args.batches)
    name = args.worker
    engine = ctranslate2_engine(name, args.tmp)
    for line in sys.stdin:
        verb, workload, arg = line.split()
        if verb == "pooled":
            torch.save(torch.cat([pooled(engine(b), b["attention_mask"]) for b in batches[workload]]), arg)
            print("ok", flush=True)
        else:
            torch.set_num_threads(int(arg))
            print(*time_pass(engine, batches[workload]), flush=True)


def time_pass(engine: Callable, batches: list[Batch]) -> tuple[float, float]:
    """Seconds of one pass: on the clock, and of CPU time used by this process (every thread of it: the engine's
    own pool included). On a machine shared with other work the CPU time is what the pass cost; the clock also
    counts the time the scheduler gave to others."""
    t0, c0 = time.perf_counter(), time.process_time()
    for b in batches:
        engine(b)
    return time.perf_counter() - t0, time.process_time() - c0


# ---------------------------------------------------------------------------------------------------


def one_pass(engine: Callable | Remote, workload: str, batches: list[Batch], threads: int) -> tuple[float, float]:
    # The engine that ran before may leave its thread pool spinning (OpenMP's, ONNX Runtime's, TBB's wait by
    # spinning for up to ~200 ms): on two cores that would take a core from this pass. Let them fall asleep first.
    time.sleep(SETTLE_S)
    if isinstance(engine, Remote):
        wall, cpu = engine.ask(f"time {workload} {threads}").split()
        return float(wall), float(cpu)
    return time_pass(engine, batches)


def machine_record() -> dict:
    """What every JSON line says about the machine: the CPU class bertkit's paths were chosen for
    (``_hardware.cpu_class``, the probes the code itself asks, so an emulated AVX2 run says ``avx2``), PyTorch's kernel
    capability, the CPU's name, and the environment variables that held a library to a narrower ISA (the emulation)."""
    from bertkit._hardware import cpu_class

    name = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                 if line.startswith("model name")), "") if Path("/proc/cpuinfo").is_file() else ""
    return {"cpu_class": cpu_class(), "cpu_capability": torch.backends.cpu.get_cpu_capability(), "cpu": name,
            "isa_limits": {k: os.environ[k] for k in ISA_LIMITS if os.environ.get(k)}}


def measure(engines: dict, data: dict[str, list[Batch]], threads: list[int], rounds: int, tmp: Path) -> None:
    machine = machine_record()
    for workload, batches in data.items():
        rows = sum(len(b["input_ids"]) for b in batches)
        tokens = sum(int(b["attention_mask"].sum()) for b in batches)
        with torch.inference_mode():
            outputs = {}
            for name, engine in engines.items():
                if isinstance(engine, Remote):
                    path = tmp / f"{name}-{workload}.pt"
                    engine.ask(f"pooled {workload} {path}")
                    outputs[name] = torch.load(path)
                else:
                    outputs[name] = torch.cat([pooled(engine(b), b["attention_mask"]) for b in batches])
            ref = outputs["bertkit-fp32"]
            min_cos = {n: float(F.cosine_similarity(o.float(), ref).min()) for n, o in outputs.items()}
            for t in threads:
                torch.set_num_threads(t)

                load_before = os.getloadavg()
                for name in engines:
                    one_pass(engines[name], workload, batches, t)  # warm-up: sessions built at this thread count, caches filled
                times: dict[str, list[tuple[float, float]]] = {name: [] for name in engines}
                for _ in range(rounds):
                    for name in engines:
                        times[name].append(one_pass(engines[name], workload, batches, t))
                base, base_cpu = (statistics.median(x) for x in zip(*times["bertkit-fp32"]))
                for name, passes in times.items():
                    ts, cpus = zip(*passes)
                    secs, cpu = statistics.median(ts), statistics.median(cpus)
                    print(json.dumps({
                        "bench": "engines", "workload": workload, "threads": t, "engine": name, "rows": rows,
                        "mean_tokens": round(tokens / rows, 1), "seq_per_s": round(rows / secs, 1),
                        "vs_bertkit_fp32": round(base / secs, 3), "min_cos": round(min_cos[name], 4),
                        "spread": round((max(ts) - min(ts)) / secs, 3), "seq_per_cpu_s": round(rows / cpu, 1),
                        "cpu_vs_bertkit_fp32": round(base_cpu / cpu, 3), "cpu_spread": round((max(cpus) - min(cpus)) / cpu, 3),
                        "rounds": rounds,
                        "load_before": [round(x, 2) for x in load_before],
                        "load_after": [round(x, 2) for x in os.getloadavg()],
                        **machine,
                    }), flush=True)


def require(engines: str, *packages: str) -> None:
    """Refuse, before minutes of export and calibration, engines whose package is not installed."""
    import importlib.util

    missing = [name for name in packages if importlib.util.find_spec(name) is None]
    if missing:
        raise SystemExit(f"the {engines} engines need {', '.join(missing)}, not installed: pip install "
                         f"\"bertkit[bench]\", or leave them out with --engines (e.g. --engines "
                         f"bertkit-bf16,bertkit-int8,onnxruntime-fp32,onnxruntime-int8)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, default=REPO / "models" / "minilm")
    p.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--sentences", type=int, default=872, help="SST-2 dev sentences in the short workload (872: all)")
    p.add_argument("--questions", type=int, default=1024, help="SQuAD dev questions in the questions workload")
    p.add_argument("--pairs", type=int, default=512, help="question/sentence pairs in the pairs workload")
    p.add_argument("--windows", type=int, default=128, help="SQuAD windows in the windows workload")
    p.add_argument("--workloads", default="short,questions,pairs,windows")
    p.add_argument("--engines", default=None, help="comma list: only these engines (bertkit-fp32 always runs)")
    p.add_argument("--no-mkl", action="store_true", help="skip the CT2_USE_MKL=1 rows")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--tmp", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--batches", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args)
    tok = BertTokenizer.from_pretrained(args.model)
    data = workloads(tok, args.data, args.sentences, args.questions, args.pairs, args.windows)
    data = {w: data[w] for w in args.workloads.split(",")}
    from bertkit.quantization import calibration_batches
    calibration = calibration_batches(tok, sst2(args.data, "train")[:256])
    wanted = None if args.engines is None else {"bertkit-fp32", *args.engines.split(",")}

    for prefix, packages in (("onnxruntime", ("onnx", "onnxruntime")), ("openvino", ("openvino", "nncf")),
                             ("ctranslate2", ("ctranslate2",))):
        if wanted is None or any(n.startswith(prefix) for n in wanted):
            require(prefix, *packages)
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        engines: dict[str, Callable | Remote] = dict(bertkit_engines(args.model, calibration))
        # the other engines are built only when wanted (an ONNX export and NNCF's calibration take minutes)
        if wanted is None or any(n.startswith(("onnxruntime", "openvino")) for n in wanted):
            files = onnx_files(args.model, tmp)
            engines.update({"onnxruntime-fp32": onnxruntime_engine(files[1]),
                            "onnxruntime-int8": onnxruntime_engine(files[2])})
        if wanted is None or any(n.startswith("openvino") for n in wanted):
            engines.update(openvino_engines(files[0], calibration))
        if wanted is None or any(n.startswith("ctranslate2") for n in wanted):
            convert_ctranslate2(args.model, tmp)
        batches_file = tmp / "batches.pt"
        torch.save(data, batches_file)
        for n in CT2_ENGINES if not args.no_mkl else CT2_ENGINES[:2]:
            if wanted is None or n in wanted:
                engines[n] = ctranslate2_worker(n, args.model, tmp, batches_file)
        if wanted is not None:
            unknown = wanted - set(engines)
            if unknown:
                raise SystemExit(f"--engines: unknown {sorted(unknown)}; the engines are {sorted(engines)}")
            engines = {n: e for n, e in engines.items() if n in wanted}
        try:
            measure(engines, data, [int(t) for t in args.threads.split(",")], args.rounds, tmp)
        finally:
            for e in engines.values():
                if isinstance(e, Remote):
                    e.close()


if __name__ == "__main__":
    main()
