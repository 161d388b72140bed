"""Re-solve a plan's problem at other network bandwidths, to see where the decision changes.

The plan records where its inputs came from (model path and shapes, device and server specs, the
profile path, the link and the pins), so :func:`edgesplit.workflows.resolve.problem_from_plan` can
load its
:class:`Problem` again; only the link's up and down rates change from one row to the next.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from edgesplit.errors import PlanError
from edgesplit.optimize.costs import build_costs
from edgesplit.optimize.objectives import objective
from edgesplit.optimize.problem import Problem
from edgesplit.optimize.solve import solve


@dataclass(frozen=True)
class SweepRow:
    """The plan re-solved at one bandwidth.

    Attributes:
        decision: Which processors run how many nodes (``cpu_big:21 gpu:108``).
        changed: True where the decision differs from the previous row's.
        baselines: Baseline name -> predicted latency (``None``: cannot run).
    """

    bandwidth_mbps: float
    latency_ms: float
    energy_mj: float
    decision: str
    changed: bool
    baselines: dict[str, float | None]


def log_bandwidths(
    lo_mbps: float = 0.1, hi_mbps: float = 1000.0, per_decade: int = 4
) -> list[float]:
    """Log-spaced bandwidths from ``lo_mbps`` to ``hi_mbps``."""
    n = int(round(np.log10(hi_mbps / lo_mbps) * per_decade)) + 1
    return [float(f"{b:.4g}") for b in np.logspace(np.log10(lo_mbps), np.log10(hi_mbps), n)]


def decision_of(plan_assign: np.ndarray, processors: tuple[str, ...]) -> str:
    counts = np.bincount(plan_assign, minlength=len(processors))
    return " ".join(f"{processors[p]}:{int(c)}" for p, c in enumerate(counts) if c)


def needs_network(has_server_and_link: bool) -> None:
    """Refuse a sweep of a plan without a server: no bandwidth changes it.

    Raises:
        PlanError: when ``has_server_and_link`` is false.
    """
    if not has_server_and_link:
        raise PlanError(
            "the plan has no server and link, so bandwidth changes nothing (partition with "
            "--server)"
        )


def bandwidth_sweep(
    problem: Problem, bandwidths: list[float] | None = None, *, max_evals: int = 150
) -> list[SweepRow]:
    """Re-solve ``problem`` at each bandwidth (up and down set alike).

    ``problem`` is usually a plan's own, loaded again by
    :func:`edgesplit.workflows.resolve.problem_from_plan`.

    Raises:
        PlanError: for a problem without a server (nothing crosses a network).
    """
    needs_network(problem.server is not None and problem.link is not None)
    assert problem.link is not None
    base = problem.link
    name = objective(problem.objective).sweep_objective
    rows: list[SweepRow] = []
    prev = None
    for bw in bandwidths or log_bandwidths():
        link = replace(base, up_mbps=bw, down_mbps=bw, name=f"{base.name.split('@')[0]}@{bw:g}mbps")
        cm = build_costs(
            problem.graph,
            problem.profile,
            problem.full_device,
            server=problem.server,
            link=link,
            pins=problem.pins,
        )
        try:
            out = solve(cm, name, slo_ms=problem.slo_ms, max_evals=max_evals)
        except PlanError:
            continue  # an SLO this bandwidth cannot meet
        decision = decision_of(out.assign, cm.processors)
        rows.append(
            SweepRow(
                bw,
                round(out.schedule.makespan_ms, 6),
                round(out.schedule.energy_mj, 6),
                decision,
                prev is not None and decision != prev,
                {b.name: b.latency_ms for b in out.baselines},
            )
        )
        prev = decision
    return rows
