"""The emulated little core: the real-time duty cycle that takes a share of a core away."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from edgesplit.device import throttle
from edgesplit.device.cpu import configure_thread

# netlab: root, for real-time scheduling and cgroup quotas, like tests/netlab.py
pytestmark = [pytest.mark.netlab, pytest.mark.measures]

needs_rt = pytest.mark.skipif(
    not hasattr(os, "sched_setscheduler") or os.geteuid() != 0 or (os.cpu_count() or 1) < 2,
    reason="real-time priority needs root (CAP_SYS_NICE) and a second core",
)


def _cpu_s(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _spinners() -> list[int]:
    return [p.pid for cycle, _ in throttle._by_core.values() for p in cycle._procs]


@needs_rt
def test_duty_cycle_spins_only_while_busy_and_stops_with_its_thread():
    pool = ThreadPoolExecutor(1, initializer=lambda: configure_thread("little", (1,), 40))
    assert pool.submit(throttle.served).result()
    (pid,) = _spinners()
    idle0 = _cpu_s(pid)
    time.sleep(0.5)
    assert _cpu_s(pid) - idle0 < 0.05  # idle: the spinner sleeps

    def spin(seconds: float) -> None:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            pass

    before = _cpu_s(pid)
    pool.submit(throttle.busy_call, spin, 1.0).result()
    took = _cpu_s(pid) - before
    # busy for 1 s of wall time: the spinner takes about 60% of the core (clock ticks are 10 ms)
    assert 0.3 < took < 0.9, took
    pool.shutdown(wait=True)
    for _ in range(50):
        if not _spinners():
            break
        import gc

        gc.collect()
        time.sleep(0.1)
    assert not _spinners()
    assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z"


@needs_rt
def test_threads_of_one_processor_share_one_duty_cycle():
    pools = [
        ThreadPoolExecutor(1, initializer=lambda: configure_thread("little", (1,), 40))
        for _ in range(2)
    ]
    for p in pools:
        p.submit(lambda: None).result()
    assert len(_spinners()) == 1
    for p in pools:
        p.shutdown(wait=True)


def test_an_unserved_thread_is_not_throttled_and_busy_is_a_no_op():
    assert not throttle.served()
    with throttle.busy():
        pass
    assert throttle.busy_call(lambda x: x + 1, 1) == 2


@pytest.mark.skipif(
    shutil.which("setpriv") is None or os.geteuid() != 0, reason="needs setpriv and root"
)
def test_refused_real_time_priority_falls_back_to_the_cgroup_quota():
    # A process without CAP_SYS_NICE really is refused SCHED_FIFO: the worker says so and uses the
    # quota.
    code = (
        "import threading; from edgesplit.device.cpu import configure_thread; notes = []; "
        "t = threading.Thread(target=lambda: notes.extend(configure_thread('little', (1,), 40))); "
        "t.start(); t.join(); print(' | '.join(notes))"
    )
    r = subprocess.run(
        ["setpriv", "--bounding-set", "-sys_nice", sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert r.returncode == 0, r.stderr
    assert "no real-time priority" in r.stdout and "using a cgroup quota" in r.stdout, r.stdout
