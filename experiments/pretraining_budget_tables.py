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
            "mlm_acc": evals[-1]["mlm_acc"] if evals else None,
            "curve": [(r["step"], r["mlm_acc"]) for r in evals]}


def pct(x: float | None) -> str:
    return "" if x is None else f"{100 * x:.1f}%"


def _cell(config: dict, metrics: tuple[str, ...]) -> str:
    return " / ".join(f"{100 * config[m]['mean']:.1f} ± {100 * config[m]['std']:.1f}" for m in metrics)


def glue_tables(root: Path, title: str) -> None:
    """Per fine-tuning rate: each initialisation's dev scores (mean ± std over seeds), then the difference
    pre-trained - random at each rate and at each initialisation's best rate (chosen on the dev mean, as the
    paper chooses)."""
    reports = {(init, task): json.loads((root / f"{init}-{task}" / "report.json").read_text())
               for init in INITS for task in TASKS if (root / f"{init}-{task}" / "report.json").is_file()}
    if not reports:
        return
    configs = {key: {c["lr"]: c for c in rep["configs"]} for key, rep in reports.items()}
    rates = sorted({lr for c in configs.values() for lr in c})
    print(f"\n## {title} (dev, mean ± std over seeds, x100)\n")
    print("| initialisation | lr | " + " | ".join(f"{t.upper()} {'/'.join(m)}" for t, m in TASKS.items()) + " |")
    print("|---|---|" + "---:|" * len(TASKS))
    for init, label in INITS.items():
        if not any((init, t) in reports for t in TASKS):
            continue  # an initialisation with no runs in this directory (step 5's ran at each one's best rate only)
        for lr in rates:
            cells = [_cell(configs[(init, t)][lr], m) if lr in configs.get((init, t), {}) else "missing"
                     for t, m in TASKS.items()]
            print(f"| {label} | {lr:g} | " + " | ".join(cells) + " |")
    print("\n| initialisation | task (metric) | rate | minus random init | larger than both seeds' std? |\n"
          "|---|---|---|---:|---|")
    for init, task in ((i, t) for i in INITS if i != "init-random" for t in TASKS):
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
            print(f"| {INITS[init]} | {task.upper()} ({m}) | {rate} | {100 * d:+.1f} | "
                  f"{'yes' if abs(d) > spread else 'no'} (std {100 * spread:.1f}) |")


