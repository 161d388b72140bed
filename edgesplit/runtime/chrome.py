"""A Trace as a Chrome trace (Trace Event Format, JSON object form), with the plan beside it.

Opens in Perfetto (ui.perfetto.dev) and chrome://tracing. Layout:

- process 1, ``measured``: one thread per processor lane with one complete event (``ph: "X"``,
  ``cat: "part"``) per part run, from the worker starting it to its outputs merged, and inside it
  the backend's run call (``cat: "run"``) and, with a kernel trace, ORT's ``model_run``
  (``cat: "engine"``) and its kernels (``cat: "kernel"``, reorders ``cat: "reorder"``); a
  ``<lane> waiting`` thread per lane (more rows where waits overlap) with each run's wait from
  ready to started (``cat: "handoff"`` when the worker was idle, ``cat: "queue"`` when it was
  busy with another part); and ``requests`` rows with one event per request (``cat: "request"``).
- process 2, ``predicted``: the plan's part spans (``start_ms``/``end_ms`` of each part) on one
  thread per processor, and its predicted request, aligned to the start of one traced request.

Times (``ts``, ``dur``) are microseconds from the first traced request's start.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

from edgesplit.bundle.format import Manifest
from edgesplit.runtime.breakdown import plan_value
from edgesplit.runtime.trace import Trace, is_reorder
from edgesplit.util import atomic_write_text

MEASURED_PID = 1
PREDICTED_PID = 2


class _Lanes:
    """Thread ids by name, with greedy packing of overlapping spans onto numbered rows."""

    def __init__(self, pid: int, base: int):
        self.pid = pid
        self.next_tid = base
        self.tids: dict[str, int] = {}
        self.rows: dict[str, list[tuple[int, float]]] = {}

    def tid(self, name: str) -> int:
        if name not in self.tids:
            self.tids[name] = self.next_tid
            self.next_tid += 1
        return self.tids[name]

    def row(self, group: str, ts: float, end: float) -> int:
        """A row of ``group`` that is free at ``ts``; spans must arrive in start order."""
        rows = self.rows.setdefault(group, [])
        for k, (tid, busy_until) in enumerate(rows):
            if busy_until <= ts:
                rows[k] = (tid, end)
                return tid
        tid = self.tid(group if not rows else f"{group} {len(rows) + 1}")
        rows.append((tid, end))
        return tid

    def metadata(self, process: str) -> list[dict[str, Any]]:
        out = [
            _meta(self.pid, 0, "process_name", process),
            _meta(self.pid, 0, "process_sort_index", self.pid),
        ]
        for name, tid in self.tids.items():
            out.append(_meta(self.pid, tid, "thread_name", name))
            out.append(_meta(self.pid, tid, "thread_sort_index", tid))
        return out


def _meta(pid: int, tid: int, name: str, value: Any) -> dict[str, Any]:
    key = "name" if name.endswith("_name") else "sort_index"
    return {"ph": "M", "pid": pid, "tid": tid, "name": name, "args": {key: value}}


def _x(
    name: str, cat: str, pid: int, tid: int, ts: float, dur: float, args: Mapping | None = None
) -> dict:
    ev = {
        "name": name,
        "cat": cat,
        "ph": "X",
        "pid": pid,
        "tid": tid,
        "ts": ts,
        "dur": max(dur, 0.0),
    }
    if args:
        ev["args"] = dict(args)
    return ev


def predicted_spans(plan: Any) -> list[tuple[str, str, float, float]]:
    """``(part, processor, start_ms, end_ms)`` of each plan part that carries predicted times."""
    out = []
    for p in plan_value(plan, "parts") or ():
        get = p.get if isinstance(p, Mapping) else lambda k, p=p: getattr(p, k, None)
        if get("start_ms") is not None and get("end_ms") is not None:
            out.append(
                (get("name"), get("processor"), float(get("start_ms")), float(get("end_ms")))
            )
    return out


def chrome_trace(
    trace: Trace, manifest: Manifest, *, align_request: int | None = None
) -> dict[str, Any]:
    """The Trace Event Format object for ``trace``; the plan's spans are aligned to the start of
    request ``align_request`` (default: the first traced request)."""
    origin = min(
        (r.start_ns for r in trace.requests),
        default=min((p.ready_ns for p in trace.parts), default=0),
    )

    def us(ns: int) -> float:
        return round((ns - origin) / 1e3, 3)

    m = _Lanes(MEASURED_PID, 1)
    for lane in trace.lanes:
        m.tid(lane)
    events: list[dict[str, Any]] = []
    for r in sorted(trace.requests, key=lambda r: r.start_ns):
        ts, end = us(r.start_ns), us(r.end_ns)
        events.append(
            _x(f"request {r.request}", "request", m.pid, m.row("requests", ts, end), ts, end - ts)
        )
    for p in sorted(trace.parts, key=lambda p: p.ready_ns):
        tid = m.tid(p.lane)
        args = {
            "request": p.request,
            "run_ms": p.run_ns / 1e6,
            "inputs_ms": p.inputs_ns / 1e6,
            "outputs_ms": p.outputs_ns / 1e6,
            "queue_wait_ms": p.queue_wait_ns / 1e6,
            "worker_idle": p.worker_idle,
        }
        if p.run_cpu_ns is not None:
            args["run_cpu_ms"] = p.run_cpu_ns / 1e6
        events.append(_x(p.part, "part", m.pid, tid, us(p.start_ns), p.span_ns / 1e3, args))
        events.append(_x(f"{p.backend} run", "run", m.pid, tid, us(p.run_start_ns), p.run_ns / 1e3))
        ts, end = us(p.ready_ns), us(p.start_ns)
        cat = "handoff" if p.worker_idle else "queue"
        wait = m.row(f"{p.lane} waiting", ts, end)
        events.append(_x(f"{cat} {p.part}", cat, m.pid, wait, ts, end - ts, {"request": p.request}))
    for e in trace.engine_runs:
        args = {
            "kernels_ms": e.kernels_ns / 1e6,
            "reorder_ms": e.reorder_ns / 1e6,
            "reorders": e.reorders,
        }
        events.append(
            _x("model_run", "engine", m.pid, m.tid(e.lane), us(e.start_ns), e.dur_ns / 1e3, args)
        )
    for k in trace.kernels:
        cat = "reorder" if is_reorder(k.op_type) else "kernel"
        events.append(
            _x(
                k.name,
                cat,
                m.pid,
                m.tid(k.lane),
                us(k.start_ns),
                k.dur_ns / 1e3,
                {"op_type": k.op_type},
            )
        )
    events.extend(_predicted(trace, manifest, align_request, us))
    title = f"measured: {manifest.model_name} on {manifest.device}"
    meta = m.metadata(title)
    return {
        "traceEvents": meta + events,
        "displayTimeUnit": "ms",
        "otherData": {
            "model": manifest.model_name,
            "device": manifest.device,
            "clock": "perf_counter_ns",
        },
    }


def _predicted(
    trace: Trace, manifest: Manifest, align_request: int | None, us
) -> list[dict[str, Any]]:
    spans = predicted_spans(manifest.plan)
    if not spans or not trace.requests:
        return []
    req = (
        trace.request(align_request)
        if align_request is not None
        else min(trace.requests, key=lambda r: r.start_ns)
    )
    t0 = us(req.start_ns)
    pr = _Lanes(PREDICTED_PID, 1)
    events = []
    total = plan_value(plan_value(manifest.plan, "predicted") or {}, "latency_ms")
    if total is None:
        total = max(end for *_, end in spans)
    events.append(
        _x(
            f"request {req.request} (predicted)",
            "request",
            pr.pid,
            pr.tid("request"),
            t0,
            total * 1e3,
        )
    )
    for name, proc, start_ms, end_ms in sorted(spans, key=lambda s: s[2]):
        # The plan's schedule may interleave the nodes of two parts on one processor, so their
        # spans can overlap: the later one goes on a second row.
        ts, end = t0 + start_ms * 1e3, t0 + end_ms * 1e3
        events.append(_x(name, "part", pr.pid, pr.row(proc, ts, end), ts, end - ts))
    return (
        pr.metadata(
            f"predicted: plan ({plan_value(manifest.plan, 'objective')}), aligned to request "
            f"{req.request}"
        )
        + events
    )


def write_chrome_trace(
    path: str | os.PathLike, trace: Trace, manifest: Manifest, *, align_request: int | None = None
) -> None:
    """Write :func:`chrome_trace` as JSON, atomically."""
    atomic_write_text(
        path, json.dumps(chrome_trace(trace, manifest, align_request=align_request)) + "\n"
    )


def trace_event_problems(obj: Any) -> Sequence[str]:
    """What in ``obj`` breaks the Trace Event Format's JSON object form (empty: nothing)."""
    problems = []
    if not isinstance(obj, dict) or not isinstance(obj.get("traceEvents"), list):
        return ["not an object with a traceEvents list"]
    if obj.get("displayTimeUnit") not in (None, "ms", "ns"):
        problems.append(f"displayTimeUnit {obj.get('displayTimeUnit')!r} is not 'ms' or 'ns'")
    for i, ev in enumerate(obj["traceEvents"]):
        ph = ev.get("ph")
        if not isinstance(ev.get("name"), str) or not isinstance(ph, str):
            problems.append(f"event {i}: no name or phase")
        elif not isinstance(ev.get("pid"), int) or not isinstance(ev.get("tid"), int):
            problems.append(f"event {i}: pid and tid must be integers")
        elif ph == "X" and not all(
            isinstance(ev.get(k), int | float) and ev[k] >= 0 for k in ("ts", "dur")
        ):
            problems.append(f"event {i}: a complete event needs ts and dur >= 0 (microseconds)")
        elif ph == "M" and not isinstance(ev.get("args"), dict):
            problems.append(f"event {i}: a metadata event needs args")
        elif ph not in ("X", "M"):
            problems.append(f"event {i}: phase {ph!r} is not written by edgesplit")
    return problems
