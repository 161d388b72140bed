"""Plans for every bandwidth: the bandwidths where the best plan changes, found exactly.

A plan's cost at an uplink rate ``b`` (the downlink scaled alike, keeping the link's ratio) is
its nodes, its fixed link latencies, and ``nbytes * 8 / b`` per network crossing: a function of
``t = 1/b`` that is linear wherever nothing overlaps (the sequential latency and the energy are
exactly linear in ``t``) and, for the concurrent schedule, linear on each stretch where the
schedule's order stays the same. The best value over all plans is the lower envelope of these
curves: for linear ones a concave function of ``t`` with one breakpoint per change of plan.

:func:`band_table` finds the envelope the way Eisner and Severance (1976) do for parametric
problems, with the solver (:func:`edgesplit.optimize.solve.solve`) as the oracle:

1. Solve at every point of a log grid (``per_decade`` a decade); every plan found is a candidate.
2. Between two neighbours whose best candidates A and B differ, find where A and B cost the same
   (bisection on the sign of their difference, to a relative width ``rel_tol``: that is how exact a
   breakpoint is). Solve there: a plan better than both at that bandwidth becomes a candidate and
   both halves are searched again; otherwise the crossing is a breakpoint.
3. Solve again just below and just above every breakpoint; a plan better than the table's there is
   added and the envelope is computed again (until nothing new turns up).

Where one plan is best at both ends of an interval, a linear curve is best throughout (a line that
touches a concave envelope at two points is the envelope between them), so with an exact solver and
linear costs the table is exact: at every bandwidth its plan is optimal. For the makespan the
solver is a bounded search and the curves are piecewise linear, so the table is exact for the
plans found, and checked against the solver on both sides of each breakpoint.

A processor with two backends (ORT and TVM) can be priced two ways: each node on its fastest
backend, or one backend for the whole processor (which saves the hand-offs between them; see
:func:`edgesplit.optimize.planner._fewest_backends`). The table takes both pricings as candidates,
so a
band's plan is never one that cuts a processor's run into ORT and TVM parts where one runtime alone
is faster (squeezenet on ``host`` with an H200 server: at 0.1 Mbit/s the first pricing's best plan,
12 parts on the CPU, was predicted at 7.04 ms, ORT alone at 5.66 ms).

Everything here is pure: a :class:`CostModel` in, assignments out. :func:`problem_band_table` and
:func:`band_plans` apply it to a :class:`~edgesplit.optimize.problem.Problem`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import TypedDict, Unpack

import numpy as np

from edgesplit.device.spec import NetworkLink
from edgesplit.errors import PlanError
from edgesplit.optimize.costs import CostModel
from edgesplit.optimize.evaluate import sequential_cost
from edgesplit.optimize.objectives import objective
from edgesplit.optimize.pipeline import period_ms
from edgesplit.optimize.plan import Plan, SolverInfo
from edgesplit.optimize.planner import costs_of, make_plan, pricings
from edgesplit.optimize.problem import Problem
from edgesplit.optimize.schedule import makespan_ms, schedule
from edgesplit.optimize.solve import Outcome, solve
from edgesplit.optimize.sweep import decision_of, log_bandwidths, needs_network

UP, DOWN = 0, 1  # CostModel.channel ids of the uplink and the downlink (see costs._links)
_SLO_PENALTY = 1e12  # plans over the SLO rank after every plan that meets it, by their latency


@dataclass(frozen=True)
class Band:
    """Bandwidths ``[lo_mbps, hi_mbps)`` (uplink) where plan ``plan`` is the best.

    Attributes:
        value_lo, value_hi: The plan's value (the objective's figure, ms or mJ) at the two ends.
    """

    lo_mbps: float
    hi_mbps: float
    plan: int
    value_lo: float
    value_hi: float


@dataclass(frozen=True, eq=False)
class BandTable:
    """The best plan for every bandwidth from ``lo_mbps`` to ``hi_mbps``.

    Attributes:
        objective: What the plans minimise (a key of ``OBJECTIVES``).
        bands: In increasing bandwidth, contiguous; neighbours have different plans.
        assigns: The plans (node -> processor index), indexed by :attr:`Band.plan`.
        decisions: Per plan, which processors run how many nodes (``cpu:21 server.gpu:40``).
        solver_calls: Times the solver was run.
        time_s: Time the analysis took.
        pricing: Per plan, the cost model it is priced in: 0 for the table's own, ``k`` for its
            ``k``-th alternative (empty: all 0).
    """

    objective: str
    lo_mbps: float
    hi_mbps: float
    bands: tuple[Band, ...]
    assigns: tuple[np.ndarray, ...]
    decisions: tuple[str, ...]
    solver_calls: int
    time_s: float
    pricing: tuple[int, ...] = ()

    def pricing_of(self, plan: int) -> int:
        return self.pricing[plan] if self.pricing else 0

    @property
    def breakpoints_mbps(self) -> tuple[float, ...]:
        return tuple(b.lo_mbps for b in self.bands[1:])

    def band_at(self, bandwidth_mbps: float) -> Band:
        """The band holding ``bandwidth_mbps`` (the first or last band beyond the range)."""
        for b in self.bands:
            if bandwidth_mbps < b.hi_mbps:
                return b
        return self.bands[-1]

    def plan_at(self, bandwidth_mbps: float) -> np.ndarray:
        return self.assigns[self.band_at(bandwidth_mbps).plan]


# ---- the link as a parameter


def link_rates(cm: CostModel) -> tuple[float, float]:
    """The cost model's uplink and downlink rates (Mbit/s).

    Raises:
        PlanError: for a cost model without a network link (no server): no bandwidth changes it.
    """
    up = cm.link_ms_per_byte[cm.channel == UP]
    down = cm.link_ms_per_byte[cm.channel == DOWN]
    if up.size == 0 or down.size == 0:
        raise PlanError(
            "the problem has no server and link, so bandwidth changes nothing (give a server)"
        )
    return 8e-3 / float(up.max()), 8e-3 / float(down.max())


def with_rate(cm: CostModel, up_mbps: float) -> CostModel:
    """``cm`` with its uplink at ``up_mbps`` and its downlink scaled by the same factor.

    Only the network crossings' time per byte changes: the RTT, the radio power and every other
    term (whatever the cost model prices) stay as they are.
    """
    up0, _ = link_rates(cm)
    scale = up0 / up_mbps
    per_byte = cm.link_ms_per_byte.copy()
    net = (cm.channel == UP) | (cm.channel == DOWN)
    per_byte[net] *= scale
    return replace(cm, link_ms_per_byte=per_byte)


def link_at(link: NetworkLink, up_mbps: float) -> NetworkLink:
    """``link`` at uplink ``up_mbps``, its downlink scaled alike (as :func:`with_rate` does)."""
    base = link.name.split("@")[0]
    return replace(
        link,
        up_mbps=up_mbps,
        down_mbps=link.down_mbps * up_mbps / link.up_mbps,
        name=f"{base}@{up_mbps:.6g}mbps",
    )


# ---- the analysis


class _Envelope:
    """Candidates (a plan in one of the pricings), their values at bandwidths (cached), and the
    solver's plans at bandwidths (one per pricing)."""

    def __init__(
        self, cms: Sequence[CostModel], objective_name: str, slo_ms: float | None, max_evals: int
    ):
        self.bases, self.name, self.slo_ms, self.max_evals = (
            tuple(cms),
            objective_name,
            slo_ms,
            max_evals,
        )
        self.obj = objective(objective_name)
        self.cands: list[np.ndarray] = []
        self.pricing: list[int] = []
        self._index: dict[tuple[int, bytes], int] = {}
        self._cms: dict[tuple[int, float], CostModel] = {}
        self._values: dict[tuple[int, float], float] = {}
        self._solved: set[float] = set()
        self.solver_calls = 0

    def cost_model(self, bw: float, pricing: int = 0) -> CostModel:
        if (pricing, bw) not in self._cms:
            self._cms[pricing, bw] = with_rate(self.bases[pricing], bw)
        return self._cms[pricing, bw]

    def add(self, assign: np.ndarray, pricing: int = 0) -> int:
        a = np.asarray(assign, dtype=np.int64)
        key = (pricing, a.tobytes())
        if key not in self._index:
            self._index[key] = len(self.cands)
            self.cands.append(a)
            self.pricing.append(pricing)
        return self._index[key]

    def value(self, i: int, bw: float) -> float:
        key = (i, bw)
        if key not in self._values:
            cm = self.cost_model(bw, self.pricing[i])
            v = float(self.obj.value(cm)(self.cands[i]))
            if self.slo_ms is not None:
                latency = makespan_ms(cm, self.cands[i])
                if latency > self.slo_ms * (1 + 1e-9):
                    v = _SLO_PENALTY + latency
            self._values[key] = v
        return self._values[key]

    def solve_at(self, bw: float) -> None:
        """Run the solver at ``bw`` (once per pricing) and add its plans."""
        if bw in self._solved:
            return
        self._solved.add(bw)
        for k in range(len(self.bases)):
            self.solver_calls += 1
            cm = self.cost_model(bw, k)
            try:
                out = solve(cm, self.name, slo_ms=self.slo_ms, max_evals=self.max_evals)
            except PlanError:
                if self.slo_ms is None:
                    raise
                out = solve(
                    cm, "latency", max_evals=self.max_evals
                )  # none meets the SLO: the fastest
            self.add(out.assign, k)

    def best(self, bw: float) -> int:
        """The best candidate at ``bw`` (the first of equals: ties keep the older plan)."""
        values = [self.value(i, bw) for i in range(len(self.cands))]
        return int(np.argmin(values))

    def crossing(self, a: float, b: float, ia: int, ib: int, rel_tol: float) -> float:
        """Where plans ``ia`` (best at ``a``) and ``ib`` (best at ``b``) cost the same: bisection in
        log bandwidth on the sign of their difference, to ``b / a <= 1 + rel_tol``."""
        lo, hi = math.log(a), math.log(b)
        while hi - lo > math.log1p(rel_tol):
            mid = 0.5 * (lo + hi)
            x = math.exp(mid)
            if self.value(ia, x) <= self.value(ib, x):
                lo = mid
            else:
                hi = mid
        return math.exp(hi)


