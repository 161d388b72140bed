"""Concurrent execution of an assignment at part granularity, exactly as the runtime executes it.

The runtime (:mod:`edgesplit.runtime.session`) runs whole *parts* (maximal connected groups of
nodes on one processor and backend, :func:`~edgesplit.optimize.parts.part_labels`), so this is the
schedule a plan is priced by:

* a part is ready when every tensor it reads has arrived: from another part on its processor at
  that part's end (a part's outputs are released when the part ends), from another processor when
  the crossing has arrived;
* each processor has one worker that runs one part at a time, first ready first (FIFO by the time
  it became ready; ties by part order, as the runtime launches them); a part handed to an idle
  worker waits for the hand-off (the thread's wake-up, which grows with how long it idled), except
  when that worker itself made it ready;
* each crossing occupies its channel (uplink, downlink, one on-chip link per ordered pair) for its
  serialisation time, FIFO alike, and arrives a fixed latency later;
* a part runs for its fixed cost, its nodes, and the bytes and layout reorders at its boundaries
  (:mod:`edgesplit.optimize.overheads`), and a part on a server its call beyond the link
  (:func:`call_ms`); while other processors are busy it runs slower by the measured pairwise
  contention (applied to the overlaps of a first pass, then scheduled again);
* a request adds the Session's own work and the caller's wake-up at its end. Requests are taken
  to come back to back: a worker's idle gap before its first part includes the previous request's
  tail after its last part. A plan of one local part is run on the caller's own thread
  (:meth:`edgesplit.runtime.session.Session.run`): neither a hand-off nor a wake-up.

No resource idles while work it could do waits, so the latency never exceeds the sum of all part,
hand-off, crossing and request terms (:func:`sequential_latency_ms`).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from edgesplit.optimize.costs import CostModel
from edgesplit.optimize.evaluate import Crossing, crossings, device_energy_mj
from edgesplit.optimize.parts import part_labels


@dataclass(frozen=True)
class Schedule:
    """When every part, node and crossing of one assignment runs.

    Attributes:
        makespan_ms: The request's latency: Session work, parts and crossings, the caller's wake-up.
        parts: Node indices of each part, in a topological order of parts (the plan's parts).
        part_proc: Processor of each part. ``part_ms``: its modelled run (contention included).
        part_start_ms, part_end_ms: When its worker starts and ends it.
        busy_ms: Per processor, the sum of its parts' runs.
    """

    makespan_ms: float
    energy_mj: float
    node_start_ms: np.ndarray
    node_end_ms: np.ndarray
    crossings: tuple[Crossing, ...]
    crossing_start_ms: tuple[float, ...]
    crossing_end_ms: tuple[float, ...]
    busy_ms: np.ndarray
    parts: tuple[tuple[int, ...], ...] = ()
    part_proc: tuple[int, ...] = ()
    part_ms: np.ndarray | None = None
    part_start_ms: np.ndarray | None = None
    part_end_ms: np.ndarray | None = None
    handoffs_ms: float = 0.0


@dataclass(frozen=True)
class Layout:
    """An assignment's parts and what each waits for (shared by the schedule's passes and the
    stream's period)."""

    parts: tuple[tuple[int, ...], ...]
    proc: np.ndarray
    xs: tuple[Crossing, ...]
    deps: tuple[tuple[int, ...], ...]  # per task: tasks it waits for (parts 0..K-1, crossings K..)
    home_xs: tuple[int, ...]  # crossings the request waits for (graph outputs on their way home)
    work_ms: np.ndarray  # per part, without contention
    nodes_ms: np.ndarray  # per part, its nodes alone


def boundary_ms(
    cm: CostModel,
    x: np.ndarray,
    parts,
    part_of: np.ndarray,
    backends: Sequence[str | None] | None = None,
) -> np.ndarray:
    """Per part: the fixed cost and the costs of the tensors crossing its boundary (in and out,
    with layout reorders), graph inputs and outputs excepted (a whole-model run pays them too).
    ``backends``: each node's backend (by default, the cost model's on the node's processor)."""
    ov = cm.ov
    out = np.zeros(len(parts))
    procs = [int(x[p[0]]) for p in parts]
    if backends is None:
        site = [(q, cm.backend[p[0]][q]) for p, q in zip(parts, procs)]
    else:
        site = [(q, backends[p[0]]) for p, q in zip(parts, procs)]
    costs = [ov.cost(*s) for s in site]
    for k, c in enumerate(costs):
        out[k] += c.part_ms
    of = np.asarray(part_of).tolist()
    for i, f in enumerate(cm.flows):
        if f.src < 0:
            continue
        sk = of[f.src]
        readers: dict[int, bool] = {}
        for d in f.dsts:
            k = of[d]
            if k != sk:
                readers[k] = readers.get(k, False) or bool(ov.blocked_in[d, site[k][0]])
        if not readers:
            continue
        src = costs[sk]
        out[sk] += f.nbytes * src.out_ms_per_byte
        if ov.blocked_out[i, site[sk][0]]:
            out[sk] += src.reorder_ms(f.tensor, f.nbytes, leaving=True)
        for k, blocked in readers.items():
            c = costs[k]
            out[k] += c.crossing_ms + f.nbytes * c.in_ms_per_byte
            if blocked:
                out[k] += c.reorder_ms(f.tensor, f.nbytes, leaving=False)
    return out


def call_ms(cm: CostModel, n_parts: int, part_of: Sequence[int], proc: Sequence[int]) -> np.ndarray:
    """Per part: on a server processor, its call (:attr:`Overheads.call_ms` plus the cost per byte
    of every tensor it is sent or sends back, graph inputs and outputs included); else 0."""
    ov = cm.ov
    out = np.zeros(n_parts)
    remote = [bool(cm.remote[p]) for p in proc]
    if not any(remote) or not (ov.call_ms or ov.call_ms_per_byte):
        return out
    nbytes = [0] * n_parts
    for f in cm.flows:
        src = part_of[f.src] if f.src >= 0 else -1
        readers = {part_of[d] for d in f.dsts} - {src}
        for k in readers:
            nbytes[k] += f.nbytes
        if src >= 0 and (readers or f.to_home):
            nbytes[src] += f.nbytes
    for k in range(n_parts):
        if remote[k]:
            out[k] = ov.call_ms + ov.call_ms_per_byte * nbytes[k]
    return out


def layout(cm: CostModel, x: np.ndarray, parts: Sequence[Sequence[int]] | None = None) -> Layout:
    """The parts of assignment ``x`` (``parts``, in a topological order, when a plan fixes them;
    else :func:`part_labels`), what each waits for, and their runs without contention."""
    xl = np.asarray(x).tolist()  # plain ints: the loops below index them one by one
    if parts is None:
        parts = tuple(map(tuple, part_labels(cm, x)))  # plain ints already
    else:
        parts = tuple(tuple(int(n) for n in p) for p in parts)
    of = [0] * cm.n_nodes
    for k, p in enumerate(parts):
        for n in p:
            of[n] = k
    part_of = np.array(of, dtype=np.int64)
    proc_l = [xl[p[0]] for p in parts]
    proc = np.array(proc_l, dtype=np.int64)
    xs = tuple(crossings(cm, x))
    n_parts = len(parts)
    arrive = {(c.flow, c.dst): n_parts + j for j, c in enumerate(xs)}
    deps: list[set[int]] = [set() for _ in range(n_parts + len(xs))]
    for j, c in enumerate(xs):
        src = cm.flows[c.flow].src
        if src >= 0:
            deps[n_parts + j].add(of[src])
    for i, src, d in cm.flow_reads:
        k = of[d]
        src_k = of[src] if src >= 0 else -1
        if src_k == k:
            continue
        q = proc_l[k]
        if (i, q) in arrive:
            deps[k].add(arrive[i, q])
        elif src_k >= 0:
            deps[k].add(src_k)
    home_xs = tuple(
        n_parts + j for j, c in enumerate(xs) if c.dst == cm.home and cm.flows[c.flow].to_home
    )
    # each part's node costs summed over a slice of one gather (as its own fancy index summed them:
    # the same numbers in the same order), not an index per part
    flat = [n for p in parts for n in p]
    on_proc = cm.node_ms[flat, [xl[n] for n in flat]]
    ends = np.cumsum([len(p) for p in parts]).tolist()
    nodes_ms = np.array([float(on_proc[e - len(p) : e].sum()) for p, e in zip(parts, ends)])
    work = nodes_ms + boundary_ms(cm, x, parts, part_of) + call_ms(cm, n_parts, of, proc_l)
    return Layout(parts, proc, xs, tuple(tuple(sorted(d)) for d in deps), home_xs, work, nodes_ms)


@dataclass
class _Run:
    start: np.ndarray
    end: np.ndarray
    parts_end_ms: float
    last_end: dict[int, float]
    handoffs_ms: float


def _simulate(cm: CostModel, lay: Layout, dur: np.ndarray, tail: dict[int, float]) -> _Run:
    """Event-driven list scheduling, first ready first on every worker and channel.

    Hot (twice per schedule, hundreds of schedules per plan): plain lists and floats, not numpy
    scalars, in the loop."""
    handoff = cm.ov.handoff
    n_parts = len(lay.parts)
    n_tasks = n_parts + len(lay.xs)
    proc = lay.proc.tolist()
    channel = [int(cm.channel[c.src, c.dst]) for c in lay.xs]
    succ: list[list[int]] = [[] for _ in range(n_tasks)]
    missing = [len(ds) for ds in lay.deps]
    for t, ds in enumerate(lay.deps):
        for d in ds:
            succ[d].append(t)
    took = dur.tolist() + [c.latency_ms for c in lay.xs]
    ready = [0.0] * n_tasks
    trigger = [-1] * n_tasks  # the lane whose part made a part ready
    start, end = [0.0] * n_tasks, [0.0] * n_tasks
    proc_free: dict[int, float] = {}
    blocked_by = cm.blocked_by
    channel_free: dict[int, float] = {}
    last_end: dict[int, float] = {}
    handoffs = 0.0

    def entry(t: int) -> tuple[float, float, int, float]:
        """(start, ready, task, hand-off) if ``t`` were placed now: earliest start first; then
        first ready; then part order."""
        r = ready[t]
        if t >= n_parts:
            return max(r, channel_free.get(channel[t - n_parts], 0.0)), r, t, 0.0
        p = proc[t]
        busy_until = proc_free.get(p, 0.0)
        if busy_until > r or (trigger[t] == p and busy_until >= r):
            return max(busy_until, r), r, t, 0.0
        gap = r - last_end[p] if p in last_end else r + tail.get(p, 0.0)
        h = handoff(p, max(gap, 0.0))
        return r + h, r, t, h

    heap = [entry(t) for t in range(n_tasks) if missing[t] == 0]
    heapq.heapify(heap)
    while heap:
        s, _, t, h = heapq.heappop(heap)
        fresh = entry(t)
        if abs(fresh[0] - s) > 1e-12:  # its worker or channel changed since: place it again
            heapq.heappush(heap, fresh)
            continue
        start[t] = s
        end[t] = e = s + took[t]
        if t < n_parts:
            p = proc[t]
            proc_free[p] = last_end[p] = e
            for q in blocked_by[p][1:]:  # a core group and its members wait for each other
                if proc_free.get(q, 0.0) < e:
                    proc_free[q] = e
            handoffs += h
            made_by = p
        else:
            channel_free[channel[t - n_parts]] = s + lay.xs[t - n_parts].serial_ms
            made_by = -1
        for u in succ[t]:
            if e >= ready[u]:
                ready[u] = e
                trigger[u] = made_by
            missing[u] -= 1
            if missing[u] == 0:
                heapq.heappush(heap, entry(u))
    ends = [max(end[:n_parts])] if n_parts else [0.0]
    ends += [end[j] for j in lay.home_xs]
    return _Run(np.array(start), np.array(end), max(ends), last_end, handoffs)


def _stretch(cm: CostModel, lay: Layout, run: _Run) -> np.ndarray:
    """Part runs lengthened by contention over their overlap with other busy local processors."""
    n_parts = len(lay.parts)
    contention = cm.ov.contention
    if contention is None or n_parts < 2 or bool((contention <= 1.0).all()):
        return lay.work_ms.copy()
    start, end = run.start[:n_parts], run.end[:n_parts]
    overlap = np.minimum(end[:, None], end[None, :]) - np.maximum(start[:, None], start[None, :])
    extra = contention[lay.proc[:, None], lay.proc[None, :]] - 1.0
    local = ~cm.remote[lay.proc]
    mask = local[:, None] & local[None, :] & ~cm.blocks[lay.proc[:, None], lay.proc[None, :]]
    return lay.work_ms + (np.where(mask, extra, 0.0) * np.clip(overlap, 0.0, None)).sum(axis=1)


def _timed(
    cm: CostModel, x: np.ndarray, parts: Sequence[Sequence[int]] | None
) -> tuple[Layout, np.ndarray, _Run, float]:
    """The layout of ``x``, its parts' runs with contention, their schedule and the latency."""
    ov = cm.ov
    lay = layout(cm, x, parts)
    first = _simulate(cm, lay, lay.work_ms, {})
    dur = _stretch(cm, lay, first)
    # back to back: after a worker's last part, the rest of the request, the caller's wake-up and
    # the Session's work pass before the next request hands it its first part
    between = ov.wake(first.parts_end_ms) + ov.session_ms
    tail = {p: first.parts_end_ms - e + between for p, e in first.last_end.items()}
    run = _simulate(cm, lay, dur, tail)
    if not lay.parts:
        return lay, dur, run, 0.0
    if len(lay.parts) == 1 and not cm.remote[int(lay.proc[0])]:
        # one local part runs on the caller's own thread (Session.run): no hand-off, no wake-up
        return lay, dur, run, float(ov.caller_session_ms + run.parts_end_ms - run.handoffs_ms)
    return lay, dur, run, float(ov.session_ms + run.parts_end_ms + ov.wake(run.parts_end_ms))


def makespan_ms(cm: CostModel, assign: np.ndarray) -> float:
    """``schedule(cm, assign).makespan_ms`` without the rest of the record: what a search scores
    hundreds of assignments by."""
    return _timed(cm, np.asarray(assign), None)[3]


def schedule(
    cm: CostModel, assign: np.ndarray, parts: Sequence[Sequence[int]] | None = None
) -> Schedule:
    """Schedule ``assign`` part by part and price it (latency = the request's, device energy over
    it).

    ``parts`` fixes the parts (node indices, in a topological order of parts) where a bundle's
    plan has its own; by default they are those the optimiser makes (:func:`part_labels`).
    """
    x = np.asarray(assign)
    ov = cm.ov
    lay, dur, run, latency = _timed(cm, x, parts)
    n_parts = len(lay.parts)
    node_start, node_end = np.zeros(cm.n_nodes), np.zeros(cm.n_nodes)
    busy = np.zeros(cm.n_procs)
    active = float(cm.node_mj[np.arange(cm.n_nodes), x].sum()) if cm.n_nodes else 0.0
    active_w = ov.active_w if ov.active_w is not None else np.zeros(cm.n_procs)
    for k, part in enumerate(lay.parts):
        p = int(lay.proc[k])
        busy[p] += dur[k]
        active += (dur[k] - lay.nodes_ms[k]) * float(active_w[p])
        t = run.start[k]
        for n in part:
            node_start[n] = t
            t += float(cm.node_ms[n, p])
            node_end[n] = t
    active += sum(c.energy_mj for c in lay.xs)
    return Schedule(
        makespan_ms=float(latency),
        energy_mj=float(device_energy_mj(cm, float(latency), cm.core_busy_ms(busy), active)),
        node_start_ms=node_start,
        node_end_ms=node_end,
        crossings=lay.xs,
        crossing_start_ms=tuple(float(v) for v in run.start[n_parts:]),
        crossing_end_ms=tuple(float(v) for v in run.end[n_parts:]),
        busy_ms=busy,
        parts=lay.parts,
        part_proc=tuple(int(p) for p in lay.proc),
        part_ms=dur,
        part_start_ms=run.start[:n_parts],
        part_end_ms=run.end[:n_parts],
        handoffs_ms=run.handoffs_ms,
    )


def sequential_latency_ms(cm: CostModel, assign: np.ndarray) -> float:
    """Everything of :func:`schedule` one after the other: a bound on its latency."""
    s = schedule(cm, assign)
    if not s.parts:
        return 0.0
    ov = cm.ov
    span = float(np.sum(s.part_ms)) + sum(c.latency_ms for c in s.crossings) + s.handoffs_ms
    return ov.session_ms + span + float(np.max(ov.return_ms))


def makespan_lower_bound(cm: CostModel) -> float:
    """A lower bound on any plan's latency, the larger of two relaxations, plus the request's
    Session work (a plan of one local part, run on the caller's thread, has no wake-up).

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
    ov = cm.ov
    # a plan of one local part has no wake-up, and the caller's lighter path
    return max(path, work) + min(ov.session_ms, ov.caller_session_ms)
