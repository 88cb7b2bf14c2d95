"""The pre-training study's tables and curves from the outputs of experiments/pretraining_study.sh.

    python experiments/pretraining_study_tables.py --runs runs/pretraining-study --figures docs/img

Prints the Markdown tables for RESULTS.md and writes two PNGs: held-out pre-training accuracy over steps
for both NSP arms, and dev scores per fine-tuning epoch (pre-trained arms vs random initialisation).
Everything is read from the runs' own files; a missing part is reported as missing, never filled in.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

ARMS = {"pt-random": "random negatives", "pt-nearby": "nearby negatives",
        "pt-random-longer": "random negatives, continued", "init-random": "random init (no pre-training)"}
LONGER_TASKS = ("stsb", "sst2")  # what the continuation in pretraining_study.sh fine-tunes
TASKS = {"mrpc": ("accuracy", "f1"), "rte": ("accuracy",), "stsb": ("pearson", "spearman"), "sst2": ("accuracy",)}


def jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def pct(x: float) -> str:
    return f"{100 * x:.1f}"


def heldout(runs: Path) -> list[dict]:
    """experiments/pretrain_eval.py's lines: each arm at the phase switch and at the end, on every held-out set."""
    return [r for name in ("heldout.jsonl", "heldout-longer.jsonl") if (runs / name).is_file()
            for r in jsonl(runs / name)]


def baseline(runs: Path) -> dict[str, float]:
    """Masked-LM accuracy of the context-free baseline per held-out set (pretrain_eval.py --baseline), and the
    NSP accuracy of always answering the majority class (``nsp:SET``, from create-pretraining-data's counts)."""
    path = runs / "baseline.jsonl"
    out = {Path(r["data"]).name: r["mlm_acc"] for r in jsonl(path)} if path.is_file() else {}
    for name in ("eval-random", "eval-nearby", "eval512-random"):
        made = runs / f"{name}.json"
        if made.is_file():
            counts = json.loads(made.read_text(encoding="utf-8"))["counts"]
            negatives = counts["random_next"] / counts["instances"]
            out[f"nsp:{name}"] = max(negatives, 1 - negatives)
    return out


def stage_of(model: str) -> tuple[str, str]:
    """(arm, stage) of a model path: runs/pretraining-study/pt-random/checkpoints/step-N or
    runs/pretraining-study/pt-random/final."""
    parts = Path(model).parts
    arm = next(p for p in parts if p in ARMS)
    step = parts[-1].removeprefix("step-").lstrip("0") if "checkpoints" in parts else None
    if arm == "pt-random-longer":
        return arm, "then more steps at 128 tokens (final)"
    return arm, (f"128 tokens only (step {step})" if step else "after the 512-token phase (final)")


def table_2x2(rows: list[dict], base: dict[str, float]) -> str:
    if not rows:
        return "(missing: heldout.jsonl)"
    by = {(*stage_of(r["model"]), Path(r["data"]).name): r for r in rows}
    out = ["| pre-trained with | at | MLM acc. | NSP acc., random-negative set | NSP acc., nearby-negative set |",
           "|---|---|---:|---:|---:|"]
    for arm, stage in dict.fromkeys((a, s) for a, s, _ in by):
        a, b = by.get((arm, stage, "eval-random")), by.get((arm, stage, "eval-nearby"))
        if a is None or b is None:
            out.append(f"| {ARMS[arm]} | {stage} | missing | | |")
            continue
        out.append(f"| {ARMS[arm]} | {stage} | {pct(a['mlm_acc'])}% | {pct(a['nsp_acc'])}% | {pct(b['nsp_acc'])}% |")
    if "eval-random" in base:
        out.append(f"| context-free baseline / majority class (no model) | | {pct(base['eval-random'])}% | "
                   f"{pct(base['nsp:eval-random'])}% | {pct(base['nsp:eval-nearby'])}% |")
    n = {r["instances"] for r in rows if Path(r["data"]).name in ("eval-random", "eval-nearby")}
    return "\n".join(out) + f"\n\n(Held-out WikiText-2 valid instances per set: {', '.join(map(str, sorted(n)))}; " \
        "MLM accuracy on the random-negative set.)"


