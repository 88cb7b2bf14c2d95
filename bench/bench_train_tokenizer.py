"""Learn a WordPiece vocabulary with bertkit and with Hugging Face ``tokenizers``, side by side.

Both train on the same files (the shared corpus's gutenberg/ and wikipedia/, never WikiText-2) with the
same size, min_frequency, lower-casing and alphabet limit; each runs in its own process so that wall
time and peak resident memory (summed over the process and its children, sampled every 50 ms from
/proc) are its own. Both vocabularies are then used by bertkit's WordPiece tokenizer on the held-out
WikiText-2 validation text, and sub-word tokens per word (word = basic-tokenizer token) are compared.

    .venv/bin/python bench/bench_train_tokenizer.py --out runs/vocab-30522   # full corpus, 30,522 entries
    .venv/bin/python bench/bench_train_tokenizer.py --max-files 50          # a quick look

Prints one JSON line. The bertkit vocabulary is kept in --out (default runs/bench-train-tokenizer).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def corpus_files(corpus: Path, max_files: int | None) -> list[str]:
    files = sorted(str(p) for p in (corpus / "gutenberg").glob("*.txt"))
    files += sorted(str(p) for p in (corpus / "wikipedia").glob("*.md"))
    if not files:
        raise FileNotFoundError(f"no gutenberg/*.txt or wikipedia/*.md under {corpus}")
    return files[:max_files] if max_files else files


def tree_rss_bytes(root: int) -> int:
    """Resident memory of ``root`` and all its descendants, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    total, stack = 0, [root]
    page = os.sysconf("SC_PAGE_SIZE")
    while stack:
        pid = stack.pop()
        stack.extend(children.get(pid, []))
        try:
            with open(f"/proc/{pid}/statm") as f:
                total += int(f.read().split()[1]) * page
        except OSError:
            pass
    return total


def run_measured(cmd: list[str]) -> dict:
    """Run ``cmd``; return its wall time, CPU time (it and its reaped children), peak tree RSS and the
    JSON it printed last. CPU time next to wall time shows how much the machine's other load slowed it."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, cwd=ROOT)
    peak = 0
    done = threading.Event()

    def sample():
        nonlocal peak
        while not done.is_set():
            peak = max(peak, tree_rss_bytes(proc.pid))
            done.wait(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, _ = proc.communicate()
    done.set()
    sampler.join()
    seconds = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited with {proc.returncode}")
    return {"seconds": round(seconds, 2), "cpu_seconds": round(cpu, 2), "peak_rss_mb": round(peak / 2**20, 1),
            **json.loads(out.splitlines()[-1])}


def train_bertkit(files: list[str], out: str, vocab_size: int, min_frequency: int, lowercase: bool, workers: int):
    from bertkit.tokenization import BertTokenizer
    from bertkit.tokenization.trainer import train_wordpiece_vocab

    vocab = train_wordpiece_vocab(files, vocab_size, min_frequency, lowercase, num_workers=workers, progress=False)
    BertTokenizer(vocab, do_lower_case=lowercase).save_pretrained(out)
    print(json.dumps({"vocab_size": len(vocab)}))


def train_hf(files: list[str], out: str, vocab_size: int, min_frequency: int, lowercase: bool):
    from tokenizers import BertWordPieceTokenizer

    tok = BertWordPieceTokenizer(clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=lowercase)
    tok.train(files, vocab_size=vocab_size, min_frequency=min_frequency, limit_alphabet=1000,
              special_tokens=SPECIALS, show_progress=False, wordpieces_prefix="##")
    Path(out).mkdir(parents=True, exist_ok=True)
    tok.save_model(out)
    print(json.dumps({"vocab_size": tok.get_vocab_size()}))


def fertility(vocab_dir: str, heldout: Path, lowercase: bool) -> dict:
    from bertkit.tokenization import BasicTokenizer, BertTokenizer

    tok = BertTokenizer(Path(vocab_dir) / "vocab.txt", do_lower_case=lowercase)
    basic = BasicTokenizer(do_lower_case=lowercase)
    words = pieces = unk = 0
    with open(heldout, encoding="utf-8") as f:
        for line in f:
            words += len(basic.tokenize(line))
            ids = tok(line, add_special_tokens=False)["input_ids"]
            pieces += len(ids)
            unk += ids.count(tok.unk_token_id)
    return {"words": words, "pieces": pieces, "pieces_per_word": round(pieces / words, 5),
            "unk_rate": round(unk / pieces, 6)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", type=Path, default=Path("/work/shared/data/corpus"))
    p.add_argument("--heldout", type=Path, default=None, help="default: CORPUS/wikitext-2/wiki.valid.raw")
    p.add_argument("--vocab-size", type=int, default=30522)
    p.add_argument("--min-frequency", type=int, default=2)
    p.add_argument("--cased", action="store_true")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--max-files", type=int, default=None)
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "bench-train-tokenizer")
    p.add_argument("--model", default=None, help="unused; accepted because `make bench` passes it")
    p.add_argument("--_train", choices=["bertkit", "hf"], help=argparse.SUPPRESS)
    p.add_argument("--_dir", help=argparse.SUPPRESS)
    args = p.parse_args()
    lowercase = not args.cased
    files = corpus_files(args.corpus, args.max_files)

    if args._train == "bertkit":
        return train_bertkit(files, args._dir, args.vocab_size, args.min_frequency, lowercase, args.workers)
    if args._train == "hf":
        return train_hf(files, args._dir, args.vocab_size, args.min_frequency, lowercase)

    heldout = args.heldout or args.corpus / "wikitext-2" / "wiki.valid.raw"
    common = [sys.executable, __file__, "--corpus", str(args.corpus), "--vocab-size", str(args.vocab_size),
              "--min-frequency", str(args.min_frequency), "--workers", str(args.workers)]
    common += ["--cased"] if args.cased else []
    common += ["--max-files", str(args.max_files)] if args.max_files else []
    with tempfile.TemporaryDirectory() as hf_dir:
        bertkit = run_measured(common + ["--_train", "bertkit", "--_dir", str(args.out)])
        hf = run_measured(common + ["--_train", "hf", "--_dir", hf_dir])
        bertkit.update(fertility(str(args.out), heldout, lowercase))
        hf.update(fertility(hf_dir, heldout, lowercase))
        from bertkit.tokenization import load_vocab

        ours, theirs = load_vocab(args.out / "vocab.txt"), load_vocab(Path(hf_dir) / "vocab.txt")
        overlap = len(set(ours) & set(theirs)) / len(theirs)
    rel = bertkit["pieces_per_word"] / hf["pieces_per_word"] - 1
    print(json.dumps({
        "bench": "train_tokenizer",
        "files": len(files),
        "corpus_bytes": sum(os.path.getsize(f) for f in files),
        "heldout": str(heldout),
        "vocab_size": args.vocab_size, "min_frequency": args.min_frequency, "lowercase": lowercase,
        "workers": args.workers,
        "bertkit": bertkit, "tokenizers": hf,
        "pieces_per_word_rel_diff": round(rel, 5), "within_2pct": abs(rel) <= 0.02,
        "vocab_overlap": round(overlap, 4),
        "vocab_dir": str(args.out),
    }))


if __name__ == "__main__":
    main()
