"""Sentence embeddings end to end (text in, unit vectors out: tokenizer, batching, model, pooling) with bertkit's
pipeline beside fastembed and sentence-transformers' backends, on the same sentences and the same MiniLM weights.

Sentences: WikiText-2's validation text (``../shared/data/corpus/wikitext-2/wiki.valid.raw``) split into sentences,
headings dropped, the first ``--sentences`` (10,000 by default; about 30 tokens each), in file order.

Engines (each given the sentence list and asked for one vector per sentence, mean pooling, L2-normalised, every
sentence cut at 256 tokens and every batch padded to its longest):
- ``bertkit-fp32``, ``bertkit-bf16``, ``bertkit-int8``: ``pipeline("sentence-embedding", model, batch_size=32)``
  with ``bf16=True`` or ``quantize="int8"`` for the last two (int8's float parts in bf16 on CPUs with bf16
  instructions, its default there);
- ``fastembed``: ``TextEmbedding("sentence-transformers/all-MiniLM-L6-v2", specific_model_path=DIR)`` where DIR
  holds ``bertkit export onnx``'s graph of the same weights and the tokenizer files (fastembed's own ONNX Runtime
  session, its tokenizer, its batching; ``threads`` set; ``embed(batch_size=32)``: its default of 256 pads a
  batch of sentences to the longest of 256 and ran about 15x slower here);
- ``sentence-transformers-torch``: ``SentenceTransformer(DIR)`` with a mean-pooling and a normalising module;
- ``sentence-transformers-onnx`` / ``-openvino``: the same directory with ``backend="onnx"`` / ``"openvino"``, the
  thread count passed to ONNX Runtime's session options / OpenVINO's ``INFERENCE_NUM_THREADS`` (neither reads
  torch's, and left alone each takes every core). Their
  optimum packages need transformers < 4.58, which the test extra's transformers 5 excludes, so they run in a child
  process of another environment given by ``--st-python`` (made with ``pip install torch==2.13.0
  "sentence-transformers[onnx,openvino]"``); without it these rows are skipped and say why.

Rounds are interleaved (every engine, then again) and the median is reported with the spread; ``min_cos`` is the
worst sentence's cosine to bertkit fp32's vector; ``cores_used`` is the most CPU seconds per wall second of any
round (an engine above its thread count is named on stderr).

    python bench/bench_embeddings.py --threads 1,2 --rounds 3 [--st-python .venv-st/bin/python] [--engines A,B]

Prints one JSON line per engine and thread count.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from workers import Remote

REPO = Path(__file__).resolve().parents[1]
ST_BACKENDS = ("onnx", "openvino")
MAX_LENGTH = 256


def wiki_sentences(data: Path, n: int) -> list[str]:
    text = (data / "corpus" / "wikitext-2" / "wiki.valid.raw").read_text(encoding="utf-8")
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("="):
            continue
        out += [s.strip() for s in re.split(r"(?<=[.!?])\s+(?=[A-Z])", line) if len(s.split()) >= 3]
        if len(out) >= n:
            break
    return out[:n]


def model_dir(model: Path, tmp: Path) -> Path:
    """The checkpoint with what fastembed and sentence-transformers read: model.onnx and the module files of a
    mean-pooled, normalised sentence-transformers model."""
    from bertkit.inference.export import export_onnx

    out = tmp / "st-model"
    shutil.copytree(model, out)
    # every engine cuts at 256 tokens (all-MiniLM-L6-v2's length) and pads a batch to its longest: this tokenizer.json
    # came with padding fixed at 128, which fastembed would otherwise apply to every sentence
    tokenizer = json.loads((out / "tokenizer.json").read_text(encoding="utf-8"))
    tokenizer["padding"] = None
    tokenizer["truncation"] = {"direction": "Right", "max_length": MAX_LENGTH, "strategy": "LongestFirst", "stride": 0}
    (out / "tokenizer.json").write_text(json.dumps(tokenizer), encoding="utf-8")
    config = json.loads((out / "tokenizer_config.json").read_text(encoding="utf-8"))
    (out / "tokenizer_config.json").write_text(json.dumps({**config, "model_max_length": MAX_LENGTH}), encoding="utf-8")
    export_onnx(model, out / "model.onnx", verify=False)
    (out / "onnx").mkdir()
    shutil.copy(out / "model.onnx", out / "onnx" / "model.onnx")  # where sentence-transformers' onnx backend looks
    (out / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]))
    (out / "1_Pooling").mkdir()
    dim = json.loads((model / "config.json").read_text())["hidden_size"]
    (out / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": dim,
                                                               "pooling_mode_mean_tokens": True}))
    (out / "2_Normalize").mkdir()
    (out / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": MAX_LENGTH, "do_lower_case": False}))
    return out


def bertkit_engines(model: Path) -> dict[str, Callable]:
    from bertkit import pipeline
    from bertkit.quantization.kernels import compiled_quantize_per_token

    # timed as a long run embeds a corpus: int8's per-token quantization compiled (kernels.COMPILE_AFTER)
    compiled_quantize_per_token.compile_next()

    engines = {}
    for name, kw in (("bertkit-fp32", {}), ("bertkit-bf16", {"bf16": True}), ("bertkit-int8", {"quantize": "int8"})):
        pipe = pipeline("sentence-embedding", model=str(model), batch_size=32, max_length=MAX_LENGTH, progress=False,
                        **kw)
        engines[name] = lambda texts, pipe=pipe: np.asarray(pipe(texts), dtype=np.float32)
    return engines


def fastembed_engine(directory: Path) -> Callable:
    import torch

    try:
        from fastembed import TextEmbedding
    except ImportError as e:
        raise SystemExit("the fastembed engine needs fastembed, which is not installed: pip install fastembed, or "
                         "leave it out with --engines (e.g. --engines bertkit-bf16,bertkit-int8,"
                         "sentence-transformers-torch)") from e

    models: dict[int, TextEmbedding] = {}

    def run(texts: list[str]) -> np.ndarray:
        threads = torch.get_num_threads()
        if threads not in models:
            models[threads] = TextEmbedding("sentence-transformers/all-MiniLM-L6-v2", specific_model_path=str(directory),
                                            threads=threads)
        return np.stack(list(models[threads].embed(texts, batch_size=32)))
    return run


def st_engine(directory: Path, backend: str = "torch") -> Callable:
    """sentence-transformers on ``backend`` at ``torch.get_num_threads()`` threads. The onnx and openvino backends do
    not read torch's thread count (left alone, ONNX Runtime and OpenVINO take every core), so each thread count gets
    its own model with the count in its session options / ``INFERENCE_NUM_THREADS``."""
    import torch
    from sentence_transformers import SentenceTransformer

    models: dict[int, SentenceTransformer] = {}

    def run(texts: list[str]) -> np.ndarray:
        threads = torch.get_num_threads()
        if threads not in models:
            kwargs = {}
            if backend == "onnx":
                import onnxruntime as ort

                options = ort.SessionOptions()
                options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
                kwargs = {"model_kwargs": {"session_options": options}}
            elif backend == "openvino":
                kwargs = {"model_kwargs": {"ov_config": {"INFERENCE_NUM_THREADS": threads,
                                                         "PERFORMANCE_HINT": "LATENCY"}}}
            models[threads] = SentenceTransformer(str(directory), backend=backend, device="cpu", **kwargs)
        return models[threads].encode(texts, batch_size=32, convert_to_numpy=True)
    return run


def st_worker(python: str, backend: str, directory: Path, sentences: Path) -> Remote:
    """sentence-transformers on ``backend`` in ``python``'s environment (``--worker``): 'embed PATH' saves the
    vectors, 'time THREADS' answers the seconds of one pass over the sentences."""
    return Remote(f"sentence-transformers-{backend}", [python, __file__, "--worker", backend, "--dir", str(directory),
                                                       "--sentences-file", str(sentences)])


def worker(args: argparse.Namespace) -> None:
    import torch

    texts = json.loads(args.sentences_file.read_text())
    engine = st_engine(args.dir, args.worker)
    for line in sys.stdin:
        verb, arg = line.split()
        if verb == "embed":
            np.save(arg, engine(texts))
            print("ok", flush=True)
        else:
            torch.set_num_threads(int(arg))
            t0, c0 = time.perf_counter(), time.process_time()
            engine(texts)
            print(time.perf_counter() - t0, time.process_time() - c0, flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, default=REPO / "models" / "minilm")
    p.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data")
    p.add_argument("--sentences", type=int, default=10_000)
    p.add_argument("--threads", default="1,2")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--st-python", help="a Python whose environment has sentence-transformers' onnx/openvino extras")
    p.add_argument("--engines", default=None, help="comma list: only these engines (bertkit-fp32 always runs)")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--dir", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--sentences-file", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args)
    import torch

    texts = wiki_sentences(args.data, args.sentences)
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        directory = model_dir(args.model, tmp)
        wanted = None if args.engines is None else {"bertkit-fp32", *args.engines.split(",")}
        engines: dict[str, Callable | Remote] = bertkit_engines(args.model)
        # built only when wanted: an engine left out with --engines needs no package (fastembed is optional)
        for name, build in (("fastembed", fastembed_engine), ("sentence-transformers-torch", st_engine)):
            if wanted is None or name in wanted:
                engines[name] = build(directory)
        skipped = {}
        if args.st_python:
            sentences = tmp / "sentences.json"
            sentences.write_text(json.dumps(texts))
            for backend in ST_BACKENDS:
                if wanted is None or f"sentence-transformers-{backend}" in wanted:
                    engines[f"sentence-transformers-{backend}"] = st_worker(args.st_python, backend, directory,
                                                                            sentences)
        else:
            skipped = {f"sentence-transformers-{b}": "no --st-python (optimum needs transformers < 4.58)"
                       for b in ST_BACKENDS}

        if wanted is not None:
            known = {*engines, *skipped, "fastembed", "sentence-transformers-torch",
                     *(f"sentence-transformers-{b}" for b in ST_BACKENDS)}
            unknown = wanted - known
            if unknown:
                raise SystemExit(f"--engines: unknown {sorted(unknown)}; the engines are {sorted(known)}")
            engines = {n: e for n, e in engines.items() if n in wanted}

        def embed(engine) -> np.ndarray:
            if isinstance(engine, Remote):
                engine.ask(f"embed {tmp / 'vectors.npy'}")
                return np.load(tmp / "vectors.npy")
            return engine(texts)

        def one_pass(engine, threads: int) -> tuple[float, float]:
            """(wall seconds, CPU seconds) of one pass: CPU over wall is the cores an engine really used, which
            catches one that ignores the thread count it was given."""
            time.sleep(0.5)  # the last engine's spinning thread pool falls asleep (bench_engines.py says why)
            if isinstance(engine, Remote):
                wall, cpu = engine.ask(f"time {threads}").split()
                return float(wall), float(cpu)
            t0, c0 = time.perf_counter(), time.process_time()
            engine(texts)
            return time.perf_counter() - t0, time.process_time() - c0

        torch.set_num_threads(1)
        ref = embed(engines["bertkit-fp32"])
        ref = ref / np.linalg.norm(ref, axis=1, keepdims=True)
        min_cos = {}
        for n, e in engines.items():
            v = embed(e)
            min_cos[n] = float(((v / np.linalg.norm(v, axis=1, keepdims=True)) * ref).sum(1).min())
        for threads in [int(t) for t in args.threads.split(",")]:
            torch.set_num_threads(threads)
            load_before = os.getloadavg()
            if threads != 1:  # at one thread the pass above (the vectors) was the warm-up
                for e in engines.values():
                    one_pass(e, threads)
            times: dict[str, list[float]] = {n: [] for n in engines}
            cores: dict[str, list[float]] = {n: [] for n in engines}
            for _ in range(args.rounds):
                for n, e in engines.items():
                    wall, cpu = one_pass(e, threads)
                    times[n].append(wall)
                    cores[n].append(cpu / wall)
            base = statistics.median(times["bertkit-fp32"])
            for n, ts in times.items():
                secs = statistics.median(ts)
                used = max(cores[n])
                if used > threads + 0.25:
                    print(f"warning: {n} used {used:.2f} cores at --threads {threads}: its row is not a "
                          f"{threads}-thread figure", file=sys.stderr)
                print(json.dumps({
                    "bench": "embeddings", "engine": n, "threads": threads, "sentences": len(texts),
                    "sentences_per_s": round(len(texts) / secs, 1), "bertkit_fp32_vs_this": round(secs / base, 3),
                    "min_cos": round(min_cos[n], 4), "cores_used": round(used, 2),
                    "spread": round((max(ts) - min(ts)) / secs, 3),
                    "rounds": args.rounds, "load_before": [round(x, 2) for x in load_before],
                    "load_after": [round(x, 2) for x in os.getloadavg()]}), flush=True)
        for n, why in skipped.items():
            print(json.dumps({"bench": "embeddings", "engine": n, "skipped": why}), flush=True)
        for e in engines.values():
            if isinstance(e, Remote):
                e.close()


if __name__ == "__main__":
    main()