def _refine(
    env: _Envelope, a: float, b: float, rel_tol: float, tol: float, depth: int = 0
) -> list[float]:
    """The breakpoints in ``(a, b)``, solving at each crossing of the two plans best at its ends."""
    ia, ib = env.best(a), env.best(b)
    if ia == ib or b / a <= 1 + rel_tol:
        return [] if ia == ib else [b]
    x = env.crossing(a, b, ia, ib, rel_tol)
    env.solve_at(x)
    w = env.best(x)
    here = min(env.value(ia, x), env.value(ib, x))
    if w not in (ia, ib) and env.value(w, x) < here - tol * max(abs(here), 1e-12) and depth < 60:
        return _refine(env, a, x, rel_tol, tol, depth + 1) + _refine(
            env, x, b, rel_tol, tol, depth + 1
        )
    return [x]


def _bands(env: _Envelope, points: list[float]) -> list[tuple[float, float, int]]:
    """Contiguous bands between ``points`` (sorted, ends included), each with its best plan,
    neighbours with the same plan merged."""
    out: list[tuple[float, float, int]] = []
    for lo, hi in zip(points, points[1:]):
        plan = env.best(math.sqrt(lo * hi))
        if out and out[-1][2] == plan:
            out[-1] = (out[-1][0], hi, plan)
        else:
            out.append((lo, hi, plan))
    return out


