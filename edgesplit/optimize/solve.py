"""Choose an assignment for an objective, and price it and the baselines by the same model.

The objectives themselves (what each minimises and how) are in :mod:`edgesplit.optimize.objectives`,
one class each in a table; this module runs the one asked for, prices the baselines, and checks
the chosen schedule against the SLO.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from edgesplit.errors import PlanError
from edgesplit.optimize.baselines import baseline_candidates
from edgesplit.optimize.costs import CostModel
from edgesplit.optimize.evaluate import feasible, sequential_cost
from edgesplit.optimize.exact import Infeasible
from edgesplit.optimize.objectives import OBJECTIVES, Search, fastest, no_slo_message, objective
from edgesplit.optimize.pipeline import period_ms
from edgesplit.optimize.plan import Baseline, SolverInfo
from edgesplit.optimize.schedule import Schedule, schedule

__all__ = ["OBJECTIVES", "Outcome", "solve"]


@dataclass(frozen=True)
class Outcome:
    """The chosen assignment with its schedule, the solver's account, the baselines, the front."""

    assign: np.ndarray
    schedule: Schedule
    period_ms: float
    sequential_latency_ms: float
    solver: SolverInfo
    baselines: tuple[Baseline, ...]
    baseline_assign: dict[str, np.ndarray]
    pareto: tuple[dict, ...] = ()


def _baselines(cm: CostModel, metric: str) -> tuple[list[Baseline], dict[str, np.ndarray]]:
    """Each baseline priced; where one has several candidates, the best by ``metric``."""
    best: dict[str, tuple[float, Baseline, np.ndarray | None]] = {}
    for c in baseline_candidates(cm, metric):
        if c.assign is None:
            b = Baseline(c.name, None, None, False, c.summary)
            best.setdefault(c.name, (np.inf, b, None))
            continue
        s = schedule(cm, c.assign)
        v = s.energy_mj if metric == "energy" else s.makespan_ms
        period = period_ms(cm, c.assign)
        b = Baseline(
            c.name,
            round(s.makespan_ms, 6),
            round(s.energy_mj, 6),
            True,
            c.summary,
            round(1000.0 / period, 6) if period > 0 else None,
        )
        if c.name not in best or v < best[c.name][0]:
            best[c.name] = (v, b, c.assign)
    return [b for _, b, _ in best.values()], {
        n: a for n, (_, _, a) in best.items() if a is not None
    }


def solve(
    cm: CostModel,
    objective_name: str = "latency",
    *,
    slo_ms: float | None = None,
    time_limit_s: float = 60.0,
    max_evals: int = 300,
    pareto_points: int = 9,
) -> Outcome:
    """Pick the assignment for the objective called ``objective_name`` and price it and the
    baselines.

    Raises:
        PlanError: for an unknown objective, an SLO no plan meets (naming the best latency), or
            memory limits and pins that nothing fits.
    """
    obj = objective(objective_name)
    t0 = time.perf_counter()
    baselines, base_assign = _baselines(cm, obj.baseline_metric)
    seeds = list(base_assign.values())
    if slo_ms is not None and obj.baseline_metric != "latency":
        # under an SLO the search needs fast starts too: the baselines picked by latency
        seeds += list(_baselines(cm, "latency")[1].values())
    starts = tuple(a for a in seeds if feasible(cm, a))
    search = Search(cm, slo_ms, time_limit_s, max_evals, pareto_points, starts, t0)
    try:
        choice = obj.choose(search)
    except Infeasible as e:
        raise PlanError(f"no assignment fits the constraints (memory limits or pins): {e}") from e
    sched = schedule(cm, choice.assign)
    if slo_ms is not None and sched.makespan_ms > slo_ms * (1 + 1e-9):
        best_ms = min(sched.makespan_ms, schedule(cm, fastest(search).assign).makespan_ms)
        raise PlanError(no_slo_message(slo_ms, best_ms))
    return Outcome(
        choice.assign,
        sched,
        period_ms(cm, choice.assign),
        sequential_cost(cm, choice.assign, "latency"),
        choice.info,
        tuple(baselines),
        base_assign,
        choice.pareto,
    )
