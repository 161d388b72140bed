"""Pictures of a plan: a Gantt chart of its schedule, and latency against bandwidth."""

from __future__ import annotations

import os
from collections.abc import Sequence

from edgesplit.optimize.plan import Plan


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def gantt(plan: Plan, path: str | os.PathLike) -> None:
    """One row per processor (and one per link) with the parts and transfers in time."""
    plt = _pyplot()
    procs = list(dict.fromkeys(p.processor for p in plan.parts))
    fig, ax = plt.subplots(figsize=(10, 1.2 + 0.5 * (len(procs) + 1)))
    colors = plt.get_cmap("tab10")
    for p in plan.parts:
        row = procs.index(p.processor)
        ax.barh(
            row,
            max(p.end_ms - p.start_ms, 1e-6),
            left=p.start_ms,
            color=colors(row % 10),
            edgecolor="black",
        )
        ax.text(p.start_ms, row, f" {p.name}", va="center", fontsize=7)
    xfer_row = len(procs)
    ends = {p.name: p.end_ms for p in plan.parts}
    for t in plan.transfers:
        if t.latency_ms <= 0:
            continue
        start = ends.get(t.src_part, 0.0)
        ax.barh(xfer_row, t.latency_ms, left=start, color="lightgray", edgecolor="gray")
    ax.set_yticks(range(len(procs) + 1), [*procs, "transfers"])
    ax.invert_yaxis()
    ax.set_xlabel("time (ms)")
    ax.set_title(
        f"{plan.model_name} on {plan.device}: {plan.predicted.latency_ms:.2f} ms, "
        f"{plan.predicted.energy_mj:.2f} mJ ({plan.objective})"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def sweep_plot(rows: Sequence, path: str | os.PathLike, title: str = "") -> None:
    """Predicted latency of the plan and the baselines against bandwidth (log-log)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    bw = [r.bandwidth_mbps for r in rows]
    ax.plot(bw, [r.latency_ms for r in rows], "o-", label="plan", linewidth=2)
    names = list(dict.fromkeys(k for r in rows for k in r.baselines))
    for name in names:
        ys = [r.baselines.get(name) for r in rows]
        if any(y is not None for y in ys):
            ax.plot(bw, [float("nan") if y is None else y for y in ys], "--", label=name, alpha=0.7)
    for r in rows:
        if r.changed:
            ax.axvline(r.bandwidth_mbps, color="gray", linestyle=":", linewidth=0.8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("bandwidth (Mbit/s)")
    ax.set_ylabel("predicted latency (ms)")
    ax.set_title(title)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def bands_plot(
    bandwidths: Sequence[float],
    values: Sequence[Sequence[float]],
    breakpoints_mbps: Sequence[float],
    path: str | os.PathLike,
    title: str,
    unit: str = "ms",
) -> None:
    """Each band plan's value against bandwidth (log-log), their envelope, and the breakpoints."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for k, v in enumerate(values):
        ax.plot(bandwidths, v, label=f"plan {k}", linewidth=1)
    ax.plot(bandwidths, [min(col) for col in zip(*values)], "k--", label="envelope", linewidth=2)
    for b in breakpoints_mbps:
        ax.axvline(b, color="grey", linewidth=0.5)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("uplink Mbit/s")
    ax.set_ylabel(unit)
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
