"""Where a Session's time goes: typed timing records of every request and part run.

Every timestamp is a ``time.perf_counter_ns()`` value of the process that ran the Session (one
monotonic clock for all processors' workers), so records of different parts and processors can be
compared directly. The Session keeps them always on (they cost about a microsecond per part run,
see ``benchmarks/trace_overhead.py``); :meth:`Session.trace_records` returns a :class:`Trace`.

A part run's timeline, in order::

    ready_ns      its inputs are all there (the last producer's outputs merged, or the request
    began)
    submit_ns     handed to its processor's worker queue
    start_ns      the worker picked it up
    run_start_ns  the backend's run call began (after gathering / copying its inputs)
    run_end_ns    the run call returned
    collected_ns  its outputs are collected (converted to numpy)
    done_ns       its outputs are merged into the request and its ready successors identified

A detailed trace (opt-in, ``load(bundle, detailed=True)``) adds each run call's thread CPU time
and the ORT engine spans and kernels that sit inside the run call
(:mod:`edgesplit.runtime.kernels`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from edgesplit.bundle.format import PartArtifact


class _Interval:
    """A read-only attribute of a timing record: the time in ns from its ``start`` stamp to its
    ``end`` stamp (both fields of the record)."""

    def __init__(self, start: str, end: str):
        self.start, self.end = start, end

    def __get__(self, record: object, owner: type | None = None) -> int:
        if record is None:
            return self  # type: ignore[return-value]  # on the class: the attribute itself
        return getattr(record, self.end) - getattr(record, self.start)


@dataclass(frozen=True)
class PartRun:
    """One run of one part for one request (timestamps: ``time.perf_counter_ns()``).

    Attributes:
        request: The request's number in its Session (0, 1, ... since the Session was loaded).
        lane: The worker that ran it: the processor's name, or ``remote:<part>`` for a server part.
        run_index: The part's how-many-th run since the Session was loaded (warm-up runs included).
        worker_idle: Whether its worker had no other part queued or running when it was submitted.
        run_cpu_ns: CPU time the worker thread got during the run call, with its reads around it
            (detailed traces only, else None). Against ``run_ns`` it shows time the thread was
            runnable but not running: CPU quota throttling, or other processes on the core.
    """

    request: int
    part: str
    processor: str
    lane: str
    backend: str
    run_index: int
    worker_idle: bool
    ready_ns: int
    submit_ns: int
    start_ns: int
    run_start_ns: int
    run_end_ns: int
    collected_ns: int
    done_ns: int
    run_cpu_ns: int | None = None

    queue_wait_ns = _Interval("ready_ns", "start_ns")
    """Inputs ready -> worker started it: hand-off, plus waiting behind other parts on its
    worker."""

    @property
    def handoff_ns(self) -> int | None:
        """Submitted -> started, when the worker was idle (a thread wake-up); None if it was
        busy."""
        return self.start_ns - self.submit_ns if self.worker_idle else None

    run_ns = _Interval("run_start_ns", "run_end_ns")
    """The backend's run call."""
    inputs_ns = _Interval("start_ns", "run_start_ns")
    """Gathering (and for TVM, copying) the inputs before the run call."""
    outputs_ns = _Interval("run_end_ns", "collected_ns")
    """Collecting the outputs after the run call."""
    bookkeeping_ns = _Interval("collected_ns", "done_ns")
    """Merging the outputs into the request and finding the parts that became ready."""
    span_ns = _Interval("start_ns", "done_ns")
    """The worker's time on this run: started -> done."""


@dataclass(frozen=True)
class RequestRun:
    """One request: submitted (``start_ns``) -> its last part done and the result set
    (``end_ns``)."""

    request: int
    start_ns: int
    end_ns: int

    latency_ns = _Interval("start_ns", "end_ns")
    """Submitted -> result set."""


@dataclass(frozen=True)
class EngineRun:
    """The engine's own span of a run call (ORT's ``model_run`` event), placed on the run clock.

    Attributes:
        kernels_ns: Sum of its kernels' durations. ``reorder_ns``: the layout reorder kernels among
            them (``ReorderInput``/``ReorderOutput``, inserted by ORT for NCHWc at part edges).
    """

    request: int
    part: str
    lane: str
    start_ns: int
    dur_ns: int
    kernels_ns: int
    reorder_ns: int
    reorders: int


@dataclass(frozen=True)
class KernelRun:
    """One kernel inside an engine run (ORT profiler ``cat == "Node"``), placed on the run clock."""

    request: int
    part: str
    lane: str
    name: str
    op_type: str
    start_ns: int
    dur_ns: int

    @property
    def is_reorder(self) -> bool:
        return is_reorder(self.op_type)


def is_reorder(op_type: str) -> bool:
    """A layout reorder kernel (ORT's NCHWc transformer inserts
    ``ReorderInput``/``ReorderOutput``)."""
    return op_type.startswith("Reorder")


@dataclass(frozen=True)
class ProcessorBusy:
    """One worker lane's load over a window.

    Attributes:
        busy_ns: Sum of its run calls within the window. ``worker_ns``: sum of its part spans
            (run calls plus input/output handling and bookkeeping).
    """

    lane: str
    window_ns: int
    busy_ns: int
    worker_ns: int
    runs: int

    @property
    def utilisation(self) -> float:
        return self.busy_ns / self.window_ns if self.window_ns > 0 else float("nan")


