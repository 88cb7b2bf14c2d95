"""What one request can cost ``bertkit serve``: peak RSS, time and answer size per request kind, against its
body size, on 127.0.0.1 only. Bounded: one request per kind (plus a warm-up), each server its own process,
stopped after its kind (SIGTERM, then SIGKILL after 60 s), each request at most ``--client-timeout`` s.

Kinds: the largest request each limit admits (question-answering at max_windows_per_request windows,
fill-mask at max_candidates candidates, text-classification at max_items texts near max_body_bytes) and the attacks the limits refuse (a 330 KB question-answering body at
a step of 1 token between windows, fill-mask top_k 100,000 on 20 masks, a body nested 500,000 lists deep). MiniLM's encoder with a
seeded random head per task; the server's peak RSS is read from /proc (VmHWM, reset before the request).

    .venv/bin/python bench/bench_serve_limits.py --model models/minilm

Prints one JSON line: per kind the status, seconds, body and answer bytes, and the server's RSS before the
request and at its peak during it (MB).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_serve import free_port, start

ROOT = Path(__file__).resolve().parents[1]
WORDS = ("the norman dynasty had a major political cultural and military impact on medieval europe and the near "
         "east normans were famed for their martial spirit and eventually for their christian piety").split()


def text(n_words: int, seed: int = 0) -> str:
    return " ".join(WORDS[(i * 7 + seed) % len(WORDS)] for i in range(n_words))


def make(model: Path, out: Path, head: str) -> Path:
    import torch

    from bertkit import heads
    from bertkit.tokenization import BertTokenizer

    torch.manual_seed(0)
    getattr(heads, head).from_pretrained(model).save_pretrained(out)
    BertTokenizer.from_pretrained(model).save_pretrained(out)
    return out


def rss_mb(pid: int, field: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return round(int(line.split()[1]) / 1024, 1)
    raise RuntimeError(f"no {field} in /proc/{pid}/status")


def kinds() -> list[tuple[str, str, str, bytes]]:
    """(name, head, task, body)."""
    qa_context = text(3200)[:19_500]
    return [
        ("qa: 16 questions x 15 windows (240; max_windows_per_request 256)", "BertForQuestionAnswering",
         "question-answering",
         json.dumps({"inputs": [{"question": "who led them?", "context": text(2150, s)} for s in range(16)]}).encode()),
        # doc_stride is the overlap between windows: 506 of the 507 context tokens a window holds is a step of 1
        ("qa attack: 330 KB, 17 contexts at a step of 1 (refused)", "BertForQuestionAnswering", "question-answering",
         json.dumps({"inputs": [{"question": "who?", "context": qa_context} for _ in range(17)],
                     "parameters": {"doc_stride": 506}}).encode()),
        ("fill-mask: 200 [MASK]s x top_k 5 (1,000, the default max_candidates)", "BertForMaskedLM", "fill-mask",
         json.dumps({"inputs": [" ".join(["[MASK] " + text(40, s)] * 5) for s in range(40)],
                     "parameters": {"top_k": 5}}).encode()),
        ("fill-mask attack: top_k 100,000 on 20 masks (refused)", "BertForMaskedLM", "fill-mask",
         json.dumps({"inputs": " ".join(["[MASK]"] * 20), "parameters": {"top_k": 100_000}}).encode()),
        ("text-classification: 64 texts of 2,500 words (~1 MB body)", "BertForSequenceClassification",
         "text-classification", json.dumps({"inputs": [text(2500, s)[:15_000] for s in range(64)]}).encode()),
        ("nesting attack: 499,000 lists deep (refused)", "BertForSequenceClassification", "text-classification",
         b"[" * 499_000 + b"]" * 499_000),
    ]


def main() -> None:
    import httpx

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=ROOT / "models" / "minilm")
    parser.add_argument("--threads", type=int, default=None, help="OMP_NUM_THREADS of the server")
    parser.add_argument("--client-timeout", type=float, default=300.0)
    parser.add_argument("--only", default=None, help="run the kinds whose name holds this text")
    args = parser.parse_args()
    selected = [kind for kind in kinds() if not args.only or args.only in kind[0]]
    if not selected:  # ran nothing and printed "rows": [] (exit 0)
        raise SystemExit(f"--only {args.only!r} is in no kind's name; the kinds: "
                         + "; ".join(kind[0] for kind in kinds()))
    rows = []
    with tempfile.TemporaryDirectory(prefix="bertkit-serve-limits-") as tmp:
        made: dict[str, Path] = {}
        for name, head, task, body in selected:
            if head not in made:
                made[head] = make(args.model, Path(tmp) / head, head)
            port = free_port()
            proc = start([sys.executable, "-m", "bertkit", "serve", "--model", str(made[head]), "--task", task,
                          "--port", str(port), "--log-level", "warning"],
                         port, args.threads)
            try:
                url = f"http://127.0.0.1:{port}/predict"
                warm = {"question-answering": {"question": "q", "context": "c"}, "fill-mask": "a [MASK] ."}.get(task, "warm")
                httpx.post(url, json={"inputs": warm}, timeout=60).raise_for_status()
                Path(f"/proc/{proc.pid}/clear_refs").write_text("5")  # resets VmHWM, the peak RSS
                before = rss_mb(proc.pid, "VmRSS")
                t0 = time.perf_counter()
                r = httpx.post(url, content=body, headers={"content-type": "application/json"},
                               timeout=args.client_timeout)
                seconds = time.perf_counter() - t0
                row = {"kind": name, "status": r.status_code, "seconds": round(seconds, 2),
                       "body_bytes": len(body), "answer_bytes": len(r.content), "rss_before_mb": before,
                       "rss_peak_mb": rss_mb(proc.pid, "VmHWM"),
                       "error": r.json().get("error", "")[:160] if r.status_code != 200 else ""}
            finally:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(60)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    print(json.dumps({"bench": "serve_limits", "threads": args.threads, "cpus": os.cpu_count(),
                      "load_avg": os.getloadavg(), "rows": rows}))


if __name__ == "__main__":
    main()
