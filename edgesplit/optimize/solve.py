"""Choose an assignment for an objective: the exact solvers, the schedule search, the baselines.

Objectives:

* ``latency``: one request, parts on different processors run concurrently. The exact sequential
  optimum (DP or MILP) and every feasible baseline seed a bounded local search on the list-schedule
  makespan; the gap is to :func:`makespan_lower_bound`. On a chain nothing can overlap, so the
  sequential optimum is the makespan optimum.
* ``latency_sequential``: the sum of all node and crossing times (exact).
* ``energy``: device energy with nothing overlapping (exact), optionally with the sequential latency
  under ``slo_ms`` (a safe bound: the concurrent schedule only finishes sooner).
* ``throughput``: the pipelined period (:mod:`edgesplit.optimize.pipeline`), balanced stages then
  the local search; the gap is to a period lower bound.
* ``pareto``: latency against energy: the two extremes and exact minima of ``energy + w *
  latency`` for weights around their slope (the supported points of the front; points in its
  non-convex dents are not found), plus, with ``slo_ms``, the exact least energy under it. The plan
  is the point that meets ``slo_ms`` with the least energy or, without an SLO, the point nearest the
  utopia point after normalising both axes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from edgesplit.errors import PlanError
from edgesplit.optimize.baselines import baseline_candidates
from edgesplit.optimize.costs import CostModel
from edgesplit.optimize.evaluate import feasible, sequential_cost
from edgesplit.optimize.exact import Infeasible, is_chain, solve_sequential
from edgesplit.optimize.pipeline import balance_stages, period_ms
from edgesplit.optimize.plan import Baseline, SolverInfo
from edgesplit.optimize.schedule import Schedule, makespan_lower_bound, schedule
from edgesplit.optimize.search import local_search

OBJECTIVES = ("latency", "latency_sequential", "energy", "throughput", "pareto")


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


def _score(cm: CostModel, objective: str):
    if objective == "energy":
        return lambda a: schedule(cm, a).energy_mj
    if objective == "throughput":
        return lambda a: period_ms(cm, a)
    return lambda a: schedule(cm, a).makespan_ms


def _baselines(cm: CostModel, objective: str) -> tuple[list[Baseline], dict[str, np.ndarray]]:
    key = "energy" if objective == "energy" else "latency"
    best: dict[str, tuple[float, Baseline, np.ndarray | None]] = {}
    for c in baseline_candidates(cm, key):
        if c.assign is None:
            b = Baseline(c.name, None, None, False, c.summary)
            best.setdefault(c.name, (np.inf, b, None))
            continue
        s = schedule(cm, c.assign)
        v = s.energy_mj if key == "energy" else s.makespan_ms
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
    return [b for _, b, _ in best.values()], {n: a for n, (_, _, a) in best.items() if a is not None}


def _plain_chain(cm: CostModel) -> bool:
    """A chain where no crossing can overlap any work: the makespan equals the sequential latency."""
    return is_chain(cm) and not any(f.to_home and f.dsts for f in cm.flows)


def _latency(
    cm: CostModel, starts: list[np.ndarray], max_evals: int, t0: float
) -> tuple[np.ndarray, SolverInfo]:
    seq = solve_sequential(cm, "latency")
    if _plain_chain(cm):
        return seq.assign, SolverInfo(
            f"{seq.solver}",
            time.perf_counter() - t0,
            seq.optimal,
            seq.gap,
            "makespan",
            "on a chain the makespan is the sequential latency",
        )
    assign, value, evals = local_search(cm, [seq.assign, *starts], _score(cm, "latency"), max_evals=max_evals)
    bound = makespan_lower_bound(cm)
    gap = max(0.0, (value - bound) / value) if value > 0 else 0.0
    return assign, SolverInfo(
        f"{seq.solver}+list-schedule+local-search",
        time.perf_counter() - t0,
        gap <= 1e-9,
        round(gap, 6),
        "makespan",
        f"{evals} schedules evaluated; lower bound {bound:.4f} ms (critical path / work)",
    )


def _no_slo_message(cm: CostModel, slo_ms: float, best_ms: float) -> str:
    return f"no plan meets the SLO of {slo_ms:g} ms: the best achievable latency is {best_ms:.3f} ms"


def _pareto(
    cm: CostModel, slo_ms: float | None, points: int, time_limit_s: float
) -> tuple[np.ndarray, list[dict], bool]:
    limit = max(1.0, time_limit_s / points)  # each point gets a share of the time limit
    fast = solve_sequential(cm, "latency", time_limit_s=limit)
    lean = solve_sequential(cm, "energy", time_limit_s=limit)
    assigns = [fast.assign, lean.assign]
    exact = fast.optimal and lean.optimal
    d_lat = sequential_cost(cm, lean.assign, "latency") - fast.value
    d_en = sequential_cost(cm, fast.assign, "energy") - lean.value
    if d_lat > 1e-9 and d_en > 1e-9:
        # weighted sums energy + w * latency around the extremes' slope: the supported points of the
        # front, each exact and fast (elimination applies); an SLO adds its own constrained point
        slope = d_en / d_lat
        for w in slope * np.geomspace(1 / 32, 32, max(points - 2, 1)):
            sol = solve_sequential(cm, f"mix:{w:.12g}", time_limit_s=limit)
            assigns.append(sol.assign)
            exact = exact and sol.optimal
        if slo_ms is not None:
            try:
                sol = solve_sequential(cm, "energy", slo_ms=slo_ms, time_limit_s=limit)
                assigns.append(sol.assign)
                exact = exact and sol.optimal
            except Infeasible:
                pass
    seen: dict[bytes, dict] = {}
    for a in assigns:
        if a.tobytes() in seen:
            continue
        s = schedule(cm, a)
        used = sorted({cm.processors[p] for p in a})
        seen[a.tobytes()] = {
            "latency_ms": round(s.makespan_ms, 6),
            "energy_mj": round(s.energy_mj, 6),
            "sequential_latency_ms": round(sequential_cost(cm, a, "latency"), 6),
            "processors": used,
            "_assign": a,
        }
    unique = {(p["latency_ms"], p["energy_mj"]): p for p in seen.values()}
    pts = sorted(unique.values(), key=lambda p: (p["latency_ms"], p["energy_mj"]))
    front = [
        p
        for p in pts
        if not any(
            (q["latency_ms"] <= p["latency_ms"] and q["energy_mj"] <= p["energy_mj"])
            and (q["latency_ms"], q["energy_mj"]) != (p["latency_ms"], p["energy_mj"])
            for q in pts
        )
    ]
    if slo_ms is not None:
        ok = [p for p in front if p["latency_ms"] <= slo_ms]
        if not ok:
            raise PlanError(_no_slo_message(cm, slo_ms, min(p["latency_ms"] for p in front)))
        chosen = min(ok, key=lambda p: p["energy_mj"])
    else:
        lat = np.array([p["latency_ms"] for p in front])
        en = np.array([p["energy_mj"] for p in front])
        norm = (lat - lat.min()) / max(np.ptp(lat), 1e-12) + (en - en.min()) / max(np.ptp(en), 1e-12)
        chosen = front[int(np.argmin(norm))]
    for p in front:
        p["chosen"] = p is chosen
    return chosen["_assign"], [{k: v for k, v in p.items() if k != "_assign"} for p in front], exact


def solve(
    cm: CostModel,
    objective: str = "latency",
    *,
    slo_ms: float | None = None,
    time_limit_s: float = 60.0,
    max_evals: int = 300,
    pareto_points: int = 9,
) -> Outcome:
    """Pick the assignment for ``objective`` and price it and the baselines.

    Raises:
        PlanError: for an unknown objective, an SLO no plan meets (naming the best latency), or
            memory limits that nothing fits.
    """
    if objective not in OBJECTIVES:
        raise PlanError(f"unknown objective '{objective}' (objectives: {', '.join(OBJECTIVES)})")
    t0 = time.perf_counter()
    baselines, base_assign = _baselines(cm, objective)
    starts = [a for a in base_assign.values() if feasible(cm, a)]
    pareto: list[dict] = []
    try:
        if objective == "latency":
            assign, info = _latency(cm, starts, max_evals, t0)
        elif objective == "latency_sequential":
            sol = solve_sequential(cm, "latency", slo_ms=slo_ms, time_limit_s=time_limit_s)
            assign = sol.assign
            info = SolverInfo(sol.solver, time.perf_counter() - t0, sol.optimal, sol.gap, "sequential")
        elif objective == "energy":
            try:
                sol = solve_sequential(cm, "energy", slo_ms=slo_ms, time_limit_s=time_limit_s)
                assign = sol.assign
                info = SolverInfo(sol.solver, time.perf_counter() - t0, sol.optimal, sol.gap, "sequential")
            except Infeasible:
                if slo_ms is None:
                    raise
                # the sequential bound is safe but strict; the concurrent plan may still meet the SLO
                assign, info = _latency(cm, starts, max_evals, t0)
                info = SolverInfo(
                    info.name,
                    info.time_s,
                    False,
                    1.0,
                    "makespan",
                    "no sequential plan meets the SLO; the fastest concurrent plan is used",
                )
        elif objective == "throughput":
            staged = balance_stages(cm)
            seeds = [staged] if staged is not None and feasible(cm, staged) else []
            seeds.append(solve_sequential(cm, "latency", time_limit_s=time_limit_s).assign)
            assign, value, evals = local_search(
                cm, [*seeds, *starts], _score(cm, "throughput"), max_evals=max_evals
            )
            fastest = np.where(cm.allowed, cm.node_ms, np.inf).min(axis=1)
            bound = max(float(fastest.max()), float(fastest.sum()) / cm.n_procs) if cm.n_nodes else 0.0
            gap = max(0.0, (value - bound) / value) if value > 0 else 0.0
            info = SolverInfo(
                "stage-balance+local-search",
                time.perf_counter() - t0,
                gap <= 1e-9,
                round(gap, 6),
                "period",
                f"{evals} assignments evaluated; lower bound {bound:.4f} ms per input",
            )
        else:
            assign, pareto, exact = _pareto(cm, slo_ms, pareto_points, time_limit_s)
            info = SolverInfo(
                "weighted-sum-exact",
                time.perf_counter() - t0,
                exact,
                0.0 if exact else 1.0,
                "sequential",
                f"{len(pareto)} non-dominated points" + ("" if exact else "; some points hit the time limit"),
            )
    except Infeasible as e:
        raise PlanError(f"no assignment fits the constraints (memory limits or pins): {e}") from e
    sched = schedule(cm, assign)
    if slo_ms is not None and sched.makespan_ms > slo_ms * (1 + 1e-9):
        best = sched.makespan_ms if objective == "latency" else _latency(cm, starts, max_evals, t0)[0]
        best_ms = best if isinstance(best, float) else schedule(cm, best).makespan_ms
        raise PlanError(_no_slo_message(cm, slo_ms, best_ms))
    return Outcome(
        assign,
        sched,
        period_ms(cm, assign),
        sequential_cost(cm, assign, "latency"),
        info,
        tuple(baselines),
        base_assign,
        tuple(pareto),
    )