class BandSearch(TypedDict, total=False):
    """Where and how finely :func:`band_table` looks (every key optional)."""

    lo_mbps: float
    """The lowest uplink rate (default 0.1 Mbit/s)."""
    hi_mbps: float
    """The highest uplink rate (default 1000 Mbit/s)."""
    per_decade: int
    """Grid points a decade where the solver runs first (default 4)."""
    slo_ms: float | None
    """Plans over it rank after every plan under it (where none meets it, the fastest)."""
    rel_tol: float
    """How exact a breakpoint is: it lies within a relative ``rel_tol`` of the crossing (1e-6)."""
    tol: float
    """A plan must be better by this relative margin to count as a different optimum (1e-9)."""
    max_evals: int
    """Solver evaluations per pricing (default 150)."""


def band_table(
    cm: CostModel,
    objective_name: str = "latency",
    *,
    seeds: Iterable[np.ndarray] = (),
    alternatives: Sequence[CostModel] = (),
    **search: Unpack[BandSearch],
) -> BandTable:
    """The best plan for every uplink rate from ``lo_mbps`` to ``hi_mbps`` (see the module doc).

    Args:
        cm: The cost model at any rate (its link is rescaled; see :func:`with_rate`).
        objective_name: What the plans minimise, judged by ``Objective.value``.
        seeds: Plans to consider besides the solver's (a plan already made, say), in every pricing.
        alternatives: The same problem priced otherwise (one backend per processor, say): plans
            are solved and valued in each pricing too, and :attr:`BandTable.pricing` records the
            one each plan of the table is priced in.
        search: :class:`BandSearch`: the range of rates, how finely, and the SLO.

    Raises:
        PlanError: for a cost model without a network link, or a range that is not positive.
    """
    lo_mbps, hi_mbps = search.get("lo_mbps", 0.1), search.get("hi_mbps", 1000.0)
    per_decade, slo_ms = search.get("per_decade", 4), search.get("slo_ms")
    rel_tol, tol, max_evals = (
        search.get("rel_tol", 1e-6),
        search.get("tol", 1e-9),
        search.get("max_evals", 150),
    )
    if not 0 < lo_mbps < hi_mbps:
        raise PlanError(
            f"the bandwidth range must be 0 < lo < hi, got {lo_mbps:g} to {hi_mbps:g} Mbit/s"
        )
    t0 = time.perf_counter()
    link_rates(cm)
    env = _Envelope([cm, *alternatives], objective_name, slo_ms, max_evals)
    for s in seeds:
        for k in range(len(env.bases)):
            env.add(s, k)
    grid = sorted({lo_mbps, hi_mbps, *(b for b in log_bandwidths(lo_mbps, hi_mbps, per_decade))})
    grid = [b for b in grid if lo_mbps <= b <= hi_mbps]
    for b in grid:
        env.solve_at(b)
    for _ in range(8):  # each pass adds plans the checks found; it stops when none is new
        n = len(env.cands)
        breaks = [x for a, b in zip(grid, grid[1:]) for x in _refine(env, a, b, rel_tol, tol)]
        points = [lo_mbps, *sorted(breaks), hi_mbps]
        for x in breaks:  # both sides of every breakpoint
            env.solve_at(x / (1 + 1e3 * rel_tol))
            env.solve_at(min(x * (1 + 1e3 * rel_tol), hi_mbps))
        for lo, hi in zip(points, points[1:]):  # the middle of every band (for curves not linear)
            env.solve_at(math.sqrt(lo * hi))
        if len(env.cands) == n:
            break
    raw = _bands(env, points)
    used = list(dict.fromkeys(p for _, _, p in raw))
    bands = tuple(
        Band(lo, hi, used.index(p), round(env.value(p, lo), 9), round(env.value(p, hi), 9))
        for lo, hi, p in raw
    )
    assigns = tuple(env.cands[p] for p in used)
    pricing = tuple(env.pricing[p] for p in used)
    return BandTable(
        objective_name,
        lo_mbps,
        hi_mbps,
        bands,
        assigns,
        tuple(decision_of(a, cm.processors) for a in assigns),
        env.solver_calls,
        time.perf_counter() - t0,
        pricing if alternatives else (),
    )


