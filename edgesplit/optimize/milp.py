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
from dataclasses import dataclass

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import csr_array

from edgesplit.optimize.costs import CostModel

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


class _Rows:
    """Sparse rows ``lb <= sum coef * var <= ub`` collected as triplets."""

    def __init__(self) -> None:
        self.r: list[int] = []
        self.c: list[int] = []
        self.v: list[float] = []
        self.lb: list[float] = []
        self.ub: list[float] = []

    def add(self, terms: list[tuple[int, float]], lb: float, ub: float) -> None:
        i = len(self.lb)
        for var, coef in terms:
            self.r.append(i)
            self.c.append(var)
            self.v.append(coef)
        self.lb.append(lb)
        self.ub.append(ub)


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
    a_obj, al_obj, be_obj = cm.linear(objective)
    a_lat, al_lat, be_lat = cm.linear("latency")
    n_nodes, n_procs = cm.n_nodes, cm.n_procs
    allowed = cm.allowed
    cost: list[float] = []
    lat: list[float] = []
    ub_vars: list[float] = []
    lb_vars: list[float] = []
    integral: list[int] = []

    def new(c_obj: float, c_lat: float, binary: bool = False, lb: float = 0.0) -> int:
        cost.append(c_obj)
        lat.append(c_lat)
        lb_vars.append(lb)
        ub_vars.append(1.0)
        integral.append(1 if binary else 0)
        return len(cost) - 1

    rows = _Rows()
    x = np.full((n_nodes, n_procs), -1, dtype=np.int64)
    for n in range(n_nodes):
        ps = np.flatnonzero(allowed[n])
        for p in ps:
            x[n, p] = new(
                float(a_obj[n, p]), float(a_lat[n, p]), binary=True, lb=1.0 if len(ps) == 1 else 0.0
            )
        rows.add([(int(x[n, p]), 1.0) for p in ps], 1.0, 1.0)
    # receive[q]: terms whose sum is the bytes received on q (for the memory rows)
    receive: list[list[tuple[int, float]]] = [[] for _ in range(n_procs)]
    for f in cm.flows:
        dst_opts = set()
        for c in f.dsts:
            dst_opts.update(np.flatnonzero(allowed[c]).tolist())
        if f.to_home:
            dst_opts.add(cm.home)
        # need[q]: ("const", 1.0) | ("var", index)
        need: dict[int, tuple[str, float | int]] = {}
        for q in sorted(dst_opts):
            if f.to_home and q == cm.home:
                need[q] = ("const", 1.0)
            elif len(f.dsts) == 1 and not f.to_home:
                need[q] = ("var", int(x[f.dsts[0], q]))
            else:
                y = new(0.0, 0.0)
                for c in f.dsts:
                    if allowed[c, q]:
                        rows.add([(y, 1.0), (int(x[c, q]), -1.0)], 0.0, np.inf)
                need[q] = ("var", y)
        src_opts = [cm.home] if f.src < 0 else np.flatnonzero(allowed[f.src]).tolist()
        if len(src_opts) == 1:
            p = src_opts[0]
            for q, (kind, ref) in need.items():
                if q == p:
                    continue
                c_obj = al_obj[p, q] + f.nbytes * be_obj[p, q]
                c_lat = al_lat[p, q] + f.nbytes * be_lat[p, q]
                if kind == "const":
                    # a forced crossing: a constant; carry it on a fixed variable
                    v = new(float(c_obj), float(c_lat), lb=1.0)
                    receive[q].append((v, float(f.nbytes)))
                else:
                    cost[int(ref)] += float(c_obj)
                    lat[int(ref)] += float(c_lat)
                    receive[q].append((int(ref), float(f.nbytes)))
            continue
        # exactly one destination when the tensor has one reader and is no graph output; then
        # sum_q z[p,q] = x[src,p] and the rows z[p,q] <= x[src,p] are implied
        single = len(f.dsts) == 1 and not f.to_home
        z: dict[tuple[int, int], int] = {}
        for p in src_opts:
            for q in need:
                c_obj = 0.0 if p == q else float(al_obj[p, q] + f.nbytes * be_obj[p, q])
                c_lat = 0.0 if p == q else float(al_lat[p, q] + f.nbytes * be_lat[p, q])
                z[p, q] = new(c_obj, c_lat)
                if not single:
                    rows.add([(z[p, q], 1.0), (int(x[f.src, p]), -1.0)], -np.inf, 0.0)
        for q, (kind, ref) in need.items():
            terms = [(z[p, q], 1.0) for p in src_opts]
            if kind == "const":
                rows.add(terms, 1.0, 1.0)
            else:
                rows.add([*terms, (int(ref), -1.0)], 0.0, 0.0)
            for p in src_opts:
                if p != q:
                    receive[q].append((z[p, q], float(f.nbytes)))
        for p in src_opts:
            rows.add(
                [*((z[p, q], 1.0) for q in need), (int(x[f.src, p]), -1.0)], 0.0, 0.0 if single else np.inf
            )

    def mem_terms(p: int) -> list[tuple[int, float]]:
        terms = [(int(x[n, p]), float(cm.mem_nbytes[n])) for n in range(n_nodes) if x[n, p] >= 0]
        return terms + receive[p]

    for p in range(n_procs):
        if np.isfinite(cm.mem_limit_nbytes[p]):
            rows.add(mem_terms(p), -np.inf, float(cm.mem_limit_nbytes[p]))
    for procs, limit in cm.group_limits:
        rows.add([t for p in procs for t in mem_terms(p)], -np.inf, float(limit))
    if slo_ms is not None:
        rows.add([(i, v) for i, v in enumerate(lat) if v != 0.0], -np.inf, float(slo_ms))

    n_vars = len(cost)
    a = csr_array((rows.v, (rows.r, rows.c)), shape=(len(rows.lb), n_vars))
    res = milp(
        c=np.asarray(cost),
        integrality=np.asarray(integral),
        bounds=Bounds(np.asarray(lb_vars), np.asarray(ub_vars)),
        constraints=LinearConstraint(a, np.asarray(rows.lb), np.asarray(rows.ub)),
        options={"time_limit": time_limit_s, "mip_rel_gap": rel_gap, "presolve": True, "disp": _DISP},
    )
    if res.x is None:
        if res.status == 2:
            raise Infeasible("no assignment meets the constraints")
        raise Infeasible(f"the MILP solver stopped without a solution ({res.message})")
    sol = res.x
    assign = np.zeros(n_nodes, dtype=np.int64)
    for n in range(n_nodes):
        ps = np.flatnonzero(x[n] >= 0)
        assign[n] = ps[np.argmax(sol[x[n, ps]])]
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
