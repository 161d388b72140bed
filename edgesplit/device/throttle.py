"""A slower core, emulated steadily: a real-time duty cycle that takes a share of the core away.

``host-biglittle`` makes one of this machine's cores a *little* processor by giving its work only a
share of the core (``cpu_quota_pct``). The cgroup CPU quota that did this releases work in bursts:
the kernel wants a quota of at least 1 ms, so at 40% the period is 2.5 ms, and a part shorter than
that either runs at full speed (budget left) or waits 1.5 ms (budget spent). Parts under a few ms
were unpredictable there (DESIGN.md; issue 10).

The duty cycle instead takes the core away in slices of ``period_us`` (default 200 us): a helper
process pinned to the same core at ``SCHED_FIFO`` priority spins for ``(1 - share)`` of every
period, and the kernel gives the rest to the served thread (an ordinary ``SCHED_OTHER`` thread,
which the real-time spinner pre-empts at once). It only cycles while the served thread says it is
busy (:func:`busy`, around every run of a part or a profiled model), and each busy spell starts
with half a spin slice, so a run of ``w`` ms of work takes ``w / share`` ms within
``(1 - share) * period / 2`` (60 us at 40%), whatever the phase. Between runs the spinner sleeps,
so an idle little processor costs nothing.

Real-time scheduling needs ``CAP_SYS_NICE`` (root here); where it is refused, :func:`configure`
says why and the caller falls back to the cgroup quota (see ``edgesplit/device/cpu.py``).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import weakref
from collections.abc import Iterator

DEFAULT_PERIOD_US = 200

# The spinner runs as `python -c` so it needs nothing importable (a device may run edgesplit from a
# zipapp). Protocol on its stdin: b"b" = the served thread is busy, b"i" = idle; EOF = stop.
_SPINNER = r"""
import os, select, sys, time
core, share, period_ns = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]) * 1000
os.sched_setaffinity(0, {core})
try:
    os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
except OSError as e:
    sys.stdout.write("no:" + (e.strerror or str(e)) + "\n"); sys.stdout.flush(); sys.exit(0)
sys.stdout.write("ok\n"); sys.stdout.flush()
fd = sys.stdin.fileno()
spin_ns = int(period_ns * (1.0 - share))
clock = time.monotonic_ns
def state_after(data):
    if not data:
        sys.exit(0)
    return data[-1:] == b"b"
busy = False
while True:
    if not busy:
        busy = state_after(os.read(fd, 64))  # blocks while the served thread is idle
        if not busy:
            continue
        end = clock() + spin_ns // 2  # half a slice first: centred quantisation error
    else:
        end = clock() + spin_ns
    while clock() < end:
        pass
    # let the served thread run for its share of the period, then check for news
    r, _, _ = select.select([fd], [], [], (period_ns - spin_ns) / 1e9)
    if r:
        busy = state_after(os.read(fd, 64))
