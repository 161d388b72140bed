"""The latency-energy Pareto front of a cost model (the ``pareto`` objective's search).

The two extremes (least sequential latency, least energy) and exact minima of ``energy + w *
latency`` for weights around their slope: the supported points of the front, each exact and fast
(elimination applies). Points in the front's non-convex dents are not found. With an SLO, the
exact least energy under it is added.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from edgesplit.optimize.costs import CostModel
from edgesplit.optimize.evaluate import sequential_cost
from edgesplit.optimize.exact import Infeasible, solve_sequential
from edgesplit.optimize.schedule import schedule

Point = dict[str, Any]


def _candidates(
    cm: CostModel, slo_ms: float | None, points: int, time_limit_s: float
) -> tuple[list[np.ndarray], bool]:
    """Assignments on the front (possibly repeated), and whether each was solved exactly."""
    limit = max(1.0, time_limit_s / points)  # each point gets a share of the time limit
    fast = solve_sequential(cm, "latency", time_limit_s=limit)
    lean = solve_sequential(cm, "energy", time_limit_s=limit)
    assigns = [fast.assign, lean.assign]
    exact = fast.optimal and lean.optimal
    d_lat = sequential_cost(cm, lean.assign, "latency") - fast.value
    d_en = sequential_cost(cm, fast.assign, "energy") - lean.value
    if d_lat <= 1e-9 or d_en <= 1e-9:
        return assigns, exact
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
    return assigns, exact


def pareto_front(
    cm: CostModel,
    slo_ms: float | None,
    points: int,
    time_limit_s: float,
    extra: tuple[np.ndarray, ...] = (),
) -> tuple[list[Point], bool]:
    """The non-dominated points, by latency: ``latency_ms``, ``energy_mj``,
    ``sequential_latency_ms``, ``processors``, the assignment under ``_assign`` and its number of
    parts under ``_parts``; and whether every point was solved exactly. Points are priced on the
    part-level schedule; ``extra`` (feasible assignments: the baselines, plans refined on the
    schedule) join the candidates, since the sequential model cannot see what parts cost and may
    put a split where one processor alone is both faster and leaner. A point within the measured
    noise of one with fewer parts, on
    both figures, gives way to it."""
    assigns, exact = _candidates(cm, slo_ms, points, time_limit_s)
    assigns += [np.asarray(a, dtype=np.int64) for a in extra]
    seen: dict[bytes, Point] = {}
    for a in assigns:
        if a.tobytes() in seen:
            continue
        s = schedule(cm, a)
        seen[a.tobytes()] = {
            "latency_ms": round(s.makespan_ms, 6),
            "energy_mj": round(s.energy_mj, 6),
            "sequential_latency_ms": round(sequential_cost(cm, a, "latency"), 6),
            "processors": sorted({cm.processors[p] for p in a}),
            "_assign": a,
            "_parts": len(s.parts),
        }
    unique = {(p["latency_ms"], p["energy_mj"]): p for p in seen.values()}
    pts = sorted(unique.values(), key=lambda p: (p["latency_ms"], p["energy_mj"]))
    pts = [p for p in pts if not any(_simpler_within(q, p, cm.ov.noise_rel) for q in pts)]
    front = [
        p
        for p in pts
        if not any(
            (q["latency_ms"] <= p["latency_ms"] and q["energy_mj"] <= p["energy_mj"])
            and (q["latency_ms"], q["energy_mj"]) != (p["latency_ms"], p["energy_mj"])
            for q in pts
        )
    ]
    return front, exact


def _simpler_within(q: Point, p: Point, noise_rel: float) -> bool:
    """``q`` has fewer parts than ``p`` and is within the measured noise of it on both figures:
    measurement cannot tell them apart, and the simpler plan is kept (as for one-figure
    objectives, :func:`~edgesplit.optimize.search.fewest_parts`)."""
    near = 1.0 + noise_rel
    return (
        q["_parts"] < p["_parts"]
        and q["latency_ms"] <= p["latency_ms"] * near + 1e-9
        and q["energy_mj"] <= p["energy_mj"] * near + 1e-9
    )


def pick(front: list[Point], slo_ms: float | None) -> Point | None:
    """The point that meets ``slo_ms`` with the least energy (None: none meets it) or, without an
    SLO, the point nearest the utopia point after normalising both axes."""
    if slo_ms is not None:
        ok = [p for p in front if p["latency_ms"] <= slo_ms]
        return min(ok, key=lambda p: p["energy_mj"]) if ok else None
    lat = np.array([p["latency_ms"] for p in front])
    en = np.array([p["energy_mj"] for p in front])
    norm = (lat - lat.min()) / max(np.ptp(lat), 1e-12) + (en - en.min()) / max(np.ptp(en), 1e-12)
    return front[int(np.argmin(norm))]
