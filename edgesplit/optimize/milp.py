"""Exact assignment for the sequential objectives as a MILP (HiGHS through scipy.optimize.milp).

Variables, for an assignment of nodes to processors with tensors counted once per destination:

* ``x[n,p]`` (binary): node n runs on p, only for allowed pairs; ``sum_p x[n,p] = 1``.
* ``y[t,q]`` in [0,1]: tensor t is needed on q: ``y[t,q] >= x[c,q]`` for each reader c (and 1 on
  the home processor for a graph output). A tensor with one reader uses ``x[c,q]`` itself.
* ``z[t,p,q]`` in [0,1]: t is made on p and needed on q (the product ``x[src,p] * y[t,q]``), in
  the tight form ``sum_p z[t,p,q] = y[t,q]``, ``z[t,p,q] <= x[src,p]``, ``sum_q z[t,p,q] >=
  x[src,p]``. Crossing costs sit on ``z`` with ``p != q``; a graph input's source is fixed at home,
  so it needs no ``z``.

With integral ``x`` the cheapest ``y, z`` are integral and equal the crossings, so the continuous
``y, z`` are exact; every cost is non-negative. The memory bound and a latency SLO are linear
rows over the same variables.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from edgesplit.optimize.costs import CostModel, Flow

_DISP = bool(os.environ.get("ES_MILP_DISP"))


class Infeasible(Exception):
    """No assignment meets the constraints (memory, pins, SLO)."""


@dataclass(frozen=True)
class Solution:
    """An assignment and what the solver knows about it."""

    assign: np.ndarray
    value: float
    solver: str
    optimal: bool
    gap: float
    time_s: float


class MilpModel:
    """Variables (objective cost, latency, bounds, integrality) and sparse rows ``lb <= sum coef *
    var <= ub``, solved by HiGHS through ``scipy.optimize.milp``. Shared by :func:`solve_milp` and
    the MILP on the core left by variable elimination (:mod:`edgesplit.optimize.factor`)."""

    def __init__(self) -> None:
        self.cost: list[float] = []
        self.lat: list[float] = []
        self.lb: list[float] = []
        self.ub: list[float] = []
        self.integral: list[int] = []
        self._r: list[int] = []
        self._c: list[int] = []
        self._v: list[float] = []
        self._row_lb: list[float] = []
        self._row_ub: list[float] = []

    def var(
        self,
        cost: float,
        lat: float = 0.0,
        *,
        binary: bool = False,
        lb: float = 0.0,
        ub: float = 1.0,
    ) -> int:
        self.cost.append(cost)
        self.lat.append(lat)
        self.lb.append(lb)
        self.ub.append(ub)
        self.integral.append(1 if binary else 0)
        return len(self.cost) - 1

    def row(self, terms, lb: float, ub: float) -> None:
        i = len(self._row_lb)
        for var, coef in terms:
            self._r.append(i)
            self._c.append(var)
            self._v.append(coef)
        self._row_lb.append(lb)
        self._row_ub.append(ub)

    def solve(self, time_limit_s: float, rel_gap: float = 1e-7):
        """scipy's ``OptimizeResult``."""
        # imported here: scipy.optimize takes most of a second to import, which every CLI command
        # (even one refusing its input) paid through the objectives table
        from scipy.optimize import Bounds, LinearConstraint, milp
        from scipy.sparse import csr_array

        a = csr_array((self._v, (self._r, self._c)), shape=(len(self._row_lb), len(self.cost)))
        return milp(
            c=np.asarray(self.cost),
            integrality=np.asarray(self.integral),
            bounds=Bounds(np.asarray(self.lb), np.asarray(self.ub)),
            constraints=LinearConstraint(a, np.asarray(self._row_lb), np.asarray(self._row_ub)),
            options={
                "time_limit": time_limit_s,
                "mip_rel_gap": rel_gap,
                "presolve": True,
                "disp": _DISP,
            },
        )


