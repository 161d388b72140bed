"""Exact solvers for the sequential objectives: dynamic programming on chains, else the MILP.

A chain (every tensor read only by the next node, every graph input by one node) is solved in
``O(N P^2)`` by dynamic programming over (position, processor), which is Neurosurgeon's setting
generalised to any number of processors. The DP is used only where it is exact: no latency SLO and
no memory limit that could bind; otherwise :func:`solve_milp` runs.
"""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np

from edgesplit.optimize.costs import CostModel
from edgesplit.optimize.evaluate import memory_binding
from edgesplit.optimize.factor import solve_factored
from edgesplit.optimize.milp import Infeasible, Solution, solve_milp
from edgesplit.optimize.reduce import drop_dominated

__all__ = ["Infeasible", "Solution", "is_chain", "solve_chain_dp", "solve_sequential"]


def is_chain(cm: CostModel) -> bool:
    """True when every flow joins at most two neighbouring positions (and home)."""
    for f in cm.flows:
        if f.src < 0:
            if len(f.dsts) > 1:
                return False
        elif any(d != f.src + 1 for d in f.dsts):
            return False
    return True


def _flow_cost(
    cm: CostModel, f, p: int, q: int | None, alpha: np.ndarray, beta: np.ndarray
) -> float:
    """Cost of flow f made on p and read on q (None: no reader), plus its trip home."""
    dsts = set() if q is None else {q}
    if f.to_home:
        dsts.add(cm.home)
    return float(sum(alpha[p, d] + f.nbytes * beta[p, d] for d in dsts if d != p))


def solve_chain_dp(cm: CostModel, objective: str) -> Solution:
    """Exact sequential optimum on a chain by dynamic programming (see :func:`is_chain`)."""
    started = time.perf_counter()
    a, alpha, beta = cm.linear(objective)
    n_nodes, n_procs = cm.n_nodes, cm.n_procs
    unary = a.copy()
    pair = np.zeros((max(n_nodes - 1, 0), n_procs, n_procs))
    for f in cm.flows:
        if f.src < 0:
            for c in f.dsts:
                for q in range(n_procs):
                    unary[c, q] += (
                        _flow_cost(cm, f, cm.home, q, alpha, beta) if q != cm.home else 0.0
                    )
            if f.to_home and not f.dsts:
                continue
        elif f.dsts:
            for p in range(n_procs):
                for q in range(n_procs):
                    pair[f.src, p, q] += _flow_cost(cm, f, p, q, alpha, beta)
        else:
            for p in range(n_procs):
                unary[f.src, p] += _flow_cost(cm, f, p, None, alpha, beta)
    best = unary[0].copy()
    back = np.zeros((n_nodes, n_procs), dtype=np.int64)
    for n in range(1, n_nodes):
        total = best[:, None] + pair[n - 1]
        back[n] = np.argmin(total, axis=0)
        best = total[back[n], np.arange(n_procs)] + unary[n]
    assign = np.zeros(n_nodes, dtype=np.int64)
    assign[-1] = int(np.argmin(best))
    value = float(best[assign[-1]])
    if not np.isfinite(value):
        raise Infeasible("no assignment meets the constraints")
    for n in range(n_nodes - 1, 0, -1):
        assign[n - 1] = back[n, assign[n]]
    return Solution(assign, value, "chain-dp", True, 0.0, time.perf_counter() - started)


def solve_sequential(
    cm: CostModel, objective: str, *, slo_ms: float | None = None, time_limit_s: float = 60.0
) -> Solution:
    """The exact optimum of the sequential ``latency`` or ``energy`` (with an optional SLO).

    Without an SLO and where memory cannot bind: dominated processors are dropped
    (:mod:`edgesplit.optimize.reduce`), then a chain goes to the DP and anything else to variable
    elimination plus a MILP on the core (:mod:`edgesplit.optimize.factor`). Otherwise the full
    MILP with its memory and SLO rows runs.
    """
    if cm.n_nodes == 0:
        return Solution(np.zeros(0, dtype=np.int64), 0.0, "empty", True, 0.0, 0.0)
    if memory_binding(cm):
        return solve_milp(cm, objective, slo_ms=slo_ms, time_limit_s=time_limit_s)
    forms = [cm.linear(objective)] + ([cm.linear("latency")] if slo_ms is not None else [])
    reduced = replace(cm, allowed=drop_dominated(cm, forms))
    if slo_ms is not None:
        return solve_milp(reduced, objective, slo_ms=slo_ms, time_limit_s=time_limit_s)
    if is_chain(reduced):
        return solve_chain_dp(reduced, objective)
    return solve_factored(reduced, objective, time_limit_s=time_limit_s)
