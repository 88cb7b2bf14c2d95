"""The fp32-vs-int8 table of experiments/int8_accuracy.sh: each task's dev metrics from the same fine-tuned
model predicted twice, the difference, whether it is within the 0.5-point bar, and how many predictions
are identical (GLUE labels, NER tags, SQuAD answer strings; STS-B scores within 0.05).

    python experiments/int8_accuracy_table.py --runs runs/int8-accuracy

Prints the markdown table, then one JSON line per task.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
from pathlib import Path

# task -> (metrics to show, primary metric); metrics are the reports' fractions, shown x100
TASKS = {
    "sst2": (("accuracy",), "accuracy"),
    "mrpc": (("accuracy", "f1"), "f1"),
    "stsb": (("pearson", "spearman"), "pearson"),
    "ner": (("f1",), "f1"),
    "squad": (("exact_match", "f1"), "f1"),
}
BAR = 0.5  # points


def _report(run: Path) -> dict:
    path = run / "report.json"
    if not path.is_file():
        raise SystemExit(f"{path} is missing: run experiments/int8_accuracy.sh first (it resumes)")
    return json.loads(path.read_text(encoding="utf-8"))


def _predictions(task: str, run: Path, report: dict) -> list:
    """Comparable per-example predictions of one arm."""
    if task == "ner":  # conlleval lines "word gold pred"; blank lines between sentences
        lines = (run / "predictions.txt").read_text(encoding="utf-8").splitlines()
        return [line.split()[-1] for line in lines if line.strip() and not line.startswith("-DOCSTART-")]
    if task == "squad":
        answers = json.loads((run / "predictions.json").read_text(encoding="utf-8"))
        return [answers[k] for k in sorted(answers)]
    with open(report["file"], encoding="utf-8", newline="") as f:  # GLUE submission TSV: index, prediction
        rows = list(csv.reader(f, delimiter="\t"))[1:]
    return [r[1] if task != "stsb" else float(r[1]) for r in rows]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=Path, default=Path("runs/int8-accuracy"))
    parser.add_argument("--arm", choices=("int8", "saved", "fast", "int8bf16", "fastbf16"), default="int8",
                        help="int8: `--int8` on the float model; saved: the `bertkit quantize` directory; "
                             "fast: the `bertkit quantize --fast` directory (these three with `--no-bf16`); int8bf16 / "
                             "fastbf16: the int8 and fast arms under `--bf16`")
    args = parser.parse_args()
    lines, records = [], []
    for task, (metrics, primary) in TASKS.items():
        fp32, int8 = _report(args.runs / f"fp32-{task}"), _report(args.runs / f"{args.arm}-{task}")
        if int8.get("quantize") != "int8" or fp32.get("quantize") == "int8":
            raise SystemExit(f"{task}: the reports do not record fp32 and int8 (quantize: "
                             f"{fp32.get('quantize')!r}, {int8.get('quantize')!r})")
        expected = "bfloat16" if args.arm.endswith("bf16") else "float32"
        if int8.get("float_dtype", expected) != expected:  # reports written before the key existed have none
            raise SystemExit(f"{task}: the {args.arm} arm's float parts ran in {int8['float_dtype']}, not {expected}: "
                             f"delete {args.runs / f'{args.arm}-{task}'} and run experiments/int8_accuracy.sh again")
        a = _predictions(task, args.runs / f"fp32-{task}", fp32)
        b = _predictions(task, args.runs / f"{args.arm}-{task}", int8)
        if task == "stsb":  # a score on 0-5: how far int8's moves from fp32's
            diffs = [abs(x - y) for x, y in zip(a, b, strict=True)]
            same = sum(d <= 0.05 for d in diffs)
            row = {"task": task, "n": len(a), "within_0.05": same, "max_abs_diff": round(max(diffs), 4)}
        else:
            same = sum(x == y for x, y in zip(a, b, strict=True))
            row = {"task": task, "n": len(a), "identical": same}
        cells = []
        for m in metrics:
            x, y = 100 * fp32["scores"][m], 100 * int8["scores"][m]
            if not (math.isfinite(x) and math.isfinite(y)):
                raise SystemExit(f"{task} {m}: not finite (fp32 {x}, int8 {y})")
            row[m] = {"fp32": round(x, 2), "int8": round(y, 2), "diff": round(y - x, 2)}
            cells.append(f"{m} {x:.2f} / {y:.2f} ({y - x:+.2f})")
        row["within_bar"] = abs(row[primary]["diff"]) <= BAR
        records.append(row)
        unit = {"ner": "tags", "squad": "answers"}.get(task, "predictions")
        agreement = (f"{same:,} of {len(a):,} scores within 0.05 (largest difference {row['max_abs_diff']:.3f})"
                     if task == "stsb" else f"{same:,} of {len(a):,} {unit} identical")
        lines.append(f"| {task} | {'; '.join(cells)} | {'yes' if row['within_bar'] else 'NO'} | {agreement} |")
    print("| task | fp32 / int8 (int8 - fp32), dev | primary within 0.5 | predictions against fp32 |")
    print("|---|---|---|---|")
    print("\n".join(lines))
    for r in records:
        print(json.dumps(r))


if __name__ == "__main__":
    main()