@dataclass(frozen=True)
class Trace:
    """A snapshot of a Session's timing records (see the module docstring for the timeline).

    ``engine_runs`` and ``kernels`` are empty unless the Session was loaded with
    ``detailed=True`` and :meth:`Session.end_detailed_trace` was called.
    """

    parts: tuple[PartRun, ...]
    requests: tuple[RequestRun, ...]
    lanes: tuple[str, ...]
    engine_runs: tuple[EngineRun, ...] = ()
    kernels: tuple[KernelRun, ...] = ()

    def select(self, requests: Iterable[int]) -> Trace:
        """The records of the given requests only."""
        keep = set(requests)
        return Trace(
            tuple(p for p in self.parts if p.request in keep),
            tuple(r for r in self.requests if r.request in keep),
            self.lanes,
            tuple(e for e in self.engine_runs if e.request in keep),
            tuple(k for k in self.kernels if k.request in keep),
        )

    def request(self, number: int) -> RequestRun:
        for r in self.requests:
            if r.request == number:
                return r
        raise KeyError(number)

    def busy(
        self, start_ns: int | None = None, end_ns: int | None = None
    ) -> tuple[ProcessorBusy, ...]:
        """Each lane's run-call time within ``[start_ns, end_ns]`` (default: the whole trace)."""
        if not self.parts:
            return ()
        lo = min(p.ready_ns for p in self.parts) if start_ns is None else start_ns
        hi = max(p.done_ns for p in self.parts) if end_ns is None else end_ns
        out = []
        for lane in self.lanes:
            runs = [p for p in self.parts if p.lane == lane]
            busy = sum(_overlap(p.run_start_ns, p.run_end_ns, lo, hi) for p in runs)
            worker = sum(_overlap(p.start_ns, p.done_ns, lo, hi) for p in runs)
            n = sum(1 for p in runs if p.run_start_ns < hi and p.run_end_ns > lo)
            out.append(ProcessorBusy(lane, hi - lo, busy, worker, n))
        return tuple(out)

    def busy_in_requests(self) -> tuple[ProcessorBusy, ...]:
        """Each lane's load while requests were in flight: the window is the sum of the request
        latencies, the busy time the run calls inside them (for requests run one at a time; in a
        stream, overlapping requests count a run call once per request it overlaps)."""
        out = []
        for lane in self.lanes:
            runs = [p for p in self.parts if p.lane == lane]
            busy = worker = n = window = 0
            for r in self.requests:
                window += r.latency_ns
                busy += sum(
                    _overlap(p.run_start_ns, p.run_end_ns, r.start_ns, r.end_ns) for p in runs
                )
                worker += sum(_overlap(p.start_ns, p.done_ns, r.start_ns, r.end_ns) for p in runs)
                n += sum(1 for p in runs if p.request == r.request)
            out.append(ProcessorBusy(lane, window, busy, worker, n))
        return tuple(out)


def _overlap(a: int, b: int, lo: int, hi: int) -> int:
    return max(0, min(b, hi) - max(a, lo))


def median_ms(values_ns: Iterable[int | None]) -> float | None:
    """Median in ms of the values that are not None; None when there are none."""
    v = [x for x in values_ns if x is not None]
    return float(np.median(v)) / 1e6 if v else None


def build_trace(
    raw_parts: Sequence[tuple],
    raw_requests: Sequence[tuple[int, int, int]],
    parts: Sequence[PartArtifact],
    lane_of: Callable[[PartArtifact], str],
) -> Trace:
    """Typed records from the Session's raw tuples.

    Args:
        raw_parts: ``(request, part, run_index, ready_ns, submit_ns, start_ns, run_start_ns,
            run_end_ns, collected_ns, done_ns, run_cpu_ns)`` per part run.
        raw_requests: ``(request, start_ns, end_ns)`` per finished request.
        parts: The bundle's parts (processor and backend of each).
        lane_of: The worker lane of a part.

    ``worker_idle`` is found here, not on the hot path: a run found its worker idle when no
    other run on that lane had been submitted before it and was not yet done.
    """
    by_name = {p.name: p for p in parts}
    lanes = tuple(dict.fromkeys(lane_of(p) for p in parts))
    busy_until: dict[str, int] = {}
    idle: dict[tuple[int, str], bool] = {}
    for r in sorted(raw_parts, key=lambda r: r[4]):  # by submit_ns
        lane = lane_of(by_name[r[1]])
        idle[(r[0], r[1])] = busy_until.get(lane, 0) <= r[4]
        busy_until[lane] = max(busy_until.get(lane, 0), r[9])
    records = []
    for r in raw_parts:
        part = by_name[r[1]]
        records.append(
            PartRun(
                r[0],
                r[1],
                part.processor,
                lane_of(part),
                part.backend,
                r[2],
                idle[(r[0], r[1])],
                *r[3:],
            )
        )
    records.sort(key=lambda p: (p.request, p.ready_ns))
    requests = tuple(RequestRun(*r) for r in sorted(raw_requests))
    return Trace(tuple(records), requests, lanes)
