"""Exact variable elimination, then a MILP on what is left: the fast path for large graphs.

The sequential objective is rewritten as factors over node choices: a unary cost per node, a
pairwise cost matrix for every tensor with one reader (its crossing cost depends on the writer's
and the reader's processor only, the trip home included), and a *hyper* factor for every tensor
with several readers (counted once per destination processor). A node that only touches pairwise
factors and has at most two neighbours is eliminated exactly, as in variable elimination:

* a leaf ``v`` next to ``u`` folds ``min_pv (U[v,pv] + C[pu,pv])`` into ``U[u]``;
* a node ``v`` between ``u`` and ``w`` becomes one pairwise factor
  ``M[pu,pw] = min_pv (C1[pu,pv] + U[v,pv] + C2[pv,pw])``.

Chains collapse completely (this is the chain DP), trees too; what is left goes to a MILP with the
same tight pairwise and per-destination forms as :mod:`edgesplit.optimize.milp`, and the eliminated
nodes are recovered from their argmin tables. Used without an SLO and where memory cannot bind
(the elimination sees only the objective).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from edgesplit.optimize.costs import CostModel
from edgesplit.optimize.milp import Infeasible, MilpModel, Solution, crossing_rows, solution


@dataclass
class _Hyper:
    src: int  # -1: fixed at home
    dsts: tuple[int, ...]
    to_home: bool
    cost: np.ndarray  # (P, P) per crossing, zero diagonal


def factors(cm: CostModel, objective: str):
    """``(unary, pairs, hypers)`` of the sequential objective."""
    a, alpha, beta = cm.linear(objective)
    n_procs = cm.n_procs
    unary = a.copy()
    pairs: dict[tuple[int, int], np.ndarray] = {}
    hypers: list[_Hyper] = []
    eye = np.eye(n_procs, dtype=bool)
    home = cm.home
    for f in cm.flows:
        c = np.where(eye, 0.0, alpha + f.nbytes * beta)
        if f.src < 0:
            if len(f.dsts) == 1:
                unary[f.dsts[0]] += c[home]
            elif f.dsts:
                hypers.append(_Hyper(-1, f.dsts, False, c))
            continue
        if not f.dsts:
            if f.to_home:
                unary[f.src] += c[:, home]
            continue
        if len(f.dsts) == 1:
            d = f.dsts[0]
            m = c.copy()
            if f.to_home:
                # destinations {pd, home}: home costs extra only when it differs from pd
                m += np.where(np.arange(n_procs)[None, :] != home, c[:, home][:, None], 0.0)
            _add_pair(pairs, f.src, d, m)
            continue
        hypers.append(_Hyper(f.src, f.dsts, f.to_home, c))
    return unary, pairs, hypers


def _add_pair(pairs: dict, u: int, v: int, m: np.ndarray) -> None:
    if u > v:
        u, v, m = v, u, m.T
    key = (u, v)
    pairs[key] = pairs[key] + m if key in pairs else m.copy()


def solve_factored(cm: CostModel, objective: str, *, time_limit_s: float = 60.0) -> Solution:
    """Exact sequential optimum by elimination plus a MILP on the remaining core."""
    started = time.perf_counter()
    unary, pairs, hypers = factors(cm, objective)
    n_nodes = cm.n_nodes
    pinned = np.zeros(n_nodes, dtype=bool)
    for h in hypers:
        if h.src >= 0:
            pinned[h.src] = True
        pinned[list(h.dsts)] = True
    adj: list[set[int]] = [set() for _ in range(n_nodes)]
    for u, v in pairs:
        adj[u].add(v)
        adj[v].add(u)
    alive = np.ones(n_nodes, dtype=bool)
    steps: list[tuple] = []  # (v, u, w, table) for back-substitution
    constant = 0.0
    queue = [v for v in range(n_nodes) if not pinned[v] and len(adj[v]) <= 2]
    while queue:
        v = queue.pop()
        if not alive[v] or pinned[v] or len(adj[v]) > 2:
            continue
        nb = sorted(adj[v])
        uv = unary[v]
        if not nb:
            pv = int(np.argmin(uv))
            constant += float(uv[pv])
            steps.append((v, None, None, pv))
        elif len(nb) == 1:
            u = nb[0]
            c = _pair(pairs, u, v)  # [pu, pv]
            total = c + uv[None, :]
            unary[u] = unary[u] + total.min(axis=1)
            steps.append((v, u, None, np.argmin(total, axis=1)))
            adj[u].discard(v)
            del pairs[min(u, v), max(u, v)]
            queue.append(u)
        else:
            u, w = nb
            c1, c2 = _pair(pairs, u, v), _pair(pairs, v, w)  # [pu, pv], [pv, pw]
            total = c1[:, :, None] + uv[None, :, None] + c2[None, :, :]  # [pu, pv, pw]
            steps.append((v, u, w, np.argmin(total, axis=1)))
            _add_pair(pairs, u, w, total.min(axis=1))
            del pairs[min(u, v), max(u, v)], pairs[min(v, w), max(v, w)]
            adj[u].discard(v)
            adj[w].discard(v)
            adj[u].add(w)
            adj[w].add(u)
            queue.extend((u, w))
        alive[v] = False
        adj[v] = set()
    core = np.flatnonzero(alive)
    assign = np.full(n_nodes, -1, dtype=np.int64)
    value, optimal, gap, name = constant, True, 0.0, "elimination"
    if core.size:
        sub = _core_milp(cm, unary, pairs, hypers, core, time_limit_s)
        assign[core] = sub.assign
        value += sub.value
        optimal, gap, name = (
            sub.optimal,
            sub.gap,
            f"elimination+milp-highs({core.size} of {n_nodes} nodes)",
        )
    for v, u, w, table in reversed(steps):
        if u is None:
            assign[v] = table
        elif w is None:
            assign[v] = table[assign[u]]
        else:
            assign[v] = table[assign[u], assign[w]]
    if not np.isfinite(value):
        raise Infeasible("no assignment meets the constraints")
    return Solution(assign, float(value), name, optimal, gap, time.perf_counter() - started)


def _pair(pairs: dict, a: int, b: int) -> np.ndarray:
    """The pairwise matrix indexed [pa, pb]."""
    return pairs[a, b] if a < b else pairs[b, a].T


def _core_milp(
    cm: CostModel,
    unary: np.ndarray,
    pairs: dict,
    hypers: list[_Hyper],
    core: np.ndarray,
    time_limit_s: float,
) -> Solution:
    """The MILP on the nodes elimination left: unary costs, pairwise and hyper factors."""
    started = time.perf_counter()
    index = {int(n): i for i, n in enumerate(core)}
    m = MilpModel()
    x = np.full((len(core), cm.n_procs), -1, dtype=np.int64)
    for i, n in enumerate(core):
        ps = np.flatnonzero(np.isfinite(unary[n]))
        if ps.size == 0:
            raise Infeasible("a node has no processor left")
        for p in ps:
            x[i, p] = _var(m, unary[n, p], binary=True)
        m.row([(int(x[i, p]), 1.0) for p in ps], 1.0, 1.0)
    for (a, b), mat in pairs.items():
        ia, ib = index[a], index[b]
        pa, pb = np.flatnonzero(x[ia] >= 0), np.flatnonzero(x[ib] >= 0)
        w = {(p, q): _var(m, mat[p, q]) for p in pa for q in pb}
        for p in pa:
            m.row([*((w[p, q], 1.0) for q in pb), (int(x[ia, p]), -1.0)], 0.0, 0.0)
        for q in pb:
            m.row([*((w[p, q], 1.0) for p in pa), (int(x[ib, q]), -1.0)], 0.0, 0.0)
    for h in hypers:
        _hyper_rows(m, cm, h, x, index)
    return solution(m.solve(time_limit_s), x, started)


def _var(m: MilpModel, value: float, binary: bool = False) -> int:
    """A variable costing ``value``; fixed at 0 where the cost is infinite (not allowed)."""
    finite = bool(np.isfinite(value))
    return m.var(float(value) if finite else 0.0, binary=binary, ub=1.0 if finite else 0.0)


def _hyper_rows(
    m: MilpModel, cm: CostModel, h: _Hyper, x: np.ndarray, index: dict[int, int]
) -> None:
    """A tensor read on several processors: counted once per destination (as in the full MILP)."""
    need: dict[int, tuple[str, int]] = {}
    opts = {cm.home} if h.to_home else set()
    for d in h.dsts:
        opts.update(np.flatnonzero(x[index[d]] >= 0).tolist())
    for q in sorted(opts):
        if h.to_home and q == cm.home:
            need[q] = ("const", -1)
            continue
        y = _var(m, 0.0)
        for d in h.dsts:
            if x[index[d], q] >= 0:
                m.row([(y, 1.0), (int(x[index[d], q]), -1.0)], 0.0, np.inf)
        need[q] = ("var", y)
    if h.src < 0:
        for q, (_, ref) in need.items():
            if q != cm.home:
                m.cost[ref] += float(h.cost[cm.home, q])
        return
    src = np.flatnonzero(x[index[h.src]] >= 0)
    z = {(p, q): _var(m, 0.0 if p == q else h.cost[p, q]) for p in src for q in need}
    for (p, _q), zi in z.items():
        m.row([(zi, 1.0), (int(x[index[h.src], p]), -1.0)], -np.inf, 0.0)
    crossing_rows(m, z, src, need, {p: int(x[index[h.src], p]) for p in src}, supply_ub=np.inf)
