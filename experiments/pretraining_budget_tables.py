"""Tables and curves of the pre-training budget study (``experiments/pretraining_budget.sh``).

    python experiments/pretraining_budget_tables.py --runs runs/pretraining-budget --figures docs/img

Reads each arm's ``metrics.jsonl`` and ``settings`` (its report), the context-free floors
(``floors.jsonl``, written by the study script) and, where present, the full held-out scores
(``heldout.jsonl``) and the GLUE runs; prints the markdown tables of RESULTS.md and draws the curves.

The escape step of an arm is the first evaluation at which its held-out masked-LM accuracy is at least one
point above the context-free floor of its held-out set (the accuracy of a predictor that reads no context).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

ESCAPE_MARGIN = 0.01
TASKS = {"mrpc": ("accuracy", "f1"), "rte": ("accuracy",), "stsb": ("pearson", "spearman"), "sst2": ("accuracy",)}
INITS = {"init-pretrained": "pre-trained (the recipe, 60 min)", "init-random": "random initialisation",
         "init-nsp-cont": "the recipe + 2,000 steps with NSP"}
# Step 6: the four arms from scratch (5,000 steps each), against the same random initialisation.
NSP_ARMS = {"random": "NSP, random negatives", "nearby": "NSP, nearby negatives", "mixed": "NSP, 50/50 mix",
            "mlm-only": "masked LM alone (no NSP)"}
NSP_INITS = {f"init-nsp-{arm}": label for arm, label in NSP_ARMS.items()} | {"init-random": "random initialisation"}


def read_jsonl(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:  # a torn last line of a run still going
            continue
    return out


def arm_summary(run: Path, floor: float) -> dict:
    """Steps, throughput, escape step and last held-out accuracy of one pre-training run."""
    records = read_jsonl(run / "metrics.jsonl")
    evals = [r for r in records if r["split"] == "eval"]
    train = [r for r in records if r["split"] == "train"]
    escape = next((r["step"] for r in evals if r["mlm_acc"] >= floor + ESCAPE_MARGIN), None)
    speed = statistics.median(r["seqs_per_s"] for r in train[1:]) if len(train) > 1 else None
    return {"steps": evals[-1]["step"] if evals else 0, "escape": escape, "seqs_per_s": speed,
            "mlm_acc": evals[-1]["mlm_acc"] if evals else None, "nsp_acc": evals[-1].get("nsp_acc") if evals else None,
            "curve": [(r["step"], r["mlm_acc"]) for r in evals]}


def pct(x: float | None) -> str:
    return "" if x is None else f"{100 * x:.1f}%"


def _cell(config: dict, metrics: tuple[str, ...]) -> str:
    return " / ".join(f"{100 * config[m]['mean']:.1f} ± {100 * config[m]['std']:.1f}" for m in metrics)


def glue_tables(root: Path, title: str, inits: dict[str, str] = INITS, random_root: Path | None = None) -> None:
    """Per fine-tuning rate: each initialisation's dev scores (mean ± std over seeds), then the difference
    pre-trained - random at each rate and at each initialisation's best rate (chosen on the dev mean, as the
    paper chooses). ``random_root``: where the random initialisation's runs are, when not in ``root``."""
    def where(init: str) -> Path:
        return random_root if init == "init-random" and random_root is not None else root

    reports = {(init, task): json.loads((where(init) / f"{init}-{task}" / "report.json").read_text())
               for init in inits for task in TASKS if (where(init) / f"{init}-{task}" / "report.json").is_file()}
    if not reports:
        return
    configs = {key: {c["lr"]: c for c in rep["configs"]} for key, rep in reports.items()}
    rates = sorted({lr for c in configs.values() for lr in c})
    print(f"\n## {title} (dev, mean ± std over seeds, x100)\n")
    print("| initialisation | lr | " + " | ".join(f"{t.upper()} {'/'.join(m)}" for t, m in TASKS.items()) + " |")
    print("|---|---|" + "---:|" * len(TASKS))
    for init, label in inits.items():
        for lr in rates:
            cells = [_cell(configs[(init, t)][lr], m) if lr in configs.get((init, t), {}) else "missing"
                     for t, m in TASKS.items()]
            print(f"| {label} | {lr:g} | " + " | ".join(cells) + " |")
    print("\n| initialisation | task (metric) | rate | minus random init | larger than both seeds' std? |\n"
          "|---|---|---|---:|---|")
    for init, task in ((i, t) for i in inits if i != "init-random" for t in TASKS):
        metrics = TASKS[task]
        a, b = configs.get((init, task)), configs.get(("init-random", task))
        if not a or not b:
            continue
        m = metrics[0]
        best_a = max(a.values(), key=lambda c: c[m]["mean"])
        best_b = max(b.values(), key=lambda c: c[m]["mean"])
        pairs = [(f"{lr:g}", a[lr], b[lr]) for lr in rates if lr in a and lr in b]
        if len(rates) > 1:
            pairs.append((f"best of each ({best_a['lr']:g} / {best_b['lr']:g})", best_a, best_b))
        for rate, x, y in pairs:
            d = x[m]["mean"] - y[m]["mean"]
            spread = max(x[m]["std"], y[m]["std"])
            print(f"| {inits[init]} | {task.upper()} ({m}) | {rate} | {100 * d:+.1f} | "
                  f"{'yes' if abs(d) > spread else 'no'} (std {100 * spread:.1f}) |")


