"""Throughput: a stream of inputs through pipelined stages; the slowest resource sets the pace.

The period of an assignment is the busiest resource's time per input: each processor's total part
time (as the part-level schedule charges it), and each channel's total serialisation time
(propagation latency overlaps with other work). Throughput is ``1000 / period_ms`` inputs per
second.

:func:`balance_stages` cuts the topological order into contiguous stages, one processor each and
no processor twice, minimising the period by binary search on it; the feasibility test is a
dynamic program over (processors used, last processor) with the reachable cut positions as
arrays. A cut's link load counts every live tensor crossing it, which overestimates tensors that
skip a stage; the caller scores the result (and refines it) with the exact :func:`period_ms`.
"""

from __future__ import annotations

import numpy as np

from edgesplit.optimize.costs import CostModel
from edgesplit.optimize.schedule import layout


def period_ms(cm: CostModel, assign: np.ndarray) -> float:
    """Time per input of the busiest resource in a pipelined stream.

    A processor's load is the sum of its part runs (:func:`~edgesplit.optimize.schedule.layout`:
    fixed cost, nodes, boundary bytes and reorders), stretched by its contention with the others in
    proportion to how busy they are, plus a back-to-back hand-off per part run; a channel's is its
    serialisation time; the caller's is the Session's per-request work.

    In a stream the workers' queues are full, so no worker wakes from idle, but a busy worker still
    starts its next queued part some time after the last one's outputs are collected (the Session's
    bookkeeping, the thread pool's pick-up):
    :meth:`~edgesplit.optimize.overheads.Overheads.stream_gaps`,
    as ``calibrate`` measures it; before calibration the profile's hand-off at zero idle gap stands
    for it. Measured here: 0.07-0.12 ms per part run in plan_truth's pipelines, 0.02-0.05 ms for a
    first stage fed by the caller, against hand-offs of 0.025-0.05 ms.
    """
    x = np.asarray(assign)
    lay = layout(cm, x)
    ov = cm.ov
    own = np.zeros(cm.n_procs)
    np.add.at(own, lay.proc, lay.work_ms)
    # a core group's runs load each of its members (a group's own row would count both members)
    load = np.where(cm.groups, 0.0, cm.core_busy_ms(own))
    gaps = np.zeros(cm.n_procs)
    np.add.at(gaps, lay.proc, ov.stream_gaps()[lay.proc])
    gaps = np.where(cm.groups, 0.0, cm.core_busy_ms(gaps))
    channels: dict[int, float] = {}
    for c in lay.xs:
        key = int(cm.channel[c.src, c.dst])
        channels[key] = channels.get(key, 0.0) + c.serial_ms
    base = max([float(load.max(initial=0.0)), *channels.values(), ov.session_ms])
    if base <= 0:
        return 0.0
    stretched = load.copy()
    for p in range(cm.n_procs):
        for q in range(cm.n_procs):
            if load[p] > 0 and not (cm.blocks[p, q] or cm.remote[p] or cm.remote[q]):
                stretched[p] += load[p] * (ov.slowdown(p, q) - 1.0) * min(1.0, load[q] / base)
    return max([float((stretched + gaps).max(initial=0.0)), *channels.values(), ov.session_ms])


def _live_bytes(cm: CostModel) -> np.ndarray:
    """live[j]: bytes of tensors made before position j and read at or after it."""
    diff = np.zeros(cm.n_nodes + 2)
    for f in cm.flows:
        if not f.dsts:
            continue
        lo, hi = f.src + 1, max(f.dsts)
        if lo <= hi:
            diff[max(lo, 1)] += f.nbytes
            diff[hi + 1] -= f.nbytes
    return np.cumsum(diff)[: cm.n_nodes + 1]