def phase_switch(runs: Path) -> int | None:
    """The last step trained on 128-token instances (the training records name each step's phase)."""
    path = runs / "pt-random" / "metrics.jsonl"
    steps = [r["step"] for r in jsonl(path) if r["split"] == "train" and r.get("phase", "").endswith("-128")] \
        if path.is_file() else []
    return max(steps) if steps else None


def pretraining_curve(runs: Path) -> dict[str, list[dict]]:
    """Held-out evaluations over steps; the continued run's steps count on from where pt-random ended."""
    curves = {arm: [r for r in jsonl(runs / arm / "metrics.jsonl") if r["split"] == "eval"]
              for arm in ("pt-random", "pt-nearby", "pt-random-longer") if (runs / arm / "metrics.jsonl").is_file()}
    if "pt-random-longer" in curves and (runs / "pt-random" / "summary.json").is_file():
        start = json.loads((runs / "pt-random" / "summary.json").read_text(encoding="utf-8"))["steps"]
        curves["pt-random-longer"] = [{**r, "step": start + r["step"]} for r in curves["pt-random-longer"]]
    return curves


def table_steps(curves: dict[str, list[dict]]) -> str:
    out = ["| step | " + " | ".join(f"{ARMS[a]}: MLM / NSP" for a in curves) + " |",
           "|---:|" + "---:|" * len(curves)]
    steps = sorted({r["step"] for rows in curves.values() for r in rows})
    for step in steps:
        cells = []
        for rows in curves.values():
            r = next((r for r in rows if r["step"] == step), None)
            cells.append("" if r is None else f"{pct(r['mlm_acc'])}% / {pct(r['nsp_acc'])}%")
        out.append(f"| {step} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def glue_reports(runs: Path) -> dict[tuple[str, str], dict]:
    found = {}
    for arm in ARMS:
        for task in TASKS:
            path = runs / "glue" / f"{arm}-{task}" / "report.json"
            if path.is_file():
                found[(arm, task)] = json.loads(path.read_text(encoding="utf-8"))
    return found


def table_glue(reports: dict[tuple[str, str], dict]) -> str:
    head = "| initialisation | " + " | ".join(f"{t.upper()} {'/'.join(m)}" for t, m in TASKS.items()) + " |"
    out = [head, "|---|" + "---:|" * len(TASKS)]
    for arm in ARMS:
        cells = []
        for task, metrics in TASKS.items():
            rep = reports.get((arm, task))
            if rep is None:
                cells.append("not run" if arm == "pt-random-longer" and task not in LONGER_TASKS else "missing")
                continue
            best = rep["best"]
            n = len(best["seeds"])
            cells.append(" / ".join(f"{pct(best[m]['mean'])} ± {pct(best[m]['std'])}" for m in metrics)
                         + ("" if n == 3 else f" ({n} seeds)"))
        out.append(f"| {ARMS[arm]} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def table_gain(reports: dict[tuple[str, str], dict]) -> str:
    """Pre-trained minus random initialisation on each task's first metric, with the seeds' spread."""
    out = ["| task (metric) | random negatives - random init | nearby negatives - random init | "
           "nearby - random negatives | random negatives continued - random init |", "|---|---:|---:|---:|---:|"]
    def mean(arm: str, task: str, m: str) -> float | None:
        rep = reports.get((arm, task))
        return None if rep is None else rep["best"][m]["mean"]

    for task, metrics in TASKS.items():
        m = metrics[0]

        def diff(a: str, b: str, task: str = task, m: str = m) -> str:
            x, y = mean(a, task, m), mean(b, task, m)
            return "missing" if x is None or y is None else f"{100 * (x - y):+.1f}"

        out.append(f"| {task.upper()} ({m}) | {diff('pt-random', 'init-random')} | {diff('pt-nearby', 'init-random')} | "
                   f"{diff('pt-nearby', 'pt-random')} | "
                   f"{diff('pt-random-longer', 'init-random') if task in LONGER_TASKS else 'not run'} |")
    return "\n".join(out)


def table_phase(rows: list[dict], base: dict[str, float]) -> str:
    if not rows:
        return "(missing: heldout.jsonl)"
    by = {(*stage_of(r["model"]), Path(r["data"]).name): r for r in rows}
    out = ["| pre-trained with | at | MLM acc., 512-token instances | NSP acc., 512 | MLM acc., 128-token instances "
           "| NSP acc., 128 |", "|---|---|---:|---:|---:|---:|"]
    for arm, stage in dict.fromkeys((a, s) for a, s, _ in by):
        cells = []
        for name in ("eval512-random", "eval-random"):
            r = by.get((arm, stage, name))
            cells.append("missing | " if r is None else f"{pct(r['mlm_acc'])}% | {pct(r['nsp_acc'])}%")
        out.append(f"| {ARMS[arm]} | {stage} | " + " | ".join(cells) + " |")
    if "eval512-random" in base and "eval-random" in base:
        out.append(f"| context-free baseline / majority class (no model) | | {pct(base['eval512-random'])}% | "
                   f"{pct(base['nsp:eval512-random'])}% | {pct(base['eval-random'])}% | {pct(base['nsp:eval-random'])}% |")
    n = {r["instances"] for r in rows if Path(r["data"]).name == "eval512-random"}
    return "\n".join(out) + f"\n\n({', '.join(map(str, sorted(n)))} held-out 512-token WikiText-2 instances.)"


def figures(curves: dict[str, list[dict]], reports: dict[tuple[str, str], dict], out: Path,
            switch: int | None = None, floor: float | None = None) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    written = []
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
    for arm, rows in curves.items():
        steps = [r["step"] for r in rows]
        axes[0].plot(steps, [100 * r["mlm_acc"] for r in rows], marker="o", label=ARMS[arm])
        axes[1].plot(steps, [100 * r["nsp_acc"] for r in rows], marker="o", label=ARMS[arm])
    axes[0].set(title="held-out masked-LM accuracy", xlabel="step", ylabel="%")
    axes[1].set(title="held-out NSP accuracy (random negatives)", xlabel="step", ylabel="%")
    if floor is not None:
        axes[0].axhline(100 * floor, color="black", linestyle="--", linewidth=1, label="context-free baseline")
        axes[0].legend(fontsize=8)
    if switch is not None:
        for ax in axes:
            ax.axvline(switch, color="grey", linestyle=":", linewidth=1)
            ax.text(switch, ax.get_ylim()[0], " 512 tokens", color="grey", fontsize=7, va="bottom")
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    written.append(out / "pretraining-study-pretraining.png")
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)

    fig, axes = plt.subplots(1, len(TASKS), figsize=(3.2 * len(TASKS), 3.2))
    for ax, (task, metrics) in zip(axes, TASKS.items()):
        for arm in ARMS:
            rep = reports.get((arm, task))
            if rep is None:
                continue
            per_run = [[e["dev"][metrics[0]] if "dev" in e else e[metrics[0]] for e in r["per_epoch"]]
                       for r in rep["runs"] if r.get("per_epoch")]
            epochs = range(1, min(len(p) for p in per_run) + 1)
            means = [100 * statistics.fmean(p[i - 1] for p in per_run) for i in epochs]
            ax.plot(list(epochs), means, marker="o", label=ARMS[arm])
        ax.set(title=f"{task.upper()} dev {metrics[0]} (mean of seeds)", xlabel="epoch")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    written.append(out / "pretraining-study-finetuning.png")
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)
    return written


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=Path, default=Path("runs/pretraining-study"))
    p.add_argument("--figures", type=Path, default=None, help="write the PNGs here")
    args = p.parse_args()
    curves = pretraining_curve(args.runs)
    reports = glue_reports(args.runs)
    rows, base = heldout(args.runs), baseline(args.runs)
    print("## 2 x 2: held-out NSP and MLM\n\n" + table_2x2(rows, base))
    print("\n## Held-out accuracy over steps\n\n" + table_steps(curves))
    print("\n## Downstream (dev, mean ± std over seeds, x100)\n\n" + table_glue(reports))
    print("\n## Gains (points)\n\n" + table_gain(reports))
    print("\n## Phase 2\n\n" + table_phase(rows, base))
    if args.figures is not None:
        for path in figures(curves, reports, args.figures, phase_switch(args.runs), base.get("eval-random")):
            print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
