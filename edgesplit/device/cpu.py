"""Make a thread behave like one processor of a device: pinned cores and a CPU quota.

Both apply to the calling thread and are inherited by the threads it creates afterwards (ORT's
and TVM's worker threads), which is why executors and profilers are built on such a thread.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from edgesplit.device.host import usable_cores

T = TypeVar("T")

CGROUP_CPU = Path(os.environ.get("EDGESPLIT_CGROUP_CPU", "/sys/fs/cgroup/cpu"))
# A short period spreads the throttling evenly over each run, so the median latency (not just the
# throughput) shows the slower core; with the default 100 ms, a 15 ms run is rarely throttled.
# The kernel wants a quota of at least 1 ms, so the period is the shortest that allows it.
MIN_QUOTA_US = 1_000


def present_cores(cores: tuple[int, ...] | None) -> tuple[tuple[int, ...] | None, str | None]:
    """The cores of ``cores`` this process may run on (None for none), and a note naming the others
    (None when every one is here): a spec made for another device lists cores this machine lacks,
    and pinning ORT's threads to them fails with an error line per thread and session."""
    if not cores:
        return cores, None
    here = set(usable_cores())
    present = tuple(c for c in cores if c in here)
    if len(present) == len(cores):
        return tuple(cores), None
    missing = [c for c in cores if c not in here]
    kept = f"pinned to {list(present)}" if present else "not pinned"
    return (
        present or None,
        f"cores {missing} are not on this machine (it offers {sorted(here)}): {kept}",
    )


def whole_machine(cores: tuple[int, ...] | None, throttled: bool) -> bool:
    """Whether a processor is every core of this machine at full speed: then nothing is pinned and
    ORT places its threads as it does by default (a pinned caller migrated to its first core on
    every request: plain ORT's defaults measured 5-7% faster on both cores)."""
    return bool(cores) and not throttled and set(cores) == set(usable_cores())


def pin_thread(cores: tuple[int, ...] | None) -> str | None:
    """Pin the calling thread to ``cores``; None on success, else why not."""
    if not cores or not hasattr(os, "sched_setaffinity"):
        return None
    try:
        os.sched_setaffinity(0, set(cores))
    except OSError as e:
        return f"cannot pin to cores {list(cores)} ({e.strerror})"
    return None


def join_cpu_quota(name: str, quota_pct: float) -> str | None:
    """Move the calling thread into a cgroup v1 CPU quota group; None on success, else why not."""
    # One group per process and processor: two processes emulating a "little" core at once must not
    # share one quota. Groups of processes that have ended are removed on the way.
    _sweep_groups()
    group = CGROUP_CPU / f"edgesplit-{os.getpid()}-{name}"
    period_us = max(MIN_QUOTA_US, int(MIN_QUOTA_US * 100 / quota_pct + 0.5))
    try:
        group.mkdir(exist_ok=True)
        (group / "cpu.cfs_quota_us").write_text("-1")  # lift the old quota so any period is valid
        (group / "cpu.cfs_period_us").write_text(str(period_us))
        (group / "cpu.cfs_quota_us").write_text(str(int(period_us * quota_pct / 100)))
        (group / "tasks").write_text(str(threading.get_native_id()))
    except OSError as e:
        return f"cannot apply a {quota_pct:g}% CPU quota ({group}: {e.strerror or e})"
    return None


def _sweep_groups() -> None:
    for old in CGROUP_CPU.glob("edgesplit-*"):
        pid = old.name.split("-")[1]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            with contextlib.suppress(OSError):
                old.rmdir()


def configure_thread(
    name: str,
    cores: tuple[int, ...] | None,
    quota_pct: float | None,
    *,
    threads: int | None = None,
    core_quotas: tuple[tuple[int, float], ...] = (),
) -> list[str]:
    """Pin and throttle the calling thread as processor ``name``; returns what could not be done.

    A processor with several threads on as many cores (a core group, or a cluster) pins the calling
    thread to its first core: ORT's other threads are pinned to the rest
    (:func:`ort_session_options`),
    and the calling thread runs ORT's first share of each operator, so it must not share a core with
    them. ``core_quotas``: ``(core, pct)`` of a core group's throttled member cores, each given its
    duty cycle while the thread is busy.
    """
    cores, missing = present_cores(cores)
    notes = [f"{name}: {missing}"] if missing else []
    n = threads or (len(cores) if cores else 0)
    own = cores[:1] if cores and n > 1 and len(cores) >= n else cores
    throttled = (quota_pct is not None and quota_pct < 100) or any(p < 100 for _, p in core_quotas)
    why = None if whole_machine(cores, throttled) else pin_thread(own)
    if why:
        notes.append(f"{name}: {why}")
    if quota_pct is not None and quota_pct < 100:
        throttled = throttle_thread(name, cores if not why else None, quota_pct)
        if throttled:
            notes.append(f"{name}: {throttled}")
    here = set(cores or ())
    for core, pct in core_quotas:
        if core in here and pct < 100:
            throttled = throttle_core(name, core, pct)
            if throttled:
                notes.append(f"{name}: {throttled}")
    return notes