def lever_table(runs: Path, floors: dict[str, float]) -> dict:
    """Step 7: the arms at a fixed budget. Each arm's steps are the budget converted by its cost per sequence,
    and it is evaluated 20 times, so its k-th evaluation is at k/20 of the budget whatever its step count.
    Columns: held-out accuracy at a quarter, half, three quarters and all of the budget, the escape point (as
    a share of the budget) and the difference to the recipe's settings (R0) at the end, in points above each
    arm's own floor (the vocabularies' held-out sets differ)."""
    spec = runs / "levers.json"
    if not spec.is_file():
        return {}
    arms = json.loads(spec.read_text())
    summaries = {a["name"]: arm_summary(runs / "levers" / a["name"], floors.get(f"eval-{a['vocab']}-128", float("nan")))
                 for a in arms}
    base = summaries.get("R0-base", {}).get("mlm_acc")
    base = None if base is None else base - floors.get("eval-8192-128", float("nan"))
    print("\n## The levers at a fixed budget (held-out masked-LM accuracy, first 1,000 instances of each "
          "vocabulary's held-out set)\n")
    print("| arm | what changes | steps | 1/4 | 1/2 | 3/4 | budget | escape (share of budget) | floor | "
          "vs R0 (seed 42) at the end, points above own floor |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    curves = {}
    for a in arms:
        s, floor = summaries[a["name"]], floors.get(f"eval-{a['vocab']}-128", float("nan"))
        curve = s["curve"]
        share = {round(20 * step / a["steps"]): acc for step, acc in curve}  # evaluation k of 20 -> accuracy
        esc = (f"{s['escape'] / a['steps']:.2f} (step {s['escape']})" if s["escape"] is not None
               else f"not by {s['steps'] / a['steps']:.2f}")
        done = s["steps"] >= a["steps"]
        delta = (f"{100 * (s['mlm_acc'] - floor - base):+.1f}" if done and base is not None and s["mlm_acc"] is not None
                 else "")
        print(f"| {a['name']} | {a['lever']} | {a['steps']} | " + " | ".join(pct(share.get(k)) for k in (5, 10, 15))
              + f" | {pct(share.get(20)) if done else 'running'} | {esc} | {pct(floor)} | {delta} |")
        curves[a["name"]] = [(step / a["steps"], acc - floor) for step, acc in curve]
    groups: dict[str, list[float]] = {}  # an arm and its reruns with other seeds (NAME-seedNN)
    for a in arms:
        s = summaries[a["name"]]
        if s["steps"] >= a["steps"] and s["mlm_acc"] is not None:
            groups.setdefault(a["name"].split("-seed")[0], []).append(s["mlm_acc"])
    for name, ends in groups.items():
        if len(ends) > 1:
            print(f"\n{name} over {len(ends)} seeds: {', '.join(pct(e) for e in ends)} at the end; mean "
                  f"{pct(statistics.mean(ends))}, std {100 * statistics.stdev(ends):.1f} points")
    return curves


def grid_table(runs: Path, task: str, dirs: tuple[str, ...]) -> None:
    """One task over every fine-tuning setting both initialisations ran (rate x batch x epochs, from each
    report's settings): the two side by side per setting, then each one's best setting on the whole grid."""
    metric = TASKS[task][0]
    rows: dict[tuple, dict[str, dict]] = {}
    for d in dirs:
        for init in ("init-pretrained", "init-random"):
            path = runs / d / f"{init}-{task}" / "report.json"
            if not path.is_file():
                continue
            rep = json.loads(path.read_text())
            st = rep["settings"]
            for c in rep["configs"]:
                rows.setdefault((c["lr"], st["batch_size"], st["num_train_epochs"]), {})[init] = c
    if not rows:
        return
    print(f"\n## {task.upper()} over the whole fine-tuning grid (dev {metric}, mean ± std over seeds, x100)\n")
    print("| lr | batch | epochs | pre-trained (the recipe) | random initialisation | difference | larger than both stds? |")
    print("|---:|---:|---:|---:|---:|---:|---|")
    for (lr, batch, epochs), pair in sorted(rows.items()):
        a, b = pair.get("init-pretrained"), pair.get("init-random")
        cells = [_cell(x, (metric,)) if x else "missing" for x in (a, b)]
        d = spread = None
        if a and b:
            d, spread = a[metric]["mean"] - b[metric]["mean"], max(a[metric]["std"], b[metric]["std"])
        print(f"| {lr:g} | {batch} | {epochs:g} | {cells[0]} | {cells[1]} | "
              + (f"{100 * d:+.1f} | {'yes' if abs(d) > spread else 'no'} (std {100 * spread:.1f}) |" if a and b else " | |"))
    best = {}
    for init in ("init-pretrained", "init-random"):
        ran = [(k, v[init]) for k, v in rows.items() if init in v]
        best[init] = max(ran, key=lambda kv: kv[1][metric]["mean"])
    (ka, a), (kb, b) = best["init-pretrained"], best["init-random"]
    d, spread = a[metric]["mean"] - b[metric]["mean"], max(a[metric]["std"], b[metric]["std"])
    label = lambda k: f"lr {k[0]:g}, batch {k[1]}, {k[2]:g} epochs"  # noqa: E731
    print(f"\nEach one's best on the grid: pre-trained {_cell(a, (metric,))} ({label(ka)}), random initialisation "
          f"{_cell(b, (metric,))} ({label(kb)}): {100 * d:+.1f}, "
          f"{'larger' if abs(d) > spread else 'not larger'} than both seeds' std ({100 * spread:.1f}).")


def phase512_table(runs: Path) -> None:
    """Step 9: the recipe's model before and after 500 steps on 512-token instances, on every 512- and
    128-token held-out instance, beside the context-free floor of each set; and the phase's curve."""
    scores = read_jsonl(runs / "phase512" / "heldout.jsonl")
    if not scores:
        return
    sets = sorted({r["data"] for r in scores}, key=lambda d: "512" not in d)
    label = {"context-free baseline": "context-free floor"}
    print("\n## The 128 -> 512 phase (held-out masked-LM accuracy, every instance)\n")
    print("| model | " + " | ".join(f"{Path(d).name}" for d in sets) + " |")
    print("|---|" + "---:|" * len(sets))
    for model in dict.fromkeys(r["model"] for r in scores):
        row = {r["data"]: r for r in scores if r["model"] == model}
        name = label.get(model, "after the 512 phase" if "phase512" in model else "the recipe (128 tokens only)")
        print(f"| {name} | " + " | ".join(f"{pct(row[d]['mlm_acc'])} ({row[d]['instances']})" if d in row else ""
                                         for d in sets) + " |")
    curve = [r for r in read_jsonl(runs / "phase512" / "metrics.jsonl") if r["split"] == "eval"]
    if curve:
        print("\n| step of the 512 phase | " + " | ".join(str(r["step"]) for r in curve) + " |")
        print("|---|" + "---:|" * len(curve))
        print("| 512-token held-out MLM acc. | " + " | ".join(pct(r["mlm_acc"]) for r in curve) + " |")


GRID_DIRS = ("glue", "glue-lr", "glue-10ep", "glue-b16", "glue-lr2e-3")


def finetune_curves(runs: Path, path: Path) -> None:
    """The fine-tuning learning curves: dev score after each epoch (mean over seeds, band = ± the seeds' sample std, as the reports) of both
    initialisations on each task, each at its best setting on the grid (chosen on the final dev mean)."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(TASKS), figsize=(4 * len(TASKS), 3.6))
    for ax, (task, metrics) in zip(axes, TASKS.items()):
        metric = metrics[0]
        for init, label in (("init-pretrained", "pre-trained (the recipe)"), ("init-random", "random initialisation")):
            best = None
            for d in GRID_DIRS:
                f = runs / d / f"{init}-{task}" / "report.json"
                if not f.is_file():
                    continue
                rep = json.loads(f.read_text())
                for c in rep["configs"]:
                    if best is None or c[metric]["mean"] > best[0][metric]["mean"]:
                        best = (c, rep)
            if best is None:
                continue
            config, rep = best
            per_run = [[e[metric] for e in r["per_epoch"]] for r in rep["runs"] if r["lr"] == config["lr"]]
            epochs = range(1, min(map(len, per_run)) + 1)
            mean = [100 * statistics.mean(r[e - 1] for r in per_run) for e in epochs]
            std = [100 * statistics.stdev(r[e - 1] for r in per_run) for e in epochs]
            line, = ax.plot(list(epochs), mean, marker="o",
                            label=f"{label}: lr {config['lr']:g}, batch {rep['settings']['batch_size']}")
            ax.fill_between(list(epochs), [m - s for m, s in zip(mean, std)], [m + s for m, s in zip(mean, std)],
                            color=line.get_color(), alpha=0.2)
        ax.set_title(f"{task.upper()} dev {metric}")
        ax.set_xlabel("epoch")
        ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")


def first_arms_table(runs: Path, floors: dict[str, float]) -> dict:
    """Step 1: the first levers at equal steps (absent when only later steps ran in this directory)."""
    spec = runs / "arms.json"
    if not spec.is_file():
        return {}
    arms = json.loads(spec.read_text())
    steps = (300, 500, 700, 1000, 1500)
    print("| arm | what changes | " + " | ".join(f"step {k}" for k in steps) + " | escape step | ran to |")
    print("|---|---|" + "---:|" * len(steps) + "---:|---:|")
    curves = {}
    for arm in arms:
        floor = floors.get(arm["eval"], float("nan"))
        s = arm_summary(runs / "arms" / arm["name"], floor)
        curves[arm["name"]] = (s["curve"], floor)
        at = dict(s["curve"])
        print(f"| {arm['name']} | {arm['lever']} | " + " | ".join(pct(at.get(k)) for k in steps) + " | "
              f"{s['escape'] if s['escape'] is not None else 'not by ' + str(s['steps'])} | {s['steps']} |")
    print(f"\n(held-out masked-LM accuracy, first {arms[0].get('eval_instances', 1000)} instances of "
          f"{arms[0]['eval']}; context-free floor {pct(floors.get(arms[0]['eval']))})")
    return curves


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=Path, default=Path("runs/pretraining-budget"))
    p.add_argument("--figures", type=Path, default=None, help="write the curves here (PNG)")
    args = p.parse_args()
    floors = {r["data"]: r["mlm_acc"] for r in read_jsonl(args.runs / "floors.jsonl")}
    curves = first_arms_table(args.runs, floors)
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
    lever_curves = lever_table(args.runs, floors)
    glue_tables(args.runs / "glue", "Downstream at lr 1e-4")
    glue_tables(args.runs / "glue-lr", "Downstream at higher fine-tuning rates")
    grid_table(args.runs, "mrpc", GRID_DIRS)
    grid_table(args.runs, "stsb", GRID_DIRS)
    phase512_table(args.runs)
    if args.figures is not None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(8, 5))
        for name, (curve, _floor) in curves.items():
            if curve:
                ax.plot([c[0] for c in curve], [100 * c[1] for c in curve], label=name)
        floor = next((f for _curve, f in curves.values() if f == f), float("nan"))  # NaN: no floor measured
        ax.axhline(100 * floor, color="grey", ls="--", label="context-free floor")
        ax.set_xlabel("optimiser step")
        ax.set_ylabel("held-out masked-LM accuracy (%)")
        ax.legend(fontsize=7)
        args.figures.mkdir(parents=True, exist_ok=True)
        fig.savefig(args.figures / "pretraining-budget-ablation.png", dpi=110, bbox_inches="tight")
        if lever_curves:
            fig, ax = plt.subplots(figsize=(8, 5))
            bases = list(dict.fromkeys(name.split("-seed")[0] for name in lever_curves))
            colours = plt.get_cmap("tab20")
            for name, curve in lever_curves.items():  # a seed rerun: its arm's colour, dashed
                ax.plot([c[0] for c in curve], [100 * c[1] for c in curve], label=name,
                        color=colours(bases.index(name.split("-seed")[0]) % 20), ls="--" if "-seed" in name else "-")
            ax.axhline(0, color="grey", ls="--", label="context-free floor")
            ax.set_xlabel("share of the budget (the sequences BERT-tiny reads in 2,750 steps of 32)")
            ax.set_ylabel("held-out masked-LM accuracy above the floor (points)")
            ax.legend(fontsize=7)
            fig.savefig(args.figures / "pretraining-budget-levers.png", dpi=110, bbox_inches="tight")
        finetune_curves(args.runs, args.figures / "pretraining-budget-finetune-curves.png")


if __name__ == "__main__":
    main()
