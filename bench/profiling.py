"""The one operator summary the benches print with ``--profile``."""

from __future__ import annotations


def top_ops(prof, top: int) -> dict[str, float]:
    """Self CPU milliseconds of the ``top`` costliest operators of a finished ``torch.profiler`` run, plus
    ``(total)``."""
    events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    out = {e.key: round(e.self_cpu_time_total / 1e3, 1) for e in events[:top]}
    out["(total)"] = round(sum(e.self_cpu_time_total for e in events) / 1e3, 1)
    return out
