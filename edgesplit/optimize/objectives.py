"""The objectives a plan can be made for: one class each, in one table keyed by name.

:func:`edgesplit.optimize.solve.solve` looks the objective up in :data:`OBJECTIVES` and calls its
:meth:`Objective.choose`; nothing else branches on objective names. A new objective is one class
here and one line in the table (the CLI's ``--objective`` choices are read from it).

* ``latency``: one request, parts on different processors run concurrently. The exact sequential
  optimum (DP or MILP) and every feasible baseline seed a bounded local search on the part-level
  schedule's latency (:mod:`edgesplit.optimize.schedule`); the gap is to
  :func:`makespan_lower_bound`. On a plain chain without per-part terms nothing can overlap, so
  the sequential optimum is the makespan optimum.
* ``latency_sequential``: the sum of all node and crossing times (exact).
* ``energy``: device energy with nothing overlapping (exact), optionally with the sequential latency
  under ``slo_ms`` (a safe bound: the concurrent schedule only finishes sooner). The exact optimum
  and every feasible baseline then seed a local search on the energy of the part-level schedule,
  which also pays what each part, hand-off and request costs: the figure the plan shows. The
  sequential model cannot see parts, so its optimum may cost more there than a single processor
  (squeezenet on ``host-2core``: 2 parts at 56.17 mJ against 55.48 for core1 alone).
* ``throughput``: the pipelined period (:mod:`edgesplit.optimize.pipeline`), balanced stages then
  the local search; the gap is to a period lower bound.
* ``pareto``: latency against energy: the two extremes and exact minima of ``energy + w *
  latency`` for weights around their slope (the supported points of the front; points in its
  non-convex dents are not found), plus, with ``slo_ms``, the exact least energy under it. The plan
  is the point that meets ``slo_ms`` with the least energy or, without an SLO, the point nearest the
  utopia point after normalising both axes. The baselines and the ``latency`` and ``energy`` plans
  (refined on the schedule) join the candidates, and every point is priced on the schedule, so no
  point kept is dominated by one processor alone.

``latency``, ``energy`` and ``throughput`` then keep, of every assignment they scored within the
measured
noise of the best (``CostModel.ov.noise_rel``), the one with the fewest parts
(:func:`~edgesplit.optimize.search.fewest_parts`).
"""

from __future__ import annotations

import contextlib
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from edgesplit.errors import PlanError
from edgesplit.optimize.costs import CostModel
from edgesplit.optimize.evaluate import feasible, sequential_cost
from edgesplit.optimize.exact import Infeasible, is_chain, solve_sequential
from edgesplit.optimize.front import pareto_front, pick
from edgesplit.optimize.pipeline import balance_stages, period_ms
from edgesplit.optimize.plan import SolverInfo
from edgesplit.optimize.schedule import makespan_lower_bound, makespan_ms, schedule
from edgesplit.optimize.search import fewest_parts, local_search

Score = Callable[[np.ndarray], float]


@dataclass(frozen=True)
class Search:
    """What every objective's solver is given.

    Attributes:
        starts: Feasible baseline assignments, to seed local searches.
        t0: ``time.perf_counter()`` when solving began (solver times count from it).
    """

    cm: CostModel
    slo_ms: float | None = None
    time_limit_s: float = 60.0
    max_evals: int = 300
    pareto_points: int = 9
    starts: tuple[np.ndarray, ...] = ()
    t0: float = field(default_factory=time.perf_counter)

    def elapsed_s(self) -> float:
        return time.perf_counter() - self.t0


@dataclass(frozen=True)
class Choice:
    """An objective's answer: the assignment, the solver's account, and a Pareto front if any."""

    assign: np.ndarray
    info: SolverInfo
    pareto: tuple[dict, ...] = ()


class Objective(ABC):
    """One objective. Contract: :meth:`choose` returns a feasible assignment (support, pins and
    memory) or raises :class:`~edgesplit.optimize.exact.Infeasible`; it honours ``slo_ms`` where
    it can (the caller checks the chosen schedule against it either way).

    Attributes:
        name: The key in :data:`OBJECTIVES` (and the CLI choice).
        baseline_metric: ``latency`` or ``energy``: how the best of a baseline's candidates is
        picked.
        unit: The unit of :meth:`value` (``ms``, or ``mJ`` for energy).
        splits_operators: A plan for it may split operators between processors
            (:mod:`edgesplit.optimize.split`): one request's latency, which pieces running at
            once shorten.
    """

    name: str = ""
    baseline_metric: str = "latency"
    unit: str = "ms"
    one_figure: bool = True  # judged by :meth:`value` alone (not a trade-off between two figures)
    splits_operators: bool = False

    def score(self, cm: CostModel) -> Score:
        """The figure a local search minimises for this objective (default: the makespan)."""
        return lambda a: makespan_ms(cm, a)

    def value(self, cm: CostModel) -> Score:
        """The figure a plan made for this objective is judged by: what its solver minimises
        (band tables compare plans by it). Default: :meth:`score`."""
        return self.score(cm)

    @property
    def sweep_objective(self) -> str:
        """The objective a bandwidth sweep re-solves at each bandwidth (itself, by default)."""
        return self.name

    @abstractmethod
    def choose(self, search: Search) -> Choice: ...


