"""Kernels inside the run calls: ORT's own profiler on a Session's ORT parts (opt-in).

ORT's profiler writes a Chrome-trace JSON file per session (DESIGN.md, measured facts): one
``model_run`` event (``cat == "Session"``) per run and one event per kernel (``cat == "Node"``,
``dur`` in microseconds, names of the optimised graph, so the layout reorders ORT inserts for
NCHWc show up as ``ReorderInput``/``ReorderOutput`` kernels). Its timestamps are microseconds
since the profiler started on the wall clock; the k-th ``model_run`` of a part is its k-th run
since load (``PartRun.run_index``), and its place on the Session's clock comes from the offset
between the wall clock and ``perf_counter_ns``, clamped into the measured run call.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from edgesplit.errors import BundleError
from edgesplit.runtime.trace import EngineRun, KernelRun, Trace, is_reorder


@dataclass(frozen=True)
class _EngineEvent:
    """One ``model_run`` of a part with its kernels, in microseconds of the profiler's clock."""

    ts_us: float
    dur_us: float
    kernels: tuple[tuple[str, str, float, float], ...]  # (name, op type, ts_us, dur_us)


def wall_offset_ns() -> int:
    """``time.time_ns() - time.perf_counter_ns()``, read where the two reads are closest."""
    best = None
    for _ in range(7):
        a = time.perf_counter_ns()
        w = time.time_ns()
        b = time.perf_counter_ns()
        if best is None or b - a < best[0]:
            best = (b - a, w - (a + b) // 2)
    assert best is not None
    return best[1]


def read_ort_profile(path: str | Path) -> list[_EngineEvent]:
    """A part's ``model_run`` events in order, each with the kernels that fall inside it."""
    try:
        events = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise BundleError(f"{path}: cannot read ORT's profile ({e})") from e
    runs = sorted(
        (float(e["ts"]), float(e["dur"]))
        for e in events
        if e.get("cat") == "Session" and e.get("name") == "model_run"
    )
    nodes = sorted(
        (
            float(e["ts"]),
            float(e["dur"]),
            e.get("name", ""),
            (e.get("args") or {}).get("op_name", ""),
        )
        for e in events
        if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time")
    )
    out, k = [], 0
    for ts, dur in runs:
        inside = []
        while k < len(nodes) and nodes[k][0] < ts + dur:
            if nodes[k][0] >= ts:
                n = nodes[k]
                inside.append((n[2][: -len("_kernel_time")], n[3], n[0], n[1]))
            k += 1
        out.append(_EngineEvent(ts, dur, tuple(inside)))
    return out


class KernelTracer:
    """The ORT profiles of one Session: where they are written, and the records read from them."""

    def __init__(self) -> None:
        self._dir = Path(tempfile.mkdtemp(prefix="edgesplit-kernels-"))
        self._offset_ns = wall_offset_ns()
        self._events: dict[str, list[_EngineEvent]] = {}
        self._starts_ns: dict[str, int] = {}
        self._ended = False

    def executor_options(self, part: str) -> dict[str, str]:
        return {"profile_prefix": str(self._dir / part)}

    @property
    def ended(self) -> bool:
        return self._ended

    def read(self, ended: Mapping[str, tuple[str, int] | None]) -> None:
        """Read the profiles the ORT executors wrote (``end_profiling`` results, by part name)."""
        self._ended = True
        for name, got in ended.items():
            if got is None:
                continue
            path, start_wall_ns = got
            self._events[name] = read_ort_profile(path)
            self._starts_ns[name] = start_wall_ns - self._offset_ns

    def attach(self, trace: Trace) -> Trace:
        """``trace`` with the engine runs and kernels of its part runs placed on its clock."""
        engines, kernels = [], []
        for p in trace.parts:
            events = self._events.get(p.part)
            if events is None or p.run_index >= len(events):
                continue
            ev = events[p.run_index]
            dur_ns = min(int(ev.dur_us * 1e3), p.run_ns)
            start_ns = self._starts_ns[p.part] + int(ev.ts_us * 1e3)
            start_ns = min(max(start_ns, p.run_start_ns), p.run_end_ns - dur_ns)
            shift = start_ns - int(ev.ts_us * 1e3)
            kernel_ns = reorder_ns = reorders = 0
            for name, op, ts_us, k_dur_us in ev.kernels:
                k_start = min(max(shift + int(ts_us * 1e3), start_ns), start_ns + dur_ns)
                k_dur = min(int(k_dur_us * 1e3), start_ns + dur_ns - k_start)
                kernels.append(KernelRun(p.request, p.part, p.lane, name, op, k_start, k_dur))
                kernel_ns += k_dur
                if is_reorder(op):
                    reorder_ns += k_dur
                    reorders += 1
            engines.append(
                EngineRun(
                    p.request, p.part, p.lane, start_ns, dur_ns, kernel_ns, reorder_ns, reorders
                )
            )
        return replace(trace, engine_runs=tuple(engines), kernels=tuple(kernels))

    def close(self) -> None:
        shutil.rmtree(self._dir, ignore_errors=True)
