"""Draw a run's metrics.jsonl as a PNG of learning curves (train and held-out)."""

from __future__ import annotations

import logging
from pathlib import Path

from bertkit.training.run_log import read_metrics

logger = logging.getLogger("bertkit")


def plot_metrics(metrics_path: Path, png_path: Path) -> Path | None:
    """One panel per metric family, train and eval lines; returns the PNG path (None without matplotlib)."""
    try:
        import matplotlib
    except ModuleNotFoundError:
        logger.warning("matplotlib is not installed (pip install 'bertkit[plot]'): no plot written for %s",
                       metrics_path)
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = read_metrics(Path(metrics_path))  # a NaN logged as null is NaN again: a gap in the curve
    keys = sorted({k for r in records for k, v in r.items() if isinstance(v, (int, float))} - {"step", "epoch"})
    panels = [k for k in ("loss", "mlm_loss", "mlm_acc", "nsp_loss", "nsp_acc", "lr") if k in keys] or keys[:4]
    panels += [k for k in keys if k not in panels and k not in ("seqs_per_s", "tokens_per_s", "instances")][:6 - len(panels)]
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.2), squeeze=False)
    for ax, key in zip(axes[0], panels):
        for split, style in (("train", "-"), ("eval", "o-")):
            pts = [(r["step"], r[key]) for r in records if r.get("split") == split and key in r]
            if pts:
                ax.plot(*zip(*pts), style, label=split, markersize=3)
        ax.set_title(key)
        ax.ticklabel_format(axis="y", style="sci", scilimits=(-3, 4))  # 1e-4, not 0.00010: fits the margin
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend()
    # fixed margins in inches (tight_layout measures every tick label: half the cost of the whole plot)
    width = 4 * len(panels)
    fig.subplots_adjust(left=0.55 / width, right=1 - 0.15 / width, bottom=0.5 / 3.2, top=1 - 0.3 / 3.2,
                        wspace=0.8 / 3.4)
    from bertkit.outputs import atomic_target

    with atomic_target(png_path) as tmp:  # never half a PNG, never through a symlink; recorded as the run's
        fig.savefig(tmp, dpi=100, format="png")
    plt.close(fig)
    return png_path
