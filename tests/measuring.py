"""A pytest plugin (tests/conftest.py loads it): tests marked ``measures`` run alone under
pytest-xdist, together and first.

A test marked ``measures`` compares real run times with a prediction or with each other. On a
2-core machine a second worker is load on one of the cores it measures (seen: a core slowed 2.8x
against the other, and a calibration test that then failed). So under xdist every test holds a
shared lock for its whole run (setup, call, teardown), and a ``measures`` test an exclusive one:
it waits for the other workers' current tests to end, and they wait for it. A turnstile taken
before either lock keeps a stream of shared holders from starving the exclusive one. Serial runs
take no locks. flock locks die with their process, so a killed worker leaves none held.

The ``measures`` tests of every module form one unit of work, handed out first: one worker runs
them one after the other under one exclusive hold, early, while the other workers wait once.
Spread over their modules, each waited for the other worker's current test to end, which could be
a 20-s one (35 s of one worker's run went so). The workers list them in the run's folder at
collection (the scheduler, in the controlling process, sees node ids only), and the ``slow`` ones
too: the other units are handed out longest first by a guess from those marks, so that the last
units on every worker are short ones.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

RUN_DIR = (
    "EDGESPLIT_TEST_RUN_DIR"  # the run's lock files and lists; made here, inherited by workers
)
MEASURES_LIST = "measures.txt"
SLOW_LIST = "slow.txt"
MEASURES_UNIT = "(measures)"
# A guess at a test's seconds, for handing out the longest units of work first: a test marked
# `slow` takes more than about 5 s, most others a fraction of a second.
SLOW_S, OTHER_S = 5.0, 0.15


@contextmanager
def _flock(path: Path, mode: int) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, mode)
        yield
    finally:
        os.close(fd)  # releases the lock


class RunLock:
    """One worker's hold on the lock of the test run whose lock files are in ``folder``: exclusive
    for a ``measures`` test, else shared. An exclusive hold may be kept from one ``measures`` test
    to the next, so that a run of them waits once for the other workers' current tests, not before
    each (a shared hold is never kept: a waiting exclusive one would starve)."""

    def __init__(self, folder: Path):
        self.folder = folder
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def take(self, alone: bool) -> None:
        """Wait for the lock (exclusive when ``alone``); nothing to do while it is held already."""
        if self._fd is not None:
            return
        with _flock(self.folder / "turnstile.lock", fcntl.LOCK_EX):
            fd = os.open(self.folder / "run.lock", os.O_RDWR | os.O_CREAT, 0o600)
            fcntl.flock(fd, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # releases the lock
            self._fd = None


@contextmanager
def running_alone(alone: bool, folder: Path) -> Iterator[None]:
    """Hold the lock of the test run whose lock files are in ``folder`` for one test."""
    lock = RunLock(folder)
    lock.take(alone)
    try:
        yield
    finally:
        lock.release()


def _measures(item: pytest.Item | None) -> bool:
    return item is not None and item.get_closest_marker("measures") is not None


def _run_dir() -> Path:
    return Path(os.environ[RUN_DIR])


def _worker() -> str | None:
    return os.environ.get("PYTEST_XDIST_WORKER")


def pytest_configure(config: pytest.Config) -> None:
    if _worker() is None:
        os.environ[RUN_DIR] = tempfile.mkdtemp(prefix="edgesplit-tests-")
        _fit_duty_cycles()


def _fit_duty_cycles() -> None:
    """Fit the little core's duty cycle of ``host-biglittle`` now, before any worker starts.

    The fit (edgesplit/device/throttle_fit.py) times a convolution on the core with the spinner and
    without, and is kept on disk for every later process. Left to the first test that throttles a
    core, it ran beside the other workers' tests: a second process on the core made the fit tell
    the spinner 0.69 instead of 0.55 (measured here), a little core faster than asked for the whole
    run, and a ``measures`` test of a split plan failed in CI (the little piece measured 0.48x its
    prediction). Here the machine is quiet: the workers are not started yet."""
    from edgesplit.device.spec import load_device
    from edgesplit.device.throttle import DEFAULT_PERIOD_US, method
    from edgesplit.device.throttle_fit import told_share

    if method() != "duty-cycle":
        return
    for proc in load_device("host-biglittle").processors:
        if proc.cores and proc.cpu_quota_pct and proc.cpu_quota_pct < 100:
            for core in proc.cores:
                told_share(core, proc.cpu_quota_pct / 100, DEFAULT_PERIOD_US)


def pytest_unconfigure(config: pytest.Config) -> None:
    if _worker() is None:
        shutil.rmtree(os.environ.pop(RUN_DIR), ignore_errors=True)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under xdist, list the ``measures`` and the ``slow`` tests for the scheduler (every worker
    writes the same)."""
    if _worker() is None:
        return
    for name, chosen in ((MEASURES_LIST, _measures), (SLOW_LIST, _slow)):
        tmp = _run_dir() / f"{name}.{_worker()}.tmp"
        tmp.write_text("".join(item.nodeid + "\n" for item in items if chosen(item)))
        tmp.replace(_run_dir() / name)


def _slow(item: pytest.Item) -> bool:
    return item.get_closest_marker("slow") is not None


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class MeasuresFirst(LoadScopeScheduling):
        """The ``measures`` unit first, then the other units longest first (by :data:`SLOW_S` and
        :data:`OTHER_S`; xdist's own order, most tests first, left a 12-s module of 5 tests to the
        end of one worker while the others idled)."""

        measuring: frozenset[str] = frozenset()
        slow: frozenset[str] = frozenset()
        ordered = False

        def schedule(self) -> None:
            listed = _run_dir() / MEASURES_LIST  # absent where collection stopped on an error
            if (
                self.collection is None and listed.exists()
            ):  # the first call: every worker collected
                self.measuring = frozenset(listed.read_text().splitlines())
                slow = _run_dir() / SLOW_LIST
                self.slow = (
                    frozenset(slow.read_text().splitlines()) if slow.exists() else frozenset()
                )
            super().schedule()

        def _split_scope(self, nodeid: str) -> str:
            return MEASURES_UNIT if nodeid in self.measuring else super()._split_scope(nodeid)

        def _assign_work_unit(self, node) -> None:
            if not self.ordered:  # the first call: the queue is complete, nothing handed out yet
                self.ordered = True
                for scope in sorted(self.workqueue, key=self._guess_s, reverse=True):
                    self.workqueue.move_to_end(scope)
            if MEASURES_UNIT in self.workqueue:
                self.workqueue.move_to_end(MEASURES_UNIT, last=False)
            super()._assign_work_unit(node)

        def _guess_s(self, scope: str) -> float:
            return sum(SLOW_S if n in self.slow else OTHER_S for n in self.workqueue[scope])

    return MeasuresFirst(config, log)


_RUN_LOCK: list[RunLock] = []  # this worker's, made at its first test


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    if _worker() is None:
        yield
        return
    if not _RUN_LOCK:
        _RUN_LOCK.append(RunLock(_run_dir()))
    lock = _RUN_LOCK[0]
    lock.take(_measures(item))
    try:
        yield
    finally:
        if not (_measures(item) and _measures(nextitem)):
            lock.release()