def curves(
    cm: CostModel | Sequence[CostModel],
    objective_name: str,
    assigns: Iterable[np.ndarray],
    bandwidths: Iterable[float],
    pricing: Sequence[int] = (),
) -> list[list[float]]:
    """Each plan's value at each bandwidth (for a latency-against-bandwidth plot); with several
    cost models, plan ``k`` is priced in ``cm[pricing[k]]`` (as :attr:`BandTable.pricing`)."""
    obj = objective(objective_name)
    bases = [cm] if isinstance(cm, CostModel) else list(cm)
    bws = list(bandwidths)
    models = [[with_rate(base, b) for b in bws] for base in bases]
    return [
        [float(obj.value(m)(np.asarray(a))) for m in models[pricing[k] if pricing else 0]]
        for k, a in enumerate(assigns)
    ]


# ---- a problem's band table, and a plan per band


def problem_costs(problem: Problem) -> CostModel:
    """The cost model of ``problem`` at its own link (rescaled for other bandwidths).

    Raises:
        PlanError: for a problem without a server and link.
    """
    needs_network(problem.server is not None and problem.link is not None)
    return costs_of(problem)


def problem_pricings(problem: Problem) -> list[CostModel]:
    """The pricings a band table weighs (:func:`~edgesplit.optimize.planner.pricings`), indexed as
    :attr:`BandTable.pricing`.

    Raises:
        PlanError: for a problem without a server and link.
    """
    needs_network(problem.server is not None and problem.link is not None)
    return pricings(problem)