def configure_as(proc) -> list[str]:
    """:func:`configure_thread` for a processor or a bundle's part (anything with ``name``,
    ``cores``, ``cpu_quota_pct``, ``threads`` and ``core_quotas``)."""
    return configure_thread(
        proc.name,
        proc.cores,
        proc.cpu_quota_pct,
        threads=proc.threads,
        core_quotas=getattr(proc, "core_quotas", ()),
    )


def throttle_core(name: str, core: int, quota_pct: float) -> str | None:
    """Give the work on ``core`` of the calling thread's processor (ORT's thread pinned there)
    ``quota_pct`` of it while the thread is busy; None on success, else why not. Only the duty
    cycle can throttle one core of several (a cgroup quota throttles threads, not cores)."""
    from edgesplit.device import throttle

    if throttle.method() != "duty-cycle":
        return f"core {core} left at full speed: only the duty cycle throttles one core of a group"
    try:
        throttle.configure((core,), quota_pct / 100.0)
    except OSError as e:
        return f"core {core} left at full speed ({e})"
    return None


def throttle_thread(name: str, cores: tuple[int, ...] | None, quota_pct: float) -> str | None:
    """Give the calling thread ``quota_pct`` of its cores; None on success, else why not.

    A pinned thread gets a real-time duty cycle on its cores (steady to ~0.1 ms, see
    :mod:`edgesplit.device.throttle`); an unpinned one, or one refused real-time priority, the
    cgroup
    quota (which releases work in bursts of its 2.5 ms period). ``EDGESPLIT_THROTTLE=cgroup-quota``
    forces the quota.
    """
    from edgesplit.device import throttle

    if cores and throttle.method() == "duty-cycle":
        try:
            throttle.configure(tuple(cores), quota_pct / 100.0)
            return None
        except OSError as e:
            fallback = join_cpu_quota(name, quota_pct)
            return f"{e}; using a cgroup quota" + (
                f", which also failed: {fallback}" if fallback else ""
            )
    return join_cpu_quota(name, quota_pct)


def run_as_processor(
    name: str, cores: tuple[int, ...] | None, quota_pct: float | None, fn: Callable[[], T]
) -> tuple[T, list[str]]:
    """Run ``fn`` on a fresh thread configured as processor ``name``; re-raise its errors here."""
    if not cores and quota_pct is None:
        return fn(), []
    box: dict[str, object] = {}

    def body() -> None:
        box["notes"] = configure_thread(name, cores, quota_pct)
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - re-raised on the caller's thread
            box["error"] = e

    t = threading.Thread(target=body, name=f"edgesplit-{name}")
    t.start()
    t.join()
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box["value"], box["notes"]  # type: ignore[return-value]


def ort_session_options(
    threads: int | None,
    cores: tuple[int, ...] | None,
    *,
    spin: bool = True,
    throttled: bool = False,
    **attrs,
):
    """ONNX Runtime options for a processor: full graph optimisation, its thread count, and its
    extra threads pinned to its cores. Profiler and runtime build sessions alike with this.

    ``throttled``: some of the cores keep a duty cycle (their threads stay pinned even when the
    cores are the whole machine, see :func:`whole_machine`).

    ``spin=False`` makes the thread pool stop spinning as soon as a run returns: when several
    sessions share a processor, an idle pool's spinning steals the cores from the next part
    (2x slower measured with 4 parts on 2 cores).
    """
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.log_severity_level = 3
    cores = present_cores(cores)[0]
    n = threads or (len(cores) if cores else 0)
    if n:
        so.intra_op_num_threads = n
        so.inter_op_num_threads = 1
    if cores and n > 1 and len(cores) >= n and not whole_machine(cores, throttled):
        # 1-based logical processor ids, one group per extra thread (DESIGN.md, measured facts).
        so.add_session_config_entry(
            "session.intra_op_thread_affinities", ";".join(str(c + 1) for c in cores[1:n])
        )
    if not spin:
        so.add_session_config_entry("session.force_spinning_stop", "1")
    for k, v in attrs.items():
        setattr(so, k, v)
    return so
