"""Where the time went: a Trace reduced to per-part and per-request figures beside the plan's.

Per part: the median run call against the plan's predicted time, the median queue wait and
hand-off, input and output handling, and (with a kernel trace) the engine's own time and its
layout reorders. Per request: the latency split along its *realised* critical path, the chain of
part runs that ended last, each reached through the part whose outputs made it ready. Along that
chain every nanosecond of the request is in exactly one bucket: run calls, input/output handling,
hand-offs (the worker was idle: a thread wake-up), queue waits (the worker was busy with another
part: two parts wanted one processor), scheduler bookkeeping, and ``other`` (building the result).
What is not run calls is the per-request overhead the plan's cost model must learn.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgesplit.bundle.format import Manifest
from edgesplit.runtime.trace import PartRun, ProcessorBusy, Trace, median_ms


@dataclass(frozen=True)
class PartBreakdown:
    """Medians over a part's runs (ms). ``handoff_ms`` is over the runs that found the worker idle
    (None if none did); ``run_cpu_ms`` (the worker's CPU time in the run call) and the
    ``engine``/``kernels``/``reorder`` figures need a detailed trace."""

    part: str
    processor: str
    lane: str
    backend: str
    runs: int
    run_ms: float
    span_ms: float
    predicted_ms: float | None
    queue_wait_ms: float
    handoff_ms: float | None
    inputs_ms: float
    outputs_ms: float
    bookkeeping_ms: float
    run_cpu_ms: float | None = None
    engine_ms: float | None = None
    kernels_ms: float | None = None
    reorder_ms: float | None = None
    reorders: int | None = None


@dataclass(frozen=True)
class RequestBreakdown:
    """One request's latency split along its realised critical path (``path``, first to last).

    ``run_ms + io_ms + handoff_ms + queue_ms + bookkeeping_ms + other_ms == latency_ms``.
    """

    request: int
    latency_ms: float
    path: tuple[str, ...]
    run_ms: float
    io_ms: float
    handoff_ms: float
    queue_ms: float
    bookkeeping_ms: float
    other_ms: float

    @property
    def unexplained_ms(self) -> float:
        """What the critical path's run calls do not account for: the per-request overhead."""
        return self.latency_ms - self.run_ms


@dataclass(frozen=True)
class Breakdown:
    """Per part, per request, per processor; the end-to-end figures are medians over requests
    (None when the trace has no request)."""

    parts: tuple[PartBreakdown, ...]
    """Each part that ran, in the manifest's order: medians over its runs."""
    requests: tuple[RequestBreakdown, ...]
    """Each request of the trace, split along its realised critical path."""
    processors: tuple[ProcessorBusy, ...]
    """Each lane's run calls over the time requests were in flight
    (:meth:`Trace.busy_in_requests`)."""
    latency_ms: float | None
    """End-to-end latency of a request."""
    predicted_ms: float | None
    """The plan's predicted latency (its ``predicted.latency_ms``; None when it has none)."""
    critical_run_ms: float | None
    """Sum of the run calls on each request's realised critical path."""
    unexplained_ms: float | None
    """Latency minus ``critical_run_ms``, split into the buckets below (each a median on its own,
    so they need not add up exactly)."""
    io_ms: float | None
    """Gathering inputs before, and collecting outputs after, the critical path's run calls."""
    handoff_ms: float | None
    """Waits for an idle worker to start a part (thread wake-ups) on the critical path."""
    queue_ms: float | None
    """Waits on the critical path behind another part on a busy worker (two parts, one lane)."""
    bookkeeping_ms: float | None
    """The scheduler merging outputs into the request and finding the parts that became ready."""
    other_ms: float | None
    """The rest of the latency: building the result."""


def plan_value(plan: Any, key: str) -> Any:
    """A top-level field of the manifest's plan, whether a JSON mapping or a typed Plan."""
    return plan.get(key) if isinstance(plan, Mapping) else getattr(plan, key, None)


def breakdown(trace: Trace, manifest: Manifest) -> Breakdown:
    """Reduce ``trace`` (usually the single requests of a benchmark) against the bundle's plan."""
    runs_of: dict[str, list[PartRun]] = defaultdict(list)
    for p in trace.parts:
        runs_of[p.part].append(p)
    engines = defaultdict(list)
    for e in trace.engine_runs:
        engines[e.part].append(e)
    parts = []
    for art in manifest.parts:
        runs = runs_of.get(art.name, [])
        if not runs:
            continue
        eng = engines.get(art.name, [])
        parts.append(
            PartBreakdown(
                art.name,
                art.processor,
                runs[0].lane,
                runs[0].backend,
                len(runs),
                median_ms(p.run_ns for p in runs),
                median_ms(p.span_ns for p in runs),
                art.predicted_ms,
                median_ms(p.queue_wait_ns for p in runs),
                median_ms(p.handoff_ns for p in runs),
                median_ms(p.inputs_ns for p in runs),
                median_ms(p.outputs_ns for p in runs),
                median_ms(p.bookkeeping_ns for p in runs),
                median_ms(p.run_cpu_ns for p in runs),
                median_ms(e.dur_ns for e in eng),
                median_ms(e.kernels_ns for e in eng),
                median_ms(e.reorder_ns for e in eng),
                int(np.median([e.reorders for e in eng])) if eng else None,
            )
        )
    requests = tuple(
        _request(trace, r.request, r.start_ns, r.end_ns, manifest) for r in trace.requests
    )
    predicted = plan_value(manifest.plan, "predicted") or {}
    predicted = plan_value(predicted, "latency_ms")

    def med(attr: str) -> float | None:
        return float(np.median([getattr(r, attr) for r in requests])) if requests else None

    return Breakdown(
        tuple(parts),
        requests,
        trace.busy_in_requests(),
        med("latency_ms"),
        predicted,
        med("run_ms"),
        med("unexplained_ms"),
        med("io_ms"),
        med("handoff_ms"),
        med("queue_ms"),
        med("bookkeeping_ms"),
        med("other_ms"),
    )


def _request(
    trace: Trace, number: int, start_ns: int, end_ns: int, manifest: Manifest
) -> RequestBreakdown:
    mine = {p.part: p for p in trace.parts if p.request == number}
    deps = {a.name: a.depends_on for a in manifest.parts}
    path: list[PartRun] = []
    cur = max(mine.values(), key=lambda p: p.done_ns) if mine else None
    while cur is not None:
        path.append(cur)
        producers = [
            mine[d] for d in deps.get(cur.part, ()) if d in mine and mine[d].done_ns <= cur.ready_ns
        ]
        cur = max(producers, key=lambda p: p.done_ns) if producers else None
    path.reverse()
    ms = 1e-6
    run = sum(p.run_ns for p in path) * ms
    io = sum(p.inputs_ns + p.outputs_ns for p in path) * ms
    handoff = sum(p.queue_wait_ns for p in path if p.worker_idle) * ms
    queue = sum(p.queue_wait_ns for p in path if not p.worker_idle) * ms
    book = sum(p.bookkeeping_ns for p in path) * ms
    latency = (end_ns - start_ns) * ms
    return RequestBreakdown(
        number,
        latency,
        tuple(p.part for p in path),
        run,
        io,
        handoff,
        queue,
        book,
        latency - run - io - handoff - queue - book,
    )