def problem_band_table(
    problem: Problem, *, seeds: Iterable[np.ndarray] = (), max_evals: int = 150, **options
) -> BandTable:
    """:func:`band_table` of ``problem`` for its objective (``pareto``: latency, as in a sweep).

    ``options``: ``lo_mbps``, ``hi_mbps``, ``per_decade``, ``rel_tol``, ``tol``.
    """
    cm, *alternatives = problem_pricings(problem)
    name = objective(problem.objective).sweep_objective
    return band_table(
        cm,
        name,
        slo_ms=problem.slo_ms,
        seeds=seeds,
        max_evals=max_evals,
        alternatives=alternatives,
        **options,
    )


def plan_assignment(cm: CostModel, plan: Plan) -> np.ndarray:
    """A plan's node -> processor as the indices of ``cm`` (to seed a band table with it)."""
    return np.array(
        [cm.proc_index(plan.assignment[n]["processor"]) for n in cm.nodes], dtype=np.int64
    )


def representative_mbps(table: BandTable, plan: int) -> float:
    """The bandwidth a band plan is made at: the middle (in log) of its widest band."""
    widest = max((b for b in table.bands if b.plan == plan), key=lambda b: b.hi_mbps / b.lo_mbps)
    return math.sqrt(widest.lo_mbps * widest.hi_mbps)


def band_plans(problem: Problem, table: BandTable) -> tuple[Plan, ...]:
    """One :class:`Plan` per plan of ``table``, priced at :func:`representative_mbps` and recording
    that link (so each plan reads as if partitioned at that bandwidth)."""
    assert problem.link is not None
    bases = problem_pricings(problem)
    plans = []
    for k, assign in enumerate(table.assigns):
        bw = representative_mbps(table, k)
        cm = with_rate(bases[table.pricing_of(k)], bw)
        sched = schedule(cm, assign)
        bands = ", ".join(f"{b.lo_mbps:.4g}-{b.hi_mbps:.4g}" for b in table.bands if b.plan == k)
        info = SolverInfo(
            "band-table",
            round(table.time_s, 6),
            False,
            None,
            "makespan",
            f"the best of {len(table.assigns)} plans at {bands} Mbit/s ({table.solver_calls} "
            "solver runs)",
        )
        out = Outcome(
            assign,
            sched,
            period_ms(cm, assign),
            sequential_cost(cm, assign, "latency"),
            info,
            (),
            {},
        )
        plans.append(make_plan(replace(problem, link=link_at(problem.link, bw)), cm, out))
    return tuple(plans)


@dataclass(frozen=True)
class BandAnalysis:
    """A plan's band table and one :class:`Plan` per plan of it (``None`` table: why there is
    none)."""

    table: BandTable | None
    plans: tuple[Plan, ...]
    reason: str = ""


def band_analysis(plan: Plan, problem: Problem | None, **options) -> BandAnalysis:
    """The band table of ``plan``'s problem, seeded with the plan itself, and a plan per band.

    A plan without a server gets no table, and the reason; so does one whose ``problem`` could not
    be had (``None``: the caller says why in ``options["reason"]``).
    ``options``: ``lo_mbps``, ``hi_mbps``, ``per_decade``, ``max_evals`` (see :func:`band_table`).
    """
    reason = options.pop("reason", "the plan's problem is not at hand")
    if not (plan.server and plan.link):
        return BandAnalysis(None, (), "the plan has no server, so bandwidth changes nothing")
    if problem is None:
        return BandAnalysis(None, (), reason)
    seed = plan_assignment(problem_costs(problem), plan)
    table = problem_band_table(problem, seeds=[seed], **options)
    return BandAnalysis(table, band_plans(problem, table))