def _plain_chain(cm: CostModel) -> bool:
    """A connected chain where no crossing can overlap any work and nothing is paid per part,
    hand-off or request: the makespan equals the sequential latency. Each node after the first
    reads the one before it (two unconnected nodes on two processors run at once), the graph input
    goes to the first node only, and only the last node's tensors go home."""
    if not is_chain(cm) or not cm.ov.is_zero():
        return False
    fed = {d for f in cm.flows if f.src >= 0 for d in f.dsts}
    last = cm.n_nodes - 1
    return all(n in fed for n in range(1, cm.n_nodes)) and not any(
        f.to_home and (f.dsts or f.src != last) for f in cm.flows
    )


def fastest(search: Search) -> Choice:
    """The least makespan: the sequential optimum, improved by a local search off a chain."""
    cm = search.cm
    seq = solve_sequential(cm, "latency")
    if _plain_chain(cm):
        detail = "on a chain the makespan is the sequential latency"
        return Choice(
            seq.assign,
            SolverInfo(seq.solver, search.elapsed_s(), seq.optimal, seq.gap, "makespan", detail),
        )
    score = OBJECTIVES["latency"].score(cm)
    assign, value, noise, evals = _refined(cm, [seq.assign, *search.starts], score, search)
    bound = makespan_lower_bound(cm)
    gap = max(0.0, (value - bound) / value) if value > 0 else 0.0
    info = SolverInfo(
        f"{seq.solver}+part-schedule+local-search",
        search.elapsed_s(),
        gap <= 1e-9,
        round(gap, 6),
        "makespan",
        f"{evals} schedules evaluated; lower bound {bound:.4f} ms (critical path / work)" + noise,
    )
    return Choice(assign, info)


def _refined(
    cm: CostModel, seeds: list[np.ndarray], score: Score, search: Search
) -> tuple[np.ndarray, float, str, int]:
    """The local search on ``score`` from ``seeds``, then of every assignment it scored within the
    measured noise of the best, the one with the fewest parts: that assignment, its score, the
    note saying so (empty when it is the best) and the number of schedules evaluated."""
    visited: list[tuple[float, np.ndarray]] = []
    _, best, evals = local_search(cm, seeds, score, max_evals=search.max_evals, visited=visited)
    assign, value, parts = fewest_parts(cm, visited, cm.ov.noise_rel)
    return assign, value, _noise_note(value, best, parts, cm.ov.noise_rel), evals


def _noise_note(value: float, best: float, parts: int, noise_rel: float) -> str:
    if value <= best * (1 + 1e-9):
        return ""
    return (
        f"; {parts} parts kept at {value:.4f} ms over {best:.4f} ms with more parts "
        f"(within the measured noise, {noise_rel:.1%})"
    )


def no_slo_message(slo_ms: float, best_ms: float) -> str:
    return (
        f"no plan meets the SLO of {slo_ms:g} ms: the best achievable latency is {best_ms:.3f} ms"
    )


class Latency(Objective):
    name = "latency"
    splits_operators = True

    def choose(self, search: Search) -> Choice:
        return fastest(search)


class LatencySequential(Objective):
    name = "latency_sequential"

    def value(self, cm: CostModel) -> Score:
        return lambda a: sequential_cost(cm, a, "latency")

    def choose(self, search: Search) -> Choice:
        sol = solve_sequential(
            search.cm, "latency", slo_ms=search.slo_ms, time_limit_s=search.time_limit_s
        )
        return Choice(
            sol.assign,
            SolverInfo(sol.solver, search.elapsed_s(), sol.optimal, sol.gap, "sequential"),
        )


