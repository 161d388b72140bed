"""Price one assignment (node -> processor) under the cost model: sequentially, and its checks.

The sequential cost is the linear form the exact solvers minimise (:meth:`CostModel.linear`); the
latency a plan is made for is the part-level schedule's (:mod:`edgesplit.optimize.schedule`).

These are the reference definitions the exact solvers are tested against; they loop plainly over
nodes and flows rather than sharing any code with the MILP or the DP.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from edgesplit.optimize.costs import CostModel


class Crossing(NamedTuple):
    """One tensor crossing: flow index, source and destination processor, its latency and energy.
    (A named tuple: the search of one plan makes tens of thousands, and a frozen dataclass costs
    four times as much to make.)"""

    flow: int
    src: int
    dst: int
    latency_ms: float
    energy_mj: float
    serial_ms: float


def crossings(
    cm: CostModel, assign: Sequence[int] | np.ndarray, *, sequential: bool = False
) -> list[Crossing]:
    """Every crossing of ``assign``: once per (tensor, destination processor other than its source).

    Its latency is the link's; with ``sequential``, that of the sequential forms
    (:attr:`CostModel.seq_link`, which also charges the part a crossing starts).
    """
    x = np.asarray(assign).tolist()  # plain ints and floats: the loop indexes them one by one
    link_ms, per_byte = cm.seq_link if sequential else (cm.link_ms, cm.link_ms_per_byte)
    link_l, per_byte_l = link_ms.tolist(), per_byte.tolist()
    serial_l, radio_l = cm.link_ms_per_byte.tolist(), cm.radio_w.tolist()
    home = cm.home
    out = []
    for i, f in enumerate(cm.flows):
        p = home if f.src < 0 else x[f.src]
        if (
            len(f.dsts) == 1 and not f.to_home
        ):  # most tensors: one reader, often on the same processor
            q = x[f.dsts[0]]
            dst = () if q == p else (q,)
        else:
            dst = {x[d] for d in f.dsts}
            if f.to_home:
                dst.add(home)
            dst.discard(p)
            dst = sorted(dst)
        for q in dst:
            serial = f.nbytes * serial_l[p][q]
            extra = f.nbytes * per_byte_l[p][q] - serial
            latency = link_l[p][q] + serial + extra
            out.append(Crossing(i, p, q, latency, serial * radio_l[p][q], serial))
    return out


def sequential_cost(cm: CostModel, assign: Sequence[int] | np.ndarray, form: str) -> float:
    """Cost when nothing overlaps: ``latency`` (ms) or device ``energy`` (mJ)."""
    x = np.asarray(assign)
    busy = np.zeros(cm.n_procs)
    active_mj = 0.0
    for n in range(cm.n_nodes):
        busy[x[n]] += cm.node_ms[n, x[n]]
        active_mj += cm.node_mj[n, x[n]]
    xs = crossings(cm, x, sequential=True)
    total_ms = float(busy.sum()) + sum(c.latency_ms for c in xs)
    if form == "latency":
        return total_ms
    if form.startswith("mix:"):
        return sequential_cost(cm, x, "energy") + float(form[4:]) * total_ms
    if form != "energy":
        raise ValueError(form)
    return device_energy_mj(cm, total_ms, busy, active_mj + sum(c.energy_mj for c in xs))


def device_energy_mj(
    cm: CostModel, total_ms: float, busy_ms: np.ndarray, active_mj: float
) -> float:
    """Active (and radio) energy plus the idle power of every device processor while it waits."""
    idle = float(np.sum(cm.idle_w * np.maximum(total_ms - busy_ms, 0.0)))
    return active_mj + idle


def memory_use_nbytes(cm: CostModel, assign: Sequence[int] | np.ndarray) -> np.ndarray:
    """The memory upper bound per processor: weights and written activations, plus what it
    receives."""
    x = np.asarray(assign)
    use = np.zeros(cm.n_procs)
    for n in range(cm.n_nodes):
        use[x[n]] += cm.mem_nbytes[n]
    for c in crossings(cm, x):
        use[c.dst] += cm.flows[c.flow].nbytes
    return use


def violations(
    cm: CostModel, assign: Sequence[int] | np.ndarray, *, pins: bool = True
) -> list[str]:
    """What is wrong with ``assign``: unsupported nodes, broken pins, memory over a limit."""
    x = np.asarray(assign)
    bad = []
    mask = cm.allowed if pins else np.isfinite(cm.node_ms)
    for n in range(cm.n_nodes):
        if not mask[n, x[n]]:
            bad.append(f"{cm.nodes[n]} cannot run on {cm.processors[x[n]]}")
    use = memory_use_nbytes(cm, x)
    for p in range(cm.n_procs):
        if use[p] > cm.mem_limit_nbytes[p]:
            bad.append(
                f"{cm.processors[p]} needs {use[p] / 1e6:.1f} MB of "
                f"{cm.mem_limit_nbytes[p] / 1e6:.1f} MB"
            )
    for procs, limit in cm.group_limits:
        total = float(sum(use[p] for p in procs))
        if total > limit:
            bad.append(
                f"{'+'.join(cm.processors[p] for p in procs)} need {total / 1e6:.1f} MB of "
                f"{limit / 1e6:.1f} MB"
            )
    return bad


def feasible(cm: CostModel, assign: Sequence[int] | np.ndarray, *, pins: bool = True) -> bool:
    return not violations(cm, assign, pins=pins)


def memory_binding(cm: CostModel) -> bool:
    """False when even the whole model on one side fits every limit (then memory never binds)."""
    weights = float(cm.mem_nbytes.sum())
    flows = float(sum(f.nbytes for f in cm.flows))
    if np.any(cm.mem_limit_nbytes < weights + flows):
        return True
    return any(limit < weights + len(procs) * flows for procs, limit in cm.group_limits)