def balance_stages(cm: CostModel, *, max_procs: int = 8, iters: int = 40) -> np.ndarray | None:
    """Contiguous stages over the topological order with the smallest (modelled) period."""
    n_nodes = cm.n_nodes
    procs = list(range(cm.n_procs))[:max_procs]
    ms = np.where(cm.allowed, cm.node_ms, np.inf)
    cum = np.zeros((len(procs), n_nodes + 1))
    next_bad = np.full((len(procs), n_nodes + 1), n_nodes, dtype=np.int64)
    for k, p in enumerate(procs):
        ok = np.isfinite(ms[:, p])
        cum[k, 1:] = np.cumsum(np.where(ok, ms[:, p], 0.0))
        bad = n_nodes
        for i in range(n_nodes - 1, -1, -1):
            if not ok[i]:
                bad = i
            next_bad[k, i] = bad
    live = _live_bytes(cm)
    per_byte = cm.link_ms_per_byte
    positions = np.arange(n_nodes + 1)

    def reach_ends(k: int, starts: np.ndarray, period: float) -> np.ndarray:
        """Ends j reachable by a stage on procs[k] from any start i in ``starts``."""
        idx = np.flatnonzero(starts)
        if idx.size == 0:
            return np.zeros(n_nodes + 1, dtype=bool)
        jmax = np.searchsorted(cum[k], cum[k, idx] + period * (1 + 1e-12), side="right") - 1
        jmax = np.minimum(jmax, next_bad[k, np.minimum(idx, n_nodes)])
        diff = np.zeros(n_nodes + 2)
        good = jmax > idx
        np.add.at(diff, idx[good] + 1, 1)
        np.add.at(diff, jmax[good] + 1, -1)
        return np.cumsum(diff)[: n_nodes + 1] > 0

    def explore(period: float):
        states: dict[tuple[int, int], np.ndarray] = {}
        start = positions == 0
        frontier = []
        for k in range(len(procs)):
            r = reach_ends(k, start, period)
            if r.any():
                states[1 << k, k] = r
                frontier.append((1 << k, k))
        for used in sorted(
            {s for s, _ in states} | set(range(1, 1 << len(procs))), key=lambda s: bin(s).count("1")
        ):
            for last in range(len(procs)):
                r = states.get((used, last))
                if r is None:
                    continue
                for k in range(len(procs)):
                    if used >> k & 1:
                        continue
                    cut_ok = live * per_byte[procs[last], procs[k]] <= period
                    nr = reach_ends(k, r & cut_ok & (positions < n_nodes), period)
                    if nr.any():
                        key = (used | 1 << k, k)
                        states[key] = states[key] | nr if key in states else nr
        return states

    def done(states) -> bool:
        return any(r[n_nodes] for r in states.values())

    lo = float(np.min(ms, axis=1).max()) if n_nodes else 0.0
    hi = float(np.min([cum[k, n_nodes] for k in range(len(procs))]))
    if not np.isfinite(hi):
        hi = float(np.nansum(np.where(np.isfinite(ms), ms, 0.0)))
    if not done(explore(hi)):
        return None
    for _ in range(iters):
        mid = (lo + hi) / 2
        if done(explore(mid)):
            hi = mid
        else:
            lo = mid
        if hi - lo <= 1e-6 * hi:
            break
    states = explore(hi)
    return _backtrack(states, procs, cum, next_bad, live, per_byte, hi, n_nodes)


def _backtrack(states, procs, cum, next_bad, live, per_byte, period, n_nodes) -> np.ndarray:
    assign = np.zeros(n_nodes, dtype=np.int64)
    key = next(k for k, r in states.items() if r[n_nodes])
    end = n_nodes
    while True:
        used, last = key
        prev_used = used & ~(1 << last)

        def fits(i: int, last: int = last, end: int = end) -> bool:
            return (
                cum[last, end] - cum[last, i] <= period * (1 + 1e-12) and next_bad[last, i] >= end
            )

        found = None
        if prev_used == 0 and fits(0):
            found = (0, None)
        else:
            for prev in range(len(procs)):
                r = states.get((prev_used, prev))
                if r is None:
                    continue
                for i in np.flatnonzero(r[:end])[::-1]:
                    if live[i] * per_byte[procs[prev], procs[last]] <= period and fits(int(i)):
                        found = (int(i), prev)
                        break
                if found:
                    break
        assert found is not None
        i, prev = found
        assign[i:end] = procs[last]
        if prev is None:
            return assign
        key, end = (prev_used, prev), i
