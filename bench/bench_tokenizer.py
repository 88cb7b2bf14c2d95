"""Tokenizer throughput: bertkit's pure-Python BertTokenizer against Hugging Face's BertTokenizerFast (Rust).

Batch-encodes real text (GLUE SST-2 dev sentences + SQuAD dev contexts, about 2,900 texts) with both, in
the same process, a few repetitions each; prints ONE JSON line. Figures are texts per second, best of
the repetitions (the least disturbed by other processes). bertkit is timed warm (its chunk cache filled by an earlier pass, as in training,
where the same words recur) and cold (a fresh tokenizer, first pass); Hugging Face's batch encoding
runs on all cores (Rust threads) and is also timed on one (TOKENIZERS_PARALLELISM=false), and the Rust
core is timed alone (`backend_tokenizer.encode_batch`, without building Python lists). Last, one pass
over a stream of Wikipedia paragraphs (``--stream-lines``) with a fresh bertkit tokenizer, where the
cache fills as it goes, as when pre-processing a corpus once.

    .venv/bin/python bench/bench_tokenizer.py --model models/minilm
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

from bertkit.tokenization import BertTokenizer

DEFAULT_DATA = Path(os.environ.get("BERTKIT_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))


def load_texts(data: Path) -> list[str]:
    sst2 = data / "glue" / "SST-2" / "dev.tsv"
    squad = data / "squad" / "dev-v1.1.json"
    for path in (sst2, squad):
        if not path.is_file():
            raise FileNotFoundError(f"{path} not found: pass --data pointing at the shared benchmark data")
    with open(sst2, encoding="utf-8-sig") as f:
        sentences = [line.split("\t")[0] for line in f.read().splitlines()[1:]]
    with open(squad, encoding="utf-8") as f:
        contexts = [p["context"] for a in json.load(f)["data"] for p in a["paragraphs"]]
    return sentences + contexts


def load_stream(data: Path, n_lines: int) -> list[str]:
    """The first ``n_lines`` non-empty lines of the Wikipedia part of the corpus, files in name order."""
    lines: list[str] = []
    for path in sorted((data / "corpus" / "wikipedia").glob("*.md")):
        with open(path, encoding="utf-8") as f:
            lines += [line.rstrip("\n") for line in f if line.strip()]
        if len(lines) >= n_lines:
            break
    return lines[:n_lines]


def hf_reference(vocab_file: Path, do_lower_case: bool):
    import inspect

    from transformers import BertTokenizerFast

    with open(vocab_file, encoding="utf-8") as f:
        vocab = {line.rstrip("\n"): i for i, line in enumerate(f)}
    if (
        "vocab" in inspect.signature(BertTokenizerFast.__init__).parameters
    ):  # transformers 5 ignores vocab_file=
        ref = BertTokenizerFast(vocab=vocab, do_lower_case=do_lower_case)
    else:
        ref = BertTokenizerFast(vocab_file=str(vocab_file), do_lower_case=do_lower_case)
    if len(ref) != len(vocab):
        raise RuntimeError(f"the reference tokenizer did not load {vocab_file}")
    return ref


def rate(fn, n_texts: int, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return n_texts / min(times)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="directory with vocab.txt and tokenizer_config.json")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument(
        "--stream-lines", type=int, default=20000, help="Wikipedia lines for the one-pass figure"
    )
    args = parser.parse_args(argv)

    texts = load_texts(args.data)
    n = len(texts)
    tok = BertTokenizer.from_pretrained(args.model)
    ref = hf_reference(Path(args.model) / "vocab.txt", tok.do_lower_case)

    cold = []
    for _ in range(args.repeats):
        fresh = BertTokenizer.from_pretrained(args.model)
        t0 = time.perf_counter()
        fresh(texts)
        cold.append(time.perf_counter() - t0)
    ours_ids = tok(texts)["input_ids"]  # warms the cache
    result = {
        "bench": "tokenizer",
        "texts": n,
        "chars": sum(map(len, texts)),
        "tokens": sum(map(len, ours_ids)),
        "bertkit_texts_per_s": round(rate(lambda: tok(texts), n, args.repeats)),
        "bertkit_cold_texts_per_s": round(n / min(cold)),
        "bertkit_offsets_texts_per_s": round(
            rate(lambda: tok(texts, return_offsets_mapping=True), n, args.repeats)
        ),
        "bertkit_padded_pt_texts_per_s": round(
            rate(
                lambda: tok(texts, padding=True, truncation=True, max_length=384, return_tensors="pt"),
                n,
                args.repeats,
            )
        ),
    }
    ref(texts)  # warm-up (thread pool)
    result["hf_fast_texts_per_s"] = round(rate(lambda: ref(texts), n, args.repeats))
    result["hf_fast_offsets_texts_per_s"] = round(
        rate(lambda: ref(texts, return_offsets_mapping=True), n, args.repeats)
    )
    # The Rust core alone (Encoding objects, ids not converted to Python lists): where transformers' time goes.
    backend = ref.backend_tokenizer
    result["hf_rust_core_texts_per_s"] = round(rate(lambda: backend.encode_batch(texts), n, args.repeats))
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    result["hf_fast_1thread_texts_per_s"] = round(rate(lambda: ref(texts), n, args.repeats))
    result["ratio"] = round(result["bertkit_texts_per_s"] / result["hf_fast_texts_per_s"], 3)
    result["ratio_1thread"] = round(result["bertkit_texts_per_s"] / result["hf_fast_1thread_texts_per_s"], 3)
    result["ratio_cold"] = round(result["bertkit_cold_texts_per_s"] / result["hf_fast_texts_per_s"], 3)
    result["ratio_offsets"] = round(
        result["bertkit_offsets_texts_per_s"] / result["hf_fast_offsets_texts_per_s"], 3
    )
    result["same_ids"] = ours_ids == ref(texts)["input_ids"]

    # A stream that is seen once (fresh tokenizer, one pass): the cache only helps within the stream.
    stream = load_stream(args.data, args.stream_lines)
    fresh = BertTokenizer.from_pretrained(args.model)
    t0 = time.perf_counter()
    stream_ids = fresh(stream)["input_ids"]
    result["stream_lines"] = len(stream)
    result["bertkit_stream_texts_per_s"] = round(len(stream) / (time.perf_counter() - t0))
    t0 = time.perf_counter()
    result["same_ids"] &= stream_ids == ref(stream)["input_ids"]
    result["hf_fast_1thread_stream_texts_per_s"] = round(len(stream) / (time.perf_counter() - t0))
    result["cpus"] = os.cpu_count()
    result["python"] = platform.python_version()
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    sys.exit(0 if main()["same_ids"] else 1)