class Energy(Objective):
    name = "energy"
    baseline_metric = "energy"
    unit = "mJ"

    def score(self, cm: CostModel) -> Score:
        return lambda a: schedule(cm, a).energy_mj

    def choose(self, search: Search) -> Choice:
        cm = search.cm
        try:
            sol = solve_sequential(
                cm, "energy", slo_ms=search.slo_ms, time_limit_s=search.time_limit_s
            )
        except Infeasible:
            if search.slo_ms is None:
                raise
            # the sequential bound is safe but strict; the concurrent plan may still meet the SLO
            got = fastest(search)
            detail = "no sequential plan meets the SLO; the fastest concurrent plan is used"
            return Choice(
                got.assign,
                SolverInfo(got.info.name, got.info.time_s, False, 1.0, "makespan", detail),
            )
        score = self._under_slo(cm, search.slo_ms)
        assign, best, noise, evals = _refined(cm, [sol.assign, *search.starts], score, search)
        if not np.isfinite(best) and search.slo_ms is not None:
            # no start met the SLO in the concurrent schedule (a core group's parts, say, which the
            # sequential forms price as one processor): search from the fastest concurrent plan
            got = fastest(search)
            assign, best, noise, more = _refined(cm, [got.assign, sol.assign], score, search)
            evals += more
        same = bool(
            np.array_equal(assign, sol.assign)
        )  # else the sequential bounds say nothing of it
        detail = (
            f"sequential optimum {sol.value:.4f} mJ, then {evals} schedules' energy evaluated "
            "(with each part's, hand-off's and request's costs); "
            + ("the sequential optimum" if same else "another assignment")
            + " kept"
            + noise
        )
        return Choice(
            assign,
            SolverInfo(
                sol.solver + "+local-search",
                search.elapsed_s(),
                sol.optimal and same,
                sol.gap if same else None,
                "sequential",
                detail,
            ),
        )

    def _under_slo(self, cm: CostModel, slo_ms: float | None) -> Score:
        """The schedule's energy, or infinity where its latency misses ``slo_ms``."""
        energy = self.score(cm)
        if slo_ms is None:
            return energy

        def score(a: np.ndarray) -> float:
            s = schedule(cm, a)
            return s.energy_mj if s.makespan_ms <= slo_ms * (1 + 1e-9) else float("inf")

        return score


class Throughput(Objective):
    name = "throughput"

    def score(self, cm: CostModel) -> Score:
        return lambda a: period_ms(cm, a)

    def choose(self, search: Search) -> Choice:
        cm = search.cm
        staged = balance_stages(cm)
        seeds = [staged] if staged is not None and feasible(cm, staged) else []
        seeds.append(solve_sequential(cm, "latency", time_limit_s=search.time_limit_s).assign)
        assign, value, noise, evals = _refined(cm, [*seeds, *search.starts], self.score(cm), search)
        fastest_ms = np.where(cm.allowed, cm.node_ms, np.inf).min(axis=1)
        bound = (
            max(float(fastest_ms.max()), float(fastest_ms.sum()) / cm.n_procs)
            if cm.n_nodes
            else 0.0
        )
        gap = max(0.0, (value - bound) / value) if value > 0 else 0.0
        info = SolverInfo(
            "stage-balance+local-search",
            search.elapsed_s(),
            gap <= 1e-9,
            round(gap, 6),
            "period",
            f"{evals} assignments evaluated; lower bound {bound:.4f} ms per input" + noise,
        )
        return Choice(assign, info)


class Pareto(Objective):
    """The front itself is :func:`edgesplit.optimize.front.pareto_front`."""

    name = "pareto"
    one_figure = False

    @property
    def sweep_objective(self) -> str:
        return (
            "latency"  # one point per bandwidth: re-solving the whole front each time is not needed
        )

    def choose(self, search: Search) -> Choice:
        refined = [fastest(search).assign]
        with contextlib.suppress(Infeasible):
            refined.append(OBJECTIVES["energy"].choose(search).assign)
        points, exact = pareto_front(
            search.cm,
            search.slo_ms,
            search.pareto_points,
            search.time_limit_s,
            extra=(*search.starts, *refined),
        )
        chosen = pick(points, search.slo_ms)
        if chosen is None:
            assert search.slo_ms is not None
            raise PlanError(no_slo_message(search.slo_ms, min(p["latency_ms"] for p in points)))
        front = tuple(
            {**{k: v for k, v in p.items() if not k.startswith("_")}, "chosen": p is chosen}
            for p in points
        )
        info = SolverInfo(
            "weighted-sum-exact",
            search.elapsed_s(),
            exact,
            0.0 if exact else 1.0,
            "sequential",
            f"{len(front)} non-dominated points"
            + ("" if exact else "; some points hit the time limit"),
        )
        return Choice(chosen["_assign"], info, front)


# The objectives by name: every entry point (API, partition, deploy, sweep) offers exactly these.
OBJECTIVES: dict[str, Objective] = {
    "latency": Latency(),
    "latency_sequential": LatencySequential(),
    "energy": Energy(),
    "throughput": Throughput(),
    "pareto": Pareto(),
}


def objective(name: str) -> Objective:
    """The objective called ``name``.

    Raises:
        PlanError: for an unknown name, listing the known ones.
    """
    try:
        return OBJECTIVES[name]
    except KeyError:
        raise PlanError(
            f"unknown objective '{name}' (objectives: {', '.join(OBJECTIVES)})"
        ) from None