"""


class DutyCycle:
    """Spinner processes, one per core: take ``1 - share`` of the cores while the thread is busy."""

    def __init__(
        self,
        cores: tuple[int, ...],
        share: float,
        period_us: int = DEFAULT_PERIOD_US,
        *,
        fitted: bool = True,
    ):
        """``fitted``: tell each core's spinner the share fitted so that the work there gets
        ``share`` (:mod:`edgesplit.device.throttle_fit`); else ``share`` itself."""
        if not 0 < share < 1:
            raise ValueError(f"share must be in (0, 1), got {share}")
        self.cores, self.share, self.period_us = tuple(cores), share, period_us
        self.fitted = fitted
        self._depth = 0
        self._lock = threading.Lock()
        self._procs: list[subprocess.Popen] = []
        try:
            for core in self.cores:
                self._procs.append(self._spawn(core))
        except BaseException:
            self.close()
            raise

    def _spawn(self, core: int) -> subprocess.Popen:
        told = self.share
        if self.fitted:
            from edgesplit.device.throttle_fit import told_share

            told = told_share(core, self.share, self.period_us)
        proc = subprocess.Popen(
            [sys.executable, "-c", _SPINNER, str(core), repr(told), str(self.period_us)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            bufsize=0,
        )
        assert proc.stdout is not None
        answer = proc.stdout.readline().decode().strip()
        if answer != "ok":
            _stop(proc)
            why = (
                answer[3:]
                if answer.startswith("no:")
                else f"the spinner exited ({proc.returncode})"
            )
            raise OSError(f"no real-time priority for a duty cycle on core {core}: {why}")
        return proc

    def _tell(self, what: bytes) -> None:
        for proc in self._procs:
            with contextlib.suppress(OSError, ValueError):
                proc.stdin.write(what)  # type: ignore[union-attr]

    def enter(self) -> None:
        with self._lock:
            self._depth += 1
            if self._depth == 1:
                self._tell(b"b")

    def leave(self) -> None:
        with self._lock:
            self._depth -= 1
            if self._depth == 0:
                self._tell(b"i")

    def close(self) -> None:
        for proc in self._procs:
            _stop(proc)
        self._procs.clear()


def _stop(proc: subprocess.Popen) -> None:
    with contextlib.suppress(OSError, ValueError):
        proc.stdin.close()  # type: ignore[union-attr]
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)
    if proc.poll() is None:
        proc.kill()
        proc.wait()


_local = threading.local()
_by_core: dict[tuple[tuple[int, ...], float, int], tuple[DutyCycle, int]] = {}
_registry_lock = threading.Lock()


def _release(key: tuple[tuple[int, ...], float, int]) -> None:
    with _registry_lock:
        cycle, users = _by_core.get(key, (None, 0))
        if cycle is None:
            return
        if users <= 1:
            del _by_core[key]
            cycle.close()
        else:
            _by_core[key] = (cycle, users - 1)


class _Token:
    """Lives in the served thread's thread-local storage: released when the thread ends."""


def configure(cores: tuple[int, ...], share: float, period_us: int = DEFAULT_PERIOD_US) -> None:
    """Serve the calling thread with a duty cycle of ``share`` on ``cores`` (its own cores, or some
    of the cores its ORT threads run on: a core group keeps each member core's share).

    One duty cycle per (cores, share) is shared by every thread so served in this process; it stops
    when the last of them ends. A thread may be served by several (one per throttled core of a
    group); they all run while it is busy. Raises OSError when real-time priority is refused.
    """
    key = (tuple(cores), float(share), int(period_us))
    with _registry_lock:
        cycle, users = _by_core.get(key, (None, 0))
        if cycle is None:
            cycle = DutyCycle(key[0], share, period_us)
        _by_core[key] = (cycle, users + 1)
    token = _Token()
    weakref.finalize(token, _release, key)
    _local.cycles = (*getattr(_local, "cycles", ()), cycle)
    _local.tokens = (*getattr(_local, "tokens", ()), token)


@contextlib.contextmanager
def busy() -> Iterator[None]:
    """Mark the calling thread busy (its duty cycles run) for the block; a no-op when unserved."""
    cycles: tuple[DutyCycle, ...] = getattr(_local, "cycles", ())
    if not cycles:
        yield
        return
    for cycle in cycles:
        cycle.enter()
    try:
        yield
    finally:
        for cycle in cycles:
            cycle.leave()


def cycles() -> tuple[DutyCycle, ...]:
    """The duty cycles serving the calling thread (see :func:`configure`)."""
    return getattr(_local, "cycles", ())


@contextlib.contextmanager
def borrowed(served_by: tuple[DutyCycle, ...]) -> Iterator[None]:
    """Serve the calling thread with another thread's duty cycles for the block: a caller that runs
    a processor's part itself, in its worker's stead
    (:meth:`edgesplit.runtime.session.Session.run`)."""
    before = getattr(_local, "cycles", ())
    _local.cycles = tuple(served_by)
    try:
        yield
    finally:
        _local.cycles = before


def busy_call(fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` with the calling thread marked busy (see :func:`busy`)."""
    with busy():
        return fn(*args, **kwargs)


def served() -> bool:
    """Whether the calling thread is served by a duty cycle."""
    return bool(getattr(_local, "cycles", ()))


def method() -> str:
    """How a processor's CPU share is emulated here: ``duty-cycle`` or ``cgroup-quota``."""
    return os.environ.get("EDGESPLIT_THROTTLE", "duty-cycle")
