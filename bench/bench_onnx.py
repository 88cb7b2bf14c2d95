"""The question/sentence-pair workload of ``bench_engines.py``: SQuAD v1.1 dev questions, each paired with the
sentence of its context that holds the answer (QNLI's construction), in file order.

ONNX Runtime itself is timed by ``bench_engines.py`` (fp32 with its BERT fusions, and int8); the standalone
ONNX Runtime benchmark that lived here is at commit 4403231.
"""

from __future__ import annotations

import json
import re
from pathlib import Path


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