def nsp_tables(root: Path, floor: float) -> None:
    """Step 6: each arm's held-out masked-LM curve and escape step, and the 2 x 2 NSP table (each arm scored
    on a random-negative and a nearby-negative held-out set, every instance)."""
    arms = {arm: arm_summary(root / arm, floor) for arm in NSP_ARMS if (root / arm / "metrics.jsonl").is_file()}
    if not arms:
        return
    steps = sorted({k for s in arms.values() for k, _ in s["curve"]})
    print("\n## The NSP arms from scratch (held-out masked-LM accuracy, first 2,000 instances)\n")
    print("| arm | " + " | ".join(f"step {k}" for k in steps) + " | escape step | sequences/s (one thread) |")
    print("|---|" + "---:|" * len(steps) + "---:|---:|")
    for arm, s in arms.items():
        at = dict(s["curve"])
        print(f"| {NSP_ARMS[arm]} | " + " | ".join(pct(at.get(k)) for k in steps) + " | "
              f"{s['escape'] if s['escape'] is not None else 'not by ' + str(s['steps'])} | "
              f"{s['seqs_per_s']:.0f} |")
    scores = read_jsonl(root / "heldout.jsonl")
    if scores:
        sets = sorted({r["data"] for r in scores})
        print("\n| arm | " + " | ".join(f"{Path(d).name}: MLM / NSP" for d in sets) + " |")
        print("|---|" + "---:|" * len(sets))
        for arm in NSP_ARMS:
            row = {r["data"]: r for r in scores if Path(r["model"]).parent.name == arm}
            cells = [f"{pct(row[d].get('mlm_acc'))} / {pct(row[d].get('nsp_acc')) or 'n/a'}" if d in row else "missing"
                     for d in sets]
            print(f"| {NSP_ARMS[arm]} | " + " | ".join(cells) + " |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=Path, default=Path("runs/pretraining-budget"))
    p.add_argument("--figures", type=Path, default=None, help="write the curves here (PNG)")
    args = p.parse_args()
    arms = json.loads((args.runs / "arms.json").read_text())
    floors = {r["data"]: r["mlm_acc"] for r in read_jsonl(args.runs / "floors.jsonl")}
    steps = (300, 500, 700, 1000, 1500)
    print("| arm | what changes | " + " | ".join(f"step {k}" for k in steps) + " | escape step | ran to |")
    print("|---|---|" + "---:|" * len(steps) + "---:|---:|")
    curves = {}
    for arm in arms:
        floor = floors.get(arm["eval"], float("nan"))
        s = arm_summary(args.runs / "arms" / arm["name"], floor)
        curves[arm["name"]] = (s["curve"], floor)
        at = dict(s["curve"])
        print(f"| {arm['name']} | {arm['lever']} | " + " | ".join(pct(at.get(k)) for k in steps) + " | "
              f"{s['escape'] if s['escape'] is not None else 'not by ' + str(s['steps'])} | {s['steps']} |")
    print(f"\n(held-out masked-LM accuracy, first {arms[0].get('eval_instances', 1000)} instances of "
          f"{arms[0]['eval']}; context-free floor {pct(floors.get(arms[0]['eval']))})")
    recipe = args.runs / "pretrain-1h" / "model"
    final = [r for r in read_jsonl(recipe / "metrics.jsonl") if r["split"] == "eval"]
    if final:
        final = [r for r in final if r["step"] % 2000 == 0 or r["step"] in (1000, final[-1]["step"])]  # table width
        floor = floors.get("eval-8192-128", float("nan"))
        escape = next((r["step"] for r in final if r["mlm_acc"] >= floor + ESCAPE_MARGIN), None)
        train = [r for r in read_jsonl(recipe / "metrics.jsonl") if r["split"] == "train"]
        print(f"\n## The recipe (examples/pretrain-1h): escape step {escape}, median "
              f"{statistics.median(r['seqs_per_s'] for r in train):.0f} sequences/s on both cores\n")
        print("| step | " + " | ".join(str(r["step"]) for r in final) + " |")
        print("|---|" + "---:|" * len(final))
        print("| held-out MLM acc. | " + " | ".join(pct(r["mlm_acc"]) for r in final) + " |")
        # training minutes up to each evaluation, from the logged windows' throughput (evaluation time excluded)
        minutes, done, last = [], 0.0, 0
        for r in train:
            done += (r["step"] - last) * 32 / r["seqs_per_s"] / 60
            last = r["step"]
            if any(e["step"] == r["step"] for e in final):
                minutes.append(done)
        print("| minutes of training | " + " | ".join(f"{m:.0f}" for m in minutes) + " |")
        curves["recipe (examples/pretrain-1h)"] = ([(r["step"], r["mlm_acc"]) for r in final], floor)
    glue_tables(args.runs / "glue", "Downstream at lr 1e-4")
    glue_tables(args.runs / "glue-lr", "Downstream at higher fine-tuning rates")
    nsp_tables(args.runs / "nsp-arms", floors.get("eval-8192-128", float("nan")))
    glue_tables(args.runs / "glue-nsp", "Downstream of the NSP arms (lr 1e-3; random initialisation from above)",
                NSP_INITS, random_root=args.runs / "glue-lr")
    if args.figures is not None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(8, 5))
        for name, (curve, _floor) in curves.items():
            if curve:
                ax.plot([c[0] for c in curve], [100 * c[1] for c in curve], label=name)
        ax.axhline(100 * floors.get(arms[0]["eval"], float("nan")), color="grey", ls="--", label="context-free floor")
        ax.set_xlabel("optimiser step")
        ax.set_ylabel("held-out masked-LM accuracy (%)")
        ax.legend(fontsize=7)
        args.figures.mkdir(parents=True, exist_ok=True)
        fig.savefig(args.figures / "pretraining-budget-ablation.png", dpi=110, bbox_inches="tight")


if __name__ == "__main__":
    main()
