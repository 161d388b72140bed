"""Concurrent execution of an assignment: list scheduling, makespan, and a bounded search on it.

The schedule model: each processor runs one node at a time; each crossing occupies its channel
(the uplink, the downlink, or one on-chip link per ordered pair) for its serialisation time and
arrives a fixed latency later (half the RTT, or the copy latency). Tasks are placed greedily by
upward rank (the longest path to the end, as in HEFT) at the earliest time their inputs have
arrived and their resource is free. No resource is ever idle while all work waits, so the makespan
never exceeds the sequential latency of the same assignment.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from edgesplit.optimize.costs import CostModel
from edgesplit.optimize.evaluate import Crossing, crossings, device_energy_mj


@dataclass(frozen=True)
class Schedule:
    """Start and end times of every node and crossing of one assignment."""

    makespan_ms: float
    energy_mj: float
    node_start_ms: np.ndarray
    node_end_ms: np.ndarray
    crossings: tuple[Crossing, ...]
    crossing_start_ms: tuple[float, ...]
    crossing_end_ms: tuple[float, ...]
    busy_ms: np.ndarray


def schedule(cm: CostModel, assign: np.ndarray) -> Schedule:
    """List-schedule ``assign`` and price it (latency = makespan, device energy over it)."""
    x = np.asarray(assign)
    n_nodes = cm.n_nodes
    xs = crossings(cm, x)
    dur = cm.node_ms[np.arange(n_nodes), x] if n_nodes else np.zeros(0)
    # tasks: nodes 0..N-1, then crossings N..N+C-1
    n_tasks = n_nodes + len(xs)
    succ: list[list[int]] = [[] for _ in range(n_tasks)]
    n_pred = np.zeros(n_tasks, dtype=np.int64)
    length = np.concatenate([dur, [c.latency_ms for c in xs]]) if n_tasks else np.zeros(0)
    arrive: dict[tuple[int, int], int] = {}
    for k, c in enumerate(xs):
        t = n_nodes + k
        arrive[c.flow, c.dst] = t
        src = cm.flows[c.flow].src
        if src >= 0:
            succ[src].append(t)
            n_pred[t] += 1
    for i, f in enumerate(cm.flows):
        for d in dict.fromkeys(f.dsts):
            pre = arrive.get((i, int(x[d])))
            if pre is None:
                if f.src < 0:
                    continue
                pre = f.src
            succ[pre].append(d)
            n_pred[d] += 1
    rank = length.copy()
    for t in _reverse_topological(n_tasks, succ, n_pred):
        if succ[t]:
            rank[t] = length[t] + max(rank[s] for s in succ[t])
    ready_at = np.zeros(n_tasks)
    start = np.zeros(n_tasks)
    end = np.zeros(n_tasks)
    free: dict[tuple[str, int], float] = {}
    missing = n_pred.copy()
    heap = [(-rank[t], t) for t in range(n_tasks) if missing[t] == 0]
    heapq.heapify(heap)
    while heap:
        _, t = heapq.heappop(heap)
        if t < n_nodes:
            res = ("p", int(x[t]))
            s = max(ready_at[t], free.get(res, 0.0))
            free[res] = s + length[t]
        else:
            c = xs[t - n_nodes]
            res = ("c", int(cm.channel[c.src, c.dst]))
            s = max(ready_at[t], free.get(res, 0.0))
            free[res] = s + c.serial_ms
        start[t], end[t] = s, s + length[t]
        for u in succ[t]:
            ready_at[u] = max(ready_at[u], end[t])
            missing[u] -= 1
            if missing[u] == 0:
                heapq.heappush(heap, (-rank[u], u))
    makespan = float(end.max()) if n_tasks else 0.0
    busy = np.zeros(cm.n_procs)
    np.add.at(busy, x, dur)
    active = float(cm.node_mj[np.arange(n_nodes), x].sum()) + sum(c.energy_mj for c in xs)
    return Schedule(
        makespan_ms=makespan,
        energy_mj=device_energy_mj(cm, makespan, busy, active),
        node_start_ms=start[:n_nodes],
        node_end_ms=end[:n_nodes],
        crossings=tuple(xs),
        crossing_start_ms=tuple(float(v) for v in start[n_nodes:]),
        crossing_end_ms=tuple(float(v) for v in end[n_nodes:]),
        busy_ms=busy,
    )


def _reverse_topological(n: int, succ: list[list[int]], n_pred: np.ndarray) -> list[int]:
    missing = n_pred.copy()
    order = [t for t in range(n) if missing[t] == 0]
    i = 0
    while i < len(order):
        for u in succ[order[i]]:
            missing[u] -= 1
            if missing[u] == 0:
                order.append(u)
        i += 1
    return order[::-1]


def makespan_lower_bound(cm: CostModel) -> float:
    """A lower bound on any plan's makespan, the larger of two relaxations.

    * The communication-aware critical path without contention: ``est[n, p]`` is the earliest node
      n can end on p if every input came from its producer's best processor over a free link
      (graph inputs from home), and outputs must still reach home.
    * The total fastest work spread over every processor at once.
    """
    n_nodes, n_procs = cm.n_nodes, cm.n_procs
    if n_nodes == 0:
        return 0.0
    ms = np.where(cm.allowed, cm.node_ms, np.inf)
    xfer = [cm.link_ms + f.nbytes * cm.link_ms_per_byte for f in cm.flows]  # [p, q], zero diagonal
    inputs: list[list[int]] = [[] for _ in range(n_nodes)]
    for i, f in enumerate(cm.flows):
        for d in dict.fromkeys(f.dsts):
            inputs[d].append(i)
    est = np.zeros((n_nodes, n_procs))
    for n in range(n_nodes):
        ready = np.zeros(n_procs)
        for i in inputs[n]:
            f = cm.flows[i]
            arrive = xfer[i][cm.home] if f.src < 0 else (est[f.src][:, None] + xfer[i]).min(axis=0)
            ready = np.maximum(ready, arrive)
        est[n] = ready + ms[n]
    path = float(est.min(axis=1).max())
    for i, f in enumerate(cm.flows):
        if f.to_home and f.src >= 0:
            path = max(path, float((est[f.src] + xfer[i][:, cm.home]).min()))
    work = float(ms.min(axis=1).sum()) / max(n_procs, 1)
    return max(path, work)