def solution(res, x: np.ndarray, started: float) -> Solution:
    """The assignment read off the binary ``x[n, p]`` (-1 where not allowed), and the solver's
    account.

    Raises:
        Infeasible: when the solver found no solution.
    """
    if res.x is None:
        if res.status == 2:
            raise Infeasible("no assignment meets the constraints")
        raise Infeasible(f"the MILP solver stopped without a solution ({res.message})")
    assign = np.zeros(len(x), dtype=np.int64)
    for n in range(len(x)):
        ps = np.flatnonzero(x[n] >= 0)
        assign[n] = ps[np.argmax(res.x[x[n, ps]])]
    gap = float(getattr(res, "mip_gap", 0.0) or 0.0)
    optimal = res.status == 0
    return Solution(
        assign,
        float(res.fun),
        "milp-highs",
        optimal,
        0.0 if optimal and gap < 1e-6 else gap,
        time.perf_counter() - started,
    )


Forms = tuple[tuple[np.ndarray, np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray, np.ndarray]]
Need = dict[int, tuple[str, int]]  # destination processor -> ("const", -1) | ("var", index)


def _node_vars(m: MilpModel, cm: CostModel, forms: Forms) -> np.ndarray:
    """Binary ``x[n, p]`` for every allowed pair (-1 elsewhere), one processor per node."""
    (a_obj, _, _), (a_lat, _, _) = forms
    x = np.full((cm.n_nodes, cm.n_procs), -1, dtype=np.int64)
    for n in range(cm.n_nodes):
        ps = np.flatnonzero(cm.allowed[n])
        for p in ps:
            lb = 1.0 if len(ps) == 1 else 0.0
            x[n, p] = m.var(float(a_obj[n, p]), float(a_lat[n, p]), binary=True, lb=lb)
        m.row([(int(x[n, p]), 1.0) for p in ps], 1.0, 1.0)
    return x


def _needs(m: MilpModel, cm: CostModel, f: Flow, x: np.ndarray) -> Need:
    """Where flow ``f`` is needed: a constant at home for a graph output, a reader's own ``x`` for
    a tensor with one reader, else ``y[t, q] >= x[c, q]`` for each reader c."""
    dst_opts = {cm.home} if f.to_home else set()
    for c in f.dsts:
        dst_opts.update(np.flatnonzero(cm.allowed[c]).tolist())
    need: Need = {}
    for q in sorted(dst_opts):
        if f.to_home and q == cm.home:
            need[q] = ("const", -1)
        elif len(f.dsts) == 1 and not f.to_home:
            need[q] = ("var", int(x[f.dsts[0], q]))
        else:
            y = m.var(0.0)
            for c in f.dsts:
                if cm.allowed[c, q]:
                    m.row([(y, 1.0), (int(x[c, q]), -1.0)], 0.0, np.inf)
            need[q] = ("var", y)
    return need


def _crossing(forms: Forms, f: Flow, p: int, q: int) -> tuple[float, float]:
    """(objective, latency) cost of flow ``f`` crossing from p to q."""
    (_, al_obj, be_obj), (_, al_lat, be_lat) = forms
    if p == q:
        return 0.0, 0.0
    return float(al_obj[p, q] + f.nbytes * be_obj[p, q]), float(
        al_lat[p, q] + f.nbytes * be_lat[p, q]
    )


