"""Full parity sweep: bertkit's BertTokenizer against Hugging Face's BertTokenizerFast on all shared data.

Every text line of every file under the data directory (GLUE TSVs by their text columns, singly and as
pairs; SQuAD dev contexts, questions and question+context pairs; CoNLL-2003 sentences; every line of the
pre-training corpus), in uncased and cased mode with the same vocab.txt. For every line it compares
input_ids, token_type_ids and offset_mapping (bertkit's offsets path), and input_ids again from the
path without offsets; for GLUE/SQuAD/CoNLL also ``decode`` (with and without special tokens); for
every pair also truncation to 128 and 384 tokens with longest_first, only_first and only_second (where
Hugging Face raises, bertkit must raise ValueError). Prints ONE JSON line with the counts.

    .venv/bin/python bench/tokenizer_parity_sweep.py --model models/minilm --data /work/shared/data
    .venv/bin/python bench/tokenizer_parity_sweep.py --sample 200   # every 200th line: a quick check

Needs `transformers` (the reference); bertkit itself does not.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from bertkit.tokenization import BertTokenizer
from bertkit.tokenization.wordpiece import load_vocab

GLUE_COLUMNS = {  # task: {split: (has_header, text columns)}
    "CoLA": {"train": (False, (3,)), "dev": (False, (3,)), "test": (True, (1,))},
    "SST-2": {"train": (True, (0,)), "dev": (True, (0,)), "test": (True, (1,))},
    "MRPC": {s: (True, (3, 4)) for s in ("train", "dev", "test")},
    "STS-B": {s: (True, (7, 8)) for s in ("train", "dev", "test")},
    "RTE": {s: (True, (1, 2)) for s in ("train", "dev", "test")},
}
BATCH = 2000


def hf_reference(vocab_file: Path, do_lower_case: bool):
    """BertTokenizerFast on ``vocab_file``, checked to really hold that vocabulary.

    transformers 5 takes ``vocab=`` (a dict or path) and silently ignores ``vocab_file=``, which leaves a
    5-token vocabulary; transformers 4 takes ``vocab_file=``. So pass the right one and check.
    """
    import inspect

    from transformers import BertTokenizerFast

    tokens = load_vocab(vocab_file)
    vocab = {t: i for i, t in enumerate(tokens)}
    if "vocab" in inspect.signature(BertTokenizerFast.__init__).parameters:
        ref = BertTokenizerFast(vocab=vocab, do_lower_case=do_lower_case)
    else:
        ref = BertTokenizerFast(vocab_file=str(vocab_file), do_lower_case=do_lower_case)
    if len(ref) != len(vocab) or ref.convert_tokens_to_ids(tokens[-1]) != vocab[tokens[-1]]:
        raise RuntimeError(f"the reference tokenizer did not load {vocab_file} ({len(ref)} tokens)")
    return ref


def _read_lines(path: Path, every: int) -> list[str]:
    with open(path, encoding="utf-8-sig") as f:
        lines = f.read().split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the text after the final newline
    return [line[:-1] if line.endswith("\r") else line for line in lines[::every]]


def iter_groups(data: Path, every: int = 1) -> Iterator[tuple[str, list[str], list[tuple[str, str]]]]:
    """(group name, single texts, pairs) for every file group; ``every``: keep every n-th line."""
    for task, splits in GLUE_COLUMNS.items():
        for split, (header, cols) in splits.items():
            path = data / "glue" / task / f"{split}.tsv"
            rows = [line.split("\t") for line in _read_lines(path, 1)[int(header) :][::every]]
            singles = [row[c] for row in rows for c in cols]
            pairs = [(row[cols[0]], row[cols[1]]) for row in rows] if len(cols) == 2 else []
            yield f"glue/{task}/{split}", singles, pairs
    with open(data / "squad" / "dev-v1.1.json", encoding="utf-8") as f:
        squad = json.load(f)
    paragraphs = [p for article in squad["data"] for p in article["paragraphs"]]
    questions = [(qa["question"], p["context"]) for p in paragraphs for qa in p["qas"]][::every]
    contexts = [p["context"] for p in paragraphs][::every]
    yield "squad/dev", contexts + [q for q, _ in questions], questions
    for split in ("train", "valid", "test"):
        sentences, words = [], []
        for line in _read_lines(data / "conll2003" / f"{split}.txt", 1):
            if not line.strip() or line.startswith("-DOCSTART-"):
                if words:
                    sentences.append(" ".join(words))
                words = []
            else:
                words.append(line.split(" ")[0])
        if words:
            sentences.append(" ".join(words))
        yield f"conll2003/{split}", sentences[::every], []
    for part in ("gutenberg", "wikipedia", "wikitext-2"):
        files = sorted((data / "corpus" / part).iterdir())
        lines = [line for path in files for line in _read_lines(path, every)]
        yield f"corpus/{part}", lines, []


def _batches(items: list, size: int = BATCH) -> Iterator[list]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


def compare_group(
    ours: BertTokenizer, ref, singles: list[str], pairs: list[tuple[str, str]], decode: bool
) -> dict:
    stats = {"texts": len(singles), "pairs": len(pairs), "id_mismatches": 0, "offset_mismatches": 0,
             "fast_path_mismatches": 0, "decode_mismatches": 0, "examples": []}  # fmt: skip

    def note(kind: str, item) -> None:
        stats[kind] += 1
        if len(stats["examples"]) < 5:
            stats["examples"].append({"kind": kind, "input": item})

    for kind, items in (("single", singles), ("pair", pairs)):
        for batch in _batches(items):
            a = [x[0] for x in batch] if kind == "pair" else batch
            b = [x[1] for x in batch] if kind == "pair" else None
            theirs = ref(a, b, return_offsets_mapping=True)
            mine = ours(a, b, return_offsets_mapping=True)
            fast = ours(a, b)["input_ids"]
            for k, item in enumerate(batch):
                if (mine["input_ids"][k] != theirs["input_ids"][k]
                        or mine["token_type_ids"][k] != theirs["token_type_ids"][k]):  # fmt: skip
                    note("id_mismatches", item)
                elif mine["offset_mapping"][k] != [tuple(o) for o in theirs["offset_mapping"][k]]:
                    note("offset_mismatches", item)
                if fast[k] != theirs["input_ids"][k]:
                    note("fast_path_mismatches", item)
            if decode and kind == "single":
                for skip in (True, False):
                    want = ref.batch_decode(theirs["input_ids"], skip_special_tokens=skip)
                    got = ours.batch_decode(theirs["input_ids"], skip_special_tokens=skip)
                    for k in range(len(batch)):
                        if got[k] != want[k]:
                            note("decode_mismatches", batch[k])
    return stats


def compare_truncation(ours: BertTokenizer, ref, pairs: list[tuple[str, str]]) -> dict:
    stats = {"pairs": len(pairs), "checks": 0, "mismatches": 0, "hf_errors": 0, "examples": []}
    for max_length in (128, 384):
        for strategy in ("longest_first", "only_first", "only_second"):
            for batch in _batches(pairs, 500):
                a, b = [x[0] for x in batch], [x[1] for x in batch]
                kw = {"max_length": max_length, "truncation": strategy, "return_offsets_mapping": True}
                try:
                    want = [ref(a, b, **kw)]
                except Exception:  # tokenizers raises a bare Exception; redo one pair at a time
                    want = None
                if want is not None:
                    got = ours(a, b, **kw)
                    results = [(got["input_ids"][k], want[0]["input_ids"][k], got["offset_mapping"][k],
                                [tuple(o) for o in want[0]["offset_mapping"][k]]) for k in range(len(batch))]  # fmt: skip
                else:
                    results = []
                    for x, y in batch:
                        try:
                            w = ref(x, y, **kw)
                            w = (w["input_ids"], [tuple(o) for o in w["offset_mapping"]])
                        except Exception:
                            w = ("error", "error")
                            stats["hf_errors"] += 1
                        try:
                            g = ours(x, y, **kw)
                            g = (g["input_ids"], g["offset_mapping"])
                        except ValueError:
                            g = ("error", "error")
                        results.append((g[0], w[0], g[1], w[1]))
                for k, (gi, wi, go, wo) in enumerate(results):
                    stats["checks"] += 1
                    if gi != wi or go != wo:
                        stats["mismatches"] += 1
                        if len(stats["examples"]) < 5:
                            stats["examples"].append(
                                {"max_length": max_length, "strategy": strategy, "pair": batch[k]}
                            )
    return stats


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="models/minilm", help="directory with vocab.txt")
    parser.add_argument("--data", default="/work/shared/data", help="the shared benchmark data directory")
    parser.add_argument("--sample", type=int, default=1, help="keep every n-th line (1 = everything)")
    parser.add_argument("--modes", default="uncased,cased")
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    vocab_file = Path(args.model) / "vocab.txt"
    result: dict = {"sweep": "tokenizer_parity", "data": str(args.data), "vocab": str(vocab_file),
                    "sample_every": args.sample, "modes": {}}  # fmt: skip
    for mode in args.modes.split(","):
        lower = {"uncased": True, "cased": False}[mode]
        ours = BertTokenizer(vocab_file, do_lower_case=lower)
        ref = hf_reference(vocab_file, lower)
        groups, all_pairs = {}, []
        for name, singles, pairs in iter_groups(Path(args.data), args.sample):
            t = time.perf_counter()
            groups[name] = compare_group(ours, ref, singles, pairs, decode=not name.startswith("corpus"))
            all_pairs += pairs
            print(f"{mode} {name}: {groups[name]['texts']} texts {groups[name]['pairs']} pairs "
                  f"{time.perf_counter() - t:.1f}s", file=sys.stderr, flush=True)  # fmt: skip
        truncation = compare_truncation(ours, ref, all_pairs)
        print(f"{mode} truncation: {truncation['checks']} checks", file=sys.stderr, flush=True)
        keys = ("id_mismatches", "offset_mismatches", "fast_path_mismatches", "decode_mismatches")
        result["modes"][mode] = {
            "lines": sum(g["texts"] + g["pairs"] for g in groups.values()),
            **{k: sum(g[k] for g in groups.values()) for k in keys},
            "truncation_checks": truncation["checks"],
            "truncation_mismatches": truncation["mismatches"],
            "truncation_hf_errors": truncation["hf_errors"],
            "groups": groups,
            "truncation": truncation,
        }
    result["mismatches"] = sum(
        m[k] for m in result["modes"].values()
        for k in ("id_mismatches", "offset_mismatches", "fast_path_mismatches", "decode_mismatches", "truncation_mismatches")
    )  # fmt: skip
    result["wall_s"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(result, ensure_ascii=False))
    return result


if __name__ == "__main__":
    sys.exit(1 if main()["mismatches"] else 0)
