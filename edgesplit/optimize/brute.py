"""Brute-force enumeration of every assignment: the reference the exact solvers are tested against.

Vectorised over all ``P ** N`` assignments at once, so keep ``P ** N`` to some tens of thousands.
It shares nothing with the MILP or the DP but the cost arrays.
"""

from __future__ import annotations

import numpy as np

from edgesplit.optimize.costs import CostModel

MAX_ASSIGNMENTS = 200_000


def enumerate_costs(
    cm: CostModel, *, pins: bool = True
) -> tuple[np.ndarray, dict[str, np.ndarray], np.ndarray]:
    """All assignments ``(K, N)``, their sequential ``latency`` and ``energy`` and feasibility.

    Infeasible assignments (support, pins, memory) are kept and flagged ``False``.
    """
    n_nodes, n_procs = cm.n_nodes, cm.n_procs
    if n_procs**n_nodes > MAX_ASSIGNMENTS:
        raise ValueError(f"{n_procs}**{n_nodes} assignments is too many to enumerate")
    grid = np.indices((n_procs,) * n_nodes).reshape(n_nodes, -1).T
    k = grid.shape[0]
    rows = np.arange(n_nodes)[None, :]
    mask = cm.allowed if pins else np.isfinite(cm.node_ms)
    ok = mask[rows, grid].all(axis=1)
    ms = np.where(np.isfinite(cm.node_ms), cm.node_ms, 0.0)
    node_ms = ms[rows, grid]
    busy = np.zeros((k, n_procs))
    for p in range(n_procs):
        busy[:, p] = np.where(grid == p, node_ms, 0.0).sum(axis=1)
    active = cm.node_mj[rows, grid].sum(axis=1)
    xfer_ms = np.zeros(k)
    radio = np.zeros(k)
    seq_ms, seq_per_byte = (
        cm.seq_link
    )  # the link, plus the part a crossing starts (CostModel.linear)
    mem = np.zeros((k, n_procs))
    for p in range(n_procs):
        mem[:, p] = np.where(grid == p, cm.mem_nbytes[None, :], 0.0).sum(axis=1)
    for f in cm.flows:
        src = np.full(k, cm.home) if f.src < 0 else grid[:, f.src]
        for q in range(n_procs):
            if f.to_home and q == cm.home:
                needed = np.ones(k, dtype=bool)
            elif f.dsts:
                needed = (grid[:, list(f.dsts)] == q).any(axis=1)
            else:
                continue
            cross = needed & (src != q)
            serial = f.nbytes * cm.link_ms_per_byte[src, q]
            xfer_ms += np.where(cross, seq_ms[src, q] + f.nbytes * seq_per_byte[src, q], 0.0)
            radio += np.where(cross, serial * cm.radio_w[src, q], 0.0)
            mem[:, q] += np.where(cross, f.nbytes, 0.0)
    ok &= (mem <= cm.mem_limit_nbytes[None, :]).all(axis=1)
    for procs, limit in cm.group_limits:
        ok &= mem[:, list(procs)].sum(axis=1) <= limit
    latency = busy.sum(axis=1) + xfer_ms
    core_busy = busy @ cm.blocks.T.astype(float)  # a core group keeps its members busy
    idle = (cm.idle_w[None, :] * (latency[:, None] - core_busy)).sum(axis=1)
    return grid, {"latency": latency, "energy": active + radio + idle}, ok


def brute_force(
    cm: CostModel, objective: str, *, slo_ms: float | None = None
) -> tuple[np.ndarray | None, float]:
    """The best feasible assignment and its cost (``None, inf`` when none is feasible)."""
    grid, values, ok = enumerate_costs(cm)
    if slo_ms is not None:
        ok = ok & (values["latency"] <= slo_ms * (1 + 1e-9) + 1e-9)
    if not ok.any():
        return None, float("inf")
    if objective.startswith("mix:"):
        values = {objective: values["energy"] + float(objective[4:]) * values["latency"]}
    v = np.where(ok, values[objective], np.inf)
    i = int(np.argmin(v))
    return grid[i], float(v[i])