def _flow(
    m: MilpModel, cm: CostModel, f: Flow, x: np.ndarray, forms: Forms, receive: list[list]
) -> None:
    """The crossing terms of one flow; ``receive[q]`` gets the bytes it brings to q."""
    need = _needs(m, cm, f, x)
    src_opts = [cm.home] if f.src < 0 else np.flatnonzero(cm.allowed[f.src]).tolist()
    if len(src_opts) == 1:  # a fixed source: the costs sit on the destinations' own variables
        p = src_opts[0]
        for q, (kind, ref) in need.items():
            if q == p:
                continue
            c_obj, c_lat = _crossing(forms, f, p, q)
            if kind == "const":  # a forced crossing: a constant, carried on a fixed variable
                receive[q].append((m.var(c_obj, c_lat, lb=1.0), float(f.nbytes)))
            else:
                m.cost[ref] += c_obj
                m.lat[ref] += c_lat
                receive[q].append((ref, float(f.nbytes)))
        return
    # exactly one destination when the tensor has one reader and is no graph output; then
    # sum_q z[p,q] = x[src,p] and the rows z[p,q] <= x[src,p] are implied
    single = len(f.dsts) == 1 and not f.to_home
    z: dict[tuple[int, int], int] = {}
    for p in src_opts:
        for q in need:
            z[p, q] = m.var(*_crossing(forms, f, p, q))
            if not single:
                m.row([(z[p, q], 1.0), (int(x[f.src, p]), -1.0)], -np.inf, 0.0)
    for q in need:
        receive[q].extend((z[p, q], float(f.nbytes)) for p in src_opts if p != q)
    x_src = {p: int(x[f.src, p]) for p in src_opts}
    crossing_rows(m, z, src_opts, need, x_src, supply_ub=0.0 if single else np.inf)


def crossing_rows(
    m: MilpModel,
    z: Mapping[tuple[int, int], int],
    src: Iterable[int],
    need: Need,
    x_src: Mapping[int, int],
    *,
    supply_ub: float,
) -> None:
    """The rows that tie a tensor's crossing variables ``z[p, q]`` (made on source processor p,
    read on q) to its source's and its destinations' variables.

    Each destination q gets the tensor from exactly one source processor: ``sum_p z[p, q]`` is 1
    where q must have it (``("const", _)``), else the variable of ``need[q]``. And the processor
    that makes it sends it: ``0 <= sum_q z[p, q] - x_src[p] <= supply_ub``. Shared by
    :func:`solve_milp` and the MILP of :mod:`edgesplit.optimize.factor`.
    """
    src = list(src)
    for q, (kind, ref) in need.items():
        terms = [(z[p, q], 1.0) for p in src]
        if kind == "const":
            m.row(terms, 1.0, 1.0)
        else:
            m.row([*terms, (ref, -1.0)], 0.0, 0.0)
    for p in src:
        m.row([*((z[p, q], 1.0) for q in need), (x_src[p], -1.0)], 0.0, supply_ub)


def _memory_rows(m: MilpModel, cm: CostModel, x: np.ndarray, receive: list[list]) -> None:
    """Per-processor and per-group memory limits over weights, activations and received bytes."""

    def mem_terms(p: int) -> list[tuple[int, float]]:
        terms = [(int(x[n, p]), float(cm.mem_nbytes[n])) for n in range(cm.n_nodes) if x[n, p] >= 0]
        return terms + receive[p]

    for p in range(cm.n_procs):
        if np.isfinite(cm.mem_limit_nbytes[p]):
            m.row(mem_terms(p), -np.inf, float(cm.mem_limit_nbytes[p]))
    for procs, limit in cm.group_limits:
        m.row([t for p in procs for t in mem_terms(p)], -np.inf, float(limit))


def solve_milp(
    cm: CostModel,
    objective: str,
    *,
    slo_ms: float | None = None,
    time_limit_s: float = 60.0,
    rel_gap: float = 1e-7,
) -> Solution:
    """Minimise the sequential ``latency`` or ``energy`` (optionally with latency <= ``slo_ms``).

    Raises:
        Infeasible: when memory, pins or the SLO leave no assignment.
    """
    started = time.perf_counter()
    forms: Forms = (cm.linear(objective), cm.linear("latency"))
    m = MilpModel()
    x = _node_vars(m, cm, forms)
    receive: list[list[tuple[int, float]]] = [[] for _ in range(cm.n_procs)]
    for f in cm.flows:
        _flow(m, cm, f, x, forms, receive)
    _memory_rows(m, cm, x, receive)
    if slo_ms is not None:
        m.row([(i, v) for i, v in enumerate(m.lat) if v != 0.0], -np.inf, float(slo_ms))
    return solution(m.solve(time_limit_s, rel_gap), x, started)
